/* The mixture-of-experts MLP of the device model (model.n_experts > 0):
 * model_moe.c's block on the device, through the MoE twins
 * (kernels/cuda/moe.cu) and the fp32 GEMMs, in the same order. The router
 * (replicated), the top-k, the capacity plan, the gather, the experts (MLPs
 * of the description's kind over their packed rows), the weighted
 * combine and the shared experts; the backward adds Switch's load-balancing
 * loss and the router z-loss (scaled by the pass's loss scale).
 *
 * Precision: the block computes in fp32 whatever the model's type. In
 * bf16 the MoE weights the passes read (the bf16 copy, or a ZeRO-3
 * gather) are cast to fp32 for the layer (moe_w32), ln_2's output too
 * (moe_x32); the block's output is stored in bf16 where the dense MLP's
 * is, and the gradient of its input likewise.
 *
 * The host: each block's expert counts (E) go to the host after the plan
 * (one wait per block), sizing the experts' GEMMs and the all-to-alls.
 * Under expert parallelism (ep ranks, El = E / ep experts each) the
 * packed rows travel to their experts' ranks and back staged through
 * pinned host buffers over the ep group (mpi), regrouped on the host as
 * model_moe.c regroups them. Under context parallelism the capacity plan
 * is the cp group's micro-batch's, made on the host (model_moe_cp.c's).
 * Under tensor parallelism every expert is
 * split as the dense MLP (c_fc by columns, c_proj by rows, its bias added
 * by tp rank 0): the outputs are partial sums, reduced as a row-parallel
 * output; the routing weights' gradient is summed over tp, and the
 * router's share of the input gradient is added by tp rank 0 alone. */
#include "inner/model/gpt_cuda_internal.h"

#if defined(LOCO_HAVE_CUDA)

#include <stdio.h>
#include <string.h>

#define SLAB(ptr, bytes, what)                                                                    \
    LOCO_CHECK(loco_cuda_slab_alloc(g->slab, (void **)&(ptr), (size_t)(bytes), what))
#define S (g->stream)

bool loco__gpt_cuda_is_moe(const loco_gpt_cuda *g, int l) {
    return g->cfg.n_experts > 0 && loco_gpt_is_moe(&g->cfg, l);
}

/* Packed rows of a micro-batch (N k), and on the experts' side (ep N k). */
static size_t nk(const loco_gpt_cuda *g) {
    return (size_t)g->B * g->T * (size_t)g->cfg.top_k;
}
static size_t side(const loco_gpt_cuda *g) { return nk(g) * (size_t)g->ep; }

/* fp32 floats of a block's MoE weights: the router, the shared and the
 * held routed experts (one range of the flat layout). */
static size_t moe_weights(const loco_gpt_cuda *g) {
    const loco_gpt_config *c = &g->cfg;
    return (size_t)c->n_experts * c->n_embd +
           (size_t)(c->n_shared_experts + g->El) * loco_gpt_expert_size(c);
}

/* MoE blocks of the whole model, and block l's index among them. */
int loco__gpt_cuda_moe_layers(const loco_gpt_cuda *g) {
    int n = 0;
    for (int l = 0; l < g->cfg.n_layer; l++)
        n += loco__gpt_cuda_is_moe(g, l);
    return n;
}

static int moe_index(const loco_gpt_cuda *g, int l) {
    int i = 0;
    for (int b = 0; b < l; b++)
        i += loco__gpt_cuda_is_moe(g, b);
    return i;
}

size_t loco__gpt_cuda_moe_block_bytes(const loco_gpt_cuda *g) {
    const size_t N = (size_t)g->B * g->T, E = (size_t)g->cfg.n_experts, k = (size_t)g->cfg.top_k;
    const size_t C = (size_t)g->cfg.n_embd, Fc = (size_t)g->Fl, F = (size_t)g->Hl;
    const size_t Sh = (size_t)g->cfg.n_shared_experts;
    return (N * E + N + N * k * 4 + 2 * E) * 4 + nk(g) * C * 4 * 2 +
           (g->ep > 1 ? side(g) * C * 4 : 0) + side(g) * (Fc + F) * 4 + Sh * N * (Fc + F) * 4;
}

