/* kernels/cpu/tp.c, the tensor-parallel pieces, against plain
 * double-precision references on awkward sizes (tokens outside the slice,
 * ignored targets, padding columns), and against the whole-model kernels
 * they replace: the vocabulary-parallel cross-entropy over 1..4 column
 * slices joined as the all-reduces join them equals loco_xent_fwd_bwd, and
 * embedding slices plus positions equal loco_encoder_fwd/bwd bit for bit. */
#include <criterion/criterion.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "tests/kernels/kernels_test.h"

/* Padding columns hold this, so a kernel that reads them shows. */
#define GARBAGE 1e4f

/* n tokens in [lo, hi), the last equal to the first (a repeat) */
static int32_t *rand_tokens(uint64_t *s, size_t n, int lo, int hi)
{
    int32_t *t = xmalloc(n * sizeof *t);
    for (size_t i = 0; i < n; i++)
        t[i] = lo + (int32_t)(splitmix64(s) % (uint64_t)(hi - lo));
    t[n - 1] = t[0];
    return t;
}

/* ---- embedding, positions, bias ---- */

static void ref_embed_fwd(double *out, const int32_t *tok, const double *wte, int v_lo, int v_n,
                          int N, int C)
{
    for (int n = 0; n < N; n++) {
        const int r = tok[n] - v_lo;
        for (int c = 0; c < C; c++)
            out[(size_t)n * C + c] = r >= 0 && r < v_n ? wte[(size_t)r * C + c] : 0.0;
    }
}

static void ref_embed_bwd(double *dwte, const double *dout, const int32_t *tok, int v_lo,
                          int v_n, int N, int C)
{
    for (int n = 0; n < N; n++) {
        const int r = tok[n] - v_lo;
        if (r < 0 || r >= v_n)
            continue;
        for (int c = 0; c < C; c++)
            dwte[(size_t)r * C + c] += dout[(size_t)n * C + c];
    }
}

/* (N, C) rows of a slice [v_lo, v_lo + v_n) with tokens from below, inside
 * and above it (and negative ones). */
static void check_embed(int N, int C, int v_lo, int v_n, uint64_t seed)
{
    uint64_t s = seed;
    const size_t nout = (size_t)N * C, nw = (size_t)v_n * C;
    int32_t *tok = rand_tokens(&s, (size_t)N, -3, v_lo + v_n + 5);
    float *wte = frand(&s, nw, 1.0), *out = ffill(nout, NAN);
    double *dwte_ = todouble(wte, nw), *rout = dzeros(nout);
    loco_embed_fwd(out, tok, wte, v_lo, v_n, N, C);
    ref_embed_fwd(rout, tok, dwte_, v_lo, v_n, N, C);
    EXPECT_CLOSE("embed fwd", out, rout, nout, 0.0);

    float *dout = frand(&s, nout, 1.0), *g = frand(&s, nw, 1.0);
    double *r = todouble(g, nw), *ddout = todouble(dout, nout);
    for (int k = 1; k <= 2; k++) { /* gradients accumulate */
        loco_embed_bwd(g, dout, tok, v_lo, v_n, N, C);
        ref_embed_bwd(r, ddout, tok, v_lo, v_n, N, C);
        EXPECT_CLOSE("embed bwd", g, r, nw, 1e-6);
    }
    free(tok), free(wte), free(out), free(dwte_), free(rout);
    free(dout), free(g), free(r), free(ddout);
}

Test(kernels_tp, embed_small_slice) { check_embed(37, 19, 5, 13, 101); }
Test(kernels_tp, embed_first_slice) { check_embed(41, 7, 0, 11, 102); }
Test(kernels_tp, embed_threaded) { check_embed(300, 130, 40, 57, 103); }
Test(kernels_tp, embed_empty_slice) { check_embed(23, 5, 9, 0, 104); }

