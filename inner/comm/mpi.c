/* The mpi backend: host buffers over MPI (OpenMPI, MPICH). Every
 * communicator is a dup or split of MPI_COMM_WORLD with MPI_ERRORS_RETURN,
 * and every MPI status is translated here (MPI_CHECK) into LOCO_EMPI with
 * MPI's own error string. Non-blocking operations use MPI-3's nonblocking
 * collectives; a request keeps its MPI requests and the int counts and
 * displacements MPI reads until completion.
 *
 * Compiled in when <mpi.h> is on the include path (mpicc -showme:compile);
 * -DLOCO_HAVE_MPI=0 leaves it out, and then "mpi" is LOCO_ENOTSUP.
 *
 * Why one file: one backend fills one ops table, each op a short
 * translation of MPI's call and status. */
#include "inner/comm/internal.h"

#ifndef LOCO_HAVE_MPI
#if defined(__has_include)
#if __has_include(<mpi.h>)
#define LOCO_HAVE_MPI 1
#endif
#endif
#endif
#ifndef LOCO_HAVE_MPI
#define LOCO_HAVE_MPI 0
#endif

#if LOCO_HAVE_MPI

#include <limits.h>
#include <mpi.h>
#include <string.h>

/* Ints per rank of a communicator's scratch for blocking v-operations:
 * send counts, send displacements, recv counts, recv displacements. */
#define INTS_PER_RANK 4

/* Process-wide MPI state: whether loco initialised MPI (and so finalizes it
 * with the last communicator), how many loco communicators live on it, and
 * the thread level MPI granted. Communicators are made and destroyed from
 * one thread. */
static struct {
    bool we_initialised;
    int live;
    loco_comm_thread_level threads;
} g_mpi;

typedef struct {
    MPI_Comm comm;
    int *ints; /* (INTS_PER_RANK * size) scratch of blocking v-operations */
} mpi_comm;

/* A started operation: n MPI requests (one per piece of a contiguous
 * operation, one for a v-operation) and what completion checks. */
typedef struct {
    int n;
    bool done;     /* completed by test; wait only releases */
    bool recv;     /* check every piece arrived whole */
    int peer, tag; /* recv: for the message */
    size_t count;  /* recv: elements expected in all */
    size_t chunk;  /* recv: elements per piece */
    MPI_Datatype type;
    MPI_Request *r; /* (n) */
    MPI_Status *st; /* (n) */
    int *ints;      /* counts and displacements MPI reads until completion */
} mpi_req;

/* --------------------------------------------------------------- errors */

static int mpi_fail(int mrc, const char *call, const char *file, int line) {
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(mrc, s, &len) != MPI_SUCCESS)
        snprintf(s, sizeof s, "MPI error %d", mrc);
    int name_len = (int)strcspn(call, "(");
    return loco__err_set(LOCO_EMPI, file, line, "%.*s: %s", name_len, call, s);
}

