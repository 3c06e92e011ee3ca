/* Blockwise attention for context parallelism (ring attention): one block of
 * query rows against one block of key/value rows at global positions q_pos
 * and k_pos; blocks merge by the log-sum-exp rule, and the backward
 * (FlashAttention-2) recomputes the probabilities from the final
 * log-sum-exp and delta instead of storing them.
 *
 * As in attention.c, the products go through OpenBLAS one (batch, head,
 * block of ROW_BLOCK query rows) at a time, called outside OpenMP regions
 * (inside one they would fight OpenBLAS's own threads); the row softmax and
 * its backward run in an OpenMP loop over the head's rows in between, on a
 * (Tq, keys) scratch allocated once per call. A row block only touches the
 * keys its last row sees, so the diagonal causal block skips most of its
 * masked half; the entries past a row's last visible key are zeroed before
 * the products that read them. OpenBLAS does not split the inner dimension
 * over threads and every other sum runs in a fixed order, so the bits do
 * not depend on the number of threads.
 *
 * Without memory for the scratch the kernels fall back to scalar loops that
 * need none: each (batch, head, query row) streams its keys through an
 * online softmax in tiles, and the backward gives each (batch, kv head) to
 * one thread. Same results within rounding, not the same bits.
 *
 * Grouped-query attention: NKV key/value heads, query head h reads kv head
 * h / (NH/NKV); GPT-2's multi-head attention is NKV = NH. */
#include <cblas.h>
#include <math.h>

#include "core/core.h"
#include "kernels/kernels.h"
#include "kernels/cpu/vmath.h"

/* Query rows per BLAS product: smaller blocks skip more of the diagonal
 * block's masked half, larger ones run BLAS more efficiently. */
enum { ROW_BLOCK = 64 };

/* Keys per tile of the scalar path: its forward rescales its running sums
 * once per tile. */
enum { KEY_TILE = 64 };

/* Below this much work (query rows x keys x head size) a scalar loop runs
 * on one thread. */
#define BLK_PARALLEL_MIN 65536L

/* Below this many scratch entries a head's row loop runs on one thread. */
#define ROWS_PARALLEL_MIN 16384L

/* One call's operands and geometry (the kernels' arguments, bundled); C =
 * NH * hs is the row of out and dout, and query head h reads kv head
 * h / group (grouped-query attention, group = NH / NKV). */
typedef struct {
    const float *q, *k, *v;
    int q_ld, kv_ld;
    int B, Tq, Tk, C, NH, NKV, group, hs;
    int q_pos, k_pos;
    bool causal;
    float scale;
} blk_args;

static blk_args blk_make(const float *q, int q_ld, const float *k, const float *v, int kv_ld,
                         int B, int Tq, int Tk, int NH, int NKV, int hs, int q_pos, int k_pos,
                         bool causal)
{
    return (blk_args){q,  k,     v,     q_ld,   kv_ld, B, Tq, Tk, NH * hs, NH, NKV, NH / NKV,
                      hs, q_pos, k_pos, causal, 1.0f / sqrtf((float)hs)};
}

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

/* Keys the products of query row i's row block cover: those its last row
 * sees (rows see more keys further down). */
static inline int block_keys(const blk_args *a, int i)
{
    return visible(a, imin(i / ROW_BLOCK * ROW_BLOCK + ROW_BLOCK, a->Tq) - 1);
}

/* Row (b, t) of a (B, T, *) matrix with row stride ld, at head h. */
static inline size_t at(int b, int t, int T, int ld, int h, int hs)
{
    return ((size_t)b * T + t) * ld + (size_t)h * hs;
}

/* Row r = (b*NH + h)*Tq + i of the (B,NH,Tq) statistics: head (b, h)'s. */
static inline size_t stat_at(const blk_args *a, int b, int h)
{
    return ((size_t)b * a->NH + h) * a->Tq;
}

/* ------------------------------------------------------------ BLAS path */

/* In place: row[0..n) scaled scores -> probabilities, row[n..e) = 0 (the
 * masked part its row block's products read); returns the lse, -INFINITY
 * (with a zero row) when n == 0. */
