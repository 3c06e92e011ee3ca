/* Pipeline stages of the model: stages that run their chunks one at a
 * time (forward, the input half B and the weight half W of the backward,
 * several micro-batches in their own activation slots) reproduce the whole
 * model's loss and gradients bit for bit, for a two-stage split and a
 * V-shaped one; their tables, and the stages that cannot be built. */
#include "inner/model/model.h"
#include "inner/parallel/parallel.h"

#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

enum { L = 4, Bm = 2, Tm = 8, N = Bm * Tm, MB = 2 };
static const loco_gpt_config cfg = {
    .n_layer = L, .n_head = 2, .n_embd = 16, .seq_len = Tm, .vocab_size = 37};
static int32_t inputs[MB][N], targets[MB][N];

static void setup(void) {
    loco_set_threads(1);
    loco_rng rng;
    loco_rng_seed(&rng, 99);
    for (int m = 0; m < MB; m++)
        for (int i = 0; i < N; i++) {
            inputs[m][i] = (int32_t)(loco_rng_u64(&rng) % (uint64_t)cfg.vocab_size);
            targets[m][i] = (int32_t)(loco_rng_u64(&rng) % (uint64_t)cfg.vocab_size);
        }
}

TestSuite(model_stage, .init = setup);

static loco_gpt_stage stage_of(int n, const int *first, const int *end, int slots) {
    loco_gpt_stage s = {.n = n, .slots = slots};
    for (int i = 0; i < n; i++)
        s.first[i] = first[i], s.end[i] = end[i];
    return s;
}

/* A model (whole, or a stage with `recompute`) initialised from seed 7. */
static loco_gpt *make(const loco_gpt_stage *st, loco_recompute recompute) {
    loco_gpt_parallel par = {.stage = st, .recompute = recompute};
    loco_gpt *m = NULL;
    cr_assert_eq(loco_gpt_create_par(&m, &cfg, Bm, Tm, 0, &par), 0, "%s", loco_errmsg());
    loco_rng rng;
    loco_rng_seed(&rng, 7);
    loco_gpt_init_weights(m, &rng);
    loco_gpt_zero_grad(m);
    return m;
}

/* The whole model's losses and gradients over the micro-batches. */
static loco_gpt *whole(float *loss) {
    loco_gpt *w = make(NULL, LOCO_RECOMPUTE_NONE);
    for (int m = 0; m < MB; m++)
        cr_assert_eq(
            loco_gpt_forward_backward(w, inputs[m], targets[m], Bm, Tm, 1.0f / MB, &loss[m]), 0,
            "%s", loco_errmsg());
    return w;
}

/* Every tensor of stage s against the whole model: parameters always bit
 * for bit; gradients bit for bit, except wte when wte_other is given (its
 * head and embedding parts then meet in a sum of another order): within
 * 1e-6 of the largest, after adding wte_other (the other stage's copy's
 * gradient, or zeros). */
static void expect_like_whole(const loco_gpt *s, const loco_gpt *w, const float *wte_other) {
    for (int i = 0; i < loco_gpt_table(s)->n; i++) {
        const loco_tensor *t = &loco_gpt_table(s)->t[i];
        const int j = loco_ttable_find(loco_gpt_table(w), t->name);
        cr_assert(j >= 0, "%s not in the whole model", t->name);
        const loco_tensor *u = &loco_gpt_table(w)->t[j];
        cr_assert_eq(t->numel, u->numel, "%s", t->name);
        cr_expect_eq(
            memcmp(loco_gpt_params(s) + t->offset, loco_gpt_params(w) + u->offset, t->numel * 4), 0,
            "%s: parameters differ", t->name);
        const float *gs = loco_gpt_grads(s) + t->offset, *gw = loco_gpt_grads(w) + u->offset;
        if (strcmp(t->name, "transformer.wte.weight") || !wte_other) {
            size_t bad = 0;
            for (size_t k = 0; k < t->numel; k++)
                bad += memcmp(&gs[k], &gw[k], 4) != 0;
            cr_expect_eq(bad, 0, "%s: %zu gradients differ from the whole model's", t->name, bad);
            continue;
        }
        double maxd = 0, maxr = 0;
        for (size_t k = 0; k < t->numel; k++) {
            maxd = fmax(maxd, fabs((double)wte_other[k] + gs[k] - gw[k]));
            maxr = fmax(maxr, fabs((double)gw[k]));
        }
        cr_expect(maxd <= 1e-6 * maxr, "wte: the two stages' gradients sum to %g off", maxd / maxr);
    }
}

static const float *wte_grad(const loco_gpt *m) {
    return loco_gpt_grads(m) +
           loco_gpt_table(m)
               ->t[loco_ttable_find(loco_gpt_table(m), "transformer.wte.weight")]
               .offset;
}

/* Two stages of two blocks, two micro-batches in slots 0 and 1, in
 * 1F1B's order with the weight halves last (as zero-bubble schedules put
 * them). */
