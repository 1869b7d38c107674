/*
 * zdp.h -- the one public header of libzdp, a data-parallel training engine.
 *
 * zdp does what DeepSpeed's training engine does for ZeRO stages 0, 1 and 2,
 * reads DeepSpeed's ds_config.json, and follows DeepSpeed's training-loop
 * semantics (forward / backward / step, counters, batch-size rules), including
 * *unmanaged* gradient accumulation, where the caller owns the optimizer-step
 * boundary.  Ranks are MPI processes.  Anything not declared here is internal.
 *
 * Conventions
 *   - Every fallible function returns zdp_status (ZDP_OK == 0, errors < 0) and
 *     fills a caller-provided zdp_error with a message that names the thing
 *     (JSON path, file, field, rank), the value seen and the fix.  `err` may be
 *     NULL when the caller does not want the message.
 *   - The library never calls exit() or abort().
 *   - COLLECTIVE: every rank must make the call, in the same order.
 *
 * A minimal training loop (unmanaged accumulation, n chosen at run time):
 *
 *     zdp_config cfg;  zdp_engine *eng;  zdp_error err;  float loss;
 *     zdp_dist_init(&argc, &argv, &err);
 *     zdp_config_load_file("ds_config.json", zdp_dist_world_size(), &cfg, &err);
 *     zdp_engine_create(&cfg, &model, &eng, &err);
 *     for (step...) {
 *         for (int i = 0; i < n; i++) {
 *             zdp_engine_forward(eng, &batch[i], &loss, &err);
 *             zdp_engine_backward(eng, 0, 1.0f / n, &err);   // scale_wrt_gas off
 *         }
 *         zdp_engine_step(eng, &err);                        // always a boundary
 *     }
 *     zdp_engine_destroy(eng);
 *     zdp_dist_finalize();
 */
#ifndef ZDP_ZDP_H
#define ZDP_ZDP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(ZDP_BUILDING_LIBRARY) && defined(__GNUC__)
#define ZDP_API __attribute__((visibility("default")))
#else
#define ZDP_API
#endif

#define ZDP_VERSION "0.1.0"

/* ---- status codes and errors ------------------------------------------ */

/* X-macro table: name, value, short description. */
#define ZDP_STATUS_MAP(XX)                                                   \
    XX(OK, 0, "success")                                                     \
    XX(ERR_INVALID_ARG, -1, "invalid argument")                              \
    XX(ERR_CONFIG, -2, "invalid configuration")                              \
    XX(ERR_UNSUPPORTED, -3, "not supported")                                 \
    XX(ERR_STATE, -4, "call not valid in the engine's current state")        \
    XX(ERR_IO, -5, "file input/output error")                                \
    XX(ERR_FORMAT, -6, "malformed file")                                     \
    XX(ERR_NOMEM, -7, "out of memory")                                       \
    XX(ERR_COMM, -8, "communication failure")                                \
    XX(ERR_INTERNAL, -9, "internal error (a bug in zdp)")

typedef enum zdp_status {
#define ZDP_STATUS_ENUM_(name, val, desc) ZDP_##name = val,
    ZDP_STATUS_MAP(ZDP_STATUS_ENUM_)
#undef ZDP_STATUS_ENUM_
} zdp_status;

#define ZDP_ERROR_MSG_MAX 1024

typedef struct zdp_error {
    zdp_status code;             /* same value the function returned */
    int rank;                    /* rank that detected it, -1 if unknown */
    char msg[ZDP_ERROR_MSG_MAX]; /* "thing = value: why; fix" */
} zdp_error;

ZDP_API const char *zdp_status_name(zdp_status s); /* "ZDP_ERR_CONFIG" */
ZDP_API const char *zdp_status_str(zdp_status s);  /* "invalid configuration" */

/* Log sink for warnings and information (unknown config keys, the memory
 * report).  Default: stderr, prefixed "[zdp rank R]".  level: 0 info, 1 warn. */
typedef void (*zdp_log_fn)(int level, const char *msg, void *user);
ZDP_API void zdp_set_log(zdp_log_fn fn, void *user);

/* splitmix64 (Steele, Lea, Flood 2014): the small reproducible generator
 * behind zdp's seeded initialisers and generated data.  Adds
 * 0x9E3779B97F4A7C15 to *state, then mixes: the same numbers on every
 * machine, so another program can reproduce zdp's data. */
ZDP_API uint64_t zdp_splitmix64(uint64_t *state);

/* ---- distributed runtime ---------------------------------------------- */

/* COLLECTIVE.  Initialises MPI (if the caller has not) and pins BLAS threads
 * to cores / ranks-on-this-node.  Safe to call more than once. */
ZDP_API zdp_status zdp_dist_init(int *argc, char ***argv, zdp_error *err);
ZDP_API int zdp_dist_rank(void);       /* 0 before init */
ZDP_API int zdp_dist_world_size(void); /* 1 before init */
/* COLLECTIVE.  Finalises MPI if zdp_dist_init initialised it. */
ZDP_API void zdp_dist_finalize(void);
/* Ends the whole job with `code` after printing msg on this rank: the clean
 * way out of a rank-local failure when other ranks may wait in a collective.
 * Only for programs (the library itself never calls it). */
ZDP_API void zdp_dist_abort(int code, const char *msg);
/* COLLECTIVE.  Logical AND of `ok` over all ranks: lets a program agree
 * that every rank succeeded before it goes on. */
ZDP_API bool zdp_dist_all_ok(bool ok);
/* COLLECTIVE.  zdp_dist_all_ok that also carries why: a rank that is not ok
 * passes a one-line message (NULL: none; at most ZDP_ERROR_MSG_MAX - 1 bytes
 * travel).  Returns true when every rank is ok.  Otherwise, when report is
 * not NULL, every rank receives in *report (malloc'd, free() it; NULL if out
 * of memory) the same text, one line per distinct message, naming the ranks
 * that sent it: "rank 2: MSG", "ranks 0-1, 3: MSG", or MSG alone when every
 * rank failed with the same message.  So a failure on any one rank can be
 * printed by rank 0, and no rank is left waiting for one that gave up. */
