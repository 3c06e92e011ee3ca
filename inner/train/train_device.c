/* The trainer on GPUs (train.device = cuda): the device model, the host
 * copies checkpoints and the outer loop read, and the step over several
 * ranks (docs/DECISIONS.md, "GPU data parallel").
 *
 * Over dp > 1 (or the nccl backend on one rank) the device model's hooks
 * drive the collectives while its backward runs: this file is the device
 * executor of the ZeRO plan (inner/parallel/zero_plan.c) that zero.c
 * executes on the CPU, walked by the same code (zero_exec.c), so the
 * buckets and their order are the host's:
 *   ZeRO 0-2: on the last micro-step each unit's finished gradients join
 *   a bucket of contiguous flat range, all-reduced (0-1) or
 *   reduce-scattered into the owned range (2) once it holds
 *   parallel.bucket_mb, while the backward goes on;
 *   ZeRO-3: the model is sharded (loco_gpt_cuda_create_sharded): fp32
 *   parameters, gradients and moments of the owned range only; a unit's
 *   weights are all-gathered (in the passes' type) into one of two block
 *   slots before its pass, the next block's gather started at once; the
 *   embeddings and ln_f keep their slots for the step; every micro-step
 *   reduce-scatters each unit's gradients into the owned ones.
 * A pipeline stage keeps its whole parameters at every ZeRO stage, as
 * the CPU stage does (micro-batches interleave: no unit is done with its
 * weights before the schedule ends); its gradients are reduced after the
 * schedule, in the plan's buckets, and ZeRO-3 runs ZeRO-2's path there
 * (owned gradients and moments, the parameters all-gathered after AdamW).
 * Over nccl the collectives run on device buffers, ordered after the
 * kernels queued before them by events (no host wait); over mpi they are
 * staged through pinned host buffers (the host waits for each copy: the
 * path that lets two processes share one GPU, for tests). */
#include "inner/train/internal.h"

#include <math.h>
#include <string.h>

int loco__train_check_device(const loco_config *cfg) {
    const bool cuda = !strcmp(cfg->train.device, "cuda");
    if (!strcmp(cfg->train.dtype, "bf16") && !cuda)
        return LOCO_ERR(LOCO_EINVAL, "train.dtype = bf16 needs train.device = cuda (the CPU path "
                                     "computes in fp32)");
    if (!strcmp(cfg->parallel.backend, "nccl") && !cuda)
        return LOCO_ERR(LOCO_EINVAL, "parallel.backend = nccl moves device buffers: it needs "
                                     "train.device = cuda (the CPU path's collectives are on host "
                                     "buffers: use mpi)");
    if (!cuda)
        return 0;
#if !defined(LOCO_HAVE_CUDA)
    return LOCO_ERR(LOCO_ENOTSUP, "train.device = cuda: built without CUDA (no nvcc when loco "
                                  "was built); use train.device = cpu");
#else
    /* Data parallel (ZeRO 0-3), tensor and sequence parallel
     * (gpt_cuda_tp.c), context parallel, ring and Ulysses (gpt_cuda_cp.c),
     * pipeline stages (gpt_cuda_pp.c), mixture of experts and expert
     * parallelism (gpt_cuda_moe.c): over mpi. */
    static const struct {
        const char *key, *what;
    } staged[] = {{"pp", "pipeline sends and receives"}, {"cp", "cp collectives"},
                  {"tp", "tp collectives"}, {"ep", "expert all-to-alls"}};
    const int64_t sizes[] = {cfg->parallel.pp, cfg->parallel.cp, cfg->parallel.tp,
                             cfg->parallel.ep};
    for (int i = 0; i < 4 && !strcmp(cfg->parallel.backend, "nccl"); i++)
        if (sizes[i] > 1)
            return LOCO_ERR(LOCO_ENOTSUP,
                            "parallel.%s = %lld with parallel.backend = nccl: the device's %s "
                            "run over mpi (staged through pinned host buffers) for now; use "
                            "parallel.backend = mpi",
                            staged[i].key, (long long)sizes[i], staged[i].what);
    return 0;
#endif
}

