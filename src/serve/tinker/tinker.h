/*
 * tinker.h -- internal to src/serve/tinker/ (and the C tests in
 * tests/serve/): the Tinker SDK's wire protocol (docs/tinker-protocol.md) on
 * top of `zdp serve`: JSON for SDK 0.18-0.24, and for SDK 0.25 the protobuf
 * forward_backward (tinker/proto.h).  The core reaches it only through the
 * serve_protocol that serve_register_tinker fills in.  Everything runs on
 * rank 0 under s->mu, in the HTTP connection threads (and in the main
 * thread for tinker_finish_locked / tinker_tick_locked).
 *
 * Files: routes.c (the endpoints), submit.c (a request into a job, its
 * future and its place in the seq_id order), futures.c (futures, what a
 * finished job leaves on one, retrieve_future, retrieve_futures,
 * cancel_future and the replies), copy.c (copy_weights), sessions.c
 * (sessions, models, unloading, the tick, sampling sessions), runs.c (training runs and checkpoints on
 * disk), proto_decode.c and proto_encode.c (the protobuf codec).
 */
#ifndef ZDP_SERVE_TINKER_H
#define ZDP_SERVE_TINKER_H

#include "serve_impl.h"
#include "tinker/proto.h"

/* A session is alive while it sends heartbeats (every 10 s from the SDK):
 * three missed ones end it (--session-timeout-seconds, this by default). */
#define SESSION_TIMEOUT_S 30.0
/* A finished result is kept an hour, or a minute after it was first read
 * (long enough for a client whose answer got lost to poll again), and past
 * MAX_FUTURES the oldest read ones go first: memory stays bounded for a
 * client that reads its results. */
#define FUTURE_TTL_S 3600.0
#define FUTURE_READ_TTL_S 60.0
#define MAX_FUTURES 10000

typedef struct future {
    char id[32];
    char idem[160];      /* X-Idempotency-Key of the POST that made it, or "" */
    char model_id[160];  /* "" for requests without one */
    int64_t seq_id;      /* 0: none */
    bool done;
    bool proto;          /* the request came as protobuf (SDK 0.25) */
    bool sample;         /* an asample: its SampleResponse may go as protobuf */
    char *result;        /* the JSON retrieve_future answers with, once done ... */
    serve_fwd_result *fwd; /* ... or a ForwardBackwardOutput, typed until a poll encodes it */
    serve_sample_result *samp; /* ... or a SampleResponse, likewise */
    serve_save_result *saved;  /* ... or a save or load (name: its tinker:// path) */
    double done_at;
    double read_at;      /* first retrieve_future that got the result, 0 before */
    /* An asample of a sampling session: retrieve_futures reports it to the
     * poll of (sess, clone = its seq_id / 1e9) once done, numbered event
     * (0 until a poll first sees it done; the cursor counts these). */
    char sess[128];
    int64_t clone;
    int64_t event;
    bool cancelled;      /* cancel_future: whatever its job still produces is dropped */
    struct future *next; /* newest first */
} future;

/* A sampling session: the sampler weights file its asample requests read. */
typedef struct sampling_session {
    char id[128];
    char *path;
    int64_t n_clients;   /* join_sampling_session's last client_counter (the first client is 0) */
    struct sampling_session *next; /* newest first */
} sampling_session;
#define MAX_SAMPLERS 1000

typedef struct session {
    char id[32];
    double seen; /* last heartbeat or request */
    bool finished;        /* POST sessions/ID/finish came: its models were unloaded */
    char finish_why[16];  /* its reason: success, errored, interrupted or unspecified */
    struct session *next;
} session;

/* A model of create_model (docs/server.md, "Models"): the slot of the
 * server's table it trains in, and its own seq_id order. */
typedef struct tinker_model {
    bool live;        /* created (its create job queued) and not unloaded */
    int slot;
    int64_t uid;      /* the job header's: the slot holds this model while its uid matches */
    char model_id[160];
    char session[32]; /* the session that created it: its heartbeats keep it loaded */
    zdp_lora_config lc; /* rank 0: --full-finetune */
    int64_t next_seq; /* the next seq_id to queue */
    job *held;        /* arrived early, sorted by seq_id */
} tinker_model;

/* An unloaded model and why (a later request to it is told). */
#define MAX_GONE 256
typedef struct tinker_gone {
    char model_id[160];
    char why[400];
} tinker_gone;

