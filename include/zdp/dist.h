/*
 * zdp/dist.h -- the distributed runtime: start-up, rank, agreement.
 * Part of the public API; include zdp/zdp.h for all of it.
 */
#ifndef ZDP_PUBLIC_DIST_H
#define ZDP_PUBLIC_DIST_H

#include "zdp/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- distributed runtime ---------------------------------------------- */

/* COLLECTIVE.  Initialises MPI (if the caller has not) and pins BLAS threads
 * to cores / ranks-on-this-node.  Safe to call more than once. */
ZDP_API zdp_status zdp_dist_init(int *argc, char ***argv, zdp_error *err);
ZDP_API int zdp_dist_rank(void);       /* 0 before init */
ZDP_API int zdp_dist_world_size(void); /* 1 before init */
/* COLLECTIVE.  Finalises MPI if zdp_dist_init initialised it. */
ZDP_API void zdp_dist_finalize(void);
/* Ends the whole job with `code` (MPI_Abort) after printing msg on this rank:
 * the clean way out of a rank-local failure when other ranks may wait in a
 * collective, or of a ZDP_ERR_FATAL.  Only for programs (the library itself
 * never calls it).  Returns only when MPI is not running (then nothing waits
 * on this process: the caller exits). */
ZDP_API void zdp_dist_abort(int code, const char *msg);
/* COLLECTIVE.  Logical AND of `ok` over all ranks: lets a program agree
 * that every rank succeeded before it goes on. */
ZDP_API bool zdp_dist_all_ok(bool ok);
/* COLLECTIVE.  zdp_dist_all_ok that also carries why: a rank that is not ok
 * passes a one-line message (NULL: none; at most ZDP_ERROR_MSG_MAX - 1 bytes
 * travel).  Returns true when every rank is ok.  Otherwise, when report is
 * not NULL, every rank receives in *report (malloc'd, free() it; NULL if out
 * of memory) the same text, one line per distinct message, naming the ranks
 * that sent it: "rank 2: MSG", "ranks 0-1, 3: MSG", or MSG alone when every
 * rank failed with the same message.  So a failure on any one rank can be
 * printed by rank 0, and no rank is left waiting for one that gave up. */
ZDP_API bool zdp_dist_all_ok_why(bool ok, const char *why, char **report);
/* COLLECTIVE.  Mean of x over all ranks (for reporting losses). */
ZDP_API double zdp_dist_mean(double x);

#ifdef __cplusplus
}
#endif
#endif /* ZDP_PUBLIC_DIST_H */
