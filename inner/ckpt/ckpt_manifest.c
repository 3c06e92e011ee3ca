/* Checkpoints, sharded layout: state.json's pipeline stages and shard list
 * parsed and checked (the stages tile the blocks, every (pp rank, tp rank)'s
 * shards tile its slice), the shard holding an element found, and the
 * shards a load needs verified and opened. */
#include "inner/ckpt/internal.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------- pipeline stages */

bool loco__ckpt_same_stage(const loco_gpt_stage *a, const loco_gpt_stage *b) {
    if (a->n != b->n)
        return false;
    for (int c = 0; c < a->n; c++)
        if (a->first[c] != b->first[c] || a->end[c] != b->end[c])
            return false;
    return true;
}

bool loco__ckpt_stages_tile(const loco_gpt_stage *stages, int pp, int L, char *why, size_t cap) {
    if (pp < 1 || pp > L) {
        snprintf(why, cap, "pp = %d stages for %d blocks", pp, L);
        return false;
    }
    int held = 0;
    for (int p = 0; p < pp; p++) {
        const loco_gpt_stage *s = &stages[p];
        if (s->n < 1 || s->n > LOCO_GPT_MAX_CHUNKS) {
            snprintf(why, cap, "pp rank %d has %d chunks (1..%d)", p, s->n, LOCO_GPT_MAX_CHUNKS);
            return false;
        }
        for (int c = 0; c < s->n; c++) {
            if (s->first[c] < (c ? s->end[c - 1] : 0) || s->end[c] <= s->first[c] ||
                s->end[c] > L) {
                snprintf(why, cap,
                         "pp rank %d's chunk %d = blocks [%d, %d) of %d: chunks must be "
                         "non-empty, in order and apart",
                         p, c, s->first[c], s->end[c], L);
                return false;
            }
            held += s->end[c] - s->first[c];
        }
    }
    /* Every block held at most once and the total L: exactly once. */
    for (int b = 0; b < L; b++) {
        int owners = 0;
        for (int p = 0; p < pp; p++)
            for (int c = 0; c < stages[p].n; c++)
                owners += b >= stages[p].first[c] && b < stages[p].end[c];
        if (owners != 1) {
            snprintf(why, cap, "block %d of %d is held by %d stages", b, L, owners);
            return false;
        }
    }
    if (held != L) {
        snprintf(why, cap, "the stages hold %d blocks of %d", held, L);
        return false;
    }
    return true;
}

int loco__ckpt_parse_stages(const char *dir, const cJSON *j, int L, int *pp,
                            loco_gpt_stage **stages) {
    *pp = 1, *stages = NULL;
    if (!cJSON_HasObjectItem(j, "pp"))
        return 0;
    int64_t n;
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(j, "stages");
    if (loco__ckpt_get_int(j, "pp", &n) || n < 1 || n > 1 << 16 || !cJSON_IsArray(arr) ||
        cJSON_GetArraySize(arr) != n)
        return LOCO_ERR(LOCO_EPROTO, "checkpoint %s: state.json has a bad pp or stage list", dir);
    if (n == 1)
        return 0;
    loco_gpt_stage *s = loco_alloc((size_t)n * sizeof *s);
    if (!s)
        return LOCO_ERR(LOCO_ENOMEM, "table of %lld pipeline stages", (long long)n);
    memset(s, 0, (size_t)n * sizeof *s);
    for (int p = 0; p < n; p++) {
        const cJSON *chunks = cJSON_GetArrayItem(arr, p);
        const int nc = cJSON_GetArraySize(chunks);
        bool ok = cJSON_IsArray(chunks) && nc >= 1 && nc <= LOCO_GPT_MAX_CHUNKS;
        for (int c = 0; ok && c < nc; c++) {
            const cJSON *fe = cJSON_GetArrayItem(chunks, c);
            const cJSON *f = cJSON_GetArrayItem(fe, 0), *e = cJSON_GetArrayItem(fe, 1);
            ok = cJSON_IsArray(fe) && cJSON_GetArraySize(fe) == 2 && cJSON_IsNumber(f) &&
                 cJSON_IsNumber(e) && f->valuedouble >= 0 && f->valuedouble <= 1 << 20 &&
                 e->valuedouble >= 0 && e->valuedouble <= 1 << 20;
            if (ok)
                s[p].first[c] = (int)f->valuedouble, s[p].end[c] = (int)e->valuedouble;
        }
        if (!ok) {
            loco_free(s);
            return LOCO_ERR(LOCO_EPROTO,
                            "checkpoint %s: state.json's stage of pp rank %d is malformed", dir,
                            p);
        }
        s[p].n = nc, s[p].slots = 1;
    }
    char why[160];
    if (!loco__ckpt_stages_tile(s, (int)n, L, why, sizeof why)) {
        loco_free(s);
        return LOCO_ERR(LOCO_EPROTO,
                        "checkpoint %s: its pipeline stages do not tile the model's blocks (%s)",
                        dir, why);
    }
    *pp = (int)n, *stages = s;
    return 0;
}

