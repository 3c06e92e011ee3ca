/* The copies of a parameter that several ranks of an island hold (tensors
 * replicated over tp, key/value heads shared by tp ranks, dense tensors on
 * every ep rank): training keeps them alike, and after an update that is
 * not the same on every rank (the outer step) loco_zero_sync_replicas makes
 * them so again from one source rank. */
#include "inner/parallel/zero_internal.h"

#include <string.h>

enum { REP_COUNT, REP_PACK, REP_UNPACK };
enum { PIECES_TP_REPLICATED, PIECES_EP_DENSE };

/* Walks the pieces of the owned range that several ranks hold alike
 * (which: tensors replicated over tp, or the dense tensors every ep rank
 * holds): counts them, packs them from the owned parameters into buf, or
 * unpacks buf back. Returns the elements walked. */
static size_t replicated_pieces_of(const loco_zero *z, int which, float *data, float *buf,
                                   int what) {
    const loco_gpt *m = z->m;
    size_t at = 0;
    for (int i = 0; i < loco_gpt_table(m)->n; i++) {
        const loco_tensor *t = &loco_gpt_table(m)->t[i];
        size_t a = t->offset > z->lo ? t->offset : z->lo;
        size_t b = t->offset + t->numel < z->hi ? t->offset + t->numel : z->hi;
        const bool alike = which == PIECES_TP_REPLICATED ? loco_gpt_tensor_replicated(m, i)
                                                         : !z->expert[i];
        if (a >= b || !alike)
            continue;
        if (what == REP_PACK)
            memcpy(buf + at, data + (a - z->lo), (b - a) * sizeof(float));
        else if (what == REP_UNPACK)
            memcpy(data + (a - z->lo), buf + at, (b - a) * sizeof(float));
        at += b - a;
    }
    return at;
}

static size_t replicated_pieces(const loco_zero *z, float *data, float *buf, int what) {
    return replicated_pieces_of(z, PIECES_TP_REPLICATED, data, buf, what);
}

/* The shared key/value runs of the owned range (see struct loco_zero):
 * each local tensor with fused parts is walked one row along its split
 * dimension (the pattern repeats for every index before it); counted when
 * runs is NULL. */
static int shared_runs(loco_zero *z, struct shared_run *runs, int *n_runs, size_t *n_elems) {
    const loco_gpt *m = z->m;
    const int t = loco_gpt_cfg(m)->tp, k = loco_gpt_tp_rank(m);
    *n_runs = 0, *n_elems = 0;
    loco_gpt_config one = *loco_gpt_cfg(m);
    one.tp = 1, one.ep = 1, one.ep_rank = 0;
    loco_ttable whole;
    LOCO_CHECK(loco_gpt_build_table(&whole, &one));
    for (int i = 0; i < loco_gpt_table(m)->n; i++) {
        const loco_tensor *lt = &loco_gpt_table(m)->t[i];
        const int w = loco_ttable_find(&whole, lt->name);
        if (lt->split_dim < 0 || w < 0 || !whole.t[w].part_len[0])
            continue;
        size_t outer = 1;
        for (int d = 0; d < lt->split_dim; d++)
            outer *= (size_t)lt->shape[d];
        const size_t row = lt->numel / outer;
        for (size_t j = 0; j < row;) {
            size_t g;
            const int rep = loco_gpt_tp_global(&whole.t[w], t, k, j, &g)
                                ? (int)loco_gpt_tp_replicas(&whole.t[w], t, g)
                                : 1;
            size_t e = j + 1;
            while (e < row && loco_gpt_tp_global(&whole.t[w], t, k, e, &g) &&
                   (int)loco_gpt_tp_replicas(&whole.t[w], t, g) == rep)
                e++;
            for (size_t o = 0; rep > 1 && o < outer; o++) {
                const size_t a0 = lt->offset + o * row + j, b0 = lt->offset + o * row + e;
                const size_t a = a0 > z->lo ? a0 : z->lo, b = b0 < z->hi ? b0 : z->hi;
                if (a >= b)
                    continue;
                if (runs)
                    runs[*n_runs] = (struct shared_run){.at = a, .len = b - a, .rep = rep};
                ++*n_runs;
                *n_elems += b - a;
            }
            j = e;
        }
    }
    loco_ttable_fini(&whole);
    return 0;
}

