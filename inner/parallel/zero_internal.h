/* Inside inner/parallel/: the state of a rank's ZeRO executor (zero.c),
 * shared with the sync of the copies several ranks hold
 * (zero_replicas.c). */
#ifndef LOCO_INNER_PARALLEL_ZERO_INTERNAL_H
#define LOCO_INNER_PARALLEL_ZERO_INTERNAL_H

#include "inner/parallel/parallel.h"

#define MAX_RANGES 4096
#define MAX_GATHERS (2 * LOCO_GPT_MAX_CHUNKS + 2)

/* A unit buffer at stages 2-3 (the walker keeps its state): gradients,
 * reduce-scatter staging and, at stage 3, gathered parameters. */
typedef struct {
    float *params;  /* unit-sized (stage 3) */
    float *grads;   /* unit-sized */
    float *staging; /* receives this rank's part of the reduced unit */
} slot;

struct loco_zero {
    loco_gpt *m;
    loco_comm *dp;
    int stage, rank, n;
    size_t P;        /* parameters */
    size_t lo, hi;   /* owned range */
    loco_zero_plan plan;
    loco_zero_exec *exec; /* the plan's walker, driven by the model's hooks */
    size_t *counts;  /* (n) scratch for v-collective counts */
    loco_adamw opt;
    size_t opt_lo, opt_hi;
    float *pshard;   /* stage 3: owned parameters */
    float *gshard;   /* stages 2-3: owned gradients */
    slot slots[LOCO_ZERO_SLOTS]; /* stages 2-3 */
    uint64_t version; /* of the owned parameters (stage 3's gathered slots) */
    loco_comm_req *ranges[MAX_RANGES]; /* pipeline: reductions in flight */
    int n_ranges;
    size_t gathered_bytes;
    float *rep_buf;  /* tp: the replicated pieces of the owned range */
    size_t n_rep;
    /* tp: runs of the owned range that a group of tp ranks holds alike (a
     * key/value head shared by rep ranks when the model has fewer kv heads
     * than tp ranks), the same runs on every tp rank; their values are the
     * group's first rank's. shared_buf: (tp x n_shared) gathered pieces. */
    struct shared_run {
        size_t at, len;
        int rep;
    } *shared;
    int n_runs;
    size_t n_shared;
    float *shared_buf;
    /* ep: the dense (not expert) pieces of the owned range, alike on every
     * ep rank; ep rank 0's are the values. */
    float *dense_buf;
    size_t n_dense;
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


/* zero_replicas.c: what the copies' sync moves, planned once. */
int loco__zero_plan_replicas(loco_zero *z); /* tp: replicated tensors, shared kv heads */
int loco__zero_plan_dense(loco_zero *z);    /* ep: the dense tensors (after set_experts) */

#endif
