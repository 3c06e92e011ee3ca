/* CUDA twins of the top-k codec's loops (kernels/cpu/topk.c, declared in
 * kernels/kernels.h): the same payload bytes and error-feedback values as
 * the CPU for the same input.
 *
 * Encoding is two kernels. One thread block selects: the CPU's radix
 * select (three histogram passes, integer counts, so the order of the
 * atomics cannot change them), then a pass over tiles in index order that
 * numbers the kept elements with block-wide prefix sums and writes their
 * indices and codes to the workspace, and every element's EF. Then one
 * thread per output byte packs the index and code sections from the
 * workspace, so no byte is written twice. Decoding, of a payload the host
 * checked, numbers the set bits of the index bitmap the same way. The
 * float operations that decide a byte are explicitly rounded intrinsics,
 * as in quant.cu. */
#include <float.h>
#include <math.h>

#include "kernels/cuda/common.cuh"

enum { TK_THREADS = 256, TK_ITEMS = 16, TK_EW = 256 };

__device__ __forceinline__ uint32_t tk_f2u(float f) { return __float_as_uint(f); }
__device__ __forceinline__ float tk_u2f(uint32_t u) { return __uint_as_float(u); }

__device__ __forceinline__ uint32_t tk_le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

__device__ __forceinline__ void tk_put32(uint8_t *p, uint32_t u) {
    p[0] = (uint8_t)u;
    p[1] = (uint8_t)(u >> 8);
    p[2] = (uint8_t)(u >> 16);
    p[3] = (uint8_t)(u >> 24);
}

/* |v| bits of element i, v = x (+ ef) as the CPU adds them. */
__device__ __forceinline__ uint32_t tk_key(const float *x, const float *ef, size_t i, float *v) {
    *v = ef ? __fadd_rn(x[i], ef[i]) : x[i];
    return tk_f2u(*v) & 0x7fffffffU;
}

/* Exclusive prefix sum of each thread's `mine` over the block (in thread
 * order); *total receives the block's sum. Every thread calls it. */
__device__ __forceinline__ uint32_t tk_scan(uint32_t *buf, uint32_t mine, uint32_t *total) {
    const unsigned t = threadIdx.x;
    buf[t] = mine;
    __syncthreads();
    for (unsigned off = 1; off < TK_THREADS; off <<= 1) {
        const uint32_t add = t >= off ? buf[t - off] : 0;
        __syncthreads();
        buf[t] += add;
        __syncthreads();
    }
    const uint32_t incl = buf[t];
    *total = buf[TK_THREADS - 1];
    __syncthreads();
    return incl - mine;
}

/* The CPU's pick_bin, by thread 0 (the others wait at the barrier). */
__device__ __forceinline__ uint32_t tk_pick(const uint32_t *hist, uint32_t bins, uint32_t *need) {
    for (uint32_t b = bins; b-- > 0;) {
        if (hist[b] >= *need)
            return b;
        *need -= hist[b];
    }
    return 0;
}

