/* Element loops of the pseudo-gradient codecs (declared in
 * kernels/kernels.h, "pseudo-gradient quantizers"): quantize with optional error
 * feedback and stochastic rounding, dequantize-accumulate, payload checks.
 *
 * Written as plain loops over one scale block that GCC vectorises at -O3
 * (AVX2 with -march=x86-64-v3, SSE with v2): absmax on the float bits as
 * unsigned integers, rounding with rintf (vroundps) or truncation of a
 * positive value, minifloat conversion with integer arithmetic on the fp32
 * bits, random bits from a counter hash so no state crosses elements. */

#include "core/core.h"
#include "kernels/kernels.h"

#include <float.h>
#include <math.h>
#include <string.h>

#define ALWAYS_INLINE static inline __attribute__((always_inline))

ALWAYS_INLINE uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

ALWAYS_INLINE float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

ALWAYS_INLINE float load_f32(const uint8_t *p) {
    float f;
    memcpy(&f, p, sizeof f);
    return f;
}

ALWAYS_INLINE void store_f32(uint8_t *p, float f) {
    memcpy(p, &f, sizeof f);
}

/* lowbias32 (Wellons): a 32-bit mixer with good avalanche. */
ALWAYS_INLINE uint32_t mix32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    x ^= x >> 16;
    return x;
}

/* 32 random bits for element i of a stream keyed by (k0, k1). */
ALWAYS_INLINE uint32_t sr_bits(uint32_t k0, uint32_t k1, uint32_t i) {
    return mix32(mix32(i ^ k0) + k1);
}

/* Uniform in [0, 1) from the top 24 bits. */
ALWAYS_INLINE float sr_unit(uint32_t r) {
    return (float)(r >> 8) * 0x1p-24f;
}

/* Largest |x + ef| of a block as fp32 bits (positive floats order like
 * their bits). >= 0x7f800000 means a non-finite value. */
ALWAYS_INLINE uint32_t absmax_bits(const float *restrict x, const float *restrict ef, size_t m,
                                   const bool has_ef) {
    uint32_t mx = 0;
    for (size_t i = 0; i < m; i++) {
        const float v = has_ef ? x[i] + ef[i] : x[i];
        const uint32_t u = f2u(v) & 0x7fffffffU;
        mx = u > mx ? u : mx;
    }
    return mx;
}

static size_t div_up(size_t a, size_t b) {
    return (a + b - 1) / b;
}

size_t loco_quant_payload_bytes(loco_quant_format k, size_t n, int block) {
    const size_t scales = 4 * div_up(n, (size_t)block);
    switch (k) {
    case LOCO_QFMT_NONE: return 4 * n;
    case LOCO_QFMT_BF16: return 2 * n;
    case LOCO_QFMT_INT8:
    case LOCO_QFMT_FP8: return scales + n;
    case LOCO_QFMT_INT4:
    case LOCO_QFMT_FP4: return scales + div_up(n, 2);
    default: return 0;
    }
}

/* ------------------------------------------------------------ minifloats */

/* Code of y >= 0 (already divided by the scale) in a minifloat with M
 * mantissa bits and exponent bias BIAS, capped at maxcode. Nearest-even, or
 * stochastic with random bits r: the discarded fp32 mantissa bits get r
 * added, which rounds up with probability equal to the discarded fraction.
 * Below the smallest normal the grid is uniform (step 2^(1-BIAS-M)). */
ALWAYS_INLINE uint32_t minifloat_code(float y, uint32_t r, const int M, const int BIAS,
                                      const uint32_t maxcode, const bool stochastic) {
    const int sh = 23 - M;
    const uint32_t a = f2u(y);
    uint32_t t;
    if (stochastic)
        t = a + (r & ((1U << sh) - 1));
    else
        t = a + ((1U << (sh - 1)) - 1) + ((a >> sh) & 1);
    const uint32_t normal = (t >> sh) - ((uint32_t)(127 - BIAS) << M);
    /* subnormal step 2^(1-BIAS-M): y * 2^(BIAS+M-1) counts steps */
    const float steps = y * (float)(1 << (BIAS + M - 1));
    uint32_t sub;
    if (stochastic)
        sub = (uint32_t)(int32_t)(steps + sr_unit(r));
    else
        sub = (uint32_t)(int32_t)rintf(steps);
    const uint32_t min_normal_bits = (uint32_t)(127 + 1 - BIAS) << 23;
    /* selects as masks so that the loops stay branch-free (vectorised) */
    const uint32_t is_sub = 0U - (uint32_t)(a < min_normal_bits);
    const uint32_t c = (sub & is_sub) | (normal & ~is_sub);
    return c < maxcode ? c : maxcode;
}

