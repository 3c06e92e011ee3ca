/* inner/comm: the self backend (every operation trivially right, split,
 * non-blocking requests), the argument checks every backend shares (bad
 * root, peer, tag, dtype, op, NULL buffers, counts that overflow, failed
 * allocations), and the mpi backend through tests/mpi/mpi_comm_check run
 * under `mpirun -np 3` and `-np 4` (skipped, with the reason, where mpirun
 * is missing). Runs from the repository root. */
#include "inner/comm/comm.h"
#include "tests/support.h"

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MPI_CHECK_BIN "build/tests/mpi_comm_check"

static const loco_comm_dtype all_dts[] = {LOCO_DT_F32, LOCO_DT_F64, LOCO_DT_I32, LOCO_DT_I64,
                                          LOCO_DT_U8};
static const loco_comm_op all_ops[] = {LOCO_OP_SUM, LOCO_OP_AVG, LOCO_OP_MAX};
#define N_DTS (int)(sizeof all_dts / sizeof *all_dts)
#define N_OPS (int)(sizeof all_ops / sizeof *all_ops)

static loco_comm *c;

static void setup(void) {
    loco_err_clear();
    /* Not under a launcher: "auto" must be self. */
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMI_RANK", "PMIX_RANK",
                                       "SLURM_STEP_NUM_TASKS"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++)
        unsetenv(vars[i]);
    cr_assert_eq(loco_comm_world(&c, "self"), 0, "%s", loco_errmsg());
}

static void teardown(void) {
    loco_alloc_fail_after(0);
    loco_comm_destroy(c);
    c = NULL;
}

static void assert_has(const char *msg, const char *part) {
    cr_assert(strstr(msg, part), "message lacks \"%s\":\n%s", part, msg);
}

/* `call` fails with `rc`, leaving `part` in the message. */
#define assert_fails(call, rc, part)                                                               \
    do {                                                                                           \
        loco_err_clear();                                                                          \
        int rc_ = (call);                                                                          \
        cr_assert_eq(rc_, (rc), "%s -> %s, wanted %s\n%s", #call, loco_strerror(rc_),              \
                     loco_strerror(rc), loco_errmsg());                                            \
        assert_has(loco_errmsg(), (part));                                                         \
    } while (0)

/* n bytes of a recognisable pattern. */
static void fill(void *buf, size_t n, unsigned seed) {
    unsigned char *p = buf;
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)(seed + i * 37u);
}

/* ============================================================ self backend */

TestSuite(comm_self, .init = setup, .fini = teardown);

Test(comm_self, world_is_one_rank) {
    cr_assert_eq(loco_comm_rank(c), 0);
    cr_assert_eq(loco_comm_size(c), 1);
    cr_assert_str_eq(loco_comm_backend(c), "self");
    cr_assert_geq(loco_comm_thread_support(c), LOCO_COMM_THREAD_SERIALIZED);
    cr_assert_eq(loco_comm_chunk(c), SIZE_MAX);
}

Test(comm_self, auto_without_a_launcher_is_self) {
    loco_comm *a = NULL, *b = NULL;
    cr_assert_eq(loco_comm_world(&a, "auto"), 0, "%s", loco_errmsg());
    cr_assert_str_eq(loco_comm_backend(a), "self");
    cr_assert_eq(loco_comm_world(&b, NULL), 0, "%s", loco_errmsg());
    cr_assert_str_eq(loco_comm_backend(b), "self");
    cr_assert_eq(loco_comm_size(b), 1);
    loco_comm_destroy(a);
    loco_comm_destroy(b);
}

Test(comm_self, unknown_and_unbuilt_backends) {
    loco_comm *x = (loco_comm *)&x;
    assert_fails(loco_comm_world(&x, "gloo"), LOCO_EINVAL, "unknown backend \"gloo\"");
    cr_assert_null(x);
#ifndef LOCO_HAVE_NCCL /* with NCCL built, tests/gpu/test_nccl.c has it */
    assert_fails(loco_comm_world(&x, "nccl"), LOCO_ENOTSUP, "nccl");
    cr_assert_null(x);
#endif
    assert_fails(loco_comm_world(NULL, "self"), LOCO_EINVAL, "out is NULL");
}

