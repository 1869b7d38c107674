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

/* The param source (zdp/model.h).  Dense: caller-owned whole tensors. */
struct zdp_param_source {
    zdp_engine *eng;           /* NULL for a dense source */
    const float *const *dense; /* dense source: (n_dense) tensors */
    int n_dense;
};

/* Stage 3: one live fetch of tensors [first, first + count), gathered into
 * buf (elems floats, the range's flat extent).  refs == 0: released by the
 * model but kept gathered for a reuse the trace shows within
 * stage3_max_reuse_distance (docs/deepspeed.md §4.8). */
typedef struct gather_rec {
    int first, count, refs;
    float *buf;     /* NULL when this rank's allocation failed (the ranks agree
                       on the gather's verdict before anyone gathers) */
    int64_t elems;
    uint64_t event; /* prefetched: the gather's stream event */
    int slot;       /* prefetched: its verdict in zdp_engine.verdicts */
} gather_rec;

/* Stage 3's agreement (docs/deepspeed.md §4.9): every
 * collective inside a stage-3 pass first all-reduces one row per rank,
 * {kind, a, b}, and runs only when every row says the same, so one rank's
 * failure (an allocation, a model that stops early or fetches something
 * else) fails the operation on every rank instead of leaving the others
 * in a collective it never enters. */
enum { ROW_GATHER = 1, ROW_NOMEM = 2, ROW_REDUCE = 3, ROW_END = 4 };
#define ROW_N_ 3
/* The outcome of one agreed gather, written on the stream thread and read
 * after waiting for its event: bad_rank < 0 when it ran, else the first
 * rank whose row differed (or could not allocate) and that row. */
typedef struct gather_verdict {
    int bad_rank;
    int64_t row[ROW_N_];
} gather_verdict;

/* Stage 3's prefetch follows the order of the fetches of the first forward
 * and of the first backward (DeepSpeed's trace), one trace per kind of
 * pass. */
enum { PASS_FORWARD = 0, PASS_BACKWARD = 1 };
typedef struct fetch_trace {
    int *first, *count; /* (cap) the fetches in order */
    int len, cap;
    bool done;          /* recorded: later passes replay it */
} fetch_trace;

struct zdp_engine {
    zdp_config cfg;
    const zdp_model *model;
    int rank, world;
    zdp_mem_counter mem;
    zdp_layout lay;

    float *params;       /* (padded); stage 3: (P) this rank's partition only */
    float **param_ptrs;  /* (n_tensors) views into params; stage 3: NULL entries */
    float *grads;        /* (padded) stages 0/1, else NULL */
    float *grad_part;    /* (P) stages 1/2, else NULL */

    /* Reduce buckets (stages 1/2). */
    zdp_bucket *buckets;
    int n_buckets;
    int *tensor_bucket;  /* (n_tensors) */
    int *bucket_pending; /* (n_buckets) tensors not yet released this backward */
    float **bucket_buf;  /* (n_buckets) buffer a bucket holds, or NULL */
    float **pool;        /* stage 2: free bucket buffers */
    int pool_free, pool_total, pool_cap; /* free now, allocated, most allowed */
    int64_t bucket_elems; /* elements per bucket buffer */
    float *rs_scratch;   /* stages 1/2: reduce-scatter scratch / landing area */
    int64_t rs_scratch_elems;
    int *rs_counts;      /* (W) used on the stream thread only */
    int *ag_counts, *ag_displs; /* (W) all-gather shards, stream thread only */

    /* The comm stream and stage 2's buckets in flight on it (FIFO). */
    zdp_stream *stream;
    const zdp_comm_rs_backend *rs; /* the reduce-scatter backend, picked at create */
    float **inflight_buf;     /* (pool_cap) ring of buffers whose reduction is queued */
    uint64_t *inflight_event; /* (pool_cap) their stream events */
    int inflight_head, inflight_count;

    /* The agreement on backward() counts (docs/training.md, "Ranks that
     * disagree").  step()'s norm all-reduce carries {in_step, count, count^2,
     * sumsq}; at stage 2 every backward first queues the same all-reduce with
     * in_step = 0, so a backward on one rank meets step() on another in a
     * collective of the same shape instead of a reduce-scatter, and both see
     * the disagreement.  stream_skip (stream thread only) is set when a
     * backward's agreement failed: its bucket reductions are skipped on every
     * rank alike. */
    double bwd_agree[4];
    uint64_t bwd_agree_event;
    bool stream_skip;
    int64_t *agree_gather; /* (2W) the counts, gathered on the error path only */

