/* Residual connections. */
#include "kernels/kernels.h"

/* out may alias a or b, so no restrict here. */
void loco_residual_fwd(float *out, const float *a, const float *b, size_t n)
{
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
}

void loco_residual_bwd(float *restrict da, float *restrict db,
                       const float *restrict dout, size_t n)
{
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) {
        da[i] += dout[i];
        db[i] += dout[i];
    }
}