/* Workspace: u32 index[k] at 64, u8 code[k] after it. */
__global__ void __launch_bounds__(TK_THREADS)
    topk_select_kernel(uint8_t *payload, const float *x, float *ef, size_t n, uint32_t k, int bits,
                       int layout, uint8_t *work, uint32_t *nonfinite) {
    __shared__ uint32_t hist[2048];
    __shared__ uint32_t scan[TK_THREADS];
    __shared__ uint32_t wmax[TK_THREADS / 32];
    __shared__ uint32_t sel[3]; /* bin, need, threshold */
    const unsigned t = threadIdx.x;
    uint32_t *kidx = (uint32_t *)(work + 64);
    uint8_t *kcode = work + 64 + 4 * (size_t)k;
    float v;
    for (unsigned b = t; b < 2048; b += TK_THREADS)
        hist[b] = 0;
    __syncthreads();
    uint32_t mx = 0;
    for (size_t i = t; i < n; i += TK_THREADS) {
        const uint32_t u = tk_key(x, ef, i, &v);
        atomicAdd(&hist[u >> 20], 1U);
        mx = u > mx ? u : mx;
    }
    for (int o = 16; o > 0; o >>= 1) {
        const uint32_t y = __shfl_xor_sync(0xffffffffu, mx, o);
        mx = y > mx ? y : mx;
    }
    if ((t & 31) == 0)
        wmax[t >> 5] = mx;
    __syncthreads();
    mx = 0;
    for (int w = 0; w < TK_THREADS / 32; w++)
        mx = wmax[w] > mx ? wmax[w] : mx;
    if (mx >= 0x7f800000U) {
        if (t == 0 && nonfinite)
            *nonfinite = 1;
        return;
    }
    if (t == 0) {
        sel[1] = k;
        sel[0] = tk_pick(hist, 2048, &sel[1]);
    }
    __syncthreads();
    /* passes 2 and 3: the next 10 bits, then the last 10, inside the bin */
    for (int pass = 0; pass < 2; pass++) {
        const uint32_t prefix = sel[0], shift = pass == 0 ? 20 : 10;
        for (unsigned b = t; b < 1024; b += TK_THREADS)
            hist[b] = 0;
        __syncthreads();
        for (size_t i = t; i < n; i += TK_THREADS) {
            const uint32_t u = tk_key(x, ef, i, &v);
            if (u >> shift == prefix)
                atomicAdd(&hist[(u >> (shift - 10)) & 1023], 1U);
        }
        __syncthreads();
        if (t == 0)
            sel[0] = prefix << 10 | tk_pick(hist, 1024, &sel[1]);
        __syncthreads();
    }
    const uint32_t thr = sel[0], ties = sel[1];

    const uint32_t Q = 1U << (bits - 1);
    const float qmax = (float)Q, amax = tk_u2f(mx);
    float scale = 0.0f, inv = 0.0f;
    if (mx != 0 && __fdiv_rn(qmax, amax) <= FLT_MAX) {
        scale = __fdiv_rn(amax, qmax);
        inv = __fdiv_rn(qmax, amax);
        if (__dmul_rn((double)scale, (double)qmax) > (double)amax)
            scale = tk_u2f(tk_f2u(scale) - 1);
    }
    if (t == 0) {
        tk_put32(payload, k);
        payload[4] = (uint8_t)bits;
        payload[5] = (uint8_t)layout;
        payload[6] = 0;
        payload[7] = 0;
        tk_put32(payload + 8, tk_f2u(scale));
    }
    /* tiles of TK_THREADS * TK_ITEMS elements, TK_ITEMS consecutive ones
     * per thread: ranks among the ties first, then among the kept */
    uint32_t eq_base = 0, keep_base = 0;
    for (size_t t0 = 0; t0 < n; t0 += (size_t)TK_THREADS * TK_ITEMS) {
        const size_t i0 = t0 + (size_t)t * TK_ITEMS;
        const size_t i1 = i0 + TK_ITEMS < n ? i0 + TK_ITEMS : n;
        uint32_t eq = 0, total;
        for (size_t i = i0; i < i1; i++)
            eq += tk_key(x, ef, i, &v) == thr;
        uint32_t eq_rank = eq_base + tk_scan(scan, eq, &total);
        eq_base += total;
        uint32_t keep = 0;
        for (size_t i = i0; i < i1; i++) {
            const uint32_t u = tk_key(x, ef, i, &v);
            keep += u > thr || (u == thr && eq_rank++ < ties);
        }
        uint32_t j = keep_base + tk_scan(scan, keep, &total);
        keep_base += total;
        eq_rank -= eq; /* this thread's ties again, from its first */
        for (size_t i = i0; i < i1; i++) {
            const uint32_t u = tk_key(x, ef, i, &v);
            if (!(u > thr || (u == thr && eq_rank++ < ties))) {
                if (ef)
                    ef[i] = v;
                continue;
            }
            int32_t q = (int32_t)rintf(__fmul_rn(tk_u2f(u), inv));
            q = q < 1 ? 1 : q > (int32_t)Q ? (int32_t)Q : q;
            const uint32_t sign = tk_f2u(v) >> 31;
            kidx[j] = (uint32_t)i;
            kcode[j] = (uint8_t)(sign << (bits - 1) | (uint32_t)(q - 1));
            if (ef)
                ef[i] = __fsub_rn(v, __fmul_rn((float)(sign ? -q : q), scale));
            j++;
        }
    }
}

