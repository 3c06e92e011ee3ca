/* kernels/cpu attention and fused softmax + cross-entropy against plain
 * double-precision references (themselves checked against central finite
 * differences), plus causality, accumulation, in-place and bitwise
 * repeatability checks. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "tests/kernels/kernels_test.h"

/* ---- attention reference ---- */

/* out (B,T,C), att (B,NH,T,T) with zeros above the diagonal */
static void ref_attention_fwd(double *out, double *att, const double *qkv,
                              int B, int T, int C, int NH)
{
    const int hs = C / NH, C3 = 3 * C;
    const double scale = 1.0 / sqrt((double)hs);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const double *q = qkv + ((size_t)b * T + t) * C3 + h * hs;
                double *p = att + (((size_t)b * NH + h) * T + t) * T;
                double m = -INFINITY, sum = 0.0;
                for (int j = 0; j < T; j++) {
                    p[j] = 0.0;
                    if (j > t)
                        continue;
                    const double *k = qkv + ((size_t)b * T + j) * C3 + C + h * hs;
                    for (int i = 0; i < hs; i++)
                        p[j] += q[i] * k[i];
                    p[j] *= scale;
                    m = fmax(m, p[j]);
                }
                for (int j = 0; j <= t; j++) {
                    p[j] = exp(p[j] - m);
                    sum += p[j];
                }
                for (int j = 0; j <= t; j++)
                    p[j] /= sum;
                double *o = out + ((size_t)b * T + t) * C + h * hs;
                for (int i = 0; i < hs; i++) {
                    o[i] = 0.0;
                    for (int j = 0; j <= t; j++)
                        o[i] += p[j] * qkv[((size_t)b * T + j) * C3 + 2 * C + h * hs + i];
                }
            }
}

/* dqkv (B,T,3C) += gradient of sum(dout * attention(qkv)) */
static void ref_attention_bwd(double *dqkv, const double *dout,
                              const double *qkv, int B, int T, int C, int NH)
{
    const int hs = C / NH, C3 = 3 * C;
    const double scale = 1.0 / sqrt((double)hs);
    double *out = dzeros((size_t)B * T * C), *att = dzeros((size_t)B * NH * T * T);
    double *dp = dzeros((size_t)T);
    ref_attention_fwd(out, att, qkv, B, T, C, NH);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const double *p = att + (((size_t)b * NH + h) * T + t) * T;
                const double *dO = dout + ((size_t)b * T + t) * C + h * hs;
                const size_t qo = ((size_t)b * T + t) * C3 + h * hs;
                double dot = 0.0;
                for (int j = 0; j <= t; j++) {
                    const size_t vo = ((size_t)b * T + j) * C3 + 2 * C + h * hs;
                    dp[j] = 0.0;
                    for (int i = 0; i < hs; i++) {
                        dp[j] += dO[i] * qkv[vo + i];
                        dqkv[vo + i] += p[j] * dO[i];
                    }
                    dot += p[j] * dp[j];
                }
                for (int j = 0; j <= t; j++) {
                    const double ds = p[j] * (dp[j] - dot) * scale;
                    const size_t ko = ((size_t)b * T + j) * C3 + C + h * hs;
                    for (int i = 0; i < hs; i++) {
                        dqkv[qo + i] += ds * qkv[ko + i];
                        dqkv[ko + i] += ds * qkv[qo + i];
                    }
                }
            }
    free(out);
    free(att);
    free(dp);
}

Test(kernels, attention_reference_vs_finite_differences)
{
    enum { B = 2, T = 5, C = 8, NH = 2 };
    const size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C;
    uint64_t s = 21;
    double qkv[B * T * 3 * C], dout[B * T * C], out[B * T * C], att[B * NH * T * T];
    double g[B * T * 3 * C] = {0}, fd[B * T * 3 * C];
    for (size_t i = 0; i < nq; i++)
        qkv[i] = 2.0 * urand(&s);
    for (size_t i = 0; i < no; i++)
        dout[i] = urand(&s);
    ref_attention_bwd(g, dout, qkv, B, T, C, NH);
    const double h = 1e-6;
    for (size_t i = 0; i < nq; i++) {
        const double keep = qkv[i];
        double L[2];
        for (int sgn = 0; sgn < 2; sgn++) {
            qkv[i] = keep + (sgn ? -h : h);
            ref_attention_fwd(out, att, qkv, B, T, C, NH);
            L[sgn] = 0.0;
            for (size_t j = 0; j < no; j++)
                L[sgn] += dout[j] * out[j];
        }
        qkv[i] = keep;
        fd[i] = (L[0] - L[1]) / (2 * h);
    }
    const double e = relerr_dd(g, fd, nq);
    cr_expect_leq(e, 1e-7, "attention ref grad vs FD: %.3g", e);
}

