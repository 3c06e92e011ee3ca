/* Pipeline parallelism under mpirun against one rank with the same global
 * batch: for every schedule, p in {2, 4} and m in {4, 8} (v = 2 where the
 * schedule has virtual stages; dualpipev needs m >= 2p), the losses of 6
 * steps and the final parameters equal a single rank's within 1e-5
 * relative; a 3-D case (pp 2 x dp 2 x tp 2); ZeRO-2 and 3 over stages; recompute inside stages; a
 * checkpoint resharded from pp 4 to 2 and 1; clear errors for what cannot
 * be built. Runs build/loco. */
#include "inner/model/model.h"
#include "tests/support.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define LOCO "\"${LOCO_BIN:-build/loco}\""
#define MPIRUN "mpirun --allow-run-as-root --oversubscribe -x ASAN_OPTIONS=detect_leaks=0 -np "
#define STEPS 6
/* Eight blocks (p v = 8 chunks at most), a vocabulary that no tp pads. */
#define SMALL                                                                                      \
    " --set model.n_layer=8 --set model.n_head=2 --set model.n_embd=16 --set model.seq_len=16"     \
    " --set model.vocab_size=256 --set train.steps=6 --set train.warmup_steps=2"                   \
    " --set train.batch_size=2 --set run.threads=1 --set run.eval_every=0"                         \
    " --set run.log_every=100"

static char *dir;

static void setup(void) {
    dir = test_tmpdir("loco-pp");
    test_mpi_session_dir(dir);
}

static void teardown(void) {
    loco_rmtree(dir);
    free(dir);
}

static const loco_gpt_config small_model = {
    .n_layer = 8, .n_head = 2, .n_embd = 16, .seq_len = 16, .vocab_size = 256};

/* One rank, m micro-batches of accumulation: the reference. */
static void reference(int m) {
    static char out[1 << 16];
    int rc = test_run(out, sizeof out,
                      LOCO " train configs/tiny.ini" SMALL
                           " --set train.grad_accum=%d --set run.dir=%s/ref",
                      m, dir);
    cr_assert_eq(rc, 0, "%s", out);
}

/* ranks = pp x dp x tp; the same global batch as the reference. */
static void check_with(const char *schedule, int p, int v, int m, int dp, int tp, int zero,
                       const char *extra) {
    if (!test_have_mpirun())
        cr_skip_test("mpirun not found (apt-get install openmpi-bin)");
    static char out[1 << 16];
    reference(m * dp);
    int rc =
        test_run(out, sizeof out,
                 MPIRUN "%d " LOCO " train configs/tiny.ini" SMALL
                        " --set train.grad_accum=%d --set parallel.pp=%d"
                        " --set parallel.pp_schedule=%s --set parallel.virtual_stages=%d"
                        " --set parallel.dp=%d --set parallel.tp=%d --set parallel.zero_stage=%d"
                        " --set run.dir=%s/pp %s",
                 p * dp * tp, m, p, schedule, v, dp, tp, zero, dir, extra);
    cr_assert_eq(rc, 0, "%s", out);
    char what[256];
    snprintf(what, sizeof what, "%s p=%d v=%d m=%d dp=%d tp=%d zero=%d %s", schedule, p, v, m, dp,
             tp, zero, extra);
    test_expect_like_reference(&small_model, dir, "pp", STEPS, what);
}

static void check_zero(const char *schedule, int p, int v, int m, int dp, int tp, int zero) {
    check_with(schedule, p, v, m, dp, tp, zero, "");
}

static void check(const char *schedule, int p, int v, int m, int dp, int tp) {
    check_zero(schedule, p, v, m, dp, tp, 1);
}

TestSuite(pp, .init = setup, .fini = teardown, .timeout = 180);

