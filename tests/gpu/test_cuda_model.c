/* The whole GPT-2 on the GPU (inner/model/gpt_cuda.c) against the CPU model, and
 * training through the trainer with train.device = cuda against cpu.
 * One file past 600 lines: every block description (GPT-2, Llama, MoE)
 * and recompute share its CPU reference and its bounds.
 *
 *   model: the tiny fixture model (tests/fixtures/gpt2_tiny.safetensors):
 *     loss and every parameter gradient, fp32 within 1e-5 relative (per
 *     tensor, max |diff| / max |ref|); bf16 (the CPU model run on the same
 *     bf16-rounded weights, the GPU's activations in bf16): the loss within
 *     1e-3, gradients within 2e-2 (the worst tensor, the last c_proj
 *     weight, is at 1.04e-2 on tests/gpu/emu: bf16 activations' rounding
 *     of 2^-9 compounds through two blocks).
 *   descriptions: Llama, a mixed GPT-2, recompute and mixture of experts
 *     (below, each with its bounds).
 *   train: 20 optimizer steps (warm-up, cosine schedule, clipping, AdamW)
 *     on a synthetic shard, every step's loss: fp32 within 1e-4 relative;
 *     bf16 within 2e-2 relative (bf16 activations move each step's loss by
 *     ~1e-3, and the weights drift apart over the steps), and the bf16
 *     loss must fall as the fp32 one does. The checkpoint of the GPU run
 *     holds the device's parameters.
 *
 * Without a device or a CUDA build the GPU tests skip with the reason;
 * the configuration errors are checked everywhere. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "inner/ckpt/ckpt.h"
#include "inner/data/data.h"
#include "inner/model/model.h"
#include "inner/optim/optim.h"
#include "inner/train/train.h"
#include "tests/support.h"

#define FIXTURE "tests/fixtures/gpt2_tiny.safetensors"
/* tests/gpu/emu/run.sh builds this file with fewer steps in CI (20 in
 * `make test-emu`) and a longer timeout (a shared CPU emulates the device). */
#ifndef TRAIN_STEPS
#define TRAIN_STEPS 20
#endif
#ifndef TRAIN_TIMEOUT
#define TRAIN_TIMEOUT 240
#endif
#define TOL_MODEL_LOSS_BF16 1e-3
#define TOL_MODEL_GRAD_BF16 2e-2
#define TOL_TRAIN_F32 1e-4
#define TOL_TRAIN_BF16 2e-2

static void train_config(loco_config *cfg, const char *dir) {
    loco_config_defaults(cfg);
    cfg->model.n_layer = 2;
    cfg->model.n_head = 2;
    cfg->model.n_embd = 32;
    cfg->model.seq_len = 32;
    cfg->train.batch_size = 4;
    cfg->train.steps = TRAIN_STEPS;
    cfg->train.warmup_steps = 3;
    cfg->train.lr = 1e-2;
    cfg->train.grad_clip = 1.0;
    cfg->run.threads = 1;
    cfg->run.log_every = 1000;
    cfg->run.eval_every = 0;
    cfg->data.val[0] = '\0';
    snprintf(cfg->data.train, sizeof cfg->data.train, "%s/train_000000.bin", dir);
    snprintf(cfg->run.dir, sizeof cfg->run.dir, "%s/run", dir);
    loco_log_set_level(LOCO_LOG_WARN);
}

Test(gpu_train, bf16_needs_cuda) {
    char *dir = test_tmpdir("loco-gpu-train");
    loco_config cfg;
    train_config(&cfg, dir);
    snprintf(cfg.train.dtype, sizeof cfg.train.dtype, "bf16");
    loco_trainer *t = NULL;
    cr_assert_eq(loco_trainer_create(&t, &cfg, NULL), LOCO_EINVAL);
    cr_expect(strstr(loco_errmsg(), "train.dtype = bf16 needs train.device = cuda"), "%s",
              loco_errmsg());
    cr_assert_null(t);
    loco_rmtree(dir);
    free(dir);
}

#ifndef LOCO_HAVE_CUDA
Test(gpu_train, cuda_without_cuda_build_is_refused) {
    char *dir = test_tmpdir("loco-gpu-train");
    loco_config cfg;
    train_config(&cfg, dir);
    snprintf(cfg.train.device, sizeof cfg.train.device, "cuda");
    loco_trainer *t = NULL;
    cr_assert_eq(loco_trainer_create(&t, &cfg, NULL), LOCO_ENOTSUP);
    cr_expect(strstr(loco_errmsg(), "built without CUDA"), "%s", loco_errmsg());
    loco_rmtree(dir);
    free(dir);
}

Test(gpu_model, skipped) {
    cr_skip_test("built without the CUDA toolkit (no nvcc found by make): the GPU model and "
                 "train.device = cuda not compiled");
}
#else

#include "tests/gpu/gpu_test.h"

