/* Checkpoints at URLs: file:// and https:// (a real nginx with WebDAV over
 * TLS) round trips bit for bit; the pointer names the newest checkpoint and
 * the one before it; a torn checkpoint (an object deleted or corrupted) is
 * refused and the previous complete one used, or a clear error when none
 * is left; a server of another CA and an unreachable URL are named in the
 * error; a training run publishes to run.ckpt_url and resumes from it on
 * the same curve. */
#include "inner/ckpt/ckpt.h"
#include "inner/model/model.h"
#include "inner/optim/optim.h"
#include "inner/train/train.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support.h"
#include "tests/webdav.h"

static char *dir;
static t_dav dav;
static loco_config cfg;
static loco_gpt *model = NULL;
static loco_adamw opt;
static loco_ckpt_state st;
/* Parameters as saved at each of the last saves (by save_step's slot). */
#define SLOTS 5
static float *saved[SLOTS];

static void setup(void) {
    dir = strdup("/tmp/loco-ckpturl-XXXXXX");
    cr_assert(mkdtemp(dir));
    test_mpi_session_dir(dir);
    loco_log_set_level(LOCO_LOG_ERROR);
    loco_config_defaults(&cfg);
    cfg.model.n_layer = 2, cfg.model.n_head = 2, cfg.model.n_embd = 16;
    cfg.model.seq_len = 8, cfg.model.vocab_size = 50;
    snprintf(cfg.run.dir, sizeof cfg.run.dir, "%s/run", dir);
    cfg.run.ckpt_connect_ms = 5000;
    cfg.run.ckpt_stall_s = 10;
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
    st = (loco_ckpt_state){
        .step = 17, .data = {2, 4096, 1}, .rng = rng, .model_hash = loco_config_hash(&cfg, sec)};
}

static void teardown(void) {
    t_dav_stop(&dav);
    for (int i = 0; i < SLOTS; i++) {
        free(saved[i]);
        saved[i] = NULL;
    }
    loco_adamw_fini(&opt);
    loco_gpt_destroy(model);
    loco_rmtree(dir);
    free(dir);
}

TestSuite(ckpt_url, .init = setup, .fini = teardown, .timeout = 60);

/* Saves the model at `step` with every parameter shifted by `shift`,
 * remembering the parameters in saved[slot]. */
static void save_step(const char *url, int64_t step, float shift, int slot) {
    for (size_t i = 0; i < loco_gpt_num_params(model); i++)
        loco_gpt_params(model)[i] += shift;
    if (!saved[slot])
        saved[slot] = malloc(loco_gpt_num_params(model) * sizeof(float));
    memcpy(saved[slot], loco_gpt_params(model), loco_gpt_num_params(model) * sizeof(float));
    st.step = step;
    opt.t = step;
    cr_assert_eq(loco_ckpt_save(url, &cfg, model, &opt, &st), 0, "save step %lld to %s: %s",
                 (long long)step, url, loco_errmsg());
}

/* Loads url into a fresh model and checks it is bit for bit the model
 * saved at `step` into saved[slot]. */
static void expect_loads(const char *url, int64_t step, int slot) {
    loco_gpt *m = NULL;
    loco_adamw o;
    loco_ckpt_state s;
    loco_gpt_config mc = loco_gpt_config_from(&cfg);
    cr_assert_eq(loco_gpt_create(&m, &mc, 2, 8), 0);
    cr_assert_eq(loco_adamw_init(&o, loco_gpt_num_params(m), &cfg), 0);
    cr_assert_eq(loco_ckpt_load(url, &cfg, m, &o, &s), 0, "load %s: %s", url, loco_errmsg());
    cr_expect_eq(s.step, step, "loaded step %lld, expected %lld", (long long)s.step,
                 (long long)step);
    cr_expect_eq(memcmp(loco_gpt_params(m), saved[slot], loco_gpt_num_params(m) * sizeof(float)), 0,
                 "parameters differ from the saved ones");
    cr_expect_eq(memcmp(o.m, opt.m, loco_gpt_num_params(m) * sizeof(float)), 0);
    cr_expect_eq(memcmp(o.v, opt.v, loco_gpt_num_params(m) * sizeof(float)), 0);
    cr_expect_eq(o.t, step);
    cr_expect(s.data.shard == 2 && s.data.pos == 4096 && s.data.epoch == 1);
    cr_expect_eq(memcmp(&s.rng, &st.rng, sizeof s.rng), 0);
    loco_adamw_fini(&o);
    loco_gpt_destroy(m);
}

