/* inner/parallel/ — how the ranks of one island share a training step.
 * Data parallelism with ZeRO stages 0-3 over the mesh's dp group, on
 * this rank's tensor-parallel slice (the model's table is the slice: the
 * ZeRO ranges below are ranges of it; the global gradient norm is summed
 * over tp too, replicated tensors counted once).
 *
 * Ownership (DESIGN.md): dp rank r of N owns the contiguous range
 * [r*P/N, (r+1)*P/N) of the flat parameter buffer (P parameters) at every
 * stage; ZeRO-1 keeps optimizer state only for it, ZeRO-2 also gradients,
 * ZeRO-3 also parameters. The outer loop reuses the same ranges.
 * Pipeline schedules, their generators and simulator, then the executor
 * that runs them: the last two sections. */
#ifndef LOCO_PARALLEL_H
#define LOCO_PARALLEL_H

#include "inner/comm/comm.h"
#include "inner/model/model.h"

/* Bytes this rank actually allocated, by kind. */
typedef struct {
    size_t params, grads, optim; /* persistent state */
    size_t gathered;             /* unit buffers, staging, buckets (ZeRO-2/3) */
    size_t activations;          /* forward activations and backward scratch */
} loco_mem_report;

typedef struct loco_zero loco_zero;

/* The owned range [*lo, *hi) of rank r of n over `total` elements. */
void loco_zero_owned(size_t total, int r, int n, size_t *lo, size_t *hi);
/* The loco_gpt_create_ex flags a stage needs. */
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
/* Pipeline parallelism: the global gradient norm also sums over pp (the
 * stages' parts; a head stage's copy of wte is not counted). pp is not
 * owned. A stage's chunk passes call no hooks: the pipeline reports ranges
 * instead (below), and a stage's model keeps its whole parameter and
 * gradient buffers at every ZeRO stage, as micro-batches interleave
 * through the step (docs/DECISIONS.md, "ZeRO over a pipeline stage"). */
void loco_zero_set_pipeline(loco_zero *z, loco_comm *pp);
/* Pipeline: the gradients of flat range [lo, hi) are final for this step:
 * their reduction over dp starts at once, without blocking (all-reduce at
 * stages 0-1, reduce-scatter into the owned shard at 2-3), and overlaps
 * the rest of the schedule. Every dp rank reports the same ranges in the
 * same order; loco_zero_step checks that the ranges covered the stage. */
int loco_zero_grads_ready(loco_zero *z, size_t lo, size_t hi);
/* Pipeline, stage 3: starts gathering [lo, hi) of the parameters (the
 * owned shards) into the model's buffer, if they are stale; then
 * loco_zero_params_wait(z, lo, hi) before a pass reads them. Ranges are
 * the ones started; other stages: no-ops. */
int loco_zero_params_prefetch(loco_zero *z, size_t lo, size_t hi);
int loco_zero_params_wait(loco_zero *z, size_t lo, size_t hi);
/* Pipeline, stage 3: the whole buffer gathered (blocking; for evaluation
 * and the tied embeddings), and the buffer's owned range taken back into
 * the shard after the caller rewrote the buffer. No-ops otherwise. */
int loco_zero_gather_params(loco_zero *z);
void loco_zero_adopt_params(loco_zero *z);
/* Expert parallelism (ep folded out of dp; the model's table holds this
 * rank's experts): ZeRO's dp group is then the expert-dp group; before
 * each unit's reduction its dense gradients are averaged over ep and its
 * experts' scaled by 1/ep, and the gradient norm sums the experts over ep.
 * ep is not owned; nothing for one rank. */
int loco_zero_set_experts(loco_zero *z, loco_comm *ep);
/* Tensor parallelism: every tp rank takes tp rank 0's values of the
 * replicated tensors (LayerNorms, wpe, row-parallel biases) in its owned
 * range. Collective over the model's tp group; nothing without tp. */
int loco_zero_sync_replicas(loco_zero *z);
/* Bytes of persistent state the textbook formula predicts for fp32 AdamW
 * (16P for DDP, 8P + 8P/N, 4P + 12P/N, 16P/N), excluding unit buffers. */
