/* Host emulation of the CUDA execution model, enough for kernels/cuda:
 * every thread of a block is a std::thread, __syncthreads a barrier, warp
 * shuffles go through a per-block exchange array, __shared__ variables are
 * function statics (blocks run one after another), dynamic shared memory
 * one buffer. Rounded intrinsics (__fadd_rn, ...) are IEEE host operations
 * kept apart with volatile; bf16 is rounded to nearest even. No timing, no
 * memory spaces: a "device pointer" is a host pointer. */
#ifndef LOCO_GPU_EMU_H
#define LOCO_GPU_EMU_H

#include <algorithm>
#include <barrier>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#define LOCO_HAVE_CUDA 1
extern "C" {
#include "compress/compress.h"
#include "core/core.h"
#include "kernels/kernels.h"
}

using std::max;
using std::min;
using std::isfinite; /* a global function in CUDA device code */

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
static dim3 blockIdx, blockDim, gridDim;
static thread_local dim3 threadIdx;
static std::barrier<> *g_bar;
static double g_xchg[1024];
static float *g_smem;
static std::vector<float> g_smem_buf;

static inline void __syncthreads() { g_bar->arrive_and_wait(); }
/* integer histograms (topk.cu): relaxed, as the order cannot change a count */
static inline unsigned atomicAdd(unsigned *p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }

template <typename T> static inline T __shfl_xor_sync(unsigned, T v, int o) {
    const unsigned tid = threadIdx.x + threadIdx.y * blockDim.x;
    double d = 0;
    std::memcpy(&d, &v, sizeof v);
    g_bar->arrive_and_wait();
    g_xchg[tid] = d;
    g_bar->arrive_and_wait();
    T r;
    std::memcpy(&r, &g_xchg[tid ^ (unsigned)o], sizeof r);
    return r;
}

/* mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 as the PTX ISA
 * (9.7.14.5.8) lays out its fragments (common.cuh's mma_bf16_16816): every
 * lane posts its a, b and c registers, then computes its own four outputs
 * from the posts of its warp's 32 lanes (products exact in fp32, summed in
 * k order). The whole block calls it together, as it does the shuffles. */
#define LOCO_GPU_EMU 1
static unsigned g_mma_x[1024][10];
static inline float emu_bf16_half(unsigned r, int hi) {
    const uint32_t u = (hi ? r >> 16 : r & 0xffffu) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
static inline void emu_mma_m16n8k16_bf16(float d[4], const unsigned a[4], const unsigned b[2],
                                         const float c[4]) {
    const unsigned tid = threadIdx.x + threadIdx.y * blockDim.x, w0 = tid & ~31u;
    const unsigned lane = tid & 31u, g = lane >> 2, t = lane & 3u;
    g_bar->arrive_and_wait();
    unsigned *x = g_mma_x[tid];
    for (int r = 0; r < 4; r++)
        x[r] = a[r];
    x[4] = b[0], x[5] = b[1];
    for (int r = 0; r < 4; r++)
        std::memcpy(&x[6 + r], &c[r], 4);
    g_bar->arrive_and_wait();
    /* A[row][k]: lane 4 (row % 8) + (k % 8) / 2, register (row >= 8) + 2 (k >= 8),
     * half k % 2. B[k][n]: lane 4 n + (k % 8) / 2, register k >= 8, half k % 2. */
    auto A = [&](unsigned row, unsigned k) {
        const unsigned *s = g_mma_x[w0 + 4 * (row % 8) + (k % 8) / 2];
        return emu_bf16_half(s[(row >= 8) + 2 * (k >= 8)], k % 2);
    };
    auto B = [&](unsigned k, unsigned n) {
        const unsigned *s = g_mma_x[w0 + 4 * n + (k % 8) / 2];
        return emu_bf16_half(s[4 + (k >= 8)], k % 2);
    };
    float out[4];
    for (int i = 0; i < 4; i++) {
        const unsigned row = g + 8 * (i >= 2), col = 2 * t + (i & 1);
        float acc = 0.0f;
        for (unsigned k = 0; k < 16; k++)
            acc += A(row, k) * B(k, col);
        float cv;
        std::memcpy(&cv, &x[6 + i], 4);
        out[i] = acc + cv;
    }
    g_bar->arrive_and_wait();
    for (int i = 0; i < 4; i++)
        d[i] = out[i];
}

/* Runs f as every thread of every block; a thread that returns early drops
 * out of the block's barrier, as an exited CUDA thread does. */
static void emu_launch(dim3 grid, dim3 block, size_t smem, std::function<void()> f) {
    if (g_smem_buf.size() < smem / 4 + 1)
        g_smem_buf.resize(smem / 4 + 1);
    g_smem = g_smem_buf.data();
    blockDim = block;
    gridDim = grid;
    const unsigned nt = block.x * block.y;
    for (unsigned by = 0; by < grid.y; by++)
        for (unsigned bx = 0; bx < grid.x; bx++) {
            blockIdx = dim3(bx, by);
            std::barrier<> bar(nt);
            g_bar = &bar;
            std::vector<std::thread> ts;
            for (unsigned t = 0; t < nt; t++)
                ts.emplace_back([&, t] {
                    threadIdx = dim3(t % block.x, t / block.x);
                    f();
                    bar.arrive_and_drop();
                });
            for (auto &th : ts)
                th.join();
        }
}

struct __nv_bfloat16 {
    uint16_t u;
};
static inline float __bfloat162float(__nv_bfloat16 h) {
    const uint32_t u = (uint32_t)h.u << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return {(uint16_t)((u + 0x7fffU + ((u >> 16) & 1)) >> 16)};
}

static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.u; }

