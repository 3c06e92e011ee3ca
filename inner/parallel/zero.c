/* Data parallelism and ZeRO stages 0-3 over the flat buffers, hooked into
 * the model's passes unit by unit (see loco_gpt_hooks).
 *
 * Stage 0 (DDP) and 1: full gradients; on the last micro-batch, finished
 * units join a bucket of contiguous flat range that is all-reduced (AVG)
 * without blocking once it holds parallel.bucket_mb, overlapping the rest
 * of backward. Stage 1 then updates only the owned range and all-gathers.
 * Stage 2: no full gradient buffer. Each unit's gradients go to a unit
 * buffer, which is reduce-scattered (AVG) without blocking into a staging
 * buffer and added into the owned gradient shard when the buffer is next
 * needed or the step ends; block units alternate between two buffers.
 * Stage 3: as 2, and parameters are sharded too: a block's parameters are
 * all-gathered into one of two slots before the pass uses them, with the
 * next block's gather started at once (prefetch); the embeddings and ln_f
 * stay gathered for the whole step (the tied head needs wte at both ends).
 *
 * A pipeline stage's model keeps whole buffers (micro-batches interleave
 * through the step) and reports ranges instead of calling hooks: each
 * chunk's gradients are reduced as soon as its last backward ends, while
 * the rest of the pipeline drains; at stage 3 the owned shards are
 * gathered chunk by chunk when the next step first needs them. */
#include "inner/parallel/parallel.h"
#include "kernels/kernels.h"

#include <math.h>
#include <string.h>

#define MAX_BUCKETS 4096
#define MAX_GATHERS (2 * LOCO_GPT_MAX_CHUNKS + 2)

/* A unit's buffers at stages 2-3: gradients, reduce-scatter staging and,
 * at stage 3, gathered parameters. */
typedef struct {
    float *params;       /* unit-sized (stage 3) */
    float *grads;        /* unit-sized */
    float *staging;      /* receives this rank's part of the reduced unit */
    int param_unit;      /* unit whose parameters `params` holds, -1 none */
    loco_comm_req *gather;  /* in-flight all-gather into params */
    loco_comm_req *reduce;  /* in-flight reduce-scatter out of grads */
    size_t reduce_off, reduce_len; /* where staging lands in the owned shard */
} slot;

struct loco_zero {
    loco_gpt *m;
    loco_comm *dp;
    int stage, rank, n;
    size_t P;        /* parameters */
    size_t lo, hi;   /* owned range */
    size_t *own_lo;  /* (n + 1) owned boundaries of every rank */
    size_t *counts;  /* (n) scratch for v-collective counts */
    loco_adamw opt;
    size_t opt_lo, opt_hi;
    float *pshard;   /* stage 3: owned parameters */
    float *gshard;   /* stages 2-3: owned gradients */
    slot blocks[2];  /* stages 2-3: block units alternate */
    slot embed, lnf; /* stages 2-3: units 0 and L+1 */
    size_t bucket_elems;
    size_t bucket_lo, bucket_hi; /* open bucket (stages 0-1), empty when equal */
    loco_comm_req *buckets[MAX_BUCKETS];
    int n_buckets;
    bool last_micro, first_micro;
    size_t gathered_bytes;
    float *rep_buf;  /* tp: the replicated pieces of the owned range */
    size_t n_rep;
    loco_comm *pp;   /* pipeline group: the gradient norm sums over it (not owned) */
    size_t ready_elems; /* pipeline: gradients reported final this step */
    bool stale;      /* pipeline, stage 3: the model's buffer is behind the shards */
    struct {
        size_t lo, hi;
        loco_comm_req *req;
    } gathers[MAX_GATHERS]; /* pipeline, stage 3: this step's, in flight or done */
    int n_gathers;
    loco_comm *ep;   /* expert parallelism (not owned), NULL without */
    bool *expert;    /* (tensors) ep: whether tensor i is an expert's */
};

void loco_zero_owned(size_t total, int r, int n, size_t *lo, size_t *hi) {
    *lo = total * (size_t)r / (size_t)n;
    *hi = total * (size_t)(r + 1) / (size_t)n;
}

unsigned loco_zero_model_flags(int stage) {
    if (stage >= 3)
        return LOCO_GPT_NO_PARAMS | LOCO_GPT_NO_GRADS;
    if (stage == 2)
        return LOCO_GPT_NO_GRADS;
    return 0;
}

