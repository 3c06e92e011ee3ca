/* The top-k codec (kernels/cpu/topk.c, compress.codec = topk) against a
 * reference written here from kernels/kernels.h's description: the kept set
 * by a sort, the codes by the documented formula, the index section packed
 * bit by bit; malformed payloads and chunks refused; error feedback over
 * 100 rounds; the same bytes for one and two workers. */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compress/compress.h"

static uint64_t sm64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static double unif(uint64_t *s) {
    return ((double)(sm64(s) >> 11) + 0.5) * 0x1p-53;
}

static float gauss(uint64_t *s) {
    return (float)(sqrt(-2.0 * log(unif(s))) * cos(2.0 * M_PI * unif(s)));
}

/* Gaussian values; with `ties`, drawn from 9 levels so that many are equal. */
static void fill(float *x, size_t n, uint64_t seed, bool ties) {
    for (size_t i = 0; i < n; i++)
        x[i] = ties ? (float)((int)(sm64(&seed) % 9) - 4) * 0.25f : gauss(&seed);
}

/* ------------------------------------------------------------ reference */

static const float *sort_v;
static int by_size(const void *a, const void *b) { /* |v| down, index up */
    const size_t i = *(const size_t *)a, j = *(const size_t *)b;
    const float x = fabsf(sort_v[i]), y = fabsf(sort_v[j]);
    if (x != y)
        return x > y ? -1 : 1;
    return i < j ? -1 : 1;
}
static int by_index(const void *a, const void *b) {
    const size_t i = *(const size_t *)a, j = *(const size_t *)b;
    return i < j ? -1 : i > j;
}

static void put_bits(uint8_t *buf, size_t pos, uint64_t v, int nbits) {
    for (int b = 0; b < nbits; b++, pos++)
        if (v >> b & 1)
            buf[pos / 8] |= (uint8_t)(1u << (pos % 8));
}

/* Packs a payload from indices and codes as kernels.h describes it. */
static size_t ref_pack(uint8_t *out, size_t n, size_t k, int bits, float scale, const size_t *idx,
                       const uint32_t *code) {
    int L = 0;
    while ((k << (L + 1)) <= n)
        L++;
    const size_t low = (k * (size_t)L + 7) / 8, up = (((n - 1) >> L) + k + 7) / 8;
    const bool bitmap = (n + 7) / 8 <= low + up;
    const size_t ib = bitmap ? (n + 7) / 8 : low + up, len = 12 + ib + (k * (size_t)bits + 7) / 8;
    memset(out, 0, len);
    for (int b = 0; b < 4; b++)
        out[b] = (uint8_t)(k >> (8 * b));
    out[4] = (uint8_t)bits;
    out[5] = bitmap;
    memcpy(out + 8, &scale, 4);
    for (size_t j = 0; j < k; j++) {
        if (bitmap) {
            put_bits(out + 12, idx[j], 1, 1);
        } else {
            put_bits(out + 12, j * (size_t)L, idx[j] & ((1u << L) - 1), L);
            put_bits(out + 12 + low, (idx[j] >> L) + j, 1, 1);
        }
        put_bits(out + 12 + ib, j * (size_t)bits, code[j], bits);
    }
    return len;
}

