/* Grouped-query attention (kernels/cpu/attention.c, attention_block.c):
 * NKV key/value heads shared by NH query heads, NKV in {NH, NH/2, 1} and
 * groups of 2 and 3. The reference is plain double-precision multi-head
 * attention over a copy of the input with every kv head repeated for the
 * query heads that read it (it knows nothing of the kernels' layout
 * tricks); its gradient, summed back over each group, is checked against
 * central finite differences of the GQA loss, and so is the kernel's in
 * fp32. Then: the whole-sequence kernels against the reference, forward
 * and accumulating backward; the blockwise kernels over a sequence whose
 * queries and keys are cut anywhere (merged by the log-sum-exp rule, with
 * and without memory for their scratch) against the reference and the
 * whole-sequence kernels; the MHA entry points as the NKV = NH case, bit
 * for bit; the same bits for 1 and 3 threads. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "kernels/kernels.h"
#include "tests/kernels/kernels_test.h"

/* fp32 kernels against double references */
#define TOL 1e-5

/* One problem: B sequences of T tokens, NH query heads of hs reading NKV
 * kv heads. A GQA row is (NH + 2 NKV) hs wide (ld); the expanded MHA row
 * 3 C, C = NH hs. */
typedef struct {
    int B, T, NH, NKV, hs;
} gqa_shape;

static int ld_of(const gqa_shape *g) { return (g->NH + 2 * g->NKV) * g->hs; }
static int c_of(const gqa_shape *g) { return g->NH * g->hs; }
static size_t nx_of(const gqa_shape *g) { return (size_t)g->B * g->T * ld_of(g); }
static size_t no_of(const gqa_shape *g) { return (size_t)g->B * g->T * c_of(g); }
static size_t nl_of(const gqa_shape *g) { return (size_t)g->B * g->NH * g->T; }

/* ---- the reference: MHA over repeated kv heads ---- */

/* Column of part p (0 q, 1 k, 2 v) of query head h in a GQA row. */
static size_t gqa_col(const gqa_shape *g, int p, int h)
{
    const int kh = h / (g->NH / g->NKV);
    return (size_t)(p == 0 ? h : p == 1 ? g->NH + kh : g->NH + g->NKV + kh) * g->hs;
}

/* e (B,T,3C) = x (B,T,ld) with kv head h / (NH/NKV) copied to head h. */
static double *expand(const gqa_shape *g, const double *x)
{
    const int C = c_of(g), ld = ld_of(g);
    double *e = dzeros((size_t)g->B * g->T * 3 * C);
    for (size_t r = 0; r < (size_t)g->B * g->T; r++)
        for (int p = 0; p < 3; p++)
            for (int h = 0; h < g->NH; h++)
                memcpy(e + r * 3 * C + (size_t)p * C + (size_t)h * g->hs,
                       x + r * ld + gqa_col(g, p, h), g->hs * sizeof *e);
    return e;
}

/* dx (B,T,ld) += de (B,T,3C) summed back over each group's copies. */
static void reduce(const gqa_shape *g, double *dx, const double *de)
{
    const int C = c_of(g), ld = ld_of(g);
    for (size_t r = 0; r < (size_t)g->B * g->T; r++)
        for (int p = 0; p < 3; p++)
            for (int h = 0; h < g->NH; h++)
                for (int d = 0; d < g->hs; d++)
                    dx[r * ld + gqa_col(g, p, h) + d] +=
                        de[r * 3 * C + (size_t)p * C + (size_t)h * g->hs + d];
}

/* Causal MHA on e (B,T,3C): out (B,T,C), att (B,NH,T,T) (0 above the
 * diagonal), lse (B,NH,T). */
