/* Checkpoints: a directory that Hugging Face loads (model.safetensors and
 * config.json) plus what loco needs to continue bit for bit (optimizer
 * state, step, data position, RNG), written atomically and verified by
 * checksums before anything is loaded. */
#include "inner/inner.h"

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
static int view_tp(const loco_ckpt_view *v) { return v->model.tp > 1 ? v->model.tp : 1; }

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
    if (view_tp(v) > 1)
        return LOCO_ERR(LOCO_EINVAL,
                        "single-file checkpoints hold the whole model: a tp = %d slice needs the "
                        "sharded layout",
                        view_tp(v));
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
        .o_hi = opt ? m->n_params : 0, .adam_t = opt ? opt->t : 0};
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
    char slo[24], shi[24], stp[16], srank[16], path[PATH_MAX + 64];
    snprintf(slo, sizeof slo, "%zu", lo);
    snprintf(shi, sizeof shi, "%zu", hi);
    snprintf(stp, sizeof stp, "%d", view_tp(v));
    snprintf(srank, sizeof srank, "%d", v->tp_rank);
    /* tp = 1 shards are written as before tensor parallelism. */
    const char *meta[] = {"lo", slo, "hi", shi, "tp", stp, "tp_rank", srank, NULL};
    if (view_tp(v) == 1)
        meta[4] = NULL;
    snprintf(path, sizeof path, "%s/shard_%05d.safetensors", tmpdir, index);
    LOCO_CHECK_GOTO(loco_st_write(path, &tt, buf, NULL, meta), out);
    LOCO_CHECK_GOTO(file_hash(path, hash), out);
out:
    loco_free(buf);
    loco_ttable_fini(&tt);
    return rc;
}

/* Refuses a shard list the loader would refuse: ranks outside [0, t), a
 * rank without shards, a rank whose shards do not tile [0, P) in order. */
static int check_shard_list(int t, size_t P, int n, const size_t *los, const size_t *his,
                            const int *tp_ranks) {
    if (n < 1)
        return LOCO_ERR(LOCO_EINVAL, "a sharded checkpoint needs at least one shard");
    for (int k = 0; k < t; k++) {
        size_t expect = 0;
        bool any = false;
        for (int i = 0; i < n; i++) {
            const int r = tp_ranks ? tp_ranks[i] : 0;
            if (r < 0 || r >= t)
                return LOCO_ERR(LOCO_EINVAL, "shard %d names tp rank %d of %d", i, r, t);
            if (r != k)
                continue;
            if (los[i] != expect || his[i] < los[i] || his[i] > P)
                return LOCO_ERR(LOCO_EINVAL,
                                "shard %d covers [%zu, %zu) of tp rank %d's slice, expected it "
                                "to start at %zu (of %zu)",
                                i, los[i], his[i], k, expect, P);
            expect = his[i], any = true;
        }
        if (!any)
            return LOCO_ERR(LOCO_EINVAL, "tp rank %d of %d has no shards", k, t);
        if (expect != P)
            return LOCO_ERR(LOCO_EINVAL, "the shards of tp rank %d end at %zu of %zu", k, expect,
                            P);
    }
    return 0;
}

int loco_ckpt_write_manifest(const char *tmpdir, const char *dir, const loco_config *cfg,
                             const loco_ckpt_view *v, int n_shards, const size_t *los,
                             const size_t *his, const uint64_t *hashes, const int *tp_ranks,
                             const loco_ckpt_state *st) {
    const int t = view_tp(v);
    LOCO_CHECK(check_shard_list(t, v->tt->numel, n_shards, los, his, tp_ranks));
    LOCO_CHECK(write_configs(tmpdir, cfg, &v->model));
    cJSON *j = state_json(st, v->adam_t);
    cJSON_AddNumberToObject(j, "n_params", (double)v->tt->numel);
    if (t > 1)
        cJSON_AddNumberToObject(j, "tp", t);
    cJSON *arr = cJSON_AddArrayToObject(j, "shards");
    for (int i = 0; i < n_shards; i++) {
        cJSON *e = cJSON_CreateObject();
        char name[64];
        snprintf(name, sizeof name, "shard_%05d.safetensors", i);
        cJSON_AddStringToObject(e, "file", name);
        if (t > 1)
            cJSON_AddNumberToObject(e, "tp_rank", tp_ranks ? tp_ranks[i] : 0);
        cJSON_AddNumberToObject(e, "lo", (double)los[i]);
        cJSON_AddNumberToObject(e, "hi", (double)his[i]);
        hex_item(e, "xxh3", hashes[i]);
        cJSON_AddItemToArray(arr, e);
    }
    int rc = write_state(tmpdir, j);
    cJSON_Delete(j);
    LOCO_CHECK(rc);
    return loco_dir_commit(tmpdir, dir);
}

