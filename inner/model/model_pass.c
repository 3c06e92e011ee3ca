/* GPT-2's passes over flat buffers: a block's forward and the two halves
 * of its backward, the head, and the whole model's forward and
 * forward_backward with the hooks (ZeRO) called unit by unit. Every loop
 * lives in kernels/. */
#include "inner/comm/comm.h"
#include "inner/model/internal.h"
#include "kernels/kernels.h"

#include <math.h>
#include <string.h>

static int acquire(loco_gpt *m, int unit, bool backward) {
    return m->hooks.acquire ? m->hooks.acquire(m->hooks.ctx, m, unit, backward) : 0;
}
static int release(loco_gpt *m, int unit, bool backward) {
    return m->hooks.release ? m->hooks.release(m->hooks.ctx, m, unit, backward) : 0;
}
static int grads_ready(loco_gpt *m, int unit) {
    return m->hooks.grads_ready ? m->hooks.grads_ready(m->hooks.ctx, m, unit) : 0;
}

/* What a pass of a B x T batch needs of the model: activations, the
 * capacity, a row split under sp. */
int loco__gpt_check_capacity(const loco_gpt *m, int B, int T) {
    if (!m->act_slab)
        return LOCO_ERR(LOCO_EINVAL, "this model holds no activations (LOCO_GPT_NO_ACTS: its "
                                     "passes run on the device)");
    if (B < 1 || T < 1 || B > m->B || T > m->T)
        return LOCO_ERR(LOCO_EINVAL, "batch %dx%d exceeds the model's capacity %dx%d", B, T, m->B,
                        m->T);
    if (m->par.sp && ((size_t)B * (size_t)T) % (size_t)m->cfg.tp)
        return LOCO_ERR(LOCO_EINVAL,
                        "sequence parallelism: a %dx%d batch does not split over %d "
                        "tp ranks",
                        B, T, m->cfg.tp);
    return 0;
}

/* The same for a pass from tokens, which must be in the vocabulary. */
int loco__gpt_check_tokens(const loco_gpt *m, const int32_t *inputs, int B, int T) {
    LOCO_CHECK(loco__gpt_check_capacity(m, B, T));
    for (int i = 0; i < B * T; i++)
        if (inputs[i] < 0 || inputs[i] >= m->cfg.vocab_size)
            return LOCO_ERR(LOCO_EINVAL, "token %d at %d outside the vocabulary [0, %d)", inputs[i],
                            i, m->cfg.vocab_size);
    return 0;
}

/* ---------------------------------------------------------------- passes */

/* The description's norm: LayerNorm (mean, rstd kept) or RMSNorm (rstd). */
static void norm_fwd(const loco_gpt *m, float *out, float *mean, float *rstd, const float *in,
                     const float *w, const float *b, int R, int C) {
    if (m->cfg.norm == LOCO_NORM_RMSNORM)
        loco_rmsnorm_fwd(out, rstd, in, w, R, C, loco_gpt_norm_eps(&m->cfg));
    else
        loco_layernorm_fwd(out, mean, rstd, in, w, b, R, C);
}

static void norm_bwd(const loco_gpt *m, float *din, float *dw, float *db, const float *dout,
                     const float *in, const float *w, const float *mean, const float *rstd, int R,
                     int C) {
    if (m->cfg.norm == LOCO_NORM_RMSNORM)
        loco_rmsnorm_bwd(din, dw, dout, in, w, rstd, R, C);
    else
        loco_layernorm_bwd(din, dw, db, dout, in, w, mean, rstd, R, C);
}

/* RoPE on the query and key heads of c_attn's output (N, Wl), in place:
 * forward turns them by their positions, backward turns their gradients
 * back. */
static void rope(const loco_gpt *m, const loco__gpt_shape *d, float *qkv, int B, int T,
                 bool backward) {
    if (m->cfg.pos != LOCO_POS_ROPE)
        return;
    void (*turn)(float *, int, int, int, int, int, const int *, const float *, const float *) =
        backward ? loco_rope_bwd : loco_rope_fwd;
    const int *pos = m->cp ? m->cp->pos : NULL; /* the rows' global positions */
    turn(qkv, d->Wl, B, T, d->NHl, d->hs, pos, m->rope_cos, m->rope_sin);
    turn(qkv + (size_t)d->NHl * d->hs, d->Wl, B, T, d->NKVl, d->hs, pos, m->rope_cos,
         m->rope_sin);
}

/* The MLP's activation: GELU of c_fc's output, or SwiGLU of its gate and
 * up halves; its backward accumulates into dfc. */
