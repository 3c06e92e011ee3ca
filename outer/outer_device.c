/* DiLoCo's outer step on the device: the range's state on the GPU,
 * only payload bytes crossing PCIe (docs/DECISIONS.md "Outer loop on the
 * device"). */
#include "outer/outer_internal.h"

#ifndef LOCO_HAVE_CUDA
int loco_outer_create_device(loco_outer **out, const loco_outer_params *p,
                             const loco_codec_params *cp, size_t n, const float *theta0_dev) {
    *out = NULL;
    return LOCO_ERR(LOCO_EINVAL, "outer: the device mode needs a build with the CUDA toolkit");
}
int loco__outer_sync_theta(loco_outer *o) { return 0; }
int loco__outer_sync_mom(loco_outer *o) { return 0; }
int loco__outer_sync_ef(loco_outer *o) { return 0; }
int loco__outer_upload_state(loco_outer *o) { return 0; }
int loco__outer_upload_ef(loco_outer *o) { return 0; }
#else
#define DEV(call)                                                                                 \
    do {                                                                                          \
        rc = (call);                                                                              \
        if (rc < 0)                                                                               \
            goto out_unlock;                                                                      \
    } while (0)
/* Every entry point that touches the device state, on any thread: under the
 * lock, on the device the state lives on (a no-op where it is current
 * already); a failure leaves through out_unlock. */
#define DEV_ENTER(d)                                                                              \
    do {                                                                                          \
        pthread_mutex_lock(&(d)->mu);                                                             \
        DEV(loco_cuda_set_device((d)->device));                                                   \
    } while (0)

/* A copy between host and device, counted when it crosses PCIe. */
static int dev_copy(loco_outer *o, void *dst, const void *src, size_t bytes, bool pcie) {
    if (pcie)
        o->pcie += bytes;
    return loco_cuda_copy(dst, src, bytes, o->d->s);
}

static bool ef_on(const loco_outer *o) {
    const loco_codec_params *cp = loco_codec_get_params(o->codec);
    return cp->error_feedback && cp->codec != LOCO_CODEC_NONE && o->n > 0;
}

