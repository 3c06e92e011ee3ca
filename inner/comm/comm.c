/* The front end of the island communicator: picks a backend, checks every
 * argument once, dispatches through the ops table and finishes requests
 * (AVG on the host at completion). */
#include "inner/comm/internal.h"

#include <stdlib.h>
#include <string.h>

/* Environment variables a launcher sets in each rank: OpenMPI's mpirun,
 * MPICH/Hydra, Intel MPI and srun --mpi=pmi2 (PMI_SIZE), MVAPICH2,
 * PMIx launchers (PMIX_RANK),
 * srun itself (SLURM_STEP_NUM_TASKS, only inside a job step, so a plain
 * process in an sbatch script stays one rank). The first gives the size. */
static const char *const launch_size_vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE",
                                               "MV2_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS"};
static const char *const launch_flag_vars[] = {"PMIX_RANK", "PMI_RANK"};

static const struct {
    const char *name;
    size_t size;
} dtypes[LOCO_DT_COUNT] = {
    [LOCO_DT_F32] = {"f32", 4}, [LOCO_DT_F64] = {"f64", 8}, [LOCO_DT_I32] = {"i32", 4},
    [LOCO_DT_I64] = {"i64", 8}, [LOCO_DT_U8] = {"u8", 1},
};

static const char *const op_names[LOCO_OP_COUNT] = {"sum", "avg", "max"};

size_t loco_comm_dtype_size(loco_comm_dtype dt) {
    return (unsigned)dt < LOCO_DT_COUNT ? dtypes[dt].size : 0;
}

const char *loco_comm_dtype_name(loco_comm_dtype dt) {
    return (unsigned)dt < LOCO_DT_COUNT ? dtypes[dt].name : "?";
}

const char *loco_comm_op_name(loco_comm_op op) {
    return (unsigned)op < LOCO_OP_COUNT ? op_names[op] : "?";
}

/* ---------------------------------------------------------------- helpers */

int loco__comm_new(loco_comm **out, const loco__comm_ops *ops, int rank, int size, size_t chunk_max,
                   loco_comm_thread_level threads, void *be) {
    *out = NULL;
    loco_comm *c = loco_alloc(sizeof *c);
    if (!c)
        return LOCO_ERR(LOCO_ENOMEM, "comm: no memory for a communicator");
    c->eq_counts = loco_alloc((size_t)size * sizeof *c->eq_counts);
    if (!c->eq_counts) {
        loco_free(c);
        return LOCO_ERR(LOCO_ENOMEM, "comm: no memory for %d counts", size);
    }
    c->ops = ops;
    c->rank = rank;
    c->size = size;
    c->chunk = c->chunk_max = chunk_max;
    c->threads = threads;
    c->be = be;
    *out = c;
    return 0;
}

/* Elements per thread's block of the AVG division: below one block threads
 * cost more than the division. */
#define DIVIDE_BLOCK ((size_t)65536)

/* n stays an int: (uint8_t)256 would be a division by zero. */
static void divide_range(void *buf, size_t lo, size_t hi, loco_comm_dtype dt, int n) {
    switch (dt) {
    case LOCO_DT_F32:
        for (size_t i = lo; i < hi; i++)
            ((float *)buf)[i] /= (float)n;
        break;
    case LOCO_DT_F64:
        for (size_t i = lo; i < hi; i++)
            ((double *)buf)[i] /= n;
        break;
    case LOCO_DT_I32:
        for (size_t i = lo; i < hi; i++)
            ((int32_t *)buf)[i] /= n;
        break;
    case LOCO_DT_I64:
        for (size_t i = lo; i < hi; i++)
            ((int64_t *)buf)[i] /= n;
        break;
    case LOCO_DT_U8:
        for (size_t i = lo; i < hi; i++)
            ((uint8_t *)buf)[i] = (uint8_t)(((uint8_t *)buf)[i] / n);
        break;
    default: break;
    }
}

void loco__comm_divide(void *buf, size_t count, loco_comm_dtype dt, int n) {
    if (n <= 1 || count == 0)
        return;
    size_t blocks = (count - 1) / DIVIDE_BLOCK + 1;
#pragma omp parallel for schedule(static) if (blocks > 1)
    for (size_t b = 0; b < blocks; b++) {
        size_t lo = b * DIVIDE_BLOCK;
        size_t hi = count - lo < DIVIDE_BLOCK ? count : lo + DIVIDE_BLOCK;
        divide_range(buf, lo, hi, dt, n);
    }
}

