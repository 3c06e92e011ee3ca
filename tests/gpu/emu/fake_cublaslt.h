#ifndef LOCO_GPU_EMU_FAKE_CUBLASLT_H
#define LOCO_GPU_EMU_FAKE_CUBLASLT_H
/* tests/gpu/emu: a host stand-in for the part of cuBLASLt that matmul.cu uses, implementing
 * the documented semantics: column-major layouts (rows, cols, ld) of the
 * stored matrices, op applied, D = alpha op(A) op(B) + beta C, epilogues
 * (bias, GELU with aux, DGELU: the result times GELU's gradient at aux; the
 * bias gradients BGRADA / BGRADB: the sum of
 * op(A)'s rows / op(B)'s columns over k, written to the bias pointer in
 * D's type, overwriting it).
 * It counts the heuristic queries and the live descriptor, layout and
 * preference objects, for the plan cache's test (tests/gpu, through the
 * extern "C" functions below, which only the emulator defines). */
#include <cstdio>
#include <cstdlib>
#include <cstring>
typedef int cublasStatus_t;
#define CUBLAS_STATUS_SUCCESS 0
typedef int cudaDataType_t;
#define CUDA_R_32F 0
#define CUDA_R_16BF 14
typedef int cublasComputeType_t;
#define CUBLAS_COMPUTE_32F 68
typedef int cublasOperation_t;
#define CUBLAS_OP_N 0
#define CUBLAS_OP_T 1
typedef int cublasLtEpilogue_t;
#define CUBLASLT_EPILOGUE_DEFAULT 1
#define CUBLASLT_EPILOGUE_BIAS 4
#define CUBLASLT_EPILOGUE_GELU_AUX 160
#define CUBLASLT_EPILOGUE_GELU_AUX_BIAS 164
#define CUBLASLT_EPILOGUE_DGELU 192
#define CUBLASLT_EPILOGUE_BGRADA 256
#define CUBLASLT_EPILOGUE_BGRADB 512
enum { CUBLASLT_MATMUL_DESC_TRANSA, CUBLASLT_MATMUL_DESC_TRANSB, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_MATMUL_DESC_BIAS_POINTER, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD };
enum { CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES };
struct LtH { int x; }; typedef LtH *cublasLtHandle_t;
struct Desc { int ta = 0, tb = 0, epi = CUBLASLT_EPILOGUE_DEFAULT; const void *bias = 0; void *aux = 0; long ldaux = 0; }; typedef Desc *cublasLtMatmulDesc_t;
struct Lay { int type; long rows, cols, ld; }; typedef Lay *cublasLtMatrixLayout_t;
struct Pref { int x; }; typedef Pref *cublasLtMatmulPreference_t;
struct cublasLtMatmulAlgo_t { int x; };
struct cublasLtMatmulHeuristicResult_t { cublasLtMatmulAlgo_t algo; };
static long g_lt_heuristics, g_lt_live;
extern "C" long loco_emu_lt_heuristics(void) { return g_lt_heuristics; }
extern "C" long loco_emu_lt_live_objects(void) { return g_lt_live; }
static inline cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) { *h = new LtH; return 0; }
static inline cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) { delete h; return 0; }
static inline cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, int, int) { *d = new Desc; g_lt_live++; return 0; }
static inline cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) { delete d; g_lt_live--; return 0; }
static inline cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, int a, const void *b, size_t n) {
  switch (a) { case CUBLASLT_MATMUL_DESC_TRANSA: memcpy(&d->ta, b, 4); break; case CUBLASLT_MATMUL_DESC_TRANSB: memcpy(&d->tb, b, 4); break;
  case CUBLASLT_MATMUL_DESC_EPILOGUE: memcpy(&d->epi, b, 4); break; case CUBLASLT_MATMUL_DESC_BIAS_POINTER: memcpy(&d->bias, b, sizeof(void *)); break;
  case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: memcpy(&d->aux, b, sizeof(void *)); break; case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: memcpy(&d->ldaux, b, 8); break; }
  return n ? 0 : 1; }
