/* Causal attention on the tensor cores, FlashAttention-2 style, bf16 in and
 * out with fp32 accumulation: the same tensors as attention.cu's bf16 twin
 * (qkv (B,T,3C), out (B,T,C), lse (B,NH,T) natural log of the scaled
 * scores' sum, dqkv accumulated, scratch (B,NH,T) for D), so either may
 * run a step's forward and the other its backward. Head size 64 only.
 *
 * Every product is common.cuh's mma_bf16_16816 (mma.sync m16n8k16, bf16
 * operands, fp32 accumulators); fragments are read from shared memory
 * tiles held as bf16 pairs (one 32-bit word), rows padded to 36 words so
 * that the 8 rows x 4 words a fragment load touches fall in 32 banks; a
 * tile that is the right operand of a product summed over its rows (V in
 * P V, K in dS K, dO and Q in P^T dO and dS^T Q) is also kept transposed
 * (pairs of rows per word) so that its fragments are whole words too,
 * where ldmatrix.trans would otherwise serve.
 * A block is 4 warps and 64 rows (16 per warp, one MMA row tile).
 *
 * Forward: a warp keeps its 16 query rows' Q fragments in registers and
 * streams 64-key tiles of K and V; S = QK^T in 8 accumulator tiles, an
 * online softmax in the log2 domain (row max over the 4 lanes that share a
 * row), P rounded to bf16 and fed back as the A operand of O += PV without
 * leaving registers. Backward: D = rowsum(dO * O) first; then one pass per
 * 64-key block computes S^T = KQ^T and dP^T = VdO^T for every 64-query
 * tile at or after it and accumulates dV += P^T dO and dK += dS^T Q in
 * registers; dQ = dS K is a separate pass per 64-query block over the key
 * tiles before it (recomputing S and dP), so nothing is summed with
 * atomics and the result is the same bits every run. Loops have the same
 * trip count for the whole block (masked scores are computed, then
 * dropped), as the warp-wide MMAs and the emulator's barriers need.
 *
 * Grouped-query attention (the _gqa_ entry points; the MHA ones are NKV =
 * NH): qkv rows hold NH query heads, NKV key heads, NKV value heads, and
 * query head h reads kv head h / (NH/NKV). The forward and the dQ pass
 * just read the shared kv head. The dK, dV pass has one CUDA block per
 * (64-key block, batch, kv head) that keeps its K, V fragments and walks
 * the query heads of its group in turn, accumulating into the same fp32
 * registers: the group's sum needs no atomics and no scratch (the (B,NH,T)
 * one of the MHA contract still holds D), and dK, dV are rounded to bf16
 * once. The price is NH/NKV times fewer blocks in that pass; a per query
 * head scratch of dK, dV partials and a reduction would keep them but cost
 * (NH/NKV) x the dK, dV memory in fp32 and a third pass. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cuda/common.cuh"

enum { TC_HS = 64, TC_ROWS = 64, TC_THREADS = 128, TC_LD = 36 /* words per tile row */ };
enum { TC_TILE_WORDS = TC_ROWS * TC_LD };
#define TC_LOG2E 1.4426950408889634f
#define TC_LN2 0.6931471805599453f

/* tile[r][w] = the bf16 pair (2w, 2w+1) of row r0 + r of a (T, *) matrix
 * with row stride `stride` from base; zeros past T. */
__device__ void tc_load_tile(unsigned *tile, const __nv_bfloat16 *base, size_t stride, int r0,
                             int T_) {
    for (int e = threadIdx.x; e < TC_ROWS * (TC_HS / 2); e += blockDim.x) {
        const int r = e / (TC_HS / 2), w = e % (TC_HS / 2), t = r0 + r;
        tile[r * TC_LD + w] = t < T_ ? ld_bf16x2(base + (size_t)t * stride + 2 * w) : 0u;
    }
}

