/*
 * results_json.c -- the JSON forms of what the server answers: an error
 * body ({"error": {"message", "field"}}), and each typed result as the plain
 * API sends it, which Tinker's JSON polls share where their shapes are the
 * same (ForwardBackwardOutput, SampleResponse, OptimStepResponse's
 * metrics).  Tinker's own shapes (a save's tinker:// path, its failures)
 * are in tinker/; protobuf is tinker/proto_encode.c's.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve_impl.h"

char *serve_dump(json_t *o) {
    char *s = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(9));
    json_decref(o);
    return s;
}

/* jansson refuses NaN and Inf: they become null. */
json_t *serve_jreal(double x) { return isfinite(x) ? json_real(x) : json_null(); }

char *serve_error_body(const char *field, const char *msg) {
    /* A message cut at a fixed size may end inside a UTF-8 character, and
     * jansson refuses a string that is not UTF-8. */
    char m[1200], f[300];
    snprintf(m, sizeof m, "%s", msg);
    serve_utf8_fix(m);
    if (field != NULL) {
        snprintf(f, sizeof f, "%s", field);
        serve_utf8_fix(f);
    }
    return serve_dump(json_pack("{s:{s:s,s:s?}}", "error", "message", m, "field", field ? f : NULL));
}

char *serve_job_error_json(const job *j) {
    if (j->err_msg[0] == '\0') return NULL; /* no answer at all: out of memory */
    return serve_error_body(j->err_field[0] != '\0' ? j->err_field : NULL, j->err_msg);
}

char *serve_fwd_result_json(const serve_fwd_result *r) {
    json_t *outs = json_array();
    for (int64_t i = 0; outs != NULL && i < r->n; i++) {
        const int64_t len = r->off[i + 1] - r->off[i];
        json_t *lpa = json_array(), *ela = json_array();
        for (int64_t k = r->off[i]; k < r->off[i + 1]; k++) {
            json_array_append_new(lpa, serve_jreal(r->logprobs[k]));
            json_array_append_new(ela, serve_jreal(r->elementwise[k]));
        }
        json_array_append_new(outs, json_pack("{s:{s:o,s:s,s:[I]},s:{s:o,s:s,s:[I]}}", "logprobs", "data", lpa,
                                              "dtype", "float32", "shape", (json_int_t)len, "elementwise_loss",
                                              "data", ela, "dtype", "float32", "shape", (json_int_t)len));
    }
    json_t *metrics = json_pack("{s:o}", "loss:sum", serve_jreal(r->loss_sum));
    return serve_dump(json_pack("{s:s,s:o,s:o}", "loss_fn_output_type", "ArrayRecord", "loss_fn_outputs", outs,
                                "metrics", metrics));
}

char *serve_optim_result_json(const serve_optim_result *r, bool metrics_only) {
    /* Metric keys have exactly one ':' (Tinker's rule). */
    json_t *metrics = json_pack("{s:o,s:o}", "grad_norm:mean", serve_jreal(r->grad_norm), "learning_rate:mean",
                                serve_jreal(r->lr));
    if (metrics_only) return serve_dump(json_pack("{s:o}", "metrics", metrics));
    json_t *warnings = json_array();
    if (r->sgd_warning)
        json_array_append_new(warnings, json_string("the engine's optimizer is SGD (from --config): "
                                                    "adam_params beta1, beta2 and eps have no effect"));
    return serve_dump(json_pack("{s:o,s:I,s:I,s:b,s:o}", "metrics", metrics, "step", (json_int_t)r->step,
                                "global_samples", (json_int_t)r->global_samples, "step_applied", r->step_applied,
                                "warnings", warnings));
}

char *serve_sample_result_json(const serve_sample_result *r) {
    json_t *seqs = json_array();
    for (int64_t i = 0; seqs != NULL && i < r->n; i++) {
        json_t *out = json_array(), *lps = r->logprobs != NULL ? json_array() : NULL;
        for (int64_t k = r->off[i]; k < r->off[i + 1]; k++) {
            json_array_append_new(out, json_integer(r->tokens[k]));
            if (lps != NULL) json_array_append_new(lps, serve_jreal(r->logprobs[k]));
        }
        const char *reason = r->stopped[i] ? "stop" : "length";
        json_array_append_new(seqs, lps != NULL ? json_pack("{s:o,s:o,s:s}", "tokens", out, "logprobs", lps,
                                                            "stop_reason", reason)
                                                : json_pack("{s:o,s:s}", "tokens", out, "stop_reason", reason));
    }
    if (r->prompt_length >= 0)
        return serve_dump(json_pack("{s:o,s:I}", "sequences", seqs, "prompt_length", (json_int_t)r->prompt_length));
    json_t *o = json_pack("{s:o,s:s}", "sequences", seqs, "type", "sample");
    if (o != NULL && r->prompt_logprobs != NULL) { /* Tinker: the first token's is None */
        json_t *pl = json_array();
        for (int64_t t = 0; t < r->n_prompt_logprobs; t++)
            json_array_append_new(pl, serve_jreal(r->prompt_logprobs[t]));
        json_object_set_new(o, "prompt_logprobs", pl);
    }
    if (o != NULL && r->topk_k > 0) { /* SampleResponse.topk_prompt_logprobs: None first */
        json_t *rows = json_array();
        for (int64_t t = 0; t < r->n_topk; t++) {
            json_t *row = t == 0 ? json_null() : json_array();
            for (int64_t k = 0; t > 0 && k < r->topk_k; k++)
                json_array_append_new(row, json_pack("[I,o]", (json_int_t)r->topk_ids[t * r->topk_k + k],
                                                      serve_jreal(r->topk_logprobs[t * r->topk_k + k])));
            json_array_append_new(rows, row);
        }
        json_object_set_new(o, "topk_prompt_logprobs", rows);
    }
    return serve_dump(o);
}

char *serve_save_result_json(const serve_save_result *r) {
    if (r->op == OP_SAVE_STATE || r->op == OP_LOAD_STATE)
        return serve_dump(json_pack("{s:s,s:I,s:I,s:I}", "path", r->path, "step", (json_int_t)r->step,
                                    "global_samples", (json_int_t)r->global_samples, "pending_backwards",
                                    (json_int_t)r->pending_backwards));
    return serve_dump(json_pack("{s:s,s:I}", "path", r->path, "step", (json_int_t)r->step));
}
