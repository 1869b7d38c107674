/*
 * zdp/engine.h -- the training engine: create, forward/backward/step,
 * hyperparameters, reports, checkpoints.
 * Part of the public API; include zdp/zdp.h for all of it.
 */
#ifndef ZDP_PUBLIC_ENGINE_H
#define ZDP_PUBLIC_ENGINE_H

#include "zdp/config.h"
#include "zdp/core.h"
#include "zdp/model.h"

#ifdef __cplusplus
extern "C" {
#endif

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
    int64_t gathered_bytes;       /* stage 3: parameters gathered now (persistent ones
                                     included) */
    int64_t gathered_peak_bytes;  /* stage 3: the most fetched copies held at once since
                                     create (persistent ones not included) */
    int64_t frozen_bytes;         /* stage 3: this rank's partition of the model's frozen
                                     weights (a LoRA base; zdp_frozen), 0 otherwise */
    int64_t total_bytes;          /* the engine's bytes: the fields above */
    int64_t activation_bytes;     /* the model's activations (zdp_model.activation_bytes),
                                     held by the model, not in total_bytes */
} zdp_memory_report;

/* COLLECTIVE.  Builds the engine for `model` on all ranks of the job:
 * validates the config (create-time rejections: offload with a device
 * other than "none", overlap_comm with stage 0/1 in unmanaged mode, a
 * pipeline section, Apex amp, fp16/bf16), lays the parameters out in one
 * flat buffer padded to a multiple of 2*W and partitions it, allocates
 * gradients and optimizer state for the stage, and logs the memory report on
 * rank 0.  At stage 3 a model's frozen weights (zdp_model.frozen, a LoRA
 * base) are partitioned too and the model is pointed at the engine's source
 * over them.  Parameters start at zero: write them through
 * zdp_engine_param_data() (stage 3: zdp_engine_set_param) and call
 * zdp_engine_sync_params().  `model` must outlive the engine.  On failure
 * *out is NULL. */
ZDP_API zdp_status zdp_engine_create(const zdp_config *cfg, const zdp_model *model,
                                     zdp_engine **out, zdp_error *err);
/* Frees everything; NULL is a no-op.  Not collective. */
ZDP_API void zdp_engine_destroy(zdp_engine *eng);

/* ---- a frozen base shared by several engines (stage 3) ----------------- */

/* One partition of frozen weights (a LoRA base) that several engines read:
 * at ZeRO stage 3, K LoRA models over one base hold base / W bytes of it per
 * rank in all, not K x base / W (zdp serve's LoRA models, docs/server.md).
 * Engines created with zdp_engine_create_shared borrow it: within each of
 * their forwards and backwards it gathers layer by layer on that engine's
 * comm stream, as an engine's own frozen weights do.  Its borrowers must run
 * one at a time (one pass of one engine at a time on a rank, every rank in
 * the same order); a pass that finds the store in another's pass fails. */
typedef struct zdp_frozen_store zdp_frozen_store;
/* Partitions fz's tensors 1/W per rank, reading only this rank's slice of
 * each through fz->read (here only; fz->src is not used); fz->params (the
 * tensors' names and shapes) must outlive the store.  Stage 3 only.  Not collective.  On failure *out is
 * NULL. */
ZDP_API zdp_status zdp_frozen_store_create(const zdp_config *cfg, const zdp_frozen *fz,
                                           zdp_frozen_store **out, zdp_error *err);
/* Frees it: after every engine that borrows it (refused with a log line
 * otherwise).  NULL is a no-op.  Not collective. */
ZDP_API void zdp_frozen_store_destroy(zdp_frozen_store *store);
/* COLLECTIVE (every rank, the same i): frozen tensor i whole into out,
 * gathered from the partitions.  Between the borrowers' passes only. */
ZDP_API zdp_status zdp_frozen_store_get(zdp_frozen_store *store, int i, float *out,
                                        zdp_error *err);
/* This rank's bytes of the store: frozen_bytes its partition, other_bytes
 * its bookkeeping, gathered_bytes copies gathered now, total_bytes all. */
ZDP_API void zdp_frozen_store_memory_report(const zdp_frozen_store *store,
                                            zdp_memory_report *out);