static int parse_hex(const cJSON *item, uint64_t *out) {
    if (!cJSON_IsString(item) || strlen(item->valuestring) != 16)
        return -1;
    char *end;
    *out = strtoull(item->valuestring, &end, 16);
    return *end ? -1 : 0;
}

static int get_int(const cJSON *obj, const char *key, int64_t *out) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble > 9e15)
        return -1;
    *out = (int64_t)x->valuedouble;
    return 0;
}

/* Reads a file and checks its XXH3 against the expected value; `what`
 * names it in messages (NULL: its name). */
static int verify_hash(const char *dir, const char *name, const char *what, uint64_t want) {
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
    if (parse_hex(cJSON_GetObjectItemCaseSensitive(sums, name), &want) < 0)
        return LOCO_ERR(LOCO_EPROTO, "checkpoint %s: state.json has no checksum for %s", dir,
                        name);
    return verify_hash(dir, name, NULL, want);
}

/* Copies the part of src's flat range [a, b) that falls in [lo, hi) to dst
 * (which holds [lo, hi)). */
static void copy_overlap(float *dst, size_t lo, size_t hi, const float *src, size_t a, size_t b) {
    size_t x = a > lo ? a : lo, y = b < hi ? b : hi;
    if (x < y)
        memcpy(dst + (x - lo), src + (x - a), (y - x) * sizeof(float));
}

static bool overlaps(size_t a, size_t b, size_t lo, size_t hi) { return a < hi && lo < b; }

/* ------------------------------------------------- single layout, loading */

/* The single layout's files, verified and opened, and its tensors in the
 * order of a whole-model table: x[3 i + a] for a = 0 (parameters), 1
 * (exp_avg), 2 (exp_avg_sq; the moments only when asked for). */
typedef struct {
    loco_st *model, *optim;
    const float **x;
} single_src;

