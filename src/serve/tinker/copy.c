/*
 * copy.c -- POST copy_weights (newer SDKs' ServiceClient.copy_weights,
 * docs/tinker-protocol.md §1.8): a checkpoint copied into the training run
 * of (session_id, model_seq_id), answered when the copy is on disk with
 * {"tinker_path"} (the SDK's CopyWeightsResponse; no future).  The copy is
 * a job on the queue (OP_COPY_CKPT: every rank copies its own part, as a
 * delete removes it), so it never runs beside a save or delete of the same
 * checkpoint.  The run gets a run.json like create_model's (the source
 * run's LoRA configuration), so weights_info, the training-run routes and
 * create_training_client_from_state see it; no model is loaded.
 */
#define _POSIX_C_SOURCE 200809L
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "tinker/tinker.h"

/* The source run's LoRA configuration, from its run.json (rank 0: a full fine-tune). */
static zdp_lora_config lora_of_(const json_t *rec) {
    zdp_lora_config lc = {0};
    const json_t *rank = json_object_get(rec, "lora_rank");
    if (!json_is_integer(rank) || json_integer_value(rank) < 1) return lc;
    lc.rank = (int)json_integer_value(rank);
    const json_t *alpha = json_object_get(rec, "lora_alpha");
    lc.alpha = json_is_number(alpha) ? (float)json_number_value(alpha) : 0.0f;
    static const struct {
        const char *key;
        int bit;
    } flags[3] = {{"train_attn", ZDP_LORA_ATTN}, {"train_mlp", ZDP_LORA_MLP}, {"train_unembed", ZDP_LORA_UNEMBED}};
    for (int k = 0; k < 3; k++)
        if (json_is_true(json_object_get(rec, flags[k].key))) lc.targets |= flags[k].bit;
    return lc;
}

/* source_path "tinker://RUN/(weights|sampler_weights)/NAME" -> the run id,
 * "weights" or "sampler_weights", and NAME; false when it is not one. */
static bool split_(const char *tp, char *run, size_t rcap, char *kind, size_t kcap, char *name, size_t ncap) {
    static const char pre[] = "tinker://";
    if (strncmp(tp, pre, sizeof pre - 1) != 0) return false;
    const char *id = tp + sizeof pre - 1;
    const char *sw = strstr(id, "/sampler_weights/"), *w = strstr(id, "/weights/");
    const char *mark = sw != NULL ? sw : w;
    if (mark == NULL || mark == id || (size_t)(mark - id) >= rcap) return false;
    snprintf(run, rcap, "%.*s", (int)(mark - id), id);
    snprintf(kind, kcap, "%s", sw != NULL ? "sampler_weights" : "weights");
    snprintf(name, ncap, "%s", mark + strlen(sw != NULL ? "/sampler_weights/" : "/weights/"));
    return tinker_good_name(name);
}

