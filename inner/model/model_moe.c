/* Mixture-of-experts MLP of a block (model.n_experts > 0): the router
 * (a linear layer to E logits, softmax, top-k renormalised as Mixtral),
 * capacity per micro-batch (GShard's group: ceil(k N f / E)
 * assignments per expert, the least probable dropped), the experts (MLPs
 * of the description's kind, GELU or SwiGLU, over their packed rows), the
 * weighted combine, and the shared experts (DeepSeek's: the same MLPs
 * over every token, added without a gate); the backward adds
 * Switch's load-balancing loss and the router z-loss. Every loop is in
 * kernels/ (kernels.h, "mixture of experts"). Under expert parallelism
 * (cfg.ep = e ranks, E/e experts each) the packed rows travel to their
 * experts' ranks: the counts by all-to-all, the rows by all-to-all-v,
 * regrouped expert-major there (each expert's rows by source rank, each
 * source's in token order), and back the same way; the backward mirrors
 * it. Routing and capacity stay decisions of the tokens' own rank, so the
 * result does not depend on ep. The shared experts are replicated on every
 * ep rank and run there on the rank's own tokens, like the router.
 * Under tensor parallelism (cfg.tp = t) every expert, routed or shared,
 * splits as the dense MLP does (Megatron): c_fc by columns, c_proj by
 * rows, so each tp rank computes a partial sum of every expert's output.
 * The router is replicated: every tp rank routes the same (gathered,
 * under sp) tokens the same way, so the plan, the packed rows and the ep
 * all-to-all are those of one rank; the combined partial outputs are
 * reduced once, as the dense MLP's are (all-reduce, or reduce-scatter
 * under sp). In the backward the routing weights' gradient (N k floats,
 * linear in the partial outputs) is all-reduced before the router's
 * backward, and the router's share of the input gradient is added by tp
 * rank 0 alone before the input gradient is reduced. Under context
 * parallelism (cp_plan) the capacity plan and the aux loss's expert
 * counts are the cp group's micro-batch's (docs/DECISIONS.md, "MoE under
 * context parallelism"). DeepSeek-V3's auxiliary-loss-free balancing
 * (cfg.router_bias_rate > 0) adds a per-expert bias to the probabilities
 * that choose the top-k; the bias moves after each optimizer step against
 * the global batch's load. */
#include "inner/model/internal.h"
#include "kernels/kernels.h"

#include <math.h>
#include <string.h>


int loco__gpt_moe_check(const loco_gpt_config *cfg, const loco_gpt_parallel *par) {
    if (!(cfg->router_bias_rate >= 0))
        return LOCO_ERR(LOCO_EINVAL,
                        "model.router_bias_rate = %g must be at least 0 (0 = off; the bias "
                        "moves against the load, DeepSeek-V3 used 0.001)",
                        (double)cfg->router_bias_rate);
    if (cfg->n_experts <= 0) {
        if (cfg->router_bias_rate > 0)
            return LOCO_ERR(LOCO_EINVAL,
                            "model.router_bias_rate = %g needs routed experts (model.n_experts "
                            "> 0): it balances their load",
                            (double)cfg->router_bias_rate);
        if (cfg->n_shared_experts > 0)
            return LOCO_ERR(LOCO_EINVAL,
                            "model.n_shared_experts = %d needs routed experts (model.n_experts "
                            "> 0): shared experts sit beside them in an MoE block",
                            cfg->n_shared_experts);
        if (cfg->ep > 1)
            return LOCO_ERR(LOCO_EINVAL,
                            "parallel.ep = %d needs experts to split (model.n_experts > 0)",
                            cfg->ep);
        return 0;
    }
    if (cfg->top_k < 1 || cfg->top_k > cfg->n_experts)
        return LOCO_ERR(LOCO_EINVAL, "model.top_k = %d must be between 1 and model.n_experts = %d",
                        cfg->top_k, cfg->n_experts);
    if (cfg->moe_every < 1)
        return LOCO_ERR(LOCO_EINVAL, "model.moe_every = %d must be at least 1", cfg->moe_every);
    const int ep = cfg->ep > 1 ? cfg->ep : 1;
    if (cfg->n_experts % ep || cfg->ep_rank < 0 || cfg->ep_rank >= ep)
        return LOCO_ERR(LOCO_EINVAL,
                        "parallel.ep = %d must divide model.n_experts = %d (each rank holds as "
                        "many experts)",
                        ep, cfg->n_experts);
    if (ep > 1 && (!par->ep || loco_comm_size(par->ep) != ep))
        return LOCO_ERR(LOCO_EINVAL, "experts split over ep = %d ranks need a group of %d ranks",
                        ep, ep);
    if (cfg->n_shared_experts < 0)
        return LOCO_ERR(LOCO_EINVAL, "model.n_shared_experts = %d must be at least 0",
                        cfg->n_shared_experts);
    return 0;
}

