/*
 * parse_fwd.c -- a forward/forward_backward request, checked once, in two
 * steps: its JSON is decoded into the typed request of fwd_input.h (only
 * JSON's own checks: types, unknown keys), which tinker/proto_decode.c also decodes
 * protobuf into, and serve_fwd_build checks the content of either (one set
 * of checks and messages) and lays out the job's payload (job.c reads it
 * back).  Nothing here touches the engine or MPI.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve_impl.h"

/* ---- forward/forward_backward from JSON: its format's checks alone ---------------- */

/* "where.rest", or "rest" when where is empty. */
static const char *at_(char *buf, size_t cap, const char *where, const char *rest) {
    snprintf(buf, cap, "%s%s%s", where, where[0] ? "." : "", rest);
    return buf;
}

static bool oom_(verr *e, const char *field) { return serve_bad(e, 500, field, "out of memory"); }

/* A JSON array of numbers -> ints and reals (n of each, in a), noting the
 * first value that is not an integer and the first that is not a number. */
static bool json_numbers_(serve_arena *a, const json_t *arr, const char *field, int64_t *n, const int64_t **ints,
                          const double **reals, serve_odd *not_int, serve_odd *not_num, verr *e) {
    const size_t m = json_array_size(arr);
    int64_t *iv = serve_arena_alloc(a, (m + 1) * sizeof *iv);
    double *rv = reals != NULL ? serve_arena_alloc(a, (m + 1) * sizeof *rv) : NULL;
    if (iv == NULL || (reals != NULL && rv == NULL)) return oom_(e, field);
    *not_int = (serve_odd){-1, NULL};
    if (not_num != NULL) *not_num = (serve_odd){-1, NULL};
    for (size_t i = 0; i < m; i++) {
        const json_t *x = json_array_get(arr, i);
        if (json_is_integer(x)) iv[i] = (int64_t)json_integer_value(x);
        else if (not_int->at < 0) *not_int = (serve_odd){(int64_t)i, zdp_json_type_name(x)};
        if (rv != NULL) {
            if (json_is_number(x)) rv[i] = json_number_value(x);
            else if (not_num->at < 0) *not_num = (serve_odd){(int64_t)i, zdp_json_type_name(x)};
        }
    }
    *n = (int64_t)m;
    *ints = iv;
    if (reals != NULL) *reals = rv;
    return true;
}

/* A loss_fn_inputs tensor: a plain JSON array, or Tinker's TensorData
 * {data, dtype, shape}. */
static bool json_tensor_(serve_arena *a, const json_t *v, const char *path, serve_tensor_in *t, verr *e) {
    char field[640];
    const json_t *arr = v;
    char data_path[600];
    snprintf(data_path, sizeof data_path, "%s", path);
    if (json_is_object(v)) {
        t->tensor_data = true;
        static const char *const keys[] = {"data", "dtype", "shape", "sparse_crow_indices",
                                           "sparse_col_indices"};
        if (!serve_only_keys(v, path, keys, 5, e)) return false;
        if (json_object_get(v, "sparse_crow_indices") || json_object_get(v, "sparse_col_indices")) {
            t->sparse = true; /* refused by serve_fwd_build; nothing else is read */
            return true;
        }
        arr = json_object_get(v, "data");
        snprintf(data_path, sizeof data_path, "%s.data", path);
        if (arr == NULL) return serve_bad(e, 400, data_path, "%s: missing (TensorData needs data)", data_path);
        const json_t *dt = json_object_get(v, "dtype");
        snprintf(field, sizeof field, "%s.dtype", path);
        if (dt != NULL) {
            if (!json_is_string(dt))
                return serve_bad(e, 400, field, "%s: must be a string, got %s", field, zdp_json_type_name(dt));
            t->dtype = json_string_value(dt);
        }
        const json_t *sh = json_object_get(v, "shape");
        snprintf(field, sizeof field, "%s.shape", path);
        if (sh != NULL && !json_is_null(sh)) {
            if (!json_is_array(sh))
                return serve_bad(e, 400, field, "%s: must be [N] (1-D tensors only), got %s", field,
                                 zdp_json_type_name(sh));
            t->n_shape = (int)(json_array_size(sh) < 64 ? json_array_size(sh) : 64);
            for (size_t k = 0; k < json_array_size(sh); k++)
                if (!json_is_integer(json_array_get(sh, k))) t->n_shape = -1;
            if (t->n_shape == 0) t->n_shape = -1; /* [] is not "not given" */
            if (t->n_shape >= 1) t->shape0 = (int64_t)json_integer_value(json_array_get(sh, 0));
        }
    }
    if (!json_is_array(arr))
        return serve_bad(e, 400, data_path, "%s: must be an array of numbers or TensorData, got %s", data_path,
                         zdp_json_type_name(arr));
    return json_numbers_(a, arr, data_path, &t->n, &t->ints, &t->reals, &t->not_int, &t->not_num, e);
}

