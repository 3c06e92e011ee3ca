/* Loading checkpoints: either layout, at any dp, tp and pipeline split
 * (resharding through ckpt_reshard.c), from a directory or a URL; export
 * to the Hugging Face layout. Everything is verified before a view is
 * written. */
#include "inner/ckpt/internal.h"

#include <cjson/cJSON.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int loco__ckpt_parse_hex(const cJSON *item, uint64_t *out) {
    if (!cJSON_IsString(item) || strlen(item->valuestring) != 16)
        return -1;
    char *end;
    *out = strtoull(item->valuestring, &end, 16);
    return *end ? -1 : 0;
}

int loco__ckpt_get_int(const cJSON *obj, const char *key, int64_t *out) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble > 9e15)
        return -1;
    *out = (int64_t)x->valuedouble;
    return 0;
}

/* Reads a file and checks its XXH3 against the expected value; `what`
 * names it in messages (NULL: its name). */
int loco__ckpt_verify_hash(const char *dir, const char *name, const char *what, uint64_t want) {
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (!what)
        what = name;
    uint64_t got;
    int rc = loco__ckpt_file_hash(path, &got);
    if (rc < 0 && access(path, F_OK) != 0)
        return LOCO_ERR(LOCO_EPROTO, "checkpoint %s: %s is missing", dir, what);
    if (rc < 0)
        return LOCO_ERR(LOCO_EPROTO, "checkpoint %s: cannot read %s (%s)", dir, what,
                        loco_strerror(rc));
    if (got != want)
        return LOCO_ERR(LOCO_EPROTO,
                        "checkpoint %s: %s is corrupt or truncated (checksum %016llx, state.json "
                        "says %016llx)",
                        dir, what, (unsigned long long)got, (unsigned long long)want);
    return 0;
}

/* Checks the checksum state.json gives for a file of the single layout. */
static int verify_file(const char *dir, const char *name, const cJSON *sums) {
    uint64_t want;
    if (loco__ckpt_parse_hex(cJSON_GetObjectItemCaseSensitive(sums, name), &want) < 0)
        return LOCO_ERR(LOCO_EPROTO, "checkpoint %s: state.json has no checksum for %s", dir,
                        name);
    return loco__ckpt_verify_hash(dir, name, NULL, want);
}

/* Copies the part of src's flat range [a, b) that falls in [lo, hi) to dst
 * (which holds [lo, hi)). */
static void copy_overlap(float *dst, size_t lo, size_t hi, const float *src, size_t a, size_t b) {
    size_t x = a > lo ? a : lo, y = b < hi ? b : hi;
    if (x < y)
        memcpy(dst + (x - lo), src + (x - a), (y - x) * sizeof(float));
}

bool loco__ckpt_overlaps(size_t a, size_t b, size_t lo, size_t hi) { return a < hi && lo < b; }

/* ------------------------------------------------- single layout, loading */

void loco__ckpt_close_single(loco__ckpt_single_src *s) {
    loco_st_close(s->model);
    loco_st_close(s->optim);
    loco_free(s->x);
    memset(s, 0, sizeof *s);
}

/* A tensor of the single layout, which must have t's shape. */
static int get_tensor(const char *dir, const loco_st *f, const char *name, const loco_tensor *t,
                      const float **x) {
    int ndim;
    int64_t shape[LOCO_TENSOR_MAX_DIM];
    LOCO_CHECK(loco_st_get(f, name, x, &ndim, shape));
    bool same = ndim == t->ndim;
    for (int d = 0; same && d < ndim; d++)
        same = shape[d] == t->shape[d];
    if (!same)
        return LOCO_ERR(LOCO_EPROTO,
                        "checkpoint %s: tensor '%s' has another shape than the model's", dir,
                        name);
    return 0;
}

/* Verifies (checksums, then every tensor of tt present with its shape) and
 * opens the single layout; on error s holds nothing. */
