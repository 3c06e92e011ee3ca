/* kernels/cpu/attention_block.c, the blockwise attention of ring attention,
 * against plain double-precision references over the whole sequence: one
 * block with offsets (keys before, on, after and around the queries, not
 * causal, qkv and packed kv strides); keys cut into 2-4 blocks merged by
 * the log-sum-exp rule; the zig-zag layout of context parallelism (rank r
 * holds chunks r and 2c-1-r); the backward summed over key blocks against
 * the reference and loco_attention_bwd; queries and keys cut at unrelated
 * places, forward and backward, with and without memory for the kernels'
 * scratch; bits that do not depend on the run or the thread count. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "kernels/kernels.h"
#include "tests/kernels/kernels_test.h"

enum { B = 2, C = 32, NH = 4, HS = C / NH, C2 = 2 * C, C3 = 3 * C };

/* fp32 kernels against double references */
#define TOL 1e-5

/* ---- references over the whole sequence x (B,T,3C) ---- */

/* out (B,nq,C), lse (B,NH,nq): query rows [q0, q0+nq) against key rows
 * [k0, k0+nk), causal by position; rows that see no key: 0 and -inf. */
static void ref_fwd(double *out, double *lse, const double *x, int T, int q0, int nq, int k0,
                    int nk, bool causal)
{
    const double scale = 1.0 / sqrt((double)HS);
    double *p = dzeros((size_t)nk);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < nq; i++) {
                const double *q = x + ((size_t)b * T + q0 + i) * C3 + h * HS;
                double m = -INFINITY, sum = 0.0;
                for (int j = 0; j < nk; j++) {
                    const double *k = x + ((size_t)b * T + k0 + j) * C3 + C + h * HS;
                    p[j] = -INFINITY;
                    if (causal && k0 + j > q0 + i)
                        continue;
                    p[j] = 0.0;
                    for (int d = 0; d < HS; d++)
                        p[j] += q[d] * k[d];
                    p[j] *= scale;
                    m = fmax(m, p[j]);
                }
                for (int j = 0; j < nk; j++)
                    sum += p[j] == -INFINITY ? 0.0 : exp(p[j] - m);
                lse[((size_t)b * NH + h) * nq + i] = sum > 0.0 ? m + log(sum) : -INFINITY;
                double *o = out + ((size_t)b * nq + i) * C + h * HS;
                for (int d = 0; d < HS; d++) {
                    o[d] = 0.0;
                    for (int j = 0; j < nk; j++)
                        if (p[j] != -INFINITY)
                            o[d] += exp(p[j] - m) / sum *
                                    x[((size_t)b * T + k0 + j) * C3 + C2 + h * HS + d];
                }
            }
    free(p);
}

/* dx (B,T,3C) += the gradient of sum(dout * causal attention(x)), by the
 * textbook softmax backward (no lse, no delta). */
static void ref_bwd(double *dx, const double *dout, const double *x, int T)
{
    const double scale = 1.0 / sqrt((double)HS);
    double *out = dzeros((size_t)B * T * C), *lse = dzeros((size_t)B * NH * T);
    double *p = dzeros((size_t)T), *dp = dzeros((size_t)T);
    ref_fwd(out, lse, x, T, 0, T, 0, T, true);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const size_t qo = ((size_t)b * T + t) * C3 + h * HS;
                const double *dO = dout + ((size_t)b * T + t) * C + h * HS;
                const double L = lse[((size_t)b * NH + h) * T + t];
                double dot = 0.0;
                for (int j = 0; j <= t; j++) {
                    const size_t ko = ((size_t)b * T + j) * C3 + C + h * HS;
                    p[j] = dp[j] = 0.0;
                    for (int d = 0; d < HS; d++) {
                        p[j] += x[qo + d] * x[ko + d];
                        dp[j] += dO[d] * x[ko + C + d];
                    }
                    p[j] = exp(p[j] * scale - L);
                    dot += p[j] * dp[j];
                }
                for (int j = 0; j <= t; j++) {
                    const size_t ko = ((size_t)b * T + j) * C3 + C + h * HS;
                    const double ds = p[j] * (dp[j] - dot) * scale;
                    for (int d = 0; d < HS; d++) {
                        dx[ko + C + d] += p[j] * dO[d];
                        dx[qo + d] += ds * x[ko + d];
                        dx[ko + d] += ds * x[qo + d];
                    }
                }
            }
    free(out), free(lse), free(p), free(dp);
}

