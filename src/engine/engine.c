/*
 * engine.c -- the forward / backward / step state machine, its counters, and
 * the ZeRO stage 0/1/2/3 paths.
 *
 * What lives where (one owner per buffer, all counted in eng->mem):
 *   params     (padded)  the flat parameter buffer; the model reads views of it
 *   grads      (padded)  stages 0/1: the window's local gradient sum
 *   grad_part  (P)       stages 1/2: this rank's averaged gradient partition
 *   bucket_bufs          stage 2: reduce buckets the model writes into
 *   optim                optimizer state: the whole buffer (stage 0) or the
 *                        partition (stages 1/2)
 *
 * When gradients are reduced (DeepSpeed's schedule, docs/deepspeed.md §3.4, §4.5):
 *   stage 0/1: gradients add up locally over the window; the boundary step()
 *              reduces them once (stage 0: all-reduce; stage 1: bucketed
 *              reduce-scatter into grad_part).  DeepSpeed's managed mode does
 *              this in the boundary backward's epilogue; doing it at the start
 *              of the boundary step() gives the same numbers for every correct
 *              call sequence and stays right when a window has several
 *              backwards at the boundary (see docs/training.md).
 *   stage 2:   every backward reduce-scatters each bucket as soon as all its
 *              tensors are released and adds the rank's piece into grad_part.
 *              Reduce-scatter is linear, so the window's sum of per-backward
 *              means equals one reduction of the summed gradient.
 *
 * Every collective is an operation queued on the engine's comm stream (one
 * worker thread, FIFO), so every rank issues them in the same order.  Stage
 * 2 with overlap_comm queues a finished bucket and lets backward go on with
 * another bucket buffer; reductions still running when backward returns go
 * on behind the next forward/backward, and step() (or a checkpoint) waits
 * for them before reading grad_part.  Without overlap_comm, backward waits
 * for each bucket.  The operations and their order are the same either way,
 * so are the bits.
 *   stage 3:   gradients exactly as stage 2; params holds only the partition,
 *              and the model's zdp_param_fetch gathers a layer on the stream
 *              (prefetched ahead in the order the first pass recorded); the
 *              update runs on the partition with no all-gather after it
 *              (docs/deepspeed.md §4.8).  Every collective inside a stage-3
 *              pass agrees first, and every pass ends with an agreement, so
 *              one rank that cannot go on fails the pass on every rank
 *              (§4.9).
 * Not here: MPI (src/comm), update formulas (src/optim), layout (src/zero).
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <math.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#include "../comm/comm.h"
#include "engine_impl.h"

/* ---- grad sink ---------------------------------------------------------- */

static double now_(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- operations on the comm stream ---------------------------------------- */

typedef enum op_kind {
    OP_ALLREDUCE_GRADS,   /* stage 0: SUM all-reduce of the gradients */
    OP_ALLREDUCE_NORM,    /* step's agreement: SUM all-reduce of AGREE_N_ doubles */
    OP_AGREE_BACKWARD,    /* stage 2: a backward's agreement, the same all-reduce */
    OP_ALLREDUCE_FLAG,    /* stages 1/2: SUM all-reduce of one double (a refusal) */
    OP_REDUCE_BUCKET,     /* stages 1/2: average + reduce-scatter one bucket */
    OP_ALLGATHER_PARAMS,  /* stages 1/2: all-gather the updated partitions */
    OP_BCAST_PARAMS,      /* rank 0's parameters to everyone */
    OP_ALLREDUCE_I64,     /* SUM all-reduce of `bucket` int64s (checkpoint agreement) */
    OP_GATHER_RANGE,      /* stage 3: all-gather the flat range [lo, hi) into buf */
    OP_PASS_END,          /* stage 3: the end-of-pass agreement (engine_impl.h's rows) */
} op_kind;

/* The agreement all-reduce: {in_step, count, count^2, sumsq}, summed over
 * ranks.  A backward at stage 2 sends in_step = 0 and sumsq = 0; step()
 * sends in_step = 1 and its squared gradient norm.  Counts are whole
 * numbers far below 2^26, so every sum is exact in a double. */
#define AGREE_N_ 4

/* What the summed agreement says, the same on every rank: 0 all agree, 1
 * some ranks are in step() and others in backward(), 2 the backward()
 * counts differ (W * sum c^2 == (sum c)^2 only when every c is equal). */
static int agree_verdict_(const double *a, int world) {
    if (a[0] != 0.0 && a[0] != (double)world) return 1;
    if ((double)world * a[2] != a[1] * a[1]) return 2;
    return 0;
}

typedef struct engine_op {
    op_kind kind;
    zdp_engine *e;
    void *buf;
    int bucket;
    int64_t lo, hi; /* OP_GATHER_RANGE */
    int slot;       /* OP_GATHER_RANGE: its verdict slot */
} engine_op;

/* Stage 3 (stream thread): this rank's row {kind, a, b} and every other
 * rank's, summed into e->rows (each rank fills its own row, zeros
 * elsewhere).  One rank alone has nothing to agree with. */
static zdp_status rows_exchange_(zdp_engine *e, int64_t kind, int64_t a, int64_t b,
                                 zdp_error *err) {
    memset(e->rows, 0, (size_t)(ROW_N_ * e->world) * sizeof(int64_t));
    int64_t *mine = e->rows + ROW_N_ * e->rank;
    mine[0] = kind;
    mine[1] = a;
    mine[2] = b;
    if (e->world == 1) return ZDP_OK;
    return zdp_comm_allreduce_sum_i64(e->rows, ROW_N_ * e->world, &e->comm_total, err);
}

/* The first rank whose row is not {kind, a, b}, or -1. */
static int rows_differ_(const zdp_engine *e, int64_t kind, int64_t a, int64_t b) {
    for (int r = 0; r < e->world; r++) {
        const int64_t *row = e->rows + ROW_N_ * r;
        if (row[0] != kind || row[1] != a || row[2] != b) return r;
    }
    return -1;
}

/* Stages 1/2: divide the bucket by W in place (DeepSpeed's order), reduce-
 * scatter it, and put this rank's piece into grad_part: stage 2 adds (the
 * window accumulates over backwards), stage 1 stores (one reduction per
 * window).  buf is the bucket buffer (stage 2) or the bucket's range of the
 * full gradient (stage 1); either may be overwritten. */
static zdp_status reduce_bucket_(zdp_engine *e, int b, float *buf, zdp_error *err) {
    const zdp_bucket *bk = &e->buckets[b];
    const int64_t n = bk->hi - bk->lo, plo = (int64_t)e->rank * e->lay.part;
    const int64_t mine = zdp_layout_owned(&e->lay, e->rank, bk->lo, bk->hi);
    const int64_t dst = (bk->lo > plo ? bk->lo : plo) - plo; /* into grad_part */
    const int64_t src = (bk->lo > plo ? bk->lo : plo) - bk->lo; /* into the bucket */
    const bool accumulate = e->cfg.zero.stage >= 2;
    /* This backward's agreement failed (on every rank alike): no rank
     * reduces, so the ranks stay matched collective for collective. */
    if (e->stream_skip) return ZDP_OK;
    if (e->cfg.zero.stage == 3 && e->world > 1) {
        /* Inside a stage-3 backward, gathers and reductions interleave: a
         * rank whose model stopped early must not meet a reduce-scatter
         * with a gather (engine_impl.h's rows). */
        zdp_status ast = rows_exchange_(e, ROW_REDUCE, b, 0, err);
        if (ast != ZDP_OK) return ast;
        if (rows_differ_(e, ROW_REDUCE, b, 0) >= 0) {
            e->pass_bad = true;
            return ZDP_OK;
        }
    }
    if (e->world > 1) {
        const float w = (float)e->world;
        for (int64_t i = 0; i < n; i++) buf[i] /= w;
    }
    const float *piece;
    zdp_status st = ZDP_OK;
    if (e->world == 1) {
        piece = buf + src;
    } else if (!e->cfg.zero.reduce_scatter) {
        /* reduce_scatter=false: all-reduce the whole bucket, keep our piece. */
        st = zdp_comm_allreduce_sum_f32(buf, n, &e->comm_total, err);
        piece = buf + src;
    } else {
        for (int r = 0; r < e->world; r++)
            e->rs_counts[r] = (int)zdp_layout_owned(&e->lay, r, bk->lo, bk->hi);
        st = e->rs->reduce_scatter(buf, e->rs_scratch, e->rs_counts, &piece, &e->comm_total,
                                   err);
    }
    if (st != ZDP_OK) return st;
    float *out = e->grad_part + dst;
    if (accumulate)
        for (int64_t i = 0; i < mine; i++) out[i] += piece[i];
    else
        memcpy(out, piece, (size_t)mine * sizeof(float));
    return ZDP_OK;
}

/* Stages 1/2: every rank gets the updated partitions of the others, in
 * shards of about allgather_bucket_size elements (DeepSpeed's sharding rule). */
static zdp_status allgather_params_(zdp_engine *e, zdp_error *err) {
    int64_t P = e->lay.part, total = P * e->world;
    int64_t shards = total / e->cfg.zero.allgather_bucket_size;
    if (shards < 1) shards = 1;
    if (shards > P / 2) shards = P / 2 > 0 ? P / 2 : 1;
    int64_t shard = P / shards / 2 * 2; /* a multiple of 2, the last takes the rest */
    for (int64_t k = 0; k < shards; k++) {
        int64_t off = k * shard, len = k == shards - 1 ? P - off : shard;
        for (int r = 0; r < e->world; r++) {
            e->ag_counts[r] = (int)len;
            e->ag_displs[r] = (int)(r * P + off);
        }
        zdp_status st = zdp_comm_allgatherv_inplace_f32(e->params, e->ag_counts, e->ag_displs,
                                                        &e->comm_total, err);
        if (st != ZDP_OK) return st;
    }
    return ZDP_OK;
}

/* Stage 3: the flat range [lo, hi) whole into buf (hi - lo floats): each
 * rank puts in the piece its partition holds, then one all-gather. */
static zdp_status gather_range_(zdp_engine *e, float *buf, int64_t lo, int64_t hi, int slot,
                                zdp_error *err) {
    const int64_t P = e->lay.part;
    /* Every rank gathers, or none does: a rank without a buffer (or one
     * asking for another range, or already at the end of its pass) makes
     * the verdict bad on every rank, and the one who waits for it reports. */
    gather_verdict *v = &e->verdicts[slot];
    zdp_status ast = rows_exchange_(e, buf != NULL ? ROW_GATHER : ROW_NOMEM, lo, hi, err);
    if (ast != ZDP_OK) return ast;
    v->bad_rank = rows_differ_(e, ROW_GATHER, lo, hi);
    if (v->bad_rank >= 0) {
        memcpy(v->row, e->rows + ROW_N_ * v->bad_rank, sizeof v->row);
        /* Out of memory on a rank is agreed on; anything else means the
         * ranks' passes went apart. */
        if (v->row[0] != ROW_NOMEM || v->row[1] != lo || v->row[2] != hi) e->pass_bad = true;
        return ZDP_OK;
    }
    for (int r = 0; r < e->world; r++) {
        int64_t a = lo > r * P ? lo : r * P, b = hi < (r + 1) * P ? hi : (r + 1) * P;
        e->ag_counts[r] = b > a ? (int)(b - a) : 0;
        e->ag_displs[r] = b > a ? (int)(a - lo) : 0;
    }
    const int64_t plo = (int64_t)e->rank * P;
    const int64_t a = lo > plo ? lo : plo;
    if (e->ag_counts[e->rank] > 0)
        memcpy(buf + e->ag_displs[e->rank], e->params + (a - plo),
               (size_t)e->ag_counts[e->rank] * sizeof(float));
    if (e->world == 1) return ZDP_OK;
    return zdp_comm_allgatherv_inplace_f32(buf, e->ag_counts, e->ag_displs, &e->comm_total, err);
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
        e->stream_skip = false;
        return zdp_comm_allreduce_sum_f64(op->buf, AGREE_N_, &e->comm_total, err);
    case OP_ALLREDUCE_FLAG:
        return zdp_comm_allreduce_sum_f64(op->buf, 1, &e->comm_total, err);
    case OP_AGREE_BACKWARD: {
        zdp_status st = zdp_comm_allreduce_sum_f64(op->buf, AGREE_N_, &e->comm_total, err);
        e->stream_skip = st != ZDP_OK || agree_verdict_(op->buf, e->world) != 0;
        return st;
    }
    case OP_REDUCE_BUCKET:
        return reduce_bucket_(e, op->bucket, op->buf, err);
    case OP_ALLGATHER_PARAMS:
        return allgather_params_(e, err);
    case OP_BCAST_PARAMS:
        return zdp_comm_bcast_bytes(e->params, e->lay.numel * (int64_t)sizeof(float),
                                    &e->comm_total, err);
    case OP_ALLREDUCE_I64:
        return zdp_comm_allreduce_sum_i64(op->buf, op->bucket, &e->comm_total, err);
    case OP_GATHER_RANGE:
        return gather_range_(e, op->buf, op->lo, op->hi, op->slot, err);
    case OP_PASS_END: {
        /* The flag: 2 this rank's model failed, 1 a collective of its pass
         * disagreed, 0 clean. */
        const bool bad = e->pass_bad || (e->frozen != NULL && e->frozen->pass_bad);
        if (e->frozen != NULL) e->frozen->pass_bad = false; /* carried by this row */
        zdp_status st = rows_exchange_(e, ROW_END, e->end_model_failed ? 2 : bad ? 1 : 0, 0, err);
        if (st != ZDP_OK) return st;
        e->end_done = true;
        e->end_fail_rank = -1;
        e->end_fail_flag = 0;
        for (int r = 0; r < e->world; r++) {
            const int64_t *row = e->rows + ROW_N_ * r;
            if (row[0] != ROW_END) e->end_done = false;
            else if (row[1] > e->end_fail_flag) {
                e->end_fail_rank = r;
                e->end_fail_flag = (int)row[1];
            }
        }
        /* A rank still in its pass: this one says so again until it ends. */
        e->pass_bad = !e->end_done;
        return ZDP_OK;
    }
    }
    return zdp_err_set(err, ZDP_ERR_INTERNAL, "comm stream: unknown operation %d", (int)op->kind);
}