/* ------------------------------------------------------------- model */

static const loco_gpt_config fx_cfg = {
    .n_layer = 2, .n_head = 4, .n_embd = 48, .seq_len = 16, .vocab_size = 97};
enum { FX_B = 3, FX_T = 13 };

/* The device's loss and every parameter gradient (grads, as downloaded)
 * against the CPU model's: fp32 within 1e-5, bf16 within the bounds above. */
static void expect_like_cpu(const loco_gpt *cpu, const float *grads, float loss, float want,
                            bool bf16, const char *what) {
    const double tol = bf16 ? TOL_MODEL_GRAD_BF16 : TOL_F32;
    const double tol_loss = bf16 ? TOL_MODEL_LOSS_BF16 : TOL_F32;
    cr_expect_leq(fabs((double)loss - want), tol_loss * want, "loss: gpu %.7f cpu %.7f", loss,
                  want);
    double worst = 0;
    for (int i = 0; i < loco_gpt_table(cpu)->n; i++) {
        const loco_tensor *t = &loco_gpt_table(cpu)->t[i];
        const double e = rel_err(grads + t->offset, loco_gpt_grads(cpu) + t->offset, t->numel);
        worst = fmax(worst, e);
        cr_expect_leq(e, tol, "%s gradient: rel err %.3g > %.3g", t->name, e, tol);
    }
    cr_log_info("%s %s: loss gpu %.6f cpu %.6f, worst gradient rel err %.3g", what,
                bf16 ? "bf16" : "fp32", loss, want, worst);
}

static void check_model(bool bf16) {
    gpu_require();
    loco_set_threads(2);
    loco_st *fx;
    cr_assert_eq(loco_st_open(&fx, FIXTURE), 0, "%s", loco_errmsg());
    loco_gpt *cpu = NULL;
    cr_assert_eq(loco_gpt_create(&cpu, &fx_cfg, FX_B, FX_T), 0, "%s", loco_errmsg());
    cr_assert_eq(loco_st_read_into(fx, loco_gpt_table(cpu), loco_gpt_params(cpu), NULL), 0, "%s",
                 loco_errmsg());
    const float *tok;
    int64_t shape[4];
    int ndim;
    cr_assert_eq(loco_st_get(fx, "tokens", &tok, &ndim, shape), 0);
    cr_assert(ndim == 2 && shape[0] == FX_B && shape[1] == FX_T + 1);
    int32_t in[FX_B * FX_T], tg[FX_B * FX_T];
    for (int b = 0; b < FX_B; b++)
        for (int t = 0; t < FX_T; t++) {
            in[b * FX_T + t] = (int32_t)tok[b * (FX_T + 1) + t];
            tg[b * FX_T + t] = (int32_t)tok[b * (FX_T + 1) + t + 1];
        }
    const size_t P = loco_gpt_num_params(cpu);
    loco_gpt_cuda *dev;
    GPU_OK(loco_gpt_cuda_create(&dev, &fx_cfg, FX_B, FX_T, bf16));
    GPU_OK(loco_gpt_cuda_upload(dev, loco_gpt_params(cpu), NULL, NULL));
    if (bf16) /* the CPU sees the GPU's bf16 weight copy */
        for (size_t i = 0; i < P; i++)
            loco_gpt_params(cpu)[i] = bf2f(f2bf(loco_gpt_params(cpu)[i]));
    float loss = 0, want = 0, fwd = 0;
    loco_gpt_zero_grad(cpu);
    cr_assert_eq(loco_gpt_forward_backward(cpu, in, tg, FX_B, FX_T, 1.0f, &want), 0);
    GPU_OK(loco_gpt_cuda_zero_grad(dev));
    GPU_OK(loco_gpt_cuda_forward_backward(dev, in, tg, FX_B, FX_T, 1.0f, &loss));
    GPU_OK(loco_gpt_cuda_forward(dev, in, tg, FX_B, FX_T, &fwd));
    float *grads = malloc(P * sizeof *grads);
    cr_assert_not_null(grads);
    GPU_OK(loco_gpt_cuda_download(dev, NULL, grads, NULL, NULL));
    expect_like_cpu(cpu, grads, loss, want, bf16, "model");
    cr_expect_eq(fwd, loss, "forward-only loss %.7f, with backward %.7f", fwd, loss);
    free(grads);
    loco_gpt_cuda_destroy(dev);
    loco_gpt_destroy(cpu);
    loco_st_close(fx);
}

Test(gpu_model, loss_and_gradients_f32, .timeout = 120) { check_model(false); }
Test(gpu_model, loss_and_gradients_bf16, .timeout = 120) { check_model(true); }

/* The Llama block on the device: a tiny random model of each description
 * (Llama: GQA with n_kv_head < n_head, RMSNorm, RoPE, SwiGLU, no biases,
 * untied head; and GPT-2 with RMSNorm, RoPE and GQA mixed in, biases and
 * the tied head kept) against the CPU model: loss and every parameter
 * gradient, fp32 within 1e-5, bf16 within the bounds above. */
