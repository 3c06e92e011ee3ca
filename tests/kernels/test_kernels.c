/* kernels/cpu against plain double-precision references: encoder, layernorm,
 * matmul, GELU, residual, AdamW, sumsq/scale. Attention and cross-entropy
 * live in test_attention.c. Every reference is written out longhand here;
 * the ones whose derivatives are not trivial sums are themselves checked
 * against central finite differences. */
#include <criterion/criterion.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "tests/kernels/kernels_test.h"

/* expected accumulated gradient: g0 + k * G */
static double *acc_expect(const float *g0, const double *G, size_t n, int k)
{
    double *r = xmalloc(n * sizeof *r);
    for (size_t i = 0; i < n; i++)
        r[i] = g0[i] + k * G[i];
    return r;
}

/* Call a backward twice from the same start: the result must be g0 + G after
 * one call and g0 + 2G after two (gradients accumulate). */
#define EXPECT_ACCUM(what, buf, g0, G, n, k, tol)                            \
    do {                                                                     \
        double *r_ = acc_expect((g0), (G), (n), (k));                        \
        EXPECT_CLOSE(what, (buf), r_, (n), (tol));                           \
        free(r_);                                                            \
    } while (0)

/* ---- encoder ---- */

static void ref_encoder_fwd(double *out, const int32_t *tok, const double *wte,
                            const double *wpe, int B, int T, int C)
{
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++)
                out[((size_t)b * T + t) * C + c] =
                    wte[(size_t)tok[b * T + t] * C + c] + wpe[(size_t)t * C + c];
}

static void ref_encoder_bwd(double *dwte, double *dwpe, const double *dout,
                            const int32_t *tok, int B, int T, int C)
{
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++) {
                const double d = dout[((size_t)b * T + t) * C + c];
                dwte[(size_t)tok[b * T + t] * C + c] += d;
                dwpe[(size_t)t * C + c] += d;
            }
}

static void check_encoder(int B, int T, int C, int V, int maxT, uint64_t seed)
{
    uint64_t s = seed;
    const size_t N = (size_t)B * T;
    int32_t *tok = xmalloc(N * sizeof *tok);
    for (size_t i = 0; i < N; i++)
        tok[i] = (int32_t)(splitmix64(&s) % (uint64_t)V);
    tok[N - 1] = tok[0]; /* make sure some token repeats */
    float *wte = frand(&s, (size_t)V * C, 1.0), *wpe = frand(&s, (size_t)maxT * C, 1.0);
    float *out = frand(&s, N * C, 1.0);
    double *dwte_ = todouble(wte, (size_t)V * C), *dwpe_ = todouble(wpe, (size_t)maxT * C);
    double *rout = dzeros(N * C);

    loco_encoder_fwd(out, tok, wte, wpe, B, T, C);
    ref_encoder_fwd(rout, tok, dwte_, dwpe_, B, T, C);
    EXPECT_CLOSE("encoder fwd", out, rout, N * C, 1e-6);

    float *dout = frand(&s, N * C, 1.0);
    float *gte = frand(&s, (size_t)V * C, 1.0), *gpe = frand(&s, (size_t)maxT * C, 1.0);
    float *gte0 = fcopy(gte, (size_t)V * C), *gpe0 = fcopy(gpe, (size_t)maxT * C);
    double *ddout = todouble(dout, N * C);
    double *Gte = dzeros((size_t)V * C), *Gpe = dzeros((size_t)maxT * C);
    ref_encoder_bwd(Gte, Gpe, ddout, tok, B, T, C);
    for (int k = 1; k <= 2; k++) {
        loco_encoder_bwd(gte, gpe, dout, tok, B, T, C);
        EXPECT_ACCUM("encoder bwd dwte", gte, gte0, Gte, (size_t)V * C, k, 1e-6);
        EXPECT_ACCUM("encoder bwd dwpe", gpe, gpe0, Gpe, (size_t)maxT * C, k, 1e-6);
    }

    free(tok); free(wte); free(wpe); free(out); free(dwte_); free(dwpe_);
    free(rout); free(dout); free(gte); free(gpe); free(gte0); free(gpe0);
    free(ddout); free(Gte); free(Gpe);
}

