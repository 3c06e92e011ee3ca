/* Llama 3's tokenizer.model under pattern llama3: a synthetic rank file of
 * exactly 128000 ranks gets Llama 3.1's 256 special tokens at their ids
 * (checked against the list as Meta-Llama-3.1-8B's tokenizer.json gives
 * it, built here independently of the loader's rule), encodes and decodes
 * them, separates documents with <|end_of_text|>, survives a tokenizer.json
 * round trip, and the same file under no pattern / gpt2 / cl100k keeps
 * <|endoftext|> after its largest rank. Then the same through `loco
 * tokenizer` and `loco prep`. */
#include "core/core.h"
#include "tests/support.h"
#include "tokenizer/tokenizer.h"

#include <criterion/criterion.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LOCO "\"${LOCO_BIN:-build/loco}\""
#define NRANKS 128000
#define NSPECIAL 256

static char *dir, path[600];

/* Writes dir/name: ranks 0..255 the bytes, then every byte pair, then
 * three-byte tokens, up to rank last (each token of two or three bytes is
 * the merge of two lower ranks, as the loader requires). */
static void write_ranks(const char *name, int last) {
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    cr_assert(f, "%s", path);
    for (int r = 0; r <= last; r++) {
        uint8_t b[3];
        int n;
        if (r < 256) {
            b[0] = (uint8_t)r;
            n = 1;
        } else if (r < 256 + 65536) {
            b[0] = (uint8_t)((r - 256) >> 8);
            b[1] = (uint8_t)(r - 256);
            n = 2;
        } else {
            b[0] = (uint8_t)(r - 65792);
            b[1] = (uint8_t)((r - 65792) >> 8);
            b[2] = 'A';
            n = 3;
        }
        unsigned char b64[8];
        EVP_EncodeBlock(b64, b, n);
        fprintf(f, "%s %d\n", b64, r);
    }
    cr_assert_eq(fclose(f), 0);
}

static void setup(void) {
    dir = strdup("/tmp/loco-llama3-XXXXXX");
    cr_assert(mkdtemp(dir));
    write_ranks("tokenizer.model", NRANKS - 1);
}

static void teardown(void) {
    loco_rmtree(dir);
    free(dir);
}

TestSuite(tok_llama3, .init = setup, .fini = teardown, .timeout = 120);

/* Meta-Llama-3.1-8B's tokenizer.json: ids 128000.. in order; the reserved
 * ones numbered in id order (Meta's llama-models tokenizer.py differs:
 * <|step_id|> at 128005 and its reserved ones one lower from 128011). */
static const char *named[] = {"<|begin_of_text|>",
                              "<|end_of_text|>",
                              "<|reserved_special_token_0|>",
                              "<|reserved_special_token_1|>",
                              "<|finetune_right_pad_id|>",
                              "<|reserved_special_token_2|>",
                              "<|start_header_id|>",
                              "<|end_header_id|>",
                              "<|eom_id|>",
                              "<|eot_id|>",
                              "<|python_tag|>"};

static void expected(int id, char *buf, size_t cap) {
    int i = id - NRANKS, nn = (int)(sizeof named / sizeof named[0]);
    if (i < nn)
        snprintf(buf, cap, "%s", named[i]);
    else
        snprintf(buf, cap, "<|reserved_special_token_%d|>", 3 + i - nn);
}

static loco_tok *load(const char *pattern) {
    loco_tok *t = NULL;
    cr_assert_eq(loco_tok_load_pattern(&t, path, pattern), 0, "%s: %s", pattern ? pattern : "auto",
                 loco_errmsg());
    return t;
}

static void expect_text(const loco_tok *t, int id, const char *want) {
    uint8_t *s;
    size_t len;
    cr_assert_eq(loco_tok_decode(t, &id, 1, &s, &len), 0, "id %d: %s", id, loco_errmsg());
    cr_expect(len == strlen(want) && !memcmp(s, want, len), "id %d decodes to \"%s\", want %s", id,
              (char *)s, want);
    loco_free(s);
    cr_expect_eq(loco_tok_special_id(t, want), id, "%s", want);
}

