/*
 * sgemm_peak.c -- the machine's fp32 matmul peak as zdp sees it: OpenBLAS
 * cblas_sgemm on large square matrices, for the GPT benchmark's model FLOP
 * utilisation (docs/benchmarks-gpt.md).
 *
 * usage: sgemm_peak [--threads N] [--procs P] [--sizes 1024,2048] [--seconds S]
 *   --threads N  OpenBLAS threads per process (openblas_set_num_threads)
 *   --procs P    P processes at once (fork), each with N threads: the peak
 *                of P single-rank jobs side by side, as mpirun -np P runs
 *   --seconds S  time per size per process (default 2)
 * Prints, per size, the GFLOP/s of each process and their sum, then
 * "peak_gflops X" (the best size's sum) and "peak_gflops_per_core_cpu Y"
 * (the best size's GFLOP per CPU-second of a process, over its threads,
 * averaged over the processes: one core's peak while it runs, which a
 * shared machine does not lower as it lowers X).  Runs under the environment
 * it is given: OPENBLAS_CORETYPE, OPENBLAS_L2_SIZE etc. are left alone, so
 * run it under the same environment as the benchmark.
 *
 * Build: cc -O2 bench/sgemm_peak.c -I/usr/include/x86_64-linux-gnu/openblas-pthread \
 *           -lopenblas -o sgemm_peak      (bench/run_gpt_bench.sh does this)
 */
#define _POSIX_C_SOURCE 200809L
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "blas_core.h"

static double now_(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* CPU seconds of this process, all threads. */
static double cpu_now_(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Best GFLOP/s of C = A B (n x n) over repeated calls for about `seconds`;
 * in *per_cpu, the best GFLOP per CPU-second of this process (per core: what
 * one core reaches while it runs, however often other work took it). */
static double time_sgemm_(int n, double seconds, double *per_cpu) {
    size_t nn = (size_t)n * (size_t)n;
    float *a = malloc(nn * sizeof(float)), *b = malloc(nn * sizeof(float)),
          *c = malloc(nn * sizeof(float));
    if (a == NULL || b == NULL || c == NULL) {
        fprintf(stderr, "sgemm_peak: out of memory for n = %d\n", n);
        exit(1);
    }
    for (size_t i = 0; i < nn; i++) {
        a[i] = (float)((i * 7919u) % 1000u) * 1e-3f - 0.5f;
        b[i] = (float)((i * 104729u) % 1000u) * 1e-3f - 0.5f;
        c[i] = 0.0f;
    }
    /* Warm-up (thread start, page faults). */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
    double best = 0.0, best_cpu = 0.0, t_end = now_() + seconds;
    do {
        double t0 = now_(), c0 = cpu_now_();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f,
                    c, n);
        double dt = now_() - t0, dc = cpu_now_() - c0;
        double g = 2.0 * (double)n * (double)n * (double)n / dt * 1e-9;
        double gc = 2.0 * (double)n * (double)n * (double)n / dc * 1e-9;
        if (g > best) best = g;
        if (dc > 0.0 && gc > best_cpu) best_cpu = gc;
    } while (now_() < t_end);
    *per_cpu = best_cpu;
    free(a);
    free(b);
    free(c);
    return best;
}

int main(int argc, char **argv) {
    int threads = 1, procs = 1;
    double seconds = 2.0;
    char sizes_buf[256] = "1024,2048";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--threads") == 0) threads = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--procs") == 0) procs = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--seconds") == 0) seconds = atof(argv[i + 1]);
        else if (strcmp(argv[i], "--sizes") == 0) snprintf(sizes_buf, sizeof sizes_buf, "%s", argv[i + 1]);
        else {
            fprintf(stderr, "usage: sgemm_peak [--threads N] [--procs P] [--sizes a,b] [--seconds S]\n");
            return 2;
        }
    }
    if (threads < 1 || procs < 1 || procs > 64) {
        fprintf(stderr, "sgemm_peak: --threads and --procs must be >= 1 (procs <= 64)\n");
        return 2;
    }
    const char *ct = getenv("OPENBLAS_CORETYPE"), *l2 = getenv("OPENBLAS_L2_SIZE");
    printf("sgemm_peak: %d process(es) x %d thread(s); OPENBLAS_CORETYPE=%s OPENBLAS_L2_SIZE=%s; "
           "OpenBLAS %s (core %s)\n",
           procs, threads, ct ? ct : "(unset)", l2 ? l2 : "(unset)", openblas_get_config(),
           openblas_get_corename());
    double peak = 0.0, peak_core = 0.0;
    char *save = NULL;
    for (char *tok = strtok_r(sizes_buf, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        int n = atoi(tok);
        if (n < 16) continue;
        int fds[64][2];
        pid_t pids[64];
        for (int p = 0; p < procs; p++) {
            if (pipe(fds[p]) != 0) return 1;
            fflush(stdout);
            pids[p] = fork();
            if (pids[p] < 0) return 1;
            if (pids[p] == 0) {
                openblas_set_num_threads(threads);
                double g[2];
                g[0] = time_sgemm_(n, seconds, &g[1]);
                if (write(fds[p][1], g, sizeof g) != (ssize_t)sizeof g) _exit(1);
                _exit(0);
            }
            close(fds[p][1]);
        }
        double sum = 0.0, core = 0.0;
        printf("n %5d:", n);
        for (int p = 0; p < procs; p++) {
            double g[2] = {0.0, 0.0};
            if (read(fds[p][0], g, sizeof g) != (ssize_t)sizeof g) g[0] = g[1] = 0.0;
            close(fds[p][0]);
            waitpid(pids[p], NULL, 0);
            printf(" %.1f", g[0]);
            sum += g[0];
            core += g[1] / procs;
        }
        printf("  sum %.1f GFLOP/s; per core per CPU-second %.1f\n", sum, core);
        if (sum > peak) peak = sum;
        if (core > peak_core) peak_core = core;
    }
    const char *best_core = openblas_get_corename();
    if (bench_blas_narrower_core()) {
        char out[8192];
        if (bench_run_wide_core(argv, out, sizeof out) != 0) {
            fprintf(stderr, "sgemm_peak: the run under OPENBLAS_CORETYPE=%s failed:\n%s\n",
                    BENCH_WIDE_CORE, out);
            return 1;
        }
        for (char *save2 = NULL, *line = strtok_r(out, "\n", &save2); line != NULL;
             line = strtok_r(NULL, "\n", &save2))
            if (strncmp(line, "n ", 2) == 0) printf("core %s: %s\n", BENCH_WIDE_CORE, line);
            else if (strncmp(line, "peak_gflops ", 12) == 0) {
                const double wide = atof(line + 12);
                if (wide > peak) peak = wide, best_core = BENCH_WIDE_CORE;
            } else if (strncmp(line, "peak_gflops_per_core_cpu ", 25) == 0) {
                const double wide = atof(line + 25);
                if (wide > peak_core) peak_core = wide;
            }
    }
    printf("peak_core %s\n", best_core);
    printf("peak_gflops %.2f\n", peak);
    printf("peak_gflops_per_core_cpu %.2f\n", peak_core);
    return 0;
}
