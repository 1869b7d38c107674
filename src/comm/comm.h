/*
 * comm.h -- internal: the only door to MPI.
 *
 * Collectives over MPI_COMM_WORLD, blocking, called from the engine's comm
 * stream thread (src/comm/stream.h), so the rest of the code never includes
 * mpi.h and another backend (NCCL) could replace this file.  Counts are in
 * elements.  Each collective adds what it moved to *stats when stats is not
 * NULL (zdp_comm_report: payload, and bytes sent/received by this rank).
 * Failures return ZDP_ERR_COMM with the MPI error string.
 */
#ifndef ZDP_COMM_H
#define ZDP_COMM_H

#include "zdp/core.h"
#include "zdp/dist.h"
#include "zdp/engine.h" /* zdp_comm_report, the per-collective counts the engine reports */

/* In-place SUM all-reduce of n floats / doubles / int64s, in pieces of 8
 * MiB (comm_mpi.c: Open MPI's per-call temporary stays on the heap).
 * Exported (ZDP_API) for tests/dist/test_reduce_scatter.c, which checks the
 * pieces' sums. */
ZDP_API zdp_status zdp_comm_allreduce_sum_f32(float *buf, int64_t n, zdp_comm_report *stats,
                                              zdp_error *err);
ZDP_API zdp_status zdp_comm_allreduce_sum_f64(double *buf, int64_t n, zdp_comm_report *stats,
                                              zdp_error *err);
zdp_status zdp_comm_allreduce_sum_i64(int64_t *buf, int64_t n, zdp_comm_report *stats,
                                      zdp_error *err);
/* Returns once every rank has called it (MPI_Ibarrier), sleeping between
 * polls after a short spin: a rank that reaches a large collective early
 * waits there without taking a core, where Open MPI's blocking collectives
 * poll for as long as the other ranks compute. */
zdp_status zdp_comm_arrive(zdp_error *err);
/* SUM reduce-scatter with uneven counts (MPI_Reduce_scatter): rank r
 * receives recv_counts[r] floats, the r-th consecutive piece of send. */
zdp_status zdp_comm_reduce_scatter_f32(const float *send, float *recv, const int *recv_counts,
                                       zdp_comm_report *stats, zdp_error *err);
/* The same reduce-scatter as a ring of point-to-point messages: W-1 steps,
 * each rank sends one piece to rank r+1 and adds the piece from r-1, so
 * every element crosses each link once and nothing is allocated.  `buf` (the
 * sum of recv_counts floats) is overwritten with partial sums; `scratch`
 * holds the largest piece.  On return rank r's reduced piece is at
 * buf + (recv_counts[0] + ... + recv_counts[r-1]). */
ZDP_API zdp_status zdp_comm_ring_reduce_scatter_f32(float *buf, float *scratch,
                                                    const int *recv_counts, zdp_comm_report *stats,
                                                    zdp_error *err);
/* The reduce-scatter backends: the same SUM reduce-scatter by one of the
 * two algorithms above.  An engine picks its backend once, at creation
 * (zdp_comm_rs_backend_from_env), and calls it through the table entry, so
 * nothing on the reduction path looks the choice up again. */
typedef enum zdp_comm_rs_kind {
    ZDP_COMM_RS_RING, /* zdp_comm_ring_reduce_scatter_f32 (the default) */
    ZDP_COMM_RS_MPI,  /* zdp_comm_reduce_scatter_f32 (MPI_Reduce_scatter) */
    ZDP_COMM_RS_COUNT
} zdp_comm_rs_kind;

/* One reduce-scatter: buf holds the sum of recv_counts floats (overwritten),
 * scratch the largest piece; *piece is set to this rank's reduced piece, in
 * buf (the ring) or in scratch (MPI). */
typedef zdp_status (*zdp_comm_rs_fn)(float *buf, float *scratch, const int *recv_counts,
                                     const float **piece, zdp_comm_report *stats,
                                     zdp_error *err);

typedef struct zdp_comm_rs_backend {
    zdp_comm_rs_kind kind;
    const char *name; /* "ring", "mpi": the values of ZDP_REDUCE_SCATTER */
    zdp_comm_rs_fn reduce_scatter;
} zdp_comm_rs_backend;

/* The backend of `kind` (NULL if out of range). */
ZDP_API const zdp_comm_rs_backend *zdp_comm_rs_backend_get(zdp_comm_rs_kind kind);
/* The backend the environment asks for: ZDP_REDUCE_SCATTER=mpi selects MPI,
 * anything else (unset included) the ring (docs/architecture.md,
 * "The comm stream"). */
