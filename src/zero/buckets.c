/*
 * buckets.c -- stages 1-3: the gradient's reduce buckets, their buffers and
 * their reductions on the comm stream, and stages 1/2's parameter
 * all-gather (zero.h, "reduce buckets").
 *
 * A bucket's reduction divides it by W in place (DeepSpeed's order),
 * reduce-scatters it and puts this rank's piece into grad_part: stages 2/3
 * add (the window accumulates over backwards; reduce-scatter is linear, so
 * the sum of per-backward means equals one reduction of the summed
 * gradient), stage 1 stores (one reduction per window, at step()).
 *
 * Stages 2/3 with overlap_comm queue a finished bucket and let backward go
 * on with another buffer; reductions still running when backward returns go
 * on behind the next forward/backward, and the engine drains them before it
 * reads grad_part.  Without overlap_comm backward waits for each bucket.
 * The operations and their order are the same either way, so are the bits.
 * Also here: zdp_zero_wait, the waits of every ZeRO path.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "zero.h"

static double now_(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

zdp_status zdp_zero_wait(const zdp_zero_link *k, uint64_t event, zdp_error *err) {
    double t0 = now_();
    zdp_status st = zdp_stream_wait(k->stream, event, err);
    *k->wait_s += now_() - t0;
    return st;
}

/* At most this many bucket reductions run behind compute before backward
 * waits for the oldest: one in flight while the next bucket fills is
 * DeepSpeed's double buffering. */
#define MAX_INFLIGHT_ 1

/* ---- operations on the comm stream ---------------------------------------- */

typedef struct bucket_op {
    zdp_grad_buckets *g;
    float *buf;
    int bucket;
} bucket_op;

/* Stream thread: one bucket's reduction (the file comment).  buf is the
 * bucket buffer (stages 2/3) or the bucket's range of the full gradient
 * (stage 1); either may be overwritten. */
static zdp_status reduce_bucket_(void *arg, zdp_error *err) {
    const bucket_op *op = arg;
    zdp_grad_buckets *g = op->g;
    const zdp_zero_link *k = g->link;
    float *buf = op->buf;
    const int b = op->bucket;
    const zdp_bucket *bk = &g->plan[b];
    const int64_t n = bk->hi - bk->lo, plo = (int64_t)k->rank * k->lay->part;
    const int64_t mine = zdp_layout_owned(k->lay, k->rank, bk->lo, bk->hi);
    const int64_t dst = (bk->lo > plo ? bk->lo : plo) - plo; /* into grad_part */
    const int64_t src = (bk->lo > plo ? bk->lo : plo) - bk->lo; /* into the bucket */
    const bool accumulate = k->cfg->stage >= 2;
    /* This backward's agreement failed (on every rank alike): no rank
     * reduces, so the ranks stay matched collective for collective. */
    if (g->skip) return ZDP_OK;
    if (g->s3 != NULL && k->world > 1) {
        bool go;
        zdp_status ast = zdp_stage3_agree_reduce(g->s3, b, &go, err);
        if (ast != ZDP_OK || !go) return ast;
    }
    if (k->world > 1) {
        const float w = (float)k->world;
        for (int64_t i = 0; i < n; i++) buf[i] /= w;
    }
    const float *piece;
    zdp_status st = ZDP_OK;
    if (k->world == 1) {
        piece = buf + src;
    } else if (!k->cfg->reduce_scatter) {
        /* reduce_scatter=false: all-reduce the whole bucket, keep our piece. */
        st = zdp_comm_allreduce_sum_f32(buf, n, k->stats, err);
        piece = buf + src;
    } else {
        for (int r = 0; r < k->world; r++)
            k->rs_counts[r] = (int)zdp_layout_owned(k->lay, r, bk->lo, bk->hi);
        st = g->rs->reduce_scatter(buf, g->rs_scratch, k->rs_counts, &piece, k->stats, err);
    }
    if (st != ZDP_OK) return st;
    float *out = g->grad_part + dst;
    if (accumulate)
        for (int64_t i = 0; i < mine; i++) out[i] += piece[i];
    else
        memcpy(out, piece, (size_t)mine * sizeof(float));
    return ZDP_OK;
}

