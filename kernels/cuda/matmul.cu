/* Linear layers (HF Conv1D layout) through cuBLASLt.
 *
 * cuBLASLt is column-major: a row-major (R, K) matrix is a column-major
 * (K, R) one. So out (N,OC) = inp (N,C) @ W is computed as the column-major
 * out^T (OC,N) = W^T (OC,C) . inp^T (C,N), where W stored (C,OC) row-major
 * already is W^T column-major (op N), and w stored (OC,C) for the tied head
 * is W column-major (op T). Bias and GELU go in the GEMM's epilogue; the
 * bias gradient comes from the weight-gradient GEMM's epilogue (BGRADA /
 * BGRADB: a sum over the GEMM's k = N rows of dout) into a scratch that
 * is then added (the epilogue overwrites, gradients accumulate); without
 * a weight gradient, or where cuBLASLt offers no such epilogue, from a
 * column sum of our own. The descriptors, layouts and the
 * heuristic's algorithm are built once per GEMM key and cached in the
 * handle (plan_get).
 *
 * Why one file: the cuBLASLt library, its handle, the plan cache and the
 * GEMMs that use them are one thing; the emulator translates it whole. */
#include <cublasLt.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/common.cuh"

/* The handle's device memory is BLAS_WORKSPACE bytes: cuBLASLt's workspace,
 * then BGRAD_MAX floats where a bias-gradient epilogue writes (it
 * overwrites; matmul_bwd adds them to dbias). */
enum {
    BLAS_WORKSPACE = 32 << 20,
    BGRAD_MAX = 64 << 10,
    GEMM_WORKSPACE = BLAS_WORKSPACE - BGRAD_MAX * 4,
    BIAS_COLS = 32,
    BIAS_ROW_LANES = 32,
    BIAS_ADD_THREADS = 256,
    PLAN_SLOTS = 64
};

/* What cuBLASLt's choice of algorithm depends on for one GEMM: shape,
 * ops, leading dimensions, types, epilogue, and the alignment of every
 * pointer it is told about (the heuristic reads A, B, D's from the
 * preference, the bias and aux pointers' from the descriptor; 0 = no such
 * pointer). Not the pointers themselves: the bias and aux pointers are
 * set on the descriptor before each call, A, B and D are cublasLtMatmul's
 * arguments. Built zeroed, so that memcmp compares it. */
typedef struct {
    int32_t m, n, k, lda, ldb, ldd, ldaux;
    int32_t ab, dt, epi, ta, tb;
    uint32_t al_a, al_b, al_d, al_bias, al_aux;
} plan_key;

/* One cached GEMM plan: the descriptor, the three layouts (C is D) and the
 * heuristic's algorithm. found = false remembers that cuBLASLt offers
 * nothing for the key (the fused GELU's fallback then asks only once). */
typedef struct {
    plan_key key;
    bool used, found;
    uint64_t last; /* h->tick at the last use: the least recent is evicted */
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulAlgo_t algo;
} plan;

/* The handle owns its plans (PLAN_SLOTS of them, a linear scan: far
 * cheaper than one heuristic query) and mutates a cached descriptor's
 * pointers before each call, so it is as thread-safe as it was: one
 * thread and one stream at a time (kernels.h). */
struct loco_blas {
    cublasLtHandle_t lt;
    void *workspace; /* BLAS_WORKSPACE bytes: GEMM_WORKSPACE, then BGRAD_MAX floats */
    plan plans[PLAN_SLOTS];
    uint64_t tick, hits, misses;
};

/* cuBLASLt is opened on first use (dlopen), not linked: loading it runs
 * ~0.4 s of initialisation in every process that links it, and most loco
 * processes (CPU runs, coordinators, every test's child) never multiply
 * on a GPU. The kernel emulator (tests/gpu/emu) defines
 * LOCO_CUBLASLT_LINKED and binds its reference functions directly. */
