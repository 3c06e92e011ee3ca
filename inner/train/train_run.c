/* The run around the steps: the header logged at its start, and after
 * each step the metrics, the log line, evaluations and checkpoints as
 * [run] says. */
#include "inner/train/internal.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

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
    loco_prom_set(t->prom, "loco_train_val_loss", NULL, vl);
    return loco_metrics_end(t->metrics);
}

static int checkpoint(loco_trainer *t) {
    char dir[PATH_MAX];
    if (t->cfg.run.ckpt_url[0])
        snprintf(dir, sizeof dir, "%s", t->cfg.run.ckpt_url);
    else
        snprintf(dir, sizeof dir, "%s/ckpt_%08lld", t->cfg.run.dir, (long long)t->step);
    double t0 = loco_now();
    LOCO_CHECK(loco_trainer_save(t, dir));
    loco_info("step %lld | checkpoint %s (%.2f s)", (long long)t->step, dir, loco_now() - t0);
    return 0;
}

int loco_trainer_begin_run(loco_trainer *t) {
    const loco_config *c = &t->cfg;
    LOCO_CHECK(loco_mkdirs(c->run.dir));
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/metrics.jsonl", c->run.dir);
    if (t->root && !t->metrics)
        LOCO_CHECK(loco_metrics_open(&t->metrics, path, t->step > 0));
    if (t->root && t->val && c->data.val[0])
        if (loco_data_unigram_entropy(c->data.val, (int)c->model.vocab_size, &t->unigram) < 0)
            t->unigram = NAN;
    const int dp = loco_comm_size(t->dp);
    const int64_t tokens_per_step = (int64_t)t->B * t->T * c->train.grad_accum * dp;
    /* The whole model's count; under tp each rank holds a slice of it. */
    const loco_gpt_config *mc = loco_gpt_cfg(t->model);
    loco_gpt_config whole_cfg = *mc;
    whole_cfg.tp = 1;
    whole_cfg.ep = 1, whole_cfg.ep_rank = 0;
    loco_ttable whole;
    LOCO_CHECK(loco_gpt_build_table(&whole, &whole_cfg));
    const size_t n_whole = whole.numel;
    loco_ttable_fini(&whole);
    char slice[96] = "";
    if (mc->tp > 1)
        snprintf(slice, sizeof slice, " (%zu in each of %d tp slices)",
                 loco_gpt_num_params(t->model), mc->tp);
    char block[160] = ""; /* the description, when it is not GPT-2's */
    if (!loco_gpt_is_gpt2(mc))
        snprintf(block, sizeof block, "; %s, %s, %s %d, %d kv heads, %s, %s head",
                 mc->norm == LOCO_NORM_RMSNORM ? "rmsnorm" : "layernorm",
                 mc->pos == LOCO_POS_ROPE ? "rope" : "learned positions",
                 mc->mlp == LOCO_MLP_SWIGLU ? "swiglu" : "gelu", loco_gpt_ffn(mc),
                 loco_gpt_kv_heads(mc), mc->no_bias ? "no biases" : "biases",
                 mc->untied ? "untied" : "tied");
    loco_info("model: %d layers, %d heads, width %d, context %d, vocab %d%s: %zu parameters%s",
              mc->n_layer, mc->n_head, mc->n_embd, mc->seq_len, mc->vocab_size, block, n_whole,
              slice);
    char pp[160] = "";
    if (t->pp)
        snprintf(pp, sizeof pp, ", pp=%d %s v=%d", t->mesh.size[LOCO_DIM_PP],
                 c->parallel.pp_schedule, loco_gpt_stage_of(t->model)->n);
    if (t->mesh.size[LOCO_DIM_CP] > 1)
        snprintf(pp + strlen(pp), sizeof pp - strlen(pp), ", cp=%d %s", t->mesh.size[LOCO_DIM_CP],
                 c->parallel.cp_algo);
    loco_info("training %lld steps of %lld tokens on %d rank(s) (%s, dp=%d, tp=%d%s%s, ZeRO-%d, "
              "recompute %s) x %d threads; run dir %s",
              (long long)c->train.steps, (long long)tokens_per_step, loco_comm_size(t->world),
              loco_comm_backend(t->world), dp, mc->tp,
              loco_gpt_parallel_of(t->model)->sp ? " + sp" : "", pp, loco_zero_stage(t->zero),
              c->train.recompute, loco_set_threads((int)c->run.threads), c->run.dir);
#if defined(LOCO_HAVE_CUDA)
    if (t->dev)
        loco_info("device: one GPU (train.device = cuda), %s passes, fp32 master weights and "
                  "AdamW state, %.1f MiB of device memory, of which %.1f MiB the blocks' "
                  "activations (train.recompute = %s)",
                  c->train.dtype, (double)loco_gpt_cuda_bytes(t->dev) / (1 << 20),
                  (double)loco_gpt_cuda_act_bytes(t->dev) / (1 << 20), c->train.recompute);
    if (t->dev && (loco_comm_size(t->mesh.dp_cp) > 1 || t->dev_comm))
        loco_info("device data parallel: dp=%d, ZeRO-%d%s, gradients and parameters over %s, "
                  "reduced while the backward runs",
                  loco_comm_size(t->mesh.dp_cp), loco_zero_stage(t->zero),
                  loco_zero_stage(t->zero) >= 3 && loco_comm_size(t->mesh.dp_cp) > 1
                      ? " (owned state only, weights gathered unit by unit)"
                      : "",
                  t->dev_comm ? "nccl (device buffers)" : "the host (pinned staging buffers)");
#endif
    t->t_start = loco_now();
    t->first_step = t->step;
    return 0;
}