static const loco_gpt_config llama_cfg = {.n_layer = 2,
                                          .n_head = 4,
                                          .n_embd = 32,
                                          .seq_len = 8,
                                          .vocab_size = 97,
                                          .norm = LOCO_NORM_RMSNORM,
                                          .pos = LOCO_POS_ROPE,
                                          .mlp = LOCO_MLP_SWIGLU,
                                          .ffn_hidden = 48,
                                          .n_kv_head = 2,
                                          .no_bias = true,
                                          .untied = true,
                                          .norm_eps = 1e-6f};
static const loco_gpt_config mixed_cfg = {.n_layer = 1,
                                          .n_head = 4,
                                          .n_embd = 32,
                                          .seq_len = 8,
                                          .vocab_size = 97,
                                          .norm = LOCO_NORM_RMSNORM,
                                          .pos = LOCO_POS_ROPE,
                                          .n_kv_head = 1};

enum { DESC_B = 2, DESC_T = 8, DESC_N = DESC_B * DESC_T };

/* A CPU model of mc at DESC_B x DESC_T with train seed `seed`'s weights,
 * and random inputs and targets from `tokens`. */
static loco_gpt *random_cpu_model(const loco_gpt_config *mc, uint64_t seed, uint64_t tokens,
                                  int32_t *in, int32_t *tg) {
    gpu_require();
    loco_set_threads(2);
    loco_gpt *cpu = NULL;
    cr_assert_eq(loco_gpt_create(&cpu, mc, DESC_B, DESC_T), 0, "%s", loco_errmsg());
    loco_rng rng;
    loco_rng_seed(&rng, seed);
    loco_gpt_init_weights(cpu, &rng);
    for (int i = 0; i < DESC_N; i++) {
        in[i] = (int32_t)(gpu_splitmix(&tokens) % (uint64_t)mc->vocab_size);
        tg[i] = (int32_t)(gpu_splitmix(&tokens) % (uint64_t)mc->vocab_size);
    }
    return cpu;
}

static void check_description(const loco_gpt_config *mc, bool bf16) {
    enum { B = DESC_B, T = DESC_T };
    int32_t in[DESC_N], tg[DESC_N];
    loco_gpt *cpu = random_cpu_model(mc, 5, 3, in, tg);
    const size_t P = loco_gpt_num_params(cpu);
    loco_gpt_cuda *dev;
    GPU_OK(loco_gpt_cuda_create(&dev, mc, B, T, bf16));
    GPU_OK(loco_gpt_cuda_upload(dev, loco_gpt_params(cpu), NULL, NULL));
    if (bf16) /* the CPU sees the GPU's bf16 weight copy */
        for (size_t i = 0; i < P; i++)
            loco_gpt_params(cpu)[i] = bf2f(f2bf(loco_gpt_params(cpu)[i]));
    float loss = 0, want = 0;
    loco_gpt_zero_grad(cpu);
    cr_assert_eq(loco_gpt_forward_backward(cpu, in, tg, B, T, 1.0f, &want), 0);
    GPU_OK(loco_gpt_cuda_zero_grad(dev));
    GPU_OK(loco_gpt_cuda_forward_backward(dev, in, tg, B, T, 1.0f, &loss));
    float *grads = malloc(P * sizeof *grads);
    cr_assert_not_null(grads);
    GPU_OK(loco_gpt_cuda_download(dev, NULL, grads, NULL, NULL));
    expect_like_cpu(cpu, grads, loss, want, bf16, mc->untied ? "llama" : "mixed");
    free(grads);
    loco_gpt_cuda_destroy(dev);
    loco_gpt_destroy(cpu);
}

Test(gpu_model, llama_f32, .timeout = 120) {
    check_description(&llama_cfg, false);
}
Test(gpu_model, llama_bf16, .timeout = 120) {
    check_description(&llama_cfg, true);
}
Test(gpu_model, gpt2_rmsnorm_rope_gqa_f32, .timeout = 120) {
    check_description(&mixed_cfg, false);
}

/* Two device models of cpu's weights, one keeping everything and one
 * recomputing the first `rerun` blocks, two passes each (the second finds
 * the shared block full of the first's): their losses and gradients
 * (caller frees with free_pair), which must be the same bits. */
