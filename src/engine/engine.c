/*
 * engine.c -- the forward / backward / step state machine, its counters, and
 * the ZeRO stage 0/1/2 gradient paths.
 *
 * What lives where (one owner per buffer, all counted in eng->mem):
 *   params     (padded)  the flat parameter buffer; the model reads views of it
 *   grads      (padded)  stages 0/1: the window's local gradient sum
 *   grad_part  (P)       stages 1/2: this rank's averaged gradient partition
 *   bucket_bufs          stage 2: reduce buckets the model writes into
 *   optim                optimizer state: the whole buffer (stage 0) or the
 *                        partition (stages 1/2)
 *
 * When gradients are reduced (DeepSpeed's schedule, SEMANTICS.md 3.5/4.5):
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
 * Not here: MPI (src/comm), update formulas (src/optim), layout (src/zero).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../comm/comm.h"
#include "../core/core.h"
#include "../optim/optim.h"
#include "../zero/zero.h"
#include "engine.h"

/* Per-tensor state inside one backward. */
enum { SINK_IDLE = 0, SINK_ACQUIRED, SINK_RELEASED };

struct zdp_grad_sink {
    zdp_engine *eng;      /* NULL for a dense sink */
    float *const *dense;  /* dense sink: caller-owned buffers per tensor */
    int n_dense;
    unsigned char *state; /* (n_tensors) SINK_* */
    int misuse_tensor;    /* first tensor misused this backward, -1 if none */
    const char *misuse;   /* what went wrong with it */
    zdp_status comm_status; /* first reduction failure in this backward */
    zdp_error comm_err;
};

struct zdp_engine {
    zdp_config cfg;
    const zdp_model *model;
    int rank, world;
    zdp_mem_counter mem;
    zdp_layout lay;

    float *params;       /* (padded) */
    float **param_ptrs;  /* (n_tensors) views into params */
    float *grads;        /* (padded) stages 0/1, else NULL */
    float *grad_part;    /* (P) stages 1/2, else NULL */

    /* Reduce buckets (stages 1/2). */
    zdp_bucket *buckets;
    int n_buckets;
    int *tensor_bucket;  /* (n_tensors) */
    int *bucket_pending; /* (n_buckets) tensors not yet released this backward */
    float **bucket_buf;  /* (n_buckets) buffer a bucket holds, or NULL */
    float **pool;        /* stage 2: free bucket buffers */
    int pool_free, pool_total, pool_cap;
    int64_t bucket_elems; /* elements per bucket buffer */
    float *rs_recv;      /* stage 2: reduce-scatter landing area */
    int *rs_counts;      /* (W) */
    int *ag_counts, *ag_displs; /* (W) all-gather shards */

    zdp_grad_sink sink;
    zdp_optim optim;

    /* DeepSpeed's engine state (SEMANTICS.md 2.1). */
    int64_t micro_steps, global_steps, global_samples, skipped_steps;
    int64_t window_backwards; /* backward() calls since the last model step */
    bool step_applied, running_step, have_forward;
    int boundary_override;    /* -1 unset, else 0/1 (sticky, managed only) */
    double last_grad_norm;
};

/* ---- grad sink ---------------------------------------------------------- */