/* Per MoE layer, what this rank's micro-batches of the step routed (rank
 * 0's; every dp rank's are alike in distribution): assignments per expert
 * before dropping, the fraction dropped, the load-balancing and z losses
 * (unscaled means over the micro-batches); with model.router_bias_rate,
 * the island's load imbalance and the routing biases' range. */
static int moe_metrics(loco_trainer *t) {
    loco_gpt *m = t->model;
    for (int i = 0; i < loco_gpt_moe_layers(m); i++) {
        loco_gpt_moe_stats st;
        loco_gpt_moe_layer(m, i, &st);
        char key[64];
        snprintf(key, sizeof key, "moe.%d.tokens_per_expert", st.block);
        loco_metrics_ints(t->metrics, key, st.routed, loco_gpt_cfg(m)->n_experts);
        snprintf(key, sizeof key, "moe.%d.dropped_frac", st.block);
        loco_metrics_num(t->metrics, key,
                         st.assignments ? (double)st.dropped / (double)st.assignments : 0);
        snprintf(key, sizeof key, "moe.%d.aux_loss", st.block);
        loco_metrics_num(t->metrics, key, st.aux);
        snprintf(key, sizeof key, "moe.%d.z_loss", st.block);
        loco_metrics_num(t->metrics, key, st.z);
        if (!st.load)
            continue;
        /* DeepSeek-V3's balancing: the island's load max over mean, and
         * the biases' range after the step */
        const int E = loco_gpt_cfg(m)->n_experts;
        int64_t most = 0, total = 0;
        float lo = st.bias[0], hi = st.bias[0];
        for (int e = 0; e < E; e++) {
            most = st.load[e] > most ? st.load[e] : most, total += st.load[e];
            lo = fminf(lo, st.bias[e]), hi = fmaxf(hi, st.bias[e]);
        }
        snprintf(key, sizeof key, "moe.%d.load_max_over_mean", st.block);
        loco_metrics_num(t->metrics, key, total ? (double)most * E / (double)total : 0);
        snprintf(key, sizeof key, "moe.%d.bias_min", st.block);
        loco_metrics_num(t->metrics, key, lo);
        snprintf(key, sizeof key, "moe.%d.bias_max", st.block);
        loco_metrics_num(t->metrics, key, hi);
    }
    return 0;
}

int loco_trainer_after_step(loco_trainer *t, const loco_step_stats *s) {
    const loco_config *c = &t->cfg;
    bool last = t->step == t->end_step;
    double elapsed = loco_now() - t->t_start;
    double eta = elapsed / (double)(t->step - t->first_step) * (double)(t->end_step - t->step);
    loco_metrics_begin(t->metrics);
    loco_metrics_int(t->metrics, "step", s->step);
    loco_metrics_num(t->metrics, "loss", s->loss);
    loco_metrics_num(t->metrics, "lr", s->lr);
    loco_metrics_num(t->metrics, "grad_norm", s->grad_norm);
    loco_metrics_num(t->metrics, "tokens_per_s", s->tokens_per_s);
    loco_metrics_num(t->metrics, "step_s", s->seconds);
    LOCO_CHECK(moe_metrics(t));
    LOCO_CHECK(loco_metrics_end(t->metrics));
    loco__train_prom_step(t->prom, s,
                          (int64_t)t->B * t->T * c->train.grad_accum * loco_comm_size(t->dp));
    if (s->step % c->run.log_every == 0 || s->step == t->first_step + 1 || last) {
        char e[32];
        format_eta(eta, e, sizeof e);
        loco_info("step %5lld/%lld | loss %.4f | lr %.2e | grad norm %.3f | %.0f tok/s | ETA %s",
                  (long long)s->step, (long long)t->end_step, s->loss, s->lr, s->grad_norm,
                  s->tokens_per_s, e);
    }
    if (t->val && ((c->run.eval_every > 0 && s->step % c->run.eval_every == 0) || last))
        LOCO_CHECK(evaluate_and_log(t));
    if ((c->run.ckpt_every > 0 && s->step % c->run.ckpt_every == 0) || last)
        LOCO_CHECK(checkpoint(t));
    return 0;
}

int loco_trainer_run(loco_trainer *t) {
    LOCO_CHECK(loco_trainer_begin_run(t));
    while (t->step < t->cfg.train.steps) {
        loco_step_stats s;
        LOCO_CHECK(loco_trainer_step(t, &s));
        LOCO_CHECK(loco_trainer_after_step(t, &s));
    }
    return 0;
}
