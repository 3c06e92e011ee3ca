/* The single-island training loop: micro-batches, clipping, AdamW, logging,
 * evaluation and checkpoints. */
#include "inner/inner.h"

#include <limits.h>
#include <math.h>
#include <string.h>

struct loco_trainer {
    loco_config cfg;
    loco_gpt model;
    loco_adamw opt;
    loco_data *train, *val;
    loco_metrics *metrics;
    loco_rng rng;
    int64_t step; /* optimizer steps completed */
    int B, T;
    int32_t *inputs, *targets; /* (B, T) */
    double unigram;            /* nats, NAN when unknown */
};

void loco_trainer_destroy(loco_trainer *t) {
    if (!t)
        return;
    loco_gpt_fini(&t->model);
    loco_adamw_fini(&t->opt);
    loco_data_close(t->train);
    loco_data_close(t->val);
    loco_metrics_close(t->metrics);
    loco_free(t->inputs);
    loco_free(t->targets);
    loco_free(t);
}

int loco_trainer_create(loco_trainer **out, const loco_config *cfg, const char *resume_dir) {
    *out = NULL;
    LOCO_CHECK(loco_config_validate(cfg));
    loco_trainer *t = loco_alloc(sizeof *t);
    if (!t)
        return LOCO_ERR(LOCO_ENOMEM, "trainer");
    int rc;
    t->cfg = *cfg;
    t->B = (int)cfg->train.batch_size;
    t->T = (int)cfg->model.seq_len;
    t->unigram = NAN;
    loco_set_threads((int)cfg->run.threads);
    loco_gpt_config mc = loco_gpt_config_from(cfg);
    LOCO_CHECK_GOTO(loco_gpt_init(&t->model, &mc, t->B, t->T), out_fail);
    LOCO_CHECK_GOTO(loco_adamw_init(&t->opt, t->model.n_params, cfg), out_fail);
    t->inputs = loco_alloc((size_t)t->B * t->T * sizeof(int32_t));
    t->targets = loco_alloc((size_t)t->B * t->T * sizeof(int32_t));
    if (!t->inputs || !t->targets) {
        rc = LOCO_ERR(LOCO_ENOMEM, "batch buffers");
        goto out_fail;
    }
    LOCO_CHECK_GOTO(loco_data_open(&t->train, cfg->data.train, t->B, t->T, 0, 1, mc.vocab_size),
                    out_fail);
    if (cfg->data.val[0])
        LOCO_CHECK_GOTO(loco_data_open(&t->val, cfg->data.val, t->B, t->T, 0, 1, mc.vocab_size),
                        out_fail);
    loco_rng_seed(&t->rng, (uint64_t)cfg->train.seed);
    if (resume_dir) {
        loco_ckpt_state st;
        LOCO_CHECK_GOTO(loco_ckpt_load(resume_dir, cfg, &t->model, &t->opt, &st), out_fail);
        LOCO_CHECK_GOTO(loco_data_seek(t->train, st.data), out_fail);
        t->step = st.step;
        t->rng = st.rng;
        loco_info("resumed from %s at step %lld", resume_dir, (long long)t->step);
    } else {
        loco_gpt_init_weights(&t->model, &t->rng);
    }
    *out = t;
    return 0;
out_fail:
    loco_trainer_destroy(t);
    return rc;
}

int64_t loco_trainer_steps_done(const loco_trainer *t) { return t->step; }
loco_gpt *loco_trainer_model(loco_trainer *t) { return &t->model; }

