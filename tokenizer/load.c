/* Vocabulary loaders: Hugging Face tokenizer.json, GPT-2's encoder.json +
 * vocab.bpe, tiktoken rank files. Every error names the file, the place in
 * it and what was expected. */
#include "tokenizer/internal.h"

#include <cjson/cJSON.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>

/* Reads path as NUL-terminated text. */
static int read_text(const char *path, char **text, size_t *len) {
    void *data;
    int rc = loco_file_read(path, &data, len);
    if (rc < 0)
        return rc;
    char *s = loco_alloc(*len + 1);
    if (!s) {
        loco_free(data);
        return LOCO_ERR(LOCO_ENOMEM, "%s: out of memory", path);
    }
    memcpy(s, data, *len);
    s[*len] = 0;
    loco_free(data);
    *text = s;
    return 0;
}

static int parse_json(const char *path, cJSON **out) {
    char *text = NULL;
    size_t len;
    LOCO_CHECK(read_text(path, &text, &len));
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!j) {
        const char *e = cJSON_GetErrorPtr();
        size_t at = e && e >= text && e <= text + len ? (size_t)(e - text) : len;
        int line = 1, col = 1;
        for (size_t i = 0; i < at; i++, col++)
            if (text[i] == '\n') {
                line++;
                col = 0;
            }
        loco_free(text);
        return LOCO_ERR(LOCO_EPROTO, "%s: invalid JSON at line %d column %d (byte %zu of %zu)%s",
                        path, line, col, at, len,
                        at + 1 >= len ? ": the document ends early (truncated file?)" : "");
    }
    loco_free(text);
    *out = j;
    return 0;
}

/* Unmaps a byte-level token string; buf has room for strlen(s). */
static int unmap_token(const char *file, const char *where, const char *s, uint8_t *buf,
                       size_t *n) {
    long k = loco__tok_unmap(s, strlen(s), buf);
    if (k <= 0)
        return LOCO_ERR(LOCO_EPROTO,
                        "%s: %s: token \"%.60s\" is not byte-level (expected "
                        "characters of GPT-2's byte-to-unicode mapping)",
                        file, where, s);
    *n = (size_t)k;
    return 0;
}

/* Looks up a byte-level token string of a merge. */
static int merge_side(const loco_tok *t, const char *file, const char *where, const char *s,
                      int *id) {
    size_t sl = strlen(s), n = 0;
    uint8_t *buf = loco_alloc(sl + 1);
    if (!buf)
        return LOCO_ERR(LOCO_ENOMEM, "%s: out of memory", file);
    int rc = unmap_token(file, where, s, buf, &n);
    if (rc == 0) {
        *id = loco__tok_lookup(t, buf, n);
        if (*id < 0)
            rc = LOCO_ERR(LOCO_EPROTO,
                          "%s: %s: merge of unknown token \"%.60s\" (not in the "
                          "vocabulary)",
                          file, where, s);
    }
    loco_free(buf);
    return rc;
}

/* One merge given as "a b" or ["a", "b"]. */
static int add_merge_item(loco_tok *t, const char *file, const char *where, const cJSON *m) {
    char *a = NULL, *b = NULL, *dup = NULL;
    if (cJSON_IsString(m)) {
        dup = loco_alloc(strlen(m->valuestring) + 1);
        if (!dup)
            return LOCO_ERR(LOCO_ENOMEM, "%s: out of memory", file);
        strcpy(dup, m->valuestring);
        char *sp = strchr(dup, ' ');
        if (sp && sp != dup && sp[1] && !strchr(sp + 1, ' ')) {
            *sp = 0;
            a = dup;
            b = sp + 1;
        }
    } else if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 &&
               cJSON_IsString(cJSON_GetArrayItem(m, 0)) &&
               cJSON_IsString(cJSON_GetArrayItem(m, 1))) {
        a = cJSON_GetArrayItem(m, 0)->valuestring;
        b = cJSON_GetArrayItem(m, 1)->valuestring;
    }
    int rc = 0, l, r;
    if (!a)
        rc = LOCO_ERR(LOCO_EPROTO, "%s: %s: expected \"LEFT RIGHT\" or [\"LEFT\", \"RIGHT\"]", file,
                      where);
    if (rc == 0)
        rc = merge_side(t, file, where, a, &l);
    if (rc == 0)
        rc = merge_side(t, file, where, b, &r);
    if (rc == 0)
        rc = loco__tok_add_merge(t, l, r, file, where);
    loco_free(dup);
    return rc;
}

