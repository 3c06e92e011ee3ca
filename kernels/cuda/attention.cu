/* Fused causal attention, flash-attention style: the T x T matrix is never
 * stored. Forward: each query row streams key/value tiles through shared
 * memory with an online softmax (rescaled once per group of keys) and saves
 * the row's log-sum-exp. Backward: the probabilities are recomputed from
 * it, in two kernels so that nothing is accumulated with atomics
 * (deterministic): one pass per key row sums dK and dV over the query tiles
 * at or after it, one per query row sums dQ over the key tiles before it.
 *
 * A row belongs to `split` adjacent threads (1, 2 or 4 for head sizes 32,
 * 64, 128), each holding 32 of its dimensions in registers, interleaved in
 * chunks of 4 so that the threads of a row read neighbouring words of a
 * tile (no bank conflicts, 16-byte loads); dot products are summed across
 * them with shuffles. Loops run the same trip count for the whole block
 * (keys outside the causal mask are computed and then dropped), so that
 * every shuffle sees all its lanes. Math in fp32 on the CUDA cores (not
 * tensor cores); the head size is padded with zeros to 32, 64 or 128.
 *
 * Grouped-query attention: qkv rows hold NH query heads, then NKV key heads,
 * then NKV value heads (ld = (NH + 2 NKV) hs), and query head h reads kv
 * head h / (NH/NKV); GPT-2 is NKV = NH. The dK, dV kernel gives each CUDA
 * block the rows of one kv head and loops over its group's query heads,
 * summing into the same registers: no atomics, no scratch beyond the MHA
 * one, and one rounding per element where the output is bf16. (Per query
 * head partials reduced afterwards would keep more blocks busy for MQA at
 * small batch, at the cost of NH/NKV times the dK, dV memory as scratch.)
 * With NKV = NH the loop runs once and every sum is in the MHA order. */
#include <math.h>

#include "kernels/cuda/common.cuh"

enum { ROWS = 64, KEY_GROUP = 8 }; /* rows per block; keys per softmax rescale */

template <int HS> struct geo {
    static constexpr int split = HS >= 64 ? HS / 32 : 1; /* threads per row */
    static constexpr int dp = HS / split;                /* dimensions per thread */
    static constexpr int threads = ROWS * split;
    static constexpr int tile = HS <= 64 ? 64 : 32; /* rows of a streamed tile */
};

/* Dimension held in register r by the row's thread `part`. */
template <int HS> __device__ __forceinline__ int dim_of(int part, int r) {
    return 4 * (part + geo<HS>::split * (r / 4)) + (r % 4);
}

