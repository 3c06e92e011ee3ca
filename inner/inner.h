/* inner/ — one island: the GPT-2 model over flat buffers (whole, or one
 * tensor-parallel slice), AdamW with its schedule, the token-shard data
 * loader, checkpoints and the training loop. The communicator, the mesh and
 * ZeRO / pipeline schedules are its sub-rooms (inner/comm, inner/mesh,
 * inner/parallel). */
#ifndef LOCO_INNER_H
#define LOCO_INNER_H

#include "core/core.h"

struct loco_comm;

/* ------------------------------------------------------------------ data */

/* Token shards in llm.c's .bin format: a header of 256 int32 (magic,
 * version, token count, zeros...), then the tokens: magic 20240520 version 1
 * holds uint16 tokens, magic 20240801 version 7 holds uint32 tokens. */
#define LOCO_SHARD_HEADER_INTS 256
#define LOCO_SHARD_MAGIC_U16 20240520
#define LOCO_SHARD_VERSION_U16 1
#define LOCO_SHARD_MAGIC_U32 20240801
#define LOCO_SHARD_VERSION_U32 7

/* Where the next batch starts; saved in checkpoints. */
typedef struct {
    int64_t shard; /* index into the sorted shard list */
    int64_t pos;   /* token offset of the next batch in that shard, shared by all
                    * ranks (rank r reads at pos + r*B*T) */
    int64_t epoch; /* completed passes over all shards */
} loco_data_pos;

typedef struct loco_data loco_data;

/* Opens the shards named by `pattern` (a glob, or a comma-separated list of
 * globs/paths; matches sorted by name) and validates every header and file
 * size before returning: missing file, wrong magic or version, truncated or
 * oversize shard, a shard shorter than one batch are LOCO_EINVAL/LOCO_EPROTO
 * errors that name the file. Batches are B rows of T+1 consecutive tokens
 * (B*T+1 tokens read contiguously, llm.c style); rank r of `world` reads
 * the r-th window of every world*B*T tokens. Tokens >= vocab_size are
 * rejected when read (LOCO_EPROTO naming shard and offset). */
int loco_data_open(loco_data **out, const char *pattern, int B, int T, int rank, int world,
                   int vocab_size);
void loco_data_close(loco_data *d); /* accepts NULL */
/* Fills inputs and targets (B*T each) with the next batch and advances;
 * moves to the next shard when the current one has no full window left, and
 * wraps to the first shard (epoch + 1) after the last. */
int loco_data_next(loco_data *d, int32_t *inputs, int32_t *targets);
loco_data_pos loco_data_tell(const loco_data *d);
/* Continues from a saved position (LOCO_EINVAL if it is outside the shards). */
int loco_data_seek(loco_data *d, loco_data_pos pos);
int loco_data_num_shards(const loco_data *d);
int64_t loco_data_num_tokens(const loco_data *d); /* over all shards */

/* Writes one shard in version 1 (uint16 tokens, each < 65536) or version 7
 * (uint32), else LOCO_EINVAL. Written to path.tmp, fsynced, renamed. */
int loco_data_write_shard(const char *path, const int32_t *tokens, size_t n, int version);
/* Byte-level (vocab 256) preparation of any text file: the first
 * (1 - val_frac) of the bytes become OUT_PREFIX_train_NNNNNN.bin shards, the
 * rest OUT_PREFIX_val_NNNNNN.bin, each shard at most shard_tokens tokens. */
int loco_data_prep_bytes(const char *text_path, const char *out_prefix, double val_frac,
                         size_t shard_tokens);
/* The same for ids already encoded (a tokenizer's, of vocab_size ids):
 * the first floor((1-val_frac)*n) ids are train, the rest val; uint16
 * shards (version 1) while vocab_size <= 65536, uint32 (version 7) beyond.
 * `what` names the source in messages. */
int loco_data_prep_tokens(const int32_t *ids, size_t n, int vocab_size, const char *what,
                          const char *out_prefix, double val_frac, size_t shard_tokens);

/* ----------------------------------------------------------------- model */

