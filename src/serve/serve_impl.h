/*
 * serve_impl.h -- internal header of src/serve/: what the module's files
 * share.  The layers call one way, down:
 *   wire   http.c (libmicrohttpd: guards, body budget, watchdog, /healthz,
 *          dispatch), plain_api.c and plain_info.c (the plain JSON API),
 *          and the protocols registered through serve_protocol (tinker/);
 *   job    parse.c and parse_fwd.c (a body into a job's payload), paths.c
 *          (the paths a client may name), job.c (payload layouts and their
 *          typed views, a job's outcome), results.c (the typed results)
 *          and results_json.c (their JSON, and error bodies);
 *   queue  queue.c (the FIFO, the leader and worker loops, signals, the
 *          health check);
 *   exec   exec.c (the op table, forward/backward, optim_step, create and
 *          unload), exec_ckpt.c, exec_sample.c with sampling.c,
 *          exec_info.c, and weights.c (views, whole copies, slots): engine
 *          calls only, each op's outcome left typed in its job.
 * server.c starts and stops it all; util.c, bytes.c and fwd_input.c are
 * helpers any layer uses.
 */
#ifndef ZDP_SERVE_IMPL_H
#define ZDP_SERVE_IMPL_H

#include <jansson.h>
#include <microhttpd.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "bytes.h"
#include "comm/comm.h"
#include "core/json.h"
#include "fwd_input.h"
#include "models/policy_loss.h"
#include "serve.h"
#include "zdp/engine.h"
#include "zdp/lora.h"
#include "zdp/model.h"
#include "zdp/sample.h"

/* The largest seq_id a client may send: 2^53 - 1, JSON's exact integers, so
 * seq_id + 1 can neither overflow nor round. */
#define SERVE_MAX_SEQ_ID ((int64_t)9007199254740991)

/* The op table: every request kind the queue runs.  X(NAME, name, exec,
 * all_ranks): OP_NAME; the name GET /info's "requests" and /healthz use; the
 * function that runs it (the exec files; NULL: never executed); whether every rank
 * runs it (else rank 0 alone, nothing broadcast).  The enum, the dispatch
 * (serve_ops[]) and the per-op stats come from this one list. */
#define SERVE_OP_MAP(X)                                                                                 \
    X(QUIT, "quit", NULL, true)              /* every rank leaves its loop */                           \
    X(FWDBWD, "forward_backward", exec_fwd_, true)                                                      \
    X(FORWARD, "forward", exec_fwd_, true)                                                              \
    X(OPTIM, "optim_step", exec_optim_, true)                                                           \
    X(SAVE_WEIGHTS, "save_weights", serve_exec_save_weights, true) /* stage 3 gathers */                \
    X(SAVE_STATE, "save_state", serve_exec_state, true)                                                 \
    X(LOAD_STATE, "load_state", serve_exec_state, true)                                                 \
    X(INFO, "info", serve_exec_info, true)                                                              \
    X(SAMPLE, "sample", serve_exec_sample, true)                                                        \
    X(LOAD_WEIGHTS, "load_weights", serve_exec_load_weights, true) /* fresh optimizer state */          \
    X(NOOP, "noop", NULL, false)     /* refused before the engine: only its seq_id counts */            \
    X(SAMPLE_FILE, "asample", serve_exec_sample_file, true) /* from saved sampler weights */            \
    X(PING, "ping", NULL, true)      /* the health check: every rank answers rank 0 */                  \
    X(DELETE_CKPT, "delete_checkpoint", serve_exec_delete, true) /* each rank its own part */           \
    X(CREATE, "create_model", exec_create_, true)   /* a LoRA model in a free slot */                   \
    X(UNLOAD, "unload_model", exec_unload_, true)   /* frees a LoRA model's slot */                  \
    X(COPY_CKPT, "copy_weights", serve_exec_copy, true) /* each rank its own part */

enum {
#define SERVE_OP_ENUM_(name, str, fn, all) OP_##name,
    SERVE_OP_MAP(SERVE_OP_ENUM_)
#undef SERVE_OP_ENUM_
    SERVE_N_OPS
};

struct server;
struct job;
/* Runs a job on this rank.  On rank 0 it leaves the outcome in the job,
 * typed and not encoded: j->status, and on a failure j->err_field and
 * j->err_msg, on a success the op's result (j->fwd, j->sample, j->optim,
 * j->saved or j->info; none for the ops whose answer the wire format makes
 * from the request alone).  The wire format that made the job encodes it. */
typedef void (*serve_exec_fn)(struct server *s, struct job *j);

typedef struct serve_op {
    int op;
    const char *name;
    serve_exec_fn exec;
    bool all_ranks;
} serve_op;

extern const serve_op serve_ops[SERVE_N_OPS]; /* indexed by op */

/* The head of an OP_SAMPLE_FILE payload; then int32 prompt[n_prompt],
 * int32 stop[n_stop], n_stop_str stop strings (each NUL-terminated, one
 * after another), and the weights file's path, NUL-terminated. */