/* Value of a minifloat magnitude code (no sign bit). */
ALWAYS_INLINE float minifloat_value(uint32_t c, const int M, const int BIAS) {
    const uint32_t normal = (c << (23 - M)) + ((uint32_t)(127 - BIAS) << 23);
    const float sub = (float)(int32_t)c * (1.0f / (float)(1 << (BIAS + M - 1)));
    const uint32_t is_sub = 0U - (uint32_t)(c < (1U << M));
    return u2f((f2u(sub) & is_sub) | (normal & ~is_sub));
}

/* e4m3: M = 3, bias 7, max 448 = code 0x7e; 0x7f is NaN.
 * e2m1: M = 1, bias 1, max 6 = code 7. */
#define FP8_M 3
#define FP8_BIAS 7
#define FP8_MAXCODE 0x7eU
#define FP4_M 1
#define FP4_BIAS 1
#define FP4_MAXCODE 0x7U

/* ------------------------------------------------------------ fp32 / bf16 */

static int quant_f32(uint8_t *restrict out, const float *restrict x, size_t n, bool planes) {
    uint32_t mx = 0;
    if (!planes) {
        for (size_t i = 0; i < n; i++) {
            const uint32_t u = f2u(x[i]);
            const uint32_t au = u & 0x7fffffffU;
            mx = au > mx ? au : mx;
            memcpy(out + 4 * i, &u, 4);
        }
    } else {
        for (size_t i = 0; i < n; i++) {
            const uint32_t u = f2u(x[i]);
            const uint32_t au = u & 0x7fffffffU;
            mx = au > mx ? au : mx;
            out[i] = (uint8_t)u;
            out[n + i] = (uint8_t)(u >> 8);
            out[2 * n + i] = (uint8_t)(u >> 16);
            out[3 * n + i] = (uint8_t)(u >> 24);
        }
    }
    return mx >= 0x7f800000U ? LOCO_EINVAL : 0;
}

ALWAYS_INLINE uint32_t bf16_round(uint32_t u, uint32_t r, const bool stochastic) {
    if (stochastic)
        return (u + (r & 0xffffU)) >> 16;
    return (u + 0x7fffU + ((u >> 16) & 1)) >> 16;
}

ALWAYS_INLINE uint32_t quant_bf16_loop(uint8_t *restrict out, const float *restrict x,
                                       float *restrict ef, size_t n, bool planes, uint32_t k0,
                                       uint32_t k1, const bool has_ef, const bool stochastic) {
    uint32_t mx = 0;
    for (size_t i = 0; i < n; i++) {
        const float v = has_ef ? x[i] + ef[i] : x[i];
        const uint32_t u = f2u(v);
        const uint32_t au = u & 0x7fffffffU;
        mx = au > mx ? au : mx;
        const uint32_t r = stochastic ? sr_bits(k0, k1, (uint32_t)i) : 0;
        uint32_t h = bf16_round(u, r, stochastic);
        /* a finite value near FLT_MAX that rounds to inf saturates at the
         * largest bf16 (a non-finite input is refused through mx anyway) */
        h -= (h & 0x7fffU) == 0x7f80U;
        if (has_ef)
            ef[i] = v - u2f(h << 16);
        if (planes) {
            out[i] = (uint8_t)h;
            out[n + i] = (uint8_t)(h >> 8);
        } else {
            const uint16_t h16 = (uint16_t)h;
            memcpy(out + 2 * i, &h16, 2);
        }
    }
    return mx;
}

