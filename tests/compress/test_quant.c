/* The quantization kernels (kernels/cpu/quant.c) against references written
 * out here in double precision: the grid of each format is enumerated and
 * the nearest point found by brute force, the payload is parsed by hand from
 * the documented layout, and dequantize-accumulate is recomputed in double.
 * Also: round-trip error bounds on Gaussian and Student-t(3) data, and
 * stochastic rounding that is unbiased.
 *
 * One file: each codec's bounds beside the others, derived in one place. */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compress/compress.h"

/* ---- data ---- */

static uint64_t sm64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static double unif(uint64_t *s) {
    return ((double)(sm64(s) >> 11) + 0.5) * 0x1p-53;
}

static double gauss(uint64_t *s) {
    return sqrt(-2.0 * log(unif(s))) * cos(2.0 * M_PI * unif(s));
}

/* Student-t with 3 degrees of freedom: Z / sqrt(chi2_3 / 3). */
static double student3(uint64_t *s) {
    double c = 0;
    for (int k = 0; k < 3; k++) {
        double g = gauss(s);
        c += g * g;
    }
    return gauss(s) / sqrt(c / 3.0);
}

static float *fill(size_t n, uint64_t seed, bool heavy, double sigma) {
    float *x = malloc(n * sizeof *x);
    cr_assert(x);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(sigma * (heavy ? student3(&seed) : gauss(&seed)));
    return x;
}

/* ---- reference decoding of a payload, from the documented layout ---- */

static double ldexp_d(double m, int e) {
    return ldexp(m, e);
}

/* e4m3: exponent bias 7, 3 mantissa bits, 0x7f NaN. */
static double e4m3_value(unsigned code) {
    const unsigned e = (code >> 3) & 0xf, m = code & 7;
    const double mag = e == 0 ? ldexp_d(m, -9) : ldexp_d(1.0 + m / 8.0, (int)e - 7);
    return (code & 0x80) ? -mag : mag;
}

/* e2m1: 0, 0.5, 1, 1.5, 2, 3, 4, 6. */
static double e2m1_value(unsigned code) {
    static const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    return (code & 8) ? -mag[code & 7] : mag[code & 7];
}

static double scale_of(const uint8_t *payload, size_t b) {
    float s;
    memcpy(&s, payload + 4 * b, 4);
    return s;
}