static void check_pos(int N, int T, int C, int row0, uint64_t seed)
{
    uint64_t s = seed;
    const size_t nout = (size_t)N * C, np = (size_t)(T + 2) * C; /* wpe longer than T */
    float *wpe = frand(&s, np, 1.0), *out = frand(&s, nout, 1.0);
    double *r = todouble(out, nout);
    loco_pos_fwd(out, wpe, row0, N, T, C);
    for (int i = 0; i < N; i++)
        for (int c = 0; c < C; c++)
            r[(size_t)i * C + c] += wpe[(size_t)((row0 + i) % T) * C + c];
    EXPECT_CLOSE("pos fwd", out, r, nout, 1e-7);

    float *dout = frand(&s, nout, 1.0), *g = frand(&s, np, 1.0);
    double *rg = todouble(g, np);
    for (int k = 1; k <= 2; k++) {
        loco_pos_bwd(g, dout, row0, N, T, C);
        for (int i = 0; i < N; i++)
            for (int c = 0; c < C; c++)
                rg[(size_t)((row0 + i) % T) * C + c] += dout[(size_t)i * C + c];
        EXPECT_CLOSE("pos bwd", g, rg, np, 1e-6);
    }
    free(wpe), free(out), free(r), free(dout), free(g), free(rg);
}

Test(kernels_tp, pos_row0_zero) { check_pos(37, 11, 19, 0, 111); }
Test(kernels_tp, pos_row0_mid_sequence) { check_pos(37, 11, 19, 2 * 11 + 5, 112); }
Test(kernels_tp, pos_fewer_rows_than_t) { check_pos(5, 17, 9, 14, 113); }
Test(kernels_tp, pos_threaded) { check_pos(400, 64, 96, 1000, 114); }

Test(kernels_tp, bias_fwd)
{
    enum { N = 37, OC = 53 };
    uint64_t s = 121;
    float *out = frand(&s, (size_t)N * OC, 1.0), *bias = frand(&s, OC, 1.0);
    double *r = todouble(out, (size_t)N * OC);
    for (int n = 0; n < N; n++)
        for (int j = 0; j < OC; j++)
            r[(size_t)n * OC + j] += bias[j];
    loco_bias_fwd(out, bias, N, OC);
    EXPECT_CLOSE("bias fwd", out, r, (size_t)N * OC, 1e-7);
    free(out), free(bias), free(r);
}

/* ---- vocabulary-parallel cross-entropy, one slice ---- */

/* The three steps in double on one slice, given the global rowmax, sumexp
 * and tlogit for the last one. */
static void ref_vp(double *rowmax, double *sumexp, double *tlogit, const float *x,
                   const int32_t *y, int v_lo, int N, int Vl, int v_valid)
{
    for (int n = 0; n < N; n++) {
        const float *xr = x + (size_t)n * Vl;
        double m = -INFINITY, se = 0.0;
        for (int j = 0; j < v_valid; j++)
            m = fmax(m, xr[j]);
        for (int j = 0; j < v_valid; j++)
            se += exp((double)xr[j] - m);
        rowmax[n] = m;
        sumexp[n] = se;
        const int yl = y[n] - v_lo;
        tlogit[n] = y[n] >= 0 && yl >= 0 && yl < v_valid ? xr[yl] : 0.0;
    }
}

static void ref_vp_finish(double *loss, double *d, const float *x, const float *rowmax,
                          const float *sumexp, const float *tlogit, const int32_t *y, int v_lo,
                          int N, int Vl, int v_valid, double dscale)
{
    for (int n = 0; n < N; n++) {
        const float *xr = x + (size_t)n * Vl;
        double *dr = d + (size_t)n * Vl;
        for (int j = 0; j < Vl; j++)
            dr[j] = 0.0;
        if (y[n] < 0) {
            loss[n] = 0.0;
            continue;
        }
        const double lse = rowmax[n] + log((double)sumexp[n]);
        loss[n] = lse - tlogit[n];
        for (int j = 0; j < v_valid; j++)
            dr[j] = dscale * (exp(xr[j] - lse) - (j + v_lo == y[n]));
    }
}