static int quant_bf16(uint8_t *out, const float *x, float *ef, size_t n, const loco_quant_args *a) {
    const uint32_t k0 = (uint32_t)a->key, k1 = (uint32_t)(a->key >> 32);
    uint32_t mx;
    if (ef && a->stochastic)
        mx = quant_bf16_loop(out, x, ef, n, a->planes, k0, k1, true, true);
    else if (ef)
        mx = quant_bf16_loop(out, x, ef, n, a->planes, k0, k1, true, false);
    else if (a->stochastic)
        mx = quant_bf16_loop(out, x, ef, n, a->planes, k0, k1, false, true);
    else
        mx = quant_bf16_loop(out, x, ef, n, a->planes, k0, k1, false, false);
    return mx >= 0x7f800000U ? LOCO_EINVAL : 0;
}

/* ------------------------------------------------------- block quantizers */

/* Integer code in [-lim, lim] of v * inv. */
ALWAYS_INLINE int32_t int_code(float y, uint32_t r, int32_t lim, const bool stochastic) {
    int32_t q;
    if (stochastic) /* floor(y + u) by truncating a positive number */
        q = (int32_t)((y + (float)(lim + 1)) + sr_unit(r)) - (lim + 1);
    else
        q = (int32_t)rintf(y);
    q = q > lim ? lim : q;
    return q < -lim ? -lim : q;
}

/* One block of symmetric integer codes in [-lim, lim] (127 for int8, 7 for
 * int4, whose codes the caller then packs) and its EF. */
ALWAYS_INLINE void int_block(int8_t *restrict q, const float *restrict x, float *restrict ef,
                             size_t m, float inv, float scale, uint32_t k0, uint32_t k1,
                             uint32_t base, const bool has_ef, const bool stochastic,
                             const int32_t lim) {
    for (size_t i = 0; i < m; i++) {
        const float v = has_ef ? x[i] + ef[i] : x[i];
        const uint32_t r = stochastic ? sr_bits(k0, k1, base + (uint32_t)i) : 0;
        const int32_t c = int_code(v * inv, r, lim, stochastic);
        q[i] = (int8_t)c;
        if (has_ef)
            ef[i] = v - (float)c * scale;
    }
}

ALWAYS_INLINE void fp8_block(uint8_t *restrict q, const float *restrict x, float *restrict ef,
                             size_t m, float inv, float scale, uint32_t k0, uint32_t k1,
                             uint32_t base, const bool has_ef, const bool stochastic) {
    for (size_t i = 0; i < m; i++) {
        const float v = has_ef ? x[i] + ef[i] : x[i];
        const uint32_t r = stochastic ? sr_bits(k0, k1, base + (uint32_t)i) : 0;
        const float y = v * inv;
        const uint32_t sign = f2u(y) & 0x80000000U;
        const uint32_t c =
            minifloat_code(u2f(f2u(y) & 0x7fffffffU), r, FP8_M, FP8_BIAS, FP8_MAXCODE, stochastic);
        q[i] = (uint8_t)(c | (sign >> 24));
        if (has_ef) {
            const float d = u2f(f2u(minifloat_value(c, FP8_M, FP8_BIAS)) | sign);
            ef[i] = v - d * scale;
        }
    }
}

ALWAYS_INLINE void fp4_block(int8_t *restrict tmp, const float *restrict x, float *restrict ef,
                             size_t m, float inv, float scale, uint32_t k0, uint32_t k1,
                             uint32_t base, const bool has_ef, const bool stochastic) {
    for (size_t i = 0; i < m; i++) {
        const float v = has_ef ? x[i] + ef[i] : x[i];
        const uint32_t r = stochastic ? sr_bits(k0, k1, base + (uint32_t)i) : 0;
        const float y = v * inv;
        const uint32_t sign = f2u(y) & 0x80000000U;
        const uint32_t c =
            minifloat_code(u2f(f2u(y) & 0x7fffffffU), r, FP4_M, FP4_BIAS, FP4_MAXCODE, stochastic);
        tmp[i] = (int8_t)(c | (sign >> 28));
        if (has_ef) {
            const float d = u2f(f2u(minifloat_value(c, FP4_M, FP4_BIAS)) | sign);
            ef[i] = v - d * scale;
        }
    }
}

/* Two codes per byte: element 2j in the low nibble. m may be odd only for
 * the last block; its final high nibble is 0. */
