/* Megatron tensor parallelism, sequence parallelism and activation
 * recompute under mpirun against one rank with the same global batch: the
 * losses of 8 steps and the final parameters within 1e-5 relative, for tp
 * 2 and 4, tp x dp with ZeRO 1 and 3, sp on and off and every recompute
 * mode; recompute bit-identical to none; tp checkpoints that reshard
 * (2 -> 1, 2 -> 4) and export to the Hugging Face layout; clear errors for
 * what cannot be built. Runs build/loco. */
#include "inner/model/model.h"
#include "tests/support.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LOCO "\"${LOCO_BIN:-build/loco}\""
#define MPIRUN "mpirun --allow-run-as-root --oversubscribe -x ASAN_OPTIONS=detect_leaks=0 -np "
#define STEPS 8
/* Four heads (tp up to 4) and a vocabulary of 258, which tp = 4 pads to
 * 260: padding must not change the loss. The global batch is 8 sequences
 * of 32 tokens in two micro-batches. */
#define SMALL                                                                                      \
    " --set model.n_layer=2 --set model.n_head=4 --set model.n_embd=32 --set model.seq_len=32"     \
    " --set model.vocab_size=258 --set train.steps=8 --set train.warmup_steps=2"                   \
    " --set train.grad_accum=2 --set run.threads=1 --set run.eval_every=0"                         \
    " --set run.log_every=100 --set parallel.bucket_mb=0.02"

static char *dir;

static void setup(void) {
    dir = test_tmpdir("loco-tp");
    test_mpi_session_dir(dir);
}

static void teardown(void) {
    loco_rmtree(dir);
    free(dir);
}

/* One rank, the whole global batch, `extra` settings: the reference. */
static void run_one(const char *name, const char *extra, double *loss) {
    static char out[1 << 16];
    int rc = test_run(out, sizeof out,
                      LOCO " train configs/tiny.ini" SMALL
                           " --set train.batch_size=4 --set run.dir=%s/%s %s",
                      dir, name, extra);
    cr_assert_eq(rc, 0, "%s", out);
    char run_dir[600];
    snprintf(run_dir, sizeof run_dir, "%s/%s", dir, name);
    test_read_losses(run_dir, loss, STEPS);
}

static const loco_gpt_config small_model = {
    .n_layer = 2, .n_head = 4, .n_embd = 32, .seq_len = 32, .vocab_size = 258};

/* A tp = 2 run of the small model into dir/NAME with `extra` settings. */
static void train_tp2(const char *name, const char *extra) {
    static char out[1 << 16];
    int rc = test_run(out, sizeof out,
                      MPIRUN "2 " LOCO " train configs/tiny.ini" SMALL
                             " --set train.batch_size=4 --set parallel.tp=2 --set run.dir=%s/%s %s",
                      dir, name, extra);
    cr_assert_eq(rc, 0, "%s", out);
}

