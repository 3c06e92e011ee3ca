/* inner/train/ — the training of one island: the step (host, or the
 * device with train.device = cuda), the pipeline stage's step, logging,
 * evaluation, checkpoints and live metrics. */
#ifndef LOCO_INNER_TRAIN_H
#define LOCO_INNER_TRAIN_H

#include "inner/model/model.h"

struct loco_comm;

typedef struct {
    int64_t step;      /* 1-based step just completed */
    float loss;        /* mean over the micro-batches */
    float lr;
    double grad_norm;  /* before clipping */
    double seconds;    /* wall time of the step */
    double tokens_per_s;
} loco_step_stats;

typedef struct loco_trainer loco_trainer;

/* Builds model, optimizer and loaders from cfg; initialises weights from
 * train.seed, or continues from a checkpoint when resume_dir is not NULL. */
int loco_trainer_create(loco_trainer **out, const loco_config *cfg, const char *resume_dir);
/* The same for island `island` of `n_islands`: each reads its own windows of
 * data.train (window index island * dp + dp_rank of n_islands * dp). */
int loco_trainer_create_island(loco_trainer **out, const loco_config *cfg, const char *resume_dir,
                               int island, int n_islands);
void loco_trainer_destroy(loco_trainer *t);
/* One optimizer step (grad_accum micro-batches, clip, AdamW). */
int loco_trainer_step(loco_trainer *t, loco_step_stats *stats);
/* Mean validation loss over the first `batches` sequential batches. */
int loco_trainer_eval(loco_trainer *t, int batches, double *val_loss, int64_t *tokens);
int loco_trainer_save(loco_trainer *t, const char *dir);
/* The whole run: train.steps steps, logs, evals, checkpoints, metrics.jsonl. */
int loco_trainer_run(loco_trainer *t);
int64_t loco_trainer_steps_done(const loco_trainer *t);
/* Moves the step counter (learning-rate schedule, logs) to `step` (an island
 * that rejoined continues at the others' step); set_end moves the run's last
 * step (final eval and checkpoint): past train.steps for a fault lab hold,
 * or to the step an island of outer.sync = time took its last outer step
 * at (never before the current step). */
void loco_trainer_set_step(loco_trainer *t, int64_t step);
void loco_trainer_set_end(loco_trainer *t, int64_t end_step);
/* Where the learning-rate schedule (warmup, cosine over train.steps)
 * stands for the next steps, when that is not the step count: an island
 * of outer.sync = time runs it by the run's progress in outer steps.
 * -1: the step count again. */
void loco_trainer_set_schedule_step(loco_trainer *t, int64_t step);
/* The range [*lo, *hi) of the flat parameter buffer this rank owns and its
 * values (the outer loop works on it; valid between steps). */
float *loco_trainer_owned_params(loco_trainer *t, size_t *lo, size_t *hi);
/* The table whose offsets index the flat buffer that owned_params' [lo, hi)
 * is a range of: the model's own table, under every mesh this rank's part
 * of the model (its tp slice, pp stage with the tied head's wte copy after
 * ln_f, ep rank's experts under their global names; cp and dp replicate).
 * Valid while t lives. */
const loco_ttable *loco_trainer_param_table(loco_trainer *t);
/* The whole model's table (tp = 1, no stage, every expert) into *whole
 * (loco_ttable_fini it) and, for each element of the owned range, its
 * index in the whole flat buffer (-1: vocabulary padding) into
 * idx[0 .. hi-lo). For an exchange in a layout of no mesh's own. */
int loco_trainer_whole_layout(loco_trainer *t, loco_ttable *whole, int64_t *idx);
/* After the owned parameters were rewritten: make every rank of the island
 * see them (collective over the island). */
int loco_trainer_sync_params(loco_trainer *t);
/* train.device = cuda: the device pointer of the owned range [*lo, *hi)
 * of the fp32 flat parameters (the outer loop on the device works on it;
 * valid between steps); NULL when the trainer trains on the host. */
float *loco_trainer_device_params(loco_trainer *t, size_t *lo, size_t *hi);
/* After the outer loop wrote the owned range on the device: the bf16 copy
 * is refreshed and the host copy marked stale (downloaded when next read)
 * instead of uploaded. One rank per island only (no collective).
 * LOCO_EINVAL on the host. */
int loco_trainer_device_written(loco_trainer *t);
/* Bytes the trainer's host / device copies of the parameters and moments
 * (train.device = cuda, around outer steps, checkpoints, evals) moved
 * across PCIe since the last call; resets the count. 0 on the host. */
uint64_t loco_trainer_take_pcie_bytes(loco_trainer *t);
/* The pieces of loco_trainer_run, for loops that do more between steps
 * (the island's outer steps): begin_run opens metrics and logs the header;
 * after_step logs, evaluates and checkpoints as [run] says. */
int loco_trainer_begin_run(loco_trainer *t);
int loco_trainer_after_step(loco_trainer *t, const loco_step_stats *s);
/* The island's communicator (every rank of this island). */
struct loco_comm *loco_trainer_world(loco_trainer *t);
/* Rank of this process in its island, and the island's size. */
int loco_trainer_rank(const loco_trainer *t);
int loco_trainer_ranks(const loco_trainer *t);
loco_gpt *loco_trainer_model(loco_trainer *t);
/* Rank 0's live metrics registry (run.metrics_addr, made by create; NULL
 * when off or on other ranks), for the caller to serve: an island adds its
 * outer metrics to it. Valid while t lives. */
loco_prom *loco_trainer_prom(loco_trainer *t);

#endif /* LOCO_INNER_TRAIN_H */
