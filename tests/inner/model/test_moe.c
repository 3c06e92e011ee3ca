/* Mixture of experts: the whole MoE model (block 1 an MoE layer with 4
 * experts, top-2, capacity factor 1 so that some assignments are dropped)
 * against PyTorch (tests/fixtures/gpt2_moe_tiny.safetensors, written by
 * make_fixtures.py --moe): the cross-entropy, every gradient of the
 * objective with the load-balancing and z losses, the routed counts, the
 * dropped assignments and the losses' values; the routing kernels'
 * tie-breaking and capacity against hand-made cases; what is refused. */
#include "inner/model/model.h"
#include "kernels/kernels.h"

#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#define FIXTURE "tests/fixtures/gpt2_moe_tiny.safetensors"
enum { B = 3, T = 13 };

static const loco_gpt_config moe_cfg = {.n_layer = 2,
                                        .n_head = 4,
                                        .n_embd = 32,
                                        .seq_len = 16,
                                        .vocab_size = 97,
                                        .n_experts = 4,
                                        .top_k = 2,
                                        .moe_every = 2,
                                        .capacity_factor = 1.0f,
                                        .aux_loss = 0.1f,
                                        .z_loss = 0.01f};

static loco_st *fx;
static loco_gpt *model = NULL;
static int32_t inputs[B * T], targets[B * T];

static void setup(void) {
    loco_set_threads(2);
    cr_assert_eq(loco_st_open(&fx, FIXTURE), 0, "%s", loco_errmsg());
    cr_assert_eq(loco_gpt_create(&model, &moe_cfg, B, T), 0, "%s", loco_errmsg());
    cr_assert_eq(loco_st_read_into(fx, loco_gpt_table(model), loco_gpt_params(model), NULL), 0,
                 "%s", loco_errmsg());
    const float *tok;
    cr_assert_eq(loco_st_get(fx, "tokens", &tok, NULL, NULL), 0);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            inputs[b * T + t] = (int32_t)tok[b * (T + 1) + t];
            targets[b * T + t] = (int32_t)tok[b * (T + 1) + t + 1];
        }
}

static void teardown(void) {
    loco_gpt_destroy(model);
    loco_st_close(fx);
}

static const float *fixture(const char *name) {
    const float *x;
    cr_assert_eq(loco_st_get(fx, name, &x, NULL, NULL), 0, "%s", name);
    return x;
}

TestSuite(moe, .init = setup, .fini = teardown);

