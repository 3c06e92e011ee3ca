/* Pipeline schedules as data: the generators (an ops table by name) and
 * the transfers their compute implies (the simulator that checks and times
 * a schedule is inner/parallel/simulate.c). docs/PIPELINE.md gives each order, the
 * published formulas and their sources. */
#include "inner/parallel/schedule_internal.h"

#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

void loco_pp_schedule_destroy(loco_pp_schedule *s) {
    if (!s)
        return;
    loco_free(s->chunk_rank);
    loco_free(s->len);
    loco_free(s->lists);
    loco_free(s->slab);
    loco_free(s);
}

/* An empty schedule with room for cap actions per rank. */
static int schedule_alloc(loco_pp_schedule **out, const char *name, int p, int v, int m, int cap) {
    loco_pp_schedule *s = loco_alloc(sizeof *s);
    if (!s)
        return LOCO_ERR(LOCO_ENOMEM, "pipeline schedule");
    snprintf(s->name, sizeof s->name, "%s", name ? name : "custom");
    s->p = p, s->v = v, s->m = m, s->n_chunks = p * v;
    s->chunk_rank = loco_alloc(sizeof(int) * (size_t)s->n_chunks);
    s->len = loco_alloc(sizeof(int) * (size_t)p);
    s->lists = loco_alloc(sizeof(loco_pp_action *) * (size_t)p);
    s->slab = loco_alloc(sizeof(loco_pp_action) * (size_t)p * (size_t)loco__pp_imax(cap, 1));
    if (!s->chunk_rank || !s->len || !s->lists || !s->slab) {
        loco_pp_schedule_destroy(s);
        return LOCO_ERR(LOCO_ENOMEM, "pipeline schedule of %d ranks x %d actions", p, cap);
    }
    for (int r = 0; r < p; r++)
        s->lists[r] = s->slab + (size_t)r * (size_t)loco__pp_imax(cap, 1);
    *out = s;
    return 0;
}

/* ------------------------------------------------------------ generators */

/* A generator writes one rank's compute actions in order. */
typedef struct {
    int p, v, m, rank;
    loco_pp_action *out; /* [3 v m] */
    int n;
    int *wq; /* deferred W passes, FIFO of mb * (p v) + chunk: [v m] */
    int wq_head, wq_tail;
} gen;

/* Appends a compute action; micro-batches past m are dropped (zbv pads
 * its pattern to 2p-1 micro-batches and drops the padding). */
static void emit(gen *g, loco_pp_op op, int mb, int chunk, unsigned flags) {
    if (mb < 0 || mb >= g->m)
        return;
    g->out[g->n++] = (loco_pp_action){
        .op = (uint8_t)op, .flags = (uint8_t)flags, .peer = -1, .mb = mb, .chunk = chunk};
}

/* B now, its W queued for emit_w_oldest. */
static void emit_b_deferred(gen *g, int mb, int chunk) {
    if (mb < 0 || mb >= g->m)
        return;
    emit(g, LOCO_PP_B, mb, chunk, 0);
    g->wq[g->wq_tail++] = mb * g->p * g->v + chunk;
}

/* The oldest queued W, if any. */
static void emit_w_oldest(gen *g) {
    if (g->wq_head == g->wq_tail)
        return;
    const int u = g->wq[g->wq_head++], pv = g->p * g->v;
    emit(g, LOCO_PP_W, u / pv, u % pv, 0);
}

/* GPipe (Huang et al. 2019): every forward, then every backward. */
static void order_gpipe(gen *g) {
    for (int k = 0; k < g->m; k++)
        emit(g, LOCO_PP_F, k, g->rank, 0);
    for (int k = 0; k < g->m; k++)
        emit(g, LOCO_PP_BW, k, g->rank, 0);
}

/* 1F1B (PipeDream-Flush, Narayanan et al. 2021): p-r-1 warm-up forwards,
 * then one forward and one backward in turn, then the remaining backwards. */
