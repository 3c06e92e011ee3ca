/* tokenizer/: byte-level BPE against the plain Python reference of
 * tests/fixtures/bpe_ref.py, round trips of arbitrary bytes, special tokens,
 * the three vocabulary formats, training on the default data, bad files.
 *
 * The expected ids were produced by the reference and committed:
 *   python3 tests/fixtures/bpe_ref.py encode tests/fixtures/bpe-1k.json \
 *       tests/fixtures/bpe-text.txt > tests/fixtures/bpe-text.ids
 *   python3 tests/fixtures/bpe_ref.py encode tests/fixtures/bpe-1k.json \
 *       tests/fixtures/bpe-bytes.bin > tests/fixtures/bpe-bytes.ids
 * (bpe-1k.json: `loco tokenizer train data/kjv.txt --vocab 1024`; tiny-*:
 *   python3 tests/fixtures/bpe_ref.py formats tests/fixtures/bpe-1k.json 40 \
 *       tests/fixtures/tiny) */
#include "tests/support.h"
#include "tokenizer/internal.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FIX "tests/fixtures/"

static loco_tok *load_ok(const char *spec) {
    loco_tok *t = NULL;
    int rc = loco_tok_load(&t, spec);
    cr_assert_eq(rc, 0, "load %s: %s", spec, loco_errmsg());
    return t;
}

static uint8_t *read_all(const char *path, size_t *len) {
    void *d;
    cr_assert_eq(loco_file_read(path, &d, len), 0, "%s: %s", path, loco_errmsg());
    return d;
}

/* Encodes, checks decode gives the input back, returns the ids. */
static int32_t *encode_rt(const loco_tok *t, const uint8_t *s, size_t len, size_t *n) {
    int32_t *ids;
    cr_assert_eq(loco_tok_encode(t, s, len, &ids, n), 0, "encode: %s", loco_errmsg());
    uint8_t *back;
    size_t blen;
    cr_assert_eq(loco_tok_decode(t, ids, *n, &back, &blen), 0, "decode: %s", loco_errmsg());
    cr_assert_eq(blen, len, "round trip length %zu != %zu", blen, len);
    cr_assert(!memcmp(back, s, len), "round trip bytes differ");
    loco_free(back);
    return ids;
}

static void check_reference(const char *text_path, const char *ids_path) {
    loco_tok *t = load_ok(FIX "bpe-1k.json");
    size_t len, ilen, n;
    uint8_t *text = read_all(text_path, &len);
    char *want = (char *)read_all(ids_path, &ilen);
    int32_t *ids = encode_rt(t, text, len, &n);
    char *p = want;
    size_t k = 0;
    for (;; k++) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p)
            break;
        cr_assert_lt(k, n, "C gives %zu ids, the reference more", n);
        cr_assert_eq(ids[k], v, "%s: id %zu: C %d, Python reference %ld", text_path, k, ids[k], v);
        p = end;
    }
    cr_assert_eq(k, n, "%s: C gives %zu ids, the Python reference %zu", text_path, n, k);
    cr_assert_gt(n, 100);
    loco_free(ids);
    loco_free(text);
    loco_free(want);
    loco_tok_destroy(t);
}

TestSuite(tokenizer, .timeout = 60);

Test(tokenizer, python_reference_text) {
    check_reference(FIX "bpe-text.txt", FIX "bpe-text.ids");
}

/* Invalid UTF-8, NEL, NBSP, NUL and <|endoftext|> mixed in. */
Test(tokenizer, python_reference_bytes) {
    check_reference(FIX "bpe-bytes.bin", FIX "bpe-bytes.ids");
}

/* Live against the reference on fresh random text when python3 is here. */
Test(tokenizer, python_reference_random) {
    if (system("command -v python3 >/dev/null 2>&1") != 0)
        cr_skip_test("python3 not found");
    static const char *bits[] = {
        "the",      " and",          "'s", "'LL", " 42", "7",     "  ",   "\n\n",     "\t ",
        "é",        "日本",          " 😀", "...", " ?!", "Ωμέγα", "\xff", "\xe2\x82", "\xc2\xa0",
        "\xc2\x85", "<|endoftext|>", " x"};
    char path[] = "/tmp/loco-tok-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    uint64_t s = 12345;
    size_t len = 0;
    char buf[8192];
    while (len < sizeof buf - 32) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        const char *b = bits[(s >> 33) % (sizeof bits / sizeof *bits)];
        memcpy(buf + len, b, strlen(b));
        len += strlen(b);
    }
    cr_assert_eq(write(fd, buf, len), (ssize_t)len);
    close(fd);
    char ids_path[64], cmd[512];
    snprintf(ids_path, sizeof ids_path, "%s.ids", path);
    snprintf(cmd, sizeof cmd, "python3 " FIX "bpe_ref.py encode " FIX "bpe-1k.json %s > %s", path,
             ids_path);
    static char out[4096];
    cr_assert_eq(test_run(out, sizeof out, "%s", cmd), 0, "%s\n%s", cmd, out);
    check_reference(path, ids_path);
    unlink(path);
    unlink(ids_path);
}

