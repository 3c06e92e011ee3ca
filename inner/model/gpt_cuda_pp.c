/* A pipeline stage of the device model (model.h, loco_gpt_cuda_chunk_*):
 * the chunks of blocks this rank holds, over the stage's table
 * (loco_gpt_build_stage_table, as the CPU stage's), one (micro-batch,
 * chunk) pass at a time in an activation slot.
 *
 * A slot holds what a chunk keeps from its F for its B (and W): the
 * longest chunk's blocks by position, the chunk's input, the micro-batch's
 * tokens and, on the stage with the head, ln_f's output and the logits
 * (their gradient from the F on). A pass binds its slot by pointing the
 * model's per-block sets (g->la) and buffers (encoded, inputs, lnf,
 * logits) at the slot's, then runs gpt_cuda.c's pieces: the kernels, tp,
 * sp and cp are the whole model's.
 *
 * B and W: a schedule that fuses them (GPipe, 1F1B, interleaved) runs the
 * whole backward in B, as the whole model does. A split one (zero bubble,
 * DualPipe: opts split_w) runs the input half in B and keeps the four
 * GEMMs' output gradients of each block (k* buffers, in the slot) for W,
 * which adds the weight and bias gradients. Fully recomputed blocks rerun
 * their forward and their whole backward in B (as model_stage.c), sharing
 * one set (rerun_set); a slot position every chunk fills with recomputed
 * blocks keeps only its output.
 *
 * Activations between chunks are host arrays in fp32 (what the pipeline
 * executor moves): staged through a pinned buffer, cast from and to bf16
 * on the device (exact: they are bf16 values). Each pass waits for its
 * result before it returns (its output, its input gradient or the loss). */
#include "inner/model/gpt_cuda_internal.h"

#if defined(LOCO_HAVE_CUDA)

#include <string.h>

#define SLAB(ptr, bytes, what)                                                                     \
    LOCO_CHECK(loco_cuda_slab_alloc(g->slab, (void **)&(ptr), (size_t)(bytes), what))

/* Rows of this rank between the tp regions (R) and of a pass (N), at
 * capacity. */
static size_t cap_rows(const loco_gpt_cuda *g, size_t *N) {
    *N = (size_t)g->B * g->T;
    return g->sp ? *N / (size_t)g->tp : *N;
}

/* Slot position j holds only recomputed blocks, whichever chunk runs in
 * it: it keeps their outputs only. */
static bool rerun_only(const loco_gpt_cuda *g, int j) {
    for (int c = 0; c < g->stage.n; c++)
        if (g->stage.end[c] - g->stage.first[c] > j && g->stage.first[c] + j >= g->n_rerun)
            return false;
    return true;
}

static bool holds_rerun(const loco_gpt_cuda *g) {
    return g->n_rerun > 0 && g->stage.first[0] < g->n_rerun;
}

/* Slot position j holds an MoE block in some chunk (kept, not rerun). */
static bool moe_at(const loco_gpt_cuda *g, int j) {
    for (int c = 0; c < g->stage.n; c++) {
        const int l = g->stage.first[c] + j;
        if (l < g->stage.end[c] && l >= g->n_rerun && loco__gpt_cuda_is_moe(g, l))
            return true;
    }
    return false;
}

/* Slot position j holds a dense MLP in some chunk (kept, not rerun). */
static bool mlp_at(const loco_gpt_cuda *g, int j) {
    for (int c = 0; c < g->stage.n; c++) {
        const int l = g->stage.first[c] + j;
        if (l < g->stage.end[c] && l >= g->n_rerun && !loco__gpt_cuda_is_moe(g, l))
            return true;
    }
    return false;
}

/* Some recomputed block of the stage is MoE (moe) or dense: the shared
 * set carries it. */
static bool rerun_has(const loco_gpt_cuda *g, bool moe) {
    for (int c = 0; c < g->stage.n; c++)
        for (int l = g->stage.first[c]; l < g->stage.end[c] && l < g->n_rerun; l++)
            if (loco__gpt_cuda_is_moe(g, l) == moe)
                return true;
    return false;
}

