/* Byte-level BPE: the vocabulary tables, pre-tokenisation through PCRE2
 * (pattern.c compiles the regex), the per-piece merge loop (a min-heap of
 * adjacent pairs keyed by merge rank, leftmost first on ties) with a cache of
 * pieces, and decoding.
 *
 * One file: the vocabulary, merges and piece cache are one structure that
 * loading, encoding and decoding all read; training is in its own functions. */
#include "tokenizer/internal.h"

#include <omp.h>
#include <string.h>

/* ------------------------------------------------------------ tables */

uint64_t loco__tok_hash(const uint8_t *p, size_t n) {
    uint64_t h = 1469598103934665603ull ^ (uint64_t)n;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t v;
        memcpy(&v, p + i, 8);
        h = (h ^ v) * 0x9E3779B97F4A7C15ull;
        h ^= h >> 29;
    }
    for (; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    h ^= h >> 32;
    return h ? h : 1;
}

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb3fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

int loco__tok_new(loco_tok **out, int vocab, const char *what) {
    *out = NULL;
    if (vocab <= 0 || vocab > (1 << 24))
        return LOCO_ERR(LOCO_EPROTO, "%s: vocabulary of %d ids (expected 1..%d)", what, vocab,
                        1 << 24);
    loco_tok *t = loco_alloc(sizeof *t);
    if (!t)
        return LOCO_ERR(LOCO_ENOMEM, "%s: out of memory", what);
    t->vocab = vocab;
    t->off = loco_alloc((size_t)vocab * sizeof *t->off);
    t->len = loco_alloc((size_t)vocab * sizeof *t->len);
    t->bytes.cap = 1;
    while (t->bytes.cap < (size_t)vocab * 2 + 16)
        t->bytes.cap <<= 1;
    t->bytes.hash = loco_alloc(t->bytes.cap * sizeof *t->bytes.hash);
    t->bytes.id = loco_alloc(t->bytes.cap * sizeof *t->bytes.id);
    t->mcap = t->bytes.cap;
    t->mkey = loco_alloc(t->mcap * sizeof *t->mkey);
    t->mrank = loco_alloc(t->mcap * sizeof *t->mrank);
    t->mres = loco_alloc(t->mcap * sizeof *t->mres);
    t->merges_cap = vocab + 16;
    t->merge_l = loco_alloc((size_t)t->merges_cap * sizeof *t->merge_l);
    t->merge_r = loco_alloc((size_t)t->merges_cap * sizeof *t->merge_r);
    t->pool_cap = (size_t)vocab * 8 + 1024;
    t->pool = loco_alloc(t->pool_cap);
    if (!t->off || !t->len || !t->bytes.hash || !t->bytes.id || !t->mkey || !t->mrank || !t->mres ||
        !t->merge_l || !t->merge_r || !t->pool) {
        loco_tok_destroy(t);
        return LOCO_ERR(LOCO_ENOMEM, "%s: out of memory for %d ids", what, vocab);
    }
    for (int i = 0; i < vocab; i++)
        t->len[i] = TOK_ABSENT;
    for (int b = 0; b < 256; b++)
        t->byte_id[b] = -1;
    *out = t;
    return 0;
}

void loco_tok_destroy(loco_tok *t) {
    if (!t)
        return;
    if (t->re)
        pcre2_code_free(t->re);
    loco_free(t->regex);
    loco_free(t->off);
    loco_free(t->len);
    loco_free(t->pool);
    loco_free(t->bytes.hash);
    loco_free(t->bytes.id);
    loco_free(t->mkey);
    loco_free(t->mrank);
    loco_free(t->mres);
    loco_free(t->merge_l);
    loco_free(t->merge_r);
    loco_free(t);
}

