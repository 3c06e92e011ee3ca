/* kernels/ — every loop over tensor elements of the model and optimizer.
 * The files in kernels/cpu implement these in fp32 (matmuls through OpenBLAS, the rest
 * threaded with OpenMP, deterministic for a given thread count);
 * the .cu files in kernels/cuda will export the same signatures plus a stream.
 *
 * Conventions: B batch, T time, C channels, NH heads, V vocabulary,
 * N = B*T rows. Weights use Hugging Face GPT-2 (Conv1D) layouts: a linear
 * weight is (C_in, C_out) and y = x @ w + b. Every gradient output is
 * ACCUMULATED (+=), so callers zero gradient buffers before a backward pass.
 * Pointers do not alias unless stated.
 *
 * One file: the room's one public header (STYLE.md, rooms): every kernel's
 * contract, CPU and CUDA twins, in one place. */
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

/* ---- Llama-family kernels ---- */
/* RMSNorm over the last dim: out = inp * rstd * w, rstd = 1/sqrt(mean(inp^2) + eps),
 * computed as HF's LlamaRMSNorm does in fp32. out, inp (N,C); w (C); rstd (N) saved for
 * the backward. out is overwritten. */
void loco_rmsnorm_fwd(float *out, float *rstd, const float *inp, const float *w, int N, int C,
                      float eps);
/* dinp (N,C) and dw (C) ACCUMULATE. */
void loco_rmsnorm_bwd(float *dinp, float *dw, const float *dout, const float *inp,
                      const float *w, const float *rstd, int N, int C);

/* Llama 3.1's RoPE frequency scaling (HF rope_type "llama3"); factor 0 = none. */
typedef struct {
    float factor, low_freq_factor, high_freq_factor;
    int original_max_pos;
} loco_rope_scaling;
/* RoPE tables as HF computes them in fp32: inv_freq[i] = 1 / theta^(2i/hs) for
 * i < hs/2 (then Llama-3.1-scaled when sc && sc->factor > 0, exactly as HF's
 * _compute_llama3_parameters), cos_tab[p*hs/2 + i] = cosf((float)p * inv_freq[i]),
 * sin_tab likewise, for p < max_pos. hs even. */
void loco_rope_tables(float *cos_tab, float *sin_tab, int max_pos, int hs, float theta,
                      const loco_rope_scaling *sc);
/* inv_freq[i] of the tables above (i < hs/2; sc may be NULL), in torch's fp32
 * order of operations. */
float loco_rope_inv_freq(int i, int hs, float theta, const loco_rope_scaling *sc);
/* Rotates n_heads heads of hs floats in each of B*T rows IN PLACE, HF's rotate-half
 * convention: for i < hs/2, (x[i], x[i+hs/2]) <- (x[i] c - x[i+hs/2] s, x[i+hs/2] c + x[i] s)
 * with c, s = cos_tab/sin_tab at (pos, i). Row r = b*T + t starts at x + r*ld, head h at
 * h*hs from the row start; pos = pos[t] (the global position of this rank's row t, so
 * context parallelism can pass its zig-zag positions), or t when pos is NULL. Every
 * position must be below the tables' max_pos (not checked). */
void loco_rope_fwd(float *x, int ld, int B, int T, int n_heads, int hs, const int *pos,
                   const float *cos_tab, const float *sin_tab);
/* Its backward: dx rotated in place by the opposite angle (the rotation's transpose). */
void loco_rope_bwd(float *dx, int ld, int B, int T, int n_heads, int hs, const int *pos,
                   const float *cos_tab, const float *sin_tab);

/* SwiGLU: out (N,F) = silu(gu[:, :F]) * gu[:, F:], gu (N,2F) the gate and up projections
 * side by side in each row. out overwritten. */
void loco_swiglu_fwd(float *out, const float *gu, int N, int F);
/* dgu (N,2F) ACCUMULATES the gradient through silu(gate)*up. */
void loco_swiglu_bwd(float *dgu, const float *gu, const float *dout, int N, int F);
/* ---- end of Llama-family kernels ---- */

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

/* ------------------------------------ blockwise attention (ring attention)
 * Context parallelism splits the sequence over ranks: a rank's query rows
 * meet every rank's key/value rows one block at a time, the partial results
 * merge by the log-sum-exp rule, and the backward (FlashAttention-2)
 * recomputes the probabilities from the final lse and delta. Positions are
 * global, so a block knows its part of the causal mask. Every operand is
 * one (B, T, ...) block, batch b at row b*T: a rank holding non-adjacent
 * chunks (ring attention's zig-zag layout) makes one call per chunk, with
 * B = 1 per batch where its buffer interleaves them. The results do not
 * depend on the number of threads. */

/* One block of queries against one block of keys, causal by global position:
 * query row i (position q_pos + i) sees key row j (position k_pos + j) iff
 * k_pos + j <= q_pos + i (when causal; all keys when !causal). Scale
 * 1/sqrt(C/NH). q: rows of B*Tq, row t of batch b at q + (b*Tq + t)*q_ld,
 * head h at column h*hs (hs = C/NH); k, v: rows of B*Tk with row stride
 * kv_ld (so q, k, v may point into a GPT-2 qkv (B,T,3C) buffer with ld 3C,
 * or a packed kv buffer with ld 2C). out (B,Tq,C) is OVERWRITTEN with this
 * block's normalised attention output, lse (B,NH,Tq) with the natural-log
 * log-sum-exp of each row's scaled scores; a row with no visible key gets
 * lse = -INFINITY and out = 0. */
void loco_attention_block_fwd(float *out, float *lse, const float *q, int q_ld, const float *k,
                              const float *v, int kv_ld, int B, int Tq, int Tk, int C, int NH,
                              int q_pos, int k_pos, bool causal);
/* Merges a block result into a running one: (out, lse) <- the attention
 * over the union of the keys of both, by the log-sum-exp rule; rows where
 * either lse is -INFINITY take the other. out, blk_out (B,T,C); lse,
 * blk_lse (B,NH,T). A running result may start as lse = -INFINITY. */
void loco_attention_merge(float *out, float *lse, const float *blk_out, const float *blk_lse,
                          int B, int T, int C, int NH);
/* delta (B,NH,T) = rowsum over the head of dout * out (FlashAttention-2's
 * D), overwritten; out is the final merged output. */
void loco_attention_delta(float *delta, const float *dout, const float *out, int B, int T, int C,
                          int NH);