static void kept_and_recomputed(const loco_gpt_config *mc, bool bf16, int rerun, loco_gpt *cpu,
                                const int32_t *in, const int32_t *tg, loco_gpt_cuda *dev[2],
                                float loss[2], float *grads[2]) {
    const size_t P = loco_gpt_num_params(cpu);
    for (int k = 0; k < 2; k++) {
        const loco_gpt_cuda_opts o = {
            .bf16 = bf16, .lo = 0, .hi = SIZE_MAX, .rerun = k ? rerun : 0};
        GPU_OK(loco_gpt_cuda_create_with(&dev[k], mc, DESC_B, DESC_T, &o));
        GPU_OK(loco_gpt_cuda_upload(dev[k], loco_gpt_params(cpu), NULL, NULL));
        GPU_OK(loco_gpt_cuda_zero_grad(dev[k]));
        for (int pass = 0; pass < 2; pass++)
            GPU_OK(loco_gpt_cuda_forward_backward(dev[k], in, tg, DESC_B, DESC_T, 0.5f, &loss[k]));
        grads[k] = malloc(P * sizeof(float));
        cr_assert_not_null(grads[k]);
        GPU_OK(loco_gpt_cuda_download(dev[k], NULL, grads[k], NULL, NULL));
    }
    cr_expect_eq(loss[1], loss[0], "loss: recompute %.9g, none %.9g", loss[1], loss[0]);
    cr_expect(!memcmp(grads[0], grads[1], P * sizeof(float)),
              "the recomputed model's gradients differ from the one that kept everything");
}

static void free_pair(loco_gpt_cuda *dev[2], float *grads[2]) {
    for (int k = 0; k < 2; k++) {
        free(grads[k]);
        loco_gpt_cuda_destroy(dev[k]);
    }
}

/* The CPU model's two passes of half the loss on the device's weights
 * (bf16: rounded as the device's copy): their last loss. */
static float cpu_reference(loco_gpt *cpu, bool bf16, const int32_t *in, const int32_t *tg) {
    const size_t P = loco_gpt_num_params(cpu);
    if (bf16)
        for (size_t i = 0; i < P; i++)
            loco_gpt_params(cpu)[i] = bf2f(f2bf(loco_gpt_params(cpu)[i]));
    float want = 0;
    loco_gpt_zero_grad(cpu);
    for (int pass = 0; pass < 2; pass++)
        cr_assert_eq(loco_gpt_forward_backward(cpu, in, tg, DESC_B, DESC_T, 0.5f, &want), 0);
    return want;
}

/* Full recompute on the device (loco_gpt_cuda_opts.rerun): blocks that
 * keep only their output and rerun their forward in the backward give
 * the bits of the model that keeps everything (the same kernels on the
 * same inputs), which holds against the CPU model as above; the
 * activations carved shrink to one shared block plus each block's
 * output. */
static void check_recompute(const loco_gpt_config *mc, bool bf16, int rerun) {
    enum { B = DESC_B, T = DESC_T, N = DESC_N };
    int32_t in[N], tg[N];
    loco_gpt *cpu = random_cpu_model(mc, 9, 4, in, tg);
    loco_gpt_cuda *dev[2];
    float loss[2], *grads[2];
    kept_and_recomputed(mc, bf16, rerun, cpu, in, tg, dev, loss, grads);
    const size_t kept = loco_gpt_cuda_act_bytes(dev[0]), less = loco_gpt_cuda_act_bytes(dev[1]);
    const size_t out = (size_t)N * mc->n_embd * (bf16 ? 2 : 4); /* one block's output */
    const size_t per_block = kept / (size_t)mc->n_layer;
    /* the formula `loco bench memory` prints beside the carve */
    const double formula =
        loco_gpt_device_block_act_formula(mc, B, T, false, bf16, LOCO_RECOMPUTE_NONE);
    cr_expect_eq(kept, (size_t)(formula * mc->n_layer + 0.5),
                 "activations kept: %zu, the formula's %d blocks of %.0f", kept, mc->n_layer,
                 formula);
    cr_expect_eq(less, kept - (size_t)(rerun - 1) * per_block + (size_t)rerun * out,
                 "activations: %zu kept, %zu with %d blocks recomputed", kept, less, rerun);
    /* and the independent reference: the CPU model, as check_description */
    const float want = cpu_reference(cpu, bf16, in, tg);
    expect_like_cpu(cpu, grads[1], loss[1], want, bf16, "recompute");
    free_pair(dev, grads);
    loco_gpt_destroy(cpu);
}

Test(gpu_model, llama_full_recompute_f32, .timeout = 120) {
    check_recompute(&llama_cfg, false, llama_cfg.n_layer);
}
/* GPT-2 in bf16 (the GELU gradient fused into c_proj's GEMM epilogue reads
 * recomputed activations), the first of its 2 blocks only */
Test(gpu_model, gpt2_first_block_recomputed_bf16, .timeout = 120) {
    check_recompute(&fx_cfg, true, 1);
}

