/* Fused causal attention, flash-attention style: the T x T matrix is never
 * stored. Forward: one thread per query row streams key/value tiles through
 * shared memory with an online softmax and saves the row's log-sum-exp.
 * Backward: the probabilities are recomputed from it, in two kernels so
 * that nothing is accumulated with atomics (deterministic): one thread per
 * key row sums dK and dV over the query tiles at or after it, one thread per
 * query row sums dQ over the key tiles at or before it.
 *
 * Math in fp32 on the CUDA cores (not tensor cores), head size padded with
 * zeros to 32, 64 or 128. */
#include <math.h>

#include "kernels/cuda/common.cuh"

enum { ROWS = 64 }; /* threads per block, one row each */

/* rows of the tile streamed past each thread's row */
template <int HS> struct tile {
    static constexpr int n = HS <= 64 ? 64 : 32;
};

/* sm[r][d] = rows r0 .. r0+rows-1 of a (T, *) matrix with row stride
 * `stride` starting at base, columns < hs; zeros past T or hs. */
template <int HS, typename T>
__device__ void load_rows(float *sm, const T *base, size_t stride, int r0, int rows, int T_,
                          int hs) {
    for (int e = threadIdx.x; e < rows * HS; e += blockDim.x) {
        const int r = e / HS, d = e % HS, t = r0 + r;
        sm[e] = t < T_ && d < hs ? ld(base + (size_t)t * stride + d) : 0.0f;
    }
}

template <int HS, typename T>
__global__ void __launch_bounds__(ROWS)
    attn_fwd_kernel(T *out, float *lse, const T *qkv, int T_, int C, int NH, float scale) {
    constexpr int KT = tile<HS>::n;
    extern __shared__ float sm[];
    float *Ks = sm, *Vs = sm + KT * HS;
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH, hs = C / NH;
    const int q0 = blockIdx.x * ROWS, i = q0 + threadIdx.x;
    const size_t C3 = 3 * (size_t)C;
    const T *base = qkv + (size_t)b * T_ * C3 + (size_t)h * hs;
    float q[HS], o[HS];
#pragma unroll
    for (int d = 0; d < HS; d++) {
        q[d] = i < T_ && d < hs ? ld(base + (size_t)i * C3 + d) * scale : 0.0f;
        o[d] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    const int last = min(q0 + ROWS, T_) - 1;
    for (int k0 = 0; k0 <= last; k0 += KT) {
        __syncthreads();
        load_rows<HS>(Ks, base + C, C3, k0, KT, T_, hs);
        load_rows<HS>(Vs, base + 2 * C, C3, k0, KT, T_, hs);
        __syncthreads();
        const int jn = i < T_ ? min(KT, i - k0 + 1) : 0;
        for (int jj = 0; jj < jn; jj++) {
            float s = 0.0f;
#pragma unroll
            for (int d = 0; d < HS; d++)
                s += q[d] * Ks[jj * HS + d];
            const float mn = fmaxf(m, s);
            const float corr = expf(m - mn), p = expf(s - mn);
            l = l * corr + p;
#pragma unroll
            for (int d = 0; d < HS; d++)
                o[d] = o[d] * corr + p * Vs[jj * HS + d];
            m = mn;
        }
    }
    if (i >= T_)
        return;
    lse[(size_t)bh * T_ + i] = m + logf(l);
    T *orow = out + ((size_t)b * T_ + i) * C + (size_t)h * hs;
    const float il = 1.0f / l;
#pragma unroll
    for (int d = 0; d < HS; d++)
        if (d < hs)
            st(orow + d, o[d] * il);
}

/* Dsum[bh, i] = sum_d dO[i, d] O[i, d]: the softmax backward's row term. */
template <typename T>
__global__ void attn_bwd_dsum_kernel(float *Dsum, const T *dout, const T *out, int B, int T_,
                                     int C, int NH) {
    const size_t r = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= (size_t)B * NH * T_)
        return;
    const int hs = C / NH;
    const size_t bh = r / T_, i = r % T_, b = bh / NH, h = bh % NH;
    const size_t off = (b * T_ + i) * C + h * hs;
    float s = 0.0f;
    for (int d = 0; d < hs; d++)
        s += ld(dout + off + d) * ld(out + off + d);
    Dsum[r] = s;
}

