/* Mixture-of-experts routing, capacity planning, dispatch and combine,
 * fp32: the twins of kernels/cpu/moe.c. Deterministic with no atomics:
 * every output element has one writer, every sum a fixed order.
 *
 * route and route_bwd run one thread per token, in the CPU's order (the
 * same top-k, ties to the lower expert). plan reproduces the CPU's integers
 * exactly in five small kernels (the scratch layout is below):
 *   1. per expert (one block): each assignment's rank among those routed
 *      to its expert, in token order (a block scan); routed, count;
 *   2. one thread: the experts' first rows, routed and kept;
 *   3. per assignment: the lists of assignments routed to each expert, in
 *      token order (expert-major);
 *   4. per assignment of an over-full expert: its priority rank by counting
 *      the assignments of that expert that come first (more probable, ties
 *      by lower token then choice, i.e. lower flat index); kept if below
 *      cap. O(n_e^2) per expert: a correctness twin, not a fast sort;
 *   5. per expert (one block): the kept ones' rank in token order (a block
 *      scan of the list), their slots and rows; -1 for the dropped.
 * losses reduces on the device, one block in a fixed order, into two
 * device doubles. */
#include <math.h>

#include "kernels/cuda/common.cuh"

/* threads of the per-token / elementwise kernels, of the plan's per-expert
 * scans, of the losses' single block; warps per block of combine_bwd */
enum { MOE_THREADS = 256, MOE_SCAN_THREADS = 256, MOE_LOSS_THREADS = 256, MOE_WARPS = 8 };

#define GRID_STRIDE(i, n)                                                                    \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                  \
         i += (size_t)gridDim.x * blockDim.x)

/* ---------------------------------------------------------------- routing */

/* One thread per token: softmax, log-sum-exp, top-k by selection of the
 * (biased) scores, weights renormalised from the unbiased probabilities;
 * the CPU twin's arithmetic step for step (probs may equal logits: the
 * row's thread reads each logit before writing it). */
__global__ void moe_route_kernel(float *probs, float *lse, int32_t *expert, float *weight,
                                 const float *logits, const float *bias, int N, int E, int k) {
    GRID_STRIDE(t, (size_t)N) {
        const float *in = logits + t * E;
        float *p = probs + t * E;
        float mx = in[0];
        for (int e = 1; e < E; e++)
            mx = in[e] > mx ? in[e] : mx;
        double s = 0;
        for (int e = 0; e < E; e++) {
            p[e] = expf(in[e] - mx);
            s += p[e];
        }
        const float inv = (float)(1.0 / s);
        for (int e = 0; e < E; e++)
            p[e] *= inv;
        lse[t] = mx + (float)log(s);
        int32_t *ex = expert + t * k;
        float *w = weight + t * k;
        double sum = 0;
        for (int j = 0; j < k; j++) {
            int best = -1;
            float top = 0;
            for (int e = 0; e < E; e++) {
                bool taken = false;
                for (int i = 0; i < j; i++)
                    taken |= ex[i] == e;
                const float score = bias ? p[e] + bias[e] : p[e];
                if (!taken && (best < 0 || score > top))
                    best = e, top = score;
            }
            ex[j] = best;
            w[j] = p[best];
            sum += p[best];
        }
        for (int j = 0; j < k; j++)
            w[j] = (float)(w[j] / sum);
    }
}

static int moe_check(const char *what, int N, int E, int k) {
    if (N < 0 || k < 1 || k > E)
        return LOCO_ERR(LOCO_EINVAL, "%s: N=%d, E=%d, k=%d (need N >= 0, 1 <= k <= E)", what, N,
                        E, k);
    return 0;
}

extern "C" int loco_cuda_moe_route(float *probs, float *lse, int32_t *expert, float *weight,
                                   const float *logits, const float *bias, int N, int E, int k,
                                   loco_stream s) {
    LOCO_CHECK(moe_check("moe_route", N, E, k));
    if (N == 0)
        return 0;
    moe_route_kernel<<<grid_for((size_t)N, MOE_THREADS), MOE_THREADS, 0, s>>>(
        probs, lse, expert, weight, logits, bias, N, E, k);
    CUDA_LAUNCHED("moe_route");
    return 0;
}

