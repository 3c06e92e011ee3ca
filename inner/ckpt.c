/* Checkpoints: a directory that Hugging Face loads (model.safetensors and
 * config.json) plus what loco needs to continue bit for bit (optimizer
 * state, step, data position, RNG), written atomically and verified by
 * checksums before anything is loaded. */
#include "inner/ckpt_internal.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CKPT_FORMAT "loco-checkpoint"
#define CKPT_VERSION 1
#define MODEL_FILE "model.safetensors"
#define OPTIM_FILE "optimizer.safetensors"
#define STATE_FILE "state.json"

static const char *const model_sections[] = {"model", NULL};

static int write_text(const char *path, const char *text) {
    return loco_file_write_sync(path, text, strlen(text));
}

static int file_hash(const char *path, uint64_t *h) {
    void *data;
    size_t len;
    LOCO_CHECK(loco_file_read(path, &data, &len));
    *h = loco_hash64(data, len);
    loco_free(data);
    return 0;
}

static int write_hf_config(const char *path, const loco_gpt_config *c) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "model_type", "gpt2");
    cJSON *arch = cJSON_AddArrayToObject(j, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString("GPT2LMHeadModel"));
    cJSON_AddNumberToObject(j, "vocab_size", c->vocab_size);
    cJSON_AddNumberToObject(j, "n_positions", c->seq_len);
    cJSON_AddNumberToObject(j, "n_ctx", c->seq_len);
    cJSON_AddNumberToObject(j, "n_embd", c->n_embd);
    cJSON_AddNumberToObject(j, "n_layer", c->n_layer);
    cJSON_AddNumberToObject(j, "n_head", c->n_head);
    cJSON_AddNullToObject(j, "n_inner"); /* 4 * n_embd */
    cJSON_AddStringToObject(j, "activation_function", "gelu_new");
    cJSON_AddNumberToObject(j, "layer_norm_epsilon", 1e-5);
    cJSON_AddNumberToObject(j, "initializer_range", 0.02);
    cJSON_AddNumberToObject(j, "resid_pdrop", 0.0);
    cJSON_AddNumberToObject(j, "embd_pdrop", 0.0);
    cJSON_AddNumberToObject(j, "attn_pdrop", 0.0);
    cJSON_AddBoolToObject(j, "tie_word_embeddings", 1);
    cJSON_AddBoolToObject(j, "scale_attn_weights", 1);
    cJSON_AddStringToObject(j, "torch_dtype", "float32");
    char *s = cJSON_Print(j);
    cJSON_Delete(j);
    if (!s)
        return LOCO_ERR(LOCO_ENOMEM, "config.json");
    int rc = write_text(path, s);
    cJSON_free(s);
    return rc;
}

static void hex_item(cJSON *obj, const char *key, uint64_t v) {
    char h[17];
    loco_hash_hex(v, h);
    cJSON_AddStringToObject(obj, key, h);
}

/* Bytes of config.ini for cfg (caller frees with free()). */
static int dump_config(const loco_config *cfg, char **text, size_t *len) {
    FILE *f = open_memstream(text, len);
    if (!f)
        return LOCO_ERR(LOCO_ENOMEM, "config dump");
    loco_config_dump(cfg, f);
    fclose(f);
    return 0;
}

/* config.json and config.ini into tmp. */
static int write_configs(const char *tmp, const loco_config *cfg, const loco_gpt_config *mc) {
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/config.json", tmp);
    LOCO_CHECK(write_hf_config(path, mc));
    snprintf(path, sizeof path, "%s/config.ini", tmp);
    char *ini = NULL;
    size_t len = 0;
    LOCO_CHECK(dump_config(cfg, &ini, &len));
    int rc = loco_file_write_sync(path, ini, len);
    free(ini);
    return rc;
}