int loco_zero_stage(const loco_zero *z) { return z->stage; }

void loco_zero_range(const loco_zero *z, size_t *lo, size_t *hi) {
    *lo = z->lo;
    *hi = z->hi;
}

float *loco_zero_owned_params(loco_zero *z) {
    return z->stage >= 3 ? z->pshard : loco_gpt_params(z->m) + z->lo;
}

void loco_zero_held_params(loco_zero *z, size_t *lo, size_t *hi, float **data) {
    if (z->stage >= 3) {
        *lo = z->lo, *hi = z->hi, *data = z->pshard;
    } else {
        *lo = 0, *hi = z->P, *data = loco_gpt_params(z->m);
    }
}

loco_adamw *loco_zero_optimizer(loco_zero *z, size_t *lo, size_t *hi) {
    if (lo)
        *lo = z->opt_lo;
    if (hi)
        *hi = z->opt_hi;
    return &z->opt;
}

/* Per-rank counts of the intersection of [a, b) with each owned range. */
static void split_counts(loco_zero *z, size_t a, size_t b) {
    for (int r = 0; r < z->n; r++) {
        size_t x = a > z->own_lo[r] ? a : z->own_lo[r];
        size_t y = b < z->own_lo[r + 1] ? b : z->own_lo[r + 1];
        z->counts[r] = y > x ? y - x : 0;
    }
}

/* Completes a slot's reduce-scatter and adds its part into the shard. */
static int finish_reduce(loco_zero *z, slot *s) {
    if (!s->reduce)
        return 0;
    int rc = loco_comm_wait(s->reduce);
    s->reduce = NULL;
    LOCO_CHECK(rc);
    float *dst = z->gshard + s->reduce_off;
    for (size_t i = 0; i < s->reduce_len; i++)
        dst[i] += s->staging[i];
    return 0;
}

static int start_reduce(loco_zero *z, slot *s, int unit) {
    size_t a, b;
    loco_gpt_unit_range(z->m, unit, &a, &b);
    split_counts(z, a, b);
    size_t mine_lo = a > z->lo ? a : z->lo;
    s->reduce_off = mine_lo - z->lo;
    s->reduce_len = z->counts[z->rank];
    return loco_comm_ireduce_scatter(z->dp, s->grads, s->staging, z->counts, LOCO_DT_F32,
                                     LOCO_OP_AVG, &s->reduce);
}

/* Starts gathering a unit's parameters into a slot (stage 3). */
static int start_gather(loco_zero *z, slot *s, int unit) {
    size_t a, b;
    loco_gpt_unit_range(z->m, unit, &a, &b);
    split_counts(z, a, b);
    size_t mine_lo = a > z->lo ? a : z->lo;
    s->param_unit = unit;
    return loco_comm_iallgather(z->dp, z->pshard + (mine_lo - z->lo), s->params, z->counts,
                                LOCO_DT_F32, &s->gather);
}

static int finish_gather(slot *s) {
    if (!s->gather)
        return 0;
    int rc = loco_comm_wait(s->gather);
    s->gather = NULL;
    return rc;
}

static slot *unit_slot(loco_zero *z, int unit) {
    const int L = loco_gpt_cfg(z->m)->n_layer;
    if (unit == 0)
        return &z->embed;
    if (unit == L + 1)
        return &z->lnf;
    return &z->blocks[unit % 2];
}

/* Makes a unit's parameters present in its slot (stage 3). */
static int ensure_params(loco_zero *z, int unit) {
    slot *s = unit_slot(z, unit);
    if (s->param_unit != unit) {
        LOCO_CHECK(finish_gather(s)); /* a prefetch of another unit */
        LOCO_CHECK(start_gather(z, s, unit));
    }
    LOCO_CHECK(finish_gather(s));
    loco_gpt_bind_unit(z->m, unit, s->params, NULL);
    return 0;
}

static int prefetch(loco_zero *z, int unit) {
    const int L = loco_gpt_cfg(z->m)->n_layer;
    if (unit < 1 || unit > L)
        return 0;
    slot *s = unit_slot(z, unit);
    if (s->param_unit == unit)
        return 0;
    LOCO_CHECK(finish_gather(s));
    return start_gather(z, s, unit);
}

/* MPI moves non-blocking collectives forward only inside MPI calls; testing
 * the pending requests from every hook lets them progress while backward
 * computes the next unit. */
