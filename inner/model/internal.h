/* Internals of inner/model/, included by its files only: the struct
 * loco_gpt, its activations and scratch, and what model.c (tables,
 * buffers, lifecycle), model_pass.c (passes), model_tp.c (tensor
 * parallelism), model_stage.c (pipeline stages), model_acts.c (the
 * activation slab), model_cp.c (context parallelism) and model_moe.c
 * (mixture of experts) share; then the device model's state, shared by
 * gpt_cuda.c and gpt_cuda_dp.c. */
#ifndef LOCO_MODEL_INTERNAL_H
#define LOCO_MODEL_INTERNAL_H

#include "inner/comm/comm.h"
#include "inner/model/model.h"

/* Activations of one block. R = rows of the LayerNorm / residual regions:
 * N = B*T, or N/t with sequence parallelism (this tp rank's rows); Cl =
 * C/t, Fl = 4C/t, NHl = NH/t: the tp slice. With recompute, the fields
 * of a recomputed block point into one shared block (full) and att into
 * one shared buffer (selective): they hold the last block computed. */
typedef struct {
    float *ln1, *ln1_mean, *ln1_rstd;   /* (R, C), (R), (R) */
    float *qkv;                         /* (N, Wl) */
    float *atty;                        /* (N, Cl) */
    float *att;                         /* (B, NHl, T, T) */
    float *attproj;                     /* (R, C) */
    float *res2;                        /* (R, C) */
    float *ln2, *ln2_mean, *ln2_rstd;   /* (R, C), (R), (R) */
    float *fch, *fch_gelu;              /* (N, Fl) c_fc's output, (N, Hl) its activation */
    float *fcproj;                      /* (R, C) */
    float *res3;                        /* (R, C) the block's output: always kept */
    /* A pipeline stage's blocks: what the weight half (W) of a split
     * backward needs from the input half (B), per activation slot. */
    float *keep_out, *keep_mid;         /* (N, C) gradients of the two c_proj outputs */
    float *keep_fch;                    /* (N, Fl) of c_fc's output */
    float *keep_qkv;                    /* (N, Wl) of c_attn's output */
    /* An MoE block's MLP instead of fch, fch_gelu (k = top_k, E experts;
     * at most N k packed rows, expert-major; kernels.h, "mixture of
     * experts"): */
    float *moe_probs, *moe_lse;         /* (N, E) router probabilities, (N) */
    int32_t *moe_expert, *moe_slot;     /* (N, k) chosen experts, packed rows */
    float *moe_weight;                  /* (N, k) renormalised probabilities */
    int32_t *moe_rows, *moe_count, *moe_routed; /* (N k) tokens, (E) kept, (E) routed */
    float *moe_x, *moe_y;               /* (N k, C) packed inputs and outputs */
    float *moe_h, *moe_hg;              /* (M, Fl) c_fc output, (M, Hl) its activation */
    float *moe_sh, *moe_shg;            /* (S, N, Fl), (S, N, Hl) the same of the S shared
                                         * experts (NULL without) */
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
    float *dqkv;   /* (N, Wl) */
    float *datt;   /* (B, NHl, T, T) */
    float *dfch;   /* (N, Fl) */
    float *dfchg;  /* (N, max(Hl, Cl)) */
    float *atty;   /* (N, Cl) attention output of a selective recompute */
    float *drep;   /* (max(6C, T*C)) sp: this rank's part of replicated gradients */
    float *dkeep3, *dkeep2; /* (N, C) gradients of mlp.c_proj's and attn.c_proj's
                             * outputs over all rows, for the weight half */
    float *moe_dy, *moe_dx;     /* (N k, C) MoE: packed rows' output and input gradients */
    float *moe_dh, *moe_dhg;    /* (M, Fc), (M, F) of c_fc's output and its activation
                                 * (a shared expert's, N <= M rows, too) */
    float *moe_shy;             /* (N, C) a shared expert's output (NULL without) */
    float *moe_dout;            /* (N, C) sp: the MoE output's gradient, every row */
    float *moe_yo, *moe_xfer;   /* (M, C) ep: the experts' side; all-to-all receive */
    float *moe_dlogits;         /* (N, E) */
    float *moe_dweight;         /* (N, k) */
    float *moe_plan;            /* (3 N k) loco_moe_plan's scratch */
} loco_gpt_scratch;

