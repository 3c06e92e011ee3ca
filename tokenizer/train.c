/* Byte-level BPE training (counts of the regex's pieces, repeated merges of
 * the most frequent adjacent pair) and saving as a Hugging Face
 * tokenizer.json. */
#include "tokenizer/internal.h"

#include <cjson/cJSON.h>
#include <string.h>

/* ------------------------------------------------------------ piece counts */

typedef struct {
    uint64_t h;
    const uint8_t *p;
    uint32_t n;
    int64_t count;
} piece_slot;

typedef struct {
    piece_slot *slots;
    size_t cap, n;
} piece_map;

static int piece_map_grow(piece_map *m) {
    size_t ncap = m->cap ? m->cap * 2 : 1 << 16;
    piece_slot *ns = loco_alloc(ncap * sizeof *ns);
    if (!ns)
        return LOCO_ERR(LOCO_ENOMEM, "tokenizer train: out of memory for %zu pieces", ncap);
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->slots[i].h)
            continue;
        size_t j = m->slots[i].h & (ncap - 1);
        while (ns[j].h)
            j = (j + 1) & (ncap - 1);
        ns[j] = m->slots[i];
    }
    loco_free(m->slots);
    m->slots = ns;
    m->cap = ncap;
    return 0;
}

static int count_piece(const uint8_t *p, size_t n, int special, void *arg) {
    if (special >= 0)
        return 0;
    piece_map *m = arg;
    if ((m->n + 1) * 2 > m->cap)
        LOCO_CHECK(piece_map_grow(m));
    uint64_t h = loco__tok_hash(p, n);
    size_t mask = m->cap - 1, i = h & mask;
    for (; m->slots[i].h; i = (i + 1) & mask) {
        piece_slot *s = &m->slots[i];
        if (s->h == h && s->n == n && !memcmp(s->p, p, n)) {
            s->count++;
            return 0;
        }
    }
    m->slots[i] = (piece_slot){.h = h, .p = p, .n = (uint32_t)n, .count = 1};
    m->n++;
    return 0;
}

/* ------------------------------------------------------------ training */

typedef struct {
    uint64_t key; /* (l+1) << 32 | (r+1); 0 = empty */
    int64_t count;
} pair_slot;

static uint64_t pair_hash(uint64_t x) {
    x ^= x >> 31;
    x *= 0x7fb5d329728ea185ull;
    x ^= x >> 27;
    return x;
}

/* Counts the regex's pieces of text into pm, split at <|endoftext|> (never
 * a piece of its own) by a tokenizer that knows only the bytes and it. */
static int count_pieces(const uint8_t *text, size_t len, const char *pattern, piece_map *pm) {
    int rc = 0;
    loco_tok *eot_only = NULL;
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    if (!md)
        return LOCO_ERR(LOCO_ENOMEM, "tokenizer train: out of memory");
    LOCO_CHECK_GOTO(loco__tok_new(&eot_only, 257, "tokenizer train"), out_free_md);
    for (int b = 0; b < 256; b++) {
        uint8_t c = (uint8_t)b;
        LOCO_CHECK_GOTO(loco__tok_set(eot_only, b, &c, 1, 0, "tokenizer train", "bytes"),
                        out_destroy_tok);
    }
    LOCO_CHECK_GOTO(loco__tok_set(eot_only, 256, (const uint8_t *)LOCO_TOK_EOT,
                                  strlen(LOCO_TOK_EOT), 1, "tokenizer train", "special"),
                    out_destroy_tok);
    LOCO_CHECK_GOTO(loco__tok_finish(eot_only, "tokenizer train"), out_destroy_tok);
    LOCO_CHECK_GOTO(loco_tok_set_pattern(eot_only, pattern), out_destroy_tok);
    LOCO_CHECK_GOTO(loco__tok_pieces(eot_only, md, text, len, count_piece, pm), out_destroy_tok);
out_destroy_tok:
    loco_tok_destroy(eot_only);
out_free_md:
    pcre2_match_data_free(md);
    return rc;
}

/* The distinct pieces as symbol sequences: word k is
 * syms[off[k] .. off[k] + len[k]), seen count[k] times. */
typedef struct {
    size_t n;
    int32_t *syms; /* (sum of the lengths) */
    size_t *off;   /* (n) */
    int32_t *len;  /* (n) */
    int64_t *count; /* (n) */
} words;

