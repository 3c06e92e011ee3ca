/* kernels/cuda/attention_block.cu, the blockwise attention of ring
 * attention, against its CPU twins (kernels/cpu/attention_block.c): the
 * block forward with keys before, on, after and around the queries, not
 * causal, qkv and packed kv strides, several CUDA blocks and key tiles, head
 * sizes 8 to 128; the merge with empty rows on either side; delta; the block
 * backward accumulating onto existing gradients (and the same bits when run
 * twice), a fully masked pair leaving them untouched. All within 1e-5
 * relative; -inf log-sum-exps in the same rows. Every test skips, with the
 * reason, where there is no device or no CUDA build. */
#include <criterion/criterion.h>

#ifndef LOCO_HAVE_CUDA
Test(gpu_attention_block, skipped)
{
    cr_skip_test("built without the CUDA toolkit (no nvcc found by make): "
                 "kernels/cuda not compiled");
}
#else

#include "tests/gpu/gpu_test.h"

enum { SLAB = 64 << 20, B = 2 };

static void *up(gpu_env *e, const float *x, size_t n)
{
    return dup_to_dev(e, x, n * sizeof *x);
}

/* Columns [col, col+w) of rows [t0, t0+n) of each batch of x (B,T,ld), as
 * a (B,n,w) buffer. */
static float *slice(const float *x, int T, int ld, int col, int w, int t0, int n)
{
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
                      "%s: row %zu lse %.9g, CPU %.9g", what, r, (double)got[r],
                      (double)want[r]);
    }
}

/* ------------------------------------------------- forward, delta, backward */

/* A block of a T-long sequence x (B,T,3C): queries [q0, q0+nq) against keys
 * [k0, k0+nk), k and v in a packed (B,nk,2C) buffer or a (B,nk,3C) one. */
typedef struct {
    int C, NH, T, q0, nq, k0, nk;
    bool causal, packed;
} blk_case;

/* The forward on both twins: out, lse on the host (CPU's in *cout, *clse). */
static void check_fwd(gpu_env *e, const blk_case *c, const float *qb, const float *kvb,
                      float **cout, float **clse)
{
    const int C = c->C, kv_ld = c->packed ? 2 * C : 3 * C, koff = c->packed ? 0 : C;
    const size_t no = (size_t)B * c->nq * C, nl = (size_t)B * c->NH * c->nq;
    float *out = malloc(no * sizeof *out), *lse = malloc(nl * sizeof *lse);
    cr_assert(out && lse);
    loco_attention_block_fwd(out, lse, qb, 3 * C, kvb + koff, kvb + koff + C, kv_ld, B, c->nq,
                             c->nk, C, c->NH, c->q0, c->k0, c->causal);
    float *d_q = up(e, qb, (size_t)B * c->nq * 3 * C);
    float *d_kv = up(e, kvb, (size_t)B * c->nk * kv_ld);
    float *nan_o = fill_f(no, NAN), *nan_l = fill_f(nl, NAN); /* must be overwritten */
    float *d_out = up(e, nan_o, no), *d_lse = up(e, nan_l, nl);
    GPU_OK(loco_cuda_attention_block_fwd(d_out, d_lse, d_q, 3 * C, d_kv + koff,
                                         d_kv + koff + C, kv_ld, B, c->nq, c->nk, C, c->NH,
                                         c->q0, c->k0, c->causal, NULL));
    float *gout = down_f(d_out, no), *glse = down_f(d_lse, nl);
    EXPECT_NEAR("block out", gout, out, no, TOL_F32);
    expect_lse("block lse", glse, lse, nl);
    free(nan_o), free(nan_l), free(gout), free(glse);
    *cout = out, *clse = lse;
}

/* delta and the backward on both twins from the CPU's out and lse, onto
 * random gradients; the device backward twice, for its bits. */
