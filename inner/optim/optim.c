/* AdamW over flat buffers, the learning-rate schedule and gradient clipping. */
#include "inner/optim/optim.h"
#include "kernels/kernels.h"

#include <math.h>
#include <string.h>

int loco_adamw_init(loco_adamw *opt, size_t n, const loco_config *cfg) {
    memset(opt, 0, sizeof *opt);
    opt->m = loco_alloc(n * sizeof(float));
    opt->v = loco_alloc(n * sizeof(float));
    if (!opt->m || !opt->v) {
        loco_adamw_fini(opt);
        return LOCO_ERR(LOCO_ENOMEM, "AdamW state for %zu parameters", n);
    }
    opt->n = n;
    opt->beta1 = (float)cfg->train.beta1;
    opt->beta2 = (float)cfg->train.beta2;
    opt->eps = (float)cfg->train.eps;
    opt->weight_decay = (float)cfg->train.weight_decay;
    return 0;
}

void loco_adamw_fini(loco_adamw *opt) {
    loco_free(opt->m);
    loco_free(opt->v);
    memset(opt, 0, sizeof *opt);
}

void loco_adamw_step(loco_adamw *opt, const loco_ttable *tt, float *params, const float *grads,
                     float lr) {
    opt->t++;
    for (int i = 0; i < tt->n; i++) {
        const loco_tensor *t = &tt->t[i];
        float wd = t->decay ? opt->weight_decay : 0.0f;
        loco_adamw_update(params + t->offset, grads + t->offset, opt->m + t->offset,
                          opt->v + t->offset, t->numel, lr, opt->beta1, opt->beta2, opt->eps, wd,
                          opt->t);
    }
}

void loco_adamw_step_range(loco_adamw *opt, const loco_ttable *tt, float *params,
                           const float *grads, size_t lo, size_t hi, float lr) {
    opt->t++;
    for (int i = 0; i < tt->n; i++) {
        const loco_tensor *t = &tt->t[i];
        size_t a = t->offset > lo ? t->offset : lo;
        size_t b = t->offset + t->numel < hi ? t->offset + t->numel : hi;
        if (a >= b)
            continue;
        float wd = t->decay ? opt->weight_decay : 0.0f;
        loco_adamw_update(params + (a - lo), grads + (a - lo), opt->m + (a - lo),
                          opt->v + (a - lo), b - a, lr, opt->beta1, opt->beta2, opt->eps, wd,
                          opt->t);
    }
}

float loco_lr_at(const loco_config *cfg, int64_t step) {
    const double lr = cfg->train.lr, min_lr = lr * cfg->train.min_lr_frac;
    const int64_t warm = cfg->train.warmup_steps, total = cfg->train.steps;
    if (step < warm)
        return (float)(lr * (double)(step + 1) / (double)warm);
    if (total <= warm || step >= total)
        return (float)min_lr;
    double ratio = (double)(step - warm) / (double)(total - warm);
    double coeff = 0.5 * (1.0 + cos(M_PI * ratio));
    return (float)(min_lr + coeff * (lr - min_lr));
}

double loco_clip_grad_norm(float *grads, size_t n, double max_norm) {
    double norm = sqrt(loco_sumsq(grads, n));
    if (max_norm > 0 && norm > max_norm && isfinite(norm))
        loco_scale(grads, (float)(max_norm / norm), n);
    return norm;
}