int loco__tok_lookup(const loco_tok *t, const uint8_t *b, size_t n) {
    uint64_t h = loco__tok_hash(b, n);
    size_t mask = t->bytes.cap - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        if (t->bytes.hash[i] == 0)
            return -1;
        if (t->bytes.hash[i] == h) {
            int id = t->bytes.id[i];
            if (t->len[id] == n && !memcmp(t->pool + t->off[id], b, n))
                return id;
        }
    }
}

int loco__tok_set(loco_tok *t, int id, const uint8_t *b, size_t n, int special, const char *file,
                  const char *where) {
    if (id < 0 || id >= t->vocab)
        return LOCO_ERR(LOCO_EPROTO, "%s: %s: id %d outside 0..%d", file, where, id, t->vocab - 1);
    if (n == 0)
        return LOCO_ERR(LOCO_EPROTO, "%s: %s: empty token (id %d)", file, where, id);
    if (t->len[id] != TOK_ABSENT)
        return LOCO_ERR(LOCO_EPROTO,
                        "%s: %s: duplicate id/rank %d (already given to another "
                        "token)",
                        file, where, id);
    if (!special && loco__tok_lookup(t, b, n) >= 0)
        return LOCO_ERR(LOCO_EPROTO, "%s: %s: token of id %d repeats the bytes of id %d", file,
                        where, id, loco__tok_lookup(t, b, n));
    if (t->pool_len + n > t->pool_cap) {
        size_t ncap = (t->pool_len + n) * 2;
        uint8_t *np = loco_alloc(ncap);
        if (!np)
            return LOCO_ERR(LOCO_ENOMEM, "%s: out of memory", file);
        memcpy(np, t->pool, t->pool_len);
        loco_free(t->pool);
        t->pool = np;
        t->pool_cap = ncap;
    }
    memcpy(t->pool + t->pool_len, b, n);
    t->off[id] = (uint32_t)t->pool_len;
    t->len[id] = (uint32_t)n;
    t->pool_len += n;
    if (special) {
        if (t->nspecial == TOK_MAX_SPECIAL)
            return LOCO_ERR(LOCO_EPROTO, "%s: %s: more than %d special tokens", file, where,
                            TOK_MAX_SPECIAL);
        t->special[t->nspecial++] = id;
        t->nlead += !t->special_lead[b[0]];
        t->lead = b[0];
        t->special_lead[b[0]] |= n == 1 ? 2 : 1;
        if (n > 1) /* bit b[0] << 8 | b[1] */
            t->special_pair[b[0] << 2 | b[1] >> 6] |= 1ull << (b[1] & 63);
        return 0;
    }
    if (n == 1)
        t->byte_id[b[0]] = id;
    uint64_t h = loco__tok_hash(b, n);
    size_t mask = t->bytes.cap - 1, i = h & mask;
    while (t->bytes.hash[i])
        i = (i + 1) & mask;
    t->bytes.hash[i] = h;
    t->bytes.id[i] = id;
    t->bytes.n++;
    return 0;
}

int loco__tok_merge(const loco_tok *t, int32_t l, int32_t r, int32_t *res) {
    uint64_t key = ((uint64_t)(uint32_t)(l + 1) << 32) | (uint32_t)(r + 1);
    size_t mask = t->mcap - 1;
    for (size_t i = mix64(key) & mask;; i = (i + 1) & mask) {
        if (t->mkey[i] == key) {
            *res = t->mres[i];
            return t->mrank[i];
        }
        if (t->mkey[i] == 0)
            return -1;
    }
}

