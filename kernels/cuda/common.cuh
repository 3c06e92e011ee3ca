/* Internal to kernels/cuda: the C headers seen from C++, CUDA error
 * translation, bf16 loads and stores, block reductions. */
#ifndef LOCO_KERNELS_CUDA_COMMON_CUH
#define LOCO_KERNELS_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>

extern "C" {
#include "core/core.h"
#include "kernels/kernels.h"
}

/* Translates a CUDA status at the border: LOCO_ECUDA naming the call. */
#define CUDA_CHECK(call)                                                                 \
    do {                                                                                 \
        cudaError_t e_ = (call);                                                         \
        if (e_ != cudaSuccess)                                                           \
            return LOCO_ERR(LOCO_ECUDA, "%s: %s", #call, cudaGetErrorString(e_));        \
    } while (0)

/* After a launch: the launch's own error (bad configuration, no device). */
#define CUDA_LAUNCHED(what)                                                              \
    do {                                                                                 \
        cudaError_t e_ = cudaGetLastError();                                             \
        if (e_ != cudaSuccess)                                                           \
            return LOCO_ERR(LOCO_ECUDA, "%s: %s", (what), cudaGetErrorString(e_));       \
    } while (0)

/* Storage types: float as is, loco_bf16 bits as __nv_bfloat16. */
__device__ __forceinline__ float ld(const float *p) { return *p; }
__device__ __forceinline__ float ld(const __nv_bfloat16 *p) { return __bfloat162float(*p); }
__device__ __forceinline__ void st(float *p, float v) { *p = v; }
__device__ __forceinline__ void st(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }

static inline __nv_bfloat16 *bf(loco_bf16 *p) { return reinterpret_cast<__nv_bfloat16 *>(p); }
static inline const __nv_bfloat16 *bf(const loco_bf16 *p) {
    return reinterpret_cast<const __nv_bfloat16 *>(p);
}

static inline unsigned grid_for(size_t n, unsigned threads) {
    size_t g = (n + threads - 1) / threads;
    const size_t cap = 65535u * 32u; /* grid-stride loops cover the rest */
    return (unsigned)(g < 1 ? 1 : g > cap ? cap : g);
}

template <typename T> __device__ __forceinline__ T warp_sum(T v) {
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum over the block (blockDim.x a multiple of 32, at most 1024), in a
 * fixed order; every thread receives it. shm holds 32 values. */
template <typename T> __device__ T block_sum(T v, T *shm) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0)
        shm[wid] = v;
    __syncthreads();
    v = lane < nw ? shm[lane] : T(0);
    return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v, float *shm) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0)
        shm[wid] = v;
    __syncthreads();
    v = lane < nw ? shm[lane] : -INFINITY;
    return warp_max(v);
}

#endif
