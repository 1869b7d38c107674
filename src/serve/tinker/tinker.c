/*
 * tinker/tinker.c -- the Tinker SDK's wire protocol (docs/tinker-protocol.md)
 * on top of `zdp serve`: JSON for SDK 0.18-0.24, and for SDK 0.25 the
 * protobuf forward_backward (tinker/proto.c).  The core reaches it only
 * through the serve_protocol registered by serve_register_tinker.
 *
 * Everything here runs on rank 0 under s->mu, in the HTTP connection threads
 * (and in the main thread for tinker_finish_locked / tinker_tick_locked).
 *
 * Futures.  Every training verb answers its POST at once with
 * {"request_id": "zdp-N"}; the work runs later on the server's one FIFO queue
 * and its result is kept on the future (an hour, not deleted on first read:
 * a client may poll again after a lost response).  retrieve_future holds the
 * connection until the future is done or --long-poll-seconds pass, then
 * answers {"type": "try_again"}: the SDK re-polls at once, so an immediate
 * try_again would spin.
 *
 * Order.  One model; its requests carry seq_id 1, 2, 3, ...  The SDK posts the
 * chunks of one forward_backward in parallel with the first chunk last, so
 * they arrive out of order: a request waits in `held` until every smaller
 * seq_id has been queued.  A request refused before the engine (a validation
 * error) still uses up its seq_id, as the client's counter moves on; a
 * seq_id that never arrives is given up after --seq-gap-seconds.
 *
 * Retries.  The SDK retries a POST whose answer it did not get, with the same
 * X-Idempotency-Key inside one call and a new one across its outer retry
 * loop.  Either key, or the same (model_id, seq_id), gets the first request's
 * request_id back and nothing runs twice.
 *
 * Protobuf (SDK 0.25).  0.25 posts every forward_backward -- and forward, as
 * forward_backward with forward_only = true -- as application/x-protobuf
 * (client/config's proto_write_fwdbwd is no longer read), and takes the
 * ForwardBackwardOutput only as protobuf.  The body is decoded straight into
 * the typed request the JSON path also produces (fwd_input.h), and
 * serve_fwd_build checks it for both (one validation; the envelope's checks,
 * check_model_id_ and check_seq_id_, are shared too).  Its future remembers that it came as protobuf: retrieve_future
 * answers it in protobuf when the poll's Accept names application/x-protobuf
 * (errors and try_again stay JSON, which 0.25 reads).  A JSON request always
 * gets JSON: 0.18-0.24 send JSON (proto_write_fwdbwd is false here), and
 * some of them send Accept: application/x-protobuf for ForwardBackwardOutput
 * too, but every one of them reads JSON.  A malformed protobuf body is
 * answered 400 at once, like a body that is not JSON.
 *
 * Sampling.  A sampling session (create_sampling_session, or
 * save_weights_for_sampler without a name) names a saved weights file;
 * asample runs on the same queue, on rank 0 only, reading that file (not the
 * live weights), and its SampleResponse goes as protobuf whenever the poll
 * asks (SDKs ask only for types they decode; sample requests are JSON).
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>

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

/* ---- replies ------------------------------------------------------------------ */

static enum MHD_Result reply_json_(struct MHD_Connection *c, int status, json_t *o) {
    return serve_reply(c, status, serve_dump(o));
}

/* A direct error: the SDK raises it with the body (other 4xx than 408/409/429
 * are not retried). */
