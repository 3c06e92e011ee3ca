/* Tensor parallelism inside the model (Megatron 1-D, sequence parallelism):
 * the layout of a tp slice, the collectives over the tp group with their
 * byte counters, the column- and row-parallel layers, the
 * vocabulary-parallel embedding and cross-entropy. */
#include "inner/comm/comm.h"
#include "inner/model/internal.h"
#include "kernels/kernels.h"

#include <string.h>

int loco_gpt_vocab_padded(const loco_gpt_config *cfg) {
    const int t = loco__gpt_tp_of(cfg);
    return (cfg->vocab_size + t - 1) / t * t;
}

/* Extent of gt's split dimension over all t ranks: rounded up to t parts
 * (only wte's vocabulary ever needs it; the rest divide exactly). */
static size_t tp_extent(const loco_tensor *gt, int t) {
    if (gt->part_len[0]) /* unequal parts: each divides by t (model_desc.c checks) */
        return (size_t)gt->shape[gt->split_dim];
    const size_t n = (size_t)gt->shape[gt->split_dim], q = (size_t)t * (size_t)gt->split_parts;
    return (n + q - 1) / q * q;
}

/* Elements after gt's split dimension (row-major): the stride of one step
 * along it. */
static void split_strides(const loco_tensor *gt, size_t *inner) {
    *inner = 1;
    for (int d = gt->split_dim + 1; d < gt->ndim; d++)
        *inner *= (size_t)gt->shape[d];
}

/* Length of part p along the split dimension (of ext, the padded extent). */
static size_t part_len(const loco_tensor *gt, size_t ext, int p) {
    return gt->part_len[0] ? (size_t)gt->part_len[p] : ext / (size_t)gt->split_parts;
}

/* Ranks sharing each chunk of part p over t ranks (1: the part is cut
 * into t chunks; more when it has fewer heads than ranks). */
static size_t part_rep(const loco_tensor *gt, int t, int p) {
    const int units = gt->part_len[0] ? gt->part_units[p] : 0;
    return units > 0 && units < t ? (size_t)(t / units) : 1;
}

/* The part holding x along the split dimension: its index, where it
 * starts, where its chunk starts in a slice, its length. */
static int find_part(const loco_tensor *gt, int t, size_t ext, size_t x, size_t *start,
                     size_t *lstart, size_t *len) {
    int p = 0;
    *start = 0, *lstart = 0, *len = part_len(gt, ext, 0);
    while (x >= *start + *len) {
        *start += *len;
        *lstart += *len / ((size_t)t / part_rep(gt, t, p));
        *len = part_len(gt, ext, ++p);
    }
    return p;
}

size_t loco_gpt_tp_replicas(const loco_tensor *gt, int t, size_t g) {
    if (gt->split_dim < 0 || t <= 1 || !gt->part_len[0])
        return 1;
    size_t inner;
    split_strides(gt, &inner);
    const size_t n = (size_t)gt->shape[gt->split_dim], x = g / inner % n;
    size_t start, lstart, len;
    return part_rep(gt, t, find_part(gt, t, n, x, &start, &lstart, &len));
}

void loco_gpt_tp_locate(const loco_tensor *gt, int t, size_t g, int *rank, size_t *j) {
    if (gt->split_dim < 0 || t <= 1) {
        *rank = t <= 1 ? 0 : -1;
        *j = g;
        return;
    }
    size_t inner;
    split_strides(gt, &inner);
    const size_t n = (size_t)gt->shape[gt->split_dim], ext = tp_extent(gt, t);
    const size_t outer = g / (inner * n), x = g / inner % n, in = g % inner;
    /* the part holding x; each part splits into t chunks (t / rep, each
     * held by rep ranks, the first named here), the slice holds every
     * part's chunk side by side */
    size_t start, lstart, len;
    const int p = find_part(gt, t, ext, x, &start, &lstart, &len);
    const size_t rep = part_rep(gt, t, p), chunk = len / ((size_t)t / rep);
    const size_t r = x - start, xl = lstart + r % chunk;
    size_t nl = 0;
    for (int q = 0; q < gt->split_parts; q++)
        nl += part_len(gt, ext, q) / ((size_t)t / part_rep(gt, t, q));
    *rank = (int)(r / chunk * rep);
    *j = (outer * nl + xl) * inner + in;
}

