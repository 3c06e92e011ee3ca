/* A Mixtral-style model against PyTorch: the tiny Llama of test_llama.c
 * with every MLP a mixture of 4 SwiGLU experts (top-2, dropless) and one
 * DeepSeek shared expert, from tests/fixtures/mixtral_tiny.safetensors
 * (make_llama_fixtures.py --mixtral: Hugging Face's MixtralForCausalLM
 * names and [out, in] layouts, the shared experts fused along the hidden
 * dimension as DeepSeek stores them), mapped here into loco's layout: the
 * cross-entropy and every gradient of the objective with the
 * load-balancing and z losses; the same bits at each thread count and under
 * recompute; the table, the FLOPs and what is refused. */
#include "inner/model/model.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#define FIXTURE "tests/fixtures/mixtral_tiny.safetensors"
enum { B = 3, T = 13, L = 2, NH = 4, NKV = 2, C = 48, HS = 12, FF = 40, V = 97, E = 4, S = 1 };

static const loco_gpt_config mixtral_cfg = {
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
    .n_experts = E,
    .top_k = 2,
    .moe_every = 1,
    .n_shared_experts = S,
    .capacity_factor = 0,
    .aux_loss = 0.1f,
    .z_loss = 0.01f,
};

static loco_st *fx;
static int32_t inputs[B * T], targets[B * T];