int loco__gpt_cuda_pp_moe_sets(const loco_gpt_cuda *g) {
    int n = holds_rerun(g) && rerun_has(g, true);
    for (int j = 0; j < g->max_chunk; j++)
        n += g->stage.slots * moe_at(g, j);
    return n;
}

/* A split B's kept output gradients of one block. */
static size_t keep_bytes(const loco_gpt_cuda *g) {
    size_t N;
    (void)cap_rows(g, &N);
    return g->split_w ? N * (2 * (size_t)g->cfg.n_embd + g->Fl + g->Wl) * g->es : 0;
}

int loco__gpt_cuda_pp_init(loco_gpt_cuda *g, const loco_gpt_cuda_opts *o) {
    g->has_embed = g->has_head = true;
    if (!o->stage)
        return 0;
    const loco_gpt_stage *st = o->stage;
    if (st->n < 1 || st->n > LOCO_GPT_MAX_CHUNKS || st->slots < 1)
        return LOCO_ERR(LOCO_EINVAL,
                        "device model: a pipeline stage of %d chunks and %d activation slots "
                        "(1..%d chunks, at least one slot)",
                        st->n, st->slots, LOCO_GPT_MAX_CHUNKS);
    if (o->lo != 0 || (o->hi != SIZE_MAX))
        return LOCO_ERR(LOCO_ENOTSUP, "device model: a pipeline stage holds its whole state "
                                      "(ZeRO-3 over a pipeline stage runs on the CPU path)");
    g->stage = *st;
    g->split_w = o->split_w;
    g->has_embed = st->first[0] == 0;
    g->has_head = st->end[st->n - 1] == g->cfg.n_layer;
    g->max_chunk = 0;
    for (int c = 0; c < st->n; c++)
        if (st->end[c] - st->first[c] > g->max_chunk)
            g->max_chunk = st->end[c] - st->first[c];
    if (g->max_chunk < 1)
        return LOCO_ERR(LOCO_EINVAL, "device model: a pipeline chunk without blocks");
    g->slots = loco_alloc((size_t)st->slots * sizeof *g->slots);
    if (!g->slots)
        return LOCO_ERR(LOCO_ENOMEM, "pipeline slots");
    memset(g->slots, 0, (size_t)st->slots * sizeof *g->slots);
    for (int k = 0; k < st->slots; k++) {
        g->slots[k].la = loco_alloc((size_t)g->max_chunk * sizeof(layer_acts));
        if (!g->slots[k].la)
            return LOCO_ERR(LOCO_ENOMEM, "pipeline slot tables");
        memset(g->slots[k].la, 0, (size_t)g->max_chunk * sizeof(layer_acts));
    }
    size_t N;
    const size_t R = cap_rows(g, &N);
    return loco_cuda_host_alloc((void **)&g->h_pp, R * g->cfg.n_embd * 4);
}

void loco__gpt_cuda_pp_fini(loco_gpt_cuda *g) {
    for (int k = 0; g->slots && k < g->stage.slots; k++)
        loco_free(g->slots[k].la);
    loco_free(g->slots);
    g->slots = NULL;
    loco_cuda_host_free(g->h_pp);
}

size_t loco__gpt_cuda_pp_bytes(const loco_gpt_cuda *g) {
    size_t N;
    const size_t R = cap_rows(g, &N), C = (size_t)g->cfg.n_embd, es = g->es;
    size_t per_slot = R * C * es + N * 4 * 2 + 3 * 256;
    if (g->has_head)
        per_slot += N * C * es + R * 4 * 2 + N * (size_t)g->Vp * es + 4 * 256;
    for (int j = 0; j < g->max_chunk; j++)
        per_slot += rerun_only(g, j)
                        ? R * C * es + 256
                        : loco__gpt_cuda_block_bytes(g, true) + keep_bytes(g) + 21 * 256;
    return (size_t)g->stage.slots * per_slot +
           (holds_rerun(g) ? loco__gpt_cuda_block_bytes(g, true) : 0) + 17 * 256 +
           (g->bf16 ? R * C * 4 + 256 : 0);
}

