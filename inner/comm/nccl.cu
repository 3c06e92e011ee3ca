/* The nccl backend: device buffers, NCCL collectives on the communicator's
 * own stream. Compiled where nvcc and nccl.h are (LOCO_HAVE_NCCL).
 *
 * Bootstrap: the world communicator first makes an `auto` one (mpi under a
 * launcher, else self); rank 0 makes the NCCL unique id and broadcasts it
 * over that, every rank picks device local_rank % devices and joins with
 * ncclCommInitRank. The bootstrap communicator is kept for abort.
 *
 * Ordering with the compute stream (loco_cuda_compute_stream, where the
 * model's kernels run) is by events, not host waits: every call first
 * makes the communicator's stream wait for what was enqueued on the
 * compute stream before it (the gradients a backward pass produced), so
 * no host synchronisation is needed before a call; a buffer written on
 * any other stream must still be synchronised first. A blocking call
 * returns with the result in place (the host waits: see finish). A
 * started one records an event that test looks at; wait makes the
 * compute stream wait for it, without blocking the host: work enqueued
 * on the compute stream afterwards sees the result (read it on the host
 * through that stream: loco_cuda_copy, loco_cuda_sync), and an error NCCL
 * reports later shows at the next blocking call. AVG is a sum and a
 * division on the device afterwards (x / size, as the front end defines
 * it; NCCL's ncclAvg pre-multiplies floats by 1/size, other bits).
 * reduce_scatter and allgather with uneven counts become grouped
 * ncclReduce / ncclBroadcast calls, one per block. NCCL has no tags: sends
 * and receives between two ranks must be posted in the same order, and a
 * receive of a different count than was sent is not detected. A split
 * borrows its world's bootstrap communicator (for abort): destroy splits
 * before their world. */
#ifdef LOCO_HAVE_NCCL

#include <cuda_runtime.h>
#include <nccl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "inner/comm/internal.h"
#include "kernels/device.h"
}

#define NCCL_CHECK(call)                                                                   \
    do {                                                                                   \
        ncclResult_t r_ = (call);                                                          \
        if (r_ != ncclSuccess)                                                             \
            return LOCO_ERR(LOCO_ENCCL, "%s: %s", #call, ncclGetErrorString(r_));          \
    } while (0)

#define CUDA_CHECK(call)                                                                   \
    do {                                                                                   \
        cudaError_t e_ = (call);                                                           \
        if (e_ != cudaSuccess)                                                             \
            return LOCO_ERR(LOCO_ECUDA, "%s: %s", #call, cudaGetErrorString(e_));          \
    } while (0)

typedef struct {
    ncclComm_t comm;
    cudaStream_t stream;
    cudaEvent_t ready; /* recorded on the compute stream before each call */
    loco_comm *boot;   /* the bootstrap communicator (abort goes through it) */
    bool owns_boot;    /* world: destroys boot; splits borrow it */
    int *scratch;      /* one device int: the barrier's all-reduce */
} nccl_comm;

static nccl_comm *st(loco_comm *c) { return (nccl_comm *)c->be; }

static ncclDataType_t nccl_dt(loco_comm_dtype dt) {
    switch (dt) {
    case LOCO_DT_F32: return ncclFloat32;
    case LOCO_DT_F64: return ncclFloat64;
    case LOCO_DT_I32: return ncclInt32;
    case LOCO_DT_I64: return ncclInt64;
    default: return ncclUint8;
    }
}

static ncclRedOp_t nccl_op(loco_comm_op op) { return op == LOCO_OP_MAX ? ncclMax : ncclSum; }

/* ------------------------------------------------------ AVG on the device */

template <typename T> __global__ void divide_kernel(T *x, size_t n, int d) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] = (T)(x[i] / (T)d);
}

/* uint8 divides as an int: (uint8_t)256 would be a division by zero. */
__global__ void divide_u8_kernel(uint8_t *x, size_t n, int d) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] = (uint8_t)(x[i] / d);
}