static void words_fini(words *wd) {
    loco_free(wd->syms);
    loco_free(wd->off);
    loco_free(wd->len);
    loco_free(wd->count);
}

/* The words of pm in the order of its hash table, which depends only on
 * the text. Caller calls words_fini, also on failure. */
static int words_of(const piece_map *pm, words *wd) {
    size_t nsym = 0;
    for (size_t i = 0; i < pm->cap; i++)
        nsym += pm->slots[i].h ? pm->slots[i].n : 0;
    wd->n = pm->n;
    wd->syms = loco_alloc((nsym + 1) * sizeof *wd->syms);
    wd->off = loco_alloc((wd->n + 1) * sizeof *wd->off);
    wd->len = loco_alloc((wd->n + 1) * sizeof *wd->len);
    wd->count = loco_alloc((wd->n + 1) * sizeof *wd->count);
    if (!wd->syms || !wd->off || !wd->len || !wd->count)
        return LOCO_ERR(LOCO_ENOMEM, "tokenizer train: out of memory for %zu pieces", wd->n);
    size_t w = 0, s = 0;
    for (size_t i = 0; i < pm->cap; i++) {
        const piece_slot *ps = &pm->slots[i];
        if (!ps->h)
            continue;
        wd->off[w] = s;
        wd->len[w] = (int32_t)ps->n;
        wd->count[w] = ps->count;
        for (uint32_t k = 0; k < ps->n; k++)
            wd->syms[s++] = ps->p[k];
        w++;
    }
    return 0;
}

/* The most frequent adjacent pair of the words (ties: the smaller ids),
 * as its key; 0 when every word is a single symbol. pairs: pcap slots, a
 * power of two above twice the pairs there can be. */
static uint64_t best_pair(const words *wd, pair_slot *pairs, size_t pcap) {
    memset(pairs, 0, pcap * sizeof *pairs);
    for (size_t k = 0; k < wd->n; k++) {
        const int32_t *q = wd->syms + wd->off[k];
        for (int32_t i = 0; i + 1 < wd->len[k]; i++) {
            uint64_t key = ((uint64_t)(uint32_t)(q[i] + 1) << 32) | (uint32_t)(q[i + 1] + 1);
            size_t j = pair_hash(key) & (pcap - 1);
            while (pairs[j].key && pairs[j].key != key)
                j = (j + 1) & (pcap - 1);
            pairs[j].key = key;
            pairs[j].count += wd->count[k];
        }
    }
    uint64_t best = 0;
    int64_t bc = 0;
    for (size_t j = 0; j < pcap; j++) {
        if (!pairs[j].key)
            continue;
        if (pairs[j].count > bc || (pairs[j].count == bc && pairs[j].key < best)) {
            bc = pairs[j].count;
            best = pairs[j].key;
        }
    }
    return best;
}

/* Replaces every pair (l, r) in the words by symbol id, left to right. */
static void merge_pair(words *wd, int32_t l, int32_t r, int32_t id) {
    for (size_t k = 0; k < wd->n; k++) {
        int32_t *q = wd->syms + wd->off[k], m = 0;
        for (int32_t i = 0; i < wd->len[k]; i++) {
            if (i + 1 < wd->len[k] && q[i] == l && q[i + 1] == r) {
                q[m++] = id;
                i++;
            } else {
                q[m++] = q[i];
            }
        }
        wd->len[k] = m;
    }
}

/* Up to nmerge merges of the most frequent pair into ml, mr (left and
 * right ids of merge k, whose id is 256 + k); their number in *done. */
static int learn_merges(words *wd, int nmerge, int32_t *ml, int32_t *mr, int *done) {
    size_t nsym = 0;
    for (size_t k = 0; k < wd->n; k++)
        nsym += (size_t)wd->len[k];
    size_t pcap = 1024;
    while (pcap < 2 * nsym + 2)
        pcap <<= 1;
    pair_slot *pairs = loco_alloc(pcap * sizeof *pairs);
    if (!pairs)
        return LOCO_ERR(LOCO_ENOMEM, "tokenizer train: out of memory for %zu pieces", wd->n);
    /* merges depend only on the counts (ties by ids) */
    for (*done = 0; *done < nmerge; (*done)++) {
        const uint64_t best = best_pair(wd, pairs, pcap);
        if (!best)
            break; /* every piece is a single token */
        ml[*done] = (int32_t)(best >> 32) - 1;
        mr[*done] = (int32_t)(best & 0xffffffffu) - 1;
        merge_pair(wd, ml[*done], mr[*done], 256 + *done);
    }
    loco_free(pairs);
    return 0;
}