static void mha_fwd(const gqa_shape *g, double *out, double *att, double *lse, const double *e)
{
    const int T = g->T, NH = g->NH, hs = g->hs, C = c_of(g), C3 = 3 * C;
    const double scale = 1.0 / sqrt((double)hs);
    for (int b = 0; b < g->B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const double *q = e + ((size_t)b * T + t) * C3 + (size_t)h * hs;
                double *p = att + (((size_t)b * NH + h) * T + t) * T, m = -INFINITY, sum = 0.0;
                for (int j = 0; j < T; j++) {
                    p[j] = 0.0;
                    if (j > t)
                        continue;
                    const double *k = e + ((size_t)b * T + j) * C3 + C + (size_t)h * hs;
                    for (int d = 0; d < hs; d++)
                        p[j] += q[d] * k[d];
                    p[j] *= scale;
                    m = fmax(m, p[j]);
                }
                for (int j = 0; j <= t; j++)
                    sum += exp(p[j] - m);
                for (int j = 0; j <= t; j++)
                    p[j] = exp(p[j] - m) / sum;
                lse[((size_t)b * NH + h) * T + t] = m + log(sum);
                double *o = out + ((size_t)b * T + t) * C + (size_t)h * hs;
                for (int d = 0; d < hs; d++) {
                    o[d] = 0.0;
                    for (int j = 0; j <= t; j++)
                        o[d] += p[j] * e[((size_t)b * T + j) * C3 + 2 * C + (size_t)h * hs + d];
                }
            }
}

/* de (B,T,3C) += the gradient of sum(dout * mha(e)), textbook softmax
 * backward. */
static void mha_bwd(const gqa_shape *g, double *de, const double *dout, const double *e)
{
    const int T = g->T, NH = g->NH, hs = g->hs, C = c_of(g), C3 = 3 * C;
    const double scale = 1.0 / sqrt((double)hs);
    double *out = dzeros((size_t)g->B * T * C), *att = dzeros((size_t)g->B * NH * T * T);
    double *lse = dzeros((size_t)g->B * NH * T), *dp = dzeros((size_t)T);
    mha_fwd(g, out, att, lse, e);
    for (int b = 0; b < g->B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const double *p = att + (((size_t)b * NH + h) * T + t) * T;
                const double *dO = dout + ((size_t)b * T + t) * C + (size_t)h * hs;
                const size_t qo = ((size_t)b * T + t) * C3 + (size_t)h * hs;
                double dot = 0.0;
                for (int j = 0; j <= t; j++) {
                    const size_t vo = ((size_t)b * T + j) * C3 + 2 * C + (size_t)h * hs;
                    dp[j] = 0.0;
                    for (int d = 0; d < hs; d++) {
                        dp[j] += dO[d] * e[vo + d];
                        de[vo + d] += p[j] * dO[d];
                    }
                    dot += p[j] * dp[j];
                }
                for (int j = 0; j <= t; j++) {
                    const double ds = p[j] * (dp[j] - dot) * scale;
                    const size_t ko = ((size_t)b * T + j) * C3 + C + (size_t)h * hs;
                    for (int d = 0; d < hs; d++) {
                        de[qo + d] += ds * e[ko + d];
                        de[ko + d] += ds * e[qo + d];
                    }
                }
            }
    free(out), free(att), free(lse), free(dp);
}

/* GQA forward of x (B,T,ld) by the reference: out (B,T,C), att, lse. */
static void ref_fwd(const gqa_shape *g, double *out, double *att, double *lse, const double *x)
{
    double *e = expand(g, x);
    mha_fwd(g, out, att, lse, e);
    free(e);
}

/* dx (B,T,ld) += the reference GQA gradient. */
static void ref_bwd(const gqa_shape *g, double *dx, const double *dout, const double *x)
{
    const int C = c_of(g);
    double *e = expand(g, x), *de = dzeros((size_t)g->B * g->T * 3 * C);
    mha_bwd(g, de, dout, e);
    reduce(g, dx, de);
    free(e), free(de);
}

static double ref_loss(const gqa_shape *g, const double *x, const double *dout)
{
    const size_t no = no_of(g);
    double *out = dzeros(no), *att = dzeros(nl_of(g) * g->T), *lse = dzeros(nl_of(g)), L = 0.0;
    ref_fwd(g, out, att, lse, x);
    for (size_t i = 0; i < no; i++)
        L += dout[i] * out[i];
    free(out), free(att), free(lse);
    return L;
}

/* ---- (a) the reference and the kernel against finite differences ---- */

