/* The single-island trainer: made from the config, its step
 * (micro-batches, clipping, AdamW), evaluation and checkpoints (the run
 * around the steps is train_run.c); on the CPU, or (train.device = cuda) on GPUs
 * through loco_gpt_cuda (train_device.c), with the host model and
 * optimizer kept as the layouts checkpoints and the outer loop read. */
#include "inner/train/internal.h"

#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

void loco_trainer_destroy(loco_trainer *t) {
    if (!t)
        return;
#if defined(LOCO_HAVE_CUDA)
    loco__train_device_destroy(t);
#endif
    loco_zero_destroy(t->zero);
    loco__pp_destroy(t->pp);
    loco_free(t->mb_inputs);
    loco_free(t->mb_targets);
    loco_gpt_destroy(t->model);
    loco_data_close(t->train);
    loco_data_close(t->val);
    loco_metrics_close(t->metrics);
    loco_prom_destroy(t->prom);
    loco_free(t->inputs);
    loco_free(t->targets);
    loco_mesh_fini(&t->mesh);
    loco_comm_destroy(t->world);
    loco_free(t);
}

static bool on_device(const loco_trainer *t) { return !strcmp(t->cfg.train.device, "cuda"); }

/* The flat ranges this rank holds, as a checkpoint sees them. */
static loco_ckpt_view trainer_view(loco_trainer *t) {
    loco_ckpt_view v = {.tt = loco_gpt_table(t->model), .model = *loco_gpt_cfg(t->model),
                        .tp_rank = loco_gpt_tp_rank(t->model)};
    v.router_bias = loco_gpt_router_bias(t->model, &v.n_router_bias);
    if (t->pp) {
        v.stage = loco_gpt_stage_of(t->model);
        v.pp_rank = t->mesh.coord[LOCO_DIM_PP];
    }
    loco_zero_held_params(t->zero, &v.p_lo, &v.p_hi, &v.params);
    loco_adamw *opt = loco_zero_optimizer(t->zero, &v.o_lo, &v.o_hi);
    v.m = opt->m;
    v.v = opt->v;
    v.adam_t = opt->t;
    return v;
}

/* train.init_from: every rank fills its own part (tp slice, stage, ZeRO-3
 * range) from the Hugging Face directory; the optimizer stays fresh. They
 * agree on the outcome so that none waits alone in a later collective. */
static int init_from_hf(loco_trainer *t) {
    loco_ckpt_view v = trainer_view(t);
    const int loaded = loco_hf_import_view(t->cfg.train.init_from, &v);
    int ok = loaded == 0;
    LOCO_CHECK(loco_comm_allreduce(t->world, &ok, 1, LOCO_DT_I32, LOCO_OP_SUM));
    if (loaded < 0)
        return loaded;
    if (ok != loco_comm_size(t->world))
        return LOCO_ERR(LOCO_EPROTO, "init_from %s: %d rank(s) could not load their part (their "
                        "error is in the log)", t->cfg.train.init_from,
                        loco_comm_size(t->world) - ok);
    return 0;
}

static loco_recompute recompute_of(const loco_config *cfg) {
    if (!strcmp(cfg->train.recompute, "selective"))
        return LOCO_RECOMPUTE_SELECTIVE;
    return !strcmp(cfg->train.recompute, "full") ? LOCO_RECOMPUTE_FULL : LOCO_RECOMPUTE_NONE;
}

int loco_trainer_create(loco_trainer **out, const loco_config *cfg, const char *resume_dir) {
    return loco_trainer_create_island(out, cfg, resume_dir, 0, 1);
}

/* The island's ranks: the world (and, with parallel.backend = nccl, the
 * device's communicator), the mesh over them, who logs. */
