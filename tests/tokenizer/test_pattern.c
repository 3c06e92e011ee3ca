/* tokenizer/pattern.c: the named pre-tokenizer patterns against Python's
 * `regex` module running tiktoken's pat_str (tests/fixtures/pretok-*.txt,
 * made by tests/fixtures/make_pretok.py), a tokenizer.json's Split regex,
 * what is refused, ignore_merges, cutting for encode_parallel under every
 * pattern, and tiktoken's ids (tests/fixtures/tiktoken-ids.txt) when the
 * rank files are at $LOCO_TIKTOKEN_DIR (r50k_base.tiktoken,
 * cl100k_base.tiktoken, o200k_base.tiktoken; skipped, saying so, without). */
#include "tests/support.h"
#include "tokenizer/internal.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FIX "tests/fixtures/"
#define LOCO "\"${LOCO_BIN:-build/loco}\""

static const char *names[] = {"gpt2", "cl100k", "o200k", "llama3"};

static loco_tok *load(const char *spec, const char *pattern) {
    loco_tok *t = NULL;
    cr_assert_eq(loco_tok_load_pattern(&t, spec, pattern), 0, "load %s: %s", spec, loco_errmsg());
    return t;
}

static uint8_t *read_all(const char *path, size_t *len) {
    void *d;
    cr_assert_eq(loco_file_read(path, &d, len), 0, "%s: %s", path, loco_errmsg());
    return d;
}

/* Decodes hex into out (room for strlen/2); returns the length. */
static size_t unhex(const char *h, size_t n, uint8_t *out) {
    for (size_t i = 0; i + 1 < n; i += 2) {
        unsigned v;
        cr_assert_eq(sscanf(h + i, "%2x", &v), 1, "bad hex at %.20s", h + i);
        out[i / 2] = (uint8_t)v;
    }
    return n / 2;
}

/* The line of the fixture starting with "KIND NAME " (static buffer). */
static char *fixture_line(const char *file, const char *kind, const char *name) {
    static char *text;
    static size_t len;
    loco_free(text);
    text = (char *)read_all(file, &len);
    char want[64];
    snprintf(want, sizeof want, "%s %s ", kind, name);
    for (char *l = text; l && *l;) {
        char *nl = strchr(l, '\n');
        if (nl)
            *nl = 0;
        if (!strncmp(l, want, strlen(want)))
            return l + strlen(want);
        l = nl ? nl + 1 : NULL;
    }
    cr_assert_fail("%s: no line \"%s\"", file, want);
    return NULL;
}

typedef struct {
    uint8_t *buf; /* pieces, each preceded by its length (uint32) */
    size_t len, n;
} pieces;

static int collect(const uint8_t *p, size_t n, int special, void *arg) {
    pieces *c = arg;
    c->buf = realloc(c->buf, c->len + 4 + n);
    uint32_t k = (uint32_t)n;
    memcpy(c->buf + c->len, &k, 4);
    memcpy(c->buf + c->len + 4, p, n);
    c->len += 4 + n;
    c->n++;
    return 0;
}

static pieces split(const loco_tok *t, const uint8_t *text, size_t len) {
    pieces c = {0};
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    cr_assert_eq(loco__tok_pieces(t, md, text, len, collect, &c), 0, "%s", loco_errmsg());
    pcre2_match_data_free(md);
    return c;
}

TestSuite(tok_pattern, .timeout = 60);

Test(tok_pattern, regexes_are_tiktokens_pat_str) {
    for (size_t i = 0; i < 4; i++) {
        const char *h = fixture_line(FIX "pretok-pieces.txt", "regex", names[i]);
        uint8_t want[1024] = {0};
        size_t n = unhex(h, strlen(h), want);
        const char *got = loco_tok_pattern_regex(names[i]);
        cr_assert(got && strlen(got) == n && !memcmp(got, want, n), "%s: %s\n  tiktoken: %.*s",
                  names[i], got, (int)n, want);
    }
    cr_assert_null(loco_tok_pattern_regex("p50k"));
    cr_assert_str_eq(loco_tok_pattern_regex("gpt2"), LOCO_TOK_GPT2_PATTERN);
}