template <int HS, typename T>
__global__ void __launch_bounds__(ROWS)
    attn_bwd_dkv_kernel(T *dqkv, const T *dout, const T *qkv, const float *lse,
                        const float *Dsum, int T_, int C, int NH, float scale) {
    constexpr int QT = tile<HS>::n;
    extern __shared__ float sm[];
    float *Qs = sm, *dOs = Qs + QT * HS, *dk = dOs + QT * HS, *dv = dk + HS * ROWS;
    float *ls = dv + HS * ROWS, *Ds = ls + QT;
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH, hs = C / NH, tid = threadIdx.x;
    const int k0 = blockIdx.x * ROWS, j = k0 + tid;
    const size_t C3 = 3 * (size_t)C;
    const T *base = qkv + (size_t)b * T_ * C3 + (size_t)h * hs;
    const T *dobase = dout + (size_t)b * T_ * C + (size_t)h * hs;
    float k[HS], v[HS];
#pragma unroll
    for (int d = 0; d < HS; d++) {
        const bool in = j < T_ && d < hs;
        k[d] = in ? ld(base + (size_t)j * C3 + C + d) * scale : 0.0f;
        v[d] = in ? ld(base + (size_t)j * C3 + 2 * C + d) : 0.0f;
        dk[d * ROWS + tid] = 0.0f;
        dv[d * ROWS + tid] = 0.0f;
    }
    for (int i0 = k0; i0 < T_; i0 += QT) {
        __syncthreads();
        load_rows<HS>(Qs, base, C3, i0, QT, T_, hs);
        load_rows<HS>(dOs, dobase, C, i0, QT, T_, hs);
        for (int r = tid; r < QT; r += blockDim.x) {
            const bool in = i0 + r < T_;
            ls[r] = in ? lse[(size_t)bh * T_ + i0 + r] : 0.0f;
            Ds[r] = in ? Dsum[(size_t)bh * T_ + i0 + r] : 0.0f;
        }
        __syncthreads();
        const int ib = max(0, j - i0), ie = j < T_ ? min(QT, T_ - i0) : 0;
        for (int ii = ib; ii < ie; ii++) {
            float s = 0.0f, dp = 0.0f;
#pragma unroll
            for (int d = 0; d < HS; d++) {
                s += Qs[ii * HS + d] * k[d];
                dp += dOs[ii * HS + d] * v[d];
            }
            const float p = expf(s - ls[ii]);
            const float ds = p * (dp - Ds[ii]);
#pragma unroll
            for (int d = 0; d < HS; d++) {
                dv[d * ROWS + tid] += p * dOs[ii * HS + d];
                dk[d * ROWS + tid] += ds * Qs[ii * HS + d];
            }
        }
    }
    if (j >= T_)
        return;
    T *dkrow = dqkv + ((size_t)b * T_ + j) * C3 + C + (size_t)h * hs;
    T *dvrow = dkrow + C;
#pragma unroll
    for (int d = 0; d < HS; d++)
        if (d < hs) {
            st(dkrow + d, ld(dkrow + d) + dk[d * ROWS + tid] * scale);
            st(dvrow + d, ld(dvrow + d) + dv[d * ROWS + tid]);
        }
}

