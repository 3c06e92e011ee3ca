/* The block description every path reads: model.arch and its keys
 * resolved into loco_gpt_config (loco_gpt_config_from), what a description
 * may be and which paths take it so far, the tensors of a block in table
 * order (one list that the table and the views both read), the table
 * itself and the FLOPs a token costs. A new feature is added here. */
#include "inner/model/internal.h"

#include <stddef.h>
#include <string.h>

loco_gpt_config loco_gpt_config_from(const loco_config *cfg) {
    loco_gpt_config c = {
        .n_layer = (int)cfg->model.n_layer,
        .n_head = (int)cfg->model.n_head,
        .n_embd = (int)cfg->model.n_embd,
        .seq_len = (int)cfg->model.seq_len,
        .vocab_size = (int)cfg->model.vocab_size,
        .n_experts = (int)cfg->model.n_experts,
        .top_k = (int)cfg->model.top_k,
        .moe_every = (int)cfg->model.moe_every,
        .n_shared_experts = (int)cfg->model.n_shared_experts,
        .capacity_factor = (float)cfg->model.capacity_factor,
        .aux_loss = (float)cfg->model.aux_loss,
        .z_loss = (float)cfg->model.z_loss,
        .router_bias_rate = (float)cfg->model.router_bias_rate,
    };
    /* model.arch's preset for each key left at auto */
    const bool llama = !strcmp(cfg->model.arch, "llama");
#define PICK(key, want, when_auto)                                                                 \
    (!strcmp(cfg->model.key, "auto") ? (when_auto) : !strcmp(cfg->model.key, want))
    c.norm = PICK(norm, "rmsnorm", llama) ? LOCO_NORM_RMSNORM : LOCO_NORM_LAYERNORM;
    c.pos = PICK(pos, "rope", llama) ? LOCO_POS_ROPE : LOCO_POS_LEARNED;
    c.mlp = PICK(mlp, "swiglu", llama) ? LOCO_MLP_SWIGLU : LOCO_MLP_GELU;
    c.no_bias = PICK(bias, "false", llama);
    c.untied = PICK(tie_embeddings, "false", llama);
#undef PICK
    c.norm_eps = (float)cfg->model.norm_eps;
    c.rope_theta = (float)cfg->model.rope_theta;
    c.rope_factor = (float)cfg->model.rope_scaling_factor;
    c.rope_low_freq = (float)cfg->model.rope_low_freq_factor;
    c.rope_high_freq = (float)cfg->model.rope_high_freq_factor;
    c.rope_original_max_pos = (int)cfg->model.rope_original_max_pos;
    c.ffn_hidden = (int)cfg->model.ffn_hidden;
    c.n_kv_head = (int)cfg->model.n_kv_head;
    return c;
}

/* The shapes a description allows, and the paths that take it so far. */
int loco__gpt_check_description(const loco_gpt_config *cfg) {
    const int NH = cfg->n_head, NKV = loco_gpt_kv_heads(cfg);
    if (NKV < 1 || NH % NKV)
        return LOCO_ERR(LOCO_EINVAL,
                        "model.n_kv_head = %d must divide model.n_head = %d (grouped-query "
                        "attention shares each key/value head among n_head / n_kv_head heads)",
                        NKV, NH);
    if (cfg->pos == LOCO_POS_ROPE && loco_gpt_head_size(cfg) % 2)
        return LOCO_ERR(LOCO_EINVAL, "model.pos = rope needs an even head size (n_embd / n_head "
                                     "= %d): RoPE turns pairs of dimensions",
                        loco_gpt_head_size(cfg));
    if (cfg->norm == LOCO_NORM_LAYERNORM && loco_gpt_norm_eps(cfg) != 1e-5f)
        return LOCO_ERR(LOCO_EINVAL, "model.norm_eps = %g: layernorm runs at GPT-2's 1e-5 only "
                                     "(other values with model.norm = rmsnorm)",
                        (double)cfg->norm_eps);
    if (loco_gpt_is_gpt2(cfg))
        return 0;
    const int t = loco__gpt_tp_of(cfg);
    if (t > 1 && NKV % t && t % NKV)
        return LOCO_ERR(LOCO_EINVAL,
                        "parallel.tp = %d with model.n_kv_head = %d: tensor parallelism splits "
                        "whole key/value heads over tp, or, when there are fewer, replicates "
                        "each on tp / n_kv_head ranks; neither divides the other",
                        t, NKV);
    if (t > 1 && loco_gpt_ffn(cfg) % t)
        return LOCO_ERR(LOCO_EINVAL,
                        "parallel.tp = %d must divide the MLP's hidden width %d "
                        "(model.ffn_hidden): Megatron splits whole columns",
                        t, loco_gpt_ffn(cfg));
    return 0;
}

