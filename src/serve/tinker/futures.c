/*
 * futures.c -- Tinker's futures (docs/tinker-protocol.md): every
 * training verb answers its POST at once with {"request_id": "zdp-N"}; the
 * work runs later on the server's one FIFO queue and its result is kept on
 * the future (an hour, not deleted on first read: a client may poll again
 * after a lost response).  retrieve_future holds the connection until the
 * future is done or --long-poll-seconds pass, then answers {"type":
 * "try_again"}: the SDK re-polls at once, so an immediate try_again would
 * spin.  A finished job's outcome goes onto its future
 * (tinker_finish_locked), typed where a poll may want protobuf, and is
 * encoded once, as the poll asks: a ForwardBackwardOutput or SampleResponse
 * as protobuf (tinker/proto_encode.c) when the request came as protobuf or is a
 * sample and the poll's Accept names it, else JSON.  Also the replies every
 * Tinker endpoint shares (JSON, errors, failures).
 * Everything runs on rank 0; futures are under s->mu.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tinker/proto.h"
#include "tinker/tinker.h"

/* ---- replies ------------------------------------------------------------------ */

enum MHD_Result tinker_reply_json(struct MHD_Connection *c, int status, json_t *o) {
    return serve_reply(c, status, serve_dump(o));
}

/* A direct error: the SDK raises it with the body (other 4xx than 408/409/429
 * are not retried). */
enum MHD_Result tinker_reply_error(struct MHD_Connection *c, int status, const char *field, const char *fmt,
                                   ...) {
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
    return tinker_reply_json(c, status, json_pack("{s:s,s:s,s:s*}", "error", msg, "category",
                                                  status >= 500 ? "server" : "user", "field", field));
}