static int divide(loco_comm *c, void *buf, size_t count, loco_comm_dtype dt, loco_comm_op op) {
    if (op != LOCO_OP_AVG || c->size <= 1 || count == 0)
        return 0;
    const unsigned th = 256;
    const size_t g = (count + th - 1) / th;
    const unsigned grid = (unsigned)(g > 65535u * 32u ? 65535u * 32u : g);
    cudaStream_t s = st(c)->stream;
    switch (dt) {
    case LOCO_DT_F32: divide_kernel<float><<<grid, th, 0, s>>>((float *)buf, count, c->size); break;
    case LOCO_DT_F64:
        divide_kernel<double><<<grid, th, 0, s>>>((double *)buf, count, c->size);
        break;
    case LOCO_DT_I32:
        divide_kernel<int32_t><<<grid, th, 0, s>>>((int32_t *)buf, count, c->size);
        break;
    case LOCO_DT_I64:
        divide_kernel<int64_t><<<grid, th, 0, s>>>((int64_t *)buf, count, c->size);
        break;
    default: divide_u8_kernel<<<grid, th, 0, s>>>((uint8_t *)buf, count, c->size); break;
    }
    CUDA_CHECK(cudaGetLastError());
    return 0;
}

/* ------------------------------------------------------------ ordering */

/* The communicator's stream waits (on the device) for the work enqueued on
 * the compute stream so far: the buffers a call reads are written. */
static int after_compute(loco_comm *c) {
    nccl_comm *n = st(c);
    CUDA_CHECK(cudaEventRecord(n->ready, loco_cuda_compute_stream()));
    CUDA_CHECK(cudaStreamWaitEvent(n->stream, n->ready, 0));
    return 0;
}

/* ------------------------------------------------------------ completion */

/* Blocking: wait for the stream and NCCL's verdict. Started: an event. */
static int finish(loco_comm *c, loco_comm_req *req) {
    nccl_comm *n = st(c);
    if (!req) {
        /* A host wait, kept: the blocking form is the host-visible one. It
         * returns with the collective complete (as every backend's does:
         * the caller may read the buffer on any stream, and a barrier is a
         * rendezvous of hosts) and with NCCL's verdict on it, which
         * ncclCommGetAsyncError gives only once the work has run. */
        CUDA_CHECK(cudaStreamSynchronize(n->stream));
        ncclResult_t ar = ncclSuccess;
        NCCL_CHECK(ncclCommGetAsyncError(n->comm, &ar));
        if (ar != ncclSuccess)
            return LOCO_ERR(LOCO_ENCCL, "nccl: %s", ncclGetErrorString(ar));
        return 0;
    }
    cudaEvent_t ev = NULL;
    CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    const cudaError_t e = cudaEventRecord(ev, n->stream);
    if (e != cudaSuccess) {
        cudaEventDestroy(ev);
        return LOCO_ERR(LOCO_ECUDA, "cudaEventRecord: %s", cudaGetErrorString(e));
    }
    req->be = ev;
    return 0;
}

/* The compute stream waits for the operation on the device; the host goes
 * on (the event may be destroyed at once: the wait has captured it). The
 * verdict is NCCL's so far. */
static int nccl_wait(loco_comm_req *req) {
    cudaEvent_t ev = (cudaEvent_t)req->be;
    if (!ev)
        return 0;
    const cudaError_t e = cudaStreamWaitEvent(loco_cuda_compute_stream(), ev, 0);
    cudaEventDestroy(ev);
    req->be = NULL;
    if (e != cudaSuccess)
        return LOCO_ERR(LOCO_ECUDA, "cudaStreamWaitEvent: %s", cudaGetErrorString(e));
    ncclResult_t ar = ncclSuccess;
    NCCL_CHECK(ncclCommGetAsyncError(st(req->comm)->comm, &ar));
    if (ar != ncclSuccess)
        return LOCO_ERR(LOCO_ENCCL, "nccl: %s", ncclGetErrorString(ar));
    return 0;
}

static int nccl_test(loco_comm_req *req, bool *done) {
    cudaEvent_t ev = (cudaEvent_t)req->be;
    *done = true;
    if (!ev)
        return 0;
    const cudaError_t e = cudaEventQuery(ev);
    if (e == cudaErrorNotReady) {
        *done = false;
        return 0;
    }
    if (e != cudaSuccess)
        return LOCO_ERR(LOCO_ECUDA, "cudaEventQuery: %s", cudaGetErrorString(e));
    return 0;
}

/* ------------------------------------------------------------ operations */

