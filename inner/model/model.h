/* inner/model/ — GPT-2 over flat, layer-major parameter and gradient
 * buffers: the block description every path reads, its tensor / sequence /
 * context / expert splits and pipeline stages, recompute, evaluation and
 * generation, and the same model on a GPU (loco_gpt_cuda). One file: the
 * room's one public header (STYLE.md), its sections in that order. */
#ifndef LOCO_INNER_MODEL_H
#define LOCO_INNER_MODEL_H

#include "core/core.h"
#include "inner/data/data.h"
#include "inner/optim/optim.h"

struct loco_comm;

/* The architecture's choices. Zero is GPT-2's in every field, so a config
 * written for GPT-2 (designated initialisers, memset) is GPT-2. */
typedef enum { LOCO_NORM_LAYERNORM = 0, LOCO_NORM_RMSNORM } loco_norm_kind;
typedef enum { LOCO_POS_LEARNED = 0, LOCO_POS_ROPE } loco_pos_kind;
typedef enum { LOCO_MLP_GELU = 0, LOCO_MLP_SWIGLU } loco_mlp_kind;

typedef struct {
    int n_layer, n_head, n_embd; /* L, NH, C */
    int seq_len;                 /* maxT: rows of the position table, RoPE's positions */
    int vocab_size;              /* V */
    /* The block description (model.arch and its keys, resolved by
     * loco_gpt_config_from; read through the loco_gpt_* helpers below,
     * which turn the zeros into GPT-2's values). */
    loco_norm_kind norm;         /* ln_1, ln_2, ln_f */
    float norm_eps;              /* 0: 1e-5 */
    loco_pos_kind pos;
    float rope_theta;            /* 0: 10000 */
    /* Llama 3.1 RoPE scaling (factor 0: none) */
    float rope_factor, rope_low_freq, rope_high_freq;
    int rope_original_max_pos;
    loco_mlp_kind mlp;           /* the dense MLP and every expert */
    int ffn_hidden;              /* F; 0: 4C (gelu) or Llama's 8C/3 rule (swiglu) */
    int n_kv_head;               /* NKV; 0: n_head */
    bool no_bias;                /* no biases in the four projections (Llama) */
    bool untied;                 /* an own lm_head (V, C) instead of wte */
    int tp;                      /* tensor-parallel degree t: tables, buffers and passes
                                  * hold one tp rank's slice (0 or 1: the whole model) */
    /* Mixture of experts (n_experts = 0: dense): blocks l with
     * l % moe_every == moe_every - 1 route each token to top_k of
     * n_experts MLPs of the description's kind (mlp, ffn_hidden, bias);
     * capacity_factor 0 = dropless. n_shared_experts more MLPs of the
     * same kind (DeepSeek's shared experts) see every token, their
     * outputs added to the routed experts' combined output. */
    int n_experts, top_k, moe_every, n_shared_experts;
    float capacity_factor, aux_loss, z_loss;
    /* DeepSeek-V3's routing bias (0 = none): loco_gpt_router_bias_step's
     * rate; the bias itself is model state (loco_gpt_router_bias). */
    float router_bias_rate;
    /* Expert parallelism: the experts are split over ep ranks (0 or 1:
     * all here); this rank's table holds experts [ep_rank E/ep, (ep_rank +
     * 1) E/ep) of every MoE block, under their global names. */
    int ep, ep_rank;
} loco_gpt_config;

/* The description's values with GPT-2's for the zeros. */
static inline int loco_gpt_kv_heads(const loco_gpt_config *cfg) {
    return cfg->n_kv_head > 0 ? cfg->n_kv_head : cfg->n_head;
}
static inline int loco_gpt_head_size(const loco_gpt_config *cfg) {
    return cfg->n_embd / cfg->n_head;
}
/* F, the MLP's hidden width (SwiGLU's gate and up are each F wide). */
static inline int loco_gpt_ffn(const loco_gpt_config *cfg) {
    if (cfg->ffn_hidden > 0)
        return cfg->ffn_hidden;
    if (cfg->mlp == LOCO_MLP_SWIGLU)
        return (8 * cfg->n_embd / 3 + 63) / 64 * 64;
    return 4 * cfg->n_embd;
}
/* Width of the fused c_attn output: NH + 2 NKV heads. */
static inline int loco_gpt_qkv_width(const loco_gpt_config *cfg) {
    return (cfg->n_head + 2 * loco_gpt_kv_heads(cfg)) * loco_gpt_head_size(cfg);
}
/* Width of c_fc's output: F, or 2F for SwiGLU's gate and up side by side. */
static inline int loco_gpt_fc_width(const loco_gpt_config *cfg) {
    return (cfg->mlp == LOCO_MLP_SWIGLU ? 2 : 1) * loco_gpt_ffn(cfg);
}
static inline float loco_gpt_norm_eps(const loco_gpt_config *cfg) {
    return cfg->norm_eps > 0 ? cfg->norm_eps : 1e-5f;
}
/* Whether the description is GPT-2's (the paths not yet taught the
 * other families refuse anything else). */
static inline bool loco_gpt_is_gpt2(const loco_gpt_config *cfg) {
    return cfg->norm == LOCO_NORM_LAYERNORM && cfg->pos == LOCO_POS_LEARNED &&
           cfg->mlp == LOCO_MLP_GELU && loco_gpt_kv_heads(cfg) == cfg->n_head &&
           !cfg->no_bias && !cfg->untied && loco_gpt_ffn(cfg) == 4 * cfg->n_embd &&
           loco_gpt_norm_eps(cfg) == 1e-5f;
}