/* The reference encoding of v = x + ef: payload, and the decoded values. */
static size_t ref_encode(uint8_t *out, float *dec, const float *x, const float *ef, size_t n,
                         size_t k, int bits) {
    float *v = malloc(n * sizeof *v);
    size_t *ord = malloc(n * sizeof *ord);
    uint32_t *code = malloc(k * sizeof *code);
    float amax = 0;
    for (size_t i = 0; i < n; i++) {
        v[i] = ef ? x[i] + ef[i] : x[i];
        ord[i] = i;
        amax = fmaxf(amax, fabsf(v[i]));
    }
    sort_v = v;
    qsort(ord, n, sizeof *ord, by_size);
    qsort(ord, k, sizeof *ord, by_index);
    const float Q = (float)(1 << (bits - 1));
    float scale = 0, inv = 0;
    if (amax > 0 && Q / amax <= FLT_MAX) {
        scale = amax / Q, inv = Q / amax;
        if ((double)scale * Q > amax)
            scale = nextafterf(scale, 0);
    }
    memset(dec, 0, n * sizeof *dec);
    for (size_t j = 0; j < k; j++) {
        const float a = fabsf(v[ord[j]]);
        const float m1 = fminf(fmaxf(rintf(a * inv), 1), Q); /* m + 1 */
        const bool neg = signbit(v[ord[j]]);
        code[j] = (uint32_t)neg << (bits - 1) | (uint32_t)(m1 - 1);
        dec[ord[j]] = (neg ? -m1 : m1) * scale;
    }
    const size_t len = ref_pack(out, n, k, bits, scale, ord, code);
    free(v), free(ord), free(code);
    return len;
}

static void check_one(size_t n, size_t k, int bits, bool with_ef, bool ties, uint64_t seed) {
    float *x = malloc(n * sizeof *x), *ef = malloc(n * sizeof *ef), *ef0 = malloc(n * sizeof *ef);
    float *dec = malloc(n * sizeof *dec), *dst = calloc(n, sizeof *dst);
    fill(x, n, seed, ties);
    fill(ef0, n, seed + 1, false);
    for (size_t i = 0; i < n; i++)
        ef[i] = ef0[i] *= 0.01f;
    const size_t len = loco_topk_payload_bytes(n, k, bits);
    uint8_t *got = calloc(len + 1, 1), *want = calloc(len + 64, 1);
    cr_assert_eq(loco_topk_quant(got, x, with_ef ? ef : NULL, n, k, bits), 0);
    const size_t rlen = ref_encode(want, dec, x, with_ef ? ef0 : NULL, n, k, bits);
    cr_assert_eq(rlen, len, "n %zu k %zu bits %d: %zu bytes, reference %zu", n, k, bits, len, rlen);
    size_t at = len;
    for (size_t i = 0; i < len && at == len; i++)
        if (got[i] != want[i])
            at = i;
    cr_assert_eq(at, len, "n %zu k %zu bits %d ef %d ties %d: byte %zu of %zu: %02x, want %02x", n,
                 k, bits, with_ef, ties, at, len, got[at], want[at]);
    cr_assert(loco_topk_payload_ok(got, len, n));
    loco_topk_dequant_acc(dst, got, n, 1.0f);
    for (size_t i = 0; i < n; i++) {
        cr_assert_eq(dst[i], dec[i], "n %zu k %zu: element %zu decodes to %g, want %g", n, k, i,
                     dst[i], dec[i]);
        if (with_ef) { /* EF = v - decoded, bit for bit (v for what was dropped) */
            const float v = x[i] + ef0[i];
            cr_assert_eq(ef[i], v - dec[i], "element %zu: EF %g, want %g", i, ef[i], v - dec[i]);
        }
    }
    free(x), free(ef), free(ef0), free(dec), free(dst), free(got), free(want);
}

Test(compress_topk, matches_the_sorted_reference) {
    const size_t ns[] = {1, 2, 7, 64, 1000, 4097, 20011};
    const int bits[] = {2, 4, 8};
    uint64_t seed = 1;
    for (size_t a = 0; a < sizeof ns / sizeof *ns; a++) {
        const size_t n = ns[a];
        const size_t ks[] = {1, n / 100 ? n / 100 : 1, n / 3 ? n / 3 : 1, n - n / 4, n};
        for (size_t b = 0; b < sizeof ks / sizeof *ks; b++)
            for (int c = 0; c < 3; c++)
                for (int v = 0; v < 4; v++)
                    check_one(n, ks[b], bits[c], v & 1, v & 2, seed++);
    }
}