Test(comm_self, dtypes_and_ops_have_names_and_sizes) {
    static const size_t sizes[] = {4, 8, 4, 8, 1};
    static const char *const names[] = {"f32", "f64", "i32", "i64", "u8"};
    for (int d = 0; d < N_DTS; d++) {
        cr_assert_eq(loco_comm_dtype_size(all_dts[d]), sizes[d]);
        cr_assert_str_eq(loco_comm_dtype_name(all_dts[d]), names[d]);
    }
    cr_assert_eq(loco_comm_dtype_size((loco_comm_dtype)99), 0);
    cr_assert_str_eq(loco_comm_dtype_name((loco_comm_dtype)-1), "?");
    cr_assert_str_eq(loco_comm_op_name(LOCO_OP_AVG), "avg");
    cr_assert_str_eq(loco_comm_op_name((loco_comm_op)7), "?");
}

/* One rank: sum, avg and max of one buffer are the buffer, bit for bit. */
Test(comm_self, allreduce_is_identity) {
    unsigned char buf[8 * 37], ref[sizeof buf];
    for (int d = 0; d < N_DTS; d++) {
        for (int o = 0; o < N_OPS; o++) {
            fill(buf, sizeof buf, (unsigned)(d * 3 + o));
            memcpy(ref, buf, sizeof buf);
            size_t count = sizeof buf / loco_comm_dtype_size(all_dts[d]);
            cr_assert_eq(loco_comm_allreduce(c, buf, count, all_dts[d], all_ops[o]), 0, "%s",
                         loco_errmsg());
            cr_assert_arr_eq(buf, ref, sizeof buf);
            loco_comm_req *req = NULL;
            cr_assert_eq(loco_comm_iallreduce(c, buf, count, all_dts[d], all_ops[o], &req), 0);
            cr_assert_not_null(req);
            cr_assert_eq(loco_comm_wait(req), 0);
            cr_assert_arr_eq(buf, ref, sizeof buf);
        }
    }
    /* Nothing to reduce: a NULL buffer is fine. */
    cr_assert_eq(loco_comm_allreduce(c, NULL, 0, LOCO_DT_F32, LOCO_OP_AVG), 0);
}

Test(comm_self, reduce_scatter_and_allgather_copy) {
    float send[13], recv[13];
    const size_t counts[1] = {13};
    for (int o = 0; o < N_OPS; o++) {
        fill(send, sizeof send, (unsigned)o);
        memset(recv, 0, sizeof recv);
        cr_assert_eq(loco_comm_reduce_scatter(c, send, recv, counts, LOCO_DT_F32, all_ops[o]), 0);
        cr_assert_arr_eq(recv, send, sizeof send);
    }
    memset(recv, 0, sizeof recv);
    cr_assert_eq(loco_comm_allgather(c, send, recv, counts, LOCO_DT_F32), 0);
    cr_assert_arr_eq(recv, send, sizeof send);

    /* In place: send == recv is the caller's own block. */
    memcpy(recv, send, sizeof send);
    cr_assert_eq(loco_comm_reduce_scatter(c, recv, recv, counts, LOCO_DT_F32, LOCO_OP_AVG), 0);
    cr_assert_eq(loco_comm_allgather(c, recv, recv, counts, LOCO_DT_F32), 0);
    cr_assert_arr_eq(recv, send, sizeof send);

    /* Empty blocks with NULL buffers. */
    const size_t zero[1] = {0};
    cr_assert_eq(loco_comm_reduce_scatter(c, NULL, NULL, zero, LOCO_DT_I64, LOCO_OP_MAX), 0);
    cr_assert_eq(loco_comm_allgather(c, NULL, NULL, zero, LOCO_DT_U8), 0);
}

Test(comm_self, broadcast_alltoall_barrier) {
    int64_t buf[9], ref[9];
    fill(buf, sizeof buf, 5);
    memcpy(ref, buf, sizeof buf);
    cr_assert_eq(loco_comm_broadcast(c, buf, 9, LOCO_DT_I64, 0), 0);
    cr_assert_arr_eq(buf, ref, sizeof buf);

    int64_t out[9] = {0};
    const size_t n9[1] = {9};
    cr_assert_eq(loco_comm_alltoallv(c, buf, n9, out, n9, LOCO_DT_I64), 0);
    cr_assert_arr_eq(out, buf, sizeof buf);
    memset(out, 0, sizeof out);
    cr_assert_eq(loco_comm_alltoall(c, buf, out, 9, LOCO_DT_I64), 0);
    cr_assert_arr_eq(out, buf, sizeof buf);
    cr_assert_eq(loco_comm_barrier(c), 0);

    /* What rank 0 sends itself must be what it expects. */
    const size_t n8[1] = {8};
    assert_fails(loco_comm_alltoallv(c, buf, n9, out, n8, LOCO_DT_I64), LOCO_EINVAL,
                 "sends 9 elements to itself but expects 8");
}