/* The fields both layouts share in state.json. */
static cJSON *state_json(const loco_ckpt_state *st, int64_t adam_t) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "format", CKPT_FORMAT);
    cJSON_AddNumberToObject(j, "version", CKPT_VERSION);
    cJSON_AddNumberToObject(j, "step", (double)st->step);
    cJSON_AddNumberToObject(j, "adam_t", (double)adam_t);
    cJSON *d = cJSON_AddObjectToObject(j, "data");
    cJSON_AddNumberToObject(d, "shard", (double)st->data.shard);
    cJSON_AddNumberToObject(d, "pos", (double)st->data.pos);
    cJSON_AddNumberToObject(d, "epoch", (double)st->data.epoch);
    cJSON *r = cJSON_AddArrayToObject(j, "rng");
    for (int i = 0; i < 4; i++) {
        char h[17];
        loco_hash_hex(st->rng.s[i], h);
        cJSON_AddItemToArray(r, cJSON_CreateString(h));
    }
    hex_item(j, "model_hash", st->model_hash);
    return j;
}

/* state.json goes last: a directory without it is not a checkpoint. */
static int write_state(const char *tmp, cJSON *j) {
    char *json = cJSON_Print(j);
    if (!json)
        return LOCO_ERR(LOCO_ENOMEM, "state.json");
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/" STATE_FILE, tmp);
    int rc = write_text(path, json);
    cJSON_free(json);
    return rc;
}

/* The AdamW moments as one table: exp_avg.NAME then exp_avg_sq.NAME. */
static int moments_table(loco_ttable *both, const loco_ttable *tt) {
    loco_ttable_init(both);
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < tt->n; i++) {
            char n[LOCO_TENSOR_NAME_MAX + 16];
            snprintf(n, sizeof n, "%s%.80s", pass ? "exp_avg_sq." : "exp_avg.", tt->t[i].name);
            int rc = loco_ttable_add(both, n, tt->t[i].ndim, tt->t[i].shape, -1, false);
            if (rc < 0) {
                loco_ttable_fini(both);
                return rc;
            }
        }
    return 0;
}

/* The view's tensor-parallel degree: 1 for the whole model. */
int loco__ckpt_view_tp(const loco_ckpt_view *v) { return v->model.tp > 1 ? v->model.tp : 1; }

static int save_local(const char *dir, const loco_config *cfg, const loco_ckpt_view *v,
                      const loco_ckpt_state *st);

int loco_ckpt_save_view(const char *dir, const loco_config *cfg, const loco_ckpt_view *v,
                        const loco_ckpt_state *st) {
    if (!loco_store_is_url(dir))
        return save_local(dir, cfg, v, st);
    /* A URL: written locally as always, then uploaded (ckpt_url.c). */
    char stage[PATH_MAX];
    LOCO_CHECK(loco_ckpt_stage_dir(cfg, st->step, stage, sizeof stage));
    int rc = save_local(stage, cfg, v, st);
    if (rc == 0)
        rc = loco_ckpt_upload(stage, dir, cfg, st->step);
    loco_rmtree(stage);
    rmdir(dirname(stage)); /* ckpt_stage, unless another save uses it */
    return rc;
}

