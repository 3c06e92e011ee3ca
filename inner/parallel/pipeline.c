/* The pipeline executor: one rank's action list of any schedule, run in
 * order over the pp communicator with non-blocking transfers, the compute
 * delegated to an ops table (the model's stage, or the synthetic sleeps
 * of `loco bench pipeline`). docs/PIPELINE.md, "The executor".
 *
 * Everything that does not depend on the data is decided once, in
 * loco_pp_exec_create: a *plan* per action that names the pool buffer it
 * uses (a received message, a compute's output, a sent message), the
 * sends to complete before it, and the tag of each transfer. A step then
 * follows the plan and never allocates. */
#include "inner/parallel/parallel.h"

#include <string.h>

/* Message tag: 2 (mb * n_chunks + chunk) + kind, (mb, chunk) the producer. */
static int msg_tag(int msg, int mb, int chunk, int n_chunks) {
    return 2 * (mb * n_chunks + chunk) + msg;
}

/* What one action does, decided at create. */
typedef struct {
    uint8_t op, msg;
    int32_t peer, mb, chunk;      /* peer of a compute: where its input comes from */
    int32_t tag;                  /* SEND, RECV */
    int32_t slot;                 /* SEND/RECV: its buffer; compute: its output's (-1: none) */
    int32_t in_slot;              /* compute: its input's buffer (-1: none) */
    bool in_remote;               /* compute: the input is a receive to wait for */
    int32_t retire_lo, retire_hi; /* compute: sends retire[lo..hi) complete before it */
} pp_plan;

struct loco_pp_exec {
    loco_comm *pp;
    int rank, n;         /* n actions in this rank's list */
    size_t msg_elems;    /* floats of payload; element msg_elems is the poison flag */
    size_t stride;       /* floats per pool buffer (payload + flag, 64-byte multiple) */
    pp_plan *plan;       /* [n] */
    int32_t *retire;     /* slots of the sends each compute completes first */
    int n_slots;         /* pool buffers */
    float *pool;         /* [n_slots * stride] */
    loco_comm_req **req; /* [n_slots]: the transfer in flight on each buffer */
};

/* Where an action sits: rank, index in its list (rank -1: nowhere). */
typedef struct {
    int rank, idx;
} pp_at;

/* Scratch of create, freed before it returns. */
typedef struct {
    const loco_pp_schedule *s;
    int p, v, m, C, units, me;
    pp_at *f_at, *bwd_at; /* [units]: each unit's F and its B or BW */
    int *next_send;       /* [sum of lens + p]: per rank, index of the first SEND to me at >= i */
    int *next_off;        /* [p]: where each rank's part of next_send starts */
    int *msg_slot;        /* [2 units]: buffer of each message on this rank (-1) */
    int *free_slots;      /* [2 units + 1]: stack of released buffers */
    int n_free;
    int *retire_at;    /* [n]: SEND -> the compute that completes it (n: the drain) */
    int *retire_count; /* [n + 2]: prefix counts of retire_at */
} pp_build;

void loco_pp_exec_destroy(loco_pp_exec *e) {
    if (!e)
        return;
    loco_free(e->plan);
    loco_free(e->retire);
    loco_free(e->pool);
    loco_free(e->req);
    loco_free(e);
}

static void build_fini(pp_build *b) {
    loco_free(b->f_at), loco_free(b->bwd_at), loco_free(b->next_send), loco_free(b->next_off);
    loco_free(b->msg_slot), loco_free(b->free_slots), loco_free(b->retire_at);
    loco_free(b->retire_count);
}

/* Indexes every rank's computes and, for each rank, where its next SEND
 * to this rank is. */
