/* Context parallelism under mpirun against one rank with the same global
 * batch: ring and Ulysses attention, c in {2, 4}, causal; the losses of 8
 * steps and the final parameters equal a single rank's within 1e-5
 * relative; cp x dp (ZeRO-3), cp x tp (with sp), cp x pp, cp with
 * recompute; a checkpoint of cp = 2 resumed at cp = 4 and on one rank;
 * clear errors for sequences or heads that do not split. Runs build/loco. */
#include "inner/model/model.h"
#include "tests/support.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#define LOCO "\"${LOCO_BIN:-build/loco}\""
#define MPIRUN "mpirun --allow-run-as-root --oversubscribe -x ASAN_OPTIONS=detect_leaks=0 -np "
#define STEPS 8
/* Four heads (Ulysses over 4 ranks), 16 tokens (8 chunks of 2 at cp = 4). */
#define SMALL                                                                                      \
    " --set model.n_layer=2 --set model.n_head=4 --set model.n_embd=16 --set model.seq_len=16"     \
    " --set model.vocab_size=256 --set train.steps=8 --set train.warmup_steps=2"                   \
    " --set train.batch_size=2 --set run.threads=1 --set run.eval_every=0"                         \
    " --set run.log_every=100"

static char *dir;

static void setup(void) {
    dir = test_tmpdir("loco-cp");
    test_mpi_session_dir(dir);
}

static void teardown(void) {
    loco_rmtree(dir);
    free(dir);
}

static const loco_gpt_config small_model = {
    .n_layer = 2, .n_head = 4, .n_embd = 16, .seq_len = 16, .vocab_size = 256};

/* One rank, batches of B sequences, m micro-batches: the reference. */
static void reference(int B, int m) {
    static char out[1 << 16];
    int rc = test_run(out, sizeof out,
                      LOCO " train configs/tiny.ini" SMALL " --set train.batch_size=%d"
                           " --set train.grad_accum=%d --set run.dir=%s/ref",
                      B, m, dir);
    cr_assert_eq(rc, 0, "%s", out);
}

/* ranks (cp x the rest) training with `extra`; the same global batch as
 * one rank with batches of ref_B sequences and ref_m micro-batches. */
static void check(int ranks, const char *extra, int ref_B, int ref_m) {
    if (!test_have_mpirun())
        cr_skip_test("mpirun not found (apt-get install openmpi-bin)");
    static char out[1 << 16];
    reference(ref_B, ref_m);
    int rc = test_run(out, sizeof out,
                      MPIRUN "%d " LOCO " train configs/tiny.ini" SMALL " %s --set run.dir=%s/cp",
                      ranks, extra, dir);
    cr_assert_eq(rc, 0, "%s", out);
    test_expect_like_reference(&small_model, dir, "cp", STEPS, extra);
}

TestSuite(cp, .init = setup, .fini = teardown, .timeout = 180);

Test(cp, ring_c2) {
    check(2, "--set parallel.cp=2 --set parallel.cp_algo=ring", 2, 1);
}
Test(cp, ring_c4) {
    check(4, "--set parallel.cp=4 --set parallel.cp_algo=ring", 2, 1);
}
Test(cp, ulysses_c2) {
    check(2, "--set parallel.cp=2 --set parallel.cp_algo=ulysses", 2, 1);
}
Test(cp, ulysses_c4) {
    check(4, "--set parallel.cp=4 --set parallel.cp_algo=ulysses", 2, 1);
}
/* dp ranks read their own batches: dp 2 x B 1 is one rank's B 2. */
Test(cp, ring_c2_dp2_zero3) {
    check(4,
          "--set parallel.cp=2 --set parallel.dp=2 --set parallel.zero_stage=3"
          " --set train.batch_size=1",
          2, 1);
}
Test(cp, ulysses_c2_dp2_zero1) {
    check(4,
          "--set parallel.cp=2 --set parallel.cp_algo=ulysses --set parallel.dp=2"
          " --set parallel.zero_stage=1 --set train.batch_size=1",
          2, 1);
}
Test(cp, ring_c2_tp2_sp) {
    check(4, "--set parallel.cp=2 --set parallel.tp=2 --set parallel.sp=true", 2, 1);
}
Test(cp, ulysses_c2_tp2) {
    check(4, "--set parallel.cp=2 --set parallel.tp=2 --set parallel.cp_algo=ulysses", 2, 1);
}
Test(cp, ring_c2_pp2) {
    check(4, "--set parallel.cp=2 --set parallel.pp=2 --set train.grad_accum=4", 2, 4);
}
Test(cp, recompute_full_ring_and_selective_ulysses) {
    check(2, "--set parallel.cp=2 --set train.recompute=full", 2, 1);
    check(2, "--set parallel.cp=2 --set parallel.cp_algo=ulysses --set train.recompute=selective",
          2, 1);
}

