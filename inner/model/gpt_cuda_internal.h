/* Internals of the device model (model.h, "model on a GPU"), included by
 * gpt_cuda.c and the files of its dimensions only: its state, the pieces
 * of a pass the whole model and a pipeline stage share (gpt_cuda_pass.c),
 * and what gpt_cuda_tp.c (tensor and sequence parallelism), gpt_cuda_cp.c
 * (context parallelism), gpt_cuda_pp.c (pipeline stages), gpt_cuda_moe.c
 * and gpt_cuda_moe_route.c (experts) and gpt_cuda_dp.c (data
 * parallelism's accessors) give it. */
#ifndef LOCO_MODEL_GPT_CUDA_INTERNAL_H
#define LOCO_MODEL_GPT_CUDA_INTERNAL_H

#include "inner/model/internal.h"

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
    /* A pipeline stage whose schedule splits B from W (gpt_cuda_pp.c):
     * the output gradients of the block's four GEMMs, kept by B for W:
     * mlp.c_proj's and attn.c_proj's (N, C, every row), c_fc's (N, Fc),
     * c_attn's (N, W). NULL otherwise. */
    void *kmlp, *kfch, *kattn, *kqkv;
    /* An MoE block (gpt_cuda_moe.c), fp32 whatever the model's type: the
     * router's probabilities (N, E), lse (N), choices (N, k) and their
     * weights, the plan (slot (N, k), rows (N k), count and routed (E) on
     * the device, count and ep's received counts on the host: h_count (2E)),
     * the packed rows (N k, C) and, on the experts' side (ep: up to ep N k
     * rows), their c_fc output, activation and output; the shared experts'
     * (S N, Fc) and (S N, F). NULL in a dense block. */
    float *moe_probs, *moe_lse, *moe_weight, *moe_x, *moe_xo, *moe_h, *moe_hg, *moe_y;
    float *moe_sh, *moe_shg;
    int32_t *moe_expert, *moe_slot, *moe_rows, *moe_count, *moe_routed, *h_count;
} layer_acts;

/* One activation slot of a pipeline stage (gpt_cuda_pp.c): a (micro-batch,
 * chunk) in flight, from its forward to its W. la: the longest chunk's
 * blocks, by position in the chunk; the head's buffers only on the stage
 * that holds it. */
typedef struct {
    layer_acts *la;
    void *in;              /* (R, C) the chunk's input (the embeddings' output at block 0) */
    int32_t *tok;          /* (2, B, T) this micro-batch's inputs and targets (local rows) */
    void *lnf, *logits;    /* (N, C), (N, Vp): the latter dlogits after the forward */
    float *lnfm, *lnfr;    /* (R) */
    int chunk, phase;      /* the chunk it holds; 0 free, 1 after F, 2 after B */
} stage_slot;

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
    /* A pipeline stage (gpt_cuda_pp.c): the chunks held, their activation
     * slots, whether W is split from B; the units held (embeddings, head)
     * and the first block of the chunk being run (its input is the slot's
     * `in`). NULL slots: the whole model. */
    loco_gpt_stage stage;
    stage_slot *slots;
    bool split_w, has_embed, has_head;
    int pass_first, max_chunk;
    layer_acts rerun_set;          /* the set full recompute's blocks share */
    /* Mixture of experts (gpt_cuda_moe.c): the scratch of a block's
     * passes, fp32; in bf16 the MoE weights cast (w32) and the ln_2
     * output (x32) in fp32; on the host ep's staged rows and counts, and
     * the h_count arrays of the carved blocks. */
    struct loco_comm *epc;         /* the ep group; NULL when ep = 1 */
    int ep, El;                    /* ranks, experts held */
    float loss_scale;              /* of the pass: the aux and z losses' */
    float *moe_w32, *moe_x32, *moe_out, *moe_dout, *moe_dx, *moe_dy, *moe_dxe, *moe_dweight;
    float *moe_dlogits, *moe_dh, *moe_dhg, *moe_yo;
    void *moe_plan;                /* loco_cuda_moe_plan's scratch */
    float *h_moe_send, *h_moe_recv; /* pinned (ep N k, C) */
    int32_t *h_moe_arena;          /* the carved blocks' h_count */
    size_t h_moe_used, h_moe_cap;
    size_t *moe_sendc, *moe_recvc; /* (ep) floats of the all-to-all-v */
    size_t *moe_cursor;            /* (ep) the regroup's scratch */
    /* what the forwards routed since moe_reset, per block (L): micro-
     * batches, assignments, dropped, aux and z sums, routed (L, E); the
     * device's aux | z and routed (E) of a pass and their host copy */
    int *st_micro;
    int64_t *st_assign, *st_dropped, *st_routed;
    double *st_aux, *st_z, *moe_lossd, *h_lossd;
    int32_t *h_routed;
    float *moe_bias;               /* (MoE layers, E) DeepSeek's biases; NULL at rate 0 */
    bool rerunning;                /* a recomputed forward: not counted */
    int32_t *h_cp_moe;             /* cp: the plan's host arrays (gpt_cuda_moe.c, cp_plan) */
    int *h_cp_pos;                 /* cp: (T) the local rows' global positions, host */
    void *cp_glob;                 /* cp: the group's plan scratch */
    size_t cp_glob_n;
    float *pp_f32;                 /* bf16: (R, C) a chunk's input or output in fp32 */
    float *h_pp;                   /* pinned (R, C): the same on the host */
};