#if defined(LOCO_HAVE_CUDA)

#include "kernels/kernels.h"

/* Where the device model's kernels run: the trainer's copies go there too. */
#define STREAM loco_cuda_compute_stream()

/* A unit buffer (ZeRO-3; the walker keeps its state). */
typedef struct {
    void *w;                /* unit-sized, the passes' type: gathered weights */
    float *grads, *staging; /* unit-sized fp32; staging: this rank's reduced part */
} unit_slot;

struct loco__train_dp {
    loco_trainer *t;
    loco_gpt_cuda *g;
    loco_comm *c;       /* the collectives': the nccl world, or the dp group */
    loco_comm *host;    /* the dp group (the norm's sums, on host buffers) */
    bool staged;        /* mpi: the collectives move pinned host copies */
    int stage, n, rank, L;
    size_t P, lo, hi, es;
    loco_zero_plan plan;  /* the buckets and ranges, as zero.c plans them */
    loco_zero_exec *exec; /* its walker, driven by the device model's hooks */
    size_t *counts;     /* (n) scratch: v-collective counts */
    loco_cuda_slab *slab;
    /* ZeRO 0-2 */
    float *hstage;      /* staged: flat gradients, then parameters (P) */
    float *hown;        /* staged, ZeRO-2: the owned reduced gradients */
    float *down;        /* nccl, ZeRO-2: the owned reduced gradients */
    /* ZeRO-3 */
    unit_slot slot[LOCO_ZERO_SLOTS];
    unsigned char *hunit;  /* staged: one unit (fp32 bytes) */
    unsigned char *hshard; /* staged: the owned weights, as of hshard_version */
    uint64_t hshard_version;
    float *hpart;          /* staged: this rank's part of a reduced unit */
};

/* ------------------------------------------ the device executor's ops */

/* ZeRO 0-2: the bucket's gradients all-reduced, or reduce-scattered into
 * the owned range (2). */
static int reduce_whole(loco__train_dp *d, int b, loco_comm_req **req) {
    const size_t blo = d->plan.buckets[b].lo, bhi = d->plan.buckets[b].hi;
    if (bhi == blo)
        return 0;
    float *grads;
    loco_gpt_cuda_state(d->g, NULL, &grads, NULL, NULL, NULL);
    float *g = grads;
    if (d->staged) { /* the bucket to the host (waits: the backward made it) */
        LOCO_CHECK(loco_cuda_copy(d->hstage + blo, grads + blo, (bhi - blo) * sizeof(float),
                                  STREAM));
        LOCO_CHECK(loco_cuda_sync(STREAM));
        g = d->hstage;
    }
    if (!d->plan.scatter)
        return loco_comm_iallreduce(d->c, g + blo, bhi - blo, LOCO_DT_F32, LOCO_OP_AVG, req);
    size_t len;
    float *dst = (d->staged ? d->hown : d->down) + loco_zero_plan_mine(&d->plan, b, &len);
    return loco_comm_ireduce_scatter(d->c, g + blo, dst, loco_zero_plan_counts(&d->plan, b),
                                     LOCO_DT_F32, LOCO_OP_AVG, req);
}

/* Adds a slot's reduced part of bucket b into the owned gradients (after
 * its reduce-scatter; the compute stream is ordered after it). */
static int op_reduced(void *ctx, int b, int slot) {
    loco__train_dp *d = ctx;
    float *grads;
    loco_gpt_cuda_state(d->g, NULL, &grads, NULL, NULL, NULL);
    size_t len;
    const size_t off = loco_zero_plan_mine(&d->plan, b, &len);
    if (!len)
        return 0;
    return loco_cuda_add_clear(grads + off, d->slot[slot].staging, len, STREAM);
}

/* ZeRO-3: reduce-scatters (AVG) a unit's gradients of this micro-step:
 * this rank's part goes to the slot's staging, then into the owned
 * gradients (staged: all of it here, *req left NULL). */