/* GPT-2 (as Hugging Face's GPT2LMHeadModel and llm.c define it) over flat,
 * layer-major parameter and gradient buffers described by `tt`. Opaque
 * outside inner/model/: loco_gpt_create / loco_gpt_destroy. */
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
     * the all-to-alls' buffers (inner/model/model_cp.c); T above is then the
     * local rows per sequence, cp->T the whole sequence. */
    struct loco_gpt_cp *cp;
    /* Mixture of experts: per MoE layer, what the passes routed since
     * loco_gpt_moe_reset (inner/model/model_moe.c); loss_scale of the pass. */
    struct loco_gpt_moe *moe;
    float loss_scale;
    bool rerun;             /* a block's forward rerun by full recompute */
    /* RoPE (cfg.pos = rope): cos and sin of every position's angles
     * (seq_len, hs/2), loco_rope_tables. */
    float *rope_cos, *rope_sin;
    /* tp with fewer key/value heads than tp ranks: the block's key|value
     * weight gradients accumulated before this micro-batch, (C + 1, 2 hs),
     * and every head's side by side for the sum over its holders, (C + 1,
     * 2 NKV hs); the last row is the bias's. */
    float *kv_keep, *kv_all;
};

static inline int loco__gpt_tp_of(const loco_gpt_config *cfg) {
    return cfg->tp > 1 ? cfg->tp : 1;
}

/* The tensors of block l in table order (Hugging Face GPT-2 names for
 * every family: loco's layouts, which `loco ckpt export` renames): what
 * loco_gpt_build_table adds and bind_views binds, one list for both. */
typedef struct {
    const char *suffix;
    size_t field; /* offsetof(loco_gpt_block, ...) */
    int ndim;
    int64_t shape[2];
    int split, split_parts;
    int64_t part_len[3]; /* unequal parts' lengths in the whole tensor (c_attn with GQA) */
    int part_units[3];   /* and their heads (loco_tensor.part_units) */
    bool decay;
} loco__gpt_block_tensor;

enum { LOCO__GPT_BLOCK_TENSORS_MAX = 12 };
/* Block l's tensors into out (LOCO__GPT_BLOCK_TENSORS_MAX at most); their
 * count. An MoE block's experts follow them in the table. */
int loco__gpt_block_tensors(const loco_gpt_config *cfg, int l, loco__gpt_block_tensor *out);
/* The description's own constraints and the paths not yet taught it
 * (LOCO_EINVAL / LOCO_ENOTSUP with the reason). */
int loco__gpt_check_description(const loco_gpt_config *cfg);

/* Key/value heads a tp rank holds: NKV/t, or the one its query heads read
 * when there are fewer than t (each then replicated on t/NKV ranks). */
static inline int loco__gpt_kv_local(const loco_gpt_config *cfg) {
    const int t = loco__gpt_tp_of(cfg), NKV = loco_gpt_kv_heads(cfg);
    return NKV >= t ? NKV / t : 1;
}
static inline int loco__gpt_kv_rep(const loco_gpt_config *cfg) {
    const int t = loco__gpt_tp_of(cfg), NKV = loco_gpt_kv_heads(cfg);
    return NKV >= t ? 1 : t / NKV;
}
/* c_attn's output width on a tp rank: its query heads, key and value heads. */
static inline int loco__gpt_qkv_local(const loco_gpt_config *cfg) {
    return (cfg->n_head / loco__gpt_tp_of(cfg) + 2 * loco__gpt_kv_local(cfg)) *
           loco_gpt_head_size(cfg);
}

/* The shapes of the passes on this rank: rows of the residual regions,
 * the tp slice's widths and where this rank's rows and vocabulary start. */
typedef struct {
    int t, k; /* tp size and rank */
    bool sp;
    size_t N, R, row0; /* all rows, this rank's residual rows, its first row */
    int C, Cl, NHl, Vl, v_lo, v_valid;
    /* The description's widths, tp slices: c_attn's output Wl (NHl query
     * and NKVl key/value heads of hs), c_fc's output Fl (SwiGLU: gate and
     * up, 2 Hl) and the MLP's hidden width Hl (GPT-2: Wl = 3Cl, Fl = Hl =
     * 4C/t). */
    int hs, NKVl, Wl, Fl, Hl;
    int Wa; /* c_attn's output rows as kept: Wl, or wider where Ulysses
             * replicates key/value heads in place (c wu) */
} loco__gpt_shape;

