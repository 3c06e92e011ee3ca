/* The pieces of a pass of the device model (gpt_cuda.c's passes and a
 * pipeline stage's chunk passes, gpt_cuda_pp.c, both run them):
 * model_pass.c's norms, RoPE, attention, the column- and row-parallel
 * layers with their tp collectives where model_tp.c has them, a block's
 * forward and backward (its GEMMs' weight half apart for a split W), the
 * embeddings, ln_f with the head and the loss. Each reads the weights of
 * units the caller bound (W, G) and the activations g->la and the slot
 * buffers point at. */
#include "inner/model/gpt_cuda_internal.h"

#if defined(LOCO_HAVE_CUDA)

#include <stdio.h>
#include <string.h>

#define W(name) loco__gpt_cuda_tensor(g, false, name)
#define G(name) ((float *)loco__gpt_cuda_tensor(g, true, name))

/* Block l's input: the embeddings' output, or (a pipeline stage) the
 * chunk's input at its first block. */
static const void *residual_in(const loco_gpt_cuda *g, int l) {
    return l == g->pass_first ? g->encoded : g->la[l - 1].res3;
}

/* The description's pieces (model_pass.c's norm_fwd, rope, attention,
 * mlp_act): GPT-2's kernels where the description is GPT-2's. */
static int norm_fwd(loco_gpt_cuda *g, void *out, float *mean, float *rstd, const void *in,
                    const void *w, const void *b, int N) {
    const int C = g->cfg.n_embd;
    if (g->cfg.norm == LOCO_NORM_RMSNORM)
        RUN(LOCO_PROF_LN,
            TWIN(rmsnorm_fwd, out, rstd, in, w, N, C, loco_gpt_norm_eps(&g->cfg), g->stream));
    else
        RUN(LOCO_PROF_LN, TWIN(layernorm_fwd, out, mean, rstd, in, w, b, N, C, g->stream));
    return 0;
}

/* din and dw (and db) accumulate. */
static int norm_bwd(loco_gpt_cuda *g, void *din, float *dw, float *db, const void *dout,
                    const void *in, const void *w, const float *mean, const float *rstd, int N) {
    const int C = g->cfg.n_embd;
    if (g->cfg.norm == LOCO_NORM_RMSNORM)
        RUN(LOCO_PROF_LN, TWIN(rmsnorm_bwd, din, dw, dout, in, w, rstd, N, C, g->stream));
    else
        RUN(LOCO_PROF_LN,
            TWIN(layernorm_bwd, din, dw, db, dout, in, w, mean, rstd, N, C, g->stream));
    return 0;
}

/* RoPE on the query and key heads of c_attn's output (N, W), in place
 * (backward: their gradients turned back); nothing with learned
 * positions. */
static int rope(loco_gpt_cuda *g, void *qkv, int B, int T, bool backward) {
    if (g->cfg.pos != LOCO_POS_ROPE)
        return 0;
    const int NH = g->NHl, NKV = g->NKVl, hs = loco_gpt_head_size(&g->cfg), ld = g->Wl;
    void *k = (char *)qkv + (size_t)NH * hs * g->es;
    const int *pos = g->cpc ? g->cp_pos : NULL; /* cp: the rows' global positions */
    if (backward) {
        RUN(LOCO_PROF_ELEM,
            TWIN(rope_bwd, qkv, ld, B, T, NH, hs, pos, g->rope_cos, g->rope_sin, g->stream));
        RUN(LOCO_PROF_ELEM,
            TWIN(rope_bwd, k, ld, B, T, NKV, hs, pos, g->rope_cos, g->rope_sin, g->stream));
    } else {
        RUN(LOCO_PROF_ELEM,
            TWIN(rope_fwd, qkv, ld, B, T, NH, hs, pos, g->rope_cos, g->rope_sin, g->stream));
        RUN(LOCO_PROF_ELEM,
            TWIN(rope_fwd, k, ld, B, T, NKV, hs, pos, g->rope_cos, g->rope_sin, g->stream));
    }
    return 0;
}

