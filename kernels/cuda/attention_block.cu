/* Blockwise attention for context parallelism (ring attention), fp32: the
 * twins of kernels/cpu/attention_block.c. The kernels are attention.cu's,
 * generalised from one (B,T,3C) buffer to a query block and a key block,
 * each with its own row stride and global position (which decides the
 * causal mask), and to a forward that may see no key at all (lse = -inf,
 * out = 0).
 *
 * As there, a row belongs to `split` adjacent threads (1, 2 or 4 for head
 * sizes up to 32, 64, 128), each holding 32 of its dimensions in registers,
 * interleaved in chunks of 4; dot products are summed with shuffles, so
 * every loop runs the same trip count for the whole block. The backward is
 * two kernels that accumulate nothing across blocks (deterministic, no
 * atomics): one per key row for dk and dv, one per query row for dq.
 *
 * Grouped-query attention (the _gqa_ entry points; the MHA ones are NKV =
 * NH): q rows hold NH heads, k and v rows NKV heads, query head h reads kv
 * head h / (NH/NKV). As in attention.cu, a dk, dv CUDA block owns the rows
 * of one kv head and walks its group's query heads in turn, summing in
 * registers: no atomics, no scratch. */
#include <math.h>

#include "kernels/cuda/common.cuh"

/* query or key rows per CUDA block; keys per online-softmax rescale;
 * threads of the elementwise kernels */
enum { BLK_ROWS = 64, BLK_KEY_GROUP = 8, BLK_THREADS = 256 };

template <int HS> struct blk_geo {
    static constexpr int split = HS >= 64 ? HS / 32 : 1; /* threads per row */
    static constexpr int dp = HS / split;                /* dimensions per thread */
    static constexpr int threads = BLK_ROWS * split;
    static constexpr int tile = HS <= 64 ? 64 : 32; /* rows of a streamed tile */
};

/* One call's operands and geometry (device pointers). */
struct blk_args {
    const float *q, *k, *v;
    int q_ld, kv_ld;
    int B, Tq, Tk, C, NH, NKV, group, hs; /* C = NH hs: out's row */
    int q_pos, k_pos;
    bool causal;
    float scale;
};

/* Query row i (i < Tq) sees keys [0, n) of the block. */
__host__ __device__ __forceinline__ int blk_visible(const blk_args &a, int i) {
    if (!a.causal)
        return a.Tk;
    const long n = (long)a.q_pos + i - a.k_pos + 1;
    return n < 0 ? 0 : n > a.Tk ? a.Tk : (int)n;
}

/* The first query row (at most Tq) that sees key row j. */
__device__ __forceinline__ int blk_first_query(const blk_args &a, int j) {
    if (!a.causal)
        return 0;
    const long i = (long)a.k_pos + j - a.q_pos;
    return i < 0 ? 0 : i > a.Tq ? a.Tq : (int)i;
}

/* Dimension held in register r by the row's thread `part`. */
template <int HS> __device__ __forceinline__ int blk_dim(int part, int r) {
    return 4 * (part + blk_geo<HS>::split * (r / 4)) + (r % 4);
}