Test(tokenizer, roundtrip_random_bytes) {
    loco_tok *t = load_ok(FIX "bpe-1k.json");
    uint64_t s = 7;
    uint8_t buf[4096];
    for (int trial = 0; trial < 200; trial++) {
        size_t len = (size_t)(trial * 37 % 4096);
        for (size_t i = 0; i < len; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            uint8_t v = (uint8_t)(s >> 56);
            /* mostly ASCII text with runs of raw, often invalid, bytes */
            buf[i] =
                (trial % 3 == 0) ? v : (v < 200 ? (uint8_t)(" etaoinshrd\n'.,0123"[v % 19]) : v);
        }
        size_t n;
        int32_t *ids = encode_rt(t, buf, len, &n);
        for (size_t i = 0; i < n; i++)
            cr_assert(ids[i] >= 0 && ids[i] < loco_tok_vocab_size(t));
        loco_free(ids);
    }
    loco_tok_destroy(t);
}

Test(tokenizer, parallel_equals_serial) {
    loco_tok *t = load_ok(FIX "bpe-1k.json");
    size_t len;
    uint8_t *one = read_all(FIX "bpe-text.txt", &len);
    size_t big = len * 40;
    uint8_t *text = loco_alloc(big);
    for (int i = 0; i < 40; i++)
        memcpy(text + (size_t)i * len, one, len);
    size_t n1, n2;
    int32_t *a = encode_rt(t, text, big, &n1), *b;
    for (int threads = 1; threads <= 3; threads += 2) {
        cr_assert_eq(loco_tok_encode_parallel(t, text, big, 1000, threads, NULL, NULL, &b, &n2), 0,
                     "%s", loco_errmsg());
        cr_assert_eq(n1, n2, "%d threads: %zu ids, serial %zu", threads, n2, n1);
        cr_assert(!memcmp(a, b, n1 * sizeof *a), "%d threads: ids differ", threads);
        loco_free(b);
    }
    loco_free(a);
    loco_free(text);
    loco_free(one);
    loco_tok_destroy(t);
}

Test(tokenizer, special_tokens) {
    loco_tok *t = load_ok(FIX "bpe-1k.json");
    int eot = loco_tok_special_id(t, LOCO_TOK_EOT);
    cr_assert_eq(eot, loco_tok_vocab_size(t) - 1);
    const char *s = "In the beginning<|endoftext|><|endoftext|>And God said<|endoftext";
    size_t n;
    int32_t *ids = encode_rt(t, (const uint8_t *)s, strlen(s), &n);
    int count = 0;
    size_t first = 0;
    for (size_t i = 0; i < n; i++)
        if (ids[i] == eot && count++ == 0)
            first = i;
    cr_assert_eq(count, 2, "two <|endoftext|> ids (the truncated third is text)");
    cr_assert_eq(ids[first + 1], eot);
    /* the text before it encodes as it does alone */
    size_t m;
    int32_t *pre = encode_rt(t, (const uint8_t *)s, 16, &m);
    cr_assert_eq(m, first);
    cr_assert(!memcmp(pre, ids, m * sizeof *ids));
    loco_free(pre);
    loco_free(ids);
    loco_tok_destroy(t);
}

/* A tokenizer.json of the 256 bytes (no merges: an id per byte) and the
 * given added tokens (ids 256, 257, ...), at path. */
static void bytes_and_specials(const char *path, const char *const *sp, int nsp) {
    FILE *f = fopen(path, "w");
    cr_assert(f, "%s", path);
    fprintf(f, "{\"added_tokens\": [");
    for (int i = 0; i < nsp; i++)
        fprintf(f, "%s{\"id\": %d, \"content\": \"%s\"}", i ? ", " : "", 256 + i, sp[i]);
    fprintf(f, "], \"model\": {\"type\": \"BPE\", \"merges\": [], \"vocab\": {");
    for (int b = 0; b < 256; b++) {
        char m[8];
        uint8_t byte = (uint8_t)b;
        loco__tok_map(&byte, 1, m);
        fprintf(f, "%s\"%s%s\": %d", b ? ", " : "", m[0] == '"' || m[0] == '\\' ? "\\" : "", m, b);
    }
    fprintf(f, "}}}\n");
    cr_assert_eq(fclose(f), 0);
}