/* The pointer object, parsed (caller deletes). */
static cJSON *pointer(const char *url, const loco_store_opts *o) {
    loco_store *s;
    cr_assert_eq(loco_store_create(&s, o), 0);
    char loc[512];
    cr_assert_eq(loco_store_join(loc, sizeof loc, url, "LATEST"), 0);
    void *text;
    size_t len;
    cr_assert_eq(loco_store_get(s, loc, 1 << 20, &text, &len), 0, "%s", loco_errmsg());
    cJSON *j = cJSON_ParseWithLength(text, len);
    cr_assert(j, "LATEST is not JSON: %s", (char *)text);
    loco_free(text);
    loco_store_destroy(s);
    return j;
}

/* Location of file `name` of the checkpoint entry e under url. */
static void object_of(char *out, size_t cap, const char *base, const cJSON *e, const char *name) {
    snprintf(out, cap, "%s/%s/%s", base, cJSON_GetObjectItem(e, "prefix")->valuestring, name);
}

/* Entry i of the pointer's history (0 = the one before the newest). */
static const cJSON *previous(const cJSON *ptr, int i) {
    return cJSON_GetArrayItem(cJSON_GetObjectItem(ptr, "previous"), i);
}

/* No staging or download directory survives a save or load. */
static void expect_no_leftovers(void) {
    char p[600];
    snprintf(p, sizeof p, "%s/ckpt_stage", cfg.run.dir);
    DIR *d = opendir(p);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        n += e->d_name[0] != '.';
    if (d)
        closedir(d);
    cr_expect_eq(n, 0, "staging directories left in %s", p);
    snprintf(p, sizeof p, "%s/ckpt_cache", cfg.run.dir);
    d = opendir(p);
    n = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        n += e->d_name[0] != '.';
    if (d)
        closedir(d);
    cr_expect_eq(n, 0, "download directories left in %s", p);
}

Test(ckpt_url, file_url_round_trip_and_pointer) {
    char url[600], base[400];
    snprintf(base, sizeof base, "%s/store/run1", dir);
    snprintf(url, sizeof url, "file://%s", base);
    save_step(url, 10, 0.0f, 0);
    save_step(url, 20, 0.5f, 1);
    expect_loads(url, 20, 1);
    expect_no_leftovers();

    cJSON *j = pointer(url, NULL);
    cr_expect_str_eq(cJSON_GetObjectItem(j, "format")->valuestring, "loco-checkpoint-pointer");
    cr_expect_eq(cJSON_GetObjectItem(j, "step")->valuedouble, 20);
    const cJSON *files = cJSON_GetObjectItem(j, "files");
    bool has_state = false, has_model = false;
    const cJSON *f;
    cJSON_ArrayForEach(f, files) {
        const char *name = cJSON_GetObjectItem(f, "name")->valuestring;
        has_state |= !strcmp(name, "state.json");
        has_model |= !strcmp(name, "model.safetensors");
        char path[1200];
        object_of(path, sizeof path, base, j, name);
        void *data;
        size_t len;
        cr_assert_eq(loco_file_read(path, &data, &len), 0, "%s", loco_errmsg());
        cr_expect_eq((double)len, cJSON_GetObjectItem(f, "size")->valuedouble, "%s size", name);
        char h[17];
        loco_hash_hex(loco_hash64(data, len), h);
        cr_expect_str_eq(h, cJSON_GetObjectItem(f, "xxh3")->valuestring, "%s checksum", name);
        loco_free(data);
    }
    cr_expect(has_state && has_model, "the pointer lists every file of the checkpoint");
    const cJSON *hist = cJSON_GetObjectItem(j, "previous");
    cr_assert(cJSON_IsArray(hist) && cJSON_GetArraySize(hist) == 1,
              "the pointer carries the previous checkpoint");
    const cJSON *prev = cJSON_GetArrayItem(hist, 0);
    cr_expect_eq(cJSON_GetObjectItem(prev, "step")->valuedouble, 10);
    cr_expect(!cJSON_GetObjectItem(prev, "previous"), "a flat history, not a nested chain");
    cr_expect_str_neq(cJSON_GetObjectItem(prev, "prefix")->valuestring,
                      cJSON_GetObjectItem(j, "prefix")->valuestring);
    cJSON_Delete(j);
}