/* Decoded value of element i, in double, without the kernels. */
static double ref_value(loco_codec_kind k, const uint8_t *p, size_t n, int block, size_t i) {
    const size_t nb = (n + (size_t)block - 1) / (size_t)block;
    const uint8_t *codes = p + 4 * nb;
    const double s =
        (k == LOCO_CODEC_NONE || k == LOCO_CODEC_BF16) ? 1.0 : scale_of(p, i / (size_t)block);
    switch (k) {
    case LOCO_CODEC_NONE: {
        float f;
        memcpy(&f, p + 4 * i, 4);
        return f;
    }
    case LOCO_CODEC_BF16: {
        uint32_t u = (uint32_t)p[2 * i] | (uint32_t)p[2 * i + 1] << 8;
        u <<= 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    case LOCO_CODEC_INT8: return (double)(int8_t)codes[i] * s;
    case LOCO_CODEC_FP8: return e4m3_value(codes[i]) * s;
    case LOCO_CODEC_INT4:
    case LOCO_CODEC_FP4: {
        unsigned nib = (i & 1) ? codes[i / 2] >> 4 : codes[i / 2] & 0xf;
        if (k == LOCO_CODEC_FP4)
            return e2m1_value(nib) * s;
        return (double)((int)nib - ((nib & 8) ? 16 : 0)) * s;
    }
    default: return NAN;
    }
}

static double qmax_of(loco_codec_kind k) {
    switch (k) {
    case LOCO_CODEC_INT8: return 127;
    case LOCO_CODEC_INT4: return 7;
    case LOCO_CODEC_FP8: return 448;
    case LOCO_CODEC_FP4: return 6;
    default: return 0;
    }
}

/* Positive grid of a block format, ascending. */
static int grid_of(loco_codec_kind k, double *g) {
    int n = 0;
    switch (k) {
    case LOCO_CODEC_INT8:
        for (int q = 0; q <= 127; q++)
            g[n++] = q;
        break;
    case LOCO_CODEC_INT4:
        for (int q = 0; q <= 7; q++)
            g[n++] = q;
        break;
    case LOCO_CODEC_FP8:
        for (unsigned c = 0; c <= 0x7e; c++)
            g[n++] = e4m3_value(c);
        break;
    case LOCO_CODEC_FP4:
        for (unsigned c = 0; c <= 7; c++)
            g[n++] = e2m1_value(c);
        break;
    default: break;
    }
    return n;
}

static uint8_t *quantize(loco_codec_kind k, const float *x, float *ef, size_t n, int block,
                         bool stochastic, uint64_t key) {
    const size_t bytes = loco_quant_payload_bytes(loco_codec_format(k), n, block);
    uint8_t *p = malloc(bytes + 1);
    cr_assert(p);
    loco_quant_args a = {.block = block, .stochastic = stochastic, .key = key};
    cr_assert_eq(loco_quant(loco_codec_format(k), p, x, ef, n, &a), 0);
    return p;
}

static double rel_err(loco_codec_kind k, const float *x, size_t n, int block) {
    uint8_t *p = quantize(k, x, NULL, n, block, false, 0);
    double e = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        double d = ref_value(k, p, n, block, i) - x[i];
        e += d * d;
        s += (double)x[i] * x[i];
    }
    free(p);
    return sqrt(e / s);
}

/* ---- payload sizes ---- */

Test(compress_quant, payload_bytes) {
    cr_assert_eq(loco_quant_payload_bytes(loco_codec_format(LOCO_CODEC_NONE), 1000, 128), 4000);
    cr_assert_eq(loco_quant_payload_bytes(loco_codec_format(LOCO_CODEC_BF16), 1000, 128), 2000);
    cr_assert_eq(loco_quant_payload_bytes(loco_codec_format(LOCO_CODEC_INT8), 1000, 128),
                 8 * 4 + 1000);
    cr_assert_eq(loco_quant_payload_bytes(loco_codec_format(LOCO_CODEC_FP8), 1000, 128),
                 8 * 4 + 1000);
    cr_assert_eq(loco_quant_payload_bytes(loco_codec_format(LOCO_CODEC_INT4), 1001, 128),
                 8 * 4 + 501);
    cr_assert_eq(loco_quant_payload_bytes(loco_codec_format(LOCO_CODEC_FP4), 1001, 32),
                 32 * 4 + 501);
}

/* ---- nearest rounding = the nearest grid point, by brute force ---- */

