/* The walk over a ZeRO plan that the host and the device executors share
 * (docs/ZERO.md): which unit buffers a hook needs, when a bucket starts,
 * what completes at the step's end. The executors only move data, through
 * their ops; the order of every collective is decided here, once. */
#include "inner/parallel/parallel.h"

/* A unit buffer's state (its memory is the executor's). */
typedef struct {
    int unit;              /* whose parameters it holds (stage 3), -1 none */
    uint64_t version;      /* of the owned parameters they were gathered from */
    loco_comm_req *gather; /* in flight into it */
    int reducing;          /* the bucket whose reduce-scatter reads it, -1 none */
} slot_state;

struct loco_zero_exec {
    const loco_zero_plan *plan;
    const loco_zero_exec_ops *ops;
    void *ctx;
    bool prefetch;
    bool last_micro;
    int next;              /* position in plan->order of the next ready unit */
    loco_comm_req **reqs;  /* (n_buckets) in flight */
    slot_state slot[LOCO_ZERO_SLOTS];
};

int loco_zero_exec_create(loco_zero_exec **out, const loco_zero_plan *plan,
                          const loco_zero_exec_ops *ops, void *ctx, bool prefetch) {
    *out = NULL;
    loco_zero_exec *x = loco_alloc(sizeof *x);
    if (!x)
        return LOCO_ERR(LOCO_ENOMEM, "ZeRO executor");
    x->reqs = loco_alloc(((size_t)plan->n_buckets + 1) * sizeof(loco_comm_req *));
    if (!x->reqs) {
        loco_free(x);
        return LOCO_ERR(LOCO_ENOMEM, "ZeRO executor of %d buckets", plan->n_buckets);
    }
    x->plan = plan;
    x->ops = ops;
    x->ctx = ctx;
    x->prefetch = prefetch;
    for (int i = 0; i < LOCO_ZERO_SLOTS; i++)
        x->slot[i].unit = x->slot[i].reducing = -1;
    *out = x;
    return 0;
}

void loco_zero_exec_destroy(loco_zero_exec *x) {
    if (!x)
        return;
    /* nothing in flight may outlive the buffers it moves */
    (void)loco_comm_waitall(x->reqs, x->plan->n_buckets);
    for (int i = 0; i < LOCO_ZERO_SLOTS; i++)
        (void)loco_comm_wait(x->slot[i].gather);
    loco_free(x->reqs);
    loco_free(x);
}

void loco_zero_exec_micro(loco_zero_exec *x, bool last) {
    x->last_micro = last;
    x->next = 0;
}

/* MPI moves non-blocking collectives forward only inside MPI calls:
 * testing the pending ones from every hook lets them progress while the
 * passes compute. */
static int progress(loco_zero_exec *x) {
    bool done;
    for (int b = 0; b < x->plan->n_buckets; b++)
        if (x->reqs[b])
            LOCO_CHECK(loco_comm_test(x->reqs[b], &done));
    for (int i = 0; i < LOCO_ZERO_SLOTS; i++)
        if (x->slot[i].gather)
            LOCO_CHECK(loco_comm_test(x->slot[i].gather, &done));
    return 0;
}

/* ------------------------------------------------ stage 3: parameters */

static int finish_gather(slot_state *s) {
    if (!s->gather)
        return 0;
    const int rc = loco_comm_wait(s->gather);
    s->gather = NULL;
    return rc;
}

static bool holds(const loco_zero_exec *x, const slot_state *s, int unit) {
    return s->unit == unit && s->version == x->ops->params_version(x->ctx);
}

static int start_gather(loco_zero_exec *x, int slot, int unit) {
    slot_state *s = &x->slot[slot];
    s->unit = unit;
    s->version = x->ops->params_version(x->ctx);
    return x->ops->all_gather_unit(x->ctx, slot, unit, &s->gather);
}

