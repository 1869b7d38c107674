/*
 * sessions.c -- the state of the Tinker protocol on rank 0, under
 * s->mu: sessions and their heartbeats, the models of create_model and the
 * slots they train in, unloading, the tick (silent sessions' models
 * unloaded, seq_id gaps given up), sampling sessions, the protocol's
 * registration, and the names of run folders on disk.  Each model's seq_id
 * order is submit.c's.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tinker/proto.h"
#include "tinker/tinker.h"

tinker_state *tinker_create(int n_models) {
    tinker_state *t = calloc(1, sizeof *t);
    if (t == NULL) return NULL;
    t->n_models = n_models > 0 ? n_models : 1;
    if ((t->models = calloc((size_t)t->n_models, sizeof *t->models)) == NULL) {
        free(t);
        return NULL;
    }
    return t;
}

void tinker_destroy(tinker_state *t) {
    if (t == NULL) return;
    for (future *f = t->futures, *n; f != NULL; f = n) {
        n = f->next;
        free(f->result);
        serve_fwd_result_free(f->fwd);
        serve_sample_result_free(f->samp);
        serve_save_result_free(f->saved);
        free(f);
    }
    for (session *x = t->sessions, *n; x != NULL; x = n) {
        n = x->next;
        free(x);
    }
    for (sampling_session *x = t->samplers, *n; x != NULL; x = n) {
        n = x->next;
        free(x->path);
        free(x);
    }
    for (int k = 0; k < t->n_models; k++)
        for (job *j = t->models[k].held, *n; j != NULL; j = n) {
            n = j->next;
            serve_job_free(j);
        }
    free(t->models);
    free(t);
}

/* ---- sessions and models (s->mu held) ------------------------------------------------ */

/* Whether a live model belongs to session id. */
static bool owns_model_(const tinker_state *t, const char *id) {
    for (int k = 0; k < t->n_models; k++)
        if (t->models[k].live && !strcmp(t->models[k].session, id)) return true;
    return false;
}

/* Sessions silent for an hour are forgotten (those of live models are kept). */
void tinker_prune_sessions(tinker_state *t) {
    const double now = serve_now();
    for (session **pp = &t->sessions; *pp != NULL;) {
        session *x = *pp;
        if (now - x->seen > FUTURE_TTL_S && !owns_model_(t, x->id)) {
            *pp = x->next;
            free(x);
        } else {
            pp = &x->next;
        }
    }
}

session *tinker_find_session(tinker_state *t, const char *id) {
    for (session *x = t->sessions; x != NULL; x = x->next)
        if (!strcmp(x->id, id)) return x;
    return NULL;
}

void tinker_touch_model_session(tinker_state *t, const tinker_model *m) {
    session *x = tinker_find_session(t, m->session);
    if (x != NULL) x->seen = serve_now();
}

/* The live model named model_id; NULL when none. */
tinker_model *tinker_find_model(tinker_state *t, const char *model_id) {
    for (int k = 0; k < t->n_models; k++)
        if (t->models[k].live && !strcmp(t->models[k].model_id, model_id)) return &t->models[k];
    return NULL;
}

int tinker_live_models(const tinker_state *t) {
    int n = 0;
    for (int k = 0; k < t->n_models; k++) n += t->models[k].live;
    return n;
}

/* Why model_id is not live: it was unloaded (and why), or never existed.
 * Sets e (400) naming it. */
bool tinker_not_live(const tinker_state *t, const char *model_id, verr *e) {
    for (int64_t i = t->n_gone - 1; i >= 0 && i >= t->n_gone - MAX_GONE; i--) {
        const tinker_gone *g = &t->gone[i % MAX_GONE];
        if (!strcmp(g->model_id, model_id))
            return serve_bad(e, 400, "model_id", "model_id \"%s\": unloaded: %s; its checkpoints stay "
                             "(create_training_client_from_state loads one into a new model)", model_id, g->why);
    }
    return serve_bad(e, 400, "model_id", "model_id \"%s\": no such model on this server (%d live); send the "
                     "model_id create_model returned", model_id, tinker_live_models(t));
}

/* Unloads live LoRA model m (s->mu held): its slot is freed by an all-rank
 * job behind every request of it already queued, so a create_model that
 * takes the slot next runs after it; its held requests fail; a later
 * request is told why (tinker_gone).  fut: unload_model's future, answered
 * when the job ran; NULL: nobody waits (the heartbeat timeout).  false when
 * out of memory (nothing changed). */
