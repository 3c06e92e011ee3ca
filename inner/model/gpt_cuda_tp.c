/* Tensor parallelism on the device model (Megatron 1-D, as model_tp.c on
 * the CPU): the tp group's collectives on device buffers, the
 * vocabulary-parallel embedding and cross-entropy. gpt_cuda.c's passes
 * call these where the CPU passes call model_tp.c; the slice's widths
 * (Cl, NHl, Wl, Fl, Hl, Vl) are the CPU model's. With sequence
 * parallelism (sp) the norms and residuals hold this rank's rows only:
 * the column-parallel inputs and the row-parallel layers' output gradient
 * are all-gathered, the row-parallel outputs and the column-parallel
 * input gradients reduce-scattered, and the norms' weight gradients (and
 * wpe's) summed over tp (model_tp.c's order of collectives).
 *
 * bf16: a sum over tp is taken in fp32 (each rank's share as its GEMM
 * stored it, in bf16) and rounded once; gathers move the bf16 bits.
 *
 * Over mpi a collective is staged: the buffer to pinned host memory (the
 * host waits for the kernels before it), the collective, and back on the
 * compute stream. Over nccl it runs on the device buffer, ordered on the
 * compute stream. Compiled only in a CUDA build. */
#include "inner/model/gpt_cuda_internal.h"

#if defined(LOCO_HAVE_CUDA)

#include <string.h>

/* What the device model cannot yet do with tp (the CPU path does it). */
int loco__gpt_cuda_tp_check(const loco_gpt_config *cfg, const loco_gpt_cuda_opts *o) {
    if (cfg->tp <= 1)
        return 0;
    if (!o->tp || cfg->tp != loco_comm_size(o->tp))
        return LOCO_ERR(LOCO_EINVAL, "device model: tp = %d needs its tp group of %d ranks (%d)",
                        cfg->tp, cfg->tp, o->tp ? loco_comm_size(o->tp) : 0);
    if (loco__gpt_kv_rep(cfg) > 1 && !o->tp_staged)
        return LOCO_ERR(LOCO_ENOTSUP,
                        "parallel.tp = %d with model.n_kv_head = %d over nccl: key/value "
                        "heads replicated over tp ranks are summed on the host (staged, mpi) "
                        "only",
                        cfg->tp, loco_gpt_kv_heads(cfg));
    return 0;
}

int loco__gpt_cuda_tp_allreduce(loco_gpt_cuda *g, float *buf, size_t n, loco_comm_op op) {
    if (g->tp <= 1 || !n)
        return 0;
    if (!g->tp_staged)
        return loco_comm_allreduce(g->tpc, buf, n, LOCO_DT_F32, op);
    /* the previous staged copy back left h_stage before this one's copy
     * out (same stream), and the host waits for it here */
    LOCO_CHECK(loco_cuda_copy(g->h_stage, buf, n * sizeof(float), g->stream));
    LOCO_CHECK(loco_cuda_sync(g->stream));
    LOCO_CHECK(loco_comm_allreduce(g->tpc, g->h_stage, n, LOCO_DT_F32, op));
    return loco_cuda_copy(buf, g->h_stage, n * sizeof(float), g->stream);
}

/* The sum over tp of buf (n elements of the passes' type: an activation
 * or its gradient). bf16: summed in fp32 (tp_f32) and rounded once, so a
 * rank's share is rounded where its GEMM stored it and the sum where it
 * is stored. n_part < n: a reduce-scatter (sp), this rank's block of
 * n_part into buf's start.
 *
 * Staged, it can overlap: begin queues the copy out to the host and
 * returns; the caller queues kernels that do not read buf (the weight
 * half of a layer's backward); finish waits for the copy only, runs the
 * collective on the host while the device runs those kernels, and
 * queues the copy back. Over nccl begin sums at once. */
