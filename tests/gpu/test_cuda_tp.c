/* kernels/cuda/tp.cu, the tensor-parallel pieces, against their CPU twins
 * (kernels/cpu/tp.c) on awkward sizes with tokens outside the slice,
 * ignored targets and padding columns: forwards within 1e-5 relative, the
 * backwards bit for bit (both accumulate every row in the same order).
 * The bf16 entry points against the CPU twins run on the bf16-rounded
 * inputs: what they store is the CPU's value rounded once (the embedding
 * rows exactly; the sums and the gradient within bf16's half ulp), what
 * they keep in fp32 (weight gradients, row sums) within 1e-5.
 * Every test skips, with the reason, where there is no device or no CUDA
 * build. */
#include <criterion/criterion.h>

#ifndef LOCO_HAVE_CUDA
Test(gpu_tp, skipped)
{
    cr_skip_test("built without the CUDA toolkit (no nvcc found by make): "
                 "kernels/cuda not compiled");
}
#else

#include "tests/gpu/gpu_test.h"

enum { SLAB = 64 << 20 };

/* Padding columns hold this, so a kernel that reads them shows. */
#define GARBAGE 1e4f

/* ---------------------------------------------------------------- embedding */

/* N rows of C channels, a slice [v_lo, v_lo + v_n) of the vocabulary, tokens
 * in [-3, v_lo + v_n + 5), every third one of the slice's first four. */
static void check_embed(int N, int C, int v_lo, int v_n, uint64_t seed)
{
    gpu_env e;
    gpu_env_init(&e, SLAB);
    uint64_t s = seed;
    const size_t nout = (size_t)N * C, nw = (size_t)v_n * C;
    int32_t *tok = malloc((size_t)N * sizeof *tok);
    for (int i = 0; i < N; i++)
        tok[i] = i % 3 ? (int32_t)(gpu_splitmix(&s) % (uint64_t)(v_lo + v_n + 8)) - 3
                       : v_lo + (int32_t)(gpu_splitmix(&s) % 4);
    float *wte = rand_f(&s, nw, 1.0), *dout = rand_f(&s, nout, 1.0), *g = rand_f(&s, nw, 0.5);
    float *out = fill_f(nout, NAN);
    void *d_tok = dup_to_dev(&e, tok, (size_t)N * 4), *d_wte = dup_to_dev(&e, wte, nw * 4);
    void *d_out = dup_to_dev(&e, out, nout * 4), *d_dout = dup_to_dev(&e, dout, nout * 4);
    void *d_g = dup_to_dev(&e, g, nw * 4);
    GPU_OK(loco_cuda_embed_fwd(d_out, d_tok, d_wte, v_lo, v_n, N, C, NULL));
    for (int k = 0; k < 2; k++) { /* gradients accumulate */
        GPU_OK(loco_cuda_embed_bwd(d_g, d_dout, d_tok, v_lo, v_n, N, C, NULL));
        loco_embed_bwd(g, dout, tok, v_lo, v_n, N, C);
    }
    loco_embed_fwd(out, tok, wte, v_lo, v_n, N, C);
    float *gout = down_f(d_out, nout), *gg = down_f(d_g, nw);
    EXPECT_NEAR("embed out", gout, out, nout, TOL_F32);
    EXPECT_SAME_BITS("embed dwte", gg, g, nw);
    free(tok), free(wte), free(dout), free(g), free(out), free(gout), free(gg);
    gpu_env_fini(&e);
}

Test(gpu_tp, embed_small) { check_embed(37, 19, 5, 13, 201); }
Test(gpu_tp, embed_many_rows) { check_embed(301, 70, 90, 101, 202); }

/* ---------------------------------------------------- positions and bias */

