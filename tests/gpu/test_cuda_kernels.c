/* kernels/cuda against their CPU twins (kernels/cpu) on random inputs of
 * awkward sizes: fp32 twins within 1e-5 relative, bf16 twins within 1e-2
 * (the CPU twin run on the same bf16-rounded inputs). Every test skips,
 * with the reason, where there is no device or no CUDA build.
 *
 * Why one file: one twin per test over shared input generators and bounds;
 * the kernel emulator (tests/gpu/emu) compiles it unchanged. */
#include <criterion/criterion.h>

#ifndef LOCO_HAVE_CUDA
Test(gpu_kernels, skipped)
{
    cr_skip_test("built without the CUDA toolkit (no nvcc found by make): "
                 "kernels/cuda not compiled");
}
#else

#include "tests/gpu/gpu_test.h"

enum { SLAB = 64 << 20 };

/* ------------------------------------------------------------- encoder */

static void check_encoder(bool bf16, int B, int T, int C, int V, uint64_t seed)
{
    gpu_env e;
    gpu_env_init(&e, SLAB);
    uint64_t s = seed;
    const size_t N = (size_t)B * T, nout = N * C;
    int32_t *tok = malloc(N * sizeof *tok);
    for (size_t i = 0; i < N; i++) /* repeats on purpose: a small range */
        tok[i] = (int32_t)(gpu_splitmix(&s) % (uint64_t)(i % 3 ? V : 5));
    float *wte = rand_f(&s, (size_t)V * C, 1.0), *wpe = rand_f(&s, (size_t)(T + 3) * C, 1.0);
    float *dout = rand_f(&s, nout, 1.0);
    float *dwte = rand_f(&s, (size_t)V * C, 0.5), *dwpe = rand_f(&s, (size_t)(T + 3) * C, 0.5);
    float *out = malloc(nout * sizeof *out), *got = malloc(nout * sizeof *got);
    float *gdwte = malloc((size_t)V * C * 4), *gdwpe = malloc((size_t)(T + 3) * C * 4);
    void *d_tok = dup_to_dev(&e, tok, N * 4);
    void *d_dwte = dup_to_dev(&e, dwte, (size_t)V * C * 4);
    void *d_dwpe = dup_to_dev(&e, dwpe, (size_t)(T + 3) * C * 4);
    if (!bf16) {
        void *d_wte = dup_to_dev(&e, wte, (size_t)V * C * 4);
        void *d_wpe = dup_to_dev(&e, wpe, (size_t)(T + 3) * C * 4);
        void *d_out = dalloc(&e, nout * 4), *d_dout = dup_to_dev(&e, dout, nout * 4);
        GPU_OK(loco_cuda_encoder_fwd(d_out, d_tok, d_wte, d_wpe, B, T, C, NULL));
        GPU_OK(loco_cuda_encoder_bwd(d_dwte, d_dwpe, d_dout, d_tok, B, T, C, NULL));
        to_host(got, d_out, nout * 4);
    } else {
        loco_bf16 *hwte = round_bf(wte, (size_t)V * C), *hwpe = round_bf(wpe, (size_t)(T + 3) * C);
        loco_bf16 *hdout = round_bf(dout, nout), *hout = malloc(nout * 2);
        void *d_wte = dup_to_dev(&e, hwte, (size_t)V * C * 2);
        void *d_wpe = dup_to_dev(&e, hwpe, (size_t)(T + 3) * C * 2);
        void *d_out = dalloc(&e, nout * 2), *d_dout = dup_to_dev(&e, hdout, nout * 2);
        GPU_OK(loco_cuda_encoder_fwd_bf16(d_out, d_tok, d_wte, d_wpe, B, T, C, NULL));
        GPU_OK(loco_cuda_encoder_bwd_bf16(d_dwte, d_dwpe, d_dout, d_tok, B, T, C, NULL));
        to_host(hout, d_out, nout * 2);
        float *f = bf_to_f(hout, nout);
        memcpy(got, f, nout * 4);
        free(f);
        free(hwte);
        free(hwpe);
        free(hdout);
        free(hout);
    }
    to_host(gdwte, d_dwte, (size_t)V * C * 4);
    to_host(gdwpe, d_dwpe, (size_t)(T + 3) * C * 4);
    loco_encoder_fwd(out, tok, wte, wpe, B, T, C);
    loco_encoder_bwd(dwte, dwpe, dout, tok, B, T, C);
    const double tol = bf16 ? TOL_BF16 : TOL_F32;
    EXPECT_NEAR("encoder out", got, out, nout, tol);
    EXPECT_NEAR("encoder dwte", gdwte, dwte, (size_t)V * C, TOL_F32);
    EXPECT_NEAR("encoder dwpe", gdwpe, dwpe, (size_t)(T + 3) * C, TOL_F32);
    free(tok), free(wte), free(wpe), free(dout), free(dwte), free(dwpe);
    free(out), free(got), free(gdwte), free(gdwpe);
    gpu_env_fini(&e);
}

Test(gpu_kernels, encoder_f32) { check_encoder(false, 3, 37, 45, 101, 1); }
Test(gpu_kernels, encoder_bf16) { check_encoder(true, 2, 65, 96, 50, 2); }

/* ----------------------------------------------------------- layernorm */

