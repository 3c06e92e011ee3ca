/* The host side of the outer loop's device mode, which runs without a GPU:
 * compress/'s frame / unframe of a payload quantized elsewhere against the
 * codec's own encode and decode (same bytes, same values, same errors),
 * the outer step's CPU loops against plain computations, and a device
 * state refused cleanly where there is no device. The device path itself
 * is tests/gpu/test_cuda_outer.c (GPU or tests/gpu/emu). */
#include "outer/outer.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static void fill(float *x, size_t n, uint64_t seed, float scale) {
    loco_rng r;
    loco_rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++)
        x[i] = scale * loco_rng_normal(&r);
}

/* One codec setting: every chunk through encode_chunk_from on codec a and
 * through chunk_quant + loco_quant + frame_chunk on codec b (both with
 * error feedback, two rounds so the carried EF matters), then decoded both
 * ways. */
static void frame_vs_encode(loco_codec_kind k, loco_zstd_mode z, bool stochastic) {
    enum { N = 3000 };
    loco_codec_params cp;
    loco_codec_params_default(&cp);
    cp.codec = k;
    cp.block = 32;
    cp.zstd = z;
    cp.stochastic = stochastic;
    cp.chunk_bytes = 1024 * 4;
    cp.threads = 1;
    cp.n_state = N;
    loco_codec *a, *b;
    cr_assert_eq(loco_codec_create(&a, &cp), 0, "%s", loco_errmsg());
    cr_assert_eq(loco_codec_create(&b, &cp), 0, "%s", loco_errmsg());
    static float x[N], ra[N], rb[N];
    const size_t slot = loco_compress_slot_bytes(&cp);
    unsigned char *ea = malloc(slot), *eb = malloc(slot), *raw = malloc(slot);
    memset(ra, 0, sizeof ra);
    memset(rb, 0, sizeof rb);
    for (int round = 0; round < 2; round++) {
        fill(x, N, 40 + (uint64_t)round, 1e-2f);
        for (size_t i = 0; i < 64; i++) /* a compressible run for zstd */
            x[i] = 0;
        loco_encode_plan pa, pb;
        cr_assert_eq(loco_codec_plan(a, &pa, x, N, 0, 7 + (uint64_t)round), 0);
        cr_assert_eq(loco_codec_plan(b, &pb, x, N, 0, 7 + (uint64_t)round), 0);
        cr_assert_eq(pa.n_chunks, 3);
        for (size_t c = 0; c < pa.n_chunks; c++) {
            size_t la, lb, first, count, raw_len;
            cr_assert_eq(
                loco_codec_encode_chunk_from(a, 0, &pa, ea, slot, &la, x + c * 1024, c), 0);
            loco_quant_args qa;
            cr_assert_eq(loco_codec_chunk_quant(b, &pb, c, &qa, &first, &count, &raw_len), 0);
            cr_assert_eq(first, c * 1024);
            cr_assert_eq(count, c == 2 ? N - 2048 : 1024);
            cr_assert_eq(raw_len, loco_codec_payload_bytes(&cp, count));
            float *ef = k == LOCO_CODEC_NONE ? NULL : loco_codec_ef(b) + first;
            if (k == LOCO_CODEC_TOPK)
                cr_assert_eq(loco_topk_quant(raw, x + first, ef, count,
                                             loco_codec_topk_k(&cp, count), cp.topk_bits),
                             0);
            else
                cr_assert_eq(loco_quant(loco_codec_format(k), raw, x + first, ef, count, &qa), 0);
            cr_assert_eq(loco_codec_frame_chunk(b, 0, &pb, eb, slot, &lb, raw, c), 0, "%s",
                         loco_errmsg());
            cr_expect_eq(lb, la, "%s zstd=%d chunk %zu: %zu bytes framed, %zu encoded",
                         loco_codec_name(k), z, c, lb, la);
            cr_expect_eq(memcmp(ea, eb, la < lb ? la : lb), 0, "%s zstd=%d chunk %zu: bytes",
                         loco_codec_name(k), z, c);
            /* decode: the codec's, and unframe + the quantizer's loop */
            cr_assert_eq(loco_codec_decode_chunk(a, 0, ra, N, 0.5f, ea, la), 0);
            loco_chunk_info info;
            const uint8_t *p = NULL;
            cr_assert_eq(loco_codec_unframe_chunk(b, 0, N, eb, lb, &info, &p), 0, "%s",
                         loco_errmsg());
            cr_assert_eq(info.first, first);
            cr_assert_eq(info.raw_len, raw_len);
            if (k == LOCO_CODEC_TOPK)
                loco_topk_dequant_acc(rb + info.first, p, info.count, 0.5f);
            else
                loco_dequant_acc(loco_codec_format(info.codec), rb + info.first, p, info.count,
                                 info.block, info.planes, 0.5f);
        }
    }
    cr_expect_eq(memcmp(ra, rb, sizeof ra), 0, "%s: decoded values differ", loco_codec_name(k));
    if (k != LOCO_CODEC_NONE)
        cr_expect_eq(memcmp(loco_codec_ef(a), loco_codec_ef(b), N * sizeof(float)), 0,
                     "%s: error feedback differs", loco_codec_name(k));
    free(ea), free(eb), free(raw);
    loco_codec_destroy(a);
    loco_codec_destroy(b);
}

Test(outer_device, frame_matches_encode) {
    for (int k = 0; k < LOCO_CODEC_COUNT; k++) {
        frame_vs_encode((loco_codec_kind)k, LOCO_ZSTD_OFF, false);
        /* topk rounds to nearest only (params_check refuses stochastic) */
        frame_vs_encode((loco_codec_kind)k, LOCO_ZSTD_ON, k == LOCO_CODEC_INT8);
    }
}