static int join_island(loco_trainer *t, const loco_config *cfg) {
    /* parallel.backend = nccl (train.device = cuda): the host's collectives
     * stay on the launcher's communicator (auto), the device's go over NCCL. */
    const bool nccl = !strcmp(cfg->parallel.backend, "nccl");
    LOCO_CHECK(loco_comm_world(&t->world, nccl ? "auto" : cfg->parallel.backend));
    LOCO_CHECK(loco__train_check_device(cfg));
#if defined(LOCO_HAVE_CUDA)
    if (nccl) /* picks this rank's device: before the device model */
        LOCO_CHECK(loco_comm_world(&t->dev_comm, "nccl"));
#endif
    LOCO_CHECK(loco_mesh_init(&t->mesh, cfg, t->world));
    t->dp = t->mesh.data; /* every data-parallel rank, ep folded in */
    t->root = loco_comm_rank(t->world) == 0;
    if (!t->root && loco_log_get_level() > LOCO_LOG_WARN)
        loco_log_set_level(LOCO_LOG_WARN);
    return 0;
}

/* This rank's part of the model: its tp slice and ep rank's experts. */
static loco_gpt_config model_config_of(const loco_trainer *t, const loco_config *cfg) {
    loco_gpt_config mc = loco_gpt_config_from(cfg);
    mc.tp = (int)cfg->parallel.tp;
    mc.ep = t->mesh.size[LOCO_DIM_EP];
    mc.ep_rank = t->mesh.coord[LOCO_DIM_EP];
    return mc;
}

/* How the model's passes split over the mesh's groups (the pipeline stage
 * is set once planned). */
static loco_gpt_parallel parallel_of(const loco_trainer *t, const loco_config *cfg,
                                     const loco_gpt_config *mc) {
    return (loco_gpt_parallel){
        .tp = mc->tp > 1 ? t->mesh.group[LOCO_DIM_TP] : NULL,
        .sp = cfg->parallel.sp,
        .recompute = recompute_of(cfg),
        .recompute_layers = (int)cfg->train.recompute_layers,
        .cp = t->mesh.size[LOCO_DIM_CP] > 1 ? t->mesh.group[LOCO_DIM_CP] : NULL,
        .cp_algo = !strcmp(cfg->parallel.cp_algo, "ulysses") ? LOCO_CP_ULYSSES : LOCO_CP_RING,
        .ep = mc->ep > 1 ? t->mesh.group[LOCO_DIM_EP] : NULL,
    };
}

/* The model (and the device's), its ZeRO over dp x cp, and the pipeline
 * stage's executor bound to both. */
static int make_model(loco_trainer *t, const loco_config *cfg, const loco_gpt_config *mc,
                      const loco_gpt_parallel *par) {
    /* A pipeline stage keeps whole buffers at every ZeRO stage. */
    unsigned flags =
        cfg->parallel.pp > 1 ? 0 : loco_zero_model_flags((int)cfg->parallel.zero_stage);
    if (on_device(t))
        flags |= LOCO_GPT_NO_ACTS; /* the passes run on the device */
    LOCO_CHECK(loco_gpt_create_par(&t->model, mc, t->B, t->T, flags, par));
#if defined(LOCO_HAVE_CUDA)
    if (on_device(t))
        LOCO_CHECK(loco__train_device_create(t, mc));
#endif
    /* The ranks of a dp group's cp slices hold the same parameters: ZeRO
     * averages and shards over dp x cp (Megatron's dp-cp group). */
    LOCO_CHECK(loco_zero_create(&t->zero, t->model, t->mesh.dp_cp, cfg));
    LOCO_CHECK(loco_zero_set_experts(t->zero, par->ep));
#if defined(LOCO_HAVE_CUDA)
    if (t->dev)
        LOCO_CHECK(loco__train_device_dp_init(t));
#endif
    if (t->pp) {
        LOCO_CHECK(loco__pp_bind(t->pp, t->model, &t->mesh, t->B, t->T, t->zero));
        loco_zero_set_pipeline(t->zero, t->mesh.group[LOCO_DIM_PP]);
    }
    return 0;
}

/* The batch buffers (a pipeline step's `accum` micro-batches too) and the
 * loaders: island `island` of n_islands reads its dp ranks' windows. */