/* tp with replicated key/value heads (loco__gpt_kv_rep > 1): around
 * c_attn's weight gradient, begin moves the key|value columns accumulated
 * so far aside (and zeroes them); end sums this micro-batch's over the
 * ranks that hold the same head and adds the kept ones back. */
void loco__gpt_kv_replicas_begin(loco_gpt *m, const loco__gpt_shape *d, float *dw, float *db);
int loco__gpt_kv_replicas_end(loco_gpt *m, const loco__gpt_shape *d, float *dw, float *db);

/* The shapes of a B x T batch's passes on this rank. */
loco__gpt_shape loco__gpt_shape_of(const loco_gpt *m, int B, int T);

/* Collectives over the model's tp group, counted in m->comm: in place
 * all-reduce; reduce-scatter (SUM) of full (t blocks of n_part, rank
 * order) into part; all-gather of every rank's part into full. */
int loco__gpt_tp_allreduce(loco_gpt *m, float *buf, size_t n, loco_comm_op op);
int loco__gpt_tp_reduce_scatter(loco_gpt *m, const float *full, float *part, size_t n_part);
int loco__gpt_tp_allgather(loco_gpt *m, const float *part, float *full, size_t n_part);

/* The LayerNorm output x (R, C) as a column-parallel layer's input (N
 * rows): itself, or gathered into s.gather under sp. */
int loco__gpt_column_input(loco_gpt *m, const loco__gpt_shape *d, const float *x,
                           const float **full);
/* Row-parallel layer: out (R, C) = sum over tp of in (N, K) @ w (K, C),
 * + bias once. Its backward in two halves (B and W of a zero-bubble
 * schedule): the input half accumulates dbias from this rank's rows (under
 * sp a partial sum for loco__gpt_sp_reduce_into) and dinp, and keeps dout
 * over all rows in dkeep (N, C) for the weight half, which accumulates dw. */
int loco__gpt_row_parallel_fwd(loco_gpt *m, const loco__gpt_shape *d, float *out, const float *in,
                               const float *w, const float *bias, int K);
int loco__gpt_row_parallel_bwd_input(loco_gpt *m, const loco__gpt_shape *d, float *dinp,
                                     float *dbias, const float *dout, float *dkeep, const float *w,
                                     int K);
void loco__gpt_row_parallel_bwd_weight(const loco__gpt_shape *d, float *dw, const float *dkeep,
                                       const float *in, int K);
/* Column-parallel layer's backward: the input half overwrites dx (R, C)
 * with the input gradient summed over tp; the weight half accumulates dw,
 * db (gathering the LayerNorm output x again under sp). */
int loco__gpt_column_parallel_bwd_input(loco_gpt *m, const loco__gpt_shape *d, float *dx,
                                        const float *dout, const float *w, int OC);
int loco__gpt_column_parallel_bwd_weight(loco_gpt *m, const loco__gpt_shape *d, float *dw,
                                         float *db, const float *dout, const float *x, int OC);
/* Under sp: s.drep (the n arrays of len[i] floats, in order) summed over tp
 * and added into dst[i]. */
int loco__gpt_sp_reduce_into(loco_gpt *m, float *const *dst, const size_t *len, int n);
/* Embeddings into a.encoded (R, C), and their backward from s.dres. */
int loco__gpt_embed_fwd(loco_gpt *m, const loco__gpt_shape *d, const int32_t *inputs, int B, int T);
int loco__gpt_embed_bwd(loco_gpt *m, const loco__gpt_shape *d, const int32_t *inputs, int B, int T);
/* a.losses (N) from a.logits, and with `backward` the logits' gradient
 * (times dscale) in place; vocabulary-parallel under tp. */
int loco__gpt_cross_entropy(loco_gpt *m, const int32_t *targets, int N, bool backward,
                            float dscale);

/* What a block's weight half needs from its input half: the gradients
 * of its four matmuls' outputs (the row-parallel ones over all rows). */
typedef struct {
    float *d_out; /* (N, C) of mlp.c_proj's output: the block output's */
    float *d_fch; /* (N, Fl) of c_fc's output */
    float *d_mid; /* (N, C) of attn.c_proj's output */
    float *d_qkv; /* (N, 3Cl) of c_attn's output */
} loco__gpt_block_keep;

/* The unit of tensor t in a (whole or stage) table: 0 for wte and wpe,
 * l + 1 for block l, L + 1 for ln_f and a wte that follows it. */
