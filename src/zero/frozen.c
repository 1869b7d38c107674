/*
 * frozen.c -- stage 3 with a model's frozen weights (zdp_frozen, a LoRA
 * base): the weights partitioned 1/W per rank like parameters, without
 * gradients or optimizer, gathered layer by layer by a stage-3 state of
 * their own within the passes of the engine they serve (zero.h, "frozen
 * weights"; docs/lora.md).
 *
 * A set is an engine's own (zdp_engine_create with model->frozen at stage
 * 3: it shares the engine's stream and dies with it) or a shared store's
 * (zdp_frozen_store_create: several engines borrow one partition, each
 * running the store's gathers on its own stream within its passes; between
 * passes the store's own stream serves whole gathers).  No rank reads a
 * whole tensor it does not own: each reads its slice through fz->read.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zero.h"

static zdp_status alloc_(zdp_frozen_set *f, void *out, int64_t count, size_t size,
                         zdp_mem_category cat, const char *what, zdp_error *err) {
    void *p = zdp_alloc(&f->mem, cat, (size_t)count * size);
    *(void **)out = p;
    if (p == NULL)
        return zdp_err_set(err, ZDP_ERR_NOMEM, "%s: cannot allocate %lld bytes on rank %d", what,
                           (long long)(count * (int64_t)size), f->link.rank);
    return ZDP_OK;
}

zdp_status zdp_frozen_set_create(const zdp_config *cfg, int rank, int world, const zdp_frozen *fz,
                                 zdp_stream *stream, zdp_frozen_set **out, zdp_error *err) {
    zdp_frozen_set *f = calloc(1, sizeof *f);
    *out = f;
    if (f == NULL) return zdp_err_set(err, ZDP_ERR_NOMEM, "engine: out of memory");
    f->zcfg = cfg->zero;
    f->link = (zdp_zero_link){.rank = rank, .world = world, .cfg = &f->zcfg, .lay = &f->lay,
                              .info = fz->params, .mem = &f->mem, .stream = stream,
                              .stats = &f->comm_total, .wait_s = &f->comm_wait_s};
    zdp_status st = zdp_layout_init(&f->lay, fz->params, fz->n_params, world, &f->mem, err);
    if (st != ZDP_OK) return st;
    if (f->lay.padded > INT32_MAX)
        return zdp_err_set(err, ZDP_ERR_UNSUPPORTED,
                           "model: %lld frozen weights (padded): zdp's MPI path supports up to %d "
                           "elements in one flat buffer",
                           (long long)f->lay.padded, INT32_MAX);
    if ((st = alloc_(f, &f->params, f->lay.part, sizeof(float), ZDP_MEM_PARAMS, "frozen weights",
                     err)) ||
        (st = alloc_(f, &f->ag_counts, world, sizeof(int), ZDP_MEM_OTHER, "engine", err)) ||
        (st = alloc_(f, &f->ag_displs, world, sizeof(int), ZDP_MEM_OTHER, "engine", err)))
        return st;
    f->link.params = f->params;
    f->link.ag_counts = f->ag_counts;
    f->link.ag_displs = f->ag_displs;
    if ((st = zdp_stage3_init(&f->s3, &f->link, "ZDP_TEST_FAIL_FROZEN_GATHER", err)) != ZDP_OK)
        return st;
    f->src.s3 = &f->s3;
    /* This rank's piece of each tensor, read straight into the partition;
     * the padding stays zero. */
    memset(f->params, 0, (size_t)f->lay.part * sizeof(float));
    if (fz->read == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_engine_create: the model's frozen "
                           "weights (zdp_model.frozen) have no read function");
    return zdp_layout_read(&f->lay, rank, true, f->params, fz->read, fz->read_ctx, err);
}

