/* Internals of the GPT model shared by inner/model.c (tables, buffers,
 * passes), model_tp.c (tensor parallelism), model_stage.c (pipeline
 * stages), model_acts.c (the activation slab), model_cp.c (context
 * parallelism) and model_moe.c (mixture of experts). Not for use outside
 * them. */
#ifndef LOCO_MODEL_INTERNAL_H
#define LOCO_MODEL_INTERNAL_H

#include "inner/comm/comm.h"
#include "inner/inner.h"

static inline int loco__gpt_tp_of(const loco_gpt_config *cfg) {
    return cfg->tp > 1 ? cfg->tp : 1;
}

/* The shapes of the passes on this rank: rows of the residual regions,
 * the tp slice's widths and where this rank's rows and vocabulary start. */
typedef struct {
    int t, k; /* tp size and rank */
    bool sp;
    size_t N, R, row0; /* all rows, this rank's residual rows, its first row */
    int C, Cl, Fl, NHl, Vl, v_lo, v_valid;
} loco__gpt_shape;

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
/* Carves the activation slab (inner/model_acts.c): with base NULL only
 * counts; returns floats; sets block_act_bytes and, with a base, points
 * every slot's and the scratch's buffers into it. */
size_t loco__gpt_carve_acts(loco_gpt *m, float *base);
/* Mean of n floats, summed in double. */
float loco__gpt_mean_of(const float *x, int n);

/* ------------------------------------------------ context parallelism */

/* The state of inner/model_cp.c (m->cp, NULL without cp). */
typedef struct loco_gpt_cp {
    loco_comm *comm; /* m->par.cp */
    loco_cp_algo algo;
    int c, r;        /* group size, this rank */
    int T, Tc, Tl;   /* whole sequence, one of its 2c chunks, this rank's rows */
    int32_t *tok, *tgt;    /* (B, Tl) the rank's tokens and targets */
    float *buf;            /* the slab the buffers below live in */
    float *wpe, *dwpe;     /* (Tl, C) the rows' positions in wpe, their gradient */
    float *kv[2], *dkv[2]; /* ring: (B Tl, 2 Cl) K|V travelling, dK|dV following */
    float *dkv_part;       /* ring: (B Tl, 2 Cl) a step's dK|dV before the accumulator's */
    float *blk_out, *blk_lse, *delta; /* ring: a block's (Tc, Cl), (NHl, Tc); (B, 2, NHl, Tc) */
    float *send, *recv;    /* Ulysses: all-to-all buffers (B Tl 3 Cl) */
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
/* Block l's MoE MLP: la->ln2 in, la->fcproj out (inner/model_moe.c); its
 * backward from s.dres into s.dbtc, with every router and expert gradient. */
int loco__gpt_moe_fwd(loco_gpt *m, const loco__gpt_shape *d, int l, const loco_gpt_layer_acts *la);
int loco__gpt_moe_bwd(loco_gpt *m, const loco__gpt_shape *d, int l, const loco_gpt_layer_acts *la);

/* Units (inner.h, loco_gpt_hooks): what ZeRO and the pipeline reach. */
/* Whether the model holds a unit (every unit of a whole model). */
bool loco_gpt_holds_unit(const loco_gpt *m, int unit);
int loco_gpt_num_units(const loco_gpt *m);
/* Flat-buffer range [*lo, *hi) of a unit. */
void loco_gpt_unit_range(const loco_gpt *m, int unit, size_t *lo, size_t *hi);
/* Points a unit's parameter (and, if grads != NULL, gradient) views at
 * buffers laid out like the unit's flat range. */
void loco_gpt_bind_unit(loco_gpt *m, int unit, float *params, float *grads);
void loco_gpt_set_hooks(loco_gpt *m, const loco_gpt_hooks *hooks);

/* What ZeRO (inner/parallel/zero.c) reaches of the model and optimizer. */
/* Whether tensor i of the model's table is replicated over tp (LayerNorms,
 * wpe, row-parallel biases) rather than split. */
bool loco_gpt_tensor_replicated(const loco_gpt *m, int i);
/* The values loco_gpt_init_weights draws, keeping only flat indices in
 * [lo, hi) (written to dst[0 .. hi-lo)); the RNG advances as for the whole
 * model, so every shard of a ZeRO-3 run matches a single-rank init. */
void loco_gpt_init_weights_range(const loco_gpt *m, loco_rng *rng, float *dst, size_t lo,
                                 size_t hi);
/* loco_adamw_step restricted to the flat range [lo, hi): params and grads
 * point at element lo, and opt covers exactly that range (ZeRO shards). */
void loco_adamw_step_range(loco_adamw *opt, const loco_ttable *tt, float *params,
                           const float *grads, size_t lo, size_t hi, float lr);

#endif /* LOCO_MODEL_INTERNAL_H */
