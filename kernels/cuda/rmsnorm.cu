/* RMSNorm over the channel dim: one warp per row; the weight gradient is a
 * column sum over rows in a fixed order (no atomics). */
#include "kernels/cuda/common.cuh"

enum { RMS_ROWS_PER_BLOCK = 8, RMS_COLS = 32, RMS_ROW_LANES = 32 };

/* x * rstd as HF hands it to the weight: cast to the activations' type. */
__device__ __forceinline__ float as_stored(float v, const float *) {
    return v;
}
__device__ __forceinline__ float as_stored(float v, const __nv_bfloat16 *) {
    return __bfloat162float(__float2bfloat16_rn(v));
}

template <typename T>
__global__ void rmsnorm_fwd_kernel(T *out, float *rstd, const T *inp, const T *w, int N, int C,
                                   float eps) {
    const int n = blockIdx.x * RMS_ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (n >= N)
        return;
    const T *x = inp + (size_t)n * C;
    T *o = out + (size_t)n * C;
    float ss = 0.0f;
    for (int c = lane; c < C; c += 32) {
        const float v = ld(x + c);
        ss += v * v;
    }
    const float r = 1.0f / sqrtf(warp_sum(ss) / C + eps);
    for (int c = lane; c < C; c += 32)
        st(o + c, ld(w + c) * as_stored(ld(x + c) * r, x));
    if (lane == 0)
        rstd[n] = r;
}

/* dinp += rstd * (g - xh * mean(g * xh)), g = dout * w, xh = x * rstd */
template <typename T>
__global__ void rmsnorm_bwd_dinp_kernel(T *dinp, const T *dout, const T *inp, const T *w,
                                        const float *rstd, int N, int C) {
    const int n = blockIdx.x * RMS_ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (n >= N)
        return;
    const T *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
    T *di = dinp + (size_t)n * C;
    const float r = rstd[n];
    float sgx = 0.0f;
    for (int c = lane; c < C; c += 32)
        sgx += ld(d + c) * ld(w + c) * (ld(x + c) * r);
    sgx = warp_sum(sgx) / C;
    for (int c = lane; c < C; c += 32)
        st(di + c, ld(di + c) + r * (ld(d + c) * ld(w + c) - (ld(x + c) * r) * sgx));
}

/* dw += column sums of dout * xh: block (RMS_COLS, RMS_ROW_LANES) owns
 * RMS_COLS channels; lane y sums rows y, y + RMS_ROW_LANES, ... in double,
 * then the lanes are added in y order. */
template <typename T>
__global__ void rmsnorm_bwd_dw_kernel(float *dw, const T *dout, const T *inp, const float *rstd,
                                      int N, int C) {
    __shared__ double sw[RMS_ROW_LANES][RMS_COLS];
    const int c = blockIdx.x * RMS_COLS + threadIdx.x, y = threadIdx.y;
    double aw = 0.0;
    if (c < C)
        for (int n = y; n < N; n += RMS_ROW_LANES) {
            const float xh = ld(inp + (size_t)n * C + c) * rstd[n];
            aw += (double)(ld(dout + (size_t)n * C + c) * xh);
        }
    sw[y][threadIdx.x] = aw;
    __syncthreads();
    if (y != 0 || c >= C)
        return;
    for (int k = 1; k < RMS_ROW_LANES; k++)
        aw += sw[k][threadIdx.x];
    dw[c] += (float)aw;
}

template <typename T>
static int rmsnorm_fwd(T *out, float *rstd, const T *inp, const T *w, int N, int C, float eps,
                       loco_stream s) {
    if (N <= 0)
        return 0;
    const int blocks = (N + RMS_ROWS_PER_BLOCK - 1) / RMS_ROWS_PER_BLOCK;
    rmsnorm_fwd_kernel<T><<<blocks, 32 * RMS_ROWS_PER_BLOCK, 0, s>>>(out, rstd, inp, w, N, C, eps);
    CUDA_LAUNCHED("rmsnorm_fwd");
    return 0;
}

template <typename T>
static int rmsnorm_bwd(T *dinp, float *dw, const T *dout, const T *inp, const T *w,
                       const float *rstd, int N, int C, loco_stream s) {
    if (N <= 0 || C <= 0)
        return 0;
    const int blocks = (N + RMS_ROWS_PER_BLOCK - 1) / RMS_ROWS_PER_BLOCK;
    rmsnorm_bwd_dinp_kernel<T>
        <<<blocks, 32 * RMS_ROWS_PER_BLOCK, 0, s>>>(dinp, dout, inp, w, rstd, N, C);
    CUDA_LAUNCHED("rmsnorm_bwd (dinp)");
    const dim3 th(RMS_COLS, RMS_ROW_LANES);
    rmsnorm_bwd_dw_kernel<T>
        <<<(C + RMS_COLS - 1) / RMS_COLS, th, 0, s>>>(dw, dout, inp, rstd, N, C);
    CUDA_LAUNCHED("rmsnorm_bwd (dw)");
    return 0;
}

extern "C" int loco_cuda_rmsnorm_fwd(float *out, float *rstd, const float *inp, const float *w,
                                     int N, int C, float eps, loco_stream s) {
    return rmsnorm_fwd<float>(out, rstd, inp, w, N, C, eps, s);
}

extern "C" int loco_cuda_rmsnorm_fwd_bf16(loco_bf16 *out, float *rstd, const loco_bf16 *inp,
                                          const loco_bf16 *w, int N, int C, float eps,
                                          loco_stream s) {
    return rmsnorm_fwd<__nv_bfloat16>(bf(out), rstd, bf(inp), bf(w), N, C, eps, s);
}

extern "C" int loco_cuda_rmsnorm_bwd(float *dinp, float *dw, const float *dout, const float *inp,
                                     const float *w, const float *rstd, int N, int C,
                                     loco_stream s) {
    return rmsnorm_bwd<float>(dinp, dw, dout, inp, w, rstd, N, C, s);
}

extern "C" int loco_cuda_rmsnorm_bwd_bf16(loco_bf16 *dinp, float *dw, const loco_bf16 *dout,
                                          const loco_bf16 *inp, const loco_bf16 *w,
                                          const float *rstd, int N, int C, loco_stream s) {
    return rmsnorm_bwd<__nv_bfloat16>(bf(dinp), dw, bf(dout), bf(inp), bf(w), rstd, N, C, s);
}
