/*
 * config_parse.c -- ds_config.json -> zdp_config (zdp_config_load_file,
 * zdp_config_load_string): each block read against its key table
 * (config_keys.c), then the batch derived and the whole config validated
 * (config_validate.c).
 *
 * What it does: parses strict JSON with jansson (duplicate keys in one object
 * rejected, as DeepSpeed does for files), type-checks every key zdp knows
 * through one declarative key table per block, and rejects the values and
 * names zdp does not implement.  Every message names the JSON path, the
 * value seen (printed as JSON), the reason and the fix.
 *
 * What it does not do: no HJSON (comments, trailing commas), no elasticity,
 * no fp16/bf16 parameters (only "enabled" is read, to reject it), and no
 * MPI: the world size is an argument, so every rank computes the same
 * answer from the same bytes without communicating.
 *
 * Unknown keys are one warning, not an error.  DeepSpeed ignores unknown
 * top-level keys silently and errors on unknown keys in sub-blocks; zdp's
 * issue asks for a single warning that lists every one with its JSON path
 * (and a "did you mean" when a known key is within edit distance 2), because
 * silently ignored typos ("gradient_clipp1ng") are a known DeepSpeed trap.
 */
#include "config_impl.h"

#include "../core/core.h"
#include "../core/json.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "zdp/config.h"
#include "zdp/dist.h"

/* ---- limits ---------------------------------------------------------- */

#define VALUE_TEXT_MAX_ 80       /* a value printed in a message */
#define UNKNOWN_LIST_MAX_ 1500   /* fits zdp_log's 2048-byte line with the prefix */
#define FILE_MAX_BYTES_ (64L << 20) /* no sane ds_config is this big */

/* ---- parse context and messages --------------------------------------- */

typedef struct parse_ctx {
    const char *origin;   /* file name or "<string>", for messages */
    zdp_error *err;
    char unknown[UNKNOWN_LIST_MAX_]; /* "a.b (did you mean c?), d" */
    size_t unknown_len;
    int n_unknown;
    int n_unknown_omitted; /* entries that did not fit in `unknown` */
} parse_ctx;

/* The value as compact JSON, cut to VALUE_TEXT_MAX_ characters. */
static void value_text_(const json_t *v, char *out, size_t n) {
    char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT | JSON_REAL_PRECISION(15));
    if (s == NULL) {
        snprintf(out, n, "?");
        return;
    }
    if (strlen(s) > VALUE_TEXT_MAX_)
        snprintf(out, n, "%.*s...", VALUE_TEXT_MAX_ - 3, s);
    else
        snprintf(out, n, "%s", s);
    free(s);
}

/* Fails with "path = <value as JSON>: <fmt...>". */
static zdp_status fail_value_(parse_ctx *ctx, zdp_status code, const char *path,
                              const json_t *v, const char *fmt, ...) ZDP_PRINTF(5, 6);
static zdp_status fail_value_(parse_ctx *ctx, zdp_status code, const char *path,
                              const json_t *v, const char *fmt, ...) {
    char vt[VALUE_TEXT_MAX_ + 8];
    char rest[ZDP_ERROR_MSG_MAX];
    value_text_(v, vt, sizeof vt);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rest, sizeof rest, fmt, ap);
    va_end(ap);
    return zdp_err_set(ctx->err, code, "%s = %s: %s", path, vt, rest);
}

/* ---- "did you mean" ------------------------------------------------- */

static int lower_(int c) { return (c >= 'A' && c <= 'Z') ? c - 'A' + 'a' : c; }

static bool ascii_ieq_(const char *a, const char *b) {
    for (; *a != '\0' && *b != '\0'; a++, b++)
        if (lower_((unsigned char)*a) != lower_((unsigned char)*b)) return false;
    return *a == *b;
}

/* Case-insensitive Levenshtein distance; keys longer than 63 characters are
 * never close to a known key, so they get a large distance. */
static int edit_distance_(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63) return 1000;
    int row[64], prev[64];
    for (size_t j = 0; j <= lb; j++) prev[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        row[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int cost = lower_((unsigned char)a[i - 1]) == lower_((unsigned char)b[j - 1]) ? 0 : 1;
            int best = prev[j - 1] + cost;
            if (prev[j] + 1 < best) best = prev[j] + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
        }
        memcpy(prev, row, (lb + 1) * sizeof row[0]);
    }
    return prev[lb];
}

/* The closest of `names` within distance 2 (first one on ties), or NULL. */
static const char *closest_(const char *key, const char *const *names, size_t n) {
    const char *best = NULL;
    int best_d = 3;
    for (size_t i = 0; i < n; i++) {
        int d = edit_distance_(key, names[i]);
        if (d < best_d) {
            best_d = d;
            best = names[i];
        }
    }
    return best;
}