/* Both index layouts occur, and Elias-Fano costs about L + 2 bits. */
Test(compress_topk, index_layouts) {
    int layout, L;
    /* 1% of 2^20: L = 6, ceil(10486 * 6 / 8) + ceil((16383 + 10486) / 8) */
    cr_assert_eq(loco_topk_index_bytes(1 << 20, 10486, &layout, &L), 7865 + 3359);
    cr_assert_eq(layout, 0);
    cr_assert_eq(L, 6);
    cr_assert_eq(loco_topk_index_bytes(1000, 600, &layout, &L), 125);
    cr_assert_eq(layout, 1);
    cr_assert_eq(loco_topk_payload_bytes(10, 0, 2), 0);
    cr_assert_eq(loco_topk_payload_bytes(10, 11, 2), 0);
    cr_assert_eq(loco_topk_payload_bytes(10, 3, 3), 0);
    float x[4] = {1, 2, NAN, 3};
    uint8_t p[64];
    cr_assert_eq(loco_topk_quant(p, x, NULL, 4, 2, 2), LOCO_EINVAL);
    x[2] = INFINITY;
    cr_assert_eq(loco_topk_quant(p, x, NULL, 4, 2, 2), LOCO_EINVAL);
}

/* ------------------------------------------------------ malformed input */

/* A payload of n = 1000 from explicit indices (Elias-Fano at k = 10). */
static size_t forge(uint8_t *out, size_t n, const size_t *idx, size_t k, int bits) {
    uint32_t code[64];
    for (size_t j = 0; j < k; j++)
        code[j] = (uint32_t)j % (1u << bits);
    return ref_pack(out, n, k, bits, 0.5f, idx, code);
}

Test(compress_topk, payload_checks_refuse_malformed) {
    enum { N = 1000 };
    uint8_t p[512];
    size_t idx[10] = {3, 17, 100, 101, 400, 401, 402, 700, 998, 999};
    size_t len = forge(p, N, idx, 10, 2);
    cr_assert(loco_topk_payload_ok(p, len, N));
    cr_assert_not(loco_topk_payload_ok(p, len - 1, N), "truncated");
    cr_assert_not(loco_topk_payload_ok(p, len + 1, N), "extended");
    cr_assert_not(loco_topk_payload_ok(p, len, N - 1), "index 999 outside 999 elements");
    uint8_t q[512];
#define MUTATE(what, stmt)                                                                         \
    do {                                                                                           \
        memcpy(q, p, len);                                                                         \
        stmt;                                                                                      \
        cr_assert_not(loco_topk_payload_ok(q, len, N), "%s accepted", what);                       \
    } while (0)
    MUTATE("k = 0", q[0] = 0);
    MUTATE("k = 11", q[0] = 11);
    MUTATE("k > n", (q[0] = 0xe9, q[1] = 0x03));
    MUTATE("bits 3", q[4] = 3);
    MUTATE("bitmap layout", q[5] = 1);
    MUTATE("reserved", q[6] = 1);
    MUTATE("negative scale", q[11] |= 0x80);
    MUTATE("infinite scale", (q[8] = 0, q[9] = 0, q[10] = 0x80, q[11] = 0x7f));
    MUTATE("scale that decodes past FLT_MAX",
           (q[8] = 0xff, q[9] = 0xff, q[10] = 0x7f, q[11] = 0x7f));
    const size_t low = (10 * 6 + 7) / 8; /* L = 6 */
    MUTATE("low padding", q[12 + low - 1] |= 0x80);
    MUTATE("code padding", q[len - 1] |= 0x80);
    /* indices repeated (so not strictly increasing) */
    const size_t dup[10] = {3, 17, 100, 100, 400, 401, 402, 700, 998, 999};
    cr_assert_not(loco_topk_payload_ok(q, forge(q, N, dup, 10, 2), N), "repeated index");
    /* the upper bitmap (bytes [12 + low, len - 3): 25 bits) with a bit
     * more or a bit less than k */
    uint8_t *u = q + 12 + low;
    const size_t ub = len - 3 - 12 - low;
    memcpy(q, p, len);
    for (size_t pos = 0; pos < 8 * ub; pos++)
        if (!(u[pos / 8] >> (pos % 8) & 1)) {
            u[pos / 8] |= (uint8_t)(1u << (pos % 8));
            break;
        }
    cr_assert_not(loco_topk_payload_ok(q, len, N), "upper bitmap with 11 ones");
    memcpy(q, p, len);
    for (size_t pos = 8 * ub; pos-- > 0;)
        if (u[pos / 8] >> (pos % 8) & 1) {
            u[pos / 8] &= (uint8_t) ~(1u << (pos % 8));
            break;
        }
    cr_assert_not(loco_topk_payload_ok(q, len, N), "upper bitmap with 9 ones");
    const size_t big[10] = {3, 17, 100, 101, 400, 401, 402, 700, 998, 1000};
    len = forge(q, N + 8, big, 10, 2); /* encoded for 1008 elements */
    cr_assert_not(loco_topk_payload_ok(q, len, N), "index 1000");
    const size_t bm[1] = {5};
    len = forge(q, 8, bm, 1, 8);
    cr_assert(loco_topk_payload_ok(q, len, 8));
    q[12] |= 0x80; /* a second element in a bitmap of k = 1 */
    cr_assert_not(loco_topk_payload_ok(q, len, 8), "bitmap with two bits for k = 1");
#undef MUTATE
}