int loco__gpt_cuda_tp_sum_begin(loco_gpt_cuda *g, void *buf, size_t n, size_t n_part) {
    if (g->tp <= 1 || !n)
        return 0;
    float *src = g->bf16 ? g->tp_f32 : buf;
    if (g->bf16)
        RUN(LOCO_PROF_ELEM, loco_cuda_cast_f32(src, buf, n, g->stream));
    if (!g->tp_staged) {
        for (int r = 0; r < g->tp; r++)
            g->tp_counts[r] = n_part;
        LOCO_CHECK(n_part < n ? loco_comm_reduce_scatter(g->tpc, src, src, g->tp_counts,
                                                         LOCO_DT_F32, LOCO_OP_SUM)
                              : loco_comm_allreduce(g->tpc, src, n, LOCO_DT_F32, LOCO_OP_SUM));
        if (g->bf16)
            RUN(LOCO_PROF_ELEM, loco_cuda_cast_bf16(buf, src, n_part, g->stream));
        return 0;
    }
    LOCO_CHECK(loco_cuda_copy(g->h_pend, src, n * sizeof(float), g->stream));
    LOCO_CHECK(loco_cuda_event_record(g->pend_copied, g->stream));
    g->pend_buf = buf;
    g->pend_n = n;
    g->pend_part = n_part;
    return 0;
}

int loco__gpt_cuda_tp_sum_finish(loco_gpt_cuda *g) {
    void *buf = g->pend_buf;
    if (!buf)
        return 0;
    g->pend_buf = NULL;
    const size_t n = g->pend_n, part = g->pend_part;
    LOCO_CHECK(loco_cuda_event_sync(g->pend_copied));
    if (part < n) {
        for (int r = 0; r < g->tp; r++)
            g->tp_counts[r] = part;
        LOCO_CHECK(loco_comm_reduce_scatter(g->tpc, g->h_pend, g->h_pend, g->tp_counts,
                                            LOCO_DT_F32, LOCO_OP_SUM));
    } else {
        LOCO_CHECK(loco_comm_allreduce(g->tpc, g->h_pend, n, LOCO_DT_F32, LOCO_OP_SUM));
    }
    float *dst = g->bf16 ? g->tp_f32 : buf;
    LOCO_CHECK(loco_cuda_copy(dst, g->h_pend, part * sizeof(float), g->stream));
    if (g->bf16)
        RUN(LOCO_PROF_ELEM, loco_cuda_cast_bf16(buf, dst, part, g->stream));
    return 0;
}

/* The sum without overlap: all-reduced ... */
int loco__gpt_cuda_tp_sum_act(loco_gpt_cuda *g, void *buf, size_t n) {
    LOCO_CHECK(loco__gpt_cuda_tp_sum_begin(g, buf, n, n));
    return loco__gpt_cuda_tp_sum_finish(g);
}

/* ... or reduce-scattered (sp): buf holds tp blocks of n_part, the
 * ranks' rows in order. */
int loco__gpt_cuda_tp_scatter_act(loco_gpt_cuda *g, void *buf, size_t n_part) {
    LOCO_CHECK(loco__gpt_cuda_tp_sum_begin(g, buf, n_part * (size_t)g->tp, n_part));
    return loco__gpt_cuda_tp_sum_finish(g);
}

/* Every rank's part (n_part elements of the passes' type) into full, in
 * rank order; part may be full's block of this rank. The bits move as
 * they are (bytes). */
int loco__gpt_cuda_tp_gather_act(loco_gpt_cuda *g, const void *part, void *full, size_t n_part) {
    const size_t bytes = n_part * g->es;
    char *mine = (char *)full + (size_t)g->tp_rank * bytes;
    for (int r = 0; r < g->tp; r++)
        g->tp_counts[r] = bytes;
    if (g->tp_staged) {
        char *h = (char *)g->h_stage;
        LOCO_CHECK(loco_cuda_copy(h + (size_t)g->tp_rank * bytes, part, bytes, g->stream));
        LOCO_CHECK(loco_cuda_sync(g->stream));
        LOCO_CHECK(loco_comm_allgather(g->tpc, h + (size_t)g->tp_rank * bytes, h, g->tp_counts,
                                       LOCO_DT_U8));
        return loco_cuda_copy(full, h, bytes * (size_t)g->tp, g->stream);
    }
    if ((const char *)part != mine)
        LOCO_CHECK(loco_cuda_copy(mine, part, bytes, g->stream));
    return loco_comm_allgather(g->tpc, mine, full, g->tp_counts, LOCO_DT_U8);
}

/* Replicated gradients (norms' weights, wpe) computed from this rank's
 * rows into drep, len[i] floats each in order: their sum over tp is added
 * to dst[i] (NULL: a tensor the description lacks), and drep is cleared
 * for the next use. */
