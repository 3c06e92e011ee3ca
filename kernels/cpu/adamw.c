/* AdamW with decoupled weight decay (Loshchilov & Hutter), GPT-2 style. */
#include <math.h>

#include "kernels/kernels.h"

void loco_adamw_update(float *restrict p, const float *restrict g,
                       float *restrict m, float *restrict v, size_t n,
                       float lr, float beta1, float beta2, float eps, float wd,
                       int64_t t)
{
    /* Bias corrections in double: 1 - beta^t loses digits in float. */
    const float bc1 = (float)(1.0 - pow((double)beta1, (double)t));
    const float bc2 = (float)(1.0 - pow((double)beta2, (double)t));
    const float ib1 = 1.0f / bc1, ib2 = 1.0f / bc2;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) {
        const float gi = g[i];
        const float mi = beta1 * m[i] + (1.0f - beta1) * gi;
        const float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        const float mhat = mi * ib1, vhat = vi * ib2;
        p[i] -= lr * (mhat / (sqrtf(vhat) + eps) + wd * p[i]);
    }
}