int loco__ckpt_open_single(loco__ckpt_single_src *s, const char *dir, const cJSON *sums,
                           const loco_ttable *tt, bool moments) {
    int rc = 0;
    char path[PATH_MAX + 64];
    loco_ttable both = {0};
    memset(s, 0, sizeof *s);
    s->x = loco_alloc(3 * (size_t)tt->n * sizeof *s->x);
    if (!s->x) {
        rc = LOCO_ERR(LOCO_ENOMEM, "tensor index of %d tensors", tt->n);
        goto out;
    }
    LOCO_CHECK_GOTO(verify_file(dir, MODEL_FILE, sums), out);
    snprintf(path, sizeof path, "%s/" MODEL_FILE, dir);
    LOCO_CHECK_GOTO(loco_st_open(&s->model, path), out);
    if (moments) {
        LOCO_CHECK_GOTO(verify_file(dir, OPTIM_FILE, sums), out);
        snprintf(path, sizeof path, "%s/" OPTIM_FILE, dir);
        LOCO_CHECK_GOTO(loco_st_open(&s->optim, path), out);
        LOCO_CHECK_GOTO(loco__ckpt_moments_table(&both, tt), out);
    }
    for (int i = 0; i < tt->n; i++) {
        const float **x = &s->x[3 * i];
        x[1] = x[2] = NULL;
        LOCO_CHECK_GOTO(get_tensor(dir, s->model, tt->t[i].name, &tt->t[i], &x[0]), out);
        if (!moments)
            continue;
        LOCO_CHECK_GOTO(get_tensor(dir, s->optim, both.t[i].name, &tt->t[i], &x[1]), out);
        LOCO_CHECK_GOTO(get_tensor(dir, s->optim, both.t[tt->n + i].name, &tt->t[i], &x[2]), out);
    }
out:
    loco_ttable_fini(&both);
    if (rc < 0)
        loco__ckpt_close_single(s);
    return rc;
}

/* Single layout into a whole-model view: everything checked, then the
 * overlaps copied tensor by tensor. */
static int load_single(const char *dir, const cJSON *sums, loco_ckpt_view *v) {
    loco__ckpt_single_src s;
    LOCO_CHECK(loco__ckpt_open_single(&s, dir, sums, v->tt, v->m != NULL));
    for (int i = 0; i < v->tt->n; i++) {
        const loco_tensor *t = &v->tt->t[i];
        const size_t a = t->offset, b = t->offset + t->numel;
        copy_overlap(v->params, v->p_lo, v->p_hi, s.x[3 * i], a, b);
        if (v->m) {
            copy_overlap(v->m, v->o_lo, v->o_hi, s.x[3 * i + 1], a, b);
            copy_overlap(v->v, v->o_lo, v->o_hi, s.x[3 * i + 2], a, b);
        }
    }
    loco__ckpt_close_single(&s);
    return 0;
}

/* ------------------------------------------------ sharded layout, loading */

/* The checkpoint's tp and stage of the view's pp rank equal the view's:
 * the shards of the view's (pp rank, tp rank), by range overlap. */
