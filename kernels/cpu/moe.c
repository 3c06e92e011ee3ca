/* Mixture-of-experts routing, dispatch and combine (kernels.h, "mixture of
 * experts"). Deterministic: every output element has one writer and a
 * fixed order of summation; the capacity decision is a stable order by
 * router probability, ties by token position, then by choice. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/cpu/vmath.h"

void loco_moe_route(float *probs, float *lse, int32_t *expert, float *weight, const float *logits,
                    const float *bias, int N, int E, int k) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N; t++) {
        const float *in = logits + (size_t)t * E;
        float *p = probs + (size_t)t * E;
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
        /* top-k by selection: the largest score not yet taken, lower index
         * first; the score is the probability plus the bias */
        int32_t *ex = expert + (size_t)t * k;
        float *w = weight + (size_t)t * k;
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

/* One assignment (token t's j-th choice) competing for an expert's slots. */
typedef struct {
    float p;
    int32_t t, j;
} assignment;

static int by_priority(const void *a, const void *b) {
    const assignment *x = a, *y = b;
    if (x->p != y->p)
        return x->p > y->p ? -1 : 1;
    if (x->t != y->t)
        return x->t < y->t ? -1 : 1;
    return x->j < y->j ? -1 : x->j > y->j;
}

static int by_token(const void *a, const void *b) {
    const assignment *x = a, *y = b;
    if (x->t != y->t)
        return x->t < y->t ? -1 : 1;
    return x->j < y->j ? -1 : x->j > y->j;
}

int loco_moe_plan(int32_t *slot, int32_t *rows, int32_t *count, int32_t *routed,
                  const int32_t *expert, const float *probs, int N, int E, int k, int cap,
                  void *scratch) {
    assignment *a = scratch; /* N k, bucketed by expert, each in token order */
    for (int e = 0; e < E; e++)
        routed[e] = 0;
    for (size_t i = 0; i < (size_t)N * k; i++)
        routed[expert[i]]++;
    for (int e = 0, at = 0; e < E; at += routed[e++])
        count[e] = at; /* fill cursors first, the kept rows at the end */
    for (int t = 0; t < N; t++)
        for (int j = 0; j < k; j++) {
            const int e = expert[(size_t)t * k + j];
            a[count[e]++] = (assignment){probs[(size_t)t * E + e], t, j};
        }
    int total = 0;
    for (int e = 0; e < E; e++) {
        assignment *b = a + (count[e] - routed[e]);
        int n = routed[e];
        if (n > cap) { /* the most probable keep their slots */
            qsort(b, (size_t)n, sizeof *b, by_priority);
            for (int i = cap; i < n; i++)
                slot[(size_t)b[i].t * k + b[i].j] = -1;
            n = cap;
            qsort(b, (size_t)n, sizeof *b, by_token);
        }
        for (int i = 0; i < n; i++) {
            slot[(size_t)b[i].t * k + b[i].j] = total + i;
            rows[total + i] = b[i].t;
        }
        count[e] = n;
        total += n;
    }
    return total;
}

void loco_moe_gather(float *out, const float *x, const int32_t *rows, int n, int C) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < n; r++)
        memcpy(out + (size_t)r * C, x + (size_t)rows[r] * C, (size_t)C * sizeof(float));
}

void loco_moe_gather_bwd(float *dx, const float *dxe, const int32_t *slot, int N, int k, int C) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N; t++)
        for (int j = 0; j < k; j++) {
            const int32_t s = slot[(size_t)t * k + j];
            if (s < 0)
                continue;
            float *o = dx + (size_t)t * C;
            const float *in = dxe + (size_t)s * C;
#pragma omp simd
            for (int c = 0; c < C; c++)
                o[c] += in[c];
        }
}

void loco_moe_combine(float *out, const float *y, const int32_t *slot, const float *weight, int N,
                      int k, int C) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N; t++) {
        float *o = out + (size_t)t * C;
        memset(o, 0, (size_t)C * sizeof(float));
        for (int j = 0; j < k; j++) {
            const int32_t s = slot[(size_t)t * k + j];
            if (s < 0)
                continue; /* dropped: the residual passes through */
            const float w = weight[(size_t)t * k + j], *in = y + (size_t)s * C;
#pragma omp simd
            for (int c = 0; c < C; c++)
                o[c] += w * in[c];
        }
    }
}

void loco_moe_combine_bwd(float *dy, float *dweight, const float *dout, const float *y,
                          const int32_t *slot, const float *weight, int N, int k, int C) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N; t++)
        for (int j = 0; j < k; j++) {
            const int32_t s = slot[(size_t)t * k + j];
            if (s < 0) {
                dweight[(size_t)t * k + j] = 0;
                continue;
            }
            const float w = weight[(size_t)t * k + j], *g = dout + (size_t)t * C;
            const float *in = y + (size_t)s * C;
            float *o = dy + (size_t)s * C;
            double dot = 0;
            for (int c = 0; c < C; c++) {
                o[c] = w * g[c];
                dot += (double)g[c] * in[c];
            }
            dweight[(size_t)t * k + j] = (float)dot;
        }
}

void loco_moe_losses(double *aux, double *z, const float *probs, const float *lse,
                     const int32_t *routed, int N, int E, int k) {
    double a = 0, zz = 0;
    for (int e = 0; e < E; e++) {
        double P = 0;
        for (int t = 0; t < N; t++)
            P += probs[(size_t)t * E + e];
        a += (double)routed[e] / ((double)N * k) * (P / N);
    }
    for (int t = 0; t < N; t++)
        zz += (double)lse[t] * lse[t];
    *aux = E * a;
    *z = zz / N;
}

void loco_moe_route_bwd(float *dlogits, const float *dweight, const float *probs, const float *lse,
                        const int32_t *expert, const float *weight, const int32_t *routed, int N,
                        int E, int k, float aux, float z, float scale) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N; t++) {
        const float *p = probs + (size_t)t * E;
        const int32_t *ex = expert + (size_t)t * k;
        const float *w = weight + (size_t)t * k, *dw = dweight + (size_t)t * k;
        float *dl = dlogits + (size_t)t * E;
        /* d(probabilities): the aux loss's (alpha E f_e / N) ... */
        for (int e = 0; e < E; e++)
            dl[e] = scale * aux * (float)E * ((float)routed[e] / ((float)N * (float)k)) / (float)N;
        /* ... and the renormalised weights': w_j = p_j / S over the chosen */
        double S = 0, wdw = 0;
        for (int j = 0; j < k; j++) {
            S += p[ex[j]];
            wdw += (double)w[j] * dw[j];
        }
        for (int j = 0; j < k; j++)
            dl[ex[j]] += (float)((dw[j] - wdw) / S);
        /* through the softmax */
        double dot = 0;
        for (int e = 0; e < E; e++)
            dot += (double)dl[e] * p[e];
        const float zg = scale * z * 2.0f * lse[t] / (float)N;
        for (int e = 0; e < E; e++)
            dl[e] = p[e] * (dl[e] - (float)dot) + zg * p[e];
    }
}