/* Mixture of experts on the device (inner/model/gpt_cuda_moe.c) against
 * the CPU model: GPT-2's kind (GELU experts with biases, dropping at
 * capacity 1.25, the load-balancing and z losses) and Mixtral's (the
 * Llama block's SwiGLU experts, a shared expert, dropless), fp32 within
 * 1e-5; two micro-steps (the losses' scale), and with every block
 * recomputed the bits of the model that keeps everything. In bf16 the
 * block computes in fp32 on the bf16 weights, but its input is bf16: a
 * near tie may route a token elsewhere than the CPU does, so bf16 holds
 * the loss only (test_cuda_pp.c and the emulator's runs hold its
 * gradients against one rank's bf16). */
static const loco_gpt_config moe_gpt2_cfg = {.n_layer = 2,
                                             .n_head = 4,
                                             .n_embd = 32,
                                             .seq_len = 8,
                                             .vocab_size = 97,
                                             .n_experts = 4,
                                             .top_k = 2,
                                             .moe_every = 1,
                                             .capacity_factor = 1.25f,
                                             .aux_loss = 0.01f,
                                             .z_loss = 0.001f};

static loco_gpt_config mixtral_cfg(void) {
    loco_gpt_config mc = llama_cfg;
    mc.n_experts = 4;
    mc.top_k = 2;
    mc.moe_every = 1;
    mc.n_shared_experts = 1;
    mc.aux_loss = 0.01f;
    return mc;
}

static void check_moe(const loco_gpt_config *mc, bool bf16) {
    int32_t in[DESC_N], tg[DESC_N];
    loco_gpt *cpu = random_cpu_model(mc, 13, 6, in, tg);
    loco_gpt_cuda *dev[2];
    float loss[2], *grads[2];
    kept_and_recomputed(mc, bf16, mc->n_layer, cpu, in, tg, dev, loss, grads);
    const float want = cpu_reference(cpu, bf16, in, tg);
    if (bf16)
        cr_expect_leq(fabs((double)loss[0] - want), TOL_MODEL_LOSS_BF16 * want,
                      "loss: gpu %.7f cpu %.7f", loss[0], want);
    else
        expect_like_cpu(cpu, grads[0], loss[0], want, false, "moe");
    free_pair(dev, grads);
    loco_gpt_destroy(cpu);
}

Test(gpu_model, moe_gpt2_dropping_f32, .timeout = 120) { check_moe(&moe_gpt2_cfg, false); }
Test(gpu_model, moe_gpt2_bf16, .timeout = 120) { check_moe(&moe_gpt2_cfg, true); }
Test(gpu_model, moe_mixtral_shared_f32, .timeout = 120) {
    const loco_gpt_config mc = mixtral_cfg();
    check_moe(&mc, false);
}

/* The device's routing statistics and biases (the trainer moves them
 * to and from the host model): the biases' count is checked, a dense
 * block has no statistics, and a forward counts what it routed as the
 * CPU model counts it (two micro-batches of N tokens, top-2). */
Test(gpu_model, moe_statistics_and_biases, .timeout = 120) {
    loco_gpt_config mc = mixtral_cfg();
    mc.router_bias_rate = 0.001f;
    mc.moe_every = 2; /* block 1 is MoE, block 0 dense */
    int32_t in[DESC_N], tg[DESC_N];
    loco_gpt *cpu = random_cpu_model(&mc, 3, 2, in, tg);
    loco_gpt_cuda *dev;
    GPU_OK(loco_gpt_cuda_create(&dev, &mc, DESC_B, DESC_T, false));
    GPU_OK(loco_gpt_cuda_upload(dev, loco_gpt_params(cpu), NULL, NULL));
    size_t n;
    float *bias = loco_gpt_router_bias(cpu, &n);
    cr_assert(bias && n == (size_t)mc.n_experts, "%zu biases", n);
    cr_expect_lt(loco_gpt_cuda_set_router_bias(dev, bias, n + 1), 0, "a bias too many");
    bias[1] = 0.5f; /* expert 1 chosen more often */
    GPU_OK(loco_gpt_cuda_set_router_bias(dev, bias, n));
    for (int pass = 0; pass < 2; pass++) {
        GPU_OK(loco_gpt_cuda_forward_backward(dev, in, tg, DESC_B, DESC_T, 0.5f, NULL));
        float l;
        cr_assert_eq(loco_gpt_forward(cpu, in, tg, DESC_B, DESC_T, &l), 0);
    }
    int micro;
    const int64_t *routed;
    int64_t assignments, dropped;
    double aux, z;
    cr_expect_lt(loco_gpt_cuda_moe_stats(dev, 0, &micro, &routed, &assignments, &dropped, &aux,
                                         &z), 0, "a dense block's statistics");
    GPU_OK(loco_gpt_cuda_moe_stats(dev, 1, &micro, &routed, &assignments, &dropped, &aux, &z));
    loco_gpt_moe_stats want;
    loco_gpt_moe_layer(cpu, 0, &want);
    cr_expect_eq(micro, 2);
    cr_expect_eq(assignments, want.assignments);
    cr_expect_eq(dropped, want.dropped);
    for (int e = 0; e < mc.n_experts; e++)
        cr_expect_eq(routed[e], want.routed[e], "expert %d: %lld routed, the CPU %lld", e,
                     (long long)routed[e], (long long)want.routed[e]);
    cr_expect_leq(fabs(aux / micro - want.aux), 1e-5 * fabs(want.aux), "aux %.8g, cpu %.8g",
                  aux / micro, want.aux);
    loco_gpt_cuda_moe_reset(dev);
    GPU_OK(loco_gpt_cuda_moe_stats(dev, 1, &micro, &routed, &assignments, &dropped, &aux, &z));
    cr_expect(micro == 0 && assignments == 0 && routed[1] == 0, "after the reset");
    loco_gpt_cuda_destroy(dev);
    loco_gpt_destroy(cpu);
}

