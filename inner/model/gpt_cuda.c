/* One file past 600 lines: the slab, the token slots, the passes' order
 * (hooks, graphs) and the optimizer are one state machine over struct
 * loco_gpt_cuda (the pieces of a pass live in gpt_cuda_pass.c, the tp and
 * sp collectives in gpt_cuda_tp.c, context parallelism in gpt_cuda_cp.c,
 * pipeline stages in gpt_cuda_pp.c, the experts in gpt_cuda_moe.c, the
 * data-parallel accessors in gpt_cuda_dp.c).
 *
 * The dense block description (GPT-2, Llama, or any mix model_desc.c
 * allows) on one GPU through the kernels/cuda twins (model.h, "model on a
 * GPU"): the CPU model's passes (model_pass.c) kernel for kernel, over device
 * buffers carved from one slab. One code path serves both precisions: the
 * activations and the weight copy are untyped device pointers, and TWIN()
 * calls the bf16 or the fp32 twin of a kernel (same arguments). Compiled
 * only in a CUDA build.
 *
 * Padded vocabulary: the LM head runs at Vp = V rounded up to a multiple
 * of 64 (50304 for GPT-2's 50257), on a head-only copy of the head's
 * weight (wte, or lm_head when untied; wte_pad,
 * Vp rows, rows V.. zero) and a head-only gradient (dwte_pad, folded into
 * the flat gradient's V rows and cleared after each backward). The fp32
 * flat state (params, grads, AdamW m and v) keeps the host layout of
 * loco_gpt_build_table, so uploads, downloads, checkpoints, the data
 * parallel accessors and the gradient norm's fixed order are unchanged.
 * The logits are Vp wide; the cross-entropy ignores columns >= V.
 *
 * Tensor and sequence parallelism (gpt_cuda_tp.c): the passes run this tp
 * rank's slice at the CPU model's widths, with its collectives where
 * model_pass.c has them; under sp the norms' and residuals' buffers hold
 * N / tp rows (rows_of). The collectives are staged through the host
 * (mpi); a column-parallel layer's input-gradient sum runs on the host
 * while the device computes its weight gradient (column_parallel_bwd),
 * the others block the host. No CUDA graph then.
 * Context parallelism (gpt_cuda_cp.c): the passes run on this rank's
 * zig-zag rows of each sequence (g->T = Tw / cp) at their global
 * positions; Ulysses attends on every row of 1/cp of the heads, the ring
 * on every rank's K|V block in turn (fp32 kernels; bf16 cast around).
 *
 * Streams: every kernel goes on loco_cuda_compute_stream (g->stream); the
 * tokens go host -> pinned buffer -> device on loco_cuda_copy_stream in
 * one of two slots, the compute stream waiting on the copy's event and
 * the copy on the event of the pass that last read that slot. A training
 * step (zero_grad, forward_backward with mean_loss NULL, clip_adamw) has
 * one host wait: clip_adamw reads the norm and the summed micro-step
 * losses after the clip and AdamW are queued (the norm's finiteness gates
 * AdamW on the device). The host waits that remain, and why:
 *   - clip_adamw's one read (the caller needs the norm and loss);
 *   - load_tokens waits for the copy out of the pinned slot it refills,
 *     queued two calls before (already done unless the host runs ahead
 *     of the copy engine);
 *   - forward, and forward_backward / clip / adamw when they return a
 *     value or keep their old waiting contract (tests, eval, bench);
 *   - upload and download (host buffers), profiling (waits around every
 *     kernel to time it).
 *
 * Units and sharding: the passes find a tensor through its unit's
 * pointers (uw: weights, ug: gradients; unit 0 = embeddings, 1..L blocks,
 * L+1 = ln_f, as loco_gpt_hooks), which point into the whole buffers, or,
 * for a sharded model (ZeRO-3, loco_gpt_cuda_create_sharded), at buffers
 * the caller binds from its hooks: the fp32 state then holds the owned
 * range only, the weights a pass reads are gathered unit by unit. */
#include "inner/model/gpt_cuda_internal.h"

#if defined(LOCO_HAVE_CUDA)

#include <math.h>
#include <stdio.h>
#include <string.h>

const char *const loco_gpt_cuda_prof_names[LOCO_PROF_N] = {
    "matmul", "attention", "layernorm", "cross-entropy", "element-wise", "adamw"};

#define SLAB(ptr, bytes, what)                                                                    \
    LOCO_CHECK(loco_cuda_slab_alloc(g->slab, (void **)&(ptr), (size_t)(bytes), what))

/* Context parallelism's device buffers (gpt_cuda_cp.c): one block's
 * (Ulysses' heads), and all of them. */
static size_t cp_block_bytes(const loco_gpt_cuda *g) {
    if (!g->cpc || g->ring) /* the ring attends on the local rows */
        return 0;
    return (size_t)g->B * g->Tw * (size_t)(g->wu + g->hq) * g->es;
}

static size_t cp_bytes(const loco_gpt_cuda *g) {
    if (!g->cpc)
        return 0;
    const size_t C = (size_t)g->cfg.n_embd, T = (size_t)g->T, whole = (size_t)g->B * g->Tw;
    const size_t L = (size_t)g->cfg.n_layer, kv = (size_t)g->B * g->T * 2 * g->Ckv;
    const size_t ring = 5 * kv + (size_t)g->Tc * g->Cl + (size_t)g->NHl * g->Tc * (1 + 2 * g->B) +
                        (g->bf16 ? 2 * (size_t)g->B * g->T * (g->Wl + g->Cl) : 0);
    return T * 4 + T * C * (g->es + 4) +
           (g->ring ? ring * 4
                    : whole * (g->hq + g->wu) * g->es + (g->bf16 ? whole * g->wu * 4 : 0)) +
           (L + 1) * cp_block_bytes(g);
}

/* The MoE block sets carve() makes: one per kept MoE block, and the
 * recomputed blocks' shared set when one of them is MoE (a pipeline
 * stage: its slots', gpt_cuda_pp.c). */
static int moe_sets(const loco_gpt_cuda *g) {
    if (g->cfg.n_experts <= 0)
        return 0;
    if (g->slots)
        return loco__gpt_cuda_pp_moe_sets(g);
    int n = 0;
    bool rerun = false;
    for (int l = 0; l < g->cfg.n_layer; l++)
        if (l < g->n_rerun)
            rerun |= loco__gpt_cuda_is_moe(g, l);
        else
            n += loco__gpt_cuda_is_moe(g, l);
    return n + rerun;
}