int loco__ckpt_stage_params(const loco_gpt_config *mc, const loco_gpt_stage *stages, int pp,
                            size_t *P) {
    const int ep = mc->ep > 1 ? mc->ep : 1;
    loco_gpt_config c = *mc;
    for (int g = 0; g < pp * ep; g++) {
        loco_ttable tt;
        loco_gpt_stage one = stages ? stages[g / ep] : (loco_gpt_stage){0};
        one.slots = 1; /* the table does not depend on the activation slots */
        c.ep_rank = g % ep;
        LOCO_CHECK(stages ? loco_gpt_build_stage_table(&tt, &c, &one)
                          : loco_gpt_build_table(&tt, &c));
        P[g] = tt.numel;
        loco_ttable_fini(&tt);
    }
    return 0;
}

/* ------------------------------------------------------------ shard list */

void loco__ckpt_manifest_fini(loco__ckpt_manifest *mf) {
    for (int i = 0; mf->s && i < mf->n; i++)
        loco_st_close(mf->s[i].st);
    loco_free(mf->s);
    loco_free(mf->order);
    loco_free(mf->first);
    loco_free(mf->P);
    memset(mf, 0, sizeof *mf);
}

/* Group g's name for messages: "tp rank K of T", "pp rank Q of P" or
 * both; "" when tp = pp = 1. */
static const char *group_name(char *buf, size_t cap, int g, int t, int pp) {
    const int k = g % t, q = g / t;
    if (t <= 1 && pp <= 1)
        snprintf(buf, cap, "%s", "");
    else if (pp <= 1)
        snprintf(buf, cap, "tp rank %d of %d", k, t);
    else if (t <= 1)
        snprintf(buf, cap, "pp rank %d of %d", q, pp);
    else
        snprintf(buf, cap, "pp rank %d of %d, tp rank %d of %d", q, pp, k, t);
    return buf;
}

/* "the shards" or "the shards of GROUP", for messages. */
static const char *whose(char *buf, size_t cap, int g, int t, int pp) {
    char name[96];
    if (t <= 1 && pp <= 1)
        return "the shards";
    snprintf(buf, cap, "the shards of %s", group_name(name, sizeof name, g, t, pp));
    return buf;
}

/* state.json's "n_params": one number (pp = 1), else one per stage. */
static int check_n_params(const char *dir, const cJSON *j, int tp, int pp, const size_t *P) {
    const cJSON *np = cJSON_GetObjectItemCaseSensitive(j, "n_params");
    for (int p = 0; p < pp; p++) {
        const cJSON *x = pp > 1 ? cJSON_GetArrayItem(np, p) : np;
        if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble > 9e15 ||
            (pp > 1 && (!cJSON_IsArray(np) || cJSON_GetArraySize(np) != pp)))
            return LOCO_ERR(LOCO_EPROTO, "checkpoint %s: state.json has a bad shard list", dir);
        if ((size_t)x->valuedouble != P[p]) {
            char st[48] = "";
            if (pp > 1)
                snprintf(st, sizeof st, " (pp rank %d's stage)", p);
            return LOCO_ERR(LOCO_EPROTO,
                            "checkpoint %s holds %lld parameters%s%s, the model has %zu", dir,
                            (long long)x->valuedouble, tp > 1 ? " per tp slice" : "", st, P[p]);
        }
    }
    return 0;
}

