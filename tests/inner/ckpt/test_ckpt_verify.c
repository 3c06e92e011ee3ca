/* loco_ckpt_verify checks a whole checkpoint without a model: a good one
 * of either layout passes, a truncated, corrupt or missing file is refused
 * with a reason naming it. loco_ckpt_pick_resume takes the newest one
 * that verifies, logging each one skipped, and fails clearly when none
 * does. */
#include "inner/ckpt/ckpt.h"
#include "inner/model/model.h"
#include "inner/optim/optim.h"

#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char *dir;
static char run[600], ck10[700], ck20[700], shd[700];
static loco_config cfg;
static loco_ckpt_state st;

/* Pipeline stages of the 2-block model: one block each. */
static const loco_gpt_stage STAGES[2] = {{.n = 1, .first = {0}, .end = {1}, .slots = 1},
                                         {.n = 1, .first = {1}, .end = {2}, .slots = 1}};

/* A single-file checkpoint of step `step` with random weights and moments. */
static void save_single(const char *path, int64_t step) {
    loco_gpt *m = NULL;
    loco_adamw o;
    loco_gpt_config mc = loco_gpt_config_from(&cfg);
    cr_assert_eq(loco_gpt_create(&m, &mc, 2, 8), 0);
    cr_assert_eq(loco_adamw_init(&o, loco_gpt_num_params(m), &cfg), 0);
    loco_rng rng;
    loco_rng_seed(&rng, (uint64_t)step);
    loco_gpt_init_weights(m, &rng);
    for (size_t i = 0; i < loco_gpt_num_params(m); i++)
        o.m[i] = loco_rng_normal(&rng), o.v[i] = loco_rng_uniform(&rng);
    o.t = step;
    st.step = step;
    cr_assert_eq(loco_ckpt_save(path, &cfg, m, &o, &st), 0, "%s", loco_errmsg());
    loco_adamw_fini(&o);
    loco_gpt_destroy(m);
}

/* A sharded checkpoint of pp = 2 stages of tp = 2 slices, two shards per
 * (stage, tp rank): 8 files, shard i of stage q = i / 4, tp rank i % 2. */
static void save_sharded(const char *path) {
    char tmp[800];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    cr_assert_eq(loco_mkdirs(tmp), 0);
    loco_gpt_config mc = loco_gpt_config_from(&cfg);
    mc.tp = 2;
    size_t los[8], his[8];
    uint64_t hashes[8];
    int tps[8], pps[8], n = 0;
    loco_ttable tt[2];
    float *x[2];
    for (int q = 0; q < 2; q++) {
        cr_assert_eq(loco_gpt_build_stage_table(&tt[q], &mc, &STAGES[q]), 0, "%s", loco_errmsg());
        x[q] = calloc(tt[q].numel, sizeof(float));
        cr_assert(x[q]);
        for (size_t i = 0; i < tt[q].numel; i++)
            x[q][i] = (float)i / 7.0f;
    }
    for (int q = 0; q < 2; q++)
        for (int d = 0; d < 2; d++)
            for (int k = 0; k < 2; k++) {
                const size_t P = tt[q].numel;
                loco_ckpt_view v = {.tt = &tt[q], .model = mc, .tp_rank = k, .stage = &STAGES[q],
                                    .pp_rank = q, .params = x[q], .p_lo = 0, .p_hi = P,
                                    .m = x[q], .v = x[q], .o_lo = 0, .o_hi = P};
                los[n] = d ? P / 2 : 0, his[n] = d ? P : P / 2;
                tps[n] = k, pps[n] = q;
                cr_assert_eq(loco_ckpt_write_shard(tmp, n, &v, los[n], his[n], &hashes[n]), 0,
                             "%s", loco_errmsg());
                n++;
            }
    loco_ckpt_view v0 = {.tt = &tt[0], .model = mc, .stage = &STAGES[0], .params = x[0],
                         .p_hi = tt[0].numel, .m = x[0], .v = x[0], .o_hi = tt[0].numel};
    cr_assert_eq(loco_ckpt_write_manifest_pp(tmp, path, &cfg, &v0, n, los, his, hashes, tps, pps,
                                             STAGES, 2, &st),
                 0, "%s", loco_errmsg());
    for (int q = 0; q < 2; q++) {
        free(x[q]);
        loco_ttable_fini(&tt[q]);
    }
}

