/*
 * exec_info.c -- GET /info on every rank: each rank's memory rows and every
 * live model's counters, gathered onto rank 0 into a serve_info_result
 * (plain_info.c encodes it).  Every rank makes the same gathers in the same
 * order: the models' first, then the server's own rows.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "serve_impl.h"

/* Every rank's n counters onto rank 0, a malloc'd (W, n) array there and
 * NULL on the other ranks (COLLECTIVE). */
static int64_t *gather_rows_(server *s, const int64_t *mine, int n) {
    int64_t *all = s->R == 0 ? malloc((size_t)s->W * (size_t)n * sizeof *all) : NULL;
    if (s->R == 0 && all == NULL) serve_die("info", &(zdp_error){.msg = "out of memory"});
    zdp_error err;
    if (zdp_channel_gather(s->ch, mine, (int64_t)n * (int64_t)sizeof *mine, all, &err) != ZDP_OK)
        serve_die("info", &err);
    return all;
}

/* Every live model with its counters and its memory on each rank (the
 * engine's report: adapter parameters, gradients and optimizer state; the
 * shared base is not counted), into r on rank 0.  Every rank gathers. */
static void models_(server *s, serve_info_result *r) {
    enum { K = SERVE_INFO_MODEL_COLS };
    if (s->R == 0 && (r->models = calloc((size_t)s->opt.max_models, sizeof *r->models)) == NULL)
        serve_die("info", &(zdp_error){.msg = "out of memory"});
    for (int k = 0; k < s->opt.max_models; k++) {
        const serve_slot *x = &s->slots[k];
        if (x->uid == 0) continue;
        zdp_memory_report m;
        zdp_engine_memory_report(x->eng, &m);
        int64_t mine[K] = {m.params_bytes, m.grads_bytes + m.grad_partition_bytes + m.bucket_bytes,
                           m.optimizer_bytes, m.other_bytes, m.total_bytes, m.frozen_bytes};
        int64_t *all = gather_rows_(s, mine, K);
        if (s->R != 0) continue;
        serve_info_model *o = &r->models[r->n_models++];
        *o = (serve_info_model){.slot = k, .n_params = zdp_engine_numel(x->eng),
                                .step = zdp_engine_global_steps(x->eng),
                                .pending_backwards = zdp_engine_pending_backwards(x->eng),
                                .micro_steps = zdp_engine_micro_steps(x->eng), .rows = all, .lc = x->lc};
        snprintf(o->name, sizeof o->name, "%s", x->name);
    }
}

static void exec_info_lora_(server *s, serve_info_result *r) {
    int64_t base = 0;
    for (int i = 0; i < s->model.n_params; i++) base += serve_numel(&s->model.params[i]) * (int64_t)sizeof(float);
    /* The server's own rows, once per rank (not per model): the base it
     * holds whole (stages 0-2) or its one partition shared by every model
     * (stage 3: zdp_frozen_store), and what sampling holds. */
    zdp_memory_report fm;
    zdp_frozen_store_memory_report(s->store, &fm);
    int64_t held = 0; /* the whole base tensors this rank holds (none at stage 3) */
    for (int i = 0; s->base != NULL && i < s->model.n_params; i++)
        if (s->base[i] != NULL) held += serve_numel(&s->model.params[i]) * (int64_t)sizeof(float);
    int64_t mine[SERVE_INFO_LORA_COLS] = {held, fm.frozen_bytes, fm.other_bytes,
                                          s->whole_peak_bytes, s->kv_bytes_peak, zdp_kv_packs_bytes(s->packs),
                                          zdp_kv_packs_count(s->packs), s->rows_prefill, s->rows_decode,
                                          s->rows_shared};
    r->rows = gather_rows_(s, mine, SERVE_INFO_LORA_COLS);
    r->n_cols = SERVE_INFO_LORA_COLS;
    r->base_bytes = base;
}

static void exec_info_full_(server *s, serve_info_result *r) {
    s->eng = s->slots[0].eng;
    zdp_memory_report m;
    zdp_engine_memory_report(s->eng, &m);
    /* Beyond the engine's: the sampling side, which lives outside it (the
     * sampler weights asample keeps, the KV cache a request makes, and at
     * stage 3 the most bytes of whole-model copies gathered at once for
     * sampling and save_weights, held only while such a request runs). */
    int64_t snap = 0;
    for (int i = 0; s->snap != NULL && i < s->model.n_params; i++)
        snap += serve_numel(&s->model.params[i]) * (int64_t)sizeof(float);
    int64_t mine[SERVE_INFO_FULL_COLS] = {m.params_bytes, m.grads_bytes, m.grad_partition_bytes, m.bucket_bytes,
                                          m.optimizer_bytes, m.master_bytes, m.other_bytes, m.total_bytes,
                                          snap, s->kv_bytes_last, s->kv_bytes_peak, s->whole_peak_bytes,
                                          zdp_kv_packs_bytes(s->packs), zdp_kv_packs_count(s->packs),
                                          s->rows_prefill, s->rows_decode, s->rows_shared};
    r->rows = gather_rows_(s, mine, SERVE_INFO_FULL_COLS);
    r->n_cols = SERVE_INFO_FULL_COLS;
    if (s->R != 0) return;
    r->step = zdp_engine_global_steps(s->eng);
    r->global_samples = zdp_engine_global_samples(s->eng);
    r->micro_steps = zdp_engine_micro_steps(s->eng);
    r->skipped_steps = zdp_engine_skipped_steps(s->eng);
    r->pending_backwards = zdp_engine_pending_backwards(s->eng);
    r->lr = zdp_engine_lr(s->eng);
    r->last_grad_norm = zdp_engine_last_grad_norm(s->eng);
    /* What the next update uses: the config's values until an optim_step's
     * adam_params set others. */
    zdp_engine_get_hparams(s->eng, &r->hp);
}

void serve_exec_info(server *s, job *j) {
    serve_info_result *r = calloc(1, sizeof *r);
    if (r == NULL) serve_die("info", &(zdp_error){.msg = "out of memory"});
    r->W = s->W;
    r->lora = serve_lora(s);
    models_(s, r);
    if (r->lora) exec_info_lora_(s, r);
    else exec_info_full_(s, r);
    if (s->R != 0) {
        serve_info_result_free(r);
        return;
    }
    /* The requests answered so far (this one not yet counted). */
    memcpy(r->stats, s->stats, sizeof r->stats);
    j->info = r;
    j->status = 200;
}
