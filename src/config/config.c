/*
 * config.c -- ds_config.json -> zdp_config: defaults, parsing, batch-size
 * derivation and validation (zdp_config_default, zdp_config_load_file,
 * zdp_config_load_string, zdp_config_validate).
 *
 * What it does: parses strict JSON with jansson (duplicate keys in one object
 * rejected, as DeepSpeed does for files), type-checks every key zdp knows
 * through one declarative key table per block, derives the batch triple
 * exactly as DeepSpeed does (docs/deepspeed.md §1.2, integer floor division), and
 * rejects what zdp does not implement.  Every message names the JSON path,
 * the value seen (printed as JSON), the reason and the fix.
 *
 * What it does not do: no HJSON (comments, trailing commas), no elasticity,
 * no scheduler, no fp16/bf16 parameters (only "enabled" is read, to reject
 * it), and no MPI: the world size is an argument, so every rank computes the
 * same answer from the same bytes without communicating.
 *
 * Unknown keys are one warning, not an error.  DeepSpeed ignores unknown
 * top-level keys silently and errors on unknown keys in sub-blocks; zdp's
 * issue asks for a single warning that lists every one with its JSON path
 * (and a "did you mean" when a known key is within edit distance 2), because
 * silently ignored typos ("gradient_clipp1ng") are a known DeepSpeed trap.
 */
#include "config.h"

#include "../core/core.h"
#include "../core/json.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

/* ---- limits ---------------------------------------------------------- */

#define PATH_MAX_ 256            /* JSON paths in messages; longer ones are cut */
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

/* dst = prefix.key (or key at top level); cut, never overflowed. */
static void path_join_(char *dst, const char *prefix, const char *key) {
    if (prefix == NULL || prefix[0] == '\0')
        snprintf(dst, PATH_MAX_, "%s", key);
    else
        snprintf(dst, PATH_MAX_, "%s.%s", prefix, key);
}

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

/* ---- declarative key tables --------------------------------------- */

typedef enum key_kind {
    KEY_INT,    /* int64_t; a JSON integer or a whole real (5e8), as DeepSpeed coerces */
    KEY_BOOL,   /* bool; JSON true/false only (DeepSpeed would coerce "yes"; zdp does not) */
    KEY_NUMBER, /* double; a JSON integer or real */
    KEY_ANY,    /* a DeepSpeed key accepted silently and ignored */
    KEY_UNUSED, /* a DeepSpeed key zdp does not implement: listed in the warning */
    KEY_CUSTOM, /* handled by the block's own code (sub-blocks, enums, lists) */
} key_kind;

#define NO_FIELD_ ((size_t)-1) /* type-checked, not stored */

/* One row per key, redis's standardConfig: name, type, where it is stored,
 * bounds and default together, so a key is added in one place.  The
 * defaults are stored by zdp_config_default (or, for the scheduler's
 * params, when that block is parsed); test_config_keys checks them and
 * docs/config.md against these rows. */
typedef struct key_spec {
    const char *name;
    key_kind kind;
    size_t offset;    /* into the block's struct, or NO_FIELD_ */
    double def;       /* the default (KEY_BOOL: 0 or 1); NO_DEF_: derived, required or not stored */
    double min, max;  /* inclusive bounds for KEY_INT / KEY_NUMBER */
    const char *hint; /* the fix for a bad value; NULL: a generic one */
} key_spec;

#define NO_DEF_ NAN

#define K_INT_(n, off, def, lo, hint) {n, KEY_INT, off, def, lo, DBL_MAX, hint}
#define K_INT_MAX_(n, off, def, lo, hi, hint) {n, KEY_INT, off, def, lo, hi, hint}
#define K_BOOL_(n, off, def) {n, KEY_BOOL, off, def, 0, 0, NULL}
#define K_NUM_(n, off, def, lo, hi) {n, KEY_NUMBER, off, def, lo, hi, NULL}
#define K_ANY_(n) {n, KEY_ANY, NO_FIELD_, NO_DEF_, 0, 0, NULL}
#define K_UNUSED_(n) {n, KEY_UNUSED, NO_FIELD_, NO_DEF_, 0, 0, NULL}
#define K_CUSTOM_(n) {n, KEY_CUSTOM, NO_FIELD_, NO_DEF_, 0, 0, NULL}
#define COUNT_(a) (sizeof(a) / sizeof((a)[0]))

static const key_spec top_keys_[] = {
    K_INT_("train_batch_size", offsetof(zdp_config, train_batch_size), NO_DEF_, 1,
           "set the global batch (samples per optimizer step over all ranks), or remove "
           "the key and let zdp derive it"),
    K_INT_("train_micro_batch_size_per_gpu", offsetof(zdp_config, micro_batch_size), NO_DEF_, 1,
           "set the samples per rank per forward/backward, or remove the key and let "
           "zdp derive it"),
    K_INT_("gradient_accumulation_steps", offsetof(zdp_config, gradient_accumulation_steps),
           NO_DEF_, 1, "set the micro-steps per optimizer step (1 for none), or remove the key"),
    K_BOOL_("managed_gradient_accumulation",
            offsetof(zdp_config, managed_gradient_accumulation), true),
    /* DeepSpeed computes global_steps % steps_per_print, so 0 cannot mean "off". */
    K_INT_("steps_per_print", offsetof(zdp_config, steps_per_print), 10, 1,
           "write a positive print interval, e.g. 10"),
    /* DeepSpeed's default since #8068 (it used to be 0). */
    K_NUM_("gradient_clipping", offsetof(zdp_config, gradient_clipping), 1.0, 0, DBL_MAX),
    K_BOOL_("zero_allow_untested_optimizer",
            offsetof(zdp_config, zero_allow_untested_optimizer), false),
    K_CUSTOM_("optimizer"),
    K_CUSTOM_("scheduler"),
    K_CUSTOM_("zero_optimization"),
    K_CUSTOM_("pipeline"),
    K_CUSTOM_("amp"),
    K_CUSTOM_("fp16"),
    K_CUSTOM_("bf16"),
    K_CUSTOM_("bfloat16"),
    /* DeepSpeed keys that would change the numbers if zdp honoured them: the
     * warning names them as unused, so nobody trains believing they apply. */
    K_UNUSED_("prescale_gradients"),
    K_UNUSED_("gradient_predivide_factor"),
    K_UNUSED_("communication_data_type"),
    K_UNUSED_("data_types"),
    K_UNUSED_("checkpoint"),
    K_UNUSED_("seed"),
    /* Monitoring, profiling and the CPU-optimizer guard: no effect on the
     * numbers; accepted silently. */
    K_ANY_("wall_clock_breakdown"),
    K_ANY_("dump_state"),
    K_ANY_("tensorboard"),
    K_ANY_("csv_monitor"),
    K_ANY_("wandb"),
    K_ANY_("flops_profiler"),
    K_ANY_("zero_force_ds_cpu_optimizer"),
    K_ANY_("memory_breakdown"),
};

