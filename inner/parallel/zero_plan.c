/* The ZeRO plan (docs/ZERO.md): which flat ranges are reduced together,
 * in which order, and how each splits over the dp ranks' owned ranges.
 * Computed once from the unit layout; the host (zero.c) and the device
 * (train_device.c) only execute it, so both make the same collectives
 * over the same ranges in the same order. */
#include "inner/parallel/parallel.h"

#include <string.h>

size_t loco_zero_plan_split(const loco_zero_plan *p, size_t a, size_t b, size_t *counts) {
    for (int r = 0; r < p->dp; r++) {
        const size_t x = a > p->own[r] ? a : p->own[r];
        const size_t y = b < p->own[r + 1] ? b : p->own[r + 1];
        counts[r] = y > x ? y - x : 0;
    }
    const size_t lo = p->own[p->rank];
    return counts[p->rank] ? (a > lo ? a : lo) - lo : 0;
}

size_t loco_zero_plan_mine(const loco_zero_plan *p, int b, size_t *len) {
    const size_t lo = p->own[p->rank];
    *len = p->counts[(size_t)b * (size_t)p->dp + (size_t)p->rank];
    return *len ? (p->buckets[b].lo > lo ? p->buckets[b].lo : lo) - lo : 0;
}

void loco_zero_plan_fini(loco_zero_plan *p) {
    if (!p)
        return;
    loco_free(p->own);
    loco_free(p->unit_lo);
    loco_free(p->order);
    loco_free(p->unit_bucket);
    loco_free(p->buckets);
    loco_free(p->counts);
    memset(p, 0, sizeof *p);
}

/* Groups the units, in ready order, into buckets of contiguous range:
 * one per unit with unit buffers, else closed once a bucket holds
 * bucket_elems or the last unit joined. Ready order is backward's (the
 * last unit first), so a bucket grows towards the buffer's start. */
static void plan_buckets(loco_zero_plan *p) {
    const int n = p->n_units;
    loco_zero_bucket *open = NULL;
    for (int k = 0; k < n; k++) {
        const int u = p->order[k];
        if (!open) {
            open = &p->buckets[p->n_buckets++];
            open->hi = p->unit_lo[u + 1];
            open->first = k;
        }
        open->lo = p->unit_lo[u];
        open->last = k;
        p->unit_bucket[u] = p->n_buckets - 1;
        if (p->per_unit || open->hi - open->lo >= p->bucket_elems || k == n - 1)
            open = NULL;
    }
    for (int b = 0; b < p->n_buckets; b++)
        loco_zero_plan_split(p, p->buckets[b].lo, p->buckets[b].hi,
                             p->counts + (size_t)b * (size_t)p->dp);
}

int loco_zero_plan_init(loco_zero_plan *p, const loco_zero_plan_spec *s) {
    memset(p, 0, sizeof *p);
    if (s->dp < 1 || s->rank < 0 || s->rank >= s->dp || s->stage < 0 || s->stage > 3 ||
        s->n_units < 0 || (s->n_units > 0 && !s->unit_lo))
        return LOCO_ERR(LOCO_EINVAL, "ZeRO plan: rank %d of %d, stage %d, %d units", s->rank,
                        s->dp, s->stage, s->n_units);
    if (s->stage >= 3 && s->n_units > 0 && !s->unit_buffers)
        return LOCO_ERR(LOCO_EINVAL, "ZeRO plan: stage 3 reduces every unit from its own buffer");
    for (int u = 0; u < s->n_units; u++)
        if (s->unit_lo[u] > s->unit_lo[u + 1] || s->unit_lo[0] != 0 ||
            s->unit_lo[s->n_units] != s->n_params)
            return LOCO_ERR(LOCO_EINVAL,
                            "ZeRO plan: units must tile [0, %zu) in order (unit %d is [%zu, %zu) "
                            "of %d)",
                            s->n_params, u, s->unit_lo[u], s->unit_lo[u + 1], s->n_units);
    const int n = s->n_units;
    p->dp = s->dp;
    p->rank = s->rank;
    p->stage = s->stage;
    p->n_params = s->n_params;
    p->bucket_elems = s->bucket_elems ? s->bucket_elems : 1;
    p->per_unit = s->unit_buffers && s->stage >= 2;
    p->scatter = s->stage >= 2;
    p->n_units = n;
    p->own = loco_alloc(((size_t)s->dp + 1) * sizeof(size_t));
    p->unit_lo = loco_alloc(((size_t)n + 1) * sizeof(size_t));
    p->order = loco_alloc(((size_t)n + 1) * sizeof(int));
    p->unit_bucket = loco_alloc(((size_t)n + 1) * sizeof(int));
    p->buckets = loco_alloc(((size_t)n + 1) * sizeof(loco_zero_bucket));
    p->counts = loco_alloc(((size_t)n + 1) * (size_t)s->dp * sizeof(size_t));
    if (!p->own || !p->unit_lo || !p->order || !p->unit_bucket || !p->buckets || !p->counts) {
        loco_zero_plan_fini(p);
        return LOCO_ERR(LOCO_ENOMEM, "ZeRO plan of %d units over %d ranks", n, s->dp);
    }
    for (int r = 0; r <= s->dp; r++)
        p->own[r] = s->n_params * (size_t)r / (size_t)s->dp; /* loco_zero_owned */
    if (n > 0)
        memcpy(p->unit_lo, s->unit_lo, ((size_t)n + 1) * sizeof(size_t));
    for (int k = 0; k < n; k++)
        p->order[k] = n - 1 - k;
    plan_buckets(p);
    return 0;
}