static int op_reduce_bucket(void *ctx, int b, int slot, loco_comm_req **req) {
    loco__train_dp *d = ctx;
    if (slot < 0)
        return reduce_whole(d, b, req);
    unit_slot *s = &d->slot[slot];
    const size_t *counts = loco_zero_plan_counts(&d->plan, b);
    if (!d->staged)
        return loco_comm_ireduce_scatter(d->c, s->grads, s->staging, counts, LOCO_DT_F32,
                                         LOCO_OP_AVG, req);
    size_t len;
    (void)loco_zero_plan_mine(&d->plan, b, &len);
    const size_t elems = d->plan.buckets[b].hi - d->plan.buckets[b].lo;
    LOCO_CHECK(loco_cuda_copy(d->hunit, s->grads, elems * sizeof(float), STREAM));
    LOCO_CHECK(loco_cuda_sync(STREAM));
    LOCO_CHECK(loco_comm_reduce_scatter(d->c, d->hunit, d->hpart, counts, LOCO_DT_F32,
                                        LOCO_OP_AVG));
    LOCO_CHECK(loco_cuda_copy(s->staging, d->hpart, len * sizeof(float), STREAM));
    LOCO_CHECK(op_reduced(d, b, slot));
    return loco_cuda_sync(STREAM); /* hunit and hpart are reused */
}

static int op_fresh_grads(void *ctx, int slot, int unit) {
    loco__train_dp *d = ctx;
    size_t a, b;
    loco_gpt_cuda_unit_range(d->g, unit, &a, &b);
    LOCO_CHECK(loco_cuda_zero(d->slot[slot].grads, (b - a) * sizeof(float), STREAM));
    return loco_gpt_cuda_bind_unit(d->g, unit, NULL, d->slot[slot].grads);
}

/* Starts (nccl) or does (staged) the all-gather of a unit's weights into
 * the slot from every rank's owned part (bytes: the passes' type). */
static int op_all_gather_unit(void *ctx, int slot, int unit, loco_comm_req **req) {
    loco__train_dp *d = ctx;
    size_t lo, hi, len;
    const void *wshard;
    uint64_t version;
    loco_gpt_cuda_shard(d->g, &lo, &hi, &wshard, &version);
    const int b = d->plan.unit_bucket[unit]; /* per unit: the unit's own range */
    const size_t at = loco_zero_plan_mine(&d->plan, b, &len) * d->es;
    const size_t *elems = loco_zero_plan_counts(&d->plan, b);
    for (int r = 0; r < d->n; r++)
        d->counts[r] = elems[r] * d->es;
    void *w = d->slot[slot].w;
    if (!d->staged)
        return loco_comm_iallgather(d->c, (const unsigned char *)wshard + at, w, d->counts,
                                    LOCO_DT_U8, req);
    if (d->hshard_version != version) { /* the owned weights to the host, once per version */
        LOCO_CHECK(loco_cuda_copy(d->hshard, wshard, (d->hi - d->lo) * d->es, STREAM));
        LOCO_CHECK(loco_cuda_sync(STREAM));
        d->hshard_version = version;
    }
    LOCO_CHECK(loco_comm_allgather(d->c, d->hshard + at, d->hunit, d->counts, LOCO_DT_U8));
    const size_t bytes = (d->plan.buckets[b].hi - d->plan.buckets[b].lo) * d->es;
    LOCO_CHECK(loco_cuda_copy(w, d->hunit, bytes, STREAM));
    return loco_cuda_sync(STREAM); /* hunit is reused by the next gather */
}

static int op_bind_params(void *ctx, int slot, int unit) {
    loco__train_dp *d = ctx;
    return loco_gpt_cuda_bind_unit(d->g, unit, d->slot[slot].w, NULL);
}

static uint64_t op_params_version(void *ctx) {
    loco__train_dp *d = ctx;
    uint64_t version;
    size_t lo, hi;
    loco_gpt_cuda_shard(d->g, &lo, &hi, NULL, &version);
    return version;
}

/* Expert parallelism: a unit's gradients pre-reduced over ep before they
 * join their bucket (the whole buffer's range, or ZeRO-3's unit buffer). */
