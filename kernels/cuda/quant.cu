/* CUDA twins of the pseudo-gradient codecs' element loops (kernels/cpu/
 * quant.c, declared in kernels/kernels.h): the same payload bytes and the
 * same error-feedback values as the CPU for the same input. Every float
 * operation that decides a byte is written with an explicitly rounded
 * intrinsic (__fadd_rn, __fmul_rn, ...) so that nvcc cannot contract it
 * into an FMA the CPU does not do; the integer and minifloat arithmetic is
 * the CPU's, line for line. One thread block per scale block. */
#include <float.h>
#include <math.h>

#include "kernels/cuda/common.cuh"

extern "C" {
}

enum { Q_THREADS = 128, EW = 256 };

__device__ __forceinline__ uint32_t f2u(float f) { return __float_as_uint(f); }
__device__ __forceinline__ float u2f(uint32_t u) { return __uint_as_float(u); }

__device__ __forceinline__ float load_f32(const uint8_t *p) {
    return u2f((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
               (uint32_t)p[3] << 24);
}

__device__ __forceinline__ void store_u32(uint8_t *p, uint32_t u) {
    p[0] = (uint8_t)u;
    p[1] = (uint8_t)(u >> 8);
    p[2] = (uint8_t)(u >> 16);
    p[3] = (uint8_t)(u >> 24);
}

/* lowbias32 (Wellons), as the CPU's. */
__device__ __forceinline__ uint32_t mix32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    x ^= x >> 16;
    return x;
}

__device__ __forceinline__ uint32_t sr_bits(uint32_t k0, uint32_t k1, uint32_t i) {
    return mix32(mix32(i ^ k0) + k1);
}

__device__ __forceinline__ float sr_unit(uint32_t r) {
    return __fmul_rn(__uint2float_rn(r >> 8), 0x1p-24f);
}

/* ------------------------------------------------------------ minifloats */

__device__ __forceinline__ uint32_t minifloat_code(float y, uint32_t r, int M, int BIAS,
                                                   uint32_t maxcode, bool stochastic) {
    const int sh = 23 - M;
    const uint32_t a = f2u(y);
    uint32_t t;
    if (stochastic)
        t = a + (r & ((1U << sh) - 1));
    else
        t = a + ((1U << (sh - 1)) - 1) + ((a >> sh) & 1);
    const uint32_t normal = (t >> sh) - ((uint32_t)(127 - BIAS) << M);
    const float steps = __fmul_rn(y, (float)(1 << (BIAS + M - 1)));
    uint32_t sub;
    if (stochastic)
        sub = (uint32_t)(int32_t)__fadd_rn(steps, sr_unit(r));
    else
        sub = (uint32_t)(int32_t)rintf(steps);
    const uint32_t min_normal_bits = (uint32_t)(127 + 1 - BIAS) << 23;
    const uint32_t c = a < min_normal_bits ? sub : normal;
    return c < maxcode ? c : maxcode;
}

__device__ __forceinline__ float minifloat_value(uint32_t c, int M, int BIAS) {
    if (c < (1U << M))
        return __fmul_rn((float)(int32_t)c, 1.0f / (float)(1 << (BIAS + M - 1)));
    return u2f((c << (23 - M)) + ((uint32_t)(127 - BIAS) << 23));
}

#define FP8_M 3
#define FP8_BIAS 7
#define FP8_MAXCODE 0x7eU
#define FP4_M 1
#define FP4_BIAS 1
#define FP4_MAXCODE 0x7U

/* ------------------------------------------------------------ fp32 / bf16 */

__global__ void quant_f32_kernel(uint8_t *out, const float *x, size_t n, bool planes,
                                 uint32_t *nonfinite) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const uint32_t u = f2u(x[i]);
        if ((u & 0x7fffffffU) >= 0x7f800000U && nonfinite)
            *nonfinite = 1;
        if (planes) {
            out[i] = (uint8_t)u;
            out[n + i] = (uint8_t)(u >> 8);
            out[2 * n + i] = (uint8_t)(u >> 16);
            out[3 * n + i] = (uint8_t)(u >> 24);
        } else {
            store_u32(out + 4 * i, u);
        }
    }
}