int loco__gpt_cuda_sp_reduce(loco_gpt_cuda *g, float *const *dst, const size_t *len, int n) {
    size_t total = 0;
    for (int i = 0; i < n; i++)
        total += len[i];
    LOCO_CHECK(loco__gpt_cuda_tp_allreduce(g, g->drep, total, LOCO_OP_SUM));
    float *src = g->drep;
    for (int i = 0; i < n; i++) {
        if (dst[i])
            RUN(LOCO_PROF_ELEM, loco_cuda_add_clear(dst[i], src, len[i], g->stream));
        else
            LOCO_CHECK(loco_cuda_zero(src, len[i] * sizeof(float), g->stream));
        src += len[i];
    }
    return 0;
}

/* Each rank looks up the tokens of its vocabulary rows (others' give 0);
 * the sum over tp is the embedding; then + wpe (learned positions). */
int loco__gpt_cuda_tp_embed_fwd(loco_gpt_cuda *g, const void *wte, const void *wpe, int B, int T) {
    const int C = g->cfg.n_embd, N = B * T;
    if (g->sp) { /* the sum reduce-scattered: this rank's rows, then their positions */
        const int R = N / g->tp;
        RUN(LOCO_PROF_ELEM,
            TWIN(embed_fwd, g->scratch, g->inputs, wte, g->v_lo, g->Vl, N, C, g->stream));
        LOCO_CHECK(loco__gpt_cuda_tp_scatter_act(g, g->scratch, (size_t)R * C));
        LOCO_CHECK(loco_cuda_copy(g->encoded, g->scratch, (size_t)R * C * g->es, g->stream));
        if (wpe)
            RUN(LOCO_PROF_ELEM,
                TWIN(pos_fwd, g->encoded, wpe, R * g->tp_rank, R, T, C, g->stream));
        return 0;
    }
    RUN(LOCO_PROF_ELEM,
        TWIN(embed_fwd, g->encoded, g->inputs, wte, g->v_lo, g->Vl, N, C, g->stream));
    LOCO_CHECK(loco__gpt_cuda_tp_sum_act(g, g->encoded, (size_t)N * C));
    if (wpe)
        RUN(LOCO_PROF_ELEM, TWIN(pos_fwd, g->encoded, wpe, 0, N, T, C, g->stream));
    return 0;
}

/* dres is the whole gradient on every tp rank (sp: this rank's rows of
 * it): this rank's wte rows, and wpe (replicated, the same on every
 * rank; sp: summed over the ranks' rows). */
int loco__gpt_cuda_tp_embed_bwd(loco_gpt_cuda *g, float *dwte, float *dwpe, int B, int T) {
    const int C = g->cfg.n_embd, N = B * T;
    const void *dout = g->dres;
    if (g->sp) {
        const int R = N / g->tp;
        if (dwpe) {
            RUN(LOCO_PROF_ELEM,
                TWIN(pos_bwd, g->drep, g->dres, R * g->tp_rank, R, T, C, g->stream));
            const size_t len = (size_t)T * C;
            LOCO_CHECK(loco__gpt_cuda_sp_reduce(g, &dwpe, &len, 1));
        }
        LOCO_CHECK(loco__gpt_cuda_tp_gather_act(g, g->dres, g->dgather, (size_t)R * C));
        dout = g->dgather;
    } else if (dwpe) {
        RUN(LOCO_PROF_ELEM, TWIN(pos_bwd, dwpe, g->dres, 0, N, T, C, g->stream));
    }
    RUN(LOCO_PROF_ELEM, TWIN(embed_bwd, dwte, dout, g->inputs, g->v_lo, g->Vl, N, C, g->stream));
    return 0;
}

/* The losses (and the logits' gradient in place, scaled by dscale) with
 * the softmax's row max and sum all-reduced over tp: the whole logits are
 * never on one rank. The logits are Vp wide, the slice's real columns
 * [0, v_valid). */
