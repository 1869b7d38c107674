/*
 * test_pool.c -- the kernels' thread pool (src/core/pool.c) and the GEMM
 * split (zdp_nn_sgemm_ in src/nn/nn.c): every task runs exactly once on a
 * thread id below the pool's size, two tasks really run at once when the
 * pool has two threads, the caller sleeps through a long join (and is
 * woken), a loop started inside a task or from a second
 * application thread runs whole on its caller, and a GEMM cut over the pool
 * equals one cblas_sgemm call bit for bit, on shapes around the limits of
 * the cut (64-aligned pieces, >= 2^23 multiply-adds, OpenBLAS's SkylakeX
 * direct kernel below 28 * 512^2).  CTest runs it at the default size and
 * with ZDP_NUM_THREADS=3.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "core/core.h"
#include "nn/gemm.h"
#include "nn/nn.h"

typedef struct count_ctx {
    atomic_int runs[3000];
    atomic_int bad_thread;
} count_ctx;

static void count_task_(void *ctx, int64_t t, int thread) {
    count_ctx *c = ctx;
    atomic_fetch_add(&c->runs[t], 1);
    if (thread < 0 || thread >= zdp_pool_size()) atomic_store(&c->bad_thread, 1);
}

static void each_task_once_(void **state) {
    (void)state;
    assert_true(zdp_pool_size() >= 1);
    static count_ctx c;
    for (int n = 1; n <= 3000; n += 499) {
        memset(&c, 0, sizeof c);
        zdp_pool_run(n, count_task_, &c);
        for (int t = 0; t < 3000; t++) assert_int_equal(atomic_load(&c.runs[t]), t < n ? 1 : 0);
        assert_int_equal(atomic_load(&c.bad_thread), 0);
    }
    zdp_pool_run(0, count_task_, &c); /* no tasks: returns at once */
    /* Thousands of short loops in a row: none loses or repeats a task. */
    for (int rep = 0; rep < 2000; rep++) {
        memset(&c, 0, sizeof c);
        zdp_pool_run(1 + rep % 7, count_task_, &c);
        for (int t = 0; t < 1 + rep % 7; t++) assert_int_equal(atomic_load(&c.runs[t]), 1);
    }
}

/* Tasks 0 and 1 each wait (up to 20 s) for the other to start: only a pool
 * that runs them on two threads at once finishes both in time. */
typedef struct meet_ctx {
    atomic_int started[2];
    atomic_int met[2];
    int thread[2];
} meet_ctx;

