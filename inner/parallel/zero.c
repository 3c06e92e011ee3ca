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
 * gathered chunk by chunk when the next step first needs them.
 *
 * Which ranges form a bucket, and when each starts, is the ZeRO plan's
 * (zero_plan.c), walked by zero_exec.c for the hooks; this file is the
 * host executor: its ops move host buffers over the dp communicator.
 *
 * Keeping the copies of a parameter alike across ranks after an update is
 * zero_replicas.c's.
 *
 * One file: the host executor of the ZeRO plan (zero_plan.c, zero_exec.c):
 * its ops table, the pipeline's range reductions and the sharded AdamW step
 * share the one state they all move. */
#include "inner/parallel/zero_internal.h"
#include "kernels/kernels.h"

#include <math.h>
#include <string.h>


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

const loco_zero_plan *loco_zero_plan_of(const loco_zero *z) { return &z->plan; }

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

/* Expert parallelism, before a unit's gradients (g holds the unit) go to
 * the expert-dp group: its dense tensors are averaged over ep (with the
 * expert-dp average, over every data-parallel rank), its experts' scaled
 * by 1/ep (an expert's rank summed its whole ep group's tokens; the
 * expert-dp average then makes the mean over every rank's). */
static int ep_prereduce_range(loco_zero *z, size_t a, size_t b, float *g) {
    const loco_gpt *m = z->m;
    int i, end;
    if (a == b)
        return 0;
    for (i = 0; i < loco_gpt_table(m)->n && loco_gpt_table(m)->t[i].offset + loco_gpt_table(m)->t[i].numel <= a; i++)
        ;
    const float inv = 1.0f / (float)loco_comm_size(z->ep);
    while (i < loco_gpt_table(m)->n && loco_gpt_table(m)->t[i].offset < b) {
        for (end = i; end < loco_gpt_table(m)->n && loco_gpt_table(m)->t[end].offset < b && z->expert[end] == z->expert[i];)
            end++;
        size_t lo = loco_gpt_table(m)->t[i].offset, hi = loco_gpt_table(m)->t[end - 1].offset + loco_gpt_table(m)->t[end - 1].numel;
        lo = lo > a ? lo : a, hi = hi < b ? hi : b;
        if (z->expert[i])
            loco_scale(g + (lo - a), inv, hi - lo);
        else
            LOCO_CHECK(loco_comm_allreduce(z->ep, g + (lo - a), hi - lo, LOCO_DT_F32, LOCO_OP_AVG));
        i = end;
    }
    return 0;
}

/* ------------------------------------------ the host executor's ops */

static int op_reduce_bucket(void *ctx, int b, int slot_i, loco_comm_req **req) {
    loco_zero *z = ctx;
    const loco_zero_bucket *k = &z->plan.buckets[b];
    if (slot_i >= 0) /* a unit buffer into its staging part */
        return loco_comm_ireduce_scatter(z->dp, z->slots[slot_i].grads, z->slots[slot_i].staging,
                                         loco_zero_plan_counts(&z->plan, b), LOCO_DT_F32,
                                         LOCO_OP_AVG, req);
    if (z->plan.scatter)
        return LOCO_ERR(LOCO_EINVAL, "host ZeRO-%d reduces from unit buffers", z->stage);
    if (z->n == 1 || k->hi == k->lo)
        return 0; /* one rank: the average is the gradient */
    return loco_comm_iallreduce(z->dp, loco_gpt_grads(z->m) + k->lo, k->hi - k->lo, LOCO_DT_F32,
                                LOCO_OP_AVG, req);
}

static int op_reduced(void *ctx, int b, int slot_i) {
    loco_zero *z = ctx;
    size_t len;
    float *dst = z->gshard + loco_zero_plan_mine(&z->plan, b, &len);
    const float *src = z->slots[slot_i].staging;
    for (size_t i = 0; i < len; i++)
        dst[i] += src[i];
    return 0;
}