bool tinker_unload(server *s, tinker_model *m, future *fut, const char *why) {
    tinker_state *t = s->tinker;
    job *j = calloc(1, sizeof *j);
    if (j == NULL) return false;
    j->op = OP_UNLOAD;
    j->slot = m->slot;
    j->uid = m->uid;
    j->fut = fut;
    j->detached = fut == NULL;
    tinker_gone *g = &t->gone[t->n_gone++ % MAX_GONE];
    snprintf(g->model_id, sizeof g->model_id, "%s", m->model_id);
    snprintf(g->why, sizeof g->why, "%s", why);
    fprintf(stderr, "zdp serve: model %s unloaded: %s\n", m->model_id, why);
    m->live = false;
    char msg[600];
    snprintf(msg, sizeof msg, "model %s was unloaded before this request ran: %s", m->model_id, why);
    tinker_fail_held(s, m, "user", msg);
    serve_enqueue_locked(s, j);
    return true;
}

double tinker_session_timeout(const server *s) {
    return s->opt.session_timeout_s > 0 ? s->opt.session_timeout_s : SESSION_TIMEOUT_S;
}

bool tinker_session_alive(const server *s, const session *x, double now) {
    return x != NULL && !x->finished && now - x->seen < tinker_session_timeout(s);
}

/* A session ends by finishing or by silence; its models' unsaved state is
 * then out of every client's reach (a new process starts a new session), so
 * holding their slots for --model-idle-timeout-seconds only refuses the
 * restarted script's create_model.  The longest-ended goes first. */
tinker_model *tinker_evictable(server *s, double now) {
    tinker_state *t = s->tinker;
    tinker_model *best = NULL;
    double best_seen = 0;
    for (int k = 0; k < t->n_models; k++) {
        tinker_model *m = &t->models[k];
        if (!m->live) continue;
        const session *x = tinker_find_session(t, m->session);
        if (tinker_session_alive(s, x, now)) continue;
        const double seen = x != NULL ? x->seen : 0;
        if (best == NULL || seen < best_seen) best = m, best_seen = seen;
    }
    return best;
}

void tinker_describe_models(server *s, double now, char *out, size_t cap) {
    tinker_state *t = s->tinker;
    size_t n = 0;
    out[0] = '\0';
    for (int k = 0; k < t->n_models && n < cap; k++) {
        const tinker_model *m = &t->models[k];
        if (!m->live) continue;
        const session *x = tinker_find_session(t, m->session);
        const char *state = x == NULL ? "unknown" : x->finished ? "finished" : tinker_session_alive(s, x, now)
                                                                                   ? "alive" : "silent";
        n += (size_t)snprintf(out + n, cap - n, "%s%s (session %s, %s, last heartbeat %.1f s ago)", n ? ", " : "",
                              m->model_id, m->session, state, x != NULL ? now - x->seen : -1.0);
    }
}

bool tinker_finish_session(server *s, const char *id, const char *reason, json_t **unloaded, verr *e) {
    tinker_state *t = s->tinker;
    *unloaded = NULL;
    session *x = tinker_find_session(t, id);
    if (x == NULL)
        return serve_bad(e, 404, "session_id", "session_id \"%s\": unknown session (create_session makes one; a "
                         "session silent for an hour is forgotten)", id);
    if ((*unloaded = json_array()) == NULL) return serve_bad(e, 500, NULL, "out of memory");
    if (!x->finished) {
        x->finished = true;
        snprintf(x->finish_why, sizeof x->finish_why, "%s", reason);
        fprintf(stderr, "zdp serve: session %s finished (%s)\n", id, reason);
    }
    char why[200];
    snprintf(why, sizeof why, "its session %s finished (reason %s)", id, x->finish_why);
    for (int k = 0; k < t->n_models; k++) {
        tinker_model *m = &t->models[k];
        if (!m->live || strcmp(m->session, id) != 0) continue;
        if (serve_lora(s)) {
            if (!tinker_unload(s, m, NULL, why)) return serve_bad(e, 500, NULL, "out of memory");
        } else { /* --full-finetune: the model detaches; the weights stay in the engine */
            m->live = false;
            tinker_fail_held(s, m, "user", why);
            tinker_gone *g = &t->gone[t->n_gone++ % MAX_GONE];
            snprintf(g->model_id, sizeof g->model_id, "%s", m->model_id);
            snprintf(g->why, sizeof g->why, "%s", why);
            fprintf(stderr, "zdp serve: model %s detached: %s\n", m->model_id, why);
        }
        json_array_append_new(*unloaded, json_string(m->model_id));
    }
    return true;
}