size_t loco__gpt_cuda_moe_bytes(const loco_gpt_cuda *g) {
    if (g->cfg.n_experts <= 0)
        return 0;
    const size_t N = (size_t)g->B * g->T, E = (size_t)g->cfg.n_experts, k = (size_t)g->cfg.top_k;
    const size_t C = (size_t)g->cfg.n_embd, Fc = (size_t)g->Fl, F = (size_t)g->Hl;
    return (g->bf16 ? (moe_weights(g) + N * C) * 4 : 0) + 3 * N * C * 4 + N * k * 4 + N * E * 4 +
           side(g) * (3 * C + Fc + F) * 4 + LOCO_CUDA_MOE_PLAN_SCRATCH(N, E, k) + 16 +
           (g->cfg.router_bias_rate > 0 ? (size_t)loco__gpt_cuda_moe_layers(g) * E * 4 : 0) +
           18 * 256;
}

int loco__gpt_cuda_moe_check(const loco_gpt_config *c, const loco_gpt_cuda_opts *o) {
    if (c->n_experts <= 0)
        return 0;
    if (c->ep > 1 && (!o->ep || loco_comm_size(o->ep) != c->ep))
        return LOCO_ERR(LOCO_EINVAL, "device model: experts split over ep = %d ranks need a "
                        "group of %d ranks", c->ep, c->ep);
    return 0;
}

int loco__gpt_cuda_moe_init(loco_gpt_cuda *g, const loco_gpt_cuda_opts *o, int n_sets) {
    const loco_gpt_config *c = &g->cfg;
    g->ep = 1;
    g->El = c->n_experts;
    if (c->n_experts <= 0)
        return 0;
    if (c->ep > 1) {
        g->epc = o->ep;
        g->ep = c->ep;
        g->El = c->n_experts / c->ep;
    }
    g->h_moe_cap = (size_t)n_sets * 2 * c->n_experts;
    g->h_moe_arena = loco_alloc((g->h_moe_cap ? g->h_moe_cap : 1) * sizeof(int32_t));
    g->moe_sendc = loco_alloc(3 * (size_t)g->ep * sizeof(size_t));
    if (!g->h_moe_arena || !g->moe_sendc)
        return LOCO_ERR(LOCO_ENOMEM, "MoE host tables");
    g->moe_recvc = g->moe_sendc + g->ep;
    g->moe_cursor = g->moe_recvc + g->ep;
    const size_t L = (size_t)c->n_layer, E = (size_t)c->n_experts;
    g->st_micro = loco_alloc(L * sizeof(int));
    g->st_assign = loco_alloc((3 + E) * L * sizeof(int64_t));
    g->st_aux = loco_alloc(2 * L * sizeof(double));
    g->h_routed = loco_alloc(E * sizeof(int32_t));
    if (!g->st_micro || !g->st_assign || !g->st_aux || !g->h_routed)
        return LOCO_ERR(LOCO_ENOMEM, "MoE statistics");
    g->st_dropped = g->st_assign + L;
    g->st_routed = g->st_dropped + L;
    g->st_z = g->st_aux + L;
    loco_gpt_cuda_moe_reset(g);
    LOCO_CHECK(loco_cuda_host_alloc((void **)&g->h_lossd, 2 * sizeof(double)));
    if (g->cpc) { /* the plan's host copies: expert, slot, rows (N k each), probs (N E);
                   * the local rows' global positions (model_cp.c's zig-zag) */
        const size_t N = (size_t)g->B * g->T;
        g->h_cp_moe = loco_alloc((3 * N * c->top_k + N * E) * 4);
        g->h_cp_pos = loco_alloc((size_t)g->T * sizeof(int));
        if (!g->h_cp_moe || !g->h_cp_pos)
            return LOCO_ERR(LOCO_ENOMEM, "MoE under cp: host plan");
        for (int i = 0; i < g->T; i++)
            g->h_cp_pos[i] = (i < g->Tc ? g->cp_rank : 2 * g->cp - 1 - g->cp_rank) * g->Tc +
                             i % g->Tc;
    }
    if (g->ep > 1) {
        const size_t bytes = side(g) * c->n_embd * 4;
        LOCO_CHECK(loco_cuda_host_alloc((void **)&g->h_moe_send, bytes));
        LOCO_CHECK(loco_cuda_host_alloc((void **)&g->h_moe_recv, bytes));
    }
    return 0;
}