enum MHD_Result tinker_copy_weights(server *s, struct MHD_Connection *c, const char *sub, const json_t *root,
                                    const char *idem) {
    (void)sub, (void)idem;
    const json_t *sid = json_object_get(root, "session_id"), *seq = json_object_get(root, "model_seq_id");
    const json_t *src = json_object_get(root, "source_path"), *ttl = json_object_get(root, "ttl_seconds");
    if (!json_is_string(sid))
        return tinker_reply_error(c, 400, "session_id", "session_id: missing or not a string; send the id "
                                  "create_session returned");
    if (!json_is_integer(seq) || json_integer_value(seq) < 0)
        return tinker_reply_error(c, 400, "model_seq_id", "model_seq_id: must be an integer >= 0 (the training "
                                  "run's slot in the session, as create_model takes it)");
    if (!json_is_string(src))
        return tinker_reply_error(c, 400, "source_path", "source_path: missing or not a string; send a "
                                  "tinker://RUN/weights/NAME or tinker://RUN/sampler_weights/NAME path");
    if (ttl != NULL && !json_is_null(ttl) &&
        !(json_is_integer(ttl) && json_integer_value(ttl) >= 1 && json_integer_value(ttl) <= 100LL * 365 * 86400))
        return tinker_reply_error(c, 400, "ttl_seconds", "ttl_seconds: must be seconds in [1, 100 years], or "
                                  "null for no expiry");
    char run[200], kind[32], name[300];
    if (!split_(json_string_value(src), run, sizeof run, kind, sizeof kind, name, sizeof name))
        return tinker_reply_error(c, 400, "source_path", "source_path \"%s\": not a checkpoint path; send "
                                  "tinker://RUN/weights/NAME or tinker://RUN/sampler_weights/NAME, as save_state "
                                  "and save_weights_for_sampler return them", json_string_value(src));
    pthread_mutex_lock(&s->mu);
    const bool known = tinker_find_session(s->tinker, json_string_value(sid)) != NULL;
    pthread_mutex_unlock(&s->mu);
    if (!known)
        return tinker_reply_error(c, 404, "session_id", "session_id %s: unknown session", json_string_value(sid));

    /* The source on disk, relative to the checkpoint folder. */
    char src_dir[200], src_rel[700], dst_model[200], dst_dir[200], dst_rel[700], full[PATH_MAX + 800];
    tinker_model_dir(run, src_dir, sizeof src_dir);
    const bool sampler = !strcmp(kind, "sampler_weights");
    verr e = {0};
    if (sampler ? !tinker_sampler_rel(s, src_dir, name, src_rel, sizeof src_rel)
                : snprintf(src_rel, sizeof src_rel, "%s/%s", src_dir, name) >= (int)sizeof src_rel)
        return tinker_reply_error(c, 400, "source_path", "source_path: too long");
    json_t *rec = tinker_runs_record_of(s, json_string_value(src));
    struct stat sb;
    if (rec == NULL || !serve_resolve_path(s, "source_path", src_rel, full, sizeof full, &e) || lstat(full, &sb) != 0) {
        json_decref(rec);
        if (e.status != 0) return tinker_reply_error(c, e.status, e.field, "%s", e.msg);
        return tinker_reply_error(c, 404, "source_path", "source_path \"%s\": no such checkpoint in this server's "
                                  "--checkpoint-dir (list_checkpoints names them)", json_string_value(src));
    }
    const zdp_lora_config lc = lora_of_(rec);
    json_decref(rec);

    /* The destination: NAME in run SESSION:train:SEQ, kept if there. */
    snprintf(dst_model, sizeof dst_model, "%.150s:train:%lld", json_string_value(sid),
             (long long)json_integer_value(seq));
    tinker_model_dir(dst_model, dst_dir, sizeof dst_dir);
    snprintf(dst_rel, sizeof dst_rel, "%s%s", dst_dir, src_rel + strlen(src_dir));
    if (!serve_resolve_path(s, "source_path", dst_rel, full, sizeof full, &e))
        return tinker_reply_error(c, e.status, e.field, "%s", e.msg);
    if (lstat(full, &sb) == 0)
        return tinker_reply_error(c, 409, "source_path", "run %s already has a checkpoint %s/%s: copy_weights does "
                                  "not overwrite (delete it first, or copy into another model_seq_id)", dst_model,
                                  kind, name);
    char why[PATH_MAX + 200];
    pthread_mutex_lock(&s->mu);
    const bool recorded = tinker_runs_record(s, dst_model, dst_dir, lc.rank > 0 ? &lc : NULL, why, sizeof why);
    pthread_mutex_unlock(&s->mu);
    if (!recorded) return tinker_reply_error(c, 500, NULL, "%s", why);

    job *j = calloc(1, sizeof *j);
    const size_t a = strlen(src_rel) + 1, b = strlen(dst_rel) + 1;
    if (j == NULL || (j->payload = malloc(a + b)) == NULL) {
        free(j);
        return tinker_reply_error(c, 500, NULL, "out of memory");
    }
    memcpy(j->payload, src_rel, a);
    memcpy(j->payload + a, dst_rel, b);
    j->nbytes = (int64_t)(a + b);
    j->op = OP_COPY_CKPT;
    if (!serve_run_job(s, j)) return tinker_reply_error(c, 503, NULL, "the server is shutting down");
    const int status = j->status;
    char tp[600];
    snprintf(tp, sizeof tp, "tinker://%s/%s/%s", dst_model, kind, name);
    /* The source's expiry is not inherited (CopyWeightsRequest.ttl_seconds). */
    if (status == 200 && json_is_integer(ttl)) {
        pthread_mutex_lock(&s->mu);
        tinker_runs_set_expiry(s, tp, (double)time(NULL) + (double)json_integer_value(ttl));
        pthread_mutex_unlock(&s->mu);
    }
    if (status != 200) {
        char *body = serve_job_error_json(j);
        serve_job_free(j);
        return serve_reply(c, status, body);
    }
    serve_job_free(j);
    return tinker_reply_json(c, 200, json_pack("{s:s}", "tinker_path", tp));
}
