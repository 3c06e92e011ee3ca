/* Where an MoE block's tokens go on the device model (gpt_cuda_moe.c's
 * helpers): the capacity plan of the cp group's micro-batch (model_moe_cp.c's,
 * on host copies of the choices), the ep all-to-alls staged through pinned
 * host buffers and regrouped there by model_moe.c's regroup, and what the
 * forwards routed (statistics, DeepSeek-V3's routing biases). */
#include "inner/model/gpt_cuda_internal.h"

#if defined(LOCO_HAVE_CUDA)

#include <string.h>

#define S (g->stream)

/* ------------------------------------------------- expert parallelism */

/* Packed rows at src (device) -> their experts' ranks, expert-major at
 * dst (device); back: expert-major rows at src -> their sources' packed
 * rows at dst. Staged through the host. */
int loco__gpt_cuda_moe_travel(loco_gpt_cuda *g, const layer_acts *a, float *dst, const float *src,
                              bool back) {
    const int e = g->ep, El = g->El, C = g->cfg.n_embd;
    const int32_t *count = a->h_count, *recv = a->h_count + g->cfg.n_experts;
    size_t mine = 0, theirs = 0;
    for (int x = 0; x < e; x++) {
        size_t m = 0, t = 0;
        for (int j = 0; j < El; j++) {
            m += (size_t)count[x * El + j];
            t += (size_t)recv[x * El + j];
        }
        g->moe_sendc[x] = m * C;
        g->moe_recvc[x] = t * C;
        mine += m, theirs += t;
    }
    const size_t out = (back ? theirs : mine) * C, in = (back ? mine : theirs) * C;
    LOCO_CHECK(loco_cuda_copy(g->h_moe_recv, src, out * 4, S));
    LOCO_CHECK(loco_cuda_sync(S));
    if (!back) {
        LOCO_CHECK(loco_comm_alltoallv(g->epc, g->h_moe_recv, g->moe_sendc, g->h_moe_send,
                                       g->moe_recvc, LOCO_DT_F32));
        loco__moe_regroup(e, El, C, recv, g->moe_cursor, g->h_moe_recv, g->h_moe_send, true);
        LOCO_CHECK(loco_cuda_copy(dst, g->h_moe_recv, in * 4, S));
    } else {
        loco__moe_regroup(e, El, C, recv, g->moe_cursor, g->h_moe_send, g->h_moe_recv, false);
        LOCO_CHECK(loco_comm_alltoallv(g->epc, g->h_moe_send, g->moe_recvc, g->h_moe_recv,
                                       g->moe_sendc, LOCO_DT_F32));
        LOCO_CHECK(loco_cuda_copy(dst, g->h_moe_recv, in * 4, S));
    }
    return loco_cuda_sync(S); /* the host buffers are reused */
}

/* Under context parallelism the capacity plan is the cp group's
 * micro-batch's (model_moe_cp.c's, on host copies of the choices); the
 * plan goes back to the device, *n this rank's packed rows, *kept the
 * micro-batch's. */
int loco__gpt_cuda_moe_cp_plan(loco_gpt_cuda *g, layer_acts *a, int N, int *n, int64_t *kept) {
    const int E = g->cfg.n_experts, k = g->cfg.top_k;
    const size_t Nk = (size_t)N * k;
    int32_t *expert = g->h_cp_moe, *slot = expert + Nk, *rows = slot + Nk;
    float *probs = (float *)(rows + Nk);
    LOCO_CHECK(loco_cuda_copy(expert, a->moe_expert, Nk * 4, S));
    LOCO_CHECK(loco_cuda_copy(probs, a->moe_probs, (size_t)N * E * 4, S));
    LOCO_CHECK(loco_cuda_sync(S));
    const loco_moe_cp_args x = {.cfg = &g->cfg,
                                .comm = g->cpc,
                                .c = g->cp,
                                .T = g->Tw,
                                .Tc = g->Tc,
                                .Tl = g->T,
                                .pos = g->h_cp_pos,
                                .expert = expert,
                                .probs = probs,
                                .slot = slot,
                                .rows = rows,
                                .count = a->h_count,
                                .routed = g->h_routed,
                                .glob = &g->cp_glob,
                                .glob_n = &g->cp_glob_n};
    int ng_kept;
    LOCO_CHECK(loco__moe_cp_plan(&x, N, n, &ng_kept));
    *kept = ng_kept;
    LOCO_CHECK(loco_cuda_copy(a->moe_slot, slot, Nk * 4, S));
    LOCO_CHECK(loco_cuda_copy(a->moe_rows, rows, (size_t)*n * 4, S));
    LOCO_CHECK(loco_cuda_copy(a->moe_count, a->h_count, (size_t)E * 4, S));
    LOCO_CHECK(loco_cuda_copy(a->moe_routed, g->h_routed, (size_t)E * 4, S));
    return loco_cuda_sync(S); /* the host arrays are reused */
}

/* ------------------------------------------------------------ statistics */

int loco_gpt_cuda_moe_stats(const loco_gpt_cuda *g, int block, int *micro, const int64_t **routed,
                            int64_t *assignments, int64_t *dropped, double *aux_sum,
                            double *z_sum) {
    if (block < 0 || block >= g->cfg.n_layer || !loco__gpt_cuda_is_moe(g, block) || !g->st_micro)
        return LOCO_ERR(LOCO_EINVAL, "device model: block %d is not a mixture of experts", block);
    *micro = g->st_micro[block];
    *routed = g->st_routed + (size_t)block * g->cfg.n_experts;
    *assignments = g->st_assign[block];
    *dropped = g->st_dropped[block];
    *aux_sum = g->st_aux[block];
    *z_sum = g->st_z[block];
    return 0;
}

void loco_gpt_cuda_moe_reset(loco_gpt_cuda *g) {
    if (!g->st_micro)
        return;
    const size_t L = (size_t)g->cfg.n_layer, E = (size_t)g->cfg.n_experts;
    memset(g->st_micro, 0, L * sizeof(int));
    memset(g->st_assign, 0, (3 + E) * L * sizeof(int64_t));
    memset(g->st_aux, 0, 2 * L * sizeof(double));
}

int loco_gpt_cuda_set_router_bias(loco_gpt_cuda *g, const float *bias, size_t n) {
    const size_t want = g->moe_bias ? (size_t)loco__gpt_cuda_moe_layers(g) * g->cfg.n_experts : 0;
    if (n != want)
        return LOCO_ERR(LOCO_EINVAL, "device model: %zu routing biases for %zu", n, want);
    if (!n)
        return 0;
    LOCO_CHECK(loco_cuda_copy(g->moe_bias, bias, n * sizeof(float), S));
    return loco_cuda_sync(S);
}

#endif /* LOCO_HAVE_CUDA */