/* Every special by id and by text, the spot checks spelled out. */
static void expect_llama31(const loco_tok *t) {
    cr_assert_eq(loco_tok_vocab_size(t), NRANKS + NSPECIAL);
    char want[64];
    for (int id = NRANKS; id < NRANKS + NSPECIAL; id++) {
        expected(id, want, sizeof want);
        expect_text(t, id, want);
    }
    expect_text(t, 128000, "<|begin_of_text|>");
    expect_text(t, 128001, "<|end_of_text|>");
    expect_text(t, 128004, "<|finetune_right_pad_id|>");
    expect_text(t, 128005, "<|reserved_special_token_2|>");
    expect_text(t, 128008, "<|eom_id|>");
    expect_text(t, 128009, "<|eot_id|>");
    expect_text(t, 128010, "<|python_tag|>");
    expect_text(t, 128011, "<|reserved_special_token_3|>");
    expect_text(t, 128255, "<|reserved_special_token_247|>");
    cr_expect_eq(loco_tok_special_id(t, LOCO_TOK_EOT), -1);
    cr_expect_eq(loco_tok_special_id(t, "<|step_id|>"), -1);
    cr_expect_eq(loco_tok_eot_id(t), 128001, "documents end with <|end_of_text|>");
    cr_expect_str_eq(loco_tok_pattern_name(t), "llama3");
}

Test(tok_llama3, rank_file_gets_llama31_specials) {
    loco_tok *t = load("llama3");
    expect_llama31(t);
    cr_expect_eq(loco_tok_num_merges(t), NRANKS - 256);
    int past = NRANKS + NSPECIAL;
    uint8_t *s = NULL;
    size_t len;
    cr_expect_eq(loco_tok_decode(t, &past, 1, &s, &len), LOCO_EINVAL, "id %d decoded", past);
    loco_tok_destroy(t);
}

/* As for OpenAI's specials: a special's text in the text is that special. */
Test(tok_llama3, specials_in_text_encode_as_specials) {
    loco_tok *t = load("llama3");
    const char *text = "<|begin_of_text|>ab<|eot_id|>\n<|eot_id|<|reserved_special_token_247|>";
    int32_t *ids, *ab, *mid;
    size_t n, nab, nmid;
    cr_assert_eq(loco_tok_encode(t, (const uint8_t *)text, strlen(text), &ids, &n), 0, "%s",
                 loco_errmsg());
    cr_assert_eq(loco_tok_encode(t, (const uint8_t *)"ab", 2, &ab, &nab), 0);
    cr_assert_eq(loco_tok_encode(t, (const uint8_t *)"\n<|eot_id|", 10, &mid, &nmid), 0);
    cr_assert_eq(n, 1 + nab + 1 + nmid + 1, "%zu ids", n);
    cr_expect_eq(ids[0], 128000);
    cr_expect_arr_eq(ids + 1, ab, nab * sizeof *ab);
    cr_expect_eq(ids[1 + nab], 128009);
    cr_expect_arr_eq(ids + 2 + nab, mid, nmid * sizeof *mid);
    for (size_t i = 0; i < nmid; i++)
        cr_expect_lt(mid[i], NRANKS, "\"<|eot_id|\" is not a special");
    cr_expect_eq(ids[n - 1], 128255);
    uint8_t *back;
    size_t blen;
    cr_assert_eq(loco_tok_decode(t, ids, n, &back, &blen), 0);
    cr_expect(blen == strlen(text) && !memcmp(back, text, blen), "round trip: %s", back);
    /* a document starts with <|end_of_text|>; chunks and threads agree */
    int32_t *doc;
    size_t nd;
    cr_assert_eq(loco_tok_encode_document(t, "llama3", (const uint8_t *)text, strlen(text), 8, 2,
                                          NULL, NULL, &doc, &nd),
                 0, "%s", loco_errmsg());
    cr_assert_eq(nd, n + 1);
    cr_expect_eq(doc[0], 128001);
    cr_expect_arr_eq(doc + 1, ids, n * sizeof *ids);
    uint32_t *lens = malloc((NRANKS + NSPECIAL) * sizeof *lens);
    cr_assert_eq(loco_tok_text_bytes(t, NRANKS + NSPECIAL, lens), 0);
    cr_expect_eq(lens[128001], 0, "the separator stands for no text");
    cr_expect_eq(lens[128009], strlen("<|eot_id|>"));
    free(lens);
    loco_free(doc);
    loco_free(back);
    loco_free(ids);
    loco_free(ab);
    loco_free(mid);
    loco_tok_destroy(t);
}

/* prep and checkpoints carry the tokenizer as a tokenizer.json: all 256
 * come back as added tokens. */
Test(tok_llama3, tokenizer_json_round_trip) {
    loco_tok *t = load("llama3");
    char json[700];
    snprintf(json, sizeof json, "%s/tokenizer.json", dir);
    cr_assert_eq(loco_tok_save_hf(t, json), 0, "%s", loco_errmsg());
    loco_tok_destroy(t);
    cr_assert_eq(loco_tok_load_hf(&t, json), 0, "%s", loco_errmsg());
    expect_llama31(t);
    loco_tok_destroy(t);
}