/* Specials are found as the plain search finds them: the earliest place
 * where one starts, the longest of those starting there; one lead byte
 * or several, one-byte specials, prefixes and overlaps. */
Test(tokenizer, specials_as_a_plain_search_finds_them) {
    static const char *const sets[2][6] = {{"<a", "<ab", "<|x|>", "b", "ab|", "zz"},
                                           {"<a", "<ab", "<|x|>", "<", "<zz", "<b|"}};
    const char *path = "/tmp/loco-tok-specials.json";
    const char *alphabet = "<ab|xz \n";
    uint64_t seed = 7;
    for (int k = 0; k < 2; k++) {
        bytes_and_specials(path, sets[k], 6);
        loco_tok *t = load_ok(path);
        remove(path);
        for (int rep = 0; rep < 20; rep++) {
            uint8_t text[400];
            size_t len = 1 + rep * 19;
            for (size_t i = 0; i < len; i++) {
                seed = seed * 6364136223846793005ull + 1442695040888963407ull;
                text[i] = (uint8_t)alphabet[(seed >> 33) % 8];
            }
            int32_t want[400];
            size_t nw = 0;
            for (size_t pos = 0; pos < len;) {
                int best = -1;
                size_t blen = 0;
                for (int i = 0; i < 6; i++) {
                    size_t sl = strlen(sets[k][i]);
                    if (sl <= len - pos && sl > blen && !memcmp(text + pos, sets[k][i], sl)) {
                        best = 256 + i;
                        blen = sl;
                    }
                }
                want[nw++] = best >= 0 ? best : text[pos];
                pos += best >= 0 ? blen : 1;
            }
            size_t n;
            int32_t *ids = encode_rt(t, text, len, &n);
            cr_assert_eq(n, nw, "set %d, %.*s: %zu ids, want %zu", k, (int)len, text, n, nw);
            cr_assert(!memcmp(ids, want, n * sizeof *ids), "set %d: %.*s", k, (int)len, text);
            loco_free(ids);
        }
        loco_tok_destroy(t);
    }
}

Test(tokenizer, three_formats_agree) {
    loco_tok *hf = load_ok(FIX "tiny-tokenizer.json");
    loco_tok *g2 = load_ok(FIX "tiny-encoder.json," FIX "tiny-vocab.bpe");
    loco_tok *tt = load_ok(FIX "tiny.tiktoken");
    loco_tok *all[3] = {hf, g2, tt};
    cr_assert_eq(loco_tok_num_merges(hf), 40);
    size_t len, n[3];
    uint8_t *text = read_all(FIX "bpe-text.txt", &len);
    int32_t *ids[3];
    for (int k = 0; k < 3; k++) {
        cr_assert_eq(loco_tok_vocab_size(all[k]), 297, "format %d: vocab %d", k,
                     loco_tok_vocab_size(all[k]));
        cr_assert_eq(loco_tok_num_merges(all[k]), 40, "format %d", k);
        cr_assert_eq(loco_tok_special_id(all[k], LOCO_TOK_EOT), 296, "format %d", k);
        ids[k] = encode_rt(all[k], text, len, &n[k]);
    }
    for (int k = 1; k < 3; k++) {
        cr_assert_eq(n[k], n[0], "format %d: %zu ids vs %zu", k, n[k], n[0]);
        cr_assert(!memcmp(ids[k], ids[0], n[0] * sizeof(int32_t)), "format %d differs", k);
    }
    /* and the 40 merges do merge: fewer ids than bytes */
    cr_assert_lt(n[0] + 50, len, "%zu ids for %zu bytes", n[0], len);
    for (int k = 0; k < 3; k++) {
        loco_free(ids[k]);
        loco_tok_destroy(all[k]);
    }
    loco_free(text);
}

/* 1k vocabulary trained on the default data (make data): it round trips,
 * compresses the validation text, and saving + loading keeps it. */