static const key_spec *spec_find_(const key_spec *specs, size_t n, const char *key) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(specs[i].name, key) == 0) return &specs[i];
    return NULL;
}

/* Appends one entry to the unknown-key list. */
static void unknown_add_(parse_ctx *ctx, const char *path, const char *note) {
    char entry[PATH_MAX_ + 96];
    if (note != NULL)
        snprintf(entry, sizeof entry, "%s (%s)", path, note);
    else
        snprintf(entry, sizeof entry, "%s", path);
    size_t need = strlen(entry) + (ctx->n_unknown > 0 ? 2 : 0);
    if (ctx->unknown_len + need + 1 > sizeof ctx->unknown) {
        ctx->n_unknown_omitted++;
        return;
    }
    ctx->unknown_len += (size_t)snprintf(ctx->unknown + ctx->unknown_len,
                                         sizeof ctx->unknown - ctx->unknown_len, "%s%s",
                                         ctx->n_unknown > 0 ? ", " : "", entry);
    ctx->n_unknown++;
}

/* Records an unknown key, with the closest known key of the same block. */
static void unknown_key_(parse_ctx *ctx, const char *path, const char *key,
                         const key_spec *specs, size_t n) {
    const char *names[64];
    size_t m = 0;
    for (size_t i = 0; i < n && m < COUNT_(names); i++) names[m++] = specs[i].name;
    const char *near = closest_(key, names, m);
    char note[96];
    if (near != NULL) snprintf(note, sizeof note, "did you mean %s?", near);
    unknown_add_(ctx, path, near != NULL ? note : NULL);
}

/* Emits the one warning for the whole document (nothing if all keys known). */
static void unknown_flush_(parse_ctx *ctx) {
    if (ctx->n_unknown == 0 && ctx->n_unknown_omitted == 0) return;
    /* Every rank parses the same file: one warning for the job, from rank 0. */
    if (zdp_dist_rank() != 0) return;
    if (ctx->n_unknown_omitted > 0)
        zdp_log(1, "%s: ignoring config keys zdp does not read: %s, and %d more", ctx->origin,
                ctx->unknown, ctx->n_unknown_omitted);
    else
        zdp_log(1, "%s: ignoring config keys zdp does not read: %s", ctx->origin, ctx->unknown);
    ctx->n_unknown = ctx->n_unknown_omitted = 0;
}

/* ---- typed readers ------------------------------------------------- */

/* A JSON integer, or a real that is a whole number in int64 range. */
static zdp_status read_int_(parse_ctx *ctx, const char *path, const json_t *v,
                            double min, double max, const char *hint, int64_t *out) {
    char generic[96];
    if (hint == NULL) {
        snprintf(generic, sizeof generic, "write a whole number >= %.0f", min);
        hint = generic;
    }
    int64_t x;
    if (json_is_integer(v)) {
        x = (int64_t)json_integer_value(v);
    } else if (json_is_real(v)) {
        double d = json_real_value(v);
        /* 2^63 is exactly representable; anything at or above it is not an int64. */
        if (!(d == floor(d) && d >= -9223372036854775808.0 && d < 9223372036854775808.0))
            return fail_value_(ctx, ZDP_ERR_CONFIG, path, v,
                               "expected a whole number (integer), got a fractional or "
                               "out-of-range number; fix: %s", hint);
        x = (int64_t)d;
    } else if (json_is_string(v) && strcmp(json_string_value(v), "auto") == 0) {
        return fail_value_(ctx, ZDP_ERR_CONFIG, path, v,
                           "expected an integer, got the string \"auto\" (a Hugging Face "
                           "Trainer placeholder, not resolved here); fix: %s", hint);
    } else {
        return fail_value_(ctx, ZDP_ERR_CONFIG, path, v,
                           "expected an integer, got %s; fix: %s%s", zdp_json_type_name(v), hint,
                           json_is_string(v) ? " (numbers are written without quotes)" : "");
    }
    if ((double)x < min)
        return fail_value_(ctx, ZDP_ERR_CONFIG, path, v,
                           "must be an integer >= %.0f; fix: %s", min, hint);
    if ((double)x > max)
        return fail_value_(ctx, ZDP_ERR_CONFIG, path, v,
                           "must be an integer <= %.0f; fix: %s", max, hint);
    *out = x;
    return ZDP_OK;
}

static zdp_status read_bool_(parse_ctx *ctx, const char *path, const json_t *v, bool *out) {
    if (!json_is_boolean(v))
        return fail_value_(ctx, ZDP_ERR_CONFIG, path, v,
                           "expected a JSON boolean, got %s; fix: write true or false "
                           "(without quotes)", zdp_json_type_name(v));
    *out = json_is_true(v);
    return ZDP_OK;
}

