/*
 * comm.h -- internal: the only door to MPI.
 *
 * Every collective the engine issues goes through these functions, over
 * MPI_COMM_WORLD, so that the rest of the code never includes mpi.h and a
 * different backend (NCCL, a comm stream thread) can replace this file.
 * Counts are in elements.  Collectives return ZDP_ERR_COMM with the MPI error
 * string when MPI reports a failure (Open MPI aborts by default first).
 */
#ifndef ZDP_COMM_H
#define ZDP_COMM_H

#include "zdp/zdp.h"

/* In-place SUM all-reduce of n floats / doubles / int64s. */
zdp_status zdp_comm_allreduce_sum_f32(float *buf, int64_t n, zdp_error *err);
zdp_status zdp_comm_allreduce_sum_f64(double *buf, int64_t n, zdp_error *err);
zdp_status zdp_comm_allreduce_max_i64(int64_t *buf, int64_t n, zdp_error *err);
/* SUM reduce-scatter with uneven counts: rank r receives recv_counts[r]
 * floats (the r-th consecutive piece of send) into recv. */
zdp_status zdp_comm_reduce_scatter_f32(const float *send, float *recv,
                                       const int *recv_counts, zdp_error *err);
/* In-place all-gather with uneven pieces: rank r contributes
 * buf[displs[r] .. displs[r] + counts[r]) and everyone receives all pieces. */
zdp_status zdp_comm_allgatherv_inplace_f32(float *buf, const int *counts,
                                           const int *displs, zdp_error *err);
/* Broadcast of n bytes from rank 0. */
zdp_status zdp_comm_bcast_bytes(void *buf, int64_t nbytes, zdp_error *err);

#endif /* ZDP_COMM_H */