/* A datum's model_input {chunks: [{type: "encoded_text", tokens}...]}. */
static bool json_model_input_(serve_arena *a, const json_t *d, const char *path, serve_datum_in *out, verr *e) {
    char field[512];
    const json_t *mi = json_object_get(d, "model_input");
    snprintf(field, sizeof field, "%s.model_input", path);
    if (!json_is_object(mi))
        return serve_bad(e, 400, field, "%s: %s; must be {\"chunks\": [...]}", field,
                         mi ? "not an object" : "missing");
    static const char *const mkeys[] = {"chunks"};
    if (!serve_only_keys(mi, field, mkeys, 1, e)) return false;
    const json_t *chunks = json_object_get(mi, "chunks");
    if (!json_is_array(chunks)) return true; /* no chunks: refused by serve_fwd_build */
    const size_t n = json_array_size(chunks);
    out->chunks = serve_arena_alloc(a, (n + 1) * sizeof *out->chunks);
    if (out->chunks == NULL) return oom_(e, field);
    out->n_chunks = (int64_t)n;
    for (size_t c = 0; c < n; c++) {
        const json_t *ch = json_array_get(chunks, c);
        serve_chunk_in *k = &out->chunks[c];
        char cpath[448];
        snprintf(cpath, sizeof cpath, "%s.model_input.chunks[%zu]", path, c);
        if (!json_is_object(ch))
            return serve_bad(e, 400, cpath, "%s: must be an object, got %s", cpath, zdp_json_type_name(ch));
        const json_t *ty = json_object_get(ch, "type");
        if (ty != NULL) {
            k->type = json_is_string(ty) ? json_string_value(ty) : "";
            if (json_is_string(ty)) {
                char *label = serve_arena_alloc(a, strlen(k->type) + 3);
                if (label == NULL) return oom_(e, cpath);
                sprintf(label, "\"%s\"", k->type);
                k->type_label = label;
            } else {
                k->type_label = zdp_json_type_name(ty);
            }
            if (strcmp(k->type, "encoded_text") != 0) continue; /* refused by serve_fwd_build */
        }
        static const char *const ckeys[] = {"type", "tokens"};
        if (!serve_only_keys(ch, cpath, ckeys, 2, e)) return false;
        const json_t *tk = json_object_get(ch, "tokens");
        snprintf(field, sizeof field, "%s.tokens", cpath);
        if (!json_is_array(tk))
            return serve_bad(e, 400, field, "%s: must be an array of token ids, got %s", field,
                             tk ? zdp_json_type_name(tk) : "nothing");
        if (!json_numbers_(a, tk, field, &k->n, &k->tokens, NULL, &k->not_int, NULL, e)) return false;
    }
    return true;
}