static int op_prepare_unit(void *ctx, int unit) {
    loco__train_dp *d = ctx;
    size_t a, b;
    loco_gpt_cuda_unit_range(d->g, unit, &a, &b);
    if (d->plan.per_unit)
        return loco__train_device_ep_prereduce(
            d->t, d->slot[loco_zero_plan_slot(&d->plan, unit)].grads, a, b);
    float *grads;
    loco_gpt_cuda_state(d->g, NULL, &grads, NULL, NULL, NULL);
    return loco__train_device_ep_prereduce(d->t, grads + a, a, b);
}

static const loco_zero_exec_ops device_ops = {
    .reduce_bucket = op_reduce_bucket,
    .reduced = op_reduced,
    .fresh_grads = op_fresh_grads,
    .all_gather_unit = op_all_gather_unit,
    .bind_params = op_bind_params,
    .params_version = op_params_version,
    .prepare_unit = op_prepare_unit,
};

/* The bucketed reductions done (loco_zero_exec_finish): the reduced
 * gradients back in the device model's buffer (ZeRO-2: its owned range). */
static int copy_back(loco__train_dp *d) {
    float *grads;
    loco_gpt_cuda_state(d->g, NULL, &grads, NULL, NULL, NULL);
    const size_t own = d->hi - d->lo;
    if (d->stage == 2)
        return loco_cuda_copy(grads + d->lo, d->staged ? d->hown : d->down, own * sizeof(float),
                              STREAM);
    if (d->staged)
        return loco_cuda_copy(grads, d->hstage, d->P * sizeof(float), STREAM);
    return 0;
}

static int hook_acquire(void *ctx, int unit, bool backward) {
    return loco_zero_exec_acquire(((loco__train_dp *)ctx)->exec, unit, backward);
}

static int hook_grads_ready(void *ctx, int unit) {
    return loco_zero_exec_grads_ready(((loco__train_dp *)ctx)->exec, unit);
}

/* ----------------------------------------------------------- life cycle */

int loco__train_device_create(loco_trainer *t, const loco_gpt_config *mc) {
    const loco_config *cfg = &t->cfg;
    const bool bf16 = !strcmp(cfg->train.dtype, "bf16");
    loco_comm *dp = t->mesh.dp_cp;
    /* every backend: local rank % devices (nccl's world chose the same) */
    int device;
    LOCO_CHECK(loco_cuda_select_local_device(loco_comm_rank(t->world), &device));
    loco_gpt_cuda_opts o = {.bf16 = bf16, .lo = 0, .hi = SIZE_MAX};
    if (mc->tp > 1) { /* this rank's slice; its collectives staged over mpi */
        o.tp = t->mesh.group[LOCO_DIM_TP];
        o.tp_staged = true;
        o.sp = cfg->parallel.sp;
    }
    if (mc->ep > 1) /* the experts' rows travel staged over mpi */
        o.ep = t->mesh.group[LOCO_DIM_EP];
    if (cfg->parallel.cp > 1) { /* its all-to-alls or ring hops staged over mpi */
        o.cp = t->mesh.group[LOCO_DIM_CP];
        o.cp_algo = strcmp(cfg->parallel.cp_algo, "ulysses") ? LOCO_CP_RING : LOCO_CP_ULYSSES;
    }
    if (t->pp) { /* the stage's chunks and slots, as the CPU stage's; its whole
                  * parameters at every ZeRO stage (as the CPU stage's) */
        o.stage = loco_gpt_stage_of(t->model);
        o.split_w = loco__pp_split_w(t->pp);
    } else if (cfg->parallel.zero_stage >= 3 && loco_comm_size(dp) > 1) {
        size_t lo, hi; /* the owned range zero.c will give this rank */
        loco_zero_owned(loco_gpt_num_params(t->model), loco_comm_rank(dp), loco_comm_size(dp), &lo,
                        &hi);
        o.lo = lo, o.hi = hi;
    }
    /* full: the first recompute_layers blocks (0: all) rerun their forward
     * in the backward. selective saves nothing more here: the device's
     * attention keeps only each row's log-sum-exp, never the
     * probabilities selective recompute drops. */
    if (!strcmp(cfg->train.recompute, "full")) {
        const int L = mc->n_layer, n = (int)cfg->train.recompute_layers;
        o.rerun = n > 0 && n < L ? n : L;
    }
    LOCO_CHECK(loco_gpt_cuda_create_with(&t->dev, mc, t->B, t->T, &o));
    if (t->pp)
        loco__pp_set_device(t->pp, t->dev);
    /* train.attention: the tensor-core kernel or the reference */
    LOCO_CHECK(loco_gpt_cuda_set_attention(t->dev, cfg->train.attention));
    loco_gpt_cuda_set_graph(t->dev, !strcmp(cfg->train.cuda_graph, "on"));
    return 0;
}

