/*
 * test_gemm.c -- src/nn/gemm.c: zdp's training GEMM equals a double-precision
 * reference within fp32 rounding on every path this CPU has (portable C,
 * AVX2+FMA, AVX-512), for ragged shapes (M, N, K not multiples of any tile,
 * across the K, M and N blocks), all four transposes, overwrite and
 * accumulate, strided operands; the AVX paths give the same bits; and
 * through zdp_nn_sgemm_many_ (the pool's pieces) the result is the single
 * call's bit for bit (tests/CMakeLists.txt runs it again with three threads).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "nn/gemm.h"
#include "nn/nn.h"

static float urand_(uint64_t *s) { return (float)((zdp_splitmix64(s) >> 40) * 0x1.0p-24) * 2.0f - 1.0f; }

typedef struct case_ {
    int64_t M, N, K;
    CBLAS_TRANSPOSE ta, tb;
    int acc;
    int64_t lda, ldb, ldc;
    float *A, *B, *C0; /* C0: C before the product */
} case_;

static case_ make_(int64_t M, int64_t N, int64_t K, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int acc) {
    case_ c = {.M = M, .N = N, .K = K, .ta = ta, .tb = tb, .acc = acc};
    uint64_t s = (uint64_t)(M * 1000003 + N * 1009 + K * 7 + (ta == CblasTrans) * 3 + (tb == CblasTrans) * 5 + acc);
    /* Strided rows: ld past the row's length. */
    c.lda = (ta == CblasNoTrans ? K : M) + 3, c.ldb = (tb == CblasNoTrans ? N : K) + 2, c.ldc = N + 5;
    const int64_t na = (ta == CblasNoTrans ? M : K) * c.lda, nb = (tb == CblasNoTrans ? K : N) * c.ldb;
    c.A = malloc((size_t)na * sizeof(float)), c.B = malloc((size_t)nb * sizeof(float));
    c.C0 = malloc((size_t)(M * c.ldc) * sizeof(float));
    for (int64_t i = 0; i < na; i++) c.A[i] = urand_(&s);
    for (int64_t i = 0; i < nb; i++) c.B[i] = urand_(&s);
    for (int64_t i = 0; i < M * c.ldc; i++) c.C0[i] = urand_(&s);
    return c;
}

static void free_(case_ *c) { free(c->A), free(c->B), free(c->C0); }

static float *run_(const case_ *c) {
    float *C = malloc((size_t)(c->M * c->ldc) * sizeof(float));
    memcpy(C, c->C0, (size_t)(c->M * c->ldc) * sizeof(float));
    zdp_nn_gemm_compute(c->ta, c->tb, c->M, c->N, c->K, c->A, c->lda, c->B, c->ldb, c->acc, C, c->ldc);
    return C;
}

static void check_(int path, const case_ *c, const float *C) {
    for (int64_t i = 0; i < c->M; i++)
        for (int64_t j = 0; j < c->N; j++) {
            double x = c->acc ? c->C0[i * c->ldc + j] : 0.0, m = fabs(x);
            for (int64_t k = 0; k < c->K; k++) {
                const double a = c->ta == CblasNoTrans ? c->A[i * c->lda + k] : c->A[k * c->lda + i];
                const double b = c->tb == CblasNoTrans ? c->B[k * c->ldb + j] : c->B[j * c->ldb + k];
                x += a * b, m += fabs(a * b);
            }
            const double got = C[i * c->ldc + j];
            if (fabs(got - x) > 2e-6 * (m + 1.0) * (1.0 + (double)c->K / 64))
                fail_msg("path %d M %lld N %lld K %lld ta %d tb %d acc %d: C[%lld,%lld] = %.9g, want %.9g",
                         path, (long long)c->M, (long long)c->N, (long long)c->K, c->ta == CblasTrans,
                         c->tb == CblasTrans, c->acc, (long long)i, (long long)j, got, x);
        }
    /* Past each row's N (the ld's padding): untouched. */
    for (int64_t i = 0; i < c->M; i++)
        for (int64_t j = c->N; j < c->ldc; j++) assert_true(C[i * c->ldc + j] == c->C0[i * c->ldc + j]);
}

