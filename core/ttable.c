/* Tensor tables: named ranges of one flat fp32 buffer. */
#include "core/core.h"

#include <stdlib.h>
#include <string.h>

void loco_ttable_init(loco_ttable *tt) { memset(tt, 0, sizeof *tt); }

void loco_ttable_fini(loco_ttable *tt) {
    loco_free(tt->t);
    memset(tt, 0, sizeof *tt);
}

int loco_ttable_add(loco_ttable *tt, const char *name, int ndim, const int64_t *shape,
                    int split_dim, bool decay) {
    if (ndim < 1 || ndim > LOCO_TENSOR_MAX_DIM)
        return LOCO_ERR(LOCO_EINVAL, "tensor %s: %d dims (1..%d allowed)", name, ndim,
                        LOCO_TENSOR_MAX_DIM);
    if (strlen(name) >= LOCO_TENSOR_NAME_MAX)
        return LOCO_ERR(LOCO_EINVAL, "tensor name too long: %s", name);
    if (loco_ttable_find(tt, name) >= 0)
        return LOCO_ERR(LOCO_EINVAL, "tensor %s added twice", name);
    if (tt->n == tt->cap) {
        int cap = tt->cap ? 2 * tt->cap : 64;
        loco_tensor *t = loco_alloc((size_t)cap * sizeof *t);
        if (!t)
            return LOCO_ERR(LOCO_ENOMEM, "tensor table of %d entries", cap);
        if (tt->n)
            memcpy(t, tt->t, (size_t)tt->n * sizeof *t);
        loco_free(tt->t);
        tt->t = t;
        tt->cap = cap;
    }
    loco_tensor *t = &tt->t[tt->n];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = ndim;
    t->numel = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] <= 0)
            return LOCO_ERR(LOCO_EINVAL, "tensor %s: dim %d is %lld", name, i,
                            (long long)shape[i]);
        t->shape[i] = shape[i];
        t->numel *= (size_t)shape[i];
    }
    t->offset = tt->numel;
    t->split_dim = split_dim;
    t->split_parts = 1;
    t->decay = decay;
    tt->numel += t->numel;
    tt->n++;
    return 0;
}

int loco_ttable_find(const loco_ttable *tt, const char *name) {
    for (int i = 0; i < tt->n; i++)
        if (strcmp(tt->t[i].name, name) == 0)
            return i;
    return -1;
}
