/* Grouped-query attention on the device against its CPU twins
 * (kernels/cpu/attention.c, attention_block.c), NKV in {NH, NH/2, 1}:
 * the reference kernel (attention.cu) in fp32 within 1e-5 and bf16 within
 * 1e-2, forward and a backward accumulating onto random gradients; the
 * tensor-core kernel (attention_tc.cu, head size 64) within the bf16 bound
 * of the CPU twin and of the reference kernel, its backward the same bits
 * twice; the blockwise kernels (attention_block.cu) with keys before, on and
 * around the queries, packed kv and whole qkv rows, within 1e-5, the
 * backward the same bits twice; shapes the kernels refuse. Every test
 * skips, with the reason, where there is no device or no CUDA build. */
#include <criterion/criterion.h>

#ifndef LOCO_HAVE_CUDA
Test(gpu_attention_gqa, skipped)
{
    cr_skip_test("built without the CUDA toolkit (no nvcc found by make): "
                 "kernels/cuda not compiled");
}
#else

#include "tests/gpu/gpu_test.h"

enum { SLAB = 64 << 20 };

/* B sequences of T tokens, NH query heads of hs reading NKV kv heads. */
typedef struct {
    int B, T, NH, NKV, hs;
} shape;

static int ld_of(const shape *g) { return (g->NH + 2 * g->NKV) * g->hs; }

/* Uploads n floats as fp32, or rounded to bf16 (x rounded in place too, so
 * the CPU twin sees the same inputs). */
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
    if (!bf16)
        return down_f(d, n);
    loco_bf16 *h = malloc((n ? n : 1) * 2);
    cr_assert_not_null(h);
    to_host(h, d, n * 2);
    float *x = bf_to_f(h, n);
    free(h);
    return x;
}

/* max |a - r| / max(max |r|, 1e-3): as rel_err, with a floor under the
 * scale for gradients that are zero but for rounding. */
static double err_floor(const float *a, const float *r, size_t n)
{
    double num = 0.0, den = 1e-3;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]))
            return INFINITY;
        num = fmax(num, fabs((double)a[i] - r[i]));
        den = fmax(den, fabs((double)r[i]));
    }
    return num / den;
}

#define EXPECT_FLOOR(what, a, r, n, tol)                                                     \
    do {                                                                                     \
        const double e_ = err_floor((a), (r), (n));                                          \
        cr_expect_leq(e_, (tol), "%s: rel err %.3g > %.3g", (what), e_, (double)(tol));      \
    } while (0)

/* --------------------------------------------- the reference kernel */

/* The CPU twin on the (rounded) inputs: out, and dqkv accumulated onto
 * dqkv. */
static void cpu_gqa(const shape *g, float *out, float *dqkv, const float *qkv, const float *dout)
{
    const size_t na = (size_t)g->B * g->NH * g->T * g->T;
    float *att = malloc(na * 4), *datt = malloc(na * 4);
    cr_assert(att && datt);
    loco_attention_gqa_fwd(out, att, qkv, g->B, g->T, g->NH, g->NKV, g->hs);
    loco_attention_gqa_bwd(dqkv, datt, dout, qkv, att, g->B, g->T, g->NH, g->NKV, g->hs);
    free(att), free(datt);
}