/* ---- blocks of the sequence ---- */

/* Columns [col, col+w) of rows [t0, t0+n) of each batch of x (B,T,ld), as
 * a (B,n,w) buffer. */
static float *slice(const float *x, int T, int ld, int col, int w, int t0, int n)
{
    float *y = xmalloc((size_t)B * n * w * sizeof *y);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < n; t++)
            memcpy(y + ((size_t)b * n + t) * w, x + ((size_t)b * T + t0 + t) * ld + col,
                   (size_t)w * sizeof *y);
    return y;
}

/* The inverse: y (B,n,w) into those columns and rows of x (B,T,ld). */
static void unslice(float *x, int T, int ld, int col, int w, int t0, int n, const float *y)
{
    for (int b = 0; b < B; b++)
        for (int t = 0; t < n; t++)
            memcpy(x + ((size_t)b * T + t0 + t) * ld + col, y + ((size_t)b * n + t) * w,
                   (size_t)w * sizeof *y);
}

/* Of a sequence x (B,T,3C): a query block (w = 3C, ld 3C) or a packed kv
 * block (w = 2C, ld 2C). */
static float *rows_of(const float *x, int T, int col, int w, int t0, int n)
{
    return slice(x, T, C3, col, w, t0, n);
}

/* lse against the reference: the same rows -inf, the rest within tol. */
static void expect_lse(const char *what, const float *got, const double *ref, size_t n)
{
    for (size_t r = 0; r < n; r++) {
        if (ref[r] == -INFINITY) {
            cr_expect(got[r] == -INFINITY, "%s: row %zu sees no key, lse %g", what, r,
                      (double)got[r]);
            continue;
        }
        cr_expect_leq(fabs(got[r] - ref[r]), TOL * fmax(1.0, fabs(ref[r])),
                      "%s: row %zu lse %.9g, reference %.9g", what, r, (double)got[r], ref[r]);
    }
}

/* out rows of rows that see no key are exact zeros. */
static void expect_masked_zero(const char *what, const float *out, const double *lse, int nq)
{
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < nq; i++) {
                if (lse[((size_t)b * NH + h) * nq + i] != -INFINITY)
                    continue;
                const float *o = out + ((size_t)b * nq + i) * C + h * HS;
                for (int d = 0; d < HS; d++)
                    cr_expect(o[d] == 0.0f, "%s: masked row (%d,%d,%d) out %g", what, b, h, i,
                              (double)o[d]);
            }
}

/* ---- (a) one block with offsets ---- */

/* Queries [q0, q0+nq) against keys [k0, k0+nk) of a T-long sequence; k, v
 * from a packed kv block (ld 2C) or a qkv block (ld 3C). */
static void check_block(int T, int q0, int nq, int k0, int nk, bool causal, bool packed,
                        uint64_t seed)
{
    uint64_t s = seed;
    float *x = frand(&s, (size_t)B * T * C3, 2.0);
    float *qb = rows_of(x, T, 0, C3, q0, nq);
    float *kvb = packed ? rows_of(x, T, C, C2, k0, nk) : rows_of(x, T, 0, C3, k0, nk);
    const float *k = packed ? kvb : kvb + C;
    const int kv_ld = packed ? C2 : C3;
    const size_t no = (size_t)B * nq * C, nl = (size_t)B * NH * nq;
    float *out = ffill(no, NAN), *lse = ffill(nl, NAN); /* must be overwritten */
    double *dx = todouble(x, (size_t)B * T * C3), *rout = dzeros(no), *rlse = dzeros(nl);

    loco_attention_block_fwd(out, lse, qb, C3, k, k + C, kv_ld, B, nq, nk, C, NH, q0, k0, causal);
    ref_fwd(rout, rlse, dx, T, q0, nq, k0, nk, causal);
    EXPECT_CLOSE("block out", out, rout, no, TOL);
    expect_lse("block lse", lse, rlse, nl);
    expect_masked_zero("block out", out, rlse, nq);

    free(x), free(qb), free(kvb), free(out), free(lse), free(dx), free(rout), free(rlse);
}