__global__ void quant_bf16_kernel(uint8_t *out, const float *x, float *ef, size_t n, bool planes,
                                  uint32_t k0, uint32_t k1, bool stochastic,
                                  uint32_t *nonfinite) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float v = ef ? __fadd_rn(x[i], ef[i]) : x[i];
        const uint32_t u = f2u(v);
        if ((u & 0x7fffffffU) >= 0x7f800000U && nonfinite)
            *nonfinite = 1;
        uint32_t h;
        if (stochastic)
            h = (u + (sr_bits(k0, k1, (uint32_t)i) & 0xffffU)) >> 16;
        else
            h = (u + 0x7fffU + ((u >> 16) & 1)) >> 16;
        h -= (h & 0x7fffU) == 0x7f80U;
        if (ef)
            ef[i] = __fsub_rn(v, u2f(h << 16));
        if (planes) {
            out[i] = (uint8_t)h;
            out[n + i] = (uint8_t)(h >> 8);
        } else {
            out[2 * i] = (uint8_t)h;
            out[2 * i + 1] = (uint8_t)(h >> 8);
        }
    }
}

/* ------------------------------------------------------- block quantizers */

struct code_out {
    uint32_t bits; /* the code as stored (int codes as their low bits) */
    float dec;     /* its decoded value before the scale */
};

__device__ __forceinline__ code_out encode_one(loco_quant_format k, float y, uint32_t r,
                                               bool stochastic) {
    code_out o;
    if (k == LOCO_QFMT_INT8 || k == LOCO_QFMT_INT4) {
        const int32_t lim = k == LOCO_QFMT_INT8 ? 127 : 7;
        int32_t q;
        if (stochastic)
            q = (int32_t)__fadd_rn(__fadd_rn(y, (float)(lim + 1)), sr_unit(r)) - (lim + 1);
        else
            q = (int32_t)rintf(y);
        q = q > lim ? lim : q;
        q = q < -lim ? -lim : q;
        o.bits = (uint32_t)q;
        o.dec = (float)q;
        return o;
    }
    const bool fp8 = k == LOCO_QFMT_FP8;
    const int M = fp8 ? FP8_M : FP4_M, BIAS = fp8 ? FP8_BIAS : FP4_BIAS;
    const uint32_t sign = f2u(y) & 0x80000000U;
    const uint32_t c = minifloat_code(u2f(f2u(y) & 0x7fffffffU), r, M, BIAS,
                                      fp8 ? FP8_MAXCODE : FP4_MAXCODE, stochastic);
    o.bits = c | (sign >> (fp8 ? 24 : 28));
    o.dec = u2f(f2u(minifloat_value(c, M, BIAS)) | sign);
    return o;
}