double loco_zero_formula_bytes(int stage, size_t n_params, int dp);

/* ============================================================ ZeRO plan
 * What a step's ZeRO collectives are, planned once from the unit layout
 * (docs/ZERO.md): the owned ranges, the buckets (contiguous flat ranges
 * reduced together, in launch order) and each bucket's per-rank counts.
 * Plain data: the host (zero.c) and the device (train_device.c) execute
 * the same plan through the walker below, so they reduce the same ranges
 * in the same order. Units are the model's hook units (0 the embeddings,
 * 1..L the blocks, L+1 ln_f), contiguous and in order in the flat buffer;
 * backward makes their gradients ready from the last to the first. */

typedef struct {
    size_t lo, hi;   /* flat range */
    int first, last; /* its units: order[first..last] */
} loco_zero_bucket;

typedef struct {
    int dp, rank, stage;
    size_t n_params, bucket_elems;
    bool per_unit;      /* each unit reduced alone at every micro-batch, out of a
                         * unit buffer; else buckets on the last micro-batch */
    bool scatter;       /* reduce-scatter into the owned range (stages 2-3);
                         * else all-reduce */
    size_t *own;        /* (dp + 1) rank r owns [own[r], own[r+1]): loco_zero_owned */
    int n_units;        /* 0: no hooks (a pipeline stage reports ranges) */
    size_t *unit_lo;    /* (n_units + 1) unit u is [unit_lo[u], unit_lo[u+1]) */
    int *order;         /* (n_units) units in the order their gradients get ready */
    int *unit_bucket;   /* (n_units) the bucket each unit joins */
    int n_buckets;
    loco_zero_bucket *buckets; /* (n_buckets) in launch order */
    size_t *counts;     /* (n_buckets * dp) elements of bucket b owned by rank r */
} loco_zero_plan;

typedef struct {
    size_t n_params;
    int n_units;
    const size_t *unit_lo; /* (n_units + 1) boundaries */
    int dp, rank, stage;
    size_t bucket_elems;   /* 0 counts as 1 */
    bool unit_buffers;     /* gradients live in unit buffers (no whole gradient
                            * buffer): stage >= 2 then reduces per unit */
} loco_zero_plan_spec;

/* Fills *p (release with loco_zero_plan_fini). LOCO_EINVAL for ranks or a
 * stage out of range, units that do not tile [0, n_params) in order, or
 * stage 3 without unit buffers; LOCO_ENOMEM. *p is zeroed on failure. */
int loco_zero_plan_init(loco_zero_plan *p, const loco_zero_plan_spec *s);
void loco_zero_plan_fini(loco_zero_plan *p); /* accepts NULL and a zeroed plan */
/* counts[r] = elements of [a, b) in rank r's owned range; returns where
 * this rank's part starts in its owned range (0 when it has none). */
size_t loco_zero_plan_split(const loco_zero_plan *p, size_t a, size_t b, size_t *counts);
/* Bucket b's per-rank counts, and this rank's part of it: *len elements
 * from the returned offset in its owned range. */
static inline const size_t *loco_zero_plan_counts(const loco_zero_plan *p, int b) {
    return p->counts + (size_t)b * (size_t)p->dp;
}
size_t loco_zero_plan_mine(const loco_zero_plan *p, int b, size_t *len);
bool loco_zero_plan_equal(const loco_zero_plan *a, const loco_zero_plan *b);
void loco_zero_plan_print(const loco_zero_plan *p, FILE *f);

/* The plan z executes (valid until loco_zero_destroy). */
const loco_zero_plan *loco_zero_plan_of(const loco_zero *z);

/* Unit buffers: the embeddings and the last unit keep a slot through the
 * step, blocks alternate between two. */
enum { LOCO_ZERO_SLOT_EMBED, LOCO_ZERO_SLOT_LAST, LOCO_ZERO_SLOT_BLOCK0, LOCO_ZERO_SLOT_BLOCK1,
       LOCO_ZERO_SLOTS };
