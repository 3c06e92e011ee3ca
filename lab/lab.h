/* lab/ — the quality lab (`loco lab`, docs/QUALITY.md): M islands of one
 * rank each in one process, running the outer loop of a launched run
 * (outer/: the codec with its error feedback, averaging or Nesterov,
 * Streaming DiLoCo's fragments, overlap and merge, on the schedule of
 * docs/STREAMING.md) with the encoded bytes handed over in memory instead
 * of TLS links; beside it data parallelism on the same total tokens (one
 * rank whose batch is the M islands' together, which any dp mesh
 * reproduces). Over N seeds: the final validation loss gap with a 95%
 * interval and the traffic against data parallel's ring all-reduce.
 *
 * A seed of the lab is bit for bit a `loco launch` of the same config with
 * one rank per island and the all-gather exchange (tests/lab holds this):
 * the same trainers, windows of data, outer steps and θ_global hashes. */
#ifndef LOCO_LAB_H
#define LOCO_LAB_H

#include "core/core.h"

/* One committed outer step of a lab run, as island 0's outer.jsonl records
 * it (theta_hash: the hash of the rank's θ_global hashes). */
typedef void (*loco_lab_trace_fn)(void *ctx, int64_t outer_step, int64_t inner_step, int fragment,
                                  uint64_t theta_hash);

typedef struct {
    double val_loss;    /* final validation loss (run.eval_batches batches) */
    double bytes_sent;  /* payload bytes one island sent over the run (mean over islands) */
    double raw_bytes;   /* what fp32 pseudo-gradients would have sent */
    uint64_t theta_hash; /* of the final θ_global (every island holds it) */
    int64_t outer_steps;
    double seconds;
} loco_lab_diloco_result;

/* Whether cfg can run in the lab: one rank per island (every parallel.*
 * size 1), the host, at least two outer.sites, outer.algorithm allgather
 * or auto (reduce-scatter re-encodes the averages: other bits). why (cap
 * bytes) names what is refused; LOCO_EINVAL then. */
int loco_lab_check(const loco_config *cfg, char *why, size_t cap);

/* The multi-island run of cfg (islands: outer.sites) for train.steps inner
 * steps; trace (may be NULL) hears every committed outer step. */
int loco_lab_diloco(const loco_config *cfg, loco_lab_trace_fn trace, void *trace_ctx,
                    loco_lab_diloco_result *out);

typedef struct {
    double val_loss;
    double bytes_sent; /* per rank: every step a ring all-reduce of fp32 gradients
                        * among M ranks, 2 (M - 1) / M of the parameters' bytes */
    double seconds;
} loco_lab_dp_result;

/* Data parallelism on the same total tokens: one rank whose step takes
 * the islands' batches as micro-batches (train.grad_accum times the island
 * count of outer.sites), the global batch of dp = K, evaluated on the same
 * validation batches as an island. */
int loco_lab_dp(const loco_config *cfg, loco_lab_dp_result *out);

/* A 95% interval of the mean of n values by Student's t (n - 1 degrees of
 * freedom); n = 1 gives an interval of the value alone (lo = hi = mean). */
typedef struct {
    int n;
    double mean, sd, lo, hi;
} loco_lab_interval;
int loco_lab_interval_of(const double *x, int n, loco_lab_interval *out);
/* The two-sided 95% quantile of Student's t with df degrees of freedom. */
double loco_lab_t975(int df);

#endif /* LOCO_LAB_H */