/* COLLECTIVE.  zdp_engine_create for a model whose frozen weights
 * (zdp_model.frozen, same tensors as the store's, checked by name and size)
 * are read from `store` instead of partitioned anew: model->frozen->read is
 * not called, and the engine's memory report counts none of the store's bytes
 * (frozen_bytes 0).  Stage 3 only.  Destroying the engine leaves the store
 * as it was. */
ZDP_API zdp_status zdp_engine_create_shared(const zdp_config *cfg, const zdp_model *model,
                                            zdp_frozen_store *store, zdp_engine **out,
                                            zdp_error *err);

/* Writable view of parameter tensor i (NULL if out of range, and at ZeRO
 * stage 3, where no rank holds whole tensors: use zdp_engine_set_param /
 * zdp_engine_get_param).  Writes are allowed only between steps; call
 * zdp_engine_sync_params afterwards. */
ZDP_API float *zdp_engine_param_data(zdp_engine *eng, int i);
/* Copies tensor i's values (numel floats) into what this rank holds of it
 * (all of it at stages 0-2, its partition's slice at stage 3).  Every rank
 * passes the same values (at stage 3 sync_params cannot broadcast a tensor
 * rank 0 does not hold).  Between steps only. */
ZDP_API zdp_status zdp_engine_set_param(zdp_engine *eng, int i, const float *data,
                                        zdp_error *err);
/* Reads what this rank holds of every parameter tensor through read(ctx,
 * i, lo, hi, dst, err) (zdp_tensor_read_fn; zdp_hf_reader_read reads a
 * model folder): at stage 3 only the slice of each tensor inside this
 * rank's partition, straight into it, so no rank ever holds a whole
 * tensor it does not own; at stages 0-2 every tensor whole.  Not
 * collective; between steps only; call zdp_engine_sync_params afterwards.
 * The first read error is returned (the tensors before it are written). */
ZDP_API zdp_status zdp_engine_load_params(zdp_engine *eng, zdp_tensor_read_fn read, void *ctx,
                                          zdp_error *err);
/* COLLECTIVE at stage 3 (every rank calls it for the same i): copies tensor
 * i's values into out (numel floats), gathering it from the partitions. */
ZDP_API zdp_status zdp_engine_get_param(zdp_engine *eng, int i, float *out, zdp_error *err);
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
/* Checks every field of *h against the ranges above, without an engine (a
 * caller validates values it was sent before anything is applied), with two
 * tighter caps of the caller's own on top: lr at most lr_max and
 * gradient_clipping at most clip_max (HUGE_VAL: finite is enough); a cap
 * looser than the range's bound changes nothing.  Pure: no state, no
 * allocation.  ZDP_ERR_INVALID_ARG naming the first bad field, its value
 * and the range.  The one place the bounds are applied; zdp_hparams_check
 * is it without caps. */
ZDP_API zdp_status zdp_hparams_check_capped(const zdp_hparams *h, double lr_max, double clip_max,
                                            zdp_error *err);
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
/* Drops the open window: waits for this rank's reductions in flight, zeroes
 * the gradients accumulated since the last optimizer step and sets the
 * window's backward() count to 0; parameters, optimizer state and the step
 * counters are untouched.  Call it on every rank alike, between passes (a
 * caller whose request failed part-way, as zdp serve does, so that no
 * partial set of micro-batches reaches the next step). */
ZDP_API zdp_status zdp_engine_drop_window(zdp_engine *eng, zdp_error *err);
/* Global L2 norm of the last model step's gradient before clipping (the
 * norm one process would compute over the whole averaged gradient, the same
 * on every rank); NaN/Inf when that step was skipped; -1 before any step. */
ZDP_API double zdp_engine_last_grad_norm(const zdp_engine *eng);
ZDP_API const zdp_config *zdp_engine_config(const zdp_engine *eng);
ZDP_API void zdp_engine_memory_report(const zdp_engine *eng, zdp_memory_report *out);
/* COLLECTIVE.  Every rank's memory report: out[r] for each rank r (world
 * size entries), the same on every rank. */
ZDP_API zdp_status zdp_engine_memory_report_all(zdp_engine *eng, zdp_memory_report *out,
                                                zdp_error *err);

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

#ifdef __cplusplus
}
#endif
#endif /* ZDP_PUBLIC_ENGINE_H */