static void order_1f1b(gen *g) {
    const int m = g->m, warm = loco__pp_imin(g->p - g->rank - 1, m);
    for (int k = 0; k < warm; k++)
        emit(g, LOCO_PP_F, k, g->rank, 0);
    for (int i = 0; i < m - warm; i++) {
        emit(g, LOCO_PP_F, warm + i, g->rank, 0);
        emit(g, LOCO_PP_BW, i, g->rank, 0);
    }
    for (int i = m - warm; i < m; i++)
        emit(g, LOCO_PP_BW, i, g->rank, 0);
}

/* Megatron-LM's interleaved order: virtual micro-batch k is micro-batch
 * (k / pv) p + k mod p on local chunk j = (k mod pv) / p going forward and
 * v-1-j going backward, so groups of p micro-batches sweep the chunks. */
static void interleaved_unit(const gen *g, int k, bool forward, int *mb, int *chunk) {
    const int pv = g->p * g->v, j = (k % pv) / g->p;
    *mb = k / pv * g->p + k % g->p;
    *chunk = (forward ? j : g->v - 1 - j) * g->p + g->rank;
}

/* Interleaved 1F1B (Narayanan et al. 2021): 2(p-r-1) + (v-1)p warm-up
 * forwards, then 1F1B over virtual micro-batches. */
static void order_interleaved(gen *g) {
    const int total = g->m * g->v;
    const int warm = loco__pp_imin(2 * (g->p - g->rank - 1) + (g->v - 1) * g->p, total);
    int mb, chunk;
    for (int k = 0; k < warm; k++) {
        interleaved_unit(g, k, true, &mb, &chunk);
        emit(g, LOCO_PP_F, mb, chunk, 0);
    }
    for (int i = 0; i < total - warm; i++) {
        interleaved_unit(g, warm + i, true, &mb, &chunk);
        emit(g, LOCO_PP_F, mb, chunk, 0);
        interleaved_unit(g, i, false, &mb, &chunk);
        emit(g, LOCO_PP_BW, mb, chunk, 0);
    }
    for (int i = total - warm; i < total; i++) {
        interleaved_unit(g, i, false, &mb, &chunk);
        emit(g, LOCO_PP_BW, mb, chunk, 0);
    }
}

/* ZB-H1 (Qi et al. 2023): 1F1B with the backward split; rank r holds back
 * its first r W passes, so every rank keeps p micro-batches in flight
 * (1F1B's peak, on rank 0), B reaches the early ranks sooner, and the
 * held-back W passes fill the tail. */
static void order_zbh1(gen *g) {
    const int r = g->rank, m = g->m, warm = loco__pp_imin(g->p - r - 1, m);
    for (int k = 0; k < warm; k++)
        emit(g, LOCO_PP_F, k, r, 0);
    for (int i = 0; i < m - warm; i++) {
        emit(g, LOCO_PP_F, warm + i, r, 0);
        emit_b_deferred(g, i, r);
        if (i >= r)
            emit_w_oldest(g);
    }
    for (int i = m - warm; i < m; i++) {
        emit_b_deferred(g, i, r);
        emit_w_oldest(g);
    }
    while (g->wq_head < g->wq_tail)
        emit_w_oldest(g);
}

/* ZB-V (Qi et al. 2023, section 6), in the order of PyTorch's
 * ScheduleZBVZeroBubble: chunk r (down the V) and 2p-1-r (back up);
 * warm-up forwards, then F B W on both chunks in turn. The pattern is
 * written for n = max(2p-1, m) micro-batches; emit drops the padding. */
