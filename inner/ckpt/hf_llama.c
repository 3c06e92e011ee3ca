/* The Llama family in Hugging Face's LlamaForCausalLM layout: `loco ckpt
 * export` writes it, train.init_from reads it.
 *
 * loco keeps q, k and v side by side in one c_attn matrix [in, out] and
 * SwiGLU's gate and up in one c_fc; Hugging Face keeps each projection
 * apart as nn.Linear [out, in]. One map names every Hugging Face tensor
 * and where its elements are in loco's table: a block of columns of a
 * loco matrix, transposed, or a copy. Export and import walk the same
 * map. RoPE needs no permutation: loco turns the pairs (i, i + hs/2), the
 * rotate-half convention of Hugging Face's Llama code, so q_proj and
 * k_proj are plain column blocks (Meta's original checkpoints turn
 * interleaved pairs; Hugging Face's converter permutes those rows once,
 * and its files are what this reads and writes).
 *
 * A description with experts is MixtralForCausalLM's layout: every block
 * an MoE block (model.moe_every = 1), no biases; the router is
 * block_sparse_moe.gate (E, C), expert J's gate, down and up projections
 * block_sparse_moe.experts.J.w1, w2, w3. Shared experts, which no Mixtral
 * class has, go under DeepSeek's names and layout: the S of them side by
 * side along the hidden dimension as one MLP of width S F,
 * block_sparse_moe.shared_experts.{gate,up,down}_proj (config.json's
 * n_shared_experts says how many; make_llama_fixtures.py's PyTorch
 * reference reads them, Hugging Face's Mixtral would refuse the extra
 * tensors). Such a fused tensor is several map entries, one per shared
 * expert: pieces at their place in it. */
#include "inner/ckpt/internal.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One Hugging Face tensor: shape (rows) or (rows, cols), from loco tensor
 * src: element (r, k) = src[k * ld + col0 + r] (a column block of a
 * [in, out] matrix of ld columns, transposed), or src[col0 + r] for a 1-D
 * slice, or src[r * cols + k] when col0 < 0 (same layout). */
typedef struct {
    char name[LOCO_TENSOR_NAME_MAX];
    int64_t rows, cols; /* cols 0: 1-D */
    int src;            /* index in the whole (tp = 1) table */
    int64_t col0;
    /* The Hugging Face tensor this entry is a piece of: its shape (hrows,
     * hcols), and where the piece's (0, 0) lies in it (r0, k0); the whole
     * tensor (rows, cols at 0, 0) but for fused shared experts. Pieces of
     * one tensor are consecutive entries of the same name. */
    int64_t hrows, hcols, r0, k0;
} llama_map;

enum { LLAMA_MAP_PER_LAYER = 16 };

static int add(llama_map *m, int *n, const loco_ttable *tt, const char *src, int64_t rows,
               int64_t cols, int64_t col0, const char *fmt, ...) {
    const int i = loco_ttable_find(tt, src);
    if (i < 0)
        return LOCO_ERR(LOCO_EINVAL, "Llama layout: the model has no tensor %s", src);
    llama_map *e = &m[(*n)++];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->name, sizeof e->name, fmt, ap);
    va_end(ap);
    e->rows = rows, e->cols = cols, e->src = i, e->col0 = col0;
    e->hrows = rows, e->hcols = cols, e->r0 = e->k0 = 0;
    return 0;
}

/* The last entry is a piece of a (hrows, hcols) tensor at (r0, k0). */
static void piece(llama_map *m, int n, int64_t hrows, int64_t hcols, int64_t r0, int64_t k0) {
    llama_map *e = &m[n - 1];
    e->hrows = hrows, e->hcols = hcols, e->r0 = r0, e->k0 = k0;
}

/* Index of element (r, k) of entry e in its Hugging Face tensor. */
static size_t hf_index(const llama_map *e, int64_t r, int64_t k) {
    return (size_t)((e->r0 + r) * (e->hcols ? e->hcols : 1) + e->k0 + k);
}

/* Whether entry i starts a Hugging Face tensor (is not a later piece). */
static bool first_piece(const llama_map *m, int i) {
    return i == 0 || strcmp(m[i].name, m[i - 1].name);
}

