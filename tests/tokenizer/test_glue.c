/* tokenizer/glue.c: ids parsed from text, a document with its
 * <|endoftext|> against loco_tok_encode, the text bytes of each id against
 * decoding it alone, and the optional tokenizer.json beside a checkpoint. */
#include "tests/support.h"
#include "tokenizer/tokenizer.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FIX "tests/fixtures/"

static loco_tok *load_ok(const char *spec) {
    loco_tok *t = NULL;
    cr_assert_eq(loco_tok_load(&t, spec), 0, "load %s: %s", spec, loco_errmsg());
    return t;
}

TestSuite(tok_glue, .timeout = 60);

Test(tok_glue, parse_ids_values_and_separators) {
    const char *s = " 1 2\n 3\t40\r\n2147483647\n";
    int32_t *ids;
    size_t n;
    cr_assert_eq(loco_tok_parse_ids(s, strlen(s), "x", &ids, &n), 0, "%s", loco_errmsg());
    const int32_t want[] = {1, 2, 3, 40, 2147483647};
    cr_assert_eq(n, 5);
    cr_expect_arr_eq(ids, want, sizeof want);
    loco_free(ids);
    /* Only len bytes count: "12 34" cut at 4 is 12 and 3. */
    cr_assert_eq(loco_tok_parse_ids("12 34", 4, "x", &ids, &n), 0);
    cr_assert_eq(n, 2);
    cr_expect_eq(ids[0], 12);
    cr_expect_eq(ids[1], 3);
    loco_free(ids);
    cr_assert_eq(loco_tok_parse_ids("  \n", 3, "x", &ids, &n), 0);
    cr_expect_eq(n, 0);
    loco_free(ids);
}

Test(tok_glue, parse_ids_refuses_what_is_not_an_id) {
    const char *bad[] = {"1 x 2", "1 -1", "3 2147483648", "7,8"};
    const char *where[] = {"byte 2", "byte 2", "byte 2", "byte 1"};
    for (int i = 0; i < 4; i++) {
        int32_t *ids = (int32_t *)1;
        size_t n = 9;
        cr_expect_eq(loco_tok_parse_ids(bad[i], strlen(bad[i]), "in.txt", &ids, &n), LOCO_EINVAL,
                     "%s", bad[i]);
        cr_expect(strstr(loco_errmsg(), "in.txt: ") && strstr(loco_errmsg(), where[i]) &&
                      strstr(loco_errmsg(), "expected a token id"),
                  "%s: %s", bad[i], loco_errmsg());
        cr_expect_null(ids);
        cr_expect_eq(n, 0);
    }
}

Test(tok_glue, encode_document_is_eot_then_the_text) {
    loco_tok *t = load_ok(FIX "bpe-1k.json");
    void *text;
    size_t len;
    cr_assert_eq(loco_file_read(FIX "bpe-text.txt", &text, &len), 0);
    int32_t *ids, *doc;
    size_t n, nd;
    cr_assert_eq(loco_tok_encode(t, text, len, &ids, &n), 0);
    cr_assert_eq(loco_tok_encode_document(t, "bpe-1k", text, len, 4096, 2, NULL, NULL, &doc, &nd),
                 0, "%s", loco_errmsg());
    cr_assert_eq(nd, n + 1);
    cr_expect_eq(doc[0], loco_tok_special_id(t, LOCO_TOK_EOT));
    cr_expect_geq(doc[0], 0);
    cr_expect_arr_eq(doc + 1, ids, n * sizeof *ids);
    loco_free(ids);
    loco_free(doc);
    loco_free(text);
    loco_tok_destroy(t);
}

Test(tok_glue, encode_document_needs_endoftext) {
    char out[4096];
    cr_assert_eq(test_run(out, sizeof out,
                          "python3 -c \"import json; d = json.load(open('" FIX
                          "tiny-tokenizer.json')); d['added_tokens'] = []; "
                          "d['model']['vocab'].pop('<|endoftext|>', None); "
                          "json.dump(d, open('/tmp/loco-glue-noeot.json', 'w'))\""),
                 0, "%s", out);
    loco_tok *t = load_ok("/tmp/loco-glue-noeot.json");
    remove("/tmp/loco-glue-noeot.json");
    cr_assert_lt(loco_tok_special_id(t, LOCO_TOK_EOT), 0);
    int32_t *doc = (int32_t *)1;
    size_t nd = 3;
    cr_expect_eq(loco_tok_encode_document(t, "noeot.json", (const uint8_t *)"ab", 2, 4096, 1, NULL,
                                          NULL, &doc, &nd),
                 LOCO_EINVAL);
    cr_expect(strstr(loco_errmsg(), "tokenizer noeot.json has no <|endoftext|>"), "%s",
              loco_errmsg());
    cr_expect_null(doc);
    cr_expect_eq(nd, 0);
    loco_tok_destroy(t);
}

Test(tok_glue, text_bytes_are_decoded_lengths) {
    loco_tok *t = load_ok(FIX "bpe-1k.json");
    const int V = loco_tok_vocab_size(t), eot = loco_tok_special_id(t, LOCO_TOK_EOT);
    uint32_t *lens = malloc((size_t)(V + 5) * sizeof *lens);
    cr_assert_eq(loco_tok_text_bytes(t, V + 5, lens), 0);
    long long total = 0;
    for (int id = 0; id < V; id++) {
        uint8_t *s;
        size_t len;
        cr_assert_eq(loco_tok_decode(t, &id, 1, &s, &len), 0, "id %d: %s", id, loco_errmsg());
        loco_free(s);
        if (id != eot)
            cr_expect_eq(lens[id], len, "id %d: %u bytes, decoded %zu", id, lens[id], len);
        total += lens[id];
    }
    cr_expect_eq(lens[eot], 0);
    for (int id = V; id < V + 5; id++)
        cr_expect_eq(lens[id], 0, "id %d outside the vocabulary", id);
    cr_expect_gt(total, V - 1, "merges stand for more than one byte");
    cr_expect_eq(loco_tok_text_bytes(t, -1, lens), LOCO_EINVAL);
    free(lens);
    loco_tok_destroy(t);
}

Test(tok_glue, load_optional) {
    loco_tok *t = (loco_tok *)1;
    cr_expect_eq(loco_tok_load_optional(&t, "/nonexistent/tokenizer.json", 50), 0);
    cr_expect_null(t);
    cr_assert_eq(loco_tok_load_optional(&t, FIX "bpe-1k.json", 1024), 0, "%s", loco_errmsg());
    cr_assert_not_null(t);
    cr_expect_eq(loco_tok_vocab_size(t), 1024);
    loco_tok_destroy(t);
    cr_expect_eq(loco_tok_load_optional(&t, FIX "bpe-1k.json", 1000), LOCO_EINVAL);
    cr_expect_null(t);
    cr_expect(strstr(loco_errmsg(), "bpe-1k.json: 1024 ids, more than the model's vocab_size 1000"),
              "%s", loco_errmsg());
}
