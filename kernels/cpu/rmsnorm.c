/* RMSNorm over the channel dim (Llama's input_layernorm, post_attention_layernorm
 * and final norm), as Hugging Face's LlamaRMSNorm computes it in fp32. */
#include <math.h>

#include "kernels/kernels.h"

/* Channels per task in the dw reduction: a task owns a slice of dw, sums
 * every row into double accumulators in row order (independent of the thread
 * count), then adds once. */
enum { RMS_BWD_CHANNEL_BLOCK = 64 };

/* Below this many elements the loops run on the calling thread. */
#define RMS_PARALLEL_MIN 16384

void loco_rmsnorm_fwd(float *restrict out, float *restrict rstd, const float *restrict inp,
                      const float *restrict w, int N, int C, float eps)
{
#pragma omp parallel for schedule(static) if ((long)N * C > RMS_PARALLEL_MIN)
    for (int n = 0; n < N; n++) {
        const float *restrict x = inp + (size_t)n * C;
        float *restrict o = out + (size_t)n * C;
        float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
        for (int c = 0; c < C; c++)
            ss += x[c] * x[c];
        const float r = 1.0f / sqrtf(ss / C + eps);
        /* HF: weight * (x * rsqrt(variance + eps)), the product in that order */
        for (int c = 0; c < C; c++)
            o[c] = w[c] * (x[c] * r);
        rstd[n] = r;
    }
}

/* y = w * x * r with r = (mean(x^2) + eps)^(-1/2), so with g = dout * w and
 * xh = x * r: dx = r * (g - xh * mean(g * xh)), dw = sum over rows of dout * xh. */
void loco_rmsnorm_bwd(float *restrict dinp, float *restrict dw, const float *restrict dout,
                      const float *restrict inp, const float *restrict w,
                      const float *restrict rstd, int N, int C)
{
    const int nblk = (C + RMS_BWD_CHANNEL_BLOCK - 1) / RMS_BWD_CHANNEL_BLOCK;
#pragma omp parallel if ((long)N * C > RMS_PARALLEL_MIN)
    {
#pragma omp for schedule(static) nowait
        for (int n = 0; n < N; n++) {
            const float *restrict x = inp + (size_t)n * C;
            const float *restrict d = dout + (size_t)n * C;
            float *restrict di = dinp + (size_t)n * C;
            const float r = rstd[n];
            float sgx = 0.0f;
#pragma omp simd reduction(+ : sgx)
            for (int c = 0; c < C; c++)
                sgx += d[c] * w[c] * (x[c] * r);
            sgx /= C;
            for (int c = 0; c < C; c++)
                di[c] += r * (d[c] * w[c] - (x[c] * r) * sgx);
        }
#pragma omp for schedule(static)
        for (int blk = 0; blk < nblk; blk++) {
            const int c0 = blk * RMS_BWD_CHANNEL_BLOCK;
            const int nc = c0 + RMS_BWD_CHANNEL_BLOCK < C ? RMS_BWD_CHANNEL_BLOCK : C - c0;
            double aw[RMS_BWD_CHANNEL_BLOCK] = {0};
            for (int n = 0; n < N; n++) {
                const float *restrict x = inp + (size_t)n * C + c0;
                const float *restrict d = dout + (size_t)n * C + c0;
                const float r = rstd[n];
                for (int c = 0; c < nc; c++)
                    aw[c] += (double)(d[c] * (x[c] * r));
            }
            for (int c = 0; c < nc; c++)
                dw[c0 + c] += (float)aw[c];
        }
    }
}