static zdp_status read_number_(parse_ctx *ctx, const char *path, const json_t *v,
                               double min, double max, double *out) {
    char range[96];
    if (max < DBL_MAX && min > -DBL_MAX)
        snprintf(range, sizeof range, "a number in [%g, %g]", min, max);
    else if (min > -DBL_MAX)
        snprintf(range, sizeof range, "a number >= %g", min);
    else
        snprintf(range, sizeof range, "a number");
    if (!json_is_number(v))
        return fail_value_(ctx, ZDP_ERR_CONFIG, path, v, "expected %s, got %s; fix: write %s%s",
                           range, zdp_json_type_name(v), range,
                           json_is_string(v) ? " without quotes" : "");
    double d = json_number_value(v);
    if (!(d >= min && d <= max))
        return fail_value_(ctx, ZDP_ERR_CONFIG, path, v, "out of range; fix: write %s",
                           range);
    *out = d;
    return ZDP_OK;
}

/* Walks one JSON object against its key table: stores table-typed values
 * into `base`, leaves KEY_CUSTOM keys to the caller, and records the rest in
 * the unknown list.  Stops at the first bad value. */
static zdp_status parse_block_(parse_ctx *ctx, const json_t *obj, key_block_id id, void *base) {
    const char *prefix = zdp_config_key_blocks_[id].prefix;
    const key_spec *specs = zdp_config_key_blocks_[id].specs;
    const size_t n = zdp_config_key_blocks_[id].n;
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)obj, key, v) {
        char path[PATH_MAX_];
        zdp_config_path_join_(path, prefix, key);
        const key_spec *s = spec_find_(specs, n, key);
        if (s == NULL) {
            unknown_key_(ctx, path, key, specs, n);
            continue;
        }
        zdp_status st = ZDP_OK;
        char *field = (base != NULL && s->offset != NO_FIELD_) ? (char *)base + s->offset : NULL;
        switch (s->kind) {
        case KEY_INT: {
            int64_t x = 0;
            st = read_int_(ctx, path, v, s->min, s->max, s->hint, &x);
            if (st == ZDP_OK && field != NULL) memcpy(field, &x, sizeof x);
            break;
        }
        case KEY_BOOL: {
            bool b = false;
            st = read_bool_(ctx, path, v, &b);
            if (st == ZDP_OK && field != NULL) memcpy(field, &b, sizeof b);
            break;
        }
        case KEY_NUMBER: {
            double d = 0.0;
            st = read_number_(ctx, path, v, s->min, s->max, &d);
            if (st == ZDP_OK && field != NULL) memcpy(field, &d, sizeof d);
            break;
        }
        case KEY_UNUSED:
            unknown_add_(ctx, path, "a DeepSpeed key zdp does not use");
            break;
        case KEY_ANY:
        case KEY_CUSTOM:
            break;
        }
        if (st != ZDP_OK) return st;
    }
    return ZDP_OK;
}

/* ---- blocks --------------------------------------------------------- */

static zdp_status parse_offload_(parse_ctx *ctx, const json_t *v, key_block_id id,
                                 zdp_offload_device *out) {
    const char *path = zdp_config_key_blocks_[id].prefix;
    *out = ZDP_OFFLOAD_NONE;
    if (json_is_null(v)) return ZDP_OK; /* DeepSpeed: null is an absent block */
    if (!json_is_object(v))
        return fail_value_(ctx, ZDP_ERR_CONFIG, path, v,
                           "expected an object like {\"device\": \"none\"}, got %s; fix: "
                           "remove the key (zdp does not offload)", zdp_json_type_name(v));
    zdp_status st = parse_block_(ctx, v, id, NULL);
    if (st != ZDP_OK) return st;
    const json_t *dev = json_object_get(v, "device");
    if (dev == NULL) return ZDP_OK; /* the default device is "none" (docs/deepspeed.md §3.7) */
    char dpath[PATH_MAX_];
    zdp_config_path_join_(dpath, path, "device");
    const char *s = json_is_string(dev) ? json_string_value(dev) : NULL;
    if (s != NULL && strcmp(s, "none") == 0) *out = ZDP_OFFLOAD_NONE;
    else if (s != NULL && strcmp(s, "cpu") == 0) *out = ZDP_OFFLOAD_CPU;
    else if (s != NULL && strcmp(s, "nvme") == 0) *out = ZDP_OFFLOAD_NVME;
    else
        return fail_value_(ctx, ZDP_ERR_CONFIG, dpath, dev,
                           "expected \"none\", \"cpu\" or \"nvme\"; fix: set \"device\": "
                           "\"none\" (zdp does not offload)");
    return ZDP_OK;
}