typedef struct {
    int n_layer, n_head, n_embd; /* L, NH, C */
    int seq_len;                 /* maxT: rows of the position table */
    int vocab_size;              /* V */
    int tp;                      /* tensor-parallel degree t: tables, buffers and passes
                                  * hold one tp rank's slice (0 or 1: the whole model) */
    /* Mixture of experts (n_experts = 0: dense): blocks l with
     * l % moe_every == moe_every - 1 route each token to top_k of
     * n_experts GPT-2 MLPs; capacity_factor 0 = dropless. */
    int n_experts, top_k, moe_every;
    float capacity_factor, aux_loss, z_loss;
    /* Expert parallelism: the experts are split over ep ranks (0 or 1:
     * all here); this rank's table holds experts [ep_rank E/ep, (ep_rank +
     * 1) E/ep) of every MoE block, under their global names. */
    int ep, ep_rank;
} loco_gpt_config;

/* Whether block l's MLP is a mixture of experts. */
static inline bool loco_gpt_is_moe(const loco_gpt_config *cfg, int l) {
    return cfg->n_experts > 0 && cfg->moe_every > 0 && l % cfg->moe_every == cfg->moe_every - 1;
}

/* Views of one block's tensors inside a flat buffer (HF GPT-2 layouts). */
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
    /* An MoE block instead of the four mlp tensors: the router and its
     * experts, each c_fc.weight (C, 4C), c_fc.bias (4C), c_proj.weight
     * (4C, C), c_proj.bias (C) back to back (loco_gpt_expert). */
    float *routerw;             /* (E, C)   mlp.router.weight */
    float *experts;             /* expert 0's c_fc.weight */
} loco_gpt_block;

/* Expert j of an MoE block's views (at b->experts of params or grads). */
typedef struct {
    float *fcw, *fcb, *projw, *projb;
} loco_gpt_expert;
static inline loco_gpt_expert loco_gpt_expert_at(float *experts, int C, int j) {
    const size_t C_ = (size_t)C, size = 8 * C_ * C_ + 5 * C_;
    float *b = experts + (size_t)j * size;
    return (loco_gpt_expert){b, b + 4 * C_ * C_, b + 4 * C_ * C_ + 4 * C_,
                             b + 8 * C_ * C_ + 4 * C_};
}

typedef struct {
    float *wte;          /* (V, C), also the tied output head */
    float *wpe;          /* (maxT, C) */
    loco_gpt_block *h;   /* (L) */
    float *lnfw, *lnfb;  /* (C) */
} loco_gpt_tensors;

/* Activations of one block. R = rows of the LayerNorm / residual regions:
 * N = B*T, or N/t with sequence parallelism (this tp rank's rows); Cl =
 * C/t, Fl = 4C/t, NHl = NH/t: the tp slice. With recompute, the fields
 * of a recomputed block point into one shared block (full) and att into
 * one shared buffer (selective): they hold the last block computed. */
typedef struct {
    float *ln1, *ln1_mean, *ln1_rstd;   /* (R, C), (R), (R) */
    float *qkv;                         /* (N, 3Cl) */
    float *atty;                        /* (N, Cl) */
    float *att;                         /* (B, NHl, T, T) */
    float *attproj;                     /* (R, C) */
    float *res2;                        /* (R, C) */
    float *ln2, *ln2_mean, *ln2_rstd;   /* (R, C), (R), (R) */
    float *fch, *fch_gelu;              /* (N, Fl) */
    float *fcproj;                      /* (R, C) */
    float *res3;                        /* (R, C) the block's output: always kept */
    /* A pipeline stage's blocks: what the weight half (W) of a split
     * backward needs from the input half (B), per activation slot. */
    float *keep_out, *keep_mid;         /* (N, C) gradients of the two c_proj outputs */
    float *keep_fch;                    /* (N, Fl) of c_fc's output */
    float *keep_qkv;                    /* (N, 3Cl) of c_attn's output */
    /* An MoE block's MLP instead of fch, fch_gelu (k = top_k, E experts;
     * at most N k packed rows, expert-major; kernels.h, "mixture of
     * experts"): */
    float *moe_probs, *moe_lse;         /* (N, E) router probabilities, (N) */
    int32_t *moe_expert, *moe_slot;     /* (N, k) chosen experts, packed rows */
    float *moe_weight;                  /* (N, k) renormalised probabilities */
    int32_t *moe_rows, *moe_count, *moe_routed; /* (N k) tokens, (E) kept, (E) routed */
    float *moe_x, *moe_y;               /* (N k, C) packed inputs and outputs */
    float *moe_h, *moe_hg;              /* (M, 4C) c_fc output and its GELU */
    /* Under ep (M = ep N k, else N k and moe_xo = moe_x): the rows this
     * rank's experts received, expert-major, then by source rank, and how
     * many each source sent each of them (ep x E/ep). */
    float *moe_xo;                      /* (M, C) */
    int32_t *moe_recv;
} loco_gpt_layer_acts;

