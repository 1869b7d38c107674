/*
 * blas_core.h -- the machine's sgemm peak when OpenBLAS picked a narrower
 * kernel than the CPU can run.  Header-only (static inline), libc and
 * OpenBLAS's cblas.h only: bench/sgemm_peak.c is compiled on its own.
 *
 * A DYNAMIC_ARCH OpenBLAS chooses its kernels ("core") once, when the
 * library loads, from the CPU it recognises.  Debian 12's 0.3.21 does not
 * know AMD Zen 4 / Zen 5 as AVX-512 CPUs and picks its Haswell (AVX2) core:
 * cblas_sgemm then runs at about half of what the CPU does with its
 * SkylakeX (AVX-512) core; an environment can also pin a narrower core
 * (OPENBLAS_CORETYPE=Haswell on an AVX-512 machine).  A benchmark that
 * divides by that probe reports more than 100% of "peak" for code with its
 * own AVX-512 kernels (zdp's).  So where the CPU has what the SkylakeX
 * kernels need (AVX-512 F, DQ, BW, VL) and the core in use is not an
 * AVX-512 one, the probes also measure OpenBLAS under
 * OPENBLAS_CORETYPE=SkylakeX -- in a child process, since the variable only
 * takes effect at load -- and take the better: the machine's peak, whatever
 * the environment chose.  zdp itself runs in the environment it is given
 * (docs/benchmarks-llama.md, "What is measured").
 */
#ifndef ZDP_BENCH_BLAS_CORE_H
#define ZDP_BENCH_BLAS_CORE_H

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../src/nn/blas_wide.h" /* the AVX-512 cores, one list with gemm.c */

#define BENCH_WIDE_CORE "SkylakeX"

/* 1 when OpenBLAS could run BENCH_WIDE_CORE here but runs a narrower core
 * (its own choice or OPENBLAS_CORETYPE's).  0 when ZDP_GEMM_ISA pins zdp
 * below AVX-512: the run imitates a CPU without it, whose peak is the
 * narrower core's. */
static inline int bench_blas_narrower_core(void) {
#if defined(__x86_64__) || defined(__i386__)
    const char *isa = getenv("ZDP_GEMM_ISA");
    if (isa != NULL && (isa[0] == '0' || isa[0] == '1')) return 0;
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512dq") ||
        !__builtin_cpu_supports("avx512bw") || !__builtin_cpu_supports("avx512vl"))
        return 0;
    return !zdp_blas_core_is_wide(openblas_get_corename());
#else
    return 0;
#endif
}

/* Runs this program again (argv, /proc/self/exe) with
 * OPENBLAS_CORETYPE=BENCH_WIDE_CORE and its standard output into out (NUL
 * terminated, at most cap - 1 bytes).  Returns its exit status, or -1. */
static inline int bench_run_wide_core(char *const argv[], char *out, size_t cap) {
    int fd[2];
    out[0] = '\0';
    if (pipe(fd) != 0) return -1;
    fflush(stdout);
    const pid_t pid = fork();
    if (pid < 0) {
        close(fd[0]), close(fd[1]);
        return -1;
    }
    if (pid == 0) {
        dup2(fd[1], STDOUT_FILENO);
        close(fd[0]), close(fd[1]);
        setenv("OPENBLAS_CORETYPE", BENCH_WIDE_CORE, 1);
        execv("/proc/self/exe", argv);
        _exit(127);
    }
    close(fd[1]);
    size_t n = 0;
    ssize_t got;
    while (n + 1 < cap && (got = read(fd[0], out + n, cap - 1 - n)) > 0) n += (size_t)got;
    out[n] = '\0';
    char sink[256]; /* the rest, so the child never blocks on a full pipe */
    while (read(fd[0], sink, sizeof sink) > 0) {
    }
    close(fd[0]);
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* The number after key in text ("key 12.5" or "key=12.5"), or -1. */
static inline double bench_find_number(const char *text, const char *key) {
    const size_t k = strlen(key);
    for (const char *p = strstr(text, key); p != NULL; p = strstr(p + 1, key))
        if ((p == text || p[-1] == '\n' || p[-1] == ' ') && (p[k] == ' ' || p[k] == '='))
            return atof(p + k + 1);
    return -1.0;
}

#endif