__global__ void __launch_bounds__(Q_THREADS)
    quant_blocks_kernel(loco_quant_format k, uint8_t *payload, const float *x, float *ef, size_t n,
                        int block, uint32_t k0, uint32_t k1, bool stochastic, float qmax,
                        uint32_t *nonfinite) {
    __shared__ uint32_t wmax[Q_THREADS / 32];
    const size_t B = (size_t)block, nb = (n + B - 1) / B, b = blockIdx.x;
    const size_t s = b * B, m = n - s < B ? n - s : B;
    uint8_t *codes = payload + 4 * nb;
    /* absmax of x + ef as fp32 bits */
    uint32_t mx = 0;
    for (size_t i = threadIdx.x; i < m; i += blockDim.x) {
        const float v = ef ? __fadd_rn(x[s + i], ef[s + i]) : x[s + i];
        const uint32_t u = f2u(v) & 0x7fffffffU;
        mx = u > mx ? u : mx;
    }
    for (int o = 16; o > 0; o >>= 1) {
        const uint32_t t = __shfl_xor_sync(0xffffffffu, mx, o);
        mx = t > mx ? t : mx;
    }
    if ((threadIdx.x & 31) == 0)
        wmax[threadIdx.x >> 5] = mx;
    __syncthreads();
    mx = 0;
    for (int w = 0; w < Q_THREADS / 32; w++)
        mx = wmax[w] > mx ? wmax[w] : mx;
    if (mx >= 0x7f800000U) {
        if (threadIdx.x == 0 && nonfinite)
            *nonfinite = 1;
        return;
    }
    const float amax = u2f(mx);
    float scale = 0.0f, inv = 0.0f;
    if (mx != 0 && __fdiv_rn(qmax, amax) <= FLT_MAX) {
        scale = __fdiv_rn(amax, qmax);
        inv = __fdiv_rn(qmax, amax);
        if (__dmul_rn((double)scale, (double)qmax) > (double)amax)
            scale = u2f(f2u(scale) - 1);
    }
    if (threadIdx.x == 0)
        store_u32(payload + 4 * b, f2u(scale));
    const bool packed = k == LOCO_QFMT_INT4 || k == LOCO_QFMT_FP4;
    if (!packed) {
        for (size_t i = threadIdx.x; i < m; i += blockDim.x) {
            const size_t e = s + i;
            const float v = ef ? __fadd_rn(x[e], ef[e]) : x[e];
            const uint32_t r = stochastic ? sr_bits(k0, k1, (uint32_t)e) : 0;
            const code_out c = encode_one(k, __fmul_rn(v, inv), r, stochastic);
            codes[e] = (uint8_t)c.bits;
            if (ef)
                ef[e] = __fsub_rn(v, __fmul_rn(c.dec, scale));
        }
        return;
    }
    /* two codes per byte, element 2j in the low nibble; s is even */
    for (size_t j = threadIdx.x; 2 * j < m; j += blockDim.x) {
        uint32_t byte = 0;
        for (int h = 0; h < 2 && 2 * j + h < m; h++) {
            const size_t e = s + 2 * j + h;
            const float v = ef ? __fadd_rn(x[e], ef[e]) : x[e];
            const uint32_t r = stochastic ? sr_bits(k0, k1, (uint32_t)e) : 0;
            const code_out c = encode_one(k, __fmul_rn(v, inv), r, stochastic);
            byte |= (c.bits & 0xfU) << (4 * h);
            if (ef)
                ef[e] = __fsub_rn(v, __fmul_rn(c.dec, scale));
        }
        codes[s / 2 + j] = (uint8_t)byte;
    }
}

extern "C" int loco_cuda_quant(loco_quant_format k, uint8_t *payload, const float *x, float *ef,
                               size_t n, const loco_quant_args *a, uint32_t *nonfinite,
                               loco_stream s) {
    if (k < LOCO_QFMT_NONE || k >= LOCO_QFMT_COUNT)
        return LOCO_ERR(LOCO_EINVAL, "cuda quant: format %d", (int)k);
    if (k != LOCO_QFMT_NONE && k != LOCO_QFMT_BF16 &&
        (a->block < 8 || a->block > LOCO_QUANT_BLOCK_MAX || a->block % 8))
        return LOCO_ERR(LOCO_EINVAL, "cuda quant: block %d", a->block);
    if (nonfinite)
        CUDA_CHECK(cudaMemsetAsync(nonfinite, 0, sizeof *nonfinite, s));
    if (n == 0)
        return 0;
    const uint32_t k0 = (uint32_t)a->key, k1 = (uint32_t)(a->key >> 32);
    switch (k) {
    case LOCO_QFMT_NONE:
        quant_f32_kernel<<<grid_for(n, EW), EW, 0, s>>>(payload, x, n, a->planes, nonfinite);
        break;
    case LOCO_QFMT_BF16:
        quant_bf16_kernel<<<grid_for(n, EW), EW, 0, s>>>(payload, x, ef, n, a->planes, k0, k1,
                                                         a->stochastic, nonfinite);
        break;
    default: {
        const float qmax = k == LOCO_QFMT_INT8   ? 127.0f
                           : k == LOCO_QFMT_INT4 ? 7.0f
                           : k == LOCO_QFMT_FP8  ? 448.0f
                                                  : 6.0f;
        const size_t nb = (n + (size_t)a->block - 1) / (size_t)a->block;
        if (nb > 0x7fffffffU)
            return LOCO_ERR(LOCO_EINVAL, "cuda quant: %zu blocks", nb);
        quant_blocks_kernel<<<(unsigned)nb, Q_THREADS, 0, s>>>(
            k, payload, x, ef, n, a->block, k0, k1, a->stochastic, qmax, nonfinite);
    }
    }
    CUDA_LAUNCHED("quant");
    return 0;
}