template <int HS, typename T>
__global__ void __launch_bounds__(ROWS)
    attn_bwd_dq_kernel(T *dqkv, const T *dout, const T *qkv, const float *lse, const float *Dsum,
                       int T_, int C, int NH, float scale) {
    constexpr int KT = tile<HS>::n;
    extern __shared__ float sm[];
    float *Ks = sm, *Vs = Ks + KT * HS, *dq = Vs + KT * HS;
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH, hs = C / NH, tid = threadIdx.x;
    const int q0 = blockIdx.x * ROWS, i = q0 + tid;
    const size_t C3 = 3 * (size_t)C;
    const T *base = qkv + (size_t)b * T_ * C3 + (size_t)h * hs;
    float q[HS], g[HS];
#pragma unroll
    for (int d = 0; d < HS; d++) {
        const bool in = i < T_ && d < hs;
        q[d] = in ? ld(base + (size_t)i * C3 + d) * scale : 0.0f;
        g[d] = in ? ld(dout + ((size_t)b * T_ + i) * C + (size_t)h * hs + d) : 0.0f;
        dq[d * ROWS + tid] = 0.0f;
    }
    const float li = i < T_ ? lse[(size_t)bh * T_ + i] : 0.0f;
    const float Di = i < T_ ? Dsum[(size_t)bh * T_ + i] : 0.0f;
    const int last = min(q0 + ROWS, T_) - 1;
    for (int k0 = 0; k0 <= last; k0 += KT) {
        __syncthreads();
        load_rows<HS>(Ks, base + C, C3, k0, KT, T_, hs);
        load_rows<HS>(Vs, base + 2 * C, C3, k0, KT, T_, hs);
        __syncthreads();
        const int jn = i < T_ ? min(KT, i - k0 + 1) : 0;
        for (int jj = 0; jj < jn; jj++) {
            float s = 0.0f, dp = 0.0f;
#pragma unroll
            for (int d = 0; d < HS; d++) {
                s += q[d] * Ks[jj * HS + d];
                dp += g[d] * Vs[jj * HS + d];
            }
            const float ds = expf(s - li) * (dp - Di);
#pragma unroll
            for (int d = 0; d < HS; d++)
                dq[d * ROWS + tid] += ds * Ks[jj * HS + d];
        }
    }
    if (i >= T_)
        return;
    T *dqrow = dqkv + ((size_t)b * T_ + i) * C3 + (size_t)h * hs;
#pragma unroll
    for (int d = 0; d < HS; d++)
        if (d < hs)
            st(dqrow + d, ld(dqrow + d) + dq[d * ROWS + tid] * scale);
}