static void mlp_act_fwd(const loco_gpt *m, const loco__gpt_shape *d, float *out, const float *fc) {
    if (m->cfg.mlp == LOCO_MLP_SWIGLU)
        loco_swiglu_fwd(out, fc, (int)d->N, d->Hl);
    else
        loco_gelu_fwd(out, fc, d->N * (size_t)d->Fl);
}

static void mlp_act_bwd(const loco_gpt *m, const loco__gpt_shape *d, float *dfc, const float *fc,
                        const float *dout) {
    if (m->cfg.mlp == LOCO_MLP_SWIGLU)
        loco_swiglu_bwd(dfc, fc, dout, (int)d->N, d->Hl);
    else
        loco_gelu_bwd(dfc, fc, dout, d->N * (size_t)d->Fl);
}

/* The output head's weight: wte (tied) or lm_head. */
static float *head_weight(const loco_gpt_tensors *v, const loco_gpt *m) {
    return m->cfg.untied ? v->lm_head : v->wte;
}

/* A block's input: the previous block's output, or, for the first block
 * of the chunk a pass runs, a.encoded (the embeddings, or the activation a
 * pipeline stage received). */
static const float *block_input(const loco_gpt *m, int l) {
    return l == m->pass_first ? m->a.encoded : m->a.layer[l - 1].res3;
}

int loco__gpt_block_fwd(loco_gpt *m, const loco__gpt_shape *d, int l, const loco_gpt_layer_acts *la,
                        int B, int T) {
    const loco_gpt_block *w = &m->p.h[l];
    const int N = (int)d->N, R = (int)d->R, C = d->C;
    const float *res = block_input(m, l), *x;
    norm_fwd(m, la->ln1, la->ln1_mean, la->ln1_rstd, res, w->ln1w, w->ln1b, R, C);
    LOCO_CHECK(loco__gpt_column_input(m, d, la->ln1, &x));
    loco_matmul_fwd(la->qkv, x, w->qkvw, w->qkvb, N, C, d->Wl, false);
    rope(m, d, la->qkv, B, T, false);
    LOCO_CHECK(loco__gpt_attention_fwd(m, d, la->atty, la->att, la->qkv, B, T));
    LOCO_CHECK(
        loco__gpt_row_parallel_fwd(m, d, la->attproj, la->atty, w->attprojw, w->attprojb, d->Cl));
    loco_residual_fwd(la->res2, res, la->attproj, (size_t)R * C);
    norm_fwd(m, la->ln2, la->ln2_mean, la->ln2_rstd, la->res2, w->ln2w, w->ln2b, R, C);
    if (loco_gpt_is_moe(&m->cfg, l)) {
        LOCO_CHECK(loco__gpt_moe_fwd(m, d, l, la));
        loco_residual_fwd(la->res3, la->res2, la->fcproj, (size_t)R * C);
        return 0;
    }
    LOCO_CHECK(loco__gpt_column_input(m, d, la->ln2, &x));
    loco_matmul_fwd(la->fch, x, w->fcw, w->fcb, N, C, d->Fl, false);
    mlp_act_fwd(m, d, la->fch_gelu, la->fch);
    LOCO_CHECK(
        loco__gpt_row_parallel_fwd(m, d, la->fcproj, la->fch_gelu, w->fcprojw, w->fcprojb, d->Hl));
    loco_residual_fwd(la->res3, la->res2, la->fcproj, (size_t)R * C);
    return 0;
}

/* The input half of block l's backward (B): s.dres holds the gradient of
 * the block's output and leaves with its input's; LayerNorm and
 * row-parallel bias gradients are accumulated here (reduced over tp under
 * sp); what the weight half needs goes to k. */