static int op_fresh_grads(void *ctx, int slot_i, int unit) {
    loco_zero *z = ctx;
    slot *s = &z->slots[slot_i];
    size_t a, b;
    loco_gpt_unit_range(z->m, unit, &a, &b);
    memset(s->grads, 0, (b - a) * sizeof(float));
    /* Stage 3 bound the slot's parameters already; stage 2's are whole. */
    loco_gpt_bind_unit(z->m, unit, z->stage >= 3 ? s->params : loco_gpt_params(z->m) + a, s->grads);
    return 0;
}

static int op_all_gather_unit(void *ctx, int slot_i, int unit, loco_comm_req **req) {
    loco_zero *z = ctx;
    const int b = z->plan.unit_bucket[unit]; /* per unit: the unit's own range */
    size_t len;
    const size_t at = loco_zero_plan_mine(&z->plan, b, &len);
    return loco_comm_iallgather(z->dp, z->pshard + at, z->slots[slot_i].params,
                                loco_zero_plan_counts(&z->plan, b), LOCO_DT_F32, req);
}

static int op_bind_params(void *ctx, int slot_i, int unit) {
    loco_zero *z = ctx;
    loco_gpt_bind_unit(z->m, unit, z->slots[slot_i].params, NULL);
    return 0;
}

static uint64_t op_params_version(void *ctx) { return ((loco_zero *)ctx)->version; }

static int op_prepare_unit(void *ctx, int unit) {
    loco_zero *z = ctx;
    if (!z->ep)
        return 0;
    size_t a, b;
    loco_gpt_unit_range(z->m, unit, &a, &b);
    float *g = z->stage >= 2 ? z->slots[loco_zero_plan_slot(&z->plan, unit)].grads
                             : loco_gpt_grads(z->m) + a;
    return ep_prereduce_range(z, a, b, g);
}

static const loco_zero_exec_ops host_ops = {
    .reduce_bucket = op_reduce_bucket,
    .reduced = op_reduced,
    .fresh_grads = op_fresh_grads,
    .all_gather_unit = op_all_gather_unit,
    .bind_params = op_bind_params,
    .params_version = op_params_version,
    .prepare_unit = op_prepare_unit,
};

static int hook_acquire(void *ctx, loco_gpt *m, int unit, bool backward) {
    (void)m;
    return loco_zero_exec_acquire(((loco_zero *)ctx)->exec, unit, backward);
}

static int hook_grads_ready(void *ctx, loco_gpt *m, int unit) {
    (void)m;
    return loco_zero_exec_grads_ready(((loco_zero *)ctx)->exec, unit);
}

void loco_zero_micro_begin(loco_zero *z, bool first, bool last) {
    if (z->exec)
        loco_zero_exec_micro(z->exec, last);
    if (first && z->gshard)
        memset(z->gshard, 0, (z->hi - z->lo) * sizeof(float));
}

static int alloc_slot(loco_zero *z, slot *s, size_t elems, bool with_params) {
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
    loco_free(s->params);
    loco_free(s->grads);
    loco_free(s->staging);
    memset(s, 0, sizeof *s);
}

void loco_zero_destroy(loco_zero *z) {
    if (!z)
        return;
    loco_comm_waitall(z->ranges, z->n_ranges);
    loco_zero_exec_destroy(z->exec); /* waits for what reads the slots */
    loco_gpt_set_hooks(z->m, NULL);
    for (int i = 0; i < LOCO_ZERO_SLOTS; i++)
        free_slot(&z->slots[i]);
    loco_adamw_fini(&z->opt);
    loco_free(z->pshard);
    loco_free(z->gshard);
    loco_zero_plan_fini(&z->plan);
    loco_free(z->counts);
    loco_free(z->rep_buf);
    loco_free(z->shared);
    loco_free(z->shared_buf);
    loco_free(z->dense_buf);
    loco_free(z->expert);
    loco_free(z);
}

static bool head_only_stage(const loco_gpt *m) {
    return loco_gpt_stage_of(m) && loco_gpt_holds_unit(m, loco_gpt_cfg(m)->n_layer + 1) &&
           !loco_gpt_holds_unit(m, 0);
}