int loco__gpt_unit_of(const loco_tensor *t, int L, bool after_lnf);
/* Whether block l reruns its forward in its backward (full recompute). */
bool loco__gpt_full_recompute(const loco_gpt *m, int l);
/* A pass of a B x T batch: activations held, within capacity, rows split
 * under sp; with tokens, every token in the vocabulary. */
int loco__gpt_check_capacity(const loco_gpt *m, int B, int T);
int loco__gpt_check_tokens(const loco_gpt *m, const int32_t *inputs, int B, int T);
/* Block l's forward; its backward's input half (B: s.dres in, the input's
 * gradient out, what W needs into k), weight half (W) and both at once. */
int loco__gpt_block_fwd(loco_gpt *m, const loco__gpt_shape *d, int l, const loco_gpt_layer_acts *la,
                        int B, int T);
int loco__gpt_block_bwd_input(loco_gpt *m, const loco__gpt_shape *d, int l,
                              const loco_gpt_layer_acts *la, int B, int T,
                              const loco__gpt_block_keep *k);
int loco__gpt_block_bwd_weight(loco_gpt *m, const loco__gpt_shape *d, int l,
                               const loco_gpt_layer_acts *la, const loco__gpt_block_keep *k);
int loco__gpt_block_bwd(loco_gpt *m, const loco__gpt_shape *d, int l, const loco_gpt_layer_acts *la,
                        int B, int T);
/* ln_f and the tied head: forward to a.logits; the input half (ln_f's
 * input gradient into s.dres, ln_f's own gradients); the weight half
 * (wte's gradient from the logits'). */
int loco__gpt_head_fwd(loco_gpt *m, const loco__gpt_shape *d);
int loco__gpt_head_bwd_input(loco_gpt *m, const loco__gpt_shape *d);
void loco__gpt_head_bwd_weight(loco_gpt *m, const loco__gpt_shape *d);
/* Carves the activation slab (inner/model/model_acts.c): with base NULL only
 * counts; returns floats; sets block_act_bytes and, with a base, points
 * every slot's and the scratch's buffers into it. */
size_t loco__gpt_carve_acts(loco_gpt *m, float *base);
/* Mean of n floats, summed in double. */
float loco__gpt_mean_of(const float *x, int n);

/* ------------------------------------------------ context parallelism */

/* The state of inner/model/model_cp.c (m->cp, NULL without cp). */
typedef struct loco_gpt_cp {
    loco_comm *comm; /* m->par.cp */
    loco_cp_algo algo;
    int c, r;        /* group size, this rank */
    int T, Tc, Tl;   /* whole sequence, one of its 2c chunks, this rank's rows */
    int32_t *tok, *tgt;    /* (B, Tl) the rank's tokens and targets */
    float *buf;            /* the slab the buffers below live in */
    float *wpe, *dwpe;     /* (Tl, C) the rows' positions in wpe, their gradient */
    int *pos;              /* (Tl) the global position of each local row (RoPE) */
    /* The attention's widths: Ckv = NKVl hs of keys (or values) in a row;
     * Ulysses gives rank x hq = NHl/c query heads' columns and hk of key
     * (and value) heads': NKVl/c heads, or the one its queries read when
     * there are fewer key/value heads than ranks (replicated, its gradient
     * summed on the way back); a head-sharded row is wu = hq + 2 hk. */
    int Ckv, hq, hk, wu;
    float *kv[2], *dkv[2]; /* ring: (B Tl, 2 Ckv) K|V travelling, dK|dV following */
    float *dkv_part;       /* ring: (B Tl, 2 Ckv) a step's dK|dV before the accumulator's */
    float *blk_out, *blk_lse, *delta; /* ring: a block's (Tc, Cl), (NHl, Tc); (B, 2, NHl, Tc) */
    float *send, *recv;    /* Ulysses: all-to-all buffers (c B Tl wu) */
    float *hout, *hdout, *hdqkv; /* Ulysses: head-sharded output, its gradient, dqkv */
    size_t bytes_held;     /* allocated */
    double bytes;          /* sent by this rank */
} loco_gpt_cp;

/* Shapes context parallelism can split (LOCO_EINVAL with the reason). */
int loco__gpt_cp_check(const loco_gpt_config *cfg, int B, int T, const loco_gpt_parallel *par);
/* Makes m->cp for par.cp (nothing for one rank) and sets m->T to the
 * local rows; before the activations are carved. */
