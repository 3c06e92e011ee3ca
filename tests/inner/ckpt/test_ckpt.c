/* Checkpoints: Hugging Face layout, exact round trip, and every kind of
 * damage refused with a clear error while the model stays untouched. */
#include "inner/ckpt/ckpt.h"
#include "inner/model/model.h"
#include "inner/optim/optim.h"

#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char *dir;
static char ck[600];
static loco_config cfg;
static loco_gpt *model = NULL;
static loco_adamw opt;
static loco_ckpt_state st;

static void setup(void) {
    dir = strdup("/tmp/loco-ckpt-XXXXXX");
    cr_assert(mkdtemp(dir));
    snprintf(ck, sizeof ck, "%s/ckpt", dir);
    loco_config_defaults(&cfg);
    cfg.model.n_layer = 2, cfg.model.n_head = 2, cfg.model.n_embd = 16;
    cfg.model.seq_len = 8, cfg.model.vocab_size = 50;
    loco_gpt_config mc = loco_gpt_config_from(&cfg);
    cr_assert_eq(loco_gpt_create(&model, &mc, 2, 8), 0);
    cr_assert_eq(loco_adamw_init(&opt, loco_gpt_num_params(model), &cfg), 0);
    loco_rng rng;
    loco_rng_seed(&rng, 3);
    loco_gpt_init_weights(model, &rng);
    for (size_t i = 0; i < loco_gpt_num_params(model); i++) {
        opt.m[i] = loco_rng_normal(&rng);
        opt.v[i] = loco_rng_uniform(&rng);
    }
    opt.t = 17;
    static const char *const sec[] = {"model", NULL};
    st = (loco_ckpt_state){.step = 17, .data = {2, 4096, 1}, .rng = rng,
                           .model_hash = loco_config_hash(&cfg, sec)};
    cr_assert_eq(loco_ckpt_save(ck, &cfg, model, &opt, &st), 0, "%s", loco_errmsg());
}

static void teardown(void) {
    loco_adamw_fini(&opt);
    loco_gpt_destroy(model);
    loco_rmtree(dir);
    free(dir);
}

TestSuite(ckpt, .init = setup, .fini = teardown);

/* A fresh model + optimizer of the same shape, all zeros. */
static void fresh(loco_gpt **m, loco_adamw *o) {
    loco_gpt_config mc = loco_gpt_config_from(&cfg);
    cr_assert_eq(loco_gpt_create(m, &mc, 2, 8), 0);
    cr_assert_eq(loco_adamw_init(o, loco_gpt_num_params(*m), &cfg), 0);
}

Test(ckpt, round_trip_is_exact) {
    loco_gpt *m = NULL;
    loco_adamw o;
    loco_ckpt_state s;
    fresh(&m, &o);
    cr_assert_eq(loco_ckpt_load(ck, &cfg, m, &o, &s), 0, "%s", loco_errmsg());
    cr_expect_eq(memcmp(loco_gpt_params(m), loco_gpt_params(model),
                        loco_gpt_num_params(model) * sizeof(float)),
                 0);
    cr_expect_eq(memcmp(o.m, opt.m, loco_gpt_num_params(model) * sizeof(float)), 0);
    cr_expect_eq(memcmp(o.v, opt.v, loco_gpt_num_params(model) * sizeof(float)), 0);
    cr_expect_eq(o.t, 17);
    cr_expect_eq(s.step, 17);
    cr_expect(s.data.shard == 2 && s.data.pos == 4096 && s.data.epoch == 1);
    cr_expect_eq(memcmp(&s.rng, &st.rng, sizeof s.rng), 0);
    loco_adamw_fini(&o);
    loco_gpt_destroy(m);
}

