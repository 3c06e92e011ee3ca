/* GPT-2 forward and backward over flat buffers (llm.c's structure, Hugging
 * Face's names and layouts). Every loop lives in kernels/. */
#include "inner/inner.h"
#include "kernels/kernels.h"

#include <math.h>
#include <string.h>

loco_gpt_config loco_gpt_config_from(const loco_config *cfg) {
    loco_gpt_config c = {
        .n_layer = (int)cfg->model.n_layer,
        .n_head = (int)cfg->model.n_head,
        .n_embd = (int)cfg->model.n_embd,
        .seq_len = (int)cfg->model.seq_len,
        .vocab_size = (int)cfg->model.vocab_size,
    };
    return c;
}

static int tp_of(const loco_gpt_config *cfg) { return cfg->tp > 1 ? cfg->tp : 1; }

int loco_gpt_vocab_padded(const loco_gpt_config *cfg) {
    const int t = tp_of(cfg);
    return (cfg->vocab_size + t - 1) / t * t;
}

int loco_gpt_build_table(loco_ttable *tt, const loco_gpt_config *cfg) {
    const int t = tp_of(cfg);
    if (cfg->n_head % t || (4 * (int64_t)cfg->n_embd) % t)
        return LOCO_ERR(LOCO_EINVAL,
                        "parallel.tp = %d must divide model.n_head (%d) and 4 x model.n_embd "
                        "(%lld): Megatron tensor parallelism splits whole heads and MLP columns",
                        t, cfg->n_head, 4 * (long long)cfg->n_embd);
    const int64_t C = cfg->n_embd, maxT = cfg->seq_len;
    const int64_t Vl = loco_gpt_vocab_padded(cfg) / t, Cl = C / t, Fl = 4 * C / t;
    loco_ttable_init(tt);
    /* split_dim: the dimension Megatron-style tensor parallelism splits —
     * columns of c_attn/c_fc (dim 1 in Conv1D layout), rows of the output
     * projections (dim 0), vocabulary rows of wte. The shapes are the slice
     * one tp rank holds (the whole tensor when tp = 1). */
    int rc;
#define ADD1(name, n0, split, decay)                                                               \
    LOCO_CHECK_GOTO(loco_ttable_add(tt, name, 1, (int64_t[]){n0}, split, decay), out_fail)
#define ADD2(name, n0, n1, split)                                                                  \
    LOCO_CHECK_GOTO(loco_ttable_add(tt, name, 2, (int64_t[]){n0, n1}, split, true), out_fail)
    ADD2("transformer.wte.weight", Vl, C, 0);
    ADD2("transformer.wpe.weight", maxT, C, -1);
    for (int l = 0; l < cfg->n_layer; l++) {
        char n[LOCO_TENSOR_NAME_MAX];
#define NAME(suffix) (snprintf(n, sizeof n, "transformer.h.%d.%s", l, suffix), n)
        ADD1(NAME("ln_1.weight"), C, -1, false);
        ADD1(NAME("ln_1.bias"), C, -1, false);
        ADD2(NAME("attn.c_attn.weight"), C, 3 * Cl, 1);
        tt->t[tt->n - 1].split_parts = 3; /* q, k and v each split by heads */
        ADD1(NAME("attn.c_attn.bias"), 3 * Cl, 0, false);
        tt->t[tt->n - 1].split_parts = 3;
        ADD2(NAME("attn.c_proj.weight"), Cl, C, 0);
        ADD1(NAME("attn.c_proj.bias"), C, -1, false);
        ADD1(NAME("ln_2.weight"), C, -1, false);
        ADD1(NAME("ln_2.bias"), C, -1, false);
        ADD2(NAME("mlp.c_fc.weight"), C, Fl, 1);
        ADD1(NAME("mlp.c_fc.bias"), Fl, 0, false);
        ADD2(NAME("mlp.c_proj.weight"), Fl, C, 0);
        ADD1(NAME("mlp.c_proj.bias"), C, -1, false);
#undef NAME
    }
    ADD1("transformer.ln_f.weight", C, -1, false);
    ADD1("transformer.ln_f.bias", C, -1, false);
#undef ADD1
#undef ADD2
    return 0;
out_fail:
    loco_ttable_fini(tt);
    return rc;
}

/* Extent of gt's split dimension over all t ranks: rounded up to t parts
 * (only wte's vocabulary ever needs it; the rest divide exactly). */
