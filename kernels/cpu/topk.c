/* Top-k sparsification with low-bit values (declared in kernels/kernels.h,
 * "top-k sparsification"; the CUDA twin is kernels/cuda/topk.cu).
 *
 * The k-th largest |v| is found by a radix select on the fp32 bits of |v|
 * (non-negative floats order like their bits): three histogram passes of
 * 11, 10 and 10 bits, no sort and no scratch beyond one histogram, and the
 * same answer on any machine. A last pass in index order emits every
 * element above that threshold and the first ones equal to it, so ties go
 * to the lower index and the indices come out increasing. */

#include "core/core.h"
#include "kernels/kernels.h"

#include <float.h>
#include <math.h>
#include <string.h>

static uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static size_t div_up(size_t a, size_t b) {
    return (a + b - 1) / b;
}

static bool bits_ok(int bits) {
    return bits == 2 || bits == 4 || bits == 8;
}

size_t loco_topk_index_bytes(size_t n, size_t k, int *layout, int *low) {
    int L = 0;
    while (L < 31 && (k << (L + 1)) <= n)
        L++;
    const size_t ef = div_up(k * (size_t)L, 8) + div_up(((n - 1) >> L) + k, 8);
    const size_t bitmap = div_up(n, 8);
    const bool use_bitmap = bitmap <= ef;
    if (layout)
        *layout = use_bitmap;
    if (low)
        *low = L;
    return use_bitmap ? bitmap : ef;
}

size_t loco_topk_payload_bytes(size_t n, size_t k, int bits) {
    if (k == 0 || k > n || n > UINT32_MAX || !bits_ok(bits))
        return 0;
    return LOCO_TOPK_HEADER + loco_topk_index_bytes(n, k, NULL, NULL) + div_up(k * (size_t)bits, 8);
}

size_t loco_topk_payload_max(size_t n) {
    /* the bitmap bounds any index section, 8-bit codes any code section */
    return LOCO_TOPK_HEADER + div_up(n, 8) + n;
}

size_t loco_topk_work_bytes(size_t k) {
    return 64 + 4 * k + k;
}

/* |v| of element i as fp32 bits. */
static inline uint32_t key_of(const float *x, const float *ef, size_t i, float *v) {
    *v = ef ? x[i] + ef[i] : x[i];
    return f2u(*v) & 0x7fffffffU;
}

/* Elements the emitting pass tests at once for a key reaching thr. */
#define EMIT_RUN 8

static bool any_reaches(const float *x, const float *ef, size_t i0, uint32_t thr) {
    uint32_t mx = 0;
    float v;
    for (size_t i = i0; i < i0 + EMIT_RUN; i++) {
        const uint32_t u = key_of(x, ef, i, &v);
        mx = u > mx ? u : mx;
    }
    return mx >= thr;
}

/* The bin holding the need-th largest key, counting from the top bin;
 * *need becomes its rank inside that bin (1 = the bin's largest). */
static uint32_t pick_bin(const uint32_t *hist, uint32_t bins, size_t *need) {
    for (uint32_t b = bins; b-- > 0;) {
        if (hist[b] >= *need)
            return b;
        *need -= hist[b];
    }
    return 0; /* not reached: the histogram holds at least *need keys */
}

static void set_bits(uint8_t *buf, size_t pos, uint32_t val, int nbits) {
    for (int b = 0; b < nbits; b++)
        if (val >> b & 1)
            buf[(pos + (size_t)b) >> 3] |= (uint8_t)(1U << ((pos + (size_t)b) & 7));
}

static uint32_t get_bits(const uint8_t *buf, size_t pos, int nbits) {
    uint32_t v = 0;
    for (int b = 0; b < nbits; b++)
        v |= (uint32_t)(buf[(pos + (size_t)b) >> 3] >> ((pos + (size_t)b) & 7) & 1) << b;
    return v;
}

