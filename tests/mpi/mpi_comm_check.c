/* The mpi backend of inner/comm against plain arithmetic, run under
 * `mpirun -np 3` and `-np 4` (tests/comm/test_comm.c does). Every rank fills
 * its buffers with f(dtype, rank, index), so each rank computes locally what
 * every collective must produce: all dtypes and ops, blocking and
 * non-blocking, uneven and empty blocks, in-place forms, pieces smaller than
 * the buffer (loco_comm_set_chunk), sub-groups from split, a send/recv ring,
 * several requests in flight, computation overlapping an iallreduce, the
 * errors that must come back (bad root, INT_MAX overflow, short and
 * truncated messages), and "auto" picking mpi under mpirun.
 *
 * Why one file: one mpirun program, every rank running every check.
 *
 * Not a Criterion test: a plain program. Each rank prints its own failures
 * to stderr; rank 0 prints "N passed, N failed" over all ranks; the exit
 * status is 0 only when nothing failed anywhere.
 *
 * Build with -DLOCO_MPI_CHECK_MAIN (the Makefile's rule for
 * build/tests/mpi_comm_check does). Without it this file compiles to
 * nothing, so a wildcard over tests/x/x.c that pulls it into the Criterion
 * binary cannot replace Criterion's main. */
#ifdef LOCO_MPI_CHECK_MAIN

#include "inner/comm/comm.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/mpi/mpi_check.h"

/* A call that must succeed; the message names the call and loco's error. */
#define CHECK_OK(call)                                                                             \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        CHECK(rc_ == 0, "%s -> %s\n%s", #call, loco_strerror(rc_), loco_errmsg());                 \
    } while (0)