static uint64_t enqueue_(zdp_engine *e, op_kind kind, void *buf, int bucket) {
    engine_op op = {.kind = kind, .e = e, .buf = buf, .bucket = bucket};
    return zdp_stream_enqueue(e->stream, run_op_, &op, sizeof op);
}

/* Waits for an event on the stream, counting the time as communication wait. */
static zdp_status wait_(zdp_engine *e, uint64_t event, zdp_error *err) {
    double t0 = now_();
    zdp_status st = zdp_stream_wait(e->stream, event, err);
    e->timing_window.comm_wait_s += now_() - t0;
    return st;
}

static zdp_status run_sync_(zdp_engine *e, op_kind kind, void *buf, zdp_error *err) {
    return wait_(e, enqueue_(e, kind, buf, -1), err);
}

zdp_status zdp_engine_allreduce_i64_(zdp_engine *e, int64_t *buf, int n, zdp_error *err) {
    return wait_(e, enqueue_(e, OP_ALLREDUCE_I64, buf, n), err);
}

/* ---- stage 2 bucket buffers ------------------------------------------------- */

/* Waits for the oldest bucket in flight and takes its buffer back. */
static zdp_status reclaim_oldest_(zdp_engine *e, zdp_error *err) {
    int k = e->inflight_head;
    zdp_status st = wait_(e, e->inflight_event[k], err);
    e->pool[e->pool_free++] = e->inflight_buf[k];
    e->inflight_head = (k + 1) % e->pool_cap;
    e->inflight_count--;
    return st;
}

static zdp_status reclaim_all_(zdp_engine *e, zdp_error *err) {
    zdp_status first = ZDP_OK;
    while (e->inflight_count > 0) {
        zdp_status st = reclaim_oldest_(e, err);
        if (first == ZDP_OK) first = st;
    }
    return first;
}

/* At most this many bucket reductions run behind compute before backward
 * waits for the oldest: one in flight while the next bucket fills is
 * DeepSpeed's double buffering. */
#define MAX_INFLIGHT_ 1

zdp_status zdp_engine_drain_(zdp_engine *e, zdp_error *err) { return reclaim_all_(e, err); }

static float *bucket_take_buffer_(zdp_engine *e, int b) {
    /* Reductions that already finished give their buffers back for free. */
    while (e->inflight_count > 0 &&
           zdp_stream_done(e->stream, e->inflight_event[e->inflight_head])) {
        zdp_status st = reclaim_oldest_(e, &e->sink.comm_err);
        if (st != ZDP_OK && e->sink.comm_status == ZDP_OK) e->sink.comm_status = st;
    }
    while (e->pool_free == 0 && e->inflight_count > 0 &&
           (e->inflight_count > MAX_INFLIGHT_ || e->pool_total == e->pool_cap)) {
        zdp_status st = reclaim_oldest_(e, &e->sink.comm_err);
        if (st != ZDP_OK && e->sink.comm_status == ZDP_OK) e->sink.comm_status = st;
    }
    if (e->pool_free == 0) {
        /* Every buffer is filling or in flight: the model keeps several
         * buckets open at once (SimpleModel reuses layer i/2 until step i/2
         * of backward); grow the pool rather than stall compute behind the
         * network (counted in the memory report). */
        if (e->pool_total == e->pool_cap) return NULL;
        float *buf = zdp_alloc(&e->mem, ZDP_MEM_BUCKETS, (size_t)e->bucket_elems * sizeof(float));
        if (buf == NULL) return NULL;
        e->pool[e->pool_free++] = buf;
        e->pool_total++;
    }
    float *buf = e->pool[--e->pool_free];
    zdp_bucket *bk = &e->buckets[b];
    memset(buf, 0, (size_t)(bk->hi - bk->lo) * sizeof(float));
    e->bucket_buf[b] = buf;
    return buf;
}

/* Stage 2: a bucket is complete; queue its reduction.  Without overlap_comm
 * wait for it at once; with it, backward goes on and the buffer comes back
 * when a new bucket needs one or at the end of backward. */
static void bucket_done_(zdp_engine *e, int b) {
    float *buf = e->bucket_buf[b];
    e->bucket_buf[b] = NULL;
    int k = (e->inflight_head + e->inflight_count) % e->pool_cap;
    e->inflight_buf[k] = buf;
    e->inflight_event[k] = enqueue_(e, OP_REDUCE_BUCKET, buf, b);
    e->inflight_count++;
    if (!e->cfg.zero.overlap_comm) {
        zdp_status st = reclaim_all_(e, &e->sink.comm_err);
        if (st != ZDP_OK && e->sink.comm_status == ZDP_OK) e->sink.comm_status = st;
    }
}

static void sink_misuse_(zdp_grad_sink *s, int i, const char *what) {
    if (s->misuse_tensor < 0) {
        s->misuse_tensor = i;
        s->misuse = what;
    }
}

zdp_grad_sink *zdp_grad_sink_create_dense(float *const *grads, int n_tensors) {
    zdp_grad_sink *s = calloc(1, sizeof *s);
    if (s != NULL) {
        s->dense = grads;
        s->n_dense = n_tensors;
    }
    return s;
}

float *zdp_grad_acquire(zdp_grad_sink *s, int i) {
    if (s == NULL) return NULL;
    if (s->dense != NULL) return i >= 0 && i < s->n_dense ? s->dense[i] : NULL;
    zdp_engine *e = s->eng;
    if (i < 0 || i >= e->lay.n_tensors) {
        sink_misuse_(s, i, "acquired with an index out of range");
        return NULL;
    }
    if (s->state[i] == SINK_RELEASED) {
        sink_misuse_(s, i, "acquired after it was released in the same backward");
        return NULL;
    }
    int64_t off = e->lay.offsets[i];
    if (e->cfg.zero.stage < 2) {
        s->state[i] = SINK_ACQUIRED;
        return e->grads + off;
    }
    int b = e->tensor_bucket[i];
    float *buf = e->bucket_buf[b];
    if (buf == NULL && (buf = bucket_take_buffer_(e, b)) == NULL) {
        sink_misuse_(s, i, "could not get a bucket buffer (out of memory)");
        return NULL;
    }
    s->state[i] = SINK_ACQUIRED;
    return buf + (off - e->buckets[b].lo);
}

void zdp_grad_release(zdp_grad_sink *s, int i) {
    if (s == NULL || s->dense != NULL) return;
    zdp_engine *e = s->eng;
    if (i < 0 || i >= e->lay.n_tensors) {
        sink_misuse_(s, i, "released with an index out of range");
        return;
    }
    if (s->state[i] == SINK_RELEASED) {
        sink_misuse_(s, i, "released twice in one backward");
        return;
    }
    if (e->cfg.zero.stage >= 2) {
        int b = e->tensor_bucket[i];
        /* A tensor that got no gradient still takes part (as zeros), so every
         * rank issues the same collectives whatever its model did. */
        if (e->bucket_buf[b] == NULL && bucket_take_buffer_(e, b) == NULL) {
            sink_misuse_(s, i, "could not get a bucket buffer (out of memory)");
            return;
        }
        s->state[i] = SINK_RELEASED;
        if (--e->bucket_pending[b] == 0) bucket_done_(e, b);
        return;
    }
    s->state[i] = SINK_RELEASED;
}

static void sink_begin_(zdp_engine *e) {
    memset(e->sink.state, SINK_IDLE, (size_t)e->lay.n_tensors);
    e->sink.misuse_tensor = -1;
    e->sink.misuse = NULL;
    e->sink.comm_status = ZDP_OK;
    for (int b = 0; b < e->n_buckets; b++)
        e->bucket_pending[b] = e->buckets[b].last - e->buckets[b].first + 1;
}

/* Releases what the model left open, last tensor first, so every bucket is
 * reduced in the planned order on every rank. */
static void sink_end_(zdp_engine *e) {
    for (int i = e->lay.n_tensors - 1; i >= 0; i--)
        if (e->sink.state[i] != SINK_RELEASED) zdp_grad_release(&e->sink, i);
    /* Without overlap_comm every reduction has finished here.  With it,
     * reductions still in flight go on behind the next forward and backward:
     * grad_part is read only by step(), which waits for the stream first. */
}

/* ---- the param source ---------------------------------------------------- */

zdp_param_source *zdp_param_source_create_dense(const float *const *params, int n_params) {
    zdp_param_source *s = calloc(1, sizeof *s);
    if (s != NULL) {
        s->dense = params;
        s->n_dense = n_params;
    }
    return s;
}

/* ---- stage 3: agreed gathers ---- */

/* Queues the agreed gather of the flat range [lo, hi) into buf (NULL when
 * this rank could not allocate it); *slot gets its verdict's slot. */
static uint64_t gather_queue_(zdp_engine *e, float *buf, int64_t lo, int64_t hi, int *slot) {
    *slot = (int)(e->gather_seq++ % e->n_verdicts);
    engine_op op = {.kind = OP_GATHER_RANGE, .e = e, .buf = buf, .lo = lo, .hi = hi,
                    .slot = *slot};
    return zdp_stream_enqueue(e->stream, run_op_, &op, sizeof op);
}

/* A gather buffer: counted memory, except where the test hook
 * (ZDP_TEST_FAIL_GATHER) makes this rank's N-th allocation fail. */
static float *gather_alloc_(zdp_engine *e, int64_t n) {
    e->gather_allocs++;
    if (e->rank == e->fail_rank && e->gather_allocs == e->fail_nth) return NULL;
    return zdp_alloc(&e->mem, ZDP_MEM_GATHERED, (size_t)n * sizeof(float));
}

static const char *pass_name_(const zdp_engine *e) {
    return e->pass_kind == PASS_BACKWARD ? "backward()" : "forward()";
}

/* The error of a gather whose verdict is bad, the same story on every
 * rank; what: the call that asked for it (names the tensors). */
static zdp_status verdict_error_(const zdp_engine *e, int slot, const char *what, int64_t lo,
                                 int64_t hi, zdp_error *err) {
    const gather_verdict *v = &e->verdicts[slot];
    if (v->bad_rank < 0) return ZDP_OK;
    const int64_t *row = v->row;
    if (row[0] == ROW_NOMEM && row[1] == lo && row[2] == hi)
        return zdp_err_set(err, ZDP_ERR_NOMEM,
                           "%s: rank %d cannot allocate %lld bytes to gather it (ZeRO stage 3); "
                           "no rank gathered, this %s stops here on every rank and nothing was "
                           "changed (lower stage3_prefetch_bucket_size or "
                           "stage3_max_live_parameters, or use more ranks)",
                           what, v->bad_rank, (long long)((hi - lo) * 4), pass_name_(e));
    if (row[0] == ROW_END)
        return zdp_err_set(err, ZDP_ERR_STATE,
                           "%s: rank %d has already ended this %s (its model stopped early; its "
                           "own error says why) while this rank asked to gather flat elements "
                           "[%lld, %lld); this %s stops here on every rank",
                           what, v->bad_rank, pass_name_(e), (long long)lo, (long long)hi,
                           pass_name_(e));
    if (row[0] == ROW_REDUCE)
        return zdp_err_set(err, ZDP_ERR_STATE,
                           "%s: rank %d was reducing gradient bucket %lld where this rank gathers "
                           "flat elements [%lld, %lld): the ranks' models fetch different layers "
                           "or in a different order (every rank must run the same model code); "
                           "this %s stops here on every rank",
                           what, v->bad_rank, (long long)row[1], (long long)lo, (long long)hi,
                           pass_name_(e));
    return zdp_err_set(err, ZDP_ERR_STATE,
                       "%s: rank %d gathered flat elements [%lld, %lld) where this rank gathers "
                       "[%lld, %lld): the ranks' models fetch different layers or in a different "
                       "order (every rank must run the same model code); this %s stops here on "
                       "every rank",
                       what, v->bad_rank, (long long)row[1], (long long)row[2], (long long)lo,
                       (long long)hi, pass_name_(e));
}

/* Stage 3: the persistent tensors whole again after their partitions
 * changed (an update, set_param, a checkpoint load): one gather per run of
 * consecutive persistent tensors.  Every rank gets here alike (the calls
 * that make it stale are made on every rank). */
static zdp_status persist_refresh_(zdp_engine *e, zdp_error *err) {
    if (!e->persist_stale) return ZDP_OK;
    const int nt = e->lay.n_tensors;
    uint64_t last = 0;
    for (int i = 0; i < nt;) {
        if (e->persist_off[i] < 0) {
            i++;
            continue;
        }
        int j = i, slot;
        while (j + 1 < nt && e->persist_off[j + 1] >= 0) j++;
        last = gather_queue_(e, e->persist + e->persist_off[i], e->lay.offsets[i],
                             e->lay.offsets[j] + e->lay.numels[j], &slot);
        i = j + 1;
    }
    zdp_status st = last > 0 ? wait_(e, last, err) : ZDP_OK;
    /* The runs' verdicts, in order (each run took the next slot). */
    int64_t seq = e->gather_seq;
    for (int i = nt - 1; st == ZDP_OK && i >= 0;) {
        if (e->persist_off[i] < 0) {
            i--;
            continue;
        }
        int j = i;
        while (j - 1 >= 0 && e->persist_off[j - 1] >= 0) j--;
        const int slot = (int)(--seq % e->n_verdicts);
        char what[320];
        snprintf(what, sizeof what, "persistent parameters %s..%s", e->model->params[j].name,
                 e->model->params[i].name);
        st = verdict_error_(e, slot, what, e->lay.offsets[j], e->lay.offsets[i] + e->lay.numels[i],
                            err);
        i = j - 1;
    }
    if (st == ZDP_OK) e->persist_stale = false;
    return st;
}

