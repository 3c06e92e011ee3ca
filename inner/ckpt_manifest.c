/* Checkpoints, sharded layout: state.json's shard list parsed and checked
 * (every tp rank's shards tile its slice), the shard holding an element
 * found, and the shards a load needs verified and opened. */
#include "inner/ckpt_internal.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

void loco__ckpt_manifest_fini(loco__ckpt_manifest *mf) {
    for (int i = 0; mf->s && i < mf->n; i++)
        loco_st_close(mf->s[i].st);
    loco_free(mf->s);
    loco_free(mf->order);
    loco_free(mf->first);
    memset(mf, 0, sizeof *mf);
}

/* "the shards" or "the shards of tp rank K of T", for messages. */
static const char *whose(char *buf, size_t cap, int k, int t) {
    if (t <= 1)
        return "the shards";
    snprintf(buf, cap, "the shards of tp rank %d of %d", k, t);
    return buf;
}

int loco__ckpt_parse_manifest(loco__ckpt_manifest *mf, const char *dir, const cJSON *j, int tp,
                              size_t P) {
    memset(mf, 0, sizeof *mf);
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(j, "shards");
    const int n = cJSON_GetArraySize(arr);
    int64_t np;
    char who[64];
    if (loco__ckpt_get_int(j, "n_params", &np) || n < 1 || n > 1 << 20)
        return LOCO_ERR(LOCO_EPROTO, "checkpoint %s: state.json has a bad shard list", dir);
    if ((size_t)np != P)
        return LOCO_ERR(LOCO_EPROTO,
                        "checkpoint %s holds %lld parameters%s, the model has %zu", dir,
                        (long long)np, tp > 1 ? " per tp slice" : "", P);
    mf->dir = dir, mf->tp = tp, mf->n = n, mf->P = P;
    mf->s = loco_alloc((size_t)n * sizeof *mf->s);
    mf->order = loco_alloc((size_t)n * sizeof *mf->order);
    mf->first = loco_alloc(((size_t)tp + 1) * sizeof *mf->first);
    if (!mf->s || !mf->order || !mf->first) {
        loco__ckpt_manifest_fini(mf);
        return LOCO_ERR(LOCO_ENOMEM, "table of %d checkpoint shards", n);
    }
    memset(mf->s, 0, (size_t)n * sizeof *mf->s);
    memset(mf->first, 0, ((size_t)tp + 1) * sizeof *mf->first);
    for (int i = 0; i < n; i++) {
        const cJSON *e = cJSON_GetArrayItem(arr, i);
        const cJSON *file = cJSON_GetObjectItemCaseSensitive(e, "file");
        int64_t lo, hi, rank = 0;
        uint64_t h;
        if (!cJSON_IsString(file) || strchr(file->valuestring, '/') ||
            loco__ckpt_get_int(e, "lo", &lo) || loco__ckpt_get_int(e, "hi", &hi) || hi < lo ||
            loco__ckpt_parse_hex(cJSON_GetObjectItemCaseSensitive(e, "xxh3"), &h) ||
            (cJSON_HasObjectItem(e, "tp_rank") && loco__ckpt_get_int(e, "tp_rank", &rank))) {
            loco__ckpt_manifest_fini(mf);
            return LOCO_ERR(LOCO_EPROTO, "checkpoint %s: shard %d of state.json is malformed",
                            dir, i);
        }
        if (rank >= tp) {
            loco__ckpt_manifest_fini(mf);
            return LOCO_ERR(LOCO_EPROTO,
                            "checkpoint %s: shard %d of state.json belongs to tp rank %lld, the "
                            "checkpoint has tp = %d",
                            dir, i, (long long)rank, tp);
        }
        mf->s[i] = (loco__ckpt_shard_ref){.file = file->valuestring, .lo = (size_t)lo,
                                          .hi = (size_t)hi, .xxh3 = h, .rank = (int)rank};
        mf->first[rank + 1]++;
    }
    for (int k = 0; k < tp; k++)
        mf->first[k + 1] += mf->first[k];
    for (int k = 0, at = 0; k < tp; k++) {
        if (mf->first[k] == mf->first[k + 1]) {
            loco__ckpt_manifest_fini(mf);
            return LOCO_ERR(LOCO_EPROTO,
                            "checkpoint %s: tp rank %d of %d has no shards (its slice is missing)",
                            dir, k, tp);
        }
        size_t expect = 0;
        for (int i = 0; i < n; i++) {
            const loco__ckpt_shard_ref *s = &mf->s[i];
            if (s->rank != k)
                continue;
            if (s->lo != expect || s->hi > P) {
                loco__ckpt_manifest_fini(mf);
                return LOCO_ERR(LOCO_EPROTO,
                                "checkpoint %s: %s do not tile their %zu parameters (shard %d "
                                "covers [%zu, %zu), expected it to start at %zu)",
                                dir, whose(who, sizeof who, k, tp), P, i, s->lo, s->hi, expect);
            }
            expect = s->hi;
            mf->order[at++] = i;
        }
        if (expect != P) {
            loco__ckpt_manifest_fini(mf);
            return LOCO_ERR(LOCO_EPROTO, "checkpoint %s: %s end at %zu of %zu parameters", dir,
                            whose(who, sizeof who, k, tp), expect, P);
        }
    }
    return 0;
}

/* The shard of tp rank k that holds element x of its slice (x < P). */
loco__ckpt_shard_ref *loco__ckpt_shard_at(const loco__ckpt_manifest *mf, int k, size_t x) {
    int a = mf->first[k], b = mf->first[k + 1];
    while (a < b) { /* the first with hi > x: the shards tile, so lo <= x */
        const int mid = a + (b - a) / 2;
        if (mf->s[mf->order[mid]].hi > x)
            b = mid;
        else
            a = mid + 1;
    }
    return &mf->s[mf->order[a]];
}

/* Verifies and opens every shard marked as needed. */
int loco__ckpt_open_shards(loco__ckpt_manifest *mf) {
    static const char *const names[3] = {"params", "exp_avg", "exp_avg_sq"};
    for (int i = 0; i < mf->n; i++) {
        loco__ckpt_shard_ref *s = &mf->s[i];
        if (!s->need)
            continue;
        char what[PATH_MAX + 64], path[PATH_MAX + 64];
        if (mf->tp > 1)
            snprintf(what, sizeof what, "%s (of tp rank %d of %d)", s->file, s->rank, mf->tp);
        else
            snprintf(what, sizeof what, "%s", s->file);
        LOCO_CHECK(loco__ckpt_verify_hash(mf->dir, s->file, what, s->xxh3));
        snprintf(path, sizeof path, "%s/%s", mf->dir, s->file);
        LOCO_CHECK(loco_st_open(&s->st, path));
        const size_t len = s->hi - s->lo;
        for (int k = 0; k < 3; k++) {
            int ndim;
            int64_t shape[LOCO_TENSOR_MAX_DIM];
            LOCO_CHECK(loco_st_get(s->st, names[k], &s->x[k], &ndim, shape));
            if (ndim != 1 || (size_t)shape[0] != (len ? len : 1))
                return LOCO_ERR(LOCO_EPROTO, "checkpoint %s: %s has a bad %s tensor", mf->dir,
                                what, names[k]);
        }
        const char *r = loco_st_meta(s->st, "tp_rank");
        if (r && strtol(r, NULL, 10) != s->rank)
            return LOCO_ERR(LOCO_EPROTO, "checkpoint %s: %s says it holds tp rank %s", mf->dir,
                            what, r);
    }
    return 0;
}