static void check_pos_bias(int N, int T, int C, int row0, uint64_t seed)
{
    gpu_env e;
    gpu_env_init(&e, SLAB);
    uint64_t s = seed;
    const size_t nout = (size_t)N * C, np = (size_t)(T + 2) * C;
    float *wpe = rand_f(&s, np, 1.0), *out = rand_f(&s, nout, 1.0), *bias = rand_f(&s, C, 1.0);
    float *dout = rand_f(&s, nout, 1.0), *g = rand_f(&s, np, 0.5);
    void *d_wpe = dup_to_dev(&e, wpe, np * 4), *d_out = dup_to_dev(&e, out, nout * 4);
    void *d_bias = dup_to_dev(&e, bias, (size_t)C * 4), *d_dout = dup_to_dev(&e, dout, nout * 4);
    void *d_g = dup_to_dev(&e, g, np * 4);
    GPU_OK(loco_cuda_pos_fwd(d_out, d_wpe, row0, N, T, C, NULL));
    GPU_OK(loco_cuda_bias_fwd(d_out, d_bias, N, C, NULL));
    for (int k = 0; k < 2; k++) {
        GPU_OK(loco_cuda_pos_bwd(d_g, d_dout, row0, N, T, C, NULL));
        loco_pos_bwd(g, dout, row0, N, T, C);
    }
    loco_pos_fwd(out, wpe, row0, N, T, C);
    loco_bias_fwd(out, bias, N, C);
    float *gout = down_f(d_out, nout), *gg = down_f(d_g, np);
    EXPECT_NEAR("pos + bias out", gout, out, nout, TOL_F32);
    EXPECT_SAME_BITS("pos dwpe", gg, g, np);
    free(wpe), free(out), free(bias), free(dout), free(g), free(gout), free(gg);
    gpu_env_fini(&e);
}

Test(gpu_tp, pos_bias_mid_sequence) { check_pos_bias(37, 11, 19, 2 * 11 + 5, 211); }
Test(gpu_tp, pos_bias_fewer_rows_than_t) { check_pos_bias(5, 17, 9, 14, 212); }
Test(gpu_tp, pos_bias_many_rows) { check_pos_bias(300, 64, 48, 0, 213); }

/* --------------------------------------- vocabulary-parallel cross-entropy */

/* N rows of a slice's Vl logits, the first v_valid real, the padding
 * GARBAGE (malloc'd). */
static float *slice_logits(uint64_t *s, int N, int Vl, int v_valid)
{
    float *x = rand_f(s, (size_t)N * Vl, 8.0);
    for (int i = 0; i < N; i++)
        for (int j = v_valid; j < Vl; j++)
            x[(size_t)i * Vl + j] = GARBAGE;
    return x;
}

/* One slice of Vl columns at v_lo, v_valid of them real, of a vocabulary V.
 * Each step runs on both twins from the same inputs (the CPU's results of
 * the step before, shifted as another rank's share would shift them). */