static void pack4(uint8_t *restrict out, const int8_t *restrict tmp, size_t m) {
    const size_t pairs = m / 2;
    for (size_t j = 0; j < pairs; j++)
        out[j] = (uint8_t)((tmp[2 * j] & 0xf) | ((tmp[2 * j + 1] & 0xf) << 4));
    if (m & 1)
        out[pairs] = (uint8_t)(tmp[m - 1] & 0xf);
}

/* Quantizes all blocks of one block-scaled codec with the variant fixed at
 * compile time (the four calls below let GCC specialise each loop). */
ALWAYS_INLINE int quant_blocks(loco_quant_format k, uint8_t *restrict payload,
                               const float *restrict x, float *restrict ef, size_t n,
                               const loco_quant_args *a, const bool has_ef, const bool stochastic) {
    const size_t B = (size_t)a->block, nb = div_up(n, B);
    uint8_t *scales = payload;
    uint8_t *codes = payload + 4 * nb;
    const uint32_t k0 = (uint32_t)a->key, k1 = (uint32_t)(a->key >> 32);
    float qmax = 127.0f;
    if (k == LOCO_QFMT_INT4)
        qmax = 7.0f;
    else if (k == LOCO_QFMT_FP8)
        qmax = 448.0f;
    else if (k == LOCO_QFMT_FP4)
        qmax = 6.0f;
    int8_t tmp[LOCO_QUANT_BLOCK_MAX];
    for (size_t b = 0; b < nb; b++) {
        const size_t s = b * B, m = n - s < B ? n - s : B;
        const float *xb = x + s;
        float *eb = has_ef ? ef + s : NULL;
        const uint32_t mb = absmax_bits(xb, eb, m, has_ef);
        if (mb >= 0x7f800000U)
            return LOCO_EINVAL;
        const float amax = u2f(mb);
        float scale = 0.0f, inv = 0.0f; /* all zero, or too tiny to scale: flush */
        if (mb != 0 && qmax / amax <= FLT_MAX) {
            scale = amax / qmax;
            inv = qmax / amax;
            /* round the scale down so that qmax * scale never exceeds the
             * block's absmax (nor FLT_MAX: no decoded infinity) */
            if ((double)scale * qmax > (double)amax)
                scale = u2f(f2u(scale) - 1);
        }
        store_f32(scales + 4 * b, scale);
        const uint32_t base = (uint32_t)s;
        switch (k) {
        case LOCO_QFMT_INT8:
            int_block((int8_t *)codes + s, xb, eb, m, inv, scale, k0, k1, base, has_ef,
                      stochastic, 127);
            break;
        case LOCO_QFMT_FP8:
            fp8_block(codes + s, xb, eb, m, inv, scale, k0, k1, base, has_ef, stochastic);
            break;
        case LOCO_QFMT_INT4:
            int_block(tmp, xb, eb, m, inv, scale, k0, k1, base, has_ef, stochastic, 7);
            pack4(codes + s / 2, tmp, m);
            break;
        case LOCO_QFMT_FP4:
            fp4_block(tmp, xb, eb, m, inv, scale, k0, k1, base, has_ef, stochastic);
            pack4(codes + s / 2, tmp, m);
            break;
        default: return LOCO_EINVAL;
        }
    }
    return 0;
}

#define QUANT_VARIANTS(K)                                                                          \
    static int quant_##K(uint8_t *payload, const float *x, float *ef, size_t n,                    \
                         const loco_quant_args *a) {                                               \
        const loco_quant_format k = LOCO_QFMT_##K;                                                 \
        if (ef && a->stochastic)                                                                   \
            return quant_blocks(k, payload, x, ef, n, a, true, true);                              \
        if (ef)                                                                                    \
            return quant_blocks(k, payload, x, ef, n, a, true, false);                             \
        if (a->stochastic)                                                                         \
            return quant_blocks(k, payload, x, NULL, n, a, false, true);                           \
        return quant_blocks(k, payload, x, NULL, n, a, false, false);                              \
    }
QUANT_VARIANTS(INT8)
QUANT_VARIANTS(INT4)
QUANT_VARIANTS(FP8)
QUANT_VARIANTS(FP4)
#undef QUANT_VARIANTS