static const float *hf(const char *prefix, const char *name, int64_t rows, int64_t cols) {
    char full[200];
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

/* Writes w (out, in; rows w_ld apart) transposed into dst's columns
 * [col0, col0 + out) of a (in, ld) matrix: loco's Conv1D layout. */
static void put_t(float *dst, int ld, int col0, const float *w, int w_ld, int out, int in) {
    for (int o = 0; o < out; o++)
        for (int i = 0; i < in; i++)
            dst[(size_t)i * ld + col0 + o] = w[(size_t)o * w_ld + i];
}

/* An expert's c_fc (C, 2F) from its gate and up (F, C) each. */
static void put_fc(float *d, const float *gate, const float *up) {
    put_t(d, 2 * FF, 0, gate, C, FF, C);
    put_t(d, 2 * FF, FF, up, C, FF, C);
}

/* The fixture's tensors named `prefix` + HF name in loco's layout over
 * model m's table. */
static void hf_to_loco(const loco_gpt *m, const char *prefix, float *dst) {
    const loco_ttable *tt = loco_gpt_table(m);
    memset(dst, 0, loco_gpt_num_params(m) * sizeof(float));
    const int W = (NH + 2 * NKV) * HS;
    for (int i = 0; i < tt->n; i++) {
        const loco_tensor *t = &tt->t[i];
        float *d = dst + t->offset;
        int l, j;
        char rest[96], name[160], part[32];
        if (!strcmp(t->name, "transformer.wte.weight"))
            memcpy(d, hf(prefix, "model.embed_tokens.weight", V, C), sizeof(float) * V * C);
        else if (!strcmp(t->name, "transformer.ln_f.weight"))
            memcpy(d, hf(prefix, "model.norm.weight", C, 0), sizeof(float) * C);
        else if (!strcmp(t->name, "lm_head.weight"))
            memcpy(d, hf(prefix, "lm_head.weight", V, C), sizeof(float) * V * C);
        else if (sscanf(t->name, "transformer.h.%d.%95s", &l, rest) == 2) {
#define HF(n, r, c)                                                                                \
    (snprintf(name, sizeof name, "model.layers.%d.%s", l, n), hf(prefix, name, r, c))
#define MOE(fmt, x, r, c)                                                                          \
    (snprintf(part, sizeof part, fmt, x),                                                          \
     snprintf(name, sizeof name, "model.layers.%d.block_sparse_moe.%s", l, part),                  \
     hf(prefix, name, r, c))
            if (!strcmp(rest, "ln_1.weight"))
                memcpy(d, HF("input_layernorm.weight", C, 0), sizeof(float) * C);
            else if (!strcmp(rest, "ln_2.weight"))
                memcpy(d, HF("post_attention_layernorm.weight", C, 0), sizeof(float) * C);
            else if (!strcmp(rest, "attn.c_attn.weight")) {
                put_t(d, W, 0, HF("self_attn.q_proj.weight", NH * HS, C), C, NH * HS, C);
                put_t(d, W, NH * HS, HF("self_attn.k_proj.weight", NKV * HS, C), C, NKV * HS, C);
                put_t(d, W, (NH + NKV) * HS, HF("self_attn.v_proj.weight", NKV * HS, C), C,
                      NKV * HS, C);
            } else if (!strcmp(rest, "attn.c_proj.weight"))
                put_t(d, C, 0, HF("self_attn.o_proj.weight", C, C), C, C, C);
            else if (!strcmp(rest, "mlp.router.weight")) /* both (E, C) */
                memcpy(d, MOE("%s", "gate.weight", E, C), sizeof(float) * E * C);
            else if (sscanf(rest, "mlp.experts.%d.%31s", &j, part) == 2 &&
                     !strcmp(part, "c_fc.weight")) {
                const float *gate = MOE("experts.%d.w1.weight", j, FF, C);
                put_fc(d, gate, MOE("experts.%d.w3.weight", j, FF, C));
            } else if (sscanf(rest, "mlp.experts.%d.%31s", &j, part) == 2 &&
                       !strcmp(part, "c_proj.weight"))
                put_t(d, C, 0, MOE("experts.%d.w2.weight", j, C, FF), FF, C, FF);
            else if (sscanf(rest, "mlp.shared_experts.%d.%31s", &j, part) == 2 &&
                     !strcmp(part, "c_fc.weight")) {
                /* shared expert j: rows [j F, (j + 1) F) of the fused gate and up */
                const float *gate = MOE("%s", "shared_experts.gate_proj.weight", S * FF, C);
                const float *up = MOE("%s", "shared_experts.up_proj.weight", S * FF, C);
                put_fc(d, gate + (size_t)j * FF * C, up + (size_t)j * FF * C);
            } else if (sscanf(rest, "mlp.shared_experts.%d.%31s", &j, part) == 2 &&
                       !strcmp(part, "c_proj.weight"))
                put_t(d, C, 0, MOE("%s", "shared_experts.down_proj.weight", C, S * FF) + j * FF,
                      S * FF, C, FF);
            else
                cr_assert_fail("unexpected tensor %s in a Mixtral table", t->name);
#undef HF
#undef MOE
        } else
            cr_assert_fail("unexpected tensor %s in a Mixtral table", t->name);
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

TestSuite(mixtral, .init = setup, .fini = teardown);

Test(mixtral, table_holds_swiglu_experts_and_the_shared_one) {
    loco_gpt *m = make(&mixtral_cfg, NULL);
    const loco_ttable *tt = loco_gpt_table(m);
    /* wte; per block ln_1, c_attn, c_proj, ln_2, router, (1 + 4) experts x
     * (c_fc, c_proj); ln_f, lm_head */
    cr_expect_eq(tt->n, 1 + L * (5 + (S + E) * 2) + 2);
    const size_t expert = (size_t)C * 2 * FF + (size_t)FF * C;
    cr_expect_eq(loco_gpt_expert_size(&mixtral_cfg), expert);
    const size_t want = (size_t)V * C * 2 + C +
                        L * ((size_t)2 * C + (size_t)C * (NH + 2 * NKV) * HS + (size_t)C * C +
                             (size_t)E * C + (S + E) * expert);
    cr_expect_eq(loco_gpt_num_params(m), want, "%zu parameters, want %zu", loco_gpt_num_params(m),
                 want);
    const char *names[] = {"transformer.h.0.mlp.router.weight",
                           "transformer.h.0.mlp.shared_experts.0.c_fc.weight",
                           "transformer.h.1.mlp.experts.3.c_proj.weight"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        cr_expect(loco_ttable_find(tt, names[i]) >= 0, "%s", names[i]);
    cr_expect_lt(loco_ttable_find(tt, "transformer.h.0.mlp.experts.0.c_fc.bias"), 0, "no biases");
    cr_expect_lt(loco_ttable_find(tt, "transformer.h.0.mlp.c_fc.weight"), 0, "no dense MLP");
    /* the shared experts lie before the routed ones, and the views say so */
    const int sh = loco_ttable_find(tt, "transformer.h.1.mlp.shared_experts.0.c_fc.weight");
    const int ex = loco_ttable_find(tt, "transformer.h.1.mlp.experts.0.c_fc.weight");
    const int pj = loco_ttable_find(tt, "transformer.h.1.mlp.experts.2.c_proj.weight");
    cr_expect_lt(sh, ex);
    const loco_gpt_block *b = &loco_gpt_param_views(m)->h[1];
    cr_expect_eq(b->shared, loco_gpt_params(m) + tt->t[sh].offset);
    cr_expect_eq(b->experts, loco_gpt_params(m) + tt->t[ex].offset);
    const loco_gpt_expert x = loco_gpt_expert_at(&mixtral_cfg, b->experts, 2);
    cr_expect_eq(x.projw, loco_gpt_params(m) + tt->t[pj].offset);
    cr_expect_null(x.fcb);
    cr_expect_null(x.projb);
    loco_gpt_destroy(m);
}

/* max |a - b| <= rel * max |b| + 1e-7, per tensor. */
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

Test(mixtral, loss_and_every_gradient_match_pytorch) {
    loco_gpt *m = make(&mixtral_cfg, NULL);
    loco_gpt_zero_grad(m);
    loco_gpt_moe_reset(m);
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
    cr_expect_eq(loco_gpt_moe_layers(m), L);
    for (int i = 0; i < L; i++) {
        loco_gpt_moe_stats st;
        loco_gpt_moe_layer(m, i, &st);
        cr_expect_eq(st.dropped, 0, "dropless");
        cr_expect_eq(st.assignments, (int64_t)B * T * 2);
    }
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
Test(mixtral, same_bits_at_each_thread_count_and_under_recompute) {
    const loco_gpt *probe = make(&mixtral_cfg, NULL);
    const size_t bytes = loco_gpt_num_params(probe) * sizeof(float);
    const loco_ttable *tt = loco_gpt_table(probe);
    float l2, l2b, l1, l1b, lf, ls;
    float *g2 = grads_of(&mixtral_cfg, NULL, &l2);
    float *g2b = grads_of(&mixtral_cfg, NULL, &l2b);
    loco_set_threads(1);
    float *g1 = grads_of(&mixtral_cfg, NULL, &l1);
    float *g1b = grads_of(&mixtral_cfg, NULL, &l1b);
    loco_set_threads(2);
    cr_expect(l2 == l2b && !memcmp(g2, g2b, bytes), "two passes on 2 threads differ");
    cr_expect(l1 == l1b && !memcmp(g1, g1b, bytes), "two passes on 1 thread differ");
    cr_expect(fabs(l1 - l2) <= 1e-6 * fabs(l2), "loss on 1 thread %.9g, on 2 %.9g", l1, l2);
    for (int i = 0; i < tt->n; i++)
        expect_close(tt->t[i].name, g1 + tt->t[i].offset, g2 + tt->t[i].offset,
                     tt->t[i].numel, 1e-6);
    const loco_gpt_parallel full = {.recompute = LOCO_RECOMPUTE_FULL};
    const loco_gpt_parallel sel = {.recompute = LOCO_RECOMPUTE_SELECTIVE};
    float *gf = grads_of(&mixtral_cfg, &full, &lf);
    float *gs = grads_of(&mixtral_cfg, &sel, &ls);
    cr_expect(lf == l2 && !memcmp(gf, g2, bytes), "full recompute changes the gradients");
    cr_expect(ls == l2 && !memcmp(gs, g2, bytes), "selective recompute changes the gradients");
    free(g1), free(g1b), free(g2), free(g2b), free(gf), free(gs);
    loco_gpt_destroy((loco_gpt *)probe);
}

/* A token meets its top_k experts, the shared ones and the router: each
 * shared expert adds one SwiGLU MLP's matmuls (C x 2F + F x C) per block. */
Test(mixtral, flops_count_the_shared_experts) {
    loco_gpt_config none = mixtral_cfg;
    none.n_shared_experts = 0;
    const double d = loco_gpt_flops_per_token(&mixtral_cfg, T) - loco_gpt_flops_per_token(&none, T);
    cr_expect_eq(d, 6.0 * L * S * ((double)C * 2 * FF + (double)FF * C));
}

Test(mixtral, shared_experts_without_routed_ones_are_refused) {
    loco_gpt_config c = mixtral_cfg;
    c.n_experts = 0;
    loco_gpt *m = NULL;
    cr_expect_eq(loco_gpt_create(&m, &c, B, T), LOCO_EINVAL);
    cr_expect(strstr(loco_errmsg(), "model.n_shared_experts = 1 needs routed experts"), "%s",
              loco_errmsg());
    c = mixtral_cfg;
    c.tp = 2; /* refused for want of a tp group (test_mixtral_mesh.c runs one) */
    cr_expect_eq(loco_gpt_create(&m, &c, B, T), LOCO_EINVAL);
    cr_expect(strstr(loco_errmsg(), "needs a group of 2 ranks"), "%s", loco_errmsg());
    cr_expect_null(m);
}
