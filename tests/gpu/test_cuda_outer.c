/* The outer loop's device mode (outer/outer.c, loco_outer_create_device)
 * against its host path: for the same θ_local of K islands, the same bytes
 * on the wire chunk by chunk, the same θ_global, momentum and θ_local after
 * the step (bit for bit, two Nesterov steps so the error feedback carried
 * over shows in the second step's bytes), the same refusals of a bad
 * contribution, and the PCIe bytes it counts. Also the outer step's new
 * kernels (loco_sub, loco_share_sumsq, loco_outer_update) against their CPU
 * twins. Skips, with the reason, without a device or a CUDA build. */
#include <criterion/criterion.h>

#ifndef LOCO_HAVE_CUDA
Test(gpu_outer, skipped)
{
    cr_skip_test("built without the CUDA toolkit (no nvcc found by make): "
                 "the outer loop's device mode not compiled");
}
#else

#include "outer/outer.h"
#include "tests/gpu/gpu_test.h"

/* ------------------------------------------------------------ the twins */

Test(gpu_outer, kernels_match_cpu)
{
    gpu_env e;
    gpu_env_init(&e, 16 << 20);
    uint64_t s = 77;
    const size_t ns[] = {1, 255, 256, 1000, 4099};
    for (size_t t = 0; t < sizeof ns / sizeof *ns; t++) {
        const size_t n = ns[t];
        float *a = rand_f(&s, n, 3.0), *b = rand_f(&s, n, 1e-2), *g = rand_f(&s, n, 1e-3);
        float *out = malloc(n * 4), *th2 = malloc(n * 4), *m2 = malloc(n * 4),
              *tl = malloc(n * 4);
        float *da = dup_to_dev(&e, a, n * 4), *db = dup_to_dev(&e, b, n * 4),
              *dg = dup_to_dev(&e, g, n * 4);
        float *dout = dalloc(&e, n * 4), *dth2 = dalloc(&e, n * 4), *dm2 = dalloc(&e, n * 4),
              *dtl = dalloc(&e, n * 4);
        loco_sub(out, a, b, n);
        GPU_OK(loco_cuda_sub(dout, da, db, n, NULL));
        float *got = down_f(dout, n);
        EXPECT_SAME_BITS("sub", got, out, n);
        free(got);

        bool bad = true;
        const double want = loco_share_sumsq(a, b, n, 3.0, &bad);
        cr_expect(!bad, "finite share flagged");
        double *dss = dalloc(&e, (2 + n / LOCO_SHARE_PART) * sizeof(double));
        uint32_t *dbad = dalloc(&e, 4), gbad = 9;
        GPU_OK(loco_cuda_share_sumsq(dss, da, db, n, 3.0, dbad, NULL));
        double gss = 0;
        to_host(&gss, dss, sizeof gss);
        to_host(&gbad, dbad, 4);
        cr_expect_eq(memcmp(&gss, &want, sizeof want), 0, "share_sumsq n=%zu: %.17g vs CPU %.17g",
                     n, gss, want);
        cr_expect_eq(gbad, 0);
        /* a NaN in `now` is flagged by both */
        a[n / 2] = NAN;
        GPU_OK(loco_cuda_copy(da, a, n * 4, NULL));
        loco_share_sumsq(a, b, n, 3.0, &bad);
        GPU_OK(loco_cuda_share_sumsq(dss, da, db, n, 3.0, dbad, NULL));
        to_host(&gbad, dbad, 4);
        cr_expect(bad && gbad == 1, "n=%zu: NaN flagged cpu %d gpu %u", n, bad, gbad);
        a[n / 2] = 0.5f;
        GPU_OK(loco_cuda_copy(da, a, n * 4, NULL));

        for (int nest = 0; nest < 2; nest++) {
            loco_outer_update(th2, m2, tl, a, b, g, n, 0.7f, 0.9f, nest);
            GPU_OK(loco_cuda_outer_update(dth2, dm2, dtl, da, db, dg, n, 0.7f, 0.9f, nest, NULL));
            float *gt = down_f(dth2, n), *gm = down_f(dm2, n), *gl = down_f(dtl, n);
            EXPECT_SAME_BITS("outer_update θ", gt, th2, n);
            EXPECT_SAME_BITS("outer_update momentum", gm, m2, n);
            EXPECT_SAME_BITS("outer_update θ_local", gl, th2, n);
            free(gt), free(gm), free(gl);
        }
        free(a), free(b), free(g), free(out), free(th2), free(m2), free(tl);
    }
    gpu_env_fini(&e);
}

/* ------------------------------------------------- device vs host outer */