/* ------------------------------------------------------ dequantize + acc */

__global__ void dequant_kernel(loco_quant_format k, float *dst, const uint8_t *payload, size_t n,
                               int block, bool planes, float w) {
    const size_t nb = (n + (size_t)block - 1) / (size_t)block;
    const uint8_t *codes = payload + 4 * nb;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float val, ws = w;
        switch (k) {
        case LOCO_QFMT_NONE:
            val = planes ? u2f((uint32_t)payload[i] | (uint32_t)payload[n + i] << 8 |
                               (uint32_t)payload[2 * n + i] << 16 |
                               (uint32_t)payload[3 * n + i] << 24)
                         : load_f32(payload + 4 * i);
            break;
        case LOCO_QFMT_BF16: {
            const uint32_t h = planes ? (uint32_t)payload[i] | (uint32_t)payload[n + i] << 8
                                      : (uint32_t)payload[2 * i] | (uint32_t)payload[2 * i + 1] << 8;
            val = u2f(h << 16);
            break;
        }
        default: {
            ws = __fmul_rn(w, load_f32(payload + 4 * (i / (size_t)block)));
            if (k == LOCO_QFMT_INT8) {
                val = (float)(int8_t)codes[i];
            } else if (k == LOCO_QFMT_FP8) {
                const uint32_t b = codes[i];
                val = u2f(f2u(minifloat_value(b & 0x7fU, FP8_M, FP8_BIAS)) | (b & 0x80U) << 24);
            } else {
                const uint32_t c = (codes[i / 2] >> (4 * (i & 1))) & 0xfU;
                if (k == LOCO_QFMT_INT4)
                    val = (float)((int32_t)(c ^ 8U) - 8);
                else
                    val = u2f(f2u(minifloat_value(c & 0x7U, FP4_M, FP4_BIAS)) | (c & 0x8U) << 28);
            }
        }
        }
        dst[i] = __fmaf_rn(val, ws, dst[i]);
    }
}

extern "C" int loco_cuda_dequant_acc(loco_quant_format k, float *dst, const uint8_t *payload,
                                     size_t n, int block, bool planes, float weight,
                                     loco_stream s) {
    if (k < LOCO_QFMT_NONE || k >= LOCO_QFMT_COUNT || block <= 0)
        return LOCO_ERR(LOCO_EINVAL, "cuda dequant: format %d, block %d", (int)k, block);
    if (n == 0)
        return 0;
    dequant_kernel<<<grid_for(n, EW), EW, 0, s>>>(k, dst, payload, n, block, planes, weight);
    CUDA_LAUNCHED("dequant_acc");
    return 0;
}

/* ------------------------------------------------- the outer step's loops
 * Twins of loco_sub, loco_share_sumsq and loco_outer_update
 * (kernels/cpu/quant.c): every operation explicitly rounded, so nothing is
 * contracted into an FMA the CPU does not do. */

