/*
 * engine.c -- the forward / backward / step state machine, its counters
 * and accessors, and the engine's create and destroy.
 *
 * What lives where (one owner per buffer, all counted in eng->mem):
 *   params     (padded)  the flat parameter buffer; the model reads views of it
 *                        (stage 3: only this rank's partition, P)
 *   grads      (padded)  stages 0/1: the window's local gradient sum
 *   grad_part  (P)       stages 1-3: this rank's averaged gradient partition
 *   gb, s3, frozen       the ZeRO paths' state (src/zero/zero.h): reduce
 *                        buckets, stage 3's gathers, the frozen weights
 *   optim                optimizer state: the whole buffer (stage 0) or the
 *                        partition (stages 1-3)
 *
 * When gradients are reduced (DeepSpeed's schedule, docs/deepspeed.md §3.4, §4.5):
 *   stage 0/1: gradients add up locally over the window; the boundary step()
 *              reduces them once (stage 0: all-reduce; stage 1: bucketed
 *              reduce-scatter into grad_part).  DeepSpeed's managed mode does
 *              this in the boundary backward's epilogue; doing it at the start
 *              of the boundary step() gives the same numbers for every correct
 *              call sequence and stays right when a window has several
 *              backwards at the boundary (see docs/training.md).
 *   stage 2/3: every backward reduce-scatters each bucket as soon as all its
 *              tensors are released and adds the rank's piece into grad_part
 *              (src/zero/buckets.c); step() drains what is still in flight.
 *   stage 3:   params holds only the partition, and the model's
 *              zdp_param_fetch gathers a layer on the stream
 *              (src/zero/stage3.c); the update runs on the partition with no
 *              all-gather after it (docs/deepspeed.md §4.8).
 * Every collective is an operation queued on the engine's comm stream
 * (stream_ops.c, and the ZeRO paths'), so every rank issues them in the
 * same order.
 * Not here: MPI (src/comm), update formulas (src/optim), the ZeRO paths
 * (src/zero), the grad sink (grad_sink.c), parameter access (params.c),
 * checkpoints (checkpoint.c).
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <math.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#include "engine_impl.h"

static double now_(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

zdp_status zdp_engine_drain_(zdp_engine *e, zdp_error *err) {
    return zdp_buckets_drain(&e->gb, err);
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

/* Stage 3 with a model's frozen weights: a set of the engine's own, on its
 * stream, or the store's; the model reads them through the set's source
 * from now on. */
