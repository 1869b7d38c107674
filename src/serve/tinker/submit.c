/*
 * submit.c -- a Tinker request into a job (docs/tinker-protocol.md):
 * the envelope (model_id, seq_id) shared by JSON and protobuf, the job of
 * each training verb (its body parsed by the plain API's parsers where the
 * shapes are the same: parse_fwd.c, parse.c), its future and its place in
 * the model's seq_id order (held until every smaller seq_id was queued),
 * asample's job, and a LoRA configuration.
 *
 * Retries.  The SDK retries a POST whose answer it did not get, with the same
 * X-Idempotency-Key inside one call and a new one across its outer retry
 * loop.  Either key, or the same (model_id, seq_id), gets the first request's
 * request_id back and nothing runs twice.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "tinker/proto.h"
#include "tinker/tinker.h"

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
bool tinker_envelope(const json_t *root, const char **model_id, int64_t *seq, bool need_seq, verr *e) {
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

/* A non-AdamW optimizer (type, at field) refused by name. */
static bool optimizer_refused_(const json_t *type, const char *field, verr *e) {
    if (!json_is_string(type))
        return serve_bad(e, 400, field, "%s: must be a string naming the optimizer, got %s; zdp serve "
                         "supports \"adamw\"", field, zdp_json_type_name(type));
    char shown[68];
    size_t n = 0;
    for (const char *t = json_string_value(type); *t != '\0' && n < 64; t++)
        shown[n++] = *t >= 0x20 && *t < 0x7f && *t != '"' ? *t : '?';
    shown[n] = '\0';
    if (!strcmp(json_string_value(type), "dimuon"))
        return serve_bad(e, 400, field, "%s = \"dimuon\": the Dimuon optimizer is not implemented in zdp "
                         "serve; \"adamw\" is the one supported (create the model with "
                         "optimizer_config {\"type\": \"adamw\"}, the SDK's default, and step it with "
                         "AdamParams)", field);
    return serve_bad(e, 400, field, "%s = \"%s\": unknown optimizer; \"adamw\" is the one zdp serve "
                     "supports (send {\"type\": \"adamw\"}, the SDK's default)", field, shown);
}

bool tinker_parse_optimizer_config(const json_t *oc, verr *e) {
    if (oc == NULL || json_is_null(oc)) return true;
    if (!json_is_object(oc))
        return serve_bad(e, 400, "optimizer_config", "optimizer_config: must be an object like "
                         "{\"type\": \"adamw\"}, got %s", zdp_json_type_name(oc));
    const json_t *type = json_object_get(oc, "type");
    if (type == NULL)
        return serve_bad(e, 400, "optimizer_config.type", "optimizer_config.type: missing; send "
                         "{\"type\": \"adamw\"}");
    if (!json_is_string(type) || strcmp(json_string_value(type), "adamw") != 0)
        return optimizer_refused_(type, "optimizer_config.type", e);
    static const char *const keys[] = {"type"}; /* AdamOptimizerConfig has no other field */
    return serve_only_keys(oc, "optimizer_config", keys, 1, e);
}

/* optim_step's hyperparameters -> j's payload.  The SDK sends AdamParams as
 * adam_params (every version; from 0.3x its OptimStepRequest.optim_params is
 * written under that key for AdamParams) and another family's params, tagged
 * by "type" (DimuonParams: "dimuon"), as optimizer_params; its model also
 * reads optim_params.  One of the three, as the SDK's optim_step takes
 * optim_params or adam_params but not both (docs/tinker-protocol.md §1.4). */
static bool optim_params_(const json_t *root, job *j, verr *e) {
    static const char *const keys[3] = {"adam_params", "optim_params", "optimizer_params"};
    const char *name = NULL;
    const json_t *ap = NULL;
    for (int k = 0; k < 3; k++) {
        const json_t *v = json_object_get(root, keys[k]);
        if (v == NULL || json_is_null(v)) continue;
        if (name != NULL)
            return serve_bad(e, 400, keys[k], "%s and %s: both sent; send one (AdamParams as adam_params)", name,
                             keys[k]);
        name = keys[k];
        ap = v;
    }
    if (name == NULL)
        return serve_bad(e, 400, "adam_params", "adam_params: missing; must be {learning_rate, beta1, beta2, "
                         "eps, weight_decay, grad_clip_norm} (or optim_params holding AdamParams)");
    if (!json_is_object(ap))
        return serve_bad(e, 400, name, "%s: not an object, got %s; must be {learning_rate, beta1, beta2, eps, "
                         "weight_decay, grad_clip_norm}", name, zdp_json_type_name(ap));
    const json_t *type = json_object_get(ap, "type");
    if (type == NULL) return serve_parse_optim(ap, name, true, j, e);
    char field[64];
    snprintf(field, sizeof field, "%s.type", name);
    if (!json_is_string(type) || strcmp(json_string_value(type), "adamw") != 0)
        return optimizer_refused_(type, field, e);
    /* An explicit "adamw" tag on AdamParams' fields: the fields alone. */
    json_t *fields = json_copy((json_t *)ap);
    if (fields == NULL) return serve_bad(e, 500, name, "out of memory");
    json_object_del(fields, "type");
    const bool ok = serve_parse_optim(fields, name, true, j, e);
    json_decref(fields);
    return ok;
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
        return optim_params_(root, j, e);
    }
    tinker_model_dir(model_id, mdir, sizeof mdir);
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
        if (!tinker_parse_optimizer_config(json_object_get(root, "optimizer_config"), e)) return false;
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
        tinker_model_dir(owner, odir, sizeof odir);
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