/* The same rows transposed: tileT[d][w] = the pair (rows 2w, 2w+1) of
 * dimension d, so that a B operand over rows (keys) is one word. */
__device__ void tc_load_tile_t(unsigned *tileT, const __nv_bfloat16 *base, size_t stride, int r0,
                               int T_) {
    for (int e = threadIdx.x; e < (TC_ROWS / 2) * (TC_HS / 2); e += blockDim.x) {
        const int rp = e / (TC_HS / 2), dp = e % (TC_HS / 2), t = r0 + 2 * rp;
        const unsigned v0 = t < T_ ? ld_bf16x2(base + (size_t)t * stride + 2 * dp) : 0u;
        const unsigned v1 = t + 1 < T_ ? ld_bf16x2(base + (size_t)(t + 1) * stride + 2 * dp) : 0u;
        tileT[2 * dp * TC_LD + rp] = (v0 & 0xffffu) | v1 << 16;
        tileT[(2 * dp + 1) * TC_LD + rp] = v0 >> 16 | (v1 & 0xffff0000u);
    }
}

/* A fragments (16 rows from r0, all 64 dims: 4 k-steps) of a tile. */
__device__ __forceinline__ void tc_a_frags(unsigned a[4][4], const unsigned *tile, int r0, int g,
                                           int t) {
#pragma unroll
    for (int ks = 0; ks < 4; ks++) {
        a[ks][0] = tile[(r0 + g) * TC_LD + 8 * ks + t];
        a[ks][1] = tile[(r0 + g + 8) * TC_LD + 8 * ks + t];
        a[ks][2] = tile[(r0 + g) * TC_LD + 8 * ks + 4 + t];
        a[ks][3] = tile[(r0 + g + 8) * TC_LD + 8 * ks + 4 + t];
    }
}

/* acc[nt] (16 x 8, nt = 0..7) = A (16 x 64) times rows 8 nt .. 8 nt + 7 of
 * the tile, transposed: B[k = dim][n = row] is the tile's row n. */
__device__ __forceinline__ void tc_mul_rows(float acc[8][4], const unsigned a[4][4],
                                            const unsigned *tile, int g, int t) {
#pragma unroll
    for (int nt = 0; nt < 8; nt++) {
        acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < 4; ks++) {
            const unsigned b[2] = {tile[(8 * nt + g) * TC_LD + 8 * ks + t],
                                   tile[(8 * nt + g) * TC_LD + 8 * ks + 4 + t]};
            mma_bf16_16816(acc[nt], a[ks], b, acc[nt]);
        }
    }
}

/* out[nt] (16 x 8, dims 8 nt ..) += P (16 x 64: the accumulator tiles p,
 * rounded to bf16, as the A operand without leaving registers) times a
 * 64-row tile given transposed (tc_load_tile_t): B[k = row][n = dim] is
 * then one word per register. */
