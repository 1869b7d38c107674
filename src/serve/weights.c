/*
 * weights.c -- the model weights as the executing ops see them, on every
 * rank: the base model's views, whole copies gathered from the ZeRO stage-3
 * partitions (and written back), the LoRA base gathered for a sampling
 * batch, the adapters of the model being trained, and a slot's model and
 * engine.  Engine calls only; no request or reply is seen here.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef __GLIBC__
#include <malloc.h> /* malloc_trim */
#endif

#include "core/core.h"
#include "serve_impl.h"

int64_t serve_numel(const zdp_param_info *p) {
    int64_t n = 1;
    for (int d = 0; d < p->ndim; d++) n *= p->shape[d];
    return n;
}

float **serve_views(server *s) {
    float **v = malloc((size_t)s->model.n_params * sizeof *v);
    if (v == NULL) return NULL;
    for (int i = 0; i < s->model.n_params; i++)
        v[i] = s->base != NULL ? s->base[i] : zdp_engine_param_data(s->slots[0].eng, i);
    return v;
}

/* Stage 3 with --full-finetune: no rank holds whole tensors, so reading the
 * weights (sampling, save_weights) gathers a whole copy from the partitions
 * and writing them (start-up, load_weights) scatters one into them. */
static bool whole_copies_(const server *s) { return s->cfg.zero.stage == 3 && !serve_lora(s); }

/* Whole copies of engine e's np tensors in one block (v[0] first), gathered
 * from the stage-3 partitions when `gather` (COLLECTIVE then); NULL with
 * err set when out of memory on this rank (on any rank, with gather). */
static float **whole_get_(server *s, zdp_engine *e, int np, bool gather, zdp_error *err) {
    const int64_t n = zdp_engine_numel(e);
    float **v = calloc((size_t)np, sizeof *v);
    float *block = v != NULL ? zdp_big_alloc((size_t)n * sizeof(float)) : NULL; /* (n) every tensor, v[0] first */
    /* The gathers are collective: every rank has its copy first (without
     * them the caller handles a failure on this rank alone). */
    if (gather ? !zdp_dist_all_ok(block != NULL) : block == NULL) {
        free(block);
        free(v);
        zdp_err_set(err, ZDP_ERR_NOMEM, "out of memory for the whole model (%lld parameters, gathered at "
                    "ZeRO stage 3 on every rank)", (long long)n);
        return NULL;
    }
    for (int i = 0; i < np; i++) v[i] = block + zdp_engine_param_offset(e, i);
    for (int i = 0; gather && i < np; i++)
        if (zdp_engine_get_param(e, i, v[i], err) != ZDP_OK) serve_die("gather weights", err);
    const int64_t bytes = n * (int64_t)sizeof(float);
    if (bytes > s->whole_peak_bytes) s->whole_peak_bytes = bytes;
    return v;
}

float **serve_weights_get(server *s, bool gather, zdp_error *err) {
    if (!whole_copies_(s)) {
        float **v = serve_views(s);
        if (v == NULL) zdp_err_set(err, ZDP_ERR_NOMEM, "out of memory");
        return v;
    }
    return whole_get_(s, s->slots[0].eng, s->model.n_params, gather, err);
}

zdp_status serve_weights_push(server *s, float *const *v, zdp_error *err) {
    for (int i = 0; whole_copies_(s) && i < s->model.n_params; i++)
        if (zdp_engine_set_param(s->slots[0].eng, i, v[i], err) != ZDP_OK) return err->code;
    return zdp_engine_sync_params(s->slots[0].eng, err);
}

void serve_weights_free(server *s, float **v) {
    if (v != NULL && whole_copies_(s)) free(v[0]);
    free(v);
}

float **serve_base_get(server *s, char *why, size_t why_size) {
    if (s->store == NULL) return s->base;
    const int np = s->model.n_params;
    int64_t n = 0;
    for (int i = 0; i < np; i++) n += serve_numel(&s->model.params[i]);
    float **v = calloc((size_t)np, sizeof *v);
    float *block = v != NULL ? zdp_big_alloc((size_t)n * sizeof(float)) : NULL; /* (n) every tensor, v[0] first */
    /* The gathers are collective: every rank has its block first, or none
     * gathers and the batch fails on every rank. */
    if (!zdp_dist_all_ok(block != NULL)) {
        free(block);
        free(v);
        snprintf(why, why_size, "out of memory for the whole base weights (%lld floats) that sampling gathers "
                 "at ZeRO stage 3 on some rank; send a smaller batch or serve with fewer models",
                 (long long)n);
        return NULL;
    }
    int64_t off = 0;
    for (int i = 0; i < np; off += serve_numel(&s->model.params[i]), i++) v[i] = block + off;
    zdp_error err = {0};
    for (int i = 0; i < np; i++)
        if (zdp_frozen_store_get(s->store, i, v[i], &err) != ZDP_OK) serve_die("gather the base", &err);
    const int64_t bytes = n * (int64_t)sizeof(float);
    if (bytes > s->whole_peak_bytes) s->whole_peak_bytes = bytes;
    s->base_now = v;
    return v;
}

void serve_base_free(server *s, float **v) {
    if (v == NULL || s->store == NULL) return;
    free(v[0]);
    free(v);
    s->base_now = NULL;
    /* The weights packed from it are a copy of the whole base too. */
    zdp_kv_packs_destroy(s->packs);
    s->packs = NULL;
#ifdef __GLIBC__
    /* glibc keeps large freed blocks in the heap once its mmap threshold
     * has grown to their size; give them back, or the rank's resident set
     * keeps the whole base between batches. */
    malloc_trim(0);
#endif
}

/* The tensors of the model being trained (s->cur, a LoRA model's adapters):
 * the engine's views at stages 0-2; at stage 3, where no rank holds whole
 * tensors, whole copies (gathered when `gather`: COLLECTIVE, every rank
 * alike).  NULL with err set when out of memory.  serve_adapters_push writes
 * them back (every rank the same values) and syncs; serve_adapters_free frees. */
float **serve_adapters_get(server *s, bool gather, zdp_error *err) {
    if (s->cfg.zero.stage == 3) return whole_get_(s, s->eng, s->cur->n_params, gather, err);
    float **v = malloc((size_t)s->cur->n_params * sizeof *v);
    if (v == NULL) {
        zdp_err_set(err, ZDP_ERR_NOMEM, "out of memory");
        return NULL;
    }
    for (int i = 0; i < s->cur->n_params; i++) v[i] = zdp_engine_param_data(s->eng, i);
    return v;
}

zdp_status serve_adapters_push(server *s, float *const *v, zdp_error *err) {
    for (int i = 0; s->cfg.zero.stage == 3 && i < s->cur->n_params; i++)
        if (zdp_engine_set_param(s->eng, i, v[i], err) != ZDP_OK) return err->code;
    return zdp_engine_sync_params(s->eng, err);
}

void serve_adapters_free(server *s, float **v) {
    if (v != NULL && s->cfg.zero.stage == 3) free(v[0]);
    free(v);
}

/* Frees slot k's model and engine (LoRA mode; every rank alike). */
void serve_slot_free(server *s, int k) {
    serve_slot *x = &s->slots[k];
    if (x->uid == 0 || s->opt.full_finetune) return;
    zdp_engine_destroy(x->eng);
    zdp_lora_destroy(&x->lora);
    *x = (serve_slot){0};
}