static zdp_status parse_zero_(parse_ctx *ctx, const json_t *v, zdp_zero_config *z) {
    if (json_is_boolean(v)) {
        /* Deprecated DeepSpeed form: true = stage 1, false = stage 0. */
        z->stage = json_is_true(v) ? 1 : 0;
        zdp_log(1, "%s: zero_optimization = %s is deprecated (read as stage %d); write "
                "\"zero_optimization\": {\"stage\": %d}", ctx->origin,
                json_is_true(v) ? "true" : "false", z->stage, z->stage);
        return ZDP_OK;
    }
    if (!json_is_object(v))
        return fail_value_(ctx, ZDP_ERR_CONFIG, "zero_optimization", v,
                           "expected an object like {\"stage\": 2}, got %s; fix: write "
                           "\"zero_optimization\": {\"stage\": 2}", zdp_json_type_name(v));
    zdp_status st = parse_block_(ctx, v, BLOCK_ZERO, z);
    if (st != ZDP_OK) return st;

    const json_t *s = json_object_get(v, "stage");
    if (s != NULL) {
        int64_t stage = 0;
        st = read_int_(ctx, "zero_optimization.stage", s, -DBL_MAX, DBL_MAX,
                       "set 0, 1, 2 or 3 (2 shards optimizer state and gradients, 3 parameters too)", &stage);
        if (st != ZDP_OK) return st;
        if (stage < 0 || stage > 3) return zdp_config_stage_range_error_(ctx->err, (long long)stage);
        z->stage = (int)stage;
    }
    if (z->allgather_bucket_size % 2 != 0)
        return zdp_err_set(ctx->err, ZDP_ERR_CONFIG,
                           "zero_optimization.allgather_bucket_size = %lld: "
                           "allgather_bucket_size must be a multiple of "
                           "nccl_start_alignment_factor, 2; fix: use an even size, e.g. %lld",
                           (long long)z->allgather_bucket_size,
                           (long long)z->allgather_bucket_size + 1);

    const json_t *off = json_object_get(v, "offload_optimizer");
    if (off != NULL &&
        (st = parse_offload_(ctx, off, BLOCK_OFFLOAD_OPTIMIZER, &z->offload_optimizer)) != ZDP_OK)
        return st;
    off = json_object_get(v, "offload_param");
    if (off != NULL &&
        (st = parse_offload_(ctx, off, BLOCK_OFFLOAD_PARAM, &z->offload_param)) != ZDP_OK)
        return st;

    const json_t *legacy = json_object_get(v, "cpu_offload");
    if (legacy != NULL) {
        bool on = false;
        st = read_bool_(ctx, "zero_optimization.cpu_offload", legacy, &on);
        if (st != ZDP_OK) return st;
        if (on) {
            /* DeepSpeed's deprecated spelling of offload_optimizer {device: cpu}. */
            zdp_log(1, "%s: zero_optimization.cpu_offload is deprecated; it means "
                    "\"offload_optimizer\": {\"device\": \"cpu\"}", ctx->origin);
            z->offload_optimizer = ZDP_OFFLOAD_CPU;
        }
    }
    return ZDP_OK;
}

/* DeepSpeed's own optimizer names (matched case-insensitively) that zdp does
 * not implement, and torch.optim class names (matched exactly). */
static const char *const ds_unimplemented_names_[] = {
    "lamb", "lion", "adagrad", "onebitadam", "zerooneadam", "onebitlamb",
    "muadam", "muadamw", "musgd", "muon",
};
static const char *const torch_unimplemented_names_[] = {
    "Adadelta", "Adafactor", "Adamax", "ASGD", "LBFGS", "NAdam",
    "RAdam", "RMSprop", "Rprop", "SparseAdam",
};

static zdp_status parse_betas_(parse_ctx *ctx, const json_t *v, zdp_optimizer_config *o) {
    const char *path = "optimizer.params.betas";
    if (!json_is_array(v) || json_array_size(v) != 2)
        return fail_value_(ctx, ZDP_ERR_CONFIG, path, v,
                           "expected a list of two numbers [beta1, beta2]; fix: write "
                           "\"betas\": [0.9, 0.999]");
    double b[2];
    for (size_t i = 0; i < 2; i++) {
        char p[PATH_MAX_];
        snprintf(p, sizeof p, "%s[%zu]", path, i);
        const json_t *e = json_array_get(v, i);
        if (!json_is_number(e) || !(json_number_value(e) >= 0.0 && json_number_value(e) < 1.0))
            return fail_value_(ctx, ZDP_ERR_CONFIG, p, e,
                               "expected a number with 0 <= beta < 1; fix: write "
                               "\"betas\": [0.9, 0.999]");
        b[i] = json_number_value(e);
    }
    o->beta1 = b[0];
    o->beta2 = b[1];
    return ZDP_OK;
}