int loco_zero_plan_slot(const loco_zero_plan *p, int unit);

/* What an executor does with the plan's data (one static table per
 * executor; ctx is the executor's, given to loco_zero_exec_create). Started
 * operations hand back a loco_comm request that the walker tests, waits
 * and frees; an executor that completes one at once (the device staged
 * through host buffers) leaves *req NULL. */
typedef struct {
    /* Bucket b's gradients averaged over dp: all-reduced in place, or
     * reduce-scattered so this rank's part lands in its owned range (per
     * unit: from slot `slot`'s unit buffer into a staging part; else
     * slot is -1). */
    int (*reduce_bucket)(void *ctx, int b, int slot, loco_comm_req **req);
    /* Per unit, after slot's reduce-scatter of bucket b completed: adds the
     * staged part into the owned gradients. */
    int (*reduced)(void *ctx, int b, int slot);
    /* Per unit, backward: slot's gradient buffer zeroed and bound as the
     * unit's gradients. */
    int (*fresh_grads)(void *ctx, int slot, int unit);
    /* Stage 3: the unit's parameters all-gathered from every rank's owned
     * part into slot; then, once complete, bind_params binds the slot as
     * the unit's. */
    int (*all_gather_unit)(void *ctx, int slot, int unit, loco_comm_req **req);
    int (*bind_params)(void *ctx, int slot, int unit);
    /* Stage 3: changes whenever the owned parameters change; a slot
     * gathered at another version is stale. */
    uint64_t (*params_version)(void *ctx);
    /* May be NULL: before a unit's gradients join their reduction. */
    int (*prepare_unit)(void *ctx, int unit);
} loco_zero_exec_ops;

typedef struct loco_zero_exec loco_zero_exec;

/* The plan walker: hook acquisition, bucket launch once its last unit's
 * gradients are ready, completion. plan, ops and ctx are not owned and
 * must outlive it; prefetch: start the next block's gather at once
 * (stage 3). LOCO_ENOMEM. */
int loco_zero_exec_create(loco_zero_exec **out, const loco_zero_plan *plan,
                          const loco_zero_exec_ops *ops, void *ctx, bool prefetch);
/* Accepts NULL; waits (ignoring failures) for everything in flight. */
void loco_zero_exec_destroy(loco_zero_exec *x);
/* Before each micro-batch's forward-backward; last: the step's final one. */
void loco_zero_exec_micro(loco_zero_exec *x, bool last);
/* The model's hooks: a unit's pass starts, a unit's gradients are final.
 * grads_ready refuses (LOCO_EINVAL) a unit out of the planned order. */
int loco_zero_exec_acquire(loco_zero_exec *x, int unit, bool backward);
int loco_zero_exec_grads_ready(loco_zero_exec *x, int unit);
/* Step end: every started reduction and gather complete (per unit: the
 * staged parts added). */
int loco_zero_exec_finish(loco_zero_exec *x);

/* ============================================================ pipeline
 * Pipeline schedules as data (DESIGN.md; docs/PIPELINE.md): a generator
 * writes, for p ranks holding v chunks each and m micro-batches, one
 * ordered list of actions per rank; a simulator checks the lists and
 * times them; one executor (the next section) runs them over the comm.
 *
 * Chunks are the p*v contiguous groups of blocks in model order: chunk 0
 * holds the embeddings, chunk p*v-1 ln_f, the head and the loss. Placement
 * is looped (chunk c on rank c mod p: gpipe, 1f1b, interleaved, zb-h1) or
 * V-shaped (rank r holds chunks r and 2p-1-r: zbv, dualpipev), so a
 * V's turn at the last rank (chunks p-1 -> p) is local.
 *
 * A rank runs its list in order on one stream. SEND and RECV only post a
 * non-blocking transfer: a SEND follows the compute that produced the
 * tensor, a RECV comes one compute action ahead of the compute that needs
 * it, which waits for the transfer; chunks on one rank exchange nothing.
 * Messages are named by what produced them: ACT (mb, c) is the output of
 * F(mb, c), bound for chunk c+1; GRAD (mb, c) is the input gradient of
 * B or BW (mb, c), bound for chunk c-1. SEND and RECV of one message carry
 * the same (msg, mb, chunk), so a tagged transport (MPI) matches them by
 * tag; loco_pp_sim.in_order(_by_kind) says whether a tag-free one (NCCL)
 * may match them by order (on one channel per pair, or per pair and kind). */