static const key_spec zero_keys_[] = {
    K_CUSTOM_("stage"),
    K_BOOL_("overlap_comm", offsetof(zdp_zero_config, overlap_comm), false),
    /* Not DeepSpeed's 5e8: measured on the ring reduce-scatter (docs/benchmarks.md),
     * 2^18 elements is where it reaches the all-reduce's bus bandwidth, and a
     * 5e8 bucket would hold the whole gradient of most models. */
    K_INT_("reduce_bucket_size", offsetof(zdp_zero_config, reduce_bucket_size), 262144, 1,
           "write a bucket size in elements >= 1, e.g. 5e8"),
    K_INT_("allgather_bucket_size", offsetof(zdp_zero_config, allgather_bucket_size), 5e8, 1,
           "write an even bucket size in elements, e.g. 5e8"),
    K_BOOL_("contiguous_gradients", offsetof(zdp_zero_config, contiguous_gradients), true),
    K_BOOL_("reduce_scatter", offsetof(zdp_zero_config, reduce_scatter), true),
    /* Stage 3, with DeepSpeed's defaults (docs/config.md). */
    K_INT_("stage3_prefetch_bucket_size", offsetof(zdp_zero_config, stage3_prefetch_bucket_size),
           5e7, 0, "write a number of elements >= 0 (0 turns prefetch off), e.g. 5e7"),
    K_INT_("stage3_param_persistence_threshold",
           offsetof(zdp_zero_config, stage3_param_persistence_threshold), 1e5, 0,
           "write a number of elements >= 0 (0: every tensor is partitioned), e.g. 1e5"),
    K_INT_("stage3_max_live_parameters", offsetof(zdp_zero_config, stage3_max_live_parameters),
           1e9, 0, "write a number of elements >= 0, e.g. 1e9"),
    K_INT_("stage3_max_reuse_distance", offsetof(zdp_zero_config, stage3_max_reuse_distance), 1e9,
           0, "write a number of elements >= 0, e.g. 1e9"),
    K_CUSTOM_("offload_optimizer"),
    K_CUSTOM_("offload_param"),
    K_CUSTOM_("cpu_offload"),
    /* DeepSpeed keys (docs/config.md, zero_optimization) that change nothing zdp does today:
     * named in the warning as unused rather than unknown. */
    K_UNUSED_("use_multi_rank_bucket_allreduce"),
    K_UNUSED_("allgather_partitions"),
    K_UNUSED_("round_robin_gradients"),
    K_UNUSED_("ignore_unused_parameters"),
    K_UNUSED_("load_from_fp32_weights"),
    K_UNUSED_("elastic_checkpoint"),
    K_UNUSED_("sub_group_size"),
    K_UNUSED_("stage3_model_persistence_threshold"),
    K_UNUSED_("stage3_gather_16bit_weights_on_model_save"),
    K_UNUSED_("legacy_stage1"),
};

static const key_spec offload_optimizer_keys_[] = {
    K_CUSTOM_("device"),
    K_ANY_("nvme_path"), /* a string or null in DeepSpeed */
    K_BOOL_("pin_memory", NO_FIELD_, NO_DEF_),
    K_INT_("buffer_count", NO_FIELD_, NO_DEF_, 0, NULL),
    K_NUM_("ratio", NO_FIELD_, NO_DEF_, 0, 1),
    K_BOOL_("fast_init", NO_FIELD_, NO_DEF_),
};

static const key_spec offload_param_keys_[] = {
    K_CUSTOM_("device"),
    K_ANY_("nvme_path"),
    K_BOOL_("pin_memory", NO_FIELD_, NO_DEF_),
    K_INT_("buffer_count", NO_FIELD_, NO_DEF_, 0, NULL),
    K_INT_("buffer_size", NO_FIELD_, NO_DEF_, 0, NULL),
    K_INT_("max_in_cpu", NO_FIELD_, NO_DEF_, 0, NULL),
};

static const key_spec optimizer_keys_[] = {
    K_CUSTOM_("type"),
    K_CUSTOM_("params"),
    K_ANY_("legacy_fusion"), /* DeepSpeed optimizer-block flag, no effect here */
};