static void check_bwd(gpu_env *e, const blk_case *c, const float *qb, const float *kvb,
                      const float *out, const float *lse, uint64_t *s)
{
    const int C = c->C, kv_ld = c->packed ? 2 * C : 3 * C, koff = c->packed ? 0 : C;
    const size_t no = (size_t)B * c->nq * C, nl = (size_t)B * c->NH * c->nq;
    const size_t nq = (size_t)B * c->nq * 3 * C, nkv = (size_t)B * c->nk * kv_ld;
    float *dout = rand_f(s, no, 1.0), *dq = rand_f(s, nq, 0.5), *dkv = rand_f(s, nkv, 0.5);
    float *dq0 = copy_f(dq, nq), *dkv0 = copy_f(dkv, nkv);
    float *delta = malloc(nl * sizeof *delta);
    cr_assert_not_null(delta);
    loco_attention_delta(delta, dout, out, B, c->nq, C, c->NH);
    loco_attention_block_bwd(dq, 3 * C, dkv + koff, dkv + koff + C, kv_ld, dout, lse, delta, qb,
                             3 * C, kvb + koff, kvb + koff + C, kv_ld, B, c->nq, c->nk, C, c->NH,
                             c->q0, c->k0, c->causal);

    float *d_out = up(e, out, no), *d_dout = up(e, dout, no), *d_lse = up(e, lse, nl);
    float *d_delta = dalloc(e, nl * sizeof(float));
    GPU_OK(loco_cuda_attention_delta(d_delta, d_dout, d_out, B, c->nq, C, c->NH, NULL));
    float *gdelta = down_f(d_delta, nl);
    EXPECT_NEAR("delta", gdelta, delta, nl, TOL_F32);
    GPU_OK(loco_cuda_copy(d_delta, delta, nl * sizeof(float), NULL)); /* the same input */
    float *d_q = up(e, qb, nq), *d_kv = up(e, kvb, nkv);
    float *gdq[2], *gdkv[2];
    for (int k = 0; k < 2; k++) {
        float *d_dq = up(e, dq0, nq), *d_dkv = up(e, dkv0, nkv);
        GPU_OK(loco_cuda_attention_block_bwd(d_dq, 3 * C, d_dkv + koff, d_dkv + koff + C, kv_ld,
                                             d_dout, d_lse, d_delta, d_q, 3 * C, d_kv + koff,
                                             d_kv + koff + C, kv_ld, B, c->nq, c->nk, C, c->NH,
                                             c->q0, c->k0, c->causal, NULL));
        gdq[k] = down_f(d_dq, nq), gdkv[k] = down_f(d_dkv, nkv);
    }
    EXPECT_NEAR("block dq (accumulated)", gdq[0], dq, nq, TOL_F32);
    EXPECT_NEAR("block dk, dv (accumulated)", gdkv[0], dkv, nkv, TOL_F32);
    EXPECT_SAME_BITS("block dq, second run", gdq[1], gdq[0], nq);
    EXPECT_SAME_BITS("block dk, dv, second run", gdkv[1], gdkv[0], nkv);
    free(dout), free(dq), free(dkv), free(dq0), free(dkv0), free(delta), free(gdelta);
    for (int k = 0; k < 2; k++)
        free(gdq[k]), free(gdkv[k]);
}

static void check_block(blk_case c, uint64_t seed)
{
    gpu_env e;
    gpu_env_init(&e, SLAB);
    uint64_t s = seed;
    const int C3 = 3 * c.C;
    float *x = rand_f(&s, (size_t)B * c.T * C3, 2.0);
    float *qb = slice(x, c.T, C3, 0, C3, c.q0, c.nq);
    float *kvb = c.packed ? slice(x, c.T, C3, c.C, 2 * c.C, c.k0, c.nk)
                          : slice(x, c.T, C3, 0, C3, c.k0, c.nk);
    float *out, *lse;
    check_fwd(&e, &c, qb, kvb, &out, &lse);
    check_bwd(&e, &c, qb, kvb, out, lse, &s);
    free(x), free(qb), free(kvb), free(out), free(lse);
    gpu_env_fini(&e);
}

