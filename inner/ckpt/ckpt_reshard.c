/* Checkpoints, loading across layouts: a checkpoint written with another
 * tp or other pipeline stages than the view's (either layout) is read into
 * the view's slice of its stage, tensor by name and element by element. */
#include "inner/ckpt/internal.h"

#include <string.h>

/* Another layout than the view's: each tensor of the view is found by name
 * in a source stage that holds it (wte in the stage with the embeddings,
 * the source of truth of the tied head's copy); every element of the
 * view's ranges is followed to its whole-tensor index (loco_gpt_tp_global)
 * and from there to the source tp rank and slice index that hold it
 * (loco_gpt_tp_locate); replicated tensors come from source rank 0,
 * vocabulary padding is zero. Tensor parallelism moves indices of one
 * dimension only (the split dimension: Megatron 1-D), so a tensor's maps
 * are built over that dimension and copies run over the contiguous
 * elements after it. */
typedef struct {
    loco_ttable whole, dst;       /* tp = 1 whole model, the view's table */
    loco_ttable *src;             /* (pp) each source stage's table at the checkpoint's tp */
    int t_src, t_dst, rank, pp;   /* rank: the view's tp rank */
    int embed;                    /* the source pp rank holding the embeddings */
    bool sharded;
    loco__ckpt_manifest mf;       /* the sharded source */
    loco__ckpt_single_src single; /* the single-file source (t_src = 1, pp = 1) */
    int64_t *dmap; /* view split index -> whole split index, -1 for padding */
    int *srank;    /* whole split index -> source tp rank */
    size_t *sidx;  /* whole split index -> split index in that rank's slice */
} reshard;

/* One tensor of the view and where it comes from. */
typedef struct {
    const loco_tensor *gt, *vt, *st; /* whole (tp = 1), the view's, the source's */
    int gi;                          /* gt's index in the whole table */
    int q;                           /* the source pp rank */
} tensor_src;

/* Elements after the split dimension (all of a replicated tensor's). */
static size_t split_inner(const loco_tensor *t) {
    if (t->split_dim < 0)
        return t->numel;
    size_t inner = 1;
    for (int d = t->split_dim + 1; d < t->ndim; d++)
        inner *= (size_t)t->shape[d];
    return inner;
}

/* Indices along the split dimension (one for a replicated tensor). */
static size_t split_len(const loco_tensor *t) {
    return t->split_dim < 0 ? 1 : (size_t)t->shape[t->split_dim];
}

/* Finds view tensor i in the whole model and in the source stages;
 * LOCO_EINVAL when a name is not the model's (a table of another model). */
static int find_source(const reshard *R, int i, tensor_src *ts) {
    const char *name = R->dst.t[i].name;
    ts->vt = &R->dst.t[i];
    ts->gi = loco_ttable_find(&R->whole, name);
    if (ts->gi < 0)
        return LOCO_ERR(LOCO_EINVAL, "the view's tensor '%s' is not the model's", name);
    ts->gt = &R->whole.t[ts->gi];
    ts->q = -1;
    if (!strcmp(name, "transformer.wte.weight"))
        ts->q = R->embed;
    for (int q = 0; ts->q < 0 && q < R->pp; q++)
        if (loco_ttable_find(&R->src[q], name) >= 0)
            ts->q = q;
    if (ts->q < 0)
        return LOCO_ERR(LOCO_EINVAL, "no stage of the checkpoint holds '%s'", name);
    ts->st = &R->src[ts->q].t[loco_ttable_find(&R->src[ts->q], name)];
    return 0;
}

/* The tensor's maps over its split dimension. */
static void tensor_maps(reshard *R, const tensor_src *ts) {
    const loco_tensor *gt = ts->gt;
    if (gt->split_dim < 0) {
        R->dmap[0] = 0, R->srank[0] = 0, R->sidx[0] = 0;
        return;
    }
    const size_t inner = split_inner(gt), nl = split_len(ts->vt), n = split_len(gt);
    for (size_t xl = 0; xl < nl; xl++) {
        size_t g;
        R->dmap[xl] = loco_gpt_tp_global(gt, R->t_dst, R->rank, xl * inner, &g)
                          ? (int64_t)(g / inner)
                          : -1;
    }
    for (size_t x = 0; x < n; x++) {
        int k;
        size_t j;
        loco_gpt_tp_locate(gt, R->t_src, x * inner, &k, &j);
        R->srank[x] = k < 0 ? 0 : k;
        R->sidx[x] = j / inner;
    }
}