static int save_local(const char *dir, const loco_config *cfg, const loco_ckpt_view *v,
                      const loco_ckpt_state *st) {
    const size_t P = v->tt->numel;
    if (loco__ckpt_view_tp(v) > 1)
        return LOCO_ERR(LOCO_EINVAL,
                        "single-file checkpoints hold the whole model: a tp = %d slice needs the "
                        "sharded layout",
                        loco__ckpt_view_tp(v));
    if (v->stage)
        return LOCO_ERR(LOCO_EINVAL, "single-file checkpoints hold the whole model: a pipeline "
                                     "stage needs the sharded layout");
    if (v->p_lo != 0 || v->p_hi != P || (v->m && (v->o_lo != 0 || v->o_hi != P)))
        return LOCO_ERR(LOCO_EINVAL, "single-file checkpoints need every parameter");
    char tmp[PATH_MAX], path[PATH_MAX + 64];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", dir) >= (int)sizeof tmp)
        return LOCO_ERR(LOCO_EINVAL, "checkpoint path too long: %s", dir);
    int rc = 0;
    cJSON *j = NULL;
    float *mv = NULL;
    loco_ttable both = {0};
    LOCO_CHECK(loco_rmtree(tmp));
    LOCO_CHECK(loco_mkdirs(tmp));

    const loco_gpt_config *c = &v->model;
    char nl[16], nh[16], ne[16], nv[16], np[16];
    snprintf(nl, sizeof nl, "%d", c->n_layer);
    snprintf(nh, sizeof nh, "%d", c->n_head);
    snprintf(ne, sizeof ne, "%d", c->n_embd);
    snprintf(nv, sizeof nv, "%d", c->vocab_size);
    snprintf(np, sizeof np, "%d", c->seq_len);
    const char *meta[] = {"n_layer", nl, "n_head", nh, "n_embd", ne, "vocab_size", nv,
                          "n_positions", np, "producer", "loco", NULL};
    snprintf(path, sizeof path, "%s/" MODEL_FILE, tmp);
    LOCO_CHECK_GOTO(loco_st_write(path, v->tt, v->params, NULL, meta), out);
    uint64_t h_model, h_optim = 0;
    LOCO_CHECK_GOTO(file_hash(path, &h_model), out);
    if (v->m) {
        snprintf(path, sizeof path, "%s/" OPTIM_FILE, tmp);
        LOCO_CHECK_GOTO(moments_table(&both, v->tt), out);
        mv = loco_alloc(2 * P * sizeof(float));
        if (!mv) {
            rc = LOCO_ERR(LOCO_ENOMEM, "optimizer checkpoint buffer");
            goto out;
        }
        memcpy(mv, v->m, P * sizeof(float));
        memcpy(mv + P, v->v, P * sizeof(float));
        LOCO_CHECK_GOTO(loco_st_write(path, &both, mv, NULL, NULL), out);
        LOCO_CHECK_GOTO(file_hash(path, &h_optim), out);
    }
    LOCO_CHECK_GOTO(write_configs(tmp, cfg, c), out);
    j = state_json(st, v->m ? v->adam_t : 0);
    cJSON *files = cJSON_AddObjectToObject(j, "xxh3");
    hex_item(files, MODEL_FILE, h_model);
    if (v->m)
        hex_item(files, OPTIM_FILE, h_optim);
    LOCO_CHECK_GOTO(write_state(tmp, j), out);
    LOCO_CHECK_GOTO(loco_dir_commit(tmp, dir), out);
out:
    loco_ttable_fini(&both);
    loco_free(mv);
    cJSON_Delete(j);
    if (rc < 0)
        loco_rmtree(tmp);
    return rc;
}

static loco_ckpt_view model_view(const loco_gpt *m, const loco_adamw *opt) {
    loco_ckpt_view v = {
        .tt = &m->tt, .model = m->cfg, .params = m->params, .p_lo = 0, .p_hi = m->n_params,
        .m = opt ? opt->m : NULL, .v = opt ? opt->v : NULL, .o_lo = 0,
        .o_hi = opt ? m->n_params : 0, .adam_t = opt ? opt->t : 0, .tp_rank = m->tp_rank,
        /* Its pp rank is not known here: loaded by tensor name. */
        .stage = m->staged ? &m->stage : NULL, .pp_rank = -1};
    return v;
}

int loco_ckpt_save(const char *dir, const loco_config *cfg, const loco_gpt *m,
                   const loco_adamw *opt, const loco_ckpt_state *st) {
    loco_ckpt_view v = model_view(m, opt);
    return loco_ckpt_save_view(dir, cfg, &v, st);
}