Test(kernels, encoder_small) { check_encoder(3, 7, 20, 37, 9, 1); }
Test(kernels, encoder_multiblock) { check_encoder(3, 17, 130, 37, 17, 2); }

/* ---- layernorm ---- */

static void ref_layernorm_fwd(double *out, double *mean, double *rstd,
                              const double *x, const double *w, const double *b,
                              int N, int C)
{
    for (int n = 0; n < N; n++) {
        const double *xr = x + (size_t)n * C;
        double m = 0.0, v = 0.0;
        for (int c = 0; c < C; c++)
            m += xr[c];
        m /= C;
        for (int c = 0; c < C; c++)
            v += (xr[c] - m) * (xr[c] - m);
        v /= C;
        const double r = 1.0 / sqrt(v + 1e-5);
        for (int c = 0; c < C; c++)
            out[(size_t)n * C + c] = (xr[c] - m) * r * w[c] + b[c];
        mean[n] = m;
        rstd[n] = r;
    }
}

/* Plain gradients of the normalisation (no accumulation into the inputs). */
static void ref_layernorm_bwd(double *dx, double *dw, double *db,
                              const double *dout, const double *x,
                              const double *w, int N, int C)
{
    double *tmp = dzeros((size_t)C);
    for (int n = 0; n < N; n++) {
        const double *xr = x + (size_t)n * C, *d = dout + (size_t)n * C;
        double m = 0.0, v = 0.0;
        for (int c = 0; c < C; c++)
            m += xr[c];
        m /= C;
        for (int c = 0; c < C; c++)
            v += (xr[c] - m) * (xr[c] - m);
        v /= C;
        const double r = 1.0 / sqrt(v + 1e-5);
        double mg = 0.0, mgx = 0.0;
        for (int c = 0; c < C; c++) {
            const double xh = (xr[c] - m) * r;
            tmp[c] = d[c] * w[c];
            mg += tmp[c];
            mgx += tmp[c] * xh;
            dw[c] += d[c] * xh;
            db[c] += d[c];
        }
        mg /= C;
        mgx /= C;
        for (int c = 0; c < C; c++) {
            const double xh = (xr[c] - m) * r;
            dx[(size_t)n * C + c] = r * (tmp[c] - mg - xh * mgx);
        }
    }
    free(tmp);
}

static void check_layernorm(int N, int C, uint64_t seed)
{
    uint64_t s = seed;
    const size_t NC = (size_t)N * C;
    float *x = frand(&s, NC, 2.0), *w = frand(&s, C, 1.0), *b = frand(&s, C, 1.0);
    for (size_t i = 0; i < NC; i++) /* non-zero mean per row */
        x[i] += (float)(i / C % 5);
    float *out = xmalloc(NC * sizeof *out), *mean = xmalloc(N * sizeof *mean),
          *rstd = xmalloc(N * sizeof *rstd);
    double *dx = todouble(x, NC), *dw_ = todouble(w, C), *db_ = todouble(b, C);
    double *rout = dzeros(NC), *rmean = dzeros(N), *rrstd = dzeros(N);

    loco_layernorm_fwd(out, mean, rstd, x, w, b, N, C);
    ref_layernorm_fwd(rout, rmean, rrstd, dx, dw_, db_, N, C);
    EXPECT_CLOSE("layernorm out", out, rout, NC, 1e-5);
    EXPECT_CLOSE("layernorm mean", mean, rmean, N, 1e-5);
    EXPECT_CLOSE("layernorm rstd", rstd, rrstd, N, 1e-5);

    float *dout = frand(&s, NC, 1.0);
    float *gx = frand(&s, NC, 1.0), *gw = frand(&s, C, 1.0), *gb = frand(&s, C, 1.0);
    float *gx0 = fcopy(gx, NC), *gw0 = fcopy(gw, C), *gb0 = fcopy(gb, C);
    double *ddout = todouble(dout, NC);
    double *Gx = dzeros(NC), *Gw = dzeros(C), *Gb = dzeros(C);
    ref_layernorm_bwd(Gx, Gw, Gb, ddout, dx, dw_, N, C);
    for (int k = 1; k <= 2; k++) {
        loco_layernorm_bwd(gx, gw, gb, dout, x, w, mean, rstd, N, C);
        EXPECT_ACCUM("layernorm dinp", gx, gx0, Gx, NC, k, 1e-5);
        EXPECT_ACCUM("layernorm dw", gw, gw0, Gw, C, k, 1e-5);
        EXPECT_ACCUM("layernorm db", gb, gb0, Gb, C, k, 1e-5);
    }

    free(x); free(w); free(b); free(out); free(mean); free(rstd);
    free(dx); free(dw_); free(db_); free(rout); free(rmean); free(rrstd);
    free(dout); free(gx); free(gw); free(gb); free(gx0); free(gw0); free(gb0);
    free(ddout); free(Gx); free(Gw); free(Gb);
}