/* A call that must fail with `want`, and leave `part` in the message. */
#define CHECK_FAILS(call, want, part)                                                              \
    do {                                                                                           \
        loco_err_clear();                                                                          \
        int rc_ = (call);                                                                          \
        CHECK(rc_ == (want) && strstr(loco_errmsg(), (part)), "%s -> %s (wanted %s, \"%s\")\n%s",  \
              #call, loco_strerror(rc_), loco_strerror(want), (part), loco_errmsg());              \
    } while (0)

static const loco_comm_dtype all_dts[] = {LOCO_DT_F32, LOCO_DT_F64, LOCO_DT_I32, LOCO_DT_I64,
                                          LOCO_DT_U8};
static const loco_comm_op all_ops[] = {LOCO_OP_SUM, LOCO_OP_AVG, LOCO_OP_MAX};
#define N_DTS (int)(sizeof all_dts / sizeof *all_dts)
#define N_OPS (int)(sizeof all_ops / sizeof *all_ops)

/* ------------------------------------------------------ the plain reference */

/* Value of element i on rank r: small integers (exact in every type and
 * under every summation order), negative for i32, above 2^32 for i64, and
 * sums that stay below 256 for u8 with up to 4 ranks. */
static double fval(loco_comm_dtype dt, int r, size_t i) {
    switch (dt) {
    case LOCO_DT_F32: return (double)((r + 1) * 3 + (int)(i % 17));
    case LOCO_DT_F64: return r * 1000.5 + (double)(i % 1001);
    case LOCO_DT_I32: return (double)((r + 1) * (int)(i % 1000) - 7 * r);
    case LOCO_DT_I64: return (double)((int64_t)(r + 1) * ((int64_t)1 << 40) + (int64_t)(i % 99991));
    case LOCO_DT_U8: return (double)((r * 7 + (int)(i % 1000)) % 50);
    default: return 0;
    }
}

static void put(void *buf, loco_comm_dtype dt, size_t i, double v) {
    switch (dt) {
    case LOCO_DT_F32: ((float *)buf)[i] = (float)v; break;
    case LOCO_DT_F64: ((double *)buf)[i] = v; break;
    case LOCO_DT_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case LOCO_DT_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case LOCO_DT_U8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    default: break;
    }
}

static double get(const void *buf, loco_comm_dtype dt, size_t i) {
    switch (dt) {
    case LOCO_DT_F32: return ((const float *)buf)[i];
    case LOCO_DT_F64: return ((const double *)buf)[i];
    case LOCO_DT_I32: return ((const int32_t *)buf)[i];
    case LOCO_DT_I64: return (double)((const int64_t *)buf)[i];
    case LOCO_DT_U8: return ((const uint8_t *)buf)[i];
    default: return NAN;
    }
}

/* op over ranks 0..n-1 of fval(dt, r, i), in dt's own arithmetic. */
#define REDUCE_AS(T)                                                                               \
    do {                                                                                           \
        T s = 0, m = (T)fval(dt, 0, i);                                                            \
        for (int r = 0; r < n; r++) {                                                              \
            T v = (T)fval(dt, r, i);                                                               \
            s = (T)(s + v);                                                                        \
            m = v > m ? v : m;                                                                     \
        }                                                                                          \
        if (op == LOCO_OP_MAX)                                                                     \
            return (double)m;                                                                      \
        if (op == LOCO_OP_AVG)                                                                     \
            return (double)(T)(s / n);                                                             \
        return (double)s;                                                                          \
    } while (0)

static double expect_reduce(loco_comm_dtype dt, loco_comm_op op, int n, size_t i) {
    switch (dt) {
    case LOCO_DT_F32: REDUCE_AS(float);
    case LOCO_DT_F64: REDUCE_AS(double);
    case LOCO_DT_I32: REDUCE_AS(int32_t);
    case LOCO_DT_I64: REDUCE_AS(int64_t);
    case LOCO_DT_U8: REDUCE_AS(uint8_t);
    default: return NAN;
    }
}

static void *alloc_elems(size_t count, loco_comm_dtype dt) {
    void *p = calloc(count ? count : 1, loco_comm_dtype_size(dt));
    if (!p) {
        fprintf(stderr, "[rank %d] out of memory\n", g_rank);
        exit(3);
    }
    return p;
}

/* Counts patterns of the v-collectives over n ranks: uneven with an empty
 * block, equal, all empty, large and not divisible by n. */
enum { PAT_UNEVEN, PAT_EQUAL, PAT_EMPTY, PAT_LARGE, PAT_COUNT };
static const char *const pat_names[PAT_COUNT] = {"uneven", "equal", "empty", "large"};

static void make_counts(size_t *counts, int n, int pat) {
    for (int r = 0; r < n; r++) {
        switch (pat) {
        case PAT_UNEVEN: counts[r] = r % 3 == 1 ? 0 : (size_t)(r * 5 + 3); break;
        case PAT_EQUAL: counts[r] = 4; break;
        case PAT_EMPTY: counts[r] = 0; break;
        default: counts[r] = 1000 + (size_t)r * 37; break;
        }
    }
}

static size_t prefix(const size_t *counts, int upto) {
    size_t s = 0;
    for (int r = 0; r < upto; r++)
        s += counts[r];
    return s;
}

/* Completes a non-blocking call's request, or nothing for a blocking one. */
static void finish(loco_comm_req *req) {
    CHECK_OK(loco_comm_wait(req));
}

/* -------------------------------------------------------------- allreduce */

/* Returns the number of mismatches of buf against the reference. */
static size_t mismatches_reduce(const void *buf, loco_comm_dtype dt, loco_comm_op op, int n,
                                size_t count, size_t *first) {
    size_t bad = 0;
    for (size_t i = 0; i < count; i++) {
        if (get(buf, dt, i) != expect_reduce(dt, op, n, i)) {
            if (bad++ == 0)
                *first = i;
        }
    }
    return bad;
}

static void check_allreduce(loco_comm *c, const char *where, size_t count, bool nb) {
    int rank = loco_comm_rank(c), n = loco_comm_size(c);
    for (int d = 0; d < N_DTS; d++) {
        for (int o = 0; o < N_OPS; o++) {
            loco_comm_dtype dt = all_dts[d];
            loco_comm_op op = all_ops[o];
            void *buf = alloc_elems(count, dt);
            for (size_t i = 0; i < count; i++)
                put(buf, dt, i, fval(dt, rank, i));
            loco_comm_req *req = NULL;
            if (nb) {
                CHECK_OK(loco_comm_iallreduce(c, buf, count, dt, op, &req));
                CHECK(req != NULL, "iallreduce gave no request");
                finish(req);
            } else {
                CHECK_OK(loco_comm_allreduce(c, buf, count, dt, op));
            }
            size_t first = 0, bad = mismatches_reduce(buf, dt, op, n, count, &first);
            CHECK(bad == 0, "%s: %sallreduce %s %s count %zu: %zu wrong, first [%zu] = %g want %g",
                  where, nb ? "i" : "", loco_comm_dtype_name(dt), loco_comm_op_name(op), count, bad,
                  first, bad ? get(buf, dt, first) : 0.0,
                  bad ? expect_reduce(dt, op, n, first) : 0.0);
            free(buf);
        }
    }
}

/* --------------------------------------------------------- reduce_scatter */

static void check_reduce_scatter(loco_comm *c, const char *where, int pat, bool nb, bool in_place) {
    int rank = loco_comm_rank(c), n = loco_comm_size(c);
    size_t *counts = calloc((size_t)n, sizeof *counts);
    make_counts(counts, n, pat);
    size_t total = prefix(counts, n), off = prefix(counts, rank), mine = counts[rank];
    for (int d = 0; d < N_DTS; d++) {
        for (int o = 0; o < N_OPS; o++) {
            loco_comm_dtype dt = all_dts[d];
            loco_comm_op op = all_ops[o];
            void *send = alloc_elems(total, dt);
            for (size_t g = 0; g < total; g++)
                put(send, dt, g, fval(dt, rank, g));
            /* An empty block may come with a NULL receive buffer. */
            void *recv = in_place ? send : mine ? alloc_elems(mine, dt) : NULL;
            loco_comm_req *req = NULL;
            if (nb) {
                CHECK_OK(loco_comm_ireduce_scatter(c, send, recv, counts, dt, op, &req));
                finish(req);
            } else {
                CHECK_OK(loco_comm_reduce_scatter(c, send, recv, counts, dt, op));
            }
            size_t bad = 0, first = 0;
            for (size_t k = 0; k < mine; k++) {
                if (get(recv, dt, k) != expect_reduce(dt, op, n, off + k) && bad++ == 0)
                    first = k;
            }
            CHECK(bad == 0, "%s: %sreduce_scatter%s %s %s %s: %zu wrong, first [%zu] = %g want %g",
                  where, nb ? "i" : "", in_place ? " in place" : "", pat_names[pat],
                  loco_comm_dtype_name(dt), loco_comm_op_name(op), bad, first,
                  bad ? get(recv, dt, first) : 0.0,
                  bad ? expect_reduce(dt, op, n, off + first) : 0.0);
            if (!in_place)
                free(recv);
            free(send);
        }
    }
    free(counts);
}

/* -------------------------------------------------------------- allgather */

static void check_allgather(loco_comm *c, const char *where, int pat, bool nb, bool in_place) {
    int rank = loco_comm_rank(c), n = loco_comm_size(c);
    size_t *counts = calloc((size_t)n, sizeof *counts);
    make_counts(counts, n, pat);
    size_t total = prefix(counts, n), off = prefix(counts, rank), mine = counts[rank];
    for (int d = 0; d < N_DTS; d++) {
        loco_comm_dtype dt = all_dts[d];
        size_t sz = loco_comm_dtype_size(dt);
        void *recv = alloc_elems(total, dt);
        memset(recv, 0xA5, total * sz);
        void *send;
        if (in_place) {
            send = (char *)recv + off * sz;
        } else {
            send = mine ? alloc_elems(mine, dt) : NULL;
        }
        for (size_t k = 0; k < mine; k++)
            put(send, dt, k, fval(dt, rank, off + k));
        loco_comm_req *req = NULL;
        if (nb) {
            CHECK_OK(loco_comm_iallgather(c, send, recv, counts, dt, &req));
            finish(req);
        } else {
            CHECK_OK(loco_comm_allgather(c, send, recv, counts, dt));
        }
        size_t bad = 0, first = 0;
        for (int j = 0, g = 0; j < n; j++) {
            for (size_t k = 0; k < counts[j]; k++, g++) {
                if (get(recv, dt, (size_t)g) != fval(dt, j, (size_t)g) && bad++ == 0)
                    first = (size_t)g;
            }
        }
        CHECK(bad == 0, "%s: %sallgather%s %s %s: %zu wrong, first [%zu] = %g", where,
              nb ? "i" : "", in_place ? " in place" : "", pat_names[pat], loco_comm_dtype_name(dt),
              bad, first, bad ? get(recv, dt, first) : 0.0);
        if (!in_place)
            free(send);
        free(recv);
    }
    free(counts);
}

/* -------------------------------------------------------------- broadcast */

static void check_broadcast(loco_comm *c, const char *where, size_t count, bool nb) {
    int rank = loco_comm_rank(c), n = loco_comm_size(c);
    for (int root = 0; root < n; root++) {
        for (int d = 0; d < N_DTS; d++) {
            loco_comm_dtype dt = all_dts[d];
            void *buf = alloc_elems(count, dt);
            for (size_t i = 0; i < count; i++)
                put(buf, dt, i, rank == root ? fval(dt, root, i) : fval(dt, rank, i + 1));
            if (nb) {
                loco_comm_req *req = NULL;
                CHECK_OK(loco_comm_ibroadcast(c, buf, count, dt, root, &req));
                /* Poll with test until done, then wait returns at once. */
                bool done = false;
                int trc = 0;
                while (!done && trc == 0)
                    trc = loco_comm_test(req, &done);
                CHECK(trc == 0, "loco_comm_test: %s", loco_errmsg());
                finish(req);
            } else {
                CHECK_OK(loco_comm_broadcast(c, buf, count, dt, root));
            }
            size_t bad = 0;
            for (size_t i = 0; i < count; i++)
                bad += get(buf, dt, i) != fval(dt, root, i);
            CHECK(bad == 0, "%s: %sbroadcast root %d %s count %zu: %zu wrong", where, nb ? "i" : "",
                  root, loco_comm_dtype_name(dt), count, bad);
            free(buf);
        }
    }
}

/* -------------------------------------------------------------- alltoallv */

/* Elements rank r sends to rank j (uneven, some empty). */
static size_t a2a_count(int r, int j) {
    return (size_t)((r + 2 * j) % 4) * 3;
}
/* Value of the k-th element r sends to j: fits every dtype. */
static double a2a_val(int r, int j, size_t k) {
    return (double)((r * 31 + j * 7 + (int)k) % 127);
}

static void check_alltoallv(loco_comm *c, const char *where, bool nb, bool equal) {
    int rank = loco_comm_rank(c), n = loco_comm_size(c);
    size_t *sc = calloc((size_t)n, sizeof *sc), *rc = calloc((size_t)n, sizeof *rc);
    const size_t eq = 5;
    for (int j = 0; j < n; j++) {
        sc[j] = equal ? eq : a2a_count(rank, j);
        rc[j] = equal ? eq : a2a_count(j, rank);
    }
    size_t stotal = prefix(sc, n), rtotal = prefix(rc, n);
    for (int d = 0; d < N_DTS; d++) {
        loco_comm_dtype dt = all_dts[d];
        void *send = alloc_elems(stotal, dt), *recv = alloc_elems(rtotal, dt);
        for (int j = 0, g = 0; j < n; j++)
            for (size_t k = 0; k < sc[j]; k++, g++)
                put(send, dt, (size_t)g, a2a_val(rank, j, k));
        loco_comm_req *req = NULL;
        if (equal && nb)
            CHECK_OK(loco_comm_ialltoall(c, send, recv, eq, dt, &req));
        else if (equal)
            CHECK_OK(loco_comm_alltoall(c, send, recv, eq, dt));
        else if (nb)
            CHECK_OK(loco_comm_ialltoallv(c, send, sc, recv, rc, dt, &req));
        else
            CHECK_OK(loco_comm_alltoallv(c, send, sc, recv, rc, dt));
        finish(req);
        size_t bad = 0;
        for (int j = 0, g = 0; j < n; j++)
            for (size_t k = 0; k < rc[j]; k++, g++)
                bad += get(recv, dt, (size_t)g) != a2a_val(j, rank, k);
        CHECK(bad == 0, "%s: %salltoall%s %s: %zu wrong", where, nb ? "i" : "", equal ? "" : "v",
              loco_comm_dtype_name(dt), bad);
        free(send);
        free(recv);
    }
    free(sc);
    free(rc);
}

/* ----------------------------------------------------------- the suite */

/* Every collective on c, blocking and not; also with pieces of 7 elements. */
static void check_collectives(loco_comm *c, const char *where) {
    static const size_t counts[] = {0, 1, 7, 1000, 4099};
    for (int nb = 0; nb < 2; nb++) {
        for (size_t i = 0; i < sizeof counts / sizeof *counts; i++)
            check_allreduce(c, where, counts[i], nb);
        for (int pat = 0; pat < PAT_COUNT; pat++) {
            check_reduce_scatter(c, where, pat, nb, false);
            check_reduce_scatter(c, where, pat, nb, true);
            check_allgather(c, where, pat, nb, false);
            check_allgather(c, where, pat, nb, true);
        }
        check_broadcast(c, where, 0, nb);
        check_broadcast(c, where, 333, nb);
        check_alltoallv(c, where, nb, false);
        check_alltoallv(c, where, nb, true);
        CHECK_OK(loco_comm_barrier(c));
    }
    /* Buffers cut into pieces of 7 elements (the INT_MAX path, small). */
    CHECK_OK(loco_comm_set_chunk(c, 7));
    CHECK(loco_comm_chunk(c) == 7, "chunk %zu", loco_comm_chunk(c));
    char chunked[96];
    snprintf(chunked, sizeof chunked, "%s, pieces of 7", where);
    for (int nb = 0; nb < 2; nb++) {
        check_allreduce(c, chunked, 50, nb);
        check_allreduce(c, chunked, 7, nb);
        check_broadcast(c, chunked, 50, nb);
    }
    CHECK_OK(loco_comm_set_chunk(c, 0));
}

/* Every rank passes a token to the next: blocking (rank 0 sends first, the
 * others receive then send) and non-blocking (all at once), whole and in
 * pieces of 5. */
static void check_ring(loco_comm *c, const char *where) {
    int rank = loco_comm_rank(c), n = loco_comm_size(c);
    int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    enum { COUNT = 23 };
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1)
            CHECK_OK(loco_comm_set_chunk(c, 5));
        double out[COUNT], in[COUNT];
        for (int i = 0; i < COUNT; i++)
            out[i] = rank * 100.0 + i;
        memset(in, 0, sizeof in);
        if (rank == 0) {
            CHECK_OK(loco_comm_send(c, out, COUNT, LOCO_DT_F64, next, 3));
            CHECK_OK(loco_comm_recv(c, in, COUNT, LOCO_DT_F64, prev, 3));
        } else {
            CHECK_OK(loco_comm_recv(c, in, COUNT, LOCO_DT_F64, prev, 3));
            CHECK_OK(loco_comm_send(c, out, COUNT, LOCO_DT_F64, next, 3));
        }
        int bad = 0;
        for (int i = 0; i < COUNT; i++)
            bad += in[i] != prev * 100.0 + i;
        CHECK(bad == 0, "%s: blocking ring (pass %d): %d wrong", where, pass, bad);

        int32_t iout[COUNT], iin[COUNT];
        for (int i = 0; i < COUNT; i++)
            iout[i] = rank * 1000 + i;
        memset(iin, 0, sizeof iin);
        loco_comm_req *reqs[2] = {NULL, NULL};
        CHECK_OK(loco_comm_irecv(c, iin, COUNT, LOCO_DT_I32, prev, 9, &reqs[0]));
        CHECK_OK(loco_comm_isend(c, iout, COUNT, LOCO_DT_I32, next, 9, &reqs[1]));
        CHECK_OK(loco_comm_waitall(reqs, 2));
        CHECK(reqs[0] == NULL && reqs[1] == NULL, "waitall leaves requests behind");
        bad = 0;
        for (int i = 0; i < COUNT; i++)
            bad += iin[i] != prev * 1000 + i;
        CHECK(bad == 0, "%s: non-blocking ring (pass %d): %d wrong", where, pass, bad);
    }
    CHECK_OK(loco_comm_set_chunk(c, 0));
    CHECK_OK(loco_comm_barrier(c));
}

