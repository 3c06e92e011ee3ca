/* compress/ — pseudo-gradient codecs: block quantizers (bf16, int8, int4,
 * fp8 e4m3, fp4 e2m1) with nearest or stochastic rounding, sparse top-k
 * with 2-, 4- or 8-bit values, error feedback,
 * a zstd stage over independent chunk frames, and the self-describing chunk
 * format that crosses the wire (docs/COMPRESS.md has the byte table).
 *
 * A range of a flat fp32 buffer is cut into chunks of a fixed number of
 * elements (compress.chunk_mb of fp32 input, a multiple of the block). Each
 * chunk is quantized, optionally zstd-compressed and framed with a 64-byte
 * header on its own, so chunks encode and decode on any number of threads,
 * can be sent as soon as they are ready, and the bytes do not depend on the
 * thread count. The receiver accumulates dst += weight * decoded, chunk by
 * chunk as they arrive, without a full-size temporary.
 *
 * Decoding trusts nothing: every header field, length and checksum is checked
 * before dst is touched, and anything inconsistent is LOCO_EPROTO. */
#ifndef LOCO_COMPRESS_H
#define LOCO_COMPRESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/core.h"
#include "kernels/kernels.h"

/* --------------------------------------------------------------- codecs */

/* The codecs, with the numbers a chunk header carries (part of the wire
 * format: never renumbered). */
typedef enum {
    LOCO_CODEC_NONE = 0, /* fp32 as is */
    LOCO_CODEC_BF16 = 1, /* bfloat16, round to nearest even or stochastic */
    LOCO_CODEC_INT8 = 2, /* int8 in [-127, 127], one absmax scale per block */
    LOCO_CODEC_INT4 = 3, /* int4 in [-7, 7], two per byte, block scale */
    LOCO_CODEC_FP8 = 4,  /* fp8 e4m3 (OCP "fn", max 448), block scale */
    LOCO_CODEC_FP4 = 5,  /* fp4 e2m1 (max 6), two per byte, block scale */
    LOCO_CODEC_TOPK = 6, /* the largest topk of each chunk, topk_bits each */
    LOCO_CODEC_COUNT
} loco_codec_kind;

/* The quantizers' format of codec k (kernels/kernels.h's element loops);
 * LOCO_QFMT_COUNT, which they refuse, for a k that is no codec and for
 * topk (kernels/kernels.h's loco_topk_* loops). */
loco_quant_format loco_codec_format(loco_codec_kind k);

typedef enum {
    LOCO_ZSTD_OFF = 0,
    LOCO_ZSTD_ON = 1,
    LOCO_ZSTD_AUTO = 2, /* per range: sampled ratio and link speed decide */
} loco_zstd_mode;

#define LOCO_COMPRESS_BLOCK_MIN LOCO_QUANT_BLOCK_MIN
#define LOCO_COMPRESS_BLOCK_MAX LOCO_QUANT_BLOCK_MAX
/* Upper limit on chunk_bytes (fp32 input per chunk). */
#define LOCO_COMPRESS_CHUNK_MAX ((size_t)1 << 30)
/* Bytes of the chunk header that precedes every payload. */
#define LOCO_CHUNK_HEADER_BYTES 64

/* Everything that decides the bytes of an encoded range. */
typedef struct {
    loco_codec_kind codec;
    int block;           /* elements per scale block, 32..4096, multiple of 8 */
    bool stochastic;     /* stochastic rounding instead of nearest-even */
    bool error_feedback; /* add back what earlier rounds lost */
    loco_zstd_mode zstd;
    int zstd_level;        /* any libzstd level, negative ones too */
    size_t chunk_bytes;    /* fp32 input bytes per chunk (rounded to blocks) */
    double auto_min_ratio; /* zstd=auto: skip zstd below this sampled ratio */
    double link_gbps;      /* zstd=auto: link speed, 0 = unknown */
    int threads;           /* workers for encode/decode, 0 = OpenMP's count */
    uint64_t seed;         /* stochastic rounding stream */
    size_t n_state;        /* elements of error-feedback state (the shard) */
    double topk;           /* topk: kept fraction of each chunk, (0, 1] */
    int topk_bits;         /* topk: bits per kept value, 2, 4 or 8 */
} loco_codec_params;

