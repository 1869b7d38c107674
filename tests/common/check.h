/*
 * check.h -- assertions for MPI tests: a failure prints both sides, the rank
 * and file:line, then ends the whole job (so no rank is left waiting in a
 * collective and CTest sees a non-zero exit, never a hang).
 */
#ifndef ZDP_TEST_CHECK_H
#define ZDP_TEST_CHECK_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zdp/zdp.h"

#define CHECK_FAIL_(...)                                                        \
    do {                                                                        \
        char msg_[2048];                                                        \
        int len_ = snprintf(msg_, sizeof msg_, "%s:%d: ", __FILE__, __LINE__);  \
        snprintf(msg_ + len_, sizeof msg_ - (size_t)len_, __VA_ARGS__);         \
        zdp_dist_abort(1, msg_); /* returns only without MPI */                 \
        exit(1);                                                                \
    } while (0)

#define CHECK(cond)                                                             \
    do {                                                                        \
        if (!(cond)) CHECK_FAIL_("CHECK(%s) failed", #cond);                   \
    } while (0)

#define CHECK_EQ_I64(a, b)                                                      \
    do {                                                                        \
        long long a_ = (long long)(a), b_ = (long long)(b);                     \
        if (a_ != b_) CHECK_FAIL_("%s == %s failed: %lld != %lld", #a, #b, a_, b_); \
    } while (0)

/* A zdp call that must succeed: prints the library's message otherwise. */
#define CHECK_OK(call)                                                          \
    do {                                                                        \
        zdp_error e_ = {0};                                                     \
        zdp_status s_ = (call);                                                 \
        (void)e_;                                                               \
        if (s_ != ZDP_OK) CHECK_FAIL_("%s returned %s", #call, zdp_status_name(s_)); \
    } while (0)

/* A status must be `code` and err.msg must contain `sub`. */
#define CHECK_ERR(status, code, err, sub)                                       \
    do {                                                                        \
        zdp_status s_ = (status);                                               \
        if (s_ != (code))                                                       \
            CHECK_FAIL_("expected %s, got %s (%s)", zdp_status_name(code),     \
                        zdp_status_name(s_), (err).msg);                        \
        if (strstr((err).msg, (sub)) == NULL)                                   \
            CHECK_FAIL_("message \"%s\" lacks \"%s\"", (err).msg, (sub));       \
    } while (0)

/* torch.testing.assert_close for fp32 by default: |a-b| <= atol + rtol*|b|. */
static inline void check_close_(const float *a, const float *b, long long n, double rtol,
                                double atol, const char *what, const char *file, int line) {
    double maxdiff = 0.0;
    long long bad = -1;
    for (long long i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > maxdiff || isnan(d)) maxdiff = d;
        if ((d > atol + rtol * fabs((double)b[i]) || isnan(d)) && bad < 0) bad = i;
    }
    if (bad >= 0) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s:%d: %s: element %lld: %.9g vs %.9g (maxdiff %.3g)", file,
                 line, what, bad, (double)a[bad], (double)b[bad], maxdiff);
        zdp_dist_abort(1, msg);
        exit(1);
    }
}
#define CHECK_CLOSE(a, b, n, rtol, atol, what) check_close_(a, b, n, rtol, atol, what, __FILE__, __LINE__)

/* A zdp_set_log callback for the engine tests: a memory-accounting warning
 * is a failure (the engine's byte counts disagree with what it holds); other
 * warnings print with the rank; info lines stay quiet. */
static inline void check_quiet_log(int level, const char *msg, void *user) {
    (void)user;
    if (strstr(msg, "memory accounting") != NULL) CHECK_FAIL_("%s", msg);
    if (level > 0) fprintf(stderr, "[rank %d] warning: %s\n", zdp_dist_rank(), msg);
}

/* A distributed test's main: starts MPI (zdp_dist_init), sets *W and *R,
 * runs the test, and on rank 0 prints "NAME: all passed at -np W".  A failed
 * check inside ends the whole job (CHECK_FAIL_), so returning means passing.
 * Returns main's exit status: 0, or 1 when MPI did not start. */
static inline int check_dist_main(int *argc, char ***argv, const char *name, int *W, int *R,
                                  void (*run)(void)) {
    zdp_error err;
    if (zdp_dist_init(argc, argv, &err) != ZDP_OK) {
        fprintf(stderr, "%s: %s\n", name, err.msg);
        return 1;
    }
    *W = zdp_dist_world_size();
    *R = zdp_dist_rank();
    run();
    if (*R == 0) printf("%s: all passed at -np %d\n", name, *W);
    zdp_dist_finalize();
    return 0;
}

#endif /* ZDP_TEST_CHECK_H */
