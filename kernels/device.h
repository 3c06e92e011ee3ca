/* kernels/device.h: the CUDA runtime the kernels' CUDA twins run on (in a
 * build with the CUDA toolkit: LOCO_HAVE_CUDA): devices, streams, events,
 * graphs, page-locked host memory, copies, device memory slabs and the
 * cuBLASLt handle. The kernels themselves are in kernels/kernels.h. */
#ifndef LOCO_KERNELS_DEVICE_H
#define LOCO_KERNELS_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#if defined(LOCO_HAVE_CUDA) || defined(__CUDACC__)

/* A CUDA stream (the same type as cudaStream_t; NULL = legacy stream). */
typedef struct CUstream_st *loco_stream;
/* bfloat16 bits (the upper half of an fp32). */
typedef uint16_t loco_bf16;

/* Number of usable devices; on failure LOCO_ECUDA with cudaGetDeviceCount's
 * reason recorded ("no CUDA device: cudaGetDeviceCount says ..."). */
int loco_cuda_device_count(int *n);
/* Which GPU this process uses, chosen and made current for the calling
 * thread: its local rank modulo the device count, the local rank read from
 * the first launcher variable set of OMPI_COMM_WORLD_LOCAL_RANK,
 * MPI_LOCALRANKID, SLURM_LOCALID, LOCAL_RANK, else fallback_rank (the
 * world rank: right for a job on one host; 0 for one process). *device
 * receives it (logged at debug level). LOCO_EINVAL when the variable is not
 * an integer >= 0 (naming it), LOCO_ECUDA when there is no device or it
 * cannot be made current. Call it before anything else touches the GPU:
 * the streams and allocations made afterwards belong to this device. */
int loco_cuda_select_local_device(int fallback_rank, int *device);
/* The calling thread's current device (cudaGetDevice / cudaSetDevice).
 * CUDA's current device is per thread and a new thread starts on device
 * 0: a thread that enqueues work for state made on another thread sets
 * that state's device first (cheap when it is already current). */
int loco_cuda_get_device(int *device);
int loco_cuda_set_device(int device);
/* The stream the device model (inner/model/gpt_cuda.c) and the callers of the
 * twins enqueue their work on: created on first use for the process's
 * current device (a blocking stream, so work still put on the legacy
 * stream NULL stays ordered with it; NULL if creation failed). A stream
 * of its own (the nccl comm backend's, non-blocking) is not ordered
 * against it implicitly and orders itself with events on this one. */
loco_stream loco_cuda_compute_stream(void);
/* The stream host-to-device copies of inputs go on (created on first use,
 * as the compute stream), ordered against compute with events. */
loco_stream loco_cuda_copy_stream(void);
/* Events (cudaEvent_t, timing disabled) for ordering streams. */
typedef struct CUevent_st *loco_event;
int loco_cuda_event_create(loco_event *e);
void loco_cuda_event_destroy(loco_event e); /* accepts NULL */
int loco_cuda_event_record(loco_event e, loco_stream s);
/* Work enqueued on s after this waits for e's last recording. */
int loco_cuda_stream_wait(loco_stream s, loco_event e);
/* The host waits for e's last recording. */
int loco_cuda_event_sync(loco_event e);
/* CUDA graphs (cudaGraphExec_t): capture_begin puts s in capture mode
 * (this thread's calls only); capture_end ends it and instantiates what was
 * enqueued meanwhile (nothing ran) into *out, or fails with LOCO_ECUDA
 * (the capture is then abandoned, *out NULL). */
typedef struct CUgraphExec_st *loco_graph;
int loco_cuda_capture_begin(loco_stream s);
int loco_cuda_capture_end(loco_stream s, loco_graph *out);
int loco_cuda_graph_launch(loco_graph g, loco_stream s);
void loco_cuda_graph_destroy(loco_graph g); /* accepts NULL */
/* Page-locked host memory (asynchronous copies), and its release. */
int loco_cuda_host_alloc(void **p, size_t bytes);
void loco_cuda_host_free(void *p); /* accepts NULL */
/* Waits for s; LOCO_ECUDA naming the first failed kernel's error. */
int loco_cuda_sync(loco_stream s);
/* Asynchronous copy in any direction (cudaMemcpyDefault). */
int loco_cuda_copy(void *dst, const void *src, size_t bytes, loco_stream s);
/* dst = 0 on the device (bytes), asynchronous. */
int loco_cuda_zero(void *dst, size_t bytes, loco_stream s);

/* Device memory for a whole run from one cudaMalloc, carved front to back
 * into named ranges (256-byte aligned); nothing is freed before the slab. */
typedef struct loco_cuda_slab loco_cuda_slab;
/* LOCO_ENOMEM (with the CUDA reason) when the device cannot hold bytes. */
int loco_cuda_slab_create(loco_cuda_slab **out, size_t bytes);
/* Accepts NULL; frees on the device the slab was made on, from any thread,
 * leaving the caller's current device as it was. */
void loco_cuda_slab_destroy(loco_cuda_slab *s);
/* Next bytes of the slab, for `name` (named in the error when full):
 * LOCO_ENOMEM when the rest is too small. The memory is not cleared. */
int loco_cuda_slab_alloc(loco_cuda_slab *s, void **out, size_t bytes, const char *name);
size_t loco_cuda_slab_used(const loco_cuda_slab *s);
size_t loco_cuda_slab_size(const loco_cuda_slab *s);

/* cuBLASLt: one handle and its workspace, used by one stream at a time. */
typedef struct loco_blas loco_blas;
/* LOCO_ECUDA when cuBLASLt or the workspace allocation fails. */
int loco_blas_create(loco_blas **out);
void loco_blas_destroy(loco_blas *h); /* accepts NULL */
/* The handle's plan cache: the matmuls keep cuBLASLt's descriptor,
 * layouts and chosen algorithm per GEMM key (shape, ops, leading
 * dimensions, types, epilogue, pointer alignments; not the pointers), 64
 * of them, the least recently used evicted. hits: GEMMs that reused a
 * plan; misses: GEMMs that built one (the only ones that run cuBLASLt's
 * heuristic). Counted since loco_blas_create. */
void loco_blas_plan_stats(const loco_blas *h, uint64_t *hits, uint64_t *misses);

#endif /* LOCO_HAVE_CUDA || __CUDACC__ */

#endif /* LOCO_KERNELS_DEVICE_H */
