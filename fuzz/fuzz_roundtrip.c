/* libFuzzer target: encode arbitrary floats, decode, compare.
 *
 * The first byte picks codec, rounding, zstd and error feedback; the rest
 * are fp32 values. A range holding a non-finite value must be refused with
 * LOCO_EINVAL; any other must decode (1 and 2 chunk workers alike) to within
 * the codec's worst-case rounding of each element: half a step of its block
 * scale (a full step when stochastic), or exactly for none. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compress/compress.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Largest |error| / scale of one element: nearest rounds to half a grid
 * step; the widest step of each grid, in units of the scale, is 1 (int), 64
 * (e4m3 448 - 384 ... at the top binade: 32), 2 (e2m1 4 -> 6). */
static double max_step(loco_codec_kind k) {
    switch (k) {
    case LOCO_CODEC_INT8:
    case LOCO_CODEC_INT4: return 1.0;
    case LOCO_CODEC_FP8: return 32.0;
    case LOCO_CODEC_FP4: return 2.0;
    default: return 0;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 + 4)
        return 0;
    const uint8_t mode = data[0];
    const size_t n = (size - 1) / 4;
    float *x = malloc(n * sizeof *x), *y = calloc(n, sizeof *y);
    if (!x || !y)
        abort();
    memcpy(x, data + 1, n * sizeof *x);
    bool finite = true;
    for (size_t i = 0; i < n; i++)
        finite &= isfinite(x[i]);

    loco_codec_params p;
    loco_codec_params_default(&p);
    p.codec = (loco_codec_kind)(mode % LOCO_CODEC_COUNT);
    p.stochastic = mode & 0x8;
    p.error_feedback = mode & 0x10;
    p.zstd = (mode & 0x20) ? LOCO_ZSTD_ON : (mode & 0x40) ? LOCO_ZSTD_AUTO : LOCO_ZSTD_OFF;
    p.block = 32;
    p.chunk_bytes = 4 * 64; /* many small chunks */
    p.threads = (mode & 0x80) ? 2 : 1;
    p.n_state = n;
    if (p.codec == LOCO_CODEC_TOPK) { /* nearest only; the rounding bit picks the value bits */
        p.topk_bits = p.stochastic ? 8 : 2;
        p.stochastic = false;
        p.topk = 0.25;
    }
    loco_codec *c;
    if (loco_codec_create(&c, &p) != 0)
        abort();
    loco_encode_plan plan;
    int rc = loco_codec_plan(c, &plan, x, n, 0, 1);
    const size_t cap = loco_compress_bound(n, &p);
    uint8_t *buf = malloc(cap + 1);
    loco_chunk_ref *ch = calloc(plan.n_chunks + 1, sizeof *ch);
    if (rc == 0)
        rc = loco_codec_encode(c, &plan, buf, cap, ch, x);
    if (!finite) {
        if (rc != LOCO_EINVAL)
            abort();
        goto out;
    }
    if (rc != 0)
        abort();
    const float *ef = loco_codec_ef(c);
    if (loco_codec_decode(c, y, n, 1.0f, buf, cap, ch, plan.n_chunks) != 0)
        abort();
    for (size_t i = 0; i < n; i++) {
        if (p.codec == LOCO_CODEC_NONE) {
            if (memcmp(&x[i], &y[i], 4) != 0 && !(x[i] == 0 && y[i] == 0))
                abort();
            continue;
        }
        /* with error feedback the decoded value + new EF = input (first round) */
        if (ef && fabs((double)y[i] + ef[i] - x[i]) >
                      1e-6 * (fabs((double)x[i]) + fabs((double)ef[i])) + 1e-44)
            abort();
        if (p.codec == LOCO_CODEC_TOPK) {
            /* kept: within one level, (m + 1) * amax / Q with m + 1 >= 1
             * (a value below half a level still decodes to one level);
             * dropped: 0, and no larger than any kept one of its chunk */
            const size_t c0 = i / 64 * 64, c1 = c0 + 64 < n ? c0 + 64 : n;
            double amax = 0, kept_min = INFINITY;
            size_t kept = 0;
            for (size_t j = c0; j < c1; j++) {
                amax = fmax(amax, fabs((double)x[j]));
                if (y[j] != 0) {
                    kept++;
                    kept_min = fmin(kept_min, fabs((double)x[j]));
                }
            }
            if (kept > loco_codec_topk_k(&p, c1 - c0))
                abort();
            const double level = amax / (double)(1 << (p.topk_bits - 1));
            if (y[i] != 0 ? fabs((double)y[i] - x[i]) > level * (1 + 1e-5) + 1e-44
                          : fabs((double)x[i]) > kept_min)
                abort();
            continue;
        }
        if (p.codec == LOCO_CODEC_BF16) { /* 8 significant bits; subnormal spacing 2^-133 */
            if (fabs((double)y[i] - x[i]) > fabs((double)x[i]) * 0x1p-7 + 0x1p-133)
                abort();
            continue;
        }
        double amax = 0; /* of the block */
        const size_t b0 = i / 32 * 32;
        for (size_t j = b0; j < b0 + 32 && j < n; j++)
            amax = fmax(amax, fabs((double)x[j]));
        const double qmax = p.codec == LOCO_CODEC_INT8   ? 127
                            : p.codec == LOCO_CODEC_INT4 ? 7
                            : p.codec == LOCO_CODEC_FP8  ? 448
                                                         : 6;
        const double step = max_step(p.codec) * amax / qmax;
        double tol = (p.stochastic ? 1.0 : 0.5) * step * (1 + 1e-5) + 1e-44;
        if (amax < 1e-30) /* subnormal scales lose precision; tiny blocks flush to 0 */
            tol = fmax(tol, amax * 1.0001);
        if (fabs((double)y[i] - x[i]) > tol)
            abort();
    }
out:
    free(ch);
    free(buf);
    loco_codec_destroy(c);
    free(x);
    free(y);
    loco_err_clear();
    return 0;
}