/* color = rank % 2, key = -rank: groups of even and odd ranks, in reverse
 * order; then a group of everyone but rank 0. Collectives on each. */
static void check_split(loco_comm *w) {
    int rank = loco_comm_rank(w), n = loco_comm_size(w);
    loco_comm *sub = NULL;
    CHECK_OK(loco_comm_split(w, rank % 2, -rank, &sub));
    if (!sub)
        return;
    int members = 0, below = 0; /* same parity; of those, higher world ranks */
    for (int r = 0; r < n; r++) {
        if (r % 2 == rank % 2) {
            members++;
            below += r > rank;
        }
    }
    CHECK(loco_comm_size(sub) == members, "split size %d, want %d", loco_comm_size(sub), members);
    CHECK(loco_comm_rank(sub) == below, "split rank %d, want %d", loco_comm_rank(sub), below);
    CHECK(strcmp(loco_comm_backend(sub), "mpi") == 0, "split backend %s", loco_comm_backend(sub));
    char where[64];
    snprintf(where, sizeof where, "split color %d", rank % 2);
    check_collectives(sub, where);
    if (loco_comm_size(sub) > 1)
        check_ring(sub, where);

    /* A split of a split: every rank alone. */
    loco_comm *alone = NULL;
    CHECK_OK(loco_comm_split(sub, loco_comm_rank(sub), 0, &alone));
    CHECK(alone && loco_comm_size(alone) == 1 && loco_comm_rank(alone) == 0,
          "split into singletons");
    if (alone)
        check_allreduce(alone, "singleton", 9, true);
    loco_comm_destroy(alone);
    loco_comm_destroy(sub);

    loco_comm *rest = NULL;
    CHECK_OK(loco_comm_split(w, rank == 0 ? LOCO_COMM_COLOR_NONE : 0, rank, &rest));
    if (rank == 0) {
        CHECK(rest == NULL, "COLOR_NONE gave a communicator");
    } else {
        CHECK(rest && loco_comm_size(rest) == n - 1 && loco_comm_rank(rest) == rank - 1,
              "split without rank 0");
        if (rest)
            check_allreduce(rest, "without rank 0", 100, false);
    }
    loco_comm_destroy(rest);
}

