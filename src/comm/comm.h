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

#include "zdp/zdp.h"

/* In-place SUM all-reduce of n floats / doubles. */
zdp_status zdp_comm_allreduce_sum_f32(float *buf, int64_t n, zdp_comm_report *stats,
                                      zdp_error *err);
zdp_status zdp_comm_allreduce_sum_f64(double *buf, int64_t n, zdp_comm_report *stats,
                                      zdp_error *err);
zdp_status zdp_comm_allreduce_sum_i64(int64_t *buf, int64_t n, zdp_comm_report *stats,
                                      zdp_error *err);
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

#endif /* ZDP_COMM_H */