static int build_init(pp_build *b, const loco_pp_schedule *s, int me) {
    *b = (pp_build){.s = s, .me = me};
    loco_pp_schedule_shape(s, &b->p, &b->v, &b->m);
    b->C = b->p * b->v, b->units = b->m * b->C;
    size_t total = 0;
    for (int r = 0; r < b->p; r++) {
        int n;
        loco_pp_rank_actions(s, r, &n);
        total += (size_t)n + 1;
    }
    int n_me;
    loco_pp_rank_actions(s, me, &n_me);
    const size_t u = (size_t)b->units;
    b->f_at = loco_alloc(u * sizeof(pp_at)), b->bwd_at = loco_alloc(u * sizeof(pp_at));
    b->next_send = loco_alloc(total * sizeof(int));
    b->next_off = loco_alloc((size_t)b->p * sizeof(int));
    b->msg_slot = loco_alloc(2 * u * sizeof(int));
    b->free_slots = loco_alloc((2 * u + 1) * sizeof(int));
    b->retire_at = loco_alloc(((size_t)n_me + 1) * sizeof(int));
    b->retire_count = loco_alloc(((size_t)n_me + 2) * sizeof(int));
    if (!b->f_at || !b->bwd_at || !b->next_send || !b->next_off || !b->msg_slot || !b->free_slots ||
        !b->retire_at || !b->retire_count) {
        build_fini(b);
        return LOCO_ERR(LOCO_ENOMEM, "pipeline executor: planning scratch");
    }
    for (size_t k = 0; k < 2 * u; k++)
        b->msg_slot[k] = -1;
    size_t off = 0;
    for (int r = 0; r < b->p; r++) {
        int n;
        const loco_pp_action *a = loco_pp_rank_actions(s, r, &n);
        b->next_off[r] = (int)off;
        b->next_send[off + (size_t)n] = -1;
        for (int i = n - 1; i >= 0; i--)
            b->next_send[off + (size_t)i] =
                a[i].op == LOCO_PP_SEND && a[i].peer == me ? i : b->next_send[off + (size_t)i + 1];
        for (int i = 0; i < n; i++) {
            const int unit = a[i].mb * b->C + a[i].chunk;
            if (a[i].op == LOCO_PP_F)
                b->f_at[unit] = (pp_at){r, i};
            else if (a[i].op == LOCO_PP_B || a[i].op == LOCO_PP_BW)
                b->bwd_at[unit] = (pp_at){r, i};
        }
        off += (size_t)n + 1;
    }
    return 0;
}

/* The compute that consumes message (msg, mb, chunk). */
static pp_at consumer(const pp_build *b, int msg, int mb, int chunk) {
    const int u = mb * b->C + chunk;
    return msg == LOCO_PP_ACT ? b->f_at[u + 1] : b->bwd_at[u - 1];
}

/* When this rank's SEND at index i is certainly complete: its receiver q
 * consumed it, then sent this rank something, which this rank waited for
 * at that message's consumer. Until then the buffer stays; with no such
 * message, until the drain at the end of the step (index n). Waiting on
 * a send any earlier could block on a receiver that waits for this rank. */
static int retire_point(const pp_build *b, const loco_pp_action *a, int i, int n) {
    const pp_at used = consumer(b, a->msg, a->mb, a->chunk);
    int qn;
    const loco_pp_action *q = loco_pp_rank_actions(b->s, used.rank, &qn);
    const int k = b->next_send[b->next_off[used.rank] + used.idx + 1];
    if (k < 0)
        return n;
    const pp_at back = consumer(b, q[k].msg, q[k].mb, q[k].chunk);
    return back.idx > i ? back.idx : n;
}

static int slot_take(pp_build *b, int *n_slots) {
    return b->n_free > 0 ? b->free_slots[--b->n_free] : (*n_slots)++;
}

static void slot_give(pp_build *b, int slot) {
    b->free_slots[b->n_free++] = slot;
}

/* The buffers of compute i: its input (received or handed over by an
 * earlier chunk of this rank), its output, the sends retired before it. */