/* Backward of one (query block, key block) pair given the FINAL merged
 * out's lse and delta: P = exp(S - lse), dV += P^T dout, dP = dout V^T,
 * dS = P * (dP - delta), dQ += scale dS K, dK += scale dS^T Q. dq (B,Tq, ld
 * dq_ld), dk, dv (B,Tk, ld dkv_ld) ACCUMULATE; dout (B,Tq,C). Same masking
 * as the forward; a fully masked block returns at once. */
void loco_attention_block_bwd(float *dq, int dq_ld, float *dk, float *dv, int dkv_ld,
                              const float *dout, const float *lse, const float *delta,
                              const float *q, int q_ld, const float *k, const float *v, int kv_ld,
                              int B, int Tq, int Tk, int C, int NH, int q_pos, int k_pos,
                              bool causal);

/* ---------------------------------------- grouped-query attention (GQA)
 * Llama-style attention: NKV key/value heads shared by NH query heads
 * (NH % NKV == 0; query head h reads kv head h / (NH/NKV); NKV == 1 is
 * multi-query). hs is the head size, scale 1/sqrt(hs). The MHA functions
 * above are these with NKV = NH, hs = C/NH (the same bits). dk and dv are
 * summed over the query heads of a group, in head order. */

/* Causal GQA self-attention. qkv (B,T,(NH+2*NKV)*hs): NH query heads, then
 * NKV key heads, then NKV value heads, each hs wide; out (B,T,NH*hs)
 * overwritten; att (B,NH,T,T) the probabilities (as loco_attention_fwd). */
void loco_attention_gqa_fwd(float *out, float *att, const float *qkv, int B, int T, int NH,
                            int NKV, int hs);
/* dqkv (B,T,(NH+2*NKV)*hs) accumulates (dk, dv summed over the query heads
 * of a group); datt scratch (B,NH,T,T), overwritten. */
void loco_attention_gqa_bwd(float *dqkv, float *datt, const float *dout, const float *qkv,
                            const float *att, int B, int T, int NH, int NKV, int hs);
/* Blockwise GQA (ring attention / context parallelism): as
 * loco_attention_block_fwd and _bwd, but q rows hold NH heads of hs (row
 * stride q_ld), k and v rows NKV heads of hs (row stride kv_ld); out
 * (B,Tq,NH*hs) overwritten, lse (B,NH,Tq); dq (ld dq_ld), dk, dv (ld
 * dkv_ld) accumulate, dk and dv over the group's query heads; dout
 * (B,Tq,NH*hs). loco_attention_merge and _delta take C = NH*hs. */
void loco_attention_block_gqa_fwd(float *out, float *lse, const float *q, int q_ld,
                                  const float *k, const float *v, int kv_ld, int B, int Tq,
                                  int Tk, int NH, int NKV, int hs, int q_pos, int k_pos,
                                  bool causal);
void loco_attention_block_gqa_bwd(float *dq, int dq_ld, float *dk, float *dv, int dkv_ld,
                                  const float *dout, const float *lse, const float *delta,
                                  const float *q, int q_ld, const float *k, const float *v,
                                  int kv_ld, int B, int Tq, int Tk, int NH, int NKV, int hs,
                                  int q_pos, int k_pos, bool causal);
/* ------------------------------------ end of grouped-query attention */

/* ------------------------------------------------- mixture of experts
 * A token goes to its top-k experts (Mixtral's router: softmax over the
 * E logits, the k largest, their probabilities renormalised to sum 1);
 * an expert takes at most `cap` of the assignments routed to it, the most
 * probable first (ties: lower token position, then earlier choice); the
 * rest are dropped and their tokens keep only the residual. Kept
 * assignments are packed expert-major, each expert's in token order. */

/* probs (N,E) = softmax of logits' rows (probs may equal logits), lse (N)
 * their log-sum-exp; expert (N,k) the k largest scores probs[e] + bias[e]
 * (descending, ties: lower index; bias (E) DeepSeek-V3's auxiliary-loss-free
 * routing bias, NULL = none: the k most probable), weight (N,k) their
 * unbiased probabilities over their sum: the bias only chooses. */
void loco_moe_route(float *probs, float *lse, int32_t *expert, float *weight, const float *logits,
                    const float *bias, int N, int E, int k);
/* Capacity and packing: slot (N,k) the packed row of each assignment or
 * -1 when dropped; rows (<= N k) the token of each packed row; count (E)
 * the rows each expert keeps; routed (E) the assignments routed to it
 * before dropping. scratch: N k x 12 bytes. Returns the packed rows. */
int loco_moe_plan(int32_t *slot, int32_t *rows, int32_t *count, int32_t *routed,
                  const int32_t *expert, const float *probs, int N, int E, int k, int cap,
                  void *scratch);
/* out (n,C): out[r] = x[rows[r]]. Its backward: dx[t] += the kept rows of
 * token t (choice order). */
void loco_moe_gather(float *out, const float *x, const int32_t *rows, int n, int C);
void loco_moe_gather_bwd(float *dx, const float *dxe, const int32_t *slot, int N, int k, int C);
/* out (N,C) = sum over token t's kept choices of weight * y[slot]
 * (overwritten; 0 when all were dropped). Backward: dy's kept rows
 * overwritten with weight * dout[t], dweight (N,k) = dout[t] . y[slot]
 * (0 when dropped). */
void loco_moe_combine(float *out, const float *y, const int32_t *slot, const float *weight, int N,
                      int k, int C);
void loco_moe_combine_bwd(float *dy, float *dweight, const float *dout, const float *y,
                          const int32_t *slot, const float *weight, int N, int k, int C);
/* Switch's load-balancing loss E sum_e f_e P_e (f_e = routed_e / (N k),
 * P_e = the mean router probability of e) and the router z-loss
 * mean_t lse_t^2, unscaled. */
void loco_moe_losses(double *aux, double *z, const float *probs, const float *lse,
                     const int32_t *routed, int N, int E, int k);
/* dlogits (N,E), overwritten: the gradient through the renormalised
 * weights (dweight) and the softmax, plus scale x (aux x the load-balancing
 * loss + z x the z-loss); f_e is constant (counts). */
void loco_moe_route_bwd(float *dlogits, const float *dweight, const float *probs, const float *lse,
                        const int32_t *expert, const float *weight, const int32_t *routed, int N,
                        int E, int k, float aux, float z, float scale);

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
/* The same over rows stride >= V apart (a vocabulary padded to stride):
 * columns V .. stride-1 are not in the softmax; their dlogits are 0. */
