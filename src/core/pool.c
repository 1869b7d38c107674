/*
 * pool.c -- the kernels' thread pool (see core.h, "thread pool").
 *
 * What it does: runs tasks 0..n-1 of a parallel loop on the calling thread
 * and size-1 workers, each task exactly once, and returns when all are done.
 * Kernels cut their work into tasks that write disjoint outputs (rows of a
 * matrix, (batch, head) pairs, columns of a reduction), so which thread runs
 * a task never changes a bit of the result: results do not depend on the
 * thread count.
 *
 * Why not OpenBLAS's own threads: OpenBLAS splits one matrix product across
 * its threads, and the products of a small transformer (1024 rows, a few
 * hundred columns, head-size 64 in attention) split poorly; and it leaves
 * every element-wise kernel on one thread.  So zdp threads the kernels and
 * calls sgemm single-threaded from each task: when the pool starts it sets
 * OpenBLAS to one thread (openblas_set_num_threads(1)); Debian's OpenBLAS
 * (pthreads build) takes concurrent single-threaded calls from several
 * threads (its buffer allocation is locked).
 *
 * The size: ZDP_NUM_THREADS, else OPENBLAS_NUM_THREADS, else
 * OMP_NUM_THREADS, else what zdp_pool_set_size was told before the first
 * use (zdp_dist_init: the node's cores shared among its ranks), else the
 * online cores.  It is fixed at the first zdp_pool_size or zdp_pool_run:
 * kernels size per-thread scratch by it.
 *
 * Invariants: one loop runs at a time.  A second caller (another
 * application thread, or a task that itself calls zdp_pool_run) does not
 * wait for the pool: it runs its whole loop on its own thread, which gives
 * the same result (as thread 0, or inside a task as that task's thread).  Workers spin briefly for the next loop (a step issues
 * hundreds of short ones) and then sleep on a condition variable, so an idle
 * pool costs no CPU.  The caller, its own tasks done, spins briefly for
 * the others' and then sleeps too, woken by the thread that finishes the
 * loop's last task: a join that waits milliseconds (one thread's share
 * took longer) costs neither a core's time nor system calls.  (It used to
 * call sched_yield in a loop: on a machine with a free core for every
 * thread that returns at once, and 1 x 2 training spent 7% of its CPU time
 * in the kernel doing it; docs/benchmarks-llama.md, "The 1 x 2 joins".)
 * Not here: any knowledge of the kernels.
 */
#include "core.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include <cblas.h>

#define POOL_MAX_ 256
#define SPIN_ 2000 /* polls (~100 microseconds) before a worker sleeps */
/* The loop word: generation (24 bits) | task count (20) | next task (20).
 * One word, so that a worker claims a task with one compare-and-swap that
 * fails if the loop it saw has ended and another begun. */
#define TASK_BITS_ 20
#define TASK_MAX_ ((1 << TASK_BITS_) - 1)
#define MASK_ ((uint64_t)TASK_MAX_)

typedef struct pool {
    int size;      /* threads including the caller; fixed once started */
    int requested; /* zdp_pool_set_size before start; 0 = not told */
    bool started;
    pthread_mutex_t run_lock; /* held by the thread whose loop the workers run */
    pthread_mutex_t mu;       /* with wake: sleeping workers */
    pthread_cond_t wake;
    pthread_cond_t joined;    /* with mu: the caller asleep at the join */
    atomic_int joiner_asleep; /* 1 while the caller may wait on joined */
    _Atomic uint64_t word; /* the current loop (see TASK_BITS_) */
    zdp_pool_fn fn;        /* the current loop's task and context: written */
    void *ctx;             /* before its word, read after a claim */
    atomic_int_fast64_t done; /* tasks of the current loop finished */
} pool;

static pool pool_ = {.run_lock = PTHREAD_MUTEX_INITIALIZER,
                     .mu = PTHREAD_MUTEX_INITIALIZER,
                     .wake = PTHREAD_COND_INITIALIZER,
                     .joined = PTHREAD_COND_INITIALIZER};
static pthread_mutex_t start_lock_ = PTHREAD_MUTEX_INITIALIZER;
/* This thread's id in the pool: a worker's index, 0 on every other thread.
 * A loop run inline inside a task keeps its task's id, so per-thread scratch
 * stays the thread's own. */
static _Thread_local int self_ = 0;

