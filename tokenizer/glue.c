/* What the front ends need around a tokenizer: ids as text, documents with
 * their separator (<|endoftext|>, Llama 3's <|end_of_text|>), the text bytes
 * each id stands for, and the optional tokenizer.json beside a checkpoint. */
#include "tokenizer/tokenizer.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int loco_tok_parse_ids(const char *text, size_t len, const char *what, int32_t **ids, size_t *n) {
    *ids = NULL;
    *n = 0;
    int32_t *out = loco_alloc((len / 2 + 1) * sizeof *out);
    if (!out)
        return LOCO_ERR(LOCO_ENOMEM, "%s: %zu bytes of ids: out of memory", what, len);
    /* A copy with a NUL after it: strtol must not run past len. */
    char *p = loco_alloc(len + 1);
    if (!p) {
        loco_free(out);
        return LOCO_ERR(LOCO_ENOMEM, "%s: %zu bytes of ids: out of memory", what, len);
    }
    memcpy(p, text, len);
    p[len] = '\0';
    size_t k = 0;
    int rc = 0;
    for (size_t i = 0; i < len;) {
        while (i < len && (p[i] == ' ' || p[i] == '\n' || p[i] == '\t' || p[i] == '\r'))
            i++;
        if (i == len)
            break;
        char *end;
        long v = strtol(p + i, &end, 10);
        if (end == p + i || v < 0 || v > INT32_MAX) {
            rc = LOCO_ERR(LOCO_EINVAL, "%s: byte %zu: expected a token id", what, i);
            break;
        }
        out[k++] = (int32_t)v;
        i = (size_t)(end - p);
    }
    loco_free(p);
    if (rc < 0) {
        loco_free(out);
        return rc;
    }
    *ids = out;
    *n = k;
    return 0;
}

int loco_tok_encode_document(const loco_tok *t, const char *what, const uint8_t *text, size_t len,
                             size_t chunk_bytes, int nthreads, loco_tok_progress_fn progress,
                             void *arg, int32_t **ids, size_t *n) {
    *ids = NULL;
    *n = 0;
    const int eot = loco_tok_eot_id(t);
    if (eot < 0)
        return LOCO_ERR(LOCO_EINVAL,
                        "tokenizer %s has no %s (or %s) special token (needed between "
                        "documents)",
                        what, LOCO_TOK_EOT, LOCO_TOK_LLAMA3_EOT);
    int32_t *body = NULL, *all = NULL;
    size_t nb = 0;
    LOCO_CHECK(
        loco_tok_encode_parallel(t, text, len, chunk_bytes, nthreads, progress, arg, &body, &nb));
    if (!(all = loco_alloc((nb + 1) * sizeof *all))) {
        loco_free(body);
        return LOCO_ERR(LOCO_ENOMEM, "%s: %zu ids: out of memory", what, nb + 1);
    }
    all[0] = eot;
    memcpy(all + 1, body, nb * sizeof *body);
    loco_free(body);
    *ids = all;
    *n = nb + 1;
    return 0;
}

int loco_tok_text_bytes(const loco_tok *t, int n, uint32_t *lens) {
    if (n < 0)
        return LOCO_ERR(LOCO_EINVAL, "text bytes of %d ids, expected n >= 0", n);
    const int eot = loco_tok_eot_id(t);
    for (int id = 0; id < n; id++) {
        size_t len = 0;
        if (id != eot)
            loco_tok_token_bytes(t, id, &len);
        lens[id] = (uint32_t)len;
    }
    return 0;
}

int loco_tok_load_optional(loco_tok **out, const char *path, int max_vocab) {
    *out = NULL;
    if (access(path, F_OK) != 0)
        return 0;
    LOCO_CHECK(loco_tok_load_hf(out, path));
    const int v = loco_tok_vocab_size(*out);
    if (v > max_vocab) {
        loco_tok_destroy(*out);
        *out = NULL;
        return LOCO_ERR(LOCO_EINVAL, "%s: %d ids, more than the model's vocab_size %d", path, v,
                        max_vocab);
    }
    return 0;
}
