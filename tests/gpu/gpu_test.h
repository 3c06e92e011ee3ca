/* Helpers of the GPU tests: skip without a device (with the reason), device
 * buffers from one slab per test, bf16 on the host, error measures. */
#ifndef LOCO_TESTS_GPU_TEST_H
#define LOCO_TESTS_GPU_TEST_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "kernels/kernels.h"

/* fp32 twins: relative error bound; bf16 twins (inputs rounded to bf16,
 * the CPU twin run on the rounded values). */
#define TOL_F32 1e-5
#define TOL_BF16 1e-2

/* Skips the calling test, visibly, where no device can be used. */
static inline void gpu_require(void)
{
    int n = 0;
    if (loco_cuda_device_count(&n) < 0) {
        const char *m = loco_errmsg(), *why = strstr(m, "no CUDA device");
        cr_skip_test("%s", why ? why : m);
    }
}

typedef struct {
    loco_cuda_slab *slab;
} gpu_env;

static inline void gpu_env_init(gpu_env *e, size_t bytes)
{
    gpu_require();
    cr_assert_eq(loco_cuda_slab_create(&e->slab, bytes), 0, "%s", loco_errmsg());
}

static inline void gpu_env_fini(gpu_env *e)
{
    loco_cuda_slab_destroy(e->slab);
}

static inline void *dalloc(gpu_env *e, size_t bytes)
{
    void *p = NULL;
    cr_assert_eq(loco_cuda_slab_alloc(e->slab, &p, bytes, "test buffer"), 0, "%s",
                 loco_errmsg());
    return p;
}

/* Device copy of bytes of host memory. */
static inline void *dup_to_dev(gpu_env *e, const void *h, size_t bytes)
{
    void *d = dalloc(e, bytes);
    cr_assert_eq(loco_cuda_copy(d, h, bytes, NULL), 0, "%s", loco_errmsg());
    return d;
}

static inline void to_host(void *h, const void *d, size_t bytes)
{
    cr_assert_eq(loco_cuda_copy(h, d, bytes, NULL), 0, "%s", loco_errmsg());
    cr_assert_eq(loco_cuda_sync(NULL), 0, "%s", loco_errmsg());
}

#define GPU_OK(call) cr_assert_eq((call), 0, "%s: %s", #call, loco_errmsg())

static inline uint64_t gpu_splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* n floats uniform in [-scale, scale) */
static inline float *rand_f(uint64_t *s, size_t n, double scale)
{
    float *x = malloc((n ? n : 1) * sizeof *x);
    cr_assert_not_null(x);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(scale * ((double)(gpu_splitmix(s) >> 11) * 0x1.0p-52 - 1.0));
    return x;
}

static inline float *copy_f(const float *x, size_t n)
{
    float *y = malloc((n ? n : 1) * sizeof *y);
    cr_assert_not_null(y);
    memcpy(y, x, n * sizeof *y);
    return y;
}

/* The twins' integer outputs (and some floats) must be the CPU's bits. */
#define EXPECT_SAME_BITS(what, a, b, n)                                                      \
    cr_expect_eq(memcmp((a), (b), (n) * sizeof *(a)), 0, "%s: not the CPU's bits", (what))

/* n copies of v (at least one element's room), malloc'd. */
static inline float *fill_f(size_t n, float v)
{
    float *x = malloc((n ? n : 1) * sizeof *x);
    cr_assert_not_null(x);
    for (size_t i = 0; i < n; i++)
        x[i] = v;
    return x;
}

static inline int32_t *fill_i(size_t n, int32_t v)
{
    int32_t *x = malloc((n ? n : 1) * sizeof *x);
    cr_assert_not_null(x);
    for (size_t i = 0; i < n; i++)
        x[i] = v;
    return x;
}

/* n floats or ints of device memory d, copied into a malloc'd host array. */
static inline float *down_f(const void *d, size_t n)
{
    float *x = malloc((n ? n : 1) * sizeof *x);
    cr_assert_not_null(x);
    to_host(x, d, n * sizeof *x);
    return x;
}

static inline int32_t *down_i(const void *d, size_t n)
{
    int32_t *x = malloc((n ? n : 1) * sizeof *x);
    cr_assert_not_null(x);
    to_host(x, d, n * sizeof *x);
    return x;
}

static inline loco_bf16 f2bf(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (loco_bf16)((u + 0x7fffU + ((u >> 16) & 1)) >> 16);
}

static inline float bf2f(loco_bf16 h)
{
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* x rounded to bf16 in place; returns the bf16 copy (malloc'd). */
static inline loco_bf16 *round_bf(float *x, size_t n)
{
    loco_bf16 *h = malloc((n ? n : 1) * sizeof *h);
    cr_assert_not_null(h);
    for (size_t i = 0; i < n; i++) {
        h[i] = f2bf(x[i]);
        x[i] = bf2f(h[i]);
    }
    return h;
}

static inline float *bf_to_f(const loco_bf16 *h, size_t n)
{
    float *x = malloc((n ? n : 1) * sizeof *x);
    cr_assert_not_null(x);
    for (size_t i = 0; i < n; i++)
        x[i] = bf2f(h[i]);
    return x;
}

/* max |a - r| / (max |r| + 1e-6); infinite when a is not finite */
static inline double rel_err(const float *a, const float *r, size_t n)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]))
            return INFINITY;
        num = fmax(num, fabs((double)a[i] - r[i]));
        den = fmax(den, fabs((double)r[i]));
    }
    return num / (den + 1e-6);
}

#define EXPECT_NEAR(what, a, r, n, tol)                                                      \
    do {                                                                                     \
        const double e_ = rel_err((a), (r), (n));                                            \
        cr_expect_leq(e_, (tol), "%s: rel err %.3g > %.3g", (what), e_, (double)(tol));      \
    } while (0)

#endif