/* Whether block l's MLP is a mixture of experts. */
static inline bool loco_gpt_is_moe(const loco_gpt_config *cfg, int l) {
    return cfg->n_experts > 0 && cfg->moe_every > 0 && l % cfg->moe_every == cfg->moe_every - 1;
}

/* Views of one block's tensors inside a flat buffer (HF GPT-2 layouts and
 * names for every family; W = loco_gpt_qkv_width, F = loco_gpt_ffn; the
 * shapes below are GPT-2's). Biases are NULL without them (cfg->no_bias),
 * the norms' biases NULL with RMSNorm. c_attn's columns are the NH query
 * heads, then NKV key heads, then NKV value heads (C, W); c_fc's are
 * SwiGLU's gate then up (C, 2F), or GELU's (C, F). */
typedef struct {
    float *ln1w, *ln1b;         /* (C) */
    float *qkvw;                /* (C, 3C)  attn.c_attn.weight */
    float *qkvb;                /* (3C) */
    float *attprojw;            /* (C, C)   attn.c_proj.weight */
    float *attprojb;            /* (C) */
    float *ln2w, *ln2b;         /* (C) */
    float *fcw;                 /* (C, 4C)  mlp.c_fc.weight */
    float *fcb;                 /* (4C) */
    float *fcprojw;             /* (4C, C)  mlp.c_proj.weight */
    float *fcprojb;             /* (C) */
    /* An MoE block instead of the four mlp tensors: the router, its
     * shared experts and its routed experts, each an MLP of the
     * description's kind with c_fc.weight (C, Fc), c_fc.bias (Fc),
     * c_proj.weight (F, C), c_proj.bias (C) back to back (the biases
     * absent with cfg->no_bias; Fc = loco_gpt_fc_width; loco_gpt_expert_at). */
    float *routerw;             /* (E, C)   mlp.router.weight */
    float *shared;              /* shared expert 0's c_fc.weight (mlp.shared_experts.0...);
                                 * NULL without shared experts */
    float *experts;             /* expert 0's c_fc.weight (mlp.experts.J...) */
} loco_gpt_block;

/* Expert j of an MoE block's views (at b->experts or b->shared of params
 * or grads); fcb and projb NULL without biases. */
typedef struct {
    float *fcw, *fcb, *projw, *projb;
} loco_gpt_expert;
/* Floats of one expert on a tp rank: C Fc + F C, with biases + Fc + C
 * (GPT-2's 8C^2 + 5C), Fc and F being the rank's column slices under
 * tensor parallelism (Megatron's split of each expert's MLP). */
static inline size_t loco_gpt_expert_size(const loco_gpt_config *cfg) {
    const size_t t = cfg->tp > 1 ? (size_t)cfg->tp : 1, C = (size_t)cfg->n_embd;
    const size_t Fc = (size_t)loco_gpt_fc_width(cfg) / t, F = (size_t)loco_gpt_ffn(cfg) / t;
    return C * Fc + F * C + (cfg->no_bias ? 0 : Fc + C);
}
static inline loco_gpt_expert loco_gpt_expert_at(const loco_gpt_config *cfg, float *experts,
                                                 int j) {
    const size_t t = cfg->tp > 1 ? (size_t)cfg->tp : 1, C = (size_t)cfg->n_embd;
    const size_t Fc = (size_t)loco_gpt_fc_width(cfg) / t, F = (size_t)loco_gpt_ffn(cfg) / t;
    const size_t nb = cfg->no_bias ? 0 : 1;
    float *b = experts + (size_t)j * loco_gpt_expert_size(cfg);
    float *fcb = b + C * Fc, *projw = fcb + nb * Fc;
    return (loco_gpt_expert){b, nb ? fcb : NULL, projw, nb ? projw + F * C : NULL};
}

typedef struct {
    float *wte;          /* (V, C), also the tied output head */
    float *wpe;          /* (maxT, C); NULL with RoPE */
    loco_gpt_block *h;   /* (L) */
    float *lnfw, *lnfb;  /* (C); lnfb NULL with RMSNorm */
    float *lm_head;      /* (V, C) an untied head (cfg->untied), else NULL */
} loco_gpt_tensors;


/* Activation recompute (train.recompute). */
typedef enum {
    LOCO_RECOMPUTE_NONE = 0,
    LOCO_RECOMPUTE_SELECTIVE,
    LOCO_RECOMPUTE_FULL
} loco_recompute;
/* How context parallelism computes attention over the split sequence. */
typedef enum { LOCO_CP_RING = 0, LOCO_CP_ULYSSES } loco_cp_algo;

/* A pipeline stage: the chunks of consecutive blocks this rank holds, in
 * model order (one, or v for interleaved and V-shaped schedules). A chunk
 * starting at block 0 brings the embeddings, one ending at the last block
 * ln_f and the tied head (a copy of wte when the embeddings are on another
 * stage: Megatron's tied embeddings, their gradients summed between the
 * two). `slots` activation sets are kept at once: one per (micro-batch,
 * chunk) between its forward and its weight gradient. */
#define LOCO_GPT_MAX_CHUNKS 16
typedef struct {
    int n;                           /* chunks */
    int first[LOCO_GPT_MAX_CHUNKS];  /* chunk i = blocks [first[i], end[i]) */
    int end[LOCO_GPT_MAX_CHUNKS];
    int slots;
} loco_gpt_stage;

