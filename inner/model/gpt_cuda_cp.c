/* Context parallelism on the device model (model_cp.c's layout and
 * order): every sequence of Tw tokens is cut into 2 cp chunks and this
 * rank holds chunks r and 2 cp - 1 - r (zig-zag: the same causal work on
 * every rank). Outside attention the passes run on those T = Tw / cp rows
 * as on any others, at their global positions (wpe's rows or RoPE's
 * angles). The loss is the mean over the whole sequences. Attention:
 * - Ulysses: an all-to-all turns this rank's rows of every head into
 *   every row of 1/cp of the heads, the device attention runs on those,
 *   and an all-to-all turns its output back (and the conjugates in the
 *   backward, key/value heads replicated over ranks summed). The
 *   all-to-alls are staged through pinned host buffers (the host waits
 *   for the kernels before each), where the heads are packed and the rows
 *   placed; the forward moves the passes' elements as they are, the
 *   backward's sums are fp32.
 * - ring (its block kernels are fp32: gpt_cuda.c casts bf16 operands
 *   around it): the ranks' K|V
 *   blocks travel around the ring through pinned host buffers, the next
 *   hop posted before this block's attention is queued, so the transfer
 *   runs while the device computes; the blocks' results merge by
 *   log-sum-exp on the device; the backward passes K|V the same way with
 *   the blocks' dK|dV accumulators following them home.
 * Compiled only in a CUDA build. */
#include "inner/model/gpt_cuda_internal.h"

#if defined(LOCO_HAVE_CUDA)

#include <string.h>

int loco__gpt_cuda_cp_check(const loco_gpt_config *cfg, int B, int T, const loco_gpt_cuda_opts *o) {
    const int c = o->cp ? loco_comm_size(o->cp) : 1;
    if (c < 2)
        return 0;
    const loco_gpt_parallel par = {.cp = o->cp, .cp_algo = o->cp_algo, .sp = o->sp};
    return loco__gpt_cp_check(cfg, B, T, &par);
}

int loco__gpt_cuda_cp_init(loco_gpt_cuda *g, const loco_gpt_cuda_opts *o, int T) {
    const int c = o->cp ? loco_comm_size(o->cp) : 1;
    g->cp = c;
    if (c < 2)
        return 0;
    const int hs = loco_gpt_head_size(&g->cfg);
    g->cpc = o->cp;
    g->cp_rank = loco_comm_rank(o->cp);
    g->Tw = T;
    g->Tc = T / (2 * c);
    g->ring = o->cp_algo == LOCO_CP_RING;
    g->Ckv = g->NKVl * hs;
    g->hq = g->NHl / c * hs;
    g->hk = (g->NKVl >= c ? g->NKVl / c : 1) * hs;
    g->wu = g->hq + 2 * g->hk;
    return 0;
}

/* Position of local row i of rank x. */
static int row_pos(const loco_gpt_cuda *g, int x, int i) {
    const int j = i / g->Tc;
    return (j == 0 ? x : 2 * g->cp - 1 - x) * g->Tc + i % g->Tc;
}