static void check_nearest_block_codec(loco_codec_kind k, int block, size_t n) {
    float *x = fill(n, 11 + (uint64_t)k, true, 0.01);
    x[3] = 0.0f; /* zeros and an all-zero block */
    for (size_t i = 0; i < (size_t)block && 2 * (size_t)block < n; i++)
        x[(size_t)block + i] = 0.0f;
    uint8_t *p = quantize(k, x, NULL, n, block, false, 0);
    double grid[256];
    const int ng = grid_of(k, grid);
    const double qmax = qmax_of(k);
    size_t checked = 0;
    for (size_t b = 0; b * (size_t)block < n; b++) {
        const size_t s0 = b * (size_t)block;
        const size_t m = n - s0 < (size_t)block ? n - s0 : (size_t)block;
        double amax = 0;
        for (size_t i = 0; i < m; i++)
            amax = fmax(amax, fabs((double)x[s0 + i]));
        const double s = scale_of(p, b);
        /* the scale is fp32 amax / qmax, rounded (half an ulp) and then
         * perhaps one ulp down so that qmax * s <= amax: within one ulp,
         * 2^-23 relative */
        cr_assert(fabs(s - amax / qmax) <= 0x1p-23 * amax / qmax, "block %zu scale %g vs %g", b, s,
                  amax / qmax);
        for (size_t i = 0; i < m; i++) {
            const double v = ref_value(k, p, n, block, s0 + i);
            if (s == 0) {
                cr_assert_eq(v, 0.0);
                continue;
            }
            const double y = fabs((double)x[s0 + i]) / s;
            /* nearest grid point and the runner-up distance */
            double best = INFINITY, second = INFINITY, gbest = 0;
            for (int j = 0; j < ng; j++) {
                const double d = fabs(grid[j] - y);
                if (d < best) {
                    second = best;
                    best = d;
                    gbest = grid[j];
                } else if (d < second) {
                    second = d;
                }
            }
            /* A near tie: either side is right. The kernel rounds fp32
             * x * (qmax / amax), y here is x / s in double: two fp32
             * roundings (2^-24 each) and s's ulp (2^-23) apart, at most
             * 2^-22 y; the nearest point can differ only when the two
             * distances are within twice that. */
            if (second - best <= 0x1p-21 * y)
                continue;
            /* the same grid value times the same scale, in double: exact */
            const double want = copysign(gbest, (double)x[s0 + i]) * s;
            cr_assert(v == want, "%s element %zu: x %.9g got %.9g want %.9g", loco_codec_name(k),
                      s0 + i, (double)x[s0 + i], v, want);
            checked++;
        }
    }
    cr_assert_gt(checked, n / 2);
    free(p);
    free(x);
}

Test(compress_quant, int8_nearest_is_nearest) {
    check_nearest_block_codec(LOCO_CODEC_INT8, 128, 10007);
}
Test(compress_quant, int4_nearest_is_nearest) {
    check_nearest_block_codec(LOCO_CODEC_INT4, 64, 10007);
}
Test(compress_quant, fp8_nearest_is_nearest) {
    check_nearest_block_codec(LOCO_CODEC_FP8, 128, 10007);
}
Test(compress_quant, fp4_nearest_is_nearest) {
    check_nearest_block_codec(LOCO_CODEC_FP4, 32, 10007);
}
Test(compress_quant, odd_block_and_tail) {
    check_nearest_block_codec(LOCO_CODEC_INT4, 40, 1003);
}

Test(compress_quant, bf16_nearest_even) {
    const size_t n = 20000;
    float *x = fill(n, 5, true, 3.0);
    x[0] = 1.0f + 0x1p-8f;     /* tie: stays at 1.0 (even) */
    x[1] = 1.0f + 3 * 0x1p-8f; /* tie: goes to 1 + 2^-6 (even) */
    x[2] = -0.0f;
    x[3] = 1e-40f; /* subnormal */
    uint8_t *p = quantize(LOCO_CODEC_BF16, x, NULL, n, 128, false, 0);
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        const uint32_t lo = u & 0xffff0000U, hi = lo + 0x10000U;
        float flo, fhi;
        memcpy(&flo, &lo, 4);
        memcpy(&fhi, &hi, 4);
        const double dlo = fabs((double)x[i] - flo), dhi = fabs((double)fhi - x[i]);
        double want = dlo < dhi ? flo : dhi < dlo ? fhi : ((lo >> 16) & 1) ? fhi : flo;
        cr_assert_eq(ref_value(LOCO_CODEC_BF16, p, n, 128, i), want, "element %zu", i);
    }
    cr_assert_eq(ref_value(LOCO_CODEC_BF16, p, n, 128, 0), 1.0);
    cr_assert_eq(ref_value(LOCO_CODEC_BF16, p, n, 128, 1), 1.0 + 0x1p-6);
    free(p);
    free(x);
}