/* A failed future's result: the SDK raises RequestFailedError(error, category). */
char *tinker_failure(const char *category, const char *fmt, ...) {
    char msg[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    serve_utf8_fix(msg);
    return serve_dump(json_pack("{s:s,s:s}", "error", msg, "category", category));
}

/* ---- futures (s->mu held) --------------------------------------------------------------- */

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

future *tinker_new_future(tinker_state *t, const char *idem, const char *model_id, int64_t seq) {
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

void tinker_complete(future *f, char *result) {
    if (result == NULL) /* out of memory: what the poll answers then */
        result = strdup("{\"error\":\"out of memory\",\"category\":\"server\"}");
    f->result = result;
    f->done = true;
    f->done_at = serve_now();
}

/* The future a retried POST already made: same idempotency key, or the same
 * (model_id, seq_id). */
future *tinker_find_retry(tinker_state *t, const char *idem, const char *model_id, int64_t seq) {
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

void tinker_ticket_of(const future *f, tinker_ticket *out) {
    snprintf(out->id, sizeof out->id, "%s", f->id);
    snprintf(out->model_id, sizeof out->model_id, "%s", f->model_id);
}

enum MHD_Result tinker_reply_future(struct MHD_Connection *c, const future *f) {
    return tinker_reply_json(c, 200, json_pack("{s:s,s:s*}", "request_id", f->id, "model_id",
                                         f->model_id[0] ? f->model_id : NULL));
}

/* A submitted request's answer: its future's id (and model_id). */
enum MHD_Result tinker_reply_ticket(struct MHD_Connection *c, const tinker_ticket *tk) {
    return tinker_reply_json(c, 200, json_pack("{s:s,s:s*}", "request_id", tk->id, "model_id",
                                         tk->model_id[0] ? tk->model_id : NULL));
}

/* ---- a finished job's outcome (main thread, s->mu held) ----------------------------- */

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
    if (j->fut->cancelled) { /* cancel_future came while it ran: the future already failed */
        j->fut = NULL;
        serve_job_free(j);
        return;
    }
    if (j->op == OP_CREATE && status != 200) {
        /* Refused on every rank (nothing was made): the model never lived,
         * and what was queued behind it is refused at its turn. */
        tinker_model *m = NULL;
        for (int k = 0; k < s->tinker->n_models; k++)
            if (s->tinker->models[k].live && s->tinker->models[k].uid == j->uid) m = &s->tinker->models[k];
        if (m != NULL) {
            m->live = false;
            tinker_fail_held(s, m, "user", "the model's create_model failed");
        }
    }
    if (status != 200) {
        char msg[1200];
        snprintf(msg, sizeof msg, "%s", j->err_msg[0] != '\0' ? j->err_msg : "request failed");
        serve_utf8_fix(msg);
        result = tinker_failure(status >= 500 ? "server" : "user", "%s", msg);
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
        if (j->sampling_session != NULL && !tinker_add_sampler(s->tinker, j->sampling_session, r->path)) {
            result = tinker_failure("server", "out of memory");
        } else {
            r->name = j->tinker_path;
            r->session = j->sampling_session;
            j->tinker_path = j->sampling_session = NULL;
            keep_typed_(j);
            return;
        }
    } else {
        result = tinker_failure("server", "%s finished without its result (a bug in zdp)",
                                serve_ops[j->op].name);
    }
    if (result == NULL) result = tinker_failure("server", "out of memory");
    tinker_complete(j->fut, result);
    j->fut = NULL;
    serve_job_free(j);
}

/* ---- retrieve_future: a result, encoded once ---------------------------------------- */

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
        return serve_reply(c, 200, tinker_failure("server", "cannot encode the %s as protobuf: %s", what, err));
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
        return body != NULL ? serve_reply(c, 200, body) : tinker_reply_error(c, 500, NULL, "out of memory");
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
enum MHD_Result tinker_retrieve(server *s, struct MHD_Connection *c, const char *sub, const json_t *root,
                                const char *idem) {
    (void)sub, (void)idem;
    const json_t *id = json_object_get(root, "request_id");
    if (!json_is_string(id)) return tinker_reply_error(c, 400, "request_id", "request_id: missing or not a string");
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
        return tinker_reply_json(c, 200, json_pack("{s:s,s:s}", "error",
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
        return body != NULL ? serve_reply(c, 200, body) : tinker_reply_error(c, 500, NULL, "out of memory");
    }
    if (done && body == NULL) return tinker_reply_error(c, 500, NULL, "out of memory");
    if (body != NULL) return reply_result_(c, body, proto);
    if (closed) return tinker_reply_error(c, 503, NULL, "the server is shutting down");
    return tinker_reply_json(c, 200, json_pack("{s:s,s:s,s:s}", "type", "try_again", "request_id",
                                         json_string_value(id), "queue_state", "active"));
}

/* ---- retrieve_futures: a sampling session's completions, with a cursor ---------------- */

/* The SDK's poll waits at most 45 s for an answer (newer SDKs,
 * session_futures_poller.py); the hold stays well below that whatever
 * --long-poll-seconds says. */
#define MANY_HOLD_MAX_S 30.0

static bool reportable_(const future *f, const char *sess, int64_t clone) {
    return f->sample && f->done && f->sess[0] != '\0' && f->clone == clone && !strcmp(f->sess, sess);
}

/* s->mu held: a done asample of (sess, clone) the client has not been told of. */
static bool news_(const tinker_state *t, const char *sess, int64_t clone, int64_t prev) {
    for (const future *f = t->futures; f != NULL; f = f->next)
        if (reportable_(f, sess, clone) && (f->event == 0 || f->event > prev)) return true;
    return false;
}

json_t *tinker_completions_locked(tinker_state *t, const char *sess, int64_t clone, int64_t prev,
                                  int64_t *cursor) {
    json_t *done = json_array();
    *cursor = prev;
    for (future *f = t->futures; f != NULL && done != NULL; f = f->next) {
        if (!reportable_(f, sess, clone)) continue;
        if (f->event == 0) f->event = ++t->n_events;
        if (f->event <= prev) continue;
        /* A SampleResponse kept typed finished; a result kept as JSON is an error. */
        json_array_append_new(done, json_pack("{s:s,s:s}", "state", f->samp != NULL ? "finished" : "failed",
                                              "request_id", f->id));
        if (f->event > *cursor) *cursor = f->event;
    }
    return done;
}

/* A non-negative integer field of obj, or def when absent or null; false with e set. */
static bool count_field_(const json_t *obj, const char *name, const char *field, int64_t def, int64_t *out,
                         verr *e) {
    const json_t *v = json_object_get(obj, name);
    *out = def;
    if (v == NULL || json_is_null(v)) return true;
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return serve_bad(e, 400, field, "%s: must be an integer >= 0 (got %s)", field,
                         json_is_integer(v) ? "a negative number" : "another JSON type");
    *out = json_integer_value(v);
    return true;
}

enum MHD_Result tinker_retrieve_many(server *s, struct MHD_Connection *c, const char *sub, const json_t *root,
                                     const char *idem) {
    (void)sub, (void)idem;
    const json_t *target = json_object_get(root, "target");
    if (!json_is_object(target))
        return tinker_reply_error(c, 400, "target", "target: missing or not an object; send {\"type\": "
                                  "\"sampling_session\", \"sampling_session_id\": ..., \"cloned_sampler_id\": 0}");
    const json_t *type = json_object_get(target, "type");
    if (type != NULL && !(json_is_string(type) && !strcmp(json_string_value(type), "sampling_session")))
        return tinker_reply_error(c, 400, "target.type", "target.type: %s; the only poll target is "
                                  "\"sampling_session\"", json_is_string(type) ? json_string_value(type) : "not a string");
    const json_t *sid = json_object_get(target, "sampling_session_id");
    if (!json_is_string(sid))
        return tinker_reply_error(c, 400, "target.sampling_session_id", "target.sampling_session_id: missing or "
                                  "not a string; send the id create_sampling_session returned");
    int64_t clone, prev;
    verr e = {0};
    if (!count_field_(target, "cloned_sampler_id", "target.cloned_sampler_id", 0, &clone, &e) ||
        !count_field_(root, "prev_cursor", "prev_cursor", 0, &prev, &e))
        return tinker_reply_error(c, e.status, e.field, "%s", e.msg);
    double hold = s->opt.long_poll_s < MANY_HOLD_MAX_S ? s->opt.long_poll_s : MANY_HOLD_MAX_S;
    const json_t *to = json_object_get(root, "timeout");
    if (to != NULL && !json_is_null(to)) {
        if (!json_is_number(to) || json_number_value(to) < 0)
            return tinker_reply_error(c, 400, "timeout", "timeout: must be a number of seconds >= 0 or null");
        if (json_number_value(to) < hold) hold = json_number_value(to);
    }
    const char *sess = json_string_value(sid);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    const double whole = floor(hold);
    until.tv_sec += (time_t)whole;
    until.tv_nsec += (long)((hold - whole) * 1e9);
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    tinker_state *t = s->tinker;
    pthread_mutex_lock(&s->mu);
    if (tinker_find_sampler(t, sess) == NULL) {
        pthread_mutex_unlock(&s->mu);
        return tinker_reply_error(c, 404, "target.sampling_session_id", "target.sampling_session_id \"%s\": unknown "
                                  "to this server (create_sampling_session or save_weights_for_sampler makes one; "
                                  "sessions are not kept across restarts)", sess);
    }
    /* A cursor this server never handed out (a client from before a
     * restart): everything is new to it. */
    if (prev > t->n_events) prev = 0;
    int rc = 0;
    while (!news_(t, sess, clone, prev) && !s->closed && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&s->cv_done, &s->mu, &until);
    int64_t cursor = prev;
    json_t *done = tinker_completions_locked(t, sess, clone, prev, &cursor);
    const bool closed = s->closed;
    pthread_mutex_unlock(&s->mu);
    if (done == NULL) return tinker_reply_error(c, 500, NULL, "out of memory");
    if (closed && json_array_size(done) == 0) {
        json_decref(done);
        return tinker_reply_error(c, 503, NULL, "the server is shutting down");
    }
    return tinker_reply_json(c, 200, json_pack("{s:o,s:I}", "completions", done, "cursor", (json_int_t)cursor));
}

/* ---- cancel_future -------------------------------------------------------------------- */

const char *tinker_cancel_locked(server *s, const char *request_id, verr *e) {
    future *f = find_future_(s->tinker, request_id);
    if (f == NULL) {
        serve_bad(e, 404, "request_id", "request_id %s: unknown to this server (results are kept for an hour, "
                  "and not across restarts)", request_id);
        return NULL;
    }
    if (!f->sample) {
        /* A training verb has its place in its model's seq_id order: the
         * requests after it were written against its effect. */
        serve_bad(e, 400, "request_id", "request_id %s: not an asample request; only sampling requests can be "
                  "cancelled", request_id);
        return NULL;
    }
    if (f->done) return "done"; /* finished or failed already: nothing to do */
    const char *state = "dropped"; /* running: it finishes, tinker_finish_locked drops its result */
    for (job *q = s->head; q != NULL; q = q->next)
        if (q->fut == f && serve_unqueue_locked(s, q)) {
            q->fut = NULL;
            serve_job_free(q);
            state = "cancelled"; /* never runs */
            break;
        }
    f->cancelled = true;
    tinker_complete(f, tinker_failure("user", "request %s was cancelled by cancel_future", f->id));
    pthread_cond_broadcast(&s->cv_done); /* a retrieve_futures poll reports it failed */
    return state;
}

enum MHD_Result tinker_cancel(server *s, struct MHD_Connection *c, const char *sub, const json_t *root,
                              const char *idem) {
    (void)sub, (void)idem;
    const json_t *id = json_object_get(root, "request_id");
    if (!json_is_string(id))
        return tinker_reply_error(c, 400, "request_id", "request_id: missing or not a string; send the request_id "
                                  "asample returned");
    verr e = {0};
    pthread_mutex_lock(&s->mu);
    const char *state = tinker_cancel_locked(s, json_string_value(id), &e);
    pthread_mutex_unlock(&s->mu);
    if (state == NULL) return tinker_reply_error(c, e.status, e.field, "%s", e.msg);
    return tinker_reply_json(c, 200, json_pack("{s:s,s:s,s:s}", "type", "cancel_future", "request_id",
                                               json_string_value(id), "state", state));
}