Test(kernels_attention_block, keys_before_queries)
{
    check_block(48, 32, 16, 8, 16, true, true, 1);
}
Test(kernels_attention_block, keys_overlap_queries_qkv_ld)
{
    check_block(48, 16, 24, 8, 24, true, false, 2);
}
Test(kernels_attention_block, diagonal) { check_block(48, 16, 16, 16, 16, true, true, 3); }
Test(kernels_attention_block, keys_after_queries_fully_masked)
{
    check_block(48, 0, 16, 16, 16, true, true, 4);
}
/* rows before the first key see nothing: lse -inf, out 0 */
Test(kernels_attention_block, keys_start_inside_queries)
{
    check_block(48, 8, 16, 16, 16, true, true, 5);
}
Test(kernels_attention_block, not_causal) { check_block(48, 0, 16, 24, 24, false, true, 6); }
Test(kernels_attention_block, not_causal_qkv_ld)
{
    check_block(48, 16, 24, 8, 32, false, false, 7);
}
/* ragged sizes over several key tiles of the implementation */
Test(kernels_attention_block, ragged_multi_tile)
{
    check_block(160, 97, 63, 3, 130, true, true, 8);
}
/* several row blocks of the BLAS products, each over a different key count */
Test(kernels_attention_block, ragged_multi_row_block)
{
    check_block(420, 131, 150, 17, 250, true, true, 9);
}
/* the first row blocks see no key, the next only some */
Test(kernels_attention_block, keys_start_inside_many_rows_qkv_ld)
{
    check_block(420, 100, 150, 180, 150, true, false, 10);
}

/* ---- (b) keys in blocks, merged ---- */

/* All T queries against the keys cut at cuts[0] = 0 < ... < cuts[n] = T,
 * merged last block first into a running result that starts empty (lse
 * -inf, out garbage that must not be read). */
static void check_merge(int T, const int *cuts, int n, bool causal, uint64_t seed)
{
    uint64_t s = seed;
    float *x = frand(&s, (size_t)B * T * C3, 2.0);
    const size_t no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    float *out = ffill(no, NAN), *lse = ffill(nl, -INFINITY);
    float *bo = xmalloc(no * sizeof *bo), *bl = xmalloc(nl * sizeof *bl);
    for (int c = n - 1; c >= 0; c--) {
        const int k0 = cuts[c], nk = cuts[c + 1] - cuts[c];
        float *kv = rows_of(x, T, C, C2, k0, nk);
        loco_attention_block_fwd(bo, bl, x, C3, kv, kv + C, C2, B, T, nk, C, NH, 0, k0, causal);
        loco_attention_merge(out, lse, bo, bl, B, T, C, NH);
        free(kv);
    }
    double *dx = todouble(x, (size_t)B * T * C3), *rout = dzeros(no), *rlse = dzeros(nl);
    ref_fwd(rout, rlse, dx, T, 0, T, 0, T, causal);
    EXPECT_CLOSE("merged out", out, rout, no, TOL);
    expect_lse("merged lse", lse, rlse, nl);
    free(x), free(out), free(lse), free(bo), free(bl), free(dx), free(rout), free(rlse);
}

Test(kernels_attention_block, merge_two_blocks)
{
    const int cuts[] = {0, 29, 64};
    check_merge(64, cuts, 2, true, 11);
}
Test(kernels_attention_block, merge_three_blocks)
{
    const int cuts[] = {0, 20, 41, 64};
    check_merge(64, cuts, 3, true, 12);
}
Test(kernels_attention_block, merge_four_blocks)
{
    const int cuts[] = {0, 9, 30, 50, 61};
    check_merge(61, cuts, 4, true, 13);
}
Test(kernels_attention_block, merge_not_causal)
{
    const int cuts[] = {0, 16, 40, 64};
    check_merge(64, cuts, 3, false, 14);
}

/* Rows where either side is -inf take the other, bit for bit. */
Test(kernels_attention_block, merge_empty_sides)
{
    enum { T = 3 };
    const size_t no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    uint64_t s = 15;
    float *out = frand(&s, no, 1.0), *bo = frand(&s, no, 1.0), *lse = frand(&s, nl, 1.0);
    float *bl = frand(&s, nl, 1.0);
    for (size_t r = 0; r < nl; r++) { /* row r % 3: 0 running empty, 1 block empty */
        if (r % 3 == 0)
            lse[r] = -INFINITY;
        if (r % 3 == 1)
            bl[r] = -INFINITY;
    }
    float *out0 = fcopy(out, no), *lse0 = fcopy(lse, nl);
    loco_attention_merge(out, lse, bo, bl, B, T, C, NH);
    for (size_t r = 0; r < nl; r++) {
        const int t = (int)(r % T), h = (int)(r / T % NH), b = (int)(r / T / NH);
        const size_t o = ((size_t)b * T + t) * C + (size_t)h * HS;
        if (r % 3 == 2)
            continue;
        const float *want = r % 3 == 0 ? bo + o : out0 + o;
        cr_expect_eq(memcmp(out + o, want, HS * sizeof(float)), 0, "row %zu out", r);
        cr_expect_eq(lse[r], r % 3 == 0 ? bl[r] : lse0[r], "row %zu lse", r);
    }
    free(out), free(bo), free(lse), free(bl), free(out0), free(lse0);
}

