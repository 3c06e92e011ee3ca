/* The whole GPT-2 against PyTorch: loss, every parameter gradient and three
 * AdamW steps, from tests/fixtures/gpt2_tiny.safetensors (make_fixtures.py). */
#include "inner/model/model.h"
#include "inner/optim/optim.h"

#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#define FIXTURE "tests/fixtures/gpt2_tiny.safetensors"

static loco_st *fx;
static loco_gpt *model = NULL;
static int32_t inputs[3 * 13], targets[3 * 13];
static const loco_gpt_config fx_cfg = {
    .n_layer = 2, .n_head = 4, .n_embd = 48, .seq_len = 16, .vocab_size = 97};

static void setup(void) {
    loco_set_threads(2);
    cr_assert_eq(loco_st_open(&fx, FIXTURE), 0, "%s", loco_errmsg());
    cr_assert_eq(loco_gpt_create(&model, &fx_cfg, 3, 13), 0, "%s", loco_errmsg());
    cr_assert_eq(loco_st_read_into(fx, loco_gpt_table(model), loco_gpt_params(model), NULL), 0,
                 "%s", loco_errmsg());
    const float *tok;
    int64_t shape[4];
    int ndim;
    cr_assert_eq(loco_st_get(fx, "tokens", &tok, &ndim, shape), 0);
    cr_assert(ndim == 2 && shape[0] == 3 && shape[1] == 14);
    for (int b = 0; b < 3; b++)
        for (int t = 0; t < 13; t++) {
            inputs[b * 13 + t] = (int32_t)tok[b * 14 + t];
            targets[b * 13 + t] = (int32_t)tok[b * 14 + t + 1];
        }
}

static void teardown(void) {
    loco_gpt_destroy(model);
    loco_st_close(fx);
}

static float fixture_scalar(const char *name, int i) {
    const float *x;
    cr_assert_eq(loco_st_get(fx, name, &x, NULL, NULL), 0, "%s", name);
    return x[i];
}

/* Whole-tensor comparison: max |a - b| <= rel * max |b| + abs. */
static void assert_close(const char *what, const float *a, const float *b, size_t n, double rel,
                         double abs_tol) {
    double maxdiff = 0, maxref = 0;
    for (size_t i = 0; i < n; i++) {
        maxdiff = fmax(maxdiff, fabs((double)a[i] - b[i]));
        maxref = fmax(maxref, fabs((double)b[i]));
    }
    cr_expect(maxdiff <= rel * maxref + abs_tol, "%s: max diff %g vs max |ref| %g", what, maxdiff,
              maxref);
}

TestSuite(model, .init = setup, .fini = teardown);

Test(model, table_has_hf_names_and_layouts) {
    int i = loco_ttable_find(loco_gpt_table(model), "transformer.h.1.attn.c_attn.weight");
    cr_assert(i >= 0);
    cr_expect_eq(loco_gpt_table(model)->t[i].shape[0], 48);
    cr_expect_eq(loco_gpt_table(model)->t[i].shape[1], 144);
    cr_expect_eq(loco_gpt_table(model)->t[0].offset, 0);
    cr_expect_str_eq(loco_gpt_table(model)->t[loco_gpt_table(model)->n - 1].name,
                     "transformer.ln_f.bias");
    cr_expect_eq(loco_gpt_table(model)->numel, loco_gpt_num_params(model));
}

Test(model, forward_loss_matches_pytorch) {
    float loss;
    cr_assert_eq(loco_gpt_forward(model, inputs, targets, 3, 13, &loss), 0);
    float want = fixture_scalar("loss", 0);
    cr_expect(fabsf(loss - want) <= 1e-5f * want, "loss %.8f, PyTorch %.8f", loss, want);
}

Test(model, every_gradient_matches_pytorch) {
    float loss;
    loco_gpt_zero_grad(model);
    cr_assert_eq(loco_gpt_forward_backward(model, inputs, targets, 3, 13, 1.0f, &loss), 0);
    cr_expect(fabsf(loss - fixture_scalar("loss", 0)) <= 1e-5f * loss);
    for (int i = 0; i < loco_gpt_table(model)->n; i++) {
        const loco_tensor *t = &loco_gpt_table(model)->t[i];
        char name[160];
        snprintf(name, sizeof name, "grad.%s", t->name);
        const float *ref;
        cr_assert_eq(loco_st_get(fx, name, &ref, NULL, NULL), 0, "%s", name);
        assert_close(name, loco_gpt_grads(model) + t->offset, ref, t->numel, 1e-4, 1e-7);
    }
}

