/* Fused softmax + cross-entropy: one block per row, two passes over the
 * logits (max and sum of exponentials online, then the gradient), so the
 * (N,V) probabilities are never stored. dlogits may equal logits. Rows are
 * stride apart (stride >= V: a padded vocabulary); columns V .. stride-1
 * are not in the softmax and their dlogits are written 0. */
#include <math.h>

#include "kernels/cuda/common.cuh"

enum { XENT_THREADS = 512 };

template <typename T>
__global__ void xent_kernel(float *losses, T *dlogits, const T *logits, const int32_t *targets,
                            int V, int stride, float dscale) {
    __shared__ float fshm[32];
    __shared__ double dshm[32];
    const size_t n = blockIdx.x;
    const T *x = logits + n * stride;
    T *d = dlogits ? dlogits + n * stride : NULL;
    const int32_t y = targets[n];
    if (y < 0) {
        if (threadIdx.x == 0)
            losses[n] = 0.0f;
        if (d)
            for (int j = threadIdx.x; j < stride; j += blockDim.x)
                st(d + j, 0.0f);
        return;
    }
    /* read before any thread may overwrite it in place */
    const float xy = threadIdx.x == 0 ? ld(x + y) : 0.0f;
    float m = -INFINITY, sum = 0.0f;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        const float v = ld(x + j);
        if (v > m) {
            sum *= expf(m - v);
            m = v;
        }
        sum += expf(v - m);
    }
    const float M = block_max(m, fshm);
    const double S = block_sum(m == -INFINITY ? 0.0 : (double)sum * exp((double)(m - M)), dshm);
    const float lse = M + (float)log(S);
    if (threadIdx.x == 0)
        losses[n] = lse - xy;
    if (!d)
        return;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float g = dscale * expf(ld(x + j) - lse);
        if (j == y)
            g -= dscale;
        st(d + j, g);
    }
    for (int j = V + threadIdx.x; j < stride; j += blockDim.x)
        st(d + j, 0.0f);
}

template <typename T>
static int xent(float *losses, T *dlogits, const T *logits, const int32_t *targets, int N, int V,
                int stride, float dscale, loco_stream s) {
    if (V < 1 || stride < V)
        return LOCO_ERR(LOCO_EINVAL, "xent_fwd_bwd: row stride %d below the vocabulary %d",
                        stride, V);
    if (N <= 0)
        return 0;
    xent_kernel<T>
        <<<N, XENT_THREADS, 0, s>>>(losses, dlogits, logits, targets, V, stride, dscale);
    CUDA_LAUNCHED("xent_fwd_bwd");
    return 0;
}

extern "C" int loco_cuda_xent_fwd_bwd(float *losses, float *dlogits, const float *logits,
                                      const int32_t *targets, int N, int V, int stride,
                                      float dscale, loco_stream s) {
    return xent<float>(losses, dlogits, logits, targets, N, V, stride, dscale, s);
}

extern "C" int loco_cuda_xent_fwd_bwd_bf16(float *losses, loco_bf16 *dlogits,
                                           const loco_bf16 *logits, const int32_t *targets,
                                           int N, int V, int stride, float dscale,
                                           loco_stream s) {
    return xent<__nv_bfloat16>(losses, bf(dlogits), bf(logits), targets, N, V, stride, dscale,
                               s);
}
