/*
 * blas_wide.h -- which OpenBLAS cores run AVX-512 sgemm kernels.  One list
 * for the library (gemm.c: whether zdp's own AVX-512 GEMM takes a product
 * from cblas_sgemm) and the benchmarks (bench/blas_core.h: whether the sgemm
 * peak must be probed again under OpenBLAS's AVX-512 core).  Header-only, libc
 * only: bench/sgemm_peak.c is compiled on its own and includes it by a
 * relative path.
 */
#ifndef ZDP_NN_BLAS_WIDE_H
#define ZDP_NN_BLAS_WIDE_H

#include <stddef.h>
#include <strings.h>

/* 1 when `core` (openblas_get_corename()'s answer, any case) is one of
 * OpenBLAS 0.3.21's cores with AVX-512 sgemm kernels; 0 for every other
 * core (the AVX2 and older ones) and for NULL. */
static inline int zdp_blas_core_is_wide(const char *core) {
    static const char *const wide[] = {"SkylakeX", "Cooperlake", "SapphireRapids"};
    if (core == NULL) return 0;
    for (size_t i = 0; i < sizeof wide / sizeof wide[0]; i++)
        if (strcasecmp(core, wide[i]) == 0) return 1;
    return 0;
}

#endif