ZDP_API bool zdp_dist_all_ok_why(bool ok, const char *why, char **report);
/* COLLECTIVE.  Mean of x over all ranks (for reporting losses). */
ZDP_API double zdp_dist_mean(double x);

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
    int stage;                     /* 0, 1 or 2 (3 is rejected for now) */
    bool overlap_comm;             /* false */
    int64_t reduce_bucket_size;    /* 262144 elements (DeepSpeed: 5e8) */
    int64_t allgather_bucket_size; /* 5e8 elements, must be even */
    bool contiguous_gradients;     /* true */
    bool reduce_scatter;           /* true */
    zdp_offload_device offload_optimizer; /* only NONE is accepted */
    zdp_offload_device offload_param;     /* only NONE is accepted */
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

/* ---- models ------------------------------------------------------------ */

/* The grad sink: a model's backward does not own gradient memory.  For each
 * parameter tensor it acquires the buffer, ADDS its contribution (the buffer
 * may hold earlier micro-batches' gradients, or zeros), and releases it when
 * this backward will add nothing more.  Acquiring the same tensor twice in one
 * backward returns the same buffer.  Every tensor must be released exactly
 * once per backward (the engine releases forgotten ones at the end, in
 * reverse order).  Returns NULL on misuse (index out of range, already
 * released); the backward must then fail. */
typedef struct zdp_grad_sink zdp_grad_sink;
ZDP_API float *zdp_grad_acquire(zdp_grad_sink *sink, int param_index);
ZDP_API void zdp_grad_release(zdp_grad_sink *sink, int param_index);

#define ZDP_MAX_DIMS 4

typedef struct zdp_param_info {
    const char *name;            /* "linears.0.weight" */
    int ndim;
    int64_t shape[ZDP_MAX_DIMS]; /* row-major */
} zdp_param_info;

/* What the engine needs from a model.  Parameters live in the engine's flat
 * buffer: params[i] points at tensor i (see zdp_param_info for its shape). */
typedef struct zdp_model_ops {
    /* Runs the forward pass on one micro-batch and keeps what backward needs.
     * *loss: the micro-batch's loss (for example mean cross-entropy). */
    zdp_status (*forward)(void *self, const float *const *params,
                          const void *batch, float *loss, zdp_error *err);
    /* Back-propagates d(objective)/d(loss) = dloss from the last forward,
     * adding every parameter's gradient through the sink. */
    zdp_status (*backward)(void *self, const float *const *params, float dloss,
                           zdp_grad_sink *sink, zdp_error *err);
} zdp_model_ops;

typedef struct zdp_model {
    void *self;                  /* the model's own state (activations) */
    const zdp_model_ops *ops;
    int n_params;                /* number of parameter tensors */
    const zdp_param_info *params; /* n_params entries, registration order */
    /* Optional (NULL: none): the model's shape as a flat JSON object of
     * integers and strings, e.g. {"model": "gpt", "n_layer": 4, "n_head": 4,
     * ...}.  Checkpoints record it, and loading one saved with another shape
     * is refused naming the key and both values -- including keys such as
     * n_head that no tensor shape shows. */
    const char *shape_json;
} zdp_model;

/* ---- engine ------------------------------------------------------------ */

typedef struct zdp_engine zdp_engine;

/* Bytes this rank allocated, by category (every engine allocation is
 * counted).  ZeRO model per rank with Adam, Psi parameters, N ranks:
 * stage 0: 4Psi params + 4Psi grads + 8Psi optimizer; stage 1: 4Psi + 4Psi
 * (+ 4Psi/N gradient partition) + 8Psi/N; stage 2: 4Psi + 4Psi/N + buckets
 * + 8Psi/N. */
typedef struct zdp_memory_report {
    int64_t params_bytes;         /* the flat parameter buffer (padded) */
    int64_t grads_bytes;          /* full-size gradient buffer (stages 0/1) */
    int64_t grad_partition_bytes; /* this rank's gradient partition */
    int64_t bucket_bytes;         /* stage-2 reduce buckets */
    int64_t optimizer_bytes;      /* optimizer state (Adam m and v, SGD momentum) */
    int64_t master_bytes;         /* fp32 master partition (16-bit training; 0 today) */
    int64_t other_bytes;          /* the engine's bookkeeping (layout, bucket tables) */
    int64_t total_bytes;
} zdp_memory_report;

/* COLLECTIVE.  Builds the engine for `model` on all ranks of the job:
 * validates the config (create-time rejections: stage 3, offload with a
 * device other than "none", overlap_comm with stage 0/1 in unmanaged mode,
 * a pipeline section, Apex amp, fp16/bf16), lays the parameters out in one
 * flat buffer padded to a multiple of 2*W and partitions it, allocates
 * gradients and optimizer state for the stage, and logs the memory report on
 * rank 0.  Parameters start at zero: write them through
 * zdp_engine_param_data() and call zdp_engine_sync_params().  `model` must
 * outlive the engine.  On failure *out is NULL. */
ZDP_API zdp_status zdp_engine_create(const zdp_config *cfg, const zdp_model *model,
                                     zdp_engine **out, zdp_error *err);
/* Frees everything; NULL is a no-op.  Not collective. */
ZDP_API void zdp_engine_destroy(zdp_engine *eng);

/* Writable view of parameter tensor i (NULL if out of range).  Writes are
 * allowed only between steps; call zdp_engine_sync_params afterwards. */
ZDP_API float *zdp_engine_param_data(zdp_engine *eng, int i);
/* COLLECTIVE.  Broadcasts rank 0's parameters to every rank (as DeepSpeed
 * does at initialisation) and refreshes the optimizer's view of them. */
ZDP_API zdp_status zdp_engine_sync_params(zdp_engine *eng, zdp_error *err);

/* Runs the model's forward on one micro-batch.  *loss gets its loss. */
ZDP_API zdp_status zdp_engine_forward(zdp_engine *eng, const void *batch,
                                      float *loss, zdp_error *err);