/* ---- (c), (d) the zig-zag layout of ring attention ---- */

enum { MAX_CHUNKS = 8 };

/* A sequence of 2c chunks of L rows; rank r holds chunks r and 2c-1-r, and
 * ring step st brings it rank (r - st) mod c's two chunks. */
typedef struct {
    int c, L, T;
    float *qb[MAX_CHUNKS], *kv[MAX_CHUNKS], *g[MAX_CHUNKS]; /* (B,L,3C), (B,L,2C), (B,L,C) */
    float *out[MAX_CHUNKS], *lse[MAX_CHUNKS];               /* (B,L,C), (B,NH,L) */
    float *dq[MAX_CHUNKS], *dkv[MAX_CHUNKS];                /* (B,L,3C), (B,L,2C) */
} zigzag;

/* The n-th key chunk (n < 2c) rank r's queries meet, in ring order. */
static int zz_key_chunk(const zigzag *z, int r, int n)
{
    const int src = ((r - n / 2) % z->c + z->c) % z->c;
    return n % 2 ? 2 * z->c - 1 - src : src;
}

/* Query chunk qc of rank r: every key chunk's block, merged. */
static void zz_fwd(zigzag *z, int r, int qc)
{
    const int L = z->L;
    float *bo = xmalloc((size_t)B * L * C * sizeof *bo);
    float *bl = xmalloc((size_t)B * NH * L * sizeof *bl);
    for (int n = 0; n < 2 * z->c; n++) {
        const int kc = zz_key_chunk(z, r, n);
        loco_attention_block_fwd(n ? bo : z->out[qc], n ? bl : z->lse[qc], z->qb[qc], C3,
                                 z->kv[kc], z->kv[kc] + C, C2, B, L, L, C, NH, qc * L, kc * L,
                                 true);
        if (n)
            loco_attention_merge(z->out[qc], z->lse[qc], bo, bl, B, L, C, NH);
    }
    free(bo), free(bl);
}

/* Its backward: dq into the query chunk's gradient, dk, dv into each key
 * chunk's packed one (which a ring would send back to the owner). */
static void zz_bwd(zigzag *z, int r, int qc)
{
    const int L = z->L;
    float *delta = xmalloc((size_t)B * NH * L * sizeof *delta);
    loco_attention_delta(delta, z->g[qc], z->out[qc], B, L, C, NH);
    for (int n = 0; n < 2 * z->c; n++) {
        const int kc = zz_key_chunk(z, r, n);
        loco_attention_block_bwd(z->dq[qc], C3, z->dkv[kc], z->dkv[kc] + C, C2, z->g[qc],
                                 z->lse[qc], delta, z->qb[qc], C3, z->kv[kc], z->kv[kc] + C, C2,
                                 B, L, L, C, NH, qc * L, kc * L, true);
    }
    free(delta);
}

/* A whole zig-zag run over x (B,T,3C) and dout (B,T,C), T = 2cL: out
 * (B,T,C), lse (B,NH,T) and dx (B,T,3C) assembled from the chunks. */