/* Whether Hugging Face's Llama (or, with experts, Mixtral) class holds
 * this description. */
static int check_llama(const loco_gpt_config *mc, const char *what) {
    if (mc->norm != LOCO_NORM_RMSNORM || mc->pos != LOCO_POS_ROPE || mc->mlp != LOCO_MLP_SWIGLU)
        return LOCO_ERR(LOCO_ENOTSUP,
                        "%s: LlamaForCausalLM needs model.norm = rmsnorm, model.pos = rope and "
                        "model.mlp = swiglu (this model: %s, %s, %s); no Hugging Face class holds "
                        "the mix",
                        what, mc->norm == LOCO_NORM_RMSNORM ? "rmsnorm" : "layernorm",
                        mc->pos == LOCO_POS_ROPE ? "rope" : "learned",
                        mc->mlp == LOCO_MLP_SWIGLU ? "swiglu" : "gelu");
    if (mc->n_experts > 0 && (mc->moe_every != 1 || !mc->no_bias))
        return LOCO_ERR(LOCO_ENOTSUP,
                        "%s: MixtralForCausalLM needs every block a mixture of experts "
                        "(model.moe_every = 1, this model: %d) and no biases (model.bias = false, "
                        "this model: %s): Mixtral has neither dense blocks between its MoE blocks "
                        "nor biased experts",
                        what, mc->moe_every, mc->no_bias ? "false" : "true");
    return 0;
}