static int nccl_allreduce(loco_comm *c, void *buf, size_t count, loco_comm_dtype dt,
                          loco_comm_op op, loco_comm_req *req) {
    nccl_comm *n = st(c);
    LOCO_CHECK(after_compute(c));
    NCCL_CHECK(ncclAllReduce(buf, buf, count, nccl_dt(dt), nccl_op(op), n->comm, n->stream));
    LOCO_CHECK(divide(c, buf, count, dt, op));
    return finish(c, req);
}

static bool all_equal(const size_t *counts, int size) {
    for (int r = 1; r < size; r++)
        if (counts[r] != counts[0])
            return false;
    return true;
}

static int nccl_reduce_scatter(loco_comm *c, const void *send, void *recv, const size_t *counts,
                               loco_comm_dtype dt, loco_comm_op op, loco_comm_req *req) {
    nccl_comm *n = st(c);
    const size_t es = loco_comm_dtype_size(dt), mine = counts[c->rank];
    size_t total = 0, off = 0;
    for (int r = 0; r < c->size; r++)
        total += counts[r];
    /* the result must not land on input another block still reads */
    const uintptr_t s0 = (uintptr_t)send, s1 = s0 + total * es;
    const uintptr_t d0 = (uintptr_t)recv, d1 = d0 + mine * es;
    void *dst = recv;
    LOCO_CHECK(after_compute(c));
    if (mine && d0 < s1 && s0 < d1)
        CUDA_CHECK(cudaMallocAsync(&dst, mine * es, n->stream));
    int rc = 0;
    ncclResult_t r_ = ncclSuccess;
    if (all_equal(counts, c->size)) {
        r_ = ncclReduceScatter(send, dst, counts[0], nccl_dt(dt), nccl_op(op), n->comm,
                               n->stream);
    } else {
        r_ = ncclGroupStart();
        for (int r = 0; r < c->size && r_ == ncclSuccess; r++) {
            if (counts[r])
                r_ = ncclReduce((const char *)send + off * es, dst, counts[r], nccl_dt(dt),
                                nccl_op(op), r, n->comm, n->stream);
            off += counts[r];
        }
        const ncclResult_t e = ncclGroupEnd();
        r_ = r_ != ncclSuccess ? r_ : e;
    }
    if (r_ != ncclSuccess)
        rc = LOCO_ERR(LOCO_ENCCL, "reduce_scatter: %s", ncclGetErrorString(r_));
    if (dst != recv) {
        if (rc == 0) {
            const cudaError_t e =
                cudaMemcpyAsync(recv, dst, mine * es, cudaMemcpyDeviceToDevice, n->stream);
            if (e != cudaSuccess)
                rc = LOCO_ERR(LOCO_ECUDA, "cudaMemcpyAsync: %s", cudaGetErrorString(e));
        }
        cudaFreeAsync(dst, n->stream);
    }
    LOCO_CHECK(rc);
    LOCO_CHECK(divide(c, recv, mine, dt, op));
    return finish(c, req);
}

static int nccl_allgather(loco_comm *c, const void *send, void *recv, const size_t *counts,
                          loco_comm_dtype dt, loco_comm_req *req) {
    nccl_comm *n = st(c);
    const size_t es = loco_comm_dtype_size(dt);
    LOCO_CHECK(after_compute(c));
    if (all_equal(counts, c->size)) {
        NCCL_CHECK(ncclAllGather(send, recv, counts[0], nccl_dt(dt), n->comm, n->stream));
        return finish(c, req);
    }
    ncclResult_t r_ = ncclGroupStart();
    size_t off = 0;
    for (int r = 0; r < c->size && r_ == ncclSuccess; r++) {
        if (counts[r])
            r_ = ncclBroadcast(send, (char *)recv + off * es, counts[r], nccl_dt(dt), r, n->comm,
                               n->stream);
        off += counts[r];
    }
    const ncclResult_t e = ncclGroupEnd();
    r_ = r_ != ncclSuccess ? r_ : e;
    if (r_ != ncclSuccess)
        return LOCO_ERR(LOCO_ENCCL, "allgather: %s", ncclGetErrorString(r_));
    return finish(c, req);
}