static void check_layernorm(bool bf16, int N, int C, uint64_t seed)
{
    gpu_env e;
    gpu_env_init(&e, SLAB);
    uint64_t s = seed;
    const size_t n = (size_t)N * C;
    float *x = rand_f(&s, n, 2.0), *w = rand_f(&s, C, 1.0), *b = rand_f(&s, C, 1.0);
    float *dout = rand_f(&s, n, 1.0), *dinp = rand_f(&s, n, 0.5);
    float *dw = rand_f(&s, C, 0.5), *db = rand_f(&s, C, 0.5);
    for (int c = 0; c < C; c++) /* an offset per row: the mean matters */
        x[c] += 3.0f;
    float *out = malloc(n * 4), *mean = malloc(N * 4), *rstd = malloc(N * 4);
    float *gout = malloc(n * 4), *gdinp = malloc(n * 4), *gmean = malloc(N * 4),
          *grstd = malloc(N * 4), *gdw = malloc(C * 4), *gdb = malloc(C * 4);
    void *d_mean = dalloc(&e, N * 4), *d_rstd = dalloc(&e, N * 4);
    void *d_dw = dup_to_dev(&e, dw, C * 4), *d_db = dup_to_dev(&e, db, C * 4);
    if (!bf16) {
        void *d_x = dup_to_dev(&e, x, n * 4), *d_w = dup_to_dev(&e, w, C * 4);
        void *d_b = dup_to_dev(&e, b, C * 4), *d_out = dalloc(&e, n * 4);
        void *d_dout = dup_to_dev(&e, dout, n * 4), *d_dinp = dup_to_dev(&e, dinp, n * 4);
        GPU_OK(loco_cuda_layernorm_fwd(d_out, d_mean, d_rstd, d_x, d_w, d_b, N, C, NULL));
        GPU_OK(loco_cuda_layernorm_bwd(d_dinp, d_dw, d_db, d_dout, d_x, d_w, d_mean, d_rstd, N,
                                       C, NULL));
        to_host(gout, d_out, n * 4);
        to_host(gdinp, d_dinp, n * 4);
    } else {
        loco_bf16 *hx = round_bf(x, n), *hw = round_bf(w, C), *hb = round_bf(b, C);
        loco_bf16 *hdout = round_bf(dout, n), *hdinp = round_bf(dinp, n);
        void *d_x = dup_to_dev(&e, hx, n * 2), *d_w = dup_to_dev(&e, hw, C * 2);
        void *d_b = dup_to_dev(&e, hb, C * 2), *d_out = dalloc(&e, n * 2);
        void *d_dout = dup_to_dev(&e, hdout, n * 2), *d_dinp = dup_to_dev(&e, hdinp, n * 2);
        GPU_OK(loco_cuda_layernorm_fwd_bf16(d_out, d_mean, d_rstd, d_x, d_w, d_b, N, C, NULL));
        GPU_OK(loco_cuda_layernorm_bwd_bf16(d_dinp, d_dw, d_db, d_dout, d_x, d_w, d_mean, d_rstd,
                                            N, C, NULL));
        to_host(hx, d_out, n * 2);
        float *f = bf_to_f(hx, n);
        memcpy(gout, f, n * 4);
        free(f);
        to_host(hdinp, d_dinp, n * 2);
        f = bf_to_f(hdinp, n);
        memcpy(gdinp, f, n * 4);
        free(f);
        free(hx), free(hw), free(hb), free(hdout), free(hdinp);
    }
    to_host(gmean, d_mean, N * 4);
    to_host(grstd, d_rstd, N * 4);
    to_host(gdw, d_dw, C * 4);
    to_host(gdb, d_db, C * 4);
    loco_layernorm_fwd(out, mean, rstd, x, w, b, N, C);
    loco_layernorm_bwd(dinp, dw, db, dout, x, w, mean, rstd, N, C);
    const double tol = bf16 ? TOL_BF16 : TOL_F32;
    EXPECT_NEAR("layernorm out", gout, out, n, tol);
    EXPECT_NEAR("layernorm mean", gmean, mean, N, TOL_F32);
    EXPECT_NEAR("layernorm rstd", grstd, rstd, N, TOL_F32);
    EXPECT_NEAR("layernorm dinp", gdinp, dinp, n, tol);
    EXPECT_NEAR("layernorm dw", gdw, dw, C, TOL_F32);
    EXPECT_NEAR("layernorm db", gdb, db, C, TOL_F32);
    free(x), free(w), free(b), free(dout), free(dinp), free(dw), free(db), free(out);
    free(mean), free(rstd), free(gout), free(gdinp), free(gmean), free(grstd), free(gdw);
    free(gdb);
    gpu_env_fini(&e);
}

Test(gpu_kernels, layernorm_f32) { check_layernorm(false, 37, 203, 3); }
Test(gpu_kernels, layernorm_f32_gpt2) { check_layernorm(false, 70, 768, 4); }
Test(gpu_kernels, layernorm_bf16) { check_layernorm(true, 41, 264, 5); }

/* -------------------------------------------------------------- matmul */

/* Uploads x as fp32 or (rounding x in place) as bf16. */
static void *up(gpu_env *e, float *x, size_t n, bool bf16)
{
    if (!bf16)
        return dup_to_dev(e, x, n * 4);
    loco_bf16 *h = round_bf(x, n);
    void *d = dup_to_dev(e, h, n * 2);
    free(h);
    return d;
}

/* Downloads n values of fp32 or bf16 as fp32. */
static float *down(const void *d, size_t n, bool bf16)
{
    float *x = malloc((n ? n : 1) * 4);
    if (!bf16) {
        to_host(x, d, n * 4);
        return x;
    }
    loco_bf16 *h = malloc((n ? n : 1) * 2);
    to_host(h, d, n * 2);
    for (size_t i = 0; i < n; i++)
        x[i] = bf2f(h[i]);
    free(h);
    return x;
}