/* How the passes split over ranks and what they keep: tensor parallelism
 * over `tp` (the group of cfg->tp ranks, this rank's position in it
 * choosing the slice), sequence parallelism, recompute. All zero: one
 * rank, everything kept. */
typedef struct {
    struct loco_comm *tp;     /* not owned; NULL when cfg->tp <= 1 */
    bool sp;                  /* needs tp; B*T must divide by tp */
    loco_recompute recompute;
    int recompute_layers;     /* full: only the first N blocks (0 = all) */
    const loco_gpt_stage *stage; /* a pipeline stage's chunks; NULL: the whole model */
    /* Context parallelism over `cp` (not owned; NULL or one rank: off):
     * the sequence is cut into 2c chunks and rank r holds chunks r and
     * 2c-1-r of every sequence (zig-zag); T must divide by 2c. */
    struct loco_comm *cp;
    loco_cp_algo cp_algo;
    /* Expert parallelism over `ep` (cfg->ep ranks, this rank cfg->ep_rank
     * in it; not owned): an MoE layer's tokens travel to their experts'
     * ranks by all-to-all and back. */
    struct loco_comm *ep;
} loco_gpt_parallel;

/* Bytes the tensor-parallel collectives of this model moved, counted per
 * rank as ring algorithms move them: an all-reduce of S bytes over t ranks
 * 2(t-1)/t * S, a reduce-scatter or all-gather (t-1)/t * S (S = the whole
 * buffer). */
typedef struct {
    double allreduce, reduce_scatter, allgather; /* bytes */
    int64_t calls;
} loco_gpt_comm_stats;

typedef struct loco_gpt loco_gpt;

/* A model is cut into units, each a contiguous range of the flat buffer:
 * unit 0 = embeddings (wte, wpe), units 1..L = blocks, unit L+1 = ln_f.
 * Parallel code (ZeRO, bucketed reduction) hooks into the passes per unit.
 * Every hook returns 0 or a negative LOCO_E* code, which aborts the pass. */
typedef struct {
    void *ctx;
    /* Before a pass reads unit's parameters: forward uses units 0, 1..L,
     * L+1, then 0 again (tied head); backward L+1 (after the head on 0),
     * L..1, then 0. `backward` tells which pass is asking. */
    int (*acquire)(void *ctx, loco_gpt *m, int unit, bool backward);
    /* After the pass is done with unit's parameters. */
    int (*release)(void *ctx, loco_gpt *m, int unit, bool backward);
    /* In backward: unit's gradients for this micro-batch are complete. */
    int (*grads_ready)(void *ctx, loco_gpt *m, int unit);
} loco_gpt_hooks;

/* Allocation choices for loco_gpt_create_ex: ZeRO-3 keeps no full
 * parameter buffer, ZeRO-2 and 3 no full gradient buffer; their views are
 * then bound per unit with loco_gpt_bind_unit. A model whose passes run on
 * a GPU (loco_gpt_cuda) keeps no host activations: its forward passes
 * return LOCO_EINVAL. */
enum { LOCO_GPT_NO_PARAMS = 1, LOCO_GPT_NO_GRADS = 2, LOCO_GPT_NO_ACTS = 4 };


/* What one MoE layer routed since the last loco_gpt_moe_reset: the
 * assignments (tokens x top_k) routed to each expert before dropping, how
 * many were dropped, and the mean of the micro-batches' load-balancing and
 * z losses (unscaled). */
typedef struct {
    int block;                       /* 0-based */
    int64_t assignments, dropped;
    const int64_t *routed;           /* (n_experts) */
    double aux, z;
    /* With model.router_bias_rate > 0: the loads of the global batch the
     * last loco_gpt_router_bias_step summed (n_experts), and the layer's
     * routing bias after it (n_experts); NULL otherwise. */
    const int64_t *load;
    const float *bias;
} loco_gpt_moe_stats;
/* MoE layers of the model (0 for a dense one) and layer i's figures. */
int loco_gpt_moe_layers(const loco_gpt *m);
void loco_gpt_moe_layer(const loco_gpt *m, int i, loco_gpt_moe_stats *out);
void loco_gpt_moe_reset(loco_gpt *m);
/* Adds what a pass of another model of m's config (the device model,
 * loco_gpt_cuda_moe_stats) routed through MoE block `block` since its
 * reset: micro micro-batches, routed (n_experts) assignments per expert,
 * their total and dropped ones, and the sums of their aux and z losses.
 * LOCO_EINVAL for a block that is not MoE. */
int loco_gpt_moe_add(loco_gpt *m, int block, int micro, const int64_t *routed,
                     int64_t assignments, int64_t dropped, double aux_sum, double z_sum);
/* DeepSeek-V3's routing biases (cfg.router_bias_rate > 0): (MoE layers,
 * n_experts) floats, zero at first, added to the probabilities only to
 * choose the top-k. Model state, not a parameter (no gradient, optimizer
 * or outer step), in state.json. NULL, *n = 0 for rate 0. */
float *loco_gpt_router_bias(const loco_gpt *m, size_t *n);
/* After an optimizer step: sums the step's routed counts over c (the
 * island: pp stages count 0 for blocks they do not hold) and moves each
 * layer's biases b_e += rate sign(mean load - load_e), the same on every
 * rank. 0 with rate 0; else what the collective returns. */
int loco_gpt_router_bias_step(loco_gpt *m, struct loco_comm *c);
/* Bytes of token rows this rank sent to other ep ranks (dispatch,
 * combine and their backward) since the model was made. */
double loco_gpt_moe_bytes(const loco_gpt *m);