static size_t tp_extent(const loco_tensor *gt, int t) {
    const size_t n = (size_t)gt->shape[gt->split_dim], q = (size_t)t * (size_t)gt->split_parts;
    return (n + q - 1) / q * q;
}

/* Row-major strides of gt's split dimension: elements after it (inner)
 * and the size of the tensor's trailing block from it on. */
static void split_strides(const loco_tensor *gt, size_t *inner) {
    *inner = 1;
    for (int d = gt->split_dim + 1; d < gt->ndim; d++)
        *inner *= (size_t)gt->shape[d];
}

void loco_gpt_tp_locate(const loco_tensor *gt, int t, size_t g, int *rank, size_t *j) {
    if (gt->split_dim < 0 || t <= 1) {
        *rank = t <= 1 ? 0 : -1;
        *j = g;
        return;
    }
    size_t inner;
    split_strides(gt, &inner);
    const size_t n = (size_t)gt->shape[gt->split_dim], ext = tp_extent(gt, t);
    const size_t parts = (size_t)gt->split_parts, part_len = ext / parts, chunk = part_len / t;
    const size_t outer = g / (inner * n), x = g / inner % n, in = g % inner;
    const size_t part = x / part_len, r = x % part_len;
    const size_t xl = part * chunk + r % chunk, nl = ext / (size_t)t;
    *rank = (int)(r / chunk);
    *j = (outer * nl + xl) * inner + in;
}

bool loco_gpt_tp_global(const loco_tensor *gt, int t, int k, size_t j, size_t *g) {
    if (gt->split_dim < 0 || t <= 1) {
        *g = j;
        return true;
    }
    size_t inner;
    split_strides(gt, &inner);
    const size_t n = (size_t)gt->shape[gt->split_dim], ext = tp_extent(gt, t);
    const size_t parts = (size_t)gt->split_parts, chunk = ext / parts / (size_t)t;
    const size_t nl = ext / (size_t)t;
    const size_t outer = j / (inner * nl), xl = j / inner % nl, in = j % inner;
    const size_t x = xl / chunk * (ext / parts) + (size_t)k * chunk + xl % chunk;
    if (x >= n)
        return false;
    *g = (outer * n + x) * inner + in;
    return true;
}

int loco_gpt_num_units(const loco_gpt *m) { return m->cfg.n_layer + 2; }

/* Tensor indices [*first, *last) of a unit in the table. */
static void unit_tensors(const loco_gpt *m, int unit, int *first, int *last) {
    const int L = m->cfg.n_layer;
    if (unit == 0) {
        *first = 0, *last = 2;
    } else if (unit <= L) {
        *first = 2 + 12 * (unit - 1), *last = *first + 12;
    } else {
        *first = 2 + 12 * L, *last = *first + 2;
    }
}

void loco_gpt_unit_range(const loco_gpt *m, int unit, size_t *lo, size_t *hi) {
    int first, last;
    unit_tensors(m, unit, &first, &last);
    *lo = m->tt.t[first].offset;
    *hi = m->tt.t[last - 1].offset + m->tt.t[last - 1].numel;
}

/* Points one unit's views of `v` at base, which holds the unit's range. */
static void bind_views(loco_gpt *m, loco_gpt_tensors *v, int unit, float *base) {
    int i, last;
    unit_tensors(m, unit, &i, &last);
    const size_t lo = m->tt.t[i].offset;
#define NEXT (base + (m->tt.t[i++].offset - lo))
    if (unit == 0) {
        v->wte = NEXT;
        v->wpe = NEXT;
    } else if (unit <= m->cfg.n_layer) {
        loco_gpt_block *b = &v->h[unit - 1];
        b->ln1w = NEXT;
        b->ln1b = NEXT;
        b->qkvw = NEXT;
        b->qkvb = NEXT;
        b->attprojw = NEXT;
        b->attprojb = NEXT;
        b->ln2w = NEXT;
        b->ln2b = NEXT;
        b->fcw = NEXT;
        b->fcb = NEXT;
        b->fcprojw = NEXT;
        b->fcprojb = NEXT;
    } else {
        v->lnfw = NEXT;
        v->lnfb = NEXT;
    }
#undef NEXT
}

void loco_gpt_bind_unit(loco_gpt *m, int unit, float *params, float *grads) {
    bind_views(m, &m->p, unit, params);
    if (grads)
        bind_views(m, &m->g, unit, grads);
}