/* --------------------------------------------------------- the codec */

typedef struct {
    uint8_t *buf;
    size_t cap, bytes;
    loco_chunk_ref *chunks;
    loco_encode_plan plan;
} encoded;

static encoded encode(loco_codec *c, const float *x, size_t n, uint64_t nonce) {
    encoded e = {0};
    cr_assert_eq(loco_codec_plan(c, &e.plan, x, n, 0, nonce), 0, "%s", loco_errmsg());
    e.cap = loco_compress_bound(n, loco_codec_get_params(c));
    e.buf = malloc(e.cap + 1);
    e.chunks = calloc(e.plan.n_chunks + 1, sizeof *e.chunks);
    cr_assert_eq(loco_codec_encode(c, &e.plan, e.buf, e.cap, e.chunks, x), 0, "%s", loco_errmsg());
    for (size_t i = 0; i < e.plan.n_chunks; i++)
        e.bytes += e.chunks[i].len;
    return e;
}

static void encoded_free(encoded *e) {
    free(e->buf);
    free(e->chunks);
}

static loco_codec_params topk_params(double frac, int bits, loco_zstd_mode z, int threads) {
    loco_codec_params p;
    loco_codec_params_default(&p);
    p.codec = LOCO_CODEC_TOPK;
    p.topk = frac;
    p.topk_bits = bits;
    p.zstd = z;
    p.chunk_bytes = 256 << 10; /* 65536 elements */
    p.threads = threads;
    p.error_feedback = false;
    return p;
}

/* Each chunk through the handle equals loco_topk_quant of that chunk alone
 * with k = round(topk * count); the bytes per value are printed. */