int loco__gpt_cuda_cp_host_init(loco_gpt_cuda *g) {
    if (!g->cpc)
        return 0;
    const size_t rows = (size_t)g->B * g->T, whole = (size_t)g->B * g->Tw * g->wu * 4;
    const size_t ld = (size_t)(g->Wl > g->Cl ? g->Wl : g->Cl);
    LOCO_CHECK(loco_cuda_host_alloc((void **)&g->h_cp_rows, rows * ld * 4));
    if (g->ring) {
        const size_t kv = rows * 2 * (size_t)g->Ckv * 4;
        for (int k = 0; k < 2; k++) {
            LOCO_CHECK(loco_cuda_host_alloc((void **)&g->h_kv_hop[k], kv));
            LOCO_CHECK(loco_cuda_host_alloc((void **)&g->h_acc_send[k], kv));
            LOCO_CHECK(loco_cuda_event_create(&g->kv_in[k]));
        }
        LOCO_CHECK(loco_cuda_host_alloc((void **)&g->h_acc_recv, kv));
        LOCO_CHECK(loco_cuda_event_create(&g->acc_in));
    } else {
        LOCO_CHECK(loco_cuda_host_alloc((void **)&g->h_cp_send, whole));
        LOCO_CHECK(loco_cuda_host_alloc((void **)&g->h_cp_recv, whole));
        LOCO_CHECK(loco_cuda_host_alloc((void **)&g->h_cp_whole, whole));
    }
    g->h_cp_tok = loco_alloc(2 * rows * sizeof(int32_t));
    int *pos = loco_alloc((size_t)g->T * sizeof(int));
    if (!g->h_cp_tok || !pos) {
        loco_free(pos);
        return LOCO_ERR(LOCO_ENOMEM, "context-parallel tables");
    }
    for (int i = 0; i < g->T; i++)
        pos[i] = row_pos(g, g->cp_rank, i);
    int rc = loco_cuda_copy(g->cp_pos, pos, (size_t)g->T * sizeof(int), g->stream);
    if (!rc)
        rc = loco_cuda_sync(g->stream);
    loco_free(pos);
    return rc;
}

void loco__gpt_cuda_cp_fini(loco_gpt_cuda *g) {
    loco_cuda_host_free(g->h_cp_send);
    loco_cuda_host_free(g->h_cp_recv);
    loco_cuda_host_free(g->h_cp_whole);
    loco_cuda_host_free(g->h_cp_rows);
    for (int k = 0; k < 2; k++) {
        loco_cuda_host_free(g->h_kv_hop[k]);
        loco_cuda_host_free(g->h_acc_send[k]);
        loco_cuda_event_destroy(g->kv_in[k]);
    }
    loco_cuda_host_free(g->h_acc_recv);
    loco_cuda_event_destroy(g->acc_in);
    loco_free(g->h_cp_tok);
}

int loco__gpt_cuda_cp_localize(loco_gpt_cuda *g, const int32_t **inputs, const int32_t **targets,
                               int B, int *T) {
    if (!g->cpc)
        return 0;
    if (*T != g->Tw)
        return LOCO_ERR(LOCO_EINVAL,
                        "context parallelism splits sequences of %d tokens; this pass has %d",
                        g->Tw, *T);
    if (B < 1 || B > g->B)
        return LOCO_ERR(LOCO_EINVAL,
                        "batch of %d sequences exceeds the device model's "
                        "capacity %d",
                        B, g->B);
    const size_t rows = (size_t)g->B * g->T;
    int32_t *dst[2] = {g->h_cp_tok, g->h_cp_tok + rows};
    const int32_t **src[2] = {inputs, targets};
    for (int k = 0; k < 2; k++) {
        if (!*src[k])
            continue;
        for (int b = 0; b < B; b++)
            for (int i = 0; i < g->T; i++)
                dst[k][(size_t)b * g->T + i] =
                    (*src[k])[(size_t)b * g->Tw + row_pos(g, g->cp_rank, i)];
        *src[k] = dst[k];
    }
    *T = g->T;
    return 0;
}

/* wpe's rows at this rank's positions: its two chunks, each Tc rows. */
int loco__gpt_cuda_cp_wpe(loco_gpt_cuda *g, const void *wpe, const void **local) {
    const size_t C = (size_t)g->cfg.n_embd, es = g->es, Tc = (size_t)g->Tc;
    for (int j = 0; j < 2; j++)
        LOCO_CHECK(
            loco_cuda_copy((char *)g->cp_wpe + j * Tc * C * es,
                           (const char *)wpe + (size_t)row_pos(g, g->cp_rank, j * g->Tc) * C * es,
                           Tc * C * es, g->stream));
    *local = g->cp_wpe;
    return 0;
}

/* The local rows' wpe gradient (cp_dwpe) added at their positions; it
 * leaves cleared for the next pass. */
