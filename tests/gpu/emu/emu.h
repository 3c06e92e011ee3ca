/* Host emulation of the CUDA execution model, enough for kernels/cuda:
 * every thread of a block is a fiber (ucontext) on the launching host
 * thread, __syncthreads a switch back to the block's scheduler, warp
 * shuffles go through a per-block exchange array, __shared__ variables are
 * function statics (blocks run one after another), dynamic shared memory
 * one buffer. Rounded intrinsics (__fadd_rn, ...) are IEEE host operations
 * kept apart with volatile; bf16 is rounded to nearest even. No timing, no
 * memory spaces: a "device pointer" is a host pointer. */
#ifndef LOCO_GPU_EMU_H
#define LOCO_GPU_EMU_H

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include <sys/mman.h>
#include <ucontext.h>

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
static double g_xchg[1024];
static float *g_smem;
static std::vector<float> g_smem_buf;

/* The block's threads as fibers: one OS thread per CUDA thread cost a
 * thread start and a futex wake per barrier (minutes per test on two
 * cores). A fiber switch saves the callee-saved registers and changes
 * stacks: no system call (ucontext's swapcontext makes one per switch, so
 * it is only the fallback off x86-64). The scheduler runs every live fiber
 * up to its next barrier (or its end), in thread order, then the next
 * phase: a barrier releases no one before every live thread of the block
 * reached it, as __syncthreads does. */
enum { EMU_MAX_THREADS = 1024, EMU_STACK = 256 << 10, EMU_PAGE = 4096 };
static char *g_stack[EMU_MAX_THREADS];
static bool g_done[EMU_MAX_THREADS];
static unsigned g_cur;
static const std::function<void()> *g_body;

/* A stack per fiber, kept across launches, with a guard page below it: an
 * overflow faults instead of writing into the next fiber's stack. */
static char *emu_stack(unsigned t) {
    if (!g_stack[t]) {
        void *m = mmap(NULL, EMU_STACK + EMU_PAGE, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
        if (m == MAP_FAILED || mprotect(m, EMU_PAGE, PROT_NONE))
            abort();
        g_stack[t] = (char *)m + EMU_PAGE;
    }
    return g_stack[t];
}

#if defined(__x86_64__)
/* emu_switch(save, to): pushes the callee-saved registers, stores the
 * stack pointer in *save, continues on the stack `to` (saved the same way,
 * or prepared by emu_fiber_start) by popping its registers and returning. */
extern "C" void emu_switch(void **save, void *to);
asm(".text\n"
    ".globl emu_switch\n"
    ".type emu_switch, @function\n"
    "emu_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size emu_switch, .-emu_switch\n");
static void *g_sched_sp, *g_fiber_sp[EMU_MAX_THREADS];

static inline void __syncthreads() { emu_switch(&g_fiber_sp[g_cur], g_sched_sp); }

[[noreturn]] static void emu_fiber_main() {
    (*g_body)();
    g_done[g_cur] = true;
    void *dead;
    emu_switch(&dead, g_sched_sp); /* never resumed */
    abort();
}

/* A new fiber's stack as emu_switch leaves a suspended one: six zero
 * registers, then emu_fiber_main as the return address, entered with the
 * stack aligned as after a call (a zero return address above it). */
static void emu_fiber_start(unsigned t) {
    void **top = (void **)(emu_stack(t) + EMU_STACK);
    *--top = NULL;
    *--top = (void *)emu_fiber_main;
    for (int r = 0; r < 6; r++)
        *--top = NULL;
    g_fiber_sp[t] = top;
}
static inline void emu_fiber_run(unsigned t) { emu_switch(&g_sched_sp, g_fiber_sp[t]); }
#else
static ucontext_t g_sched, g_fiber[EMU_MAX_THREADS];

static inline void __syncthreads() { swapcontext(&g_fiber[g_cur], &g_sched); }

static void emu_fiber_main() {
    (*g_body)();
    g_done[g_cur] = true; /* returns to uc_link, the scheduler */
}

static void emu_fiber_start(unsigned t) {
    ucontext_t *c = &g_fiber[t];
    getcontext(c);
    c->uc_stack.ss_sp = emu_stack(t);
    c->uc_stack.ss_size = EMU_STACK;
    c->uc_link = &g_sched;
    makecontext(c, emu_fiber_main, 0);
}
static inline void emu_fiber_run(unsigned t) { swapcontext(&g_sched, &g_fiber[t]); }
#endif

/* Runs f as every thread of every block; a thread that returns early drops
 * out of the block's barriers, as an exited CUDA thread does. Within a
 * phase the threads run one after another, in thread order, or in reverse
 * with LOCO_EMU_ORDER=reverse: a read of shared memory that a missing
 * barrier leaves racing sees the other thread's old value in one of the
 * two orders, so running both catches it. */
static void emu_launch(dim3 grid, dim3 block, size_t smem, std::function<void()> f) {
    if (g_smem_buf.size() < smem / 4 + 1)
        g_smem_buf.resize(smem / 4 + 1);
    g_smem = g_smem_buf.data();
    blockDim = block;
    gridDim = grid;
    g_body = &f;
    static const char *order = getenv("LOCO_EMU_ORDER");
    static const bool reverse = order && !strcmp(order, "reverse");
    const unsigned nt = block.x * block.y;
    if (nt > EMU_MAX_THREADS)
        abort();
    for (unsigned by = 0; by < grid.y; by++)
        for (unsigned bx = 0; bx < grid.x; bx++) {
            blockIdx = dim3(bx, by);
            for (unsigned t = 0; t < nt; t++) {
                emu_fiber_start(t);
                g_done[t] = false;
            }
            for (unsigned live = nt; live;)
                for (unsigned i = 0; i < nt; i++) {
                    const unsigned t = reverse ? nt - 1 - i : i;
                    if (g_done[t])
                        continue;
                    g_cur = t;
                    threadIdx = dim3(t % block.x, t / block.x);
                    emu_fiber_run(t);
                    live -= g_done[t];
                }
        }
}
/* integer histograms (topk.cu): one fiber runs at a time, the order cannot change a count */
static inline unsigned atomicAdd(unsigned *p, unsigned v) {
    const unsigned old = *p;
    *p = old + v;
    return old;
}

template <typename T> static inline T __shfl_xor_sync(unsigned, T v, int o) {
    const unsigned tid = threadIdx.x + threadIdx.y * blockDim.x;
    double d = 0;
    std::memcpy(&d, &v, sizeof v);
    __syncthreads();
    g_xchg[tid] = d;
    __syncthreads();
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
    __syncthreads();
    unsigned *x = g_mma_x[tid];
    for (int r = 0; r < 4; r++)
        x[r] = a[r];
    x[4] = b[0], x[5] = b[1];
    for (int r = 0; r < 4; r++)
        std::memcpy(&x[6 + r], &c[r], 4);
    __syncthreads();
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
    __syncthreads();
    for (int i = 0; i < 4; i++)
        d[i] = out[i];
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