Test(kernels, layernorm_small) { check_layernorm(51, 36, 3); }
Test(kernels, layernorm_multiblock) { check_layernorm(17, 130, 4); }

/* The double reference backward against central differences of
 * L = sum(dout * layernorm(x; w, b)). */
Test(kernels, layernorm_reference_vs_finite_differences)
{
    enum { N = 3, C = 7 };
    uint64_t s = 5;
    double x[N * C], w[C], b[C], dout[N * C], out[N * C], mean[N], rstd[N];
    for (int i = 0; i < N * C; i++) {
        x[i] = urand(&s) + (i / C);
        dout[i] = urand(&s);
    }
    for (int c = 0; c < C; c++) {
        w[c] = urand(&s);
        b[c] = urand(&s);
    }
    double gx[N * C], gw[C] = {0}, gb[C] = {0};
    ref_layernorm_bwd(gx, gw, gb, dout, x, w, N, C);

    const double h = 1e-6;
    double *params[3] = {x, w, b}, *grads[3] = {gx, gw, gb};
    const int sizes[3] = {N * C, C, C};
    for (int p = 0; p < 3; p++) {
        double fd[N * C];
        for (int i = 0; i < sizes[p]; i++) {
            const double keep = params[p][i];
            double L[2];
            for (int sgn = 0; sgn < 2; sgn++) {
                params[p][i] = keep + (sgn ? -h : h);
                ref_layernorm_fwd(out, mean, rstd, x, w, b, N, C);
                L[sgn] = 0.0;
                for (int j = 0; j < N * C; j++)
                    L[sgn] += dout[j] * out[j];
            }
            params[p][i] = keep;
            fd[i] = (L[0] - L[1]) / (2 * h);
        }
        const double e = relerr_dd(grads[p], fd, sizes[p]);
        cr_expect_leq(e, 1e-7, "layernorm ref grad %d vs FD: %.3g", p, e);
    }
}

/* ---- matmul ---- */

/* Element W[c][o] of the logical (C,OC) weight. */
static double wat(const double *w, int c, int o, int C, int OC, bool tr)
{
    return tr ? w[(size_t)o * C + c] : w[(size_t)c * OC + o];
}

static void ref_matmul_fwd(double *out, const double *x, const double *w,
                           const double *bias, int N, int C, int OC, bool tr)
{
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double acc = bias ? bias[o] : 0.0;
            for (int c = 0; c < C; c++)
                acc += x[(size_t)n * C + c] * wat(w, c, o, C, OC, tr);
            out[(size_t)n * OC + o] = acc;
        }
}

