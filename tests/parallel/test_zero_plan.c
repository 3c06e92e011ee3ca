/* The ZeRO plan (inner/parallel/zero_plan.c) against references computed
 * here: owned ranges equal to loco_zero_owned (the outer loop's split)
 * that tile the buffer, buckets that tile it in launch order and close
 * exactly where a greedy fill of parallel.bucket_mb closes, per-rank
 * counts counted element by element, for awkward sizes and dp 1-4.
 * Then the walker both executors share (zero_exec.c), driven in the
 * model's hook order with an executor that records what it is asked to
 * move, once asynchronous (requests, as the host and nccl) and once
 * completing at once (as the device staged through host buffers): every
 * element is reduced exactly as often as the plan says, a unit buffer is
 * never reused before its reduction finished, gathers land in the
 * planned slot. The multi-rank sums are tests/parallel/test_zero.c's
 * (mpirun) and, on the device, tests/gpu/emu/dp_check.c. */
#include "inner/parallel/parallel.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_UNITS = 8, MAX_P = 512 };

/* Unit sizes (embeddings, blocks, last unit), 0-terminated. */
static const size_t layouts[][MAX_UNITS + 1] = {
    {7, 13, 13, 5, 0},          /* two blocks */
    {1, 1, 1, 0},               /* fewer parameters than ranks */
    {100, 37, 37, 37, 37, 3, 0}, /* four blocks */
    {2, 31, 31, 31, 1, 0},
};
enum { N_LAYOUTS = sizeof layouts / sizeof layouts[0] };
static const size_t bucket_sizes[] = {1, 10, 40, 64, 1u << 20};

static int layout(int i, size_t *bounds) {
    int n = 0;
    bounds[0] = 0;
    for (; layouts[i][n]; n++)
        bounds[n + 1] = bounds[n] + layouts[i][n];
    return n;
}

static void make_plan(loco_zero_plan *p, int li, int dp, int rank, int stage, size_t bucket,
                      bool unit_buffers) {
    size_t bounds[MAX_UNITS + 1];
    const int n = layout(li, bounds);
    const loco_zero_plan_spec s = {.n_params = bounds[n], .n_units = n, .unit_lo = bounds,
                                   .dp = dp, .rank = rank, .stage = stage,
                                   .bucket_elems = bucket, .unit_buffers = unit_buffers};
    cr_assert_eq(loco_zero_plan_init(p, &s), 0, "%s", loco_errmsg());
}

/* The rank owning element e under the outer loop's split. */
static int owner(size_t P, int dp, size_t e) {
    for (int r = 0; r < dp; r++) {
        size_t lo, hi;
        loco_zero_owned(P, r, dp, &lo, &hi);
        if (e >= lo && e < hi)
            return r;
    }
    return -1;
}

