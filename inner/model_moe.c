/* Mixture-of-experts MLP of a block (model.n_experts > 0): the router
 * (a linear layer to E logits, softmax, top-k renormalised as Mixtral),
 * capacity per micro-batch of this rank (GShard's group: ceil(k N f / E)
 * assignments per expert, the least probable dropped), the experts (GPT-2
 * MLPs over their packed rows) and the weighted combine; the backward adds
 * Switch's load-balancing loss and the router z-loss. Every loop is in
 * kernels/ (kernels.h, "mixture of experts"). */
#include "inner/model_internal.h"
#include "kernels/kernels.h"

#include <math.h>
#include <string.h>

struct loco_gpt_moe {
    int n;          /* MoE layers */
    int *block;     /* (n) their blocks */
    int *index;     /* (L) block -> MoE layer, -1 */
    int64_t *routed; /* (n, E) */
    int64_t *assignments, *dropped; /* (n) */
    double *aux, *z; /* (n) sums over micro-batches */
    int64_t *micro; /* (n) */
};

int loco__gpt_moe_check(const loco_gpt_config *cfg, const loco_gpt_parallel *par) {
    if (cfg->n_experts <= 0)
        return 0;
    if (cfg->top_k < 1 || cfg->top_k > cfg->n_experts)
        return LOCO_ERR(LOCO_EINVAL, "model.top_k = %d must be between 1 and model.n_experts = %d",
                        cfg->top_k, cfg->n_experts);
    if (cfg->moe_every < 1)
        return LOCO_ERR(LOCO_EINVAL, "model.moe_every = %d must be at least 1", cfg->moe_every);
    const char *with = loco__gpt_tp_of(cfg) > 1 ? "tensor parallelism (parallel.tp)"
                       : par->stage            ? "pipeline parallelism (parallel.pp)"
                       : par->cp               ? "context parallelism (parallel.cp)"
                                               : NULL;
    if (with)
        return LOCO_ERR(LOCO_ENOTSUP,
                        "mixture of experts (model.n_experts = %d) with %s is not built yet; MoE "
                        "trains with dp, ZeRO and recompute",
                        cfg->n_experts, with);
    return 0;
}

void loco__gpt_moe_fini(loco_gpt *m) {
    struct loco_gpt_moe *s = m->moe;
    if (!s)
        return;
    loco_free(s->block);
    loco_free(s->routed);
    loco_free(s->aux);
    loco_free(s);
    m->moe = NULL;
}

int loco__gpt_moe_init(loco_gpt *m) {
    const loco_gpt_config *cfg = &m->cfg;
    if (cfg->n_experts <= 0)
        return 0;
    struct loco_gpt_moe *s = loco_alloc(sizeof *s);
    if (!s)
        return LOCO_ERR(LOCO_ENOMEM, "MoE statistics");
    m->moe = s;
    const int L = cfg->n_layer, E = cfg->n_experts;
    for (int l = 0; l < L; l++)
        s->n += loco_gpt_is_moe(cfg, l);
    const size_t n = (size_t)s->n;
    s->block = loco_alloc((n + (size_t)L) * sizeof(int));
    s->routed = loco_alloc((n * (size_t)E + 3 * n) * sizeof(int64_t));
    s->aux = loco_alloc(2 * n * sizeof(double));
    if (!s->block || !s->routed || !s->aux) {
        loco__gpt_moe_fini(m);
        return LOCO_ERR(LOCO_ENOMEM, "MoE statistics");
    }
    s->index = s->block + n;
    s->assignments = s->routed + n * (size_t)E;
    s->dropped = s->assignments + n;
    s->micro = s->dropped + n;
    s->z = s->aux + n;
    for (int l = 0, i = 0; l < L; l++) {
        s->index[l] = loco_gpt_is_moe(cfg, l) ? i : -1;
        if (s->index[l] >= 0)
            s->block[i++] = l;
    }
    loco_gpt_moe_reset(m);
    return 0;
}

int loco_gpt_moe_layers(const loco_gpt *m) {
    return m->moe ? m->moe->n : 0;
}

void loco_gpt_moe_layer(const loco_gpt *m, int i, loco_gpt_moe_stats *out) {
    const struct loco_gpt_moe *s = m->moe;
    const double micro = s->micro[i] > 0 ? (double)s->micro[i] : 1;
    *out = (loco_gpt_moe_stats){
        .block = s->block[i],
        .assignments = s->assignments[i],
        .dropped = s->dropped[i],
        .routed = s->routed + (size_t)i * m->cfg.n_experts,
        .aux = s->aux[i] / micro,
        .z = s->z[i] / micro,
    };
}

void loco_gpt_moe_reset(loco_gpt *m) {
    struct loco_gpt_moe *s = m->moe;
    if (!s)
        return;
    const size_t n = (size_t)s->n;
    memset(s->routed, 0, (n * (size_t)m->cfg.n_experts + 3 * n) * sizeof(int64_t));
    memset(s->aux, 0, 2 * n * sizeof(double));
}

/* Rows each expert may keep of a micro-batch of N tokens. */
static int capacity(const loco_gpt_config *cfg, int N) {
    if (cfg->capacity_factor <= 0)
        return N; /* dropless: a token picks an expert at most once */
    const double cap = ceil((double)cfg->top_k * N * cfg->capacity_factor / cfg->n_experts);
    return cap < N ? (int)cap : N;
}