typedef struct sample_file_header {
    int64_t n_prompt, max_tokens, top_k, num_samples, n_stop, n_stop_str;
    int64_t prompt_logprobs; /* 1: the reply carries the prompt's logprobs */
    int64_t topk_prompt;     /* k > 0: and the k most likely tokens at each prompt position */
    uint64_t seed;
    double temperature, top_p;
} sample_file_header;

/* topk_prompt_logprobs at most (and at most the vocabulary): a reply holds
 * prompt_len x k ids and logprobs. */
#define SERVE_MAX_TOPK 1024

/* An OP_CREATE payload: a LoRA model (zdp_lora_config) for slot, known
 * from then on by uid (docs/server.md, "Models"). */
typedef struct create_payload {
    int64_t uid;
    int32_t slot, rank, targets, unused;
    double alpha;
    uint64_t seed;
} create_payload;

/* Server policy (docs/server.md, "Threat model"): a remote client's
 * optim_step is held to tighter caps than a program's ranges
 * (zdp_hparams_check_capped): an lr above SERVE_CLIENT_LR_MAX or a clipping
 * norm above SERVE_CLIENT_CLIP_MAX from the network is a typo or an attack,
 * never a recipe.  The other fields keep the library's ranges. */
#define SERVE_CLIENT_LR_MAX 10.0
#define SERVE_CLIENT_CLIP_MAX 1e30

/* Optimizer hyperparameters of an optim_step, in zdp_hparams' order. */
#define N_ADAM 6
extern const char *const serve_adam_keys[N_ADAM];

/* Losses (docs/tinker-protocol.md §2): zdp_loss_kind, ZDP_LOSS_CROSS_ENTROPY .. ZDP_LOSS_DRO. */
#define N_LOSSES 5

/* POST /sample {prompt: [tokens] | {chunks: [...]}, max_tokens, temperature,
 * top_k, seed}: payload int64 n, max_tokens, top_k, seed; double temperature;
 * int32 tokens[n]. */
typedef struct sample_req {
    int64_t n, max_tokens, top_k, seed, n_stop, n_stop_str;
    double temperature;
} sample_req;

/* The head of a forward/forward_backward payload. */
typedef struct fwd_header {
    int64_t n;    /* datums */
    int32_t loss; /* zdp_loss_kind */
    int32_t unused;
    double clip_low, clip_high, beta; /* loss_fn_config */
} fwd_header;

/* An optim_step payload: has[k] says adam_params[k] was given (or defaulted). */
typedef struct optim_payload {
    int32_t has[N_ADAM];
    double value[N_ADAM];
} optim_payload;

/* The result of a forward/forward_backward, typed until a reply encodes it
 * once, in the format asked for: JSON (serve_fwd_result_json: the plain API,
 * Tinker's JSON polls) or protobuf (tinker/proto_encode.c, SDK 0.25's polls). */
typedef struct serve_fwd_result {
    int64_t n;          /* datums */
    int64_t *off;       /* (n + 1): datum i's tokens are [off[i], off[i + 1]) */
    float *logprobs;    /* (off[n]) log p(target) per token */
    float *elementwise; /* (off[n]) the loss's summand per token (NaN: dropped datum) */
    double loss_sum;    /* the metric loss:sum */
} serve_fwd_result;
/* ForwardBackwardOutput as JSON text (non-finite numbers are null); NULL
 * when out of memory. */
char *serve_fwd_result_json(const serve_fwd_result *r);
/* A deep copy (a poll encodes it outside the lock); NULL when out of memory. */
serve_fwd_result *serve_fwd_result_copy(const serve_fwd_result *r);
void serve_fwd_result_free(serve_fwd_result *r); /* NULL is a no-op */

/* The result of a sample (POST /sample) or an asample (Tinker's), typed the
 * same way: JSON (serve_sample_result_json) or protobuf (tinker/proto_encode.c's
 * serve_proto_encode_sample_typed, a SampleResponse). */
typedef struct serve_sample_result {
    int64_t n;          /* sequences */
    int64_t *off;       /* (n + 1): sequence i's tokens are [off[i], off[i + 1]) */
    int32_t *tokens;    /* (off[n]) the sampled tokens */
    float *logprobs;    /* (off[n]) the model's log p of each; NULL: none (POST /sample's) */
    bool *stopped;      /* (n) stop_reason "stop" (a stop token ended it), else "length" */
    int64_t prompt_length; /* >= 0: POST /sample's reply (with "prompt_length");
                              -1: Tinker's SampleResponse ("type": "sample") */
    float *prompt_logprobs; /* (n_prompt_logprobs) log p(prompt[t] | prompt[<t]), [0] NaN; or NULL */
    int64_t n_prompt_logprobs;
    /* Top-k prompt logprobs (Tinker's TopkPromptLogprobs): topk_k > 0, rows
     * of n_topk prompt positions; row 0 ids -1, logprobs NaN (None). */
    int64_t topk_k, n_topk;
    int32_t *topk_ids;    /* (n_topk, topk_k) */
    float *topk_logprobs; /* (n_topk, topk_k) */
} serve_sample_result;
/* The reply as JSON text; NULL when out of memory. */
char *serve_sample_result_json(const serve_sample_result *r);
/* A deep copy (a poll encodes it outside the lock); NULL when out of memory. */
serve_sample_result *serve_sample_result_copy(const serve_sample_result *r);
void serve_sample_result_free(serve_sample_result *r); /* NULL is a no-op */