static int plan_compute(loco_pp_exec *e, pp_build *b, int i, int *next_retire, const int *sends) {
    pp_plan *pl = &e->plan[i];
    const bool fwd = pl->op == LOCO_PP_F, bwd = pl->op == LOCO_PP_B || pl->op == LOCO_PP_BW;
    const int u = pl->mb * b->C + pl->chunk;
    int *in = NULL, *out = NULL;
    if (fwd && pl->chunk > 0)
        in = &b->msg_slot[2 * (u - 1) + LOCO_PP_ACT];
    else if (bwd && pl->chunk < b->C - 1)
        in = &b->msg_slot[2 * (u + 1) + LOCO_PP_GRAD];
    if (fwd && pl->chunk < b->C - 1)
        out = &b->msg_slot[2 * u + LOCO_PP_ACT];
    else if (bwd && pl->chunk > 0)
        out = &b->msg_slot[2 * u + LOCO_PP_GRAD];
    if (in && *in < 0)
        return LOCO_ERR(LOCO_EINVAL, "pipeline executor: rank %d action %d has no input", b->me, i);
    pl->in_slot = in ? *in : -1;
    if (in) {
        pl->peer = loco_pp_chunk_rank(b->s, fwd ? pl->chunk - 1 : pl->chunk + 1);
        pl->in_remote = pl->peer != b->me;
    }
    pl->retire_lo = *next_retire;
    for (int k = b->retire_count[i]; k < b->retire_count[i + 1]; k++) {
        e->retire[(*next_retire)++] = e->plan[sends[k]].slot;
        slot_give(b, e->plan[sends[k]].slot);
    }
    pl->retire_hi = *next_retire;
    if (out)
        pl->slot = *out = slot_take(b, &e->n_slots);
    if (in) {
        slot_give(b, *in);
        *in = -1;
    }
    return 0;
}

/* sends[] lists this rank's SENDs grouped by retire point: those that
 * compute i completes are sends[retire_count[i] .. retire_count[i+1]). */
static int bucket_sends(pp_build *b, const loco_pp_action *a, int n, int *sends) {
    for (int i = 0; i < n; i++)
        if (a[i].op == LOCO_PP_SEND)
            b->retire_count[b->retire_at[i] + 1]++;
    for (int i = 0; i <= n; i++)
        b->retire_count[i + 1] += b->retire_count[i];
    int *pos = loco_alloc(((size_t)n + 1) * sizeof(int));
    if (!pos)
        return LOCO_ERR(LOCO_ENOMEM, "pipeline executor: plan of %d actions", n);
    memcpy(pos, b->retire_count, ((size_t)n + 1) * sizeof(int));
    for (int i = 0; i < n; i++)
        if (a[i].op == LOCO_PP_SEND)
            sends[pos[b->retire_at[i]]++] = i;
    loco_free(pos);
    return 0;
}

/* The whole plan of this rank: tags and retire points, then buffers in
 * list order (a buffer is taken by a RECV or a compute's output and given
 * back after its consumer, or when its send retires). */
static int plan_rank(loco_pp_exec *e, pp_build *b) {
    const loco_pp_action *a = loco_pp_rank_actions(b->s, b->me, &e->n);
    const int n = e->n;
    e->plan = loco_alloc(((size_t)n + 1) * sizeof(pp_plan));
    e->retire = loco_alloc(((size_t)n + 1) * sizeof(int32_t));
    int *sends = loco_alloc(((size_t)n + 1) * sizeof(int)), rc = 0, next_retire = 0;
    if (!e->plan || !e->retire || !sends) {
        loco_free(sends);
        return LOCO_ERR(LOCO_ENOMEM, "pipeline executor: plan of %d actions", n);
    }
    for (int i = 0; i < n; i++) {
        e->plan[i] = (pp_plan){.op = a[i].op,
                               .msg = a[i].msg,
                               .peer = a[i].peer,
                               .mb = a[i].mb,
                               .chunk = a[i].chunk,
                               .slot = -1,
                               .in_slot = -1};
        if (a[i].op == LOCO_PP_SEND || a[i].op == LOCO_PP_RECV)
            e->plan[i].tag = msg_tag(a[i].msg, a[i].mb, a[i].chunk, b->C);
        if (a[i].op == LOCO_PP_SEND)
            b->retire_at[i] = retire_point(b, &a[i], i, n);
    }
    LOCO_CHECK_GOTO(bucket_sends(b, a, n, sends), out);
    for (int i = 0; i < n && rc == 0; i++) {
        pp_plan *pl = &e->plan[i];
        const int k = 2 * (pl->mb * b->C + pl->chunk) + pl->msg;
        if (pl->op == LOCO_PP_RECV)
            pl->slot = b->msg_slot[k] = slot_take(b, &e->n_slots);
        else if (pl->op == LOCO_PP_SEND && (pl->slot = b->msg_slot[k]) < 0)
            rc = LOCO_ERR(LOCO_EINVAL, "pipeline executor: rank %d action %d sends nothing made",
                          b->me, i);
        else if (pl->op == LOCO_PP_SEND)
            b->msg_slot[k] = -1; /* the buffer is the send's until it retires */
        else if (pl->op != LOCO_PP_W)
            rc = plan_compute(e, b, i, &next_retire, sends);
    }
out:
    loco_free(sends);
    return rc;
}