typedef struct loco_pp_schedule loco_pp_schedule;

typedef enum {
    LOCO_PP_F,    /* forward of (mb, chunk) */
    LOCO_PP_B,    /* backward for the input: the gradient chunk-1 needs */
    LOCO_PP_W,    /* backward for the weights, after its B */
    LOCO_PP_BW,   /* B and W fused, for schedules that do not split them */
    LOCO_PP_SEND, /* post the send of (msg, mb, chunk) to peer */
    LOCO_PP_RECV, /* post the receive of (msg, mb, chunk) from peer */
} loco_pp_op;

typedef enum {
    LOCO_PP_ACT,  /* output of F(mb, chunk), for F(mb, chunk+1) */
    LOCO_PP_GRAD, /* input gradient of B/BW(mb, chunk), for B/BW(mb, chunk-1) */
} loco_pp_msg;

/* flags: this compute and the next compute in the list form one
 * overlapped pair (DualPipe's F&B). A single-stream executor runs them
 * back to back; one that overlaps them posts the transfers listed between
 * the two around the pair. */
#define LOCO_PP_PAIRED 1u

typedef struct {
    uint8_t op;    /* loco_pp_op */
    uint8_t msg;   /* SEND/RECV: loco_pp_msg */
    uint8_t flags; /* LOCO_PP_PAIRED */
    int32_t peer;  /* SEND/RECV: the other rank; -1 on compute actions */
    int32_t mb;    /* micro-batch, 0..m-1 */
    int32_t chunk; /* compute: the chunk; SEND/RECV: the chunk that produced it */
} loco_pp_action;

/* Name of generator i in table order (gpipe, 1f1b, interleaved, zb-h1,
 * zbv, dualpipev, as parallel.pp_schedule spells them); NULL past the end. */
const char *loco_pp_generator_name(int i);

/* Generates schedule `name` for p ranks, v chunks per rank (0 = the
 * schedule's own: 2 for interleaved, zbv and dualpipev, else 1) and m
 * micro-batches into a new *out (free with loco_pp_schedule_destroy).
 * LOCO_EINVAL with the reason for an unknown name (the message lists the
 * valid ones), p < 2, and what the schedule cannot do: interleaved needs
 * v >= 2 and m a multiple of p, zbv and dualpipev fix v = 2, dualpipev
 * needs m >= 2p, the others v = 1; LOCO_ENOMEM. Generated lists pass
 * loco_pp_simulate (tests/parallel/test_schedule.c holds this). */
int loco_pp_schedule_create(loco_pp_schedule **out, const char *name, int p, int v, int m);
/* The same from parallel.pp_schedule, pp, virtual_stages and
 * microbatches (0 = train.grad_accum). */
int loco_pp_schedule_from_config(loco_pp_schedule **out, const loco_config *cfg);
/* A schedule from explicit lists (hand-made or edited ones): chunk_rank[c]
 * for each of the p*v chunks, and lists[r][0..lens[r]) for each rank, all
 * copied. Only the shape is checked here; loco_pp_simulate checks the
 * rest. LOCO_EINVAL, LOCO_ENOMEM. */
int loco_pp_schedule_from_lists(loco_pp_schedule **out, const char *name, int p, int v, int m,
                                const int *chunk_rank, const loco_pp_action *const *lists,
                                const int *lens);
void loco_pp_schedule_destroy(loco_pp_schedule *s); /* accepts NULL */