Test(model, gradients_accumulate_over_micro_batches) {
    float loss;
    loco_gpt_zero_grad(model);
    cr_assert_eq(loco_gpt_forward_backward(model, inputs, targets, 3, 13, 0.5f, &loss), 0);
    cr_assert_eq(loco_gpt_forward_backward(model, inputs, targets, 3, 13, 0.5f, &loss), 0);
    const float *ref;
    cr_assert_eq(loco_st_get(fx, "grad.transformer.wte.weight", &ref, NULL, NULL), 0);
    assert_close("accumulated wte grad", loco_gpt_grads(model), ref, (size_t)97 * 48, 1e-4, 1e-7);
}

Test(model, adamw_steps_match_pytorch) {
    loco_config cfg;
    loco_config_defaults(&cfg);
    cfg.train.beta1 = 0.9, cfg.train.beta2 = 0.95, cfg.train.eps = 1e-8;
    cfg.train.weight_decay = 0.1;
    loco_adamw opt;
    cr_assert_eq(loco_adamw_init(&opt, loco_gpt_num_params(model), &cfg), 0);
    for (int s = 0; s < 3; s++) {
        float loss;
        loco_gpt_zero_grad(model);
        cr_assert_eq(loco_gpt_forward_backward(model, inputs, targets, 3, 13, 1.0f, &loss), 0);
        float want = fixture_scalar("adamw.losses", s);
        cr_expect(fabsf(loss - want) <= 2e-5f * want, "step %d loss %.8f, PyTorch %.8f", s, loss,
                  want);
        loco_adamw_step(&opt, loco_gpt_table(model), loco_gpt_params(model), loco_gpt_grads(model),
                        1e-3f);
    }
    for (int i = 0; i < loco_gpt_table(model)->n; i++) {
        const loco_tensor *t = &loco_gpt_table(model)->t[i];
        char name[160];
        snprintf(name, sizeof name, "adamw.%s", t->name);
        const float *ref;
        cr_assert_eq(loco_st_get(fx, name, &ref, NULL, NULL), 0, "%s", name);
        /* Absolute: updates are ~3e-3, and the key bias has a zero true
         * gradient that Adam turns into noise of ~5e-6 (fixtures README). */
        assert_close(name, loco_gpt_params(model) + t->offset, ref, t->numel, 0, 2e-5);
    }
    loco_adamw_fini(&opt);
}

Test(model, rejects_tokens_outside_vocabulary) {
    int32_t bad[3 * 13];
    memcpy(bad, inputs, sizeof bad);
    bad[7] = 97;
    float loss;
    cr_expect_eq(loco_gpt_forward(model, bad, targets, 3, 13, &loss), LOCO_EINVAL);
    cr_expect(strstr(loco_errmsg(), "outside the vocabulary") != NULL);
    cr_expect_eq(loco_gpt_forward(model, inputs, targets, 4, 13, &loss), LOCO_EINVAL);
}

Test(model, init_weights_follow_gpt2) {
    loco_gpt *m = NULL;
    loco_gpt_config c = {.n_layer = 6, .n_head = 4, .n_embd = 64, .seq_len = 32,
                         .vocab_size = 300};
    cr_assert_eq(loco_gpt_create(&m, &c, 1, 8), 0);
    loco_rng rng;
    loco_rng_seed(&rng, 7);
    loco_gpt_init_weights(m, &rng);
    double s2 = 0, p2 = 0;
    size_t nw = (size_t)300 * 64, np = (size_t)256 * 64;
    for (size_t i = 0; i < nw; i++)
        s2 += (double)loco_gpt_param_views(m)->wte[i] * loco_gpt_param_views(m)->wte[i];
    for (size_t i = 0; i < np; i++)
        p2 += (double)loco_gpt_param_views(m)->h[3].fcprojw[i] *
              loco_gpt_param_views(m)->h[3].fcprojw[i];
    cr_expect(fabs(sqrt(s2 / nw) - 0.02) < 0.001, "wte std %g", sqrt(s2 / nw));
    double want = 0.02 / sqrt(12.0);
    cr_expect(fabs(sqrt(p2 / np) - want) < 0.0005, "c_proj std %g, want %g", sqrt(p2 / np), want);
    cr_expect_eq(loco_gpt_param_views(m)->h[0].ln1w[5], 1.0f);
    cr_expect_eq(loco_gpt_param_views(m)->h[0].qkvb[5], 0.0f);
    loco_gpt_destroy(m);
}
