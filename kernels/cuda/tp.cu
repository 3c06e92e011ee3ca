/* Tensor-parallel (Megatron) pieces: the vocabulary-parallel embedding and
 * cross-entropy of one tp rank's slice, the position embedding of a run of
 * rows, a row-parallel layer's bias. Each is a template over the storage
 * of the activations and weights (float, or bf16 for the _bf16 entry
 * points: loaded to fp32, computed in fp32, rounded once on the store);
 * gradients of weights are fp32 in both. The backward kernels accumulate
 * every gradient row in ascending row order, as the CPU twins do, with no
 * atomics (the same bits). */
#include <math.h>

#include "kernels/cuda/common.cuh"

enum { TP_THREADS = 256, TP_XENT_THREADS = 512, TP_BUCKETS = 64 };

#define GRID_STRIDE(i, n)                                                                    \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                  \
         i += (size_t)gridDim.x * blockDim.x)

/* Row of this rank's wte slice holding token t, or -1 when it is another
 * rank's (or no one's). */
__device__ __forceinline__ long tp_local_row(int32_t t, int v_lo, int v_n) {
    return t >= v_lo && (long)t - v_lo < v_n ? (long)t - v_lo : -1;
}

/* The target's column in this slice, or -1 when it is ignored (negative),
 * another rank's, or padding. */
__device__ __forceinline__ int tp_local_target(int32_t y, int v_lo, int v_valid) {
    return y >= 0 && y >= v_lo && (long)y - v_lo < v_valid ? (int)(y - v_lo) : -1;
}

/* ---------------------------------------------------------------- embedding */

/* out (N,C), one thread per element. */
template <typename S>
__global__ void embed_fwd_kernel(S *out, const int32_t *tok, const S *wte, int v_lo, int v_n,
                                 int C, size_t n) {
    GRID_STRIDE(i, n) {
        const long r = tp_local_row(tok[i / C], v_lo, v_n);
        st(out + i, r < 0 ? 0.0f : ld(wte + (size_t)r * C + i % C));
    }
}

/* dwte (v_n,C): thread (c, k) owns channel c of the local rows congruent to
 * k modulo TP_BUCKETS and walks every row n in order, so each dwte row
 * accumulates in ascending n; a warp is 32 channels of one bucket. */
template <typename S>
__global__ void embed_bwd_kernel(float *dwte, const S *dout, const int32_t *tok, int v_lo,
                                 int v_n, int N, int C) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    const int k = blockIdx.y * blockDim.y + threadIdx.y;
    if (c >= C)
        return;
    for (int n = 0; n < N; n++) {
        const long r = tp_local_row(tok[n], v_lo, v_n);
        if (r >= 0 && r % TP_BUCKETS == k)
            dwte[(size_t)r * C + c] += ld(dout + (size_t)n * C + c);
    }
}

/* ------------------------------------------------------- position embedding */

/* out (N,C) += wpe rows (row0 + i) % T, one thread per element. */
template <typename S>
__global__ void pos_fwd_kernel(S *out, const S *wpe, int row0, int T, int C, size_t n) {
    GRID_STRIDE(i, n) {
        const size_t t = ((size_t)row0 + i / C) % (size_t)T;
        st(out + i, ld(out + i) + ld(wpe + t * C + i % C));
    }
}

/* dwpe (T,C): one thread per element (t, c), adding rows i0, i0 + T, ...
 * in that order. */
template <typename S>
__global__ void pos_bwd_kernel(float *dwpe, const S *dout, int t0, int N, int T, int C) {
    const size_t n = (size_t)T * C;
    GRID_STRIDE(j, n) {
        const int t = (int)(j / C), c = (int)(j % C);
        float acc = dwpe[j];
        for (long i = (t - t0 + T) % T; i < N; i += T)
            acc += ld(dout + (size_t)i * C + c);
        dwpe[j] = acc;
    }
}

/* --------------------------------------------------------------------- bias */