int loco__tok_add_merge(loco_tok *t, int l, int r, const char *file, const char *where) {
    if (t->len[l] == TOK_ABSENT || t->len[r] == TOK_ABSENT)
        return LOCO_ERR(LOCO_EPROTO, "%s: %s: merge of an unknown id", file, where);
    int32_t dummy;
    if (loco__tok_merge(t, l, r, &dummy) >= 0)
        return LOCO_ERR(LOCO_EPROTO, "%s: %s: duplicate merge", file, where);
    size_t n = (size_t)t->len[l] + t->len[r];
    uint8_t stackbuf[256];
    uint8_t *cat = n <= sizeof stackbuf ? stackbuf : loco_alloc(n);
    if (!cat)
        return LOCO_ERR(LOCO_ENOMEM, "%s: out of memory", file);
    memcpy(cat, t->pool + t->off[l], t->len[l]);
    memcpy(cat + t->len[l], t->pool + t->off[r], t->len[r]);
    int res = loco__tok_lookup(t, cat, n);
    if (cat != stackbuf)
        loco_free(cat);
    if (res < 0)
        return LOCO_ERR(LOCO_EPROTO, "%s: %s: the merge's result is not in the vocabulary", file,
                        where);
    if (t->nmerges == t->merges_cap || (size_t)t->nmerges * 2 + 2 > t->mcap)
        return LOCO_ERR(LOCO_EPROTO, "%s: %s: more merges (%d) than the vocabulary allows", file,
                        where, t->nmerges + 1);
    uint64_t key = ((uint64_t)(uint32_t)(l + 1) << 32) | (uint32_t)(r + 1);
    size_t mask = t->mcap - 1, i = mix64(key) & mask;
    while (t->mkey[i])
        i = (i + 1) & mask;
    t->mkey[i] = key;
    t->mrank[i] = t->nmerges;
    t->mres[i] = res;
    t->merge_l[t->nmerges] = l;
    t->merge_r[t->nmerges] = r;
    t->nmerges++;
    return 0;
}

int loco__tok_finish(loco_tok *t, const char *file) {
    for (int b = 0; b < 256; b++)
        if (t->byte_id[b] < 0)
            return LOCO_ERR(LOCO_EPROTO,
                            "%s: byte 0x%02x has no token (a byte-level BPE "
                            "vocabulary holds all 256 single bytes)",
                            file, b);
    return t->re ? 0 : loco__tok_use_regex(t, LOCO_TOK_GPT2_PATTERN, file);
}

/* ------------------------------------------------------------ byte mapping */

uint32_t loco__tok_byte_cp(uint8_t b) {
    if ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE))
        return b;
    /* the others, in byte order, from 256 */
    int k = 0;
    for (int c = 0; c < b; c++)
        if (!((c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE))
            k++;
    return 256u + (uint32_t)k;
}

static int cp_byte(uint32_t cp) {
    static int inv[324];
    static int ready;
    if (!__atomic_load_n(&ready, __ATOMIC_ACQUIRE)) {
        int tmp[324];
        for (int i = 0; i < 324; i++)
            tmp[i] = -1;
        for (int b = 0; b < 256; b++)
            tmp[loco__tok_byte_cp((uint8_t)b)] = b;
        memcpy(inv, tmp, sizeof inv);
        __atomic_store_n(&ready, 1, __ATOMIC_RELEASE);
    }
    return cp < 324 ? inv[cp] : -1;
}

long loco__tok_unmap(const char *s, size_t n, uint8_t *out) {
    const uint8_t *p = (const uint8_t *)s;
    size_t i = 0, k = 0;
    while (i < n) {
        uint32_t cp;
        if (p[i] < 0x80) {
            cp = p[i++];
        } else if ((p[i] & 0xE0) == 0xC0 && i + 1 < n && (p[i + 1] & 0xC0) == 0x80) {
            cp = (uint32_t)(p[i] & 0x1F) << 6 | (p[i + 1] & 0x3F);
            i += 2;
        } else {
            return -1; /* every mapped code point is below U+0800 */
        }
        int b = cp_byte(cp);
        if (b < 0)
            return -1;
        out[k++] = (uint8_t)b;
    }
    return (long)k;
}

size_t loco__tok_map(const uint8_t *b, size_t n, char *out) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t cp = loco__tok_byte_cp(b[i]);
        if (cp < 0x80) {
            out[k++] = (char)cp;
        } else {
            out[k++] = (char)(0xC0 | (cp >> 6));
            out[k++] = (char)(0x80 | (cp & 0x3F));
        }
    }
    out[k] = '\0';
    return k;
}