int loco__zero_plan_replicas(loco_zero *z) {
    const loco_gpt *m = z->m;
    if (loco_gpt_parallel_of(m)->tp) {
        z->n_rep = replicated_pieces(z, NULL, NULL, REP_COUNT);
        z->rep_buf = loco_alloc((z->n_rep ? z->n_rep : 1) * sizeof(float));
        if (!z->rep_buf)
            return LOCO_ERR(LOCO_ENOMEM, "replicated parameters of %zu elements", z->n_rep);
        LOCO_CHECK(shared_runs(z, NULL, &z->n_runs, &z->n_shared));
        if (z->n_runs > 0) {
            const size_t t = (size_t)loco_gpt_cfg(m)->tp;
            z->shared = loco_alloc((size_t)z->n_runs * sizeof *z->shared);
            z->shared_buf = loco_alloc(t * z->n_shared * sizeof(float));
            if (!z->shared || !z->shared_buf)
                return LOCO_ERR(LOCO_ENOMEM, "shared key/value heads of %zu elements",
                                z->n_shared);
            LOCO_CHECK(shared_runs(z, z->shared, &z->n_runs, &z->n_shared));
        }
    }
    return 0;
}

/* Training keeps the copies equal (their gradients are reduced alike); an
 * update that is not the same on every rank (the outer step's lossy codec
 * cuts each rank's range into its own quantisation blocks) would not: the
 * group's first rank's values become everyone's. */
int loco_zero_sync_replicas(loco_zero *z) {
    float *data = loco_zero_owned_params(z);
    loco_comm *tp = loco_gpt_parallel_of(z->m)->tp;
    /* The owned range is the same on every tp rank (same slice table, same
     * dp split), so the packed pieces line up. */
    if (tp && z->n_rep > 0) {
        replicated_pieces(z, data, z->rep_buf, REP_PACK);
        LOCO_CHECK(loco_comm_broadcast(tp, z->rep_buf, z->n_rep, LOCO_DT_F32, 0));
        replicated_pieces(z, data, z->rep_buf, REP_UNPACK);
    }
    if (tp && z->n_shared > 0) {
        const int k = loco_gpt_tp_rank(z->m), t = loco_comm_size(tp);
        float *mine = z->shared_buf + (size_t)k * z->n_shared;
        size_t at = 0;
        for (int r = 0; r < z->n_runs; r++) {
            memcpy(mine + at, data + (z->shared[r].at - z->lo), z->shared[r].len * sizeof(float));
            at += z->shared[r].len;
        }
        size_t *counts = loco_alloc((size_t)t * sizeof *counts);
        if (!counts)
            return LOCO_ERR(LOCO_ENOMEM, "counts");
        for (int r = 0; r < t; r++)
            counts[r] = z->n_shared;
        const int rc = loco_comm_allgather(tp, mine, z->shared_buf, counts, LOCO_DT_F32);
        loco_free(counts);
        LOCO_CHECK(rc);
        at = 0;
        for (int r = 0; r < z->n_runs; r++) {
            const int src = k - k % z->shared[r].rep;
            if (src != k)
                memcpy(data + (z->shared[r].at - z->lo),
                       z->shared_buf + (size_t)src * z->n_shared + at,
                       z->shared[r].len * sizeof(float));
            at += z->shared[r].len;
        }
    }
    if (z->ep && z->n_dense > 0) {
        replicated_pieces_of(z, PIECES_EP_DENSE, data, z->dense_buf, REP_PACK);
        LOCO_CHECK(loco_comm_broadcast(z->ep, z->dense_buf, z->n_dense, LOCO_DT_F32, 0));
        replicated_pieces_of(z, PIECES_EP_DENSE, data, z->dense_buf, REP_UNPACK);
    }
    return 0;
}

int loco__zero_plan_dense(loco_zero *z) {
    z->n_dense = replicated_pieces_of(z, PIECES_EP_DENSE, NULL, NULL, REP_COUNT);
    z->dense_buf = loco_alloc((z->n_dense ? z->n_dense : 1) * sizeof(float));
    if (!z->dense_buf)
        return LOCO_ERR(LOCO_ENOMEM, "dense parameters of %zu elements", z->n_dense);
    return 0;
}
