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

/* ---- tensor cores (attention_tc.cu): one warp-wide bf16 MMA and packing.
 * mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (sm_80+), fragments
 * as the PTX ISA gives them (9.7.14.5.8), g = lane >> 2, t = lane % 4:
 * a[r] two bf16 (low half first) of A (16x16, row-major): a[0] row g cols
 * 2t, 2t+1; a[1] row g+8, same cols; a[2] row g, cols 2t+8, 2t+9; a[3] row
 * g+8, cols 2t+8, 2t+9. b[r] of B (16x8): b[0] rows 2t, 2t+1 of column g,
 * b[1] rows 2t+8, 2t+9. c, d (16x8 fp32): c[0], c[1] row g cols 2t, 2t+1;
 * c[2], c[3] row g+8. Every lane of the warp must call it together. On the
 * emulator (tests/gpu/emu, LOCO_GPU_EMU) emu_mma_m16n8k16_bf16 computes the
 * same product from the fragments the 32 lanes hold. */
__device__ __forceinline__ void mma_bf16_16816(float d[4], const unsigned a[4], const unsigned b[2],
                                               const float c[4]) {
#ifdef LOCO_GPU_EMU
    emu_mma_m16n8k16_bf16(d, a, b, c);
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]),
                   "f"(c[1]), "f"(c[2]), "f"(c[3]));
#endif
}

/* Two bf16 in one register, lo in the low half (the fragments' order). */
__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
    return (unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(lo)) |
           (unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(hi)) << 16;
}
/* p[0], p[1] (4-byte aligned) as one register, p[0] low. */
__device__ __forceinline__ unsigned ld_bf16x2(const __nv_bfloat16 *p) {
#ifdef LOCO_GPU_EMU
    return (unsigned)__bfloat16_as_ushort(p[0]) | (unsigned)__bfloat16_as_ushort(p[1]) << 16;
#else
    return *reinterpret_cast<const unsigned *>(p);
#endif
}

#endif