void loco_gpt_set_hooks(loco_gpt *m, const loco_gpt_hooks *hooks) {
    if (hooks)
        m->hooks = *hooks;
    else
        memset(&m->hooks, 0, sizeof m->hooks);
}

static int acquire(loco_gpt *m, int unit, bool backward) {
    return m->hooks.acquire ? m->hooks.acquire(m->hooks.ctx, m, unit, backward) : 0;
}
static int release(loco_gpt *m, int unit, bool backward) {
    return m->hooks.release ? m->hooks.release(m->hooks.ctx, m, unit, backward) : 0;
}
static int grads_ready(loco_gpt *m, int unit) {
    return m->hooks.grads_ready ? m->hooks.grads_ready(m->hooks.ctx, m, unit) : 0;
}

/* Carves the activation slab; with base NULL only counts. Returns floats. */
static size_t carve_acts(loco_gpt *m, float *base) {
    const size_t L = (size_t)m->cfg.n_layer, B = (size_t)m->B, T = (size_t)m->T;
    const size_t C = (size_t)m->cfg.n_embd, NH = (size_t)m->cfg.n_head;
    const size_t V = (size_t)m->cfg.vocab_size, BT = B * T;
    size_t off = 0;
#define CARVE(field, count)                                                                        \
    do {                                                                                           \
        if (base)                                                                                  \
            field = base + off;                                                                    \
        off += ((size_t)(count) + 15) & ~(size_t)15; /* keep 64-byte alignment */                 \
    } while (0)
    loco_gpt_acts *a = &m->a;
    CARVE(a->encoded, BT * C);
    CARVE(a->ln1, L * BT * C);
    CARVE(a->ln1_mean, L * BT);
    CARVE(a->ln1_rstd, L * BT);
    CARVE(a->qkv, L * BT * 3 * C);
    CARVE(a->atty, L * BT * C);
    CARVE(a->att, L * B * NH * T * T);
    CARVE(a->attproj, L * BT * C);
    CARVE(a->residual2, L * BT * C);
    CARVE(a->ln2, L * BT * C);
    CARVE(a->ln2_mean, L * BT);
    CARVE(a->ln2_rstd, L * BT);
    CARVE(a->fch, L * BT * 4 * C);
    CARVE(a->fch_gelu, L * BT * 4 * C);
    CARVE(a->fcproj, L * BT * C);
    CARVE(a->residual3, L * BT * C);
    CARVE(a->lnf, BT * C);
    CARVE(a->lnf_mean, BT);
    CARVE(a->lnf_rstd, BT);
    CARVE(a->logits, BT * V);
    CARVE(a->losses, BT);
    loco_gpt_scratch *s = &m->s;
    CARVE(s->dres, BT * C);
    CARVE(s->dbtc, BT * C);
    CARVE(s->dqkv, BT * 3 * C);
    CARVE(s->datt, B * NH * T * T);
    CARVE(s->dfch, BT * 4 * C);
    CARVE(s->dfchg, BT * 4 * C);
#undef CARVE
    return off;
}

int loco_gpt_init(loco_gpt *m, const loco_gpt_config *cfg, int B, int T) {
    return loco_gpt_init_ex(m, cfg, B, T, 0);
}

int loco_gpt_init_ex(loco_gpt *m, const loco_gpt_config *cfg, int B, int T, unsigned flags) {
    memset(m, 0, sizeof *m);
    if (cfg->n_layer < 1 || cfg->n_head < 1 || cfg->n_embd % cfg->n_head || cfg->vocab_size < 2 ||
        T < 1 || T > cfg->seq_len || B < 1)
        return LOCO_ERR(LOCO_EINVAL,
                        "bad model shape: L=%d NH=%d C=%d V=%d maxT=%d for B=%d T=%d",
                        cfg->n_layer, cfg->n_head, cfg->n_embd, cfg->vocab_size, cfg->seq_len, B,
                        T);
    m->cfg = *cfg;
    m->B = B;
    m->T = T;
    int rc;
    LOCO_CHECK_GOTO(loco_gpt_build_table(&m->tt, cfg), out_fail);
    m->n_params = m->tt.numel;
    bool want_p = !(flags & LOCO_GPT_NO_PARAMS), want_g = !(flags & LOCO_GPT_NO_GRADS);
    if (want_p)
        m->params = loco_alloc(m->n_params * sizeof(float));
    if (want_g)
        m->grads = loco_alloc(m->n_params * sizeof(float));
    m->p.h = loco_alloc((size_t)cfg->n_layer * sizeof(loco_gpt_block));
    m->g.h = loco_alloc((size_t)cfg->n_layer * sizeof(loco_gpt_block));
    const bool want_a = !(flags & LOCO_GPT_NO_ACTS);
    size_t n_act = want_a ? carve_acts(m, NULL) : 0;
    m->act_bytes = n_act * sizeof(float);
    if (want_a)
        m->act_slab = loco_alloc(m->act_bytes);
    if ((want_p && !m->params) || (want_g && !m->grads) || !m->p.h || !m->g.h ||
        (want_a && !m->act_slab)) {
        rc = LOCO_ERR(LOCO_ENOMEM, "model of %zu parameters and %zu activation floats",
                      m->n_params, n_act);
        goto out_fail;
    }
    if (want_a)
        carve_acts(m, m->act_slab);
    for (int u = 0; u < loco_gpt_num_units(m); u++) {
        size_t lo, hi;
        loco_gpt_unit_range(m, u, &lo, &hi);
        if (m->params)
            bind_views(m, &m->p, u, m->params + lo);
        if (m->grads)
            bind_views(m, &m->g, u, m->grads + lo);
    }
    return 0;
out_fail:
    loco_gpt_fini(m);
    return rc;
}