/* The head's own copy of wte on a pipeline stage without the embeddings:
 * the embedding stage's wte has the same (summed) gradient and counts it. */
static bool tied_copy(const loco_gpt *m, int i) {
    return head_only_stage(m) && !strcmp(loco_gpt_table(m)->t[i].name, "transformer.wte.weight");
}

/* Sum of squares of the gradients of flat range [lo, hi) (at g). Under
 * tensor parallelism a replicated tensor (the same on every tp rank) is
 * counted by tp rank 0 only, so the sum over tp is the whole model's. */
static double tp_sumsq(const loco_zero *z, const float *g, size_t lo, size_t hi, bool experts) {
    const loco_gpt *m = z->m;
    if (!z->ep && !loco_gpt_parallel_of(m)->tp && !(head_only_stage(m)))
        return experts ? 0 : loco_sumsq(g, hi - lo);
    double s = 0;
    for (int i = 0; i < loco_gpt_table(m)->n; i++) {
        const loco_tensor *t = &loco_gpt_table(m)->t[i];
        size_t a = t->offset > lo ? t->offset : lo;
        size_t b = t->offset + t->numel < hi ? t->offset + t->numel : hi;
        if (a >= b || (loco_gpt_tensor_replicated(m, i) && loco_gpt_tp_rank(m) != 0) ||
            tied_copy(m, i) || (z->ep ? z->expert[i] : false) != experts)
            continue;
        s += loco_gpt_tp_sumsq(m, i, g + (a - lo), a, b);
    }
    return s;
}

/* The plan of this rank's reductions: units only when hooks drive them
 * (a pipeline stage reports ranges instead). */
static int plan(loco_zero *z, const loco_config *cfg) {
    loco_gpt *m = z->m;
    const int n = loco_gpt_stage_of(m) ? 0 : loco_gpt_num_units(m);
    size_t *bounds = loco_alloc(((size_t)n + 1) * sizeof(size_t));
    if (!bounds)
        return LOCO_ERR(LOCO_ENOMEM, "ZeRO unit table");
    for (int u = 0; u < n; u++) {
        size_t a, b;
        loco_gpt_unit_range(m, u, &a, &b);
        if (u > 0 && a != bounds[u]) {
            loco_free(bounds);
            return LOCO_ERR(LOCO_EINVAL, "ZeRO: unit %d starts at %zu, unit %d ends at %zu", u,
                            a, u - 1, bounds[u]);
        }
        bounds[u] = a;
        bounds[u + 1] = b;
    }
    const double elems = cfg->parallel.bucket_mb * 1024 * 1024 / sizeof(float);
    const loco_zero_plan_spec spec = {
        .n_params = z->P, .n_units = n, .unit_lo = bounds, .dp = z->n, .rank = z->rank,
        .stage = z->stage, .bucket_elems = (size_t)elems, .unit_buffers = z->stage >= 2};
    const int rc = loco_zero_plan_init(&z->plan, &spec);
    loco_free(bounds);
    return rc;
}