static int open_data(loco_trainer *t, const loco_config *cfg, int accum, int island,
                     int n_islands) {
    const size_t bt = (size_t)t->B * t->T;
    t->inputs = loco_alloc(bt * sizeof(int32_t));
    t->targets = loco_alloc(bt * sizeof(int32_t));
    if (t->pp) {
        t->mb_inputs = loco_alloc((size_t)accum * bt * sizeof(int32_t));
        t->mb_targets = loco_alloc((size_t)accum * bt * sizeof(int32_t));
    }
    if (!t->inputs || !t->targets || (t->pp && (!t->mb_inputs || !t->mb_targets)))
        return LOCO_ERR(LOCO_ENOMEM, "batch buffers");
    const int dp = loco_comm_size(t->dp), V = (int)cfg->model.vocab_size;
    LOCO_CHECK(loco_data_open(&t->train, cfg->data.train, t->B, t->T,
                              island * dp + loco_comm_rank(t->dp), n_islands * dp, V));
    if (cfg->data.val[0])
        LOCO_CHECK(loco_data_open(&t->val, cfg->data.val, t->B, t->T, 0, 1, V));
    /* Every checkpoint copies the tokenizer: a bad path fails now, not at
     * the first checkpoint after hours of training. */
    if (cfg->data.tokenizer[0] && access(cfg->data.tokenizer, R_OK) != 0)
        return LOCO_ERR(LOCO_EINVAL, "data.tokenizer = %s: cannot read it: %s (every checkpoint "
                                     "holds a copy as tokenizer.json)",
                        cfg->data.tokenizer, strerror(errno));
    return 0;
}

/* Continues from the checkpoint resume_dir: weights, moments, the
 * loader's position, step and RNG. */
static int resume_from(loco_trainer *t, const char *resume_dir) {
    const loco_config *cfg = &t->cfg;
    loco_ckpt_state st;
    loco_ckpt_view v = trainer_view(t);
    /* Every rank reads its own part: they agree on the outcome, so a
     * rank that cannot load never leaves the others waiting in a
     * collective. */
    const int loaded = loco_ckpt_load_view(resume_dir, cfg, &v, &st);
    int ok = loaded == 0;
    LOCO_CHECK(loco_comm_allreduce(t->world, &ok, 1, LOCO_DT_I32, LOCO_OP_SUM));
    if (loaded < 0)
        return loaded;
    if (ok != loco_comm_size(t->world))
        return LOCO_ERR(LOCO_EPROTO,
                        "checkpoint %s: %d rank(s) of this island could not load their part "
                        "(their error is in the log); nothing was loaded",
                        resume_dir, loco_comm_size(t->world) - ok);
    loco_zero_optimizer(t->zero, NULL, NULL)->t = v.adam_t;
    LOCO_CHECK(loco_data_seek(t->train, st.data));
    t->step = st.step;
    t->rng = st.rng;
    loco_info("resumed from %s at step %lld", resume_dir, (long long)t->step);
    if (cfg->train.init_from[0])
        loco_info("train.init_from = %s ignored: resuming from %s wins", cfg->train.init_from,
                  resume_dir);
    return 0;
}

/* A fresh start: train.seed's weights, or train.init_from's. */
static int init_weights(loco_trainer *t) {
    loco_zero_init_weights(t->zero, &t->rng);
    if (t->cfg.train.init_from[0])
        LOCO_CHECK(init_from_hf(t));
    return 0;
}