static int nccl_broadcast(loco_comm *c, void *buf, size_t count, loco_comm_dtype dt, int root,
                          loco_comm_req *req) {
    nccl_comm *n = st(c);
    LOCO_CHECK(after_compute(c));
    NCCL_CHECK(ncclBroadcast(buf, buf, count, nccl_dt(dt), root, n->comm, n->stream));
    return finish(c, req);
}

static int nccl_send(loco_comm *c, const void *buf, size_t count, loco_comm_dtype dt, int peer,
                     int tag, loco_comm_req *req) {
    nccl_comm *n = st(c);
    LOCO_CHECK(after_compute(c));
    NCCL_CHECK(ncclSend(buf, count, nccl_dt(dt), peer, n->comm, n->stream));
    return finish(c, req);
}

static int nccl_recv(loco_comm *c, void *buf, size_t count, loco_comm_dtype dt, int peer, int tag,
                     loco_comm_req *req) {
    nccl_comm *n = st(c);
    LOCO_CHECK(after_compute(c));
    NCCL_CHECK(ncclRecv(buf, count, nccl_dt(dt), peer, n->comm, n->stream));
    return finish(c, req);
}

static int nccl_alltoallv(loco_comm *c, const void *send, const size_t *sendcounts, void *recv,
                          const size_t *recvcounts, loco_comm_dtype dt, loco_comm_req *req) {
    nccl_comm *n = st(c);
    const size_t es = loco_comm_dtype_size(dt);
    size_t so = 0, ro = 0;
    LOCO_CHECK(after_compute(c));
    ncclResult_t r_ = ncclGroupStart();
    for (int j = 0; j < c->size && r_ == ncclSuccess; j++) {
        const char *sp = (const char *)send + so * es;
        char *rp = (char *)recv + ro * es;
        if (j == c->rank) {
            if (sendcounts[j]) {
                const cudaError_t e = cudaMemcpyAsync(rp, sp, sendcounts[j] * es,
                                                      cudaMemcpyDeviceToDevice, n->stream);
                if (e != cudaSuccess) {
                    ncclGroupEnd();
                    return LOCO_ERR(LOCO_ECUDA, "cudaMemcpyAsync: %s", cudaGetErrorString(e));
                }
            }
        } else {
            if (sendcounts[j])
                r_ = ncclSend(sp, sendcounts[j], nccl_dt(dt), j, n->comm, n->stream);
            if (r_ == ncclSuccess && recvcounts[j])
                r_ = ncclRecv(rp, recvcounts[j], nccl_dt(dt), j, n->comm, n->stream);
        }
        so += sendcounts[j];
        ro += recvcounts[j];
    }
    const ncclResult_t e = ncclGroupEnd();
    r_ = r_ != ncclSuccess ? r_ : e;
    if (r_ != ncclSuccess)
        return LOCO_ERR(LOCO_ENCCL, "alltoallv: %s", ncclGetErrorString(r_));
    return finish(c, req);
}

static int nccl_barrier(loco_comm *c) {
    nccl_comm *n = st(c);
    LOCO_CHECK(after_compute(c));
    NCCL_CHECK(ncclAllReduce(n->scratch, n->scratch, 1, ncclInt32, ncclSum, n->comm, n->stream));
    return finish(c, NULL);
}

static int nccl_abort(loco_comm *c, int exit_code) {
    nccl_comm *n = st(c);
    ncclCommAbort(n->comm);
    n->comm = NULL;
    if (n->boot)
        LOCO_CHECK(loco_comm_abort(n->boot, exit_code));
    return 0;
}

/* ------------------------------------------------------------ lifecycle */

static void nccl_destroy(loco_comm *c) {
    nccl_comm *n = st(c);
    if (!n)
        return;
    /* A host wait, kept: a waited request may still run on the device
     * (wait does not block the host), and the communicator, its stream
     * and the caller's buffers must outlive it. */
    if (n->stream && n->comm)
        cudaStreamSynchronize(n->stream);
    if (n->comm)
        ncclCommDestroy(n->comm);
    if (n->stream)
        cudaStreamDestroy(n->stream);
    if (n->ready)
        cudaEventDestroy(n->ready);
    cudaFree(n->scratch);
    if (n->owns_boot)
        loco_comm_destroy(n->boot);
    loco_free(n);
    c->be = NULL;
}

static int nccl_split(loco_comm *c, int color, int key, loco_comm **out);

