/* libFuzzer target: the tokenizer loaders on arbitrary bytes as a file. The
 * first byte picks the format: a Hugging Face tokenizer.json or a tiktoken
 * file ("BASE64 RANK" lines). Whatever the bytes: 0, LOCO_EPROTO or
 * LOCO_EINVAL, nothing read out of bounds (ASan), nothing leaked. A
 * tokenizer that loads holds what the loaders promise: it decodes what it
 * encodes back to the same bytes (every vocabulary holds the 256 bytes),
 * and written as tokenizer.json (loco_tok_save_hf) it loads back with the
 * same vocabulary, merges and ids. Seeds: fuzz/corpus/tokenizer, written
 * by gen_corpus (hf-split-regex by hand: a Split pre-tokenizer with
 * cl100k's regex, which the loader takes as the file's own pattern). */
#include <stdlib.h>
#include <string.h>

#include "fuzz/fuzz.h"
#include "tokenizer/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char sample[] =
    "Hello, world! It's 2024:\n  tabs\tand <|endoftext|> caf\xc3\xa9 \xff\xfe";

/* The ids of sample; aborts unless they decode back to it. NULL when a
 * tokenizer.json's own regex fails to match (PCRE2's match limit on a
 * pathological pattern): a clear LOCO_EINVAL, which is allowed; the named
 * patterns never fail. */
static int32_t *encode_checked(const loco_tok *t, size_t *n) {
    int32_t *ids;
    const int rc = loco_tok_encode(t, (const uint8_t *)sample, sizeof sample - 1, &ids, n);
    if (rc == LOCO_EINVAL && !strcmp(loco_tok_pattern_name(t), "custom"))
        return NULL;
    if (rc != 0)
        abort();
    uint8_t *back;
    size_t len;
    if (loco_tok_decode(t, ids, *n, &back, &len) != 0 || len != sizeof sample - 1 ||
        memcmp(back, sample, len))
        abort(); /* lossy */
    loco_free(back);
    return ids;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1)
        return 0;
    const bool tiktoken = data[0] & 1;
    char path[128];
    fuzz_write(NULL, tiktoken ? "tok.tiktoken" : "tokenizer.json", data + 1, size - 1, path,
               sizeof path);
    loco_tok *t = NULL;
    const int rc = tiktoken ? loco_tok_load_tiktoken(&t, path) : loco_tok_load_hf(&t, path);
    if (rc != 0 && rc != LOCO_EPROTO && rc != LOCO_EINVAL)
        abort();
    if (rc == 0) {
        size_t n, n2;
        int32_t *ids = encode_checked(t, &n);
        if (!ids) {
            loco_tok_destroy(t);
            loco_err_clear();
            return 0;
        }
        fuzz_write(NULL, "saved.json", "", 0, path, sizeof path);
        loco_tok *back = NULL;
        if (loco_tok_save_hf(t, path) != 0 || loco_tok_load_hf(&back, path) != 0) {
            fprintf(stderr, "fuzz_tokenizer: saved, it does not load: %s\n", loco_errmsg());
            abort();
        }
        if (loco_tok_vocab_size(back) != loco_tok_vocab_size(t) ||
            loco_tok_num_merges(back) != loco_tok_num_merges(t))
            abort();
        int32_t *ids2 = encode_checked(back, &n2);
        if (!ids2 || n != n2 || memcmp(ids, ids2, n * sizeof *ids))
            abort(); /* the saved tokenizer encodes otherwise */
        loco_free(ids);
        loco_free(ids2);
        loco_tok_destroy(back);
        loco_tok_destroy(t);
    }
    loco_err_clear();
    return 0;
}