#define LT_FUNCS(X)                                                                      \
    X(Create, cublasLtCreate) \
    X(Destroy, cublasLtDestroy) \
    X(Matmul, cublasLtMatmul) \
    X(MatmulAlgoGetHeuristic, cublasLtMatmulAlgoGetHeuristic) \
    X(MatmulDescCreate, cublasLtMatmulDescCreate) \
    X(MatmulDescDestroy, cublasLtMatmulDescDestroy) \
    X(MatmulDescSetAttribute, cublasLtMatmulDescSetAttribute) \
    X(MatmulPreferenceCreate, cublasLtMatmulPreferenceCreate) \
    X(MatmulPreferenceDestroy, cublasLtMatmulPreferenceDestroy) \
    X(MatmulPreferenceSetAttribute, cublasLtMatmulPreferenceSetAttribute) \
    X(MatrixLayoutCreate, cublasLtMatrixLayoutCreate) \
    X(MatrixLayoutDestroy, cublasLtMatrixLayoutDestroy)

#define LT_FIELD(f, name) decltype(&name) f;
static struct {
    LT_FUNCS(LT_FIELD)
} lt;
#undef LT_FIELD

#if defined(LOCO_CUBLASLT_LINKED)
static int lt_load(void) {
#define LT_BIND(f, name) lt.f = name;
    LT_FUNCS(LT_BIND)
#undef LT_BIND
    return 0;
}
#else
#define LT_STR2(x) #x
#define LT_STR(x) LT_STR2(x)
static pthread_once_t lt_once = PTHREAD_ONCE_INIT;
static char lt_why[256];

static void lt_open(void) {
    const char *names[] = {"libcublasLt.so." LT_STR(CUBLAS_VER_MAJOR), "libcublasLt.so"};
    void *so = NULL;
    for (size_t i = 0; i < sizeof names / sizeof *names && !so; i++)
        so = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!so) {
        snprintf(lt_why, sizeof lt_why, "cannot open libcublasLt.so." LT_STR(CUBLAS_VER_MAJOR)
                 ": %s", dlerror());
        return;
    }