static zdp_status parse_optimizer_(parse_ctx *ctx, const json_t *v, zdp_optimizer_config *o) {
    if (v == NULL)
        return zdp_err_set(ctx->err, ZDP_ERR_CONFIG,
                           "optimizer: missing; add \"optimizer\": {\"type\": \"Adam\", \"params\": "
                           "{\"lr\": 1e-3}} (zdp builds its optimizer from the config)");
    if (!json_is_object(v))
        return fail_value_(ctx, ZDP_ERR_CONFIG, "optimizer", v,
                           "expected an object, got %s; fix: write \"optimizer\": "
                           "{\"type\": \"Adam\", \"params\": {\"lr\": 1e-3}}", zdp_json_type_name(v));
    zdp_status st = parse_block_(ctx, v, BLOCK_OPTIMIZER, NULL);
    if (st != ZDP_OK) return st;

    const json_t *t = json_object_get(v, "type");
    if (t == NULL)
        return zdp_err_set(ctx->err, ZDP_ERR_CONFIG,
                           "optimizer.type: missing; add \"type\": \"Adam\" (or \"AdamW\", "
                           "\"SGD\")");
    if (!json_is_string(t))
        return fail_value_(ctx, ZDP_ERR_CONFIG, "optimizer.type", t,
                           "expected a string, got %s; fix: write \"type\": \"Adam\"",
                           zdp_json_type_name(t));
    const char *name = json_string_value(t);
    if (ascii_ieq_(name, "adam")) {
        o->type = ZDP_OPTIMIZER_ADAM;
    } else if (ascii_ieq_(name, "adamw")) {
        o->type = ZDP_OPTIMIZER_ADAMW;
    } else if (strcmp(name, "SGD") == 0) {
        o->type = ZDP_OPTIMIZER_SGD;
    } else {
        for (size_t i = 0; i < COUNT_(ds_unimplemented_names_); i++)
            if (ascii_ieq_(name, ds_unimplemented_names_[i]))
                return fail_value_(ctx, ZDP_ERR_UNSUPPORTED, "optimizer.type", t,
                                   "a DeepSpeed optimizer that is not implemented in zdp "
                                   "yet; use \"Adam\", \"AdamW\" or \"SGD\"");
        for (size_t i = 0; i < COUNT_(torch_unimplemented_names_); i++)
            if (strcmp(name, torch_unimplemented_names_[i]) == 0)
                return fail_value_(ctx, ZDP_ERR_UNSUPPORTED, "optimizer.type", t,
                                   "a torch.optim optimizer that is not implemented in zdp "
                                   "yet; use \"Adam\", \"AdamW\" or \"SGD\"");
        /* "sgd" fails in DeepSpeed too: torch names are case-sensitive. */
        static const char *const supported[] = {"Adam", "AdamW", "SGD"};
        const char *near = closest_(name, supported, COUNT_(supported));
        char hint[64] = "";
        if (near != NULL) snprintf(hint, sizeof hint, "did you mean \"%s\"? ", near);
        return fail_value_(ctx, ZDP_ERR_CONFIG, "optimizer.type", t,
                           "%s is not a supported DeepSpeed Optimizer; fix: %suse \"Adam\", "
                           "\"AdamW\" or \"SGD\" (torch names such as \"SGD\" are "
                           "case-sensitive)", name, hint);
    }

    const json_t *params = json_object_get(v, "params");
    if (params != NULL && !json_is_object(params))
        return fail_value_(ctx, ZDP_ERR_CONFIG, "optimizer.params", params,
                           "expected an object, got %s; fix: write \"params\": {\"lr\": 1e-3}",
                           zdp_json_type_name(params));
    bool sgd = o->type == ZDP_OPTIMIZER_SGD;
    if (params != NULL) {
        const json_t *mgn = json_object_get(params, "max_grad_norm");
        if (mgn != NULL)
            return fail_value_(ctx, ZDP_ERR_CONFIG, "optimizer.params.max_grad_norm", mgn,
                               "'max_grad_norm' is not supported as an optimizer parameter, "
                               "please switch to using the deepspeed parameter "
                               "'gradient_clipping'; fix: remove it and set top-level "
                               "\"gradient_clipping\"");
        st = parse_block_(ctx, params, sgd ? BLOCK_SGD_PARAMS : BLOCK_ADAM_PARAMS, o);
        if (st != ZDP_OK) return st;
    }
    if (sgd) {
        if (params == NULL || json_object_get(params, "lr") == NULL)
            return zdp_err_set(ctx->err, ZDP_ERR_CONFIG,
                               "optimizer.params.lr: missing; torch.optim.SGD has no default "
                               "learning rate; add \"params\": {\"lr\": 0.01}");
        return ZDP_OK;
    }
    if (params != NULL) {
        const json_t *b = json_object_get(params, "betas");
        if (b != NULL && (st = parse_betas_(ctx, b, o)) != ZDP_OK) return st;
        const json_t *ams = json_object_get(params, "amsgrad");
        if (ams != NULL) {
            bool on = false;
            st = read_bool_(ctx, "optimizer.params.amsgrad", ams, &on);
            if (st != ZDP_OK) return st;
            if (on)
                return fail_value_(ctx, ZDP_ERR_CONFIG, "optimizer.params.amsgrad", ams,
                                   "FusedAdam does not support the AMSGrad variant; fix: "
                                   "remove it or set it false");
        }
    }
    /* AdamW is always decoupled (docs/deepspeed.md §6.2); adam_w_mode only matters for Adam. */
    if (o->type == ZDP_OPTIMIZER_ADAMW) o->adam_w_mode = true;
    return ZDP_OK;
}

