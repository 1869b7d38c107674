/*
 * test_serve_models.c -- many models on one server, in-process, without HTTP
 * or MPI (docs/server.md, "Models"): requests routed by model_id into each
 * model's own seq_id order and tagged with its slot and uid; an unknown
 * model_id refused naming it; a model whose session stops heartbeating
 * unloaded by the tick (an all-rank OP_UNLOAD job for its slot), and a later
 * request to it told why; a job whose slot no longer holds its model refused
 * before any engine call; a session that ended (silent past
 * --session-timeout-seconds, or finished) gives up its model's slot.  The server struct is serve_fx.h's (LoRA mode,
 * two live models), as test_serve_queue.c's is for one.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "serve_impl.h"
#include "serve_fx.h"
#include "tinker/tinker.h"

static const char *const ids_[2] = {"s1:train:0", "s2:train:0"};

/* Rank 0 of a LoRA server holding two models (slots 0 and 1, uids 7 and 9),
 * created by sessions s1 and s2, both heard from just now. */
static server *server_(void) {
    server *s = serve_fx_new_(true, 2, 5);
    tinker_state *t = s->tinker;
    assert_int_equal(t->n_models, 2);
    for (int k = 0; k < 2; k++) {
        tinker_model *m = &t->models[k];
        *m = (tinker_model){.live = true, .slot = k, .uid = k ? 9 : 7, .next_seq = 1,
                            .lc = {.rank = 2, .targets = ZDP_LORA_ALL}};
        snprintf(m->model_id, sizeof m->model_id, "%s", ids_[k]);
        snprintf(m->session, sizeof m->session, "s%d", k + 1);
        session *x = calloc(1, sizeof *x);
        assert_non_null(x);
        snprintf(x->id, sizeof x->id, "s%d", k + 1);
        x->seen = serve_now();
        x->next = t->sessions;
        t->sessions = x;
    }
    return s;
}

/* forward_backward of model k with seq_id seq; the HTTP status (e: why). */
static int submit_(server *s, int k, const char *model_id, int64_t seq, verr *e) {
    json_t *o = json_pack("{s:s,s:I,s:{s:[{s:{s:[{s:s,s:[i,i]}]},s:{s:[i,i]}}],s:s}}", "model_id",
                          model_id != NULL ? model_id : ids_[k], "seq_id", (json_int_t)seq,
                          "forward_backward_input", "data", "model_input", "chunks", "type", "encoded_text",
                          "tokens", 1, 2, "loss_fn_inputs", "target_tokens", 2, 3, "loss_fn", "cross_entropy");
    assert_non_null(o);
    tinker_ticket tk;
    *e = (verr){0};
    const int st = tinker_submit(s, "forward_backward", o, NULL, false, &tk, e);
    json_decref(o);
    return st;
}

/* Each model keeps its own seq_id order; every job carries its model's
 * slot and uid (the header every rank receives). */
static void test_routing(void **state) {
    (void)state;
    server *s = server_();
    verr e;
    assert_int_equal(submit_(s, 1, NULL, 2, &e), 200); /* held: model 1 waits for its seq_id 1 */
    assert_null(s->head);
    assert_int_equal(submit_(s, 0, NULL, 1, &e), 200); /* model 0's 1: due at once */
    assert_int_equal(submit_(s, 1, NULL, 1, &e), 200); /* model 1's 1, then its 2 */
    const int want_slot[3] = {0, 1, 1};
    const int64_t want_uid[3] = {7, 9, 9}, want_seq[3] = {1, 1, 2};
    int n = 0;
    for (const job *j = s->head; j != NULL; j = j->next, n++) {
        assert_true(n < 3);
        assert_int_equal(j->op, OP_FWDBWD);
        assert_int_equal(j->slot, want_slot[n]);
        assert_int_equal(j->uid, want_uid[n]);
        assert_int_equal(j->seq_id, want_seq[n]);
    }
    assert_int_equal(n, 3);
    assert_int_equal(s->tinker->models[0].next_seq, 2);
    assert_int_equal(s->tinker->models[1].next_seq, 3);
    /* An unknown model_id: a 400 naming it, nothing queued or held. */
    assert_int_equal(submit_(s, 0, "s9:train:4", 1, &e), 400);
    assert_string_equal(e.field, "model_id");
    assert_non_null(strstr(e.msg, "s9:train:4"));
    assert_non_null(strstr(e.msg, "2 live"));
    serve_fx_free_(s);
}

/* A session silent past --model-idle-timeout-seconds: its model is unloaded
 * by an OP_UNLOAD job for its slot; held requests fail; later ones are a
 * 400 saying why; the other model is untouched. */
static void test_heartbeat_unload(void **state) {
    (void)state;
    server *s = server_();
    tinker_state *t = s->tinker;
    verr e;
    assert_int_equal(submit_(s, 1, NULL, 2, &e), 200); /* held */
    pthread_mutex_lock(&s->mu);
    assert_false(tinker_tick_locked(s)); /* both sessions fresh */
    for (session *x = t->sessions; x != NULL; x = x->next)
        if (!strcmp(x->id, "s2")) x->seen -= 6;
    assert_true(tinker_tick_locked(s));
    pthread_mutex_unlock(&s->mu);
    assert_non_null(s->head);
    assert_int_equal(s->head->op, OP_UNLOAD);
    assert_int_equal(s->head->slot, 1);
    assert_int_equal(s->head->uid, 9);
    assert_true(s->head->detached);
    assert_null(s->head->next);
    assert_false(t->models[1].live);
    assert_null(t->models[1].held);
    assert_true(t->models[0].live);
    assert_int_equal(submit_(s, 1, NULL, 1, &e), 400);
    assert_string_equal(e.field, "model_id");
    assert_non_null(strstr(e.msg, "unloaded: its session s2 sent no heartbeat"));
    assert_non_null(strstr(e.msg, "--model-idle-timeout-seconds"));
    assert_int_equal(submit_(s, 0, NULL, 1, &e), 200); /* model 0 still trains */
    serve_fx_free_(s);
}