static void run_zigzag(int c, int L, const float *x, const float *dout, float *out, float *lse,
                       float *dx)
{
    zigzag z = {.c = c, .L = L, .T = 2 * c * L};
    cr_assert_leq(2 * c, MAX_CHUNKS);
    for (int n = 0; n < 2 * c; n++) {
        z.qb[n] = slice(x, z.T, C3, 0, C3, n * L, L);
        z.kv[n] = slice(x, z.T, C3, C, C2, n * L, L);
        z.g[n] = slice(dout, z.T, C, 0, C, n * L, L);
        z.out[n] = ffill((size_t)B * L * C, NAN);
        z.lse[n] = ffill((size_t)B * NH * L, NAN);
        z.dq[n] = ffill((size_t)B * L * C3, 0.0f);
        z.dkv[n] = ffill((size_t)B * L * C2, 0.0f);
    }
    for (int r = 0; r < c; r++) {
        zz_fwd(&z, r, r);
        zz_fwd(&z, r, 2 * c - 1 - r);
    }
    for (int r = 0; r < c; r++) {
        zz_bwd(&z, r, r);
        zz_bwd(&z, r, 2 * c - 1 - r);
    }
    for (int n = 0; n < 2 * c; n++) {
        unslice(out, z.T, C, 0, C, n * L, L, z.out[n]);
        for (int bh = 0; bh < B * NH; bh++)
            memcpy(lse + (size_t)bh * z.T + n * L, z.lse[n] + (size_t)bh * L, L * sizeof *lse);
        for (size_t i = 0; i < (size_t)B * L; i++) /* dq's ld 3C: k, v columns untouched */
            for (int d = C; d < C3; d++)
                cr_expect(z.dq[n][i * C3 + d] == 0.0f, "chunk %d row %zu col %d written", n, i,
                          d);
        float *dq = slice(z.dq[n], L, C3, 0, C, 0, L);
        unslice(dx, z.T, C3, 0, C, n * L, L, dq);
        unslice(dx, z.T, C3, C, C2, n * L, L, z.dkv[n]);
        free(dq);
        free(z.qb[n]), free(z.kv[n]), free(z.g[n]), free(z.out[n]), free(z.lse[n]);
        free(z.dq[n]), free(z.dkv[n]);
    }
}

/* The zig-zag run against the double reference and against the whole-
 * sequence kernels loco_attention_fwd / loco_attention_bwd. */
static void check_zigzag(int c, int L, uint64_t seed)
{
    const int T = 2 * c * L;
    const size_t nx = (size_t)B * T * C3, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    const size_t na = (size_t)B * NH * T * T;
    uint64_t s = seed;
    float *x = frand(&s, nx, 2.0), *dout = frand(&s, no, 1.0);
    float *out = xmalloc(no * sizeof *out), *lse = xmalloc(nl * sizeof *lse);
    float *dx = ffill(nx, NAN);
    run_zigzag(c, L, x, dout, out, lse, dx);

    double *xd = todouble(x, nx), *dod = todouble(dout, no);
    double *rout = dzeros(no), *rlse = dzeros(nl), *rdx = dzeros(nx);
    ref_fwd(rout, rlse, xd, T, 0, T, 0, T, true);
    ref_bwd(rdx, dod, xd, T);
    EXPECT_CLOSE("zig-zag out", out, rout, no, TOL);
    expect_lse("zig-zag lse", lse, rlse, nl);
    EXPECT_CLOSE("zig-zag dqkv", dx, rdx, nx, TOL);

    float *wout = xmalloc(no * sizeof *wout), *att = xmalloc(na * sizeof *att);
    float *datt = xmalloc(na * sizeof *datt), *wdx = ffill(nx, 0.0f);
    loco_attention_fwd(wout, att, x, B, T, C, NH);
    loco_attention_bwd(wdx, datt, dout, x, att, B, T, C, NH);
    double *wo = todouble(wout, no), *wd = todouble(wdx, nx);
    EXPECT_CLOSE("zig-zag out vs loco_attention_fwd", out, wo, no, TOL);
    EXPECT_CLOSE("zig-zag dqkv vs loco_attention_bwd", dx, wd, nx, TOL);

    free(x), free(dout), free(out), free(lse), free(dx), free(xd), free(dod), free(rout);
    free(rlse), free(rdx), free(wout), free(att), free(datt), free(wdx), free(wo), free(wd);
}

Test(kernels_attention_block, zigzag_two_ranks) { check_zigzag(2, 8, 21); }
Test(kernels_attention_block, zigzag_four_ranks) { check_zigzag(4, 8, 22); }
/* chunks of 5: no row count a multiple of anything */
Test(kernels_attention_block, zigzag_four_ranks_ragged) { check_zigzag(4, 5, 23); }

/* ---- (d) the whole sequence as one block, in a qkv buffer ---- */

/* q, k, v and dq, dk, dv all inside (B,T,3C) buffers (ld 3C), gradients
 * accumulating onto what was there, against the reference and
 * loco_attention_bwd. */