#define LT_BIND(f, name)                                                                 \
    if (!(lt.f = (decltype(&name))dlsym(so, #name))) {                                   \
        snprintf(lt_why, sizeof lt_why, "libcublasLt has no %s", #name);                \
        return;                                                                          \
    }
    LT_FUNCS(LT_BIND)
#undef LT_BIND
}

/* 0 once every function is bound; the reason otherwise (every call). */
static int lt_load(void) {
    pthread_once(&lt_once, lt_open);
    if (lt_why[0])
        return LOCO_ERR(LOCO_ECUDA, "cuBLASLt: %s", lt_why);
    return 0;
}
#endif

#define LT_CHECK(call)                                                                   \
    do {                                                                                 \
        cublasStatus_t st_ = (call);                                                     \
        if (st_ != CUBLAS_STATUS_SUCCESS) {                                              \
            rc = LOCO_ERR(LOCO_ECUDA, "%s: cuBLAS status %d", #call, (int)st_);          \
            goto out;                                                                    \
        }                                                                                \
    } while (0)

static void plan_free(plan *p) {
    if (p->ld)
        lt.MatrixLayoutDestroy(p->ld);
    if (p->lb)
        lt.MatrixLayoutDestroy(p->lb);
    if (p->la)
        lt.MatrixLayoutDestroy(p->la);
    if (p->op)
        lt.MatmulDescDestroy(p->op);
    memset(p, 0, sizeof *p);
}

extern "C" int loco_blas_create(loco_blas **out) {
    *out = NULL;
    const int rc = lt_load();
    if (rc)
        return rc;
    loco_blas *h = (loco_blas *)calloc(1, sizeof *h);
    if (!h)
        return LOCO_ERR(LOCO_ENOMEM, "cuBLASLt handle");
    const cublasStatus_t st = lt.Create(&h->lt);
    if (st != CUBLAS_STATUS_SUCCESS) {
        free(h);
        return LOCO_ERR(LOCO_ECUDA, "cublasLtCreate: cuBLAS status %d", (int)st);
    }
    const cudaError_t e = cudaMalloc(&h->workspace, BLAS_WORKSPACE);
    if (e != cudaSuccess) {
        lt.Destroy(h->lt);
        free(h);
        return LOCO_ERR(LOCO_ECUDA, "cuBLASLt workspace: cudaMalloc says %s",
                        cudaGetErrorString(e));
    }
    *out = h;
    return 0;
}

extern "C" void loco_blas_destroy(loco_blas *h) {
    if (!h)
        return;
    for (int i = 0; i < PLAN_SLOTS; i++)
        plan_free(&h->plans[i]);
    cudaFree(h->workspace);
    lt.Destroy(h->lt);
    free(h);
}

extern "C" void loco_blas_plan_stats(const loco_blas *h, uint64_t *hits, uint64_t *misses) {
    *hits = h->hits;
    *misses = h->misses;
}

/* Largest power of two (at most 256) dividing the address; 0 for NULL. */
static uint32_t align_of(const void *p) {
    const uintptr_t a = (uintptr_t)p;
    uint32_t al = 256;
    if (!p)
        return 0;
    while (al > 1 && (a & (al - 1)))
        al >>= 1;
    return al;
}

/* One column-major GEMM: D (m,n) = op(A) (m,k) . op(B) (k,n) + beta D, with
 * an optional epilogue (bias of m entries, GELU with the pre-activation
 * written to aux). A and B of type ab, D of type dt. */
typedef struct {
    bool ta, tb;
    int m, n, k;
    const void *A, *B;
    void *D;
    int lda, ldb, ldd;
    cudaDataType_t ab, dt;
    float beta;
    cublasLtEpilogue_t epi;
    const void *bias;
    void *aux;
    int ldaux;
} gemm_args;

static plan_key key_of(const gemm_args *g) {
    plan_key k;
    memset(&k, 0, sizeof k);
    k.m = g->m;
    k.n = g->n;
    k.k = g->k;
    k.lda = g->lda;
    k.ldb = g->ldb;
    k.ldd = g->ldd;
    k.ldaux = g->aux ? g->ldaux : 0;
    k.ab = (int32_t)g->ab;
    k.dt = (int32_t)g->dt;
    k.epi = (int32_t)g->epi;
    k.ta = g->ta;
    k.tb = g->tb;
    k.al_a = align_of(g->A);
    k.al_b = align_of(g->B);
    k.al_d = align_of(g->D);
    k.al_bias = align_of(g->bias);
    k.al_aux = align_of(g->aux);
    return k;
}

/* Fills p (free) for g: descriptor, layouts, and the heuristic's answer
 * (p->found = false when it has none). On failure p is left free. */
static int plan_build(loco_blas *h, plan *p, const plan_key *key, const gemm_args *g) {
    int rc = 0, found = 0;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t heur;
    cublasStatus_t hst;
    const cublasOperation_t ta = g->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t tb = g->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    const uint64_t ws = GEMM_WORKSPACE;
    const uint32_t al_c = key->al_d; /* C is D */

    memset(&heur, 0, sizeof heur);
    LT_CHECK(lt.MatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT_CHECK(lt.MatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT_CHECK(lt.MatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (g->epi != CUBLASLT_EPILOGUE_DEFAULT) {
        LT_CHECK(lt.MatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &g->epi,
                                                sizeof g->epi));
    }
    /* the heuristic reads the bias and aux pointers' alignment from here */
    if (g->bias) {
        LT_CHECK(lt.MatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                &g->bias, sizeof g->bias));
    }
    if (g->aux) {
        const int64_t ldaux = g->ldaux;
        LT_CHECK(lt.MatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                &g->aux, sizeof g->aux));
        LT_CHECK(lt.MatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                &ldaux, sizeof ldaux));
    }
    LT_CHECK(lt.MatrixLayoutCreate(&p->la, g->ab, g->ta ? g->k : g->m, g->ta ? g->m : g->k,
                                        g->lda));
    LT_CHECK(lt.MatrixLayoutCreate(&p->lb, g->ab, g->tb ? g->n : g->k, g->tb ? g->k : g->n,
                                        g->ldb));
    LT_CHECK(lt.MatrixLayoutCreate(&p->ld, g->dt, g->m, g->n, g->ldd));
    LT_CHECK(lt.MatmulPreferenceCreate(&pref));
    LT_CHECK(lt.MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &ws, sizeof ws));
    LT_CHECK(lt.MatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &key->al_a, sizeof key->al_a));
    LT_CHECK(lt.MatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &key->al_b, sizeof key->al_b));
    LT_CHECK(lt.MatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof al_c));
    LT_CHECK(lt.MatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &key->al_d, sizeof key->al_d));
    h->misses++;
    hst = lt.MatmulAlgoGetHeuristic(h->lt, p->op, p->la, p->lb, p->ld, p->ld, pref, 1, &heur,
                                         &found);
    /* A status other than success (NOT_SUPPORTED: no heuristic for this
     * configuration) is, as found == 0, no algorithm: remembered, and
     * reported as LOCO_ENOTSUP by gemm. */
    p->key = *key;
    p->used = true;
    p->found = hst == CUBLAS_STATUS_SUCCESS && found > 0;
    p->algo = heur.algo;