static const key_spec adam_param_keys_[] = {
    /* The bounds of zdp_hparams_check (zdp.h); eps = 0 is refused later,
     * in check_fields_ (the range here is inclusive). */
    K_NUM_("lr", offsetof(zdp_optimizer_config, lr), 1e-3, 0, ZDP_HPARAM_LR_MAX),
    K_CUSTOM_("betas"),
    K_NUM_("eps", offsetof(zdp_optimizer_config, eps), 1e-8, 0, ZDP_HPARAM_EPS_MAX),
    K_NUM_("weight_decay", offsetof(zdp_optimizer_config, weight_decay), 0, 0,
           ZDP_HPARAM_WEIGHT_DECAY_MAX),
    K_BOOL_("adam_w_mode", offsetof(zdp_optimizer_config, adam_w_mode), true),
    K_BOOL_("bias_correction", offsetof(zdp_optimizer_config, bias_correction), true),
    K_BOOL_("torch_adam", NO_FIELD_, NO_DEF_), /* which Python class; same math */
    K_CUSTOM_("amsgrad"),
    K_CUSTOM_("max_grad_norm"),
};

static const key_spec scheduler_keys_[] = {
    K_CUSTOM_("type"),
    K_CUSTOM_("params"),
};

/* One table for the three schedules' params; keys a schedule does not take
 * are reported by parse_scheduler_. */
#define SCHED_(f) offsetof(zdp_scheduler_config, f)
static const key_spec scheduler_param_keys_[] = {
    K_NUM_("warmup_min_lr", SCHED_(warmup_min_lr), 0, 0, ZDP_HPARAM_LR_MAX),
    /* WarmupDecayLR's default; WarmupLR's is the optimizer's lr (parse_scheduler_). */
    K_NUM_("warmup_max_lr", SCHED_(warmup_max_lr), 0.001, 0, ZDP_HPARAM_LR_MAX),
    K_INT_MAX_("warmup_num_steps", SCHED_(warmup_num_steps), 1000, 1, ZDP_HPARAM_STEPS_MAX,
               "write the number of warm-up steps, an integer in [1, 1e12]"),
    K_CUSTOM_("warmup_type"),
    K_INT_MAX_("total_num_steps", SCHED_(total_num_steps), NO_DEF_, 1, ZDP_HPARAM_STEPS_MAX,
               "write the total number of optimizer steps of the run, an integer in [1, 1e12]"),
    K_NUM_("warmup_min_ratio", SCHED_(warmup_min_ratio), 0, 0, 1),
    K_NUM_("cos_min_ratio", SCHED_(cos_min_ratio), 0.0001, 0, 1),
    /* Where a resumed schedule starts: zdp checkpoints restore it themselves. */
    K_UNUSED_("last_batch_iteration"),
};

static const key_spec sgd_param_keys_[] = {
    /* torch.optim.SGD has no default lr: parse_optimizer_ requires it. */
    K_NUM_("lr", offsetof(zdp_optimizer_config, lr), NO_DEF_, 0, ZDP_HPARAM_LR_MAX),
    K_NUM_("momentum", offsetof(zdp_optimizer_config, momentum), 0, 0, DBL_MAX),
    /* torch.optim.SGD puts no bound on dampening. */
    K_NUM_("dampening", offsetof(zdp_optimizer_config, dampening), 0, -DBL_MAX, DBL_MAX),
    K_NUM_("weight_decay", offsetof(zdp_optimizer_config, weight_decay), 0, 0,
           ZDP_HPARAM_WEIGHT_DECAY_MAX),
    K_BOOL_("nesterov", offsetof(zdp_optimizer_config, nesterov), false),
    K_CUSTOM_("max_grad_norm"),
};

/* Every table with the JSON path of its block: the map that
 * zdp_config_default and zdp_config_key_get walk. */
typedef struct key_block {
    const char *prefix;     /* JSON path of the block; "" at top level */
    const key_spec *specs;
    size_t n;
    size_t offset;          /* of the block's struct in zdp_config, or NO_FIELD_ */
    bool at_default;        /* zdp_config_default stores the defaults; else the parser does */
} key_block;

#define BLOCK_(prefix, specs, off, at_default) {prefix, specs, COUNT_(specs), off, at_default}
static const key_block key_blocks_[] = {
    BLOCK_("", top_keys_, 0, true),
    BLOCK_("zero_optimization", zero_keys_, offsetof(zdp_config, zero), true),
    BLOCK_("zero_optimization.offload_optimizer", offload_optimizer_keys_, NO_FIELD_, false),
    BLOCK_("zero_optimization.offload_param", offload_param_keys_, NO_FIELD_, false),
    BLOCK_("optimizer", optimizer_keys_, NO_FIELD_, false),
    /* Adam's and SGD's params share zdp_optimizer_config; SGD's lr has no default. */
    BLOCK_("optimizer.params", adam_param_keys_, offsetof(zdp_config, optimizer), true),
    BLOCK_("optimizer.params", sgd_param_keys_, offsetof(zdp_config, optimizer), true),
    BLOCK_("scheduler", scheduler_keys_, NO_FIELD_, false),
    /* Applied when a scheduler block is parsed: the type decides which matter. */
    BLOCK_("scheduler.params", scheduler_param_keys_, offsetof(zdp_config, scheduler), false),
};