__device__ __forceinline__ void tc_mul_tile_t(float out[8][4], const float p[8][4],
                                              const unsigned *tileT, int g, int t) {
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        const unsigned a[4] = {pack_bf16(p[2 * kk][0], p[2 * kk][1]),
                               pack_bf16(p[2 * kk][2], p[2 * kk][3]),
                               pack_bf16(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                               pack_bf16(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
        for (int nt = 0; nt < 8; nt++) {
            const unsigned b[2] = {tileT[(8 * nt + g) * TC_LD + 8 * kk + t],
                                   tileT[(8 * nt + g) * TC_LD + 8 * kk + 4 + t]};
            mma_bf16_16816(out[nt], a, b, out[nt]);
        }
    }
}

__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

__global__ void __launch_bounds__(TC_THREADS)
    tc_fwd_kernel(__nv_bfloat16 *out, float *lse, const __nv_bfloat16 *qkv, int T_, int NH,
                  int NKV, float sl2) {
    extern __shared__ float sm[];
    unsigned *Qs = reinterpret_cast<unsigned *>(sm), *Ks = Qs + TC_TILE_WORDS,
             *Vs = Ks + TC_TILE_WORDS;
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH, kh = h / (NH / NKV), C = NH * TC_HS;
    const int lane = threadIdx.x & 31, w16 = (threadIdx.x >> 5) * 16, g = lane >> 2, t = lane & 3;
    const int q0 = blockIdx.x * TC_ROWS, irow[2] = {q0 + w16 + g, q0 + w16 + g + 8};
    const size_t C3 = (size_t)(NH + 2 * NKV) * TC_HS; /* the qkv row */
    const __nv_bfloat16 *x = qkv + (size_t)b * T_ * C3, *base = x + (size_t)h * TC_HS;
    const __nv_bfloat16 *kb = x + (size_t)(NH + kh) * TC_HS;
    const __nv_bfloat16 *vb = x + (size_t)(NH + NKV + kh) * TC_HS;
    tc_load_tile(Qs, base, C3, q0, T_);
    __syncthreads();
    unsigned qa[4][4];
    tc_a_frags(qa, Qs, w16, g, t);
    float o[8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int nt = 0; nt < 8; nt++)
        o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
    const int last = min(q0 + TC_ROWS, T_) - 1;
    for (int k0 = 0; k0 <= last; k0 += TC_ROWS) {
        __syncthreads();
        tc_load_tile(Ks, kb, C3, k0, T_);
        tc_load_tile_t(Vs, vb, C3, k0, T_);
        __syncthreads();
        float s[8][4];
        tc_mul_rows(s, qa, Ks, g, t);
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int j = k0 + 8 * nt + 2 * t + (e & 1), i = irow[e >> 1];
                s[nt][e] = j <= i && j < T_ ? s[nt][e] * sl2 : -INFINITY;
                mx[e >> 1] = fmaxf(mx[e >> 1], s[nt][e]);
            }
        /* key 0 is in every row's first tile: mx is finite from there on */
        float corr[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = quad_max(mx[r]);
            corr[r] = exp2f(m[r] - mx[r]);
            m[r] = mx[r];
            l[r] *= corr[r];
        }
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                o[nt][e] *= corr[e >> 1];
                s[nt][e] = exp2f(s[nt][e] - m[e >> 1]);
                l[e >> 1] += s[nt][e]; /* this lane's part of the row sum */
            }
        tc_mul_tile_t(o, s, Vs, g, t);
    }
#pragma unroll
    for (int r = 0; r < 2; r++)
        l[r] = quad_sum(l[r]);
    for (int r = 0; r < 2; r++) {
        const int i = irow[r];
        if (i >= T_)
            continue;
        if (t == 0)
            lse[(size_t)bh * T_ + i] = m[r] * TC_LN2 + logf(l[r]);
        __nv_bfloat16 *orow = out + ((size_t)b * T_ + i) * C + (size_t)h * TC_HS;
        const float il = 1.0f / l[r];
        for (int nt = 0; nt < 8; nt++) {
            st(orow + 8 * nt + 2 * t, o[nt][2 * r] * il);
            st(orow + 8 * nt + 2 * t + 1, o[nt][2 * r + 1] * il);
        }
    }
}

/* D[bh, i] = sum_d dO[i, d] O[i, d] (FlashAttention-2's preprocessing). */
__global__ void tc_dsum_kernel(float *D, const __nv_bfloat16 *dout, const __nv_bfloat16 *out,
                               int B, int T_, int NH) {
    const size_t r = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= (size_t)B * NH * T_)
        return;
    const size_t C = (size_t)NH * TC_HS;
    const size_t bh = r / T_, i = r % T_, b = bh / NH, h = bh % NH;
    const size_t off = (b * T_ + i) * C + h * TC_HS;
    float s = 0.0f;
    for (int d = 0; d < TC_HS; d++)
        s += ld(dout + off + d) * ld(out + off + d);
    D[r] = s;
}

/* dK, dV of one block of 64 keys of one kv head over the query tiles at or
 * after it, of every query head of its group. */
