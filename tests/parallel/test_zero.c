/* Data parallelism and ZeRO 0-3 under mpirun against one rank with the same
 * global batch: the same losses and final parameters within 1e-5, sharded
 * checkpoints that reshard (dp=4 -> dp=2) and continue the same curve, and
 * clear errors for meshes that cannot be built. Runs build/loco. */
#include "inner/model/model.h"
#include "tests/support.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* The loco of the build under test (make asan sets LOCO_BIN). */
#define LOCO "\"${LOCO_BIN:-build/loco}\""
/* Leak checking stays off in the ranks under `make asan`: MPI's dlopen'd
 * components keep allocations until exit that LeakSanitizer cannot name. */
#define MPIRUN "mpirun --allow-run-as-root --oversubscribe -x ASAN_OPTIONS=detect_leaks=0 -np "
#define STEPS 20
/* A small model; the global batch is 8 sequences of 32 tokens in two
 * micro-batches of accumulation. */
#define SMALL                                                                                      \
    " --set model.n_layer=2 --set model.n_head=2 --set model.n_embd=32 --set model.seq_len=32"    \
    " --set train.steps=20 --set train.warmup_steps=5 --set train.grad_accum=2"                    \
    " --set run.threads=1 --set run.eval_every=0 --set run.log_every=100"                          \
    " --set parallel.bucket_mb=0.02"

static char *dir;

static void setup(void) {
    dir = strdup("/tmp/loco-zero-XXXXXX");
    cr_assert(mkdtemp(dir));
    test_mpi_session_dir(dir);
}

static void teardown(void) {
    loco_rmtree(dir);
    free(dir);
}

/* One rank with the whole global batch: the reference. */
static void reference(double *loss, char *ckpt, size_t cap) {
    static char out[1 << 16];
    int rc = test_run(out, sizeof out,
                 LOCO " train configs/tiny.ini" SMALL " --set train.batch_size=4 --set run.dir=%s/ref",
                 dir);
    cr_assert_eq(rc, 0, "%s", out);
    char run_dir[600];
    snprintf(run_dir, sizeof run_dir, "%s/ref", dir);
    test_read_losses(run_dir, loss, STEPS);
    snprintf(ckpt, cap, "%s/ref/ckpt_%08d", dir, STEPS);
}

static void check_dp(int dp, int stage) {
    if (!test_have_mpirun())
        cr_skip_test("mpirun not found (apt-get install openmpi-bin)");
    static char out[1 << 16];
    double ref[STEPS + 1], got[STEPS + 1];
    char ref_ckpt[600];
    reference(ref, ref_ckpt, sizeof ref_ckpt);
    int rc = test_run(out, sizeof out,
                 MPIRUN "%d " LOCO " train configs/tiny.ini" SMALL
                        " --set train.batch_size=%d --set parallel.dp=%d"
                        " --set parallel.zero_stage=%d --set run.dir=%s/dp",
                 dp, 4 / dp, dp, stage, dir);
    cr_assert_eq(rc, 0, "%s", out);
    cr_expect(strstr(out, "(mpi, dp=") != NULL, "%s", out);
    char run_dir[600];
    snprintf(run_dir, sizeof run_dir, "%s/dp", dir);
    test_read_losses(run_dir, got, STEPS);
    char what[64];
    snprintf(what, sizeof what, "dp=%d ZeRO-%d", dp, stage);
    test_expect_losses(got, ref, 1, STEPS, what);
    /* The sharded checkpoint, consolidated, holds the same parameters. */
    rc = test_run(out, sizeof out, LOCO " ckpt export %s/dp/ckpt_%08d %s/export", dir, STEPS, dir);
    cr_assert_eq(rc, 0, "%s", out);
    char exp_dir[600];
    snprintf(exp_dir, sizeof exp_dir, "%s/export", dir);
    const loco_gpt_config mc = {
        .n_layer = 2, .n_head = 2, .n_embd = 32, .seq_len = 32, .vocab_size = 256};
    double l2, d;
    test_model_diff(&mc, exp_dir, ref_ckpt, &l2, &d);
    cr_expect(d <= 1e-5, "dp=%d ZeRO-%d: final parameters differ by %g (relative)", dp, stage, d);
}

TestSuite(zero, .init = setup, .fini = teardown, .timeout = 120);

Test(zero, dp2_stage0) { check_dp(2, 0); }
Test(zero, dp2_stage1) { check_dp(2, 1); }
Test(zero, dp2_stage2) { check_dp(2, 2); }
Test(zero, dp2_stage3) { check_dp(2, 3); }
Test(zero, dp4_stage0) { check_dp(4, 0); }
Test(zero, dp4_stage1) { check_dp(4, 1); }
Test(zero, dp4_stage2) { check_dp(4, 2); }
Test(zero, dp4_stage3) { check_dp(4, 3); }

Test(zero, reshard_dp4_to_dp2_continues_the_curve) {
    if (!test_have_mpirun())
        cr_skip_test("mpirun not found (apt-get install openmpi-bin)");
    static char out[1 << 16];
    double ref[STEPS + 1], got[STEPS + 1];
    char ref_ckpt[600];
    reference(ref, ref_ckpt, sizeof ref_ckpt);
    int rc = test_run(out, sizeof out,
                 MPIRUN "4 " LOCO " train configs/tiny.ini" SMALL
                        " --set train.batch_size=1 --set parallel.dp=4 --set parallel.zero_stage=3"
                        " --set train.steps=20 --set run.ckpt_every=10 --set run.dir=%s/a",
                 dir);
    cr_assert_eq(rc, 0, "%s", out);
    rc = test_run(out, sizeof out,
             MPIRUN "2 " LOCO " train configs/tiny.ini" SMALL
                    " --set train.batch_size=2 --set parallel.dp=2 --set parallel.zero_stage=1"
                    " --set run.dir=%s/b --resume %s/a/ckpt_00000010",
             dir, dir);
    cr_assert_eq(rc, 0, "%s", out);
    char run_dir[600];
    snprintf(run_dir, sizeof run_dir, "%s/b", dir);
    test_read_losses(run_dir, got, STEPS);
    test_expect_losses(got, ref, 11, STEPS, "after reshard");
    /* And a sharded checkpoint resumes on a single rank too. */
    rc = test_run(out, sizeof out,
             LOCO " train configs/tiny.ini" SMALL " --set train.batch_size=4 --set run.dir=%s/c"
                  " --resume %s/a/ckpt_00000010",
             dir, dir);
    cr_assert_eq(rc, 0, "%s", out);
    snprintf(run_dir, sizeof run_dir, "%s/c", dir);
    test_read_losses(run_dir, got, STEPS);
    test_expect_losses(got, ref, 11, STEPS, "on one rank");
}

Test(zero, meshes_that_cannot_be_built_are_refused) {
    if (!test_have_mpirun())
        cr_skip_test("mpirun not found (apt-get install openmpi-bin)");
    static char out[1 << 16];
    int rc = test_run(out, sizeof out, MPIRUN "2 " LOCO " train configs/tiny.ini" SMALL
                                         " --set parallel.dp=3 --set run.dir=%s/x",
                 dir);
    cr_expect_neq(rc, 0);
    cr_expect(strstr(out, "= 3 ranks, but the world has 2") != NULL, "%s", out);
    rc = test_run(out, sizeof out, MPIRUN "2 " LOCO " train configs/tiny.ini" SMALL
                                     " --set parallel.dp=2 --set parallel.ep=2 --set run.dir=%s/x",
             dir);
    cr_expect_neq(rc, 0);
    cr_expect(strstr(out, "parallel.ep = 2 needs experts to split") != NULL, "%s", out);
}
