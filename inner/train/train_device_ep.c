/* The mixture of experts on the device (train.device = cuda): what zero.c
 * does to a unit's gradients under expert parallelism before they join
 * the expert-dp reduction, on the device; the device's routing statistics
 * into the host model (metrics, DeepSeek's routing biases) and the biases
 * back. */
#include "inner/train/internal.h"

#if defined(LOCO_HAVE_CUDA)

#include "kernels/kernels.h"

#include <string.h>

#define STREAM loco_cuda_compute_stream()

/* Before the gradients of flat [a, b) (device, at grads) join the
 * expert-dp reduction, zero.c's ep_prereduce_range on the device: the
 * dense tensors averaged over ep (staged through the host), the routed
 * experts' scaled by 1/ep (an expert's rank summed its whole ep group's
 * tokens; the expert-dp average then makes the mean over every rank's). */
int loco__train_device_ep_prereduce(loco_trainer *t, float *grads, size_t a, size_t b) {
    loco_comm *ep = t->mesh.group[LOCO_DIM_EP];
    if (t->mesh.size[LOCO_DIM_EP] <= 1 || a >= b)
        return 0;
    const loco_ttable *tt = loco_gpt_table(t->model);
    const float inv = 1.0f / (float)loco_comm_size(ep);
    float *h = loco_alloc((b - a) * sizeof(float));
    if (!h)
        return LOCO_ERR(LOCO_ENOMEM, "expert-parallel staging of %zu floats", b - a);
    int rc = 0;
    for (int i = 0, end; i < tt->n && rc == 0; i = end) {
        const bool expert = strstr(tt->t[i].name, ".mlp.experts.") != NULL;
        for (end = i + 1;
             end < tt->n && (strstr(tt->t[end].name, ".mlp.experts.") != NULL) == expert;)
            end++;
        size_t lo = tt->t[i].offset, hi = tt->t[end - 1].offset + tt->t[end - 1].numel;
        lo = lo > a ? lo : a, hi = hi < b ? hi : b;
        if (lo >= hi)
            continue;
        float *g = grads + (lo - a);
        if (expert) {
            rc = loco_cuda_scale(g, inv, hi - lo, STREAM);
            continue;
        }
        rc = loco_cuda_copy(h, g, (hi - lo) * sizeof(float), STREAM);
        if (!rc)
            rc = loco_cuda_sync(STREAM);
        if (!rc)
            rc = loco_comm_allreduce(ep, h, hi - lo, LOCO_DT_F32, LOCO_OP_AVG);
        if (!rc)
            rc = loco_cuda_copy(g, h, (hi - lo) * sizeof(float), STREAM);
        if (!rc)
            rc = loco_cuda_sync(STREAM); /* h is freed */
    }
    loco_free(h);
    return rc;
}

int loco__train_device_moe_sync(loco_trainer *t, bool stats) {
    if (!t->dev || loco_gpt_moe_layers(t->model) == 0)
        return 0;
    const loco_gpt_config *mc = loco_gpt_cfg(t->model);
    for (int l = 0; stats && l < mc->n_layer; l++) {
        int micro;
        const int64_t *routed;
        int64_t assignments, dropped;
        double aux, z;
        if (!loco_gpt_is_moe(mc, l) ||
            loco_gpt_cuda_moe_stats(t->dev, l, &micro, &routed, &assignments, &dropped, &aux,
                                    &z) < 0) {
            loco_err_clear(); /* a block this stage does not hold */
            continue;
        }
        LOCO_CHECK(loco_gpt_moe_add(t->model, l, micro, routed, assignments, dropped, aux, z));
    }
    loco_gpt_cuda_moe_reset(t->dev);
    size_t n;
    const float *bias = loco_gpt_router_bias(t->model, &n);
    return n ? loco_gpt_cuda_set_router_bias(t->dev, bias, n) : 0;
}

#endif /* LOCO_HAVE_CUDA */
