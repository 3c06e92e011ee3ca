/* The Llama family against PyTorch: a tiny Llama 3 (RMSNorm, RoPE with
 * Llama 3.1 scaling, grouped-query attention, SwiGLU, no biases, untied
 * head) from tests/fixtures/llama_tiny.safetensors (make_llama_fixtures.py,
 * Hugging Face names and [out, in] layouts), mapped here into loco's
 * layout: loss and every gradient; the same bits at each thread count and
 * under recompute; and the descriptions refused. */
#include "inner/model/model.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#define FIXTURE "tests/fixtures/llama_tiny.safetensors"
enum { B = 3, T = 13, L = 2, NH = 4, NKV = 2, C = 48, HS = 12, FF = 80, V = 97 };

static const loco_gpt_config llama_cfg = {
    .n_layer = L,
    .n_head = NH,
    .n_embd = C,
    .seq_len = 16,
    .vocab_size = V,
    .norm = LOCO_NORM_RMSNORM,
    .norm_eps = 1e-5f,
    .pos = LOCO_POS_ROPE,
    .rope_theta = 10000.0f,
    .rope_factor = 8.0f,
    .rope_low_freq = 1.0f,
    .rope_high_freq = 4.0f,
    .rope_original_max_pos = 8,
    .mlp = LOCO_MLP_SWIGLU,
    .ffn_hidden = FF,
    .n_kv_head = NKV,
    .no_bias = true,
    .untied = true,
};

static loco_st *fx;
static int32_t inputs[B * T], targets[B * T];

static const float *hf(const char *prefix, const char *name, int64_t rows, int64_t cols) {
    char full[160];
    snprintf(full, sizeof full, "%s%s", prefix, name);
    const float *x;
    int ndim;
    int64_t shape[4];
    cr_assert_eq(loco_st_get(fx, full, &x, &ndim, shape), 0, "%s: %s", full, loco_errmsg());
    cr_assert_eq(shape[0], rows, "%s rows", full);
    if (cols)
        cr_assert(ndim == 2 && shape[1] == cols, "%s cols", full);
    return x;
}

/* Writes w (out, in) transposed into dst's columns [col0, col0 + out) of a
 * (in, ld) matrix: loco's Conv1D layout. */
static void put_t(float *dst, int ld, int col0, const float *w, int out, int in) {
    for (int o = 0; o < out; o++)
        for (int i = 0; i < in; i++)
            dst[(size_t)i * ld + col0 + o] = w[(size_t)o * in + i];
}

/* The fixture's tensors named `prefix` + HF name (the weights, or with
 * "grad." their gradients) in loco's layout over model m's table. */
static void hf_to_loco(const loco_gpt *m, const char *prefix, float *dst) {
    const loco_ttable *tt = loco_gpt_table(m);
    memset(dst, 0, loco_gpt_num_params(m) * sizeof(float));
    const int W = (NH + 2 * NKV) * HS;
    for (int i = 0; i < tt->n; i++) {
        const loco_tensor *t = &tt->t[i];
        float *d = dst + t->offset;
        int l;
        char rest[96], name[128];
        if (!strcmp(t->name, "transformer.wte.weight"))
            memcpy(d, hf(prefix, "model.embed_tokens.weight", V, C), sizeof(float) * V * C);
        else if (!strcmp(t->name, "transformer.ln_f.weight"))
            memcpy(d, hf(prefix, "model.norm.weight", C, 0), sizeof(float) * C);
        else if (!strcmp(t->name, "lm_head.weight"))
            memcpy(d, hf(prefix, "lm_head.weight", V, C), sizeof(float) * V * C);
        else if (sscanf(t->name, "transformer.h.%d.%95s", &l, rest) == 2) {
#define HF(n, r, c) (snprintf(name, sizeof name, "model.layers.%d.%s", l, n), hf(prefix, name, r, c))
            if (!strcmp(rest, "ln_1.weight"))
                memcpy(d, HF("input_layernorm.weight", C, 0), sizeof(float) * C);
            else if (!strcmp(rest, "ln_2.weight"))
                memcpy(d, HF("post_attention_layernorm.weight", C, 0), sizeof(float) * C);
            else if (!strcmp(rest, "attn.c_attn.weight")) {
                put_t(d, W, 0, HF("self_attn.q_proj.weight", NH * HS, C), NH * HS, C);
                put_t(d, W, NH * HS, HF("self_attn.k_proj.weight", NKV * HS, C), NKV * HS, C);
                put_t(d, W, (NH + NKV) * HS, HF("self_attn.v_proj.weight", NKV * HS, C), NKV * HS,
                      C);
            } else if (!strcmp(rest, "attn.c_proj.weight"))
                put_t(d, C, 0, HF("self_attn.o_proj.weight", C, C), C, C);
            else if (!strcmp(rest, "mlp.c_fc.weight")) {
                put_t(d, 2 * FF, 0, HF("mlp.gate_proj.weight", FF, C), FF, C);
                put_t(d, 2 * FF, FF, HF("mlp.up_proj.weight", FF, C), FF, C);
            } else if (!strcmp(rest, "mlp.c_proj.weight"))
                put_t(d, C, 0, HF("mlp.down_proj.weight", C, FF), C, FF);
            else
                cr_assert_fail("unexpected tensor %s in a Llama table", t->name);
#undef HF
        } else
            cr_assert_fail("unexpected tensor %s in a Llama table", t->name);
    }
}