/* A session that missed --session-timeout-seconds of heartbeats has ended:
 * its model is the one a create_model with no free slot unloads (the
 * longest-silent first); while every session is alive there is none, and
 * the 400's list names each model, its session and its last heartbeat.
 * The tick still waits --model-idle-timeout-seconds. */
static void test_evictable(void **state) {
    (void)state;
    server *s = server_();
    s->opt.session_timeout_s = 3;
    s->opt.model_idle_timeout_s = 100;
    tinker_state *t = s->tinker;
    const double now = serve_now();
    pthread_mutex_lock(&s->mu);
    assert_null(tinker_evictable(s, now));
    char msg[2048];
    tinker_describe_models(s, now, msg, sizeof msg);
    assert_non_null(strstr(msg, "s1:train:0 (session s1, alive, last heartbeat 0.0 s ago)"));
    assert_non_null(strstr(msg, "s2:train:0 (session s2, alive"));
    for (session *x = t->sessions; x != NULL; x = x->next) x->seen -= !strcmp(x->id, "s2") ? 5 : 4;
    assert_ptr_equal(tinker_evictable(s, now), &t->models[1]); /* both silent: s2 the longer */
    tinker_find_session(t, "s2")->seen = now;
    assert_ptr_equal(tinker_evictable(s, now), &t->models[0]);
    tinker_describe_models(s, now, msg, sizeof msg);
    assert_non_null(strstr(msg, "s1:train:0 (session s1, silent, last heartbeat 4.0 s ago)"));
    assert_false(tinker_tick_locked(s)); /* not unloaded before --model-idle-timeout-seconds */
    assert_true(t->models[0].live);
    pthread_mutex_unlock(&s->mu);
    serve_fx_free_(s);
}

/* POST sessions/ID/finish: the session's model is unloaded at once (an
 * OP_UNLOAD for its slot), a later request to it says why, the other
 * session's model trains on; a second finish changes nothing; an unknown
 * session is a 404 naming it; a finished session holds no slot. */
static void test_finish(void **state) {
    (void)state;
    server *s = server_();
    tinker_state *t = s->tinker;
    verr e = {0};
    json_t *gone = NULL;
    pthread_mutex_lock(&s->mu);
    assert_true(tinker_finish_session(s, "s2", "interrupted", &gone, &e));
    pthread_mutex_unlock(&s->mu);
    assert_int_equal(json_array_size(gone), 1);
    assert_string_equal(json_string_value(json_array_get(gone, 0)), "s2:train:0");
    json_decref(gone);
    assert_non_null(s->head);
    assert_int_equal(s->head->op, OP_UNLOAD);
    assert_int_equal(s->head->slot, 1);
    assert_int_equal(s->head->uid, 9);
    assert_null(s->head->next);
    assert_false(t->models[1].live);
    assert_true(t->models[0].live);
    assert_int_equal(submit_(s, 1, NULL, 1, &e), 400);
    assert_non_null(strstr(e.msg, "its session s2 finished (reason interrupted)"));
    assert_int_equal(submit_(s, 0, NULL, 1, &e), 200);
    pthread_mutex_lock(&s->mu);
    assert_true(tinker_finish_session(s, "s2", "success", &gone, &e)); /* again: nothing more */
    assert_int_equal(json_array_size(gone), 0);
    json_decref(gone);
    assert_string_equal(tinker_find_session(t, "s2")->finish_why, "interrupted");
    assert_false(tinker_session_alive(s, tinker_find_session(t, "s2"), serve_now()));
    e = (verr){0};
    assert_false(tinker_finish_session(s, "s77", "success", &gone, &e));
    assert_null(gone);
    assert_int_equal(e.status, 404);
    assert_string_equal(e.field, "session_id");
    assert_non_null(strstr(e.msg, "s77"));
    pthread_mutex_unlock(&s->mu);
    serve_fx_free_(s);
}

/* A job whose slot no longer holds its uid (the model was unloaded, or its
 * create failed) is refused on every rank before any engine call. */
static void test_stale_job(void **state) {
    (void)state;
    server *s = server_();
    s->slots[0].uid = 3; /* another model now */
    const int ops[] = {OP_FWDBWD, OP_FORWARD, OP_OPTIM, OP_SAVE_STATE, OP_LOAD_STATE, OP_LOAD_WEIGHTS, OP_UNLOAD};
    for (size_t i = 0; i < sizeof ops / sizeof *ops; i++) {
        job j = {.op = ops[i], .slot = 0, .uid = 7};
        serve_exec(s, &j);
        assert_int_equal(j.status, 400);
        assert_string_equal(j.err_field, "model_id");
        assert_non_null(strstr(j.err_msg, "unloaded"));
        j = (job){.op = ops[i], .slot = 5, .uid = 7}; /* outside the table */
        serve_exec(s, &j);
        assert_int_equal(j.status, 400);
    }
    serve_fx_free_(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_routing),
        cmocka_unit_test(test_heartbeat_unload),
        cmocka_unit_test(test_stale_job),
        cmocka_unit_test(test_evictable),
        cmocka_unit_test(test_finish),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