/* Defaults: the [compress] keys of core/config_keys.h (int8, block 128,
 * nearest, error feedback on, zstd auto, ...), all threads, seed 0. */
void loco_codec_params_default(loco_codec_params *p);
/* Fills p from the [compress] section (threads falling back to run.threads,
 * seed from train.seed). n_state is left 0: the caller sets it. */
int loco_codec_params_from_config(loco_codec_params *p, const loco_config *cfg);
/* LOCO_EINVAL with the reason when a field is out of range. */
int loco_codec_params_check(const loco_codec_params *p);

/* "none", "bf16", "int8", "int4", "fp8", "fp4", "topk"; "?" otherwise. */
const char *loco_codec_name(loco_codec_kind k);
/* Inverse of loco_codec_name; LOCO_EINVAL for an unknown name. */
int loco_codec_parse(const char *name, loco_codec_kind *out);

/* topk: values kept of a chunk of count elements, max(1, round(topk *
 * count)) capped at count; 0 for count 0. */
size_t loco_codec_topk_k(const loco_codec_params *p, size_t count);
/* Raw payload bytes (before zstd) of a chunk of count elements. */
size_t loco_codec_payload_bytes(const loco_codec_params *p, size_t count);

/* Elements per chunk for these params (a multiple of the block). */
size_t loco_compress_chunk_elems(const loco_codec_params *p);
/* Chunks a range of n elements is cut into. */
size_t loco_compress_chunk_count(size_t n, const loco_codec_params *p);
/* Bytes one encoded chunk can take (header + payload, rounded up to 64). */
size_t loco_compress_slot_bytes(const loco_codec_params *p);
/* Most bytes loco_codec_encode writes for n elements: chunk count times the
 * slot size. zstd never makes a chunk larger: a chunk zstd cannot shrink is
 * sent uncompressed. */
size_t loco_compress_bound(size_t n, const loco_codec_params *p);

/* ----------------------------------------------------------- the handle */

/* Holds the params, the error-feedback state (n_state floats) and one
 * workspace per worker (zstd contexts, a chunk-sized scratch buffer). One
 * caller uses a handle at a time; the _chunk calls with distinct worker
 * indices may run concurrently. */
typedef struct loco_codec loco_codec;

/* Checks p and allocates. LOCO_EINVAL for bad params, LOCO_ENOMEM. */
int loco_codec_create(loco_codec **out, const loco_codec_params *p);
void loco_codec_destroy(loco_codec *c); /* accepts NULL */
const loco_codec_params *loco_codec_get_params(const loco_codec *c);
/* Number of workers (valid worker indices are 0 .. workers-1). */
int loco_codec_workers(const loco_codec *c);
/* Error-feedback state: n_state floats the caller may checkpoint and
 * restore; NULL without error feedback. */
float *loco_codec_ef(loco_codec *c);
void loco_codec_ef_reset(loco_codec *c);
/* Link speed that zstd=auto compares with the compressor (net/ reports the
 * measured one); 0 = unknown. */
void loco_codec_set_link_gbps(loco_codec *c, double gbps);
/* How long one whole exchange of n elements took (wall seconds, transfer,
 * encode and decode together), with the zstd stage or without. With a
 * known link, zstd=auto then times both ways as the run goes and keeps the
 * faster (see loco_codec_plan): what zstd saves on the wire and what it
 * costs on cores busy with other work are measured, not guessed from a
 * sample timed on an idle core. */
void loco_codec_note_exchange(loco_codec *c, bool zstd, double seconds, size_t n);
/* zstd=auto re-times the slower way after this many plans, and keeps zstd
 * only when it makes the exchange this much faster. */
