/* Mixture of experts under mpirun against one rank with the same global
 * batch: experts split over ep in {2, 4} ranks folded out of dp = 4, with
 * and without dropping, ZeRO-1 and ZeRO-3, recompute; plain dp over an
 * MoE model; a shared expert replicated over ep; the losses of 8 steps
 * and the final parameters equal a single rank's within 1e-5 relative; a
 * checkpoint of ep = 2 resumed at ep = 1 and 4; tensor parallelism inside
 * the experts, with sp, ep, pp and ZeRO-3; the export, with and
 * without shared experts, loads in the PyTorch reference with loco's
 * loss; clear errors for what does not split. Runs build/loco. */
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
/* Two blocks, both MoE: 4 experts, top-2. */
#define SMALL                                                                                      \
    " --set model.n_layer=2 --set model.n_head=2 --set model.n_embd=16 --set model.seq_len=16"     \
    " --set model.vocab_size=256 --set train.steps=8 --set train.warmup_steps=2"                   \
    " --set train.batch_size=2 --set run.threads=1 --set run.eval_every=0"                         \
    " --set run.log_every=100 --set model.n_experts=4 --set model.top_k=2"

static char *dir;

static void setup(void) {
    dir = test_tmpdir("loco-ep");
    test_mpi_session_dir(dir);
}

static void teardown(void) {
    loco_rmtree(dir);
    free(dir);
}

static const loco_gpt_config small_model = {.n_layer = 2,
                                            .n_head = 2,
                                            .n_embd = 16,
                                            .seq_len = 16,
                                            .vocab_size = 256,
                                            .n_experts = 4,
                                            .top_k = 2,
                                            .moe_every = 1};

/* One rank, m micro-batches: the reference. */
static void reference(int m, const char *extra) {
    static char out[1 << 16];
    int rc = test_run(out, sizeof out,
                      LOCO " train configs/tiny.ini" SMALL " --set train.grad_accum=%d %s"
                           " --set run.dir=%s/ref",
                      m, extra, dir);
    cr_assert_eq(rc, 0, "%s", out);
}

/* 4 ranks with `extra` (dp = 4 unless it says otherwise; ep folded out
 * of dp) against one rank with `model` (the same MoE settings, mc's
 * table) accumulating ref_m micro-batches. */
static void check_model(const loco_gpt_config *mc, const char *extra, const char *model,
                        int ref_m) {
    if (!test_have_mpirun())
        cr_skip_test("mpirun not found (apt-get install openmpi-bin)");
    static char out[1 << 16];
    reference(ref_m, model);
    int rc = test_run(out, sizeof out,
                      MPIRUN "4 " LOCO " train configs/tiny.ini" SMALL
                             " --set parallel.dp=4 %s %s --set run.dir=%s/ep",
                      model, extra, dir);
    cr_assert_eq(rc, 0, "%s", out);
    test_expect_like_reference(mc, dir, "ep", STEPS, extra);
}

static void check_with(const char *extra, const char *model, int ref_m) {
    check_model(&small_model, extra, model, ref_m);
}

#define DROPPING "--set model.capacity_factor=1.25"

static void check(const char *extra, const char *model) {
    check_with(extra, model, 4);
}

TestSuite(ep, .init = setup, .fini = teardown, .timeout = 180);

Test(ep, dp4_dropless) {
    check("--set parallel.ep=1", "");
}
Test(ep, ep2_dropless) {
    check("--set parallel.ep=2", "");
}
Test(ep, ep4_dropless) {
    check("--set parallel.ep=4", "");
}
Test(ep, ep2_dropping_zero1) {
    check("--set parallel.ep=2 --set parallel.zero_stage=1", DROPPING);
}
Test(ep, ep4_dropping_zero3) {
    check("--set parallel.ep=4 --set parallel.zero_stage=3", DROPPING);
}
Test(ep, ep2_full_recompute_zero2) {
    check("--set parallel.ep=2 --set train.recompute=full --set parallel.zero_stage=2", "");
}
/* A shared expert beside the routed ones: replicated on every ep rank,
 * its gradient averaged with the dense ones. */
