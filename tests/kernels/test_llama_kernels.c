/* The Llama-family kernels of kernels/cpu (rmsnorm.c, rope.c, swiglu.c)
 * against plain double-precision references written out here; the
 * references' gradients against central finite differences; RoPE's tables
 * (with Llama 3.1's scaling) against Hugging Face's formula computed by hand
 * in double; the results' bits against the thread count. */
#include <criterion/criterion.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "kernels/kernels.h"
#include "tests/kernels/kernels_test.h"

/* g0 + k * G: a gradient buffer that started at g0 after k accumulations of G */
static void expect_accum(const char *what, const float *buf, const float *g0, const double *G,
                         size_t n, int k, double tol)
{
    double *r = xmalloc(n * sizeof *r);
    for (size_t i = 0; i < n; i++)
        r[i] = g0[i] + k * G[i];
    EXPECT_CLOSE(what, buf, r, n, tol);
    free(r);
}

/* ------------------------------------------------------------------ RMSNorm */

static void ref_rmsnorm_fwd(double *out, double *rstd, const double *x, const double *w, int N,
                            int C, double eps)
{
    for (int n = 0; n < N; n++) {
        const double *xr = x + (size_t)n * C;
        double ss = 0.0;
        for (int c = 0; c < C; c++)
            ss += xr[c] * xr[c];
        const double r = 1.0 / sqrt(ss / C + eps);
        for (int c = 0; c < C; c++)
            out[(size_t)n * C + c] = xr[c] * r * w[c];
        rstd[n] = r;
    }
}

/* Plain gradients (dx overwritten, dw summed into). */
static void ref_rmsnorm_bwd(double *dx, double *dw, const double *dout, const double *x,
                            const double *w, int N, int C, double eps)
{
    for (int n = 0; n < N; n++) {
        const double *xr = x + (size_t)n * C, *d = dout + (size_t)n * C;
        double ss = 0.0, sgx = 0.0;
        for (int c = 0; c < C; c++)
            ss += xr[c] * xr[c];
        const double r = 1.0 / sqrt(ss / C + eps);
        for (int c = 0; c < C; c++) {
            sgx += d[c] * w[c] * xr[c] * r;
            dw[c] += d[c] * xr[c] * r;
        }
        sgx /= C;
        for (int c = 0; c < C; c++)
            dx[(size_t)n * C + c] = r * (d[c] * w[c] - xr[c] * r * sgx);
    }
}

static void check_rmsnorm(int N, int C, float eps, uint64_t seed)
{
    uint64_t s = seed;
    const size_t NC = (size_t)N * C;
    float *x = frand(&s, NC, 2.0), *w = frand(&s, C, 1.0);
    for (size_t i = 0; i < NC; i++) /* rows of different scales */
        x[i] *= (float)(1 + i / C % 4);
    float *out = xmalloc(NC * sizeof *out), *rstd = xmalloc(N * sizeof *rstd);
    double *dx = todouble(x, NC), *dw = todouble(w, C);
    double *rout = dzeros(NC), *rrstd = dzeros(N);
    loco_rmsnorm_fwd(out, rstd, x, w, N, C, eps);
    ref_rmsnorm_fwd(rout, rrstd, dx, dw, N, C, eps);
    EXPECT_CLOSE("rmsnorm out", out, rout, NC, 1e-5);
    EXPECT_CLOSE("rmsnorm rstd", rstd, rrstd, N, 1e-5);

    float *dout = frand(&s, NC, 1.0), *gx = frand(&s, NC, 1.0), *gw = frand(&s, C, 1.0);
    float *gx0 = fcopy(gx, NC), *gw0 = fcopy(gw, C);
    double *ddout = todouble(dout, NC), *Gx = dzeros(NC), *Gw = dzeros(C);
    ref_rmsnorm_bwd(Gx, Gw, ddout, dx, dw, N, C, eps);
    for (int k = 1; k <= 2; k++) {
        loco_rmsnorm_bwd(gx, gw, dout, x, w, rstd, N, C);
        expect_accum("rmsnorm dinp", gx, gx0, Gx, NC, k, 1e-5);
        expect_accum("rmsnorm dw", gw, gw0, Gw, C, k, 1e-5);
    }
    free(x), free(w), free(out), free(rstd), free(dx), free(dw), free(rout), free(rrstd);
    free(dout), free(gx), free(gw), free(gx0), free(gw0), free(ddout), free(Gx), free(Gw);
}

