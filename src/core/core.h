/*
 * core.h -- internal: error records, logging, counted allocation.
 *
 * Every module reports failures through zdp_err_set(), which formats the
 * message into the caller's zdp_error and returns the status, so a failing
 * path reads `return zdp_err_set(err, ZDP_ERR_CONFIG, "...", ...);`.
 * Not here: anything that talks to MPI (src/comm) or knows about models.
 */
#ifndef ZDP_CORE_H
#define ZDP_CORE_H

#include "zdp/core.h"

#include <stdarg.h>

#if defined(__GNUC__)
#define ZDP_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define ZDP_PRINTF(a, b)
#endif

/* Fills err (if not NULL) with code, this rank and the formatted message;
 * returns code. */
ZDP_API zdp_status zdp_err_set(zdp_error *err, zdp_status code, const char *fmt, ...)
    ZDP_PRINTF(3, 4);

/* The rank that zdp_err_set records and the default log sink prints.
 * zdp_dist_init (src/comm) sets it once MPI is up and zdp_dist_finalize
 * sets it back to 0, so core itself never calls comm. */
void zdp_core_set_rank(int rank);

/* Logs through the installed sink.  level: 0 info, 1 warning. */
void zdp_log(int level, const char *fmt, ...) ZDP_PRINTF(2, 3);

/* Categories of engine memory (zdp_memory_report). */
typedef enum zdp_mem_category {
    ZDP_MEM_PARAMS,
    ZDP_MEM_GRADS,
    ZDP_MEM_GRAD_PARTITION,
    ZDP_MEM_BUCKETS,
    ZDP_MEM_OPTIMIZER,
    ZDP_MEM_MASTER,
    ZDP_MEM_OTHER,
    ZDP_MEM_GATHERED, /* stage 3: parameters gathered for the model, and persistent ones */
    ZDP_MEM_NCATEGORIES
} zdp_mem_category;

/* Byte counters an owner (the engine) keeps, one per category. */
typedef struct zdp_mem_counter {
    int64_t bytes[ZDP_MEM_NCATEGORIES];
} zdp_mem_counter;

/* zdp_big_alloc (2 MB pages for the large buffers): zdp/core.h. */

/* 64-byte aligned, zero-filled allocation counted in *counter under cat
 * (zdp_big_alloc: 2 MB pages from 2 MB up).
 * NULL on failure (nelem * elem_size overflow included). */
void *zdp_alloc(zdp_mem_counter *counter, zdp_mem_category cat, size_t nbytes);
/* Frees p (allocated with nbytes under cat) and uncounts it; NULL is a no-op. */
void zdp_free(zdp_mem_counter *counter, zdp_mem_category cat, void *p, size_t nbytes);

/* N(0, 1) from splitmix64 (Box-Muller): the models' seeded initialisers. */
double zdp_rand_normal(uint64_t *state);

/* mkdir -p: creates path and the directories above it that are missing
 * (mode 0777 less the umask).  0, or -1 with errno set. */
int zdp_mkdirs(const char *path);

/* ---- thread pool (pool.c) ------------------------------------------------
 * The threads the nn kernels split their work over.  Its size is fixed at
 * the first zdp_pool_size or zdp_pool_run: ZDP_NUM_THREADS, else
 * OPENBLAS_NUM_THREADS, else OMP_NUM_THREADS, else zdp_pool_set_size's value,
 * else the online cores (docs/config.md).  Starting it sets OpenBLAS to one
 * thread: each task calls sgemm single-threaded. */

/* One task of a parallel loop: task in [0, n_tasks), thread in
 * [0, zdp_pool_size()) names the thread running it (for per-thread scratch;
 * no two tasks run on the same thread at once). */
typedef void (*zdp_pool_fn)(void *ctx, int64_t task, int thread);

/* Threads in the pool (>= 1), the caller included; starts it. */
ZDP_API int zdp_pool_size(void);
/* The size to use when no environment variable sets one; false (and no
 * effect) once the pool has started. */
bool zdp_pool_set_size(int n);
/* Runs fn(ctx, t, thread) for t = 0..n_tasks-1, each once, on the caller
 * and the workers; returns when all have finished.  Tasks must write
 * disjoint memory.  A call made while another loop runs (another thread, or
 * from inside a task) runs all its tasks on the calling thread. */
ZDP_API void zdp_pool_run(int64_t n_tasks, zdp_pool_fn fn, void *ctx);

#endif /* ZDP_CORE_H */