const char *loco_pp_schedule_name(const loco_pp_schedule *s);
void loco_pp_schedule_shape(const loco_pp_schedule *s, int *p, int *v, int *m);
/* The rank that holds chunk c (0 <= c < p*v). */
int loco_pp_chunk_rank(const loco_pp_schedule *s, int chunk);
/* Rank r's actions in execution order, *n of them; valid until destroy. */
const loco_pp_action *loco_pp_rank_actions(const loco_pp_schedule *s, int rank, int *n);
/* Compact text of one action ("F3.0", "BW3.0", "Sa3.0>1" = send the
 * activation of mb 3 chunk 0 to rank 1, "Rg3.1<1" = receive the gradient
 * of mb 3 chunk 1 from rank 1; "+" after a compute marks LOCO_PP_PAIRED).
 * Writes at most cap bytes, NUL-terminated; returns buf. */
char *loco_pp_action_str(const loco_pp_action *a, char *buf, size_t cap);

/* Costs of one chunk's actions (any unit); BW costs b + w. */
typedef struct {
    double f, b, w;
    double latency; /* from a SEND until its RECV can complete */
} loco_pp_costs;

typedef struct {
    double busy;   /* compute time */
    double start;  /* when its first compute started */
    double end;    /* when its last compute finished */
    double bubble; /* idle / makespan */
    int peak_live; /* most (mb, chunk) activations held at once: from the
                    * start of F until its W or BW ends, so a B done with
                    * its W pending still counts */
} loco_pp_rank_stats;

typedef struct {
    int p;
    double makespan;           /* the step's length: the last end over ranks */
    double bubble;             /* mean of the ranks' bubbles */
    int peak_live;             /* most over ranks */
    bool in_order;             /* every sender -> receiver pair lists its
                                * messages in the same order on both sides */
    bool in_order_by_kind;     /* the same for activations and gradients
                                * apart (a channel per kind) */
    loco_pp_rank_stats *ranks; /* [p] */
} loco_pp_sim;

/* Checks schedule s and runs it as a discrete-event simulation with costs
 * c, each rank executing its list in order. Checks: every action names a
 * chunk its rank holds (SEND/RECV: the right peer; no transfer between
 * chunks of one rank); every (mb, chunk) has one F and one backward (BW,
 * or B and W); every needed message has exactly one SEND and one RECV;
 * dependencies (F after the previous chunk's F, B after its F and the next
 * chunk's B, W after its B) hold without deadlock. On success fills *out
 * (release with loco_pp_sim_fini). LOCO_EINVAL with the first problem, or
 * for a deadlock the action each stuck rank waits at forever and on what;
 * LOCO_ENOMEM. *out is untouched on failure. */
int loco_pp_simulate(const loco_pp_schedule *s, const loco_pp_costs *c, loco_pp_sim *out);
void loco_pp_sim_fini(loco_pp_sim *r); /* frees the ranks array; accepts a zeroed struct */

/* Parses "F,B,W": three finite numbers >= 0 (the costs of F, B and W) into
 * c's f, b, w; false on anything else. */
bool loco_pp_parse_costs(const char *text, loco_pp_costs *c);

/* The published figures for schedule `name` at (p, v, m) and costs c
 * (docs/PIPELINE.md names the sources): *bubble as a fraction of the step
 * (NAN where the source gives no closed form for these costs) and *peak in
 * (mb, chunk) activations on the busiest rank. LOCO_EINVAL for an unknown
 * name or a shape the schedule refuses. */
int loco_pp_published(const char *name, int p, int v, int m, const loco_pp_costs *c, double *bubble,
                      double *peak);

/* ============================================================ pipeline executor
 * The one executor of every schedule (docs/PIPELINE.md, "The executor"):
 * runs one rank's list in order over the pp communicator (rank r of it is
 * pipeline rank r), compute delegated to the stage's ops. SEND and RECV
 * post loco_comm_isend / loco_comm_irecv; a compute waits only for the
 * receive it consumes; a send's buffer is kept until the send is certainly
 * complete and waited for before the buffer is reused; everything is
 * complete when a step returns, also when it fails.
 *
 * Message tag: 2 (mb * n_chunks + chunk) + kind (0 activation, 1
 * gradient), (mb, chunk) the producer, so a schedule needs
 * 2 m p v - 1 <= LOCO_COMM_TAG_MAX (m p v <= 16384). Tags repeat every
 * step; MPI's ordering per (sender, tag) keeps steps apart.
 *
 * Message buffers are the executor's: a pool allocated at create, as many
 * buffers as the rank's list keeps alive at once, each msg_elems floats
 * of payload and one flag float (below). Within a rank (the V's turn of
 * zbv and dualpipev) a chunk's output is handed to the next chunk in its
 * buffer, not copied. */