/* Exact ties with scale 1 (the block's absmax is qmax): half to even. */
static void check_ties(loco_codec_kind k, const float *x, const double *want, int n) {
    float b[128] = {0};
    b[0] = (float)qmax_of(k); /* scale exactly 1 */
    memcpy(b + 1, x, (size_t)n * sizeof *x);
    uint8_t *p = quantize(k, b, NULL, 128, 128, false, 0);
    cr_assert_eq(scale_of(p, 0), 1.0);
    for (int i = 0; i < n; i++)
        cr_assert_eq(ref_value(k, p, 128, 128, (size_t)i + 1), want[i],
                     "%s: %.9g -> %.9g, want %.9g", loco_codec_name(k), (double)x[i],
                     ref_value(k, p, 128, 128, (size_t)i + 1), want[i]);
    free(p);
}

Test(compress_quant, ties_round_to_even) {
    const float i8[] = {2.5f, 3.5f, -2.5f, -3.5f, 0.5f, 126.5f};
    const double i8w[] = {2, 4, -2, -4, 0, 126};
    check_ties(LOCO_CODEC_INT8, i8, i8w, 6);
    const float i4[] = {0.5f, 1.5f, 2.5f, -6.5f};
    const double i4w[] = {0, 2, 2, -6};
    check_ties(LOCO_CODEC_INT4, i4, i4w, 4);
    const float f8[] = {1.0625f,      1.1875f,       -1.0625f, 0x1p-10f,
                        3 * 0x1p-10f, 15 * 0x1p-10f, 400.0f,   0.9375f * 0x1p-6f};
    const double f8w[] = {1.0, 1.25, -1.0, 0, 0x1p-8, 0x1p-6, 384.0, 0x1p-6};
    check_ties(LOCO_CODEC_FP8, f8, f8w, 8);
    const float f4[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, -5.0f};
    const double f4w[] = {0, 1, 1, 2, 2, 4, 4, -4};
    check_ties(LOCO_CODEC_FP4, f4, f4w, 8);
}

Test(compress_quant, fp8_extremes) {
    /* one block spanning the whole e4m3 range, subnormals included */
    float x[128];
    for (int i = 0; i < 128; i++)
        x[i] = (i & 1 ? -1.0f : 1.0f) * ldexpf(1.0f, -9 + i / 8) * (1.0f + (float)(i % 7) / 8);
    x[0] = 448.0f; /* scale exactly 1 */
    uint8_t *p = quantize(LOCO_CODEC_FP8, x, NULL, 128, 128, false, 0);
    cr_assert_eq(scale_of(p, 0), 1.0);
    cr_assert_eq(p[4], 0x7e, "448 is code 0x7e, got 0x%02x", p[4]);
    for (int i = 0; i < 128; i++)
        cr_assert_neq(p[4 + i] & 0x7f, 0x7f, "NaN code at %d", i);
    free(p);
}

/* ---- dequantize-accumulate against double ---- */

Test(compress_quant, dequant_acc_matches_double) {
    const size_t n = 5003;
    for (int k = 0; k < LOCO_CODEC_TOPK; k++)
        for (int planes = 0; planes < 2; planes++) {
            if (planes && k != LOCO_CODEC_NONE && k != LOCO_CODEC_BF16)
                continue;
            const int block = 96;
            float *x = fill(n, 100 + (uint64_t)k, false, 2.0);
            float *dst = fill(n, 200, false, 1.0);
            float *dst0 = malloc(n * sizeof *dst0);
            memcpy(dst0, dst, n * sizeof *dst);
            uint8_t *p = quantize((loco_codec_kind)k, x, NULL, n, block, false, 0);
            /* the reference reads the plain layout: quantize it again without planes */
            const size_t bytes =
                loco_quant_payload_bytes(loco_codec_format((loco_codec_kind)k), n, block);
            uint8_t *pp = malloc(bytes);
            loco_quant_args a = {.block = block, .planes = planes};
            cr_assert_eq(loco_quant(loco_codec_format((loco_codec_kind)k), pp, x, NULL, n, &a), 0);
            const float w = 0.3f;
            loco_dequant_acc(loco_codec_format((loco_codec_kind)k), dst, pp, n, block, planes, w);
            for (size_t i = 0; i < n; i++) {
                const double v = ref_value((loco_codec_kind)k, p, n, block, i);
                const double want = (double)dst0[i] + (double)w * v;
                /* fmaf(code, w * scale, dst): w * scale rounds (2^-24 of
                 * the w v term) and the fma once (2^-24 of the sum); in
                 * the subnormal range each rounding is within 2^-150 */
                const double tol =
                    0x1p-23 * (1 + 0x1p-23) * (fabs((double)dst0[i]) + fabs(w * v)) + 0x1p-149;
                cr_assert(fabs(dst[i] - want) <= tol, "%s planes %d element %zu: %.9g vs %.9g",
                          loco_codec_name((loco_codec_kind)k), planes, i, (double)dst[i], want);
            }
            free(pp);
            free(p);
            free(dst0);
            free(dst);
            free(x);
        }
}