static uint64_t queue_reduce_(zdp_grad_buckets *g, float *buf, int b) {
    bucket_op op = {.g = g, .buf = buf, .bucket = b};
    return zdp_stream_enqueue(g->link->stream, reduce_bucket_, &op, sizeof op);
}

/* Stream thread: every rank gets the updated partitions of the others, in
 * shards of about allgather_bucket_size elements (DeepSpeed's sharding rule). */
static zdp_status allgather_params_(void *arg, zdp_error *err) {
    const zdp_zero_link *k = ((const bucket_op *)arg)->g->link;
    int64_t P = k->lay->part, total = P * k->world;
    int64_t shards = total / k->cfg->allgather_bucket_size;
    if (shards < 1) shards = 1;
    if (shards > P / 2) shards = P / 2 > 0 ? P / 2 : 1;
    int64_t shard = P / shards / 2 * 2; /* a multiple of 2, the last takes the rest */
    for (int64_t s = 0; s < shards; s++) {
        int64_t off = s * shard, len = s == shards - 1 ? P - off : shard;
        for (int r = 0; r < k->world; r++) {
            k->ag_counts[r] = (int)len;
            k->ag_displs[r] = (int)(r * P + off);
        }
        zdp_status st = zdp_comm_allgatherv_inplace_f32(k->params, k->ag_counts, k->ag_displs,
                                                        k->stats, err);
        if (st != ZDP_OK) return st;
    }
    return ZDP_OK;
}

zdp_status zdp_buckets_allgather_params(zdp_grad_buckets *g, zdp_error *err) {
    bucket_op op = {.g = g, .bucket = -1};
    return zdp_zero_wait(g->link, zdp_stream_enqueue(g->link->stream, allgather_params_, &op,
                                                     sizeof op),
                         err);
}

zdp_status zdp_buckets_reduce_window(zdp_grad_buckets *g, float *grads, zdp_error *err) {
    uint64_t last = 0;
    for (int b = 0; b < g->n; b++) last = queue_reduce_(g, grads + g->plan[b].lo, b);
    return zdp_zero_wait(g->link, last, err);
}

/* ---- bucket buffers (stages 2/3) -------------------------------------------- */

/* Waits for the oldest bucket in flight and takes its buffer back. */
static zdp_status reclaim_oldest_(zdp_grad_buckets *g, zdp_error *err) {
    int k = g->inflight_head;
    zdp_status st = zdp_zero_wait(g->link, g->inflight_event[k], err);
    g->pool[g->pool_free++] = g->inflight_buf[k];
    g->inflight_head = (k + 1) % g->pool_cap;
    g->inflight_count--;
    return st;
}

zdp_status zdp_buckets_drain(zdp_grad_buckets *g, zdp_error *err) {
    zdp_status first = ZDP_OK;
    while (g->inflight_count > 0) {
        zdp_status st = reclaim_oldest_(g, err);
        if (first == ZDP_OK) first = st;
    }
    return first;
}

static void note_(zdp_status st, zdp_status *comm_st) {
    if (st != ZDP_OK && *comm_st == ZDP_OK) *comm_st = st;
}

static float *take_buffer_(zdp_grad_buckets *g, int b, zdp_status *comm_st, zdp_error *comm_err) {
    /* Reductions that already finished give their buffers back for free. */
    while (g->inflight_count > 0 &&
           zdp_stream_done(g->link->stream, g->inflight_event[g->inflight_head]))
        note_(reclaim_oldest_(g, comm_err), comm_st);
    while (g->pool_free == 0 && g->inflight_count > 0 &&
           (g->inflight_count > MAX_INFLIGHT_ || g->pool_total == g->pool_cap))
        note_(reclaim_oldest_(g, comm_err), comm_st);
    if (g->pool_free == 0) {
        /* Every buffer is filling or in flight: the model keeps several
         * buckets open at once (SimpleModel reuses layer i/2 until step i/2
         * of backward); grow the pool rather than stall compute behind the
         * network (counted in the memory report). */
        if (g->pool_total == g->pool_cap) return NULL;
        float *buf = zdp_alloc(g->link->mem, ZDP_MEM_BUCKETS,
                               (size_t)g->bucket_elems * sizeof(float));
        if (buf == NULL) return NULL;
        g->pool[g->pool_free++] = buf;
        g->pool_total++;
    }
    float *buf = g->pool[--g->pool_free];
    const zdp_bucket *bk = &g->plan[b];
    memset(buf, 0, (size_t)(bk->hi - bk->lo) * sizeof(float));
    g->buf[b] = buf;
    return buf;
}