static int progress(loco_zero *z) {
    bool done;
    for (int i = 0; i < z->n_buckets; i++)
        LOCO_CHECK(loco_comm_test(z->buckets[i], &done));
    slot *all[4] = {&z->blocks[0], &z->blocks[1], &z->embed, &z->lnf};
    for (int i = 0; i < 4; i++) {
        if (all[i]->reduce)
            LOCO_CHECK(loco_comm_test(all[i]->reduce, &done));
        if (all[i]->gather)
            LOCO_CHECK(loco_comm_test(all[i]->gather, &done));
    }
    return 0;
}

static int hook_acquire(void *ctx, loco_gpt *m, int unit, bool backward) {
    loco_zero *z = ctx;
    LOCO_CHECK(progress(z));
    const int L = loco_gpt_cfg(m)->n_layer;
    if (z->stage >= 3) {
        if (unit == 0 || unit == L + 1) {
            LOCO_CHECK(ensure_params(z, unit));
        } else {
            LOCO_CHECK(ensure_params(z, unit));
            LOCO_CHECK(prefetch(z, backward ? unit - 1 : unit + 1));
        }
    }
    if (z->stage >= 2 && backward) {
        /* Fresh gradient buffer for this unit's backward. */
        slot *s = unit_slot(z, unit);
        LOCO_CHECK(finish_reduce(z, s));
        size_t a, b;
        loco_gpt_unit_range(m, unit, &a, &b);
        memset(s->grads, 0, (b - a) * sizeof(float));
        /* Stage 3 bound the slot's parameters above; stage 2's are whole. */
        loco_gpt_bind_unit(m, unit, z->stage >= 3 ? s->params : loco_gpt_params(m) + a, s->grads);
    }
    return 0;
}

static int launch_bucket(loco_zero *z) {
    if (z->bucket_hi == z->bucket_lo)
        return 0;
    if (z->n_buckets == MAX_BUCKETS)
        return LOCO_ERR(LOCO_EINVAL, "more than %d gradient buckets: raise parallel.bucket_mb",
                        MAX_BUCKETS);
    LOCO_CHECK(loco_comm_iallreduce(z->dp, loco_gpt_grads(z->m) + z->bucket_lo,
                                    z->bucket_hi - z->bucket_lo, LOCO_DT_F32, LOCO_OP_AVG,
                                    &z->buckets[z->n_buckets]));
    z->n_buckets++;
    z->bucket_lo = z->bucket_hi = 0;
    return 0;
}

/* Expert parallelism, before a unit's gradients (g holds the unit) go to
 * the expert-dp group: its dense tensors are averaged over ep (with the
 * expert-dp average, over every data-parallel rank), its experts' scaled
 * by 1/ep (an expert's rank summed its whole ep group's tokens; the
 * expert-dp average then makes the mean over every rank's). */
static int ep_prereduce_range(loco_zero *z, size_t a, size_t b, float *g) {
    const loco_ttable *tt = loco_gpt_table(z->m);
    int i, end;
    if (a == b)
        return 0;
    for (i = 0; i < tt->n && tt->t[i].offset + tt->t[i].numel <= a; i++)
        ;
    const float inv = 1.0f / (float)loco_comm_size(z->ep);
    while (i < tt->n && tt->t[i].offset < b) {
        for (end = i; end < tt->n && tt->t[end].offset < b && z->expert[end] == z->expert[i];)
            end++;
        size_t lo = tt->t[i].offset, hi = tt->t[end - 1].offset + tt->t[end - 1].numel;
        lo = lo > a ? lo : a, hi = hi < b ? hi : b;
        if (z->expert[i])
            loco_scale(g + (lo - a), inv, hi - lo);
        else
            LOCO_CHECK(loco_comm_allreduce(z->ep, g + (lo - a), hi - lo, LOCO_DT_F32, LOCO_OP_AVG));
        i = end;
    }
    return 0;
}

static int ep_prereduce(loco_zero *z, int unit, float *g) {
    size_t a, b;
    loco_gpt_unit_range(z->m, unit, &a, &b);
    return ep_prereduce_range(z, a, b, g);
}

