/* Whole-buffer reductions and scaling (gradient-norm clipping). */
#include "kernels/kernels.h"

/* loco_sumsq cuts x into this many contiguous ranges, whatever n and the
 * thread count, sums each in double, then adds the partials in range order:
 * the result is identical for any thread count. */
enum { SUMSQ_PARTS = 256 };

double loco_sumsq(const float *restrict x, size_t n)
{
    double part[SUMSQ_PARTS];
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int k = 0; k < SUMSQ_PARTS; k++) {
        const size_t i0 = n / SUMSQ_PARTS * k + (n % SUMSQ_PARTS) * k / SUMSQ_PARTS;
        const size_t i1 = n / SUMSQ_PARTS * (k + 1)
                          + (n % SUMSQ_PARTS) * (k + 1) / SUMSQ_PARTS;
        double s = 0.0;
#pragma omp simd reduction(+ : s)
        for (size_t i = i0; i < i1; i++)
            s += (double)x[i] * x[i];
        part[k] = s;
    }
    double s = 0.0;
    for (int k = 0; k < SUMSQ_PARTS; k++)
        s += part[k];
    return s;
}

void loco_scale(float *restrict x, float s, size_t n)
{
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++)
        x[i] *= s;
}
