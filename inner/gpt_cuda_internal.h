/* The device model's state, shared by its files: gpt_cuda.c (create, the
 * passes, the whole-model clip and AdamW) and gpt_cuda_dp.c (what data
 * parallelism reaches: units, hooks, shards, ranged updates). Compiled
 * only in a CUDA build. Not a public header. */
#ifndef LOCO_INNER_GPT_CUDA_INTERNAL_H
#define LOCO_INNER_GPT_CUDA_INTERNAL_H

#include "inner/inner.h"

#if defined(LOCO_HAVE_CUDA)
#include "kernels/kernels.h"

/* ------------------------------------------- what data parallelism reaches */

/* ZeRO-3: a model whose fp32 state (params, grads, m, v and the weights in
 * the passes' type) holds the flat range [lo, hi) only; the weights and
 * gradients of each unit a pass uses are bound from the hooks
 * (loco_gpt_cuda_bind_unit). The whole-model clip and AdamW are refused:
 * the ranged calls take [lo, hi). */
int loco_gpt_cuda_create_sharded(loco_gpt_cuda **out, const loco_gpt_config *cfg, int B, int T,
                                 bool bf16, size_t lo, size_t hi);
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
/* ------------------------------------------------------------- the state */

enum { VOCAB_ALIGN = 64 };

/* Activations of one block, kept for the backward; element type of the
 * model (bf16 or fp32) unless float. Strided by the capacity B x T. */
typedef struct {
    void *ln1, *qkv, *atty, *res2, *ln2, *fch, *fchg, *res3; /* (N,C) .. (N,4C) */
    float *ln1m, *ln1r, *ln2m, *ln2r;                        /* (N) */
    float *lse;                                              /* (B,NH,T) */
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
    int Vp;     /* the head's padded vocabulary */
    size_t wte_off; /* flat offset of wte (V rows) */
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
    void *dres, *dbtc, *dfchg, *dfch, *dqkv; /* (N,C) (N,C) (N,4C) (N,4C) (N,3C) */
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
    bool head_stale;               /* sharded: wte_pad is behind unit 0's weights */
    uint64_t wversion;             /* bumped whenever the weights are refreshed */
    loco_gpt_cuda_hooks hooks;
};

#define TWIN(k, ...)                                                                              \
    (g->bf16 ? loco_cuda_##k##_bf16(__VA_ARGS__) : loco_cuda_##k(__VA_ARGS__))
/* The attention's fwd or bwd: the tensor-core kernel (bf16 only) or the twin. */
#define ATTN(k, ...)                                                                              \
    (g->attn == LOCO_ATTN_TENSOR ? loco_cuda_attention_tc_##k##_bf16(__VA_ARGS__)                 \
                                 : TWIN(attention_##k, __VA_ARGS__))

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
#endif