/* ---- seq_id order (s->mu held) ------------------------------------------------------ */

/* A model's requests carry seq_id 1, 2, 3, ...  The SDK posts the chunks of
 * one forward_backward in parallel with the first chunk last, so they
 * arrive out of order: a request waits in `held` until every smaller seq_id
 * has been queued.  A request refused before the engine (a validation
 * error) still uses up its seq_id, as the client's counter moves on; a
 * seq_id that never arrives is given up after --seq-gap-seconds. */

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

void tinker_hold(server *s, tinker_model *m, job *j) {
    job **pp = &m->held;
    while (*pp != NULL && (*pp)->seq_id < j->seq_id) pp = &(*pp)->next;
    j->next = *pp;
    *pp = j;
    release_(s, m);
}

/* Fails every held request of m with msg (shutdown, a replaced or unloaded model). */
void tinker_fail_held(server *s, tinker_model *m, const char *category, const char *msg) {
    for (job *j = m->held, *n; j != NULL; j = n) {
        n = j->next;
        if (j->op != OP_NOOP) tinker_complete(j->fut, tinker_failure(category, "%s", msg));
        serve_job_free(j);
    }
    m->held = NULL;
    pthread_cond_broadcast(&s->cv_done);
}

bool tinker_expire_gap(server *s, tinker_model *m, double now) {
    if (m->held == NULL) return false;
    double oldest = m->held->arrived;
    for (job *j = m->held; j != NULL; j = j->next)
        if (j->arrived < oldest) oldest = j->arrived;
    if (now - oldest < s->opt.seq_gap_s) return false;
    fprintf(stderr,
            "zdp serve: warning: model %s: seq_id %lld..%lld never arrived within %g s "
            "(--seq-gap-seconds); running seq_id %lld and later without them\n",
            m->model_id, (long long)m->next_seq, (long long)m->held->seq_id - 1, s->opt.seq_gap_s,
            (long long)m->held->seq_id);
    m->next_seq = m->held->seq_id;
    return release_(s, m);
}

/* A built job (valid: else refused with why) onto model_id's order: its
 * future, or a retry's first one. */
static int queue_job_(server *s, const char *model_id, int64_t seq, job *j, bool valid, const verr *why,
                      const char *idem, bool proto, tinker_ticket *out, verr *e) {
    tinker_state *t = s->tinker;
    pthread_mutex_lock(&s->mu);
    future *f = tinker_find_retry(t, idem, model_id, seq);
    if (f != NULL) { /* a retry: the first one's answer */
        tinker_ticket_of(f, out);
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
    tinker_model *m = tinker_find_model(t, model_id);
    if (m == NULL) {
        tinker_not_live(t, model_id, e);
        pthread_mutex_unlock(&s->mu);
        serve_job_free(j);
        return e->status;
    }
    f = tinker_new_future(t, idem, model_id, seq);
    if (f == NULL) {
        pthread_mutex_unlock(&s->mu);
        serve_job_free(j);
        return serve_bad(e, 500, "", "out of memory"), 500;
    }
    f->proto = proto;
    if (seq < m->next_seq) {
        tinker_complete(f, tinker_failure("user", "seq_id %lld of model %s arrived after seq_id %lld had run "
                              "(it was missing for more than --seq-gap-seconds = %g s); it was not applied",
                              (long long)seq, model_id, (long long)m->next_seq - 1, s->opt.seq_gap_s));
        serve_job_free(j);
    } else {
        tinker_touch_model_session(t, m);
        j->slot = m->slot;
        j->uid = m->uid;
        if (!valid) {
            /* Refused, but it keeps its place: later seq_ids wait for it. */
            tinker_complete(f, tinker_failure(why->status >= 500 ? "server" : "user", "%s", why->msg));
            free(j->payload);
            j->payload = NULL;
            j->nbytes = 0;
            j->op = OP_NOOP;
        } else {
            j->fut = f;
        }
        j->seq_id = seq;
        j->arrived = serve_now();
        tinker_hold(s, m, j);
    }
    pthread_cond_broadcast(&s->cv_done);
    tinker_ticket_of(f, out);
    pthread_mutex_unlock(&s->mu);
    return 200;
}

/* POST forward_backward, forward, optim_step, save_weights,
 * save_weights_for_sampler, load_weights: answered with a future. */
int tinker_submit(server *s, const char *verb, const json_t *root, const char *idem, bool proto,
                  tinker_ticket *out, verr *e) {
    const char *model_id;
    int64_t seq;
    if (!tinker_envelope(root, &model_id, &seq, true, e)) return e->status;

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

/* lora_config (Tinker's LoraConfig: rank, seed, train_mlp, train_attn,
 * train_unembed; and zdp's alpha, PEFT's lora_alpha, default 32) -> *lc;
 * rank 0 (or no lora_config): a full fine-tune.  false with e set. */
bool tinker_parse_lora(const json_t *lora, zdp_lora_config *lc, bool *seeded, verr *e) {
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

/* ---- sampling (create_sampling_session, asample) --------------------------------------- */

/* The weights file behind a tinker:// path: .../sampler_weights/NAME is a
 * sampler file, .../weights/NAME a checkpoint's model.safetensors. */
bool tinker_weights_file(const server *s, const char *tinker_path, char *out, size_t cap, verr *e,
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
        tinker_model_dir(owner, odir, sizeof odir);
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
bool tinker_base_file(const server *s, const json_t *base, char *out, size_t cap, verr *e) {
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

/* asample's body -> an OP_SAMPLE_FILE job (file: the weights to read). */
bool tinker_sample_job(server *s, const json_t *root, const char *file, job *j, verr *e) {
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