void loco_xent_fwd_bwd_strided(float *losses, float *dlogits, const float *logits,
                               const int32_t *targets, int N, int V, int stride, float dscale);

/* ---------------------------------------------- tensor parallelism (Megatron)
 * The pieces a tp rank computes on its slice; the model's collectives over
 * the tp group join them (inner/model/model.c). */

/* Vocabulary-parallel embedding: out (N,C) row n = wte[tok[n] - v_lo] when
 * v_lo <= tok[n] < v_lo + v_n, else zeros. wte (v_n, C) is this rank's
 * slice of the rows. out is overwritten. */
void loco_embed_fwd(float *out, const int32_t *tok, const float *wte, int v_lo, int v_n, int N,
                    int C);
/* dwte (v_n, C) += dout (N,C) rows whose token falls in [v_lo, v_lo + v_n);
 * every dwte row accumulates in ascending n (deterministic). */
void loco_embed_bwd(float *dwte, const float *dout, const int32_t *tok, int v_lo, int v_n, int N,
                    int C);
/* Rows row0 .. row0+N-1 of a (B,T) batch flattened to B*T rows:
 * out[i,:] += wpe[(row0 + i) % T, :]. out (N,C), wpe (>=T, C). */
void loco_pos_fwd(float *out, const float *wpe, int row0, int N, int T, int C);
/* dwpe[(row0 + i) % T, :] += dout[i, :], each dwpe row in ascending i. */
void loco_pos_bwd(float *dwpe, const float *dout, int row0, int N, int T, int C);
/* out (N,OC) += bias (OC) on every row: a row-parallel layer's bias, added
 * once after the reduction. */
void loco_bias_fwd(float *out, const float *bias, int N, int OC);
/* Vocabulary-parallel cross-entropy in three steps around two all-reduces
 * (MAX of rowmax, then SUM of sumexp and tlogit); logits (N, Vl) is this
 * rank's slice of the columns [v_lo, v_lo + Vl), of which the first v_valid
 * are real vocabulary (the rest padding, never in the softmax).
 * 1. rowmax (N) = max over the valid local columns (-INFINITY if none). */
void loco_xent_vp_max(float *rowmax, const float *logits, int N, int Vl, int v_valid);
/* 2. With the global rowmax: sumexp (N) = sum over valid local columns of
 *    exp(logit - rowmax); tlogit (N) = the target's logit when the target
 *    is a valid local column, else 0. */
void loco_xent_vp_sum(float *sumexp, float *tlogit, const float *logits, const float *rowmax,
                      const int32_t *targets, int v_lo, int N, int Vl, int v_valid);
/* 3. With the global sums: losses (N) = log(sumexp) + rowmax - tlogit; if
 *    dlogits is not NULL (it may equal logits) it is OVERWRITTEN with
 *    dscale * (softmax - onehot) on valid columns and 0 on padding.
 *    Rows whose target is negative: loss 0, gradient 0 (as loco_xent_fwd_bwd). */
void loco_xent_vp_finish(float *losses, float *dlogits, const float *logits, const float *rowmax,
                         const float *sumexp, const float *tlogit, const int32_t *targets,
                         int v_lo, int N, int Vl, int v_valid, float dscale);

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

/* Elements per scale block: multiples of 8 in [32, 4096]. */
#define LOCO_QUANT_BLOCK_MIN 32
#define LOCO_QUANT_BLOCK_MAX 4096

/* The element formats of the block quantizers (compress/'s codecs map
 * onto them: loco_codec_format). */
typedef enum {
    LOCO_QFMT_NONE = 0, /* fp32 as is */
    LOCO_QFMT_BF16,     /* bfloat16, round to nearest even or stochastic */
    LOCO_QFMT_INT8,     /* int8 in [-127, 127], one absmax scale per block */
    LOCO_QFMT_INT4,     /* int4 in [-7, 7], two per byte, block scale */
    LOCO_QFMT_FP8,      /* fp8 e4m3 (OCP "fn", max 448), block scale */
    LOCO_QFMT_FP4,      /* fp4 e2m1 (max 6), two per byte, block scale */
    LOCO_QFMT_COUNT
} loco_quant_format;

/* ------------------------------------------- pseudo-gradient quantizers
 * The block codecs of compress/ (compress.h says how they are used).
 * The element loops, in kernels/cpu/quant.c (a CUDA twin takes the same
 * arguments plus a stream). A payload of n elements is, per format:
 *   none  n fp32                       (planes: 4 byte planes)
 *   bf16  n bf16                       (planes: low bytes, then high bytes)
 *   int8  ceil(n/block) fp32 scales, then n int8 codes
 *   int4  scales, then ceil(n/2) bytes: element 2j low nibble, 2j+1 high
 *   fp8   scales, then n e4m3 codes
 *   fp4   scales, then ceil(n/2) bytes of e2m1 codes, packed as int4
 * little-endian, any alignment. A block's scale is absmax / qmax (qmax 127,
 * 7, 448, 6), rounded down when needed so that qmax * scale <= absmax; a
 * block whose qmax / absmax overflows is all zero with scale 0. Code q
 * decodes to value(q) * scale. */

typedef struct {
    int block;       /* elements per scale block (multiple of 8) */
    bool stochastic; /* round up with probability = the fraction */
    bool planes;     /* none/bf16: byte-plane layout */
    uint64_t key;    /* stochastic stream: element i draws hash(key, i) */
} loco_quant_args;

/* Payload bytes of n elements. */
size_t loco_quant_payload_bytes(loco_quant_format k, size_t n, int block);
/* Quantizes x[0, n) (plus ef when not NULL, which then receives what this
 * rounding lost) into payload. Returns 0, or LOCO_EINVAL when x (+ ef) holds
 * a non-finite value (nothing is recorded; the caller reports). */
int loco_quant(loco_quant_format k, uint8_t *payload, const float *x, float *ef, size_t n,
               const loco_quant_args *a);
/* dst[i] = fmaf(value_i, weight * scale_of_block(i), dst[i]) for a payload of
 * n elements (none/bf16: fmaf(value_i, weight, dst[i])). */
void loco_dequant_acc(loco_quant_format k, float *dst, const uint8_t *payload, size_t n, int block,
                      bool planes, float weight);
/* True when the payload can be decoded safely: every scale in
 * [0, FLT_MAX / qmax] (so nothing decodes to infinity or NaN), no fp8 NaN
 * code. (none/bf16 values are not checked.) */