int loco__gpt_cuda_cp_dwpe_done(loco_gpt_cuda *g, float *dwpe) {
    const size_t C = (size_t)g->cfg.n_embd, Tc = (size_t)g->Tc;
    for (int j = 0; j < 2; j++)
        LOCO_CHECK(loco_cuda_add_clear(dwpe + (size_t)row_pos(g, g->cp_rank, j * g->Tc) * C,
                                       g->cp_dwpe + j * Tc * C, Tc * C, g->stream));
    return 0;
}

/* ------------------------------------------------- the heads' all-to-alls */

/* Rank x's columns of a local row: its query heads' (parts 1: the
 * attention output's row of Cl), or those, then its key and value heads'
 * (parts 3: c_attn's row of Wl); model_cp.c's segments. */
static int segments(const loco_gpt_cuda *g, int x, int parts, int *col, int *w) {
    const int hs = loco_gpt_head_size(&g->cfg), Q = g->NHl * hs, Ckv = g->NKVl * hs;
    col[0] = x * g->hq, w[0] = g->hq;
    if (parts == 1)
        return 1;
    const int kv0 = x * g->NKVl / g->cp * hs; /* its queries' first key/value head */
    col[1] = Q + kv0, w[1] = g->hk;
    col[2] = Q + Ckv + kv0, w[2] = g->hk;
    return 3;
}

/* Local rows (B T, ld elements of es bytes) -> send: for each rank x its
 * columns of every row. */
static void pack_heads(const loco_gpt_cuda *g, char *send, const char *src, int B, int ld,
                       int parts, size_t es) {
    const size_t rows = (size_t)B * g->T, wx = parts == 1 ? (size_t)g->hq : (size_t)g->wu;
    for (int x = 0; x < g->cp; x++) {
        int col[3], w[3];
        const int n = segments(g, x, parts, col, w);
        for (size_t row = 0; row < rows; row++) {
            char *o = send + ((size_t)x * rows + row) * wx * es;
            for (int k = 0; k < n; o += (size_t)w[k] * es, k++)
                memcpy(o, src + (row * (size_t)ld + (size_t)col[k]) * es, (size_t)w[k] * es);
        }
    }
}

/* recv, from each rank x its rows of this rank's heads, <-> (B, Tw, w)
 * whole sequences (to_whole: placed there; else picked from there). */
static void move_rows(const loco_gpt_cuda *g, char *whole, char *ranks, int B, int w, size_t es,
                      bool to_whole) {
    const size_t n = (size_t)w * es;
    for (int x = 0; x < g->cp; x++)
        for (int b = 0; b < B; b++)
            for (int i = 0; i < g->T; i++) {
                char *a = whole + ((size_t)b * g->Tw + row_pos(g, x, i)) * n;
                char *r = ranks + (((size_t)x * B + b) * g->T + i) * n;
                memcpy(to_whole ? a : r, to_whole ? r : a, n);
            }
}

static int alltoall(loco_gpt_cuda *g, size_t bytes_per_rank) {
    return loco_comm_alltoall(g->cpc, g->h_cp_send, g->h_cp_recv, bytes_per_rank, LOCO_DT_U8);
}

/* Local rows (B T, ld elements) of src on the device -> every row of this
 * rank's heads, (B, Tw, w), into dst: parts 3, qkv's query, key and value
 * heads (w = wu), or parts 1, the attention output's query heads
 * (w = hq). */
static int to_heads(loco_gpt_cuda *g, const void *src, int ld, int parts, void *dst, int B) {
    const size_t rows = (size_t)B * g->T, es = g->es, w = parts == 1 ? g->hq : g->wu;
    char *h = (char *)g->h_cp_rows;
    LOCO_CHECK(loco_cuda_copy(h, src, rows * ld * es, g->stream));
    LOCO_CHECK(loco_cuda_sync(g->stream));
    pack_heads(g, g->h_cp_send, h, B, ld, parts, es);
    LOCO_CHECK(alltoall(g, rows * w * es));
    move_rows(g, g->h_cp_whole, g->h_cp_recv, B, (int)w, es, true);
    return loco_cuda_copy(dst, g->h_cp_whole, (size_t)B * g->Tw * w * es, g->stream);
}

