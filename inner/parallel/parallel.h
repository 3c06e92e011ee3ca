/* inner/parallel/ — how the ranks of one island share a training step.
 * Data parallelism with ZeRO stages 0-3 over the mesh's dp group, on
 * this rank's tensor-parallel slice (the model's table is the slice: the
 * ZeRO ranges below are ranges of it; the global gradient norm is summed
 * over tp too, replicated tensors counted once).
 *
 * Ownership (DESIGN.md): dp rank r of N owns the contiguous range
 * [r*P/N, (r+1)*P/N) of the flat parameter buffer (P parameters) at every
 * stage; ZeRO-1 keeps optimizer state only for it, ZeRO-2 also gradients,
 * ZeRO-3 also parameters. The outer loop reuses the same ranges. */
#ifndef LOCO_PARALLEL_H
#define LOCO_PARALLEL_H

#include "inner/comm/comm.h"
#include "inner/inner.h"

/* Bytes this rank actually allocated, by kind. */
typedef struct {
    size_t params, grads, optim; /* persistent state */
    size_t gathered;             /* unit buffers, staging, buckets (ZeRO-2/3) */
    size_t activations;          /* forward activations and backward scratch */
} loco_mem_report;

typedef struct loco_zero loco_zero;

/* The owned range [*lo, *hi) of rank r of n over `total` elements. */
void loco_zero_owned(size_t total, int r, int n, size_t *lo, size_t *hi);
/* The loco_gpt_init_ex flags a stage needs. */
unsigned loco_zero_model_flags(int stage);

/* Takes charge of an initialised model (made with loco_zero_model_flags)
 * over the dp communicator: allocates the owned shards, the AdamW state and
 * the unit buffers of the stage, and installs the model hooks that overlap
 * gradient reduction with backward (buckets of parallel.bucket_mb for
 * stages 0-1, one reduce-scatter per unit for 2-3) and gather parameters
 * per layer with the next layer prefetched (stage 3). dp is not owned. */
int loco_zero_create(loco_zero **out, loco_gpt *m, loco_comm *dp, const loco_config *cfg);
void loco_zero_destroy(loco_zero *z); /* accepts NULL; uninstalls the hooks */

/* GPT-2 initialisation of the parameters this rank holds: the same values
 * a single rank gets from loco_gpt_init_weights with the same RNG state. */
void loco_zero_init_weights(loco_zero *z, loco_rng *rng);

/* Call before each micro-batch's forward-backward; `last` marks the final
 * micro-batch of the step (stages 0-1 reduce only then). */
void loco_zero_micro_begin(loco_zero *z, bool first, bool last);
/* Completes the step: waits for every reduction, clips to max_norm
 * (<= 0: off) by the global norm (returned in *norm), runs AdamW on the
 * range this rank updates and re-gathers parameters (stages 1-2). */
int loco_zero_step(loco_zero *z, float lr, double max_norm, double *norm);

int loco_zero_stage(const loco_zero *z);
/* Owned range and the parameter values in it (valid between steps). */
void loco_zero_range(const loco_zero *z, size_t *lo, size_t *hi);
float *loco_zero_owned_params(loco_zero *z);
/* Range [*lo, *hi) of the flat buffer whose parameters this rank holds:
 * everything for stages 0-2, the owned range for stage 3, at `*data`. */
void loco_zero_held_params(loco_zero *z, size_t *lo, size_t *hi, float **data);
/* The AdamW state and the flat range it covers: all of it at stage 0, the
 * owned range from stage 1. */
loco_adamw *loco_zero_optimizer(loco_zero *z, size_t *lo, size_t *hi);
void loco_zero_memory(const loco_zero *z, loco_mem_report *r);
/* After something outside the optimizer rewrote the owned parameters (the
 * outer step): every rank's copy of the other ranks' ranges is refreshed
 * (all-gather, stages 0-2) or gathered copies are dropped (stage 3).
 * Collective over dp. */
int loco_zero_sync_params(loco_zero *z);
/* Tensor parallelism: every tp rank takes tp rank 0's values of the
 * replicated tensors (LayerNorms, wpe, row-parallel biases) in its owned
 * range. Collective over the model's tp group; nothing without tp. */
int loco_zero_sync_replicas(loco_zero *z);
/* Bytes of persistent state the textbook formula predicts for fp32 AdamW
 * (16P for DDP, 8P + 8P/N, 4P + 12P/N, 16P/N), excluding unit buffers. */
double loco_zero_formula_bytes(int stage, size_t n_params, int dp);

#endif /* LOCO_PARALLEL_H */