int loco_ckpt_write_shard(const char *tmpdir, int index, const loco_ckpt_view *v, size_t lo,
                          size_t hi, uint64_t *hash) {
    if (lo < v->p_lo || hi > v->p_hi || (v->m && (lo < v->o_lo || hi > v->o_hi)))
        return LOCO_ERR(LOCO_EINVAL, "shard [%zu, %zu) is not held by this rank", lo, hi);
    const size_t n = hi - lo;
    loco_ttable tt;
    loco_ttable_init(&tt);
    int rc = 0;
    float *buf = loco_alloc((n ? 3 * n : 1) * sizeof(float));
    if (!buf) {
        rc = LOCO_ERR(LOCO_ENOMEM, "shard buffer of %zu elements", 3 * n);
        goto out;
    }
    /* Zero-length shards (more ranks than parameters) carry one padding
     * element so every tensor has a shape; lo == hi says it is empty. */
    int64_t len = n ? (int64_t)n : 1;
    LOCO_CHECK_GOTO(loco_ttable_add(&tt, "params", 1, &len, -1, false), out);
    LOCO_CHECK_GOTO(loco_ttable_add(&tt, "exp_avg", 1, &len, -1, false), out);
    LOCO_CHECK_GOTO(loco_ttable_add(&tt, "exp_avg_sq", 1, &len, -1, false), out);
    memset(buf, 0, 3 * (size_t)len * sizeof(float));
    memcpy(buf, v->params + (lo - v->p_lo), n * sizeof(float));
    if (v->m) {
        memcpy(buf + len, v->m + (lo - v->o_lo), n * sizeof(float));
        memcpy(buf + 2 * len, v->v + (lo - v->o_lo), n * sizeof(float));
    }
    char slo[24], shi[24], stp[16], srank[16], spp[16], path[PATH_MAX + 64];
    snprintf(slo, sizeof slo, "%zu", lo);
    snprintf(shi, sizeof shi, "%zu", hi);
    snprintf(stp, sizeof stp, "%d", loco__ckpt_view_tp(v));
    snprintf(srank, sizeof srank, "%d", v->tp_rank);
    snprintf(spp, sizeof spp, "%d", v->pp_rank);
    /* tp = 1 shards are written as before tensor parallelism, and shards
     * of the whole model as before pipeline parallelism. */
    const char *meta[11] = {"lo", slo, "hi", shi}, **at = meta + 4;
    if (loco__ckpt_view_tp(v) > 1)
        *at++ = "tp", *at++ = stp, *at++ = "tp_rank", *at++ = srank;
    if (v->stage)
        *at++ = "pp_rank", *at++ = spp;
    *at = NULL;
    snprintf(path, sizeof path, "%s/shard_%05d.safetensors", tmpdir, index);
    LOCO_CHECK_GOTO(loco_st_write(path, &tt, buf, NULL, meta), out);
    LOCO_CHECK_GOTO(file_hash(path, hash), out);
out:
    loco_free(buf);
    loco_ttable_fini(&tt);
    return rc;
}

/* Refuses a shard list the loader would refuse: ranks outside [0, t) or
 * [0, pp), a (pp rank, tp rank) without shards, one whose shards do not
 * tile [0, P[pp rank]) in order. */
static int check_shard_list(int t, int pp, const size_t *P, int n, const size_t *los,
                            const size_t *his, const int *tp_ranks, const int *pp_ranks) {
    if (n < 1)
        return LOCO_ERR(LOCO_EINVAL, "a sharded checkpoint needs at least one shard");
    for (int i = 0; i < n; i++) {
        const int r = tp_ranks ? tp_ranks[i] : 0, q = pp_ranks ? pp_ranks[i] : 0;
        if (r < 0 || r >= t || q < 0 || q >= pp)
            return LOCO_ERR(LOCO_EINVAL, "shard %d names tp rank %d of %d, pp rank %d of %d", i,
                            r, t, q, pp);
    }
    for (int q = 0; q < pp; q++)
        for (int k = 0; k < t; k++) {
            size_t expect = 0;
            bool any = false;
            for (int i = 0; i < n; i++) {
                if ((tp_ranks ? tp_ranks[i] : 0) != k || (pp_ranks ? pp_ranks[i] : 0) != q)
                    continue;
                if (los[i] != expect || his[i] < los[i] || his[i] > P[q])
                    return LOCO_ERR(LOCO_EINVAL,
                                    "shard %d covers [%zu, %zu) of pp rank %d, tp rank %d's "
                                    "slice, expected it to start at %zu (of %zu)",
                                    i, los[i], his[i], q, k, expect, P[q]);
                expect = his[i], any = true;
            }
            if (!any)
                return LOCO_ERR(LOCO_EINVAL, "pp rank %d of %d, tp rank %d of %d has no shards",
                                q, pp, k, t);
            if (expect != P[q])
                return LOCO_ERR(LOCO_EINVAL,
                                "the shards of pp rank %d, tp rank %d end at %zu of %zu", q, k,
                                expect, P[q]);
        }
    return 0;
}

