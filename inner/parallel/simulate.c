/* The discrete-event simulator of a pipeline schedule: checks that every
 * message has its two ends and every (micro-batch, chunk) its work, that
 * nothing waits forever (naming what does), and computes the makespan,
 * each rank's bubble and its peak of live activations (docs/PIPELINE.md). */
#include "inner/parallel/schedule_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

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
    S->peak[r] = loco__pp_imax(S->peak[r], S->live[r]);
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
        r.peak_live = loco__pp_imax(r.peak_live, S->peak[k]);
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