void loco__gpt_cuda_moe_fini(loco_gpt_cuda *g) {
    loco_free(g->st_micro);
    loco_free(g->st_assign);
    loco_free(g->st_aux);
    loco_free(g->h_routed);
    loco_cuda_host_free(g->h_lossd);
    loco_free(g->h_cp_moe);
    loco_free(g->h_cp_pos);
    loco_free(g->cp_glob);
    loco_free(g->h_moe_arena);
    loco_free(g->moe_sendc);
    loco_cuda_host_free(g->h_moe_send);
    loco_cuda_host_free(g->h_moe_recv);
}

int loco__gpt_cuda_moe_carve(loco_gpt_cuda *g) {
    if (g->cfg.n_experts <= 0)
        return 0;
    const size_t N = (size_t)g->B * g->T, E = (size_t)g->cfg.n_experts, k = (size_t)g->cfg.top_k;
    const size_t C = (size_t)g->cfg.n_embd, Fc = (size_t)g->Fl, F = (size_t)g->Hl;
    if (g->bf16) {
        SLAB(g->moe_w32, moe_weights(g) * 4, "MoE weights in fp32");
        SLAB(g->moe_x32, N * C * 4, "MoE input in fp32");
    }
    SLAB(g->moe_out, N * C * 4, "MoE output");
    SLAB(g->moe_dout, N * C * 4, "MoE output gradient / shared expert output");
    SLAB(g->moe_dx, N * C * 4, "MoE input gradient");
    SLAB(g->moe_dweight, N * k * 4, "MoE routing weights' gradient");
    SLAB(g->moe_dlogits, N * E * 4, "router logits' gradient");
    SLAB(g->moe_dy, side(g) * C * 4, "experts' output gradient");
    SLAB(g->moe_dxe, side(g) * C * 4, "experts' input gradient");
    SLAB(g->moe_yo, side(g) * C * 4, "experts' side outputs");
    SLAB(g->moe_dh, side(g) * Fc * 4, "experts' c_fc gradient");
    SLAB(g->moe_dhg, side(g) * F * 4, "experts' activation gradient");
    SLAB(g->moe_plan, LOCO_CUDA_MOE_PLAN_SCRATCH(N, E, k), "MoE plan scratch");
    SLAB(g->moe_lossd, 2 * sizeof(double), "MoE aux and z losses");
    if (g->cfg.router_bias_rate > 0) {
        const size_t n = (size_t)loco__gpt_cuda_moe_layers(g) * E * 4;
        SLAB(g->moe_bias, n, "routing biases");
        LOCO_CHECK(loco_cuda_zero(g->moe_bias, n, S));
    }
    return 0;
}

