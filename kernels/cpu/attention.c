/* Causal multi-head self-attention (GPT-2 attn without the projections),
 * with grouped-query attention: NKV key/value heads shared by NH query heads
 * (query head h reads kv head h / (NH/NKV)); GPT-2 is NKV = NH.
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

/* Head h of the (B,T,ld) qkv rows of batch b: its query columns, and the
 * key and value columns of its kv head h / (NH/NKV). */
typedef struct {
    int NH, NKV, hs, C, ld;
} gqa_geo;

static inline size_t q_col(const gqa_geo *g, int h) { return (size_t)h * g->hs; }
static inline size_t k_col(const gqa_geo *g, int h)
{
    return (size_t)(g->NH + h / (g->NH / g->NKV)) * g->hs;
}
static inline size_t v_col(const gqa_geo *g, int h)
{
    return (size_t)(g->NH + g->NKV + h / (g->NH / g->NKV)) * g->hs;
}

static gqa_geo gqa_make(int NH, int NKV, int hs)
{
    return (gqa_geo){NH, NKV, hs, NH * hs, (NH + 2 * NKV) * hs};
}

void loco_attention_gqa_fwd(float *restrict out, float *restrict att,
                            const float *restrict qkv, int B, int T, int NH, int NKV,
                            int hs)
{
    const gqa_geo g = gqa_make(NH, NKV, hs);
    const int C = g.C, ld = g.ld;
    const float scale = 1.0f / sqrtf((float)hs);

    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float *x = qkv + (size_t)b * T * ld;
            const float *q = x + q_col(&g, h), *k = x + k_col(&g, h);
            float *A = att + ((size_t)b * NH + h) * T * T;
            for (int t0 = 0; t0 < T; t0 += ATT_BLOCK) {
                const int t1 = imin(t0 + ATT_BLOCK, T);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t1 - t0,
                            t1, hs, scale, q + (size_t)t0 * ld, ld, k, ld,
                            0.0f, A + (size_t)t0 * T, T);
            }
        }

    const long rows = (long)B * NH * T;
#pragma omp parallel for schedule(static) if (rows * T > 16384)
    for (long r = 0; r < rows; r++)
        softmax_row(att + (size_t)r * T, (int)(r % T), T);

    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float *v = qkv + (size_t)b * T * ld + v_col(&g, h);
            const float *A = att + ((size_t)b * NH + h) * T * T;
            float *o = out + (size_t)b * T * C + (size_t)h * hs;
            for (int t0 = 0; t0 < T; t0 += ATT_BLOCK) {
                const int t1 = imin(t0 + ATT_BLOCK, T);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans,
                            t1 - t0, hs, t1, 1.0f, A + (size_t)t0 * T, T, v,
                            ld, 0.0f, o + (size_t)t0 * C, C);
            }
        }
}

void loco_attention_fwd(float *restrict out, float *restrict att,
                        const float *restrict qkv, int B, int T, int C, int NH)
{
    loco_attention_gqa_fwd(out, att, qkv, B, T, NH, NH, C / NH);
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

/* The heads of a group run one after another (the products are outside
 * OpenMP regions), so their sums into the shared dk, dv rows need no
 * synchronisation and come in head order. */
void loco_attention_gqa_bwd(float *restrict dqkv, float *restrict datt,
                            const float *restrict dout, const float *restrict qkv,
                            const float *restrict att, int B, int T, int NH, int NKV,
                            int hs)
{
    const gqa_geo g = gqa_make(NH, NKV, hs);
    const int C = g.C, ld = g.ld;
    const float scale = 1.0f / sqrtf((float)hs);

    /* dP = dO @ V^T and dV += P^T @ dO */
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const size_t bh = (size_t)b * NH + h;
            const size_t off = (size_t)b * T * ld + v_col(&g, h);
            const float *v = qkv + off;
            float *dv = dqkv + off;
            const float *dO = dout + (size_t)b * T * C + (size_t)h * hs;
            const float *P = att + bh * T * T;
            float *D = datt + bh * T * T;
            for (int t0 = 0; t0 < T; t0 += ATT_BLOCK) {
                const int t1 = imin(t0 + ATT_BLOCK, T);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t1 - t0,
                            t1, hs, 1.0f, dO + (size_t)t0 * C, C, v, ld, 0.0f,
                            D + (size_t)t0 * T, T);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, t1 - t0,
                            hs, T - t0, 1.0f, P + (size_t)t0 * T + t0, T,
                            dO + (size_t)t0 * C, C, 1.0f, dv + (size_t)t0 * ld,
                            ld);
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
            const size_t x = (size_t)b * T * ld;
            const float *q = qkv + x + q_col(&g, h), *k = qkv + x + k_col(&g, h);
            float *dq = dqkv + x + q_col(&g, h), *dk = dqkv + x + k_col(&g, h);
            const float *D = datt + bh * T * T;
            for (int t0 = 0; t0 < T; t0 += ATT_BLOCK) {
                const int t1 = imin(t0 + ATT_BLOCK, T);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans,
                            t1 - t0, hs, t1, 1.0f, D + (size_t)t0 * T, T, k,
                            ld, 1.0f, dq + (size_t)t0 * ld, ld);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, t1 - t0,
                            hs, T - t0, 1.0f, D + (size_t)t0 * T + t0, T,
                            q + (size_t)t0 * ld, ld, 1.0f,
                            dk + (size_t)t0 * ld, ld);
            }
        }
}

void loco_attention_bwd(float *restrict dqkv, float *restrict datt,
                        const float *restrict dout, const float *restrict qkv,
                        const float *restrict att, int B, int T, int C, int NH)
{
    loco_attention_gqa_bwd(dqkv, datt, dout, qkv, att, B, T, NH, NH, C / NH);
}