void loco__gpt_moe_fini(loco_gpt *m) {
    struct loco_gpt_moe *s = m->moe;
    if (!s)
        return;
    loco_free(s->block);
    loco_free(s->routed);
    loco_free(s->aux);
    loco_free(s->sendc);
    loco_free(s->bias);
    loco_free(s->load);
    loco_free(s->glob);
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
    const size_t ep = cfg->ep > 1 ? (size_t)cfg->ep : 1;
    s->sendc = loco_alloc(3 * ep * sizeof(size_t));
    if (!s->block || !s->routed || !s->aux || !s->sendc) {
        loco__gpt_moe_fini(m);
        return LOCO_ERR(LOCO_ENOMEM, "MoE statistics");
    }
    if (cfg->router_bias_rate > 0) {
        s->bias = loco_alloc(n * (size_t)E * sizeof(float)); /* zero-filled */
        s->load = loco_alloc(n * (size_t)E * sizeof(int64_t));
        if (!s->bias || !s->load) {
            loco__gpt_moe_fini(m);
            return LOCO_ERR(LOCO_ENOMEM, "MoE routing biases");
        }
    }
    s->recvc = s->sendc + ep;
    s->cursor = s->recvc + ep;
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

double loco_gpt_moe_bytes(const loco_gpt *m) {
    return m->moe ? m->moe->bytes : 0;
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
        .load = s->load ? s->load + (size_t)i * m->cfg.n_experts : NULL,
        .bias = s->bias ? s->bias + (size_t)i * m->cfg.n_experts : NULL,
    };
}

float *loco_gpt_router_bias(const loco_gpt *m, size_t *n) {
    struct loco_gpt_moe *s = m->moe;
    *n = s && s->bias ? (size_t)s->n * m->cfg.n_experts : 0;
    return *n ? s->bias : NULL;
}

int loco_gpt_router_bias_step(loco_gpt *m, loco_comm *c) {
    struct loco_gpt_moe *s = m->moe;
    if (!s || !s->bias)
        return 0;
    const int E = m->cfg.n_experts;
    const size_t n = (size_t)s->n * E;
    memcpy(s->load, s->routed, n * sizeof(int64_t));
    if (c && loco_comm_size(c) > 1)
        LOCO_CHECK(loco_comm_allreduce(c, s->load, n, LOCO_DT_I64, LOCO_OP_SUM));
    const float rate = m->cfg.router_bias_rate;
    for (int i = 0; i < s->n; i++) {
        const int64_t *load = s->load + (size_t)i * E;
        float *b = s->bias + (size_t)i * E;
        int64_t total = 0;
        for (int e = 0; e < E; e++)
            total += load[e];
        /* sign(total / E - load_e) in integers: exact on every rank */
        for (int e = 0; e < E; e++) {
            const int64_t gap = total - (int64_t)E * load[e];
            b[e] += gap > 0 ? rate : gap < 0 ? -rate : 0.0f;
        }
    }
    return 0;
}