template <typename S> __global__ void bias_fwd_kernel(S *out, const S *bias, int OC, size_t n) {
    GRID_STRIDE(i, n) st(out + i, ld(out + i) + ld(bias + i % OC));
}

/* ------------------------------------------- vocabulary-parallel cross-entropy
 * One block per row, threads striding over the row's columns. */

template <typename S>
__global__ void xent_vp_max_kernel(float *rowmax, const S *logits, int Vl, int v_valid) {
    __shared__ float fshm[32];
    const S *x = logits + (size_t)blockIdx.x * Vl;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < v_valid; j += blockDim.x)
        m = fmaxf(m, ld(x + j));
    m = block_max(m, fshm);
    if (threadIdx.x == 0)
        rowmax[blockIdx.x] = m;
}

/* The sum of exponentials in double, as on the CPU. */
template <typename S>
__global__ void xent_vp_sum_kernel(float *sumexp, float *tlogit, const S *logits,
                                   const float *rowmax, const int32_t *targets, int v_lo, int Vl,
                                   int v_valid) {
    __shared__ double dshm[32];
    const size_t n = blockIdx.x;
    const S *x = logits + n * Vl;
    const float m = rowmax[n];
    double acc = 0.0;
    for (int j = threadIdx.x; j < v_valid; j += blockDim.x)
        acc += (double)expf(ld(x + j) - m);
    acc = block_sum(acc, dshm);
    if (threadIdx.x == 0) {
        const int yl = tp_local_target(targets[n], v_lo, v_valid);
        sumexp[n] = (float)acc;
        tlogit[n] = yl >= 0 ? ld(x + yl) : 0.0f;
    }
}

/* dlogits may equal logits: each thread reads a column before writing it,
 * and the target's column is adjusted by the thread that owns it. */
template <typename S>
__global__ void xent_vp_finish_kernel(float *losses, S *dlogits, const S *logits,
                                      const float *rowmax, const float *sumexp,
                                      const float *tlogit, const int32_t *targets, int v_lo,
                                      int Vl, int v_valid, float dscale) {
    const size_t n = blockIdx.x;
    const S *x = logits + n * Vl;
    S *d = dlogits ? dlogits + n * Vl : NULL;
    if (targets[n] < 0) {
        if (threadIdx.x == 0)
            losses[n] = 0.0f;
        if (d)
            for (int j = threadIdx.x; j < Vl; j += blockDim.x)
                st(d + j, 0.0f);
        return;
    }
    const float lse = rowmax[n] + (float)log((double)sumexp[n]);
    if (threadIdx.x == 0)
        losses[n] = lse - tlogit[n];
    if (!d)
        return;
    const int yl = tp_local_target(targets[n], v_lo, v_valid);
    for (int j = threadIdx.x; j < Vl; j += blockDim.x) {
        float g = 0.0f;
        if (j < v_valid) {
            g = dscale * expf(ld(x + j) - lse);
            if (j == yl)
                g -= dscale;
        }
        st(d + j, g);
    }
}

/* ---------------------------------------------------------------- launchers */

template <typename S>
static int embed_fwd(S *out, const int32_t *tok, const S *wte, int v_lo, int v_n, int N, int C,
                     loco_stream s) {
    const size_t n = (size_t)N * C;
    if (!n)
        return 0;
    embed_fwd_kernel<<<grid_for(n, TP_THREADS), TP_THREADS, 0, s>>>(out, tok, wte, v_lo, v_n, C,
                                                                    n);
    CUDA_LAUNCHED("embed_fwd");
    return 0;
}

template <typename S>
static int embed_bwd(float *dwte, const S *dout, const int32_t *tok, int v_lo, int v_n, int N,
                     int C, loco_stream s) {
    if ((size_t)N * C == 0 || v_n <= 0)
        return 0;
    const dim3 th(32, 8), grid((C + 31) / 32, TP_BUCKETS / 8);
    embed_bwd_kernel<<<grid, th, 0, s>>>(dwte, dout, tok, v_lo, v_n, N, C);
    CUDA_LAUNCHED("embed_bwd");
    return 0;
}