/* {data: [Datum...], loss_fn, loss_fn_config} -> in. */
static bool json_fwd_(const json_t *root, const char *where, serve_fwd_in *in, verr *e) {
    serve_arena *a = &in->arena;
    char data_path[320], lf_path[320], lc_path[320];
    at_(data_path, sizeof data_path, where, "data");
    at_(lf_path, sizeof lf_path, where, "loss_fn");
    at_(lc_path, sizeof lc_path, where, "loss_fn_config");
    static const char *const keys[] = {"data", "loss_fn", "loss_fn_config"};
    if (!serve_only_keys(root, where, keys, 3, e)) return false;

    const json_t *lf = json_object_get(root, "loss_fn");
    if (lf != NULL && !json_is_string(lf))
        return serve_bad(e, 400, lf_path, "%s: must be a string, got %s", lf_path, zdp_json_type_name(lf));
    in->loss_fn = lf != NULL ? json_string_value(lf) : NULL;
    const json_t *lc = json_object_get(root, "loss_fn_config");
    if (lc != NULL && !json_is_null(lc)) {
        if (!json_is_object(lc))
            return serve_bad(e, 400, lc_path, "%s: must be an object, got %s", lc_path, zdp_json_type_name(lc));
        const size_t m = json_object_size(lc);
        const char **ks = serve_arena_alloc(a, (m + 1) * sizeof *ks);
        double *vs = serve_arena_alloc(a, (m + 1) * sizeof *vs);
        const char **ts = serve_arena_alloc(a, (m + 1) * sizeof *ts);
        if (ks == NULL || vs == NULL || ts == NULL) return oom_(e, lc_path);
        const char *k;
        json_t *v;
        size_t i = 0;
        json_object_foreach((json_t *)lc, k, v) {
            ks[i] = k;
            /* A string is the SDK's text value (loss_fn_config is
             * {str: float | str} from 0.26 on), refused by name below. */
            ts[i] = json_is_string(v) ? json_string_value(v) : NULL;
            vs[i++] = json_is_number(v) ? json_number_value(v) : NAN; /* NaN: refused as not a number */
        }
        in->n_config = (int64_t)m;
        in->config_keys = ks;
        in->config_values = vs;
        in->config_texts = ts;
    }

    const json_t *data = json_object_get(root, "data");
    if (data == NULL) return serve_bad(e, 400, data_path, "%s: missing (an array of datums)", data_path);
    if (!json_is_array(data))
        return serve_bad(e, 400, data_path, "%s: must be an array, got %s", data_path, zdp_json_type_name(data));
    const size_t n = json_array_size(data);
    if (n > (1u << 24)) return serve_bad(e, 400, data_path, "%s: %zu datums is too many", data_path, n);
    in->data = serve_arena_alloc(a, (n + 1) * sizeof *in->data);
    if (in->data == NULL) return oom_(e, data_path);
    in->n = (int64_t)n;
    char path[384], field[512];
    for (size_t i = 0; i < n; i++) {
        const json_t *d = json_array_get(data, i);
        serve_datum_in *di = &in->data[i];
        snprintf(path, sizeof path, "%s[%zu]", data_path, i);
        if (!json_is_object(d))
            return serve_bad(e, 400, path, "%s: must be an object {model_input, loss_fn_inputs}, got %s", path,
                             zdp_json_type_name(d));
        static const char *const dkeys[] = {"model_input", "loss_fn_inputs"};
        if (!serve_only_keys(d, path, dkeys, 2, e)) return false;
        if (!json_model_input_(a, d, path, di, e)) return false;
        const json_t *li = json_object_get(d, "loss_fn_inputs");
        if (!json_is_object(li)) {
            di->n_inputs = li == NULL ? -1 : -2; /* refused by serve_fwd_build, which names the inputs */
            continue;
        }
        snprintf(field, sizeof field, "%s.loss_fn_inputs", path);
        di->inputs = serve_arena_alloc(a, (json_object_size(li) + 1) * sizeof *di->inputs);
        if (di->inputs == NULL) return oom_(e, field);
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)li, k, v) {
            serve_tensor_in *t = &di->inputs[di->n_inputs++];
            t->name = k;
            t->absent = json_is_null(v);
            if (t->absent) continue;
            char tpath[576];
            snprintf(tpath, sizeof tpath, "%s.%s", field, k);
            if (!json_tensor_(a, v, tpath, t, e)) return false;
        }
    }
    return true;
}

/* ---- forward/forward_backward: the checks, whatever the format ----------------------- */