/* Parameters are replicated over cp: a cp = 2 checkpoint at step 4 goes
 * on at cp = 4 (the other algorithm) and on one rank along the curve. */
Test(cp, resume_with_another_cp_continues_the_curve) {
    if (!test_have_mpirun())
        cr_skip_test("mpirun not found (apt-get install openmpi-bin)");
    static char out[1 << 16];
    reference(2, 1);
    int rc = test_run(out, sizeof out,
                      MPIRUN "2 " LOCO " train configs/tiny.ini" SMALL
                             " --set parallel.cp=2 --set run.ckpt_every=4 --set run.dir=%s/a",
                      dir);
    cr_assert_eq(rc, 0, "%s", out);
    const char *runs[2] = {"four", "one"};
    for (int i = 0; i < 2; i++) {
        if (i == 0)
            rc = test_run(out, sizeof out,
                          MPIRUN "4 " LOCO " train configs/tiny.ini" SMALL
                                 " --set parallel.cp=4 --set parallel.cp_algo=ulysses"
                                 " --set run.dir=%s/%s --resume %s/a/ckpt_00000004",
                          dir, runs[i], dir);
        else
            rc = test_run(out, sizeof out,
                          LOCO " train configs/tiny.ini" SMALL
                               " --set run.dir=%s/%s --resume %s/a/ckpt_00000004",
                          dir, runs[i], dir);
        cr_assert_eq(rc, 0, "%s", out);
        test_expect_resumed(dir, runs[i], 5, STEPS);
    }
}

Test(cp, what_cannot_be_split_is_refused_clearly) {
    if (!test_have_mpirun())
        cr_skip_test("mpirun not found (apt-get install openmpi-bin)");
    static char out[1 << 16];
    /* 12 tokens are not 2 x 4 chunks */
    int rc = test_run(out, sizeof out,
                      MPIRUN "4 " LOCO " train configs/tiny.ini" SMALL
                             " --set model.seq_len=12 --set parallel.cp=4 --set run.dir=%s/x",
                      dir);
    cr_expect_neq(rc, 0);
    cr_expect(strstr(out, "model.seq_len = 12 does not split into 2 x cp = 8 chunks") != NULL,
              "%s", out);
    /* 2 heads over 4 Ulysses ranks */
    rc = test_run(out, sizeof out,
                  MPIRUN "4 " LOCO " train configs/tiny.ini" SMALL
                         " --set model.n_head=2 --set parallel.cp=4 --set parallel.cp_algo=ulysses"
                         " --set run.dir=%s/x",
                  dir);
    cr_expect_neq(rc, 0);
    cr_expect(strstr(out, "the 2 attention heads do not split over parallel.cp = 4") != NULL,
              "%s", out);
    /* a mesh whose product is not the world */
    rc = test_run(out, sizeof out,
                  MPIRUN "2 " LOCO " train configs/tiny.ini" SMALL
                         " --set parallel.cp=4 --set run.dir=%s/x",
                  dir);
    cr_expect_neq(rc, 0);
    cr_expect(strstr(out, "cp=4") != NULL, "%s", out);
}
