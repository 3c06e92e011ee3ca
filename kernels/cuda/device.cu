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

extern "C" loco_stream loco_cuda_compute_stream(void) { return NULL; }

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
