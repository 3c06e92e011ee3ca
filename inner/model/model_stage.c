/* Pipeline stages of the model: their tables, and one (micro-batch, chunk)
 * pass at a time in its activation slot (model.h's loco_gpt_chunk_*),
 * over the passes of inner/model/model.c. */
#include "inner/model/internal.h"

#include <stdio.h>
#include <string.h>

/* The stage's chunks against the model: non-empty, in order, apart. */
static int check_stage(const loco_gpt_config *cfg, const loco_gpt_stage *st) {
    if (st->n < 1 || st->n > LOCO_GPT_MAX_CHUNKS || st->slots < 1)
        return LOCO_ERR(LOCO_EINVAL,
                        "a pipeline stage of %d chunks and %d activation slots "
                        "(1..%d chunks, at least one slot)",
                        st->n, st->slots, LOCO_GPT_MAX_CHUNKS);
    for (int i = 0; i < st->n; i++)
        if (st->first[i] < (i ? st->end[i - 1] : 0) || st->end[i] <= st->first[i] ||
            st->end[i] > cfg->n_layer)
            return LOCO_ERR(LOCO_EINVAL,
                            "pipeline chunk %d = blocks [%d, %d) of %d: chunks must be non-empty, "
                            "in order and apart",
                            i, st->first[i], st->end[i], cfg->n_layer);
    return 0;
}

int loco_gpt_build_stage_table(loco_ttable *tt, const loco_gpt_config *cfg,
                               const loco_gpt_stage *stage) {
    LOCO_CHECK(check_stage(cfg, stage));
    loco_ttable whole;
    LOCO_CHECK(loco_gpt_build_table(&whole, cfg));
    const int L = cfg->n_layer;
    const bool embed = stage->first[0] == 0, head = stage->end[stage->n - 1] == L;
    loco_ttable_init(tt);
    int rc = 0;
    for (int pass = 0; pass < 2 && rc == 0; pass++)
        for (int i = 0; i < whole.n && rc == 0; i++) {
            const loco_tensor *t = &whole.t[i];
            const int u = loco__gpt_unit_of(t, L, false);
            bool keep;
            if (pass == 1) /* the tied head's own wte, after ln_f */
                keep = head && !embed && !cfg->untied && u == 0 &&
                       !strcmp(t->name, "transformer.wte.weight");
            else if (u == 0)
                keep = embed;
            else if (u == L + 1)
                keep = head;
            else {
                keep = false;
                for (int c = 0; c < stage->n; c++)
                    keep |= u - 1 >= stage->first[c] && u - 1 < stage->end[c];
            }
            if (!keep)
                continue;
            rc = loco_ttable_add(tt, t->name, t->ndim, t->shape, t->split_dim, t->decay);
            if (rc == 0)
                tt->t[tt->n - 1].split_parts = t->split_parts;
        }
    loco_ttable_fini(&whole);
    if (rc < 0)
        loco_ttable_fini(tt);
    return rc;
}

/* Makes slot's activations current for a pass of chunk. */
static int use_slot(loco_gpt *m, int slot, int chunk, int B, int T) {
    if (!m->staged)
        return LOCO_ERR(LOCO_EINVAL,
                        "chunk passes need a pipeline stage (loco_gpt_parallel.stage)");
    if (slot < 0 || slot >= m->stage.slots || chunk < 0 || chunk >= m->stage.n)
        return LOCO_ERR(LOCO_EINVAL, "slot %d of %d, chunk %d of %d", slot, m->stage.slots, chunk,
                        m->stage.n);
    LOCO_CHECK(loco__gpt_check_capacity(m, B, T));
    m->a = m->slot_acts[slot];
    m->pass_first = m->stage.first[chunk];
    return 0;
}

/* The W buffers a stage keeps for block l in the current slot. */
static loco__gpt_block_keep slot_keep(const loco_gpt *m, int l) {
    const loco_gpt_layer_acts *la = &m->a.layer[l];
    return (loco__gpt_block_keep){la->keep_out, la->keep_fch, la->keep_mid, la->keep_qkv};
}

