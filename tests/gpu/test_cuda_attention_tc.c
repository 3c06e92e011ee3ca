/* The tensor-core attention (kernels/cuda/attention_tc.cu) against the
 * reference kernel (attention.cu's bf16 twin) and the CPU twin
 * (loco_attention_fwd/bwd on the same bf16-rounded inputs): out, lse and
 * dQ, dK, dV each within the bf16 bound, over shapes with T off the 64-row
 * tile, several batches and heads, and T = 1; the backward the same bits
 * twice; other head sizes refused; the kernel selection and its
 * fallbacks. On the emulator (tests/gpu/emu) this checks the mma
 * fragments' layout, indexing and causal masking; on a GPU, the hardware.
 * Skips, with the reason, without a device or a CUDA build. */
#include <criterion/criterion.h>

#ifndef LOCO_HAVE_CUDA
Test(gpu_attention_tc, skipped)
{
    cr_skip_test("built without the CUDA toolkit (no nvcc found by make): "
                 "kernels/cuda not compiled");
}
#else

#include "inner/model/model.h"
#include "tests/gpu/gpu_test.h"

enum { SLAB = 32 << 20 };

static void *up_bf(gpu_env *e, float *x, size_t n)
{
    loco_bf16 *h = round_bf(x, n);
    void *d = dup_to_dev(e, h, n * 2);
    free(h);
    return d;
}

static float *down_bf(const void *d, size_t n)
{
    loco_bf16 *h = malloc((n ? n : 1) * 2);
    cr_assert_not_null(h);
    to_host(h, d, n * 2);
    float *x = bf_to_f(h, n);
    free(h);
    return x;
}

/* part p (0 q, 1 k, 2 v) of a (B,T,3C) array, packed (B*T, C). */
static float *part(const float *x, size_t BT, int C, int p)
{
    float *y = malloc(BT * C * sizeof *y);
    cr_assert_not_null(y);
    for (size_t r = 0; r < BT; r++)
        memcpy(y + r * C, x + r * 3 * C + (size_t)p * C, C * sizeof *y);
    return y;
}

/* lse (B,NH,T) of the scaled causal scores, in double on the host. */
static float *cpu_lse(const float *qkv, int B, int T, int C, int NH)
{
    const int hs = C / NH;
    const double scale = 1.0 / sqrt((double)hs);
    float *lse = malloc((size_t)B * NH * T * sizeof *lse);
    double *sc = malloc((size_t)T * sizeof *sc);
    cr_assert(lse && sc);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < T; i++) {
                const float *q = qkv + ((size_t)b * T + i) * 3 * C + (size_t)h * hs;
                double mx = -INFINITY, sum = 0.0;
                for (int j = 0; j <= i; j++) {
                    const float *k = qkv + ((size_t)b * T + j) * 3 * C + C + (size_t)h * hs;
                    double d = 0.0;
                    for (int c = 0; c < hs; c++)
                        d += (double)q[c] * k[c];
                    sc[j] = d * scale;
                    mx = fmax(mx, sc[j]);
                }
                for (int j = 0; j <= i; j++)
                    sum += exp(sc[j] - mx);
                lse[((size_t)b * NH + h) * T + i] = (float)(mx + log(sum));
            }
    free(sc);
    return lse;
}

/* max |a - r| over the elements, for the lse (a log: absolute error). */
static double max_abs(const float *a, const float *r, size_t n)
{
    double e = 0.0;
    for (size_t i = 0; i < n; i++)
        e = isfinite(a[i]) ? fmax(e, fabs((double)a[i] - r[i])) : INFINITY;
    return e;
}

/* max |a - r| / max(max |r|, 1e-3): rel_err, with a floor under the
 * scale for gradients that are zero but for rounding (dQ, dK at T = 1). */
static double err_floor(const float *a, const float *r, size_t n)
{
    double num = 0.0, den = 1e-3;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]))
            return INFINITY;
        num = fmax(num, fabs((double)a[i] - r[i]));
        den = fmax(den, fabs((double)r[i]));
    }
    return num / den;
}

#define EXPECT_CLOSE(what, a, r, n)                                                          \
    do {                                                                                     \
        const double e_ = err_floor((a), (r), (n));                                          \
        cr_expect_leq(e_, TOL_BF16, "%s: rel err %.3g > %.3g", (what), e_, TOL_BF16);        \
    } while (0)