static float softmax_row(float *restrict row, int n, int e)
{
    float m = -INFINITY, s = 0.0f;
#pragma omp simd reduction(max : m)
    for (int j = 0; j < n; j++)
        m = row[j] > m ? row[j] : m;
#pragma omp simd reduction(+ : s)
    for (int j = 0; j < n; j++) {
        row[j] = loco__expf(row[j] - m);
        s += row[j];
    }
    const float inv = n > 0 ? 1.0f / s : 0.0f;
#pragma omp simd
    for (int j = 0; j < n; j++)
        row[j] *= inv;
    for (int j = n; j < e; j++)
        row[j] = 0.0f;
    return n > 0 ? m + logf(s) : -INFINITY;
}

/* One (batch, head): S = scale Q K^T, row softmax (the lse), O = P V, over
 * S (Tq, ld) scratch. Row blocks that see no key get O = 0 directly. */
static void fwd_head(float *out, float *lse, float *S, int ld, const blk_args *a, int b, int h)
{
    const int hs = a->hs, Tq = a->Tq;
    const float *q = a->q + at(b, 0, Tq, a->q_ld, h, hs);
    const float *k = a->k + at(b, 0, a->Tk, a->kv_ld, h / a->group, hs);
    const float *v = a->v + at(b, 0, a->Tk, a->kv_ld, h / a->group, hs);
    float *o = out + at(b, 0, Tq, a->C, h, hs), *l = lse + stat_at(a, b, h);
    for (int t0 = 0; t0 < Tq; t0 += ROW_BLOCK) {
        const int m = imin(ROW_BLOCK, Tq - t0), n = block_keys(a, t0);
        if (n > 0)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, hs, a->scale,
                        q + (size_t)t0 * a->q_ld, a->q_ld, k, a->kv_ld, 0.0f,
                        S + (size_t)t0 * ld, ld);
    }
#pragma omp parallel for schedule(static) if ((long)Tq * ld > ROWS_PARALLEL_MIN)
    for (int i = 0; i < Tq; i++)
        l[i] = softmax_row(S + (size_t)i * ld, visible(a, i), block_keys(a, i));
    for (int t0 = 0; t0 < Tq; t0 += ROW_BLOCK) {
        const int m = imin(ROW_BLOCK, Tq - t0), n = block_keys(a, t0);
        if (n > 0) {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, hs, n, 1.0f,
                        S + (size_t)t0 * ld, ld, v, a->kv_ld, 0.0f, o + (size_t)t0 * a->C,
                        a->C);
            continue;
        }
        for (int i = t0; i < t0 + m; i++)
            for (int d = 0; d < hs; d++)
                o[(size_t)i * a->C + d] = 0.0f;
    }
}

/* In place: p[0..n) scaled scores -> P = exp(S - L), ds[0..n) dP -> scale
 * * dS = scale P (dP - D) (the scale of dQ and dK folded in); both zero on
 * [n, e), the masked part its row block's products read. */
static void grad_row(float *restrict p, float *restrict ds, float L, float D, int n, int e,
                     float scale)
{
#pragma omp simd
    for (int j = 0; j < n; j++) {
        p[j] = loco__expf(p[j] - L);
        ds[j] = scale * p[j] * (ds[j] - D);
    }
    for (int j = n; j < e; j++)
        p[j] = ds[j] = 0.0f;
}

/* One (batch, head)'s gradients, over P and dS (Tq, ld) scratch: P and dP
 * = dO V^T per row block, dS per row, then per row block dV += P^T dO,
 * dQ += dS K, dK += dS^T Q. */