Test(ckpt_url, a_resave_of_the_same_step_never_overwrites_published_objects) {
    char url[600];
    snprintf(url, sizeof url, "file://%s/store", dir);
    save_step(url, 10, 0.0f, 0);
    cJSON *a = pointer(url, NULL);
    save_step(url, 10, 0.25f, 1);
    cJSON *b = pointer(url, NULL);
    cr_expect_str_neq(cJSON_GetObjectItem(a, "prefix")->valuestring,
                      cJSON_GetObjectItem(b, "prefix")->valuestring);
    cJSON_Delete(a);
    cJSON_Delete(b);
    expect_loads(url, 10, 1);
}

Test(ckpt_url, torn_file_url_falls_back_then_fails_clearly) {
    char url[600], base[400], obj[1200];
    snprintf(base, sizeof base, "%s/store", dir);
    snprintf(url, sizeof url, "file://%s", base);
    save_step(url, 10, 0.0f, 0);
    save_step(url, 20, 1.0f, 1);
    cJSON *j = pointer(url, NULL);
    /* Step 20 loses its optimizer state: step 10 is used. */
    object_of(obj, sizeof obj, base, j, "optimizer.safetensors");
    cr_assert_eq(unlink(obj), 0);
    expect_loads(url, 10, 0);
    /* Step 10's model is corrupted too: nothing complete is left. */
    object_of(obj, sizeof obj, base, previous(j, 0), "model.safetensors");
    FILE *f = fopen(obj, "r+b");
    cr_assert(f);
    fseek(f, 100, SEEK_SET);
    fputc(0x5a ^ 0xff, f);
    fclose(f);
    cJSON_Delete(j);
    loco_gpt *m = NULL;
    loco_gpt_config mc = loco_gpt_config_from(&cfg);
    cr_assert_eq(loco_gpt_create(&m, &mc, 2, 8), 0);
    int rc = loco_ckpt_load(url, &cfg, m, NULL, NULL);
    cr_expect_eq(rc, LOCO_EPROTO, "rc %d: %s", rc, loco_errmsg());
    const char *msg = loco_errmsg();
    cr_expect(strstr(msg, "no complete checkpoint") && strstr(msg, "step 20") &&
                  strstr(msg, "step 10") && strstr(msg, "optimizer.safetensors") &&
                  strstr(msg, "model.safetensors is torn"),
              "the error names both checkpoints and why: %s", msg);
    loco_gpt_destroy(m);
    expect_no_leftovers();
}

Test(ckpt_url, history_is_bounded_and_searched_newest_first) {
    char url[600], base[400], obj[1200];
    snprintf(base, sizeof base, "%s/store", dir);
    snprintf(url, sizeof url, "file://%s", base);
    for (int i = 0; i < 5; i++)
        save_step(url, 10 * (i + 1), 0.125f, i);
    cJSON *j = pointer(url, NULL);
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(j, "previous")), 3);
    for (int i = 0; i < 3; i++)
        cr_expect_eq(cJSON_GetObjectItem(previous(j, i), "step")->valuedouble, 40 - 10 * i);
    /* Steps 50 and 40 torn: step 30 is the newest complete one. */
    object_of(obj, sizeof obj, base, j, "state.json");
    cr_assert_eq(unlink(obj), 0);
    object_of(obj, sizeof obj, base, previous(j, 0), "config.json");
    cr_assert_eq(unlink(obj), 0);
    cJSON_Delete(j);
    expect_loads(url, 30, 2);
}

