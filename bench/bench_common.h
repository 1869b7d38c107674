/*
 * bench_common.h -- what the benchmark programs share: a monotonic clock,
 * the median of a sample, ending every rank on an error, and each rank's
 * peak RSS gathered to rank 0.  Header-only (static inline): each benchmark
 * is one program, and run_gpt_bench.sh compiles optim_bench.c on its own.
 * Include after _POSIX_C_SOURCE 200809L and <mpi.h>.
 */
#ifndef ZDP_BENCH_COMMON_H
#define ZDP_BENCH_COMMON_H

#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>

#include <mpi.h>

#include "zdp/zdp.h"

/* Seconds on the monotonic clock. */
static inline double bench_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline int bench_cmp_double_(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* CPU seconds this process has used, all its threads, user + system: on a
 * shared machine the wall time also counts the time others held the cores,
 * the CPU time does not (docs/benchmarks-llama.md, "MFU per CPU-second"). */
static inline double bench_cpu_s(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec +
           (double)ru.ru_stime.tv_sec + 1e-6 * (double)ru.ru_stime.tv_usec;
}

/* This process's minor page faults so far (the kernel maps and zeroes a page
 * the process touches first: a buffer allocated and freed per step pays
 * them every step) and its system CPU seconds. */
static inline double bench_minflt(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_minflt;
}

static inline double bench_sys_s(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_stime.tv_sec + 1e-6 * (double)ru.ru_stime.tv_usec;
}

/* The median of v[0..n) (sorts v); 0 for an empty sample. */
static inline double bench_median(double *v, int n) {
    if (n < 1) return 0.0;
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double_);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Ends every rank with "what: the library's message". */
static inline void bench_die(const char *what, const zdp_error *err) {
    char msg[1200];
    snprintf(msg, sizeof msg, "%s: %s", what, err->msg);
    zdp_dist_abort(1, msg);
    exit(1); /* without MPI zdp_dist_abort returns */
}

/* Every rank's peak RSS in KiB, gathered to rank 0: a malloc'd array of W
 * there (free it), NULL elsewhere.  Collective. */
static inline long *bench_gather_rss(int R, int W) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    long rss_kib = ru.ru_maxrss;
    long *all = R == 0 ? malloc((size_t)W * sizeof(long)) : NULL;
    MPI_Gather(&rss_kib, 1, MPI_LONG, all, 1, MPI_LONG, 0, MPI_COMM_WORLD);
    return all;
}

#endif /* ZDP_BENCH_COMMON_H */