static void ref_matmul_bwd(double *dx, double *dw, double *db,
                           const double *dout, const double *x, const double *w,
                           int N, int C, int OC, bool tr)
{
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            const double d = dout[(size_t)n * OC + o];
            db[o] += d;
            for (int c = 0; c < C; c++) {
                dx[(size_t)n * C + c] += d * wat(w, c, o, C, OC, tr);
                dw[tr ? (size_t)o * C + c : (size_t)c * OC + o] +=
                    d * x[(size_t)n * C + c];
            }
        }
}

static void check_matmul(int N, int C, int OC, bool tr, bool use_bias,
                         uint64_t seed)
{
    uint64_t s = seed;
    const size_t NC = (size_t)N * C, NO = (size_t)N * OC, W = (size_t)C * OC;
    float *x = frand(&s, NC, 1.0), *w = frand(&s, W, 1.0), *bias = frand(&s, OC, 1.0);
    float *out = frand(&s, NO, 1.0); /* garbage: must be overwritten */
    double *dx = todouble(x, NC), *dw_ = todouble(w, W), *dbias = todouble(bias, OC);
    double *rout = dzeros(NO);

    loco_matmul_fwd(out, x, w, use_bias ? bias : NULL, N, C, OC, tr);
    ref_matmul_fwd(rout, dx, dw_, use_bias ? dbias : NULL, N, C, OC, tr);
    EXPECT_CLOSE("matmul fwd", out, rout, NO, 1e-5);

    float *dout = frand(&s, NO, 1.0);
    float *gx = frand(&s, NC, 1.0), *gw = frand(&s, W, 1.0), *gb = frand(&s, OC, 1.0);
    float *gx0 = fcopy(gx, NC), *gw0 = fcopy(gw, W), *gb0 = fcopy(gb, OC);
    double *ddout = todouble(dout, NO);
    double *Gx = dzeros(NC), *Gw = dzeros(W), *Gb = dzeros(OC);
    ref_matmul_bwd(Gx, Gw, Gb, ddout, dx, dw_, N, C, OC, tr);
    for (int k = 1; k <= 2; k++) {
        loco_matmul_bwd(gx, gw, gb, dout, x, w, N, C, OC, tr);
        EXPECT_ACCUM("matmul dinp", gx, gx0, Gx, NC, k, 1e-5);
        EXPECT_ACCUM("matmul dw", gw, gw0, Gw, W, k, 1e-5);
        EXPECT_ACCUM("matmul dbias", gb, gb0, Gb, OC, k, 1e-5);
    }

    /* NULL outputs are skipped and the others still accumulate. */
    memcpy(gx, gx0, NC * sizeof *gx);
    memcpy(gw, gw0, W * sizeof *gw);
    memcpy(gb, gb0, OC * sizeof *gb);
    loco_matmul_bwd(NULL, gw, NULL, dout, x, w, N, C, OC, tr);
    loco_matmul_bwd(gx, NULL, gb, dout, x, w, N, C, OC, tr);
    EXPECT_ACCUM("matmul dinp (split)", gx, gx0, Gx, NC, 1, 1e-5);
    EXPECT_ACCUM("matmul dw (split)", gw, gw0, Gw, W, 1, 1e-5);
    EXPECT_ACCUM("matmul dbias (split)", gb, gb0, Gb, OC, 1, 1e-5);

    free(x); free(w); free(bias); free(out); free(dx); free(dw_); free(dbias);
    free(rout); free(dout); free(gx); free(gw); free(gb); free(gx0); free(gw0);
    free(gb0); free(ddout); free(Gx); free(Gw); free(Gb);
}

Test(kernels, matmul_bias) { check_matmul(51, 36, 37, false, true, 6); }
Test(kernels, matmul_nobias) { check_matmul(17, 20, 300, false, false, 7); }
Test(kernels, matmul_transposed_weight) { check_matmul(51, 36, 37, true, false, 8); }
Test(kernels, matmul_transposed_bias) { check_matmul(7, 20, 37, true, true, 9); }

/* ---- GELU ---- */

static double ref_gelu(double x)
{
    const double k = sqrt(2.0 / M_PI);
    return 0.5 * x * (1.0 + tanh(k * (x + 0.044715 * x * x * x)));
}