/* The result of an optim_step.  Only JSON: encoded once as the job finishes,
 * whole for the plain API, its metrics alone for Tinker (OptimStepResponse). */
typedef struct serve_optim_result {
    double grad_norm, lr; /* the metrics grad_norm:mean, learning_rate:mean */
    int64_t step, global_samples;
    bool step_applied;
    bool sgd_warning; /* adam_params beta1/beta2/eps given to an SGD engine */
} serve_optim_result;
/* metrics_only: {"metrics": {...}}; else with step, global_samples,
 * step_applied and warnings.  NULL when out of memory. */
char *serve_optim_result_json(const serve_optim_result *r, bool metrics_only);

/* The result of a save or a load (save_weights, save_state, load_state,
 * load_weights), typed until encoded once: the plain API's JSON as the job
 * finishes (serve_save_result_json), or a protocol's when its poll asks
 * (tinker/: {"path": tinker://..., "type", "sampling_session_id"?}, JSON
 * whatever the poll's Accept, as no SDK reads these as protobuf). */
typedef struct serve_save_result {
    int op;    /* OP_SAVE_WEIGHTS, OP_SAVE_STATE, OP_LOAD_STATE or OP_LOAD_WEIGHTS */
    char *path; /* the file or checkpoint the engine wrote or read */
    int64_t step, global_samples, pending_backwards; /* the engine's counters after it */
    /* Set by a protocol as the job finishes (NULL for the plain API): the name
     * its client knows the file by, and the sampling session it opened. */
    char *name, *session;
} serve_save_result;
/* The plain API's reply: {"path", "step"}, and for save_state/load_state
 * also "global_samples" and "pending_backwards".  NULL when out of memory. */
char *serve_save_result_json(const serve_save_result *r);
/* A deep copy (a poll encodes it outside the lock); NULL when out of memory. */
serve_save_result *serve_save_result_copy(const serve_save_result *r);
void serve_save_result_free(serve_save_result *r); /* NULL is a no-op */

/* Per op: requests run, seconds waiting in the FIFO and seconds executing
 * (GET /info "requests"). */
typedef struct serve_op_stats {
    int64_t count;
    double queue_s, exec_s, exec_max_s;
    int64_t batched; /* asample: requests that shared decoding passes with another */
} serve_op_stats;

/* One live model of GET /info's "models": its counters and its memory on
 * each rank (the engine's report; the shared base is not counted). */
typedef struct serve_info_model {
    int slot;
    int64_t n_params, step, pending_backwards, micro_steps;
    int64_t *rows;  /* (W, SERVE_INFO_MODEL_COLS): params, grads, optimizer, other, total, frozen bytes */
    char name[160]; /* LoRA mode: its model_id */
    zdp_lora_config lc;
} serve_info_model;
#define SERVE_INFO_MODEL_COLS 6
/* The server's own memory rows per rank: LoRA mode's (the base and what
 * sampling holds) and --full-finetune's (the engine's and sampling's). */
#define SERVE_INFO_LORA_COLS 10
#define SERVE_INFO_FULL_COLS 17

/* GET /info's numbers, gathered from every rank as the job runs (the
 * plain API encodes them, plain_info.c). */
typedef struct serve_info_result {
    int W;
    bool lora;
    int n_models;
    serve_info_model *models; /* (n_models) */
    int n_cols;               /* SERVE_INFO_LORA_COLS or SERVE_INFO_FULL_COLS */
    int64_t *rows;            /* (W, n_cols) */
    int64_t base_bytes;       /* LoRA mode: the base weights' bytes */
    /* --full-finetune: the engine's counters and the hyperparameters the
     * next update uses. */
    int64_t step, global_samples, micro_steps, skipped_steps, pending_backwards;
    double lr, last_grad_norm;
    zdp_hparams hp;
    /* The requests answered before this one. */
    serve_op_stats stats[SERVE_N_OPS];
} serve_info_result;
void serve_info_result_free(serve_info_result *r); /* NULL is a no-op */

/* Typed views of a job's payload (the parsers lay each one out, job.c
 * alone reads it back): pointers into j->payload, valid while the job lives.
 * false when the payload does not have the op's layout (a bug in zdp). */