static void check_ref_fd(gqa_shape g, uint64_t seed)
{
    const size_t nx = nx_of(&g), no = no_of(&g);
    uint64_t s = seed;
    double *x = dzeros(nx), *dout = dzeros(no), *gr = dzeros(nx), *fd = dzeros(nx);
    for (size_t i = 0; i < nx; i++)
        x[i] = 2.0 * urand(&s);
    for (size_t i = 0; i < no; i++)
        dout[i] = urand(&s);
    ref_bwd(&g, gr, dout, x);
    const double h = 1e-6;
    for (size_t i = 0; i < nx; i++) {
        const double keep = x[i];
        x[i] = keep + h;
        const double Lp = ref_loss(&g, x, dout);
        x[i] = keep - h;
        const double Lm = ref_loss(&g, x, dout);
        x[i] = keep;
        fd[i] = (Lp - Lm) / (2 * h);
    }
    const double e = relerr_dd(gr, fd, nx);
    cr_expect_leq(e, 1e-7, "GQA reference gradient vs finite differences (NKV %d): %.3g", g.NKV,
                  e);
    free(x), free(dout), free(gr), free(fd);
}

Test(kernels_attention_gqa, reference_vs_finite_differences_group2)
{
    check_ref_fd((gqa_shape){2, 5, 4, 2, 3}, 61);
}
Test(kernels_attention_gqa, reference_vs_finite_differences_mqa)
{
    check_ref_fd((gqa_shape){2, 5, 3, 1, 2}, 62);
}

/* The fp32 kernel's sum(dout * out) differentiated numerically (loss in
 * double, step 1e-2: truncation ~1e-5, rounding ~1e-6) against its
 * backward. */
static double kernel_loss(const gqa_shape *g, const float *x, const float *dout, float *out,
                          float *att)
{
    loco_attention_gqa_fwd(out, att, x, g->B, g->T, g->NH, g->NKV, g->hs);
    double L = 0.0;
    for (size_t i = 0; i < no_of(g); i++)
        L += (double)dout[i] * out[i];
    return L;
}

Test(kernels_attention_gqa, kernel_vs_finite_differences)
{
    const gqa_shape g = {1, 6, 4, 2, 4};
    const size_t nx = nx_of(&g), no = no_of(&g), na = nl_of(&g) * g.T;
    uint64_t s = 63;
    float *x = frand(&s, nx, 1.0), *dout = frand(&s, no, 1.0), *dx = ffill(nx, 0.0f);
    float *out = xmalloc(no * sizeof *out), *att = xmalloc(na * sizeof *att);
    float *datt = xmalloc(na * sizeof *datt);
    double *fd = dzeros(nx);
    kernel_loss(&g, x, dout, out, att);
    loco_attention_gqa_bwd(dx, datt, dout, x, att, g.B, g.T, g.NH, g.NKV, g.hs);
    const float h = 1e-2f;
    for (size_t i = 0; i < nx; i++) {
        const float keep = x[i];
        x[i] = keep + h;
        const double Lp = kernel_loss(&g, x, dout, out, att);
        x[i] = keep - h;
        const double Lm = kernel_loss(&g, x, dout, out, att);
        x[i] = keep;
        fd[i] = (Lp - Lm) / (2.0 * h);
    }
    const double e = relerr(dx, fd, nx);
    cr_expect_leq(e, 1e-3, "GQA kernel gradient vs finite differences: %.3g", e);
    free(x), free(dout), free(dx), free(out), free(att), free(datt), free(fd);
}

/* ---- (b) the whole-sequence kernels against the reference ---- */

static void check_gqa(gqa_shape g, uint64_t seed)
{
    const size_t nx = nx_of(&g), no = no_of(&g), nl = nl_of(&g), na = nl * g.T;
    uint64_t s = seed;
    float *x = frand(&s, nx, 2.0), *out = ffill(no, NAN), *att = ffill(na, NAN);
    double *xd = todouble(x, nx), *rout = dzeros(no), *ratt = dzeros(na), *rlse = dzeros(nl);
    loco_attention_gqa_fwd(out, att, x, g.B, g.T, g.NH, g.NKV, g.hs);
    ref_fwd(&g, rout, ratt, rlse, xd);
    EXPECT_CLOSE("gqa out", out, rout, no, TOL);
    EXPECT_CLOSE("gqa att", att, ratt, na, TOL);

    float *dout = frand(&s, no, 1.0), *dx = frand(&s, nx, 1.0), *dx0 = fcopy(dx, nx);
    float *datt = ffill(na, NAN); /* scratch: stale contents must not leak */
    double *dd = todouble(dout, no), *G = dzeros(nx), *r = dzeros(nx);
    ref_bwd(&g, G, dd, xd);
    for (int k = 1; k <= 2; k++) {
        loco_attention_gqa_bwd(dx, datt, dout, x, att, g.B, g.T, g.NH, g.NKV, g.hs);
        for (size_t i = 0; i < nx; i++)
            r[i] = dx0[i] + k * G[i];
        EXPECT_CLOSE(k == 1 ? "gqa dqkv" : "gqa dqkv (2nd call)", dx, r, nx, TOL);
    }
    free(x), free(out), free(att), free(xd), free(rout), free(ratt), free(rlse);
    free(dout), free(dx), free(dx0), free(datt), free(dd), free(G), free(r);
}