static inline float __fadd_rn(float a, float b) { volatile float r = a + b; return r; }
static inline float __fsub_rn(float a, float b) { volatile float r = a - b; return r; }
static inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
static inline float __fdiv_rn(float a, float b) { volatile float r = a / b; return r; }
static inline double __dmul_rn(double a, double b) { volatile double r = a * b; return r; }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline uint32_t __float_as_uint(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline float __uint2float_rn(uint32_t u) { return (float)u; }

/* The runtime calls the .cu files make. */
typedef int cudaError_t;
#define cudaSuccess 0
#define cudaFuncAttributeMaxDynamicSharedMemorySize 0
static inline int cudaFuncSetAttribute(...) { return 0; }
/* cudaMalloc's pointers are 256-byte aligned, and the slab relies on it */
static inline cudaError_t cudaMalloc(void **p, size_t n) {
    *p = aligned_alloc(256, (n + 255) / 256 * 256 + 256);
    return *p ? 0 : 2;
}
static inline cudaError_t cudaFree(void *p) { free(p); return 0; }
static inline cudaError_t cudaMemsetAsync(void *p, int v, size_t n, loco_stream) { memset(p, v, n); return 0; }
static inline cudaError_t cudaGetLastError() { return 0; }
/* One device, or LOCO_EMU_DEVICES of them (they share the host's memory:
 * only which one a thread has current is emulated, per thread as in CUDA,
 * a new thread starting on 0), so the device selection can be checked. */
static inline int emu_devices() {
    const char *v = getenv("LOCO_EMU_DEVICES");
    const int n = v ? atoi(v) : 1;
    return n < 1 ? 1 : n;
}
static thread_local int g_device;
static inline cudaError_t cudaGetDeviceCount(int *n) { *n = emu_devices(); return 0; }
static inline cudaError_t cudaSetDevice(int d) {
    if (d < 0 || d >= emu_devices())
        return 101; /* cudaErrorInvalidDevice */
    g_device = d;
    return 0;
}
static inline cudaError_t cudaStreamSynchronize(loco_stream) { return 0; }
enum { cudaMemcpyDefault = 4 };
static inline cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, int, loco_stream) {
    memmove(d, s, n);
    return 0;
}
/* the emulated device reports an H200's compute capability (9.0) */
enum { cudaDevAttrComputeCapabilityMajor = 75, cudaDevAttrComputeCapabilityMinor = 76 };
static inline cudaError_t cudaGetDevice(int *d) { *d = g_device; return 0; }
static inline cudaError_t cudaDeviceGetAttribute(int *v, int attr, int) {
    *v = attr == cudaDevAttrComputeCapabilityMajor ? 9 : 0;
    return 0;
}
static inline const char *cudaGetErrorString(cudaError_t) { return "emulated"; }
/* Streams and events: every call above runs at once, in order, so there is
 * nothing to order; page-locked memory is plain memory. */
#define cudaStreamDefault 0
#define cudaEventDisableTiming 2
static inline cudaError_t cudaStreamCreateWithFlags(loco_stream *s, unsigned) {
    *s = NULL;
    return 0;
}
static inline cudaError_t cudaEventCreateWithFlags(loco_event *e, unsigned) {
    static char token;
    *e = reinterpret_cast<loco_event>(&token);
    return 0;
}
static inline cudaError_t cudaEventDestroy(loco_event) { return 0; }
static inline cudaError_t cudaEventRecord(loco_event, loco_stream) { return 0; }
static inline cudaError_t cudaEventSynchronize(loco_event) { return 0; }
static inline cudaError_t cudaStreamWaitEvent(loco_stream, loco_event, unsigned) { return 0; }
static inline cudaError_t cudaMallocHost(void **p, size_t n) {
    *p = malloc(n);
    return *p ? 0 : 2;
}
static inline cudaError_t cudaFreeHost(void *p) { free(p); return 0; }
/* No graphs: capture fails at once, so callers take their plain path. */
typedef struct CUgraph_st *cudaGraph_t;
#define cudaStreamCaptureModeThreadLocal 1
static inline cudaError_t cudaStreamBeginCapture(loco_stream, int) { return 801; }
static inline cudaError_t cudaStreamEndCapture(loco_stream, cudaGraph_t *) { return 801; }
static inline cudaError_t cudaGraphInstantiate(loco_graph *, cudaGraph_t, int) { return 801; }
static inline cudaError_t cudaGraphDestroy(cudaGraph_t) { return 0; }
static inline cudaError_t cudaGraphLaunch(loco_graph, loco_stream) { return 801; }
static inline cudaError_t cudaGraphExecDestroy(loco_graph) { return 0; }

/* common.cuh's helpers */
#define CUDA_CHECK(call) (void)(call)
#define CUDA_LAUNCHED(what) (void)0
__attribute__((unused)) static inline float ld(const float *p) { return *p; }
__attribute__((unused)) static inline float ld(const __nv_bfloat16 *p) { return __bfloat162float(*p); }
__attribute__((unused)) static inline void st(float *p, float v) { *p = v; }
__attribute__((unused)) static inline void st(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }
static inline __nv_bfloat16 *bf(loco_bf16 *p) { return reinterpret_cast<__nv_bfloat16 *>(p); }
static inline const __nv_bfloat16 *bf(const loco_bf16 *p) {
    return reinterpret_cast<const __nv_bfloat16 *>(p);
}
/* one block: every kernel that uses it strides over the grid */
static inline unsigned grid_for(size_t, unsigned) { return 1; }

#endif
