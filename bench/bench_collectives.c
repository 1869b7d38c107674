/*
 * bench_collectives.c -- float32 SUM reduce-scatter / all-reduce shoot-out.
 *
 * Measures, side by side and interleaved within every repetition:
 *   allreduce      MPI_Allreduce, in place, one call (zdp_comm_allreduce_sum_f32 makes one per 8 MiB)
 *   rs_even        MPI_Reduce_scatter, counts n/W each
 *   rs_block       MPI_Reduce_scatter_block, n/W each
 *   ring_even      zdp_comm_ring_reduce_scatter_f32, counts n/W each
 *   bkt_rs         ZeRO-2 bucket: n floats all owned by rank 0, MPI_Reduce_scatter
 *                  with counts {n, 0, ..., 0}
 *   bkt_reduce     the same bucket via MPI_Reduce to rank 0
 *   bkt_ring       the same bucket via the ring, counts {n, 0, ..., 0}
 *
 * Time of one sample = max over ranks of (t_end - t_start) after a barrier;
 * small sizes run several calls per sample.  Reported: median over --reps
 * samples, nccl-tests bus bandwidth (allreduce 2(W-1)/W * B / t, reduce-scatter
 * (W-1)/W * B / t, B = the whole per-rank buffer in bytes), and minor page
 * faults per call (max over ranks) -- a large number means the library mmaps
 * and touches fresh temporaries on every call.
 *
 * Flags: --reps N (default 9) --min-kib K --max-mib M --no-trim --only NAME[,NAME]
 *   --no-trim  mallopt(M_MMAP_THRESHOLD, 1<<30) and mallopt(M_TRIM_THRESHOLD,
 *              1<<30) before MPI_Init, so the large temporaries MPI's collectives
 *              malloc/free on every call stay on the heap instead of being
 *              mmap'ed, page-faulted in and munmap'ed each time.  If a glibc
 *              refuses that threshold (mallopt returns 0), the bench also sets
 *              M_MMAP_MAX=0 (no mmap'ed chunks at all); it prints what took
 *              effect (glibc 2.36 accepts 1<<30).
 *
 * Every variant's result is checked once per size against a locally computed
 * exact reference (inputs are small integers, so float sums are exact).
 */
#define _GNU_SOURCE
#include <malloc.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#ifndef ZDP_BENCH_PRIVATE_RING
#include "comm/comm.h"
#endif

enum { V_ALLREDUCE, V_RS_EVEN, V_RS_BLOCK, V_RING_EVEN, V_BKT_RS, V_BKT_REDUCE, V_BKT_RING, NV };
static const char *vname[NV] = {"allreduce", "rs_even",    "rs_block", "ring_even",
                                "bkt_rs",    "bkt_reduce", "bkt_ring"};

static int W, R;

#ifdef ZDP_BENCH_PRIVATE_RING
/* PRIVATE COPY of zdp_comm_ring_reduce_scatter_f32 (src/comm/comm_mpi.c), used
 * only when the bench is built with -DZDP_BENCH_PRIVATE_RING because the
 * library does not build.  Same algorithm: W-1 Sendrecv steps, in place in
 * buf, piece r ends fully reduced at buf + displ[r]. */
