/*
 * serve_fx.h -- the server fixture the in-process server tests share
 * (test_serve_queue.c, test_serve_models.c): rank 0 of a server as
 * zdp_server_start leaves it, minus the engine, MPI and HTTP.  Header-only
 * (static inline); include after <cmocka.h> and "serve_impl.h".
 */
#ifndef ZDP_TEST_SERVE_FX_H
#define ZDP_TEST_SERVE_FX_H

#include <stdbool.h>
#include <stdlib.h>

#include "tinker/tinker.h"

/* A tiny model shape (V = 16, T = 8) and the Tinker protocol registered.
 * lora: a LoRA server of max_models slots (docs/server.md, "Models") whose
 * models are unloaded after idle_s without a heartbeat; else
 * --full-finetune, one model, slot 0.  The caller makes the models live. */
static inline server *serve_fx_new_(bool lora, int max_models, double idle_s) {
    server *s = calloc(1, sizeof *s);
    assert_non_null(s);
    s->model = (zdp_model){.vocab_size = 16, .block_size = 8};
    s->opt.seq_gap_s = 30;
    s->opt.model_name = "zdp-gpt";
    s->opt.full_finetune = !lora;
    s->opt.max_models = max_models;
    s->opt.model_idle_timeout_s = idle_s;
    s->W = 1;
    s->busy_op = -1;
    if (lora) {
        s->slots = calloc((size_t)max_models, sizeof *s->slots);
        assert_non_null(s->slots);
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv_job, NULL);
    pthread_cond_init(&s->cv_done, NULL);
    char why[512];
    assert_true(serve_register_tinker(s, why, sizeof why));
    return s;
}

/* Frees the queued jobs, the protocol's state and the server. */
static inline void serve_fx_free_(server *s) {
    for (job *j = s->head, *n; j != NULL; j = n) {
        n = j->next;
        serve_job_free(j);
    }
    s->proto.destroy(s->proto.state);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv_job);
    pthread_cond_destroy(&s->cv_done);
    free(s->slots);
    free(s);
}

#endif /* ZDP_TEST_SERVE_FX_H */