/* Builds the tensor table (Hugging Face GPT-2 names, layer-major) for cfg.
 * With cfg->tp = t > 1 the shapes are one tp rank's slice (Megatron 1-D):
 * c_attn (C, 3C/t) and its bias hold n_head/t heads' q, k and v; c_fc
 * (C, 4C/t) and bias by columns; attn.c_proj (C/t, C) and mlp.c_proj
 * (4C/t, C) by rows; wte (Vp/t, C) by vocabulary rows, Vp =
 * loco_gpt_vocab_padded; everything else whole (replicated). Every tp rank
 * has the same table. LOCO_EINVAL when t does not divide n_head or 4C. */
int loco_gpt_build_table(loco_ttable *tt, const loco_gpt_config *cfg);
/* V rounded up to a multiple of tp: the rows of wte over all tp ranks.
 * Padding rows are zero, never looked up and never in the softmax. */
int loco_gpt_vocab_padded(const loco_gpt_config *cfg);
/* Where element g (row-major inside the whole tensor gt, a tensor of the
 * tp = 1 table) lives when the model is split over t tp ranks: *rank and
 * the element's index *j inside that rank's slice; a replicated tensor
 * gives *rank = -1 (every rank holds it at j = g). */
void loco_gpt_tp_locate(const loco_tensor *gt, int t, size_t g, int *rank, size_t *j);
/* Sum of squares of g, elements [a, b) of the flat buffer inside tensor
 * i of m's table, counting each element once over the tp group: a key or
 * value column this rank holds as a replica of a lower tp rank's counts
 * zero. */
double loco_gpt_tp_sumsq(const loco_gpt *m, int i, const float *g, size_t a, size_t b);
/* How many consecutive tp ranks from loco_gpt_tp_locate's *rank hold
 * element g (key/value heads replicated when fewer than tp; else 1). */
size_t loco_gpt_tp_replicas(const loco_tensor *gt, int t, size_t g);
/* The inverse: element j of tp rank k's slice of gt -> *g in the whole
 * tensor; false for vocabulary padding (no whole-tensor element). */
bool loco_gpt_tp_global(const loco_tensor *gt, int t, int k, size_t j, size_t *g);
/* The whole model's table (tp = 1, no pipeline stage, every expert: the
 * export order) for m's config, into *whole (loco_ttable_fini it). */
int loco_gpt_build_whole_table(const loco_gpt *m, loco_ttable *whole);
/* For elements [lo, hi) of m's flat buffer (a tp slice, a stage, an ep
 * rank's experts), each one's index in the whole model's flat buffer
 * (`whole` from loco_gpt_build_whole_table) into idx[0 .. hi-lo); -1 for
 * vocabulary padding. Replicas (tp-replicated tensors, the tied head's
 * copy of wte) map to the same index. */
int loco_gpt_whole_index(const loco_gpt *m, const loco_ttable *whole, size_t lo, size_t hi,
                         int64_t *idx);
/* Creates a model for batches up to B x T (T <= seq_len): parameters,
 * gradients and activations allocated, parameters zero (call
 * loco_gpt_init_weights or load a checkpoint). *out is NULL on failure. */
int loco_gpt_create(loco_gpt **out, const loco_gpt_config *cfg, int B, int T);
/* Same, with LOCO_GPT_NO_* flags. */
int loco_gpt_create_ex(loco_gpt **out, const loco_gpt_config *cfg, int B, int T, unsigned flags);
/* Same, split over ranks as par says (NULL: as loco_gpt_create_ex; par is
 * copied, its communicators are not owned). With cfg->tp = t > 1, par->tp
 * must be a group of t ranks; the tables and buffers are this rank's
 * slice, and every pass is collective over the group. LOCO_EINVAL for sp
 * without tp, B*T not divisible by t under sp, and the shapes
 * loco_gpt_build_table refuses. */
int loco_gpt_create_par(loco_gpt **out, const loco_gpt_config *cfg, int B, int T, unsigned flags,
                        const loco_gpt_parallel *par);
void loco_gpt_destroy(loco_gpt *m); /* accepts NULL */

/* What a model is, read by its users; pointers are valid while m lives. */
/* The config it was made with (cfg->tp normalised to at least 1). */
const loco_gpt_config *loco_gpt_cfg(const loco_gpt *m);
/* The table indexing the flat buffers: the whole model, a tp slice or a
 * pipeline stage's (loco_gpt_build_stage_table). */
const loco_ttable *loco_gpt_table(const loco_gpt *m);
size_t loco_gpt_num_params(const loco_gpt *m); /* numel of the table */
/* The flat parameter and gradient buffers (num_params floats); NULL when
 * made with LOCO_GPT_NO_PARAMS / _NO_GRADS (units bound by ZeRO). */
float *loco_gpt_params(const loco_gpt *m);
float *loco_gpt_grads(const loco_gpt *m);
/* Per-tensor views into params and grads (blocks a stage does not hold
 * are NULL). */
const loco_gpt_tensors *loco_gpt_param_views(const loco_gpt *m);
const loco_gpt_tensors *loco_gpt_grad_views(const loco_gpt *m);
/* Activation capacity: the B x T it was made for (T: this rank's rows of
 * a sequence under cp). */
void loco_gpt_capacity(const loco_gpt *m, int *B, int *T);
/* The parallel settings it was made with (stage: see loco_gpt_stage_of)
 * and its position in the tp group (0 without tp). */