/* Slab size: the ranges carved in carve() plus alignment slack. */
static size_t slab_bytes(const loco_gpt_cuda *g) {
    const size_t N = (size_t)g->B * g->T, C = (size_t)g->cfg.n_embd, es = g->es;
    const size_t P = g->own_hi - g->own_lo; /* the held state */
    const size_t L = (size_t)g->cfg.n_layer, Vp = (size_t)g->Vp;
    const size_t bnt = (size_t)g->B * g->NHl * g->T;
    /* this tp slice's widths: c_attn's W, c_fc's Fc, the MLP's F (GPT-2,
     * one rank: 3C, 4C, 4C) */
    const size_t W = (size_t)g->Wl, Fc = (size_t)g->Fl, F = (size_t)g->Hl;
    const size_t wide = 5 * C + W + Fc + F;
    const size_t rope = g->cfg.pos == LOCO_POS_ROPE
                            ? 2 * (size_t)g->cfg.seq_len * (loco_gpt_head_size(&g->cfg) / 2) * 4
                            : 0;
    const size_t per_layer = loco__gpt_cuda_block_bytes(g, true);
    const size_t n_ranges = 55 + 15 * (L + 1);
    const size_t kept = L - (size_t)g->n_rerun, shared = g->n_rerun ? 1 : 0;
    /* the activations: the whole model's blocks, tokens and logits, or a
     * pipeline stage's slots */
    const size_t acts = g->slots ? loco__gpt_cuda_pp_bytes(g)
                                 : (kept + shared) * per_layer + (size_t)g->n_rerun * N * C * es +
                                       N * 4 * 4 + N * Vp * es;
    return P * 4 * 4 + (g->bf16 ? P * 2 : 0) + (g->has_head ? Vp * C * (es + 4) : 0) +
           N * wide * es + N * 4 * 3 + N * 4 * 3 + (C + 1) * W * 4 + 16 + bnt * 4 +
           LOCO_CUDA_SUMSQ_OUT * 8 + rope + acts + (g->tp > 1 && g->bf16 ? N * C * 4 : 0) +
           (g->sp ? 2 * N * C * es + ((size_t)g->T + 4) * C * 4 : 0) + cp_bytes(g) +
           (size_t)moe_sets(g) * (loco__gpt_cuda_moe_block_bytes(g) + 16 * 256) +
           loco__gpt_cuda_moe_bytes(g) +
           n_ranges * 256;
}

/* The bytes of one block's set of activations (carve_block's; mlp: with
 * the dense MLP's c_fc output and activation, which an MoE block keeps in
 * its own buffers instead). */
size_t loco__gpt_cuda_block_bytes(const loco_gpt_cuda *g, bool mlp) {
    const size_t N = (size_t)g->B * g->T, C = (size_t)g->cfg.n_embd;
    const size_t R = g->sp ? N / (size_t)g->tp : N;
    const size_t bnt = (size_t)g->B * g->NHl * g->T;
    const size_t W = (size_t)g->Wl, Fc = (size_t)g->Fl, F = (size_t)g->Hl, Cl = (size_t)g->Cl;
    /* this rank's rows of the norms and residuals (all under tp alone),
     * every row of the tp region's */
    return (4 * R * C + N * (Cl + W + (mlp ? Fc + F : 0))) * g->es + R * 4 * 4 + bnt * 4 +
           cp_block_bytes(g);
}

/* One block's set of activations (every buffer), counted in act_bytes. */
int loco__gpt_cuda_carve_block(loco_gpt_cuda *g, layer_acts *a, bool mlp) {
    const size_t N = (size_t)g->B * g->T, C = (size_t)g->cfg.n_embd, es = g->es;
    const size_t R = g->sp ? N / (size_t)g->tp : N;
    const size_t bnt = (size_t)g->B * g->NHl * g->T;
    const size_t W = (size_t)g->Wl, Fc = (size_t)g->Fl, F = (size_t)g->Hl, Cl = (size_t)g->Cl;
    g->act_bytes += loco__gpt_cuda_block_bytes(g, mlp);
    SLAB(a->ln1, R * C * es, "ln1");
    SLAB(a->qkv, N * W * es, "qkv");
    SLAB(a->atty, N * Cl * es, "atty");
    SLAB(a->res2, R * C * es, "residual2");
    SLAB(a->ln2, R * C * es, "ln2");
    if (mlp) {
        SLAB(a->fch, N * Fc * es, "fch");
        SLAB(a->fchg, N * F * es, "fch_gelu");
    }
    SLAB(a->res3, R * C * es, "residual3");
    SLAB(a->ln1m, R * 4, "ln1 mean");
    SLAB(a->ln1r, R * 4, "ln1 rstd");
    SLAB(a->ln2m, R * 4, "ln2 mean");
    SLAB(a->ln2r, R * 4, "ln2 rstd");
    SLAB(a->lse, bnt * 4, "lse");
    if (g->cpc && !g->ring) { /* Ulysses: every row of this rank's heads */
        const size_t whole = (size_t)g->B * g->Tw;
        SLAB(a->qkvh, whole * g->wu * es, "qkv of the rank's heads");
        SLAB(a->outh, whole * g->hq * es, "attention output of the rank's heads");
    }
    return 0;
}

