/* LayerNorm over the channel dim: one warp per row; the weight and bias
 * gradients are column sums over rows in a fixed order (no atomics). */
#include "kernels/cuda/common.cuh"

#define LN_EPS 1e-5f

enum { LN_ROWS_PER_BLOCK = 8, LN_COLS = 32, LN_ROW_LANES = 32 };

template <typename T>
__global__ void layernorm_fwd_kernel(T *out, float *mean, float *rstd, const T *inp, const T *w,
                                     const T *b, int N, int C) {
    const int n = blockIdx.x * LN_ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (n >= N)
        return;
    const T *x = inp + (size_t)n * C;
    T *o = out + (size_t)n * C;
    float s = 0.0f;
    for (int c = lane; c < C; c += 32)
        s += ld(x + c);
    const float m = warp_sum(s) / C;
    float v = 0.0f;
    for (int c = lane; c < C; c += 32) {
        const float d = ld(x + c) - m;
        v += d * d;
    }
    const float r = 1.0f / sqrtf(warp_sum(v) / C + LN_EPS);
    for (int c = lane; c < C; c += 32)
        st(o + c, (ld(x + c) - m) * r * ld(w + c) + ld(b + c));
    if (lane == 0) {
        mean[n] = m;
        rstd[n] = r;
    }
}

/* dinp += rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dout * w */
template <typename T>
__global__ void layernorm_bwd_dinp_kernel(T *dinp, const T *dout, const T *inp, const T *w,
                                          const float *mean, const float *rstd, int N, int C) {
    const int n = blockIdx.x * LN_ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (n >= N)
        return;
    const T *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
    T *di = dinp + (size_t)n * C;
    const float m = mean[n], r = rstd[n];
    float sg = 0.0f, sgx = 0.0f;
    for (int c = lane; c < C; c += 32) {
        const float g = ld(d + c) * ld(w + c);
        sg += g;
        sgx += g * (ld(x + c) - m) * r;
    }
    sg = warp_sum(sg) / C;
    sgx = warp_sum(sgx) / C;
    for (int c = lane; c < C; c += 32) {
        const float xh = (ld(x + c) - m) * r;
        st(di + c, ld(di + c) + r * (ld(d + c) * ld(w + c) - sg - xh * sgx));
    }
}

/* dw, db += column sums: block (LN_COLS, LN_ROW_LANES) owns LN_COLS channels;
 * lane y sums rows y, y + LN_ROW_LANES, ... in double, then the lanes are
 * added in y order. */
template <typename T>
__global__ void layernorm_bwd_dwdb_kernel(float *dw, float *db, const T *dout, const T *inp,
                                          const float *mean, const float *rstd, int N, int C) {
    __shared__ double sw[LN_ROW_LANES][LN_COLS], sb[LN_ROW_LANES][LN_COLS];
    const int c = blockIdx.x * LN_COLS + threadIdx.x, y = threadIdx.y;
    double aw = 0.0, ab = 0.0;
    if (c < C)
        for (int n = y; n < N; n += LN_ROW_LANES) {
            const float d = ld(dout + (size_t)n * C + c);
            const float xh = (ld(inp + (size_t)n * C + c) - mean[n]) * rstd[n];
            aw += (double)(d * xh);
            ab += (double)d;
        }
    sw[y][threadIdx.x] = aw;
    sb[y][threadIdx.x] = ab;
    __syncthreads();
    if (y != 0 || c >= C)
        return;
    for (int k = 1; k < LN_ROW_LANES; k++) {
        aw += sw[k][threadIdx.x];
        ab += sb[k][threadIdx.x];
    }
    dw[c] += (float)aw;
    db[c] += (float)ab;
}

template <typename T>
static int layernorm_fwd(T *out, float *mean, float *rstd, const T *inp, const T *w, const T *b,
                         int N, int C, loco_stream s) {
    if (N <= 0)
        return 0;
    const int blocks = (N + LN_ROWS_PER_BLOCK - 1) / LN_ROWS_PER_BLOCK;
    layernorm_fwd_kernel<T><<<blocks, 32 * LN_ROWS_PER_BLOCK, 0, s>>>(out, mean, rstd, inp, w, b,
                                                                     N, C);
    CUDA_LAUNCHED("layernorm_fwd");
    return 0;
}

template <typename T>
static int layernorm_bwd(T *dinp, float *dw, float *db, const T *dout, const T *inp, const T *w,
                         const float *mean, const float *rstd, int N, int C, loco_stream s) {
    if (N <= 0)
        return 0;
    const int blocks = (N + LN_ROWS_PER_BLOCK - 1) / LN_ROWS_PER_BLOCK;
    layernorm_bwd_dinp_kernel<T><<<blocks, 32 * LN_ROWS_PER_BLOCK, 0, s>>>(dinp, dout, inp, w,
                                                                          mean, rstd, N, C);
    CUDA_LAUNCHED("layernorm_bwd (dinp)");
    const dim3 th(LN_COLS, LN_ROW_LANES);
    layernorm_bwd_dwdb_kernel<T><<<(C + LN_COLS - 1) / LN_COLS, th, 0, s>>>(dw, db, dout, inp,
                                                                           mean, rstd, N, C);
    CUDA_LAUNCHED("layernorm_bwd (dw, db)");
    return 0;
}

extern "C" int loco_cuda_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp,
                                       const float *w, const float *b, int N, int C,
                                       loco_stream s) {
    return layernorm_fwd<float>(out, mean, rstd, inp, w, b, N, C, s);
}

extern "C" int loco_cuda_layernorm_fwd_bf16(loco_bf16 *out, float *mean, float *rstd,
                                            const loco_bf16 *inp, const loco_bf16 *w,
                                            const loco_bf16 *b, int N, int C, loco_stream s) {
    return layernorm_fwd<__nv_bfloat16>(bf(out), mean, rstd, bf(inp), bf(w), bf(b), N, C, s);
}

extern "C" int loco_cuda_layernorm_bwd(float *dinp, float *dw, float *db, const float *dout,
                                       const float *inp, const float *w, const float *mean,
                                       const float *rstd, int N, int C, loco_stream s) {
    return layernorm_bwd<float>(dinp, dw, db, dout, inp, w, mean, rstd, N, C, s);
}

extern "C" int loco_cuda_layernorm_bwd_bf16(loco_bf16 *dinp, float *dw, float *db,
                                            const loco_bf16 *dout, const loco_bf16 *inp,
                                            const loco_bf16 *w, const float *mean,
                                            const float *rstd, int N, int C, loco_stream s) {
    return layernorm_bwd<__nv_bfloat16>(bf(dinp), dw, db, bf(dout), bf(inp), bf(w), mean, rstd,
                                        N, C, s);
}
