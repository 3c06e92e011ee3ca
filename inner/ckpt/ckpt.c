/* Checkpoints: a directory that Hugging Face loads (model.safetensors and
 * config.json) plus what loco needs to continue bit for bit (optimizer
 * state, step, data position, RNG), written atomically (this file) and
 * verified by checksums before anything is loaded (ckpt_load.c). */
#include "inner/ckpt/internal.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *const loco__ckpt_model_sections[] = {"model", NULL};


static int write_text(const char *path, const char *text) {
    return loco_file_write_sync(path, text, strlen(text));
}

int loco__ckpt_file_hash(const char *path, uint64_t *h) {
    void *data;
    size_t len;
    LOCO_CHECK(loco_file_read(path, &data, &len));
    *h = loco_hash64(data, len);
    loco_free(data);
    return 0;
}

int loco__ckpt_write_hf_config(const char *path, const loco_gpt_config *c) {
    cJSON *j = cJSON_CreateObject();
    if (!loco_gpt_is_gpt2(c)) {
        /* Another family: the checkpoint's tensors are loco's fused layout,
         * which no Hugging Face class reads; `loco ckpt export` writes one. */
        cJSON_AddStringToObject(j, "model_type", "loco");
        cJSON_AddStringToObject(j, "note", "loco's own layout: `loco ckpt export` writes the "
                                           "Hugging Face one (LlamaForCausalLM)");
        cJSON_AddNumberToObject(j, "vocab_size", c->vocab_size);
        cJSON_AddNumberToObject(j, "n_embd", c->n_embd);
        cJSON_AddNumberToObject(j, "n_layer", c->n_layer);
        cJSON_AddNumberToObject(j, "n_head", c->n_head);
        cJSON_AddNumberToObject(j, "n_kv_head", loco_gpt_kv_heads(c));
        cJSON_AddNumberToObject(j, "ffn_hidden", loco_gpt_ffn(c));
        char *s = cJSON_Print(j);
        cJSON_Delete(j);
        if (!s)
            return LOCO_ERR(LOCO_ENOMEM, "config.json");
        int rc = write_text(path, s);
        cJSON_free(s);
        return rc;
    }
    const bool moe = c->n_experts > 0;
    /* GPT-2 with MoE MLPs: no Hugging Face class loads it, so it does not
     * claim to be one; tests/fixtures/make_fixtures.py --load-check does. */
    cJSON_AddStringToObject(j, "model_type", moe ? "loco_gpt2_moe" : "gpt2");
    cJSON *arch = cJSON_AddArrayToObject(j, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString(moe ? "LocoGPT2MoE" : "GPT2LMHeadModel"));
    if (moe) {
        cJSON_AddNumberToObject(j, "n_experts", c->n_experts);
        cJSON_AddNumberToObject(j, "top_k", c->top_k);
        cJSON_AddNumberToObject(j, "moe_every", c->moe_every);
        if (c->n_shared_experts > 0) /* make_fixtures.py's reference reads them */
            cJSON_AddNumberToObject(j, "n_shared_experts", c->n_shared_experts);
        cJSON_AddNumberToObject(j, "capacity_factor", c->capacity_factor);
        cJSON_AddNumberToObject(j, "aux_loss", c->aux_loss);
        cJSON_AddNumberToObject(j, "z_loss", c->z_loss);
        cJSON_AddStringToObject(j, "router", "softmax, top_k, renormalised (Mixtral)");
    }
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

/* Copies file src into dir as name. */
static int copy_file(const char *src, const char *dir, const char *name) {
    void *data;
    size_t len;
    int rc = loco_file_read(src, &data, &len);
    if (rc < 0) {
        char why[256]; /* the read's reason, kept before the new message */
        snprintf(why, sizeof why, "%s", loco_errmsg());
        return LOCO_ERR(rc, "data.tokenizer %s: cannot read it to copy into the checkpoint: %s",
                        src, why);
    }
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    rc = loco_file_write_sync(path, data, len);
    loco_free(data);
    return rc;
}

/* config.json and config.ini into tmp. */
static int write_configs(const char *tmp, const loco_config *cfg, const loco_gpt_config *mc) {
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/config.json", tmp);
    LOCO_CHECK(loco__ckpt_write_hf_config(path, mc));
    snprintf(path, sizeof path, "%s/config.ini", tmp);
    char *ini = NULL;
    size_t len = 0;
    LOCO_CHECK(dump_config(cfg, &ini, &len));
    int rc = loco_file_write_sync(path, ini, len);
    free(ini);
    if (rc == 0 && cfg->data.tokenizer[0]) /* the BPE of the data, for sample and eval */
        rc = copy_file(cfg->data.tokenizer, tmp, "tokenizer.json");
    return rc;
}

/* The fields both layouts share in state.json. */
static cJSON *state_json(const loco_ckpt_state *st, const loco_ckpt_view *v, int64_t adam_t) {
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
    if (v->n_router_bias) { /* a float's double prints and parses back exactly */
        cJSON *b = cJSON_AddArrayToObject(j, "router_bias");
        for (size_t i = 0; i < v->n_router_bias; i++)
            cJSON_AddItemToArray(b, cJSON_CreateNumber(v->router_bias[i]));
    }
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
int loco__ckpt_moments_table(loco_ttable *both, const loco_ttable *tt) {
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
    LOCO_CHECK_GOTO(loco__ckpt_file_hash(path, &h_model), out);
    if (v->m) {
        snprintf(path, sizeof path, "%s/" OPTIM_FILE, tmp);
        LOCO_CHECK_GOTO(loco__ckpt_moments_table(&both, v->tt), out);
        mv = loco_alloc(2 * P * sizeof(float));
        if (!mv) {
            rc = LOCO_ERR(LOCO_ENOMEM, "optimizer checkpoint buffer");
            goto out;
        }
        memcpy(mv, v->m, P * sizeof(float));
        memcpy(mv + P, v->v, P * sizeof(float));
        LOCO_CHECK_GOTO(loco_st_write(path, &both, mv, NULL, NULL), out);
        LOCO_CHECK_GOTO(loco__ckpt_file_hash(path, &h_optim), out);
    }
    LOCO_CHECK_GOTO(write_configs(tmp, cfg, c), out);
    j = state_json(st, v, v->m ? v->adam_t : 0);
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

loco_ckpt_view loco__ckpt_model_view(const loco_gpt *m, const loco_adamw *opt) {
    const size_t n = loco_gpt_num_params(m);
    loco_ckpt_view v = {
        .tt = loco_gpt_table(m), .model = *loco_gpt_cfg(m), .params = loco_gpt_params(m),
        .p_lo = 0, .p_hi = n, .m = opt ? opt->m : NULL, .v = opt ? opt->v : NULL, .o_lo = 0,
        .o_hi = opt ? n : 0, .adam_t = opt ? opt->t : 0, .tp_rank = loco_gpt_tp_rank(m),
        /* Its pp rank is not known here: loaded by tensor name. */
        .stage = loco_gpt_stage_of(m), .pp_rank = -1};
    v.router_bias = loco_gpt_router_bias(m, &v.n_router_bias);
    return v;
}

int loco_ckpt_save(const char *dir, const loco_config *cfg, const loco_gpt *m,
                   const loco_adamw *opt, const loco_ckpt_state *st) {
    loco_ckpt_view v = loco__ckpt_model_view(m, opt);
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
    LOCO_CHECK_GOTO(loco__ckpt_file_hash(path, hash), out);
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
    const int ep = v->model.ep > 1 ? v->model.ep : 1;
    *P = loco_alloc((size_t)pp * ep * sizeof **P);
    if (!*P)
        return LOCO_ERR(LOCO_ENOMEM, "table of %d pipeline stages", pp);
    if (pp == 1 && ep > 1) { /* the ep ranks' tables of the whole model */
        LOCO_CHECK(loco__ckpt_stage_params(&v->model, NULL, 1, *P));
        if ((*P)[v->model.ep_rank] != v->tt->numel)
            return LOCO_ERR(LOCO_EINVAL, "the view is not ep rank %d's table", v->model.ep_rank);
        return 0;
    }
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
    if (v->stage && (v->pp_rank < 0 || v->pp_rank >= pp ||
                     (*P)[v->pp_rank * ep + v->model.ep_rank] != v->tt->numel))
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
    const int t = loco__ckpt_view_tp(v), ep = v->model.ep > 1 ? v->model.ep : 1;
    if (pp < 1)
        return LOCO_ERR(LOCO_EINVAL, "pp = %d", pp);
    size_t *P;
    int rc = manifest_stage_params(v, stages, pp, &P);
    cJSON *j = NULL;
    LOCO_CHECK_GOTO(rc, out);
    /* pp_ranks name groups: pp rank x ep + ep rank */
    LOCO_CHECK_GOTO(check_shard_list(t, pp * ep, P, n_shards, los, his, tp_ranks, pp_ranks), out);
    LOCO_CHECK_GOTO(write_configs(tmpdir, cfg, &v->model), out);
    j = state_json(st, v, v->adam_t);
    if (pp * ep == 1) {
        cJSON_AddNumberToObject(j, "n_params", (double)P[0]);
    } else {
        cJSON *np = cJSON_AddArrayToObject(j, "n_params");
        for (int q = 0; q < pp * ep; q++)
            cJSON_AddItemToArray(np, cJSON_CreateNumber((double)P[q]));
    }
    if (t > 1)
        cJSON_AddNumberToObject(j, "tp", t);
    if (ep > 1)
        cJSON_AddNumberToObject(j, "ep", ep);
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
        const int g = pp_ranks ? pp_ranks[i] : 0;
        if (pp > 1)
            cJSON_AddNumberToObject(e, "pp_rank", g / ep);
        if (ep > 1)
            cJSON_AddNumberToObject(e, "ep_rank", g % ep);
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