/* One slice of Vl columns starting at v_lo, v_valid of them real, of a
 * vocabulary of V; targets anywhere in [0, V) or negative. */
static void check_vp_slice(int N, int V, int v_lo, int Vl, int v_valid, uint64_t seed)
{
    uint64_t s = seed;
    const size_t n = (size_t)N * Vl;
    float *x = frand(&s, n, 4.0);
    for (int i = 0; i < N; i++)
        for (int j = v_valid; j < Vl; j++)
            x[(size_t)i * Vl + j] = GARBAGE;
    int32_t *y = xmalloc((size_t)N * sizeof *y);
    for (int i = 0; i < N; i++)
        y[i] = i % 5 == 3 ? -1 - i % 2
               : i % 3 == 0 && v_valid ? v_lo + (int32_t)(splitmix64(&s) % (uint64_t)v_valid)
                                       : (int32_t)(splitmix64(&s) % (uint64_t)V);
    if (v_valid && N > 5) /* the slice's first and last real columns */
        y[1] = v_lo, y[5] = v_lo + v_valid - 1;
    float *rowmax = ffill(N, NAN), *sumexp = ffill(N, NAN), *tlogit = ffill(N, NAN);
    double *rm = dzeros(N), *rs = dzeros(N), *rt = dzeros(N);
    ref_vp(rm, rs, rt, x, y, v_lo, N, Vl, v_valid);

    loco_xent_vp_max(rowmax, x, N, Vl, v_valid);
    for (int i = 0; i < N; i++) /* -INFINITY when the slice is all padding */
        cr_expect(rowmax[i] == rm[i], "row %d: max %g, not %g", i, (double)rowmax[i], rm[i]);

    /* the sums against a rowmax from elsewhere: a shift of the local one */
    float *gmax = xmalloc((size_t)N * sizeof *gmax);
    for (int i = 0; i < N; i++)
        gmax[i] = v_valid ? rowmax[i] + (float)(i % 3) : 1.0f;
    for (int i = 0; i < N; i++)
        rs[i] *= exp(rm[i] - gmax[i]) * (v_valid > 0);
    loco_xent_vp_sum(sumexp, tlogit, x, gmax, y, v_lo, N, Vl, v_valid);
    for (int i = 0; i < N; i++) {
        const double e = fabs(sumexp[i] - rs[i]) / rs[i];
        cr_expect(v_valid ? e <= 1e-6 : sumexp[i] == 0.0f, "row %d sumexp %.9g vs %.9g", i,
                  (double)sumexp[i], rs[i]);
    }
    EXPECT_CLOSE("vp tlogit", tlogit, rt, (size_t)N, 0.0);

    /* finish with global sums made up for the test: the local ones plus
     * another slice's share */
    for (int i = 0; i < N; i++) {
        sumexp[i] += 0.5f + (float)(i % 4);
        if (tlogit[i] == 0.0f)
            tlogit[i] = -0.25f * (float)(i % 3);
    }
    const float dscale = 1.0f / 7.0f;
    float *loss = ffill(N, NAN), *d = ffill(n, NAN);
    double *rl = dzeros(N), *rd = dzeros(n);
    loco_xent_vp_finish(loss, d, x, gmax, sumexp, tlogit, y, v_lo, N, Vl, v_valid, dscale);
    ref_vp_finish(rl, rd, x, gmax, sumexp, tlogit, y, v_lo, N, Vl, v_valid, dscale);
    EXPECT_CLOSE("vp losses", loss, rl, (size_t)N, 1e-6);
    EXPECT_CLOSE("vp dlogits", d, rd, n, 1e-6);
    for (int i = 0; i < N; i++)
        for (int j = y[i] < 0 ? 0 : v_valid; j < Vl; j++)
            cr_expect(d[(size_t)i * Vl + j] == 0.0f, "row %d col %d: grad %g, not 0", i, j,
                      (double)d[(size_t)i * Vl + j]);

    /* losses alone, and in place, give the same bits */
    float *loss2 = ffill(N, NAN), *buf = fcopy(x, n);
    loco_xent_vp_finish(loss2, NULL, x, gmax, sumexp, tlogit, y, v_lo, N, Vl, v_valid, dscale);
    EXPECT_SAME_BITS("vp losses without dlogits", loss, loss2, (size_t)N);
    loco_xent_vp_finish(loss2, buf, buf, gmax, sumexp, tlogit, y, v_lo, N, Vl, v_valid, dscale);
    EXPECT_SAME_BITS("vp in-place losses", loss, loss2, (size_t)N);
    EXPECT_SAME_BITS("vp in-place dlogits", d, buf, n);

    free(x), free(y), free(rowmax), free(sumexp), free(tlogit), free(rm), free(rs), free(rt);
    free(gmax), free(loss), free(d), free(rl), free(rd), free(loss2), free(buf);
}