/* --------------------------------------------------------------- planning */

/* The plan's scratch, int32 in this order (LOCO_CUDA_MOE_PLAN_SCRATCH). */
struct moe_plan_scratch {
    int32_t *total;     /* (1) the packed rows */
    int32_t *roff;      /* (E+1) first list position of each expert's routed */
    int32_t *koff;      /* (E+1) first packed row of each expert */
    int32_t *rank;      /* (N k) rank of an assignment among its expert's, token order */
    int32_t *list;      /* (N k) assignments, expert-major, each expert's in token order */
    int32_t *keep;      /* (N k) by list position: 1 if kept */
};

static moe_plan_scratch moe_plan_carve(void *scratch, int N, int E, int k) {
    int32_t *p = (int32_t *)scratch;
    const size_t nk = (size_t)N * k;
    moe_plan_scratch m;
    m.total = p;
    m.roff = p + 1;
    m.koff = m.roff + E + 1;
    m.rank = m.koff + E + 1;
    m.list = m.rank + nk;
    m.keep = m.list + nk;
    return m;
}

/* Exclusive prefix sum of v over the block (blockDim.x == MOE_SCAN_THREADS)
 * through sh; *total receives the block's sum. Every thread must call it. */
__device__ __forceinline__ int moe_block_scan(int v, int *sh, int *total) {
    const int tid = threadIdx.x;
    sh[tid] = v;
    __syncthreads();
    for (int o = 1; o < (int)blockDim.x; o <<= 1) {
        const int x = tid >= o ? sh[tid - o] : 0;
        __syncthreads();
        sh[tid] += x;
        __syncthreads();
    }
    const int incl = sh[tid];
    *total = sh[blockDim.x - 1];
    __syncthreads(); /* sh is reused by the next call */
    return incl - v;
}

/* 1. Block per expert (strided): rank of each of its assignments in token
 * order (the flat index t k + j is that order), routed and count. */
__global__ void moe_plan_count_kernel(int32_t *rank, int32_t *routed, int32_t *count,
                                      const int32_t *expert, int nk, int E, int cap) {
    __shared__ int sh[MOE_SCAN_THREADS];
    for (int e = blockIdx.x; e < E; e += gridDim.x) {
        int carry = 0;
        for (int base = 0; base < nk; base += blockDim.x) {
            const int a = base + threadIdx.x;
            const int f = a < nk && expert[a] == e;
            int tot;
            const int ex = moe_block_scan(f, sh, &tot);
            if (f)
                rank[a] = carry + ex;
            carry += tot;
        }
        if (threadIdx.x == 0) {
            routed[e] = carry;
            count[e] = carry < cap ? carry : cap;
        }
    }
}

/* 2. One thread: exclusive prefix sums over the experts. */
__global__ void moe_plan_offsets_kernel(moe_plan_scratch m, const int32_t *routed,
                                        const int32_t *count, int E) {
    if (blockIdx.x != 0 || threadIdx.x != 0)
        return;
    m.roff[0] = m.koff[0] = 0;
    for (int e = 0; e < E; e++) {
        m.roff[e + 1] = m.roff[e] + routed[e];
        m.koff[e + 1] = m.koff[e] + count[e];
    }
    m.total[0] = m.koff[E];
}

/* 3. Per assignment: its place in its expert's list. Assignments to no
 * expert in [0, E) are left out (the CPU twin ignores them too). */
__global__ void moe_plan_list_kernel(moe_plan_scratch m, const int32_t *expert, size_t nk,
                                     int E) {
    GRID_STRIDE(a, nk) {
        const int32_t e = expert[a];
        if (e >= 0 && e < E)
            m.list[m.roff[e] + m.rank[a]] = (int32_t)a;
    }
}

/* 4. Per assignment: kept when its expert is not over-full, else when fewer
 * than cap of the expert's assignments precede it in priority. */
