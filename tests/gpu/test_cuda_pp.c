/* Pipeline stages of the device model (inner/model/gpt_cuda_pp.c) against
 * the whole device model, in one process: two stage models on one device
 * (blocks [0, 1) with the embeddings; [1, 2) with ln_f and the tied head's
 * copy of wte), the first's output handed to the second as its input and
 * the second's input gradient back, two micro-batches in two slots.
 *
 *   passes: each micro-batch's loss and every gradient (wte: the two
 *     copies' summed, as the trainer sums them) equal to the whole model's
 *     forward_backward within 1e-5 of the tensor's max |grad|, fp32 and
 *     bf16, with W fused into B (1F1B) and split from it (zero bubble: both
 *     micro-batches' W after both Bs), and with full recompute.
 *   refusals: B before F, W before B, a slot or a chunk out of range, the
 *     whole model's passes on a stage, chunk passes on a whole model.
 *
 * Without a device or a CUDA build the tests skip with the reason. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#if !defined(LOCO_HAVE_CUDA)
Test(gpu_pp, skipped) {
    cr_skip_test("built without the CUDA toolkit (no nvcc found by make): the device model not "
                 "compiled");
}
#else

#include "inner/model/model.h"
#include "tests/gpu/gpu_test.h"

static const loco_gpt_config cfg = {
    .n_layer = 2, .n_head = 2, .n_embd = 32, .seq_len = 8, .vocab_size = 97};
enum { B = 2, T = 8, N = B * T, MB = 2 };

static void batch(int mb, int32_t *in, int32_t *tg) {
    for (int i = 0; i < N; i++) {
        in[i] = (int32_t)((i * 37 + 11 + mb * 5) % cfg.vocab_size);
        tg[i] = (int32_t)((i * 53 + 5 + mb * 3) % cfg.vocab_size);
    }
}

/* A stage's flat buffer from the whole model's, tensor by tensor. */
static float *stage_params(const loco_ttable *st, const loco_ttable *whole, const float *w) {
    float *p = malloc(st->numel * sizeof(float));
    cr_assert(p);
    for (int i = 0; i < st->n; i++) {
        const int k = loco_ttable_find(whole, st->t[i].name);
        cr_assert(k >= 0, "%s", st->t[i].name);
        memcpy(p + st->t[i].offset, w + whole->t[k].offset, st->t[i].numel * sizeof(float));
    }
    return p;
}

typedef struct {
    loco_gpt_stage st;
    loco_ttable tt;
    loco_gpt_cuda *g;
    float *grads;
} stage;

static void make_stage(stage *s, int first, int end, bool bf16, bool split, int rerun,
                       const loco_ttable *whole, const float *w) {
    memset(s, 0, sizeof *s);
    s->st.n = 1;
    s->st.first[0] = first;
    s->st.end[0] = end;
    s->st.slots = MB;
    cr_assert_eq(loco_gpt_build_stage_table(&s->tt, &cfg, &s->st), 0, "%s", loco_errmsg());
    const loco_gpt_cuda_opts o = {.bf16 = bf16, .lo = 0, .hi = SIZE_MAX, .stage = &s->st,
                                  .split_w = split, .rerun = rerun};
    cr_assert_eq(loco_gpt_cuda_create_with(&s->g, &cfg, B, T, &o), 0, "%s", loco_errmsg());
    float *p = stage_params(&s->tt, whole, w);
    cr_assert_eq(loco_gpt_cuda_upload(s->g, p, NULL, NULL), 0, "%s", loco_errmsg());
    free(p);
    cr_assert_eq(loco_gpt_cuda_zero_grad(s->g), 0, "%s", loco_errmsg());
    s->grads = calloc(s->tt.numel, sizeof(float));
    cr_assert(s->grads);
}

static void free_stage(stage *s) {
    loco_gpt_cuda_destroy(s->g);
    loco_ttable_fini(&s->tt);
    free(s->grads);
}

#define CK(call) cr_assert_eq((call), 0, "%s", loco_errmsg())

