/* Context parallelism of the model's passes (parallel.cp = c): every
 * sequence is cut into 2c chunks of Tc tokens and rank r holds chunks r and
 * 2c-1-r (zig-zag), so under the causal mask every rank has the same work.
 * Everything outside attention runs on those rows as on any others (the
 * model's T is the local rows, 2 Tc); positions are global, the loss is
 * the mean over the whole sequence. Attention over the split sequence:
 * - ring (Liu et al.): the ranks' K|V blocks travel around the ring, the
 *   next block's transfer posted before the current block's attention;
 *   block results merge by log-sum-exp; the backward passes K|V the same
 *   way with the blocks' dK|dV accumulators following them home;
 * - Ulysses (DeepSpeed): an all-to-all turns the rank's rows of every head
 *   into every row of 1/c of the heads, plain attention runs on those, and
 *   an all-to-all turns the output back (and the conjugates backward). */
#include "inner/model/internal.h"
#include "kernels/kernels.h"

#include <math.h>
#include <string.h>

enum { TAG_KV = 11, TAG_DKV = 12 };

/* Position of the first token of local chunk j (0 or 1) of rank x. */
static int chunk_pos(int x, int c, int Tc, int j) {
    return (j == 0 ? x : 2 * c - 1 - x) * Tc;
}

/* Position of local row i of rank x. */
static int row_pos(int x, int c, int Tc, int i) {
    return chunk_pos(x, c, Tc, i / Tc) + i % Tc;
}

int loco__gpt_cp_check(const loco_gpt_config *cfg, int B, int T, const loco_gpt_parallel *par) {
    const int c = par->cp ? loco_comm_size(par->cp) : 1;
    if (c < 2)
        return 0;
    const int t = loco__gpt_tp_of(cfg);
    if (T % (2 * c))
        return LOCO_ERR(LOCO_EINVAL,
                        "parallel.cp = %d: model.seq_len = %d does not split into 2 x cp = %d "
                        "chunks of equal length (the zig-zag layout gives rank r chunks r and "
                        "2cp-1-r)",
                        c, T, 2 * c);
    if (par->cp_algo == LOCO_CP_ULYSSES && (cfg->n_head / t) % c)
        return LOCO_ERR(LOCO_EINVAL,
                        "parallel.cp_algo = ulysses: the %d attention heads%s do not split over "
                        "parallel.cp = %d ranks (use a cp dividing them, or cp_algo = ring)",
                        cfg->n_head / t, t > 1 ? " of a tp rank" : "", c);
    const int NKVl = loco__gpt_kv_local(cfg);
    if (par->cp_algo == LOCO_CP_ULYSSES && NKVl % c && c % NKVl)
        return LOCO_ERR(LOCO_EINVAL,
                        "parallel.cp_algo = ulysses: the %d key/value heads%s neither split over "
                        "parallel.cp = %d ranks nor divide it (each rank needs whole key/value "
                        "heads: use a cp that model.n_kv_head divides or that divides it, or "
                        "cp_algo = ring)",
                        NKVl, t > 1 ? " of a tp rank" : "", c);
    if (par->sp && ((size_t)B * (size_t)(T / c)) % (size_t)t)
        return LOCO_ERR(LOCO_EINVAL,
                        "parallel.sp with cp = %d: the %d x %d tokens of a rank do not split "
                        "over tp = %d ranks",
                        c, B, T / c, t);
    return 0;
}

void loco__gpt_cp_fini(loco_gpt *m) {
    loco_gpt_cp *cp = m->cp;
    if (!cp)
        return;
    loco_free(cp->tok);
    loco_free(cp->pos);
    loco_free(cp->buf);
    loco_free(cp);
    m->cp = NULL;
}

