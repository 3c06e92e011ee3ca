/* Training end to end on the real data (data/kjv_*.bin, made by
 * `make data`): loss falls, runs repeat bit for bit, resume continues the
 * same curve, and the learning-rate schedule has its shape. */
#include "inner/data/data.h"
#include "inner/model/model.h"
#include "inner/optim/optim.h"
#include "inner/train/train.h"
#include "tests/support.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void small_config(loco_config *cfg, const char *dir) {
    loco_config_defaults(cfg);
    cfg->model.n_layer = 2;
    cfg->model.n_head = 2;
    cfg->model.n_embd = 32;
    cfg->model.seq_len = 32;
    cfg->train.batch_size = 4;
    cfg->train.steps = 12;
    cfg->train.warmup_steps = 3;
    cfg->train.lr = 1e-2;
    cfg->run.threads = 1;
    cfg->run.eval_batches = 2;
    cfg->run.log_every = 1000;
    cfg->run.eval_every = 0;
    snprintf(cfg->run.dir, sizeof cfg->run.dir, "%s", dir);
    loco_log_set_level(LOCO_LOG_WARN);
}

/* Trains `steps` steps, recording losses; returns the params' hash. */
static uint64_t train(const loco_config *cfg, const char *resume, int steps, float *losses) {
    loco_trainer *t;
    cr_assert_eq(loco_trainer_create(&t, cfg, resume), 0, "%s", loco_errmsg());
    for (int i = 0; i < steps; i++) {
        loco_step_stats s;
        cr_assert_eq(loco_trainer_step(t, &s), 0, "%s", loco_errmsg());
        losses[i] = s.loss;
    }
    loco_gpt *m = loco_trainer_model(t);
    uint64_t h = loco_hash64(loco_gpt_params(m), loco_gpt_num_params(m) * sizeof(float));
    loco_trainer_destroy(t);
    return h;
}

Test(train, loss_falls_on_real_data, .timeout = 120) {
    char *dir = test_tmpdir("loco-train");
    loco_config cfg;
    small_config(&cfg, dir);
    cfg.train.steps = 200;
    cfg.train.warmup_steps = 20;
    cfg.train.lr = 3e-3;
    cfg.train.batch_size = 8;
    cfg.model.n_embd = 64;
    cfg.model.seq_len = 64;
    cfg.run.eval_batches = 10;
    loco_trainer *t;
    cr_assert_eq(loco_trainer_create(&t, &cfg, NULL), 0, "%s", loco_errmsg());
    double before, after, unigram;
    cr_assert_eq(loco_trainer_eval(t, 10, &before, NULL), 0);
    for (int i = 0; i < 200; i++)
        cr_assert_eq(loco_trainer_step(t, NULL), 0, "%s", loco_errmsg());
    cr_assert_eq(loco_trainer_eval(t, 10, &after, NULL), 0);
    cr_assert_eq(loco_data_unigram_entropy(cfg.data.val, 256, &unigram), 0);
    /* A random byte model starts near ln 256 = 5.55; 200 steps of a small
     * model get well below the unigram entropy of the text (3.14 nats). */
    cr_expect(before > 5.0 && before < 6.0, "initial val loss %g", before);
    cr_expect(after < unigram - 0.4, "val loss %g after 200 steps, unigram %g", after, unigram);
    cr_expect(unigram > 2.5 && unigram < 3.5, "unigram %g", unigram);
    loco_trainer_destroy(t);
    loco_rmtree(dir);
    free(dir);
}

Test(train, same_seed_same_bits, .timeout = 120) {
    char *dir = test_tmpdir("loco-train");
    loco_config cfg;
    small_config(&cfg, dir);
    float a[12], b[12], c[12];
    uint64_t ha = train(&cfg, NULL, 12, a);
    uint64_t hb = train(&cfg, NULL, 12, b);
    cr_expect_eq(memcmp(a, b, sizeof a), 0, "losses differ between identical runs");
    cr_expect_eq(ha, hb, "parameters differ between identical runs");
    cfg.train.seed = 7;
    uint64_t hc = train(&cfg, NULL, 12, c);
    cr_expect_neq(ha, hc, "a different seed must give different weights");
    loco_rmtree(dir);
    free(dir);
}

Test(train, two_threads_repeat_bit_for_bit, .timeout = 120) {
    char *dir = test_tmpdir("loco-train");
    loco_config cfg;
    small_config(&cfg, dir);
    cfg.run.threads = 2;
    float a[6], b[6];
    cr_expect_eq(train(&cfg, NULL, 6, a), train(&cfg, NULL, 6, b));
    cr_expect_eq(memcmp(a, b, sizeof a), 0);
    loco_rmtree(dir);
    free(dir);
}