bool loco_gpt_tp_global(const loco_tensor *gt, int t, int k, size_t j, size_t *g) {
    if (gt->split_dim < 0 || t <= 1) {
        *g = j;
        return true;
    }
    size_t inner;
    split_strides(gt, &inner);
    const size_t n = (size_t)gt->shape[gt->split_dim], ext = tp_extent(gt, t);
    size_t nl = 0;
    for (int q = 0; q < gt->split_parts; q++)
        nl += part_len(gt, ext, q) / ((size_t)t / part_rep(gt, t, q));
    const size_t outer = j / (inner * nl), xl = j / inner % nl, in = j % inner;
    size_t start = 0, lstart = 0, len = part_len(gt, ext, 0), rep = part_rep(gt, t, 0);
    for (int p = 1; xl >= lstart + len / ((size_t)t / rep); p++) {
        lstart += len / ((size_t)t / rep);
        start += len, len = part_len(gt, ext, p), rep = part_rep(gt, t, p);
    }
    const size_t x = start + (size_t)k / rep * (len / ((size_t)t / rep)) + (xl - lstart);
    if (x >= n)
        return false;
    *g = (outer * n + x) * inner + in;
    return true;
}

/* ------------------------------------------------- tensor-parallel collectives */

static double ring_share(const loco_gpt *m) {
    return (double)(m->cfg.tp - 1) / (double)m->cfg.tp;
}

int loco__gpt_tp_allreduce(loco_gpt *m, float *buf, size_t n, loco_comm_op op) {
    m->comm.allreduce += 2.0 * ring_share(m) * (double)(n * sizeof(float));
    m->comm.calls++;
    return loco_comm_allreduce(m->par.tp, buf, n, LOCO_DT_F32, op);
}

/* full (t * part floats, rank blocks in order) summed over tp; this rank's
 * block lands in part. */
int loco__gpt_tp_reduce_scatter(loco_gpt *m, const float *full, float *part, size_t n_part) {
    for (int r = 0; r < m->cfg.tp; r++)
        m->tp_counts[r] = n_part;
    m->comm.reduce_scatter += ring_share(m) * (double)(n_part * (size_t)m->cfg.tp * sizeof(float));
    m->comm.calls++;
    return loco_comm_reduce_scatter(m->par.tp, full, part, m->tp_counts, LOCO_DT_F32, LOCO_OP_SUM);
}

/* Every rank's part (n_part floats) into full, in rank order. */
int loco__gpt_tp_allgather(loco_gpt *m, const float *part, float *full, size_t n_part) {
    for (int r = 0; r < m->cfg.tp; r++)
        m->tp_counts[r] = n_part;
    m->comm.allgather += ring_share(m) * (double)(n_part * (size_t)m->cfg.tp * sizeof(float));
    m->comm.calls++;
    return loco_comm_allgather(m->par.tp, part, full, m->tp_counts, LOCO_DT_F32);
}

/* The input of a column-parallel layer: the LayerNorm output x (R, C),
 * gathered over the sequence under sp (Megatron's g in the forward; the
 * backward gathers it again rather than keeping N rows). */
int loco__gpt_column_input(loco_gpt *m, const loco__gpt_shape *d, const float *x,
                           const float **full) {
    if (!d->sp) {
        *full = x;
        return 0;
    }
    LOCO_CHECK(loco__gpt_tp_allgather(m, x, m->s.gather, d->R * (size_t)d->C));
    *full = m->s.gather;
    return 0;
}

/* Row-parallel layer: out (R, C) = sum over tp of in (N, K) @ w (K, C),
 * then + bias once. tp: all-reduce; sp: reduce-scatter into this rank's
 * rows. */
int loco__gpt_row_parallel_fwd(loco_gpt *m, const loco__gpt_shape *d, float *out, const float *in,
                               const float *w, const float *bias, int K) {
    const int N = (int)d->N, C = d->C;
    if (d->t == 1) {
        loco_matmul_fwd(out, in, w, bias, N, K, C, false);
        return 0;
    }
    if (!d->sp) {
        loco_matmul_fwd(out, in, w, NULL, N, K, C, false);
        LOCO_CHECK(loco__gpt_tp_allreduce(m, out, d->N * (size_t)C, LOCO_OP_SUM));
    } else {
        loco_matmul_fwd(m->s.full, in, w, NULL, N, K, C, false);
        LOCO_CHECK(loco__gpt_tp_reduce_scatter(m, m->s.full, out, d->R * (size_t)C));
    }
    if (bias) /* NULL: the description has none */
        loco_bias_fwd(out, bias, (int)d->R, C);
    return 0;
}

