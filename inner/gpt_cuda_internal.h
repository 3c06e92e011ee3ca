/* The device model's state, shared by its files: gpt_cuda.c (create, the
 * passes, the whole-model clip and AdamW) and gpt_cuda_dp.c (what data
 * parallelism reaches: units, hooks, shards, ranged updates). Compiled
 * only in a CUDA build. Not a public header. */
#ifndef LOCO_INNER_GPT_CUDA_INTERNAL_H
#define LOCO_INNER_GPT_CUDA_INTERNAL_H

#include "inner/inner.h"

#if defined(LOCO_HAVE_CUDA)
#include "kernels/kernels.h"

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