static loco_gpt *make(const loco_gpt_config *cfg, const loco_gpt_parallel *par) {
    loco_gpt *m = NULL;
    cr_assert_eq(loco_gpt_create_par(&m, cfg, B, T, 0, par), 0, "%s", loco_errmsg());
    hf_to_loco(m, "", loco_gpt_params(m));
    return m;
}

static void setup(void) {
    loco_set_threads(2);
    cr_assert_eq(loco_st_open(&fx, FIXTURE), 0, "%s", loco_errmsg());
    const float *tok = hf("", "tokens", B, T + 1);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            inputs[b * T + t] = (int32_t)tok[b * (T + 1) + t];
            targets[b * T + t] = (int32_t)tok[b * (T + 1) + t + 1];
        }
}

static void teardown(void) {
    loco_st_close(fx);
}

TestSuite(llama, .init = setup, .fini = teardown);

Test(llama, table_is_the_description) {
    loco_gpt *m = make(&llama_cfg, NULL);
    const loco_ttable *tt = loco_gpt_table(m);
    /* wte, 2 x (ln_1, c_attn, c_proj, ln_2, c_fc, c_proj), ln_f, lm_head */
    cr_expect_eq(tt->n, 1 + L * 6 + 2);
    const size_t want = (size_t)V * C * 2 + C +
                        L * ((size_t)2 * C + (size_t)C * (NH + 2 * NKV) * HS + (size_t)C * C +
                             (size_t)C * 2 * FF + (size_t)FF * C);
    cr_expect_eq(loco_gpt_num_params(m), want, "%zu parameters, want %zu",
                 loco_gpt_num_params(m), want);
    cr_expect_lt(loco_ttable_find(tt, "transformer.wpe.weight"), 0, "RoPE has no position table");
    cr_expect_lt(loco_ttable_find(tt, "transformer.h.0.attn.c_attn.bias"), 0, "no biases");
    cr_expect_lt(loco_ttable_find(tt, "transformer.h.0.ln_1.bias"), 0, "RMSNorm has no bias");
    loco_gpt_destroy(m);
}

/* max |a - b| <= rel * max |b| + abs, per tensor. */
static void expect_close(const char *what, const float *a, const float *b, size_t n, double rel) {
    double maxdiff = 0, maxref = 0;
    for (size_t i = 0; i < n; i++) {
        cr_assert(isfinite(a[i]), "%s[%zu] = %g", what, i, a[i]);
        maxdiff = fmax(maxdiff, fabs((double)a[i] - b[i]));
        maxref = fmax(maxref, fabs((double)b[i]));
    }
    cr_expect(maxdiff <= rel * maxref + 1e-7, "%s: max diff %g vs max |ref| %g", what, maxdiff,
              maxref);
}