void loco_gpt_fini(loco_gpt *m) {
    loco_ttable_fini(&m->tt);
    loco_free(m->params);
    loco_free(m->grads);
    loco_free(m->p.h);
    loco_free(m->g.h);
    loco_free(m->act_slab);
    memset(m, 0, sizeof *m);
}

void loco_gpt_init_weights_range(const loco_gpt *m, loco_rng *rng, float *dst, size_t lo,
                                 size_t hi) {
    const float std = 0.02f;
    const float proj_std = std / sqrtf(2.0f * (float)m->cfg.n_layer);
    for (int i = 0; i < m->tt.n; i++) {
        const loco_tensor *t = &m->tt.t[i];
        const char *name = t->name;
        size_t len = strlen(name);
        bool is_weight = len > 7 && !strcmp(name + len - 7, ".weight");
        bool is_ln = strstr(name, ".ln_") != NULL;
        for (size_t j = 0; j < t->numel; j++) {
            float v;
            if (t->ndim == 2) /* every 2-D tensor draws, kept or not */
                v = (strstr(name, "c_proj.weight") ? proj_std : std) * loco_rng_normal(rng);
            else
                v = (is_ln && is_weight) ? 1.0f : 0.0f;
            size_t k = t->offset + j;
            if (k >= lo && k < hi)
                dst[k - lo] = v;
        }
    }
}

void loco_gpt_init_weights(loco_gpt *m, loco_rng *rng) {
    loco_gpt_init_weights_range(m, rng, m->params, 0, m->n_params);
}

void loco_gpt_zero_grad(loco_gpt *m) {
    if (m->grads)
        memset(m->grads, 0, m->n_params * sizeof(float));
}

static int check_batch(const loco_gpt *m, const int32_t *inputs, int B, int T) {
    if (!m->act_slab)
        return LOCO_ERR(LOCO_EINVAL, "this model holds no activations (LOCO_GPT_NO_ACTS: its "
                                     "passes run on the device)");
    if (B < 1 || T < 1 || B > m->B || T > m->T)
        return LOCO_ERR(LOCO_EINVAL, "batch %dx%d exceeds the model's capacity %dx%d", B, T, m->B,
                        m->T);
    for (int i = 0; i < B * T; i++)
        if (inputs[i] < 0 || inputs[i] >= m->cfg.vocab_size)
            return LOCO_ERR(LOCO_EINVAL, "token %d at %d outside the vocabulary [0, %d)",
                            inputs[i], i, m->cfg.vocab_size);
    return 0;
}

