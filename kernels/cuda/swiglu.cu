/* SwiGLU, silu(gate) * up with gate and up side by side in each row: one
 * thread per output element. */
#include <math.h>

#include "kernels/cuda/common.cuh"

enum { SWIGLU_THREADS = 256 };

template <typename T> __global__ void swiglu_fwd_kernel(T *out, const T *gu, int F, size_t n) {
    for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < n;
         k += (size_t)gridDim.x * blockDim.x) {
        const size_t row = k / F, i = k % F;
        const float g = ld(gu + row * 2 * F + i), u = ld(gu + row * 2 * F + F + i);
        const float sig = 1.0f / (1.0f + expf(-g));
        st(out + k, g * sig * u);
    }
}

template <typename T>
__global__ void swiglu_bwd_kernel(T *dgu, const T *gu, const T *dout, int F, size_t n) {
    for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < n;
         k += (size_t)gridDim.x * blockDim.x) {
        const size_t row = k / F, i = k % F;
        const size_t jg = row * 2 * F + i, ju = jg + F;
        const float g = ld(gu + jg), u = ld(gu + ju), d = ld(dout + k);
        const float sig = 1.0f / (1.0f + expf(-g));
        st(dgu + jg, ld(dgu + jg) + d * u * (sig * (1.0f + g * (1.0f - sig))));
        st(dgu + ju, ld(dgu + ju) + d * (g * sig));
    }
}

template <typename T> static int swiglu_fwd(T *out, const T *gu, int N, int F, loco_stream s) {
    const size_t n = (size_t)N * F;
    if (N <= 0 || F <= 0)
        return 0;
    swiglu_fwd_kernel<T><<<grid_for(n, SWIGLU_THREADS), SWIGLU_THREADS, 0, s>>>(out, gu, F, n);
    CUDA_LAUNCHED("swiglu_fwd");
    return 0;
}

template <typename T>
static int swiglu_bwd(T *dgu, const T *gu, const T *dout, int N, int F, loco_stream s) {
    const size_t n = (size_t)N * F;
    if (N <= 0 || F <= 0)
        return 0;
    swiglu_bwd_kernel<T>
        <<<grid_for(n, SWIGLU_THREADS), SWIGLU_THREADS, 0, s>>>(dgu, gu, dout, F, n);
    CUDA_LAUNCHED("swiglu_bwd");
    return 0;
}

extern "C" int loco_cuda_swiglu_fwd(float *out, const float *gu, int N, int F, loco_stream s) {
    return swiglu_fwd<float>(out, gu, N, F, s);
}

extern "C" int loco_cuda_swiglu_fwd_bf16(loco_bf16 *out, const loco_bf16 *gu, int N, int F,
                                         loco_stream s) {
    return swiglu_fwd<__nv_bfloat16>(bf(out), bf(gu), N, F, s);
}

extern "C" int loco_cuda_swiglu_bwd(float *dgu, const float *gu, const float *dout, int N, int F,
                                    loco_stream s) {
    return swiglu_bwd<float>(dgu, gu, dout, N, F, s);
}

extern "C" int loco_cuda_swiglu_bwd_bf16(loco_bf16 *dgu, const loco_bf16 *gu, const loco_bf16 *dout,
                                         int N, int F, loco_stream s) {
    return swiglu_bwd<__nv_bfloat16>(bf(dgu), bf(gu), bf(dout), N, F, s);
}