/* A unit's parameters present in its slot and bound. */
static int ensure_params(loco_zero_exec *x, int unit) {
    const int slot = loco_zero_plan_slot(x->plan, unit);
    slot_state *s = &x->slot[slot];
    if (!holds(x, s, unit)) {
        LOCO_CHECK(finish_gather(s)); /* a prefetch of another unit */
        LOCO_CHECK(start_gather(x, slot, unit));
    }
    LOCO_CHECK(finish_gather(s));
    return x->ops->bind_params(x->ctx, slot, unit);
}

static bool is_block(const loco_zero_exec *x, int unit) {
    return unit >= 1 && unit <= x->plan->n_units - 2;
}

static int prefetch(loco_zero_exec *x, int unit) {
    if (!x->prefetch || !is_block(x, unit))
        return 0;
    const int slot = loco_zero_plan_slot(x->plan, unit);
    slot_state *s = &x->slot[slot];
    if (holds(x, s, unit))
        return 0;
    LOCO_CHECK(finish_gather(s));
    return start_gather(x, slot, unit);
}

/* ------------------------------------------------- gradients */

/* Per unit: a slot's reduce-scatter completes and its part is added. */
static int finish_reduce(loco_zero_exec *x, int slot) {
    slot_state *s = &x->slot[slot];
    const int b = s->reducing;
    if (b < 0)
        return 0;
    s->reducing = -1;
    const int rc = loco_comm_wait(x->reqs[b]);
    x->reqs[b] = NULL;
    LOCO_CHECK(rc);
    return x->ops->reduced(x->ctx, b, slot);
}

static int launch(loco_zero_exec *x, int b, int unit) {
    if (x->reqs[b])
        return LOCO_ERR(LOCO_EINVAL, "ZeRO bucket %d started twice in a step", b);
    const int slot = x->plan->per_unit ? loco_zero_plan_slot(x->plan, unit) : -1;
    LOCO_CHECK(x->ops->reduce_bucket(x->ctx, b, slot, &x->reqs[b]));
    if (slot >= 0 && x->reqs[b])
        x->slot[slot].reducing = b;
    return 0;
}

int loco_zero_exec_acquire(loco_zero_exec *x, int unit, bool backward) {
    LOCO_CHECK(progress(x));
    if (x->plan->stage >= 3) {
        LOCO_CHECK(ensure_params(x, unit));
        if (is_block(x, unit))
            LOCO_CHECK(prefetch(x, backward ? unit - 1 : unit + 1));
    }
    if (x->plan->per_unit && backward) { /* a fresh gradient buffer for this backward */
        const int slot = loco_zero_plan_slot(x->plan, unit);
        LOCO_CHECK(finish_reduce(x, slot));
        LOCO_CHECK(x->ops->fresh_grads(x->ctx, slot, unit));
    }
    return 0;
}

int loco_zero_exec_grads_ready(loco_zero_exec *x, int unit) {
    const loco_zero_plan *p = x->plan;
    LOCO_CHECK(progress(x));
    if (p->n_units == 0 || p->order[x->next] != unit)
        return LOCO_ERR(LOCO_EINVAL, "gradients of unit %d ready, the ZeRO plan expects unit %d",
                        unit, p->n_units ? p->order[x->next] : -1);
    const int k = x->next;
    x->next = k + 1 < p->n_units ? k + 1 : 0; /* the next backward starts over */
    if (!p->per_unit && !x->last_micro)
        return 0; /* accumulate locally; reduce once per step */
    if (x->ops->prepare_unit)
        LOCO_CHECK(x->ops->prepare_unit(x->ctx, unit));
    const int b = p->unit_bucket[unit];
    return k == p->buckets[b].last ? launch(x, b, unit) : 0;
}

int loco_zero_exec_finish(loco_zero_exec *x) {
    const int rc = loco_comm_waitall(x->reqs, x->plan->n_buckets);
    for (int i = 0; i < LOCO_ZERO_SLOTS; i++) {
        slot_state *s = &x->slot[i];
        const int b = s->reducing;
        s->reducing = -1;
        if (rc == 0 && b >= 0)
            LOCO_CHECK(x->ops->reduced(x->ctx, b, i));
        LOCO_CHECK(finish_gather(s));
    }
    return rc;
}