static int load_sharded(const char *dir, const cJSON *j, int tp, int pp,
                        const loco_gpt_stage *stages, loco_ckpt_view *v) {
    loco__ckpt_manifest mf;
    const int ep = v->model.ep > 1 ? v->model.ep : 1; /* the checkpoint's too */
    size_t *P = loco_alloc((size_t)pp * ep * sizeof *P);
    if (!P)
        return LOCO_ERR(LOCO_ENOMEM, "table of %d pipeline stages", pp);
    const int q = (pp > 1 ? v->pp_rank : 0) * ep + (ep > 1 ? v->model.ep_rank : 0);
    int rc = 0;
    if (pp * ep > 1) {
        loco_gpt_config mc = v->model;
        mc.tp = tp;
        LOCO_CHECK_GOTO(loco__ckpt_stage_params(&mc, stages, pp, P), out);
    } else {
        P[0] = v->tt->numel;
    }
    LOCO_CHECK_GOTO(loco__ckpt_parse_manifest(&mf, dir, j, tp, pp, ep, P), out);
    if (P[q] != v->tt->numel) {
        loco__ckpt_manifest_fini(&mf);
        rc = LOCO_ERR(LOCO_EINVAL, "the view's table is not pp rank %d's stage (%zu parameters, "
                                   "the checkpoint's has %zu)",
                      q, v->tt->numel, P[q]);
        goto out;
    }
    for (int i = 0; i < mf.n; i++) {
        loco__ckpt_shard_ref *s = &mf.s[i];
        s->need = s->rank == v->tp_rank && s->pp == q &&
                  (loco__ckpt_overlaps(s->lo, s->hi, v->p_lo, v->p_hi) ||
                   (v->m && loco__ckpt_overlaps(s->lo, s->hi, v->o_lo, v->o_hi)));
    }
    rc = loco__ckpt_open_shards(&mf);
    for (int i = 0; rc == 0 && i < mf.n; i++) {
        const loco__ckpt_shard_ref *s = &mf.s[i];
        if (!s->need)
            continue;
        copy_overlap(v->params, v->p_lo, v->p_hi, s->x[0], s->lo, s->hi);
        if (v->m) {
            copy_overlap(v->m, v->o_lo, v->o_hi, s->x[1], s->lo, s->hi);
            copy_overlap(v->v, v->o_lo, v->o_hi, s->x[2], s->lo, s->hi);
        }
    }
    loco__ckpt_manifest_fini(&mf);
out:
    loco_free(P);
    return rc;
}

static int load_view(const char *dir, const loco_config *cfg, loco_ckpt_view *v,
                     loco_ckpt_state *st);

/* A URL: the newest complete checkpoint, fetched into a directory of this
 * process (ranks sharing run.dir never touch each other's), then loaded. */
static int load_url(const char *url, const loco_config *cfg, loco_ckpt_view *v,
                    loco_ckpt_state *st) {
    char local[PATH_MAX];
    if (snprintf(local, sizeof local, "%s/ckpt_cache/fetch_%ld", cfg->run.dir, (long)getpid()) >=
        (int)sizeof local)
        return LOCO_ERR(LOCO_EINVAL, "run.dir too long for a cache path: %s", cfg->run.dir);
    int64_t step;
    int rc;
    LOCO_CHECK_GOTO(loco_ckpt_fetch(url, cfg, local, &step), out);
    rc = load_view(local, cfg, v, st);
    if (rc < 0) {
        /* Complete but not loadable here (another model): kept to look at. */
        char why[1024];
        snprintf(why, sizeof why, "%s", loco_errmsg());
        return LOCO_ERR(rc, "checkpoint step %lld of %s (fetched into %s, kept there): %s",
                        (long long)step, url, local, why);
    }
    loco_info("loaded checkpoint step %lld from %s", (long long)step, url);
out:
    loco_rmtree(local);
    rmdir(dirname(local)); /* ckpt_cache, unless another process uses it */
    return rc;
}

int loco_ckpt_load_view(const char *dir, const loco_config *cfg, loco_ckpt_view *v,
                        loco_ckpt_state *st) {
    if (loco_store_is_url(dir))
        return load_url(dir, cfg, v, st);
    /* A crash mid-publication on a file system without atomic exchange
     * leaves the previous checkpoint as DIR.old (loco_dir_commit). */
    struct stat sb;
    char old[PATH_MAX];
    if (stat(dir, &sb) != 0 && snprintf(old, sizeof old, "%s.old", dir) < (int)sizeof old &&
        stat(old, &sb) == 0) {
        loco_warn("checkpoint %s is missing; loading %s, left by an interrupted save", dir, old);
        return load_view(old, cfg, v, st);
    }
    return load_view(dir, cfg, v, st);
}

