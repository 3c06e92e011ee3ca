/* An island's outer state (θ_global and momentum over its owned ranges) as
 * a set of ranges, hashed, copied, and saved to or loaded from its own
 * checksummed file beside the inner checkpoint (docs/CHECKPOINTS.md). */
#include "outer/outer_internal.h"

size_t loco_outer_set_size(const loco_outer_set *s) {
    size_t n = 0;
    for (int f = 0; f < s->n; f++)
        n += s->o[f]->n;
    return n;
}

uint64_t loco_outer_set_hash(const loco_outer_set *s) {
    if (s->n == 1)
        return loco_outer_hash(s->o[0]);
    uint64_t h[LOCO_MAX_FRAGMENTS];
    for (int f = 0; f < s->n; f++)
        h[f] = loco_outer_hash(s->o[f]);
    return loco_hash64(h, (size_t)s->n * sizeof h[0]);
}

void loco_outer_set_read(const loco_outer_set *s, float *theta, float *mom) {
    for (int f = 0; f < s->n; f++) {
        const size_t n = s->o[f]->n;
        loco__outer_mirror(s->o[f], theta != NULL, mom != NULL);
        if (theta)
            memcpy(theta, s->o[f]->theta, n * sizeof(float)), theta += n;
        if (mom)
            memcpy(mom, s->o[f]->mom, n * sizeof(float)), mom += n;
    }
}

void loco_outer_set_write(const loco_outer_set *s, const float *theta, const float *mom) {
    for (int f = 0; f < s->n; f++) {
        const size_t n = s->o[f]->n;
        loco_outer_set_state(s->o[f], theta, mom);
        theta += n;
        mom += n;
    }
}

/* ------------------------------------------------------- checkpointing */

int loco_outer_save_file(const loco_outer_set *s, const char *path, const loco_outer_meta *m) {
    const size_t n = loco_outer_set_size(s);
    float *buf = loco_alloc((3 * n + 1) * sizeof(float));
    if (!buf)
        return LOCO_ERR(LOCO_ENOMEM, "outer checkpoint buffer");
    loco_outer_set_read(s, buf, buf + n);
    float *ef = buf + 2 * n;
    for (int f = 0; f < s->n; f++) {
        if (loco__outer_sync_ef(s->o[f]) < 0) {
            loco_free(buf);
            return LOCO_ERR(LOCO_ECUDA, "outer checkpoint: error feedback from the device: %s",
                            loco_errmsg());
        }
        const float *e = loco_codec_ef(s->o[f]->codec);
        if (e)
            memcpy(ef, e, s->o[f]->n * sizeof(float));
        else
            memset(ef, 0, s->o[f]->n * sizeof(float));
        ef += s->o[f]->n;
    }
    loco_ttable tt;
    loco_ttable_init(&tt);
    const int64_t shape[1] = {(int64_t)n};
    int rc = 0;
    static const char *const names[3] = {"theta_global", "momentum", "error_feedback"};
    for (int i = 0; i < 3 && rc == 0; i++)
        rc = loco_ttable_add(&tt, names[i], 1, shape, -1, false);
    char cs[24], ep[24], is[24], hh[17], fr[24], mf[24], ms[24];
    snprintf(cs, sizeof cs, "%lld", (long long)m->committed);
    snprintf(ep, sizeof ep, "%llu", (unsigned long long)m->epoch);
    snprintf(is, sizeof is, "%lld", (long long)m->inner_step);
    snprintf(fr, sizeof fr, "%d", s->n);
    snprintf(mf, sizeof mf, "%d", m->merge_fragment);
    snprintf(ms, sizeof ms, "%lld", (long long)m->merge_step);
    loco_hash_hex(loco_outer_set_hash(s), hh);
    /* Without streaming or overlap the file is what it always was. */
    const char *meta[15] = {"committed", cs, "epoch", ep, "inner_step", is, "theta_hash", hh};
    int k = 8;
    if (s->n > 1)
        meta[k++] = "fragments", meta[k++] = fr;
    if (m->merge_fragment >= 0)
        meta[k++] = "merge_fragment", meta[k++] = mf, meta[k++] = "merge_step", meta[k++] = ms;
    meta[k] = NULL;
    if (rc == 0)
        rc = loco_st_write(path, &tt, buf, NULL, meta);
    loco_ttable_fini(&tt);
    loco_free(buf);
    return rc;
}

int loco_outer_load_file(const loco_outer_set *s, const char *path, loco_outer_meta *m) {
    loco_st *st;
    LOCO_CHECK(loco_st_open(&st, path));
    const size_t n = loco_outer_set_size(s);
    const float *th = NULL, *mo = NULL, *ef = NULL;
    int64_t shape[LOCO_TENSOR_MAX_DIM];
    int nd = 0, rc = 0;
    const char *cs = loco_st_meta(st, "committed"), *ep = loco_st_meta(st, "epoch");
    const char *is = loco_st_meta(st, "inner_step"), *hh = loco_st_meta(st, "theta_hash");
    const char *fr = loco_st_meta(st, "fragments"), *mf = loco_st_meta(st, "merge_fragment");
    const char *ms = loco_st_meta(st, "merge_step");
    static const char *const names[3] = {"theta_global", "momentum", "error_feedback"};
    const float **dst[3] = {&th, &mo, &ef};
    for (int i = 0; i < 3 && rc == 0; i++) {
        rc = loco_st_get(st, names[i], dst[i], &nd, shape);
        if (rc == 0 && (nd != 1 || shape[0] != (int64_t)n))
            rc = LOCO_ERR(LOCO_EPROTO, "%s: %s has %lld elements, this rank owns %zu", path,
                          names[i], (long long)shape[0], n);
    }
    if (rc == 0 && (!cs || !ep || !is || !hh))
        rc = LOCO_ERR(LOCO_EPROTO, "%s: outer step, epoch, inner step or hash missing", path);
    if (rc == 0 && (fr ? atoi(fr) : 1) != s->n)
        rc = LOCO_ERR(LOCO_EINVAL, "%s: saved with %s streaming fragment(s), this run has %d "
                                   "(outer.fragments)",
                      path, fr ? fr : "1", s->n);
    if (rc == 0) {
        /* Checked on a copy first: nothing of the live state changes on a
         * bad file. */
        uint64_t h[LOCO_MAX_FRAGMENTS];
        const float *t = th;
        for (int f = 0; f < s->n; f++) {
            h[f] = loco_hash64(t, s->o[f]->n * sizeof(float));
            t += s->o[f]->n;
        }
        uint64_t want = s->n == 1 ? h[0] : loco_hash64(h, (size_t)s->n * sizeof h[0]);
        if (want != strtoull(hh, NULL, 16))
            rc = LOCO_ERR(LOCO_EPROTO, "%s: θ_global does not match its recorded hash", path);
    }
    if (rc == 0) {
        loco_outer_set_write(s, th, mo);
        for (int f = 0; f < s->n; f++) {
            float *e = loco_codec_ef(s->o[f]->codec);
            if (e)
                memcpy(e, ef, s->o[f]->n * sizeof(float));
            if (rc == 0)
                rc = loco__outer_upload_ef(s->o[f]);
            ef += s->o[f]->n;
        }
        m->committed = strtoll(cs, NULL, 10);
        m->epoch = strtoull(ep, NULL, 10);
        m->inner_step = strtoll(is, NULL, 10);
        m->merge_fragment = mf ? atoi(mf) : -1;
        m->merge_step = ms ? strtoll(ms, NULL, 10) : 0;
    }
    loco_st_close(st);
    return rc;
}