static int attention_fwd(loco_gpt_cuda *g, layer_acts *a, int B, int T) {
    const int C = g->Cl, NH = g->NHl, NKV = g->NKVl; /* this tp slice's heads */
    loco_stream s = g->stream;
    if (g->cpc) /* the sequence split over cp ranks */
        return loco__gpt_cuda_cp_attention_fwd(g, a, B);
    if (NKV == NH)
        RUN(LOCO_PROF_ATTN, ATTN(fwd, a->atty, a->lse, a->qkv, B, T, C, NH, s));
    else
        RUN(LOCO_PROF_ATTN,
            ATTN_GQA(fwd, a->atty, a->lse, a->qkv, B, T, NH, NKV, loco_gpt_head_size(&g->cfg), s));
    return 0;
}

static int attention_bwd(loco_gpt_cuda *g, const layer_acts *a, int B, int T) {
    const int C = g->Cl, NH = g->NHl, NKV = g->NKVl; /* this tp slice's heads */
    loco_stream s = g->stream;
    if (g->cpc)
        return loco__gpt_cuda_cp_attention_bwd(g, a, B);
    if (NKV == NH)
        RUN(LOCO_PROF_ATTN,
            ATTN(bwd, g->dqkv, g->attn_scratch, g->dbtc, a->atty, a->qkv, a->lse, B, T, C, NH, s));
    else
        RUN(LOCO_PROF_ATTN, ATTN_GQA(bwd, g->dqkv, g->attn_scratch, g->dbtc, a->atty, a->qkv,
                                     a->lse, B, T, NH, NKV, loco_gpt_head_size(&g->cfg), s));
    return 0;
}

/* This rank's rows of a pass's N between the tp regions: N / tp under
 * sp, else all. */
static int rows_of(const loco_gpt_cuda *g, int N) {
    return g->sp ? N / g->tp : N;
}

/* A column-parallel layer's input: x (this rank's rows of a norm's
 * output), all-gathered over tp under sp (into g->gather). */
int loco__gpt_cuda_column_input(loco_gpt_cuda *g, const void *x, int N, const void **full) {
    *full = x;
    if (!g->sp)
        return 0;
    const size_t part = (size_t)rows_of(g, N) * g->cfg.n_embd;
    LOCO_CHECK(loco__gpt_cuda_tp_gather_act(g, x, g->gather, part));
    *full = g->gather;
    return 0;
}

/* The gradient of a row-parallel layer's output, every row: dres, or
 * under sp its rows all-gathered (into g->dgather). */
int loco__gpt_cuda_row_dout(loco_gpt_cuda *g, int N, const void **dout) {
    *dout = g->dres;
    if (!g->sp)
        return 0;
    const size_t part = (size_t)rows_of(g, N) * g->cfg.n_embd;
    LOCO_CHECK(loco__gpt_cuda_tp_gather_act(g, g->dres, g->dgather, part));
    *dout = g->dgather;
    return 0;
}

/* A column-parallel layer's backward (c_attn, c_fc, the head): its input
 * gradient dbtc (N, C) = dout @ w^T summed over tp (all-reduced, or under
 * sp reduce-scattered into dbtc's first rows, this rank's), and dw, db
 * from its input x (this rank's rows of a norm's output, gathered again
 * under sp when gather_x). Under tp the input half runs first and its
 * staged sum's collective overlaps the weight half on the device
 * (loco__gpt_cuda_tp_sum_begin); kv: c_attn's key/value columns shared
 * by tp ranks, summed over them. dw and db NULL: the input half only (a
 * split B; column_parallel_wgrad is its W). */
static int column_parallel_wgrad(loco_gpt_cuda *g, const void *dout, const void *x,
                                 bool gather_x, float *dw, float *db, const void *w, int OC, int N,
                                 bool wt, bool kv) {
    if (gather_x)
        LOCO_CHECK(loco__gpt_cuda_column_input(g, x, N, &x));
    if (kv)
        LOCO_CHECK(loco__gpt_cuda_kv_begin(g, dw, db));
    RUN(LOCO_PROF_MATMUL,
        TWIN(matmul_bwd, g->blas, NULL, dw, db, dout, x, w, N, g->cfg.n_embd, OC, wt, g->stream));
    if (kv)
        LOCO_CHECK(loco__gpt_cuda_kv_end(g, dw, db));
    return 0;
}

