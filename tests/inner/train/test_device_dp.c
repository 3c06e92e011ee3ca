/* train.device = cuda with more than one rank, what can be checked without
 * a device (docs/DECISIONS.md, "GPU data parallel"): the meshes the device
 * trainer refuses (tp, cp, pp and ep over nccl; parallel.backend = nccl
 * on the CPU), each with its
 * message, and a two-rank cuda run under mpirun that, on a machine without
 * a device, stops with a clear error on every rank instead of hanging.
 * The run itself (dp = 2, ZeRO 0-2 against one rank) is tests/gpu/emu/
 * dp_check.c on the emulator and scripts/gpu-check.sh on a GPU. */
#include "inner/train/train.h"
#include "tests/support.h"

#if defined(LOCO_HAVE_CUDA)
#include "kernels/device.h"
#endif

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#define LOCO "\"${LOCO_BIN:-build/loco}\""
#define MPIRUN "mpirun --allow-run-as-root --oversubscribe -x ASAN_OPTIONS=detect_leaks=0 -np "
#define TINY                                                                                      \
    " --set model.n_layer=2 --set model.n_head=2 --set model.n_embd=32 --set model.seq_len=16"   \
    " --set train.steps=2 --set train.batch_size=2 --set run.threads=1 --set run.eval_every=0"    \
    " --set train.device=cuda"

static void config(loco_config *cfg) {
    loco_config_defaults(cfg);
    cfg->model.n_layer = 2;
    cfg->model.n_head = 2;
    cfg->model.n_embd = 32;
    cfg->model.seq_len = 16;
    cfg->model.n_experts = 0;
    cfg->train.batch_size = 2;
    cfg->run.threads = 1;
    cfg->run.eval_every = 0;
    snprintf(cfg->train.device, sizeof cfg->train.device, "cuda");
    loco_log_set_level(LOCO_LOG_WARN);
}

/* The refusal of cfg: in a CUDA build `want` (LOCO_ENOTSUP), else the
 * build's own refusal of train.device = cuda. */
static void expect_refused(const loco_config *cfg, const char *want) {
    loco_trainer *t = NULL;
    const int rc = loco_trainer_create(&t, cfg, NULL);
    cr_assert_null(t);
    cr_assert_eq(rc, LOCO_ENOTSUP, "rc %d: %s", rc, loco_errmsg());
#if defined(LOCO_HAVE_CUDA)
    cr_expect(strstr(loco_errmsg(), want), "expected \"%s\" in: %s", want, loco_errmsg());
#else
    (void)want;
    cr_expect(strstr(loco_errmsg(), "built without CUDA"), "%s", loco_errmsg());
#endif
}

TestSuite(device_dp, .timeout = 60);

/* Tensor parallelism runs on the device (tests/gpu/emu/dp_check.c, case
 * t); what it does not do there yet is refused by name. */
Test(device_dp, tensor_parallel_over_nccl_refused) {
    loco_config cfg;
    config(&cfg);
    cfg.parallel.tp = 2;
    snprintf(cfg.parallel.backend, sizeof cfg.parallel.backend, "nccl");
    expect_refused(&cfg, "parallel.tp = 2 with parallel.backend = nccl");
}

/* Pipeline stages run on the device (tests/gpu/test_cuda_pp.c,
 * dp_check's cases p and z); their sends and receives over nccl do not. */
Test(device_dp, pipeline_parallel_over_nccl_refused) {
    loco_config cfg;
    config(&cfg);
    cfg.parallel.pp = 2;
    snprintf(cfg.parallel.backend, sizeof cfg.parallel.backend, "nccl");
    expect_refused(&cfg, "parallel.pp = 2 with parallel.backend = nccl: the device's pipeline");
}

Test(device_dp, context_parallel_over_nccl_refused) {
    loco_config cfg;
    config(&cfg);
    cfg.parallel.cp = 2;
    snprintf(cfg.parallel.cp_algo, sizeof cfg.parallel.cp_algo, "ulysses");
    snprintf(cfg.parallel.backend, sizeof cfg.parallel.backend, "nccl");
    expect_refused(&cfg, "parallel.cp = 2 with parallel.backend = nccl");
}

/* Experts run on the device (tests/gpu/test_cuda_model.c, gpu-dp-check's
 * moe runs); their all-to-alls over nccl do not. */
Test(device_dp, expert_parallel_over_nccl_refused) {
    loco_config cfg;
    config(&cfg);
    cfg.parallel.ep = 2;
    cfg.model.n_experts = 2; /* ep must divide it */
    snprintf(cfg.parallel.backend, sizeof cfg.parallel.backend, "nccl");
    expect_refused(&cfg, "parallel.ep = 2 with parallel.backend = nccl: the device's expert");
}

Test(device_dp, nccl_backend_needs_cuda) {
    loco_config cfg;
    config(&cfg);
    snprintf(cfg.train.device, sizeof cfg.train.device, "cpu");
    snprintf(cfg.parallel.backend, sizeof cfg.parallel.backend, "nccl");
    loco_trainer *t = NULL;
    cr_assert_eq(loco_trainer_create(&t, &cfg, NULL), LOCO_EINVAL, "%s", loco_errmsg());
    cr_expect(strstr(loco_errmsg(), "parallel.backend = nccl moves device buffers: it needs "
                                    "train.device = cuda"),
              "%s", loco_errmsg());
    cr_assert_null(t);
}

/* Two ranks of `loco train` at a ZeRO stage on the device: without a
 * device both ranks stop with the device's error (no hang in a
 * collective, no refusal of the stage); with one it trains. */
static void two_ranks_without_device(int zero_stage) {
    if (!test_have_mpirun())
        cr_skip_test("mpirun not found (apt-get install openmpi-bin)");
#if defined(LOCO_HAVE_CUDA)
    int n = 0;
    if (loco_cuda_device_count(&n) == 0)
        cr_skip_test("a device is present: scripts/gpu-check.sh runs dp = 2 on it");
#endif
    char *dir = test_tmpdir("loco-device-dp");
    test_mpi_session_dir(dir);
    static char out[1 << 16];
    const int rc = test_run(out, sizeof out,
                            MPIRUN "2 " LOCO " train configs/tiny.ini" TINY
                                   " --set parallel.dp=2 --set parallel.zero_stage=%d"
                                   " --set run.dir=%s/run",
                            zero_stage, dir);
    cr_expect_neq(rc, 0, "%s", out);
    cr_expect_null(strstr(out, "zero_stage = 3 with"), "%s", out);
#if defined(LOCO_HAVE_CUDA)
    cr_expect(strstr(out, "no CUDA device"), "%s", out);
#else
    cr_expect(strstr(out, "built without CUDA"), "%s", out);
#endif
    loco_rmtree(dir);
    free(dir);
}

/* ZeRO-3: accepted (the sharded device model; tests/gpu/emu/dp_check.c
 * checks its numbers). */
Test(device_dp, zero3_over_two_ranks_reaches_the_device, .timeout = 60) {
    two_ranks_without_device(3);
}

Test(device_dp, two_ranks_without_device_error_clearly, .timeout = 60) {
    two_ranks_without_device(1);
}