/* ------------------------------------------------- state.json and layout */

int loco__ckpt_read_state(const char *dir, cJSON **out, loco_ckpt_state *st, int64_t *adam_t) {
    char path[PATH_MAX + 64];
    void *text;
    size_t len;
    int rc = 0;
    *out = NULL;
    snprintf(path, sizeof path, "%s/" STATE_FILE, dir);
    if (loco_file_read(path, &text, &len) < 0)
        return LOCO_ERR(LOCO_EPROTO, "%s is not a complete checkpoint (no readable %s)", dir,
                        STATE_FILE);
    cJSON *j = cJSON_ParseWithLength(text, len);
    loco_free(text);
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(j, "format");
    if (!cJSON_IsObject(j) || !cJSON_IsString(fmt) || strcmp(fmt->valuestring, CKPT_FORMAT)) {
        rc = LOCO_ERR(LOCO_EPROTO, "checkpoint %s: %s is not a loco checkpoint state", dir,
                      STATE_FILE);
        goto out;
    }
    int64_t version, step, adam, shard, pos, epoch;
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(j, "data");
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(j, "rng");
    const cJSON *sums = cJSON_GetObjectItemCaseSensitive(j, "xxh3");
    const cJSON *shards = cJSON_GetObjectItemCaseSensitive(j, "shards");
    uint64_t model_hash, rng[4];
    if (loco__ckpt_get_int(j, "version", &version) || loco__ckpt_get_int(j, "step", &step) ||
        loco__ckpt_get_int(j, "adam_t", &adam) || loco__ckpt_get_int(d, "shard", &shard) ||
        loco__ckpt_get_int(d, "pos", &pos) || loco__ckpt_get_int(d, "epoch", &epoch) ||
        !cJSON_IsArray(r) || cJSON_GetArraySize(r) != 4 ||
        loco__ckpt_parse_hex(cJSON_GetObjectItemCaseSensitive(j, "model_hash"), &model_hash) ||
        !(cJSON_IsObject(sums) || cJSON_IsArray(shards))) {
        rc = LOCO_ERR(LOCO_EPROTO, "checkpoint %s: %s lacks or mangles a field", dir, STATE_FILE);
        goto out;
    }
    for (int i = 0; i < 4; i++)
        if (loco__ckpt_parse_hex(cJSON_GetArrayItem(r, i), &rng[i])) {
            rc = LOCO_ERR(LOCO_EPROTO, "checkpoint %s: bad rng state", dir);
            goto out;
        }
    if (version != CKPT_VERSION) {
        rc = LOCO_ERR(LOCO_EPROTO, "checkpoint %s: version %lld, this build reads %d", dir,
                      (long long)version, CKPT_VERSION);
        goto out;
    }
    *st = (loco_ckpt_state){.step = step,
                            .data = {.shard = shard, .pos = pos, .epoch = epoch},
                            .model_hash = model_hash};
    memcpy(st->rng.s, rng, sizeof rng);
    *adam_t = adam;
out:
    if (rc < 0)
        cJSON_Delete(j);
    else
        *out = j;
    return rc;
}

