/* Checkpoints: a directory that Hugging Face loads (model.safetensors and
 * config.json) plus what loco needs to continue bit for bit (optimizer
 * state, step, data position, RNG), written atomically and verified by
 * checksums before anything is loaded. */
#include "inner/inner.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

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

int loco_ckpt_save(const char *dir, const loco_config *cfg, const loco_gpt *m,
                   const loco_adamw *opt, const loco_ckpt_state *st) {
    char tmp[PATH_MAX], path[PATH_MAX + 64];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", dir) >= (int)sizeof tmp)
        return LOCO_ERR(LOCO_EINVAL, "checkpoint path too long: %s", dir);
    int rc = 0;
    char *json = NULL;
    cJSON *j = NULL;
    LOCO_CHECK(loco_rmtree(tmp));
    LOCO_CHECK(loco_mkdirs(tmp));

    char nl[16], nh[16], ne[16], nv[16], np[16];
    snprintf(nl, sizeof nl, "%d", m->cfg.n_layer);
    snprintf(nh, sizeof nh, "%d", m->cfg.n_head);
    snprintf(ne, sizeof ne, "%d", m->cfg.n_embd);
    snprintf(nv, sizeof nv, "%d", m->cfg.vocab_size);
    snprintf(np, sizeof np, "%d", m->cfg.seq_len);
    const char *meta[] = {"n_layer", nl, "n_head", nh, "n_embd", ne, "vocab_size", nv,
                          "n_positions", np, "producer", "loco", NULL};
    snprintf(path, sizeof path, "%s/" MODEL_FILE, tmp);
    LOCO_CHECK_GOTO(loco_st_write(path, &m->tt, m->params, NULL, meta), out);
    uint64_t h_model, h_optim = 0;
    LOCO_CHECK_GOTO(file_hash(path, &h_model), out);
    if (opt) {
        snprintf(path, sizeof path, "%s/" OPTIM_FILE, tmp);
        /* Both moments in one file, prefixed like PyTorch's state names. */
        loco_ttable both;
        loco_ttable_init(&both);
        for (int pass = 0; pass < 2 && rc == 0; pass++)
            for (int i = 0; i < m->tt.n && rc == 0; i++) {
                char n[LOCO_TENSOR_NAME_MAX + 16];
                snprintf(n, sizeof n, "%s%.80s", pass ? "exp_avg_sq." : "exp_avg.",
                         m->tt.t[i].name);
                rc = loco_ttable_add(&both, n, m->tt.t[i].ndim, m->tt.t[i].shape, -1, false);
            }
        float *mv = NULL;
        if (rc == 0) {
            mv = loco_alloc(2 * opt->n * sizeof(float));
            if (!mv)
                rc = LOCO_ERR(LOCO_ENOMEM, "optimizer checkpoint buffer");
        }
        if (rc == 0) {
            memcpy(mv, opt->m, opt->n * sizeof(float));
            memcpy(mv + opt->n, opt->v, opt->n * sizeof(float));
            rc = loco_st_write(path, &both, mv, NULL, NULL);
        }
        loco_free(mv);
        loco_ttable_fini(&both);
        if (rc < 0)
            goto out;
        LOCO_CHECK_GOTO(file_hash(path, &h_optim), out);
    }
    snprintf(path, sizeof path, "%s/config.json", tmp);
    LOCO_CHECK_GOTO(write_hf_config(path, &m->cfg), out);

    snprintf(path, sizeof path, "%s/config.ini", tmp);
    {
        char *ini = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&ini, &len);
        if (!f) {
            rc = LOCO_ERR(LOCO_ENOMEM, "config dump");
            goto out;
        }
        loco_config_dump(cfg, f);
        fclose(f);
        rc = loco_file_write_sync(path, ini, len);
        free(ini);
        if (rc < 0)
            goto out;
    }

    j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "format", CKPT_FORMAT);
    cJSON_AddNumberToObject(j, "version", CKPT_VERSION);
    cJSON_AddNumberToObject(j, "step", (double)st->step);
    cJSON_AddNumberToObject(j, "adam_t", opt ? (double)opt->t : 0);
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
    cJSON *files = cJSON_AddObjectToObject(j, "xxh3");
    hex_item(files, MODEL_FILE, h_model);
    if (opt)
        hex_item(files, OPTIM_FILE, h_optim);
    json = cJSON_Print(j);
    if (!json) {
        rc = LOCO_ERR(LOCO_ENOMEM, "state.json");
        goto out;
    }
    /* state.json is written last: a directory without it is not a checkpoint. */
    snprintf(path, sizeof path, "%s/" STATE_FILE, tmp);
    LOCO_CHECK_GOTO(write_text(path, json), out);
    LOCO_CHECK_GOTO(loco_dir_commit(tmp, dir), out);
