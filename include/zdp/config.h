/*
 * zdp/config.h -- ds_config.json: the config struct, loading, validation.
 * Part of the public API; include zdp/zdp.h for all of it.
 */
#ifndef ZDP_PUBLIC_CONFIG_H
#define ZDP_PUBLIC_CONFIG_H

#include "zdp/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- configuration (ds_config.json) ----------------------------------- */

typedef enum zdp_optimizer_type {
    ZDP_OPTIMIZER_ADAM,  /* decoupled weight decay unless adam_w_mode=false */
    ZDP_OPTIMIZER_ADAMW, /* always decoupled */
    ZDP_OPTIMIZER_SGD,   /* torch.optim.SGD semantics (coupled decay) */
} zdp_optimizer_type;

typedef enum zdp_offload_device {
    ZDP_OFFLOAD_NONE, /* absent block or "device": "none" */
    ZDP_OFFLOAD_CPU,
    ZDP_OFFLOAD_NVME,
} zdp_offload_device;

typedef struct zdp_optimizer_config {
    zdp_optimizer_type type;
    double lr;            /* 1e-3 (Adam/AdamW); SGD: required */
    double beta1, beta2;  /* params.betas, (0.9, 0.999) */
    double eps;           /* 1e-8 */
    double weight_decay;  /* 0 */
    bool adam_w_mode;     /* true: "Adam" means AdamW, as in DeepSpeed */
    bool bias_correction; /* true */
    double momentum;      /* SGD: 0 */
    double dampening;     /* SGD: 0 */
    bool nesterov;        /* SGD: false */
} zdp_optimizer_config;

typedef enum zdp_scheduler_type {
    ZDP_SCHEDULER_NONE,            /* constant optimizer.params.lr */
    ZDP_SCHEDULER_WARMUP_LR,       /* "WarmupLR" */
    ZDP_SCHEDULER_WARMUP_DECAY_LR, /* "WarmupDecayLR" */
    ZDP_SCHEDULER_WARMUP_COSINE_LR /* "WarmupCosineLR" */
} zdp_scheduler_type;

/* DeepSpeed's scheduler block, docs/deepspeed.md §7 (docs/config.md). */
typedef struct zdp_scheduler_config {
    zdp_scheduler_type type;
    double warmup_min_lr;     /* WarmupLR/WarmupDecayLR: 0 */
    double warmup_max_lr;     /* WarmupLR: the optimizer's lr; WarmupDecayLR: 0.001 */
    int64_t warmup_num_steps; /* 1000 */
    bool warmup_linear;       /* warmup_type "linear"; default "log" */
    int64_t total_num_steps;  /* WarmupDecayLR/WarmupCosineLR: required */
    double warmup_min_ratio;  /* WarmupCosineLR: 0 */
    double cos_min_ratio;     /* WarmupCosineLR: 0.0001 */
} zdp_scheduler_config;

/* The learning rate at the scheduler's internal iteration n (n = -1 before
 * the first applied update; DeepSpeed steps the scheduler after each applied
 * update, so the k-th applied update uses n = k - 2).  base_lr is the
 * optimizer's lr.  ZDP_SCHEDULER_NONE returns base_lr. */
ZDP_API double zdp_scheduler_lr(const zdp_scheduler_config *s, double base_lr, int64_t n);

typedef struct zdp_zero_config {
    int stage;                     /* 0, 1, 2 or 3 */
    bool overlap_comm;             /* false */
    int64_t reduce_bucket_size;    /* 262144 elements (DeepSpeed: 5e8) */
    int64_t allgather_bucket_size; /* 5e8 elements, must be even */
    bool contiguous_gradients;     /* true */
    bool reduce_scatter;           /* true */
    zdp_offload_device offload_optimizer; /* only NONE is accepted */
    zdp_offload_device offload_param;     /* only NONE is accepted */
    /* Stage 3 (DeepSpeed's defaults; elements, not bytes). */
    int64_t stage3_prefetch_bucket_size;        /* 5e7 */
    int64_t stage3_param_persistence_threshold; /* 1e5: smaller tensors stay whole */
    int64_t stage3_max_live_parameters;         /* 1e9 */
    int64_t stage3_max_reuse_distance;          /* 1e9 */
} zdp_zero_config;

typedef struct zdp_config {
    int world_size;                    /* W the batch keys were derived for */
    int64_t train_batch_size;          /* B = b * G * W */
    int64_t micro_batch_size;          /* b = train_micro_batch_size_per_gpu */
    int64_t gradient_accumulation_steps; /* G */
    bool managed_gradient_accumulation;  /* true */
    int64_t steps_per_print;           /* 10 */
    double gradient_clipping;          /* 1.0 (DeepSpeed's default); 0 = off */
    bool zero_allow_untested_optimizer; /* false */
    zdp_optimizer_config optimizer;
    zdp_scheduler_config scheduler; /* type NONE when the block is absent */
    zdp_zero_config zero;
    /* Sections zdp records only to reject them. */
    bool has_pipeline;  /* a "pipeline" block is present */
    bool amp_enabled;   /* amp.enabled (Apex) */
    bool fp16_enabled;  /* fp16.enabled: not implemented yet, rejected */
    bool bf16_enabled;  /* bf16.enabled: not implemented yet, rejected */
} zdp_config;

/* Fills every field with DeepSpeed's default (world_size 1).  The batch
 * keys are 0 ("absent"): set the ones you have, then zdp_config_finalize. */
ZDP_API void zdp_config_default(zdp_config *cfg);
/* For a config built by hand: derives the absent batch keys for
 * `world_size` ranks as DeepSpeed does and validates everything.  On error
 * *cfg is unchanged. */
ZDP_API zdp_status zdp_config_finalize(zdp_config *cfg, int world_size, zdp_error *err);

/* Parses a ds_config JSON file (strict JSON) for a job of `world_size`
 * ranks: applies defaults, derives the batch keys as DeepSpeed does and
 * validates everything.  Unknown keys produce one warning that lists them.
 * Errors name the JSON path, the value seen and the fix; malformed JSON
 * reports line and column.  Deterministic: every rank gets the same answer.
 * Status: ZDP_ERR_IO (file), ZDP_ERR_FORMAT (not JSON), ZDP_ERR_CONFIG
 * (a wrong value or a combination DeepSpeed rejects), ZDP_ERR_UNSUPPORTED
 * (a feature zdp does not have yet), ZDP_ERR_INVALID_ARG (NULL, world_size
 * < 1).  On error *out holds the defaults, never half a config. */
ZDP_API zdp_status zdp_config_load_file(const char *path, int world_size,
                                        zdp_config *out, zdp_error *err);
/* Same, from a string; `origin` names it in messages (a file name or "<string>"). */
ZDP_API zdp_status zdp_config_load_string(const char *json, const char *origin,
                                          int world_size, zdp_config *out,
                                          zdp_error *err);
/* Validates a config struct built or edited by hand: the batch consistency
 * rule and every rejection zdp_config_load_* applies. */
ZDP_API zdp_status zdp_config_validate(const zdp_config *cfg, zdp_error *err);

#ifdef __cplusplus
}
#endif
#endif /* ZDP_PUBLIC_CONFIG_H */
