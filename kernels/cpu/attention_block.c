/* Blockwise attention for context parallelism (ring attention): one block of
 * query rows against one block of key/value rows at global positions q_pos
 * and k_pos; blocks merge by the log-sum-exp rule, and the backward
 * (FlashAttention-2) recomputes the probabilities from the final
 * log-sum-exp and delta instead of storing them.
 *
 * No BLAS: calls from inside OpenMP regions would fight OpenBLAS's own
 * threads, and the causal ragged edge would need masking afterwards. The
 * forward gives each (batch, head, query row) to one thread, streaming keys
 * through an online softmax in tiles; the backward gives each (batch, head)
 * to one thread, which then owns those dk and dv rows. Every sum runs in a
 * fixed order, so the bits do not depend on the number of threads. */
#include <math.h>

#include "kernels/kernels.h"
#include "kernels/cpu/vmath.h"

/* Keys per tile: the forward rescales its running sums once per tile. */
enum { KEY_TILE = 64 };

/* Below this much work (query rows x keys x head size) a call runs on one
 * thread. */
#define BLK_PARALLEL_MIN 65536L

/* One call's operands and geometry (the kernels' arguments, bundled). */
typedef struct {
    const float *q, *k, *v;
    int q_ld, kv_ld;
    int B, Tq, Tk, C, NH, hs;
    int q_pos, k_pos;
    bool causal;
    float scale;
} blk_args;

static inline int imin(int a, int b) { return a < b ? a : b; }

/* Query row i sees keys [0, n) of the block: causal by global position. */
static inline int visible(const blk_args *a, int i)
{
    if (!a->causal)
        return a->Tk;
    const long n = (long)a->q_pos + i - a->k_pos + 1;
    return n < 0 ? 0 : n > a->Tk ? a->Tk : (int)n;
}

/* True when no query row of the block sees any of its keys. */
static inline bool fully_masked(const blk_args *a)
{
    return a->Tq <= 0 || a->Tk <= 0 || visible(a, a->Tq - 1) == 0;
}

static inline float dot(const float *restrict x, const float *restrict y, int n)
{
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int d = 0; d < n; d++)
        s += x[d] * y[d];
    return s;
}

/* y += a x */
static inline void axpy(float *restrict y, float a, const float *restrict x, int n)
{
#pragma omp simd
    for (int d = 0; d < n; d++)
        y[d] += a * x[d];
}

static inline void scal(float *restrict y, float a, int n)
{
#pragma omp simd
    for (int d = 0; d < n; d++)
        y[d] *= a;
}

/* Row (b, t) of a (B, T, *) matrix with row stride ld, at head h. */
static inline size_t at(int b, int t, int T, int ld, int h, int hs)
{
    return ((size_t)b * T + t) * ld + (size_t)h * hs;
}

/* o (hs) = softmax(scale q K[0..n)^T) V[0..n) for one query row, with the
 * running max m and sum l rescaled once per tile; returns the row's lse
 * (-INFINITY and o = 0 when n == 0). */
static float fwd_row(float *restrict o, const float *restrict q, const float *k, const float *v,
                     int n, const blk_args *a)
{
    const int hs = a->hs;
    float m = -INFINITY, l = 0.0f, s[KEY_TILE];
    for (int d = 0; d < hs; d++)
        o[d] = 0.0f;
    for (int j0 = 0; j0 < n; j0 += KEY_TILE) {
        const int jn = imin(KEY_TILE, n - j0);
        float mx = m;
        for (int j = 0; j < jn; j++) {
            s[j] = a->scale * dot(q, k + (size_t)(j0 + j) * a->kv_ld, hs);
            mx = fmaxf(mx, s[j]);
        }
        const float corr = expf(m - mx); /* 0 on the first tile (m = -inf) */
        l *= corr;
        scal(o, corr, hs);
#pragma omp simd reduction(+ : l)
        for (int j = 0; j < jn; j++) {
            s[j] = loco__expf(s[j] - mx);
            l += s[j];
        }
        for (int j = 0; j < jn; j++)
            axpy(o, s[j], v + (size_t)(j0 + j) * a->kv_ld, hs);
        m = mx;
    }
    if (n == 0)
        return -INFINITY;
    scal(o, 1.0f / l, hs);
    return m + logf(l);
}

void loco_attention_block_fwd(float *out, float *lse, const float *q, int q_ld, const float *k,
                              const float *v, int kv_ld, int B, int Tq, int Tk, int C, int NH,
                              int q_pos, int k_pos, bool causal)
{
    const int hs = C / NH;
    const blk_args a = {q, k, v, q_ld, kv_ld, B, Tq, Tk, C, NH, hs,
                        q_pos, k_pos, causal, 1.0f / sqrtf((float)hs)};
    const long rows = (long)B * NH * Tq;
    /* A fully masked block costs only the writes of zeros and -inf. */
    const long work = fully_masked(&a) ? 0 : rows * Tk * hs;
#pragma omp parallel for schedule(static) if (work > BLK_PARALLEL_MIN)
    for (long r = 0; r < rows; r++) {
        const int i = (int)(r % Tq), h = (int)(r / Tq % NH), b = (int)(r / Tq / NH);
        lse[r] = fwd_row(out + at(b, i, Tq, C, h, hs), q + at(b, i, Tq, q_ld, h, hs),
                         k + at(b, 0, Tk, kv_ld, h, hs), v + at(b, 0, Tk, kv_ld, h, hs),
                         visible(&a, i), &a);
    }
}

