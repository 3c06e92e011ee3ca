/* outer.layout = whole: islands of different meshes in one run. The
 * exchange, the outer state, hashes, state transfer and fragments work on
 * the whole model's layout (tp = 1, no stage, every expert: the export
 * order), which no island's mesh changes. Rank 0 of the island runs the
 * outer loop alone (`lead`: an island over a one-rank communicator whose
 * inner view is the whole model); the other ranks follow: each time the
 * lead reads θ_local, writes θ_global or moves the step, rank 0 sends a
 * command and every rank takes part in the gather or scatter it names.
 * Design: docs/DECISIONS.md "The whole layout". */
#include "outer/island_internal.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { CMD_GATHER = 1, CMD_SCATTER, CMD_SET_STEP, CMD_SET_SCHEDULE, CMD_DONE };

struct loco_whole {
    struct loco_comm *world; /* the island's ranks */
    struct loco_comm *self;  /* rank 0: the lead's one-rank communicator */
    int rank;
    loco_inner_view in;      /* the trainer's */
    loco_ttable table;       /* the whole model's */
    size_t lo, hi;           /* this rank's owned range */
    int64_t *idx;            /* whole index of each owned element (-1: padding) */
    uint8_t *source;         /* this rank brings that element to the gather */
    size_t n;                /* elements of the whole model */
    float *buf;              /* the whole θ (rank 0's is the lead's θ_local) */
    int64_t gathered;        /* the inner step buf holds θ_local of (-1: none) */
    loco_island *lead;       /* rank 0 */
    /* the other ranks: the faults that act on a process (kill, freeze,
     * slow), as every rank of a rank-by-rank island injects them; the
     * lead injects them on rank 0 with those on its links */
    loco_faults f;
    /* rank 0's, after every call: every rank reads the same */
    int64_t end_step;
    bool finished;
};

/* ---------------------------------------------------------- the commands */

/* A command from rank 0 to every rank: {what, argument, and after
 * CMD_DONE the end step, finished and the call's status}. Non-blocking
 * and polled with sleeps: the followers wait for the length of an
 * exchange, and a blocking MPI broadcast would spin on their cores. */
static int command(loco_whole *w, int64_t c[5]) {
    loco_comm_req *req;
    LOCO_CHECK(loco_comm_ibroadcast(w->world, c, 5, LOCO_DT_I64, 0, &req));
    bool done = false;
    long ns = 20000;
    while (!done) {
        int rc = loco_comm_test(req, &done);
        if (rc < 0) {
            loco_comm_wait(req);
            return rc;
        }
        if (!done) {
            nanosleep(&(struct timespec){0, ns}, NULL);
            ns = ns < 2000000 ? ns * 2 : ns;
        }
    }
    return loco_comm_wait(req);
}

static int send_command(loco_whole *w, int64_t what, int64_t arg) {
    int64_t c[5] = {what, arg, 0, 0, 0};
    return command(w, c);
}

/* Every rank: θ_local of the whole model into rank 0's buf. Each element
 * has one source rank, the others add -0.0 (the additive identity of
 * IEEE floats: the sum is the source's value, bit for bit). */
static int gather(loco_whole *w) {
    size_t lo, hi;
    const float *own = w->in.owned(w->in.ctx, &lo, &hi);
    int bad = !own || lo != w->lo || hi != w->hi;
    for (size_t i = 0; i < w->n; i++)
        w->buf[i] = -0.0f;
    if (!bad)
        for (size_t k = 0; k < hi - lo; k++)
            if (w->source[k])
                w->buf[w->idx[k]] = own[k];
    LOCO_CHECK(loco_comm_allreduce(w->world, w->buf, w->n, LOCO_DT_F32, LOCO_OP_SUM));
    LOCO_CHECK(loco_comm_allreduce(w->world, &bad, 1, LOCO_DT_I32, LOCO_OP_MAX));
    if (bad)
        return LOCO_ERR(LOCO_EIO, "island: a rank's parameters are not readable");
    w->gathered = w->in.steps_done(w->in.ctx);
    return 0;
}

/* Every rank: rank 0's buf (θ_global) into every owned element, replicas
 * included, then the trainer's own sync. */
static int scatter(loco_whole *w) {
    LOCO_CHECK(loco_comm_broadcast(w->world, w->buf, w->n, LOCO_DT_F32, 0));
    size_t lo, hi;
    float *own = w->in.owned(w->in.ctx, &lo, &hi);
    int bad = !own || lo != w->lo || hi != w->hi;
    if (!bad)
        for (size_t k = 0; k < hi - lo; k++)
            if (w->idx[k] >= 0)
                own[k] = w->buf[w->idx[k]];
    LOCO_CHECK(loco_comm_allreduce(w->world, &bad, 1, LOCO_DT_I32, LOCO_OP_MAX));
    if (bad)
        return LOCO_ERR(LOCO_EIO, "island: a rank's parameters are not writable");
    LOCO_CHECK(w->in.sync(w->in.ctx));
    w->gathered = w->in.steps_done(w->in.ctx); /* buf is θ_local again */
    return 0;
}

