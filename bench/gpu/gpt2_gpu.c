/* GPT-2 training steps on one GPU with the kernels/cuda twins, bf16: the
 * GPU half of scripts/gpu-check.sh's comparison with PyTorch
 * (bench/pytorch_gpt2.py). The model is the trainer's own device model
 * (inner/gpt_cuda.c, loco_gpt_cuda: the CPU model's layouts and order of
 * kernels); fp32 master weights, gradients and AdamW state; bf16 weight
 * copy, activations and activation gradients.
 *
 * Data: a learnable synthetic token stream (the loss must fall, a cheap
 * sanity check of the whole backward), or an llm.c .bin shard (--data).
 * Prints one line per step, with --profile N the time per kind of kernel
 * over N more steps, and a JSON summary line last:
 *   {"impl": "loco", "tok_per_s": ..., "mfu": ..., ...}
 * MFU uses loco_gpt_flops_per_token (6N + attention) and the device's
 * dense bf16 peak (--peak-tflops, default 989 for H100/H200 SXM). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/core.h"
#include "inner/inner.h"
#include "kernels/kernels.h"

typedef struct {
    int B, T, L, NH, C, V, steps, warmup, profile;
    double peak_tflops, lr;
    const char *data;
} opts;

typedef struct {
    opts o;
    loco_gpt_config cfg;
    size_t P;                  /* parameters */
    loco_gpt_cuda *dev;        /* the model, gradients and AdamW state on the GPU */
    loco_adamw opt;            /* hyper-parameters and step count (moments on the GPU) */
    int32_t *inputs, *targets; /* (B,T) host */
} gpu_model;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The trainer's model (inner/gpt_cuda.c) in bf16, with GPT-2's
 * initialisation from seed 1337 (loco_gpt_init_weights). */
