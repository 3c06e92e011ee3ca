/* Causal multi-head self-attention (GPT-2 attn without the projections).
 *
 * Products go through OpenBLAS one (batch, head, block of query rows) at a
 * time, called outside OpenMP regions; the row softmax and its backward run
 * in one OpenMP loop over all (b, h, t) rows in between. Query rows are cut
 * into blocks of ATT_BLOCK so a block only touches keys up to its own end:
 * at T=1024 that skips ~45% of the masked work a full T x T product would do.
 * Within a diagonal block the entries above the diagonal are computed by BLAS
 * and then overwritten with zeros, which the following products rely on. */
#include <cblas.h>
#include <math.h>

#include "kernels/kernels.h"
#include "kernels/cpu/vmath.h"


enum { ATT_BLOCK = 128 };

/* One past the last key column a BLAS product of row t's block touches. */
static inline int block_end(int t, int T)
{
    const int e = (t / ATT_BLOCK + 1) * ATT_BLOCK;
    return e < T ? e : T;
}

static inline int imin(int a, int b) { return a < b ? a : b; }

/* In place: row[0..t] scores -> probabilities, row[t+1..T) = 0. */
static void softmax_row(float *restrict row, int t, int T)
{
    float m = row[0];
#pragma omp simd reduction(max : m)
    for (int j = 0; j <= t; j++)
        m = row[j] > m ? row[j] : m;
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int j = 0; j <= t; j++) {
        row[j] = loco__expf(row[j] - m);
        s += row[j];
    }
    const float inv = 1.0f / s;
    for (int j = 0; j <= t; j++)
        row[j] *= inv;
    for (int j = t + 1; j < T; j++)
        row[j] = 0.0f;
}

void loco_attention_fwd(float *restrict out, float *restrict att,
                        const float *restrict qkv, int B, int T, int C, int NH)
{
    const int hs = C / NH;
    const int C3 = 3 * C;
    const float scale = 1.0f / sqrtf((float)hs);

    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float *q = qkv + (size_t)b * T * C3 + (size_t)h * hs;
            const float *k = q + C;
            float *A = att + ((size_t)b * NH + h) * T * T;
            for (int t0 = 0; t0 < T; t0 += ATT_BLOCK) {
                const int t1 = imin(t0 + ATT_BLOCK, T);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t1 - t0,
                            t1, hs, scale, q + (size_t)t0 * C3, C3, k, C3,
                            0.0f, A + (size_t)t0 * T, T);
            }
        }

    const long rows = (long)B * NH * T;
#pragma omp parallel for schedule(static) if (rows * T > 16384)
    for (long r = 0; r < rows; r++)
        softmax_row(att + (size_t)r * T, (int)(r % T), T);

    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float *v = qkv + (size_t)b * T * C3 + 2 * C + (size_t)h * hs;
            const float *A = att + ((size_t)b * NH + h) * T * T;
            float *o = out + (size_t)b * T * C + (size_t)h * hs;
            for (int t0 = 0; t0 < T; t0 += ATT_BLOCK) {
                const int t1 = imin(t0 + ATT_BLOCK, T);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans,
                            t1 - t0, hs, t1, 1.0f, A + (size_t)t0 * T, T, v,
                            C3, 0.0f, o + (size_t)t0 * C, C);
            }
        }
}

/* In place: drow[0..t] dP -> scale * dS (softmax backward), then zeros up to
 * the block end so the block products see a clean causal mask. */
static void softmax_bwd_row(float *restrict drow, const float *restrict prow,
                            int t, int T, float scale)
{
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int j = 0; j <= t; j++)
        dot += prow[j] * drow[j];
    for (int j = 0; j <= t; j++)
        drow[j] = scale * prow[j] * (drow[j] - dot);
    const int e = block_end(t, T);
    for (int j = t + 1; j < e; j++)
        drow[j] = 0.0f;
}

void loco_attention_bwd(float *restrict dqkv, float *restrict datt,
                        const float *restrict dout, const float *restrict qkv,
                        const float *restrict att, int B, int T, int C, int NH)
{
    const int hs = C / NH;
    const int C3 = 3 * C;
    const float scale = 1.0f / sqrtf((float)hs);

    /* dP = dO @ V^T and dV += P^T @ dO */
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const size_t bh = (size_t)b * NH + h;
            const size_t off = (size_t)b * T * C3 + (size_t)h * hs;
            const float *v = qkv + off + 2 * C;
            float *dv = dqkv + off + 2 * C;
            const float *dO = dout + (size_t)b * T * C + (size_t)h * hs;
            const float *P = att + bh * T * T;
            float *D = datt + bh * T * T;
            for (int t0 = 0; t0 < T; t0 += ATT_BLOCK) {
                const int t1 = imin(t0 + ATT_BLOCK, T);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t1 - t0,
                            t1, hs, 1.0f, dO + (size_t)t0 * C, C, v, C3, 0.0f,
                            D + (size_t)t0 * T, T);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, t1 - t0,
                            hs, T - t0, 1.0f, P + (size_t)t0 * T + t0, T,
                            dO + (size_t)t0 * C, C, 1.0f, dv + (size_t)t0 * C3,
                            C3);
            }
        }

    const long rows = (long)B * NH * T;
#pragma omp parallel for schedule(static) if (rows * T > 16384)
    for (long r = 0; r < rows; r++)
        softmax_bwd_row(datt + (size_t)r * T, att + (size_t)r * T,
                        (int)(r % T), T, scale);

    /* dQ += dS @ K and dK += dS^T @ Q (scale already folded into dS) */
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const size_t bh = (size_t)b * NH + h;
            const size_t off = (size_t)b * T * C3 + (size_t)h * hs;
            const float *q = qkv + off, *k = qkv + off + C;
            float *dq = dqkv + off, *dk = dqkv + off + C;
            const float *D = datt + bh * T * T;
            for (int t0 = 0; t0 < T; t0 += ATT_BLOCK) {
                const int t1 = imin(t0 + ATT_BLOCK, T);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans,
                            t1 - t0, hs, t1, 1.0f, D + (size_t)t0 * T, T, k,
                            C3, 1.0f, dq + (size_t)t0 * C3, C3);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, t1 - t0,
                            hs, T - t0, 1.0f, D + (size_t)t0 * T + t0, T,
                            q + (size_t)t0 * C3, C3, 1.0f,
                            dk + (size_t)t0 * C3, C3);
            }
        }
}