/* B, T, NH, NKV, hs */
Test(kernels_attention_gqa, t17_nkv_eq_nh) { check_gqa((gqa_shape){2, 17, 4, 4, 5}, 71); }
Test(kernels_attention_gqa, t17_group2) { check_gqa((gqa_shape){2, 17, 4, 2, 5}, 72); }
Test(kernels_attention_gqa, t17_mqa) { check_gqa((gqa_shape){2, 17, 4, 1, 5}, 73); }
Test(kernels_attention_gqa, t9_group3) { check_gqa((gqa_shape){3, 9, 6, 2, 4}, 74); }
Test(kernels_attention_gqa, t1_single_token_mqa) { check_gqa((gqa_shape){2, 1, 3, 1, 4}, 75); }
/* several query blocks of the implementation, a ragged last one */
Test(kernels_attention_gqa, t150_multiblock_group2) { check_gqa((gqa_shape){1, 150, 4, 2, 8}, 76); }
Test(kernels_attention_gqa, t150_multiblock_mqa) { check_gqa((gqa_shape){1, 150, 4, 1, 8}, 77); }

/* The MHA entry points are the NKV = NH case: the same bits. */
Test(kernels_attention_gqa, mha_is_nkv_eq_nh_bitwise)
{
    const gqa_shape g = {2, 40, 4, 4, 6};
    const int C = c_of(&g);
    const size_t nx = nx_of(&g), no = no_of(&g), na = nl_of(&g) * g.T;
    uint64_t s = 78;
    float *x = frand(&s, nx, 2.0), *dout = frand(&s, no, 1.0), *out[2], *att[2], *dx[2];
    float *datt = xmalloc(na * sizeof *datt);
    for (int k = 0; k < 2; k++) {
        out[k] = xmalloc(no * sizeof(float)), att[k] = xmalloc(na * sizeof(float));
        dx[k] = ffill(nx, 0.0f);
    }
    loco_attention_fwd(out[0], att[0], x, g.B, g.T, C, g.NH);
    loco_attention_bwd(dx[0], datt, dout, x, att[0], g.B, g.T, C, g.NH);
    loco_attention_gqa_fwd(out[1], att[1], x, g.B, g.T, g.NH, g.NH, g.hs);
    loco_attention_gqa_bwd(dx[1], datt, dout, x, att[1], g.B, g.T, g.NH, g.NH, g.hs);
    EXPECT_SAME_BITS("out", out[0], out[1], no);
    EXPECT_SAME_BITS("att", att[0], att[1], na);
    EXPECT_SAME_BITS("dqkv", dx[0], dx[1], nx);
    for (int k = 0; k < 2; k++)
        free(out[k]), free(att[k]), free(dx[k]);
    free(x), free(dout), free(datt);
}

/* ---- (c) blockwise: a sequence cut anywhere, merged ---- */

/* Columns [col, col+w) of rows [t0, t0+n) of each batch of x (B,T,ld), as
 * a (B,n,w) buffer, and back. */
static float *slice(const gqa_shape *g, const float *x, int ld, int col, int w, int t0, int n)
{
    float *y = xmalloc(((size_t)g->B * n * w + 1) * sizeof *y);
    for (int b = 0; b < g->B; b++)
        for (int t = 0; t < n; t++)
            memcpy(y + ((size_t)b * n + t) * w, x + ((size_t)b * g->T + t0 + t) * ld + col,
                   (size_t)w * sizeof *y);
    return y;
}

static void unslice(const gqa_shape *g, float *x, int ld, int col, int w, int t0, int n,
                    const float *y)
{
    for (int b = 0; b < g->B; b++)
        for (int t = 0; t < n; t++)
            memcpy(x + ((size_t)b * g->T + t0 + t) * ld + col, y + ((size_t)b * n + t) * w,
                   (size_t)w * sizeof *y);
}

