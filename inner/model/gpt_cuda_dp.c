/* The device model as data parallelism sees it (model.h, "model on a
 * GPU"; the trainer's train_device.c): the units and their hooks, a
 * sharded model's bindings, and the ranged calls over the held state. */
#include "inner/model/gpt_cuda_internal.h"

#if defined(LOCO_HAVE_CUDA)
#include <string.h>

void loco_gpt_cuda_set_hooks(loco_gpt_cuda *g, const loco_gpt_cuda_hooks *hooks) {
    if (hooks)
        g->hooks = *hooks;
    else
        memset(&g->hooks, 0, sizeof g->hooks);
}

int loco_gpt_cuda_bind_unit(loco_gpt_cuda *g, int unit, const void *w, float *grads) {
    if (unit < 0 || unit > g->cfg.n_layer + 1)
        return LOCO_ERR(LOCO_EINVAL, "device model: unit %d of %d", unit, g->cfg.n_layer + 2);
    if (!g->sharded)
        return LOCO_ERR(LOCO_EINVAL, "device model: only a sharded model binds its units");
    if (w) {
        g->head_stale |= unit == g->head_unit && g->uw[unit] != w;
        g->uw[unit] = (void *)w;
    }
    if (grads)
        g->ug[unit] = grads;
    return 0;
}

void loco_gpt_cuda_unit_range(const loco_gpt_cuda *g, int unit, size_t *lo, size_t *hi) {
    *lo = g->unit_lo[unit];
    *hi = g->unit_lo[unit + 1];
}

void loco_gpt_cuda_shard(const loco_gpt_cuda *g, size_t *lo, size_t *hi, const void **weights,
                         uint64_t *version) {
    *lo = g->own_lo;
    *hi = g->own_hi;
    if (weights)
        *weights = g->sharded ? g->wshard : g->w;
    if (version)
        *version = g->wversion;
}


void loco_gpt_cuda_state(loco_gpt_cuda *g, float **params, float **grads, float **m, float **v,
                         size_t *n_params) {
    if (params)
        *params = g->params;
    if (grads)
        *grads = g->grads;
    if (m)
        *m = g->m;
    if (v)
        *v = g->v;
    if (n_params)
        *n_params = g->P;
}

/* [lo, hi) inside the held range. */
static int check_range(const loco_gpt_cuda *g, size_t lo, size_t hi, const char *what) {
    if (lo > hi || lo < g->own_lo || hi > g->own_hi)
        return LOCO_ERR(LOCO_EINVAL, "%s range [%zu, %zu) outside the held [%zu, %zu)", what, lo,
                        hi, g->own_lo, g->own_hi);
    return 0;
}

int loco_gpt_cuda_grad_sumsq(loco_gpt_cuda *g, size_t lo, size_t hi, double *sumsq) {
    LOCO_CHECK(check_range(g, lo, hi, "gradient"));
    *sumsq = 0;
    if (lo == hi)
        return 0;
    RUN(LOCO_PROF_OPT,
        loco_cuda_sumsq(g->sumsq, g->grads + (lo - g->own_lo), hi - lo, g->stream));
    LOCO_CHECK(loco_cuda_copy(g->h_out, g->sumsq, sizeof(double), g->stream));
    LOCO_CHECK(loco_cuda_sync(g->stream));
    *sumsq = g->h_out[0];
    return 0;
}

int loco_gpt_cuda_scale_grads(loco_gpt_cuda *g, size_t lo, size_t hi, float s) {
    LOCO_CHECK(check_range(g, lo, hi, "gradient"));
    if (lo < hi)
        RUN(LOCO_PROF_OPT, loco_cuda_scale(g->grads + (lo - g->own_lo), s, hi - lo, g->stream));
    return 0;
}

int loco_gpt_cuda_adamw_range(loco_gpt_cuda *g, loco_adamw *opt, float lr, size_t lo, size_t hi) {
    LOCO_CHECK(check_range(g, lo, hi, "AdamW"));
    const int64_t t = opt->t + 1;
    for (int i = 0; i < g->tt.n; i++) {
        const loco_tensor *tn = &g->tt.t[i];
        const size_t a = tn->offset > lo ? tn->offset : lo;
        const size_t b = tn->offset + tn->numel < hi ? tn->offset + tn->numel : hi;
        if (a >= b)
            continue;
        const float wd = tn->decay ? opt->weight_decay : 0.0f;
        const size_t k = a - g->own_lo;
        RUN(LOCO_PROF_OPT, loco_cuda_adamw_update(g->params + k, g->grads + k, g->m + k, g->v + k,
                                                  b - a, lr, opt->beta1, opt->beta2, opt->eps, wd,
                                                  t, g->stream));
    }
    LOCO_CHECK(loco_cuda_sync(g->stream));
    opt->t = t;
    return 0;
}

#endif /* LOCO_HAVE_CUDA */