static int hook_grads_ready(void *ctx, loco_gpt *m, int unit) {
    loco_zero *z = ctx;
    if (z->n == 1 && z->stage < 2 && !z->ep)
        return 0;
    LOCO_CHECK(progress(z));
    if (z->ep && (z->stage >= 2 || z->last_micro)) {
        size_t a, b;
        loco_gpt_unit_range(m, unit, &a, &b);
        LOCO_CHECK(ep_prereduce(z, unit,
                                z->stage >= 2 ? unit_slot(z, unit)->grads : loco_gpt_grads(m) + a));
    }
    if (z->stage >= 2)
        return start_reduce(z, unit_slot(z, unit), unit);
    if (!z->last_micro || z->n == 1)
        return 0; /* accumulate locally; reduce once per step */
    size_t a, b;
    loco_gpt_unit_range(m, unit, &a, &b);
    /* Units finish from the end of the flat buffer towards its start, so
     * a bucket grows downwards and stays contiguous. */
    if (z->bucket_hi == z->bucket_lo)
        z->bucket_hi = b;
    z->bucket_lo = a;
    if (z->bucket_hi - z->bucket_lo >= z->bucket_elems || unit == 0)
        LOCO_CHECK(launch_bucket(z));
    return 0;
}

void loco_zero_micro_begin(loco_zero *z, bool first, bool last) {
    z->first_micro = first;
    z->last_micro = last;
    if (first && z->gshard)
        memset(z->gshard, 0, (z->hi - z->lo) * sizeof(float));
}

static int alloc_slot(loco_zero *z, slot *s, size_t elems, bool with_params) {
    s->param_unit = -1;
    s->grads = loco_alloc(elems * sizeof(float));
    s->staging = loco_alloc(elems * sizeof(float));
    if (with_params)
        s->params = loco_alloc(elems * sizeof(float));
    if (!s->grads || !s->staging || (with_params && !s->params))
        return LOCO_ERR(LOCO_ENOMEM, "ZeRO unit buffers of %zu elements", elems);
    z->gathered_bytes += (with_params ? 3 : 2) * elems * sizeof(float);
    return 0;
}

static void free_slot(slot *s) {
    loco_comm_wait(s->gather);
    loco_comm_wait(s->reduce);
    loco_free(s->params);
    loco_free(s->grads);
    loco_free(s->staging);
    memset(s, 0, sizeof *s);
}

void loco_zero_destroy(loco_zero *z) {
    if (!z)
        return;
    loco_comm_waitall(z->buckets, z->n_buckets);
    loco_gpt_set_hooks(z->m, NULL);
    free_slot(&z->blocks[0]);
    free_slot(&z->blocks[1]);
    free_slot(&z->embed);
    free_slot(&z->lnf);
    loco_adamw_fini(&z->opt);
    loco_free(z->pshard);
    loco_free(z->gshard);
    loco_free(z->own_lo);
    loco_free(z->counts);
    loco_free(z->rep_buf);
    loco_free(z->expert);
    loco_free(z);
}

/* The head's own copy of wte on a pipeline stage without the embeddings:
 * the embedding stage's wte has the same (summed) gradient and counts it. */
static bool head_only_stage(const loco_gpt *m) {
    return loco_gpt_stage_of(m) && loco_gpt_holds_unit(m, loco_gpt_cfg(m)->n_layer + 1) &&
           !loco_gpt_holds_unit(m, 0);
}
static bool tied_copy(const loco_gpt *m, int i) {
    return head_only_stage(m) && !strcmp(loco_gpt_table(m)->t[i].name, "transformer.wte.weight");
}

/* Sum of squares of the gradients of flat range [lo, hi) (at g). Under
 * tensor parallelism a replicated tensor (the same on every tp rank) is
 * counted by tp rank 0 only, so the sum over tp is the whole model's. */
static double tp_sumsq(const loco_zero *z, const float *g, size_t lo, size_t hi, bool experts) {
    const loco_gpt *m = z->m;
    if (!z->ep && !loco_gpt_parallel_of(m)->tp && !head_only_stage(m))
        return experts ? 0 : loco_sumsq(g, hi - lo);
    double s = 0;
    for (int i = 0; i < loco_gpt_table(m)->n; i++) {
        const loco_tensor *t = &loco_gpt_table(m)->t[i];
        size_t a = t->offset > lo ? t->offset : lo;
        size_t b = t->offset + t->numel < hi ? t->offset + t->numel : hi;
        if (a >= b || (loco_gpt_tensor_replicated(m, i) && loco_gpt_tp_rank(m) != 0) ||
            tied_copy(m, i) || (z->ep ? z->expert[i] : false) != experts)
            continue;
        s += loco_sumsq(g + (a - lo), b - a);
    }
    return s;
}