/* Elements gathered now (fetched, prefetched, kept for reuse), of the
 * parameters and of the frozen weights together: the live bound and the
 * peak cover both. */
static int64_t live_elems_(const zdp_engine *e) {
    const zdp_engine *root = e->parent != NULL ? e->parent : e;
    return root->gathered_elems + (root->frozen != NULL ? root->frozen->gathered_elems : 0);
}

/* ---- stage 3 prefetch ---- */

static void rec_free_(zdp_engine *e, int k);

/* Frees one range kept for reuse (refs == 0), the most recent; false when
 * none is kept. */
static bool reuse_evict_one_(zdp_engine *e) {
    for (int k = e->n_recs - 1; k >= 0; k--)
        if (e->recs[k].refs == 0) {
            rec_free_(e, k);
            return true;
        }
    return false;
}

static int64_t extent_(const zdp_engine *e, int first, int count) {
    const int last = first + count - 1;
    return e->lay.offsets[last] + e->lay.numels[last] - e->lay.offsets[first];
}

static void peak_update_(zdp_engine *e) {
    zdp_engine *root = e->parent != NULL ? e->parent : e;
    const int64_t now = live_elems_(e) * (int64_t)sizeof(float);
    if (now > root->gathered_peak) root->gathered_peak = now;
}

static void gathered_free_(zdp_engine *e, float *buf, int64_t elems) {
    e->gathered_elems -= elems;
    zdp_free(&e->mem, ZDP_MEM_GATHERED, buf, (size_t)elems * sizeof(float));
}

/* Drops prefetch k (its gather has run or the stream has stopped); its
 * buffer is freed unless it became a live fetch's. */
static void pf_remove_(zdp_engine *e, int k, bool free_buf) {
    gather_rec *r = &e->pf[k];
    for (int i = r->first; i < r->first + r->count; i++) e->pf_of[i] = -1;
    e->pf_elems -= r->elems;
    if (free_buf) gathered_free_(e, r->buf, r->elems);
    for (int j = k; j + 1 < e->n_pf; j++) {
        e->pf[j] = e->pf[j + 1];
        for (int i = e->pf[j].first; i < e->pf[j].first + e->pf[j].count; i++) e->pf_of[i] = j;
    }
    e->n_pf--;
}

/* Every prefetch not asked for: waited for (its buffer is being written on
 * the stream) and freed.  wait = false once the stream is gone (destroy). */
static void pf_cancel_all_(zdp_engine *e, bool wait) {
    while (e->n_pf > 0) {
        if (wait) {
            zdp_error ignored = {0};
            (void)zdp_stream_wait(e->stream, e->pf[e->n_pf - 1].event, &ignored);
        }
        pf_remove_(e, e->n_pf - 1, true);
    }
}

/* One fetch against the pass's trace: recorded on the first pass of its
 * kind, compared on later ones (a different fetch ends prefetching for the
 * rest of the pass). */
static void trace_note_(zdp_engine *e, int first, int count) {
    fetch_trace *t = &e->trace[e->pass_kind];
    if (!t->done) {
        if (t->len < t->cap) {
            t->first[t->len] = first;
            t->count[t->len] = count;
            t->len++;
        }
        return;
    }
    if (e->trace_ok && e->trace_pos < t->len && t->first[e->trace_pos] == first &&
        t->count[e->trace_pos] == count)
        e->trace_pos++;
    else
        e->trace_ok = false;
}

/* Queues the gathers of the next trace entries, ahead of the model, while
 * the prefetched elements stay within stage3_prefetch_bucket_size and all
 * gathered ones within stage3_max_live_parameters.  Every rank runs the same
 * model code, so every rank queues the same gathers in the same order: the
 * decision reads only counts every rank keeps alike (gathered_elems counts a
 * buffer that failed to allocate too), and a rank without its buffer still
 * queues the gather, whose agreement then fails on every rank (the model's
 * fetch of it reports). */
static void prefetch_more_(zdp_engine *e) {
    const fetch_trace *t = &e->trace[e->pass_kind];
    const zdp_zero_config *z = &e->cfg.zero;
    if (z->stage3_prefetch_bucket_size <= 0 || !t->done || !e->trace_ok) return;
    if (e->next_pf < e->trace_pos) e->next_pf = e->trace_pos;
    while (e->next_pf < t->len) {
        const int f = t->first[e->next_pf], c = t->count[e->next_pf];
        bool skip = true; /* all persistent, or already live or prefetched */
        for (int i = f; i < f + c; i++) {
            if (e->live_of[i] >= 0 || e->pf_of[i] >= 0) {
                skip = true;
                break;
            }
            if (e->persist_off[i] < 0) skip = false;
        }
        if (skip) {
            e->next_pf++;
            continue;
        }
        const int64_t n = extent_(e, f, c);
        if (e->pf_elems + n > z->stage3_prefetch_bucket_size) return;
        /* Ranges kept for reuse give way to the prefetch of what comes
         * next (every rank keeps and evicts alike). */
        while (live_elems_(e) + n > z->stage3_max_live_parameters && reuse_evict_one_(e)) {
        }
        if (live_elems_(e) + n > z->stage3_max_live_parameters) return;
        gather_rec *r = &e->pf[e->n_pf];
        *r = (gather_rec){.first = f, .count = c, .buf = gather_alloc_(e, n), .elems = n};
        r->event = gather_queue_(e, r->buf, e->lay.offsets[f], e->lay.offsets[f] + n, &r->slot);
        for (int i = f; i < f + c; i++) e->pf_of[i] = e->n_pf;
        e->n_pf++;
        e->pf_elems += n;
        e->gathered_elems += n;
        e->next_pf++;
        peak_update_(e);
    }
}

/* "zdp_param_fetch(first, count) (name..name)" for errors. */
static void fetch_what_(const zdp_engine *e, int first, int count, char *out, size_t cap) {
    const zdp_param_info *pi = e->model->params;
    snprintf(out, cap, "zdp_param_fetch(%d, %d) (%s..%s)", first, count, pi[first].name,
             pi[first + count - 1].name);
}

/* A prefetched range the model asks for becomes live. */
static zdp_status pf_take_(zdp_engine *e, int k, zdp_error *err) {
    gather_rec p = e->pf[k];
    zdp_status st = wait_(e, p.event, err);
    const int64_t lo = e->lay.offsets[p.first];
    if (st == ZDP_OK) {
        char what[320];
        fetch_what_(e, p.first, p.count, what, sizeof what);
        st = verdict_error_(e, p.slot, what, lo, lo + p.elems, err);
    }
    pf_remove_(e, k, st != ZDP_OK);
    if (st != ZDP_OK) return st;
    p.refs = 1;
    e->recs[e->n_recs] = p;
    for (int i = p.first; i < p.first + p.count; i++) {
        e->live_of[i] = e->n_recs;
        if (e->persist_off[i] < 0) e->table[i] = p.buf + (e->lay.offsets[i] - lo);
    }
    e->n_recs++;
    e->prefetch_hits++;
    return ZDP_OK;
}

/* Stage 3's fetch: the same live range again, the persistent copies, a
 * prefetched range, or a new gather of the range's flat extent. */
static zdp_status fetch3_(zdp_engine *e, int first, int count, zdp_error *err) {
    const zdp_param_info *pi = e->model->params;
    if (!e->in_pass)
        return zdp_err_set(err, ZDP_ERR_STATE,
                           "zdp_param_fetch(%d, %d) (%s): outside the model's forward or "
                           "backward; at ZeRO stage 3 parameters are gathered only while the "
                           "engine runs the model",
                           first, count, pi[first].name);
    const int last = first + count - 1;
    trace_note_(e, first, count);
    int k = e->pf_of[first];
    if (k >= 0 && e->pf[k].first == first && e->pf[k].count == count) {
        zdp_status st = pf_take_(e, k, err);
        if (st == ZDP_OK) prefetch_more_(e);
        return st;
    }
    for (int i = first; i <= last; i++)
        if (e->pf_of[i] >= 0) { /* the model left the trace: drop what was gathered ahead */
            pf_cancel_all_(e, true);
            e->trace_ok = false;
            break;
        }
    int rec = e->live_of[first];
    if (rec >= 0 && e->recs[rec].first == first && e->recs[rec].count == count) {
        if (e->recs[rec].refs++ == 0) {
            e->reuse_hits++;
            prefetch_more_(e);
        }
        return ZDP_OK;
    }
    bool all_persistent = true;
    for (int i = first; i <= last; i++) {
        if (e->live_of[i] >= 0 && e->recs[e->live_of[i]].refs == 0)
            rec_free_(e, e->live_of[i]); /* kept for reuse, overlapped: gather anew */
        if (e->live_of[i] >= 0) {
            const gather_rec *r = &e->recs[e->live_of[i]];
            return zdp_err_set(err, ZDP_ERR_STATE,
                               "zdp_param_fetch(%d, %d): tensor %d (%s) is live in the fetch of "
                               "[%d, %d); fetch exactly that range again or release it first",
                               first, count, i, pi[i].name, r->first, r->first + r->count);
        }
        if (e->persist_off[i] < 0) all_persistent = false;
    }
    zdp_status st = persist_refresh_(e, err);
    if (st != ZDP_OK) return st;
    if (all_persistent) {
        prefetch_more_(e);
        return ZDP_OK;
    }
    /* Without its buffer this rank still takes part in the gather's
     * agreement, so every rank fails here together. */
    const int64_t lo = e->lay.offsets[first], hi = e->lay.offsets[last] + e->lay.numels[last];
    gather_rec *r = &e->recs[e->n_recs];
    *r = (gather_rec){.first = first, .count = count, .refs = 1, .elems = hi - lo};
    r->buf = gather_alloc_(e, r->elems);
    e->gathered_elems += r->elems;
    int slot;
    st = wait_(e, gather_queue_(e, r->buf, lo, hi, &slot), err);
    if (st == ZDP_OK) {
        char what[320];
        fetch_what_(e, first, count, what, sizeof what);
        st = verdict_error_(e, slot, what, lo, hi, err);
    }
    if (st != ZDP_OK) {
        gathered_free_(e, r->buf, r->elems);
        return st;
    }
    for (int i = first; i <= last; i++) {
        e->live_of[i] = e->n_recs;
        if (e->persist_off[i] < 0) e->table[i] = r->buf + (e->lay.offsets[i] - lo);
    }
    e->n_recs++;
    peak_update_(e);
    prefetch_more_(e);
    return ZDP_OK;
}

zdp_status zdp_param_fetch(zdp_param_source *src, int first, int count,
                           const float *const **table, zdp_error *err) {
    if (table != NULL) *table = NULL;
    if (src == NULL || table == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_param_fetch: src and table must be set");
    const int n = src->eng != NULL ? src->eng->lay.n_tensors : src->n_dense;
    if (first < 0 || count < 1 || first > n - count)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "zdp_param_fetch: tensors [%d, %d + %d) out of the model's %d; the "
                           "model asked for a layer it does not have",
                           first, first, count, n);
    if (src->eng == NULL) {
        *table = src->dense;
        return ZDP_OK;
    }
    zdp_engine *e = src->eng;
    if (e->cfg.zero.stage < 3) {
        *table = (const float *const *)e->param_ptrs;
        return ZDP_OK;
    }
    zdp_status st = fetch3_(e, first, count, err);
    if (st == ZDP_OK) *table = e->table;
    return st;
}

/* Frees record k (moving the last record into its slot). */
static void rec_free_(zdp_engine *e, int k) {
    gather_rec *r = &e->recs[k];
    for (int i = r->first; i < r->first + r->count; i++) {
        e->live_of[i] = -1;
        e->table[i] = e->persist_off[i] >= 0 ? e->persist + e->persist_off[i] : NULL;
    }
    gathered_free_(e, r->buf, r->elems);
    const int lastk = --e->n_recs;
    if (k != lastk) {
        e->recs[k] = e->recs[lastk];
        for (int i = e->recs[k].first; i < e->recs[k].first + e->recs[k].count; i++)
            e->live_of[i] = k;
    }
}

/* stage3_max_reuse_distance (DeepSpeed's rule, docs/deepspeed.md §4.8): a
 * range the model releases stays gathered when the pass's trace fetches it
 * again before more than that many elements of other fetches, and the
 * gathered elements stay within stage3_max_live_parameters.  Only a pass
 * that replays its trace knows what comes next. */
static bool reuse_soon_(const zdp_engine *e, int k) {
    const zdp_zero_config *z = &e->cfg.zero;
    const fetch_trace *t = &e->trace[e->pass_kind];
    const gather_rec *r = &e->recs[k];
    if (z->stage3_max_reuse_distance <= 0 || !t->done || !e->trace_ok) return false;
    if (live_elems_(e) > z->stage3_max_live_parameters) return false;
    int64_t dist = 0;
    for (int p = e->trace_pos; p < t->len; p++) {
        if (t->first[p] == r->first && t->count[p] == r->count) return true;
        dist += extent_(e, t->first[p], t->count[p]);
        if (dist > z->stage3_max_reuse_distance) return false;
    }
    return false;
}

void zdp_param_release(zdp_param_source *src, int first, int count) {
    if (src == NULL || src->eng == NULL || src->eng->cfg.zero.stage < 3) return;
    zdp_engine *e = src->eng;
    if (first < 0 || count < 1 || first > e->lay.n_tensors - count) return;
    const int k = e->live_of[first];
    /* A release that matches no live fetch (or a persistent range) has
     * nothing to free. */
    if (k < 0 || e->recs[k].first != first || e->recs[k].count != count ||
        e->recs[k].refs == 0)
        return;
    if (--e->recs[k].refs == 0 && !reuse_soon_(e, k)) rec_free_(e, k);
}

/* Before the model's forward or backward (stage 3): the persistent tensors
 * are brought up to date (the fetches may all be served by prefetches), the
 * trace of this kind of pass starts over, and its first gathers are queued
 * at once. */
