/* GPT-2 training steps on one GPU with the kernels/cuda twins, bf16: the
 * GPU half of scripts/gpu-check.sh's comparison with PyTorch
 * (bench/pytorch_gpt2.py). Same model as inner/model.c (HF layouts, the
 * flat parameter table of loco_gpt_build_table, tied head), same order of
 * kernels; fp32 master weights, gradients and AdamW state; bf16 weight copy,
 * activations and activation gradients.
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

/* Per layer activations, kept for the backward. */
typedef struct {
    loco_bf16 *ln1, *qkv, *atty, *res2, *ln2, *fch, *fchg, *res3; /* (N,C) .. (N,4C) */
    float *ln1m, *ln1r, *ln2m, *ln2r;                              /* (N) */
    float *lse;                                                    /* (B,NH,T) */
} layer_acts;

typedef struct {
    opts o;
    loco_gpt_config cfg;
    loco_ttable tt;
    loco_cuda_slab *slab;
    loco_blas *blas;
    size_t P;
    float *params, *grads, *m, *v; /* (P) fp32 */
    loco_bf16 *wbf;                /* (P) bf16 copy */
    int32_t *inputs, *targets;     /* (B,T) */
    loco_bf16 *encoded, *lnf, *logits, *scratch_btc;
    float *lnfm, *lnfr, *losses, *attn_scratch;
    layer_acts *la;
    loco_bf16 *dres, *dbtc, *dfchg, *dfch, *dqkv;
} gpu_model;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define SLAB(ptr, count, what)                                                                    \
    LOCO_CHECK(loco_cuda_slab_alloc(g->slab, (void **)&(ptr), (size_t)(count) * sizeof *(ptr),  \
                                    what))

/* Views of one tensor by name in a flat buffer of element size es. */
static void *tensor(const gpu_model *g, void *base, size_t es, const char *name) {
    const int i = loco_ttable_find(&g->tt, name);
    return i < 0 ? NULL : (char *)base + g->tt.t[i].offset * es;
}

