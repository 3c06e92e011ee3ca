/* Pipeline schedules as data: the generators (an ops table by name), the
 * transfers their compute implies, and a discrete-event simulator that
 * checks a schedule and times it. docs/PIPELINE.md gives each order, the
 * published formulas and their sources. */
#include "inner/parallel/parallel.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* Sizes a schedule may have: beyond any real pipeline, small enough that
 * the lists stay a few hundred MB at worst. */
#define PP_MAX_RANKS 1024
#define PP_MAX_VIRTUAL 64
#define PP_MAX_MICRO 65536
#define PP_MAX_UNITS (1 << 22) /* p * v * m, each (mb, chunk) one unit */
/* Actions of one (mb, chunk) on its rank: F, B and W (or BW), and at most
 * two receives and two sends. */
#define PP_ACTIONS_PER_UNIT 7
/* Stuck ranks a deadlock message describes before "and N more". */
#define PP_DEADLOCK_NAMED 4

struct loco_pp_schedule {
    char name[32];
    int p, v, m, n_chunks;
    int *chunk_rank;        /* [n_chunks] */
    int *len;               /* [p] actions in each rank's list */
    loco_pp_action **lists; /* [p] rows of slab */
    loco_pp_action *slab;   /* [p * cap] */
};

static int imin(int a, int b) {
    return a < b ? a : b;
}
static int imax(int a, int b) {
    return a > b ? a : b;
}

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
    s->slab = loco_alloc(sizeof(loco_pp_action) * (size_t)p * (size_t)imax(cap, 1));
    if (!s->chunk_rank || !s->len || !s->lists || !s->slab) {
        loco_pp_schedule_destroy(s);
        return LOCO_ERR(LOCO_ENOMEM, "pipeline schedule of %d ranks x %d actions", p, cap);
    }
    for (int r = 0; r < p; r++)
        s->lists[r] = s->slab + (size_t)r * (size_t)imax(cap, 1);
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
    const int m = g->m, warm = imin(g->p - g->rank - 1, m);
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
    const int warm = imin(2 * (g->p - g->rank - 1) + (g->v - 1) * g->p, total);
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
    const int r = g->rank, m = g->m, warm = imin(g->p - r - 1, m);
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
    const int p = g->p, r = g->rank, c0 = r, c1 = 2 * p - 1 - r, n = imax(2 * p - 1, g->m);
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
    *peak = imin(p, m);
}

static void pub_interleaved(int p, int v, int m, const loco_pp_costs *c, double *bubble,
                            double *peak) {
    *bubble = (double)(p - 1) / ((double)v * m + p - 1);
    *peak = imin(v * m, 2 * (p - 1) + (v - 1) * p + 1);
}

static void pub_zbh1(int p, int v, int m, const loco_pp_costs *c, double *bubble, double *peak) {
    *bubble = fraction(fmax(0, (p - 1) * (c->f + c->b - c->w)), m * (c->f + c->b + c->w));
    *peak = imin(p, m);
}

static void pub_zbv(int p, int v, int m, const loco_pp_costs *c, double *bubble, double *peak) {
    *bubble = c->f == c->b && c->b == c->w ? 0 : NAN;
    *peak = imin(2 * p, 2 * m);
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
    int (*check)(const char *name, int p, int v, int m);
    void (*order)(gen *g);
    void (*published)(int p, int v, int m, const loco_pp_costs *c, double *bubble, double *peak);
} pp_generator;