static zdp_status pass_begin_(zdp_engine *e, int kind, zdp_error *err) {
    e->in_pass = true;
    if (e->recs == NULL) return ZDP_OK;
    e->pass_kind = kind;
    e->trace_recording = !e->trace[kind].done;
    e->trace_pos = 0;
    e->next_pf = 0;
    e->trace_ok = true;
    zdp_status st = persist_refresh_(e, err);
    if (st == ZDP_OK) prefetch_more_(e);
    if (st == ZDP_OK && e->frozen != NULL && e->frozen_borrowed) {
        /* A shared store runs its gathers on the stream of the engine whose
         * pass this is.  Its borrowers never run at once (zdp serve runs one
         * job at a time, every rank in the same order): a store already in a
         * pass means a caller broke that rule. */
        if (e->frozen->in_pass)
            st = zdp_err_set(err, ZDP_ERR_STATE,
                             "%s: the shared frozen store is inside another engine's pass; "
                             "engines borrowing one store must run one at a time",
                             pass_name_(e));
        else {
            e->frozen->parent = e;
            e->frozen->stream = e->stream;
        }
    }
    if (st == ZDP_OK && e->frozen != NULL) st = pass_begin_(e->frozen, kind, err);
    return st;
}

/* After the model's forward or backward: what it left live goes back, and
 * so does whatever was prefetched for it and not asked for.  wait = false
 * only once the stream is gone (destroy). */
static void pass_end_wait_(zdp_engine *e, bool wait) {
    e->in_pass = false;
    if (e->recs == NULL) return;
    pf_cancel_all_(e, wait);
    while (e->n_recs > 0) rec_free_(e, e->n_recs - 1);
    e->trace[e->pass_kind].done = true;
    if (e->frozen != NULL && (!e->frozen_borrowed || e->frozen->parent == e))
        pass_end_wait_(e->frozen, wait);
}

static void pass_end_(zdp_engine *e) { pass_end_wait_(e, true); }

/* Stage 3, after a pass (and, in backward, after its last reductions were
 * queued): the end-of-pass agreement, repeated until every rank has ended
 * its pass.  A rank still gathering or reducing meets an END row, so its
 * operation fails and its model stops; then it comes here too.  Returns
 * the model's own status, or, where the model succeeded here but the pass
 * failed on another rank (or a collective disagreed), an error naming that
 * rank: every rank leaves with the same verdict. */
static zdp_status pass_agree_(zdp_engine *e, zdp_status model_st, zdp_error *err) {
    if (e->recs == NULL) return model_st;
    if (e->frozen != NULL) { /* the frozen weights' gather waits count as this engine's */
        e->timing_window.comm_wait_s += e->frozen->timing_window.comm_wait_s;
        e->frozen->timing_window.comm_wait_s = 0.0;
    }
    e->end_model_failed = model_st != ZDP_OK;
    e->end_fail_rank = -1;
    while (e->world > 1) {
        zdp_error werr = {0};
        zdp_status st = wait_(e, enqueue_(e, OP_PASS_END, NULL, -1), &werr);
        if (st != ZDP_OK) {
            if (model_st != ZDP_OK) return model_st;
            if (err != NULL) *err = werr;
            return st;
        }
        if (e->end_done) break;
    }
    if (model_st == ZDP_OK && e->end_fail_rank < 0) return ZDP_OK;
    /* A failed first pass recorded a trace that may differ between the
     * ranks (one stopped early, or fetched something else): record it again
     * on the next pass, on every rank alike. */
    for (zdp_engine *x = e; x != NULL; x = x->frozen)
        if (x->trace_recording) {
            x->trace[x->pass_kind].len = 0;
            x->trace[x->pass_kind].done = false;
        }
    if (model_st != ZDP_OK) return model_st;
    if (e->end_fail_flag == 2)
        return zdp_err_set(err, ZDP_ERR_STATE,
                           "%s: the model failed on rank %d (its own error says why); at ZeRO "
                           "stage 3 the ranks gather together, so this %s fails on every rank",
                           pass_name_(e), e->end_fail_rank, pass_name_(e));
    return zdp_err_set(err, ZDP_ERR_STATE,
                       "%s: the ranks' stage-3 gathers and reductions went apart (rank %d saw "
                       "it; the ranks' models fetched different layers or in a different order), "
                       "so this %s fails on every rank",
                       pass_name_(e), e->end_fail_rank, pass_name_(e));
}

/* ---- create / destroy --------------------------------------------------- */

/* Every engine allocation goes through zdp_alloc, so the memory report is
 * exactly what this engine holds. */
static zdp_status alloc_(zdp_engine *e, void *out, int64_t count, size_t size,
                         zdp_mem_category cat, const char *what, zdp_error *err) {
    void *p = zdp_alloc(&e->mem, cat, (size_t)count * size);
    *(void **)out = p;
    if (p == NULL)
        return zdp_err_set(err, ZDP_ERR_NOMEM, "%s: cannot allocate %lld bytes on rank %d", what,
                           (long long)(count * (int64_t)size), e->rank);
    return ZDP_OK;
}

static void free_(zdp_engine *e, void *p, int64_t count, size_t size, zdp_mem_category cat) {
    zdp_free(&e->mem, cat, p, (size_t)count * size);
}

static void log_memory_report_(const zdp_engine *e) {
    zdp_memory_report m;
    zdp_engine_memory_report(e, &m);
    zdp_log(0,
            "ZeRO stage %d, %d rank(s), %lld parameters (padded %lld, partition %lld); "
            "memory per rank: params %lld B, grads %lld B, grad partition %lld B, buckets %lld B, "
            "optimizer %lld B, other %lld B, total %lld B; the model's activations %lld B",
            e->cfg.zero.stage, e->world, (long long)e->lay.numel, (long long)e->lay.padded,
            (long long)e->lay.part, (long long)m.params_bytes, (long long)m.grads_bytes,
            (long long)m.grad_partition_bytes, (long long)m.bucket_bytes,
            (long long)m.optimizer_bytes, (long long)m.other_bytes, (long long)m.total_bytes,
            (long long)m.activation_bytes);
}

/* Stage 3's fetch tables and the persistent tensors: those with fewer
 * elements than stage3_param_persistence_threshold stay whole on every rank
 * (DeepSpeed keeps small tensors such as biases and norms out of the
 * per-layer gathers). */
static zdp_status stage3_init_(zdp_engine *e, zdp_error *err) {
    const int nt = e->lay.n_tensors;
    zdp_status st;
    if ((st = alloc_(e, &e->table, nt, sizeof(float *), ZDP_MEM_OTHER, "stage 3", err)) ||
        (st = alloc_(e, &e->live_of, nt, sizeof(int), ZDP_MEM_OTHER, "stage 3", err)) ||
        (st = alloc_(e, &e->recs, nt, sizeof(gather_rec), ZDP_MEM_OTHER, "stage 3", err)) ||
        (st = alloc_(e, &e->persist_off, nt, sizeof(int64_t), ZDP_MEM_OTHER, "stage 3", err)) ||
        (st = alloc_(e, &e->pf, nt, sizeof(gather_rec), ZDP_MEM_OTHER, "stage 3", err)) ||
        (st = alloc_(e, &e->pf_of, nt, sizeof(int), ZDP_MEM_OTHER, "stage 3", err)) ||
        (st = alloc_(e, &e->rows, ROW_N_ * (int64_t)e->world, sizeof(int64_t), ZDP_MEM_OTHER,
                     "stage 3", err)))
        return st;
    /* One verdict per gather in flight: at most every prefetch (one per
     * tensor) and the model's own fetch, or one per persistent run. */
    e->n_verdicts = 2 * nt + 8;
    if ((st = alloc_(e, &e->verdicts, e->n_verdicts, sizeof(gather_verdict), ZDP_MEM_OTHER,
                     "stage 3", err)))
        return st;
    /* The test hook: "RANK:N" makes this engine's N-th gather buffer on
     * RANK fail to allocate (tests/dist/test_zero3_faults.c). */
    e->fail_rank = -1;
    const char *hook = getenv("ZDP_TEST_FAIL_GATHER");
    if (hook != NULL) {
        long long r = -1, n = 0;
        if (sscanf(hook, "%lld:%lld", &r, &n) == 2 && r >= 0 && n > 0) {
            e->fail_rank = (int)r;
            e->fail_nth = n;
        }
    }
    /* A model fetches each tensor a few times per pass (GPT-2's wte twice
     * in forward); a longer pass is traced up to the cap, and prefetch
     * follows the part recorded. */
    for (int k = 0; k < 2; k++) {
        e->trace[k].cap = 4 * nt + 16;
        if ((st = alloc_(e, &e->trace[k].first, e->trace[k].cap, sizeof(int), ZDP_MEM_OTHER,
                         "stage 3", err)) ||
            (st = alloc_(e, &e->trace[k].count, e->trace[k].cap, sizeof(int), ZDP_MEM_OTHER,
                         "stage 3", err)))
            return st;
    }
    const int64_t thr = e->cfg.zero.stage3_param_persistence_threshold;
    for (int i = 0; i < nt; i++) {
        e->live_of[i] = -1;
        e->pf_of[i] = -1;
        e->persist_off[i] = -1;
        if (e->lay.numels[i] < thr) {
            e->persist_off[i] = e->persist_elems;
            e->persist_elems += e->lay.numels[i];
        }
    }
    if (e->persist_elems > 0 &&
        (st = alloc_(e, &e->persist, e->persist_elems, sizeof(float), ZDP_MEM_GATHERED,
                     "persistent parameters", err)))
        return st;
    for (int i = 0; i < nt; i++)
        if (e->persist_off[i] >= 0) e->table[i] = e->persist + e->persist_off[i];
    e->persist_stale = true;
    return ZDP_OK;
}

/* What this rank holds of every tensor, through read: at stage 3 the slice
 * of each tensor inside its partition, read into place; otherwise whole
 * tensors into the flat buffer. */
static zdp_status read_partition_(zdp_engine *e, zdp_tensor_read_fn read, void *ctx,
                                  zdp_error *err) {
    const bool part = e->cfg.zero.stage == 3;
    const int64_t P = e->lay.part, plo = part ? (int64_t)e->rank * P : 0;
    const int64_t phi = part ? plo + P : e->lay.padded;
    for (int i = 0; i < e->lay.n_tensors; i++) {
        const int64_t lo = e->lay.offsets[i], hi = lo + e->lay.numels[i];
        const int64_t a = lo > plo ? lo : plo, b = hi < phi ? hi : phi;
        if (b <= a) continue;
        zdp_status st = read(ctx, i, a - lo, b - lo, e->params + (a - plo), err);
        if (st != ZDP_OK) return st;
    }
    return ZDP_OK;
}

/* Stage 3 with a model's frozen weights (zdp_frozen, a LoRA base): a second
 * engine over them, without gradients or optimizer, that runs its gathers
 * on `stream` (the engine it serves: so they keep their place among that
 * engine's collectives) within that engine's passes; this rank keeps only
 * its partition of them, copied from fz's whole tensors, and the model is
 * pointed at the second engine's source, which gathers them layer by layer
 * (docs/lora.md).  On failure *out may hold a part-built engine (destroy
 * it). */
static zdp_status frozen_new_(const zdp_config *cfg, int rank, int world, const zdp_frozen *fz,
                              zdp_stream *stream, zdp_engine **out, zdp_error *err) {
    zdp_engine *f = calloc(1, sizeof *f);
    *out = f;
    if (f == NULL) return zdp_err_set(err, ZDP_ERR_NOMEM, "engine: out of memory");
    f->cfg = *cfg;
    f->rank = rank;
    f->world = world;
    f->stream = stream;
    f->boundary_override = -1;
    f->frozen_model = (zdp_model){.n_params = fz->n_params, .params = fz->params};
    f->model = &f->frozen_model;
    zdp_status st = zdp_layout_init(&f->lay, fz->params, fz->n_params, world, &f->mem, err);
    if (st != ZDP_OK) return st;
    if (f->lay.padded > INT32_MAX)
        return zdp_err_set(err, ZDP_ERR_UNSUPPORTED,
                           "model: %lld frozen weights (padded): zdp's MPI path supports up to %d "
                           "elements in one flat buffer",
                           (long long)f->lay.padded, INT32_MAX);
    if ((st = alloc_(f, &f->params, f->lay.part, sizeof(float), ZDP_MEM_PARAMS, "frozen weights",
                     err)) ||
        (st = alloc_(f, &f->ag_counts, f->world, sizeof(int), ZDP_MEM_OTHER, "engine", err)) ||
        (st = alloc_(f, &f->ag_displs, f->world, sizeof(int), ZDP_MEM_OTHER, "engine", err)) ||
        (st = stage3_init_(f, err)))
        return st;
    /* ZDP_TEST_FAIL_GATHER is the parameters' hook; the frozen weights
     * have their own, ZDP_TEST_FAIL_FROZEN_GATHER=RANK:N (the N-th gather
     * buffer of the frozen weights on RANK fails to allocate;
     * tests/serve/zero3_lora_check.py). */
    f->fail_rank = -1;
    const char *hook = getenv("ZDP_TEST_FAIL_FROZEN_GATHER");
    long long hr = -1, hn = 0;
    if (hook != NULL && sscanf(hook, "%lld:%lld", &hr, &hn) == 2 && hr >= 0 && hn > 0) {
        f->fail_rank = (int)hr;
        f->fail_nth = hn;
    }
    f->src.eng = f;
    /* This rank's piece of each tensor, read straight into the partition
     * (no rank reads a whole tensor it does not own); the padding stays
     * zero. */
    const int64_t P = f->lay.part;
    memset(f->params, 0, (size_t)P * sizeof(float));
    if (fz->read == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_engine_create: the model's frozen "
                           "weights (zdp_model.frozen) have no read function");
    return read_partition_(f, fz->read, fz->read_ctx, err);
}