static void check_attention(int B, int T, int C, int NH, double tol,
                            uint64_t seed)
{
    uint64_t s = seed;
    const size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C;
    const size_t na = (size_t)B * NH * T * T;
    float *qkv = frand(&s, nq, 2.0);
    float *out = ffill(no, NAN), *att = ffill(na, NAN); /* must be overwritten */
    double *dqkv_ = todouble(qkv, nq), *rout = dzeros(no), *ratt = dzeros(na);

    loco_attention_fwd(out, att, qkv, B, T, C, NH);
    ref_attention_fwd(rout, ratt, dqkv_, B, T, C, NH);
    EXPECT_CLOSE("attention out", out, rout, no, tol);
    EXPECT_CLOSE("attention att", att, ratt, na, tol);

    /* causal probabilities: exact zeros above the diagonal, rows sum to 1 */
    for (size_t r = 0; r < (size_t)B * NH * T; r++) {
        const int t = (int)(r % T);
        const float *p = att + r * T;
        double sum = 0.0;
        for (int j = 0; j <= t; j++) {
            cr_expect(p[j] >= 0.0f, "att row %zu col %d negative", r, j);
            sum += p[j];
        }
        cr_expect_leq(fabs(sum - 1.0), 1e-5, "att row %zu sums to %.9g", r, sum);
        for (int j = t + 1; j < T; j++)
            cr_expect(p[j] == 0.0f, "att row %zu col %d above diagonal = %g", r, j,
                      (double)p[j]);
    }

    float *dout = frand(&s, no, 1.0), *g = frand(&s, nq, 1.0), *g0 = fcopy(g, nq);
    float *datt = ffill(na, NAN); /* scratch: stale contents must not leak */
    double *ddout = todouble(dout, no), *G = dzeros(nq), *r = xmalloc(nq * sizeof *r);
    ref_attention_bwd(G, ddout, dqkv_, B, T, C, NH);
    for (int k = 1; k <= 2; k++) {
        loco_attention_bwd(g, datt, dout, qkv, att, B, T, C, NH);
        for (size_t i = 0; i < nq; i++)
            r[i] = g0[i] + k * G[i];
        EXPECT_CLOSE(k == 1 ? "attention dqkv" : "attention dqkv (2nd call)", g,
                     r, nq, tol);
    }

    free(qkv); free(out); free(att); free(dqkv_); free(rout); free(ratt);
    free(dout); free(g); free(g0); free(datt); free(ddout); free(G); free(r);
}

Test(kernels, attention_t17_nh3) { check_attention(3, 17, 36, 3, 1e-5, 22); }
Test(kernels, attention_t7_nh4) { check_attention(3, 7, 20, 4, 1e-5, 23); }
Test(kernels, attention_t1_single_token) { check_attention(2, 1, 12, 3, 1e-5, 24); }
/* spans several query blocks of the implementation, with a ragged last one */
Test(kernels, attention_t300_multiblock) { check_attention(1, 300, 16, 2, 1e-5, 25); }
Test(kernels, attention_t129_block_edge) { check_attention(2, 129, 24, 3, 1e-5, 26); }

Test(kernels, attention_repeatable_bitwise)
{
    enum { B = 2, T = 200, C = 64, NH = 4 };
    const size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C;
    const size_t na = (size_t)B * NH * T * T;
    uint64_t s = 27;
    float *qkv = frand(&s, nq, 2.0), *dout = frand(&s, no, 1.0);
    float *out[2], *att[2], *g[2];
    float *datt = xmalloc(na * sizeof *datt);
    for (int k = 0; k < 2; k++) {
        out[k] = xmalloc(no * sizeof(float));
        att[k] = xmalloc(na * sizeof(float));
        g[k] = ffill(nq, 0.0f);
        loco_attention_fwd(out[k], att[k], qkv, B, T, C, NH);
        loco_attention_bwd(g[k], datt, dout, qkv, att[k], B, T, C, NH);
    }
    EXPECT_SAME_BITS("attention out", out[0], out[1], no);
    EXPECT_SAME_BITS("attention att", att[0], att[1], na);
    EXPECT_SAME_BITS("attention dqkv", g[0], g[1], nq);
    for (int k = 0; k < 2; k++) {
        free(out[k]);
        free(att[k]);
        free(g[k]);
    }
    free(qkv); free(dout); free(datt);
}

/* ---- fused softmax + cross-entropy ---- */

/* losses (N), dlogits (N,V) = dscale * (softmax - onehot); rows with a
 * negative target give 0 and 0. */
static void ref_xent(double *loss, double *d, const double *x, const int32_t *y,
                     int N, int V, double dscale)
{
    for (int n = 0; n < N; n++) {
        const double *xr = x + (size_t)n * V;
        double *dr = d + (size_t)n * V;
        if (y[n] < 0) {
            loss[n] = 0.0;
            for (int j = 0; j < V; j++)
                dr[j] = 0.0;
            continue;
        }
        double m = -INFINITY, s = 0.0;
        for (int j = 0; j < V; j++)
            m = fmax(m, xr[j]);
        for (int j = 0; j < V; j++)
            s += exp(xr[j] - m);
        const double lse = m + log(s);
        loss[n] = lse - xr[y[n]];
        for (int j = 0; j < V; j++)
            dr[j] = dscale * (exp(xr[j] - lse) - (j == y[n]));
    }
}