int loco_quant(loco_quant_format k, uint8_t *payload, const float *x, float *ef, size_t n,
               const loco_quant_args *a) {
    switch (k) {
    case LOCO_QFMT_NONE: return quant_f32(payload, x, n, a->planes);
    case LOCO_QFMT_BF16: return quant_bf16(payload, x, ef, n, a);
    case LOCO_QFMT_INT8: return quant_INT8(payload, x, ef, n, a);
    case LOCO_QFMT_INT4: return quant_INT4(payload, x, ef, n, a);
    case LOCO_QFMT_FP8: return quant_FP8(payload, x, ef, n, a);
    case LOCO_QFMT_FP4: return quant_FP4(payload, x, ef, n, a);
    default: return LOCO_EINVAL;
    }
}

/* ------------------------------------------------------ dequantize + acc */

static void deq_f32(float *restrict dst, const uint8_t *restrict in, size_t n, bool planes,
                    float w) {
    if (!planes) {
        for (size_t i = 0; i < n; i++)
            dst[i] = fmaf(load_f32(in + 4 * i), w, dst[i]);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        const uint32_t u = (uint32_t)in[i] | (uint32_t)in[n + i] << 8 |
                           (uint32_t)in[2 * n + i] << 16 | (uint32_t)in[3 * n + i] << 24;
        dst[i] = fmaf(u2f(u), w, dst[i]);
    }
}

static void deq_bf16(float *restrict dst, const uint8_t *restrict in, size_t n, bool planes,
                     float w) {
    if (!planes) {
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, in + 2 * i, 2);
            dst[i] = fmaf(u2f((uint32_t)h << 16), w, dst[i]);
        }
        return;
    }
    for (size_t i = 0; i < n; i++) {
        const uint32_t h = (uint32_t)in[i] | (uint32_t)in[n + i] << 8;
        dst[i] = fmaf(u2f(h << 16), w, dst[i]);
    }
}

ALWAYS_INLINE float fp8_decode(uint32_t b) {
    const float v = minifloat_value(b & 0x7fU, FP8_M, FP8_BIAS);
    return u2f(f2u(v) | (b & 0x80U) << 24);
}

ALWAYS_INLINE float fp4_decode(uint32_t c) {
    const float v = minifloat_value(c & 0x7U, FP4_M, FP4_BIAS);
    return u2f(f2u(v) | (c & 0x8U) << 28);
}

static void deq_blocks(loco_quant_format k, float *restrict dst, const uint8_t *restrict payload,
                       size_t n, int block, float w) {
    const size_t B = (size_t)block, nb = div_up(n, B);
    const uint8_t *codes = payload + 4 * nb;
    for (size_t b = 0; b < nb; b++) {
        const size_t s = b * B, m = n - s < B ? n - s : B;
        const float ws = w * load_f32(payload + 4 * b);
        float *restrict d = dst + s;
        switch (k) {
        case LOCO_QFMT_INT8: {
            const int8_t *q = (const int8_t *)codes + s;
            for (size_t i = 0; i < m; i++)
                d[i] = fmaf((float)q[i], ws, d[i]);
            break;
        }
        case LOCO_QFMT_FP8: {
            const uint8_t *q = codes + s;
            for (size_t i = 0; i < m; i++)
                d[i] = fmaf(fp8_decode(q[i]), ws, d[i]);
            break;
        }
        case LOCO_QFMT_INT4: {
            const uint8_t *q = codes + s / 2;
            for (size_t j = 0; j < m / 2; j++) {
                const int32_t lo = (int32_t)((q[j] & 0xfU) ^ 8U) - 8;
                const int32_t hi = (int32_t)((q[j] >> 4) ^ 8U) - 8;
                d[2 * j] = fmaf((float)lo, ws, d[2 * j]);
                d[2 * j + 1] = fmaf((float)hi, ws, d[2 * j + 1]);
            }
            if (m & 1)
                d[m - 1] = fmaf((float)((int32_t)((q[m / 2] & 0xfU) ^ 8U) - 8), ws, d[m - 1]);
            break;
        }
        case LOCO_QFMT_FP4: {
            const uint8_t *q = codes + s / 2;
            for (size_t j = 0; j < m / 2; j++) {
                d[2 * j] = fmaf(fp4_decode(q[j] & 0xfU), ws, d[2 * j]);
                d[2 * j + 1] = fmaf(fp4_decode(q[j] >> 4), ws, d[2 * j + 1]);
            }
            if (m & 1)
                d[m - 1] = fmaf(fp4_decode(q[m / 2] & 0xfU), ws, d[m - 1]);
            break;
        }
        default: return;
        }
    }
}