static zdp_status frozen_init_(zdp_engine *e, zdp_error *err) {
    const zdp_frozen *fz = e->model->frozen;
    zdp_status st = frozen_new_(&e->cfg, e->rank, e->world, fz, e->stream, &e->frozen, err);
    if (e->frozen != NULL) e->frozen->parent = e;
    if (st != ZDP_OK) return st;
    e->frozen_prev = *fz->src;
    *fz->src = &e->frozen->src;
    return ZDP_OK;
}

/* ---- the shared frozen store ---------------------------------------------- */

/* A frozen engine (frozen_new_) of its own, with a stream of its own for
 * whole gathers; engines created with zdp_engine_create_shared borrow it. */
struct zdp_frozen_store {
    zdp_engine *f;
};

zdp_status zdp_frozen_store_create(const zdp_config *cfg, const zdp_frozen *fz,
                                   zdp_frozen_store **out, zdp_error *err) {
    if (out == NULL || cfg == NULL || fz == NULL || fz->params == NULL || fz->n_params < 1)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "zdp_frozen_store_create: cfg, fz (with params) and out must be set");
    *out = NULL;
    zdp_status st = zdp_config_validate(cfg, err);
    if (st != ZDP_OK) return st;
    if (cfg->zero.stage != 3)
        return zdp_err_set(err, ZDP_ERR_CONFIG,
                           "zdp_frozen_store_create: zero_optimization.stage = %d: a shared "
                           "frozen store partitions weights, which only stage 3 does; below "
                           "stage 3 share the whole tensors (zdp_lora_create's base_params)",
                           cfg->zero.stage);
    const int world = zdp_dist_world_size();
    if (cfg->world_size != world)
        return zdp_err_set(err, ZDP_ERR_CONFIG,
                           "config was derived for world size %d but the job has %d ranks",
                           cfg->world_size, world);
    zdp_frozen_store *s = calloc(1, sizeof *s);
    if (s == NULL) return zdp_err_set(err, ZDP_ERR_NOMEM, "zdp_frozen_store_create: out of memory");
    st = frozen_new_(cfg, zdp_dist_rank(), world, fz, NULL, &s->f, err);
    if (st == ZDP_OK)
        st = zdp_stream_create(&s->f->own_stream, 2 * s->f->lay.n_tensors + 16, &s->f->mem, err);
    if (st != ZDP_OK) {
        zdp_frozen_store_destroy(s);
        return st;
    }
    s->f->stream = s->f->own_stream;
    *out = s;
    return ZDP_OK;
}

void zdp_frozen_store_destroy(zdp_frozen_store *s) {
    if (s == NULL) return;
    if (s->f != NULL && s->f->borrowers > 0) {
        /* Freeing it would leave those engines reading freed memory. */
        zdp_log(1, "zdp_frozen_store_destroy: %d engine(s) still borrow this store; destroy them "
                   "first (the store is left allocated)",
                s->f->borrowers);
        return;
    }
    if (s->f != NULL) {
        s->f->stream = s->f->own_stream; /* zdp_engine_destroy stops it */
        s->f->own_stream = NULL;
        s->f->parent = NULL;
    }
    zdp_engine_destroy(s->f);
    free(s);
}

zdp_status zdp_frozen_store_get(zdp_frozen_store *s, int i, float *out, zdp_error *err) {
    if (s == NULL) return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_frozen_store_get: store is NULL");
    zdp_engine *f = s->f;
    if (f->in_pass)
        return zdp_err_set(err, ZDP_ERR_STATE,
                           "zdp_frozen_store_get: an engine borrowing the store is inside its "
                           "forward or backward; gather whole tensors between passes");
    /* Between passes the borrowers' streams have run all of the store's
     * gathers, so its own stream takes the next ones. */
    f->stream = f->own_stream;
    f->parent = NULL;
    return zdp_engine_get_param(f, i, out, err);
}

void zdp_frozen_store_memory_report(const zdp_frozen_store *s, zdp_memory_report *m) {
    *m = (zdp_memory_report){0};
    if (s == NULL) return;
    const int64_t *b = s->f->mem.bytes;
    m->frozen_bytes = b[ZDP_MEM_PARAMS];
    m->gathered_bytes = b[ZDP_MEM_GATHERED];
    m->other_bytes = b[ZDP_MEM_OTHER];
    for (int c = 0; c < ZDP_MEM_NCATEGORIES; c++) m->total_bytes += b[c];
}

/* zdp_engine_create_shared: e borrows the store's frozen engine after
 * checking that the model's frozen tensors are the store's. */
static zdp_status frozen_borrow_(zdp_engine *e, zdp_frozen_store *s, zdp_error *err) {
    const zdp_frozen *fz = e->model->frozen;
    zdp_engine *f = s->f;
    if (fz->n_params != f->lay.n_tensors)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "zdp_engine_create_shared: the model has %d frozen tensors, the store "
                           "%d; borrow a store made from this model's base",
                           fz->n_params, f->lay.n_tensors);
    for (int i = 0; i < fz->n_params; i++) {
        int64_t n = 1;
        for (int d = 0; d < fz->params[i].ndim; d++) n *= fz->params[i].shape[d];
        if (n != f->lay.numels[i] || strcmp(fz->params[i].name, f->model->params[i].name) != 0)
            return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                               "zdp_engine_create_shared: frozen tensor %d is %s (%lld elements) "
                               "in the model but %s (%lld) in the store; borrow a store made from "
                               "this model's base",
                               i, fz->params[i].name, (long long)n, f->model->params[i].name,
                               (long long)f->lay.numels[i]);
    }
    e->frozen = f;
    e->frozen_borrowed = true;
    f->borrowers++;
    e->frozen_prev = *fz->src;
    *fz->src = &f->src;
    return ZDP_OK;
}

/* Buckets and their buffers (stages 1/2/3). */
static zdp_status plan_buckets_(zdp_engine *e, zdp_error *err) {
    const zdp_model *model = e->model;
    zdp_bucket *plan = NULL;
    int *tb = NULL;
    zdp_status st = zdp_bucket_plan(&e->lay, e->cfg.zero.reduce_bucket_size, &plan,
                                    &e->n_buckets, &tb, err);
    if (st != ZDP_OK) return st;
    const int nb = e->n_buckets, nt = e->lay.n_tensors;
    /* Copy the plan into counted memory. */
    if ((st = alloc_(e, &e->buckets, nb, sizeof *e->buckets, ZDP_MEM_OTHER, "buckets", err)) ||
        (st = alloc_(e, &e->tensor_bucket, nt, sizeof(int), ZDP_MEM_OTHER, "buckets", err))) {
        free(plan);
        free(tb);
        return st;
    }
    memcpy(e->buckets, plan, (size_t)nb * sizeof *plan);
    memcpy(e->tensor_bucket, tb, (size_t)nt * sizeof(int));
    free(plan);
    free(tb);
    for (int b = 0; b < nb; b++) {
        int64_t n = e->buckets[b].hi - e->buckets[b].lo;
        if (n > INT32_MAX)
            return zdp_err_set(err, ZDP_ERR_UNSUPPORTED,
                               "parameter tensor %s has %lld elements: zdp's MPI path reduces at "
                               "most %d elements at once",
                               model->params[e->buckets[b].first].name, (long long)n, INT32_MAX);
        if (n > e->bucket_elems) e->bucket_elems = n;
    }
    /* The reduce-scatter scratch holds at most one rank's piece of a bucket. */
    e->rs_scratch_elems = e->bucket_elems < e->lay.part ? e->bucket_elems : e->lay.part;
    if ((st = alloc_(e, &e->bucket_pending, nb, sizeof(int), ZDP_MEM_OTHER, "buckets", err)) ||
        (st = alloc_(e, &e->bucket_buf, nb, sizeof(float *), ZDP_MEM_OTHER, "buckets", err)) ||
        (st = alloc_(e, &e->rs_scratch, e->rs_scratch_elems, sizeof(float), ZDP_MEM_BUCKETS,
                     "reduce-scatter scratch", err)))
        return st;
    if (e->cfg.zero.stage < 2) return ZDP_OK;
    /* Stage 2's bucket buffers: two up front with overlap_comm (DeepSpeed
     * double-buffers: compute fills one while the other is reduced), one
     * otherwise; more only if a model keeps several buckets open at once. */
    /* Every bucket may be open (one buffer each) while the previous
     * backward's last reductions are still in flight. */
    e->pool_cap = nb + MAX_INFLIGHT_ + 1;
    const int cap = e->pool_cap;
    if ((st = alloc_(e, &e->pool, cap, sizeof(float *), ZDP_MEM_OTHER, "buckets", err)) ||
        (st = alloc_(e, &e->inflight_buf, cap, sizeof(float *), ZDP_MEM_OTHER, "buckets", err)) ||
        (st = alloc_(e, &e->inflight_event, cap, sizeof(uint64_t), ZDP_MEM_OTHER, "buckets", err)))
        return st;
    int initial = e->cfg.zero.overlap_comm && nb > 1 ? 2 : 1;
    for (int k = 0; k < initial; k++) {
        if ((st = alloc_(e, &e->pool[k], e->bucket_elems, sizeof(float), ZDP_MEM_BUCKETS,
                         "reduce bucket", err)))
            return st;
        e->pool_free = e->pool_total = k + 1;
    }
    return ZDP_OK;
}

static zdp_status create_(const zdp_config *cfg, const zdp_model *model,
                        zdp_frozen_store *store, zdp_engine **out, zdp_error *err) {
    if (out == NULL || cfg == NULL || model == NULL || model->ops == NULL ||
        model->ops->forward == NULL || model->ops->backward == NULL || model->params == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "zdp_engine_create: cfg, model (with ops->forward, ops->backward, "
                           "params) and out must not be NULL");
    *out = NULL;
    zdp_status st = zdp_config_validate(cfg, err);
    if (st != ZDP_OK) return st;
    int world = zdp_dist_world_size();
    if (cfg->world_size != world)
        return zdp_err_set(err, ZDP_ERR_CONFIG,
                           "config was derived for world size %d but the job has %d ranks; load "
                           "it with zdp_config_load_file(path, zdp_dist_world_size(), ...)",
                           cfg->world_size, world);
    /* A LoRA model's base must be partitioned too at stage 3: it says
     * what its base is (zdp_frozen). */
    if (cfg->zero.stage == 3 && zdp_lora_config_of(model) != NULL && model->frozen == NULL)
        return zdp_err_set(err, ZDP_ERR_CONFIG,
                           "zero_optimization.stage = 3: this LoRA model does not expose its "
                           "base weights (zdp_model.frozen), so they cannot be partitioned; "
                           "create it with zdp_lora_create, or use stage 0, 1 or 2");

    zdp_engine *e = calloc(1, sizeof *e);
    if (e == NULL) return zdp_err_set(err, ZDP_ERR_NOMEM, "engine: out of memory");
    e->cfg = *cfg;
    e->model = model;
    e->rank = zdp_dist_rank();
    e->world = world;
    e->boundary_override = -1;
    e->last_grad_norm = -1.0;
    e->sched_iter = -1;
    e->last_lr = -1.0;
    /* The reduce-scatter backend, chosen once: zdp's ring unless
     * ZDP_REDUCE_SCATTER=mpi (kept for benchmarks; docs/benchmarks.md has
     * the comparison). */
    e->rs = zdp_comm_rs_backend_from_env();
    const int stage = cfg->zero.stage;
    const int nt = model->n_params;

    if ((st = zdp_layout_init(&e->lay, model->params, nt, world, &e->mem, err)) != ZDP_OK) goto fail;
    if (e->lay.padded > INT32_MAX) {
        st = zdp_err_set(err, ZDP_ERR_UNSUPPORTED,
                         "model: %lld parameters (padded): zdp's MPI path supports up to %d "
                         "elements in one flat buffer",
                         (long long)e->lay.padded, INT32_MAX);
        goto fail;
    }
    /* Stage 3 keeps only this rank's partition of the parameters. */
    const int64_t held = stage == 3 ? e->lay.part : e->lay.padded;
    if ((st = alloc_(e, &e->params, held, sizeof(float), ZDP_MEM_PARAMS, "parameters", err)) ||
        (st = alloc_(e, &e->param_ptrs, nt, sizeof(float *), ZDP_MEM_OTHER, "engine", err)) ||
        (st = alloc_(e, &e->sink.state, nt, 1, ZDP_MEM_OTHER, "engine", err)) ||
        (st = alloc_(e, &e->rs_counts, world, sizeof(int), ZDP_MEM_OTHER, "engine", err)) ||
        (st = alloc_(e, &e->ag_counts, world, sizeof(int), ZDP_MEM_OTHER, "engine", err)) ||
        (st = alloc_(e, &e->ag_displs, world, sizeof(int), ZDP_MEM_OTHER, "engine", err)) ||
        (st = alloc_(e, &e->agree_gather, 2 * (int64_t)world, sizeof(int64_t), ZDP_MEM_OTHER,
                     "engine", err)))
        goto fail;
    for (int i = 0; i < nt && stage < 3; i++) e->param_ptrs[i] = e->params + e->lay.offsets[i];
    e->sink.eng = e;
    e->src.eng = e;
    if (stage == 3 && (st = stage3_init_(e, err)) != ZDP_OK) goto fail;

    if (stage < 2 && (st = alloc_(e, &e->grads, e->lay.padded, sizeof(float), ZDP_MEM_GRADS,
                                  "gradients", err)))
        goto fail;
    if (stage >= 1) {
        if ((st = alloc_(e, &e->grad_part, e->lay.part, sizeof(float), ZDP_MEM_GRAD_PARTITION,
                         "gradient partition", err)) ||
            (st = plan_buckets_(e, err)))
            goto fail;
    }
    int64_t opt_n = stage == 0 ? e->lay.padded : e->lay.part;
    if ((st = zdp_optim_init(&e->optim, &cfg->optimizer, opt_n, &e->mem, err))) goto fail;
    zdp_engine_hparams_from_config_(e);
    /* Deep enough for every bucket of one backward plus the step's work. */
    int depth = e->n_buckets + e->pool_cap + 8;
    if ((st = zdp_stream_create(&e->stream, depth, &e->mem, err)) != ZDP_OK) goto fail;
    if (stage == 3 && model->frozen != NULL &&
        (st = store != NULL ? frozen_borrow_(e, store, err) : frozen_init_(e, err)) != ZDP_OK)
        goto fail;

    if (e->rank == 0) log_memory_report_(e);
    *out = e;
    return ZDP_OK;
fail:
    zdp_engine_destroy(e);
    return st;
}