enum { REP_COUNT, REP_PACK, REP_UNPACK };

/* Walks the replicated tensors' pieces inside the owned range: counts
 * them, packs them from the owned parameters into buf, or unpacks buf
 * back. Returns the elements walked. */
static size_t replicated_pieces(const loco_zero *z, float *data, float *buf, int what) {
    const loco_gpt *m = z->m;
    size_t at = 0;
    for (int i = 0; i < loco_gpt_table(m)->n; i++) {
        const loco_tensor *t = &loco_gpt_table(m)->t[i];
        size_t a = t->offset > z->lo ? t->offset : z->lo;
        size_t b = t->offset + t->numel < z->hi ? t->offset + t->numel : z->hi;
        if (a >= b || !loco_gpt_tensor_replicated(m, i))
            continue;
        if (what == REP_PACK)
            memcpy(buf + at, data + (a - z->lo), (b - a) * sizeof(float));
        else if (what == REP_UNPACK)
            memcpy(data + (a - z->lo), buf + at, (b - a) * sizeof(float));
        at += b - a;
    }
    return at;
}

int loco_zero_sync_replicas(loco_zero *z) {
    if (!loco_gpt_parallel_of(z->m)->tp || z->n_rep == 0)
        return 0;
    /* The owned range is the same on every tp rank (same slice table, same
     * dp split), so the packed pieces line up. */
    float *data = loco_zero_owned_params(z);
    replicated_pieces(z, data, z->rep_buf, REP_PACK);
    LOCO_CHECK(
        loco_comm_broadcast(loco_gpt_parallel_of(z->m)->tp, z->rep_buf, z->n_rep, LOCO_DT_F32, 0));
    replicated_pieces(z, data, z->rep_buf, REP_UNPACK);
    return 0;
}

int loco_zero_create(loco_zero **out, loco_gpt *m, loco_comm *dp, const loco_config *cfg) {
    *out = NULL;
    const int stage = (int)cfg->parallel.zero_stage;
    unsigned flags = loco_gpt_stage_of(m) ? 0 : loco_zero_model_flags(stage);
    if (((flags & LOCO_GPT_NO_PARAMS) != 0) != (loco_gpt_params(m) == NULL) ||
        ((flags & LOCO_GPT_NO_GRADS) != 0) != (loco_gpt_grads(m) == NULL))
        return LOCO_ERR(LOCO_EINVAL, "model was not initialised with the flags of ZeRO-%d%s", stage,
                        loco_gpt_stage_of(m) ? " over a pipeline stage (whole buffers)" : "");
    loco_zero *z = loco_alloc(sizeof *z);
    if (!z)
        return LOCO_ERR(LOCO_ENOMEM, "ZeRO state");
    int rc;
    z->m = m;
    z->dp = dp;
    z->stage = stage;
    z->rank = loco_comm_rank(dp);
    z->n = loco_comm_size(dp);
    z->P = loco_gpt_num_params(m);
    z->bucket_elems = (size_t)(cfg->parallel.bucket_mb * 1024 * 1024 / sizeof(float));
    if (z->bucket_elems == 0)
        z->bucket_elems = 1;
    z->own_lo = loco_alloc(((size_t)z->n + 1) * sizeof(size_t));
    z->counts = loco_alloc((size_t)z->n * sizeof(size_t));
    if (!z->own_lo || !z->counts) {
        rc = LOCO_ERR(LOCO_ENOMEM, "ZeRO ranges");
        goto out_fail;
    }
    for (int r = 0; r <= z->n; r++)
        z->own_lo[r] = z->P * (size_t)r / (size_t)z->n;
    loco_zero_owned(z->P, z->rank, z->n, &z->lo, &z->hi);
    const size_t own = z->hi - z->lo;
    z->opt_lo = stage == 0 ? 0 : z->lo;
    z->opt_hi = stage == 0 ? z->P : z->hi;
    LOCO_CHECK_GOTO(loco_adamw_init(&z->opt, z->opt_hi - z->opt_lo, cfg), out_fail);
    if (stage >= 2) {
        z->gshard = loco_alloc(own * sizeof(float));
        if (stage >= 3)
            z->pshard = loco_alloc(own * sizeof(float));
        if (!z->gshard || (stage >= 3 && !z->pshard)) {
            rc = LOCO_ERR(LOCO_ENOMEM, "ZeRO shards of %zu elements", own);
            goto out_fail;
        }
        z->stale = stage >= 3;
    }
    if (stage >= 2 && !loco_gpt_stage_of(m)) {
        const int L = loco_gpt_cfg(m)->n_layer;
        size_t a, b, e0, e1, b0, b1;
        loco_gpt_unit_range(m, 0, &e0, &e1);
        loco_gpt_unit_range(m, 1, &b0, &b1);
        loco_gpt_unit_range(m, L + 1, &a, &b);
        bool p3 = stage >= 3;
        LOCO_CHECK_GOTO(alloc_slot(z, &z->embed, e1 - e0, p3), out_fail);
        LOCO_CHECK_GOTO(alloc_slot(z, &z->lnf, b - a, p3), out_fail);
        LOCO_CHECK_GOTO(alloc_slot(z, &z->blocks[0], b1 - b0, p3), out_fail);
        LOCO_CHECK_GOTO(alloc_slot(z, &z->blocks[1], b1 - b0, p3), out_fail);
        if (stage == 2) /* parameters are whole; gradients bound per unit */
            for (int u = 0; u < loco_gpt_num_units(m); u++) {
                loco_gpt_unit_range(m, u, &a, &b);
                loco_gpt_bind_unit(m, u, loco_gpt_params(m) + a, unit_slot(z, u)->grads);
            }
    }
    if (loco_gpt_parallel_of(m)->tp) {
        z->n_rep = replicated_pieces(z, NULL, NULL, REP_COUNT);
        z->rep_buf = loco_alloc((z->n_rep ? z->n_rep : 1) * sizeof(float));
        if (!z->rep_buf) {
            rc = LOCO_ERR(LOCO_ENOMEM, "replicated parameters of %zu elements", z->n_rep);
            goto out_fail;
        }
    }
    if (!loco_gpt_stage_of(m)) {
        loco_gpt_hooks h = {.ctx = z, .acquire = hook_acquire, .grads_ready = hook_grads_ready};
        loco_gpt_set_hooks(m, &h);
    }
    *out = z;
    return 0;
out_fail:
    loco_zero_destroy(z);
    return rc;
}