static int column_parallel_bwd(loco_gpt_cuda *g, const void *dout, const void *x, bool gather_x,
                               float *dw, float *db, const void *w, int OC, int N, bool wt,
                               bool kv) {
    const size_t C = (size_t)g->cfg.n_embd;
    loco_blas *h = g->blas;
    RUN(LOCO_PROF_ELEM, loco_cuda_zero(g->dbtc, (size_t)N * C * g->es, g->stream));
    if (g->tp == 1) {
        RUN(LOCO_PROF_MATMUL, TWIN(matmul_bwd, h, g->dbtc, dw, db, dout, x, w, N, (int)C, OC, wt,
                                   g->stream));
        return 0;
    }
    RUN(LOCO_PROF_MATMUL, TWIN(matmul_bwd, h, g->dbtc, NULL, NULL, dout, x, w, N, (int)C, OC, wt,
                               g->stream));
    LOCO_CHECK(loco__gpt_cuda_tp_sum_begin(g, g->dbtc, (size_t)N * C,
                                           (size_t)rows_of(g, N) * C));
    if (dw || db)
        LOCO_CHECK(column_parallel_wgrad(g, dout, x, gather_x, dw, db, w, OC, N, wt, kv));
    return loco__gpt_cuda_tp_sum_finish(g);
}

/* A row-parallel layer (attn.c_proj, mlp.c_proj): out (N, C) = in (N, K)
 * @ w, summed over tp (under sp reduce-scattered: out's first rows, this
 * rank's), then + bias once (model_tp.c's order). */
static int row_parallel_fwd(loco_gpt_cuda *g, void *out, const void *in, const void *w,
                            const void *bias, int N, int K) {
    const int C = g->cfg.n_embd;
    if (g->tp == 1) {
        RUN(LOCO_PROF_MATMUL, TWIN(matmul_fwd, g->blas, out, in, w, bias, N, K, C, false,
                                   g->stream));
        return 0;
    }
    RUN(LOCO_PROF_MATMUL,
        TWIN(matmul_fwd, g->blas, out, in, w, NULL, N, K, C, false, g->stream));
    if (g->sp)
        LOCO_CHECK(loco__gpt_cuda_tp_scatter_act(g, out, (size_t)rows_of(g, N) * C));
    else
        LOCO_CHECK(loco__gpt_cuda_tp_sum_act(g, out, (size_t)N * C));
    if (bias)
        RUN(LOCO_PROF_ELEM, TWIN(bias_fwd, out, bias, rows_of(g, N), C, g->stream));
    return 0;
}

/* Block l's forward from its input into g->la[l] (its unit's weights
 * bound): the forward pass, and again in the backward of a recomputed
 * block. Under tp: this rank's heads and MLP columns. */