/* First j in [0, k) with key(j) >= want, key increasing in j. */
__device__ __forceinline__ uint32_t tk_lower(const uint32_t *kidx, uint32_t k, int L, bool upper,
                                             size_t want) {
    uint32_t lo = 0, hi = k;
    while (lo < hi) {
        const uint32_t mid = lo + (hi - lo) / 2;
        const size_t key = upper ? ((size_t)kidx[mid] >> L) + mid : (size_t)kidx[mid];
        if (key < want)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* One thread per byte of the index and code sections. */
__global__ void topk_pack_kernel(uint8_t *payload, const uint8_t *work, uint32_t k, int bits,
                                 int layout, int L, size_t low_bytes, size_t ib, size_t cb) {
    const uint32_t *kidx = (const uint32_t *)(work + 64);
    const uint8_t *kcode = work + 64 + 4 * (size_t)k;
    uint8_t *out = payload + LOCO_TOPK_HEADER;
    for (size_t b = (size_t)blockIdx.x * blockDim.x + threadIdx.x; b < ib + cb;
         b += (size_t)gridDim.x * blockDim.x) {
        uint32_t byte = 0;
        if (b >= ib) { /* codes: 8 / bits of them per byte */
            const size_t per = 8 / (size_t)bits, j0 = (b - ib) * per;
            for (size_t j = j0; j < j0 + per && j < k; j++)
                byte |= (uint32_t)kcode[j] << ((j - j0) * (size_t)bits);
        } else if (!layout && b < low_bytes) { /* low parts: bit q is bit q % L of index q / L */
            for (size_t q = 8 * b; q < 8 * b + 8 && q < (size_t)k * (size_t)L; q++)
                byte |= (kidx[q / (size_t)L] >> (q % (size_t)L) & 1U) << (q - 8 * b);
        } else { /* upper bits (index >> L) + j, or the bitmap (L = 0, no j) */
            const bool upper = !layout;
            const size_t p0 = 8 * (upper ? b - low_bytes : b);
            for (uint32_t j = tk_lower(kidx, k, L, upper, p0); j < k; j++) {
                const size_t p = upper ? ((size_t)kidx[j] >> L) + j : (size_t)kidx[j];
                if (p >= p0 + 8)
                    break;
                byte |= 1U << (p - p0);
            }
        }
        out[b] = (uint8_t)byte;
    }
}

extern "C" int loco_cuda_topk_quant(uint8_t *payload, const float *x, float *ef, size_t n, size_t k,
                                    int bits, void *work, uint32_t *nonfinite, loco_stream s) {
    const size_t len = loco_topk_payload_bytes(n, k, bits);
    if (len == 0)
        return LOCO_ERR(LOCO_EINVAL, "cuda topk: k = %zu of %zu, %d bits", k, n, bits);
    if (nonfinite)
        CUDA_CHECK(cudaMemsetAsync(nonfinite, 0, sizeof *nonfinite, s));
    int layout, L;
    const size_t ib = loco_topk_index_bytes(n, k, &layout, &L);
    const size_t low_bytes = layout ? 0 : (k * (size_t)L + 7) / 8;
    const size_t cb = (k * (size_t)bits + 7) / 8;
    topk_select_kernel<<<1, TK_THREADS, 0, s>>>(payload, x, ef, n, (uint32_t)k, bits, layout,
                                                (uint8_t *)work, nonfinite);
    CUDA_LAUNCHED("topk select");
    topk_pack_kernel<<<grid_for(ib + cb, TK_EW), TK_EW, 0, s>>>(
        payload, (const uint8_t *)work, (uint32_t)k, bits, layout, L, low_bytes, ib, cb);
    CUDA_LAUNCHED("topk pack");
    return 0;
}

/* ------------------------------------------------------ dequantize + acc */

/* One block: bytes of the index bitmap (the upper bits, or the bitmap) in
 * tiles of TK_THREADS, one per thread, numbered by a prefix sum of their
 * set bits. */
__global__ void __launch_bounds__(TK_THREADS)
    topk_dequant_kernel(float *dst, const uint8_t *payload, size_t n, float w) {
    __shared__ uint32_t scan[TK_THREADS];
    const uint32_t k = tk_le32(payload);
    const int bits = payload[4];
    const uint32_t Q = 1U << (bits - 1);
    const float ws = __fmul_rn(w, tk_u2f(tk_le32(payload + 8)));
    /* loco_topk_index_bytes, as the encoder chose */
    int L = 0;
    while (L < 31 && ((size_t)k << (L + 1)) <= n)
        L++;
    const size_t ef_bytes = ((size_t)k * (size_t)L + 7) / 8 + ((((n - 1) >> L) + k) + 7) / 8;
    const size_t bitmap = (n + 7) / 8;
    const bool layout = bitmap <= ef_bytes;
    const size_t low_bytes = layout ? 0 : ((size_t)k * (size_t)L + 7) / 8;
    const size_t ib = layout ? bitmap : ef_bytes;
    const uint8_t *idx = payload + LOCO_TOPK_HEADER, *upper = idx + low_bytes;
    const uint8_t *codes = idx + ib;
    const size_t ub = ib - low_bytes;
    uint32_t base = 0;
    for (size_t b0 = 0; b0 < ub; b0 += TK_THREADS) {
        const size_t b = b0 + threadIdx.x;
        uint32_t m = b < ub ? upper[b] : 0, ones = 0, total;
        for (uint32_t y = m; y; y &= y - 1)
            ones++;
        uint32_t j = base + tk_scan(scan, ones, &total);
        base += total;
        for (int bit = 0; bit < 8; bit++) {
            if (!(m >> bit & 1))
                continue;
            const size_t p = 8 * b + (size_t)bit;
            size_t i = p;
            if (!layout) {
                uint32_t lo = 0;
                for (int q = 0; q < L; q++) {
                    const size_t pos = (size_t)j * (size_t)L + (size_t)q;
                    lo |= (uint32_t)(idx[pos >> 3] >> (pos & 7) & 1) << q;
                }
                i = (p - j) << L | lo;
            }
            const size_t cpos = (size_t)j * (size_t)bits;
            const uint32_t c = (codes[cpos >> 3] >> (cpos & 7)) & ((1U << bits) - 1);
            const int32_t q = (int32_t)(c & (Q - 1)) + 1;
            dst[i] = __fmaf_rn((float)(c & Q ? -q : q), ws, dst[i]);
            j++;
        }
    }
}

extern "C" int loco_cuda_topk_dequant_acc(float *dst, const uint8_t *payload, size_t n,
                                          float weight, loco_stream s) {
    if (n == 0 || n > UINT32_MAX)
        return LOCO_ERR(LOCO_EINVAL, "cuda topk dequant: %zu elements", n);
    topk_dequant_kernel<<<1, TK_THREADS, 0, s>>>(dst, payload, n, weight);
    CUDA_LAUNCHED("topk dequant_acc");
    return 0;
}