__global__ void moe_plan_keep_kernel(moe_plan_scratch m, const int32_t *expert,
                                     const float *probs, const int32_t *routed, size_t nk, int E,
                                     int k, int cap) {
    GRID_STRIDE(a, nk) {
        const int32_t e = expert[a];
        if (e < 0 || e >= E)
            continue;
        const int n = routed[e], first = m.roff[e];
        int keep = 1;
        if (n > cap) {
            const float p = probs[(a / k) * E + e];
            int before = 0;
            for (int i = first; i < first + n; i++) {
                const int32_t b = m.list[i];
                const float q = probs[(size_t)(b / k) * E + e];
                before += q > p || (q == p && (size_t)b < a);
            }
            keep = before < cap;
        }
        m.keep[first + m.rank[a]] = keep;
    }
}

/* 5. Block per expert (strided): the kept, in token order, take the
 * expert's rows; the dropped get slot -1. */
__global__ void moe_plan_pack_kernel(int32_t *slot, int32_t *rows, moe_plan_scratch m,
                                     const int32_t *routed, int E, int k) {
    __shared__ int sh[MOE_SCAN_THREADS];
    for (int e = blockIdx.x; e < E; e += gridDim.x) {
        const int n = routed[e], first = m.roff[e], row0 = m.koff[e];
        int carry = 0;
        for (int base = 0; base < n; base += blockDim.x) {
            const int i = base + threadIdx.x;
            const int f = i < n ? m.keep[first + i] : 0;
            int tot;
            const int ex = moe_block_scan(f, sh, &tot);
            if (i < n) {
                const int32_t a = m.list[first + i];
                if (f) {
                    slot[a] = row0 + carry + ex;
                    rows[row0 + carry + ex] = a / k;
                } else {
                    slot[a] = -1;
                }
            }
            carry += tot;
        }
    }
}

extern "C" int loco_cuda_moe_plan(int32_t *slot, int32_t *rows, int32_t *count, int32_t *routed,
                                  const int32_t *expert, const float *probs, int N, int E, int k,
                                  int cap, void *scratch, loco_stream s) {
    LOCO_CHECK(moe_check("moe_plan", N, E, k));
    if (cap < 0)
        return LOCO_ERR(LOCO_EINVAL, "moe_plan: capacity %d", cap);
    const moe_plan_scratch m = moe_plan_carve(scratch, N, E, k);
    const size_t nk = (size_t)N * k;
    if (nk > (size_t)INT32_MAX)
        return LOCO_ERR(LOCO_EINVAL, "moe_plan: N k = %zu assignments", nk);
    moe_plan_count_kernel<<<E, MOE_SCAN_THREADS, 0, s>>>(m.rank, routed, count, expert, (int)nk,
                                                         E, cap);
    CUDA_LAUNCHED("moe_plan (count)");
    moe_plan_offsets_kernel<<<1, 1, 0, s>>>(m, routed, count, E);
    CUDA_LAUNCHED("moe_plan (offsets)");
    if (nk == 0)
        return 0;
    moe_plan_list_kernel<<<grid_for(nk, MOE_THREADS), MOE_THREADS, 0, s>>>(m, expert, nk, E);
    CUDA_LAUNCHED("moe_plan (list)");
    moe_plan_keep_kernel<<<grid_for(nk, MOE_THREADS), MOE_THREADS, 0, s>>>(m, expert, probs,
                                                                           routed, nk, E, k, cap);
    CUDA_LAUNCHED("moe_plan (keep)");
    moe_plan_pack_kernel<<<E, MOE_SCAN_THREADS, 0, s>>>(slot, rows, m, routed, E, k);
    CUDA_LAUNCHED("moe_plan (pack)");
    return 0;
}

/* ------------------------------------------------------ dispatch, combine */

__global__ void moe_gather_kernel(float *out, const float *x, const int32_t *rows, int C,
                                  size_t n) {
    GRID_STRIDE(i, n) out[i] = x[(size_t)rows[i / C] * C + i % C];
}