static void check_matmul(bool bf16, int N, int C, int OC, bool wt, bool with_bias, uint64_t seed)
{
    gpu_env e;
    gpu_env_init(&e, SLAB);
    loco_blas *h = NULL;
    GPU_OK(loco_blas_create(&h));
    uint64_t s = seed;
    const size_t nin = (size_t)N * C, nw = (size_t)C * OC, nout = (size_t)N * OC;
    const size_t es = bf16 ? 2 : 4;
    float *x = rand_f(&s, nin, 1.0), *w = rand_f(&s, nw, 1.0), *bias = rand_f(&s, OC, 1.0);
    float *dout = rand_f(&s, nout, 1.0), *dinp = rand_f(&s, nin, 0.5);
    float *dw = rand_f(&s, nw, 0.5), *dbias = rand_f(&s, OC, 0.5);
    float *out = malloc(nout * 4);
    void *d_x = up(&e, x, nin, bf16), *d_w = up(&e, w, nw, bf16), *d_b = up(&e, bias, OC, bf16);
    void *d_dout = up(&e, dout, nout, bf16), *d_dinp = up(&e, dinp, nin, bf16);
    void *d_dw = dup_to_dev(&e, dw, nw * 4), *d_db = dup_to_dev(&e, dbias, OC * 4);
    void *d_out = dalloc(&e, nout * es);
    const void *bb = with_bias ? d_b : NULL;
    if (!bf16) {
        GPU_OK(loco_cuda_matmul_fwd(h, d_out, d_x, d_w, bb, N, C, OC, wt, NULL));
        GPU_OK(loco_cuda_matmul_bwd(h, d_dinp, d_dw, with_bias ? d_db : NULL, d_dout, d_x, d_w,
                                    N, C, OC, wt, NULL));
    } else {
        GPU_OK(loco_cuda_matmul_fwd_bf16(h, d_out, d_x, d_w, bb, N, C, OC, wt, NULL));
        GPU_OK(loco_cuda_matmul_bwd_bf16(h, d_dinp, d_dw, with_bias ? d_db : NULL, d_dout, d_x,
                                         d_w, N, C, OC, wt, NULL));
    }
    float *gout = down(d_out, nout, bf16), *gdinp = down(d_dinp, nin, bf16);
    float *gdw = down(d_dw, nw, false), *gdb = down(d_db, OC, false);
    loco_matmul_fwd(out, x, w, with_bias ? bias : NULL, N, C, OC, wt);
    loco_matmul_bwd(dinp, dw, with_bias ? dbias : NULL, dout, x, w, N, C, OC, wt);
    const double tol = bf16 ? TOL_BF16 : TOL_F32;
    EXPECT_NEAR("matmul out", gout, out, nout, tol);
    EXPECT_NEAR("matmul dinp", gdinp, dinp, nin, tol);
    EXPECT_NEAR("matmul dw", gdw, dw, nw, tol);
    EXPECT_NEAR("matmul dbias", gdb, dbias, OC, TOL_F32);
    free(x), free(w), free(bias), free(dout), free(dinp), free(dw), free(dbias), free(out);
    free(gout), free(gdinp), free(gdw), free(gdb);
    loco_blas_destroy(h);
    gpu_env_fini(&e);
}

Test(gpu_kernels, matmul_f32) { check_matmul(false, 37, 53, 71, false, true, 6); }
Test(gpu_kernels, matmul_f32_nobias) { check_matmul(false, 64, 48, 40, false, false, 7); }
Test(gpu_kernels, matmul_f32_transposed) { check_matmul(false, 37, 53, 71, true, false, 8); }
Test(gpu_kernels, matmul_bf16) { check_matmul(true, 64, 96, 136, false, true, 9); }
Test(gpu_kernels, matmul_bf16_transposed) { check_matmul(true, 40, 64, 104, true, false, 10); }
Test(gpu_kernels, matmul_bf16_awkward) { check_matmul(true, 37, 53, 71, false, true, 11); }
/* the bias gradient from the dw GEMM's epilogue over B (transposed w) */
Test(gpu_kernels, matmul_f32_transposed_bias) { check_matmul(false, 37, 53, 71, true, true, 31); }
Test(gpu_kernels, matmul_bf16_transposed_bias) { check_matmul(true, 40, 64, 104, true, true, 32); }

/* dbias alone (no dw GEMM to carry it): the column-sum kernel. */
Test(gpu_kernels, matmul_dbias_only)
{
    enum { N = 45, C = 16, OC = 70 };
    gpu_env e;
    gpu_env_init(&e, SLAB);
    loco_blas *h = NULL;
    GPU_OK(loco_blas_create(&h));
    uint64_t s = 33;
    float *x = rand_f(&s, N * C, 1.0), *w = rand_f(&s, C * OC, 1.0);
    float *dout = rand_f(&s, N * OC, 1.0), *dbias = rand_f(&s, OC, 0.5), *got = malloc(OC * 4);
    void *d_x = dup_to_dev(&e, x, N * C * 4), *d_w = dup_to_dev(&e, w, C * OC * 4);
    void *d_dout = dup_to_dev(&e, dout, N * OC * 4), *d_db = dup_to_dev(&e, dbias, OC * 4);
    GPU_OK(loco_cuda_matmul_bwd(h, NULL, NULL, d_db, d_dout, d_x, d_w, N, C, OC, false, NULL));
    to_host(got, d_db, OC * 4);
    loco_matmul_bwd(NULL, NULL, dbias, dout, x, w, N, C, OC, false);
    EXPECT_NEAR("dbias alone", got, dbias, OC, TOL_F32);
    free(x), free(w), free(dout), free(dbias), free(got);
    loco_blas_destroy(h);
    gpu_env_fini(&e);
}

static void check_matmul_gelu(bool bf16, int N, int C, int OC, uint64_t seed)
{
    gpu_env e;
    gpu_env_init(&e, SLAB);
    loco_blas *h = NULL;
    GPU_OK(loco_blas_create(&h));
    uint64_t s = seed;
    const size_t nin = (size_t)N * C, nw = (size_t)C * OC, nout = (size_t)N * OC;
    const size_t es = bf16 ? 2 : 4;
    float *x = rand_f(&s, nin, 1.0), *w = rand_f(&s, nw, 0.3), *bias = rand_f(&s, OC, 1.0);
    float *pre = malloc(nout * 4), *out = malloc(nout * 4);
    void *d_x = up(&e, x, nin, bf16), *d_w = up(&e, w, nw, bf16), *d_b = up(&e, bias, OC, bf16);
    void *d_out = dalloc(&e, nout * es), *d_pre = dalloc(&e, nout * es);
    if (!bf16)
        GPU_OK(loco_cuda_matmul_gelu_fwd(h, d_out, d_pre, d_x, d_w, d_b, N, C, OC, NULL));
    else
        GPU_OK(loco_cuda_matmul_gelu_fwd_bf16(h, d_out, d_pre, d_x, d_w, d_b, N, C, OC, NULL));
    float *gout = down(d_out, nout, bf16), *gpre = down(d_pre, nout, bf16);
    loco_matmul_fwd(pre, x, w, bias, N, C, OC, false);
    loco_gelu_fwd(out, pre, nout);
    const double tol = bf16 ? TOL_BF16 : TOL_F32;
    EXPECT_NEAR("matmul+gelu pre", gpre, pre, nout, tol);
    EXPECT_NEAR("matmul+gelu out", gout, out, nout, tol);
    free(x), free(w), free(bias), free(pre), free(out), free(gout), free(gpre);
    loco_blas_destroy(h);
    gpu_env_fini(&e);
}