int loco__gpt_cp_init(loco_gpt *m, int B, int T) {
    const int c = m->par.cp ? loco_comm_size(m->par.cp) : 1;
    if (c < 2) {
        m->par.cp = NULL;
        return 0;
    }
    loco_gpt_cp *cp = loco_alloc(sizeof *cp);
    if (!cp)
        return LOCO_ERR(LOCO_ENOMEM, "context-parallel state");
    m->cp = cp;
    cp->comm = m->par.cp;
    cp->algo = m->par.cp_algo;
    cp->c = c;
    cp->r = loco_comm_rank(cp->comm);
    cp->T = T;
    cp->Tc = T / (2 * c);
    cp->Tl = 2 * cp->Tc;
    const int t = loco__gpt_tp_of(&m->cfg), hs = loco_gpt_head_size(&m->cfg);
    const int NKVl = loco__gpt_kv_local(&m->cfg);
    const size_t C = (size_t)m->cfg.n_embd, Cl = C / (size_t)t, NHl = (size_t)m->cfg.n_head / t;
    const size_t rows = (size_t)B * (size_t)cp->Tl, Tc = (size_t)cp->Tc;
    cp->Ckv = NKVl * hs;
    cp->hq = (int)(NHl / (size_t)c) * hs;
    cp->hk = (NKVl >= c ? NKVl / c : 1) * hs;
    cp->wu = cp->hq + 2 * cp->hk;
    const size_t Ckv = (size_t)cp->Ckv, wu = (size_t)cp->wu;
    cp->tok = loco_alloc(2 * rows * sizeof(int32_t));
    cp->pos = loco_alloc((size_t)cp->Tl * sizeof(int));
    /* One slab: wpe rows and their gradient, then the algorithm's buffers. */
    size_t n = 2 * (size_t)cp->Tl * C;
    if (cp->algo == LOCO_CP_RING)
        n += 5 * rows * 2 * Ckv + Tc * Cl + NHl * Tc + (size_t)B * 2 * NHl * Tc;
    else
        n += 2 * (size_t)c * rows * wu + 2 * rows * Cl + (size_t)c * rows * wu;
    cp->buf = loco_alloc(n * sizeof(float));
    if (!cp->tok || !cp->pos || !cp->buf) {
        loco__gpt_cp_fini(m);
        return LOCO_ERR(LOCO_ENOMEM, "context-parallel buffers of %zu floats", n);
    }
    cp->bytes_held = n * sizeof(float) + 2 * rows * sizeof(int32_t);
    cp->tgt = cp->tok + rows;
    for (int i = 0; i < cp->Tl; i++)
        cp->pos[i] = row_pos(cp->r, c, cp->Tc, i);
    float *at = cp->buf;
    cp->wpe = at, at += (size_t)cp->Tl * C;
    cp->dwpe = at, at += (size_t)cp->Tl * C;
    if (cp->algo == LOCO_CP_RING) {
        for (int i = 0; i < 2; i++) {
            cp->kv[i] = at, at += rows * 2 * Ckv;
            cp->dkv[i] = at, at += rows * 2 * Ckv;
        }
        cp->dkv_part = at, at += rows * 2 * Ckv;
        cp->blk_out = at, at += Tc * Cl;
        cp->blk_lse = at, at += NHl * Tc;
        cp->delta = at;
    } else {
        cp->send = at, at += (size_t)c * rows * wu;
        cp->recv = at, at += (size_t)c * rows * wu;
        cp->hout = at, at += rows * Cl;
        cp->hdout = at, at += rows * Cl;
        cp->hdqkv = at;
    }
    m->T = cp->Tl; /* the passes see the local rows */
    return 0;
}

int loco__gpt_cp_localize(loco_gpt *m, const int32_t **inputs, const int32_t **targets, int B,
                          int *T) {
    loco_gpt_cp *cp = m->cp;
    if (*T != cp->T)
        return LOCO_ERR(LOCO_EINVAL,
                        "context parallelism splits sequences of %d tokens; this pass has %d",
                        cp->T, *T);
    if (B < 1 || B > m->B)
        return LOCO_ERR(LOCO_EINVAL, "batch of %d sequences exceeds the model's capacity %d", B,
                        m->B);
    int32_t *dst[2] = {cp->tok, cp->tgt};
    const int32_t **src[2] = {inputs, targets};
    for (int k = 0; k < 2; k++) {
        if (!src[k] || !*src[k])
            continue;
        for (int b = 0; b < B; b++)
            for (int i = 0; i < cp->Tl; i++)
                dst[k][(size_t)b * cp->Tl + i] =
                    (*src[k])[(size_t)b * cp->T + row_pos(cp->r, cp->c, cp->Tc, i)];
        *src[k] = dst[k];
    }
    *T = cp->Tl;
    return 0;
}