int loco__gpt_cuda_block_fwd(loco_gpt_cuda *g, int l, int B, int T) {
    const int C = g->cfg.n_embd, Wd = g->Wl, Fc = g->Fl, F = g->Hl;
    const bool swiglu = g->cfg.mlp == LOCO_MLP_SWIGLU;
    const int N = B * T, R = rows_of(g, N);
    const size_t nc = (size_t)R * C; /* this rank's rows of the residual stream */
    loco_blas *h = g->blas;
    loco_stream s = g->stream;
    char n[LOCO_TENSOR_NAME_MAX];
#define LW(suffix) (snprintf(n, sizeof n, "transformer.h.%d.%s", l, suffix), W(n))
    layer_acts *a = &g->la[l];
    const void *res = residual_in(g, l), *x;
    LOCO_CHECK(norm_fwd(g, a->ln1, a->ln1m, a->ln1r, res, LW("ln_1.weight"), LW("ln_1.bias"), R));
    LOCO_CHECK(loco__gpt_cuda_column_input(g, a->ln1, N, &x));
    RUN(LOCO_PROF_MATMUL, TWIN(matmul_fwd, h, a->qkv, x, LW("attn.c_attn.weight"),
                               LW("attn.c_attn.bias"), N, C, Wd, false, s));
    LOCO_CHECK(rope(g, a->qkv, B, T, false));
    LOCO_CHECK(attention_fwd(g, a, B, T));
    LOCO_CHECK(row_parallel_fwd(g, g->scratch, a->atty, LW("attn.c_proj.weight"),
                                LW("attn.c_proj.bias"), N, g->Cl));
    RUN(LOCO_PROF_ELEM, TWIN(residual_fwd, a->res2, res, g->scratch, nc, s));
    LOCO_CHECK(
        norm_fwd(g, a->ln2, a->ln2m, a->ln2r, a->res2, LW("ln_2.weight"), LW("ln_2.bias"), R));
    if (loco__gpt_cuda_is_moe(g, l)) { /* the experts' MLP, into scratch (gpt_cuda_moe.c) */
        LOCO_CHECK(loco__gpt_cuda_moe_fwd(g, l, B, T));
        RUN(LOCO_PROF_ELEM, TWIN(residual_fwd, a->res3, a->res2, g->scratch, nc, s));
        return 0;
    }
    LOCO_CHECK(loco__gpt_cuda_column_input(g, a->ln2, N, &x));
    if (swiglu) {
        RUN(LOCO_PROF_MATMUL, TWIN(matmul_fwd, h, a->fch, x, LW("mlp.c_fc.weight"),
                                   LW("mlp.c_fc.bias"), N, C, Fc, false, s));
        RUN(LOCO_PROF_ELEM, TWIN(swiglu_fwd, a->fchg, a->fch, N, F, s));
    } else {
        RUN(LOCO_PROF_MATMUL, TWIN(matmul_gelu_fwd, h, a->fchg, a->fch, x,
                                   LW("mlp.c_fc.weight"), LW("mlp.c_fc.bias"), N, C, Fc, s));
    }
    LOCO_CHECK(row_parallel_fwd(g, g->scratch, a->fchg, LW("mlp.c_proj.weight"),
                                LW("mlp.c_proj.bias"), N, F));
    RUN(LOCO_PROF_ELEM, TWIN(residual_fwd, a->res3, a->res2, g->scratch, nc, s));
#undef LW
    return 0;
}

/* The embeddings' forward into g->encoded (unit 0's weights bound). */
int loco__gpt_cuda_embed_fwd(loco_gpt_cuda *g, int B, int T) {
    const int C = g->cfg.n_embd;
    const void *wpe = W("transformer.wpe.weight"); /* NULL with RoPE */
    if (wpe && g->cpc) /* the rows at this rank's positions */
        LOCO_CHECK(loco__gpt_cuda_cp_wpe(g, wpe, &wpe));
    if (g->tp > 1) /* vocabulary-parallel: this rank's rows, summed over tp */
        return loco__gpt_cuda_tp_embed_fwd(g, W("transformer.wte.weight"), wpe, B, T);
    RUN(LOCO_PROF_ELEM, TWIN(encoder_fwd, g->encoded, g->inputs, W("transformer.wte.weight"), wpe,
                             B, T, C, g->stream));
    return 0;
}

/* ln_f and the head on the last block's output: logits (N, Vp). */
int loco__gpt_cuda_head_fwd(loco_gpt_cuda *g, int N) {
    const int C = g->cfg.n_embd, L = g->cfg.n_layer;
    /* under sp this rank's rows of ln_f land in place in the whole (N, C)
     * buffer, which the all-gather then completes */
    const int R = rows_of(g, N);
    void *lnf_rows = g->sp ? (char *)g->lnf + (size_t)R * g->tp_rank * C * g->es : g->lnf;
    LOCO_CHECK(norm_fwd(g, lnf_rows, g->lnfm, g->lnfr, g->la[L - 1].res3,
                        W("transformer.ln_f.weight"), W("transformer.ln_f.bias"), R));
    if (g->sp)
        LOCO_CHECK(loco__gpt_cuda_tp_gather_act(g, lnf_rows, g->lnf, (size_t)R * C));
    RUN(LOCO_PROF_MATMUL, TWIN(matmul_fwd, g->blas, g->logits, g->lnf, g->wte_pad, NULL, N, C,
                               g->Vp, true, g->stream));
    return 0;
}

/* Cross-entropy over the V real columns of the Vp (dlogits in place,
 * scaled by dscale, 0 on the padding; under tp vocabulary-parallel, the
 * gradient only in the backward) and the mean loss on the device, added
 * to loss_acc when acc (the backward). */