/* Activations of one forward pass, kept for backward. */
typedef struct {
    float *encoded;            /* (R, C) */
    loco_gpt_layer_acts *layer; /* (L) */
    float *lnf;                /* (N, C): all rows, gathered under sp */
    float *lnf_mean, *lnf_rstd;/* (R) */
    float *logits;             /* (N, Vl) this tp rank's vocabulary columns; holds
                                * dlogits after a training pass */
    float *losses;             /* (N) */
    float *xent;               /* (3N): vocabulary-parallel row max, sum of exp,
                                * target logit */
} loco_gpt_acts;

/* Gradient and communication scratch, reused from layer to layer. */
typedef struct {
    float *dres;   /* (R, C) gradient of the residual stream */
    float *dbtc;   /* (R, C) */
    float *full;   /* (N, C) partial sums before a reduction, gathered gradients */
    float *gather; /* (N, C) gathered LayerNorm output (sp) */
    float *dqkv;   /* (N, 3Cl) */
    float *datt;   /* (B, NHl, T, T) */
    float *dfch;   /* (N, Fl) */
    float *dfchg;  /* (N, Fl) */
    float *atty;   /* (N, Cl) attention output of a selective recompute */
    float *drep;   /* (max(6C, T*C)) sp: this rank's part of replicated gradients */
    float *dkeep3, *dkeep2; /* (N, C) gradients of mlp.c_proj's and attn.c_proj's
                             * outputs over all rows, for the weight half */
    float *moe_dy, *moe_dx;     /* (N k, C) MoE: packed rows' output and input gradients */
    float *moe_dh, *moe_dhg;    /* (M, 4C) of c_fc's output and its GELU */
    float *moe_yo, *moe_xfer;   /* (M, C) ep: the experts' side; all-to-all receive */
    float *moe_dlogits;         /* (N, E) */
    float *moe_dweight;         /* (N, k) */
    float *moe_plan;            /* (3 N k) loco_moe_plan's scratch */
} loco_gpt_scratch;

/* Activation recompute (train.recompute). */
typedef enum { LOCO_RECOMPUTE_NONE = 0, LOCO_RECOMPUTE_SELECTIVE, LOCO_RECOMPUTE_FULL } loco_recompute;
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

/* Allocation choices for loco_gpt_init_ex: ZeRO-3 keeps no full
 * parameter buffer, ZeRO-2 and 3 no full gradient buffer; their views are
 * then bound per unit with loco_gpt_bind_unit. A model whose passes run on
 * a GPU (loco_gpt_cuda) keeps no host activations: its forward passes
 * return LOCO_EINVAL. */
enum { LOCO_GPT_NO_PARAMS = 1, LOCO_GPT_NO_GRADS = 2, LOCO_GPT_NO_ACTS = 4 };

/* GPT-2 (as Hugging Face's GPT2LMHeadModel and llm.c define it) over flat,
 * layer-major parameter and gradient buffers described by `tt`. Caller owns
 * the struct: loco_gpt_init / loco_gpt_fini. */
struct loco_gpt {
    loco_gpt_config cfg;
    loco_ttable tt;         /* names, shapes and offsets, HF names */
    size_t n_params;
    float *params;          /* (n_params) */
    float *grads;           /* (n_params) */
    loco_gpt_tensors p, g;  /* views into params and grads */
    int B, T;               /* activation capacity */
    float *act_slab;
    loco_gpt_acts a;
    loco_gpt_scratch s;
    loco_gpt_hooks hooks;   /* all NULL: plain single-rank passes */
    size_t act_bytes;       /* activations and backward scratch allocated */
    size_t block_act_bytes; /* what block 0 keeps from its forward for its
                             * backward (with recompute: less) */
    loco_gpt_parallel par;
    int tp_rank;            /* position in par.tp (0 without tp) */
    size_t *tp_counts;      /* (t) counts of the v-collectives */
    loco_gpt_comm_stats comm;
    /* A pipeline stage (par.stage != NULL): its chunks, which units it
     * holds (tensor indices [unit_t0[u], unit_t1[u]) of tt, empty when not
     * held), and one activation set per slot (a is the slot in use). */
    loco_gpt_stage stage;
    bool staged, embed, head;
    int *unit_t0, *unit_t1; /* (L + 2) */
    loco_gpt_acts *slot_acts; /* (stage.slots) */
    int pass_first;         /* first block of the chunk a pass runs */
    /* Context parallelism (par.cp): the zig-zag slice, the ring's and
     * the all-to-alls' buffers (inner/model_cp.c); T above is then the
     * local rows per sequence, cp->T the whole sequence. */
    struct loco_gpt_cp *cp;
    /* Mixture of experts: per MoE layer, what the passes routed since
     * loco_gpt_moe_reset (inner/model_moe.c); loss_scale of the pass. */
    struct loco_gpt_moe *moe;
    float loss_scale;
    bool rerun;             /* a block's forward rerun by full recompute */
};