Test(llama, loss_and_every_gradient_match_pytorch) {
    loco_gpt *m = make(&llama_cfg, NULL);
    loco_gpt_zero_grad(m);
    float loss;
    cr_assert_eq(loco_gpt_forward_backward(m, inputs, targets, B, T, 1.0f, &loss), 0, "%s",
                 loco_errmsg());
    const float want = *hf("", "loss", 1, 0);
    cr_expect(fabs(loss - want) <= 1e-5 * want, "loss %.9f, PyTorch %.9f", loss, want);
    const size_t P = loco_gpt_num_params(m);
    float *ref = malloc(P * sizeof(float));
    cr_assert_not_null(ref);
    hf_to_loco(m, "grad.", ref);
    const loco_ttable *tt = loco_gpt_table(m);
    for (int i = 0; i < tt->n; i++)
        expect_close(tt->t[i].name, loco_gpt_grads(m) + tt->t[i].offset, ref + tt->t[i].offset,
                     tt->t[i].numel, 1e-5);
    free(ref);
    loco_gpt_destroy(m);
}

/* Gradients of one pass, in a fresh buffer (caller frees). */
static float *grads_of(const loco_gpt_config *cfg, const loco_gpt_parallel *par, float *loss) {
    loco_gpt *m = make(cfg, par);
    loco_gpt_zero_grad(m);
    cr_assert_eq(loco_gpt_forward_backward(m, inputs, targets, B, T, 1.0f, loss), 0, "%s",
                 loco_errmsg());
    const size_t bytes = loco_gpt_num_params(m) * sizeof(float);
    float *g = malloc(bytes);
    cr_assert_not_null(g);
    memcpy(g, loco_gpt_grads(m), bytes);
    loco_gpt_destroy(m);
    return g;
}

/* The promise is per thread count (DESIGN: same config, seed and thread
 * count give the same bits): a second pass repeats every bit at one and at
 * two threads, and recompute changes none. Across thread counts OpenBLAS
 * may cut a GEMM's inner dimension differently (it does on AVX-512 EPYC),
 * so one and two threads agree to float rounding only. */
Test(llama, same_bits_at_each_thread_count_and_under_recompute) {
    const loco_gpt *probe = make(&llama_cfg, NULL);
    const size_t bytes = loco_gpt_num_params(probe) * sizeof(float);
    const loco_ttable *tt = loco_gpt_table(probe);
    float l2, l2b, l1, l1b, lf, ls;
    float *g2 = grads_of(&llama_cfg, NULL, &l2);
    float *g2b = grads_of(&llama_cfg, NULL, &l2b);
    loco_set_threads(1);
    float *g1 = grads_of(&llama_cfg, NULL, &l1);
    float *g1b = grads_of(&llama_cfg, NULL, &l1b);
    loco_set_threads(2);
    cr_expect(l2 == l2b && !memcmp(g2, g2b, bytes), "two passes on 2 threads differ");
    cr_expect(l1 == l1b && !memcmp(g1, g1b, bytes), "two passes on 1 thread differ");
    cr_expect(fabs(l1 - l2) <= 1e-6 * fabs(l2), "loss on 1 thread %.9g, on 2 %.9g", l1, l2);
    for (int i = 0; i < tt->n; i++)
        expect_close(tt->t[i].name, g1 + tt->t[i].offset, g2 + tt->t[i].offset,
                     tt->t[i].numel, 1e-6);
    const loco_gpt_parallel full = {.recompute = LOCO_RECOMPUTE_FULL};
    const loco_gpt_parallel sel = {.recompute = LOCO_RECOMPUTE_SELECTIVE};
    float *gf = grads_of(&llama_cfg, &full, &lf);
    float *gs = grads_of(&llama_cfg, &sel, &ls);
    cr_expect(lf == l2 && !memcmp(gf, g2, bytes), "full recompute changes the gradients");
    cr_expect(ls == l2 && !memcmp(gs, g2, bytes), "selective recompute changes the gradients");
    free(g1), free(g1b), free(g2), free(g2b), free(gf), free(gs);
    loco_gpt_destroy((loco_gpt *)probe);
}

/* Each feature alone on GPT-2 (the others at GPT-2's) runs and differs
 * from GPT-2: no path ignores a key. Dropping the biases, which GPT-2's
 * initialisation zeroes (and which draw nothing from the generator),
 * must give GPT-2's loss exactly. */