Test(compress_topk, codec_chunks_are_the_kernel_payloads) {
    const size_t n = 300007; /* several chunks and a ragged tail */
    float *x = malloc(n * sizeof *x), *y = calloc(n, sizeof *y), *want = calloc(n, sizeof *want);
    fill(x, n, 7, false);
    for (int bits = 2; bits <= 8; bits *= 2)
        for (int z = LOCO_ZSTD_OFF; z <= LOCO_ZSTD_ON; z++) {
            const loco_codec_params p = topk_params(0.01, bits, (loco_zstd_mode)z, 2);
            loco_codec *c;
            cr_assert_eq(loco_codec_create(&c, &p), 0, "%s", loco_errmsg());
            encoded e = encode(c, x, n, 1);
            cr_assert_eq(e.plan.n_chunks, 5);
            memset(y, 0, n * sizeof *y);
            memset(want, 0, n * sizeof *want);
            cr_assert_eq(loco_codec_decode(c, y, n, 0.5f, e.buf, e.cap, e.chunks, e.plan.n_chunks),
                         0, "%s", loco_errmsg());
            size_t raw = 0;
            for (size_t i = 0; i < e.plan.n_chunks; i++) {
                const size_t first = i * 65536, cn = n - first < 65536 ? n - first : 65536;
                const size_t k = (size_t)(0.01 * (double)cn + 0.5);
                cr_assert_eq(loco_codec_topk_k(&p, cn), k);
                const size_t len = loco_topk_payload_bytes(cn, k, bits);
                uint8_t *pay = malloc(len);
                cr_assert_eq(loco_topk_quant(pay, x + first, NULL, cn, k, bits), 0);
                loco_topk_dequant_acc(want + first, pay, cn, 0.5f);
                if (z == LOCO_ZSTD_OFF)
                    cr_assert_eq(
                        memcmp(e.buf + e.chunks[i].offset + LOCO_CHUNK_HEADER_BYTES, pay, len), 0,
                        "chunk %zu", i);
                raw += LOCO_CHUNK_HEADER_BYTES + len;
                free(pay);
            }
            cr_assert_eq(memcmp(y, want, n * sizeof *y), 0);
            if (z == LOCO_ZSTD_OFF)
                cr_assert_eq(e.bytes, raw);
            cr_log_info("topk 1%% %d-bit, zstd %s: %zu bytes for %zu values: %.4f bytes/value, "
                        "%.0fx less than fp32",
                        bits, z ? "on" : "off", e.bytes, n, (double)e.bytes / (double)n,
                        4.0 * (double)n / (double)e.bytes);
            /* 1% at 2 bits: about 12 bits per kept value, 0.015 bytes per value */
            if (bits == 2)
                cr_assert_lt((double)e.bytes / (double)n, 0.017);
            encoded_free(&e);
            loco_codec_destroy(c);
        }
    free(x), free(y), free(want);
}

/* 100 rounds of fresh Gaussian pseudo-gradients at 1%, 2 bits: decoded sum
 * + EF = sum of the inputs up to fp32 rounding, and EF keeps the sum far
 * closer than dropping what was not sent. */
Test(compress_topk, error_feedback_tracks_the_sum) {
    const size_t n = 8192;
    const int rounds = 100;
    double drift[2];
    for (int with_ef = 0; with_ef < 2; with_ef++) {
        loco_codec_params p = topk_params(0.01, 2, LOCO_ZSTD_OFF, 1);
        p.chunk_bytes = 4096 * 4;
        p.error_feedback = with_ef;
        p.n_state = n;
        loco_codec *c;
        cr_assert_eq(loco_codec_create(&c, &p), 0);
        double *sx = calloc(n, sizeof *sx);
        float *sd = calloc(n, sizeof *sd), *x = malloc(n * sizeof *x);
        for (int r = 0; r < rounds; r++) {
            fill(x, n, 1000 + (uint64_t)r, false);
            for (size_t i = 0; i < n; i++)
                sx[i] += x[i];
            encoded e = encode(c, x, n, (uint64_t)r);
            cr_assert_eq(loco_codec_decode(c, sd, n, 1.0f, e.buf, e.cap, e.chunks, e.plan.n_chunks),
                         0);
            encoded_free(&e);
        }
        double d = 0, s = 0, resid = 0;
        const float *ef = loco_codec_ef(c);
        for (size_t i = 0; i < n; i++) {
            d += (sd[i] - sx[i]) * (sd[i] - sx[i]);
            s += sx[i] * sx[i];
            if (with_ef)
                resid += (sd[i] + ef[i] - sx[i]) * (sd[i] + ef[i] - sx[i]);
        }
        drift[with_ef] = sqrt(d / s);
        /* test_codec.c's bound for fp32 rounding over R rounds; EF here
         * holds up to a few rounds' inputs, so three times it */
        if (with_ef)
            cr_assert_lt(sqrt(resid / s), 3 * 0x1p-24 * (2.0 * rounds / 3 + 3 * sqrt(rounds)));
        free(sx), free(sd), free(x);
        loco_codec_destroy(c);
    }
    cr_log_info("topk 1%% 2-bit, drift of the sum after %d rounds: %.4f without EF, %.4f with",
                rounds, drift[0], drift[1]);
    /* measured 0.950 without EF (99% of every round is lost), 0.409 with
     * (what is behind is the EF state, the mass of a few rounds) */
    cr_assert_gt(drift[0], 0.9);
    cr_assert_lt(drift[1], 0.5 * drift[0], "EF drift %.4f, without %.4f", drift[1], drift[0]);
}