/* fp16 / bf16 / amp: only "enabled" is read; the rest belongs to features
 * zdp rejects anyway, so it is neither checked nor warned about. */
static zdp_status parse_enabled_(parse_ctx *ctx, const json_t *v, const char *path, bool *out) {
    if (!json_is_object(v))
        return fail_value_(ctx, ZDP_ERR_CONFIG, path, v,
                           "expected an object like {\"enabled\": false}, got %s; fix: "
                           "write \"%s\": {\"enabled\": false} or remove it",
                           zdp_json_type_name(v), path);
    const json_t *e = json_object_get(v, "enabled");
    if (e == NULL) return ZDP_OK;
    char p[PATH_MAX_];
    zdp_config_path_join_(p, path, "enabled");
    return read_bool_(ctx, p, e, out);
}

/* DeepSpeed's scheduler block (docs/deepspeed.md §7).  base_lr: the
 * optimizer's lr, WarmupLR's default peak. */
static zdp_status parse_scheduler_(parse_ctx *ctx, const json_t *v, double base_lr,
                                   zdp_scheduler_config *s) {
    if (!json_is_object(v))
        return fail_value_(ctx, ZDP_ERR_CONFIG, "scheduler", v,
                           "expected an object, got %s; fix: write \"scheduler\": {\"type\": "
                           "\"WarmupLR\", \"params\": {...}}", zdp_json_type_name(v));
    zdp_status st = parse_block_(ctx, v, BLOCK_SCHEDULER, NULL);
    if (st != ZDP_OK) return st;
    const json_t *t = json_object_get(v, "type");
    if (t == NULL || !json_is_string(t))
        return t == NULL ? zdp_err_set(ctx->err, ZDP_ERR_CONFIG,
                                       "scheduler.type: missing; add \"type\": \"WarmupLR\" (or "
                                       "\"WarmupDecayLR\", \"WarmupCosineLR\")")
                         : fail_value_(ctx, ZDP_ERR_CONFIG, "scheduler.type", t,
                                       "expected a string, got %s; fix: write \"type\": "
                                       "\"WarmupLR\"", zdp_json_type_name(t));
    const char *name = json_string_value(t);
    /* Case-sensitive, as DeepSpeed looks the name up. */
    if (strcmp(name, "WarmupLR") == 0) {
        s->type = ZDP_SCHEDULER_WARMUP_LR;
    } else if (strcmp(name, "WarmupDecayLR") == 0) {
        s->type = ZDP_SCHEDULER_WARMUP_DECAY_LR;
    } else if (strcmp(name, "WarmupCosineLR") == 0) {
        s->type = ZDP_SCHEDULER_WARMUP_COSINE_LR;
    } else if (strcmp(name, "OneCycle") == 0 || strcmp(name, "LRRangeTest") == 0) {
        return fail_value_(ctx, ZDP_ERR_UNSUPPORTED, "scheduler.type", t,
                           "a DeepSpeed scheduler that is not implemented in zdp yet; use "
                           "\"WarmupLR\", \"WarmupDecayLR\" or \"WarmupCosineLR\"");
    } else {
        static const char *const known[] = {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR"};
        const char *near = closest_(name, known, COUNT_(known));
        char hint[64] = "";
        if (near != NULL) snprintf(hint, sizeof hint, "did you mean \"%s\"? ", near);
        return fail_value_(ctx, ZDP_ERR_CONFIG, "scheduler.type", t,
                           "DeepSpeed does not recognize LR scheduler %s; fix: %suse "
                           "\"WarmupLR\", \"WarmupDecayLR\" or \"WarmupCosineLR\" (names are "
                           "case-sensitive; torch.optim.lr_scheduler classes are not "
                           "implemented in zdp)", name, hint);
    }
    const json_t *params = json_object_get(v, "params");
    if (params == NULL)
        return zdp_err_set(ctx->err, ZDP_ERR_CONFIG,
                           "scheduler.params: missing (DeepSpeed fails to build the scheduler "
                           "without it); fix: add \"params\": {} to take the defaults%s",
                           s->type == ZDP_SCHEDULER_WARMUP_LR ? "" : ", with \"total_num_steps\"");
    if (!json_is_object(params))
        return fail_value_(ctx, ZDP_ERR_CONFIG, "scheduler.params", params,
                           "expected an object, got %s", zdp_json_type_name(params));
    /* The rows' defaults; a NaN peak means "the optimizer's lr" (WarmupLR). */
    zdp_config_apply_defaults_(BLOCK_SCHEDULER_PARAMS, s);
    if (s->type == ZDP_SCHEDULER_WARMUP_LR) s->warmup_max_lr = NAN;
    s->warmup_linear = false; /* warmup_type "log" */
    s->total_num_steps = 0;   /* required by the decaying schedules: no default */
    st = parse_block_(ctx, params, BLOCK_SCHEDULER_PARAMS, s);
    if (st != ZDP_OK) return st;
    /* Keys of another schedule: listed with the unknown ones. */
    const bool cosine = s->type == ZDP_SCHEDULER_WARMUP_COSINE_LR;
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)params, key, val) {
        bool foreign = cosine ? (!strcmp(key, "warmup_min_lr") || !strcmp(key, "warmup_max_lr"))
                              : (!strcmp(key, "warmup_min_ratio") || !strcmp(key, "cos_min_ratio"));
        if (s->type == ZDP_SCHEDULER_WARMUP_LR && !strcmp(key, "total_num_steps")) foreign = true;
        if (foreign) {
            char path[PATH_MAX_];
            zdp_config_path_join_(path, "scheduler.params", key);
            unknown_add_(ctx, path, "not a parameter of this scheduler type");
        }
    }
    if (isnan(s->warmup_max_lr)) s->warmup_max_lr = base_lr;
    const json_t *wt = json_object_get(params, "warmup_type");
    if (wt != NULL) {
        if (!json_is_string(wt))
            return fail_value_(ctx, ZDP_ERR_CONFIG, "scheduler.params.warmup_type", wt,
                               "expected \"log\" or \"linear\"");
        if (strcmp(json_string_value(wt), "linear") == 0) {
            s->warmup_linear = true;
        } else if (strcmp(json_string_value(wt), "log") != 0) {
            /* DeepSpeed warns and falls back to log. */
            char path[] = "scheduler.params.warmup_type";
            unknown_add_(ctx, path, "unknown value, using \"log\" as DeepSpeed does");
        }
    }
    if (s->type != ZDP_SCHEDULER_WARMUP_LR && json_object_get(params, "total_num_steps") == NULL)
        return zdp_err_set(ctx->err, ZDP_ERR_CONFIG,
                           "scheduler.params.total_num_steps: missing; %s needs it (the step "
                           "where the decay ends); fix: add \"total_num_steps\": N",
                           name);
    if (s->type != ZDP_SCHEDULER_WARMUP_LR && s->total_num_steps < s->warmup_num_steps &&
        zdp_dist_rank() == 0)
        zdp_log(1, "%s: scheduler.params.total_num_steps = %lld is less than warmup_num_steps = "
                   "%lld (DeepSpeed only warns too)",
                ctx->origin, (long long)s->total_num_steps, (long long)s->warmup_num_steps);
    return ZDP_OK;
}