/* The stages' parameters per pp rank (pp = 1: the view's table's), after
 * checking that the stages tile the blocks; *P is loco_free'd by the
 * caller. */
static int manifest_stage_params(const loco_ckpt_view *v, const loco_gpt_stage *stages, int pp,
                                 size_t **P) {
    *P = loco_alloc((size_t)pp * sizeof **P);
    if (!*P)
        return LOCO_ERR(LOCO_ENOMEM, "table of %d pipeline stages", pp);
    if (pp == 1) {
        LOCO_CHECK(loco__ckpt_stage_params(&v->model, NULL, 1, *P));
        if ((*P)[0] != v->tt->numel)
            return LOCO_ERR(LOCO_EINVAL, "the view holds %zu parameters, not the whole model's "
                                         "%zu: a pipeline stage needs pp > 1 stages",
                            v->tt->numel, (*P)[0]);
        return 0;
    }
    char why[160];
    if (!stages || !loco__ckpt_stages_tile(stages, pp, v->model.n_layer, why, sizeof why))
        return LOCO_ERR(LOCO_EINVAL, "pipeline stages that do not tile the model's blocks (%s)",
                        stages ? why : "none given");
    LOCO_CHECK(loco__ckpt_stage_params(&v->model, stages, pp, *P));
    if (v->stage && (v->pp_rank < 0 || v->pp_rank >= pp || (*P)[v->pp_rank] != v->tt->numel))
        return LOCO_ERR(LOCO_EINVAL, "the view is not pp rank %d's stage of the %d given",
                        v->pp_rank, pp);
    return 0;
}

int loco_ckpt_write_manifest(const char *tmpdir, const char *dir, const loco_config *cfg,
                             const loco_ckpt_view *v, int n_shards, const size_t *los,
                             const size_t *his, const uint64_t *hashes, const int *tp_ranks,
                             const loco_ckpt_state *st) {
    return loco_ckpt_write_manifest_pp(tmpdir, dir, cfg, v, n_shards, los, his, hashes, tp_ranks,
                                       NULL, NULL, 1, st);
}