/* The map of a whole (tp = 1) table; *out freed by the caller. */
static int build_map(const loco_ttable *tt, const loco_gpt_config *mc, llama_map **out, int *n) {
    const int64_t C = mc->n_embd, hs = loco_gpt_head_size(mc), NH = mc->n_head;
    const int64_t NKV = loco_gpt_kv_heads(mc), F = loco_gpt_ffn(mc), V = mc->vocab_size;
    const int64_t E = mc->n_experts, S = mc->n_shared_experts;
    const int per_layer = LLAMA_MAP_PER_LAYER + (E > 0 ? 1 + 3 * (int)(E + S) : 0);
    llama_map *m = loco_alloc((size_t)(mc->n_layer * per_layer + 4) * sizeof *m);
    if (!m)
        return LOCO_ERR(LOCO_ENOMEM, "Llama tensor map");
    *n = 0;
    int rc;
    char src[LOCO_TENSOR_NAME_MAX];
#define ADD(srcname, rows, cols, col0, ...)                                                        \
    LOCO_CHECK_GOTO(add(m, n, tt, srcname, rows, cols, col0, __VA_ARGS__), out_fail)
    ADD("transformer.wte.weight", V, C, -1, "model.embed_tokens.weight");
    for (int l = 0; l < mc->n_layer; l++) {
#define SRC(sfx) (snprintf(src, sizeof src, "transformer.h.%d.%s", l, sfx), src)
#define HF "model.layers.%d."
        ADD(SRC("ln_1.weight"), C, 0, -1, HF "input_layernorm.weight", l);
        ADD(SRC("attn.c_attn.weight"), NH * hs, C, 0, HF "self_attn.q_proj.weight", l);
        ADD(SRC("attn.c_attn.weight"), NKV * hs, C, NH * hs, HF "self_attn.k_proj.weight", l);
        ADD(SRC("attn.c_attn.weight"), NKV * hs, C, (NH + NKV) * hs, HF "self_attn.v_proj.weight",
            l);
        if (!mc->no_bias) {
            ADD(SRC("attn.c_attn.bias"), NH * hs, 0, 0, HF "self_attn.q_proj.bias", l);
            ADD(SRC("attn.c_attn.bias"), NKV * hs, 0, NH * hs, HF "self_attn.k_proj.bias", l);
            ADD(SRC("attn.c_attn.bias"), NKV * hs, 0, (NH + NKV) * hs, HF "self_attn.v_proj.bias",
                l);
        }
        ADD(SRC("attn.c_proj.weight"), C, NH * hs, 0, HF "self_attn.o_proj.weight", l);
        if (!mc->no_bias)
            ADD(SRC("attn.c_proj.bias"), C, 0, -1, HF "self_attn.o_proj.bias", l);
        ADD(SRC("ln_2.weight"), C, 0, -1, HF "post_attention_layernorm.weight", l);
        if (E > 0) {
            char x[48];
#define MOE "model.layers.%d.block_sparse_moe."
#define XSRC(fmt, j) (snprintf(x, sizeof x, fmt, j), SRC(x))
            ADD(SRC("mlp.router.weight"), E, C, -1, MOE "gate.weight", l);
            for (int j = 0; j < E; j++) {
                ADD(XSRC("mlp.experts.%d.c_fc.weight", j), F, C, 0, MOE "experts.%d.w1.weight", l,
                    j);
                ADD(XSRC("mlp.experts.%d.c_proj.weight", j), C, F, 0, MOE "experts.%d.w2.weight",
                    l, j);
                ADD(XSRC("mlp.experts.%d.c_fc.weight", j), F, C, F, MOE "experts.%d.w3.weight", l,
                    j);
            }
            /* DeepSeek's fused shared experts: expert j is rows [j F, (j + 1) F) of
             * gate_proj and up_proj (S F, C), columns of down_proj (C, S F) */
            for (int j = 0; j < S; j++) {
                ADD(XSRC("mlp.shared_experts.%d.c_fc.weight", j), F, C, 0,
                    MOE "shared_experts.gate_proj.weight", l);
                piece(m, *n, S * F, C, j * F, 0);
            }
            for (int j = 0; j < S; j++) {
                ADD(XSRC("mlp.shared_experts.%d.c_fc.weight", j), F, C, F,
                    MOE "shared_experts.up_proj.weight", l);
                piece(m, *n, S * F, C, j * F, 0);
            }
            for (int j = 0; j < S; j++) {
                ADD(XSRC("mlp.shared_experts.%d.c_proj.weight", j), C, F, 0,
                    MOE "shared_experts.down_proj.weight", l);
                piece(m, *n, C, S * F, 0, j * F);
            }
#undef XSRC
#undef MOE
            continue;
        }
        ADD(SRC("mlp.c_fc.weight"), F, C, 0, HF "mlp.gate_proj.weight", l);
        ADD(SRC("mlp.c_fc.weight"), F, C, F, HF "mlp.up_proj.weight", l);
        if (!mc->no_bias) {
            ADD(SRC("mlp.c_fc.bias"), F, 0, 0, HF "mlp.gate_proj.bias", l);
            ADD(SRC("mlp.c_fc.bias"), F, 0, F, HF "mlp.up_proj.bias", l);
        }
        ADD(SRC("mlp.c_proj.weight"), C, F, 0, HF "mlp.down_proj.weight", l);
        if (!mc->no_bias)
            ADD(SRC("mlp.c_proj.bias"), C, 0, -1, HF "mlp.down_proj.bias", l);
#undef HF
#undef SRC
    }
    ADD("transformer.ln_f.weight", C, 0, -1, "model.norm.weight");
    if (mc->untied)
        ADD("lm_head.weight", V, C, -1, "lm_head.weight");
#undef ADD
    *out = m;
    return 0;
out_fail:
    loco_free(m);
    return rc;
}

/* Where element (r, k) of e is in its loco tensor (t: its table entry). */
static size_t src_index(const llama_map *e, const loco_tensor *t, int64_t r, int64_t k) {
    if (e->col0 < 0)
        return (size_t)(r * (e->cols ? e->cols : 1) + k);
    if (!e->cols)
        return (size_t)(e->col0 + r);
    return (size_t)(k * t->shape[1] + e->col0 + r);
}

/* ------------------------------------------------------------ config.json */

/* A float key as its shortest decimal (1e-05, not 9.99999974737875e-06). */
static double decimal(float x) {
    char s[32];
    snprintf(s, sizeof s, "%.7g", (double)x);
    return strtod(s, NULL);
}