/* Translates a failing MPI call into LOCO_EMPI "MPI_Xxx: <MPI's message>". */
#define MPI_CHECK(call)                                                                            \
    do {                                                                                           \
        int mpi_rc_ = (call);                                                                      \
        if (mpi_rc_ != MPI_SUCCESS)                                                                \
            return mpi_fail(mpi_rc_, #call, __FILE__, __LINE__);                                   \
    } while (0)

/* Same, storing the status in `rc` and jumping to a cleanup label. */
#define MPI_CHECK_GOTO(call, label)                                                                \
    do {                                                                                           \
        int mpi_rc_ = (call);                                                                      \
        if (mpi_rc_ != MPI_SUCCESS) {                                                              \
            rc = mpi_fail(mpi_rc_, #call, __FILE__, __LINE__);                                     \
            goto label;                                                                            \
        }                                                                                          \
    } while (0)

/* The failure of a Waitall/Testall: the first request that failed. */
static int statuses_fail(int mrc, const mpi_req *mr, const char *call) {
    if (mrc == MPI_ERR_IN_STATUS) {
        for (int i = 0; i < mr->n; i++) {
            int e = mr->st[i].MPI_ERROR;
            if (e != MPI_SUCCESS && e != MPI_ERR_PENDING)
                return mpi_fail(e, call, __FILE__, __LINE__);
        }
    }
    return mpi_fail(mrc, call, __FILE__, __LINE__);
}

/* ---------------------------------------------------------------- types */

static MPI_Datatype mpi_type(loco_comm_dtype dt) {
    switch (dt) {
    case LOCO_DT_F32: return MPI_FLOAT;
    case LOCO_DT_F64: return MPI_DOUBLE;
    case LOCO_DT_I32: return MPI_INT32_T;
    case LOCO_DT_I64: return MPI_INT64_T;
    case LOCO_DT_U8: return MPI_UINT8_T;
    default: return MPI_DATATYPE_NULL;
    }
}

/* AVG sums in MPI and divides on the host at completion. */
static MPI_Op mpi_op(loco_comm_op op) {
    return op == LOCO_OP_MAX ? MPI_MAX : MPI_SUM;
}

static loco_comm_thread_level thread_level(int provided) {
    if (provided >= MPI_THREAD_MULTIPLE)
        return LOCO_COMM_THREAD_MULTIPLE;
    if (provided >= MPI_THREAD_SERIALIZED)
        return LOCO_COMM_THREAD_SERIALIZED;
    if (provided >= MPI_THREAD_FUNNELED)
        return LOCO_COMM_THREAD_FUNNELED;
    return LOCO_COMM_THREAD_SINGLE;
}

static MPI_Comm comm_of(const loco_comm *c) {
    return ((const mpi_comm *)c->be)->comm;
}

/* Counts (and displacements = prefix sums, when displs is not NULL) as the
 * ints MPI takes. Every count and the total must fit an int. */
static int to_ints(const loco_comm *c, const size_t *counts, int *icounts, int *idispls,
                   const char *what) {
    size_t off = 0;
    for (int i = 0; i < c->size; i++) {
        if (counts[i] > (size_t)INT_MAX - off)
            return LOCO_ERR(LOCO_EINVAL,
                            "%s: %zu elements for rank %d after %zu: the mpi backend takes at "
                            "most INT_MAX (%d) elements in all per call; split the call",
                            what, counts[i], i, off, INT_MAX);
        icounts[i] = (int)counts[i];
        if (idispls)
            idispls[i] = (int)off;
        off += counts[i];
    }
    return 0;
}

/* ------------------------------------------------------------- requests */

static mpi_req *req_alloc(int n, int nints) {
    size_t head = (sizeof(mpi_req) + 15) & ~(size_t)15;
    size_t bytes =
        head + (size_t)n * (sizeof(MPI_Request) + sizeof(MPI_Status)) + (size_t)nints * sizeof(int);
    char *p = loco_alloc(bytes);
    if (!p)
        return NULL;
    mpi_req *mr = (mpi_req *)p;
    mr->n = n;
    mr->r = (MPI_Request *)(p + head);
    mr->st = (MPI_Status *)(mr->r + n);
    mr->ints = (int *)(mr->st + n);
    for (int i = 0; i < n; i++)
        mr->r[i] = MPI_REQUEST_NULL;
    return mr;
}

/* Starts a request of n MPI requests and nints ints on req. */
static int req_start(loco_comm_req *req, int n, int nints, mpi_req **out, const char *what) {
    mpi_req *mr = req_alloc(n, nints);
    if (!mr)
        return LOCO_ERR(LOCO_ENOMEM, "%s: no memory for %d MPI requests", what, n);
    req->be = mr;
    *out = mr;
    return 0;
}

static void req_drop(loco_comm_req *req) {
    /* MPI forbids freeing nonblocking-collective requests, so pieces
     * started before a failure are left to MPI; the island is going down. */
    loco_free(req->be);
    req->be = NULL;
}

static void req_avg(loco_comm_req *req, const loco_comm *c, void *buf, size_t count,
                    loco_comm_dtype dt, loco_comm_op op) {
    if (op != LOCO_OP_AVG)
        return;
    req->avg_buf = buf;
    req->avg_count = count;
    req->avg_dt = dt;
    req->avg_div = c->size;
}

static int check_recv_count(MPI_Status *st, MPI_Datatype type, size_t expected, int peer, int tag) {
    int got = 0;
    MPI_CHECK(MPI_Get_count(st, type, &got));
    if (got < 0 || (size_t)got != expected)
        return LOCO_ERR(LOCO_EPROTO,
                        "recv from rank %d (tag %d): a message of %d elements where %zu were "
                        "expected",
                        peer, tag, got, expected);
    return 0;
}

/* After every piece completed: a recv checks each piece arrived whole. */
static int req_check(const mpi_req *mr) {
    if (!mr->recv)
        return 0;
    for (int i = 0; i < mr->n; i++) {
        size_t off = (size_t)i * mr->chunk;
        size_t n = mr->count - off < mr->chunk ? mr->count - off : mr->chunk;
        LOCO_CHECK(check_recv_count(&mr->st[i], mr->type, n, mr->peer, mr->tag));
    }
    return 0;
}

static int mpi_wait(loco_comm_req *req) {
    mpi_req *mr = req->be;
    if (!mr)
        return 0;
    int rc = 0;
    if (!mr->done) {
        int mrc = MPI_Waitall(mr->n, mr->r, mr->st);
        rc = mrc != MPI_SUCCESS ? statuses_fail(mrc, mr, "MPI_Waitall") : req_check(mr);
    }
    loco_free(mr);
    req->be = NULL;
    return rc;
}

static int mpi_test(loco_comm_req *req, bool *done) {
    mpi_req *mr = req->be;
    *done = true;
    if (!mr || mr->done)
        return 0;
    int flag = 0;
    int mrc = MPI_Testall(mr->n, mr->r, &flag, mr->st);
    if (mrc != MPI_SUCCESS) {
        mr->done = true;
        return statuses_fail(mrc, mr, "MPI_Testall");
    }
    *done = flag != 0;
    if (!flag)
        return 0;
    mr->done = true;
    LOCO_CHECK(req_check(mr));
    return 0;
}

/* ----------------------------------------------------- contiguous pieces */

/* allreduce, broadcast, send and recv move one contiguous buffer; MPI takes
 * int counts, so the buffer goes in pieces of at most c->chunk elements,
 * every rank issuing the same pieces in the same order. */
typedef enum { PIECE_ALLREDUCE, PIECE_BCAST, PIECE_SEND, PIECE_RECV } piece_kind;

typedef struct {
    piece_kind kind;
    void *buf;
    size_t count;
    loco_comm_dtype dt;
    loco_comm_op op;
    int peer; /* root of a broadcast */
    int tag;
} piece_args;

/* One piece [off, off + n): blocking when r is NULL. */
static int piece(const loco_comm *c, const piece_args *a, size_t off, int n, MPI_Request *r) {
    MPI_Comm comm = comm_of(c);
    MPI_Datatype t = mpi_type(a->dt);
    char *p = (char *)a->buf + off * loco_comm_dtype_size(a->dt);
    switch (a->kind) {
    case PIECE_ALLREDUCE:
        if (r)
            MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, p, n, t, mpi_op(a->op), comm, r));
        else
            MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, p, n, t, mpi_op(a->op), comm));
        return 0;
    case PIECE_BCAST:
        if (r)
            MPI_CHECK(MPI_Ibcast(p, n, t, a->peer, comm, r));
        else
            MPI_CHECK(MPI_Bcast(p, n, t, a->peer, comm));
        return 0;
    case PIECE_SEND:
        if (r)
            MPI_CHECK(MPI_Isend(p, n, t, a->peer, a->tag, comm, r));
        else
            MPI_CHECK(MPI_Send(p, n, t, a->peer, a->tag, comm));
        return 0;
    case PIECE_RECV:
        if (r) {
            MPI_CHECK(MPI_Irecv(p, n, t, a->peer, a->tag, comm, r));
        } else {
            MPI_Status st;
            MPI_CHECK(MPI_Recv(p, n, t, a->peer, a->tag, comm, &st));
            LOCO_CHECK(check_recv_count(&st, t, (size_t)n, a->peer, a->tag));
        }
        return 0;
    }
    return LOCO_ERR(LOCO_EINVAL, "mpi: unknown piece kind %d", (int)a->kind);
}