int loco_pp_exec_create(loco_pp_exec **out, const loco_pp_schedule *s, loco_comm *pp,
                        size_t msg_elems) {
    int p, v, m;
    loco_pp_schedule_shape(s, &p, &v, &m);
    const long long top_tag = 2LL * m * p * v - 1;
    if (top_tag > LOCO_COMM_TAG_MAX)
        return LOCO_ERR(LOCO_EINVAL,
                        "pipeline executor: schedule %s with m = %d micro-batches and %d chunks "
                        "needs message tags up to %lld (tag = 2 (mb * chunks + chunk) + kind), "
                        "above LOCO_COMM_TAG_MAX = %d: at most %d micro-batches with %d chunks",
                        loco_pp_schedule_name(s), m, p * v, top_tag, LOCO_COMM_TAG_MAX,
                        (LOCO_COMM_TAG_MAX + 1) / (2 * p * v), p * v);
    loco_pp_sim sim;
    LOCO_CHECK(loco_pp_simulate(s, &(loco_pp_costs){.f = 1, .b = 1, .w = 1}, &sim));
    loco_pp_sim_fini(&sim);
    if (loco_comm_size(pp) != p)
        return LOCO_ERR(LOCO_EINVAL,
                        "pipeline executor: schedule %s has %d ranks, the pp communicator %d",
                        loco_pp_schedule_name(s), p, loco_comm_size(pp));
    if (msg_elems > ((size_t)1 << 40))
        return LOCO_ERR(LOCO_EINVAL, "pipeline executor: messages of %zu floats", msg_elems);
    loco_pp_exec *e = loco_alloc(sizeof *e);
    if (!e)
        return LOCO_ERR(LOCO_ENOMEM, "pipeline executor");
    *e = (loco_pp_exec){.pp = pp,
                        .rank = loco_comm_rank(pp),
                        .msg_elems = msg_elems,
                        .stride = (msg_elems + 1 + 15) & ~(size_t)15};
    pp_build b;
    int rc;
    LOCO_CHECK_GOTO(build_init(&b, s, e->rank), out_free);
    rc = plan_rank(e, &b);
    build_fini(&b);
    if (rc < 0)
        goto out_free;
    e->pool = loco_alloc((size_t)(e->n_slots > 0 ? e->n_slots : 1) * e->stride * sizeof(float));
    e->req = loco_alloc((size_t)(e->n_slots > 0 ? e->n_slots : 1) * sizeof(loco_comm_req *));
    if (!e->pool || !e->req) {
        rc = LOCO_ERR(LOCO_ENOMEM, "pipeline executor: %d buffers of %zu floats", e->n_slots,
                      msg_elems + 1);
        goto out_free;
    }
    *out = e;
    return 0;
out_free:
    loco_pp_exec_destroy(e);
    return rc;
}

int loco_pp_exec_buffers(const loco_pp_exec *e) {
    return e->n_slots;
}

int loco_pp_exec_pending(const loco_pp_exec *e) {
    int n = 0;
    for (int k = 0; k < e->n_slots; k++)
        n += e->req[k] != NULL;
    return n;
}

/* ------------------------------------------------------------------ a step */

typedef struct {
    loco_pp_exec *e;
    const loco_pp_stage_ops *ops;
    int rc; /* the first failure; from then on computes are skipped */
    loco_pp_exec_stats st;
} pp_run;

static float *slot_buf(const loco_pp_exec *e, int slot) {
    return slot < 0 ? NULL : e->pool + (size_t)slot * e->stride;
}

static void run_fail(pp_run *R, int rc) {
    if (R->rc == 0)
        R->rc = rc;
}

/* Completes the transfer on a buffer; its time counts as waiting. */
static void run_wait(pp_run *R, int slot) {
    const double t0 = loco_now();
    const int rc = loco_comm_wait(R->e->req[slot]);
    R->e->req[slot] = NULL;
    R->st.wait += loco_now() - t0;
    if (rc < 0) {
        loco__err_trace(__FILE__, __LINE__, "loco_comm_wait (pipeline transfer)");
        run_fail(R, rc);
    }
}

