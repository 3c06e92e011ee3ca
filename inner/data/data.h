/* inner/data/ — token shards in llm.c's format and the loader that reads
 * them in batches, rank by rank; shard preparation from text or ids. */
#ifndef LOCO_INNER_DATA_H
#define LOCO_INNER_DATA_H

#include "core/core.h"

/* Token shards in llm.c's .bin format: a header of 256 int32 (magic,
 * version, token count, zeros...), then the tokens: magic 20240520 version 1
 * holds uint16 tokens, magic 20240801 version 7 holds uint32 tokens. */
#define LOCO_SHARD_HEADER_INTS 256
#define LOCO_SHARD_MAGIC_U16 20240520
#define LOCO_SHARD_VERSION_U16 1
#define LOCO_SHARD_MAGIC_U32 20240801
#define LOCO_SHARD_VERSION_U32 7

/* Where the next batch starts; saved in checkpoints. */
typedef struct {
    int64_t shard; /* index into the sorted shard list */
    int64_t pos;   /* token offset of the next batch in that shard, shared by all
                    * ranks (rank r reads at pos + r*B*T) */
    int64_t epoch; /* completed passes over all shards */
} loco_data_pos;

typedef struct loco_data loco_data;

/* Opens the shards named by `pattern` (a glob, or a comma-separated list of
 * globs/paths; matches sorted by name) and validates every header and file
 * size before returning: missing file, wrong magic or version, truncated or
 * oversize shard, a shard shorter than one batch are LOCO_EINVAL/LOCO_EPROTO
 * errors that name the file. Batches are B rows of T+1 consecutive tokens
 * (B*T+1 tokens read contiguously, llm.c style); rank r of `world` reads
 * the r-th window of every world*B*T tokens. Tokens >= vocab_size are
 * rejected when read (LOCO_EPROTO naming shard and offset). */
int loco_data_open(loco_data **out, const char *pattern, int B, int T, int rank, int world,
                   int vocab_size);
void loco_data_close(loco_data *d); /* accepts NULL */
/* Fills inputs and targets (B*T each) with the next batch and advances;
 * moves to the next shard when the current one has no full window left, and
 * wraps to the first shard (epoch + 1) after the last. */
int loco_data_next(loco_data *d, int32_t *inputs, int32_t *targets);
loco_data_pos loco_data_tell(const loco_data *d);
/* Continues from a saved position (LOCO_EINVAL if it is outside the shards). */
int loco_data_seek(loco_data *d, loco_data_pos pos);
int loco_data_num_shards(const loco_data *d);
int64_t loco_data_num_tokens(const loco_data *d); /* over all shards */

/* Writes one shard in version 1 (uint16 tokens, each < 65536) or version 7
 * (uint32), else LOCO_EINVAL. Written to path.tmp, fsynced, renamed. */
int loco_data_write_shard(const char *path, const int32_t *tokens, size_t n, int version);
/* Byte-level (vocab 256) preparation of any text file: the first
 * (1 - val_frac) of the bytes become OUT_PREFIX_train_NNNNNN.bin shards, the
 * rest OUT_PREFIX_val_NNNNNN.bin, each shard at most shard_tokens tokens. */
int loco_data_prep_bytes(const char *text_path, const char *out_prefix, double val_frac,
                         size_t shard_tokens);
/* The same for ids already encoded (a tokenizer's, of vocab_size ids):
 * the first floor((1-val_frac)*n) ids are train, the rest val; uint16
 * shards (version 1) while vocab_size <= 65536, uint32 (version 7) beyond.
 * `what` names the source in messages. */
int loco_data_prep_tokens(const int32_t *ids, size_t n, int vocab_size, const char *what,
                          const char *out_prefix, double val_frac, size_t shard_tokens);

/* Unigram (order-0) cross-entropy of a token stream in nats: the loss of a
 * model that knows only token frequencies; the baseline to beat. */
int loco_data_unigram_entropy(const char *pattern, int vocab_size, double *nats);

#endif /* LOCO_INNER_DATA_H */
