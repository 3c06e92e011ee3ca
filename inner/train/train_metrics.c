/* The trainer's live metrics (run.metrics_addr): what metrics.jsonl
 * records per step, as gauges in core's registry on rank 0 of `loco train`
 * and of each island, which the `loco` program serves. docs/METRICS.md
 * lists them. */
#include "inner/train/internal.h"

#include <stdio.h>

static const struct {
    const char *name;
    loco_prom_type type;
    const char *help;
} metrics[] = {
    {"loco_train_step", LOCO_PROM_GAUGE, "optimizer steps completed"},
    {"loco_train_steps_target", LOCO_PROM_GAUGE, "optimizer steps the run trains (train.steps)"},
    {"loco_train_loss", LOCO_PROM_GAUGE,
     "training loss of the last step (mean over micro-batches)"},
    {"loco_train_val_loss", LOCO_PROM_GAUGE, "validation loss of the last evaluation"},
    {"loco_train_lr", LOCO_PROM_GAUGE, "learning rate of the last step"},
    {"loco_train_grad_norm", LOCO_PROM_GAUGE,
     "global gradient norm of the last step, before clipping"},
    {"loco_train_tokens_per_second", LOCO_PROM_GAUGE, "tokens per second of the last step"},
    {"loco_train_step_seconds", LOCO_PROM_GAUGE, "wall time of the last step"},
    {"loco_train_tokens_total", LOCO_PROM_COUNTER,
     "tokens trained on since step 0 (steps x batch x seq_len x grad_accum x dp)"},
};

int loco__train_prom_create(loco_prom **out, const loco_config *c) {
    *out = NULL;
    if (!c->run.metrics_addr[0])
        return 0;
    loco_prom *p;
    LOCO_CHECK(loco_prom_create(&p));
    int rc = 0;
    for (size_t i = 0; i < sizeof metrics / sizeof *metrics && rc == 0; i++)
        rc = loco_prom_declare(p, metrics[i].name, metrics[i].type, NULL, metrics[i].help);
    if (rc < 0) {
        loco_prom_destroy(p);
        return rc;
    }
    loco_prom_set(p, "loco_train_steps_target", NULL, (double)c->train.steps);
    *out = p;
    return 0;
}

void loco__train_prom_step(loco_prom *p, const loco_step_stats *s, int64_t tokens_per_step) {
    loco_prom_set(p, "loco_train_step", NULL, (double)s->step);
    loco_prom_set(p, "loco_train_loss", NULL, s->loss);
    loco_prom_set(p, "loco_train_lr", NULL, s->lr);
    loco_prom_set(p, "loco_train_grad_norm", NULL, s->grad_norm);
    loco_prom_set(p, "loco_train_tokens_per_second", NULL, s->tokens_per_s);
    loco_prom_set(p, "loco_train_step_seconds", NULL, s->seconds);
    loco_prom_set(p, "loco_train_tokens_total", NULL, (double)s->step * (double)tokens_per_step);
}