static int call_compute(const pp_run *R, const pp_plan *pl) {
    const loco_pp_stage_ops *o = R->ops;
    float *in = slot_buf(R->e, pl->in_slot), *out = slot_buf(R->e, pl->slot);
    switch (pl->op) {
    case LOCO_PP_F: return o->forward(o->ctx, pl->mb, pl->chunk, in, out);
    case LOCO_PP_B: return o->backward_input(o->ctx, pl->mb, pl->chunk, in, out);
    case LOCO_PP_W: return o->backward_weight(o->ctx, pl->mb, pl->chunk);
    default: break;
    }
    const int rc = o->backward_input(o->ctx, pl->mb, pl->chunk, in, out);
    return rc < 0 ? rc : o->backward_weight(o->ctx, pl->mb, pl->chunk);
}

/* Compute action i: waits for its received input (a poisoned one fails
 * the step), completes the sends due, then runs unless the step failed. */
static void run_compute(pp_run *R, int i) {
    const loco_pp_exec *e = R->e;
    const pp_plan *pl = &e->plan[i];
    if (pl->in_remote) {
        run_wait(R, pl->in_slot);
        if (R->rc == 0 && slot_buf(e, pl->in_slot)[e->msg_elems] != 0.0f)
            run_fail(R, LOCO_ERR(LOCO_EPEER,
                                 "pipeline rank %d: the input of action %d (mb %d, chunk %d) "
                                 "came from rank %d marked failed: a compute failed there or "
                                 "upstream of it",
                                 e->rank, i, pl->mb, pl->chunk, pl->peer));
    }
    for (int k = pl->retire_lo; k < pl->retire_hi; k++)
        run_wait(R, e->retire[k]);
    if (R->rc < 0)
        return;
    const double t0 = loco_now();
    const int rc = call_compute(R, pl);
    R->st.compute += loco_now() - t0;
    R->st.computes++;
    if (rc < 0) {
        loco__err_trace(__FILE__, __LINE__, "pipeline compute callback");
        run_fail(R, rc);
    }
}

/* Posts the transfer of action i; a send carries the step's state in its
 * flag element (1: this rank has failed, its payload is meaningless). */
static void run_transfer(pp_run *R, int i) {
    loco_pp_exec *e = R->e;
    const pp_plan *pl = &e->plan[i];
    float *buf = slot_buf(e, pl->slot);
    int rc;
    if (pl->op == LOCO_PP_SEND) {
        buf[e->msg_elems] = R->rc < 0 ? 1.0f : 0.0f;
        rc = loco_comm_isend(e->pp, buf, e->msg_elems + 1, LOCO_DT_F32, pl->peer, pl->tag,
                             &e->req[pl->slot]);
        R->st.sends++;
    } else {
        rc = loco_comm_irecv(e->pp, buf, e->msg_elems + 1, LOCO_DT_F32, pl->peer, pl->tag,
                             &e->req[pl->slot]);
        R->st.recvs++;
    }
    if (rc < 0) {
        loco__err_trace(__FILE__, __LINE__, "pipeline transfer");
        run_fail(R, rc);
    }
}

int loco_pp_execute(loco_pp_exec *e, const loco_pp_stage_ops *ops, loco_pp_exec_stats *stats) {
    if (!ops || !ops->forward || !ops->backward_input || !ops->backward_weight)
        return LOCO_ERR(LOCO_EINVAL, "pipeline executor: the stage ops need forward, "
                                     "backward_input and backward_weight");
    pp_run R = {.e = e, .ops = ops};
    const double t0 = loco_now();
    for (int i = 0; i < e->n; i++) {
        if (e->plan[i].op == LOCO_PP_SEND || e->plan[i].op == LOCO_PP_RECV)
            run_transfer(&R, i);
        else
            run_compute(&R, i);
    }
    for (int k = 0; k < e->n_slots; k++) /* the drain: sends not retired on the way */
        if (e->req[k])
            run_wait(&R, k);
    R.st.wall = loco_now() - t0;
    if (stats)
        *stats = R.st;
    return R.rc;
}