#define LOCO_ZSTD_RETRY 16
#define LOCO_ZSTD_MARGIN 0.05

/* ------------------------------------------------------------- encoding */

/* How one range is encoded, decided once by loco_codec_plan. */
typedef struct {
    size_t n;            /* elements in the range */
    size_t state_offset; /* index of the range's first element in the EF state */
    uint64_t nonce;      /* stochastic rounding: e.g. the outer step */
    size_t chunk_elems;  /* elements per chunk (the last may be shorter) */
    size_t n_chunks;
    size_t slot_bytes;    /* bound of one encoded chunk */
    bool zstd;            /* the zstd stage runs for this range */
    double sampled_ratio; /* zstd=auto: payload bytes / zstd bytes of a sample */
} loco_encode_plan;

/* Where one encoded chunk lies in a buffer. */
typedef struct {
    size_t offset, len;
} loco_chunk_ref;

/* Plans the encoding of src[0, n): chunking, and for zstd=auto whether the
 * zstd stage pays (a sample of the quantized payload is compressed; zstd is
 * skipped below auto_min_ratio, or when a known link is faster than the
 * compressor). With a known link and exchanges noted
 * (loco_codec_note_exchange), the sample's guess holds for the first plan
 * only (its exchange, slowed by first-touch page faults, is not timed): the
 * second is timed with zstd and the third without (in this order on every
 * island, as each island's time depends on its peers' choices too), then
 * the faster measured way is kept (zstd only when faster by
 * LOCO_ZSTD_MARGIN), and the slower is tried again every LOCO_ZSTD_RETRY
 * plans. Does not
 * touch the error-feedback state. state_offset + n must not exceed n_state
 * when error feedback is on. With a link speed set, the decision depends on
 * measured speeds, so the bytes (never the decoded values) may differ
 * between runs. */
int loco_codec_plan(loco_codec *c, loco_encode_plan *plan, const float *src, size_t n,
                    size_t state_offset, uint64_t nonce);
/* The same for a range of n elements the caller produces chunk by chunk:
 * zstd=auto decides from `sample` (sample_n <= n elements the caller drew
 * from the range) instead of reading the range. */
int loco_codec_plan_sampled(loco_codec *c, loco_encode_plan *plan, const float *sample,
                            size_t sample_n, size_t n, size_t state_offset, uint64_t nonce);

/* Encodes chunk `chunk` of the planned range (src is the range's first
 * element) into dst, using worker `worker`'s workspace. dst_cap must be at
 * least plan->slot_bytes (enough for any chunk of the plan); *dst_len
 * receives the chunk's size. Updates the
 * chunk's error-feedback state. LOCO_EINVAL for a non-finite input (the EF
 * state of the chunk is then unspecified: reset it). */
int loco_codec_encode_chunk(loco_codec *c, int worker, const loco_encode_plan *plan, void *dst,
                            size_t dst_cap, size_t *dst_len, const float *src, size_t chunk);
/* The same with x holding only the chunk's own elements (x[0] is element
 * chunk * chunk_elems of the range): a caller that computes each chunk's
 * values just before encoding them keeps them in a cache-sized buffer. */
int loco_codec_encode_chunk_from(loco_codec *c, int worker, const loco_encode_plan *plan, void *dst,
                                 size_t dst_cap, size_t *dst_len, const float *x, size_t chunk);

/* Encodes every chunk of the plan on the handle's workers: chunk i is written
 * at dst + i * plan->slot_bytes and described by chunks[i] (plan->n_chunks
 * entries). dst_cap >= loco_compress_bound(plan->n, params). Output does not
 * depend on the number of workers. Do not call from inside an OpenMP
 * parallel region (workers are OpenMP thread numbers). */
int loco_codec_encode(loco_codec *c, const loco_encode_plan *plan, void *dst, size_t dst_cap,
                      loco_chunk_ref *chunks, const float *src);

/* ------------------------------------------------------------- decoding */