int loco__gpt_cp_mean_loss(loco_gpt *m, float *loss) {
    /* Every rank holds as many tokens: the mean of the means. */
    double v = *loss;
    LOCO_CHECK(loco_comm_allreduce(m->cp->comm, &v, 1, LOCO_DT_F64, LOCO_OP_AVG));
    *loss = (float)v;
    return 0;
}

const float *loco__gpt_cp_wpe(loco_gpt *m) {
    loco_gpt_cp *cp = m->cp;
    if (!cp)
        return m->p.wpe;
    const size_t C = (size_t)m->cfg.n_embd;
    for (int i = 0; i < cp->Tl; i++)
        memcpy(cp->wpe + i * C, m->p.wpe + (size_t)row_pos(cp->r, cp->c, cp->Tc, i) * C,
               C * sizeof(float));
    return cp->wpe;
}

float *loco__gpt_cp_dwpe(loco_gpt *m) {
    loco_gpt_cp *cp = m->cp;
    if (!cp)
        return m->g.wpe;
    memset(cp->dwpe, 0, (size_t)cp->Tl * m->cfg.n_embd * sizeof(float));
    return cp->dwpe;
}

void loco__gpt_cp_dwpe_done(loco_gpt *m) {
    loco_gpt_cp *cp = m->cp;
    if (!cp)
        return;
    const size_t C = (size_t)m->cfg.n_embd;
    for (int i = 0; i < cp->Tl; i++) {
        float *g = m->g.wpe + (size_t)row_pos(cp->r, cp->c, cp->Tc, i) * C;
        const float *d = cp->dwpe + i * C;
        for (size_t x = 0; x < C; x++)
            g[x] += d[x];
    }
}

size_t loco__gpt_att_floats(const loco_gpt *m, const loco__gpt_shape *d) {
    const size_t B = (size_t)m->B, T = (size_t)m->T, NHl = (size_t)d->NHl;
    if (!m->cp)
        return B * NHl * T * T;
    if (m->cp->algo == LOCO_CP_RING)
        return B * NHl * T; /* the log-sum-exp of each row */
    const size_t Tw = (size_t)m->cp->T;
    return B * (NHl / (size_t)m->cp->c) * Tw * Tw;
}

/* ----------------------------------------------------------------- ring */

/* The rank's K|V rows side by side, (B Tl, 2 Ckv), from qkv (B Tl, Wl):
 * the key and value heads follow the NHl query heads' Cl columns. */
static void pack_kv(float *kv, const float *qkv, size_t rows, const loco__gpt_shape *d, int Ckv) {
    for (size_t i = 0; i < rows; i++)
        memcpy(kv + i * 2 * Ckv, qkv + i * d->Wl + d->Cl, 2 * (size_t)Ckv * sizeof(float));
}

/* Posts the next block's transfer: receive from the previous rank, send
 * the current block on to the next. */
static int ring_post(loco_gpt_cp *cp, float *cur, float *next, size_t n, int tag,
                     loco_comm_req **rq) {
    const int nx = (cp->r + 1) % cp->c, pv = (cp->r + cp->c - 1) % cp->c;
    LOCO_CHECK(loco_comm_irecv(cp->comm, next, n, LOCO_DT_F32, pv, tag, &rq[0]));
    LOCO_CHECK(loco_comm_isend(cp->comm, cur, n, LOCO_DT_F32, nx, tag, &rq[1]));
    cp->bytes += (double)n * sizeof(float);
    return 0;
}

static int ring_wait(loco_comm_req **rq) {
    int rc = loco_comm_wait(rq[0]);
    int rc2 = loco_comm_wait(rq[1]);
    rq[0] = rq[1] = NULL;
    return rc < 0 ? rc : rc2;
}

