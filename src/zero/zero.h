/*
 * zero.h -- internal: the ZeRO paths, everything src/engine calls to lay out,
 * reduce, gather and partition parameters.  Nothing outside src/engine and
 * src/zero includes it (tests/unit/test_optim_zero.c checks the layout).
 *
 *   layout.c   the flat layout, partitions and the bucket plan: arithmetic
 *   buckets.c  stages 1-3: gradient reduce buckets, their buffers and their
 *              reductions on the comm stream; stages 1/2's parameter all-gather
 *   stage3.c   stage 3: agreed gathers, prefetch, persistent tensors, release,
 *              the end-of-pass agreement, and the param source the model reads
 *   frozen.c   stage 3 with frozen weights (a LoRA base): a partitioned set
 *              without gradients, an engine's own or a shared store's
 *
 * Layering: src/zero uses src/comm (the stream, collectives), src/core and
 * the config; it never calls src/engine.  Each path keeps its state in its
 * own struct, which the engine embeds, and reaches the engine only through
 * a zdp_zero_link the engine fills in.
 *
 * Layout (DeepSpeed's, docs/deepspeed.md §4.2): tensors are packed back to back in
 * registration order; the total is padded with zeros to a multiple of 2*W;
 * P = padded / W and rank r owns [r*P, (r+1)*P).  A tensor may straddle
 * partitions; all ZeRO arithmetic is by flat index, never by tensor.
 */
#ifndef ZDP_ZERO_H
#define ZDP_ZERO_H

#include "../comm/comm.h"
#include "../comm/stream.h"
#include "../core/core.h"

/* ---- layout (layout.c) ------------------------------------------------- */

typedef struct zdp_layout {
    int world_size;
    int n_tensors;
    int64_t *offsets; /* (n_tensors) start of tensor i in the flat buffer */
    int64_t *numels;  /* (n_tensors) elements of tensor i */
    int64_t numel;    /* sum of numels */
    int64_t padded;   /* numel rounded up to a multiple of 2*W */
    int64_t part;     /* P = padded / W */
    zdp_mem_counter *mem; /* where the two arrays are counted (may be NULL) */
} zdp_layout;

/* The arrays are counted in *mem (ZDP_MEM_OTHER) when mem is not NULL. */
ZDP_API zdp_status zdp_layout_init(zdp_layout *lay, const zdp_param_info *params, int n_params,
                                   int world_size, zdp_mem_counter *mem, zdp_error *err);
ZDP_API void zdp_layout_free(zdp_layout *lay);

/* Elements of the flat range [lo, hi) that rank r owns. */
ZDP_API int64_t zdp_layout_owned(const zdp_layout *lay, int r, int64_t lo, int64_t hi);

/* A reduce bucket: consecutive tensors [first, last] (registration indices),
 * i.e. the contiguous flat range [lo, hi).  Buckets are planned from the last
 * tensor to the first, because backward finishes layers in that order. */
typedef struct zdp_bucket {
    int first, last;
    int64_t lo, hi;
} zdp_bucket;

/* Plans buckets of at most cap elements (a tensor larger than cap gets a
 * bucket of its own).  *out is malloc'd, bucket 0 holds the last tensors;
 * tensor_bucket[i] (n_tensors entries, malloc'd) gives tensor i's bucket. */
ZDP_API zdp_status zdp_bucket_plan(const zdp_layout *lay, int64_t cap, zdp_bucket **out, int *n_out,
                                   int **tensor_bucket, zdp_error *err);

/* Reads what one rank holds of every tensor through read, into dst: with
 * partitioned, the slice of each tensor inside rank's partition (dst is
 * the partition, P floats); otherwise whole tensors (dst is the padded flat
 * buffer).  The padding is not written. */
ZDP_API zdp_status zdp_layout_read(const zdp_layout *lay, int rank, bool partitioned, float *dst,
                                   zdp_tensor_read_fn read, void *ctx, zdp_error *err);

/* ---- the link to the owner ------------------------------------------------ */

/* What a ZeRO path uses of the engine (or frozen set) it serves.  The owner
 * fills it in and keeps it alive as long as the path; only `stream`
 * changes afterwards (a shared frozen store points it at the stream of the
 * engine whose pass runs). */
