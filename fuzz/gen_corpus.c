/* Writes the seed corpus of fuzz_decode: one small encoded chunk per codec,
 * with and without zstd, and a ragged tail chunk.
 * Usage: gen_corpus DIR (the files are committed under fuzz/corpus/decode). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "compress/compress.h"

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
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
                snprintf(path, sizeof path, "%s/%s-%s-%zu.bin", argv[1],
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