int loco_zero_create(loco_zero **out, loco_gpt *m, loco_comm *dp, const loco_config *cfg) {
    *out = NULL;
    const int stage = (int)cfg->parallel.zero_stage;
    unsigned flags = loco_gpt_stage_of(m) ? 0 : loco_zero_model_flags(stage);
    if (((flags & LOCO_GPT_NO_PARAMS) != 0) != (loco_gpt_params(m) == NULL) ||
        ((flags & LOCO_GPT_NO_GRADS) != 0) != (loco_gpt_grads(m) == NULL))
        return LOCO_ERR(LOCO_EINVAL, "model was not initialised with the flags of ZeRO-%d%s",
                        stage, loco_gpt_stage_of(m) ? " over a pipeline stage (whole buffers)" : "");
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
    z->counts = loco_alloc((size_t)z->n * sizeof(size_t));
    if (!z->counts) {
        rc = LOCO_ERR(LOCO_ENOMEM, "ZeRO ranges");
        goto out_fail;
    }
    LOCO_CHECK_GOTO(plan(z, cfg), out_fail);
    z->lo = z->plan.own[z->rank];
    z->hi = z->plan.own[z->rank + 1];
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
        slot *sl = z->slots;
        LOCO_CHECK_GOTO(alloc_slot(z, &sl[LOCO_ZERO_SLOT_EMBED], e1 - e0, p3), out_fail);
        LOCO_CHECK_GOTO(alloc_slot(z, &sl[LOCO_ZERO_SLOT_LAST], b - a, p3), out_fail);
        LOCO_CHECK_GOTO(alloc_slot(z, &sl[LOCO_ZERO_SLOT_BLOCK0], b1 - b0, p3), out_fail);
        LOCO_CHECK_GOTO(alloc_slot(z, &sl[LOCO_ZERO_SLOT_BLOCK1], b1 - b0, p3), out_fail);
        if (stage == 2) /* parameters are whole; gradients bound per unit */
            for (int u = 0; u < loco_gpt_num_units(m); u++) {
                loco_gpt_unit_range(m, u, &a, &b);
                loco_gpt_bind_unit(m, u, loco_gpt_params(m) + a,
                                   z->slots[loco_zero_plan_slot(&z->plan, u)].grads);
            }
    }
    LOCO_CHECK_GOTO(loco__zero_plan_replicas(z), out_fail);
    if (!loco_gpt_stage_of(m)) {
        LOCO_CHECK_GOTO(loco_zero_exec_create(&z->exec, &z->plan, &host_ops, z, true), out_fail);
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
    return loco__zero_plan_dense(z);
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
        if (z->n_ranges == MAX_RANGES)
            return LOCO_ERR(LOCO_EINVAL, "more than %d gradient ranges in flight", MAX_RANGES);
        return loco_comm_iallreduce(z->dp, g, hi - lo, LOCO_DT_F32, LOCO_OP_AVG,
                                    &z->ranges[z->n_ranges++]);
    }
    /* Reduce-scatter: this rank's part of the range lands in its shard. */
    float *dst = z->gshard + loco_zero_plan_split(&z->plan, lo, hi, z->counts);
    if (z->n == 1) {
        memcpy(dst, g, (hi - lo) * sizeof(float));
        return 0;
    }
    if (z->n_ranges == MAX_RANGES)
        return LOCO_ERR(LOCO_EINVAL, "more than %d gradient ranges in flight", MAX_RANGES);
    return loco_comm_ireduce_scatter(z->dp, g, dst, z->counts, LOCO_DT_F32, LOCO_OP_AVG,
                                     &z->ranges[z->n_ranges++]);
}

static int start_range_gather(loco_zero *z, size_t lo, size_t hi, loco_comm_req **req) {
    const float *src = z->pshard + loco_zero_plan_split(&z->plan, lo, hi, z->counts);
    return loco_comm_iallgather(z->dp, src, loco_gpt_params(z->m) + lo, z->counts, LOCO_DT_F32, req);
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
    int rc = loco_comm_waitall(z->ranges, z->n_ranges);
    z->n_ranges = 0;
    LOCO_CHECK(rc);
    if (z->exec)
        LOCO_CHECK(loco_zero_exec_finish(z->exec));
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
        LOCO_CHECK(loco_comm_allreduce(loco_gpt_parallel_of(z->m)->tp, &sumsq, 1, LOCO_DT_F64, LOCO_OP_SUM));
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
        z->version++; /* a slot's gathered copy is stale */
        z->stale = loco_gpt_stage_of(z->m);
        return 0;
    }
    if (z->n == 1)
        return 0;
    for (int r = 0; r < z->n; r++)
        z->counts[r] = z->plan.own[r + 1] - z->plan.own[r];
    return loco_comm_allgather(z->dp, loco_gpt_params(z->m) + z->lo, loco_gpt_params(z->m), z->counts,
                               LOCO_DT_F32);
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