/* Forward through the blocks and the final LayerNorm and head: a.logits. */
static int forward_body(loco_gpt *m, const int32_t *inputs, int B, int T) {
    const int C = m->cfg.n_embd, NH = m->cfg.n_head, V = m->cfg.vocab_size;
    const int N = B * T;
    /* Per-layer activations are strided by the capacity, so that a smaller
     * batch (eval, sampling) uses the same slab. */
    const size_t cap = (size_t)m->B * (size_t)m->T;
    loco_gpt_acts *a = &m->a;
    const int L = m->cfg.n_layer;
    LOCO_CHECK(acquire(m, 0, false));
    loco_encoder_fwd(a->encoded, inputs, m->p.wte, m->p.wpe, B, T, C);
    for (int l = 0; l < L; l++) {
        LOCO_CHECK(acquire(m, l + 1, false));
        const loco_gpt_block *w = &m->p.h[l];
        const float *res = l == 0 ? a->encoded : a->residual3 + (size_t)(l - 1) * cap * C;
        float *ln1 = a->ln1 + l * cap * C, *ln1m = a->ln1_mean + l * cap;
        float *ln1r = a->ln1_rstd + l * cap, *qkv = a->qkv + l * cap * 3 * C;
        float *atty = a->atty + l * cap * C, *att = a->att + l * cap * NH * m->T;
        float *attproj = a->attproj + l * cap * C, *res2 = a->residual2 + l * cap * C;
        float *ln2 = a->ln2 + l * cap * C, *ln2m = a->ln2_mean + l * cap;
        float *ln2r = a->ln2_rstd + l * cap, *fch = a->fch + l * cap * 4 * C;
        float *fchg = a->fch_gelu + l * cap * 4 * C, *fcproj = a->fcproj + l * cap * C;
        float *res3 = a->residual3 + l * cap * C;
        loco_layernorm_fwd(ln1, ln1m, ln1r, res, w->ln1w, w->ln1b, N, C);
        loco_matmul_fwd(qkv, ln1, w->qkvw, w->qkvb, N, C, 3 * C, false);
        loco_attention_fwd(atty, att, qkv, B, T, C, NH);
        loco_matmul_fwd(attproj, atty, w->attprojw, w->attprojb, N, C, C, false);
        loco_residual_fwd(res2, res, attproj, (size_t)N * C);
        loco_layernorm_fwd(ln2, ln2m, ln2r, res2, w->ln2w, w->ln2b, N, C);
        loco_matmul_fwd(fch, ln2, w->fcw, w->fcb, N, C, 4 * C, false);
        loco_gelu_fwd(fchg, fch, (size_t)N * 4 * C);
        loco_matmul_fwd(fcproj, fchg, w->fcprojw, w->fcprojb, N, 4 * C, C, false);
        loco_residual_fwd(res3, res2, fcproj, (size_t)N * C);
        LOCO_CHECK(release(m, l + 1, false));
    }
    const float *last = a->residual3 + (size_t)(L - 1) * cap * C;
    LOCO_CHECK(acquire(m, L + 1, false));
    loco_layernorm_fwd(a->lnf, a->lnf_mean, a->lnf_rstd, last, m->p.lnfw, m->p.lnfb, N, C);
    LOCO_CHECK(release(m, L + 1, false));
    loco_matmul_fwd(a->logits, a->lnf, m->p.wte, NULL, N, C, V, true);
    return release(m, 0, false);
}

static float mean_of(const float *x, int n) {
    double s = 0;
    for (int i = 0; i < n; i++)
        s += x[i];
    return (float)(s / n);
}

int loco_gpt_forward(loco_gpt *m, const int32_t *inputs, const int32_t *targets, int B, int T,
                     float *mean_loss) {
    LOCO_CHECK(check_batch(m, inputs, B, T));
    LOCO_CHECK(forward_body(m, inputs, B, T));
    if (targets) {
        loco_xent_fwd_bwd(m->a.losses, NULL, m->a.logits, targets, B * T, m->cfg.vocab_size, 0.f);
        if (mean_loss)
            *mean_loss = mean_of(m->a.losses, B * T);
    }
    return 0;
}