static double now_(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void meet_task_(void *ctx, int64_t t, int thread) {
    meet_ctx *c = ctx;
    c->thread[t] = thread;
    atomic_store(&c->started[t], 1);
    const double t0 = now_();
    while (!atomic_load(&c->started[1 - t]) && now_() - t0 < 20.0) sched_yield();
    atomic_store(&c->met[t], atomic_load(&c->started[1 - t]));
}

static void two_threads_at_once_(void **state) {
    (void)state;
    if (zdp_pool_size() < 2) {
        print_message("pool size 1: nothing runs in parallel to check\n");
        return;
    }
    meet_ctx c;
    memset(&c, 0, sizeof c);
    zdp_pool_run(2, meet_task_, &c);
    assert_true(atomic_load(&c.met[0]) && atomic_load(&c.met[1]));
    assert_int_not_equal(c.thread[0], c.thread[1]);
}

/* A long join: the caller's task ends at once (once a worker has started
 * the other), the worker's takes 300 ms.  The caller must sleep through
 * the wait, not spin or call sched_yield in a loop (which burns a core and
 * shows as system time: 7% of a 1 x 2 training step did): its CPU time
 * over the loop stays far below the wait.  Then many loops whose worker
 * task outlasts the caller's short spin: a lost wake-up would hang here. */
typedef struct join_ctx {
    atomic_int worker_started;
    atomic_int ran[2];
    int64_t sleep_ns;
} join_ctx;

static double thread_cpu_(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void join_task_(void *ctx, int64_t t, int thread) {
    join_ctx *c = ctx;
    atomic_fetch_add(&c->ran[t], 1);
    if (thread != 0) {
        atomic_store(&c->worker_started, 1);
        const struct timespec d = {.tv_sec = 0, .tv_nsec = (long)c->sleep_ns};
        nanosleep(&d, NULL);
        return;
    }
    /* The caller's task: wait (sleeping, up to 20 s) for a worker to take
     * the other task, so that the join has something to wait for. */
    const struct timespec poll = {.tv_sec = 0, .tv_nsec = 1000000};
    const double t0 = now_();
    while (!atomic_load(&c->worker_started) && now_() - t0 < 20.0) nanosleep(&poll, NULL);
}

static void join_sleeps_(void **state) {
    (void)state;
    if (zdp_pool_size() < 2) {
        print_message("pool size 1: no join to wait at\n");
        return;
    }
    join_ctx c;
    memset(&c, 0, sizeof c);
    c.sleep_ns = 300000000;
    const double c0 = thread_cpu_(), w0 = now_();
    zdp_pool_run(2, join_task_, &c);
    const double cpu = thread_cpu_() - c0, wall = now_() - w0;
    assert_int_equal(atomic_load(&c.ran[0]), 1);
    assert_int_equal(atomic_load(&c.ran[1]), 1);
    assert_true(atomic_load(&c.worker_started));
    assert_true(wall >= 0.29);
    print_message("a 300 ms join: the caller used %.1f ms of CPU\n", 1e3 * cpu);
    assert_true(cpu < 0.05);
    /* Joins just past the caller's spin, many times: none may hang. */
    for (int rep = 0; rep < 200; rep++) {
        memset(&c, 0, sizeof c);
        c.sleep_ns = 200000 + 1000 * (rep % 50);
        zdp_pool_run(2, join_task_, &c);
        assert_int_equal(atomic_load(&c.ran[0]) + atomic_load(&c.ran[1]), 2);
    }
}

/* A loop inside a task runs on the task's own thread. */
typedef struct nest_ctx {
    count_ctx inner[4];
    int outer_thread[4];
    atomic_int inner_thread_ok;
} nest_ctx;

typedef struct inner_arg {
    count_ctx *c;
    int thread;
    atomic_int *ok;
} inner_arg;

static void inner_task_(void *ctx, int64_t t, int thread) {
    inner_arg *a = ctx;
    atomic_fetch_add(&a->c->runs[t], 1);
    if (thread != a->thread) atomic_store(a->ok, 0);
}

static void outer_task_(void *ctx, int64_t t, int thread) {
    nest_ctx *c = ctx;
    c->outer_thread[t] = thread;
    inner_arg a = {.c = &c->inner[t], .thread = thread, .ok = &c->inner_thread_ok};
    zdp_pool_run(50, inner_task_, &a);
}

static void nested_runs_inline_(void **state) {
    (void)state;
    static nest_ctx c;
    memset(&c, 0, sizeof c);
    atomic_store(&c.inner_thread_ok, 1);
    zdp_pool_run(4, outer_task_, &c);
    for (int t = 0; t < 4; t++)
        for (int i = 0; i < 50; i++) assert_int_equal(atomic_load(&c.inner[t].runs[i]), 1);
    assert_int_equal(atomic_load(&c.inner_thread_ok), 1);
}

/* Two application threads issuing loops at the same time. */
static void *caller_(void *arg) {
    count_ctx *c = arg;
    for (int rep = 0; rep < 300; rep++) {
        memset(c->runs, 0, sizeof c->runs);
        zdp_pool_run(64, count_task_, c);
        for (int t = 0; t < 64; t++)
            if (atomic_load(&c->runs[t]) != 1) atomic_store(&c->bad_thread, 1);
    }
    return NULL;
}

static void concurrent_callers_(void **state) {
    (void)state;
    static count_ctx a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    pthread_t ta, tb;
    assert_int_equal(pthread_create(&ta, NULL, caller_, &a), 0);
    assert_int_equal(pthread_create(&tb, NULL, caller_, &b), 0);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    assert_int_equal(atomic_load(&a.bad_thread), 0);
    assert_int_equal(atomic_load(&b.bad_thread), 0);
}

/* ---- the GEMM cut ---- */

static float *random_(int64_t n, uint64_t *s) {
    float *p = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) p[i] = (float)(zdp_splitmix64(s) >> 40) / 16777216.0f - 0.5f;
    return p;
}

static void gemm_split_bitwise_(void **state) {
    (void)state;
    /* M, N, K: both sides of the 2^23 multiply-add piece limit and of the
     * direct kernel's 28 * 512^2, rows and columns not multiples of 64, and
     * the transformer's own shapes (1024 rows; 576, 1536 and 49152 wide). */
    static const int shapes[][3] = {
        {1024, 576, 576}, {1024, 1536, 576}, {512, 200, 100}, {3000, 100, 100},
        {100, 3000, 100}, {1000, 200, 64},   {256, 49152, 64}, {777, 333, 129},
        {4096, 64, 64},   {64, 4096, 64},    {2000, 130, 70},  {130, 2000, 70},
        /* Small: OpenBLAS rounds their pieces differently (never cut). */
        {200, 200, 64},   {128, 200, 100},   {100, 200, 100},  {256, 24, 384},
        {17, 64, 1024},   {8, 96, 1536},
    };
    uint64_t s = 11;
    /* mode 0: every product through cblas_sgemm, against one cblas call;
     * mode 2: every product through gemm.c, against one whole call of it. */
    const int mode_was = zdp_nn_gemm_mode();
    for (int mode = 0; mode <= 2; mode += 2) {
    zdp_nn_gemm_use_mode(mode);
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int beta1 = 0; beta1 < 2; beta1++) {
                    /* gemm.c: one beta per transpose pair, not the vocabulary-wide
                     * shape (test_gemm covers the kernel; this, the cut). */
                    if (mode == 2 && (beta1 != (ta ^ tb) || shapes[i][1] == 49152)) continue;
                    const int64_t M = shapes[i][0], N = shapes[i][1], K = shapes[i][2];
                    const CBLAS_TRANSPOSE TA = ta ? CblasTrans : CblasNoTrans;
                    const CBLAS_TRANSPOSE TB = tb ? CblasTrans : CblasNoTrans;
                    const int64_t lda = ta ? M : K, ldb = tb ? K : N;
                    float *A = random_(M * K, &s), *B = random_(K * N, &s);
                    float *C0 = random_(M * N, &s), *C1 = malloc((size_t)(M * N) * sizeof(float));
                    memcpy(C1, C0, (size_t)(M * N) * sizeof(float));
                    const float beta = beta1 ? 1.0f : 0.0f;
                    if (mode == 0)
                        cblas_sgemm(CblasRowMajor, TA, TB, (int)M, (int)N, (int)K, 1.0f, A, (int)lda,
                                    B, (int)ldb, beta, C0, (int)N);
                    else
                        zdp_nn_gemm_compute(TA, TB, M, N, K, A, lda, B, ldb, beta1, C0, N);
                    zdp_nn_sgemm_(TA, TB, M, N, K, 1.0f, A, lda, B, ldb, beta, C1, N);
                    if (memcmp(C0, C1, (size_t)(M * N) * sizeof(float)) != 0)
                        fail_msg("sgemm (ZDP_GEMM mode %d) M %lld N %lld K %lld ta %d tb %d beta %g: "
                                 "the pieces differ from one call", mode,
                                 (long long)M, (long long)N, (long long)K, ta, tb, (double)beta);
                    free(A), free(B), free(C0), free(C1);
                }
    }
    zdp_nn_gemm_use_mode(mode_was);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(each_task_once_),    cmocka_unit_test(two_threads_at_once_),
        cmocka_unit_test(join_sleeps_),
        cmocka_unit_test(nested_runs_inline_), cmocka_unit_test(concurrent_callers_),
        cmocka_unit_test(gemm_split_bitwise_),
    };
    print_message("pool size %d\n", zdp_pool_size());
    return cmocka_run_group_tests(tests, NULL, NULL);
}