static zdp_status parse_document_(parse_ctx *ctx, const json_t *root, zdp_config *cfg) {
    zdp_status st = parse_block_(ctx, root, BLOCK_TOP, cfg);
    if (st != ZDP_OK) return st;

    const json_t *v;
    if ((v = json_object_get(root, "zero_optimization")) != NULL &&
        (st = parse_zero_(ctx, v, &cfg->zero)) != ZDP_OK)
        return st;
    if ((st = parse_optimizer_(ctx, json_object_get(root, "optimizer"), &cfg->optimizer)) != ZDP_OK)
        return st;
    if ((v = json_object_get(root, "scheduler")) != NULL &&
        (st = parse_scheduler_(ctx, v, cfg->optimizer.lr, &cfg->scheduler)) != ZDP_OK)
        return st;

    if ((v = json_object_get(root, "fp16")) != NULL &&
        (st = parse_enabled_(ctx, v, "fp16", &cfg->fp16_enabled)) != ZDP_OK)
        return st;
    const json_t *bf = json_object_get(root, "bf16");
    const json_t *bf_old = json_object_get(root, "bfloat16");
    if (bf != NULL && bf_old != NULL)
        return zdp_err_set(ctx->err, ZDP_ERR_CONFIG,
                           "bf16, bfloat16: both present; \"bfloat16\" is the old name of "
                           "\"bf16\"; fix: keep only \"bf16\"");
    if (bf != NULL && (st = parse_enabled_(ctx, bf, "bf16", &cfg->bf16_enabled)) != ZDP_OK)
        return st;
    if (bf_old != NULL &&
        (st = parse_enabled_(ctx, bf_old, "bfloat16", &cfg->bf16_enabled)) != ZDP_OK)
        return st;
    if ((v = json_object_get(root, "amp")) != NULL &&
        (st = parse_enabled_(ctx, v, "amp", &cfg->amp_enabled)) != ZDP_OK)
        return st;
    /* Any pipeline value at all: zdp only records it in order to reject it. */
    cfg->has_pipeline = json_object_get(root, "pipeline") != NULL;
    return ZDP_OK;
}