static void two_stages(loco_recompute recompute) {
    loco_gpt *w = NULL, *s0 = NULL, *s1 = NULL;
    float lw[MB];
    w = whole(lw);
    const loco_gpt_stage st0 = stage_of(1, (int[]){0}, (int[]){2}, MB);
    const loco_gpt_stage st1 = stage_of(1, (int[]){2}, (int[]){4}, MB);
    s0 = make(&st0, recompute);
    s1 = make(&st1, recompute);
    cr_expect(
        loco_gpt_holds_unit(s0, 0) && !loco_gpt_holds_unit(s0, loco_gpt_cfg(s0)->n_layer + 1) &&
        !loco_gpt_holds_unit(s1, 0) && loco_gpt_holds_unit(s1, loco_gpt_cfg(s1)->n_layer + 1));
    float act[N * 16], grad[N * 16], loss[MB];
    for (int m = 0; m < MB; m++) {
        cr_assert_eq(loco_gpt_chunk_forward(s0, m, 0, inputs[m], NULL, Bm, Tm, NULL, act, 0, NULL),
                     0, "%s", loco_errmsg());
        cr_assert_eq(loco_gpt_chunk_forward(s1, m, 0, NULL, targets[m], Bm, Tm, act, NULL,
                                            1.0f / MB, &loss[m]),
                     0, "%s", loco_errmsg());
        cr_assert_eq(loco_gpt_chunk_backward_input(s1, m, 0, NULL, Bm, Tm, NULL, grad), 0, "%s",
                     loco_errmsg());
        cr_assert_eq(loco_gpt_chunk_backward_input(s0, m, 0, inputs[m], Bm, Tm, grad, NULL), 0,
                     "%s", loco_errmsg());
        cr_expect_eq(memcmp(&loss[m], &lw[m], 4), 0, "micro-batch %d: loss %.9g, whole %.9g", m,
                     loss[m], lw[m]);
    }
    for (int m = 0; m < MB; m++) {
        cr_assert_eq(loco_gpt_chunk_backward_weight(s1, m, 0, Bm, Tm), 0, "%s", loco_errmsg());
        cr_assert_eq(loco_gpt_chunk_backward_weight(s0, m, 0, Bm, Tm), 0, "%s", loco_errmsg());
    }
    expect_like_whole(s0, w, wte_grad(s1));
    expect_like_whole(s1, w, wte_grad(s0));
    loco_gpt_destroy(w);
    loco_gpt_destroy(s0);
    loco_gpt_destroy(s1);
}

Test(model_stage, two_stages_equal_the_whole_model) {
    two_stages(LOCO_RECOMPUTE_NONE);
}
Test(model_stage, two_stages_with_selective_recompute) {
    two_stages(LOCO_RECOMPUTE_SELECTIVE);
}
Test(model_stage, two_stages_with_full_recompute) {
    two_stages(LOCO_RECOMPUTE_FULL);
}

/* A V: rank X holds blocks [0, 1) and [3, 4) (embeddings and head share
 * one wte), rank Y blocks [1, 2) and [2, 3); one micro-batch. */
Test(model_stage, v_shaped_stages_equal_the_whole_model) {
    loco_gpt *w = NULL, *x = NULL, *y = NULL;
    float lw[MB];
    w = whole(lw);
    loco_gpt_zero_grad(w);
    float l1;
    cr_assert_eq(loco_gpt_forward_backward(w, inputs[0], targets[0], Bm, Tm, 1.0f, &l1), 0);
    /* One slot per (micro-batch, chunk): chunk c of the micro-batch in slot c. */
    const loco_gpt_stage sx = stage_of(2, (int[]){0, 3}, (int[]){1, 4}, 2);
    const loco_gpt_stage sy = stage_of(2, (int[]){1, 2}, (int[]){2, 3}, 2);
    x = make(&sx, LOCO_RECOMPUTE_NONE);
    y = make(&sy, LOCO_RECOMPUTE_NONE);
    int wtes = 0;
    for (int i = 0; i < loco_gpt_table(x)->n; i++)
        wtes += !strcmp(loco_gpt_table(x)->t[i].name, "transformer.wte.weight");
    cr_expect_eq(wtes, 1, "a stage with both ends holds one wte");
    float a[N * 16], b[N * 16], loss;
    cr_assert_eq(loco_gpt_chunk_forward(x, 0, 0, inputs[0], NULL, Bm, Tm, NULL, a, 0, NULL), 0);
    cr_assert_eq(loco_gpt_chunk_forward(y, 0, 0, NULL, NULL, Bm, Tm, a, b, 0, NULL), 0);
    cr_assert_eq(loco_gpt_chunk_forward(y, 1, 1, NULL, NULL, Bm, Tm, b, a, 0, NULL), 0);
    cr_assert_eq(loco_gpt_chunk_forward(x, 1, 1, NULL, targets[0], Bm, Tm, a, NULL, 1.0f, &loss),
                 0, "%s", loco_errmsg());
    cr_expect_eq(memcmp(&loss, &l1, 4), 0, "loss %.9g, whole %.9g", loss, l1);
    cr_assert_eq(loco_gpt_chunk_backward_input(x, 1, 1, NULL, Bm, Tm, NULL, a), 0);
    cr_assert_eq(loco_gpt_chunk_backward_input(y, 1, 1, NULL, Bm, Tm, a, b), 0);
    cr_assert_eq(loco_gpt_chunk_backward_input(y, 0, 0, NULL, Bm, Tm, b, a), 0);
    cr_assert_eq(loco_gpt_chunk_backward_input(x, 0, 0, inputs[0], Bm, Tm, a, NULL), 0);
    for (int c = 1; c >= 0; c--) {
        cr_assert_eq(loco_gpt_chunk_backward_weight(x, c, c, Bm, Tm), 0);
        cr_assert_eq(loco_gpt_chunk_backward_weight(y, c, c, Bm, Tm), 0);
    }
    /* wte's gradient: the embedding's part (B of chunk 0) came before the
     * head's (W of chunk 1), the reverse of the whole model's order. */
    static const float no_other[37 * 16];
    expect_like_whole(x, w, no_other);
    expect_like_whole(y, w, NULL);
    loco_gpt_destroy(w);
    loco_gpt_destroy(x);
    loco_gpt_destroy(y);
}