/* ranks = tp x dp under mpirun, the same global batch as the reference. */
static void check_mesh(int tp, int dp, int stage, bool sp, const char *recompute) {
    if (!test_have_mpirun())
        cr_skip_test("mpirun not found (apt-get install openmpi-bin)");
    static char out[1 << 16];
    double ref[STEPS + 1], got[STEPS + 1];
    run_one("ref", "", ref);
    int rc = test_run(out, sizeof out,
                      MPIRUN "%d " LOCO " train configs/tiny.ini" SMALL
                             " --set train.batch_size=%d --set parallel.dp=%d --set parallel.tp=%d"
                             " --set parallel.sp=%s --set parallel.zero_stage=%d"
                             " --set train.recompute=%s --set run.dir=%s/tp",
                      tp * dp, 4 / dp, dp, tp, sp ? "true" : "false", stage, recompute, dir);
    cr_assert_eq(rc, 0, "%s", out);
    char want[64];
    snprintf(want, sizeof want, "dp=%d, tp=%d%s", dp, tp, sp ? " + sp" : ",");
    cr_expect(strstr(out, want) != NULL, "no '%s' in: %s", want, out);
    char run_dir[600];
    snprintf(run_dir, sizeof run_dir, "%s/tp", dir);
    test_read_losses(run_dir, got, STEPS);
    char what[128];
    snprintf(what, sizeof what, "tp=%d dp=%d ZeRO-%d sp=%d %s", tp, dp, stage, sp, recompute);
    test_expect_losses(got, ref, 1, STEPS, what);
    /* The tp-sharded checkpoint, gathered to the Hugging Face layout,
     * holds the single rank's parameters. */
    rc = test_run(out, sizeof out, LOCO " ckpt export %s/tp/ckpt_%08d %s/export", dir, STEPS, dir);
    cr_assert_eq(rc, 0, "%s", out);
    char exp_dir[600], ref_ckpt[600];
    snprintf(exp_dir, sizeof exp_dir, "%s/export", dir);
    snprintf(ref_ckpt, sizeof ref_ckpt, "%s/ref/ckpt_%08d", dir, STEPS);
    /* Tensor parallelism changes the forward's sums too (partial matmuls
     * reduced over tp), and AdamW amplifies rounding in the few elements
     * whose moments nearly cancel: at 8 steps the model agrees to ~2e-6
     * relative while a single such element can differ by ~1e-5 of the
     * largest parameter. A real error moves elements by the learning rate
     * (3e-3) in one step. */
    double l2, worst;
    test_model_diff(&small_model, exp_dir, ref_ckpt, &l2, &worst);
    cr_expect(l2 <= 1e-5 && worst <= 1e-4,
              "tp=%d dp=%d ZeRO-%d sp=%d %s: final parameters differ by %g (relative L2), %g "
              "(largest element, relative to the largest parameter)",
              tp, dp, stage, sp, recompute, l2, worst);
}

TestSuite(tp, .init = setup, .fini = teardown, .timeout = 180);

Test(tp, tp2) {
    check_mesh(2, 1, 0, false, "none");
}
Test(tp, tp2_sp) {
    check_mesh(2, 1, 0, true, "none");
}
Test(tp, tp4) {
    check_mesh(4, 1, 0, false, "none");
}
Test(tp, tp4_sp) {
    check_mesh(4, 1, 0, true, "none");
}
Test(tp, tp2_dp2_zero0) {
    check_mesh(2, 2, 0, false, "none");
}
Test(tp, tp2_dp2_zero1) {
    check_mesh(2, 2, 1, false, "none");
}
Test(tp, tp2_dp2_zero1_sp) {
    check_mesh(2, 2, 1, true, "none");
}
Test(tp, tp2_dp2_zero2_sp) {
    check_mesh(2, 2, 2, true, "none");
}
Test(tp, tp2_dp2_zero3) {
    check_mesh(2, 2, 3, false, "none");
}
Test(tp, tp2_dp2_zero3_sp) {
    check_mesh(2, 2, 3, true, "none");
}
Test(tp, tp2_selective) {
    check_mesh(2, 1, 0, false, "selective");
}
Test(tp, tp2_sp_selective) {
    check_mesh(2, 1, 0, true, "selective");
}
Test(tp, tp2_full) {
    check_mesh(2, 1, 0, false, "full");
}
Test(tp, tp4_sp_selective) {
    check_mesh(4, 1, 0, true, "selective");
}
Test(tp, tp2_sp_full_dp2_zero3) {
    check_mesh(2, 2, 3, true, "full");
}

/* Two runs' checkpoints hold bit-identical parameters. */
static void expect_same_bits(const char *a, const char *b, const char *what) {
    char pa[700], pb[700];
    snprintf(pa, sizeof pa, "%s/%s/ckpt_%08d/model.safetensors", dir, a, STEPS);
    snprintf(pb, sizeof pb, "%s/%s/ckpt_%08d/model.safetensors", dir, b, STEPS);
    void *da, *db;
    size_t la, lb;
    cr_assert_eq(loco_file_read(pa, &da, &la), 0, "%s", pa);
    cr_assert_eq(loco_file_read(pb, &db, &lb), 0, "%s", pb);
    cr_expect(la == lb && memcmp(da, db, la) == 0, "%s: parameters are not bit-identical", what);
    loco_free(da);
    loco_free(db);
}