void loco_dequant_acc(loco_quant_format k, float *dst, const uint8_t *payload, size_t n, int block,
                      bool planes, float weight) {
    switch (k) {
    case LOCO_QFMT_NONE: deq_f32(dst, payload, n, planes, weight); return;
    case LOCO_QFMT_BF16: deq_bf16(dst, payload, n, planes, weight); return;
    case LOCO_QFMT_INT8: /* fallthrough */
    case LOCO_QFMT_INT4:
    case LOCO_QFMT_FP8:
    case LOCO_QFMT_FP4: deq_blocks(k, dst, payload, n, block, weight); return;
    default: return;
    }
}

/* ---------------------------------------------------------------- checks */

/* Bits of the largest scale s with qmax * s <= FLT_MAX: larger ones would
 * decode to infinity. Non-negative floats order like their bits. */
static uint32_t max_scale_bits(double qmax) {
    float s = FLT_MAX / (float)qmax;
    while ((double)s * qmax > (double)FLT_MAX)
        s = u2f(f2u(s) - 1);
    return f2u(s);
}

bool loco_quant_payload_ok(loco_quant_format k, const uint8_t *payload, size_t n, int block) {
    if (k == LOCO_QFMT_NONE || k == LOCO_QFMT_BF16)
        return true;
    if (k >= LOCO_QFMT_COUNT || block <= 0)
        return false;
    const double qmax = k == LOCO_QFMT_INT8   ? 127
                        : k == LOCO_QFMT_INT4 ? 7
                        : k == LOCO_QFMT_FP8  ? 448
                                              : 6;
    const uint32_t max_bits = max_scale_bits(qmax);
    const size_t nb = div_up(n, (size_t)block);
    uint32_t bad = 0;
    for (size_t b = 0; b < nb; b++) { /* 0 <= scale <= max: sign bit set is big */
        uint32_t u;
        memcpy(&u, payload + 4 * b, 4);
        bad |= u > max_bits;
    }
    if (k == LOCO_QFMT_FP8) {
        const uint8_t *q = payload + 4 * nb;
        for (size_t i = 0; i < n; i++)
            bad |= (q[i] & 0x7fU) == 0x7fU;
    }
    return !bad;
}

/* ------------------------------------------------- the outer step's loops
 * (outer/outer.c's host path and the CUDA twins of its device mode). */

void loco_sub(float *restrict out, const float *restrict a, const float *restrict b, size_t n) {
    for (size_t i = 0; i < n; i++)
        out[i] = a[i] - b[i];
}

double loco_share_sumsq(const float *restrict now, const float *restrict before, size_t n,
                        double scale, bool *nonfinite) {
    bool bad = false;
    double total = 0;
    for (size_t p0 = 0; p0 < n; p0 += LOCO_SHARE_PART) {
        const size_t p1 = p0 + LOCO_SHARE_PART < n ? p0 + LOCO_SHARE_PART : n;
        double ss = 0;
        for (size_t i = p0; i < p1; i++) {
            bad |= !isfinite(now[i]);
            const double d = ((double)now[i] - (double)before[i]) * scale;
            ss += d * d;
        }
        total += ss;
    }
    *nonfinite = bad || !isfinite(total);
    return total;
}

void loco_outer_update(float *restrict theta_out, float *restrict mom_out,
                       float *restrict theta_local, const float *restrict theta,
                       const float *restrict mom, const float *restrict avg, size_t n, float lr,
                       float mu, bool nesterov) {
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) {
        const float g = avg[i];
        float t = theta[i];
        if (nesterov) {
            const float mm = mu * mom[i] + g;
            mom_out[i] = mm;
            t -= lr * (g + mu * mm);
        } else {
            mom_out[i] = mom[i];
            t -= g;
        }
        theta_out[i] = t;
        theta_local[i] = t;
    }
}