static int alloc_dev(loco__train_dp *d, void **p, size_t bytes, const char *what) {
    return loco_cuda_slab_alloc(d->slab, p, bytes ? bytes : 4, what);
}

/* ZeRO-3's unit buffers: device slots, and host staging under mpi. */
static int zero3_init(loco__train_dp *d) {
    size_t e0, e1, b0, b1, f0, f1;
    loco_gpt_cuda_unit_range(d->g, 0, &e0, &e1);
    loco_gpt_cuda_unit_range(d->g, 1, &b0, &b1);
    loco_gpt_cuda_unit_range(d->g, d->L + 1, &f0, &f1);
    const size_t sizes[LOCO_ZERO_SLOTS] = {e1 - e0, f1 - f0, b1 - b0, b1 - b0};
    size_t most = 0, bytes = 0;
    for (int i = 0; i < LOCO_ZERO_SLOTS; i++) {
        most = sizes[i] > most ? sizes[i] : most;
        bytes += sizes[i] * (d->es + 8) + 3 * 512;
    }
    LOCO_CHECK(loco_cuda_slab_create(&d->slab, bytes));
    for (int i = 0; i < LOCO_ZERO_SLOTS; i++) {
        unit_slot *s = &d->slot[i];
        LOCO_CHECK(alloc_dev(d, &s->w, sizes[i] * d->es, "ZeRO-3 gathered weights"));
        LOCO_CHECK(alloc_dev(d, (void **)&s->grads, sizes[i] * 4, "ZeRO-3 unit gradients"));
        LOCO_CHECK(alloc_dev(d, (void **)&s->staging, sizes[i] * 4, "ZeRO-3 reduced part"));
    }
    if (!d->staged)
        return 0;
    const size_t own = d->hi - d->lo;
    LOCO_CHECK(loco_cuda_host_alloc((void **)&d->hunit, most * 4 + 4));
    LOCO_CHECK(loco_cuda_host_alloc((void **)&d->hshard, own * d->es + 4));
    LOCO_CHECK(loco_cuda_host_alloc((void **)&d->hpart, own * 4 + 4));
    d->hshard_version = UINT64_MAX;
    return 0;
}

/* The plan of the device model's units: zero.c's, except that ZeRO-2
 * keeps a whole gradient buffer here and so reduces in buckets. */
static int plan(loco__train_dp *d) {
    const int n_units = d->L + 2;
    size_t *bounds = loco_alloc(((size_t)n_units + 1) * sizeof(size_t));
    if (!bounds)
        return LOCO_ERR(LOCO_ENOMEM, "device ZeRO unit table");
    size_t a, b;
    for (int u = 0; u < n_units; u++) {
        loco_gpt_cuda_unit_range(d->g, u, &a, &b);
        bounds[u] = a;
        bounds[u + 1] = b;
    }
    const double elems = d->t->cfg.parallel.bucket_mb * 1024 * 1024 / sizeof(float);
    const loco_zero_plan_spec spec = {
        .n_params = d->P, .n_units = n_units, .unit_lo = bounds, .dp = d->n, .rank = d->rank,
        .stage = d->stage, .bucket_elems = (size_t)elems, .unit_buffers = d->stage >= 3};
    int rc = loco_zero_plan_init(&d->plan, &spec);
    loco_free(bounds);
    LOCO_CHECK(rc);
    /* where both keep the same buffers, the host's plan is this one */
    const loco_zero_plan *host = loco_zero_plan_of(d->t->zero);
    if (d->stage != 2 && d->stage == host->stage && !d->t->pp &&
        !loco_zero_plan_equal(&d->plan, host))
        return LOCO_ERR(LOCO_EINVAL, "device ZeRO-%d plan differs from the host's (units or "
                        "sizes of the device model)", d->stage);
    return 0;
}

