/*
 * parse.c -- the JSON bodies of the plain API's requests and the parts
 * Tinker's share, checked once and turned into a job's payload (job.c
 * documents each layout): optim_step's adam_params, a path op's body, POST
 * /sample, and the stop sequences of a sampling request; and the
 * validation helpers every parser uses (serve_bad, the known-keys checks).
 * A request refused here never reaches the ranks.
 */
#define _POSIX_C_SOURCE 200809L
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve_impl.h"

bool serve_bad(verr *e, int status, const char *field, const char *fmt, ...) {
    e->status = status;
    snprintf(e->field, sizeof e->field, "%s", field);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return false;
}

bool serve_only_name(const char *name, const char *where, const char *const *keys, int n, verr *e) {
    for (int i = 0; i < n; i++)
        if (strcmp(name, keys[i]) == 0) return true;
    char field[512], list[256] = "";
    snprintf(field, sizeof field, "%.300s%s%.200s", where, where[0] ? "." : "", name);
    for (int i = 0; i < n; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", keys[i]);
    return serve_bad(e, 400, field, "%s: unknown field; the fields here are: %s", field, list);
}

/* Every key of object o must be in keys[0..n). */
bool serve_only_keys(const json_t *o, const char *where, const char *const *keys, int n, verr *e) {
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)o, k, v) {
        if (!serve_only_name(k, where, keys, n, e)) return false;
    }
    return true;
}


/* adam_params (Tinker's AdamParams) -> payload: optim_payload.  A field
 * left out keeps the engine's current value, or with tinker_defaults takes
 * AdamParams' default (docs/tinker-protocol.md §1.4: older SDKs leave the last two out). */
bool serve_parse_optim(const json_t *ap, const char *where, bool tinker_defaults, job *j, verr *e) {
    static const double tinker_default[N_ADAM] = {1e-4, 0.9, 0.95, 1e-12, 0.0, 0.0};
    optim_payload p = {0};
    for (int k = 0; k < N_ADAM && tinker_defaults; k++) {
        p.has[k] = 1;
        p.value[k] = tinker_default[k];
    }
    if (ap != NULL && !json_is_null(ap)) {
        if (!json_is_object(ap))
            return serve_bad(e, 400, where, "%s: must be an object, got %s", where, zdp_json_type_name(ap));
        if (!serve_only_keys(ap, where, serve_adam_keys, N_ADAM, e)) return false;
        for (int k = 0; k < N_ADAM; k++) {
            const json_t *v = json_object_get(ap, serve_adam_keys[k]);
            if (v == NULL || json_is_null(v)) continue;
            char field[320];
            snprintf(field, sizeof field, "%s.%s", where, serve_adam_keys[k]);
            if (!json_is_number(v))
                return serve_bad(e, 400, field, "%s: must be a number, got %s", field, zdp_json_type_name(v));
            double x = json_number_value(v);
            /* The library's ranges with the server's caps for a remote
             * client (docs/server.md, "Threat model"), checked on this field
             * alone: the others hold valid stand-ins. */
            zdp_hparams probe = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
            double *dst[N_ADAM] = {&probe.lr, &probe.beta1, &probe.beta2, &probe.eps, &probe.weight_decay,
                                   &probe.gradient_clipping};
            *dst[k] = x;
            zdp_error herr;
            if (zdp_hparams_check_capped(&probe, SERVE_CLIENT_LR_MAX, SERVE_CLIENT_CLIP_MAX, &herr) != ZDP_OK)
                return serve_bad(e, 400, field, "%s: %s", field, herr.msg);
            p.has[k] = 1;
            p.value[k] = x;
        }
    }
    j->payload = malloc(sizeof p);
    if (j->payload == NULL) return serve_bad(e, 500, where, "out of memory");
    memcpy(j->payload, &p, sizeof p);
    j->nbytes = (int64_t)sizeof p;
    return true;
}

