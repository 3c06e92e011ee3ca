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

int loco_tok_train(loco_tok **out, const uint8_t *text, size_t len, int vocab_size) {
    *out = NULL;
    if (vocab_size < 258 || vocab_size > (1 << 24))
        return LOCO_ERR(LOCO_EINVAL,
                        "tokenizer train: vocab %d (expected 258..%d: 256 bytes, "
                        "at least one merge and <|endoftext|>)",
                        vocab_size, 1 << 24);
    int rc = 0;
    loco_tok *t = NULL, *eot_only = NULL;
    piece_map pm = {0};
    int32_t *syms = NULL, *wlen = NULL, *ml = NULL, *mr = NULL;
    size_t *woff = NULL;
    int64_t *wcount = NULL;
    pair_slot *pairs = NULL;
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    /* a tokenizer with only the special token, to split the text */
    LOCO_CHECK_GOTO(loco__tok_new(&eot_only, 257, "tokenizer train"), out);
    for (int b = 0; b < 256; b++) {
        uint8_t c = (uint8_t)b;
        LOCO_CHECK_GOTO(loco__tok_set(eot_only, b, &c, 1, 0, "tokenizer train", "bytes"), out);
    }
    LOCO_CHECK_GOTO(loco__tok_set(eot_only, 256, (const uint8_t *)LOCO_TOK_EOT,
                                  strlen(LOCO_TOK_EOT), 1, "tokenizer train", "special"),
                    out);
    LOCO_CHECK_GOTO(loco__tok_finish(eot_only, "tokenizer train"), out);
    if (!md) {
        rc = LOCO_ERR(LOCO_ENOMEM, "tokenizer train: out of memory");
        goto out;
    }
    LOCO_CHECK_GOTO(loco__tok_pieces(eot_only, md, text, len, count_piece, &pm), out);

    /* words: the distinct pieces as symbol sequences, in a fixed order */
    size_t nw = pm.n, nsym = 0;
    for (size_t i = 0; i < pm.cap; i++)
        nsym += pm.slots[i].h ? pm.slots[i].n : 0;
    int nmerge = vocab_size - 257;
    syms = loco_alloc((nsym + 1) * sizeof *syms);
    woff = loco_alloc((nw + 1) * sizeof *woff);
    wlen = loco_alloc((nw + 1) * sizeof *wlen);
    wcount = loco_alloc((nw + 1) * sizeof *wcount);
    ml = loco_alloc((size_t)nmerge * sizeof *ml);
    mr = loco_alloc((size_t)nmerge * sizeof *mr);
    size_t pcap = 1024;
    while (pcap < 2 * nsym + 2)
        pcap <<= 1;
    pairs = loco_alloc(pcap * sizeof *pairs);
    if (!syms || !woff || !wlen || !wcount || !ml || !mr || !pairs) {
        rc = LOCO_ERR(LOCO_ENOMEM, "tokenizer train: out of memory for %zu pieces", nw);
        goto out;
    }
    size_t w = 0, s = 0;
    for (size_t i = 0; i < pm.cap; i++) {
        const piece_slot *ps = &pm.slots[i];
        if (!ps->h)
            continue;
        woff[w] = s;
        wlen[w] = (int32_t)ps->n;
        wcount[w] = ps->count;
        for (uint32_t k = 0; k < ps->n; k++)
            syms[s++] = ps->p[k];
        w++;
    }
    /* the order of the hash table depends only on the text; merges below
     * depend only on the counts (ties by ids) */
    int done = 0;
    for (; done < nmerge; done++) {
        memset(pairs, 0, pcap * sizeof *pairs);
        for (size_t k = 0; k < nw; k++) {
            const int32_t *q = syms + woff[k];
            for (int32_t i = 0; i + 1 < wlen[k]; i++) {
                uint64_t key = ((uint64_t)(uint32_t)(q[i] + 1) << 32) | (uint32_t)(q[i + 1] + 1);
                size_t j = pair_hash(key) & (pcap - 1);
                while (pairs[j].key && pairs[j].key != key)
                    j = (j + 1) & (pcap - 1);
                pairs[j].key = key;
                pairs[j].count += wcount[k];
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
        if (!best)
            break; /* every piece is a single token */
        int32_t l = (int32_t)(best >> 32) - 1, r = (int32_t)(best & 0xffffffffu) - 1;
        int32_t id = 256 + done;
        ml[done] = l;
        mr[done] = r;
        for (size_t k = 0; k < nw; k++) {
            int32_t *q = syms + woff[k], m = 0;
            for (int32_t i = 0; i < wlen[k]; i++) {
                if (i + 1 < wlen[k] && q[i] == l && q[i + 1] == r) {
                    q[m++] = id;
                    i++;
                } else {
                    q[m++] = q[i];
                }
            }
            wlen[k] = m;
        }
    }
    if (done < nmerge)
        loco_warn("tokenizer train: the text gives only %d merges; vocabulary of %d ids "
                  "instead of %d",
                  done, 257 + done, vocab_size);
    /* the tokenizer: bytes, merges, <|endoftext|> last */
    LOCO_CHECK_GOTO(loco__tok_new(&t, 257 + done, "tokenizer train"), out);
    for (int b = 0; b < 256; b++) {
        uint8_t c = (uint8_t)b;
        LOCO_CHECK_GOTO(loco__tok_set(t, b, &c, 1, 0, "tokenizer train", "bytes"), out);
    }
    uint8_t *cat = NULL;
    for (int k = 0; k < done && rc == 0; k++) {
        size_t ll = t->len[ml[k]], rl = t->len[mr[k]];
        cat = loco_alloc(ll + rl);
        if (!cat) {
            rc = LOCO_ERR(LOCO_ENOMEM, "tokenizer train: out of memory");
            break;
        }
        memcpy(cat, t->pool + t->off[ml[k]], ll);
        memcpy(cat + ll, t->pool + t->off[mr[k]], rl);
        rc = loco__tok_set(t, 256 + k, cat, ll + rl, 0, "tokenizer train", "merge");
        loco_free(cat);
    }
    if (rc < 0)
        goto out;
    LOCO_CHECK_GOTO(loco__tok_set(t, 256 + done, (const uint8_t *)LOCO_TOK_EOT,
                                  strlen(LOCO_TOK_EOT), 1, "tokenizer train", "special"),
                    out);
    LOCO_CHECK_GOTO(loco__tok_finish(t, "tokenizer train"), out);
    for (int k = 0; k < done; k++)
        LOCO_CHECK_GOTO(loco__tok_add_merge(t, ml[k], mr[k], "tokenizer train", "merge"), out);
out:
    if (md)
        pcre2_match_data_free(md);
    loco_tok_destroy(eot_only);
    loco_free(pm.slots);
    loco_free(syms);
    loco_free(woff);
    loco_free(wlen);
    loco_free(wcount);
    loco_free(ml);
    loco_free(mr);
    loco_free(pairs);
    if (rc < 0)
        loco_tok_destroy(t);
    else
        *out = t;
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
    cJSON_AddItemToObject(root, "pre_tokenizer", byte_level("ByteLevel", 0, 1));
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