void loco_gpt_moe_reset(loco_gpt *m) {
    struct loco_gpt_moe *s = m->moe;
    if (!s)
        return;
    const size_t n = (size_t)s->n;
    memset(s->routed, 0, (n * (size_t)m->cfg.n_experts + 3 * n) * sizeof(int64_t));
    memset(s->aux, 0, 2 * n * sizeof(double));
}

int loco_gpt_moe_add(loco_gpt *m, int block, int micro, const int64_t *routed,
                     int64_t assignments, int64_t dropped, double aux_sum, double z_sum) {
    struct loco_gpt_moe *s = m->moe;
    if (!s || block < 0 || block >= m->cfg.n_layer || s->index[block] < 0)
        return LOCO_ERR(LOCO_EINVAL, "block %d is not a mixture of experts", block);
    const int i = s->index[block], E = m->cfg.n_experts;
    for (int e = 0; e < E; e++)
        s->routed[(size_t)i * E + e] += routed[e];
    s->assignments[i] += assignments;
    s->dropped[i] += dropped;
    s->aux[i] += aux_sum;
    s->z[i] += z_sum;
    s->micro[i] += micro;
    return 0;
}

/* Rows each expert may keep of a micro-batch of N tokens. */
int loco__gpt_moe_capacity(const loco_gpt_config *cfg, int N) {
    if (cfg->capacity_factor <= 0)
        return N; /* dropless: a token picks an expert at most once */
    const double cap = ceil((double)cfg->top_k * N * cfg->capacity_factor / cfg->n_experts);
    return cap < N ? (int)cap : N;
}

/* ------------------------------------------------------ expert side */

static int ep_of(const loco_gpt *m) {
    return m->cfg.ep > 1 ? m->cfg.ep : 1;
}

/* Rows local expert j holds on the expert side. */
static int expert_rows(const loco_gpt *m, const loco_gpt_layer_acts *la, int j) {
    const int e = ep_of(m), El = m->cfg.n_experts / e;
    if (e == 1)
        return la->moe_count[j];
    int r = 0;
    for (int src = 0; src < e; src++)
        r += la->moe_recv[src * El + j];
    return r;
}

/* Regroups rows between source-major (as they travel: each source's
 * rows for expert 0, 1, ...) and expert-major (as the experts compute:
 * expert j's rows from source 0, 1, ...). */
static void regroup(const loco_gpt *m, const loco_gpt_layer_acts *la, float *dst, const float *src,
                    bool to_experts) {
    loco__moe_regroup(ep_of(m), m->cfg.n_experts / ep_of(m), m->cfg.n_embd, la->moe_recv,
                      m->moe->cursor, dst, src, to_experts);
}

void loco__moe_regroup(int e, int El, int C, const int32_t *recv, size_t *at_src, float *dst,
                       const float *src, bool to_experts) {
    size_t at = 0; /* each source's next row */
    for (int x = 0; x < e; x++) {
        at_src[x] = at;
        for (int j = 0; j < El; j++)
            at += (size_t)recv[x * El + j];
    }
    size_t at_exp = 0;
    for (int j = 0; j < El; j++)
        for (int x = 0; x < e; x++) {
            const size_t rows = (size_t)recv[x * El + j], n = rows * C;
            if (to_experts)
                memcpy(dst + at_exp * C, src + at_src[x] * C, n * sizeof(float));
            else
                memcpy(dst + at_src[x] * C, src + at_exp * C, n * sizeof(float));
            at_src[x] += rows;
            at_exp += rows;
        }
}

/* Floats of packed rows this rank sends each expert rank (sendc) and
 * receives from each source rank (recvc) on the way out; the way back
 * swaps them. */
static void a2a_counts(loco_gpt *m, const loco_gpt_layer_acts *la) {
    const int e = ep_of(m), El = m->cfg.n_experts / e, C = m->cfg.n_embd;
    for (int x = 0; x < e; x++) {
        size_t mine = 0, theirs = 0;
        for (int j = 0; j < El; j++) {
            mine += (size_t)la->moe_count[x * El + j];
            theirs += (size_t)la->moe_recv[x * El + j];
        }
        m->moe->sendc[x] = mine * C;
        m->moe->recvc[x] = theirs * C;
    }
}