enum { K = 3, N = 5000, CHUNK = 1024 }; /* 5 chunks, the last one short */

typedef struct {
    loco_outer *h[K], *d[K];
    float *tl[K];   /* host θ_local */
    float *dtl[K];  /* device θ_local */
    gpu_env e;
} rig;

static void rig_init(rig *r, loco_codec_kind k, loco_zstd_mode z, float ratio)
{
    gpu_env_init(&r->e, 8 << 20);
    loco_codec_params cp;
    loco_codec_params_default(&cp);
    cp.codec = k;
    cp.block = 64;
    cp.zstd = z;
    cp.chunk_bytes = CHUNK * 4;
    cp.threads = 2;
    cp.stochastic = k == LOCO_CODEC_INT4; /* one stochastic codec: the key per chunk */
    const loco_outer_params p = {.H = 1, .nesterov = true, .lr = 0.7f, .momentum = 0.9f,
                                 .max_delta_ratio = ratio};
    uint64_t s = 1234 + (uint64_t)k;
    float *theta0 = rand_f(&s, N, 1.0);
    float *d0 = dup_to_dev(&r->e, theta0, N * 4);
    for (int i = 0; i < K; i++) {
        GPU_OK(loco_outer_create(&r->h[i], &p, &cp, N, theta0));
        GPU_OK(loco_outer_create_device(&r->d[i], &p, &cp, N, d0));
        cr_assert(loco_outer_on_device(r->d[i]) && !loco_outer_on_device(r->h[i]));
        r->tl[i] = copy_f(theta0, N);
        r->dtl[i] = dalloc(&r->e, N * 4);
    }
    free(theta0);
}

static void rig_fini(rig *r)
{
    for (int i = 0; i < K; i++) {
        loco_outer_destroy(r->h[i]);
        loco_outer_destroy(r->d[i]);
        free(r->tl[i]);
    }
    gpu_env_fini(&r->e);
}

/* Inner training stand-in: θ_local moves by a random step per island,
 * copied to the device for the device states. */
static void train(rig *r, uint64_t seed)
{
    uint64_t s = seed;
    for (int i = 0; i < K; i++) {
        float *g = rand_f(&s, N, 1e-2 * (i + 1));
        for (size_t j = 0; j < N; j++)
            r->tl[i][j] -= g[j];
        GPU_OK(loco_cuda_copy(r->dtl[i], r->tl[i], N * 4, NULL));
        GPU_OK(loco_cuda_sync(NULL));
        free(g);
    }
}

typedef struct {
    unsigned char *b[K][8];
    size_t len[K][8];
} wire;

/* Encodes every island's chunks on both paths: the bytes must be the same. */
static size_t encode_all(rig *r, wire *w, int64_t step, size_t *payload_bytes)
{
    size_t nc = 0, ncd = 0;
    *payload_bytes = 0;
    for (int i = 0; i < K; i++) {
        GPU_OK(loco_outer_plan(r->h[i], r->tl[i], step, &nc));
        GPU_OK(loco_outer_plan(r->d[i], r->dtl[i], step, &ncd));
        cr_assert_eq(nc, ncd);
        cr_assert_eq(loco_outer_planned_zstd(r->h[i]), loco_outer_planned_zstd(r->d[i]),
                     "zstd=auto decided differently");
        for (size_t c = 0; c < nc; c++) {
            const void *hb, *db;
            size_t hl, dl;
            GPU_OK(loco_outer_encode_chunk(r->h[i], 0, c, &hb, &hl));
            GPU_OK(loco_outer_encode_chunk(r->d[i], 1, c, &db, &dl));
            cr_expect_eq(dl, hl, "island %d chunk %zu: %zu bytes on the device path, %zu host", i,
                         c, dl, hl);
            cr_expect_eq(memcmp(db, hb, hl < dl ? hl : dl), 0,
                         "island %d chunk %zu: bytes differ", i, c);
            w->b[i][c] = malloc(hl);
            memcpy(w->b[i][c], hb, hl);
            w->len[i][c] = hl;
            loco_chunk_info info;
            GPU_OK(loco_chunk_parse(hb, hl, &info));
            *payload_bytes += info.raw_len;
        }
    }
    return nc;
}

static void wire_free(wire *w, size_t nc)
{
    for (int i = 0; i < K; i++)
        for (size_t c = 0; c < nc; c++)
            free(w->b[i][c]);
}

/* Every island adds every chunk in island order on both paths (worker 1,
 * as the exchange's decoding thread); the codes and refusals must agree.
 * Returns the first refusal's code (0 if none). */