/* gpt_cuda_pass.c: the pieces of a pass, which the whole-model passes and
 * a pipeline stage's chunk passes (gpt_cuda_pp.c) both run. split: B only,
 * the GEMMs' output gradients kept in the block's k* buffers for W. */
size_t loco__gpt_cuda_block_bytes(const loco_gpt_cuda *g, bool mlp);
int loco__gpt_cuda_carve_block(loco_gpt_cuda *g, layer_acts *a, bool mlp);
int loco__gpt_cuda_embed_fwd(loco_gpt_cuda *g, int B, int T);
int loco__gpt_cuda_block_fwd(loco_gpt_cuda *g, int l, int B, int T);
int loco__gpt_cuda_head_fwd(loco_gpt_cuda *g, int N);
int loco__gpt_cuda_loss(loco_gpt_cuda *g, int N, float dscale, bool acc);
int loco__gpt_cuda_head_bwd(loco_gpt_cuda *g, int N, bool split);
int loco__gpt_cuda_head_bwd_weight(loco_gpt_cuda *g, int N);
int loco__gpt_cuda_block_bwd(loco_gpt_cuda *g, int l, int B, int T, bool split);
int loco__gpt_cuda_block_bwd_weight(loco_gpt_cuda *g, int l, int B, int T);
int loco__gpt_cuda_embed_bwd(loco_gpt_cuda *g, int B, int T);
void *loco__gpt_cuda_tensor(const loco_gpt_cuda *g, bool grads, const char *name);
int loco__gpt_cuda_column_input(loco_gpt_cuda *g, const void *x, int N, const void **full);
int loco__gpt_cuda_row_dout(loco_gpt_cuda *g, int N, const void **dout);
int loco__gpt_cuda_check_tokens(loco_gpt_cuda *g, const int32_t **inputs,
                                const int32_t **targets, int B, int *T);
int loco__gpt_cuda_read_mean(loco_gpt_cuda *g, float *mean_loss);
/* gpt_cuda_moe.c: an MoE block's MLP in place of the dense one (forward:
 * ln_2's output a->ln2 -> g->scratch, summed over tp as a row-parallel
 * output; backward: g->dres -> g->dbtc, this rank's rows). */
bool loco__gpt_cuda_is_moe(const loco_gpt_cuda *g, int l);
size_t loco__gpt_cuda_moe_block_bytes(const loco_gpt_cuda *g);
size_t loco__gpt_cuda_moe_bytes(const loco_gpt_cuda *g);
int loco__gpt_cuda_moe_carve_block(loco_gpt_cuda *g, layer_acts *a);
int loco__gpt_cuda_moe_carve(loco_gpt_cuda *g);
int loco__gpt_cuda_moe_check(const loco_gpt_config *cfg, const loco_gpt_cuda_opts *o);
int loco__gpt_cuda_moe_init(loco_gpt_cuda *g, const loco_gpt_cuda_opts *o, int n_sets);
void loco__gpt_cuda_moe_fini(loco_gpt_cuda *g);
int loco__gpt_cuda_moe_fwd(loco_gpt_cuda *g, int l, int B, int T);
int loco__gpt_cuda_moe_bwd(loco_gpt_cuda *g, int l, int B, int T);
int loco__gpt_cuda_moe_layers(const loco_gpt_cuda *g);
/* gpt_cuda_moe_route.c: ep's staged all-to-alls (back: from the experts'
 * ranks), the cp group's plan. */
int loco__gpt_cuda_moe_travel(loco_gpt_cuda *g, const layer_acts *a, float *dst,
                              const float *src, bool back);
int loco__gpt_cuda_moe_cp_plan(loco_gpt_cuda *g, layer_acts *a, int N, int *n, int64_t *kept);
/* gpt_cuda_pp.c: a pipeline stage's activation slots (bytes, carve; the
 * MoE block sets its slots carve). */
size_t loco__gpt_cuda_pp_bytes(const loco_gpt_cuda *g);
int loco__gpt_cuda_pp_moe_sets(const loco_gpt_cuda *g);
int loco__gpt_cuda_pp_carve(loco_gpt_cuda *g);
int loco__gpt_cuda_pp_init(loco_gpt_cuda *g, const loco_gpt_cuda_opts *o);
void loco__gpt_cuda_pp_fini(loco_gpt_cuda *g);

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

#endif /* LOCO_MODEL_GPT_CUDA_INTERNAL_H */