static int json_id(const char *file, const char *where, const cJSON *v, int *id) {
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble >= (1 << 24) ||
        v->valuedouble != (double)(int)v->valuedouble)
        return LOCO_ERR(LOCO_EPROTO, "%s: %s: expected an integer id in 0..%d", file, where,
                        (1 << 24) - 1);
    *id = (int)v->valuedouble;
    return 0;
}

/* Sets the byte-level vocabulary of a JSON object {token: id}, skipping ids
 * listed in skip (the specials). */
static int set_vocab(loco_tok *t, const char *file, const char *what, const cJSON *vocab,
                     const int *skip, int nskip) {
    char where[160];
    const cJSON *e;
    uint8_t *buf = NULL;
    size_t bufcap = 0;
    int rc = 0;
    cJSON_ArrayForEach(e, vocab) {
        int id = 0;
        snprintf(where, sizeof where, "%s[\"%.60s\"]", what, e->string);
        LOCO_CHECK_GOTO(json_id(file, where, e, &id), out);
        int skipped = 0;
        for (int i = 0; i < nskip; i++)
            skipped |= skip[i] == id;
        if (skipped)
            continue;
        size_t sl = strlen(e->string), n = 0;
        if (sl + 1 > bufcap) {
            loco_free(buf);
            bufcap = 2 * sl + 64;
            if (!(buf = loco_alloc(bufcap))) {
                rc = LOCO_ERR(LOCO_ENOMEM, "%s: out of memory", file);
                goto out;
            }
        }
        LOCO_CHECK_GOTO(unmap_token(file, where, e->string, buf, &n), out);
        LOCO_CHECK_GOTO(loco__tok_set(t, id, buf, n, 0, file, where), out);
    }
out:
    loco_free(buf);
    return rc;
}

int loco_tok_load_hf(loco_tok **out, const char *path) {
    *out = NULL;
    cJSON *j;
    LOCO_CHECK(parse_json(path, &j));
    int rc = 0;
    loco_tok *t = NULL;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(j, "model");
    if (!cJSON_IsObject(model)) {
        rc = LOCO_ERR(LOCO_EPROTO,
                      "%s: no \"model\" object (expected a Hugging Face "
                      "tokenizer.json)",
                      path);
        goto out;
    }
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(model, "type");
    if (type && !(cJSON_IsString(type) && !strcmp(type->valuestring, "BPE"))) {
        rc = LOCO_ERR(LOCO_EPROTO, "%s: model.type is %s%s%s; expected \"BPE\" (byte-level BPE)",
                      path, cJSON_IsString(type) ? "\"" : "",
                      cJSON_IsString(type) ? type->valuestring : "not a string",
                      cJSON_IsString(type) ? "\"" : "");
        goto out;
    }
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(j, "added_tokens");
    if (!cJSON_IsObject(vocab) || !cJSON_IsArray(merges)) {
        rc = LOCO_ERR(LOCO_EPROTO,
                      "%s: model.vocab (object) and model.merges (array) are "
                      "required",
                      path);
        goto out;
    }
    if (added && !cJSON_IsArray(added) && !cJSON_IsNull(added)) {
        rc = LOCO_ERR(LOCO_EPROTO, "%s: added_tokens: expected an array", path);
        goto out;
    }
    const char *regex;
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(j, "pre_tokenizer");
    LOCO_CHECK_GOTO(loco__tok_hf_pre_tokenizer(path, pre, &regex), out);
    const cJSON *ignore = cJSON_GetObjectItemCaseSensitive(model, "ignore_merges");
    int maxid = -1, sid[TOK_MAX_SPECIAL], ns = 0;
    char where[160];
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab) {
        int id = 0;
        snprintf(where, sizeof where, "model.vocab[\"%.60s\"]", e->string);
        LOCO_CHECK_GOTO(json_id(path, where, e, &id), out);
        maxid = id > maxid ? id : maxid;
    }
    int ai = 0;
    cJSON_ArrayForEach(e, added) {
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(e, "content");
        snprintf(where, sizeof where, "added_tokens[%d]", ai++);
        if (!cJSON_IsString(content) || !content->valuestring[0]) {
            rc = LOCO_ERR(LOCO_EPROTO, "%s: %s: expected a non-empty \"content\" string", path,
                          where);
            goto out;
        }
        if (ns == TOK_MAX_SPECIAL) {
            rc = LOCO_ERR(LOCO_EPROTO, "%s: %s: more than %d added tokens", path, where,
                          TOK_MAX_SPECIAL);
            goto out;
        }
        LOCO_CHECK_GOTO(json_id(path, where, cJSON_GetObjectItemCaseSensitive(e, "id"), &sid[ns]),
                        out);
        maxid = sid[ns] > maxid ? sid[ns] : maxid;
        ns++;
    }
    LOCO_CHECK_GOTO(loco__tok_new(&t, maxid + 1, path), out);
    ai = 0;
    cJSON_ArrayForEach(e, added) {
        const char *c = cJSON_GetObjectItemCaseSensitive(e, "content")->valuestring;
        snprintf(where, sizeof where, "added_tokens[%d]", ai);
        LOCO_CHECK_GOTO(loco__tok_set(t, sid[ai++], (const uint8_t *)c, strlen(c), 1, path, where),
                        out);
    }
    LOCO_CHECK_GOTO(set_vocab(t, path, "model.vocab", vocab, sid, ns), out);
    LOCO_CHECK_GOTO(loco__tok_use_regex(t, regex, path), out);
    t->whole_pieces = cJSON_IsTrue(ignore);
    LOCO_CHECK_GOTO(loco__tok_finish(t, path), out);
    int mi = 0;
    cJSON_ArrayForEach(e, merges) {
        snprintf(where, sizeof where, "model.merges[%d]", mi++);
        LOCO_CHECK_GOTO(add_merge_item(t, path, where, e), out);
    }