int loco__gpt_cp_init(loco_gpt *m, int B, int T);
void loco__gpt_cp_fini(loco_gpt *m);
/* A pass's whole sequences (B x *T tokens; inputs or targets may be NULL)
 * -> this rank's rows (*T becomes the local rows). */
int loco__gpt_cp_localize(loco_gpt *m, const int32_t **inputs, const int32_t **targets, int B,
                          int *T);
/* The rank's mean loss -> the mean over the whole sequences (collective). */
int loco__gpt_cp_mean_loss(loco_gpt *m, float *loss);
/* wpe as the embedding reads it: the rows' positions (m->p.wpe without
 * cp); its gradient buffer (zeroed), added into m->g.wpe by _done. */
const float *loco__gpt_cp_wpe(loco_gpt *m);
float *loco__gpt_cp_dwpe(loco_gpt *m);
void loco__gpt_cp_dwpe_done(loco_gpt *m);
/* Floats a block keeps of its attention (probabilities, or under ring the
 * rows' log-sum-exp), and the size of the backward's scratch for them. */
size_t loco__gpt_att_floats(const loco_gpt *m, const loco__gpt_shape *d);
/* Attention of qkv (B x T local rows, 3 Cl) into out, keeping att; under
 * Ulysses qkv becomes the head-sharded whole sequences in place. _rerun:
 * the forward again for the backward (selective recompute); _bwd: dqkv
 * accumulates. */
int loco__gpt_attention_fwd(loco_gpt *m, const loco__gpt_shape *d, float *out, float *att,
                            float *qkv, int B, int T);
int loco__gpt_attention_rerun(loco_gpt *m, const loco__gpt_shape *d, float *scratch, float *att,
                              const float *qkv, int B, int T);
int loco__gpt_attention_bwd(loco_gpt *m, const loco__gpt_shape *d, float *dqkv, float *datt,
                            const float *dout, const float *qkv, const float *out,
                            const float *att, int B, int T);

/* ------------------------------------------------- mixture of experts */

/* MoE against the rest of the configuration (LOCO_EINVAL, or
 * LOCO_ENOTSUP for what is not built). */
int loco__gpt_moe_check(const loco_gpt_config *cfg, const loco_gpt_parallel *par);
int loco__gpt_moe_init(loco_gpt *m); /* the statistics; nothing for a dense model */
void loco__gpt_moe_fini(loco_gpt *m);
/* Block l's MoE MLP: la->ln2 in, la->fcproj out (inner/model/model_moe.c); its
 * backward from s.dres into s.dbtc, with every router and expert gradient. */
int loco__gpt_moe_fwd(loco_gpt *m, const loco__gpt_shape *d, int l, const loco_gpt_layer_acts *la);
int loco__gpt_moe_bwd(loco_gpt *m, const loco__gpt_shape *d, int l, const loco_gpt_layer_acts *la);
/* What the MoE layers keep between passes (inner/model/model_moe.c). */
struct loco_gpt_moe {
    int n;                          /* MoE layers */
    int *block;                     /* (n) their blocks */
    int *index;                     /* (L) block -> MoE layer, -1 */
    int64_t *routed;                /* (n, E) */
    int64_t *assignments, *dropped; /* (n) */
    double *aux, *z;                /* (n) sums over micro-batches */
    int64_t *micro;                 /* (n) */
    size_t *sendc, *recvc;          /* (ep) all-to-all-v counts */
    size_t *cursor;                 /* (ep) regroup's place in each source's rows */
    double bytes;                   /* sent to other ep ranks since the model was made */
    float *bias;                    /* (n, E) routing biases; NULL when rate 0 */
    int64_t *load;                  /* (n, E) the island's loads of the last bias step */
    /* Under cp: the cp group's micro-batch of ng tokens in global order
     * (expert ids, the chosen probabilities at (t, e), its plan) and this
     * rank's share of it (sizes in floats/ints of the slab). */
    void *glob;
    size_t glob_n;
};
/* Expert capacity over a micro-batch of N tokens (N when dropless). */
int loco__gpt_moe_capacity(const loco_gpt_config *cfg, int N);
/* Under cp: the plan of the cp group's micro-batch into this rank's
 * packed rows (*n of them; *kept the micro-batch's), la->moe_routed the
 * micro-batch's expert counts (inner/model/model_moe_cp.c). */
int loco__gpt_moe_cp_plan(loco_gpt *m, const loco_gpt_layer_acts *la, int N, int *n, int *kept);