/* Its backward, the input half: dbias += the column sums of dout (R, C)
 * (this rank's rows: under sp a partial sum, which the caller reduces with
 * the other replicated gradients); dkeep (N, C) = dout over all rows
 * (gathered under sp), kept for the weight half; dinp (N, K) += dkeep @
 * w^T. */
int loco__gpt_row_parallel_bwd_input(loco_gpt *m, const loco__gpt_shape *d, float *dinp,
                                     float *dbias, const float *dout, float *dkeep, const float *w,
                                     int K) {
    const int N = (int)d->N, C = d->C;
    loco_matmul_bwd(NULL, NULL, dbias, dout, NULL, NULL, (int)d->R, K, C, false);
    if (d->sp)
        LOCO_CHECK(loco__gpt_tp_allgather(m, dout, dkeep, d->R * (size_t)C));
    else
        memcpy(dkeep, dout, d->N * (size_t)C * sizeof(float));
    loco_matmul_bwd(dinp, NULL, NULL, dkeep, NULL, w, N, K, C, false);
    return 0;
}

/* The weight half: dw (K, C) += in (N, K)^T @ dkeep. */
void loco__gpt_row_parallel_bwd_weight(const loco__gpt_shape *d, float *dw, const float *dkeep,
                                       const float *in, int K) {
    loco_matmul_bwd(NULL, dw, NULL, dkeep, in, NULL, (int)d->N, K, d->C, false);
}

/* Column-parallel layer's backward, the input half: dx (R, C)
 * (overwritten) = the sum over tp of dout (N, OC) @ w^T, reduced by
 * all-reduce or, under sp, reduce-scatter into this rank's rows. */
int loco__gpt_column_parallel_bwd_input(loco_gpt *m, const loco__gpt_shape *d, float *dx,
                                        const float *dout, const float *w, int OC) {
    const int N = (int)d->N, C = d->C;
    float *dst = d->sp ? m->s.full : dx;
    memset(dst, 0, d->N * (size_t)C * sizeof(float));
    loco_matmul_bwd(dst, NULL, NULL, dout, NULL, w, N, C, OC, false);
    if (d->t == 1)
        return 0;
    if (!d->sp)
        return loco__gpt_tp_allreduce(m, dx, d->N * (size_t)C, LOCO_OP_SUM);
    return loco__gpt_tp_reduce_scatter(m, m->s.full, dx, d->R * (size_t)C);
}

/* The weight half: dw, db from the LayerNorm output x (R rows, gathered
 * again under sp) and dout (N, OC). */
int loco__gpt_column_parallel_bwd_weight(loco_gpt *m, const loco__gpt_shape *d, float *dw,
                                         float *db, const float *dout, const float *x, int OC) {
    const float *xin;
    LOCO_CHECK(loco__gpt_column_input(m, d, x, &xin));
    loco_matmul_bwd(NULL, dw, db, dout, xin, NULL, (int)d->N, d->C, OC, false);
    return 0;
}

/* Replicated gradients computed from this rank's rows under sp: their
 * sum over tp is added to the gradient buffers (only this micro-batch's
 * part is reduced; earlier micro-batches are already in `dst`). */
int loco__gpt_sp_reduce_into(loco_gpt *m, float *const *dst, const size_t *len, int n) {
    size_t total = 0;
    for (int i = 0; i < n; i++)
        total += len[i];
    LOCO_CHECK(loco__gpt_tp_allreduce(m, m->s.drep, total, LOCO_OP_SUM));
    const float *src = m->s.drep;
    for (int i = 0; i < n; i++) {
        for (size_t j = 0; dst[i] && j < len[i]; j++) /* NULL: a bias the description lacks */
            dst[i][j] += src[j];
        src += len[i];
    }
    return 0;
}