Test(gpu_kernels, matmul_gelu_f32) { check_matmul_gelu(false, 64, 96, 128, 12); }
Test(gpu_kernels, matmul_gelu_f32_awkward) { check_matmul_gelu(false, 37, 53, 71, 13); }
Test(gpu_kernels, matmul_gelu_bf16_epilogue) { check_matmul_gelu(true, 64, 96, 128, 14); }
Test(gpu_kernels, matmul_gelu_bf16_awkward) { check_matmul_gelu(true, 37, 56, 71, 30); }

/* The MLP projection's backward with GELU's gradient in the epilogue
 * (bf16): dpre written (whatever it held), dw and dbias accumulated, as
 * the CPU twins loco_matmul_bwd into a zeroed dinp then loco_gelu_bwd.
 * C not a multiple of 8: 1, nothing written. */
static void check_matmul_dgelu(int N, int C, int OC, uint64_t seed)
{
    gpu_env e;
    gpu_env_init(&e, SLAB);
    loco_blas *h = NULL;
    GPU_OK(loco_blas_create(&h));
    uint64_t s = seed;
    const size_t nin = (size_t)N * C, nw = (size_t)C * OC, nout = (size_t)N * OC;
    float *x = rand_f(&s, nin, 1.0), *pre = rand_f(&s, nin, 2.0), *w = rand_f(&s, nw, 0.5);
    float *dout = rand_f(&s, nout, 1.0), *dw = rand_f(&s, nw, 0.5), *dbias = rand_f(&s, OC, 0.5);
    float *junk = rand_f(&s, nin, 9.0);
    void *d_x = up(&e, x, nin, true), *d_pre = up(&e, pre, nin, true), *d_w = up(&e, w, nw, true);
    void *d_dout = up(&e, dout, nout, true), *d_dpre = up(&e, junk, nin, true);
    void *d_dw = dup_to_dev(&e, dw, nw * 4), *d_db = dup_to_dev(&e, dbias, OC * 4);
    const int rc = loco_cuda_matmul_bwd_dgelu_bf16(h, d_dpre, d_dw, d_db, d_dout, d_x, d_w, d_pre,
                                                   N, C, OC, NULL);
    cr_assert_geq(rc, 0, "%s", loco_errmsg());
    float *gdpre = down(d_dpre, nin, true), *gdw = down(d_dw, nw, false);
    float *gdb = down(d_db, OC, false);
    if (C % 8) {
        cr_expect_eq(rc, 1, "C = %d: the epilogue needs aux's ld a multiple of 8", C);
        cr_expect_eq(memcmp(gdpre, junk, nin * 4), 0, "dpre written although refused");
        cr_expect_eq(memcmp(gdw, dw, nw * 4), 0, "dw written although refused");
    } else {
        cr_expect_eq(rc, 0, "the DGELU epilogue refused %dx%dx%d", N, C, OC);
        float *dfchg = calloc(nin, 4), *dpre = calloc(nin, 4);
        loco_matmul_bwd(dfchg, dw, dbias, dout, x, w, N, C, OC, false);
        loco_gelu_bwd(dpre, pre, dfchg, nin);
        EXPECT_NEAR("dgelu dpre", gdpre, dpre, nin, TOL_BF16);
        EXPECT_NEAR("dgelu dw", gdw, dw, nw, TOL_BF16);
        EXPECT_NEAR("dgelu dbias", gdb, dbias, OC, TOL_F32);
        free(dfchg), free(dpre);
    }
    free(x), free(pre), free(w), free(dout), free(dw), free(dbias), free(junk);
    free(gdpre), free(gdw), free(gdb);
    loco_blas_destroy(h);
    gpu_env_fini(&e);
}

Test(gpu_kernels, matmul_dgelu_bf16) { check_matmul_dgelu(40, 128, 32, 33); }
Test(gpu_kernels, matmul_dgelu_bf16_refused) { check_matmul_dgelu(17, 36, 24, 34); }

/* The emulator's fake cuBLASLt counts its heuristic queries and live
 * descriptor/layout/preference objects; a real build has no such
 * functions (NULL here), and the plan cache's own counters stand alone. */
extern long loco_emu_lt_heuristics(void) __attribute__((weak));
extern long loco_emu_lt_live_objects(void) __attribute__((weak));

static long emu_heuristics(void) { return loco_emu_lt_heuristics ? loco_emu_lt_heuristics() : -1; }
static long emu_live(void) { return loco_emu_lt_live_objects ? loco_emu_lt_live_objects() : -1; }

static void expect_plans(const loco_blas *h, uint64_t hits, uint64_t misses, long heur0)
{
    uint64_t ht = 0, ms = 0;
    loco_blas_plan_stats(h, &ht, &ms);
    cr_expect_eq(ht, hits, "plan cache hits %llu, expected %llu", (unsigned long long)ht,
                 (unsigned long long)hits);
    cr_expect_eq(ms, misses, "plan cache misses %llu, expected %llu", (unsigned long long)ms,
                 (unsigned long long)misses);
    if (heur0 >= 0)
        cr_expect_eq(emu_heuristics() - heur0, (long)misses,
                     "the heuristic ran %ld times for %llu plans", emu_heuristics() - heur0,
                     (unsigned long long)misses);
}

/* N GEMMs of one key: one plan (one heuristic query), the first call's
 * bits every time, and each call's own bias pointer on the cached
 * descriptor; a fresh handle gives the same bits; another shape is
 * another plan. */