typedef struct serve_fwd_req {
    fwd_header h;             /* h.n datums, the loss and its options */
    int64_t total;            /* tokens in all datums */
    const int32_t *len;       /* (h.n) tokens of each datum */
    const int32_t *tokens;    /* (total) the inputs, datum after datum */
    const int32_t *targets;   /* (total) the token each position predicts */
    const float *weights;     /* (total) cross_entropy's per-token weights */
    const float *logprobs;    /* (total) the sampler's log p (policy losses) */
    const float *advantages;  /* (total) */
} serve_fwd_req;
typedef struct serve_sample_req {
    sample_req r;
    const int32_t *stop;      /* (r.n_stop) tokens that end the sequence */
    const char *stop_str;     /* r.n_stop_str NUL-terminated strings, one after another */
    const int32_t *prompt;    /* (r.n) */
} serve_sample_req;
typedef struct serve_sample_file_req {
    sample_file_header h;
    const int32_t *prompt;    /* (h.n_prompt) */
    const int32_t *stop;      /* (h.n_stop) tokens that end a sequence */
    const char *stop_str;     /* h.n_stop_str NUL-terminated strings that end a sequence, one after another */
    const char *path;         /* the sampler weights file */
} serve_sample_file_req;
struct job;
bool serve_fwd_req_view(const struct job *j, serve_fwd_req *out);
bool serve_sample_req_view(const struct job *j, serve_sample_req *out);
bool serve_sample_file_req_view(const struct job *j, serve_sample_file_req *out);

struct future; /* a protocol's (tinker/): the core only passes it back */

/* One validated request.  payload is what every rank receives (job.c
 * documents each op's layout). */
typedef struct job {
    int op;
    unsigned char *payload;
    int64_t nbytes;
    /* The model it runs on (docs/server.md, "Models"): its slot and uid,
     * broadcast with the op; a job whose slot no longer holds that uid (the
     * model was unloaded, or its create failed) is refused on every rank. */
    int slot;
    int64_t uid;
    /* A Tinker request: its result goes to this future, nobody waits on the
     * job; tinker_path is the tinker:// name a save/load answers with. */
    struct future *fut;
    int64_t seq_id;
    char *tinker_path;
    char *sampling_session; /* save_weights_for_sampler without a name: the session it opens */
    double arrived;
    double queued_at; /* when it entered the FIFO (serve_now) */
    /* The outcome, filled by rank 0's main thread (serve_exec_fn): the
     * HTTP status; on a failure the field it names ("": none) and why (as
     * long as the plain API's error body keeps); on a success the op's
     * typed result, which the job's wire format encodes. */
    int status;
    char err_field[300];
    char err_msg[1200];
    serve_fwd_result *fwd;
    serve_sample_result *sample;
    serve_save_result *saved;
    bool has_optim; /* an optim_step: its result is optim */
    serve_optim_result optim;
    struct serve_info_result *info;
    /* The wire format's encoder of the outcome, which the queue runs on rank
     * 0's main thread right after the op (so that its time counts as the
     * request's, in GET /info and /healthz) into body; NULL: the protocol's
     * finish hook takes the typed outcome instead. */
    char *(*encode)(struct server *s, const struct job *j);
    char *body;
    bool done;
    /* Nobody waits for it (a protocol's own job, e.g. an expired
     * checkpoint's delete): the main thread frees it once run. */
    bool detached;
    /* A protocol's save: when the checkpoint expires, seconds since the
     * epoch (0: never; Tinker's ttl_seconds). */
    double expires;
    struct job *next;
} job;

typedef struct tinker_state tinker_state;

/* A protocol beside the plain API (the Tinker SDK's, tinker/), registered at
 * start-up (serve_register_tinker); the core calls it through this and never
 * by name.  Every hook but handle runs on rank 0's main thread with s->mu
 * held. */
typedef struct serve_protocol {
    const char *prefix; /* the URL prefix it owns ("/api/v1/"); GET PREFIX"healthz" is /healthz */
    /* A POST media type it takes besides application/json (NULL: none), and
     * what a 415 adds about it (" (or ... for ...)"). */
    const char *content_type, *content_type_hint;
    void *state;
    /* A connection thread: a request under prefix (sub: the rest of the URL). */
    enum MHD_Result (*handle)(struct server *s, struct MHD_Connection *c, const char *sub,
                              const char *method, const char *body, size_t len);
    /* A job of this protocol (j->fut set) finished (its outcome in j); frees j. */
    void (*finish)(struct server *s, struct job *j);
    /* Now and then: queues what became due; true if it queued anything. */
    bool (*tick)(struct server *s);
    /* The server is stopping: fail what is held. */
    void (*shutdown)(struct server *s);
    void (*destroy)(void *state); /* no lock; after the HTTP server stopped */
} serve_protocol;

/* A LoRA model's sampler weights (a PEFT adapter folder) as asample holds
 * them: path NULL when the entry is free. */
#define SERVE_AD_CACHE 8
/* The most asample jobs that decode as one batch (serve_exec_sample_batch). */
#define SERVE_SAMPLE_BATCH SERVE_AD_CACHE
typedef struct serve_adapter {
    char *path;
    struct timespec mtime; /* adapter_model.safetensors's when read */
    zdp_model lora;        /* zdp_lora_create over the base */
    float **ad;            /* (lora.n_params) the adapter tensors */
    int64_t used;          /* ad_clock at its last use */
} serve_adapter;

/* One trained model (docs/server.md, "Models").  --full-finetune: slot 0
 * alone, the base model itself (every weight trains).  Otherwise a LoRA
 * model over the shared read-only base weights, with its own engine
 * (adapters, Adam state, gradient window, counters, hyperparameters).
 * Every rank holds the same table: only all-rank jobs change it. */
