/* MoE under context parallelism: the capacity plan of the cp group's
 * micro-batch (docs/DECISIONS.md, "MoE under context parallelism"). */
#include "inner/model/internal.h"
#include "kernels/kernels.h"

#include <string.h>

/* Under cp the micro-batch is the cp group's: c ranks of N rows each, Ng
 * = c N tokens. The capacity decision is the one loco_moe_plan takes on
 * one rank over all Ng: every rank all-gathers the per-token choices
 * (expert ids and their probabilities, N k each; not the activations),
 * places them at their global positions (b T + pos), plans the whole
 * micro-batch, and keeps its own assignments that survive, packed as
 * loco_moe_plan packs (by expert, in token order). la->moe_routed becomes
 * the micro-batch's expert counts: the aux loss's f_e. n is this rank's
 * packed rows, *kept the micro-batch's. */
int loco__moe_cp_plan(const loco_moe_cp_args *x, int N, int *n, int *kept) {
    const loco_gpt_config *cfg = x->cfg;
    const int E = cfg->n_experts, k = cfg->top_k, c = x->c, B = N / x->Tl;
    const size_t Nk = (size_t)N * k, Ng = (size_t)N * c, Ngk = Ng * k;
    /* slab: mine (2 Nk), all (2 Ngk), gexp (Ngk), gprob (Ng E), slot,
     * rows (Ngk each), plan scratch (3 Ngk), count, routed (E each), counts (c) */
    const size_t need = 2 * Nk + 2 * Ngk + Ngk + Ng * E + 2 * Ngk + 3 * Ngk + 2 * (size_t)E +
                        (size_t)c * 2; /* counts: c size_t, first for alignment */
    if (*x->glob_n < need) {
        loco_free(*x->glob);
        *x->glob = loco_alloc(need * 4);
        *x->glob_n = *x->glob ? need : 0;
        if (!*x->glob)
            return LOCO_ERR(LOCO_ENOMEM, "MoE under cp: the micro-batch's plan (%zu words)", need);
    }
    size_t *counts = *x->glob;
    int32_t *mine = (int32_t *)(counts + c), *all = mine + 2 * Nk, *gexp = all + 2 * Ngk;
    float *gprob = (float *)(gexp + Ngk);
    int32_t *gslot = (int32_t *)(gprob + Ng * E), *grows = gslot + Ngk, *scratch = grows + Ngk;
    int32_t *gcount = scratch + 3 * Ngk, *groutes = gcount + E;
    /* mine: each assignment's expert id, then its probability's bits */
    for (size_t i = 0; i < Nk; i++) {
        const size_t t = i / (size_t)k;
        const int e = x->expert[i];
        mine[2 * i] = e;
        memcpy(&mine[2 * i + 1], &x->probs[t * E + e], 4);
    }
    for (int r = 0; r < c; r++)
        counts[r] = 2 * Nk;
    LOCO_CHECK(loco_comm_allgather(x->comm, mine, all, counts, LOCO_DT_I32));
    memset(gprob, 0, Ng * E * sizeof(float));
    for (int r = 0; r < c; r++)
        for (int b = 0; b < B; b++)
            for (int i = 0; i < x->Tl; i++) {
                const int p = (i / x->Tc == 0 ? r : 2 * c - 1 - r) * x->Tc + i % x->Tc;
                const size_t tg = (size_t)b * x->T + p, tl = (size_t)b * x->Tl + i;
                for (int j = 0; j < k; j++) {
                    const int32_t *a = all + (size_t)r * 2 * Nk + 2 * (tl * k + j);
                    gexp[tg * k + j] = a[0];
                    memcpy(&gprob[tg * E + a[0]], &a[1], 4);
                }
            }
    *kept = loco_moe_plan(gslot, grows, gcount, groutes, gexp, gprob, (int)Ng, E, k,
                          loco__gpt_moe_capacity(cfg, (int)Ng), scratch);
    /* this rank's survivors, packed by expert in local token order */
    int total = 0;
    for (int e = 0; e < E; e++) {
        int cnt = 0;
        for (int b = 0; b < B; b++)
            for (int i = 0; i < x->Tl; i++) {
                const size_t tl = (size_t)b * x->Tl + i, tg = (size_t)b * x->T + x->pos[i];
                for (int j = 0; j < k; j++) {
                    if (x->expert[tl * k + j] != e)
                        continue;
                    if (gslot[tg * k + j] < 0) {
                        x->slot[tl * k + j] = -1;
                        continue;
                    }
                    x->slot[tl * k + j] = total + cnt;
                    x->rows[total + cnt++] = (int32_t)tl;
                }
            }
        x->count[e] = cnt;
        x->routed[e] = groutes[e];
        total += cnt;
    }
    *n = total;
    return 0;
}

int loco__gpt_moe_cp_plan(loco_gpt *m, const loco_gpt_layer_acts *la, int N, int *n, int *kept) {
    loco_gpt_cp *cp = m->cp;
    const loco_moe_cp_args x = {
        .cfg = &m->cfg, .comm = cp->comm, .c = cp->c, .T = cp->T, .Tc = cp->Tc, .Tl = cp->Tl,
        .pos = cp->pos, .expert = la->moe_expert, .probs = la->moe_probs, .slot = la->moe_slot,
        .rows = la->moe_rows, .count = la->moe_count, .routed = la->moe_routed,
        .glob = &m->moe->glob, .glob_n = &m->moe->glob_n};
    return loco__moe_cp_plan(&x, N, n, kept);
}

/* --------------------------------------------------------------- passes */