static void order_zbv(gen *g) {
    const int p = g->p, r = g->rank, c0 = r, c1 = 2 * p - 1 - r, n = loco__pp_imax(2 * p - 1, g->m);
    int f0 = 0, f1 = 0, b0 = 0, b1 = 0;
    for (int i = 0; i < 2 * (p - r) - 1; i++)
        emit(g, LOCO_PP_F, f0++, c0, 0);
    for (int i = 0; i < r; i++) {
        emit(g, LOCO_PP_F, f1++, c1, 0);
        emit(g, LOCO_PP_F, f0++, c0, 0);
    }
    for (int i = 0; i < p - r; i++) {
        emit(g, LOCO_PP_F, f1++, c1, 0);
        emit(g, LOCO_PP_B, b1, c1, 0);
        emit(g, LOCO_PP_W, b1++, c1, 0);
    }
    while (f1 < f0 || f0 < n) {
        if (f0 < n)
            emit(g, LOCO_PP_F, f0++, c0, 0);
        emit(g, LOCO_PP_B, b0, c0, 0);
        emit(g, LOCO_PP_W, b0++, c0, 0);
        emit(g, LOCO_PP_F, f1++, c1, 0);
        emit(g, LOCO_PP_B, b1, c1, 0);
        emit(g, LOCO_PP_W, b1++, c1, 0);
    }
    int w0 = b0, w1 = b1;
    for (int i = 0; i < r; i++) {
        emit(g, LOCO_PP_B, b0++, c0, 0);
        emit(g, LOCO_PP_B, b1++, c1, 0);
    }
    for (int i = 0; i < p - r; i++) {
        emit(g, LOCO_PP_B, b0++, c0, 0);
        emit(g, LOCO_PP_W, w0++, c0, 0);
    }
    while (w1 < b1)
        emit(g, LOCO_PP_W, w1++, c1, 0);
    while (w0 < b0)
        emit(g, LOCO_PP_W, w0++, c0, 0);
}

/* DualPipeV's two phases on one rank: phase 0 is chunk r, phase 1 chunk
 * 2p-1-r, each with its next forward and backward micro-batch. */
typedef struct {
    gen *g;
    int chunk[2], f[2], b[2];
} dpv;

static void dpv_f(dpv *d, int ph, unsigned flags) {
    emit(d->g, LOCO_PP_F, d->f[ph]++, d->chunk[ph], flags);
}
static void dpv_bw(dpv *d, int ph) {
    emit(d->g, LOCO_PP_BW, d->b[ph]++, d->chunk[ph], 0);
}
static void dpv_b(dpv *d, int ph) {
    emit_b_deferred(d->g, d->b[ph]++, d->chunk[ph]);
}

/* The cool-down of DualPipeV: backwards of both phases, split into B and
 * a deferred W from the middle on (the half depends on r's parity), then
 * the last phase-0 B passes with a W before each, then the rest of W. */
static void dpv_cooldown(dpv *d, int p, int r) {
    bool split = false;
    for (int i = 0; i <= r; i++) {
        if (i == (r + 1) / 2 && r % 2 == 1)
            split = true;
        split ? dpv_b(d, 1) : dpv_bw(d, 1);
        if (i == (r + 1) / 2 && r % 2 == 0)
            split = true;
        split ? dpv_b(d, 0) : dpv_bw(d, 0);
    }
    for (int i = 0; i < p - r - 1; i++) {
        emit_w_oldest(d->g);
        dpv_b(d, 0);
    }
    while (d->g->wq_head < d->g->wq_tail)
        emit_w_oldest(d->g);
}

/* DualPipeV (deepseek-ai/DualPipe, dualpipev.py): DualPipe folded onto p
 * ranks by the V placement. Its eight steps: phase-0 forwards; forwards of
 * both phases; B W F on phase 1; the main loop of overlapped pairs
 * F0&B1, F1&B0 (adjacent here, LOCO_PP_PAIRED); B1 with F1&B0; the
 * cool-down. m >= 2p. */
static void order_dualpipev(gen *g) {
    const int p = g->p, r = g->rank, m = g->m;
    dpv d = {.g = g, .chunk = {r, 2 * p - 1 - r}};
    for (int i = 0; i < 2 * (p - r - 1); i++)
        dpv_f(&d, 0, 0);
    for (int i = 0; i < r + 1; i++) {
        dpv_f(&d, 0, 0);
        dpv_f(&d, 1, 0);
    }
    for (int i = 0; i < p - r - 1; i++) {
        dpv_b(&d, 1);
        emit_w_oldest(g);
        dpv_f(&d, 1, 0);
    }
    for (int i = 0; i < m - 2 * p + r + 1; i++) {
        /* the last rank's first pair runs unpaired (DualPipe's note: a
         * smaller bubble) */
        dpv_f(&d, 0, i == 0 && r == p - 1 ? 0 : LOCO_PP_PAIRED);
        dpv_bw(&d, 1);
        dpv_f(&d, 1, LOCO_PP_PAIRED);
        dpv_bw(&d, 0);
    }
    for (int i = 0; i < p - r - 1; i++) {
        dpv_bw(&d, 1);
        dpv_f(&d, 1, LOCO_PP_PAIRED);
        dpv_bw(&d, 0);
    }
    dpv_cooldown(&d, p, r);
}