/* The tokenizer of the merges: bytes, the done merges, <|endoftext|>
 * last. */
static int build_tokenizer(loco_tok **out, const int32_t *ml, const int32_t *mr, int done) {
    loco_tok *t = NULL;
    int rc;
    LOCO_CHECK_GOTO(loco__tok_new(&t, 257 + done, "tokenizer train"), out_destroy_tok);
    for (int b = 0; b < 256; b++) {
        uint8_t c = (uint8_t)b;
        LOCO_CHECK_GOTO(loco__tok_set(t, b, &c, 1, 0, "tokenizer train", "bytes"),
                        out_destroy_tok);
    }
    for (int k = 0; k < done; k++) {
        const size_t ll = t->len[ml[k]], rl = t->len[mr[k]];
        uint8_t *cat = loco_alloc(ll + rl);
        if (!cat) {
            rc = LOCO_ERR(LOCO_ENOMEM, "tokenizer train: out of memory");
            goto out_destroy_tok;
        }
        memcpy(cat, t->pool + t->off[ml[k]], ll);
        memcpy(cat + ll, t->pool + t->off[mr[k]], rl);
        rc = loco__tok_set(t, 256 + k, cat, ll + rl, 0, "tokenizer train", "merge");
        loco_free(cat);
        if (rc < 0)
            goto out_destroy_tok;
    }
    LOCO_CHECK_GOTO(loco__tok_set(t, 256 + done, (const uint8_t *)LOCO_TOK_EOT,
                                  strlen(LOCO_TOK_EOT), 1, "tokenizer train", "special"),
                    out_destroy_tok);
    LOCO_CHECK_GOTO(loco__tok_finish(t, "tokenizer train"), out_destroy_tok);
    for (int k = 0; k < done; k++)
        LOCO_CHECK_GOTO(loco__tok_add_merge(t, ml[k], mr[k], "tokenizer train", "merge"),
                        out_destroy_tok);
    *out = t;
    return 0;
out_destroy_tok:
    loco_tok_destroy(t);
    return rc;
}

int loco_tok_train(loco_tok **out, const uint8_t *text, size_t len, int vocab_size,
                   const char *pattern) {
    *out = NULL;
    if (vocab_size < 258 || vocab_size > (1 << 24))
        return LOCO_ERR(LOCO_EINVAL,
                        "tokenizer train: vocab %d (expected 258..%d: 256 bytes, "
                        "at least one merge and <|endoftext|>)",
                        vocab_size, 1 << 24);
    const int nmerge = vocab_size - 257;
    int rc, done = 0;
    piece_map pm = {0};
    words wd = {0};
    int32_t *ml = NULL, *mr = NULL;
    LOCO_CHECK(loco__tok_pattern_check(pattern, "tokenizer train"));
    LOCO_CHECK_GOTO(count_pieces(text, len, pattern, &pm), out_free_pieces);
    LOCO_CHECK_GOTO(words_of(&pm, &wd), out_fini_words);
    ml = loco_alloc((size_t)nmerge * sizeof *ml);
    mr = loco_alloc((size_t)nmerge * sizeof *mr);
    if (!ml || !mr) {
        rc = LOCO_ERR(LOCO_ENOMEM, "tokenizer train: out of memory for %zu pieces", wd.n);
        goto out_free_merges;
    }
    LOCO_CHECK_GOTO(learn_merges(&wd, nmerge, ml, mr, &done), out_free_merges);
    if (done < nmerge)
        loco_warn("tokenizer train: the text gives only %d merges; vocabulary of %d ids "
                  "instead of %d",
                  done, 257 + done, vocab_size);
    rc = build_tokenizer(out, ml, mr, done);
    if (rc == 0 && (rc = loco_tok_set_pattern(*out, pattern)) < 0) {
        loco_tok_destroy(*out);
        *out = NULL;
    }
out_free_merges:
    loco_free(ml);
    loco_free(mr);
out_fini_words:
    words_fini(&wd);
out_free_pieces:
    loco_free(pm.slots);
    return rc;
}

/* ------------------------------------------------------------ save */

static cJSON *byte_level(const char *kind, int add_prefix_space, int trim_offsets) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", kind);
    cJSON_AddBoolToObject(o, "add_prefix_space", add_prefix_space);
    cJSON_AddBoolToObject(o, "trim_offsets", trim_offsets);
    cJSON_AddBoolToObject(o, "use_regex", 1);
    return o;
}

