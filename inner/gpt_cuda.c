/* GPT-2 on one GPU through the kernels/cuda twins (inner.h, "model on a
 * GPU"): the CPU model's passes (model.c) kernel for kernel, over device
 * buffers carved from one slab. One code path serves both precisions: the
 * activations and the weight copy are untyped device pointers, and TWIN()
 * calls the bf16 or the fp32 twin of a kernel (same arguments). Compiled
 * only in a CUDA build. */
#include "inner/inner.h"

#if defined(LOCO_HAVE_CUDA)
#include "kernels/kernels.h"

#include <math.h>
#include <string.h>

const char *const loco_gpt_cuda_prof_names[LOCO_PROF_N] = {
    "matmul", "attention", "layernorm", "cross-entropy", "element-wise", "adamw"};

/* Activations of one block, kept for the backward; element type of the
 * model (bf16 or fp32) unless float. Strided by the capacity B x T. */
typedef struct {
    void *ln1, *qkv, *atty, *res2, *ln2, *fch, *fchg, *res3; /* (N,C) .. (N,4C) */
    float *ln1m, *ln1r, *ln2m, *ln2r;                        /* (N) */
    float *lse;                                              /* (B,NH,T) */
} layer_acts;

struct loco_gpt_cuda {
    loco_gpt_config cfg;
    loco_ttable tt;
    size_t P;
    int B, T;   /* capacity */
    bool bf16;
    size_t es;  /* bytes per activation element: 2 (bf16) or 4 */
    loco_cuda_slab *slab;
    loco_blas *blas;
    float *params, *grads, *m, *v; /* (P) fp32 */
    void *w;                       /* (P) weights the passes read: bf16 copy, or params */
    int32_t *inputs, *targets;     /* (B,T) */
    void *encoded, *lnf, *logits, *scratch; /* (N,C), (N,C), (N,V), (N,C) */
    float *lnfm, *lnfr, *losses;   /* (N) */
    float *attn_scratch;           /* (B,NH,T) */
    double *sumsq;                 /* LOCO_CUDA_SUMSQ_OUT */
    layer_acts *la;                /* (L) */
    void *dres, *dbtc, *dfchg, *dfch, *dqkv; /* (N,C) (N,C) (N,4C) (N,4C) (N,3C) */
    float *host_losses;            /* (N) host */
    bool profiling;
    double *prof;                  /* LOCO_PROF_N, caller-owned */
};

