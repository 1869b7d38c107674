/*
 * isa.c -- which SIMD path zdp's own kernels take (see nn.h, "SIMD path").
 *
 * One answer for every kernel family (gemm.c's training GEMM, packed.c's
 * small-M products, kv_attention.c's decode attention), asked of the CPU at run time, so a
 * binary built without -march=native (ZDP_NATIVE=OFF) still runs the
 * AVX-512 or AVX2 kernels, compiled with target attributes, where the CPU
 * it lands on has them.  ZDP_GEMM_ISA pins a lower path for all of them at
 * once: the tests check every path's numerics on any machine, and the
 * benchmarks imitate a CPU without AVX-512 (1) or without a zdp SIMD path
 * at all, as on ARM (0).
 */
#include "nn.h"

#include <stdatomic.h>
#include <stdlib.h>

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define ZDP_ISA_X86_ 1
#endif

static _Atomic int best_ = -1; /* -1: not asked yet */
static _Atomic int pin_ = -1;

int zdp_nn_isa_best(void) {
    if (best_ < 0) {
        int isa = 0;
#ifdef ZDP_ISA_X86_
        __builtin_cpu_init();
        /* f, dq and vl: what the AVX-512 kernels' packing and masks use. */
        if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
            __builtin_cpu_supports("avx512vl"))
            isa = 2;
        else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
            isa = 1;
#endif
        best_ = isa; /* a race stores the same value */
    }
    return best_;
}

int zdp_nn_isa(void) {
    if (pin_ < 0) {
        const int best = zdp_nn_isa_best();
        /* ZDP_GEMM_ISA=0|1|2: at most that path; anything else (or a path
         * the CPU lacks) leaves the best. */
        const char *e = getenv("ZDP_GEMM_ISA");
        const int want = e != NULL && e[0] >= '0' && e[0] <= '2' && e[1] == '\0' ? e[0] - '0' : best;
        pin_ = want < best ? want : best;
    }
    return pin_;
}