/* COLLECTIVE at ZeRO stage 2 (it reduce-scatters).  Back-propagates the
 * last forward with d(objective)/d(loss) = loss_scale * (scale_wrt_gas ?
 * 1/G : 1).  Gradients add into the window's accumulated gradients. */
ZDP_API zdp_status zdp_engine_backward(zdp_engine *eng, bool scale_wrt_gas,
                                       float loss_scale, zdp_error *err);
/* COLLECTIVE.  Managed: a boundary only on every G-th call (or per
 * set_gradient_accumulation_boundary); unmanaged: always a boundary.  At a
 * boundary it reduces (stage 0/1) or finalizes (stage 2) the window's
 * gradients, clips by the global norm, and applies the optimizer, or skips the
 * update on every rank if any gradient is NaN/Inf.  A boundary with no
 * backward() in its window is ZDP_ERR_STATE and changes nothing. */
ZDP_API zdp_status zdp_engine_step(zdp_engine *eng, zdp_error *err);

/* DeepSpeed's predicate: managed -> override if set, else
 * (micro_steps + 1) % G == 0; unmanaged -> true only while step() runs. */
ZDP_API bool zdp_engine_is_gradient_accumulation_boundary(const zdp_engine *eng);
/* Managed mode only (sticky for the engine's life, as in DeepSpeed).
 * Unmanaged mode: ZDP_ERR_STATE, the caller owns the boundary via step(). */
ZDP_API zdp_status zdp_engine_set_gradient_accumulation_boundary(zdp_engine *eng,
                                                                 bool is_boundary,
                                                                 zdp_error *err);
/* DeepSpeed's coalesce_grad_reduction(): not implemented; in unmanaged mode it
 * is rejected with DeepSpeed's reason, otherwise ZDP_ERR_UNSUPPORTED. */
ZDP_API zdp_status zdp_engine_coalesce_grad_reduction(zdp_engine *eng, zdp_error *err);

ZDP_API bool zdp_engine_was_step_applied(const zdp_engine *eng);
/* The learning rate the next applied update will use (the scheduler's
 * current value), and the one the last applied update used (-1 before). */
ZDP_API double zdp_engine_lr(const zdp_engine *eng);
ZDP_API double zdp_engine_last_lr(const zdp_engine *eng);
/* Optimizer hyperparameters a caller may change between steps (the Tinker
 * protocol sends them with every optim_step). */
typedef struct zdp_hparams {
    double lr;                /* the learning rate of the next update */
    double beta1, beta2, eps; /* Adam/AdamW (stored, unused by SGD) */
    double weight_decay;      /* AdamW: decoupled; SGD/L2 Adam: coupled */
    double gradient_clipping; /* max global norm; 0 = off */
} zdp_hparams;
/* The ranges every optimizer hyperparameter is held to, in a config (the
 * optimizer and scheduler blocks, docs/config.md), in zdp_engine_set_hparams
 * and in zdp_hparams_check: finite, lr and the scheduler's lrs in [0,
 * ZDP_HPARAM_LR_MAX], betas in [0, 1), eps in (0, ZDP_HPARAM_EPS_MAX],
 * weight_decay in [0, ZDP_HPARAM_WEIGHT_DECAY_MAX], gradient_clipping >= 0,
 * scheduler step counts in [1, ZDP_HPARAM_STEPS_MAX].  Wider than any
 * training recipe uses; what they refuse is a typo or a hostile value. */
#define ZDP_HPARAM_LR_MAX 100.0
#define ZDP_HPARAM_EPS_MAX 1.0
#define ZDP_HPARAM_WEIGHT_DECAY_MAX 10.0
#define ZDP_HPARAM_STEPS_MAX 1e12
/* Checks every field of *h against those ranges without an engine (a
 * server validates a request with it before anything is applied).
 * ZDP_ERR_INVALID_ARG naming the first bad field, its value and the range. */
ZDP_API zdp_status zdp_hparams_check(const zdp_hparams *h, zdp_error *err);
/* The values the next update would use (lr: the scheduler's or the set one). */
ZDP_API void zdp_engine_get_hparams(const zdp_engine *eng, zdp_hparams *out);
/* Sets every field for all later updates, until set again (like writing a
 * torch param_group); a set lr replaces the config's scheduler from then on.
 * Local, not collective: every rank must set the same values before the same
 * step().  Values outside zdp_hparams_check's ranges (NaN, Inf, lr above
 * ZDP_HPARAM_LR_MAX, ...) are ZDP_ERR_INVALID_ARG naming the field, and
 * nothing changes.  Not saved in checkpoints: a loaded engine uses its config again. */
ZDP_API zdp_status zdp_engine_set_hparams(zdp_engine *eng, const zdp_hparams *h,
                                          zdp_error *err);
/* Zeroes the optimizer state (Adam moments, SGD momentum, Adam's step count
 * for bias correction) as a freshly created engine has it; parameters,
 * counters and the open window's gradients are untouched. */
ZDP_API void zdp_engine_reset_optimizer_state(zdp_engine *eng);
ZDP_API int64_t zdp_engine_global_steps(const zdp_engine *eng);
ZDP_API int64_t zdp_engine_global_samples(const zdp_engine *eng);
ZDP_API int64_t zdp_engine_micro_steps(const zdp_engine *eng);
ZDP_API int64_t zdp_engine_skipped_steps(const zdp_engine *eng);
/* backward() calls since the last model step (the window so far). */
ZDP_API int64_t zdp_engine_pending_backwards(const zdp_engine *eng);
/* Global L2 norm of the last model step's gradient before clipping (the
 * norm one process would compute over the whole averaged gradient, the same
 * on every rank); NaN/Inf when that step was skipped; -1 before any step. */
ZDP_API double zdp_engine_last_grad_norm(const zdp_engine *eng);
ZDP_API const zdp_config *zdp_engine_config(const zdp_engine *eng);
ZDP_API void zdp_engine_memory_report(const zdp_engine *eng, zdp_memory_report *out);