static float *bucket_take_buffer_(zdp_engine *e, int b) {
    if (e->pool_free == 0) {
        /* Every buffer is held by an unfinished bucket: the model holds more
         * buckets open at once than planned; grow the pool (counted). */
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

/* Stage 2: average the finished bucket, reduce-scatter it, add this rank's
 * piece into grad_part, and give the buffer back. */
static zdp_status bucket_reduce_(zdp_engine *e, int b, zdp_error *err) {
    zdp_bucket *bk = &e->buckets[b];
    float *buf = e->bucket_buf[b];
    int64_t n = bk->hi - bk->lo;
    const float w = (float)e->world;
    /* DeepSpeed divides the whole bucket by W in place before communicating. */
    if (e->world > 1)
        for (int64_t i = 0; i < n; i++) buf[i] /= w;
    int64_t plo = (int64_t)e->rank * e->lay.part;
    int64_t mine = zdp_layout_owned(&e->lay, e->rank, bk->lo, bk->hi);
    int64_t dst = (bk->lo > plo ? bk->lo : plo) - plo;
    zdp_status st;
    if (e->cfg.zero.reduce_scatter) {
        for (int r = 0; r < e->world; r++)
            e->rs_counts[r] = (int)zdp_layout_owned(&e->lay, r, bk->lo, bk->hi);
        st = zdp_comm_reduce_scatter_f32(buf, e->rs_recv, e->rs_counts, err);
        if (st == ZDP_OK)
            for (int64_t i = 0; i < mine; i++) e->grad_part[dst + i] += e->rs_recv[i];
    } else {
        /* reduce_scatter=false: all-reduce the whole bucket, keep our piece. */
        st = zdp_comm_allreduce_sum_f32(buf, n, err);
        int64_t src = (bk->lo > plo ? bk->lo : plo) - bk->lo;
        if (st == ZDP_OK)
            for (int64_t i = 0; i < mine; i++) e->grad_part[dst + i] += buf[src + i];
    }
    e->pool[e->pool_free++] = buf;
    e->bucket_buf[b] = NULL;
    return st;
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
        if (--e->bucket_pending[b] == 0 && s->comm_status == ZDP_OK)
            s->comm_status = bucket_reduce_(e, b, &s->comm_err);
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
}

/* ---- create / destroy --------------------------------------------------- */

static zdp_status alloc_floats_(zdp_engine *e, float **out, int64_t n, zdp_mem_category cat,
                                const char *what, zdp_error *err) {
    *out = zdp_alloc(&e->mem, cat, (size_t)n * sizeof(float));
    if (*out == NULL)
        return zdp_err_set(err, ZDP_ERR_NOMEM, "%s: cannot allocate %lld bytes on rank %d", what,
                           (long long)(n * (int64_t)sizeof(float)), e->rank);
    return ZDP_OK;
}

static zdp_status plan_allgather_(zdp_engine *e, zdp_error *err) {
    e->ag_counts = calloc((size_t)e->world, sizeof(int));
    e->ag_displs = calloc((size_t)e->world, sizeof(int));
    e->rs_counts = calloc((size_t)e->world, sizeof(int));
    if (e->ag_counts == NULL || e->ag_displs == NULL || e->rs_counts == NULL)
        return zdp_err_set(err, ZDP_ERR_NOMEM, "engine: out of memory");
    if (e->lay.padded > INT32_MAX)
        return zdp_err_set(err, ZDP_ERR_UNSUPPORTED,
                           "model: %lld parameters (padded): zdp's MPI path supports up to %d "
                           "elements in one flat buffer",
                           (long long)e->lay.padded, INT32_MAX);
    return ZDP_OK;
}

static void log_memory_report_(const zdp_engine *e) {
    zdp_memory_report m;
    zdp_engine_memory_report(e, &m);
    zdp_log(0,
            "ZeRO stage %d, %d rank(s), %lld parameters (padded %lld, partition %lld); "
            "memory per rank: params %lld B, grads %lld B, grad partition %lld B, buckets %lld B, "
            "optimizer %lld B, total %lld B",
            e->cfg.zero.stage, e->world, (long long)e->lay.numel, (long long)e->lay.padded,
            (long long)e->lay.part, (long long)m.params_bytes, (long long)m.grads_bytes,
            (long long)m.grad_partition_bytes, (long long)m.bucket_bytes,
            (long long)m.optimizer_bytes, (long long)m.total_bytes);
}

zdp_status zdp_engine_create(const zdp_config *cfg, const zdp_model *model, zdp_engine **out,
                             zdp_error *err) {
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

    zdp_engine *e = calloc(1, sizeof *e);
    if (e == NULL) return zdp_err_set(err, ZDP_ERR_NOMEM, "engine: out of memory");
    e->cfg = *cfg;
    e->model = model;
    e->rank = zdp_dist_rank();
    e->world = world;
    e->boundary_override = -1;
    e->last_grad_norm = -1.0;
    const int stage = cfg->zero.stage;

    if ((st = zdp_layout_init(&e->lay, model->params, model->n_params, world, err)) != ZDP_OK)
        goto fail;
    if ((st = plan_allgather_(e, err)) != ZDP_OK) goto fail;
    if ((st = alloc_floats_(e, &e->params, e->lay.padded, ZDP_MEM_PARAMS, "parameters", err)))
        goto fail;
    e->param_ptrs = calloc((size_t)e->lay.n_tensors, sizeof *e->param_ptrs);
    e->sink.state = calloc((size_t)e->lay.n_tensors, 1);
    if (e->param_ptrs == NULL || e->sink.state == NULL) {
        st = zdp_err_set(err, ZDP_ERR_NOMEM, "engine: out of memory");
        goto fail;
    }
    for (int i = 0; i < e->lay.n_tensors; i++) e->param_ptrs[i] = e->params + e->lay.offsets[i];
    e->sink.eng = e;

    if (stage < 2 &&
        (st = alloc_floats_(e, &e->grads, e->lay.padded, ZDP_MEM_GRADS, "gradients", err)))
        goto fail;
    if (stage >= 1) {
        if ((st = alloc_floats_(e, &e->grad_part, e->lay.part, ZDP_MEM_GRAD_PARTITION,
                                "gradient partition", err)))
            goto fail;
        if ((st = zdp_bucket_plan(&e->lay, cfg->zero.reduce_bucket_size, &e->buckets,
                                  &e->n_buckets, &e->tensor_bucket, err)))
            goto fail;
        e->bucket_pending = calloc((size_t)e->n_buckets, sizeof(int));
        e->bucket_buf = calloc((size_t)e->n_buckets, sizeof(float *));
        if (e->bucket_pending == NULL || e->bucket_buf == NULL) {
            st = zdp_err_set(err, ZDP_ERR_NOMEM, "engine: out of memory");
            goto fail;
        }
        for (int b = 0; b < e->n_buckets; b++) {
            int64_t n = e->buckets[b].hi - e->buckets[b].lo;
            if (n > INT32_MAX) {
                st = zdp_err_set(err, ZDP_ERR_UNSUPPORTED,
                                 "parameter tensor %s has %lld elements: zdp's MPI path "
                                 "reduces at most %d elements at once",
                                 model->params[e->buckets[b].first].name, (long long)n,
                                 INT32_MAX);
                goto fail;
            }
            if (n > e->bucket_elems) e->bucket_elems = n;
        }
    }
    if (stage == 2) {
        /* One buffer per bucket at most; two are allocated up front when
         * overlap_comm is on (DeepSpeed double-buffers), one otherwise; more
         * only if a model holds several buckets open at once. */
        e->pool_cap = e->n_buckets;
        e->pool = calloc((size_t)e->pool_cap, sizeof(float *));
        if (e->pool == NULL) {
            st = zdp_err_set(err, ZDP_ERR_NOMEM, "engine: out of memory");
            goto fail;
        }
        int initial = cfg->zero.overlap_comm && e->n_buckets > 1 ? 2 : 1;
        for (int k = 0; k < initial; k++) {
            if ((st = alloc_floats_(e, &e->pool[k], e->bucket_elems, ZDP_MEM_BUCKETS,
                                    "reduce bucket", err)))
                goto fail;
            e->pool_free = e->pool_total = k + 1;
        }
        int64_t recv = e->bucket_elems < e->lay.part ? e->bucket_elems : e->lay.part;
        if ((st = alloc_floats_(e, &e->rs_recv, recv, ZDP_MEM_BUCKETS, "reduce-scatter buffer",
                                err)))
            goto fail;
    }
    int64_t opt_n = stage == 0 ? e->lay.padded : e->lay.part;
    if ((st = zdp_optim_init(&e->optim, &cfg->optimizer, opt_n, &e->mem, err))) goto fail;

    if (e->rank == 0) log_memory_report_(e);
    *out = e;
    return ZDP_OK;
fail:
    zdp_engine_destroy(e);
    return st;
}

void zdp_engine_destroy(zdp_engine *e) {
    if (e == NULL) return;
    size_t fb = sizeof(float);
    zdp_optim_free(&e->optim, &e->mem);
    zdp_free(&e->mem, ZDP_MEM_PARAMS, e->params, (size_t)e->lay.padded * fb);
    zdp_free(&e->mem, ZDP_MEM_GRADS, e->grads, (size_t)e->lay.padded * fb);
    zdp_free(&e->mem, ZDP_MEM_GRAD_PARTITION, e->grad_part, (size_t)e->lay.part * fb);
    if (e->pool != NULL) {
        /* Every buffer is either in the pool or held by a bucket. */
        for (int k = 0; k < e->pool_free; k++)
            zdp_free(&e->mem, ZDP_MEM_BUCKETS, e->pool[k], (size_t)e->bucket_elems * fb);
        for (int b = 0; b < e->n_buckets; b++)
            zdp_free(&e->mem, ZDP_MEM_BUCKETS, e->bucket_buf[b], (size_t)e->bucket_elems * fb);
    }
    int64_t recv = e->bucket_elems < e->lay.part ? e->bucket_elems : e->lay.part;
    zdp_free(&e->mem, ZDP_MEM_BUCKETS, e->rs_recv, (size_t)recv * fb);
    free(e->pool);
    free(e->buckets);
    free(e->tensor_bucket);
    free(e->bucket_pending);
    free(e->bucket_buf);
    free(e->rs_counts);
    free(e->ag_counts);
    free(e->ag_displs);
    free(e->param_ptrs);
    free(e->sink.state);
    zdp_layout_free(&e->lay);
    free(e);
}

float *zdp_engine_param_data(zdp_engine *e, int i) {
    if (e == NULL || i < 0 || i >= e->lay.n_tensors) return NULL;
    return e->param_ptrs[i];
}

zdp_status zdp_engine_sync_params(zdp_engine *e, zdp_error *err) {
    if (e == NULL) return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "engine is NULL");
    /* Padding must stay zero: it is part of the partitions the optimizer sees. */
    memset(e->params + e->lay.numel, 0, (size_t)(e->lay.padded - e->lay.numel) * sizeof(float));
    return zdp_comm_bcast_bytes(e->params, e->lay.numel * (int64_t)sizeof(float), err);
}

/* ---- forward / backward -------------------------------------------------- */

zdp_status zdp_engine_forward(zdp_engine *e, const void *batch, float *loss, zdp_error *err) {
    if (e == NULL || loss == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_engine_forward: engine and loss must not be NULL");
    e->have_forward = false;
    zdp_status st = e->model->ops->forward(e->model->self, (const float *const *)e->param_ptrs,
                                           batch, loss, err);
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
    sink_begin_(e);
    zdp_status st = e->model->ops->backward(e->model->self, (const float *const *)e->param_ptrs,
                                            dloss, &e->sink, err);
    /* Finish the reductions even after a model failure, so that this rank
     * issues the same collectives as the others before reporting. */
    sink_end_(e);
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

bool zdp_engine_is_gradient_accumulation_boundary(const zdp_engine *e) {
    if (!e->cfg.managed_gradient_accumulation) return e->running_step;
    if (e->boundary_override >= 0) return e->boundary_override != 0;
    return (e->micro_steps + 1) % e->cfg.gradient_accumulation_steps == 0;
}

/* Stage 0: all-reduce the summed gradients, then x(1/W) (DeepSpeed's
 * postscale path with gradient_predivide_factor 1). */
static zdp_status reduce_stage0_(zdp_engine *e, zdp_error *err) {
    if (e->world == 1) return ZDP_OK;
    zdp_status st = zdp_comm_allreduce_sum_f32(e->grads, e->lay.numel, err);
    if (st != ZDP_OK) return st;
    const float inv = 1.0f / (float)e->world;
    for (int64_t i = 0; i < e->lay.numel; i++) e->grads[i] *= inv;
    return ZDP_OK;
}

/* Stage 1: the bucketed ZeRO-1 reduce of the window's gradients: each bucket
 * is divided by W and reduce-scattered straight into grad_part. */
static zdp_status reduce_stage1_(zdp_engine *e, zdp_error *err) {
    int64_t plo = (int64_t)e->rank * e->lay.part;
    const float w = (float)e->world;
    for (int b = 0; b < e->n_buckets; b++) {
        zdp_bucket *bk = &e->buckets[b];
        float *src = e->grads + bk->lo;
        int64_t n = bk->hi - bk->lo;
        if (e->world > 1)
            for (int64_t i = 0; i < n; i++) src[i] /= w;
        int64_t dst = (bk->lo > plo ? bk->lo : plo) - plo;
        zdp_status st;
        if (e->cfg.zero.reduce_scatter) {
            for (int r = 0; r < e->world; r++)
                e->rs_counts[r] = (int)zdp_layout_owned(&e->lay, r, bk->lo, bk->hi);
            st = zdp_comm_reduce_scatter_f32(src, e->grad_part + dst, e->rs_counts, err);
        } else {
            st = zdp_comm_allreduce_sum_f32(src, n, err);
            int64_t mine = zdp_layout_owned(&e->lay, e->rank, bk->lo, bk->hi);
            int64_t from = (bk->lo > plo ? bk->lo : plo) - bk->lo;
            if (st == ZDP_OK) memcpy(e->grad_part + dst, src + from, (size_t)mine * sizeof(float));
        }
        if (st != ZDP_OK) return st;
    }
    return ZDP_OK;
}

/* Stages 1/2: every rank gets the updated partitions of the others, in
 * shards of about allgather_bucket_size elements (DeepSpeed's sharding rule). */
static zdp_status allgather_params_(zdp_engine *e, zdp_error *err) {
    if (e->world == 1) return ZDP_OK;
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
        zdp_status st = zdp_comm_allgatherv_inplace_f32(e->params, e->ag_counts, e->ag_displs, err);
        if (st != ZDP_OK) return st;
    }
    return ZDP_OK;
}

/* DeepSpeed's model step (SEMANTICS.md 2.5) for fp32: reduce or finalize,
 * take the global norm, skip on NaN/Inf, clip, update, all-gather, zero the
 * gradients, advance the counters. */
static zdp_status model_step_(zdp_engine *e, zdp_error *err) {
    const int stage = e->cfg.zero.stage;
    zdp_status st = ZDP_OK;
    if (stage == 0) st = reduce_stage0_(e, err);
    else if (stage == 1) st = reduce_stage1_(e, err);
    if (st != ZDP_OK) return st;

    /* The gradient this rank's optimizer consumes, and the slice it owns. */
    int64_t P = e->lay.part, plo = (int64_t)e->rank * P;
    const float *owned = stage == 0 ? e->grads + plo : e->grad_part;
    double sumsq = 0.0;
    for (int64_t i = 0; i < P; i++) sumsq += (double)owned[i] * (double)owned[i];
    if ((st = zdp_comm_allreduce_sum_f64(&sumsq, 1, err)) != ZDP_OK) return st;
    /* A NaN or Inf anywhere makes the sum non-finite on every rank alike. */
    double norm = sqrt(sumsq);
    e->last_grad_norm = norm;
    bool overflow = !isfinite(norm);

    if (!overflow) {
        float scale = 1.0f;
        double clip = e->cfg.gradient_clipping;
        if (clip > 0.0) {
            double c = (norm + 1e-6) / clip;
            if (c > 1.0) scale = (float)(1.0 / c);
        }
        if (stage == 0) {
            zdp_optim_step(&e->optim, e->params, e->grads, scale, e->cfg.optimizer.lr);
        } else {
            zdp_optim_step(&e->optim, e->params + plo, e->grad_part, scale, e->cfg.optimizer.lr);
            /* The padding at the end of the last partition must stay zero. */
            memset(e->params + e->lay.numel, 0,
                   (size_t)(e->lay.padded - e->lay.numel) * sizeof(float));
            if ((st = allgather_params_(e, err)) != ZDP_OK) return st;
        }
    }
    if (e->grads != NULL) memset(e->grads, 0, (size_t)e->lay.padded * sizeof(float));
    if (e->grad_part != NULL) memset(e->grad_part, 0, (size_t)P * sizeof(float));

    e->step_applied = !overflow;
    if (overflow) e->skipped_steps++;
    e->global_steps++;
    if (e->cfg.managed_gradient_accumulation)
        e->global_samples += e->cfg.train_batch_size;
    else
        e->global_samples += e->cfg.micro_batch_size * e->world * e->window_backwards;
    e->window_backwards = 0;
    if (e->rank == 0) {
        /* A skipped step is never silent (DeepSpeed #8415). */
        if (overflow)
            zdp_log(1,
                    "step %lld skipped: the gradient has NaN or Inf on at least one rank (global "
                    "norm %g); parameters and optimizer state are unchanged, skipped_steps = %lld",
                    (long long)e->global_steps, norm, (long long)e->skipped_steps);
        if (e->cfg.steps_per_print > 0 && e->global_steps % e->cfg.steps_per_print == 0)
            zdp_log(0, "step=%lld, skipped=%lld, lr=[%g], grad_norm=%g, global_samples=%lld",
                    (long long)e->global_steps, (long long)e->skipped_steps, e->cfg.optimizer.lr,
                    norm, (long long)e->global_samples);
    }
    return ZDP_OK;
}

zdp_status zdp_engine_step(zdp_engine *e, zdp_error *err) {
    if (e == NULL) return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_engine_step: engine is NULL");
    e->step_applied = false;
    e->running_step = true;
    zdp_status st = ZDP_OK;
    if (zdp_engine_is_gradient_accumulation_boundary(e)) {
        if (e->window_backwards == 0) {
            e->running_step = false;
            return zdp_err_set(
                err, ZDP_ERR_STATE,
                "step() at an accumulation boundary with no backward() since the last optimizer "
                "step (global_steps = %lld): nothing to apply; call backward() at least once "
                "before step() (DeepSpeed would update with zero gradients or crash here)",
                (long long)e->global_steps);
        }
        st = model_step_(e, err);
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

/* ---- accessors -------------------------------------------------------------- */

bool zdp_engine_was_step_applied(const zdp_engine *e) { return e->step_applied; }
int64_t zdp_engine_global_steps(const zdp_engine *e) { return e->global_steps; }
int64_t zdp_engine_global_samples(const zdp_engine *e) { return e->global_samples; }
int64_t zdp_engine_micro_steps(const zdp_engine *e) { return e->micro_steps; }
int64_t zdp_engine_skipped_steps(const zdp_engine *e) { return e->skipped_steps; }
int64_t zdp_engine_pending_backwards(const zdp_engine *e) { return e->window_backwards; }
double zdp_engine_last_grad_norm(const zdp_engine *e) { return e->last_grad_norm; }
const zdp_config *zdp_engine_config(const zdp_engine *e) { return &e->cfg; }
int64_t zdp_engine_numel(const zdp_engine *e) { return e->lay.numel; }
int64_t zdp_engine_padded_numel(const zdp_engine *e) { return e->lay.padded; }
int64_t zdp_engine_partition_numel(const zdp_engine *e) { return e->lay.part; }

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
    };
    int64_t total = 0;
    for (int c = 0; c < ZDP_MEM_NCATEGORIES; c++) total += b[c];
    m->total_bytes = total;
}
