/*
 * routes.c -- the Tinker SDK's endpoints under /api/v1/
 * (docs/tinker-protocol.md): the route tables and each endpoint's handler.
 * A handler decodes the body once (JSON, or for SDK 0.25's forward_backward
 * protobuf: tinker/proto_decode.c), hands a training verb to submit.c and answers
 * with its future, or answers directly.
 *
 * Protobuf (SDK 0.25).  0.25 posts every forward_backward -- and forward, as
 * forward_backward with forward_only = true -- as application/x-protobuf
 * (client/config's proto_write_fwdbwd is no longer read), and takes the
 * ForwardBackwardOutput only as protobuf.  The body is decoded straight into
 * the typed request the JSON path also produces (fwd_input.h), and
 * serve_fwd_build checks it for both.  A malformed protobuf body is answered
 * 400 at once, like a body that is not JSON.
 *
 * Sampling.  A sampling session (create_sampling_session, or
 * save_weights_for_sampler without a name) names a saved weights file;
 * asample runs on the same queue, reading that file (not the live weights).
 */
#define _POSIX_C_SOURCE 200809L
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tinker/proto.h"
#include "tinker/tinker.h"

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
    if (!json_is_string(sid)) return tinker_reply_error(c, 400, "session_id", "session_id: missing or not a string");
    if (seq != NULL && !json_is_integer(seq))
        return tinker_reply_error(c, 400, "model_seq_id", "model_seq_id: must be an integer");
    zdp_lora_config lc;
    bool seeded;
    verr e = {0};
    /* New SDKs name the optimizer; only AdamW trains here, so another one is
     * refused rather than silently trained with AdamW. */
    if (!tinker_parse_optimizer_config(json_object_get(root, "optimizer_config"), &e))
        return tinker_reply_error(c, e.status, e.field, "%s", e.msg);
    if (!tinker_parse_lora(json_object_get(root, "lora_config"), &lc, &seeded, &e))
        return tinker_reply_error(c, e.status, e.field, "%s", e.msg);
    if (!serve_lora(s) && lc.rank > 0)
        return tinker_reply_error(c, 400, "lora_config.rank", "lora_config.rank = %d: this server trains every weight of "
                          "one model (--full-finetune), not LoRA adapters; send rank 0 (no lora_config) for a "
                          "full fine-tune, or restart zdp serve without --full-finetune to train LoRA models",
                          lc.rank);
    if (serve_lora(s) && lc.rank == 0)
        return tinker_reply_error(c, 400, "lora_config.rank", "lora_config.rank = 0 (or no lora_config) asks for a full "
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
            return tinker_reply_error(c, err.code == ZDP_ERR_NOMEM ? 500 : 400, field, "%s: %s; nothing was created",
                              field, err.msg);
        }
        zdp_lora_destroy(&probe);
    }
    pthread_mutex_lock(&s->mu);
    future *f = tinker_find_retry(t, idem, "", 0);
    if (f != NULL) {
        enum MHD_Result r = tinker_reply_future(c, f);
        pthread_mutex_unlock(&s->mu);
        return r;
    }
    char model_id[160];
    snprintf(model_id, sizeof model_id, "%s:train:%lld", json_string_value(sid),
             seq ? (long long)json_integer_value(seq) : 0LL);
    session *x = tinker_find_session(t, json_string_value(sid));
    const double now = serve_now();
    /* LoRA: a new model needs a free slot, or one a model of an ended
     * session gives up (tinker_evictable); else refused at once (400: no
     * retry would help until a model is unloaded or a session ends). */
    int slot = -1;
    for (int k = 0; serve_lora(s) && k < t->n_models && slot < 0; k++)
        if (!t->models[k].live) slot = k;
    if (serve_lora(s) && x != NULL && tinker_find_model(t, model_id) == NULL && slot < 0 &&
        tinker_evictable(s, now) == NULL) {
        char names[2048];
        tinker_describe_models(s, now, names, sizeof names);
        enum MHD_Result r = tinker_reply_error(c, 400, "--max-models", "create_model: this server holds at most %d "
                                       "models (--max-models %d) and %d are live, every one of a live session: %s; "
                                       "unload_model one, finish its session (ServiceClient.close()), let its "
                                       "session end (a session that sent no heartbeat for %g s, "
                                       "--session-timeout-seconds, gives its models' slots to a new create_model), "
                                       "or restart with a larger --max-models", t->n_models, t->n_models,
                                       tinker_live_models(t), names, tinker_session_timeout(s));
        pthread_mutex_unlock(&s->mu);
        return r;
    }
    f = tinker_new_future(t, idem, "", 0);
    if (f == NULL) {
        pthread_mutex_unlock(&s->mu);
        return tinker_reply_error(c, 500, NULL, "out of memory");
    }
    tinker_model *m0 = &t->models[0];
    const session *owner = !serve_lora(s) && m0->live ? tinker_find_session(t, m0->session) : NULL;
    if (x == NULL) {
        tinker_complete(f, tinker_failure("user", "session_id \"%s\": unknown; call create_session first",
                              json_string_value(sid)));
    } else if (x->finished) {
        tinker_complete(f, tinker_failure("user", "session_id \"%s\": finished (reason %s); a finished session "
                              "creates no models: create_session for a new one", x->id, x->finish_why));
    } else if (!json_is_string(base) || strcmp(json_string_value(base), s->opt.model_name) != 0) {
        tinker_complete(f, tinker_failure("user", "base_model %s%s%s: this server trains \"%s\" (--model-name)",
                              json_is_string(base) ? "\"" : "", json_is_string(base) ? json_string_value(base)
                                                                                     : "(missing)",
                              json_is_string(base) ? "\"" : "", s->opt.model_name));
    } else if (serve_lora(s)) {
        x->seen = now;
        if (tinker_find_model(t, model_id) != NULL) { /* the same model again: a retry under a new key */
            tinker_complete(f, serve_dump(json_pack("{s:s,s:s}", "model_id", model_id, "type", "create_model")));
        } else {
            char mdir[160], why[PATH_MAX + 200];
            tinker_model_dir(model_id, mdir, sizeof mdir);
            tinker_model *old = slot < 0 ? tinker_evictable(s, now) : NULL;
            if (old != NULL) {
                /* Its OP_UNLOAD is queued behind its own requests and ahead of
                 * this create, so the slot is free when the create runs. */
                const session *ox = tinker_find_session(t, old->session);
                char ev[300];
                if (ox != NULL && ox->finished)
                    snprintf(ev, sizeof ev, "its session %s finished; create_model %s took its slot", old->session,
                             model_id);
                else
                    snprintf(ev, sizeof ev, "its session %s sent no heartbeat for %.0f s (--session-timeout-seconds "
                             "%g); create_model %s took its slot", old->session, ox != NULL ? now - ox->seen : 0.0,
                             tinker_session_timeout(s), model_id);
                if (tinker_unload(s, old, NULL, ev)) slot = old->slot;
            }
            if (!seeded) /* LoraConfig.seed None: a random seed, as Tinker's */
                lc.seed = zdp_splitmix64(&(uint64_t){(uint64_t)(now * 1e6) ^ (uint64_t)t->n_uids});
            job *j = calloc(1, sizeof *j);
            serve_bytes b = {0};
            const create_payload p = {.uid = t->n_uids + 1, .slot = slot, .rank = lc.rank, .targets = lc.targets,
                                      .alpha = lc.alpha != 0 ? lc.alpha : ZDP_LORA_DEFAULT_ALPHA, .seed = lc.seed};
            if (slot < 0 || j == NULL || !serve_put(&b, &p, sizeof p) ||
                !serve_put(&b, model_id, strlen(model_id) + 1)) {
                free(j);
                free(b.p);
                tinker_complete(f, tinker_failure("server", "out of memory"));
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
    } else if (m0->live && strcmp(m0->model_id, model_id) != 0 && tinker_session_alive(s, owner, now)) {
        tinker_complete(f, tinker_failure("user", "model %s of a live session is training on this server, which holds "
                              "one model (--full-finetune); unload_model it, or end that session (finish it, or "
                              "a session without heartbeats for %g s ends)", m0->model_id,
                              tinker_session_timeout(s)));
    } else {
        x->seen = now;
        if (m0->live && strcmp(m0->model_id, model_id) != 0) {
            fprintf(stderr, "zdp serve: model %s (its session went silent) is replaced by %s\n", m0->model_id,
                    model_id);
            tinker_fail_held(s, m0, "user", "the model was replaced by a newer create_model");
            tinker_gone *g = &t->gone[t->n_gone++ % MAX_GONE];
            snprintf(g->model_id, sizeof g->model_id, "%s", m0->model_id);
            snprintf(g->why, sizeof g->why, "replaced by %s (a create_model after its session went silent; "
                     "--full-finetune holds one model)", model_id);
        }
        char mdir[160], why[PATH_MAX + 200];
        tinker_model_dir(model_id, mdir, sizeof mdir);
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
        tinker_complete(f, serve_dump(json_pack("{s:s,s:s}", "model_id", model_id, "type", "create_model")));
    }
    enum MHD_Result r = tinker_reply_future(c, f);
    pthread_mutex_unlock(&s->mu);
    return r;
}

/* POST create_sampling_session {session_id, sampling_session_seq_id,
 * model_path | base_model}: a direct answer. */
static enum MHD_Result create_sampling_session_(server *s, struct MHD_Connection *c, const json_t *root) {
    const json_t *sid = json_object_get(root, "session_id"), *seq = json_object_get(root, "sampling_session_seq_id");
    const json_t *mp = json_object_get(root, "model_path"), *base = json_object_get(root, "base_model");
    if (!json_is_string(sid)) return tinker_reply_error(c, 400, "session_id", "session_id: missing or not a string");
    if (seq != NULL && !json_is_integer(seq))
        return tinker_reply_error(c, 400, "sampling_session_seq_id", "sampling_session_seq_id: must be an integer");
    char file[4400];
    verr e = {0};
    bool ok = json_is_string(mp) ? tinker_weights_file(s, json_string_value(mp), file, sizeof file, &e, "model_path")
                                 : tinker_base_file(s, base, file, sizeof file, &e);
    if (!ok) return tinker_reply_error(c, e.status, e.field, "%s", e.msg);
    char id[128];
    snprintf(id, sizeof id, "%.60s:sample:%lld", json_string_value(sid), seq ? (long long)json_integer_value(seq) : 0LL);
    pthread_mutex_lock(&s->mu);
    ok = tinker_add_sampler(s->tinker, id, file);
    pthread_mutex_unlock(&s->mu);
    if (!ok) return tinker_reply_error(c, 500, NULL, "out of memory");
    return tinker_reply_json(c, 200, json_pack("{s:s,s:s}", "sampling_session_id", id, "type", "create_sampling_session"));
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
        const sampling_session *x = tinker_find_sampler(t, json_string_value(sid));
        if (x != NULL) snprintf(file, sizeof file, "%s", x->path);
        pthread_mutex_unlock(&s->mu);
        if (x == NULL)
            ok = serve_bad(&e, 400, "sampling_session_id", "sampling_session_id \"%s\": unknown to this server "
                           "(create_sampling_session or save_weights_for_sampler makes one)", json_string_value(sid));
    } else if (json_is_string(mp)) {
        ok = tinker_weights_file(s, json_string_value(mp), file, sizeof file, &e, "model_path");
    } else {
        ok = tinker_base_file(s, json_object_get(root, "base_model"), file, sizeof file, &e);
    }
    job *j = calloc(1, sizeof *j);
    if (j == NULL) return tinker_reply_error(c, 500, NULL, "out of memory");
    if (ok) ok = tinker_sample_job(s, root, file, j, &e);
    pthread_mutex_lock(&s->mu);
    future *f = tinker_find_retry(t, idem, "", 0);
    if (f != NULL || s->closed || (f = tinker_new_future(t, idem, "", 0)) == NULL) {
        const bool closed = s->closed;
        enum MHD_Result r = f != NULL ? tinker_reply_future(c, f)
                                      : tinker_reply_error(c, closed ? 503 : 500, NULL, "%s",
                                                   closed ? "the server is shutting down" : "out of memory");
        pthread_mutex_unlock(&s->mu);
        serve_job_free(j);
        return r;
    }
    f->sample = true;
    if (json_is_string(sid)) { /* reported to retrieve_futures' poll of (session, seq_id / 1e9) */
        const json_t *seq = json_object_get(root, "seq_id");
        snprintf(f->sess, sizeof f->sess, "%s", json_string_value(sid));
        f->clone = json_is_integer(seq) && json_integer_value(seq) > 0 ? json_integer_value(seq) / 1000000000 : 0;
    }
    if (!ok) {
        serve_utf8_fix(e.msg);
        tinker_complete(f, tinker_failure(e.status >= 500 ? "server" : "user", "%s", e.msg));
        serve_job_free(j);
        pthread_cond_broadcast(&s->cv_done); /* a retrieve_futures poll may be waiting */
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
    enum MHD_Result r = tinker_reply_json(c, 200, json_pack("{s:s,s:o}", "request_id", f->id, "sample_sequence_ids", ids));
    pthread_mutex_unlock(&s->mu);
    return r;
}

/* ---- the router ---------------------------------------------------------------------- */

/* A POST endpoint: its JSON body (an object) and the X-Idempotency-Key. */
typedef enum MHD_Result (*post_fn)(server *s, struct MHD_Connection *c, const char *sub, const json_t *root,
                                   const char *idem);

/* The training verbs (forward_backward, forward, optim_step, save_weights,
 * save_weights_for_sampler, load_weights; sub names it): answered with a
 * future. */
static enum MHD_Result post_submit_(server *s, struct MHD_Connection *c, const char *sub, const json_t *root,
                                    const char *idem) {
    tinker_ticket tk;
    verr e = {0};
    const int st = tinker_submit(s, sub, root, idem, false, &tk, &e);
    if (st != 200) return tinker_reply_error(c, st, e.field[0] ? e.field : NULL, "%s", e.msg);
    return tinker_reply_ticket(c, &tk);
}

/* Chunks of one forward_backward may come in parallel: held requests put
 * them back in seq_id order.  No protobuf, no JWT, plain httpx. */
static enum MHD_Result post_client_config_(server *s, struct MHD_Connection *c, const char *sub,
                                           const json_t *root, const char *idem) {
    (void)s, (void)sub, (void)root, (void)idem;
    json_t *o = json_pack("{s:b,s:i,s:i,s:b,s:b,s:b,s:b,s:b}", "parallel_fwdbwd_chunks", 1,
                          "fwdbwd_max_chunk_len", 1024, "fwdbwd_max_chunk_bytes_count", 5000000,
                          "proto_write_fwdbwd", 0, "proto_compress_fwdbwd", 0, "use_pyqwest_transport", 0,
                          "pjwt_auth_enabled", 0, "create_model_via_load_weights", 0);
    /* Newer SDKs (session_futures_poller.py): one retrieve_futures long poll
     * per sampling client instead of one retrieve_future per sample. */
    json_object_set_new(o, "sample_use_retrieve_futures", json_true());
    return tinker_reply_json(c, 200, o);
}

static enum MHD_Result post_dynamic_config_(server *s, struct MHD_Connection *c, const char *sub,
                                            const json_t *root, const char *idem) {
    (void)s, (void)sub, (void)root, (void)idem;
    /* sample_cancel_enabled: a newer SDK sends cancel_future for a sample it
     * abandons (a timeout, a cancelled task), so the queue drops it. */
    return tinker_reply_json(c, 200, json_pack("{s:i,s:b}", "refresh_interval_sec", 300, "sample_cancel_enabled", 1));
}

static enum MHD_Result post_create_session_(server *s, struct MHD_Connection *c, const char *sub,
                                            const json_t *root, const char *idem) {
    (void)sub, (void)root, (void)idem;
    tinker_state *t = s->tinker;
    pthread_mutex_lock(&s->mu);
    tinker_prune_sessions(t);
    session *x = calloc(1, sizeof *x);
    char why[PATH_MAX + 200];
    int64_t n = 0;
    if (x != NULL && !tinker_runs_next_session(s, &n, why, sizeof why)) {
        pthread_mutex_unlock(&s->mu);
        free(x);
        return tinker_reply_error(c, 500, NULL, "%s", why);
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
    if (x == NULL) return tinker_reply_error(c, 500, NULL, "out of memory");
    char warn[512];
    /* LoRA (what Tinker does): nothing to warn about.  --full-finetune: the SDK logs it. */
    if (!serve_lora(s))
        snprintf(warn, sizeof warn, "zdp serve trains every parameter of one model (\"%s\", --full-finetune): "
                 "a new create_model continues from the current weights and optimizer state", s->opt.model_name);
    return tinker_reply_json(c, 200, json_pack("{s:s,s:s,s:s*}", "session_id", id, "type", "create_session",
                                         "warning_message", serve_lora(s) ? NULL : warn));
}

static enum MHD_Result post_heartbeat_(server *s, struct MHD_Connection *c, const char *sub, const json_t *root,
                                       const char *idem) {
    (void)sub, (void)idem;
    const char *id = json_string_value(json_object_get(root, "session_id"));
    pthread_mutex_lock(&s->mu);
    session *x = id ? tinker_find_session(s->tinker, id) : NULL;
    if (x != NULL) x->seen = serve_now();
    pthread_mutex_unlock(&s->mu);
    return x ? tinker_reply_json(c, 200, json_pack("{s:s}", "type", "session_heartbeat"))
             : tinker_reply_error(c, 404, "session_id", "session_id %s: unknown session", id ? id : "(missing)");
}

static enum MHD_Result post_telemetry_(server *s, struct MHD_Connection *c, const char *sub, const json_t *root,
                                       const char *idem) {
    (void)s, (void)sub, (void)root, (void)idem;
    return tinker_reply_json(c, 200, json_pack("{s:s}", "status", "accepted")); /* dropped */
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
    if (!tinker_envelope(root, &mid, &unused, false, &e)) return tinker_reply_error(c, e.status, e.field, "%s", e.msg);
    const bool unload = !strcmp(sub, "unload_model");
    pthread_mutex_lock(&s->mu);
    tinker_model *m = tinker_find_model(t, mid);
    future *f = NULL;
    zdp_lora_config lc = {0};
    if (m != NULL && unload) {
        f = tinker_find_retry(t, idem, "", 0);
        if (f == NULL && (f = tinker_new_future(t, idem, "", 0)) != NULL) {
            if (!serve_lora(s)) {
                /* --full-finetune: the model detaches; the weights stay in the engine. */
                m->live = false;
                tinker_fail_held(s, m, "user", "the model was unloaded");
                tinker_gone *g = &t->gone[t->n_gone++ % MAX_GONE];
                snprintf(g->model_id, sizeof g->model_id, "%s", mid);
                snprintf(g->why, sizeof g->why, "unload_model was called");
                tinker_complete(f, serve_dump(json_pack("{s:s,s:s}", "model_id", mid, "type", "unload_model")));
            } else if (!tinker_unload(s, m, f, "unload_model was called")) {
                tinker_complete(f, tinker_failure("server", "out of memory"));
            }
        }
    } else if (m != NULL) {
        tinker_touch_model_session(t, m);
        lc = m->lc;
    } else {
        tinker_not_live(t, mid, &e);
    }
    pthread_mutex_unlock(&s->mu);
    if (m == NULL) return tinker_reply_error(c, e.status, e.field, "%s", e.msg);
    if (unload) return f ? tinker_reply_future(c, f) : tinker_reply_error(c, 500, NULL, "out of memory");
    /* tokenizer_id: what the caller named (a model folder's path, "gpt2" for
     * GPT-2's vocabulary), else null: the client brings its own. */
    json_t *o = json_pack("{s:s,s:{s:s,s:s,s:s*},s:b,s:s,s:s}", "model_id", mid, "model_data", "arch",
                          s->opt.lm.arch, "model_name", s->opt.model_name, "tokenizer_id", s->opt.lm.tokenizer_id,
                          "is_lora", lc.rank > 0, "model_name", s->opt.model_name, "type", "get_info");
    json_object_set_new(o, "lora_rank", lc.rank > 0 ? json_integer(lc.rank) : json_null());
    return tinker_reply_json(c, 200, o);
}

/* POST sessions/ID/finish {reason}: ServiceClient.close() and the context
 * manager of newer SDKs.  reason: {"type": "success" | "errored" |
 * "interrupted"} (the SDK's ClientSessionFinishReason; a plain string is
 * taken too, and none is "unspecified").  The session's models are unloaded
 * at once, their checkpoints stay; a second finish answers the same. */
static enum MHD_Result post_finish_(server *s, struct MHD_Connection *c, const char *id, const json_t *root) {
    const json_t *r = json_object_get(root, "reason");
    const json_t *type = json_is_object(r) ? json_object_get(r, "type") : r;
    const char *reason = r == NULL || json_is_null(r) ? "unspecified" : json_string_value(type);
    if (reason == NULL || (strcmp(reason, "unspecified") != 0 && strcmp(reason, "success") != 0 &&
                           strcmp(reason, "errored") != 0 && strcmp(reason, "interrupted") != 0))
        return tinker_reply_error(c, 400, "reason", "reason %s%s%s: send {\"type\": \"success\"}, "
                                  "{\"type\": \"errored\"} or {\"type\": \"interrupted\"}",
                                  reason ? "\"" : "", reason ? reason : "(not a string or {type})", reason ? "\"" : "");
    if (id[0] == '\0' || strchr(id, '/') != NULL)
        return tinker_reply_error(c, 404, "url", "POST /api/v1/sessions/%s/finish: name one session "
                                  "(POST /api/v1/sessions/SESSION_ID/finish)", id);
    json_t *unloaded = NULL;
    verr e = {0};
    pthread_mutex_lock(&s->mu);
    const bool ok = tinker_finish_session(s, id, reason, &unloaded, &e);
    const session *x = ok ? tinker_find_session(s->tinker, id) : NULL;
    char why[16] = "";
    if (x != NULL) snprintf(why, sizeof why, "%s", x->finish_why);
    pthread_mutex_unlock(&s->mu);
    if (!ok) {
        json_decref(unloaded);
        return tinker_reply_error(c, e.status, e.field[0] ? e.field : NULL, "%s", e.msg);
    }
    return tinker_reply_json(c, 200, json_pack("{s:s,s:s,s:s,s:o}", "type", "finish_session", "session_id", id,
                                               "reason", why, "unloaded_models", unloaded));
}

/* POST weights_info {tinker_path}: what create_training_client_from_state
 * recreates the model with (the run's LoRA configuration, from run.json). */
static enum MHD_Result post_weights_info_(server *s, struct MHD_Connection *c, const char *sub,
                                          const json_t *root, const char *idem) {
    (void)sub, (void)idem;
    const json_t *tp = json_object_get(root, "tinker_path");
    if (!json_is_string(tp))
        return tinker_reply_error(c, 400, "tinker_path", "tinker_path: missing or not a string; send the tinker:// path "
                          "save_state returned");
    json_t *rec = tinker_runs_record_of(s, json_string_value(tp));
    if (rec == NULL)
        return tinker_reply_error(c, 404, "tinker_path", "tinker_path \"%s\": no training run of this server's "
                          "--checkpoint-dir has it", json_string_value(tp));
    const json_t *rank = json_object_get(rec, "lora_rank");
    json_t *o = json_pack("{s:s,s:b}", "base_model", s->opt.model_name, "is_lora", json_is_integer(rank));
    json_object_set_new(o, "lora_rank", json_is_integer(rank) ? json_incref((json_t *)rank) : json_null());
    /* WeightsInfoResponse.optimizer_config (SDK 0.3x; AdamW when absent):
     * every zdp run is created with AdamW. */
    json_object_set_new(o, "optimizer_config", json_pack("{s:s}", "type", "adamw"));
    static const char *const flags[3] = {"train_attn", "train_mlp", "train_unembed"};
    for (int k = 0; k < 3; k++) {
        const json_t *v = json_object_get(rec, flags[k]);
        if (json_is_boolean(v)) json_object_set_new(o, flags[k], json_incref((json_t *)v));
    }
    json_decref(rec);
    return tinker_reply_json(c, 200, o);
}

static enum MHD_Result post_sampling_session_(server *s, struct MHD_Connection *c, const char *sub,
                                              const json_t *root, const char *idem) {
    (void)sub, (void)idem;
    return create_sampling_session_(s, c, root);
}

/* POST join_sampling_session {sampling_session_id}: a clone of a sampling
 * client (an unpickled one) asks for its own number; its seq_ids then start
 * at client_counter * 1e9, which is how retrieve_futures tells its
 * completions from the original's (cloned_sampler_id). */
static enum MHD_Result post_join_sampling_session_(server *s, struct MHD_Connection *c, const char *sub,
                                                   const json_t *root, const char *idem) {
    (void)sub, (void)idem;
    const json_t *sid = json_object_get(root, "sampling_session_id");
    if (!json_is_string(sid))
        return tinker_reply_error(c, 400, "sampling_session_id", "sampling_session_id: missing or not a string; "
                                  "send the id create_sampling_session returned");
    pthread_mutex_lock(&s->mu);
    sampling_session *x = (sampling_session *)tinker_find_sampler(s->tinker, json_string_value(sid));
    const int64_t n = x != NULL ? ++x->n_clients : 0;
    pthread_mutex_unlock(&s->mu);
    if (x == NULL)
        return tinker_reply_error(c, 404, "sampling_session_id", "sampling_session_id \"%s\": unknown to this "
                                  "server (create_sampling_session or save_weights_for_sampler makes one)",
                                  json_string_value(sid));
    return tinker_reply_json(c, 200, json_pack("{s:s,s:I}", "type", "join_sampling_session", "client_counter",
                                               (json_int_t)n));
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
    {"retrieve_future", tinker_retrieve},
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
    {"retrieve_futures", tinker_retrieve_many},
    {"cancel_future", tinker_cancel},
    {"join_sampling_session", post_join_sampling_session_},
    {"copy_weights", tinker_copy_weights},
};

/* SDK 0.25: forward_backward (forward_only = true for forward) as protobuf. */
static enum MHD_Result post_proto_(server *s, struct MHD_Connection *c, const char *sub, const char *body,
                                   size_t len) {
    if (strcmp(sub, "forward_backward") != 0 && strcmp(sub, "forward") != 0)
        return tinker_reply_error(c, 415, "Content-Type", "POST /api/v1/%s takes JSON; only forward_backward (and "
                          "forward) take %s", sub, SERVE_PROTO_CONTENT_TYPE);
    char err[600];
    serve_proto_fwdbwd rq;
    if (!serve_proto_decode_fwdbwd((const unsigned char *)body, len, &rq, err, sizeof err)) {
        serve_proto_fwdbwd_free(&rq);
        return tinker_reply_error(c, 400, "body", "the body is not a valid protobuf ForwardBackwardRequest: %s", err);
    }
    /* Posted to forward: a forward, whatever forward_only says. */
    const bool forward = rq.forward_only || !strcmp(sub, "forward");
    const char *idem = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Idempotency-Key");
    tinker_ticket tk;
    verr e = {0};
    const int st = tinker_submit_proto(s, &rq, forward, idem, &tk, &e);
    serve_proto_fwdbwd_free(&rq);
    if (st != 200) return tinker_reply_error(c, st, e.field[0] ? e.field : NULL, "%s", e.msg);
    return tinker_reply_ticket(c, &tk);
}

enum MHD_Result tinker_handle(server *s, struct MHD_Connection *c, const char *sub, const char *method,
                              const char *body, size_t len) {
    if (!strcmp(method, "GET")) {
        if (!strcmp(sub, "healthz")) return serve_healthz(s, c);
        if (!strncmp(sub, "training_runs", 13) || !strcmp(sub, "checkpoints")) return tinker_runs_get(s, c, sub);
        if (!strcmp(sub, "get_server_capabilities"))
            return tinker_reply_json(c, 200, json_pack("{s:[{s:s,s:i}]}", "supported_models", "model_name",
                                                 s->opt.model_name, "max_context_length",
                                                 s->model.block_size));
        return tinker_reply_error(c, 404, "url", "GET /api/v1/%s: no such endpoint (GET healthz, "
                          "get_server_capabilities, training_runs, training_runs/ID, "
                          "training_runs/ID/checkpoints, checkpoints; everything else is POST)", sub);
    }
    if (!strcmp(method, "DELETE")) return tinker_runs_delete(s, c, sub);
    const size_t sub_len = strlen(sub);
    if (!strcmp(method, "PUT") && sub_len > 4 && !strcmp(sub + sub_len - 4, "/ttl"))
        return tinker_runs_set_ttl(s, c, sub, body, len);
    if (strcmp(method, "POST") != 0)
        return tinker_reply_error(c, 405, "method", "%s /api/v1/%s: method not allowed; use POST (GET, DELETE "
                          "and PUT .../ttl for training runs and checkpoints)", method, sub);

    const char *encoding = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Encoding");
    if (encoding != NULL && encoding[0] && !serve_names_type(encoding, "identity"))
        return tinker_reply_error(c, 400, "Content-Encoding",
                          "Content-Encoding: %s: this server takes uncompressed bodies only (its client/config "
                          "says proto_compress_fwdbwd = false)", encoding);
    const char *ctype = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type");
    if (ctype != NULL && serve_names_type(ctype, SERVE_PROTO_CONTENT_TYPE)) return post_proto_(s, c, sub, body, len);

    json_error_t jerr;
    json_t *root = len == 0 ? json_object() : json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL)
        return tinker_reply_error(c, 400, "body", "the body is not valid JSON: %s (line %d, column %d)", jerr.text,
                          jerr.line, jerr.column);
    if (!json_is_object(root)) {
        json_decref(root);
        return tinker_reply_error(c, 400, "body", "the body must be a JSON object");
    }
    const char *idem = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Idempotency-Key");
    enum MHD_Result r = MHD_NO;
    const size_t fin = strlen("/finish");
    if (!strncmp(sub, "sessions/", 9) && sub_len > 9 + fin && !strcmp(sub + sub_len - fin, "/finish")) {
        char id[64];
        snprintf(id, sizeof id, "%.*s", (int)(sub_len - 9 - fin), sub + 9);
        r = post_finish_(s, c, id, root);
        json_decref(root);
        return r;
    }
    size_t i = 0;
    const size_t n = sizeof post_routes_ / sizeof *post_routes_;
    while (i < n && strcmp(sub, post_routes_[i].name) != 0) i++;
    if (i < n)
        r = post_routes_[i].fn(s, c, sub, root, idem);
    else
        r = tinker_reply_error(c, 404, "url", "POST /api/v1/%s: not an endpoint of zdp serve (the Tinker SDK's "
                       "training protocol: client/config, create_session, session_heartbeat, telemetry, "
                       "create_model, get_info, forward_backward, forward, optim_step, retrieve_future, "
                       "save_weights, save_weights_for_sampler, load_weights, unload_model, weights_info, "
                       "create_sampling_session, asample, retrieve_futures, cancel_future, join_sampling_session, "
                       "copy_weights)", sub);
    json_decref(root);
    return r;
}