__global__ void __launch_bounds__(TC_THREADS)
    tc_bwd_dkv_kernel(__nv_bfloat16 *dqkv, const __nv_bfloat16 *dout, const __nv_bfloat16 *qkv,
                      const float *lse, const float *D, int T_, int NH, int NKV, float sl2,
                      float scale) {
    extern __shared__ float sm[];
    unsigned *Ks = reinterpret_cast<unsigned *>(sm), *Vs = Ks + TC_TILE_WORDS,
             *Qs = Vs + TC_TILE_WORDS, *dOs = Qs + TC_TILE_WORDS, *Qt = dOs + TC_TILE_WORDS,
             *dOt = Qt + TC_TILE_WORDS;
    float *ls = reinterpret_cast<float *>(dOt + TC_TILE_WORDS), *Ds = ls + TC_ROWS;
    const int b = blockIdx.y / NKV, kh = blockIdx.y % NKV, group = NH / NKV, C = NH * TC_HS;
    const int lane = threadIdx.x & 31, w16 = (threadIdx.x >> 5) * 16, g = lane >> 2, t = lane & 3;
    const int k0 = blockIdx.x * TC_ROWS, jrow[2] = {k0 + w16 + g, k0 + w16 + g + 8};
    const size_t C3 = (size_t)(NH + 2 * NKV) * TC_HS; /* the qkv row */
    const __nv_bfloat16 *x = qkv + (size_t)b * T_ * C3;
    const size_t kcol = (size_t)(NH + kh) * TC_HS, vcol = (size_t)(NH + NKV + kh) * TC_HS;
    tc_load_tile(Ks, x + kcol, C3, k0, T_);
    tc_load_tile(Vs, x + vcol, C3, k0, T_);
    __syncthreads();
    unsigned ka[4][4], va[4][4];
    tc_a_frags(ka, Ks, w16, g, t);
    tc_a_frags(va, Vs, w16, g, t);
    float dk[8][4], dv[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            dk[nt][e] = dv[nt][e] = 0.0f;
    for (int h = kh * group; h < (kh + 1) * group; h++) {
        const size_t bh = (size_t)b * NH + h;
        const __nv_bfloat16 *base = x + (size_t)h * TC_HS;
        const __nv_bfloat16 *dobase = dout + (size_t)b * T_ * C + (size_t)h * TC_HS;
        for (int i0 = k0; i0 < T_; i0 += TC_ROWS) {
            __syncthreads();
            tc_load_tile(Qs, base, C3, i0, T_);
            tc_load_tile(dOs, dobase, C, i0, T_);
            tc_load_tile_t(Qt, base, C3, i0, T_);
            tc_load_tile_t(dOt, dobase, C, i0, T_);
            for (int r = threadIdx.x; r < TC_ROWS; r += blockDim.x) {
                const bool in = i0 + r < T_;
                ls[r] = in ? lse[(size_t)bh * T_ + i0 + r] * TC_LOG2E : 0.0f;
                Ds[r] = in ? D[(size_t)bh * T_ + i0 + r] : 0.0f;
            }
            __syncthreads();
            float s[8][4], dp[8][4]; /* S^T, dP^T: rows keys, columns queries */
            tc_mul_rows(s, ka, Qs, g, t);
            tc_mul_rows(dp, va, dOs, g, t);
#pragma unroll
            for (int nt = 0; nt < 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int c = 8 * nt + 2 * t + (e & 1), i = i0 + c, j = jrow[e >> 1];
                    const float p = j <= i && i < T_ ? exp2f(s[nt][e] * sl2 - ls[c]) : 0.0f;
                    s[nt][e] = p;
                    dp[nt][e] = p * (dp[nt][e] - Ds[c]);
                }
            tc_mul_tile_t(dv, s, dOt, g, t);
            tc_mul_tile_t(dk, dp, Qt, g, t);
        }
    }
    for (int r = 0; r < 2; r++) {
        const int j = jrow[r];
        if (j >= T_)
            continue;
        __nv_bfloat16 *dkrow = dqkv + ((size_t)b * T_ + j) * C3 + kcol;
        __nv_bfloat16 *dvrow = dqkv + ((size_t)b * T_ + j) * C3 + vcol;
        for (int nt = 0; nt < 8; nt++)
            for (int e = 0; e < 2; e++) {
                const int d = 8 * nt + 2 * t + e;
                st(dkrow + d, ld(dkrow + d) + dk[nt][2 * r + e] * scale);
                st(dvrow + d, ld(dvrow + d) + dv[nt][2 * r + e]);
            }
    }
}

/* dQ of one block of 64 queries over the key tiles before it. */
__global__ void __launch_bounds__(TC_THREADS)
    tc_bwd_dq_kernel(__nv_bfloat16 *dqkv, const __nv_bfloat16 *dout, const __nv_bfloat16 *qkv,
                     const float *lse, const float *D, int T_, int NH, int NKV, float sl2,
                     float scale) {
    extern __shared__ float sm[];
    unsigned *Qs = reinterpret_cast<unsigned *>(sm), *dOs = Qs + TC_TILE_WORDS,
             *Ks = dOs + TC_TILE_WORDS, *Vs = Ks + TC_TILE_WORDS, *Kt = Vs + TC_TILE_WORDS;
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH, kh = h / (NH / NKV), C = NH * TC_HS;
    const int lane = threadIdx.x & 31, w16 = (threadIdx.x >> 5) * 16, g = lane >> 2, t = lane & 3;
    const int q0 = blockIdx.x * TC_ROWS, irow[2] = {q0 + w16 + g, q0 + w16 + g + 8};
    const size_t C3 = (size_t)(NH + 2 * NKV) * TC_HS; /* the qkv row */
    const __nv_bfloat16 *x = qkv + (size_t)b * T_ * C3, *base = x + (size_t)h * TC_HS;
    const __nv_bfloat16 *kb = x + (size_t)(NH + kh) * TC_HS;
    const __nv_bfloat16 *vb = x + (size_t)(NH + NKV + kh) * TC_HS;
    tc_load_tile(Qs, base, C3, q0, T_);
    tc_load_tile(dOs, dout + (size_t)b * T_ * C + (size_t)h * TC_HS, C, q0, T_);
    __syncthreads();
    unsigned qa[4][4], da[4][4];
    tc_a_frags(qa, Qs, w16, g, t);
    tc_a_frags(da, dOs, w16, g, t);
    float li[2], Di[2], dq[8][4];
    for (int r = 0; r < 2; r++) {
        const bool in = irow[r] < T_;
        li[r] = in ? lse[(size_t)bh * T_ + irow[r]] * TC_LOG2E : 0.0f;
        Di[r] = in ? D[(size_t)bh * T_ + irow[r]] : 0.0f;
    }
#pragma unroll
    for (int nt = 0; nt < 8; nt++)
        dq[nt][0] = dq[nt][1] = dq[nt][2] = dq[nt][3] = 0.0f;
    const int last = min(q0 + TC_ROWS, T_) - 1;
    for (int k0 = 0; k0 <= last; k0 += TC_ROWS) {
        __syncthreads();
        tc_load_tile(Ks, kb, C3, k0, T_);
        tc_load_tile(Vs, vb, C3, k0, T_);
        tc_load_tile_t(Kt, kb, C3, k0, T_);
        __syncthreads();
        float s[8][4], dp[8][4];
        tc_mul_rows(s, qa, Ks, g, t);
        tc_mul_rows(dp, da, Vs, g, t);
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int j = k0 + 8 * nt + 2 * t + (e & 1), i = irow[e >> 1];
                const float p = j <= i && i < T_ ? exp2f(s[nt][e] * sl2 - li[e >> 1]) : 0.0f;
                dp[nt][e] = p * (dp[nt][e] - Di[e >> 1]);
            }
        tc_mul_tile_t(dq, dp, Kt, g, t);
    }
    for (int r = 0; r < 2; r++) {
        const int i = irow[r];
        if (i >= T_)
            continue;
        __nv_bfloat16 *dqrow = dqkv + ((size_t)b * T_ + i) * C3 + (size_t)h * TC_HS;
        for (int nt = 0; nt < 8; nt++)
            for (int e = 0; e < 2; e++) {
                const int d = 8 * nt + 2 * t + e;
                st(dqrow + d, ld(dqrow + d) + dq[nt][2 * r + e] * scale);
            }
    }
}