/* Collectives, for the communication report. */
typedef enum zdp_collective {
    ZDP_COLL_ALLREDUCE,
    ZDP_COLL_REDUCE_SCATTER,
    ZDP_COLL_ALLGATHER,
    ZDP_COLL_BROADCAST,
    ZDP_COLL_COUNT
} zdp_collective;
ZDP_API const char *zdp_collective_name(zdp_collective c); /* "reduce_scatter" */

/* What this rank communicated, by collective.  payload: bytes of the buffer
 * handed to the collective (a reduce-scatter's whole input, an all-gather's
 * whole output).  sent/received: bytes that left and reached this rank, as
 * measured for zdp's own ring algorithms and as the ring model gives for
 * MPI's (all-reduce 2(W-1)/W of the payload each way; reduce-scatter and
 * all-gather the payload minus one rank's piece). */
typedef struct zdp_comm_report {
    int64_t calls[ZDP_COLL_COUNT];
    int64_t payload_bytes[ZDP_COLL_COUNT];
    int64_t sent_bytes[ZDP_COLL_COUNT];
    int64_t received_bytes[ZDP_COLL_COUNT];
} zdp_comm_report;

/* last_step: the window of the last model step (from the end of the
 * previous model step to the end of this one: its backwards' reductions,
 * the step's reductions, norm and all-gather); otherwise everything since
 * create.  Read it after step() returns: with overlap_comm, reductions of an
 * open window are still being counted on the comm stream thread. */
ZDP_API void zdp_engine_comm_report(const zdp_engine *eng, bool last_step, zdp_comm_report *out);

/* Where the last model step's window spent its time, in seconds, on this
 * rank: forward and backward calls (backward includes waiting for its
 * reductions), time blocked on the comm stream (in backward and step), the
 * optimizer update, and the boundary step() call as a whole. */
typedef struct zdp_step_timing {
    double forward_s;
    double backward_s;
    double comm_wait_s;
    double optimizer_s;
    double step_s;
} zdp_step_timing;
ZDP_API void zdp_engine_step_timing(const zdp_engine *eng, zdp_step_timing *out);

/* Flat layout, for tests and tools: total parameter count (unpadded),
 * padded length, partition size P, and tensor i's offset in the flat buffer. */
ZDP_API int64_t zdp_engine_numel(const zdp_engine *eng);
ZDP_API int64_t zdp_engine_padded_numel(const zdp_engine *eng);
ZDP_API int64_t zdp_engine_partition_numel(const zdp_engine *eng);
ZDP_API int64_t zdp_engine_param_offset(const zdp_engine *eng, int i);

/* ---- checkpoints ----------------------------------------------------------- */

/* COLLECTIVE.  Saves everything the engine needs to continue exactly, under
 * dir/tag/ (docs/checkpoints.md has the format):
 *   meta.json                  (rank 0) format version, zdp version, world
 *                              size, ZeRO stage, layout, counters
 *                              (global_steps, global_samples, micro_steps,
 *                              skipped_steps, pending backwards, optimizer
 *                              step, LR scheduler iteration), the config's
 *                              training keys, client_json, the model's
 *                              shape_json, the size and FNV-1a 64 checksum
 *                              of every file, and its own checksum
 *                              (meta_fnv1a64, docs/checkpoints.md)
 *   model.safetensors          (rank 0) the full fp32 weights by parameter
 *                              name (for the GPT: a GPT2LMHeadModel file)
 *   optim_rank{r}.safetensors  (every rank) its slice of the optimizer state
 *                              (Adam exp_avg/exp_avg_sq, SGD momentum) and,
 *                              between backward() and step(), the window's
 *                              accumulated gradients
 * Files are written into dir/tag.tmp/ and fsynced; only when every rank's
 * files are complete does rank 0 rename the directory into place and then
 * replace dir/latest (a one-line file naming the tag) atomically.  A crash at
 * any point leaves the previous checkpoint and `latest` intact.
 * client_json: a JSON object (the caller's own state, e.g. the data cursor)
 * stored as is; NULL for none.  tag: a file name (no '/'). */
ZDP_API zdp_status zdp_engine_save_checkpoint(zdp_engine *eng, const char *dir, const char *tag,
                                              const char *client_json, zdp_error *err);

/* COLLECTIVE.  Loads dir/tag (tag NULL: the one dir/latest names) into an
 * engine built for the same model: parameters, optimizer state, counters
 * and the LR schedule's position.  The world size and ZeRO stage may differ
 * from the saving job's (the optimizer state is re-cut from the flat fp32
 * state), except for a checkpoint taken mid-window, which holds rank-local
 * gradients and needs the same world size and stage.  meta.json is checked
 * against its own checksum (format 1, which has none, loads with a
 * warning), the recorded shape against the model's shape_json (a differing
 * key, e.g. n_head, is ZDP_ERR_CONFIG naming both values), every file
 * against its size and checksum, and every tensor against the model, before
 * anything in the engine changes: on error the engine is as it was, and the
 * message names the file and what is wrong.  *client_json (may be NULL)
 * receives the saved client JSON (free() it); "{}" when none was saved. */
ZDP_API zdp_status zdp_engine_load_checkpoint(zdp_engine *eng, const char *dir, const char *tag,
                                              char **client_json, zdp_error *err);

/* Not collective.  A description of dir/tag (tag NULL: latest) in words:
 * what it holds, its counters and layout, whether its files check out.
 * *text is malloc'd (free() it). */
ZDP_API zdp_status zdp_checkpoint_inspect(const char *dir, const char *tag, char **text,
                                          zdp_error *err);
/* Not collective.  Writes the checkpoint's full fp32 weights (whatever the
 * ZeRO stage and world size that saved it) to out_path as safetensors,
 * after checking the file's checksum (DeepSpeed's zero_to_fp32). */
ZDP_API zdp_status zdp_checkpoint_export(const char *dir, const char *tag, const char *out_path,
                                         zdp_error *err);

