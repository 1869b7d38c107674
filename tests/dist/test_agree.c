/*
 * test_agree.c -- zdp_dist_all_ok_why (CTest runs it at -np 1, 2, 3, 4):
 * every rank returns the same answer and the same report, whichever ranks
 * failed, and the report names them: one rank alone, every rank alike,
 * several ranks alike (lists and ranges), distinct messages, no message,
 * a message longer than a slot, and ranks that do not ask for the report.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "common/check.h"
#include "zdp/zdp.h"

static int W, R;

/* Every rank must hold the same report: compare with rank 0's. */
static void check_same_everywhere_(const char *report) {
    char mine[8192] = "", root[8192] = "";
    snprintf(mine, sizeof mine, "%s", report != NULL ? report : "(null)");
    memcpy(root, mine, sizeof root);
    MPI_Bcast(root, (int)sizeof root, MPI_CHAR, 0, MPI_COMM_WORLD);
    if (strcmp(root, mine) != 0) CHECK_FAIL_("report differs from rank 0's: \"%s\" vs \"%s\"", mine, root);
}

static void expect_(bool ok, const char *why, const char *want) {
    char *report = (char *)"untouched";
    bool all = zdp_dist_all_ok_why(ok, why, &report);
    if (want == NULL) {
        CHECK(all);
        CHECK(report == NULL);
        return;
    }
    CHECK(!all);
    CHECK(report != NULL);
    if (strcmp(report, want) != 0) CHECK_FAIL_("report \"%s\", wanted \"%s\"", report, want);
    check_same_everywhere_(report);
    free(report);
}

static void run_(void) {
    char want[4096], msg[256];

    /* Everyone fine: true, no report. */
    expect_(true, NULL, NULL);

    /* The last rank alone (the case that used to hang the others). */
    snprintf(msg, sizeof msg, "--data tok.bin: cannot open on rank %d", R);
    if (W == 1) snprintf(want, sizeof want, "--data tok.bin: cannot open on rank 0");
    else snprintf(want, sizeof want, "rank %d: --data tok.bin: cannot open on rank %d", W - 1, W - 1);
    expect_(R != W - 1, msg, want);

    /* Every rank alike: the message alone. */
    expect_(false, "c.json: cannot open", "c.json: cannot open");

    /* Even ranks alike, odd ranks fine. */
    if (W == 1) snprintf(want, sizeof want, "even");
    else if (W == 2) snprintf(want, sizeof want, "rank 0: even");
    else snprintf(want, sizeof want, "ranks 0, 2: even");
    expect_(R % 2 == 1, "even", want);

    /* Ranges: every rank but rank 2 (at W = 4: "ranks 0-1, 3"). */
    if (W == 4) expect_(R == 2, "x", "ranks 0-1, 3: x");
    if (W == 3) expect_(R == 2, "x", "ranks 0-1: x");

    /* Distinct messages: one line each, in rank order. */
    snprintf(msg, sizeof msg, "m%d", R);
    want[0] = '\0';
    for (int r = 0; r < W; r++) {
        size_t n = strlen(want);
        if (W == 1) snprintf(want + n, sizeof want - n, "m0");
        else snprintf(want + n, sizeof want - n, "%srank %d: m%d", r ? "\n" : "", r, r);
    }
    expect_(false, msg, want);

    /* No message on the failing rank. */
    if (W == 1) snprintf(want, sizeof want, "(no message)");
    else snprintf(want, sizeof want, "rank %d: (no message)", W - 1);
    expect_(R != W - 1, NULL, want);

    /* A message longer than a slot is cut, not overrun. */
    char *big = malloc(3 * ZDP_ERROR_MSG_MAX);
    CHECK(big != NULL);
    memset(big, 'a', 3 * ZDP_ERROR_MSG_MAX - 1);
    big[3 * ZDP_ERROR_MSG_MAX - 1] = '\0';
    char *report = NULL;
    CHECK(!zdp_dist_all_ok_why(false, big, &report));
    CHECK(report != NULL);
    CHECK_EQ_I64(strlen(report), ZDP_ERROR_MSG_MAX - 1);
    free(report);
    free(big);

    /* Ranks that do not ask for the report still take part. */
    report = NULL;
    bool all = zdp_dist_all_ok_why(R != 0, "rank 0 failed", R == 0 ? NULL : &report);
    CHECK(!all);
    if (R != 0) {
        CHECK(report != NULL && strstr(report, "rank 0 failed") != NULL);
        free(report);
    }
    /* And the plain agreement still lines up afterwards. */
    CHECK(zdp_dist_all_ok(true));
}

int main(int argc, char **argv) { return check_dist_main(&argc, &argv, "test_agree", &W, &R, run_); }