int loco__gpt_block_bwd_input(loco_gpt *m, const loco__gpt_shape *d, int l,
                              const loco_gpt_layer_acts *la, int B, int T,
                              const loco__gpt_block_keep *k) {
    const loco_gpt_block *w = &m->p.h[l];
    loco_gpt_block *g = &m->g.h[l];
    loco_gpt_scratch *s = &m->s;
    const int N = (int)d->N, R = (int)d->R, C = d->C;
    const float *res = block_input(m, l);
    /* Under sp the replicated gradients of this block collect in drep:
     * ln_1 w, b | attn.c_proj.bias | ln_2 w, b | mlp.c_proj.bias. */
    float *ln1w = g->ln1w, *ln1b = g->ln1b, *apb = g->attprojb;
    float *ln2w = g->ln2w, *ln2b = g->ln2b, *fpb = g->fcprojb;
    if (d->sp) {
        memset(s->drep, 0, 6 * (size_t)C * sizeof(float));
        ln1w = s->drep, ln1b = s->drep + C, apb = s->drep + 2 * C;
        ln2w = s->drep + 3 * C, ln2b = s->drep + 4 * C, fpb = s->drep + 5 * C;
    }
    /* res3 = res2 + fcproj: dres flows to both. */
    if (loco_gpt_is_moe(&m->cfg, l)) { /* the whole MoE backward, weights too */
        LOCO_CHECK(loco__gpt_moe_bwd(m, d, l, la));
    } else {
        memset(s->dfchg, 0, (size_t)N * d->Hl * sizeof(float));
        LOCO_CHECK(loco__gpt_row_parallel_bwd_input(m, d, s->dfchg, fpb, s->dres, k->d_out,
                                                    w->fcprojw, d->Hl));
        memset(k->d_fch, 0, (size_t)N * d->Fl * sizeof(float));
        mlp_act_bwd(m, d, k->d_fch, la->fch, s->dfchg);
        LOCO_CHECK(loco__gpt_column_parallel_bwd_input(m, d, s->dbtc, k->d_fch, w->fcw, d->Fl));
    }
    norm_bwd(m, s->dres, ln2w, ln2b, s->dbtc, la->res2, w->ln2w, la->ln2_mean, la->ln2_rstd, R, C);
    /* res2 = res + attproj: dres flows to both. */
    if (m->par.recompute == LOCO_RECOMPUTE_SELECTIVE && !loco__gpt_full_recompute(m, l)) {
        /* The attention core again: the probabilities were not kept. */
        LOCO_CHECK(loco__gpt_attention_rerun(m, d, s->atty, la->att, la->qkv, B, T));
    }
    float *datty = s->dfchg; /* (N, Cl) fits (model_acts.c) */
    memset(datty, 0, (size_t)N * d->Cl * sizeof(float));
    LOCO_CHECK(
        loco__gpt_row_parallel_bwd_input(m, d, datty, apb, s->dres, k->d_mid, w->attprojw, d->Cl));
    memset(k->d_qkv, 0, (size_t)N * d->Wl * sizeof(float));
    LOCO_CHECK(loco__gpt_attention_bwd(m, d, k->d_qkv, s->datt, datty, la->qkv, la->atty, la->att,
                                       B, T));
    rope(m, d, k->d_qkv, B, T, true);
    LOCO_CHECK(loco__gpt_column_parallel_bwd_input(m, d, s->dbtc, k->d_qkv, w->qkvw, d->Wl));
    norm_bwd(m, s->dres, ln1w, ln1b, s->dbtc, res, w->ln1w, la->ln1_mean, la->ln1_rstd, R, C);
    if (d->sp) {
        float *dst[6] = {g->ln1w, g->ln1b, g->attprojb, g->ln2w, g->ln2b, g->fcprojb};
        const size_t len[6] = {(size_t)C, (size_t)C, (size_t)C, (size_t)C, (size_t)C, (size_t)C};
        LOCO_CHECK(loco__gpt_sp_reduce_into(m, dst, len, 6));
    }
    return 0;
}

/* The weight half (W): the four matmuls' weight gradients (and the
 * column-parallel biases') from what the input half kept. */
int loco__gpt_block_bwd_weight(loco_gpt *m, const loco__gpt_shape *d, int l,
                               const loco_gpt_layer_acts *la, const loco__gpt_block_keep *k) {
    loco_gpt_block *g = &m->g.h[l];
    if (!loco_gpt_is_moe(&m->cfg, l)) { /* an MoE block's came with its input half */
        loco__gpt_row_parallel_bwd_weight(d, g->fcprojw, k->d_out, la->fch_gelu, d->Hl);
        LOCO_CHECK(
            loco__gpt_column_parallel_bwd_weight(m, d, g->fcw, g->fcb, k->d_fch, la->ln2, d->Fl));
    }
    loco__gpt_row_parallel_bwd_weight(d, g->attprojw, k->d_mid, la->atty, d->Cl);
    const bool kv_rep = d->t > 1 && loco__gpt_kv_rep(&m->cfg) > 1;
    if (kv_rep) /* this micro-batch's key|value columns apart, to sum over their holders */
        loco__gpt_kv_replicas_begin(m, d, g->qkvw, g->qkvb);
    LOCO_CHECK(
        loco__gpt_column_parallel_bwd_weight(m, d, g->qkvw, g->qkvb, k->d_qkv, la->ln1, d->Wl));
    return kv_rep ? loco__gpt_kv_replicas_end(m, d, g->qkvw, g->qkvb) : 0;
}