/* The loss of a forward/forward_backward: Tinker's names, the loss_fn_inputs
 * each one reads, and its loss_fn_config keys (docs/tinker-protocol.md §2). */
typedef struct loss_spec {
    const char *name;
    const char *inputs[3]; /* [0] is always target_tokens */
    int n_inputs;
    bool optional_last;    /* cross_entropy: weights may be left out (all 1) */
    const char *config[2];
    int n_config;
} loss_spec;

static const loss_spec losses_[N_LOSSES] = {
    [ZDP_LOSS_CROSS_ENTROPY] = {"cross_entropy", {"target_tokens", "weights"}, 2, true, {0}, 0},
    [ZDP_LOSS_IMPORTANCE_SAMPLING] = {"importance_sampling", {"target_tokens", "logprobs", "advantages"},
                                  3, false, {0}, 0},
    [ZDP_LOSS_PPO] = {"ppo", {"target_tokens", "logprobs", "advantages"}, 3, false,
                  {"clip_low_threshold", "clip_high_threshold"}, 2},
    [ZDP_LOSS_CISPO] = {"cispo", {"target_tokens", "logprobs", "advantages"}, 3, false,
                    {"clip_low_threshold", "clip_high_threshold"}, 2},
    [ZDP_LOSS_DRO] = {"dro", {"target_tokens", "logprobs", "advantages"}, 3, false, {"beta"}, 1},
};

/* Where a float input goes in the payload (weights, logprobs, advantages). */
static int float_slot_(const char *input) {
    return !strcmp(input, "weights") ? 0 : !strcmp(input, "logprobs") ? 1 : 2;
}

/* loss_fn and loss_fn_config -> h (the loss and its options; no datums yet).
 * need_loss: forward_backward must name its loss, forward may leave it out. */
static bool check_loss_(const serve_fwd_in *in, const char *where, bool need_loss, fwd_header *out, verr *e) {
    char lf_path[320], lc_path[320];
    at_(lf_path, sizeof lf_path, where, "loss_fn");
    at_(lc_path, sizeof lc_path, where, "loss_fn_config");
    fwd_header h = {.loss = ZDP_LOSS_CROSS_ENTROPY, .clip_low = 0.8, .clip_high = 1.2, .beta = NAN};
    if (in->loss_fn == NULL && need_loss)
        return serve_bad(e, 400, lf_path, "%s: missing; send \"cross_entropy\" (or importance_sampling, "
                         "ppo, cispo, dro)", lf_path);
    if (in->loss_fn != NULL) {
        h.loss = -1;
        for (int k = 0; k < N_LOSSES; k++)
            if (!strcmp(in->loss_fn, losses_[k].name)) h.loss = k;
        if (h.loss < 0)
            return serve_bad(e, 400, lf_path, "%s = \"%s\": unknown loss; the losses are cross_entropy, "
                             "importance_sampling, ppo, cispo, dro", lf_path, in->loss_fn);
    }
    const loss_spec *ls = &losses_[h.loss];
    if (ls->n_config == 0 && in->n_config > 0)
        return serve_bad(e, 400, lc_path, "%s: %s takes no options; leave it out or send {}", lc_path, ls->name);
    bool have_beta = false;
    for (int64_t i = 0; i < in->n_config; i++)
        if (!serve_only_name(in->config_keys[i], lc_path, ls->config, ls->n_config, e)) return false;
    for (int64_t i = 0; i < in->n_config; i++) {
        const char *k = in->config_keys[i];
        const double x = in->config_values[i];
        char f[400];
        snprintf(f, sizeof f, "%s.%s", lc_path, k);
        if (in->config_texts != NULL && in->config_texts[i] != NULL) {
            /* The value shown as printable ASCII (a cut never splits a
             * UTF-8 sequence of the message). */
            char shown[84];
            size_t n = 0;
            for (const char *t = in->config_texts[i]; *t != '\0' && n < 80; t++)
                shown[n++] = *t >= 0x20 && *t < 0x7f && *t != '"' ? *t : '?';
            shown[n] = '\0';
            return serve_bad(e, 400, f, "%s = \"%s\": a text value; %s's options are numbers (send a finite "
                             "number >= 0)", f, shown, ls->name);
        }
        if (!isfinite(x) || x < 0) return serve_bad(e, 400, f, "%s: must be a finite number >= 0", f);
        if (x > 1e6) return serve_bad(e, 400, f, "%s = %g: must be <= 1e6", f, x);
        if (!strcmp(k, "clip_low_threshold")) h.clip_low = x;
        else if (!strcmp(k, "clip_high_threshold")) h.clip_high = x;
        else h.beta = x, have_beta = true;
    }
    if (h.loss == ZDP_LOSS_DRO && !have_beta)
        return serve_bad(e, 400, lc_path, "%s.beta: missing; dro needs beta (the weight of "
                         "0.5 * (logprob - sampler logprob)^2)", lc_path);
    if (h.clip_low > 1.0 || h.clip_high < 1.0)
        return serve_bad(e, 400, lc_path, "%s: clip_low_threshold = %g and clip_high_threshold = %g "
                         "are ratio bounds and must satisfy low <= 1 <= high (defaults 0.8, 1.2)",
                         lc_path, h.clip_low, h.clip_high);
    *out = h;
    return true;
}