/* Embeddings: tp = 1 llm.c's encoder; else each rank looks up the tokens
 * of its vocabulary rows, the sum over tp (all-reduce, or reduce-scatter
 * into this rank's rows under sp) is the embedding, then + wpe. */
int loco__gpt_embed_fwd(loco_gpt *m, const loco__gpt_shape *d, const int32_t *inputs, int B,
                        int T) {
    const int C = d->C;
    const bool rope = m->cfg.pos == LOCO_POS_ROPE; /* positions turn q and k instead */
    if (rope && d->t == 1) {
        loco_embed_fwd(m->a.encoded, inputs, m->p.wte, 0, d->Vl, (int)d->N, C);
        return 0;
    }
    const float *wpe = rope ? NULL : loco__gpt_cp_wpe(m); /* the rows' positions */
    if (d->t == 1) {
        loco_encoder_fwd(m->a.encoded, inputs, m->p.wte, wpe, B, T, C);
        return 0;
    }
    float *dst = d->sp ? m->s.full : m->a.encoded;
    loco_embed_fwd(dst, inputs, m->p.wte, d->v_lo, d->Vl, (int)d->N, C);
    if (d->sp)
        LOCO_CHECK(loco__gpt_tp_reduce_scatter(m, m->s.full, m->a.encoded, d->R * (size_t)C));
    else
        LOCO_CHECK(loco__gpt_tp_allreduce(m, m->a.encoded, d->N * (size_t)C, LOCO_OP_SUM));
    if (wpe)
        loco_pos_fwd(m->a.encoded, wpe, (int)d->row0, (int)d->R, T, C);
    return 0;
}

int loco__gpt_embed_bwd(loco_gpt *m, const loco__gpt_shape *d, const int32_t *inputs, int B,
                        int T) {
    const int C = d->C;
    const bool rope = m->cfg.pos == LOCO_POS_ROPE;
    if (rope && d->t == 1) {
        loco_embed_bwd(m->g.wte, m->s.dres, inputs, 0, d->Vl, (int)d->N, C);
        return 0;
    }
    if (rope) { /* no position table: wte's rows alone, gathered under sp */
        const float *dfull = m->s.dres;
        if (d->sp) {
            LOCO_CHECK(loco__gpt_tp_allgather(m, m->s.dres, m->s.full, d->R * (size_t)C));
            dfull = m->s.full;
        }
        loco_embed_bwd(m->g.wte, dfull, inputs, d->v_lo, d->Vl, (int)d->N, C);
        return 0;
    }
    float *dwpe = loco__gpt_cp_dwpe(m);
    if (d->t == 1) {
        loco_encoder_bwd(m->g.wte, dwpe, m->s.dres, inputs, B, T, C);
        loco__gpt_cp_dwpe_done(m);
        return 0;
    }
    const float *dfull = m->s.dres;
    if (d->sp) {
        memset(m->s.drep, 0, (size_t)T * C * sizeof(float));
        loco_pos_bwd(m->s.drep, m->s.dres, (int)d->row0, (int)d->R, T, C);
        float *dst[1] = {dwpe};
        const size_t len[1] = {(size_t)T * C};
        LOCO_CHECK(loco__gpt_sp_reduce_into(m, dst, len, 1));
        LOCO_CHECK(loco__gpt_tp_allgather(m, m->s.dres, m->s.full, d->R * (size_t)C));
        dfull = m->s.full;
    } else {
        loco_pos_bwd(dwpe, m->s.dres, 0, (int)d->N, T, C);
    }
    loco__gpt_cp_dwpe_done(m);
    loco_embed_bwd(m->g.wte, dfull, inputs, d->v_lo, d->Vl, (int)d->N, C);
    return 0;
}

/* Losses (and, with dscale != 0 and dlogits, the logits' gradient in
 * place): the fused kernel, or vocabulary-parallel over tp (the softmax's
 * max and sum all-reduced; the whole logits never on one rank). */