struct tinker_state {
    int64_t n_requests, n_sessions;
    future *futures;
    int64_t n_futures;
    session *sessions;
    tinker_model *models; /* (n_models): the server's --max-models (1 with --full-finetune) */
    int n_models;
    int64_t n_uids;       /* uids handed out */
    tinker_gone gone[MAX_GONE]; /* a ring: the latest MAX_GONE unloaded models */
    int64_t n_gone;
    sampling_session *samplers;
    uint64_t n_samples; /* seeds for asample requests without one */
    int64_t n_events;   /* retrieve_futures' cursor: the last completion number handed out */
    double next_sweep;  /* when tinker_runs_sweep_locked looks again (epoch seconds) */
};

/* What a submitted request gets back: its future's id (and model_id, "" for
 * none). */
typedef struct tinker_ticket {
    char id[32];
    char model_id[160];
} tinker_ticket;

/* n_models: the models it may hold at once (at least 1). */
tinker_state *tinker_create(int n_models);
void tinker_destroy(tinker_state *t);
/* The handler for every path under /api/v1/ (sub: the rest of the path). */
enum MHD_Result tinker_handle(server *s, struct MHD_Connection *c, const char *sub,
                              const char *method, const char *body, size_t len);
/* Main thread, s->mu held: a Tinker job finished (its outcome in j) -> its
 * future's result; the job is freed here. */
void tinker_finish_locked(server *s, job *j);
/* Main thread, s->mu held: releases seq_ids held back longer than the gap
 * timeout; returns true if it queued anything. */
bool tinker_tick_locked(server *s);
/* s->mu held: fails every held request (shutdown). */
void tinker_shutdown_locked(server *s);
/* A training verb (forward_backward, forward, optim_step, save_weights,
 * save_weights_for_sampler, load_weights) with its JSON body, s->mu not
 * held: 200 and *out (a new future, or a retry's first one: same
 * idempotency key or same (model_id, seq_id)), the request held until its
 * seq_id is due; or the HTTP status of a refusal with e set (a bad envelope,
 * shutting down, out of memory).  A request refused by validation still gets
 * a future (failed) and uses up its seq_id. */
int tinker_submit(server *s, const char *verb, const json_t *root, const char *idem, bool proto,
                  tinker_ticket *out, verr *e);
/* A finished save or load as the SDK reads it: {"path": tinker://...,
 * "type", "sampling_session_id"?}.  NULL when out of memory. */
char *tinker_save_result_json(const serve_save_result *r);
/* The same for a protobuf forward_backward (SDK 0.25), decoded: its
 * envelope checked as the JSON one, its data by serve_fwd_build (forward:
 * a forward, as forward_input). */
int tinker_submit_proto(server *s, const serve_proto_fwdbwd *rq, bool forward, const char *idem,
                        tinker_ticket *out, verr *e);
/* s->mu held: drops finished futures past their time (FUTURE_TTL_S, or
 * FUTURE_READ_TTL_S after the first read) and, past MAX_FUTURES, finished
 * ones older than FUTURE_READ_TTL_S. */
void tinker_prune(tinker_state *t);
/* A direct error as the SDK reads it: {"error", "category", "field"}. */
enum MHD_Result tinker_reply_error(struct MHD_Connection *c, int status, const char *field, const char *fmt,
                                   ...) __attribute__((format(printf, 4, 5)));
/* A checkpoint name from a client: one path component of letters, digits,
 * '.', '_' or '-', not starting with '.'. */
bool tinker_good_name(const char *n);
/* Sampler weights NAME of run folder dir_name, relative to --checkpoint-dir:
 * "DIR/sampler_weights/NAME.safetensors" (a weights file, --full-finetune),
 * or "DIR/sampler_weights/NAME" (a LoRA model's PEFT adapter folder) when
 * that folder exists, or, for one not written yet, when this server trains
 * LoRA models.  False when it does not fit cap. */
bool tinker_sampler_rel(const server *s, const char *dir_name, const char *name, char *rel, size_t cap);

/* ---- tinker/futures.c: futures and the replies every endpoint shares ---- */

/* A JSON reply (takes o). */
enum MHD_Result tinker_reply_json(struct MHD_Connection *c, int status, json_t *o);
/* A failed future's result: {"error", "category"} (the SDK raises
 * RequestFailedError); the message's bytes are made UTF-8. */
