/* The activation slab of the model: per block (and per pipeline slot),
 * shared recompute buffers and backward scratch, and the formula of what a
 * block keeps (docs/PERFORMANCE.md). */
#include "inner/model/internal.h"

/* Whether the model holds block l (0-based). */
static bool holds_block(const loco_gpt *m, int l) {
    return m->unit_t1[l + 1] > m->unit_t0[l + 1];
}

/* Carves one block's forward activations (res3 apart; att floats of
 * attention state, none when 0) from base + off; returns the new offset.
 * base NULL: counts. */
static size_t carve_block(loco_gpt_layer_acts *la, float *base, size_t off,
                          const loco__gpt_shape *d, size_t att, const loco_gpt_config *moe) {
    const size_t C = (size_t)d->C, N = d->N, R = d->R, Cl = (size_t)d->Cl, Fl = (size_t)d->Fl;
    const size_t Hl = (size_t)d->Hl;
#define CARVE(field, count)                                                                        \
    do {                                                                                           \
        if (base)                                                                                  \
            field = base + off;                                                                    \
        off += ((size_t)(count) + 15) & ~(size_t)15; /* keep 64-byte alignment */                  \
    } while (0)
    CARVE(la->ln1, R * C);
    CARVE(la->ln1_mean, R);
    CARVE(la->ln1_rstd, R);
    CARVE(la->qkv, N * (size_t)d->Wa);
    CARVE(la->atty, N * Cl);
    if (att)
        CARVE(la->att, att);
    CARVE(la->attproj, R * C);
    CARVE(la->res2, R * C);
    CARVE(la->ln2, R * C);
    CARVE(la->ln2_mean, R);
    CARVE(la->ln2_rstd, R);
    if (moe) { /* an MoE block's MLP */
        const size_t E = (size_t)moe->n_experts, Nk = N * (size_t)moe->top_k;
        const size_t ep = moe->ep > 1 ? (size_t)moe->ep : 1, M = ep * Nk;
#define CARVEI(field, count)                                                                       \
    do {                                                                                           \
        if (base)                                                                                  \
            field = (int32_t *)(base + off);                                                       \
        off += ((size_t)(count) + 15) & ~(size_t)15;                                               \
    } while (0)
        CARVE(la->moe_probs, N * E);
        CARVE(la->moe_lse, N);
        CARVEI(la->moe_expert, Nk);
        CARVEI(la->moe_slot, Nk);
        CARVE(la->moe_weight, Nk);
        CARVEI(la->moe_rows, Nk);
        CARVEI(la->moe_count, E);
        CARVEI(la->moe_routed, E);
        CARVE(la->moe_x, Nk * C);
        CARVE(la->moe_y, Nk * C);
        const size_t Fc = Fl, F = Hl; /* each expert's tp slice */
        const size_t S = (size_t)moe->n_shared_experts;
        CARVE(la->moe_h, M * Fc);
        CARVE(la->moe_hg, M * F);
        if (S) {
            CARVE(la->moe_sh, S * N * Fc);
            CARVE(la->moe_shg, S * N * F);
        }
        if (ep > 1) {
            CARVE(la->moe_xo, M * C);
            CARVEI(la->moe_recv, E);
        } else if (base) {
            la->moe_xo = la->moe_x;
        }
#undef CARVEI
    } else {
        CARVE(la->fch, N * Fl);
        CARVE(la->fch_gelu, N * Hl);
    }
    CARVE(la->fcproj, R * C);
#undef CARVE
    return off;
}

/* Carves the activation slab; with base NULL only counts. Returns floats.
 * Per-block buffers are sized by the capacity B x T, so a smaller batch
 * (eval, sampling) uses the same slab. A pipeline stage has one set of
 * its blocks' activations (and the head's) per slot, with what the weight
 * half of a split backward keeps; the recompute and scratch buffers are
 * shared by all slots. */