Test(llama, each_feature_changes_the_loss) {
    const loco_gpt_config gpt2 = {
        .n_layer = L, .n_head = NH, .n_embd = C, .seq_len = 16, .vocab_size = V};
    loco_gpt_config one[6];
    for (int i = 0; i < 6; i++)
        one[i] = gpt2;
    one[0].norm = LOCO_NORM_RMSNORM;
    one[1].pos = LOCO_POS_ROPE;
    one[2].mlp = LOCO_MLP_SWIGLU;
    one[3].n_kv_head = 1;
    one[4].no_bias = true;
    one[5].untied = true;
    float base = 0;
    for (int i = -1; i < 6; i++) {
        loco_gpt *m = NULL;
        cr_assert_eq(loco_gpt_create(&m, i < 0 ? &gpt2 : &one[i], B, T), 0, "%d: %s", i,
                     loco_errmsg());
        loco_rng rng;
        loco_rng_seed(&rng, 5);
        loco_gpt_init_weights(m, &rng);
        float loss;
        loco_gpt_zero_grad(m);
        cr_assert_eq(loco_gpt_forward_backward(m, inputs, targets, B, T, 1.0f, &loss), 0);
        cr_expect(isfinite(loss));
        if (i < 0)
            base = loss;
        else if (i == 4)
            cr_expect_eq(loss, base, "no_bias: %.9g, GPT-2 with zero biases %.9g", loss, base);
        else
            cr_expect_neq(loss, base, "feature %d leaves the loss at GPT-2's", i);
        loco_gpt_destroy(m);
    }
}

Test(llama, descriptions_refused_with_the_reason) {
    loco_gpt_config c = llama_cfg;
    c.n_kv_head = 3;
    loco_gpt *m = NULL;
    cr_expect_eq(loco_gpt_create(&m, &c, B, T), LOCO_EINVAL);
    cr_expect(strstr(loco_errmsg(), "model.n_kv_head = 3 must divide model.n_head = 4"), "%s",
              loco_errmsg());
    c = llama_cfg;
    c.n_head = 8; /* head size 6 */
    c.n_kv_head = 8;
    c.n_embd = 40; /* head size 5: odd */
    cr_expect_eq(loco_gpt_create(&m, &c, B, T), LOCO_EINVAL);
    cr_expect(strstr(loco_errmsg(), "even head size"), "%s", loco_errmsg());
    c = llama_cfg;
    c.norm = LOCO_NORM_LAYERNORM;
    c.norm_eps = 1e-6f;
    cr_expect_eq(loco_gpt_create(&m, &c, B, T), LOCO_EINVAL);
    cr_expect(strstr(loco_errmsg(), "layernorm runs at GPT-2's 1e-5 only"), "%s", loco_errmsg());
    c = llama_cfg;
    c.n_head = 12; /* head size 4 */
    c.n_kv_head = 3;
    c.tp = 2; /* 3 key/value heads: not split over 2, nor replicated */
    cr_expect_eq(loco_gpt_create(&m, &c, B, T), LOCO_EINVAL);
    cr_expect(strstr(loco_errmsg(), "neither divides the other"), "%s", loco_errmsg());
    c = llama_cfg;
    c.tp = 2;
    c.ffn_hidden = 81;
    cr_expect_eq(loco_gpt_create(&m, &c, B, T), LOCO_EINVAL);
    cr_expect(strstr(loco_errmsg(), "must divide the MLP's hidden width 81"), "%s", loco_errmsg());
    cr_expect_null(m);
}

/* The shipped Llama 3 configs are Meta's models: their parameter counts
 * are the published ones (Hugging Face's Meta-Llama-3-8B and -70B). */
Test(llama, llama3_configs_have_the_published_parameter_counts) {
    static const struct {
        const char *path;
        size_t params;
    } want[] = {{"configs/llama3-8b.ini", 8030261248u}, {"configs/llama3-70b.ini", 70553706496u}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        loco_config cfg;
        loco_config_defaults(&cfg);
        cr_assert_eq(loco_config_load(&cfg, want[i].path), 0, "%s", loco_errmsg());
        loco_gpt_config mc = loco_gpt_config_from(&cfg);
        loco_ttable tt;
        cr_assert_eq(loco_gpt_build_table(&tt, &mc), 0, "%s", loco_errmsg());
        cr_expect_eq(tt.numel, want[i].params, "%s: %zu parameters, Meta's model has %zu",
                     want[i].path, tt.numel, want[i].params);
        loco_ttable_fini(&tt);
    }
}