/* A damaged chunk: unframe fails with decode_chunk's code. */
Test(outer_device, unframe_refuses_as_decode) {
    enum { N = 512 };
    loco_codec_params cp;
    loco_codec_params_default(&cp);
    cp.threads = 1;
    cp.zstd = LOCO_ZSTD_OFF;
    cp.n_state = N;
    loco_codec *c;
    cr_assert_eq(loco_codec_create(&c, &cp), 0);
    static float x[N], dst[N];
    fill(x, N, 3, 1.0f);
    loco_encode_plan pl;
    cr_assert_eq(loco_codec_plan(c, &pl, x, N, 0, 1), 0);
    const size_t slot = loco_compress_slot_bytes(&cp);
    unsigned char *e = malloc(slot);
    size_t len;
    cr_assert_eq(loco_codec_encode_chunk(c, 0, &pl, e, slot, &len, x, 0), 0);
    loco_chunk_info info;
    const uint8_t *p;
    /* a short buffer, a flipped payload byte (checksum), a NaN scale */
    cr_expect_eq(loco_codec_unframe_chunk(c, 0, N, e, len - 1, &info, &p),
                 loco_codec_decode_chunk(c, 0, dst, N, 1.0f, e, len - 1));
    e[LOCO_CHUNK_HEADER_BYTES + 9] ^= 1;
    const int rc = loco_codec_unframe_chunk(c, 0, N, e, len, &info, &p);
    cr_expect_eq(rc, LOCO_EPROTO);
    cr_expect_eq(rc, loco_codec_decode_chunk(c, 0, dst, N, 1.0f, e, len));
    e[LOCO_CHUNK_HEADER_BYTES + 9] ^= 1;
    const float nan = NAN;
    memcpy(e + LOCO_CHUNK_HEADER_BYTES, &nan, 4);
    loco_put_le64(e + 48, loco_hash64(e + LOCO_CHUNK_HEADER_BYTES, len - LOCO_CHUNK_HEADER_BYTES));
    loco_put_le64(e + 56, loco_hash64(e, 56));
    cr_expect_eq(loco_codec_unframe_chunk(c, 0, N, e, len, &info, &p), LOCO_EREFUSED);
    cr_expect_eq(loco_codec_decode_chunk(c, 0, dst, N, 1.0f, e, len), LOCO_EREFUSED);
    free(e);
    loco_codec_destroy(c);
}

/* The share's sum of squares against a long double serial sum, and its
 * non-finite flag. */
Test(outer_device, share_sumsq) {
    enum { N = 1000 };
    static float now[N], before[N];
    fill(now, N, 5, 1.0f);
    fill(before, N, 6, 1.0f);
    long double ref = 0;
    for (size_t i = 0; i < N; i++) {
        const long double d = ((long double)now[i] - before[i]) * 3;
        ref += d * d;
    }
    bool bad = true;
    const double got = loco_share_sumsq(now, before, N, 3.0, &bad);
    cr_expect(!bad);
    cr_expect(fabsl(got - ref) <= 1e-12L * ref, "sum %.17g, reference %.17Lg", got, ref);
    now[N - 1] = INFINITY;
    loco_share_sumsq(now, before, N, 3.0, &bad);
    cr_expect(bad, "Inf not flagged");
    now[N - 1] = 1e30f; /* large but finite: its square fits a double */
    loco_share_sumsq(now, before, N, 3.0, &bad);
    cr_expect(!bad, "a finite share flagged");
}

/* The outer optimizer's loop against the formula, element by element. */
Test(outer_device, outer_update) {
    enum { N = 777 };
    static float th[N], m[N], g[N], th2[N], m2[N], tl[N];
    fill(th, N, 1, 1.0f);
    fill(m, N, 2, 1e-2f);
    fill(g, N, 3, 1e-2f);
    for (int nest = 0; nest < 2; nest++) {
        loco_outer_update(th2, m2, tl, th, m, g, N, 0.7f, 0.9f, nest);
        for (size_t i = 0; i < N; i++) {
            float mm = nest ? 0.9f * m[i] + g[i] : m[i];
            float t = nest ? th[i] - 0.7f * (g[i] + 0.9f * mm) : th[i] - g[i];
            cr_assert(m2[i] == mm && th2[i] == t && tl[i] == t, "element %zu", i);
        }
    }
}

/* Without a usable device the device mode fails with the reason and
 * leaves nothing behind. */
Test(outer_device, no_device_is_an_error) {
    int n = 0;
#ifdef LOCO_HAVE_CUDA
    if (loco_cuda_device_count(&n) == 0 && n > 0)
        cr_skip_test("a device is present: tests/gpu/test_cuda_outer.c covers it");
#endif
    loco_codec_params cp;
    loco_codec_params_default(&cp);
    cp.threads = 1;
    const loco_outer_params p = {.H = 1, .nesterov = true, .lr = 0.7f, .momentum = 0.9f};
    float theta[64] = {0};
    const size_t live = loco_alloc_live_bytes();
    loco_outer *o = (loco_outer *)1;
    const int rc = loco_outer_create_device(&o, &p, &cp, 64, theta);
    cr_expect_lt(rc, 0);
    cr_expect_null(o);
    cr_expect_neq(strlen(loco_errmsg()), 0);
    cr_expect_eq(loco_alloc_live_bytes(), live, "device mode failure leaked host memory");
    (void)n;
}