static const pp_generator generators[] = {
    {"gpipe", false, need_single_chunk, order_gpipe, pub_gpipe},
    {"1f1b", false, need_single_chunk, order_1f1b, pub_1f1b},
    {"interleaved", false, need_interleaved, order_interleaved, pub_interleaved},
    {"zb-h1", false, need_single_chunk, order_zbh1, pub_zbh1},
    {"zbv", true, need_v2, order_zbv, pub_zbv},
    {"dualpipev", true, need_dualpipev, order_dualpipev, pub_dualpipev},
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
        cap = imax(cap, lens[r]);
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

/* ------------------------------------------------------------- simulator */

typedef struct {
    int rank, idx; /* rank -1: nowhere */
} pp_loc;

/* Per unit u = mb * n_chunks + chunk: where its actions are and when they
 * finished (-1: not yet). Messages are indexed by the unit that made them. */
typedef struct {
    const loco_pp_schedule *s;
    loco_pp_costs c;
    int units;
    pp_loc *at_f, *at_b, *at_w, *at_bw, *at_send[2], *at_recv[2];
    double *t_f, *t_b, *t_w; /* t_b: input gradient ready (B or BW) */
    double *t_sent[2], *t_posted[2];
    int *pc, *live, *peak;
    double *clock, *busy, *start; /* start: of the first compute, -1 before */
    char *slab;
} sim;

static void *carve(char *base, size_t *off, size_t bytes) {
    void *p = base ? base + *off : NULL;
    *off += (bytes + 63) & ~(size_t)63;
    return p;
}

/* Lays the simulator's arrays over base (NULL: only measures); the size. */
static size_t sim_layout(sim *S, char *base) {
    const size_t u = (size_t)S->units, p = (size_t)S->s->p, loc = u * sizeof(pp_loc),
                 t = u * sizeof(double);
    size_t off = 0;
    S->at_f = carve(base, &off, loc), S->at_b = carve(base, &off, loc);
    S->at_w = carve(base, &off, loc), S->at_bw = carve(base, &off, loc);
    S->t_f = carve(base, &off, t), S->t_b = carve(base, &off, t), S->t_w = carve(base, &off, t);
    for (int k = 0; k < 2; k++) {
        S->at_send[k] = carve(base, &off, loc), S->at_recv[k] = carve(base, &off, loc);
        S->t_sent[k] = carve(base, &off, t), S->t_posted[k] = carve(base, &off, t);
    }
    S->pc = carve(base, &off, p * sizeof(int)), S->live = carve(base, &off, p * sizeof(int));
    S->peak = carve(base, &off, p * sizeof(int));
    S->clock = carve(base, &off, p * sizeof(double));
    S->busy = carve(base, &off, p * sizeof(double));
    S->start = carve(base, &off, p * sizeof(double));
    return off;
}

static int sim_init(sim *S, const loco_pp_schedule *s, const loco_pp_costs *c) {
    *S = (sim){.s = s, .c = *c, .units = s->m * s->n_chunks};
    S->slab = loco_alloc(sim_layout(S, NULL));
    if (!S->slab)
        return LOCO_ERR(LOCO_ENOMEM, "pipeline simulator state");
    sim_layout(S, S->slab);
    pp_loc *locs[] = {S->at_f,       S->at_b,       S->at_w,       S->at_bw,
                      S->at_send[0], S->at_send[1], S->at_recv[0], S->at_recv[1]};
    double *times[] = {S->t_f,       S->t_b,         S->t_w,        S->t_sent[0],
                       S->t_sent[1], S->t_posted[0], S->t_posted[1]};
    for (int r = 0; r < s->p; r++)
        S->start[r] = -1;
    for (int u = 0; u < S->units; u++) {
        for (size_t k = 0; k < sizeof locs / sizeof locs[0]; k++)
            locs[k][u] = (pp_loc){-1, -1};
        for (size_t k = 0; k < sizeof times / sizeof times[0]; k++)
            times[k][u] = -1;
    }
    return 0;
}

static const char *msg_name(int msg) {
    return msg == LOCO_PP_ACT ? "activation" : "gradient";
}

/* Text of rank r's action i, for messages. */
static const char *act_str(const sim *S, int r, int i, char *buf, size_t cap) {
    return loco_pp_action_str(&S->s->lists[r][i], buf, cap);
}

/* Records where a unit's action is; a second one is an error. */
static int place(sim *S, pp_loc *at, int u, int r, int i, const char *what) {
    if (at[u].rank >= 0)
        return LOCO_ERR(LOCO_EINVAL,
                        "two %s of (mb %d, chunk %d): rank %d action %d and rank %d action %d",
                        what, u / S->s->n_chunks, u % S->s->n_chunks, at[u].rank, at[u].idx, r, i);
    at[u] = (pp_loc){r, i};
    return 0;
}

/* A SEND or RECV must join the two ranks holding the producer and the
 * consumer chunk, from the side it is listed on. */
static int check_route(const sim *S, int r, int i, const loco_pp_action *a) {
    char buf[48];
    const char *what = act_str(S, r, i, buf, sizeof buf);
    if (a->msg > LOCO_PP_GRAD)
        return LOCO_ERR(LOCO_EINVAL, "rank %d action %d: unknown message kind %d", r, i, a->msg);
    const int to = a->msg == LOCO_PP_ACT ? a->chunk + 1 : a->chunk - 1;
    if (to < 0 || to >= S->s->n_chunks)
        return LOCO_ERR(LOCO_EINVAL, "rank %d action %d (%s): chunk %d has no %s to pass on", r, i,
                        what, a->chunk, msg_name(a->msg));
    const int src = S->s->chunk_rank[a->chunk], dst = S->s->chunk_rank[to];
    if (src == dst)
        return LOCO_ERR(LOCO_EINVAL,
                        "rank %d action %d (%s): chunks %d and %d are both on rank %d and "
                        "exchange nothing",
                        r, i, what, a->chunk, to, src);
    const bool send = a->op == LOCO_PP_SEND;
    const int me = send ? src : dst, peer = send ? dst : src;
    if (r != me || a->peer != peer)
        return LOCO_ERR(LOCO_EINVAL,
                        "rank %d action %d (%s): the %s of chunk %d goes from rank %d to rank "
                        "%d, so it is %s's %s with peer %d",
                        r, i, what, msg_name(a->msg), a->chunk, src, dst,
                        send ? "the sender" : "the receiver", send ? "SEND" : "RECV", peer);
    return 0;
}

/* Indexes rank r's action i, checking what it names. */
static int index_action(sim *S, int r, int i) {
    const loco_pp_action *a = &S->s->lists[r][i];
    const int C = S->s->n_chunks;
    char buf[48];
    if (a->mb < 0 || a->mb >= S->s->m || a->chunk < 0 || a->chunk >= C || a->op > LOCO_PP_RECV)
        return LOCO_ERR(LOCO_EINVAL,
                        "rank %d action %d (%s): no such action (m = %d micro-batches, %d chunks)",
                        r, i, act_str(S, r, i, buf, sizeof buf), S->s->m, C);
    const int u = a->mb * C + a->chunk;
    if (a->op <= LOCO_PP_BW && S->s->chunk_rank[a->chunk] != r)
        return LOCO_ERR(LOCO_EINVAL, "rank %d action %d (%s): chunk %d lives on rank %d", r, i,
                        act_str(S, r, i, buf, sizeof buf), a->chunk, S->s->chunk_rank[a->chunk]);
    switch (a->op) {
    case LOCO_PP_F: return place(S, S->at_f, u, r, i, "F");
    case LOCO_PP_B: return place(S, S->at_b, u, r, i, "B");
    case LOCO_PP_W: return place(S, S->at_w, u, r, i, "W");
    case LOCO_PP_BW: return place(S, S->at_bw, u, r, i, "BW");
    default: break;
    }
    LOCO_CHECK(check_route(S, r, i, a));
    const bool send = a->op == LOCO_PP_SEND;
    return place(S, send ? S->at_send[a->msg] : S->at_recv[a->msg], u, r, i,
                 send ? "SEND" : "RECV");
}

/* The compute action that consumes message msg of unit u. */
static pp_loc consumer(const sim *S, int msg, int u) {
    if (msg == LOCO_PP_ACT)
        return S->at_f[u + 1];
    return S->at_bw[u - 1].rank >= 0 ? S->at_bw[u - 1] : S->at_b[u - 1];
}

/* Message msg of unit u, if chunks on two ranks exchange it, has exactly
 * one SEND and one RECV (duplicates were refused while indexing). */
static int check_message(const sim *S, int msg, int u) {
    const int C = S->s->n_chunks, mb = u / C, c = u % C, to = msg == LOCO_PP_ACT ? c + 1 : c - 1;
    if (to < 0 || to >= C || S->s->chunk_rank[to] == S->s->chunk_rank[c])
        return 0;
    const pp_loc need = consumer(S, msg, u), recv = S->at_recv[msg][u];
    char buf[48], buf2[48];
    const char *who = act_str(S, need.rank, need.idx, buf, sizeof buf);
    if (recv.rank < 0)
        return LOCO_ERR(LOCO_EINVAL,
                        "rank %d action %d (%s) waits forever for the %s of (mb %d, chunk %d) "
                        "from rank %d: rank %d's list has no RECV of it",
                        need.rank, need.idx, who, msg_name(msg), mb, c, S->s->chunk_rank[c],
                        need.rank);
    if (S->at_send[msg][u].rank < 0)
        return LOCO_ERR(LOCO_EINVAL,
                        "rank %d action %d (%s) waits forever on its RECV (action %d, %s) of the "
                        "%s of (mb %d, chunk %d): rank %d's list has no matching SEND",
                        need.rank, need.idx, who, recv.idx,
                        act_str(S, recv.rank, recv.idx, buf2, sizeof buf2), msg_name(msg), mb, c,
                        S->s->chunk_rank[c]);
    return 0;
}

/* Every unit has one F and one backward, and its messages their ends. */
static int check_complete(const sim *S) {
    for (int u = 0; u < S->units; u++) {
        const int mb = u / S->s->n_chunks, c = u % S->s->n_chunks;
        if (S->at_f[u].rank < 0)
            return LOCO_ERR(LOCO_EINVAL, "no F(mb %d, chunk %d) in any list", mb, c);
        const bool bw = S->at_bw[u].rank >= 0, b = S->at_b[u].rank >= 0, w = S->at_w[u].rank >= 0;
        if (bw && (b || w))
            return LOCO_ERR(LOCO_EINVAL, "(mb %d, chunk %d) has a BW and also a %s", mb, c,
                            b ? "B" : "W");
        if (!bw && !(b && w))
            return LOCO_ERR(LOCO_EINVAL,
                            "(mb %d, chunk %d) has no complete backward: no %s (a backward is "
                            "one BW, or one B and one W)",
                            mb, c,
                            b   ? "W"
                            : w ? "B"
                                : "BW, B or W");
    }
    for (int u = 0; u < S->units; u++)
        for (int msg = LOCO_PP_ACT; msg <= LOCO_PP_GRAD; msg++)
            LOCO_CHECK(check_message(S, msg, u));
    return 0;
}

/* Input of a compute action on rank r: the output of chunk `from` for mb,
 * local or received. Raises *t to when it is there; false if not yet. */
static bool input_ready(const sim *S, int r, int msg, int mb, int from, double *t) {
    const int u = mb * S->s->n_chunks + from;
    if (S->s->chunk_rank[from] == r) {
        const double done = msg == LOCO_PP_ACT ? S->t_f[u] : S->t_b[u];
        if (done < 0)
            return false;
        *t = fmax(*t, done);
        return true;
    }
    if (S->t_posted[msg][u] < 0 || S->t_sent[msg][u] < 0)
        return false;
    *t = fmax(*t, fmax(S->t_posted[msg][u], S->t_sent[msg][u] + S->c.latency));
    return true;
}

/* Runs compute on rank r from when it may start (ready); its end. */
static double run(sim *S, int r, double ready, double cost) {
    const double begin = fmax(S->clock[r], ready);
    if (S->start[r] < 0)
        S->start[r] = begin;
    S->clock[r] = begin + cost;
    S->busy[r] += cost;
    return S->clock[r];
}

static void live_add(sim *S, int r, int d) {
    S->live[r] += d;
    S->peak[r] = imax(S->peak[r], S->live[r]);
}

/* Executes rank r's next action if its inputs are there; false if not. */
static bool step(sim *S, int r) {
    const loco_pp_action *a = &S->s->lists[r][S->pc[r]];
    const int C = S->s->n_chunks, u = a->mb * C + a->chunk;
    double t = 0;
    switch (a->op) {
    case LOCO_PP_F:
        if (a->chunk > 0 && !input_ready(S, r, LOCO_PP_ACT, a->mb, a->chunk - 1, &t))
            return false;
        live_add(S, r, 1);
        S->t_f[u] = run(S, r, t, S->c.f);
        break;
    case LOCO_PP_B:
    case LOCO_PP_BW:
        if (S->t_f[u] < 0)
            return false;
        t = S->t_f[u];
        if (a->chunk < C - 1 && !input_ready(S, r, LOCO_PP_GRAD, a->mb, a->chunk + 1, &t))
            return false;
        S->t_b[u] = run(S, r, t, a->op == LOCO_PP_BW ? S->c.b + S->c.w : S->c.b);
        if (a->op == LOCO_PP_BW)
            S->t_w[u] = S->t_b[u], live_add(S, r, -1);
        break;
    case LOCO_PP_W:
        if (S->t_b[u] < 0)
            return false;
        S->t_w[u] = run(S, r, S->t_b[u], S->c.w);
        live_add(S, r, -1);
        break;
    case LOCO_PP_SEND: {
        const double made = a->msg == LOCO_PP_ACT ? S->t_f[u] : S->t_b[u];
        if (made < 0)
            return false;
        S->t_sent[a->msg][u] = fmax(S->clock[r], made);
        break;
    }
    case LOCO_PP_RECV: S->t_posted[a->msg][u] = S->clock[r]; break;
    }
    S->pc[r]++;
    return true;
}

/* What rank r's stuck action waits for: a local action later in its own
 * list, or a message whose RECV comes later or whose SEND is not reached. */
static void describe_input(const sim *S, int r, int msg, int mb, int from, char *buf, size_t cap) {
    const int u = mb * S->s->n_chunks + from, q = S->s->chunk_rank[from];
    if (q == r) {
        const pp_loc at = msg == LOCO_PP_ACT      ? S->at_f[u]
                          : S->at_bw[u].rank >= 0 ? S->at_bw[u]
                                                  : S->at_b[u];
        snprintf(buf, cap, "%s(mb %d, chunk %d), its own action %d, later in its list",
                 msg == LOCO_PP_ACT ? "F" : "the backward ", mb, from, at.idx);
    } else if (S->t_posted[msg][u] < 0) {
        snprintf(buf, cap, "the %s of (mb %d, chunk %d), whose RECV is its own action %d, later",
                 msg_name(msg), mb, from, S->at_recv[msg][u].idx);
    } else {
        const pp_loc at = S->at_send[msg][u];
        snprintf(buf, cap,
                 "the %s of (mb %d, chunk %d) from rank %d, whose SEND (rank %d's action %d) "
                 "rank %d never reaches",
                 msg_name(msg), mb, from, q, at.rank, at.idx, at.rank);
    }
}

/* One stuck rank: "rank r waits forever at action i (X) for ...". */
static void describe_wait(const sim *S, int r, char *buf, size_t cap) {
    const int i = S->pc[r], C = S->s->n_chunks;
    const loco_pp_action *a = &S->s->lists[r][i];
    const int u = a->mb * C + a->chunk;
    char what[48], on[400];
    act_str(S, r, i, what, sizeof what);
    if (a->op == LOCO_PP_F)
        describe_input(S, r, LOCO_PP_ACT, a->mb, a->chunk - 1, on, sizeof on);
    else if ((a->op == LOCO_PP_B || a->op == LOCO_PP_BW) && S->t_f[u] < 0)
        snprintf(on, sizeof on, "its F, its own action %d, later in its list", S->at_f[u].idx);
    else if (a->op == LOCO_PP_B || a->op == LOCO_PP_BW)
        describe_input(S, r, LOCO_PP_GRAD, a->mb, a->chunk + 1, on, sizeof on);
    else if (a->op == LOCO_PP_W)
        snprintf(on, sizeof on, "its B, its own action %d, later in its list", S->at_b[u].idx);
    else {
        const pp_loc at = a->msg == LOCO_PP_ACT   ? S->at_f[u]
                          : S->at_bw[u].rank >= 0 ? S->at_bw[u]
                                                  : S->at_b[u];
        snprintf(on, sizeof on, "the compute that makes what it sends, its own action %d, later",
                 at.idx);
    }
    snprintf(buf, cap, "rank %d waits forever at action %d (%s) for %s", r, i, what, on);
}

/* LOCO_EINVAL naming each stuck rank's action and what it waits on. */
static int deadlock(const sim *S) {
    char msg[3072] = "deadlock: ", one[640];
    int stuck = 0;
    for (int r = 0; r < S->s->p; r++) {
        if (S->pc[r] == S->s->len[r])
            continue;
        if (stuck++ < PP_DEADLOCK_NAMED) {
            describe_wait(S, r, one, sizeof one);
            snprintf(msg + strlen(msg), sizeof msg - strlen(msg), "%s%s", stuck > 1 ? "; " : "",
                     one);
        }
    }
    if (stuck > PP_DEADLOCK_NAMED)
        snprintf(msg + strlen(msg), sizeof msg - strlen(msg), "; and %d more ranks",
                 stuck - PP_DEADLOCK_NAMED);
    return LOCO_ERR(LOCO_EINVAL, "%s", msg);
}

/* Runs every rank as far as it can until none moves; LOCO_EINVAL on a
 * deadlock. The times depend only on each action's inputs, so the order
 * in which ranks are visited does not change them. */
static int simulate_lists(sim *S) {
    for (bool moved = true; moved;) {
        moved = false;
        for (int r = 0; r < S->s->p; r++)
            while (S->pc[r] < S->s->len[r] && step(S, r))
                moved = true;
    }
    for (int r = 0; r < S->s->p; r++)
        if (S->pc[r] < S->s->len[r])
            return deadlock(S);
    return 0;
}

/* Whether, for every sender -> receiver pair (and kind, when by_kind), the
 * SENDs on the sender and the RECVs on the receiver list the messages in
 * one order: each message's position among its channel's sends equals that
 * among its receives. ord and count are scratch of 2 units and 2 p ints. */
static bool messages_in_order(const sim *S, bool by_kind, int *ord, int *count) {
    const loco_pp_schedule *s = S->s;
    bool in_order = true;
    for (int pass = 0; pass < 2; pass++) /* 0: number the SENDs, 1: check the RECVs */
        for (int r = 0; r < s->p; r++) {
            memset(count, 0, sizeof(int) * 2 * (size_t)s->p);
            for (int i = 0; i < s->len[r]; i++) {
                const loco_pp_action *a = &s->lists[r][i];
                if (a->op != (pass ? LOCO_PP_RECV : LOCO_PP_SEND))
                    continue;
                const int k = a->msg * S->units + a->mb * s->n_chunks + a->chunk;
                const int channel = 2 * a->peer + (by_kind ? a->msg : 0);
                if (!pass)
                    ord[k] = count[channel]++;
                else if (ord[k] != count[channel]++)
                    in_order = false;
            }
        }
    return in_order;
}

static int sim_report(const sim *S, loco_pp_sim *out) {
    const int p = S->s->p;
    loco_pp_sim r = {.p = p, .ranks = loco_alloc(sizeof(loco_pp_rank_stats) * (size_t)p)};
    int *ord = loco_alloc(sizeof(int) * 2 * (size_t)S->units);
    int *count = loco_alloc(sizeof(int) * 2 * (size_t)p);
    if (!r.ranks || !ord || !count) {
        loco_free(r.ranks), loco_free(ord), loco_free(count);
        return LOCO_ERR(LOCO_ENOMEM, "pipeline simulator: results");
    }
    r.in_order = messages_in_order(S, false, ord, count);
    r.in_order_by_kind = messages_in_order(S, true, ord, count);
    loco_free(ord), loco_free(count);
    for (int k = 0; k < p; k++)
        r.makespan = fmax(r.makespan, S->clock[k]);
    for (int k = 0; k < p; k++) {
        const double idle = r.makespan - S->busy[k];
        r.ranks[k] = (loco_pp_rank_stats){.busy = S->busy[k],
                                          .start = fmax(S->start[k], 0),
                                          .end = S->clock[k],
                                          .bubble = r.makespan > 0 ? idle / r.makespan : 0,
                                          .peak_live = S->peak[k]};
        r.bubble += r.ranks[k].bubble / p;
        r.peak_live = imax(r.peak_live, S->peak[k]);
    }
    *out = r;
    return 0;
}

int loco_pp_simulate(const loco_pp_schedule *s, const loco_pp_costs *c, loco_pp_sim *out) {
    if (!(c->f >= 0 && c->b >= 0 && c->w >= 0 && c->latency >= 0) ||
        !isfinite(c->f + c->b + c->w + c->latency))
        return LOCO_ERR(LOCO_EINVAL,
                        "pipeline costs must be finite and >= 0 (F %g, B %g, W %g, "
                        "latency %g)",
                        c->f, c->b, c->w, c->latency);
    sim S;
    LOCO_CHECK(sim_init(&S, s, c));
    int rc = 0;
    for (int r = 0; r < s->p && rc == 0; r++)
        for (int i = 0; i < s->len[r] && rc == 0; i++)
            rc = index_action(&S, r, i);
    if (rc == 0)
        rc = check_complete(&S);
    if (rc == 0)
        rc = simulate_lists(&S);
    if (rc == 0)
        rc = sim_report(&S, out);
    loco_free(S.slab);
    return rc;
}

void loco_pp_sim_fini(loco_pp_sim *r) {
    loco_free(r->ranks);
    r->ranks = NULL;
}
