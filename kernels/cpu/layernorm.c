/* LayerNorm over the channel dim (GPT-2 ln_1, ln_2, ln_f). */
#include <math.h>

#include "kernels/kernels.h"

#define LN_EPS 1e-5f

/* Channels per task in the dw/db reduction: a task owns a slice of dw/db,
 * sums every row into double accumulators in row order (independent of the
 * thread count), then adds once. */
enum { LN_BWD_CHANNEL_BLOCK = 64 };

void loco_layernorm_fwd(float *restrict out, float *restrict mean,
                        float *restrict rstd, const float *restrict inp,
                        const float *restrict w, const float *restrict b,
                        int N, int C)
{
#pragma omp parallel for schedule(static) if ((long)N * C > 16384)
    for (int n = 0; n < N; n++) {
        const float *restrict x = inp + (size_t)n * C;
        float *restrict o = out + (size_t)n * C;
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int c = 0; c < C; c++)
            s += x[c];
        const float m = s / C;
        float v = 0.0f;
#pragma omp simd reduction(+ : v)
        for (int c = 0; c < C; c++) {
            const float d = x[c] - m;
            v += d * d;
        }
        const float r = 1.0f / sqrtf(v / C + LN_EPS);
        for (int c = 0; c < C; c++)
            o[c] = (x[c] - m) * r * w[c] + b[c];
        mean[n] = m;
        rstd[n] = r;
    }
}

void loco_layernorm_bwd(float *restrict dinp, float *restrict dw,
                        float *restrict db, const float *restrict dout,
                        const float *restrict inp, const float *restrict w,
                        const float *restrict mean, const float *restrict rstd,
                        int N, int C)
{
    const int nblk = (C + LN_BWD_CHANNEL_BLOCK - 1) / LN_BWD_CHANNEL_BLOCK;
#pragma omp parallel if ((long)N * C > 16384)
    {
        /* dinp = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dout * w */
#pragma omp for schedule(static) nowait
        for (int n = 0; n < N; n++) {
            const float *restrict x = inp + (size_t)n * C;
            const float *restrict d = dout + (size_t)n * C;
            float *restrict di = dinp + (size_t)n * C;
            const float m = mean[n], r = rstd[n];
            float sg = 0.0f, sgx = 0.0f;
#pragma omp simd reduction(+ : sg, sgx)
            for (int c = 0; c < C; c++) {
                const float g = d[c] * w[c];
                sg += g;
                sgx += g * (x[c] - m) * r;
            }
            sg /= C;
            sgx /= C;
            for (int c = 0; c < C; c++) {
                const float xh = (x[c] - m) * r;
                di[c] += r * (d[c] * w[c] - sg - xh * sgx);
            }
        }
#pragma omp for schedule(static)
        for (int blk = 0; blk < nblk; blk++) {
            const int c0 = blk * LN_BWD_CHANNEL_BLOCK;
            const int nc = c0 + LN_BWD_CHANNEL_BLOCK < C
                               ? LN_BWD_CHANNEL_BLOCK : C - c0;
            double aw[LN_BWD_CHANNEL_BLOCK] = {0}, ab[LN_BWD_CHANNEL_BLOCK] = {0};
            for (int n = 0; n < N; n++) {
                const float *restrict x = inp + (size_t)n * C + c0;
                const float *restrict d = dout + (size_t)n * C + c0;
                const float m = mean[n], r = rstd[n];
                for (int c = 0; c < nc; c++) {
                    aw[c] += (double)(d[c] * ((x[c] - m) * r));
                    ab[c] += (double)d[c];
                }
            }
            for (int c = 0; c < nc; c++) {
                dw[c0 + c] += (float)aw[c];
                db[c0 + c] += (float)ab[c];
            }
        }
    }
}