static int ring_rs_(float *buf, float *scratch, const int *counts) {
    if (W == 1) return 0;
    int64_t displ[64];
    int64_t off = 0;
    for (int k = 0; k < W; k++) {
        displ[k] = off;
        off += counts[k];
    }
    const int next = (R + 1) % W, prev = (R + W - 1) % W;
    for (int k = 0; k < W - 1; k++) {
        int sp = ((R - k - 1) % W + W) % W, rp = ((R - k - 2) % W + W) % W;
        int rc = MPI_Sendrecv(buf + displ[sp], counts[sp], MPI_FLOAT, next, 7301, scratch,
                              counts[rp], MPI_FLOAT, prev, 7301, MPI_COMM_WORLD,
                              MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return -1;
        float *dst = buf + displ[rp];
        for (int i = 0; i < counts[rp]; i++) dst[i] += scratch[i];
    }
    return 0;
}
#else
static int ring_rs_(float *buf, float *scratch, const int *counts) {
    zdp_error err;
    memset(&err, 0, sizeof err);
    return zdp_comm_ring_reduce_scatter_f32(buf, scratch, counts, NULL, &err) == ZDP_OK
               ? 0
               : -1;
}
#endif

/* Input on rank r: small integers, so every partial sum is exact. */
static inline float in_val(int64_t i, int r) { return (float)((i * 13 + r * 5) % 16); }
static float ref_val(int64_t i) {
    float s = 0;
    for (int r = 0; r < W; r++) s += in_val(i, r);
    return s;
}

static float *src, *work, *recvb, *scratch;
static int64_t n;          /* floats per rank, multiple of W */
static int *cnt_even, *cnt_bkt;

static void die(const char *m) {
    fprintf(stderr, "[rank %d] %s\n", R, m);
    MPI_Abort(MPI_COMM_WORLD, 2);
}

/* Does variant v need its input buffer refilled before each sample? */
static int in_place(int v) { return v == V_ALLREDUCE || v == V_RING_EVEN || v == V_BKT_RING; }

static void run_once(int v) {
    int64_t piece = n / W;
    int rc = MPI_SUCCESS;
    switch (v) {
    case V_ALLREDUCE:
        rc = MPI_Allreduce(MPI_IN_PLACE, work, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        break;
    case V_RS_EVEN:
        rc = MPI_Reduce_scatter(src, recvb, cnt_even, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        break;
    case V_RS_BLOCK:
        rc = MPI_Reduce_scatter_block(src, recvb, (int)piece, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        break;
    case V_RING_EVEN: rc = ring_rs_(work, scratch, cnt_even) ? -1 : MPI_SUCCESS; break;
    case V_BKT_RS:
        rc = MPI_Reduce_scatter(src, recvb, cnt_bkt, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        break;
    case V_BKT_REDUCE:
        rc = MPI_Reduce(src, R == 0 ? recvb : NULL, (int)n, MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD);
        break;
    case V_BKT_RING: rc = ring_rs_(work, recvb, cnt_bkt) ? -1 : MPI_SUCCESS; break;
    }
    if (rc != MPI_SUCCESS) die("collective failed");
}

static void refill(void) { memcpy(work, src, (size_t)n * sizeof(float)); }

/* Returns 1 if this rank's part of the result is right. */
static int verify(int v) {
    int64_t piece = n / W, lo = 0, hi = 0;
    const float *res = NULL;
    int64_t res_off = 0; /* index of res[0] in the global vector */
    switch (v) {
    case V_ALLREDUCE: lo = 0, hi = n, res = work, res_off = 0; break;
    case V_RS_EVEN:
    case V_RS_BLOCK: lo = R * piece, hi = lo + piece, res = recvb, res_off = lo; break;
    case V_RING_EVEN: lo = R * piece, hi = lo + piece, res = work, res_off = 0; break;
    case V_BKT_RS:
    case V_BKT_REDUCE: lo = 0, hi = R == 0 ? n : 0, res = recvb, res_off = 0; break;
    case V_BKT_RING: lo = 0, hi = R == 0 ? n : 0, res = work, res_off = 0; break;
    }
    for (int64_t i = lo; i < hi; i++)
        if (res[i - res_off] != ref_val(i)) {
            fprintf(stderr, "[rank %d] %s n=%lld: wrong at %lld: %g != %g\n", R, vname[v],
                    (long long)n, (long long)i, res[i - res_off], ref_val(i));
            return 0;
        }
    return 1;
}

static long minflt(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_minflt;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    int reps = 9, no_trim = 0;
    long min_kib = 64, max_mib = 256;
    int enabled[NV];
    for (int v = 0; v < NV; v++) enabled[v] = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--min-kib") && i + 1 < argc) min_kib = atol(argv[++i]);
        else if (!strcmp(argv[i], "--max-mib") && i + 1 < argc) max_mib = atol(argv[++i]);
        else if (!strcmp(argv[i], "--no-trim")) no_trim = 1;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) {
            char *list = argv[++i];
            for (int v = 0; v < NV; v++) enabled[v] = strstr(list, vname[v]) != NULL;
        } else {
            fprintf(stderr, "usage: %s [--reps N] [--min-kib K] [--max-mib M] [--no-trim] "
                            "[--only v1,v2]\n", argv[0]);
            return 2;
        }
    }
    int mm_thr = -1, mm_trim = -1, mm_max = -1;
    if (no_trim) {
        mm_thr = mallopt(M_MMAP_THRESHOLD, 1 << 30);
        mm_trim = mallopt(M_TRIM_THRESHOLD, 1 << 30);
        if (!mm_thr) mm_max = mallopt(M_MMAP_MAX, 0); /* see header comment */
    }
    MPI_Init(&argc, &argv);
    MPI_Comm_size(MPI_COMM_WORLD, &W);
    MPI_Comm_rank(MPI_COMM_WORLD, &R);
    if (W > 64) die("at most 64 ranks");
    if (reps < 1) reps = 1;

    if (R == 0) {
        char ver[MPI_MAX_LIBRARY_VERSION_STRING];
        int len = 0;
        MPI_Get_library_version(ver, &len);
        char *nl = strchr(ver, ','); if (nl) *nl = 0;
        const char *alg = getenv("OMPI_MCA_coll_tuned_reduce_scatter_algorithm");
        const char *cma = getenv("OMPI_MCA_btl_vader_single_copy_mechanism");
        printf("# bench_collectives: W=%d reps=%d  %s\n", W, reps, ver);
        printf("# reduce_scatter_algorithm=%s  dynamic_rules=%s  vader_single_copy=%s\n",
               alg ? alg : "(default)",
               getenv("OMPI_MCA_coll_tuned_use_dynamic_rules")
                   ? getenv("OMPI_MCA_coll_tuned_use_dynamic_rules") : "(default)",
               cma ? cma : "(default: cma)");
        if (no_trim)
            printf("# --no-trim: mallopt(M_MMAP_THRESHOLD,1<<30)=%d  mallopt(M_TRIM_THRESHOLD,1<<30)=%d"
                   "  fallback mallopt(M_MMAP_MAX,0)=%s\n",
                   mm_thr, mm_trim, mm_thr ? "not needed" : (mm_max ? "1 (applied)" : "0 (failed)"));
        printf("%-9s %-11s %12s %10s %10s %10s %8s\n", "size", "variant", "median_us", "min_us",
               "algbw_GB/s", "busbw_GB/s", "flt/call");
        fflush(stdout);
    }

    int64_t nmax = ((int64_t)max_mib << 20) / (int64_t)sizeof(float);
    /* Pre-fault: allocate the largest buffers once and touch every page. */
    src = malloc((size_t)nmax * sizeof(float));
    work = malloc((size_t)nmax * sizeof(float));
    recvb = malloc((size_t)nmax * sizeof(float));
    scratch = malloc((size_t)nmax * sizeof(float));
    cnt_even = malloc((size_t)W * sizeof(int));
    cnt_bkt = malloc((size_t)W * sizeof(int));
    if (!src || !work || !recvb || !scratch || !cnt_even || !cnt_bkt) die("out of memory");
    for (int64_t i = 0; i < nmax; i++) src[i] = in_val(i, R);
    memset(work, 0, (size_t)nmax * sizeof(float));
    memset(recvb, 0, (size_t)nmax * sizeof(float));
    memset(scratch, 0, (size_t)nmax * sizeof(float));

    double *samples = malloc((size_t)NV * (size_t)reps * sizeof(double));
    long *faults = malloc((size_t)NV * sizeof(long));
    if (!samples || !faults) die("out of memory");

    for (int64_t bytes = (int64_t)min_kib << 10; bytes <= ((int64_t)max_mib << 20); bytes *= 4) {
        n = bytes / (int64_t)sizeof(float);
        n -= n % W;
        int64_t nbytes = n * (int64_t)sizeof(float);
        for (int k = 0; k < W; k++) {
            cnt_even[k] = (int)(n / W);
            cnt_bkt[k] = k == 0 ? (int)n : 0;
        }
        /* Several calls per sample for small buffers (~4 MiB moved per sample). */
        int iters = (int)((4 << 20) / nbytes);
        if (iters < 1) iters = 1;
        if (iters > 32) iters = 32;
        /* Warm up and verify each variant once. */
        int ok = 1;
        for (int v = 0; v < NV; v++) {
            if (!enabled[v]) continue;
            for (int w = 0; w < (nbytes >= (16 << 20) ? 1 : 2); w++) {
                if (in_place(v)) refill();
                run_once(v);
            }
            ok &= verify(v);
        }
        int all_ok = 0;
        MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
        if (!all_ok) die("verification failed");

        memset(faults, 0, (size_t)NV * sizeof(long));
        for (int rep = 0; rep < reps; rep++) {
            for (int v0 = 0; v0 < NV; v0++) {
                int v = (v0 + rep) % NV; /* rotate the order too */
                if (!enabled[v]) continue;
                if (in_place(v)) refill();
                MPI_Barrier(MPI_COMM_WORLD);
                long f0 = minflt();
                double t0 = MPI_Wtime();
                for (int it = 0; it < iters; it++) run_once(v);
                double t = (MPI_Wtime() - t0) / iters;
                faults[v] += minflt() - f0;
                double tmax = 0;
                MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
                samples[v * reps + rep] = tmax;
            }
        }
        long fmax[NV];
        MPI_Allreduce(faults, fmax, NV, MPI_LONG, MPI_MAX, MPI_COMM_WORLD);
        if (R == 0) {
            char sz[32];
            if (bytes >= (1 << 20)) snprintf(sz, sizeof sz, "%lldMiB", (long long)(bytes >> 20));
            else snprintf(sz, sizeof sz, "%lldKiB", (long long)(bytes >> 10));
            for (int v = 0; v < NV; v++) {
                if (!enabled[v]) continue;
                double *s = samples + v * reps;
                qsort(s, (size_t)reps, sizeof(double), cmp_d);
                double med = reps % 2 ? s[reps / 2] : 0.5 * (s[reps / 2 - 1] + s[reps / 2]);
                double alg = (double)nbytes / med / 1e9;
                double factor = v == V_ALLREDUCE ? 2.0 * (W - 1) / W : (double)(W - 1) / W;
                printf("%-9s %-11s %12.1f %10.1f %10.2f %10.2f %8.1f\n", sz, vname[v], med * 1e6,
                       s[0] * 1e6, alg, alg * factor, (double)fmax[v] / ((double)reps * iters));
            }
            fflush(stdout);
        }
    }
    free(samples);
    free(faults);
    free(src);
    free(work);
    free(recvb);
    free(scratch);
    free(cnt_even);
    free(cnt_bkt);
    MPI_Finalize();
    return 0;
}