static int write_config(const char *path, const loco_gpt_config *mc) {
    cJSON *j = cJSON_CreateObject();
    const bool moe = mc->n_experts > 0;
    cJSON_AddStringToObject(j, "model_type", moe ? "mixtral" : "llama");
    cJSON *arch = cJSON_AddArrayToObject(j, "architectures");
    cJSON_AddItemToArray(arch,
                         cJSON_CreateString(moe ? "MixtralForCausalLM" : "LlamaForCausalLM"));
    if (moe) {
        cJSON_AddNumberToObject(j, "num_local_experts", mc->n_experts);
        cJSON_AddNumberToObject(j, "num_experts_per_tok", mc->top_k);
        /* loco adds Switch's loss per MoE layer; Hugging Face's Mixtral
         * over the layers' concatenated router logits */
        cJSON_AddNumberToObject(j, "router_aux_loss_coef", decimal(mc->aux_loss));
        cJSON_AddNumberToObject(j, "router_z_loss_coef", decimal(mc->z_loss)); /* loco's */
        cJSON_AddBoolToObject(j, "output_router_logits", false);
        cJSON_AddNullToObject(j, "sliding_window");
        if (mc->n_shared_experts > 0) {
            /* DeepSeek's keys; no Mixtral class reads them (nor the shared
             * experts' tensors): make_llama_fixtures.py's reference does */
            cJSON_AddNumberToObject(j, "n_shared_experts", mc->n_shared_experts);
            cJSON_AddNumberToObject(j, "moe_intermediate_size", loco_gpt_ffn(mc));
        }
    }
    cJSON_AddNumberToObject(j, "vocab_size", mc->vocab_size);
    cJSON_AddNumberToObject(j, "hidden_size", mc->n_embd);
    cJSON_AddNumberToObject(j, "intermediate_size", loco_gpt_ffn(mc));
    cJSON_AddNumberToObject(j, "num_hidden_layers", mc->n_layer);
    cJSON_AddNumberToObject(j, "num_attention_heads", mc->n_head);
    cJSON_AddNumberToObject(j, "num_key_value_heads", loco_gpt_kv_heads(mc));
    cJSON_AddNumberToObject(j, "head_dim", loco_gpt_head_size(mc));
    cJSON_AddNumberToObject(j, "max_position_embeddings", mc->seq_len);
    cJSON_AddNumberToObject(j, "rms_norm_eps", decimal(loco_gpt_norm_eps(mc)));
    cJSON_AddNumberToObject(j, "rope_theta", decimal(mc->rope_theta > 0 ? mc->rope_theta : 1e4f));
    if (mc->rope_factor > 0) {
        cJSON *rs = cJSON_AddObjectToObject(j, "rope_scaling");
        cJSON_AddStringToObject(rs, "rope_type", "llama3");
        cJSON_AddNumberToObject(rs, "factor", decimal(mc->rope_factor));
        cJSON_AddNumberToObject(rs, "low_freq_factor", decimal(mc->rope_low_freq));
        cJSON_AddNumberToObject(rs, "high_freq_factor", decimal(mc->rope_high_freq));
        cJSON_AddNumberToObject(rs, "original_max_position_embeddings",
                                mc->rope_original_max_pos);
    } else {
        cJSON_AddNullToObject(j, "rope_scaling");
    }
    cJSON_AddStringToObject(j, "hidden_act", "silu");
    cJSON_AddBoolToObject(j, "attention_bias", !mc->no_bias);
    cJSON_AddBoolToObject(j, "mlp_bias", !mc->no_bias);
    cJSON_AddBoolToObject(j, "tie_word_embeddings", !mc->untied);
    cJSON_AddNumberToObject(j, "initializer_range", 0.02);
    cJSON_AddStringToObject(j, "torch_dtype", "float32");
    char *s = cJSON_Print(j);
    cJSON_Delete(j);
    if (!s)
        return LOCO_ERR(LOCO_ENOMEM, "config.json");
    int rc = loco_file_write_sync(path, s, strlen(s));
    cJSON_free(s);
    return rc;
}

static bool num(const cJSON *root, const char *key, double *out) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!cJSON_IsNumber(x))
        return false;
    *out = x->valuedouble;
    return true;
}

#define complain loco__hf_complain /* hf_import.c's, shared */

