/* The global gradient norm of the device model and its clip
 * (train.device = cuda), as zero.c's loco_zero_step counts it: each
 * element once over the island. Under tp a tensor replicated over the tp
 * ranks counts on tp rank 0 only and a key/value column replicated over
 * ranks on the first of its holders; the slices' sums add up over tp, the
 * pipeline stages' over pp (the head stage's copy of a tied wte counts on
 * the embedding stage), the routed experts' over ep (each ep rank holds
 * its own; the rest is the same on every ep rank). */
#include "inner/train/internal.h"

#if defined(LOCO_HAVE_CUDA)

#include "kernels/kernels.h"

#include <math.h>
#include <string.h>

#define STREAM loco_cuda_compute_stream()

/* *sumsq += the sum of squares of the device gradients [a, b). */
static int add_sumsq(loco_trainer *t, size_t a, size_t b, double *sumsq) {
    double s = 0;
    if (b > a)
        LOCO_CHECK(loco_gpt_cuda_grad_sumsq(t->dev, a, b, &s));
    *sumsq += s;
    return 0;
}

/* A replica's share of tensor i's [a, b): key/value columns held as a
 * replica of a lower tp rank's count zero (loco_gpt_tp_sumsq on a host
 * copy: c_attn's strided columns; with fewer kv heads than tp ranks). */
static int replica_sumsq(loco_trainer *t, int i, size_t a, size_t b, double *sumsq) {
    float *grads, *h = loco_alloc((b - a) * sizeof(float));
    if (!h)
        return LOCO_ERR(LOCO_ENOMEM, "gradient norm: %zu floats", b - a);
    size_t own_lo, own_hi; /* the device's gradients are its owned range's (ZeRO-3) */
    loco_gpt_cuda_state(t->dev, NULL, &grads, NULL, NULL, NULL);
    loco_gpt_cuda_shard(t->dev, &own_lo, &own_hi, NULL, NULL);
    int rc = loco_cuda_copy(h, grads + (a - own_lo), (b - a) * sizeof(float), STREAM);
    if (!rc)
        rc = loco_cuda_sync(STREAM);
    if (!rc)
        *sumsq += loco_gpt_tp_sumsq(t->model, i, h, a, b);
    loco_free(h);
    return rc;
}

/* The global norm's sum of squares over [lo, hi) of the device
 * gradients as zero.c counts it: under tp a tensor replicated over the tp
 * ranks counts on tp rank 0 only, a replicated key/value column on the
 * first of its holders (the caller sums the slices over tp). */
static bool is_expert(const loco_tensor *x) { return strstr(x->name, ".mlp.experts.") != NULL; }

/* experts: under ep, the routed experts' tensors only (each ep rank holds
 * its own), else the rest (the same on every ep rank). */
static int device_sumsq(loco_trainer *t, size_t lo, size_t hi, bool experts, double *sumsq) {
    const bool ep = t->mesh.size[LOCO_DIM_EP] > 1;
    const loco_gpt *m = t->model;
    const loco_gpt_config *mc = loco_gpt_cfg(m);
    const int tp = mc->tp > 1 ? mc->tp : 1, kv = loco_gpt_kv_heads(mc);
    const bool replica = kv < tp && loco_gpt_tp_rank(m) % (tp / kv) != 0;
    const loco_ttable *tt = loco_gpt_table(m);
    /* a pipeline stage with the tied head but not the embeddings: its copy
     * of wte has the embedding stage's (summed) gradient, counted there */
    const int L = mc->n_layer;
    const int tied = loco_gpt_stage_of(m) && !mc->untied && loco_gpt_holds_unit(m, L + 1) &&
                             !loco_gpt_holds_unit(m, 0)
                         ? loco_ttable_find(tt, "transformer.wte.weight")
                         : -1;
    *sumsq = 0;
    if (!ep && tied < 0 && (tp == 1 || (loco_gpt_tp_rank(m) == 0 && !replica)))
        return loco_gpt_cuda_grad_sumsq(t->dev, lo, hi, sumsq);
    size_t a = lo, b = lo; /* a run of sliced tensors, summed in one call */
    for (int i = 0; i < tt->n; i++) {
        const loco_tensor *x = &tt->t[i];
        const size_t xa = x->offset > lo ? x->offset : lo;
        const size_t xb = x->offset + x->numel < hi ? x->offset + x->numel : hi;
        if (xa >= xb || i == tied || (ep && is_expert(x) != experts) ||
            (loco_gpt_tensor_replicated(m, i) && loco_gpt_tp_rank(m) != 0))
            continue;
        if (replica && x->part_len[0]) { /* c_attn of GQA: strided columns */
            LOCO_CHECK(add_sumsq(t, a, b, sumsq));
            LOCO_CHECK(replica_sumsq(t, i, xa, xb, sumsq));
            a = b = xb;
            continue;
        }
        if (xa != b) { /* a tensor left out between: the run ends */
            LOCO_CHECK(add_sumsq(t, a, b, sumsq));
            a = xa;
        }
        b = xb;
    }
    return add_sumsq(t, a, b, sumsq);
}

int loco__train_device_clip(loco_trainer *t, loco_comm *over, size_t lo, size_t hi, double *norm) {
    double s, e = 0;
    LOCO_CHECK(device_sumsq(t, lo, hi, false, &s));
    if (t->mesh.size[LOCO_DIM_EP] > 1) /* each ep rank's experts */
        LOCO_CHECK(device_sumsq(t, lo, hi, true, &e));
    if (over) {
        double v[2] = {s, e};
        LOCO_CHECK(loco_comm_allreduce(over, v, 2, LOCO_DT_F64, LOCO_OP_SUM));
        s = v[0], e = v[1];
    }
    if (t->mesh.size[LOCO_DIM_EP] > 1) {
        LOCO_CHECK(loco_comm_allreduce(t->mesh.group[LOCO_DIM_EP], &e, 1, LOCO_DT_F64,
                                       LOCO_OP_SUM));
        s += e;
    }
    if (loco_gpt_cfg(t->model)->tp > 1)
        LOCO_CHECK(loco_comm_allreduce(t->mesh.group[LOCO_DIM_TP], &s, 1, LOCO_DT_F64,
                                       LOCO_OP_SUM));
    if (t->pp) /* and the stages' */
        LOCO_CHECK(loco_comm_allreduce(t->mesh.group[LOCO_DIM_PP], &s, 1, LOCO_DT_F64,
                                       LOCO_OP_SUM));
    *norm = sqrt(s);
    const double clip = t->cfg.train.grad_clip;
    if (clip > 0 && *norm > clip && isfinite(*norm))
        LOCO_CHECK(loco_gpt_cuda_scale_grads(t->dev, lo, hi, (float)(clip / *norm)));
    return 0;
}

#endif /* LOCO_HAVE_CUDA */