static int from_heads(loco_gpt_cuda *g, const void *outh, void *out, int B) {
    const size_t rows = (size_t)B * g->T, es = g->es;
    LOCO_CHECK(loco_cuda_copy(g->h_cp_whole, outh, (size_t)B * g->Tw * g->hq * es, g->stream));
    LOCO_CHECK(loco_cuda_sync(g->stream));
    move_rows(g, g->h_cp_whole, g->h_cp_send, B, g->hq, es, false);
    LOCO_CHECK(alltoall(g, rows * g->hq * es));
    /* from rank x: this rank's rows of x's query heads, at x's columns */
    char *h = (char *)g->h_cp_rows;
    for (int x = 0; x < g->cp; x++)
        for (size_t row = 0; row < rows; row++)
            memcpy(h + (row * g->Cl + (size_t)x * g->hq) * es,
                   g->h_cp_recv + ((size_t)x * rows + row) * g->hq * es, (size_t)g->hq * es);
    return loco_cuda_copy(out, h, rows * g->Cl * es, g->stream);
}

/* cp_dqkv (B, Tw, wu) -> dqkv (B T, Wl) local rows (overwritten), in
 * fp32: a key/value head replicated to several ranks gets the sum of
 * their gradients, rounded once in bf16. */
static int dqkv_from_heads(loco_gpt_cuda *g, void *dqkv, int B) {
    const size_t rows = (size_t)B * g->T, whole = (size_t)B * g->Tw * g->wu;
    float *src = g->cp_dqkv;
    if (g->bf16) {
        RUN(LOCO_PROF_ELEM, loco_cuda_cast_f32(g->cp_f32, g->cp_dqkv, whole, g->stream));
        src = g->cp_f32;
    }
    LOCO_CHECK(loco_cuda_copy(g->h_cp_whole, src, whole * 4, g->stream));
    LOCO_CHECK(loco_cuda_sync(g->stream));
    move_rows(g, g->h_cp_whole, g->h_cp_send, B, g->wu, 4, false);
    LOCO_CHECK(alltoall(g, rows * g->wu * 4));
    float *h = g->h_cp_rows;
    memset(h, 0, rows * g->Wl * sizeof(float));
    for (int x = 0; x < g->cp; x++) {
        int col[3], w[3];
        const int n = segments(g, x, 3, col, w);
        for (size_t row = 0; row < rows; row++) {
            const float *in = (const float *)g->h_cp_recv + ((size_t)x * rows + row) * g->wu;
            for (int k = 0; k < n; in += w[k], k++) {
                float *o = h + row * g->Wl + col[k];
                for (int e = 0; e < w[k]; e++)
                    o[e] += in[e];
            }
        }
    }
    if (!g->bf16)
        return loco_cuda_copy(dqkv, h, rows * g->Wl * 4, g->stream);
    LOCO_CHECK(loco_cuda_copy(g->cp_f32, h, rows * g->Wl * 4, g->stream));
    RUN(LOCO_PROF_ELEM, loco_cuda_cast_bf16(dqkv, g->cp_f32, rows * g->Wl, g->stream));
    return 0;
}

int loco__gpt_cuda_cp_mean(loco_gpt_cuda *g, double *v) {
    if (!g->cpc)
        return 0;
    return loco_comm_allreduce(g->cpc, v, 1, LOCO_DT_F64, LOCO_OP_AVG);
}

/* ------------------------------------------------------------------ ring */

enum { TAG_KV = 11, TAG_DKV = 12 }; /* model_cp.c's */

/* Position of the first token of local chunk j (0 or 1) of rank x. */
static int chunk_pos(const loco_gpt_cuda *g, int x, int j) {
    return (j == 0 ? x : 2 * g->cp - 1 - x) * g->Tc;
}

/* This rank's K|V rows side by side, (B T, 2 Ckv), into the host buffer
 * h, from qkv's local rows (the key and value heads follow the query
 * heads' columns). */