Test(comm_self, nonblocking_requests_complete) {
    double a[5], b[5];
    fill(a, sizeof a, 1);
    const size_t n5[1] = {5};
    loco_comm_req *reqs[6] = {NULL};
    cr_assert_eq(loco_comm_ireduce_scatter(c, a, b, n5, LOCO_DT_F64, LOCO_OP_SUM, &reqs[0]), 0);
    cr_assert_arr_eq(b, a, sizeof a);
    cr_assert_eq(loco_comm_iallgather(c, a, b, n5, LOCO_DT_F64, &reqs[1]), 0);
    cr_assert_eq(loco_comm_ibroadcast(c, a, 5, LOCO_DT_F64, 0, &reqs[2]), 0);
    cr_assert_eq(loco_comm_ialltoallv(c, a, n5, b, n5, LOCO_DT_F64, &reqs[3]), 0);
    cr_assert_eq(loco_comm_ialltoall(c, a, b, 5, LOCO_DT_F64, &reqs[4]), 0);
    /* reqs[5] stays NULL: waitall skips it. */
    for (int i = 0; i < 5; i++) {
        cr_assert_not_null(reqs[i], "request %d", i);
        bool done = false;
        cr_assert_eq(loco_comm_test(reqs[i], &done), 0);
        cr_assert(done);
    }
    cr_assert_eq(loco_comm_waitall(reqs, 6), 0);
    for (int i = 0; i < 6; i++)
        cr_assert_null(reqs[i]);
    cr_assert_arr_eq(b, a, sizeof a);
    cr_assert_eq(loco_comm_wait(NULL), 0);
    cr_assert_eq(loco_comm_waitall(NULL, 0), 0);
    bool done = false;
    cr_assert_eq(loco_comm_test(NULL, &done), 0);
    cr_assert(done);
}

Test(comm_self, split_makes_new_self_comms) {
    loco_comm *s = NULL, *t = NULL, *none = (loco_comm *)&none;
    cr_assert_eq(loco_comm_split(c, 5, 0, &s), 0, "%s", loco_errmsg());
    cr_assert_not_null(s);
    cr_assert_neq(s, c);
    cr_assert_str_eq(loco_comm_backend(s), "self");
    cr_assert_eq(loco_comm_size(s), 1);
    cr_assert_eq(loco_comm_split(s, 0, 3, &t), 0);
    cr_assert_not_null(t);
    loco_comm_destroy(t);
    cr_assert_eq(loco_comm_split(c, LOCO_COMM_COLOR_NONE, 0, &none), 0);
    cr_assert_null(none);
    assert_fails(loco_comm_split(c, -5, 0, &t), LOCO_EINVAL, "color -5");
    cr_assert_null(t);
    /* The parent goes first; the split lives on. */
    loco_comm_destroy(c);
    c = NULL;
    float x[3] = {1, 2, 3};
    cr_assert_eq(loco_comm_allreduce(s, x, 3, LOCO_DT_F32, LOCO_OP_SUM), 0);
    loco_comm_destroy(s);
    loco_comm_destroy(NULL);
}

Test(comm_self, self_has_no_peers) {
    float x[4] = {0};
    loco_comm_req *req = (loco_comm_req *)&req;
    assert_fails(loco_comm_send(c, x, 4, LOCO_DT_F32, 0, 0), LOCO_EINVAL, "no peers");
    assert_fails(loco_comm_recv(c, x, 4, LOCO_DT_F32, 0, 0), LOCO_EINVAL, "no peers");
    assert_fails(loco_comm_isend(c, x, 4, LOCO_DT_F32, 1, 0, &req), LOCO_EINVAL, "no peers");
    cr_assert_null(req);
    assert_fails(loco_comm_irecv(c, x, 4, LOCO_DT_F32, 0, 0, &req), LOCO_EINVAL, "no peers");
    cr_assert_null(req);
}