static int run_pieces(loco_comm *c, const piece_args *a, loco_comm_req *req, const char *what) {
    size_t chunk = c->chunk;
    size_t npieces = a->count == 0 ? 0 : (a->count - 1) / chunk + 1;
    if (npieces > INT_MAX)
        return LOCO_ERR(LOCO_EINVAL, "%s: %zu elements in pieces of %zu are too many pieces", what,
                        a->count, chunk);
    if (!req) {
        for (size_t off = 0; off < a->count; off += chunk) {
            size_t n = a->count - off < chunk ? a->count - off : chunk;
            LOCO_CHECK(piece(c, a, off, (int)n, NULL));
        }
        if (a->kind == PIECE_ALLREDUCE && a->op == LOCO_OP_AVG)
            loco__comm_divide(a->buf, a->count, a->dt, c->size);
        return 0;
    }
    mpi_req *mr = NULL;
    LOCO_CHECK(req_start(req, (int)npieces, 0, &mr, what));
    for (int i = 0; i < mr->n; i++) {
        size_t off = (size_t)i * chunk;
        size_t n = a->count - off < chunk ? a->count - off : chunk;
        int rc = piece(c, a, off, (int)n, &mr->r[i]);
        if (rc < 0) {
            req_drop(req);
            LOCO_CHECK(rc);
        }
    }
    if (a->kind == PIECE_RECV) {
        mr->recv = true;
        mr->peer = a->peer;
        mr->tag = a->tag;
        mr->count = a->count;
        mr->chunk = chunk;
        mr->type = mpi_type(a->dt);
    }
    if (a->kind == PIECE_ALLREDUCE)
        req_avg(req, c, a->buf, a->count, a->dt, a->op);
    return 0;
}