void loco_zero_init_weights(loco_zero *z, loco_rng *rng) {
    size_t lo, hi;
    float *data;
    loco_zero_held_params(z, &lo, &hi, &data);
    loco_gpt_init_weights_range(z->m, rng, data, lo, hi);
}

/* Parameters changed: a stage-3 slot's gathered copy is stale. */
static void invalidate_slots(loco_zero *z) {
    z->blocks[0].param_unit = z->blocks[1].param_unit = -1;
    z->embed.param_unit = z->lnf.param_unit = -1;
}

void loco_zero_set_pipeline(loco_zero *z, loco_comm *pp) { z->pp = pp; }

int loco_zero_set_experts(loco_zero *z, loco_comm *ep) {
    if (!ep || loco_comm_size(ep) < 2)
        return 0;
    z->expert = loco_alloc((size_t)loco_gpt_table(z->m)->n * sizeof(bool));
    if (!z->expert)
        return LOCO_ERR(LOCO_ENOMEM, "expert table");
    for (int i = 0; i < loco_gpt_table(z->m)->n; i++)
        z->expert[i] = strstr(loco_gpt_table(z->m)->t[i].name, ".mlp.experts.") != NULL;
    z->ep = ep;
    return 0;
}

/* ------------------------------------------------- over a pipeline stage */

int loco_zero_grads_ready(loco_zero *z, size_t lo, size_t hi) {
    if (!loco_gpt_stage_of(z->m) || lo > hi || hi > z->P)
        return LOCO_ERR(LOCO_EINVAL, "gradients of [%zu, %zu) reported final: %s", lo, hi,
                        loco_gpt_stage_of(z->m) ? "outside the stage's parameters"
                                     : "ranges are for a pipeline stage's model");
    z->ready_elems += hi - lo;
    if (lo == hi)
        return 0;
    float *g = loco_gpt_grads(z->m) + lo;
    if (z->ep) /* dense averaged over ep, experts scaled: as a unit's */
        LOCO_CHECK(ep_prereduce_range(z, lo, hi, g));
    if (z->stage < 2) {
        if (z->n == 1)
            return 0;
        if (z->n_buckets == MAX_BUCKETS)
            return LOCO_ERR(LOCO_EINVAL, "more than %d gradient ranges in flight", MAX_BUCKETS);
        return loco_comm_iallreduce(z->dp, g, hi - lo, LOCO_DT_F32, LOCO_OP_AVG,
                                    &z->buckets[z->n_buckets++]);
    }
    /* Reduce-scatter: this rank's part of the range lands in its shard. */
    split_counts(z, lo, hi);
    const size_t mine = lo > z->lo ? lo : z->lo;
    float *dst = z->gshard + (z->counts[z->rank] ? mine - z->lo : 0);
    if (z->n == 1) {
        memcpy(dst, g, (hi - lo) * sizeof(float));
        return 0;
    }
    if (z->n_buckets == MAX_BUCKETS)
        return LOCO_ERR(LOCO_EINVAL, "more than %d gradient ranges in flight", MAX_BUCKETS);
    return loco_comm_ireduce_scatter(z->dp, g, dst, z->counts, LOCO_DT_F32, LOCO_OP_AVG,
                                     &z->buckets[z->n_buckets++]);
}