Test(train, resume_continues_the_same_curve, .timeout = 120) {
    char *dir = test_tmpdir("loco-train");
    loco_config cfg;
    small_config(&cfg, dir);
    cfg.train.grad_accum = 2;
    float full[12], first[5], rest[7];
    uint64_t h_full = train(&cfg, NULL, 12, full);

    loco_trainer *t;
    cr_assert_eq(loco_trainer_create(&t, &cfg, NULL), 0);
    for (int i = 0; i < 5; i++) {
        loco_step_stats s;
        cr_assert_eq(loco_trainer_step(t, &s), 0);
        first[i] = s.loss;
    }
    char ck[512];
    snprintf(ck, sizeof ck, "%s/ckpt", dir);
    cr_assert_eq(loco_trainer_save(t, ck), 0, "%s", loco_errmsg());
    loco_trainer_destroy(t);

    uint64_t h_resumed = train(&cfg, ck, 7, rest);
    cr_expect_eq(memcmp(first, full, sizeof first), 0);
    for (int i = 0; i < 7; i++)
        cr_expect_eq(memcmp(&rest[i], &full[5 + i], sizeof(float)), 0,
                     "step %d: resumed loss %.9g, uninterrupted %.9g", 6 + i, rest[i], full[5 + i]);
    cr_expect_eq(h_resumed, h_full, "final parameters differ after resume");
    loco_rmtree(dir);
    free(dir);
}

Test(train, run_writes_metrics_and_final_checkpoint, .timeout = 120) {
    char *dir = test_tmpdir("loco-train");
    loco_config cfg;
    small_config(&cfg, dir);
    cfg.train.steps = 4;
    cfg.run.ckpt_every = 2;
    cfg.run.eval_every = 2;
    loco_trainer *t;
    cr_assert_eq(loco_trainer_create(&t, &cfg, NULL), 0);
    cr_assert_eq(loco_trainer_run(t), 0, "%s", loco_errmsg());
    loco_trainer_destroy(t);
    char path[600];
    void *text;
    size_t len;
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    cr_assert_eq(loco_file_read(path, &text, &len), 0);
    int lines = 0, vals = 0;
    for (char *p = text; (p = strchr(p, '\n')); p++)
        lines++;
    for (char *p = text; (p = strstr(p, "\"val_loss\"")); p++)
        vals++;
    cr_expect_eq(lines, 6, "4 step records + 2 eval records, got %d lines", lines);
    cr_expect_eq(vals, 2);
    cr_expect(strstr(text, "\"step\":4") != NULL);
    loco_free(text);
    snprintf(path, sizeof path, "%s/ckpt_00000002/state.json", dir);
    cr_expect_eq(access(path, R_OK), 0);
    snprintf(path, sizeof path, "%s/ckpt_00000004/model.safetensors", dir);
    cr_expect_eq(access(path, R_OK), 0);
    loco_rmtree(dir);
    free(dir);
}

Test(train, learning_rate_schedule) {
    loco_config cfg;
    loco_config_defaults(&cfg);
    cfg.train.lr = 1.0;
    cfg.train.min_lr_frac = 0.1;
    cfg.train.warmup_steps = 10;
    cfg.train.steps = 110;
    cr_expect_float_eq(loco_lr_at(&cfg, 0), 0.1f, 1e-7);
    cr_expect_float_eq(loco_lr_at(&cfg, 9), 1.0f, 1e-7);
    cr_expect_float_eq(loco_lr_at(&cfg, 10), 1.0f, 1e-7);
    cr_expect_float_eq(loco_lr_at(&cfg, 60), 0.55f, 1e-6); /* halfway down the cosine */
    cr_expect_float_eq(loco_lr_at(&cfg, 110), 0.1f, 1e-7);
    for (int s = 11; s < 110; s++)
        cr_expect(loco_lr_at(&cfg, s) <= loco_lr_at(&cfg, s - 1));
}

Test(train, clipping_scales_to_the_norm) {
    float g[4] = {3, 4, 0, 0};
    cr_expect_float_eq(loco_clip_grad_norm(g, 4, 1.0), 5.0, 1e-6);
    cr_expect_float_eq(g[0], 0.6f, 1e-6);
    cr_expect_float_eq(g[1], 0.8f, 1e-6);
    float h[2] = {0.3f, 0.4f};
    cr_expect_float_eq(loco_clip_grad_norm(h, 2, 1.0), 0.5, 1e-6);
    cr_expect_float_eq(h[0], 0.3f, 0);
}