static void close_single(single_src *s) {
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
static int open_single(single_src *s, const char *dir, const cJSON *sums, const loco_ttable *tt,
                       bool moments) {
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
        close_single(s);
    return rc;
}

/* Single layout into a whole-model view: everything checked, then the
 * overlaps copied tensor by tensor. */
static int load_single(const char *dir, const cJSON *sums, loco_ckpt_view *v) {
    single_src s;
    LOCO_CHECK(open_single(&s, dir, sums, v->tt, v->m != NULL));
    for (int i = 0; i < v->tt->n; i++) {
        const loco_tensor *t = &v->tt->t[i];
        const size_t a = t->offset, b = t->offset + t->numel;
        copy_overlap(v->params, v->p_lo, v->p_hi, s.x[3 * i], a, b);
        if (v->m) {
            copy_overlap(v->m, v->o_lo, v->o_hi, s.x[3 * i + 1], a, b);
            copy_overlap(v->v, v->o_lo, v->o_hi, s.x[3 * i + 2], a, b);
        }
    }
    close_single(&s);
    return 0;
}

/* ------------------------------------------------ sharded layout, loading */

/* One shard as state.json lists it. */
typedef struct {
    const char *file;  /* inside the parsed state.json */
    size_t lo, hi;     /* flat range of its tp rank's slice */
    uint64_t xxh3;
    int rank;          /* tp rank of the slice */
    bool need;         /* the view needs some of it */
    loco_st *st;       /* once verified */
    const float *x[3]; /* params, exp_avg, exp_avg_sq from lo */
} shard_ref;

/* state.json's shard list, checked: the shards of every tp rank tile its
 * slice [0, P) in order. */
typedef struct {
    const char *dir;
    int tp, n;
    size_t P;
    shard_ref *s; /* (n) in state.json's order */
    int *order;   /* (n) indices into s grouped by tp rank, each group in order */
    int *first;   /* (tp + 1) rank k's group is order[first[k] .. first[k + 1]) */
} manifest;

static void manifest_fini(manifest *mf) {
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

static int parse_manifest(manifest *mf, const char *dir, const cJSON *j, int tp, size_t P) {
    memset(mf, 0, sizeof *mf);
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(j, "shards");
    const int n = cJSON_GetArraySize(arr);
    int64_t np;
    char who[64];
    if (get_int(j, "n_params", &np) || n < 1 || n > 1 << 20)
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
        manifest_fini(mf);
        return LOCO_ERR(LOCO_ENOMEM, "table of %d checkpoint shards", n);
    }
    memset(mf->s, 0, (size_t)n * sizeof *mf->s);
    memset(mf->first, 0, ((size_t)tp + 1) * sizeof *mf->first);
    for (int i = 0; i < n; i++) {
        const cJSON *e = cJSON_GetArrayItem(arr, i);
        const cJSON *file = cJSON_GetObjectItemCaseSensitive(e, "file");
        int64_t lo, hi, rank = 0;
        uint64_t h;
        if (!cJSON_IsString(file) || strchr(file->valuestring, '/') || get_int(e, "lo", &lo) ||
            get_int(e, "hi", &hi) || hi < lo ||
            parse_hex(cJSON_GetObjectItemCaseSensitive(e, "xxh3"), &h) ||
            (cJSON_HasObjectItem(e, "tp_rank") && get_int(e, "tp_rank", &rank))) {
            manifest_fini(mf);
            return LOCO_ERR(LOCO_EPROTO, "checkpoint %s: shard %d of state.json is malformed",
                            dir, i);
        }
        if (rank >= tp) {
            manifest_fini(mf);
            return LOCO_ERR(LOCO_EPROTO,
                            "checkpoint %s: shard %d of state.json belongs to tp rank %lld, the "
                            "checkpoint has tp = %d",
                            dir, i, (long long)rank, tp);
        }
        mf->s[i] = (shard_ref){.file = file->valuestring, .lo = (size_t)lo, .hi = (size_t)hi,
                               .xxh3 = h, .rank = (int)rank};
        mf->first[rank + 1]++;
    }
    for (int k = 0; k < tp; k++)
        mf->first[k + 1] += mf->first[k];
    for (int k = 0, at = 0; k < tp; k++) {
        if (mf->first[k] == mf->first[k + 1]) {
            manifest_fini(mf);
            return LOCO_ERR(LOCO_EPROTO,
                            "checkpoint %s: tp rank %d of %d has no shards (its slice is missing)",
                            dir, k, tp);
        }
        size_t expect = 0;
        for (int i = 0; i < n; i++) {
            const shard_ref *s = &mf->s[i];
            if (s->rank != k)
                continue;
            if (s->lo != expect || s->hi > P) {
                manifest_fini(mf);
                return LOCO_ERR(LOCO_EPROTO,
                                "checkpoint %s: %s do not tile their %zu parameters (shard %d "
                                "covers [%zu, %zu), expected it to start at %zu)",
                                dir, whose(who, sizeof who, k, tp), P, i, s->lo, s->hi, expect);
            }
            expect = s->hi;
            mf->order[at++] = i;
        }
        if (expect != P) {
            manifest_fini(mf);
            return LOCO_ERR(LOCO_EPROTO, "checkpoint %s: %s end at %zu of %zu parameters", dir,
                            whose(who, sizeof who, k, tp), expect, P);
        }
    }
    return 0;
}

/* The shard of tp rank k that holds element x of its slice (x < P). */
static shard_ref *shard_at(const manifest *mf, int k, size_t x) {
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
static int open_shards(manifest *mf) {
    static const char *const names[3] = {"params", "exp_avg", "exp_avg_sq"};
    for (int i = 0; i < mf->n; i++) {
        shard_ref *s = &mf->s[i];
        if (!s->need)
            continue;
        char what[PATH_MAX + 64], path[PATH_MAX + 64];
        if (mf->tp > 1)
            snprintf(what, sizeof what, "%s (of tp rank %d of %d)", s->file, s->rank, mf->tp);
        else
            snprintf(what, sizeof what, "%s", s->file);
        LOCO_CHECK(verify_hash(mf->dir, s->file, what, s->xxh3));
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

/* The checkpoint's tp equals the view's: the view's rank's shards, by
 * range overlap. */
static int load_sharded(const char *dir, const cJSON *j, int tp, loco_ckpt_view *v) {
    manifest mf;
    LOCO_CHECK(parse_manifest(&mf, dir, j, tp, v->tt->numel));
    for (int i = 0; i < mf.n; i++) {
        shard_ref *s = &mf.s[i];
        s->need = s->rank == v->tp_rank && (overlaps(s->lo, s->hi, v->p_lo, v->p_hi) ||
                                            (v->m && overlaps(s->lo, s->hi, v->o_lo, v->o_hi)));
    }
    int rc = open_shards(&mf);
    for (int i = 0; rc == 0 && i < mf.n; i++) {
        const shard_ref *s = &mf.s[i];
        if (!s->need)
            continue;
        copy_overlap(v->params, v->p_lo, v->p_hi, s->x[0], s->lo, s->hi);
        if (v->m) {
            copy_overlap(v->m, v->o_lo, v->o_hi, s->x[1], s->lo, s->hi);
            copy_overlap(v->v, v->o_lo, v->o_hi, s->x[2], s->lo, s->hi);
        }
    }
    manifest_fini(&mf);
    return rc;
}

/* ------------------------------------------------- resharding across tp */

/* Another tp than the view's: every element of the view's ranges is
 * followed to its whole-tensor index (loco_gpt_tp_global) and from there to
 * the source tp rank and slice index that hold it (loco_gpt_tp_locate);
 * replicated tensors come from source rank 0, vocabulary padding is zero.
 * Tensor parallelism moves indices of one dimension only (the split
 * dimension: Megatron 1-D), so a tensor's maps are built over that
 * dimension and copies run over the contiguous elements after it. */
typedef struct {
    loco_ttable whole, src, dst; /* tp = 1, the checkpoint's tp, the view's tp */
    int t_src, t_dst, rank;      /* rank: the view's tp rank */
    bool sharded;
    manifest mf;                 /* the sharded source */
    single_src single;           /* the single-file source (t_src = 1) */
    int64_t *dmap; /* view split index -> whole split index, -1 for padding */
    int *srank;    /* whole split index -> source tp rank */
    size_t *sidx;  /* whole split index -> split index in that rank's slice */
} reshard;

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

/* Tensor i's maps over its split dimension. */
static void tensor_maps(reshard *R, int i) {
    const loco_tensor *gt = &R->whole.t[i];
    if (gt->split_dim < 0) {
        R->dmap[0] = 0, R->srank[0] = 0, R->sidx[0] = 0;
        return;
    }
    const size_t inner = split_inner(gt), nl = split_len(&R->dst.t[i]), n = split_len(gt);
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

/* The view's elements [lo, hi) of tensor i (the tensor's maps built):
 * copy = false marks the source shards they need, copy = true copies them
 * into dst[0 .. na) (which hold the view's range from `base`) from source
 * arrays a .. a + na - 1 (0 params, 1 exp_avg, 2 exp_avg_sq). */
static void walk(reshard *R, int i, size_t lo, size_t hi, size_t base, float *const *dst, int a,
                 int na, bool copy) {
    const loco_tensor *vt = &R->dst.t[i], *stt = &R->src.t[i];
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
            shard_ref *s = shard_at(&R->mf, k, fx);
            len = len < s->hi - fx ? len : s->hi - fx;
            s->need = true;
            for (int b = 0; copy && b < na; b++)
                src[b] = s->x[a + b] + (fx - s->lo);
        } else {
            for (int b = 0; copy && b < na; b++)
                src[b] = R->single.x[3 * i + a + b] + js;
        }
        for (int b = 0; copy && b < na; b++)
            memcpy(dst[b] + (x - base), src[b], len * sizeof(float));
        x += len;
    }
}

/* Every tensor of the view, first marking (copy = false), then copying. */
static void walk_view(reshard *R, loco_ckpt_view *v, bool copy) {
    float *p[1] = {v->params}, *mv[2] = {v->m, v->v};
    for (int i = 0; i < R->dst.n; i++) {
        const loco_tensor *t = &R->dst.t[i];
        const size_t a = t->offset, b = t->offset + t->numel;
        const bool need_p = overlaps(a, b, v->p_lo, v->p_hi);
        const bool need_o = v->m && overlaps(a, b, v->o_lo, v->o_hi);
        if (!need_p && !need_o)
            continue;
        tensor_maps(R, i);
        if (need_p)
            walk(R, i, v->p_lo, v->p_hi, v->p_lo, p, 0, 1, copy);
        if (need_o)
            walk(R, i, v->o_lo, v->o_hi, v->o_lo, mv, 1, 2, copy);
    }
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

static int load_resharded(const char *dir, const cJSON *j, int t_src, loco_ckpt_view *v) {
    reshard R = {.t_src = t_src, .t_dst = view_tp(v), .rank = v->tp_rank,
                 .sharded = cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(j, "shards"))};
    int rc = 0;
    loco_ttable_init(&R.whole);
    loco_ttable_init(&R.src);
    loco_ttable_init(&R.dst);
    loco_gpt_config mc = v->model;
    mc.tp = 1;
    LOCO_CHECK_GOTO(loco_gpt_build_table(&R.whole, &mc), out);
    mc.tp = t_src;
    LOCO_CHECK_GOTO(loco_gpt_build_table(&R.src, &mc), out);
    mc.tp = R.t_dst;
    LOCO_CHECK_GOTO(loco_gpt_build_table(&R.dst, &mc), out);
    if (!same_table(&R.dst, v->tt)) {
        rc = LOCO_ERR(LOCO_EINVAL,
                      "the view's table is not tp rank %d's slice of its model (tp = %d)", R.rank,
                      R.t_dst);
        goto out;
    }
    size_t cap = 1;
    for (int i = 0; i < R.whole.n; i++) {
        const size_t n = split_len(&R.whole.t[i]), nl = split_len(&R.dst.t[i]);
        cap = n > cap ? n : cap;
        cap = nl > cap ? nl : cap;
    }
    R.dmap = loco_alloc(cap * sizeof *R.dmap);
    R.srank = loco_alloc(cap * sizeof *R.srank);
    R.sidx = loco_alloc(cap * sizeof *R.sidx);
    if (!R.dmap || !R.srank || !R.sidx) {
        rc = LOCO_ERR(LOCO_ENOMEM, "resharding maps of %zu indices", cap);
        goto out;
    }
    /* Everything the view needs is checked before it is touched. */
    if (R.sharded) {
        LOCO_CHECK_GOTO(parse_manifest(&R.mf, dir, j, t_src, R.src.numel), out);
        walk_view(&R, v, false);
        LOCO_CHECK_GOTO(open_shards(&R.mf), out);
    } else {
        const cJSON *sums = cJSON_GetObjectItemCaseSensitive(j, "xxh3");
        LOCO_CHECK_GOTO(open_single(&R.single, dir, sums, &R.whole, v->m != NULL), out);
    }
    walk_view(&R, v, true);
out:
    manifest_fini(&R.mf);
    close_single(&R.single);
    loco_free(R.dmap);
    loco_free(R.srank);
    loco_free(R.sidx);
    loco_ttable_fini(&R.whole);
    loco_ttable_fini(&R.src);
    loco_ttable_fini(&R.dst);
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
    int rc = 0;
    cJSON *j = NULL;

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
    if (get_int(j, "version", &version) || get_int(j, "step", &step) ||
        get_int(j, "adam_t", &adam_t) || get_int(d, "shard", &shard) || get_int(d, "pos", &pos) ||
        get_int(d, "epoch", &epoch) || !cJSON_IsArray(r) || cJSON_GetArraySize(r) != 4 ||
        parse_hex(cJSON_GetObjectItemCaseSensitive(j, "model_hash"), &model_hash) ||
        !(cJSON_IsObject(sums) || cJSON_IsArray(shards))) {
        rc = LOCO_ERR(LOCO_EPROTO, "checkpoint %s: %s lacks or mangles a field", dir, STATE_FILE);
        goto out;
    }
    for (int i = 0; i < 4; i++)
        if (parse_hex(cJSON_GetArrayItem(r, i), &rng[i])) {
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
    const int tv = view_tp(v);
    if (cJSON_HasObjectItem(j, "tp") && (get_int(j, "tp", &tp) || tp < 1 || tp > 1 << 20)) {
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
    if (tp != tv)
        LOCO_CHECK_GOTO(load_resharded(dir, j, (int)tp, v), out);
    else if (cJSON_IsArray(shards))
        LOCO_CHECK_GOTO(load_sharded(dir, j, (int)tp, v), out);
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
    /* The whole model, whatever parallel.tp the run used. */
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