/* The tiles load bf16 pairs as 32-bit words: qkv and dout 4-byte aligned
 * (the slab's ranges are 256-byte aligned). */
static int tc_check(int B, int T_, int NH, int NKV, int hs, const void *qkv, const void *dout) {
    if (B < 0 || T_ < 0 || NH <= 0 || NKV <= 0 || NH % NKV != 0 || hs < 1)
        return LOCO_ERR(LOCO_EINVAL, "tensor-core attention: NH=%d, NKV=%d, hs=%d, B=%d, T=%d", NH,
                        NKV, hs, B, T_);
    if ((uintptr_t)qkv % 4 || (uintptr_t)dout % 4)
        return LOCO_ERR(LOCO_EINVAL, "tensor-core attention: qkv %p / dout %p not 4-byte aligned",
                        qkv, dout);
    if (hs != TC_HS)
        return LOCO_ERR(LOCO_ENOTSUP,
                        "tensor-core attention: head size %d; it has head size 64 only (the "
                        "reference kernel takes 1..128)",
                        hs);
    return 0;
}

/* The MHA entry points' (C, NH): NKV = NH, head size C / NH. */
static int tc_check_mha(int C, int NH) {
    if (NH <= 0 || C % NH != 0)
        return LOCO_ERR(LOCO_EINVAL, "tensor-core attention: C=%d, NH=%d", C, NH);
    return 0;
}