template <typename S>
static int pos_fwd(S *out, const S *wpe, int row0, int N, int T, int C, loco_stream s) {
    const size_t n = (size_t)N * C;
    if (!n)
        return 0;
    pos_fwd_kernel<<<grid_for(n, TP_THREADS), TP_THREADS, 0, s>>>(out, wpe, row0, T, C, n);
    CUDA_LAUNCHED("pos_fwd");
    return 0;
}

template <typename S>
static int pos_bwd(float *dwpe, const S *dout, int row0, int N, int T, int C, loco_stream s) {
    const size_t n = (size_t)T * C;
    if (!n || N <= 0)
        return 0;
    const int t0 = (int)((long)row0 % T); /* position of row 0 */
    pos_bwd_kernel<<<grid_for(n, TP_THREADS), TP_THREADS, 0, s>>>(dwpe, dout, t0, N, T, C);
    CUDA_LAUNCHED("pos_bwd");
    return 0;
}

template <typename S> static int bias_fwd(S *out, const S *bias, int N, int OC, loco_stream s) {
    const size_t n = (size_t)N * OC;
    if (!n)
        return 0;
    bias_fwd_kernel<<<grid_for(n, TP_THREADS), TP_THREADS, 0, s>>>(out, bias, OC, n);
    CUDA_LAUNCHED("bias_fwd");
    return 0;
}

template <typename S>
static int xent_vp_max(float *rowmax, const S *logits, int N, int Vl, int v_valid,
                       loco_stream s) {
    if (N <= 0)
        return 0;
    xent_vp_max_kernel<<<N, TP_XENT_THREADS, 0, s>>>(rowmax, logits, Vl, v_valid);
    CUDA_LAUNCHED("xent_vp_max");
    return 0;
}

template <typename S>
static int xent_vp_sum(float *sumexp, float *tlogit, const S *logits, const float *rowmax,
                       const int32_t *targets, int v_lo, int N, int Vl, int v_valid,
                       loco_stream s) {
    if (N <= 0)
        return 0;
    xent_vp_sum_kernel<<<N, TP_XENT_THREADS, 0, s>>>(sumexp, tlogit, logits, rowmax, targets,
                                                     v_lo, Vl, v_valid);
    CUDA_LAUNCHED("xent_vp_sum");
    return 0;
}

template <typename S>
static int xent_vp_finish(float *losses, S *dlogits, const S *logits, const float *rowmax,
                          const float *sumexp, const float *tlogit, const int32_t *targets,
                          int v_lo, int N, int Vl, int v_valid, float dscale, loco_stream s) {
    if (N <= 0)
        return 0;
    xent_vp_finish_kernel<<<N, TP_XENT_THREADS, 0, s>>>(losses, dlogits, logits, rowmax, sumexp,
                                                        tlogit, targets, v_lo, Vl, v_valid,
                                                        dscale);
    CUDA_LAUNCHED("xent_vp_finish");
    return 0;
}

/* ------------------------------------------------------ the C entry points */