typedef struct loco_pp_exec loco_pp_exec;

/* What a rank's compute actions do. Each returns 0 or a negative LOCO_E*
 * code (with a message). Every activation and every gradient message is
 * msg_elems floats (B*T*C of a micro-batch for the model). Pointers are
 * valid only during the call: a stage keeps what its backward needs. */
typedef struct {
    void *ctx;
    /* F(mb, chunk): in = the activation from chunk-1 (NULL for chunk 0:
     * the stage reads its tokens itself), out = where this chunk's output
     * goes (NULL for the last chunk: it computes the loss). */
    int (*forward)(void *ctx, int mb, int chunk, const float *in, float *out);
    /* B(mb, chunk): dout = gradient of this chunk's output (NULL for the
     * last chunk: the loss's), din = where the gradient of its input goes
     * (NULL for chunk 0). */
    int (*backward_input)(void *ctx, int mb, int chunk, const float *dout, float *din);
    /* W(mb, chunk): the weight gradients of a chunk whose B ran. A BW
     * action calls backward_input, then backward_weight. */
    int (*backward_weight)(void *ctx, int mb, int chunk);
} loco_pp_stage_ops;

/* One rank's view of one step (seconds). Its bubble is 1 - compute/wall;
 * a step's is taken against the longest wall over ranks. */
typedef struct {
    double wall;    /* in loco_pp_execute */
    double compute; /* in the ops callbacks */
    double wait;    /* blocked in loco_comm_wait: receives before their
                     * compute, sends completed before their buffer's
                     * reuse, and the drain at the end */
    int computes, sends, recvs;
} loco_pp_exec_stats;

/* An executor of schedule s for this rank of pp (rank = pipeline rank,
 * size = the schedule's p), with messages of msg_elems floats: checks s
 * with loco_pp_simulate, plans every action's buffers and allocates the
 * pool. s may be destroyed afterwards; pp is not owned and must outlive
 * the executor. LOCO_EINVAL with the reason: tags that do not fit (the
 * message gives the largest m that would), a schedule the simulator
 * refuses, a communicator of another size; LOCO_ENOMEM. Local call. */
int loco_pp_exec_create(loco_pp_exec **out, const loco_pp_schedule *s, loco_comm *pp,
                        size_t msg_elems);
/* Accepts NULL. No step may be running. */
void loco_pp_exec_destroy(loco_pp_exec *e);
/* Buffers in the pool (each msg_elems + 1 floats, rounded up to 64 bytes). */
int loco_pp_exec_buffers(const loco_pp_exec *e);
/* Transfers in flight: 0 whenever no step is running. */
int loco_pp_exec_pending(const loco_pp_exec *e);

/* Runs one step: this rank's list of the schedule, every rank of pp
 * calling it with the same executor shape. Returns 0, or the first
 * failure: a callback's code (its message kept), a comm failure, or
 * LOCO_EPEER when an input came from a rank that had failed. After a
 * failure the rank runs no more compute but still posts and completes
 * every transfer of its list, sending with the flag set, so that no
 * request stays pending here and no peer waits forever; a peer that
 * receives a flagged message fails the same way. (A transfer that cannot
 * even be posted leaves its peer waiting: abort the island then, as on
 * any comm failure.) *stats (may be NULL) is filled either way. Not
 * reentrant; allocates nothing. */
int loco_pp_execute(loco_pp_exec *e, const loco_pp_stage_ops *ops, loco_pp_exec_stats *stats);

#endif /* LOCO_PARALLEL_H */