Test(tok_pattern, mixed_script_pieces_match_python_regex) {
    size_t len;
    uint8_t *text = read_all(FIX "pretok-mixed.txt", &len);
    loco_tok *t = load(FIX "bpe-1k.json", NULL);
    cr_assert_str_eq(loco_tok_pattern_name(t), "gpt2");
    for (size_t i = 0; i < 4; i++) {
        cr_assert_eq(loco_tok_set_pattern(t, names[i]), 0, "%s", loco_errmsg());
        cr_assert_str_eq(loco_tok_pattern_name(t), names[i]);
        pieces got = split(t, text, len);
        char *h = fixture_line(FIX "pretok-pieces.txt", "pieces", names[i]);
        size_t off = 0, k = 0;
        for (char *tok = strtok(h, " "); tok; tok = strtok(NULL, " "), k++) {
            uint8_t want[256];
            size_t n = unhex(tok, strlen(tok), want);
            cr_assert_lt(k, got.n, "%s: loco gives %zu pieces, Python more", names[i], got.n);
            uint32_t gl;
            memcpy(&gl, got.buf + off, 4);
            cr_assert(gl == n && !memcmp(got.buf + off + 4, want, n),
                      "%s: piece %zu: loco \"%.*s\" (%u bytes), Python \"%.*s\" (%zu bytes)",
                      names[i], k, (int)gl, got.buf + off + 4, gl, (int)n, want, n);
            off += 4 + gl;
        }
        cr_assert_eq(k, got.n, "%s: loco %zu pieces, Python %zu", names[i], got.n, k);
        free(got.buf);
    }
    loco_tok_destroy(t);
    loco_free(text);
}

/* U+0085 is a space to tiktoken (Rust's \s) and to PCRE2's UCP \s alike:
 * " \x850" is " ", NEL, "0" (tiktoken's test: cl100k ids 220, 126 227, 15)
 * under every pattern. */
Test(tok_pattern, nel_is_white_space) {
    const uint8_t s[] = " \xc2\x85"
                        "0";
    loco_tok *t = load(FIX "bpe-1k.json", "cl100k");
    for (size_t i = 0; i < 4; i++) {
        cr_assert_eq(loco_tok_set_pattern(t, names[i]), 0);
        pieces p = split(t, s, 4);
        cr_assert_eq(p.n, 3u, "%s: %zu pieces", names[i], p.n);
        free(p.buf);
    }
    loco_tok_destroy(t);
}

Test(tok_pattern, unknown_names_are_refused_naming_the_known_ones) {
    loco_tok *t = load(FIX "bpe-1k.json", "auto");
    cr_assert_eq(loco_tok_set_pattern(t, "p50k"), LOCO_EINVAL);
    cr_assert(strstr(loco_errmsg(), "\"p50k\"") &&
                  strstr(loco_errmsg(), "gpt2, cl100k, o200k, llama3"),
              "%s", loco_errmsg());
    cr_assert_str_eq(loco_tok_pattern_name(t), "gpt2");
    cr_assert_eq(loco_tok_set_pattern(t, ""), 0);
    cr_assert_eq(loco_tok_set_pattern(t, NULL), 0);
    loco_tok_destroy(t);
    loco_tok *u = (loco_tok *)1;
    cr_assert_eq(loco_tok_load_pattern(&u, FIX "tiny.tiktoken", "CL100K"), LOCO_EINVAL);
    cr_assert_null(u);
    static char out[4096];
    int rc = test_run(out, sizeof out,
                      "echo hi | " LOCO " tokenizer encode --tokenizer " FIX
                      "bpe-1k.json --pattern o200 ; echo rc=$?");
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(strstr(out, "unknown pre-tokenizer pattern \"o200\"") && strstr(out, "rc=1"), "%s",
              out);
}