zdp_status zdp_engine_create(const zdp_config *cfg, const zdp_model *model, zdp_engine **out,
                             zdp_error *err) {
    return create_(cfg, model, NULL, out, err);
}

zdp_status zdp_engine_create_shared(const zdp_config *cfg, const zdp_model *model,
                                    zdp_frozen_store *store, zdp_engine **out, zdp_error *err) {
    if (out != NULL) *out = NULL;
    if (store == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_engine_create_shared: store is NULL");
    if (cfg != NULL && (cfg->zero.stage != 3 || model == NULL || model->frozen == NULL))
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "zdp_engine_create_shared: a shared frozen store is for a model with "
                           "frozen weights (zdp_model.frozen) at zero_optimization.stage = 3 "
                           "(stage here: %d); use zdp_engine_create",
                           cfg->zero.stage);
    return create_(cfg, model, store, out, err);
}

void zdp_engine_destroy(zdp_engine *e) {
    if (e == NULL) return;
    /* Let queued operations finish before their buffers go. */
    zdp_stream_destroy(e->stream);
    e->stream = NULL;
    if (e->frozen != NULL) {
        /* Back to the model's own source (NULL for a partitioned base),
         * once frozen_init_ (or frozen_borrow_) got as far as pointing it
         * here. */
        if (*e->model->frozen->src == &e->frozen->src) *e->model->frozen->src = e->frozen_prev;
        if (e->frozen_borrowed) { /* the store's: give it back untouched */
            zdp_engine *f = e->frozen;
            if (f->parent == e) {
                f->parent = NULL;
                f->stream = f->own_stream;
            }
            f->borrowers--;
        } else {
            e->frozen->stream = NULL; /* this engine's, gone */
            zdp_engine_destroy(e->frozen);
        }
        e->frozen = NULL;
    }
    const size_t fb = sizeof(float);
    const int nt = e->lay.n_tensors, nb = e->n_buckets, W = e->world;
    /* Stage 2's buffers are in the pool, held by a bucket, or in flight. */
    for (int k = 0; k < e->inflight_count; k++)
        free_(e, e->inflight_buf[(e->inflight_head + k) % e->pool_cap], e->bucket_elems, fb,
              ZDP_MEM_BUCKETS);
    for (int k = 0; k < e->pool_free; k++) free_(e, e->pool[k], e->bucket_elems, fb, ZDP_MEM_BUCKETS);
    for (int b = 0; e->bucket_buf != NULL && b < nb; b++)
        free_(e, e->bucket_buf[b], e->bucket_elems, fb, ZDP_MEM_BUCKETS);
    zdp_optim_free(&e->optim, &e->mem);
    pass_end_wait_(e, false); /* the stream has run everything */
    free_(e, e->persist, e->persist_elems, fb, ZDP_MEM_GATHERED);
    free_(e, e->table, nt, sizeof(float *), ZDP_MEM_OTHER);
    free_(e, e->live_of, nt, sizeof(int), ZDP_MEM_OTHER);
    free_(e, e->recs, nt, sizeof(gather_rec), ZDP_MEM_OTHER);
    free_(e, e->persist_off, nt, sizeof(int64_t), ZDP_MEM_OTHER);
    free_(e, e->pf, nt, sizeof(gather_rec), ZDP_MEM_OTHER);
    free_(e, e->pf_of, nt, sizeof(int), ZDP_MEM_OTHER);
    free_(e, e->rows, ROW_N_ * (int64_t)W, sizeof(int64_t), ZDP_MEM_OTHER);
    free_(e, e->verdicts, e->n_verdicts, sizeof(gather_verdict), ZDP_MEM_OTHER);
    for (int k = 0; k < 2; k++) {
        free_(e, e->trace[k].first, e->trace[k].cap, sizeof(int), ZDP_MEM_OTHER);
        free_(e, e->trace[k].count, e->trace[k].cap, sizeof(int), ZDP_MEM_OTHER);
    }
    free_(e, e->params, e->cfg.zero.stage == 3 ? e->lay.part : e->lay.padded, fb,
          ZDP_MEM_PARAMS);
    free_(e, e->grads, e->lay.padded, fb, ZDP_MEM_GRADS);
    free_(e, e->grad_part, e->lay.part, fb, ZDP_MEM_GRAD_PARTITION);
    free_(e, e->rs_scratch, e->rs_scratch_elems, fb, ZDP_MEM_BUCKETS);
    free_(e, e->pool, e->pool_cap, sizeof(float *), ZDP_MEM_OTHER);
    free_(e, e->inflight_buf, e->pool_cap, sizeof(float *), ZDP_MEM_OTHER);
    free_(e, e->inflight_event, e->pool_cap, sizeof(uint64_t), ZDP_MEM_OTHER);
    free_(e, e->buckets, nb, sizeof *e->buckets, ZDP_MEM_OTHER);
    free_(e, e->tensor_bucket, nt, sizeof(int), ZDP_MEM_OTHER);
    free_(e, e->bucket_pending, nb, sizeof(int), ZDP_MEM_OTHER);
    free_(e, e->bucket_buf, nb, sizeof(float *), ZDP_MEM_OTHER);
    free_(e, e->rs_counts, W, sizeof(int), ZDP_MEM_OTHER);
    free_(e, e->ag_counts, W, sizeof(int), ZDP_MEM_OTHER);
    free_(e, e->ag_displs, W, sizeof(int), ZDP_MEM_OTHER);
    free_(e, e->agree_gather, 2 * (int64_t)W, sizeof(int64_t), ZDP_MEM_OTHER);
    free_(e, e->param_ptrs, nt, sizeof(float *), ZDP_MEM_OTHER);
    free_(e, e->sink.state, nt, 1, ZDP_MEM_OTHER);
    zdp_layout_free(&e->lay);
    /* Every counted byte must have come back: the report would lie otherwise. */
    for (int c = 0; c < ZDP_MEM_NCATEGORIES; c++)
        if (e->mem.bytes[c] != 0)
            zdp_log(1, "internal: memory accounting is off by %lld bytes in category %d at "
                       "destroy (a bug in zdp)",
                    (long long)e->mem.bytes[c], c);
    free(e);
}

float *zdp_engine_param_data(zdp_engine *e, int i) {
    if (e == NULL || i < 0 || i >= e->lay.n_tensors) return NULL;
    return e->param_ptrs[i];
}

static zdp_status param_index_(const zdp_engine *e, int i, const void *p, const char *fn,
                               zdp_error *err) {
    if (e == NULL || p == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "%s: engine and data must not be NULL", fn);
    if (i < 0 || i >= e->lay.n_tensors)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "%s: tensor %d: the model has %d (0..%d)",
                           fn, i, e->lay.n_tensors, e->lay.n_tensors - 1);
    return ZDP_OK;
}

/* Stage 3: this rank's slice of the flat range [lo, hi): elements [a, b). */
static void owned_range_(const zdp_engine *e, int64_t lo, int64_t hi, int64_t *a, int64_t *b) {
    const int64_t plo = (int64_t)e->rank * e->lay.part, phi = plo + e->lay.part;
    *a = lo > plo ? lo : plo;
    *b = hi < phi ? hi : phi;
    if (*b < *a) *b = *a;
}

zdp_status zdp_engine_set_param(zdp_engine *e, int i, const float *data, zdp_error *err) {
    zdp_status st = param_index_(e, i, data, "zdp_engine_set_param", err);
    if (st != ZDP_OK) return st;
    const int64_t lo = e->lay.offsets[i], n = e->lay.numels[i];
    if (e->cfg.zero.stage < 3) {
        memcpy(e->param_ptrs[i], data, (size_t)n * sizeof(float));
        return ZDP_OK;
    }
    int64_t a, b;
    owned_range_(e, lo, lo + n, &a, &b);
    if (b > a)
        memcpy(e->params + (a - (int64_t)e->rank * e->lay.part), data + (a - lo),
               (size_t)(b - a) * sizeof(float));
    e->persist_stale = true;
    return ZDP_OK;
}

zdp_status zdp_engine_load_params(zdp_engine *e, zdp_tensor_read_fn read, void *ctx,
                                  zdp_error *err) {
    if (e == NULL || read == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_engine_load_params: engine and read "
                           "must not be NULL");
    zdp_status st = read_partition_(e, read, ctx, err);
    e->persist_stale = true;
    return st;
}

zdp_status zdp_engine_get_param(zdp_engine *e, int i, float *out, zdp_error *err) {
    zdp_status st = param_index_(e, i, out, "zdp_engine_get_param", err);
    if (st != ZDP_OK) return st;
    const int64_t lo = e->lay.offsets[i], n = e->lay.numels[i];
    if (e->cfg.zero.stage < 3) {
        memcpy(out, e->param_ptrs[i], (size_t)n * sizeof(float));
        return ZDP_OK;
    }
    int slot;
    st = wait_(e, gather_queue_(e, out, lo, lo + n, &slot), err);
    if (st != ZDP_OK) return st;
    char what[300];
    snprintf(what, sizeof what, "zdp_engine_get_param(%d) (%s)", i, e->model->params[i].name);
    return verdict_error_(e, slot, what, lo, lo + n, err);
}

/* Stage 3: the padding at the end of the last partition stays zero. */
static void zero_padding_(zdp_engine *e) {
    if (e->cfg.zero.stage < 3) {
        memset(e->params + e->lay.numel, 0,
               (size_t)(e->lay.padded - e->lay.numel) * sizeof(float));
        return;
    }
    int64_t a, b;
    owned_range_(e, e->lay.numel, e->lay.padded, &a, &b);
    if (b > a)
        memset(e->params + (a - (int64_t)e->rank * e->lay.part), 0,
               (size_t)(b - a) * sizeof(float));
}

zdp_status zdp_engine_sync_params(zdp_engine *e, zdp_error *err) {
    if (e == NULL) return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "engine is NULL");
    if (e->cfg.zero.stage == 3) {
        /* No rank holds what rank 0 would broadcast: each keeps the slice
         * zdp_engine_set_param wrote (the same values on every rank). */
        zero_padding_(e);
        e->persist_stale = true;
        return ZDP_OK;
    }
    /* Padding must stay zero: it is part of the partitions the optimizer sees. */
    memset(e->params + e->lay.numel, 0, (size_t)(e->lay.padded - e->lay.numel) * sizeof(float));
    if (e->world == 1) return ZDP_OK;
    return run_sync_(e, OP_BCAST_PARAMS, NULL, err);
}

/* ---- forward / backward -------------------------------------------------- */

/* Where a rank met the disagreement. */
enum { IN_BACKWARD = 0, IN_STEP = 1, IN_FORWARD = 2 };
static zdp_status disagree_fail_(zdp_engine *e, int where, int64_t count, zdp_error *err);

zdp_status zdp_engine_forward(zdp_engine *e, const void *batch, float *loss, zdp_error *err) {
    if (e == NULL || loss == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_engine_forward: engine and loss must not be NULL");
    e->have_forward = false;
    double t0 = now_();
    /* Stage 3 gathers inside forward: its agreement goes first, so a rank
     * already in step() (it made fewer backward() calls) meets an all-reduce
     * of the same shape rather than a gather, and both see the disagreement
     * (as stage 2's backward, docs/training.md). */
    if (e->cfg.zero.stage == 3 && e->world > 1) {
        const double c = (double)(e->window_backwards + 1);
        double agree[AGREE_N_] = {0.0, c, c * c, 0.0};
        zdp_status ast = run_sync_(e, OP_ALLREDUCE_NORM, agree, err);
        if (ast != ZDP_OK) return ast;
        if (agree_verdict_(agree, e->world) != 0)
            return disagree_fail_(e, IN_FORWARD, e->window_backwards + 1, err);
    }
    zdp_status st = pass_begin_(e, PASS_FORWARD, err);
    if (st == ZDP_OK) st = e->model->ops->forward(e->model->self, &e->src, batch, loss, err);
    pass_end_(e);
    st = pass_agree_(e, st, err);
    e->timing_window.forward_s += now_() - t0;
    if (st != ZDP_OK) return st;
    e->have_forward = true;
    return ZDP_OK;
}

zdp_status zdp_engine_backward(zdp_engine *e, bool scale_wrt_gas, float loss_scale,
                               zdp_error *err) {
    if (e == NULL) return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_engine_backward: engine is NULL");
    if (!e->have_forward)
        return zdp_err_set(err, ZDP_ERR_STATE,
                           "backward() without a forward() since the last backward: call "
                           "zdp_engine_forward on the micro-batch first");
    if (!isfinite(loss_scale))
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "backward(): loss_scale = %g: must be finite (for example 1/n for n "
                           "micro-batches)",
                           (double)loss_scale);
    e->have_forward = false;
    /* DeepSpeed's forward hook divides the incoming gradient by G. */
    float dloss = scale_wrt_gas
                      ? loss_scale / (float)e->cfg.gradient_accumulation_steps
                      : loss_scale;
    double t0 = now_();
    sink_begin_(e);
    /* Stage 2 reduces inside backward: its agreement goes first on the
     * stream, so a rank already in step() meets an all-reduce of the same
     * shape rather than a reduce-scatter (docs/training.md). */
    const bool agree = e->cfg.zero.stage >= 2 && e->world > 1;
    if (agree) {
        const double c = (double)(e->window_backwards + 1);
        e->bwd_agree[0] = 0.0;
        e->bwd_agree[1] = c;
        e->bwd_agree[2] = c * c;
        e->bwd_agree[3] = 0.0;
        e->bwd_agree_event = enqueue_(e, OP_AGREE_BACKWARD, e->bwd_agree, -1);
    }
    zdp_status st = pass_begin_(e, PASS_BACKWARD, err);
    if (st == ZDP_OK) st = e->model->ops->backward(e->model->self, &e->src, dloss, &e->sink, err);
    pass_end_(e);
    /* Finish the reductions even after a model failure, so that this rank
     * issues the same collectives as the others before reporting. */
    sink_end_(e);
    /* Stage 3: every rank leaves this backward with the same verdict; a
     * failed one (here or on another rank) leaves the window's gradient
     * partition half reduced, so it is dropped below on every rank. */
    const zdp_status model_st = st;
    st = pass_agree_(e, st, err);
    const bool pass_failed = e->recs != NULL && st != ZDP_OK;
    e->timing_window.backward_s += now_() - t0;
    if (agree) {
        /* Every rank takes the disagreement path alike, whatever else went
         * wrong here, so the gather on it is matched. */
        zdp_error aerr = {0};
        zdp_status ast = wait_(e, e->bwd_agree_event, &aerr);
        if (ast == ZDP_OK && agree_verdict_(e->bwd_agree, e->world) != 0)
            return disagree_fail_(e, IN_BACKWARD, e->window_backwards + 1, err);
        if (ast != ZDP_OK && st == ZDP_OK) {
            if (err != NULL) *err = aerr;
            return ast;
        }
    }
    if (pass_failed && e->sink.comm_status == ZDP_OK) {
        /* With overlap_comm the last reductions may still be adding in. */
        zdp_error rerr = {0};
        (void)reclaim_all_(e, &rerr);
        memset(e->grad_part, 0, (size_t)e->lay.part * sizeof(float));
        e->window_backwards = 0;
        if (model_st == ZDP_OK && err != NULL) {
            const size_t len = strlen(err->msg);
            snprintf(err->msg + len, sizeof err->msg - len,
                     "; the window's gradients were dropped on every rank (parameters, optimizer "
                     "state and counters unchanged)");
        }
    }
    if (st != ZDP_OK) return st;
    if (e->sink.comm_status != ZDP_OK) {
        if (err != NULL) *err = e->sink.comm_err;
        return e->sink.comm_status;
    }
    if (e->sink.misuse_tensor >= 0) {
        int i = e->sink.misuse_tensor;
        const char *name = i >= 0 && i < e->lay.n_tensors ? e->model->params[i].name : "?";
        return zdp_err_set(err, ZDP_ERR_STATE,
                           "model backward: parameter %d (%s) was %s; each tensor is acquired, "
                           "added into, and released once per backward",
                           i, name, e->sink.misuse);
    }
    e->window_backwards++;
    return ZDP_OK;
}