int loco_gpt_forward_backward(loco_gpt *m, const int32_t *inputs, const int32_t *targets, int B,
                              int T, float loss_scale, float *mean_loss) {
    LOCO_CHECK(check_batch(m, inputs, B, T));
    for (int i = 0; i < B * T; i++)
        if (targets[i] < 0 || targets[i] >= m->cfg.vocab_size)
            return LOCO_ERR(LOCO_EINVAL, "target %d at %d outside the vocabulary", targets[i], i);
    const int C = m->cfg.n_embd, NH = m->cfg.n_head, V = m->cfg.vocab_size;
    const int N = B * T;
    const size_t cap = (size_t)m->B * (size_t)m->T;
    loco_gpt_acts *a = &m->a;
    loco_gpt_scratch *s = &m->s;
    LOCO_CHECK(forward_body(m, inputs, B, T));
    const int L = m->cfg.n_layer;
    /* Fused softmax + cross-entropy turns logits into dlogits in place. */
    loco_xent_fwd_bwd(a->losses, a->logits, a->logits, targets, N, V, loss_scale / (float)N);
    if (mean_loss)
        *mean_loss = mean_of(a->losses, N);

    const size_t nbtc = (size_t)N * C;
    memset(s->dbtc, 0, nbtc * sizeof(float));
    LOCO_CHECK(acquire(m, 0, true));
    loco_matmul_bwd(s->dbtc, m->g.wte, NULL, a->logits, a->lnf, m->p.wte, N, C, V, true);
    memset(s->dres, 0, nbtc * sizeof(float));
    const float *last = a->residual3 + (size_t)(L - 1) * cap * C;
    LOCO_CHECK(acquire(m, L + 1, true));
    loco_layernorm_bwd(s->dres, m->g.lnfw, m->g.lnfb, s->dbtc, last, m->p.lnfw, a->lnf_mean,
                       a->lnf_rstd, N, C);
    LOCO_CHECK(release(m, L + 1, true));
    LOCO_CHECK(grads_ready(m, L + 1));
    for (int l = L - 1; l >= 0; l--) {
        LOCO_CHECK(acquire(m, l + 1, true));
        const loco_gpt_block *w = &m->p.h[l];
        loco_gpt_block *g = &m->g.h[l];
        const float *res = l == 0 ? a->encoded : a->residual3 + (size_t)(l - 1) * cap * C;
        const float *ln1 = a->ln1 + l * cap * C, *ln1m = a->ln1_mean + l * cap;
        const float *ln1r = a->ln1_rstd + l * cap, *qkv = a->qkv + l * cap * 3 * C;
        const float *atty = a->atty + l * cap * C, *att = a->att + l * cap * NH * m->T;
        const float *res2 = a->residual2 + l * cap * C;
        const float *ln2 = a->ln2 + l * cap * C, *ln2m = a->ln2_mean + l * cap;
        const float *ln2r = a->ln2_rstd + l * cap, *fch = a->fch + l * cap * 4 * C;
        const float *fchg = a->fch_gelu + l * cap * 4 * C;
        /* residual3 = residual2 + fcproj: dres flows to both. */
        memset(s->dfchg, 0, nbtc * 4 * sizeof(float));
        loco_matmul_bwd(s->dfchg, g->fcprojw, g->fcprojb, s->dres, fchg, w->fcprojw, N, 4 * C, C,
                        false);
        memset(s->dfch, 0, nbtc * 4 * sizeof(float));
        loco_gelu_bwd(s->dfch, fch, s->dfchg, nbtc * 4);
        memset(s->dbtc, 0, nbtc * sizeof(float));
        loco_matmul_bwd(s->dbtc, g->fcw, g->fcb, s->dfch, ln2, w->fcw, N, C, 4 * C, false);
        loco_layernorm_bwd(s->dres, g->ln2w, g->ln2b, s->dbtc, res2, w->ln2w, ln2m, ln2r, N, C);
        /* residual2 = res + attproj: dres flows to both. */
        memset(s->dbtc, 0, nbtc * sizeof(float));
        loco_matmul_bwd(s->dbtc, g->attprojw, g->attprojb, s->dres, atty, w->attprojw, N, C, C,
                        false);
        memset(s->dqkv, 0, nbtc * 3 * sizeof(float));
        loco_attention_bwd(s->dqkv, s->datt, s->dbtc, qkv, att, B, T, C, NH);
        memset(s->dbtc, 0, nbtc * sizeof(float));
        loco_matmul_bwd(s->dbtc, g->qkvw, g->qkvb, s->dqkv, ln1, w->qkvw, N, C, 3 * C, false);
        loco_layernorm_bwd(s->dres, g->ln1w, g->ln1b, s->dbtc, res, w->ln1w, ln1m, ln1r, N, C);
        LOCO_CHECK(release(m, l + 1, true));
        LOCO_CHECK(grads_ready(m, l + 1));
    }
    loco_encoder_bwd(m->g.wte, m->g.wpe, s->dres, inputs, B, T, C);
    LOCO_CHECK(release(m, 0, true));
    return grads_ready(m, 0);
}

double loco_gpt_flops_per_token(const loco_gpt_config *cfg, int T) {
    const double L = cfg->n_layer, C = cfg->n_embd, V = cfg->vocab_size;
    const double matmul_params = L * 12.0 * C * C + V * C;
    return 6.0 * matmul_params + 12.0 * L * C * T;
}