static int ring_fwd(loco_gpt *m, const loco__gpt_shape *d, float *out, float *lse,
                    const float *qkv, int B) {
    loco_gpt_cp *cp = m->cp;
    const int c = cp->c, r = cp->r, Tc = cp->Tc, Tl = cp->Tl, Cl = d->Cl, NHl = d->NHl;
    const int Ckv = cp->Ckv, W = d->Wl;
    const size_t rows = (size_t)B * Tl, n = rows * 2 * Ckv;
    pack_kv(cp->kv[0], qkv, rows, d, Ckv);
    for (size_t i = 0; i < rows * Cl; i++)
        out[i] = 0;
    for (size_t i = 0; i < (size_t)B * 2 * NHl * Tc; i++)
        lse[i] = -INFINITY;
    int cur = 0;
    for (int s = 0; s < c; s++) {
        loco_comm_req *rq[2] = {NULL, NULL};
        if (s < c - 1)
            LOCO_CHECK(ring_post(cp, cp->kv[cur], cp->kv[1 - cur], n, TAG_KV, rq));
        const int src = (r - s + c) % c;
        for (int b = 0; b < B; b++)
            for (int j = 0; j < 2; j++)
                for (int i = 0; i < 2; i++) {
                    const int qp = chunk_pos(r, c, Tc, j), kp = chunk_pos(src, c, Tc, i);
                    if (kp > qp + Tc - 1)
                        continue; /* every key is in the future */
                    const float *q = qkv + ((size_t)b * Tl + (size_t)j * Tc) * W;
                    const float *k = cp->kv[cur] + ((size_t)b * Tl + (size_t)i * Tc) * 2 * Ckv;
                    loco_attention_block_gqa_fwd(cp->blk_out, cp->blk_lse, q, W, k, k + Ckv,
                                                 2 * Ckv, 1, Tc, Tc, NHl, d->NKVl, d->hs, qp, kp,
                                                 true);
                    loco_attention_merge(out + ((size_t)b * Tl + (size_t)j * Tc) * Cl,
                                         lse + ((size_t)b * 2 + j) * NHl * Tc, cp->blk_out,
                                         cp->blk_lse, 1, Tc, Cl, NHl);
                }
        if (s < c - 1)
            LOCO_CHECK(ring_wait(rq));
        cur = 1 - cur;
    }
    return 0;
}

/* One ring step's backward: this rank's query chunks against the K|V
 * block of rank src (kv), dQ into dqkv, dK|dV into dkv. */
static void ring_bwd_block(loco_gpt *m, const loco__gpt_shape *d, float *dqkv, const float *dout,
                           const float *qkv, const float *lse, int B, const float *kv, float *dkv,
                           int src) {
    const loco_gpt_cp *cp = m->cp;
    const int c = cp->c, r = cp->r, Tc = cp->Tc, Tl = cp->Tl, Cl = d->Cl, NHl = d->NHl;
    const int Ckv = cp->Ckv, W = d->Wl;
    for (int b = 0; b < B; b++)
        for (int j = 0; j < 2; j++)
            for (int i = 0; i < 2; i++) {
                const int qp = chunk_pos(r, c, Tc, j), kp = chunk_pos(src, c, Tc, i);
                if (kp > qp + Tc - 1)
                    continue;
                const size_t qrow = (size_t)b * Tl + (size_t)j * Tc;
                const size_t krow = (size_t)b * Tl + (size_t)i * Tc;
                const float *k = kv + krow * 2 * Ckv;
                float *dk = dkv + krow * 2 * Ckv;
                const size_t stat = ((size_t)b * 2 + j) * NHl * Tc;
                loco_attention_block_gqa_bwd(dqkv + qrow * W, W, dk, dk + Ckv, 2 * Ckv,
                                             dout + qrow * Cl, lse + stat, cp->delta + stat,
                                             qkv + qrow * W, W, k, k + Ckv, 2 * Ckv, 1, Tc, Tc, NHl,
                                             d->NKVl, d->hs, qp, kp, true);
            }
}