static int carve(loco_gpt_cuda *g) {
    const size_t N = (size_t)g->B * g->T, C = (size_t)g->cfg.n_embd, es = g->es;
    const size_t R = g->sp ? N / (size_t)g->tp : N; /* the rows a rank holds between tp regions */
    const size_t P = g->own_hi - g->own_lo; /* the held state */
    const size_t bnt = (size_t)g->B * g->NHl * g->T;
    const size_t W = (size_t)g->Wl, Fc = (size_t)g->Fl, F = (size_t)g->Hl;
    SLAB(g->params, P * 4, "params");
    SLAB(g->grads, P * 4, "grads");
    SLAB(g->m, P * 4, "AdamW m");
    SLAB(g->v, P * 4, "AdamW v");
    if (g->bf16)
        SLAB(g->w, P * 2, g->sharded ? "owned bf16 weights" : "bf16 weights");
    else
        g->w = g->params;
    if (g->sharded) { /* the gather source; the passes read bound units */
        g->wshard = g->w;
        g->w = NULL;
    }
    if (g->has_head) {
        SLAB(g->wte_pad, (size_t)g->Vp * C * es, "padded head weights");
        SLAB(g->dwte_pad, (size_t)g->Vp * C * 4, "padded head gradient");
    }
    if (!g->slots) { /* a pipeline stage's are its slots' (gpt_cuda_pp.c) */
        for (int k = 0; k < 2; k++)
            SLAB(g->d_tok[k], N * 4 * 2, "tokens");
        g->inputs = g->d_tok[0];
        g->targets = g->d_tok[0] + N;
        SLAB(g->encoded, R * C * es, "encoded");
        SLAB(g->lnf, N * C * es, "ln_f");
        SLAB(g->lnfm, R * 4, "ln_f mean");
        SLAB(g->lnfr, R * 4, "ln_f rstd");
        SLAB(g->logits, N * (size_t)g->Vp * es, "logits");
    }
    SLAB(g->losses, N * 4, "losses");
    SLAB(g->xent, N * 4 * 3, "vocabulary-parallel sums");
    if (g->tp > 1 && loco__gpt_kv_rep(&g->cfg) > 1)
        SLAB(g->kv_keep, (C + 1) * W * 4, "key/value gradients kept");
    if (g->tp > 1 && g->bf16)
        SLAB(g->tp_f32, N * C * 4, "tp sums in fp32");
    if (g->cpc) {
        const size_t whole = (size_t)g->B * g->Tw;
        SLAB(g->cp_pos, (size_t)g->T * 4, "context-parallel positions");
        SLAB(g->cp_wpe, (size_t)g->T * C * es, "wpe at the local rows");
        SLAB(g->cp_dwpe, (size_t)g->T * C * 4, "wpe gradient at the local rows");
        if (g->ring) {
            const size_t kv = N * 2 * (size_t)g->Ckv, NT = (size_t)g->NHl * g->Tc;
            for (int k = 0; k < 2; k++) {
                SLAB(g->cp_kv[k], kv * 4, "ring K|V block");
                SLAB(g->cp_dacc[k], kv * 4, "ring dK|dV accumulator");
            }
            SLAB(g->cp_dpart, kv * 4, "ring dK|dV of a step");
            SLAB(g->cp_blk_out, (size_t)g->Tc * g->Cl * 4, "ring block output");
            SLAB(g->cp_blk_lse, NT * 4, "ring block lse");
            SLAB(g->cp_delta, (size_t)g->B * 2 * NT * 4, "ring delta");
            if (g->bf16) {
                SLAB(g->cp_q32, 2 * N * (size_t)g->Wl * 4, "ring qkv and its gradient in fp32");
                SLAB(g->cp_o32, 2 * N * (size_t)g->Cl * 4, "ring output and its gradient in fp32");
            }
        } else {
            SLAB(g->cp_dout, whole * g->hq * es, "the heads' output gradient");
            SLAB(g->cp_dqkv, whole * g->wu * es, "the heads' qkv gradient");
            if (g->bf16)
                SLAB(g->cp_f32, whole * g->wu * 4, "the heads' qkv gradient in fp32");
        }
    }
    if (g->sp) {
        SLAB(g->gather, N * C * es, "gathered norm output");
        SLAB(g->dgather, N * C * es, "gathered dres");
        SLAB(g->drep, ((size_t)g->T + 4) * C * 4, "replicated gradients of this rank's rows");
    }
    SLAB(g->mean, 4, "mean loss");
    SLAB(g->loss_acc, 8, "loss sum");
    SLAB(g->scratch, N * C * es, "projection scratch");
    SLAB(g->attn_scratch, bnt * 4, "attention scratch");
    SLAB(g->sumsq, LOCO_CUDA_SUMSQ_OUT * 8, "sum of squares");
    SLAB(g->dres, R * C * es, "dres");
    SLAB(g->dbtc, N * C * es, "dbtc");
    SLAB(g->dfchg, N * F * es, "dfch_gelu");
    SLAB(g->dfch, N * Fc * es, "dfch");
    SLAB(g->dqkv, N * W * es, "dqkv");
    if (g->cfg.pos == LOCO_POS_ROPE) {
        const size_t n = (size_t)g->cfg.seq_len * (loco_gpt_head_size(&g->cfg) / 2);
        SLAB(g->rope_cos, n * 4, "RoPE cos");
        SLAB(g->rope_sin, n * 4, "RoPE sin");
    }
    g->act_bytes = 0;
    LOCO_CHECK(loco__gpt_cuda_moe_carve(g));
    if (g->slots)
        return loco__gpt_cuda_pp_carve(g);
    /* blocks [0, n_rerun) share one set (carved last, as block -1) and
     * keep only res3, the next block's input */
    layer_acts shared = {0};
    bool rerun_moe = false, rerun_mlp = false;
    for (int l = 0; l < g->n_rerun; l++) {
        rerun_moe |= loco__gpt_cuda_is_moe(g, l);
        rerun_mlp |= !loco__gpt_cuda_is_moe(g, l);
    }
    for (int l = g->n_rerun ? -1 : 0; l < g->cfg.n_layer; l++) {
        layer_acts *a = l < 0 ? &shared : &g->la[l];
        if (l >= 0 && l < g->n_rerun) {
            *a = shared;
            SLAB(a->res3, R * C * es, "residual3");
            g->act_bytes += R * C * es;
            continue;
        }
        const bool moe = l < 0 ? rerun_moe : loco__gpt_cuda_is_moe(g, l);
        LOCO_CHECK(loco__gpt_cuda_carve_block(g, a, l < 0 ? rerun_mlp : !moe));
        if (moe)
            LOCO_CHECK(loco__gpt_cuda_moe_carve_block(g, a));
    }
    return 0;
}

/* The units' flat starts and pointers into the whole buffers (a sharded
 * model's weights and gradients stay unbound until the hooks bind them). */
static int index_units(loco_gpt_cuda *g) {
    const int L = g->cfg.n_layer;
    g->unit_lo = loco_alloc((size_t)(L + 3) * sizeof(size_t));
    g->tunit = loco_alloc((size_t)g->tt.n * sizeof(int));
    g->uw = loco_alloc((size_t)(L + 2) * sizeof(void *));
    g->ug = loco_alloc((size_t)(L + 2) * sizeof(float *));
    if (!g->unit_lo || !g->tunit || !g->uw || !g->ug)
        return LOCO_ERR(LOCO_ENOMEM, "device model unit tables");
    int prev = 0;
    bool after_lnf = false;
    g->unit_lo[0] = 0;
    for (int i = 0; i < g->tt.n; i++) {
        const int u = loco__gpt_unit_of(&g->tt.t[i], L, after_lnf);
        after_lnf |= u == L + 1;
        /* a pipeline stage holds some units: the others are empty ranges */
        if (u < prev || (u > prev + 1 && !g->slots))
            return LOCO_ERR(LOCO_EINVAL, "device model: tensor %s (unit %d) after unit %d: the "
                            "units are not contiguous in the flat layout", g->tt.t[i].name, u,
                            prev);
        for (int k = prev + 1; k <= u; k++)
            g->unit_lo[k] = g->tt.t[i].offset;
        prev = u;
        g->tunit[i] = u;
    }
    if (prev != L + 1 && !g->slots)
        return LOCO_ERR(LOCO_EINVAL, "device model: the table ends in unit %d, not ln_f", prev);
    for (int k = prev + 1; k <= L + 2; k++)
        g->unit_lo[k] = g->P;
    for (int u = 0; u < L + 2; u++) {
        g->uw[u] = g->sharded ? NULL : (char *)g->w + g->unit_lo[u] * g->es;
        g->ug[u] = g->sharded ? NULL : g->grads + g->unit_lo[u];
    }
    return 0;
}

