/* Devices, streams and the device slab. */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>

#include "kernels/cuda/common.cuh"

enum { SLAB_ALIGN = 256 };

struct loco_cuda_slab {
    char *base;
    size_t size, used;
    int device; /* where base was allocated */
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

/* The launchers' variables that give this process's index among the
 * ranks of its host (Open MPI, MPICH / Intel MPI, Slurm, torchrun), the
 * first one set wins. */
static const char *const local_rank_vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                              "SLURM_LOCALID", "LOCAL_RANK"};

extern "C" int loco_cuda_select_local_device(int fallback_rank, int *device) {
    *device = -1;
    long local = fallback_rank;
    const char *from = "no launcher variable: the rank given";
    for (size_t i = 0; i < sizeof local_rank_vars / sizeof *local_rank_vars; i++) {
        const char *v = getenv(local_rank_vars[i]);
        if (!v || !*v)
            continue;
        char *end = NULL;
        errno = 0;
        local = strtol(v, &end, 10);
        if (errno || *end || local < 0 || local > INT_MAX)
            return LOCO_ERR(LOCO_EINVAL,
                            "%s=%s: expected this process's local rank, an integer >= 0",
                            local_rank_vars[i], v);
        from = local_rank_vars[i];
        break;
    }
    if (local < 0)
        return LOCO_ERR(LOCO_EINVAL, "local device: rank %ld is negative", local);
    int n = 0;
    LOCO_CHECK(loco_cuda_device_count(&n));
    const int dev = (int)(local % n);
    LOCO_CHECK(loco_cuda_set_device(dev));
    loco_debug("cuda: device %d of %d (local rank %ld, %s)", dev, n, local, from);
    *device = dev;
    return 0;
}

extern "C" int loco_cuda_get_device(int *device) {
    *device = -1;
    CUDA_CHECK(cudaGetDevice(device));
    return 0;
}

extern "C" int loco_cuda_set_device(int device) {
    const cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* clear it: later calls must not report it */
        return LOCO_ERR(LOCO_ECUDA, "cudaSetDevice(%d): %s", device, cudaGetErrorString(e));
    }
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
    cudaGetDevice(&s->device);
    *out = s;
    return 0;
}

extern "C" void loco_cuda_slab_destroy(loco_cuda_slab *s) {
    if (!s)
        return;
    /* freed on its own device, from whichever thread (a new thread is on
     * device 0), and the caller's current device left as it was */
    int cur = s->device;
    cudaGetDevice(&cur);
    if (cur != s->device)
        cudaSetDevice(s->device);
    cudaFree(s->base);
    if (cur != s->device)
        cudaSetDevice(cur);
    cudaGetLastError();
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