Test(kernels_tp, xent_vp_middle_slice) { check_vp_slice(37, 40, 13, 13, 13, 131); }
Test(kernels_tp, xent_vp_padded_slice) { check_vp_slice(37, 40, 26, 19, 14, 132); }
Test(kernels_tp, xent_vp_all_padding) { check_vp_slice(23, 9, 9, 3, 0, 133); }
Test(kernels_tp, xent_vp_threaded) { check_vp_slice(64, 2000, 500, 517, 500, 134); }

/* ---- the slices joined, against the whole-vocabulary kernel ---- */

/* logits (N,V) cut into t slices of Vl = ceil(V/t) columns, the last
 * padded with GARBAGE; the three steps on every slice joined as the tp
 * all-reduces join them (MAX, then SUM in rank order), the losses and the
 * concatenated gradients against loco_xent_fwd_bwd on the whole matrix. */
static void check_vp_split(int N, int V, int t, double scale, uint64_t seed)
{
    uint64_t s = seed;
    const int Vl = (V + t - 1) / t;
    const size_t nv = (size_t)N * V, nl = (size_t)N * Vl;
    float *x = frand(&s, nv, scale);
    int32_t *y = xmalloc((size_t)N * sizeof *y);
    int valid = 0;
    for (int i = 0; i < N; i++) {
        y[i] = i % 5 == 3 ? -1 - i % 3 : (int32_t)(splitmix64(&s) % (uint64_t)V);
        if (i == N - 1)
            y[i] = V - 1; /* the last class is reachable */
        valid += y[i] >= 0;
    }
    const float dscale = 1.0f / (float)valid;
    float *want_loss = ffill(N, NAN), *want_d = ffill(nv, NAN);
    loco_xent_fwd_bwd(want_loss, want_d, x, y, N, V, dscale);

    float *sl[4], *pm[4], *ps[4], *pt[4], *loss[4];
    float *gmax = ffill(N, -INFINITY), *gsum = ffill(N, 0.0f), *gt = ffill(N, 0.0f);
    for (int r = 0; r < t; r++) {
        const int v_lo = r * Vl, v_valid = V - v_lo < Vl ? V - v_lo : Vl;
        sl[r] = ffill(nl, GARBAGE);
        for (int i = 0; i < N; i++)
            for (int j = 0; j < v_valid; j++)
                sl[r][(size_t)i * Vl + j] = x[(size_t)i * V + v_lo + j];
        pm[r] = ffill(N, NAN), ps[r] = ffill(N, NAN), pt[r] = ffill(N, NAN);
        loss[r] = ffill(N, NAN);
        loco_xent_vp_max(pm[r], sl[r], N, Vl, v_valid);
        for (int i = 0; i < N; i++)
            gmax[i] = fmaxf(gmax[i], pm[r][i]);
    }
    for (int r = 0; r < t; r++) {
        const int v_lo = r * Vl, v_valid = V - v_lo < Vl ? V - v_lo : Vl;
        loco_xent_vp_sum(ps[r], pt[r], sl[r], gmax, y, v_lo, N, Vl, v_valid);
    }
    for (int r = 0; r < t; r++)
        for (int i = 0; i < N; i++)
            gsum[i] += ps[r][i], gt[i] += pt[r][i];

    float *got_d = ffill(nv, NAN);
    for (int r = 0; r < t; r++) {
        const int v_lo = r * Vl, v_valid = V - v_lo < Vl ? V - v_lo : Vl;
        /* in place, as the model runs it */
        loco_xent_vp_finish(loss[r], sl[r], sl[r], gmax, gsum, gt, y, v_lo, N, Vl, v_valid,
                            dscale);
        for (int i = 0; i < N; i++) {
            for (int j = 0; j < v_valid; j++)
                got_d[(size_t)i * V + v_lo + j] = sl[r][(size_t)i * Vl + j];
            for (int j = v_valid; j < Vl; j++)
                cr_expect(sl[r][(size_t)i * Vl + j] == 0.0f, "t=%d rank %d row %d padding %d", t,
                          r, i, j);
        }
        if (r > 0)
            EXPECT_SAME_BITS("every rank's losses", loss[r], loss[0], (size_t)N);
    }

    double *wl = todouble(want_loss, (size_t)N), *wd = todouble(want_d, nv);
    const double tol = t == 1 ? 1e-6 : 1e-5;
    const double el = relerr(loss[0], wl, (size_t)N);
    cr_expect_leq(el, tol, "t=%d losses: rel err %.3g > %.3g", t, el, tol);
    double ed = 0.0;
    for (size_t i = 0; i < nv; i++)
        ed = fmax(ed, isfinite(got_d[i]) ? fabs((double)got_d[i] - wd[i]) : INFINITY);
    cr_expect_leq(ed, 1e-6, "t=%d dlogits: abs err %.3g", t, ed);
    for (int i = 0; i < N; i++)
        if (y[i] < 0)
            cr_expect(loss[0][i] == 0.0f, "ignored row %d: loss %g", i, (double)loss[0][i]);

    for (int r = 0; r < t; r++)
        free(sl[r]), free(pm[r]), free(ps[r]), free(pt[r]), free(loss[r]);
    free(x), free(y), free(want_loss), free(want_d), free(gmax), free(gsum), free(gt);
    free(got_d), free(wl), free(wd);
}

