/*
 * test_packed.c -- src/nn/packed.c: products against a packed B equal a
 * double-precision reference within fp32 rounding, on every path this CPU
 * has (portable C, AVX2+FMA, AVX-512), for M from 1 to past two register
 * blocks and 300 (row blocks of 128), K across the K-block boundary, N of 1
 * to 9 panels (AVX-512 triples, pairs, singles) on and off the panel width, both
 * weight layouts, bias and accumulation; and the same at any thread count
 * (tests/CMakeLists.txt runs it again with three threads).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "nn/nn.h"

static float urand_(uint64_t *s) { return (float)((zdp_splitmix64(s) >> 40) * 0x1.0p-24) * 2.0f - 1.0f; }

static void check_shape_(int path, int64_t M, int64_t K, int64_t N, int trans, int with_bias, int acc) {
    uint64_t s = (uint64_t)(M * 1000003 + K * 1009 + N * 7 + trans * 3 + acc);
    const int64_t lda = K + 3, ldc = N + 5; /* strided rows */
    float *A = malloc((size_t)(M * lda) * sizeof *A), *W = malloc((size_t)(K * N) * sizeof *W);
    float *bias = malloc((size_t)N * sizeof *bias), *C = malloc((size_t)(M * ldc) * sizeof *C);
    float *Bp = malloc((size_t)zdp_nn_packed_floats(K, N) * sizeof *Bp);
    double *want = malloc((size_t)(M * N) * sizeof *want), *mag = malloc((size_t)(M * N) * sizeof *mag);
    for (int64_t i = 0; i < M * lda; i++) A[i] = urand_(&s);
    for (int64_t i = 0; i < K * N; i++) W[i] = urand_(&s);
    for (int64_t i = 0; i < N; i++) bias[i] = urand_(&s);
    for (int64_t i = 0; i < M * ldc; i++) C[i] = urand_(&s);
    for (int64_t r = 0; r < M; r++)
        for (int64_t n = 0; n < N; n++) {
            double x = acc ? C[r * ldc + n] : 0.0, m = fabs(x);
            for (int64_t k = 0; k < K; k++) {
                const double w = trans ? W[n * K + k] : W[k * N + n];
                x += (double)A[r * lda + k] * w;
                m += fabs((double)A[r * lda + k] * w);
            }
            if (with_bias) x += bias[n], m += fabs(bias[n]);
            want[r * N + n] = x, mag[r * N + n] = m;
        }
    zdp_nn_pack_b(Bp, W, K, N, trans);
    const float pad = C[M * ldc - 1]; /* past the last row's N: untouched */
    zdp_nn_packed_gemm(C, ldc, A, lda, Bp, with_bias ? bias : NULL, M, K, N, acc);
    assert_true(ldc == N || C[M * ldc - 1] == pad);
    for (int64_t r = 0; r < M; r++)
        for (int64_t n = 0; n < N; n++) {
            const double got = C[r * ldc + n], w = want[r * N + n];
            if (fabs(got - w) > 2e-6 * (mag[r * N + n] + 1.0) * (1.0 + (double)K / 64))
                fail_msg("path %d M %lld K %lld N %lld trans %d bias %d acc %d: C[%lld,%lld] = %.9g, want %.9g",
                         path, (long long)M, (long long)K, (long long)N, trans, with_bias, acc,
                         (long long)r, (long long)n, got, w);
        }
    free(A), free(W), free(bias), free(C), free(Bp), free(want), free(mag);
}

static void test_packed_matches_reference(void **state) {
    (void)state;
    const int64_t Ms[] = {1, 2, 5, 6, 7, 13, 32, 40};
    const int64_t Ks[] = {1, 7, 64, 300, 577};
    /* 1-9 panels: the AVX-512 path's triples, pairs and singles */
    const int64_t Ns[] = {1, 15, 16, 17, 33, 48, 80, 100, 130};
    int paths = 0;
    for (int want = 0; want <= 2; want++) {
        const int path = zdp_nn_packed_use_path(want);
        if (path != want) continue; /* the CPU lacks it */
        paths++;
        for (size_t a = 0; a < sizeof Ms / sizeof Ms[0]; a++)
            for (size_t b = 0; b < sizeof Ks / sizeof Ks[0]; b++)
                for (size_t c = 0; c < sizeof Ns / sizeof Ns[0]; c++) {
                    const int v = (int)(a + b + c);
                    check_shape_(path, Ms[a], Ks[b], Ns[c], v % 2, v % 3 == 0, v % 4 == 1);
                }
        /* Past one row block (128 rows: prefills): blocks of 128, 128, 44. */
        for (int v = 0; v < 4; v++)
            check_shape_(path, 300, v < 2 ? 300 : 7, v % 2 ? 100 : 48, v % 2, v == 1, v == 2);
    }
    printf("test_packed: %d path(s) checked (best: %d)\n", paths, zdp_nn_packed_use_path(2));
    assert_true(paths >= 1);
}

/* The same bits whatever M a row shares its call with: row r of a 32-row
 * product equals the same row alone (decode steps of different batch sizes
 * give a sequence the same logits). */
static void test_rows_independent(void **state) {
    (void)state;
    const int64_t M = 32, K = 300, N = 100;
    uint64_t s = 5;
    float *A = malloc((size_t)(M * K) * sizeof *A), *W = malloc((size_t)(K * N) * sizeof *W);
    float *C = malloc((size_t)(M * N) * sizeof *C), *c1 = malloc((size_t)N * sizeof *c1);
    float *Bp = malloc((size_t)zdp_nn_packed_floats(K, N) * sizeof *Bp);
    for (int64_t i = 0; i < M * K; i++) A[i] = urand_(&s);
    for (int64_t i = 0; i < K * N; i++) W[i] = urand_(&s);
    zdp_nn_pack_b(Bp, W, K, N, 1);
    zdp_nn_packed_gemm(C, N, A, K, Bp, NULL, M, K, N, 0);
    for (int64_t r = 0; r < M; r += 7) {
        zdp_nn_packed_gemm(c1, N, A + r * K, K, Bp, NULL, 1, K, N, 0);
        assert_memory_equal(c1, C + r * N, (size_t)N * sizeof *c1);
    }
    free(A), free(W), free(C), free(c1), free(Bp);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_packed_matches_reference),
        cmocka_unit_test(test_rows_independent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