/* One thread per (token, channel), the choices in order. */
__global__ void moe_gather_bwd_kernel(float *dx, const float *dxe, const int32_t *slot, int k,
                                      int C, size_t n) {
    GRID_STRIDE(i, n) {
        const size_t t = i / C, c = i % C;
        float acc = dx[i];
        for (int j = 0; j < k; j++) {
            const int32_t r = slot[t * k + j];
            if (r >= 0)
                acc += dxe[(size_t)r * C + c];
        }
        dx[i] = acc;
    }
}

/* One thread per (token, channel); unfused multiply-adds, as the CPU's. */
__global__ void moe_combine_kernel(float *out, const float *y, const int32_t *slot,
                                   const float *weight, int k, int C, size_t n) {
    GRID_STRIDE(i, n) {
        const size_t t = i / C, c = i % C;
        float acc = 0.0f;
        for (int j = 0; j < k; j++) {
            const int32_t r = slot[t * k + j];
            if (r >= 0)
                acc = __fadd_rn(acc, __fmul_rn(weight[t * k + j], y[(size_t)r * C + c]));
        }
        out[i] = acc;
    }
}

/* A warp per assignment: its dy row and dweight (a double dot product, the
 * lanes' partial sums combined by a fixed shuffle tree). The loop over
 * assignments has the same trip count for the whole block. */
__global__ void moe_combine_bwd_kernel(float *dy, float *dweight, const float *dout,
                                       const float *y, const int32_t *slot, const float *weight,
                                       int k, int C, size_t nk) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (size_t base = (size_t)blockIdx.x * MOE_WARPS; base < nk;
         base += (size_t)gridDim.x * MOE_WARPS) {
        const size_t a = base + warp;
        const int32_t r = a < nk ? slot[a] : -1;
        double dot = 0;
        if (r >= 0) {
            const float w = weight[a], *g = dout + (a / k) * C, *in = y + (size_t)r * C;
            float *o = dy + (size_t)r * C;
            for (int c = lane; c < C; c += 32) {
                o[c] = w * g[c];
                dot += (double)g[c] * in[c];
            }
        }
        dot = warp_sum(dot);
        if (lane == 0 && a < nk)
            dweight[a] = r >= 0 ? (float)dot : 0.0f;
    }
}

extern "C" int loco_cuda_moe_gather(float *out, const float *x, const int32_t *rows, int n, int C,
                                    loco_stream s) {
    const size_t m = (size_t)(n > 0 ? n : 0) * (C > 0 ? C : 0);
    if (!m)
        return 0;
    moe_gather_kernel<<<grid_for(m, MOE_THREADS), MOE_THREADS, 0, s>>>(out, x, rows, C, m);
    CUDA_LAUNCHED("moe_gather");
    return 0;
}

extern "C" int loco_cuda_moe_gather_bwd(float *dx, const float *dxe, const int32_t *slot, int N,
                                        int k, int C, loco_stream s) {
    const size_t m = (size_t)(N > 0 ? N : 0) * (C > 0 ? C : 0);
    if (!m || k <= 0)
        return 0;
    moe_gather_bwd_kernel<<<grid_for(m, MOE_THREADS), MOE_THREADS, 0, s>>>(dx, dxe, slot, k, C,
                                                                            m);
    CUDA_LAUNCHED("moe_gather_bwd");
    return 0;
}

extern "C" int loco_cuda_moe_combine(float *out, const float *y, const int32_t *slot,
                                     const float *weight, int N, int k, int C, loco_stream s) {
    const size_t m = (size_t)(N > 0 ? N : 0) * (C > 0 ? C : 0);
    if (!m)
        return 0;
    moe_combine_kernel<<<grid_for(m, MOE_THREADS), MOE_THREADS, 0, s>>>(out, y, slot, weight,
                                                                         k < 0 ? 0 : k, C, m);
    CUDA_LAUNCHED("moe_combine");
    return 0;
}