bool loco_quant_payload_ok(loco_quant_format k, const uint8_t *payload, size_t n, int block);

/* ------------------------------------------------ top-k sparsification
 * compress/'s topk codec (kernels/cpu/topk.c; CUDA twin below). Of the n
 * values v = x (+ ef) it keeps the k largest |v| (ties: the lower index)
 * and sends their indices and a code of `bits` bits each (2, 4 or 8):
 * a sign bit (the top one) and a magnitude m decoding to (m + 1) * scale,
 * where scale = max |v| / Q, Q = 2^(bits-1), rounded down when needed so
 * that Q * scale <= max |v| (0 when Q / max |v| overflows). Payload,
 * little-endian, any alignment:
 *   u32 k, u8 bits, u8 layout (0 Elias-Fano, 1 bitmap), u16 0, f32 scale,
 *   the index section, then ceil(k * bits / 8) bytes of codes (code j at
 *   bit j * bits, least significant bit first).
 * Elias-Fano with L = the largest l where k * 2^l <= n: ceil(k * L / 8)
 * bytes of low parts (index j's low L bits at bit j * L), then the upper
 * bitmap, bit (index_j >> L) + j set, ((n - 1) >> L) + k bits. The bitmap
 * layout (bit i: element i kept, n bits) where that is no longer. Every
 * part is padded to a byte with zero bits. */
#define LOCO_TOPK_HEADER 12
/* Index section bytes; *layout (0 Elias-Fano, 1 bitmap) and *low (L) when
 * not NULL. */
size_t loco_topk_index_bytes(size_t n, size_t k, int *layout, int *low);
/* Payload bytes (0 for k outside [1, n] or bits not 2, 4, 8). */
size_t loco_topk_payload_bytes(size_t n, size_t k, int bits);
/* Largest payload of n elements, any k and bits. */
size_t loco_topk_payload_max(size_t n);
/* Encodes x[0, n) (plus ef when not NULL, which then receives v minus its
 * decoded value: v for every element not kept). 0, or LOCO_EINVAL for a
 * non-finite value or bad n, k, bits (nothing is recorded). */
int loco_topk_quant(uint8_t *payload, const float *x, float *ef, size_t n, size_t k, int bits);
/* dst[index_j] = fmaf(±(m_j + 1), weight * scale, dst[index_j]) for a
 * payload of n elements that loco_topk_payload_ok accepted. */
void loco_topk_dequant_acc(float *dst, const uint8_t *payload, size_t n, float weight);
/* True when payload[0, len) is exactly one well-formed payload of n
 * elements: k in [1, n], bits 2, 4 or 8, the layout its n and k give, len
 * its size, scale in [0, FLT_MAX / Q], k indices strictly increasing below
 * n, every padding bit zero. */
bool loco_topk_payload_ok(const uint8_t *payload, size_t len, size_t n);
/* Device workspace loco_cuda_topk_quant needs for k kept values. */
size_t loco_topk_work_bytes(size_t k);

/* The outer step's element loops (outer/outer.c; CUDA twins below). */
/* out = a - b (the pseudo-gradient θ_global - θ_local). */
void loco_sub(float *out, const float *a, const float *b, size_t n);
/* Sum of ((double)now[i] - before[i]) * scale squared (one island's share
 * of a chunk of the average, for the contribution check): parts of
 * LOCO_SHARE_PART elements, each summed in order in double, then the parts
 * in order, so the CUDA twin gives the same bits. *nonfinite: some now[i]
 * or the sum is NaN or Inf (the sum is then meaningless). */
#define LOCO_SHARE_PART 256
double loco_share_sumsq(const float *now, const float *before, size_t n, double scale,
                        bool *nonfinite);
/* The outer optimizer, element by element: Nesterov (mom_out = mu mom +
 * avg; theta_out = theta - lr (avg + mu mom_out)) or plain averaging
 * (mom_out = mom; theta_out = theta - avg); theta_local = theta_out. */
void loco_outer_update(float *theta_out, float *mom_out, float *theta_local, const float *theta,
                       const float *mom, const float *avg, size_t n, float lr, float mu,
                       bool nesterov);

/* ------------------------------------------------------------ CUDA twins
 * kernels/cuda/ (.cu files): the same kernels on an NVIDIA GPU. They exist in a
 * build where the CUDA toolkit was found (the Makefile then defines
 * LOCO_HAVE_CUDA for every C file and links cudart and cuBLASLt).
 *
 * Each twin is named loco_cuda_<kernel>, takes the CPU twin's arguments in
 * the same order, as device pointers, and a stream last. It only enqueues
 * work: it returns 0, or LOCO_ECUDA with the CUDA error's text recorded
 * (loco_errmsg) when the launch failed; errors of the kernel itself show at
 * the next synchronisation (loco_cuda_sync). Gradients accumulate (+=) as
 * on the CPU. Where the precision matters there are two twins: fp32
 * (loco_cuda_X, the CPU twin's semantics to ~1e-6) and bf16
 * (loco_cuda_X_bf16: activations, activation gradients and weight copies in
 * bf16; parameter gradients, LayerNorm statistics, losses and every
 * reduction in fp32). Differences from the CPU twin are stated below. */
#if defined(LOCO_HAVE_CUDA) || defined(__CUDACC__)

#include "kernels/device.h" /* loco_stream, loco_bf16, loco_blas */

/* dst (n) = bf16 of src rounded to nearest even: the bf16 weight copy of
 * the fp32 master weights. */
int loco_cuda_cast_bf16(loco_bf16 *dst, const float *src, size_t n, loco_stream s);
/* dst (n) = fp32 of src (exact). */
int loco_cuda_cast_f32(float *dst, const loco_bf16 *src, size_t n, loco_stream s);

/* wpe / dwpe NULL: no position table (RoPE), as the CPU twins. */
int loco_cuda_encoder_fwd(float *out, const int32_t *tok, const float *wte, const float *wpe,
                          int B, int T, int C, loco_stream s);
int loco_cuda_encoder_fwd_bf16(loco_bf16 *out, const int32_t *tok, const loco_bf16 *wte,
                               const loco_bf16 *wpe, int B, int T, int C, loco_stream s);
/* Deterministic: every dwte row accumulates in token order, as on the CPU. */
int loco_cuda_encoder_bwd(float *dwte, float *dwpe, const float *dout, const int32_t *tok,
                          int B, int T, int C, loco_stream s);