int loco__gpt_cuda_tp_xent(loco_gpt_cuda *g, int N, float dscale, bool backward) {
    float *rowmax = g->xent, *sumexp = g->xent + N, *tlogit = g->xent + 2 * (size_t)N;
    void *logits = g->logits;
    RUN(LOCO_PROF_XENT, TWIN(xent_vp_max, rowmax, logits, N, g->Vp, g->v_valid, g->stream));
    LOCO_CHECK(loco__gpt_cuda_tp_allreduce(g, rowmax, (size_t)N, LOCO_OP_MAX));
    RUN(LOCO_PROF_XENT, TWIN(xent_vp_sum, sumexp, tlogit, logits, rowmax, g->targets, g->v_lo,
                             N, g->Vp, g->v_valid, g->stream));
    LOCO_CHECK(loco__gpt_cuda_tp_allreduce(g, sumexp, 2 * (size_t)N, LOCO_OP_SUM));
    RUN(LOCO_PROF_XENT,
        TWIN(xent_vp_finish, g->losses, backward ? logits : NULL, logits, rowmax, sumexp, tlogit,
             g->targets, g->v_lo, N, g->Vp, g->v_valid, dscale, g->stream));
    return 0;
}

/* ---------------------------------------- replicated key/value heads */

/* With fewer key/value heads than tp ranks each head is held by
 * kv_rep = tp / n_kv_head ranks, each adding its own query heads' part of
 * the head's gradient. Around c_attn's weight half (model_tp.c's
 * kv_replicas_begin / _end): begin moves the gradient so far aside and
 * clears it; end sums this micro-batch's key and value columns over the
 * ranks (on the host, as every staged collective) and adds back what was
 * kept. The kept part of a replica's columns is the sum already. */
int loco__gpt_cuda_kv_begin(loco_gpt_cuda *g, float *dw, float *db) {
    const size_t CW = (size_t)g->cfg.n_embd * g->Wl;
    LOCO_CHECK(loco_cuda_copy(g->kv_keep, dw, CW * 4, g->stream));
    LOCO_CHECK(loco_cuda_zero(dw, CW * 4, g->stream));
    if (db) {
        LOCO_CHECK(loco_cuda_copy(g->kv_keep + CW, db, (size_t)g->Wl * 4, g->stream));
        LOCO_CHECK(loco_cuda_zero(db, (size_t)g->Wl * 4, g->stream));
    }
    return 0;
}

int loco__gpt_cuda_kv_end(loco_gpt_cuda *g, float *dw, float *db) {
    const int C = g->cfg.n_embd, W = g->Wl, hs = loco_gpt_head_size(&g->cfg);
    const int Q = g->NHl * hs, NKV = loco_gpt_kv_heads(&g->cfg);
    const int head = g->tp_rank / loco__gpt_kv_rep(&g->cfg);
    const size_t CW = (size_t)C * W, KA = 2 * (size_t)NKV * hs, rows = (size_t)C + (db ? 1 : 0);
    float *h = g->h_kv, *all = g->h_kv + CW + W;
    LOCO_CHECK(loco_cuda_copy(h, dw, CW * 4, g->stream));
    if (db)
        LOCO_CHECK(loco_cuda_copy(h + CW, db, (size_t)W * 4, g->stream));
    LOCO_CHECK(loco_cuda_sync(g->stream));
    /* row c of all: every key head, then every value head; this rank's
     * head's columns in place, zero elsewhere */
    memset(all, 0, rows * KA * sizeof(float));
    for (size_t c = 0; c < rows; c++) {
        const float *src = h + c * W + Q;
        memcpy(all + c * KA + (size_t)head * hs, src, (size_t)hs * sizeof(float));
        memcpy(all + c * KA + (size_t)(NKV + head) * hs, src + hs, (size_t)hs * sizeof(float));
    }
    LOCO_CHECK(loco_comm_allreduce(g->tpc, all, rows * KA, LOCO_DT_F32, LOCO_OP_SUM));
    for (size_t c = 0; c < rows; c++) {
        float *dst = h + c * W + Q;
        memcpy(dst, all + c * KA + (size_t)head * hs, (size_t)hs * sizeof(float));
        memcpy(dst + hs, all + c * KA + (size_t)(NKV + head) * hs, (size_t)hs * sizeof(float));
    }
    LOCO_CHECK(loco_cuda_copy(dw, h, CW * 4, g->stream));
    LOCO_CHECK(loco_cuda_add_clear(dw, g->kv_keep, CW, g->stream));
    if (db) {
        LOCO_CHECK(loco_cuda_copy(db, h + CW, (size_t)W * 4, g->stream));
        LOCO_CHECK(loco_cuda_add_clear(db, g->kv_keep + CW, (size_t)W, g->stream));
    }
    return loco_cuda_sync(g->stream); /* h_kv is read by the copies */
}

#endif /* LOCO_HAVE_CUDA */