static void test_gemm_matches_reference(void **state) {
    (void)state;
    /* M, N, K: 1; below, at and past one tile (8 x 48, 6 x 16, 4 x 16); past
     * an M block (96 rows on AVX-512), a K block (384) and an N block (768);
     * 13 x 1100 x 300: K in one block of 300, so A read in place (not
     * transposed, AVX-512) takes B in N blocks of at most 624 columns (its
     * L2 budget): 576 and a ragged 524. */
    const int64_t shapes[][3] = {{1, 1, 1},     {13, 31, 7},   {15, 33, 64},   {29, 65, 385},
                                 {200, 47, 100}, {6, 3100, 9}, {45, 96, 800}, {13, 1100, 300}};
    const int ns = (int)(sizeof shapes / sizeof shapes[0]);
    const int best = zdp_nn_gemm_use_path(2);
    float *prev[8][4] = {{0}}; /* the AVX2 path's result, compared with AVX-512's */
    int paths = 0;
    for (int want = 0; want <= 2; want++) {
        const int path = zdp_nn_gemm_use_path(want);
        if (path != want) continue; /* the CPU lacks it */
        paths++;
        for (int s = 0; s < ns; s++)
            for (int t = 0; t < 4; t++) {
                case_ c = make_(shapes[s][0], shapes[s][1], shapes[s][2], t & 1 ? CblasTrans : CblasNoTrans,
                                t & 2 ? CblasTrans : CblasNoTrans, (s + t) % 2);
                float *C = run_(&c);
                check_(path, &c, C);
                if (path == 1) prev[s][t] = C;
                else if (path == 2 && prev[s][t] != NULL) {
                    /* Both one FMA chain per element in k order: the same bits. */
                    assert_memory_equal(C, prev[s][t], (size_t)(c.M * c.ldc) * sizeof(float));
                    free(C), free(prev[s][t]);
                } else free(C);
                free_(&c);
            }
    }
    for (int s = 0; s < ns; s++)
        for (int t = 0; t < 4; t++)
            if (best < 2) free(prev[s][t]);
    zdp_nn_gemm_use_path(best);
    printf("test_gemm: %d path(s) checked (best: %d)\n", paths, best);
    assert_true(paths >= 1);
}

/* zdp_nn_sgemm_many_ with every product given to zdp_nn_gemm_compute: the
 * pool cuts products into pieces along M or N (at three threads here in the
 * .threads3 run); each C equals the single whole call's bit for bit. */
static void test_gemm_pieces_bitwise(void **state) {
    (void)state;
    const int mode = zdp_nn_gemm_use_mode(2);
    enum { NG = 3 };
    const int64_t dims[NG][3] = {{520, 200, 384}, {130, 700, 300}, {300, 100, 1030}};
    case_ c[NG];
    zdp_nn_gemm g[NG];
    float *want[NG];
    for (int i = 0; i < NG; i++) {
        c[i] = make_(dims[i][0], dims[i][1], dims[i][2], i == 1 ? CblasTrans : CblasNoTrans,
                     i == 0 ? CblasTrans : CblasNoTrans, i % 2);
        want[i] = run_(&c[i]);
        float *C = malloc((size_t)(c[i].M * c[i].ldc) * sizeof(float));
        memcpy(C, c[i].C0, (size_t)(c[i].M * c[i].ldc) * sizeof(float));
        g[i] = (zdp_nn_gemm){.ta = c[i].ta, .tb = c[i].tb, .M = c[i].M, .N = c[i].N, .K = c[i].K,
                             .alpha = 1.0f, .A = c[i].A, .lda = c[i].lda, .B = c[i].B,
                             .ldb = c[i].ldb, .beta = c[i].acc ? 1.0f : 0.0f, .C = C, .ldc = c[i].ldc};
    }
    zdp_nn_sgemm_many_(g, NG);
    for (int i = 0; i < NG; i++) {
        assert_memory_equal(g[i].C, want[i], (size_t)(c[i].M * c[i].ldc) * sizeof(float));
        check_(zdp_nn_gemm_path(), &c[i], g[i].C);
        free(g[i].C), free(want[i]), free_(&c[i]);
    }
    zdp_nn_gemm_use_mode(mode);
}

/* Which kernel the default (ZDP_GEMM=auto) gives a training-sized product
 * on each path this CPU has: zdp's GEMM on the AVX-512 path alone, where it
 * was measured faster than the BLAS; cblas_sgemm on the AVX2 and portable
 * paths, where zdp's kernels are slower (so the default is never slower
 * than the BLAS there).  ZDP_GEMM=blas: never zdp's; ZDP_GEMM=zdp: always. */
static void test_gemm_routing(void **state) {
    (void)state;
    const int best = zdp_nn_gemm_use_path(2), mode = zdp_nn_gemm_use_mode(1);
    const zdp_nn_gemm g = {.ta = CblasNoTrans, .tb = CblasTrans, .M = 1024, .N = 576, .K = 576,
                           .alpha = 1.0f, .lda = 576, .ldb = 576, .beta = 0.0f, .ldc = 576};
    for (int want = 0; want <= best; want++) {
        assert_int_equal(zdp_nn_gemm_use_path(want), want);
        zdp_nn_gemm_use_mode(1);
        assert_int_equal(zdp_nn_gemm_wins_(&g), want == 2);
        zdp_nn_gemm_use_mode(0);
        assert_int_equal(zdp_nn_gemm_wins_(&g), 0);
        zdp_nn_gemm_use_mode(2);
        assert_int_equal(zdp_nn_gemm_wins_(&g), 1);
    }
    zdp_nn_gemm_use_path(best);
    zdp_nn_gemm_use_mode(mode);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm_matches_reference),
        cmocka_unit_test(test_gemm_pieces_bitwise),
        cmocka_unit_test(test_gemm_routing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