int loco_tok_save_hf(const loco_tok *t, const char *path) {
    int rc = 0;
    char *mapped = NULL, *json = NULL;
    size_t maxlen = 0;
    for (int id = 0; id < t->vocab; id++)
        if (t->len[id] != TOK_ABSENT && t->len[id] > maxlen)
            maxlen = t->len[id];
    mapped = loco_alloc(4 * maxlen + 4);
    cJSON *root = cJSON_CreateObject();
    if (!mapped || !root) {
        rc = LOCO_ERR(LOCO_ENOMEM, "%s: out of memory", path);
        goto out;
    }
    cJSON_AddStringToObject(root, "version", "1.0");
    cJSON_AddNullToObject(root, "truncation");
    cJSON_AddNullToObject(root, "padding");
    cJSON *added = cJSON_AddArrayToObject(root, "added_tokens");
    for (int i = 0; i < t->nspecial; i++) {
        int id = t->special[i];
        cJSON *a = cJSON_CreateObject();
        cJSON_AddNumberToObject(a, "id", id);
        char *c = loco_alloc(t->len[id] + 1);
        if (!c) {
            cJSON_Delete(a);
            rc = LOCO_ERR(LOCO_ENOMEM, "%s: out of memory", path);
            goto out;
        }
        memcpy(c, t->pool + t->off[id], t->len[id]);
        cJSON_AddStringToObject(a, "content", c);
        loco_free(c);
        cJSON_AddBoolToObject(a, "single_word", 0);
        cJSON_AddBoolToObject(a, "lstrip", 0);
        cJSON_AddBoolToObject(a, "rstrip", 0);
        cJSON_AddBoolToObject(a, "normalized", 0);
        cJSON_AddBoolToObject(a, "special", 1);
        cJSON_AddItemToArray(added, a);
    }
    cJSON_AddNullToObject(root, "normalizer");
    cJSON_AddItemToObject(root, "pre_tokenizer", loco__tok_hf_pre_tokenizer_json(t));
    cJSON_AddItemToObject(root, "post_processor", byte_level("ByteLevel", 1, 0));
    cJSON_AddItemToObject(root, "decoder", byte_level("ByteLevel", 1, 1));
    cJSON *model = cJSON_AddObjectToObject(root, "model");
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddNullToObject(model, "dropout");
    cJSON_AddNullToObject(model, "unk_token");
    cJSON_AddStringToObject(model, "continuing_subword_prefix", "");
    cJSON_AddStringToObject(model, "end_of_word_suffix", "");
    cJSON_AddBoolToObject(model, "fuse_unk", 0);
    cJSON_AddBoolToObject(model, "byte_fallback", 0);
    if (t->whole_pieces)
        cJSON_AddBoolToObject(model, "ignore_merges", 1);
    cJSON *vocab = cJSON_AddObjectToObject(model, "vocab");
    for (int id = 0; id < t->vocab; id++) {
        if (t->len[id] == TOK_ABSENT)
            continue;
        int special = 0;
        for (int i = 0; i < t->nspecial; i++)
            special |= t->special[i] == id;
        if (special) {
            memcpy(mapped, t->pool + t->off[id], t->len[id]);
            mapped[t->len[id]] = 0;
        } else {
            loco__tok_map(t->pool + t->off[id], t->len[id], mapped);
        }
        cJSON_AddNumberToObject(vocab, mapped, id);
    }
    cJSON *merges = cJSON_AddArrayToObject(model, "merges");
    for (int k = 0; k < t->nmerges; k++) {
        int l = t->merge_l[k], r = t->merge_r[k];
        size_t n = loco__tok_map(t->pool + t->off[l], t->len[l], mapped);
        mapped[n++] = ' ';
        loco__tok_map(t->pool + t->off[r], t->len[r], mapped + n);
        cJSON_AddItemToArray(merges, cJSON_CreateString(mapped));
    }
    json = cJSON_Print(root);
    if (!json) {
        rc = LOCO_ERR(LOCO_ENOMEM, "%s: cannot print JSON", path);
        goto out;
    }
    rc = loco_file_write_sync(path, json, strlen(json));
out:
    cJSON_free(json);
    cJSON_Delete(root);
    loco_free(mapped);
    return rc;
}