void zdp_frozen_set_destroy(zdp_frozen_set *f) {
    if (f == NULL) return;
    /* Let the store's queued gathers finish before their buffers go. */
    zdp_stream_destroy(f->own_stream);
    f->own_stream = NULL;
    zdp_stage3_free(&f->s3);
    const int64_t W = f->link.world;
    zdp_free(&f->mem, ZDP_MEM_PARAMS, f->params, (size_t)f->lay.part * sizeof(float));
    zdp_free(&f->mem, ZDP_MEM_OTHER, f->ag_counts, (size_t)W * sizeof(int));
    zdp_free(&f->mem, ZDP_MEM_OTHER, f->ag_displs, (size_t)W * sizeof(int));
    zdp_layout_free(&f->lay);
    /* Every counted byte must have come back: the report would lie otherwise. */
    for (int c = 0; c < ZDP_MEM_NCATEGORIES; c++)
        if (f->mem.bytes[c] != 0)
            zdp_log(1, "internal: memory accounting is off by %lld bytes in category %d at "
                       "destroy (a bug in zdp)",
                    (long long)f->mem.bytes[c], c);
    free(f);
}

/* ---- the shared store ------------------------------------------------------- */

struct zdp_frozen_store {
    zdp_frozen_set *f;
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
    st = zdp_frozen_set_create(cfg, zdp_dist_rank(), world, fz, NULL, &s->f, err);
    if (st == ZDP_OK)
        st = zdp_stream_create(&s->f->own_stream, 2 * s->f->lay.n_tensors + 16, &s->f->mem, err);
    if (st != ZDP_OK) {
        zdp_frozen_store_destroy(s);
        return st;
    }
    s->f->link.stream = s->f->own_stream;
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
    zdp_frozen_set_destroy(s->f);
    free(s);
}

zdp_status zdp_frozen_store_get(zdp_frozen_store *s, int i, float *out, zdp_error *err) {
    if (s == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_frozen_store_get: store is NULL");
    zdp_frozen_set *f = s->f;
    if (f->s3.in_pass)
        return zdp_err_set(err, ZDP_ERR_STATE,
                           "zdp_frozen_store_get: an engine borrowing the store is inside its "
                           "forward or backward; gather whole tensors between passes");
    /* Between passes the borrowers' streams have run all of the store's
     * gathers, so its own stream takes the next ones. */
    f->link.stream = f->own_stream;
    f->s3.parent = NULL;
    /* The same checks and words as zdp_engine_get_param, which this call
     * was before the store had its own. */
    if (out == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "zdp_engine_get_param: engine and data must not be NULL");
    if (i < 0 || i >= f->lay.n_tensors)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "zdp_engine_get_param: tensor %d: the model has %d (0..%d)", i,
                           f->lay.n_tensors, f->lay.n_tensors - 1);
    return zdp_stage3_get_tensor(&f->s3, i, out, err);
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

zdp_status zdp_frozen_store_borrow(zdp_frozen_store *s, const zdp_frozen *fz,
                                   zdp_frozen_set **out, zdp_error *err) {
    zdp_frozen_set *f = s->f;
    if (fz->n_params != f->lay.n_tensors)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "zdp_engine_create_shared: the model has %d frozen tensors, the store "
                           "%d; borrow a store made from this model's base",
                           fz->n_params, f->lay.n_tensors);
    for (int i = 0; i < fz->n_params; i++) {
        int64_t n = 1;
        for (int d = 0; d < fz->params[i].ndim; d++) n *= fz->params[i].shape[d];
        if (n != f->lay.numels[i] || strcmp(fz->params[i].name, f->link.info[i].name) != 0)
            return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                               "zdp_engine_create_shared: frozen tensor %d is %s (%lld elements) "
                               "in the model but %s (%lld) in the store; borrow a store made from "
                               "this model's base",
                               i, fz->params[i].name, (long long)n, f->link.info[i].name,
                               (long long)f->lay.numels[i]);
    }
    f->borrowers++;
    *out = f;
    return ZDP_OK;
}

void zdp_frozen_store_return(zdp_frozen_set *f, const zdp_stage3 *borrower) {
    if (f->s3.parent == borrower) {
        f->s3.parent = NULL;
        f->link.stream = f->own_stream;
    }
    f->borrowers--;
}
