/* Linear layers (HF Conv1D layout) through OpenBLAS. cblas is only ever
 * called outside OpenMP regions: the pthreads OpenBLAS runs its own pool. */
#include <cblas.h>

#include "kernels/kernels.h"

/* Output columns per task in the dbias reduction; rows are summed in order
 * into double accumulators, independent of the thread count. */
enum { MM_BIAS_COL_BLOCK = 256 };

void loco_matmul_fwd(float *restrict out, const float *restrict inp,
                     const float *restrict w, const float *restrict bias,
                     int N, int C, int OC, bool w_transposed)
{
    float beta = 0.0f;
    if (bias) {
#pragma omp parallel for schedule(static) if ((long)N * OC > 16384)
        for (int n = 0; n < N; n++) {
            float *restrict o = out + (size_t)n * OC;
            for (int j = 0; j < OC; j++)
                o[j] = bias[j];
        }
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans,
                w_transposed ? CblasTrans : CblasNoTrans, N, OC, C, 1.0f, inp,
                C, w, w_transposed ? C : OC, beta, out, OC);
}

static void bias_bwd(float *restrict dbias, const float *restrict dout, int N,
                     int OC)
{
    const int nblk = (OC + MM_BIAS_COL_BLOCK - 1) / MM_BIAS_COL_BLOCK;
#pragma omp parallel for schedule(static) if ((long)N * OC > 16384)
    for (int blk = 0; blk < nblk; blk++) {
        const int j0 = blk * MM_BIAS_COL_BLOCK;
        const int nj = j0 + MM_BIAS_COL_BLOCK < OC ? MM_BIAS_COL_BLOCK
                                                   : OC - j0;
        double acc[MM_BIAS_COL_BLOCK] = {0};
        for (int n = 0; n < N; n++) {
            const float *restrict d = dout + (size_t)n * OC + j0;
            for (int j = 0; j < nj; j++)
                acc[j] += d[j];
        }
        for (int j = 0; j < nj; j++)
            dbias[j0 + j] += (float)acc[j];
    }
}

void loco_matmul_bwd(float *restrict dinp, float *restrict dw,
                     float *restrict dbias, const float *restrict dout,
                     const float *restrict inp, const float *restrict w,
                     int N, int C, int OC, bool w_transposed)
{
    if (dinp) {
        /* dinp (N,C) += dout (N,OC) @ W^T */
        cblas_sgemm(CblasRowMajor, CblasNoTrans,
                    w_transposed ? CblasNoTrans : CblasTrans, N, C, OC, 1.0f,
                    dout, OC, w, w_transposed ? C : OC, 1.0f, dinp, C);
    }
    if (dw) {
        if (w_transposed) /* dw (OC,C) += dout^T @ inp */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N,
                        1.0f, dout, OC, inp, C, 1.0f, dw, C);
        else /* dw (C,OC) += inp^T @ dout */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, C, OC, N,
                        1.0f, inp, C, dout, OC, 1.0f, dw, OC);
    }
    if (dbias)
        bias_bwd(dbias, dout, N, OC);
}