int loco_trainer_create_island(loco_trainer **out, const loco_config *cfg, const char *resume_dir,
                               int island, int n_islands) {
    *out = NULL;
    if (island < 0 || n_islands < 1 || island >= n_islands)
        return LOCO_ERR(LOCO_EINVAL, "island %d of %d", island, n_islands);
    LOCO_CHECK(loco_config_validate(cfg));
    if (cfg->run.ckpt_url[0] && !loco_store_is_url(cfg->run.ckpt_url))
        return LOCO_ERR(LOCO_EINVAL,
                        "run.ckpt_url = %s is not a URL (file://, http://, https://); local "
                        "checkpoints go under run.dir",
                        cfg->run.ckpt_url);
    loco_trainer *t = loco_alloc(sizeof *t);
    if (!t)
        return LOCO_ERR(LOCO_ENOMEM, "trainer");
    int rc;
    t->cfg = *cfg;
    t->end_step = cfg->train.steps;
    t->sched_step = -1;
    t->B = (int)cfg->train.batch_size;
    t->T = (int)cfg->model.seq_len;
    t->unigram = NAN;
    loco_set_threads((int)cfg->run.threads);
    LOCO_CHECK_GOTO(join_island(t, cfg), out_fail);
    const loco_gpt_config mc = model_config_of(t, cfg);
    loco_gpt_parallel par = parallel_of(t, cfg, &mc);
    loco_gpt_stage stage;
    const int accum = (int)cfg->train.grad_accum;
    if (t->mesh.size[LOCO_DIM_PP] > 1) {
        /* The step's micro-batches flow through the pipeline. */
        if (cfg->parallel.microbatches && cfg->parallel.microbatches != accum) {
            rc = LOCO_ERR(LOCO_EINVAL,
                          "parallel.microbatches = %lld but train.grad_accum = %d: under "
                          "pipeline parallelism the step's micro-batches are the pipeline's "
                          "(set only one of them: the other follows)",
                          (long long)cfg->parallel.microbatches, accum);
            goto out_fail;
        }
        LOCO_CHECK_GOTO(loco__pp_plan(&t->pp, cfg, &t->mesh, accum, &stage), out_fail);
        par.stage = &stage;
    }
    LOCO_CHECK_GOTO(make_model(t, cfg, &mc, &par), out_fail);
    LOCO_CHECK_GOTO(open_data(t, cfg, accum, island, n_islands), out_fail);
    loco_rng_seed(&t->rng, (uint64_t)cfg->train.seed);
    LOCO_CHECK_GOTO(resume_dir ? resume_from(t, resume_dir) : init_weights(t), out_fail);
    LOCO_CHECK_GOTO(loco__train_device_load(t, true), out_fail);
    if (t->root) /* made here so that the caller can serve it before the run */
        LOCO_CHECK_GOTO(loco__train_prom_create(&t->prom, cfg), out_fail);
    *out = t;
    return 0;
out_fail:
    loco_trainer_destroy(t);
    return rc;
}

int64_t loco_trainer_steps_done(const loco_trainer *t) { return t->step; }
void loco_trainer_set_step(loco_trainer *t, int64_t step) {
    t->step = step;
    t->first_step = step;
}

void loco_trainer_set_schedule_step(loco_trainer *t, int64_t step) { t->sched_step = step; }

void loco_trainer_set_end(loco_trainer *t, int64_t end_step) {
    if (end_step >= t->step)
        t->end_step = end_step;
}

float *loco_trainer_owned_params(loco_trainer *t, size_t *lo, size_t *hi) {
    loco_zero_range(t->zero, lo, hi);
    if (loco__train_host_sync(t) < 0)
        return NULL;
    return loco_zero_owned_params(t->zero);
}

/* ZeRO shards m->params (n_params = tt.numel elements) whatever the mesh,
 * so the model's table describes it: built by loco_gpt_build_stage_table
 * under pp, loco_gpt_build_table otherwise, both with tp's slice shapes
 * and ep's experts; at stage 3 the owned shard is [lo, hi) of it too. */
const loco_ttable *loco_trainer_param_table(loco_trainer *t) { return loco_gpt_table(t->model); }

int loco_trainer_whole_layout(loco_trainer *t, loco_ttable *whole, int64_t *idx) {
    size_t lo, hi;
    loco_zero_range(t->zero, &lo, &hi);
    LOCO_CHECK(loco_gpt_build_whole_table(t->model, whole));
    const int rc = loco_gpt_whole_index(t->model, whole, lo, hi, idx);
    if (rc < 0)
        loco_ttable_fini(whole);
    return rc;
}

uint64_t loco_trainer_take_pcie_bytes(loco_trainer *t) {
    const uint64_t b = t->pcie;
    t->pcie = 0;
    return b;
}