Test(moe, table_names_the_router_and_experts) {
    const char *names[] = {"transformer.h.1.mlp.router.weight",
                           "transformer.h.1.mlp.experts.0.c_fc.weight",
                           "transformer.h.1.mlp.experts.3.c_proj.bias",
                           "transformer.h.0.mlp.c_fc.weight"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        cr_expect(loco_ttable_find(loco_gpt_table(model), names[i]) >= 0, "%s", names[i]);
    cr_expect_eq(loco_ttable_find(loco_gpt_table(model), "transformer.h.1.mlp.c_fc.weight"), -1);
    cr_expect_eq(loco_gpt_moe_layers(model), 1);
}

Test(moe, loss_gradients_and_routing_match_pytorch) {
    float loss;
    loco_gpt_zero_grad(model);
    loco_gpt_moe_reset(model);
    cr_assert_eq(loco_gpt_forward_backward(model, inputs, targets, B, T, 1.0f, &loss), 0, "%s",
                 loco_errmsg());
    const float want = fixture("loss")[0];
    cr_expect(fabsf(loss - want) <= 1e-5f * want, "loss %.8f, PyTorch %.8f", loss, want);
    for (int i = 0; i < loco_gpt_table(model)->n; i++) {
        const loco_tensor *t = &loco_gpt_table(model)->t[i];
        char name[200];
        snprintf(name, sizeof name, "grad.%s", t->name);
        const float *ref = fixture(name);
        double maxdiff = 0, maxref = 0;
        for (size_t j = 0; j < t->numel; j++) {
            maxdiff = fmax(maxdiff, fabs((double)loco_gpt_grads(model)[t->offset + j] - ref[j]));
            maxref = fmax(maxref, fabs((double)ref[j]));
        }
        cr_expect(maxdiff <= 1e-4 * maxref + 1e-7, "%s: max diff %g vs max |ref| %g", name,
                  maxdiff, maxref);
    }
    loco_gpt_moe_stats st;
    loco_gpt_moe_layer(model, 0, &st);
    cr_expect_eq(st.block, 1);
    cr_expect_eq(st.assignments, (int64_t)B * T * 2);
    cr_expect_eq(st.dropped, (int64_t)fixture("moe.dropped")[0]);
    for (int e = 0; e < 4; e++)
        cr_expect_eq(st.routed[e], (int64_t)fixture("moe.routed")[e], "expert %d", e);
    cr_expect(fabs(st.aux - fixture("moe.aux")[0]) <= 1e-5 * fixture("moe.aux")[0], "aux %g vs %g",
              st.aux, fixture("moe.aux")[0]);
    cr_expect(fabs(st.z - fixture("moe.z")[0]) <= 1e-5 * fixture("moe.z")[0], "z %g vs %g", st.z,
              fixture("moe.z")[0]);
}

/* Equal probabilities: the lower expert index is chosen first; equal
 * priorities for a slot: the earlier token keeps it. */
Test(moe, routing_breaks_ties_by_index_and_position) {
    enum { N = 4, E = 3, K = 2 };
    const float logits[N * E] = {0, 0, 0, 1, 1, 0, 0, 2, 2, 5, 0, 0};
    float probs[N * E], lse[N], weight[N * K];
    int32_t expert[N * K];
    loco_moe_route(probs, lse, expert, weight, logits, NULL, N, E, K);
    const int32_t want[N * K] = {0, 1, 0, 1, 1, 2, 0, 1};
    for (int i = 0; i < N * K; i++)
        cr_expect_eq(expert[i], want[i], "choice %d", i);
    for (int t = 0; t < N; t++)
        cr_expect(fabsf(weight[t * K] + weight[t * K + 1] - 1.0f) < 1e-6f, "token %d", t);
    cr_expect(fabsf(weight[0] - 0.5f) < 1e-6f);
    /* capacity 2: expert 0 is wanted by tokens 0 (p 1/3), 1 (p e/(2e+1)),
     * 3 (p ~0.99): 3 and 1 keep their slots, token 0's is dropped */
    int32_t slot[N * K], rows[N * K], count[E], routed[E];
    float scratch[3 * N * K];
    const int n = loco_moe_plan(slot, rows, count, routed, expert, probs, N, E, K, 2, scratch);
    cr_expect_eq(routed[0], 3);
    cr_expect_eq(count[0], 2);
    cr_expect_eq(slot[0], -1, "token 0's first choice is dropped");
    cr_expect_eq(rows[0], 1); /* kept rows in token order */
    cr_expect_eq(rows[1], 3);
    cr_expect_eq(n, count[0] + count[1] + count[2]);
    /* expert 1: tokens 0, 1, 2, 3 all want it; priorities p = 1/3, e/(2e+1)
     * = 0.42, e^2/(2e^2+1) = 0.47, 1/(e^5+2) = 0.0066: 2 and 1 keep it */
    cr_expect_eq(routed[1], 4);
    cr_expect_eq(count[1], 2);
    cr_expect_eq(slot[0 * K + 1], -1);
    cr_expect(slot[1 * K + 1] >= 0 && slot[2 * K + 0] >= 0);
    cr_expect_eq(slot[3 * K + 1], -1);
}

/* Every assignment kept once the capacity is the token count (dropless). */
Test(moe, dropless_keeps_every_assignment) {
    loco_gpt_config c = moe_cfg;
    c.capacity_factor = 0;
    loco_gpt *m = NULL;
    cr_assert_eq(loco_gpt_create(&m, &c, B, T), 0);
    memcpy(loco_gpt_params(m), loco_gpt_params(model), loco_gpt_num_params(m) * sizeof(float));
    float loss;
    cr_assert_eq(loco_gpt_forward(m, inputs, targets, B, T, &loss), 0);
    loco_gpt_moe_stats st;
    loco_gpt_moe_layer(m, 0, &st);
    cr_expect_eq(st.dropped, 0);
    int64_t sum = 0;
    for (int e = 0; e < 4; e++)
        sum += st.routed[e];
    cr_expect_eq(sum, (int64_t)B * T * 2);
    loco_gpt_destroy(m);
}

Test(moe, what_is_not_built_or_wrong_is_refused) {
    loco_gpt *m = NULL;
    loco_gpt_config c = moe_cfg;
    c.top_k = 5;
    cr_expect_eq(loco_gpt_create(&m, &c, B, T), LOCO_EINVAL);
    cr_expect(strstr(loco_errmsg(), "model.top_k = 5 must be between 1 and model.n_experts = 4"),
              "%s", loco_errmsg());
    c = moe_cfg;
    c.tp = 2;
    loco_gpt_parallel par = {0};
    cr_expect_neq(loco_gpt_create_par(&m, &c, B, T, 0, &par), 0);
}

/* DeepSeek-V3's routing bias: the top-k by probability + bias (an
 * insertion sort of the scores here, stable: ties to the lower index), the
 * weights from the unbiased probabilities of the chosen experts over their
 * sum. */
Test(moe, routing_bias_chooses_and_the_probabilities_weigh) {
    enum { N = 37, E = 6, K = 2 };
    float logits[N * E], bias[E] = {-0.3f, 0.25f, 0, 0.1f, -0.05f, 0.4f};
    uint64_t x = 12345;
    for (int i = 0; i < N * E; i++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        logits[i] = (float)((double)(x >> 11) / 9007199254740992.0 * 4 - 2);
    }
    float probs[N * E], lse[N], weight[N * K];
    int32_t expert[N * K];
    loco_moe_route(probs, lse, expert, weight, logits, bias, N, E, K);
    int differ = 0; /* tokens whose first choice the bias changed */
    for (int t = 0; t < N; t++) {
        double p[E], mx = logits[t * E], s = 0;
        for (int e = 1; e < E; e++)
            mx = fmax(mx, logits[t * E + e]);
        for (int e = 0; e < E; e++)
            s += p[e] = exp(logits[t * E + e] - mx);
        int order[E];
        for (int e = 0; e < E; e++) {
            p[e] /= s;
            int i = e;
            for (; i > 0 && p[order[i - 1]] + bias[order[i - 1]] < p[e] + bias[e]; i--)
                order[i] = order[i - 1];
            order[i] = e;
        }
        double S = 0;
        for (int j = 0; j < K; j++)
            S += p[order[j]];
        int top = 0;
        for (int e = 1; e < E; e++)
            top = p[e] > p[top] ? e : top;
        differ += order[0] != top;
        for (int j = 0; j < K; j++) {
            cr_expect_eq(expert[t * K + j], order[j], "token %d choice %d", t, j);
            cr_expect(fabs(weight[t * K + j] - p[order[j]] / S) < 1e-6, "token %d weight %d", t, j);
        }
    }
    cr_expect(differ > 0, "the bias changed no token's first choice: the test proves nothing");
}