/* A datum's model_input -> dst[0..*n) (1 to T tokens, each in [0, V)).
 * path: the datum's JSON path. */
static bool check_model_input_(const serve_datum_in *d, const char *path, int T, int V, int32_t *dst, int64_t *n,
                               verr *e) {
    char field[512];
    if (d->n_chunks == 0) {
        snprintf(field, sizeof field, "%s.model_input.chunks", path);
        return serve_bad(e, 400, field, "%s: must be a non-empty array of chunks", field);
    }
    int64_t N = 0;
    for (int64_t c = 0; c < d->n_chunks; c++) {
        const serve_chunk_in *ch = &d->chunks[c];
        char cpath[448];
        snprintf(cpath, sizeof cpath, "%s.model_input.chunks[%lld]", path, (long long)c);
        if (ch->type != NULL && strcmp(ch->type, "encoded_text") != 0) {
            snprintf(field, sizeof field, "%s.type", cpath);
            return serve_bad(e, 400, field, "%s: only \"encoded_text\" chunks are supported (got %s)", field,
                             ch->type_label);
        }
        for (int64_t k = 0; k < ch->n; k++) {
            const bool not_int = k == ch->not_int.at;
            const int64_t t = not_int ? 0 : ch->tokens[k];
            if (not_int || t < 0 || t >= V) { /* the path is written only for a refusal */
                snprintf(field, sizeof field, "%s.tokens[%lld]", cpath, (long long)k);
                if (not_int)
                    return serve_bad(e, 400, field, "%s: must be an integer token id, got %s", field,
                                     ch->not_int.what);
                return serve_bad(e, 400, field, "%s = %lld: outside the vocabulary [0, %d)", field, (long long)t,
                                 V);
            }
            if (N >= T) {
                snprintf(field, sizeof field, "%s.model_input", path);
                return serve_bad(e, 400, field, "%s: more than %d tokens (block_size); send at most %d", field, T,
                                 T);
            }
            dst[N++] = (int32_t)t;
        }
    }
    if (N == 0) {
        snprintf(field, sizeof field, "%s.model_input", path);
        return serve_bad(e, 400, field, "%s: no tokens; a datum needs at least one", field);
    }
    *n = N;
    return true;
}

/* One loss_fn_input of N values: token ids (integer: to ints) or numbers
 * with |x| <= limit (to floats). */