/* Same bytes, decoded values and EF for one and two workers, and twice. */
Test(compress_topk, deterministic_for_any_worker_count) {
    const size_t n = 200000;
    float *x = malloc(n * sizeof *x);
    fill(x, n, 9, true); /* many ties */
    encoded e[3];
    float *ef[3];
    for (int r = 0; r < 3; r++) {
        loco_codec_params p = topk_params(0.03, 4, LOCO_ZSTD_ON, r == 2 ? 1 : 2);
        p.error_feedback = true;
        p.n_state = n;
        loco_codec *c;
        cr_assert_eq(loco_codec_create(&c, &p), 0);
        e[r] = encode(c, x, n, 5);
        ef[r] = malloc(n * sizeof(float));
        memcpy(ef[r], loco_codec_ef(c), n * sizeof(float));
        loco_codec_destroy(c);
    }
    for (int r = 1; r < 3; r++) {
        cr_assert_eq(e[r].bytes, e[0].bytes);
        for (size_t i = 0; i < e[0].plan.n_chunks; i++)
            cr_assert_eq(memcmp(e[r].buf + e[r].chunks[i].offset, e[0].buf + e[0].chunks[i].offset,
                                e[0].chunks[i].len),
                         0, "run %d chunk %zu", r, i);
        cr_assert_eq(memcmp(ef[r], ef[0], n * sizeof(float)), 0);
    }
    for (int r = 0; r < 3; r++)
        encoded_free(&e[r]), free(ef[r]);
    free(x);
}

/* A forged chunk (checksums recomputed) is refused and dst left alone. */
Test(compress_topk, forged_chunks_refused) {
    enum { N = 1000 };
    float x[N], dst[N], dst0[N];
    fill(x, N, 3, false);
    for (size_t i = 0; i < N; i++)
        dst[i] = dst0[i] = (float)i;
    loco_codec_params p = topk_params(0.01, 2, LOCO_ZSTD_OFF, 1);
    p.chunk_bytes = 4096 * 4;
    loco_codec *c;
    cr_assert_eq(loco_codec_create(&c, &p), 0);
    encoded e = encode(c, x, N, 0);
    const size_t len = e.chunks[0].len;
    uint8_t *good = e.buf + e.chunks[0].offset, bad[4096];
    cr_assert_eq(loco_codec_decode_chunk(c, 0, dst, N, 1.0f, good, len), 0, "%s", loco_errmsg());
    memcpy(dst, dst0, sizeof dst);
    const size_t H = LOCO_CHUNK_HEADER_BYTES;
    static const struct {
        size_t at;
        uint8_t val;
        const char *what;
    } forged[] = {
        {H + 0, 0, "k = 0"},         {H + 0, 200, "k = 200"},     {H + 4, 5, "5 bits"},
        {H + 5, 1, "bitmap layout"}, {H + 11, 0xff, "NaN scale"}, {H + 6, 1, "reserved"},
        {0, 0xf0, "code padding"}, /* at = 0: the last byte, or-ed */
    };
    for (size_t f = 0; f < sizeof forged / sizeof *forged; f++) {
        memcpy(bad, good, len);
        if (forged[f].at)
            bad[forged[f].at] = forged[f].val;
        else
            bad[len - 1] |= forged[f].val;
        loco_put_le64(bad + 48, loco_hash64(bad + H, len - H));
        loco_put_le64(bad + 56, loco_hash64(bad, 56));
        const int rc = loco_codec_decode_chunk(c, 0, dst, N, 1.0f, bad, len);
        cr_assert(rc == LOCO_EREFUSED || rc == LOCO_EPROTO, "%s: %d", forged[f].what, rc);
        cr_assert_eq(memcmp(dst, dst0, sizeof dst), 0, "%s touched dst", forged[f].what);
    }
    /* a raw length outside what any k and bits allow: refused by the header */
    memcpy(bad, good, len);
    loco_put_le64(bad + 32, 5);
    loco_put_le64(bad + 40, 5);
    loco_put_le64(bad + 56, loco_hash64(bad, 56));
    loco_chunk_info info;
    cr_assert_eq(loco_chunk_parse(bad, len, &info), LOCO_EPROTO);
    cr_assert(strstr(loco_errmsg(), "topk"), "%s", loco_errmsg());
    /* truncated: every shorter length is refused */
    for (size_t l = 0; l < len; l++)
        cr_assert_neq(loco_codec_decode_chunk(c, 0, dst, N, 1.0f, good, l), 0);
    cr_assert_eq(memcmp(dst, dst0, sizeof dst), 0);
    encoded_free(&e);
    loco_codec_destroy(c);
}