Test(llama_kernels, rmsnorm_small) { check_rmsnorm(51, 36, 1e-5f, 1); }
Test(llama_kernels, rmsnorm_multiblock) { check_rmsnorm(17, 130, 1e-6f, 2); }
/* eps matters where the mean square is tiny */
Test(llama_kernels, rmsnorm_large_eps) { check_rmsnorm(9, 20, 0.5f, 3); }

/* The double reference backward against central differences of
 * L = sum(dout * rmsnorm(x; w)). */
Test(llama_kernels, rmsnorm_reference_vs_finite_differences)
{
    enum { N = 3, C = 7 };
    const double eps = 1e-2;
    uint64_t s = 4;
    double x[N * C], w[C], dout[N * C], out[N * C], rstd[N];
    for (int i = 0; i < N * C; i++) {
        x[i] = urand(&s) * (1 + i / C);
        dout[i] = urand(&s);
    }
    for (int c = 0; c < C; c++)
        w[c] = urand(&s);
    double gx[N * C], gw[C] = {0};
    ref_rmsnorm_bwd(gx, gw, dout, x, w, N, C, eps);
    const double h = 1e-6;
    double *params[2] = {x, w}, *grads[2] = {gx, gw};
    const int sizes[2] = {N * C, C};
    for (int p = 0; p < 2; p++) {
        double fd[N * C];
        for (int i = 0; i < sizes[p]; i++) {
            const double keep = params[p][i];
            double L[2];
            for (int sgn = 0; sgn < 2; sgn++) {
                params[p][i] = keep + (sgn ? -h : h);
                ref_rmsnorm_fwd(out, rstd, x, w, N, C, eps);
                L[sgn] = 0.0;
                for (int j = 0; j < N * C; j++)
                    L[sgn] += dout[j] * out[j];
            }
            params[p][i] = keep;
            fd[i] = (L[0] - L[1]) / (2 * h);
        }
        const double e = relerr_dd(grads[p], fd, sizes[p]);
        cr_expect_leq(e, 1e-7, "rmsnorm ref grad %d vs FD: %.3g", p, e);
    }
}

/* --------------------------------------------------------------------- RoPE */

/* HF's inv_freq in double: 1 / theta^(2i/hs), then _compute_llama3_parameters. */
static double ref_inv_freq(int i, int hs, double theta, const loco_rope_scaling *sc)
{
    const double inv = 1.0 / pow(theta, 2.0 * i / hs);
    if (!sc || sc->factor <= 0)
        return inv;
    const double orig = sc->original_max_pos, lo = sc->low_freq_factor,
                 hi = sc->high_freq_factor, f = sc->factor;
    const double wavelen = 2 * M_PI / inv;
    if (wavelen < orig / hi)
        return inv;
    if (wavelen > orig / lo)
        return inv / f;
    const double smooth = (orig / wavelen - lo) / (hi - lo);
    return (1 - smooth) * inv / f + smooth * inv;
}

/* Llama 3.1 8B's rope_scaling and geometry. */
static const loco_rope_scaling llama31 = {.factor = 8.0f,
                                          .low_freq_factor = 1.0f,
                                          .high_freq_factor = 4.0f,
                                          .original_max_pos = 8192};