/* Packed rows (n, C) at `src` -> their experts' ranks, expert-major at
 * `dst`; (`back`) expert-major rows at `src` -> their sources' packed
 * rows at `dst`. */
static int travel(loco_gpt *m, const loco_gpt_layer_acts *la, float *dst, const float *src,
                  bool back) {
    loco_comm *c = m->par.ep;
    a2a_counts(m, la);
    const int me = loco_comm_rank(c);
    for (int x = 0; x < ep_of(m); x++) /* what leaves this rank */
        if (x != me)
            m->moe->bytes += (double)(back ? m->moe->recvc[x] : m->moe->sendc[x]) * sizeof(float);
    if (!back) {
        LOCO_CHECK(
            loco_comm_alltoallv(c, src, m->moe->sendc, m->s.moe_xfer, m->moe->recvc, LOCO_DT_F32));
        regroup(m, la, dst, m->s.moe_xfer, true);
        return 0;
    }
    regroup(m, la, m->s.moe_xfer, src, false);
    return loco_comm_alltoallv(c, m->s.moe_xfer, m->moe->recvc, dst, m->moe->sendc, LOCO_DT_F32);
}

/* The description's activation of an expert's c_fc output fc (rows,
 * Fl): GELU, or SwiGLU of its gate and up halves, into out (rows, Hl);
 * its backward accumulates into dfc. */
static void act_fwd(const loco__gpt_shape *d, loco_mlp_kind mlp, float *out, const float *fc,
                    int rows) {
    if (mlp == LOCO_MLP_SWIGLU)
        loco_swiglu_fwd(out, fc, rows, d->Hl);
    else
        loco_gelu_fwd(out, fc, (size_t)rows * d->Hl);
}

static void act_bwd(const loco__gpt_shape *d, loco_mlp_kind mlp, float *dfc, const float *fc,
                    const float *dout, int rows) {
    if (mlp == LOCO_MLP_SWIGLU)
        loco_swiglu_bwd(dfc, fc, dout, rows, d->Hl);
    else
        loco_gelu_bwd(dfc, fc, dout, (size_t)rows * d->Hl);
}

/* One expert (an MLP of the description; its tp slice) over `rows` rows
 * of x (rows, C): c_fc into h (rows, Fl), its activation into hg (rows,
 * Hl), c_proj into y (rows, C), its bias by tp rank 0 alone (the outputs
 * are partial sums over tp). */
static void expert_fwd(const loco_gpt *m, const loco__gpt_shape *d, const loco_gpt_expert *x,
                       float *y, float *h, float *hg, const float *in, int rows) {
    loco_matmul_fwd(h, in, x->fcw, x->fcb, rows, d->C, d->Fl, false);
    act_fwd(d, m->cfg.mlp, hg, h, rows);
    loco_matmul_fwd(y, hg, x->projw, d->k == 0 ? x->projb : NULL, rows, d->Hl, d->C, false);
}

/* Its backward from dy: the expert's gradients (gx) accumulate (c_proj's
 * bias on every tp rank alike: dy is whole), din (rows, C) ACCUMULATES
 * the input's (a partial sum over tp); dh (rows, Fl) and dhg (rows, Hl)
 * are scratch. */
static void expert_bwd(const loco_gpt *m, const loco__gpt_shape *d, const loco_gpt_expert *x,
                       const loco_gpt_expert *gx, float *din, float *dh, float *dhg,
                       const float *dy, const float *in, const float *h, const float *hg,
                       int rows) {
    const int C = d->C, Fl = d->Fl, Hl = d->Hl;
    memset(dhg, 0, (size_t)rows * Hl * sizeof(float));
    memset(dh, 0, (size_t)rows * Fl * sizeof(float));
    loco_matmul_bwd(dhg, gx->projw, gx->projb, dy, hg, x->projw, rows, Hl, C, false);
    act_bwd(d, m->cfg.mlp, dh, h, dhg, rows);
    loco_matmul_bwd(din, gx->fcw, gx->fcb, dh, in, x->fcw, rows, C, Fl, false);
}