/* What one MoE layer routed since the last loco_gpt_moe_reset: the
 * assignments (tokens x top_k) routed to each expert before dropping, how
 * many were dropped, and the mean of the micro-batches' load-balancing and
 * z losses (unscaled). */
typedef struct {
    int block;                       /* 0-based */
    int64_t assignments, dropped;
    const int64_t *routed;           /* (n_experts) */
    double aux, z;
} loco_gpt_moe_stats;
/* MoE layers of the model (0 for a dense one) and layer i's figures. */
int loco_gpt_moe_layers(const loco_gpt *m);
void loco_gpt_moe_layer(const loco_gpt *m, int i, loco_gpt_moe_stats *out);
void loco_gpt_moe_reset(loco_gpt *m);
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
/* The inverse: element j of tp rank k's slice of gt -> *g in the whole
 * tensor; false for vocabulary padding (no whole-tensor element). */
bool loco_gpt_tp_global(const loco_tensor *gt, int t, int k, size_t j, size_t *g);
/* Allocates parameters, gradients and activations for batches up to B x T
 * (T <= seq_len). Parameters start at zero: call loco_gpt_init_weights or
 * load a checkpoint. */
int loco_gpt_init(loco_gpt *m, const loco_gpt_config *cfg, int B, int T);
/* Same, with LOCO_GPT_NO_* flags. */
int loco_gpt_init_ex(loco_gpt *m, const loco_gpt_config *cfg, int B, int T, unsigned flags);
/* Same, split over ranks as par says (NULL: as loco_gpt_init_ex). With
 * cfg->tp = t > 1, par->tp must be a group of t ranks; the tables and
 * buffers are this rank's slice, and every pass is collective over the
 * group. LOCO_EINVAL for sp without tp, B*T not divisible by t under sp,
 * and the shapes loco_gpt_build_table refuses. */
int loco_gpt_init_par(loco_gpt *m, const loco_gpt_config *cfg, int B, int T, unsigned flags,
                      const loco_gpt_parallel *par);
/* The table of a pipeline stage: the tensors of the units it holds, in
 * model order (the tp slice of cfg->tp), then a copy of wte after ln_f when
 * it holds the head but not the embeddings. LOCO_EINVAL for chunks that
 * are empty, overlap, are out of order or outside the model. */
int loco_gpt_build_stage_table(loco_ttable *tt, const loco_gpt_config *cfg,
                               const loco_gpt_stage *stage);
/* A pipeline stage's passes, one (micro-batch, chunk) at a time in
 * activation slot `slot`; chunk indexes m->stage. Activations between
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
/* Bytes this rank sent for context parallelism since the model was made
 * (ring: K|V and dK|dV blocks; Ulysses: the all-to-alls' off-rank parts). */
double loco_gpt_cp_bytes(const loco_gpt *m);
void loco_gpt_fini(loco_gpt *m);
/* GPT-2 initialisation: N(0, 0.02) weights and embeddings, residual
 * projections scaled by 1/sqrt(2 L), zero biases, unit LayerNorm weights. */
void loco_gpt_init_weights(loco_gpt *m, loco_rng *rng);
/* Forward pass on inputs (B, T). With targets, *mean_loss receives the mean
 * cross-entropy; without (NULL), only logits are computed (a.logits). */
int loco_gpt_forward(loco_gpt *m, const int32_t *inputs, const int32_t *targets, int B, int T,
                     float *mean_loss);
/* Forward and backward: gradients of loss_scale * mean loss are ADDED to
 * m->grads (so micro-batches accumulate). */
int loco_gpt_forward_backward(loco_gpt *m, const int32_t *inputs, const int32_t *targets, int B,
                              int T, float loss_scale, float *mean_loss);