static void check_plan(const loco_zero_plan *p, size_t cap) {
    const size_t P = p->n_params;
    const int dp = p->dp;
    /* owned ranges: the outer loop's, tiling [0, P), sizes within one */
    for (int r = 0; r < dp; r++) {
        size_t lo, hi;
        loco_zero_owned(P, r, dp, &lo, &hi);
        cr_expect_eq(p->own[r], lo);
        cr_expect_eq(p->own[r + 1], hi);
        cr_expect(hi - lo == P / (size_t)dp || hi - lo == P / (size_t)dp + 1);
    }
    cr_expect_eq(p->own[0], 0);
    cr_expect_eq(p->own[dp], P);
    /* units in backward order */
    for (int k = 0; k < p->n_units; k++)
        cr_expect_eq(p->order[k], p->n_units - 1 - k);
    /* buckets tile [0, P) from the end, each holding its units */
    cr_assert_gt(p->n_buckets, 0);
    cr_expect_eq(p->buckets[0].hi, P);
    cr_expect_eq(p->buckets[p->n_buckets - 1].lo, 0);
    cr_expect_eq(p->buckets[0].first, 0);
    cr_expect_eq(p->buckets[p->n_buckets - 1].last, p->n_units - 1);
    for (int b = 0; b < p->n_buckets; b++) {
        const loco_zero_bucket *k = &p->buckets[b];
        if (b > 0) {
            cr_expect_eq(k->hi, p->buckets[b - 1].lo, "bucket %d", b);
            cr_expect_eq(k->first, p->buckets[b - 1].last + 1, "bucket %d", b);
        }
        cr_expect_eq(k->hi, p->unit_lo[p->order[k->first] + 1]);
        cr_expect_eq(k->lo, p->unit_lo[p->order[k->last]]);
        for (int i = k->first; i <= k->last; i++)
            cr_expect_eq(p->unit_bucket[p->order[i]], b);
        const size_t size = k->hi - k->lo;
        const int lowest = p->order[k->last];
        const size_t before = size - (p->unit_lo[lowest + 1] - p->unit_lo[lowest]);
        if (p->per_unit) {
            cr_expect_eq(k->first, k->last, "per unit: bucket %d holds one unit", b);
        } else {
            /* greedy: full when closed, not full one unit earlier */
            if (b < p->n_buckets - 1)
                cr_expect_geq(size, cap, "bucket %d closed at %zu < %zu", b, size, cap);
            cr_expect(k->first == k->last || before < cap, "bucket %d was full before its "
                      "last unit", b);
        }
        /* counts, element by element */
        size_t want[4] = {0};
        for (size_t e = k->lo; e < k->hi; e++)
            want[owner(P, dp, e)]++;
        const size_t *got = loco_zero_plan_counts(p, b);
        for (int r = 0; r < dp; r++)
            cr_expect_eq(got[r], want[r], "bucket %d rank %d: %zu, want %zu", b, r, got[r],
                         want[r]);
        /* this rank's part: from its first owned element of the bucket */
        size_t len, first = 0;
        const size_t off = loco_zero_plan_mine(p, b, &len);
        cr_expect_eq(len, want[p->rank]);
        for (size_t e = k->lo; e < k->hi; e++)
            if (owner(P, dp, e) == p->rank) {
                first = e - p->own[p->rank];
                break;
            }
        cr_expect_eq(off, len ? first : 0);
    }
}

Test(zero_plan, buckets_ranges_and_counts_against_a_reference) {
    for (int li = 0; li < N_LAYOUTS; li++)
        for (int dp = 1; dp <= 4; dp++)
            for (int stage = 0; stage <= 3; stage++)
                for (size_t bi = 0; bi < sizeof bucket_sizes / sizeof bucket_sizes[0]; bi++)
                    for (int ub = 0; ub < 2; ub++) {
                        if (stage == 3 && !ub)
                            continue;
                        loco_zero_plan p;
                        const int rank = (li + (int)bi) % dp;
                        make_plan(&p, li, dp, rank, stage, bucket_sizes[bi], ub);
                        cr_expect_eq(p.per_unit, ub && stage >= 2);
                        cr_expect_eq(p.scatter, stage >= 2);
                        check_plan(&p, bucket_sizes[bi]);
                        loco_zero_plan_fini(&p);
                    }
}

Test(zero_plan, ranks_share_buckets_and_counts) {
    for (int li = 0; li < N_LAYOUTS; li++)
        for (int dp = 2; dp <= 4; dp++) {
            loco_zero_plan a, b;
            make_plan(&a, li, dp, 0, 1, 10, false);
            for (int r = 1; r < dp; r++) {
                make_plan(&b, li, dp, r, 1, 10, false);
                cr_expect(!loco_zero_plan_equal(&a, &b)); /* the rank differs */
                b.rank = 0;
                cr_expect(loco_zero_plan_equal(&a, &b), "layout %d dp %d rank %d", li, dp, r);
                b.rank = r;
                loco_zero_plan_fini(&b);
            }
            loco_zero_plan_fini(&a);
        }
}

