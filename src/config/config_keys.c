/*
 * config_keys.c -- the ds_config keys zdp knows, as declarative tables: one
 * row per key with its type, where zdp_config stores it, its bounds, its
 * default and the fix for a bad value.  A key is added here and nowhere
 * else: the parser (config_parse.c) reads each block against its table,
 * zdp_config_default stores the rows' defaults, and zdp_config_key_get hands
 * the rows to test_config_keys, which checks them against docs/config.md.
 *
 * Not here: reading JSON (config_parse.c) and the rules between keys
 * (config_validate.c).
 */
#include "config.h"
#include "config_impl.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "zdp/config.h"
#include "zdp/engine.h"

/* ---- declarative key tables --------------------------------------- */

#define NO_DEF_ NAN

#define K_INT_(n, off, def, lo, hint) {n, KEY_INT, off, def, lo, DBL_MAX, hint}
#define K_INT_MAX_(n, off, def, lo, hi, hint) {n, KEY_INT, off, def, lo, hi, hint}
#define K_BOOL_(n, off, def) {n, KEY_BOOL, off, def, 0, 0, NULL}
#define K_NUM_(n, off, def, lo, hi) {n, KEY_NUMBER, off, def, lo, hi, NULL}
#define K_ANY_(n) {n, KEY_ANY, NO_FIELD_, NO_DEF_, 0, 0, NULL}
#define K_UNUSED_(n) {n, KEY_UNUSED, NO_FIELD_, NO_DEF_, 0, 0, NULL}
#define K_CUSTOM_(n) {n, KEY_CUSTOM, NO_FIELD_, NO_DEF_, 0, 0, NULL}

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
    /* Not DeepSpeed's 5e8: at 2^18 elements the ring reduce-scatter already
     * reaches the all-reduce's bus bandwidth (docs/benchmarks.md), and a 5e8
     * bucket would hold the whole gradient of most models. */
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
    /* The bounds of zdp_hparams_check (zdp/engine.h); eps = 0 is refused later,
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

#define BLOCK_(prefix, specs, off, at_default) {prefix, specs, COUNT_(specs), off, at_default}
const key_block zdp_config_key_blocks_[BLOCK_COUNT_] = {
    [BLOCK_TOP] = BLOCK_("", top_keys_, 0, true),
    [BLOCK_ZERO] = BLOCK_("zero_optimization", zero_keys_, offsetof(zdp_config, zero), true),
    [BLOCK_OFFLOAD_OPTIMIZER] =
        BLOCK_("zero_optimization.offload_optimizer", offload_optimizer_keys_, NO_FIELD_, false),
    [BLOCK_OFFLOAD_PARAM] =
        BLOCK_("zero_optimization.offload_param", offload_param_keys_, NO_FIELD_, false),
    [BLOCK_OPTIMIZER] = BLOCK_("optimizer", optimizer_keys_, NO_FIELD_, false),
    /* Adam's and SGD's params share zdp_optimizer_config; SGD's lr has no default. */
    [BLOCK_ADAM_PARAMS] =
        BLOCK_("optimizer.params", adam_param_keys_, offsetof(zdp_config, optimizer), true),
    [BLOCK_SGD_PARAMS] =
        BLOCK_("optimizer.params", sgd_param_keys_, offsetof(zdp_config, optimizer), true),
    [BLOCK_SCHEDULER] = BLOCK_("scheduler", scheduler_keys_, NO_FIELD_, false),
    /* Applied when a scheduler block is parsed: the type decides which matter. */
    [BLOCK_SCHEDULER_PARAMS] = BLOCK_("scheduler.params", scheduler_param_keys_,
                                      offsetof(zdp_config, scheduler), false),
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

void zdp_config_apply_defaults_(key_block_id id, void *base) {
    apply_defaults_(zdp_config_key_blocks_[id].specs, zdp_config_key_blocks_[id].n, base);
}

void zdp_config_path_join_(char *dst, const char *prefix, const char *key) {
    if (prefix == NULL || prefix[0] == '\0')
        snprintf(dst, PATH_MAX_, "%s", key);
    else
        snprintf(dst, PATH_MAX_, "%s.%s", prefix, key);
}

/* ---- the defaults and the rows ---------------------------------------- */

void zdp_config_default(zdp_config *cfg) {
    if (cfg == NULL) return;
    memset(cfg, 0, sizeof *cfg);
    cfg->world_size = 1;
    /* The batch keys have no default in their rows: 0 is "absent" until derived. */
    for (size_t i = 0; i < BLOCK_COUNT_; i++)
        if (zdp_config_key_blocks_[i].at_default)
            apply_defaults_(zdp_config_key_blocks_[i].specs, zdp_config_key_blocks_[i].n,
                            (char *)cfg + zdp_config_key_blocks_[i].offset);
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
    for (size_t i = 0; i < BLOCK_COUNT_; i++) n += zdp_config_key_blocks_[i].n;
    return n;
}

bool zdp_config_key_get(size_t index, zdp_config_key_info *out) {
    static const char *const kind_names[] = {"int", "bool", "number", "any", "unused", "custom"};
    for (size_t i = 0; i < BLOCK_COUNT_; i++) {
        const key_block *b = &zdp_config_key_blocks_[i];
        if (index >= b->n) {
            index -= b->n;
            continue;
        }
        const key_spec *s = &b->specs[index];
        memset(out, 0, sizeof *out);
        zdp_config_path_join_(out->path, b->prefix, s->name);
        out->kind = kind_names[s->kind];
        out->def = s->def;
        out->config_offset = (b->offset == NO_FIELD_ || s->offset == NO_FIELD_)
                                 ? NO_FIELD_ : b->offset + s->offset;
        out->at_default = b->at_default;
        return true;
    }
    return false;
}