Test(pp, gpipe_p2_m4) {
    check("gpipe", 2, 1, 4, 1, 1);
}
Test(pp, gpipe_p2_m8) {
    check("gpipe", 2, 1, 8, 1, 1);
}
Test(pp, gpipe_p4_m4) {
    check("gpipe", 4, 1, 4, 1, 1);
}
Test(pp, gpipe_p4_m8) {
    check("gpipe", 4, 1, 8, 1, 1);
}
Test(pp, onef1b_p2_m4) {
    check("1f1b", 2, 1, 4, 1, 1);
}
Test(pp, onef1b_p2_m8) {
    check("1f1b", 2, 1, 8, 1, 1);
}
Test(pp, onef1b_p4_m4) {
    check("1f1b", 4, 1, 4, 1, 1);
}
Test(pp, onef1b_p4_m8) {
    check("1f1b", 4, 1, 8, 1, 1);
}
Test(pp, interleaved_p2_m4) {
    check("interleaved", 2, 2, 4, 1, 1);
}
Test(pp, interleaved_p2_m8) {
    check("interleaved", 2, 2, 8, 1, 1);
}
Test(pp, interleaved_p4_m4) {
    check("interleaved", 4, 2, 4, 1, 1);
}
Test(pp, interleaved_p4_m8) {
    check("interleaved", 4, 2, 8, 1, 1);
}
Test(pp, zbh1_p2_m4) {
    check("zb-h1", 2, 1, 4, 1, 1);
}
Test(pp, zbh1_p2_m8) {
    check("zb-h1", 2, 1, 8, 1, 1);
}
Test(pp, zbh1_p4_m4) {
    check("zb-h1", 4, 1, 4, 1, 1);
}
Test(pp, zbh1_p4_m8) {
    check("zb-h1", 4, 1, 8, 1, 1);
}
Test(pp, zbv_p2_m4) {
    check("zbv", 2, 2, 4, 1, 1);
}
Test(pp, zbv_p2_m8) {
    check("zbv", 2, 2, 8, 1, 1);
}
Test(pp, zbv_p4_m4) {
    check("zbv", 4, 2, 4, 1, 1);
}
Test(pp, zbv_p4_m8) {
    check("zbv", 4, 2, 8, 1, 1);
}
Test(pp, dualpipev_p2_m4) {
    check("dualpipev", 2, 2, 4, 1, 1);
}
Test(pp, dualpipev_p2_m8) {
    check("dualpipev", 2, 2, 8, 1, 1);
}
Test(pp, dualpipev_p4_m8) {
    check("dualpipev", 4, 2, 8, 1, 1);
}
Test(pp, three_d_pp2_dp2_tp2) {
    check("1f1b", 2, 1, 4, 2, 2);
}

/* ZeRO-2/3 over the stages: reduce-scatter of each chunk as it finishes;
 * at 3 the shards gathered chunk by chunk. The tied wte across two stages
 * (1f1b, interleaved) and inside one (zbv: rank 0 holds both ends). */
Test(pp, zero2_1f1b_pp2_dp2) {
    check_zero("1f1b", 2, 1, 4, 2, 1, 2);
}
Test(pp, zero3_interleaved_pp2_dp2) {
    check_zero("interleaved", 2, 2, 4, 2, 1, 3);
}
Test(pp, zero3_zbv_pp2_dp2) {
    check_zero("zbv", 2, 2, 4, 2, 1, 3);
}

/* Uneven chunks as parallel.pp_layers lists them. */
Test(pp, uneven_pp_layers_1f1b) {
    check_with("1f1b", 2, 1, 4, 1, 1, 1, "--set parallel.pp_layers=3,5");
}
Test(pp, uneven_pp_layers_interleaved) {
    check_with("interleaved", 2, 2, 4, 1, 1, 1, "--set parallel.pp_layers=1,3,2,2");
}

/* Recompute inside a stage: full recompute runs a block's weight half
 * inside its input half; selective recomputes the attention core in B. */
static void check_recompute(const char *mode) {
    if (!test_have_mpirun())
        cr_skip_test("mpirun not found (apt-get install openmpi-bin)");
    static char out[1 << 16];
    reference(4);
    int rc = test_run(out, sizeof out,
                      MPIRUN "2 " LOCO " train configs/tiny.ini" SMALL
                             " --set train.grad_accum=4 --set parallel.pp=2"
                             " --set parallel.pp_schedule=zb-h1 --set train.recompute=%s"
                             " --set run.dir=%s/pp",
                      mode, dir);
    cr_assert_eq(rc, 0, "%s", out);
    test_expect_like_reference(&small_model, dir, "pp", STEPS, mode);
}

Test(pp, zbh1_with_selective_recompute) {
    check_recompute("selective");
}
Test(pp, zbh1_with_full_recompute) {
    check_recompute("full");
}