static int start_range_gather(loco_zero *z, size_t lo, size_t hi, loco_comm_req **req) {
    split_counts(z, lo, hi);
    const size_t mine = lo > z->lo ? lo : z->lo;
    const float *src = z->pshard + (z->counts[z->rank] ? mine - z->lo : 0);
    return loco_comm_iallgather(z->dp, src, loco_gpt_params(z->m) + lo, z->counts, LOCO_DT_F32,
                                req);
}

int loco_zero_params_prefetch(loco_zero *z, size_t lo, size_t hi) {
    if (!loco_gpt_stage_of(z->m) || z->stage < 3 || !z->stale)
        return 0;
    if (z->n_gathers == MAX_GATHERS || lo >= hi || hi > z->P)
        return LOCO_ERR(LOCO_EINVAL, "parameter range [%zu, %zu) of %zu, %d gathers in flight",
                        lo, hi, z->P, z->n_gathers);
    const int i = z->n_gathers++;
    z->gathers[i].lo = lo, z->gathers[i].hi = hi;
    return start_range_gather(z, lo, hi, &z->gathers[i].req);
}

int loco_zero_params_wait(loco_zero *z, size_t lo, size_t hi) {
    if (!loco_gpt_stage_of(z->m) || z->stage < 3 || !z->stale)
        return 0;
    for (int i = 0; i < z->n_gathers; i++)
        if (z->gathers[i].lo == lo && z->gathers[i].hi == hi) {
            int rc = loco_comm_wait(z->gathers[i].req);
            z->gathers[i].req = NULL;
            return rc;
        }
    return LOCO_ERR(LOCO_EINVAL, "parameters [%zu, %zu) were not prefetched this step", lo, hi);
}

/* The step's gathers complete; the next step's buffer is stale again. */
static int wait_gathers(loco_zero *z) {
    int rc = 0;
    for (int i = 0; i < z->n_gathers; i++) {
        int r = loco_comm_wait(z->gathers[i].req);
        z->gathers[i].req = NULL;
        rc = rc ? rc : r;
    }
    z->n_gathers = 0;
    return rc;
}

int loco_zero_gather_params(loco_zero *z) {
    if (!loco_gpt_stage_of(z->m) || z->stage < 3 || !z->stale)
        return 0;
    LOCO_CHECK(wait_gathers(z));
    loco_comm_req *req;
    LOCO_CHECK(start_range_gather(z, 0, z->P, &req));
    LOCO_CHECK(loco_comm_wait(req));
    z->stale = false;
    return 0;
}

void loco_zero_adopt_params(loco_zero *z) {
    if (loco_gpt_stage_of(z->m) && z->stage >= 3)
        memcpy(z->pshard, loco_gpt_params(z->m) + z->lo, (z->hi - z->lo) * sizeof(float));
}