/* ---- round-trip error bounds ---- */

typedef struct {
    loco_codec_kind k;
    double gauss, heavy; /* bounds on ||q(x) - x|| / ||x|| */
} err_bound;

Test(compress_quant, roundtrip_error_bounds) {
    /* Gaussian bounds from the issue (int8 0.7%, int4 12.5%, fp8 2.7%);
     * FIGURES.md measured 0.65%, 11.7%, 2.4-2.6%, fp4 10.9%. Student-t(3)
     * blocks hold rare large values, so the absmax scale is coarser for
     * the integer codecs; the floating formats keep relative precision.
     * Those bounds (and fp4's) are the measured errors of this data
     * (int8 1.35%, int4 22.6%, fp4 10.9% and 15.2%) with 6-18% room: a
     * statistic, no worst case. bf16's is one: nearest-even to 8
     * significant bits errs by at most 2^-9 of each element. */
    const err_bound b[] = {
        {LOCO_CODEC_NONE, 0, 0},         {LOCO_CODEC_BF16, 0x1p-9, 0x1p-9},
        {LOCO_CODEC_INT8, 0.007, 0.016}, {LOCO_CODEC_INT4, 0.125, 0.26},
        {LOCO_CODEC_FP8, 0.027, 0.027},  {LOCO_CODEC_FP4, 0.115, 0.17},
    };
    const size_t n = 1 << 18;
    float *g = fill(n, 1, false, 1e-3);
    float *t = fill(n, 2, true, 1e-3);
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++) {
        const double eg = rel_err(b[i].k, g, n, 128), et = rel_err(b[i].k, t, n, 128);
        cr_log_info("%s: gaussian %.4f%%, student-t(3) %.4f%%", loco_codec_name(b[i].k), 100 * eg,
                    100 * et);
        cr_assert(eg <= b[i].gauss, "%s gaussian %.5f > %.5f", loco_codec_name(b[i].k), eg,
                  b[i].gauss);
        cr_assert(et <= b[i].heavy, "%s student-t %.5f > %.5f", loco_codec_name(b[i].k), et,
                  b[i].heavy);
    }
    /* sanity of the measure itself: int8 is not exact (0.003 is about half
     * its measured 0.65%) */
    cr_assert_gt(rel_err(LOCO_CODEC_INT8, g, n, 128), 0.003);
    free(g);
    free(t);
}