/* Shape rules. p >= 2 and the size limits are checked before these. */
static int need_single_chunk(const char *name, int p, int v, int m) {
    if (v != 1)
        return LOCO_ERR(LOCO_EINVAL,
                        "pipeline schedule %s runs one chunk per rank (v = 1), got v = %d "
                        "(interleaved takes v >= 2; zbv and dualpipev v = 2)",
                        name, v);
    return 0;
}

static int need_interleaved(const char *name, int p, int v, int m) {
    if (v < 2)
        return LOCO_ERR(LOCO_EINVAL,
                        "pipeline schedule %s needs v >= 2 virtual stages per rank "
                        "(parallel.virtual_stages), got v = %d",
                        name, v);
    if (m % p)
        return LOCO_ERR(LOCO_EINVAL,
                        "pipeline schedule %s needs m >= p and a multiple of p "
                        "(micro-batches sweep the chunks in groups of p): m = %d, p = %d",
                        name, m, p);
    return 0;
}

static int need_v2(const char *name, int p, int v, int m) {
    if (v != 2)
        return LOCO_ERR(LOCO_EINVAL,
                        "pipeline schedule %s fixes v = 2 chunks per rank (the V: rank r holds "
                        "chunks r and 2p-1-r), got v = %d",
                        name, v);
    return 0;
}

static int need_dualpipev(const char *name, int p, int v, int m) {
    LOCO_CHECK(need_v2(name, p, v, m));
    if (m < 2 * p)
        return LOCO_ERR(LOCO_EINVAL,
                        "pipeline schedule %s needs m >= 2p = %d micro-batches (its main loop "
                        "runs m-2p+r+1 times on rank r), got m = %d",
                        name, 2 * p, m);
    return 0;
}

/* Published figures (docs/PIPELINE.md): bubble as a fraction of the step,
 * peak in (mb, chunk) activations on the busiest rank. Costs are per
 * chunk; a step of a rank computes v m (f + b + w). */
static double fraction(double bubble_time, double work) {
    return bubble_time + work > 0 ? bubble_time / (bubble_time + work) : 0;
}

static void pub_gpipe(int p, int v, int m, const loco_pp_costs *c, double *bubble, double *peak) {
    *bubble = (double)(p - 1) / (m + p - 1);
    *peak = m;
}

static void pub_1f1b(int p, int v, int m, const loco_pp_costs *c, double *bubble, double *peak) {
    *bubble = (double)(p - 1) / (m + p - 1);
    *peak = loco__pp_imin(p, m);
}

static void pub_interleaved(int p, int v, int m, const loco_pp_costs *c, double *bubble,
                            double *peak) {
    *bubble = (double)(p - 1) / ((double)v * m + p - 1);
    *peak = loco__pp_imin(v * m, 2 * (p - 1) + (v - 1) * p + 1);
}

static void pub_zbh1(int p, int v, int m, const loco_pp_costs *c, double *bubble, double *peak) {
    *bubble = fraction(fmax(0, (p - 1) * (c->f + c->b - c->w)), m * (c->f + c->b + c->w));
    *peak = loco__pp_imin(p, m);
}

static void pub_zbv(int p, int v, int m, const loco_pp_costs *c, double *bubble, double *peak) {
    *bubble = c->f == c->b && c->b == c->w ? 0 : NAN;
    *peak = loco__pp_imin(2 * p, 2 * m);
}

/* (PP/2-1)(F&B + B - 3W) with PP = 2p stages, B the full backward b + w
 * and F&B = f + b + w on one stream. */