/* The whole sequence x's attention from blocks: queries cut at qc[0..nq],
 * keys at kc[0..nk]; each query block's full rows (q_ld = ld) meet packed kv
 * blocks (k then v, kv_ld = 2 NKV hs); the forward merged per query block,
 * the backward over every pair from the final lse and delta. out (B,T,C),
 * lse (B,NH,T) written, dx (B,T,ld) accumulated. no_mem: every call's
 * scratch allocation fails (the scalar path). */
static void run_cuts(const gqa_shape *g, const int *qc, int nq, const int *kc, int nk,
                     bool no_mem, const float *x, const float *dout, float *out, float *lse,
                     float *dx)
{
    const int B = g->B, NH = g->NH, NKV = g->NKV, hs = g->hs, C = c_of(g), ld = ld_of(g);
    const int KV = NKV * hs, KV2 = 2 * KV;
    for (int i = 0; i < nq; i++) {
        const int q0 = qc[i], L = qc[i + 1] - qc[i];
        float *qb = slice(g, x, ld, 0, ld, q0, L), *go = slice(g, dout, C, 0, C, q0, L);
        float *o = ffill((size_t)B * L * C, NAN), *l = ffill((size_t)B * NH * L, -INFINITY);
        float *bo = xmalloc((size_t)B * L * C * sizeof *bo);
        float *bl = xmalloc((size_t)B * NH * L * sizeof *bl);
        float *dl = xmalloc((size_t)B * NH * L * sizeof *dl);
        float *dq = ffill((size_t)B * L * ld, 0.0f);
        for (int j = 0; j < nk; j++) {
            const int k0 = kc[j], n = kc[j + 1] - kc[j];
            float *kv = slice(g, x, ld, C, KV2, k0, n);
            loco_alloc_fail_after(no_mem ? 1 : 0);
            loco_attention_block_gqa_fwd(bo, bl, qb, ld, kv, kv + KV, KV2, B, L, n, NH, NKV, hs,
                                         q0, k0, true);
            loco_alloc_fail_after(0);
            loco_attention_merge(o, l, bo, bl, B, L, C, NH);
            free(kv);
        }
        loco_attention_delta(dl, go, o, B, L, C, NH);
        for (int j = 0; j < nk; j++) {
            const int k0 = kc[j], n = kc[j + 1] - kc[j];
            float *kv = slice(g, x, ld, C, KV2, k0, n), *dkv = slice(g, dx, ld, C, KV2, k0, n);
            loco_alloc_fail_after(no_mem ? 1 : 0);
            loco_attention_block_gqa_bwd(dq, ld, dkv, dkv + KV, KV2, go, l, dl, qb, ld, kv,
                                         kv + KV, KV2, B, L, n, NH, NKV, hs, q0, k0, true);
            loco_alloc_fail_after(0);
            unslice(g, dx, ld, C, KV2, k0, n, dkv);
            free(kv), free(dkv);
        }
        float *dqq = slice(&(gqa_shape){B, L, NH, NKV, hs}, dq, ld, 0, C, 0, L);
        float *dxq = slice(g, dx, ld, 0, C, q0, L);
        for (size_t e = 0; e < (size_t)B * L * C; e++)
            dxq[e] += dqq[e];
        unslice(g, dx, ld, 0, C, q0, L, dxq);
        unslice(g, out, C, 0, C, q0, L, o);
        for (int bh = 0; bh < B * NH; bh++)
            memcpy(lse + (size_t)bh * g->T + q0, l + (size_t)bh * L, L * sizeof *lse);
        free(qb), free(go), free(o), free(l), free(bo), free(bl), free(dl), free(dq), free(dqq);
        free(dxq);
    }
}

