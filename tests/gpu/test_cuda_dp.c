/* train.device = cuda over the nccl backend on one rank (docs/DECISIONS.md,
 * "GPU data parallel"): the trainer's data-parallel device step (gradient
 * buckets all-reduced or reduce-scattered on device pointers, the owned
 * range's AdamW, the parameters all-gathered in place) on the one GPU a
 * machine has, against the plain one-rank device step (backend self):
 * every step's loss and the final parameters within 1e-5 relative, ZeRO 0,
 * 1 and 2. With one rank the collectives move nothing, so this checks the
 * NCCL calls on device buffers, their ordering against the compute stream
 * and the ranged AdamW; two ranks are tests/gpu/emu/dp_check.c (emulator,
 * mpi backend) and scripts/gpu-dp-check.sh (two processes on one GPU).
 * Without a device, or in a build without NCCL, it skips with the reason. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "inner/data/data.h"
#include "inner/model/model.h"
#include "inner/train/train.h"
#include "tests/support.h"

#if defined(LOCO_HAVE_CUDA)
#include "tests/gpu/gpu_test.h"

#define STEPS 4
#define TOL 1e-5

static void dp_config(loco_config *cfg, const char *dir, const char *backend, int zero) {
    loco_config_defaults(cfg);
    cfg->model.n_layer = 2;
    cfg->model.n_head = 2;
    cfg->model.n_embd = 32;
    cfg->model.seq_len = 32;
    cfg->train.batch_size = 4;
    cfg->train.steps = STEPS;
    cfg->train.warmup_steps = 2;
    cfg->train.lr = 1e-2;
    cfg->train.grad_clip = 0.5;
    cfg->parallel.zero_stage = zero;
    cfg->parallel.bucket_mb = 0.004; /* several buckets */
    cfg->run.threads = 1;
    cfg->run.log_every = 1000;
    cfg->run.eval_every = 0;
    cfg->data.val[0] = '\0';
    snprintf(cfg->train.device, sizeof cfg->train.device, "cuda");
    snprintf(cfg->parallel.backend, sizeof cfg->parallel.backend, "%s", backend);
    snprintf(cfg->data.train, sizeof cfg->data.train, "%s/train_000000.bin", dir);
    snprintf(cfg->run.dir, sizeof cfg->run.dir, "%s/run-%s-%d", dir, backend, zero);
    loco_log_set_level(LOCO_LOG_WARN);
}

static void dp_shard(const char *dir) {
    enum { N = 1 << 15 };
    int32_t *tok = malloc(N * sizeof *tok);
    cr_assert_not_null(tok);
    for (size_t p = 0; p < N; p++)
        tok[p] = (int32_t)(((p / 7) * 31 + (p % 7) * 3) % 251);
    char path[512];
    snprintf(path, sizeof path, "%s/train_000000.bin", dir);
    cr_assert_eq(loco_data_write_shard(path, tok, N, 1), 0, "%s", loco_errmsg());
    free(tok);
}

/* STEPS steps; the losses, and the final parameters (caller frees). */
static float *dp_train(const loco_config *cfg, float *losses, size_t *n) {
    loco_trainer *t;
    cr_assert_eq(loco_trainer_create(&t, cfg, NULL), 0, "%s: %s", cfg->parallel.backend,
                 loco_errmsg());
    for (int i = 0; i < STEPS; i++) {
        loco_step_stats s;
        cr_assert_eq(loco_trainer_step(t, &s), 0, "step %d: %s", i + 1, loco_errmsg());
        losses[i] = s.loss;
    }
    const loco_gpt *m = loco_trainer_model(t);
    float *p = malloc(loco_gpt_num_params(m) * sizeof(float));
    cr_assert_not_null(p);
    memcpy(p, loco_gpt_params(m), loco_gpt_num_params(m) * sizeof(float));
    *n = loco_gpt_num_params(m);
    loco_trainer_destroy(t);
    return p;
}

static void check_nccl(int zero) {
    gpu_require();
#if !defined(LOCO_HAVE_NCCL)
    cr_skip_test("built without NCCL (nccl.h not found by make): parallel.backend = nccl absent");
#endif
    char *dir = test_tmpdir("loco-gpu-dp");
    dp_shard(dir);
    loco_config cfg;
    float ref[STEPS], got[STEPS];
    size_t n_ref, n_got;
    dp_config(&cfg, dir, "self", zero);
    float *p_ref = dp_train(&cfg, ref, &n_ref);
    dp_config(&cfg, dir, "nccl", zero);
    float *p_got = dp_train(&cfg, got, &n_got);
    double worst = 0;
    for (int i = 0; i < STEPS; i++) {
        const double e = fabs((double)got[i] - ref[i]) / ref[i];
        worst = fmax(worst, e);
        cr_expect_leq(e, TOL, "ZeRO-%d step %d: loss nccl %.7f, self %.7f", zero, i + 1, got[i],
                      ref[i]);
    }
    cr_assert_eq(n_got, n_ref);
    double d = 0, r = 0;
    for (size_t i = 0; i < n_ref; i++) {
        d = fmax(d, fabs((double)p_got[i] - p_ref[i]));
        r = fmax(r, fabs((double)p_ref[i]));
    }
    cr_expect_leq(d, TOL * r, "ZeRO-%d: parameters differ by %.3g relative", zero, d / r);
    cr_log_info("nccl one rank ZeRO-%d: loss %.4f -> %.4f, worst rel diff %.3g, params %.3g",
                zero, got[0], got[STEPS - 1], worst, d / r);
    free(p_ref);
    free(p_got);
    loco_rmtree(dir);
    free(dir);
}

Test(gpu_dp, nccl_one_rank_zero0_matches_device, .timeout = 120) { check_nccl(0); }
Test(gpu_dp, nccl_one_rank_zero1_matches_device, .timeout = 120) { check_nccl(1); }
Test(gpu_dp, nccl_one_rank_zero2_matches_device, .timeout = 120) { check_nccl(2); }

#else
Test(gpu_dp, skipped) {
    cr_skip_test("built without the CUDA toolkit (no nvcc found by make): train.device = cuda "
                 "over nccl not compiled");
}
#endif