out:
    if (pref)
        lt.MatmulPreferenceDestroy(pref);
    if (rc < 0)
        plan_free(p);
    return rc;
}

/* The plan for g: a cached one, or a new one in a free or the least
 * recently used slot. */
static int plan_get(loco_blas *h, const gemm_args *g, plan **out) {
    const plan_key key = key_of(g);
    plan *victim = &h->plans[0];
    h->tick++;
    for (int i = 0; i < PLAN_SLOTS; i++) {
        plan *p = &h->plans[i];
        if (p->used && memcmp(&p->key, &key, sizeof key) == 0) {
            p->last = h->tick;
            h->hits++;
            *out = p;
            return 0;
        }
        if (victim->used && (!p->used || p->last < victim->last))
            victim = p;
    }
    plan_free(victim);
    LOCO_CHECK(plan_build(h, victim, &key, g));
    victim->last = h->tick;
    *out = victim;
    return 0;
}

static int gemm(loco_blas *h, const gemm_args *g, loco_stream s) {
    int rc = 0;
    plan *p = NULL;
    const float alpha = 1.0f, beta = g->beta;
    LOCO_CHECK(plan_get(h, g, &p));
    if (!p->found)
        return LOCO_ERR(LOCO_ENOTSUP, "cuBLASLt has no algorithm for %dx%dx%d (epilogue %d)",
                        g->m, g->n, g->k, (int)g->epi);
    /* this call's pointers on the cached descriptor (its key fixed their
     * presence and alignment) */
    if (g->bias) {
        LT_CHECK(lt.MatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                &g->bias, sizeof g->bias));
    }
    if (g->aux) {
        LT_CHECK(lt.MatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                &g->aux, sizeof g->aux));
    }
    LT_CHECK(lt.Matmul(h->lt, p->op, &alpha, g->A, p->la, g->B, p->lb, &beta, g->D, p->ld,
                            g->D, p->ld, &p->algo, h->workspace, GEMM_WORKSPACE, s));
out:
    return rc;
}

template <typename T> static cudaDataType_t dtype_of();
template <> cudaDataType_t dtype_of<float>() { return CUDA_R_32F; }
template <> cudaDataType_t dtype_of<__nv_bfloat16>() { return CUDA_R_16BF; }