static int check_comm(const loco_comm *c, const char *what) {
    if (!c)
        return LOCO_ERR(LOCO_EINVAL, "%s: communicator is NULL", what);
    return 0;
}

static int check_dtype(loco_comm_dtype dt, const char *what) {
    if ((unsigned)dt >= LOCO_DT_COUNT)
        return LOCO_ERR(LOCO_EINVAL, "%s: unknown dtype %d", what, (int)dt);
    return 0;
}

static int check_op(loco_comm_op op, const char *what) {
    if ((unsigned)op >= LOCO_OP_COUNT)
        return LOCO_ERR(LOCO_EINVAL, "%s: unknown reduction op %d", what, (int)op);
    return 0;
}

/* count elements of dt in buf: the byte size fits size_t, buf present. */
static int check_buf(const void *buf, size_t count, loco_comm_dtype dt, const char *what,
                     const char *name) {
    if (count > SIZE_MAX / loco_comm_dtype_size(dt))
        return LOCO_ERR(LOCO_EINVAL, "%s: %s count %zu of %s overflows the address space", what,
                        name, count, loco_comm_dtype_name(dt));
    if (count > 0 && !buf)
        return LOCO_ERR(LOCO_EINVAL, "%s: %s is NULL with %zu elements", what, name, count);
    return 0;
}

/* Sum of n counts, refusing overflow of size_t (or of the byte size). */
static int sum_counts(const size_t *counts, int n, loco_comm_dtype dt, size_t *total,
                      const char *what, const char *name) {
    if (!counts)
        return LOCO_ERR(LOCO_EINVAL, "%s: %s array is NULL", what, name);
    size_t s = 0;
    for (int i = 0; i < n; i++) {
        if (counts[i] > SIZE_MAX - s)
            return LOCO_ERR(LOCO_EINVAL, "%s: %s overflow: the sum passes SIZE_MAX at rank %d",
                            what, name, i);
        s += counts[i];
    }
    if (s > SIZE_MAX / loco_comm_dtype_size(dt))
        return LOCO_ERR(LOCO_EINVAL, "%s: %s total %zu of %s overflows the address space", what,
                        name, s, loco_comm_dtype_name(dt));
    *total = s;
    return 0;
}

static int check_root(const loco_comm *c, int root, const char *what) {
    if (root < 0 || root >= c->size)
        return LOCO_ERR(LOCO_EINVAL, "%s: root %d outside the communicator's %d ranks", what, root,
                        c->size);
    return 0;
}

static int check_peer(const loco_comm *c, int peer, int tag, const char *what) {
    if (c->size == 1)
        return LOCO_ERR(LOCO_EINVAL, "%s: the %s communicator has one rank: no peers", what,
                        c->ops->name);
    if (peer < 0 || peer >= c->size)
        return LOCO_ERR(LOCO_EINVAL, "%s: peer %d outside the communicator's %d ranks", what, peer,
                        c->size);
    if (peer == c->rank)
        return LOCO_ERR(LOCO_EINVAL, "%s: peer %d is this rank (no messages to self)", what, peer);
    if (tag < 0 || tag > LOCO_COMM_TAG_MAX)
        return LOCO_ERR(LOCO_EINVAL, "%s: tag %d outside 0..%d", what, tag, LOCO_COMM_TAG_MAX);
    return 0;
}

/* A fresh request on c, or NULL (out of memory). */
static loco_comm_req *req_new(loco_comm *c) {
    loco_comm_req *r = loco_alloc(sizeof *r);
    if (r)
        r->comm = c;
    return r;
}

static void req_finish_avg(loco_comm_req *r) {
    if (r->avg_div > 1)
        loco__comm_divide(r->avg_buf, r->avg_count, r->avg_dt, r->avg_div);
}

/* Blocking form of an operation: the backend's call with req = NULL. A
 * backend that sums on the host divides for AVG itself in that case, so the
 * request path alone needs the front end's help. */