const loco_gpt_parallel *loco_gpt_parallel_of(const loco_gpt *m);
int loco_gpt_tp_rank(const loco_gpt *m);
/* A pipeline stage's chunks, NULL for the whole model. */
const loco_gpt_stage *loco_gpt_stage_of(const loco_gpt *m);
/* The logits of the last forward pass (N, this tp rank's vocabulary
 * columns); the logits' gradient after a training pass. */
const float *loco_gpt_logits(const loco_gpt *m);
/* Activation and backward scratch bytes allocated, and what one block
 * keeps from its forward for its backward (with recompute: less). */
size_t loco_gpt_act_bytes(const loco_gpt *m);
size_t loco_gpt_block_act_bytes(const loco_gpt *m);
/* What its tp collectives moved since it was made. */
loco_gpt_comm_stats loco_gpt_tp_comm_stats(const loco_gpt *m);
/* The table of a pipeline stage: the tensors of the units it holds, in
 * model order (the tp slice of cfg->tp), then a copy of wte after ln_f when
 * it holds the head but not the embeddings. LOCO_EINVAL for chunks that
 * are empty, overlap, are out of order or outside the model. */
int loco_gpt_build_stage_table(loco_ttable *tt, const loco_gpt_config *cfg,
                               const loco_gpt_stage *stage);
/* A pipeline stage's passes, one (micro-batch, chunk) at a time in
 * activation slot `slot`; chunk indexes loco_gpt_stage_of(m). Activations between
 * chunks are this rank's rows (R, C). A forward reads the tokens (chunk at
 * block 0) or `in`; it writes `out`, or, for the chunk with the head, the
 * micro-batch's mean loss and the logits' gradient for loss_scale * loss.
 * backward_input (B) takes `dout` (NULL at the head), accumulates the
 * LayerNorm, bias, embedding gradients and writes `din` (NULL at block 0);
 * backward_weight (W) then accumulates the matmuls' weight gradients.
 * Every pass of a slot follows its forward; W follows B. Collective over
 * the tp group. */
int loco_gpt_chunk_forward(loco_gpt *m, int slot, int chunk, const int32_t *inputs,
                           const int32_t *targets, int B, int T, const float *in, float *out,
                           float loss_scale, float *loss);
int loco_gpt_chunk_backward_input(loco_gpt *m, int slot, int chunk, const int32_t *inputs, int B,
                                  int T, const float *dout, float *din);
int loco_gpt_chunk_backward_weight(loco_gpt *m, int slot, int chunk, int B, int T);
/* The activation bytes per block the formula of docs/PERFORMANCE.md gives
 * for this model's B, T, tp, sp and a recompute mode: what one block keeps
 * from its forward for its backward. */
double loco_gpt_block_act_formula(const loco_gpt *m, loco_recompute mode);
/* The same formula for a model not made (B x T rows, the tp of mc, sp). */
double loco_gpt_block_act_formula_for(const loco_gpt_config *mc, int B, int T, bool sp,
                                      loco_recompute mode);
/* What one block of the device model (loco_gpt_cuda) keeps for its
 * backward, in bytes, by the same kind of formula: activations in bf16 or
 * fp32, the attention's log-sum-exp instead of its probabilities (so
 * selective is none), no attproj or fcproj copies; an MoE block's router,
 * plan and experts' buffers in fp32 (averaged over the blocks when
 * model.moe_every mixes them; full adds the shared set's excess over an
 * average block, per block). The device's carve (loco_gpt_cuda_act_bytes)
 * over its blocks gives this per block. */
double loco_gpt_device_block_act_formula(const loco_gpt_config *mc, int B, int T, bool sp,
                                         bool bf16, loco_recompute mode);
/* Bytes this rank sent for context parallelism since the model was made
 * (ring: K|V and dK|dV blocks; Ulysses: the all-to-alls' off-rank parts). */
double loco_gpt_cp_bytes(const loco_gpt *m);
/* GPT-2 initialisation: N(0, 0.02) weights and embeddings, residual
 * projections scaled by 1/sqrt(2 L), zero biases, unit LayerNorm weights. */
void loco_gpt_init_weights(loco_gpt *m, loco_rng *rng);
/* Forward pass on inputs (B, T). With targets, *mean_loss receives the mean
 * cross-entropy; without (NULL), only logits are computed (loco_gpt_logits). */
int loco_gpt_forward(loco_gpt *m, const int32_t *inputs, const int32_t *targets, int B, int T,
                     float *mean_loss);
/* Forward and backward: gradients of loss_scale * mean loss are ADDED to
 * the gradients (loco_gpt_grads; so micro-batches accumulate). */
int loco_gpt_forward_backward(loco_gpt *m, const int32_t *inputs, const int32_t *targets, int B,
                              int T, float loss_scale, float *mean_loss);
void loco_gpt_zero_grad(loco_gpt *m);
/* Training FLOPs per token, counted as llm.c and PaLM do:
 * 6 * (matmul parameters) + 12 * L * C * T. */
double loco_gpt_flops_per_token(const loco_gpt_config *cfg, int T);
/* Model config from the [model] section. */
loco_gpt_config loco_gpt_config_from(const loco_config *cfg);

/* Units (loco_gpt_hooks): what ZeRO and the pipeline stage reach. */
/* Whether the model holds a unit (every unit of a whole model). */
bool loco_gpt_holds_unit(const loco_gpt *m, int unit);
int loco_gpt_num_units(const loco_gpt *m);
/* Flat-buffer range [*lo, *hi) of a unit. */
void loco_gpt_unit_range(const loco_gpt *m, int unit, size_t *lo, size_t *hi);
/* Points a unit's parameter (and, if grads != NULL, gradient) views at
 * buffers laid out like the unit's flat range. */