int loco__gpt_block_tensors(const loco_gpt_config *cfg, int l, loco__gpt_block_tensor *out) {
    const int t = loco__gpt_tp_of(cfg);
    const int64_t C = cfg->n_embd, Cl = C / t, Wl = loco__gpt_qkv_local(cfg);
    const int64_t Fl = loco_gpt_fc_width(cfg) / t, Hl = loco_gpt_ffn(cfg) / t;
    const bool ln = cfg->norm == LOCO_NORM_LAYERNORM, bias = !cfg->no_bias;
    int n = 0;
#define T1(sfx, f, n0, sp, parts)                                                                  \
    out[n++] = (loco__gpt_block_tensor){                                                           \
        sfx, offsetof(loco_gpt_block, f), 1, {n0, 0}, sp, parts, {0}, {0}, false}
#define T2(sfx, f, n0, n1, sp, parts)                                                              \
    out[n++] = (loco__gpt_block_tensor){                                                           \
        sfx, offsetof(loco_gpt_block, f), 2, {n0, n1}, sp, parts, {0}, {0}, true}
    T1("ln_1.weight", ln1w, C, -1, 0);
    if (ln)
        T1("ln_1.bias", ln1b, C, -1, 0);
    /* q, k and v each split by heads; with grouped-query attention the
     * parts differ: NH, NKV and NKV heads */
    const int64_t hs = loco_gpt_head_size(cfg), NKV = loco_gpt_kv_heads(cfg);
    const int64_t gqa[3] = {cfg->n_head * hs, NKV * hs, NKV * hs};
    const int units[3] = {cfg->n_head, (int)NKV, (int)NKV};
    T2("attn.c_attn.weight", qkvw, C, Wl, 1, 3);
    if (NKV != cfg->n_head) {
        memcpy(out[n - 1].part_len, gqa, sizeof gqa);
        memcpy(out[n - 1].part_units, units, sizeof units);
    }
    if (bias) {
        T1("attn.c_attn.bias", qkvb, Wl, 0, 3);
        if (NKV != cfg->n_head) {
            memcpy(out[n - 1].part_len, gqa, sizeof gqa);
            memcpy(out[n - 1].part_units, units, sizeof units);
        }
    }
    T2("attn.c_proj.weight", attprojw, Cl, C, 0, 0);
    if (bias)
        T1("attn.c_proj.bias", attprojb, C, -1, 0);
    T1("ln_2.weight", ln2w, C, -1, 0);
    if (ln)
        T1("ln_2.bias", ln2b, C, -1, 0);
    if (loco_gpt_is_moe(cfg, l)) {
        T2("mlp.router.weight", routerw, cfg->n_experts, C, -1, 0);
        return n; /* the experts follow (build_table adds them) */
    }
    const int gate_up = cfg->mlp == LOCO_MLP_SWIGLU ? 2 : 0;
    T2("mlp.c_fc.weight", fcw, C, Fl, 1, gate_up); /* SwiGLU: gate and up each split */
    if (bias)
        T1("mlp.c_fc.bias", fcb, Fl, 0, gate_up);
    T2("mlp.c_proj.weight", fcprojw, Hl, C, 0, 0);
    if (bias)
        T1("mlp.c_proj.bias", fcprojb, C, -1, 0);
#undef T1
#undef T2
    return n;
}