__global__ void sub_kernel(float *out, const float *a, const float *b, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = __fsub_rn(a[i], b[i]);
}

extern "C" int loco_cuda_sub(float *out, const float *a, const float *b, size_t n,
                             loco_stream s) {
    if (n == 0)
        return 0;
    sub_kernel<<<grid_for(n, EW), EW, 0, s>>>(out, a, b, n);
    CUDA_LAUNCHED("sub");
    return 0;
}

/* One thread per part of LOCO_SHARE_PART elements, summed in order. */
__global__ void share_parts_kernel(double *part, const float *now, const float *before, size_t n,
                                   double scale, uint32_t *nonfinite) {
    const size_t parts = (n + LOCO_SHARE_PART - 1) / LOCO_SHARE_PART;
    for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < parts;
         k += (size_t)gridDim.x * blockDim.x) {
        const size_t p0 = k * LOCO_SHARE_PART;
        const size_t p1 = p0 + LOCO_SHARE_PART < n ? p0 + LOCO_SHARE_PART : n;
        double ss = 0;
        bool bad = false;
        for (size_t i = p0; i < p1; i++) {
            bad |= (f2u(now[i]) & 0x7fffffffU) >= 0x7f800000U;
            const double d = __dmul_rn((double)now[i] - (double)before[i], scale);
            ss += __dmul_rn(d, d);
        }
        part[k] = ss;
        if (bad)
            *nonfinite = 1;
    }
}

__global__ void share_total_kernel(double *out, size_t parts, uint32_t *nonfinite) {
    double s = 0;
    for (size_t k = 0; k < parts; k++)
        s += out[1 + k];
    out[0] = s;
    if (!isfinite(s))
        *nonfinite = 1;
}

extern "C" int loco_cuda_share_sumsq(double *out, const float *now, const float *before,
                                     size_t n, double scale, uint32_t *nonfinite,
                                     loco_stream s) {
    CUDA_CHECK(cudaMemsetAsync(nonfinite, 0, sizeof *nonfinite, s));
    const size_t parts = (n + LOCO_SHARE_PART - 1) / LOCO_SHARE_PART;
    if (parts) {
        share_parts_kernel<<<grid_for(parts, Q_THREADS), Q_THREADS, 0, s>>>(
            out + 1, now, before, n, scale, nonfinite);
        CUDA_LAUNCHED("share_sumsq (parts)");
    }
    share_total_kernel<<<1, 1, 0, s>>>(out, parts, nonfinite);
    CUDA_LAUNCHED("share_sumsq (total)");
    return 0;
}

__global__ void outer_update_kernel(float *theta_out, float *mom_out, float *theta_local,
                                    const float *theta, const float *mom, const float *avg,
                                    size_t n, float lr, float mu, bool nesterov) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float g = avg[i];
        float t = theta[i];
        if (nesterov) {
            const float mm = __fadd_rn(__fmul_rn(mu, mom[i]), g);
            mom_out[i] = mm;
            t = __fsub_rn(t, __fmul_rn(lr, __fadd_rn(g, __fmul_rn(mu, mm))));
        } else {
            mom_out[i] = mom[i];
            t = __fsub_rn(t, g);
        }
        theta_out[i] = t;
        theta_local[i] = t;
    }
}

extern "C" int loco_cuda_outer_update(float *theta_out, float *mom_out, float *theta_local,
                                      const float *theta, const float *mom, const float *avg,
                                      size_t n, float lr, float mu, bool nesterov,
                                      loco_stream s) {
    if (n == 0)
        return 0;
    outer_update_kernel<<<grid_for(n, EW), EW, 0, s>>>(theta_out, mom_out, theta_local, theta,
                                                       mom, avg, n, lr, mu, nesterov);
    CUDA_LAUNCHED("outer_update");
    return 0;
}