void loco_gpt_bind_unit(loco_gpt *m, int unit, float *params, float *grads);
void loco_gpt_set_hooks(loco_gpt *m, const loco_gpt_hooks *hooks);

/* What ZeRO (inner/parallel/zero.c) reaches of the model. */
/* Whether tensor i of the model's table is replicated over tp (LayerNorms,
 * wpe, row-parallel biases) rather than split. */
bool loco_gpt_tensor_replicated(const loco_gpt *m, int i);
/* The values loco_gpt_init_weights draws, keeping only flat indices in
 * [lo, hi) (written to dst[0 .. hi-lo)); the RNG advances as for the whole
 * model, so every shard of a ZeRO-3 run matches a single-rank init. */
void loco_gpt_init_weights_range(const loco_gpt *m, loco_rng *rng, float *dst, size_t lo,
                                 size_t hi);


typedef struct {
    long long batches, tokens; /* tokens = batches * B * T */
    double loss;               /* mean of the batches' mean losses */
    long long bytes;           /* text bytes the targets stand for */
    double nats_per_byte;      /* loss * tokens / bytes (inf when bytes is 0) */
} loco_eval_result;
/* Validation loss of m over the next `batches` batches of d (m's capacity B x T
 * each, as d was opened). token_bytes (vocab_size entries; NULL: one byte
 * per id) gives the text bytes of each id, e.g. from loco_tok_text_bytes.
 * LOCO_EINVAL when batches < 1; loader and forward errors pass through. */
int loco_gpt_eval(loco_gpt *m, loco_data *d, long long batches, const uint32_t *token_bytes,
                  loco_eval_result *r);

/* Draws an id from softmax(logits / temperature) over the top_k largest
 * logits (top_k <= 0 or >= V: all V; ties at the cutoff are kept), with
 * one loco_rng_uniform_d draw. probs (V floats) is scratch. */
int loco_sample_token(const float *logits, int V, float temperature, int top_k, loco_rng *rng,
                      float *probs);

typedef struct {
    float temperature; /* > 0 */
    int top_k;         /* 0: no cut */
} loco_sample_opts;
/* Called with each new id; a negative return stops generation with it. */
typedef int (*loco_gen_token_fn)(int id, void *arg);
/* Appends ntok ids sampled from m to ctx[0 .. *n) (capacity cap), each from
 * the logits of the last position given the last T ids (m's capacity), calling
 * on_token (may be NULL) after each. LOCO_EINVAL when *n is 0, the new ids
 * do not fit in cap, an id of ctx is outside the vocabulary or o is out of
 * range; forward errors pass through. Same model, ctx, opts and rng state:
 * the same ids. */
int loco_gpt_generate(loco_gpt *m, int32_t *ctx, size_t *n, size_t cap, long long ntok,
                      const loco_sample_opts *o, loco_rng *rng, loco_gen_token_fn on_token,
                      void *arg);


/* ------------------------------------------------------- model on a GPU */

#if defined(LOCO_HAVE_CUDA)
/* The same GPT-2 on one GPU, through the kernels/cuda twins, in the CPU
 * model's order of kernels and over the same flat layout (the table of
 * loco_gpt_build_table): fp32 master weights, gradients and AdamW state in
 * device memory (one slab); with bf16, a bf16 copy of the weights and bf16
 * activations and activation gradients (every reduction, LayerNorm
 * statistic and loss in fp32), else everything in fp32. Attention keeps
 * the log-sum-exp per row, not the T x T probabilities. Host pointers in,
 * host pointers out: callers see no CUDA type. Work goes on
 * loco_cuda_compute_stream; a call that returns a value computed on the
 * device waits for it, forward_backward without mean_loss only enqueues
 * (a training step waits once, in loco_gpt_cuda_clip_adamw). Errors are
 * LOCO_ECUDA (or LOCO_ENOMEM when the device is too small) with CUDA's
 * reason, those of enqueued kernels at the next wait. The LM head runs at
 * the vocabulary padded to a multiple of 64 (device-only: the flat
 * buffers keep the host layout). */
typedef struct loco_gpt_cuda loco_gpt_cuda;

/* Kinds of kernel timed by loco_gpt_cuda_profile. */
enum { LOCO_PROF_MATMUL, LOCO_PROF_ATTN, LOCO_PROF_LN, LOCO_PROF_XENT, LOCO_PROF_ELEM,
       LOCO_PROF_OPT, LOCO_PROF_N };
extern const char *const loco_gpt_cuda_prof_names[LOCO_PROF_N];

/* Device model for batches up to B x T (T <= cfg->seq_len), bf16 or fp32.
 * Parameters and AdamW moments start at zero (loco_gpt_cuda_upload). */
int loco_gpt_cuda_create(loco_gpt_cuda **out, const loco_gpt_config *cfg, int B, int T,
                         bool bf16);
void loco_gpt_cuda_destroy(loco_gpt_cuda *g); /* accepts NULL */
/* Attention kernel, want = train.attention ("auto" | "tensor" |
 * "reference", loco_cuda_attention_select): reference until set; the
 * tensor-core one where this model and device allow it, else the
 * reference with a warning. LOCO_EINVAL for another word. */
