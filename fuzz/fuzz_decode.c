/* libFuzzer target: the chunk decoder on arbitrary bytes.
 *
 * The input is one chunk as it would arrive from the network. Whatever the
 * bytes, decoding returns 0, LOCO_EPROTO or LOCO_EREFUSED, never reads or writes out of
 * bounds (ASan), and on error leaves the destination untouched. Built with
 * -DFUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION the checksums are computed but
 * not enforced, so mutations get past them to the field and zstd checks.
 * Seeds: fuzz/corpus/decode (written by fuzz/gen_corpus.c). */
#include <stdlib.h>
#include <string.h>

#include "compress/compress.h"

#define DST_N 8192

static loco_codec *codec;
static float dst[DST_N], dst0[DST_N];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!codec) {
        loco_codec_params p;
        loco_codec_params_default(&p);
        p.threads = 1;
        p.error_feedback = false;
        p.chunk_bytes = 4 * 4096; /* chunks of up to 4096 elements */
        if (loco_codec_create(&codec, &p) != 0)
            abort();
        for (int i = 0; i < DST_N; i++)
            dst0[i] = (float)i;
    }
    memcpy(dst, dst0, sizeof dst);
    loco_chunk_info info;
    const int prc = loco_chunk_parse(data, size, &info);
    if (prc != 0 && prc != LOCO_EPROTO)
        abort();
    const int rc = loco_codec_decode_chunk(codec, 0, dst, DST_N, 0.5f, data, size);
    if (rc != 0 && rc != LOCO_EPROTO && rc != LOCO_EREFUSED) /* EREFUSED: a non-finite scale */
        abort();
    if (rc != 0 && memcmp(dst, dst0, sizeof dst) != 0)
        abort(); /* a refused chunk touched the destination */
    if (rc == 0 && prc != 0)
        abort(); /* decoded what the header parser refused */
    loco_err_clear();
    return 0;
}