/* out^T (OC,N) = op(w) (OC,C) . inp^T (C,N) [+ bias] [GELU, pre in aux] */
template <typename T>
static int matmul_fwd(loco_blas *h, T *out, const T *inp, const T *w, const T *bias, int N, int C,
                      int OC, bool w_transposed, cublasLtEpilogue_t epi, T *aux,
                      loco_stream s) {
    gemm_args g = {};
    g.ta = w_transposed;
    g.tb = false;
    g.m = OC;
    g.n = N;
    g.k = C;
    g.A = w;
    g.lda = w_transposed ? C : OC;
    g.B = inp;
    g.ldb = C;
    g.D = out;
    g.ldd = OC;
    g.ab = g.dt = dtype_of<T>();
    g.beta = 0.0f;
    g.epi = epi;
    g.bias = bias;
    g.aux = aux;
    g.ldaux = OC;
    return gemm(h, &g, s);
}

/* dbias (OC) += column sums of dout (N,OC): lanes sum strided rows in
 * double, then are added in lane order (no atomics). */
template <typename T>
__global__ void bias_bwd_kernel(float *dbias, const T *dout, int N, int OC) {
    __shared__ double sh[BIAS_ROW_LANES][BIAS_COLS];
    const int j = blockIdx.x * BIAS_COLS + threadIdx.x, y = threadIdx.y;
    double acc = 0.0;
    if (j < OC)
        for (int n = y; n < N; n += BIAS_ROW_LANES)
            acc += (double)ld(dout + (size_t)n * OC + j);
    sh[y][threadIdx.x] = acc;
    __syncthreads();
    if (y != 0 || j >= OC)
        return;
    for (int k = 1; k < BIAS_ROW_LANES; k++)
        acc += sh[k][threadIdx.x];
    dbias[j] += (float)acc;
}

/* dbias (OC) += part (OC): the epilogue's bias gradient accumulated. */
__global__ void bias_add_kernel(float *dbias, const float *part, int OC) {
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < OC; j += gridDim.x * blockDim.x)
        dbias[j] += part[j];
}

/* The dw GEMM g with the bias gradient of dout (OC) in its epilogue, into
 * the handle's scratch, then added to dbias. 1 (nothing done) where
 * cuBLASLt has no such epilogue for g, or it failed: the caller runs g
 * plainly. */
static int gemm_bgrad(loco_blas *h, gemm_args *g, bool dout_is_a, float *dbias, int OC,
                      loco_stream s) {
    float *part = (float *)((char *)h->workspace + GEMM_WORKSPACE);
    g->epi = dout_is_a ? CUBLASLT_EPILOGUE_BGRADA : CUBLASLT_EPILOGUE_BGRADB;
    g->bias = part;
    const int rc = gemm(h, g, s);
    g->epi = CUBLASLT_EPILOGUE_DEFAULT;
    g->bias = NULL;
    if (rc < 0) { /* the plain GEMM reports a failure that is not the epilogue's */
        loco_err_clear();
        return 1;
    }
    bias_add_kernel<<<grid_for((size_t)OC, BIAS_ADD_THREADS), BIAS_ADD_THREADS, 0, s>>>(dbias,
                                                                                       part, OC);
    CUDA_LAUNCHED("matmul_bwd (dbias from the epilogue)");
    return 0;
}