int loco_cuda_encoder_bwd_bf16(float *dwte, float *dwpe, const loco_bf16 *dout,
                               const int32_t *tok, int B, int T, int C, loco_stream s);

int loco_cuda_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp,
                            const float *w, const float *b, int N, int C, loco_stream s);
int loco_cuda_layernorm_fwd_bf16(loco_bf16 *out, float *mean, float *rstd, const loco_bf16 *inp,
                                 const loco_bf16 *w, const loco_bf16 *b, int N, int C,
                                 loco_stream s);
int loco_cuda_layernorm_bwd(float *dinp, float *dw, float *db, const float *dout,
                            const float *inp, const float *w, const float *mean,
                            const float *rstd, int N, int C, loco_stream s);
int loco_cuda_layernorm_bwd_bf16(loco_bf16 *dinp, float *dw, float *db, const loco_bf16 *dout,
                                 const loco_bf16 *inp, const loco_bf16 *w, const float *mean,
                                 const float *rstd, int N, int C, loco_stream s);

/* ---- Llama-family twins (rmsnorm.cu, rope.cu, swiglu.cu) ----
 * bf16 twins: activations and their gradients in bf16, rstd, the RoPE tables
 * and dw in fp32, all arithmetic in fp32 with one rounding per stored value;
 * the bf16 RMSNorm rounds x * rstd to bf16 before the weight multiplies it
 * (HF's `.to(input_dtype)`). dw is a column sum in double over a fixed order
 * of rows (no atomics). pos is a device pointer or NULL. LOCO_EINVAL for an
 * odd hs. */
int loco_cuda_rmsnorm_fwd(float *out, float *rstd, const float *inp, const float *w, int N,
                          int C, float eps, loco_stream s);
int loco_cuda_rmsnorm_fwd_bf16(loco_bf16 *out, float *rstd, const loco_bf16 *inp,
                               const loco_bf16 *w, int N, int C, float eps, loco_stream s);
int loco_cuda_rmsnorm_bwd(float *dinp, float *dw, const float *dout, const float *inp,
                          const float *w, const float *rstd, int N, int C, loco_stream s);
int loco_cuda_rmsnorm_bwd_bf16(loco_bf16 *dinp, float *dw, const loco_bf16 *dout,
                               const loco_bf16 *inp, const loco_bf16 *w, const float *rstd,
                               int N, int C, loco_stream s);
int loco_cuda_rope_fwd(float *x, int ld, int B, int T, int n_heads, int hs, const int *pos,
                       const float *cos_tab, const float *sin_tab, loco_stream s);
int loco_cuda_rope_fwd_bf16(loco_bf16 *x, int ld, int B, int T, int n_heads, int hs,
                            const int *pos, const float *cos_tab, const float *sin_tab,
                            loco_stream s);
int loco_cuda_rope_bwd(float *dx, int ld, int B, int T, int n_heads, int hs, const int *pos,
                       const float *cos_tab, const float *sin_tab, loco_stream s);
int loco_cuda_rope_bwd_bf16(loco_bf16 *dx, int ld, int B, int T, int n_heads, int hs,
                            const int *pos, const float *cos_tab, const float *sin_tab,
                            loco_stream s);
int loco_cuda_swiglu_fwd(float *out, const float *gu, int N, int F, loco_stream s);
int loco_cuda_swiglu_fwd_bf16(loco_bf16 *out, const loco_bf16 *gu, int N, int F,
                              loco_stream s);
int loco_cuda_swiglu_bwd(float *dgu, const float *gu, const float *dout, int N, int F,
                         loco_stream s);
int loco_cuda_swiglu_bwd_bf16(loco_bf16 *dgu, const loco_bf16 *gu, const loco_bf16 *dout, int N,
                              int F, loco_stream s);
/* ---- end of Llama-family twins ---- */

/* The matmuls take the handle first. fp32 computes in full fp32 (no TF32);
 * bf16 multiplies bf16 operands with fp32 accumulation. The bias is added
 * in cuBLASLt's epilogue. */
int loco_cuda_matmul_fwd(loco_blas *h, float *out, const float *inp, const float *w,
                         const float *bias, int N, int C, int OC, bool w_transposed,
                         loco_stream s);
int loco_cuda_matmul_fwd_bf16(loco_blas *h, loco_bf16 *out, const loco_bf16 *inp,
                              const loco_bf16 *w, const loco_bf16 *bias, int N, int C, int OC,
                              bool w_transposed, loco_stream s);
/* c_fc + GELU: out = gelu(inp @ W + bias) and pre (N,OC) = inp @ W + bias
 * (kept for the backward). bf16: both written by the GEMM's epilogue where
 * cuBLASLt offers it (OC a multiple of 8); fp32, and bf16 elsewhere: a bias
 * GEMM and a GELU kernel. */
int loco_cuda_matmul_gelu_fwd(loco_blas *h, float *out, float *pre, const float *inp,
                              const float *w, const float *bias, int N, int C, int OC,
                              loco_stream s);
int loco_cuda_matmul_gelu_fwd_bf16(loco_blas *h, loco_bf16 *out, loco_bf16 *pre,
                                   const loco_bf16 *inp, const loco_bf16 *w,
                                   const loco_bf16 *bias, int N, int C, int OC, loco_stream s);
/* As the CPU twin; the bf16 twin accumulates dw and dbias in fp32. With
 * dw, dbias comes from the dw GEMM's bias-gradient epilogue (cuBLASLt's
 * fp32 sum over the N rows, where it offers one for the shape); else
 * from a column-sum kernel (in double). */
int loco_cuda_matmul_bwd(loco_blas *h, float *dinp, float *dw, float *dbias, const float *dout,
                         const float *inp, const float *w, int N, int C, int OC,
                         bool w_transposed, loco_stream s);
int loco_cuda_matmul_bwd_bf16(loco_blas *h, loco_bf16 *dinp, float *dw, float *dbias,
                              const loco_bf16 *dout, const loco_bf16 *inp, const loco_bf16 *w,
                              int N, int C, int OC, bool w_transposed, loco_stream s);
/* The MLP projection's backward with GELU's gradient fused into the dinp
 * GEMM (cuBLASLt's DGELU epilogue, pre = the forward's pre-activation):
 * dpre (N,C) = gelu'(pre) * (dout . w) is WRITTEN (not accumulated); dw
 * and dbias as loco_cuda_matmul_bwd_bf16 (w not transposed). Returns 1,
 * nothing written, where cuBLASLt has no such epilogue for the shape (C
 * not a multiple of 8): the caller runs matmul_bwd and gelu_bwd. CPU twin:
 * loco_matmul_bwd into a zeroed dinp, then loco_gelu_bwd. bf16 only: in
 * fp32 the separate passes keep the twin's 1e-5 (cuBLASLt's own tanh). */
