/* Tensor-parallel (Megatron) pieces: the vocabulary-parallel embedding and
 * cross-entropy a tp rank computes on its slice, the position embedding of
 * a run of rows, and a row-parallel layer's bias. The collectives that join
 * the ranks' pieces live with the model (inner/model/model.c). */
#include <math.h>

#include "kernels/kernels.h"
#include "kernels/cpu/vmath.h"

/* Channels per task in the embedding backward: each task owns a column
 * slice of dwte and walks every row in order, so repeated tokens
 * accumulate in a fixed order with no atomics (as loco_encoder_bwd). */
enum { TP_BWD_CHANNEL_BLOCK = 64 };

/* Below this many elements a loop runs on one thread. */
#define TP_PARALLEL_MIN 16384L

/* Row of this rank's wte slice holding token t, or -1 when t is another
 * rank's (or no one's). */
static inline long local_row(int32_t t, int v_lo, int v_n)
{
    return t >= v_lo && (long)t - v_lo < v_n ? (long)t - v_lo : -1;
}

void loco_embed_fwd(float *restrict out, const int32_t *restrict tok, const float *restrict wte,
                    int v_lo, int v_n, int N, int C)
{
#pragma omp parallel for schedule(static) if ((long)N * C > TP_PARALLEL_MIN)
    for (int n = 0; n < N; n++) {
        const long r = local_row(tok[n], v_lo, v_n);
        float *restrict o = out + (size_t)n * C;
        if (r < 0) {
            for (int c = 0; c < C; c++)
                o[c] = 0.0f;
            continue;
        }
        const float *restrict e = wte + (size_t)r * C;
        for (int c = 0; c < C; c++)
            o[c] = e[c];
    }
}

void loco_embed_bwd(float *restrict dwte, const float *restrict dout, const int32_t *restrict tok,
                    int v_lo, int v_n, int N, int C)
{
    const int nblk = (C + TP_BWD_CHANNEL_BLOCK - 1) / TP_BWD_CHANNEL_BLOCK;
#pragma omp parallel for schedule(static) if ((long)N * C > TP_PARALLEL_MIN)
    for (int blk = 0; blk < nblk; blk++) {
        const int c0 = blk * TP_BWD_CHANNEL_BLOCK;
        const int c1 = c0 + TP_BWD_CHANNEL_BLOCK < C ? c0 + TP_BWD_CHANNEL_BLOCK : C;
        for (int n = 0; n < N; n++) {
            const long r = local_row(tok[n], v_lo, v_n);
            if (r < 0)
                continue;
            float *restrict dw = dwte + (size_t)r * C;
            const float *restrict d = dout + (size_t)n * C;
            for (int c = c0; c < c1; c++)
                dw[c] += d[c];
        }
    }
}

void loco_pos_fwd(float *restrict out, const float *restrict wpe, int row0, int N, int T, int C)
{
#pragma omp parallel for schedule(static) if ((long)N * C > TP_PARALLEL_MIN)
    for (int i = 0; i < N; i++) {
        const float *restrict p = wpe + (size_t)(((long)row0 + i) % T) * C;
        float *restrict o = out + (size_t)i * C;
        for (int c = 0; c < C; c++)
            o[c] += p[c];
    }
}

/* One task per dwpe row t: the rows i with (row0 + i) % T == t are
 * i0, i0 + T, ..., added in that order. */
void loco_pos_bwd(float *restrict dwpe, const float *restrict dout, int row0, int N, int T, int C)
{
    const int t0 = (int)((long)row0 % T); /* position of row 0 */
#pragma omp parallel for schedule(static) if ((long)N * C > TP_PARALLEL_MIN)
    for (int t = 0; t < T; t++) {
        float *restrict dp = dwpe + (size_t)t * C;
        for (long i = (t - t0 + T) % T; i < N; i += T) {
            const float *restrict d = dout + (size_t)i * C;
            for (int c = 0; c < C; c++)
                dp[c] += d[c];
        }
    }
}

void loco_bias_fwd(float *restrict out, const float *restrict bias, int N, int OC)
{
#pragma omp parallel for schedule(static) if ((long)N * OC > TP_PARALLEL_MIN)
    for (int n = 0; n < N; n++) {
        float *restrict o = out + (size_t)n * OC;
#pragma omp simd
        for (int j = 0; j < OC; j++)
            o[j] += bias[j];
    }
}

/* ------------------------------------------- vocabulary-parallel cross-entropy */

void loco_xent_vp_max(float *restrict rowmax, const float *restrict logits, int N, int Vl,
                      int v_valid)
{
#pragma omp parallel for schedule(static) if ((long)N * Vl > TP_PARALLEL_MIN)
    for (int n = 0; n < N; n++) {
        const float *restrict x = logits + (size_t)n * Vl;
        float m = -INFINITY;
#pragma omp simd reduction(max : m)
        for (int j = 0; j < v_valid; j++)
            m = x[j] > m ? x[j] : m;
        rowmax[n] = m;
    }
}

/* The target's column in this slice, or -1 when it is ignored (negative),
 * another rank's, or padding. */
static inline int local_target(int32_t y, int v_lo, int v_valid)
{
    return y >= 0 && y >= v_lo && (long)y - v_lo < v_valid ? (int)(y - v_lo) : -1;
}

void loco_xent_vp_sum(float *restrict sumexp, float *restrict tlogit,
                      const float *restrict logits, const float *restrict rowmax,
                      const int32_t *restrict targets, int v_lo, int N, int Vl, int v_valid)
{
#pragma omp parallel for schedule(static) if ((long)N * Vl > TP_PARALLEL_MIN)
    for (int n = 0; n < N; n++) {
        const float *restrict x = logits + (size_t)n * Vl;
        const float m = rowmax[n];
        double s = 0.0;
#pragma omp simd reduction(+ : s)
        for (int j = 0; j < v_valid; j++)
            s += (double)loco__expf(x[j] - m);
        sumexp[n] = (float)s;
        const int yl = local_target(targets[n], v_lo, v_valid);
        tlogit[n] = yl >= 0 ? x[yl] : 0.0f;
    }
}

/* dlogits may equal logits: each element is read before it is written and
 * nothing else is read after that, so neither pointer is restrict. The log
 * is taken in double and the gradient as exp(x - lse), the order of
 * loco_xent_fwd_bwd, so one rank holding the whole vocabulary reproduces
 * it up to the rounding of sumexp to float. */
void loco_xent_vp_finish(float *losses, float *dlogits, const float *logits, const float *rowmax,
                         const float *sumexp, const float *tlogit, const int32_t *targets,
                         int v_lo, int N, int Vl, int v_valid, float dscale)
{
#pragma omp parallel for schedule(static) if ((long)N * Vl > TP_PARALLEL_MIN)
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * Vl;
        float *d = dlogits ? dlogits + (size_t)n * Vl : NULL;
        if (targets[n] < 0) {
            losses[n] = 0.0f;
            if (d)
                for (int j = 0; j < Vl; j++)
                    d[j] = 0.0f;
            continue;
        }
        const float lse = rowmax[n] + (float)log((double)sumexp[n]);
        losses[n] = lse - tlogit[n];
        if (!d)
            continue;
        /* same-index read then write: safe in place */
#pragma omp simd
        for (int j = 0; j < v_valid; j++)
            d[j] = dscale * loco__expf(x[j] - lse);
        for (int j = v_valid; j < Vl; j++)
            d[j] = 0.0f;
        const int yl = local_target(targets[n], v_lo, v_valid);
        if (yl >= 0)
            d[yl] -= dscale;
    }
}