Test(compress_topk, config_keys) {
    loco_config cfg;
    loco_config_defaults(&cfg);
    cr_assert_eq(loco_config_set(&cfg, "compress.codec=topk"), 0);
    loco_codec_params p;
    cr_assert_eq(loco_codec_params_from_config(&p, &cfg), 0, "%s", loco_errmsg());
    cr_assert_eq(p.codec, LOCO_CODEC_TOPK);
    cr_assert_eq(p.topk, 0.01);
    cr_assert_eq(p.topk_bits, 2);
    cr_assert_eq(loco_config_set(&cfg, "compress.topk=0.03"), 0);
    cr_assert_eq(loco_config_set(&cfg, "compress.topk_bits=8"), 0);
    cr_assert_eq(loco_codec_params_from_config(&p, &cfg), 0);
    cr_assert_eq(p.topk, 0.03);
    cr_assert_eq(p.topk_bits, 8);
    cr_assert_eq(loco_config_set(&cfg, "compress.topk=0"), LOCO_EINVAL);
    cr_assert_eq(loco_config_set(&cfg, "compress.topk=1.5"), LOCO_EINVAL);
    cr_assert_eq(loco_config_set(&cfg, "compress.topk_bits=3"), 0);
    cr_assert_eq(loco_codec_params_from_config(&p, &cfg), LOCO_EINVAL);
    cr_assert(strstr(loco_errmsg(), "compress.topk_bits = 3"), "%s", loco_errmsg());
    cr_assert_eq(loco_config_set(&cfg, "compress.topk_bits=4"), 0);
    cr_assert_eq(loco_config_set(&cfg, "compress.rounding=stochastic"), 0);
    cr_assert_eq(loco_codec_params_from_config(&p, &cfg), LOCO_EINVAL);
    cr_assert(strstr(loco_errmsg(), "nearest"), "%s", loco_errmsg());
    /* k: round(topk * count), at least 1, at most count */
    p.topk = 0.01;
    cr_assert_eq(loco_codec_topk_k(&p, 1), 1);
    cr_assert_eq(loco_codec_topk_k(&p, 149), 1);
    cr_assert_eq(loco_codec_topk_k(&p, 150), 2);
    cr_assert_eq(loco_codec_topk_k(&p, 1 << 20), 10486);
    p.topk = 1;
    cr_assert_eq(loco_codec_topk_k(&p, 77), 77);
}