int loco__ckpt_parse_layout(const char *dir, const cJSON *j, const loco_gpt_config *mc, int *tp,
                            int *ep, int *pp, loco_gpt_stage **stages) {
    const bool sharded = cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(j, "shards"));
    int64_t t = 1, e = 1;
    *stages = NULL;
    if (cJSON_HasObjectItem(j, "tp") &&
        (loco__ckpt_get_int(j, "tp", &t) || t < 1 || t > 1 << 20))
        return LOCO_ERR(LOCO_EPROTO, "checkpoint %s: %s has a bad tp", dir, STATE_FILE);
    if (!sharded && t != 1)
        return LOCO_ERR(LOCO_EPROTO,
                        "checkpoint %s: a single-file checkpoint holds the whole model, not a tp "
                        "= %lld slice",
                        dir, (long long)t);
    if (mc->n_head % t || 4 * (int64_t)mc->n_embd % t)
        return LOCO_ERR(LOCO_EPROTO,
                        "checkpoint %s: its tp = %lld does not divide the model's n_head (%d) or "
                        "4 x n_embd (%lld)",
                        dir, (long long)t, mc->n_head, 4 * (long long)mc->n_embd);
    if (cJSON_HasObjectItem(j, "ep") &&
        (loco__ckpt_get_int(j, "ep", &e) || e < 1 || e > 1 << 20 || !sharded ||
         mc->n_experts <= 0 || mc->n_experts % e))
        return LOCO_ERR(LOCO_EPROTO,
                        "checkpoint %s: %s has an ep that does not split the model's %d experts "
                        "(or a single-file layout)",
                        dir, STATE_FILE, mc->n_experts);
    LOCO_CHECK(loco__ckpt_parse_stages(dir, j, mc->n_layer, pp, stages));
    if (*pp > 1 && !sharded) {
        loco_free(*stages);
        *stages = NULL;
        return LOCO_ERR(LOCO_EPROTO,
                        "checkpoint %s: a single-file checkpoint holds the whole model, not pp = "
                        "%d stages",
                        dir, *pp);
    }
    *tp = (int)t, *ep = (int)e;
    return 0;
}

/* state.json's "router_bias": exactly n finite numbers into bias. */
static int read_router_bias(const char *dir, const cJSON *j, float *bias, size_t n) {
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(j, "router_bias");
    if (!cJSON_IsArray(b) || (size_t)cJSON_GetArraySize(b) != n)
        return LOCO_ERR(LOCO_EPROTO,
                        "checkpoint %s: %s should hold \"router_bias\", the %zu routing biases of "
                        "model.router_bias_rate > 0 (it has %d)",
                        dir, STATE_FILE, n, cJSON_IsArray(b) ? cJSON_GetArraySize(b) : 0);
    size_t i = 0;
    for (const cJSON *x = b->child; x; x = x->next, i++) {
        if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble))
            return LOCO_ERR(LOCO_EPROTO, "checkpoint %s: %s router_bias[%zu] is not a number",
                            dir, STATE_FILE, i);
        bias[i] = (float)x->valuedouble;
    }
    return 0;
}

static int load_view(const char *dir, const loco_config *cfg, loco_ckpt_view *v,
                     loco_ckpt_state *st) {
    int rc = 0, tp, ep, pp;
    int64_t adam_t;
    cJSON *j;
    loco_ckpt_state s;
    loco_gpt_stage *stages = NULL;
    float *bias = NULL;
    LOCO_CHECK(loco__ckpt_read_state(dir, &j, &s, &adam_t));
    if (s.model_hash != loco_config_hash(cfg, loco__ckpt_model_sections)) {
        rc = LOCO_ERR(LOCO_EINVAL,
                      "checkpoint %s was written for another [model] section than the config's "
                      "(see %s/config.ini)",
                      dir, dir);
        goto out;
    }
    /* read first, landed last: on error the view is untouched */
    if (v->n_router_bias && !(bias = loco_alloc(v->n_router_bias * sizeof(float)))) {
        rc = LOCO_ERR(LOCO_ENOMEM, "routing biases");
        goto out;
    }
    if (v->n_router_bias)
        LOCO_CHECK_GOTO(read_router_bias(dir, j, bias, v->n_router_bias), out);
    LOCO_CHECK_GOTO(loco__ckpt_parse_layout(dir, j, &v->model, &tp, &ep, &pp, &stages), out);
    const int tv = loco__ckpt_view_tp(v);
    if (v->tp_rank < 0 || v->tp_rank >= tv) {
        rc = LOCO_ERR(LOCO_EINVAL, "tp rank %d of a view of tp = %d", v->tp_rank, tv);
        goto out;
    }
    /* Same layout: the view's own shards; any other: by tensor name. */
    const bool same_pp = pp == 1 ? !v->stage
                                 : v->stage && v->pp_rank >= 0 && v->pp_rank < pp &&
                                       loco__ckpt_same_stage(v->stage, &stages[v->pp_rank]);
    const bool same_ep = ep == (v->model.ep > 1 ? v->model.ep : 1);
    if (tp != tv || !same_pp || !same_ep)
        LOCO_CHECK_GOTO(loco__ckpt_load_resharded(dir, j, tp, pp, ep, stages, v), out);
    else if (cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(j, "shards")))
        LOCO_CHECK_GOTO(load_sharded(dir, j, tp, pp, stages, v), out);
    else
        LOCO_CHECK_GOTO(load_single(dir, cJSON_GetObjectItemCaseSensitive(j, "xxh3"), v), out);
    v->adam_t = adam_t;
    if (v->n_router_bias)
        memcpy(v->router_bias, bias, v->n_router_bias * sizeof(float));
    if (st)
        *st = s;