int loco_outer_create_device(loco_outer **out, const loco_outer_params *p,
                             const loco_codec_params *cp, size_t n, const float *theta0_dev) {
    LOCO_CHECK(loco_outer_create(out, p, cp, n, NULL));
    loco_outer *o = *out;
    int rc = 0;
    outer_dev *d = loco_alloc(sizeof *d);
    if (!d) {
        loco_outer_destroy(o);
        *out = NULL;
        return LOCO_ERR(LOCO_ENOMEM, "outer: device state");
    }
    pthread_mutex_init(&d->mu, NULL);
    o->d = d;
    o->on_dev = true;
    LOCO_CHECK_GOTO(loco_cuda_get_device(&d->device), out_fail);
    d->s = loco_cuda_compute_stream();
    const loco_codec_params *c = loco_codec_get_params(o->codec);
    const size_t per = loco_compress_chunk_elems(c), nn = n ? n : 1;
    const size_t parts = (per + LOCO_SHARE_PART - 1) / LOCO_SHARE_PART;
    d->raw_cap = loco_codec_payload_bytes(c, per);
    const size_t work =
        c->codec == LOCO_CODEC_TOPK ? loco_topk_work_bytes(loco_codec_topk_k(c, per)) : 0;
    const size_t slab = 6 * nn * sizeof(float) + 2 * per * sizeof(float) + work +
                        SAMPLE_N * sizeof(float) + d->raw_cap + 2 * sizeof(uint32_t) +
                        (1 + parts) * sizeof(double) + 16 * 256;
    d->hpay = loco_alloc((size_t)o->workers * d->raw_cap);
    if (!d->hpay) {
        rc = LOCO_ERR(LOCO_ENOMEM, "outer: %d payload buffers of %zu bytes", o->workers,
                      d->raw_cap);
        goto out_fail;
    }
    LOCO_CHECK_GOTO(loco_cuda_slab_create(&d->slab, slab), out_fail);
    float **f[] = {&d->theta, &d->mom, &d->theta_bak, &d->mom_bak, &d->avg, &d->ef};
    for (size_t i = 0; i < sizeof f / sizeof *f; i++)
        LOCO_CHECK_GOTO(loco_cuda_slab_alloc(d->slab, (void **)f[i], nn * sizeof(float),
                                             "outer state"),
                        out_fail);
    LOCO_CHECK_GOTO(loco_cuda_slab_alloc(d->slab, (void **)&d->delta, per * sizeof(float), "Δ"),
                    out_fail);
    LOCO_CHECK_GOTO(loco_cuda_slab_alloc(d->slab, (void **)&d->prev, per * sizeof(float), "avg"),
                    out_fail);
    LOCO_CHECK_GOTO(loco_cuda_slab_alloc(d->slab, (void **)&d->sample, SAMPLE_N * sizeof(float),
                                         "sample"),
                    out_fail);
    LOCO_CHECK_GOTO(loco_cuda_slab_alloc(d->slab, (void **)&d->pay, d->raw_cap, "payload"),
                    out_fail);
    LOCO_CHECK_GOTO(loco_cuda_slab_alloc(d->slab, (void **)&d->bad, 2 * sizeof(uint32_t), "flags"),
                    out_fail);
    if (work)
        LOCO_CHECK_GOTO(loco_cuda_slab_alloc(d->slab, &d->topk_work, work, "top-k"), out_fail);
    LOCO_CHECK_GOTO(loco_cuda_slab_alloc(d->slab, (void **)&d->ss, (1 + parts) * sizeof(double),
                                         "norms"),
                    out_fail);
    if (!ef_on(o))
        d->ef = NULL;
    /* θ_global starts as θ_local, on the device; momentum and EF at 0, as
     * their host mirrors. */
    if (n)
        LOCO_CHECK_GOTO(dev_copy(o, d->theta, theta0_dev, n * sizeof(float), false), out_fail);
    LOCO_CHECK_GOTO(loco_cuda_zero(d->mom, nn * sizeof(float), d->s), out_fail);
    if (d->ef)
        LOCO_CHECK_GOTO(loco_cuda_zero(d->ef, nn * sizeof(float), d->s), out_fail);
    LOCO_CHECK_GOTO(loco_cuda_sync(d->s), out_fail);
    d->theta_cur = n == 0;
    d->mom_cur = d->ef_cur = true;
    return 0;
out_fail:
    loco_outer_destroy(o);
    *out = NULL;
    return rc;
}

/* The host mirrors, brought up to date from the device when read (the rare
 * events: the hash of θ_global, checkpoints, state transfer). */
static int sync_one(loco_outer *o, bool *cur, float *host, const float *dev) {
    outer_dev *d = o->d;
    if (!o->on_dev || *cur || !dev)
        return 0;
    int rc = 0;
    DEV_ENTER(d);
    DEV(dev_copy(o, host, dev, o->n * sizeof(float), true));
    DEV(loco_cuda_sync(d->s));
    *cur = true;
out_unlock:
    pthread_mutex_unlock(&d->mu);
    return rc;
}
int loco__outer_sync_theta(loco_outer *o) {
    return o->on_dev ? sync_one(o, &o->d->theta_cur, o->theta, o->d->theta) : 0;
}
int loco__outer_sync_mom(loco_outer *o) {
    return o->on_dev ? sync_one(o, &o->d->mom_cur, o->mom, o->d->mom) : 0;
}
int loco__outer_sync_ef(loco_outer *o) {
    return o->on_dev ? sync_one(o, &o->d->ef_cur, loco_codec_ef(o->codec), o->d->ef) : 0;
}

/* Host θ_global and momentum (just written) to the device. */
int loco__outer_upload_state(loco_outer *o) {
    outer_dev *d = o->d;
    if (!o->on_dev || !o->n)
        return 0;
    int rc = 0;
    DEV_ENTER(d);
    DEV(dev_copy(o, d->theta, o->theta, o->n * sizeof(float), true));
    DEV(dev_copy(o, d->mom, o->mom, o->n * sizeof(float), true));
    DEV(loco_cuda_sync(d->s));
    d->theta_cur = d->mom_cur = true;
out_unlock:
    pthread_mutex_unlock(&d->mu);
    return rc;
}