/* (o, l1) <- the union of (o, l1) and (bo, l2), both normalised, l1 and l2
 * finite: weights exp(l - lse) of the merged lse. */
static float merge_row(float *restrict o, float l1, const float *restrict bo, float l2, int hs)
{
    const float m = fmaxf(l1, l2);
    const float l = m + log1pf(expf(-fabsf(l1 - l2)));
    const float w1 = expf(l1 - l), w2 = expf(l2 - l);
#pragma omp simd
    for (int d = 0; d < hs; d++)
        o[d] = w1 * o[d] + w2 * bo[d];
    return l;
}

void loco_attention_merge(float *out, float *lse, const float *blk_out, const float *blk_lse,
                          int B, int T, int C, int NH)
{
    const int hs = C / NH;
    const long rows = (long)B * NH * T;
#pragma omp parallel for schedule(static) if (rows * hs > BLK_PARALLEL_MIN)
    for (long r = 0; r < rows; r++) {
        const int t = (int)(r % T), h = (int)(r / T % NH), b = (int)(r / T / NH);
        float *o = out + at(b, t, T, C, h, hs);
        const float *bo = blk_out + at(b, t, T, C, h, hs);
        if (blk_lse[r] == -INFINITY)
            continue;
        if (lse[r] == -INFINITY) {
            for (int d = 0; d < hs; d++)
                o[d] = bo[d];
            lse[r] = blk_lse[r];
            continue;
        }
        lse[r] = merge_row(o, lse[r], bo, blk_lse[r], hs);
    }
}

void loco_attention_delta(float *delta, const float *dout, const float *out, int B, int T, int C,
                          int NH)
{
    const int hs = C / NH;
    const long rows = (long)B * NH * T;
#pragma omp parallel for schedule(static) if (rows * hs > BLK_PARALLEL_MIN)
    for (long r = 0; r < rows; r++) {
        const int t = (int)(r % T), h = (int)(r / T % NH), b = (int)(r / T / NH);
        const size_t o = at(b, t, T, C, h, hs);
        delta[r] = dot(dout + o, out + o, hs);
    }
}

/* The gradients of one (batch, head): its query rows in order, each over
 * its visible keys in tiles (scores and dP first, then the updates). */
static void bwd_head(float *dq, int dq_ld, float *dk, float *dv, int dkv_ld, const float *dout,
                     const float *lse, const float *delta, const blk_args *a, int b, int h)
{
    const int hs = a->hs;
    const float *k = a->k + at(b, 0, a->Tk, a->kv_ld, h, hs);
    const float *v = a->v + at(b, 0, a->Tk, a->kv_ld, h, hs);
    float *dkh = dk + at(b, 0, a->Tk, dkv_ld, h, hs), *dvh = dv + at(b, 0, a->Tk, dkv_ld, h, hs);
    float p[KEY_TILE], ds[KEY_TILE];
    for (int i = 0; i < a->Tq; i++) {
        const int n = visible(a, i);
        const size_t r = ((size_t)b * a->NH + h) * a->Tq + i;
        const float L = lse[r], D = delta[r];
        const float *qi = a->q + at(b, i, a->Tq, a->q_ld, h, hs);
        const float *gi = dout + at(b, i, a->Tq, a->C, h, hs);
        float *dqi = dq + at(b, i, a->Tq, dq_ld, h, hs);
        for (int j0 = 0; j0 < n; j0 += KEY_TILE) {
            const int jn = imin(KEY_TILE, n - j0);
            for (int j = 0; j < jn; j++) {
                const size_t kj = (size_t)(j0 + j) * a->kv_ld;
                p[j] = a->scale * dot(qi, k + kj, hs);
                ds[j] = dot(gi, v + kj, hs);
            }
#pragma omp simd
            for (int j = 0; j < jn; j++) {
                p[j] = loco__expf(p[j] - L);
                ds[j] = a->scale * p[j] * (ds[j] - D); /* scale folded into dS */
            }
            for (int j = 0; j < jn; j++) {
                const size_t kj = (size_t)(j0 + j) * a->kv_ld, gj = (size_t)(j0 + j) * dkv_ld;
                axpy(dvh + gj, p[j], gi, hs);
                axpy(dqi, ds[j], k + kj, hs);
                axpy(dkh + gj, ds[j], qi, hs);
            }
        }
    }
}

void loco_attention_block_bwd(float *dq, int dq_ld, float *dk, float *dv, int dkv_ld,
                              const float *dout, const float *lse, const float *delta,
                              const float *q, int q_ld, const float *k, const float *v, int kv_ld,
                              int B, int Tq, int Tk, int C, int NH, int q_pos, int k_pos,
                              bool causal)
{
    const int hs = C / NH;
    const blk_args a = {q, k, v, q_ld, kv_ld, B, Tq, Tk, C, NH, hs,
                        q_pos, k_pos, causal, 1.0f / sqrtf((float)hs)};
    if (fully_masked(&a))
        return;
    const int heads = B * NH;
#pragma omp parallel for schedule(static) if ((long)heads * Tq * Tk * hs > BLK_PARALLEL_MIN)
    for (int bh = 0; bh < heads; bh++)
        bwd_head(dq, dq_ld, dk, dv, dkv_ld, dout, lse, delta, &a, bh / NH, bh % NH);
}