static void check_xent_vp(int N, int V, int v_lo, int Vl, int v_valid, bool in_place,
                          uint64_t seed)
{
    gpu_env e;
    gpu_env_init(&e, SLAB);
    uint64_t s = seed;
    const size_t n = (size_t)N * Vl;
    float *x = slice_logits(&s, N, Vl, v_valid);
    int32_t *y = malloc((size_t)N * sizeof *y);
    for (int i = 0; i < N; i++)
        y[i] = i % 7 == 3 ? -1
               : i % 2 && v_valid ? v_lo + (int32_t)(gpu_splitmix(&s) % (uint64_t)v_valid)
                                  : (int32_t)(gpu_splitmix(&s) % (uint64_t)V);
    if (v_valid && N > 5) /* the slice's first and last real columns */
        y[1] = v_lo, y[5] = v_lo + v_valid - 1;
    float *rowmax = fill_f(N, NAN), *sumexp = fill_f(N, NAN), *tlogit = fill_f(N, NAN);
    float *loss = fill_f(N, NAN), *d = fill_f(n, NAN);
    void *d_x = dup_to_dev(&e, x, n * 4), *d_y = dup_to_dev(&e, y, (size_t)N * 4);
    void *d_max = dalloc(&e, (size_t)N * 4), *d_sum = dalloc(&e, (size_t)N * 4);
    void *d_t = dalloc(&e, (size_t)N * 4), *d_loss = dalloc(&e, (size_t)N * 4);
    void *d_d = in_place ? d_x : dalloc(&e, n * 4);

    GPU_OK(loco_cuda_xent_vp_max(d_max, d_x, N, Vl, v_valid, NULL));
    loco_xent_vp_max(rowmax, x, N, Vl, v_valid);
    float *got = down_f(d_max, N);
    EXPECT_SAME_BITS("vp rowmax", got, rowmax, (size_t)N);
    free(got);

    for (int i = 0; i < N; i++) /* a global max: another rank's may be larger */
        rowmax[i] = v_valid ? rowmax[i] + (float)(i % 3) : 1.0f;
    GPU_OK(loco_cuda_copy(d_max, rowmax, (size_t)N * 4, NULL));
    GPU_OK(loco_cuda_xent_vp_sum(d_sum, d_t, d_x, d_max, d_y, v_lo, N, Vl, v_valid, NULL));
    loco_xent_vp_sum(sumexp, tlogit, x, rowmax, y, v_lo, N, Vl, v_valid);
    float *gsum = down_f(d_sum, N), *gt = down_f(d_t, N);
    EXPECT_NEAR("vp sumexp", gsum, sumexp, (size_t)N, TOL_F32);
    EXPECT_SAME_BITS("vp tlogit", gt, tlogit, (size_t)N);
    free(gsum), free(gt);

    for (int i = 0; i < N; i++) { /* global sums: plus another rank's share */
        sumexp[i] += 0.5f + (float)(i % 4);
        if (tlogit[i] == 0.0f)
            tlogit[i] = -0.25f * (float)(i % 3);
    }
    GPU_OK(loco_cuda_copy(d_sum, sumexp, (size_t)N * 4, NULL));
    GPU_OK(loco_cuda_copy(d_t, tlogit, (size_t)N * 4, NULL));
    const float dscale = 1.0f / 7.0f;
    GPU_OK(loco_cuda_xent_vp_finish(d_loss, d_d, d_x, d_max, d_sum, d_t, d_y, v_lo, N, Vl,
                                    v_valid, dscale, NULL));
    loco_xent_vp_finish(loss, d, x, rowmax, sumexp, tlogit, y, v_lo, N, Vl, v_valid, dscale);
    float *gloss = down_f(d_loss, N), *gd = down_f(d_d, n);
    EXPECT_NEAR("vp losses", gloss, loss, (size_t)N, TOL_F32);
    EXPECT_NEAR("vp dlogits", gd, d, n, TOL_F32);
    for (int i = 0; i < N; i++)
        for (int j = y[i] < 0 ? 0 : v_valid; j < Vl; j++)
            cr_expect(gd[(size_t)i * Vl + j] == 0.0f, "row %d col %d: grad %g, not 0", i, j,
                      (double)gd[(size_t)i * Vl + j]);
    free(gloss), free(gd);

    free(x), free(y), free(rowmax), free(sumexp), free(tlogit), free(loss), free(d);
    gpu_env_fini(&e);
}

Test(gpu_tp, xent_vp_padded_slice) { check_xent_vp(37, 1003, 680, 340, 323, false, 221); }
Test(gpu_tp, xent_vp_first_slice_in_place) { check_xent_vp(37, 1003, 0, 340, 340, true, 222); }
Test(gpu_tp, xent_vp_all_padding) { check_xent_vp(13, 9, 9, 3, 0, false, 223); }
Test(gpu_tp, xent_vp_gpt2_vocab_half) { check_xent_vp(9, 50257, 25152, 25152, 25105, true, 224); }

/* ---------------------------------------------------------------- bf16 */