int loco_trainer_step(loco_trainer *t, loco_step_stats *stats) {
    double t0 = loco_now();
    const int accum = (int)t->cfg.train.grad_accum;
    loco_gpt_zero_grad(&t->model);
    double loss_sum = 0;
    for (int micro = 0; micro < accum; micro++) {
        LOCO_CHECK(loco_data_next(t->train, t->inputs, t->targets));
        float loss;
        LOCO_CHECK(loco_gpt_forward_backward(&t->model, t->inputs, t->targets, t->B, t->T,
                                             1.0f / (float)accum, &loss));
        loss_sum += loss;
    }
    double norm = loco_clip_grad_norm(t->model.grads, t->model.n_params, t->cfg.train.grad_clip);
    if (!isfinite(norm))
        return LOCO_ERR(LOCO_EINVAL, "step %lld: gradient norm is %g (training diverged)",
                        (long long)t->step + 1, norm);
    float lr = loco_lr_at(&t->cfg, t->step);
    loco_adamw_step(&t->opt, &t->model.tt, t->model.params, t->model.grads, lr);
    t->step++;
    double dt = loco_now() - t0;
    if (stats) {
        stats->step = t->step;
        stats->loss = (float)(loss_sum / accum);
        stats->lr = lr;
        stats->grad_norm = norm;
        stats->seconds = dt;
        stats->tokens_per_s = (double)t->B * t->T * accum / dt;
    }
    return 0;
}

int loco_trainer_eval(loco_trainer *t, int batches, double *val_loss, int64_t *tokens) {
    if (!t->val)
        return LOCO_ERR(LOCO_EINVAL, "no validation data (data.val is empty)");
    LOCO_CHECK(loco_data_seek(t->val, (loco_data_pos){0, 0, 0}));
    double sum = 0;
    for (int b = 0; b < batches; b++) {
        float loss;
        LOCO_CHECK(loco_data_next(t->val, t->inputs, t->targets));
        LOCO_CHECK(loco_gpt_forward(&t->model, t->inputs, t->targets, t->B, t->T, &loss));
        sum += loss;
    }
    *val_loss = sum / batches;
    if (tokens)
        *tokens = (int64_t)batches * t->B * t->T;
    return 0;
}

int loco_trainer_save(loco_trainer *t, const char *dir) {
    static const char *const model_sections[] = {"model", NULL};
    loco_ckpt_state st = {
        .step = t->step,
        .data = loco_data_tell(t->train),
        .rng = t->rng,
        .model_hash = loco_config_hash(&t->cfg, model_sections),
    };
    return loco_ckpt_save(dir, &t->cfg, &t->model, &t->opt, &st);
}

static void format_eta(double s, char *buf, size_t cap) {
    if (!isfinite(s) || s < 0)
        s = 0;
    long x = (long)(s + 0.5);
    if (x >= 3600)
        snprintf(buf, cap, "%ldh%02ldm", x / 3600, (x / 60) % 60);
    else
        snprintf(buf, cap, "%ldm%02lds", x / 60, x % 60);
}

static int evaluate_and_log(loco_trainer *t) {
    double vl;
    int64_t tokens;
    LOCO_CHECK(loco_trainer_eval(t, (int)t->cfg.run.eval_batches, &vl, &tokens));
    if (isfinite(t->unigram))
        loco_info("step %lld | val loss %.4f | unigram baseline %.4f | %lld tokens",
                  (long long)t->step, vl, t->unigram, (long long)tokens);
    else
        loco_info("step %lld | val loss %.4f | %lld tokens", (long long)t->step, vl,
                  (long long)tokens);
    loco_metrics_begin(t->metrics);
    loco_metrics_int(t->metrics, "step", t->step);
    loco_metrics_num(t->metrics, "val_loss", vl);
    loco_metrics_int(t->metrics, "val_tokens", tokens);
    return loco_metrics_end(t->metrics);
}

static int checkpoint(loco_trainer *t) {
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/ckpt_%08lld", t->cfg.run.dir, (long long)t->step);
    double t0 = loco_now();
    LOCO_CHECK(loco_trainer_save(t, dir));
    loco_info("step %lld | checkpoint %s (%.2f s)", (long long)t->step, dir, loco_now() - t0);
    return 0;
}