static bool check_tensor_(const serve_tensor_in *t, const char *path, bool integer, int64_t N, int V, double limit,
                          int32_t *ints, float *floats, verr *e) {
    char field[640], data_path[600];
    snprintf(field, sizeof field, "%s.sparse_crow_indices", path);
    if (t->sparse)
        return serve_bad(e, 400, field, "%s: sparse CSR tensors are not supported; send dense 1-D data", path);
    snprintf(field, sizeof field, "%s.dtype", path);
    if (t->dtype != NULL) {
        const char *s = t->dtype;
        bool ok = integer ? (!strcmp(s, "int64") || !strcmp(s, "int32"))
                          : (!strcmp(s, "float32") || !strcmp(s, "float64") || !strcmp(s, "int64") ||
                             !strcmp(s, "int32"));
        if (!ok)
            return serve_bad(e, 400, field, "%s = \"%s\": expected %s", field, s,
                             integer ? "\"int64\" (or \"int32\")" : "\"float32\"");
    }
    snprintf(field, sizeof field, "%s.shape", path);
    if (t->n_shape != 0 && t->n_shape != 1)
        return serve_bad(e, 400, field, "%s: must be [N] (1-D tensors only), got another shape", field);
    if (t->n_shape == 1 && t->shape0 != N)
        return serve_bad(e, 400, field, "%s = [%lld]: must be [%lld], the model_input length", field,
                         (long long)t->shape0, (long long)N);
    /* A TensorData names its values "data"; a plain array is the input itself. */
    snprintf(data_path, sizeof data_path, "%s%s", path, t->tensor_data ? ".data" : "");
    if (t->n != N)
        return serve_bad(e, 400, data_path, "%s: has %lld values; the model_input has %lld tokens (position i "
                         "of the input predicts element i: the server does not shift)", data_path, (long long)t->n,
                         (long long)N);
    /* The element's path is written only for a refusal. */
    for (int64_t i = 0; i < N; i++) {
        if (integer) {
            const bool not_int = i == t->not_int.at;
            const int64_t x = not_int ? 0 : t->ints[i];
            if (!not_int && x >= 0 && x < V) {
                ints[i] = (int32_t)x;
                continue;
            }
            snprintf(field, sizeof field, "%s[%lld]", data_path, (long long)i);
            if (not_int)
                return serve_bad(e, 400, field, "%s: must be an integer token id, got %s", field, t->not_int.what);
            return serve_bad(e, 400, field, "%s = %lld: outside the vocabulary [0, %d)", field, (long long)x, V);
        }
        const bool not_num = i == t->not_num.at;
        const double w = not_num ? 0.0 : t->reals[i];
        if (!not_num && isfinite(w) && fabs(w) <= limit) {
            floats[i] = (float)w;
            continue;
        }
        snprintf(field, sizeof field, "%s[%lld]", data_path, (long long)i);
        if (not_num) return serve_bad(e, 400, field, "%s: must be a number, got %s", field, t->not_num.what);
        if (!isfinite(w)) return serve_bad(e, 400, field, "%s = %g: must be a finite number", field, w);
        return serve_bad(e, 400, field, "%s = %g: |value| must be <= %g", field, w, limit);
    }
    return true;
}

static const serve_tensor_in *find_input_(const serve_datum_in *d, const char *name) {
    const serve_tensor_in *found = NULL;
    for (int64_t k = 0; k < d->n_inputs; k++)
        if (!strcmp(d->inputs[k].name, name)) found = d->inputs[k].absent ? NULL : &d->inputs[k];
    return found;
}

/* payload: fwd_header, int32 len[n], int32 tokens[total], int32 targets[total],
 * then float weights[total], logprobs[total] (the sampler's), advantages[total]
 * (the inputs a loss does not read are 0). */