/* The same file without llama3 keeps today's <|endoftext|> after rank
 * 127999; llama3 with one rank fewer or a gap does too. */
Test(tok_llama3, other_patterns_and_other_files_keep_endoftext) {
    const char *pats[] = {NULL, "auto", "gpt2", "cl100k"};
    const char *names[] = {"gpt2", "gpt2", "gpt2", "cl100k"};
    for (int k = 0; k < 4; k++) {
        loco_tok *t = load(pats[k]);
        cr_expect_eq(loco_tok_vocab_size(t), NRANKS + 1, "%s", names[k]);
        cr_expect_eq(loco_tok_special_id(t, LOCO_TOK_EOT), NRANKS, "%s", names[k]);
        cr_expect_eq(loco_tok_eot_id(t), NRANKS);
        cr_expect_eq(loco_tok_special_id(t, "<|begin_of_text|>"), -1);
        cr_expect_str_eq(loco_tok_pattern_name(t), names[k]);
        loco_tok_destroy(t);
    }
    write_ranks("short.model", NRANKS - 2);
    loco_tok *t = load("llama3");
    cr_expect_eq(loco_tok_vocab_size(t), NRANKS);
    cr_expect_eq(loco_tok_special_id(t, LOCO_TOK_EOT), NRANKS - 1);
    cr_expect_eq(loco_tok_special_id(t, "<|end_of_text|>"), -1);
    loco_tok_destroy(t);
    /* 128000 ranks but the last one is 128000: not Llama 3's 0..127999 */
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "sed '$ s/ 127999$/ 128000/' %s/tokenizer.model > %s/gap.model", dir,
             dir);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    snprintf(path, sizeof path, "%s/gap.model", dir);
    t = load("llama3");
    cr_expect_eq(loco_tok_vocab_size(t), NRANKS + 2);
    cr_expect_eq(loco_tok_special_id(t, LOCO_TOK_EOT), NRANKS + 1);
    cr_expect_eq(loco_tok_special_id(t, "<|begin_of_text|>"), -1);
    loco_tok_destroy(t);
}

/* What a user types: decode and encode with --pattern llama3, and prep,
 * whose shards hold uint32 ids and start with <|end_of_text|>. */
Test(tok_llama3, cli_decode_encode_prep) {
    static char out[1 << 14];
    char want[256] = "";
    int ids[] = {128000, 128001, 128009, 128255};
    for (int i = 0; i < 4; i++)
        expected(ids[i], want + strlen(want), sizeof want - strlen(want));
    int rc = test_run(out, sizeof out,
                      "echo 128000 128001 128009 128255 | " LOCO
                      " tokenizer decode --tokenizer %s --pattern llama3",
                      path);
    cr_assert_eq(rc, 0, "%s", out);
    cr_expect_str_eq(out, want);
    rc = test_run(out, sizeof out,
                  "printf '<|begin_of_text|>hi<|eot_id|>' | " LOCO
                  " tokenizer encode --tokenizer %s --pattern llama3",
                  path);
    cr_assert_eq(rc, 0, "%s", out);
    int32_t *hi;
    size_t nhi;
    loco_tok *t = load("llama3");
    cr_assert_eq(loco_tok_encode(t, (const uint8_t *)"hi", 2, &hi, &nhi), 0);
    cr_assert_eq(nhi, 1);
    char line[128];
    snprintf(line, sizeof line, "128000 %d 128009\n", hi[0]);
    cr_expect_str_eq(out, line);
    loco_free(hi);
    loco_tok_destroy(t);
    rc = test_run(out, sizeof out,
                  "printf 'In the beginning\\n' > %s/t.txt && " LOCO
                  " prep %s/t.txt %s/l3 --tokenizer %s --pattern llama3 --val-frac 0.5",
                  dir, dir, dir, path);
    cr_assert_eq(rc, 0, "%s", out);
    cr_expect(strstr(out, "vocab 128256, uint32"), "%s", out);
    snprintf(line, sizeof line, "%s/l3_train_000000.bin", dir);
    void *shard;
    size_t len;
    cr_assert_eq(loco_file_read(line, &shard, &len), 0, "%s", loco_errmsg());
    const int32_t *w = shard;
    cr_expect_eq(w[0], LOCO_SHARD_MAGIC_U32);
    cr_expect_eq(w[256], 128001, "first id is <|end_of_text|>");
    loco_free(shard);
}