static const loco__comm_ops nccl_ops = {
    /* .name */ "nccl",
    nccl_allreduce,
    nccl_reduce_scatter,
    nccl_allgather,
    nccl_broadcast,
    nccl_send,
    nccl_recv,
    nccl_alltoallv,
    nccl_barrier,
    nccl_split,
    nccl_wait,
    nccl_test,
    nccl_abort,
    nccl_destroy,
};

/* A loco communicator around comm (the caller's on failure). */
static int wrap(ncclComm_t comm, loco_comm *boot, bool owns_boot, loco_comm **out) {
    int rank = 0, size = 0;
    NCCL_CHECK(ncclCommUserRank(comm, &rank));
    NCCL_CHECK(ncclCommCount(comm, &size));
    nccl_comm *n = (nccl_comm *)loco_alloc(sizeof *n);
    if (!n)
        return LOCO_ERR(LOCO_ENOMEM, "comm: no memory for the nccl state");
    memset(n, 0, sizeof *n);
    int rc = 0;
    cudaError_t e = cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking);
    if (e == cudaSuccess)
        e = cudaEventCreateWithFlags(&n->ready, cudaEventDisableTiming);
    if (e == cudaSuccess)
        e = cudaMalloc((void **)&n->scratch, sizeof *n->scratch);
    if (e != cudaSuccess) {
        rc = LOCO_ERR(LOCO_ECUDA, "nccl comm: %s", cudaGetErrorString(e));
        goto out_free;
    }
    n->comm = comm;
    n->boot = boot;
    n->owns_boot = owns_boot;
    LOCO_CHECK_GOTO(loco__comm_new(out, &nccl_ops, rank, size, SIZE_MAX,
                                   LOCO_COMM_THREAD_SERIALIZED, n),
                    out_free);
    return 0;
out_free:
    if (n->stream)
        cudaStreamDestroy(n->stream);
    if (n->ready)
        cudaEventDestroy(n->ready);
    cudaFree(n->scratch);
    loco_free(n);
    return rc;
}

static int nccl_split(loco_comm *c, int color, int key, loco_comm **out) {
    ncclComm_t nc = NULL;
    NCCL_CHECK(ncclCommSplit(st(c)->comm, color == LOCO_COMM_COLOR_NONE ? NCCL_SPLIT_NOCOLOR : color,
                             key, &nc, NULL));
    if (!nc)
        return 0;
    const int rc = wrap(nc, st(c)->boot, false, out);
    if (rc < 0) {
        ncclCommDestroy(nc);
        LOCO_CHECK(rc);
    }
    return 0;
}

extern "C" int loco__comm_nccl_world(loco_comm **out) {
    *out = NULL;
    loco_comm *boot = NULL;
    int rc = 0, dev = 0;
    ncclUniqueId id;
    ncclComm_t comm = NULL;
    ncclResult_t r_;
    LOCO_CHECK(loco_comm_world(&boot, "auto"));
    const int rank = loco_comm_rank(boot), size = loco_comm_size(boot);
    /* the rank's GPU: its local rank modulo the devices (kernels.h) */
    LOCO_CHECK_GOTO(loco_cuda_select_local_device(rank, &dev), out_boot);
    memset(&id, 0, sizeof id);
    if (rank == 0 && (r_ = ncclGetUniqueId(&id)) != ncclSuccess) {
        /* the others wait in the broadcast: take the job down */
        rc = LOCO_ERR(LOCO_ENCCL, "ncclGetUniqueId: %s", ncclGetErrorString(r_));
        loco_comm_abort(boot, 1);
        goto out_boot;
    }
    LOCO_CHECK_GOTO(loco_comm_broadcast(boot, &id, sizeof id, LOCO_DT_U8, 0), out_boot);
    r_ = ncclCommInitRank(&comm, size, id, rank);
    if (r_ != ncclSuccess) {
        rc = LOCO_ERR(LOCO_ENCCL, "ncclCommInitRank (rank %d of %d): %s", rank, size,
                      ncclGetErrorString(r_));
        goto out_boot;
    }
    LOCO_CHECK_GOTO(wrap(comm, boot, true, out), out_comm);
    return 0;
out_comm:
    ncclCommDestroy(comm);
out_boot:
    loco_comm_destroy(boot);
    return rc;
}

#endif /* LOCO_HAVE_NCCL */
