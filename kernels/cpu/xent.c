/* Fused softmax + cross-entropy: the loss and its logit gradient in one pass
 * per row, so the (N,V) probabilities are never stored separately. */
#include <math.h>

#include "kernels/kernels.h"
#include "kernels/cpu/vmath.h"


/* dlogits may equal logits: each element is read before it is written and
 * nothing else is read after that, so neither pointer is restrict. */
void loco_xent_fwd_bwd(float *losses, float *dlogits, const float *logits,
                       const int32_t *targets, int N, int V, float dscale)
{
    loco_xent_fwd_bwd_strided(losses, dlogits, logits, targets, N, V, V, dscale);
}

void loco_xent_fwd_bwd_strided(float *losses, float *dlogits, const float *logits,
                               const int32_t *targets, int N, int V, int stride, float dscale)
{
#pragma omp parallel for schedule(static) if ((long)N * V > 16384)
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * stride;
        float *d = dlogits ? dlogits + (size_t)n * stride : NULL;
        const int32_t y = targets[n];
        if (y < 0) {
            losses[n] = 0.0f;
            if (d)
                for (int j = 0; j < stride; j++)
                    d[j] = 0.0f;
            continue;
        }
        float m = x[0];
#pragma omp simd reduction(max : m)
        for (int j = 0; j < V; j++)
            m = x[j] > m ? x[j] : m;
        double s = 0.0;
#pragma omp simd reduction(+ : s)
        for (int j = 0; j < V; j++)
            s += (double)loco__expf(x[j] - m);
        const float lse = m + (float)log(s);
        losses[n] = lse - x[y];
        if (!d)
            continue;
        /* same-index read then write: safe in place */
#pragma omp simd
        for (int j = 0; j < V; j++)
            d[j] = dscale * loco__expf(x[j] - lse);
        d[y] -= dscale;
        for (int j = V; j < stride; j++) /* padding: not in the softmax */
            d[j] = 0.0f;
    }
}
