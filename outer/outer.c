/* DiLoCo's outer step over one owned range. */
#include "outer/outer_internal.h"

int loco_outer_params_from_config(loco_outer_params *p, const loco_config *cfg) {
    p->H = cfg->outer.H;
    p->nesterov = strcmp(cfg->outer.optimizer, "nesterov") == 0;
    p->lr = (float)cfg->outer.lr;
    p->momentum = (float)cfg->outer.momentum;
    p->max_delta_ratio = (float)cfg->outer.max_delta_ratio;
    return 0;
}

#ifdef LOCO_HAVE_CUDA
static void dev_destroy(outer_dev *d) {
    if (!d)
        return;
    loco_cuda_slab_destroy(d->slab);
    loco_free(d->hpay);
    pthread_mutex_destroy(&d->mu);
    loco_free(d);
}
#endif

void loco_outer_destroy(loco_outer *o) {
    if (!o)
        return;
#ifdef LOCO_HAVE_CUDA
    dev_destroy(o->d);
#endif
    loco_codec_destroy(o->codec);
    loco_free(o->theta);
    loco_free(o->mom);
    loco_free(o->delta);
    loco_free(o->avg);
    loco_free(o->enc);
    loco_free(o->refs);
    loco_free(o->chunk_next);
    loco_codec_destroy(o->codec2);
    loco_free(o->avg2);
    loco_free(o->enc2);
    loco_free(o->final_have);
    loco_free(o->applied);
    loco_free(o->enc_len);
    loco_free(o->theta_bak);
    loco_free(o->mom_bak);
    loco_free(o->chunk_delta);
    loco_free(o->avg_zeroed);
    loco_free(o->avg2_zeroed);
    loco_free(o->sample);
    loco_free(o->chunk_prev);
    loco_free(o);
}

int loco_outer_create(loco_outer **out, const loco_outer_params *p, const loco_codec_params *cp,
                      size_t n, const float *theta0) {
    *out = NULL;
    loco_outer *o = loco_alloc(sizeof *o);
    if (!o)
        return LOCO_ERR(LOCO_ENOMEM, "outer state");
    int rc = 0;
    o->p = *p;
    o->n = n;
    loco_codec_params c = *cp;
    c.n_state = n;
    /* Two workspaces at least: the pipelined exchange encodes on one
     * thread while another decodes (the bytes do not depend on it). */
    if (c.threads < 2)
        c.threads = 2;
    const size_t bytes = (n ? n : 1) * sizeof(float);
    o->theta = loco_alloc(bytes);
    o->mom = loco_alloc(bytes);
    o->delta = loco_alloc(bytes);
    o->avg = loco_alloc(bytes);
    o->enc_cap = loco_compress_bound(n, &c);
    o->enc = loco_alloc(o->enc_cap ? o->enc_cap : 1);
    o->refs_cap = loco_compress_chunk_count(n, &c) + 1;
    o->refs = loco_alloc(o->refs_cap * sizeof *o->refs);
    o->chunk_next = loco_alloc(o->refs_cap * sizeof *o->chunk_next);
    o->final_have = loco_alloc(o->refs_cap);
    o->applied = loco_alloc(o->refs_cap);
    o->avg2 = loco_alloc(bytes);
    o->enc2 = loco_alloc(o->enc_cap ? o->enc_cap : 1);
    o->enc_len = loco_alloc(o->refs_cap * sizeof *o->enc_len);
    o->theta_bak = loco_alloc(bytes);
    o->mom_bak = loco_alloc(bytes);
    o->workers = c.threads;
    o->chunk_delta = loco_alloc((size_t)c.threads * loco_compress_chunk_elems(&c) * sizeof(float));
    o->avg_zeroed = loco_alloc(o->refs_cap);
    o->avg2_zeroed = loco_alloc(o->refs_cap);
    o->sample = loco_alloc(SAMPLE_N * sizeof(float));
    o->chunk_prev = loco_alloc(loco_compress_chunk_elems(&c) * sizeof(float));
    o->refused = -1;
    o->poison = o->poison_next = 1.0f;
    if (!o->theta || !o->mom || !o->delta || !o->avg || !o->enc || !o->refs || !o->chunk_next ||
        !o->final_have || !o->applied || !o->avg2 || !o->enc2 || !o->enc_len || !o->theta_bak ||
        !o->mom_bak || !o->chunk_delta || !o->avg_zeroed || !o->avg2_zeroed ||
        !o->sample || !o->chunk_prev) {
        rc = LOCO_ERR(LOCO_ENOMEM, "outer buffers for %zu elements", n);
        goto out_fail;
    }
    LOCO_CHECK_GOTO(loco_codec_create(&o->codec, &c), out_fail);
    c.error_feedback = false;
    c.stochastic = false;
    LOCO_CHECK_GOTO(loco_codec_create(&o->codec2, &c), out_fail);
    if (n && theta0)
        memcpy(o->theta, theta0, n * sizeof(float));
    *out = o;
    return 0;
out_fail:
    loco_outer_destroy(o);
    return rc;
}