/* ------------------------------------------------------------ accessors */

int loco_tok_vocab_size(const loco_tok *t) {
    return t->vocab;
}
int loco_tok_num_merges(const loco_tok *t) {
    return t->nmerges;
}

int loco_tok_special_id(const loco_tok *t, const char *text) {
    size_t n = strlen(text);
    for (int i = 0; i < t->nspecial; i++) {
        int id = t->special[i];
        if (t->len[id] == n && !memcmp(t->pool + t->off[id], text, n))
            return id;
    }
    return -1;
}

int loco_tok_eot_id(const loco_tok *t) {
    int id = loco_tok_special_id(t, LOCO_TOK_EOT);
    return id >= 0 ? id : loco_tok_special_id(t, LOCO_TOK_LLAMA3_EOT);
}

const uint8_t *loco_tok_token_bytes(const loco_tok *t, int id, size_t *len) {
    if (id < 0 || id >= t->vocab || t->len[id] == TOK_ABSENT) {
        *len = 0;
        return NULL;
    }
    *len = t->len[id];
    return t->pool + t->off[id];
}

/* ------------------------------------------------------------ BPE of a piece */

#define CACHE_SLOTS (1u << 15)
#define CACHE_MAX_PIECE 64
#define CACHE_KEY_POOL (1u << 20)
#define CACHE_ID_POOL (1u << 18)

typedef struct {
    uint64_t h;
    uint32_t koff, klen, ioff, nids;
} cache_slot;

struct tok_work {
    size_t cap;        /* symbols the buffers below hold */
    int32_t *sym;      /* (cap) id of each live symbol, -1 when merged away */
    uint32_t *next;    /* (cap) next live symbol */
    uint32_t *prev;    /* (cap) previous live symbol (UINT32_MAX: none) */
    uint64_t *heap;    /* (3*cap) rank << 32 | position */
    cache_slot *slots; /* (CACHE_SLOTS) */
    uint8_t *keys;     /* (CACHE_KEY_POOL) */
    int32_t *ids;      /* (CACHE_ID_POOL) */
    size_t nslots, key_len, id_len;
};

static int work_grow(tok_work *w, size_t n) {
    if (n <= w->cap)
        return 0;
    size_t cap = w->cap ? w->cap : 256;
    while (cap < n)
        cap *= 2;
    loco_free(w->sym);
    loco_free(w->next);
    loco_free(w->prev);
    loco_free(w->heap);
    w->sym = loco_alloc(cap * sizeof *w->sym);
    w->next = loco_alloc(cap * sizeof *w->next);
    w->prev = loco_alloc(cap * sizeof *w->prev);
    w->heap = loco_alloc(3 * cap * sizeof *w->heap);
    w->cap = cap;
    if (!w->sym || !w->next || !w->prev || !w->heap) {
        w->cap = 0;
        return LOCO_ERR(LOCO_ENOMEM, "tokenizer: cannot allocate BPE scratch for %zu bytes", n);
    }
    return 0;
}

int loco__tok_work_create(tok_work **out) {
    tok_work *w = loco_alloc(sizeof *w);
    if (!w)
        return LOCO_ERR(LOCO_ENOMEM, "tokenizer: out of memory");
    w->slots = loco_alloc(CACHE_SLOTS * sizeof *w->slots);
    w->keys = loco_alloc(CACHE_KEY_POOL);
    w->ids = loco_alloc(CACHE_ID_POOL * sizeof *w->ids);
    if (!w->slots || !w->keys || !w->ids || work_grow(w, 256) < 0) {
        loco__tok_work_destroy(w);
        return LOCO_ERR(LOCO_ENOMEM, "tokenizer: out of memory for the piece cache");
    }
    *out = w;
    return 0;
}