/* key (a number, `need` when it must be there) equal to the model's. */
static void expect_num(char *why, size_t cap, const cJSON *root, const char *key, double model,
                       const char *mkey, bool need) {
    double v;
    if (!num(root, key, &v)) {
        if (need)
            complain(why, cap, "%s missing (a number)", key);
        return;
    }
    if (fabs(v - model) > 1e-6 * fabs(model))
        complain(why, cap, "%s = %g but %s = %g", key, v, mkey, model);
}

static bool flag(const cJSON *root, const char *key, bool dflt) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(root, key);
    return cJSON_IsBool(x) ? cJSON_IsTrue(x) : dflt;
}

/* DIR/config.json against the model; every mismatch in one message. */
static int check_config(const char *dir, const loco_gpt_config *mc) {
    char path[LOCO_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *text;
    size_t len;
    LOCO_CHECK(loco_file_read(path, (void **)&text, &len));
    cJSON *root = cJSON_ParseWithLength(text, len);
    loco_free(text);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return LOCO_ERR(LOCO_EPROTO, "init_from %s: not a JSON object", path);
    }
    char why[2048] = "";
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    const char *type = mc->n_experts > 0 ? "mixtral" : "llama";
    if (!cJSON_IsString(x) || strcmp(x->valuestring, type))
        complain(why, sizeof why, "model_type = %s, not %s (model.n_experts = %d)",
                 cJSON_IsString(x) ? x->valuestring : "(missing)", type, mc->n_experts);
    if (mc->n_experts > 0) {
        expect_num(why, sizeof why, root, "num_local_experts", mc->n_experts, "model.n_experts",
                   true);
        expect_num(why, sizeof why, root, "num_experts_per_tok", mc->top_k, "model.top_k", true);
    }
    double shared;
    if (!num(root, "n_shared_experts", &shared))
        shared = 0;
    if (shared != mc->n_shared_experts)
        complain(why, sizeof why, "n_shared_experts = %g but model.n_shared_experts = %d", shared,
                 mc->n_shared_experts);
    expect_num(why, sizeof why, root, "hidden_size", mc->n_embd, "model.n_embd", true);
    expect_num(why, sizeof why, root, "num_hidden_layers", mc->n_layer, "model.n_layer", true);
    expect_num(why, sizeof why, root, "num_attention_heads", mc->n_head, "model.n_head", true);
    double v;
    if (!num(root, "num_key_value_heads", &v))
        v = mc->n_head; /* Hugging Face's default */
    if (v != loco_gpt_kv_heads(mc))
        complain(why, sizeof why, "num_key_value_heads = %g but model.n_kv_head = %d", v,
                 loco_gpt_kv_heads(mc));
    expect_num(why, sizeof why, root, "head_dim", loco_gpt_head_size(mc), "n_embd / n_head",
               false);
    expect_num(why, sizeof why, root, "intermediate_size", loco_gpt_ffn(mc), "model.ffn_hidden",
               true);
    expect_num(why, sizeof why, root, "vocab_size", mc->vocab_size, "model.vocab_size", true);
    if (num(root, "max_position_embeddings", &v) && v < mc->seq_len)
        complain(why, sizeof why, "max_position_embeddings = %g but model.seq_len = %d", v,
                 mc->seq_len);
    expect_num(why, sizeof why, root, "rms_norm_eps", loco_gpt_norm_eps(mc), "model.norm_eps",
               true);
    expect_num(why, sizeof why, root, "rope_theta", mc->rope_theta > 0 ? mc->rope_theta : 10000,
               "model.rope_theta", false);
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    if (cJSON_IsObject(rs)) {
        x = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
        if (!x)
            x = cJSON_GetObjectItemCaseSensitive(rs, "type");
        if (!cJSON_IsString(x) || strcmp(x->valuestring, "llama3"))
            complain(why, sizeof why, "rope_scaling.rope_type = %s: loco has llama3's only",
                     cJSON_IsString(x) ? x->valuestring : "(missing)");
        expect_num(why, sizeof why, rs, "factor", mc->rope_factor, "model.rope_scaling_factor",
                   true);
        expect_num(why, sizeof why, rs, "low_freq_factor", mc->rope_low_freq,
                   "model.rope_low_freq_factor", true);
        expect_num(why, sizeof why, rs, "high_freq_factor", mc->rope_high_freq,
                   "model.rope_high_freq_factor", true);
        expect_num(why, sizeof why, rs, "original_max_position_embeddings",
                   mc->rope_original_max_pos, "model.rope_original_max_pos", true);
    } else if (mc->rope_factor > 0) {
        complain(why, sizeof why, "no rope_scaling but model.rope_scaling_factor = %g",
                 (double)mc->rope_factor);
    }
    x = cJSON_GetObjectItemCaseSensitive(root, "hidden_act");
    if (cJSON_IsString(x) && strcmp(x->valuestring, "silu"))
        complain(why, sizeof why, "hidden_act = %s but loco's SwiGLU uses silu", x->valuestring);
    if (flag(root, "attention_bias", false) != !mc->no_bias ||
        flag(root, "mlp_bias", false) != !mc->no_bias)
        complain(why, sizeof why, "attention_bias / mlp_bias = %s / %s but model.bias = %s",
                 flag(root, "attention_bias", false) ? "true" : "false",
                 flag(root, "mlp_bias", false) ? "true" : "false", mc->no_bias ? "false" : "true");
    if (flag(root, "tie_word_embeddings", false) != !mc->untied)
        complain(why, sizeof why, "tie_word_embeddings = %s but model.tie_embeddings = %s",
                 flag(root, "tie_word_embeddings", false) ? "true" : "false",
                 mc->untied ? "false" : "true");
    cJSON_Delete(root);
    if (why[0])
        return LOCO_ERR(LOCO_EINVAL, "init_from %s: %s", path, why);
    return 0;
}