bool serve_parse_path(const server *s, const json_t *root, job *j, verr *e) {
    static const char *const keys[] = {"path"};
    if (!serve_only_keys(root, "", keys, 1, e)) return false;
    const json_t *p = json_object_get(root, "path");
    if (p == NULL) return serve_bad(e, 400, "path", "path: missing (a file or directory path on the server)");
    if (!json_is_string(p)) return serve_bad(e, 400, "path", "path: must be a string, got %s", zdp_json_type_name(p));
    size_t n = json_string_length(p);
    const char *name = json_string_value(p);
    if (n == 0 || strlen(name) != n) return serve_bad(e, 400, "path", "path: must be a non-empty string without NUL");
    if (n > 4000) return serve_bad(e, 400, "path", "path: longer than 4000 bytes");
    if (j->op != OP_SAVE_WEIGHTS) {
        /* dir/tag: the tag is the last component. */
        size_t m = n;
        while (m > 0 && name[m - 1] == '/') m--;
        if (m == 0) return serve_bad(e, 400, "path", "path = \"%s\": needs a directory name (DIR/TAG)", name);
    }
    /* A name inside the checkpoint folder (or an absolute path inside a
     * folder the operator allowed); the engine gets the resolved path. */
    char resolved[PATH_MAX + 4096];
    if (!serve_resolve_path(s, "path", name, resolved, sizeof resolved, e)) return false;
    return serve_set_path(s, j, resolved, e);
}

bool serve_parse_stops(const json_t *v, const char *f, int V, bool can_decode, int max_bytes, serve_bytes *ids,
                       serve_bytes *strs, int64_t *n_str, verr *e) {
    if (!json_is_array(v) && !json_is_string(v))
        return serve_bad(e, 400, f, "%s: must be a string, a list of strings or a list of token ids", f);
    const size_t n = json_is_array(v) ? json_array_size(v) : 1;
    if (n > 64) return serve_bad(e, 400, f, "%s: at most 64 stop sequences", f);
    for (size_t k = 0; k < n; k++) {
        const json_t *x = json_is_array(v) ? json_array_get(v, k) : v;
        if (json_is_string(x)) {
            const char *t = json_string_value(x);
            const size_t len = json_string_length(x);
            if (!can_decode)
                return serve_bad(e, 400, f, "%s[%zu]: a string stop needs the model's tokenizer, and this server "
                                 "has none (serve a model folder with its tokenizer, --model-dir); send token "
                                 "ids [id, ...]", f, k);
            if (len == 0 || strlen(t) != len)
                return serve_bad(e, 400, f, "%s[%zu]: must be a non-empty string without NUL", f, k);
            if (len > (size_t)max_bytes)
                return serve_bad(e, 400, f, "%s[%zu]: %zu bytes, more than this server's --max-stop-bytes %d: "
                                 "send a shorter stop string (or start the server with a larger bound)", f, k,
                                 len, max_bytes);
            if (!serve_put(strs, t, len + 1)) return serve_bad(e, 500, f, "out of memory");
            ++*n_str;
        } else if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= V) {
            return serve_bad(e, 400, f, "%s[%zu]: must be a token id in [0, %d) or a string", f, k, V);
        } else {
            int32_t t = (int32_t)json_integer_value(x);
            if (!serve_put(ids, &t, sizeof t)) return serve_bad(e, 500, f, "out of memory");
        }
    }
    return true;
}