int loco_trainer_sync_params(loco_trainer *t) {
    /* A lossy outer step may round a replicated tensor differently on each
     * tp rank (its codec blocks hold other neighbours): tp rank 0's copy
     * is everyone's, so replicas stay identical. */
    LOCO_CHECK(loco_zero_sync_replicas(t->zero));
    LOCO_CHECK(loco_zero_sync_params(t->zero));
    /* The same for the tied embeddings' two copies across stages. */
    if (t->pp)
        LOCO_CHECK(loco__pp_sync_tied(t->pp));
    return loco__train_device_load(t, false);
}
int loco_trainer_rank(const loco_trainer *t) { return loco_comm_rank(t->world); }
struct loco_comm *loco_trainer_world(loco_trainer *t) { return t->world; }
int loco_trainer_ranks(const loco_trainer *t) { return loco_comm_size(t->world); }
loco_gpt *loco_trainer_model(loco_trainer *t) {
    if (loco__train_host_sync(t) < 0)
        loco_warn("the model's parameters could not be copied from the device: %s",
                  loco_errmsg());
    return t->model;
}

/* The step of loco_trainer_step through the pipeline: every rank of a dp
 * group reads the same micro-batches; the stage's gradients are complete
 * after the schedule, then ZeRO and AdamW as usual. *loss_sum: the sum of
 * the micro-batches' losses. */
static int pipeline_step(loco_trainer *t, double *loss_sum, float lr, double *norm) {
    const int accum = (int)t->cfg.train.grad_accum;
    const size_t n = (size_t)t->B * t->T;
    for (int micro = 0; micro < accum; micro++)
        LOCO_CHECK(loco_data_next(t->train, t->mb_inputs + micro * n, t->mb_targets + micro * n));
    loco_gpt_zero_grad(t->model);
    double loss;
    LOCO_CHECK(loco__pp_step(t->pp, t->mb_inputs, t->mb_targets, &loss));
    *loss_sum = loss * accum;
    return loco_zero_step(t->zero, lr, t->cfg.train.grad_clip, norm);
}

int loco_trainer_step(loco_trainer *t, loco_step_stats *stats) {
    double t0 = loco_now();
    loco_gpt_moe_reset(t->model); /* the step's routing, for metrics */
#if defined(LOCO_HAVE_CUDA)
    if (t->dev)
        loco_gpt_cuda_moe_reset(t->dev);
#endif
    const int accum = (int)t->cfg.train.grad_accum;
    double loss_sum = 0;
    float lr = loco_lr_at(&t->cfg, t->sched_step >= 0 ? t->sched_step : t->step);
    double norm;
#if defined(LOCO_HAVE_CUDA)
    if (t->dev) {
        LOCO_CHECK(loco__train_device_step(t, &loss_sum, lr, &norm));
        LOCO_CHECK(loco__train_device_moe_sync(t, true)); /* what it routed, for the host */
        goto stepped;
    }
#endif
    if (t->pp) {
        LOCO_CHECK(pipeline_step(t, &loss_sum, lr, &norm));
        goto stepped;
    }
    loco_gpt_zero_grad(t->model);
    for (int micro = 0; micro < accum; micro++) {
        LOCO_CHECK(loco_data_next(t->train, t->inputs, t->targets));
        loco_zero_micro_begin(t->zero, micro == 0, micro == accum - 1);
        float loss;
        LOCO_CHECK(loco_gpt_forward_backward(t->model, t->inputs, t->targets, t->B, t->T,
                                             1.0f / (float)accum, &loss));
        loss_sum += loss;
    }
    LOCO_CHECK(loco_zero_step(t->zero, lr, t->cfg.train.grad_clip, &norm));
stepped:
    if (!isfinite(norm))
        return LOCO_ERR(LOCO_EINVAL, "step %lld: gradient norm is %g (training diverged)",
                        (long long)t->step + 1, norm);
    /* DeepSeek-V3's routing biases follow the step's load over the whole
     * island (pp stages count 0 for the blocks they do not hold, so every
     * rank ends with every layer's biases). */
    LOCO_CHECK(loco_gpt_router_bias_step(t->model, t->world));
#if defined(LOCO_HAVE_CUDA)
    if (t->dev && loco_gpt_cfg(t->model)->router_bias_rate > 0) /* the moved biases */
        LOCO_CHECK(loco__train_device_moe_sync(t, false));
#endif
    double loss = loss_sum / accum;
    if (loco_comm_size(t->dp) > 1)
        LOCO_CHECK(loco_comm_allreduce(t->dp, &loss, 1, LOCO_DT_F64, LOCO_OP_AVG));
    t->step++;
    double dt = loco_now() - t0;
    if (stats) {
        stats->step = t->step;
        stats->loss = (float)loss;
        stats->lr = lr;
        stats->grad_norm = norm;
        stats->seconds = dt;
        stats->tokens_per_s =
            (double)t->B * t->T * accum * loco_comm_size(t->dp) / dt;
    }
    return 0;
}