int loco__gpt_cuda_moe_carve_block(loco_gpt_cuda *g, layer_acts *a) {
    const size_t N = (size_t)g->B * g->T, E = (size_t)g->cfg.n_experts, k = (size_t)g->cfg.top_k;
    const size_t C = (size_t)g->cfg.n_embd, Fc = (size_t)g->Fl, F = (size_t)g->Hl;
    const size_t Sh = (size_t)g->cfg.n_shared_experts;
    if (g->h_moe_used + 2 * E > g->h_moe_cap)
        return LOCO_ERR(LOCO_EINVAL, "device model: more MoE blocks carved than planned");
    a->h_count = g->h_moe_arena + g->h_moe_used;
    g->h_moe_used += 2 * E;
    g->act_bytes += loco__gpt_cuda_moe_block_bytes(g);
    SLAB(a->moe_probs, N * E * 4, "router probabilities");
    SLAB(a->moe_lse, N * 4, "router lse");
    SLAB(a->moe_weight, N * k * 4, "routing weights");
    SLAB(a->moe_expert, N * k * 4, "routed experts");
    SLAB(a->moe_slot, N * k * 4, "packed slots");
    SLAB(a->moe_rows, N * k * 4, "packed rows' tokens");
    SLAB(a->moe_count, E * 4, "rows per expert");
    SLAB(a->moe_routed, E * 4, "assignments per expert");
    SLAB(a->moe_x, nk(g) * C * 4, "packed rows");
    SLAB(a->moe_y, nk(g) * C * 4, "experts' outputs");
    a->moe_xo = a->moe_x;
    if (g->ep > 1)
        SLAB(a->moe_xo, side(g) * C * 4, "rows at their experts' rank");
    SLAB(a->moe_h, side(g) * Fc * 4, "experts' c_fc output");
    SLAB(a->moe_hg, side(g) * F * 4, "experts' activation");
    if (Sh) {
        SLAB(a->moe_sh, Sh * N * Fc * 4, "shared experts' c_fc output");
        SLAB(a->moe_shg, Sh * N * F * 4, "shared experts' activation");
    }
    return 0;
}

/* --------------------------------------------------------------- pieces */

/* A tensor of block l's MoE part by suffix ("mlp.router.weight",
 * "mlp.experts.J.c_fc.weight"): its index in the table, or an error. */
static int find(const loco_gpt_cuda *g, int l, const char *suffix) {
    char n[LOCO_TENSOR_NAME_MAX];
    snprintf(n, sizeof n, "transformer.h.%d.%s", l, suffix);
    const int i = loco_ttable_find(&g->tt, n);
    return i >= 0 ? i : LOCO_ERR(LOCO_EINVAL, "device model: no %s in the table", n);
}

/* Block l's MoE weights in fp32 (router, shared expert 0, held routed
 * expert 0: NULL where none) and their gradients. */
typedef struct {
    const float *router, *shared, *experts;
    float *grouter, *gshared, *gexperts;
} moe_w;

static int weights(loco_gpt_cuda *g, int l, moe_w *w) {
    char sfx[64];
    const int ir = find(g, l, "mlp.router.weight");
    LOCO_CHECK(ir);
    snprintf(sfx, sizeof sfx, "mlp.experts.%d.c_fc.weight", g->cfg.ep_rank * g->El);
    const int ie = find(g, l, sfx);
    LOCO_CHECK(ie);
    int is = -1;
    if (g->cfg.n_shared_experts > 0) {
        is = find(g, l, "mlp.shared_experts.0.c_fc.weight");
        LOCO_CHECK(is);
    }
    const int u = g->tunit[ir];
    const size_t r0 = g->tt.t[ir].offset;
    const float *base;
    if (g->bf16) { /* the layer's weights in fp32, from those the passes read */
        const void *src = (const char *)g->uw[u] + (r0 - g->unit_lo[u]) * 2;
        RUN(LOCO_PROF_ELEM, loco_cuda_cast_f32(g->moe_w32, src, moe_weights(g), S));
        base = g->moe_w32;
    } else {
        base = (const float *)g->uw[u] + (r0 - g->unit_lo[u]);
    }
    float *gbase = g->ug[u] ? g->ug[u] + (r0 - g->unit_lo[u]) : NULL;
    w->router = base;
    w->grouter = gbase;
    w->experts = base + (g->tt.t[ie].offset - r0);
    w->gexperts = gbase ? gbase + (g->tt.t[ie].offset - r0) : NULL;
    w->shared = is >= 0 ? base + (g->tt.t[is].offset - r0) : NULL;
    w->gshared = is >= 0 && gbase ? gbase + (g->tt.t[is].offset - r0) : NULL;
    return 0;
}