/* ---- the MLP (DeepSpeed's test SimpleModel) ---------------------------- */

/* nlayers Linear(hidden, hidden) with bias.  forward: for i in 0..L-1:
 * x = nlayers > 1 ? linears[i/2](x) + linears[i](x) : linears[0](x); then
 * mean cross-entropy of x (logits over `hidden` classes) against y. */
typedef struct zdp_mlp_batch {
    const float *x;   /* (n, hidden) row-major */
    const int64_t *y; /* (n,) class labels in [0, hidden) */
    int64_t n;
} zdp_mlp_batch;

/* Creates the model (with its zdp_model interface in *out).  `max_batch`
 * bounds the micro-batch rows; activations are allocated here. */
ZDP_API zdp_status zdp_mlp_create(int hidden, int nlayers, int64_t max_batch,
                                  zdp_model *out, zdp_error *err);
ZDP_API void zdp_mlp_destroy(zdp_model *model);
/* Seeded initialiser (uniform(-1/sqrt(h), 1/sqrt(h)), as torch.nn.Linear):
 * params[i] points at tensor i. */
ZDP_API void zdp_mlp_init_params(const zdp_model *model, float *const *params,
                                 uint64_t seed);

/* ---- GPT-2 ---------------------------------------------------------------- */

/* The GPT-2 family: token + learned position embeddings, n_layer pre-LayerNorm
 * blocks (causal self-attention with a fused qkv projection, MLP with 4C
 * hidden and tanh-approximated GELU), final LayerNorm, lm_head tied to the
 * token embedding, mean cross-entropy over every position.
 *
 * Parameters, in registration order, with Hugging Face GPT2LMHeadModel names
 * and layouts (Conv1D weights are [in, out]: y = x @ W + b), so that a
 * safetensors file of GPT2LMHeadModel copies in tensor by tensor:
 *   transformer.wte.weight [V, C]       transformer.wpe.weight [T, C]
 *   per layer i, prefix transformer.h.{i}.:
 *     ln_1.weight [C], ln_1.bias [C], attn.c_attn.weight [C, 3C], attn.c_attn.bias [3C],
 *     attn.c_proj.weight [C, C], attn.c_proj.bias [C], ln_2.weight [C], ln_2.bias [C],
 *     mlp.c_fc.weight [C, 4C], mlp.c_fc.bias [4C], mlp.c_proj.weight [4C, C],
 *     mlp.c_proj.bias [C]
 *   transformer.ln_f.weight [C], transformer.ln_f.bias [C]
 * (2 + 12 * n_layer + 2 tensors; no lm_head.weight: it is wte.) */
typedef struct zdp_gpt_config {
    int n_layer;    /* L, e.g. 12 */
    int n_head;     /* NH, divides n_embd */
    int n_embd;     /* C, e.g. 768 */
    int vocab_size; /* V, e.g. 50257; 256 for bytes */
    int block_size; /* maximum sequence length T, e.g. 1024 */
} zdp_gpt_config;

/* One micro-batch: B sequences of T tokens (T <= block_size).  The loss is
 * (1/(B*T)) sum_{b,t} w[b][t] * (-log p(targets[b][t])): the mean
 * cross-entropy when weights is NULL (all 1); with weights, a weight 0 masks
 * a position (Tinker's loss_fn_inputs.weights; scale the loss by B*T to get
 * their plain sum). */
typedef struct zdp_gpt_batch {
    const int32_t *inputs;  /* (B, T) token ids in [0, V) */
    const int32_t *targets; /* (B, T) next-token ids in [0, V) */
    const float *weights;   /* (B, T) finite per-position loss weights, or NULL */
    float *logprobs;        /* OUT (B, T) log p(targets) filled by forward, or NULL */
    int B, T;
} zdp_gpt_batch;

/* Creates the model (its zdp_model interface in *out), with activation
 * memory for micro-batches of up to max_batch sequences of block_size
 * tokens.  Errors name the bad field (n_head must divide n_embd, ...). */
ZDP_API zdp_status zdp_gpt_create(const zdp_gpt_config *cfg, int max_batch, zdp_model *out,
                                  zdp_error *err);
ZDP_API void zdp_gpt_destroy(zdp_model *model);
/* Replaces the per-position loss weights of the last forward before its
 * backward: w holds B*T finite values (the last forward's B and T).  Every
 * Tinker policy loss (importance sampling, PPO, CISPO, DRO) has a gradient
 * -sum_t c_t * d(log p_t) whose coefficients c_t depend on the forward's own
 * log-probabilities, so it is back-propagated as this weighted cross-entropy
 * with w = c.  ZDP_ERR_STATE before any forward, ZDP_ERR_INVALID_ARG for a
 * wrong n or a non-finite weight (nothing changes then). */
ZDP_API zdp_status zdp_gpt_set_loss_weights(zdp_model *model, const float *w, int64_t n,
                                            zdp_error *err);
ZDP_API const zdp_gpt_config *zdp_gpt_config_of(const zdp_model *model);
/* GPT-2's initialisation, seeded: weights N(0, 0.02), the two residual
 * projections (attn.c_proj, mlp.c_proj) N(0, 0.02/sqrt(2L)), biases 0,
 * LayerNorm weights 1. */
ZDP_API void zdp_gpt_init_params(const zdp_model *model, float *const *params, uint64_t seed);
/* Inference for sampling: logits (V floats) of the last position of
 * tokens[0..T) (1 <= T <= block_size).  Uses the model's activation memory,
 * so not concurrently with training calls. */
ZDP_API zdp_status zdp_gpt_next_logits(const zdp_model *model, const float *const *params,
                                       const int32_t *tokens, int T, float *logits,
                                       zdp_error *err);

/* ---- GPT-2 weight files ---------------------------------------------------- */