int loco_gpt_cuda_create(loco_gpt_cuda **out, const loco_gpt_config *cfg, int B, int T,
                         bool bf16) {
    const loco_gpt_cuda_opts o = {.bf16 = bf16, .lo = 0, .hi = SIZE_MAX};
    return loco_gpt_cuda_create_with(out, cfg, B, T, &o);
}

int loco_gpt_cuda_create_sharded(loco_gpt_cuda **out, const loco_gpt_config *cfg, int B, int T,
                                 bool bf16, size_t lo, size_t hi) {
    const loco_gpt_cuda_opts o = {.bf16 = bf16, .lo = lo, .hi = hi};
    return loco_gpt_cuda_create_with(out, cfg, B, T, &o);
}

size_t loco_gpt_cuda_act_bytes(const loco_gpt_cuda *g) {
    return g->act_bytes;
}

int loco_gpt_cuda_create_with(loco_gpt_cuda **out, const loco_gpt_config *cfg, int B, int T,
                              const loco_gpt_cuda_opts *o) {
    *out = NULL;
    const bool bf16 = o->bf16;
    size_t lo = o->lo, hi = o->hi;
    if (o->rerun < 0 || o->rerun > cfg->n_layer)
        return LOCO_ERR(LOCO_EINVAL, "device model: recompute %d of %d blocks", o->rerun,
                        cfg->n_layer);
    LOCO_CHECK(loco__gpt_cuda_tp_check(cfg, o));
    LOCO_CHECK(loco__gpt_cuda_cp_check(cfg, B, T, o));
    LOCO_CHECK(loco__gpt_cuda_moe_check(cfg, o));
    const int hs = cfg->n_head > 0 ? cfg->n_embd / cfg->n_head : 0;
    if (cfg->n_layer < 1 || cfg->n_head < 1 || cfg->n_embd % cfg->n_head || hs > 128 ||
        cfg->vocab_size < 2 || cfg->vocab_size > INT32_MAX - VOCAB_ALIGN || T < 1 ||
        T > cfg->seq_len || B < 1)
        return LOCO_ERR(LOCO_EINVAL,
                        "bad model shape for the GPU: L=%d NH=%d C=%d V=%d maxT=%d for B=%d T=%d "
                        "(head size at most 128)",
                        cfg->n_layer, cfg->n_head, cfg->n_embd, cfg->vocab_size, cfg->seq_len, B,
                        T);
    if (o->sp && cfg->tp > 1 && ((size_t)B * T) % (size_t)cfg->tp)
        return LOCO_ERR(LOCO_EINVAL, "device model: sequence parallelism splits a %dx%d batch "
                        "over %d tp ranks: not evenly", B, T, cfg->tp);
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
    /* this tp rank's slice (model.c's loco__gpt_shape_of) */
    g->tp = cfg->tp > 1 ? cfg->tp : 1;
    g->tpc = g->tp > 1 ? o->tp : NULL;
    g->tp_rank = g->tpc ? loco_comm_rank(g->tpc) : 0;
    g->tp_staged = o->tp_staged;
    g->sp = o->sp && g->tp > 1;
    g->Cl = cfg->n_embd / g->tp;
    g->NHl = cfg->n_head / g->tp;
    g->NKVl = loco__gpt_kv_local(cfg);
    g->Wl = loco__gpt_qkv_local(cfg);
    g->Fl = loco_gpt_fc_width(cfg) / g->tp;
    g->Hl = loco_gpt_ffn(cfg) / g->tp;
    g->Vl = loco_gpt_vocab_padded(cfg) / g->tp;
    g->v_lo = g->tp_rank * g->Vl;
    g->v_valid = cfg->vocab_size - g->v_lo < g->Vl ? cfg->vocab_size - g->v_lo : g->Vl;
    g->Vp = (g->Vl + VOCAB_ALIGN - 1) / VOCAB_ALIGN * VOCAB_ALIGN;
    g->bf16 = bf16;
    g->es = bf16 ? 2 : 4;
    g->n_rerun = o->rerun;
    LOCO_CHECK_GOTO(loco__gpt_cuda_cp_init(g, o, T), out_fail);
    if (g->cpc) /* the passes see this rank's rows of each sequence */
        g->T = T / g->cp;
    g->stream = loco_cuda_compute_stream();
    g->copy = loco_cuda_copy_stream();
    LOCO_CHECK_GOTO(loco__gpt_cuda_pp_init(g, o), out_fail);
    LOCO_CHECK_GOTO(loco__gpt_cuda_moe_init(g, o, moe_sets(g)), out_fail);
    LOCO_CHECK_GOTO(o->stage ? loco_gpt_build_stage_table(&g->tt, cfg, o->stage)
                             : loco_gpt_build_table(&g->tt, cfg),
                    out_fail);
    g->P = g->tt.numel;
    g->head = cfg->untied ? "lm_head.weight" : "transformer.wte.weight";
    const int head = g->has_head ? loco_ttable_find(&g->tt, g->head) : -2;
    if (head == -1 || (head >= 0 && g->tt.t[head].numel != (size_t)g->Vl * cfg->n_embd)) {
        rc = LOCO_ERR(LOCO_EINVAL, "device model: no %s of %d rows in the table", g->head,
                      g->Vl);
        goto out_fail;
    }
    g->head_off = head >= 0 ? g->tt.t[head].offset : 0;
    if (hi == SIZE_MAX)
        hi = g->P;
    if (lo > hi || hi > g->P) {
        rc = LOCO_ERR(LOCO_EINVAL, "device model: owned range [%zu, %zu) of %zu parameters", lo,
                      hi, g->P);
        goto out_fail;
    }
    g->own_lo = lo;
    g->own_hi = hi;
    g->sharded = hi - lo < g->P;
    g->la = loco_alloc((size_t)cfg->n_layer * sizeof *g->la);
    if (!g->la) {
        rc = LOCO_ERR(LOCO_ENOMEM, "device model tables");
        goto out_fail;
    }
    const size_t N = (size_t)B * T;
    for (int k = 0; k < 2; k++) {
        LOCO_CHECK_GOTO(loco_cuda_host_alloc((void **)&g->h_tok[k], N * 4 * 2), out_fail);
        LOCO_CHECK_GOTO(loco_cuda_event_create(&g->copied[k]), out_fail);
        LOCO_CHECK_GOTO(loco_cuda_event_create(&g->consumed[k]), out_fail);
    }
    LOCO_CHECK_GOTO(loco_cuda_host_alloc((void **)&g->h_out, 4 * sizeof(double)), out_fail);
    if (g->tpc && g->tp_staged) { /* h_stage: (N, C), or sp's replicated gradients */
        LOCO_CHECK_GOTO(loco_cuda_host_alloc((void **)&g->h_stage,
                                             (N + (size_t)T + 4) *
                                                 (size_t)(cfg->n_embd > 3 ? cfg->n_embd : 3) * 4),
                        out_fail);
        LOCO_CHECK_GOTO(loco_cuda_host_alloc((void **)&g->h_pend, N * cfg->n_embd * 4), out_fail);
        LOCO_CHECK_GOTO(loco_cuda_event_create(&g->pend_copied), out_fail);
    }
    if (g->tpc && !(g->tp_counts = loco_alloc((size_t)g->tp * sizeof(size_t)))) {
        rc = LOCO_ERR(LOCO_ENOMEM, "tp counts");
        goto out_fail;
    }
    if (g->tpc && loco__gpt_kv_rep(cfg) > 1) { /* (C + 1) rows of c_attn's and of every kv head */
        const size_t rows = (size_t)cfg->n_embd + 1;
        const size_t ka = 2 * (size_t)loco_gpt_kv_heads(cfg) * loco_gpt_head_size(cfg);
        LOCO_CHECK_GOTO(
            loco_cuda_host_alloc((void **)&g->h_kv, rows * ((size_t)g->Wl + ka) * 4), out_fail);
    }
    LOCO_CHECK_GOTO(loco_cuda_slab_create(&g->slab, slab_bytes(g)), out_fail);
    LOCO_CHECK_GOTO(loco_blas_create(&g->blas), out_fail);
    LOCO_CHECK_GOTO(carve(g), out_fail);
    LOCO_CHECK_GOTO(loco__gpt_cuda_cp_host_init(g), out_fail);
    LOCO_CHECK_GOTO(index_units(g), out_fail);
    g->head_unit = head >= 0 ? g->tunit[head] : -1;
    if (g->rope_cos) { /* the CPU model's tables (model.c), computed once on the host */
        const int half = loco_gpt_head_size(cfg) / 2;
        const size_t n = (size_t)cfg->seq_len * half;
        float *tab = loco_alloc(2 * n * sizeof(float));
        if (!tab) {
            rc = LOCO_ERR(LOCO_ENOMEM, "RoPE tables of %zu floats", 2 * n);
            goto out_fail;
        }
        const loco_rope_scaling sc = {cfg->rope_factor, cfg->rope_low_freq, cfg->rope_high_freq,
                                      cfg->rope_original_max_pos};
        loco_rope_tables(tab, tab + n, cfg->seq_len, 2 * half,
                         cfg->rope_theta > 0 ? cfg->rope_theta : 10000.0f, &sc);
        rc = loco_cuda_copy(g->rope_cos, tab, n * 4, g->stream);
        if (!rc)
            rc = loco_cuda_copy(g->rope_sin, tab + n, n * 4, g->stream);
        if (!rc)
            rc = loco_cuda_sync(g->stream);
        loco_free(tab);
        if (rc)
            goto out_fail;
    }
    const size_t vpc = (size_t)g->Vp * cfg->n_embd, own4 = (hi - lo) * 4;
    LOCO_CHECK_GOTO(loco_cuda_zero(g->params, own4, g->stream), out_fail);
    LOCO_CHECK_GOTO(loco_cuda_zero(g->grads, own4, g->stream), out_fail);
    LOCO_CHECK_GOTO(loco_cuda_zero(g->m, own4, g->stream), out_fail);
    LOCO_CHECK_GOTO(loco_cuda_zero(g->v, own4, g->stream), out_fail);
    if (g->has_head) {
        LOCO_CHECK_GOTO(loco_cuda_zero(g->wte_pad, vpc * g->es, g->stream), out_fail);
        LOCO_CHECK_GOTO(loco_cuda_zero(g->dwte_pad, vpc * 4, g->stream), out_fail);
    }
    if (g->cp_dwpe)
        LOCO_CHECK_GOTO(loco_cuda_zero(g->cp_dwpe, (size_t)g->T * cfg->n_embd * 4, g->stream),
                        out_fail);
    if (g->drep)
        LOCO_CHECK_GOTO(loco_cuda_zero(g->drep, ((size_t)T + 4) * cfg->n_embd * 4, g->stream),
                        out_fail);
    LOCO_CHECK_GOTO(loco_cuda_zero(g->loss_acc, 8, g->stream), out_fail);
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
    if (g->slab) /* nothing may still run on what is freed */
        (void)loco_cuda_sync(g->stream);
    loco_blas_destroy(g->blas);
    loco_cuda_slab_destroy(g->slab);
    for (int k = 0; k < 2; k++) {
        if (g->copied[k])
            (void)loco_cuda_event_sync(g->copied[k]);
        loco_cuda_event_destroy(g->copied[k]);
        loco_cuda_event_destroy(g->consumed[k]);
        loco_cuda_host_free(g->h_tok[k]);
    }
    loco_cuda_host_free(g->h_out);
    loco_cuda_host_free(g->h_stage);
    loco_cuda_host_free(g->h_kv);
    loco_cuda_host_free(g->h_pend);
    loco_cuda_event_destroy(g->pend_copied);
    loco__gpt_cuda_cp_fini(g);
    loco__gpt_cuda_pp_fini(g);
    loco__gpt_cuda_moe_fini(g);
    for (int k = 0; k < 2; k++)
        loco_cuda_graph_destroy(g->graph[k].exec);
    loco_ttable_fini(&g->tt);
    loco_free(g->la);
    loco_free(g->tp_counts);
    loco_free(g->unit_lo);
    loco_free(g->tunit);
    loco_free(g->uw);
    loco_free(g->ug);
    loco_free(g);
}