Test(gpu_kernels, matmul_plan_cache)
{
    enum { N = 37, C = 53, OC = 72, REPS = 5 };
    gpu_env e;
    gpu_env_init(&e, SLAB);
    const long live0 = emu_live(), heur0 = emu_heuristics();
    loco_blas *h = NULL, *h2 = NULL;
    GPU_OK(loco_blas_create(&h));
    uint64_t s = 41;
    float *x = rand_f(&s, N * C, 1.0), *w = rand_f(&s, C * OC, 1.0);
    float *b1 = rand_f(&s, OC, 1.0), *b2 = rand_f(&s, OC, 1.0), *ref = malloc(N * OC * 4);
    float *d_x = dup_to_dev(&e, x, N * C * 4), *d_w = dup_to_dev(&e, w, C * OC * 4);
    float *d_b1 = dup_to_dev(&e, b1, OC * 4), *d_b2 = dup_to_dev(&e, b2, OC * 4);
    float *d_first = dalloc(&e, N * OC * 4), *d_out = dalloc(&e, N * OC * 4);
    float *first = malloc(N * OC * 4), *got = malloc(N * OC * 4);
    GPU_OK(loco_cuda_matmul_fwd(h, d_first, d_x, d_w, d_b1, N, C, OC, false, NULL));
    to_host(first, d_first, N * OC * 4);
    expect_plans(h, 0, 1, heur0);
    for (int r = 0; r < REPS; r++) {
        GPU_OK(loco_cuda_matmul_fwd(h, d_out, d_x, d_w, d_b1, N, C, OC, false, NULL));
        to_host(got, d_out, N * OC * 4);
        cr_expect_eq(memcmp(got, first, N * OC * 4), 0, "call %d: not the first call's bits", r);
    }
    expect_plans(h, REPS, 1, heur0);
    /* same key, another bias buffer: the cached descriptor takes it */
    GPU_OK(loco_cuda_matmul_fwd(h, d_out, d_x, d_w, d_b2, N, C, OC, false, NULL));
    to_host(got, d_out, N * OC * 4);
    loco_matmul_fwd(ref, x, w, b2, N, C, OC, false);
    EXPECT_NEAR("cached plan, second bias", got, ref, N * OC, TOL_F32);
    expect_plans(h, REPS + 1, 1, heur0);
    /* a fresh handle (no plan yet) gives the cached path's bits */
    GPU_OK(loco_blas_create(&h2));
    GPU_OK(loco_cuda_matmul_fwd(h2, d_out, d_x, d_w, d_b1, N, C, OC, false, NULL));
    to_host(got, d_out, N * OC * 4);
    cr_expect_eq(memcmp(got, first, N * OC * 4), 0, "a fresh handle gives other bits");
    loco_blas_destroy(h2);
    /* another shape (fewer rows, no bias): another plan */
    GPU_OK(loco_cuda_matmul_fwd(h, d_out, d_x, d_w, NULL, N - 7, C, OC, false, NULL));
    to_host(got, d_out, (N - 7) * OC * 4);
    loco_matmul_fwd(ref, x, w, NULL, N - 7, C, OC, false);
    EXPECT_NEAR("second plan", got, ref, (N - 7) * OC, TOL_F32);
    expect_plans(h, REPS + 1, 2, heur0 >= 0 ? heur0 + 1 : -1); /* + h2's query */
    loco_blas_destroy(h);
    if (live0 >= 0)
        cr_expect_eq(emu_live(), live0, "%ld cuBLASLt objects outlive their handles",
                     emu_live() - live0);
    free(x), free(w), free(b1), free(b2), free(ref), free(first), free(got);
    gpu_env_fini(&e);
}

/* The fused GELU epilogue from a cached plan writes this call's aux (pre)
 * buffer, not the one the plan was built with. */
Test(gpu_kernels, matmul_plan_cache_gelu_aux)
{
    enum { N = 24, C = 40, OC = 64 };
    gpu_env e;
    gpu_env_init(&e, SLAB);
    loco_blas *h = NULL;
    GPU_OK(loco_blas_create(&h));
    uint64_t s = 43;
    float *x = rand_f(&s, N * C, 1.0), *w = rand_f(&s, C * OC, 0.3), *b = rand_f(&s, OC, 1.0);
    void *d_x = up(&e, x, N * C, true), *d_w = up(&e, w, C * OC, true), *d_b = up(&e, b, OC, true);
    void *out[2], *pre[2];
    for (int i = 0; i < 2; i++) {
        out[i] = dalloc(&e, N * OC * 2);
        pre[i] = dalloc(&e, N * OC * 2);
        GPU_OK(loco_cuda_zero(pre[i], N * OC * 2, NULL));
        GPU_OK(loco_cuda_matmul_gelu_fwd_bf16(h, out[i], pre[i], d_x, d_w, d_b, N, C, OC, NULL));
    }
    float *o0 = down(out[0], N * OC, true), *o1 = down(out[1], N * OC, true);
    float *p0 = down(pre[0], N * OC, true), *p1 = down(pre[1], N * OC, true);
    float *ref = malloc(N * OC * 4);
    loco_matmul_fwd(ref, x, w, b, N, C, OC, false);
    EXPECT_NEAR("pre, first call", p0, ref, N * OC, TOL_BF16);
    cr_expect_eq(memcmp(p0, p1, N * OC * 4), 0, "the second call's pre differs");
    cr_expect_eq(memcmp(o0, o1, N * OC * 4), 0, "the second call's out differs");
    uint64_t hits = 0, misses = 0;
    loco_blas_plan_stats(h, &hits, &misses);
    /* one plan (the fused epilogue), or two where cuBLASLt offers no fused
     * GELU for this shape (the refusal and the bias GEMM): each reused once */
    cr_expect(hits >= 1 && hits == misses, "%llu hits, %llu misses for two identical calls",
              (unsigned long long)hits, (unsigned long long)misses);
    free(x), free(w), free(b), free(o0), free(o1), free(p0), free(p1), free(ref);
    loco_blas_destroy(h);
    gpu_env_fini(&e);
}

/* More keys than slots: the least recently used plan goes (its cuBLASLt
 * objects with it), a recent one stays. */