typedef struct serve_slot {
    int64_t uid;      /* 0: free */
    zdp_model lora;   /* LoRA mode: zdp_lora_create's (the engine keeps its address) */
    zdp_model *model; /* what the engine trains: &lora, or &server.model */
    zdp_engine *eng;
    char name[160];   /* LoRA mode: its model_id (GET /info, logs) */
    zdp_lora_config lc;
} serve_slot;

typedef struct server {
    serve_opts opt;
    zdp_config cfg;
    zdp_model model; /* the base (--full-finetune: the one model that trains) */
    /* The model of the job running now (serve_exec sets them from the
     * job's slot; NULL when none). */
    zdp_model *cur;
    zdp_engine *eng;
    serve_slot *slots; /* (opt.max_models), every rank */
    float **base;      /* LoRA mode: the base weights (model.n_params tensors), read-only */
    zdp_channel *ch; /* every rank: a private duplicate of the world (src/comm) */
    int W, R;
    /* rank 0: the queue; mu also guards the Tinker state */
    pthread_mutex_t mu;
    pthread_cond_t cv_job, cv_done;
    job *head, *tail;
    bool closed;
    serve_protocol proto; /* the one protocol beside the plain API (prefix NULL: none) */
    tinker_state *tinker; /* proto.state, typed for tinker/ */
    /* rank 0, main thread only: per op, requests run, seconds waiting in the
     * FIFO and seconds executing (GET /info "requests"). */
    serve_op_stats stats[SERVE_N_OPS];
    /* every rank, main thread only: the sampler weights asample last read. */
    char *snap_path;
    /* every rank, main thread only: bytes of the KV cache of the last
     * sampling request and of the largest so far (GET /info's memory). */
    int64_t kv_bytes_last, kv_bytes_peak;
    /* every rank, main thread only: rows this rank ran through the model
     * while sampling, so far (GET /info's memory rows: where -np's work
     * goes): prompt rows prefilled, decode rows, prompt rows copied from a
     * same-prompt sequence instead. */
    int64_t rows_prefill, rows_decode, rows_shared;
    /* every rank, main thread only: the weights packed for batched decode
     * steps, shared by every sampling request (sampling.c), and the
     * generation that keys them: serve_exec bumps it before every request
     * that may write weights, serve_free_snapshot when the sampler weights
     * go, so a packed copy is never used after its weights changed. */
    zdp_kv_packs *packs;
    uint64_t wgen;
    /* every rank: realpath of --checkpoint-dir, made at start-up.  The path
     * of a save_state/load_state job is relative to it (each rank joins its
     * own, so ranks with their own working directories each use their own
     * folder); other jobs carry absolute paths. */
    char *ckpt_root;
    float **snap;
    struct timespec snap_mtime; /* the file's when it was read: a newer one is read again */
    /* every rank, LoRA mode: the PEFT adapter folders asample read last
     * (a LoRA model's sampler weights), each a LoRA model over the base
     * weights (s->base) and its adapter tensors; least recently used
     * replaced first, never one the running batch uses. */
    serve_adapter ad_cache[SERVE_AD_CACHE];
    int64_t ad_clock;
    /* every rank: the most bytes of whole-model copies serve_weights_get
     * held at once (stage 3; GET /info "gathered_whole_bytes"). */
    int64_t whole_peak_bytes;
    /* every rank, LoRA mode at stage 3: the base, partitioned once and
     * borrowed by every model's engine (zdp_engine_create_shared); s->base
     * then holds no tensors (NULL each).  base_now: the whole base gathered
     * for the sampling batch running (serve_base_get), else NULL. */
    zdp_frozen_store *store;
    float **base_now;
    bool have_model, started, watching;
    /* rank 0: the guards every request passes (http.c, guard_). */
    char *api_key; /* NULL: no --api-key-file */
    size_t api_key_len;
    char **roots_real; /* realpath of each --allow-path-root */
    int bound_port;
    int bind_kind; /* 0: a specific address, 1: loopback, 2: any (0.0.0.0 or ::) */
    unsigned char bind_addr[16];
    int bind_family;
    /* rank 0: what /healthz reads (under mu).  busy_op/busy_since: the
     * request running on the ranks (-1 none); ping_since: when the health
     * check still unanswered by rank ping_missing began (0 none). */
    int busy_op;
    double busy_since, ping_since;
    /* rank 0: the jobs running on the ranks now (under mu), which a
     * ZDP_ERR_FATAL answers with a 500 (serve_fail_jobs). */
    job *running[SERVE_SAMPLE_BATCH];
    int n_running;
    int ping_missing;
    /* rank 0: request body bytes held by all connections (under body_mu). */
    pthread_mutex_t body_mu;
    int64_t inflight;
    struct MHD_Daemon *daemon;
    /* rank 0: every open connection, for the request deadline (http.c's
     * watchdog_), under watch_mu. */
    pthread_mutex_t watch_mu;
    struct conn_watch *watch;
    bool watch_stop;
    pthread_t watch_thread;
    /* ranks > 0: a signal asked this rank to stop and rank 0 has been told. */
    bool stop_sent;
    int stop_sig;
    zdp_comm_req *stop_req;
} server;