/* ---- step ------------------------------------------------------------------ */

/* The ranks disagree on backward() counts (or some are in step() while
 * others are in backward()): every rank gets here alike.  Gather who did
 * what (a collective on this path only), drop the window's gradients --
 * they mix different numbers of micro-batches, and stages 0/1 have already
 * reduced them -- and report.  Parameters, optimizer state and the step
 * counters are untouched, and every rank is left with an empty window. */
static zdp_status no_backward_error_(const zdp_engine *e, zdp_error *err) {
    return zdp_err_set(err, ZDP_ERR_STATE,
                       "step() at an accumulation boundary with no backward() since the last "
                       "optimizer step (global_steps = %lld): nothing to apply; call backward() "
                       "at least once before step() (DeepSpeed would update with zero gradients "
                       "or crash here)",
                       (long long)e->global_steps);
}

static zdp_status disagree_fail_(zdp_engine *e, int where, int64_t count, zdp_error *err) {
    static const char *const names[] = {"backward()", "step()", "forward()"};
    zdp_error gerr = {0};
    (void)reclaim_all_(e, &gerr); /* skipped reductions of this backward */
    memset(e->agree_gather, 0, 2 * (size_t)e->world * sizeof(int64_t));
    e->agree_gather[2 * e->rank] = count;
    e->agree_gather[2 * e->rank + 1] = where;
    zdp_status gst = zdp_engine_allreduce_i64_(e, e->agree_gather, 2 * e->world, &gerr);
    if (e->grads != NULL) memset(e->grads, 0, (size_t)e->lay.padded * sizeof(float));
    if (e->grad_part != NULL) memset(e->grad_part, 0, (size_t)e->lay.part * sizeof(float));
    e->window_backwards = 0;
    char who[640];
    size_t n = 0;
    who[0] = '\0';
    for (int r = 0; r < e->world && n + 48 < sizeof who; r++) {
        if (gst != ZDP_OK && r != e->rank) continue; /* only ours is known */
        const int64_t *g = e->agree_gather + 2 * r;
        const int w = g[1] >= 0 && g[1] <= 2 ? (int)g[1] : 0;
        n += (size_t)snprintf(who + n, sizeof who - n, "%srank %d: %lld (in %s)", n ? ", " : "",
                              r, (long long)g[0], names[w]);
    }
    if (n + 48 >= sizeof who) snprintf(who + n, sizeof who - n, ", ...");
    return zdp_err_set(err, ZDP_ERR_STATE,
                       "%s: the ranks made different numbers of backward() calls since the last "
                       "optimizer step (%s); every rank must call backward() the same number of "
                       "times before step() (managed mode: set_gradient_accumulation_boundary "
                       "alike on every rank).  The window's gradients were dropped on every "
                       "rank; parameters, optimizer state and counters are unchanged",
                       names[where], who);
}

bool zdp_engine_is_gradient_accumulation_boundary(const zdp_engine *e) {
    if (!e->cfg.managed_gradient_accumulation) return e->running_step;
    if (e->boundary_override >= 0) return e->boundary_override != 0;
    return (e->micro_steps + 1) % e->cfg.gradient_accumulation_steps == 0;
}

/* Stage 0: all-reduce the summed gradients, then x(1/W) (DeepSpeed's
 * postscale path with gradient_predivide_factor 1). */
static zdp_status reduce_stage0_(zdp_engine *e, zdp_error *err) {
    if (e->world == 1) return ZDP_OK;
    /* The sum and the mean (allreduce_grads_). */
    return run_sync_(e, OP_ALLREDUCE_GRADS, NULL, err);
}

/* Stage 1: the bucketed ZeRO-1 reduce of the window's gradients, every
 * bucket queued at once (the stream runs them in order), then one wait. */
static zdp_status reduce_stage1_(zdp_engine *e, zdp_error *err) {
    uint64_t last = 0;
    for (int b = 0; b < e->n_buckets; b++)
        last = enqueue_(e, OP_REDUCE_BUCKET, e->grads + e->buckets[b].lo, b);
    return wait_(e, last, err);
}

/* End of a model step's window: the per-step reports. */
static void close_window_(zdp_engine *e) {
    for (int c = 0; c < ZDP_COLL_COUNT; c++) {
        e->comm_last_step.calls[c] = e->comm_total.calls[c] - e->comm_at_last_step.calls[c];
        e->comm_last_step.payload_bytes[c] =
            e->comm_total.payload_bytes[c] - e->comm_at_last_step.payload_bytes[c];
        e->comm_last_step.sent_bytes[c] =
            e->comm_total.sent_bytes[c] - e->comm_at_last_step.sent_bytes[c];
        e->comm_last_step.received_bytes[c] =
            e->comm_total.received_bytes[c] - e->comm_at_last_step.received_bytes[c];
    }
    e->comm_at_last_step = e->comm_total;
    e->timing_last = e->timing_window;
    memset(&e->timing_window, 0, sizeof e->timing_window);
}

/* Sum of squares of x[0..n) in double, over the thread pool: SUMSQ_PARTS_
 * fixed parts (bounds from n alone), each summed in a fixed order, then the
 * parts in order, so the norm does not depend on the thread count. */
#define SUMSQ_PARTS_ 64
#define SUMSQ_LANES_ 16

typedef struct sumsq_job {
    const float *x;
    int64_t n;
    double part[SUMSQ_PARTS_];
} sumsq_job;

static void sumsq_part_(void *ctx, int64_t k, int thread) {
    (void)thread;
    sumsq_job *j = ctx;
    const int64_t lo = j->n * k / SUMSQ_PARTS_, hi = j->n * (k + 1) / SUMSQ_PARTS_;
    /* SUMSQ_LANES_ running sums, then the tail, then the lanes in order: a
     * fixed order that vectorises (one running sum is a chain of dependent
     * adds, 4 cycles each, and was 2% of a SmolLM2-135M step). */
    double acc[SUMSQ_LANES_] = {0};
    int64_t i = lo;
    for (; i + SUMSQ_LANES_ <= hi; i += SUMSQ_LANES_)
        for (int q = 0; q < SUMSQ_LANES_; q++) acc[q] += (double)j->x[i + q] * (double)j->x[i + q];
    double s = 0.0;
    for (; i < hi; i++) s += (double)j->x[i] * (double)j->x[i];
    for (int q = 0; q < SUMSQ_LANES_; q++) s += acc[q];
    j->part[k] = s;
}

static double sumsq_(const float *x, int64_t n) {
    sumsq_job j = {.x = x, .n = n};
    zdp_pool_run(SUMSQ_PARTS_, sumsq_part_, &j);
    double s = 0.0;
    for (int k = 0; k < SUMSQ_PARTS_; k++) s += j.part[k];
    return s;
}

/* Zeroes x[0..n) over the thread pool in ZERO_PARTS_ pieces: the step's
 * gradients (538 MB for SmolLM2-135M at stage 0) would otherwise be zeroed by
 * one thread while the pool's others wait. */
#define ZERO_PARTS_ 64

typedef struct zero_job {
    float *x;
    int64_t n, parts;
} zero_job;

static void zero_part_(void *ctx, int64_t k, int thread) {
    (void)thread;
    const zero_job *j = ctx;
    const int64_t lo = j->n * k / j->parts, hi = j->n * (k + 1) / j->parts;
    memset(j->x + lo, 0, (size_t)(hi - lo) * sizeof(float));
}

static void zero_floats_(float *x, int64_t n) {
    zero_job j = {.x = x, .n = n, .parts = n >= (1 << 20) ? ZERO_PARTS_ : 1};
    zdp_pool_run(j.parts, zero_part_, &j);
}

/* DeepSpeed's model step (docs/deepspeed.md §2.4) for fp32: reduce or finalize,
 * take the global norm, skip on NaN/Inf, clip, update, all-gather, zero the
 * gradients, advance the counters. */
static zdp_status model_step_(zdp_engine *e, zdp_error *err) {
    const int stage = e->cfg.zero.stage;
    const double t_step = now_();
    /* Stage 2 with overlap_comm: the window's last reductions may still be
     * in flight; grad_part is complete once they are done. */
    zdp_status st = reclaim_all_(e, err);
    if (st != ZDP_OK) return st;
    if (stage == 0) st = reduce_stage0_(e, err);
    else if (stage == 1) st = reduce_stage1_(e, err);
    if (st != ZDP_OK) return st;

    /* The gradient this rank's optimizer consumes, and the slice it owns. */
    int64_t P = e->lay.part, plo = (int64_t)e->rank * P;
    const float *owned = stage == 0 ? e->grads + plo : e->grad_part;
    double sumsq = sumsq_(owned, P);
    /* The norm's all-reduce also checks that every rank made the same number
     * of backward() calls (and, at stage 2, that none is still in one). */
    const double nb = (double)e->window_backwards;
    double agree[AGREE_N_] = {1.0, nb, nb * nb, sumsq};
    if ((st = run_sync_(e, OP_ALLREDUCE_NORM, agree, err)) != ZDP_OK) return st;
    if (agree_verdict_(agree, e->world) != 0)
        return disagree_fail_(e, IN_STEP, e->window_backwards, err);
    /* Every rank's window is empty: the reductions moved zeros. */
    if (e->window_backwards == 0) return no_backward_error_(e, err);
    sumsq = agree[3];
    /* A NaN or Inf anywhere makes the sum non-finite on every rank alike. */
    double norm = sqrt(sumsq);
    e->last_grad_norm = norm;
    bool overflow = !isfinite(norm), refused = false;
    /* DeepSpeed steps the scheduler after each applied update, so this
     * update uses lr(n) and the next one lr(n + 1). */
    const double lr = zdp_engine_lr(e);
    float scale = 1.0f;
    if (e->clip > 0.0) {
        double c = (norm + 1e-6) / e->clip;
        if (c > 1.0) scale = (float)(1.0 / c);
    }
    /* What this rank updates: everything (stage 0), its slice of the whole
     * buffer (stages 1/2), or the partition it holds (stage 3). */
    float *p = stage == 0 || stage == 3 ? e->params : e->params + plo;
    const float *g = stage == 0 ? e->grads : e->grad_part;
    if (!overflow) {
        /* An update that would leave a parameter or optimizer state
         * non-finite (a huge lr, a gradient that overflows when squared) is
         * refused like a NaN gradient: skipped, nothing changed.  Stage 0
         * computes the same update on every rank; stages 1/2 update
         * partitions, so the ranks agree on the verdict (a one-double
         * all-reduce). */
        const double t_check = now_();
        double bad = zdp_optim_update_finite(&e->optim, p, g, scale, lr) ? 0.0 : 1.0;
        e->timing_window.optimizer_s += now_() - t_check; /* the wait below is comm wait */
        if (stage >= 1 && e->world > 1 &&
            (st = run_sync_(e, OP_ALLREDUCE_FLAG, &bad, err)) != ZDP_OK)
            return st;
        refused = bad != 0.0;
    }
    if (!overflow && !refused) {
        const double t_opt = now_();
        zdp_optim_step(&e->optim, p, g, scale, lr);
        /* The padding at the end of the last partition must stay zero. */
        if (stage >= 1) zero_padding_(e);
        e->persist_stale = stage == 3;
        e->timing_window.optimizer_s += now_() - t_opt;
        e->last_lr = lr;
        e->sched_iter++;
        /* Stage 3 gathers what the model fetches instead. */
        if ((stage == 1 || stage == 2) && e->world > 1 &&
            (st = run_sync_(e, OP_ALLGATHER_PARAMS, NULL, err)) != ZDP_OK)
            return st;
    }
    if (e->grads != NULL) zero_floats_(e->grads, e->lay.padded);
    if (e->grad_part != NULL) zero_floats_(e->grad_part, P);

    e->step_applied = !overflow && !refused;
    if (!e->step_applied) e->skipped_steps++;
    e->global_steps++;
    if (e->cfg.managed_gradient_accumulation)
        e->global_samples += e->cfg.train_batch_size;
    else
        e->global_samples += e->cfg.micro_batch_size * e->world * e->window_backwards;
    e->window_backwards = 0;
    e->timing_window.step_s += now_() - t_step;
    close_window_(e);
    if (e->rank == 0) {
        /* A skipped step is never silent (DeepSpeed #8415). */
        if (overflow)
            zdp_log(1,
                    "step %lld skipped: the gradient has NaN or Inf on at least one rank (global "
                    "norm %g); parameters and optimizer state are unchanged, skipped_steps = %lld",
                    (long long)e->global_steps, norm, (long long)e->skipped_steps);
        else if (refused)
            zdp_log(1,
                    "step %lld skipped: the update with lr = %g would make a parameter or the "
                    "optimizer state NaN or Inf (global grad norm %g); parameters and optimizer "
                    "state are unchanged, skipped_steps = %lld; fix: lower the learning rate or "
                    "set gradient_clipping",
                    (long long)e->global_steps, lr, norm, (long long)e->skipped_steps);
        if (e->cfg.steps_per_print > 0 && e->global_steps % e->cfg.steps_per_print == 0)
            zdp_log(0, "step=%lld, skipped=%lld, lr=[%g], grad_norm=%g, global_samples=%lld",
                    (long long)e->global_steps, (long long)e->skipped_steps, e->last_lr, norm,
                    (long long)e->global_samples);
    }
    return ZDP_OK;
}