/* Stores the default of every row that has one and a field in `base`. */
static void apply_defaults_(const key_spec *specs, size_t n, void *base) {
    for (size_t i = 0; i < n; i++) {
        const key_spec *s = &specs[i];
        if (s->offset == NO_FIELD_ || isnan(s->def)) continue;
        char *field = (char *)base + s->offset;
        if (s->kind == KEY_INT) {
            int64_t x = (int64_t)s->def;
            memcpy(field, &x, sizeof x);
        } else if (s->kind == KEY_BOOL) {
            bool b = s->def != 0.0;
            memcpy(field, &b, sizeof b);
        } else if (s->kind == KEY_NUMBER) {
            memcpy(field, &s->def, sizeof s->def);
        }
    }
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
static zdp_status parse_block_(parse_ctx *ctx, const json_t *obj, const char *prefix,
                               const key_spec *specs, size_t n, void *base) {
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)obj, key, v) {
        char path[PATH_MAX_];
        path_join_(path, prefix, key);
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

static zdp_status stage_range_error_(zdp_error *err, long long stage) {
    return zdp_err_set(err, ZDP_ERR_CONFIG,
                       "zero_optimization.stage = %lld: supported values are 0, 1, 2, 3; "
                       "set 2 for optimizer+gradient sharding, 3 to partition the "
                       "parameters too", stage);
}

static zdp_status parse_offload_(parse_ctx *ctx, const json_t *v, const char *path,
                                 const key_spec *specs, size_t n,
                                 zdp_offload_device *out) {
    *out = ZDP_OFFLOAD_NONE;
    if (json_is_null(v)) return ZDP_OK; /* DeepSpeed: null is an absent block */
    if (!json_is_object(v))
        return fail_value_(ctx, ZDP_ERR_CONFIG, path, v,
                           "expected an object like {\"device\": \"none\"}, got %s; fix: "
                           "remove the key (zdp does not offload)", zdp_json_type_name(v));
    zdp_status st = parse_block_(ctx, v, path, specs, n, NULL);
    if (st != ZDP_OK) return st;
    const json_t *dev = json_object_get(v, "device");
    if (dev == NULL) return ZDP_OK; /* the default device is "none" (docs/deepspeed.md §3.7) */
    char dpath[PATH_MAX_];
    path_join_(dpath, path, "device");
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
    zdp_status st = parse_block_(ctx, v, "zero_optimization", zero_keys_, COUNT_(zero_keys_), z);
    if (st != ZDP_OK) return st;

    const json_t *s = json_object_get(v, "stage");
    if (s != NULL) {
        int64_t stage = 0;
        st = read_int_(ctx, "zero_optimization.stage", s, -DBL_MAX, DBL_MAX,
                       "set 0, 1, 2 or 3 (2 shards optimizer state and gradients, 3 parameters too)", &stage);
        if (st != ZDP_OK) return st;
        if (stage < 0 || stage > 3) return stage_range_error_(ctx->err, (long long)stage);
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
        (st = parse_offload_(ctx, off, "zero_optimization.offload_optimizer",
                             offload_optimizer_keys_, COUNT_(offload_optimizer_keys_),
                             &z->offload_optimizer)) != ZDP_OK)
        return st;
    off = json_object_get(v, "offload_param");
    if (off != NULL &&
        (st = parse_offload_(ctx, off, "zero_optimization.offload_param", offload_param_keys_,
                             COUNT_(offload_param_keys_), &z->offload_param)) != ZDP_OK)
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
    zdp_status st = parse_block_(ctx, v, "optimizer", optimizer_keys_, COUNT_(optimizer_keys_), NULL);
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
        st = parse_block_(ctx, params, "optimizer.params",
                          sgd ? sgd_param_keys_ : adam_param_keys_,
                          sgd ? COUNT_(sgd_param_keys_) : COUNT_(adam_param_keys_), o);
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
    path_join_(p, path, "enabled");
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
    zdp_status st = parse_block_(ctx, v, "scheduler", scheduler_keys_, COUNT_(scheduler_keys_), NULL);
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
    apply_defaults_(scheduler_param_keys_, COUNT_(scheduler_param_keys_), s);
    if (s->type == ZDP_SCHEDULER_WARMUP_LR) s->warmup_max_lr = NAN;
    s->warmup_linear = false; /* warmup_type "log" */
    s->total_num_steps = 0;   /* required by the decaying schedules: no default */
    st = parse_block_(ctx, params, "scheduler.params", scheduler_param_keys_,
                      COUNT_(scheduler_param_keys_), s);
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
            path_join_(path, "scheduler.params", key);
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
    zdp_status st = parse_block_(ctx, root, "", top_keys_, COUNT_(top_keys_), cfg);
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

/* ---- batch sizes (docs/deepspeed.md §1.2) ----------------------------- */

enum { DERIVED_B_ = 1, DERIVED_MICRO_ = 2, DERIVED_G_ = 4 };

/* a * b for non-negative a, b; false on int64 overflow. */
static bool mul_ok_(int64_t a, int64_t b, int64_t *out) {
    if (a < 0 || b < 0) return false;
    if (a != 0 && b > INT64_MAX / a) return false;
    *out = a * b;
    return true;
}

static bool mul3_ok_(int64_t a, int64_t b, int64_t c, int64_t *out) {
    int64_t ab;
    return mul_ok_(a, b, &ab) && mul_ok_(ab, c, out);
}

/* DeepSpeed's four batch checks, in order, with its messages as the core.
 * `derived` marks which values zdp computed (0 from zdp_config_validate). */
static zdp_status check_batch_(const zdp_config *c, int derived, zdp_error *err) {
    long long B = (long long)c->train_batch_size, b = (long long)c->micro_batch_size;
    long long G = (long long)c->gradient_accumulation_steps;
    int W = c->world_size;
    char pre[400];
    snprintf(pre, sizeof pre,
             "train_batch_size = %lld%s, train_micro_batch_size_per_gpu = %lld%s, "
             "gradient_accumulation_steps = %lld%s, world size %d (the MPI world size)",
             B, (derived & DERIVED_B_) ? " (derived)" : "",
             b, (derived & DERIVED_MICRO_) ? " (derived)" : "",
             G, (derived & DERIVED_G_) ? " (derived)" : "", W);
    int64_t prod;
    if (B <= 0)
        return zdp_err_set(err, ZDP_ERR_CONFIG,
                           "%s: Train batch size: %lld has to be greater than 0; fix: set "
                           "train_batch_size >= 1, or set train_micro_batch_size_per_gpu and "
                           "let zdp derive it", pre, B);
    if (b <= 0) {
        if ((derived & DERIVED_MICRO_) && G > 0 && mul_ok_(G, W, &prod))
            return zdp_err_set(err, ZDP_ERR_CONFIG,
                               "%s: Micro batch size per gpu: %lld has to be greater than 0; "
                               "fix: train_batch_size must be at least gradient_accumulation_"
                               "steps * world size = %lld, or set "
                               "train_micro_batch_size_per_gpu explicitly", pre, b,
                               (long long)prod);
        return zdp_err_set(err, ZDP_ERR_CONFIG,
                           "%s: Micro batch size per gpu: %lld has to be greater than 0; fix: "
                           "set train_micro_batch_size_per_gpu >= 1", pre, b);
    }
    if (G <= 0) {
        if ((derived & DERIVED_G_) && mul_ok_(b, W, &prod))
            return zdp_err_set(err, ZDP_ERR_CONFIG,
                               "%s: Gradient accumulation steps: %lld has to be greater than "
                               "0; fix: train_batch_size must be at least "
                               "train_micro_batch_size_per_gpu * world size = %lld, or lower "
                               "train_micro_batch_size_per_gpu", pre, G, (long long)prod);
        return zdp_err_set(err, ZDP_ERR_CONFIG,
                           "%s: Gradient accumulation steps: %lld has to be greater than 0; "
                           "fix: set gradient_accumulation_steps >= 1", pre, G);
    }
    if (mul3_ok_(b, G, W, &prod) && prod == B) return ZDP_OK;

    const char *core = "Check batch related parameters. train_batch_size is not equal to "
                       "micro_batch_per_gpu * gradient_acc_step * world_size";
    char fix[320];
    int64_t unit;
    if (!mul3_ok_(b, G, W, &prod)) {
        snprintf(fix, sizeof fix, "b * G * W overflows a 64-bit integer; use smaller values");
    } else if ((derived & DERIVED_G_) && !(derived & DERIVED_MICRO_) && mul_ok_(b, W, &unit)) {
        snprintf(fix, sizeof fix,
                 "train_batch_size must be a multiple of train_micro_batch_size_per_gpu * "
                 "world size = %lld (e.g. %lld), or set gradient_accumulation_steps and "
                 "drop train_batch_size", (long long)unit, (long long)(prod > 0 ? prod : unit));
    } else if ((derived & DERIVED_MICRO_) && !(derived & DERIVED_G_) && mul_ok_(G, W, &unit)) {
        snprintf(fix, sizeof fix,
                 "train_batch_size must be a multiple of gradient_accumulation_steps * "
                 "world size = %lld (e.g. %lld), or set train_micro_batch_size_per_gpu and "
                 "drop train_batch_size", (long long)unit, (long long)prod);
    } else if ((derived & DERIVED_MICRO_) && (derived & DERIVED_G_)) {
        snprintf(fix, sizeof fix,
                 "train_batch_size must be a multiple of the world size %d (e.g. %lld), or "
                 "set train_micro_batch_size_per_gpu instead of train_batch_size", W,
                 (long long)prod);
    } else {
        snprintf(fix, sizeof fix,
                 "set train_batch_size = %lld (= %lld * %lld * %d), or remove one of the "
                 "three keys and let zdp derive it", (long long)prod, b, G, W);
    }
    return zdp_err_set(err, ZDP_ERR_CONFIG, "%s: %s %lld != %lld * %lld * %d; fix: %s", pre,
                       core, B, b, G, W, fix);
}

/* Fills the absent batch keys from the present ones (0 = absent), exactly as
 * DeepSpeed's _set_batch_related_parameters, then runs its checks. */
static zdp_status derive_batch_(zdp_config *c, zdp_error *err) {
    int64_t B = c->train_batch_size, b = c->micro_batch_size, G = c->gradient_accumulation_steps;
    int64_t W = c->world_size;
    bool hB = B > 0, hb = b > 0, hG = G > 0;
    int derived = 0;
    if (hB && hb && hG) {
        /* nothing to derive */
    } else if (hB && hb) {
        G = (B / b) / W;
        derived = DERIVED_G_;
    } else if (hB && hG) {
        b = (B / W) / G;
        derived = DERIVED_MICRO_;
    } else if (hb && hG) {
        if (!mul3_ok_(b, G, W, &B))
            return zdp_err_set(err, ZDP_ERR_CONFIG,
                               "train_micro_batch_size_per_gpu = %lld, "
                               "gradient_accumulation_steps = %lld, world size %d: the derived "
                               "train_batch_size = b * G * W overflows a 64-bit integer; fix: "
                               "use smaller values", (long long)b, (long long)G, c->world_size);
        derived = DERIVED_B_;
    } else if (hB) {
        G = 1;
        b = B / W;
        derived = DERIVED_G_ | DERIVED_MICRO_;
    } else if (hb) {
        G = 1;
        if (!mul_ok_(b, W, &B))
            return zdp_err_set(err, ZDP_ERR_CONFIG,
                               "train_micro_batch_size_per_gpu = %lld, world size %d: the "
                               "derived train_batch_size = b * W overflows a 64-bit integer; "
                               "fix: use a smaller value", (long long)b, c->world_size);
        derived = DERIVED_G_ | DERIVED_B_;
    } else {
        char seen[96] = "";
        if (hG)
            snprintf(seen, sizeof seen, " (gradient_accumulation_steps = %lld alone does not "
                     "fix the batch)", (long long)G);
        return zdp_err_set(err, ZDP_ERR_CONFIG,
                           "train_batch_size, train_micro_batch_size_per_gpu: both missing%s: "
                           "Either train_batch_size or train_micro_batch_size_per_gpu needs to "
                           "be provided; fix: add \"train_micro_batch_size_per_gpu\": N "
                           "(samples per rank per micro-step)", seen);
    }
    c->train_batch_size = B;
    c->micro_batch_size = b;
    c->gradient_accumulation_steps = G;
    return check_batch_(c, derived, err);
}

/* ---- validation ------------------------------------------------------- */

/* The scheduler's fields, for structs built by hand (the parser enforces
 * the same per key): every lr and ratio finite and in range, step counts
 * in [1, ZDP_HPARAM_STEPS_MAX]. */
static zdp_status check_scheduler_(const zdp_scheduler_config *s, zdp_error *err) {
    if (s->type == ZDP_SCHEDULER_NONE) return ZDP_OK;
    if ((unsigned)s->type > ZDP_SCHEDULER_WARMUP_COSINE_LR)
        return zdp_err_set(err, ZDP_ERR_CONFIG, "scheduler.type = %d: not a "
                           "zdp_scheduler_type value; fix: use ZDP_SCHEDULER_WARMUP_LR",
                           (int)s->type);
    const struct {
        const char *key;
        double v, max;
    } nums[] = {{"warmup_min_lr", s->warmup_min_lr, ZDP_HPARAM_LR_MAX},
                {"warmup_max_lr", s->warmup_max_lr, ZDP_HPARAM_LR_MAX},
                {"warmup_min_ratio", s->warmup_min_ratio, 1.0},
                {"cos_min_ratio", s->cos_min_ratio, 1.0}};
    for (size_t i = 0; i < COUNT_(nums); i++)
        if (!(nums[i].v >= 0.0 && nums[i].v <= nums[i].max))
            return zdp_err_set(err, ZDP_ERR_CONFIG, "scheduler.params.%s = %g: must be a number "
                               "in [0, %g]; fix: write e.g. %s", nums[i].key, nums[i].v,
                               nums[i].max, nums[i].max == 1.0 ? "0" : "1e-3");
    const struct {
        const char *key;
        int64_t v;
        bool needed;
    } ints[] = {{"warmup_num_steps", s->warmup_num_steps, true},
                {"total_num_steps", s->total_num_steps, s->type != ZDP_SCHEDULER_WARMUP_LR}};
    for (size_t i = 0; i < COUNT_(ints); i++)
        if (ints[i].needed && !(ints[i].v >= 1 && (double)ints[i].v <= ZDP_HPARAM_STEPS_MAX))
            return zdp_err_set(err, ZDP_ERR_CONFIG, "scheduler.params.%s = %lld: must be an "
                               "integer in [1, 1e12]; fix: write the number of optimizer steps",
                               ints[i].key, (long long)ints[i].v);
    return ZDP_OK;
}

/* Ranges of the struct's fields: what the parser enforces per key, again,
 * for structs built or edited by hand. */
static zdp_status check_fields_(const zdp_config *c, zdp_error *err) {
    const zdp_zero_config *z = &c->zero;
    const zdp_optimizer_config *o = &c->optimizer;
    if (c->steps_per_print < 1)
        return zdp_err_set(err, ZDP_ERR_CONFIG, "steps_per_print = %lld: must be >= 1; fix: "
                           "write a positive print interval, e.g. 10",
                           (long long)c->steps_per_print);
    if (!(c->gradient_clipping >= 0.0 && c->gradient_clipping <= DBL_MAX))
        return zdp_err_set(err, ZDP_ERR_CONFIG, "gradient_clipping = %g: must be a finite "
                           "number >= 0; fix: write 1.0 (DeepSpeed's default) or 0 to disable",
                           c->gradient_clipping);
    if (z->stage < 0 || z->stage > 3) return stage_range_error_(err, z->stage);
    if (z->reduce_bucket_size < 1)
        return zdp_err_set(err, ZDP_ERR_CONFIG, "zero_optimization.reduce_bucket_size = %lld: "
                           "must be >= 1; fix: write a bucket size in elements, e.g. 5e8",
                           (long long)z->reduce_bucket_size);
    if (z->allgather_bucket_size < 1 || z->allgather_bucket_size % 2 != 0)
        return zdp_err_set(err, ZDP_ERR_CONFIG, "zero_optimization.allgather_bucket_size = "
                           "%lld: allgather_bucket_size must be a multiple of "
                           "nccl_start_alignment_factor, 2 (and >= 2); fix: use an even size, "
                           "e.g. 500000000", (long long)z->allgather_bucket_size);
    if ((unsigned)z->offload_optimizer > ZDP_OFFLOAD_NVME || (unsigned)z->offload_param > ZDP_OFFLOAD_NVME)
        return zdp_err_set(err, ZDP_ERR_CONFIG, "zero_optimization.offload_*.device: not a "
                           "zdp_offload_device value; fix: use ZDP_OFFLOAD_NONE");
    if ((unsigned)o->type > ZDP_OPTIMIZER_SGD)
        return zdp_err_set(err, ZDP_ERR_CONFIG, "optimizer.type = %d: not a "
                           "zdp_optimizer_type value; fix: use ZDP_OPTIMIZER_ADAM, _ADAMW or "
                           "_SGD", (int)o->type);
    if (!(o->lr >= 0.0 && o->lr <= ZDP_HPARAM_LR_MAX))
        return zdp_err_set(err, ZDP_ERR_CONFIG, "optimizer.params.lr = %g: must be a number "
                           "in [0, %g]; fix: write e.g. 1e-3", o->lr, ZDP_HPARAM_LR_MAX);
    if (!(o->weight_decay >= 0.0 && o->weight_decay <= ZDP_HPARAM_WEIGHT_DECAY_MAX))
        return zdp_err_set(err, ZDP_ERR_CONFIG, "optimizer.params.weight_decay = %g: must be a "
                           "number in [0, %g]; fix: write 0 or e.g. 0.01", o->weight_decay,
                           ZDP_HPARAM_WEIGHT_DECAY_MAX);
    if (o->type == ZDP_OPTIMIZER_SGD) {
        if (!(o->momentum >= 0.0 && o->momentum <= DBL_MAX))
            return zdp_err_set(err, ZDP_ERR_CONFIG, "optimizer.params.momentum = %g: must be "
                               "a finite number >= 0; fix: write 0 or e.g. 0.9", o->momentum);
        if (!isfinite(o->dampening))
            return zdp_err_set(err, ZDP_ERR_CONFIG, "optimizer.params.dampening = %g: must be "
                               "finite; fix: write 0", o->dampening);
        if (o->nesterov && (o->momentum <= 0.0 || o->dampening != 0.0))
            return zdp_err_set(err, ZDP_ERR_CONFIG,
                               "optimizer.params.nesterov = true, momentum = %g, dampening = %g: "
                               "Nesterov momentum requires a momentum and zero dampening; fix: "
                               "set momentum > 0 and dampening 0, or nesterov false",
                               o->momentum, o->dampening);
    } else {
        if (!(o->beta1 >= 0.0 && o->beta1 < 1.0 && o->beta2 >= 0.0 && o->beta2 < 1.0))
            return zdp_err_set(err, ZDP_ERR_CONFIG, "optimizer.params.betas = [%g, %g]: each "
                               "beta must satisfy 0 <= beta < 1; fix: write [0.9, 0.999]",
                               o->beta1, o->beta2);
        /* eps = 0 divides 0 by 0 for a parameter whose gradient has been 0
         * (an unused embedding row): NaN weights on the first step. */
        if (!(o->eps > 0.0 && o->eps <= ZDP_HPARAM_EPS_MAX))
            return zdp_err_set(err, ZDP_ERR_CONFIG, "optimizer.params.eps = %g: must be a "
                               "number in (0, %g]; fix: write 1e-8", o->eps,
                               ZDP_HPARAM_EPS_MAX);
    }
    return check_scheduler_(&c->scheduler, err);
}

static zdp_status validate_(const zdp_config *c, int derived, zdp_error *err) {
    if (c == NULL) return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "config: NULL pointer");
    if (c->world_size < 1)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "world_size = %d: must be >= 1 (the number of MPI ranks); fix: pass "
                           "zdp_dist_world_size()", c->world_size);
    zdp_status st;
    /* 1. the batch triple */
    if ((st = check_batch_(c, derived, err)) != ZDP_OK) return st;
    if ((st = check_fields_(c, err)) != ZDP_OK) return st;

    const zdp_zero_config *z = &c->zero;
    /* 2. stage 3's keys (set by hand, they skip the parser's checks) */
    const struct {
        const char *key;
        int64_t v;
    } s3[] = {{"stage3_prefetch_bucket_size", z->stage3_prefetch_bucket_size},
              {"stage3_param_persistence_threshold", z->stage3_param_persistence_threshold},
              {"stage3_max_live_parameters", z->stage3_max_live_parameters},
              {"stage3_max_reuse_distance", z->stage3_max_reuse_distance}};
    for (size_t k = 0; k < sizeof s3 / sizeof s3[0]; k++)
        if (s3[k].v < 0)
            return zdp_err_set(err, ZDP_ERR_CONFIG,
                               "zero_optimization.%s = %lld: must be >= 0 (elements); fix: "
                               "remove it for DeepSpeed's default",
                               s3[k].key, (long long)s3[k].v);
    /* 3. offload (a "none" block is not offload, docs/deepspeed.md §3.7) */
    static const char *const dev_names[] = {"none", "cpu", "nvme"};
    if (z->offload_optimizer != ZDP_OFFLOAD_NONE)
        return zdp_err_set(err, ZDP_ERR_UNSUPPORTED,
                           "zero_optimization.offload_optimizer.device = \"%s\": optimizer "
                           "offload is not implemented in zdp; remove the block or set "
                           "\"device\": \"none\"%s", dev_names[z->offload_optimizer],
                           " (the deprecated \"cpu_offload\": true means device \"cpu\")");
    if (z->offload_param != ZDP_OFFLOAD_NONE)
        return zdp_err_set(err, ZDP_ERR_UNSUPPORTED,
                           "zero_optimization.offload_param.device = \"%s\": parameter offload "
                           "is not implemented in zdp; remove the block or set \"device\": "
                           "\"none\"", dev_names[z->offload_param]);
    /* 4. 16-bit training */
    if (c->fp16_enabled && c->bf16_enabled)
        return zdp_err_set(err, ZDP_ERR_CONFIG,
                           "fp16.enabled = true, bf16.enabled = true: bfloat16 and fp16 modes "
                           "cannot be simultaneously enabled; fix: enable at most one (zdp "
                           "implements neither yet: disable both)");
    if (c->fp16_enabled)
        return zdp_err_set(err, ZDP_ERR_UNSUPPORTED,
                           "fp16.enabled = true: fp16 training is not implemented in zdp yet; "
                           "set \"enabled\": false or remove the fp16 block (zdp trains in fp32)");
    if (c->bf16_enabled)
        return zdp_err_set(err, ZDP_ERR_UNSUPPORTED,
                           "bf16.enabled = true: bf16 training is not implemented in zdp yet; "
                           "set \"enabled\": false or remove the bf16 block (zdp trains in fp32)");
    /* 5. ZeRO's tested-optimizer list (docs/deepspeed.md §6.4) */
    if (c->optimizer.type == ZDP_OPTIMIZER_SGD && z->stage >= 1 &&
        !c->zero_allow_untested_optimizer)
        return zdp_err_set(err, ZDP_ERR_CONFIG,
                           "optimizer.type = \"SGD\", zero_optimization.stage = %d: You are "
                           "using an untested ZeRO Optimizer. Please add "
                           "<\"zero_allow_untested_optimizer\": true> in the configuration file "
                           "to use it.; fix: set \"zero_allow_untested_optimizer\": true, or "
                           "use stage 0, or Adam/AdamW", z->stage);
    if (!c->managed_gradient_accumulation) {
        /* 6. DeepSpeed's unmanaged-mode rejections, in its order (docs/deepspeed.md §3.6) */
        if (z->overlap_comm && z->stage < 2)
            return zdp_err_set(err, ZDP_ERR_CONFIG,
                               "managed_gradient_accumulation = false, "
                               "zero_optimization.overlap_comm = true, zero_optimization.stage "
                               "= %d: managed_gradient_accumulation=False supports ZeRO "
                               "overlap_comm only with ZeRO stage 2; fix: set \"overlap_comm\": "
                               "false or use \"stage\": 2", z->stage);
        if (c->has_pipeline)
            return zdp_err_set(err, ZDP_ERR_CONFIG,
                               "managed_gradient_accumulation = false, pipeline: present: "
                               "managed_gradient_accumulation=False is not supported with "
                               "pipeline parallelism; fix: remove the pipeline block (zdp has "
                               "no pipeline parallelism)");
        if (c->amp_enabled)
            return zdp_err_set(err, ZDP_ERR_CONFIG,
                               "managed_gradient_accumulation = false, amp.enabled = true: "
                               "managed_gradient_accumulation=False is not supported with Apex "
                               "AMP; fix: set \"amp\": {\"enabled\": false}");
    } else {
        /* 7. the same features in managed mode */
        if (c->amp_enabled && z->stage > 0)
            return zdp_err_set(err, ZDP_ERR_CONFIG,
                               "amp.enabled = true, zero_optimization.stage = %d: Amp and ZeRO "
                               "are not currently compatible; fix: set \"amp\": {\"enabled\": "
                               "false}", z->stage);
        if (c->amp_enabled)
            return zdp_err_set(err, ZDP_ERR_UNSUPPORTED,
                               "amp.enabled = true: Apex AMP is not implemented in zdp; set "
                               "\"amp\": {\"enabled\": false}");
        if (c->has_pipeline)
            return zdp_err_set(err, ZDP_ERR_UNSUPPORTED,
                               "pipeline: present: pipeline parallelism is not implemented in "
                               "zdp; remove the pipeline block");
    }
    return ZDP_OK;
}