/* dqkv starts at zero, or (accum) at random values the kernels add to. */
static void check_tc(int B, int T, int C, int NH, bool accum, uint64_t seed)
{
    gpu_env e;
    gpu_env_init(&e, SLAB);
    uint64_t s = seed;
    const size_t BT = (size_t)B * T, nqkv = BT * 3 * C, nout = BT * C;
    const size_t natt = (size_t)B * NH * T * T, nrow = (size_t)B * NH * T;
    float *qkv = rand_f(&s, nqkv, 2.0), *dout = rand_f(&s, nout, 1.0);
    float *dqkv = accum ? rand_f(&s, nqkv, 0.5) : fill_f(nqkv, 0.0f);
    loco_bf16 *h0 = round_bf(dqkv, nqkv); /* dqkv now holds the rounded start */
    void *d_qkv = up_bf(&e, qkv, nqkv), *d_dout = up_bf(&e, dout, nout);
    void *d_dq_tc = dup_to_dev(&e, h0, nqkv * 2), *d_dq_ref = dup_to_dev(&e, h0, nqkv * 2);
    void *d_dq_tc2 = dup_to_dev(&e, h0, nqkv * 2);
    void *d_out_tc = dalloc(&e, nout * 2), *d_out_ref = dalloc(&e, nout * 2);
    void *d_lse_tc = dalloc(&e, nrow * 4), *d_lse_ref = dalloc(&e, nrow * 4);
    void *d_scr = dalloc(&e, nrow * 4);

    GPU_OK(loco_cuda_attention_tc_fwd_bf16(d_out_tc, d_lse_tc, d_qkv, B, T, C, NH, NULL));
    GPU_OK(loco_cuda_attention_fwd_bf16(d_out_ref, d_lse_ref, d_qkv, B, T, C, NH, NULL));
    GPU_OK(loco_cuda_attention_tc_bwd_bf16(d_dq_tc, d_scr, d_dout, d_out_tc, d_qkv, d_lse_tc, B, T,
                                           C, NH, NULL));
    GPU_OK(loco_cuda_attention_tc_bwd_bf16(d_dq_tc2, d_scr, d_dout, d_out_tc, d_qkv, d_lse_tc, B,
                                           T, C, NH, NULL));
    GPU_OK(loco_cuda_attention_bwd_bf16(d_dq_ref, d_scr, d_dout, d_out_ref, d_qkv, d_lse_ref, B,
                                        T, C, NH, NULL));
    float *out_tc = down_bf(d_out_tc, nout), *out_ref = down_bf(d_out_ref, nout);
    float *lse_tc = down_f(d_lse_tc, nrow), *lse_ref = down_f(d_lse_ref, nrow);
    float *g_tc = down_bf(d_dq_tc, nqkv), *g_tc2 = down_bf(d_dq_tc2, nqkv);
    float *g_ref = down_bf(d_dq_ref, nqkv);

    /* the CPU twin on the same rounded inputs */
    float *out = malloc(nout * 4), *att = malloc(natt * 4), *datt = malloc(natt * 4);
    cr_assert(out && att && datt);
    loco_attention_fwd(out, att, qkv, B, T, C, NH);
    loco_attention_bwd(dqkv, datt, dout, qkv, att, B, T, C, NH);
    float *lse = cpu_lse(qkv, B, T, C, NH);

    EXPECT_CLOSE("tc out vs cpu", out_tc, out, nout);
    EXPECT_CLOSE("tc out vs reference", out_tc, out_ref, nout);
    const double el = max_abs(lse_tc, lse, nrow), er = max_abs(lse_tc, lse_ref, nrow);
    cr_expect_leq(el, 1e-3, "tc lse vs cpu: max abs err %.3g", el);
    cr_expect_leq(er, 1e-3, "tc lse vs reference: max abs err %.3g", er);
    static const char *names[3] = {"dQ", "dK", "dV"};
    for (int p = 0; p < 3; p++) {
        float *a = part(g_tc, BT, C, p), *r = part(dqkv, BT, C, p), *f = part(g_ref, BT, C, p);
        char what[64];
        snprintf(what, sizeof what, "tc %s vs cpu", names[p]);
        EXPECT_CLOSE(what, a, r, BT * C);
        snprintf(what, sizeof what, "tc %s vs reference", names[p]);
        EXPECT_CLOSE(what, a, f, BT * C);
        free(a), free(r), free(f);
    }
    EXPECT_SAME_BITS("tc backward run twice", g_tc, g_tc2, nqkv);
    float *dq = part(g_tc, BT, C, 0), *dqc = part(dqkv, BT, C, 0);
    cr_log_info("B=%d T=%d NH=%d: out %.3g, lse %.3g, dQ %.3g (vs cpu)", B, T, NH,
                err_floor(out_tc, out, nout), el, err_floor(dq, dqc, BT * C));
    free(dq), free(dqc);

    free(qkv), free(dout), free(dqkv), free(h0), free(out_tc), free(out_ref), free(lse_tc);
    free(lse_ref), free(g_tc), free(g_tc2), free(g_ref), free(out), free(att), free(datt);
    free(lse);
    gpu_env_fini(&e);
}

Test(gpu_attention_tc, t1) { check_tc(2, 1, 64, 1, false, 31); }
Test(gpu_attention_tc, t77_bh4_accum) { check_tc(2, 77, 128, 2, true, 32); }
Test(gpu_attention_tc, t130_h3) { check_tc(1, 130, 192, 3, false, 33); }

Test(gpu_attention_tc, other_head_sizes_refused)
{
    gpu_require();
    loco_bf16 dummy[8] = {0};
    float f[8] = {0};
    cr_expect_eq(loco_cuda_attention_tc_fwd_bf16(dummy, f, dummy, 1, 1, 96, 3, NULL),
                 LOCO_ENOTSUP);
    cr_expect(strstr(loco_errmsg(), "head size 32"), "%s", loco_errmsg());
    cr_expect_eq(loco_cuda_attention_tc_bwd_bf16(dummy, f, dummy, dummy, dummy, f, 1, 1, 256, 2,
                                                 NULL),
                 LOCO_ENOTSUP);
}