static void err_clear_(zdp_error *err) {
    if (err == NULL) return;
    err->code = ZDP_OK;
    err->rank = -1;
    err->msg[0] = '\0';
}

/* Parses `len` bytes of JSON.  *out holds the defaults unless everything
 * succeeds, so a caller that ignores the status never sees half a config. */
static zdp_status load_buffer_(const char *buf, size_t len, const char *origin, int world_size,
                               zdp_config *out, zdp_error *err) {
    zdp_config_default(out);
    if (world_size < 1)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "%s: world_size = %d: must be >= 1 (the number of MPI ranks); fix: "
                           "pass zdp_dist_world_size()", origin, world_size);
    json_error_t jerr;
    json_t *root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL) {
        if (json_error_code(&jerr) == json_error_duplicate_key)
            return zdp_err_set(err, ZDP_ERR_CONFIG,
                               "%s:%d:%d: %s: a key appears twice in one object (DeepSpeed: "
                               "Duplicate keys in DeepSpeed config); fix: keep one of them",
                               origin, jerr.line, jerr.column, jerr.text);
        return zdp_err_set(err, ZDP_ERR_FORMAT, "%s:%d:%d: invalid JSON: %s; fix: zdp reads "
                           "strict JSON (no comments, no trailing commas)", origin, jerr.line,
                           jerr.column, jerr.text);
    }
    zdp_status st;
    if (!json_is_object(root)) {
        st = zdp_err_set(err, ZDP_ERR_CONFIG, "%s: the top level is %s; expected a JSON object "
                         "like {\"train_batch_size\": 32, ...}", origin, zdp_json_type_name(root));
        json_decref(root);
        return st;
    }
    parse_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    ctx.origin = origin;
    ctx.err = err;
    zdp_config cfg;
    zdp_config_default(&cfg);
    cfg.world_size = world_size;
    st = parse_document_(&ctx, root, &cfg);
    /* Warn even when parsing failed: a misspelt key is often the cause. */
    unknown_flush_(&ctx);
    json_decref(root);
    if (st != ZDP_OK) return st;
    if ((st = zdp_config_derive_batch_(&cfg, err)) != ZDP_OK) return st;
    if ((st = zdp_config_validate(&cfg, err)) != ZDP_OK) return st;
    *out = cfg;
    return ZDP_OK;
}

zdp_status zdp_config_load_string(const char *json, const char *origin, int world_size,
                                  zdp_config *out, zdp_error *err) {
    err_clear_(err);
    if (origin == NULL) origin = "<string>";
    if (out == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "%s: out: NULL pointer", origin);
    zdp_config_default(out);
    if (json == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "%s: json: NULL string", origin);
    return load_buffer_(json, strlen(json), origin, world_size, out, err);
}

zdp_status zdp_config_load_file(const char *path, int world_size, zdp_config *out,
                                zdp_error *err) {
    err_clear_(err);
    if (out == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "config file: out: NULL pointer");
    zdp_config_default(out);
    if (path == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "config file: path: NULL pointer; fix: "
                           "pass the path of ds_config.json");
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return zdp_err_set(err, ZDP_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    char *buf = NULL;
    size_t len = 0, cap = 0;
    zdp_status st = ZDP_OK;
    for (;;) {
        if (len == cap) {
            if (cap >= (size_t)FILE_MAX_BYTES_) {
                st = zdp_err_set(err, ZDP_ERR_IO, "%s: larger than %ld MiB; not a ds_config "
                                 "file?", path, FILE_MAX_BYTES_ >> 20);
                break;
            }
            size_t ncap = cap == 0 ? 4096 : cap * 2;
            char *nbuf = realloc(buf, ncap);
            if (nbuf == NULL) {
                st = zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory reading the file", path);
                break;
            }
            buf = nbuf;
            cap = ncap;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) {
            if (ferror(f))
                st = zdp_err_set(err, ZDP_ERR_IO, "%s: read failed: %s", path, strerror(errno));
            break;
        }
    }
    fclose(f);
    if (st == ZDP_OK) st = load_buffer_(buf != NULL ? buf : "", len, path, world_size, out, err);
    free(buf);
    return st;
}
