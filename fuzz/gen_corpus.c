/* Writes the seed corpora committed under fuzz/corpus/: fuzz_decode's (one
 * small encoded chunk per codec, with and without zstd, and a ragged tail
 * chunk), fuzz_safetensors' (the table that target reads), fuzz_tokenizer's
 * (a small trained BPE as tokenizer.json and as tiktoken) and fuzz_ckpt's
 * (the state.json of ckpt_seed.h's checkpoint, and variants naming shards
 * and pipeline stages).
 * Build: cc -I. -I/usr/include/x86_64-linux-gnu/openblas-pthread -fopenmp
 *   fuzz/gen_corpus.c build/libloco.a $(make -s print-ldlibs)
 * Usage: gen_corpus ROOT (writes ROOT/decode, ROOT/safetensors, ...). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "compress/compress.h"
#include "fuzz/ckpt_seed.h"
#include "tokenizer/tokenizer.h"

static int put(const char *root, const char *sub, const char *name, const void *data, size_t len) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", root, sub);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/%s/%s", root, sub, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, len, f) != len || fclose(f)) {
        fprintf(stderr, "gen_corpus: cannot write %s\n", path);
        return 1;
    }
    return 0;
}

/* A file's bytes, with a kind byte first when kind >= 0, into sub/name. */
static int copy(const char *root, const char *sub, const char *name, const char *from, int kind) {
    void *d;
    size_t n;
    if (loco_file_read(from, &d, &n))
        return 1;
    unsigned char *b = malloc(n + 1);
    b[0] = (unsigned char)kind;
    memcpy(b + (kind >= 0), d, n);
    const int rc = put(root, sub, name, b, n + (kind >= 0));
    free(b);
    loco_free(d);
    return rc;
}

static int safetensors_seeds(const char *root, const char *tmp) {
    loco_ttable tt;
    loco_ttable_init(&tt);
    const int64_t s1[] = {3, 5}, s2[] = {7};
    if (loco_ttable_add(&tt, "a", 2, s1, -1, true) || loco_ttable_add(&tt, "b.w", 1, s2, -1, false))
        return 1;
    float x[22];
    for (int i = 0; i < 22; i++)
        x[i] = (float)i * 0.25f - 2;
    char path[1024];
    snprintf(path, sizeof path, "%s/t.safetensors", tmp);
    static const char *const meta[] = {"step", "5", NULL};
    if (loco_st_write(path, &tt, x, NULL, meta) || copy(root, "safetensors", "table", path, -1))
        return 1;
    loco_ttable_fini(&tt);
    return 0;
}

static int tokenizer_seeds(const char *root, const char *tmp) {
    static const char text[] = "the cat sat on the mat; the cat ate the rat. 123 456 the end\n";
    loco_tok *t;
    char path[1024];
    snprintf(path, sizeof path, "%s/tokenizer.json", tmp);
    if (loco_tok_train(&t, (const uint8_t *)text, sizeof text - 1, 270, NULL) ||
        loco_tok_save_hf(t, path) || copy(root, "tokenizer", "hf", path, 0))
        return 1;
    /* tiktoken: every id but <|endoftext|>, its bytes in base64, by rank */
    snprintf(path, sizeof path, "%s/tok.tiktoken", tmp);
    FILE *f = fopen(path, "w");
    static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int id = 0; f && id < loco_tok_vocab_size(t); id++) {
        size_t n;
        const uint8_t *b = loco_tok_token_bytes(t, id, &n);
        if (!b || id == loco_tok_special_id(t, "<|endoftext|>"))
            continue;
        for (size_t i = 0; i < n; i += 3) {
            const uint32_t v = (uint32_t)b[i] << 16 | (i + 1 < n ? (uint32_t)b[i + 1] << 8 : 0) |
                               (i + 2 < n ? b[i + 2] : 0);
            fprintf(f, "%c%c%c%c", b64[v >> 18], b64[v >> 12 & 63],
                    i + 1 < n ? b64[v >> 6 & 63] : '=', i + 2 < n ? b64[v & 63] : '=');
        }
        fprintf(f, " %d\n", id);
    }
    loco_tok_destroy(t);
    if (!f || fclose(f))
        return 1;
    return copy(root, "tokenizer", "tiktoken", path, 1);
}