/* ------------------------------------------------------- device mode */

bool loco_outer_on_device(const loco_outer *o) { return o->on_dev; }

uint64_t loco_outer_take_pcie_bytes(loco_outer *o) {
    const uint64_t b = o->pcie;
    o->pcie = 0;
    return b;
}


int loco__outer_host_only(const loco_outer *o, const char *what) {
    if (!o->on_dev)
        return 0;
    return LOCO_ERR(LOCO_EINVAL, "outer: %s runs on the host path only, not in the device mode",
                    what);
}

int loco_outer_encode(loco_outer *o, const float *theta_local, int64_t step, const void **bytes,
                      size_t *len, size_t *raw_bytes) {
    LOCO_CHECK(loco__outer_host_only(o, "the whole-range encode"));
    for (size_t i = 0; i < o->n; i++)
        o->delta[i] = o->theta[i] - theta_local[i];
    loco_encode_plan plan;
    LOCO_CHECK(loco_codec_plan(o->codec, &plan, o->delta, o->n, 0, (uint64_t)step));
    if (plan.n_chunks + 1 > o->refs_cap)
        return LOCO_ERR(LOCO_EINVAL, "outer: %zu chunks exceed the planned %zu", plan.n_chunks,
                        o->refs_cap);
    LOCO_CHECK(loco_codec_encode(o->codec, &plan, o->enc, o->enc_cap, o->refs, o->delta));
    /* Chunks sit in fixed slots; pack them so only real bytes travel. */
    size_t off = 0;
    for (size_t i = 0; i < plan.n_chunks; i++) {
        memmove(o->enc + off, o->enc + o->refs[i].offset, o->refs[i].len);
        off += o->refs[i].len;
    }
    *bytes = o->enc;
    *len = off;
    if (raw_bytes)
        *raw_bytes = o->n * sizeof(float);
    return 0;
}

void loco__outer_chunk_range(const loco_outer *o, size_t c, size_t *lo, size_t *hi) {
    const size_t per = loco_compress_chunk_elems(loco_codec_get_params(o->codec));
    *lo = c * per;
    *hi = *lo + per < o->n ? *lo + per : o->n;
}

int loco_outer_plan(loco_outer *o, const float *theta_local, int64_t step, size_t *n_chunks) {
    o->theta_local = theta_local;
    /* zstd=auto decides from Δ at a few spread positions (the chunks'
     * Δ is computed as each is encoded). */
    size_t m = o->n;
    const float *sample = o->delta;
    if (o->on_dev) {
        /* Δ's sample is taken on the device and only it comes over (for
         * zstd=auto; the other modes never read it). */
        m = o->n > SAMPLE_N ? SAMPLE_N : o->n;
        sample = o->sample;
#ifdef LOCO_HAVE_CUDA
        if (loco_codec_get_params(o->codec)->zstd == LOCO_ZSTD_AUTO && o->n)
            LOCO_CHECK(loco__outer_dev_sample(o, theta_local, m));
#endif
    } else if (o->n > SAMPLE_N) {
        for (size_t k = 0; k < SAMPLE_PIECES; k++) {
            const size_t off = k * (o->n - SAMPLE_PIECE) / (SAMPLE_PIECES - 1);
            for (size_t i = 0; i < SAMPLE_PIECE; i++)
                o->sample[k * SAMPLE_PIECE + i] = o->theta[off + i] - theta_local[off + i];
        }
        sample = o->sample;
        m = SAMPLE_N;
    } else {
        for (size_t i = 0; i < o->n; i++)
            o->delta[i] = o->theta[i] - theta_local[i];
    }
    LOCO_CHECK(loco_codec_plan_sampled(o->codec, &o->plan, sample, m ? m : 1, o->n, 0,
                                       (uint64_t)step));
    memset(o->enc_len, 0, o->refs_cap * sizeof *o->enc_len);
    o->poison = o->poison_next;
    o->poison_next = 1.0f;
    if (o->plan.n_chunks + 1 > o->refs_cap)
        return LOCO_ERR(LOCO_EINVAL, "outer: %zu chunks exceed the planned %zu", o->plan.n_chunks,
                        o->refs_cap);
    *n_chunks = o->plan.n_chunks;
    return 0;
}