/* Sum over the `split` threads of a row (adjacent lanes). */
template <int S> __device__ __forceinline__ float row_sum(float v) {
    for (int o = 1; o < S; o <<= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

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

/* x[r] = row t's dimensions of this thread (times mul), 0 past T or hs. */
template <int HS, typename T>
__device__ __forceinline__ void load_own(float *x, const T *row, int part, bool in, int hs,
                                         float mul) {
#pragma unroll
    for (int r = 0; r < geo<HS>::dp; r++) {
        const int d = dim_of<HS>(part, r);
        x[r] = in && d < hs ? ld(row + d) * mul : 0.0f;
    }
}

template <int HS, typename T>
__global__ void __launch_bounds__(geo<HS>::threads)
    attn_fwd_kernel(T *out, float *lse, const T *qkv, int T_, int NH, int NKV, int hs,
                    float scale) {
    constexpr int S = geo<HS>::split, DP = geo<HS>::dp, KT = geo<HS>::tile;
    extern __shared__ float sm[];
    float *Ks = sm, *Vs = sm + KT * HS;
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH, kh = h / (NH / NKV), C = NH * hs;
    const int part = threadIdx.x % S, q0 = blockIdx.x * ROWS, i = q0 + threadIdx.x / S;
    const size_t C3 = (size_t)(NH + 2 * NKV) * hs; /* the qkv row */
    const T *x = qkv + (size_t)b * T_ * C3, *base = x + (size_t)h * hs;
    const T *kb = x + (size_t)(NH + kh) * hs, *vb = x + (size_t)(NH + NKV + kh) * hs;
    float q[DP], o[DP];
    load_own<HS>(q, base + (size_t)i * C3, part, i < T_, hs, scale);
#pragma unroll
    for (int r = 0; r < DP; r++)
        o[r] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    const int last = min(q0 + ROWS, T_) - 1;
    for (int k0 = 0; k0 <= last; k0 += KT) {
        __syncthreads();
        load_rows<HS>(Ks, kb, C3, k0, KT, T_, hs);
        load_rows<HS>(Vs, vb, C3, k0, KT, T_, hs);
        __syncthreads();
        const int jend = min(KT, last - k0 + 1); /* the same for the block */
        for (int j0 = 0; j0 < jend; j0 += KEY_GROUP) {
            float sc[KEY_GROUP];
            float mx = m;
#pragma unroll
            for (int g = 0; g < KEY_GROUP; g++) {
                const int jj = j0 + g;
                float ps = 0.0f;
                if (jj < jend)
#pragma unroll
                    for (int r = 0; r < DP; r++)
                        ps += q[r] * Ks[jj * HS + dim_of<HS>(part, r)];
                const float sv = row_sum<S>(ps);
                sc[g] = jj < jend && k0 + jj <= i && i < T_ ? sv : -INFINITY;
                mx = fmaxf(mx, sc[g]);
            }
            if (mx == -INFINITY) /* nothing this row may see yet */
                continue;
            const float corr = expf(m - mx);
            l *= corr;
#pragma unroll
            for (int r = 0; r < DP; r++)
                o[r] *= corr;
#pragma unroll
            for (int g = 0; g < KEY_GROUP; g++) {
                const float p = expf(sc[g] - mx);
                l += p;
                if (j0 + g < jend)
#pragma unroll
                    for (int r = 0; r < DP; r++)
                        o[r] += p * Vs[(j0 + g) * HS + dim_of<HS>(part, r)];
            }
            m = mx;
        }
    }
    if (i >= T_)
        return;
    if (part == 0)
        lse[(size_t)bh * T_ + i] = m + logf(l);
    T *orow = out + ((size_t)b * T_ + i) * C + (size_t)h * hs;
    const float il = 1.0f / l;
#pragma unroll
    for (int r = 0; r < DP; r++) {
        const int d = dim_of<HS>(part, r);
        if (d < hs)
            st(orow + d, o[r] * il);
    }
}

/* Dsum[bh, i] = sum_d dO[i, d] O[i, d]: the softmax backward's row term. */
template <typename T>
__global__ void attn_bwd_dsum_kernel(float *Dsum, const T *dout, const T *out, int B, int T_,
                                     int NH, int hs) {
    const size_t r = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= (size_t)B * NH * T_)
        return;
    const size_t C = (size_t)NH * hs;
    const size_t bh = r / T_, i = r % T_, b = bh / NH, h = bh % NH;
    const size_t off = (b * T_ + i) * C + h * hs;
    float s = 0.0f;
    for (int d = 0; d < hs; d++)
        s += ld(dout + off + d) * ld(out + off + d);
    Dsum[r] = s;
}

/* One block per (key tile, batch, kv head): the query heads of the kv
 * head's group one after another, each over the query tiles at or after
 * the key tile. */
template <int HS, typename T>
__global__ void __launch_bounds__(geo<HS>::threads)
    attn_bwd_dkv_kernel(T *dqkv, const T *dout, const T *qkv, const float *lse,
                        const float *Dsum, int T_, int NH, int NKV, int hs, float scale) {
    constexpr int S = geo<HS>::split, DP = geo<HS>::dp, QT = geo<HS>::tile;
    extern __shared__ float sm[];
    float *Qs = sm, *dOs = Qs + QT * HS, *ls = dOs + QT * HS, *Ds = ls + QT;
    const int b = blockIdx.y / NKV, kh = blockIdx.y % NKV, group = NH / NKV, C = NH * hs;
    const int part = threadIdx.x % S, k0 = blockIdx.x * ROWS, j = k0 + threadIdx.x / S;
    const size_t C3 = (size_t)(NH + 2 * NKV) * hs; /* the qkv row */
    const T *x = qkv + (size_t)b * T_ * C3;
    const size_t kcol = (size_t)(NH + kh) * hs, vcol = (size_t)(NH + NKV + kh) * hs;
    float k[DP], v[DP], dk[DP], dv[DP];
    load_own<HS>(k, x + (size_t)j * C3 + kcol, part, j < T_, hs, scale);
    load_own<HS>(v, x + (size_t)j * C3 + vcol, part, j < T_, hs, 1.0f);
#pragma unroll
    for (int r = 0; r < DP; r++)
        dk[r] = dv[r] = 0.0f;
    for (int h = kh * group; h < (kh + 1) * group; h++) {
        const size_t bh = (size_t)b * NH + h;
        const T *base = x + (size_t)h * hs;
        const T *dobase = dout + (size_t)b * T_ * C + (size_t)h * hs;
        for (int i0 = k0; i0 < T_; i0 += QT) {
            __syncthreads();
            load_rows<HS>(Qs, base, C3, i0, QT, T_, hs);
            load_rows<HS>(dOs, dobase, C, i0, QT, T_, hs);
            for (int r = threadIdx.x; r < QT; r += blockDim.x) {
                const bool in = i0 + r < T_;
                ls[r] = in ? lse[(size_t)bh * T_ + i0 + r] : 0.0f;
                Ds[r] = in ? Dsum[(size_t)bh * T_ + i0 + r] : 0.0f;
            }
            __syncthreads();
            const int iend = min(QT, T_ - i0); /* the same for the block */
            for (int ii = 0; ii < iend; ii++) {
                float ps = 0.0f, pdp = 0.0f;
#pragma unroll
                for (int r = 0; r < DP; r++) {
                    const int d = dim_of<HS>(part, r);
                    ps += Qs[ii * HS + d] * k[r];
                    pdp += dOs[ii * HS + d] * v[r];
                }
                const float sv = row_sum<S>(ps), dp = row_sum<S>(pdp);
                const float p = i0 + ii >= j && j < T_ ? expf(sv - ls[ii]) : 0.0f;
                const float ds = p * (dp - Ds[ii]);
#pragma unroll
                for (int r = 0; r < DP; r++) {
                    const int d = dim_of<HS>(part, r);
                    dv[r] += p * dOs[ii * HS + d];
                    dk[r] += ds * Qs[ii * HS + d];
                }
            }
        }
    }
    if (j >= T_)
        return;
    T *dkrow = dqkv + ((size_t)b * T_ + j) * C3 + kcol;
    T *dvrow = dqkv + ((size_t)b * T_ + j) * C3 + vcol;
#pragma unroll
    for (int r = 0; r < DP; r++) {
        const int d = dim_of<HS>(part, r);
        if (d < hs) {
            st(dkrow + d, ld(dkrow + d) + dk[r] * scale);
            st(dvrow + d, ld(dvrow + d) + dv[r]);
        }
    }
}

template <int HS, typename T>
__global__ void __launch_bounds__(geo<HS>::threads)
    attn_bwd_dq_kernel(T *dqkv, const T *dout, const T *qkv, const float *lse, const float *Dsum,
                       int T_, int NH, int NKV, int hs, float scale) {
    constexpr int S = geo<HS>::split, DP = geo<HS>::dp, KT = geo<HS>::tile;
    extern __shared__ float sm[];
    float *Ks = sm, *Vs = Ks + KT * HS;
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH, kh = h / (NH / NKV), C = NH * hs;
    const int part = threadIdx.x % S, q0 = blockIdx.x * ROWS, i = q0 + threadIdx.x / S;
    const size_t C3 = (size_t)(NH + 2 * NKV) * hs; /* the qkv row */
    const T *x = qkv + (size_t)b * T_ * C3, *base = x + (size_t)h * hs;
    const T *kb = x + (size_t)(NH + kh) * hs, *vb = x + (size_t)(NH + NKV + kh) * hs;
    float q[DP], g[DP], dq[DP];
    load_own<HS>(q, base + (size_t)i * C3, part, i < T_, hs, scale);
    load_own<HS>(g, dout + ((size_t)b * T_ + i) * C + (size_t)h * hs, part, i < T_, hs, 1.0f);
#pragma unroll
    for (int r = 0; r < DP; r++)
        dq[r] = 0.0f;
    const float li = i < T_ ? lse[(size_t)bh * T_ + i] : 0.0f;
    const float Di = i < T_ ? Dsum[(size_t)bh * T_ + i] : 0.0f;
    const int last = min(q0 + ROWS, T_) - 1;
    for (int k0 = 0; k0 <= last; k0 += KT) {
        __syncthreads();
        load_rows<HS>(Ks, kb, C3, k0, KT, T_, hs);
        load_rows<HS>(Vs, vb, C3, k0, KT, T_, hs);
        __syncthreads();
        const int jend = min(KT, last - k0 + 1); /* the same for the block */
        for (int jj = 0; jj < jend; jj++) {
            float ps = 0.0f, pdp = 0.0f;
#pragma unroll
            for (int r = 0; r < DP; r++) {
                const int d = dim_of<HS>(part, r);
                ps += q[r] * Ks[jj * HS + d];
                pdp += g[r] * Vs[jj * HS + d];
            }
            const float sv = row_sum<S>(ps), dp = row_sum<S>(pdp);
            const float ds = k0 + jj <= i && i < T_ ? expf(sv - li) * (dp - Di) : 0.0f;
#pragma unroll
            for (int r = 0; r < DP; r++)
                dq[r] += ds * Ks[jj * HS + dim_of<HS>(part, r)];
        }
    }
    if (i >= T_)
        return;
    T *dqrow = dqkv + ((size_t)b * T_ + i) * C3 + (size_t)h * hs;
#pragma unroll
    for (int r = 0; r < DP; r++) {
        const int d = dim_of<HS>(part, r);
        if (d < hs)
            st(dqrow + d, ld(dqrow + d) + dq[r] * scale);
    }
}

template <int HS, typename T>
static int fwd_hs(T *out, float *lse, const T *qkv, int B, int T_, int NH, int NKV, int hs,
                  loco_stream s) {
    const size_t smem = 2 * geo<HS>::tile * HS * sizeof(float);
    CUDA_CHECK(cudaFuncSetAttribute(attn_fwd_kernel<HS, T>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const dim3 grid((T_ + ROWS - 1) / ROWS, B * NH);
    attn_fwd_kernel<HS, T><<<grid, geo<HS>::threads, smem, s>>>(out, lse, qkv, T_, NH, NKV, hs,
                                                                1.0f / sqrtf((float)hs));
    CUDA_LAUNCHED("attention_fwd");
    return 0;
}

template <int HS, typename T>
static int bwd_hs(T *dqkv, float *Dsum, const T *dout, const T *qkv, const float *lse, int B,
                  int T_, int NH, int NKV, int hs, loco_stream s) {
    const float scale = 1.0f / sqrtf((float)hs);
    const dim3 grid_kv((T_ + ROWS - 1) / ROWS, B * NKV), grid_q((T_ + ROWS - 1) / ROWS, B * NH);
    const int n = geo<HS>::tile;
    const size_t smem_kv = (2 * n * HS + 2 * n) * sizeof(float);
    const size_t smem_q = 2 * n * HS * sizeof(float);
    CUDA_CHECK(cudaFuncSetAttribute(attn_bwd_dkv_kernel<HS, T>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_kv));
    CUDA_CHECK(cudaFuncSetAttribute(attn_bwd_dq_kernel<HS, T>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_q));
    attn_bwd_dkv_kernel<HS, T><<<grid_kv, geo<HS>::threads, smem_kv, s>>>(
        dqkv, dout, qkv, lse, Dsum, T_, NH, NKV, hs, scale);
    CUDA_LAUNCHED("attention_bwd (dk, dv)");
    attn_bwd_dq_kernel<HS, T><<<grid_q, geo<HS>::threads, smem_q, s>>>(dqkv, dout, qkv, lse, Dsum,
                                                                       T_, NH, NKV, hs, scale);
    CUDA_LAUNCHED("attention_bwd (dq)");
    return 0;
}

static int check_shape(int B, int T_, int NH, int NKV, int hs) {
    if (B < 0 || T_ < 0 || NH <= 0 || NKV <= 0 || NH % NKV != 0 || hs > 128 || hs < 1)
        return LOCO_ERR(LOCO_EINVAL,
                        "attention: NH=%d, NKV=%d, head size %d (NKV must divide NH, head size "
                        "1..128)",
                        NH, NKV, hs);
    return 0;
}

/* The MHA entry points' (C, NH): NKV = NH, head size C / NH. */
static int check_mha(int C, int NH) {
    if (NH <= 0 || C % NH != 0)
        return LOCO_ERR(LOCO_EINVAL, "attention: C=%d, NH=%d (head size must be 1..128)", C, NH);
    return 0;
}

template <typename T>
static int attention_fwd(T *out, float *lse, const T *qkv, int B, int T_, int NH, int NKV,
                         int hs, loco_stream s) {
    LOCO_CHECK(check_shape(B, T_, NH, NKV, hs));
    if ((size_t)B * T_ == 0)
        return 0;
    if (hs <= 32)
        return fwd_hs<32, T>(out, lse, qkv, B, T_, NH, NKV, hs, s);
    if (hs <= 64)
        return fwd_hs<64, T>(out, lse, qkv, B, T_, NH, NKV, hs, s);
    return fwd_hs<128, T>(out, lse, qkv, B, T_, NH, NKV, hs, s);
}

template <typename T>
static int attention_bwd(T *dqkv, float *scratch, const T *dout, const T *out, const T *qkv,
                         const float *lse, int B, int T_, int NH, int NKV, int hs,
                         loco_stream s) {
    LOCO_CHECK(check_shape(B, T_, NH, NKV, hs));
    const size_t rows = (size_t)B * NH * T_;
    if (rows == 0)
        return 0;
    attn_bwd_dsum_kernel<T><<<(unsigned)((rows + 255) / 256), 256, 0, s>>>(scratch, dout, out, B,
                                                                           T_, NH, hs);
    CUDA_LAUNCHED("attention_bwd (dsum)");
    if (hs <= 32)
        return bwd_hs<32, T>(dqkv, scratch, dout, qkv, lse, B, T_, NH, NKV, hs, s);
    if (hs <= 64)
        return bwd_hs<64, T>(dqkv, scratch, dout, qkv, lse, B, T_, NH, NKV, hs, s);
    return bwd_hs<128, T>(dqkv, scratch, dout, qkv, lse, B, T_, NH, NKV, hs, s);
}

extern "C" int loco_cuda_attention_gqa_fwd(float *out, float *lse, const float *qkv, int B, int T,
                                           int NH, int NKV, int hs, loco_stream s) {
    return attention_fwd<float>(out, lse, qkv, B, T, NH, NKV, hs, s);
}

extern "C" int loco_cuda_attention_gqa_fwd_bf16(loco_bf16 *out, float *lse, const loco_bf16 *qkv,
                                                int B, int T, int NH, int NKV, int hs,
                                                loco_stream s) {
    return attention_fwd<__nv_bfloat16>(bf(out), lse, bf(qkv), B, T, NH, NKV, hs, s);
}

extern "C" int loco_cuda_attention_gqa_bwd(float *dqkv, float *scratch, const float *dout,
                                           const float *out, const float *qkv, const float *lse,
                                           int B, int T, int NH, int NKV, int hs, loco_stream s) {
    return attention_bwd<float>(dqkv, scratch, dout, out, qkv, lse, B, T, NH, NKV, hs, s);
}

extern "C" int loco_cuda_attention_gqa_bwd_bf16(loco_bf16 *dqkv, float *scratch,
                                                const loco_bf16 *dout, const loco_bf16 *out,
                                                const loco_bf16 *qkv, const float *lse, int B,
                                                int T, int NH, int NKV, int hs, loco_stream s) {
    return attention_bwd<__nv_bfloat16>(bf(dqkv), scratch, bf(dout), bf(out), bf(qkv), lse, B, T,
                                        NH, NKV, hs, s);
}

extern "C" int loco_cuda_attention_fwd(float *out, float *lse, const float *qkv, int B, int T,
                                       int C, int NH, loco_stream s) {
    LOCO_CHECK(check_mha(C, NH));
    return loco_cuda_attention_gqa_fwd(out, lse, qkv, B, T, NH, NH, C / NH, s);
}

extern "C" int loco_cuda_attention_fwd_bf16(loco_bf16 *out, float *lse, const loco_bf16 *qkv,
                                            int B, int T, int C, int NH, loco_stream s) {
    LOCO_CHECK(check_mha(C, NH));
    return loco_cuda_attention_gqa_fwd_bf16(out, lse, qkv, B, T, NH, NH, C / NH, s);
}

extern "C" int loco_cuda_attention_bwd(float *dqkv, float *scratch, const float *dout,
                                       const float *out, const float *qkv, const float *lse,
                                       int B, int T, int C, int NH, loco_stream s) {
    LOCO_CHECK(check_mha(C, NH));
    return loco_cuda_attention_gqa_bwd(dqkv, scratch, dout, out, qkv, lse, B, T, NH, NH, C / NH,
                                       s);
}

extern "C" int loco_cuda_attention_bwd_bf16(loco_bf16 *dqkv, float *scratch,
                                            const loco_bf16 *dout, const loco_bf16 *out,
                                            const loco_bf16 *qkv, const float *lse, int B, int T,
                                            int C, int NH, loco_stream s) {
    LOCO_CHECK(check_mha(C, NH));
    return loco_cuda_attention_gqa_bwd_bf16(dqkv, scratch, dout, out, qkv, lse, B, T, NH, NH,
                                            C / NH, s);
}