extern "C" int loco_cuda_attention_tc_gqa_fwd_bf16(loco_bf16 *out, float *lse,
                                                   const loco_bf16 *qkv, int B, int T, int NH,
                                                   int NKV, int hs, loco_stream s) {
    LOCO_CHECK(tc_check(B, T, NH, NKV, hs, qkv, NULL));
    if ((size_t)B * T == 0)
        return 0;
    const size_t smem = 3 * TC_TILE_WORDS * sizeof(unsigned);
    CUDA_CHECK(cudaFuncSetAttribute(tc_fwd_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)smem));
    const float scale = 1.0f / sqrtf((float)TC_HS);
    const dim3 grid((T + TC_ROWS - 1) / TC_ROWS, B * NH);
    tc_fwd_kernel<<<grid, TC_THREADS, smem, s>>>(bf(out), lse, bf(qkv), T, NH, NKV,
                                                 scale * TC_LOG2E);
    CUDA_LAUNCHED("attention_tc_fwd");
    return 0;
}

extern "C" int loco_cuda_attention_tc_gqa_bwd_bf16(loco_bf16 *dqkv, float *scratch,
                                                   const loco_bf16 *dout, const loco_bf16 *out,
                                                   const loco_bf16 *qkv, const float *lse, int B,
                                                   int T, int NH, int NKV, int hs, loco_stream s) {
    LOCO_CHECK(tc_check(B, T, NH, NKV, hs, qkv, dout));
    const size_t rows = (size_t)B * NH * T;
    if (rows == 0)
        return 0;
    tc_dsum_kernel<<<(unsigned)((rows + 255) / 256), 256, 0, s>>>(scratch, bf(dout), bf(out), B,
                                                                  T, NH);
    CUDA_LAUNCHED("attention_tc_bwd (D)");
    const float scale = 1.0f / sqrtf((float)TC_HS);
    const dim3 grid_kv((T + TC_ROWS - 1) / TC_ROWS, B * NKV);
    const dim3 grid_q((T + TC_ROWS - 1) / TC_ROWS, B * NH);
    const size_t smem_kv = 6 * TC_TILE_WORDS * sizeof(unsigned) + 2 * TC_ROWS * sizeof(float);
    const size_t smem_q = 5 * TC_TILE_WORDS * sizeof(unsigned);
    CUDA_CHECK(cudaFuncSetAttribute(tc_bwd_dkv_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)smem_kv));
    CUDA_CHECK(cudaFuncSetAttribute(tc_bwd_dq_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)smem_q));
    tc_bwd_dkv_kernel<<<grid_kv, TC_THREADS, smem_kv, s>>>(bf(dqkv), bf(dout), bf(qkv), lse,
                                                           scratch, T, NH, NKV, scale * TC_LOG2E,
                                                           scale);
    CUDA_LAUNCHED("attention_tc_bwd (dk, dv)");
    tc_bwd_dq_kernel<<<grid_q, TC_THREADS, smem_q, s>>>(bf(dqkv), bf(dout), bf(qkv), lse, scratch,
                                                        T, NH, NKV, scale * TC_LOG2E, scale);
    CUDA_LAUNCHED("attention_tc_bwd (dq)");
    return 0;
}