typedef struct zdp_zero_link {
    int rank, world;
    const zdp_zero_config *cfg;
    const zdp_layout *lay;
    const zdp_param_info *info; /* (n_tensors) the tensors' names, for messages */
    float *params;              /* the owner's: (P) the partition at stage 3, else (padded) */
    zdp_mem_counter *mem;       /* where every allocation of the path is counted */
    zdp_stream *stream;         /* where the path's collectives are queued */
    zdp_comm_report *stats;     /* what they moved (written on the stream thread) */
    double *wait_s;             /* the caller's time waiting for them */
    /* (W) counts and displacements of the uneven collectives, the owner's
     * scratch: used on the stream thread only, one operation at a time, so
     * the paths of one owner share them.  rs_counts is NULL where nothing is
     * reduced (a frozen set). */
    int *rs_counts, *ag_counts, *ag_displs;
} zdp_zero_link;

/* Waits for `event` on the link's stream, adding the time to *wait_s. */
zdp_status zdp_zero_wait(const zdp_zero_link *k, uint64_t event, zdp_error *err);

/* ---- reduce buckets (buckets.c) ------------------------------------------- */

struct zdp_stage3;

/* Stages 1-3: the gradient in reduce buckets, each averaged and reduce-
 * scattered into this rank's gradient partition (DeepSpeed's schedule,
 * docs/deepspeed.md §3.4, §4.5).  Stages 2/3 hand the model bucket buffers
 * from a pool and queue a bucket's reduction as soon as its last tensor is
 * released; with overlap_comm backward goes on meanwhile and the buffer
 * comes back when a new bucket needs one.  Stage 1 reduces the window's
 * whole gradient at step(), bucket by bucket. */
typedef struct zdp_grad_buckets {
    const zdp_zero_link *link;
    float *grad_part;              /* (P) the owner's: where this rank's piece lands */
    struct zdp_stage3 *s3;         /* stage 3: reductions agree like gathers; else NULL */
    const zdp_comm_rs_backend *rs; /* the reduce-scatter backend, picked at init */
    zdp_bucket *plan;
    int n;
    int *tensor_bucket;  /* (n_tensors) */
    int *pending;        /* (n) tensors not yet released this backward */
    float **buf;         /* (n) buffer a bucket holds, or NULL */
    float **pool;        /* stages 2/3: free bucket buffers */
    int pool_free, pool_total, pool_cap; /* free now, allocated, most allowed */
    int64_t bucket_elems; /* elements per bucket buffer */
    float *rs_scratch;   /* the reduce-scatter's scratch / landing area */
    int64_t rs_scratch_elems;
    float **inflight_buf;     /* (pool_cap) ring of buffers whose reduction is queued */
    uint64_t *inflight_event; /* (pool_cap) their stream events */
    int inflight_head, inflight_count;
    /* Stream thread: a backward whose count agreement failed skips its
     * reductions on every rank alike (the engine's agreement sets it). */
    bool skip;
} zdp_grad_buckets;

/* Plans the buckets and allocates their buffers (stage >= 1); s3 is the
 * owner's stage-3 state at stage 3, else NULL. */
zdp_status zdp_buckets_init(zdp_grad_buckets *g, const zdp_zero_link *k, float *grad_part,
                            struct zdp_stage3 *s3, zdp_error *err);
/* Frees everything (after the stream has stopped).  A zeroed g is a no-op. */
void zdp_buckets_free(zdp_grad_buckets *g);
/* Before a backward: every bucket waits for all its tensors again. */
void zdp_buckets_begin(zdp_grad_buckets *g);
/* Stages 2/3: where tensor i's gradient goes in its bucket's buffer (a
 * buffer is taken when the bucket has none); NULL when no buffer can be
 * allocated.  A reduction that failed while buffers came back is recorded
 * in *comm_st / *comm_err (the first one). */
float *zdp_buckets_grad(zdp_grad_buckets *g, int i, zdp_status *comm_st, zdp_error *comm_err);
/* Stages 2/3: tensor i is complete; the last tensor of its bucket queues the
 * bucket's reduction.  false (nothing changed) when its bucket has no
 * buffer and none can be allocated.  Errors as zdp_buckets_grad. */