Test(zero_plan, equal_and_printed) {
    loco_zero_plan a, b, c;
    make_plan(&a, 2, 3, 1, 0, 40, false);
    make_plan(&b, 2, 3, 1, 0, 40, false);
    make_plan(&c, 2, 3, 1, 0, 64, false);
    cr_expect(loco_zero_plan_equal(&a, &b));
    cr_expect(!loco_zero_plan_equal(&a, &c));
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    cr_assert_not_null(f);
    loco_zero_plan_print(&a, f);
    fclose(f);
    /* units 5 4 (3 + 37 reaches 40), 3 2 (74), then 1 0 (closed by unit 0) */
    cr_expect(strstr(text, "owned: [0, 83) [83, 167) [167, 251)"), "%s", text);
    cr_expect(strstr(text, "bucket 0: [211, 251) units 5 4, counts 0 0 40"), "%s", text);
    cr_expect(strstr(text, "bucket 1: [137, 211) units 3 2, counts 0 30 44"), "%s", text);
    cr_expect(strstr(text, "bucket 2: [0, 137) units 1 0, counts 83 54 0"), "%s", text);
    free(text);
    loco_zero_plan_fini(&a);
    loco_zero_plan_fini(&b);
    loco_zero_plan_fini(&c);
}

Test(zero_plan, refusals) {
    loco_zero_plan p;
    size_t gap[] = {0, 5, 4, 9};  /* unit 1 ends before it starts */
    size_t short_[] = {0, 5, 8};  /* ends at 8 of 9 */
    loco_zero_plan_spec s = {.n_params = 9, .n_units = 3, .unit_lo = gap, .dp = 2, .stage = 1};
    cr_expect_eq(loco_zero_plan_init(&p, &s), LOCO_EINVAL);
    cr_expect(strstr(loco_errmsg(), "tile"), "%s", loco_errmsg());
    s.unit_lo = short_, s.n_units = 2;
    cr_expect_eq(loco_zero_plan_init(&p, &s), LOCO_EINVAL);
    size_t ok[] = {0, 5, 9};
    s.unit_lo = ok;
    s.rank = 2;
    cr_expect_eq(loco_zero_plan_init(&p, &s), LOCO_EINVAL);
    s.rank = 0, s.stage = 3;
    cr_expect_eq(loco_zero_plan_init(&p, &s), LOCO_EINVAL);
    cr_expect(strstr(loco_errmsg(), "stage 3"), "%s", loco_errmsg());
    s.unit_buffers = true;
    cr_expect_eq(loco_zero_plan_init(&p, &s), 0, "%s", loco_errmsg());
    loco_zero_plan_fini(&p);
    loco_zero_plan_fini(NULL);
}

/* ------------------------------------------------- the walker */

typedef struct {
    const loco_zero_plan *p;
    loco_comm *self;
    bool sync;            /* completes at once, as the staged device */
    bool last_micro;
    int last_ready;       /* the unit most recently reported ready */
    int next_bucket;      /* the bucket expected to start next */
    int slot_bucket[LOCO_ZERO_SLOTS]; /* whose reduction reads the slot, -1 */
    int slot_unit[LOCO_ZERO_SLOTS];   /* whose parameters it was given */
    uint64_t version;
    int gathers, binds;
    float dummy[LOCO_ZERO_SLOTS + 1];
    int hits[MAX_P];      /* times element e was reduced (this rank's view) */
} recorder;

/* A real request on the self communicator, or none when synchronous. */
static int start(recorder *r, int i, loco_comm_req **req) {
    if (r->sync)
        return 0;
    return loco_comm_iallreduce(r->self, &r->dummy[i], 1, LOCO_DT_F32, LOCO_OP_AVG, req);
}

/* Elements of bucket b this rank receives reduced. */
static void account(recorder *r, int b) {
    const loco_zero_bucket *k = &r->p->buckets[b];
    if (!r->p->scatter) {
        for (size_t e = k->lo; e < k->hi; e++)
            r->hits[e]++;
        return;
    }
    size_t len;
    const size_t at = r->p->own[r->p->rank] + loco_zero_plan_mine(r->p, b, &len);
    for (size_t e = at; e < at + len; e++)
        r->hits[e]++;
}