int loco__train_device_dp_init(loco_trainer *t) {
    loco_comm *dp = t->mesh.dp_cp;
    const int n = loco_comm_size(dp);
    if (t->dev_comm &&
        (loco_comm_size(t->dev_comm) != n || loco_comm_rank(t->dev_comm) != loco_comm_rank(dp)))
        return LOCO_ERR(LOCO_EINVAL,
                        "parallel.backend = nccl: the NCCL world (rank %d of %d) is not the "
                        "data-parallel group (rank %d of %d)",
                        loco_comm_rank(t->dev_comm), loco_comm_size(t->dev_comm),
                        loco_comm_rank(dp), n);
    if (n == 1 && !t->dev_comm) /* one rank, nothing to reduce */
        return 0;
    loco__train_dp *d = loco_alloc(sizeof *d);
    if (!d)
        return LOCO_ERR(LOCO_ENOMEM, "device data-parallel state");
    memset(d, 0, sizeof *d);
    t->ddp = d;
    d->t = t;
    d->g = t->dev;
    d->c = t->dev_comm ? t->dev_comm : dp;
    d->host = dp;
    d->staged = !t->dev_comm;
    d->n = n;
    d->rank = loco_comm_rank(dp);
    d->L = loco_gpt_cfg(t->model)->n_layer;
    d->es = !strcmp(t->cfg.train.dtype, "bf16") ? 2 : 4;
    size_t hl, hh;
    loco_gpt_cuda_shard(t->dev, &hl, &hh, NULL, NULL);
    loco_gpt_cuda_state(t->dev, NULL, NULL, NULL, NULL, &d->P);
    loco_zero_range(t->zero, &d->lo, &d->hi);
    /* one rank's ZeRO-3 shard is the whole model: ZeRO-2's path */
    d->stage = loco_zero_stage(t->zero);
    if (d->stage >= 3 && hh - hl == d->P)
        d->stage = 2;
    if (d->stage >= 3 && (hl != d->lo || hh != d->hi))
        return LOCO_ERR(LOCO_EINVAL, "device model holds [%zu, %zu), ZeRO owns [%zu, %zu)", hl,
                        hh, d->lo, d->hi);
    d->counts = loco_alloc((size_t)n * sizeof(size_t));
    if (!d->counts)
        return LOCO_ERR(LOCO_ENOMEM, "data-parallel tables");
    LOCO_CHECK(plan(d));
    const size_t own = d->hi - d->lo;
    if (d->stage >= 3) {
        LOCO_CHECK(zero3_init(d));
    } else if (d->staged) {
        /* pinned: the copies to and from the device run at full speed */
        LOCO_CHECK(loco_cuda_host_alloc((void **)&d->hstage, d->P * sizeof(float)));
        if (d->stage == 2)
            LOCO_CHECK(loco_cuda_host_alloc((void **)&d->hown, (own ? own : 1) * sizeof(float)));
    } else if (d->stage == 2) {
        LOCO_CHECK(loco_cuda_slab_create(&d->slab, own * sizeof(float) + 512));
        LOCO_CHECK(alloc_dev(d, (void **)&d->down, own * sizeof(float),
                             "owned reduced gradients"));
    }
    /* staged gathers block: a prefetch would not overlap anything */
    LOCO_CHECK(loco_zero_exec_create(&d->exec, &d->plan, &device_ops, d, !d->staged));
    if (t->pp) /* a stage's reductions run after its schedule (pipeline_step) */
        return 0;
    loco_gpt_cuda_hooks h = {.ctx = d, .acquire = hook_acquire, .grads_ready = hook_grads_ready};
    loco_gpt_cuda_set_hooks(t->dev, &h);
    return 0;
}