static int ring_bwd(loco_gpt *m, const loco__gpt_shape *d, float *dqkv, const float *dout,
                    const float *qkv, const float *out, const float *lse, int B) {
    loco_gpt_cp *cp = m->cp;
    const int c = cp->c, r = cp->r, Tc = cp->Tc, Tl = cp->Tl, Cl = d->Cl, NHl = d->NHl;
    const int Ckv = cp->Ckv;
    const size_t rows = (size_t)B * Tl, n = rows * 2 * Ckv;
    for (int b = 0; b < B; b++)
        for (int j = 0; j < 2; j++) {
            const size_t at = ((size_t)b * Tl + (size_t)j * Tc) * Cl;
            loco_attention_delta(cp->delta + ((size_t)b * 2 + j) * NHl * Tc, dout + at, out + at, 1,
                                 Tc, Cl, NHl);
        }
    pack_kv(cp->kv[0], qkv, rows, d, Ckv);
    /* Each block's dK|dV accumulator follows it around the ring. A step
     * computes its contribution apart (part) while the accumulator from
     * the previous rank is in flight, adds it on arrival and sends it on;
     * accumulators alternate between dkv[0] and dkv[1]. */
    const int nx = (r + 1) % c, pv = (r + c - 1) % c;
    loco_comm_req *sreq[2] = {NULL, NULL}, *rreq = NULL;
    int cur = 0, rc = 0;
    for (int s = 0; s < c && rc == 0; s++) {
        loco_comm_req *rq[2] = {NULL, NULL};
        if (s < c - 1)
            LOCO_CHECK(ring_post(cp, cp->kv[cur], cp->kv[1 - cur], n, TAG_KV, rq));
        float *acc = cp->dkv[s % 2], *dst = s == 0 ? acc : cp->dkv_part;
        if (s > 0) { /* that buffer left at step s - 2 */
            LOCO_CHECK(loco_comm_wait(sreq[s % 2]));
            sreq[s % 2] = NULL;
            LOCO_CHECK(loco_comm_irecv(cp->comm, acc, n, LOCO_DT_F32, pv, TAG_DKV, &rreq));
        }
        memset(dst, 0, n * sizeof(float));
        const int src = (r - s + c) % c;
        ring_bwd_block(m, d, dqkv, dout, qkv, lse, B, cp->kv[cur], dst, src);
        if (s < c - 1)
            LOCO_CHECK(ring_wait(rq));
        if (s > 0) {
            rc = loco_comm_wait(rreq);
            rreq = NULL;
            for (size_t i = 0; rc == 0 && i < n; i++)
                acc[i] += dst[i];
        }
        if (rc == 0)
            rc = loco_comm_isend(cp->comm, acc, n, LOCO_DT_F32, nx, TAG_DKV, &sreq[s % 2]);
        cp->bytes += (double)n * sizeof(float);
        cur = 1 - cur;
    }
    /* After c hops this rank's own block's accumulator comes home. */
    float *mine = cp->dkv[c % 2];
    if (rc == 0)
        rc = loco_comm_wait(sreq[c % 2]);
    sreq[c % 2] = NULL;
    if (rc == 0)
        rc = loco_comm_recv(cp->comm, mine, n, LOCO_DT_F32, pv, TAG_DKV);
    const int rc2 = loco_comm_wait(sreq[(c + 1) % 2]);
    LOCO_CHECK(rc < 0 ? rc : rc2);
    for (size_t i = 0; i < rows; i++) {
        float *o = dqkv + i * d->Wl + Cl;
        const float *in = mine + i * 2 * Ckv;
        for (int x = 0; x < 2 * Ckv; x++)
            o[x] += in[x];
    }
    return 0;
}

/* -------------------------------------------------------------- Ulysses */

/* Rank x's columns of a local row: its query heads' (parts 1: the
 * attention output's row of Cl), or those, then its key and value heads'
 * (parts 3: c_attn's row of Wl). *col and *w receive the segments. */
static int segments(const loco_gpt_cp *cp, const loco__gpt_shape *d, int x, int parts, int *col,
                    int *w) {
    col[0] = x * cp->hq, w[0] = cp->hq;
    if (parts == 1)
        return 1;
    const int kv0 = x * d->NKVl / cp->c * d->hs; /* its queries' first key/value head */
    col[1] = d->Cl + kv0, w[1] = cp->hk;
    col[2] = d->Cl + cp->Ckv + kv0, w[2] = cp->hk;
    return 3;
}