size_t loco__gpt_carve_acts(loco_gpt *m, float *base) {
    const size_t L = (size_t)m->cfg.n_layer;
    const loco__gpt_shape d = loco__gpt_shape_of(m, m->B, m->T);
    const size_t T = (size_t)m->T, C = (size_t)d.C, N = d.N, R = d.R;
    const size_t Cl = (size_t)d.Cl, Fl = (size_t)d.Fl, att = loco__gpt_att_floats(m, &d);
    const size_t Wl = (size_t)d.Wl, Hl = (size_t)d.Hl;
    /* Ring attention keeps only each row's log-sum-exp: per block, even
     * under selective recompute (nothing to rerun). */
    const bool ring = m->cp && m->cp->algo == LOCO_CP_RING;
    const bool selective = m->par.recompute == LOCO_RECOMPUTE_SELECTIVE && !ring;
    const int slots = m->staged ? m->stage.slots : 1;
    size_t off = 0;
#define CARVE(field, count)                                                                        \
    do {                                                                                           \
        if (base)                                                                                  \
            field = base + off;                                                                    \
        off += ((size_t)(count) + 15) & ~(size_t)15; /* keep 64-byte alignment */                  \
    } while (0)
    /* One block's worth of every activation: the shared block that full
     * recompute reruns into, or the shared attention probabilities. */
    loco_gpt_layer_acts shared = {0};
    bool any_full = false, any_moe = false;
    for (size_t l = 0; l < L; l++) {
        any_full |= holds_block(m, (int)l) && loco__gpt_full_recompute(m, (int)l);
        any_moe |= holds_block(m, (int)l) && loco_gpt_is_moe(&m->cfg, (int)l);
    }
    if (any_full || selective)
        off = carve_block(&shared, base, off, &d, att, any_moe ? &m->cfg : NULL);
    size_t kept = 0; /* what the first block held keeps for its backward */
    bool counted = false;
    for (int k = 0; k < slots; k++) {
        loco_gpt_acts scratch_acts = {0};
        loco_gpt_acts *a = base ? &m->slot_acts[k] : &scratch_acts;
        CARVE(a->encoded, R * C);
        for (size_t l = 0; l < L; l++) {
            if (!holds_block(m, (int)l))
                continue;
            loco_gpt_layer_acts *la = base ? &a->layer[l] : &(loco_gpt_layer_acts){0};
            const bool full = loco__gpt_full_recompute(m, (int)l);
            const size_t before = off;
            if (!full)
                off = carve_block(la, base, off, &d, selective ? 0 : att,
                                  loco_gpt_is_moe(&m->cfg, (int)l) ? &m->cfg : NULL);
            CARVE(la->res3, R * C);
            if (!counted) {
                kept = (off - before) * sizeof(float);
                counted = true;
            }
            if (m->staged && !full) { /* a recomputed block runs W at once */
                CARVE(la->keep_out, N * C);
                CARVE(la->keep_mid, N * C);
                CARVE(la->keep_fch, N * Fl);
                CARVE(la->keep_qkv, N * Wl);
            }
            if (base && full) {
                float *res3 = la->res3;
                *la = shared;
                la->res3 = res3;
            } else if (base && selective) {
                la->att = shared.att;
            }
        }
        if (m->head) {
            CARVE(a->lnf, N * C);
            CARVE(a->lnf_mean, R);
            CARVE(a->lnf_rstd, R);
            CARVE(a->logits, N * (size_t)d.Vl);
            CARVE(a->losses, N);
            CARVE(a->xent, 3 * N);
        }
    }
    m->block_act_bytes = kept;
    loco_gpt_scratch *s = &m->s;
    CARVE(s->dres, R * C);
    CARVE(s->dbtc, R * C);
    if (d.t > 1)
        CARVE(s->full, N * C);
    if (d.sp) {
        CARVE(s->gather, N * C);
        CARVE(s->drep, (6 * C > T * C ? 6 * C : T * C));
    }
    CARVE(s->dkeep3, N * C);
    CARVE(s->dkeep2, N * C);
    CARVE(s->dqkv, N * Wl);
    CARVE(s->datt, ring ? 0 : att);
    CARVE(s->dfch, N * Fl);
    CARVE(s->dfchg, N * (Hl > Cl ? Hl : Cl)); /* also datty (N, Cl) */
    if (selective)
        CARVE(s->atty, N * Cl);
    if (any_moe) {
        const size_t Nk = N * (size_t)m->cfg.top_k;
        const size_t M = (m->cfg.ep > 1 ? (size_t)m->cfg.ep : 1) * Nk;
        CARVE(s->moe_dy, M * C);
        CARVE(s->moe_dx, M * C);
        CARVE(s->moe_dh, M * Fl);
        CARVE(s->moe_dhg, M * Hl);
        if (m->cfg.n_shared_experts > 0)
            CARVE(s->moe_shy, N * C);
        if (d.sp)
            CARVE(s->moe_dout, N * C);
        if (m->cfg.ep > 1) {
            CARVE(s->moe_yo, M * C);
            CARVE(s->moe_xfer, M * C);
        }
        CARVE(s->moe_dlogits, N * (size_t)m->cfg.n_experts);
        CARVE(s->moe_dweight, Nk);
        CARVE(s->moe_plan, 3 * Nk);
    }
#undef CARVE
    if (base)
        m->a = m->slot_acts[0];
    return off;
}

double loco_gpt_block_act_formula(const loco_gpt *m, loco_recompute mode) {
    return loco_gpt_block_act_formula_for(&m->cfg, m->B, m->T, m->par.sp, mode);
}

