/* Token + position embedding (GPT-2 wte/wpe). */
#include "kernels/kernels.h"

/* Channels per task in the backward scatter: each task owns a column slice
 * of dwte and walks every token in order, so repeated tokens accumulate in a
 * fixed order with no atomics. */
enum { ENC_BWD_CHANNEL_BLOCK = 64 };

void loco_encoder_fwd(float *restrict out, const int32_t *restrict tok,
                      const float *restrict wte, const float *restrict wpe,
                      int B, int T, int C)
{
    const long N = (long)B * T;
#pragma omp parallel for schedule(static) if (N * C > 16384)
    for (long bt = 0; bt < N; bt++) {
        const int t = (int)(bt % T);
        const float *restrict e = wte + (size_t)tok[bt] * C;
        const float *restrict p = wpe + (size_t)t * C;
        float *restrict o = out + (size_t)bt * C;
        for (int c = 0; c < C; c++)
            o[c] = e[c] + p[c];
    }
}

void loco_encoder_bwd(float *restrict dwte, float *restrict dwpe,
                      const float *restrict dout, const int32_t *restrict tok,
                      int B, int T, int C)
{
    const int nblk = (C + ENC_BWD_CHANNEL_BLOCK - 1) / ENC_BWD_CHANNEL_BLOCK;
    const long N = (long)B * T;
#pragma omp parallel if (N * C > 16384)
    {
        /* dwpe[t] += sum over b, in b order. */
#pragma omp for schedule(static) nowait
        for (int t = 0; t < T; t++) {
            float *restrict dp = dwpe + (size_t)t * C;
            for (int b = 0; b < B; b++) {
                const float *restrict d = dout + ((size_t)b * T + t) * C;
                for (int c = 0; c < C; c++)
                    dp[c] += d[c];
            }
        }
        /* dwte rows scattered by token, owned by channel slice. */
#pragma omp for schedule(static)
        for (int blk = 0; blk < nblk; blk++) {
            const int c0 = blk * ENC_BWD_CHANNEL_BLOCK;
            const int c1 = c0 + ENC_BWD_CHANNEL_BLOCK < C
                               ? c0 + ENC_BWD_CHANNEL_BLOCK : C;
            for (long bt = 0; bt < N; bt++) {
                float *restrict dw = dwte + (size_t)tok[bt] * C;
                const float *restrict d = dout + (size_t)bt * C;
                for (int c = c0; c < c1; c++)
                    dw[c] += d[c];
            }
        }
    }
}