int loco_ckpt_write_manifest_pp(const char *tmpdir, const char *dir, const loco_config *cfg,
                                const loco_ckpt_view *v, int n_shards, const size_t *los,
                                const size_t *his, const uint64_t *hashes, const int *tp_ranks,
                                const int *pp_ranks, const loco_gpt_stage *stages, int pp,
                                const loco_ckpt_state *st) {
    const int t = loco__ckpt_view_tp(v);
    if (pp < 1)
        return LOCO_ERR(LOCO_EINVAL, "pp = %d", pp);
    size_t *P;
    int rc = manifest_stage_params(v, stages, pp, &P);
    cJSON *j = NULL;
    LOCO_CHECK_GOTO(rc, out);
    LOCO_CHECK_GOTO(check_shard_list(t, pp, P, n_shards, los, his, tp_ranks, pp_ranks), out);
    LOCO_CHECK_GOTO(write_configs(tmpdir, cfg, &v->model), out);
    j = state_json(st, v->adam_t);
    if (pp == 1) {
        cJSON_AddNumberToObject(j, "n_params", (double)P[0]);
    } else {
        cJSON *np = cJSON_AddArrayToObject(j, "n_params");
        for (int q = 0; q < pp; q++)
            cJSON_AddItemToArray(np, cJSON_CreateNumber((double)P[q]));
    }
    if (t > 1)
        cJSON_AddNumberToObject(j, "tp", t);
    if (pp > 1) {
        cJSON_AddNumberToObject(j, "pp", pp);
        cJSON *sa = cJSON_AddArrayToObject(j, "stages");
        for (int q = 0; q < pp; q++) {
            cJSON *chunks = cJSON_CreateArray();
            for (int c = 0; c < stages[q].n; c++) {
                const int fe[2] = {stages[q].first[c], stages[q].end[c]};
                cJSON_AddItemToArray(chunks, cJSON_CreateIntArray(fe, 2));
            }
            cJSON_AddItemToArray(sa, chunks);
        }
    }
    cJSON *arr = cJSON_AddArrayToObject(j, "shards");
    for (int i = 0; i < n_shards; i++) {
        cJSON *e = cJSON_CreateObject();
        char name[64];
        snprintf(name, sizeof name, "shard_%05d.safetensors", i);
        cJSON_AddStringToObject(e, "file", name);
        if (pp > 1)
            cJSON_AddNumberToObject(e, "pp_rank", pp_ranks ? pp_ranks[i] : 0);
        if (t > 1)
            cJSON_AddNumberToObject(e, "tp_rank", tp_ranks ? tp_ranks[i] : 0);
        cJSON_AddNumberToObject(e, "lo", (double)los[i]);
        cJSON_AddNumberToObject(e, "hi", (double)his[i]);
        hex_item(e, "xxh3", hashes[i]);
        cJSON_AddItemToArray(arr, e);
    }
    LOCO_CHECK_GOTO(write_state(tmpdir, j), out);
    rc = loco_dir_commit(tmpdir, dir);
out:
    cJSON_Delete(j);
    loco_free(P);
    return rc;
}

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
    int rc = file_hash(path, &got);
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
        LOCO_CHECK_GOTO(moments_table(&both, tt), out);
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
    size_t *P = loco_alloc((size_t)pp * sizeof *P);
    if (!P)
        return LOCO_ERR(LOCO_ENOMEM, "table of %d pipeline stages", pp);
    const int q = pp > 1 ? v->pp_rank : 0;
    int rc = 0;
    if (pp > 1) {
        loco_gpt_config mc = v->model;
        mc.tp = tp;
        LOCO_CHECK_GOTO(loco__ckpt_stage_params(&mc, stages, pp, P), out);
    } else {
        P[0] = v->tt->numel;
    }
    LOCO_CHECK_GOTO(loco__ckpt_parse_manifest(&mf, dir, j, tp, pp, P), out);
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