Test(ep, ep2_shared_expert) {
    if (!test_have_mpirun())
        cr_skip_test("mpirun not found (apt-get install openmpi-bin)");
    static char out[1 << 16];
    loco_gpt_config shared = small_model;
    shared.n_shared_experts = 1;
#define SHARED " --set model.n_shared_experts=1"
    reference(4, SHARED);
    int rc = test_run(out, sizeof out,
                      MPIRUN "4 " LOCO " train configs/tiny.ini" SMALL SHARED
                             " --set parallel.dp=4 --set parallel.ep=2 --set run.dir=%s/ep",
                      dir);
#undef SHARED
    cr_assert_eq(rc, 0, "%s", out);
    test_expect_like_reference(&shared, dir, "ep", STEPS, "ep 2 with a shared expert");
}

/* Tensor parallelism inside every expert (Megatron's split of each MLP:
 * c_fc by columns, c_proj by rows, its bias added once), the router
 * replicated: tp 2 x dp 2 with dropping; tp 2 with sequence parallelism
 * x ep 2 (folded out of dp 2) with a shared expert and ZeRO-3; tp 2 x pp
 * 2 with selective recompute. */
Test(ep, tp2_dp2_dropping) {
    check_with("--set parallel.dp=2 --set parallel.tp=2", DROPPING, 2);
}
Test(ep, tp2_sp_ep2_shared_expert_zero3) {
    loco_gpt_config shared = small_model;
    shared.n_shared_experts = 1;
    check_model(&shared,
                "--set parallel.dp=2 --set parallel.tp=2 --set parallel.sp=true"
                " --set parallel.ep=2 --set parallel.zero_stage=3",
                DROPPING " --set model.n_shared_experts=1", 2);
}
Test(ep, tp2_pp2_selective) {
    check_with(
        "--set parallel.dp=1 --set parallel.tp=2 --set parallel.pp=2 --set train.grad_accum=2"
        " --set train.recompute=selective",
        DROPPING, 2);
}

/* Experts inside pipeline stages: pp 2 x dp 2 (ep 2), two micro-batches
 * each: one rank's four. */
Test(ep, pp2_ep2_dropping_zero1) {
    check_with("--set parallel.dp=2 --set parallel.pp=2 --set parallel.ep=2"
               " --set train.grad_accum=2 --set parallel.zero_stage=1",
               DROPPING, 4);
}

/* An ep = 2 checkpoint at step 4 goes on at ep = 4 and on one rank (no
 * ep) along the curve: the experts are resharded by name. */
Test(ep, resume_with_another_ep_continues_the_curve) {
    if (!test_have_mpirun())
        cr_skip_test("mpirun not found (apt-get install openmpi-bin)");
    static char out[1 << 16];
    reference(4, "");
    int rc = test_run(out, sizeof out,
                      MPIRUN "4 " LOCO " train configs/tiny.ini" SMALL
                             " --set parallel.dp=4 --set parallel.ep=2 --set run.ckpt_every=4"
                             " --set run.dir=%s/a",
                      dir);
    cr_assert_eq(rc, 0, "%s", out);
    const char *runs[2] = {"four", "one"};
    for (int i = 0; i < 2; i++) {
        if (i == 0)
            rc = test_run(out, sizeof out,
                          MPIRUN "4 " LOCO " train configs/tiny.ini" SMALL
                                 " --set parallel.dp=4 --set parallel.ep=4"
                                 " --set run.dir=%s/%s --resume %s/a/ckpt_00000004",
                          dir, runs[i], dir);
        else
            rc = test_run(out, sizeof out,
                          LOCO " train configs/tiny.ini" SMALL " --set train.grad_accum=4"
                               " --set run.dir=%s/%s --resume %s/a/ckpt_00000004",
                          dir, runs[i], dir);
        cr_assert_eq(rc, 0, "%s", out);
        test_expect_resumed(dir, runs[i], 5, STEPS);
    }
}

/* The export of an ep = 2 MoE checkpoint (with `model` more settings)
 * loads in the PyTorch reference of tests/fixtures (which gains the MoE
 * block) with `loco eval`'s loss. */
