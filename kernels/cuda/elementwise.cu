/* Element-wise kernels and whole-buffer reductions: casts, token and
 * position embedding, GELU, residual, AdamW, sum of squares, scaling. */
#include <math.h>

#include "kernels/cuda/common.cuh"

enum { EW_THREADS = 256, SUMSQ_PARTS = LOCO_CUDA_SUMSQ_OUT - 1, ENC_BUCKETS = 64 };

#define GRID_STRIDE(i, n)                                                                    \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                  \
         i += (size_t)gridDim.x * blockDim.x)

/* ------------------------------------------------------------------ casts */

__global__ void cast_bf16_kernel(__nv_bfloat16 *dst, const float *src, size_t n) {
    GRID_STRIDE(i, n) dst[i] = __float2bfloat16_rn(src[i]);
}

__global__ void cast_f32_kernel(float *dst, const __nv_bfloat16 *src, size_t n) {
    GRID_STRIDE(i, n) dst[i] = __bfloat162float(src[i]);
}

extern "C" int loco_cuda_cast_bf16(loco_bf16 *dst, const float *src, size_t n, loco_stream s) {
    if (!n)
        return 0;
    cast_bf16_kernel<<<grid_for(n, EW_THREADS), EW_THREADS, 0, s>>>(bf(dst), src, n);
    CUDA_LAUNCHED("cast_bf16");
    return 0;
}

extern "C" int loco_cuda_cast_f32(float *dst, const loco_bf16 *src, size_t n, loco_stream s) {
    if (!n)
        return 0;
    cast_f32_kernel<<<grid_for(n, EW_THREADS), EW_THREADS, 0, s>>>(dst, bf(src), n);
    CUDA_LAUNCHED("cast_f32");
    return 0;
}

/* ---------------------------------------------------------------- encoder */

template <typename T>
__global__ void encoder_fwd_kernel(T *out, const int32_t *tok, const T *wte, const T *wpe, int T_,
                                   int C, size_t n) {
    GRID_STRIDE(i, n) {
        const size_t bt = i / C;
        const int c = (int)(i % C), t = (int)(bt % T_);
        st(out + i, wpe ? ld(wte + (size_t)tok[bt] * C + c) + ld(wpe + (size_t)t * C + c)
                        : ld(wte + (size_t)tok[bt] * C + c));
    }
}

/* dwpe[t, c] += sum over b in b order: one thread per (t, c). */
template <typename T>
__global__ void encoder_bwd_wpe_kernel(float *dwpe, const T *dout, int B, int T_, int C) {
    const size_t n = (size_t)T_ * C;
    GRID_STRIDE(i, n) {
        float acc = dwpe[i];
        for (int b = 0; b < B; b++)
            acc += ld(dout + (size_t)b * T_ * C + i);
        dwpe[i] = acc;
    }
}

/* dwte rows scattered by token. Thread (c, k) owns channel c of the rows
 * whose token is k modulo ENC_BUCKETS and walks every token in order, so
 * each row accumulates in token order, as on the CPU (the same bits in
 * fp32), with no atomics; a warp is 32 channels of one bucket. */
template <typename T>
__global__ void encoder_bwd_wte_kernel(float *dwte, const T *dout, const int32_t *tok, long N,
                                       int C) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    const int k = blockIdx.y * blockDim.y + threadIdx.y;
    if (c >= C)
        return;
    for (long bt = 0; bt < N; bt++) {
        const int32_t t = tok[bt];
        if (t % ENC_BUCKETS == k)
            dwte[(size_t)t * C + c] += ld(dout + (size_t)bt * C + c);
    }
}

template <typename T>
static int encoder_fwd(T *out, const int32_t *tok, const T *wte, const T *wpe, int B, int T_,
                       int C, loco_stream s) {
    const size_t n = (size_t)B * T_ * C;
    if (!n)
        return 0;
    encoder_fwd_kernel<T><<<grid_for(n, EW_THREADS), EW_THREADS, 0, s>>>(out, tok, wte, wpe, T_,
                                                                         C, n);
    CUDA_LAUNCHED("encoder_fwd");
    return 0;
}