int loco__gpt_cross_entropy(loco_gpt *m, const int32_t *targets, int N, bool backward,
                            float dscale) {
    loco_gpt_acts *a = &m->a;
    const loco__gpt_shape d = loco__gpt_shape_of(m, 1, N);
    float *dlogits = backward ? a->logits : NULL;
    if (d.t == 1) {
        loco_xent_fwd_bwd(a->losses, dlogits, a->logits, targets, N, m->cfg.vocab_size, dscale);
        return 0;
    }
    float *rowmax = a->xent, *sums = a->xent + N; /* sumexp (N) then tlogit (N) */
    loco_xent_vp_max(rowmax, a->logits, N, d.Vl, d.v_valid);
    LOCO_CHECK(loco__gpt_tp_allreduce(m, rowmax, (size_t)N, LOCO_OP_MAX));
    loco_xent_vp_sum(sums, sums + N, a->logits, rowmax, targets, d.v_lo, N, d.Vl, d.v_valid);
    LOCO_CHECK(loco__gpt_tp_allreduce(m, sums, 2 * (size_t)N, LOCO_OP_SUM));
    loco_xent_vp_finish(a->losses, dlogits, a->logits, rowmax, sums, sums + N, targets, d.v_lo, N,
                        d.Vl, d.v_valid, dscale);
    return 0;
}

/* ------------------------------------------- replicated key/value heads */

double loco_gpt_tp_sumsq(const loco_gpt *m, int i, const float *g, size_t a, size_t b) {
    const loco_tensor *t = &m->tt.t[i];
    const int rep = loco__gpt_kv_rep(&m->cfg);
    if (rep <= 1 || !t->part_len[0] || m->tp_rank % rep == 0)
        return loco_sumsq(g, b - a);
    /* a replica: only the query columns count (c_attn's rows of Wl, or its bias) */
    const size_t W = (size_t)loco__gpt_qkv_local(&m->cfg);
    const size_t Q = (size_t)(m->cfg.n_head / m->cfg.tp) * (size_t)loco_gpt_head_size(&m->cfg);
    double s = 0;
    for (size_t x = a; x < b; x++) {
        const size_t col = (x - t->offset) % W;
        if (col < Q)
            s += (double)g[x - a] * g[x - a];
    }
    return s;
}

void loco__gpt_kv_replicas_begin(loco_gpt *m, const loco__gpt_shape *d, float *dw, float *db) {
    const int C = d->C, W = d->Wl, Q = d->NHl * d->hs, K = 2 * d->hs;
    for (int c = 0; c < C; c++) {
        memcpy(m->kv_keep + (size_t)c * K, dw + (size_t)c * W + Q, (size_t)K * sizeof(float));
        memset(dw + (size_t)c * W + Q, 0, (size_t)K * sizeof(float));
    }
    if (db) {
        memcpy(m->kv_keep + (size_t)C * K, db + Q, (size_t)K * sizeof(float));
        memset(db + Q, 0, (size_t)K * sizeof(float));
    }
}

int loco__gpt_kv_replicas_end(loco_gpt *m, const loco__gpt_shape *d, float *dw, float *db) {
    const int C = d->C, W = d->Wl, Q = d->NHl * d->hs, hs = d->hs;
    const int NKV = loco_gpt_kv_heads(&m->cfg), head = m->tp_rank / loco__gpt_kv_rep(&m->cfg);
    const size_t KA = 2 * (size_t)NKV * hs, rows = (size_t)C + (db ? 1 : 0);
    memset(m->kv_all, 0, rows * KA * sizeof(float));
    /* row c: every key head, then every value head; this rank's head's */
    for (size_t c = 0; c < rows; c++) {
        const float *src = c < (size_t)C ? dw + c * W + Q : db + Q;
        memcpy(m->kv_all + c * KA + (size_t)head * hs, src, (size_t)hs * sizeof(float));
        memcpy(m->kv_all + c * KA + (size_t)(NKV + head) * hs, src + hs,
               (size_t)hs * sizeof(float));
    }
    LOCO_CHECK(loco__gpt_tp_allreduce(m, m->kv_all, rows * KA, LOCO_OP_SUM));
    for (size_t c = 0; c < rows; c++) {
        float *dst = c < (size_t)C ? dw + c * W + Q : db + Q;
        const float *keep = m->kv_keep + c * 2 * hs;
        const float *k = m->kv_all + c * KA + (size_t)head * hs;
        const float *v = m->kv_all + c * KA + (size_t)(NKV + head) * hs;
        for (int i = 0; i < hs; i++) {
            dst[i] = keep[i] + k[i];
            dst[hs + i] = keep[hs + i] + v[i];
        }
    }
    return 0;
}