/* Cuts of encode_parallel are safe under every named pattern: the ids
 * equal loco_tok_encode's for a text full of places where they are not
 * ("\n\n" before a word: GPT-2 pieces it "\n" "\n", one piece at a text's
 * end; ".\n/" is one o200k piece). */
Test(tok_pattern, parallel_equals_serial_under_every_pattern) {
    size_t len;
    uint8_t *one = read_all(FIX "pretok-mixed.txt", &len);
    const char *extra = "word\n\nnext x.\n/y\n a\n\tb\nc. d\n/e f\r\ng ";
    size_t el = strlen(extra), big = 20 * (len + el);
    uint8_t *text = loco_alloc(big);
    for (int i = 0; i < 20; i++) {
        memcpy(text + (size_t)i * (len + el), one, len);
        memcpy(text + (size_t)i * (len + el) + len, extra, el);
    }
    loco_tok *t = load(FIX "bpe-1k.json", NULL);
    for (size_t i = 0; i < 4; i++) {
        cr_assert_eq(loco_tok_set_pattern(t, names[i]), 0);
        int32_t *a, *b;
        size_t n1, n2;
        cr_assert_eq(loco_tok_encode(t, text, big, &a, &n1), 0);
        for (int threads = 1; threads <= 3; threads += 2) {
            cr_assert_eq(loco_tok_encode_parallel(t, text, big, 64, threads, NULL, NULL, &b, &n2),
                         0, "%s", loco_errmsg());
            cr_assert(n1 == n2 && !memcmp(a, b, n1 * sizeof *a), "%s, %d threads: ids differ",
                      names[i], threads);
            loco_free(b);
        }
        loco_free(a);
    }
    loco_tok_destroy(t);
    loco_free(text);
    loco_free(one);
}

/* Writes a tokenizer.json: bytes 0..255 as ids, "ab" as 256 (no merge
 * makes it), <|endoftext|> 257, with the given pre_tokenizer and
 * ignore_merges. */