/* A bucket is complete: queue its reduction.  Without overlap_comm wait for
 * it at once; with it, backward goes on and the buffer comes back when a
 * new bucket needs one or when the engine drains. */
static void bucket_done_(zdp_grad_buckets *g, int b, zdp_status *comm_st, zdp_error *comm_err) {
    float *buf = g->buf[b];
    g->buf[b] = NULL;
    int k = (g->inflight_head + g->inflight_count) % g->pool_cap;
    g->inflight_buf[k] = buf;
    g->inflight_event[k] = queue_reduce_(g, buf, b);
    g->inflight_count++;
    if (!g->link->cfg->overlap_comm) note_(zdp_buckets_drain(g, comm_err), comm_st);
}

void zdp_buckets_begin(zdp_grad_buckets *g) {
    for (int b = 0; b < g->n; b++) g->pending[b] = g->plan[b].last - g->plan[b].first + 1;
}

float *zdp_buckets_grad(zdp_grad_buckets *g, int i, zdp_status *comm_st, zdp_error *comm_err) {
    const int b = g->tensor_bucket[i];
    float *buf = g->buf[b];
    if (buf == NULL && (buf = take_buffer_(g, b, comm_st, comm_err)) == NULL) return NULL;
    return buf + (g->link->lay->offsets[i] - g->plan[b].lo);
}

bool zdp_buckets_release(zdp_grad_buckets *g, int i, zdp_status *comm_st, zdp_error *comm_err) {
    const int b = g->tensor_bucket[i];
    /* A tensor that got no gradient still takes part (as zeros), so every
     * rank issues the same collectives whatever its model did. */
    if (g->buf[b] == NULL && take_buffer_(g, b, comm_st, comm_err) == NULL) return false;
    if (--g->pending[b] == 0) bucket_done_(g, b, comm_st, comm_err);
    return true;
}

/* ---- init / free ------------------------------------------------------------- */

static zdp_status alloc_(const zdp_zero_link *k, void *out, int64_t count, size_t size,
                         zdp_mem_category cat, const char *what, zdp_error *err) {
    void *p = zdp_alloc(k->mem, cat, (size_t)count * size);
    *(void **)out = p;
    if (p == NULL)
        return zdp_err_set(err, ZDP_ERR_NOMEM, "%s: cannot allocate %lld bytes on rank %d", what,
                           (long long)(count * (int64_t)size), k->rank);
    return ZDP_OK;
}