int loco_zero_step(loco_zero *z, float lr, double max_norm, double *norm) {
    loco_gpt *m = z->m;
    if (loco_gpt_stage_of(m)) {
        LOCO_CHECK(wait_gathers(z));
        const size_t ready = z->ready_elems;
        z->ready_elems = 0;
        if (ready != z->P)
            return LOCO_ERR(LOCO_EINVAL,
                            "ZeRO over a pipeline stage: gradients of %zu of %zu parameters "
                            "were reported final this step",
                            ready, z->P);
    }
    /* Everything still in flight lands first. */
    LOCO_CHECK(launch_bucket(z));
    int rc = loco_comm_waitall(z->buckets, z->n_buckets);
    z->n_buckets = 0;
    LOCO_CHECK(rc);
    slot *all[4] = {&z->blocks[0], &z->blocks[1], &z->embed, &z->lnf};
    for (int i = 0; i < 4; i++) {
        LOCO_CHECK(finish_reduce(z, all[i]));
        LOCO_CHECK(finish_gather(all[i]));
    }
    /* Global gradient norm and clipping. */
    float *grads;      /* gradients of the range this rank updates */
    size_t ulo, uhi;   /* that range */
    double sumsq;
    double part[2]; /* dense, experts (under ep: each ep rank's own) */
    if (z->stage < 2) { /* identical on every dp rank */
        part[0] = tp_sumsq(z, loco_gpt_grads(m), 0, z->P, false);
        part[1] = tp_sumsq(z, loco_gpt_grads(m), 0, z->P, true);
        ulo = z->opt_lo, uhi = z->opt_hi;
        grads = loco_gpt_grads(m) + ulo;
    } else {
        part[0] = tp_sumsq(z, z->gshard, z->lo, z->hi, false);
        part[1] = tp_sumsq(z, z->gshard, z->lo, z->hi, true);
        LOCO_CHECK(loco_comm_allreduce(z->dp, part, 2, LOCO_DT_F64, LOCO_OP_SUM));
        ulo = z->lo, uhi = z->hi;
        grads = z->gshard;
    }
    if (z->ep)
        LOCO_CHECK(loco_comm_allreduce(z->ep, &part[1], 1, LOCO_DT_F64, LOCO_OP_SUM));
    sumsq = part[0] + part[1];
    if (loco_gpt_parallel_of(z->m)->tp) /* the slices' sums; replicated tensors counted once */
        LOCO_CHECK(loco_comm_allreduce(loco_gpt_parallel_of(z->m)->tp, &sumsq, 1, LOCO_DT_F64,
                                       LOCO_OP_SUM));
    if (z->pp) /* and the stages' */
        LOCO_CHECK(loco_comm_allreduce(z->pp, &sumsq, 1, LOCO_DT_F64, LOCO_OP_SUM));
    *norm = sqrt(sumsq);
    if (max_norm > 0 && *norm > max_norm && isfinite(*norm))
        loco_scale(grads, (float)(max_norm / *norm), uhi - ulo);
    if (!isfinite(*norm))
        return 0; /* the caller reports divergence; leave parameters alone */
    float *params = z->stage >= 3 ? z->pshard : loco_gpt_params(m) + ulo;
    loco_adamw_step_range(&z->opt, loco_gpt_table(m), params, grads, ulo, uhi, lr);
    z->stale = loco_gpt_stage_of(m) && z->stage >= 3;
    if (z->stage >= 1)
        LOCO_CHECK(loco_zero_sync_params(z));
    return 0;
}

int loco_zero_sync_params(loco_zero *z) {
    if (z->stage >= 3) {
        invalidate_slots(z);
        z->stale = loco_gpt_stage_of(z->m);
        return 0;
    }
    if (z->n == 1)
        return 0;
    for (int r = 0; r < z->n; r++)
        z->counts[r] = z->own_lo[r + 1] - z->own_lo[r];
    return loco_comm_allgather(z->dp, loco_gpt_params(z->m) + z->lo, loco_gpt_params(z->m),
                               z->counts, LOCO_DT_F32);
}

void loco_zero_memory(const loco_zero *z, loco_mem_report *r) {
    const size_t f = sizeof(float);
    r->params = z->stage >= 3 ? (z->hi - z->lo) * f : z->P * f;
    r->grads = z->stage >= 2 ? (z->hi - z->lo) * f : z->P * f;
    r->optim = 2 * (z->opt_hi - z->opt_lo) * f;
    r->gathered = z->gathered_bytes;
    if (loco_gpt_stage_of(z->m)) { /* whole buffers, held through the step */
        if (z->stage >= 3)
            r->gathered += z->P * f;
        if (z->stage >= 2)
            r->gathered += z->P * f;
    }
    r->activations = loco_gpt_act_bytes(z->m);
}

double loco_zero_formula_bytes(int stage, size_t n_params, int dp) {
    const double P = (double)n_params, N = dp;
    switch (stage) {
    case 0: return 16 * P;
    case 1: return 8 * P + 8 * P / N;
    case 2: return 4 * P + 12 * P / N;
    default: return 16 * P / N;
    }
}
