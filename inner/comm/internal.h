/* inner/comm/ internals shared by the front end (comm.c) and the backends
 * (self.c, mpi.c, nccl.cu). Not for use outside inner/comm/. */
#ifndef LOCO_COMM_INTERNAL_H
#define LOCO_COMM_INTERNAL_H

#include "inner/comm/comm.h"

/* One backend. comm.c has validated every argument before a call reaches
 * it (communicator, dtype, op, root, peer != self, tag, counts overflow,
 * buffers present where counts > 0), so backends check only what is theirs
 * (int limits, matching counts on self).
 *
 * Every operation gets `req`: NULL means blocking (complete before
 * returning); otherwise start it, hang the backend's state on req->be and
 * return. An operation that completed at once may leave req->be NULL; wait
 * and test then see a finished request. Backends must not keep the counts
 * pointers past the call. AVG: a backend that sums on the host sets
 * req->avg_* so the front end divides at completion (blocking calls divide
 * before returning); a backend with a native average (NCCL's ncclAvg)
 * leaves them 0. On failure to start, the backend releases req->be itself. */
typedef struct loco__comm_ops {
    const char *name;
    int (*allreduce)(loco_comm *c, void *buf, size_t count, loco_comm_dtype dt, loco_comm_op op,
                     loco_comm_req *req);
    int (*reduce_scatter)(loco_comm *c, const void *send, void *recv, const size_t *counts,
                          loco_comm_dtype dt, loco_comm_op op, loco_comm_req *req);
    int (*allgather)(loco_comm *c, const void *send, void *recv, const size_t *counts,
                     loco_comm_dtype dt, loco_comm_req *req);
    int (*broadcast)(loco_comm *c, void *buf, size_t count, loco_comm_dtype dt, int root,
                     loco_comm_req *req);
    int (*send)(loco_comm *c, const void *buf, size_t count, loco_comm_dtype dt, int peer, int tag,
                loco_comm_req *req);
    int (*recv)(loco_comm *c, void *buf, size_t count, loco_comm_dtype dt, int peer, int tag,
                loco_comm_req *req);
    int (*alltoallv)(loco_comm *c, const void *send, const size_t *sendcounts, void *recv,
                     const size_t *recvcounts, loco_comm_dtype dt, loco_comm_req *req);
    int (*barrier)(loco_comm *c);
    /* *out = NULL when color is LOCO_COMM_COLOR_NONE. */
    int (*split)(loco_comm *c, int color, int key, loco_comm **out);
    /* Completes req (blocking) and releases req->be; also when it fails. */
    int (*wait)(loco_comm_req *req);
    /* Sets *done without blocking; once done, wait only releases. */
    int (*test)(loco_comm_req *req, bool *done);
    int (*abort)(loco_comm *c, int exit_code);
    /* Releases c->be (the front end frees c itself). */
    void (*destroy)(loco_comm *c);
} loco__comm_ops;

struct loco_comm {
    const loco__comm_ops *ops;
    int rank, size;
    size_t chunk;     /* elements per backend call of contiguous ops */
    size_t chunk_max; /* the backend's limit (and default) */
    loco_comm_thread_level threads;
    size_t *eq_counts; /* (size) scratch: alltoall's equal counts */
    int pending;       /* requests started and not yet waited on */
    void *be;          /* backend state */
};

struct loco_comm_req {
    loco_comm *comm;
    bool done; /* completed (by test); AVG already applied */
    int rc;    /* the completion status once done */
    /* AVG on the host at completion: divide avg_count elements by avg_div. */
    void *avg_buf;
    size_t avg_count;
    loco_comm_dtype avg_dt;
    int avg_div;
    void *be; /* backend state */
};

/* Makes a communicator around backend state `be` (taken over: on failure
 * the caller still owns be). chunk_max is also the initial chunk. */
int loco__comm_new(loco_comm **out, const loco__comm_ops *ops, int rank, int size, size_t chunk_max,
                   loco_comm_thread_level threads, void *be);

/* buf[i] /= n for count elements of dt (the host side of AVG). */
void loco__comm_divide(void *buf, size_t count, loco_comm_dtype dt, int n);

/* Backends' entry points. */
int loco__comm_self_new(loco_comm **out);
/* LOCO_ENOTSUP in a build without MPI. */
int loco__comm_mpi_world(loco_comm **out);
bool loco__comm_mpi_built(void);
#ifdef LOCO_HAVE_NCCL
/* nccl.cu: bootstraps through an auto communicator (see there). */
int loco__comm_nccl_world(loco_comm **out);
#endif

#endif /* LOCO_COMM_INTERNAL_H */
