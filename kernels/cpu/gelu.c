/* GELU, tanh approximation (GPT-2 "gelu_new"). */
#include <math.h>

#include "kernels/kernels.h"
#include "kernels/cpu/vmath.h"


/* tanh through the vectorised exp; odd-symmetric so exp never overflows. */
static inline float tanh_fast(float u)
{
    const float e = loco__expf(-2.0f * fabsf(u));
    return copysignf((1.0f - e) / (1.0f + e), u);
}

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_A 0.044715f

/* The loops are "parallel for simd" so they call loco__expf's vector clone:
 * plain auto-vectorisation treats the external call as a memory clobber. */

void loco_gelu_fwd(float *restrict out, const float *restrict inp, size_t n)
{
#pragma omp parallel for simd schedule(static) if (n > 16384)
    for (size_t i = 0; i < n; i++) {
        const float x = inp[i];
        const float u = GELU_K * (x + GELU_A * x * x * x);
        out[i] = 0.5f * x * (1.0f + tanh_fast(u));
    }
}

void loco_gelu_bwd(float *restrict dinp, const float *restrict inp,
                   const float *restrict dout, size_t n)
{
#pragma omp parallel for simd schedule(static) if (n > 16384)
    for (size_t i = 0; i < n; i++) {
        const float x = inp[i];
        const float u = GELU_K * (x + GELU_A * x * x * x);
        const float th = tanh_fast(u);
        const float du = GELU_K * (1.0f + 3.0f * GELU_A * x * x);
        const float g = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
        dinp[i] += dout[i] * g;
    }
}