int loco_cuda_matmul_bwd_dgelu_bf16(loco_blas *h, loco_bf16 *dpre, float *dw, float *dbias,
                                    const loco_bf16 *dout, const loco_bf16 *inp,
                                    const loco_bf16 *w, const loco_bf16 *pre, int N, int C,
                                    int OC, loco_stream s);

/* Fused causal attention (flash-attention style): never stores the T x T
 * matrix. Instead of att it saves lse (B,NH,T), the log-sum-exp of each
 * query row's scaled scores, and the backward recomputes the probabilities
 * from it. Head size C/NH at most 128. The backward needs out and
 * its gradient dout; it is deterministic (no atomics). */
int loco_cuda_attention_fwd(float *out, float *lse, const float *qkv, int B, int T, int C,
                            int NH, loco_stream s);
int loco_cuda_attention_fwd_bf16(loco_bf16 *out, float *lse, const loco_bf16 *qkv, int B, int T,
                                 int C, int NH, loco_stream s);
/* dqkv (B,T,3C) accumulates; scratch (B,NH,T) floats, overwritten. */
int loco_cuda_attention_bwd(float *dqkv, float *scratch, const float *dout, const float *out,
                            const float *qkv, const float *lse, int B, int T, int C, int NH,
                            loco_stream s);
int loco_cuda_attention_bwd_bf16(loco_bf16 *dqkv, float *scratch, const loco_bf16 *dout,
                                 const loco_bf16 *out, const loco_bf16 *qkv, const float *lse,
                                 int B, int T, int C, int NH, loco_stream s);

/* The same attention on the tensor cores (attention_tc.cu): FlashAttention-2
 * with bf16 mma.sync (sm_80+), fp32 accumulation, P rounded to bf16 before
 * PV; same tensors as the bf16 twin above (its lse and scratch are
 * interchangeable with these). Head size 64 only: LOCO_ENOTSUP otherwise
 * (the caller falls back to the reference above). Deterministic: dK, dV
 * in one pass over the key blocks, dQ in a second one, no atomics. */
int loco_cuda_attention_tc_fwd_bf16(loco_bf16 *out, float *lse, const loco_bf16 *qkv, int B,
                                    int T, int C, int NH, loco_stream s);
int loco_cuda_attention_tc_bwd_bf16(loco_bf16 *dqkv, float *scratch, const loco_bf16 *dout,
                                    const loco_bf16 *out, const loco_bf16 *qkv, const float *lse,
                                    int B, int T, int C, int NH, loco_stream s);
typedef enum { LOCO_ATTN_REFERENCE = 0, LOCO_ATTN_TENSOR = 1 } loco_attn_impl;
/* Which attention the device model runs, from want = "auto" | "tensor" |
 * "reference" (train.attention): tensor where the model is bf16, the head
 * size 64 and the device's compute capability at least 8.0; else the
 * reference, with a loco_warn saying why (for auto and tensor alike).
 * LOCO_EINVAL for another word. */
int loco_cuda_attention_select(const char *want, int head_size, bool bf16, loco_attn_impl *out);

/* Blockwise attention (ring attention), fp32, as the CPU twins above; head
 * size at most 128 (LOCO_EINVAL beyond). The backward runs one kernel for
 * dq (per query row) and one for dk, dv (per key row): no atomics. */
int loco_cuda_attention_block_fwd(float *out, float *lse, const float *q, int q_ld,
                                  const float *k, const float *v, int kv_ld, int B, int Tq,
                                  int Tk, int C, int NH, int q_pos, int k_pos, bool causal,
                                  loco_stream s);
int loco_cuda_attention_merge(float *out, float *lse, const float *blk_out, const float *blk_lse,
                              int B, int T, int C, int NH, loco_stream s);
int loco_cuda_attention_delta(float *delta, const float *dout, const float *out, int B, int T,
                              int C, int NH, loco_stream s);
int loco_cuda_attention_block_bwd(float *dq, int dq_ld, float *dk, float *dv, int dkv_ld,
                                  const float *dout, const float *lse, const float *delta,
                                  const float *q, int q_ld, const float *k, const float *v,
                                  int kv_ld, int B, int Tq, int Tk, int C, int NH, int q_pos,
                                  int k_pos, bool causal, loco_stream s);

/* ----------------------------- grouped-query attention (GQA) on the device
 * The twins of loco_attention_gqa_* and loco_attention_block_gqa_* above
 * (NKV kv heads shared by NH query heads, head size hs), with the lse and
 * scratch of the MHA functions above, which are these with NKV = NH, hs =
 * C/NH. The scratch is (B,NH,T) floats with GQA too: each dk, dv row is
 * summed over its group's query heads in registers by the one CUDA block
 * that owns its kv head (no atomics, no per-query-head partials), so the
 * backward stays deterministic. Head size 1..128 (LOCO_EINVAL beyond or
 * where NH % NKV != 0); the tensor-core pair head size 64 only
 * (LOCO_ENOTSUP otherwise). */
int loco_cuda_attention_gqa_fwd(float *out, float *lse, const float *qkv, int B, int T, int NH,
                                int NKV, int hs, loco_stream s);
int loco_cuda_attention_gqa_fwd_bf16(loco_bf16 *out, float *lse, const loco_bf16 *qkv, int B,
                                     int T, int NH, int NKV, int hs, loco_stream s);
/* dqkv (B,T,(NH+2*NKV)*hs) accumulates; scratch (B,NH,T) floats, overwritten. */
int loco_cuda_attention_gqa_bwd(float *dqkv, float *scratch, const float *dout, const float *out,
                                const float *qkv, const float *lse, int B, int T, int NH,
                                int NKV, int hs, loco_stream s);
int loco_cuda_attention_gqa_bwd_bf16(loco_bf16 *dqkv, float *scratch, const loco_bf16 *dout,
                                     const loco_bf16 *out, const loco_bf16 *qkv,
                                     const float *lse, int B, int T, int NH, int NKV, int hs,
                                     loco_stream s);
int loco_cuda_attention_tc_gqa_fwd_bf16(loco_bf16 *out, float *lse, const loco_bf16 *qkv, int B,
                                        int T, int NH, int NKV, int hs, loco_stream s);