/* The embedding, positions and bias in bf16: the rows looked up exactly,
 * the sums rounded once, the fp32 gradients from bf16 dout. */
static void check_embed_bf16(int N, int T, int C, int v_lo, int v_n, uint64_t seed)
{
    gpu_env e;
    gpu_env_init(&e, SLAB);
    uint64_t s = seed;
    const size_t nout = (size_t)N * C, nw = (size_t)v_n * C, np = (size_t)T * C;
    int32_t *tok = malloc((size_t)N * sizeof *tok);
    for (int i = 0; i < N; i++)
        tok[i] = (int32_t)(gpu_splitmix(&s) % (uint64_t)(v_lo + v_n + 8)) - 3;
    float *wte = rand_f(&s, nw, 1.0), *wpe = rand_f(&s, np, 1.0), *bias = rand_f(&s, C, 1.0);
    float *dout = rand_f(&s, nout, 1.0), *gw = rand_f(&s, nw, 0.5), *gp = rand_f(&s, np, 0.5);
    loco_bf16 *hw = round_bf(wte, nw), *hp = round_bf(wpe, np), *hb = round_bf(bias, C);
    loco_bf16 *hd = round_bf(dout, nout);
    float *out = malloc(nout * sizeof *out);
    void *d_tok = dup_to_dev(&e, tok, (size_t)N * 4), *d_wte = dup_to_dev(&e, hw, nw * 2);
    void *d_wpe = dup_to_dev(&e, hp, np * 2), *d_bias = dup_to_dev(&e, hb, (size_t)C * 2);
    void *d_dout = dup_to_dev(&e, hd, nout * 2), *d_out = dalloc(&e, nout * 2);
    void *d_gw = dup_to_dev(&e, gw, nw * 4), *d_gp = dup_to_dev(&e, gp, np * 4);

    GPU_OK(loco_cuda_embed_fwd_bf16(d_out, d_tok, d_wte, v_lo, v_n, N, C, NULL));
    loco_embed_fwd(out, tok, wte, v_lo, v_n, N, C);
    loco_bf16 *got = malloc(nout * 2);
    to_host(got, d_out, nout * 2);
    float *f = bf_to_f(got, nout);
    EXPECT_SAME_BITS("bf16 embed out", f, out, nout);
    free(f);
    GPU_OK(loco_cuda_pos_fwd_bf16(d_out, d_wpe, 3, N, T, C, NULL));
    GPU_OK(loco_cuda_bias_fwd_bf16(d_out, d_bias, N, C, NULL));
    loco_pos_fwd(out, wpe, 3, N, T, C);
    round_bf(out, nout); /* the pos sum is stored, then the bias added */
    loco_bias_fwd(out, bias, N, C);
    free(round_bf(out, nout));
    to_host(got, d_out, nout * 2);
    f = bf_to_f(got, nout);
    EXPECT_SAME_BITS("bf16 embed + pos + bias out", f, out, nout);
    free(f), free(got);

    GPU_OK(loco_cuda_embed_bwd_bf16(d_gw, d_dout, d_tok, v_lo, v_n, N, C, NULL));
    GPU_OK(loco_cuda_pos_bwd_bf16(d_gp, d_dout, 3, N, T, C, NULL));
    loco_embed_bwd(gw, dout, tok, v_lo, v_n, N, C);
    loco_pos_bwd(gp, dout, 3, N, T, C);
    float *ggw = down_f(d_gw, nw), *ggp = down_f(d_gp, np);
    EXPECT_SAME_BITS("bf16 embed dwte", ggw, gw, nw);
    EXPECT_SAME_BITS("bf16 pos dwpe", ggp, gp, np);
    free(ggw), free(ggp), free(tok), free(wte), free(wpe), free(bias), free(dout), free(gw);
    free(gp), free(hw), free(hp), free(hb), free(hd), free(out);
    gpu_env_fini(&e);
}

