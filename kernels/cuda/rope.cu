/* Rotary position embedding, HF's rotate-half convention, in place: one
 * thread per rotated pair (x[i], x[i + hs/2]) of a head. The tables are fp32
 * (loco_rope_tables, uploaded by the caller). */
#include "kernels/cuda/common.cuh"

enum { ROPE_THREADS = 256 };

/* dir +1 rotates by the table's angle, -1 by its opposite (the backward). */
template <typename T>
__global__ void rope_kernel(T *x, int row_ld, int T_, int n_heads, int h, const int *pos,
                            const float *cos_tab, const float *sin_tab, float dir, size_t n) {
    for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < n;
         k += (size_t)gridDim.x * blockDim.x) {
        const int i = (int)(k % h);
        const size_t rh = k / h;
        const int hd = (int)(rh % n_heads);
        const size_t r = rh / n_heads;
        const int t = (int)(r % T_);
        const size_t p = (size_t)(pos ? pos[t] : t);
        const float c = cos_tab[p * h + i], s = dir * sin_tab[p * h + i];
        T *x1 = x + r * row_ld + (size_t)hd * 2 * h + i, *x2 = x1 + h;
        const float a = ld(x1), b = ld(x2);
        st(x1, a * c - b * s);
        st(x2, b * c + a * s);
    }
}

template <typename T>
static int rope(T *x, int ld, int B, int T_, int n_heads, int hs, const int *pos,
                const float *cos_tab, const float *sin_tab, float dir, loco_stream s) {
    if (hs % 2)
        return LOCO_ERR(LOCO_EINVAL, "rope: head size %d is odd", hs);
    const size_t n = (size_t)B * T_ * n_heads * (hs / 2);
    if (!n)
        return 0;
    rope_kernel<T><<<grid_for(n, ROPE_THREADS), ROPE_THREADS, 0, s>>>(
        x, ld, T_, n_heads, hs / 2, pos, cos_tab, sin_tab, dir, n);
    CUDA_LAUNCHED(dir > 0 ? "rope_fwd" : "rope_bwd");
    return 0;
}

extern "C" int loco_cuda_rope_fwd(float *x, int ld, int B, int T, int n_heads, int hs,
                                  const int *pos, const float *cos_tab, const float *sin_tab,
                                  loco_stream s) {
    return rope<float>(x, ld, B, T, n_heads, hs, pos, cos_tab, sin_tab, 1.0f, s);
}

extern "C" int loco_cuda_rope_fwd_bf16(loco_bf16 *x, int ld, int B, int T, int n_heads, int hs,
                                       const int *pos, const float *cos_tab, const float *sin_tab,
                                       loco_stream s) {
    return rope<__nv_bfloat16>(bf(x), ld, B, T, n_heads, hs, pos, cos_tab, sin_tab, 1.0f, s);
}

extern "C" int loco_cuda_rope_bwd(float *dx, int ld, int B, int T, int n_heads, int hs,
                                  const int *pos, const float *cos_tab, const float *sin_tab,
                                  loco_stream s) {
    return rope<float>(dx, ld, B, T, n_heads, hs, pos, cos_tab, sin_tab, -1.0f, s);
}

extern "C" int loco_cuda_rope_bwd_bf16(loco_bf16 *dx, int ld, int B, int T, int n_heads, int hs,
                                       const int *pos, const float *cos_tab, const float *sin_tab,
                                       loco_stream s) {
    return rope<__nv_bfloat16>(bf(dx), ld, B, T, n_heads, hs, pos, cos_tab, sin_tab, -1.0f, s);
}