/* ----------------------------------------------------------- operations */

static int mpi_allreduce(loco_comm *c, void *buf, size_t count, loco_comm_dtype dt, loco_comm_op op,
                         loco_comm_req *req) {
    piece_args a = {.kind = PIECE_ALLREDUCE, .buf = buf, .count = count, .dt = dt, .op = op};
    LOCO_CHECK(run_pieces(c, &a, req, "allreduce"));
    return 0;
}

static int mpi_broadcast(loco_comm *c, void *buf, size_t count, loco_comm_dtype dt, int root,
                         loco_comm_req *req) {
    piece_args a = {.kind = PIECE_BCAST, .buf = buf, .count = count, .dt = dt, .peer = root};
    LOCO_CHECK(run_pieces(c, &a, req, "broadcast"));
    return 0;
}

static int mpi_send(loco_comm *c, const void *buf, size_t count, loco_comm_dtype dt, int peer,
                    int tag, loco_comm_req *req) {
    /* MPI's send takes a const buffer; the cast only shares piece(). */
    piece_args a = {
        .kind = PIECE_SEND, .buf = (void *)buf, .count = count, .dt = dt, .peer = peer, .tag = tag};
    LOCO_CHECK(run_pieces(c, &a, req, "send"));
    return 0;
}

static int mpi_recv(loco_comm *c, void *buf, size_t count, loco_comm_dtype dt, int peer, int tag,
                    loco_comm_req *req) {
    piece_args a = {
        .kind = PIECE_RECV, .buf = buf, .count = count, .dt = dt, .peer = peer, .tag = tag};
    LOCO_CHECK(run_pieces(c, &a, req, "recv"));
    return 0;
}

static int mpi_reduce_scatter(loco_comm *c, const void *send, void *recv, const size_t *counts,
                              loco_comm_dtype dt, loco_comm_op op, loco_comm_req *req) {
    static const char what[] = "reduce_scatter";
    mpi_comm *m = c->be;
    MPI_Datatype t = mpi_type(dt);
    /* send == recv: MPI's in place, the result at the start of recv. */
    const void *sb = send == recv ? MPI_IN_PLACE : send;
    if (!req) {
        LOCO_CHECK(to_ints(c, counts, m->ints, NULL, what));
        MPI_CHECK(MPI_Reduce_scatter(sb, recv, m->ints, t, mpi_op(op), m->comm));
        if (op == LOCO_OP_AVG)
            loco__comm_divide(recv, counts[c->rank], dt, c->size);
        return 0;
    }
    mpi_req *mr = NULL;
    LOCO_CHECK(req_start(req, 1, c->size, &mr, what));
    int rc = 0;
    LOCO_CHECK_GOTO(to_ints(c, counts, mr->ints, NULL, what), out_drop);
    MPI_CHECK_GOTO(MPI_Ireduce_scatter(sb, recv, mr->ints, t, mpi_op(op), m->comm, &mr->r[0]),
                   out_drop);
    req_avg(req, c, recv, counts[c->rank], dt, op);
    return 0;
out_drop:
    req_drop(req);
    return rc;
}