int loco__gpt_cuda_loss(loco_gpt_cuda *g, int N, float dscale, bool acc) {
    if (g->tp > 1)
        LOCO_CHECK(loco__gpt_cuda_tp_xent(g, N, dscale, acc));
    else
        RUN(LOCO_PROF_XENT, TWIN(xent_fwd_bwd, g->losses, g->logits, g->logits, g->targets, N,
                                 g->cfg.vocab_size, g->Vp, dscale, g->stream));
    RUN(LOCO_PROF_XENT,
        loco_cuda_mean_acc(g->mean, acc ? g->loss_acc : NULL, g->losses, N, g->stream));
    return 0;
}

/* Copies an output gradient a split B keeps for its W (n elements). */
static int keep(loco_gpt_cuda *g, void *dst, const void *src, size_t n) {
    RUN(LOCO_PROF_ELEM, loco_cuda_copy(dst, src, n * g->es, g->stream));
    return 0;
}

/* The head's backward from dlogits (in g->logits) through ln_f into
 * g->dres (this rank's rows): ln_f's gradients, and (unless split) the
 * head's weight gradient. */
int loco__gpt_cuda_head_bwd(loco_gpt_cuda *g, int N, bool split) {
    const int C = g->cfg.n_embd, L = g->cfg.n_layer, R = rows_of(g, N);
    /* column-parallel under tp (vocabulary rows): ln_f's input gradient
     * summed; lnf holds every row already */
    LOCO_CHECK(column_parallel_bwd(g, g->logits, g->lnf, false, split ? NULL : g->dwte_pad, NULL,
                                   g->wte_pad, g->Vp, N, true, false));
    /* the head's V real rows into the flat gradient; the side buffer is
     * cleared for the next pass (its padding rows are exactly 0: their
     * dlogits are) */
    if (!split)
        RUN(LOCO_PROF_ELEM,
            loco_cuda_add_clear(G(g->head), g->dwte_pad, (size_t)g->Vl * C, g->stream));
    RUN(LOCO_PROF_ELEM, loco_cuda_zero(g->dres, (size_t)R * C * g->es, g->stream));
    /* under sp the norm's weight gradients from this rank's rows collect
     * in drep (w | b), summed over tp after its backward */
    float *gw = G("transformer.ln_f.weight"), *gb = G("transformer.ln_f.bias");
    float *rw = g->sp ? g->drep : gw, *rb = g->sp && gb ? g->drep + C : gb;
    LOCO_CHECK(norm_bwd(g, g->dres, rw, rb, g->dbtc, g->la[L - 1].res3,
                        W("transformer.ln_f.weight"), g->lnfm, g->lnfr, R));
    float *dst[2] = {gw, gb};
    const size_t len[2] = {(size_t)C, (size_t)C};
    return g->sp ? loco__gpt_cuda_sp_reduce(g, dst, len, 2) : 0;
}

/* A split B's W of the head: its weight gradient from the slot's dlogits. */
int loco__gpt_cuda_head_bwd_weight(loco_gpt_cuda *g, int N) {
    LOCO_CHECK(column_parallel_wgrad(g, g->logits, g->lnf, false, g->dwte_pad, NULL, g->wte_pad,
                                     g->Vp, N, true, false));
    RUN(LOCO_PROF_ELEM, loco_cuda_add_clear(G(g->head), g->dwte_pad,
                                            (size_t)g->Vl * g->cfg.n_embd, g->stream));
    return 0;
}

/* Block l's backward from g->dres (its output's gradient, this rank's
 * rows) to its input's, in place; its norms' gradients, and unless split
 * its GEMMs' weight and bias gradients (split: their output gradients
 * kept in the block's k* buffers for loco__gpt_cuda_block_bwd_weight). */
