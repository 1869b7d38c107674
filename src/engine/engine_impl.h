/*
 * engine_impl.h -- internal: the engine's struct, shared by engine.c (the
 * state machine and ZeRO paths) and checkpoint.c (save and load).  Nothing
 * outside src/engine includes it.
 */
#ifndef ZDP_ENGINE_IMPL_H
#define ZDP_ENGINE_IMPL_H

#include "../comm/comm.h"
#include "../comm/stream.h"
#include "../core/core.h"
#include "../optim/optim.h"
#include "../zero/zero.h"
#include "engine.h"

/* Per-tensor state inside one backward. */
enum { SINK_IDLE = 0, SINK_ACQUIRED, SINK_RELEASED };

struct zdp_grad_sink {
    zdp_engine *eng;      /* NULL for a dense sink */
    float *const *dense;  /* dense sink: caller-owned buffers per tensor */
    int n_dense;
    unsigned char *state; /* (n_tensors) SINK_* */
    int misuse_tensor;    /* first tensor misused this backward, -1 if none */
    const char *misuse;   /* what went wrong with it */
    zdp_status comm_status; /* first reduction failure in this backward */
    zdp_error comm_err;
};

struct zdp_engine {
    zdp_config cfg;
    const zdp_model *model;
    int rank, world;
    zdp_mem_counter mem;
    zdp_layout lay;

    float *params;       /* (padded); stage 3: (P) this rank's partition only */
    float **param_ptrs;  /* (n_tensors) views into params; stage 3: NULL entries */
    float *grads;        /* (padded) stages 0/1, else NULL */
    float *grad_part;    /* (P) stages 1-3, else NULL */
    /* (W) the uneven collectives' scratch, the link's (zero.h) */
    int *rs_counts, *ag_counts, *ag_displs;

    /* The ZeRO paths (src/zero): their view of this engine, stages 1-3's
     * reduce buckets, stage 3's gathers, and the frozen weights' set
     * (stage 3 with zdp_model.frozen; a shared store's when borrowed);
     * frozen_prev is the source the model read them through before. */
    zdp_zero_link zl;
    zdp_grad_buckets gb;
    zdp_stage3 s3;
    zdp_frozen_set *frozen;
    bool frozen_borrowed;
    zdp_param_source *frozen_prev;

    zdp_stream *stream;  /* the comm stream every collective is queued on */

    /* The agreement on backward() counts (docs/training.md, "Ranks that
     * disagree").  step()'s norm all-reduce carries {in_step, count, count^2,
     * sumsq}; at stage 2 every backward first queues the same all-reduce with
     * in_step = 0, so a backward on one rank meets step() on another in a
     * collective of the same shape instead of a reduce-scatter, and both see
     * the disagreement.  A backward whose agreement failed skips its bucket
     * reductions on every rank alike (gb.skip). */
    double bwd_agree[4];
    uint64_t bwd_agree_event;
    int64_t *agree_gather; /* (2W) the counts, gathered on the error path only */

    /* Accounting: comm_total is written on the stream thread and read here
     * only after waiting for the stream. */
    zdp_comm_report comm_total, comm_at_last_step, comm_last_step;
    zdp_step_timing timing_window, timing_last;

    zdp_grad_sink sink;
    zdp_param_source src;

    float *save_params;    /* stage 3, during a checkpoint save: the whole model
                              (numel), gathered for rank 0's model file */
    zdp_optim optim;

    /* DeepSpeed's engine state (docs/deepspeed.md §2.1). */
    int64_t micro_steps, global_steps, global_samples, skipped_steps;
    int64_t window_backwards; /* backward() calls since the last model step */
    bool step_applied, running_step, have_forward;
    int boundary_override;    /* -1 unset, else 0/1 (sticky, managed only) */
    double last_grad_norm;
    int64_t sched_iter;       /* the LR scheduler's n: -1, +1 per applied update */
    double last_lr;           /* lr of the last applied update, -1 before */

    /* Per-step hyperparameters (zdp_engine_set_hparams).  beta1, beta2, eps
     * and weight_decay live in optim.cfg, which the update reads; cfg keeps
     * the values the engine was created with, so a checkpoint load can go
     * back to them. */
    double clip;              /* the max global norm model_step_ clips to; 0 = off */
    bool lr_set;              /* true: lr_override replaces the scheduler */
    double lr_override;
};

/* Puts the per-step hyperparameters back to the config's (create, and
 * checkpoint load: they are not saved). */
void zdp_engine_hparams_from_config_(zdp_engine *e);

/* ---- the engine's operations on its comm stream (stream_ops.c) ---------- */

typedef enum engine_op_kind {
    OP_ALLREDUCE_GRADS,   /* stage 0: SUM all-reduce of the gradients, then the mean */
    OP_ALLREDUCE_NORM,    /* step's agreement: SUM all-reduce of AGREE_N doubles */
    OP_AGREE_BACKWARD,    /* stages 2/3: a backward's agreement, the same all-reduce */
    OP_ALLREDUCE_FLAG,    /* stages 1-3: SUM all-reduce of one double (a refusal) */
    OP_BCAST_PARAMS,      /* rank 0's parameters to everyone */
    OP_ALLREDUCE_I64,     /* SUM all-reduce of int64s (zdp_engine_allreduce_i64_) */
} engine_op_kind;

/* The agreement all-reduce: {in_step, count, count^2, sumsq}, summed over
 * ranks.  A backward at stages 2/3 sends in_step = 0 and sumsq = 0; step()
 * sends in_step = 1 and its squared gradient norm.  Counts are whole
 * numbers far below 2^26, so every sum is exact in a double. */
#define AGREE_N 4

/* What the summed agreement says, the same on every rank: 0 all agree, 1
 * some ranks are in step() and others in backward(), 2 the backward()
 * counts differ (W * sum c^2 == (sum c)^2 only when every c is equal). */
int zdp_engine_agree_verdict_(const double *a, int world);
/* Queues an operation on buf (see engine_op_kind); its event. */
uint64_t zdp_engine_enqueue_(zdp_engine *e, engine_op_kind kind, void *buf);
/* Queues it and waits, the wait counted as comm wait. */
zdp_status zdp_engine_run_sync_(zdp_engine *e, engine_op_kind kind, void *buf, zdp_error *err);
/* Queues an all-reduce (SUM) of n int64 on the engine's comm stream and
 * waits for it: checkpoint.c's agreement between ranks. */
zdp_status zdp_engine_allreduce_i64_(zdp_engine *e, int64_t *buf, int n, zdp_error *err);

/* ---- the rest of the engine's internals ------------------------------------ */

/* Waits for every reduction still in flight on the stream (stages 2/3 with
 * overlap_comm), so grad_part is complete. */
zdp_status zdp_engine_drain_(zdp_engine *e, zdp_error *err);

/* grad_sink.c: before and after the model's backward (sink_end releases
 * what the model left open, last tensor first). */
void zdp_engine_sink_begin_(zdp_engine *e);
void zdp_engine_sink_end_(zdp_engine *e);

/* params.c: the padding at the end of the flat buffer (of the last
 * partition, at stage 3) back to zero. */
void zdp_engine_zero_padding_(zdp_engine *e);

#endif /* ZDP_ENGINE_IMPL_H */