void loco_gpt_zero_grad(loco_gpt *m);
/* Training FLOPs per token, counted as llm.c and PaLM do:
 * 6 * (matmul parameters) + 12 * L * C * T. */
double loco_gpt_flops_per_token(const loco_gpt_config *cfg, int T);
/* Model config from the [model] section. */
loco_gpt_config loco_gpt_config_from(const loco_config *cfg);

/* ------------------------------------------------------------- optimizer */

/* AdamW state over the flat parameter buffer (ZeRO shards it later). */
typedef struct {
    float *m, *v;  /* (n) first and second moments */
    size_t n;
    int64_t t;     /* updates taken */
    float beta1, beta2, eps, weight_decay;
} loco_adamw;

int loco_adamw_init(loco_adamw *opt, size_t n, const loco_config *cfg);
void loco_adamw_fini(loco_adamw *opt);
/* One update of every tensor of tt; weight decay only where tt says decay. */
void loco_adamw_step(loco_adamw *opt, const loco_ttable *tt, float *params, const float *grads,
                     float lr);
/* Learning rate of optimizer step `step` (0-based): linear warm-up to
 * train.lr, then cosine decay to train.lr * train.min_lr_frac. */
float loco_lr_at(const loco_config *cfg, int64_t step);
/* Global L2 norm of grads; scales them down to max_norm when above it
 * (max_norm <= 0: no clipping). Returns the norm before clipping. */
double loco_clip_grad_norm(float *grads, size_t n, double max_norm);

/* ------------------------------------------------------- model on a GPU */
/* (units, hooks, sharding, ranged updates: inner/gpt_cuda_internal.h) */

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
#endif /* LOCO_HAVE_CUDA */

/* ----------------------------------------------------------- checkpoints */

/* Everything a checkpoint holds besides the tensors. */
typedef struct {
    int64_t step;           /* optimizer steps completed */
    loco_data_pos data;     /* training loader position */
    loco_rng rng;
    uint64_t model_hash;    /* loco_config_hash of [model] */
} loco_ckpt_state;

/* Writes a checkpoint directory atomically (DIR.tmp, fsync, rename):
 * model.safetensors (HF GPT-2 names), config.json (HF keys), config.ini,
 * optimizer.safetensors and state.json with checksums of both files. */
int loco_ckpt_save(const char *dir, const loco_config *cfg, const loco_gpt *m,
                   const loco_adamw *opt, const loco_ckpt_state *st);
/* Loads a checkpoint into an initialised model (and optimizer if not NULL).
 * Every file is checked (presence, checksums, shapes, model hash against
 * cfg) before anything is overwritten: a corrupt or truncated checkpoint is
 * LOCO_EPROTO and leaves m and opt untouched. Reads both layouts below. */
int loco_ckpt_load(const char *dir, const loco_config *cfg, loco_gpt *m, loco_adamw *opt,
                   loco_ckpt_state *st);

/* Ranges of the flat buffers a rank holds, for checkpoints of sharded
 * state: parameters of [p_lo, p_hi) at params, AdamW moments of
 * [o_lo, o_hi) at m and v (both may be NULL to skip the optimizer). */
typedef struct {
    const loco_ttable *tt;  /* the table of this rank's slice (model.tp) and stage */
    loco_gpt_config model;  /* model.tp = t > 1: tt is tp rank tp_rank's slice */
    int tp_rank;
    /* A pipeline stage: tt is loco_gpt_build_stage_table(&model, stage),
     * the stage of pp rank pp_rank. NULL: the whole model (pp_rank
     * ignored). */
    const loco_gpt_stage *stage;
    int pp_rank;
    float *params;
    size_t p_lo, p_hi;
    float *m, *v;
    size_t o_lo, o_hi;
    int64_t adam_t;
} loco_ckpt_view;

/* The single-file layout above, from a view holding every range of the
 * whole model (LOCO_EINVAL for a tp > 1 slice or a pipeline stage: use the
 * sharded layout). */
int loco_ckpt_save_view(const char *dir, const loco_config *cfg, const loco_ckpt_view *v,
                        const loco_ckpt_state *st);
/* Sharded layout, written by each rank into the same temporary directory:
 * shard_NNNNN.safetensors (NNNNN = index, the shard's position in the
 * manifest's arrays) holds flat ranges "params", "exp_avg", "exp_avg_sq"
 * of [lo, hi) of the view's buffers (of tp rank v->tp_rank's slice when
 * v->model.tp > 1, of pp rank v->pp_rank's stage when v->stage is set,
 * both also named in its metadata); *hash receives its XXH3. Moments are
 * written as zeros when v->m is NULL. */
