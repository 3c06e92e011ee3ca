/* Devices, streams and the device slab. */
#include <stdlib.h>

#include "kernels/cuda/common.cuh"

enum { SLAB_ALIGN = 256 };

struct loco_cuda_slab {
    char *base;
    size_t size, used;
};

extern "C" int loco_cuda_device_count(int *n) {
    *n = 0;
    const cudaError_t e = cudaGetDeviceCount(n);
    if (e != cudaSuccess) {
        *n = 0;
        cudaGetLastError(); /* clear it: later calls must not report it */
        return LOCO_ERR(LOCO_ECUDA, "no CUDA device: cudaGetDeviceCount says %s",
                        cudaGetErrorString(e));
    }
    if (*n == 0)
        return LOCO_ERR(LOCO_ECUDA, "no CUDA device: cudaGetDeviceCount says 0");
    return 0;
}

/* Created once per process (a C++ local static: thread-safe), blocking
 * with respect to the legacy stream, never destroyed (the process owns it
 * until exit, as the CUDA context). */
static loco_stream make_stream(void) {
    loco_stream s = NULL;
    if (cudaStreamCreateWithFlags(&s, cudaStreamDefault) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return s;
}

extern "C" loco_stream loco_cuda_compute_stream(void) {
    static const loco_stream s = make_stream();
    return s;
}

extern "C" loco_stream loco_cuda_copy_stream(void) {
    static const loco_stream s = make_stream();
    return s;
}

extern "C" int loco_cuda_event_create(loco_event *e) {
    *e = NULL;
    CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
    return 0;
}

extern "C" void loco_cuda_event_destroy(loco_event e) {
    if (e)
        cudaEventDestroy(e);
}

extern "C" int loco_cuda_event_record(loco_event e, loco_stream s) {
    CUDA_CHECK(cudaEventRecord(e, s));
    return 0;
}

extern "C" int loco_cuda_stream_wait(loco_stream s, loco_event e) {
    CUDA_CHECK(cudaStreamWaitEvent(s, e, 0));
    return 0;
}

extern "C" int loco_cuda_event_sync(loco_event e) {
    CUDA_CHECK(cudaEventSynchronize(e));
    return 0;
}

extern "C" int loco_cuda_capture_begin(loco_stream s) {
    const cudaError_t e = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return LOCO_ERR(LOCO_ECUDA, "CUDA graph capture: %s", cudaGetErrorString(e));
    }
    return 0;
}

extern "C" int loco_cuda_capture_end(loco_stream s, loco_graph *out) {
    *out = NULL;
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(s, &graph);
    if (e == cudaSuccess) {
        e = cudaGraphInstantiate(out, graph, 0);
        cudaGraphDestroy(graph);
    }
    if (e != cudaSuccess) {
        *out = NULL;
        cudaGetLastError(); /* the capture's failure must not show in later calls */
        return LOCO_ERR(LOCO_ECUDA, "CUDA graph capture: %s", cudaGetErrorString(e));
    }
    return 0;
}

extern "C" int loco_cuda_graph_launch(loco_graph g, loco_stream s) {
    CUDA_CHECK(cudaGraphLaunch(g, s));
    return 0;
}

extern "C" void loco_cuda_graph_destroy(loco_graph g) {
    if (g)
        cudaGraphExecDestroy(g);
}

extern "C" int loco_cuda_host_alloc(void **p, size_t bytes) {
    *p = NULL;
    const cudaError_t e = cudaMallocHost(p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        *p = NULL;
        return LOCO_ERR(LOCO_ENOMEM, "%zu bytes of page-locked host memory: %s", bytes,
                        cudaGetErrorString(e));
    }
    return 0;
}

extern "C" void loco_cuda_host_free(void *p) {
    if (p)
        cudaFreeHost(p);
}

extern "C" int loco_cuda_sync(loco_stream s) {
    CUDA_CHECK(cudaStreamSynchronize(s));
    return 0;
}

extern "C" int loco_cuda_copy(void *dst, const void *src, size_t bytes, loco_stream s) {
    if (bytes)
        CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s));
    return 0;
}

extern "C" int loco_cuda_zero(void *dst, size_t bytes, loco_stream s) {
    if (bytes)
        CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, s));
    return 0;
}

extern "C" int loco_cuda_slab_create(loco_cuda_slab **out, size_t bytes) {
    *out = NULL;
    loco_cuda_slab *s = (loco_cuda_slab *)calloc(1, sizeof *s);
    if (!s)
        return LOCO_ERR(LOCO_ENOMEM, "device slab handle");
    const cudaError_t e = cudaMalloc((void **)&s->base, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        free(s);
        return LOCO_ERR(LOCO_ENOMEM, "device slab of %zu bytes: cudaMalloc says %s", bytes,
                        cudaGetErrorString(e));
    }
    s->size = bytes;
    *out = s;
    return 0;
}

extern "C" void loco_cuda_slab_destroy(loco_cuda_slab *s) {
    if (!s)
        return;
    cudaFree(s->base);
    free(s);
}

extern "C" int loco_cuda_slab_alloc(loco_cuda_slab *s, void **out, size_t bytes,
                                    const char *name) {
    const size_t at = (s->used + SLAB_ALIGN - 1) / SLAB_ALIGN * SLAB_ALIGN;
    if (at > s->size || bytes > s->size - at) {
        *out = NULL;
        return LOCO_ERR(LOCO_ENOMEM, "device slab: %s needs %zu bytes, %zu of %zu left",
                        name ? name : "?", bytes, at > s->size ? 0 : s->size - at, s->size);
    }
    *out = s->base + at;
    s->used = at + bytes;
    return 0;
}

extern "C" size_t loco_cuda_slab_used(const loco_cuda_slab *s) { return s->used; }
extern "C" size_t loco_cuda_slab_size(const loco_cuda_slab *s) { return s->size; }