int loco_outer_encode_chunk(loco_outer *o, int worker, size_t chunk, const void **bytes,
                            size_t *len) {
    if (chunk >= o->plan.n_chunks)
        return LOCO_ERR(LOCO_EINVAL, "outer: chunk %zu of %zu", chunk, o->plan.n_chunks);
    if (worker < 0 || worker >= o->workers)
        return LOCO_ERR(LOCO_EINVAL, "outer: worker %d outside [0, %d)", worker, o->workers);
    /* Δ of the chunk goes through a chunk-sized buffer that stays in
     * cache, instead of a whole-shard array written and read back. */
#ifdef LOCO_HAVE_CUDA
    if (o->on_dev) {
        LOCO_CHECK(loco__outer_dev_encode_chunk(o, worker, chunk, len));
        o->enc_len[chunk] = *len;
        *bytes = o->enc + chunk * o->plan.slot_bytes;
        return 0;
    }
#endif
    size_t lo, hi;
    loco__outer_chunk_range(o, chunk, &lo, &hi);
    const size_t per = loco_compress_chunk_elems(loco_codec_get_params(o->codec));
    const float *restrict th = o->theta + lo, *restrict tl = o->theta_local + lo;
    float *restrict d = o->chunk_delta + (size_t)worker * per;
    for (size_t i = 0; i < hi - lo; i++)
        d[i] = th[i] - tl[i];
    unsigned char *slot = o->enc + chunk * o->plan.slot_bytes;
    LOCO_CHECK(loco_codec_encode_chunk_from(o->codec, worker, &o->plan, slot, o->plan.slot_bytes,
                                            len, d, chunk));
    if (o->poison != 1.0f) {
        /* The fault lab's poisoned contribution goes on the wire in place
         * of the true one, which the error feedback keeps: only the bytes
         * sent are bad, as from a faulty or hostile peer. */
        for (size_t i = 0; i < hi - lo; i++)
            d[i] *= o->poison;
        LOCO_CHECK(loco_codec_encode_chunk_from(o->codec2, worker, &o->plan, slot,
                                                o->plan.slot_bytes, len, d, chunk));
    }
    o->enc_len[chunk] = *len;
    *bytes = slot;
    return 0;
}

int loco_outer_reuse_chunk(loco_outer *o, int worker, size_t chunk, const void **bytes,
                           size_t *len) {
    if (chunk >= o->plan.n_chunks)
        return LOCO_ERR(LOCO_EINVAL, "outer: chunk %zu of %zu", chunk, o->plan.n_chunks);
    /* A chunk the failed attempt never reached is encoded now (its
     * error-feedback state was not touched yet). */
    if (!o->enc_len[chunk])
        return loco_outer_encode_chunk(o, worker, chunk, bytes, len);
    *bytes = o->enc + chunk * o->plan.slot_bytes;
    *len = o->enc_len[chunk];
    return 0;
}

size_t loco_outer_planned_chunks(const loco_outer *o) { return o->plan.n_chunks; }

void loco_outer_save(loco_outer *o) { o->swapped = false; }

bool loco_outer_planned_zstd(const loco_outer *o) {
    return o->plan.zstd;
}

static void swap_state(loco_outer *o) {
    float *t = o->theta, *m = o->mom;
    o->theta = o->theta_bak;
    o->mom = o->mom_bak;
    o->theta_bak = t;
    o->mom_bak = m;
#ifdef LOCO_HAVE_CUDA
    if (o->on_dev) {
        /* The host mirrors follow the device's buffers: both are stale. */
        outer_dev *d = o->d;
        t = d->theta, m = d->mom;
        d->theta = d->theta_bak;
        d->mom = d->mom_bak;
        d->theta_bak = t;
        d->mom_bak = m;
        d->theta_cur = d->mom_cur = o->n == 0;
    }
#endif
}