double loco_gpt_block_act_formula_for(const loco_gpt_config *mc, int B, int T, bool sp,
                                      loco_recompute mode) {
    /* Per token of the batch, in floats: the residual regions keep ln1, ln2
     * (C each), their mean and rstd (2 + 2), attproj, res2, fcproj and res3
     * (C each): 6C + 4, over t with sp. The tp slice keeps qkv (W/t: 3C/t
     * for GPT-2), atty (C/t), c_fc's output and its activation ((Fc + F)/t:
     * 8C/t for GPT-2), and the attention probabilities NH*T/t. Selective
     * drops the probabilities; full keeps only the block's output res3 (C,
     * over t with sp). */
    const double C = mc->n_embd, t = mc->tp > 1 ? mc->tp : 1, NH = mc->n_head;
    const double rows = sp ? 1.0 / t : 1.0, N = (double)B * T;
    /* An MoE block 0 keeps, instead of c_fc's output and its activation
     * (Fc + F, over t): router probabilities (E), lse (1), per choice
     * expert, slot, weight, token (4k), the packed rows' inputs and
     * outputs (2kC), on the experts' side (ep times the rows) c_fc's
     * output and activation ((Fc + F) k ep, over t: each expert's tp
     * slice), and the S shared experts' ((Fc + F) S, over t). */
    const double W = loco_gpt_qkv_width(mc), Fc = loco_gpt_fc_width(mc);
    const double H = loco_gpt_ffn(mc);
    double mlp = (Fc + H) / t;
    /* qkv and atty; with key/value heads replicated over tp, the rank's own */
    const double qkv = loco__gpt_kv_rep(mc) > 1 ? loco__gpt_qkv_local(mc) + C / t : (W + C) / t;
    if (loco_gpt_is_moe(mc, 0)) {
        const double E = mc->n_experts, k = mc->top_k, ep = mc->ep > 1 ? mc->ep : 1;
        const double S = mc->n_shared_experts;
        mlp = E + 1 + 4 * k + 2 * k * C + (Fc + H) / t * (k * ep + S);
    }
    const double per_token =
        mode == LOCO_RECOMPUTE_FULL
            ? C * rows
            : (6 * C + 4) * rows + qkv + mlp +
                  (mode == LOCO_RECOMPUTE_SELECTIVE ? 0 : NH * (double)T / t);
    return 4.0 * per_token * N;
}

double loco_gpt_device_block_act_formula(const loco_gpt_config *mc, int B, int T, bool sp,
                                         bool bf16, loco_recompute mode) {
    /* Per token, in elements of the passes' type (es bytes): ln1, res2,
     * ln2 and res3 (C each, over t with sp); qkv, atty, c_fc's output and
     * its activation (this tp slice's widths). In fp32: the norms' mean and
     * rstd (4, over t with sp) and the attention's log-sum-exp (NH/t): the
     * device's attention reruns its probabilities in the backward at every
     * mode, and the residual adds attproj and fcproj in place. Full: res3
     * only. */
    const double t = mc->tp > 1 ? mc->tp : 1, es = bf16 ? 2 : 4, N = (double)B * T;
    const double rows = sp && t > 1 ? 1.0 / t : 1.0, C = mc->n_embd;
    const double out = es * C * rows * N; /* what a recomputed block keeps */
    if (mode == LOCO_RECOMPUTE_FULL && mc->n_experts <= 0)
        return out;
    const double mlp = (double)(loco_gpt_fc_width(mc) + loco_gpt_ffn(mc)) / t;
    const double attn = loco__gpt_qkv_local(mc) + C / t;
    const double dense =
        N * (es * (4 * C * rows + attn + mlp) + 4 * (4 * rows + (double)mc->n_head / t));
    if (mc->n_experts <= 0)
        return dense;
    /* An MoE block keeps, in fp32 and in place of the dense MLP's two
     * buffers: the router's probabilities (E) and lse; four tables of k
     * (choices, weights, slots, packed rows); the packed rows and the
     * experts' outputs (k C); under ep the rows received (ep k C); the
     * experts' c_fc output and activation (ep k of this tp slice's MLP
     * widths: the rows an expert rank may receive); the shared experts'
     * (S of the widths); per micro-batch the plan's two counts (E each).
     * Averaged over the model's blocks (moe_every). */
    const double E = mc->n_experts, k = mc->top_k, ep = mc->ep > 1 ? mc->ep : 1;
    const double moe = N * 4 *
                           (E + 1 + 4 * k + 2 * k * C + (ep > 1 ? ep * k * C : 0) + ep * k * mlp +
                            mc->n_shared_experts * mlp) +
                       2 * E * 4;
    int n_moe = 0;
    for (int l = 0; l < mc->n_layer; l++)
        n_moe += loco_gpt_is_moe(mc, l);
    const double moe_block = dense - N * es * mlp + moe;
    const double L = mc->n_layer, avg = (n_moe * moe_block + (L - n_moe) * dense) / L;
    if (mode != LOCO_RECOMPUTE_FULL)
        return avg;
    /* full: the output, and the shared set the reruns use beyond one
     * average block, spread over the blocks (it carries both kinds' buffers
     * when the model mixes them) */
    const double shared = n_moe == 0 ? dense : n_moe == L ? moe_block : dense + moe;
    return out + (shared - avg) / L;
}