static void check_ref(bool bf16, shape g, uint64_t seed)
{
    gpu_env e;
    gpu_env_init(&e, SLAB);
    uint64_t s = seed;
    const size_t nx = (size_t)g.B * g.T * ld_of(&g), no = (size_t)g.B * g.T * g.NH * g.hs;
    const size_t nrow = (size_t)g.B * g.NH * g.T;
    float *qkv = rand_f(&s, nx, 2.0), *dout = rand_f(&s, no, 1.0), *dqkv = rand_f(&s, nx, 0.5);
    void *d_qkv = up(&e, qkv, nx, bf16), *d_dout = up(&e, dout, no, bf16);
    void *d_dqkv = up(&e, dqkv, nx, bf16), *d_out = dalloc(&e, no * (bf16 ? 2 : 4));
    void *d_lse = dalloc(&e, nrow * 4), *d_scr = dalloc(&e, nrow * 4);
    if (!bf16) {
        GPU_OK(loco_cuda_attention_gqa_fwd(d_out, d_lse, d_qkv, g.B, g.T, g.NH, g.NKV, g.hs,
                                           NULL));
        GPU_OK(loco_cuda_attention_gqa_bwd(d_dqkv, d_scr, d_dout, d_out, d_qkv, d_lse, g.B, g.T,
                                           g.NH, g.NKV, g.hs, NULL));
    } else {
        GPU_OK(loco_cuda_attention_gqa_fwd_bf16(d_out, d_lse, d_qkv, g.B, g.T, g.NH, g.NKV, g.hs,
                                                NULL));
        GPU_OK(loco_cuda_attention_gqa_bwd_bf16(d_dqkv, d_scr, d_dout, d_out, d_qkv, d_lse, g.B,
                                                g.T, g.NH, g.NKV, g.hs, NULL));
    }
    float *gout = down(d_out, no, bf16), *gdqkv = down(d_dqkv, nx, bf16);
    float *out = malloc(no * 4);
    cr_assert_not_null(out);
    cpu_gqa(&g, out, dqkv, qkv, dout);
    const double tol = bf16 ? TOL_BF16 : TOL_F32;
    EXPECT_NEAR("gqa out", gout, out, no, tol);
    EXPECT_NEAR("gqa dqkv", gdqkv, dqkv, nx, tol);
    free(qkv), free(dout), free(dqkv), free(gout), free(gdqkv), free(out);
    gpu_env_fini(&e);
}

/* B, T, NH, NKV, hs */
Test(gpu_attention_gqa, f32_hs12_nkv_eq_nh) { check_ref(false, (shape){2, 77, 4, 4, 12}, 401); }
Test(gpu_attention_gqa, f32_hs12_group2) { check_ref(false, (shape){2, 77, 4, 2, 12}, 402); }
Test(gpu_attention_gqa, f32_hs12_mqa) { check_ref(false, (shape){2, 77, 4, 1, 12}, 403); }
Test(gpu_attention_gqa, f32_hs40_group3) { check_ref(false, (shape){1, 33, 6, 2, 40}, 404); }
Test(gpu_attention_gqa, f32_hs128_mqa) { check_ref(false, (shape){1, 40, 2, 1, 128}, 405); }
Test(gpu_attention_gqa, bf16_hs64_nkv_eq_nh) { check_ref(true, (shape){1, 70, 4, 4, 64}, 406); }
Test(gpu_attention_gqa, bf16_hs64_group2) { check_ref(true, (shape){1, 70, 4, 2, 64}, 407); }
Test(gpu_attention_gqa, bf16_hs12_mqa) { check_ref(true, (shape){2, 61, 3, 1, 12}, 408); }

/* --------------------------------------------- the tensor-core kernel */

/* qkv (B,T,ld) rounded to bf16; dqkv starting at random values. The tc
 * kernel against the CPU twin and the reference kernel, its backward run
 * twice for its bits. */
