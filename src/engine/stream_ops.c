/*
 * stream_ops.c -- the engine's own operations on its comm stream: stage 0's
 * gradient all-reduce, the agreement all-reduces of backward() and step(),
 * the update's finite-check flag, the parameter broadcast and checkpoint.c's
 * int64 agreement; and the waits for them.
 *
 * Every collective is an operation queued on the engine's comm stream (one
 * worker thread, FIFO), so every rank issues them in the same order
 * whichever thread asked.  The ZeRO paths queue theirs on the same stream
 * (src/zero/buckets.c, stage3.c); the order between the two is the order
 * the engine calls them in.
 */
#include <string.h>

#include "engine_impl.h"

typedef struct engine_op {
    engine_op_kind kind;
    zdp_engine *e;
    void *buf;
    int n; /* OP_ALLREDUCE_I64: elements */
} engine_op;

int zdp_engine_agree_verdict_(const double *a, int world) {
    if (a[0] != 0.0 && a[0] != (double)world) return 1;
    if ((double)world * a[2] != a[1] * a[1]) return 2;
    return 0;
}

/* Stage 0's gradient all-reduce and the mean, on the stream thread.  The
 * ranks meet first at a barrier that sleeps (a rank done with backward
 * early would otherwise poll inside MPI_Allreduce for as long as the others
 * compute), then the buffer goes in pieces of GRAD_PIECE_ floats (one
 * MPI_Allreduce each, comm_mpi.c's size), each scaled by 1/W right after
 * its sum, while it is still in cache: one pass over the buffer fewer than
 * scaling the whole afterwards, and the same products. */
#define GRAD_PIECE_ ((int64_t)1 << 21)

static zdp_status allreduce_grads_(zdp_engine *e, zdp_error *err) {
    zdp_status st = zdp_comm_arrive(err);
    if (st != ZDP_OK) return st;
    const float inv = 1.0f / (float)e->world;
    const int64_t n = e->lay.numel;
    for (int64_t off = 0; off < n; off += GRAD_PIECE_) {
        const int64_t c = n - off < GRAD_PIECE_ ? n - off : GRAD_PIECE_;
        float *g = e->grads + off;
        if ((st = zdp_comm_allreduce_sum_f32(g, c, &e->comm_total, err)) != ZDP_OK) return st;
        for (int64_t i = 0; i < c; i++) g[i] *= inv;
    }
    return ZDP_OK;
}

/* Runs on the stream thread. */
static zdp_status run_op_(void *arg, zdp_error *err) {
    const engine_op *op = arg;
    zdp_engine *e = op->e;
    switch (op->kind) {
    case OP_ALLREDUCE_GRADS:
        return allreduce_grads_(e, err);
    case OP_ALLREDUCE_NORM:
        e->gb.skip = false;
        return zdp_comm_allreduce_sum_f64(op->buf, AGREE_N, &e->comm_total, err);
    case OP_ALLREDUCE_FLAG:
        return zdp_comm_allreduce_sum_f64(op->buf, 1, &e->comm_total, err);
    case OP_AGREE_BACKWARD: {
        zdp_status st = zdp_comm_allreduce_sum_f64(op->buf, AGREE_N, &e->comm_total, err);
        e->gb.skip = st != ZDP_OK || zdp_engine_agree_verdict_(op->buf, e->world) != 0;
        return st;
    }
    case OP_BCAST_PARAMS:
        return zdp_comm_bcast_bytes(e->params, e->lay.numel * (int64_t)sizeof(float),
                                    &e->comm_total, err);
    case OP_ALLREDUCE_I64:
        return zdp_comm_allreduce_sum_i64(op->buf, op->n, &e->comm_total, err);
    }
    return zdp_err_set(err, ZDP_ERR_INTERNAL, "comm stream: unknown operation %d", (int)op->kind);
}

uint64_t zdp_engine_enqueue_(zdp_engine *e, engine_op_kind kind, void *buf) {
    engine_op op = {.kind = kind, .e = e, .buf = buf};
    return zdp_stream_enqueue(e->stream, run_op_, &op, sizeof op);
}

zdp_status zdp_engine_run_sync_(zdp_engine *e, engine_op_kind kind, void *buf, zdp_error *err) {
    return zdp_zero_wait(&e->zl, zdp_engine_enqueue_(e, kind, buf), err);
}

zdp_status zdp_engine_allreduce_i64_(zdp_engine *e, int64_t *buf, int n, zdp_error *err) {
    engine_op op = {.kind = OP_ALLREDUCE_I64, .e = e, .buf = buf, .n = n};
    return zdp_zero_wait(&e->zl, zdp_stream_enqueue(e->stream, run_op_, &op, sizeof op), err);
}