#if defined(LOCO_HAVE_CUDA)
#include "kernels/kernels.h"

/* ------------------------------------------------------------- the state */

enum { VOCAB_ALIGN = 64 };

/* Activations of one block, kept for the backward; element type of the
 * model (bf16 or fp32) unless float. Strided by the capacity B x T. */
typedef struct {
    void *ln1, *qkv, *atty, *res2, *ln2, *fch, *fchg, *res3; /* (N,C) (N,W) .. (N,Fc) (N,F) */
    float *ln1m, *ln1r, *ln2m, *ln2r;                        /* (N) */
    float *lse;                                              /* (B,NH,T) */
    /* Ulysses (cp): every row of this rank's 1/cp of the heads, as the
     * attention read and wrote them: (B, T whole, wu) and (B, T whole, hq) */
    void *qkvh, *outh;
} layer_acts;

/* The captured forward + backward of one token slot, and its shape. */
typedef struct {
    loco_graph exec;
    int B, T;
    float scale;
} step_graph;

struct loco_gpt_cuda {
    loco_gpt_config cfg;
    loco_ttable tt;
    size_t P;
    int B, T;   /* capacity */
    int Vp;     /* the head's padded vocabulary: Vl rounded up to VOCAB_ALIGN */
    /* Tensor parallelism (gpt_cuda_tp.c): this tp rank's slice, as the CPU
     * model's (loco__gpt_shape); the whole model's widths when tp = 1. */
    struct loco_comm *tpc;      /* the tp group; NULL when tp = 1 */
    int tp, tp_rank;
    bool tp_staged;             /* the tp collectives move pinned host copies (mpi) */
    int Cl, NHl, NKVl, Wl, Fl, Hl; /* attention, heads, c_attn, c_fc, MLP hidden widths */
    int Vl, v_lo, v_valid;      /* the head's rows: the slice's, its first token, real ones */
    float *h_stage;             /* pinned (N * max(C, 3)): a staged collective's buffer */
    float *tp_f32;              /* bf16: (N, C) an activation's collective in fp32 */
    /* A staged sum over tp begun (its copy out queued) and not yet
     * finished: the host runs its collective while the device computes
     * what was queued after the copy (gpt_cuda_tp.c, every sum of an
     * activation goes this way, loco__gpt_cuda_tp_sum_begin) */
    float *h_pend;              /* pinned (N, C) */
    loco_event pend_copied;
    void *pend_buf;             /* NULL when none is pending */
    size_t pend_n, pend_part;   /* its elements; the part it keeps (reduce-scatter) */
    /* Sequence parallelism (sp): this rank's rows of a pass's N are
     * [row0, row0 + N / tp) (model.c's R and row0) */
    bool sp;
    size_t *tp_counts;          /* (tp) counts of the v-collectives */
    void *gather, *dgather;     /* sp: (N, C) a norm's output, dres, gathered over tp */
    float *drep;                /* sp: ((T + 4), C) replicated gradients from this rank's rows */
    /* Context parallelism (gpt_cuda_cp.c, Ulysses): every sequence of Tw
     * tokens cut into 2 cp chunks of Tc, this rank holding chunks cp_rank
     * and 2 cp - 1 - cp_rank (T = 2 Tc local rows, model_cp.c's zig-zag) */
    struct loco_comm *cpc;      /* NULL when cp = 1 */
    int cp, cp_rank, Tw, Tc;
    int hq, hk, wu;             /* per rank: query, key/value columns, hq + 2 hk */
    int *cp_pos;                /* (T) device: the local rows' global positions */
    void *cp_wpe;               /* (T, C) wpe's rows at those positions */
    float *cp_dwpe;             /* (T, C) their gradient */
    void *cp_dout, *cp_dqkv;    /* (B, Tw, hq), (B, Tw, wu) the attention's backward */
    float *cp_f32;              /* bf16: (B, Tw, wu) cp_dqkv in fp32 */
    char *h_cp_send, *h_cp_recv, *h_cp_whole; /* pinned, (B, Tw, wu) elements each */
    float *h_cp_rows;           /* pinned, (B T, max(Wl, Cl)) local rows in fp32 */
    /* ring (fp32): K|V blocks (B T, 2 Ckv) travelling around the ring and
     * their dK|dV accumulators following them; on the device two K|V
     * slots, two accumulators and a step's part, one block's output and
     * lse, delta (B, 2, NH, Tc); on the host the hops' buffers, and an
     * event after each copy in from one (before it is received into again) */
    bool ring;
    int Ckv;
    float *cp_kv[2], *cp_dacc[2], *cp_dpart, *cp_blk_out, *cp_blk_lse, *cp_delta;
    float *cp_q32, *cp_o32;     /* bf16: (2, B T, Wl) qkv | dqkv, (2, B T, Cl) out |
                                 * dout in fp32 for the ring's kernels */
    float *h_kv_hop[2], *h_acc_send[2], *h_acc_recv;
    loco_event kv_in[2], acc_in;
    int32_t *h_cp_tok;          /* (2, B, T) local tokens and targets */
    float *xent;                /* (3N) vocabulary-parallel row max, sum of exp, target logit */
    float *kv_keep;             /* kv_rep > 1: (C + 1, Wl) c_attn's gradient set aside */
    float *h_kv;                /* pinned: (C + 1, Wl) c_attn's gradient, (C + 1, 2 NKV hs) */
    size_t head_off;  /* flat offset of the head's weight: wte, or lm_head when untied (V rows) */
    const char *head; /* its name */
    int head_unit;    /* and unit: 0 (wte) or L + 1 (lm_head) */
    float *rope_cos, *rope_sin; /* (maxT, hs/2) RoPE's tables, NULL with learned positions */
    bool bf16;
    size_t es;  /* bytes per activation element: 2 (bf16) or 4 */
    loco_cuda_slab *slab;
    loco_blas *blas;
    loco_stream stream, copy;      /* compute, token uploads */
    float *params, *grads, *m, *v; /* (P) fp32 */
    void *w;                       /* (P) weights the passes read: bf16 copy, or params */
    void *wte_pad;                 /* (Vp,C) the head's weights, rows >= V zero */
    float *dwte_pad;               /* (Vp,C) the head's gradient, zero between passes */
    int32_t *inputs, *targets;     /* (B,T) the current slot's */
    int32_t *d_tok[2];             /* (2,B,T) per slot: inputs, targets */
    int32_t *h_tok[2];             /* pinned, the same */
    loco_event copied[2], consumed[2];
    int slot;
    void *encoded, *lnf, *logits, *scratch; /* (N,C), (N,C), (N,Vp), (N,C) */
    float *lnfm, *lnfr, *losses;   /* (N) */
    float *mean;                   /* the last pass's mean loss */
    double *loss_acc;              /* sum of the mean losses since zero_grad */
    float *attn_scratch;           /* (B,NH,T) */
    double *sumsq;                 /* LOCO_CUDA_SUMSQ_OUT */
    layer_acts *la;                /* (L) */
    /* Full recompute of blocks [0, n_rerun): their activations alias one
     * shared set (only res3, the next block's input, is their own); the
     * backward reruns each one's forward before its own backward. */
    int n_rerun;
    size_t act_bytes;              /* the blocks' activations, as carved */
    void *dres, *dbtc, *dfchg, *dfch, *dqkv; /* (N,C) (N,C) (N,F) (N,Fc) (N,W) */
    double *h_out;                 /* pinned: sumsq, loss sum, mean (as float bits) */
    bool graph_on, warm;           /* train.cuda_graph; a plain pass ran (plans made) */
    step_graph graph[2];           /* per token slot */
    bool profiling;
    loco_attn_impl attn;           /* train.attention's kernel; reference until set */
    double *prof;                  /* LOCO_PROF_N, caller-owned */
    /* units: unit_lo (L + 3) flat starts, unit_lo[L + 2] = P; tunit (tt.n)
     * each tensor's unit; uw, ug (L + 2) what the passes read and add into */
    size_t *unit_lo;
    int *tunit;
    void **uw;
    float **ug;
    size_t own_lo, own_hi;         /* the flat range params, grads, m and v hold */
    bool sharded;                  /* own range < P: weights bound per unit */
    void *wshard;                  /* sharded: the owned weights in the passes' type */
    bool head_stale;               /* sharded: wte_pad is behind the head's unit's weights */
    uint64_t wversion;             /* bumped whenever the weights are refreshed */
    loco_gpt_cuda_hooks hooks;
};