extern "C" int loco_cuda_moe_combine_bwd(float *dy, float *dweight, const float *dout,
                                         const float *y, const int32_t *slot, const float *weight,
                                         int N, int k, int C, loco_stream s) {
    const size_t nk = (size_t)(N > 0 ? N : 0) * (k > 0 ? k : 0);
    if (!nk)
        return 0;
    moe_combine_bwd_kernel<<<grid_for(nk, MOE_WARPS), MOE_WARPS * 32, 0, s>>>(
        dy, dweight, dout, y, slot, weight, k, C < 0 ? 0 : C, nk);
    CUDA_LAUNCHED("moe_combine_bwd");
    return 0;
}

/* ----------------------------------------------------------------- losses */

/* One block: P_e for each expert in turn and the sum of lse^2, each a block
 * sum in double in a fixed order; thread 0 combines them in expert order. */
__global__ void moe_losses_kernel(double *aux, double *z, const float *probs, const float *lse,
                                  const int32_t *routed, int N, int E, int k) {
    __shared__ double shm[32];
    double a = 0;
    for (int e = 0; e < E; e++) {
        double P = 0;
        for (int t = threadIdx.x; t < N; t += blockDim.x)
            P += probs[(size_t)t * E + e];
        P = block_sum(P, shm);
        a += (double)routed[e] / ((double)N * k) * (P / N);
    }
    double zz = 0;
    for (int t = threadIdx.x; t < N; t += blockDim.x)
        zz += (double)lse[t] * lse[t];
    zz = block_sum(zz, shm);
    if (threadIdx.x == 0) {
        *aux = E * a;
        *z = zz / N;
    }
}

extern "C" int loco_cuda_moe_losses(double *aux, double *z, const float *probs, const float *lse,
                                    const int32_t *routed, int N, int E, int k, loco_stream s) {
    LOCO_CHECK(moe_check("moe_losses", N, E, k));
    moe_losses_kernel<<<1, MOE_LOSS_THREADS, 0, s>>>(aux, z, probs, lse, routed, N, E, k);
    CUDA_LAUNCHED("moe_losses");
    return 0;
}

/* ---------------------------------------------------------- router backward */

/* One thread per token, the CPU twin's arithmetic step for step. */
__global__ void moe_route_bwd_kernel(float *dlogits, const float *dweight, const float *probs,
                                     const float *lse, const int32_t *expert,
                                     const float *weight, const int32_t *routed, int N, int E,
                                     int k, float aux, float z, float scale) {
    GRID_STRIDE(t, (size_t)N) {
        const float *p = probs + t * E;
        const int32_t *ex = expert + t * k;
        const float *w = weight + t * k, *dw = dweight + t * k;
        float *dl = dlogits + t * E;
        for (int e = 0; e < E; e++)
            dl[e] = scale * aux * (float)E * ((float)routed[e] / ((float)N * (float)k)) / (float)N;
        double S = 0, wdw = 0;
        for (int j = 0; j < k; j++) {
            S += p[ex[j]];
            wdw += (double)w[j] * dw[j];
        }
        for (int j = 0; j < k; j++)
            dl[ex[j]] += (float)((dw[j] - wdw) / S);
        double dot = 0;
        for (int e = 0; e < E; e++)
            dot += (double)dl[e] * p[e];
        const float zg = scale * z * 2.0f * lse[t] / (float)N;
        for (int e = 0; e < E; e++)
            dl[e] = p[e] * (dl[e] - (float)dot) + zg * p[e];
    }
}

extern "C" int loco_cuda_moe_route_bwd(float *dlogits, const float *dweight, const float *probs,
                                       const float *lse, const int32_t *expert,
                                       const float *weight, const int32_t *routed, int N, int E,
                                       int k, float aux, float z, float scale, loco_stream s) {
    LOCO_CHECK(moe_check("moe_route_bwd", N, E, k));
    if (N == 0)
        return 0;
    moe_route_bwd_kernel<<<grid_for((size_t)N, MOE_THREADS), MOE_THREADS, 0, s>>>(
        dlogits, dweight, probs, lse, expert, weight, routed, N, E, k, aux, z, scale);
    CUDA_LAUNCHED("moe_route_bwd");
    return 0;
}