static int setup(gpu_model *g) {
    const opts *o = &g->o;
    g->cfg = (loco_gpt_config){.n_layer = o->L, .n_head = o->NH, .n_embd = o->C,
                               .seq_len = o->T, .vocab_size = o->V};
    const size_t N = (size_t)o->B * o->T;
    g->inputs = malloc(N * sizeof *g->inputs);
    g->targets = malloc(N * sizeof *g->targets);
    if (!g->inputs || !g->targets)
        return LOCO_ERR(LOCO_ENOMEM, "batch");
    /* host parameters only, for the initialisation */
    loco_gpt host;
    LOCO_CHECK(loco_gpt_init_ex(&host, &g->cfg, 1, 1, LOCO_GPT_NO_GRADS | LOCO_GPT_NO_ACTS));
    loco_rng rng;
    loco_rng_seed(&rng, 1337);
    loco_gpt_init_weights(&host, &rng);
    g->P = host.n_params;
    int rc = loco_gpt_cuda_create(&g->dev, &g->cfg, o->B, o->T, true);
    if (rc == 0)
        rc = loco_gpt_cuda_upload(g->dev, host.params, NULL, NULL);
    loco_gpt_fini(&host);
    LOCO_CHECK(rc);
    /* AdamW as bench/pytorch_gpt2.py: betas 0.9/0.95, eps 1e-8, decay 0.1 */
    g->opt = (loco_adamw){.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
    return 0;
}

/* Tokens of step `step`: B*T+1 consecutive ones of the stream. */
static void load_batch(gpu_model *g, const uint16_t *shard, size_t shard_n, int step) {
    const size_t N = (size_t)g->o.B * g->o.T;
    for (size_t i = 0; i <= N; i++) {
        const size_t p = (size_t)step * N + i;
        int32_t tok;
        if (shard)
            tok = shard[p % shard_n] % (uint32_t)g->o.V;
        else /* a learnable stream: short arithmetic runs */
            tok = (int32_t)(((p / 7) * 31 + (p % 7) * 3) % 997 % (size_t)g->o.V);
        if (i < N)
            g->inputs[i] = tok;
        if (i > 0)
            g->targets[i - 1] = tok;
    }
}

/* One training step: forward, backward, AdamW (no clipping, as
 * bench/pytorch_gpt2.py), the mean loss on the host. */
static int step(gpu_model *g, float *loss) {
    LOCO_CHECK(loco_gpt_cuda_zero_grad(g->dev));
    LOCO_CHECK(loco_gpt_cuda_forward_backward(g->dev, g->inputs, g->targets, g->o.B, g->o.T,
                                              1.0f, loss));
    return loco_gpt_cuda_adamw(g->dev, &g->opt, (float)g->o.lr);
}

static void teardown(gpu_model *g) {
    loco_gpt_cuda_destroy(g->dev);
    free(g->inputs);
    free(g->targets);
}

static uint16_t *read_shard(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    int32_t hdr[256];
    uint16_t *tok = NULL;
    if (fread(hdr, 4, 256, f) == 256 && hdr[0] == 20240520 && hdr[2] > 0) {
        tok = malloc((size_t)hdr[2] * 2);
        if (tok && fread(tok, 2, (size_t)hdr[2], f) != (size_t)hdr[2]) {
            free(tok);
            tok = NULL;
        }
        *n = (size_t)hdr[2];
    }
    fclose(f);
    return tok;
}

static void usage(void) {
    fprintf(stderr, "usage: loco-gpu-bench [--batch B] [--seq T] [--layers L] [--heads NH] "
                    "[--embd C] [--vocab V] [--steps N] [--warmup N] [--lr X] "
                    "[--peak-tflops X] [--data shard.bin] [--profile N]\n");
}

int main(int argc, char **argv) {
    gpu_model g;
    memset(&g, 0, sizeof g);
    g.o = (opts){.B = 16, .T = 1024, .L = 12, .NH = 12, .C = 768, .V = 50304, .steps = 20,
                 .warmup = 3, .peak_tflops = 989.0, .lr = 6e-4};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            usage();
            return 2;
        }
        if (!strcmp(a, "--batch")) g.o.B = atoi(v);
        else if (!strcmp(a, "--seq")) g.o.T = atoi(v);
        else if (!strcmp(a, "--layers")) g.o.L = atoi(v);
        else if (!strcmp(a, "--heads")) g.o.NH = atoi(v);
        else if (!strcmp(a, "--embd")) g.o.C = atoi(v);
        else if (!strcmp(a, "--vocab")) g.o.V = atoi(v);
        else if (!strcmp(a, "--steps")) g.o.steps = atoi(v);
        else if (!strcmp(a, "--warmup")) g.o.warmup = atoi(v);
        else if (!strcmp(a, "--lr")) g.o.lr = atof(v);
        else if (!strcmp(a, "--peak-tflops")) g.o.peak_tflops = atof(v);
        else if (!strcmp(a, "--data")) g.o.data = v;
        else if (!strcmp(a, "--profile")) g.o.profile = atoi(v);
        else {
            usage();
            return 2;
        }
        i++;
    }
    int ndev = 0;
    if (loco_cuda_device_count(&ndev) < 0) {
        fprintf(stderr, "loco-gpu-bench: %s\n", loco_errmsg());
        return 1;
    }
    size_t shard_n = 0;
    uint16_t *shard = NULL;
    if (g.o.data && !(shard = read_shard(g.o.data, &shard_n))) {
        fprintf(stderr, "loco-gpu-bench: cannot read llm.c shard %s\n", g.o.data);
        return 1;
    }
    int rc = setup(&g);
    const double tokens = (double)g.o.B * g.o.T;
    double t_sum = 0;
    float first = 0, loss = 0;
    int measured = 0;
    for (int s = 0; rc == 0 && s < g.o.warmup + g.o.steps; s++) {
        load_batch(&g, shard, shard_n, s);
        const double t0 = now();
        rc = step(&g, &loss);
        const double dt = now() - t0;
        if (rc < 0)
            break;
        if (s == 0)
            first = loss;
        if (s >= g.o.warmup) {
            t_sum += dt;
            measured++;
        }
        printf("step %3d  loss %.4f  %.1f ms  %.0f tok/s%s\n", s + 1, loss, dt * 1e3,
               tokens / dt, s < g.o.warmup ? "  (warm-up)" : "");
    }
    if (rc < 0) {
        fprintf(stderr, "loco-gpu-bench: %s\n", loco_errmsg());
        teardown(&g);
        free(shard);
        return 1;
    }
    if (rc == 0 && g.o.profile > 0) {
        double prof[LOCO_PROF_N] = {0};
        loco_gpt_cuda_profile(g.dev, true, prof);
        for (int s = 0; rc == 0 && s < g.o.profile; s++) {
            load_batch(&g, shard, shard_n, g.o.warmup + g.o.steps + s);
            rc = step(&g, &loss);
        }
        loco_gpt_cuda_profile(g.dev, false, NULL);
        double total = 0;
        for (int k = 0; k < LOCO_PROF_N; k++)
            total += prof[k];
        printf("profile (ms per step, each call waited for):");
        for (int k = 0; k < LOCO_PROF_N; k++)
            printf(" %s %.1f (%.0f%%)%s", loco_gpt_cuda_prof_names[k],
                   1e3 * prof[k] / g.o.profile, total > 0 ? 100 * prof[k] / total : 0.0,
                   k + 1 < LOCO_PROF_N ? "," : "\n");
    }
    if (rc < 0) {
        fprintf(stderr, "loco-gpu-bench: %s\n", loco_errmsg());
        teardown(&g);
        free(shard);
        return 1;
    }
    const double tps = measured ? tokens * measured / t_sum : 0.0;
    const double mfu = tps * loco_gpt_flops_per_token(&g.cfg, g.o.T) / (g.o.peak_tflops * 1e12);
    printf("{\"impl\": \"loco\", \"mode\": \"bf16\", \"B\": %d, \"T\": %d, \"params\": %zu, "
           "\"step_ms\": %.2f, \"tok_per_s\": %.0f, \"mfu\": %.4f, \"loss_first\": %.4f, "
           "\"loss_last\": %.4f}\n",
           g.o.B, g.o.T, g.P, measured ? 1e3 * t_sum / measured : 0.0, tps, mfu, first, loss);
    teardown(&g);
    free(shard);
    return loss < first ? 0 : 3; /* a loss that did not fall is a failure */
}
