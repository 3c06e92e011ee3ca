/* kernels/ — every loop over tensor elements of the model and optimizer.
 * The files in kernels/cpu implement these in fp32 (matmuls through OpenBLAS, the rest
 * threaded with OpenMP, deterministic for a given thread count);
 * the .cu files in kernels/cuda will export the same signatures plus a stream.
 *
 * Conventions: B batch, T time, C channels, NH heads, V vocabulary,
 * N = B*T rows. Weights use Hugging Face GPT-2 (Conv1D) layouts: a linear
 * weight is (C_in, C_out) and y = x @ w + b. Every gradient output is
 * ACCUMULATED (+=), so callers zero gradient buffers before a backward pass.
 * Pointers do not alias unless stated. */
#ifndef LOCO_KERNELS_H
#define LOCO_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

/* out[b,t,:] = wte[tok[b,t],:] + wpe[t,:]
 * out (B,T,C), tok (B,T) values in [0,V), wte (V,C), wpe (>=T,C) */
void loco_encoder_fwd(float *out, const int32_t *tok, const float *wte,
                      const float *wpe, int B, int T, int C);
/* dwte (V,C) += scatter of dout by token; dwpe (>=T,C) += sum over b. */
void loco_encoder_bwd(float *dwte, float *dwpe, const float *dout,
                      const int32_t *tok, int B, int T, int C);

/* LayerNorm over the last dim, eps 1e-5. out, inp (N,C); w, b (C);
 * mean, rstd (N) saved for backward. */
void loco_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp,
                        const float *w, const float *b, int N, int C);
/* dinp (N,C), dw (C), db (C) accumulate. */
void loco_layernorm_bwd(float *dinp, float *dw, float *db, const float *dout,
                        const float *inp, const float *w, const float *mean,
                        const float *rstd, int N, int C);

/* out (N,OC) = inp (N,C) @ W + bias, where W is w (C,OC), or, when
 * w_transposed, w is stored (OC,C) and W = w^T (the tied LM head uses wte).
 * bias (OC) may be NULL. out is overwritten. */
void loco_matmul_fwd(float *out, const float *inp, const float *w,
                     const float *bias, int N, int C, int OC, bool w_transposed);
/* dinp (N,C), dw (same layout as w), dbias (OC) accumulate; any may be NULL
 * to skip it. */
void loco_matmul_bwd(float *dinp, float *dw, float *dbias, const float *dout,
                     const float *inp, const float *w, int N, int C, int OC,
                     bool w_transposed);

/* Causal multi-head self-attention, scale 1/sqrt(C/NH).
 * qkv (B,T,3C) holds q, k, v side by side (as GPT-2's c_attn emits them),
 * out (B,T,C) is overwritten, att (B,NH,T,T) receives the softmax
 * probabilities (entries above the diagonal are 0). */
void loco_attention_fwd(float *out, float *att, const float *qkv, int B, int T,
                        int C, int NH);
/* dqkv (B,T,3C) accumulates. datt is scratch (B,NH,T,T), overwritten. */
void loco_attention_bwd(float *dqkv, float *datt, const float *dout,
                        const float *qkv, const float *att, int B, int T, int C,
                        int NH);

/* GELU, tanh approximation (GPT-2's "gelu_new"). */
void loco_gelu_fwd(float *out, const float *inp, size_t n);
/* dinp += dout * gelu'(inp) */
void loco_gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n);

/* out = a + b (out may alias a or b). */
void loco_residual_fwd(float *out, const float *a, const float *b, size_t n);
/* da += dout; db += dout */
void loco_residual_bwd(float *da, float *db, const float *dout, size_t n);

/* Fused softmax + cross-entropy over logits (N,V) with targets (N).
 * losses (N) receives -log p[target]. If dlogits is not NULL it is
 * OVERWRITTEN with dscale * (softmax - onehot); dlogits may equal logits (in
 * place, so full-vocabulary probabilities are never stored separately).
 * Rows whose target is negative are ignored (loss 0, gradient 0). */
void loco_xent_fwd_bwd(float *losses, float *dlogits, const float *logits,
                       const int32_t *targets, int N, int V, float dscale);

/* One AdamW update of n parameters at step t (1-based, for bias
 * correction): m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 * p -= lr * (mhat / (sqrt(vhat) + eps) + wd * p). */
void loco_adamw_update(float *p, const float *g, float *m, float *v, size_t n,
                       float lr, float beta1, float beta2, float eps, float wd,
                       int64_t t);

/* Sum of squares in double, deterministic for a given thread count. */
double loco_sumsq(const float *x, size_t n);
/* x *= s */
void loco_scale(float *x, float s, size_t n);

#endif /* LOCO_KERNELS_H */