/* The local experts over their rows: xo -> h, hg -> yo. */
static void experts_fwd(loco_gpt *m, const loco__gpt_shape *d, const loco_gpt_block *w,
                        const loco_gpt_layer_acts *la, float *yo) {
    const loco_gpt_config *cfg = &m->cfg;
    const int C = cfg->n_embd, El = cfg->n_experts / ep_of(m);
    const size_t Fc = (size_t)d->Fl, F = (size_t)d->Hl;
    for (int j = 0, r = 0; j < El; r += expert_rows(m, la, j++)) {
        const int rows = expert_rows(m, la, j);
        if (rows == 0)
            continue;
        const loco_gpt_expert x = loco_gpt_expert_at(cfg, w->experts, j);
        expert_fwd(m, d, &x, yo + (size_t)r * C, la->moe_h + (size_t)r * Fc,
                   la->moe_hg + (size_t)r * F, la->moe_xo + (size_t)r * C, rows);
    }
}

/* Their backward: dyo -> dxo, and every local expert's gradients. */
static void experts_bwd(loco_gpt *m, const loco__gpt_shape *d, int l, const loco_gpt_layer_acts *la,
                        const float *dyo, float *dxo) {
    const loco_gpt_config *cfg = &m->cfg;
    const int C = cfg->n_embd, El = cfg->n_experts / ep_of(m);
    const size_t Fc = (size_t)d->Fl, F = (size_t)d->Hl;
    const loco_gpt_block *w = &m->p.h[l], *g = &m->g.h[l];
    loco_gpt_scratch *s = &m->s;
    for (int j = 0, r = 0; j < El; r += expert_rows(m, la, j++)) {
        const int rows = expert_rows(m, la, j);
        if (rows == 0)
            continue;
        const loco_gpt_expert x = loco_gpt_expert_at(cfg, w->experts, j);
        const loco_gpt_expert gx = loco_gpt_expert_at(cfg, g->experts, j);
        memset(dxo + (size_t)r * C, 0, (size_t)rows * C * sizeof(float));
        expert_bwd(m, d, &x, &gx, dxo + (size_t)r * C, s->moe_dh + (size_t)r * Fc,
                   s->moe_dhg + (size_t)r * F, dyo + (size_t)r * C, la->moe_xo + (size_t)r * C,
                   la->moe_h + (size_t)r * Fc, la->moe_hg + (size_t)r * F, rows);
    }
}

/* The shared experts over every token of the ln_2 output x (N, C,
 * gathered under sp): their outputs added into out (N, C). */
static void shared_fwd(loco_gpt *m, const loco__gpt_shape *d, const loco_gpt_block *w,
                       const loco_gpt_layer_acts *la, float *out, const float *x_in, int N) {
    const loco_gpt_config *cfg = &m->cfg;
    const size_t Fc = (size_t)d->Fl, F = (size_t)d->Hl;
    for (int j = 0; j < cfg->n_shared_experts; j++) {
        const loco_gpt_expert x = loco_gpt_expert_at(cfg, w->shared, j);
        expert_fwd(m, d, &x, m->s.moe_shy, la->moe_sh + (size_t)j * N * Fc,
                   la->moe_shg + (size_t)j * N * F, x_in, N);
        loco_residual_fwd(out, out, m->s.moe_shy, (size_t)N * cfg->n_embd);
    }
}

/* Their backward from dout (N, C): dx (N, C) accumulates, with every
 * shared expert's gradients. */