/* Recompute changes memory and time, never bits (one rank, CPU path). */
Test(tp, recompute_is_bit_identical_to_none) {
    double none[STEPS + 1], sel[STEPS + 1], full[STEPS + 1], part[STEPS + 1];
    run_one("none", "", none);
    run_one("sel", "--set train.recompute=selective", sel);
    run_one("full", "--set train.recompute=full", full);
    run_one("part", "--set train.recompute=full --set train.recompute_layers=1", part);
    for (int s = 1; s <= STEPS; s++) {
        cr_expect(sel[s] == none[s], "selective step %d: %.17g vs %.17g", s, sel[s], none[s]);
        cr_expect(full[s] == none[s], "full step %d: %.17g vs %.17g", s, full[s], none[s]);
        cr_expect(part[s] == none[s], "full, 1 layer, step %d: %.17g vs %.17g", s, part[s],
                  none[s]);
    }
    expect_same_bits("sel", "none", "selective");
    expect_same_bits("full", "none", "full");
    expect_same_bits("part", "none", "full on the first block");
}

/* A tp = 2 checkpoint at step 4 resumed on one rank and on tp = 4 goes on
 * along the single rank's curve. */
Test(tp, reshard_tp2_to_1_and_4_continues_the_curve) {
    if (!test_have_mpirun())
        cr_skip_test("mpirun not found (apt-get install openmpi-bin)");
    static char out[1 << 16];
    double ref[STEPS + 1], got[STEPS + 1];
    run_one("ref", "", ref);
    train_tp2("a", "--set run.ckpt_every=4");
    int rc;
    const char *runs[2] = {"one", "four"};
    for (int i = 0; i < 2; i++) {
        if (i == 0)
            rc = test_run(out, sizeof out,
                          LOCO " train configs/tiny.ini" SMALL " --set train.batch_size=4"
                               " --set run.dir=%s/%s --resume %s/a/ckpt_00000004",
                          dir, runs[i], dir);
        else
            rc = test_run(out, sizeof out,
                          MPIRUN
                          "4 " LOCO " train configs/tiny.ini" SMALL
                          " --set train.batch_size=4 --set parallel.tp=4 --set parallel.sp=true"
                          " --set run.dir=%s/%s --resume %s/a/ckpt_00000004",
                          dir, runs[i], dir);
        cr_assert_eq(rc, 0, "%s", out);
        char run_dir[600];
        snprintf(run_dir, sizeof run_dir, "%s/%s", dir, runs[i]);
        test_read_losses(run_dir, got, STEPS);
        test_expect_losses(got, ref, 5, STEPS, runs[i]);
    }
}

/* The export of a tp = 2 checkpoint loads in the plain PyTorch GPT-2 of
 * tests/fixtures with the loss `loco eval` gives. */
Test(tp, export_loads_in_pytorch_with_the_eval_loss) {
    if (!test_have_mpirun())
        cr_skip_test("mpirun not found (apt-get install openmpi-bin)");
    if (system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0)
        cr_skip_test("PyTorch not installed (apt-get install python3-torch): export not "
                     "loaded in PyTorch");
    static char out[1 << 16];
    train_tp2("a", "");
    int rc;
    rc = test_run(out, sizeof out, LOCO " ckpt export %s/a/ckpt_%08d %s/hf", dir, STEPS, dir);
    cr_assert_eq(rc, 0, "%s", out);
    /* One batch of 4 x 32 from the start of the validation shard. */
    rc = test_run(out, sizeof out,
                  LOCO " eval configs/tiny.ini" SMALL " --set train.batch_size=4"
                       " --ckpt %s/a/ckpt_%08d --batches 1",
                  dir, STEPS);
    cr_assert_eq(rc, 0, "%s", out);
    const char *p = strstr(out, "\"val_loss\": ");
    cr_assert(p, "%s", out);
    double eval_loss = atof(p + 12);
    rc = test_run(out, sizeof out,
                  "/usr/bin/python3 tests/fixtures/make_fixtures.py --load-check %s/hf"
                  " --tokens \"$(ls data/kjv_val_*.bin | head -n 1)\" -B 4 -T 32",
                  dir);
    cr_assert_eq(rc, 0, "%s", out);
    p = strstr(out, "T=32: ");
    cr_assert(p, "%s", out);
    double torch_loss = atof(p + 6);
    cr_expect(fabs(torch_loss - eval_loss) <= 1e-4 * fabs(eval_loss),
              "PyTorch loss %.6f, loco eval %.6f", torch_loss, eval_loss);
}