int loco__gpt_cuda_block_bwd(loco_gpt_cuda *g, int l, int B, int T, bool split) {
    /* V: the head's rows (this tp rank's); widths of its slice */
    const int C = g->cfg.n_embd, Wd = g->Wl, Fc = g->Fl, F = g->Hl;
    const bool swiglu = g->cfg.mlp == LOCO_MLP_SWIGLU;
    const int N = B * T, R = rows_of(g, N);
    const size_t nc = (size_t)N * C, es = g->es;
    loco_blas *h = g->blas;
    loco_stream s = g->stream;
    /* under sp the norms' weight gradients from this rank's rows collect
     * in drep (ln_1 w | b | ln_2 w | b), summed over tp after the block */
    float *drep[4] = {0};
    for (int k = 0; g->sp && k < 4; k++)
        drep[k] = g->drep + (size_t)k * C;
    char n[LOCO_TENSOR_NAME_MAX];
#define LW(suffix) (snprintf(n, sizeof n, "transformer.h.%d.%s", l, suffix), W(n))
#define LG(suffix) (snprintf(n, sizeof n, "transformer.h.%d.%s", l, suffix), G(n))
#define SPLIT(p) (split ? NULL : (p))
    layer_acts *a = &g->la[l];
    const void *res = residual_in(g, l);
    /* residual3 = residual2 + fcproj: dres flows to both. bf16: GELU's
     * gradient in the GEMM's epilogue writes dfch (no dfchg pass). */
    const void *dout;
    if (loco__gpt_cuda_is_moe(g, l)) { /* the experts' MLP, B and W at once (gpt_cuda_moe.c) */
        LOCO_CHECK(loco__gpt_cuda_moe_bwd(g, l, B, T));
    } else {
        LOCO_CHECK(loco__gpt_cuda_row_dout(g, N, &dout));
        if (split)
            LOCO_CHECK(keep(g, a->kmlp, dout, nc));
        int unfused = 1;
        if (g->bf16 && !swiglu)
            RUN(LOCO_PROF_MATMUL, unfused = loco_cuda_matmul_bwd_dgelu_bf16(
                                      h, g->dfch, SPLIT(LG("mlp.c_proj.weight")),
                                      SPLIT(LG("mlp.c_proj.bias")), dout, a->fchg,
                                      LW("mlp.c_proj.weight"), a->fch, N, F, C, s));
        if (unfused) {
            RUN(LOCO_PROF_ELEM, loco_cuda_zero(g->dfchg, (size_t)N * F * es, s));
            RUN(LOCO_PROF_MATMUL, TWIN(matmul_bwd, h, g->dfchg, SPLIT(LG("mlp.c_proj.weight")),
                                       SPLIT(LG("mlp.c_proj.bias")), dout, a->fchg,
                                       LW("mlp.c_proj.weight"), N, F, C, false, s));
            RUN(LOCO_PROF_ELEM, loco_cuda_zero(g->dfch, (size_t)N * Fc * es, s));
            if (swiglu)
                RUN(LOCO_PROF_ELEM, TWIN(swiglu_bwd, g->dfch, a->fch, g->dfchg, N, F, s));
            else
                RUN(LOCO_PROF_ELEM, TWIN(gelu_bwd, g->dfch, a->fch, g->dfchg, (size_t)N * F, s));
        }
        if (split)
            LOCO_CHECK(keep(g, a->kfch, g->dfch, (size_t)N * Fc));
        LOCO_CHECK(column_parallel_bwd(g, g->dfch, a->ln2, true, SPLIT(LG("mlp.c_fc.weight")),
                                       SPLIT(LG("mlp.c_fc.bias")), LW("mlp.c_fc.weight"), Fc, N,
                                       false, false));
    }
    float *ln2w = LG("ln_2.weight"), *ln2b = LG("ln_2.bias");
    LOCO_CHECK(norm_bwd(g, g->dres, g->sp ? drep[2] : ln2w, g->sp && ln2b ? drep[3] : ln2b, g->dbtc,
                        a->res2, LW("ln_2.weight"), a->ln2m, a->ln2r, R));
    /* residual2 = res + attproj: dres flows to both. */
    RUN(LOCO_PROF_ELEM, loco_cuda_zero(g->dbtc, nc * es, s));
    LOCO_CHECK(loco__gpt_cuda_row_dout(g, N, &dout));
    if (split)
        LOCO_CHECK(keep(g, a->kattn, dout, nc));
    RUN(LOCO_PROF_MATMUL,
        TWIN(matmul_bwd, h, g->dbtc, SPLIT(LG("attn.c_proj.weight")), SPLIT(LG("attn.c_proj.bias")),
             dout, a->atty, LW("attn.c_proj.weight"), N, g->Cl, C, false, s));
    RUN(LOCO_PROF_ELEM, loco_cuda_zero(g->dqkv, (size_t)N * Wd * es, s));
    LOCO_CHECK(attention_bwd(g, a, B, T));
    LOCO_CHECK(rope(g, g->dqkv, B, T, true));
    if (split)
        LOCO_CHECK(keep(g, a->kqkv, g->dqkv, (size_t)N * Wd));
    /* kv_keep: key/value heads shared by tp ranks, summed over them */
    LOCO_CHECK(column_parallel_bwd(g, g->dqkv, a->ln1, true, SPLIT(LG("attn.c_attn.weight")),
                                   SPLIT(LG("attn.c_attn.bias")), LW("attn.c_attn.weight"), Wd, N,
                                   false, g->kv_keep != NULL));
    float *ln1w = LG("ln_1.weight"), *ln1b = LG("ln_1.bias");
    LOCO_CHECK(norm_bwd(g, g->dres, g->sp ? drep[0] : ln1w, g->sp && ln1b ? drep[1] : ln1b,
                        g->dbtc, res, LW("ln_1.weight"), a->ln1m, a->ln1r, R));
    if (g->sp) {
        float *dst[4] = {ln1w, ln1b, ln2w, ln2b};
        const size_t len[4] = {(size_t)C, (size_t)C, (size_t)C, (size_t)C};
        LOCO_CHECK(loco__gpt_cuda_sp_reduce(g, dst, len, 4));
    }
    return 0;
}