void loco__train_device_destroy(loco_trainer *t) {
    loco__train_dp *d = t->ddp;
    if (d) {
        /* nothing in flight may outlive the buffers it moves */
        loco_zero_exec_destroy(d->exec);
        if (t->dev) {
            (void)loco_cuda_sync(STREAM);
            loco_gpt_cuda_set_hooks(t->dev, NULL);
        }
        loco_cuda_slab_destroy(d->slab);
        loco_cuda_host_free(d->hstage);
        loco_cuda_host_free(d->hown);
        loco_cuda_host_free(d->hunit);
        loco_cuda_host_free(d->hshard);
        loco_cuda_host_free(d->hpart);
        loco_zero_plan_fini(&d->plan);
        loco_free(d->counts);
        loco_free(d);
        t->ddp = NULL;
    }
    loco_gpt_cuda_destroy(t->dev);
    t->dev = NULL;
    loco_comm_destroy(t->dev_comm);
    t->dev_comm = NULL;
}

/* ----------------------------------------------------------------- step */

/* The rest of the step over dp, after the backward and its reductions:
 * the global norm, clipping and AdamW (ZeRO 0: every parameter on every
 * rank; 1-2: the owned range, then the parameters all-gathered; 3: the
 * owned range, gathered unit by unit by the next passes), as
 * loco_zero_step defines them on the CPU. */
static int finish_dp(loco__train_dp *d, float lr, double *norm) {
    loco_trainer *t = d->t;
    const double clip = t->cfg.train.grad_clip;
    float *params;
    loco_gpt_cuda_state(d->g, &params, NULL, NULL, NULL, NULL);
    const size_t own = d->hi - d->lo;
    if (d->stage < 2 && loco_gpt_cfg(t->model)->tp <= 1 && !t->pp &&
        t->mesh.size[LOCO_DIM_EP] <= 1) /* the whole gradient */
        LOCO_CHECK(loco_gpt_cuda_clip(d->g, clip, norm));
    else if (d->stage < 2) /* the slice's or the stage's, summed over tp, pp and ep */
        LOCO_CHECK(loco__train_device_clip(t, NULL, 0, d->P, norm));
    else /* the owned parts' sums */
        LOCO_CHECK(loco__train_device_clip(t, d->host, d->lo, d->hi, norm));
    if (!isfinite(*norm))
        return 0; /* as loco_zero_step: the caller reports divergence */
    t->host_stale = true;
    loco_adamw *opt = loco_zero_optimizer(t->zero, NULL, NULL);
    if (d->stage == 0)
        return loco_gpt_cuda_adamw(d->g, opt, lr);
    LOCO_CHECK(loco_gpt_cuda_adamw_range(d->g, opt, lr, d->lo, d->hi));
    if (d->stage >= 3) /* the owned weights refreshed: every slot is stale */
        return loco_gpt_cuda_upload(d->g, NULL, NULL, NULL);
    if (!d->staged) { /* in place: this rank's block is params + lo */
        for (int r = 0; r < d->n; r++)
            d->counts[r] = d->plan.own[r + 1] - d->plan.own[r];
        LOCO_CHECK(loco_comm_allgather(d->c, params + d->lo, params, d->counts, LOCO_DT_F32));
        return loco_gpt_cuda_upload(d->g, NULL, NULL, NULL); /* the bf16 copy */
    }
    for (int r = 0; r < d->n; r++)
        d->counts[r] = d->plan.own[r + 1] - d->plan.own[r];
    LOCO_CHECK(loco_cuda_copy(d->hstage + d->lo, params + d->lo, own * sizeof(float), STREAM));
    LOCO_CHECK(loco_cuda_sync(STREAM));
    LOCO_CHECK(loco_comm_allgather(d->c, d->hstage + d->lo, d->hstage, d->counts, LOCO_DT_F32));
    return loco_gpt_cuda_upload(d->g, d->hstage, NULL, NULL);
}

/* The step's end without a dp group: the ep pre-reduction, the norm over
 * the tp, pp and ep groups, AdamW. */