/* The packed rows before expert j's. */
static int first_row(const int32_t *count, int j) {
    int r = 0;
    for (int e = 0; e < j; e++)
        r += count[e];
    return r;
}

int loco__gpt_moe_fwd(loco_gpt *m, const loco__gpt_shape *d, int l, const loco_gpt_layer_acts *la) {
    const loco_gpt_config *cfg = &m->cfg;
    const loco_gpt_block *w = &m->p.h[l];
    const int N = (int)d->N, C = d->C, E = cfg->n_experts, k = cfg->top_k;
    loco_matmul_fwd(la->moe_probs, la->ln2, w->routerw, NULL, N, C, E, true);
    loco_moe_route(la->moe_probs, la->moe_lse, la->moe_expert, la->moe_weight, la->moe_probs, N, E,
                   k);
    const int n = loco_moe_plan(la->moe_slot, la->moe_rows, la->moe_count, la->moe_routed,
                                la->moe_expert, la->moe_probs, N, E, k, capacity(cfg, N),
                                m->s.moe_plan);
    loco_moe_gather(la->moe_x, la->ln2, la->moe_rows, n, C);
    for (int j = 0, r = 0; j < E; r += la->moe_count[j++]) {
        const int rows = la->moe_count[j];
        if (rows == 0)
            continue;
        const loco_gpt_expert x = loco_gpt_expert_at(w->experts, C, j);
        float *h = la->moe_h + (size_t)r * 4 * C, *hg = la->moe_hg + (size_t)r * 4 * C;
        loco_matmul_fwd(h, la->moe_x + (size_t)r * C, x.fcw, x.fcb, rows, C, 4 * C, false);
        loco_gelu_fwd(hg, h, (size_t)rows * 4 * C);
        loco_matmul_fwd(la->moe_y + (size_t)r * C, hg, x.projw, x.projb, rows, 4 * C, C, false);
    }
    loco_moe_combine(la->fcproj, la->moe_y, la->moe_slot, la->moe_weight, N, k, C);
    if (m->rerun || !m->moe)
        return 0;
    /* What this micro-batch routed, for metrics. */
    struct loco_gpt_moe *s = m->moe;
    const int i = s->index[l];
    double aux, z;
    loco_moe_losses(&aux, &z, la->moe_probs, la->moe_lse, la->moe_routed, N, E, k);
    for (int e = 0; e < E; e++)
        s->routed[(size_t)i * E + e] += la->moe_routed[e];
    s->assignments[i] += (int64_t)N * k;
    s->dropped[i] += (int64_t)N * k - n;
    s->aux[i] += aux;
    s->z[i] += z;
    s->micro[i]++;
    return 0;
}

/* From s.dres, the gradient of the MoE output: the gradient of its input
 * (the ln_2 output) into s.dbtc, and every router and expert gradient. */
int loco__gpt_moe_bwd(loco_gpt *m, const loco__gpt_shape *d, int l, const loco_gpt_layer_acts *la) {
    const loco_gpt_config *cfg = &m->cfg;
    const loco_gpt_block *w = &m->p.h[l];
    loco_gpt_block *g = &m->g.h[l];
    loco_gpt_scratch *s = &m->s;
    const int N = (int)d->N, C = d->C, E = cfg->n_experts, k = cfg->top_k;
    const int n = first_row(la->moe_count, E);
    loco_moe_combine_bwd(s->moe_dy, s->moe_dweight, s->dres, la->moe_y, la->moe_slot,
                         la->moe_weight, N, k, C);
    memset(s->moe_dx, 0, (size_t)n * C * sizeof(float));
    for (int j = 0, r = 0; j < E; r += la->moe_count[j++]) {
        const int rows = la->moe_count[j];
        if (rows == 0)
            continue;
        const loco_gpt_expert x = loco_gpt_expert_at(w->experts, C, j);
        const loco_gpt_expert gx = loco_gpt_expert_at(g->experts, C, j);
        const size_t at = (size_t)r * 4 * C;
        float *dhg = s->moe_dhg + at, *dh = s->moe_dh + at;
        memset(dhg, 0, (size_t)rows * 4 * C * sizeof(float));
        memset(dh, 0, (size_t)rows * 4 * C * sizeof(float));
        loco_matmul_bwd(dhg, gx.projw, gx.projb, s->moe_dy + (size_t)r * C, la->moe_hg + at,
                        x.projw, rows, 4 * C, C, false);
        loco_gelu_bwd(dh, la->moe_h + at, dhg, (size_t)rows * 4 * C);
        loco_matmul_bwd(s->moe_dx + (size_t)r * C, gx.fcw, gx.fcb, dh, la->moe_x + (size_t)r * C,
                        x.fcw, rows, C, 4 * C, false);
    }
    memset(s->dbtc, 0, (size_t)N * C * sizeof(float));
    loco_moe_gather_bwd(s->dbtc, s->moe_dx, la->moe_slot, N, k, C);
    loco_moe_route_bwd(s->moe_dlogits, s->moe_dweight, la->moe_probs, la->moe_lse, la->moe_expert,
                       la->moe_weight, la->moe_routed, N, E, k, cfg->aux_loss, cfg->z_loss,
                       m->loss_scale);
    loco_matmul_bwd(s->dbtc, g->routerw, NULL, s->moe_dlogits, la->ln2, w->routerw, N, C, E, true);
    return 0;
}