/* The other ranks: the commands of one call of the lead, to its end. */
static int follow(loco_whole *w) {
    for (;;) {
        int64_t c[5] = {0};
        LOCO_CHECK(command(w, c));
        switch (c[0]) {
        case CMD_GATHER:
            LOCO_CHECK(gather(w));
            break;
        case CMD_SCATTER:
            LOCO_CHECK(scatter(w));
            break;
        case CMD_SET_STEP:
            w->in.set_step(w->in.ctx, c[1]);
            break;
        case CMD_SET_SCHEDULE:
            w->in.set_schedule(w->in.ctx, c[1]);
            break;
        case CMD_DONE:
            w->end_step = c[2];
            w->finished = c[3] != 0;
            if (c[4] < 0)
                return LOCO_ERR(LOCO_EPEER, "island: rank 0's outer loop failed (status %lld)",
                                (long long)c[4]);
            return 0;
        default:
            return LOCO_ERR(LOCO_EPROTO, "island: command %lld from rank 0", (long long)c[0]);
        }
    }
}

/* Rank 0 after a call of the lead returned rc: the end of it for every
 * rank, with what they read of the island. */
static int conclude(loco_whole *w, int rc) {
    if (w->rank != 0)
        return follow(w);
    if (w->lead) {
        w->end_step = loco_island_end_step(w->lead);
        w->finished = loco_island_finished(w->lead);
    }
    int64_t c[5] = {CMD_DONE, 0, w->end_step, w->finished, rc < 0 ? rc : 0};
    const int crc = command(w, c);
    return rc < 0 ? rc : crc;
}

/* ---------------------------------------------- the lead's inner view */

static float *lead_owned(void *ctx, size_t *lo, size_t *hi) {
    loco_whole *w = ctx;
    *lo = 0, *hi = w->n;
    if (w->gathered != w->in.steps_done(w->in.ctx) &&
        (send_command(w, CMD_GATHER, 0) < 0 || gather(w) < 0))
        return NULL;
    return w->buf;
}

static const loco_ttable *lead_table(void *ctx) { return &((loco_whole *)ctx)->table; }

static int lead_sync(void *ctx) {
    loco_whole *w = ctx;
    LOCO_CHECK(send_command(w, CMD_SCATTER, 0));
    return scatter(w);
}

/* A failed send leaves the followers behind: the next command or the
 * call's end reports it (the island's ranks abort together). */
static void lead_set_step(void *ctx, int64_t step) {
    loco_whole *w = ctx;
    if (send_command(w, CMD_SET_STEP, step) == 0)
        w->in.set_step(w->in.ctx, step);
    w->gathered = -1;
}

static void lead_set_schedule(void *ctx, int64_t step) {
    loco_whole *w = ctx;
    if (send_command(w, CMD_SET_SCHEDULE, step) == 0)
        w->in.set_schedule(w->in.ctx, step);
}

static int64_t lead_steps_done(void *ctx) {
    loco_whole *w = ctx;
    return w->in.steps_done(w->in.ctx);
}

static uint64_t lead_take_pcie_bytes(void *ctx) {
    loco_whole *w = ctx;
    return w->in.take_pcie_bytes ? w->in.take_pcie_bytes(w->in.ctx) : 0;
}

/* ------------------------------------------------------------- set-up */

/* The layout: each owned element's whole index, and which rank brings it
 * to the gather (the lowest of the ranks that own it: replicas over tp,
 * the tied head's copy of wte, dense tensors on every ep rank). */