Test(gpu_kernels, matmul_plan_cache_eviction)
{
    enum { KEYS = 70, C = 8, OC = 8, SLOTS = 64 };
    gpu_env e;
    gpu_env_init(&e, SLAB);
    const long live0 = emu_live();
    loco_blas *h = NULL;
    GPU_OK(loco_blas_create(&h));
    uint64_t s = 47;
    float *x = rand_f(&s, KEYS * C, 1.0), *w = rand_f(&s, C * OC, 1.0);
    float *ref = malloc(KEYS * OC * 4), *got = malloc(KEYS * OC * 4);
    float *d_x = dup_to_dev(&e, x, KEYS * C * 4), *d_w = dup_to_dev(&e, w, C * OC * 4);
    float *d_out = dalloc(&e, KEYS * OC * 4);
    for (int n = 1; n <= KEYS; n++) /* n rows: KEYS keys */
        GPU_OK(loco_cuda_matmul_fwd(h, d_out, d_x, d_w, NULL, n, C, OC, false, NULL));
    expect_plans(h, 0, KEYS, -1);
    if (live0 >= 0) /* each plan: a descriptor and three layouts */
        cr_expect_eq(emu_live() - live0, 4 * SLOTS, "%ld live cuBLASLt objects",
                     emu_live() - live0);
    GPU_OK(loco_cuda_matmul_fwd(h, d_out, d_x, d_w, NULL, KEYS, C, OC, false, NULL));
    expect_plans(h, 1, KEYS, -1);
    GPU_OK(loco_cuda_matmul_fwd(h, d_out, d_x, d_w, NULL, 1, C, OC, false, NULL));
    expect_plans(h, 1, KEYS + 1, -1);
    GPU_OK(loco_cuda_matmul_fwd(h, d_out, d_x, d_w, NULL, 5, C, OC, false, NULL));
    to_host(got, d_out, 5 * OC * 4);
    loco_matmul_fwd(ref, x, w, NULL, 5, C, OC, false);
    EXPECT_NEAR("after eviction", got, ref, 5 * OC, TOL_F32);
    loco_blas_destroy(h);
    if (live0 >= 0)
        cr_expect_eq(emu_live(), live0, "%ld cuBLASLt objects outlive the handle",
                     emu_live() - live0);
    free(x), free(w), free(ref), free(got);
    gpu_env_fini(&e);
}

/* ----------------------------------------------------------- attention */

static void check_attention(bool bf16, int B, int T, int C, int NH, uint64_t seed)
{
    gpu_env e;
    gpu_env_init(&e, SLAB);
    uint64_t s = seed;
    const size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C;
    const size_t natt = (size_t)B * NH * T * T, nrow = (size_t)B * NH * T;
    float *qkv = rand_f(&s, nqkv, 2.0), *dout = rand_f(&s, nout, 1.0);
    float *dqkv = rand_f(&s, nqkv, 0.5);
    float *out = malloc(nout * 4), *att = malloc(natt * 4), *datt = malloc(natt * 4);
    void *d_qkv = up(&e, qkv, nqkv, bf16), *d_dout = up(&e, dout, nout, bf16);
    void *d_dqkv = up(&e, dqkv, nqkv, bf16);
    void *d_out = dalloc(&e, nout * (bf16 ? 2 : 4));
    void *d_lse = dalloc(&e, nrow * 4), *d_scr = dalloc(&e, nrow * 4);
    if (!bf16) {
        GPU_OK(loco_cuda_attention_fwd(d_out, d_lse, d_qkv, B, T, C, NH, NULL));
        GPU_OK(loco_cuda_attention_bwd(d_dqkv, d_scr, d_dout, d_out, d_qkv, d_lse, B, T, C, NH,
                                       NULL));
    } else {
        GPU_OK(loco_cuda_attention_fwd_bf16(d_out, d_lse, d_qkv, B, T, C, NH, NULL));
        GPU_OK(loco_cuda_attention_bwd_bf16(d_dqkv, d_scr, d_dout, d_out, d_qkv, d_lse, B, T, C,
                                            NH, NULL));
    }
    float *gout = down(d_out, nout, bf16), *gdqkv = down(d_dqkv, nqkv, bf16);
    loco_attention_fwd(out, att, qkv, B, T, C, NH);
    loco_attention_bwd(dqkv, datt, dout, qkv, att, B, T, C, NH);
    const double tol = bf16 ? TOL_BF16 : TOL_F32;
    EXPECT_NEAR("attention out", gout, out, nout, tol);
    EXPECT_NEAR("attention dqkv", gdqkv, dqkv, nqkv, tol);
    free(qkv), free(dout), free(dqkv), free(out), free(att), free(datt), free(gout);
    free(gdqkv);
    gpu_env_fini(&e);
}

Test(gpu_kernels, attention_f32_hs12) { check_attention(false, 2, 77, 48, 4, 15); }
Test(gpu_kernels, attention_f32_hs64) { check_attention(false, 1, 130, 192, 3, 16); }
Test(gpu_kernels, attention_f32_hs128) { check_attention(false, 1, 70, 256, 2, 17); }
Test(gpu_kernels, attention_f32_hs40) { check_attention(false, 2, 33, 120, 3, 18); }
Test(gpu_kernels, attention_bf16_hs64) { check_attention(true, 2, 129, 128, 2, 19); }
Test(gpu_kernels, attention_bf16_hs12) { check_attention(true, 1, 61, 36, 3, 20); }

/* ------------------------------------------------ GELU, residual, casts */