static void check_tc(shape g, uint64_t seed)
{
    gpu_env e;
    gpu_env_init(&e, SLAB);
    uint64_t s = seed;
    const size_t nx = (size_t)g.B * g.T * ld_of(&g), no = (size_t)g.B * g.T * g.NH * g.hs;
    const size_t nrow = (size_t)g.B * g.NH * g.T;
    float *qkv = rand_f(&s, nx, 2.0), *dout = rand_f(&s, no, 1.0), *dqkv = rand_f(&s, nx, 0.5);
    void *d_qkv = up(&e, qkv, nx, true), *d_dout = up(&e, dout, no, true);
    loco_bf16 *h0 = round_bf(dqkv, nx);
    void *d_g[3];
    for (int k = 0; k < 3; k++) /* tc, tc again, reference */
        d_g[k] = dup_to_dev(&e, h0, nx * 2);
    void *d_out_tc = dalloc(&e, no * 2), *d_out_ref = dalloc(&e, no * 2);
    void *d_lse_tc = dalloc(&e, nrow * 4), *d_lse_ref = dalloc(&e, nrow * 4);
    void *d_scr = dalloc(&e, nrow * 4);
    GPU_OK(loco_cuda_attention_tc_gqa_fwd_bf16(d_out_tc, d_lse_tc, d_qkv, g.B, g.T, g.NH, g.NKV,
                                               g.hs, NULL));
    GPU_OK(loco_cuda_attention_gqa_fwd_bf16(d_out_ref, d_lse_ref, d_qkv, g.B, g.T, g.NH, g.NKV,
                                            g.hs, NULL));
    for (int k = 0; k < 2; k++)
        GPU_OK(loco_cuda_attention_tc_gqa_bwd_bf16(d_g[k], d_scr, d_dout, d_out_tc, d_qkv,
                                                   d_lse_tc, g.B, g.T, g.NH, g.NKV, g.hs, NULL));
    GPU_OK(loco_cuda_attention_gqa_bwd_bf16(d_g[2], d_scr, d_dout, d_out_ref, d_qkv, d_lse_ref,
                                            g.B, g.T, g.NH, g.NKV, g.hs, NULL));
    float *out_tc = down(d_out_tc, no, true), *out_ref = down(d_out_ref, no, true);
    float *lse_tc = down_f(d_lse_tc, nrow), *lse_ref = down_f(d_lse_ref, nrow);
    float *g_tc = down(d_g[0], nx, true), *g_tc2 = down(d_g[1], nx, true);
    float *g_ref = down(d_g[2], nx, true);
    float *out = malloc(no * 4);
    cr_assert_not_null(out);
    cpu_gqa(&g, out, dqkv, qkv, dout);

    EXPECT_FLOOR("tc out vs cpu", out_tc, out, no, TOL_BF16);
    EXPECT_FLOOR("tc out vs reference", out_tc, out_ref, no, TOL_BF16);
    double el = 0.0;
    for (size_t r = 0; r < nrow; r++)
        el = fmax(el, fabs((double)lse_tc[r] - lse_ref[r]));
    cr_expect_leq(el, 1e-3, "tc lse vs reference: max abs err %.3g", el);
    EXPECT_FLOOR("tc dqkv vs cpu", g_tc, dqkv, nx, TOL_BF16);
    EXPECT_FLOOR("tc dqkv vs reference", g_tc, g_ref, nx, TOL_BF16);
    EXPECT_SAME_BITS("tc backward run twice", g_tc, g_tc2, nx);
    cr_log_info("tc B=%d T=%d NH=%d NKV=%d: out %.3g, dqkv %.3g (vs cpu)", g.B, g.T, g.NH, g.NKV,
                err_floor(out_tc, out, no), err_floor(g_tc, dqkv, nx));
    free(qkv), free(dout), free(dqkv), free(h0), free(out_tc), free(out_ref), free(lse_tc);
    free(lse_ref), free(g_tc), free(g_tc2), free(g_ref), free(out);
    gpu_env_fini(&e);
}

Test(gpu_attention_gqa, tc_nkv_eq_nh) { check_tc((shape){2, 77, 4, 4, 64}, 411); }
Test(gpu_attention_gqa, tc_group2) { check_tc((shape){2, 77, 4, 2, 64}, 412); }
Test(gpu_attention_gqa, tc_mqa) { check_tc((shape){1, 130, 4, 1, 64}, 413); }
Test(gpu_attention_gqa, tc_group3_t1) { check_tc((shape){2, 1, 3, 1, 64}, 414); }

/* ------------------------------------------------ the blockwise kernels */

/* Queries [q0, q0+nq) of a T-long sequence x (B,T,ld) against its keys
 * [k0, k0+nk): the query block holds whole rows (q_ld = ld); the keys a
 * packed (B,nk,2 NKV hs) buffer, or whole rows (kv_ld = ld). */
typedef struct {
    shape g;
    int q0, nq, k0, nk;
    bool causal, packed;
} blk_case;

/* Columns [col, col+w) of rows [t0, t0+n) of each batch of x (B,T,ld). */
static float *slice(const blk_case *c, const float *x, int col, int w, int t0, int n)
{
    const int B = c->g.B, T = c->g.T, ld = ld_of(&c->g);
    float *y = malloc(((size_t)B * n * w + 1) * sizeof *y);
    cr_assert_not_null(y);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < n; t++)
            memcpy(y + ((size_t)b * n + t) * w, x + ((size_t)b * T + t0 + t) * ld + col,
                   (size_t)w * sizeof *y);
    return y;
}

/* -inf in the same rows, the finite ones within TOL_F32. */
static void expect_lse(const char *what, const float *got, const float *want, size_t n)
{
    for (size_t r = 0; r < n; r++) {
        if (want[r] == -INFINITY || got[r] == -INFINITY) {
            cr_expect(got[r] == want[r], "%s: row %zu lse %g, CPU %g", what, r, (double)got[r],
                      (double)want[r]);
            continue;
        }
        cr_expect_leq(fabs((double)got[r] - want[r]), TOL_F32 * fmax(1.0, fabs(want[r])),
                      "%s: row %zu lse %.9g, CPU %.9g", what, r, (double)got[r], (double)want[r]);
    }
}