/* Several requests of different kinds in flight at once, and computation
 * overlapping a large iallreduce (polled with test while computing). */
static void check_overlap(loco_comm *c) {
    int rank = loco_comm_rank(c), n = loco_comm_size(c);
    const size_t big = (size_t)1 << 18;
    float *grad = alloc_elems(big, LOCO_DT_F32);
    for (size_t i = 0; i < big; i++)
        grad[i] = (float)fval(LOCO_DT_F32, rank, i);
    size_t *counts = calloc((size_t)n, sizeof *counts);
    make_counts(counts, n, PAT_UNEVEN);
    size_t total = prefix(counts, n), off = prefix(counts, rank);
    double *gathered = alloc_elems(total, LOCO_DT_F64);
    double *mine = alloc_elems(counts[rank], LOCO_DT_F64);
    for (size_t k = 0; k < counts[rank]; k++)
        mine[k] = fval(LOCO_DT_F64, rank, off + k);

    loco_comm_req *reqs[2] = {NULL, NULL};
    CHECK_OK(loco_comm_iallreduce(c, grad, big, LOCO_DT_F32, LOCO_OP_AVG, &reqs[0]));
    CHECK_OK(loco_comm_iallgather(c, mine, gathered, counts, LOCO_DT_F64, &reqs[1]));
    /* Work while the collectives progress. */
    double acc = 0;
    bool done = false;
    int trc = 0;
    for (int step = 0; (step < 200 || !done) && trc == 0; step++) {
        for (int i = 0; i < 2000; i++)
            acc += sin(i * 0.001 + step);
        trc = loco_comm_test(reqs[0], &done);
    }
    CHECK(trc == 0, "loco_comm_test: %s", loco_errmsg());
    CHECK(isfinite(acc), "overlap computation");
    CHECK_OK(loco_comm_waitall(reqs, 2));
    size_t first = 0, bad = mismatches_reduce(grad, LOCO_DT_F32, LOCO_OP_AVG, n, big, &first);
    CHECK(bad == 0, "overlap: iallreduce avg: %zu wrong, first [%zu] = %g want %g", bad, first,
          bad ? grad[first] : 0.0, bad ? expect_reduce(LOCO_DT_F32, LOCO_OP_AVG, n, first) : 0.0);
    bad = 0;
    for (size_t g = 0, j = 0, k = 0; g < total; g++, k++) {
        while (k >= counts[j]) {
            j++;
            k = 0;
        }
        bad += gathered[g] != fval(LOCO_DT_F64, (int)j, g);
    }
    CHECK(bad == 0, "overlap: iallgather: %zu wrong", bad);
    free(grad);
    free(counts);
    free(gathered);
    free(mine);
}