/* Loads GPT-2 weights from `path` into the model's parameter views: dst[i]
 * (shape params[i], the list zdp_gpt_create registers for *cfg, in any
 * order) gets the tensor of that name.  The format is detected from the
 * file's first bytes:
 *
 *   - Hugging Face safetensors (GPT2LMHeadModel's model.safetensors):
 *     names with the "transformer." prefix or without it (the original
 *     gpt2 files), F32, F16 or BF16 (converted to fp32).  Buffers that old
 *     files carry, h.{i}.attn.bias and h.{i}.attn.masked_bias, are ignored.
 *     lm_head.weight, if present, must have wte's shape and equal wte
 *     exactly (zdp ties them); it is then skipped.  A different lm_head is
 *     ZDP_ERR_UNSUPPORTED, because loading it would silently drop a trained,
 *     untied head.  n_head is checked only in files zdp wrote (a
 *     checkpoint's model.safetensors, zdp ckpt export,
 *     zdp_gpt_weights_save_model): their __metadata__ "zdp_model" records
 *     the shape, and a config with another n_head is ZDP_ERR_CONFIG naming
 *     both values; other files have no record of it (no config.json is
 *     read).
 *     Torch.nn.Linear checkpoints (nanoGPT) use the same names with [out, in]
 *     weights: transpose c_attn/c_proj/c_fc first.  c_attn's shape catches
 *     this.
 *   - llm.c model checkpoints (gpt2_124M.bin): a header of 256 int32
 *     {20240326, version, maxT, V, L, NH, C, Vp, 0...}, version 3 (fp32) or
 *     5 (bf16), then llm.c's 16 tensors in its order, (out, in) weights.
 *     They are transposed into zdp's [in, out] layout, and the Vp - V padded
 *     vocabulary rows of wte are dropped.  maxT, V, L, NH and C must equal
 *     the config.
 *
 * block_size must equal the file's T (wpe rows).  Longer files are not
 * cropped.  Every check (format, config against file, every tensor's
 * presence, shape and dtype, tensors the model does not have) runs before
 * the first write into dst, so a mismatch leaves dst untouched.  Only an
 * I/O error during the copy can leave dst partly written.  Each message
 * names the file, the tensor and both shapes, and gives the fix.  Logs one
 * info line (format, dtype, what was ignored).
 * Status: ZDP_ERR_IO (cannot open or read), ZDP_ERR_FORMAT (not a format
 * listed above, truncated, corrupt, a tensor missing, a tensor the model
 * does not have), ZDP_ERR_CONFIG (the file belongs to another
 * configuration: V, T, C, L, NH or a shape differ), ZDP_ERR_FORMAT also for
 * a NaN or Inf weight (names the tensor, index and value; dst then holds
 * what was read), ZDP_ERR_UNSUPPORTED (a
 * dtype other than F32/F16/BF16, an llm.c version other than 3/5, an untied
 * lm_head), ZDP_ERR_INVALID_ARG (NULL, or params do not match *cfg), or
 * ZDP_ERR_NOMEM.  Not collective: typically rank 0 loads into
 * zdp_engine_param_data() views, then calls zdp_engine_sync_params(). */
ZDP_API zdp_status zdp_gpt_weights_load(const char *path, const zdp_gpt_config *cfg,
                                        const zdp_param_info *params, int n_params,
                                        float *const *dst, zdp_error *err);

/* Writes the n_params tensors src[i] (shape and name params[i]) to `path`
 * as an F32 safetensors file, in the given order and atomically
 * (zdp_safetensors_write: a temporary file, then rename).  Given the GPT
 * model's params this is a GPT2LMHeadModel state dict without
 * lm_head.weight, the way save_pretrained stores tied weights.  With a
 * config.json next to it, transformers' from_pretrained loads it and
 * zdp_gpt_weights_load reads it back.  The header carries
 * {"__metadata__": {"format": "pt"}}, as save_pretrained writes it.  Status: ZDP_ERR_INVALID_ARG (NULL,
 * n_params < 1, a bad shape), ZDP_ERR_IO, ZDP_ERR_NOMEM. */
ZDP_API zdp_status zdp_gpt_weights_save(const char *path, const zdp_param_info *params,
                                        int n_params, const float *const *src,
                                        zdp_error *err);
/* The same for a model from zdp_gpt_create, with its shape (shape_json,
 * n_head included) in __metadata__ as "zdp_model", as a checkpoint's
 * model.safetensors and zdp ckpt export have it: zdp_gpt_weights_load then
 * refuses the file for a config with another n_head, naming both values. */
ZDP_API zdp_status zdp_gpt_weights_save_model(const char *path, const zdp_model *model,
                                              const float *const *src, zdp_error *err);

/* ---- token data ------------------------------------------------------------ */

/* Token files.  Tokens are int32 in memory, 4 bytes each.
 *   ZDP_TOKENS_SHARD: an llm.c token shard (fineweb_train_000001.bin): a
 *     header of 256 little-endian int32 {20240520, 1, n_tokens, 0...},
 *     then n_tokens little-endian uint16 tokens.  The file length must be
 *     exactly 1024 + 2 * n_tokens bytes.
 *   ZDP_TOKENS_BYTES: any file, one token per byte (0..255, vocab 256),
 *     so a text file trains a byte-level model. */
typedef enum zdp_token_format {
    ZDP_TOKENS_SHARD,
    ZDP_TOKENS_BYTES,
    ZDP_TOKENS_AUTO, /* decided by zdp_tokens_detect */
} zdp_token_format;

/* What ZDP_TOKENS_AUTO reads `path` as (docs/training.md, "Data formats"):
 *   - a shard when its first int32 is the llm.c magic 20240520;
 *   - ZDP_ERR_FORMAT when it is not, but the file looks like a damaged
 *     shard: its name ends in ".bin", or it has a whole 1024-byte header
 *     and either 3 of the magic's 4 bytes are in place or the header's
 *     version (1) and token count (1024 + 2n bytes = the file size) are
 *     those of a shard.  The message names the file, the int32 found and
 *     the fix (repair the file, or read it as bytes explicitly);
 *   - bytes otherwise (text and other files).
 * Status: ZDP_ERR_IO (cannot open or read), ZDP_ERR_FORMAT,
 * ZDP_ERR_INVALID_ARG (NULL). */