Test(ckpt_url, no_pointer_is_a_clear_error) {
    char url[600];
    snprintf(url, sizeof url, "file://%s/empty", dir);
    loco_gpt *m = NULL;
    loco_gpt_config mc = loco_gpt_config_from(&cfg);
    cr_assert_eq(loco_gpt_create(&m, &mc, 2, 8), 0);
    int rc = loco_ckpt_load(url, &cfg, m, NULL, NULL);
    cr_expect_eq(rc, LOCO_EIO);
    cr_expect(strstr(loco_errmsg(), "no checkpoint at") && strstr(loco_errmsg(), url), "%s",
              loco_errmsg());
    loco_gpt_destroy(m);
}

Test(ckpt_url, https_round_trip_and_torn_fallback, .timeout = 60) {
    t_dav_start(&dav);
    snprintf(cfg.net.ca, sizeof cfg.net.ca, "%s", dav.ca);
    char url[128], base[256], obj[600];
    snprintf(url, sizeof url, "%s/full/runs/a", dav.url);
    snprintf(base, sizeof base, "%s/full/runs/a", dav.www);
    save_step(url, 10, 0.0f, 0);
    expect_loads(url, 10, 0);
    save_step(url, 20, 0.5f, 1);
    expect_loads(url, 20, 1);
    expect_no_leftovers();

    /* Corrupt one uploaded object of step 20 on the server. */
    loco_store_opts o;
    t_dav_opts(&dav, &o);
    cJSON *j = pointer(url, &o);
    object_of(obj, sizeof obj, base, j, "model.safetensors");
    void *data;
    size_t len;
    cr_assert_eq(loco_file_read(obj, &data, &len), 0);
    ((uint8_t *)data)[len / 2] ^= 1;
    cr_assert_eq(loco_file_write_sync(obj, data, len), 0);
    loco_free(data);
    expect_loads(url, 10, 0);

    /* Delete one of step 10 through WebDAV: nothing complete is left. */
    loco_store *s;
    cr_assert_eq(loco_store_create(&s, &o), 0);
    object_of(obj, sizeof obj, url, previous(j, 0), "state.json");
    cr_assert_eq(loco_store_delete(s, obj), 0, "%s", loco_errmsg());
    loco_store_destroy(s);
    cJSON_Delete(j);
    loco_gpt *m = NULL;
    loco_gpt_config mc = loco_gpt_config_from(&cfg);
    cr_assert_eq(loco_gpt_create(&m, &mc, 2, 8), 0);
    for (size_t i = 0; i < loco_gpt_num_params(m); i++)
        loco_gpt_params(m)[i] = 42.0f;
    int rc = loco_ckpt_load(url, &cfg, m, NULL, NULL);
    cr_expect_eq(rc, LOCO_EPROTO, "rc %d: %s", rc, loco_errmsg());
    const char *msg = loco_errmsg();
    cr_expect(strstr(msg, "step 20") && strstr(msg, "torn") && strstr(msg, "step 10") &&
                  strstr(msg, "HTTP 404"),
              "the error names both checkpoints and why: %s", msg);
    bool untouched = true;
    for (size_t i = 0; i < loco_gpt_num_params(m); i++)
        untouched &= loco_gpt_params(m)[i] == 42.0f;
    cr_expect(untouched, "a refused checkpoint changed the model");
    loco_gpt_destroy(m);
}

Test(ckpt_url, https_server_of_another_ca_refused, .timeout = 60) {
    t_dav_start(&dav);
    char other[480];
    snprintf(other, sizeof other, "%s/other", dir);
    const char *names[] = {"someone"};
    cr_assert_eq(loco_net_make_certs(other, names, 1, 1), 0, "%s", loco_errmsg());
    snprintf(cfg.net.ca, sizeof cfg.net.ca, "%s/ca.pem", other);
    char url[128];
    snprintf(url, sizeof url, "%s/full/runs/b", dav.url);
    st.step = 5;
    int rc = loco_ckpt_save(url, &cfg, model, &opt, &st);
    cr_expect_eq(rc, LOCO_EAUTH, "rc %d: %s", rc, loco_errmsg());
    cr_expect(strstr(loco_errmsg(), url) && strstr(loco_errmsg(), "certificate"), "%s",
              loco_errmsg());
    expect_no_leftovers();
    rc = loco_ckpt_load(url, &cfg, model, &opt, NULL);
    cr_expect_eq(rc, LOCO_EAUTH, "rc %d: %s", rc, loco_errmsg());
    cr_expect(strstr(loco_errmsg(), url), "%s", loco_errmsg());
}