static int mpi_allgather(loco_comm *c, const void *send, void *recv, const size_t *counts,
                         loco_comm_dtype dt, loco_comm_req *req) {
    static const char what[] = "allgather";
    mpi_comm *m = c->be;
    MPI_Datatype t = mpi_type(dt);
    int *ic, *id;
    mpi_req *mr = NULL;
    int rc = 0;
    if (req) {
        LOCO_CHECK(req_start(req, 1, 2 * c->size, &mr, what));
        ic = mr->ints;
    } else {
        ic = m->ints;
    }
    id = ic + c->size;
    LOCO_CHECK_GOTO(to_ints(c, counts, ic, id, what), out_drop);
    /* send at this rank's own block of recv: MPI's in place. */
    size_t own = (size_t)id[c->rank] * loco_comm_dtype_size(dt);
    const void *sb = recv && send == (const char *)recv + own ? MPI_IN_PLACE : send;
    if (!req) {
        MPI_CHECK(MPI_Allgatherv(sb, ic[c->rank], t, recv, ic, id, t, m->comm));
        return 0;
    }
    MPI_CHECK_GOTO(MPI_Iallgatherv(sb, ic[c->rank], t, recv, ic, id, t, m->comm, &mr->r[0]),
                   out_drop);
    return 0;
out_drop:
    if (req)
        req_drop(req);
    return rc;
}

static int mpi_alltoallv(loco_comm *c, const void *send, const size_t *sendcounts, void *recv,
                         const size_t *recvcounts, loco_comm_dtype dt, loco_comm_req *req) {
    static const char what[] = "alltoallv";
    mpi_comm *m = c->be;
    MPI_Datatype t = mpi_type(dt);
    int *ints;
    mpi_req *mr = NULL;
    int rc = 0;
    if (req) {
        LOCO_CHECK(req_start(req, 1, INTS_PER_RANK * c->size, &mr, what));
        ints = mr->ints;
    } else {
        ints = m->ints;
    }
    int n = c->size;
    int *sc = ints, *sd = ints + n, *rcnt = ints + 2 * n, *rd = ints + 3 * n;
    LOCO_CHECK_GOTO(to_ints(c, sendcounts, sc, sd, what), out_drop);
    LOCO_CHECK_GOTO(to_ints(c, recvcounts, rcnt, rd, what), out_drop);
    if (!req) {
        MPI_CHECK(MPI_Alltoallv(send, sc, sd, t, recv, rcnt, rd, t, m->comm));
        return 0;
    }
    MPI_CHECK_GOTO(MPI_Ialltoallv(send, sc, sd, t, recv, rcnt, rd, t, m->comm, &mr->r[0]),
                   out_drop);
    return 0;
out_drop:
    if (req)
        req_drop(req);
    return rc;
}

static int mpi_barrier(loco_comm *c) {
    MPI_CHECK(MPI_Barrier(comm_of(c)));
    return 0;
}

static int mpi_abort(loco_comm *c, int exit_code) {
    MPI_CHECK(MPI_Abort(comm_of(c), exit_code));
    return LOCO_ERR(LOCO_EMPI, "MPI_Abort returned");
}

/* ------------------------------------------------------------ lifecycle */

static int wrap(MPI_Comm mc, loco_comm **out);

static int mpi_split(loco_comm *c, int color, int key, loco_comm **out) {
    MPI_Comm nc = MPI_COMM_NULL;
    int mcolor = color == LOCO_COMM_COLOR_NONE ? MPI_UNDEFINED : color;
    MPI_CHECK(MPI_Comm_split(comm_of(c), mcolor, key, &nc));
    if (nc == MPI_COMM_NULL)
        return 0;
    int rc = wrap(nc, out);
    if (rc < 0) {
        MPI_Comm_free(&nc);
        LOCO_CHECK(rc);
    }
    return 0;
}