static int pack_kv(loco_gpt_cuda *g, const float *qkv, float *h, size_t rows) {
    const size_t W = (size_t)g->Wl, Q = (size_t)g->NHl * loco_gpt_head_size(&g->cfg);
    const size_t kv = 2 * (size_t)g->Ckv;
    LOCO_CHECK(loco_cuda_copy(g->h_cp_rows, qkv, rows * W * 4, g->stream));
    LOCO_CHECK(loco_cuda_sync(g->stream));
    for (size_t i = 0; i < rows; i++)
        memcpy(h + i * kv, g->h_cp_rows + i * W + Q, kv * sizeof(float));
    return 0;
}

/* Posts a hop: the block in host buffer `cur` to the next rank, the
 * previous rank's into the other, once its last copy in is done. */
static int hop_post(loco_gpt_cuda *g, int cur, size_t n, loco_comm_req **rq) {
    const int nx = (g->cp_rank + 1) % g->cp, pv = (g->cp_rank + g->cp - 1) % g->cp;
    LOCO_CHECK(loco_cuda_event_sync(g->kv_in[1 - cur]));
    LOCO_CHECK(loco_comm_irecv(g->cpc, g->h_kv_hop[1 - cur], n, LOCO_DT_F32, pv, TAG_KV, &rq[0]));
    return loco_comm_isend(g->cpc, g->h_kv_hop[cur], n, LOCO_DT_F32, nx, TAG_KV, &rq[1]);
}

/* Waits for the hop, then queues the received block's copy to the device
 * (behind the kernels of this step, which read the other slot). */
static int hop_land(loco_gpt_cuda *g, int cur, size_t n, loco_comm_req **rq) {
    const int rc = loco_comm_wait(rq[0]), rc2 = loco_comm_wait(rq[1]);
    LOCO_CHECK(rc < 0 ? rc : rc2);
    LOCO_CHECK(loco_cuda_copy(g->cp_kv[1 - cur], g->h_kv_hop[1 - cur], n * 4, g->stream));
    return loco_cuda_event_record(g->kv_in[1 - cur], g->stream);
}

/* out (B T, Cl) and lse (B, 2, NH, Tc) of this rank's query chunks
 * against every rank's K|V: model_cp.c's ring_fwd on the device. */
static int ring_blocks_fwd(loco_gpt_cuda *g, const float *qkv, float *out, float *lse, int B) {
    const int c = g->cp, r = g->cp_rank, Tc = g->Tc, Tl = g->T, NH = g->NHl, W = g->Wl;
    const int hs = loco_gpt_head_size(&g->cfg), Cl = NH * hs, Ckv = g->Ckv;
    const size_t rows = (size_t)B * Tl, n = rows * 2 * (size_t)Ckv;
    LOCO_CHECK(pack_kv(g, qkv, g->h_kv_hop[0], rows));
    int cur = 0;
    for (int s = 0; s < c; s++) {
        loco_comm_req *rq[2] = {NULL, NULL};
        if (s < c - 1)
            LOCO_CHECK(hop_post(g, cur, n, rq));
        const int src = (r - s + c) % c, ld = s == 0 ? W : 2 * Ckv;
        const float *kv = s == 0 ? qkv + Cl : g->cp_kv[cur]; /* its own block: in place */
        for (int b = 0; b < B; b++)
            for (int j = 0; j < 2; j++)
                for (int i = 0; i < 2; i++) {
                    const int qp = chunk_pos(g, r, j), kp = chunk_pos(g, src, i);
                    if (kp > qp + Tc - 1)
                        continue; /* every key is in the future */
                    const float *q = qkv + ((size_t)b * Tl + (size_t)j * Tc) * W;
                    const float *k = kv + ((size_t)b * Tl + (size_t)i * Tc) * ld;
                    float *o = out + ((size_t)b * Tl + (size_t)j * Tc) * Cl;
                    float *l = lse + ((size_t)b * 2 + j) * NH * Tc;
                    /* the first block a chunk sees (its own, s = 0, i = 0)
                     * is the running result: merging it into an empty one
                     * would take it as it is */
                    const bool first = s == 0 && i == 0;
                    RUN(LOCO_PROF_ATTN,
                        loco_cuda_attention_block_gqa_fwd(
                            first ? o : g->cp_blk_out, first ? l : g->cp_blk_lse, q, W, k, k + Ckv,
                            ld, 1, Tc, Tc, NH, g->NKVl, hs, qp, kp, true, g->stream));
                    if (!first)
                        RUN(LOCO_PROF_ATTN,
                            loco_cuda_attention_merge(o, l, g->cp_blk_out, g->cp_blk_lse, 1, Tc, Cl,
                                                      NH, g->stream));
                }
        if (s < c - 1) {
            LOCO_CHECK(hop_land(g, cur, n, rq));
            cur = 1 - cur;
        }
    }
    return 0;
}