void loco__tok_work_destroy(tok_work *w) {
    if (!w)
        return;
    loco_free(w->sym);
    loco_free(w->next);
    loco_free(w->prev);
    loco_free(w->heap);
    loco_free(w->slots);
    loco_free(w->keys);
    loco_free(w->ids);
    loco_free(w);
}

static void heap_push(uint64_t *h, size_t *n, uint64_t v) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p] <= v)
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, size_t *n) {
    uint64_t top = h[0], v = h[--(*n)];
    size_t i = 0, m = *n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= m)
            break;
        if (c + 1 < m && h[c + 1] < h[c])
            c++;
        if (v <= h[c])
            break;
        h[i] = h[c];
        i = c;
    }
    if (m)
        h[i] = v;
    return top;
}

long loco__tok_bpe_raw(const loco_tok *t, tok_work *w, const uint8_t *p, size_t n, int32_t *out) {
    if (n == 1) {
        out[0] = t->byte_id[p[0]];
        return 1;
    }
    LOCO_CHECK(work_grow(w, n));
    int32_t *sym = w->sym;
    uint32_t *next = w->next, *prev = w->prev;
    uint64_t *heap = w->heap;
    size_t hn = 0;
    for (size_t i = 0; i < n; i++) {
        sym[i] = t->byte_id[p[i]];
        next[i] = (uint32_t)(i + 1);
        prev[i] = i ? (uint32_t)(i - 1) : UINT32_MAX;
    }
    int32_t res;
    for (size_t i = 0; i + 1 < n; i++) {
        int r = loco__tok_merge(t, sym[i], sym[i + 1], &res);
        if (r >= 0)
            heap_push(heap, &hn, (uint64_t)r << 32 | i);
    }
    while (hn) {
        uint64_t top = heap_pop(heap, &hn);
        uint32_t i = (uint32_t)top, rank = (uint32_t)(top >> 32);
        if (sym[i] < 0 || next[i] >= n)
            continue;
        uint32_t j = next[i];
        int r = loco__tok_merge(t, sym[i], sym[j], &res);
        if (r < 0 || (uint32_t)r != rank)
            continue; /* stale: a neighbour changed since this pair was pushed */
        sym[i] = res;
        sym[j] = -1;
        next[i] = next[j];
        if (next[j] < n)
            prev[next[j]] = i;
        if (prev[i] != UINT32_MAX) {
            r = loco__tok_merge(t, sym[prev[i]], sym[i], &res);
            if (r >= 0)
                heap_push(heap, &hn, (uint64_t)r << 32 | prev[i]);
        }
        if (next[i] < n) {
            r = loco__tok_merge(t, sym[i], sym[next[i]], &res);
            if (r >= 0)
                heap_push(heap, &hn, (uint64_t)r << 32 | i);
        }
    }
    long k = 0;
    for (size_t i = 0; i < n; i = next[i])
        out[k++] = sym[i];
    return k;
}

long loco__tok_bpe(const loco_tok *t, tok_work *w, const uint8_t *p, size_t n, int32_t *out) {
    if (n > CACHE_MAX_PIECE || n == 1)
        return loco__tok_bpe_raw(t, w, p, n, out);
    uint64_t h = loco__tok_hash(p, n);
    size_t mask = CACHE_SLOTS - 1, i = h & mask;
    for (; w->slots[i].h; i = (i + 1) & mask) {
        cache_slot *s = &w->slots[i];
        if (s->h == h && s->klen == n && !memcmp(w->keys + s->koff, p, n)) {
            memcpy(out, w->ids + s->ioff, s->nids * sizeof *out);
            return s->nids;
        }
    }
    long k = loco__tok_bpe_raw(t, w, p, n, out);
    if (k < 0)
        return k;
    if (w->nslots * 2 >= CACHE_SLOTS || w->key_len + n > CACHE_KEY_POOL ||
        w->id_len + (size_t)k > CACHE_ID_POOL) { /* full: start again */
        memset(w->slots, 0, CACHE_SLOTS * sizeof *w->slots);
        w->nslots = w->key_len = w->id_len = 0;
        for (i = h & mask; w->slots[i].h; i = (i + 1) & mask)
            ;
    }
    w->slots[i] = (cache_slot){.h = h,
                               .koff = (uint32_t)w->key_len,
                               .klen = (uint32_t)n,
                               .ioff = (uint32_t)w->id_len,
                               .nids = (uint32_t)k};
    memcpy(w->keys + w->key_len, p, n);
    memcpy(w->ids + w->id_len, out, (size_t)k * sizeof *out);
    w->key_len += n;
    w->id_len += (size_t)k;
    w->nslots++;
    return k;
}