static void check_gelu_residual(bool bf16, size_t n, uint64_t seed)
{
    gpu_env e;
    gpu_env_init(&e, SLAB);
    uint64_t s = seed;
    float *x = rand_f(&s, n, 4.0), *y = rand_f(&s, n, 1.0), *dout = rand_f(&s, n, 1.0);
    float *dinp = rand_f(&s, n, 0.5), *da = rand_f(&s, n, 0.5), *db = rand_f(&s, n, 0.5);
    float *g = malloc(n * 4), *r = malloc(n * 4);
    const size_t es = bf16 ? 2 : 4;
    void *d_x = up(&e, x, n, bf16), *d_y = up(&e, y, n, bf16), *d_dout = up(&e, dout, n, bf16);
    void *d_dinp = up(&e, dinp, n, bf16), *d_da = up(&e, da, n, bf16), *d_db = up(&e, db, n, bf16);
    void *d_g = dalloc(&e, n * es), *d_r = dalloc(&e, n * es);
    if (!bf16) {
        GPU_OK(loco_cuda_gelu_fwd(d_g, d_x, n, NULL));
        GPU_OK(loco_cuda_gelu_bwd(d_dinp, d_x, d_dout, n, NULL));
        GPU_OK(loco_cuda_residual_fwd(d_r, d_x, d_y, n, NULL));
        GPU_OK(loco_cuda_residual_bwd(d_da, d_db, d_dout, n, NULL));
    } else {
        GPU_OK(loco_cuda_gelu_fwd_bf16(d_g, d_x, n, NULL));
        GPU_OK(loco_cuda_gelu_bwd_bf16(d_dinp, d_x, d_dout, n, NULL));
        GPU_OK(loco_cuda_residual_fwd_bf16(d_r, d_x, d_y, n, NULL));
        GPU_OK(loco_cuda_residual_bwd_bf16(d_da, d_db, d_dout, n, NULL));
    }
    float *gg = down(d_g, n, bf16), *gdinp = down(d_dinp, n, bf16), *gr = down(d_r, n, bf16);
    float *gda = down(d_da, n, bf16), *gdb = down(d_db, n, bf16);
    loco_gelu_fwd(g, x, n);
    loco_gelu_bwd(dinp, x, dout, n);
    loco_residual_fwd(r, x, y, n);
    loco_residual_bwd(da, db, dout, n);
    const double tol = bf16 ? TOL_BF16 : TOL_F32;
    EXPECT_NEAR("gelu fwd", gg, g, n, tol);
    EXPECT_NEAR("gelu bwd", gdinp, dinp, n, tol);
    EXPECT_NEAR("residual fwd", gr, r, n, tol);
    EXPECT_NEAR("residual bwd a", gda, da, n, tol);
    EXPECT_NEAR("residual bwd b", gdb, db, n, tol);
    free(x), free(y), free(dout), free(dinp), free(da), free(db), free(g), free(r);
    free(gg), free(gdinp), free(gr), free(gda), free(gdb);
    gpu_env_fini(&e);
}

Test(gpu_kernels, gelu_residual_f32) { check_gelu_residual(false, 10007, 21); }
Test(gpu_kernels, gelu_residual_bf16) { check_gelu_residual(true, 4099, 22); }

Test(gpu_kernels, residual_in_place)
{
    gpu_env e;
    gpu_env_init(&e, SLAB);
    uint64_t s = 23;
    const size_t n = 5003;
    float *a = rand_f(&s, n, 1.0), *b = rand_f(&s, n, 1.0), *r = malloc(n * 4);
    void *d_a = dup_to_dev(&e, a, n * 4), *d_b = dup_to_dev(&e, b, n * 4);
    GPU_OK(loco_cuda_residual_fwd(d_a, d_a, d_b, n, NULL));
    float *got = down(d_a, n, false);
    loco_residual_fwd(r, a, b, n);
    cr_expect_eq(memcmp(got, r, n * 4), 0, "residual in place differs from the CPU");
    free(a), free(b), free(r), free(got);
    gpu_env_fini(&e);
}

Test(gpu_kernels, casts)
{
    gpu_env e;
    gpu_env_init(&e, SLAB);
    uint64_t s = 24;
    const size_t n = 7777;
    float *x = rand_f(&s, n, 100.0);
    loco_bf16 *want = malloc(n * 2), *got = malloc(n * 2);
    for (size_t i = 0; i < n; i++)
        want[i] = f2bf(x[i]);
    void *d_x = dup_to_dev(&e, x, n * 4), *d_h = dalloc(&e, n * 2), *d_f = dalloc(&e, n * 4);
    GPU_OK(loco_cuda_cast_bf16(d_h, d_x, n, NULL));
    GPU_OK(loco_cuda_cast_f32(d_f, d_h, n, NULL));
    to_host(got, d_h, n * 2);
    float *back = down(d_f, n, false);
    cr_expect_eq(memcmp(got, want, n * 2), 0, "cast to bf16 is not round-to-nearest-even");
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(back[i], bf2f(want[i]), "cast to fp32 at %zu", i);
    free(x), free(want), free(got), free(back);
    gpu_env_fini(&e);
}

/* --------------------------------------------------------- cross-entropy */

/* stride > V: a padded vocabulary; the padding columns hold large logits
 * that must stay out of the softmax, and their dlogits must be 0. The CPU
 * twin's strided form is itself checked against the plain one on the
 * compacted rows. */