Test(pp, what_cannot_be_built_is_refused_clearly) {
    if (!test_have_mpirun())
        cr_skip_test("mpirun not found (apt-get install openmpi-bin)");
    static char out[1 << 16];
    /* 8 blocks do not split into 3 x 1 chunks */
    int rc = test_run(out, sizeof out,
                      MPIRUN "3 " LOCO " train configs/tiny.ini" SMALL
                             " --set train.grad_accum=4 --set parallel.pp=3 --set run.dir=%s/x",
                      dir);
    cr_expect_neq(rc, 0);
    cr_expect(strstr(out, "does not split into parallel.pp x virtual_stages = 3 chunks") != NULL,
              "%s", out);
    /* dualpipev needs m >= 2p */
    rc = test_run(out, sizeof out,
                  MPIRUN "2 " LOCO " train configs/tiny.ini" SMALL
                         " --set train.grad_accum=2 --set parallel.pp=2"
                         " --set parallel.pp_schedule=dualpipev --set parallel.virtual_stages=2"
                         " --set run.dir=%s/x",
                  dir);
    cr_expect_neq(rc, 0);
    cr_expect(strstr(out, "needs m >= 2p") != NULL, "%s", out);
    /* parallel.pp_layers that do not make the chunks */
    static const char *const bad[][2] = {
        {"3,4", "2 chunks of 7 blocks in all, but parallel.pp x virtual_stages = 2 chunks of "
                "model.n_layer = 8 blocks"},
        {"3,x", "entry 2 is not a block count >= 1"},
        {"2,2,4", "lists more than parallel.pp x virtual_stages = 2 chunks"},
        {"0,8", "entry 1 is not a block count >= 1"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        rc = test_run(out, sizeof out,
                      MPIRUN "2 " LOCO " train configs/tiny.ini" SMALL
                             " --set train.grad_accum=4 --set parallel.pp=2"
                             " --set parallel.pp_layers=%s --set run.dir=%s/x",
                      bad[i][0], dir);
        cr_expect_neq(rc, 0);
        cr_expect(strstr(out, bad[i][1]) != NULL, "pp_layers=%s: %s", bad[i][0], out);
    }
    /* ... or come without a pipeline */
    rc = test_run(out, sizeof out,
                  LOCO " train configs/tiny.ini" SMALL " --set parallel.pp_layers=4,4"
                       " --set run.dir=%s/x",
                  dir);
    cr_expect_neq(rc, 0);
    cr_expect(strstr(out, "needs parallel.pp > 1") != NULL, "%s", out);
}

/* A pp = 4 checkpoint at step 3 resumed at pp = 2 (another schedule, with
 * virtual stages) and on one rank goes on along the single rank's curve. */
Test(pp, reshard_pp4_to_2_and_1_continues_the_curve) {
    if (!test_have_mpirun())
        cr_skip_test("mpirun not found (apt-get install openmpi-bin)");
    static char out[1 << 16];
    reference(4);
    int rc = test_run(out, sizeof out,
                      MPIRUN "4 " LOCO " train configs/tiny.ini" SMALL
                             " --set train.grad_accum=4 --set parallel.pp=4"
                             " --set run.ckpt_every=3 --set run.dir=%s/a",
                      dir);
    cr_assert_eq(rc, 0, "%s", out);
    const char *runs[2] = {"two", "one"};
    for (int i = 0; i < 2; i++) {
        if (i == 0)
            rc = test_run(out, sizeof out,
                          MPIRUN "2 " LOCO " train configs/tiny.ini" SMALL
                                 " --set train.grad_accum=4 --set parallel.pp=2"
                                 " --set parallel.pp_schedule=zbv --set parallel.virtual_stages=2"
                                 " --set run.dir=%s/%s --resume %s/a/ckpt_00000003",
                          dir, runs[i], dir);
        else
            rc = test_run(out, sizeof out,
                          LOCO " train configs/tiny.ini" SMALL " --set train.grad_accum=4"
                               " --set run.dir=%s/%s --resume %s/a/ckpt_00000003",
                          dir, runs[i], dir);
        cr_assert_eq(rc, 0, "%s", out);
        test_expect_resumed(dir, runs[i], 4, STEPS);
    }
}