    /* Accounting: comm_total is written on the stream thread and read here
     * only after waiting for the stream. */
    zdp_comm_report comm_total, comm_at_last_step, comm_last_step;
    zdp_step_timing timing_window, timing_last;

    zdp_grad_sink sink;
    zdp_param_source src;

    /* Stage 3 (docs/deepspeed.md §4.8): what fetch hands out.  table[i] is
     * tensor i's gathered copy while a fetch holds it, or its persistent
     * copy (tensors under stage3_param_persistence_threshold stay whole in
     * `persist`, refreshed after each update); live_of[i] is the record
     * holding tensor i, -1 if none. */
    const float **table;   /* (n_tensors) */
    int *live_of;          /* (n_tensors) */
    gather_rec *recs;      /* (n_tensors) live fetches, the first n_recs used */
    int n_recs;
    float *persist;        /* (persist_elems) persistent tensors, whole */
    int64_t persist_elems;
    int64_t *persist_off;  /* (n_tensors) offset into persist, -1 if not persistent */
    bool persist_stale;    /* persist must be re-gathered before it is read */
    bool in_pass;          /* inside the model's forward or backward */
    int64_t gathered_peak; /* most bytes of fetched (non-persistent) copies at once */
    /* Prefetch (stage3_prefetch_bucket_size > 0): gathers queued ahead of
     * the model, in trace order, until it asks for them. */
    fetch_trace trace[2];
    int pass_kind;         /* PASS_* of the pass running */
    bool trace_recording;  /* this pass records its kind's trace */
    int trace_pos;         /* the next trace entry the model should ask for */
    bool trace_ok;         /* this pass still follows its trace */
    int next_pf;           /* the next trace entry to consider prefetching */
    gather_rec *pf;        /* (n_tensors) prefetched, oldest first, the first n_pf used */
    int n_pf;
    int *pf_of;            /* (n_tensors) the pf entry holding tensor i, -1 if none */
    int64_t pf_elems;      /* elements prefetched and not yet asked for */
    int64_t prefetch_hits; /* fetches served by a prefetch (tests, benchmarks) */
    int64_t reuse_hits;    /* fetches served by a range kept for reuse */
    int64_t gathered_elems; /* elements of fetched and prefetched copies, counted
                               the same on every rank whether or not the
                               allocation succeeded (prefetch decides on it) */
    int64_t *rows;         /* (ROW_N_ W) the agreement rows, stream thread only */
    gather_verdict *verdicts; /* (n_verdicts) ring, one slot per gather in flight */
    int n_verdicts;
    int64_t gather_seq;    /* gathers queued so far: the next slot */
    bool pass_bad;         /* stream thread: a collective of this pass disagreed */
    bool end_model_failed; /* the END row's flag: this rank's model failed */
    bool end_done;         /* the last END agreement found every rank at END */
    int end_fail_rank;     /* then: the first rank whose pass failed, or -1 */
    int end_fail_flag;     /* and how: 2 its model failed, 1 it saw a disagreement */
    /* Fault injection for tests (ZDP_TEST_FAIL_GATHER=RANK:N): the N-th
     * gather buffer this engine allocates on rank RANK fails. */
    int fail_rank;
    int64_t fail_nth, gather_allocs;
    /* Stage 3 with a model's frozen weights (zdp_frozen, a LoRA base): a
     * second engine over them, without gradients or optimizer, sharing this
     * one's stream, mem-free of this one's counters (the report adds its
     * bytes); frozen_prev is the source the model read them through. */
    zdp_engine *frozen;
    bool frozen_borrowed;  /* frozen is a zdp_frozen_store's, shared: not ours to free */
    zdp_engine *parent;    /* in the frozen engine: the engine it serves (a store's:
                              the borrower whose pass runs, else NULL) */
    zdp_stream *own_stream; /* a store's frozen engine: its own stream, for whole
                               gathers outside any borrower's pass */
    int borrowers;         /* a store's frozen engine: engines borrowing it now */
    zdp_model frozen_model; /* its tensors, as the frozen engine's model */
    zdp_param_source *frozen_prev;
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

/* Queues an all-reduce (SUM) of n int64 on the engine's comm stream and
 * waits for it: checkpoint.c's agreement between ranks. */
zdp_status zdp_engine_allreduce_i64_(zdp_engine *e, int64_t *buf, int n, zdp_error *err);

/* Waits for every reduction still in flight on the stream (stage 2 with
 * overlap_comm), so grad_part is complete. */
zdp_status zdp_engine_drain_(zdp_engine *e, zdp_error *err);

#endif /* ZDP_ENGINE_IMPL_H */