static void check_block(blk_case c, uint64_t seed)
{
    gpu_env e;
    gpu_env_init(&e, SLAB);
    uint64_t s = seed;
    const shape *g = &c.g;
    const int B = g->B, NH = g->NH, NKV = g->NKV, hs = g->hs, ld = ld_of(g), C = NH * hs;
    const int KV = NKV * hs, kv_ld = c.packed ? 2 * KV : ld, koff = c.packed ? 0 : C;
    float *x = rand_f(&s, (size_t)B * g->T * ld, 2.0);
    float *qb = slice(&c, x, 0, ld, c.q0, c.nq);
    float *kvb = c.packed ? slice(&c, x, C, 2 * KV, c.k0, c.nk) : slice(&c, x, 0, ld, c.k0, c.nk);
    const size_t no = (size_t)B * c.nq * C, nl = (size_t)B * NH * c.nq;
    const size_t nq = (size_t)B * c.nq * ld, nkv = (size_t)B * c.nk * kv_ld;

    /* forward */
    float *out = malloc(no * 4), *lse = malloc(nl * 4);
    cr_assert(out && lse);
    loco_attention_block_gqa_fwd(out, lse, qb, ld, kvb + koff, kvb + koff + KV, kv_ld, B, c.nq,
                                 c.nk, NH, NKV, hs, c.q0, c.k0, c.causal);
    float *d_q = dup_to_dev(&e, qb, nq * 4), *d_kv = dup_to_dev(&e, kvb, nkv * 4);
    float *nan_o = fill_f(no, NAN), *nan_l = fill_f(nl, NAN); /* must be overwritten */
    float *d_out = dup_to_dev(&e, nan_o, no * 4), *d_lse = dup_to_dev(&e, nan_l, nl * 4);
    GPU_OK(loco_cuda_attention_block_gqa_fwd(d_out, d_lse, d_q, ld, d_kv + koff, d_kv + koff + KV,
                                             kv_ld, B, c.nq, c.nk, NH, NKV, hs, c.q0, c.k0,
                                             c.causal, NULL));
    float *gout = down_f(d_out, no), *glse = down_f(d_lse, nl);
    EXPECT_NEAR("block gqa out", gout, out, no, TOL_F32);
    expect_lse("block gqa lse", glse, lse, nl);

    /* backward from the CPU's out and lse, onto random gradients, twice */
    float *dout = rand_f(&s, no, 1.0), *dq = rand_f(&s, nq, 0.5), *dkv = rand_f(&s, nkv, 0.5);
    float *dq0 = copy_f(dq, nq), *dkv0 = copy_f(dkv, nkv), *delta = malloc(nl * 4);
    cr_assert_not_null(delta);
    loco_attention_delta(delta, dout, out, B, c.nq, C, NH);
    loco_attention_block_gqa_bwd(dq, ld, dkv + koff, dkv + koff + KV, kv_ld, dout, lse, delta, qb,
                                 ld, kvb + koff, kvb + koff + KV, kv_ld, B, c.nq, c.nk, NH, NKV,
                                 hs, c.q0, c.k0, c.causal);
    float *d_dout = dup_to_dev(&e, dout, no * 4), *d_delta = dup_to_dev(&e, delta, nl * 4);
    GPU_OK(loco_cuda_copy(d_lse, lse, nl * 4, NULL)); /* the same input as the CPU's */
    float *gdq[2], *gdkv[2];
    for (int k = 0; k < 2; k++) {
        float *d_dq = dup_to_dev(&e, dq0, nq * 4), *d_dkv = dup_to_dev(&e, dkv0, nkv * 4);
        GPU_OK(loco_cuda_attention_block_gqa_bwd(d_dq, ld, d_dkv + koff, d_dkv + koff + KV, kv_ld,
                                                 d_dout, d_lse, d_delta, d_q, ld, d_kv + koff,
                                                 d_kv + koff + KV, kv_ld, B, c.nq, c.nk, NH, NKV,
                                                 hs, c.q0, c.k0, c.causal, NULL));
        gdq[k] = down_f(d_dq, nq), gdkv[k] = down_f(d_dkv, nkv);
    }
    EXPECT_NEAR("block gqa dq (accumulated)", gdq[0], dq, nq, TOL_F32);
    EXPECT_NEAR("block gqa dk, dv (accumulated)", gdkv[0], dkv, nkv, TOL_F32);
    EXPECT_SAME_BITS("block gqa dq, second run", gdq[1], gdq[0], nq);
    EXPECT_SAME_BITS("block gqa dk, dv, second run", gdkv[1], gdkv[0], nkv);

    free(x), free(qb), free(kvb), free(out), free(lse), free(nan_o), free(nan_l), free(gout);
    free(glse), free(dout), free(dq), free(dkv), free(dq0), free(dkv0), free(delta);
    for (int k = 0; k < 2; k++)
        free(gdq[k]), free(gdkv[k]);
    gpu_env_fini(&e);
}