template <typename T, typename G>
static int matmul_bwd(loco_blas *h, T *dinp, G *dw, float *dbias, const T *dout, const T *inp,
                      const T *w, int N, int C, int OC, bool w_transposed, loco_stream s) {
    if (dinp) { /* dinp^T (C,N) += op(w) (C,OC) . dout^T (OC,N) */
        gemm_args g = {};
        g.ta = !w_transposed;
        g.m = C;
        g.n = N;
        g.k = OC;
        g.A = w;
        g.lda = w_transposed ? C : OC;
        g.B = dout;
        g.ldb = OC;
        g.D = dinp;
        g.ldd = C;
        g.ab = g.dt = dtype_of<T>();
        g.beta = 1.0f;
        g.epi = CUBLASLT_EPILOGUE_DEFAULT;
        LOCO_CHECK(gemm(h, &g, s));
    }
    if (dw) {
        gemm_args g = {};
        if (w_transposed) { /* dw (OC,C) row-major = (C,OC) col-major: inp^T . dout */
            g.tb = true;
            g.m = C;
            g.n = OC;
            g.k = N;
            g.A = inp;
            g.lda = C;
            g.B = dout;
            g.ldb = OC;
            g.ldd = C;
        } else { /* dw (C,OC) row-major = (OC,C) col-major: dout^T . inp */
            g.tb = true;
            g.m = OC;
            g.n = C;
            g.k = N;
            g.A = dout;
            g.lda = OC;
            g.B = inp;
            g.ldb = C;
            g.ldd = OC;
        }
        g.D = dw;
        g.ab = dtype_of<T>();
        g.dt = dtype_of<G>();
        g.beta = 1.0f;
        g.epi = CUBLASLT_EPILOGUE_DEFAULT;
        int rc = 1;
        if (dbias && N > 0 && OC <= BGRAD_MAX)
            rc = gemm_bgrad(h, &g, !w_transposed, dbias, OC, s);
        LOCO_CHECK(rc);
        if (rc == 0)
            dbias = NULL; /* done */
        else
            LOCO_CHECK(gemm(h, &g, s));
    }
    if (dbias && N > 0) {
        const dim3 th(BIAS_COLS, BIAS_ROW_LANES);
        bias_bwd_kernel<T><<<(OC + BIAS_COLS - 1) / BIAS_COLS, th, 0, s>>>(dbias, dout, N, OC);
        CUDA_LAUNCHED("matmul_bwd (dbias)");
    }
    return 0;
}

/* The MLP projection's backward with GELU's gradient in the dinp GEMM's
 * epilogue (DGELU, pre = the forward's pre-activation as aux): dpre (N,C)
 * = gelu'(pre) * (dout . w), written (beta 0: neither the zeroing of a
 * dinp buffer nor the separate gelu_bwd pass over N x C); then dw and
 * dbias as matmul_bwd. Returns 1 with nothing written where cuBLASLt has
 * no such epilogue for the shape (aux's leading dimension must be a
 * multiple of 8). */
template <typename T>
static int matmul_bwd_dgelu(loco_blas *h, T *dpre, float *dw, float *dbias, const T *dout,
                            const T *inp, const T *w, const T *pre, int N, int C, int OC,
                            loco_stream s) {
    if (C % 8)
        return 1;
    gemm_args g = {};
    g.ta = true; /* dpre^T (C,N) = op(w) (C,OC) . dout^T (OC,N), as matmul_bwd's dinp */
    g.m = C;
    g.n = N;
    g.k = OC;
    g.A = w;
    g.lda = OC;
    g.B = dout;
    g.ldb = OC;
    g.D = dpre;
    g.ldd = C;
    g.ab = g.dt = dtype_of<T>();
    g.beta = 0.0f;
    g.epi = CUBLASLT_EPILOGUE_DGELU;
    g.aux = (void *)pre;
    g.ldaux = C;
    if (gemm(h, &g, s) < 0) {
        loco_err_clear();
        return 1;
    }
    return matmul_bwd<T, float>(h, NULL, dw, dbias, dout, inp, w, N, C, OC, false, s);
}

/* bf16: GELU in the epilogue when cuBLASLt offers it for this shape (its
 * aux output wants a leading dimension that is a multiple of 8). fp32, and
 * bf16 elsewhere: the bias GEMM into pre and our GELU (tanhf), so that the
 * fp32 twin stays within 1e-5 of the CPU whatever tanh the epilogue uses. */