/* Errors every rank detects alike (no collective left half-entered), and
 * MPI's own errors translated into LOCO_EMPI. */
static void check_errors(loco_comm *c) {
    int rank = loco_comm_rank(c), n = loco_comm_size(c);
    float x[8] = {0};
    loco_comm_req *req = (loco_comm_req *)x; /* must come back NULL */
    CHECK_FAILS(loco_comm_broadcast(c, x, 8, LOCO_DT_F32, n), LOCO_EINVAL, "root");
    CHECK_FAILS(loco_comm_ibroadcast(c, x, 8, LOCO_DT_F32, -1, &req), LOCO_EINVAL, "root");
    CHECK(req == NULL, "failed ibroadcast left a request");
    CHECK_FAILS(loco_comm_send(c, x, 8, LOCO_DT_F32, rank, 0), LOCO_EINVAL, "this rank");
    CHECK_FAILS(loco_comm_send(c, x, 8, LOCO_DT_F32, n, 0), LOCO_EINVAL, "peer");
    CHECK_FAILS(loco_comm_recv(c, x, 8, LOCO_DT_F32, (rank + 1) % n, LOCO_COMM_TAG_MAX + 1),
                LOCO_EINVAL, "tag");
    CHECK_FAILS(loco_comm_allreduce(c, x, 8, (loco_comm_dtype)42, LOCO_OP_SUM), LOCO_EINVAL,
                "dtype");
    CHECK_FAILS(loco_comm_set_chunk(c, (size_t)1 << 40), LOCO_EINVAL, "limit");

    /* More than INT_MAX elements in a v-collective: refused before MPI. */
    size_t *counts = calloc((size_t)n, sizeof *counts);
    counts[0] = (size_t)2147483647;
    counts[n - 1] += 1;
    CHECK_FAILS(loco_comm_reduce_scatter(c, x, x + 4, counts, LOCO_DT_U8, LOCO_OP_SUM), LOCO_EINVAL,
                "INT_MAX");
    req = NULL;
    CHECK_FAILS(loco_comm_iallgather(c, x, x + 4, counts, LOCO_DT_U8, &req), LOCO_EINVAL,
                "INT_MAX");
    CHECK(req == NULL, "failed iallgather left a request");
    /* Counts whose sum passes SIZE_MAX. */
    counts[0] = SIZE_MAX;
    counts[n - 1] = 1;
    CHECK_FAILS(loco_comm_allgather(c, x, x + 4, counts, LOCO_DT_U8), LOCO_EINVAL,
                "passes SIZE_MAX");
    free(counts);

    /* A message longer than the receive: MPI_ERR_TRUNCATE as LOCO_EMPI. A
     * shorter one: loco's size check, LOCO_EPROTO. Ranks 0 -> 1. */
    if (rank == 0) {
        CHECK_OK(loco_comm_send(c, x, 6, LOCO_DT_F32, 1, 11));
        CHECK_OK(loco_comm_send(c, x, 2, LOCO_DT_F32, 1, 12));
        CHECK_OK(loco_comm_send(c, x, 2, LOCO_DT_F32, 1, 13));
    } else if (rank == 1) {
        CHECK_FAILS(loco_comm_recv(c, x, 3, LOCO_DT_F32, 0, 11), LOCO_EMPI, "MPI_Recv: ");
        CHECK_FAILS(loco_comm_recv(c, x, 3, LOCO_DT_F32, 0, 12), LOCO_EPROTO, "expected");
        req = NULL;
        CHECK_OK(loco_comm_irecv(c, x, 3, LOCO_DT_F32, 0, 13, &req));
        CHECK_FAILS(loco_comm_wait(req), LOCO_EPROTO, "expected");
    }
    CHECK_OK(loco_comm_barrier(c));
}