static int layout(loco_whole *w) {
    size_t lo, hi;
    if (!w->in.owned(w->in.ctx, &lo, &hi))
        return LOCO_ERR(LOCO_EIO, "island: the parameters are not readable: %s", loco_errmsg());
    w->lo = lo, w->hi = hi;
    w->idx = loco_alloc((hi - lo + 1) * sizeof *w->idx);
    w->source = loco_alloc(hi - lo + 1);
    if (!w->idx || !w->source)
        return LOCO_ERR(LOCO_ENOMEM, "whole layout of %zu elements", hi - lo);
    LOCO_CHECK(w->in.whole_layout(w->in.ctx, &w->table, w->idx));
    w->n = w->table.numel;
    int32_t *claim = loco_alloc((w->n ? w->n : 1) * sizeof *claim);
    w->buf = loco_alloc((w->n ? w->n : 1) * sizeof *w->buf);
    if (!claim || !w->buf) {
        loco_free(claim);
        return LOCO_ERR(LOCO_ENOMEM, "whole model of %zu elements", w->n);
    }
    /* ranks - rank, the largest for the lowest rank; 0: no rank */
    const int32_t mine = loco_comm_size(w->world) - w->rank;
    memset(claim, 0, w->n * sizeof *claim);
    for (size_t k = 0; k < hi - lo; k++)
        if (w->idx[k] >= 0)
            claim[w->idx[k]] = mine;
    int rc = loco_comm_allreduce(w->world, claim, w->n, LOCO_DT_I32, LOCO_OP_MAX);
    size_t orphans = 0;
    for (size_t i = 0; rc == 0 && i < w->n; i++)
        orphans += claim[i] == 0;
    for (size_t k = 0; rc == 0 && k < hi - lo; k++)
        w->source[k] = w->idx[k] >= 0 && claim[w->idx[k]] == mine;
    loco_free(claim);
    LOCO_CHECK(rc);
    if (orphans)
        return LOCO_ERR(LOCO_EINVAL, "whole layout: %zu of the model's %zu elements are on no "
                                     "rank of the island", orphans, w->n);
    w->gathered = -1;
    return 0;
}

static void whole_destroy(loco_whole *w) {
    if (!w)
        return;
    loco_island_destroy(w->lead);
    loco_comm_destroy(w->self);
    loco_ttable_fini(&w->table);
    loco_free(w->idx);
    loco_free(w->source);
    loco_free(w->buf);
    loco_free(w);
}

int loco__whole_create(loco_island **out, const loco_config *cfg, const char *site,
                       struct loco_comm *world, const loco_inner_view *inner, bool resumed) {
    *out = NULL;
    if (!inner->whole_layout)
        return LOCO_ERR(LOCO_EINVAL, "outer.layout = whole: the trainer gives no whole layout");
    island *is = loco_alloc(sizeof *is);
    loco_whole *w = loco_alloc(sizeof *w);
    if (!is || !w) {
        loco_free(is);
        loco_free(w);
        return LOCO_ERR(LOCO_ENOMEM, "island");
    }
    memset(is, 0, sizeof *is);
    memset(w, 0, sizeof *w);
    is->whole = w;
    w->world = world, w->in = *inner;
    w->rank = loco_comm_rank(world);
    int rc = layout(w);
    int id, K;
    if (rc == 0 && w->rank != 0 && (rc = loco_site_id(cfg, site, &id, &K)) == 0 &&
        (rc = loco_faults_parse(&w->f, cfg, site, id, false)) == 0) {
        w->f.part_peer = w->f.link_peer = -1;
        w->f.frames = (loco_link_faults){0};
        w->f.poison_step = 0;
    }
    if (rc == 0 && w->rank == 0) {
        const loco_inner_view view = {.ctx = w, .owned = lead_owned, .table = lead_table,
                                      .sync = lead_sync, .set_step = lead_set_step,
                                      .set_schedule = inner->set_schedule ? lead_set_schedule
                                                                          : NULL,
                                      .steps_done = lead_steps_done,
                                      .take_pcie_bytes = lead_take_pcie_bytes};
        rc = loco_comm_world(&w->self, "self");
        if (rc == 0)
            rc = loco__island_create_on(&w->lead, cfg, site, w->self, &view, resumed);
    }
    /* every rank learns how the lead's start went (a failed layout
     * aborts the island's ranks in cli/ before) */
    if (rc == 0 || w->rank == 0)
        rc = conclude(w, rc);
    if (rc < 0) {
        loco_island_destroy(is);
        return rc;
    }
    *out = is;
    return 0;
}

/* ------------------------------------------- the island's calls, relayed */

int loco__whole_after_step(loco_island *is, int64_t step, double step_s) {
    loco_whole *w = is->whole;
    if (w->rank != 0) {
        loco_link *none[LOCO_MAX_ISLANDS] = {0};
        loco_faults_inject(&w->f, step, step_s, none, NULL);
    }
    return conclude(w, w->rank == 0 ? loco_island_after_step(w->lead, step, step_s) : 0);
}

int loco__whole_save(loco_island *is, int64_t step) {
    loco_whole *w = is->whole;
    return conclude(w, w->rank == 0 ? loco_island_save(w->lead, step) : 0);
}

int loco__whole_leave(loco_island *is) {
    loco_whole *w = is->whole;
    return conclude(w, w->rank == 0 ? loco_island_leave(w->lead) : 0);
}

bool loco__whole_finished(const loco_island *is) { return is->whole->finished; }
int64_t loco__whole_end_step(const loco_island *is) { return is->whole->end_step; }

int loco__whole_set_prom(loco_island *is, loco_prom *p) {
    return is->whole->lead ? loco_island_set_prom(is->whole->lead, p) : 0;
}

void loco__whole_destroy(loco_island *is) {
    whole_destroy(is->whole);
    loco_free(is);
}
