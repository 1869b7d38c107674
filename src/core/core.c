/*
 * core.c -- status names, error records, logging, counted allocation,
 * creating a directory path.
 */
#define _DEFAULT_SOURCE /* madvise */

#include "core.h"
#include "zdp/engine.h" /* zdp_collective_name is defined here, for comm and the engine */

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#ifdef __linux__
#include <sys/mman.h>
#endif

const char *zdp_status_name(zdp_status s) {
    switch (s) {
#define XX(name, val, desc) case ZDP_##name: return "ZDP_" #name;
        ZDP_STATUS_MAP(XX)
#undef XX
    }
    return "ZDP_UNKNOWN_STATUS";
}

const char *zdp_status_str(zdp_status s) {
    switch (s) {
#define XX(name, val, desc) case ZDP_##name: return desc;
        ZDP_STATUS_MAP(XX)
#undef XX
    }
    return "unknown status";
}

/* The rank that error records and log lines name: zdp_dist_init sets it
 * once (src/comm), so core never asks MPI.  0 until then, as for one
 * process. */
static int rank_ = 0;

void zdp_core_set_rank(int rank) { rank_ = rank; }

zdp_status zdp_err_set(zdp_error *err, zdp_status code, const char *fmt, ...) {
    if (err != NULL) {
        err->code = code;
        err->rank = rank_;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return code;
}

const char *zdp_collective_name(zdp_collective c) {
    switch (c) {
    case ZDP_COLL_ALLREDUCE: return "allreduce";
    case ZDP_COLL_REDUCE_SCATTER: return "reduce_scatter";
    case ZDP_COLL_ALLGATHER: return "allgather";
    case ZDP_COLL_BROADCAST: return "broadcast";
    case ZDP_COLL_COUNT: break;
    }
    return "unknown";
}

uint64_t zdp_splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* N(0, 1) by Box-Muller from two uniforms, u1 in (0, 1], u2 in [0, 1). */
double zdp_rand_normal(uint64_t *state) {
    const double u1 = (double)((zdp_splitmix64(state) >> 11) + 1) * 0x1.0p-53;
    const double u2 = (double)(zdp_splitmix64(state) >> 11) * 0x1.0p-53;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* ---- logging ---- */

static void log_stderr_(int level, const char *msg, void *user) {
    (void)user;
    fprintf(stderr, "[zdp rank %d] %s%s\n", rank_, level > 0 ? "warning: " : "", msg);
}

static zdp_log_fn log_fn_ = log_stderr_;
static void *log_user_ = NULL;

void zdp_set_log(zdp_log_fn fn, void *user) {
    log_fn_ = fn != NULL ? fn : log_stderr_;
    log_user_ = user;
}

void zdp_log(int level, const char *fmt, ...) {
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    log_fn_(level, buf, log_user_);
}

/* ---- counted allocation ---- */

void *zdp_big_alloc(size_t nbytes) {
    if (nbytes == 0) nbytes = 1;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    const size_t huge = (size_t)2 << 20;
    if (nbytes >= huge) {
        const size_t len = (nbytes + huge - 1) / huge * huge;
        void *p = NULL;
        if (len < nbytes || posix_memalign(&p, huge, len) != 0) return NULL;
        (void)madvise(p, len, MADV_HUGEPAGE); /* a hint: refused, the pages stay 4 KB */
        return p;
    }
#endif
    const size_t rounded = (nbytes + 63) & ~(size_t)63;
    return rounded < nbytes ? NULL : aligned_alloc(64, rounded);
}

void *zdp_alloc(zdp_mem_counter *counter, zdp_mem_category cat, size_t nbytes) {
    if (nbytes == 0) nbytes = 1; /* a valid, freeable pointer for empty buffers */
    size_t rounded = (nbytes + 63) & ~(size_t)63;
    if (rounded < nbytes) return NULL;
    void *p = zdp_big_alloc(rounded);
    if (p == NULL) return NULL;
    memset(p, 0, rounded);
    if (counter != NULL) counter->bytes[cat] += (int64_t)nbytes;
    return p;
}

void zdp_free(zdp_mem_counter *counter, zdp_mem_category cat, void *p, size_t nbytes) {
    if (p == NULL) return;
    if (nbytes == 0) nbytes = 1;
    if (counter != NULL) counter->bytes[cat] -= (int64_t)nbytes;
    free(p);
}

/* ---- directories ---- */

int zdp_mkdirs(const char *path) {
    char buf[4096];
    if (strlen(path) >= sizeof buf) return errno = ENAMETOOLONG, -1;
    strcpy(buf, path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    if (mkdir(buf, 0777) != 0 && errno != EEXIST) return -1;
    return 0;
}