template <typename T>
static int encoder_bwd(float *dwte, float *dwpe, const T *dout, const int32_t *tok, int B, int T_,
                       int C, loco_stream s) {
    if ((size_t)B * T_ * C == 0)
        return 0;
    const size_t n = (size_t)T_ * C;
    if (dwpe) { /* NULL: no position table (RoPE) */
        encoder_bwd_wpe_kernel<T><<<grid_for(n, EW_THREADS), EW_THREADS, 0, s>>>(dwpe, dout, B,
                                                                                 T_, C);
        CUDA_LAUNCHED("encoder_bwd (wpe)");
    }
    const dim3 th(32, 8), grid((C + 31) / 32, ENC_BUCKETS / 8);
    encoder_bwd_wte_kernel<T><<<grid, th, 0, s>>>(dwte, dout, tok, (long)B * T_, C);
    CUDA_LAUNCHED("encoder_bwd (wte)");
    return 0;
}

extern "C" int loco_cuda_encoder_fwd(float *out, const int32_t *tok, const float *wte,
                                     const float *wpe, int B, int T, int C, loco_stream s) {
    return encoder_fwd<float>(out, tok, wte, wpe, B, T, C, s);
}

extern "C" int loco_cuda_encoder_fwd_bf16(loco_bf16 *out, const int32_t *tok,
                                          const loco_bf16 *wte, const loco_bf16 *wpe, int B,
                                          int T, int C, loco_stream s) {
    return encoder_fwd<__nv_bfloat16>(bf(out), tok, bf(wte), bf(wpe), B, T, C, s);
}

extern "C" int loco_cuda_encoder_bwd(float *dwte, float *dwpe, const float *dout,
                                     const int32_t *tok, int B, int T, int C, loco_stream s) {
    return encoder_bwd<float>(dwte, dwpe, dout, tok, B, T, C, s);
}

extern "C" int loco_cuda_encoder_bwd_bf16(float *dwte, float *dwpe, const loco_bf16 *dout,
                                          const int32_t *tok, int B, int T, int C,
                                          loco_stream s) {
    return encoder_bwd<__nv_bfloat16>(dwte, dwpe, bf(dout), tok, B, T, C, s);
}

/* ------------------------------------------------------------------- GELU */

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_A 0.044715f

template <typename T> __global__ void gelu_fwd_kernel(T *out, const T *inp, size_t n) {
    GRID_STRIDE(i, n) {
        const float x = ld(inp + i);
        const float u = GELU_K * (x + GELU_A * x * x * x);
        st(out + i, 0.5f * x * (1.0f + tanhf(u)));
    }
}

template <typename T>
__global__ void gelu_bwd_kernel(T *dinp, const T *inp, const T *dout, size_t n) {
    GRID_STRIDE(i, n) {
        const float x = ld(inp + i);
        const float u = GELU_K * (x + GELU_A * x * x * x);
        const float th = tanhf(u);
        const float du = GELU_K * (1.0f + 3.0f * GELU_A * x * x);
        const float g = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
        st(dinp + i, ld(dinp + i) + ld(dout + i) * g);
    }
}

extern "C" int loco_cuda_gelu_fwd(float *out, const float *inp, size_t n, loco_stream s) {
    if (!n)
        return 0;
    gelu_fwd_kernel<float><<<grid_for(n, EW_THREADS), EW_THREADS, 0, s>>>(out, inp, n);
    CUDA_LAUNCHED("gelu_fwd");
    return 0;
}

extern "C" int loco_cuda_gelu_fwd_bf16(loco_bf16 *out, const loco_bf16 *inp, size_t n,
                                       loco_stream s) {
    if (!n)
        return 0;
    gelu_fwd_kernel<__nv_bfloat16><<<grid_for(n, EW_THREADS), EW_THREADS, 0, s>>>(bf(out),
                                                                                  bf(inp), n);
    CUDA_LAUNCHED("gelu_fwd_bf16");
    return 0;
}

extern "C" int loco_cuda_gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n,
                                  loco_stream s) {
    if (!n)
        return 0;
    gelu_bwd_kernel<float><<<grid_for(n, EW_THREADS), EW_THREADS, 0, s>>>(dinp, inp, dout, n);
    CUDA_LAUNCHED("gelu_bwd");
    return 0;
}

extern "C" int loco_cuda_gelu_bwd_bf16(loco_bf16 *dinp, const loco_bf16 *inp,
                                       const loco_bf16 *dout, size_t n, loco_stream s) {
    if (!n)
        return 0;
    gelu_bwd_kernel<__nv_bfloat16>
        <<<grid_for(n, EW_THREADS), EW_THREADS, 0, s>>>(bf(dinp), bf(inp), bf(dout), n);
    CUDA_LAUNCHED("gelu_bwd_bf16");
    return 0;
}