static void setup(void) {
    dir = strdup("/tmp/loco-ckpt-verify-XXXXXX");
    cr_assert(mkdtemp(dir));
    snprintf(run, sizeof run, "%s/run", dir);
    snprintf(ck10, sizeof ck10, "%s/ckpt_00000010", run);
    snprintf(ck20, sizeof ck20, "%s/ckpt_00000020", run);
    snprintf(shd, sizeof shd, "%s/sharded", dir);
    loco_config_defaults(&cfg);
    cfg.model.n_layer = 2, cfg.model.n_head = 2, cfg.model.n_embd = 16;
    cfg.model.seq_len = 8, cfg.model.vocab_size = 50;
    static const char *const sec[] = {"model", NULL};
    st = (loco_ckpt_state){.data = {0, 64, 0}, .model_hash = loco_config_hash(&cfg, sec)};
    loco_rng_seed(&st.rng, 5);
    save_single(ck10, 10);
    save_single(ck20, 20);
    save_sharded(shd);
    /* Not checkpoints: an unfinished save and the URL staging area. */
    char junk[800];
    snprintf(junk, sizeof junk, "%s/ckpt_00000030.tmp", run);
    cr_assert_eq(loco_mkdirs(junk), 0);
    snprintf(junk, sizeof junk, "%s/ckpt_stage", run);
    cr_assert_eq(loco_mkdirs(junk), 0);
}

static void teardown(void) {
    loco_rmtree(dir);
    free(dir);
}

TestSuite(ckpt_verify, .init = setup, .fini = teardown);

static void file_path(char *out, size_t cap, const char *ck, const char *name) {
    cr_assert(snprintf(out, cap, "%s/%s", ck, name) < (int)cap);
}

static void truncate_half(const char *ck, const char *name) {
    char path[800];
    struct stat sb;
    file_path(path, sizeof path, ck, name);
    cr_assert_eq(stat(path, &sb), 0, "%s", path);
    cr_assert_eq(truncate(path, sb.st_size / 2), 0);
}

static void flip_byte(const char *ck, const char *name, long at_from_end) {
    char path[800];
    file_path(path, sizeof path, ck, name);
    FILE *f = fopen(path, "r+b");
    cr_assert(f, "%s", path);
    fseek(f, -at_from_end, SEEK_END);
    int c = fgetc(f);
    fseek(f, -at_from_end, SEEK_END);
    fputc(c ^ 0x40, f);
    fclose(f);
}

static void remove_file(const char *ck, const char *name) {
    char path[800];
    file_path(path, sizeof path, ck, name);
    cr_assert_eq(unlink(path), 0, "%s", path);
}

/* ck must be refused with a reason naming it and holding needle. */
static void expect_refused(const char *ck, const char *needle) {
    char why[1024] = "unset";
    const int rc = loco_ckpt_verify(ck, why, sizeof why);
    cr_expect_eq(rc, LOCO_EPROTO, "rc %d (%s): %s", rc, loco_strerror(rc), loco_errmsg());
    cr_expect(strstr(why, needle) != NULL, "reason lacks '%s': %s", needle, why);
    cr_expect(strstr(why, ck) != NULL, "reason does not name %s: %s", ck, why);
    cr_expect(strchr(why, '\n') == NULL, "one line: %s", why);
}

Test(ckpt_verify, good_checkpoints_of_both_layouts_pass) {
    char why[1024] = "unset";
    cr_expect_eq(loco_ckpt_verify(ck20, why, sizeof why), 0, "%s", loco_errmsg());
    cr_expect_str_empty(why);
    cr_expect_eq(loco_ckpt_verify(shd, why, sizeof why), 0, "%s", loco_errmsg());
    cr_expect_eq(loco_ckpt_verify(shd, NULL, 0), 0, "why may be NULL");
}

Test(ckpt_verify, truncated_weights_refused) {
    truncate_half(ck20, "model.safetensors");
    expect_refused(ck20, "model.safetensors is corrupt or truncated");
}

Test(ckpt_verify, corrupt_optimizer_byte_refused) {
    flip_byte(ck20, "optimizer.safetensors", 9);
    expect_refused(ck20, "optimizer.safetensors is corrupt or truncated");
}

Test(ckpt_verify, missing_state_refused) {
    remove_file(ck20, "state.json");
    expect_refused(ck20, "not a complete checkpoint");
}

/* config.ini gives the shapes: one of another [model] is caught by the
 * hash state.json holds, not taken for the truth. */
Test(ckpt_verify, config_of_another_model_refused) {
    char path[800];
    file_path(path, sizeof path, ck20, "config.ini");
    loco_config other = cfg;
    other.model.n_layer = 3;
    FILE *f = fopen(path, "w");
    cr_assert(f);
    loco_config_dump(&other, f);
    fclose(f);
    expect_refused(ck20, "config.ini's [model]");
}

Test(ckpt_verify, missing_shard_refused) {
    remove_file(shd, "shard_00006.safetensors");
    expect_refused(shd, "shard_00006.safetensors (of pp rank 1 of 2, tp rank 0 of 2) is missing");
}

/* Shard 7 holds the second half of pp rank 1, tp rank 1's slice: a load
 * at pp rank 0 never reads it, verifying does. */
Test(ckpt_verify, corrupt_shard_byte_refused) {
    flip_byte(shd, "shard_00007.safetensors", 5);
    expect_refused(shd, "shard_00007.safetensors (of pp rank 1 of 2, tp rank 1 of 2) is corrupt");
}