Test(ckpt_url, unreachable_url_is_a_clear_error, .timeout = 30) {
    char url[128];
    snprintf(url, sizeof url, "https://localhost:%d/runs/c", t_free_port());
    cfg.run.ckpt_connect_ms = 2000;
    int rc = loco_ckpt_load(url, &cfg, model, &opt, NULL);
    cr_expect_eq(rc, LOCO_EIO, "rc %d: %s", rc, loco_errmsg());
    cr_expect(strstr(loco_errmsg(), "no checkpoint at") && strstr(loco_errmsg(), url) &&
                  strstr(loco_errmsg(), "curl error"),
              "%s", loco_errmsg());
    st.step = 5;
    rc = loco_ckpt_save(url, &cfg, model, &opt, &st);
    cr_expect_eq(rc, LOCO_EIO, "rc %d: %s", rc, loco_errmsg());
    cr_expect(strstr(loco_errmsg(), url), "%s", loco_errmsg());
    expect_no_leftovers();
}

/* A training run publishing to run.ckpt_url, resumed from the URL, goes on
 * along the uninterrupted curve (needs `make data`, as the train tests). */
static void train_cfg(loco_config *c, const char *run_dir) {
    loco_config_defaults(c);
    c->model.n_layer = 1, c->model.n_head = 2, c->model.n_embd = 16, c->model.seq_len = 16;
    c->train.batch_size = 2, c->train.steps = 4, c->train.warmup_steps = 1;
    c->run.threads = 1, c->run.eval_batches = 1, c->run.log_every = 1000;
    c->run.eval_every = 0, c->run.ckpt_every = 2;
    snprintf(c->run.dir, sizeof c->run.dir, "%s", run_dir);
}

Test(ckpt_url, training_publishes_and_resumes_from_the_url, .timeout = 120) {
    loco_config c;
    char run[400];
    snprintf(run, sizeof run, "%s/train", dir);
    train_cfg(&c, run);
    float full[4];
    loco_trainer *t;
    cr_assert_eq(loco_trainer_create(&t, &c, NULL), 0, "%s", loco_errmsg());
    for (int i = 0; i < 4; i++) {
        loco_step_stats s;
        cr_assert_eq(loco_trainer_step(t, &s), 0, "%s", loco_errmsg());
        full[i] = s.loss;
    }
    loco_trainer_destroy(t);

    snprintf(c.run.ckpt_url, sizeof c.run.ckpt_url, "file://%s/store", dir);
    c.train.steps = 2;
    cr_assert_eq(loco_trainer_create(&t, &c, NULL), 0, "%s", loco_errmsg());
    cr_assert_eq(loco_trainer_run(t), 0, "%s", loco_errmsg());
    loco_trainer_destroy(t);

    c.train.steps = 4;
    cr_assert_eq(loco_trainer_create(&t, &c, c.run.ckpt_url), 0, "%s", loco_errmsg());
    cr_expect_eq(loco_trainer_steps_done(t), 2);
    for (int i = 2; i < 4; i++) {
        loco_step_stats s;
        cr_assert_eq(loco_trainer_step(t, &s), 0, "%s", loco_errmsg());
        cr_expect_eq(memcmp(&s.loss, &full[i], sizeof(float)), 0,
                     "step %d: resumed loss %.9g, uninterrupted %.9g", i + 1, s.loss, full[i]);
    }
    loco_trainer_destroy(t);

    /* A run.ckpt_url that is no URL is refused before training. */
    snprintf(c.run.ckpt_url, sizeof c.run.ckpt_url, "%s/plain", dir);
    cr_expect_eq(loco_trainer_create(&t, &c, NULL), LOCO_EINVAL);
    cr_expect(strstr(loco_errmsg(), "run.ckpt_url"), "%s", loco_errmsg());
}