static void shared_bwd(loco_gpt *m, const loco__gpt_shape *d, int l, const loco_gpt_layer_acts *la,
                       float *dx, const float *x_in, const float *dout, int N) {
    const loco_gpt_config *cfg = &m->cfg;
    const size_t Fc = (size_t)d->Fl, F = (size_t)d->Hl;
    const loco_gpt_block *w = &m->p.h[l], *g = &m->g.h[l];
    for (int j = 0; j < cfg->n_shared_experts; j++) {
        const loco_gpt_expert x = loco_gpt_expert_at(cfg, w->shared, j);
        const loco_gpt_expert gx = loco_gpt_expert_at(cfg, g->shared, j);
        expert_bwd(m, d, &x, &gx, dx, m->s.moe_dh, m->s.moe_dhg, dout, x_in,
                   la->moe_sh + (size_t)j * N * Fc, la->moe_shg + (size_t)j * N * F, N);
    }
}

int loco__gpt_moe_fwd(loco_gpt *m, const loco__gpt_shape *d, int l, const loco_gpt_layer_acts *la) {
    const loco_gpt_config *cfg = &m->cfg;
    const loco_gpt_block *w = &m->p.h[l];
    const int N = (int)d->N, C = d->C, E = cfg->n_experts, k = cfg->top_k;
    const float *x; /* the ln_2 output, every row of the micro-batch */
    LOCO_CHECK(loco__gpt_column_input(m, d, la->ln2, &x));
    loco_matmul_fwd(la->moe_probs, x, w->routerw, NULL, N, C, E, true);
    const float *bias = m->moe && m->moe->bias ? m->moe->bias + (size_t)m->moe->index[l] * E : NULL;
    loco_moe_route(la->moe_probs, la->moe_lse, la->moe_expert, la->moe_weight, la->moe_probs, bias,
                   N, E, k);
    int n = 0, ng_kept = 0;
    if (m->cp)
        LOCO_CHECK(loco__gpt_moe_cp_plan(m, la, N, &n, &ng_kept));
    else
        n = loco_moe_plan(la->moe_slot, la->moe_rows, la->moe_count, la->moe_routed, la->moe_expert,
                          la->moe_probs, N, E, k, loco__gpt_moe_capacity(cfg, N), m->s.moe_plan);
    loco_moe_gather(la->moe_x, x, la->moe_rows, n, C);
    if (ep_of(m) == 1) {
        experts_fwd(m, d, w, la, la->moe_y);
    } else {
        const int El = E / ep_of(m);
        LOCO_CHECK(
            loco_comm_alltoall(m->par.ep, la->moe_count, la->moe_recv, (size_t)El, LOCO_DT_I32));
        LOCO_CHECK(travel(m, la, la->moe_xo, la->moe_x, false));
        experts_fwd(m, d, w, la, m->s.moe_yo);
        LOCO_CHECK(travel(m, la, la->moe_y, m->s.moe_yo, true));
    }
    /* Under tp the outputs are partial sums: combined into the whole
     * rows (s.full under sp), then reduced as a row-parallel layer's. */
    float *out = d->sp ? m->s.full : la->fcproj;
    loco_moe_combine(out, la->moe_y, la->moe_slot, la->moe_weight, N, k, C);
    shared_fwd(m, d, w, la, out, x, N);
    if (d->sp)
        LOCO_CHECK(loco__gpt_tp_reduce_scatter(m, m->s.full, la->fcproj, d->R * (size_t)C));
    else if (d->t > 1)
        LOCO_CHECK(loco__gpt_tp_allreduce(m, la->fcproj, (size_t)N * C, LOCO_OP_SUM));
    if (m->rerun || !m->moe)
        return 0;
    /* What this micro-batch routed, for metrics. */
    struct loco_gpt_moe *s = m->moe;
    const int i = s->index[l];
    double aux, z;
    loco_moe_losses(&aux, &z, la->moe_probs, la->moe_lse, la->moe_routed, N, E, k);
    int64_t Ng = N, kept = n;
    if (m->cp) { /* the micro-batch's: see cp_plan; every cp rank holds N rows */
        const int c = m->cp->c;
        double v[2] = {aux, z};
        LOCO_CHECK(loco_comm_allreduce(m->cp->comm, v, 2, LOCO_DT_F64, LOCO_OP_SUM));
        aux = v[0] / ((double)c * c), z = v[1] / c;
        Ng = (int64_t)N * c, kept = ng_kept;
    }
    for (int e = 0; e < E; e++)
        s->routed[(size_t)i * E + e] += la->moe_routed[e];
    s->assignments[i] += Ng * k;
    s->dropped[i] += Ng * k - kept;
    s->aux[i] += aux;
    s->z[i] += z;
    s->micro[i]++;
    return 0;
}