/* --------------------------------------------------------------- residual */

/* out may alias a or b: each element is read before it is written. */
template <typename T> __global__ void residual_fwd_kernel(T *out, const T *a, const T *b, size_t n) {
    GRID_STRIDE(i, n) st(out + i, ld(a + i) + ld(b + i));
}

template <typename T> __global__ void residual_bwd_kernel(T *da, T *db, const T *dout, size_t n) {
    GRID_STRIDE(i, n) {
        const float d = ld(dout + i);
        st(da + i, ld(da + i) + d);
        st(db + i, ld(db + i) + d);
    }
}

extern "C" int loco_cuda_residual_fwd(float *out, const float *a, const float *b, size_t n,
                                      loco_stream s) {
    if (!n)
        return 0;
    residual_fwd_kernel<float><<<grid_for(n, EW_THREADS), EW_THREADS, 0, s>>>(out, a, b, n);
    CUDA_LAUNCHED("residual_fwd");
    return 0;
}

extern "C" int loco_cuda_residual_fwd_bf16(loco_bf16 *out, const loco_bf16 *a,
                                           const loco_bf16 *b, size_t n, loco_stream s) {
    if (!n)
        return 0;
    residual_fwd_kernel<__nv_bfloat16>
        <<<grid_for(n, EW_THREADS), EW_THREADS, 0, s>>>(bf(out), bf(a), bf(b), n);
    CUDA_LAUNCHED("residual_fwd_bf16");
    return 0;
}

extern "C" int loco_cuda_residual_bwd(float *da, float *db, const float *dout, size_t n,
                                      loco_stream s) {
    if (!n)
        return 0;
    residual_bwd_kernel<float><<<grid_for(n, EW_THREADS), EW_THREADS, 0, s>>>(da, db, dout, n);
    CUDA_LAUNCHED("residual_bwd");
    return 0;
}

extern "C" int loco_cuda_residual_bwd_bf16(loco_bf16 *da, loco_bf16 *db, const loco_bf16 *dout,
                                           size_t n, loco_stream s) {
    if (!n)
        return 0;
    residual_bwd_kernel<__nv_bfloat16>
        <<<grid_for(n, EW_THREADS), EW_THREADS, 0, s>>>(bf(da), bf(db), bf(dout), n);
    CUDA_LAUNCHED("residual_bwd_bf16");
    return 0;
}

/* ------------------------------------------------------------------ AdamW */

/* gate: NULL, or a device sum of squares; not finite = skip the update. */
__global__ void adamw_kernel(float *p, const float *g, float *m, float *v, size_t n, float lr,
                             float beta1, float beta2, float eps, float wd, float ib1,
                             float ib2, const double *gate) {
    if (gate && !isfinite(*gate))
        return;
    GRID_STRIDE(i, n) {
        const float gi = g[i];
        const float mi = beta1 * m[i] + (1.0f - beta1) * gi;
        const float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        const float mhat = mi * ib1, vhat = vi * ib2;
        p[i] -= lr * (mhat / (sqrtf(vhat) + eps) + wd * p[i]);
    }
}

extern "C" int loco_cuda_adamw_update_gated(float *p, const float *g, float *m, float *v,
                                            size_t n, float lr, float beta1, float beta2,
                                            float eps, float wd, int64_t t, const double *gate,
                                            loco_stream s) {
    if (!n)
        return 0;
    /* bias corrections in double on the host, as the CPU twin does */
    const float bc1 = (float)(1.0 - pow((double)beta1, (double)t));
    const float bc2 = (float)(1.0 - pow((double)beta2, (double)t));
    adamw_kernel<<<grid_for(n, EW_THREADS), EW_THREADS, 0, s>>>(
        p, g, m, v, n, lr, beta1, beta2, eps, wd, 1.0f / bc1, 1.0f / bc2, gate);
    CUDA_LAUNCHED("adamw_update");
    return 0;
}

extern "C" int loco_cuda_adamw_update(float *p, const float *g, float *m, float *v, size_t n,
                                      float lr, float beta1, float beta2, float eps, float wd,
                                      int64_t t, loco_stream s) {
    return loco_cuda_adamw_update_gated(p, g, m, v, n, lr, beta1, beta2, eps, wd, t, NULL, s);
}