static void check_stages(bool bf16, bool split, int rerun) {
    gpu_require();
    loco_gpt *cpu = NULL; /* the initial weights and the whole table */
    CK(loco_gpt_create(&cpu, &cfg, B, T));
    loco_rng rng;
    loco_rng_seed(&rng, 7);
    loco_gpt_init_weights(cpu, &rng);
    const loco_ttable *whole = loco_gpt_table(cpu);
    const float *w = loco_gpt_params(cpu);
    int32_t in[MB][N], tg[MB][N];
    for (int mb = 0; mb < MB; mb++)
        batch(mb, in[mb], tg[mb]);

    /* the whole device model: two micro-steps of half the loss each */
    loco_gpt_cuda *g;
    const loco_gpt_cuda_opts wo = {.bf16 = bf16, .lo = 0, .hi = SIZE_MAX, .rerun = rerun};
    CK(loco_gpt_cuda_create_with(&g, &cfg, B, T, &wo));
    CK(loco_gpt_cuda_upload(g, w, NULL, NULL));
    CK(loco_gpt_cuda_zero_grad(g));
    float want[MB];
    for (int mb = 0; mb < MB; mb++)
        CK(loco_gpt_cuda_forward_backward(g, in[mb], tg[mb], B, T, 0.5f, &want[mb]));
    float *gw = malloc(whole->numel * sizeof(float));
    cr_assert(gw);
    CK(loco_gpt_cuda_download(g, NULL, gw, NULL, NULL));

    /* two stages, the micro-batches interleaved over the slots */
    stage s0, s1;
    make_stage(&s0, 0, 1, bf16, split, rerun, whole, w);
    make_stage(&s1, 1, 2, bf16, split, rerun, whole, w);
    const size_t rc = (size_t)N * cfg.n_embd;
    float *act = malloc(MB * rc * sizeof(float)), *grad = malloc(rc * sizeof(float));
    cr_assert(act && grad);
    float got[MB];
    for (int mb = 0; mb < MB; mb++)
        CK(loco_gpt_cuda_chunk_forward(s0.g, mb, 0, in[mb], tg[mb], B, T, NULL, act + mb * rc,
                                       0.5f, NULL));
    for (int mb = 0; mb < MB; mb++)
        CK(loco_gpt_cuda_chunk_forward(s1.g, mb, 0, in[mb], tg[mb], B, T, act + mb * rc, NULL,
                                       0.5f, &got[mb]));
    for (int mb = MB - 1; mb >= 0; mb--) {
        CK(loco_gpt_cuda_chunk_backward_input(s1.g, mb, 0, B, T, NULL, grad));
        CK(loco_gpt_cuda_chunk_backward_input(s0.g, mb, 0, B, T, grad, NULL));
        if (!split) {
            CK(loco_gpt_cuda_chunk_backward_weight(s1.g, mb, 0, B, T));
            CK(loco_gpt_cuda_chunk_backward_weight(s0.g, mb, 0, B, T));
        }
    }
    for (int mb = 0; split && mb < MB; mb++) { /* zero bubble: W last */
        CK(loco_gpt_cuda_chunk_backward_weight(s1.g, mb, 0, B, T));
        CK(loco_gpt_cuda_chunk_backward_weight(s0.g, mb, 0, B, T));
    }
    for (int mb = 0; mb < MB; mb++)
        cr_expect(fabsf(got[mb] - want[mb]) <= 1e-6f * want[mb],
                  "micro-batch %d: stage loss %.8f, whole %.8f", mb, got[mb], want[mb]);
    CK(loco_gpt_cuda_download(s0.g, NULL, s0.grads, NULL, NULL));
    CK(loco_gpt_cuda_download(s1.g, NULL, s1.grads, NULL, NULL));

    /* every whole tensor: the stages' copies summed (wte: the two) */
    size_t seen = 0;
    for (int k = 0; k < whole->n; k++) {
        const loco_tensor *t = &whole->t[k];
        const int i0 = loco_ttable_find(&s0.tt, t->name), i1 = loco_ttable_find(&s1.tt, t->name);
        cr_assert(i0 >= 0 || i1 >= 0, "%s on no stage", t->name);
        double dmax = 0, rmax = 0;
        for (size_t j = 0; j < t->numel; j++) {
            double v = 0;
            if (i0 >= 0)
                v += s0.grads[s0.tt.t[i0].offset + j];
            if (i1 >= 0)
                v += s1.grads[s1.tt.t[i1].offset + j];
            const double r = gw[t->offset + j];
            dmax = fmax(dmax, fabs(v - r));
            rmax = fmax(rmax, fabs(r));
        }
        cr_expect(dmax <= 1e-5 * rmax, "%s: gradient %.3g from the whole model's (max %.3g)",
                  t->name, dmax, rmax);
        seen += t->numel;
    }
    cr_expect_eq(seen, whole->numel);
    free(act);
    free(grad);
    free(gw);
    free_stage(&s0);
    free_stage(&s1);
    loco_gpt_cuda_destroy(g);
    loco_gpt_destroy(cpu);
}

Test(gpu_pp, stages_fp32_fused) { check_stages(false, false, 0); }
Test(gpu_pp, stages_fp32_split_w) { check_stages(false, true, 0); }
Test(gpu_pp, stages_bf16_split_w) { check_stages(true, true, 0); }
Test(gpu_pp, stages_fp32_recompute) { check_stages(false, true, 2); }

Test(gpu_pp, refusals) {
    gpu_require();
    loco_gpt *cpu = NULL;
    CK(loco_gpt_create(&cpu, &cfg, B, T));
    stage s;
    make_stage(&s, 1, 2, false, true, 0, loco_gpt_table(cpu), loco_gpt_params(cpu));
    int32_t in[N], tg[N];
    batch(0, in, tg);
    float act[N * 32], loss;
    cr_expect_lt(loco_gpt_cuda_chunk_backward_input(s.g, 0, 0, B, T, NULL, act), 0,
                 "B before F");
    cr_expect_lt(loco_gpt_cuda_chunk_forward(s.g, MB, 0, in, tg, B, T, act, NULL, 1, &loss), 0,
                 "a slot out of range");
    cr_expect_lt(loco_gpt_cuda_chunk_forward(s.g, 0, 1, in, tg, B, T, act, NULL, 1, &loss), 0,
                 "a chunk out of range");
    cr_expect_lt(loco_gpt_cuda_chunk_forward(s.g, 0, 0, in, tg, B, T, NULL, NULL, 1, &loss), 0,
                 "a chunk after block 0 without its input");
    memset(act, 0, sizeof act);
    CK(loco_gpt_cuda_chunk_forward(s.g, 0, 0, in, tg, B, T, act, NULL, 1, &loss));
    cr_expect_lt(loco_gpt_cuda_chunk_backward_weight(s.g, 0, 0, B, T), 0, "W before B");
    cr_expect_lt(loco_gpt_cuda_forward_backward(s.g, in, tg, B, T, 1, &loss), 0,
                 "the whole model's pass on a stage");
    loco_gpt_cuda *g;
    CK(loco_gpt_cuda_create(&g, &cfg, B, T, false));
    cr_expect_lt(loco_gpt_cuda_chunk_forward(g, 0, 0, in, tg, B, T, NULL, NULL, 1, &loss), 0,
                 "chunk passes on a whole model");
    loco_gpt_cuda_destroy(g);
    free_stage(&s);
    loco_gpt_destroy(cpu);
}

#endif /* LOCO_HAVE_CUDA */