static inline void cpu_relax_(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static inline uint64_t gen_of_(uint64_t w) { return w >> (2 * TASK_BITS_); }

/* Claims and runs tasks of loop gen until none are left (or it ended). */
static void drain_(uint64_t gen, int thread) {
    uint64_t w = atomic_load(&pool_.word);
    for (;;) {
        const uint64_t n = (w >> TASK_BITS_) & MASK_, next = w & MASK_;
        if (gen_of_(w) != gen || next >= n) return;
        if (!atomic_compare_exchange_weak(&pool_.word, &w, w + 1)) continue;
        /* Task next of loop gen is ours; the loop cannot end before it is
         * done, so fn and ctx are still this loop's. */
        pool_.fn(pool_.ctx, (int64_t)next, thread);
        /* The last task wakes a caller asleep at the join.  The caller sets
         * joiner_asleep before it reads done under mu, and this thread
         * reads joiner_asleep after adding to done (both sequentially
         * consistent): either the caller sees the loop finished, or this
         * thread sees the flag and signals under mu. */
        if (atomic_fetch_add(&pool_.done, 1) + 1 == (int_fast64_t)n &&
            atomic_load(&pool_.joiner_asleep)) {
            pthread_mutex_lock(&pool_.mu);
            pthread_cond_signal(&pool_.joined);
            pthread_mutex_unlock(&pool_.mu);
        }
        w = atomic_load(&pool_.word);
    }
}

static void *worker_(void *arg) {
    const int thread = (int)(intptr_t)arg;
    self_ = thread;
    uint64_t seen = 0;
    for (;;) {
        uint64_t g = gen_of_(atomic_load(&pool_.word));
        for (int i = 0; g == seen && i < SPIN_; i++) {
            cpu_relax_();
            g = gen_of_(atomic_load(&pool_.word));
        }
        if (g == seen) {
            pthread_mutex_lock(&pool_.mu);
            while ((g = gen_of_(atomic_load(&pool_.word))) == seen)
                pthread_cond_wait(&pool_.wake, &pool_.mu);
            pthread_mutex_unlock(&pool_.mu);
        }
        seen = g;
        drain_(g, thread);
    }
    return NULL;
}

/* A positive integer from an environment variable, or 0. */
static int env_threads_(const char *name) {
    const char *s = getenv(name);
    if (s == NULL || *s == '\0') return 0;
    char *end;
    long v = strtol(s, &end, 10);
    if (*end != '\0' || v < 1) return 0;
    return v > POOL_MAX_ ? POOL_MAX_ : (int)v;
}

static void start_(void) {
    pthread_mutex_lock(&start_lock_);
    if (!pool_.started) {
        int n = env_threads_("ZDP_NUM_THREADS");
        if (n == 0) n = env_threads_("OPENBLAS_NUM_THREADS");
        if (n == 0) n = env_threads_("OMP_NUM_THREADS");
        if (n == 0) n = pool_.requested;
        if (n == 0) {
            long cores = sysconf(_SC_NPROCESSORS_ONLN);
            n = cores < 1 ? 1 : cores > POOL_MAX_ ? POOL_MAX_ : (int)cores;
        }
        openblas_set_num_threads(1);
        /* A worker that cannot be started leaves the pool smaller; the
         * results are the same at any size. */
        int started = 1;
        for (int i = 1; i < n; i++) {
            pthread_t th;
            pthread_attr_t attr;
            pthread_attr_init(&attr);
            pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
            int rc = pthread_create(&th, &attr, worker_, (void *)(intptr_t)i);
            pthread_attr_destroy(&attr);
            if (rc != 0) break;
            started++;
        }
        pool_.size = started;
        pool_.started = true;
    }
    pthread_mutex_unlock(&start_lock_);
}

int zdp_pool_size(void) {
    start_();
    return pool_.size;
}

bool zdp_pool_set_size(int n) {
    pthread_mutex_lock(&start_lock_);
    const bool ok = !pool_.started && n >= 1;
    if (ok) pool_.requested = n > POOL_MAX_ ? POOL_MAX_ : n;
    pthread_mutex_unlock(&start_lock_);
    return ok;
}

void zdp_pool_run(int64_t n_tasks, zdp_pool_fn fn, void *ctx) {
    if (n_tasks <= 0) return;
    start_();
    if (pool_.size == 1 || n_tasks == 1 || n_tasks > TASK_MAX_ ||
        pthread_mutex_trylock(&pool_.run_lock) != 0) {
        for (int64_t t = 0; t < n_tasks; t++) fn(ctx, t, self_);
        return;
    }
    pool_.fn = fn;
    pool_.ctx = ctx;
    atomic_store(&pool_.done, 0);
    const uint64_t gen = (gen_of_(atomic_load(&pool_.word)) + 1) & 0xFFFFFFu;
    pthread_mutex_lock(&pool_.mu);
    atomic_store(&pool_.word, gen << (2 * TASK_BITS_) | (uint64_t)n_tasks << TASK_BITS_);
    pthread_cond_broadcast(&pool_.wake);
    pthread_mutex_unlock(&pool_.mu);
    drain_(gen, 0);
    /* The others' tasks: a short spin (most joins end within it), then
     * sleep until the last task's thread signals. */
    for (int i = 0; i < SPIN_ && atomic_load(&pool_.done) != n_tasks; i++) cpu_relax_();
    if (atomic_load(&pool_.done) != n_tasks) {
        atomic_store(&pool_.joiner_asleep, 1);
        pthread_mutex_lock(&pool_.mu);
        while (atomic_load(&pool_.done) != n_tasks) pthread_cond_wait(&pool_.joined, &pool_.mu);
        pthread_mutex_unlock(&pool_.mu);
        atomic_store(&pool_.joiner_asleep, 0);
    }
    pthread_mutex_unlock(&pool_.run_lock);
}