static double ref_gelu_grad(double x)
{
    const double k = sqrt(2.0 / M_PI);
    const double th = tanh(k * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 + th)
           + 0.5 * x * (1.0 - th * th) * k * (1.0 + 3.0 * 0.044715 * x * x);
}

Test(kernels, gelu_reference_vs_finite_differences)
{
    const double h = 1e-5;
    for (double x = -6.0; x <= 6.0; x += 0.37) {
        const double fd = (ref_gelu(x + h) - ref_gelu(x - h)) / (2 * h);
        cr_expect_leq(fabs(fd - ref_gelu_grad(x)), 1e-8, "gelu'(%g)", x);
    }
}

Test(kernels, gelu)
{
    const size_t n = 1000003;
    uint64_t s = 10;
    float *x = frand(&s, n, 5.0), *out = frand(&s, n, 1.0);
    double *r = xmalloc(n * sizeof *r);
    loco_gelu_fwd(out, x, n);
    for (size_t i = 0; i < n; i++)
        r[i] = ref_gelu(x[i]);
    EXPECT_CLOSE("gelu fwd", out, r, n, 1e-6);

    float *dout = frand(&s, n, 1.0), *g = frand(&s, n, 1.0), *g0 = fcopy(g, n);
    for (size_t i = 0; i < n; i++)
        r[i] = dout[i] * ref_gelu_grad(x[i]);
    for (int k = 1; k <= 2; k++) {
        loco_gelu_bwd(g, x, dout, n);
        EXPECT_ACCUM("gelu bwd", g, g0, r, n, k, 5e-6);
    }
    free(x); free(out); free(r); free(dout); free(g); free(g0);
}

/* Saturated tails and the origin, element by element. */
Test(kernels, gelu_extremes)
{
    const float x[] = {-100.0f, -20.0f, -9.0f, -1e-8f, 0.0f, 1e-8f, 9.0f, 20.0f, 100.0f};
    enum { n = sizeof x / sizeof *x };
    float out[n], g[n] = {0}, one[n];
    for (int i = 0; i < n; i++)
        one[i] = 1.0f;
    loco_gelu_fwd(out, x, n);
    loco_gelu_bwd(g, x, one, n);
    for (int i = 0; i < n; i++) {
        const double r = ref_gelu(x[i]), rg = ref_gelu_grad(x[i]);
        cr_expect_leq(fabs(out[i] - r), 1e-6 * fmax(1.0, fabs(r)), "gelu(%g) = %g, want %g",
                      (double)x[i], (double)out[i], r);
        cr_expect_leq(fabs(g[i] - rg), 1e-6, "gelu'(%g) = %g, want %g", (double)x[i],
                      (double)g[i], rg);
    }
}

/* ---- residual ---- */

Test(kernels, residual)
{
    const size_t n = 1000003;
    uint64_t s = 11;
    float *a = frand(&s, n, 1.0), *b = frand(&s, n, 1.0), *out = frand(&s, n, 1.0);
    double *r = xmalloc(n * sizeof *r);
    for (size_t i = 0; i < n; i++)
        r[i] = (double)a[i] + b[i];
    loco_residual_fwd(out, a, b, n);
    EXPECT_CLOSE("residual fwd", out, r, n, 1e-7);
    loco_residual_fwd(a, a, b, n); /* in place, as the model does */
    cr_expect_eq(memcmp(a, out, n * sizeof *a), 0, "residual in place differs");

    float *dout = frand(&s, n, 1.0), *da = frand(&s, n, 1.0), *db = frand(&s, n, 1.0);
    float *da0 = fcopy(da, n), *db0 = fcopy(db, n);
    double *G = todouble(dout, n);
    for (int k = 1; k <= 2; k++) {
        loco_residual_bwd(da, db, dout, n);
        EXPECT_ACCUM("residual da", da, da0, G, n, k, 1e-6);
        EXPECT_ACCUM("residual db", db, db0, G, n, k, 1e-6);
    }
    free(a); free(b); free(out); free(r); free(dout); free(da); free(db);
    free(da0); free(db0); free(G);
}