/* The padded vocabulary and the step without host waits: V = 257 (the
 * head runs at 320), two micro-steps per step, clip and AdamW queued on
 * the device (loco_gpt_cuda_clip_adamw), two steps against the CPU model
 * with loco_clip_grad_norm and loco_adamw_step: the summed micro-step
 * losses and the norms within 1e-5, the AdamW moments within 1e-4 and
 * the parameters within 5e-3 (per tensor; the key bias's gradient is 0
 * in exact arithmetic, rounding noise that AdamW normalises to steps of
 * lr, so its sign may differ: 6e-4 seen on tests/gpu/emu); the head's
 * padding rows and side gradient exactly 0 after every step. With
 * train.cuda_graph on: a GPU captures the micro-steps after the first; the
 * emulator cannot capture and must fall back to plain launches without
 * running anything twice. Then a NaN weight: the non-finite norm skips
 * AdamW on the device (moments untouched, opt.t not advanced). */
Test(gpu_model, padded_vocab_steps_f32, .timeout = TRAIN_TIMEOUT) {
    gpu_require();
    loco_set_threads(2);
    const loco_gpt_config mc = {
        .n_layer = 1, .n_head = 2, .n_embd = 32, .seq_len = 8, .vocab_size = 257};
    enum { B = 2, T = 8, N = B * T, ACCUM = 2, STEPS = 2 };
    loco_gpt *cpu = NULL;
    cr_assert_eq(loco_gpt_create(&cpu, &mc, B, T), 0, "%s", loco_errmsg());
    loco_rng rng;
    loco_rng_seed(&rng, 7);
    loco_gpt_init_weights(cpu, &rng);
    const size_t P = loco_gpt_num_params(cpu);
    loco_config cfg;
    loco_config_defaults(&cfg);
    loco_adamw hopt, dopt;
    cr_assert_eq(loco_adamw_init(&hopt, P, &cfg), 0);
    cr_assert_eq(loco_adamw_init(&dopt, P, &cfg), 0);
    loco_gpt_cuda *dev;
    GPU_OK(loco_gpt_cuda_create(&dev, &mc, B, T, false));
    GPU_OK(loco_gpt_cuda_upload(dev, loco_gpt_params(cpu), NULL, NULL));
    loco_gpt_cuda_set_graph(dev, true);
    int vp = 0;
    size_t nonzero = 1;
    GPU_OK(loco_gpt_cuda_padding(dev, &vp, &nonzero));
    cr_assert_eq(vp, 320, "padded vocabulary %d", vp);
    cr_assert_eq(nonzero, 0, "%zu padding values not zero after the upload", nonzero);
    uint64_t s = 11;
    int32_t in[ACCUM][N], tg[ACCUM][N];
    const double max_norm = 0.5, lr = 1e-2;
    for (int step = 0; step < STEPS; step++) {
        for (int a = 0; a < ACCUM; a++)
            for (int i = 0; i < N; i++) {
                in[a][i] = (int32_t)(gpu_splitmix(&s) % 257);
                tg[a][i] = (int32_t)(gpu_splitmix(&s) % 257);
            }
        double want_loss = 0;
        loco_gpt_zero_grad(cpu);
        for (int a = 0; a < ACCUM; a++) {
            float l;
            cr_assert_eq(loco_gpt_forward_backward(cpu, in[a], tg[a], B, T, 1.0f / ACCUM, &l), 0);
            want_loss += l;
        }
        const double want_norm = loco_clip_grad_norm(loco_gpt_grads(cpu), P, max_norm);
        loco_adamw_step(&hopt, loco_gpt_table(cpu), loco_gpt_params(cpu), loco_gpt_grads(cpu),
                        (float)lr);
        GPU_OK(loco_gpt_cuda_zero_grad(dev));
        for (int a = 0; a < ACCUM; a++)
            GPU_OK(loco_gpt_cuda_forward_backward(dev, in[a], tg[a], B, T, 1.0f / ACCUM, NULL));
        double norm = 0, loss = 0;
        GPU_OK(loco_gpt_cuda_clip_adamw(dev, &dopt, (float)lr, max_norm, &norm, &loss));
        cr_expect_leq(fabs(loss - want_loss), TOL_F32 * want_loss, "step %d: loss %.7f cpu %.7f",
                      step + 1, loss, want_loss);
        cr_expect_gt(want_norm, max_norm, "the clip must act");
        cr_expect_leq(fabs(norm - want_norm), TOL_F32 * want_norm, "step %d: norm %.7f cpu %.7f",
                      step + 1, norm, want_norm);
        GPU_OK(loco_gpt_cuda_padding(dev, &vp, &nonzero));
        cr_assert_eq(nonzero, 0, "step %d: %zu padding values not zero", step + 1, nonzero);
    }
    cr_expect_eq(dopt.t, STEPS);
    float *p = malloc(P * 4), *m = malloc(P * 4), *v = malloc(P * 4);
    cr_assert(p && m && v);
    GPU_OK(loco_gpt_cuda_download(dev, p, NULL, m, v));
    for (int i = 0; i < loco_gpt_table(cpu)->n; i++) {
        const loco_tensor *t = &loco_gpt_table(cpu)->t[i];
        const double ep = rel_err(p + t->offset, loco_gpt_params(cpu) + t->offset, t->numel);
        const double em = rel_err(m + t->offset, hopt.m + t->offset, t->numel);
        cr_expect_leq(ep, 5e-3, "%s after %d steps: rel err %.3g", t->name, STEPS, ep);
        cr_expect_leq(em, 1e-4, "%s AdamW m: rel err %.3g", t->name, em);
    }
    /* a non-finite gradient norm: AdamW skipped on the device */
    const int lnf = loco_ttable_find(loco_gpt_table(cpu), "transformer.ln_f.weight");
    cr_assert_geq(lnf, 0);
    p[loco_gpt_table(cpu)->t[lnf].offset] = NAN;
    GPU_OK(loco_gpt_cuda_upload(dev, p, NULL, NULL));
    GPU_OK(loco_gpt_cuda_zero_grad(dev));
    GPU_OK(loco_gpt_cuda_forward_backward(dev, in[0], tg[0], B, T, 1.0f, NULL));
    double norm = 0, loss = 0;
    GPU_OK(loco_gpt_cuda_clip_adamw(dev, &dopt, (float)lr, max_norm, &norm, &loss));
    cr_expect(!isfinite(norm), "norm %g with a NaN weight", norm);
    cr_expect_eq(dopt.t, STEPS, "opt.t advanced over a skipped update");
    float *m2 = malloc(P * 4);
    cr_assert_not_null(m2);
    GPU_OK(loco_gpt_cuda_download(dev, NULL, NULL, m2, NULL));
    cr_expect(!memcmp(m, m2, P * 4), "AdamW moments changed by a skipped update");
    free(p), free(m), free(v), free(m2);
    loco_gpt_cuda_destroy(dev);
    loco_adamw_fini(&hopt);
    loco_adamw_fini(&dopt);
    loco_gpt_destroy(cpu);
}