/* ---- public API ------------------------------------------------------- */

void zdp_config_default(zdp_config *cfg) {
    if (cfg == NULL) return;
    memset(cfg, 0, sizeof *cfg);
    cfg->world_size = 1;
    /* The batch keys have no default in their rows: 0 is "absent" until derived. */
    for (size_t i = 0; i < COUNT_(key_blocks_); i++)
        if (key_blocks_[i].at_default)
            apply_defaults_(key_blocks_[i].specs, key_blocks_[i].n,
                            (char *)cfg + key_blocks_[i].offset);
    /* The KEY_CUSTOM keys, whose rows store nothing themselves. */
    cfg->optimizer.type = ZDP_OPTIMIZER_ADAM;
    cfg->optimizer.beta1 = 0.9;
    cfg->optimizer.beta2 = 0.999;
    cfg->zero.stage = 0;
    cfg->zero.offload_optimizer = ZDP_OFFLOAD_NONE;
    cfg->zero.offload_param = ZDP_OFFLOAD_NONE;
}

size_t zdp_config_key_count(void) {
    size_t n = 0;
    for (size_t i = 0; i < COUNT_(key_blocks_); i++) n += key_blocks_[i].n;
    return n;
}

bool zdp_config_key_get(size_t index, zdp_config_key_info *out) {
    static const char *const kind_names[] = {"int", "bool", "number", "any", "unused", "custom"};
    for (size_t i = 0; i < COUNT_(key_blocks_); i++) {
        const key_block *b = &key_blocks_[i];
        if (index >= b->n) {
            index -= b->n;
            continue;
        }
        const key_spec *s = &b->specs[index];
        memset(out, 0, sizeof *out);
        path_join_(out->path, b->prefix, s->name);
        out->kind = kind_names[s->kind];
        out->def = s->def;
        out->config_offset = (b->offset == NO_FIELD_ || s->offset == NO_FIELD_)
                                 ? NO_FIELD_ : b->offset + s->offset;
        out->at_default = b->at_default;
        return true;
    }
    return false;
}

zdp_status zdp_config_validate(const zdp_config *cfg, zdp_error *err) {
    return validate_(cfg, 0, err);
}

zdp_status zdp_config_finalize(zdp_config *cfg, int world_size, zdp_error *err) {
    if (cfg == NULL) return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_config_finalize: cfg is NULL");
    if (world_size < 1)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "world_size = %d: must be >= 1 (the number of MPI ranks); fix: pass "
                           "zdp_dist_world_size()", world_size);
    zdp_config c = *cfg;
    c.world_size = world_size;
    zdp_status st = derive_batch_(&c, err);
    if (st == ZDP_OK) st = validate_(&c, 0, err);
    if (st == ZDP_OK) *cfg = c;
    return st;
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
    if ((st = derive_batch_(&cfg, err)) != ZDP_OK) return st;
    if ((st = validate_(&cfg, 0, err)) != ZDP_OK) return st;
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