int loco_zero_plan_slot(const loco_zero_plan *p, int unit) {
    if (unit == 0)
        return LOCO_ZERO_SLOT_EMBED;
    if (unit == p->n_units - 1)
        return LOCO_ZERO_SLOT_LAST;
    return LOCO_ZERO_SLOT_BLOCK0 + unit % 2;
}

bool loco_zero_plan_equal(const loco_zero_plan *a, const loco_zero_plan *b) {
    if (a->dp != b->dp || a->rank != b->rank || a->stage != b->stage ||
        a->n_params != b->n_params || a->bucket_elems != b->bucket_elems ||
        a->per_unit != b->per_unit || a->scatter != b->scatter || a->n_units != b->n_units ||
        a->n_buckets != b->n_buckets)
        return false;
    const size_t n = (size_t)a->n_units, nb = (size_t)a->n_buckets;
    if (memcmp(a->own, b->own, ((size_t)a->dp + 1) * sizeof(size_t)) ||
        memcmp(a->unit_lo, b->unit_lo, (n + 1) * sizeof(size_t)) ||
        memcmp(a->order, b->order, n * sizeof(int)) ||
        memcmp(a->unit_bucket, b->unit_bucket, n * sizeof(int)) ||
        memcmp(a->counts, b->counts, nb * (size_t)a->dp * sizeof(size_t)))
        return false;
    for (size_t i = 0; i < nb; i++)
        if (a->buckets[i].lo != b->buckets[i].lo || a->buckets[i].hi != b->buckets[i].hi ||
            a->buckets[i].first != b->buckets[i].first || a->buckets[i].last != b->buckets[i].last)
            return false;
    return true;
}

void loco_zero_plan_print(const loco_zero_plan *p, FILE *f) {
    fprintf(f, "zero plan: stage %d, rank %d of %d, %zu params, bucket %zu elems, %s, %s\n",
            p->stage, p->rank, p->dp, p->n_params, p->bucket_elems,
            p->per_unit ? "per unit every micro-batch" : "buckets on the last micro-batch",
            p->scatter ? "reduce-scatter" : "all-reduce");
    fprintf(f, "owned:");
    for (int r = 0; r < p->dp; r++)
        fprintf(f, " [%zu, %zu)", p->own[r], p->own[r + 1]);
    fprintf(f, "\n");
    for (int b = 0; b < p->n_buckets; b++) {
        const loco_zero_bucket *k = &p->buckets[b];
        fprintf(f, "bucket %d: [%zu, %zu) units", b, k->lo, k->hi);
        for (int i = k->first; i <= k->last; i++)
            fprintf(f, " %d", p->order[i]);
        fprintf(f, ", counts");
        for (int r = 0; r < p->dp; r++)
            fprintf(f, " %zu", p->counts[(size_t)b * (size_t)p->dp + (size_t)r]);
        fprintf(f, "\n");
    }
}