static inline cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType_t t, uint64_t r, uint64_t c, int64_t ld) { *l = new Lay{t, (long)r, (long)c, (long)ld}; g_lt_live++; return ld >= (long)r ? 0 : 7; }
static inline cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) { delete l; g_lt_live--; return 0; }
static inline cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) { *p = new Pref; g_lt_live++; return 0; }
static inline cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) { delete p; g_lt_live--; return 0; }
static inline cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t, int, const void *, size_t) { return 0; }
static inline cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatmulPreference_t, int, cublasLtMatmulHeuristicResult_t *, int *found) { g_lt_heuristics++; *found = 1; return 0; }
static inline double getv(const void *p, int type, long i) { if (type == CUDA_R_32F) return ((const float *)p)[i]; return __bfloat162float(((const __nv_bfloat16 *)p)[i]); }
static inline void setv(void *p, int type, long i, double v) { if (type == CUDA_R_32F) ((float *)p)[i] = (float)v; else ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn((float)v); }
static inline cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t d, const void *alpha, const void *A, cublasLtMatrixLayout_t la, const void *B, cublasLtMatrixLayout_t lb, const void *beta, const void *C, cublasLtMatrixLayout_t lc, void *D, cublasLtMatrixLayout_t ld, const cublasLtMatmulAlgo_t *, void *, size_t, void *) {
  const long m = ld->rows, n = ld->cols, k = d->ta ? la->rows : la->cols;
  if ((d->ta ? la->cols : la->rows) != m || (d->tb ? lb->rows : lb->cols) != n || (d->tb ? lb->cols : lb->rows) != k) { printf("SHAPE MISMATCH\n"); return 7; }
  const float al = *(const float *)alpha, be = *(const float *)beta;
  for (long j = 0; j < n; j++) for (long i = 0; i < m; i++) {
    double s = 0;
    for (long p = 0; p < k; p++) {
      const double a = d->ta ? getv(A, la->type, p + i * la->ld) : getv(A, la->type, i + p * la->ld);
      const double b = d->tb ? getv(B, lb->type, j + p * lb->ld) : getv(B, lb->type, p + j * lb->ld);
      s += a * b;
    }
    double v = al * s + (be != 0 ? be * getv(C, lc->type, i + j * lc->ld) : 0);
    if (d->epi == CUBLASLT_EPILOGUE_BIAS || d->epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) v += getv(d->bias, ld->type, i);
    if (d->epi == CUBLASLT_EPILOGUE_GELU_AUX || d->epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) {
      setv(d->aux, ld->type, i + j * d->ldaux, v);
      v = 0.5 * v * (1 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
    }
    if (d->epi == CUBLASLT_EPILOGUE_DGELU) { /* GELU's gradient at the pre-activation in aux */
      const double x = getv(d->aux, ld->type, i + j * d->ldaux), c = 0.7978845608028654;
      const double th = tanh(c * (x + 0.044715 * x * x * x));
      v *= 0.5 * (1 + th) + 0.5 * x * (1 - th * th) * c * (1 + 3 * 0.044715 * x * x);
    }
    setv(D, ld->type, i + j * ld->ld, v);
  }
  if (d->epi == CUBLASLT_EPILOGUE_BGRADA)
    for (long i = 0; i < m; i++) {
      double s = 0;
      for (long p = 0; p < k; p++) s += d->ta ? getv(A, la->type, p + i * la->ld) : getv(A, la->type, i + p * la->ld);
      setv((void *)d->bias, ld->type, i, s);
    }
  if (d->epi == CUBLASLT_EPILOGUE_BGRADB)
    for (long j = 0; j < n; j++) {
      double s = 0;
      for (long p = 0; p < k; p++) s += d->tb ? getv(B, lb->type, j + p * lb->ld) : getv(B, lb->type, p + j * lb->ld);
      setv((void *)d->bias, ld->type, j, s);
    }
  return 0;
}
#endif