/* gpt_cuda_tp.c: the tp group's collectives on device buffers (staged
 * through h_stage over mpi) and the vocabulary-parallel pieces; no-ops
 * where tp = 1 is a plain call. */
int loco__gpt_cuda_tp_allreduce(loco_gpt_cuda *g, float *buf, size_t n, loco_comm_op op);
int loco__gpt_cuda_tp_sum_act(loco_gpt_cuda *g, void *buf, size_t n);
int loco__gpt_cuda_tp_sum_begin(loco_gpt_cuda *g, void *buf, size_t n, size_t n_part);
int loco__gpt_cuda_tp_sum_finish(loco_gpt_cuda *g);
int loco__gpt_cuda_tp_scatter_act(loco_gpt_cuda *g, void *buf, size_t n_part);
int loco__gpt_cuda_tp_gather_act(loco_gpt_cuda *g, const void *part, void *full, size_t n_part);
int loco__gpt_cuda_sp_reduce(loco_gpt_cuda *g, float *const *dst, const size_t *len, int n);
int loco__gpt_cuda_tp_embed_fwd(loco_gpt_cuda *g, const void *wte, const void *wpe, int B, int T);
int loco__gpt_cuda_tp_embed_bwd(loco_gpt_cuda *g, float *dwte, float *dwpe, int B, int T);
int loco__gpt_cuda_tp_xent(loco_gpt_cuda *g, int N, float dscale, bool backward);
int loco__gpt_cuda_kv_begin(loco_gpt_cuda *g, float *dw, float *db);
int loco__gpt_cuda_kv_end(loco_gpt_cuda *g, float *dw, float *db);
int loco__gpt_cuda_tp_check(const loco_gpt_config *cfg, const loco_gpt_cuda_opts *o);