static int setup(gpu_model *g) {
    const opts *o = &g->o;
    g->cfg = (loco_gpt_config){.n_layer = o->L, .n_head = o->NH, .n_embd = o->C,
                               .seq_len = o->T, .vocab_size = o->V};
    LOCO_CHECK(loco_gpt_build_table(&g->tt, &g->cfg));
    g->P = g->tt.numel;
    const size_t N = (size_t)o->B * o->T, C = (size_t)o->C, P = g->P;
    const size_t per_layer = N * C * 2 * 16 + N * 4 * 4 + (size_t)o->B * o->NH * o->T * 4;
    /* params, grads, m, v, bf16 copy; tokens; 16 (N,C) bf16 buffers of the
     * step (encoded, ln_f, scratch, dres, dbtc, dfch x4, dfch_gelu x4, dqkv
     * x3); logits; fp32 rows; attention scratch; per layer; slack for the
     * alignment of ~200 ranges */
    const size_t bytes = P * (4 * 4 + 2) + N * 8 + N * C * 2 * 16 + N * (size_t)o->V * 2 +
                         N * 4 * 4 + (size_t)o->B * o->NH * o->T * 4 +
                         (size_t)o->L * per_layer + (16u << 20);
    LOCO_CHECK(loco_cuda_slab_create(&g->slab, bytes));
    LOCO_CHECK(loco_blas_create(&g->blas));
    SLAB(g->params, P, "params");
    SLAB(g->grads, P, "grads");
    SLAB(g->m, P, "adam m");
    SLAB(g->v, P, "adam v");
    SLAB(g->wbf, P, "bf16 weights");
    SLAB(g->inputs, N, "inputs");
    SLAB(g->targets, N, "targets");
    SLAB(g->encoded, N * C, "encoded");
    SLAB(g->lnf, N * C, "ln_f");
    SLAB(g->lnfm, N, "ln_f mean");
    SLAB(g->lnfr, N, "ln_f rstd");
    SLAB(g->logits, N * (size_t)o->V, "logits");
    SLAB(g->losses, N, "losses");
    SLAB(g->scratch_btc, N * C, "projection scratch");
    SLAB(g->attn_scratch, (size_t)o->B * o->NH * o->T, "attention scratch");
    SLAB(g->dres, N * C, "dres");
    SLAB(g->dbtc, N * C, "dbtc");
    SLAB(g->dfchg, N * 4 * C, "dfch_gelu");
    SLAB(g->dfch, N * 4 * C, "dfch");
    SLAB(g->dqkv, N * 3 * C, "dqkv");
    g->la = calloc((size_t)o->L, sizeof *g->la);
    if (!g->la)
        return LOCO_ERR(LOCO_ENOMEM, "layer table");
    for (int l = 0; l < o->L; l++) {
        layer_acts *a = &g->la[l];
        SLAB(a->ln1, N * C, "ln1");
        SLAB(a->qkv, N * 3 * C, "qkv");
        SLAB(a->atty, N * C, "atty");
        SLAB(a->res2, N * C, "residual2");
        SLAB(a->ln2, N * C, "ln2");
        SLAB(a->fch, N * 4 * C, "fch");
        SLAB(a->fchg, N * 4 * C, "fch_gelu");
        SLAB(a->res3, N * C, "residual3");
        SLAB(a->ln1m, N, "ln1 mean");
        SLAB(a->ln1r, N, "ln1 rstd");
        SLAB(a->ln2m, N, "ln2 mean");
        SLAB(a->ln2r, N, "ln2 rstd");
        SLAB(a->lse, (size_t)o->B * o->NH * o->T, "lse");
    }
    /* GPT-2 initialisation: N(0, 0.02) weights (uniform of that std here),
     * residual projections scaled by 1/sqrt(2L), LayerNorm 1/0. */
    float *h = malloc(P * sizeof *h);
    if (!h)
        return LOCO_ERR(LOCO_ENOMEM, "host parameters");
    loco_rng rng;
    loco_rng_seed(&rng, 1337);
    for (int i = 0; i < g->tt.n; i++) {
        const loco_tensor *t = &g->tt.t[i];
        const bool ln = strstr(t->name, "ln_") != NULL;
        const bool proj = strstr(t->name, "c_proj.weight") != NULL;
        const float sd = 0.02f * (proj ? 1.0f / sqrtf(2.0f * (float)o->L) : 1.0f);
        for (size_t k = 0; k < t->numel; k++)
            h[t->offset + k] = t->ndim == 1 ? (ln && strstr(t->name, "weight") ? 1.0f : 0.0f)
                                            : sd * 1.7320508f * (2.0f * loco_rng_uniform(&rng) - 1.0f);
    }
    int rc = loco_cuda_copy(g->params, h, P * 4, NULL);
    free(h);
    LOCO_CHECK(rc);
    LOCO_CHECK(loco_cuda_zero(g->m, P * 4, NULL));
    LOCO_CHECK(loco_cuda_zero(g->v, P * 4, NULL));
    return loco_cuda_cast_bf16(g->wbf, g->params, P, NULL);
}

/* Tokens of step `step`: B*T+1 consecutive ones of the stream. */
static int load_batch(gpu_model *g, const uint16_t *shard, size_t shard_n, int step) {
    const size_t N = (size_t)g->o.B * g->o.T;
    int32_t *tok = malloc((N + 1) * sizeof *tok);
    if (!tok)
        return LOCO_ERR(LOCO_ENOMEM, "batch");
    for (size_t i = 0; i <= N; i++) {
        const size_t p = (size_t)step * N + i;
        if (shard)
            tok[i] = shard[p % shard_n] % (uint32_t)g->o.V;
        else /* a learnable stream: short arithmetic runs */
            tok[i] = (int32_t)(((p / 7) * 31 + (p % 7) * 3) % 997 % (size_t)g->o.V);
    }
    int rc = loco_cuda_copy(g->inputs, tok, N * 4, NULL);
    if (rc == 0)
        rc = loco_cuda_copy(g->targets, tok + 1, N * 4, NULL);
    if (rc == 0)
        rc = loco_cuda_sync(NULL);
    free(tok);
    return rc;
}