Test(kernels, xent_reference_vs_finite_differences)
{
    enum { N = 4, V = 6 };
    const int32_t y[N] = {2, -1, 0, 5};
    const double dscale = 1.0 / 3.0, h = 1e-6;
    uint64_t s = 31;
    double x[N * V], loss[N], d[N * V], scratch[N * V], fd[N * V];
    for (int i = 0; i < N * V; i++)
        x[i] = 4.0 * urand(&s);
    ref_xent(loss, d, x, y, N, V, dscale);
    for (int i = 0; i < N * V; i++) {
        const double keep = x[i];
        double L[2];
        for (int sgn = 0; sgn < 2; sgn++) {
            x[i] = keep + (sgn ? -h : h);
            ref_xent(loss, scratch, x, y, N, V, dscale);
            L[sgn] = 0.0;
            for (int n = 0; n < N; n++)
                L[sgn] += dscale * loss[n];
        }
        x[i] = keep;
        fd[i] = (L[0] - L[1]) / (2 * h);
    }
    const double e = relerr_dd(d, fd, N * V);
    cr_expect_leq(e, 1e-7, "xent ref grad vs FD: %.3g", e);
}

static void check_xent(int N, int V, double logit_scale, uint64_t seed)
{
    uint64_t s = seed;
    const size_t NV = (size_t)N * V;
    int32_t *y = xmalloc(N * sizeof *y);
    int valid = 0;
    for (int n = 0; n < N; n++) {
        y[n] = n % 5 == 3 ? -1 - n % 3 : (int32_t)(splitmix64(&s) % (uint64_t)V);
        if (n == N - 1)
            y[n] = V - 1; /* the last class is reachable */
        valid += y[n] >= 0;
    }
    const float dscale = 1.0f / (float)valid;
    float *x = frand(&s, NV, logit_scale);
    float *loss = ffill(N, NAN), *d = ffill(NV, NAN);
    double *dx = todouble(x, NV), *rloss = dzeros(N), *rd = dzeros(NV);

    loco_xent_fwd_bwd(loss, d, x, y, N, V, dscale);
    ref_xent(rloss, rd, dx, y, N, V, dscale);
    EXPECT_CLOSE("xent loss", loss, rloss, N, 1e-5);
    EXPECT_CLOSE("xent dlogits", d, rd, NV, 1e-5);

    /* ignored rows: exactly zero */
    for (int n = 0; n < N; n++) {
        if (y[n] >= 0)
            continue;
        cr_expect(loss[n] == 0.0f, "ignored row %d has loss %g", n, (double)loss[n]);
        for (int j = 0; j < V; j++)
            cr_expect(d[(size_t)n * V + j] == 0.0f, "ignored row %d grad %d", n, j);
    }

    /* loss only (dlogits NULL) gives the same losses */
    float *loss2 = ffill(N, NAN);
    loco_xent_fwd_bwd(loss2, NULL, x, y, N, V, dscale);
    EXPECT_SAME_BITS("xent loss without dlogits", loss, loss2, (size_t)N);

    /* in place (dlogits == logits) equals out of place, bit for bit */
    float *buf = fcopy(x, NV);
    loco_xent_fwd_bwd(loss2, buf, buf, y, N, V, dscale);
    EXPECT_SAME_BITS("xent in-place loss", loss, loss2, (size_t)N);
    EXPECT_SAME_BITS("xent in-place dlogits", d, buf, NV);

    free(y); free(x); free(loss); free(d); free(dx); free(rloss); free(rd);
    free(loss2); free(buf);
}

Test(kernels, xent_small) { check_xent(51, 37, 3.0, 32); }
Test(kernels, xent_gpt2_vocab_large_logits) { check_xent(9, 50257, 30.0, 33); }

Test(kernels, xent_repeatable_bitwise)
{
    enum { N = 256, V = 1001 };
    uint64_t s = 34;
    int32_t y[N];
    for (int n = 0; n < N; n++)
        y[n] = (int32_t)(splitmix64(&s) % V);
    float *x = frand(&s, (size_t)N * V, 5.0);
    float *a = fcopy(x, (size_t)N * V), *b = fcopy(x, (size_t)N * V);
    float la[N], lb[N];
    loco_xent_fwd_bwd(la, a, a, y, N, V, 1.0f / N);
    loco_xent_fwd_bwd(lb, b, b, y, N, V, 1.0f / N);
    EXPECT_SAME_BITS("xent loss", la, lb, (size_t)N);
    EXPECT_SAME_BITS("xent dlogits", a, b, (size_t)N * V);
    free(x); free(a); free(b);
}
