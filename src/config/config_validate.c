/*
 * config_validate.c -- the rules a whole ds_config must satisfy, in
 * DeepSpeed's order and with DeepSpeed's messages as the core of zdp's:
 * the batch triple derived and checked exactly as DeepSpeed does
 * (docs/deepspeed.md §1.2, integer floor division), every field's range
 * again (for structs built or edited by hand, which skip the parser), and
 * the features zdp does not implement (offload, fp16/bf16, AMP, pipeline)
 * refused by name (zdp_config_validate, zdp_config_finalize).
 *
 * No MPI: the world size is a field, so every rank reaches the same answer
 * from the same config without communicating.  Not here: reading JSON
 * (config_parse.c) and the per-key bounds (config_keys.c's rows).
 */
#include "config_impl.h"

#include "../core/core.h"

#include <float.h>
#include <math.h>
#include <stdio.h>

#include "zdp/config.h"
#include "zdp/engine.h"

zdp_status zdp_config_stage_range_error_(zdp_error *err, long long stage) {
    return zdp_err_set(err, ZDP_ERR_CONFIG,
                       "zero_optimization.stage = %lld: supported values are 0, 1, 2, 3; "
                       "set 2 for optimizer+gradient sharding, 3 to partition the "
                       "parameters too", stage);
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

zdp_status zdp_config_derive_batch_(zdp_config *c, zdp_error *err) {
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
    if (z->stage < 0 || z->stage > 3) return zdp_config_stage_range_error_(err, z->stage);
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
    zdp_status st = zdp_config_derive_batch_(&c, err);
    if (st == ZDP_OK) st = validate_(&c, 0, err);
    if (st == ZDP_OK) *cfg = c;
    return st;
}