/* {B, T, NH, NKV, hs}, q0, nq, k0, nk, causal, packed */
Test(gpu_attention_gqa, block_keys_overlap_nkv_eq_nh)
{
    check_block((blk_case){{2, 48, 4, 4, 8}, 16, 24, 8, 24, true, true}, 421);
}
Test(gpu_attention_gqa, block_keys_overlap_group2_qkv_ld)
{
    check_block((blk_case){{2, 48, 4, 2, 8}, 16, 24, 8, 24, true, false}, 422);
}
Test(gpu_attention_gqa, block_keys_before_mqa)
{
    check_block((blk_case){{2, 48, 4, 1, 8}, 32, 16, 8, 16, true, true}, 423);
}
Test(gpu_attention_gqa, block_diagonal_group2_not_causal)
{
    check_block((blk_case){{2, 48, 4, 2, 8}, 16, 16, 16, 16, false, true}, 424);
}
/* two CUDA blocks of query rows, three key tiles, ragged */
Test(gpu_attention_gqa, block_ragged_multi_tile_group2)
{
    check_block((blk_case){{1, 160, 4, 2, 8}, 37, 80, 3, 130, true, true}, 425);
}
/* head sizes 64 and 40: shuffles across a row's threads, padding */
Test(gpu_attention_gqa, block_hs64_mqa)
{
    check_block((blk_case){{1, 64, 2, 1, 64}, 16, 40, 0, 48, true, true}, 426);
}
Test(gpu_attention_gqa, block_hs40_group3_qkv_ld)
{
    check_block((blk_case){{1, 48, 3, 1, 40}, 20, 20, 4, 30, true, false}, 427);
}

/* ------------------------------------------------------------ bad shapes */

Test(gpu_attention_gqa, shapes_refused)
{
    gpu_require();
    loco_bf16 hb[8] = {0};
    float f[8] = {0};
    /* NKV must divide NH */
    cr_expect_eq(loco_cuda_attention_gqa_fwd(f, f, f, 1, 1, 4, 3, 8, NULL), LOCO_EINVAL);
    cr_expect_eq(loco_cuda_attention_gqa_bwd_bf16(hb, f, hb, hb, hb, f, 1, 1, 4, 0, 8, NULL),
                 LOCO_EINVAL);
    cr_expect_eq(loco_cuda_attention_block_gqa_fwd(f, f, f, 0, f, f, 0, 1, 1, 1, 6, 4, 8, 0, 0,
                                                   true, NULL),
                 LOCO_EINVAL);
    /* head size over 128 */
    cr_expect_eq(loco_cuda_attention_gqa_fwd_bf16(hb, f, hb, 1, 1, 2, 1, 130, NULL), LOCO_EINVAL);
    cr_expect_eq(loco_cuda_attention_block_gqa_bwd(f, 0, f, f, 0, f, f, f, f, 0, f, f, 0, 1, 1, 1,
                                                   2, 2, 129, 0, 0, true, NULL),
                 LOCO_EINVAL);
    /* the tensor-core kernel: head size 64 only */
    cr_expect_eq(loco_cuda_attention_tc_gqa_fwd_bf16(hb, f, hb, 1, 1, 4, 2, 32, NULL),
                 LOCO_ENOTSUP);
    cr_expect(strstr(loco_errmsg(), "head size 32"), "%s", loco_errmsg());
    cr_expect_eq(loco_cuda_attention_tc_gqa_bwd_bf16(hb, f, hb, hb, hb, f, 1, 1, 4, 3, 64, NULL),
                 LOCO_EINVAL);
}

#endif /* LOCO_HAVE_CUDA */