/* A split B's W of block l: the four GEMMs' weight and bias gradients
 * from the output gradients it kept and the slot's activations. */
int loco__gpt_cuda_block_bwd_weight(loco_gpt_cuda *g, int l, int B, int T) {
    const int C = g->cfg.n_embd, N = B * T;
    loco_blas *h = g->blas;
    loco_stream s = g->stream;
    char n[LOCO_TENSOR_NAME_MAX];
    const layer_acts *a = &g->la[l];
    if (!loco__gpt_cuda_is_moe(g, l)) { /* an MoE block's B did its experts' W */
        RUN(LOCO_PROF_MATMUL, TWIN(matmul_bwd, h, NULL, LG("mlp.c_proj.weight"),
                                   LG("mlp.c_proj.bias"), a->kmlp, a->fchg,
                                   LW("mlp.c_proj.weight"), N, g->Hl, C, false, s));
        LOCO_CHECK(column_parallel_wgrad(g, a->kfch, a->ln2, true, LG("mlp.c_fc.weight"),
                                         LG("mlp.c_fc.bias"), LW("mlp.c_fc.weight"), g->Fl, N,
                                         false, false));
    }
    RUN(LOCO_PROF_MATMUL, TWIN(matmul_bwd, h, NULL, LG("attn.c_proj.weight"),
                               LG("attn.c_proj.bias"), a->kattn, a->atty,
                               LW("attn.c_proj.weight"), N, g->Cl, C, false, s));
    return column_parallel_wgrad(g, a->kqkv, a->ln1, true, LG("attn.c_attn.weight"),
                                 LG("attn.c_attn.bias"), LW("attn.c_attn.weight"), g->Wl, N, false,
                                 g->kv_keep != NULL);
#undef LW
#undef LG
#undef SPLIT
}

/* The embeddings' backward from g->dres (block 0's input gradient). */
int loco__gpt_cuda_embed_bwd(loco_gpt_cuda *g, int B, int T) {
    float *dwpe = G("transformer.wpe.weight");
    float *dwpe_rows = dwpe && g->cpc ? g->cp_dwpe : dwpe; /* cp: the local rows' */
    if (g->tp > 1)
        LOCO_CHECK(loco__gpt_cuda_tp_embed_bwd(g, G("transformer.wte.weight"), dwpe_rows, B, T));
    else
        RUN(LOCO_PROF_ELEM, TWIN(encoder_bwd, G("transformer.wte.weight"), dwpe_rows, g->dres,
                                 g->inputs, B, T, g->cfg.n_embd, g->stream));
    if (dwpe && g->cpc)
        LOCO_CHECK(loco__gpt_cuda_cp_dwpe_done(g, dwpe));
    return 0;
}

#endif /* LOCO_HAVE_CUDA */