int loco_gpt_cuda_set_attention(loco_gpt_cuda *g, const char *want) {
    return loco_cuda_attention_select(want, loco_gpt_head_size(&g->cfg), g->bf16, &g->attn);
}

size_t loco_gpt_cuda_bytes(const loco_gpt_cuda *g) {
    enum { BLAS_WORKSPACE = 32u << 20 }; /* owned by the loco_blas handle */
    return loco_cuda_slab_size(g->slab) + BLAS_WORKSPACE;
}

/* The passes' weights from the fp32 parameters: the bf16 copy, and the
 * head's padded wte (rows V.. stay zero). */
static int refresh_weights(loco_gpt_cuda *g) {
    const size_t vc = (size_t)g->Vl * g->cfg.n_embd;
    g->wversion++;
    if (g->sharded) { /* the gather source; wte_pad follows the head unit's next binding */
        g->head_stale = true;
        if (g->bf16)
            RUN(LOCO_PROF_OPT, loco_cuda_cast_bf16(g->wshard, g->params, g->own_hi - g->own_lo,
                                                   g->stream));
        return 0;
    }
    if (g->bf16)
        RUN(LOCO_PROF_OPT, loco_cuda_cast_bf16(g->w, g->params, g->P, g->stream));
    if (!g->has_head) /* a pipeline stage without the head */
        return 0;
    if (g->bf16)
        return loco_cuda_copy(g->wte_pad, (loco_bf16 *)g->w + g->head_off, vc * 2, g->stream);
    return loco_cuda_copy(g->wte_pad, g->params + g->head_off, vc * 4, g->stream);
}