template <typename T>
static int matmul_gelu_fwd(loco_blas *h, T *out, T *pre, const T *inp, const T *w, const T *bias,
                           int N, int C, int OC, bool fused, loco_stream s) {
    const cublasLtEpilogue_t epi =
        bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    if (fused && OC % 8 == 0 &&
        matmul_fwd<T>(h, out, inp, w, bias, N, C, OC, false, epi, pre, s) == 0)
        return 0;
    if (fused)
        loco_err_clear();
    LOCO_CHECK(matmul_fwd<T>(h, pre, inp, w, bias, N, C, OC, false,
                             bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT, NULL, s));
    return 1; /* the caller applies GELU */
}

extern "C" int loco_cuda_matmul_fwd(loco_blas *h, float *out, const float *inp, const float *w,
                                    const float *bias, int N, int C, int OC, bool w_transposed,
                                    loco_stream s) {
    return matmul_fwd<float>(h, out, inp, w, bias, N, C, OC, w_transposed,
                             bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT, NULL, s);
}

extern "C" int loco_cuda_matmul_fwd_bf16(loco_blas *h, loco_bf16 *out, const loco_bf16 *inp,
                                         const loco_bf16 *w, const loco_bf16 *bias, int N, int C,
                                         int OC, bool w_transposed, loco_stream s) {
    return matmul_fwd<__nv_bfloat16>(h, bf(out), bf(inp), bf(w), bias ? bf(bias) : NULL, N, C,
                                     OC, w_transposed,
                                     bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT,
                                     NULL, s);
}

extern "C" int loco_cuda_matmul_gelu_fwd(loco_blas *h, float *out, float *pre, const float *inp,
                                         const float *w, const float *bias, int N, int C, int OC,
                                         loco_stream s) {
    const int rc = matmul_gelu_fwd<float>(h, out, pre, inp, w, bias, N, C, OC, false, s);
    LOCO_CHECK(rc);
    return rc ? loco_cuda_gelu_fwd(out, pre, (size_t)N * OC, s) : 0;
}

extern "C" int loco_cuda_matmul_gelu_fwd_bf16(loco_blas *h, loco_bf16 *out, loco_bf16 *pre,
                                              const loco_bf16 *inp, const loco_bf16 *w,
                                              const loco_bf16 *bias, int N, int C, int OC,
                                              loco_stream s) {
    const int rc = matmul_gelu_fwd<__nv_bfloat16>(h, bf(out), bf(pre), bf(inp), bf(w),
                                                  bias ? bf(bias) : NULL, N, C, OC, true, s);
    LOCO_CHECK(rc);
    return rc ? loco_cuda_gelu_fwd_bf16(out, pre, (size_t)N * OC, s) : 0;
}

extern "C" int loco_cuda_matmul_bwd(loco_blas *h, float *dinp, float *dw, float *dbias,
                                    const float *dout, const float *inp, const float *w, int N,
                                    int C, int OC, bool w_transposed, loco_stream s) {
    return matmul_bwd<float, float>(h, dinp, dw, dbias, dout, inp, w, N, C, OC, w_transposed, s);
}

extern "C" int loco_cuda_matmul_bwd_bf16(loco_blas *h, loco_bf16 *dinp, float *dw, float *dbias,
                                         const loco_bf16 *dout, const loco_bf16 *inp,
                                         const loco_bf16 *w, int N, int C, int OC,
                                         bool w_transposed, loco_stream s) {
    return matmul_bwd<__nv_bfloat16, float>(h, dinp ? bf(dinp) : NULL, dw, dbias, bf(dout),
                                            bf(inp), bf(w), N, C, OC, w_transposed, s);
}

extern "C" int loco_cuda_matmul_bwd_dgelu_bf16(loco_blas *h, loco_bf16 *dpre, float *dw,
                                               float *dbias, const loco_bf16 *dout,
                                               const loco_bf16 *inp, const loco_bf16 *w,
                                               const loco_bf16 *pre, int N, int C, int OC,
                                               loco_stream s) {
    return matmul_bwd_dgelu<__nv_bfloat16>(h, bf(dpre), dw, dbias, bf(dout), bf(inp), bf(w),
                                           bf(pre), N, C, OC, s);
}