/* ------------------------------------------------------------- train */

/* A stream a 2-layer model learns within 20 steps: a cycle of 13 tokens,
 * shifted three ways (39 distinct tokens of 256), 32K tokens. Loss falls
 * from ln 256 = 5.53 to about 2.0 at lr 1e-2 on the CPU model. (Runs of 7
 * tokens over all of 0..250, the earlier stream, left 20 steps too few to
 * learn anything: the loss wandered and rose, on the CPU as on the GPU,
 * which the first run on a GPU, 2026-12-04, showed.) */
static void write_shard(const char *dir) {
    enum { N = 1 << 15 };
    int32_t *tok = malloc(N * sizeof *tok);
    cr_assert_not_null(tok);
    for (size_t p = 0; p < N; p++)
        tok[p] = (int32_t)(((p % 13) * 19 + (p / 13 % 3) * 5) % 251);
    char path[512];
    snprintf(path, sizeof path, "%s/train_000000.bin", dir);
    cr_assert_eq(loco_data_write_shard(path, tok, N, 1), 0, "%s", loco_errmsg());
    free(tok);
}

static void train(const loco_config *cfg, float *losses, double *norms) {
    loco_trainer *t;
    cr_assert_eq(loco_trainer_create(&t, cfg, NULL), 0, "%s", loco_errmsg());
    for (int i = 0; i < TRAIN_STEPS; i++) {
        loco_step_stats s;
        cr_assert_eq(loco_trainer_step(t, &s), 0, "step %d: %s", i + 1, loco_errmsg());
        losses[i] = s.loss;
        norms[i] = s.grad_norm;
    }
    if (!strcmp(cfg->train.device, "cuda")) {
        /* the checkpoint holds what the device trained */
        char ck[600];
        snprintf(ck, sizeof ck, "%s/ckpt", cfg->run.dir);
        cr_assert_eq(loco_trainer_save(t, ck), 0, "%s", loco_errmsg());
        const loco_gpt *m = loco_trainer_model(t);
        loco_gpt *back = NULL;
        cr_assert_eq(loco_gpt_create(&back, loco_gpt_cfg(m), 1, 1), 0);
        loco_ckpt_state st;
        cr_assert_eq(loco_ckpt_load(ck, cfg, back, NULL, &st), 0, "%s", loco_errmsg());
        cr_expect_eq(st.step, TRAIN_STEPS);
        cr_expect(!memcmp(loco_gpt_params(back), loco_gpt_params(m),
                          loco_gpt_num_params(m) * sizeof(float)),
                  "the checkpoint's parameters differ from the trainer's");
        loco_gpt_destroy(back);
    }
    loco_trainer_destroy(t);
}