/* ----------------------------------------------------------------- export */

int loco__hf_llama_export(const char *out, const loco_ttable *tt, const float *params,
                          const loco_gpt_config *mc) {
    LOCO_CHECK(check_llama(mc, "loco ckpt export"));
    llama_map *m;
    int n;
    LOCO_CHECK(build_map(tt, mc, &m, &n));
    loco_ttable hf;
    loco_ttable_init(&hf);
    float *buf = NULL;
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        const int64_t shape[2] = {m[i].hrows, m[i].hcols};
        if (first_piece(m, i))
            rc = loco_ttable_add(&hf, m[i].name, m[i].hcols ? 2 : 1, shape, -1, m[i].hcols != 0);
    }
    if (rc == 0 && !(buf = loco_alloc(hf.numel * sizeof(float))))
        rc = LOCO_ERR(LOCO_ENOMEM, "export buffer of %zu floats", hf.numel);
    for (int i = 0, h = -1; i < n && rc == 0; i++) {
        h += first_piece(m, i); /* its tensor in hf */
        const loco_tensor *src = &tt->t[m[i].src];
        float *dst = buf + hf.t[h].offset;
        const int64_t cols = m[i].cols ? m[i].cols : 1;
        for (int64_t r = 0; r < m[i].rows; r++)
            for (int64_t k = 0; k < cols; k++)
                dst[hf_index(&m[i], r, k)] = params[src->offset + src_index(&m[i], src, r, k)];
    }
    char path[LOCO_PATH_MAX + 32];
    if (rc == 0) {
        snprintf(path, sizeof path, "%s/" MODEL_FILE, out);
        const char *meta[] = {"producer", "loco ckpt export", "format", "pt", NULL};
        rc = loco_st_write(path, &hf, buf, NULL, meta);
    }
    if (rc == 0) {
        snprintf(path, sizeof path, "%s/config.json", out);
        rc = write_config(path, mc);
    }
    loco_free(buf);
    loco_ttable_fini(&hf);
    loco_free(m);
    return rc;
}

/* ----------------------------------------------------------------- import */

/* Every tensor of the file is one of the map's, of its shape and a float
 * dtype; every one of the map's is there. found[i] receives map entry i's. */
