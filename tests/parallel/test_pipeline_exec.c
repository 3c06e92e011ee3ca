/* The pipeline executor (inner/parallel/pipeline.c): its refusals on one
 * process (tags that do not fit LOCO_COMM_TAG_MAX, a schedule the
 * simulator refuses, a communicator of the wrong size), and every
 * schedule run with data-flow checks and injected failures by
 * tests/mpi/pipeline_exec_check under `mpirun -np 2` and `-np 4` (skipped,
 * with the reason, where mpirun is missing). Runs from the repository
 * root. */
#include "inner/parallel/parallel.h"
#include "tests/support.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define PP_CHECK_BIN "build/tests/pipeline_exec_check"

static loco_comm *self;
static char *sessions;

static void setup(void) {
    loco_err_clear();
    sessions = test_tmpdir("loco-ppx");
    test_mpi_session_dir(sessions);
    cr_assert_eq(loco_comm_world(&self, "self"), 0, "%s", loco_errmsg());
}

static void teardown(void) {
    loco_comm_destroy(self);
    loco_rmtree(sessions);
    free(sessions);
}

TestSuite(pipeline_exec, .init = setup, .fini = teardown, .timeout = 60);

static void assert_refused(const loco_pp_schedule *s, const char *part) {
    loco_pp_exec *e = NULL;
    loco_err_clear();
    const int rc = loco_pp_exec_create(&e, s, self, 16);
    cr_assert_eq(rc, LOCO_EINVAL, "%s: %s", loco_strerror(rc), loco_errmsg());
    cr_assert_null(e);
    cr_assert(strstr(loco_errmsg(), part), "message lacks \"%s\":\n%s", part, loco_errmsg());
}

/* Tags are 2 (mb * chunks + chunk) + kind: gpipe at p = 2 fits 8192
 * micro-batches (top tag 32767), not 8193. */
Test(pipeline_exec, refuses_tags_that_do_not_fit) {
    loco_pp_schedule *s;
    cr_assert_eq(loco_pp_schedule_create(&s, "gpipe", 2, 1, 8193), 0, "%s", loco_errmsg());
    assert_refused(s, "needs message tags up to 32771");
    cr_assert(strstr(loco_errmsg(), "LOCO_COMM_TAG_MAX = 32767: at most 8192 micro-batches"), "%s",
              loco_errmsg());
    loco_pp_schedule_destroy(s);
    /* One fewer fits; what is refused then is the one-rank communicator. */
    cr_assert_eq(loco_pp_schedule_create(&s, "gpipe", 2, 1, 8192), 0, "%s", loco_errmsg());
    assert_refused(s, "schedule gpipe has 2 ranks, the pp communicator 1");
    loco_pp_schedule_destroy(s);
}

/* 1f1b at p = 2, m = 2 without rank 0's send of (mb 1, chunk 0). */
Test(pipeline_exec, refuses_a_schedule_the_simulator_refuses) {
    loco_pp_schedule *g;
    cr_assert_eq(loco_pp_schedule_create(&g, "1f1b", 2, 1, 2), 0, "%s", loco_errmsg());
    const loco_pp_action *lists[2];
    loco_pp_action cut[64];
    int lens[2], chunk_rank[2] = {0, 1}, k = 0;
    lists[0] = loco_pp_rank_actions(g, 0, &lens[0]);
    lists[1] = loco_pp_rank_actions(g, 1, &lens[1]);
    cr_assert_lt(lens[0], 64);
    for (int i = 0; i < lens[0]; i++)
        if (!(lists[0][i].op == LOCO_PP_SEND && lists[0][i].mb == 1))
            cut[k++] = lists[0][i];
    lists[0] = cut, lens[0] = k;
    loco_pp_schedule *s;
    cr_assert_eq(loco_pp_schedule_from_lists(&s, "cut", 2, 1, 2, chunk_rank, lists, lens), 0);
    assert_refused(s, "has no matching SEND");
    loco_pp_schedule_destroy(s);
    loco_pp_schedule_destroy(g);
}

/* Runs the check under mpirun with np ranks; asserts its tally. */
static void run_check(int np) {
    if (!test_have_mpirun())
        cr_skip_test("mpirun not found on PATH: the executor is not exercised "
                     "(apt-get install openmpi-bin libopenmpi-dev)");
    struct stat st;
    cr_assert(stat(PP_CHECK_BIN, &st) == 0,
              PP_CHECK_BIN " is missing: build it with `make " PP_CHECK_BIN "`");
    static char out[1 << 16];
    /* timeout: a hung rank fails the test instead of the suite. */
    const int rc = test_run(
        out, sizeof out,
        "timeout -k 5 45 mpirun --allow-run-as-root --oversubscribe -np %d " PP_CHECK_BIN, np);
    cr_assert_eq(rc, 0, "mpirun -np %d " PP_CHECK_BIN " exited with %d:\n%s", np, rc, out);
    cr_assert(strstr(out, " passed, 0 failed"), "no tally from the check:\n%s", out);
}

Test(pipeline_exec, every_schedule_under_mpirun_np2) {
    run_check(2);
}

Test(pipeline_exec, every_schedule_under_mpirun_np4) {
    run_check(4);
}