/* What a chunk header says. */
typedef struct {
    loco_codec_kind codec;
    bool zstd, planes; /* payload is a zstd frame; bytes split in planes */
    int block;
    uint32_t chunk_index;
    uint64_t first;     /* element offset of the chunk in its range */
    uint64_t count;     /* elements in the chunk */
    uint64_t raw_len;   /* payload bytes before zstd */
    uint64_t enc_len;   /* payload bytes after the header */
    uint64_t total_len; /* header + payload */
} loco_chunk_info;

/* Parses and checks a chunk header: magic, version, codec, flags, block,
 * count, lengths and the header checksum. Needs only the first
 * LOCO_CHUNK_HEADER_BYTES of len (so a stream reader learns total_len);
 * does not look at the payload. LOCO_EPROTO with the reason. */
int loco_chunk_parse(const void *src, size_t len, loco_chunk_info *info);

/* Decodes one chunk and accumulates dst[first + i] += weight * value[i], where
 * dst is the receiving range of dst_n elements. Checks first (header, exact
 * length len == total_len, range inside dst_n, count within this handle's
 * chunk size, payload checksum, zstd frame sizes, scales in [0, FLT_MAX /
 * qmax], no fp8 NaN code), then touches dst: on any error dst is unchanged
 * and the result is LOCO_EPROTO (LOCO_EINVAL for a bad worker, weight or
 * dst). Uses worker `worker`'s workspace. The accumulation is
 * dst = fmaf(code_value, weight * scale, dst) per element, the same on every
 * receiver. */
int loco_codec_decode_chunk(loco_codec *c, int worker, float *dst, size_t dst_n, float weight,
                            const void *src, size_t len);

/* Decodes n_chunks chunks (chunks[i] inside base[0, base_len)) on the
 * handle's workers. Refs, headers, lengths, checksums, uncompressed payloads
 * and overlap between chunks are checked for all chunks before any is
 * applied; a zstd payload that passes its checksum yet fails to decompress
 * leaves dst with the chunks decoded so far (the caller drops the exchange).
 * Do not call from inside an OpenMP parallel region. */
int loco_codec_decode(loco_codec *c, float *dst, size_t dst_n, float weight, const void *base,
                      size_t base_len, const loco_chunk_ref *chunks, size_t n_chunks);

/* ------------------------------- payloads quantized elsewhere (a GPU)
 * What loco_codec_encode_chunk_from and loco_codec_decode_chunk do around
 * the quantizer, for a caller that runs loco_quant / loco_dequant_acc (or
 * their CUDA twins) itself: outer/'s device mode. The bytes are the same. */

/* The quantizer's arguments for chunk `chunk` of the plan, its first
 * element, element count and raw payload bytes (LOCO_EINVAL: no such chunk). */
int loco_codec_chunk_quant(const loco_codec *c, const loco_encode_plan *plan, size_t chunk,
                           loco_quant_args *qa, size_t *first, size_t *count, size_t *raw_len);
/* Frames chunk `chunk`'s raw payload (raw_len bytes as chunk_quant says):
 * the plan's zstd stage and the header, into dst (dst_cap >= slot_bytes). */
int loco_codec_frame_chunk(loco_codec *c, int worker, const loco_encode_plan *plan, void *dst,
                           size_t dst_cap, size_t *dst_len, const uint8_t *raw, size_t chunk);
/* Checks a chunk exactly as loco_codec_decode_chunk does (same errors) and
 * yields its raw payload: inside src, or decompressed into worker's
 * scratch (valid until that worker's next call). Touches no destination. */
int loco_codec_unframe_chunk(loco_codec *c, int worker, size_t dst_n, const void *src, size_t len,
                             loco_chunk_info *info, const uint8_t **raw);

/* The quantizers' element loops (loco_quant, loco_dequant_acc and their
 * CUDA twins) are declared in kernels/kernels.h with the other kernels. */

#endif /* LOCO_COMPRESS_H */