/* ln_2's output, every row (gathered under sp), in fp32. */
static int input32(loco_gpt_cuda *g, const layer_acts *a, int N, const float **x) {
    const void *xin;
    LOCO_CHECK(loco__gpt_cuda_column_input(g, a->ln2, N, &xin));
    if (!g->bf16) {
        *x = xin;
        return 0;
    }
    RUN(LOCO_PROF_ELEM, loco_cuda_cast_f32(g->moe_x32, xin, (size_t)N * g->cfg.n_embd, S));
    *x = g->moe_x32;
    return 0;
}

static loco_gpt_expert view(const loco_gpt_cuda *g, const float *base, int j) {
    return loco_gpt_expert_at(&g->cfg, (float *)base, j);
}

/* One expert over `rows` rows (model_moe.c's expert_fwd). */
static int expert_fwd(loco_gpt_cuda *g, const loco_gpt_expert *x, float *y, float *h, float *hg,
                      const float *in, int rows) {
    const int C = g->cfg.n_embd, Fc = g->Fl, F = g->Hl;
    RUN(LOCO_PROF_MATMUL, loco_cuda_matmul_fwd(g->blas, h, in, x->fcw, x->fcb, rows, C, Fc, false,
                                               S));
    if (g->cfg.mlp == LOCO_MLP_SWIGLU)
        RUN(LOCO_PROF_ELEM, loco_cuda_swiglu_fwd(hg, h, rows, F, S));
    else
        RUN(LOCO_PROF_ELEM, loco_cuda_gelu_fwd(hg, h, (size_t)rows * F, S));
    RUN(LOCO_PROF_MATMUL, loco_cuda_matmul_fwd(g->blas, y, hg, x->projw,
                                               g->tp_rank == 0 ? x->projb : NULL, rows, F, C,
                                               false, S));
    return 0;
}

/* Its backward: gx accumulates, din ACCUMULATES the input's gradient. */
static int expert_bwd(loco_gpt_cuda *g, const loco_gpt_expert *x, const loco_gpt_expert *gx,
                      float *din, const float *dy, const float *in, const float *h,
                      const float *hg, int rows) {
    const int C = g->cfg.n_embd, Fc = g->Fl, F = g->Hl;
    RUN(LOCO_PROF_ELEM, loco_cuda_zero(g->moe_dhg, (size_t)rows * F * 4, S));
    RUN(LOCO_PROF_ELEM, loco_cuda_zero(g->moe_dh, (size_t)rows * Fc * 4, S));
    RUN(LOCO_PROF_MATMUL, loco_cuda_matmul_bwd(g->blas, g->moe_dhg, gx->projw, gx->projb, dy, hg,
                                               x->projw, rows, F, C, false, S));
    if (g->cfg.mlp == LOCO_MLP_SWIGLU)
        RUN(LOCO_PROF_ELEM, loco_cuda_swiglu_bwd(g->moe_dh, h, g->moe_dhg, rows, F, S));
    else
        RUN(LOCO_PROF_ELEM, loco_cuda_gelu_bwd(g->moe_dh, h, g->moe_dhg, (size_t)rows * F, S));
    RUN(LOCO_PROF_MATMUL, loco_cuda_matmul_bwd(g->blas, din, gx->fcw, gx->fcb, g->moe_dh, in,
                                               x->fcw, rows, C, Fc, false, S));
    return 0;
}

/* Rows local expert j holds on the experts' side. */
static int expert_rows(const loco_gpt_cuda *g, const layer_acts *a, int j) {
    if (g->ep == 1)
        return a->h_count[j];
    int r = 0;
    for (int src = 0; src < g->ep; src++)
        r += a->h_count[g->cfg.n_experts + src * g->El + j];
    return r;
}