Test(llama_kernels, rope_inv_freq_llama31_scaling)
{
    enum { HS = 128 };
    const float theta = 500000.0f;
    /* Values worked out by hand (Python, double) from HF's formula: wavelen
     * 2 pi / inv against 8192 / 4 and 8192 / 1. i = 0: wavelen 2 pi, kept;
     * i = 32: inv = 500000^-0.5, wavelen 4442.88, smooth 0.2812826;
     * i = 63: wavelen far above 8192, inv / 8. */
    cr_expect_eq(loco_rope_inv_freq(0, HS, theta, &llama31), 1.0f);
    const double want32 = 0.0005248461609929547;
    cr_expect_leq(fabs(loco_rope_inv_freq(32, HS, theta, &llama31) - want32) / want32, 1e-6,
                  "inv_freq[32] = %.9g, want %.9g", loco_rope_inv_freq(32, HS, theta, &llama31),
                  want32);
    const double want63 = pow(500000.0, -126.0 / 128.0) / 8.0;
    cr_expect_leq(fabs(loco_rope_inv_freq(63, HS, theta, &llama31) - want63) / want63, 1e-6);
    /* every entry: high frequencies (i <= 28) kept, low ones (i >= 35) divided
     * by the factor, the six between smoothed */
    for (int i = 0; i < HS / 2; i++) {
        const double want = ref_inv_freq(i, HS, theta, &llama31);
        const float got = loco_rope_inv_freq(i, HS, theta, &llama31);
        cr_expect_leq(fabs(got - want) / want, 2e-6, "inv_freq[%d] = %.9g, want %.9g", i, got,
                      want);
        const float plain = loco_rope_inv_freq(i, HS, theta, NULL);
        if (i <= 28)
            cr_expect_eq(got, plain, "inv_freq[%d] scaled in the high band", i);
        else if (i >= 35)
            cr_expect_eq(got, plain / 8.0f, "inv_freq[%d] not divided by the factor", i);
        else
            cr_expect(got < plain && got > plain / 8.0f, "inv_freq[%d] not smoothed", i);
    }
    /* factor 0 is no scaling */
    const loco_rope_scaling none = {0};
    for (int i = 0; i < HS / 2; i++)
        cr_expect_eq(loco_rope_inv_freq(i, HS, theta, &none),
                     loco_rope_inv_freq(i, HS, theta, NULL));
}

static void check_tables(int max_pos, int hs, float theta, const loco_rope_scaling *sc)
{
    const int h = hs / 2;
    float *ct = xmalloc((size_t)max_pos * h * sizeof *ct);
    float *st = xmalloc((size_t)max_pos * h * sizeof *st);
    loco_rope_tables(ct, st, max_pos, hs, theta, sc);
    double num = 0.0, num32 = 0.0;
    for (int p = 0; p < max_pos; p++)
        for (int i = 0; i < h; i++) {
            const size_t k = (size_t)p * h + i;
            /* by hand, in double */
            const double a = p * ref_inv_freq(i, hs, theta, sc);
            num = fmax(num, fmax(fabs(ct[k] - cos(a)), fabs(st[k] - sin(a))));
            /* HF's fp32 recipe: the angle is one fp32 product */
            const double a32 = (double)((float)p * loco_rope_inv_freq(i, hs, theta, sc));
            num32 = fmax(num32, fmax(fabs(ct[k] - cos(a32)), fabs(st[k] - sin(a32))));
        }
    /* the fp32 angle is off by up to max_pos * 2^-24 */
    cr_expect_leq(num, 1e-7 + max_pos * 1.2e-7, "rope tables vs double: %.3g", num);
    cr_expect_leq(num32, 2e-7, "rope tables vs cosf/sinf of the fp32 angle: %.3g", num32);
    free(ct), free(st);
}

Test(llama_kernels, rope_tables_plain) { check_tables(67, 16, 10000.0f, NULL); }
Test(llama_kernels, rope_tables_llama31) { check_tables(40, 128, 500000.0f, &llama31); }

/* out = rope(x) in double: each head's pairs rotated by angle dir * p inv_freq */
static void ref_rope(double *out, const double *x, int ld, int B, int T, int n_heads, int hs,
                     const int *pos, const float *ct, const float *st, int dir)
{
    const int h = hs / 2;
    memcpy(out, x, (size_t)B * T * ld * sizeof *out);
    for (int r = 0; r < B * T; r++) {
        const int t = r % T, p = pos ? pos[t] : t;
        for (int hd = 0; hd < n_heads; hd++)
            for (int i = 0; i < h; i++) {
                const double c = ct[p * h + i], s = dir * (double)st[p * h + i];
                const size_t j = (size_t)r * ld + (size_t)hd * hs + i;
                out[j] = x[j] * c - x[j + h] * s;
                out[j + h] = x[j + h] * c + x[j] * s;
            }
    }
}