int loco_trainer_eval(loco_trainer *t, int batches, double *val_loss, int64_t *tokens) {
    if (!t->val)
        return LOCO_ERR(LOCO_EINVAL, "no validation data (data.val is empty)");
    LOCO_CHECK(loco_data_seek(t->val, (loco_data_pos){0, 0, 0}));
    double sum = 0;
    for (int b = 0; b < batches; b++) {
        float loss;
        LOCO_CHECK(loco_data_next(t->val, t->inputs, t->targets));
        if (t->pp) { /* the stage's chunks, on the device model where it runs them */
            double l;
            LOCO_CHECK(loco__pp_eval(t->pp, t->inputs, t->targets, &l));
            sum += l;
            continue;
        }
#if defined(LOCO_HAVE_CUDA)
        if (t->dev) {
            LOCO_CHECK(loco_gpt_cuda_forward(t->dev, t->inputs, t->targets, t->B, t->T, &loss));
            sum += loss;
            continue;
        }
#endif
        LOCO_CHECK(loco_gpt_forward(t->model, t->inputs, t->targets, t->B, t->T, &loss));
        sum += loss;
    }
    *val_loss = sum / batches;
    if (tokens)
        *tokens = (int64_t)batches * t->B * t->T;
    return 0;
}

/* A URL: the checkpoint is written to the staging directory as usual, then
 * rank 0 uploads it; every rank learns whether it was published. */
static int save_to_url(loco_trainer *t, const char *url) {
    char stage[PATH_MAX];
    LOCO_CHECK(loco_ckpt_stage_dir(&t->cfg, t->step, stage, sizeof stage));
    int rc = loco_trainer_save(t, stage);
    if (rc == 0 && t->root)
        rc = loco_ckpt_upload(stage, url, &t->cfg, t->step);
    if (t->root) {
        loco_rmtree(stage);
        rmdir(dirname(stage)); /* ckpt_stage, unless another save uses it */
    }
    int ok = rc == 0;
    LOCO_CHECK(loco_comm_allreduce(t->world, &ok, 1, LOCO_DT_I32, LOCO_OP_SUM));
    if (rc == 0 && ok != loco_comm_size(t->world))
        rc = LOCO_ERR(LOCO_EIO, "checkpoint %s was not published: another rank failed", url);
    return rc;
}