zdp_status zdp_buckets_init(zdp_grad_buckets *g, const zdp_zero_link *k, float *grad_part,
                            zdp_stage3 *s3, zdp_error *err) {
    g->link = k;
    g->grad_part = grad_part;
    g->s3 = s3;
    /* The reduce-scatter backend, chosen once: zdp's ring unless
     * ZDP_REDUCE_SCATTER=mpi (kept for benchmarks; docs/benchmarks.md has
     * the comparison). */
    g->rs = zdp_comm_rs_backend_from_env();
    zdp_bucket *plan = NULL;
    int *tb = NULL;
    zdp_status st = zdp_bucket_plan(k->lay, k->cfg->reduce_bucket_size, &plan, &g->n, &tb, err);
    if (st != ZDP_OK) return st;
    const int nb = g->n, nt = k->lay->n_tensors;
    /* Copy the plan into counted memory. */
    if ((st = alloc_(k, &g->plan, nb, sizeof *g->plan, ZDP_MEM_OTHER, "buckets", err)) ||
        (st = alloc_(k, &g->tensor_bucket, nt, sizeof(int), ZDP_MEM_OTHER, "buckets", err))) {
        free(plan);
        free(tb);
        return st;
    }
    memcpy(g->plan, plan, (size_t)nb * sizeof *plan);
    memcpy(g->tensor_bucket, tb, (size_t)nt * sizeof(int));
    free(plan);
    free(tb);
    for (int b = 0; b < nb; b++) {
        int64_t n = g->plan[b].hi - g->plan[b].lo;
        if (n > INT32_MAX)
            return zdp_err_set(err, ZDP_ERR_UNSUPPORTED,
                               "parameter tensor %s has %lld elements: zdp's MPI path reduces at "
                               "most %d elements at once",
                               k->info[g->plan[b].first].name, (long long)n, INT32_MAX);
        if (n > g->bucket_elems) g->bucket_elems = n;
    }
    /* The reduce-scatter scratch holds at most one rank's piece of a bucket. */
    g->rs_scratch_elems = g->bucket_elems < k->lay->part ? g->bucket_elems : k->lay->part;
    if ((st = alloc_(k, &g->pending, nb, sizeof(int), ZDP_MEM_OTHER, "buckets", err)) ||
        (st = alloc_(k, &g->buf, nb, sizeof(float *), ZDP_MEM_OTHER, "buckets", err)) ||
        (st = alloc_(k, &g->rs_scratch, g->rs_scratch_elems, sizeof(float), ZDP_MEM_BUCKETS,
                     "reduce-scatter scratch", err)))
        return st;
    if (k->cfg->stage < 2) return ZDP_OK;
    /* The bucket buffers: two up front with overlap_comm (DeepSpeed
     * double-buffers: compute fills one while the other is reduced), one
     * otherwise; more only if a model keeps several buckets open at once.
     * Every bucket may be open (one buffer each) while the previous
     * backward's last reductions are still in flight. */
    g->pool_cap = nb + MAX_INFLIGHT_ + 1;
    const int cap = g->pool_cap;
    if ((st = alloc_(k, &g->pool, cap, sizeof(float *), ZDP_MEM_OTHER, "buckets", err)) ||
        (st = alloc_(k, &g->inflight_buf, cap, sizeof(float *), ZDP_MEM_OTHER, "buckets", err)) ||
        (st = alloc_(k, &g->inflight_event, cap, sizeof(uint64_t), ZDP_MEM_OTHER, "buckets", err)))
        return st;
    int initial = k->cfg->overlap_comm && nb > 1 ? 2 : 1;
    for (int i = 0; i < initial; i++) {
        if ((st = alloc_(k, &g->pool[i], g->bucket_elems, sizeof(float), ZDP_MEM_BUCKETS,
                         "reduce bucket", err)))
            return st;
        g->pool_free = g->pool_total = i + 1;
    }
    return ZDP_OK;
}

void zdp_buckets_free(zdp_grad_buckets *g) {
    const zdp_zero_link *k = g->link;
    if (k == NULL) return;
    zdp_mem_counter *mem = k->mem;
    const size_t fb = sizeof(float), bb = (size_t)g->bucket_elems * fb;
    const int nb = g->n, nt = k->lay->n_tensors;
    /* The buffers are in the pool, held by a bucket, or in flight. */
    for (int i = 0; i < g->inflight_count; i++)
        zdp_free(mem, ZDP_MEM_BUCKETS, g->inflight_buf[(g->inflight_head + i) % g->pool_cap], bb);
    for (int i = 0; i < g->pool_free; i++) zdp_free(mem, ZDP_MEM_BUCKETS, g->pool[i], bb);
    for (int b = 0; g->buf != NULL && b < nb; b++) zdp_free(mem, ZDP_MEM_BUCKETS, g->buf[b], bb);
    zdp_free(mem, ZDP_MEM_BUCKETS, g->rs_scratch, (size_t)g->rs_scratch_elems * fb);
    zdp_free(mem, ZDP_MEM_OTHER, g->pool, (size_t)g->pool_cap * sizeof(float *));
    zdp_free(mem, ZDP_MEM_OTHER, g->inflight_buf, (size_t)g->pool_cap * sizeof(float *));
    zdp_free(mem, ZDP_MEM_OTHER, g->inflight_event, (size_t)g->pool_cap * sizeof(uint64_t));
    zdp_free(mem, ZDP_MEM_OTHER, g->plan, (size_t)nb * sizeof *g->plan);
    zdp_free(mem, ZDP_MEM_OTHER, g->tensor_bucket, (size_t)nt * sizeof(int));
    zdp_free(mem, ZDP_MEM_OTHER, g->pending, (size_t)nb * sizeof(int));
    zdp_free(mem, ZDP_MEM_OTHER, g->buf, (size_t)nb * sizeof(float *));
    memset(g, 0, sizeof *g);
}
