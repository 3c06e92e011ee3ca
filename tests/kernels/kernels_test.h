/* Helpers shared by the kernel tests: a seeded generator, buffers and the
 * error measures every comparison against a double reference uses. */
#ifndef LOCO_TESTS_KERNELS_TEST_H
#define LOCO_TESTS_KERNELS_TEST_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static inline uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* uniform in [-1, 1) */
static inline double urand(uint64_t *s)
{
    return (double)(splitmix64(s) >> 11) * 0x1.0p-52 - 1.0;
}

static inline void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    cr_assert_not_null(p, "out of memory (%zu bytes)", bytes);
    return p;
}

static inline float *frand(uint64_t *s, size_t n, double scale)
{
    float *x = xmalloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(scale * urand(s));
    return x;
}

/* n floats all equal to v (xmalloc'd). */
static inline float *ffill(size_t n, float v)
{
    float *x = xmalloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = v;
    return x;
}

#define EXPECT_SAME_BITS(what, a, b, n)                                      \
    cr_expect_eq(memcmp((a), (b), (n) * sizeof *(a)), 0, "%s not bitwise "   \
                 "identical", (what))

static inline float *fcopy(const float *x, size_t n)
{
    float *y = xmalloc(n * sizeof *y);
    memcpy(y, x, n * sizeof *y);
    return y;
}

static inline double *todouble(const float *x, size_t n)
{
    double *y = xmalloc(n * sizeof *y);
    for (size_t i = 0; i < n; i++)
        y[i] = x[i];
    return y;
}

static inline double *dzeros(size_t n)
{
    double *y = calloc(n ? n : 1, sizeof *y);
    cr_assert_not_null(y);
    return y;
}

/* max |a - r| / (max |r| + 1e-6); infinite if a has a NaN or Inf */
static inline double relerr(const float *a, const double *r, size_t n)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite((double)a[i]))
            return INFINITY;
        num = fmax(num, fabs((double)a[i] - r[i]));
        den = fmax(den, fabs(r[i]));
    }
    return num / (den + 1e-6);
}

static inline double relerr_dd(const double *a, const double *r, size_t n)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]))
            return INFINITY;
        num = fmax(num, fabs(a[i] - r[i]));
        den = fmax(den, fabs(r[i]));
    }
    return num / (den + 1e-6);
}

#define EXPECT_CLOSE(what, a, r, n, tol)                                     \
    do {                                                                     \
        const double e_ = relerr((a), (r), (n));                             \
        cr_expect_leq(e_, (tol), "%s: rel err %.3g > %.3g", (what), e_,      \
                      (double)(tol));                                        \
    } while (0)

#endif