/* ---------------------------------------------------------------- passes */

/* The local experts over their rows: in -> h, hg -> y. */
static int experts_fwd(loco_gpt_cuda *g, const layer_acts *a, const moe_w *w, const float *in,
                       float *y) {
    const size_t C = (size_t)g->cfg.n_embd, Fc = (size_t)g->Fl, F = (size_t)g->Hl;
    for (int j = 0, r = 0; j < g->El; r += expert_rows(g, a, j++)) {
        const int rows = expert_rows(g, a, j);
        if (rows == 0)
            continue;
        const loco_gpt_expert x = view(g, w->experts, j);
        LOCO_CHECK(expert_fwd(g, &x, y + r * C, a->moe_h + r * Fc, a->moe_hg + r * F, in + r * C,
                              rows));
    }
    return 0;
}

static int experts_bwd(loco_gpt_cuda *g, const layer_acts *a, const moe_w *w, const float *dy,
                       const float *in, float *dx) {
    const size_t C = (size_t)g->cfg.n_embd, Fc = (size_t)g->Fl, F = (size_t)g->Hl;
    for (int j = 0, r = 0; j < g->El; r += expert_rows(g, a, j++)) {
        const int rows = expert_rows(g, a, j);
        if (rows == 0)
            continue;
        const loco_gpt_expert x = view(g, w->experts, j), gx = view(g, w->gexperts, j);
        RUN(LOCO_PROF_ELEM, loco_cuda_zero(dx + r * C, (size_t)rows * C * 4, S));
        LOCO_CHECK(expert_bwd(g, &x, &gx, dx + r * C, dy + r * C, in + r * C, a->moe_h + r * Fc,
                              a->moe_hg + r * F, rows));
    }
    return 0;
}

