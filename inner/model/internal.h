/* Internals of inner/model/, included by its files only: the struct
 * loco_gpt, its activations and scratch, and what model.c (tables,
 * buffers, lifecycle), model_pass.c (passes), model_tp.c (tensor
 * parallelism), model_stage.c (pipeline stages), model_acts.c (the
 * activation slab), model_cp.c (context parallelism) and model_moe.c
 * (mixture of experts) share. The device model's state is in
 * gpt_cuda_internal.h. */
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
/* Rows between source-major (as ep's all-to-all moves them) and
 * expert-major (as the El local experts compute them), C floats each;
 * recv (e, El) the rows each source sends each local expert; cursor: e
 * words of scratch. For the device model too. */
void loco__moe_regroup(int e, int El, int C, const int32_t *recv, size_t *cursor, float *dst,
                       const float *src, bool to_experts);
/* The same over host arrays, for the device model too: the cp layout
 * (group, size, whole length, chunk, local rows and their global
 * positions), this rank's choices (expert (N, k)) and probabilities
 * (N, E) in; the plan (slot, rows, count, routed) out; *glob a growing
 * scratch (glob_n words). */
typedef struct {
    const loco_gpt_config *cfg;
    loco_comm *comm;
    int c, T, Tc, Tl;
    const int *pos;
    const int32_t *expert;
    const float *probs;
    int32_t *slot, *rows, *count, *routed;
    void **glob;
    size_t *glob_n;
} loco_moe_cp_args;
int loco__moe_cp_plan(const loco_moe_cp_args *x, int N, int *n, int *kept);

#endif /* LOCO_MODEL_INTERNAL_H */