out:
    loco_free(bias);
    loco_free(stages);
    cJSON_Delete(j);
    return rc;
}

int loco_ckpt_load(const char *dir, const loco_config *cfg, loco_gpt *m, loco_adamw *opt,
                   loco_ckpt_state *st) {
    loco_ckpt_view v = loco__ckpt_model_view(m, opt);
    LOCO_CHECK(loco_ckpt_load_view(dir, cfg, &v, st));
    if (opt)
        opt->t = v.adam_t;
    return 0;
}

int loco_ckpt_export(const char *dir, const char *out) {
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/config.ini", dir);
    loco_config cfg;
    loco_config_defaults(&cfg);
    int rc = loco_config_load(&cfg, path);
    if (rc < 0)
        return LOCO_ERR(LOCO_EPROTO, "%s is not a complete checkpoint (config.ini: %s)", dir,
                        loco_strerror(rc));
    /* The whole model, whatever parallel.tp and pp the run used. */
    loco_gpt_config mc = loco_gpt_config_from(&cfg);
    mc.tp = 1;
    loco_ttable tt;
    LOCO_CHECK(loco_gpt_build_table(&tt, &mc));
    float *params = loco_alloc(tt.numel * sizeof(float));
    if (!params) {
        loco_ttable_fini(&tt);
        return LOCO_ERR(LOCO_ENOMEM, "export buffer of %zu parameters", tt.numel);
    }
    loco_ckpt_view v = {.tt = &tt, .model = mc, .params = params, .p_lo = 0, .p_hi = tt.numel};
    LOCO_CHECK_GOTO(loco_ckpt_load_view(dir, &cfg, &v, NULL), out);
    LOCO_CHECK_GOTO(loco_mkdirs(out), out);
    if (!loco_gpt_is_gpt2(&mc)) { /* LlamaForCausalLM */
        rc = loco__hf_llama_export(out, &tt, params, &mc);
        goto out;
    }
    snprintf(path, sizeof path, "%s/" MODEL_FILE, out);
    const char *meta[] = {"producer", "loco ckpt export", NULL};
    LOCO_CHECK_GOTO(loco_st_write(path, &tt, params, NULL, meta), out);
    snprintf(path, sizeof path, "%s/config.json", out);
    LOCO_CHECK_GOTO(loco__ckpt_write_hf_config(path, &mc), out);
out:
    loco_free(params);
    loco_ttable_fini(&tt);
    return rc;
}

int loco_ckpt_load_model(loco_gpt **out, const char *ckpt, const loco_config *cfg, int B, int T) {
    loco_gpt_config mc = loco_gpt_config_from(cfg);
    LOCO_CHECK(loco_gpt_create(out, &mc, B, T));
    int rc = loco_ckpt_load(ckpt, cfg, *out, NULL, NULL);
    if (rc < 0) {
        loco_gpt_destroy(*out);
        *out = NULL;
    }
    return rc;
}