/* C, NH, T, q0, nq, k0, nk, causal, packed */
Test(gpu_attention_block, keys_before_queries)
{
    check_block((blk_case){32, 4, 48, 32, 16, 8, 16, true, true}, 301);
}
Test(gpu_attention_block, keys_overlap_queries_qkv_ld)
{
    check_block((blk_case){32, 4, 48, 16, 24, 8, 24, true, false}, 302);
}
Test(gpu_attention_block, diagonal)
{
    check_block((blk_case){32, 4, 48, 16, 16, 16, 16, true, true}, 303);
}
Test(gpu_attention_block, keys_after_queries_fully_masked)
{
    check_block((blk_case){32, 4, 48, 0, 16, 16, 16, true, true}, 304);
}
Test(gpu_attention_block, keys_start_inside_queries)
{
    check_block((blk_case){32, 4, 48, 8, 16, 16, 16, true, true}, 305);
}
Test(gpu_attention_block, not_causal)
{
    check_block((blk_case){32, 4, 48, 0, 16, 24, 24, false, true}, 306);
}
/* two CUDA blocks of query rows, three key tiles, ragged */
Test(gpu_attention_block, ragged_multi_tile)
{
    check_block((blk_case){32, 4, 160, 37, 123, 3, 130, true, true}, 307);
}
/* head sizes 64, 40 and 128: 2 and 4 threads per row (shuffles), padding */
Test(gpu_attention_block, hs64)
{
    check_block((blk_case){128, 2, 64, 16, 40, 0, 48, true, true}, 308);
}
Test(gpu_attention_block, hs40_qkv_ld)
{
    check_block((blk_case){120, 3, 48, 20, 20, 4, 30, true, false}, 309);
}
Test(gpu_attention_block, hs128)
{
    check_block((blk_case){256, 2, 48, 16, 24, 8, 24, true, true}, 310);
}

/* ------------------------------------------------------------------ merge */

/* Random running and block results, rows empty (-inf) on one side or both. */
static void check_merge(int T, int C, int NH, uint64_t seed)
{
    gpu_env e;
    gpu_env_init(&e, SLAB);
    uint64_t s = seed;
    const size_t no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    float *out = rand_f(&s, no, 1.0), *bo = rand_f(&s, no, 1.0);
    float *lse = rand_f(&s, nl, 4.0), *bl = rand_f(&s, nl, 4.0);
    for (size_t r = 0; r < nl; r++) {
        if (r % 5 == 1 || r % 5 == 3)
            lse[r] = -INFINITY;
        if (r % 5 == 2 || r % 5 == 3)
            bl[r] = -INFINITY;
    }
    float *d_out = up(&e, out, no), *d_bo = up(&e, bo, no);
    float *d_lse = up(&e, lse, nl), *d_bl = up(&e, bl, nl);
    GPU_OK(loco_cuda_attention_merge(d_out, d_lse, d_bo, d_bl, B, T, C, NH, NULL));
    loco_attention_merge(out, lse, bo, bl, B, T, C, NH);
    float *gout = down_f(d_out, no), *glse = down_f(d_lse, nl);
    EXPECT_NEAR("merged out", gout, out, no, TOL_F32);
    expect_lse("merged lse", glse, lse, nl);
    free(out), free(bo), free(lse), free(bl), free(gout), free(glse);
    gpu_env_fini(&e);
}

Test(gpu_attention_block, merge) { check_merge(37, 32, 4, 311); }
Test(gpu_attention_block, merge_hs40) { check_merge(19, 120, 3, 312); }

/* ------------------------------------------------------------ bad shapes */

Test(gpu_attention_block, head_size_over_128_refused)
{
    gpu_require();
    cr_expect_eq(loco_cuda_attention_block_fwd(NULL, NULL, NULL, 0, NULL, NULL, 0, 1, 1, 1, 258,
                                               2, 0, 0, true, NULL),
                 LOCO_EINVAL);
    cr_expect_eq(loco_cuda_attention_block_bwd(NULL, 0, NULL, NULL, 0, NULL, NULL, NULL, NULL, 0,
                                               NULL, NULL, 0, 1, 1, 1, 30, 4, 0, 0, true, NULL),
                 LOCO_EINVAL);
}

#endif /* LOCO_HAVE_CUDA */