int loco_gpt_cuda_upload(loco_gpt_cuda *g, const float *params, const float *m, const float *v) {
    const size_t bytes = (g->own_hi - g->own_lo) * sizeof(float);
    if (params)
        LOCO_CHECK(loco_cuda_copy(g->params, params, bytes, g->stream));
    if (m)
        LOCO_CHECK(loco_cuda_copy(g->m, m, bytes, g->stream));
    if (v)
        LOCO_CHECK(loco_cuda_copy(g->v, v, bytes, g->stream));
    LOCO_CHECK(refresh_weights(g));
    return loco_cuda_sync(g->stream);
}

int loco_gpt_cuda_download(loco_gpt_cuda *g, float *params, float *grads, float *m, float *v) {
    const size_t bytes = (g->own_hi - g->own_lo) * sizeof(float);
    if (params)
        LOCO_CHECK(loco_cuda_copy(params, g->params, bytes, g->stream));
    if (grads)
        LOCO_CHECK(loco_cuda_copy(grads, g->grads, bytes, g->stream));
    if (m)
        LOCO_CHECK(loco_cuda_copy(m, g->m, bytes, g->stream));
    if (v)
        LOCO_CHECK(loco_cuda_copy(v, g->v, bytes, g->stream));
    return loco_cuda_sync(g->stream);
}

int loco_gpt_cuda_zero_grad(loco_gpt_cuda *g) {
    RUN(LOCO_PROF_ELEM,
        loco_cuda_zero(g->grads, (g->own_hi - g->own_lo) * sizeof(float), g->stream));
    RUN(LOCO_PROF_ELEM, loco_cuda_zero(g->loss_acc, sizeof(double), g->stream));
    return 0;
}

void loco_gpt_cuda_profile(loco_gpt_cuda *g, bool on, double *secs) {
    g->profiling = on && secs;
    g->prof = on ? secs : NULL;
}

int loco_gpt_cuda_padding(loco_gpt_cuda *g, int *vp, size_t *nonzero) {
    const size_t C = (size_t)g->cfg.n_embd, V = (size_t)g->Vl;
    const size_t vpc = (size_t)g->Vp * C;
    *vp = g->Vp;
    *nonzero = 0;
    unsigned char *w = loco_alloc(vpc * g->es);
    float *d = loco_alloc(vpc * 4);
    int rc = 0;
    if (!w || !d) {
        rc = LOCO_ERR(LOCO_ENOMEM, "padding check");
        goto out;
    }
    LOCO_CHECK_GOTO(loco_cuda_copy(w, g->wte_pad, vpc * g->es, g->stream), out);
    LOCO_CHECK_GOTO(loco_cuda_copy(d, g->dwte_pad, vpc * 4, g->stream), out);
    LOCO_CHECK_GOTO(loco_cuda_sync(g->stream), out);
    for (size_t i = V * C * g->es; i < vpc * g->es; i++)
        *nonzero += w[i] != 0;
    for (size_t i = 0; i < vpc; i++)
        *nonzero += d[i] != 0.0f;
out:
    loco_free(w);
    loco_free(d);
    return rc;
}

/* A tensor in its unit's buffer (units[u] laid out like the unit's flat
 * range, element size es). */
static void *tensor(const loco_gpt_cuda *g, void *const *units, size_t es, const char *name) {
    const int i = loco_ttable_find(&g->tt, name);
    if (i < 0)
        return NULL;
    const int u = g->tunit[i];
    return (char *)units[u] + (g->tt.t[i].offset - g->unit_lo[u]) * es;
}

void *loco__gpt_cuda_tensor(const loco_gpt_cuda *g, bool grads, const char *name) {
    return grads ? tensor(g, (void *const *)g->ug, 4, name) : tensor(g, g->uw, g->es, name);
}

#define W(name) tensor(g, g->uw, g->es, name)
#define G(name) ((float *)tensor(g, (void *const *)g->ug, 4, name))

/* The hooks, where set (loco_gpt_cuda_set_hooks). */
#define ACQUIRE(unit, bwd)                                                                        \
    LOCO_CHECK(g->hooks.acquire ? g->hooks.acquire(g->hooks.ctx, unit, bwd) : 0)
#define GRADS_READY(unit)                                                                         \
    LOCO_CHECK(g->hooks.grads_ready ? g->hooks.grads_ready(g->hooks.ctx, unit) : 0)

/* A sharded model: every unit the passes use must have been bound. */
static int check_bound(const loco_gpt_cuda *g, int unit, bool grads) {
    if (!g->uw[unit] || (grads && !g->ug[unit]))
        return LOCO_ERR(LOCO_EINVAL, "device model: unit %d has no %s bound (a sharded model's "
                        "hooks bind them in acquire)", unit, g->uw[unit] ? "gradients" : "weights");
    return 0;
}

/* Checks a batch against the capacity and the vocabulary; under context
 * parallelism *inputs, *targets and *Tp become this rank's rows of each
 * sequence. */