/* ------------------------------------------------------------ pieces */

/* Runs the regex over one segment free of special tokens. Bytes the regex
 * does not match (invalid UTF-8) become pieces of their own. */
static int regex_pieces(const loco_tok *t, pcre2_match_data *md, const uint8_t *s, size_t n,
                        tok_piece_fn fn, void *arg) {
    size_t off = 0;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    /* a file's own regex may match the empty string: look for others */
    const uint32_t opts = loco__tok_chunkable(t) ? 0 : PCRE2_NOTEMPTY;
    while (off < n) {
        int rc = t->jit ? pcre2_jit_match(t->re, (PCRE2_SPTR)s, n, off, opts, md, NULL)
                        : pcre2_match(t->re, (PCRE2_SPTR)s, n, off, opts, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) {
            LOCO_CHECK(fn(s + off, n - off, -1, arg));
            break;
        }
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return LOCO_ERR(LOCO_EINVAL, "tokenizer: PCRE2 match failed at byte %zu: %s", off,
                            (const char *)msg);
        }
        if (ov[0] > off)
            LOCO_CHECK(fn(s + off, ov[0] - off, -1, arg));
        if (ov[1] <= ov[0]) /* cannot happen with the named patterns; never loop */
            return LOCO_ERR(LOCO_EINVAL, "tokenizer: empty regex match at byte %zu", ov[0]);
        LOCO_CHECK(fn(s + ov[0], ov[1] - ov[0], -1, arg));
        off = ov[1];
    }
    return 0;
}

/* Some special of two bytes or more starts with p[0], p[1]. */
static int special_pair(const loco_tok *t, const uint8_t *p) {
    const unsigned pair = (unsigned)p[0] << 8 | p[1];
    return (int)(t->special_pair[pair >> 6] >> (pair & 63) & 1);
}

/* The first place at or after pos where a special token starts (the
 * longest of those starting there in *id), or len (*id -1). One pass over
 * the text, however many specials (Llama 3 has 256); only a place where a
 * special's first two bytes (or a one-byte special) are compares them. */
static size_t next_special(const loco_tok *t, const uint8_t *text, size_t pos, size_t len,
                           int *id) {
    for (; pos < len; pos++) {
        if (t->nlead == 1) { /* memchr skips to the next candidate */
            const uint8_t *p = memchr(text + pos, t->lead, len - pos);
            if (!p)
                break;
            pos = (size_t)(p - text);
        }
        const uint8_t lead = t->special_lead[text[pos]];
        if (!lead || (!(lead & 2) && (pos + 1 == len || !special_pair(t, text + pos))))
            continue;
        int best = -1;
        for (int i = 0; i < t->nspecial; i++) {
            int s = t->special[i];
            if (t->len[s] <= len - pos && (best < 0 || t->len[s] > t->len[best]) &&
                !memcmp(text + pos, t->pool + t->off[s], t->len[s]))
                best = s;
        }
        if (best >= 0) {
            *id = best;
            return pos;
        }
    }
    *id = -1;
    return len;
}