static void check_training(bool bf16, bool llama, bool full) {
    gpu_require();
    char *dir = test_tmpdir("loco-gpu-train");
    write_shard(dir);
    loco_config cfg;
    train_config(&cfg, dir);
    if (llama) { /* the dense Llama block, GQA with one kv head of two */
        snprintf(cfg.model.arch, sizeof cfg.model.arch, "llama");
        cfg.model.n_kv_head = 1;
        cfg.model.ffn_hidden = 48;
    }
    if (full) /* both: the CPU's full recompute gives its usual bits */
        snprintf(cfg.train.recompute, sizeof cfg.train.recompute, "full");
    float cpu[TRAIN_STEPS], gpu[TRAIN_STEPS];
    double cpu_norm[TRAIN_STEPS], gpu_norm[TRAIN_STEPS];
    train(&cfg, cpu, cpu_norm);
    snprintf(cfg.train.device, sizeof cfg.train.device, "cuda");
    snprintf(cfg.train.dtype, sizeof cfg.train.dtype, "%s", bf16 ? "bf16" : "fp32");
    train(&cfg, gpu, gpu_norm);
    const double tol = bf16 ? TOL_TRAIN_BF16 : TOL_TRAIN_F32;
    double worst = 0;
    for (int i = 0; i < TRAIN_STEPS; i++) {
        const double e = fabs((double)gpu[i] - cpu[i]) / cpu[i];
        worst = fmax(worst, e);
        cr_expect_leq(e, tol, "step %d: loss gpu %.6f cpu %.6f (rel %.3g > %.3g)", i + 1,
                      gpu[i], cpu[i], e, tol);
    }
    if (TRAIN_STEPS >= 20 && !llama) /* llama: held to the CPU's steps above */
        cr_expect_lt(gpu[TRAIN_STEPS - 1], gpu[0] - 0.5, "GPU loss %.4f -> %.4f did not fall",
                     gpu[0], gpu[TRAIN_STEPS - 1]);
    cr_log_info("%s%s training: loss cpu %.4f -> %.4f, gpu %.4f -> %.4f, worst rel diff %.3g",
                llama ? "llama " : "", bf16 ? "bf16" : "fp32", cpu[0], cpu[TRAIN_STEPS - 1],
                gpu[0], gpu[TRAIN_STEPS - 1], worst);
    loco_rmtree(dir);
    free(dir);
}

Test(gpu_train, twenty_steps_f32_match_cpu, .timeout = TRAIN_TIMEOUT) {
    check_training(false, false, false);
}
Test(gpu_train, twenty_steps_bf16_match_cpu, .timeout = TRAIN_TIMEOUT) {
    check_training(true, false, false);
}
Test(gpu_train, llama_steps_f32_match_cpu, .timeout = TRAIN_TIMEOUT) {
    check_training(false, true, false);
}
Test(gpu_train, llama_steps_bf16_match_cpu, .timeout = TRAIN_TIMEOUT) {
    check_training(true, true, false);
}
/* train.recompute = full through the trainer on the device */
Test(gpu_train, llama_steps_full_recompute_f32_match_cpu, .timeout = TRAIN_TIMEOUT) {
    check_training(false, true, true);
}

Test(gpu_train, cuda_without_device_is_a_clear_error) {
    int n = 0;
    if (loco_cuda_device_count(&n) == 0)
        cr_skip_test("a device is present: nothing to refuse");
    char *dir = test_tmpdir("loco-gpu-train");
    write_shard(dir);
    loco_config cfg;
    train_config(&cfg, dir);
    snprintf(cfg.train.device, sizeof cfg.train.device, "cuda");
    loco_trainer *t = NULL;
    cr_assert_eq(loco_trainer_create(&t, &cfg, NULL), LOCO_ECUDA);
    cr_expect(strstr(loco_errmsg(), "no CUDA device"), "%s", loco_errmsg());
    cr_assert_null(t);
    loco_rmtree(dir);
    free(dir);
}
#endif