/* The view's elements [lo, hi) of tensor ts (its maps built): copy =
 * false marks the source shards they need, copy = true copies them into
 * dst[0 .. na) (which hold the view's range from `base`) from source
 * arrays a .. a + na - 1 (0 params, 1 exp_avg, 2 exp_avg_sq). */
static void walk(reshard *R, const tensor_src *ts, size_t lo, size_t hi, size_t base,
                 float *const *dst, int a, int na, bool copy) {
    const loco_tensor *vt = ts->vt, *stt = ts->st;
    const size_t inner = split_inner(vt), nl = split_len(vt), nls = split_len(stt);
    size_t x = lo > vt->offset ? lo : vt->offset;
    const size_t end = hi < vt->offset + vt->numel ? hi : vt->offset + vt->numel;
    const int64_t *dmap = R->dmap;
    while (x < end) {
        const size_t j = x - vt->offset, row = j / inner, in = j % inner, o = row / nl;
        size_t xl = row % nl, len = inner - in;
        const int64_t gx = dmap[xl];
        if (gx < 0) {
            len = len < end - x ? len : end - x;
            for (int b = 0; copy && b < na; b++)
                memset(dst[b] + (x - base), 0, len * sizeof(float));
            x += len;
            continue;
        }
        const int k = R->srank[gx];
        const size_t js = (o * nls + R->sidx[gx]) * inner + in;
        /* Further split indices that follow on in the same source slice. */
        while (x + len < end && xl + 1 < nl && dmap[xl + 1] >= 0 && R->srank[dmap[xl + 1]] == k &&
               R->sidx[dmap[xl + 1]] == R->sidx[dmap[xl]] + 1)
            len += inner, xl++;
        len = len < end - x ? len : end - x;
        const float *src[2] = {NULL, NULL};
        if (R->sharded) {
            const size_t fx = stt->offset + js;
            loco__ckpt_shard_ref *s = loco__ckpt_shard_at(&R->mf, ts->q * R->t_src + k, fx);
            len = len < s->hi - fx ? len : s->hi - fx;
            s->need = true;
            for (int b = 0; copy && b < na; b++)
                src[b] = s->x[a + b] + (fx - s->lo);
        } else {
            for (int b = 0; copy && b < na; b++)
                src[b] = R->single.x[3 * ts->gi + a + b] + js;
        }
        for (int b = 0; copy && b < na; b++)
            memcpy(dst[b] + (x - base), src[b], len * sizeof(float));
        x += len;
    }
}

/* Every tensor of the view, first marking (copy = false), then copying. */
static int walk_view(reshard *R, loco_ckpt_view *v, bool copy) {
    float *p[1] = {v->params}, *mv[2] = {v->m, v->v};
    for (int i = 0; i < R->dst.n; i++) {
        const loco_tensor *t = &R->dst.t[i];
        const size_t a = t->offset, b = t->offset + t->numel;
        const bool need_p = loco__ckpt_overlaps(a, b, v->p_lo, v->p_hi);
        const bool need_o = v->m && loco__ckpt_overlaps(a, b, v->o_lo, v->o_hi);
        if (!need_p && !need_o)
            continue;
        tensor_src ts;
        LOCO_CHECK(find_source(R, i, &ts));
        tensor_maps(R, &ts);
        if (need_p)
            walk(R, &ts, v->p_lo, v->p_hi, v->p_lo, p, 0, 1, copy);
        if (need_o)
            walk(R, &ts, v->o_lo, v->o_hi, v->o_lo, mv, 1, 2, copy);
    }
    return 0;
}

/* True when two tables name the same tensors with the same shapes and
 * offsets. */
static bool same_table(const loco_ttable *a, const loco_ttable *b) {
    if (a->n != b->n || a->numel != b->numel)
        return false;
    for (int i = 0; i < a->n; i++) {
        const loco_tensor *x = &a->t[i], *y = &b->t[i];
        if (strcmp(x->name, y->name) || x->ndim != y->ndim || x->offset != y->offset ||
            x->split_dim != y->split_dim)
            return false;
        for (int d = 0; d < x->ndim; d++)
            if (x->shape[d] != y->shape[d])
                return false;
    }
    return true;
}

/* The source stages' tables at the checkpoint's tp, their parameters,
 * and which holds the embeddings. */