Test(compress_quant, non_finite_input_refused) {
    float x[300];
    for (int i = 0; i < 300; i++)
        x[i] = 1.0f;
    uint8_t p[2048];
    for (int k = 0; k < LOCO_CODEC_TOPK; k++) {
        loco_quant_args a = {.block = 128};
        x[257] = NAN;
        cr_assert_eq(loco_quant(loco_codec_format((loco_codec_kind)k), p, x, NULL, 300, &a),
                     LOCO_EINVAL, "%s NaN", loco_codec_name((loco_codec_kind)k));
        x[257] = -INFINITY;
        cr_assert_eq(loco_quant(loco_codec_format((loco_codec_kind)k), p, x, NULL, 300, &a),
                     LOCO_EINVAL, "%s inf", loco_codec_name((loco_codec_kind)k));
        x[257] = 1.0f;
        cr_assert_eq(loco_quant(loco_codec_format((loco_codec_kind)k), p, x, NULL, 300, &a), 0);
    }
    /* FLT_MAX would round to inf in bf16: saturates at the largest bf16 */
    x[0] = FLT_MAX;
    x[1] = -FLT_MAX;
    loco_quant_args a = {.block = 128};
    cr_assert_eq(loco_quant(loco_codec_format(LOCO_CODEC_BF16), p, x, NULL, 300, &a), 0);
    cr_assert_eq(p[1], 0x7f);
    cr_assert_eq(p[0], 0x7f);
    cr_assert_eq(p[3], 0xff);
    cr_assert_eq(p[2], 0x7f);
    /* a block at the top of the range decodes finite: the scale is rounded
     * down so that qmax * scale stays <= absmax */
    for (int i = 0; i < 300; i++)
        x[i] = (i & 1) ? -FLT_MAX : FLT_MAX / (float)(1 + i % 5);
    for (int k = LOCO_CODEC_INT8; k < LOCO_CODEC_TOPK; k++) {
        cr_assert_eq(loco_quant(loco_codec_format((loco_codec_kind)k), p, x, NULL, 300, &a), 0);
        cr_assert(loco_quant_payload_ok(loco_codec_format((loco_codec_kind)k), p, 300, 128));
        float y[300] = {0};
        loco_dequant_acc(loco_codec_format((loco_codec_kind)k), y, p, 300, 128, false, 1.0f);
        for (int i = 0; i < 300; i++)
            cr_assert(isfinite(y[i]), "%s element %d", loco_codec_name((loco_codec_kind)k), i);
    }
    /* a block too tiny to scale decodes to zero, not to garbage */
    for (int i = 0; i < 300; i++)
        x[i] = (i & 1) ? 1e-45f : 0.0f;
    for (int k = LOCO_CODEC_INT8; k < LOCO_CODEC_TOPK; k++) {
        cr_assert_eq(loco_quant(loco_codec_format((loco_codec_kind)k), p, x, NULL, 300, &a), 0);
        cr_assert(loco_quant_payload_ok(loco_codec_format((loco_codec_kind)k), p, 300, 128));
        float y[300] = {0};
        loco_dequant_acc(loco_codec_format((loco_codec_kind)k), y, p, 300, 128, false, 1.0f);
        for (int i = 0; i < 300; i++) /* flushed: qmax / amax overflows */
            cr_assert(y[i] == 0.0f, "%s element %d: %g", loco_codec_name((loco_codec_kind)k), i,
                      (double)y[i]);
    }
}

/* ---- stochastic rounding ---- */

/* The two representable neighbours of x (sign included) for scale s. */
static void neighbours(loco_codec_kind k, float x, double s, double *a, double *b) {
    if (k == LOCO_CODEC_BF16) {
        uint32_t u;
        memcpy(&u, &x, 4);
        const uint32_t lo = u & 0xffff0000U, hi = lo + 0x10000U;
        float flo, fhi;
        memcpy(&flo, &lo, 4);
        memcpy(&fhi, &hi, 4);
        *a = flo;
        *b = lo == u ? flo : fhi;
        return;
    }
    double grid[256];
    const int ng = grid_of(k, grid);
    const double y = fabs((double)x) / s;
    int j = 0;
    while (j + 1 < ng && grid[j + 1] <= y)
        j++;
    const double ga = grid[j], gb = (ga == y || j + 1 == ng) ? ga : grid[j + 1];
    *a = copysign(ga * s, (double)x);
    *b = copysign(gb * s, (double)x);
}