Test(ckpt, hugging_face_names_layouts_and_config) {
    char path[700];
    snprintf(path, sizeof path, "%s/model.safetensors", ck);
    loco_st *f;
    cr_assert_eq(loco_st_open(&f, path), 0);
    const float *w;
    int ndim;
    int64_t shape[4];
    cr_assert_eq(loco_st_get(f, "transformer.h.1.attn.c_attn.weight", &w, &ndim, shape), 0);
    cr_expect(ndim == 2 && shape[0] == 16 && shape[1] == 48, "c_attn is [C, 3C] as Conv1D");
    cr_assert_eq(loco_st_get(f, "transformer.h.0.mlp.c_proj.weight", &w, &ndim, shape), 0);
    cr_expect(shape[0] == 64 && shape[1] == 16);
    cr_expect_eq(memcmp(w, loco_gpt_param_views(model)->h[0].fcprojw, 64 * 16 * sizeof(float)), 0);
    cr_expect_eq(loco_st_get(f, "transformer.wte.weight", &w, &ndim, shape), 0);
    cr_expect(shape[0] == 50 && shape[1] == 16);
    cr_expect_eq(loco_st_get(f, "transformer.ln_f.bias", &w, &ndim, shape), 0);
    cr_expect_str_eq(loco_st_meta(f, "format"), "pt");
    loco_st_close(f);

    snprintf(path, sizeof path, "%s/config.json", ck);
    void *text;
    size_t len;
    cr_assert_eq(loco_file_read(path, &text, &len), 0);
    cJSON *j = cJSON_Parse(text);
    cr_assert(j);
    cr_expect_str_eq(cJSON_GetObjectItem(j, "model_type")->valuestring, "gpt2");
    cr_expect_eq(cJSON_GetObjectItem(j, "vocab_size")->valueint, 50);
    cr_expect_eq(cJSON_GetObjectItem(j, "n_positions")->valueint, 8);
    cr_expect_eq(cJSON_GetObjectItem(j, "n_embd")->valueint, 16);
    cr_expect_eq(cJSON_GetObjectItem(j, "n_layer")->valueint, 2);
    cr_expect_eq(cJSON_GetObjectItem(j, "n_head")->valueint, 2);
    cJSON_Delete(j);
    loco_free(text);
    /* No temporary left behind by the atomic write. */
    char tmp[700];
    snprintf(tmp, sizeof tmp, "%s.tmp", ck);
    cr_expect_neq(access(tmp, F_OK), 0);
}

/* Loading a damaged checkpoint must fail and leave the target untouched. */
static void expect_refused(int want_rc, const char *needle) {
    loco_gpt *m = NULL;
    loco_adamw o;
    fresh(&m, &o);
    for (size_t i = 0; i < loco_gpt_num_params(m); i++)
        loco_gpt_params(m)[i] = 42.0f;
    int rc = loco_ckpt_load(ck, &cfg, m, &o, NULL);
    cr_expect_eq(rc, want_rc, "rc %d (%s): %s", rc, loco_strerror(rc), loco_errmsg());
    if (needle)
        cr_expect(strstr(loco_errmsg(), needle) != NULL, "message lacks '%s': %s", needle,
                  loco_errmsg());
    bool untouched = true;
    for (size_t i = 0; i < loco_gpt_num_params(m); i++)
        untouched &= loco_gpt_params(m)[i] == 42.0f;
    cr_expect(untouched, "a refused checkpoint changed the model");
    cr_expect_eq(o.t, 0);
    loco_adamw_fini(&o);
    loco_gpt_destroy(m);
}

static void flip_byte(const char *name, long at_from_end) {
    char path[700];
    snprintf(path, sizeof path, "%s/%s", ck, name);
    FILE *f = fopen(path, "r+b");
    cr_assert(f);
    fseek(f, -at_from_end, SEEK_END);
    int c = fgetc(f);
    fseek(f, -at_from_end, SEEK_END);
    fputc(c ^ 0x40, f);
    fclose(f);
}

static void truncate_file(const char *name, long by) {
    char path[700];
    snprintf(path, sizeof path, "%s/%s", ck, name);
    FILE *f = fopen(path, "r+b");
    cr_assert(f);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fclose(f);
    cr_assert_eq(truncate(path, size - by), 0);
}

Test(ckpt, corrupt_weights_refused) {
    flip_byte("model.safetensors", 100);
    expect_refused(LOCO_EPROTO, "model.safetensors is corrupt or truncated");
}