bool zdp_buckets_release(zdp_grad_buckets *g, int i, zdp_status *comm_st, zdp_error *comm_err);
/* Waits for every reduction still in flight, so grad_part is complete. */
zdp_status zdp_buckets_drain(zdp_grad_buckets *g, zdp_error *err);
/* Stage 1: the window's summed gradient grads (padded) reduce-scattered
 * into grad_part, every bucket queued at once, then one wait. */
zdp_status zdp_buckets_reduce_window(zdp_grad_buckets *g, float *grads, zdp_error *err);
/* Stages 1/2: every rank gets the updated partitions of the others. */
zdp_status zdp_buckets_allgather_params(zdp_grad_buckets *g, zdp_error *err);

/* ---- stage 3 (stage3.c) --------------------------------------------------- */

/* One live fetch of tensors [first, first + count), gathered into buf
 * (elems floats, the range's flat extent).  refs == 0: released by the
 * model but kept gathered for a reuse the trace shows within
 * stage3_max_reuse_distance (docs/deepspeed.md §4.8). */
typedef struct gather_rec {
    int first, count, refs;
    float *buf;     /* NULL when this rank's allocation failed (the ranks agree
                       on the gather's verdict before anyone gathers) */
    int64_t elems;
    uint64_t event; /* prefetched: the gather's stream event */
    int slot;       /* prefetched: its verdict in zdp_stage3.verdicts */
} gather_rec;

/* The outcome of one agreed gather, written on the stream thread and read
 * after waiting for its event: bad_rank < 0 when it ran, else the first
 * rank whose row differed (or could not allocate) and that row (stage3.c,
 * "agreement"). */
#define ZDP_STAGE3_ROW_N 3
typedef struct gather_verdict {
    int bad_rank;
    int64_t row[ZDP_STAGE3_ROW_N];
} gather_verdict;

/* Prefetch follows the order of the fetches of the first forward and of
 * the first backward (DeepSpeed's trace), one trace per kind of pass. */
enum { ZDP_PASS_FORWARD = 0, ZDP_PASS_BACKWARD = 1 };
typedef struct fetch_trace {
    int *first, *count; /* (cap) the fetches in order */
    int len, cap;
    bool done;          /* recorded: later passes replay it */
} fetch_trace;

/* Stage 3's state for one partitioned set of tensors (an engine's
 * parameters, or frozen weights): what fetch hands out.  table[i] is tensor
 * i's gathered copy while a fetch holds it, or its persistent copy (tensors
 * under stage3_param_persistence_threshold stay whole in `persist`,
 * refreshed after each update); live_of[i] is the record holding tensor i,
 * -1 if none. */
typedef struct zdp_stage3 {
    zdp_zero_link *link;
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
    int pass_kind;         /* ZDP_PASS_* of the pass running */
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
    int64_t *rows;         /* (ROW_N W) the agreement rows, stream thread only */
    gather_verdict *verdicts; /* (n_verdicts) ring, one slot per gather in flight */
    int n_verdicts;
    int64_t gather_seq;    /* gathers queued so far: the next slot */
    bool pass_bad;         /* stream thread: a collective of this pass disagreed */
    bool end_model_failed; /* the END row's flag: this rank's model failed */
    bool end_done;         /* the last END agreement found every rank at END */
    int end_fail_rank;     /* then: the first rank whose pass failed, or -1 */
    int end_fail_flag;     /* and how: 2 its model failed, 1 it saw a disagreement */
    /* Fault injection for tests: the fail_nth-th gather buffer this state
     * allocates on rank fail_rank fails (zdp_stage3_init's hook). */
    int fail_rank;
    int64_t fail_nth, gather_allocs;
    /* The frozen weights' stage 3 (frozen.c) whose passes run inside this
     * one's and whose gathers count in its live bound; `borrowed` when a
     * shared store's.  In the frozen state, parent is the state it serves
     * (a store's: the borrower whose pass runs, else NULL). */
    struct zdp_stage3 *frozen;
    bool frozen_borrowed;
    struct zdp_stage3 *parent;
} zdp_stage3;

/* Allocates the fetch tables and the persistent tensors' copies; the
 * environment variable fail_hook ("RANK:N", may be unset) makes the N-th
 * gather buffer on RANK fail to allocate (tests). */
zdp_status zdp_stage3_init(zdp_stage3 *s, zdp_zero_link *k, const char *fail_hook,
                           zdp_error *err);