Test(kernels_tp, xent_vp_one_rank) { check_vp_split(51, 37, 1, 3.0, 141); }
Test(kernels_tp, xent_vp_two_ranks) { check_vp_split(51, 37, 2, 3.0, 142); }
Test(kernels_tp, xent_vp_three_ranks) { check_vp_split(51, 37, 3, 3.0, 143); }
Test(kernels_tp, xent_vp_four_ranks) { check_vp_split(51, 37, 4, 3.0, 144); }
/* V = 9 over 4 ranks: slices of 3, the last one all padding */
Test(kernels_tp, xent_vp_four_ranks_one_empty) { check_vp_split(29, 9, 4, 3.0, 145); }
Test(kernels_tp, xent_vp_gpt2_vocab_large_logits)
{
    for (int t = 1; t <= 4; t++)
        check_vp_split(9, 50257, t, 30.0, 146 + (uint64_t)t);
}

/* ---- embedding slices and positions, against the encoder ---- */

/* wte (V,C) cut into t row slices of ceil(V/t) (the last shorter); the
 * forward summed over the slices (as the tp all-reduce sums it) plus the
 * positions, applied to two runs of rows split inside a sequence, and the
 * backward the same way, equal the encoder bit for bit. */
static void check_vs_encoder(int B, int T, int C, int V, int t, uint64_t seed)
{
    uint64_t s = seed;
    const int N = B * T, rows = (V + t - 1) / t, N1 = N / 2 + 1;
    const size_t nout = (size_t)N * C, nw = (size_t)V * C, np = (size_t)(T + 1) * C;
    int32_t *tok = rand_tokens(&s, (size_t)N, 0, V);
    float *wte = frand(&s, nw, 1.0), *wpe = frand(&s, np, 1.0);
    float *want = ffill(nout, NAN), *got = ffill(nout, 0.0f), *part = ffill(nout, NAN);
    loco_encoder_fwd(want, tok, wte, wpe, B, T, C);
    for (int r = 0; r < t; r++) {
        const int v_lo = r * rows, v_n = V - v_lo < rows ? V - v_lo : rows;
        loco_embed_fwd(part, tok, wte + (size_t)v_lo * C, v_lo, v_n, N, C);
        for (size_t i = 0; i < nout; i++)
            got[i] += part[i];
    }
    loco_pos_fwd(got, wpe, 0, N1, T, C);
    loco_pos_fwd(got + (size_t)N1 * C, wpe, N1, N - N1, T, C);
    EXPECT_SAME_BITS("embed + pos vs encoder fwd", got, want, nout);

    float *dout = frand(&s, nout, 1.0);
    float *gte = frand(&s, nw, 1.0), *gpe = frand(&s, np, 1.0);
    float *wte_g = fcopy(gte, nw), *wpe_g = fcopy(gpe, np);
    loco_encoder_bwd(wte_g, wpe_g, dout, tok, B, T, C);
    for (int r = 0; r < t; r++) {
        const int v_lo = r * rows, v_n = V - v_lo < rows ? V - v_lo : rows;
        loco_embed_bwd(gte + (size_t)v_lo * C, dout, tok, v_lo, v_n, N, C);
    }
    loco_pos_bwd(gpe, dout, 0, N1, T, C);
    loco_pos_bwd(gpe, dout + (size_t)N1 * C, N1, N - N1, T, C);
    EXPECT_SAME_BITS("embed bwd vs encoder dwte", gte, wte_g, nw);
    EXPECT_SAME_BITS("pos bwd vs encoder dwpe", gpe, wpe_g, np);

    free(tok), free(wte), free(wpe), free(want), free(got), free(part);
    free(dout), free(gte), free(gpe), free(wte_g), free(wpe_g);
}