Test(tokenizer, train_1k_default_data, .timeout = 120) {
    size_t len;
    void *d;
    cr_assert_eq(loco_file_read("data/kjv.txt", &d, &len), 0, "data/kjv.txt (run `make data`): %s",
                 loco_errmsg());
    const uint8_t *text = d;
    size_t ntrain = len * 9 / 10;
    loco_tok *t;
    cr_assert_eq(loco_tok_train(&t, text, ntrain, 1024, NULL), 0, "%s", loco_errmsg());
    cr_assert_eq(loco_tok_vocab_size(t), 1024);
    cr_assert_eq(loco_tok_num_merges(t), 1024 - 257);
    cr_assert_eq(loco_tok_special_id(t, LOCO_TOK_EOT), 1023);
    size_t n;
    int32_t *ids = encode_rt(t, text + ntrain, len - ntrain, &n);
    double bpt = (double)(len - ntrain) / (double)n;
    cr_assert_gt(bpt, 2.0, "validation text: %.3f bytes per token", bpt);
    char path[] = "/tmp/loco-tok-train-XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    cr_assert_eq(loco_tok_save_hf(t, path), 0, "%s", loco_errmsg());
    loco_tok *u = load_ok(path);
    size_t m;
    int32_t *ids2 = encode_rt(u, text + ntrain, len - ntrain, &m);
    cr_assert_eq(m, n);
    cr_assert(!memcmp(ids, ids2, n * sizeof *ids));
    /* deterministic: training again gives the same file */
    loco_tok *t2;
    cr_assert_eq(loco_tok_train(&t2, text, ntrain, 1024, NULL), 0);
    char path2[] = "/tmp/loco-tok-train-XXXXXX";
    fd = mkstemp(path2);
    close(fd);
    cr_assert_eq(loco_tok_save_hf(t2, path2), 0);
    size_t l1, l2;
    uint8_t *f1 = read_all(path, &l1), *f2 = read_all(path2, &l2);
    cr_assert(l1 == l2 && !memcmp(f1, f2, l1), "two trainings differ");
    unlink(path);
    unlink(path2);
    loco_free(f1);
    loco_free(f2);
    loco_free(ids);
    loco_free(ids2);
    loco_tok_destroy(t);
    loco_tok_destroy(t2);
    loco_tok_destroy(u);
    loco_free(d);
}

/* Writes contents to a temporary file whose name ends in suffix. */
static char *tmp_file(const char *suffix, const char *contents) {
    static char path[128];
    snprintf(path, sizeof path, "/tmp/loco-tok-bad-XXXXXX%s", suffix);
    int fd = mkstemps(path, (int)strlen(suffix));
    cr_assert(fd >= 0);
    cr_assert_eq(write(fd, contents, strlen(contents)), (ssize_t)strlen(contents));
    close(fd);
    return path;
}

static void expect_error(const char *spec, const char *file, const char *phrase) {
    loco_tok *t = NULL;
    int rc = loco_tok_load(&t, spec);
    cr_assert_lt(rc, 0, "%s loaded", spec);
    cr_assert_null(t);
    const char *msg = loco_errmsg();
    cr_assert(strstr(msg, file), "message names the file %s: %s", file, msg);
    cr_assert(strstr(msg, phrase), "message says \"%s\": %s", phrase, msg);
}

Test(tokenizer, bad_files) {
    size_t len;
    char *good = (char *)read_all(FIX "tiny-tokenizer.json", &len);
    /* truncated JSON */
    char *cut = strndup(good, len / 2);
    char *p = tmp_file(".json", cut);
    expect_error(p, p, "truncated");
    unlink(p);
    free(cut);
    /* wrong model type */
    char *wt = strdup(good);
    char *at = strstr(wt, "\"BPE\"");
    cr_assert(at);
    memcpy(at, "\"WPC\"", 5);
    p = tmp_file(".json", wt);
    expect_error(p, p, "model.type is \"WPC\"; expected \"BPE\"");
    unlink(p);
    free(wt);
    /* merge of an unknown token */
    p = tmp_file(".bpe", "#version: 0.2\nt h\nzzqq h\n");
    char spec[512];
    snprintf(spec, sizeof spec, FIX "tiny-encoder.json,%s", p);
    expect_error(spec, p, "line 3: merge of unknown token \"zzqq\"");
    unlink(p);
    /* bad base64 */
    p = tmp_file(".tiktoken", "AA== 0\nAQ== 1\nA!== 2\n");
    expect_error(p, p, "line 3: bad base64");
    unlink(p);
    p = tmp_file(".tiktoken", "AA== 0\nAQ= 1\n");
    expect_error(p, p, "line 2: bad base64");
    unlink(p);
    /* duplicate ranks */
    p = tmp_file(".tiktoken", "AA== 0\nAQ== 1\nAg== 1\n");
    expect_error(p, p, "duplicate id/rank 1");
    unlink(p);
    /* a vocabulary without all 256 bytes */
    p = tmp_file(".tiktoken", "AA== 0\nAQ== 1\n");
    expect_error(p, p, "byte 0x02 has no token");
    unlink(p);
    /* not byte-level */
    p = tmp_file(".json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a b\": 0}, "
                          "\"merges\": []}}");
    expect_error(p, p, "is not byte-level");
    unlink(p);
    loco_free(good);
    /* missing file */
    expect_error("/nonexistent/tokenizer.json", "/nonexistent/tokenizer.json", "");
}