Test(kernels_attention_block, whole_sequence_in_qkv_buffers)
{
    enum { T = 37 };
    const size_t nx = (size_t)B * T * C3, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    const size_t na = (size_t)B * NH * T * T;
    uint64_t s = 31;
    float *x = frand(&s, nx, 2.0), *dout = frand(&s, no, 1.0), *dx = frand(&s, nx, 1.0);
    float *dx0 = fcopy(dx, nx), *out = xmalloc(no * sizeof *out), *lse = xmalloc(nl * 4);
    float *delta = xmalloc(nl * sizeof *delta);
    loco_attention_block_fwd(out, lse, x, C3, x + C, x + C2, C3, B, T, T, C, NH, 0, 0, true);
    loco_attention_delta(delta, dout, out, B, T, C, NH);
    loco_attention_block_bwd(dx, C3, dx + C, dx + C2, C3, dout, lse, delta, x, C3, x + C, x + C2,
                             C3, B, T, T, C, NH, 0, 0, true);

    double *xd = todouble(x, nx), *dod = todouble(dout, no), *rdx = todouble(dx0, nx);
    ref_bwd(rdx, dod, xd, T);
    EXPECT_CLOSE("whole-sequence dqkv (accumulated)", dx, rdx, nx, TOL);

    float *att = xmalloc(na * sizeof *att), *datt = xmalloc(na * sizeof *datt);
    float *wdx = fcopy(dx0, nx);
    loco_attention_fwd(out, att, x, B, T, C, NH);
    loco_attention_bwd(wdx, datt, dout, x, att, B, T, C, NH);
    double *wd = todouble(wdx, nx);
    EXPECT_CLOSE("whole-sequence dqkv vs loco_attention_bwd", dx, wd, nx, TOL);

    free(x), free(dout), free(dx), free(dx0), free(out), free(lse), free(delta), free(xd);
    free(dod), free(rdx), free(att), free(datt), free(wdx), free(wd);
}

/* A fully masked pair: the backward returns without touching anything. */
Test(kernels_attention_block, bwd_fully_masked_untouched)
{
    enum { L = 16 };
    const size_t nq = (size_t)B * L * C3, no = (size_t)B * L * C, nl = (size_t)B * NH * L;
    uint64_t s = 32;
    float *q = frand(&s, nq, 2.0), *kv = frand(&s, nq, 2.0), *g = frand(&s, no, 1.0);
    float *lse = frand(&s, nl, 1.0), *delta = frand(&s, nl, 1.0);
    float *dq = frand(&s, nq, 1.0), *dkv = frand(&s, nq, 1.0);
    float *dq0 = fcopy(dq, nq), *dkv0 = fcopy(dkv, nq);
    loco_attention_block_bwd(dq, C3, dkv + C, dkv + C2, C3, g, lse, delta, q, C3, kv + C, kv + C2,
                             C3, B, L, L, C, NH, 0, L, true);
    EXPECT_SAME_BITS("masked dq", dq, dq0, nq);
    EXPECT_SAME_BITS("masked dk, dv", dkv, dkv0, nq);
    free(q), free(kv), free(g), free(lse), free(delta), free(dq), free(dkv), free(dq0), free(dkv0);
}

/* ---- queries and keys cut anywhere ---- */

/* The sequence's queries cut at qc[0] = 0 < ... < qc[nq] = T and its keys
 * at kc[0..nk]: every (query block, key block) pair forward (merged) and
 * backward, so blocks start before, inside and after each other at
 * arbitrary offsets, against the references. no_mem fails the allocation
 * of every call's scratch: the kernels fall back to their scalar path. */