/* Frees everything (after the stream has stopped).  A zeroed s is a no-op. */
void zdp_stage3_free(zdp_stage3 *s);
/* The frozen weights' state runs inside s's passes from now on. */
void zdp_stage3_attach_frozen(zdp_stage3 *s, zdp_stage3 *frozen, bool borrowed);
/* Around the model's forward or backward (kind ZDP_PASS_*): begin brings
 * the persistent tensors up to date and queues the first prefetches; end
 * frees what the model left live and what was prefetched for it; agree is
 * the end-of-pass agreement, which gives every rank the same verdict
 * (model_st, or an error naming the rank that failed).  No-ops below
 * stage 3 (begin only marks the pass). */
zdp_status zdp_stage3_pass_begin(zdp_stage3 *s, int kind, zdp_error *err);
void zdp_stage3_pass_end(zdp_stage3 *s);
zdp_status zdp_stage3_pass_agree(zdp_stage3 *s, zdp_status model_st, zdp_error *err);
/* Stream thread: inside a pass, a bucket's reduction first agrees with the
 * other ranks (they must not meet a gather); *go = false when they
 * disagree (the pass then fails at its end). */
zdp_status zdp_stage3_agree_reduce(zdp_stage3 *s, int bucket, bool *go, zdp_error *err);
/* COLLECTIVE: tensor i whole into out, gathered from the partitions. */
zdp_status zdp_stage3_get_tensor(zdp_stage3 *s, int i, float *out, zdp_error *err);
/* The partition changed (an update, set_param, a load): the persistent
 * copies are gathered again before they are next read. */
void zdp_stage3_params_changed(zdp_stage3 *s);

/* The param source (zdp/model.h): a dense table of whole tensors (a
 * caller's, or an engine's below stage 3), or a stage-3 state that gathers
 * them on fetch. */
struct zdp_param_source {
    zdp_stage3 *s3;            /* NULL for a dense source */
    const float *const *dense; /* dense source: (n_dense) tensors */
    int n_dense;
};

/* ---- frozen weights (frozen.c) -------------------------------------------- */

/* Stage 3 with a model's frozen weights (zdp_frozen, a LoRA base): the
 * weights partitioned like parameters, without gradients or optimizer, with
 * a stage-3 state of their own that gathers them layer by layer within the
 * passes of the engine they serve, on that engine's stream, so they keep
 * their place among its collectives (docs/lora.md).  Its memory is counted
 * apart (the engine's report adds it).  A shared store
 * (zdp_frozen_store_create) holds one with a stream of its own, for whole
 * gathers outside any borrower's pass. */
typedef struct zdp_frozen_set {
    zdp_zero_config zcfg;
    zdp_mem_counter mem;
    zdp_layout lay;
    float *params;             /* (P) this rank's partition */
    int *ag_counts, *ag_displs; /* (W) the link's scratch */
    zdp_comm_report comm_total; /* the gathers' traffic (not reported) */
    double comm_wait_s;        /* moved into the engine's timing after each pass */
    zdp_zero_link link;
    zdp_stage3 s3;
    zdp_param_source src;      /* what the model reads the weights through */
    zdp_stream *own_stream;    /* a store's: its own stream, else NULL */
    int borrowers;             /* a store's: engines borrowing it now */
} zdp_frozen_set;

/* A set over fz's tensors, its gathers on `stream` (the engine's), this
 * rank's partition read through fz->read.  On failure *out may hold a
 * part-built set (destroy it). */
zdp_status zdp_frozen_set_create(const zdp_config *cfg, int rank, int world, const zdp_frozen *fz,
                                 zdp_stream *stream, zdp_frozen_set **out, zdp_error *err);
/* Frees the set (its own stream too); the engine's stream must have
 * stopped.  NULL is a no-op. */
void zdp_frozen_set_destroy(zdp_frozen_set *f);
/* zdp_engine_create_shared: the store's set, after checking that fz's
 * tensors are the store's (by name and size). */
zdp_status zdp_frozen_store_borrow(zdp_frozen_store *store, const zdp_frozen *fz,
                                   zdp_frozen_set **out, zdp_error *err);
/* The borrower (its stage-3 state) gives the store's set back untouched. */
void zdp_frozen_store_return(zdp_frozen_set *f, const zdp_stage3 *borrower);

#endif /* ZDP_ZERO_H */