int loco__gpt_cuda_check_tokens(loco_gpt_cuda *g, const int32_t **inputs_p,
                                const int32_t **targets_p, int B, int *Tp) {
    LOCO_CHECK(loco__gpt_cuda_cp_localize(g, inputs_p, targets_p, B, Tp));
    const int32_t *inputs = *inputs_p, *targets = *targets_p;
    const int T = *Tp;
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
    return 0;
}

/* Checks the batch and queues its copy to the device: host -> pinned slot
 * -> device slot on the copy stream; the compute stream waits for it. */
static int load_tokens(loco_gpt_cuda *g, const int32_t *inputs, const int32_t *targets, int B,
                       int *Tp) {
    if (g->slots)
        return LOCO_ERR(LOCO_EINVAL, "device model: a pipeline stage runs chunk passes "
                                     "(loco_gpt_cuda_chunk_*), not the whole model's");
    LOCO_CHECK(loco__gpt_cuda_check_tokens(g, &inputs, &targets, B, Tp));
    const int T = *Tp, N = B * T;
    const int k = g->slot ^= 1;
    const size_t cap = (size_t)g->B * g->T, bytes = (size_t)N * 4;
    int32_t *h = g->h_tok[k], *d = g->d_tok[k];
    LOCO_CHECK(loco_cuda_event_sync(g->copied[k])); /* the pinned slot's last copy */
    memcpy(h, inputs, bytes);
    if (targets)
        memcpy(h + cap, targets, bytes);
    LOCO_CHECK(loco_cuda_stream_wait(g->copy, g->consumed[k])); /* the slot's last reader */
    LOCO_CHECK(loco_cuda_copy(d, h, bytes, g->copy));
    if (targets)
        LOCO_CHECK(loco_cuda_copy(d + cap, h + cap, bytes, g->copy));
    LOCO_CHECK(loco_cuda_event_record(g->copied[k], g->copy));
    LOCO_CHECK(loco_cuda_stream_wait(g->stream, g->copied[k]));
    g->inputs = d;
    g->targets = d + cap;
    return 0;
}

/* After the last kernel that reads the current token slot. */
static int tokens_consumed(loco_gpt_cuda *g) {
    return loco_cuda_event_record(g->consumed[g->slot], g->stream);
}

/* Blocks, ln_f and the head: logits (N,Vp). */
static int forward_body(loco_gpt_cuda *g, int B, int T) {
    const int C = g->cfg.n_embd, L = g->cfg.n_layer;
    loco_stream s = g->stream;
    ACQUIRE(0, false);
    LOCO_CHECK(check_bound(g, 0, false));
    /* sharded: the head's copy of the newly bound wte or lm_head */
    const size_t vce = (size_t)g->Vl * C * g->es;
    if (g->head_stale && g->head_unit == 0) {
        LOCO_CHECK(loco_cuda_copy(g->wte_pad, W(g->head), vce, s));
        g->head_stale = false;
    }
    LOCO_CHECK(loco__gpt_cuda_embed_fwd(g, B, T));
    for (int l = 0; l < L; l++) {
        ACQUIRE(l + 1, false);
        LOCO_CHECK(check_bound(g, l + 1, false));
        LOCO_CHECK(loco__gpt_cuda_block_fwd(g, l, B, T));
    }
    ACQUIRE(L + 1, false);
    LOCO_CHECK(check_bound(g, L + 1, false));
    if (g->head_stale && g->head_unit == L + 1) {
        LOCO_CHECK(loco_cuda_copy(g->wte_pad, W(g->head), vce, s));
        g->head_stale = false;
    }
    return loco__gpt_cuda_head_fwd(g, B * T);
}

/* Waits for the compute stream and reads the last pass's mean loss (over
 * the whole sequences under cp: every rank holds as many tokens, the mean
 * of the ranks' means; collective over cp). */
int loco__gpt_cuda_read_mean(loco_gpt_cuda *g, float *mean_loss) {
    LOCO_CHECK(loco_cuda_copy(g->h_out, g->mean, sizeof(float), g->stream));
    LOCO_CHECK(loco_cuda_sync(g->stream));
    memcpy(mean_loss, g->h_out, sizeof(float));
    double v = *mean_loss;
    LOCO_CHECK(loco__gpt_cuda_cp_mean(g, &v));
    *mean_loss = (float)v;
    return 0;
}

int loco_gpt_cuda_forward(loco_gpt_cuda *g, const int32_t *inputs, const int32_t *targets, int B,
                          int T, float *mean_loss) {
    LOCO_CHECK(load_tokens(g, inputs, targets, B, &T));
    LOCO_CHECK(forward_body(g, B, T));
    if (targets)
        LOCO_CHECK(loco__gpt_cuda_loss(g, B * T, 0.0f, false));
    LOCO_CHECK(tokens_consumed(g));
    if (targets && mean_loss)
        return loco__gpt_cuda_read_mean(g, mean_loss);
    return loco_cuda_sync(g->stream);
}

/* The forward and backward of the current token slot, enqueued. */
static int passes(loco_gpt_cuda *g, int B, int T, float loss_scale) {
    g->loss_scale = loss_scale; /* the MoE blocks' losses are scaled alike */
    LOCO_CHECK(forward_body(g, B, T));
    const int L = g->cfg.n_layer, N = B * T;
    LOCO_CHECK(loco__gpt_cuda_loss(g, N, loss_scale / (float)N, true));
    ACQUIRE(0, true);
    ACQUIRE(L + 1, true);
    LOCO_CHECK(check_bound(g, 0, true));
    LOCO_CHECK(check_bound(g, L + 1, true));
    LOCO_CHECK(loco__gpt_cuda_head_bwd(g, N, false));
    GRADS_READY(L + 1);
    for (int l = L - 1; l >= 0; l--) {
        ACQUIRE(l + 1, true);
        LOCO_CHECK(check_bound(g, l + 1, true));
        /* a recomputed block's activations, from its kept input (the
         * shared set still holds the last one the forward ran) */
        if (l < g->n_rerun && l != g->n_rerun - 1) {
            g->rerunning = true;
            const int rc = loco__gpt_cuda_block_fwd(g, l, B, T);
            g->rerunning = false;
            LOCO_CHECK(rc);
        }
        LOCO_CHECK(loco__gpt_cuda_block_bwd(g, l, B, T, false));
        GRADS_READY(l + 1);
    }
    LOCO_CHECK(loco__gpt_cuda_embed_bwd(g, B, T));
    GRADS_READY(0);
    return 0;
}