/* --profile: steps that wait for the device around every kernel call and
 * add up the time per kind (slower than the timed steps; it says where the
 * time goes). */
enum { P_MATMUL, P_ATTN, P_LN, P_XENT, P_ELEM, P_OPT, P_N };
static const char *const prof_names[P_N] = {"matmul", "attention", "layernorm",
                                           "cross-entropy", "element-wise", "adamw"};
static double g_prof[P_N];
static bool g_profiling;

#define RUN(kind, call)                                                                           \
    do {                                                                                          \
        if (!g_profiling) {                                                                       \
            LOCO_CHECK(call);                                                                     \
            break;                                                                                \
        }                                                                                         \
        LOCO_CHECK(loco_cuda_sync(NULL));                                                         \
        const double t0_ = now();                                                                 \
        LOCO_CHECK(call);                                                                         \
        LOCO_CHECK(loco_cuda_sync(NULL));                                                         \
        g_prof[kind] += now() - t0_;                                                              \
    } while (0)

#define W(name) ((loco_bf16 *)tensor(g, g->wbf, 2, name))
#define G(name) ((float *)tensor(g, g->grads, 4, name))

static int step(gpu_model *g, float *loss, int t) {
    const int B = g->o.B, T = g->o.T, C = g->o.C, NH = g->o.NH, V = g->o.V, L = g->o.L;
    const int N = B * T;
    const size_t nc = (size_t)N * C;
    loco_blas *h = g->blas;
    char n[LOCO_TENSOR_NAME_MAX];
#define LW(suffix) (snprintf(n, sizeof n, "transformer.h.%d.%s", l, suffix), W(n))
#define LG(suffix) (snprintf(n, sizeof n, "transformer.h.%d.%s", l, suffix), G(n))
    /* forward */
    RUN(P_ELEM, loco_cuda_encoder_fwd_bf16(g->encoded, g->inputs, W("transformer.wte.weight"),
                                          W("transformer.wpe.weight"), B, T, C, NULL));
    for (int l = 0; l < L; l++) {
        layer_acts *a = &g->la[l];
        const loco_bf16 *res = l == 0 ? g->encoded : g->la[l - 1].res3;
        RUN(P_LN, loco_cuda_layernorm_fwd_bf16(a->ln1, a->ln1m, a->ln1r, res, LW("ln_1.weight"),
                                                LW("ln_1.bias"), N, C, NULL));
        RUN(P_MATMUL, loco_cuda_matmul_fwd_bf16(h, a->qkv, a->ln1, LW("attn.c_attn.weight"),
                                             LW("attn.c_attn.bias"), N, C, 3 * C, false, NULL));
        RUN(P_ATTN, loco_cuda_attention_fwd_bf16(a->atty, a->lse, a->qkv, B, T, C, NH, NULL));
        RUN(P_MATMUL, loco_cuda_matmul_fwd_bf16(h, g->scratch_btc, a->atty, LW("attn.c_proj.weight"),
                                             LW("attn.c_proj.bias"), N, C, C, false, NULL));
        RUN(P_ELEM, loco_cuda_residual_fwd_bf16(a->res2, res, g->scratch_btc, nc, NULL));
        RUN(P_LN, loco_cuda_layernorm_fwd_bf16(a->ln2, a->ln2m, a->ln2r, a->res2,
                                                LW("ln_2.weight"), LW("ln_2.bias"), N, C, NULL));
        RUN(P_MATMUL, loco_cuda_matmul_gelu_fwd_bf16(h, a->fchg, a->fch, a->ln2, LW("mlp.c_fc.weight"),
                                                  LW("mlp.c_fc.bias"), N, C, 4 * C, NULL));
        RUN(P_MATMUL, loco_cuda_matmul_fwd_bf16(h, g->scratch_btc, a->fchg, LW("mlp.c_proj.weight"),
                                             LW("mlp.c_proj.bias"), N, 4 * C, C, false, NULL));
        RUN(P_ELEM, loco_cuda_residual_fwd_bf16(a->res3, a->res2, g->scratch_btc, nc, NULL));
    }
    const loco_bf16 *last = g->la[L - 1].res3;
    RUN(P_LN, loco_cuda_layernorm_fwd_bf16(g->lnf, g->lnfm, g->lnfr, last,
                                            W("transformer.ln_f.weight"),
                                            W("transformer.ln_f.bias"), N, C, NULL));
    RUN(P_MATMUL, loco_cuda_matmul_fwd_bf16(h, g->logits, g->lnf, W("transformer.wte.weight"), NULL,
                                         N, C, V, true, NULL));
    RUN(P_XENT, loco_cuda_xent_fwd_bwd_bf16(g->losses, g->logits, g->logits, g->targets, N, V,
                                           1.0f / (float)N, NULL));
    /* backward */
    RUN(P_ELEM, loco_cuda_zero(g->grads, g->P * 4, NULL));
    RUN(P_ELEM, loco_cuda_zero(g->dbtc, nc * 2, NULL));
    RUN(P_MATMUL, loco_cuda_matmul_bwd_bf16(h, g->dbtc, G("transformer.wte.weight"), NULL, g->logits,
                                         g->lnf, W("transformer.wte.weight"), N, C, V, true, NULL));
    RUN(P_ELEM, loco_cuda_zero(g->dres, nc * 2, NULL));
    RUN(P_LN, loco_cuda_layernorm_bwd_bf16(g->dres, G("transformer.ln_f.weight"),
                                            G("transformer.ln_f.bias"), g->dbtc, last,
                                            W("transformer.ln_f.weight"), g->lnfm, g->lnfr, N, C,
                                            NULL));
    for (int l = L - 1; l >= 0; l--) {
        layer_acts *a = &g->la[l];
        const loco_bf16 *res = l == 0 ? g->encoded : g->la[l - 1].res3;
        RUN(P_ELEM, loco_cuda_zero(g->dfchg, nc * 4 * 2, NULL));
        RUN(P_MATMUL, loco_cuda_matmul_bwd_bf16(h, g->dfchg, LG("mlp.c_proj.weight"),
                                             LG("mlp.c_proj.bias"), g->dres, a->fchg,
                                             LW("mlp.c_proj.weight"), N, 4 * C, C, false, NULL));
        RUN(P_ELEM, loco_cuda_zero(g->dfch, nc * 4 * 2, NULL));
        RUN(P_ELEM, loco_cuda_gelu_bwd_bf16(g->dfch, a->fch, g->dfchg, nc * 4, NULL));
        RUN(P_ELEM, loco_cuda_zero(g->dbtc, nc * 2, NULL));
        RUN(P_MATMUL, loco_cuda_matmul_bwd_bf16(h, g->dbtc, LG("mlp.c_fc.weight"), LG("mlp.c_fc.bias"),
                                             g->dfch, a->ln2, LW("mlp.c_fc.weight"), N, C, 4 * C,
                                             false, NULL));
        RUN(P_LN, loco_cuda_layernorm_bwd_bf16(g->dres, LG("ln_2.weight"), LG("ln_2.bias"),
                                                g->dbtc, a->res2, LW("ln_2.weight"), a->ln2m,
                                                a->ln2r, N, C, NULL));
        RUN(P_ELEM, loco_cuda_zero(g->dbtc, nc * 2, NULL));
        RUN(P_MATMUL, loco_cuda_matmul_bwd_bf16(h, g->dbtc, LG("attn.c_proj.weight"),
                                             LG("attn.c_proj.bias"), g->dres, a->atty,
                                             LW("attn.c_proj.weight"), N, C, C, false, NULL));
        RUN(P_ELEM, loco_cuda_zero(g->dqkv, nc * 3 * 2, NULL));
        RUN(P_ATTN, loco_cuda_attention_bwd_bf16(g->dqkv, g->attn_scratch, g->dbtc, a->atty, a->qkv,
                                                a->lse, B, T, C, NH, NULL));
        RUN(P_ELEM, loco_cuda_zero(g->dbtc, nc * 2, NULL));
        RUN(P_MATMUL, loco_cuda_matmul_bwd_bf16(h, g->dbtc, LG("attn.c_attn.weight"),
                                             LG("attn.c_attn.bias"), g->dqkv, a->ln1,
                                             LW("attn.c_attn.weight"), N, C, 3 * C, false, NULL));
        RUN(P_LN, loco_cuda_layernorm_bwd_bf16(g->dres, LG("ln_1.weight"), LG("ln_1.bias"),
                                                g->dbtc, res, LW("ln_1.weight"), a->ln1m, a->ln1r,
                                                N, C, NULL));
    }
    RUN(P_ELEM, loco_cuda_encoder_bwd_bf16(G("transformer.wte.weight"), G("transformer.wpe.weight"),
                                          g->dres, g->inputs, B, T, C, NULL));
#undef LW
#undef LG
    /* optimizer: AdamW per tensor (decay on 2-D tensors), then the bf16
     * copy; no norm clipping, as bench/pytorch_gpt2.py */
    for (int i = 0; i < g->tt.n; i++) {
        const loco_tensor *tn = &g->tt.t[i];
        RUN(P_OPT, loco_cuda_adamw_update(g->params + tn->offset, g->grads + tn->offset,
                                          g->m + tn->offset, g->v + tn->offset, tn->numel,
                                          (float)g->o.lr, 0.9f, 0.95f, 1e-8f,
                                          tn->decay ? 0.1f : 0.0f, t, NULL));
    }
    RUN(P_OPT, loco_cuda_cast_bf16(g->wbf, g->params, g->P, NULL));
    /* the mean loss, on the host (part of the step, as a trainer logs it) */
    float *hl = malloc((size_t)N * sizeof *hl);
    if (!hl)
        return LOCO_ERR(LOCO_ENOMEM, "losses");
    int rc = loco_cuda_copy(hl, g->losses, (size_t)N * 4, NULL);
    if (rc == 0)
        rc = loco_cuda_sync(NULL);
    double s = 0;
    for (int i = 0; i < N; i++)
        s += hl[i];
    free(hl);
    *loss = (float)(s / N);
    return rc;
}

static void teardown(gpu_model *g) {
    loco_blas_destroy(g->blas);
    loco_cuda_slab_destroy(g->slab);
    loco_ttable_fini(&g->tt);
    free(g->la);
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
        rc = load_batch(&g, shard, shard_n, s);
        const double t0 = now();
        if (rc == 0)
            rc = step(&g, &loss, s + 1);
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
        g_profiling = true;
        for (int s = 0; rc == 0 && s < g.o.profile; s++) {
            rc = load_batch(&g, shard, shard_n, g.o.warmup + g.o.steps + s);
            if (rc == 0)
                rc = step(&g, &loss, g.o.warmup + g.o.steps + s + 1);
        }
        double total = 0;
        for (int k = 0; k < P_N; k++)
            total += g_prof[k];
        printf("profile (ms per step, each call waited for):");
        for (int k = 0; k < P_N; k++)
            printf(" %s %.1f (%.0f%%)%s", prof_names[k], 1e3 * g_prof[k] / g.o.profile,
                   total > 0 ? 100 * g_prof[k] / total : 0.0, k + 1 < P_N ? "," : "\n");
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