static void pub_dualpipev(int p, int v, int m, const loco_pp_costs *c, double *bubble,
                          double *peak) {
    const double full = c->b + c->w;
    *bubble = fraction(fmax(0, (p - 1) * (c->f + full + full - 3 * c->w)),
                       2.0 * m * (c->f + c->b + c->w));
    *peak = 2 * p + 1;
}

/* One entry per schedule (STYLE rule 6). */
typedef struct {
    const char *name;
    bool v_shape; /* placement: V (rank r: chunks r, 2p-1-r) or looped (c mod p) */
    int v_auto;   /* chunks per rank when v = 0 (parallel.virtual_stages' default) */
    int (*check)(const char *name, int p, int v, int m);
    void (*order)(gen *g);
    void (*published)(int p, int v, int m, const loco_pp_costs *c, double *bubble, double *peak);
} pp_generator;

static const pp_generator generators[] = {
    {"gpipe", false, 1, need_single_chunk, order_gpipe, pub_gpipe},
    {"1f1b", false, 1, need_single_chunk, order_1f1b, pub_1f1b},
    {"interleaved", false, 2, need_interleaved, order_interleaved, pub_interleaved},
    {"zb-h1", false, 1, need_single_chunk, order_zbh1, pub_zbh1},
    {"zbv", true, 2, need_v2, order_zbv, pub_zbv},
    {"dualpipev", true, 2, need_dualpipev, order_dualpipev, pub_dualpipev},
};
#define N_GENERATORS (int)(sizeof generators / sizeof generators[0])

const char *loco_pp_generator_name(int i) {
    return i >= 0 && i < N_GENERATORS ? generators[i].name : NULL;
}

/* The generator called name, or NULL with the error recorded. */
static const pp_generator *find_generator(const char *name) {
    char valid[128] = "";
    for (int i = 0; i < N_GENERATORS; i++) {
        if (name && !strcmp(name, generators[i].name))
            return &generators[i];
        snprintf(valid + strlen(valid), sizeof valid - strlen(valid), "%s%s", i ? ", " : "",
                 generators[i].name);
    }
    LOCO_ERR(LOCO_EINVAL, "unknown pipeline schedule '%s' (valid: %s)", name ? name : "(null)",
             valid);
    return NULL;
}

/* Limits every schedule shares, then the generator's own rules. */
static int check_shape(const pp_generator *gd, int p, int v, int m) {
    if (p < 2)
        return LOCO_ERR(LOCO_EINVAL, "pipeline schedule %s needs p >= 2 ranks, got p = %d",
                        gd->name, p);
    if (v < 1 || m < 1)
        return LOCO_ERR(LOCO_EINVAL, "pipeline schedule %s: v = %d and m = %d must be >= 1",
                        gd->name, v, m);
    if (p > PP_MAX_RANKS || v > PP_MAX_VIRTUAL || m > PP_MAX_MICRO ||
        (long long)p * v * m > PP_MAX_UNITS)
        return LOCO_ERR(LOCO_EINVAL,
                        "pipeline schedule %s: p = %d, v = %d, m = %d is beyond the limits "
                        "(p <= %d, v <= %d, m <= %d, p v m <= %d)",
                        gd->name, p, v, m, PP_MAX_RANKS, PP_MAX_VIRTUAL, PP_MAX_MICRO,
                        PP_MAX_UNITS);
    return gd->check(gd->name, p, v, m);
}

int loco_pp_published(const char *name, int p, int v, int m, const loco_pp_costs *c, double *bubble,
                      double *peak) {
    const pp_generator *gd = find_generator(name);
    if (!gd)
        return LOCO_EINVAL;
    LOCO_CHECK(check_shape(gd, p, v, m));
    gd->published(p, v, m, c, bubble, peak);
    return 0;
}

/* ------------------------------------------------------------- transfers */

/* The transfer compute action a on rank r waits for, when its input comes
 * from another rank: the RECV to post. */