/* The codec's host error feedback (just written) to the device. */
int loco__outer_upload_ef(loco_outer *o) {
    outer_dev *d = o->d;
    if (!o->on_dev || !d->ef)
        return 0;
    int rc = 0;
    DEV_ENTER(d);
    DEV(dev_copy(o, d->ef, loco_codec_ef(o->codec), o->n * sizeof(float), true));
    DEV(loco_cuda_sync(d->s));
    d->ef_cur = true;
out_unlock:
    pthread_mutex_unlock(&d->mu);
    return rc;
}

/* zstd=auto's sample of Δ (as loco_outer_plan takes it on the host). */
int loco__outer_dev_sample(loco_outer *o, const float *tl, size_t m) {
    outer_dev *d = o->d;
    int rc = 0;
    DEV_ENTER(d);
    if (o->n > SAMPLE_N) {
        for (size_t k = 0; k < SAMPLE_PIECES; k++) {
            const size_t off = k * (o->n - SAMPLE_PIECE) / (SAMPLE_PIECES - 1);
            DEV(loco_cuda_sub(d->sample + k * SAMPLE_PIECE, d->theta + off, tl + off,
                              SAMPLE_PIECE, d->s));
        }
    } else {
        DEV(loco_cuda_sub(d->sample, d->theta, tl, o->n, d->s));
    }
    DEV(dev_copy(o, o->sample, d->sample, m * sizeof(float), true));
    DEV(loco_cuda_sync(d->s));
out_unlock:
    pthread_mutex_unlock(&d->mu);
    return rc;
}

/* Chunk `chunk`: Δ, quantized with error feedback on the device (then the
 * poisoned Δ without, for the fault lab); the payload comes to the host
 * and is framed there (zstd, header). */
int loco__outer_dev_encode_chunk(loco_outer *o, int worker, size_t chunk, size_t *len) {
    outer_dev *d = o->d;
    const loco_codec_params *cp = loco_codec_get_params(o->codec);
    loco_quant_args qa, qa2;
    size_t first, count, raw_len;
    LOCO_CHECK(loco_codec_chunk_quant(o->codec, &o->plan, chunk, &qa, &first, &count, &raw_len));
    LOCO_CHECK(loco_codec_chunk_quant(o->codec2, &o->plan, chunk, &qa2, &first, &count, &raw_len));
    uint8_t *host = d->hpay + (size_t)worker * d->raw_cap;
    uint32_t bad[2] = {0, 0};
    int rc = 0;
    DEV_ENTER(d);
    DEV(loco_cuda_sub(d->delta, d->theta + first, o->theta_local + first, count, d->s));
    if (cp->codec == LOCO_CODEC_TOPK) {
        const size_t k = loco_codec_topk_k(cp, count);
        DEV(loco_cuda_topk_quant(d->pay, d->delta, d->ef ? d->ef + first : NULL, count, k,
                                 cp->topk_bits, d->topk_work, d->bad, d->s));
        if (o->poison != 1.0f) {
            DEV(loco_cuda_scale(d->delta, o->poison, count, d->s));
            DEV(loco_cuda_topk_quant(d->pay, d->delta, NULL, count, k, cp->topk_bits, d->topk_work,
                                     d->bad + 1, d->s));
        }
    } else {
        DEV(loco_cuda_quant(loco_codec_format(cp->codec), d->pay, d->delta,
                            d->ef ? d->ef + first : NULL, count, &qa, d->bad, d->s));
        if (o->poison != 1.0f) {
            DEV(loco_cuda_scale(d->delta, o->poison, count, d->s));
            DEV(loco_cuda_quant(loco_codec_format(cp->codec), d->pay, d->delta, NULL, count, &qa2,
                                d->bad + 1, d->s));
        }
    }
    DEV(dev_copy(o, host, d->pay, raw_len, true));
    DEV(dev_copy(o, bad, d->bad, sizeof bad, true));
    DEV(loco_cuda_sync(d->s));
    d->ef_cur = d->ef == NULL;
out_unlock:
    pthread_mutex_unlock(&d->mu);
    LOCO_CHECK(rc);
    if (bad[0] || bad[1])
        return LOCO_ERR(LOCO_EINVAL, "compress: non-finite value in elements [%zu, %zu)", first,
                        first + count);
    unsigned char *slot = o->enc + chunk * o->plan.slot_bytes;
    return loco_codec_frame_chunk(o->codec, worker, &o->plan, slot, o->plan.slot_bytes, len, host,
                                  chunk);
}