template <int HS, typename T>
static int fwd_hs(T *out, float *lse, const T *qkv, int B, int T_, int C, int NH, loco_stream s) {
    const size_t smem = 2 * tile<HS>::n * HS * sizeof(float);
    CUDA_CHECK(cudaFuncSetAttribute(attn_fwd_kernel<HS, T>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const dim3 grid((T_ + ROWS - 1) / ROWS, B * NH);
    attn_fwd_kernel<HS, T><<<grid, ROWS, smem, s>>>(out, lse, qkv, T_, C, NH,
                                                    1.0f / sqrtf((float)(C / NH)));
    CUDA_LAUNCHED("attention_fwd");
    return 0;
}

template <int HS, typename T>
static int bwd_hs(T *dqkv, float *Dsum, const T *dout, const T *qkv, const float *lse, int B,
                  int T_, int C, int NH, loco_stream s) {
    const float scale = 1.0f / sqrtf((float)(C / NH));
    const dim3 grid((T_ + ROWS - 1) / ROWS, B * NH);
    const int n = tile<HS>::n;
    const size_t smem_kv = (2 * n * HS + 2 * HS * ROWS + 2 * n) * sizeof(float);
    const size_t smem_q = (2 * n * HS + HS * ROWS) * sizeof(float);
    CUDA_CHECK(cudaFuncSetAttribute(attn_bwd_dkv_kernel<HS, T>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_kv));
    CUDA_CHECK(cudaFuncSetAttribute(attn_bwd_dq_kernel<HS, T>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_q));
    attn_bwd_dkv_kernel<HS, T><<<grid, ROWS, smem_kv, s>>>(dqkv, dout, qkv, lse, Dsum, T_, C, NH,
                                                           scale);
    CUDA_LAUNCHED("attention_bwd (dk, dv)");
    attn_bwd_dq_kernel<HS, T><<<grid, ROWS, smem_q, s>>>(dqkv, dout, qkv, lse, Dsum, T_, C, NH,
                                                         scale);
    CUDA_LAUNCHED("attention_bwd (dq)");
    return 0;
}

static int check_shape(int B, int T_, int C, int NH) {
    if (B < 0 || T_ < 0 || NH <= 0 || C % NH != 0 || C / NH > 128 || C / NH < 1)
        return LOCO_ERR(LOCO_EINVAL, "attention: C=%d, NH=%d (head size must be 1..128)", C, NH);
    return 0;
}

template <typename T>
static int attention_fwd(T *out, float *lse, const T *qkv, int B, int T_, int C, int NH,
                         loco_stream s) {
    LOCO_CHECK(check_shape(B, T_, C, NH));
    if ((size_t)B * T_ == 0)
        return 0;
    const int hs = C / NH;
    if (hs <= 32)
        return fwd_hs<32, T>(out, lse, qkv, B, T_, C, NH, s);
    if (hs <= 64)
        return fwd_hs<64, T>(out, lse, qkv, B, T_, C, NH, s);
    return fwd_hs<128, T>(out, lse, qkv, B, T_, C, NH, s);
}

template <typename T>
static int attention_bwd(T *dqkv, float *scratch, const T *dout, const T *out, const T *qkv,
                         const float *lse, int B, int T_, int C, int NH, loco_stream s) {
    LOCO_CHECK(check_shape(B, T_, C, NH));
    const size_t rows = (size_t)B * NH * T_;
    if (rows == 0)
        return 0;
    attn_bwd_dsum_kernel<T><<<(unsigned)((rows + 255) / 256), 256, 0, s>>>(scratch, dout, out, B,
                                                                           T_, C, NH);
    CUDA_LAUNCHED("attention_bwd (dsum)");
    const int hs = C / NH;
    if (hs <= 32)
        return bwd_hs<32, T>(dqkv, scratch, dout, qkv, lse, B, T_, C, NH, s);
    if (hs <= 64)
        return bwd_hs<64, T>(dqkv, scratch, dout, qkv, lse, B, T_, C, NH, s);
    return bwd_hs<128, T>(dqkv, scratch, dout, qkv, lse, B, T_, C, NH, s);
}

extern "C" int loco_cuda_attention_fwd(float *out, float *lse, const float *qkv, int B, int T,
                                       int C, int NH, loco_stream s) {
    return attention_fwd<float>(out, lse, qkv, B, T, C, NH, s);
}

extern "C" int loco_cuda_attention_fwd_bf16(loco_bf16 *out, float *lse, const loco_bf16 *qkv,
                                            int B, int T, int C, int NH, loco_stream s) {
    return attention_fwd<__nv_bfloat16>(bf(out), lse, bf(qkv), B, T, C, NH, s);
}

extern "C" int loco_cuda_attention_bwd(float *dqkv, float *scratch, const float *dout,
                                       const float *out, const float *qkv, const float *lse,
                                       int B, int T, int C, int NH, loco_stream s) {
    return attention_bwd<float>(dqkv, scratch, dout, out, qkv, lse, B, T, C, NH, s);
}

extern "C" int loco_cuda_attention_bwd_bf16(loco_bf16 *dqkv, float *scratch,
                                            const loco_bf16 *dout, const loco_bf16 *out,
                                            const loco_bf16 *qkv, const float *lse, int B, int T,
                                            int C, int NH, loco_stream s) {
    return attention_bwd<__nv_bfloat16>(bf(dqkv), scratch, bf(dout), bf(out), bf(qkv), lse, B, T,
                                        C, NH, s);
}