/* One step's backward: this rank's query chunks against the K|V block
 * of rank src (kv, row stride ld), dQ into dqkv, dK|dV into dkv. */
static int ring_bwd_block(loco_gpt_cuda *g, float *dqkv, const float *dout, const float *qkv,
                          const float *lse, int B, const float *kv, int ld, float *dkv, int src) {
    const int r = g->cp_rank, Tc = g->Tc, Tl = g->T, NH = g->NHl, W = g->Wl;
    const int hs = loco_gpt_head_size(&g->cfg), Cl = NH * hs, Ckv = g->Ckv;
    for (int b = 0; b < B; b++)
        for (int j = 0; j < 2; j++)
            for (int i = 0; i < 2; i++) {
                const int qp = chunk_pos(g, r, j), kp = chunk_pos(g, src, i);
                if (kp > qp + Tc - 1)
                    continue;
                const size_t qrow = (size_t)b * Tl + (size_t)j * Tc;
                const size_t krow = (size_t)b * Tl + (size_t)i * Tc;
                const float *k = kv + krow * ld;
                float *dk = dkv + krow * 2 * Ckv;
                const size_t stat = ((size_t)b * 2 + j) * NH * Tc;
                RUN(LOCO_PROF_ATTN,
                    loco_cuda_attention_block_gqa_bwd(
                        dqkv + qrow * W, W, dk, dk + Ckv, 2 * Ckv, dout + qrow * Cl, lse + stat,
                        g->cp_delta + stat, qkv + qrow * W, W, k, k + Ckv, ld, 1, Tc, Tc, NH,
                        g->NKVl, hs, qp, kp, true, g->stream));
            }
    return 0;
}

/* dqkv (B T, Wl) accumulates dQ and this rank's own K|V gradient; K|V
 * travel as in the forward, each block's dK|dV accumulator following it
 * (model_cp.c's ring_bwd). */