int loco_gpt_build_table(loco_ttable *tt, const loco_gpt_config *cfg) {
    const int t = loco__gpt_tp_of(cfg);
    LOCO_CHECK(loco__gpt_check_description(cfg));
    if (cfg->n_head % t || (4 * (int64_t)cfg->n_embd) % t)
        return LOCO_ERR(LOCO_EINVAL,
                        "parallel.tp = %d must divide model.n_head (%d) and 4 x model.n_embd "
                        "(%lld): Megatron tensor parallelism splits whole heads and MLP columns",
                        t, cfg->n_head, 4 * (long long)cfg->n_embd);
    const int64_t C = cfg->n_embd, maxT = cfg->seq_len;
    const int64_t Vl = loco_gpt_vocab_padded(cfg) / t;
    loco_ttable_init(tt);
    /* split_dim: the dimension Megatron-style tensor parallelism splits —
     * columns of c_attn/c_fc (dim 1 in Conv1D layout), rows of the output
     * projections (dim 0), vocabulary rows of wte. The shapes are the slice
     * one tp rank holds (the whole tensor when tp = 1). */
    int rc;
#define ADD1(name, n0, split, decay)                                                               \
    LOCO_CHECK_GOTO(loco_ttable_add(tt, name, 1, (int64_t[]){n0}, split, decay), out_fail)
#define ADD2(name, n0, n1, split)                                                                  \
    LOCO_CHECK_GOTO(loco_ttable_add(tt, name, 2, (int64_t[]){n0, n1}, split, true), out_fail)
    ADD2("transformer.wte.weight", Vl, C, 0);
    if (cfg->pos == LOCO_POS_LEARNED)
        ADD2("transformer.wpe.weight", maxT, C, -1);
    for (int l = 0; l < cfg->n_layer; l++) {
        char n[LOCO_TENSOR_NAME_MAX];
#define NAME(suffix) (snprintf(n, sizeof n, "transformer.h.%d.%s", l, suffix), n)
        loco__gpt_block_tensor bt[LOCO__GPT_BLOCK_TENSORS_MAX];
        const int nb = loco__gpt_block_tensors(cfg, l, bt);
        for (int i = 0; i < nb; i++) {
            LOCO_CHECK_GOTO(loco_ttable_add(tt, NAME(bt[i].suffix), bt[i].ndim, bt[i].shape,
                                            bt[i].split, bt[i].decay),
                            out_fail);
            if (bt[i].split_parts) /* else loco_ttable_add's one part */
                tt->t[tt->n - 1].split_parts = bt[i].split_parts;
            for (int p = 0; bt[i].part_len[0] && p < bt[i].split_parts; p++) {
                tt->t[tt->n - 1].part_len[p] = bt[i].part_len[p];
                tt->t[tt->n - 1].part_units[p] = bt[i].part_units[p];
            }
        }
        if (loco_gpt_is_moe(cfg, l)) {
            /* The shared experts (every rank's, replicated like the router)
             * before the routed ones: a block's dense tensors stay one
             * range, its ep-split experts one range at its end. */
            const int ep = cfg->ep > 1 ? cfg->ep : 1, El = cfg->n_experts / ep;
            const int64_t Fc = loco_gpt_fc_width(cfg) / t, F = loco_gpt_ffn(cfg) / t;
            /* Under tp each expert splits as the dense MLP (Megatron):
             * c_fc by columns (SwiGLU: gate and up each), c_proj by rows;
             * c_proj.bias is replicated and added once. */
            const int gate_up = cfg->mlp == LOCO_MLP_SWIGLU ? 2 : 0;
            for (int shared = 1; shared >= 0; shared--) {
                const int j0 = shared ? 0 : cfg->ep_rank * El;
                const int j1 = shared ? cfg->n_shared_experts : (cfg->ep_rank + 1) * El;
                for (int j = j0; j < j1; j++) {
                    char e[64];
#define EXPERT(suffix)                                                                             \
    (snprintf(e, sizeof e, "mlp.%s.%d.%s", shared ? "shared_experts" : "experts", j, suffix),    \
     NAME(e))
                    ADD2(EXPERT("c_fc.weight"), C, Fc, 1);
                    if (gate_up)
                        tt->t[tt->n - 1].split_parts = gate_up;
                    if (!cfg->no_bias) {
                        ADD1(EXPERT("c_fc.bias"), Fc, 0, false);
                        if (gate_up)
                            tt->t[tt->n - 1].split_parts = gate_up;
                    }
                    ADD2(EXPERT("c_proj.weight"), F, C, 0);
                    if (!cfg->no_bias)
                        ADD1(EXPERT("c_proj.bias"), C, -1, false);
#undef EXPERT
                }
            }
        }
#undef NAME
    }
    ADD1("transformer.ln_f.weight", C, -1, false);
    if (cfg->norm == LOCO_NORM_LAYERNORM)
        ADD1("transformer.ln_f.bias", C, -1, false);
    if (cfg->untied) /* the head's own weight, laid out as wte: (Vp/t, C) */
        ADD2("lm_head.weight", Vl, C, 0);
#undef ADD1
#undef ADD2
    return 0;
out_fail:
    loco_ttable_fini(tt);
    return rc;
}

double loco_gpt_flops_per_token(const loco_gpt_config *cfg, int T) {
    const double L = cfg->n_layer, C = cfg->n_embd, V = cfg->vocab_size;
    /* the matmul parameters a token meets: an MoE block's top_k experts,
     * its shared experts and its router in place of the MLP */
    double matmul_params = L * 12.0 * C * C + V * C;
    if (!loco_gpt_is_gpt2(cfg)) /* c_attn (C, W), c_proj (C, C), c_fc (C, Fc), c_proj (F, C) */
        matmul_params = L * C * ((double)loco_gpt_qkv_width(cfg) + C + loco_gpt_fc_width(cfg) +
                                 loco_gpt_ffn(cfg)) +
                        V * C;
    const double mlp = C * (double)loco_gpt_fc_width(cfg) + (double)loco_gpt_ffn(cfg) * C;
    for (int l = 0; l < cfg->n_layer; l++)
        if (loco_gpt_is_moe(cfg, l))
            matmul_params += (cfg->top_k - 1 + cfg->n_shared_experts) * mlp +
                             (double)cfg->n_experts * C;
    return 6.0 * matmul_params + 12.0 * L * C * T;
}