/* From s.dres, the gradient of the MoE output (this rank's rows under
 * sp): the gradient of its input (the ln_2 output) into s.dbtc, and every
 * router and local expert gradient. */
int loco__gpt_moe_bwd(loco_gpt *m, const loco__gpt_shape *d, int l, const loco_gpt_layer_acts *la) {
    const loco_gpt_config *cfg = &m->cfg;
    const loco_gpt_block *w = &m->p.h[l];
    loco_gpt_block *g = &m->g.h[l];
    loco_gpt_scratch *s = &m->s;
    const int N = (int)d->N, C = d->C, E = cfg->n_experts, k = cfg->top_k;
    const float *x, *dout = s->dres; /* the input and the output's gradient, every row */
    LOCO_CHECK(loco__gpt_column_input(m, d, la->ln2, &x));
    if (d->sp) {
        LOCO_CHECK(loco__gpt_tp_allgather(m, s->dres, s->moe_dout, d->R * (size_t)C));
        dout = s->moe_dout;
    }
    loco_moe_combine_bwd(s->moe_dy, s->moe_dweight, dout, la->moe_y, la->moe_slot, la->moe_weight,
                         N, k, C);
    if (d->t > 1) /* each rank's outputs were a part of the sum the weights scale */
        LOCO_CHECK(loco__gpt_tp_allreduce(m, s->moe_dweight, (size_t)N * k, LOCO_OP_SUM));
    const float *dxe = s->moe_dx; /* the packed rows' input gradients */
    if (ep_of(m) == 1) {
        experts_bwd(m, d, l, la, s->moe_dy, s->moe_dx);
    } else {
        LOCO_CHECK(travel(m, la, s->moe_yo, s->moe_dy, false));
        experts_bwd(m, d, l, la, s->moe_yo, s->moe_dx);
        LOCO_CHECK(travel(m, la, s->moe_dy, s->moe_dx, true));
        dxe = s->moe_dy;
    }
    /* The input's gradient over every row (a partial sum over tp), then
     * reduced into this rank's rows as a column-parallel layer's. */
    float *dx = d->sp ? s->full : s->dbtc;
    memset(dx, 0, (size_t)N * C * sizeof(float));
    loco_moe_gather_bwd(dx, dxe, la->moe_slot, N, k, C);
    loco_moe_route_bwd(s->moe_dlogits, s->moe_dweight, la->moe_probs, la->moe_lse, la->moe_expert,
                       la->moe_weight, la->moe_routed, N, E, k,
                       m->cp ? cfg->aux_loss / (float)m->cp->c : cfg->aux_loss, cfg->z_loss,
                       m->loss_scale);
    /* the router is replicated: its input gradient counted by tp rank 0 */
    loco_matmul_bwd(d->k == 0 ? dx : NULL, g->routerw, NULL, s->moe_dlogits, x, w->routerw, N, C, E,
                    true);
    shared_bwd(m, d, l, la, dx, x, dout, N);
    if (d->sp)
        return loco__gpt_tp_reduce_scatter(m, s->full, s->dbtc, d->R * (size_t)C);
    if (d->t > 1)
        return loco__gpt_tp_allreduce(m, s->dbtc, (size_t)N * C, LOCO_OP_SUM);
    return 0;
}