int loco_topk_quant(uint8_t *payload, const float *x, float *ef, size_t n, size_t k, int bits) {
    const size_t len = loco_topk_payload_bytes(n, k, bits);
    if (len == 0)
        return LOCO_EINVAL;
    /* pass 1: the top 11 bits of every key, and the largest key */
    uint32_t hist[2048];
    memset(hist, 0, sizeof hist);
    uint32_t mx = 0;
    float v;
    for (size_t i = 0; i < n; i++) {
        const uint32_t u = key_of(x, ef, i, &v);
        hist[u >> 20]++;
        mx = u > mx ? u : mx;
    }
    if (mx >= 0x7f800000U)
        return LOCO_EINVAL;
    size_t need = k;
    const uint32_t b1 = pick_bin(hist, 2048, &need);
    /* passes 2 and 3: the next 10 bits, then the last 10, inside the bin */
    memset(hist, 0, 1024 * sizeof *hist);
    for (size_t i = 0; i < n; i++) {
        const uint32_t u = key_of(x, ef, i, &v);
        hist[u >> 10 & 1023] += u >> 20 == b1; /* no branch: a bin can hold most */
    }
    const uint32_t b2 = pick_bin(hist, 1024, &need);
    const uint32_t hi = b1 << 10 | b2;
    memset(hist, 0, 1024 * sizeof *hist);
    for (size_t i = 0; i < n; i++) {
        const uint32_t u = key_of(x, ef, i, &v);
        if (u >> 10 == hi) /* rare: the branch is predicted */
            hist[u & 1023]++;
    }
    const uint32_t thr = hi << 10 | pick_bin(hist, 1024, &need);
    size_t ties = need; /* elements equal to thr that are kept */

    const uint32_t Q = 1U << (bits - 1);
    const float qmax = (float)Q, amax = u2f(mx);
    float scale = 0.0f, inv = 0.0f; /* all zero, or too tiny to scale */
    if (mx != 0 && qmax / amax <= FLT_MAX) {
        scale = amax / qmax;
        inv = qmax / amax;
        if ((double)scale * qmax > (double)amax)
            scale = u2f(f2u(scale) - 1);
    }
    int layout, L;
    const size_t ib = loco_topk_index_bytes(n, k, &layout, &L);
    memset(payload, 0, len);
    loco_put_le32(payload, (uint32_t)k);
    payload[4] = (uint8_t)bits;
    payload[5] = (uint8_t)layout;
    loco_put_le32(payload + 8, f2u(scale));
    uint8_t *idx = payload + LOCO_TOPK_HEADER;
    uint8_t *upper = idx + div_up(k * (size_t)L, 8);
    uint8_t *codes = idx + ib;
    size_t j = 0;
    for (size_t i = 0; i < n; i++) {
        if (i % EMIT_RUN == 0 && i + EMIT_RUN <= n && !any_reaches(x, ef, i, thr)) {
            /* nothing of this run is kept (the common case): in bulk */
            if (ef)
                for (size_t e = i; e < i + EMIT_RUN; e++)
                    ef[e] = x[e] + ef[e];
            i += EMIT_RUN - 1;
            continue;
        }
        const uint32_t u = key_of(x, ef, i, &v);
        const bool keep = u > thr || (u == thr && ties > 0);
        if (!keep) {
            if (ef)
                ef[i] = v;
            continue;
        }
        ties -= u == thr;
        if (layout) {
            idx[i >> 3] |= (uint8_t)(1U << (i & 7));
        } else {
            set_bits(idx, j * (size_t)L, (uint32_t)(i & ((1U << L) - 1)), L);
            const size_t p = (i >> L) + j;
            upper[p >> 3] |= (uint8_t)(1U << (p & 7));
        }
        int32_t q = (int32_t)rintf(u2f(u) * inv);
        q = q < 1 ? 1 : q > (int32_t)Q ? (int32_t)Q : q;
        const uint32_t sign = f2u(v) >> 31;
        set_bits(codes, j * (size_t)bits, sign << (bits - 1) | (uint32_t)(q - 1), bits);
        if (ef)
            ef[i] = v - (float)(sign ? -q : q) * scale;
        j++;
    }
    return 0;
}