int loco__tok_pieces(const loco_tok *t, pcre2_match_data *md, const uint8_t *text, size_t len,
                     tok_piece_fn fn, void *arg) {
    size_t pos = 0;
    while (pos < len) {
        int id;
        size_t at = next_special(t, text, pos, len, &id);
        if (at > pos)
            LOCO_CHECK(regex_pieces(t, md, text + pos, at - pos, fn, arg));
        if (id < 0)
            break;
        LOCO_CHECK(fn(text + at, t->len[id], id, arg));
        pos = at + t->len[id];
    }
    return 0;
}

/* ------------------------------------------------------------ encode */

typedef struct {
    const loco_tok *t;
    tok_work *w;
    int32_t *ids;
    size_t n;
} enc_ctx;

static int enc_piece(const uint8_t *p, size_t n, int special, void *arg) {
    enc_ctx *c = arg;
    if (special >= 0) {
        c->ids[c->n++] = special;
        return 0;
    }
    int whole = c->t->whole_pieces ? loco__tok_lookup(c->t, p, n) : -1;
    if (whole >= 0) {
        c->ids[c->n++] = whole;
        return 0;
    }
    long k = loco__tok_bpe(c->t, c->w, p, n, c->ids + c->n);
    if (k < 0)
        return (int)k;
    c->n += (size_t)k;
    return 0;
}

/* Encodes into ids, which has room for len ids (each id covers >= 1 byte). */
static int encode_into(const loco_tok *t, const uint8_t *text, size_t len, int32_t *ids,
                       size_t *n) {
    *n = 0;
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    tok_work *w = NULL;
    int rc = 0;
    if (!md) {
        rc = LOCO_ERR(LOCO_ENOMEM, "tokenizer: out of memory for match data");
        goto out;
    }
    LOCO_CHECK_GOTO(loco__tok_work_create(&w), out);
    enc_ctx c = {.t = t, .w = w, .ids = ids};
    LOCO_CHECK_GOTO(loco__tok_pieces(t, md, text, len, enc_piece, &c), out);
    *n = c.n;
out:
    loco__tok_work_destroy(w);
    if (md)
        pcre2_match_data_free(md);
    return rc;
}

int loco_tok_encode(const loco_tok *t, const uint8_t *text, size_t len, int32_t **ids, size_t *n) {
    *ids = NULL;
    *n = 0;
    int32_t *buf = loco_alloc((len + 1) * sizeof *buf);
    if (!buf)
        return LOCO_ERR(LOCO_ENOMEM, "tokenizer: cannot allocate ids for %zu bytes", len);
    int rc = encode_into(t, text, len, buf, n);
    if (rc < 0) {
        loco_free(buf);
        return rc;
    }
    *ids = buf;
    return 0;
}

/* A chunk may start at p when text[p-1] is a newline, text[p-2] is ASCII and
 * not white space and text[p] is an ASCII letter or digit: the newline is a
 * piece of its own or ends the punctuation before it, whether the text goes
 * on after it or not, under each named pattern (a longer run of white space
 * before p is not: GPT-2's "\n\n" is two pieces before a word, one at the
 * end of a text; nor a '/' at p: o200k's punctuation takes "\n/"), and no
 * piece starts before p and takes text[p]. */
