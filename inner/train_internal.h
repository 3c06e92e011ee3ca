/* The trainer's state, shared by its files: train.c (the loop, the CPU
 * step, checkpoints, logging) and train_device.c (train.device = cuda:
 * the device model and its data-parallel step). Not a public header. */
#ifndef LOCO_INNER_TRAIN_INTERNAL_H
#define LOCO_INNER_TRAIN_INTERNAL_H

#include "inner/inner.h"
#include "inner/mesh/mesh.h"
#include "inner/parallel/parallel.h"
#include "inner/train_pp.h"

typedef struct loco__train_dp loco__train_dp;

struct loco_trainer {
    loco_config cfg;
    loco_comm *world;
    loco_mesh mesh;
    loco_comm *dp;   /* the mesh's dp group (not owned) */
    bool root;       /* rank 0 of the world logs, evaluates and writes metrics */
    loco_gpt model;
    loco_zero *zero;
    loco_data *train, *val;
    loco_metrics *metrics;
    loco_prom *prom; /* root: live metrics (run.metrics_addr), NULL = off */
    loco_rng rng;
    int64_t step; /* optimizer steps completed */
    int64_t end_step; /* the last step: train.steps, or later (loco_trainer_set_end) */
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
#if defined(LOCO_HAVE_CUDA)
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

/* inner/train_metrics.c: the trainer's metrics registry when
 * run.metrics_addr is set (*out NULL otherwise), and its values after a
 * step. */
int loco__train_prom_create(loco_prom **out, const loco_config *c);
void loco__train_prom_step(loco_prom *p, const loco_step_stats *s, int64_t tokens_per_step);

#endif
