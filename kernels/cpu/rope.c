/* Rotary position embedding (Llama's RoPE, Hugging Face's rotate-half
 * convention) and its tables, with Llama 3.1's frequency scaling. */
#include <math.h>

#include "kernels/kernels.h"

/* Below this many rotated pairs the loops run on the calling thread. */
#define ROPE_PARALLEL_MIN 16384

/* Torch's fp32 arithmetic, step by step: `scalar / tensor` is the tensor's
 * reciprocal times the scalar (Tensor.__rtruediv__), a Python float meets an
 * fp32 tensor as an fp32 value. */
float loco_rope_inv_freq(int i, int hs, float theta, const loco_rope_scaling *sc)
{
    /* _compute_default_rope_parameters: 1 / base^(arange(0, hs, 2) / hs) */
    const float inv = 1.0f / powf(theta, (float)(2 * i) / (float)hs);
    if (!sc || !(sc->factor > 0.0f))
        return inv;
    /* _compute_llama3_parameters */
    const float orig = (float)sc->original_max_pos;
    const float low_wavelen = (float)((double)sc->original_max_pos / sc->low_freq_factor);
    const float high_wavelen = (float)((double)sc->original_max_pos / sc->high_freq_factor);
    const float wavelen = 1.0f / inv * (float)(2.0 * M_PI);
    if (wavelen < high_wavelen)
        return inv;
    if (wavelen > low_wavelen)
        return inv / sc->factor;
    const float smooth = (1.0f / wavelen * orig - sc->low_freq_factor) /
                         (float)((double)sc->high_freq_factor - sc->low_freq_factor);
    return (1.0f - smooth) * inv / sc->factor + smooth * inv;
}

void loco_rope_tables(float *restrict cos_tab, float *restrict sin_tab, int max_pos, int hs,
                      float theta, const loco_rope_scaling *sc)
{
    const int h = hs / 2;
#pragma omp parallel for schedule(static) if ((long)max_pos * h > ROPE_PARALLEL_MIN)
    for (int i = 0; i < h; i++) {
        const float inv = loco_rope_inv_freq(i, hs, theta, sc);
        for (int p = 0; p < max_pos; p++) {
            const float a = (float)p * inv;
            cos_tab[(size_t)p * h + i] = cosf(a);
            sin_tab[(size_t)p * h + i] = sinf(a);
        }
    }
}

/* dir +1 rotates by the table's angle, -1 by its opposite (the transpose). */
static void rope_apply(float *x, int ld, int B, int T, int n_heads, int hs, const int *pos,
                       const float *restrict cos_tab, const float *restrict sin_tab, float dir)
{
    const int h = hs / 2;
    const long rows = (long)B * T;
#pragma omp parallel for schedule(static) if (rows * n_heads * h > ROPE_PARALLEL_MIN)
    for (long r = 0; r < rows; r++) {
        const int t = (int)(r % T);
        const size_t p = (size_t)(pos ? pos[t] : t);
        const float *restrict c = cos_tab + p * h;
        const float *restrict s = sin_tab + p * h;
        for (int hd = 0; hd < n_heads; hd++) {
            float *restrict x1 = x + (size_t)r * ld + (size_t)hd * hs, *restrict x2 = x1 + h;
#pragma omp simd
            for (int i = 0; i < h; i++) {
                const float a = x1[i], b = x2[i], si = dir * s[i];
                x1[i] = a * c[i] - b * si;
                x2[i] = b * c[i] + a * si;
            }
        }
    }
}

void loco_rope_fwd(float *x, int ld, int B, int T, int n_heads, int hs, const int *pos,
                   const float *cos_tab, const float *sin_tab)
{
    rope_apply(x, ld, B, T, n_heads, hs, pos, cos_tab, sin_tab, 1.0f);
}

void loco_rope_bwd(float *dx, int ld, int B, int T, int n_heads, int hs, const int *pos,
                   const float *cos_tab, const float *sin_tab)
{
    rope_apply(dx, ld, B, T, n_heads, hs, pos, cos_tab, sin_tab, -1.0f);
}