int loco__gpt_cuda_pp_carve(loco_gpt_cuda *g) {
    size_t N;
    const size_t R = cap_rows(g, &N), C = (size_t)g->cfg.n_embd, es = g->es;
    if (g->bf16)
        SLAB(g->pp_f32, R * C * 4, "a chunk's input or output in fp32");
    if (holds_rerun(g))
        LOCO_CHECK(loco__gpt_cuda_carve_block(g, &g->rerun_set, rerun_has(g, false)));
    if (holds_rerun(g) && rerun_has(g, true))
        LOCO_CHECK(loco__gpt_cuda_moe_carve_block(g, &g->rerun_set));
    for (int k = 0; k < g->stage.slots; k++) {
        stage_slot *sl = &g->slots[k];
        SLAB(sl->in, R * C * es, "a slot's chunk input");
        SLAB(sl->tok, N * 4 * 2, "a slot's tokens");
        if (g->has_head) {
            SLAB(sl->lnf, N * C * es, "a slot's ln_f");
            SLAB(sl->lnfm, R * 4, "a slot's ln_f mean");
            SLAB(sl->lnfr, R * 4, "a slot's ln_f rstd");
            SLAB(sl->logits, N * (size_t)g->Vp * es, "a slot's logits");
        }
        for (int j = 0; j < g->max_chunk; j++) {
            layer_acts *a = &sl->la[j];
            if (rerun_only(g, j)) {
                SLAB(a->res3, R * C * es, "residual3");
                g->act_bytes += R * C * es;
                continue;
            }
            LOCO_CHECK(loco__gpt_cuda_carve_block(g, a, mlp_at(g, j)));
            if (moe_at(g, j))
                LOCO_CHECK(loco__gpt_cuda_moe_carve_block(g, a));
            if (!g->split_w)
                continue;
            SLAB(a->kmlp, N * C * es, "mlp.c_proj's output gradient, kept for W");
            SLAB(a->kfch, N * (size_t)g->Fl * es, "c_fc's output gradient, kept for W");
            SLAB(a->kattn, N * C * es, "attn.c_proj's output gradient, kept for W");
            SLAB(a->kqkv, N * (size_t)g->Wl * es, "c_attn's output gradient, kept for W");
            g->act_bytes += keep_bytes(g);
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- passes */

/* Binds slot's buffers for a pass of chunk; *T becomes the local rows
 * (cp). want: the phase the pass needs (-1: any, a forward). */
static int use_slot(loco_gpt_cuda *g, int slot, int chunk, int B, int *T, int want) {
    if (!g->slots)
        return LOCO_ERR(LOCO_EINVAL, "device model: chunk passes need a pipeline stage "
                                     "(loco_gpt_cuda_opts.stage)");
    if (slot < 0 || slot >= g->stage.slots || chunk < 0 || chunk >= g->stage.n)
        return LOCO_ERR(LOCO_EINVAL, "device model: slot %d of %d, chunk %d of %d", slot,
                        g->stage.slots, chunk, g->stage.n);
    stage_slot *sl = &g->slots[slot];
    if (want >= 0 && (sl->phase != want || sl->chunk != chunk))
        return LOCO_ERR(LOCO_EINVAL,
                        "device model: a %s of chunk %d in slot %d, which holds %s "
                        "of chunk %d",
                        want == 1 ? "backward" : "weight backward", chunk, slot,
                        sl->phase == 0   ? "nothing"
                        : sl->phase == 1 ? "the forward"
                                         : "the "
                                           "backward",
                        sl->chunk);
    const int Tl = g->cpc ? *T / g->cp : *T;
    if (B < 1 || Tl < 1 || B > g->B || Tl > g->T || (g->cpc && *T % (2 * g->cp)))
        return LOCO_ERR(LOCO_EINVAL, "batch %dx%d exceeds the device model's capacity %dx%d", B, *T,
                        g->B, g->cpc ? g->Tw : g->T);
    *T = Tl;
    const int first = g->stage.first[chunk], end = g->stage.end[chunk];
    for (int l = first; l < end; l++) {
        const layer_acts *a = &sl->la[l - first];
        if (l < g->n_rerun) { /* the shared set, its own output */
            g->la[l] = g->rerun_set;
            g->la[l].res3 = a->res3;
        } else {
            g->la[l] = *a;
        }
    }
    g->pass_first = first;
    g->encoded = sl->in;
    g->inputs = sl->tok;
    g->targets = sl->tok + (size_t)g->B * g->T;
    g->lnf = sl->lnf, g->lnfm = sl->lnfm, g->lnfr = sl->lnfr, g->logits = sl->logits;
    return 0;
}

/* A host (R, C) fp32 array into a device buffer of the model's type. */
static int rows_in(loco_gpt_cuda *g, void *dst, const float *src, size_t n) {
    memcpy(g->h_pp, src, n * 4);
    LOCO_CHECK(loco_cuda_copy(g->bf16 ? (void *)g->pp_f32 : dst, g->h_pp, n * 4, g->stream));
    if (g->bf16)
        LOCO_CHECK(loco_cuda_cast_bf16(dst, g->pp_f32, n, g->stream));
    return loco_cuda_sync(g->stream); /* h_pp is reused */
}

/* A device buffer of the model's type into a host fp32 array (waits). */
static int rows_out(loco_gpt_cuda *g, float *dst, const void *src, size_t n) {
    if (g->bf16)
        LOCO_CHECK(loco_cuda_cast_f32(g->pp_f32, src, n, g->stream));
    LOCO_CHECK(loco_cuda_copy(g->h_pp, g->bf16 ? (const void *)g->pp_f32 : src, n * 4, g->stream));
    LOCO_CHECK(loco_cuda_sync(g->stream));
    memcpy(dst, g->h_pp, n * 4);
    return 0;
}

/* The micro-batch's tokens (this rank's rows under cp) into the slot. */
static int load_tokens(loco_gpt_cuda *g, const int32_t *inputs, const int32_t *targets, int B,
                       int T) {
    int Tl = T;
    LOCO_CHECK(loco__gpt_cuda_check_tokens(g, &inputs, &targets, B, &Tl));
    const size_t n = (size_t)B * Tl, cap = (size_t)g->B * g->T;
    int32_t *h = g->h_tok[0];
    memcpy(h, inputs, n * 4);
    LOCO_CHECK(loco_cuda_copy(g->inputs, h, n * 4, g->stream));
    if (targets) {
        memcpy(h + cap, targets, n * 4);
        LOCO_CHECK(loco_cuda_copy(g->targets, h + cap, n * 4, g->stream));
    }
    return loco_cuda_sync(g->stream); /* h_tok[0] is reused by the next chunk */
}

static int rows_of_pass(const loco_gpt_cuda *g, int N) {
    return g->sp ? N / g->tp : N;
}

int loco_gpt_cuda_chunk_forward(loco_gpt_cuda *g, int slot, int chunk, const int32_t *inputs,
                                const int32_t *targets, int B, int T, const float *in, float *out,
                                float loss_scale, float *loss) {
    const int Tw = T;
    LOCO_CHECK(use_slot(g, slot, chunk, B, &T, -1));
    const int first = g->stage.first[chunk], end = g->stage.end[chunk];
    const bool embed = first == 0, head = end == g->cfg.n_layer;
    const int N = B * T;
    const size_t rc = (size_t)rows_of_pass(g, N) * g->cfg.n_embd;
    g->slots[slot].phase = 0;
    if ((embed || head) && (!inputs || (head && !targets)))
        return LOCO_ERR(LOCO_EINVAL, "device model: chunk %d needs the micro-batch's %s", chunk,
                        inputs ? "targets" : "tokens");
    if (!embed && !in)
        return LOCO_ERR(LOCO_EINVAL,
                        "device model: chunk %d starts at block %d: it needs its "
                        "input",
                        chunk, first);
    if (!head && !out)
        return LOCO_ERR(LOCO_EINVAL,
                        "device model: chunk %d ends at block %d: it needs a place "
                        "for its output",
                        chunk, end);
    g->loss_scale = loss_scale; /* the MoE blocks' losses are scaled alike */
    if (embed || head)
        LOCO_CHECK(load_tokens(g, inputs, head ? targets : NULL, B, Tw));
    if (embed)
        LOCO_CHECK(loco__gpt_cuda_embed_fwd(g, B, T));
    else
        LOCO_CHECK(rows_in(g, g->encoded, in, rc));
    for (int l = first; l < end; l++)
        LOCO_CHECK(loco__gpt_cuda_block_fwd(g, l, B, T));
    g->slots[slot].chunk = chunk;
    g->slots[slot].phase = 1;
    if (!head)
        return rows_out(g, out, g->la[end - 1].res3, rc);
    /* the loss and, in place, the logits' gradient for the B */
    LOCO_CHECK(loco__gpt_cuda_head_fwd(g, N));
    LOCO_CHECK(loco__gpt_cuda_loss(g, N, loss_scale / (float)N, true));
    float mean;
    LOCO_CHECK(loco__gpt_cuda_read_mean(g, &mean));
    if (loss)
        *loss = mean;
    return 0;
}

int loco_gpt_cuda_chunk_backward_input(loco_gpt_cuda *g, int slot, int chunk, int B, int T,
                                       const float *dout, float *din) {
    LOCO_CHECK(use_slot(g, slot, chunk, B, &T, 1));
    const int first = g->stage.first[chunk], end = g->stage.end[chunk];
    const bool embed = first == 0, head = end == g->cfg.n_layer;
    const int N = B * T;
    const size_t rc = (size_t)rows_of_pass(g, N) * g->cfg.n_embd;
    if (!head && !dout)
        return LOCO_ERR(LOCO_EINVAL,
                        "device model: chunk %d ends at block %d: it needs its "
                        "output's gradient",
                        chunk, end);
    if (!embed && !din)
        return LOCO_ERR(LOCO_EINVAL,
                        "device model: chunk %d starts at block %d: it needs a "
                        "place for its input's gradient",
                        chunk, first);
    if (head)
        LOCO_CHECK(loco__gpt_cuda_head_bwd(g, N, g->split_w));
    else
        LOCO_CHECK(rows_in(g, g->dres, dout, rc));
    for (int l = end - 1; l >= first; l--) {
        if (l < g->n_rerun) { /* rerun into the shared set, then its whole backward */
            g->rerunning = true;
            const int rc = loco__gpt_cuda_block_fwd(g, l, B, T);
            g->rerunning = false;
            LOCO_CHECK(rc);
        }
        LOCO_CHECK(loco__gpt_cuda_block_bwd(g, l, B, T, g->split_w && l >= g->n_rerun));
    }
    g->slots[slot].phase = 2;
    if (embed) {
        LOCO_CHECK(loco__gpt_cuda_embed_bwd(g, B, T));
        return loco_cuda_sync(g->stream);
    }
    return rows_out(g, din, g->dres, rc);
}

int loco_gpt_cuda_chunk_backward_weight(loco_gpt_cuda *g, int slot, int chunk, int B, int T) {
    LOCO_CHECK(use_slot(g, slot, chunk, B, &T, 2));
    const int first = g->stage.first[chunk], end = g->stage.end[chunk];
    g->slots[slot].phase = 0;
    if (!g->split_w) /* B ran the whole backward */
        return 0;
    if (end == g->cfg.n_layer)
        LOCO_CHECK(loco__gpt_cuda_head_bwd_weight(g, B * T));
    for (int l = end - 1; l >= first && l >= g->n_rerun; l--)
        LOCO_CHECK(loco__gpt_cuda_block_bwd_weight(g, l, B, T));
    return 0;
}

#endif /* LOCO_HAVE_CUDA */