static bool needs_transfer(const loco_pp_schedule *s, int r, const loco_pp_action *a,
                           loco_pp_action *recv) {
    int from;
    loco_pp_msg msg;
    if (a->op == LOCO_PP_F && a->chunk > 0)
        from = a->chunk - 1, msg = LOCO_PP_ACT;
    else if ((a->op == LOCO_PP_B || a->op == LOCO_PP_BW) && a->chunk < s->n_chunks - 1)
        from = a->chunk + 1, msg = LOCO_PP_GRAD;
    else
        return false;
    const int q = s->chunk_rank[from];
    if (q == r)
        return false;
    *recv = (loco_pp_action){
        .op = LOCO_PP_RECV, .msg = (uint8_t)msg, .peer = q, .mb = a->mb, .chunk = from};
    return true;
}

/* The transfer compute action a on rank r produces for another rank. */
static bool makes_transfer(const loco_pp_schedule *s, int r, const loco_pp_action *a,
                           loco_pp_action *send) {
    int to;
    loco_pp_msg msg;
    if (a->op == LOCO_PP_F && a->chunk < s->n_chunks - 1)
        to = a->chunk + 1, msg = LOCO_PP_ACT;
    else if ((a->op == LOCO_PP_B || a->op == LOCO_PP_BW) && a->chunk > 0)
        to = a->chunk - 1, msg = LOCO_PP_GRAD;
    else
        return false;
    const int q = s->chunk_rank[to];
    if (q == r)
        return false;
    *send = (loco_pp_action){
        .op = LOCO_PP_SEND, .msg = (uint8_t)msg, .peer = q, .mb = a->mb, .chunk = a->chunk};
    return true;
}

/* Rank r's list: its compute order with each SEND right after the compute
 * that produced it and each RECV one compute ahead of its consumer. */
static void add_transfers(loco_pp_schedule *s, int r, const loco_pp_action *comp, int n) {
    loco_pp_action *out = s->lists[r], t;
    int k = 0;
    if (n > 0 && needs_transfer(s, r, &comp[0], &t))
        out[k++] = t;
    for (int i = 0; i < n; i++) {
        if (i + 1 < n && needs_transfer(s, r, &comp[i + 1], &t))
            out[k++] = t;
        out[k++] = comp[i];
        if (makes_transfer(s, r, &comp[i], &t))
            out[k++] = t;
    }
    s->len[r] = k;
}

int loco_pp_schedule_create(loco_pp_schedule **out, const char *name, int p, int v, int m) {
    const pp_generator *gd = find_generator(name);
    if (!gd)
        return LOCO_EINVAL;
    if (v == 0)
        v = gd->v_auto;
    LOCO_CHECK(check_shape(gd, p, v, m));
    loco_pp_schedule *s;
    LOCO_CHECK(schedule_alloc(&s, gd->name, p, v, m, PP_ACTIONS_PER_UNIT * v * m));
    for (int c = 0; c < s->n_chunks; c++)
        s->chunk_rank[c] = gd->v_shape ? (c < p ? c : 2 * p - 1 - c) : c % p;
    gen g = {.p = p, .v = v, .m = m};
    g.out = loco_alloc(sizeof(loco_pp_action) * 3 * (size_t)v * (size_t)m);
    g.wq = loco_alloc(sizeof(int) * (size_t)v * (size_t)m);
    if (!g.out || !g.wq) {
        loco_free(g.out);
        loco_free(g.wq);
        loco_pp_schedule_destroy(s);
        return LOCO_ERR(LOCO_ENOMEM, "pipeline schedule %s: generator buffers", gd->name);
    }
    for (int r = 0; r < p; r++) {
        g.rank = r, g.n = 0, g.wq_head = g.wq_tail = 0;
        gd->order(&g);
        add_transfers(s, r, g.out, g.n);
    }
    loco_free(g.out);
    loco_free(g.wq);
    *out = s;
    return 0;
}