Test(gpu_tp, embed_pos_bias_bf16) { check_embed_bf16(53, 7, 37, 11, 29, 231); }

/* The three cross-entropy steps on bf16 logits, in place, against the CPU
 * twins on the rounded logits. */
static void check_xent_vp_bf16(int N, int V, int v_lo, int Vl, int v_valid, uint64_t seed)
{
    gpu_env e;
    gpu_env_init(&e, SLAB);
    uint64_t s = seed;
    const size_t n = (size_t)N * Vl;
    float *x = slice_logits(&s, N, Vl, v_valid);
    loco_bf16 *hx = round_bf(x, n);
    int32_t *y = malloc((size_t)N * sizeof *y);
    for (int i = 0; i < N; i++)
        y[i] = i % 7 == 3 ? -1 : (int32_t)(gpu_splitmix(&s) % (uint64_t)V);
    y[1] = v_lo; /* the slice's first column */
    float *rowmax = fill_f(N, NAN), *sumexp = fill_f(N, NAN), *tlogit = fill_f(N, NAN);
    float *loss = fill_f(N, NAN), *d = fill_f(n, NAN);
    void *d_x = dup_to_dev(&e, hx, n * 2), *d_y = dup_to_dev(&e, y, (size_t)N * 4);
    void *d_max = dalloc(&e, (size_t)N * 4), *d_sum = dalloc(&e, (size_t)N * 4);
    void *d_t = dalloc(&e, (size_t)N * 4), *d_loss = dalloc(&e, (size_t)N * 4);

    GPU_OK(loco_cuda_xent_vp_max_bf16(d_max, d_x, N, Vl, v_valid, NULL));
    loco_xent_vp_max(rowmax, x, N, Vl, v_valid);
    float *got = down_f(d_max, N);
    EXPECT_SAME_BITS("bf16 vp rowmax", got, rowmax, (size_t)N);
    free(got);
    GPU_OK(loco_cuda_xent_vp_sum_bf16(d_sum, d_t, d_x, d_max, d_y, v_lo, N, Vl, v_valid, NULL));
    loco_xent_vp_sum(sumexp, tlogit, x, rowmax, y, v_lo, N, Vl, v_valid);
    float *gsum = down_f(d_sum, N), *gt = down_f(d_t, N);
    EXPECT_NEAR("bf16 vp sumexp", gsum, sumexp, (size_t)N, TOL_F32);
    EXPECT_SAME_BITS("bf16 vp tlogit", gt, tlogit, (size_t)N);
    free(gsum), free(gt);
    GPU_OK(loco_cuda_copy(d_sum, sumexp, (size_t)N * 4, NULL));
    const float dscale = 1.0f / 5.0f;
    GPU_OK(loco_cuda_xent_vp_finish_bf16(d_loss, d_x, d_x, d_max, d_sum, d_t, d_y, v_lo, N, Vl,
                                         v_valid, dscale, NULL));
    loco_xent_vp_finish(loss, d, x, rowmax, sumexp, tlogit, y, v_lo, N, Vl, v_valid, dscale);
    float *gloss = down_f(d_loss, N);
    EXPECT_NEAR("bf16 vp losses", gloss, loss, (size_t)N, TOL_F32);
    loco_bf16 *hd = malloc(n * 2);
    to_host(hd, d_x, n * 2);
    float *gd = bf_to_f(hd, n);
    EXPECT_NEAR("bf16 vp dlogits", gd, d, n, TOL_BF16);
    free(gloss), free(gd), free(hd), free(hx), free(x), free(y), free(rowmax), free(sumexp);
    free(tlogit), free(loss), free(d);
    gpu_env_fini(&e);
}

Test(gpu_tp, xent_vp_bf16_padded_slice) { check_xent_vp_bf16(37, 1003, 680, 340, 323, 232); }

#endif /* LOCO_HAVE_CUDA */