static int rec_reduce(void *ctx, int b, int slot, loco_comm_req **req) {
    recorder *r = ctx;
    const loco_zero_plan *p = r->p;
    cr_expect_eq(b, r->next_bucket, "bucket %d started, plan order says %d", b, r->next_bucket);
    r->next_bucket = (b + 1) % p->n_buckets;
    cr_expect(p->per_unit || r->last_micro, "bucket %d before the last micro-batch", b);
    cr_expect_eq(r->last_ready, p->order[p->buckets[b].last], "bucket %d before its units", b);
    if (!p->per_unit) {
        cr_expect_eq(slot, -1);
        account(r, b);
        return start(r, LOCO_ZERO_SLOTS, req);
    }
    cr_expect_eq(slot, loco_zero_plan_slot(p, r->last_ready));
    cr_expect_eq(r->slot_bucket[slot], -1, "slot %d read by two reductions", slot);
    if (r->sync) {
        account(r, b);
        return 0;
    }
    r->slot_bucket[slot] = b;
    return start(r, slot, req);
}

static int rec_reduced(void *ctx, int b, int slot) {
    recorder *r = ctx;
    cr_expect_eq(r->slot_bucket[slot], b, "slot %d: bucket %d done, %d in flight", slot, b,
                 r->slot_bucket[slot]);
    r->slot_bucket[slot] = -1;
    account(r, b);
    return 0;
}

static int rec_fresh_grads(void *ctx, int slot, int unit) {
    recorder *r = ctx;
    cr_expect(r->p->per_unit);
    cr_expect_eq(slot, loco_zero_plan_slot(r->p, unit));
    cr_expect_eq(r->slot_bucket[slot], -1, "unit %d's buffer reused while reduced", unit);
    return 0;
}

static int rec_gather(void *ctx, int slot, int unit, loco_comm_req **req) {
    recorder *r = ctx;
    cr_expect_eq(r->p->stage, 3);
    cr_expect_eq(slot, loco_zero_plan_slot(r->p, unit));
    r->slot_unit[slot] = unit;
    r->gathers++;
    return start(r, slot, req);
}

static int rec_bind(void *ctx, int slot, int unit) {
    recorder *r = ctx;
    cr_expect_eq(r->slot_unit[slot], unit, "unit %d bound to slot %d holding %d", unit, slot,
                 r->slot_unit[slot]);
    r->binds++;
    return 0;
}

static uint64_t rec_version(void *ctx) { return ((recorder *)ctx)->version; }

static const loco_zero_exec_ops rec_ops = {
    .reduce_bucket = rec_reduce,
    .reduced = rec_reduced,
    .fresh_grads = rec_fresh_grads,
    .all_gather_unit = rec_gather,
    .bind_params = rec_bind,
    .params_version = rec_version,
};

static int ready(loco_zero_exec *x, recorder *r, int unit) {
    r->last_ready = unit;
    return loco_zero_exec_grads_ready(x, unit);
}

/* One forward-backward in the model's hook order (inner/model.c). */
static void pass(loco_zero_exec *x, recorder *r, int n) {
    for (int u = 0; u < n; u++)
        cr_assert_eq(loco_zero_exec_acquire(x, u, false), 0, "%s", loco_errmsg());
    cr_assert_eq(loco_zero_exec_acquire(x, 0, true), 0, "%s", loco_errmsg());
    cr_assert_eq(loco_zero_exec_acquire(x, n - 1, true), 0, "%s", loco_errmsg());
    cr_assert_eq(ready(x, r, n - 1), 0, "%s", loco_errmsg());
    for (int u = n - 2; u >= 1; u--) {
        cr_assert_eq(loco_zero_exec_acquire(x, u, true), 0, "%s", loco_errmsg());
        cr_assert_eq(ready(x, r, u), 0, "%s", loco_errmsg());
    }
    cr_assert_eq(ready(x, r, 0), 0, "%s", loco_errmsg());
}