#define TWIN(k, ...)                                                                              \
    (g->bf16 ? loco_cuda_##k##_bf16(__VA_ARGS__) : loco_cuda_##k(__VA_ARGS__))

/* Runs one kernel call; when profiling, waits around it and adds its time
 * to its kind. */
#define RUN(kind, call)                                                                           \
    do {                                                                                          \
        if (!g->profiling) {                                                                      \
            LOCO_CHECK(call);                                                                     \
            break;                                                                                \
        }                                                                                         \
        LOCO_CHECK(loco_cuda_sync(NULL));                                                         \
        const double t0_ = loco_now();                                                            \
        LOCO_CHECK(call);                                                                         \
        LOCO_CHECK(loco_cuda_sync(NULL));                                                         \
        g->prof[kind] += loco_now() - t0_;                                                        \
    } while (0)

#define SLAB(ptr, bytes, what)                                                                    \
    LOCO_CHECK(loco_cuda_slab_alloc(g->slab, (void **)&(ptr), (size_t)(bytes), what))

/* Slab size: the ranges carved in carve() plus alignment slack. */
static size_t slab_bytes(const loco_gpt_cuda *g) {
    const size_t N = (size_t)g->B * g->T, C = (size_t)g->cfg.n_embd, P = g->P, es = g->es;
    const size_t L = (size_t)g->cfg.n_layer, V = (size_t)g->cfg.vocab_size;
    const size_t bnt = (size_t)g->B * g->cfg.n_head * g->T;
    const size_t per_layer = N * C * es * 16 + N * 4 * 4 + bnt * 4;
    const size_t n_ranges = 32 + 13 * L;
    return P * 4 * 4 + (g->bf16 ? P * 2 : 0) + N * 4 * 2 + N * C * es * 16 + N * V * es +
           N * 4 * 3 + bnt * 4 + LOCO_CUDA_SUMSQ_OUT * 8 + L * per_layer + n_ranges * 256;
}

static int carve(loco_gpt_cuda *g) {
    const size_t N = (size_t)g->B * g->T, C = (size_t)g->cfg.n_embd, P = g->P, es = g->es;
    const size_t bnt = (size_t)g->B * g->cfg.n_head * g->T;
    SLAB(g->params, P * 4, "params");
    SLAB(g->grads, P * 4, "grads");
    SLAB(g->m, P * 4, "AdamW m");
    SLAB(g->v, P * 4, "AdamW v");
    if (g->bf16)
        SLAB(g->w, P * 2, "bf16 weights");
    else
        g->w = g->params;
    SLAB(g->inputs, N * 4, "inputs");
    SLAB(g->targets, N * 4, "targets");
    SLAB(g->encoded, N * C * es, "encoded");
    SLAB(g->lnf, N * C * es, "ln_f");
    SLAB(g->lnfm, N * 4, "ln_f mean");
    SLAB(g->lnfr, N * 4, "ln_f rstd");
    SLAB(g->logits, N * (size_t)g->cfg.vocab_size * es, "logits");
    SLAB(g->losses, N * 4, "losses");
    SLAB(g->scratch, N * C * es, "projection scratch");
    SLAB(g->attn_scratch, bnt * 4, "attention scratch");
    SLAB(g->sumsq, LOCO_CUDA_SUMSQ_OUT * 8, "sum of squares");
    SLAB(g->dres, N * C * es, "dres");
    SLAB(g->dbtc, N * C * es, "dbtc");
    SLAB(g->dfchg, N * 4 * C * es, "dfch_gelu");
    SLAB(g->dfch, N * 4 * C * es, "dfch");
    SLAB(g->dqkv, N * 3 * C * es, "dqkv");
    for (int l = 0; l < g->cfg.n_layer; l++) {
        layer_acts *a = &g->la[l];
        SLAB(a->ln1, N * C * es, "ln1");
        SLAB(a->qkv, N * 3 * C * es, "qkv");
        SLAB(a->atty, N * C * es, "atty");
        SLAB(a->res2, N * C * es, "residual2");
        SLAB(a->ln2, N * C * es, "ln2");
        SLAB(a->fch, N * 4 * C * es, "fch");
        SLAB(a->fchg, N * 4 * C * es, "fch_gelu");
        SLAB(a->res3, N * C * es, "residual3");
        SLAB(a->ln1m, N * 4, "ln1 mean");
        SLAB(a->ln1r, N * 4, "ln1 rstd");
        SLAB(a->ln2m, N * 4, "ln2 mean");
        SLAB(a->ln2r, N * 4, "ln2 rstd");
        SLAB(a->lse, bnt * 4, "lse");
    }
    return 0;
}

int loco_gpt_cuda_create(loco_gpt_cuda **out, const loco_gpt_config *cfg, int B, int T,
                         bool bf16) {
    *out = NULL;
    const int hs = cfg->n_head > 0 ? cfg->n_embd / cfg->n_head : 0;
    if (cfg->n_layer < 1 || cfg->n_head < 1 || cfg->n_embd % cfg->n_head || hs > 128 ||
        cfg->vocab_size < 2 || T < 1 || T > cfg->seq_len || B < 1)
        return LOCO_ERR(LOCO_EINVAL,
                        "bad model shape for the GPU: L=%d NH=%d C=%d V=%d maxT=%d for B=%d T=%d "
                        "(head size at most 128)",
                        cfg->n_layer, cfg->n_head, cfg->n_embd, cfg->vocab_size, cfg->seq_len, B,
                        T);
    int n_dev = 0;
    LOCO_CHECK(loco_cuda_device_count(&n_dev));
    loco_gpt_cuda *g = loco_alloc(sizeof *g);
    if (!g)
        return LOCO_ERR(LOCO_ENOMEM, "device model");
    memset(g, 0, sizeof *g);
    int rc;
    g->cfg = *cfg;
    g->B = B;
    g->T = T;
    g->bf16 = bf16;
    g->es = bf16 ? 2 : 4;
    LOCO_CHECK_GOTO(loco_gpt_build_table(&g->tt, cfg), out_fail);
    g->P = g->tt.numel;
    g->la = loco_alloc((size_t)cfg->n_layer * sizeof *g->la);
    g->host_losses = loco_alloc((size_t)B * T * sizeof(float));
    if (!g->la || !g->host_losses) {
        rc = LOCO_ERR(LOCO_ENOMEM, "device model tables");
        goto out_fail;
    }
    LOCO_CHECK_GOTO(loco_cuda_slab_create(&g->slab, slab_bytes(g)), out_fail);
    LOCO_CHECK_GOTO(loco_blas_create(&g->blas), out_fail);
    LOCO_CHECK_GOTO(carve(g), out_fail);
    LOCO_CHECK_GOTO(loco_cuda_zero(g->params, g->P * 4, NULL), out_fail);
    LOCO_CHECK_GOTO(loco_cuda_zero(g->grads, g->P * 4, NULL), out_fail);
    LOCO_CHECK_GOTO(loco_cuda_zero(g->m, g->P * 4, NULL), out_fail);
    LOCO_CHECK_GOTO(loco_cuda_zero(g->v, g->P * 4, NULL), out_fail);
    LOCO_CHECK_GOTO(loco_gpt_cuda_upload(g, NULL, NULL, NULL), out_fail);
    *out = g;
    return 0;
out_fail:
    loco_gpt_cuda_destroy(g);
    return rc;
}

void loco_gpt_cuda_destroy(loco_gpt_cuda *g) {
    if (!g)
        return;
    loco_blas_destroy(g->blas);
    loco_cuda_slab_destroy(g->slab);
    loco_ttable_fini(&g->tt);
    loco_free(g->la);
    loco_free(g->host_losses);
    loco_free(g);
}

size_t loco_gpt_cuda_bytes(const loco_gpt_cuda *g) {
    enum { BLAS_WORKSPACE = 32u << 20 }; /* owned by the loco_blas handle */
    return loco_cuda_slab_size(g->slab) + BLAS_WORKSPACE;
}

int loco_gpt_cuda_upload(loco_gpt_cuda *g, const float *params, const float *m, const float *v) {
    const size_t bytes = g->P * sizeof(float);
    if (params)
        LOCO_CHECK(loco_cuda_copy(g->params, params, bytes, NULL));
    if (m)
        LOCO_CHECK(loco_cuda_copy(g->m, m, bytes, NULL));
    if (v)
        LOCO_CHECK(loco_cuda_copy(g->v, v, bytes, NULL));
    if (g->bf16)
        LOCO_CHECK(loco_cuda_cast_bf16(g->w, g->params, g->P, NULL));
    return loco_cuda_sync(NULL);
}

int loco_gpt_cuda_download(loco_gpt_cuda *g, float *params, float *grads, float *m, float *v) {
    const size_t bytes = g->P * sizeof(float);
    if (params)
        LOCO_CHECK(loco_cuda_copy(params, g->params, bytes, NULL));
    if (grads)
        LOCO_CHECK(loco_cuda_copy(grads, g->grads, bytes, NULL));
    if (m)
        LOCO_CHECK(loco_cuda_copy(m, g->m, bytes, NULL));
    if (v)
        LOCO_CHECK(loco_cuda_copy(v, g->v, bytes, NULL));
    return loco_cuda_sync(NULL);
}

int loco_gpt_cuda_zero_grad(loco_gpt_cuda *g) {
    RUN(LOCO_PROF_ELEM, loco_cuda_zero(g->grads, g->P * sizeof(float), NULL));
    return 0;
}

void loco_gpt_cuda_profile(loco_gpt_cuda *g, bool on, double *secs) {
    g->profiling = on && secs;
    g->prof = on ? secs : NULL;
}

/* Byte offset of a tensor in a flat buffer of element size es. */
static void *tensor(const loco_gpt_cuda *g, void *base, size_t es, const char *name) {
    const int i = loco_ttable_find(&g->tt, name);
    return i < 0 ? NULL : (char *)base + g->tt.t[i].offset * es;
}

#define W(name) tensor(g, g->w, g->es, name)
#define G(name) ((float *)tensor(g, g->grads, 4, name))

/* Checks the batch and copies the tokens to the device. */
static int load_tokens(loco_gpt_cuda *g, const int32_t *inputs, const int32_t *targets, int B,
                       int T) {
    if (B < 1 || T < 1 || B > g->B || T > g->T)
        return LOCO_ERR(LOCO_EINVAL, "batch %dx%d exceeds the device model's capacity %dx%d", B,
                        T, g->B, g->T);
    const int V = g->cfg.vocab_size, N = B * T;
    for (int i = 0; i < N; i++) {
        if (inputs[i] < 0 || inputs[i] >= V)
            return LOCO_ERR(LOCO_EINVAL, "token %d at %d outside the vocabulary [0, %d)",
                            inputs[i], i, V);
        if (targets && (targets[i] < 0 || targets[i] >= V))
            return LOCO_ERR(LOCO_EINVAL, "target %d at %d outside the vocabulary", targets[i], i);
    }
    LOCO_CHECK(loco_cuda_copy(g->inputs, inputs, (size_t)N * 4, NULL));
    if (targets)
        LOCO_CHECK(loco_cuda_copy(g->targets, targets, (size_t)N * 4, NULL));
    return 0;
}

static const void *residual_in(const loco_gpt_cuda *g, int l) {
    return l == 0 ? g->encoded : g->la[l - 1].res3;
}

/* Blocks, ln_f and the tied head: logits (N,V). */
static int forward_body(loco_gpt_cuda *g, int B, int T) {
    const int C = g->cfg.n_embd, NH = g->cfg.n_head, V = g->cfg.vocab_size, L = g->cfg.n_layer;
    const int N = B * T;
    const size_t nc = (size_t)N * C;
    loco_blas *h = g->blas;
    char n[LOCO_TENSOR_NAME_MAX];
#define LW(suffix) (snprintf(n, sizeof n, "transformer.h.%d.%s", l, suffix), W(n))
    RUN(LOCO_PROF_ELEM, TWIN(encoder_fwd, g->encoded, g->inputs, W("transformer.wte.weight"),
                             W("transformer.wpe.weight"), B, T, C, NULL));
    for (int l = 0; l < L; l++) {
        layer_acts *a = &g->la[l];
        const void *res = residual_in(g, l);
        RUN(LOCO_PROF_LN, TWIN(layernorm_fwd, a->ln1, a->ln1m, a->ln1r, res, LW("ln_1.weight"),
                               LW("ln_1.bias"), N, C, NULL));
        RUN(LOCO_PROF_MATMUL, TWIN(matmul_fwd, h, a->qkv, a->ln1, LW("attn.c_attn.weight"),
                                   LW("attn.c_attn.bias"), N, C, 3 * C, false, NULL));
        RUN(LOCO_PROF_ATTN, TWIN(attention_fwd, a->atty, a->lse, a->qkv, B, T, C, NH, NULL));
        RUN(LOCO_PROF_MATMUL, TWIN(matmul_fwd, h, g->scratch, a->atty, LW("attn.c_proj.weight"),
                                   LW("attn.c_proj.bias"), N, C, C, false, NULL));
        RUN(LOCO_PROF_ELEM, TWIN(residual_fwd, a->res2, res, g->scratch, nc, NULL));
        RUN(LOCO_PROF_LN, TWIN(layernorm_fwd, a->ln2, a->ln2m, a->ln2r, a->res2,
                               LW("ln_2.weight"), LW("ln_2.bias"), N, C, NULL));
        RUN(LOCO_PROF_MATMUL, TWIN(matmul_gelu_fwd, h, a->fchg, a->fch, a->ln2,
                                   LW("mlp.c_fc.weight"), LW("mlp.c_fc.bias"), N, C, 4 * C, NULL));
        RUN(LOCO_PROF_MATMUL, TWIN(matmul_fwd, h, g->scratch, a->fchg, LW("mlp.c_proj.weight"),
                                   LW("mlp.c_proj.bias"), N, 4 * C, C, false, NULL));
        RUN(LOCO_PROF_ELEM, TWIN(residual_fwd, a->res3, a->res2, g->scratch, nc, NULL));
    }
#undef LW
    RUN(LOCO_PROF_LN, TWIN(layernorm_fwd, g->lnf, g->lnfm, g->lnfr, g->la[L - 1].res3,
                           W("transformer.ln_f.weight"), W("transformer.ln_f.bias"), N, C, NULL));
    RUN(LOCO_PROF_MATMUL, TWIN(matmul_fwd, h, g->logits, g->lnf, W("transformer.wte.weight"),
                               NULL, N, C, V, true, NULL));
    return 0;
}

/* Cross-entropy (dlogits in place, scaled by dscale) and the mean loss,
 * summed on the host in row order as model.c does. */
static int loss_and_dlogits(loco_gpt_cuda *g, int N, float dscale, float *mean_loss) {
    RUN(LOCO_PROF_XENT, TWIN(xent_fwd_bwd, g->losses, g->logits, g->logits, g->targets, N,
                             g->cfg.vocab_size, dscale, NULL));
    if (!mean_loss)
        return 0;
    LOCO_CHECK(loco_cuda_copy(g->host_losses, g->losses, (size_t)N * 4, NULL));
    LOCO_CHECK(loco_cuda_sync(NULL));
    double s = 0;
    for (int i = 0; i < N; i++)
        s += g->host_losses[i];
    *mean_loss = (float)(s / N);
    return 0;
}

int loco_gpt_cuda_forward(loco_gpt_cuda *g, const int32_t *inputs, const int32_t *targets, int B,
                          int T, float *mean_loss) {
    LOCO_CHECK(load_tokens(g, inputs, targets, B, T));
    LOCO_CHECK(forward_body(g, B, T));
    if (targets)
        LOCO_CHECK(loss_and_dlogits(g, B * T, 0.0f, mean_loss));
    return loco_cuda_sync(NULL);
}

int loco_gpt_cuda_forward_backward(loco_gpt_cuda *g, const int32_t *inputs,
                                   const int32_t *targets, int B, int T, float loss_scale,
                                   float *mean_loss) {
    if (!targets)
        return LOCO_ERR(LOCO_EINVAL, "a backward pass needs targets");
    LOCO_CHECK(load_tokens(g, inputs, targets, B, T));
    LOCO_CHECK(forward_body(g, B, T));
    const int C = g->cfg.n_embd, NH = g->cfg.n_head, V = g->cfg.vocab_size, L = g->cfg.n_layer;
    const int N = B * T;
    const size_t nc = (size_t)N * C, es = g->es;
    loco_blas *h = g->blas;
    LOCO_CHECK(loss_and_dlogits(g, N, loss_scale / (float)N, mean_loss));
    char n[LOCO_TENSOR_NAME_MAX];
#define LW(suffix) (snprintf(n, sizeof n, "transformer.h.%d.%s", l, suffix), W(n))
#define LG(suffix) (snprintf(n, sizeof n, "transformer.h.%d.%s", l, suffix), G(n))
    RUN(LOCO_PROF_ELEM, loco_cuda_zero(g->dbtc, nc * es, NULL));
    RUN(LOCO_PROF_MATMUL, TWIN(matmul_bwd, h, g->dbtc, G("transformer.wte.weight"), NULL,
                               g->logits, g->lnf, W("transformer.wte.weight"), N, C, V, true,
                               NULL));
    RUN(LOCO_PROF_ELEM, loco_cuda_zero(g->dres, nc * es, NULL));
    RUN(LOCO_PROF_LN, TWIN(layernorm_bwd, g->dres, G("transformer.ln_f.weight"),
                           G("transformer.ln_f.bias"), g->dbtc, g->la[L - 1].res3,
                           W("transformer.ln_f.weight"), g->lnfm, g->lnfr, N, C, NULL));
    for (int l = L - 1; l >= 0; l--) {
        layer_acts *a = &g->la[l];
        const void *res = residual_in(g, l);
        /* residual3 = residual2 + fcproj: dres flows to both. */
        RUN(LOCO_PROF_ELEM, loco_cuda_zero(g->dfchg, nc * 4 * es, NULL));
        RUN(LOCO_PROF_MATMUL, TWIN(matmul_bwd, h, g->dfchg, LG("mlp.c_proj.weight"),
                                   LG("mlp.c_proj.bias"), g->dres, a->fchg,
                                   LW("mlp.c_proj.weight"), N, 4 * C, C, false, NULL));
        RUN(LOCO_PROF_ELEM, loco_cuda_zero(g->dfch, nc * 4 * es, NULL));
        RUN(LOCO_PROF_ELEM, TWIN(gelu_bwd, g->dfch, a->fch, g->dfchg, nc * 4, NULL));
        RUN(LOCO_PROF_ELEM, loco_cuda_zero(g->dbtc, nc * es, NULL));
        RUN(LOCO_PROF_MATMUL, TWIN(matmul_bwd, h, g->dbtc, LG("mlp.c_fc.weight"),
                                   LG("mlp.c_fc.bias"), g->dfch, a->ln2, LW("mlp.c_fc.weight"), N,
                                   C, 4 * C, false, NULL));
        RUN(LOCO_PROF_LN, TWIN(layernorm_bwd, g->dres, LG("ln_2.weight"), LG("ln_2.bias"),
                               g->dbtc, a->res2, LW("ln_2.weight"), a->ln2m, a->ln2r, N, C,
                               NULL));
        /* residual2 = res + attproj: dres flows to both. */
        RUN(LOCO_PROF_ELEM, loco_cuda_zero(g->dbtc, nc * es, NULL));
        RUN(LOCO_PROF_MATMUL, TWIN(matmul_bwd, h, g->dbtc, LG("attn.c_proj.weight"),
                                   LG("attn.c_proj.bias"), g->dres, a->atty,
                                   LW("attn.c_proj.weight"), N, C, C, false, NULL));
        RUN(LOCO_PROF_ELEM, loco_cuda_zero(g->dqkv, nc * 3 * es, NULL));
        RUN(LOCO_PROF_ATTN, TWIN(attention_bwd, g->dqkv, g->attn_scratch, g->dbtc, a->atty,
                                 a->qkv, a->lse, B, T, C, NH, NULL));
        RUN(LOCO_PROF_ELEM, loco_cuda_zero(g->dbtc, nc * es, NULL));
        RUN(LOCO_PROF_MATMUL, TWIN(matmul_bwd, h, g->dbtc, LG("attn.c_attn.weight"),
                                   LG("attn.c_attn.bias"), g->dqkv, a->ln1,
                                   LW("attn.c_attn.weight"), N, C, 3 * C, false, NULL));
        RUN(LOCO_PROF_LN, TWIN(layernorm_bwd, g->dres, LG("ln_1.weight"), LG("ln_1.bias"),
                               g->dbtc, res, LW("ln_1.weight"), a->ln1m, a->ln1r, N, C, NULL));
    }
#undef LW
#undef LG
    RUN(LOCO_PROF_ELEM, TWIN(encoder_bwd, G("transformer.wte.weight"),
                             G("transformer.wpe.weight"), g->dres, g->inputs, B, T, C, NULL));
    return loco_cuda_sync(NULL);
}

int loco_gpt_cuda_clip(loco_gpt_cuda *g, double max_norm, double *norm) {
    double sumsq = 0;
    RUN(LOCO_PROF_OPT, loco_cuda_sumsq(g->sumsq, g->grads, g->P, NULL));
    LOCO_CHECK(loco_cuda_copy(&sumsq, g->sumsq, sizeof sumsq, NULL));
    LOCO_CHECK(loco_cuda_sync(NULL));
    *norm = sqrt(sumsq);
    if (max_norm > 0 && *norm > max_norm && isfinite(*norm))
        RUN(LOCO_PROF_OPT, loco_cuda_scale(g->grads, (float)(max_norm / *norm), g->P, NULL));
    return 0;
}

int loco_gpt_cuda_adamw(loco_gpt_cuda *g, loco_adamw *opt, float lr) {
    const int64_t t = opt->t + 1;
    for (int i = 0; i < g->tt.n; i++) {
        const loco_tensor *tn = &g->tt.t[i];
        const float wd = tn->decay ? opt->weight_decay : 0.0f;
        RUN(LOCO_PROF_OPT, loco_cuda_adamw_update(g->params + tn->offset, g->grads + tn->offset,
                                                  g->m + tn->offset, g->v + tn->offset,
                                                  tn->numel, lr, opt->beta1, opt->beta2,
                                                  opt->eps, wd, t, NULL));
    }
    if (g->bf16)
        RUN(LOCO_PROF_OPT, loco_cuda_cast_bf16(g->w, g->params, g->P, NULL));
    LOCO_CHECK(loco_cuda_sync(NULL));
    opt->t = t;
    return 0;
}

#endif /* LOCO_HAVE_CUDA */