int loco_ckpt_write_shard(const char *tmpdir, int index, const loco_ckpt_view *v, size_t lo,
                          size_t hi, uint64_t *hash);
/* Then one rank writes state.json (the manifest: every shard's range,
 * checksum and, when v->model.tp = t > 1, "tp": t and each shard's
 * "tp_rank" from tp_ranks (NULL: all 0); with pipeline stages, pp > 1,
 * "pp": pp, "stages" (each pp rank's chunks, from stages[0 .. pp)),
 * "n_params" per stage and each shard's "pp_rank" from pp_ranks (NULL:
 * all 0)), config.json and config.ini, and publishes tmpdir as dir. Shard
 * i is the file written with index i. The stages must tile the model's
 * blocks, and the shards of each (pp rank, tp rank) tile that stage's
 * slice [0, numel of its table) in order, every pair having shards, else
 * LOCO_EINVAL and nothing is published. v is any rank's view (its model,
 * adam_t). With pp = 1 (stages ignored, may be NULL) the manifest is the
 * one written before pipeline parallelism, and with t = 1 too the one
 * written before tensor parallelism. */
int loco_ckpt_write_manifest_pp(const char *tmpdir, const char *dir, const loco_config *cfg,
                                const loco_ckpt_view *v, int n_shards, const size_t *los,
                                const size_t *his, const uint64_t *hashes, const int *tp_ranks,
                                const int *pp_ranks, const loco_gpt_stage *stages, int pp,
                                const loco_ckpt_state *st);
/* loco_ckpt_write_manifest_pp without pipeline stages (pp = 1). */
int loco_ckpt_write_manifest(const char *tmpdir, const char *dir, const loco_config *cfg,
                             const loco_ckpt_view *v, int n_shards, const size_t *los,
                             const size_t *his, const uint64_t *hashes, const int *tp_ranks,
                             const loco_ckpt_state *st);
/* Fills the view's ranges (of tp rank v->tp_rank's slice when v->model.tp
 * > 1, of v->stage when set) from a checkpoint of either layout, whatever
 * the number of shards, the tp and the pipeline stages it was written
 * with, after checking every file it needs; on error the view is
 * untouched. When the checkpoint's tp and its stage of pp rank v->pp_rank
 * equal the view's, the view's (pp rank, tp rank) shards are read by range
 * overlap; otherwise each tensor is read by name from a stage that holds
 * it (wte from the stage with the embeddings, also into a stage's tied
 * head copy) and across tp element by element (the single layout counts
 * as tp = 1, pp = 1). A checkpoint whose tp does not divide the model's
 * n_head, whose stages do not tile the model's blocks, or with a pp rank
 * or tp rank whose shards are missing or do not tile its slice, is
 * LOCO_EPROTO naming the checkpoint (and the rank). */
int loco_ckpt_load_view(const char *dir, const loco_config *cfg, loco_ckpt_view *v,
                        loco_ckpt_state *st);
/* Writes OUT/model.safetensors + OUT/config.json (Hugging Face) from a
 * checkpoint of either layout and any tp and pp, using the checkpoint's
 * own config.ini (the whole model, whatever its [parallel] says). */
int loco_ckpt_export(const char *dir, const char *out);
/* Checks a checkpoint directory of either layout, any tp, pp and ep,
 * completely, without a model: state.json, config.ini (its [model] must
 * be the one state.json's hash names), and every file state.json lists
 * (all shards of every (pp rank, tp rank), tiling their slices), each
 * present with its recorded XXH3, a sound safetensors header and the
 * shapes the model of config.ini gives. Reads every byte. 0 when a load
 * would find nothing wrong with the files; else LOCO_EPROTO (LOCO_ENOMEM
 * when memory ran out) with the reason, one line naming dir and the
 * file, also into why[cap] (may be NULL). It does not compare the
 * checkpoint with a run's config: loading another [model] still fails. */
int loco_ckpt_verify(const char *dir, char *why, size_t cap);
/* The checkpoint to resume from, into out[cap]. `from` names a checkpoint
 * (RUN/ckpt_N, or any directory with a state.json), a run directory
 * holding ckpt_N checkpoints, or a URL (put in out as is: loading one
 * falls back along its pointer, loco_ckpt_fetch). The newest candidate
 * that loco_ckpt_verify accepts is chosen: `from` itself, then the ckpt_N
 * of its run directory older than it (a run directory: all of them,
 * newest first); each one skipped is logged (warn) with why, and a
 * fallback says which one it took. None: LOCO_EPROTO naming each one
 * tried and why (or that there was none), out empty; LOCO_ENOMEM and
 * LOCO_EINVAL (a path too long) are not about the checkpoints. */