/* ---- AdamW ---- */

static void check_adamw(float wd, uint64_t seed)
{
    const size_t n = 1003;
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f;
    uint64_t s = seed;
    float *p = frand(&s, n, 1.0), *m = xmalloc(n * sizeof *m), *v = xmalloc(n * sizeof *v);
    memset(m, 0, n * sizeof *m);
    memset(v, 0, n * sizeof *v);
    double *rp = todouble(p, n), *rm = dzeros(n), *rv = dzeros(n);
    for (int64_t t = 1; t <= 6; t++) {
        float *g = frand(&s, n, 0.1 * t);
        loco_adamw_update(p, g, m, v, n, lr, b1, b2, eps, wd, t);
        const double bc1 = 1.0 - pow(b1, (double)t), bc2 = 1.0 - pow(b2, (double)t);
        for (size_t i = 0; i < n; i++) {
            rm[i] = b1 * rm[i] + (1.0 - b1) * g[i];
            rv[i] = b2 * rv[i] + (1.0 - b2) * (double)g[i] * g[i];
            rp[i] -= lr * ((rm[i] / bc1) / (sqrt(rv[i] / bc2) + eps) + wd * rp[i]);
        }
        EXPECT_CLOSE("adamw p", p, rp, n, 1e-5);
        EXPECT_CLOSE("adamw m", m, rm, n, 1e-5);
        EXPECT_CLOSE("adamw v", v, rv, n, 1e-5);
        free(g);
    }
    free(p); free(m); free(v); free(rp); free(rm); free(rv);
}

Test(kernels, adamw_no_weight_decay) { check_adamw(0.0f, 12); }
Test(kernels, adamw_weight_decay) { check_adamw(0.1f, 13); }

/* ---- sumsq / scale ---- */

Test(kernels, sumsq_and_scale)
{
    uint64_t s = 14;
    const size_t sizes[] = {0, 1, 255, 257, 1000003};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        const size_t n = sizes[k];
        float *x = frand(&s, n, 3.0);
        double r = 0.0;
        for (size_t i = 0; i < n; i++)
            r += (double)x[i] * x[i];
        const double got = loco_sumsq(x, n);
        cr_expect_leq(fabs(got - r), 1e-12 * r, "sumsq n=%zu: %.17g vs %.17g", n, got, r);

        double *rs = xmalloc((n ? n : 1) * sizeof *rs);
        for (size_t i = 0; i < n; i++)
            rs[i] = (double)x[i] * 0.37f;
        loco_scale(x, 0.37f, n);
        EXPECT_CLOSE("scale", x, rs, n, 1e-7);
        free(x); free(rs);
    }
}

/* ---- determinism: threaded kernels, same inputs, same bits ---- */

Test(kernels, sumsq_independent_of_thread_count)
{
    const size_t n = 3000017;
    uint64_t s = 15;
    float *x = frand(&s, n, 1.0);
    const int nt = omp_get_max_threads();
    omp_set_num_threads(1);
    const double a = loco_sumsq(x, n);
    omp_set_num_threads(nt > 1 ? nt : 2);
    const double b = loco_sumsq(x, n), c = loco_sumsq(x, n);
    omp_set_num_threads(nt);
    cr_expect(memcmp(&a, &b, sizeof a) == 0 && memcmp(&b, &c, sizeof b) == 0,
              "sumsq differs: %.17g %.17g %.17g", a, b, c);
    free(x);
}