static char *hf_file(const char *pre_tokenizer, int ignore_merges) {
    static char path[128];
    snprintf(path, sizeof path, "/tmp/loco-tokpat-XXXXXX.json");
    int fd = mkstemps(path, 5);
    cr_assert(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fprintf(f, "{\"added_tokens\": [{\"id\": 257, \"content\": \"<|endoftext|>\"}],\n");
    fprintf(f, "\"pre_tokenizer\": %s,\n\"model\": {\"type\": \"BPE\", %s\"vocab\": {",
            pre_tokenizer, ignore_merges ? "\"ignore_merges\": true, " : "");
    for (int b = 0; b < 256; b++) {
        char m[8];
        uint8_t byte = (uint8_t)b;
        loco__tok_map(&byte, 1, m);
        fprintf(f, "\"%s%s\": %d, ", m[0] == '"' || m[0] == '\\' ? "\\" : "", m, b);
    }
    fprintf(f, "\"ab\": 256}, \"merges\": []}}\n");
    fclose(f);
    return path;
}

Test(tok_pattern, tokenizer_json_split_regex_and_round_trip) {
    /* Llama 3's pre_tokenizer as Hugging Face writes it */
    char pre[1024];
    snprintf(pre, sizeof pre,
             "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": "
             "{\"Regex\": \"%s\"}, \"behavior\": \"Isolated\", \"invert\": false}, {\"type\": "
             "\"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true, \"use_regex\": "
             "false}]}",
             "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}| "
             "?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+");
    char *p = hf_file(pre, 1);
    loco_tok *t = load(p, NULL);
    unlink(p);
    cr_assert_str_eq(loco_tok_pattern_name(t), "llama3");
    /* saved as a Split, read back as the same pattern; o200k too */
    for (int k = 0; k < 2; k++) {
        if (k)
            cr_assert_eq(loco_tok_set_pattern(t, "o200k"), 0);
        char out[] = "/tmp/loco-tokpat-save-XXXXXX";
        int fd = mkstemp(out);
        close(fd);
        cr_assert_eq(loco_tok_save_hf(t, out), 0, "%s", loco_errmsg());
        loco_tok *u = load(out, NULL);
        unlink(out);
        cr_assert_str_eq(loco_tok_pattern_name(u), k ? "o200k" : "llama3");
        cr_assert_eq(u->whole_pieces, 1, "ignore_merges kept");
        loco_tok_destroy(u);
    }
    loco_tok_destroy(t);
    /* a regex of the file's own: split by it, "custom", one chunk */
    p = hf_file("{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\d|\\\\s+|\\\\D\"}, "
                "\"behavior\": \"Isolated\"}",
                0);
    t = load(p, NULL);
    unlink(p);
    cr_assert_str_eq(loco_tok_pattern_name(t), "custom");
    pieces c = split(t, (const uint8_t *)"12 \xc2\x85x", 6);
    cr_assert_eq(c.n, 4u, "1, 2, \" NEL\" (a space), x: %zu pieces", c.n);
    free(c.buf);
    loco_tok_destroy(t);
    /* one that can match the empty string: only its other matches count */
    p = hf_file("{\"type\": \"Split\", \"pattern\": {\"Regex\": \"a*\"}, \"behavior\": "
                "\"Isolated\"}",
                0);
    t = load(p, NULL);
    unlink(p);
    c = split(t, (const uint8_t *)"xaay", 4);
    cr_assert_eq(c.n, 3u, "x, aa, y: %zu pieces", c.n);
    free(c.buf);
    int32_t *a, *b;
    size_t n1, n2;
    const uint8_t s[] = "ab\nab\nab\nab\nab\n";
    cr_assert_eq(loco_tok_encode(t, s, sizeof s - 1, &a, &n1), 0);
    cr_assert_eq(loco_tok_encode_parallel(t, s, sizeof s - 1, 2, 2, NULL, NULL, &b, &n2), 0);
    cr_assert(n1 == n2 && !memcmp(a, b, n1 * sizeof *a));
    loco_free(a);
    loco_free(b);
    loco_tok_destroy(t);
}

/* ignore_merges: "ab", which no merge makes, is one id only with it. */
Test(tok_pattern, ignore_merges_takes_whole_pieces) {
    const char *bl = "{\"type\": \"ByteLevel\"}";
    for (int ig = 0; ig < 2; ig++) {
        char *p = hf_file(bl, ig);
        loco_tok *t = load(p, NULL);
        unlink(p);
        cr_assert_str_eq(loco_tok_pattern_name(t), "gpt2");
        int32_t *ids;
        size_t n;
        cr_assert_eq(loco_tok_encode(t, (const uint8_t *)"ab abc", 6, &ids, &n), 0);
        if (ig)
            cr_assert(n == 5 && ids[0] == 256, "ignore_merges: %zu ids, first %d", n, ids[0]);
        else
            cr_assert(n == 6 && ids[0] == 'a' && ids[1] == 'b', "%zu ids", n);
        loco_free(ids);
        loco_tok_destroy(t);
    }
}

static void refused(const char *pre, const char *phrase) {
    char *p = hf_file(pre, 0);
    loco_tok *t = NULL;
    cr_assert_eq(loco_tok_load(&t, p), LOCO_EPROTO, "%s loaded", pre);
    cr_assert(strstr(loco_errmsg(), p) && strstr(loco_errmsg(), phrase), "want \"%s\": %s", phrase,
              loco_errmsg());
    unlink(p);
}

Test(tok_pattern, pre_tokenizers_loco_cannot_follow_are_refused) {
    refused("{\"type\": \"ByteLevel\", \"use_regex\": false}", "no regex");
    refused("{\"type\": \"ByteLevel\", \"add_prefix_space\": true}", "add_prefix_space");
    refused("{\"type\": \"Whitespace\"}", "type \"Whitespace\" is not supported");
    refused("{\"type\": \"Split\", \"pattern\": {\"String\": \" \"}, \"behavior\": \"Isolated\"}",
            "String pattern");
    refused("{\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, \"behavior\": \"Removed\"}",
            "Isolated");
    refused("{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": "
            "{\"Regex\": \"\\\\s+\"}, \"behavior\": \"Isolated\"}, {\"type\": \"ByteLevel\"}]}",
            "2 regex splits");
    refused("{\"type\": \"Split\", \"pattern\": {\"Regex\": \"(a\"}, \"behavior\": \"Isolated\"}",
            "PCRE2 compile error");
}

/* OpenAI's special ids need OpenAI's whole rank file: a small one keeps
 * <|endoftext|> after its largest rank. */
Test(tok_pattern, small_tiktoken_file_keeps_its_endoftext) {
    loco_tok *t = load(FIX "tiny.tiktoken", "cl100k");
    cr_assert_eq(loco_tok_special_id(t, LOCO_TOK_EOT), loco_tok_vocab_size(t) - 1);
    cr_assert_eq(loco_tok_special_id(t, "<|fim_prefix|>"), -1);
    cr_assert_str_eq(loco_tok_pattern_name(t), "cl100k");
    loco_tok_destroy(t);
}

/* tiktoken's ids: its own tests' vectors and the mixed-script text. */
Test(tok_pattern, tiktoken_ids, .timeout = 120) {
    const char *dir = getenv("LOCO_TIKTOKEN_DIR");
    static const char *enc[3][3] = {{"gpt2", "r50k_base.tiktoken", "gpt2"},
                                    {"cl100k_base", "cl100k_base.tiktoken", "cl100k"},
                                    {"o200k_base", "o200k_base.tiktoken", "o200k"}};
    char path[3][1024];
    for (int e = 0; e < 3; e++) {
        snprintf(path[e], sizeof path[e], "%s/%s", dir ? dir : "", enc[e][1]);
        if (!dir || access(path[e], R_OK) != 0)
            cr_skip_test("tiktoken rank files not found (LOCO_TIKTOKEN_DIR=%s needs %s): the "
                         "split is checked, tiktoken's ids are not",
                         dir ? dir : "unset", enc[e][1]);
    }
    size_t flen;
    char *fix = (char *)read_all(FIX "tiktoken-ids.txt", &flen);
    int checked[3] = {0};
    for (int e = 0; e < 3; e++) {
        loco_tok *t = load(path[e], enc[e][2]);
        if (e == 1)
            cr_assert(loco_tok_special_id(t, "<|endoftext|>") == 100257 &&
                      loco_tok_special_id(t, "<|endofprompt|>") == 100276);
        if (e == 2)
            cr_assert(loco_tok_special_id(t, "<|endoftext|>") == 199999 &&
                      loco_tok_special_id(t, "<|endofprompt|>") == 200018);
        char *copy = strdup(fix);
        for (char *l = strtok(copy, "\n"); l; l = strtok(NULL, "\n")) {
            char name[32], src[32];
            int at;
            if (l[0] == '#' || sscanf(l, "%31s %31s %n", name, src, &at) != 2 ||
                strcmp(name, enc[e][0]))
                continue;
            char *colon = strstr(l + at, " : ");
            cr_assert(colon, "%s", l);
            size_t hl = (size_t)(colon - (l + at));
            uint8_t *text = loco_alloc(hl / 2 + 1);
            size_t len = unhex(l + at, hl, text);
            int32_t *ids;
            size_t n;
            cr_assert_eq(loco_tok_encode(t, text, len, &ids, &n), 0, "%s", loco_errmsg());
            const char *w = colon + 3;
            if (!strncmp(w, "n=", 2)) {
                cr_assert_eq(n, strtoul(w + 2, NULL, 10), "%s %s \"%.*s\": %zu ids", name, src,
                             (int)len, text, n);
            } else {
                size_t k = 0;
                for (char *end;; k++) {
                    long v = strtol(w, &end, 10);
                    if (end == w)
                        break;
                    cr_assert(k < n && ids[k] == v, "%s %s \"%.*s\": id %zu: loco %d, tiktoken %ld",
                              name, src, (int)(len < 60 ? len : 60), text, k, k < n ? ids[k] : -1,
                              v);
                    w = end;
                }
                cr_assert_eq(k, n, "%s %s: loco %zu ids, tiktoken %zu", name, src, n, k);
            }
            checked[e]++;
            loco_free(ids);
            loco_free(text);
        }
        free(copy);
        loco_tok_destroy(t);
    }
    cr_assert(checked[0] >= 20 && checked[1] >= 14 && checked[2] >= 6, "%d %d %d vectors",
              checked[0], checked[1], checked[2]);
    loco_free(fix);
}

/* Longest run of ASCII digits inside one token of t. */
static size_t longest_digit_token(const loco_tok *t) {
    size_t best = 0;
    for (int id = 0; id < loco_tok_vocab_size(t); id++) {
        size_t len, run = 0;
        const uint8_t *b = loco_tok_token_bytes(t, id, &len);
        for (size_t i = 0; b && i < len; i++) {
            run = b[i] >= '0' && b[i] <= '9' ? run + 1 : 0;
            best = run > best ? run : best;
        }
    }
    return best;
}

/* Training splits with the named pattern: GPT-2's keeps a run of digits
 * one piece, so frequent long numbers become single tokens; Llama 3's
 * (cl100k's) cuts them into groups of at most three, so no merge can
 * cross a group. The trained tokenizer keeps the pattern through its
 * tokenizer.json; an unknown name is refused before any work. */
Test(tok_pattern, train_splits_with_the_named_pattern) {
    static char text[1 << 15];
    size_t n = 0;
    for (int i = 0; n + 64 < sizeof text; i++)
        n += (size_t)snprintf(text + n, sizeof text - n, "In the year 1234567 there were %d men. ",
                              100000 + i % 7);
    loco_tok *g = NULL, *l = NULL, *bad = NULL;
    cr_assert_eq(loco_tok_train(&g, (const uint8_t *)text, n, 285, "gpt2"), 0, "%s", loco_errmsg());
    cr_assert_eq(loco_tok_train(&l, (const uint8_t *)text, n, 285, "llama3"), 0, "%s",
                 loco_errmsg());
    cr_expect_geq(longest_digit_token(g), 7, "gpt2: the number should become one token");
    cr_expect_eq(longest_digit_token(l), 3, "llama3: digits in groups of three");
    cr_expect_str_eq(loco_tok_pattern_name(l), "llama3");
    char path[] = "/tmp/loco-tok-train-pattern-XXXXXX";
    close(mkstemp(path));
    cr_assert_eq(loco_tok_save_hf(l, path), 0, "%s", loco_errmsg());
    loco_tok *back = load(path, NULL);
    cr_expect_str_eq(loco_tok_pattern_name(back), "llama3");
    int32_t *a, *b;
    size_t na, nb;
    cr_assert_eq(loco_tok_encode(l, (const uint8_t *)text, 200, &a, &na), 0);
    cr_assert_eq(loco_tok_encode(back, (const uint8_t *)text, 200, &b, &nb), 0);
    cr_expect(na == nb && !memcmp(a, b, na * sizeof *a), "the saved tokenizer encodes alike");
    cr_expect_eq(loco_tok_train(&bad, (const uint8_t *)text, n, 400, "llama2"), LOCO_EINVAL);
    cr_expect(strstr(loco_errmsg(), "llama2") && strstr(loco_errmsg(), "llama3"), "%s",
              loco_errmsg());
    cr_expect_null(bad);
    unlink(path);
    loco_free(a), loco_free(b);
    loco_tok_destroy(g), loco_tok_destroy(l), loco_tok_destroy(back);
}