static void mpi_destroy(loco_comm *c) {
    mpi_comm *m = c->be;
    if (!m)
        return;
    int mrc = MPI_Comm_free(&m->comm);
    if (mrc != MPI_SUCCESS)
        loco_warn("comm: MPI_Comm_free failed (%d)", mrc);
    loco_free(m->ints);
    loco_free(m);
    c->be = NULL;
    if (--g_mpi.live == 0 && g_mpi.we_initialised) {
        g_mpi.we_initialised = false;
        mrc = MPI_Finalize();
        if (mrc != MPI_SUCCESS)
            loco_warn("comm: MPI_Finalize failed (%d)", mrc);
    }
}

static const loco__comm_ops mpi_ops = {
    .name = "mpi",
    .allreduce = mpi_allreduce,
    .reduce_scatter = mpi_reduce_scatter,
    .allgather = mpi_allgather,
    .broadcast = mpi_broadcast,
    .send = mpi_send,
    .recv = mpi_recv,
    .alltoallv = mpi_alltoallv,
    .barrier = mpi_barrier,
    .split = mpi_split,
    .wait = mpi_wait,
    .test = mpi_test,
    .abort = mpi_abort,
    .destroy = mpi_destroy,
};

/* A loco communicator around mc (which stays the caller's on failure). */
static int wrap(MPI_Comm mc, loco_comm **out) {
    int rank, size, rc = 0;
    MPI_CHECK(MPI_Comm_set_errhandler(mc, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_rank(mc, &rank));
    MPI_CHECK(MPI_Comm_size(mc, &size));
    mpi_comm *m = loco_alloc(sizeof *m);
    if (!m)
        return LOCO_ERR(LOCO_ENOMEM, "comm: no memory for an MPI communicator");
    m->comm = mc;
    m->ints = loco_alloc((size_t)INTS_PER_RANK * (size_t)size * sizeof(int));
    if (!m->ints) {
        rc = LOCO_ERR(LOCO_ENOMEM, "comm: no memory for counts of %d ranks", size);
        goto out_free;
    }
    LOCO_CHECK_GOTO(loco__comm_new(out, &mpi_ops, rank, size, INT_MAX, g_mpi.threads, m), out_free);
    g_mpi.live++;
    return 0;
out_free:
    loco_free(m->ints);
    loco_free(m);
    return rc;
}

bool loco__comm_mpi_built(void) {
    return true;
}

int loco__comm_mpi_world(loco_comm **out) {
    int inited = 0, finalized = 0;
    *out = NULL;
    MPI_CHECK(MPI_Finalized(&finalized));
    if (finalized)
        return LOCO_ERR(LOCO_EMPI, "comm: MPI was finalized in this process already and cannot "
                                   "start again");
    MPI_CHECK(MPI_Initialized(&inited));
    if (!inited) {
        int provided = MPI_THREAD_SINGLE;
        MPI_CHECK(MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided));
        g_mpi.we_initialised = true;
        g_mpi.threads = thread_level(provided);
        MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
        if (provided < MPI_THREAD_FUNNELED)
            loco_warn("comm: MPI grants only MPI_THREAD_SINGLE; keep OpenMP regions free of MPI "
                      "calls");
    } else {
        int provided = MPI_THREAD_SINGLE;
        MPI_CHECK(MPI_Query_thread(&provided));
        g_mpi.threads = thread_level(provided);
    }
    MPI_Comm dup = MPI_COMM_NULL;
    MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &dup));
    int rc = wrap(dup, out);
    if (rc < 0) {
        MPI_Comm_free(&dup);
        LOCO_CHECK(rc);
    }
    return 0;
}

#else /* !LOCO_HAVE_MPI */

bool loco__comm_mpi_built(void) {
    return false;
}

int loco__comm_mpi_world(loco_comm **out) {
    *out = NULL;
    return LOCO_ERR(LOCO_ENOTSUP, "comm: this build has no MPI (mpi.h was not on the include "
                                  "path; build with mpicc -showme:compile's flags)");
}

#endif /* LOCO_HAVE_MPI */