void loco_gpt_cuda_set_graph(loco_gpt_cuda *g, bool on) {
    g->graph_on = on;
    for (int k = 0; k < 2; k++) {
        loco_cuda_graph_destroy(g->graph[k].exec);
        g->graph[k].exec = NULL;
    }
}

/* passes() as one CUDA graph launch: captured per token slot on the first
 * call with a shape (B, T, loss_scale) after a plain pass has made the
 * GEMM plans, relaunched while the shape holds. *done false: the caller
 * runs the plain passes (no graph yet, or capture failed: graphs are then
 * off, with a warning). */
static int graph_passes(loco_gpt_cuda *g, int B, int T, float loss_scale, bool *done) {
    *done = false;
    /* the hooks and the tp collectives run host code between the launches */
    if (!g->graph_on || g->profiling || !g->warm || g->hooks.acquire || g->hooks.grads_ready ||
        g->tp > 1 || g->cpc)
        return 0;
    step_graph *gr = &g->graph[g->slot];
    if (gr->exec && (gr->B != B || gr->T != T || gr->scale != loss_scale)) {
        loco_cuda_graph_destroy(gr->exec);
        gr->exec = NULL;
    }
    if (!gr->exec) {
        if (loco_cuda_capture_begin(g->stream) < 0) {
            loco_warn("train.cuda_graph = on: %s; plain launches from now", loco_errmsg());
            g->graph_on = false;
            return 0;
        }
        const int rc = passes(g, B, T, loss_scale);
        const int rc_end = loco_cuda_capture_end(g->stream, &gr->exec);
        if (rc < 0 || rc_end < 0) {
            loco_warn("train.cuda_graph = on: the step could not be captured (%s); plain "
                      "launches from now",
                      loco_errmsg());
            loco_cuda_graph_destroy(gr->exec);
            gr->exec = NULL;
            g->graph_on = false;
            return 0;
        }
        gr->B = B;
        gr->T = T;
        gr->scale = loss_scale;
    }
    LOCO_CHECK(loco_cuda_graph_launch(gr->exec, g->stream));
    *done = true;
    return 0;
}

int loco_gpt_cuda_forward_backward(loco_gpt_cuda *g, const int32_t *inputs,
                                   const int32_t *targets, int B, int T, float loss_scale,
                                   float *mean_loss) {
    if (!targets)
        return LOCO_ERR(LOCO_EINVAL, "a backward pass needs targets");
    LOCO_CHECK(load_tokens(g, inputs, targets, B, &T));
    bool done;
    LOCO_CHECK(graph_passes(g, B, T, loss_scale, &done));
    if (!done) {
        LOCO_CHECK(passes(g, B, T, loss_scale));
        g->warm = true;
    }
    LOCO_CHECK(tokens_consumed(g));
    return mean_loss ? loco__gpt_cuda_read_mean(g, mean_loss) : 0;
}

/* The gradient norm's sum of squares and the clip, both on the device. */
static int clip_queue(loco_gpt_cuda *g, double max_norm) {
    if (g->sharded || g->tp > 1) /* the norm sums over ranks */
        return LOCO_ERR(LOCO_EINVAL, "device model: a sharded model or a tp slice clips by "
                                     "range (loco_gpt_cuda_grad_sumsq, loco_gpt_cuda_scale_grads)");
    RUN(LOCO_PROF_OPT, loco_cuda_sumsq(g->sumsq, g->grads, g->P, g->stream));
    RUN(LOCO_PROF_OPT, loco_cuda_clip_scale(g->grads, g->P, g->sumsq, max_norm, g->stream));
    return 0;
}

/* AdamW on every tensor (skipped on the device when *gate is not finite),
 * then the passes' weights. */
static int adamw_queue(loco_gpt_cuda *g, const loco_adamw *opt, float lr, const double *gate) {
    if (g->sharded)
        return LOCO_ERR(LOCO_EINVAL, "device model: a sharded model updates its owned range "
                                     "(loco_gpt_cuda_adamw_range)");
    const int64_t t = opt->t + 1;
    for (int i = 0; i < g->tt.n; i++) {
        const loco_tensor *tn = &g->tt.t[i];
        const float wd = tn->decay ? opt->weight_decay : 0.0f;
        const size_t o = tn->offset;
        RUN(LOCO_PROF_OPT,
            loco_cuda_adamw_update_gated(g->params + o, g->grads + o, g->m + o, g->v + o,
                                         tn->numel, lr, opt->beta1, opt->beta2, opt->eps, wd, t,
                                         gate, g->stream));
    }
    return refresh_weights(g);
}

int loco_gpt_cuda_clip(loco_gpt_cuda *g, double max_norm, double *norm) {
    LOCO_CHECK(clip_queue(g, max_norm));
    LOCO_CHECK(loco_cuda_copy(g->h_out, g->sumsq, sizeof(double), g->stream));
    LOCO_CHECK(loco_cuda_sync(g->stream));
    *norm = sqrt(g->h_out[0]);
    return 0;
}

int loco_gpt_cuda_adamw(loco_gpt_cuda *g, loco_adamw *opt, float lr) {
    LOCO_CHECK(adamw_queue(g, opt, lr, NULL));
    LOCO_CHECK(loco_cuda_sync(g->stream));
    opt->t++;
    return 0;
}

int loco_gpt_cuda_loss_sum(loco_gpt_cuda *g, double *sum) {
    LOCO_CHECK(loco_cuda_copy(g->h_out + 1, g->loss_acc, sizeof(double), g->stream));
    LOCO_CHECK(loco_cuda_sync(g->stream));
    *sum = g->h_out[1];
    return loco__gpt_cuda_cp_mean(g, sum); /* the whole sequences' (collective over cp) */
}

int loco_gpt_cuda_clip_adamw(loco_gpt_cuda *g, loco_adamw *opt, float lr, double max_norm,
                             double *norm, double *loss_sum) {
    LOCO_CHECK(clip_queue(g, max_norm));
    LOCO_CHECK(adamw_queue(g, opt, lr, g->sumsq));
    LOCO_CHECK(loco_cuda_copy(g->h_out, g->sumsq, sizeof(double), g->stream));
    LOCO_CHECK(loco_cuda_copy(g->h_out + 1, g->loss_acc, sizeof(double), g->stream));
    LOCO_CHECK(loco_cuda_sync(g->stream));
    *norm = sqrt(g->h_out[0]);
    if (loss_sum)
        *loss_sum = g->h_out[1];
    if (isfinite(*norm))
        opt->t++;
    return 0;
}

#endif /* LOCO_HAVE_CUDA */