static void bwd_head(float *dq, int dq_ld, float *dk, float *dv, int dkv_ld, const float *dout,
                     const float *lse, const float *delta, float *P, float *dS, int ld,
                     const blk_args *a, int b, int h)
{
    const int hs = a->hs, Tq = a->Tq, C = a->C;
    const float *q = a->q + at(b, 0, Tq, a->q_ld, h, hs);
    const float *k = a->k + at(b, 0, a->Tk, a->kv_ld, h / a->group, hs);
    const float *v = a->v + at(b, 0, a->Tk, a->kv_ld, h / a->group, hs);
    const float *g = dout + at(b, 0, Tq, C, h, hs);
    const float *L = lse + stat_at(a, b, h), *D = delta + stat_at(a, b, h);
    dq += at(b, 0, Tq, dq_ld, h, hs);
    dk += at(b, 0, a->Tk, dkv_ld, h / a->group, hs);
    dv += at(b, 0, a->Tk, dkv_ld, h / a->group, hs);
    for (int t0 = 0; t0 < Tq; t0 += ROW_BLOCK) {
        const int m = imin(ROW_BLOCK, Tq - t0), n = block_keys(a, t0);
        const size_t r = (size_t)t0 * ld;
        if (n == 0)
            continue;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, hs, a->scale,
                    q + (size_t)t0 * a->q_ld, a->q_ld, k, a->kv_ld, 0.0f, P + r, ld);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, hs, 1.0f, g + (size_t)t0 * C,
                    C, v, a->kv_ld, 0.0f, dS + r, ld);
    }
#pragma omp parallel for schedule(static) if ((long)Tq * ld > ROWS_PARALLEL_MIN)
    for (int i = 0; i < Tq; i++)
        grad_row(P + (size_t)i * ld, dS + (size_t)i * ld, L[i], D[i], visible(a, i),
                 block_keys(a, i), a->scale);
    for (int t0 = 0; t0 < Tq; t0 += ROW_BLOCK) {
        const int m = imin(ROW_BLOCK, Tq - t0), n = block_keys(a, t0);
        const size_t r = (size_t)t0 * ld;
        if (n == 0)
            continue;
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, hs, m, 1.0f, P + r, ld,
                    g + (size_t)t0 * C, C, 1.0f, dv, dkv_ld);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, hs, n, 1.0f, dS + r, ld, k,
                    a->kv_ld, 1.0f, dq + (size_t)t0 * dq_ld, dq_ld);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, hs, m, 1.0f, dS + r, ld,
                    q + (size_t)t0 * a->q_ld, a->q_ld, 1.0f, dk, dkv_ld);
    }
}

/* ------------------------------------------- scalar path (no scratch) */

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

/* The whole forward, one thread per (batch, head, query row). */
static void fwd_scalar(float *out, float *lse, const blk_args *a)
{
    const int Tq = a->Tq, NH = a->NH, hs = a->hs;
    const long rows = (long)a->B * NH * Tq;
    /* A fully masked block costs only the writes of zeros and -inf. */
    const long work = fully_masked(a) ? 0 : rows * a->Tk * hs;
#pragma omp parallel for schedule(static) if (work > BLK_PARALLEL_MIN)
    for (long r = 0; r < rows; r++) {
        const int i = (int)(r % Tq), h = (int)(r / Tq % NH), b = (int)(r / Tq / NH);
        lse[r] = fwd_row(out + at(b, i, Tq, a->C, h, hs), a->q + at(b, i, Tq, a->q_ld, h, hs),
                         a->k + at(b, 0, a->Tk, a->kv_ld, h / a->group, hs),
                         a->v + at(b, 0, a->Tk, a->kv_ld, h / a->group, hs), visible(a, i), a);
    }
}

/* The gradients of one (batch, head): its query rows in order, each over
 * its visible keys in tiles (scores and dP first, then the updates). */