static int add_all(rig *r, wire *w, size_t nc, int *refused)
{
    int first = 0;
    *refused = -1;
    for (int me = 0; me < K; me++) {
        loco_outer_begin_average(r->h[me], K);
        loco_outer_begin_average(r->d[me], K);
        for (size_t c = 0; c < nc; c++)
            for (int i = 0; i < K; i++) {
                const int a = loco_outer_add_chunk(r->h[me], 1, i, w->b[i][c], w->len[i][c]);
                const int b = loco_outer_add_chunk(r->d[me], 1, i, w->b[i][c], w->len[i][c]);
                cr_expect_eq(b, a, "island %d adding chunk %zu of %d: device %d, host %d", me, c,
                             i, b, a);
                cr_expect_eq(loco_outer_refused(r->d[me]), loco_outer_refused(r->h[me]));
                if (a < 0 && !first) {
                    first = a;
                    *refused = loco_outer_refused(r->h[me]);
                }
            }
        cr_expect_eq(memcmp((double[]){loco_outer_delta_ratio(r->d[me])},
                            (double[]){loco_outer_delta_ratio(r->h[me])}, sizeof(double)),
                     0, "delta ratio %.17g vs host %.17g", loco_outer_delta_ratio(r->d[me]),
                     loco_outer_delta_ratio(r->h[me]));
    }
    return first;
}

static void apply_and_compare(rig *r)
{
    for (int i = 0; i < K; i++) {
        GPU_OK(loco_outer_apply_chunk(r->h[i], 1, r->tl[i]));
        GPU_OK(loco_outer_apply_chunk(r->d[i], 1, r->dtl[i]));
        GPU_OK(loco_outer_apply(r->h[i], r->tl[i]));
        GPU_OK(loco_outer_apply(r->d[i], r->dtl[i]));
        float *gl = down_f(r->dtl[i], N);
        EXPECT_SAME_BITS("θ_local", gl, r->tl[i], N);
        free(gl);
        EXPECT_SAME_BITS("θ_global", loco_outer_theta(r->d[i]), loco_outer_theta(r->h[i]), N);
        EXPECT_SAME_BITS("momentum", loco_outer_momentum(r->d[i]),
                         loco_outer_momentum(r->h[i]), N);
        cr_expect_eq(loco_outer_hash(r->d[i]), loco_outer_hash(r->h[i]));
    }
}

static void two_steps(loco_codec_kind k, loco_zstd_mode z)
{
    rig r;
    rig_init(&r, k, z, 0);
    for (int64_t step = 1; step <= 2; step++) {
        train(&r, 100 + (uint64_t)step);
        for (int i = 0; i < K; i++)
            loco_outer_take_pcie_bytes(r.d[i]);
        wire w;
        size_t pay = 0;
        const size_t nc = encode_all(&r, &w, step, &pay);
        cr_assert_eq(nc, (N + CHUNK - 1) / CHUNK);
        int refused;
        cr_expect_eq(add_all(&r, &w, nc, &refused), 0, "a contribution was refused");
        /* What crossed PCIe on island i: its own payloads out, every
         * island's in, two flag words per encoded chunk and a norm and a
         * flag per added chunk, plus zstd=auto's sample of Δ, against the
         * fp32 range twice of the host path. */
        for (int i = 0; i < K; i++) {
            size_t own = 0;
            for (size_t c = 0; c < nc; c++) {
                loco_chunk_info info;
                GPU_OK(loco_chunk_parse(w.b[i][c], w.len[i][c], &info));
                own += info.raw_len;
            }
            const uint64_t want = own + pay + nc * 8 + K * nc * 12 +
                                  (z == LOCO_ZSTD_AUTO ? N * 4 : 0);
            const uint64_t got = loco_outer_take_pcie_bytes(r.d[i]);
            cr_expect_eq(got, want, "%s island %d: %llu bytes over PCIe, expected %llu",
                         loco_codec_name(k), i, (unsigned long long)got,
                         (unsigned long long)want);
            /* (zstd=auto's sample is all of Δ at this small N) */
            if (z != LOCO_ZSTD_AUTO)
                cr_expect_lt(got, (uint64_t)N * 4 * 2, "%s: no PCIe saved", loco_codec_name(k));
        }
        apply_and_compare(&r);
        /* the hash read θ_global back: one fp32 copy of the range */
        for (int i = 0; i < K; i++)
            cr_expect_eq(loco_outer_take_pcie_bytes(r.d[i]), (uint64_t)N * 4 * 2,
                         "θ_global and momentum read back once each");
        wire_free(&w, nc);
    }
    rig_fini(&r);
}