static int source_tables(reshard *R, const loco_gpt_config *model, const loco_gpt_stage *stages,
                         int ep, size_t *P) {
    loco_gpt_config mc = *model;
    mc.tp = R->t_src;
    mc.ep = ep;
    R->src = loco_alloc((size_t)R->pp * sizeof *R->src);
    if (!R->src)
        return LOCO_ERR(LOCO_ENOMEM, "tables of %d pipeline stages", R->pp);
    for (int q = 0; q < R->pp; q++)
        loco_ttable_init(&R->src[q]);
    for (int q = R->pp - 1; q >= 0; q--) { /* groups: stage q / ep, ep rank q % ep */
        mc.ep_rank = q % ep;
        LOCO_CHECK(stages ? loco_gpt_build_stage_table(&R->src[q], &mc, &stages[q / ep])
                          : loco_gpt_build_table(&R->src[q], &mc));
        P[q] = R->src[q].numel;
        if (!stages || stages[q / ep].first[0] == 0)
            R->embed = q;
    }
    return 0;
}

int loco__ckpt_load_resharded(const char *dir, const cJSON *j, int t_src, int pp_stages,
                              int ep_src, const loco_gpt_stage *stages, loco_ckpt_view *v) {
    const int pp = pp_stages * ep_src; /* source groups */
    reshard R = {.t_src = t_src, .t_dst = loco__ckpt_view_tp(v), .rank = v->tp_rank, .pp = pp,
                 .sharded = cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(j, "shards"))};
    int rc = 0;
    size_t *P = NULL;
    loco_ttable_init(&R.whole);
    loco_ttable_init(&R.dst);
    loco_gpt_config mc = v->model;
    mc.tp = 1;
    mc.ep = 1, mc.ep_rank = 0; /* every expert */
    LOCO_CHECK_GOTO(loco_gpt_build_table(&R.whole, &mc), out);
    mc.ep = v->model.ep, mc.ep_rank = v->model.ep_rank;
    mc.tp = R.t_dst;
    loco_gpt_stage vs = v->stage ? *v->stage : (loco_gpt_stage){0};
    vs.slots = 1; /* the table does not depend on the activation slots */
    LOCO_CHECK_GOTO(v->stage ? loco_gpt_build_stage_table(&R.dst, &mc, &vs)
                             : loco_gpt_build_table(&R.dst, &mc),
                    out);
    if (!same_table(&R.dst, v->tt)) {
        rc = LOCO_ERR(LOCO_EINVAL,
                      "the view's table is not tp rank %d's slice (tp = %d) of its %s", R.rank,
                      R.t_dst, v->stage ? "stage" : "model");
        goto out;
    }
    P = loco_alloc((size_t)pp * sizeof *P);
    if (!P) {
        rc = LOCO_ERR(LOCO_ENOMEM, "table of %d pipeline stages", pp);
        goto out;
    }
    LOCO_CHECK_GOTO(source_tables(&R, &v->model, stages, ep_src, P), out);
    size_t cap = 1;
    for (int i = 0; i < R.whole.n; i++) {
        const size_t n = split_len(&R.whole.t[i]);
        cap = n > cap ? n : cap;
    }
    for (int i = 0; i < R.dst.n; i++) {
        const size_t nl = split_len(&R.dst.t[i]);
        cap = nl > cap ? nl : cap;
    }
    R.dmap = loco_alloc(cap * sizeof *R.dmap);
    R.srank = loco_alloc(cap * sizeof *R.srank);
    R.sidx = loco_alloc(cap * sizeof *R.sidx);
    if (!R.dmap || !R.srank || !R.sidx) {
        rc = LOCO_ERR(LOCO_ENOMEM, "resharding maps of %zu indices", cap);
        goto out;
    }
    /* Everything the view needs is checked before it is touched: the
     * manifest, every tensor's source, the files. */
    if (R.sharded)
        LOCO_CHECK_GOTO(loco__ckpt_parse_manifest(&R.mf, dir, j, t_src, pp_stages, ep_src, P),
                        out);
    LOCO_CHECK_GOTO(walk_view(&R, v, false), out);
    if (R.sharded) {
        LOCO_CHECK_GOTO(loco__ckpt_open_shards(&R.mf), out);
    } else {
        const cJSON *sums = cJSON_GetObjectItemCaseSensitive(j, "xxh3");
        LOCO_CHECK_GOTO(loco__ckpt_open_single(&R.single, dir, sums, &R.whole, v->m != NULL), out);
    }
    LOCO_CHECK_GOTO(walk_view(&R, v, true), out);
out:
    loco__ckpt_manifest_fini(&R.mf);
    loco__ckpt_close_single(&R.single);
    loco_free(R.dmap);
    loco_free(R.srank);
    loco_free(R.sidx);
    for (int q = 0; R.src && q < R.pp; q++)
        loco_ttable_fini(&R.src[q]);
    loco_free(R.src);
    loco_free(P);
    loco_ttable_fini(&R.whole);
    loco_ttable_fini(&R.dst);
    return rc;
}