/* A payload's fields and sections (header fields as stored, unchecked). */
typedef struct {
    size_t n, k;
    int bits, layout, L;
    float scale;
    const uint8_t *idx, *upper, *codes;
    size_t ib, upper_bytes;
} topk_view;

static topk_view view_of(const uint8_t *payload, size_t n) {
    topk_view t = {.n = n, .k = loco_get_le32(payload), .bits = payload[4]};
    t.ib = loco_topk_index_bytes(n, t.k, &t.layout, &t.L);
    t.scale = u2f(loco_get_le32(payload + 8));
    t.idx = payload + LOCO_TOPK_HEADER;
    t.upper = t.layout ? t.idx : t.idx + div_up(t.k * (size_t)t.L, 8);
    t.upper_bytes = t.ib - (size_t)(t.upper - t.idx);
    t.codes = t.idx + t.ib;
    return t;
}

/* Walks the set bits of the upper (or bitmap) section in order, the j-th
 * naming kept element j. False at the first malformed index (more than k,
 * not increasing, at or past n) or for fewer than k; with dst, accumulates
 * as it goes (callers pass dst only for a payload already checked). */
static bool walk(const topk_view *t, float *dst, float ws) {
    const uint32_t Q = 1U << (t->bits - 1);
    size_t j = 0, prev = 0;
    for (size_t byte = 0; byte < t->upper_bytes; byte++) {
        uint32_t m = t->upper[byte];
        while (m) {
            const size_t p = byte * 8 + (size_t)__builtin_ctz(m);
            m &= m - 1;
            if (j >= t->k)
                return false;
            size_t i = p;
            if (!t->layout)
                i = (p - j) << t->L | get_bits(t->idx, j * (size_t)t->L, t->L);
            if (i >= t->n || (j > 0 && i <= prev))
                return false;
            if (dst) {
                const uint32_t c = get_bits(t->codes, j * (size_t)t->bits, t->bits);
                const int32_t q = (int32_t)(c & (Q - 1)) + 1;
                dst[i] = fmaf((float)(c & Q ? -q : q), ws, dst[i]);
            }
            prev = i;
            j++;
        }
    }
    return j == t->k;
}

void loco_topk_dequant_acc(float *dst, const uint8_t *payload, size_t n, float weight) {
    const topk_view t = view_of(payload, n);
    walk(&t, dst, weight * t.scale);
}

/* Bits from pos to the end of the byte holding bit pos - 1 are zero. */
static bool pad_zero(const uint8_t *buf, size_t pos) {
    return (pos & 7) == 0 || (buf[pos >> 3] >> (pos & 7)) == 0;
}

bool loco_topk_payload_ok(const uint8_t *payload, size_t len, size_t n) {
    if (len < LOCO_TOPK_HEADER || n == 0)
        return false;
    const size_t k = loco_get_le32(payload);
    const int bits = payload[4];
    if (k == 0 || k > n || !bits_ok(bits) || loco_topk_payload_bytes(n, k, bits) != len)
        return false;
    const topk_view t = view_of(payload, n);
    if (payload[5] != t.layout || payload[6] || payload[7])
        return false;
    /* Q * scale <= FLT_MAX: nothing decodes to infinity (sign bit = big) */
    const double Q = (double)(1U << (bits - 1));
    float smax = FLT_MAX / (float)Q;
    while ((double)smax * Q > (double)FLT_MAX)
        smax = u2f(f2u(smax) - 1);
    if (loco_get_le32(payload + 8) > f2u(smax))
        return false;
    if (!t.layout && !pad_zero(t.idx, k * (size_t)t.L))
        return false;
    if (!pad_zero(t.codes, k * (size_t)bits))
        return false;
    return walk(&t, NULL, 0.0f);
}