int loco__gpt_cuda_moe_fwd(loco_gpt_cuda *g, int l, int B, int T) {
    const loco_gpt_config *c = &g->cfg;
    const int N = B * T, C = c->n_embd, E = c->n_experts, k = c->top_k;
    layer_acts *a = &g->la[l];
    moe_w w;
    LOCO_CHECK(weights(g, l, &w));
    const float *x;
    LOCO_CHECK(input32(g, a, N, &x));
    RUN(LOCO_PROF_MATMUL, loco_cuda_matmul_fwd(g->blas, a->moe_probs, x, w.router, NULL, N, C, E,
                                               true, S));
    const float *bias = g->moe_bias ? g->moe_bias + (size_t)moe_index(g, l) * E : NULL;
    RUN(LOCO_PROF_ELEM, loco_cuda_moe_route(a->moe_probs, a->moe_lse, a->moe_expert,
                                            a->moe_weight, a->moe_probs, bias, N, E, k, S));
    int n = 0;
    int64_t kept = 0; /* assignments kept: this rank's, or under cp the micro-batch's */
    if (g->cpc) { /* the cp group's micro-batch plans (on the host) */
        LOCO_CHECK(loco__gpt_cuda_moe_cp_plan(g, a, N, &n, &kept));
    } else {
        RUN(LOCO_PROF_ELEM, loco_cuda_moe_plan(a->moe_slot, a->moe_rows, a->moe_count,
                                               a->moe_routed, a->moe_expert, a->moe_probs, N, E,
                                               k, loco__gpt_moe_capacity(c, N), g->moe_plan, S));
        /* the counts size the experts' GEMMs and the all-to-alls: one wait */
        LOCO_CHECK(loco_cuda_copy(a->h_count, a->moe_count, (size_t)E * 4, S));
        LOCO_CHECK(loco_cuda_copy(g->h_routed, a->moe_routed, (size_t)E * 4, S));
    }
    const bool count = !g->rerunning; /* a recomputed forward routed nothing new */
    if (count) {
        RUN(LOCO_PROF_ELEM, loco_cuda_moe_losses(g->moe_lossd, g->moe_lossd + 1, a->moe_probs,
                                                 a->moe_lse, a->moe_routed, N, E, k, S));
        LOCO_CHECK(loco_cuda_copy(g->h_lossd, g->moe_lossd, 2 * sizeof(double), S));
    }
    LOCO_CHECK(loco_cuda_sync(S));
    if (!g->cpc) {
        for (int e = 0; e < E; e++)
            n += a->h_count[e];
        kept = n;
    }
    if (count) { /* for metrics and the routing biases, as model_moe.c counts */
        double aux = g->h_lossd[0], z = g->h_lossd[1];
        int64_t Ng = N;
        if (g->cpc) { /* the micro-batch's: every cp rank holds N rows */
            double v[2] = {aux, z};
            LOCO_CHECK(loco_comm_allreduce(g->cpc, v, 2, LOCO_DT_F64, LOCO_OP_SUM));
            aux = v[0] / ((double)g->cp * g->cp), z = v[1] / g->cp;
            Ng = (int64_t)N * g->cp;
        }
        for (int e = 0; e < E; e++)
            g->st_routed[(size_t)l * E + e] += g->h_routed[e];
        g->st_assign[l] += Ng * k;
        g->st_dropped[l] += Ng * k - kept;
        g->st_aux[l] += aux;
        g->st_z[l] += z;
        g->st_micro[l]++;
    }
    RUN(LOCO_PROF_ELEM, loco_cuda_moe_gather(a->moe_x, x, a->moe_rows, n, C, S));
    if (g->ep == 1) {
        LOCO_CHECK(experts_fwd(g, a, &w, a->moe_x, a->moe_y));
    } else {
        LOCO_CHECK(loco_comm_alltoall(g->epc, a->h_count, a->h_count + E, (size_t)g->El,
                                      LOCO_DT_I32));
        LOCO_CHECK(loco__gpt_cuda_moe_travel(g, a, a->moe_xo, a->moe_x, false));
        LOCO_CHECK(experts_fwd(g, a, &w, a->moe_xo, g->moe_yo));
        LOCO_CHECK(loco__gpt_cuda_moe_travel(g, a, a->moe_y, g->moe_yo, true));
    }
    /* the combined (partial, under tp) outputs and the shared experts' */
    float *out = g->bf16 ? g->moe_out : (float *)g->scratch;
    RUN(LOCO_PROF_ELEM,
        loco_cuda_moe_combine(out, a->moe_y, a->moe_slot, a->moe_weight, N, k, C, S));
    const size_t Fc = (size_t)g->Fl, F = (size_t)g->Hl;
    for (int j = 0; j < c->n_shared_experts; j++) {
        const loco_gpt_expert sx = view(g, w.shared, j);
        LOCO_CHECK(expert_fwd(g, &sx, g->moe_dout, a->moe_sh + (size_t)j * N * Fc,
                              a->moe_shg + (size_t)j * N * F, x, N));
        RUN(LOCO_PROF_ELEM, loco_cuda_residual_fwd(out, out, g->moe_dout, (size_t)N * C, S));
    }
    if (g->bf16)
        RUN(LOCO_PROF_ELEM, loco_cuda_cast_bf16(g->scratch, out, (size_t)N * C, S));
    /* reduced over tp as a row-parallel output */
    if (g->sp)
        return loco__gpt_cuda_tp_scatter_act(g, g->scratch, (size_t)N / g->tp * C);
    return loco__gpt_cuda_tp_sum_act(g, g->scratch, (size_t)N * C);
}