int loco_ckpt_pick_resume(const char *from, char *out, size_t cap);

/* Checkpoints at a URL. A location that is a URL (loco_store_is_url:
 * file://, http://, https://) names a *series* of checkpoints rather than
 * one directory: each checkpoint's files are objects under
 * URL/ckpt_STEP_ID/ (a fresh ID per upload, so published objects are never
 * overwritten) and the pointer object URL/LATEST names the newest one (its
 * step, prefix, and every file's name, size and XXH3) and carries the
 * entry of the one before it. The pointer is put last: it is the commit.
 * loco_ckpt_save, _save_view and loco_trainer_save given a URL write the
 * checkpoint into a staging directory under run.dir (loco_ckpt_stage_dir),
 * upload it and remove the staging copy; loco_ckpt_load and _load_view
 * given a URL fetch the newest complete checkpoint into
 * run.dir/ckpt_cache/ (removed after loading). Transfers use net.ca,
 * net.cert, net.key and the run.ckpt_* timeouts (inner/ckpt_internal.h). */

/* ------------------------------------------------ evaluation and sampling */

/* Initialises m for batches up to B x T and loads its weights (no
 * optimizer) from the checkpoint dir; the caller finalises m with
 * loco_gpt_fini. On failure m is finalised and loco_ckpt_load's error is
 * returned. */
int loco_gpt_load_ckpt(loco_gpt *m, const char *ckpt, const loco_config *cfg, int B, int T);

typedef struct {
    long long batches, tokens; /* tokens = batches * B * T */
    double loss;               /* mean of the batches' mean losses */
    long long bytes;           /* text bytes the targets stand for */
    double nats_per_byte;      /* loss * tokens / bytes (inf when bytes is 0) */
} loco_eval_result;
/* Validation loss of m over the next `batches` batches of d (m->B x m->T
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
 * the logits of the last position given the last m->T ids, calling
 * on_token (may be NULL) after each. LOCO_EINVAL when *n is 0, the new ids
 * do not fit in cap, an id of ctx is outside the vocabulary or o is out of
 * range; forward errors pass through. Same model, ctx, opts and rng state:
 * the same ids. */
int loco_gpt_generate(loco_gpt *m, int32_t *ctx, size_t *n, size_t cap, long long ntok,
                      const loco_sample_opts *o, loco_rng *rng, loco_gen_token_fn on_token,
                      void *arg);

/* ------------------------------------------- Hugging Face GPT-2 weights */

/* Fills the view's parameter range [p_lo, p_hi) (of tp rank v->tp_rank's
 * slice when v->model.tp > 1, of v->stage's table when set; the optimizer
 * fields are ignored) from a Hugging Face GPT-2 directory as
 * GPT2LMHeadModel.save_pretrained writes it: DIR/config.json (n_layer,
 * n_head, n_embd, vocab_size, n_positions, n_inner, layer_norm_epsilon,
 * activation_function... checked against v->model, every mismatch named;
 * n_positions may exceed model.seq_len: the first rows are used) and
 * DIR/model.safetensors (F32, F16 or BF16, names with or without
 * "transformer."; the h.N.attn.bias / masked_bias buffers are ignored;
 * wte rows beyond config.json's vocab_size are padding, dropped;
 * lm_head.weight absent or equal to wte, since loco ties the head). A
 * missing, unknown, misshapen or wrongly typed tensor, a truncated file or
 * an untied head is LOCO_EPROTO naming the file and tensor, a config
 * mismatch LOCO_EINVAL; everything is checked before the view is written,
 * so on error it is untouched. */
int loco_hf_import_view(const char *dir, const loco_ckpt_view *v);
/* The same into a whole model's parameters (tp = 1, no stage). */
int loco_hf_import(const char *dir, loco_gpt *m);

/* -------------------------------------------------------------- training */

typedef struct {
    int64_t step;      /* 1-based step just completed */
    float loss;        /* mean over the micro-batches */
    float lr;
    double grad_norm;  /* before clipping */
    double seconds;    /* wall time of the step */
    double tokens_per_s;
} loco_step_stats;