int loco_pp_schedule_from_config(loco_pp_schedule **out, const loco_config *cfg) {
    const int64_t m =
        cfg->parallel.microbatches ? cfg->parallel.microbatches : cfg->train.grad_accum;
    const int64_t p = cfg->parallel.pp, v = cfg->parallel.virtual_stages;
    if (p > PP_MAX_RANKS || v > PP_MAX_VIRTUAL || m > PP_MAX_MICRO)
        return LOCO_ERR(LOCO_EINVAL,
                        "parallel.pp = %lld, virtual_stages = %lld, microbatches = %lld: beyond "
                        "what a schedule takes (%d, %d, %d)",
                        (long long)p, (long long)v, (long long)m, PP_MAX_RANKS, PP_MAX_VIRTUAL,
                        PP_MAX_MICRO);
    return loco_pp_schedule_create(out, cfg->parallel.pp_schedule, (int)p, (int)v, (int)m);
}

int loco_pp_schedule_from_lists(loco_pp_schedule **out, const char *name, int p, int v, int m,
                                const int *chunk_rank, const loco_pp_action *const *lists,
                                const int *lens) {
    if (p < 1 || v < 1 || m < 1 || p > PP_MAX_RANKS || v > PP_MAX_VIRTUAL || m > PP_MAX_MICRO ||
        (long long)p * v * m > PP_MAX_UNITS)
        return LOCO_ERR(LOCO_EINVAL, "pipeline lists: p = %d, v = %d, m = %d out of range", p, v,
                        m);
    int cap = 0;
    for (int r = 0; r < p; r++) {
        if (lens[r] < 0 || lens[r] > PP_ACTIONS_PER_UNIT * v * m)
            return LOCO_ERR(LOCO_EINVAL, "pipeline lists: rank %d has %d actions", r, lens[r]);
        cap = loco__pp_imax(cap, lens[r]);
    }
    for (int c = 0; c < p * v; c++)
        if (chunk_rank[c] < 0 || chunk_rank[c] >= p)
            return LOCO_ERR(LOCO_EINVAL, "pipeline lists: chunk %d placed on rank %d of %d", c,
                            chunk_rank[c], p);
    loco_pp_schedule *s;
    LOCO_CHECK(schedule_alloc(&s, name, p, v, m, cap));
    memcpy(s->chunk_rank, chunk_rank, sizeof(int) * (size_t)(p * v));
    for (int r = 0; r < p; r++) {
        if (lens[r])
            memcpy(s->lists[r], lists[r], sizeof(loco_pp_action) * (size_t)lens[r]);
        s->len[r] = lens[r];
    }
    *out = s;
    return 0;
}

const char *loco_pp_schedule_name(const loco_pp_schedule *s) {
    return s->name;
}

void loco_pp_schedule_shape(const loco_pp_schedule *s, int *p, int *v, int *m) {
    *p = s->p, *v = s->v, *m = s->m;
}

int loco_pp_chunk_rank(const loco_pp_schedule *s, int chunk) {
    return s->chunk_rank[chunk];
}

const loco_pp_action *loco_pp_rank_actions(const loco_pp_schedule *s, int rank, int *n) {
    *n = s->len[rank];
    return s->lists[rank];
}

char *loco_pp_action_str(const loco_pp_action *a, char *buf, size_t cap) {
    static const char *const compute[] = {"F", "B", "W", "BW"};
    const char kind = a->msg == LOCO_PP_ACT ? 'a' : 'g';
    if (a->op <= LOCO_PP_BW)
        snprintf(buf, cap, "%s%d.%d%s", compute[a->op], a->mb, a->chunk,
                 a->flags & LOCO_PP_PAIRED ? "+" : "");
    else if (a->op == LOCO_PP_SEND)
        snprintf(buf, cap, "S%c%d.%d>%d", kind, a->mb, a->chunk, a->peer);
    else if (a->op == LOCO_PP_RECV)
        snprintf(buf, cap, "R%c%d.%d<%d", kind, a->mb, a->chunk, a->peer);
    else
        snprintf(buf, cap, "?op%d", a->op);
    return buf;
}

bool loco_pp_parse_costs(const char *text, loco_pp_costs *c) {
    double x[3];
    char *end;
    for (int i = 0; i < 3; i++) {
        x[i] = strtod(text, &end);
        if (end == text || !isfinite(x[i]) || x[i] < 0 || *end != (i < 2 ? ',' : '\0'))
            return false;
        text = end + 1;
    }
    c->f = x[0], c->b = x[1], c->w = x[2];
    return true;
}
