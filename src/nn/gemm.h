/*
 * gemm.h -- internal: zdp's own large-M single-precision GEMM (gemm.c), for
 * training's products (the linears and the lm_head, forward and backward).
 * nn.c's zdp_nn_sgemm_many_ calls it in place of cblas_sgemm for the
 * products it wins on (zdp_nn_gemm_wins_).
 */
#ifndef ZDP_NN_GEMM_H
#define ZDP_NN_GEMM_H

#include <stdint.h>

#include "nn.h"

/* C (M,N) = op(A) (M,K) @ op(B) (K,N)  [+ C when accumulate], row-major,
 * alpha 1; op = transposed when ta / tb is CblasTrans (then A is (K,M) at
 * lda, B (N,K) at ldb).  Single-threaded (the pool's tasks call it on
 * pieces).  Every element of C is one chain of fused multiply-adds in k order
 * (starting from C, or 0), so it does not depend on where a piece starts or
 * on M, N; the C path rounds the same where the compiler has FMA. */
ZDP_API void zdp_nn_gemm_compute(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K,
                         const float *A, int64_t lda, const float *B, int64_t ldb, int accumulate,
                         float *C, int64_t ldc);

/* The micro-kernel in use: 0 portable C, 1 AVX2+FMA, 2 AVX-512
 * (zdp_nn_isa() at first use). */
ZDP_API int zdp_nn_gemm_path(void);
/* Uses path min(want, the best the CPU has) from now on (tests compare the
 * paths); returns it.  Not while a product runs. */
ZDP_API int zdp_nn_gemm_use_path(int want);

/* Which products zdp_nn_sgemm_many_ gives to zdp_nn_gemm_compute: 0 none
 * (cblas_sgemm for all), 1 those whose shape it wins on (the default), 2 all
 * it can take (alpha 1, beta 0 or 1).  ZDP_GEMM=blas|auto|zdp sets it at
 * start; returns the mode now in use.  Not while a product runs. */
ZDP_API int zdp_nn_gemm_mode(void);
ZDP_API int zdp_nn_gemm_use_mode(int mode);

/* 1 when zdp_nn_sgemm_many_ gives product g to zdp_nn_gemm_compute (by the mode
 * and the whole product's shape, never a piece's, so a product takes one
 * kernel at any thread count). */
ZDP_API int zdp_nn_gemm_wins_(const zdp_nn_gemm *g);

#endif