extern "C" int loco_cuda_embed_fwd(float *out, const int32_t *tok, const float *wte, int v_lo,
                                   int v_n, int N, int C, loco_stream s) {
    return embed_fwd(out, tok, wte, v_lo, v_n, N, C, s);
}
extern "C" int loco_cuda_embed_fwd_bf16(loco_bf16 *out, const int32_t *tok, const loco_bf16 *wte,
                                        int v_lo, int v_n, int N, int C, loco_stream s) {
    return embed_fwd(bf(out), tok, bf(wte), v_lo, v_n, N, C, s);
}
extern "C" int loco_cuda_embed_bwd(float *dwte, const float *dout, const int32_t *tok, int v_lo,
                                   int v_n, int N, int C, loco_stream s) {
    return embed_bwd(dwte, dout, tok, v_lo, v_n, N, C, s);
}
extern "C" int loco_cuda_embed_bwd_bf16(float *dwte, const loco_bf16 *dout, const int32_t *tok,
                                        int v_lo, int v_n, int N, int C, loco_stream s) {
    return embed_bwd(dwte, bf(dout), tok, v_lo, v_n, N, C, s);
}
extern "C" int loco_cuda_pos_fwd(float *out, const float *wpe, int row0, int N, int T, int C,
                                 loco_stream s) {
    return pos_fwd(out, wpe, row0, N, T, C, s);
}
extern "C" int loco_cuda_pos_fwd_bf16(loco_bf16 *out, const loco_bf16 *wpe, int row0, int N, int T,
                                      int C, loco_stream s) {
    return pos_fwd(bf(out), bf(wpe), row0, N, T, C, s);
}
extern "C" int loco_cuda_pos_bwd(float *dwpe, const float *dout, int row0, int N, int T, int C,
                                 loco_stream s) {
    return pos_bwd(dwpe, dout, row0, N, T, C, s);
}
extern "C" int loco_cuda_pos_bwd_bf16(float *dwpe, const loco_bf16 *dout, int row0, int N, int T,
                                      int C, loco_stream s) {
    return pos_bwd(dwpe, bf(dout), row0, N, T, C, s);
}
extern "C" int loco_cuda_bias_fwd(float *out, const float *bias, int N, int OC, loco_stream s) {
    return bias_fwd(out, bias, N, OC, s);
}
extern "C" int loco_cuda_bias_fwd_bf16(loco_bf16 *out, const loco_bf16 *bias, int N, int OC,
                                       loco_stream s) {
    return bias_fwd(bf(out), bf(bias), N, OC, s);
}
extern "C" int loco_cuda_xent_vp_max(float *rowmax, const float *logits, int N, int Vl,
                                     int v_valid, loco_stream s) {
    return xent_vp_max(rowmax, logits, N, Vl, v_valid, s);
}
extern "C" int loco_cuda_xent_vp_max_bf16(float *rowmax, const loco_bf16 *logits, int N, int Vl,
                                          int v_valid, loco_stream s) {
    return xent_vp_max(rowmax, bf(logits), N, Vl, v_valid, s);
}
extern "C" int loco_cuda_xent_vp_sum(float *sumexp, float *tlogit, const float *logits,
                                     const float *rowmax, const int32_t *targets, int v_lo, int N,
                                     int Vl, int v_valid, loco_stream s) {
    return xent_vp_sum(sumexp, tlogit, logits, rowmax, targets, v_lo, N, Vl, v_valid, s);
}
extern "C" int loco_cuda_xent_vp_sum_bf16(float *sumexp, float *tlogit, const loco_bf16 *logits,
                                          const float *rowmax, const int32_t *targets, int v_lo,
                                          int N, int Vl, int v_valid, loco_stream s) {
    return xent_vp_sum(sumexp, tlogit, bf(logits), rowmax, targets, v_lo, N, Vl, v_valid, s);
}
extern "C" int loco_cuda_xent_vp_finish(float *losses, float *dlogits, const float *logits,
                                        const float *rowmax, const float *sumexp,
                                        const float *tlogit, const int32_t *targets, int v_lo,
                                        int N, int Vl, int v_valid, float dscale, loco_stream s) {
    return xent_vp_finish(losses, dlogits, logits, rowmax, sumexp, tlogit, targets, v_lo, N, Vl,
                          v_valid, dscale, s);
}
extern "C" int loco_cuda_xent_vp_finish_bf16(float *losses, loco_bf16 *dlogits,
                                             const loco_bf16 *logits, const float *rowmax,
                                             const float *sumexp, const float *tlogit,
                                             const int32_t *targets, int v_lo, int N, int Vl,
                                             int v_valid, float dscale, loco_stream s) {
    return xent_vp_finish(losses, bf(dlogits), bf(logits), rowmax, sumexp, tlogit, targets, v_lo,
                          N, Vl, v_valid, dscale, s);
}