/* gpt_cuda_cp.c: context parallelism (Ulysses) of the device model. */
int loco__gpt_cuda_cp_check(const loco_gpt_config *cfg, int B, int T, const loco_gpt_cuda_opts *o);
int loco__gpt_cuda_cp_init(loco_gpt_cuda *g, const loco_gpt_cuda_opts *o, int T);
int loco__gpt_cuda_cp_host_init(loco_gpt_cuda *g);
void loco__gpt_cuda_cp_fini(loco_gpt_cuda *g);
int loco__gpt_cuda_cp_localize(loco_gpt_cuda *g, const int32_t **inputs, const int32_t **targets,
                               int B, int *T);
int loco__gpt_cuda_cp_wpe(loco_gpt_cuda *g, const void *wpe, const void **local);
int loco__gpt_cuda_cp_dwpe_done(loco_gpt_cuda *g, float *dwpe);
int loco__gpt_cuda_cp_mean(loco_gpt_cuda *g, double *v);
/* Block l's attention under cp (a's qkv, atty, lse; the backward from
 * dbtc into dqkv): Ulysses or the ring. */
int loco__gpt_cuda_cp_attention_fwd(loco_gpt_cuda *g, layer_acts *a, int B);
int loco__gpt_cuda_cp_attention_bwd(loco_gpt_cuda *g, const layer_acts *a, int B);

#define TWIN(k, ...)                                                                              \
    (g->bf16 ? loco_cuda_##k##_bf16(__VA_ARGS__) : loco_cuda_##k(__VA_ARGS__))
/* The attention's fwd or bwd: the tensor-core kernel (bf16 only) or the twin. */
#define ATTN(k, ...)                                                                              \
    (g->attn == LOCO_ATTN_TENSOR ? loco_cuda_attention_tc_##k##_bf16(__VA_ARGS__)                 \
                                 : TWIN(attention_##k, __VA_ARGS__))
/* The same of grouped-query attention. */
#define ATTN_GQA(k, ...)                                                                          \
    (g->attn == LOCO_ATTN_TENSOR ? loco_cuda_attention_tc_gqa_##k##_bf16(__VA_ARGS__)             \
                                 : TWIN(attention_gqa_##k, __VA_ARGS__))

/* Runs one kernel call; when profiling, waits around it and adds its time
 * to its kind. */
#define RUN(kind, call)                                                                           \
    do {                                                                                          \
        if (!g->profiling) {                                                                      \
            LOCO_CHECK(call);                                                                     \
            break;                                                                                \
        }                                                                                         \
        LOCO_CHECK(loco_cuda_sync(g->stream));                                                    \
        const double t0_ = loco_now();                                                            \
        LOCO_CHECK(call);                                                                         \
        LOCO_CHECK(loco_cuda_sync(g->stream));                                                    \
        g->prof[kind] += loco_now() - t0_;                                                        \
    } while (0)

#endif /* LOCO_HAVE_CUDA */

#endif /* LOCO_MODEL_INTERNAL_H */