bool serve_parse_sample(const json_t *root, const zdp_model *mc, bool can_decode, int max_stop_bytes, job *j,
                        verr *e) {
    static const char *const keys[] = {"prompt", "max_tokens", "temperature", "top_k", "seed", "stop"};
    if (!serve_only_keys(root, "", keys, 6, e)) return false;
    const json_t *p = json_object_get(root, "prompt");
    /* A plain token list, or a Tinker ModelInput {chunks: [{tokens: [...]}]}. */
    if (json_is_object(p)) {
        const json_t *chunks = json_object_get(p, "chunks");
        if (!json_is_array(chunks) || json_array_size(chunks) != 1 ||
            !json_is_array(json_object_get(json_array_get(chunks, 0), "tokens")))
            return serve_bad(e, 400, "prompt.chunks",
                        "prompt.chunks: must hold one encoded_text chunk with \"tokens\"");
        p = json_object_get(json_array_get(chunks, 0), "tokens");
    }
    if (!json_is_array(p) || json_array_size(p) < 1 || json_array_size(p) > 1000000)
        return serve_bad(e, 400, "prompt", "prompt: must be a non-empty array of token ids (or a "
                                      "ModelInput with one chunk)");
    sample_req r = {.n = (int64_t)json_array_size(p), .max_tokens = 16, .temperature = 1.0};
    const char *names[3] = {"max_tokens", "top_k", "seed"};
    int64_t *dst[3] = {&r.max_tokens, &r.top_k, &r.seed};
    const int64_t hi[3] = {4096, 1 << 24, INT64_MAX};
    for (int k = 0; k < 3; k++) {
        const json_t *v = json_object_get(root, names[k]);
        if (v == NULL) continue;
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > hi[k])
            return serve_bad(e, 400, names[k], "%s: must be an integer in [0, %lld]", names[k],
                        (long long)hi[k]);
        *dst[k] = (int64_t)json_integer_value(v);
    }
    /* The KV cache holds the prompt and every new token: both fit the context. */
    if (r.n > mc->block_size)
        return serve_bad(e, 400, "prompt", "prompt: %lld tokens, longer than the model's context (block_size %d)",
                         (long long)r.n, mc->block_size);
    if (json_object_get(root, "max_tokens") == NULL && r.max_tokens > mc->block_size - r.n)
        r.max_tokens = mc->block_size - r.n; /* the default, 16, as far as the context allows */
    if (r.max_tokens > mc->block_size - r.n)
        return serve_bad(e, 400, "max_tokens", "max_tokens: %lld: the prompt's %lld tokens plus max_tokens must fit "
                         "the model's context (block_size %d): send at most %lld", (long long)r.max_tokens,
                         (long long)r.n, mc->block_size, (long long)(mc->block_size - r.n));
    const json_t *t = json_object_get(root, "temperature");
    if (t != NULL && (!json_is_number(t) || !(json_number_value(t) >= 0) || json_number_value(t) > 100))
        return serve_bad(e, 400, "temperature", "temperature: must be a number in [0, 100] (0 = greedy)");
    if (t != NULL) r.temperature = json_number_value(t);
    serve_bytes stops = {0}, strs = {0};
    const json_t *st = json_object_get(root, "stop");
    if (st != NULL && !json_is_null(st) &&
        !serve_parse_stops(st, "stop", mc->vocab_size, can_decode, max_stop_bytes, &stops, &strs, &r.n_stop_str, e)) {
        serve_bytes_free(&stops), serve_bytes_free(&strs);
        return false;
    }
    r.n_stop = (int64_t)(stops.len / sizeof(int32_t));
    /* sample_req; int32 prompt[n]; int32 stop[n_stop]; the stop strings */
    const int64_t head = (int64_t)sizeof r + r.n * (int64_t)sizeof(int32_t);
    j->nbytes = head + (int64_t)stops.len + (int64_t)strs.len;
    j->payload = malloc((size_t)j->nbytes);
    if (j->payload == NULL) {
        serve_bytes_free(&stops), serve_bytes_free(&strs);
        return serve_bad(e, 500, "prompt", "out of memory");
    }
    memcpy(j->payload, &r, sizeof r);
    if (stops.len > 0) memcpy(j->payload + head, stops.p, stops.len);
    if (strs.len > 0) memcpy(j->payload + head + stops.len, strs.p, strs.len);
    serve_bytes_free(&stops), serve_bytes_free(&strs);
    int32_t *tok = (int32_t *)(j->payload + sizeof r);
    for (int64_t i = 0; i < r.n; i++) {
        const json_t *x = json_array_get(p, (size_t)i);
        char field[48];
        snprintf(field, sizeof field, "prompt[%lld]", (long long)i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= mc->vocab_size)
            return serve_bad(e, 400, field, "%s: must be a token id in [0, %d)", field, mc->vocab_size);
        tok[i] = (int32_t)json_integer_value(x);
    }
    return true;
}