char *tinker_failure(const char *category, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* s->mu held: a new pending future of the request (idem: its
 * X-Idempotency-Key or NULL; model_id "" for none; seq 0 for none); NULL
 * when out of memory.  Prunes old ones first. */
future *tinker_new_future(tinker_state *t, const char *idem, const char *model_id, int64_t seq);
/* s->mu held: f is done with result (JSON, taken; NULL: out of memory). */
void tinker_complete(future *f, char *result);
/* s->mu held: the future a retried POST already made (same idempotency key,
 * or the same (model_id, seq_id)); NULL when none. */
future *tinker_find_retry(tinker_state *t, const char *idem, const char *model_id, int64_t seq);
void tinker_ticket_of(const future *f, tinker_ticket *out);
/* {"request_id", "model_id"?}: a submitted request's answer. */
enum MHD_Result tinker_reply_future(struct MHD_Connection *c, const future *f);
enum MHD_Result tinker_reply_ticket(struct MHD_Connection *c, const tinker_ticket *tk);
/* POST retrieve_future (s->mu not held; a route of routes.c's POST table):
 * the result, or try_again after the long poll. */
enum MHD_Result tinker_retrieve(server *s, struct MHD_Connection *c, const char *sub, const json_t *root,
                                const char *idem);
/* POST retrieve_futures (s->mu not held): the finished and failed asample
 * requests of one sampling session (and clone) past prev_cursor, held until
 * there is one or the long poll ends. */
enum MHD_Result tinker_retrieve_many(server *s, struct MHD_Connection *c, const char *sub, const json_t *root,
                                     const char *idem);
/* POST cancel_future (s->mu not held): a queued asample is taken off the
 * queue, a running one's result dropped; its future fails. */
enum MHD_Result tinker_cancel(server *s, struct MHD_Connection *c, const char *sub, const json_t *root,
                              const char *idem);
/* s->mu held: retrieve_futures' answer without the wait: the done asample
 * futures of (sess, clone) numbered past prev ("completions"; each done
 * one gets its number the first time a poll sees it); *cursor the highest
 * number listed, else prev.  NULL when out of memory. */
json_t *tinker_completions_locked(tinker_state *t, const char *sess, int64_t clone, int64_t prev,
                                  int64_t *cursor);
/* s->mu held: cancel_future without HTTP: "cancelled" (it was queued and
 * never runs), "dropped" (it runs; its result will be dropped) or "done"
 * (already finished: nothing changes); NULL with e set for an unknown id
 * (404) or a future that is not an asample's (400). */
const char *tinker_cancel_locked(server *s, const char *request_id, verr *e);

/* tinker/copy.c.  POST copy_weights (s->mu not held): the checkpoint
 * source_path copied into run SESSION:train:MODEL_SEQ_ID, answered with
 * {"tinker_path"} once on disk. */
enum MHD_Result tinker_copy_weights(server *s, struct MHD_Connection *c, const char *sub, const json_t *root,
                                    const char *idem);

/* ---- tinker/sessions.c: sessions, models, unloading (s->mu held) ---- */

/* Forgets sessions silent for an hour (those of live models are kept). */
void tinker_prune_sessions(tinker_state *t);
session *tinker_find_session(tinker_state *t, const char *id);
/* A request to model m counts as its session's heartbeat. */
void tinker_touch_model_session(tinker_state *t, const tinker_model *m);
/* The live model named model_id; NULL when none. */
tinker_model *tinker_find_model(tinker_state *t, const char *model_id);
int tinker_live_models(const tinker_state *t);
/* Why model_id is not live (unloaded and why, or never existed): sets e
 * (400) naming it; false. */
bool tinker_not_live(const tinker_state *t, const char *model_id, verr *e);
/* submit.c.  Puts j in m's seq_id order and queues what became due. */
void tinker_hold(server *s, tinker_model *m, job *j);
/* Fails every held request of m with msg (shutdown, a replaced or unloaded model). */
void tinker_fail_held(server *s, tinker_model *m, const char *category, const char *msg);
/* The tick: when m's oldest held request has waited --seq-gap-seconds for a
 * smaller seq_id, gives up the missing ones and queues what became due;
 * true when something was queued. */
bool tinker_expire_gap(server *s, tinker_model *m, double now);
/* Unloads live LoRA model m: its slot is freed by an all-rank job behind
 * every request of it already queued; its held requests fail; a later
 * request is told why.  fut: unload_model's future (NULL: nobody waits).
 * false when out of memory (nothing changed). */
bool tinker_unload(server *s, tinker_model *m, future *fut, const char *why);
/* --session-timeout-seconds (SESSION_TIMEOUT_S when unset). */
double tinker_session_timeout(const server *s);
/* Whether session x still holds its models' slots at time now: known, not
 * finished, and heard from within --session-timeout-seconds. */
bool tinker_session_alive(const server *s, const session *x, double now);
/* LoRA, for a create_model that found no free slot: the live model whose
 * session ended (finished, or silent past --session-timeout-seconds) the
 * longest ago, to unload so that the new model takes its slot; NULL when
 * every live model's session is alive. */
tinker_model *tinker_evictable(server *s, double now);
/* The live models with their sessions, for a 400 ("s1:train:0 (session s1,
 * alive, last heard 2.0 s ago), ..."). */
void tinker_describe_models(server *s, double now, char *out, size_t cap);
/* POST sessions/ID/finish: session id ends (reason as the client said it);
 * its models are unloaded at once (LoRA: through tinker_unload, behind their
 * queued requests; --full-finetune: detached), their checkpoints stay.  A
 * second finish changes nothing.  The model_ids unloaded go to *unloaded (a
 * JSON array, new).  false (e set, 404) for an unknown session, or when out
 * of memory (500). */
bool tinker_finish_session(server *s, const char *id, const char *reason, json_t **unloaded, verr *e);
/* Registers (or re-points) sampling session id -> weights file; false when out of memory. */
bool tinker_add_sampler(tinker_state *t, const char *id, const char *path);
const sampling_session *tinker_find_sampler(const tinker_state *t, const char *id);
/* model_id "s1:train:0" -> its run folder's name "s1_train_0" (letters,
 * digits and '-' survive, so no model_id can name ".."). */
void tinker_model_dir(const char *model_id, char *out, size_t cap);

/* ---- tinker/submit.c: a request into a job ---- */

/* model_id (a string) and seq_id (an integer >= 1, when need_seq) of a
 * training verb's JSON body; false with e set. */
bool tinker_envelope(const json_t *root, const char **model_id, int64_t *seq, bool need_seq, verr *e);
/* lora_config (Tinker's LoraConfig, and zdp's alpha) -> *lc; rank 0 (or no
 * lora_config): a full fine-tune.  false with e set. */
bool tinker_parse_lora(const json_t *lora, zdp_lora_config *lc, bool *seeded, verr *e);
/* optimizer_config of create_model and load_weights (SDK 0.3x:
 * {"type": "adamw"} always; {"type": "dimuon", "version": 1} refused by
 * name): true when absent, null or AdamW; false with e set. */
bool tinker_parse_optimizer_config(const json_t *oc, verr *e);
/* The weights file behind a tinker:// path (field names it in errors):
 * .../sampler_weights/NAME a sampler file or adapter folder,
 * .../weights/NAME a checkpoint's model.safetensors. */
bool tinker_weights_file(const server *s, const char *tinker_path, char *out, size_t cap, verr *e,
                         const char *field);
/* base_model: the weights the server started from (--init). */
bool tinker_base_file(const server *s, const json_t *base, char *out, size_t cap, verr *e);
/* asample's body -> an OP_SAMPLE_FILE job (file: the weights to read). */
bool tinker_sample_job(server *s, const json_t *root, const char *file, job *j, verr *e);

/* tinker/runs.c: training runs and checkpoints in --checkpoint-dir.
 * Start-up: the last session number handed out by an earlier server on this
 * folder (none: 0); false with why set when the file is unreadable. */
bool tinker_runs_restore(server *s, char *why, size_t cap);
/* s->mu held: the next session number, written to the folder first (so no
 * restart hands it out again); false with why set when it cannot be written. */
bool tinker_runs_next_session(server *s, int64_t *n, char *why, size_t cap);
/* s->mu held: CKPT/dir_name/run.json for a new model (kept if there). */
bool tinker_runs_record(server *s, const char *model_id, const char *dir_name, const zdp_lora_config *lc,
                        char *why, size_t cap);
/* The run.json of the run a tinker:// checkpoint path belongs to; NULL when
 * none (s->mu not needed: it reads the folder). */
json_t *tinker_runs_record_of(const server *s, const char *tinker_path);
/* Main thread, s->mu held, as a save finishes: the checkpoint at
 * tinker_path ("tinker://ID/weights/NAME" or ".../sampler_weights/NAME")
 * expires at `expires` (seconds since the epoch; 0: never, which also
 * clears an earlier save's time under that name).  Kept in the run folder's
 * expires.json; a failure to write it is printed (the checkpoint then stays). */
void tinker_runs_set_expiry(server *s, const char *tinker_path, double expires);
/* Main thread, s->mu held, now and then: queues the delete of every
 * checkpoint past its time (at most once a second); true if it queued one. */
bool tinker_runs_sweep_locked(server *s);
/* GET training_runs, training_runs/ID, training_runs/ID/checkpoints, checkpoints. */
enum MHD_Result tinker_runs_get(server *s, struct MHD_Connection *c, const char *sub);
/* PUT training_runs/ID/checkpoints/(weights|sampler_weights)/NAME/ttl (s->mu not held). */
enum MHD_Result tinker_runs_set_ttl(server *s, struct MHD_Connection *c, const char *sub, const char *body,
                                    size_t len);
/* DELETE training_runs/ID/checkpoints/(weights|sampler_weights)/NAME (s->mu not held). */
enum MHD_Result tinker_runs_delete(server *s, struct MHD_Connection *c, const char *sub);

#endif /* ZDP_SERVE_TINKER_H */