static void check_xent(bool bf16, int N, int V, int stride, bool in_place, uint64_t seed)
{
    gpu_env e;
    gpu_env_init(&e, SLAB);
    uint64_t s = seed;
    const size_t n = (size_t)N * stride;
    float *logits = rand_f(&s, n, 8.0), *dl = malloc(n * 4), *loss = malloc(N * 4);
    int32_t *tgt = malloc(N * 4);
    for (int i = 0; i < N; i++) {
        tgt[i] = i % 7 == 3 ? -1 : (int32_t)(gpu_splitmix(&s) % (uint64_t)V);
        for (int j = V; j < stride; j++)
            logits[(size_t)i * stride + j] = 60.0f;
    }
    const float dscale = 1.0f / 3.0f;
    void *d_l = up(&e, logits, n, bf16), *d_t = dup_to_dev(&e, tgt, N * 4);
    void *d_loss = dalloc(&e, N * 4);
    void *d_dl = in_place ? d_l : dalloc(&e, n * (bf16 ? 2 : 4));
    if (!bf16)
        GPU_OK(loco_cuda_xent_fwd_bwd(d_loss, d_dl, d_l, d_t, N, V, stride, dscale, NULL));
    else
        GPU_OK(loco_cuda_xent_fwd_bwd_bf16(d_loss, d_dl, d_l, d_t, N, V, stride, dscale, NULL));
    float *gloss = down(d_loss, N, false), *gdl = down(d_dl, n, bf16);
    loco_xent_fwd_bwd_strided(loss, dl, logits, tgt, N, V, stride, dscale);
    EXPECT_NEAR("xent losses", gloss, loss, N, TOL_F32);
    EXPECT_NEAR("xent dlogits", gdl, dl, n, bf16 ? TOL_BF16 : TOL_F32);
    for (int i = 0; i < N; i++)
        for (int j = V; j < stride; j++)
            cr_assert_eq(gdl[(size_t)i * stride + j], 0.0f, "padding dlogit row %d col %d", i, j);
    if (stride > V) {
        float *cl = malloc((size_t)N * V * 4), *cd = malloc((size_t)N * V * 4);
        float *closs = malloc(N * 4);
        for (int i = 0; i < N; i++)
            memcpy(cl + (size_t)i * V, logits + (size_t)i * stride, (size_t)V * 4);
        loco_xent_fwd_bwd(closs, cd, cl, tgt, N, V, dscale);
        for (int i = 0; i < N; i++) {
            cr_assert_eq(closs[i], loss[i], "strided CPU twin's loss row %d", i);
            cr_assert_eq(memcmp(cd + (size_t)i * V, dl + (size_t)i * stride, (size_t)V * 4), 0,
                         "strided CPU twin's dlogits row %d", i);
            for (int j = V; j < stride; j++)
                cr_assert_eq(dl[(size_t)i * stride + j], 0.0f, "CPU padding dlogit %d,%d", i, j);
        }
        free(cl), free(cd), free(closs);
    }
    free(logits), free(dl), free(loss), free(tgt), free(gloss), free(gdl);
    gpu_env_fini(&e);
}

Test(gpu_kernels, xent_f32) { check_xent(false, 37, 1003, 1003, false, 25); }
Test(gpu_kernels, xent_f32_in_place_gpt2_vocab) { check_xent(false, 9, 50257, 50257, true, 26); }
Test(gpu_kernels, xent_bf16_in_place) { check_xent(true, 23, 3001, 3001, true, 27); }
Test(gpu_kernels, xent_f32_padded_vocab) { check_xent(false, 11, 257, 320, false, 28); }
Test(gpu_kernels, xent_bf16_in_place_padded_vocab) { check_xent(true, 13, 250, 256, true, 29); }

/* ------------------------------------------------ AdamW, sumsq, scale */

Test(gpu_kernels, adamw)
{
    gpu_env e;
    gpu_env_init(&e, SLAB);
    uint64_t s = 28;
    const size_t n = 10007;
    float *p = rand_f(&s, n, 1.0), *g = rand_f(&s, n, 1.0), *m = rand_f(&s, n, 0.1);
    float *v = rand_f(&s, n, 0.1);
    for (size_t i = 0; i < n; i++)
        v[i] = fabsf(v[i]);
    void *d_p = dup_to_dev(&e, p, n * 4), *d_g = dup_to_dev(&e, g, n * 4);
    void *d_m = dup_to_dev(&e, m, n * 4), *d_v = dup_to_dev(&e, v, n * 4);
    for (int64_t t = 1; t <= 3; t++) {
        GPU_OK(loco_cuda_adamw_update(d_p, d_g, d_m, d_v, n, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, t,
                                      NULL));
        loco_adamw_update(p, g, m, v, n, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, t);
    }
    float *gp = down(d_p, n, false), *gm = down(d_m, n, false), *gv = down(d_v, n, false);
    EXPECT_NEAR("adamw p", gp, p, n, TOL_F32);
    EXPECT_NEAR("adamw m", gm, m, n, TOL_F32);
    EXPECT_NEAR("adamw v", gv, v, n, TOL_F32);
    free(p), free(g), free(m), free(v), free(gp), free(gm), free(gv);
    gpu_env_fini(&e);
}

Test(gpu_kernels, sumsq_scale)
{
    gpu_env e;
    gpu_env_init(&e, SLAB);
    uint64_t s = 29;
    const size_t sizes[] = {0, 1, 255, 1000003};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        const size_t n = sizes[k];
        float *x = rand_f(&s, n, 3.0);
        void *d_x = dup_to_dev(&e, x, (n ? n : 1) * 4);
        void *d_out = dalloc(&e, LOCO_CUDA_SUMSQ_OUT * sizeof(double));
        double got[LOCO_CUDA_SUMSQ_OUT], again[LOCO_CUDA_SUMSQ_OUT];
        GPU_OK(loco_cuda_sumsq(d_out, d_x, n, NULL));
        to_host(got, d_out, sizeof got);
        GPU_OK(loco_cuda_sumsq(d_out, d_x, n, NULL));
        to_host(again, d_out, sizeof again);
        const double want = loco_sumsq(x, n);
        cr_expect_leq(fabs(got[0] - want), 1e-12 * (want + 1e-300) + 1e-300,
                      "sumsq of %zu: %.17g, CPU %.17g", n, got[0], want);
        cr_expect_eq(memcmp(got, again, sizeof got), 0, "sumsq is not repeatable");
        GPU_OK(loco_cuda_scale(d_x, 0.37f, n, NULL));
        loco_scale(x, 0.37f, n);
        float *gx = down(d_x, n, false);
        cr_expect_eq(memcmp(gx, x, n * 4), 0, "scale differs from the CPU");
        free(x), free(gx);
    }
    gpu_env_fini(&e);
}

Test(gpu_kernels, slab_refuses_overflow)
{
    gpu_env e;
    gpu_env_init(&e, 4096);
    void *a = NULL, *b = NULL;
    GPU_OK(loco_cuda_slab_alloc(e.slab, &a, 1000, "a"));
    cr_expect_eq((uintptr_t)a % 256, 0);
    cr_expect_eq(loco_cuda_slab_alloc(e.slab, &b, 4000, "b"), LOCO_ENOMEM);
    cr_expect(strstr(loco_errmsg(), "b needs 4000 bytes") != NULL, "%s", loco_errmsg());
    GPU_OK(loco_cuda_slab_alloc(e.slab, &b, 3072, "c"));
    cr_expect_eq((char *)b - (char *)a, 1024);
    gpu_env_fini(&e);
}

#endif /* LOCO_HAVE_CUDA */
