/*
 * plain_api.c -- the plain JSON endpoints (docs/server.md): POST
 * /forward_backward /forward /optim_step /save_weights /save_state
 * /load_state /sample, GET /info /healthz.  A connection thread validates the
 * whole body (parse.c, parse_fwd.c), queues the job and waits for its reply:
 * its outcome encoded as JSON (results_json.c, plain_info.c) by encode_,
 * which the main thread runs as the job finishes.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve_impl.h"

typedef struct route {
    const char *path, *method;
    int op;
} route;

static const route routes_[] = {
    {"/forward_backward", "POST", OP_FWDBWD}, {"/forward", "POST", OP_FORWARD},
    {"/optim_step", "POST", OP_OPTIM},        {"/save_weights", "POST", OP_SAVE_WEIGHTS},
    {"/save_state", "POST", OP_SAVE_STATE},   {"/load_state", "POST", OP_LOAD_STATE},
    {"/info", "GET", OP_INFO},                {"/healthz", "GET", -1},
    {"/sample", "POST", OP_SAMPLE},
};
#define N_ROUTES ((int)(sizeof routes_ / sizeof routes_[0]))

/* A finished job's reply, the one encoding of its outcome: the error body,
 * or its typed result as JSON.  NULL when out of memory.  The queue runs it
 * on the main thread as the job finishes (job.encode). */
static char *encode_(server *s, const job *j) {
    if (j->status != 200) return serve_job_error_json(j);
    switch (j->op) {
    case OP_FWDBWD:
    case OP_FORWARD: return j->fwd != NULL ? serve_fwd_result_json(j->fwd) : NULL;
    case OP_OPTIM: return j->has_optim ? serve_optim_result_json(&j->optim, false) : NULL;
    case OP_SAMPLE: return j->sample != NULL ? serve_sample_result_json(j->sample) : NULL;
    case OP_INFO: return j->info != NULL ? serve_info_json(s, j->info) : NULL;
    default: return j->saved != NULL ? serve_save_result_json(j->saved) : NULL; /* the path ops */
    }
}

/* Queues the job and waits for its answer (requests run one at a time, in
 * the order they were queued). */
static enum MHD_Result run_job_(server *s, struct MHD_Connection *c, job *j) {
    if (!serve_run_job(s, j)) return serve_reply_error(c, 503, NULL, "the server is shutting down");
    const int status = j->status;
    char *body = j->body;
    j->body = NULL;
    serve_job_free(j);
    return serve_reply(c, status, body);
}

enum MHD_Result serve_plain_handle(server *s, struct MHD_Connection *c, const char *url, const char *method,
                                   const char *body, size_t len) {
    const route *rt = NULL;
    bool path_known = false;
    for (int i = 0; i < N_ROUTES; i++) {
        if (strcmp(url, routes_[i].path) != 0) continue;
        path_known = true;
        if (strcmp(method, routes_[i].method) == 0) rt = &routes_[i];
    }
    if (rt == NULL && !path_known)
        return serve_reply_error(c, 404, "url", "%s %s: no such endpoint; POST /forward_backward /forward "
                            "/optim_step /save_weights /save_state /load_state /sample, GET /info /healthz, and the "
                            "Tinker SDK's /api/v1/...",
                            method, url);
    if (rt == NULL) {
        const char *want = "POST";
        for (int i = 0; i < N_ROUTES; i++)
            if (strcmp(url, routes_[i].path) == 0) want = routes_[i].method;
        return serve_reply_error(c, 405, "method", "%s %s: method not allowed; use %s", method, url, want);
    }
    if (rt->op < 0) return serve_healthz(s, c);
    /* The plain endpoints train the one model of --full-finetune; LoRA
     * models are the Tinker protocol's (each created by create_model). */
    if (serve_lora(s) && rt->op != OP_INFO && rt->op != OP_SAMPLE)
        return serve_reply_error(c, 400, "url", "%s %s: the plain JSON API trains the one model of a "
                                 "--full-finetune server; this server trains LoRA models through the Tinker "
                                 "API (/api/v1/create_model); restart it with --full-finetune to use %s",
                                 method, url, url);
    job *j = calloc(1, sizeof *j);
    if (j == NULL) return serve_reply_error(c, 500, NULL, "out of memory");
    j->op = rt->op;
    j->encode = encode_;
    j->slot = 0;
    j->uid = s->slots[0].uid; /* --full-finetune: the one model */
    if (rt->op == OP_INFO) return run_job_(s, c, j);

    /* Parse and validate everything before the engine sees anything. */
    json_error_t jerr;
    json_t *root = len == 0 ? json_object()
                                : json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL) {
        serve_job_free(j);
        return serve_reply_error(c, 400, "body", "the body is not valid JSON: %s (line %d, column %d)",
                            jerr.text, jerr.line, jerr.column);
    }
    verr e = {0};
    bool ok;
    if (!json_is_object(root)) {
        ok = serve_bad(&e, 400, "body", "the body must be a JSON object, got %s", zdp_json_type_name(root));
    } else if (rt->op == OP_FWDBWD || rt->op == OP_FORWARD) {
        ok = serve_parse_fwd(root, "", &s->model, j, &e);
    } else if (rt->op == OP_OPTIM) {
        static const char *const keys[] = {"adam_params"};
        ok = serve_only_keys(root, "", keys, 1, &e) &&
             serve_parse_optim(json_object_get(root, "adam_params"), "adam_params", false, j, &e);
    } else if (rt->op == OP_SAMPLE) {
        ok = serve_parse_sample(root, &s->model, s->opt.lm.decode != NULL, s->opt.max_stop_bytes, j, &e);
    } else {
        ok = serve_parse_path(s, root, j, &e);
    }
    json_decref(root);
    if (!ok) {
        serve_job_free(j);
        return serve_reply(c, e.status, serve_error_body(e.field, e.msg));
    }
    return run_job_(s, c, j);
}