static int load_view(const char *dir, const loco_config *cfg, loco_ckpt_view *v,
                     loco_ckpt_state *st) {
    char path[PATH_MAX + 64];
    void *text = NULL;
    size_t len;
    int rc = 0, pp = 1;
    cJSON *j = NULL;
    loco_gpt_stage *stages = NULL;

    snprintf(path, sizeof path, "%s/" STATE_FILE, dir);
    rc = loco_file_read(path, &text, &len);
    if (rc < 0) {
        rc = LOCO_ERR(LOCO_EPROTO, "%s is not a complete checkpoint (no readable %s)", dir,
                      STATE_FILE);
        goto out;
    }
    j = cJSON_ParseWithLength(text, len);
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(j, "format");
    if (!cJSON_IsObject(j) || !cJSON_IsString(fmt) || strcmp(fmt->valuestring, CKPT_FORMAT)) {
        rc = LOCO_ERR(LOCO_EPROTO, "checkpoint %s: %s is not a loco checkpoint state", dir,
                      STATE_FILE);
        goto out;
    }
    int64_t version, step, adam_t, shard, pos, epoch;
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(j, "data");
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(j, "rng");
    const cJSON *sums = cJSON_GetObjectItemCaseSensitive(j, "xxh3");
    const cJSON *shards = cJSON_GetObjectItemCaseSensitive(j, "shards");
    uint64_t model_hash, rng[4];
    if (loco__ckpt_get_int(j, "version", &version) || loco__ckpt_get_int(j, "step", &step) ||
        loco__ckpt_get_int(j, "adam_t", &adam_t) || loco__ckpt_get_int(d, "shard", &shard) ||
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
    if (model_hash != loco_config_hash(cfg, model_sections)) {
        rc = LOCO_ERR(LOCO_EINVAL,
                      "checkpoint %s was written for another [model] section than the config's "
                      "(see %s/config.ini)",
                      dir, dir);
        goto out;
    }
    /* The checkpoint's tensor-parallel degree (absent: 1) against the view's. */
    int64_t tp = 1;
    const int tv = loco__ckpt_view_tp(v);
    if (cJSON_HasObjectItem(j, "tp") &&
        (loco__ckpt_get_int(j, "tp", &tp) || tp < 1 || tp > 1 << 20)) {
        rc = LOCO_ERR(LOCO_EPROTO, "checkpoint %s: %s has a bad tp", dir, STATE_FILE);
        goto out;
    }
    if (!cJSON_IsArray(shards) && tp != 1) {
        rc = LOCO_ERR(LOCO_EPROTO,
                      "checkpoint %s: a single-file checkpoint holds the whole model, not a tp = "
                      "%lld slice",
                      dir, (long long)tp);
        goto out;
    }
    if (v->model.n_head % tp || 4 * (int64_t)v->model.n_embd % tp) {
        rc = LOCO_ERR(LOCO_EPROTO,
                      "checkpoint %s: its tp = %lld does not divide the model's n_head (%d) or "
                      "4 x n_embd (%lld)",
                      dir, (long long)tp, v->model.n_head, 4 * (long long)v->model.n_embd);
        goto out;
    }
    if (v->tp_rank < 0 || v->tp_rank >= tv) {
        rc = LOCO_ERR(LOCO_EINVAL, "tp rank %d of a view of tp = %d", v->tp_rank, tv);
        goto out;
    }
    /* The checkpoint's pipeline stages (absent: the whole model). */
    LOCO_CHECK_GOTO(loco__ckpt_parse_stages(dir, j, v->model.n_layer, &pp, &stages), out);
    if (pp > 1 && !cJSON_IsArray(shards)) {
        rc = LOCO_ERR(LOCO_EPROTO,
                      "checkpoint %s: a single-file checkpoint holds the whole model, not pp = %d "
                      "stages",
                      dir, pp);
        goto out;
    }
    /* Same layout: the view's own shards; any other: by tensor name. */
    const bool same_pp = pp == 1 ? !v->stage
                                 : v->stage && v->pp_rank >= 0 && v->pp_rank < pp &&
                                       loco__ckpt_same_stage(v->stage, &stages[v->pp_rank]);
    if (tp != tv || !same_pp)
        LOCO_CHECK_GOTO(loco__ckpt_load_resharded(dir, j, (int)tp, pp, stages, v), out);
    else if (cJSON_IsArray(shards))
        LOCO_CHECK_GOTO(load_sharded(dir, j, (int)tp, pp, stages, v), out);
    else
        LOCO_CHECK_GOTO(load_single(dir, sums, v), out);
    v->adam_t = adam_t;
    if (st) {
        st->step = step;
        st->data = (loco_data_pos){.shard = shard, .pos = pos, .epoch = epoch};
        memcpy(st->rng.s, rng, sizeof rng);
        st->model_hash = model_hash;
    }
out:
    loco_free(stages);
    cJSON_Delete(j);
    loco_free(text);
    return rc;
}

int loco_ckpt_load(const char *dir, const loco_config *cfg, loco_gpt *m, loco_adamw *opt,
                   loco_ckpt_state *st) {
    loco_ckpt_view v = model_view(m, opt);
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
    snprintf(path, sizeof path, "%s/" MODEL_FILE, out);
    const char *meta[] = {"producer", "loco ckpt export", NULL};
    LOCO_CHECK_GOTO(loco_st_write(path, &tt, params, NULL, meta), out);
    snprintf(path, sizeof path, "%s/config.json", out);
    LOCO_CHECK_GOTO(write_hf_config(path, &mc), out);
out:
    loco_free(params);
    loco_ttable_fini(&tt);
    return rc;
}