Test(gpu_outer, int8_zstd_on) { two_steps(LOCO_CODEC_INT8, LOCO_ZSTD_ON); }
Test(gpu_outer, int4_stochastic) { two_steps(LOCO_CODEC_INT4, LOCO_ZSTD_OFF); }
Test(gpu_outer, fp8_zstd_auto) { two_steps(LOCO_CODEC_FP8, LOCO_ZSTD_AUTO); }
Test(gpu_outer, topk_zstd_on) { two_steps(LOCO_CODEC_TOPK, LOCO_ZSTD_ON); }

/* Rewrites the checksums of a chunk whose payload was patched. */
static void reseal(unsigned char *b, size_t len)
{
    loco_put_le64(b + 48, loco_hash64(b + LOCO_CHUNK_HEADER_BYTES, len - LOCO_CHUNK_HEADER_BYTES));
    loco_put_le64(b + 56, loco_hash64(b, 56));
}

/* Island 1 sends a chunk that decodes to NaN (fp32 codec: a NaN value; int8:
 * a NaN scale, refused before decoding), or island 2 a poisoned Δ 1000
 * times too large (refused on its norm): both paths refuse the same island
 * with the same code, and the states agree after a clean retry. */
static void refusal(loco_codec_kind k, int how)
{
    rig r;
    rig_init(&r, k, LOCO_ZSTD_OFF, 8);
    train(&r, 7);
    if (how == 2) {
        loco_outer_poison_next(r.h[2], 1000.0f);
        loco_outer_poison_next(r.d[2], 1000.0f);
    }
    for (int i = 0; i < K; i++) {
        loco_outer_save(r.h[i]);
        loco_outer_save(r.d[i]);
    }
    wire w;
    size_t pay;
    const size_t nc = encode_all(&r, &w, 1, &pay);
    if (how == 1) {
        unsigned char *b = w.b[1][2];
        const float nan = NAN;
        /* fp32: value 17; int8: the scale of block 3 */
        memcpy(b + LOCO_CHUNK_HEADER_BYTES + 4 * (k == LOCO_CODEC_NONE ? 17 : 3), &nan, 4);
        reseal(b, w.len[1][2]);
    }
    int refused;
    const int rc = add_all(&r, &w, nc, &refused);
    cr_expect_eq(rc, LOCO_EREFUSED, "%s: expected a refusal, got %d", loco_codec_name(k), rc);
    cr_expect_eq(refused, how, "refused island %d, expected %d", refused, how);
    wire_free(&w, nc);
    /* A redo with the honest bytes, as the island would: same result. */
    for (int i = 0; i < K; i++) {
        loco_outer_restore(r.h[i]);
        loco_outer_restore(r.d[i]);
    }
    const size_t nc2 = encode_all(&r, &w, 2, &pay);
    cr_expect_eq(add_all(&r, &w, nc2, &refused), 0);
    apply_and_compare(&r);
    wire_free(&w, nc2);
    rig_fini(&r);
}

Test(gpu_outer, nan_value_refused) { refusal(LOCO_CODEC_NONE, 1); }
Test(gpu_outer, nan_scale_refused) { refusal(LOCO_CODEC_INT8, 1); }
Test(gpu_outer, outlier_refused) { refusal(LOCO_CODEC_INT8, 2); }

/* State written on the host side (checkpoint, rejoin) reaches the device. */
Test(gpu_outer, set_state_reaches_device)
{
    rig r;
    rig_init(&r, LOCO_CODEC_INT8, LOCO_ZSTD_OFF, 0);
    uint64_t s = 5;
    float *th = rand_f(&s, N, 1.0), *mo = rand_f(&s, N, 1e-3);
    for (int i = 0; i < K; i++) {
        loco_outer_set_state(r.h[i], th, mo);
        loco_outer_set_state(r.d[i], th, mo);
    }
    free(th), free(mo);
    train(&r, 9);
    wire w;
    size_t pay;
    const size_t nc = encode_all(&r, &w, 3, &pay);
    int refused;
    cr_expect_eq(add_all(&r, &w, nc, &refused), 0);
    apply_and_compare(&r);
    wire_free(&w, nc);
    /* the host-only paths say so */
    const void *b;
    size_t len;
    cr_expect_eq(loco_outer_encode(r.d[0], r.dtl[0], 4, &b, &len, NULL), LOCO_EINVAL);
    cr_expect_eq(loco_outer_rs_plan(r.d[0], 4), LOCO_EINVAL);
    rig_fini(&r);
}

#endif /* LOCO_HAVE_CUDA */