static int ring_blocks_bwd(loco_gpt_cuda *g, float *dqkv, const float *dout, const float *qkv,
                           const float *out, const float *lse, int B) {
    const int c = g->cp, r = g->cp_rank, Tc = g->Tc, Tl = g->T, NH = g->NHl, W = g->Wl;
    const int hs = loco_gpt_head_size(&g->cfg), Cl = NH * hs, Ckv = g->Ckv;
    const size_t rows = (size_t)B * Tl, n = rows * 2 * (size_t)Ckv;
    const int nx = (r + 1) % c, pv = (r + c - 1) % c;
    for (int b = 0; b < B; b++)
        for (int j = 0; j < 2; j++) {
            const size_t at = ((size_t)b * Tl + (size_t)j * Tc) * Cl;
            RUN(LOCO_PROF_ATTN,
                loco_cuda_attention_delta(g->cp_delta + ((size_t)b * 2 + j) * NH * Tc, dout + at,
                                          out + at, 1, Tc, Cl, NH, g->stream));
        }
    LOCO_CHECK(pack_kv(g, qkv, g->h_kv_hop[0], rows));
    loco_comm_req *sreq[2] = {NULL, NULL}, *rreq = NULL;
    int cur = 0, rc = 0;
    for (int s = 0; s < c && rc == 0; s++) {
        loco_comm_req *rq[2] = {NULL, NULL};
        if (s < c - 1)
            LOCO_CHECK(hop_post(g, cur, n, rq));
        float *acc = g->cp_dacc[s % 2], *dst = s == 0 ? acc : g->cp_dpart;
        if (s > 0) { /* the accumulator of the block this step computes on */
            LOCO_CHECK(loco_comm_wait(sreq[s % 2])); /* that host buffer left at step s - 2 */
            sreq[s % 2] = NULL;
            LOCO_CHECK(loco_cuda_event_sync(g->acc_in));
            LOCO_CHECK(loco_comm_irecv(g->cpc, g->h_acc_recv, n, LOCO_DT_F32, pv, TAG_DKV, &rreq));
        }
        RUN(LOCO_PROF_ELEM, loco_cuda_zero(dst, n * 4, g->stream));
        const int src = (r - s + c) % c, ld = s == 0 ? W : 2 * Ckv;
        const float *kv = s == 0 ? qkv + Cl : g->cp_kv[cur];
        LOCO_CHECK(ring_bwd_block(g, dqkv, dout, qkv, lse, B, kv, ld, dst, src));
        if (s < c - 1)
            LOCO_CHECK(hop_land(g, cur, n, rq));
        if (s > 0) { /* acc = what came + this rank's part */
            rc = loco_comm_wait(rreq);
            rreq = NULL;
            LOCO_CHECK(rc);
            LOCO_CHECK(loco_cuda_copy(acc, g->h_acc_recv, n * 4, g->stream));
            LOCO_CHECK(loco_cuda_event_record(g->acc_in, g->stream));
            RUN(LOCO_PROF_ELEM, loco_cuda_add_clear(acc, g->cp_dpart, n, g->stream));
        }
        LOCO_CHECK(loco_cuda_copy(g->h_acc_send[s % 2], acc, n * 4, g->stream));
        LOCO_CHECK(loco_cuda_sync(g->stream));
        rc = loco_comm_isend(g->cpc, g->h_acc_send[s % 2], n, LOCO_DT_F32, nx, TAG_DKV,
                             &sreq[s % 2]);
        if (s < c - 1)
            cur = 1 - cur;
    }
    /* after c hops this rank's own block's accumulator comes home; it is
     * added to dqkv's key and value columns on the host */
    if (rc == 0)
        rc = loco_comm_irecv(g->cpc, g->h_acc_recv, n, LOCO_DT_F32, pv, TAG_DKV, &rreq);
    if (rc == 0)
        rc = loco_comm_wait(rreq);
    for (int k = 0; k < 2; k++) {
        const int rk = loco_comm_wait(sreq[k]);
        rc = rc < 0 ? rc : rk;
    }
    LOCO_CHECK(rc);
    LOCO_CHECK(loco_cuda_copy(g->h_cp_rows, dqkv, rows * W * 4, g->stream));
    LOCO_CHECK(loco_cuda_sync(g->stream));
    for (size_t i = 0; i < rows; i++) {
        float *o = g->h_cp_rows + i * W + Cl;
        const float *in = g->h_acc_recv + i * 2 * Ckv;
        for (int x = 0; x < 2 * Ckv; x++)
            o[x] += in[x];
    }
    return loco_cuda_copy(dqkv, g->h_cp_rows, rows * W * 4, g->stream);
}

/* ------------------------------------------- the attention, either way */

/* Ulysses (cp): qkv's local rows become every row of this rank's 1/cp of
 * the heads (qkvh), the attention runs on those, and its output comes
 * back to the local rows in atty. */