static int finish_one(loco_trainer *t, float lr, double *norm) {
    size_t P;
    float *grads;
    loco_gpt_cuda_state(t->dev, NULL, &grads, NULL, NULL, &P);
    LOCO_CHECK(loco__train_device_ep_prereduce(t, grads, 0, P));
    LOCO_CHECK(loco__train_device_clip(t, NULL, 0, P, norm));
    if (!isfinite(*norm))
        return 0; /* as loco_zero_step: the caller reports divergence */
    t->host_stale = true;
    return loco_gpt_cuda_adamw(t->dev, loco_zero_optimizer(t->zero, NULL, NULL), lr);
}

/* A pipeline stage's step: the schedule runs the chunk passes (train_pp.c,
 * the tied wte's copies summed at its end), then the stage's gradients
 * are reduced over dp in the plan's buckets (ZeRO 0-2: all-reduced or
 * reduce-scattered, in the order a backward makes them ready), then the
 * norm over the stages and AdamW. */
static int pipeline_step(loco_trainer *t, double *loss_sum, float lr, double *norm) {
    const int accum = (int)t->cfg.train.grad_accum;
    const size_t n = (size_t)t->B * t->T;
    for (int micro = 0; micro < accum; micro++)
        LOCO_CHECK(loco_data_next(t->train, t->mb_inputs + micro * n, t->mb_targets + micro * n));
    LOCO_CHECK(loco_gpt_cuda_zero_grad(t->dev));
    double loss;
    LOCO_CHECK(loco__pp_step(t->pp, t->mb_inputs, t->mb_targets, &loss));
    *loss_sum = loss * accum;
    loco__train_dp *d = t->ddp;
    if (d) {
        loco_zero_exec_micro(d->exec, true);
        for (int k = 0; k < d->plan.n_units; k++)
            LOCO_CHECK(loco_zero_exec_grads_ready(d->exec, d->plan.order[k]));
        LOCO_CHECK(loco_zero_exec_finish(d->exec));
        LOCO_CHECK(copy_back(d));
        return finish_dp(d, lr, norm);
    }
    return finish_one(t, lr, norm);
}

int loco__train_device_step(loco_trainer *t, double *loss_sum, float lr, double *norm) {
    const int accum = (int)t->cfg.train.grad_accum;
    loco__train_dp *d = t->ddp;
    if (t->pp)
        return pipeline_step(t, loss_sum, lr, norm);
    LOCO_CHECK(loco_gpt_cuda_zero_grad(t->dev));
    for (int micro = 0; micro < accum; micro++) {
        LOCO_CHECK(loco_data_next(t->train, t->inputs, t->targets));
        if (d)
            loco_zero_exec_micro(d->exec, micro == accum - 1);
        /* no wait: the micro-steps' mean losses add up on the device, the
         * hooks start the reductions */
        LOCO_CHECK(loco_gpt_cuda_forward_backward(t->dev, t->inputs, t->targets, t->B, t->T,
                                                  1.0f / (float)accum, NULL));
    }
    if (d) {
        LOCO_CHECK(loco_zero_exec_finish(d->exec));
        if (d->stage < 3)
            LOCO_CHECK(copy_back(d));
        LOCO_CHECK(loco_gpt_cuda_loss_sum(t->dev, loss_sum));
        return finish_dp(d, lr, norm);
    }
    loco_adamw *opt = loco_zero_optimizer(t->zero, NULL, NULL);
    if (loco_gpt_cfg(t->model)->tp > 1 || t->mesh.size[LOCO_DIM_EP] > 1) {
        /* the norm sums over the tp and ep groups */
        LOCO_CHECK(loco_gpt_cuda_loss_sum(t->dev, loss_sum));
        return finish_one(t, lr, norm);
    }
    /* clip and AdamW queued, one wait; AdamW skipped on the device when the
     * norm is not finite (the caller reports divergence) */
    t->host_stale = true;
    return loco_gpt_cuda_clip_adamw(t->dev, opt, lr, t->cfg.train.grad_clip, norm, loss_sum);
}

#endif /* LOCO_HAVE_CUDA */