Test(model_stage, tables_hold_their_units_and_the_head_its_wte) {
    loco_ttable tt;
    const loco_gpt_stage last = stage_of(1, (int[]){3}, (int[]){4}, 1);
    cr_assert_eq(loco_gpt_build_stage_table(&tt, &cfg, &last), 0);
    /* block 3 (12 tensors), ln_f (2), the head's wte */
    cr_expect_eq(tt.n, 15);
    cr_expect_str_eq(tt.t[0].name, "transformer.h.3.ln_1.weight");
    cr_expect_str_eq(tt.t[12].name, "transformer.ln_f.weight");
    cr_expect_str_eq(tt.t[14].name, "transformer.wte.weight");
    loco_ttable_fini(&tt);
    const loco_gpt_stage middle = stage_of(1, (int[]){1}, (int[]){3}, 1);
    cr_assert_eq(loco_gpt_build_stage_table(&tt, &cfg, &middle), 0);
    cr_expect_eq(tt.n, 24);
    cr_expect_eq(loco_ttable_find(&tt, "transformer.wte.weight"), -1);
    loco_ttable_fini(&tt);
}

Test(model_stage, what_cannot_be_built_is_refused) {
    loco_ttable tt;
    const loco_gpt_stage bad[] = {
        stage_of(1, (int[]){2}, (int[]){2}, 1),       /* empty */
        stage_of(2, (int[]){0, 1}, (int[]){2, 3}, 1), /* overlapping */
        stage_of(2, (int[]){2, 0}, (int[]){3, 1}, 1), /* out of order */
        stage_of(1, (int[]){3}, (int[]){5}, 1),       /* beyond the model */
        stage_of(1, (int[]){0}, (int[]){4}, 0),       /* no slot */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_expect_eq(loco_gpt_build_stage_table(&tt, &cfg, &bad[i]), LOCO_EINVAL, "stage %zu", i);
    loco_gpt *m = NULL;
    const loco_gpt_stage st = stage_of(1, (int[]){0}, (int[]){2}, 1);
    m = make(&st, LOCO_RECOMPUTE_NONE);
    float loss;
    cr_expect_eq(loco_gpt_forward_backward(m, inputs[0], targets[0], Bm, Tm, 1.0f, &loss),
                 LOCO_EINVAL);
    cr_expect(strstr(loco_errmsg(), "a pipeline stage runs its chunks one by one"), "%s",
              loco_errmsg());
    cr_expect_eq(loco_gpt_chunk_forward(m, 1, 0, inputs[0], NULL, Bm, Tm, NULL, NULL, 0, NULL),
                 LOCO_EINVAL, "slot 1 of 1");
    /* ZeRO over a stage: the step needs every range reported final. */
    loco_config c;
    loco_config_defaults(&c);
    c.parallel.zero_stage = 2;
    loco_comm *self;
    cr_assert_eq(loco_comm_world(&self, "self"), 0);
    loco_zero *z = NULL;
    cr_assert_eq(loco_zero_create(&z, m, self, &c), 0);
    cr_expect_eq(loco_zero_grads_ready(z, 0, loco_gpt_num_params(m) + 1), LOCO_EINVAL);
    cr_expect_eq(loco_zero_grads_ready(z, 0, 10), 0);
    double norm;
    cr_expect_eq(loco_zero_step(z, 1e-3f, 1.0, &norm), LOCO_EINVAL);
    cr_expect(strstr(loco_errmsg(), "gradients of 10 of"), "%s", loco_errmsg());
    loco_zero_destroy(z);
    loco_comm_destroy(self);
    loco_gpt_destroy(m);
}