/* A validation failure: HTTP status, the JSON path of the field, the message. */
typedef struct verr {
    int status;
    char field[256];
    char msg[1024];
} verr;

/* parse.c.  Sets e and returns false. */
bool serve_bad(verr *e, int status, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
bool serve_only_keys(const json_t *o, const char *where, const char *const *keys, int n, verr *e);
/* The same for one name, however it was decoded. */
bool serve_only_name(const char *name, const char *where, const char *const *keys, int n, verr *e);
char *serve_dump(json_t *o); /* takes the reference */
json_t *serve_jreal(double x);

/* results_json.c: the plain API's error body {"error": {"message", "field"}}
 * (field NULL: null); and a failed job's. */
char *serve_error_body(const char *field, const char *msg);
char *serve_job_error_json(const job *j);

/* util.c.  Replaces every byte that does not start a valid UTF-8 character
 * with '?' (a message cut at a fixed size may end inside one; jansson
 * refuses it). */
void serve_utf8_fix(char *s);
double serve_now(void); /* seconds, CLOCK_MONOTONIC */
/* mkdir -p; 0 or -1 with errno. */
int serve_mkdirs(const char *path);

/* job.c.  serve_job_clear frees what the job holds (payload, names, typed
 * results) and leaves the struct; serve_job_free frees it all (NULL: no-op). */
void serve_job_clear(job *j);
void serve_job_free(job *j);
/* Rank 0: the job failed with status; field (NULL: none) and msg name why. */
void serve_job_fail(job *j, int status, const char *field, const char *msg);

/* parse_fwd.c.  The checks of every forward/forward_backward (the loss and its options,
 * datums, tokens against the model's vocabulary V and block size T, tensors
 * against the loss's inputs) and the payload j gets.  where: the JSON path
 * of the input ("forward_backward_input"), which every message names; j->op
 * (OP_FWDBWD or OP_FORWARD) says whether loss_fn is required. */
bool serve_fwd_build(const serve_fwd_in *in, const char *where, int V, int T, job *j, verr *e);

/* Request parsers.  where: the JSON path prefix of obj ("" for a whole
 * body).  tinker_defaults: missing adam_params fields take Tinker's
 * AdamParams defaults instead of the engine's current values. */
/* JSON -> serve_fwd_in (its format's checks) -> serve_fwd_build. */
bool serve_parse_fwd(const json_t *obj, const char *where, const zdp_model *mc, job *j,
                     verr *e);
bool serve_parse_optim(const json_t *ap, const char *where, bool tinker_defaults, job *j, verr *e);
/* paths.c.  The payload of a path op (path NUL-terminated; save_state and
 * load_state's relative to the checkpoint folder, which each rank resolves
 * against its own). */
bool serve_set_path(const server *s, job *j, const char *path, verr *e);
/* Is p root itself or below it?  Both absolute, without "." or "..". */
bool serve_inside(const char *p, const char *root);
/* A path a client sent (field names it in errors) -> out, the absolute path
 * the engine may write or read: a relative name inside --checkpoint-dir, or an
 * absolute path inside a --allow-path-root folder; no "." or ".." component,
 * and no symbolic link that leads outside those folders.  The error never says
 * whether something outside exists. */
bool serve_resolve_path(const server *s, const char *field, const char *name, char *out, size_t cap,
                        verr *e);
/* http.c.  Case-insensitive: does the header value name the media type (as a whole
 * item of a comma-separated list, parameters allowed)? */
bool serve_names_type(const char *value, const char *type);

/* queue.c.  Appends j to the FIFO the main thread runs (s->mu held). */
void serve_enqueue_locked(server *s, job *j);
/* A connection thread: queues j and waits until it ran (requests run one at
 * a time, in queue order).  false when the server is shutting down: j is
 * freed and nothing ran. */
bool serve_run_job(server *s, job *j);
/* Takes j out of the FIFO before it runs (a cancelled request, s->mu held):
 * true when it was queued (the caller then owns it), false when it is not
 * (running, or never queued). */
bool serve_unqueue_locked(server *s, job *j);
/* Rank 0's main thread until a signal stops every rank, and the other
 * ranks' loop (what rank 0 broadcasts, until OP_QUIT). */
void serve_leader_loop(server *s);
void serve_worker_loop(server *s);
/* Rank 0: refuses every queued job and answers the running ones (status,
 * "why"), closes the queue and wakes the waiting connections. */
void serve_fail_jobs(server *s, int status, const char *why);

/* signals.c.  Point-to-point tags on the server's communicator
 * (collectives do not match them): a rank > 0 that got SIGTERM/SIGINT tells
 * rank 0, and every rank > 0 answers rank 0's health check. */
enum { SERVE_TAG_STOP = 1, SERVE_TAG_ACK = 2 };
/* The signal that asked this process to stop (0: none). */
extern volatile sig_atomic_t serve_stop_signal;
/* SIGINT/SIGTERM set serve_stop_signal; SIGPIPE is ignored. */
void serve_install_signals(void);
/* Every rank: waits for req (a nonblocking collective on s->ch) with a
 * growing sleep instead of MPI's spin, noticing a signal meanwhile. */
void serve_wait(server *s, zdp_comm_req *req);
/* Rank 0: has a rank > 0 asked to stop?  Then stop as if rank 0 got the
 * signal itself.  A failure is returned, not serve_die'd: the caller may
 * hold s->mu. */
zdp_status serve_poll_stop(server *s, zdp_error *err);

/* exec.c.  A failure after start-up on some ranks only: the ranks can no
 * longer agree, so the job must stop.  The library never exits: serve_die
 * sets serve_fatal_err ("what: message", ZDP_ERR_FATAL) and jumps back to
 * zdp_server_run (serve_fatal_jmp, set while it runs), which returns
 * ZDP_ERR_FATAL; the caller aborts the MPI job (no rank may be left waiting
 * in a collective).  Only the thread that runs zdp_server_run calls it, and
 * never while holding s->mu.  What the failed request allocated is not
 * freed: the process is about to end. */
void serve_die(const char *what, const zdp_error *err) __attribute__((noreturn));
extern jmp_buf *serve_fatal_jmp;
extern zdp_error serve_fatal_err;
/* Every rank: runs one request (serve_ops[j->op].exec); rank 0 gets the
 * outcome in j. */
void serve_exec(server *s, job *j);
/* The HTTP status of a zdp_status: 500 for the server's own failures (out
 * of memory, communication, internal), else 400. */
int serve_status_of(zdp_status st);
/* The ops of the other exec files (serve_ops names them).  exec_info.c:
 * GET /info's numbers into j->info (COLLECTIVE).  exec_ckpt.c: saves,
 * loads and a Tinker checkpoint's delete.  exec_sample.c: POST /sample and
 * asample. */
void serve_exec_info(server *s, job *j);
void serve_exec_save_weights(server *s, job *j);
void serve_exec_state(server *s, job *j);
void serve_exec_load_weights(server *s, job *j);
void serve_exec_delete(server *s, job *j);
/* copy_weights (tinker/copy.c): the payload is "SRC\0DST\0", paths
 * relative to the checkpoint folder; every rank copies its own part of
 * checkpoint SRC to DST (rank 0 first; files already at DST are kept). */
void serve_exec_copy(server *s, job *j);
void serve_exec_sample(server *s, job *j);
void serve_exec_sample_file(server *s, job *j);

/* weights.c.  Elements of a parameter. */
int64_t serve_numel(const zdp_param_info *p);
/* The base model's weights (--full-finetune: the engine's parameter views;
 * LoRA: the shared base), a malloc'd array; NULL when out of memory. */
float **serve_views(server *s);
/* --full-finetune's weights as whole tensors on every rank, at any stage:
 * serve_views at stages 0-2; at stage 3 a copy (one block, v[0] first),
 * gathered from the partitions when `gather` -- COLLECTIVE, every rank
 * calls it; its bytes count in GET /info's memory rows.  NULL (err set;
 * with `gather` on every rank alike) when out of memory.  serve_weights_push writes v back
 * (stage 3: each rank keeps its slice) and syncs the ranks; every rank
 * passes the same values.  serve_weights_free releases v. */
float **serve_weights_get(server *s, bool gather, zdp_error *err);
zdp_status serve_weights_push(server *s, float *const *v, zdp_error *err);
void serve_weights_free(server *s, float **v);
/* Frees slot k's LoRA model and engine (no-op for --full-finetune). */
void serve_slot_free(server *s, int k);
/* LoRA mode, every rank: the whole base for a sampling batch.  Stages 0-2:
 * s->base.  Stage 3: COLLECTIVE, gathered from s->store into one block
 * (counted in gathered_whole_bytes), NULL on every rank with *why set when
 * a rank is out of memory for it.  serve_base_free lets it go (and, at
 * stage 3, the weights packed from it). */
float **serve_base_get(server *s, char *why, size_t why_size);
void serve_base_free(server *s, float **v);
/* The tensors of the model being trained (s->cur, a LoRA model's
 * adapters): the engine's views at stages 0-2; at stage 3 whole copies
 * (gathered when `gather`: COLLECTIVE, every rank alike).  NULL with err
 * set when out of memory.  serve_adapters_push writes them back (every rank
 * the same values) and syncs; serve_adapters_free frees them. */
float **serve_adapters_get(server *s, bool gather, zdp_error *err);
zdp_status serve_adapters_push(server *s, float *const *v, zdp_error *err);
void serve_adapters_free(server *s, float **v);
/* Whether the server trains LoRA models (no --full-finetune). */
static inline bool serve_lora(const server *s) { return !s->opt.full_finetune; }
/* exec_sample.c.  Drops the sampler weights asample last read. */
void serve_free_snapshot(server *s);
/* String stops (docs/server.md, "Stop sequences"): -1 while the text of
 * the generated tokens gen[0..n) holds none of the n_str strings at strs;
 * once it does, how many tokens to return (the longest prefix whose text
 * holds none); -2: decode failed. */
int64_t serve_stop_cut(server *s, const int32_t *gen, int64_t n, const char *strs, int64_t n_str);
/* sampling.c: one sampling request, every rank (docs/sampling.md). */
typedef struct serve_sample_spec {
    job *j;
    const int32_t *prompt;
    int64_t n_prompt, num_samples, max_tokens, top_k, n_stop, n_stop_str;
    double temperature, top_p;
    uint64_t seed;          /* sequence k draws from seed + 0x9E3779B97F4A7C15 * k */
    const int32_t *stop;    /* (n_stop) */
    const char *stop_str;   /* n_stop_str NUL-terminated strings */
    bool logprobs;          /* the result carries each token's log p */
    bool prompt_logprobs;   /* and the prompt's (from the prefill, temperature 1) */
    int64_t topk_prompt;    /* and the k most likely tokens at each prompt position (0: none) */
    int64_t prompt_length;  /* serve_sample_result.prompt_length */
    const zdp_model *lora;  /* a LoRA model over the base, applied to every sequence; NULL: none */
    const float *const *adapter; /* its adapter tensors */
} serve_sample_spec;
/* Every rank generates its contiguous run of the num_samples sequences
 * from params (whole weights) and rank 0 gathers them into sp->j's outcome
 * (its serve_sample_result, or its failure).  why: this rank has no params
 * (the reason rank 0 reports), else NULL. */
void serve_sampler_run(server *s, const float *const *params, const serve_sample_spec *sp, const verr *why);
/* The same for n requests over the same params at once: their sequences,
 * laid end to end, are cut into one contiguous run per rank (whole requests
 * per rank where the cuts allow: a prompt prefilled on one rank), every
 * rank's decode together in one zdp_generate (LoRA models' requests with
 * different adapters share passes), then each request is
 * gathered and answered in order, into sps[k].j on rank 0.  whys[k] as why
 * above (NULL: none). */
void serve_sampler_run_many(server *s, const float *const *params, const serve_sample_spec *sps,
                            const verr *const *whys, int n);
/* Up to SERVE_SAMPLE_BATCH asample jobs that were next to each other in the
 * FIFO, every rank: those on one sampler weights file decode together (one
 * serve_sampler_run_many per file, the file read once), then those on LoRA
 * models' sampler weights together (over the base). */
void serve_exec_sample_batch(server *s, job **jobs, int n);
/* Frees the adapters asample holds. */
void serve_free_adapters(server *s);
/* parse.c.  POST /sample's body -> an OP_SAMPLE payload.  can_decode: the served
 * model has a tokenizer, so stop strings are taken. */
bool serve_parse_sample(const json_t *root, const zdp_model *mc, bool can_decode, int max_stop_bytes, job *j,
                        verr *e);
/* A stop field (Tinker's SamplingParams.stop: a string, strings or token ids
 * in [0, V)) -> token ids (int32) in ids, strings (each NUL-terminated) in
 * strs, *n_str of them.  Strings only when can_decode, each of at most
 * max_bytes (--max-stop-bytes; docs/server.md, "Stop sequences"). */
bool serve_parse_stops(const json_t *v, const char *field, int V, bool can_decode, int max_bytes,
                       serve_bytes *ids, serve_bytes *strs, int64_t *n_str, verr *e);
/* POST /save_weights, /save_state, /load_state's body {"path"} -> payload. */
bool serve_parse_path(const server *s, const json_t *root, job *j, verr *e);

/* http.c (rank 0). */
enum MHD_Result serve_reply(struct MHD_Connection *c, int status, char *body);
enum MHD_Result serve_reply_error(struct MHD_Connection *c, int status, const char *field, const char *fmt,
                                  ...) __attribute__((format(printf, 4, 5)));
/* GET /healthz (and /api/v1/healthz): 200 {"status": "ok"}, or 503 naming
 * the request or the rank that has not finished within
 * --health-timeout-seconds. */
enum MHD_Result serve_healthz(server *s, struct MHD_Connection *c);
/* Request body bytes held by all connections now. */
int64_t serve_body_inflight(server *s);
/* Starts libmicrohttpd and the header watchdog; false with why set. */
bool serve_http_start(server *s, char *why, size_t cap, int *port);
void serve_http_stop(server *s);

/* plain_api.c: a request outside every protocol's prefix (POST
 * /forward_backward, GET /info, ...). */
enum MHD_Result serve_plain_handle(server *s, struct MHD_Connection *c, const char *url, const char *method,
                                   const char *body, size_t len);
/* plain_info.c: GET /info's reply; NULL when out of memory. */
char *serve_info_json(server *s, const serve_info_result *r);

/* tinker/sessions.c: registers the Tinker SDK's protocol (/api/v1/) on s;
 * false with why set (out of memory, an unreadable session counter in
 * --checkpoint-dir). */
bool serve_register_tinker(server *s, char *why, size_t cap);

#endif /* ZDP_SERVE_IMPL_H */