Test(ckpt, truncated_weights_refused) {
    truncate_file("model.safetensors", 1000);
    expect_refused(LOCO_EPROTO, "model.safetensors");
}

Test(ckpt, corrupt_optimizer_refused) {
    flip_byte("optimizer.safetensors", 7);
    expect_refused(LOCO_EPROTO, "optimizer.safetensors");
}

Test(ckpt, missing_state_refused) {
    char path[700];
    snprintf(path, sizeof path, "%s/state.json", ck);
    cr_assert_eq(unlink(path), 0);
    expect_refused(LOCO_EPROTO, "not a complete checkpoint");
}

Test(ckpt, garbled_state_refused) {
    truncate_file("state.json", 40);
    expect_refused(LOCO_EPROTO, "state.json");
}

Test(ckpt, missing_directory_refused) {
    snprintf(ck, sizeof ck, "%s/nope", dir);
    expect_refused(LOCO_EPROTO, "nope");
}

Test(ckpt, other_model_config_refused) {
    cfg.model.n_layer = 3; /* the checkpoint holds 2 layers */
    loco_gpt *m = NULL;
    loco_gpt_config mc = loco_gpt_config_from(&cfg);
    cr_assert_eq(loco_gpt_create(&m, &mc, 2, 8), 0);
    cr_expect_eq(loco_ckpt_load(ck, &cfg, m, NULL, NULL), LOCO_EINVAL);
    cr_expect(strstr(loco_errmsg(), "[model]") != NULL, "%s", loco_errmsg());
    loco_gpt_destroy(m);
}

Test(ckpt, saving_over_an_old_checkpoint_replaces_it) {
    opt.t = 99;
    st.step = 99;
    cr_assert_eq(loco_ckpt_save(ck, &cfg, model, &opt, &st), 0, "%s", loco_errmsg());
    loco_ckpt_state s;
    loco_gpt *m = NULL;
    loco_adamw o;
    fresh(&m, &o);
    cr_assert_eq(loco_ckpt_load(ck, &cfg, m, &o, &s), 0);
    cr_expect_eq(s.step, 99);
    cr_expect_eq(o.t, 99);
    loco_adamw_fini(&o);
    loco_gpt_destroy(m);
}

Test(ckpt, failed_allocation_is_a_clean_error) {
    loco_gpt *m = NULL;
    loco_adamw o;
    fresh(&m, &o);
    for (long n = 1; n <= 12; n++) {
        loco_alloc_fail_after(n);
        int rc = loco_ckpt_load(ck, &cfg, m, &o, NULL);
        loco_alloc_fail_after(0);
        cr_expect(rc == 0 || rc == LOCO_ENOMEM || rc == LOCO_EPROTO, "allocation %ld: rc %d", n,
                  rc);
    }
    loco_adamw_fini(&o);
    loco_gpt_destroy(m);
}

/* A save interrupted between the two renames of the fallback publication
 * (file systems without RENAME_EXCHANGE) leaves only DIR.old: loading finds
 * it, and the next save puts things right. */
Test(ckpt, interrupted_fallback_publication_is_recovered) {
    char old[700];
    snprintf(old, sizeof old, "%s.old", ck);
    cr_assert_eq(rename(ck, old), 0);
    loco_gpt *m = NULL;
    loco_adamw o;
    loco_ckpt_state s;
    fresh(&m, &o);
    cr_assert_eq(loco_ckpt_load(ck, &cfg, m, &o, &s), 0, "%s", loco_errmsg());
    cr_expect_eq(s.step, 17);
    cr_expect_eq(memcmp(loco_gpt_params(m), loco_gpt_params(model),
                        loco_gpt_num_params(model) * sizeof(float)),
                 0);
    st.step = 18;
    cr_assert_eq(loco_ckpt_save(ck, &cfg, model, &opt, &st), 0, "%s", loco_errmsg());
    cr_expect_neq(access(old, F_OK), 0, "DIR.old is gone after the next save");
    cr_assert_eq(loco_ckpt_load(ck, &cfg, m, &o, &s), 0);
    cr_expect_eq(s.step, 18);
    loco_adamw_fini(&o);
    loco_gpt_destroy(m);
}