static void check_rope(int B, int T, int n_heads, int hs, int ld, bool use_pos, uint64_t seed)
{
    uint64_t s = seed;
    const int max_pos = 3 * T + 5, h = hs / 2;
    float *ct = xmalloc((size_t)max_pos * h * sizeof *ct);
    float *st = xmalloc((size_t)max_pos * h * sizeof *st);
    loco_rope_tables(ct, st, max_pos, hs, 10000.0f, NULL);
    int *pos = NULL;
    if (use_pos) { /* zig-zag-like global positions, not t */
        pos = xmalloc(T * sizeof *pos);
        for (int t = 0; t < T; t++)
            pos[t] = t < T / 2 ? 2 * T + 3 + t : t - T / 2;
    }
    const size_t n = (size_t)B * T * ld;
    float *x = frand(&s, n, 2.0), *x0 = fcopy(x, n);
    double *dx = todouble(x, n), *r = dzeros(n);

    loco_rope_fwd(x, ld, B, T, n_heads, hs, pos, ct, st);
    ref_rope(r, dx, ld, B, T, n_heads, hs, pos, ct, st, 1);
    EXPECT_CLOSE("rope fwd", x, r, n, 1e-6);
    /* what lies beyond the heads in a row (ld > n_heads hs) is not touched */
    for (size_t row = 0; row < (size_t)B * T; row++)
        for (int c = n_heads * hs; c < ld; c++)
            cr_expect_eq(memcmp(&x[row * ld + c], &x0[row * ld + c], sizeof *x), 0,
                         "rope wrote row %zu col %d outside its heads", row, c);
    /* the backward of the forward is the identity (a rotation's transpose
     * is its inverse) */
    loco_rope_bwd(x, ld, B, T, n_heads, hs, pos, ct, st);
    EXPECT_CLOSE("rope bwd(fwd(x))", x, dx, n, 2e-6);
    /* the backward against its own reference, and as the forward's adjoint:
     * <rope(x), d> = <x, rope_bwd(d)> */
    float *d = frand(&s, n, 1.0);
    double *dd = todouble(d, n), *rd = dzeros(n), *fx = dzeros(n);
    loco_rope_bwd(d, ld, B, T, n_heads, hs, pos, ct, st);
    ref_rope(rd, dd, ld, B, T, n_heads, hs, pos, ct, st, -1);
    EXPECT_CLOSE("rope bwd", d, rd, n, 1e-6);
    ref_rope(fx, dx, ld, B, T, n_heads, hs, pos, ct, st, 1);
    double lhs = 0.0, rhs = 0.0, mag = 0.0;
    for (size_t i = 0; i < n; i++) {
        lhs += fx[i] * dd[i];
        rhs += dx[i] * d[i];
        mag += fabs(fx[i] * dd[i]);
    }
    cr_expect_leq(fabs(lhs - rhs), 1e-6 * mag, "rope adjoint: %.9g vs %.9g", lhs, rhs);
    free(ct), free(st), free(pos), free(x), free(x0), free(dx), free(r), free(d), free(dd);
    free(rd), free(fx);
}

Test(llama_kernels, rope_packed) { check_rope(2, 9, 3, 8, 24, false, 5); }
/* a q block inside a GQA qkv row: heads of 6, row stride past them */
Test(llama_kernels, rope_strided_rows) { check_rope(3, 7, 2, 6, 29, false, 6); }
Test(llama_kernels, rope_positions) { check_rope(2, 10, 4, 16, 70, true, 7); }

