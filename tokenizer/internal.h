/* tokenizer/ internals shared by its files. */
#ifndef LOCO_TOKENIZER_INTERNAL_H
#define LOCO_TOKENIZER_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/tokenizer.h"

#include <pcre2.h>

#define TOK_ABSENT UINT32_MAX
/* Llama 3's 256 and room for a tokenizer.json's added tokens */
#define TOK_MAX_SPECIAL 512

/* Open-addressing map from a byte string to an id (the vocabulary). */
typedef struct {
    uint64_t *hash; /* (cap) 0 = empty slot */
    int32_t *id;    /* (cap) */
    size_t cap, n;
} tok_bmap;

struct loco_tok {
    int vocab;     /* largest id + 1 */
    uint32_t *off; /* (vocab) offset of each id's bytes in pool */
    uint32_t *len; /* (vocab) byte length, TOK_ABSENT for an unused id */
    uint8_t *pool; /* bytes of every token */
    size_t pool_len, pool_cap;
    int byte_id[256]; /* id of each single byte */
    tok_bmap bytes;   /* bytes -> id (specials excluded) */
    /* merges: pair (left id, right id) -> rank and result id */
    uint64_t *mkey; /* (mcap) (left+1) << 32 | (right+1); 0 = empty */
    int32_t *mrank; /* (mcap) */
    int32_t *mres;  /* (mcap) */
    size_t mcap;
    int32_t *merge_l, *merge_r; /* (nmerges) in rank order */
    int nmerges, merges_cap;
    int nspecial;
    int32_t special[TOK_MAX_SPECIAL]; /* ids of special tokens */
    /* how specials start, so that one pass over the text finds them */
    uint8_t special_lead[256];   /* per byte: 1 one starts with it, 2 it is one */
    uint64_t special_pair[1024]; /* bit b0 << 8 | b1: one starts with b0 b1 */
    int nlead;                   /* distinct first bytes */
    int lead;                    /* the first byte when nlead is 1 (usually '<') */
    pcre2_code *re;
    int jit;                  /* re was JIT-compiled */
    char *regex;              /* re's source as the file or name gave it */
    const char *pattern_name; /* "gpt2", "cl100k", "o200k", "llama3" or "custom" */
    int whole_pieces; /* a piece that is a token is that token (tokenizer.json ignore_merges) */
};

/* A named pattern and, for a known encoding (OpenAI's, Llama 3's), the
 * special tokens its tokenizer gives a file of exactly nranks ranks: the
 * named ones, and "<|reserved_special_token_K|>" for every other id in
 * nranks..special_end-1 (K = 0, 1, ... in id order; none when special_end
 * is 0), as Meta-Llama-3.1-8B's tokenizer.json names them. */
typedef struct {
    const char *name, *regex;
    int nranks, special_end;
    struct {
        const char *text;
        int id;
    } special[8];
} tok_pattern;

const tok_pattern *loco__tok_pattern(const char *name); /* NULL when unknown */
int loco__tok_pattern_auto(const char *name);           /* NULL, "" or "auto" */
/* 0 for "auto" or a known name; LOCO_EINVAL naming the known ones. */
int loco__tok_pattern_check(const char *name, const char *what);
/* Compiles regex (tiktoken / Hugging Face syntax) as t's pre-tokenizer. */
int loco__tok_use_regex(loco_tok *t, const char *regex, const char *what);
/* The text may be cut into chunks (a named pattern, whose pieces never
 * cross a cut of encode_parallel). */
int loco__tok_chunkable(const loco_tok *t);
/* The regex a tokenizer.json's pre_tokenizer declares (GPT-2's for none,
 * ByteLevel alone, use_regex true); LOCO_EPROTO naming path for what loco
 * cannot follow. */
struct cJSON;
int loco__tok_hf_pre_tokenizer(const char *path, const struct cJSON *pre, const char **regex);
/* t's pre_tokenizer as a tokenizer.json writes it. */
struct cJSON *loco__tok_hf_pre_tokenizer_json(const loco_tok *t);

uint64_t loco__tok_hash(const uint8_t *p, size_t n);
/* An empty tokenizer for ids 0..vocab-1 (none set yet). */
int loco__tok_new(loco_tok **out, int vocab, const char *what);
/* Sets id's bytes; LOCO_EPROTO for a duplicate id or duplicate bytes
 * (`where` names the place in the file). */
int loco__tok_set(loco_tok *t, int id, const uint8_t *b, size_t n, int special, const char *file,
                  const char *where);
int loco__tok_lookup(const loco_tok *t, const uint8_t *b, size_t n); /* id or -1 */
/* Appends merge (l, r) with the next rank; its result must be a token. */
int loco__tok_add_merge(loco_tok *t, int l, int r, const char *file, const char *where);
/* Checks the 256 bytes are present and compiles GPT-2's regex unless t
 * has one. */
int loco__tok_finish(loco_tok *t, const char *file);
/* Rank and result of merging (l, r); rank -1 when not a merge. */
int loco__tok_merge(const loco_tok *t, int32_t l, int32_t r, int32_t *res);

/* GPT-2's byte <-> printable code point mapping. */
uint32_t loco__tok_byte_cp(uint8_t b);
/* Decodes a byte-level token string (UTF-8 of mapped code points) into raw
 * bytes (out has room for n); -1 when a code point is not in the mapping. */
long loco__tok_unmap(const char *s, size_t n, uint8_t *out);
/* Encodes raw bytes as the mapped string (out has room for 2n+1, NUL). */
size_t loco__tok_map(const uint8_t *b, size_t n, char *out);

/* Per-call encoder state: BPE scratch and a piece cache. */
typedef struct tok_work tok_work;
int loco__tok_work_create(tok_work **out);
void loco__tok_work_destroy(tok_work *w);
/* BPE of one piece into out (room for n ids); returns the id count or a
 * negative error. */
long loco__tok_bpe(const loco_tok *t, tok_work *w, const uint8_t *p, size_t n, int32_t *out);
/* The same without the cache (for merge tables that are still growing). */
long loco__tok_bpe_raw(const loco_tok *t, tok_work *w, const uint8_t *p, size_t n, int32_t *out);
/* Calls fn on every pre-tokenised piece of text (specials split out first,
 * reported with special >= 0). */
typedef int (*tok_piece_fn)(const uint8_t *p, size_t n, int special, void *arg);
int loco__tok_pieces(const loco_tok *t, pcre2_match_data *md, const uint8_t *text, size_t len,
                     tok_piece_fn fn, void *arg);

#endif /* LOCO_TOKENIZER_INTERNAL_H */
