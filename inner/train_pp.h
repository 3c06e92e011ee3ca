/* The trainer's pipeline stage (parallel.pp > 1): the schedule, this
 * rank's chunks and their activation slots, the executor driving the
 * model's chunk passes, the tied embeddings between the first and last
 * stage. Internal to inner/train.c and inner/train_pp.c. */
#ifndef LOCO_TRAIN_PP_H
#define LOCO_TRAIN_PP_H

#include "inner/inner.h"
#include "inner/mesh/mesh.h"
#include "inner/parallel/parallel.h"

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

#endif /* LOCO_TRAIN_PP_H */