int loco__ckpt_parse_manifest(loco__ckpt_manifest *mf, const char *dir, const cJSON *j, int tp,
                              int pp_stages, int ep, const size_t *P) {
    memset(mf, 0, sizeof *mf);
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(j, "shards");
    const int pp = pp_stages * ep; /* groups */
    const int n = cJSON_GetArraySize(arr), G = pp * tp;
    char who[128];
    if (n < 1 || n > 1 << 20)
        return LOCO_ERR(LOCO_EPROTO, "checkpoint %s: state.json has a bad shard list", dir);
    LOCO_CHECK(check_n_params(dir, j, tp, pp, P));
    mf->dir = dir, mf->tp = tp, mf->pp = pp, mf->n = n, mf->ep = ep;
    mf->s = loco_alloc((size_t)n * sizeof *mf->s);
    mf->order = loco_alloc((size_t)n * sizeof *mf->order);
    mf->first = loco_alloc(((size_t)G + 1) * sizeof *mf->first);
    mf->P = loco_alloc((size_t)pp * sizeof *mf->P);
    if (!mf->s || !mf->order || !mf->first || !mf->P) {
        loco__ckpt_manifest_fini(mf);
        return LOCO_ERR(LOCO_ENOMEM, "table of %d checkpoint shards", n);
    }
    memcpy(mf->P, P, (size_t)pp * sizeof *mf->P);
    memset(mf->s, 0, (size_t)n * sizeof *mf->s);
    memset(mf->first, 0, ((size_t)G + 1) * sizeof *mf->first);
    for (int i = 0; i < n; i++) {
        const cJSON *e = cJSON_GetArrayItem(arr, i);
        const cJSON *file = cJSON_GetObjectItemCaseSensitive(e, "file");
        int64_t lo, hi, rank = 0, q = 0, er = 0;
        uint64_t h;
        if (!cJSON_IsString(file) || strchr(file->valuestring, '/') ||
            loco__ckpt_get_int(e, "lo", &lo) || loco__ckpt_get_int(e, "hi", &hi) || hi < lo ||
            loco__ckpt_parse_hex(cJSON_GetObjectItemCaseSensitive(e, "xxh3"), &h) ||
            (cJSON_HasObjectItem(e, "tp_rank") && loco__ckpt_get_int(e, "tp_rank", &rank)) ||
            (cJSON_HasObjectItem(e, "pp_rank") && loco__ckpt_get_int(e, "pp_rank", &q)) ||
            (cJSON_HasObjectItem(e, "ep_rank") && loco__ckpt_get_int(e, "ep_rank", &er)) ||
            er >= ep) {
            loco__ckpt_manifest_fini(mf);
            return LOCO_ERR(LOCO_EPROTO, "checkpoint %s: shard %d of state.json is malformed",
                            dir, i);
        }
        q = q * ep + er;
        if (rank >= tp || q >= pp) {
            loco__ckpt_manifest_fini(mf);
            return LOCO_ERR(LOCO_EPROTO,
                            "checkpoint %s: shard %d of state.json belongs to tp rank %lld, pp "
                            "rank %lld; the checkpoint has tp = %d, pp = %d",
                            dir, i, (long long)rank, (long long)q, tp, pp);
        }
        mf->s[i] = (loco__ckpt_shard_ref){.file = file->valuestring, .lo = (size_t)lo,
                                          .hi = (size_t)hi, .xxh3 = h, .rank = (int)rank,
                                          .pp = (int)q};
        mf->first[q * tp + rank + 1]++;
    }
    for (int g = 0; g < G; g++)
        mf->first[g + 1] += mf->first[g];
    /* A whole stage missing is named as such before a slice of it. */
    for (int q = 0; pp > 1 && q < pp; q++)
        if (mf->first[q * tp] == mf->first[(q + 1) * tp]) {
            loco__ckpt_manifest_fini(mf);
            return LOCO_ERR(LOCO_EPROTO,
                            "checkpoint %s: pp rank %d of %d has no shards (its stage is missing)",
                            dir, q, pp);
        }
    for (int g = 0, at = 0; g < G; g++) {
        const int k = g % tp, q = g / tp;
        if (mf->first[g] == mf->first[g + 1]) {
            char st[48] = "";
            if (pp > 1)
                snprintf(st, sizeof st, " of pp rank %d of %d", q, pp);
            loco__ckpt_manifest_fini(mf);
            return LOCO_ERR(LOCO_EPROTO,
                            "checkpoint %s: tp rank %d of %d%s has no shards (its slice is "
                            "missing)",
                            dir, k, tp, st);
        }
        size_t expect = 0;
        for (int i = 0; i < n; i++) {
            const loco__ckpt_shard_ref *s = &mf->s[i];
            if (s->rank != k || s->pp != q)
                continue;
            if (s->lo != expect || s->hi > P[q]) {
                loco__ckpt_manifest_fini(mf);
                return LOCO_ERR(LOCO_EPROTO,
                                "checkpoint %s: %s do not tile their %zu parameters (shard %d "
                                "covers [%zu, %zu), expected it to start at %zu)",
                                dir, whose(who, sizeof who, g, tp, pp), P[q], i, s->lo, s->hi,
                                expect);
            }
            expect = s->hi;
            mf->order[at++] = i;
        }
        if (expect != P[q]) {
            loco__ckpt_manifest_fini(mf);
            return LOCO_ERR(LOCO_EPROTO, "checkpoint %s: %s end at %zu of %zu parameters", dir,
                            whose(who, sizeof who, g, tp, pp), expect, P[q]);
        }
    }
    return 0;
}

/* The shard of group g that holds element x of its slice. */
loco__ckpt_shard_ref *loco__ckpt_shard_at(const loco__ckpt_manifest *mf, int g, size_t x) {
    int a = mf->first[g], b = mf->first[g + 1];
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
        char what[PATH_MAX + 128], path[PATH_MAX + 64], who[96];
        if (mf->tp > 1 || mf->pp > 1)
            snprintf(what, sizeof what, "%s (of %s)", s->file,
                     group_name(who, sizeof who, s->pp * mf->tp + s->rank, mf->tp, mf->pp));
        /* (under ep "pp rank" names the group: pp rank x ep + ep rank) */
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
        const char *q = loco_st_meta(s->st, "pp_rank");
        if (q && strtol(q, NULL, 10) != s->pp / mf->ep)
            return LOCO_ERR(LOCO_EPROTO, "checkpoint %s: %s says it holds pp rank %s", mf->dir,
                            what, q);
    }
    return 0;
}