ZDP_API const zdp_comm_rs_backend *zdp_comm_rs_backend_from_env(void);
/* Reduce-scatters run through the backend of `kind` in this process so far
 * (any thread): lets a test see which backend an engine uses. */
ZDP_API int64_t zdp_comm_rs_calls(zdp_comm_rs_kind kind);

/* In-place all-gather with uneven pieces: rank r contributes
 * buf[displs[r] .. displs[r] + counts[r]) and everyone receives all pieces. */
zdp_status zdp_comm_allgatherv_inplace_f32(float *buf, const int *counts, const int *displs,
                                           zdp_comm_report *stats, zdp_error *err);
/* Broadcast of n bytes from rank 0. */
zdp_status zdp_comm_bcast_bytes(void *buf, int64_t nbytes, zdp_comm_report *stats,
                                zdp_error *err);

/* ---- a private channel (the training server, src/serve/) ----------------------
 * A duplicate of the world communicator: its messages never match the
 * engine's.  Broadcasts, reductions and gathers are rooted at rank 0;
 * point-to-point messages carry one int and a tag.  A nonblocking call hands
 * back a request that zdp_comm_test (once done), zdp_comm_wait,
 * zdp_comm_cancel or zdp_comm_req_free releases.  Every call returns
 * ZDP_ERR_COMM with the MPI error string on failure.  Exported (ZDP_API):
 * the server is a library of its own, zdp_serve, over libzdp. */
typedef struct zdp_channel zdp_channel;
typedef struct zdp_comm_req zdp_comm_req;

/* COLLECTIVE over the world. */
ZDP_API zdp_status zdp_channel_open(zdp_channel **out, zdp_error *err);
ZDP_API void zdp_channel_close(zdp_channel *ch); /* COLLECTIVE; NULL is a no-op */
/* nbytes from rank 0: nonblocking (nbytes <= INT_MAX) and blocking (any size). */
ZDP_API zdp_status zdp_channel_ibcast(zdp_channel *ch, void *buf, int64_t nbytes, zdp_comm_req **req,
                                      zdp_error *err);
ZDP_API zdp_status zdp_channel_bcast(zdp_channel *ch, void *buf, int64_t nbytes, zdp_error *err);
/* SUM of n floats onto rank 0's buf (in place there; other ranks' buf is read). */
ZDP_API zdp_status zdp_channel_reduce_sum_f32(zdp_channel *ch, float *buf, int64_t n, zdp_error *err);
/* Rank r's nbytes land at all + r * nbytes on rank 0 (all: NULL elsewhere). */
ZDP_API zdp_status zdp_channel_gather(zdp_channel *ch, const void *mine, int64_t nbytes, void *all,
                                      zdp_error *err);
/* The same, nonblocking (nbytes <= INT_MAX): mine and all stay untouched
 * until the request completes. */
ZDP_API zdp_status zdp_channel_igather(zdp_channel *ch, const void *mine, int64_t nbytes, void *all,
                                       zdp_comm_req **req, zdp_error *err);
ZDP_API zdp_status zdp_channel_send_int(zdp_channel *ch, int value, int dest, int tag, zdp_error *err);
/* *value must stay put until the request completes. */
ZDP_API zdp_status zdp_channel_isend_int(zdp_channel *ch, const int *value, int dest, int tag,
                                         zdp_comm_req **req, zdp_error *err);
ZDP_API zdp_status zdp_channel_irecv_int(zdp_channel *ch, int *value, int source, int tag,
                                         zdp_comm_req **req, zdp_error *err);
/* A message with tag from any rank, if one is waiting: received into *value
 * and *source set; else *source = -1. */
ZDP_API zdp_status zdp_channel_poll_int(zdp_channel *ch, int tag, int *source, int *value, zdp_error *err);
/* *done: completed (and released); else still pending. */
ZDP_API zdp_status zdp_comm_test(zdp_comm_req *req, bool *done, zdp_error *err);
ZDP_API zdp_status zdp_comm_wait(zdp_comm_req *req, zdp_error *err);
/* Cancels a pending receive and releases it. */
ZDP_API zdp_status zdp_comm_cancel(zdp_comm_req *req, zdp_error *err);
/* Releases a request nobody will wait for (a send that may never be received). */
ZDP_API void zdp_comm_req_free(zdp_comm_req *req);

#endif /* ZDP_COMM_H */