int loco_trainer_save(loco_trainer *t, const char *dir) {
    if (loco_store_is_url(dir))
        return save_to_url(t, dir);
    LOCO_CHECK(loco__train_host_sync(t));
    static const char *const model_sections[] = {"model", NULL};
    loco_ckpt_state st = {
        .step = t->step,
        .data = loco_data_tell(t->train),
        .rng = t->rng,
        .model_hash = loco_config_hash(&t->cfg, model_sections),
    };
    loco_ckpt_view v = trainer_view(t);
    /* Every rank of the island holds a distinct (tp slice, dp range) pair. */
    /* Shards of a tp slice: one per rank of the dp x cp group ZeRO uses. */
    const int n = loco_comm_size(t->world), dp = loco_comm_size(t->mesh.dp_cp);
    const int tp_rank = t->mesh.coord[LOCO_DIM_TP], dp_rank = loco_comm_rank(t->mesh.dp_cp);
    const int pp_rank = t->mesh.coord[LOCO_DIM_PP], tp = t->mesh.size[LOCO_DIM_TP];
    if (n == 1)
        return t->root ? loco_ckpt_save_view(dir, &t->cfg, &v, &st) : 0;
    /* Sharded: every rank writes its owned range of its tp slice into
     * DIR.tmp (shard index = tp rank x dp + dp rank, so each slice's shards
     * are in order), rank 0 ties them with the manifest and publishes.
     * Ranks share a file system. */
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", dir) >= (int)sizeof tmp)
        return LOCO_ERR(LOCO_EINVAL, "checkpoint path too long: %s", dir);
    int rc = 0;
    if (t->root) {
        rc = loco_rmtree(tmp);
        if (rc == 0)
            rc = loco_mkdirs(tmp);
    }
    int ok = rc == 0;
    LOCO_CHECK(loco_comm_allreduce(t->world, &ok, 1, LOCO_DT_I32, LOCO_OP_SUM));
    if (ok != n)
        return rc < 0 ? rc : LOCO_ERR(LOCO_EIO, "rank 0 could not create %s", tmp);
    size_t lo, hi;
    loco_zero_range(t->zero, &lo, &hi);
    uint64_t h = 0;
    /* group: pp rank x ep + ep rank (the ranks' tables differ by both) */
    const int group = pp_rank * t->mesh.size[LOCO_DIM_EP] + t->mesh.coord[LOCO_DIM_EP];
    const int index = (group * tp + tp_rank) * dp + dp_rank;
    rc = loco_ckpt_write_shard(tmp, index, &v, lo, hi, &h);
    /* Every rank learns every shard's index, range, checksum and success. */
    enum { F = 5 };
    int64_t *all = loco_alloc((size_t)n * F * sizeof(int64_t));
    if (!all)
        return LOCO_ERR(LOCO_ENOMEM, "shard table");
    int64_t mine[F] = {index, (int64_t)lo, (int64_t)hi, (int64_t)h, rc == 0};
    size_t *counts = loco_alloc((size_t)n * sizeof(size_t));
    size_t *los = loco_alloc((size_t)n * 2 * sizeof(size_t));
    uint64_t *hashes = loco_alloc((size_t)n * sizeof(uint64_t));
    int *tp_ranks = loco_alloc((size_t)n * 2 * sizeof(int));
    int *pp_ranks = tp_ranks ? tp_ranks + n : NULL;
    int rc2 = 0;
    if (!counts || !los || !hashes || !tp_ranks)
        rc2 = LOCO_ERR(LOCO_ENOMEM, "shard table");
    for (int i = 0; counts && i < n; i++)
        counts[i] = F;
    if (rc2 == 0)
        rc2 = loco_comm_allgather(t->world, mine, all, counts, LOCO_DT_I64);
    bool all_ok = rc2 == 0;
    for (int i = 0; all_ok && i < n; i++) {
        const int64_t *e = all + (size_t)F * i;
        const int at = (int)e[0]; /* the manifest lists shards by index */
        all_ok = e[4] == 1 && at >= 0 && at < n;
        if (!all_ok)
            break;
        los[at] = (size_t)e[1];
        los[n + at] = (size_t)e[2];
        hashes[at] = (uint64_t)e[3];
        tp_ranks[at] = at / dp % tp;
        pp_ranks[at] = at / dp / tp;
    }
    if (rc == 0 && rc2 == 0 && !all_ok)
        rc = LOCO_ERR(LOCO_EIO, "another rank failed to write its checkpoint shard");
    if (rc == 0 && rc2 == 0 && t->root)
        rc = loco_ckpt_write_manifest_pp(tmp, dir, &t->cfg, &v, n, los, los + n, hashes, tp_ranks,
                                         pp_ranks, t->pp ? loco__pp_stages(t->pp) : NULL,
                                         t->mesh.size[LOCO_DIM_PP], &st);
    loco_free(all);
    loco_free(counts);
    loco_free(los);
    loco_free(hashes);
    loco_free(tp_ranks);
    if (rc2 < 0)
        return rc2;
    /* The directory is published (or not) before any rank goes on. */
    int pub = rc == 0;
    LOCO_CHECK(loco_comm_allreduce(t->world, &pub, 1, LOCO_DT_I32, LOCO_OP_SUM));
    if (rc == 0 && pub != n)
        rc = LOCO_ERR(LOCO_EIO, "checkpoint %s was not published: another rank failed", dir);
    return rc;
}

loco_prom *loco_trainer_prom(loco_trainer *t) { return t->prom; }