typedef struct loco_trainer loco_trainer;

/* Builds model, optimizer and loaders from cfg; initialises weights from
 * train.seed, or continues from a checkpoint when resume_dir is not NULL. */
int loco_trainer_create(loco_trainer **out, const loco_config *cfg, const char *resume_dir);
/* The same for island `island` of `n_islands`: each reads its own windows of
 * data.train (window index island * dp + dp_rank of n_islands * dp). */
int loco_trainer_create_island(loco_trainer **out, const loco_config *cfg, const char *resume_dir,
                               int island, int n_islands);
void loco_trainer_destroy(loco_trainer *t);
/* One optimizer step (grad_accum micro-batches, clip, AdamW). */
int loco_trainer_step(loco_trainer *t, loco_step_stats *stats);
/* Mean validation loss over the first `batches` sequential batches. */
int loco_trainer_eval(loco_trainer *t, int batches, double *val_loss, int64_t *tokens);
int loco_trainer_save(loco_trainer *t, const char *dir);
/* The whole run: train.steps steps, logs, evals, checkpoints, metrics.jsonl. */
int loco_trainer_run(loco_trainer *t);
int64_t loco_trainer_steps_done(const loco_trainer *t);
/* Moves the step counter (learning-rate schedule, logs) to `step` (an island
 * that rejoined continues at the others' step); set_end moves the run's last
 * step (final eval and checkpoint) past train.steps: a fault lab hold. */
void loco_trainer_set_step(loco_trainer *t, int64_t step);
void loco_trainer_set_end(loco_trainer *t, int64_t end_step);
/* The range [*lo, *hi) of the flat parameter buffer this rank owns and its
 * values (the outer loop works on it; valid between steps). */
float *loco_trainer_owned_params(loco_trainer *t, size_t *lo, size_t *hi);
/* The table whose offsets index the flat buffer that owned_params' [lo, hi)
 * is a range of: the model's own table, under every mesh this rank's part
 * of the model (its tp slice, pp stage with the tied head's wte copy after
 * ln_f, ep rank's experts under their global names; cp and dp replicate).
 * Valid while t lives. */
const loco_ttable *loco_trainer_param_table(loco_trainer *t);
/* After the owned parameters were rewritten: make every rank of the island
 * see them (collective over the island). */
int loco_trainer_sync_params(loco_trainer *t);
/* train.device = cuda: the device pointer of the owned range [*lo, *hi)
 * of the fp32 flat parameters (the outer loop on the device works on it;
 * valid between steps); NULL when the trainer trains on the host. */
float *loco_trainer_device_params(loco_trainer *t, size_t *lo, size_t *hi);
/* After the outer loop wrote the owned range on the device: the bf16 copy
 * is refreshed and the host copy marked stale (downloaded when next read)
 * instead of uploaded. One rank per island only (no collective).
 * LOCO_EINVAL on the host. */
int loco_trainer_device_written(loco_trainer *t);
/* Bytes the trainer's host / device copies of the parameters and moments
 * (train.device = cuda, around outer steps, checkpoints, evals) moved
 * across PCIe since the last call; resets the count. 0 on the host. */
uint64_t loco_trainer_take_pcie_bytes(loco_trainer *t);
/* The pieces of loco_trainer_run, for loops that do more between steps
 * (the island's outer steps): begin_run opens metrics and logs the header;
 * after_step logs, evaluates and checkpoints as [run] says. */
int loco_trainer_begin_run(loco_trainer *t);
int loco_trainer_after_step(loco_trainer *t, const loco_step_stats *s);
/* The island's communicator (every rank of this island). */
struct loco_comm *loco_trainer_world(loco_trainer *t);
/* Rank of this process in its island, and the island's size. */
int loco_trainer_rank(const loco_trainer *t);
int loco_trainer_ranks(const loco_trainer *t);
loco_gpt *loco_trainer_model(loco_trainer *t);
/* Rank 0's live metrics registry (run.metrics_addr, made by create; NULL
 * when off or on other ranks), for the caller to serve: an island adds its
 * outer metrics to it. Valid while t lives. */
loco_prom *loco_trainer_prom(loco_trainer *t);

/* Unigram (order-0) cross-entropy of a token stream in nats: the loss of a
 * model that knows only token frequencies; the baseline to beat. */
int loco_data_unigram_entropy(const char *pattern, int vocab_size, double *nats);

#endif /* LOCO_INNER_H */