out:
    cJSON_Delete(j);
    if (rc < 0)
        loco_tok_destroy(t);
    else
        *out = t;
    return rc;
}

int loco_tok_load_gpt2(loco_tok **out, const char *encoder_json, const char *vocab_bpe) {
    *out = NULL;
    cJSON *j;
    LOCO_CHECK(parse_json(encoder_json, &j));
    int rc = 0;
    loco_tok *t = NULL;
    char *text = NULL;
    if (!cJSON_IsObject(j)) {
        rc = LOCO_ERR(LOCO_EPROTO, "%s: expected a JSON object {token: id} (GPT-2 encoder.json)",
                      encoder_json);
        goto out;
    }
    int maxid = -1, eot = -1;
    char where[160];
    const cJSON *e;
    cJSON_ArrayForEach(e, j) {
        int id = 0;
        snprintf(where, sizeof where, "[\"%.60s\"]", e->string);
        LOCO_CHECK_GOTO(json_id(encoder_json, where, e, &id), out);
        maxid = id > maxid ? id : maxid;
        if (!strcmp(e->string, LOCO_TOK_EOT))
            eot = id;
    }
    LOCO_CHECK_GOTO(loco__tok_new(&t, maxid + 1, encoder_json), out);
    if (eot >= 0)
        LOCO_CHECK_GOTO(loco__tok_set(t, eot, (const uint8_t *)LOCO_TOK_EOT, strlen(LOCO_TOK_EOT),
                                      1, encoder_json, "[\"" LOCO_TOK_EOT "\"]"),
                        out);
    LOCO_CHECK_GOTO(set_vocab(t, encoder_json, "", j, &eot, eot >= 0), out);
    LOCO_CHECK_GOTO(loco__tok_finish(t, encoder_json), out);
    size_t len;
    LOCO_CHECK_GOTO(read_text(vocab_bpe, &text, &len), out);
    char *line = text;
    for (int ln = 1; line && *line; ln++) {
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = 0;
        size_t ll = strlen(line);
        if (ll && line[ll - 1] == '\r')
            line[--ll] = 0;
        if (ll && !(ln == 1 && !strncmp(line, "#version", 8))) {
            snprintf(where, sizeof where, "line %d", ln);
            cJSON *m = cJSON_CreateString(line);
            if (!m) {
                rc = LOCO_ERR(LOCO_ENOMEM, "%s: out of memory", vocab_bpe);
                goto out;
            }
            rc = add_merge_item(t, vocab_bpe, where, m);
            cJSON_Delete(m);
            if (rc < 0)
                goto out;
        }
        line = nl ? nl + 1 : NULL;
    }
out:
    loco_free(text);
    cJSON_Delete(j);
    if (rc < 0)
        loco_tok_destroy(t);
    else
        *out = t;
    return rc;
}