out:
    cJSON_free(json);
    cJSON_Delete(j);
    if (rc < 0)
        loco_rmtree(tmp);
    return rc;
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

/* Reads a file named in state.json and checks its XXH3 against it. */
static int verify_file(const char *dir, const char *name, const cJSON *sums) {
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    uint64_t want, got;
    if (parse_hex(cJSON_GetObjectItemCaseSensitive(sums, name), &want) < 0)
        return LOCO_ERR(LOCO_EPROTO, "checkpoint %s: state.json has no checksum for %s", dir,
                        name);
    int rc = file_hash(path, &got);
    if (rc < 0)
        return LOCO_ERR(LOCO_EPROTO, "checkpoint %s: cannot read %s (%s)", dir, name,
                        loco_strerror(rc));
    if (got != want)
        return LOCO_ERR(LOCO_EPROTO,
                        "checkpoint %s: %s is corrupt or truncated (checksum %016llx, state.json "
                        "says %016llx)",
                        dir, name, (unsigned long long)got, (unsigned long long)want);
    return 0;
}

int loco_ckpt_load(const char *dir, const loco_config *cfg, loco_gpt *m, loco_adamw *opt,
                   loco_ckpt_state *st) {
    char path[PATH_MAX + 64];
    void *text = NULL;
    size_t len;
    int rc = 0;
    cJSON *j = NULL;
    loco_st *sm = NULL, *so = NULL;
    float *params = NULL, *mv = NULL;
    loco_ttable both;
    loco_ttable_init(&both);

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
    uint64_t model_hash, rng[4];
    if (get_int(j, "version", &version) || get_int(j, "step", &step) ||
        get_int(j, "adam_t", &adam_t) || get_int(d, "shard", &shard) || get_int(d, "pos", &pos) ||
        get_int(d, "epoch", &epoch) || !cJSON_IsArray(r) || cJSON_GetArraySize(r) != 4 ||
        parse_hex(cJSON_GetObjectItemCaseSensitive(j, "model_hash"), &model_hash) ||
        !cJSON_IsObject(sums)) {
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
    uint64_t want_hash = loco_config_hash(cfg, model_sections);
    if (model_hash != want_hash) {
        rc = LOCO_ERR(LOCO_EINVAL,
                      "checkpoint %s was written for another [model] section than the config's "
                      "(see %s/config.ini)",
                      dir, dir);
        goto out;
    }
    LOCO_CHECK_GOTO(verify_file(dir, MODEL_FILE, sums), out);
    snprintf(path, sizeof path, "%s/" MODEL_FILE, dir);
    LOCO_CHECK_GOTO(loco_st_open(&sm, path), out);
    params = loco_alloc(m->n_params * sizeof(float));
    if (!params) {
        rc = LOCO_ERR(LOCO_ENOMEM, "checkpoint load buffer");
        goto out;
    }
    LOCO_CHECK_GOTO(loco_st_read_into(sm, &m->tt, params, NULL), out);
    if (opt) {
        LOCO_CHECK_GOTO(verify_file(dir, OPTIM_FILE, sums), out);
        snprintf(path, sizeof path, "%s/" OPTIM_FILE, dir);
        LOCO_CHECK_GOTO(loco_st_open(&so, path), out);
        for (int pass = 0; pass < 2; pass++)
            for (int i = 0; i < m->tt.n; i++) {
                char n[LOCO_TENSOR_NAME_MAX + 16];
                snprintf(n, sizeof n, "%s%.80s", pass ? "exp_avg_sq." : "exp_avg.",
                         m->tt.t[i].name);
                LOCO_CHECK_GOTO(
                    loco_ttable_add(&both, n, m->tt.t[i].ndim, m->tt.t[i].shape, -1, false), out);
            }
        mv = loco_alloc(2 * m->n_params * sizeof(float));
        if (!mv) {
            rc = LOCO_ERR(LOCO_ENOMEM, "checkpoint load buffer");
            goto out;
        }
        LOCO_CHECK_GOTO(loco_st_read_into(so, &both, mv, NULL), out);
    }
    /* Everything checked: only now touch the caller's model and optimizer. */
    memcpy(m->params, params, m->n_params * sizeof(float));
    if (opt) {
        memcpy(opt->m, mv, m->n_params * sizeof(float));
        memcpy(opt->v, mv + m->n_params, m->n_params * sizeof(float));
        opt->t = adam_t;
    }
    if (st) {
        st->step = step;
        st->data = (loco_data_pos){.shard = shard, .pos = pos, .epoch = epoch};
        memcpy(st->rng.s, rng, sizeof rng);
        st->model_hash = model_hash;
    }
out:
    loco_ttable_fini(&both);
    loco_free(params);
    loco_free(mv);
    loco_st_close(sm);
    loco_st_close(so);
    cJSON_Delete(j);
    loco_free(text);
    return rc;
}