extern "C" int loco_cuda_attention_tc_fwd_bf16(loco_bf16 *out, float *lse, const loco_bf16 *qkv,
                                               int B, int T, int C, int NH, loco_stream s) {
    LOCO_CHECK(tc_check_mha(C, NH));
    return loco_cuda_attention_tc_gqa_fwd_bf16(out, lse, qkv, B, T, NH, NH, C / NH, s);
}

extern "C" int loco_cuda_attention_tc_bwd_bf16(loco_bf16 *dqkv, float *scratch,
                                               const loco_bf16 *dout, const loco_bf16 *out,
                                               const loco_bf16 *qkv, const float *lse, int B,
                                               int T, int C, int NH, loco_stream s) {
    LOCO_CHECK(tc_check_mha(C, NH));
    return loco_cuda_attention_tc_gqa_bwd_bf16(dqkv, scratch, dout, out, qkv, lse, B, T, NH, NH,
                                               C / NH, s);
}

/* The device's compute capability as major * 10 + minor. */
static int tc_device_cc(int *cc) {
    int dev = 0, major = 0, minor = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    *cc = 10 * major + minor;
    return 0;
}

extern "C" int loco_cuda_attention_select(const char *want, int head_size, bool bf16,
                                          loco_attn_impl *out) {
    *out = LOCO_ATTN_REFERENCE;
    if (!want || !strcmp(want, "reference"))
        return 0;
    if (strcmp(want, "auto") && strcmp(want, "tensor"))
        return LOCO_ERR(LOCO_EINVAL, "attention kernel '%s': expected auto, tensor or reference",
                        want);
    int cc = 0;
    if (!bf16) {
        loco_warn("attention = %s: the tensor-core kernel is bf16 only and this model runs fp32; "
                  "using the reference kernel",
                  want);
        return 0;
    }
    if (head_size != TC_HS) {
        loco_warn("attention = %s: the tensor-core kernel has head size %d only, this model %d; "
                  "using the reference kernel",
                  want, TC_HS, head_size);
        return 0;
    }
    if (tc_device_cc(&cc) < 0) {
        loco_warn("attention = %s: cannot read the device's compute capability (%s); using the "
                  "reference kernel",
                  want, loco_errmsg());
        return 0;
    }
    if (cc < 80) {
        loco_warn("attention = %s: the tensor-core kernel needs compute capability 8.0 (bf16 "
                  "mma.sync), the device has %d.%d; using the reference kernel",
                  want, cc / 10, cc % 10);
        return 0;
    }
    *out = LOCO_ATTN_TENSOR;
    return 0;
}