ZDP_API zdp_status zdp_tokens_detect(const char *path, zdp_token_format *format /* OUT */,
                                     zdp_error *err);

/* Reads a whole token file into a new array: *tokens (free it with
 * zdp_tokens_free) and *n_tokens.  A shard's header is checked (magic,
 * version, token count against the file length), and errors give the file
 * and both numbers.  Status: ZDP_ERR_IO, ZDP_ERR_FORMAT (bad or truncated
 * shard, an empty file), ZDP_ERR_INVALID_ARG, ZDP_ERR_NOMEM.  On error
 * *tokens is NULL and *n_tokens is 0. */
ZDP_API zdp_status zdp_tokens_read(const char *path, zdp_token_format format,
                                   int32_t **tokens /* OUT */, int64_t *n_tokens /* OUT */,
                                   zdp_error *err);
/* Writes tokens[0..n) as an llm.c token shard (version 1), atomically (a
 * temporary file, then rename).  Tokens must be in [0, 65535], and n in
 * [0, INT32_MAX] (the header field is an int32).  Status: ZDP_ERR_INVALID_ARG
 * (names the first bad token and its index), ZDP_ERR_IO, ZDP_ERR_NOMEM. */
ZDP_API zdp_status zdp_tokens_write_shard(const char *path, const int32_t *tokens,
                                          int64_t n, zdp_error *err);
/* Frees an array from zdp_tokens_read / zdp_corpus_arith; NULL is a no-op. */
ZDP_API void zdp_tokens_free(int32_t *tokens);

/* The default corpus, generated by zdp without downloading anything: n_lines
 * lines of addition as byte tokens (vocab 256), every line the same width
 * L = 3d + 4 tokens, where d is the number of digits of max_operand:
 * a and b as d digits each, zero-padded, and their sum as d + 1 digits,
 * zero-padded and written least significant digit first:
 * "07+45=250\n" is 7 + 45 = 52 for max_operand 99.  (Written this way the
 * model produces the sum in the order the carries travel, which is what
 * makes addition quick to learn.)  a and b are uniform in [0, max_operand].
 * A model that learns the task shows it as the accuracy of the digits it
 * decodes greedily after '=', up to '\n'.
 * Held-out problems: with n_val = floor(n_lines * val_fraction) > 0, a
 * problem (a, b) is held out when h(a, b) * 2^-53 < val_fraction, where
 * h(a, b) = next() >> 11 of a splitmix64 whose state is
 * seed * 0x9E3779B97F4A7C15 + a * (max_operand + 1) + b (mod 2^64).  The
 * first n_lines - n_val lines hold no held-out problem and the last n_val
 * lines only held-out problems (each line redraws a and b until its problem
 * is of the right kind), so zdp_dataset_create_arith, which splits at that
 * line, evaluates on problems the model never trained on.  val_fraction 0:
 * nothing is held out and no line redraws.
 * Exact generator, so another program (Python) can reproduce it: splitmix64
 * with state = seed.  Each call adds 0x9E3779B97F4A7C15 to the state (mod
 * 2^64), then z = state; z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9;
 * z = (z ^ (z >> 27)) * 0x94D049BB133111EB; returns z ^ (z >> 31).  For
 * each line (and each redraw), a = next() % (max_operand + 1), then b
 * likewise.  Same seed, same bytes, on every machine.  Save the corpus with
 * zdp_tokens_write_shard to share it with a PyTorch script.
 * Status: ZDP_ERR_INVALID_ARG (n_lines < 1, max_operand outside
 * [0, 1000000000], val_fraction outside [0, 1), or no problem of the kind a
 * line needs in 2^20 draws, as when max_operand is 0), ZDP_ERR_NOMEM.  Free
 * *tokens with zdp_tokens_free. */
ZDP_API zdp_status zdp_corpus_arith(uint64_t seed, int64_t n_lines, int64_t max_operand,
                                    double val_fraction, int32_t **tokens /* OUT */,
                                    int64_t *n_tokens /* OUT */, zdp_error *err);

/* A dataset: a token array split into a train part and a val part, read as
 * windows of T+1 tokens.
 *
 * Split: n_val = floor(n_tokens * val_fraction) tokens.  The val split is
 * the last n_val tokens and the train split is the first n_tokens - n_val.
 * The split is by tokens, so it does not depend on T and the splits never
 * share a token.
 * Windows of a split with m tokens, for a sequence length T: window w is
 * the split's tokens [w*T, w*T + T] (T+1 tokens).  The inputs are the first
 * T and the targets the last T.  The window count is N = floor((m - 1) / T),
 * the same rule for train and val.  A split needs m >= T + 1.
 * Micro-batches: rank r of W's j-th micro-batch (j counts from 0 across
 * all steps, one per forward) holds windows ((j*W + r)*b + k) mod N for
 * k = 0..b-1, in that order.  Micro-batch j of the W ranks together covers
 * W*b consecutive windows, so the ranks' windows are disjoint whenever
 * W*b <= N.  The order is sequential; there is no shuffling.
 * The cursor is the next train micro-batch index j for zdp_dataset_next.
 * Every rank advances it identically, so one int64 is what a checkpoint
 * saves.  Windows consumed so far = cursor * W * b (use that to resume at
 * another W or b). */
typedef struct zdp_dataset zdp_dataset;

typedef enum zdp_split {
    ZDP_SPLIT_TRAIN,
    ZDP_SPLIT_VAL,
} zdp_split;

/* Builds a dataset over a copy of tokens[0..n_tokens).  Tokens must be >= 0.
 * val_fraction is in [0, 1): 0 leaves the val split empty.  Status:
 * ZDP_ERR_INVALID_ARG (names the first negative token, or the bad
 * fraction), ZDP_ERR_NOMEM.  On failure *out is NULL. */
ZDP_API zdp_status zdp_dataset_create(const int32_t *tokens, int64_t n_tokens,
                                      double val_fraction, zdp_dataset **out,
                                      zdp_error *err);