zdp_status zdp_engine_step(zdp_engine *e, zdp_error *err) {
    if (e == NULL) return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_engine_step: engine is NULL");
    e->step_applied = false;
    e->running_step = true;
    zdp_status st = ZDP_OK;
    if (zdp_engine_is_gradient_accumulation_boundary(e)) {
        /* With other ranks, an empty window still goes through the step's
         * collectives up to the agreement: if another rank did call
         * backward(), that is a disagreement both sides must see, not a
         * rank that returns while the others wait. */
        if (e->window_backwards == 0 && e->world == 1) st = no_backward_error_(e, err);
        else st = model_step_(e, err);
    }
    e->running_step = false;
    if (st == ZDP_OK) e->micro_steps++;
    return st;
}

zdp_status zdp_engine_set_gradient_accumulation_boundary(zdp_engine *e, bool is_boundary,
                                                         zdp_error *err) {
    if (e == NULL) return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "engine is NULL");
    if (!e->cfg.managed_gradient_accumulation)
        return zdp_err_set(err, ZDP_ERR_STATE,
                           "set_gradient_accumulation_boundary() is not supported with "
                           "managed_gradient_accumulation=False; the caller owns the boundary "
                           "by calling step()");
    e->boundary_override = is_boundary ? 1 : 0;
    return ZDP_OK;
}

zdp_status zdp_engine_coalesce_grad_reduction(zdp_engine *e, zdp_error *err) {
    if (e == NULL) return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "engine is NULL");
    if (!e->cfg.managed_gradient_accumulation)
        return zdp_err_set(err, ZDP_ERR_STATE,
                           "coalesce_grad_reduction is not supported with "
                           "managed_gradient_accumulation=False; the caller already owns the "
                           "accumulation boundary via step()");
    return zdp_err_set(err, ZDP_ERR_UNSUPPORTED,
                       "coalesce_grad_reduction is not implemented in zdp; use "
                       "managed_gradient_accumulation=false to control the boundary");
}

/* ---- per-step hyperparameters ------------------------------------------------- */

void zdp_engine_hparams_from_config_(zdp_engine *e) {
    const zdp_optimizer_config *c = &e->cfg.optimizer;
    e->optim.cfg.beta1 = c->beta1;
    e->optim.cfg.beta2 = c->beta2;
    e->optim.cfg.eps = c->eps;
    e->optim.cfg.weight_decay = c->weight_decay;
    e->clip = e->cfg.gradient_clipping;
    e->lr_set = false;
    e->lr_override = 0.0;
}

void zdp_engine_get_hparams(const zdp_engine *e, zdp_hparams *out) {
    if (e == NULL || out == NULL) return;
    const zdp_optimizer_config *c = &e->optim.cfg;
    *out = (zdp_hparams){.lr = zdp_engine_lr(e), .beta1 = c->beta1, .beta2 = c->beta2,
                         .eps = c->eps, .weight_decay = c->weight_decay,
                         .gradient_clipping = e->clip};
}

/* One field against its range: finite, lo <= v (lo < v when lo_open) and
 * v <= hi (v < hi when hi_open).  NaN fails every comparison, so it is
 * rejected with the rest. */
static zdp_status check_hparam_(const char *name, double v, double lo, bool lo_open, double hi,
                                bool hi_open, const char *fix, zdp_error *err) {
    if (isfinite(v) && (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi))
        return ZDP_OK;
    char range[64];
    if (hi == HUGE_VAL)
        snprintf(range, sizeof range, "finite and %s %g", lo_open ? ">" : ">=", lo);
    else
        snprintf(range, sizeof range, "in %s%g, %g%s", lo_open ? "(" : "[", lo, hi,
                 hi_open ? ")" : "]");
    return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "%s = %.12g: must be %s; fix: %s", name, v,
                       range, fix);
}

zdp_status zdp_hparams_check_capped(const zdp_hparams *h, double lr_max, double clip_max,
                                    zdp_error *err) {
    if (h == NULL) return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "hparams: NULL pointer");
    if (!(lr_max <= ZDP_HPARAM_LR_MAX)) lr_max = ZDP_HPARAM_LR_MAX; /* a cap only tightens (NaN: none) */
    if (!(clip_max <= HUGE_VAL)) clip_max = HUGE_VAL;
    zdp_status st;
    if ((st = check_hparam_("lr", h->lr, 0.0, false, lr_max, false, "use e.g. 1e-3", err)) ||
        (st = check_hparam_("beta1", h->beta1, 0.0, false, 1.0, true, "use e.g. 0.9", err)) ||
        (st = check_hparam_("beta2", h->beta2, 0.0, false, 1.0, true, "use e.g. 0.999", err)) ||
        (st = check_hparam_("eps", h->eps, 0.0, true, ZDP_HPARAM_EPS_MAX, false, "use e.g. 1e-8",
                            err)) ||
        (st = check_hparam_("weight_decay", h->weight_decay, 0.0, false,
                            ZDP_HPARAM_WEIGHT_DECAY_MAX, false, "use 0 or e.g. 0.01", err)) ||
        (st = check_hparam_("gradient_clipping", h->gradient_clipping, 0.0, false, clip_max,
                            false, "use e.g. 1.0, or 0 to turn clipping off", err)))
        return st;
    return ZDP_OK;
}

zdp_status zdp_hparams_check(const zdp_hparams *h, zdp_error *err) {
    return zdp_hparams_check_capped(h, ZDP_HPARAM_LR_MAX, HUGE_VAL, err);
}

zdp_status zdp_engine_set_hparams(zdp_engine *e, const zdp_hparams *h, zdp_error *err) {
    if (e == NULL || h == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "zdp_engine_set_hparams: engine and hparams must not be NULL");
    /* Every field first: an update must never run with half a new set. */
    zdp_status st = zdp_hparams_check(h, err);
    if (st != ZDP_OK) {
        if (err == NULL) return st;
        char why[ZDP_ERROR_MSG_MAX];
        memcpy(why, err->msg, sizeof why);
        why[sizeof why - 1] = '\0';
        return zdp_err_set(err, st, "zdp_engine_set_hparams: %s; nothing was changed", why);
    }
    zdp_optimizer_config *c = &e->optim.cfg;
    c->beta1 = h->beta1;
    c->beta2 = h->beta2;
    c->eps = h->eps;
    c->weight_decay = h->weight_decay;
    e->clip = h->gradient_clipping;
    e->lr_override = h->lr;
    e->lr_set = true;
    return ZDP_OK;
}

void zdp_engine_reset_optimizer_state(zdp_engine *e) {
    if (e == NULL) return;
    /* The whole range the optimizer owns, padding included, as zdp_optim_init
     * leaves it; step_count 0 restarts Adam's bias correction and makes the
     * next SGD update the "first" one that copies the gradient into the
     * momentum buffer. */
    zdp_optim *o = &e->optim;
    if (o->m != NULL) memset(o->m, 0, (size_t)o->n * sizeof(float));
    if (o->v != NULL) memset(o->v, 0, (size_t)o->n * sizeof(float));
    o->step_count = 0;
}

/* ---- accessors -------------------------------------------------------------- */

bool zdp_engine_was_step_applied(const zdp_engine *e) { return e->step_applied; }
double zdp_engine_lr(const zdp_engine *e) {
    /* A set lr replaces the schedule, so last_lr and the step log report
     * the lr the update really used. */
    if (e->lr_set) return e->lr_override;
    return zdp_scheduler_lr(&e->cfg.scheduler, e->cfg.optimizer.lr, e->sched_iter);
}
double zdp_engine_last_lr(const zdp_engine *e) { return e->last_lr; }
int64_t zdp_engine_global_steps(const zdp_engine *e) { return e->global_steps; }
int64_t zdp_engine_global_samples(const zdp_engine *e) { return e->global_samples; }
int64_t zdp_engine_micro_steps(const zdp_engine *e) { return e->micro_steps; }
int64_t zdp_engine_skipped_steps(const zdp_engine *e) { return e->skipped_steps; }
int64_t zdp_engine_pending_backwards(const zdp_engine *e) { return e->window_backwards; }

zdp_status zdp_engine_drop_window(zdp_engine *e, zdp_error *err) {
    zdp_status st = reclaim_all_(e, err); /* nothing may add in after the zeroing */
    if (e->grads != NULL) memset(e->grads, 0, (size_t)e->lay.padded * sizeof(float));
    if (e->grad_part != NULL) memset(e->grad_part, 0, (size_t)e->lay.part * sizeof(float));
    e->window_backwards = 0;
    return st;
}
double zdp_engine_last_grad_norm(const zdp_engine *e) { return e->last_grad_norm; }
const zdp_config *zdp_engine_config(const zdp_engine *e) { return &e->cfg; }
int64_t zdp_engine_numel(const zdp_engine *e) { return e->lay.numel; }
int64_t zdp_engine_padded_numel(const zdp_engine *e) { return e->lay.padded; }
int64_t zdp_engine_partition_numel(const zdp_engine *e) { return e->lay.part; }

int64_t zdp_engine_prefetch_hits(const zdp_engine *e) { return e->prefetch_hits; }
int64_t zdp_engine_reuse_hits(const zdp_engine *e) { return e->reuse_hits; }

int64_t zdp_engine_param_offset(const zdp_engine *e, int i) {
    if (i < 0 || i >= e->lay.n_tensors) return -1;
    return e->lay.offsets[i];
}

void zdp_engine_memory_report(const zdp_engine *e, zdp_memory_report *m) {
    const int64_t *b = e->mem.bytes;
    *m = (zdp_memory_report){
        .params_bytes = b[ZDP_MEM_PARAMS],
        .grads_bytes = b[ZDP_MEM_GRADS],
        .grad_partition_bytes = b[ZDP_MEM_GRAD_PARTITION],
        .bucket_bytes = b[ZDP_MEM_BUCKETS],
        .optimizer_bytes = b[ZDP_MEM_OPTIMIZER],
        .master_bytes = b[ZDP_MEM_MASTER],
        .other_bytes = b[ZDP_MEM_OTHER],
        .gathered_bytes = b[ZDP_MEM_GATHERED],
        .gathered_peak_bytes = e->gathered_peak,
        .activation_bytes = e->model->activation_bytes,
    };
    int64_t total = 0;
    for (int c = 0; c < ZDP_MEM_NCATEGORIES; c++) total += b[c];
    if (e->frozen != NULL && e->frozen_borrowed) {
        /* A shared store's bytes are its own report's
         * (zdp_frozen_store_memory_report); only what this engine's pass
         * gathered of it counts here. */
        m->gathered_bytes += e->frozen->parent == e ? e->frozen->mem.bytes[ZDP_MEM_GATHERED] : 0;
    } else if (e->frozen != NULL) {
        const int64_t *fb = e->frozen->mem.bytes;
        m->frozen_bytes = fb[ZDP_MEM_PARAMS];
        m->gathered_bytes += fb[ZDP_MEM_GATHERED];
        m->other_bytes += fb[ZDP_MEM_OTHER];
        for (int c = 0; c < ZDP_MEM_NCATEGORIES; c++) total += fb[c];
    }
    m->total_bytes = total;
}

zdp_status zdp_engine_memory_report_all(zdp_engine *e, zdp_memory_report *out, zdp_error *err) {
    if (e == NULL || out == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "zdp_engine_memory_report_all: engine and out must not be NULL");
    /* Each rank fills its own row, zeros elsewhere: the sum is the gather. */
    enum { K = (int)(sizeof(zdp_memory_report) / sizeof(int64_t)) };
    memset(out, 0, (size_t)e->world * sizeof *out);
    zdp_engine_memory_report(e, &out[e->rank]);
    return zdp_engine_allreduce_i64_(e, (int64_t *)out, K * e->world, err);
}

void zdp_engine_comm_report(const zdp_engine *e, bool last_step, zdp_comm_report *out) {
    *out = last_step ? e->comm_last_step : e->comm_total;
}

void zdp_engine_step_timing(const zdp_engine *e, zdp_step_timing *out) { *out = e->timing_last; }