Test(gpu_attention_tc, selection)
{
    gpu_require();
    loco_attn_impl k = LOCO_ATTN_TENSOR;
    GPU_OK(loco_cuda_attention_select("reference", 64, true, &k));
    cr_expect_eq(k, LOCO_ATTN_REFERENCE);
    k = LOCO_ATTN_TENSOR;
    GPU_OK(loco_cuda_attention_select("auto", 64, false, &k)); /* fp32: reference */
    cr_expect_eq(k, LOCO_ATTN_REFERENCE);
    k = LOCO_ATTN_TENSOR;
    GPU_OK(loco_cuda_attention_select("tensor", 32, true, &k)); /* head size: reference */
    cr_expect_eq(k, LOCO_ATTN_REFERENCE);
    cr_expect_eq(loco_cuda_attention_select("fast", 64, true, &k), LOCO_EINVAL);
    /* bf16, head size 64: tensor exactly where the device has sm_80+, and
     * auto and tensor agree */
    loco_attn_impl a, t;
    GPU_OK(loco_cuda_attention_select("auto", 64, true, &a));
    GPU_OK(loco_cuda_attention_select("tensor", 64, true, &t));
    cr_expect_eq(a, t);
}

/* The device model (inner/model/gpt_cuda.c) with train.attention = tensor
 * against the same model on the reference kernel and the CPU model (on
 * the bf16 weight copy): loss and every parameter gradient, head size 64. */
Test(gpu_attention_tc, model_with_tensor_kernel, .timeout = 300)
{
    gpu_require();
    const loco_gpt_config cfg = {
        .n_layer = 1, .n_head = 2, .n_embd = 128, .seq_len = 16, .vocab_size = 97};
    enum { B = 2, T = 13 };
    loco_gpt *cpu = NULL;
    cr_assert_eq(loco_gpt_create(&cpu, &cfg, B, T), 0, "%s", loco_errmsg());
    loco_rng rng;
    loco_rng_seed(&rng, 7);
    loco_gpt_init_weights(cpu, &rng);
    int32_t in[B * T], tg[B * T];
    uint64_t s = 9;
    for (int i = 0; i < B * T; i++) {
        in[i] = (int32_t)(gpu_splitmix(&s) % 97);
        tg[i] = (int32_t)(gpu_splitmix(&s) % 97);
    }
    const size_t P = loco_gpt_num_params(cpu);
    float *grads[2], loss[2];
    static const char *const which[2] = {"reference", "tensor"};
    for (int k = 0; k < 2; k++) {
        loco_gpt_cuda *dev;
        GPU_OK(loco_gpt_cuda_create(&dev, &cfg, B, T, true));
        GPU_OK(loco_gpt_cuda_set_attention(dev, which[k]));
        GPU_OK(loco_gpt_cuda_upload(dev, loco_gpt_params(cpu), NULL, NULL));
        GPU_OK(loco_gpt_cuda_zero_grad(dev));
        GPU_OK(loco_gpt_cuda_forward_backward(dev, in, tg, B, T, 1.0f, &loss[k]));
        grads[k] = malloc(P * sizeof(float));
        cr_assert_not_null(grads[k]);
        GPU_OK(loco_gpt_cuda_download(dev, NULL, grads[k], NULL, NULL));
        loco_gpt_cuda_destroy(dev);
    }
    for (size_t i = 0; i < P; i++) /* the CPU sees the GPU's bf16 weight copy */
        loco_gpt_params(cpu)[i] = bf2f(f2bf(loco_gpt_params(cpu)[i]));
    float want = 0;
    loco_gpt_zero_grad(cpu);
    cr_assert_eq(loco_gpt_forward_backward(cpu, in, tg, B, T, 1.0f, &want), 0);
    cr_expect_leq(fabs((double)loss[1] - want), 1e-3 * want, "loss: tensor %.7f cpu %.7f",
                  loss[1], want);
    cr_expect_leq(fabs((double)loss[1] - loss[0]), 1e-3 * want,
                  "loss: tensor %.7f reference %.7f", loss[1], loss[0]);
    for (int i = 0; i < loco_gpt_table(cpu)->n; i++) {
        const loco_tensor *t = &loco_gpt_table(cpu)->t[i];
        const double ec = rel_err(grads[1] + t->offset, loco_gpt_grads(cpu) + t->offset, t->numel);
        const double er = rel_err(grads[1] + t->offset, grads[0] + t->offset, t->numel);
        cr_expect_leq(ec, 2e-2, "%s gradient, tensor vs cpu: rel err %.3g", t->name, ec);
        cr_expect_leq(er, 2e-2, "%s gradient, tensor vs reference: rel err %.3g", t->name, er);
    }
    free(grads[0]), free(grads[1]);
    loco_gpt_destroy(cpu);
}

#endif