/* pos[t] = t is the same as no pos, bit for bit */
Test(llama_kernels, rope_identity_positions)
{
    enum { B = 2, T = 5, NH = 2, HS = 4, LD = 8, MAXP = 5 };
    float ct[MAXP * HS / 2], st[MAXP * HS / 2];
    loco_rope_tables(ct, st, MAXP, HS, 10000.0f, NULL);
    const int pos[T] = {0, 1, 2, 3, 4};
    uint64_t s = 8;
    float *a = frand(&s, B * T * LD, 1.0), *b = fcopy(a, B * T * LD);
    loco_rope_fwd(a, LD, B, T, NH, HS, NULL, ct, st);
    loco_rope_fwd(b, LD, B, T, NH, HS, pos, ct, st);
    EXPECT_SAME_BITS("rope pos = t vs NULL", a, b, (size_t)B * T * LD);
    free(a), free(b);
}

/* ------------------------------------------------------------------- SwiGLU */

static double ref_silu(double g) { return g / (1.0 + exp(-g)); }

static void ref_swiglu_fwd(double *out, const double *gu, int N, int F)
{
    for (int n = 0; n < N; n++)
        for (int i = 0; i < F; i++)
            out[(size_t)n * F + i] =
                ref_silu(gu[(size_t)n * 2 * F + i]) * gu[(size_t)n * 2 * F + F + i];
}

static void ref_swiglu_bwd(double *dgu, const double *gu, const double *dout, int N, int F)
{
    for (int n = 0; n < N; n++)
        for (int i = 0; i < F; i++) {
            const double g = gu[(size_t)n * 2 * F + i], u = gu[(size_t)n * 2 * F + F + i];
            const double d = dout[(size_t)n * F + i], sig = 1.0 / (1.0 + exp(-g));
            dgu[(size_t)n * 2 * F + i] = d * u * sig * (1.0 + g * (1.0 - sig));
            dgu[(size_t)n * 2 * F + F + i] = d * ref_silu(g);
        }
}

static void check_swiglu(int N, int F, double scale, uint64_t seed)
{
    uint64_t s = seed;
    const size_t nf = (size_t)N * F, n2 = 2 * nf;
    float *gu = frand(&s, n2, scale);
    gu[0] = 95.0f, gu[1] = -95.0f, gu[2] = 0.0f; /* saturated gates */
    float *out = xmalloc(nf * sizeof *out);
    double *dgu_ = todouble(gu, n2), *rout = dzeros(nf);
    loco_swiglu_fwd(out, gu, N, F);
    ref_swiglu_fwd(rout, dgu_, N, F);
    EXPECT_CLOSE("swiglu out", out, rout, nf, 1e-6);

    float *dout = frand(&s, nf, 1.0), *g = frand(&s, n2, 1.0), *g0 = fcopy(g, n2);
    double *ddout = todouble(dout, nf), *G = dzeros(n2);
    ref_swiglu_bwd(G, dgu_, ddout, N, F);
    for (int k = 1; k <= 2; k++) {
        loco_swiglu_bwd(g, gu, dout, N, F);
        expect_accum("swiglu dgu", g, g0, G, n2, k, 1e-6);
    }
    free(gu), free(out), free(dgu_), free(rout), free(dout), free(g), free(g0), free(ddout);
    free(G);
}

Test(llama_kernels, swiglu_small) { check_swiglu(13, 37, 4.0, 9); }
Test(llama_kernels, swiglu_wide) { check_swiglu(5, 300, 12.0, 10); }

Test(llama_kernels, swiglu_reference_vs_finite_differences)
{
    enum { N = 3, F = 5 };
    uint64_t s = 11;
    double gu[N * 2 * F], dout[N * F], out[N * F], G[N * 2 * F];
    for (int i = 0; i < N * 2 * F; i++)
        gu[i] = 4.0 * urand(&s);
    for (int i = 0; i < N * F; i++)
        dout[i] = urand(&s);
    ref_swiglu_bwd(G, gu, dout, N, F);
    const double h = 1e-6;
    double fd[N * 2 * F];
    for (int i = 0; i < N * 2 * F; i++) {
        const double keep = gu[i];
        double L[2];
        for (int sgn = 0; sgn < 2; sgn++) {
            gu[i] = keep + (sgn ? -h : h);
            ref_swiglu_fwd(out, gu, N, F);
            L[sgn] = 0.0;
            for (int j = 0; j < N * F; j++)
                L[sgn] += dout[j] * out[j];
        }
        gu[i] = keep;
        fd[i] = (L[0] - L[1]) / (2 * h);
    }
    const double e = relerr_dd(G, fd, N * 2 * F);
    cr_expect_leq(e, 1e-7, "swiglu ref grad vs FD: %.3g", e);
}