/* Block l's whole backward: both halves at once, keeping in scratch. */
int loco__gpt_block_bwd(loco_gpt *m, const loco__gpt_shape *d, int l, const loco_gpt_layer_acts *la,
                        int B, int T) {
    const loco__gpt_block_keep k = {m->s.dkeep3, m->s.dfch, m->s.dkeep2, m->s.dqkv};
    LOCO_CHECK(loco__gpt_block_bwd_input(m, d, l, la, B, T, &k));
    return loco__gpt_block_bwd_weight(m, d, l, la, &k);
}

/* ln_f over this rank's rows of the last block's output, gathered over tp
 * under sp, then the tied head: a.logits (N, Vl). */
int loco__gpt_head_fwd(loco_gpt *m, const loco__gpt_shape *d) {
    loco_gpt_acts *a = &m->a;
    const int L = m->cfg.n_layer, C = d->C;
    /* Under sp this rank's rows of ln_f land in place in the whole (N, C)
     * buffer, which the all-gather then completes. */
    float *lnf_rows = a->lnf + d->row0 * (size_t)C;
    norm_fwd(m, lnf_rows, a->lnf_mean, a->lnf_rstd, a->layer[L - 1].res3, m->p.lnfw, m->p.lnfb,
             (int)d->R, C);
    if (d->sp)
        LOCO_CHECK(loco__gpt_tp_allgather(m, lnf_rows, a->lnf, d->R * (size_t)C));
    loco_matmul_fwd(a->logits, a->lnf, head_weight(&m->p, m), NULL, (int)d->N, C, d->Vl, true);
    return 0;
}

/* The head's input half, from the logits' gradient in a.logits: the
 * gradient of ln_f's input into s.dres (this rank's rows), ln_f's own
 * gradients (summed over tp under sp). */
int loco__gpt_head_bwd_input(loco_gpt *m, const loco__gpt_shape *d) {
    loco_gpt_acts *a = &m->a;
    loco_gpt_scratch *s = &m->s;
    const int L = m->cfg.n_layer, C = d->C, N = (int)d->N;
    float *dlnf = d->t == 1 ? s->dbtc : s->full;
    memset(dlnf, 0, d->N * (size_t)C * sizeof(float));
    loco_matmul_bwd(dlnf, NULL, NULL, a->logits, NULL, head_weight(&m->p, m), N, C, d->Vl, true);
    if (d->t > 1) {
        if (d->sp)
            LOCO_CHECK(loco__gpt_tp_reduce_scatter(m, s->full, s->dbtc, d->R * (size_t)C));
        else
            LOCO_CHECK(loco__gpt_tp_allreduce(m, s->full, d->N * (size_t)C, LOCO_OP_SUM));
    }
    const float *dln = d->t > 1 && !d->sp ? s->full : s->dbtc;
    memset(s->dres, 0, d->R * (size_t)C * sizeof(float));
    float *lnfw = m->g.lnfw, *lnfb = m->g.lnfb;
    if (d->sp) {
        memset(s->drep, 0, 2 * (size_t)C * sizeof(float));
        lnfw = s->drep, lnfb = s->drep + C;
    }
    norm_bwd(m, s->dres, lnfw, lnfb, dln, a->layer[L - 1].res3, m->p.lnfw, a->lnf_mean,
             a->lnf_rstd, (int)d->R, C);
    if (d->sp) {
        float *dst[2] = {m->g.lnfw, m->g.lnfb};
        const size_t len[2] = {(size_t)C, (size_t)C};
        LOCO_CHECK(loco__gpt_sp_reduce_into(m, dst, len, 2));
    }
    return 0;
}

/* The head's weight half: the head weight's (tied wte or lm_head)
 * gradient from the logits'. */
void loco__gpt_head_bwd_weight(loco_gpt *m, const loco__gpt_shape *d) {
    loco_matmul_bwd(NULL, head_weight(&m->g, m), NULL, m->a.logits, m->a.lnf, NULL, (int)d->N,
                    d->C, d->Vl, true);
}

/* A whole-model pass: not on a pipeline stage, tokens in the vocabulary. */
static int check_batch(const loco_gpt *m, const int32_t *inputs, int B, int T) {
    if (m->staged)
        return LOCO_ERR(LOCO_EINVAL, "a pipeline stage runs its chunks one by one "
                                     "(loco_gpt_chunk_forward / _backward_input / _weight)");
    return loco__gpt_check_tokens(m, inputs, B, T);
}