typedef struct {
    int rank, line;
    uint32_t off, len; /* decoded bytes in the scratch pool */
} tt_entry;

static int tt_cmp(const void *a, const void *b) {
    const tt_entry *x = a, *y = b;
    return (x->rank > y->rank) - (x->rank < y->rank);
}

/* The special tokens of a tiktoken file: those of the pattern's encoding
 * (OpenAI's, Llama 3's) when the file holds exactly that encoding's number
 * of ranks (0..nranks-1), else <|endoftext|> after the largest rank. */
static int tt_specials(loco_tok **t, const char *path, const tok_pattern *p, size_t n,
                       int maxrank) {
    const int nnamed = (int)(sizeof p->special / sizeof p->special[0]);
    int known = p && p->nranks && n == (size_t)p->nranks && maxrank == p->nranks - 1;
    int vocab = maxrank + 2;
    if (known && p->special_end > vocab)
        vocab = p->special_end;
    for (int i = 0; known && i < nnamed && p->special[i].text; i++)
        vocab = p->special[i].id + 1 > vocab ? p->special[i].id + 1 : vocab;
    LOCO_CHECK(loco__tok_new(t, vocab, path));
    if (!known)
        return loco__tok_set(*t, maxrank + 1, (const uint8_t *)LOCO_TOK_EOT, strlen(LOCO_TOK_EOT),
                             1, path, "end");
    for (int i = 0; i < nnamed && p->special[i].text; i++)
        LOCO_CHECK(loco__tok_set(*t, p->special[i].id, (const uint8_t *)p->special[i].text,
                                 strlen(p->special[i].text), 1, path, p->name));
    char text[64];
    for (int id = p->nranks, k = 0; id < p->special_end; id++) {
        if ((*t)->len[id] != TOK_ABSENT) /* named */
            continue;
        int len = snprintf(text, sizeof text, "<|reserved_special_token_%d|>", k++);
        LOCO_CHECK(loco__tok_set(*t, id, (const uint8_t *)text, (size_t)len, 1, path, p->name));
    }
    return 0;
}