static enum MHD_Result reply_err_(struct MHD_Connection *c, int status, const char *field,
                                  const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static enum MHD_Result reply_err_(struct MHD_Connection *c, int status, const char *field,
                                  const char *fmt, ...) {
    char msg[1024], fld[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    serve_utf8_fix(msg);
    if (field != NULL) {
        snprintf(fld, sizeof fld, "%s", field);
        serve_utf8_fix(fld);
        field = fld;
    }
    return reply_json_(c, status, json_pack("{s:s,s:s,s:s*}", "error", msg, "category",
                                            status >= 500 ? "server" : "user", "field", field));
}

enum MHD_Result tinker_reply_error(struct MHD_Connection *c, int status, const char *field, const char *fmt,
                                   ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return reply_err_(c, status, field, "%s", msg);
}

/* A failed future's result: the SDK raises RequestFailedError(error, category). */
static char *failure_(const char *category, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static char *failure_(const char *category, const char *fmt, ...) {
    char msg[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    serve_utf8_fix(msg);
    return serve_dump(json_pack("{s:s,s:s}", "error", msg, "category", category));
}

/* ---- futures and sessions (s->mu held) ---------------------------------------------- */

void tinker_prune(tinker_state *t) {
    const double now = serve_now();
    future **pp = &t->futures;
    int64_t kept = 0;
    while (*pp != NULL) {
        future *f = *pp;
        bool old = f->done && (now - f->done_at > FUTURE_TTL_S ||
                               (f->read_at > 0 && now - f->read_at > FUTURE_READ_TTL_S));
        /* Past the cap, drop finished ones that have had a minute to be read. */
        bool surplus = kept >= MAX_FUTURES && f->done && now - f->done_at > FUTURE_READ_TTL_S;
        if (old || surplus) {
            *pp = f->next;
            free(f->result);
            serve_fwd_result_free(f->fwd);
            serve_sample_result_free(f->samp);
            serve_save_result_free(f->saved);
            free(f);
            t->n_futures--;
        } else {
            kept++;
            pp = &f->next;
        }
    }
}

/* Whether a live model belongs to session id. */
static bool owns_model_(const tinker_state *t, const char *id) {
    for (int k = 0; k < t->n_models; k++)
        if (t->models[k].live && !strcmp(t->models[k].session, id)) return true;
    return false;
}

/* Sessions silent for an hour are forgotten (those of live models are kept). */
static void prune_sessions_(tinker_state *t) {
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

static future *new_future_(tinker_state *t, const char *idem, const char *model_id, int64_t seq) {
    tinker_prune(t);
    future *f = calloc(1, sizeof *f);
    if (f == NULL) return NULL;
    snprintf(f->id, sizeof f->id, "zdp-%lld", (long long)++t->n_requests);
    snprintf(f->idem, sizeof f->idem, "%s", idem ? idem : "");
    snprintf(f->model_id, sizeof f->model_id, "%s", model_id ? model_id : "");
    f->seq_id = seq;
    f->next = t->futures;
    t->futures = f;
    t->n_futures++;
    return f;
}

static void complete_(future *f, char *result) {
    if (result == NULL) /* out of memory: what the poll answers then */
        result = strdup("{\"error\":\"out of memory\",\"category\":\"server\"}");
    f->result = result;
    f->done = true;
    f->done_at = serve_now();
}

/* The future a retried POST already made: same idempotency key, or the same
 * (model_id, seq_id). */
static future *find_retry_(tinker_state *t, const char *idem, const char *model_id, int64_t seq) {
    for (future *f = t->futures; f != NULL; f = f->next) {
        if (idem != NULL && idem[0] && !strcmp(f->idem, idem)) return f;
        if (seq > 0 && f->seq_id == seq && !strcmp(f->model_id, model_id)) return f;
    }
    return NULL;
}

static future *find_future_(tinker_state *t, const char *id) {
    for (future *f = t->futures; f != NULL; f = f->next)
        if (!strcmp(f->id, id)) return f;
    return NULL;
}

static session *find_session_(tinker_state *t, const char *id) {
    for (session *x = t->sessions; x != NULL; x = x->next)
        if (!strcmp(x->id, id)) return x;
    return NULL;
}

static void touch_model_session_(tinker_state *t, const tinker_model *m) {
    session *x = find_session_(t, m->session);
    if (x != NULL) x->seen = serve_now();
}

/* The live model named model_id; NULL when none. */
static tinker_model *find_model_(tinker_state *t, const char *model_id) {
    for (int k = 0; k < t->n_models; k++)
        if (t->models[k].live && !strcmp(t->models[k].model_id, model_id)) return &t->models[k];
    return NULL;
}

static int live_models_(const tinker_state *t) {
    int n = 0;
    for (int k = 0; k < t->n_models; k++) n += t->models[k].live;
    return n;
}

/* Why model_id is not live: it was unloaded (and why), or never existed.
 * Sets e (400) naming it. */
static bool not_live_(const tinker_state *t, const char *model_id, verr *e) {
    for (int64_t i = t->n_gone - 1; i >= 0 && i >= t->n_gone - MAX_GONE; i--) {
        const tinker_gone *g = &t->gone[i % MAX_GONE];
        if (!strcmp(g->model_id, model_id))
            return serve_bad(e, 400, "model_id", "model_id \"%s\": unloaded: %s; its checkpoints stay "
                             "(create_training_client_from_state loads one into a new model)", model_id, g->why);
    }
    return serve_bad(e, 400, "model_id", "model_id \"%s\": no such model on this server (%d live); send the "
                     "model_id create_model returned", model_id, live_models_(t));
}

static void ticket_(const future *f, tinker_ticket *out) {
    snprintf(out->id, sizeof out->id, "%s", f->id);
    snprintf(out->model_id, sizeof out->model_id, "%s", f->model_id);
}

static enum MHD_Result reply_future_(struct MHD_Connection *c, const future *f) {
    return reply_json_(c, 200, json_pack("{s:s,s:s*}", "request_id", f->id, "model_id",
                                         f->model_id[0] ? f->model_id : NULL));
}

/* ---- seq_id order (s->mu held) ------------------------------------------------------ */

/* Queues m's held requests while the next one is the seq_id due. */
static bool release_(server *s, tinker_model *m) {
    bool queued = false;
    while (m->held != NULL && m->held->seq_id <= m->next_seq) {
        job *j = m->held;
        m->held = j->next;
        m->next_seq = j->seq_id + 1;
        if (j->op == OP_NOOP) {
            serve_job_free(j); /* refused before the engine; its future is answered */
        } else {
            serve_enqueue_locked(s, j);
            queued = true;
        }
    }
    return queued;
}

static void hold_(server *s, tinker_model *m, job *j) {
    job **pp = &m->held;
    while (*pp != NULL && (*pp)->seq_id < j->seq_id) pp = &(*pp)->next;
    j->next = *pp;
    *pp = j;
    release_(s, m);
}

/* Fails every held request of m with msg (shutdown, a replaced or unloaded model). */
static void fail_held_(server *s, tinker_model *m, const char *category, const char *msg) {
    for (job *j = m->held, *n; j != NULL; j = n) {
        n = j->next;
        if (j->op != OP_NOOP) complete_(j->fut, failure_(category, "%s", msg));
        serve_job_free(j);
    }
    m->held = NULL;
    pthread_cond_broadcast(&s->cv_done);
}

/* Unloads live LoRA model m (s->mu held): its slot is freed by an all-rank
 * job behind every request of it already queued, so a create_model that
 * takes the slot next runs after it; its held requests fail; a later
 * request is told why (tinker_gone).  fut: unload_model's future, answered
 * when the job ran; NULL: nobody waits (the heartbeat timeout).  false when
 * out of memory (nothing changed). */
static bool unload_(server *s, tinker_model *m, future *fut, const char *why) {
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
    fail_held_(s, m, "user", msg);
    serve_enqueue_locked(s, j);
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
            const session *x = find_session_(t, m->session);
            const double idle = x != NULL ? now - x->seen : s->opt.model_idle_timeout_s;
            if (idle >= s->opt.model_idle_timeout_s) {
                char why[300];
                snprintf(why, sizeof why, "its session %s sent no heartbeat or request for %.0f s "
                         "(--model-idle-timeout-seconds %g)", m->session, idle, s->opt.model_idle_timeout_s);
                if (unload_(s, m, NULL, why)) queued = true;
                continue;
            }
        }
        if (m->held == NULL) continue;
        double oldest = m->held->arrived;
        for (job *j = m->held; j != NULL; j = j->next)
            if (j->arrived < oldest) oldest = j->arrived;
        if (now - oldest < s->opt.seq_gap_s) continue;
        fprintf(stderr,
                "zdp serve: warning: model %s: seq_id %lld..%lld never arrived within %g s "
                "(--seq-gap-seconds); running seq_id %lld and later without them\n",
                m->model_id, (long long)m->next_seq, (long long)m->held->seq_id - 1, s->opt.seq_gap_s,
                (long long)m->held->seq_id);
        m->next_seq = m->held->seq_id;
        if (release_(s, m)) queued = true;
    }
    return queued;
}

void tinker_shutdown_locked(server *s) {
    if (s->tinker == NULL) return;
    for (int k = 0; k < s->tinker->n_models; k++)
        fail_held_(s, &s->tinker->models[k], "server", "the server is shutting down");
}

/* Registers (or re-points) sampling session id -> weights file. */
static bool add_sampler_(tinker_state *t, const char *id, const char *path) {
    sampling_session **pp = &t->samplers;
    int n = 0;
    for (; *pp != NULL; n++) {
        sampling_session *x = *pp;
        if (!strcmp(x->id, id) || n >= MAX_SAMPLERS - 1) { /* replaced, or the oldest past the cap */
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
    x->next = t->samplers;
    t->samplers = x;
    return true;
}

static const sampling_session *find_sampler_(const tinker_state *t, const char *id) {
    for (const sampling_session *x = t->samplers; x != NULL; x = x->next)
        if (!strcmp(x->id, id)) return x;
    return NULL;
}

/* Moves a finished job's typed result onto its future and frees the job. */
static void keep_typed_(job *j) {
    future *f = j->fut;
    if (j->fwd != NULL) f->fwd = j->fwd, j->fwd = NULL;
    if (j->sample != NULL) f->samp = j->sample, j->sample = NULL;
    if (j->saved != NULL) f->saved = j->saved, j->saved = NULL;
    f->done = true;
    f->done_at = serve_now();
    j->fut = NULL;
    serve_job_free(j);
}

/* A job's outcome -> its future's result, in the SDK's shapes: a failure's
 * message as RequestFailedError, a ForwardBackwardOutput, SampleResponse or
 * save kept typed until a poll encodes it, the others as JSON now. */
void tinker_finish_locked(server *s, job *j) {
    char *result = NULL;
    const int status = j->status;
    if (j->op == OP_CREATE && status != 200) {
        /* Refused on every rank (nothing was made): the model never lived,
         * and what was queued behind it is refused at its turn. */
        tinker_model *m = NULL;
        for (int k = 0; k < s->tinker->n_models; k++)
            if (s->tinker->models[k].live && s->tinker->models[k].uid == j->uid) m = &s->tinker->models[k];
        if (m != NULL) {
            m->live = false;
            fail_held_(s, m, "user", "the model's create_model failed");
        }
    }
    if (status != 200) {
        char msg[1200];
        snprintf(msg, sizeof msg, "%s", j->err_msg[0] != '\0' ? j->err_msg : "request failed");
        serve_utf8_fix(msg);
        result = failure_(status >= 500 ? "server" : "user", "%s", msg);
    } else if (j->op == OP_CREATE) { /* CreateModelResponse: the model_id the payload carries */
        result = serve_dump(json_pack("{s:s,s:s}", "model_id", (const char *)j->payload + sizeof(create_payload),
                                      "type", "create_model"));
    } else if (j->op == OP_UNLOAD) { /* UnloadModelResponse */
        result = serve_dump(json_pack("{s:s}", "type", "unload_model"));
    } else if ((j->op == OP_FWDBWD || j->op == OP_FORWARD) && j->fwd != NULL) {
        keep_typed_(j); /* the poll encodes it in the format it asks for */
        return;
    } else if (j->op == OP_OPTIM && j->has_optim) {
        /* OptimStepResponse is {"metrics": {...}}: zdp's extra fields left out. */
        result = serve_optim_result_json(&j->optim, true);
    } else if (j->op == OP_SAMPLE_FILE && j->sample != NULL) {
        keep_typed_(j); /* like a ForwardBackwardOutput */
        return;
    } else if (j->saved != NULL) {
        /* A save or load, kept typed until a poll encodes it.
         * save_weights_for_sampler without a name opens a sampling session on
         * the file (save_weights_and_get_sampling_client). */
        serve_save_result *r = j->saved;
        if ((j->op == OP_SAVE_STATE || j->op == OP_SAVE_WEIGHTS) && j->tinker_path != NULL)
            tinker_runs_set_expiry(s, j->tinker_path, j->expires);
        if (j->sampling_session != NULL && !add_sampler_(s->tinker, j->sampling_session, r->path)) {
            result = failure_("server", "out of memory");
        } else {
            r->name = j->tinker_path;
            r->session = j->sampling_session;
            j->tinker_path = j->sampling_session = NULL;
            keep_typed_(j);
            return;
        }
    } else {
        result = failure_("server", "%s finished without its result (a bug in zdp)", serve_ops[j->op].name);
    }
    if (result == NULL) result = failure_("server", "out of memory");
    complete_(j->fut, result);
    j->fut = NULL;
    serve_job_free(j);
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
static void model_dir_(const char *model_id, char *out, size_t cap) {
    size_t k = 0;
    for (const char *p = model_id; *p && k + 1 < cap; p++) {
        char ch = *p;
        bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                  ch == '-';
        out[k++] = ok ? ch : '_';
    }
    out[k] = '\0';
}

/* ---- request parsing ------------------------------------------------------------------- */

/* The envelope's checks, the same for JSON and protobuf: model_id a
 * non-empty string under 160 bytes (NULL: not a string; given: sent at all). */
static bool check_model_id_(bool given, const char *m, size_t len, verr *e) {
    if (m == NULL || len == 0 || len >= 160)
        return serve_bad(e, 400, "model_id", "model_id: %s; send the model_id create_model returned",
                         given ? "must be a non-empty string" : "missing");
    return true;
}

/* seq_id in [1, SERVE_MAX_SEQ_ID]: bounded, so the next one due, seq_id + 1,
 * neither overflows nor rounds. */
static bool check_seq_id_(int64_t seq, verr *e) {
    if (seq < 1 || seq > SERVE_MAX_SEQ_ID)
        return serve_bad(e, 400, "seq_id", "seq_id = %lld: must be in [1, 2^53 - 1]; the SDK numbers a "
                         "model's requests 1, 2, 3, ...", (long long)seq);
    return true;
}

/* model_id (a string) and seq_id (an integer >= 1) of a training verb. */
static bool envelope_(const json_t *root, const char **model_id, int64_t *seq, bool need_seq, verr *e) {
    const json_t *m = json_object_get(root, "model_id");
    if (!check_model_id_(m != NULL, json_string_value(m), json_string_length(m), e)) return false;
    *model_id = json_string_value(m);
    *seq = 0;
    const json_t *q = json_object_get(root, "seq_id");
    if (!need_seq) return true;
    if (!json_is_integer(q))
        return serve_bad(e, 400, "seq_id", "seq_id: %s; the SDK numbers a model's requests 1, 2, 3, ...",
                         q ? "must be an integer >= 1" : "missing");
    if (!check_seq_id_((int64_t)json_integer_value(q), e)) return false;
    *seq = (int64_t)json_integer_value(q);
    return true;
}

/* Builds the job of a training verb from its body; false with e set when the
 * request is refused (its seq_id is still used up). */
static bool build_job_(server *s, const char *verb, const json_t *root, const char *model_id, job *j,
                       verr *e) {
    char dir[PATH_MAX + 4096], path[PATH_MAX + 4096], rel[600], mdir[160];
    if (!strcmp(verb, "forward_backward") || !strcmp(verb, "forward")) {
        const bool bwd = !strcmp(verb, "forward_backward");
        const char *key = bwd ? "forward_backward_input" : "forward_input";
        j->op = bwd ? OP_FWDBWD : OP_FORWARD;
        const json_t *in = json_object_get(root, key);
        if (!json_is_object(in))
            return serve_bad(e, 400, key, "%s: %s; must be {data, loss_fn, loss_fn_config}", key,
                             in ? "not an object" : "missing");
        return serve_parse_fwd(in, key, &s->model, j, e);
    }
    if (!strcmp(verb, "optim_step")) {
        j->op = OP_OPTIM;
        const json_t *ap = json_object_get(root, "adam_params");
        if (!json_is_object(ap))
            return serve_bad(e, 400, "adam_params", "adam_params: %s; must be {learning_rate, beta1, beta2, "
                             "eps, weight_decay, grad_clip_norm}", ap ? "not an object" : "missing");
        return serve_parse_optim(ap, "adam_params", true, j, e);
    }
    model_dir_(model_id, mdir, sizeof mdir);
    const json_t *p = json_object_get(root, "path");
    if (!strcmp(verb, "save_weights") || !strcmp(verb, "save_weights_for_sampler")) {
        const bool sampler = !strcmp(verb, "save_weights_for_sampler");
        char auto_name[64];
        if (sampler && (p == NULL || json_is_null(p))) {
            /* save_weights_and_get_sampling_client: a name of ours, and a
             * sampling session on the file once it is written. */
            const long long seq = (long long)json_integer_value(json_object_get(root, "seq_id"));
            snprintf(auto_name, sizeof auto_name, "sampler-%lld", seq);
            char sid[256];
            snprintf(sid, sizeof sid, "%s:sample:%lld", model_id, seq);
            if ((j->sampling_session = strdup(sid)) == NULL) return serve_bad(e, 500, "path", "out of memory");
            p = NULL;
        }
        if (j->sampling_session == NULL && (!json_is_string(p) || !tinker_good_name(json_string_value(p))))
            return serve_bad(e, 400, "path", "path: must be a name of letters, digits, '.', '_' or '-' "
                             "(not starting with '.'), got %s", p ? zdp_json_type_name(p) : "nothing");
        const char *name = j->sampling_session != NULL ? auto_name : json_string_value(p);
        /* ttl_seconds: the checkpoint is removed that long after it was
         * written (tinker/runs.c); null or absent: kept until deleted. */
        const json_t *ttl = json_object_get(root, "ttl_seconds");
        if (ttl != NULL && !json_is_null(ttl) && (!json_is_integer(ttl) || json_integer_value(ttl) < 1 ||
                                                  json_integer_value(ttl) > 100LL * 365 * 86400))
            return serve_bad(e, 400, "ttl_seconds", "ttl_seconds: must be null or an integer of seconds in "
                             "[1, 100 years], got %s", json_is_integer(ttl) ? "an integer out of range"
                                                                            : zdp_json_type_name(ttl));
        j->expires = json_is_integer(ttl) ? (double)time(NULL) + (double)json_integer_value(ttl) : 0;
        /* Inside --checkpoint-dir, even through a symbolic link placed there. */
        /* A LoRA model's sampler weights are a PEFT adapter folder (docs/lora.md). */
        if (sampler ? !tinker_sampler_rel(s, mdir, name, rel, sizeof rel)
                    : snprintf(rel, sizeof rel, "%s/%s", mdir, name) >= (int)sizeof rel)
            return serve_bad(e, 400, "path", "path: too long");
        if (!serve_resolve_path(s, "path", rel, path, sizeof path, e)) return false;
        /* save_state(name, overwrite=False), the SDK's default: a name
         * that exists is refused, never silently replaced. */
        const json_t *ow = json_object_get(root, "overwrite");
        if (ow != NULL && !json_is_boolean(ow))
            return serve_bad(e, 400, "overwrite", "overwrite: must be a boolean, got %s", zdp_json_type_name(ow));
        struct stat sb;
        if (!sampler && !json_is_true(ow) && stat(path, &sb) == 0)
            return serve_bad(e, 400, "overwrite", "path \"%s\": model %s already has a checkpoint of that "
                             "name; pass overwrite=True to replace it, or choose another name", name, model_id);
        snprintf(dir, sizeof dir, "%s", path);
        *strrchr(dir, '/') = '\0';
        if (serve_mkdirs(dir) != 0)
            return serve_bad(e, 500, "path", "cannot create %s: %s (--checkpoint-dir)", dir, strerror(errno));
        j->op = sampler ? OP_SAVE_WEIGHTS : OP_SAVE_STATE;
        char tp[600];
        snprintf(tp, sizeof tp, "tinker://%s/%s/%s", model_id, sampler ? "sampler_weights" : "weights", name);
        if ((j->tinker_path = strdup(tp)) == NULL) return serve_bad(e, 500, "path", "out of memory");
        return serve_set_path(s, j, path, e);
    }
    if (!strcmp(verb, "load_weights")) {
        /* tinker://MODEL_ID/weights/NAME, as save_weights answered. */
        const char *pre = "tinker://";
        if (!json_is_string(p) || strncmp(json_string_value(p), pre, strlen(pre)) != 0)
            return serve_bad(e, 400, "path", "path: must be a tinker://MODEL_ID/weights/NAME path that "
                             "save_weights returned");
        const char *v = json_string_value(p) + strlen(pre);
        const char *mark = strstr(v, "/weights/");
        if (mark == NULL || mark == v || !tinker_good_name(mark + 9) || (size_t)(mark - v) >= 160)
            return serve_bad(e, 400, "path", "path = \"%s\": must be tinker://MODEL_ID/weights/NAME "
                             "(sampler weights cannot be loaded for training)", json_string_value(p));
        char owner[160], odir[160];
        snprintf(owner, sizeof owner, "%.*s", (int)(mark - v), v);
        model_dir_(owner, odir, sizeof odir);
        const json_t *opt = json_object_get(root, "optimizer");
        if (opt != NULL && !json_is_boolean(opt))
            return serve_bad(e, 400, "optimizer", "optimizer: must be a boolean, got %s", zdp_json_type_name(opt));
        const bool with_opt = opt == NULL || json_is_true(opt);
        j->op = with_opt ? OP_LOAD_STATE : OP_LOAD_WEIGHTS;
        snprintf(rel, sizeof rel, "%s/%s%s", odir, mark + 9, with_opt ? "" : "/model.safetensors");
        if (!serve_resolve_path(s, "path", rel, path, sizeof path, e)) return false;
        if ((j->tinker_path = strdup(json_string_value(p))) == NULL)
            return serve_bad(e, 500, "path", "out of memory");
        return serve_set_path(s, j, path, e);
    }
    return serve_bad(e, 404, "url", "%s: not a training verb (a bug in zdp)", verb);
}

/* A built job (valid: else refused with why) onto model_id's order: its
 * future, or a retry's first one. */
static int queue_job_(server *s, const char *model_id, int64_t seq, job *j, bool valid, const verr *why,
                      const char *idem, bool proto, tinker_ticket *out, verr *e) {
    tinker_state *t = s->tinker;
    pthread_mutex_lock(&s->mu);
    future *f = find_retry_(t, idem, model_id, seq);
    if (f != NULL) { /* a retry: the first one's answer */
        ticket_(f, out);
        pthread_mutex_unlock(&s->mu);
        serve_job_free(j);
        return 200;
    }
    if (s->closed) {
        pthread_mutex_unlock(&s->mu);
        serve_job_free(j);
        return serve_bad(e, 503, "", "the server is shutting down"), 503;
    }
    /* Routed by model_id: an unknown or unloaded one is refused at once,
     * 400 naming it (and why it is gone). */
    tinker_model *m = find_model_(t, model_id);
    if (m == NULL) {
        not_live_(t, model_id, e);
        pthread_mutex_unlock(&s->mu);
        serve_job_free(j);
        return e->status;
    }
    f = new_future_(t, idem, model_id, seq);
    if (f == NULL) {
        pthread_mutex_unlock(&s->mu);
        serve_job_free(j);
        return serve_bad(e, 500, "", "out of memory"), 500;
    }
    f->proto = proto;
    if (seq < m->next_seq) {
        complete_(f, failure_("user", "seq_id %lld of model %s arrived after seq_id %lld had run "
                              "(it was missing for more than --seq-gap-seconds = %g s); it was not applied",
                              (long long)seq, model_id, (long long)m->next_seq - 1, s->opt.seq_gap_s));
        serve_job_free(j);
    } else {
        touch_model_session_(t, m);
        j->slot = m->slot;
        j->uid = m->uid;
        if (!valid) {
            /* Refused, but it keeps its place: later seq_ids wait for it. */
            complete_(f, failure_(why->status >= 500 ? "server" : "user", "%s", why->msg));
            free(j->payload);
            j->payload = NULL;
            j->nbytes = 0;
            j->op = OP_NOOP;
        } else {
            j->fut = f;
        }
        j->seq_id = seq;
        j->arrived = serve_now();
        hold_(s, m, j);
    }
    pthread_cond_broadcast(&s->cv_done);
    ticket_(f, out);
    pthread_mutex_unlock(&s->mu);
    return 200;
}

/* POST forward_backward, forward, optim_step, save_weights,
 * save_weights_for_sampler, load_weights: answered with a future. */
int tinker_submit(server *s, const char *verb, const json_t *root, const char *idem, bool proto,
                  tinker_ticket *out, verr *e) {
    const char *model_id;
    int64_t seq;
    if (!envelope_(root, &model_id, &seq, true, e)) return e->status;

    /* Validate outside the lock: parsing a large body must not stall others. */
    job *j = calloc(1, sizeof *j);
    if (j == NULL) return serve_bad(e, 500, "", "out of memory"), 500;
    verr why = {0};
    const bool valid = build_job_(s, verb, root, model_id, j, &why);
    return queue_job_(s, model_id, seq, j, valid, &why, idem, proto, out, e);
}

int tinker_submit_proto(server *s, const serve_proto_fwdbwd *rq, bool forward, const char *idem,
                        tinker_ticket *out, verr *e) {
    if (!check_model_id_(true, rq->model_id, strlen(rq->model_id), e) || !check_seq_id_(rq->seq_id, e))
        return e->status;
    job *j = calloc(1, sizeof *j);
    if (j == NULL) return serve_bad(e, 500, "", "out of memory"), 500;
    j->op = forward ? OP_FORWARD : OP_FWDBWD;
    verr why = {0};
    const bool valid = serve_fwd_build(&rq->in, forward ? "forward_input" : "forward_backward_input",
                                       s->model.vocab_size, s->model.block_size, j, &why);
    return queue_job_(s, rq->model_id, rq->seq_id, j, valid, &why, idem, true, out, e);
}

/* A submitted request's answer: its future's id (and model_id). */
static enum MHD_Result reply_ticket_(struct MHD_Connection *c, const tinker_ticket *tk) {
    return reply_json_(c, 200, json_pack("{s:s,s:s*}", "request_id", tk->id, "model_id",
                                         tk->model_id[0] ? tk->model_id : NULL));
}

/* forward_backward, forward, optim_step, save_weights,
 * save_weights_for_sampler, load_weights over HTTP. */
static enum MHD_Result submit_(server *s, struct MHD_Connection *c, const char *verb, const json_t *root,
                               const char *idem, bool proto) {
    tinker_ticket tk;
    verr e = {0};
    const int st = tinker_submit(s, verb, root, idem, proto, &tk, &e);
    if (st != 200) return reply_err_(c, st, e.field[0] ? e.field : NULL, "%s", e.msg);
    return reply_ticket_(c, &tk);
}

/* lora_config (Tinker's LoraConfig: rank, seed, train_mlp, train_attn,
 * train_unembed; and zdp's alpha, PEFT's lora_alpha, default 32) -> *lc;
 * rank 0 (or no lora_config): a full fine-tune.  false with e set. */
static bool parse_lora_(const json_t *lora, zdp_lora_config *lc, bool *seeded, verr *e) {
    *lc = (zdp_lora_config){.targets = ZDP_LORA_ALL};
    *seeded = false;
    if (lora == NULL || json_is_null(lora)) return true;
    if (!json_is_object(lora)) return serve_bad(e, 400, "lora_config", "lora_config: must be an object");
    static const char *const keys[] = {"rank", "seed", "train_mlp", "train_attn", "train_unembed", "alpha"};
    if (!serve_only_keys(lora, "lora_config", keys, 6, e)) return false;
    const json_t *r = json_object_get(lora, "rank");
    if (r != NULL && (!json_is_integer(r) || json_integer_value(r) < 0 || json_integer_value(r) > 65536))
        return serve_bad(e, 400, "lora_config.rank", "lora_config.rank: must be an integer in [0, 65536], got %s",
                         json_is_integer(r) ? "an integer out of range" : zdp_json_type_name(r));
    lc->rank = r != NULL ? (int)json_integer_value(r) : 0;
    const json_t *sd = json_object_get(lora, "seed");
    if (sd != NULL && !json_is_null(sd) && (!json_is_integer(sd) || json_integer_value(sd) < 0))
        return serve_bad(e, 400, "lora_config.seed", "lora_config.seed: must be null or an integer >= 0");
    if (json_is_integer(sd)) {
        lc->seed = (uint64_t)json_integer_value(sd);
        *seeded = true;
    }
    static const char *const flags[3] = {"train_attn", "train_mlp", "train_unembed"};
    static const int bits[3] = {ZDP_LORA_ATTN, ZDP_LORA_MLP, ZDP_LORA_UNEMBED};
    for (int k = 0; k < 3; k++) {
        const json_t *v = json_object_get(lora, flags[k]);
        char field[64];
        snprintf(field, sizeof field, "lora_config.%s", flags[k]);
        if (v != NULL && !json_is_boolean(v))
            return serve_bad(e, 400, field, "%s: must be true or false, got %s", field, zdp_json_type_name(v));
        if (json_is_false(v)) lc->targets &= ~bits[k];
    }
    const json_t *al = json_object_get(lora, "alpha");
    if (al != NULL && !json_is_null(al) && (!json_is_number(al) || !(json_number_value(al) > 0) ||
                                            json_number_value(al) > 1e6))
        return serve_bad(e, 400, "lora_config.alpha", "lora_config.alpha: must be a number in (0, 1e6] "
                         "(PEFT's lora_alpha; default %g)", (double)ZDP_LORA_DEFAULT_ALPHA);
    if (json_is_number(al)) lc->alpha = (float)json_number_value(al);
    if (lc->rank > 0 && lc->targets == 0)
        return serve_bad(e, 400, "lora_config", "lora_config: train_attn, train_mlp and train_unembed are all "
                         "false, so nothing would train; set at least one");
    return true;
}

/* The model_ids of the live models, for a message ("s1:train:0, s2:train:0"). */
static void live_names_(const tinker_state *t, char *out, size_t cap) {
    size_t n = 0;
    out[0] = '\0';
    for (int k = 0; k < t->n_models && n < cap; k++)
        if (t->models[k].live)
            n += (size_t)snprintf(out + n, cap - n, "%s%s", n ? ", " : "", t->models[k].model_id);
}

/* POST create_model.  LoRA (the default): a new model in a free slot, fresh
 * adapters and optimizer, created by an all-rank job (the future answers
 * when it ran).  --full-finetune: the one model; it attaches to the
 * server's training state.  A request of the other kind is a 400 naming
 * lora_config.rank and the flag. */
static enum MHD_Result create_model_(server *s, struct MHD_Connection *c, const json_t *root,
                                     const char *idem) {
    tinker_state *t = s->tinker;
    const json_t *sid = json_object_get(root, "session_id");
    const json_t *seq = json_object_get(root, "model_seq_id");
    const json_t *base = json_object_get(root, "base_model");
    if (!json_is_string(sid)) return reply_err_(c, 400, "session_id", "session_id: missing or not a string");
    if (seq != NULL && !json_is_integer(seq))
        return reply_err_(c, 400, "model_seq_id", "model_seq_id: must be an integer");
    zdp_lora_config lc;
    bool seeded;
    verr e = {0};
    if (!parse_lora_(json_object_get(root, "lora_config"), &lc, &seeded, &e))
        return reply_err_(c, e.status, e.field, "%s", e.msg);
    if (!serve_lora(s) && lc.rank > 0)
        return reply_err_(c, 400, "lora_config.rank", "lora_config.rank = %d: this server trains every weight of "
                          "one model (--full-finetune), not LoRA adapters; send rank 0 (no lora_config) for a "
                          "full fine-tune, or restart zdp serve without --full-finetune to train LoRA models",
                          lc.rank);
    if (serve_lora(s) && lc.rank == 0)
        return reply_err_(c, 400, "lora_config.rank", "lora_config.rank = 0 (or no lora_config) asks for a full "
                          "fine-tune, but this server trains LoRA models over a frozen base; send a rank >= 1, "
                          "or restart zdp serve with --full-finetune to train every weight");
    if (serve_lora(s) && s->base != NULL) {
        /* The library's own check (a rank larger than a targeted linear's
         * dimensions), answered at once: zdp_lora_create only reads the
         * base's shape, so a probe here is safe beside a running job. */
        zdp_model probe;
        zdp_error err;
        if (zdp_lora_create(&s->model, (const float *const *)s->base, &lc, &probe, &err) != ZDP_OK) {
            const char *field = strstr(err.msg, "rank =") != NULL ? "lora_config.rank" : "lora_config";
            return reply_err_(c, err.code == ZDP_ERR_NOMEM ? 500 : 400, field, "%s: %s; nothing was created",
                              field, err.msg);
        }
        zdp_lora_destroy(&probe);
    }
    pthread_mutex_lock(&s->mu);
    future *f = find_retry_(t, idem, "", 0);
    if (f != NULL) {
        enum MHD_Result r = reply_future_(c, f);
        pthread_mutex_unlock(&s->mu);
        return r;
    }
    char model_id[160];
    snprintf(model_id, sizeof model_id, "%s:train:%lld", json_string_value(sid),
             seq ? (long long)json_integer_value(seq) : 0LL);
    session *x = find_session_(t, json_string_value(sid));
    const double now = serve_now();
    /* LoRA: a new model needs a free slot; refused at once (400: no retry
     * would help until a model is unloaded). */
    int slot = -1;
    for (int k = 0; serve_lora(s) && k < t->n_models && slot < 0; k++)
        if (!t->models[k].live) slot = k;
    if (serve_lora(s) && x != NULL && find_model_(t, model_id) == NULL && slot < 0) {
        char names[1024];
        live_names_(t, names, sizeof names);
        enum MHD_Result r = reply_err_(c, 400, "--max-models", "create_model: this server holds at most %d "
                                       "models (--max-models %d) and %d are live (%s); unload_model one, let "
                                       "its session end (a model whose session is silent for "
                                       "--model-idle-timeout-seconds %g is unloaded), or restart with a larger "
                                       "--max-models", t->n_models, t->n_models, live_models_(t), names,
                                       s->opt.model_idle_timeout_s);
        pthread_mutex_unlock(&s->mu);
        return r;
    }
    f = new_future_(t, idem, "", 0);
    if (f == NULL) {
        pthread_mutex_unlock(&s->mu);
        return reply_err_(c, 500, NULL, "out of memory");
    }
    tinker_model *m0 = &t->models[0];
    const session *owner = !serve_lora(s) && m0->live ? find_session_(t, m0->session) : NULL;
    if (x == NULL) {
        complete_(f, failure_("user", "session_id \"%s\": unknown; call create_session first",
                              json_string_value(sid)));
    } else if (!json_is_string(base) || strcmp(json_string_value(base), s->opt.model_name) != 0) {
        complete_(f, failure_("user", "base_model %s%s%s: this server trains \"%s\" (--model-name)",
                              json_is_string(base) ? "\"" : "", json_is_string(base) ? json_string_value(base)
                                                                                     : "(missing)",
                              json_is_string(base) ? "\"" : "", s->opt.model_name));
    } else if (serve_lora(s)) {
        x->seen = now;
        if (find_model_(t, model_id) != NULL) { /* the same model again: a retry under a new key */
            complete_(f, serve_dump(json_pack("{s:s,s:s}", "model_id", model_id, "type", "create_model")));
        } else {
            char mdir[160], why[PATH_MAX + 200];
            model_dir_(model_id, mdir, sizeof mdir);
            if (!seeded) /* LoraConfig.seed None: a random seed, as Tinker's */
                lc.seed = zdp_splitmix64(&(uint64_t){(uint64_t)(now * 1e6) ^ (uint64_t)t->n_uids});
            job *j = calloc(1, sizeof *j);
            serve_bytes b = {0};
            const create_payload p = {.uid = t->n_uids + 1, .slot = slot, .rank = lc.rank, .targets = lc.targets,
                                      .alpha = lc.alpha != 0 ? lc.alpha : ZDP_LORA_DEFAULT_ALPHA, .seed = lc.seed};
            if (j == NULL || !serve_put(&b, &p, sizeof p) || !serve_put(&b, model_id, strlen(model_id) + 1)) {
                free(j);
                free(b.p);
                complete_(f, failure_("server", "out of memory"));
            } else {
                tinker_model *m = &t->models[slot];
                *m = (tinker_model){.live = true, .slot = slot, .uid = ++t->n_uids, .lc = lc, .next_seq = 1};
                m->lc.alpha = (float)p.alpha;
                snprintf(m->model_id, sizeof m->model_id, "%s", model_id);
                snprintf(m->session, sizeof m->session, "%s", json_string_value(sid));
                if (!tinker_runs_record(s, model_id, mdir, &m->lc, why, sizeof why))
                    fprintf(stderr, "zdp serve: %s: list_training_runs will not show %s\n", why, model_id);
                *j = (job){.op = OP_CREATE, .payload = b.p, .nbytes = (int64_t)b.len, .slot = slot,
                           .uid = m->uid, .fut = f};
                serve_enqueue_locked(s, j);
            }
        }
    } else if (m0->live && strcmp(m0->model_id, model_id) != 0 && owner != NULL &&
               now - owner->seen < SESSION_TIMEOUT_S) {
        complete_(f, failure_("user", "model %s of a live session is training on this server, which holds "
                              "one model (--full-finetune); unload_model it, or end that session (a session "
                              "without heartbeats for %g s ends)", m0->model_id, SESSION_TIMEOUT_S));
    } else {
        x->seen = now;
        if (m0->live && strcmp(m0->model_id, model_id) != 0) {
            fprintf(stderr, "zdp serve: model %s (its session went silent) is replaced by %s\n", m0->model_id,
                    model_id);
            fail_held_(s, m0, "user", "the model was replaced by a newer create_model");
            tinker_gone *g = &t->gone[t->n_gone++ % MAX_GONE];
            snprintf(g->model_id, sizeof g->model_id, "%s", m0->model_id);
            snprintf(g->why, sizeof g->why, "replaced by %s (a create_model after its session went silent; "
                     "--full-finetune holds one model)", model_id);
        }
        char mdir[160], why[PATH_MAX + 200];
        model_dir_(model_id, mdir, sizeof mdir);
        if (!tinker_runs_record(s, model_id, mdir, NULL, why, sizeof why))
            fprintf(stderr, "zdp serve: %s: list_training_runs will not show %s\n", why, model_id);
        if (!m0->live || strcmp(m0->model_id, model_id) != 0) {
            *m0 = (tinker_model){.live = true, .slot = 0, .uid = s->slots != NULL ? s->slots[0].uid : 1,
                                 .next_seq = 1};
            snprintf(m0->model_id, sizeof m0->model_id, "%s", model_id);
            snprintf(m0->session, sizeof m0->session, "%s", json_string_value(sid));
        }
        zdp_engine *eng = s->slots != NULL ? s->slots[0].eng : NULL;
        fprintf(stderr,
                "zdp serve: create_model -> %s: every parameter trains (--full-finetune); it continues from the "
                "server's current weights and optimizer state (step %lld, %lld backward passes pending)\n",
                model_id, eng ? (long long)zdp_engine_global_steps(eng) : 0LL,
                eng ? (long long)zdp_engine_pending_backwards(eng) : 0LL);
        complete_(f, serve_dump(json_pack("{s:s,s:s}", "model_id", model_id, "type", "create_model")));
    }
    enum MHD_Result r = reply_future_(c, f);
    pthread_mutex_unlock(&s->mu);
    return r;
}

/* A binary body (buf is malloc'd; taken). */
static enum MHD_Result reply_bytes_(struct MHD_Connection *c, int status, unsigned char *buf, size_t len,
                                    const char *content_type) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, buf, MHD_RESPMEM_MUST_FREE);
    if (r == NULL) {
        free(buf);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", content_type);
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

/* A protobuf answer (takes pb), or, when encoding failed (pb NULL), the
 * failure that says which message could not be encoded and why. */
static enum MHD_Result reply_proto_(struct MHD_Connection *c, unsigned char *pb, size_t len, const char *what,
                                    char *err) {
    if (pb == NULL) {
        serve_utf8_fix(err);
        return serve_reply(c, 200, failure_("server", "cannot encode the %s as protobuf: %s", what, err));
    }
    return reply_bytes_(c, 200, pb, len, SERVE_PROTO_CONTENT_TYPE);
}

/* A finished ForwardBackwardOutput or SampleResponse -> its protobuf
 * encoding; anything else (an error, another verb's result) stays JSON.
 * Takes body. */
static enum MHD_Result reply_result_(struct MHD_Connection *c, char *body, bool proto) {
    if (!proto) return serve_reply(c, 200, body);
    json_t *o = json_loads(body, 0, NULL);
    const bool sample = json_is_array(json_object_get(o, "sequences"));
    if (!sample && !json_is_array(json_object_get(o, "loss_fn_outputs"))) {
        json_decref(o);
        return serve_reply(c, 200, body);
    }
    char err[512];
    size_t len;
    unsigned char *pb = sample ? serve_proto_encode_sample_response(o, &len, err, sizeof err)
                               : serve_proto_encode_fwdbwd_output(o, &len, err, sizeof err);
    json_decref(o);
    free(body);
    return reply_proto_(c, pb, len, sample ? "SampleResponse" : "ForwardBackwardOutput", err);
}

/* A ForwardBackwardOutput, encoded once: protobuf when the poll asks (and
 * the request came as protobuf), else JSON.  Takes r. */
static enum MHD_Result reply_fwd_(struct MHD_Connection *c, serve_fwd_result *r, bool proto) {
    if (!proto) {
        char *body = serve_fwd_result_json(r);
        serve_fwd_result_free(r);
        return serve_reply(c, 200, body);
    }
    static const char *const names[2] = {"logprobs", "elementwise_loss"};
    static const char *const metric[1] = {"loss:sum"};
    const float *const values[2] = {r->logprobs, r->elementwise};
    char err[512];
    size_t len;
    unsigned char *pb = serve_proto_encode_fwdbwd_typed("ArrayRecord", r->n, r->off, 2, names, values, 1,
                                                        metric, &r->loss_sum, &len, err, sizeof err);
    serve_fwd_result_free(r);
    return reply_proto_(c, pb, len, "ForwardBackwardOutput", err);
}

char *tinker_save_result_json(const serve_save_result *r) {
    const char *type = r->op == OP_SAVE_STATE     ? "save_weights"
                       : r->op == OP_SAVE_WEIGHTS ? "save_weights_for_sampler"
                                                  : "load_weights";
    return serve_dump(json_pack("{s:s,s:s,s:s*}", "path", r->name != NULL ? r->name : "", "type", type,
                                "sampling_session_id", r->session));
}

/* A SampleResponse, encoded once: protobuf when the poll asks, else JSON.
 * Takes r. */
static enum MHD_Result reply_sample_(struct MHD_Connection *c, serve_sample_result *r, bool proto) {
    if (!proto) {
        char *body = serve_sample_result_json(r);
        serve_sample_result_free(r);
        return body != NULL ? serve_reply(c, 200, body) : reply_err_(c, 500, NULL, "out of memory");
    }
    char err[512];
    size_t len;
    unsigned char *pb = serve_proto_encode_sample_typed(r->n, r->off, r->tokens, r->logprobs, r->stopped,
                                                        r->prompt_logprobs, r->n_prompt_logprobs, r->topk_k,
                                                        r->n_topk, r->topk_ids, r->topk_logprobs, &len, err,
                                                        sizeof err);
    serve_sample_result_free(r);
    return reply_proto_(c, pb, len, "SampleResponse", err);
}

/* POST retrieve_future: the result, or try_again after the long poll. */
static enum MHD_Result retrieve_(server *s, struct MHD_Connection *c, const json_t *root) {
    const json_t *id = json_object_get(root, "request_id");
    if (!json_is_string(id)) return reply_err_(c, 400, "request_id", "request_id: missing or not a string");
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    double secs = floor(s->opt.long_poll_s);
    until.tv_sec += (time_t)secs;
    until.tv_nsec += (long)((s->opt.long_poll_s - secs) * 1e9);
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&s->mu);
    future *f = find_future_(s->tinker, json_string_value(id));
    if (f == NULL) {
        pthread_mutex_unlock(&s->mu);
        return reply_json_(c, 200, json_pack("{s:s,s:s}", "error",
                                             "request_id is unknown to this server (results are kept for an "
                                             "hour, and not across restarts)", "category", "user"));
    }
    int rc = 0;
    while (!f->done && !s->closed && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&s->cv_done, &s->mu, &until);
    /* Copied under the lock, encoded outside it. */
    serve_fwd_result *fwd = f->done && f->fwd != NULL ? serve_fwd_result_copy(f->fwd) : NULL;
    serve_sample_result *samp = f->done && f->samp != NULL ? serve_sample_result_copy(f->samp) : NULL;
    serve_save_result *saved = f->done && f->saved != NULL ? serve_save_result_copy(f->saved) : NULL;
    char *body = f->done && f->fwd == NULL && f->samp == NULL && f->saved == NULL ? strdup(f->result) : NULL;
    if (f->done && f->read_at == 0) f->read_at = serve_now();
    const bool closed = s->closed;
    /* Protobuf only for a request that came as protobuf (SDK 0.25) and a
     * poll that asks for it. */
    const char *accept = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Accept");
    /* A SampleResponse also when only the poll asks: SDKs ask for protobuf
     * only for the result types they can decode (sample requests are JSON
     * even in 0.25). */
    const bool proto = (f->proto || f->sample) && accept != NULL && serve_names_type(accept, SERVE_PROTO_CONTENT_TYPE);
    const bool done = f->done;
    pthread_mutex_unlock(&s->mu);
    if (fwd != NULL) return reply_fwd_(c, fwd, proto);
    if (samp != NULL) return reply_sample_(c, samp, proto);
    if (saved != NULL) { /* JSON whatever the Accept: no SDK reads these as protobuf */
        body = tinker_save_result_json(saved);
        serve_save_result_free(saved);
        return body != NULL ? serve_reply(c, 200, body) : reply_err_(c, 500, NULL, "out of memory");
    }
    if (done && body == NULL) return reply_err_(c, 500, NULL, "out of memory");
    if (body != NULL) return reply_result_(c, body, proto);
    if (closed) return reply_err_(c, 503, NULL, "the server is shutting down");
    return reply_json_(c, 200, json_pack("{s:s,s:s,s:s}", "type", "try_again", "request_id",
                                         json_string_value(id), "queue_state", "active"));
}

/* ---- sampling (create_sampling_session, asample) --------------------------------------- */

/* The weights file behind a tinker:// path: .../sampler_weights/NAME is a
 * sampler file, .../weights/NAME a checkpoint's model.safetensors. */
static bool weights_file_(const server *s, const char *tinker_path, char *out, size_t cap, verr *e,
                          const char *field) {
    const char *pre = "tinker://", *v = tinker_path + strlen(pre);
    const char *kinds[2] = {"/sampler_weights/", "/weights/"};
    if (strncmp(tinker_path, pre, strlen(pre)) != 0)
        return serve_bad(e, 400, field, "%s = \"%s\": must be a tinker:// path that save_weights_for_sampler "
                         "or save_weights returned", field, tinker_path);
    for (int k = 0; k < 2; k++) {
        const char *mark = strstr(v, kinds[k]);
        if (mark == NULL || mark == v || (size_t)(mark - v) >= 160) continue;
        const char *name = mark + strlen(kinds[k]);
        if (!tinker_good_name(name)) break;
        char owner[160], odir[160];
        snprintf(owner, sizeof owner, "%.*s", (int)(mark - v), v);
        model_dir_(owner, odir, sizeof odir);
        char rel[600];
        if (k == 0 ? !tinker_sampler_rel(s, odir, name, rel, sizeof rel)
                   : snprintf(rel, sizeof rel, "%s/%s/model.safetensors", odir, name) >= (int)sizeof rel)
            return serve_bad(e, 400, field, "%s: too long", field);
        if (!serve_resolve_path(s, field, rel, out, cap, e)) return false;
        struct stat sb;
        if (stat(out, &sb) != 0)
            return serve_bad(e, 400, field, "%s = \"%s\": no weights at %s", field, tinker_path, out);
        return true;
    }
    return serve_bad(e, 400, field, "%s = \"%s\": must be tinker://MODEL_ID/sampler_weights/NAME or "
                     "tinker://MODEL_ID/weights/NAME", field, tinker_path);
}

/* base_model: the weights the server started from (--init). */
static bool base_file_(const server *s, const json_t *base, char *out, size_t cap, verr *e) {
    if (!json_is_string(base) || strcmp(json_string_value(base), s->opt.model_name) != 0)
        return serve_bad(e, 400, "base_model", "base_model: this server serves \"%s\" (--model-name)",
                         s->opt.model_name);
    if (s->opt.lm.base_weights == NULL)
        return serve_bad(e, 400, "base_model", "base_model: the server started from a seeded initialisation, "
                         "not a weights file (no --init), so there is nothing to sample from; save the "
                         "weights with save_weights_for_sampler and sample from that path");
    snprintf(out, cap, "%s", s->opt.lm.base_weights);
    return true;
}

/* POST create_sampling_session {session_id, sampling_session_seq_id,
 * model_path | base_model}: a direct answer. */
static enum MHD_Result create_sampling_session_(server *s, struct MHD_Connection *c, const json_t *root) {
    const json_t *sid = json_object_get(root, "session_id"), *seq = json_object_get(root, "sampling_session_seq_id");
    const json_t *mp = json_object_get(root, "model_path"), *base = json_object_get(root, "base_model");
    if (!json_is_string(sid)) return reply_err_(c, 400, "session_id", "session_id: missing or not a string");
    if (seq != NULL && !json_is_integer(seq))
        return reply_err_(c, 400, "sampling_session_seq_id", "sampling_session_seq_id: must be an integer");
    char file[4400];
    verr e = {0};
    bool ok = json_is_string(mp) ? weights_file_(s, json_string_value(mp), file, sizeof file, &e, "model_path")
                                 : base_file_(s, base, file, sizeof file, &e);
    if (!ok) return reply_err_(c, e.status, e.field, "%s", e.msg);
    char id[128];
    snprintf(id, sizeof id, "%.60s:sample:%lld", json_string_value(sid), seq ? (long long)json_integer_value(seq) : 0LL);
    pthread_mutex_lock(&s->mu);
    ok = add_sampler_(s->tinker, id, file);
    pthread_mutex_unlock(&s->mu);
    if (!ok) return reply_err_(c, 500, NULL, "out of memory");
    return reply_json_(c, 200, json_pack("{s:s,s:s}", "sampling_session_id", id, "type", "create_sampling_session"));
}

/* asample's body -> an OP_SAMPLE_FILE job (file: the weights to read). */
static bool sample_job_(server *s, const json_t *root, const char *file, job *j, verr *e) {
    const int V = s->model.vocab_size;
    sample_file_header h = {.max_tokens = s->model.block_size, .num_samples = 1, .temperature = 1.0,
                            .top_p = 1.0};
    const json_t *ns = json_object_get(root, "num_samples");
    if (ns != NULL && !json_is_integer(ns))
        return serve_bad(e, 400, "num_samples", "num_samples: must be an integer in [1, %d]", s->opt.max_sample_batch);
    if (ns != NULL && (json_integer_value(ns) < 1 || json_integer_value(ns) > s->opt.max_sample_batch))
        return serve_bad(e, 400, "num_samples", "num_samples = %lld: must be in [1, %d], this server's "
                         "--max-sample-batch %d (the sequences its KV caches hold at once): send at most %d per "
                         "request", (long long)json_integer_value(ns), s->opt.max_sample_batch,
                         s->opt.max_sample_batch, s->opt.max_sample_batch);
    if (ns != NULL) h.num_samples = json_integer_value(ns);
    const json_t *pl = json_object_get(root, "prompt_logprobs");
    if (pl != NULL && !json_is_null(pl) && !json_is_boolean(pl))
        return serve_bad(e, 400, "prompt_logprobs", "prompt_logprobs: must be true or false");
    h.prompt_logprobs = json_is_true(pl); /* from the prefill pass (docs/sampling.md) */
    /* Top-k prompt logprobs, from the same prefill (docs/sampling.md). */
    const json_t *tkp = json_object_get(root, "topk_prompt_logprobs");
    const int max_k = V < SERVE_MAX_TOPK ? V : SERVE_MAX_TOPK;
    if (tkp != NULL && !json_is_null(tkp) &&
        (!json_is_integer(tkp) || json_integer_value(tkp) < 0 || json_integer_value(tkp) > max_k))
        return serve_bad(e, 400, "topk_prompt_logprobs", "topk_prompt_logprobs: must be an integer in [0, %d] "
                         "(the vocabulary, at most %d)", max_k, SERVE_MAX_TOPK);
    h.topk_prompt = json_is_integer(tkp) ? json_integer_value(tkp) : 0;
    static const char *const topk[] = {"topk_sample_logprobs", "prompt_alt_tokens_k"};
    for (int k = 0; k < 2; k++) {
        const json_t *v = json_object_get(root, topk[k]);
        if (v != NULL && !json_is_null(v) && !(json_is_integer(v) && json_integer_value(v) == 0))
            return serve_bad(e, 400, topk[k], "%s: top-k log-probabilities are not offered; send 0", topk[k]);
    }
    /* The prompt: a ModelInput of encoded_text chunks. */
    const json_t *chunks = json_object_get(json_object_get(root, "prompt"), "chunks");
    if (!json_is_array(chunks) || json_array_size(chunks) == 0)
        return serve_bad(e, 400, "prompt.chunks", "prompt.chunks: must be a non-empty array of encoded_text chunks");
    serve_bytes tokens = {0};
    for (size_t i = 0; i < json_array_size(chunks); i++) {
        const json_t *ch = json_array_get(chunks, i), *ty = json_object_get(ch, "type");
        const json_t *tk = json_object_get(ch, "tokens");
        char field[96];
        snprintf(field, sizeof field, "prompt.chunks[%zu]", i);
        if ((ty != NULL && (!json_is_string(ty) || strcmp(json_string_value(ty), "encoded_text") != 0)) ||
            !json_is_array(tk)) {
            free(tokens.p);
            return serve_bad(e, 400, field, "%s: only encoded_text chunks with tokens are supported", field);
        }
        for (size_t k = 0; k < json_array_size(tk); k++) {
            const json_t *x = json_array_get(tk, k);
            if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= V ||
                tokens.len >= (1u << 20) * sizeof(int32_t)) {
                free(tokens.p);
                return serve_bad(e, 400, field, "%s.tokens[%zu]: must be a token id in [0, %d) (and at most "
                                 "2^20 tokens in all)", field, k, V);
            }
            int32_t t = (int32_t)json_integer_value(x);
            if (!serve_put(&tokens, &t, sizeof t)) {
                free(tokens.p);
                return serve_bad(e, 500, field, "out of memory");
            }
        }
    }
    h.n_prompt = (int64_t)(tokens.len / sizeof(int32_t));
    if (h.n_prompt == 0) return serve_bad(e, 400, "prompt", "prompt: no tokens");
    /* The KV cache holds the prompt and every new token: both fit the context;
     * max_tokens defaults to what the prompt leaves of it. */
    const int64_t room = s->model.block_size - h.n_prompt;
    if (room < 1) {
        free(tokens.p);
        return serve_bad(e, 400, "prompt", "prompt: %lld tokens, leaving no room in the model's context "
                         "(block_size %d) for a new one", (long long)h.n_prompt, s->model.block_size);
    }
    h.max_tokens = room;
    /* sampling_params */
    const json_t *sp = json_object_get(root, "sampling_params");
    serve_bytes stops = {0}, stop_str = {0};
    bool ok = true;
    if (sp != NULL && !json_is_null(sp)) {
        const json_t *v;
        if (!json_is_object(sp)) ok = serve_bad(e, 400, "sampling_params", "sampling_params: must be an object");
        if (ok && (v = json_object_get(sp, "max_tokens")) != NULL && !json_is_null(v)) {
            if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 4096)
                ok = serve_bad(e, 400, "sampling_params.max_tokens", "sampling_params.max_tokens: must be an "
                               "integer in [1, 4096]");
            else if (json_integer_value(v) > room)
                ok = serve_bad(e, 400, "sampling_params.max_tokens", "sampling_params.max_tokens: %lld: the "
                               "prompt's %lld tokens plus max_tokens must fit the model's context (block_size "
                               "%d): send at most %lld", (long long)json_integer_value(v), (long long)h.n_prompt,
                               s->model.block_size, (long long)room);
            else h.max_tokens = json_integer_value(v);
        }
        if (ok && (v = json_object_get(sp, "temperature")) != NULL && !json_is_null(v)) {
            if (!json_is_number(v) || !(json_number_value(v) >= 0) || json_number_value(v) > 100)
                ok = serve_bad(e, 400, "sampling_params.temperature", "sampling_params.temperature: must be a "
                               "number in [0, 100] (0: greedy)");
            else h.temperature = json_number_value(v);
        }
        if (ok && (v = json_object_get(sp, "top_k")) != NULL && !json_is_null(v)) {
            if (!json_is_integer(v) || json_integer_value(v) < -1 || json_integer_value(v) > (1 << 24))
                ok = serve_bad(e, 400, "sampling_params.top_k", "sampling_params.top_k: must be an integer >= -1 "
                               "(-1 or 0: every token)");
            else h.top_k = json_integer_value(v) < 0 ? 0 : json_integer_value(v);
        }
        if (ok && (v = json_object_get(sp, "top_p")) != NULL && !json_is_null(v)) {
            if (!json_is_number(v) || !(json_number_value(v) > 0) || json_number_value(v) > 1)
                ok = serve_bad(e, 400, "sampling_params.top_p", "sampling_params.top_p: must be in (0, 1]");
            else h.top_p = json_number_value(v);
        }
        if (ok && (v = json_object_get(sp, "seed")) != NULL && !json_is_null(v)) {
            if (!json_is_integer(v) || json_integer_value(v) < 0)
                ok = serve_bad(e, 400, "sampling_params.seed", "sampling_params.seed: must be an integer >= 0");
            else h.seed = (uint64_t)json_integer_value(v) + 1; /* 0 below means "none given" */
        }
        if (ok && (v = json_object_get(sp, "stop")) != NULL && !json_is_null(v))
            ok = serve_parse_stops(v, "sampling_params.stop", s->model.vocab_size, s->opt.lm.decode != NULL,
                                   s->opt.max_stop_bytes, &stops, &stop_str, &h.n_stop_str, e);
    }
    if (ok) {
        h.n_stop = (int64_t)(stops.len / sizeof(int32_t));
        serve_bytes b = {0};
        ok = serve_put(&b, &h, sizeof h) && serve_put(&b, tokens.p, tokens.len) &&
             serve_put(&b, stops.p, stops.len) && serve_put(&b, stop_str.p, stop_str.len) &&
             serve_put(&b, file, strlen(file) + 1);
        if (!ok) {
            free(b.p);
            serve_bad(e, 500, "prompt", "out of memory");
        } else {
            j->payload = b.p;
            j->nbytes = (int64_t)b.len;
            j->op = OP_SAMPLE_FILE;
        }
    }
    free(tokens.p);
    free(stops.p);
    free(stop_str.p);
    return ok;
}

/* POST asample: a future; runs on the shared queue in arrival order (its
 * seq_id belongs to the sampling client, not to the model's order). */
static enum MHD_Result asample_(server *s, struct MHD_Connection *c, const json_t *root, const char *idem) {
    tinker_state *t = s->tinker;
    const json_t *sid = json_object_get(root, "sampling_session_id"), *mp = json_object_get(root, "model_path");
    char file[4400] = "";
    verr e = {0};
    bool ok = true;
    if (json_is_string(sid)) {
        pthread_mutex_lock(&s->mu);
        const sampling_session *x = find_sampler_(t, json_string_value(sid));
        if (x != NULL) snprintf(file, sizeof file, "%s", x->path);
        pthread_mutex_unlock(&s->mu);
        if (x == NULL)
            ok = serve_bad(&e, 400, "sampling_session_id", "sampling_session_id \"%s\": unknown to this server "
                           "(create_sampling_session or save_weights_for_sampler makes one)", json_string_value(sid));
    } else if (json_is_string(mp)) {
        ok = weights_file_(s, json_string_value(mp), file, sizeof file, &e, "model_path");
    } else {
        ok = base_file_(s, json_object_get(root, "base_model"), file, sizeof file, &e);
    }
    job *j = calloc(1, sizeof *j);
    if (j == NULL) return reply_err_(c, 500, NULL, "out of memory");
    if (ok) ok = sample_job_(s, root, file, j, &e);
    pthread_mutex_lock(&s->mu);
    future *f = find_retry_(t, idem, "", 0);
    if (f != NULL || s->closed || (f = new_future_(t, idem, "", 0)) == NULL) {
        const bool closed = s->closed;
        enum MHD_Result r = f != NULL ? reply_future_(c, f)
                                      : reply_err_(c, closed ? 503 : 500, NULL, "%s",
                                                   closed ? "the server is shutting down" : "out of memory");
        pthread_mutex_unlock(&s->mu);
        serve_job_free(j);
        return r;
    }
    f->sample = true;
    if (!ok) {
        serve_utf8_fix(e.msg);
        complete_(f, failure_(e.status >= 500 ? "server" : "user", "%s", e.msg));
        serve_job_free(j);
    } else {
        if (((sample_file_header *)j->payload)->seed == 0) /* none given: a fresh one per request */
            ((sample_file_header *)j->payload)->seed = zdp_splitmix64(&(uint64_t){++t->n_samples ^ (uint64_t)(serve_now() * 1e6)});
        j->fut = f;
        serve_enqueue_locked(s, j);
    }
    /* One id per sample (newer SDKs attach them to the sequences). */
    json_t *ids = json_array();
    const int64_t n = ok ? ((sample_file_header *)j->payload)->num_samples : 0;
    for (int64_t k = 0; k < n; k++) {
        char id[64];
        snprintf(id, sizeof id, "%s:%lld", f->id, (long long)k);
        json_array_append_new(ids, json_string(id));
    }
    enum MHD_Result r = reply_json_(c, 200, json_pack("{s:s,s:o}", "request_id", f->id, "sample_sequence_ids", ids));
    pthread_mutex_unlock(&s->mu);
    return r;
}

/* ---- the router ---------------------------------------------------------------------- */

/* A POST endpoint: its JSON body (an object) and the X-Idempotency-Key. */
typedef enum MHD_Result (*post_fn)(server *s, struct MHD_Connection *c, const char *sub, const json_t *root,
                                   const char *idem);

/* The training verbs: answered with a future. */
static enum MHD_Result post_submit_(server *s, struct MHD_Connection *c, const char *sub, const json_t *root,
                                    const char *idem) {
    return submit_(s, c, sub, root, idem, false);
}

static enum MHD_Result post_retrieve_(server *s, struct MHD_Connection *c, const char *sub, const json_t *root,
                                      const char *idem) {
    (void)sub, (void)idem;
    return retrieve_(s, c, root);
}

/* Chunks of one forward_backward may come in parallel: held requests put
 * them back in seq_id order.  No protobuf, no JWT, plain httpx. */
static enum MHD_Result post_client_config_(server *s, struct MHD_Connection *c, const char *sub,
                                           const json_t *root, const char *idem) {
    (void)s, (void)sub, (void)root, (void)idem;
    return reply_json_(c, 200, json_pack("{s:b,s:i,s:i,s:b,s:b,s:b,s:b,s:b}", "parallel_fwdbwd_chunks", 1,
                                         "fwdbwd_max_chunk_len", 1024, "fwdbwd_max_chunk_bytes_count", 5000000,
                                         "proto_write_fwdbwd", 0, "proto_compress_fwdbwd", 0,
                                         "use_pyqwest_transport", 0, "pjwt_auth_enabled", 0,
                                         "create_model_via_load_weights", 0));
}

static enum MHD_Result post_dynamic_config_(server *s, struct MHD_Connection *c, const char *sub,
                                            const json_t *root, const char *idem) {
    (void)s, (void)sub, (void)root, (void)idem;
    return reply_json_(c, 200, json_pack("{s:i}", "refresh_interval_sec", 300));
}

static enum MHD_Result post_create_session_(server *s, struct MHD_Connection *c, const char *sub,
                                            const json_t *root, const char *idem) {
    (void)sub, (void)root, (void)idem;
    tinker_state *t = s->tinker;
    pthread_mutex_lock(&s->mu);
    prune_sessions_(t);
    session *x = calloc(1, sizeof *x);
    char why[PATH_MAX + 200];
    int64_t n = 0;
    if (x != NULL && !tinker_runs_next_session(s, &n, why, sizeof why)) {
        pthread_mutex_unlock(&s->mu);
        free(x);
        return reply_err_(c, 500, NULL, "%s", why);
    }
    if (x != NULL) {
        snprintf(x->id, sizeof x->id, "s%lld", (long long)n);
        x->seen = serve_now();
        x->next = t->sessions;
        t->sessions = x;
    }
    char id[32];
    snprintf(id, sizeof id, "%s", x ? x->id : "");
    pthread_mutex_unlock(&s->mu);
    if (x == NULL) return reply_err_(c, 500, NULL, "out of memory");
    char warn[512];
    /* LoRA (what Tinker does): nothing to warn about.  --full-finetune: the SDK logs it. */
    if (!serve_lora(s))
        snprintf(warn, sizeof warn, "zdp serve trains every parameter of one model (\"%s\", --full-finetune): "
                 "a new create_model continues from the current weights and optimizer state", s->opt.model_name);
    return reply_json_(c, 200, json_pack("{s:s,s:s,s:s*}", "session_id", id, "type", "create_session",
                                         "warning_message", serve_lora(s) ? NULL : warn));
}

static enum MHD_Result post_heartbeat_(server *s, struct MHD_Connection *c, const char *sub, const json_t *root,
                                       const char *idem) {
    (void)sub, (void)idem;
    const char *id = json_string_value(json_object_get(root, "session_id"));
    pthread_mutex_lock(&s->mu);
    session *x = id ? find_session_(s->tinker, id) : NULL;
    if (x != NULL) x->seen = serve_now();
    pthread_mutex_unlock(&s->mu);
    return x ? reply_json_(c, 200, json_pack("{s:s}", "type", "session_heartbeat"))
             : reply_err_(c, 404, "session_id", "session_id %s: unknown session", id ? id : "(missing)");
}

static enum MHD_Result post_telemetry_(server *s, struct MHD_Connection *c, const char *sub, const json_t *root,
                                       const char *idem) {
    (void)s, (void)sub, (void)root, (void)idem;
    return reply_json_(c, 200, json_pack("{s:s}", "status", "accepted")); /* dropped */
}

static enum MHD_Result post_create_model_(server *s, struct MHD_Connection *c, const char *sub,
                                          const json_t *root, const char *idem) {
    (void)sub;
    return create_model_(s, c, root, idem);
}

/* get_info and unload_model: the model named by model_id. */
static enum MHD_Result post_model_(server *s, struct MHD_Connection *c, const char *sub, const json_t *root,
                                   const char *idem) {
    tinker_state *t = s->tinker;
    const char *mid;
    int64_t unused;
    verr e = {0};
    if (!envelope_(root, &mid, &unused, false, &e)) return reply_err_(c, e.status, e.field, "%s", e.msg);
    const bool unload = !strcmp(sub, "unload_model");
    pthread_mutex_lock(&s->mu);
    tinker_model *m = find_model_(t, mid);
    future *f = NULL;
    zdp_lora_config lc = {0};
    if (m != NULL && unload) {
        f = find_retry_(t, idem, "", 0);
        if (f == NULL && (f = new_future_(t, idem, "", 0)) != NULL) {
            if (!serve_lora(s)) {
                /* --full-finetune: the model detaches; the weights stay in the engine. */
                m->live = false;
                fail_held_(s, m, "user", "the model was unloaded");
                tinker_gone *g = &t->gone[t->n_gone++ % MAX_GONE];
                snprintf(g->model_id, sizeof g->model_id, "%s", mid);
                snprintf(g->why, sizeof g->why, "unload_model was called");
                complete_(f, serve_dump(json_pack("{s:s,s:s}", "model_id", mid, "type", "unload_model")));
            } else if (!unload_(s, m, f, "unload_model was called")) {
                complete_(f, failure_("server", "out of memory"));
            }
        }
    } else if (m != NULL) {
        touch_model_session_(t, m);
        lc = m->lc;
    } else {
        not_live_(t, mid, &e);
    }
    pthread_mutex_unlock(&s->mu);
    if (m == NULL) return reply_err_(c, e.status, e.field, "%s", e.msg);
    if (unload) return f ? reply_future_(c, f) : reply_err_(c, 500, NULL, "out of memory");
    /* tokenizer_id: what the caller named (a model folder's path, "gpt2" for
     * GPT-2's vocabulary), else null: the client brings its own. */
    json_t *o = json_pack("{s:s,s:{s:s,s:s,s:s*},s:b,s:s,s:s}", "model_id", mid, "model_data", "arch",
                          s->opt.lm.arch, "model_name", s->opt.model_name, "tokenizer_id", s->opt.lm.tokenizer_id,
                          "is_lora", lc.rank > 0, "model_name", s->opt.model_name, "type", "get_info");
    json_object_set_new(o, "lora_rank", lc.rank > 0 ? json_integer(lc.rank) : json_null());
    return reply_json_(c, 200, o);
}

/* POST weights_info {tinker_path}: what create_training_client_from_state
 * recreates the model with (the run's LoRA configuration, from run.json). */
static enum MHD_Result post_weights_info_(server *s, struct MHD_Connection *c, const char *sub,
                                          const json_t *root, const char *idem) {
    (void)sub, (void)idem;
    const json_t *tp = json_object_get(root, "tinker_path");
    if (!json_is_string(tp))
        return reply_err_(c, 400, "tinker_path", "tinker_path: missing or not a string; send the tinker:// path "
                          "save_state returned");
    json_t *rec = tinker_runs_record_of(s, json_string_value(tp));
    if (rec == NULL)
        return reply_err_(c, 404, "tinker_path", "tinker_path \"%s\": no training run of this server's "
                          "--checkpoint-dir has it", json_string_value(tp));
    const json_t *rank = json_object_get(rec, "lora_rank");
    json_t *o = json_pack("{s:s,s:b}", "base_model", s->opt.model_name, "is_lora", json_is_integer(rank));
    json_object_set_new(o, "lora_rank", json_is_integer(rank) ? json_incref((json_t *)rank) : json_null());
    static const char *const flags[3] = {"train_attn", "train_mlp", "train_unembed"};
    for (int k = 0; k < 3; k++) {
        const json_t *v = json_object_get(rec, flags[k]);
        if (json_is_boolean(v)) json_object_set_new(o, flags[k], json_incref((json_t *)v));
    }
    json_decref(rec);
    return reply_json_(c, 200, o);
}

static enum MHD_Result post_sampling_session_(server *s, struct MHD_Connection *c, const char *sub,
                                              const json_t *root, const char *idem) {
    (void)sub, (void)idem;
    return create_sampling_session_(s, c, root);
}

static enum MHD_Result post_asample_(server *s, struct MHD_Connection *c, const char *sub, const json_t *root,
                                     const char *idem) {
    (void)sub;
    return asample_(s, c, root, idem);
}

/* The POST route table: every endpoint under /api/v1/ that takes JSON. */
static const struct {
    const char *name;
    post_fn fn;
} post_routes_[] = {
    {"forward_backward", post_submit_},
    {"forward", post_submit_},
    {"optim_step", post_submit_},
    {"save_weights", post_submit_},
    {"save_weights_for_sampler", post_submit_},
    {"load_weights", post_submit_},
    {"retrieve_future", post_retrieve_},
    {"client/config", post_client_config_},
    {"client/dynamic_config", post_dynamic_config_},
    {"create_session", post_create_session_},
    {"session_heartbeat", post_heartbeat_},
    {"telemetry", post_telemetry_},
    {"create_model", post_create_model_},
    {"get_info", post_model_},
    {"unload_model", post_model_},
    {"weights_info", post_weights_info_},
    {"create_sampling_session", post_sampling_session_},
    {"asample", post_asample_},
};

/* SDK 0.25: forward_backward (forward_only = true for forward) as protobuf. */
static enum MHD_Result post_proto_(server *s, struct MHD_Connection *c, const char *sub, const char *body,
                                   size_t len) {
    if (strcmp(sub, "forward_backward") != 0 && strcmp(sub, "forward") != 0)
        return reply_err_(c, 415, "Content-Type", "POST /api/v1/%s takes JSON; only forward_backward (and "
                          "forward) take %s", sub, SERVE_PROTO_CONTENT_TYPE);
    char err[600];
    serve_proto_fwdbwd rq;
    if (!serve_proto_decode_fwdbwd((const unsigned char *)body, len, &rq, err, sizeof err)) {
        serve_proto_fwdbwd_free(&rq);
        return reply_err_(c, 400, "body", "the body is not a valid protobuf ForwardBackwardRequest: %s", err);
    }
    /* Posted to forward: a forward, whatever forward_only says. */
    const bool forward = rq.forward_only || !strcmp(sub, "forward");
    const char *idem = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Idempotency-Key");
    tinker_ticket tk;
    verr e = {0};
    const int st = tinker_submit_proto(s, &rq, forward, idem, &tk, &e);
    serve_proto_fwdbwd_free(&rq);
    if (st != 200) return reply_err_(c, st, e.field[0] ? e.field : NULL, "%s", e.msg);
    return reply_ticket_(c, &tk);
}

enum MHD_Result tinker_handle(server *s, struct MHD_Connection *c, const char *sub, const char *method,
                              const char *body, size_t len) {
    if (!strcmp(method, "GET")) {
        if (!strcmp(sub, "healthz")) return serve_healthz(s, c);
        if (!strncmp(sub, "training_runs", 13) || !strcmp(sub, "checkpoints")) return tinker_runs_get(s, c, sub);
        if (!strcmp(sub, "get_server_capabilities"))
            return reply_json_(c, 200, json_pack("{s:[{s:s,s:i}]}", "supported_models", "model_name",
                                                 s->opt.model_name, "max_context_length",
                                                 s->model.block_size));
        return reply_err_(c, 404, "url", "GET /api/v1/%s: no such endpoint (GET healthz, "
                          "get_server_capabilities, training_runs, training_runs/ID, "
                          "training_runs/ID/checkpoints, checkpoints; everything else is POST)", sub);
    }
    if (!strcmp(method, "DELETE")) return tinker_runs_delete(s, c, sub);
    const size_t sub_len = strlen(sub);
    if (!strcmp(method, "PUT") && sub_len > 4 && !strcmp(sub + sub_len - 4, "/ttl"))
        return tinker_runs_set_ttl(s, c, sub, body, len);
    if (strcmp(method, "POST") != 0)
        return reply_err_(c, 405, "method", "%s /api/v1/%s: method not allowed; use POST (GET, DELETE "
                          "and PUT .../ttl for training runs and checkpoints)", method, sub);

    const char *encoding = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Encoding");
    if (encoding != NULL && encoding[0] && !serve_names_type(encoding, "identity"))
        return reply_err_(c, 400, "Content-Encoding",
                          "Content-Encoding: %s: this server takes uncompressed bodies only (its client/config "
                          "says proto_compress_fwdbwd = false)", encoding);
    const char *ctype = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type");
    if (ctype != NULL && serve_names_type(ctype, SERVE_PROTO_CONTENT_TYPE)) return post_proto_(s, c, sub, body, len);

    json_error_t jerr;
    json_t *root = len == 0 ? json_object() : json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL)
        return reply_err_(c, 400, "body", "the body is not valid JSON: %s (line %d, column %d)", jerr.text,
                          jerr.line, jerr.column);
    if (!json_is_object(root)) {
        json_decref(root);
        return reply_err_(c, 400, "body", "the body must be a JSON object");
    }
    const char *idem = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Idempotency-Key");
    enum MHD_Result r = MHD_NO;
    size_t i = 0;
    const size_t n = sizeof post_routes_ / sizeof *post_routes_;
    while (i < n && strcmp(sub, post_routes_[i].name) != 0) i++;
    if (i < n)
        r = post_routes_[i].fn(s, c, sub, root, idem);
    else
        r = reply_err_(c, 404, "url", "POST /api/v1/%s: not an endpoint of zdp serve (the Tinker SDK's "
                       "training protocol: client/config, create_session, session_heartbeat, telemetry, "
                       "create_model, get_info, forward_backward, forward, optim_step, retrieve_future, "
                       "save_weights, save_weights_for_sampler, load_weights, unload_model, weights_info)", sub);
    json_decref(root);
    return r;
}