/* dp = 2 under mpirun: every rank writes its shard into the staging
 * directory, rank 0 uploads; the URL then holds exactly the checkpoint a
 * local run writes, and loads at dp = 1. */
#define MPIRUN "mpirun --allow-run-as-root --oversubscribe -x ASAN_OPTIONS=detect_leaks=0 -np 2 "
#define LOCO "\"${LOCO_BIN:-build/loco}\""
#define DP2                                                                                        \
    " train configs/tiny.ini --set model.n_layer=1 --set model.n_embd=32 --set model.seq_len=32"   \
    " --set train.steps=2 --set train.warmup_steps=1 --set train.batch_size=2"                     \
    " --set parallel.dp=2 --set parallel.zero_stage=2 --set run.threads=1"                         \
    " --set run.eval_batches=1 --set run.eval_every=0"

Test(ckpt_url, sharded_save_under_mpirun_matches_the_local_one, .timeout = 120) {
    static char out[1 << 16];
    if (test_run(out, sizeof out, "command -v mpirun") != 0)
        cr_skip_test("mpirun not found (apt-get install openmpi-bin)");
    int rc = test_run(out, sizeof out,
                      MPIRUN LOCO DP2 " --set run.dir=%s/a --set run.ckpt_url=file://%s/store", dir,
                      dir);
    cr_assert_eq(rc, 0, "%s", out);
    rc = test_run(out, sizeof out, MPIRUN LOCO DP2 " --set run.dir=%s/b", dir);
    cr_assert_eq(rc, 0, "%s", out);

    loco_config c;
    loco_config_defaults(&c);
    cr_assert_eq(loco_config_load(&c, "configs/tiny.ini"), 0, "%s", loco_errmsg());
    const char *sets[] = {"model.n_layer=1", "model.n_embd=32", "model.seq_len=32"};
    for (int i = 0; i < 3; i++)
        cr_assert_eq(loco_config_set(&c, sets[i]), 0, "%s", loco_errmsg());
    snprintf(c.run.dir, sizeof c.run.dir, "%s/load", dir);
    loco_gpt_config mc = loco_gpt_config_from(&c);
    loco_gpt *ma = NULL, *mb = NULL;
    loco_adamw oa, ob;
    loco_ckpt_state sa, sb;
    cr_assert_eq(loco_gpt_create(&ma, &mc, 1, 8), 0);
    cr_assert_eq(loco_gpt_create(&mb, &mc, 1, 8), 0);
    cr_assert_eq(loco_adamw_init(&oa, loco_gpt_num_params(ma), &c), 0);
    cr_assert_eq(loco_adamw_init(&ob, loco_gpt_num_params(mb), &c), 0);
    char url[600], local[600];
    snprintf(url, sizeof url, "file://%s/store", dir);
    snprintf(local, sizeof local, "%s/b/ckpt_00000002", dir);
    cr_assert_eq(loco_ckpt_load(url, &c, ma, &oa, &sa), 0, "%s", loco_errmsg());
    cr_assert_eq(loco_ckpt_load(local, &c, mb, &ob, &sb), 0, "%s", loco_errmsg());
    cr_expect(sa.step == 2 && sb.step == 2);
    cr_expect_eq(
        memcmp(loco_gpt_params(ma), loco_gpt_params(mb), loco_gpt_num_params(ma) * sizeof(float)),
        0);
    cr_expect_eq(memcmp(oa.v, ob.v, loco_gpt_num_params(ma) * sizeof(float)), 0);
    loco_adamw_fini(&oa);
    loco_adamw_fini(&ob);
    loco_gpt_destroy(ma);
    loco_gpt_destroy(mb);
    char stage[700];
    snprintf(stage, sizeof stage, "%s/a/ckpt_stage", dir);
    cr_expect_neq(access(stage, F_OK), 0, "the staging directory is removed");
}
