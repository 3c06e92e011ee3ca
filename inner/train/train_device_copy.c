/* The trainer's host copies of the device state (train.device = cuda):
 * ZeRO's host layouts (parameters held, owned moments) paired with where
 * each piece lies in the device model's held range; downloads for
 * checkpoints and the outer loop, uploads after the host wrote. */
#include "inner/train/internal.h"

#include <string.h>

#if !defined(LOCO_HAVE_CUDA)

int loco__train_host_sync(loco_trainer *t) {
    t->host_stale = false;
    return 0;
}
int loco__train_device_load(loco_trainer *t, bool moments) {
    (void)t, (void)moments;
    return 0;
}
float *loco_trainer_device_params(loco_trainer *t, size_t *lo, size_t *hi) {
    loco_zero_range(t->zero, lo, hi);
    return NULL;
}
int loco_trainer_device_written(loco_trainer *t) {
    (void)t;
    return LOCO_ERR(LOCO_EINVAL, "trainer: not training on a device (train.device = cpu)");
}

#else /* LOCO_HAVE_CUDA */

#include "kernels/kernels.h"

/* Where the device model's kernels run: the trainer's copies go there too. */
#define STREAM loco_cuda_compute_stream()

/* ------------------------------------------------------ host <-> device */

/* The host's state (ZeRO's layouts: parameters held, owned moments) and
 * where each piece lies in the device model's held range. */
typedef struct {
    float *params, *m, *v;         /* host */
    float *dp, *dm, *dv;           /* device, at the same flat elements */
    size_t n, on;                  /* parameters, moments */
} host_dev;

static int pair_up(loco_trainer *t, host_dev *x) {
    size_t lo, hi, olo, ohi, ml, mh;
    float *dp, *dm, *dv;
    loco_zero_held_params(t->zero, &lo, &hi, &x->params);
    loco_adamw *opt = loco_zero_optimizer(t->zero, &olo, &ohi);
    loco_gpt_cuda_state(t->dev, &dp, NULL, &dm, &dv, NULL);
    loco_gpt_cuda_shard(t->dev, &ml, &mh, NULL, NULL);
    if (lo < ml || hi > mh || olo < ml || ohi > mh)
        return LOCO_ERR(LOCO_EINVAL, "host holds [%zu, %zu), the device [%zu, %zu)", lo, hi, ml,
                        mh);
    x->m = opt->m, x->v = opt->v;
    x->dp = dp + (lo - ml), x->dm = dm + (olo - ml), x->dv = dv + (olo - ml);
    x->n = hi - lo, x->on = ohi - olo;
    return 0;
}

int loco__train_host_sync(loco_trainer *t) {
    if (t->dev && t->host_stale) {
        host_dev x;
        LOCO_CHECK(pair_up(t, &x));
        t->pcie += (x.n + 2 * x.on) * sizeof(float);
        LOCO_CHECK(loco_cuda_copy(x.m, x.dm, x.on * sizeof(float), STREAM));
        LOCO_CHECK(loco_cuda_copy(x.v, x.dv, x.on * sizeof(float), STREAM));
        LOCO_CHECK(loco_cuda_copy(x.params, x.dp, x.n * sizeof(float), STREAM));
        LOCO_CHECK(loco_cuda_sync(STREAM));
    }
    t->host_stale = false;
    return 0;
}

/* ZeRO-3 over a pipeline stage: the host holds its owned parameters, the
 * device the stage's whole ones (train_device.c): every dp rank's owned
 * part gathered into the host model's whole buffer, then uploaded. */
static int load_stage_zero3(loco_trainer *t) {
    size_t lo, hi;
    float *own;
    loco_zero_held_params(t->zero, &lo, &hi, &own);
    loco_comm *dp = t->mesh.dp_cp;
    const int n = loco_comm_size(dp);
    const size_t P = loco_gpt_num_params(t->model);
    size_t *counts = loco_alloc((size_t)n * sizeof(size_t));
    if (!counts)
        return LOCO_ERR(LOCO_ENOMEM, "dp counts");
    for (int r = 0; r < n; r++) {
        size_t a, b;
        loco_zero_owned(P, r, n, &a, &b);
        counts[r] = b - a;
    }
    float *whole = loco_gpt_params(t->model), *dp_params;
    int rc = loco_comm_allgather(dp, own, whole, counts, LOCO_DT_F32);
    loco_free(counts);
    LOCO_CHECK(rc);
    loco_gpt_cuda_state(t->dev, &dp_params, NULL, NULL, NULL, NULL);
    t->pcie += P * sizeof(float);
    return loco_cuda_copy(dp_params, whole, P * sizeof(float), STREAM);
}

int loco__train_device_load(loco_trainer *t, bool moments) {
    if (!t->dev)
        return 0;
    LOCO_CHECK(loco__train_device_moe_sync(t, false)); /* the routing biases */
    host_dev x;
    LOCO_CHECK(pair_up(t, &x));
    if (t->pp && loco_zero_stage(t->zero) >= 3 && loco_comm_size(t->mesh.dp_cp) > 1) {
        if (moments) {
            LOCO_CHECK(loco_cuda_copy(x.dm, x.m, x.on * sizeof(float), STREAM));
            LOCO_CHECK(loco_cuda_copy(x.dv, x.v, x.on * sizeof(float), STREAM));
            t->pcie += 2 * x.on * sizeof(float);
        }
        LOCO_CHECK(load_stage_zero3(t));
        return loco_gpt_cuda_upload(t->dev, NULL, NULL, NULL);
    }
    if (moments) {
        LOCO_CHECK(loco_cuda_copy(x.dm, x.m, x.on * sizeof(float), STREAM));
        LOCO_CHECK(loco_cuda_copy(x.dv, x.v, x.on * sizeof(float), STREAM));
    }
    t->pcie += (x.n + (moments ? 2 * x.on : 0)) * sizeof(float);
    LOCO_CHECK(loco_cuda_copy(x.dp, x.params, x.n * sizeof(float), STREAM));
    return loco_gpt_cuda_upload(t->dev, NULL, NULL, NULL); /* the passes' weights; waits */
}

float *loco_trainer_device_params(loco_trainer *t, size_t *lo, size_t *hi) {
    loco_zero_range(t->zero, lo, hi);
    if (!t->dev)
        return NULL;
    float *params;
    size_t ml, mh;
    loco_gpt_cuda_state(t->dev, &params, NULL, NULL, NULL, NULL);
    loco_gpt_cuda_shard(t->dev, &ml, &mh, NULL, NULL);
    return *lo >= ml && *hi <= mh ? params + (*lo - ml) : NULL;
}

int loco_trainer_device_written(loco_trainer *t) {
    if (!t->dev)
        return LOCO_ERR(LOCO_EINVAL, "trainer: not training on a device (train.device = cpu)");
    t->host_stale = true; /* the next host_sync downloads */
    return loco_gpt_cuda_upload(t->dev, NULL, NULL, NULL); /* the passes' weights */
}

#endif /* LOCO_HAVE_CUDA */