static void check_cuts(gqa_shape g, const int *qc, int nq, const int *kc, int nk, bool no_mem,
                       uint64_t seed)
{
    const size_t nx = nx_of(&g), no = no_of(&g), nl = nl_of(&g), na = nl * g.T;
    uint64_t s = seed;
    float *x = frand(&s, nx, 2.0), *dout = frand(&s, no, 1.0), *dx = ffill(nx, 0.0f);
    float *out = ffill(no, NAN), *lse = ffill(nl, NAN);
    run_cuts(&g, qc, nq, kc, nk, no_mem, x, dout, out, lse, dx);

    double *xd = todouble(x, nx), *dd = todouble(dout, no);
    double *rout = dzeros(no), *ratt = dzeros(na), *rlse = dzeros(nl), *rdx = dzeros(nx);
    ref_fwd(&g, rout, ratt, rlse, xd);
    ref_bwd(&g, rdx, dd, xd);
    EXPECT_CLOSE("blocks out vs reference", out, rout, no, TOL);
    EXPECT_CLOSE("blocks lse vs reference", lse, rlse, nl, TOL);
    EXPECT_CLOSE("blocks dqkv vs reference", dx, rdx, nx, TOL);

    /* and against the whole-sequence GQA kernels */
    float *wout = xmalloc(no * sizeof *wout), *watt = xmalloc(na * sizeof *watt);
    float *wdatt = xmalloc(na * sizeof *wdatt), *wdx = ffill(nx, 0.0f);
    loco_attention_gqa_fwd(wout, watt, x, g.B, g.T, g.NH, g.NKV, g.hs);
    loco_attention_gqa_bwd(wdx, wdatt, dout, x, watt, g.B, g.T, g.NH, g.NKV, g.hs);
    double *w = todouble(wout, no), *wd = todouble(wdx, nx);
    EXPECT_CLOSE("blocks out vs whole-sequence kernel", out, w, no, TOL);
    EXPECT_CLOSE("blocks dqkv vs whole-sequence kernel", dx, wd, nx, TOL);

    free(x), free(dout), free(dx), free(out), free(lse), free(xd), free(dd), free(rout);
    free(ratt), free(rlse), free(rdx), free(wout), free(watt), free(wdatt), free(wdx), free(w);
    free(wd);
}

static const int cut_q[] = {0, 37, 70, 101, 150}, cut_k[] = {0, 20, 71, 130, 150};

Test(kernels_attention_gqa, blocks_nkv_eq_nh)
{
    check_cuts((gqa_shape){2, 150, 4, 4, 6}, cut_q, 4, cut_k, 4, false, 81);
}
Test(kernels_attention_gqa, blocks_group2)
{
    check_cuts((gqa_shape){2, 150, 4, 2, 6}, cut_q, 4, cut_k, 4, false, 82);
}
Test(kernels_attention_gqa, blocks_mqa)
{
    check_cuts((gqa_shape){2, 150, 4, 1, 6}, cut_q, 4, cut_k, 4, false, 83);
}
Test(kernels_attention_gqa, blocks_group3)
{
    check_cuts((gqa_shape){1, 150, 6, 2, 5}, cut_q, 4, cut_k, 4, false, 84);
}
/* no memory for the scratch: the scalar path, one thread per kv head */
Test(kernels_attention_gqa, blocks_group2_without_scratch)
{
    check_cuts((gqa_shape){2, 150, 4, 2, 6}, cut_q, 4, cut_k, 4, true, 85);
}
Test(kernels_attention_gqa, blocks_mqa_without_scratch)
{
    check_cuts((gqa_shape){2, 150, 4, 1, 6}, cut_q, 4, cut_k, 4, true, 86);
}

/* ---- (d) determinism ---- */

/* The same bits for 1 and 3 threads, both paths, at a size where the
 * kernels' OpenMP loops run in parallel. */
Test(kernels_attention_gqa, blocks_same_bits_any_thread_count)
{
    const gqa_shape g = {2, 260, 4, 2, 16};
    static const int qc[] = {0, 130, 260}, kc[] = {0, 65, 260};
    const size_t nx = nx_of(&g), no = no_of(&g), nl = nl_of(&g);
    uint64_t s = 91;
    float *x = frand(&s, nx, 2.0), *dout = frand(&s, no, 1.0);
    for (int no_mem = 0; no_mem < 2; no_mem++) {
        float *out[2], *lse[2], *dx[2];
        for (int k = 0; k < 2; k++) {
            loco_set_threads(k ? 3 : 1);
            out[k] = xmalloc(no * sizeof(float)), lse[k] = xmalloc(nl * sizeof(float));
            dx[k] = ffill(nx, 0.0f);
            run_cuts(&g, qc, 2, kc, 2, no_mem, x, dout, out[k], lse[k], dx[k]);
        }
        EXPECT_SAME_BITS("out", out[0], out[1], no);
        EXPECT_SAME_BITS("lse", lse[0], lse[1], nl);
        EXPECT_SAME_BITS("dqkv", dx[0], dx[1], nx);
        for (int k = 0; k < 2; k++)
            free(out[k]), free(lse[k]), free(dx[k]);
    }
    loco_set_threads(0);
    free(x), free(dout);
}