Test(tp, what_cannot_be_built_is_refused_clearly) {
    if (!test_have_mpirun())
        cr_skip_test("mpirun not found (apt-get install openmpi-bin)");
    static char out[1 << 16];
    int rc = test_run(out, sizeof out,
                      MPIRUN "3 " LOCO " train configs/tiny.ini" SMALL
                             " --set parallel.tp=3 --set run.dir=%s/x",
                      dir);
    cr_expect_neq(rc, 0);
    cr_expect(strstr(out, "parallel.tp = 3 must divide model.n_head (4)") != NULL, "%s", out);
    rc = test_run(out, sizeof out,
                  LOCO " train configs/tiny.ini" SMALL " --set parallel.sp=true --set run.dir=%s/x",
                  dir);
    cr_expect_neq(rc, 0);
    cr_expect(strstr(out, "parallel.sp = true needs parallel.tp > 1") != NULL, "%s", out);
    rc = test_run(out, sizeof out,
                  LOCO
                  " train configs/tiny.ini" SMALL
                  " --set train.recompute=full --set train.recompute_layers=3 --set run.dir=%s/x",
                  dir);
    cr_expect_neq(rc, 0);
    cr_expect(strstr(out, "train.recompute_layers = 3: the model has 2 blocks") != NULL, "%s", out);
}

/* A tp = 2 checkpoint missing tp rank 1's slice: a clear error, no run. */
Test(tp, checkpoint_without_a_tp_slice_is_refused) {
    if (!test_have_mpirun())
        cr_skip_test("mpirun not found (apt-get install openmpi-bin)");
    static char out[1 << 16];
    train_tp2("a", "");
    int rc;
    /* tp rank 1's shard (index 1 with dp = 1). */
    rc = test_run(out, sizeof out, "rm %s/a/ckpt_%08d/shard_00001.safetensors", dir, STEPS);
    cr_assert_eq(rc, 0, "%s", out);
    rc = test_run(out, sizeof out,
                  LOCO " train configs/tiny.ini" SMALL
                       " --set train.batch_size=4 --set run.dir=%s/b --resume %s/a/ckpt_%08d",
                  dir, dir, STEPS);
    cr_expect_neq(rc, 0);
    cr_expect(strstr(out, "tp rank 1") != NULL, "%s", out);
}

/* Resuming a tp = 2 + sp run from its own checkpoint continues bit for bit:
 * the same losses and the same final shards as the run that went on. */
Test(tp, resume_at_the_same_tp_is_bit_identical) {
    if (!test_have_mpirun())
        cr_skip_test("mpirun not found (apt-get install openmpi-bin)");
    train_tp2("a", "--set parallel.sp=true --set run.ckpt_every=4");
    char resume[600];
    snprintf(resume, sizeof resume, "--set parallel.sp=true --resume %s/a/ckpt_00000004", dir);
    train_tp2("b", resume);
    double a[STEPS + 1], b[STEPS + 1];
    char run_dir[600];
    snprintf(run_dir, sizeof run_dir, "%s/a", dir);
    test_read_losses(run_dir, a, STEPS);
    snprintf(run_dir, sizeof run_dir, "%s/b", dir);
    test_read_losses(run_dir, b, STEPS);
    cr_expect(b[4] == 0 && b[5] != 0, "the resumed run did not start at step 5");
    for (int s = 5; s <= STEPS; s++)
        cr_expect(a[s] == b[s], "step %d: %.17g resumed, %.17g straight on", s, b[s], a[s]);
    for (int shard = 0; shard < 2; shard++) {
        char pa[700], pb[700];
        snprintf(pa, sizeof pa, "%s/a/ckpt_%08d/shard_%05d.safetensors", dir, STEPS, shard);
        snprintf(pb, sizeof pb, "%s/b/ckpt_%08d/shard_%05d.safetensors", dir, STEPS, shard);
        void *da, *db;
        size_t la, lb;
        cr_assert_eq(loco_file_read(pa, &da, &la), 0, "%s", pa);
        cr_assert_eq(loco_file_read(pb, &db, &lb), 0, "%s", pb);
        cr_expect(la == lb && memcmp(da, db, la) == 0, "shard %d differs after resume", shard);
        loco_free(da);
        loco_free(db);
    }
}