Test(comm_self, chunk_is_a_setting) {
    cr_assert_eq(loco_comm_set_chunk(c, 3), 0);
    cr_assert_eq(loco_comm_chunk(c), 3);
    float x[10] = {1};
    cr_assert_eq(loco_comm_allreduce(c, x, 10, LOCO_DT_F32, LOCO_OP_SUM), 0);
    cr_assert_eq(loco_comm_set_chunk(c, 0), 0);
    cr_assert_eq(loco_comm_chunk(c), SIZE_MAX);
}

/* ========================================================== argument errors */

TestSuite(comm_errors, .init = setup, .fini = teardown);

Test(comm_errors, bad_root) {
    float x[4] = {0};
    loco_comm_req *req = (loco_comm_req *)&req;
    assert_fails(loco_comm_broadcast(c, x, 4, LOCO_DT_F32, 1), LOCO_EINVAL,
                 "root 1 outside the communicator's 1 ranks");
    assert_fails(loco_comm_ibroadcast(c, x, 4, LOCO_DT_F32, -1, &req), LOCO_EINVAL, "root -1");
    cr_assert_null(req);
}

Test(comm_errors, bad_peer) {
    loco_comm *s = NULL;
    cr_assert_eq(loco_comm_world(&s, "self"), 0);
    float x[4] = {0};
    /* Every peer of a one-rank communicator is bad, whatever its number. */
    static const int peers[] = {-1, 0, 1, 1000};
    for (size_t i = 0; i < sizeof peers / sizeof *peers; i++)
        assert_fails(loco_comm_send(s, x, 4, LOCO_DT_F32, peers[i], 1), LOCO_EINVAL, "one rank");
    loco_comm_destroy(s);
}

Test(comm_errors, bad_dtype_op_and_buffers) {
    float x[4] = {0};
    const size_t n4[1] = {4};
    assert_fails(loco_comm_allreduce(c, x, 4, (loco_comm_dtype)LOCO_DT_COUNT, LOCO_OP_SUM),
                 LOCO_EINVAL, "unknown dtype 5");
    assert_fails(loco_comm_allreduce(c, x, 4, LOCO_DT_F32, (loco_comm_op)-2), LOCO_EINVAL,
                 "unknown reduction op -2");
    assert_fails(loco_comm_allreduce(c, NULL, 4, LOCO_DT_F32, LOCO_OP_SUM), LOCO_EINVAL,
                 "buf is NULL with 4 elements");
    assert_fails(loco_comm_reduce_scatter(c, x, NULL, n4, LOCO_DT_F32, LOCO_OP_SUM), LOCO_EINVAL,
                 "recv is NULL");
    assert_fails(loco_comm_reduce_scatter(c, x, x, NULL, LOCO_DT_F32, LOCO_OP_SUM), LOCO_EINVAL,
                 "counts array is NULL");
    assert_fails(loco_comm_allgather(c, NULL, x, n4, LOCO_DT_F32), LOCO_EINVAL, "send is NULL");
    assert_fails(loco_comm_alltoallv(c, x, n4, x, NULL, LOCO_DT_F32), LOCO_EINVAL,
                 "recvcounts array is NULL");
    assert_fails(loco_comm_allreduce(NULL, x, 4, LOCO_DT_F32, LOCO_OP_SUM), LOCO_EINVAL,
                 "communicator is NULL");
    assert_fails(loco_comm_iallreduce(c, x, 4, LOCO_DT_F32, LOCO_OP_SUM, NULL), LOCO_EINVAL,
                 "req is NULL");
    assert_fails(loco_comm_barrier(NULL), LOCO_EINVAL, "communicator is NULL");
    loco_comm *out = (loco_comm *)&out;
    assert_fails(loco_comm_split(NULL, 0, 0, &out), LOCO_EINVAL, "communicator is NULL");
    cr_assert_null(out);
    assert_fails(loco_comm_test(NULL, NULL), LOCO_EINVAL, "done is NULL");
}

