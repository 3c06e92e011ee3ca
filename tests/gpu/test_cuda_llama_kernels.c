/* The Llama-family twins (kernels/cuda/rmsnorm.cu, rope.cu, swiglu.cu)
 * against their CPU twins on random inputs of awkward sizes: fp32 within
 * 1e-5 relative, bf16 within 1e-2 (the CPU twin run on the same
 * bf16-rounded inputs). Every test skips, with the reason, where there is
 * no device or no CUDA build; the kernel emulator (tests/gpu/emu) compiles
 * this file unchanged. */
#include <criterion/criterion.h>

#ifndef LOCO_HAVE_CUDA
Test(gpu_llama, skipped)
{
    cr_skip_test("built without the CUDA toolkit (no nvcc found by make): "
                 "kernels/cuda not compiled");
}
#else

#include "tests/gpu/gpu_test.h"

enum { SLAB = 16 << 20 };

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

/* Downloads n values of fp32 or bf16 as fp32 (malloc'd). */
static float *down(const void *d, size_t n, bool bf16)
{
    if (!bf16)
        return down_f(d, n);
    loco_bf16 *h = malloc((n ? n : 1) * 2);
    cr_assert_not_null(h);
    to_host(h, d, n * 2);
    float *x = bf_to_f(h, n);
    free(h);
    return x;
}

/* ------------------------------------------------------------------ RMSNorm */

static void check_rmsnorm(bool bf16, int N, int C, float eps, uint64_t seed)
{
    gpu_env e;
    gpu_env_init(&e, SLAB);
    uint64_t s = seed;
    const size_t n = (size_t)N * C, es = bf16 ? 2 : 4;
    float *x = rand_f(&s, n, 2.0), *w = rand_f(&s, C, 1.0), *dout = rand_f(&s, n, 1.0);
    float *dinp = rand_f(&s, n, 0.5), *dw = rand_f(&s, C, 0.5);
    for (size_t i = 0; i < n; i++) /* rows of different scales */
        x[i] *= (float)(1 + i / C % 3);
    void *d_x = up(&e, x, n, bf16), *d_w = up(&e, w, C, bf16), *d_dout = up(&e, dout, n, bf16);
    void *d_dinp = up(&e, dinp, n, bf16), *d_dw = dup_to_dev(&e, dw, C * 4);
    void *d_out = dalloc(&e, n * es), *d_rstd = dalloc(&e, N * 4);
    if (!bf16) {
        GPU_OK(loco_cuda_rmsnorm_fwd(d_out, d_rstd, d_x, d_w, N, C, eps, NULL));
        GPU_OK(loco_cuda_rmsnorm_bwd(d_dinp, d_dw, d_dout, d_x, d_w, d_rstd, N, C, NULL));
    } else {
        GPU_OK(loco_cuda_rmsnorm_fwd_bf16(d_out, d_rstd, d_x, d_w, N, C, eps, NULL));
        GPU_OK(loco_cuda_rmsnorm_bwd_bf16(d_dinp, d_dw, d_dout, d_x, d_w, d_rstd, N, C, NULL));
    }
    float *gout = down(d_out, n, bf16), *gdinp = down(d_dinp, n, bf16);
    float *grstd = down_f(d_rstd, N), *gdw = down_f(d_dw, C);
    float *out = malloc(n * 4), *rstd = malloc(N * 4);
    loco_rmsnorm_fwd(out, rstd, x, w, N, C, eps);
    loco_rmsnorm_bwd(dinp, dw, dout, x, w, rstd, N, C);
    const double tol = bf16 ? TOL_BF16 : TOL_F32;
    EXPECT_NEAR("rmsnorm out", gout, out, n, tol);
    EXPECT_NEAR("rmsnorm rstd", grstd, rstd, N, TOL_F32);
    EXPECT_NEAR("rmsnorm dinp", gdinp, dinp, n, tol);
    EXPECT_NEAR("rmsnorm dw", gdw, dw, C, TOL_F32);
    free(x), free(w), free(dout), free(dinp), free(dw), free(gout), free(gdinp), free(grstd);
    free(gdw), free(out), free(rstd);
    gpu_env_fini(&e);
}

Test(gpu_llama, rmsnorm_f32) { check_rmsnorm(false, 37, 203, 1e-5f, 1); }
Test(gpu_llama, rmsnorm_f32_wide) { check_rmsnorm(false, 9, 1000, 1e-6f, 2); }
Test(gpu_llama, rmsnorm_bf16) { check_rmsnorm(true, 41, 264, 1e-5f, 3); }

/* --------------------------------------------------------------------- RoPE */

/* The forward, then the backward of another gradient, on rows of ld floats
 * with n_heads heads of hs at their start; positions pos (host, uploaded)
 * or t. What lies beyond the heads must keep its bits. */