static void bwd_head_scalar(float *dq, int dq_ld, float *dk, float *dv, int dkv_ld,
                            const float *dout, const float *lse, const float *delta,
                            const blk_args *a, int b, int h)
{
    const int hs = a->hs, kh = h / a->group;
    const float *k = a->k + at(b, 0, a->Tk, a->kv_ld, kh, hs);
    const float *v = a->v + at(b, 0, a->Tk, a->kv_ld, kh, hs);
    float *dkh = dk + at(b, 0, a->Tk, dkv_ld, kh, hs), *dvh = dv + at(b, 0, a->Tk, dkv_ld, kh, hs);
    float p[KEY_TILE], ds[KEY_TILE];
    for (int i = 0; i < a->Tq; i++) {
        const int n = visible(a, i);
        const size_t r = stat_at(a, b, h) + i;
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

/* ------------------------------------------------------------ the API */

void loco_attention_block_gqa_fwd(float *out, float *lse, const float *q, int q_ld,
                                  const float *k, const float *v, int kv_ld, int B, int Tq,
                                  int Tk, int NH, int NKV, int hs, int q_pos, int k_pos,
                                  bool causal)
{
    const blk_args a = blk_make(q, q_ld, k, v, kv_ld, B, Tq, Tk, NH, NKV, hs, q_pos, k_pos,
                                causal);
    /* The scratch holds the most keys any row sees; a fully masked block
     * needs none and costs the scalar path only its zeros and -inf. */
    const int ld = fully_masked(&a) ? 0 : visible(&a, Tq - 1);
    float *S = ld > 0 ? loco_alloc((size_t)Tq * ld * sizeof *S) : NULL;
    if (!S) {
        fwd_scalar(out, lse, &a);
        return;
    }
    for (int bh = 0; bh < B * NH; bh++)
        fwd_head(out, lse, S, ld, &a, bh / NH, bh % NH);
    loco_free(S);
}

void loco_attention_block_fwd(float *out, float *lse, const float *q, int q_ld, const float *k,
                              const float *v, int kv_ld, int B, int Tq, int Tk, int C, int NH,
                              int q_pos, int k_pos, bool causal)
{
    loco_attention_block_gqa_fwd(out, lse, q, q_ld, k, v, kv_ld, B, Tq, Tk, NH, NH, C / NH,
                                 q_pos, k_pos, causal);
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

/* The query heads of a group add into their kv head's dk, dv one after
 * another, in head order: the BLAS path runs every head in turn, the
 * scalar one gives each (batch, kv head) to one thread. */
void loco_attention_block_gqa_bwd(float *dq, int dq_ld, float *dk, float *dv, int dkv_ld,
                                  const float *dout, const float *lse, const float *delta,
                                  const float *q, int q_ld, const float *k, const float *v,
                                  int kv_ld, int B, int Tq, int Tk, int NH, int NKV, int hs,
                                  int q_pos, int k_pos, bool causal)
{
    const blk_args a = blk_make(q, q_ld, k, v, kv_ld, B, Tq, Tk, NH, NKV, hs, q_pos, k_pos,
                                causal);
    if (fully_masked(&a))
        return;
    const int ld = visible(&a, Tq - 1), heads = B * NH, kv_heads = B * NKV;
    float *P = loco_alloc((size_t)2 * Tq * ld * sizeof *P);
    if (P) {
        for (int bh = 0; bh < heads; bh++)
            bwd_head(dq, dq_ld, dk, dv, dkv_ld, dout, lse, delta, P, P + (size_t)Tq * ld, ld, &a,
                     bh / NH, bh % NH);
        loco_free(P);
        return;
    }
    /* No scratch: each (batch, kv head) on one thread, which owns its dk, dv. */
#pragma omp parallel for schedule(static) if ((long)heads * Tq * Tk * hs > BLK_PARALLEL_MIN)
    for (int bk = 0; bk < kv_heads; bk++)
        for (int h = bk % NKV * a.group; h < (bk % NKV + 1) * a.group; h++)
            bwd_head_scalar(dq, dq_ld, dk, dv, dkv_ld, dout, lse, delta, &a, bk / NKV, h);
}

void loco_attention_block_bwd(float *dq, int dq_ld, float *dk, float *dv, int dkv_ld,
                              const float *dout, const float *lse, const float *delta,
                              const float *q, int q_ld, const float *k, const float *v, int kv_ld,
                              int B, int Tq, int Tk, int C, int NH, int q_pos, int k_pos,
                              bool causal)
{
    loco_attention_block_gqa_bwd(dq, dq_ld, dk, dv, dkv_ld, dout, lse, delta, q, q_ld, k, v,
                                 kv_ld, B, Tq, Tk, NH, NH, C / NH, q_pos, k_pos, causal);
}
