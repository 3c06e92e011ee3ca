/* inner/optim/ — AdamW over the flat parameter buffer, its learning-rate
 * schedule and gradient clipping. Below the model (the device model fuses
 * AdamW into its step), checkpoints (the moments) and ZeRO (ranged steps
 * on shards). */
#ifndef LOCO_INNER_OPTIM_H
#define LOCO_INNER_OPTIM_H

#include "core/core.h"

/* AdamW state over the flat parameter buffer (ZeRO shards it later). */
typedef struct {
    float *m, *v;  /* (n) first and second moments */
    size_t n;
    int64_t t;     /* updates taken */
    float beta1, beta2, eps, weight_decay;
} loco_adamw;

int loco_adamw_init(loco_adamw *opt, size_t n, const loco_config *cfg);
void loco_adamw_fini(loco_adamw *opt);
/* One update of every tensor of tt; weight decay only where tt says decay. */
void loco_adamw_step(loco_adamw *opt, const loco_ttable *tt, float *params, const float *grads,
                     float lr);
/* Learning rate of optimizer step `step` (0-based): linear warm-up to
 * train.lr, then cosine decay to train.lr * train.min_lr_frac. */
float loco_lr_at(const loco_config *cfg, int64_t step);
/* Global L2 norm of grads; scales them down to max_norm when above it
 * (max_norm <= 0: no clipping). Returns the norm before clipping. */
double loco_clip_grad_norm(float *grads, size_t n, double max_norm);
/* loco_adamw_step restricted to the flat range [lo, hi): params and grads
 * point at element lo, and opt covers exactly that range (ZeRO shards). */
void loco_adamw_step_range(loco_adamw *opt, const loco_ttable *tt, float *params,
                           const float *grads, size_t lo, size_t hi, float lr);

#endif /* LOCO_INNER_OPTIM_H */