/* Within 2^-21 relative: the kernel's fp32 x * (qmax / amax) and this
 * file's double x / s differ by at most 2^-22 (see
 * check_nearest_block_codec), which can put x on either side of a grid
 * point that near. */
static bool near(double v, double w) {
    return fabs(v - w) <= 0x1p-21 * fabs(w);
}

/* Over many draws the mean decoded value of every element converges to the
 * element: every draw is one of its two neighbours, and |mean error| stays
 * within 6 standard errors of a two-point draw over the neighbours' gap. */
static void check_unbiased(loco_codec_kind k) {
    const size_t n = 512;
    const int draws = 1500, block = 128;
    float *x = fill(n, 77, false, 1.0);
    double *sum = calloc(n, sizeof *sum), *lo = malloc(n * sizeof *lo),
           *hi = malloc(n * sizeof *hi);
    double near_bias = 0;
    uint8_t *pn = quantize(k, x, NULL, n, block, false, 0);
    for (size_t i = 0; i < n; i++) {
        near_bias += fabs(ref_value(k, pn, n, block, i) - x[i]);
        const double s = k == LOCO_CODEC_BF16 ? 1.0 : scale_of(pn, i / block);
        neighbours(k, x[i], s, &lo[i], &hi[i]);
    }
    free(pn);
    size_t off_grid = 0;
    for (int d = 0; d < draws; d++) {
        uint8_t *p = quantize(k, x, NULL, n, block, true, 0x1234567ULL * (uint64_t)(d + 1));
        for (size_t i = 0; i < n; i++) {
            const double v = ref_value(k, p, n, block, i);
            sum[i] += v;
            /* x within float rounding of a grid point may land either side */
            off_grid +=
                !near(v, lo[i]) && !near(v, hi[i]) && !(near(x[i], lo[i]) || near(x[i], hi[i]));
        }
        free(p);
    }
    cr_assert_eq(off_grid, 0, "%s: %zu draws not on a neighbour", loco_codec_name(k), off_grid);
    double total = 0, bias = 0;
    for (size_t i = 0; i < n; i++) {
        const double mean_err = sum[i] / draws - x[i];
        const double se = fabs(hi[i] - lo[i]) / 2 / sqrt((double)draws);
        /* 6 standard errors (a false alarm about 2e-9 an element), plus
         * the kernel's own offset: it rounds fp32 x * (qmax / amax), up
         * to 2^-22 of x from x / s (see near), with 24 random bits: a
         * bias of at most 2^-24 of the gap */
        cr_assert(fabs(mean_err) <= 6 * se + 0x1p-22 * fabs(x[i]) + 0x1p-24 * fabs(hi[i] - lo[i]),
                  "%s element %zu: mean error %.3g, standard error %.3g", loco_codec_name(k), i,
                  mean_err, se);
        total += mean_err;
        bias += fabs(mean_err);
    }
    /* the average error over all elements is far below nearest rounding's
     * (measured 30-35 times below; a fifth leaves room for the draws) */
    cr_assert_lt(bias, near_bias / 5, "%s: |bias| %.3g vs nearest %.3g", loco_codec_name(k), bias,
                 near_bias);
    cr_log_info("%s: mean error %.3g, sum |bias| %.3g (nearest %.3g)", loco_codec_name(k),
                total / n, bias, near_bias);
    free(sum);
    free(lo);
    free(hi);
    free(x);
}

Test(compress_quant, stochastic_unbiased_int8) {
    check_unbiased(LOCO_CODEC_INT8);
}
Test(compress_quant, stochastic_unbiased_int4) {
    check_unbiased(LOCO_CODEC_INT4);
}
Test(compress_quant, stochastic_unbiased_fp8) {
    check_unbiased(LOCO_CODEC_FP8);
}
Test(compress_quant, stochastic_unbiased_fp4) {
    check_unbiased(LOCO_CODEC_FP4);
}
Test(compress_quant, stochastic_unbiased_bf16) {
    check_unbiased(LOCO_CODEC_BF16);
}