static int ckpt_seeds(const char *root, const char *tmp) {
    char dir[1024], path[1100];
    snprintf(dir, sizeof dir, "%s/ckpt", tmp);
    snprintf(path, sizeof path, "%s/state.json", dir);
    if (fuzz_ckpt_write(dir) || copy(root, "ckpt", "single", path, -1))
        return 1;
    /* The same with a shard list (tp = 2, two shards a slice) and with two
     * pipeline stages: the manifest and stage parsers' ways in. */
    void *text;
    size_t len;
    if (loco_file_read(path, &text, &len))
        return 1;
    cJSON *j = cJSON_ParseWithLength(text, len);
    loco_free(text);
    cJSON *sh = cJSON_AddArrayToObject(j, "shards");
    for (int r = 0; r < 2; r++)
        for (int k = 0; k < 2; k++) {
            cJSON *e = cJSON_CreateObject();
            char name[64];
            snprintf(name, sizeof name, "model-tp%d-%d.safetensors", r, k);
            cJSON_AddStringToObject(e, "file", name);
            cJSON_AddNumberToObject(e, "lo", k * 100);
            cJSON_AddNumberToObject(e, "hi", k * 100 + 100);
            cJSON_AddStringToObject(e, "xxh3", "0123456789abcdef");
            cJSON_AddNumberToObject(e, "tp_rank", r);
            cJSON_AddItemToArray(sh, e);
        }
    cJSON_AddNumberToObject(j, "n_params", 200);
    cJSON_AddNumberToObject(j, "tp", 2);
    char *s = cJSON_PrintUnformatted(j);
    int rc = put(root, "ckpt", "sharded", s, strlen(s));
    free(s);
    cJSON_AddNumberToObject(j, "pp", 2);
    cJSON *stages = cJSON_AddArrayToObject(j, "stages");
    for (int p = 0; p < 2; p++) {
        cJSON *chunks = cJSON_CreateArray(), *fe = cJSON_CreateArray();
        cJSON_AddItemToArray(fe, cJSON_CreateNumber(p));
        cJSON_AddItemToArray(fe, cJSON_CreateNumber(p + 1));
        cJSON_AddItemToArray(chunks, fe);
        cJSON_AddItemToArray(stages, chunks);
    }
    s = cJSON_PrintUnformatted(j);
    rc |= put(root, "ckpt", "pipelined", s, strlen(s));
    free(s);
    cJSON_Delete(j);
    return rc;
}

static int decode_seeds(const char *root) {
    char dir[900];
    snprintf(dir, sizeof dir, "%s/decode", root);
    mkdir(dir, 0755);
    enum { N = 700 };
    float x[N];
    for (int i = 0; i < N; i++)
        x[i] = sinf(0.05f * (float)i) * (float)(1 + i % 7) * 0.01f;
    for (int k = 0; k < LOCO_CODEC_COUNT; k++)
        for (int z = 0; z < 2; z++) {
            loco_codec_params p;
            loco_codec_params_default(&p);
            p.codec = (loco_codec_kind)k;
            p.zstd = z ? LOCO_ZSTD_ON : LOCO_ZSTD_OFF;
            p.error_feedback = false;
            p.block = 64;
            p.chunk_bytes = 4 * 512; /* two chunks: 512 + a tail of 188 */
            p.threads = 1;
            p.topk = z ? 0.6 : 0.05; /* topk: the bitmap layout, then Elias-Fano */
            loco_codec *c;
            loco_encode_plan plan;
            if (loco_codec_create(&c, &p) || loco_codec_plan(c, &plan, x, N, 0, 0)) {
                fprintf(stderr, "gen_corpus: %s\n", loco_errmsg());
                return 1;
            }
            for (size_t ci = 0; ci < plan.n_chunks; ci++) {
                unsigned char *buf = malloc(plan.slot_bytes);
                size_t len;
                if (!buf ||
                    loco_codec_encode_chunk(c, 0, &plan, buf, plan.slot_bytes, &len, x, ci)) {
                    fprintf(stderr, "gen_corpus: %s\n", loco_errmsg());
                    return 1;
                }
                char path[1024];
                snprintf(path, sizeof path, "%s/%s-%s-%zu.bin", dir,
                         loco_codec_name((loco_codec_kind)k), z ? "zstd" : "raw", ci);
                FILE *f = fopen(path, "wb");
                if (!f || fwrite(buf, 1, len, f) != len || fclose(f)) {
                    fprintf(stderr, "gen_corpus: cannot write %s\n", path);
                    return 1;
                }
                free(buf);
            }
            loco_codec_destroy(c);
        }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s ROOT\n", argv[0]);
        return 2;
    }
    mkdir(argv[1], 0755);
    char tmp[] = "/tmp/loco-gen-corpus-XXXXXX";
    if (!mkdtemp(tmp))
        return 1;
    const int rc = decode_seeds(argv[1]) || safetensors_seeds(argv[1], tmp) ||
                   tokenizer_seeds(argv[1], tmp) || ckpt_seeds(argv[1], tmp);
    if (rc)
        fprintf(stderr, "gen_corpus: %s\n", loco_errmsg());
    loco_rmtree(tmp);
    return rc;
}