Test(kernels_tp, encoder_one_slice) { check_vs_encoder(3, 13, 19, 37, 1, 151); }
Test(kernels_tp, encoder_three_slices) { check_vs_encoder(3, 13, 19, 37, 3, 152); }
Test(kernels_tp, encoder_four_slices_threaded) { check_vs_encoder(4, 64, 100, 301, 4, 153); }

/* ---- determinism ---- */

/* The backward kernels give the same bits on 1 thread and on several. */
Test(kernels_tp, backward_independent_of_threads)
{
    enum { N = 400, C = 130, V = 97, T = 64, V_LO = 20, V_N = 50 };
    uint64_t s = 161;
    int32_t *tok = rand_tokens(&s, N, 0, V);
    for (int i = 0; i < N; i += 3)
        tok[i] = tok[0]; /* many repeats of one row */
    float *dout = frand(&s, (size_t)N * C, 1.0);
    float *g0 = frand(&s, (size_t)V_N * C, 1.0), *p0 = frand(&s, (size_t)T * C, 1.0);
    float *g[2], *p[2];
    const int nt = omp_get_max_threads();
    for (int k = 0; k < 2; k++) {
        omp_set_num_threads(k ? (nt > 2 ? nt : 3) : 1);
        g[k] = fcopy(g0, (size_t)V_N * C), p[k] = fcopy(p0, (size_t)T * C);
        loco_embed_bwd(g[k], dout, tok, V_LO, V_N, N, C);
        loco_pos_bwd(p[k], dout, 7, N, T, C);
    }
    omp_set_num_threads(nt);
    EXPECT_SAME_BITS("embed bwd", g[0], g[1], (size_t)V_N * C);
    EXPECT_SAME_BITS("pos bwd", p[0], p[1], (size_t)T * C);
    free(tok), free(dout), free(g0), free(p0);
    for (int k = 0; k < 2; k++)
        free(g[k]), free(p[k]);
}
