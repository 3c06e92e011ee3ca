/* The trainer's state, shared by the files of inner/train/ only: train.c
 * (making it, the CPU step, checkpoints), train_run.c (logging, evals
 * and checkpoints between steps), train_device.c (train.device = cuda:
 * the device model and its data-parallel step), train_pp.c (the pipeline
 * stage) and train_metrics.c (live metrics). */
#ifndef LOCO_INNER_TRAIN_INTERNAL_H
#define LOCO_INNER_TRAIN_INTERNAL_H

#include "inner/ckpt/ckpt.h"
#include "inner/mesh/mesh.h"
#include "inner/parallel/parallel.h"
#include "inner/train/train.h"

/* The trainer's pipeline stage (parallel.pp > 1, train_pp.c): the
 * schedule, this rank's chunks and their activation slots, the executor
 * driving the model's chunk passes, the tied embeddings between the first
 * and last stage. */
typedef struct loco__pp loco__pp;

/* The schedule of [parallel] and this rank's stage (its chunks: the
 * model's blocks cut into p·v equal chunks, placed as the schedule says;
 * its slots: the most (micro-batch, chunk) activations the schedule keeps
 * on this rank). m micro-batches per step. LOCO_EINVAL when the blocks do
 * not divide into the chunks, or the schedule refuses the shape. */
int loco__pp_plan(loco__pp **out, const loco_config *cfg, const loco_mesh *mesh, int m,
                  loco_gpt_stage *stage);
/* Every pp rank's stage (p entries), for checkpoints. */
const loco_gpt_stage *loco__pp_stages(const loco__pp *pp);
/* Whether this rank's list runs W apart from B (zero bubble, DualPipe). */
bool loco__pp_split_w(const loco__pp *pp);
#if defined(LOCO_HAVE_CUDA)
/* The device model runs the stage's passes from now (the CPU model keeps
 * the tables, the host copies and the tied wte's staging). */
void loco__pp_set_device(loco__pp *pp, loco_gpt_cuda *dev);
#endif
/* After the stage's model and its ZeRO are made: the executor (messages of
 * one micro-batch's activation rows), the tied-embedding group, and the
 * chunks' flat ranges, which the step reports to zero as their gradients
 * become final (and, at stage 3, gathers before their first forward). */
int loco__pp_bind(loco__pp *pp, loco_gpt *model, const loco_mesh *mesh, int B, int T,
                  loco_zero *zero);
void loco__pp_destroy(loco__pp *pp); /* accepts NULL */
/* One step's forwards and backwards of m micro-batches (inputs and
 * targets: m x B x T) through the schedule, gradients added to the
 * model's; the tied wte's two copies get their summed gradient. *loss:
 * the mean loss over the micro-batches, on every pp rank. */
int loco__pp_step(loco__pp *pp, const int32_t *inputs, const int32_t *targets, double *loss);
/* The mean loss of one batch, forward only. */
int loco__pp_eval(loco__pp *pp, const int32_t *inputs, const int32_t *targets, double *loss);
/* After the parameters were rewritten outside the optimizer (the outer
 * step): the head's copy of wte takes the embedding stage's values. */
int loco__pp_sync_tied(loco__pp *pp);


typedef struct loco__train_dp loco__train_dp;

struct loco_trainer {
    loco_config cfg;
    loco_comm *world;
    loco_mesh mesh;
    loco_comm *dp;   /* the mesh's dp group (not owned) */
    bool root;       /* rank 0 of the world logs, evaluates and writes metrics */
    loco_gpt *model;
    loco_zero *zero;
    loco_data *train, *val;
    loco_metrics *metrics;
    loco_prom *prom; /* root: live metrics (run.metrics_addr), NULL = off */
    loco_rng rng;
    int64_t step; /* optimizer steps completed */
    int64_t end_step; /* the last step: train.steps, or later (loco_trainer_set_end) */
    int64_t sched_step; /* where the learning-rate schedule is; -1: at step */
    int B, T;
    int32_t *inputs, *targets; /* (B, T) */
    double unigram;            /* nats, NAN when unknown */
    double t_start;            /* of this run, for the ETA */
    int64_t first_step;
#if defined(LOCO_HAVE_CUDA)
    loco_gpt_cuda *dev;        /* train.device = cuda: the model that trains */
    loco_comm *dev_comm;       /* parallel.backend = nccl, else NULL */
    loco__train_dp *ddp;       /* the device step over dp (train_device.c), NULL on one rank */
#endif
    bool host_stale;           /* the device holds newer parameters and moments */
    uint64_t pcie;             /* bytes host_sync / device_load moved (take_pcie_bytes) */
    loco__pp *pp;              /* parallel.pp > 1: this rank's pipeline stage */
    int32_t *mb_inputs, *mb_targets; /* pp: the step's micro-batches (m, B, T) */
};

/* train_device.c. train.device and train.dtype against this build and the
 * mesh (every build). */
int loco__train_check_device(const loco_config *cfg);
/* The host parameters and AdamW moments catch up with the device (a no-op
 * unless the device holds newer ones); the reverse, with or without the
 * moments. No-ops without a device model. */
int loco__train_host_sync(loco_trainer *t);
int loco__train_device_load(loco_trainer *t, bool moments);
/* train_device_norm.c: clips the device gradients [lo, hi) by the global
 * norm (*norm): this rank's sum of squares, summed over `over` (the dp
 * group when each rank owns a range, else NULL) and over tp. */
int loco__train_device_clip(loco_trainer *t, struct loco_comm *over, size_t lo, size_t hi,
                            double *norm);
#if defined(LOCO_HAVE_CUDA)
/* train_device_ep.c: the device gradients of flat [a, b) (at grads)
 * before they join the expert-dp reduction: the dense tensors averaged
 * over ep, the routed experts' scaled by 1/ep (no-op without ep). */
int loco__train_device_ep_prereduce(loco_trainer *t, float *grads, size_t a, size_t b);
/* The device's MoE statistics since its last reset into the host model
 * (stats: else dropped), then the host's routing biases to the device: after
 * a step, before the host moves the biases and after it. No-op without
 * a device or experts. */
int loco__train_device_moe_sync(loco_trainer *t, bool stats);
/* The device model (sharded at ZeRO-3 over dp > 1), its attention kernel
 * and graph setting; before loco_zero_create. */
int loco__train_device_create(loco_trainer *t, const loco_gpt_config *mc);
/* The data-parallel state of the device step (after loco_zero_create). */
int loco__train_device_dp_init(loco_trainer *t);
void loco__train_device_destroy(loco_trainer *t);
/* One optimizer step on the device: *loss_sum the micro-steps' summed
 * mean losses, *norm the gradient norm (not finite: nothing was applied). */
int loco__train_device_step(loco_trainer *t, double *loss_sum, float lr, double *norm);
#endif

/* inner/train/train_metrics.c: the trainer's metrics registry when
 * run.metrics_addr is set (*out NULL otherwise), and its values after a
 * step. */
int loco__train_prom_create(loco_prom **out, const loco_config *c);
void loco__train_prom_step(loco_prom *p, const loco_step_stats *s, int64_t tokens_per_step);

#endif