/* One island's chunk: checked and unpacked on the host (the same checks as
 * the host path), its payload to the device, dequantize-accumulated into
 * avg there, and its share measured. */
int loco__outer_dev_add_chunk(loco_outer *o, int worker, int island, size_t c, const void *bytes,
                         size_t len) {
    outer_dev *d = o->d;
    loco_chunk_info info;
    const uint8_t *raw = NULL;
    int rc = loco_codec_unframe_chunk(o->codec, worker, o->n, bytes, len, &info, &raw);
    if (rc == LOCO_EREFUSED)
        o->refused = island;
    LOCO_CHECK(rc);
    /* a peer's codec (or topk fraction) may differ from ours: its payload
     * must still fit the device buffer sized for our chunks */
    if (info.raw_len > d->raw_cap) {
        o->refused = island;
        return LOCO_ERR(LOCO_EREFUSED, "outer: chunk %u of %llu payload bytes, this run's hold %zu",
                        info.chunk_index, (unsigned long long)info.raw_len, d->raw_cap);
    }
    const size_t lo = (size_t)info.first, cnt = (size_t)info.count;
    double ss = 0;
    uint32_t bad = 0;
    DEV_ENTER(d);
    if (!o->avg_zeroed[c]) {
        DEV(loco_cuda_zero(d->avg + lo, cnt * sizeof(float), d->s));
        o->avg_zeroed[c] = 1;
    }
    DEV(dev_copy(o, d->prev, d->avg + lo, cnt * sizeof(float), false));
    DEV(dev_copy(o, d->pay, raw, (size_t)info.raw_len, true));
    if (info.codec == LOCO_CODEC_TOPK)
        DEV(loco_cuda_topk_dequant_acc(d->avg + lo, d->pay, cnt, o->scale[island], d->s));
    else
        DEV(loco_cuda_dequant_acc(loco_codec_format(info.codec), d->avg + lo, d->pay, cnt,
                                  info.block, info.planes, o->scale[island], d->s));
    DEV(loco_cuda_share_sumsq(d->ss, d->avg + lo, d->prev, cnt, o->unscale[island], d->bad,
                              d->s));
    DEV(dev_copy(o, &ss, d->ss, sizeof ss, true));
    DEV(dev_copy(o, &bad, d->bad, sizeof bad, true));
    DEV(loco_cuda_sync(d->s));
out_unlock:
    pthread_mutex_unlock(&d->mu);
    LOCO_CHECK(rc);
    o->sumsq[island] = ss;
    o->nonfinite[island] = bad != 0;
    return 0;
}

int loco__outer_dev_apply_range(loco_outer *o, size_t lo, size_t hi, float *theta_local) {
    outer_dev *d = o->d;
    int rc = 0;
    DEV_ENTER(d);
    DEV(loco_cuda_outer_update(d->theta_bak + lo, d->mom_bak + lo, theta_local + lo,
                               d->theta + lo, d->mom + lo, d->avg + lo, hi - lo, o->p.lr,
                               o->p.momentum, o->p.nesterov, d->s));
out_unlock:
    pthread_mutex_unlock(&d->mu);
    return rc;
}

int loco__outer_dev_finish(loco_outer *o) {
    outer_dev *d = o->d;
    int rc = 0;
    DEV_ENTER(d);
    DEV(loco_cuda_sync(d->s));
out_unlock:
    pthread_mutex_unlock(&d->mu);
    return rc;
}
#endif /* LOCO_HAVE_CUDA */