Test(comm_errors, counts_overflow) {
    float x[4] = {0};
    loco_comm_req *req = (loco_comm_req *)&req;
    /* Element counts whose byte size passes SIZE_MAX. */
    assert_fails(loco_comm_allreduce(c, x, SIZE_MAX / 2, LOCO_DT_F32, LOCO_OP_SUM), LOCO_EINVAL,
                 "overflows the address space");
    assert_fails(loco_comm_iallreduce(c, x, SIZE_MAX / 4 + 1, LOCO_DT_F32, LOCO_OP_SUM, &req),
                 LOCO_EINVAL, "overflows the address space");
    cr_assert_null(req);
    /* SIZE_MAX bytes is a size, not an overflow (nothing moves on self). */
    cr_assert_eq(loco_comm_broadcast(c, x, SIZE_MAX, LOCO_DT_U8, 0), 0, "%s", loco_errmsg());
    const size_t huge[1] = {SIZE_MAX / 8 + 1};
    assert_fails(loco_comm_reduce_scatter(c, x, x, huge, LOCO_DT_F64, LOCO_OP_SUM), LOCO_EINVAL,
                 "counts total");
    assert_fails(loco_comm_allgather(c, x, x, huge, LOCO_DT_I64), LOCO_EINVAL, "counts total");
    assert_fails(loco_comm_alltoall(c, x, x, SIZE_MAX / 2, LOCO_DT_I32), LOCO_EINVAL, "overflows");
    const size_t big[1] = {SIZE_MAX / 2 + 1};
    assert_fails(loco_comm_alltoallv(c, x, big, x, big, LOCO_DT_I32), LOCO_EINVAL,
                 "sendcounts total");
}

Test(comm_errors, failed_allocations) {
    loco_comm *x = (loco_comm *)&x;
    for (long n = 1; n <= 2; n++) {
        loco_alloc_fail_after(n);
        assert_fails(loco_comm_world(&x, "self"), LOCO_ENOMEM, "no memory");
        cr_assert_null(x);
    }
    loco_alloc_fail_after(1);
    assert_fails(loco_comm_split(c, 0, 0, &x), LOCO_ENOMEM, "no memory");
    cr_assert_null(x);
    float f[2] = {0};
    loco_comm_req *req = (loco_comm_req *)&req;
    loco_alloc_fail_after(1);
    assert_fails(loco_comm_iallreduce(c, f, 2, LOCO_DT_F32, LOCO_OP_SUM, &req), LOCO_ENOMEM,
                 "no memory for a request");
    cr_assert_null(req);
    loco_alloc_fail_after(0);
}

/* =================================================== mpi under mpirun */

/* Whether `prog` is an executable on PATH. */
static bool on_path(const char *prog) {
    const char *path = getenv("PATH");
    if (!path)
        return false;
    char *dirs = strdup(path), *save = NULL;
    bool found = false;
    for (char *d = strtok_r(dirs, ":", &save); d && !found; d = strtok_r(NULL, ":", &save)) {
        char full[1024];
        snprintf(full, sizeof full, "%s/%s", *d ? d : ".", prog);
        found = access(full, X_OK) == 0;
    }
    free(dirs);
    return found;
}

/* Runs the check under mpirun with np ranks; asserts exit status 0 (a
 * hung rank fails the test at the harness's deadline, with the output). */
static void run_mpi_check(int np) {
    if (!on_path("mpirun"))
        cr_skip_test("mpirun not found on PATH: the mpi backend is not exercised "
                     "(apt install openmpi-bin libopenmpi-dev)");
    struct stat st;
    cr_assert(stat(MPI_CHECK_BIN, &st) == 0,
              MPI_CHECK_BIN " is missing: build it with `make " MPI_CHECK_BIN "`");
    char *sessions = test_tmpdir("loco-mpi");
    test_mpi_session_dir(sessions);
    /* the last part of the output: the tally, and what failed */
    static char out[16384];
    const int rc = test_run_tail(
        out, sizeof out, "mpirun --allow-run-as-root --oversubscribe -np %d " MPI_CHECK_BIN, np);
    loco_rmtree(sessions);
    free(sessions);
    cr_assert_eq(rc, 0, "mpirun -np %d " MPI_CHECK_BIN " exited with status %d:\n%s", np, rc, out);
    cr_assert(strstr(out, " passed, 0 failed"), "no tally from the check:\n%s", out);
}

Test(comm_mpi, check_under_mpirun_np3, .timeout = 90) {
    run_mpi_check(3);
}

Test(comm_mpi, check_under_mpirun_np4, .timeout = 90) {
    run_mpi_check(4);
}