int loco_cuda_attention_tc_gqa_bwd_bf16(loco_bf16 *dqkv, float *scratch, const loco_bf16 *dout,
                                        const loco_bf16 *out, const loco_bf16 *qkv,
                                        const float *lse, int B, int T, int NH, int NKV, int hs,
                                        loco_stream s);
int loco_cuda_attention_block_gqa_fwd(float *out, float *lse, const float *q, int q_ld,
                                      const float *k, const float *v, int kv_ld, int B, int Tq,
                                      int Tk, int NH, int NKV, int hs, int q_pos, int k_pos,
                                      bool causal, loco_stream s);
int loco_cuda_attention_block_gqa_bwd(float *dq, int dq_ld, float *dk, float *dv, int dkv_ld,
                                      const float *dout, const float *lse, const float *delta,
                                      const float *q, int q_ld, const float *k, const float *v,
                                      int kv_ld, int B, int Tq, int Tk, int NH, int NKV, int hs,
                                      int q_pos, int k_pos, bool causal, loco_stream s);
/* ------------------------------------ end of grouped-query attention */

int loco_cuda_gelu_fwd(float *out, const float *inp, size_t n, loco_stream s);
int loco_cuda_gelu_fwd_bf16(loco_bf16 *out, const loco_bf16 *inp, size_t n, loco_stream s);
int loco_cuda_gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n,
                       loco_stream s);
int loco_cuda_gelu_bwd_bf16(loco_bf16 *dinp, const loco_bf16 *inp, const loco_bf16 *dout,
                            size_t n, loco_stream s);

int loco_cuda_residual_fwd(float *out, const float *a, const float *b, size_t n, loco_stream s);
int loco_cuda_residual_fwd_bf16(loco_bf16 *out, const loco_bf16 *a, const loco_bf16 *b, size_t n,
                                loco_stream s);
int loco_cuda_residual_bwd(float *da, float *db, const float *dout, size_t n, loco_stream s);
int loco_cuda_residual_bwd_bf16(loco_bf16 *da, loco_bf16 *db, const loco_bf16 *dout, size_t n,
                                loco_stream s);

/* Twins of loco_xent_fwd_bwd_strided (rows stride >= V apart; LOCO_EINVAL
 * otherwise). One block per row; the bf16 twin reads bf16 logits and
 * writes bf16 dlogits (in place allowed), losses in fp32. */
int loco_cuda_xent_fwd_bwd(float *losses, float *dlogits, const float *logits,
                           const int32_t *targets, int N, int V, int stride, float dscale,
                           loco_stream s);
int loco_cuda_xent_fwd_bwd_bf16(float *losses, loco_bf16 *dlogits, const loco_bf16 *logits,
                                const int32_t *targets, int N, int V, int stride, float dscale,
                                loco_stream s);

/* Tensor-parallel pieces (fp32), as their CPU twins above; the backward
 * twins are deterministic (no atomics), accumulating in the CPU's order. */
int loco_cuda_embed_fwd(float *out, const int32_t *tok, const float *wte, int v_lo, int v_n, int N,
                        int C, loco_stream s);
int loco_cuda_embed_bwd(float *dwte, const float *dout, const int32_t *tok, int v_lo, int v_n,
                        int N, int C, loco_stream s);
int loco_cuda_pos_fwd(float *out, const float *wpe, int row0, int N, int T, int C, loco_stream s);
int loco_cuda_pos_bwd(float *dwpe, const float *dout, int row0, int N, int T, int C,
                      loco_stream s);
int loco_cuda_bias_fwd(float *out, const float *bias, int N, int OC, loco_stream s);
int loco_cuda_xent_vp_max(float *rowmax, const float *logits, int N, int Vl, int v_valid,
                          loco_stream s);
int loco_cuda_xent_vp_sum(float *sumexp, float *tlogit, const float *logits, const float *rowmax,
                          const int32_t *targets, int v_lo, int N, int Vl, int v_valid,
                          loco_stream s);
int loco_cuda_xent_vp_finish(float *losses, float *dlogits, const float *logits,
                             const float *rowmax, const float *sumexp, const float *tlogit,
                             const int32_t *targets, int v_lo, int N, int Vl, int v_valid,
                             float dscale, loco_stream s);
/* bf16 twins of the above: activations, weights and logits bf16 (loaded to
 * fp32, computed in fp32, rounded once where stored), the weights'
 * gradients and the cross-entropy's row sums fp32. */
int loco_cuda_embed_fwd_bf16(loco_bf16 *out, const int32_t *tok, const loco_bf16 *wte, int v_lo,
                             int v_n, int N, int C, loco_stream s);
int loco_cuda_embed_bwd_bf16(float *dwte, const loco_bf16 *dout, const int32_t *tok, int v_lo,
                             int v_n, int N, int C, loco_stream s);
int loco_cuda_pos_fwd_bf16(loco_bf16 *out, const loco_bf16 *wpe, int row0, int N, int T, int C,
                           loco_stream s);
int loco_cuda_pos_bwd_bf16(float *dwpe, const loco_bf16 *dout, int row0, int N, int T, int C,
                           loco_stream s);
int loco_cuda_bias_fwd_bf16(loco_bf16 *out, const loco_bf16 *bias, int N, int OC, loco_stream s);
int loco_cuda_xent_vp_max_bf16(float *rowmax, const loco_bf16 *logits, int N, int Vl, int v_valid,
                               loco_stream s);
int loco_cuda_xent_vp_sum_bf16(float *sumexp, float *tlogit, const loco_bf16 *logits,
                               const float *rowmax, const int32_t *targets, int v_lo, int N,
                               int Vl, int v_valid, loco_stream s);
int loco_cuda_xent_vp_finish_bf16(float *losses, loco_bf16 *dlogits, const loco_bf16 *logits,
                                  const float *rowmax, const float *sumexp, const float *tlogit,
                                  const int32_t *targets, int v_lo, int N, int Vl, int v_valid,
                                  float dscale, loco_stream s);

/* Mixture of experts (fp32), as the CPU twins above, deterministic (no
 * atomics). LOCO_EINVAL unless 1 <= k <= E (route, plan, losses, route_bwd)
 * and cap >= 0 (plan). The integers (expert, slot, rows, count, routed) are
 * the CPU's exactly for the same inputs. plan returns 0, not the packed
 * rows: they are the sum of count, and scratch's first int32 receives them
 * (device memory, LOCO_CUDA_MOE_PLAN_SCRATCH bytes, overwritten).
 * losses writes aux and z to device doubles (one block, a fixed order of
 * summation: not the CPU's bits). */