bool serve_fwd_build(const serve_fwd_in *in, const char *where, int V, int T, job *j, verr *e) {
    char data_path[320];
    at_(data_path, sizeof data_path, where, "data");
    fwd_header h;
    if (!check_loss_(in, where, j->op == OP_FWDBWD, &h, e)) return false;
    const loss_spec *ls = &losses_[h.loss];
    const int64_t n = in->n;
    if (n == 0) return serve_bad(e, 400, data_path, "%s: empty; send at least one datum", data_path);
    if (n > (1 << 24)) return serve_bad(e, 400, data_path, "%s: %lld datums is too many", data_path, (long long)n);

    const size_t cap = (size_t)n * (size_t)T;
    int32_t *len = calloc((size_t)n, sizeof *len);
    int32_t *tok = malloc(cap * sizeof *tok), *tgt = malloc(cap * sizeof *tgt);
    float *fl = calloc(3 * cap, sizeof *fl); /* weights, logprobs, advantages */
    bool ok = len != NULL && tok != NULL && tgt != NULL && fl != NULL;
    if (!ok) serve_bad(e, 500, data_path, "out of memory for %lld datums", (long long)n);
    int64_t total = 0;
    char path[384], field[512];
    for (int64_t i = 0; ok && i < n; i++) {
        const serve_datum_in *d = &in->data[i];
        snprintf(path, sizeof path, "%s[%lld]", data_path, (long long)i);
        int64_t N = 0;
        if (!(ok = check_model_input_(d, path, T, V, tok + total, &N, e))) break;
        snprintf(field, sizeof field, "%s.loss_fn_inputs", path);
        if (d->n_inputs < 0) {
            ok = serve_bad(e, 400, field, "%s: %s; %s needs %s%s%s%s", field,
                           d->n_inputs == -2 ? "not an object" : "missing", ls->name, ls->inputs[0],
                           ls->n_inputs > 1 ? ", " : "", ls->n_inputs > 1 ? ls->inputs[1] : "",
                           ls->n_inputs > 2 ? ", advantages" : "");
            break;
        }
        for (int64_t k = 0; ok && k < d->n_inputs; k++)
            ok = serve_only_name(d->inputs[k].name, field, ls->inputs, ls->n_inputs, e);
        for (int k = 0; ok && k < ls->n_inputs; k++) {
            const serve_tensor_in *tv = find_input_(d, ls->inputs[k]);
            char tpath[576];
            snprintf(tpath, sizeof tpath, "%s.loss_fn_inputs.%s", path, ls->inputs[k]);
            float *dstf = fl + (size_t)float_slot_(ls->inputs[k]) * cap + total;
            if (tv == NULL) {
                if (k == ls->n_inputs - 1 && ls->optional_last) {
                    for (int64_t t = 0; t < N; t++) dstf[t] = 1.0f; /* no weights: all 1 */
                    continue;
                }
                ok = serve_bad(e, 400, tpath, "%s: missing (%s needs it)", tpath, ls->name);
                break;
            }
            /* Bounds that keep every loss coefficient within float range:
             * the ratio exp(lp - q) is clamped at exp(ZDP_LOSS_MAX_LOG_RATIO). */
            const double limit = !strcmp(ls->inputs[k], "logprobs") ? 1e4 : 1e20;
            ok = k == 0 ? check_tensor_(tv, tpath, true, N, V, 0, tgt + total, NULL, e)
                        : check_tensor_(tv, tpath, false, N, V, limit, NULL, dstf, e);
        }
        if (!ok) break;
        len[i] = (int32_t)N;
        total += N;
    }
    if (ok) {
        serve_bytes b = {0};
        h.n = n;
        ok = serve_put(&b, &h, sizeof h) && serve_put(&b, len, (size_t)n * sizeof *len) &&
             serve_put(&b, tok, (size_t)total * sizeof *tok) && serve_put(&b, tgt, (size_t)total * sizeof *tgt);
        for (int k = 0; ok && k < 3; k++) ok = serve_put(&b, fl + (size_t)k * cap, (size_t)total * sizeof *fl);
        if (!ok) {
            free(b.p);
            serve_bad(e, 500, data_path, "out of memory");
        } else {
            j->payload = b.p;
            j->nbytes = (int64_t)b.len;
        }
    }
    free(len);
    free(tok);
    free(tgt);
    free(fl);
    return ok;
}

bool serve_parse_fwd(const json_t *root, const char *where, const zdp_model *mc, job *j, verr *e) {
    serve_fwd_in in = {0};
    const bool ok =
        json_fwd_(root, where, &in, e) && serve_fwd_build(&in, where, mc->vocab_size, mc->block_size, j, e);
    serve_fwd_in_free(&in);
    return ok;
}