/* ----------------------------------------------- determinism across threads */

/* Every kernel at sizes where it runs threaded: one thread and two give the
 * same bits. */
Test(llama_kernels, independent_of_thread_count)
{
    enum { N = 256, C = 192, B = 2, T = 128, NH = 4, HS = 64, LD = 320, F = 192, MAXP = 300 };
    const size_t NC = (size_t)N * C, nx = (size_t)B * T * LD, nf = (size_t)N * F;
    uint64_t s = 12;
    float *x = frand(&s, NC, 2.0), *w = frand(&s, C, 1.0), *dout = frand(&s, NC, 1.0);
    float *q = frand(&s, nx, 1.0), *gu = frand(&s, 2 * nf, 5.0), *dsw = frand(&s, nf, 1.0);
    int pos[T];
    for (int t = 0; t < T; t++)
        pos[t] = (t * 7) % MAXP;
    float *r[2][9];
    const int keep = omp_get_max_threads();
    for (int k = 0; k < 2; k++) {
        loco_set_threads(k ? 2 : 1);
        float *out = xmalloc(NC * sizeof *out), *rstd = xmalloc(N * sizeof *rstd);
        float *gx = fcopy(dout, NC), *gw = fcopy(w, C);
        loco_rmsnorm_fwd(out, rstd, x, w, N, C, 1e-5f);
        loco_rmsnorm_bwd(gx, gw, dout, x, w, rstd, N, C);
        float *ct = xmalloc((size_t)MAXP * HS / 2 * sizeof *ct);
        float *st = xmalloc((size_t)MAXP * HS / 2 * sizeof *st);
        loco_rope_tables(ct, st, MAXP, HS, 500000.0f, &llama31);
        float *qr = fcopy(q, nx);
        loco_rope_fwd(qr, LD, B, T, NH, HS, pos, ct, st);
        loco_rope_bwd(qr, LD, B, T, NH, HS, NULL, ct, st);
        float *so = xmalloc(nf * sizeof *so), *sg = fcopy(gu, 2 * nf);
        loco_swiglu_fwd(so, gu, N, F);
        loco_swiglu_bwd(sg, gu, dsw, N, F);
        float *r_k[9] = {out, rstd, gx, gw, ct, st, qr, so, sg};
        memcpy(r[k], r_k, sizeof r_k);
    }
    loco_set_threads(keep);
    EXPECT_SAME_BITS("rmsnorm out", r[0][0], r[1][0], NC);
    EXPECT_SAME_BITS("rmsnorm rstd", r[0][1], r[1][1], (size_t)N);
    EXPECT_SAME_BITS("rmsnorm dinp", r[0][2], r[1][2], NC);
    EXPECT_SAME_BITS("rmsnorm dw", r[0][3], r[1][3], (size_t)C);
    EXPECT_SAME_BITS("rope cos", r[0][4], r[1][4], (size_t)MAXP * HS / 2);
    EXPECT_SAME_BITS("rope sin", r[0][5], r[1][5], (size_t)MAXP * HS / 2);
    EXPECT_SAME_BITS("rope fwd/bwd", r[0][6], r[1][6], nx);
    EXPECT_SAME_BITS("swiglu out", r[0][7], r[1][7], nf);
    EXPECT_SAME_BITS("swiglu dgu", r[0][8], r[1][8], 2 * nf);
    for (int k = 0; k < 2; k++)
        for (int j = 0; j < 9; j++)
            free(r[k][j]);
    free(x), free(w), free(dout), free(q), free(gu), free(dsw);
}