/* Local rows (B x Tl, ld columns) -> send: for each rank x, its columns of
 * every row (rows of hq, or of wu = hq + 2 hk). */
static void pack_heads(const loco_gpt_cp *cp, const loco__gpt_shape *d, float *send,
                       const float *src, int B, int ld, int parts) {
    const size_t rows = (size_t)B * cp->Tl, wx = parts == 1 ? (size_t)cp->hq : (size_t)cp->wu;
    for (int x = 0; x < cp->c; x++) {
        int col[3], w[3];
        const int n = segments(cp, d, x, parts, col, w);
        for (size_t row = 0; row < rows; row++) {
            float *o = send + ((size_t)x * rows + row) * wx;
            for (int g = 0; g < n; g++, o += w[g - 1])
                memcpy(o, src + row * ld + col[g], (size_t)w[g] * sizeof(float));
        }
    }
}

/* From rank x: its rows of this rank's heads -> dst (B, T, w) at their
 * global positions. */
static void place_rows(const loco_gpt_cp *cp, float *dst, const float *recv, int B, int w) {
    const int c = cp->c, Tl = cp->Tl;
    for (int x = 0; x < c; x++)
        for (int b = 0; b < B; b++)
            for (int i = 0; i < Tl; i++)
                memcpy(dst + ((size_t)b * cp->T + row_pos(x, c, cp->Tc, i)) * w,
                       recv + (((size_t)x * B + b) * Tl + i) * w, (size_t)w * sizeof(float));
}

/* (B, T, w) whole sequences of this rank's heads -> send: for each rank x
 * its rows. */
static void pick_rows(const loco_gpt_cp *cp, float *send, const float *src, int B, int w) {
    const int c = cp->c, Tl = cp->Tl;
    for (int x = 0; x < c; x++)
        for (int b = 0; b < B; b++)
            for (int i = 0; i < Tl; i++)
                memcpy(send + (((size_t)x * B + b) * Tl + i) * w,
                       src + ((size_t)b * cp->T + row_pos(x, c, cp->Tc, i)) * w,
                       (size_t)w * sizeof(float));
}

/* From rank x: this rank's rows of x's heads -> dst (B Tl rows of ld
 * columns), added or written at x's columns. A key/value head replicated
 * to several ranks gets the sum of their gradients. */
static void unpack_heads(const loco_gpt_cp *cp, const loco__gpt_shape *d, float *dst,
                         const float *recv, int B, int ld, int parts, bool add) {
    const size_t rows = (size_t)B * cp->Tl, wx = parts == 1 ? (size_t)cp->hq : (size_t)cp->wu;
    for (int x = 0; x < cp->c; x++) {
        int col[3], w[3];
        const int n = segments(cp, d, x, parts, col, w);
        for (size_t row = 0; row < rows; row++) {
            const float *in = recv + ((size_t)x * rows + row) * wx;
            for (int g = 0; g < n; in += w[g], g++) {
                float *o = dst + row * ld + col[g];
                if (add)
                    for (int e = 0; e < w[g]; e++)
                        o[e] += in[e];
                else
                    memcpy(o, in, (size_t)w[g] * sizeof(float));
            }
        }
    }
}

static int alltoall(loco_gpt_cp *cp, size_t per_rank) {
    cp->bytes += (double)per_rank * (cp->c - 1) * sizeof(float);
    return loco_comm_alltoall(cp->comm, cp->send, cp->recv, per_rank, LOCO_DT_F32);
}

/* qkv (B Tl, Wl) local rows becomes, in place, (B, T, wu): every row of
 * this rank's heads, as plain attention reads it (d->Wa makes room when
 * key/value heads are replicated). */
static int ulysses_fwd(loco_gpt *m, const loco__gpt_shape *d, float *out, float *att, float *qkv,
                       int B) {
    loco_gpt_cp *cp = m->cp;
    const size_t rows = (size_t)B * cp->Tl;
    pack_heads(cp, d, cp->send, qkv, B, d->Wl, 3);
    LOCO_CHECK(alltoall(cp, rows * (size_t)cp->wu));
    place_rows(cp, qkv, cp->recv, B, cp->wu);
    loco_attention_gqa_fwd(cp->hout, att, qkv, B, cp->T, d->NHl / cp->c, cp->hk / d->hs, d->hs);
    pick_rows(cp, cp->send, cp->hout, B, cp->hq);
    LOCO_CHECK(alltoall(cp, rows * (size_t)cp->hq));
    unpack_heads(cp, d, out, cp->recv, B, d->Cl, 1, false);
    return 0;
}