int loco__gpt_cuda_moe_bwd(loco_gpt_cuda *g, int l, int B, int T) {
    const loco_gpt_config *c = &g->cfg;
    const int N = B * T, C = c->n_embd, E = c->n_experts, k = c->top_k;
    const layer_acts *a = &g->la[l];
    moe_w w;
    LOCO_CHECK(weights(g, l, &w));
    const float *x;
    LOCO_CHECK(input32(g, a, N, &x));
    const void *dsrc; /* the output's gradient, every row */
    LOCO_CHECK(loco__gpt_cuda_row_dout(g, N, &dsrc));
    const float *dout = dsrc;
    if (g->bf16) {
        RUN(LOCO_PROF_ELEM, loco_cuda_cast_f32(g->moe_dout, dsrc, (size_t)N * C, S));
        dout = g->moe_dout;
    }
    RUN(LOCO_PROF_ELEM, loco_cuda_moe_combine_bwd(g->moe_dy, g->moe_dweight, dout, a->moe_y,
                                                  a->moe_slot, a->moe_weight, N, k, C, S));
    if (g->tp > 1) /* each rank's outputs were a part of the sum the weights scale */
        LOCO_CHECK(loco__gpt_cuda_tp_allreduce(g, g->moe_dweight, (size_t)N * k, LOCO_OP_SUM));
    const float *dxe = g->moe_dxe; /* the packed rows' input gradients */
    if (g->ep == 1) {
        LOCO_CHECK(experts_bwd(g, a, &w, g->moe_dy, a->moe_x, g->moe_dxe));
    } else {
        LOCO_CHECK(loco__gpt_cuda_moe_travel(g, a, g->moe_yo, g->moe_dy, false));
        LOCO_CHECK(experts_bwd(g, a, &w, g->moe_yo, a->moe_xo, g->moe_dxe));
        LOCO_CHECK(loco__gpt_cuda_moe_travel(g, a, g->moe_dy, g->moe_dxe, true));
        dxe = g->moe_dy;
    }
    /* the input's gradient over every row (a partial sum over tp) */
    float *dx = g->bf16 ? g->moe_dx : (float *)g->dbtc;
    RUN(LOCO_PROF_ELEM, loco_cuda_zero(dx, (size_t)N * C * 4, S));
    RUN(LOCO_PROF_ELEM, loco_cuda_moe_gather_bwd(dx, dxe, a->moe_slot, N, k, C, S));
    RUN(LOCO_PROF_ELEM, loco_cuda_moe_route_bwd(g->moe_dlogits, g->moe_dweight, a->moe_probs,
                                                a->moe_lse, a->moe_expert, a->moe_weight,
                                                a->moe_routed, N, E, k,
                                                g->cpc ? c->aux_loss / (float)g->cp : c->aux_loss,
                                                c->z_loss, g->loss_scale, S));
    /* the router is replicated: its input gradient counted by tp rank 0 */
    RUN(LOCO_PROF_MATMUL,
        loco_cuda_matmul_bwd(g->blas, g->tp_rank == 0 ? dx : NULL, w.grouter, NULL,
                             g->moe_dlogits, x, w.router, N, C, E, true, S));
    const size_t Fc = (size_t)g->Fl, F = (size_t)g->Hl;
    for (int j = 0; j < c->n_shared_experts; j++) {
        const loco_gpt_expert sx = view(g, w.shared, j), gsx = view(g, w.gshared, j);
        LOCO_CHECK(expert_bwd(g, &sx, &gsx, dx, dout, x, a->moe_sh + (size_t)j * N * Fc,
                              a->moe_shg + (size_t)j * N * F, N));
    }
    if (g->bf16)
        RUN(LOCO_PROF_ELEM, loco_cuda_cast_bf16(g->dbtc, dx, (size_t)N * C, S));
    /* reduced into this rank's rows as a column-parallel input gradient */
    const size_t R = (size_t)(g->sp ? N / g->tp : N);
    LOCO_CHECK(loco__gpt_cuda_tp_sum_begin(g, g->dbtc, (size_t)N * C, R * C));
    return loco__gpt_cuda_tp_sum_finish(g);
}

#endif /* LOCO_HAVE_CUDA */