static int load_tiktoken(loco_tok **out, const char *path, const char *pattern) {
    *out = NULL;
    LOCO_CHECK(loco__tok_pattern_check(pattern, path));
    const tok_pattern *pat = loco__tok_pattern(pattern);
    char *text = NULL;
    size_t len;
    LOCO_CHECK(read_text(path, &text, &len));
    int rc = 0;
    loco_tok *t = NULL;
    tok_work *w = NULL;
    size_t cap = 16, n = 0;
    for (size_t i = 0; i < len; i++)
        cap += text[i] == '\n';
    tt_entry *ent = loco_alloc(cap * sizeof *ent);
    uint8_t *pool = loco_alloc(len + 4);
    int32_t *parts = loco_alloc((len + 4) * sizeof *parts);
    if (!ent || !pool || !parts) {
        rc = LOCO_ERR(LOCO_ENOMEM, "%s: out of memory", path);
        goto out;
    }
    size_t plen = 0;
    int maxrank = -1;
    char *line = text;
    for (int ln = 1; line && *line; ln++) {
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = 0;
        size_t ll = strlen(line);
        if (ll && line[ll - 1] == '\r')
            line[--ll] = 0;
        if (ll) {
            char *sp = strchr(line, ' ');
            char *end = NULL;
            long rank = sp ? strtol(sp + 1, &end, 10) : -1;
            if (!sp || sp == line || !end || end == sp + 1 || *end || rank < 0 ||
                rank >= (1 << 24) - 1) {
                rc = LOCO_ERR(LOCO_EPROTO,
                              "%s: line %d: expected \"BASE64 RANK\" with a rank in "
                              "0..%d",
                              path, ln, (1 << 24) - 2);
                goto out;
            }
            size_t bl = (size_t)(sp - line);
            for (size_t i = 0; i < bl; i++) {
                char c = line[i];
                if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                      c == '+' || c == '/' || c == '=')) {
                    rc = LOCO_ERR(LOCO_EPROTO,
                                  "%s: line %d: bad base64 character '%c' at "
                                  "column %zu",
                                  path, ln, c, i + 1);
                    goto out;
                }
            }
            int dl =
                bl % 4 ? -1 : EVP_DecodeBlock(pool + plen, (const unsigned char *)line, (int)bl);
            if (dl < 0) {
                rc = LOCO_ERR(LOCO_EPROTO,
                              "%s: line %d: bad base64 \"%.*s\" (expected a "
                              "multiple of 4 characters of standard base64)",
                              path, ln, (int)(bl < 60 ? bl : 60), line);
                goto out;
            }
            int pad = (bl >= 1 && line[bl - 1] == '=') + (bl >= 2 && line[bl - 2] == '=');
            dl -= pad;
            if (dl <= 0) {
                rc = LOCO_ERR(LOCO_EPROTO, "%s: line %d: empty token", path, ln);
                goto out;
            }
            ent[n++] = (tt_entry){
                .rank = (int)rank, .line = ln, .off = (uint32_t)plen, .len = (uint32_t)dl};
            plen += (size_t)dl;
            maxrank = rank > maxrank ? (int)rank : maxrank;
        }
        line = nl ? nl + 1 : NULL;
    }
    if (n == 0) {
        rc = LOCO_ERR(LOCO_EPROTO, "%s: no \"BASE64 RANK\" lines (expected a tiktoken file)", path);
        goto out;
    }
    qsort(ent, n, sizeof *ent, tt_cmp);
    LOCO_CHECK_GOTO(tt_specials(&t, path, pat, n, maxrank), out);
    char where[64];
    for (size_t i = 0; i < n; i++) {
        snprintf(where, sizeof where, "line %d", ent[i].line);
        LOCO_CHECK_GOTO(
            loco__tok_set(t, ent[i].rank, pool + ent[i].off, ent[i].len, 0, path, where), out);
    }
    if (pat)
        LOCO_CHECK_GOTO(loco__tok_use_regex(t, pat->regex, path), out);
    LOCO_CHECK_GOTO(loco__tok_finish(t, path), out);
    /* merges: each multi-byte token is the BPE, under the merges of lower
     * ranks, of exactly two tokens */
    LOCO_CHECK_GOTO(loco__tok_work_create(&w), out);
    for (size_t i = 0; i < n; i++) {
        if (ent[i].len < 2)
            continue;
        long k = loco__tok_bpe_raw(t, w, pool + ent[i].off, ent[i].len, parts);
        if (k < 0) {
            rc = (int)k;
            goto out;
        }
        snprintf(where, sizeof where, "line %d", ent[i].line);
        if (k != 2) {
            rc = LOCO_ERR(LOCO_EPROTO,
                          "%s: %s: token of rank %d is not the merge of two "
                          "lower-rank tokens (BPE of its bytes gives %ld)",
                          path, where, ent[i].rank, k);
            goto out;
        }
        LOCO_CHECK_GOTO(loco__tok_add_merge(t, parts[0], parts[1], path, where), out);
    }
out:
    loco__tok_work_destroy(w);
    loco_free(text);
    loco_free(ent);
    loco_free(pool);
    loco_free(parts);
    if (rc < 0)
        loco_tok_destroy(t);
    else
        *out = t;
    return rc;
}

int loco_tok_load_tiktoken(loco_tok **out, const char *path) {
    return load_tiktoken(out, path, NULL);
}

int loco_tok_load(loco_tok **out, const char *spec) {
    return loco_tok_load_pattern(out, spec, NULL);
}

int loco_tok_load_pattern(loco_tok **out, const char *spec, const char *pattern) {
    *out = NULL;
    LOCO_CHECK(loco__tok_pattern_check(pattern, spec));
    const char *comma = strchr(spec, ',');
    int rc;
    if (comma) {
        char enc[4096];
        size_t el = (size_t)(comma - spec);
        if (el >= sizeof enc)
            return LOCO_ERR(LOCO_EINVAL, "tokenizer %s: path too long", spec);
        memcpy(enc, spec, el);
        enc[el] = 0;
        rc = loco_tok_load_gpt2(out, enc, comma + 1);
    } else {
        char *text = NULL;
        size_t len;
        LOCO_CHECK(read_text(spec, &text, &len));
        size_t i = 0;
        while (i < len && (text[i] == ' ' || text[i] == '\n' || text[i] == '\r' || text[i] == '\t'))
            i++;
        int json = i < len && text[i] == '{';
        loco_free(text);
        if (!json) /* the pattern also decides the special tokens */
            return load_tiktoken(out, spec, pattern);
        rc = loco_tok_load_hf(out, spec);
    }
    if (rc == 0 && (rc = loco_tok_set_pattern(*out, pattern)) < 0) {
        loco_tok_destroy(*out);
        *out = NULL;
    }
    return rc;
}