int loco_gpt_chunk_forward(loco_gpt *m, int slot, int chunk, const int32_t *inputs,
                           const int32_t *targets, int B, int T, const float *in, float *out,
                           float loss_scale, float *loss) {
    if (m->cp)
        LOCO_CHECK(loco__gpt_cp_localize(m, &inputs, &targets, B, &T));
    LOCO_CHECK(use_slot(m, slot, chunk, B, T));
    m->loss_scale = loss_scale; /* the MoE layers' losses are scaled alike */
    const loco__gpt_shape d = loco__gpt_shape_of(m, B, T);
    const int first = m->stage.first[chunk], end = m->stage.end[chunk], L = m->cfg.n_layer;
    const size_t rows = d.R * (size_t)d.C;
    if (first == 0) {
        LOCO_CHECK(loco__gpt_check_tokens(m, inputs, B, T));
        LOCO_CHECK(loco__gpt_embed_fwd(m, &d, inputs, B, T));
    } else {
        if (!in)
            return LOCO_ERR(LOCO_EINVAL, "chunk %d starts at block %d: it needs its input", chunk,
                            first);
        memcpy(m->a.encoded, in, rows * sizeof(float));
    }
    for (int l = first; l < end; l++)
        LOCO_CHECK(loco__gpt_block_fwd(m, &d, l, &m->a.layer[l], B, T));
    if (end < L) {
        memcpy(out, m->a.layer[end - 1].res3, rows * sizeof(float));
        return 0;
    }
    const int N = B * T;
    for (int i = 0; i < N; i++)
        if (targets[i] < 0 || targets[i] >= m->cfg.vocab_size)
            return LOCO_ERR(LOCO_EINVAL, "target %d at %d outside the vocabulary", targets[i], i);
    LOCO_CHECK(loco__gpt_head_fwd(m, &d));
    /* The loss and, in place, its gradient: the backward starts from it. */
    LOCO_CHECK(loco__gpt_cross_entropy(m, targets, N, true, loss_scale / (float)N));
    float mean = loco__gpt_mean_of(m->a.losses, N);
    if (m->cp)
        LOCO_CHECK(loco__gpt_cp_mean_loss(m, &mean));
    if (loss)
        *loss = mean;
    return 0;
}

int loco_gpt_chunk_backward_input(loco_gpt *m, int slot, int chunk, const int32_t *inputs, int B,
                                  int T, const float *dout, float *din) {
    if (m->cp)
        LOCO_CHECK(loco__gpt_cp_localize(m, &inputs, NULL, B, &T));
    LOCO_CHECK(use_slot(m, slot, chunk, B, T));
    const loco__gpt_shape d = loco__gpt_shape_of(m, B, T);
    const int first = m->stage.first[chunk], end = m->stage.end[chunk];
    const size_t rows = d.R * (size_t)d.C;
    if (end == m->cfg.n_layer) {
        LOCO_CHECK(loco__gpt_head_bwd_input(m, &d));
    } else {
        if (!dout)
            return LOCO_ERR(LOCO_EINVAL,
                            "chunk %d ends at block %d: it needs its output's "
                            "gradient",
                            chunk, end);
        memcpy(m->s.dres, dout, rows * sizeof(float));
    }
    for (int l = end - 1; l >= first; l--) {
        const loco_gpt_layer_acts *la = &m->a.layer[l];
        if (loco__gpt_full_recompute(m, l)) {
            /* The rerun block lives in the shared buffers, which the next
             * block's rerun overwrites: its weight half runs now. */
            m->rerun = true; /* an MoE block does not count its routing twice */
            const int rc = loco__gpt_block_fwd(m, &d, l, la, B, T);
            m->rerun = false;
            LOCO_CHECK(rc);
            LOCO_CHECK(loco__gpt_block_bwd(m, &d, l, la, B, T));
        } else {
            const loco__gpt_block_keep k = slot_keep(m, l);
            LOCO_CHECK(loco__gpt_block_bwd_input(m, &d, l, la, B, T, &k));
        }
    }
    if (first == 0)
        return loco__gpt_embed_bwd(m, &d, inputs, B, T);
    memcpy(din, m->s.dres, rows * sizeof(float));
    return 0;
}

int loco_gpt_chunk_backward_weight(loco_gpt *m, int slot, int chunk, int B, int T) {
    if (m->cp)
        LOCO_CHECK(loco__gpt_cp_localize(m, NULL, NULL, B, &T));
    LOCO_CHECK(use_slot(m, slot, chunk, B, T));
    const loco__gpt_shape d = loco__gpt_shape_of(m, B, T);
    const int first = m->stage.first[chunk], end = m->stage.end[chunk];
    if (end == m->cfg.n_layer)
        loco__gpt_head_bwd_weight(m, &d);
    for (int l = end - 1; l >= first; l--)
        if (!loco__gpt_full_recompute(m, l)) {
            const loco__gpt_block_keep k = slot_keep(m, l);
            LOCO_CHECK(loco__gpt_block_bwd_weight(m, &d, l, &m->a.layer[l], &k));
        }
    return 0;
}