int loco_trainer_run(loco_trainer *t) {
    const loco_config *c = &t->cfg;
    LOCO_CHECK(loco_mkdirs(c->run.dir));
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/metrics.jsonl", c->run.dir);
    LOCO_CHECK(loco_metrics_open(&t->metrics, path, t->step > 0));
    if (t->val && c->data.val[0])
        if (loco_data_unigram_entropy(c->data.val, (int)c->model.vocab_size, &t->unigram) < 0)
            t->unigram = NAN;
    const int64_t tokens_per_step = (int64_t)t->B * t->T * c->train.grad_accum;
    loco_info("model: %d layers, %d heads, width %d, context %d, vocab %d: %zu parameters",
              t->model.cfg.n_layer, t->model.cfg.n_head, t->model.cfg.n_embd, t->model.cfg.seq_len,
              t->model.cfg.vocab_size, t->model.n_params);
    loco_info("training %lld steps of %lld tokens on %d threads; run dir %s",
              (long long)c->train.steps, (long long)tokens_per_step, loco_set_threads((int)c->run.threads),
              c->run.dir);
    double t_start = loco_now();
    int64_t first = t->step;
    while (t->step < c->train.steps) {
        loco_step_stats s;
        LOCO_CHECK(loco_trainer_step(t, &s));
        bool last = t->step == c->train.steps;
        double elapsed = loco_now() - t_start;
        double eta = elapsed / (double)(t->step - first) * (double)(c->train.steps - t->step);
        loco_metrics_begin(t->metrics);
        loco_metrics_int(t->metrics, "step", s.step);
        loco_metrics_num(t->metrics, "loss", s.loss);
        loco_metrics_num(t->metrics, "lr", s.lr);
        loco_metrics_num(t->metrics, "grad_norm", s.grad_norm);
        loco_metrics_num(t->metrics, "tokens_per_s", s.tokens_per_s);
        loco_metrics_num(t->metrics, "step_s", s.seconds);
        LOCO_CHECK(loco_metrics_end(t->metrics));
        if (s.step % c->run.log_every == 0 || s.step == first + 1 || last) {
            char e[32];
            format_eta(eta, e, sizeof e);
            loco_info("step %5lld/%lld | loss %.4f | lr %.2e | grad norm %.3f | %.0f tok/s | ETA %s",
                      (long long)s.step, (long long)c->train.steps, s.loss, s.lr, s.grad_norm,
                      s.tokens_per_s, e);
        }
        if (t->val && ((c->run.eval_every > 0 && s.step % c->run.eval_every == 0) || last))
            LOCO_CHECK(evaluate_and_log(t));
        if ((c->run.ckpt_every > 0 && s.step % c->run.ckpt_every == 0) || last)
            LOCO_CHECK(checkpoint(t));
    }
    return 0;
}

int loco_data_unigram_entropy(const char *pattern, int vocab_size, double *nats) {
    /* Counts every target of one pass over the shards in windows of 1 x 256. */
    enum { W = 256 };
    loco_data *d;
    LOCO_CHECK(loco_data_open(&d, pattern, 1, W, 0, 1, vocab_size));
    int rc = 0;
    int64_t *counts = loco_alloc((size_t)vocab_size * sizeof(int64_t));
    int32_t in[W], tg[W];
    if (!counts) {
        rc = LOCO_ERR(LOCO_ENOMEM, "unigram counts");
        goto out;
    }
    int64_t total = 0;
    for (;;) {
        LOCO_CHECK_GOTO(loco_data_next(d, in, tg), out);
        for (int i = 0; i < W; i++)
            counts[tg[i]]++;
        total += W;
        if (loco_data_tell(d).epoch > 0)
            break;
    }
    double h = 0;
    for (int v = 0; v < vocab_size; v++)
        if (counts[v]) {
            double p = (double)counts[v] / (double)total;
            h -= p * log(p);
        }
    *nats = h;
out:
    loco_free(counts);
    loco_data_close(d);
    return rc;
}