int main(void) {
    loco_comm *w = NULL;
    int rc = loco_comm_world(&w, "auto");
    if (rc < 0) {
        fprintf(stderr, "loco_comm_world(auto): %s\n%s\n", loco_strerror(rc), loco_errmsg());
        printf("0 passed, 1 failed\n");
        return 1;
    }
    g_rank = loco_comm_rank(w);
    int n = loco_comm_size(w);
    const char *env = getenv("OMPI_COMM_WORLD_SIZE");
    CHECK(strcmp(loco_comm_backend(w), "mpi") == 0, "auto picked %s under mpirun",
          loco_comm_backend(w));
    CHECK(!env || atoi(env) == n, "size %d, launcher says %s", n, env);
    CHECK(n >= 2, "run me under mpirun -np N, N >= 2 (size %d)", n);
    CHECK(loco_comm_thread_support(w) >= LOCO_COMM_THREAD_FUNNELED, "thread level %d",
          (int)loco_comm_thread_support(w));

    /* A second world and a self communicator beside it. */
    loco_comm *w2 = NULL, *self = NULL;
    CHECK_OK(loco_comm_world(&w2, "mpi"));
    CHECK(w2 && loco_comm_size(w2) == n && loco_comm_rank(w2) == g_rank, "second world");
    if (w2)
        check_allreduce(w2, "second world", 10, false);
    loco_comm_destroy(w2);
    CHECK_OK(loco_comm_world(&self, "self"));
    CHECK(self && loco_comm_size(self) == 1 && loco_comm_rank(self) == 0, "self under mpirun");
    loco_comm_destroy(self);

    if (n >= 2) {
        check_collectives(w, "world");
        check_ring(w, "world");
        check_split(w);
        check_overlap(w);
        check_errors(w);
    }

    int64_t tally[2] = {n_pass, n_fail};
    rc = loco_comm_allreduce(w, tally, 2, LOCO_DT_I64, LOCO_OP_SUM);
    if (rc < 0) {
        fprintf(stderr, "[rank %d] tally: %s\n", g_rank, loco_errmsg());
        tally[0] = n_pass;
        tally[1] = n_fail + 1;
    }
    if (g_rank == 0 || rc < 0)
        printf("%lld passed, %lld failed\n", (long long)tally[0], (long long)tally[1]);
    loco_comm_destroy(w);
    return tally[1] == 0 ? 0 : 1;
}

#endif /* LOCO_MPI_CHECK_MAIN */