static void walk(int li, int dp, int rank, int stage, bool unit_buffers, bool sync, int accum) {
    loco_zero_plan p;
    make_plan(&p, li, dp, rank, stage, 40, unit_buffers);
    recorder r = {.p = &p, .sync = sync, .version = 1};
    for (int i = 0; i < LOCO_ZERO_SLOTS; i++)
        r.slot_bucket[i] = r.slot_unit[i] = -1;
    cr_assert_eq(loco_comm_world(&r.self, "self"), 0, "%s", loco_errmsg());
    loco_zero_exec *x;
    cr_assert_eq(loco_zero_exec_create(&x, &p, &rec_ops, &r, !sync), 0, "%s", loco_errmsg());
    for (int step = 0; step < 2; step++) {
        memset(r.hits, 0, sizeof r.hits);
        r.gathers = r.binds = 0;
        for (int m = 0; m < accum; m++) {
            r.last_micro = m == accum - 1;
            loco_zero_exec_micro(x, r.last_micro);
            pass(x, &r, p.n_units);
        }
        cr_assert_eq(loco_zero_exec_finish(x), 0, "%s", loco_errmsg());
        for (int i = 0; i < LOCO_ZERO_SLOTS; i++)
            cr_expect_eq(r.slot_bucket[i], -1, "slot %d still reduced after finish", i);
        /* every element of what this rank receives, as often as planned */
        const size_t lo = p.scatter ? p.own[rank] : 0, hi = p.scatter ? p.own[rank + 1] : p.n_params;
        const int want = p.per_unit ? accum : 1;
        for (size_t e = 0; e < p.n_params; e++)
            cr_expect_eq(r.hits[e], e >= lo && e < hi ? want : 0,
                         "layout %d dp %d rank %d ZeRO-%d%s: element %zu reduced %d times", li,
                         dp, rank, stage, sync ? " sync" : "", e, r.hits[e]);
        if (stage == 3) { /* every pass binds each unit: forward n, backward n */
            cr_expect_eq(r.binds, 2 * p.n_units * accum);
            cr_expect_geq(r.gathers, p.n_units, "step %d: parameters changed, regathered", step);
        } else {
            cr_expect_eq(r.gathers + r.binds, 0);
        }
        r.version++; /* the optimizer step rewrote the owned parameters */
    }
    loco_zero_exec_destroy(x);
    loco_comm_destroy(r.self);
    loco_zero_plan_fini(&p);
}

Test(zero_plan, walker_reduces_exactly_the_planned_ranges) {
    for (int li = 0; li < N_LAYOUTS; li++)
        for (int dp = 1; dp <= 4; dp++)
            for (int stage = 0; stage <= 3; stage++)
                for (int sync = 0; sync < 2; sync++) {
                    const int rank = (li + stage) % dp;
                    walk(li, dp, rank, stage, true, sync, 1 + (li + stage) % 3);
                    if (stage == 2) /* the device keeps whole gradients: buckets */
                        walk(li, dp, rank, stage, false, sync, 2);
                }
}

Test(zero_plan, walker_refuses_gradients_out_of_the_planned_order) {
    loco_zero_plan p;
    make_plan(&p, 0, 2, 0, 1, 40, false);
    recorder r = {.p = &p, .version = 1};
    cr_assert_eq(loco_comm_world(&r.self, "self"), 0, "%s", loco_errmsg());
    loco_zero_exec *x;
    cr_assert_eq(loco_zero_exec_create(&x, &p, &rec_ops, &r, true), 0, "%s", loco_errmsg());
    loco_zero_exec_micro(x, true);
    cr_expect_eq(loco_zero_exec_grads_ready(x, 0), LOCO_EINVAL);
    cr_expect(strstr(loco_errmsg(), "expects unit 3"), "%s", loco_errmsg());
    loco_zero_exec_micro(x, true); /* a new micro-batch starts over */
    r.last_ready = 3;
    cr_expect_eq(loco_zero_exec_grads_ready(x, 3), 0, "%s", loco_errmsg());
    loco_zero_exec_destroy(x); /* waits for the bucket it started */
    loco_comm_destroy(r.self);
    loco_zero_plan_fini(&p);
}