int loco_gpt_cuda_set_attention(loco_gpt_cuda *g, const char *want);
/* Bytes of device memory it holds (slab and cuBLASLt workspace). */
size_t loco_gpt_cuda_bytes(const loco_gpt_cuda *g);
/* Copies host flat buffers (the held range's floats each) to the device; a NULL
 * buffer leaves that state as it is. Refreshes the bf16 weight copy and
 * the head's padded copy of wte (call it with NULLs after writing the
 * device parameters directly). */
int loco_gpt_cuda_upload(loco_gpt_cuda *g, const float *params, const float *m, const float *v);
/* Copies device state into host flat buffers; NULL ones are skipped. */
int loco_gpt_cuda_download(loco_gpt_cuda *g, float *params, float *grads, float *m, float *v);
int loco_gpt_cuda_zero_grad(loco_gpt_cuda *g);
/* As loco_gpt_forward and loco_gpt_forward_backward (gradients of
 * loss_scale * mean loss ADDED to the device gradients); inputs and
 * targets are host arrays, checked against the vocabulary. */
int loco_gpt_cuda_forward(loco_gpt_cuda *g, const int32_t *inputs, const int32_t *targets, int B,
                          int T, float *mean_loss);
int loco_gpt_cuda_forward_backward(loco_gpt_cuda *g, const int32_t *inputs,
                                   const int32_t *targets, int B, int T, float loss_scale,
                                   float *mean_loss);
/* loco_clip_grad_norm on the device gradients (the same fixed-order sum). */
int loco_gpt_cuda_clip(loco_gpt_cuda *g, double max_norm, double *norm);
/* A training step's end with one wait: the clip (as loco_gpt_cuda_clip)
 * and AdamW (as loco_gpt_cuda_adamw) queued on the device, AdamW skipped
 * there when the norm is not finite (opt->t then not advanced); then
 * *norm and *loss_sum (when not NULL): the sum of the mean losses of the
 * forward_backward calls since loco_gpt_cuda_zero_grad. */
int loco_gpt_cuda_clip_adamw(loco_gpt_cuda *g, loco_adamw *opt, float lr, double max_norm,
                             double *norm, double *loss_sum);
/* Waits, then *sum = the sum of the mean losses of the forward_backward
 * calls since loco_gpt_cuda_zero_grad. */
int loco_gpt_cuda_loss_sum(loco_gpt_cuda *g, double *sum);
/* train.cuda_graph: on, forward_backward runs as one CUDA graph per
 * shape (captured after a first plain call; the capture failing turns it
 * off with a warning); off (the default), plain launches. */
void loco_gpt_cuda_set_graph(loco_gpt_cuda *g, bool on);
/* For tests: the head's padded vocabulary *vp and the count of nonzero
 * values that must be zero: the head's weight rows >= V, and its side
 * gradient buffer (every row, between passes). Waits. */
int loco_gpt_cuda_padding(loco_gpt_cuda *g, int *vp, size_t *nonzero);
/* One AdamW update of every tensor with opt's hyper-parameters as update
 * number opt->t + 1 (opt->t is advanced; opt's host moments are not
 * touched: they live on the device), then the bf16 weight copy. */
int loco_gpt_cuda_adamw(loco_gpt_cuda *g, loco_adamw *opt, float lr);
/* on: from now, every kernel call is waited for and its time added to
 * secs[kind] (LOCO_PROF_N doubles, caller-owned; slower, says where the
 * time goes). off: secs is ignored and calls only enqueue. */
void loco_gpt_cuda_profile(loco_gpt_cuda *g, bool on, double *secs);

/* ------------------------------------------- what data parallelism reaches */

/* ZeRO-3: a model whose fp32 state (params, grads, m, v and the weights in
 * the passes' type) holds the flat range [lo, hi) only; the weights and
 * gradients of each unit a pass uses are bound from the hooks
 * (loco_gpt_cuda_bind_unit). The whole-model clip and AdamW are refused:
 * the ranged calls take [lo, hi). */
int loco_gpt_cuda_create_sharded(loco_gpt_cuda **out, const loco_gpt_config *cfg, int B, int T,
                                 bool bf16, size_t lo, size_t hi);
/* Every choice of a device model: precision, held range (hi = SIZE_MAX:
 * all), and full recompute of the first `rerun` blocks (0: none): they
 * keep only their output; the backward reruns each one's forward. */
typedef struct {
    bool bf16;
    size_t lo, hi;
    int rerun;
    /* cfg->tp > 1: the tp group (cfg->tp ranks) this slice's collectives
     * run over, on device buffers (nccl) or staged through pinned host
     * buffers (tp_staged: mpi). */
    struct loco_comm *tp;
    bool tp_staged;
    /* parallel.sp with tp: between the blocks' tp regions each rank holds
     * its 1/tp of the rows (norms, residuals); the column-parallel inputs
     * are all-gathered, the row-parallel outputs reduce-scattered. */
    bool sp;
    /* parallel.cp > 1: the cp group; Ulysses only (the passes take whole
     * sequences, each rank computes its zig-zag chunks' rows) */
    struct loco_comm *cp;
    loco_cp_algo cp_algo;
    /* parallel.pp > 1: this rank's pipeline stage (its chunks and
     * activation slots, loco_gpt_build_stage_table's layout; copied); NULL:
     * the whole model. split_w: its schedule runs W apart from B (the
     * zero-bubble ones), so B keeps the GEMMs' output gradients for W. */
    const loco_gpt_stage *stage;
    bool split_w;
    /* cfg->ep > 1: the ep group the MoE blocks' rows travel over (staged
     * through pinned host buffers, mpi); this rank holds experts
     * [ep_rank E / ep, (ep_rank + 1) E / ep). */
    struct loco_comm *ep;
} loco_gpt_cuda_opts;
int loco_gpt_cuda_create_with(loco_gpt_cuda **out, const loco_gpt_config *cfg, int B, int T,
                              const loco_gpt_cuda_opts *o);
