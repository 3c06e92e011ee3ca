/* SwiGLU, the gated MLP activation of Llama and Mixtral's experts:
 * silu(gate) * up, with gate and up side by side in each row. */
#include "kernels/kernels.h"
#include "kernels/cpu/vmath.h"

/* Below this many elements the loops run on the calling thread. */
#define SWIGLU_PARALLEL_MIN 16384

/* The inner loops are "simd" so they call loco__expf's vector clone (as
 * gelu.c's); every element is computed alone, so threads change nothing. */

void loco_swiglu_fwd(float *restrict out, const float *restrict gu, int N, int F)
{
#pragma omp parallel for schedule(static) if ((long)N * F > SWIGLU_PARALLEL_MIN)
    for (int n = 0; n < N; n++) {
        const float *restrict g = gu + (size_t)n * 2 * F, *restrict u = g + F;
        float *restrict o = out + (size_t)n * F;
#pragma omp simd
        for (int i = 0; i < F; i++) {
            /* HF: F.silu(gate) * up, silu(x) = x * sigmoid(x) */
            const float sig = 1.0f / (1.0f + loco__expf(-g[i]));
            o[i] = g[i] * sig * u[i];
        }
    }
}

/* d gate = dout * up * sig * (1 + gate * (1 - sig)), d up = dout * silu(gate). */
void loco_swiglu_bwd(float *restrict dgu, const float *restrict gu, const float *restrict dout,
                     int N, int F)
{
#pragma omp parallel for schedule(static) if ((long)N * F > SWIGLU_PARALLEL_MIN)
    for (int n = 0; n < N; n++) {
        const float *restrict g = gu + (size_t)n * 2 * F, *restrict u = g + F;
        const float *restrict d = dout + (size_t)n * F;
        float *restrict dg = dgu + (size_t)n * 2 * F, *restrict du = dg + F;
#pragma omp simd
        for (int i = 0; i < F; i++) {
            const float sig = 1.0f / (1.0f + loco__expf(-g[i]));
            const float silu = g[i] * sig;
            dg[i] += d[i] * u[i] * (sig * (1.0f + g[i] * (1.0f - sig)));
            du[i] += d[i] * silu;
        }
    }
}