Test(compress_quant, stochastic_depends_on_key_only) {
    const size_t n = 4096;
    float *x = fill(n, 3, false, 1.0);
    uint8_t *a = quantize(LOCO_CODEC_INT8, x, NULL, n, 128, true, 42);
    uint8_t *b = quantize(LOCO_CODEC_INT8, x, NULL, n, 128, true, 42);
    uint8_t *c = quantize(LOCO_CODEC_INT8, x, NULL, n, 128, true, 43);
    const size_t bytes = loco_quant_payload_bytes(loco_codec_format(LOCO_CODEC_INT8), n, 128);
    cr_assert_eq(memcmp(a, b, bytes), 0);
    cr_assert_neq(memcmp(a, c, bytes), 0);
    free(a);
    free(b);
    free(c);
    free(x);
}

/* ---- error feedback inside the kernel ---- */

Test(compress_quant, error_feedback_records_the_loss) {
    const size_t n = 3000;
    for (int k = 1; k < LOCO_CODEC_TOPK; k++) {
        float *x = fill(n, 9, false, 1.0);
        float *ef = fill(n, 10, false, 0.01);
        float *ef0 = malloc(n * sizeof *ef0);
        memcpy(ef0, ef, n * sizeof *ef);
        uint8_t *p = quantize((loco_codec_kind)k, x, ef, n, 128, false, 0);
        for (size_t i = 0; i < n; i++) {
            /* x + ef_old = decoded + ef_new */
            const double lhs = (double)x[i] + ef0[i];
            const double rhs = ref_value((loco_codec_kind)k, p, n, 128, i) + ef[i];
            /* the kernel's three fp32 roundings: x + ef_old (2^-24 of
             * lhs), code * scale (2^-24 of the decoded value, at most
             * |lhs| + |ef_new|) and the difference (2^-24 of ef_new) */
            const double tol = 0x1p-23 * (1 + 0x1p-22) * (fabs(lhs) + fabs(ef[i])) + 0x1p-149;
            cr_assert(fabs(lhs - rhs) <= tol, "%s element %zu: %.9g vs %.9g",
                      loco_codec_name((loco_codec_kind)k), i, lhs, rhs);
        }
        free(p);
        free(ef0);
        free(ef);
        free(x);
    }
}

/* ---- payload checks ---- */

Test(compress_quant, payload_ok_rejects_bad_scales_and_nan_codes) {
    float x[256];
    for (int i = 0; i < 256; i++)
        x[i] = (float)i - 100.0f;
    for (int k = LOCO_CODEC_INT8; k < LOCO_CODEC_TOPK; k++) {
        uint8_t *p = quantize((loco_codec_kind)k, x, NULL, 256, 128, false, 0);
        cr_assert(loco_quant_payload_ok(loco_codec_format((loco_codec_kind)k), p, 256, 128));
        const float bad[] = {NAN, INFINITY, -1.0f, FLT_MAX, FLT_MAX / 5.9f};
        for (int j = 0; j < 5; j++) {
            float keep;
            memcpy(&keep, p + 4, 4);
            memcpy(p + 4, &bad[j], 4);
            cr_assert_not(loco_quant_payload_ok(loco_codec_format((loco_codec_kind)k), p, 256, 128),
                          "%s scale %g", loco_codec_name((loco_codec_kind)k), (double)bad[j]);
            memcpy(p + 4, &keep, 4);
        }
        free(p);
    }
    uint8_t *p = quantize(LOCO_CODEC_FP8, x, NULL, 256, 128, false, 0);
    p[8 + 200] = 0xff;
    cr_assert_not(loco_quant_payload_ok(loco_codec_format(LOCO_CODEC_FP8), p, 256, 128));
    p[8 + 200] = 0x7f;
    cr_assert_not(loco_quant_payload_ok(loco_codec_format(LOCO_CODEC_FP8), p, 256, 128));
    free(p);
}