#define LOCO_CUDA_MOE_PLAN_SCRATCH(N, E, k) \
    ((size_t)4 * (3 * (size_t)(N) * (size_t)(k) + 2 * (size_t)(E) + 3))
int loco_cuda_moe_route(float *probs, float *lse, int32_t *expert, float *weight,
                        const float *logits, const float *bias, int N, int E, int k,
                        loco_stream s);
int loco_cuda_moe_plan(int32_t *slot, int32_t *rows, int32_t *count, int32_t *routed,
                       const int32_t *expert, const float *probs, int N, int E, int k, int cap,
                       void *scratch, loco_stream s);
int loco_cuda_moe_gather(float *out, const float *x, const int32_t *rows, int n, int C,
                         loco_stream s);
int loco_cuda_moe_gather_bwd(float *dx, const float *dxe, const int32_t *slot, int N, int k, int C,
                             loco_stream s);
int loco_cuda_moe_combine(float *out, const float *y, const int32_t *slot, const float *weight,
                          int N, int k, int C, loco_stream s);
int loco_cuda_moe_combine_bwd(float *dy, float *dweight, const float *dout, const float *y,
                              const int32_t *slot, const float *weight, int N, int k, int C,
                              loco_stream s);
int loco_cuda_moe_losses(double *aux, double *z, const float *probs, const float *lse,
                         const int32_t *routed, int N, int E, int k, loco_stream s);
int loco_cuda_moe_route_bwd(float *dlogits, const float *dweight, const float *probs,
                            const float *lse, const int32_t *expert, const float *weight,
                            const int32_t *routed, int N, int E, int k, float aux, float z,
                            float scale, loco_stream s);

/* fp32 master weights and state; the bf16 weight copy is made afterwards
 * with loco_cuda_cast_bf16. */
int loco_cuda_adamw_update(float *p, const float *g, float *m, float *v, size_t n, float lr,
                           float beta1, float beta2, float eps, float wd, int64_t t,
                           loco_stream s);

/* Sum of squares in double, deterministic: x is cut into the same fixed
 * parts as on the CPU, each summed by one block, then the parts in order.
 * out is LOCO_CUDA_SUMSQ_OUT device doubles: out[0] receives the sum (the
 * CPU twin returns it), out[1..] the parts. */
#define LOCO_CUDA_SUMSQ_OUT 257
int loco_cuda_sumsq(double *out, const float *x, size_t n, loco_stream s);
int loco_cuda_scale(float *x, float sc, size_t n, loco_stream s);
/* Step pieces that keep the host out of a training step: clip_scale
 * multiplies x (n) by max_norm / norm when max_norm > 0 and the finite
 * norm = sqrt(sumsq[0]) (a device double) exceeds it, as
 * loco_clip_grad_norm;
 * adamw_update_gated is loco_cuda_adamw_update skipped when the device
 * double *gate is not finite; mean_acc writes the mean of x (n, one block,
 * a double sum, fixed order) to the device float *mean and, when acc is
 * not NULL, adds it to the device double *acc. */
int loco_cuda_clip_scale(float *x, size_t n, const double *sumsq, double max_norm,
                         loco_stream s);
int loco_cuda_adamw_update_gated(float *p, const float *g, float *m, float *v, size_t n, float lr,
                                 float beta1, float beta2, float eps, float wd, int64_t t,
                                 const double *gate, loco_stream s);
int loco_cuda_mean_acc(float *mean, double *acc, const float *x, int n, loco_stream s);
/* dst (n) += src (n), then src = 0. */
int loco_cuda_add_clear(float *dst, float *src, size_t n, loco_stream s);

/* CUDA twins (kernels/cuda/quant.cu, in a build with the CUDA toolkit):
 * device pointers, the CPU twin's arguments and a stream last; the same
 * payload bytes and error-feedback values as loco_quant / loco_dequant_acc
 * for the same input. They only enqueue work. A non-finite input cannot be
 * returned without waiting, so loco_cuda_quant clears the device word
 * *nonfinite (when not NULL) and sets it to 1 when x (+ ef) holds a
 * non-finite value (payload and EF are then unspecified, as on the CPU).
 * 0, or LOCO_EINVAL for a bad format or block, LOCO_ECUDA when the launch
 * failed. */
int loco_cuda_quant(loco_quant_format k, uint8_t *payload, const float *x, float *ef, size_t n,
                    const loco_quant_args *a, uint32_t *nonfinite, loco_stream s);
int loco_cuda_dequant_acc(loco_quant_format k, float *dst, const uint8_t *payload, size_t n,
                          int block, bool planes, float weight, loco_stream s);
/* The top-k twins (kernels/cuda/topk.cu): loco_topk_quant's bytes and EF
 * with a device workspace `work` of loco_topk_work_bytes(k) bytes, and
 * *nonfinite (when not NULL) cleared, then set to 1 for a non-finite
 * input; the dequantize-accumulate of a payload the host checked
 * (loco_topk_payload_ok). LOCO_EINVAL for bad n, k, bits. */
int loco_cuda_topk_quant(uint8_t *payload, const float *x, float *ef, size_t n, size_t k, int bits,
                         void *work, uint32_t *nonfinite, loco_stream s);
int loco_cuda_topk_dequant_acc(float *dst, const uint8_t *payload, size_t n, float weight,
                               loco_stream s);
/* The outer step's loops (kernels/cuda/quant.cu): the CPU twins' bits.
 * loco_cuda_share_sumsq writes the sum to out[0] (out: 1 +
 * ceil(n / LOCO_SHARE_PART) device doubles, the parts after it) and sets
 * the device word *nonfinite to 0 or 1. */
int loco_cuda_sub(float *out, const float *a, const float *b, size_t n, loco_stream s);
int loco_cuda_share_sumsq(double *out, const float *now, const float *before, size_t n,
                          double scale, uint32_t *nonfinite, loco_stream s);
int loco_cuda_outer_update(float *theta_out, float *mom_out, float *theta_local,
                           const float *theta, const float *mom, const float *avg, size_t n,
                           float lr, float mu, bool nesterov, loco_stream s);

#endif /* LOCO_HAVE_CUDA || __CUDACC__ */

#endif /* LOCO_KERNELS_H */