/* Forward through the blocks and the final LayerNorm and head: a.logits. */
static int forward_body(loco_gpt *m, const int32_t *inputs, int B, int T) {
    const loco__gpt_shape d = loco__gpt_shape_of(m, B, T);
    loco_gpt_acts *a = &m->a;
    const int L = m->cfg.n_layer;
    LOCO_CHECK(acquire(m, 0, false));
    LOCO_CHECK(loco__gpt_embed_fwd(m, &d, inputs, B, T));
    for (int l = 0; l < L; l++) {
        LOCO_CHECK(acquire(m, l + 1, false));
        LOCO_CHECK(loco__gpt_block_fwd(m, &d, l, &a->layer[l], B, T));
        LOCO_CHECK(release(m, l + 1, false));
    }
    LOCO_CHECK(acquire(m, L + 1, false));
    LOCO_CHECK(loco__gpt_head_fwd(m, &d));
    LOCO_CHECK(release(m, L + 1, false));
    return release(m, 0, false);
}

float loco__gpt_mean_of(const float *x, int n) {
    double s = 0;
    for (int i = 0; i < n; i++)
        s += x[i];
    return (float)(s / n);
}

int loco_gpt_forward(loco_gpt *m, const int32_t *inputs, const int32_t *targets, int B, int T,
                     float *mean_loss) {
    if (m->cp) /* this rank's rows of the sequences */
        LOCO_CHECK(loco__gpt_cp_localize(m, &inputs, &targets, B, &T));
    LOCO_CHECK(check_batch(m, inputs, B, T));
    LOCO_CHECK(forward_body(m, inputs, B, T));
    if (targets) {
        LOCO_CHECK(loco__gpt_cross_entropy(m, targets, B * T, false, 0.f));
        float loss = loco__gpt_mean_of(m->a.losses, B * T);
        if (m->cp)
            LOCO_CHECK(loco__gpt_cp_mean_loss(m, &loss));
        if (mean_loss)
            *mean_loss = loss;
    }
    return 0;
}

int loco_gpt_forward_backward(loco_gpt *m, const int32_t *inputs, const int32_t *targets, int B,
                              int T, float loss_scale, float *mean_loss) {
    if (m->cp) /* this rank's rows; its loss is the mean over them */
        LOCO_CHECK(loco__gpt_cp_localize(m, &inputs, &targets, B, &T));
    LOCO_CHECK(check_batch(m, inputs, B, T));
    for (int i = 0; i < B * T; i++)
        if (targets[i] < 0 || targets[i] >= m->cfg.vocab_size)
            return LOCO_ERR(LOCO_EINVAL, "target %d at %d outside the vocabulary", targets[i], i);
    const loco__gpt_shape d = loco__gpt_shape_of(m, B, T);
    const int N = B * T, L = m->cfg.n_layer;
    loco_gpt_acts *a = &m->a;
    m->loss_scale = loss_scale; /* the MoE layers' own losses are scaled alike */
    LOCO_CHECK(forward_body(m, inputs, B, T));
    /* Fused softmax + cross-entropy turns logits into dlogits in place. */
    LOCO_CHECK(loco__gpt_cross_entropy(m, targets, N, true, loss_scale / (float)N));
    float loss = loco__gpt_mean_of(a->losses, N);
    if (m->cp)
        LOCO_CHECK(loco__gpt_cp_mean_loss(m, &loss));
    if (mean_loss)
        *mean_loss = loss;

    /* The tied head: d(ln_f output) over all rows, summed over tp. */
    LOCO_CHECK(acquire(m, 0, true));
    LOCO_CHECK(acquire(m, L + 1, true));
    LOCO_CHECK(loco__gpt_head_bwd_input(m, &d));
    loco__gpt_head_bwd_weight(m, &d);
    LOCO_CHECK(release(m, L + 1, true));
    LOCO_CHECK(grads_ready(m, L + 1));
    for (int l = L - 1; l >= 0; l--) {
        LOCO_CHECK(acquire(m, l + 1, true));
        if (loco__gpt_full_recompute(m, l)) { /* only the block's input was kept */
            m->rerun = true;
            int rc = loco__gpt_block_fwd(m, &d, l, &a->layer[l], B, T);
            m->rerun = false;
            LOCO_CHECK(rc);
        }
        LOCO_CHECK(loco__gpt_block_bwd(m, &d, l, &a->layer[l], B, T));
        LOCO_CHECK(release(m, l + 1, true));
        LOCO_CHECK(grads_ready(m, l + 1));
    }
    LOCO_CHECK(loco__gpt_embed_bwd(m, &d, inputs, B, T));
    LOCO_CHECK(release(m, 0, true));
    return grads_ready(m, 0);
}