void loco_outer_restore(loco_outer *o) {
    if (o->swapped)
        swap_state(o);
    o->swapped = false;
}

void loco_outer_set_state(loco_outer *o, const float *theta, const float *mom) {
    memcpy(o->theta, theta, o->n * sizeof(float));
    memcpy(o->mom, mom, o->n * sizeof(float));
    o->swapped = false; /* nothing of an earlier step to go back to */
    if (loco__outer_upload_state(o) < 0)
        loco_error("outer: θ_global and momentum not copied to the device: %s", loco_errmsg());
}

/* Zeroes chunk c of avg (or avg2) before its first contribution. */
static int apply_range(loco_outer *o, size_t lo, size_t hi, float *theta_local) {
#ifdef LOCO_HAVE_CUDA
    if (o->on_dev)
        return loco__outer_dev_apply_range(o, lo, hi, theta_local);
#endif
    const float *avg = o->use_avg2 ? o->avg2 : o->avg;
    loco_outer_update(o->theta_bak + lo, o->mom_bak + lo, theta_local + lo, o->theta + lo,
                      o->mom + lo, avg + lo, hi - lo, o->p.lr, o->p.momentum, o->p.nesterov);
    return 0;
}

static bool chunk_complete(const loco_outer *o, size_t c) {
    return o->use_avg2 ? o->final_have[c] != 0 : o->chunk_next[c] == o->expect;
}

int loco_outer_apply_chunk(loco_outer *o, size_t chunk, float *theta_local) {
    const loco_codec_params *cp = loco_codec_get_params(o->codec);
    const size_t per = loco_compress_chunk_elems(cp);
    if (chunk >= loco_compress_chunk_count(o->n, cp) || !chunk_complete(o, chunk) ||
        o->applied[chunk])
        return LOCO_ERR(LOCO_EINVAL, "outer: chunk %zu is not ready to apply", chunk);
    size_t lo = chunk * per, hi = lo + per < o->n ? lo + per : o->n;
    LOCO_CHECK(apply_range(o, lo, hi, theta_local));
    o->applied[chunk] = 1;
    return 0;
}

int loco_outer_apply(loco_outer *o, float *theta_local) {
    const loco_codec_params *cp = loco_codec_get_params(o->codec);
    const size_t want = loco_compress_chunk_count(o->n, cp), per = loco_compress_chunk_elems(cp);
    if (o->use_avg2 ? o->final_done != want
                    : (o->expect < 1 || (o->added != o->expect && o->chunks_done != want)))
        return LOCO_ERR(LOCO_EINVAL, "outer: %d of %d contributions added", o->added, o->expect);
    /* What loco_outer_apply_chunk has not done yet, in runs. */
    for (size_t c = 0; c < want;) {
        size_t d = c;
        while (d < want && !o->applied[d])
            d++;
        if (d > c)
            LOCO_CHECK(apply_range(o, c * per, d * per < o->n ? d * per : o->n, theta_local));
        c = d + 1;
    }
#ifdef LOCO_HAVE_CUDA
    if (o->on_dev)
        LOCO_CHECK(loco__outer_dev_finish(o));
#endif
    o->expect = o->added = 0;
    swap_state(o); /* the new θ_global and momentum are current */
    o->swapped = true;
    return 0;
}

size_t loco_outer_size(const loco_outer *o) { return o->n; }
/* The host mirrors of the device mode are caches: a const state may
 * refresh them. A failed copy is logged (the hash then disagrees). */
void loco__outer_mirror(const loco_outer *co, bool theta, bool mom) {
    loco_outer *o = (loco_outer *)co;
    if ((theta && loco__outer_sync_theta(o) < 0) || (mom && loco__outer_sync_mom(o) < 0))
        loco_error("outer: device state not copied to the host: %s", loco_errmsg());
}
const float *loco_outer_theta(const loco_outer *o) {
    loco__outer_mirror(o, true, false);
    return o->theta;
}
float *loco_outer_momentum(loco_outer *o) {
    loco__outer_mirror(o, false, true);
    return o->mom;
}
uint64_t loco_outer_hash(const loco_outer *o) {
    loco__outer_mirror(o, true, false);
    return loco_hash64(o->theta, o->n * sizeof(float));
}
loco_codec *loco_outer_codec(loco_outer *o) { return o->codec; }