static void check_export(const char *model) {
    if (!test_have_mpirun())
        cr_skip_test("mpirun not found (apt-get install openmpi-bin)");
    if (system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0)
        cr_skip_test("PyTorch not installed (apt-get install python3-torch): export not "
                     "loaded in PyTorch");
    static char out[1 << 16];
    int rc = test_run(out, sizeof out,
                      MPIRUN "2 " LOCO " train configs/tiny.ini" SMALL
                             " --set parallel.dp=2 --set parallel.ep=2"
                             " --set model.capacity_factor=1.25 %s --set run.dir=%s/a",
                      model, dir);
    cr_assert_eq(rc, 0, "%s", out);
    rc = test_run(out, sizeof out, LOCO " ckpt export %s/a/ckpt_%08d %s/hf", dir, STEPS, dir);
    cr_assert_eq(rc, 0, "%s", out);
    rc = test_run(out, sizeof out,
                  LOCO " eval configs/tiny.ini" SMALL " --set model.capacity_factor=1.25 %s"
                       " --set train.batch_size=4 --ckpt %s/a/ckpt_%08d --batches 1",
                  model, dir, STEPS);
    cr_assert_eq(rc, 0, "%s", out);
    const char *p = strstr(out, "\"val_loss\": ");
    cr_assert(p, "%s", out);
    const double eval_loss = atof(p + 12);
    rc = test_run(out, sizeof out,
                  "/usr/bin/python3 tests/fixtures/make_fixtures.py --load-check %s/hf"
                  " --tokens \"$(ls data/kjv_val_*.bin | head -n 1)\" -B 4 -T 16",
                  dir);
    cr_assert_eq(rc, 0, "%s", out);
    p = strstr(out, "T=16: ");
    cr_assert(p, "%s", out);
    const double torch_loss = atof(p + 6);
    cr_expect(fabs(torch_loss - eval_loss) <= 1e-4 * fabs(eval_loss),
              "PyTorch loss %.6f, loco eval %.6f", torch_loss, eval_loss);
}

Test(ep, export_loads_in_pytorch_with_the_eval_loss) {
    check_export("");
}

/* GPT-2's MLPs as two shared experts beside the routed ones, replicated
 * on both ep ranks. */
Test(ep, export_with_shared_experts_loads_in_pytorch) {
    check_export("--set model.n_shared_experts=2");
}

Test(ep, what_cannot_be_split_is_refused_clearly) {
    if (!test_have_mpirun())
        cr_skip_test("mpirun not found (apt-get install openmpi-bin)");
    static char out[1 << 16];
    static const char *const bad[][2] = {
        /* 4 experts over 3 ranks */
        {"--set parallel.dp=3 --set parallel.ep=3",
         "parallel.ep = 3 must divide model.n_experts = 4"},
        /* ep not dividing dp */
        {"--set parallel.dp=3 --set parallel.ep=2", "parallel.ep = 2 must divide parallel.dp = 3"},
        /* top_k over E */
        {"--set parallel.dp=3 --set model.top_k=5",
         "model.top_k = 5 must be between 1 and model.n_experts = 4"},
        /* experts split over tp by whole columns */
        {"--set parallel.tp=3 --set model.n_head=1", "parallel.tp = 3 must divide model.n_head"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int rc = test_run(out, sizeof out,
                          MPIRUN "3 " LOCO " train configs/tiny.ini" SMALL " --set model.n_head=3"
                                 " --set model.n_embd=24 %s --set run.dir=%s/x",
                          bad[i][0], dir);
        cr_expect_neq(rc, 0);
        cr_expect(strstr(out, bad[i][1]) != NULL, "%s: %s", bad[i][0], out);
    }
    /* an expert shard cut short: the resume names it, and nothing trains */
    int rc0 = test_run(out, sizeof out,
                       MPIRUN "2 " LOCO " train configs/tiny.ini" SMALL
                              " --set parallel.dp=2 --set parallel.ep=2 --set train.steps=2"
                              " --set run.dir=%s/c",
                       dir);
    cr_assert_eq(rc0, 0, "%s", out);
    char shard[700];
    snprintf(shard, sizeof shard, "%s/c/ckpt_00000002/shard_00001.safetensors", dir);
    cr_assert_eq(truncate(shard, 100), 0, "%s", shard);
    rc0 = test_run(out, sizeof out,
                   MPIRUN "2 " LOCO " train configs/tiny.ini" SMALL
                          " --set parallel.dp=2 --set parallel.ep=2 --set train.steps=4"
                          " --set run.dir=%s/d --resume %s/c/ckpt_00000002",
                   dir, dir);
    cr_expect_neq(rc0, 0);
    cr_expect(strstr(out, "shard_00001.safetensors") && strstr(out, "is corrupt or truncated"),
              "%s", out);
    /* ep without experts */
    int rc = test_run(out, sizeof out,
                      MPIRUN "2 " LOCO " train configs/tiny.ini" SMALL " --set model.n_experts=0"
                             " --set parallel.dp=2 --set parallel.ep=2 --set run.dir=%s/x",
                      dir);
    cr_expect_neq(rc, 0);
    cr_expect(strstr(out, "parallel.ep = 2 needs experts to split") != NULL, "%s", out);
}