/* The same for a token file (zdp_tokens_read's formats and errors). */
ZDP_API zdp_status zdp_dataset_open(const char *path, zdp_token_format format,
                                    double val_fraction, zdp_dataset **out,
                                    zdp_error *err);
/* The same for the arithmetic corpus (zdp_corpus_arith's arguments): the
 * val split is exactly the last floor(n_lines * val_fraction) lines, the
 * held-out problems, so train and val never share a problem. */
ZDP_API zdp_status zdp_dataset_create_arith(uint64_t seed, int64_t n_lines,
                                            int64_t max_operand, double val_fraction,
                                            zdp_dataset **out, zdp_error *err);
/* Frees the dataset; NULL is a no-op. */
ZDP_API void zdp_dataset_destroy(zdp_dataset *ds);

/* The split's tokens (owned by the dataset, valid until destroy) and their
 * count.  0 / NULL for an empty split or a NULL dataset. */
ZDP_API int64_t zdp_dataset_n_tokens(const zdp_dataset *ds, zdp_split split);
ZDP_API const int32_t *zdp_dataset_tokens(const zdp_dataset *ds, zdp_split split);
/* The largest token id in the whole dataset (-1 if empty): check it is
 * below the model's vocab_size before training. */
ZDP_API int32_t zdp_dataset_max_token(const zdp_dataset *ds);
/* The window count N of a split for sequence length T (0 if T < 1 or the
 * split has fewer than T+1 tokens). */
ZDP_API int64_t zdp_dataset_n_windows(const zdp_dataset *ds, zdp_split split, int T);

/* Fills micro-batch j of rank `rank` out of `world`: inputs and targets
 * (b, T), row k = window ((j*W + r)*b + k) mod N of the split (see above).
 * Reads only the dataset, so it is safe to call from several threads.
 * Status: ZDP_ERR_INVALID_ARG (NULL, j < 0, rank outside [0, world), b or
 * T < 1, (j*W + W)*b overflows int64), ZDP_ERR_CONFIG (the split has fewer
 * than T+1 tokens: the message gives its size, T and the fix). */
ZDP_API zdp_status zdp_dataset_batch(const zdp_dataset *ds, zdp_split split, int64_t j,
                                     int rank, int world, int b, int T,
                                     int32_t *inputs /* OUT (b, T) */,
                                     int32_t *targets /* OUT (b, T) */, zdp_error *err);
/* Fills windows first, first+1, ..., first+b-1 (mod N) of the split: the
 * same rows as zdp_dataset_batch with first = (j*W + r)*b, for trainers that
 * count consumed windows (a sample cursor that survives a change of world
 * size: rank r's j-th micro-batch of a step starts at cursor + (j*W + r)*b). */
ZDP_API zdp_status zdp_dataset_windows(const zdp_dataset *ds, zdp_split split, int64_t first,
                                       int b, int T, int32_t *inputs /* OUT (b, T) */,
                                       int32_t *targets /* OUT (b, T) */, zdp_error *err);
/* zdp_dataset_batch(ds, ZDP_SPLIT_TRAIN, cursor, ...), then cursor++ on
 * success.  The cursor does not move on error. */
ZDP_API zdp_status zdp_dataset_next(zdp_dataset *ds, int rank, int world, int b, int T,
                                    int32_t *inputs /* OUT (b, T) */,
                                    int32_t *targets /* OUT (b, T) */, zdp_error *err);
/* The train cursor: the next micro-batch index j (0 after create). */
ZDP_API int64_t zdp_dataset_cursor(const zdp_dataset *ds);
/* Sets the cursor (from a checkpoint).  Status: ZDP_ERR_INVALID_ARG for
 * j < 0 or a NULL dataset. */
ZDP_API zdp_status zdp_dataset_set_cursor(zdp_dataset *ds, int64_t j, zdp_error *err);

/* ---- safetensors -------------------------------------------------------- */

typedef enum zdp_dtype {
    ZDP_DTYPE_F32,
    ZDP_DTYPE_F64,
    ZDP_DTYPE_I64,
    ZDP_DTYPE_I32,
    ZDP_DTYPE_U16,
    ZDP_DTYPE_BF16,
    ZDP_DTYPE_F16,
    ZDP_DTYPE_U8,
} zdp_dtype;

typedef struct zdp_tensor {
    char *name;
    zdp_dtype dtype;
    int ndim;
    int64_t shape[ZDP_MAX_DIMS];
    void *data;      /* little-endian element data */
    size_t nbytes;
} zdp_tensor;

typedef struct zdp_safetensors {
    int n;
    zdp_tensor *tensors;
} zdp_safetensors;

/* Reads a whole .safetensors file, validating the header length, the JSON,
 * every dtype, shape and offset range (no overlaps, no gaps past the end).
 * Errors name the file, the tensor and the field. */
ZDP_API zdp_status zdp_safetensors_read(const char *path, zdp_safetensors *out,
                                        zdp_error *err);
/* Looks a tensor up by name; NULL if absent. */
ZDP_API const zdp_tensor *zdp_safetensors_find(const zdp_safetensors *st, const char *name);
ZDP_API void zdp_safetensors_free(zdp_safetensors *st);
/* Writes n tensors (names, dtypes, shapes, data) to path, atomically
 * (temporary file + rename). */
ZDP_API zdp_status zdp_safetensors_write(const char *path, const zdp_tensor *tensors,
                                         int n, zdp_error *err);
/* The same, with a "__metadata__" object of n_meta string pairs
 * meta[2k] -> meta[2k+1] (Hugging Face files carry {"format": "pt"}). */
ZDP_API zdp_status zdp_safetensors_write_meta(const char *path, const zdp_tensor *tensors, int n,
                                              const char *const *meta, int n_meta,
                                              zdp_error *err);
ZDP_API const char *zdp_dtype_name(zdp_dtype t); /* "F32" */
ZDP_API size_t zdp_dtype_size(zdp_dtype t);

#ifdef __cplusplus
}
#endif
#endif /* ZDP_ZDP_H */