Test(kernels, repeatable_bitwise)
{
    enum { B = 4, T = 64, C = 192, V = 301, OC = 576 };
    const size_t N = (size_t)B * T, NC = N * C;
    uint64_t s = 16;
    int32_t tok[B * T];
    for (size_t i = 0; i < N; i++)
        tok[i] = (int32_t)(splitmix64(&s) % V);
    float *x = frand(&s, NC, 1.0), *w = frand(&s, C, 1.0), *b = frand(&s, C, 1.0);
    float *dout = frand(&s, NC, 1.0), *wte = frand(&s, (size_t)V * C, 1.0);
    float *W = frand(&s, (size_t)C * OC, 1.0), *dO = frand(&s, N * OC, 1.0);
    float *r[2][8];
    for (int k = 0; k < 2; k++) {
        float *gte = xmalloc((size_t)V * C * sizeof(float));
        float *gpe = xmalloc(T * C * sizeof(float));
        memset(gte, 0, (size_t)V * C * sizeof(float));
        memset(gpe, 0, T * C * sizeof(float));
        loco_encoder_bwd(gte, gpe, dout, tok, B, T, C);
        float *out = xmalloc(NC * sizeof(float)), *mean = xmalloc(N * sizeof(float)),
              *rstd = xmalloc(N * sizeof(float));
        loco_layernorm_fwd(out, mean, rstd, x, w, b, (int)N, C);
        float *gx = fcopy(dout, NC), *gw = fcopy(w, C), *gb = fcopy(b, C);
        loco_layernorm_bwd(gx, gw, gb, dout, x, w, mean, rstd, (int)N, C);
        float *gW = fcopy(W, (size_t)C * OC), *gbias = fcopy(dO, OC);
        loco_matmul_bwd(gx, gW, gbias, dO, x, W, (int)N, C, OC, false);
        float *r_k[8] = {gte, gpe, out, gx, gw, gb, gW, gbias};
        memcpy(r[k], r_k, sizeof r_k);
        free(mean); free(rstd);
    }
    EXPECT_SAME_BITS("encoder dwte", r[0][0], r[1][0], (size_t)V * C);
    EXPECT_SAME_BITS("encoder dwpe", r[0][1], r[1][1], (size_t)T * C);
    EXPECT_SAME_BITS("layernorm out", r[0][2], r[1][2], NC);
    EXPECT_SAME_BITS("layernorm+matmul dinp", r[0][3], r[1][3], NC);
    EXPECT_SAME_BITS("layernorm dw", r[0][4], r[1][4], (size_t)C);
    EXPECT_SAME_BITS("layernorm db", r[0][5], r[1][5], (size_t)C);
    EXPECT_SAME_BITS("matmul dw", r[0][6], r[1][6], (size_t)C * OC);
    EXPECT_SAME_BITS("matmul dbias", r[0][7], r[1][7], (size_t)OC);
    for (int k = 0; k < 2; k++)
        for (int j = 0; j < 8; j++)
            free(r[k][j]);

    /* elementwise kernels, threaded at this size */
    const size_t n = 300007;
    float *xe = frand(&s, n, 4.0), *ge = frand(&s, n, 0.1);
    float *e[2][4];
    for (int k = 0; k < 2; k++) {
        float *y = xmalloc(n * sizeof(float)), *gx = fcopy(ge, n);
        float *p = fcopy(xe, n), *m = fcopy(ge, n), *v = fcopy(ge, n);
        loco_gelu_fwd(y, xe, n);
        loco_gelu_bwd(gx, xe, ge, n);
        for (size_t i = 0; i < n; i++)
            v[i] *= v[i];
        loco_adamw_update(p, ge, m, v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3);
        float *e_k[4] = {y, gx, p, m};
        memcpy(e[k], e_k, sizeof e_k);
        free(v);
    }
    EXPECT_SAME_BITS("gelu fwd", e[0][0], e[1][0], n);
    EXPECT_SAME_BITS("gelu bwd", e[0][1], e[1][1], n);
    EXPECT_SAME_BITS("adamw p", e[0][2], e[1][2], n);
    EXPECT_SAME_BITS("adamw m", e[0][3], e[1][3], n);
    for (int k = 0; k < 2; k++)
        for (int j = 0; j < 4; j++)
            free(e[k][j]);
    free(xe); free(ge);
    free(x); free(w); free(b); free(dout); free(wte); free(W); free(dO);
}