/* Bytes of the blocks' activations it carved (what recompute saves; a
 * pipeline stage: over its slots). */
size_t loco_gpt_cuda_act_bytes(const loco_gpt_cuda *g);
/* A pipeline stage's passes on the device, as loco_gpt_chunk_* (model.c):
 * one (micro-batch, chunk) at a time in activation slot `slot`, chunk
 * indexing the stage's chunks. The activations and gradients between
 * chunks are host arrays of this rank's rows (R, C) in fp32 (in bf16 the
 * model's values, exactly); each pass waits for its result. The chunk
 * with block 0 reads inputs (and keeps them in the slot for its B); the
 * one with the head reads targets and gives *loss, the micro-batch's
 * mean loss, its logits' gradient for loss_scale * loss kept in the slot.
 * Collective over the tp and cp groups. LOCO_EINVAL for a model that is
 * not a stage, a slot or chunk out of range, a pass out of order. */
int loco_gpt_cuda_chunk_forward(loco_gpt_cuda *g, int slot, int chunk, const int32_t *inputs,
                                const int32_t *targets, int B, int T, const float *in,
                                float *out, float loss_scale, float *loss);
int loco_gpt_cuda_chunk_backward_input(loco_gpt_cuda *g, int slot, int chunk, int B, int T,
                                       const float *dout, float *din);
int loco_gpt_cuda_chunk_backward_weight(loco_gpt_cuda *g, int slot, int chunk, int B, int T);
/* What MoE block `block` routed in the forwards since the last
 * loco_gpt_cuda_moe_reset (recomputed forwards not counted), as
 * loco_gpt_moe_add takes it; routed: n_experts values. LOCO_EINVAL for a
 * block this model does not run as MoE. */
int loco_gpt_cuda_moe_stats(const loco_gpt_cuda *g, int block, int *micro, const int64_t **routed,
                            int64_t *assignments, int64_t *dropped, double *aux_sum,
                            double *z_sum);
void loco_gpt_cuda_moe_reset(loco_gpt_cuda *g);
/* DeepSeek-V3's routing biases for the device's routing: (MoE layers of
 * the whole model, n_experts) floats, loco_gpt_router_bias's layout
 * (copied to the device; waits). */
int loco_gpt_cuda_set_router_bias(loco_gpt_cuda *g, const float *bias, size_t n);
/* Called on the host between the launches of a pass, as loco_gpt_hooks
 * (units 0, 1..L, L+1; the kernels before the call are queued, not
 * finished: work on loco_cuda_compute_stream is ordered after them).
 * While hooks are set the step is never captured as a CUDA graph. */
typedef struct {
    void *ctx;
    int (*acquire)(void *ctx, int unit, bool backward);
    int (*grads_ready)(void *ctx, int unit);
} loco_gpt_cuda_hooks;
void loco_gpt_cuda_set_hooks(loco_gpt_cuda *g, const loco_gpt_cuda_hooks *hooks);
/* A sharded model: the passes read unit's weights at w (the passes' type,
 * laid out like the unit's flat range) and add its gradients (fp32) into
 * grads; NULL keeps that binding. */
int loco_gpt_cuda_bind_unit(loco_gpt_cuda *g, int unit, const void *w, float *grads);
/* Flat range of a unit. */
void loco_gpt_cuda_unit_range(const loco_gpt_cuda *g, int unit, size_t *lo, size_t *hi);
/* The flat range [*lo, *hi) the fp32 state holds, the device weights of
 * that range in the passes' type (a sharded model's gather source) and
 * their version (bumped whenever the weights are refreshed from params). */
void loco_gpt_cuda_shard(const loco_gpt_cuda *g, size_t *lo, size_t *hi, const void **weights,
                         uint64_t *version);
/* Data parallel over the device state (the trainer, dp > 1). The device
 * pointers of the fp32 flat buffers (the layout of loco_gpt_build_table;
 * each starts at the held range's first element, loco_gpt_cuda_shard;
 * *n_params: the whole model's count) for collectives and ranged copies;
 * work on them goes on loco_cuda_compute_stream (NULL outputs are
 * skipped). The ranged calls below take flat indices inside the held
 * range. */
void loco_gpt_cuda_state(loco_gpt_cuda *g, float **params, float **grads, float **m, float **v,
                         size_t *n_params);
/* Sum of squares of the gradients of flat range [lo, hi), the fixed order
 * of loco_cuda_sumsq (waits). */
int loco_gpt_cuda_grad_sumsq(loco_gpt_cuda *g, size_t lo, size_t hi, double *sumsq);
/* Gradients of [lo, hi) times s (enqueued). */
int loco_gpt_cuda_scale_grads(loco_gpt_cuda *g, size_t lo, size_t hi, float s);
/* loco_gpt_cuda_adamw on the flat range [lo, hi) only (every tensor piece
 * in it with its own decay; opt->t is advanced). The bf16 weight copy is
 * NOT refreshed: loco_gpt_cuda_upload(g, NULL, NULL, NULL) does, once the
 * parameters are whole again. */
int loco_gpt_cuda_adamw_range(loco_gpt_cuda *g, loco_adamw *opt, float lr, size_t lo, size_t hi);
#endif /* LOCO_HAVE_CUDA */

#endif /* LOCO_INNER_MODEL_H */