/* Sum over the `split` threads of a row (adjacent lanes). */
template <int S> __device__ __forceinline__ float blk_row_sum(float v) {
    for (int o = 1; o < S; o <<= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* sm[r][d] = rows r0 .. r0+rows-1 of a matrix with row stride ld from base,
 * columns < hs; zeros past n rows or hs. */
template <int HS>
__device__ __forceinline__ void blk_load_rows(float *sm, const float *base, int ld, int r0,
                                              int rows, int n, int hs) {
    for (int e = threadIdx.x; e < rows * HS; e += blockDim.x) {
        const int r = e / HS, d = e % HS, t = r0 + r;
        sm[e] = t < n && d < hs ? base[(size_t)t * ld + d] : 0.0f;
    }
}

/* x[r] = this thread's dimensions of row (times mul), 0 when !in or past hs. */
template <int HS>
__device__ __forceinline__ void blk_load_own(float *x, const float *row, int part, bool in,
                                             int hs, float mul) {
#pragma unroll
    for (int r = 0; r < blk_geo<HS>::dp; r++) {
        const int d = blk_dim<HS>(part, r);
        x[r] = in && d < hs ? row[d] * mul : 0.0f;
    }
}

/* row[d] = x[r] * mul (acc: += instead) for this thread's dimensions. */
template <int HS>
__device__ __forceinline__ void blk_store_own(float *row, const float *x, int part, int hs,
                                              float mul, bool acc) {
#pragma unroll
    for (int r = 0; r < blk_geo<HS>::dp; r++) {
        const int d = blk_dim<HS>(part, r);
        if (d < hs)
            row[d] = (acc ? row[d] : 0.0f) + x[r] * mul;
    }
}

/* --------------------------------------------------------------- forward */

template <int HS>
__global__ void __launch_bounds__(blk_geo<HS>::threads)
    blk_fwd_kernel(float *out, float *lse, const blk_args a) {
    constexpr int S = blk_geo<HS>::split, DP = blk_geo<HS>::dp, KT = blk_geo<HS>::tile;
    extern __shared__ float sm[];
    float *Ks = sm, *Vs = sm + KT * HS;
    const int bh = blockIdx.y, b = bh / a.NH, h = bh % a.NH, hs = a.hs, kh = h / a.group;
    const int part = threadIdx.x % S, q0 = blockIdx.x * BLK_ROWS, i = q0 + threadIdx.x / S;
    const float *kb = a.k + (size_t)b * a.Tk * a.kv_ld + (size_t)kh * hs;
    const float *vb = a.v + (size_t)b * a.Tk * a.kv_ld + (size_t)kh * hs;
    float q[DP], o[DP];
    blk_load_own<HS>(q, a.q + ((size_t)b * a.Tq + i) * a.q_ld + (size_t)h * hs, part, i < a.Tq,
                     hs, a.scale);
#pragma unroll
    for (int r = 0; r < DP; r++)
        o[r] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    const int kend = blk_visible(a, min(q0 + BLK_ROWS, a.Tq) - 1); /* the same for the block */
    const int mine = i < a.Tq ? blk_visible(a, i) : 0;
    for (int k0 = 0; k0 < kend; k0 += KT) {
        __syncthreads();
        blk_load_rows<HS>(Ks, kb, a.kv_ld, k0, KT, a.Tk, hs);
        blk_load_rows<HS>(Vs, vb, a.kv_ld, k0, KT, a.Tk, hs);
        __syncthreads();
        const int jend = min(KT, kend - k0);
        for (int j0 = 0; j0 < jend; j0 += BLK_KEY_GROUP) {
            float sc[BLK_KEY_GROUP];
            float mx = m;
#pragma unroll
            for (int g = 0; g < BLK_KEY_GROUP; g++) {
                const int jj = j0 + g;
                float ps = 0.0f;
                if (jj < jend)
#pragma unroll
                    for (int r = 0; r < DP; r++)
                        ps += q[r] * Ks[jj * HS + blk_dim<HS>(part, r)];
                const float sv = blk_row_sum<S>(ps);
                sc[g] = jj < jend && k0 + jj < mine ? sv : -INFINITY;
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
            for (int g = 0; g < BLK_KEY_GROUP; g++) {
                const float p = expf(sc[g] - mx);
                l += p;
                if (j0 + g < jend)
#pragma unroll
                    for (int r = 0; r < DP; r++)
                        o[r] += p * Vs[(j0 + g) * HS + blk_dim<HS>(part, r)];
            }
            m = mx;
        }
    }
    if (i >= a.Tq)
        return;
    if (part == 0)
        lse[(size_t)bh * a.Tq + i] = l > 0.0f ? m + logf(l) : -INFINITY;
    blk_store_own<HS>(out + ((size_t)b * a.Tq + i) * a.C + (size_t)h * hs, o, part, hs,
                      l > 0.0f ? 1.0f / l : 0.0f, false);
}

/* ------------------------------------------------------ merge and delta */

#define BLK_GRID_STRIDE(i, n)                                                                \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                  \
         i += (size_t)gridDim.x * blockDim.x)

/* The log-sum-exp of the union of two finite ones. */
__device__ __forceinline__ float blk_lse_union(float l1, float l2) {
    return fmaxf(l1, l2) + log1pf(expf(-fabsf(l1 - l2)));
}

/* out (B,T,C), one thread per element: reads both lse, so the lse update
 * waits for the next kernel. */
__global__ void blk_merge_out_kernel(float *out, const float *lse, const float *blk_out,
                                     const float *blk_lse, int T, int C, int NH, size_t n) {
    const int hs = C / NH;
    BLK_GRID_STRIDE(e, n) {
        const size_t bt = e / C, b = bt / T, t = bt % T, h = e % C / hs;
        const size_t r = (b * NH + h) * T + t;
        const float l1 = lse[r], l2 = blk_lse[r];
        if (l2 == -INFINITY)
            continue;
        if (l1 == -INFINITY) {
            out[e] = blk_out[e];
            continue;
        }
        const float l = blk_lse_union(l1, l2);
        out[e] = expf(l1 - l) * out[e] + expf(l2 - l) * blk_out[e];
    }
}

__global__ void blk_merge_lse_kernel(float *lse, const float *blk_lse, size_t n) {
    BLK_GRID_STRIDE(r, n) {
        const float l1 = lse[r], l2 = blk_lse[r];
        lse[r] = l2 == -INFINITY ? l1 : l1 == -INFINITY ? l2 : blk_lse_union(l1, l2);
    }
}

/* delta (B,NH,T), one thread per row. */
__global__ void blk_delta_kernel(float *delta, const float *dout, const float *out, int T, int C,
                                 int NH, size_t n) {
    const int hs = C / NH;
    BLK_GRID_STRIDE(r, n) {
        const size_t bh = r / T, t = r % T, b = bh / NH, h = bh % NH;
        const size_t off = (b * T + t) * C + h * hs;
        float s = 0.0f;
        for (int d = 0; d < hs; d++)
            s += dout[off + d] * out[off + d];
        delta[r] = s;
    }
}

/* -------------------------------------------------------------- backward */

/* dk, dv of one key row of one kv head each (its `split` threads): the
 * query rows of the block at or after the key's position stream through
 * shared memory, for each query head of the kv head's group in turn. */
template <int HS>
__global__ void __launch_bounds__(blk_geo<HS>::threads)
    blk_dkv_kernel(float *dk, float *dv, int dkv_ld, const float *dout, const float *lse,
                   const float *delta, const blk_args a) {
    constexpr int S = blk_geo<HS>::split, DP = blk_geo<HS>::dp, QT = blk_geo<HS>::tile;
    extern __shared__ float sm[];
    float *Qs = sm, *dOs = Qs + QT * HS, *ls = dOs + QT * HS, *Ds = ls + QT;
    const int b = blockIdx.y / a.NKV, kh = blockIdx.y % a.NKV, hs = a.hs;
    const int part = threadIdx.x % S, k0 = blockIdx.x * BLK_ROWS, j = k0 + threadIdx.x / S;
    const size_t krow = ((size_t)b * a.Tk + j) * a.kv_ld + (size_t)kh * hs;
    float k[DP], v[DP], dk_[DP], dv_[DP];
    blk_load_own<HS>(k, a.k + krow, part, j < a.Tk, hs, a.scale);
    blk_load_own<HS>(v, a.v + krow, part, j < a.Tk, hs, 1.0f);
#pragma unroll
    for (int r = 0; r < DP; r++)
        dk_[r] = dv_[r] = 0.0f;
    for (int h = kh * a.group; h < (kh + 1) * a.group; h++) {
        const size_t bh = (size_t)b * a.NH + h;
        const float *qb = a.q + (size_t)b * a.Tq * a.q_ld + (size_t)h * hs;
        const float *dob = dout + (size_t)b * a.Tq * a.C + (size_t)h * hs;
        for (int i0 = blk_first_query(a, k0); i0 < a.Tq; i0 += QT) {
            __syncthreads();
            blk_load_rows<HS>(Qs, qb, a.q_ld, i0, QT, a.Tq, hs);
            blk_load_rows<HS>(dOs, dob, a.C, i0, QT, a.Tq, hs);
            for (int r = threadIdx.x; r < QT; r += blockDim.x) {
                const bool in = i0 + r < a.Tq;
                ls[r] = in ? lse[(size_t)bh * a.Tq + i0 + r] : 0.0f;
                Ds[r] = in ? delta[(size_t)bh * a.Tq + i0 + r] : 0.0f;
            }
            __syncthreads();
            const int iend = min(QT, a.Tq - i0); /* the same for the block */
            for (int ii = 0; ii < iend; ii++) {
                float ps = 0.0f, pdp = 0.0f;
#pragma unroll
                for (int r = 0; r < DP; r++) {
                    const int d = blk_dim<HS>(part, r);
                    ps += Qs[ii * HS + d] * k[r];
                    pdp += dOs[ii * HS + d] * v[r];
                }
                const float sv = blk_row_sum<S>(ps), dp = blk_row_sum<S>(pdp);
                const bool vis = j < a.Tk && j < blk_visible(a, i0 + ii);
                const float p = vis ? expf(sv - ls[ii]) : 0.0f;
                const float ds = p * (dp - Ds[ii]);
#pragma unroll
                for (int r = 0; r < DP; r++) {
                    const int d = blk_dim<HS>(part, r);
                    dv_[r] += p * dOs[ii * HS + d];
                    dk_[r] += ds * Qs[ii * HS + d];
                }
            }
        }
    }
    if (j >= a.Tk)
        return;
    const size_t grow = ((size_t)b * a.Tk + j) * dkv_ld + (size_t)kh * hs;
    blk_store_own<HS>(dk + grow, dk_, part, hs, a.scale, true);
    blk_store_own<HS>(dv + grow, dv_, part, hs, 1.0f, true);
}

/* dq of one query row each: the keys it may see stream through shared
 * memory. */
template <int HS>
__global__ void __launch_bounds__(blk_geo<HS>::threads)
    blk_dq_kernel(float *dq, int dq_ld, const float *dout, const float *lse, const float *delta,
                  const blk_args a) {
    constexpr int S = blk_geo<HS>::split, DP = blk_geo<HS>::dp, KT = blk_geo<HS>::tile;
    extern __shared__ float sm[];
    float *Ks = sm, *Vs = Ks + KT * HS;
    const int bh = blockIdx.y, b = bh / a.NH, h = bh % a.NH, hs = a.hs, kh = h / a.group;
    const int part = threadIdx.x % S, q0 = blockIdx.x * BLK_ROWS, i = q0 + threadIdx.x / S;
    const bool in = i < a.Tq;
    const float *kb = a.k + (size_t)b * a.Tk * a.kv_ld + (size_t)kh * hs;
    const float *vb = a.v + (size_t)b * a.Tk * a.kv_ld + (size_t)kh * hs;
    float q[DP], g[DP], dq_[DP];
    blk_load_own<HS>(q, a.q + ((size_t)b * a.Tq + i) * a.q_ld + (size_t)h * hs, part, in, hs,
                     a.scale);
    blk_load_own<HS>(g, dout + ((size_t)b * a.Tq + i) * a.C + (size_t)h * hs, part, in, hs, 1.0f);
#pragma unroll
    for (int r = 0; r < DP; r++)
        dq_[r] = 0.0f;
    const float li = in ? lse[(size_t)bh * a.Tq + i] : 0.0f;
    const float Di = in ? delta[(size_t)bh * a.Tq + i] : 0.0f;
    const int kend = blk_visible(a, min(q0 + BLK_ROWS, a.Tq) - 1); /* the same for the block */
    const int mine = in ? blk_visible(a, i) : 0;
    for (int k0 = 0; k0 < kend; k0 += KT) {
        __syncthreads();
        blk_load_rows<HS>(Ks, kb, a.kv_ld, k0, KT, a.Tk, hs);
        blk_load_rows<HS>(Vs, vb, a.kv_ld, k0, KT, a.Tk, hs);
        __syncthreads();
        const int jend = min(KT, kend - k0);
        for (int jj = 0; jj < jend; jj++) {
            float ps = 0.0f, pdp = 0.0f;
#pragma unroll
            for (int r = 0; r < DP; r++) {
                const int d = blk_dim<HS>(part, r);
                ps += q[r] * Ks[jj * HS + d];
                pdp += g[r] * Vs[jj * HS + d];
            }
            const float sv = blk_row_sum<S>(ps), dp = blk_row_sum<S>(pdp);
            const float ds = k0 + jj < mine ? expf(sv - li) * (dp - Di) : 0.0f;
#pragma unroll
            for (int r = 0; r < DP; r++)
                dq_[r] += ds * Ks[jj * HS + blk_dim<HS>(part, r)];
        }
    }
    if (in)
        blk_store_own<HS>(dq + ((size_t)b * a.Tq + i) * dq_ld + (size_t)h * hs, dq_, part, hs,
                          a.scale, true);
}

/* ------------------------------------------------------------------ host */

template <int HS> static int fwd_hs(float *out, float *lse, const blk_args &a, loco_stream s) {
    const size_t smem = 2 * blk_geo<HS>::tile * HS * sizeof(float);
    CUDA_CHECK(cudaFuncSetAttribute(blk_fwd_kernel<HS>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const dim3 grid((a.Tq + BLK_ROWS - 1) / BLK_ROWS, a.B * a.NH);
    blk_fwd_kernel<HS><<<grid, blk_geo<HS>::threads, smem, s>>>(out, lse, a);
    CUDA_LAUNCHED("attention_block_fwd");
    return 0;
}

template <int HS>
static int bwd_hs(float *dq, int dq_ld, float *dk, float *dv, int dkv_ld, const float *dout,
                  const float *lse, const float *delta, const blk_args &a, loco_stream s) {
    const int n = blk_geo<HS>::tile;
    const size_t smem_kv = (2 * n * HS + 2 * n) * sizeof(float);
    const size_t smem_q = 2 * n * HS * sizeof(float);
    CUDA_CHECK(cudaFuncSetAttribute(blk_dkv_kernel<HS>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_kv));
    CUDA_CHECK(cudaFuncSetAttribute(blk_dq_kernel<HS>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_q));
    const dim3 grid_kv((a.Tk + BLK_ROWS - 1) / BLK_ROWS, a.B * a.NKV);
    blk_dkv_kernel<HS><<<grid_kv, blk_geo<HS>::threads, smem_kv, s>>>(dk, dv, dkv_ld, dout, lse,
                                                                      delta, a);
    CUDA_LAUNCHED("attention_block_bwd (dk, dv)");
    const dim3 grid_q((a.Tq + BLK_ROWS - 1) / BLK_ROWS, a.B * a.NH);
    blk_dq_kernel<HS><<<grid_q, blk_geo<HS>::threads, smem_q, s>>>(dq, dq_ld, dout, lse, delta,
                                                                   a);
    CUDA_LAUNCHED("attention_block_bwd (dq)");
    return 0;
}

static int blk_check(int B, int Tq, int Tk, int C, int NH) {
    if (B < 0 || Tq < 0 || Tk < 0 || NH <= 0 || C % NH != 0 || C / NH > 128 || C / NH < 1)
        return LOCO_ERR(LOCO_EINVAL,
                        "attention_block: C=%d, NH=%d (head size must be 1..128), B=%d, Tq=%d, "
                        "Tk=%d",
                        C, NH, B, Tq, Tk);
    return 0;
}

static int blk_check_gqa(int B, int Tq, int Tk, int NH, int NKV, int hs) {
    if (NKV <= 0 || NH <= 0 || NH % NKV != 0)
        return LOCO_ERR(LOCO_EINVAL, "attention_block: NKV=%d must divide NH=%d", NKV, NH);
    if (hs < 1 || hs > 128)
        return LOCO_ERR(LOCO_EINVAL, "attention_block: head size %d (must be 1..128)", hs);
    return blk_check(B, Tq, Tk, NH * hs, NH);
}

static blk_args blk_make(const float *q, int q_ld, const float *k, const float *v, int kv_ld,
                         int B, int Tq, int Tk, int NH, int NKV, int hs, int q_pos, int k_pos,
                         bool causal) {
    return blk_args{q,     k,      v, q_ld, kv_ld, B, Tq, Tk, NH * hs, NH, NKV, NH / NKV, hs,
                    q_pos, k_pos, causal, 1.0f / sqrtf((float)hs)};
}

extern "C" int loco_cuda_attention_block_gqa_fwd(float *out, float *lse, const float *q,
                                                 int q_ld, const float *k, const float *v,
                                                 int kv_ld, int B, int Tq, int Tk, int NH,
                                                 int NKV, int hs, int q_pos, int k_pos,
                                                 bool causal, loco_stream s) {
    LOCO_CHECK(blk_check_gqa(B, Tq, Tk, NH, NKV, hs));
    if ((size_t)B * Tq == 0)
        return 0;
    /* a fully masked block still writes its zeros and -inf */
    const blk_args a = blk_make(q, q_ld, k, v, kv_ld, B, Tq, Tk, NH, NKV, hs, q_pos, k_pos,
                                causal);
    if (a.hs <= 32)
        return fwd_hs<32>(out, lse, a, s);
    if (a.hs <= 64)
        return fwd_hs<64>(out, lse, a, s);
    return fwd_hs<128>(out, lse, a, s);
}

extern "C" int loco_cuda_attention_block_fwd(float *out, float *lse, const float *q, int q_ld,
                                             const float *k, const float *v, int kv_ld, int B,
                                             int Tq, int Tk, int C, int NH, int q_pos, int k_pos,
                                             bool causal, loco_stream s) {
    LOCO_CHECK(blk_check(B, Tq, Tk, C, NH));
    return loco_cuda_attention_block_gqa_fwd(out, lse, q, q_ld, k, v, kv_ld, B, Tq, Tk, NH, NH,
                                             C / NH, q_pos, k_pos, causal, s);
}

extern "C" int loco_cuda_attention_merge(float *out, float *lse, const float *blk_out,
                                         const float *blk_lse, int B, int T, int C, int NH,
                                         loco_stream s) {
    LOCO_CHECK(blk_check(B, T, T, C, NH));
    const size_t n = (size_t)B * T * C, rows = (size_t)B * NH * T;
    if (!n)
        return 0;
    blk_merge_out_kernel<<<grid_for(n, BLK_THREADS), BLK_THREADS, 0, s>>>(out, lse, blk_out,
                                                                          blk_lse, T, C, NH, n);
    CUDA_LAUNCHED("attention_merge (out)");
    blk_merge_lse_kernel<<<grid_for(rows, BLK_THREADS), BLK_THREADS, 0, s>>>(lse, blk_lse, rows);
    CUDA_LAUNCHED("attention_merge (lse)");
    return 0;
}

extern "C" int loco_cuda_attention_delta(float *delta, const float *dout, const float *out, int B,
                                         int T, int C, int NH, loco_stream s) {
    LOCO_CHECK(blk_check(B, T, T, C, NH));
    const size_t rows = (size_t)B * NH * T;
    if (!rows)
        return 0;
    blk_delta_kernel<<<grid_for(rows, BLK_THREADS), BLK_THREADS, 0, s>>>(delta, dout, out, T, C,
                                                                         NH, rows);
    CUDA_LAUNCHED("attention_delta");
    return 0;
}

extern "C" int loco_cuda_attention_block_gqa_bwd(float *dq, int dq_ld, float *dk, float *dv,
                                                 int dkv_ld, const float *dout, const float *lse,
                                                 const float *delta, const float *q, int q_ld,
                                                 const float *k, const float *v, int kv_ld, int B,
                                                 int Tq, int Tk, int NH, int NKV, int hs,
                                                 int q_pos, int k_pos, bool causal,
                                                 loco_stream s) {
    LOCO_CHECK(blk_check_gqa(B, Tq, Tk, NH, NKV, hs));
    const blk_args a = blk_make(q, q_ld, k, v, kv_ld, B, Tq, Tk, NH, NKV, hs, q_pos, k_pos,
                                causal);
    if ((size_t)B * Tq * Tk == 0 || blk_visible(a, Tq - 1) == 0) /* nothing visible */
        return 0;
    if (a.hs <= 32)
        return bwd_hs<32>(dq, dq_ld, dk, dv, dkv_ld, dout, lse, delta, a, s);
    if (a.hs <= 64)
        return bwd_hs<64>(dq, dq_ld, dk, dv, dkv_ld, dout, lse, delta, a, s);
    return bwd_hs<128>(dq, dq_ld, dk, dv, dkv_ld, dout, lse, delta, a, s);
}

extern "C" int loco_cuda_attention_block_bwd(float *dq, int dq_ld, float *dk, float *dv,
                                             int dkv_ld, const float *dout, const float *lse,
                                             const float *delta, const float *q, int q_ld,
                                             const float *k, const float *v, int kv_ld, int B,
                                             int Tq, int Tk, int C, int NH, int q_pos, int k_pos,
                                             bool causal, loco_stream s) {
    LOCO_CHECK(blk_check(B, Tq, Tk, C, NH));
    return loco_cuda_attention_block_gqa_bwd(dq, dq_ld, dk, dv, dkv_ld, dout, lse, delta, q, q_ld,
                                             k, v, kv_ld, B, Tq, Tk, NH, NH, C / NH, q_pos, k_pos,
                                             causal, s);
}