static zdp_status frozen_attach_(zdp_engine *e, zdp_frozen_store *store, zdp_error *err) {
    const zdp_frozen *fz = e->model->frozen;
    zdp_status st;
    if (store != NULL) {
        st = zdp_frozen_store_borrow(store, fz, &e->frozen, err);
        if (st != ZDP_OK) return st;
        e->frozen_borrowed = true;
    } else {
        st = zdp_frozen_set_create(&e->cfg, e->rank, e->world, fz, e->stream, &e->frozen, err);
        if (e->frozen != NULL) zdp_stage3_attach_frozen(&e->s3, &e->frozen->s3, false);
        if (st != ZDP_OK) return st;
    }
    if (store != NULL) zdp_stage3_attach_frozen(&e->s3, &e->frozen->s3, true);
    e->frozen_prev = *fz->src;
    *fz->src = &e->frozen->src;
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
    /* What the ZeRO paths see of this engine (the stream comes below). */
    e->zl = (zdp_zero_link){.rank = e->rank, .world = world, .cfg = &e->cfg.zero,
                            .lay = &e->lay, .info = model->params, .params = e->params,
                            .mem = &e->mem, .stats = &e->comm_total,
                            .wait_s = &e->timing_window.comm_wait_s, .rs_counts = e->rs_counts,
                            .ag_counts = e->ag_counts, .ag_displs = e->ag_displs};
    /* The model reads whole tensors below stage 3, gathers at stage 3. */
    e->src = (zdp_param_source){.dense = (const float *const *)e->param_ptrs, .n_dense = nt};
    if (stage == 3) {
        if ((st = zdp_stage3_init(&e->s3, &e->zl, "ZDP_TEST_FAIL_GATHER", err)) != ZDP_OK)
            goto fail;
        e->src = (zdp_param_source){.s3 = &e->s3};
    }

    if (stage < 2 && (st = alloc_(e, &e->grads, e->lay.padded, sizeof(float), ZDP_MEM_GRADS,
                                  "gradients", err)))
        goto fail;
    if (stage >= 1) {
        if ((st = alloc_(e, &e->grad_part, e->lay.part, sizeof(float), ZDP_MEM_GRAD_PARTITION,
                         "gradient partition", err)) ||
            (st = zdp_buckets_init(&e->gb, &e->zl, e->grad_part, stage == 3 ? &e->s3 : NULL,
                                   err)))
            goto fail;
    }
    int64_t opt_n = stage == 0 ? e->lay.padded : e->lay.part;
    if ((st = zdp_optim_init(&e->optim, &cfg->optimizer, opt_n, &e->mem, err))) goto fail;
    zdp_engine_hparams_from_config_(e);
    /* Deep enough for every bucket of one backward plus the step's work. */
    int depth = e->gb.n + e->gb.pool_cap + 8;
    if ((st = zdp_stream_create(&e->stream, depth, &e->mem, err)) != ZDP_OK) goto fail;
    e->zl.stream = e->stream;
    if (stage == 3 && model->frozen != NULL && (st = frozen_attach_(e, store, err)) != ZDP_OK)
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
         * once frozen_attach_ got as far as pointing it here. */
        if (*e->model->frozen->src == &e->frozen->src) *e->model->frozen->src = e->frozen_prev;
        if (e->frozen_borrowed) zdp_frozen_store_return(e->frozen, &e->s3); /* untouched */
        else zdp_frozen_set_destroy(e->frozen);
        e->frozen = NULL;
        e->s3.frozen = NULL;
    }
    const size_t fb = sizeof(float);
    const int nt = e->lay.n_tensors, W = e->world;
    zdp_buckets_free(&e->gb);
    zdp_optim_free(&e->optim, &e->mem);
    zdp_stage3_free(&e->s3);
    free_(e, e->params, e->cfg.zero.stage == 3 ? e->lay.part : e->lay.padded, fb,
          ZDP_MEM_PARAMS);
    free_(e, e->grads, e->lay.padded, fb, ZDP_MEM_GRADS);
    free_(e, e->grad_part, e->lay.part, fb, ZDP_MEM_GRAD_PARTITION);
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
        double agree[AGREE_N] = {0.0, c, c * c, 0.0};
        zdp_status ast = zdp_engine_run_sync_(e, OP_ALLREDUCE_NORM, agree, err);
        if (ast != ZDP_OK) return ast;
        if (zdp_engine_agree_verdict_(agree, e->world) != 0)
            return disagree_fail_(e, IN_FORWARD, e->window_backwards + 1, err);
    }
    zdp_status st = zdp_stage3_pass_begin(&e->s3, ZDP_PASS_FORWARD, err);
    if (st == ZDP_OK) st = e->model->ops->forward(e->model->self, &e->src, batch, loss, err);
    zdp_stage3_pass_end(&e->s3);
    st = zdp_stage3_pass_agree(&e->s3, st, err);
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
    zdp_engine_sink_begin_(e);
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
        e->bwd_agree_event = zdp_engine_enqueue_(e, OP_AGREE_BACKWARD, e->bwd_agree);
    }
    zdp_status st = zdp_stage3_pass_begin(&e->s3, ZDP_PASS_BACKWARD, err);
    if (st == ZDP_OK) st = e->model->ops->backward(e->model->self, &e->src, dloss, &e->sink, err);
    zdp_stage3_pass_end(&e->s3);
    /* Finish the reductions even after a model failure, so that this rank
     * issues the same collectives as the others before reporting. */
    zdp_engine_sink_end_(e);
    /* Stage 3: every rank leaves this backward with the same verdict; a
     * failed one (here or on another rank) leaves the window's gradient
     * partition half reduced, so it is dropped below on every rank. */
    const zdp_status model_st = st;
    st = zdp_stage3_pass_agree(&e->s3, st, err);
    const bool pass_failed = e->cfg.zero.stage == 3 && st != ZDP_OK;
    e->timing_window.backward_s += now_() - t0;
    if (agree) {
        /* Every rank takes the disagreement path alike, whatever else went
         * wrong here, so the gather on it is matched. */
        zdp_error aerr = {0};
        zdp_status ast = zdp_zero_wait(&e->zl, e->bwd_agree_event, &aerr);
        if (ast == ZDP_OK && zdp_engine_agree_verdict_(e->bwd_agree, e->world) != 0)
            return disagree_fail_(e, IN_BACKWARD, e->window_backwards + 1, err);
        if (ast != ZDP_OK && st == ZDP_OK) {
            if (err != NULL) *err = aerr;
            return ast;
        }
    }
    if (pass_failed && e->sink.comm_status == ZDP_OK) {
        /* With overlap_comm the last reductions may still be adding in. */
        zdp_error rerr = {0};
        (void)zdp_buckets_drain(&e->gb, &rerr);
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
    (void)zdp_buckets_drain(&e->gb, &gerr); /* skipped reductions of this backward */
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
    return zdp_engine_run_sync_(e, OP_ALLREDUCE_GRADS, NULL, err);
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
     * adds, each waiting for the one before). */
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
 * gradients (the whole model's at stage 0) would otherwise be zeroed by one
 * thread while the pool's others wait. */
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
    zdp_status st = zdp_buckets_drain(&e->gb, err);
    if (st != ZDP_OK) return st;
    if (stage == 0) st = reduce_stage0_(e, err);
    else if (stage == 1) st = zdp_buckets_reduce_window(&e->gb, e->grads, err);
    if (st != ZDP_OK) return st;

    /* The gradient this rank's optimizer consumes, and the slice it owns. */
    int64_t P = e->lay.part, plo = (int64_t)e->rank * P;
    const float *owned = stage == 0 ? e->grads + plo : e->grad_part;
    double sumsq = sumsq_(owned, P);
    /* The norm's all-reduce also checks that every rank made the same number
     * of backward() calls (and, at stage 2, that none is still in one). */
    const double nb = (double)e->window_backwards;
    double agree[AGREE_N] = {1.0, nb, nb * nb, sumsq};
    if ((st = zdp_engine_run_sync_(e, OP_ALLREDUCE_NORM, agree, err)) != ZDP_OK) return st;
    if (zdp_engine_agree_verdict_(agree, e->world) != 0)
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
            (st = zdp_engine_run_sync_(e, OP_ALLREDUCE_FLAG, &bad, err)) != ZDP_OK)
            return st;
        refused = bad != 0.0;
    }
    if (!overflow && !refused) {
        const double t_opt = now_();
        zdp_optim_step(&e->optim, p, g, scale, lr);
        /* The padding at the end of the last partition must stay zero. */
        if (stage >= 1) zdp_engine_zero_padding_(e);
        if (stage == 3) zdp_stage3_params_changed(&e->s3);
        e->timing_window.optimizer_s += now_() - t_opt;
        e->last_lr = lr;
        e->sched_iter++;
        /* Stage 3 gathers what the model fetches instead. */
        if ((stage == 1 || stage == 2) && e->world > 1 &&
            (st = zdp_buckets_allgather_params(&e->gb, err)) != ZDP_OK)
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
    zdp_status st = zdp_buckets_drain(&e->gb, err); /* nothing may add in after the zeroing */
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

int64_t zdp_engine_prefetch_hits(const zdp_engine *e) { return e->s3.prefetch_hits; }
int64_t zdp_engine_reuse_hits(const zdp_engine *e) { return e->s3.reuse_hits; }

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
        .gathered_peak_bytes = e->s3.gathered_peak,
        .activation_bytes = e->model->activation_bytes,
    };
    int64_t total = 0;
    for (int c = 0; c < ZDP_MEM_NCATEGORIES; c++) total += b[c];
    if (e->frozen != NULL && e->frozen_borrowed) {
        /* A shared store's bytes are its own report's
         * (zdp_frozen_store_memory_report); only what this engine's pass
         * gathered of it counts here. */
        m->gathered_bytes +=
            e->frozen->s3.parent == &e->s3 ? e->frozen->mem.bytes[ZDP_MEM_GATHERED] : 0;
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