static int check_tensors(const hf_file *f, const llama_map *m, int n, const hf_entry **found) {
    for (int i = 0; i < n; i++)
        found[i] = NULL;
    for (int i = 0; i < f->n; i++) {
        const hf_entry *e = &f->e[i];
        if (strstr(e->name, "rotary_emb.inv_freq")) /* a buffer older files keep */
            continue;
        int j = 0;
        while (j < n && strcmp(m[j].name, e->name))
            j++;
        if (j == n)
            return LOCO_ERR(LOCO_EINVAL,
                            "init_from %s: tensor '%s' is not part of this model's Llama layout "
                            "(model.tie_embeddings, model.bias, the experts and the shapes decide "
                            "which are)",
                            f->path, e->name);
        const int64_t want[2] = {m[j].hrows, m[j].hcols};
        const int wnd = m[j].hcols ? 2 : 1;
        if (e->ndim != wnd || e->shape[0] != want[0] || (wnd == 2 && e->shape[1] != want[1])) {
            char got[64], exp[64];
            loco__hf_shape_str(got, sizeof got, e->ndim, e->shape);
            loco__hf_shape_str(exp, sizeof exp, wnd, want);
            return LOCO_ERR(LOCO_EINVAL, "init_from %s: tensor '%s' is %s, the model needs %s",
                            f->path, e->name, got, exp);
        }
        if (e->dtype == HF_OTHER)
            return LOCO_ERR(LOCO_EINVAL, "init_from %s: tensor '%s' is %s (F32, F16 or BF16 only)",
                            f->path, e->name, e->dtype_name);
        found[j] = e;
    }
    for (int j = 0; j < n; j++) {
        if (!first_piece(m, j)) /* a later piece of the same tensor */
            found[j] = found[j - 1];
        if (!found[j])
            return LOCO_ERR(LOCO_EINVAL, "init_from %s: tensor '%s' missing", f->path, m[j].name);
    }
    return 0;
}

int loco__hf_llama_import_view(const char *dir, const loco_ckpt_view *v) {
    LOCO_CHECK(check_llama(&v->model, "init_from"));
    if (v->model.tp > 1)
        return LOCO_ERR(LOCO_ENOTSUP, "init_from %s: a Llama tp slice is not read yet", dir);
    LOCO_CHECK(check_config(dir, &v->model));
    loco_gpt_config whole_cfg = v->model;
    whole_cfg.tp = 1;
    whole_cfg.ep = 1, whole_cfg.ep_rank = 0; /* every expert; the view holds its own */
    loco_ttable whole;
    LOCO_CHECK(loco_gpt_build_table(&whole, &whole_cfg));
    llama_map *m = NULL;
    int n = 0;
    const hf_entry **found = NULL;
    hf_file f;
    memset(&f, 0, sizeof f);
    int rc = build_map(&whole, &whole_cfg, &m, &n);
    if (rc == 0 && !(found = loco_alloc((size_t)n * sizeof *found)))
        rc = LOCO_ERR(LOCO_ENOMEM, "tensor map");
    if (rc == 0)
        rc = loco__hf_file_open(&f, dir);
    if (rc == 0)
        rc = check_tensors(&f, m, n, found);
    /* Each element goes where the view holds its loco tensor (a pipeline
     * stage holds some tensors; a shard some range). */
    for (int i = 0; i < n && rc == 0; i++) {
        const loco_tensor *w = &whole.t[m[i].src];
        const int mine = loco_ttable_find(v->tt, w->name);
        if (mine < 0)
            continue;
        const size_t base = v->tt->t[mine].offset;
        const int64_t cols = m[i].cols ? m[i].cols : 1;
        for (int64_t r = 0; r < m[i].rows; r++)
            for (int64_t k = 0; k < cols; k++) {
                const size_t x = base + src_index(&m[i], w, r, k);
                if (x >= v->p_lo && x < v->p_hi)
                    v->params[x - v->p_lo] = loco__hf_elem(found[i], hf_index(&m[i], r, k));
            }
    }
    if (rc == 0)
        loco_info("init_from %s: %d Llama tensors loaded", dir, n);
    loco__hf_file_close(&f);
    loco_free(found);
    loco_free(m);
    loco_ttable_fini(&whole);
    return rc;
}