/* ----------------------------------------------------------- sumsq, scale */

/* Part k of the CPU twin's split: [i0, i1). */
__global__ void sumsq_parts_kernel(double *part, const float *x, size_t n) {
    __shared__ double shm[32];
    const size_t k = blockIdx.x, P = SUMSQ_PARTS;
    const size_t i0 = n / P * k + (n % P) * k / P;
    const size_t i1 = n / P * (k + 1) + (n % P) * (k + 1) / P;
    double acc = 0.0;
    for (size_t i = i0 + threadIdx.x; i < i1; i += blockDim.x)
        acc += (double)x[i] * x[i];
    acc = block_sum(acc, shm);
    if (threadIdx.x == 0)
        part[k] = acc;
}

__global__ void sumsq_total_kernel(double *out) {
    double s = 0.0;
    for (int k = 0; k < SUMSQ_PARTS; k++)
        s += out[1 + k];
    out[0] = s;
}

extern "C" int loco_cuda_sumsq(double *out, const float *x, size_t n, loco_stream s) {
    sumsq_parts_kernel<<<SUMSQ_PARTS, 512, 0, s>>>(out + 1, x, n);
    CUDA_LAUNCHED("sumsq (parts)");
    sumsq_total_kernel<<<1, 1, 0, s>>>(out);
    CUDA_LAUNCHED("sumsq (total)");
    return 0;
}

__global__ void scale_kernel(float *x, float sc, size_t n) {
    GRID_STRIDE(i, n) x[i] *= sc;
}

extern "C" int loco_cuda_scale(float *x, float sc, size_t n, loco_stream s) {
    if (!n)
        return 0;
    scale_kernel<<<grid_for(n, EW_THREADS), EW_THREADS, 0, s>>>(x, sc, n);
    CUDA_LAUNCHED("scale");
    return 0;
}

/* The clip of loco_clip_grad_norm with the norm read on the device: every
 * thread computes the same factor from sumsq[0]. */
__global__ void clip_scale_kernel(float *x, size_t n, const double *sumsq, double max_norm) {
    const double norm = sqrt(*sumsq);
    if (!(max_norm > 0 && norm > max_norm && isfinite(norm)))
        return;
    const float sc = (float)(max_norm / norm);
    GRID_STRIDE(i, n) x[i] *= sc;
}

extern "C" int loco_cuda_clip_scale(float *x, size_t n, const double *sumsq, double max_norm,
                                    loco_stream s) {
    if (!n)
        return 0;
    clip_scale_kernel<<<grid_for(n, EW_THREADS), EW_THREADS, 0, s>>>(x, n, sumsq, max_norm);
    CUDA_LAUNCHED("clip_scale");
    return 0;
}

/* ------------------------------------------------------- mean of losses */

enum { MEAN_THREADS = 1024 };

__global__ void mean_acc_kernel(float *mean, double *acc, const float *x, int n) {
    __shared__ double shm[32];
    double sum = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        sum += x[i];
    sum = block_sum(sum, shm);
    if (threadIdx.x == 0) {
        const float m = (float)(sum / n);
        *mean = m;
        if (acc)
            *acc += m;
    }
}

extern "C" int loco_cuda_mean_acc(float *mean, double *acc, const float *x, int n,
                                  loco_stream s) {
    if (n < 1)
        return LOCO_ERR(LOCO_EINVAL, "mean_acc: %d values", n);
    mean_acc_kernel<<<1, MEAN_THREADS, 0, s>>>(mean, acc, x, n);
    CUDA_LAUNCHED("mean_acc");
    return 0;
}

/* dst += src, then src = 0 (a gradient folded in from a side buffer). */
__global__ void add_clear_kernel(float *dst, float *src, size_t n) {
    GRID_STRIDE(i, n) {
        dst[i] += src[i];
        src[i] = 0.0f;
    }
}

extern "C" int loco_cuda_add_clear(float *dst, float *src, size_t n, loco_stream s) {
    if (!n)
        return 0;
    add_clear_kernel<<<grid_for(n, EW_THREADS), EW_THREADS, 0, s>>>(dst, src, n);
    CUDA_LAUNCHED("add_clear");
    return 0;
}