static void check_cuts(int T, const int *qc, int nq, const int *kc, int nk, bool no_mem,
                       uint64_t seed)
{
    const size_t nx = (size_t)B * T * C3, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    uint64_t s = seed;
    float *x = frand(&s, nx, 2.0), *dout = frand(&s, no, 1.0), *dx = ffill(nx, 0.0f);
    float *out = ffill(no, NAN), *lse = ffill(nl, NAN);
    for (int i = 0; i < nq; i++) {
        const int q0 = qc[i], L = qc[i + 1] - qc[i];
        float *qb = rows_of(x, T, 0, C3, q0, L), *g = slice(dout, T, C, 0, C, q0, L);
        float *o = ffill((size_t)B * L * C, NAN), *l = ffill((size_t)B * NH * L, -INFINITY);
        float *bo = xmalloc((size_t)B * L * C * sizeof *bo);
        float *bl = xmalloc((size_t)B * NH * L * sizeof *bl);
        float *dl = xmalloc((size_t)B * NH * L * sizeof *dl);
        float *dq = ffill((size_t)B * L * C3, 0.0f);
        for (int j = 0; j < nk; j++) {
            float *kv = rows_of(x, T, C, C2, kc[j], kc[j + 1] - kc[j]);
            loco_alloc_fail_after(no_mem ? 1 : 0);
            loco_attention_block_fwd(bo, bl, qb, C3, kv, kv + C, C2, B, L, kc[j + 1] - kc[j], C,
                                     NH, q0, kc[j], true);
            loco_alloc_fail_after(0);
            loco_attention_merge(o, l, bo, bl, B, L, C, NH);
            free(kv);
        }
        loco_attention_delta(dl, g, o, B, L, C, NH);
        for (int j = 0; j < nk; j++) {
            const int k0 = kc[j], n = kc[j + 1] - kc[j];
            float *kv = rows_of(x, T, C, C2, k0, n), *dkv = slice(dx, T, C3, C, C2, k0, n);
            loco_alloc_fail_after(no_mem ? 1 : 0);
            loco_attention_block_bwd(dq, C3, dkv, dkv + C, C2, g, l, dl, qb, C3, kv, kv + C, C2, B,
                                     L, n, C, NH, q0, k0, true);
            loco_alloc_fail_after(0);
            unslice(dx, T, C3, C, C2, k0, n, dkv);
            free(kv), free(dkv);
        }
        float *dqq = slice(dq, L, C3, 0, C, 0, L);
        unslice(dx, T, C3, 0, C, q0, L, dqq);
        unslice(out, T, C, 0, C, q0, L, o);
        for (int bh = 0; bh < B * NH; bh++)
            memcpy(lse + (size_t)bh * T + q0, l + (size_t)bh * L, L * sizeof *lse);
        free(qb), free(g), free(o), free(l), free(bo), free(bl), free(dl), free(dq), free(dqq);
    }
    double *xd = todouble(x, nx), *dod = todouble(dout, no);
    double *rout = dzeros(no), *rlse = dzeros(nl), *rdx = dzeros(nx);
    ref_fwd(rout, rlse, xd, T, 0, T, 0, T, true);
    ref_bwd(rdx, dod, xd, T);
    EXPECT_CLOSE("cut out", out, rout, no, TOL);
    expect_lse("cut lse", lse, rlse, nl);
    EXPECT_CLOSE("cut dqkv", dx, rdx, nx, TOL);
    free(x), free(dout), free(dx), free(out), free(lse), free(xd), free(dod), free(rout);
    free(rlse), free(rdx);
}

static const int cut_q[] = {0, 37, 170, 230, 300}, cut_k[] = {0, 90, 101, 250, 300};

Test(kernels_attention_block, cuts_anywhere) { check_cuts(300, cut_q, 4, cut_k, 4, false, 51); }
/* no memory for the scratch: the scalar path, the same results */
Test(kernels_attention_block, cuts_anywhere_without_scratch)
{
    check_cuts(300, cut_q, 4, cut_k, 4, true, 51);
}

/* ---- (e) determinism ---- */

/* The same bits on every run and for 1 or 3 threads (OpenMP and BLAS), at a
 * size where the kernels run their OpenMP loops in parallel. */
Test(kernels_attention_block, zigzag_same_bits_any_thread_count)
{
    enum { c = 2, L = 130, T = 2 * c * L };
    const size_t nx = (size_t)B * T * C3, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    uint64_t s = 41;
    float *x = frand(&s, nx, 2.0), *dout = frand(&s, no, 1.0);
    float *out[3], *lse[3], *dx[3];
    const int threads[3] = {1, 3, 3};
    for (int k = 0; k < 3; k++) {
        loco_set_threads(threads[k]);
        out[k] = xmalloc(no * sizeof(float));
        lse[k] = xmalloc(nl * sizeof(float));
        dx[k] = ffill(nx, NAN);
        run_zigzag(c, L, x, dout, out[k], lse[k], dx[k]);
    }
    for (int k = 1; k < 3; k++) {
        EXPECT_SAME_BITS("out", out[0], out[k], no);
        EXPECT_SAME_BITS("lse", lse[0], lse[k], nl);
        EXPECT_SAME_BITS("dqkv", dx[0], dx[k], nx);
    }
    for (int k = 0; k < 3; k++)
        free(out[k]), free(lse[k]), free(dx[k]);
    free(x), free(dout);
}