Test(ckpt_verify, shard_left_out_of_the_list_refused) {
    char path[800];
    file_path(path, sizeof path, shd, "state.json");
    void *text;
    size_t len;
    cr_assert_eq(loco_file_read(path, &text, &len), 0);
    cJSON *j = cJSON_ParseWithLength(text, len);
    loco_free(text);
    cJSON_DeleteItemFromArray(cJSON_GetObjectItem(j, "shards"), 3);
    char *s = cJSON_Print(j);
    cr_assert_eq(loco_file_write_sync(path, s, strlen(s)), 0);
    cJSON_free(s);
    cJSON_Delete(j);
    expect_refused(shd, "pp rank 0 of 2, tp rank 1 of 2 end at");
}

/* --------------------------------------------------------------- picking */

/* loco_ckpt_pick_resume(from) with stderr captured into log[cap]. */
static int pick(const char *from, char *out, size_t cap, char *log, size_t log_cap) {
    char path[700];
    snprintf(path, sizeof path, "%s/stderr.txt", dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    cr_assert(fd >= 0);
    fflush(stderr);
    const int saved = dup(2);
    dup2(fd, 2);
    const int rc = loco_ckpt_pick_resume(from, out, cap);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(fd);
    FILE *f = fopen(path, "r");
    cr_assert(f);
    log[fread(log, 1, log_cap - 1, f)] = '\0';
    fclose(f);
    return rc;
}

Test(ckpt_verify, run_directory_resumes_from_its_newest) {
    char out[800], log[4096];
    cr_expect_eq(pick(run, out, sizeof out, log, sizeof log), 0, "%s", loco_errmsg());
    cr_expect_str_eq(out, ck20);
    cr_expect_str_empty(log, "nothing skipped: %s", log);
    /* A checkpoint named is taken as it is, not a newer one. */
    cr_expect_eq(pick(ck10, out, sizeof out, log, sizeof log), 0, "%s", loco_errmsg());
    cr_expect_str_eq(out, ck10);
}

Test(ckpt_verify, corrupt_newest_falls_back_to_the_previous) {
    char out[800], log[4096];
    truncate_half(ck20, "model.safetensors");
    cr_expect_eq(pick(run, out, sizeof out, log, sizeof log), 0, "%s", loco_errmsg());
    cr_expect_str_eq(out, ck10);
    cr_expect(strstr(log, "warn  resume: skipping") && strstr(log, "ckpt_00000020") &&
                  strstr(log, "model.safetensors is corrupt or truncated"),
              "the skipped checkpoint and why: %s", log);
    cr_expect(strstr(log, "using") && strstr(log, "ckpt_00000010"), "%s", log);
    /* Named explicitly, the same. */
    cr_expect_eq(pick(ck20, out, sizeof out, log, sizeof log), 0, "%s", loco_errmsg());
    cr_expect_str_eq(out, ck10);
    cr_expect(strstr(log, "skipping") && strstr(log, "ckpt_00000020"), "%s", log);
}

Test(ckpt_verify, none_valid_is_an_error_naming_each) {
    char out[800] = "unset", log[4096];
    truncate_half(ck20, "model.safetensors");
    remove_file(ck10, "optimizer.safetensors");
    cr_expect_eq(pick(run, out, sizeof out, log, sizeof log), LOCO_EPROTO);
    cr_expect_str_empty(out);
    const char *msg = loco_errmsg();
    cr_expect(strstr(msg, "no checkpoint to resume from") && strstr(msg, run) &&
                  strstr(msg, "ckpt_00000020: model.safetensors") &&
                  strstr(msg, "ckpt_00000010: optimizer.safetensors is missing"),
              "%s", msg);
    /* From the older one named: only it and what is older. */
    cr_expect_eq(pick(ck10, out, sizeof out, log, sizeof log), LOCO_EPROTO);
    cr_expect(strstr(loco_errmsg(), "ckpt_00000020") == NULL, "%s", loco_errmsg());
}

Test(ckpt_verify, empty_run_directory_and_other_names) {
    char out[800] = "unset", log[4096], empty[700];
    snprintf(empty, sizeof empty, "%s/empty", dir);
    cr_assert_eq(loco_mkdirs(empty), 0);
    cr_expect_eq(pick(empty, out, sizeof out, log, sizeof log), LOCO_EPROTO);
    cr_expect(strstr(loco_errmsg(), "no ckpt_N directory"), "%s", loco_errmsg());
    cr_expect_str_empty(out);
    /* A checkpoint under another name: itself only, whatever is beside it. */
    remove_file(shd, "shard_00000.safetensors");
    cr_expect_eq(pick(shd, out, sizeof out, log, sizeof log), LOCO_EPROTO);
    cr_expect(strstr(loco_errmsg(), "cannot resume") && strstr(loco_errmsg(), "shard_00000"),
              "%s", loco_errmsg());
    /* A URL is the fetch's to check (it falls back along its pointer). */
    cr_expect_eq(pick("https://store.example/run1", out, sizeof out, log, sizeof log), 0);
    cr_expect_str_eq(out, "https://store.example/run1");
}