#define START(c, what, reqp, call)                                                                 \
    do {                                                                                           \
        *(reqp) = NULL;                                                                            \
        loco_comm_req *r_ = req_new(c);                                                            \
        if (!r_)                                                                                   \
            return LOCO_ERR(LOCO_ENOMEM, "%s: no memory for a request", what);                     \
        loco_comm_req *req = r_;                                                                   \
        int rc_ = (call);                                                                          \
        if (rc_ < 0) {                                                                             \
            loco_free(r_);                                                                         \
            loco__err_trace(__FILE__, __LINE__, #call);                                            \
            return rc_;                                                                            \
        }                                                                                          \
        (c)->pending++;                                                                            \
        *(reqp) = r_;                                                                              \
        return 0;                                                                                  \
    } while (0)

/* ------------------------------------------------------------- lifecycle */

static bool launched(long *size) {
    for (size_t i = 0; i < sizeof launch_size_vars / sizeof *launch_size_vars; i++) {
        const char *v = getenv(launch_size_vars[i]);
        if (v && *v) {
            *size = strtol(v, NULL, 10);
            return true;
        }
    }
    for (size_t i = 0; i < sizeof launch_flag_vars / sizeof *launch_flag_vars; i++) {
        const char *v = getenv(launch_flag_vars[i]);
        if (v && *v) {
            *size = -1; /* launched, size unknown */
            return true;
        }
    }
    return false;
}

int loco_comm_world(loco_comm **out, const char *backend) {
    if (!out)
        return LOCO_ERR(LOCO_EINVAL, "loco_comm_world: out is NULL");
    *out = NULL;
    if (!backend || !*backend || strcmp(backend, "auto") == 0) {
        long n = 0;
        if (!launched(&n))
            backend = "self";
        else if (loco__comm_mpi_built())
            backend = "mpi";
        else if (n > 1)
            return LOCO_ERR(LOCO_ENOTSUP,
                            "comm: launched as one of %ld ranks, but this build has no MPI "
                            "(rebuild with mpicc's flags, or run one process)",
                            n);
        else
            backend = "self";
    }
    if (strcmp(backend, "self") == 0) {
        LOCO_CHECK(loco__comm_self_new(out));
        return 0;
    }
    if (strcmp(backend, "mpi") == 0) {
        LOCO_CHECK(loco__comm_mpi_world(out));
        return 0;
    }
    if (strcmp(backend, "nccl") == 0) {
#ifdef LOCO_HAVE_NCCL
        LOCO_CHECK(loco__comm_nccl_world(out));
        return 0;
#else
        return LOCO_ERR(LOCO_ENOTSUP, "comm: this build has no nccl backend (it needs the CUDA "
                                      "toolkit and nccl.h at build time)");
#endif
    }
    return LOCO_ERR(LOCO_EINVAL,
                    "comm: unknown backend \"%s\" (expected auto, self, mpi or nccl)", backend);
}

void loco_comm_destroy(loco_comm *c) {
    if (!c)
        return;
    if (c->pending > 0)
        loco_warn("comm: destroying a %s communicator with %d request(s) not waited on",
                  c->ops->name, c->pending);
    c->ops->destroy(c);
    loco_free(c->eq_counts);
    loco_free(c);
}

int loco_comm_abort(loco_comm *c, int exit_code) {
    LOCO_CHECK(check_comm(c, "loco_comm_abort"));
    return c->ops->abort(c, exit_code);
}

int loco_comm_rank(const loco_comm *c) {
    return c ? c->rank : 0;
}
int loco_comm_size(const loco_comm *c) {
    return c ? c->size : 0;
}
const char *loco_comm_backend(const loco_comm *c) {
    return c ? c->ops->name : "none";
}

loco_comm_thread_level loco_comm_thread_support(const loco_comm *c) {
    return c ? c->threads : LOCO_COMM_THREAD_SINGLE;
}

int loco_comm_set_chunk(loco_comm *c, size_t n) {
    LOCO_CHECK(check_comm(c, "loco_comm_set_chunk"));
    if (n > c->chunk_max)
        return LOCO_ERR(LOCO_EINVAL, "loco_comm_set_chunk: %zu elements is above the %s limit %zu",
                        n, c->ops->name, c->chunk_max);
    c->chunk = n ? n : c->chunk_max;
    return 0;
}

size_t loco_comm_chunk(const loco_comm *c) {
    return c ? c->chunk : 0;
}

int loco_comm_split(loco_comm *c, int color, int key, loco_comm **out) {
    static const char what[] = "loco_comm_split";
    if (!out)
        return LOCO_ERR(LOCO_EINVAL, "%s: out is NULL", what);
    *out = NULL;
    LOCO_CHECK(check_comm(c, what));
    if (color < 0 && color != LOCO_COMM_COLOR_NONE)
        return LOCO_ERR(LOCO_EINVAL, "%s: color %d is negative (LOCO_COMM_COLOR_NONE to opt out)",
                        what, color);
    LOCO_CHECK(c->ops->split(c, color, key, out));
    return 0;
}

/* ------------------------------------------------------------ argument sets */

static int args_allreduce(const loco_comm *c, const void *buf, size_t count, loco_comm_dtype dt,
                          loco_comm_op op, const char *what) {
    LOCO_CHECK(check_comm(c, what));
    LOCO_CHECK(check_dtype(dt, what));
    LOCO_CHECK(check_op(op, what));
    LOCO_CHECK(check_buf(buf, count, dt, what, "buf"));
    return 0;
}

static int args_reduce_scatter(const loco_comm *c, const void *send, const void *recv,
                               const size_t *counts, loco_comm_dtype dt, loco_comm_op op,
                               const char *what) {
    size_t total;
    LOCO_CHECK(check_comm(c, what));
    LOCO_CHECK(check_dtype(dt, what));
    LOCO_CHECK(check_op(op, what));
    LOCO_CHECK(sum_counts(counts, c->size, dt, &total, what, "counts"));
    LOCO_CHECK(check_buf(send, total, dt, what, "send"));
    LOCO_CHECK(check_buf(recv, counts[c->rank], dt, what, "recv"));
    return 0;
}

static int args_allgather(const loco_comm *c, const void *send, const void *recv,
                          const size_t *counts, loco_comm_dtype dt, const char *what) {
    size_t total;
    LOCO_CHECK(check_comm(c, what));
    LOCO_CHECK(check_dtype(dt, what));
    LOCO_CHECK(sum_counts(counts, c->size, dt, &total, what, "counts"));
    LOCO_CHECK(check_buf(send, counts[c->rank], dt, what, "send"));
    LOCO_CHECK(check_buf(recv, total, dt, what, "recv"));
    return 0;
}

static int args_broadcast(const loco_comm *c, const void *buf, size_t count, loco_comm_dtype dt,
                          int root, const char *what) {
    LOCO_CHECK(check_comm(c, what));
    LOCO_CHECK(check_dtype(dt, what));
    LOCO_CHECK(check_root(c, root, what));
    LOCO_CHECK(check_buf(buf, count, dt, what, "buf"));
    return 0;
}

static int args_p2p(const loco_comm *c, const void *buf, size_t count, loco_comm_dtype dt, int peer,
                    int tag, const char *what) {
    LOCO_CHECK(check_comm(c, what));
    LOCO_CHECK(check_dtype(dt, what));
    LOCO_CHECK(check_peer(c, peer, tag, what));
    LOCO_CHECK(check_buf(buf, count, dt, what, "buf"));
    return 0;
}

static int args_alltoallv(const loco_comm *c, const void *send, const size_t *sendcounts,
                          const void *recv, const size_t *recvcounts, loco_comm_dtype dt,
                          const char *what) {
    size_t stotal, rtotal;
    LOCO_CHECK(check_comm(c, what));
    LOCO_CHECK(check_dtype(dt, what));
    LOCO_CHECK(sum_counts(sendcounts, c->size, dt, &stotal, what, "sendcounts"));
    LOCO_CHECK(sum_counts(recvcounts, c->size, dt, &rtotal, what, "recvcounts"));
    LOCO_CHECK(check_buf(send, stotal, dt, what, "send"));
    LOCO_CHECK(check_buf(recv, rtotal, dt, what, "recv"));
    return 0;
}

/* Equal counts for alltoall, in c's scratch (backends copy them at once). */
static int alltoall_counts(loco_comm *c, size_t count, loco_comm_dtype dt, const char *what) {
    LOCO_CHECK(check_comm(c, what));
    LOCO_CHECK(check_dtype(dt, what));
    if (count > SIZE_MAX / (size_t)c->size)
        return LOCO_ERR(LOCO_EINVAL, "%s: count %zu times %d ranks overflows", what, count,
                        c->size);
    for (int i = 0; i < c->size; i++)
        c->eq_counts[i] = count;
    return 0;
}

/* ------------------------------------------------------------- blocking */

int loco_comm_allreduce(loco_comm *c, void *buf, size_t count, loco_comm_dtype dt,
                        loco_comm_op op) {
    LOCO_CHECK(args_allreduce(c, buf, count, dt, op, "loco_comm_allreduce"));
    LOCO_CHECK(c->ops->allreduce(c, buf, count, dt, op, NULL));
    return 0;
}

int loco_comm_reduce_scatter(loco_comm *c, const void *send, void *recv, const size_t *counts,
                             loco_comm_dtype dt, loco_comm_op op) {
    LOCO_CHECK(args_reduce_scatter(c, send, recv, counts, dt, op, "loco_comm_reduce_scatter"));
    LOCO_CHECK(c->ops->reduce_scatter(c, send, recv, counts, dt, op, NULL));
    return 0;
}

int loco_comm_allgather(loco_comm *c, const void *send, void *recv, const size_t *counts,
                        loco_comm_dtype dt) {
    LOCO_CHECK(args_allgather(c, send, recv, counts, dt, "loco_comm_allgather"));
    LOCO_CHECK(c->ops->allgather(c, send, recv, counts, dt, NULL));
    return 0;
}

int loco_comm_broadcast(loco_comm *c, void *buf, size_t count, loco_comm_dtype dt, int root) {
    LOCO_CHECK(args_broadcast(c, buf, count, dt, root, "loco_comm_broadcast"));
    LOCO_CHECK(c->ops->broadcast(c, buf, count, dt, root, NULL));
    return 0;
}

int loco_comm_send(loco_comm *c, const void *buf, size_t count, loco_comm_dtype dt, int peer,
                   int tag) {
    LOCO_CHECK(args_p2p(c, buf, count, dt, peer, tag, "loco_comm_send"));
    LOCO_CHECK(c->ops->send(c, buf, count, dt, peer, tag, NULL));
    return 0;
}

int loco_comm_recv(loco_comm *c, void *buf, size_t count, loco_comm_dtype dt, int peer, int tag) {
    LOCO_CHECK(args_p2p(c, buf, count, dt, peer, tag, "loco_comm_recv"));
    LOCO_CHECK(c->ops->recv(c, buf, count, dt, peer, tag, NULL));
    return 0;
}

int loco_comm_alltoallv(loco_comm *c, const void *send, const size_t *sendcounts, void *recv,
                        const size_t *recvcounts, loco_comm_dtype dt) {
    LOCO_CHECK(args_alltoallv(c, send, sendcounts, recv, recvcounts, dt, "loco_comm_alltoallv"));
    LOCO_CHECK(c->ops->alltoallv(c, send, sendcounts, recv, recvcounts, dt, NULL));
    return 0;
}

int loco_comm_alltoall(loco_comm *c, const void *send, void *recv, size_t count,
                       loco_comm_dtype dt) {
    static const char what[] = "loco_comm_alltoall";
    LOCO_CHECK(alltoall_counts(c, count, dt, what));
    LOCO_CHECK(args_alltoallv(c, send, c->eq_counts, recv, c->eq_counts, dt, what));
    LOCO_CHECK(c->ops->alltoallv(c, send, c->eq_counts, recv, c->eq_counts, dt, NULL));
    return 0;
}

int loco_comm_barrier(loco_comm *c) {
    LOCO_CHECK(check_comm(c, "loco_comm_barrier"));
    LOCO_CHECK(c->ops->barrier(c));
    return 0;
}

/* ------------------------------------------------------------ non-blocking */

static int check_reqp(loco_comm_req **reqp, const char *what) {
    if (!reqp)
        return LOCO_ERR(LOCO_EINVAL, "%s: req is NULL", what);
    *reqp = NULL;
    return 0;
}

int loco_comm_iallreduce(loco_comm *c, void *buf, size_t count, loco_comm_dtype dt, loco_comm_op op,
                         loco_comm_req **reqp) {
    static const char what[] = "loco_comm_iallreduce";
    LOCO_CHECK(check_reqp(reqp, what));
    LOCO_CHECK(args_allreduce(c, buf, count, dt, op, what));
    START(c, what, reqp, c->ops->allreduce(c, buf, count, dt, op, req));
}

int loco_comm_ireduce_scatter(loco_comm *c, const void *send, void *recv, const size_t *counts,
                              loco_comm_dtype dt, loco_comm_op op, loco_comm_req **reqp) {
    static const char what[] = "loco_comm_ireduce_scatter";
    LOCO_CHECK(check_reqp(reqp, what));
    LOCO_CHECK(args_reduce_scatter(c, send, recv, counts, dt, op, what));
    START(c, what, reqp, c->ops->reduce_scatter(c, send, recv, counts, dt, op, req));
}

int loco_comm_iallgather(loco_comm *c, const void *send, void *recv, const size_t *counts,
                         loco_comm_dtype dt, loco_comm_req **reqp) {
    static const char what[] = "loco_comm_iallgather";
    LOCO_CHECK(check_reqp(reqp, what));
    LOCO_CHECK(args_allgather(c, send, recv, counts, dt, what));
    START(c, what, reqp, c->ops->allgather(c, send, recv, counts, dt, req));
}

int loco_comm_ibroadcast(loco_comm *c, void *buf, size_t count, loco_comm_dtype dt, int root,
                         loco_comm_req **reqp) {
    static const char what[] = "loco_comm_ibroadcast";
    LOCO_CHECK(check_reqp(reqp, what));
    LOCO_CHECK(args_broadcast(c, buf, count, dt, root, what));
    START(c, what, reqp, c->ops->broadcast(c, buf, count, dt, root, req));
}

int loco_comm_isend(loco_comm *c, const void *buf, size_t count, loco_comm_dtype dt, int peer,
                    int tag, loco_comm_req **reqp) {
    static const char what[] = "loco_comm_isend";
    LOCO_CHECK(check_reqp(reqp, what));
    LOCO_CHECK(args_p2p(c, buf, count, dt, peer, tag, what));
    START(c, what, reqp, c->ops->send(c, buf, count, dt, peer, tag, req));
}

int loco_comm_irecv(loco_comm *c, void *buf, size_t count, loco_comm_dtype dt, int peer, int tag,
                    loco_comm_req **reqp) {
    static const char what[] = "loco_comm_irecv";
    LOCO_CHECK(check_reqp(reqp, what));
    LOCO_CHECK(args_p2p(c, buf, count, dt, peer, tag, what));
    START(c, what, reqp, c->ops->recv(c, buf, count, dt, peer, tag, req));
}

int loco_comm_ialltoallv(loco_comm *c, const void *send, const size_t *sendcounts, void *recv,
                         const size_t *recvcounts, loco_comm_dtype dt, loco_comm_req **reqp) {
    static const char what[] = "loco_comm_ialltoallv";
    LOCO_CHECK(check_reqp(reqp, what));
    LOCO_CHECK(args_alltoallv(c, send, sendcounts, recv, recvcounts, dt, what));
    START(c, what, reqp, c->ops->alltoallv(c, send, sendcounts, recv, recvcounts, dt, req));
}

int loco_comm_ialltoall(loco_comm *c, const void *send, void *recv, size_t count,
                        loco_comm_dtype dt, loco_comm_req **reqp) {
    static const char what[] = "loco_comm_ialltoall";
    LOCO_CHECK(check_reqp(reqp, what));
    LOCO_CHECK(alltoall_counts(c, count, dt, what));
    LOCO_CHECK(args_alltoallv(c, send, c->eq_counts, recv, c->eq_counts, dt, what));
    START(c, what, reqp, c->ops->alltoallv(c, send, c->eq_counts, recv, c->eq_counts, dt, req));
}

int loco_comm_wait(loco_comm_req *req) {
    if (!req)
        return 0;
    int rc = req->rc;
    if (!req->done) {
        rc = req->comm->ops->wait(req);
        if (rc == 0)
            req_finish_avg(req);
    } else if (req->be) {
        req->comm->ops->wait(req); /* only releases: test saw it finish */
    }
    req->comm->pending--;
    loco_free(req);
    if (rc < 0)
        loco__err_trace(__FILE__, __LINE__, "loco_comm_wait");
    return rc;
}

int loco_comm_waitall(loco_comm_req **reqs, int n) {
    if (n > 0 && !reqs)
        return LOCO_ERR(LOCO_EINVAL, "loco_comm_waitall: %d requests in a NULL array", n);
    int first = 0;
    for (int i = 0; i < n; i++) {
        int rc = loco_comm_wait(reqs[i]);
        reqs[i] = NULL;
        if (rc < 0 && first == 0)
            first = rc;
    }
    return first;
}

int loco_comm_test(loco_comm_req *req, bool *done) {
    if (!done)
        return LOCO_ERR(LOCO_EINVAL, "loco_comm_test: done is NULL");
    if (!req || req->done) {
        *done = true;
        return req ? req->rc : 0;
    }
    *done = false;
    int rc = req->comm->ops->test(req, done);
    if (rc < 0) {
        req->done = *done = true;
        req->rc = rc;
        loco__err_trace(__FILE__, __LINE__, "loco_comm_test");
        return rc;
    }
    if (*done) {
        req_finish_avg(req);
        req->done = true;
    }
    return 0;
}