bool tinker_tick_locked(server *s) {
    tinker_state *t = s->tinker;
    if (t == NULL) return false;
    bool queued = tinker_runs_sweep_locked(s);
    const double now = serve_now();
    for (int k = 0; k < t->n_models; k++) {
        tinker_model *m = &t->models[k];
        if (!m->live) continue;
        if (serve_lora(s)) {
            /* A LoRA model whose session went silent is unloaded (its slot is
             * another's to take); --full-finetune keeps its one model. */
            const session *x = tinker_find_session(t, m->session);
            const double idle = x != NULL ? now - x->seen : s->opt.model_idle_timeout_s;
            if (idle >= s->opt.model_idle_timeout_s) {
                char why[300];
                snprintf(why, sizeof why, "its session %s sent no heartbeat or request for %.0f s "
                         "(--model-idle-timeout-seconds %g)", m->session, idle, s->opt.model_idle_timeout_s);
                if (tinker_unload(s, m, NULL, why)) queued = true;
                continue;
            }
        }
        if (tinker_expire_gap(s, m, now)) queued = true;
    }
    return queued;
}

void tinker_shutdown_locked(server *s) {
    if (s->tinker == NULL) return;
    for (int k = 0; k < s->tinker->n_models; k++)
        tinker_fail_held(s, &s->tinker->models[k], "server", "the server is shutting down");
}

/* ---- sampling sessions (s->mu held) --------------------------------------------------- */

/* Registers (or re-points) sampling session id -> weights file. */
bool tinker_add_sampler(tinker_state *t, const char *id, const char *path) {
    sampling_session **pp = &t->samplers;
    int n = 0;
    int64_t clients = 0; /* a replaced session's clones keep their numbers */
    for (; *pp != NULL; n++) {
        sampling_session *x = *pp;
        if (!strcmp(x->id, id) || n >= MAX_SAMPLERS - 1) { /* replaced, or the oldest past the cap */
            if (!strcmp(x->id, id)) clients = x->n_clients;
            *pp = x->next;
            free(x->path);
            free(x);
        } else {
            pp = &x->next;
        }
    }
    sampling_session *x = calloc(1, sizeof *x);
    if (x == NULL || (x->path = strdup(path)) == NULL) {
        free(x);
        return false;
    }
    snprintf(x->id, sizeof x->id, "%s", id);
    x->n_clients = clients;
    x->next = t->samplers;
    t->samplers = x;
    return true;
}

const sampling_session *tinker_find_sampler(const tinker_state *t, const char *id) {
    for (const sampling_session *x = t->samplers; x != NULL; x = x->next)
        if (!strcmp(x->id, id)) return x;
    return NULL;
}

static void destroy_(void *state) { tinker_destroy(state); }

bool serve_register_tinker(server *s, char *why, size_t cap) {
    s->tinker = tinker_create(s->opt.max_models);
    if (s->tinker == NULL) {
        snprintf(why, cap, "out of memory");
        return false;
    }
    s->proto = (serve_protocol){.prefix = "/api/v1/", .state = s->tinker, .handle = tinker_handle,
                                .content_type = SERVE_PROTO_CONTENT_TYPE,
                                .content_type_hint = " (or " SERVE_PROTO_CONTENT_TYPE
                                                     " for the Tinker SDK's forward_backward)",
                                .finish = tinker_finish_locked, .tick = tinker_tick_locked,
                                .shutdown = tinker_shutdown_locked, .destroy = destroy_};
    return tinker_runs_restore(s, why, cap);
}

/* ---- names on disk ------------------------------------------------------------------- */

/* A checkpoint name from a client: one path component. */
bool tinker_good_name(const char *n) {
    size_t len = strlen(n);
    if (len == 0 || len > 200 || n[0] == '.') return false;
    for (size_t i = 0; i < len; i++) {
        char ch = n[i];
        bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                  ch == '.' || ch == '_' || ch == '-';
        if (!ok) return false;
    }
    return true;
}

/* model_id "s1:train:0" -> directory name "s1_train_0".  Only letters,
 * digits and '-' survive, so no model_id (a client's string in load_weights)
 * can name "..". */
void tinker_model_dir(const char *model_id, char *out, size_t cap) {
    size_t k = 0;
    for (const char *p = model_id; *p && k + 1 < cap; p++) {
        char ch = *p;
        bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                  ch == '-';
        out[k++] = ok ? ch : '_';
    }
    out[k] = '\0';
}