static int ulysses_fwd(loco_gpt_cuda *g, layer_acts *a, int B) {
    const int hs = loco_gpt_head_size(&g->cfg);
    LOCO_CHECK(to_heads(g, a->qkv, g->Wl, 3, a->qkvh, B));
    RUN(LOCO_PROF_ATTN,
        ATTN_GQA(fwd, a->outh, a->lse, a->qkvh, B, g->Tw, g->hq / hs, g->hk / hs, hs, g->stream));
    return from_heads(g, a->outh, a->atty, B);
}

static int ulysses_bwd(loco_gpt_cuda *g, const layer_acts *a, int B) {
    const int hs = loco_gpt_head_size(&g->cfg);
    LOCO_CHECK(to_heads(g, g->dbtc, g->Cl, 1, g->cp_dout, B));
    RUN(LOCO_PROF_ELEM, loco_cuda_zero(g->cp_dqkv, (size_t)B * g->Tw * g->wu * g->es, g->stream));
    RUN(LOCO_PROF_ATTN, ATTN_GQA(bwd, g->cp_dqkv, g->attn_scratch, g->cp_dout, a->outh, a->qkvh,
                                 a->lse, B, g->Tw, g->hq / hs, g->hk / hs, hs, g->stream));
    return dqkv_from_heads(g, g->dqkv, B);
}

/* The ring (gpt_cuda_cp.c) runs fp32 kernels: in bf16 its operands are
 * cast to fp32 around it (exactly, the qkv it reads again in the
 * backward), its output rounded once; the backward's delta reads the
 * rounded output, as FlashAttention-2 in bf16 does. */
static int ring_fwd(loco_gpt_cuda *g, layer_acts *a, int B) {
    if (!g->bf16)
        return ring_blocks_fwd(g, a->qkv, a->atty, a->lse, B);
    const size_t rows = (size_t)B * g->T;
    RUN(LOCO_PROF_ELEM, loco_cuda_cast_f32(g->cp_q32, a->qkv, rows * g->Wl, g->stream));
    LOCO_CHECK(ring_blocks_fwd(g, g->cp_q32, g->cp_o32, a->lse, B));
    RUN(LOCO_PROF_ELEM, loco_cuda_cast_bf16(a->atty, g->cp_o32, rows * g->Cl, g->stream));
    return 0;
}

static int ring_bwd(loco_gpt_cuda *g, const layer_acts *a, int B) {
    if (!g->bf16)
        return ring_blocks_bwd(g, g->dqkv, g->dbtc, a->qkv, a->atty, a->lse, B);
    /* cp_q32: qkv | dqkv, cp_o32: out | dout, each (B T) rows */
    const size_t rows = (size_t)B * g->T, W = (size_t)g->Wl, Cl = (size_t)g->Cl;
    float *q32 = g->cp_q32, *dq32 = g->cp_q32 + rows * W;
    float *o32 = g->cp_o32, *do32 = g->cp_o32 + rows * Cl;
    RUN(LOCO_PROF_ELEM, loco_cuda_cast_f32(q32, a->qkv, rows * W, g->stream));
    RUN(LOCO_PROF_ELEM, loco_cuda_cast_f32(o32, a->atty, rows * Cl, g->stream));
    RUN(LOCO_PROF_ELEM, loco_cuda_cast_f32(do32, g->dbtc, rows * Cl, g->stream));
    RUN(LOCO_PROF_ELEM, loco_cuda_zero(dq32, rows * W * 4, g->stream));
    LOCO_CHECK(ring_blocks_bwd(g, dq32, do32, q32, o32, a->lse, B));
    RUN(LOCO_PROF_ELEM, loco_cuda_cast_bf16(g->dqkv, dq32, rows * W, g->stream));
    return 0;
}

int loco__gpt_cuda_cp_attention_fwd(loco_gpt_cuda *g, layer_acts *a, int B) {
    return g->ring ? ring_fwd(g, a, B) : ulysses_fwd(g, a, B);
}

int loco__gpt_cuda_cp_attention_bwd(loco_gpt_cuda *g, const layer_acts *a, int B) {
    return g->ring ? ring_bwd(g, a, B) : ulysses_bwd(g, a, B);
}

#endif /* LOCO_HAVE_CUDA */