static size_t next_cut(const uint8_t *text, size_t len, size_t from) {
    for (size_t p = from < 2 ? 2 : from; p < len; p++) {
        uint8_t a = text[p - 2], c = text[p];
        if (text[p - 1] == '\n' && a < 0x80 && a != ' ' && a != '\t' && a != '\n' && a != '\r' &&
            a != '\v' && a != '\f' &&
            ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')))
            return p;
    }
    return len;
}

int loco_tok_encode_parallel(const loco_tok *t, const uint8_t *text, size_t len, size_t chunk_bytes,
                             int nthreads, loco_tok_progress_fn progress, void *arg, int32_t **ids,
                             size_t *n) {
    *ids = NULL;
    *n = 0;
    if (chunk_bytes == 0)
        chunk_bytes = 1 << 20;
    for (int i = 0; i < t->nspecial; i++) /* a special with a newline could be cut */
        if (memchr(t->pool + t->off[t->special[i]], '\n', t->len[t->special[i]]))
            chunk_bytes = len + 1;
    if (!loco__tok_chunkable(t)) /* a regex of the file's own: no safe cut known */
        chunk_bytes = len + 1;
    /* chunk boundaries */
    size_t nchunks = 0, cap = len / chunk_bytes + 2;
    size_t *cut = loco_alloc((cap + 1) * sizeof *cut);
    int32_t *buf = loco_alloc((len + 1) * sizeof *buf);
    size_t *count = loco_alloc(cap * sizeof *count);
    if (!cut || !buf || !count) {
        loco_free(cut);
        loco_free(buf);
        loco_free(count);
        return LOCO_ERR(LOCO_ENOMEM, "tokenizer: cannot allocate ids for %zu bytes", len);
    }
    cut[0] = 0;
    while (cut[nchunks] < len) {
        size_t want = cut[nchunks] + chunk_bytes;
        size_t c = want >= len ? len : next_cut(text, len, want);
        cut[++nchunks] = c;
        if (nchunks == cap)
            break;
    }
    if (cut[nchunks] < len)
        cut[nchunks] = len;
    int rc = 0;
    size_t done = 0;
    int nt = nthreads > 0 ? nthreads : omp_get_max_threads();
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
    for (size_t k = 0; k < nchunks; k++) {
        int r = 0, failed;
#pragma omp atomic read
        failed = rc;
        if (failed == 0)
            r = encode_into(t, text + cut[k], cut[k + 1] - cut[k], buf + cut[k], &count[k]);
#pragma omp critical(loco_tok_progress)
        {
            if (r < 0 && rc == 0)
                rc = r;
            done += cut[k + 1] - cut[k];
            if (progress && rc == 0)
                progress(done, len, arg);
        }
    }
    if (rc == 0) { /* close up: chunk k's ids start at buf + cut[k] */
        size_t m = 0;
        for (size_t k = 0; k < nchunks; k++) {
            memmove(buf + m, buf + cut[k], count[k] * sizeof *buf);
            m += count[k];
        }
        *ids = buf;
        *n = m;
    } else {
        loco_free(buf);
    }
    loco_free(cut);
    loco_free(count);
    return rc;
}

/* ------------------------------------------------------------ decode, split */

int loco_tok_decode(const loco_tok *t, const int32_t *ids, size_t n, uint8_t **text, size_t *len) {
    *text = NULL;
    *len = 0;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->vocab || t->len[ids[i]] == TOK_ABSENT)
            return LOCO_ERR(LOCO_EINVAL,
                            "tokenizer: id %d at position %zu is not in the "
                            "vocabulary of %d ids",
                            ids[i], i, t->vocab);
        total += t->len[ids[i]];
    }
    uint8_t *out = loco_alloc(total + 1);
    if (!out)
        return LOCO_ERR(LOCO_ENOMEM, "tokenizer: cannot allocate %zu bytes of text", total);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(out + k, t->pool + t->off[ids[i]], t->len[ids[i]]);
        k += t->len[ids[i]];
    }
    out[k] = 0;
    *text = out;
    *len = k;
    return 0;
}

static int count_piece(const uint8_t *p, size_t n, int special, void *arg) {
    (*(size_t *)arg)++;
    return 0;
}

int loco_tok_split_count(const loco_tok *t, const uint8_t *text, size_t len, size_t *npieces) {
    *npieces = 0;
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    if (!md)
        return LOCO_ERR(LOCO_ENOMEM, "tokenizer: out of memory for match data");
    int rc = loco__tok_pieces(t, md, text, len, count_piece, npieces);
    pcre2_match_data_free(md);
    return rc;
}