static int ulysses_bwd(loco_gpt *m, const loco__gpt_shape *d, float *dqkv, float *datt,
                       const float *dout, const float *qkv, const float *att, int B) {
    loco_gpt_cp *cp = m->cp;
    const size_t rows = (size_t)B * cp->Tl;
    pack_heads(cp, d, cp->send, dout, B, d->Cl, 1);
    LOCO_CHECK(alltoall(cp, rows * (size_t)cp->hq));
    place_rows(cp, cp->hdout, cp->recv, B, cp->hq);
    memset(cp->hdqkv, 0, (size_t)cp->c * rows * (size_t)cp->wu * sizeof(float));
    loco_attention_gqa_bwd(cp->hdqkv, datt, cp->hdout, qkv, att, B, cp->T, d->NHl / cp->c,
                           cp->hk / d->hs, d->hs);
    pick_rows(cp, cp->send, cp->hdqkv, B, cp->wu);
    LOCO_CHECK(alltoall(cp, rows * (size_t)cp->wu));
    unpack_heads(cp, d, dqkv, cp->recv, B, d->Wl, 3, true);
    return 0;
}

/* ------------------------------------------------------------- dispatch */

int loco__gpt_attention_fwd(loco_gpt *m, const loco__gpt_shape *d, float *out, float *att,
                            float *qkv, int B, int T) {
    if (!m->cp && d->NKVl != d->NHl) { /* grouped-query attention */
        loco_attention_gqa_fwd(out, att, qkv, B, T, d->NHl, d->NKVl, d->hs);
        return 0;
    }
    if (!m->cp) {
        loco_attention_fwd(out, att, qkv, B, T, d->Cl, d->NHl);
        return 0;
    }
    return m->cp->algo == LOCO_CP_RING ? ring_fwd(m, d, out, att, qkv, B)
                                       : ulysses_fwd(m, d, out, att, qkv, B);
}

int loco__gpt_attention_rerun(loco_gpt *m, const loco__gpt_shape *d, float *scratch, float *att,
                              const float *qkv, int B, int T) {
    if (!m->cp && d->NKVl != d->NHl)
        loco_attention_gqa_fwd(scratch, att, qkv, B, T, d->NHl, d->NKVl, d->hs);
    else if (!m->cp)
        loco_attention_fwd(scratch, att, qkv, B, T, d->Cl, d->NHl);
    else if (m->cp->algo == LOCO_CP_ULYSSES) /* qkv is already head-sharded */
        loco_attention_gqa_fwd(m->cp->hout, att, qkv, B, m->cp->T, d->NHl / m->cp->c,
                               m->cp->hk / d->hs, d->hs);
    /* ring keeps each row's log-sum-exp: nothing to recompute */
    return 0;
}

int loco__gpt_attention_bwd(loco_gpt *m, const loco__gpt_shape *d, float *dqkv, float *datt,
                            const float *dout, const float *qkv, const float *out,
                            const float *att, int B, int T) {
    if (!m->cp && d->NKVl != d->NHl) {
        loco_attention_gqa_bwd(dqkv, datt, dout, qkv, att, B, T, d->NHl, d->NKVl, d->hs);
        return 0;
    }
    if (!m->cp) {
        loco_attention_bwd(dqkv, datt, dout, qkv, att, B, T, d->Cl, d->NHl);
        return 0;
    }
    return m->cp->algo == LOCO_CP_RING ? ring_bwd(m, d, dqkv, dout, qkv, out, att, B)
                                       : ulysses_bwd(m, d, dqkv, datt, dout, qkv, att, B);
}

double loco_gpt_cp_bytes(const loco_gpt *m) {
    return m->cp ? m->cp->bytes : 0;
}