static void check_rope(bool bf16, int B, int T, int n_heads, int hs, int ld, bool use_pos,
                       const loco_rope_scaling *sc, uint64_t seed)
{
    gpu_env e;
    gpu_env_init(&e, SLAB);
    uint64_t s = seed;
    const int max_pos = 2 * T + 3, h = hs / 2;
    const size_t n = (size_t)B * T * ld, nt = (size_t)max_pos * h;
    float *ct = malloc(nt * 4), *st = malloc(nt * 4);
    loco_rope_tables(ct, st, max_pos, hs, 500000.0f, sc);
    int32_t *pos = fill_i(T, 0);
    for (int t = 0; t < T; t++) /* zig-zag: the second half first */
        pos[t] = t < T / 2 ? T + 1 + t : t - T / 2;
    float *x = rand_f(&s, n, 2.0), *dx = rand_f(&s, n, 1.0);
    void *d_x = up(&e, x, n, bf16), *d_dx = up(&e, dx, n, bf16);
    void *d_ct = dup_to_dev(&e, ct, nt * 4), *d_st = dup_to_dev(&e, st, nt * 4);
    void *d_pos = dup_to_dev(&e, pos, (size_t)T * 4);
    const int *pp = use_pos ? d_pos : NULL;
    if (!bf16) {
        GPU_OK(loco_cuda_rope_fwd(d_x, ld, B, T, n_heads, hs, pp, d_ct, d_st, NULL));
        GPU_OK(loco_cuda_rope_bwd(d_dx, ld, B, T, n_heads, hs, pp, d_ct, d_st, NULL));
    } else {
        GPU_OK(loco_cuda_rope_fwd_bf16(d_x, ld, B, T, n_heads, hs, pp, d_ct, d_st, NULL));
        GPU_OK(loco_cuda_rope_bwd_bf16(d_dx, ld, B, T, n_heads, hs, pp, d_ct, d_st, NULL));
    }
    float *gx = down(d_x, n, bf16), *gdx = down(d_dx, n, bf16);
    float *x0 = copy_f(x, n), *dx0 = copy_f(dx, n);
    loco_rope_fwd(x, ld, B, T, n_heads, hs, use_pos ? pos : NULL, ct, st);
    loco_rope_bwd(dx, ld, B, T, n_heads, hs, use_pos ? pos : NULL, ct, st);
    const double tol = bf16 ? TOL_BF16 : TOL_F32;
    EXPECT_NEAR("rope fwd", gx, x, n, tol);
    EXPECT_NEAR("rope bwd", gdx, dx, n, tol);
    bool kept = true;
    for (size_t r = 0; r < (size_t)B * T; r++)
        for (int c = n_heads * hs; c < ld; c++) {
            const size_t k = r * ld + c;
            kept &= !memcmp(&gx[k], &x0[k], 4) && !memcmp(&gdx[k], &dx0[k], 4);
        }
    cr_expect(kept, "rope twin wrote outside the heads of a row");
    free(ct), free(st), free(pos), free(x), free(dx), free(gx), free(gdx), free(x0), free(dx0);
    gpu_env_fini(&e);
}

Test(gpu_llama, rope_f32) { check_rope(false, 2, 9, 3, 8, 24, false, NULL, 4); }
/* a q block inside a GQA qkv row, zig-zag positions, Llama 3.1's tables */
static const loco_rope_scaling llama31 = {8.0f, 1.0f, 4.0f, 8192};
Test(gpu_llama, rope_f32_positions) { check_rope(false, 3, 10, 4, 16, 70, true, &llama31, 5); }
Test(gpu_llama, rope_bf16) { check_rope(true, 2, 12, 2, 32, 96, true, &llama31, 6); }

Test(gpu_llama, rope_odd_head_size_refused)
{
    gpu_env e;
    gpu_env_init(&e, SLAB);
    void *d = dalloc(&e, 64);
    cr_expect_eq(loco_cuda_rope_fwd(d, 6, 1, 1, 1, 5, NULL, d, d, NULL), LOCO_EINVAL);
    cr_expect_eq(loco_cuda_rope_bwd_bf16(d, 6, 1, 1, 1, 5, NULL, d, d, NULL), LOCO_EINVAL);
    gpu_env_fini(&e);
}

/* ------------------------------------------------------------------- SwiGLU */

static void check_swiglu(bool bf16, int N, int F, uint64_t seed)
{
    gpu_env e;
    gpu_env_init(&e, SLAB);
    uint64_t s = seed;
    const size_t nf = (size_t)N * F, n2 = 2 * nf, es = bf16 ? 2 : 4;
    float *gu = rand_f(&s, n2, 6.0), *dout = rand_f(&s, nf, 1.0), *dgu = rand_f(&s, n2, 0.5);
    gu[0] = 90.0f, gu[1] = -90.0f; /* saturated gates */
    void *d_gu = up(&e, gu, n2, bf16), *d_dout = up(&e, dout, nf, bf16);
    void *d_dgu = up(&e, dgu, n2, bf16), *d_out = dalloc(&e, nf * es);
    if (!bf16) {
        GPU_OK(loco_cuda_swiglu_fwd(d_out, d_gu, N, F, NULL));
        GPU_OK(loco_cuda_swiglu_bwd(d_dgu, d_gu, d_dout, N, F, NULL));
    } else {
        GPU_OK(loco_cuda_swiglu_fwd_bf16(d_out, d_gu, N, F, NULL));
        GPU_OK(loco_cuda_swiglu_bwd_bf16(d_dgu, d_gu, d_dout, N, F, NULL));
    }
    float *gout = down(d_out, nf, bf16), *gdgu = down(d_dgu, n2, bf16);
    float *out = malloc(nf * 4);
    loco_swiglu_fwd(out, gu, N, F);
    loco_swiglu_bwd(dgu, gu, dout, N, F);
    const double tol = bf16 ? TOL_BF16 : TOL_F32;
    EXPECT_NEAR("swiglu out", gout, out, nf, tol);
    EXPECT_NEAR("swiglu dgu", gdgu, dgu, n2, tol);
    free(gu), free(dout), free(dgu), free(gout), free(gdgu), free(out);
    gpu_env_fini(&e);
}

Test(gpu_llama, swiglu_f32) { check_swiglu(false, 13, 77, 7); }
Test(gpu_llama, swiglu_bf16) { check_swiglu(true, 7, 136, 8); }

#endif
