/*
 * serve.h -- internal to `zdp serve`: what serve.c (the server, the plain
 * JSON endpoints, execution on every rank) shares with serve_tinker.c (the
 * Tinker SDK's /api/v1 protocol: sessions, futures, seq_id ordering).
 */
#ifndef ZDP_SERVE_H
#define ZDP_SERVE_H

#include <jansson.h>
#include <microhttpd.h>
#include <mpi.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "zdp/zdp.h"
#include "../../src/models/policy_loss.h"

typedef struct serve_opts {
    zdp_gpt_config model;
    const char *config, *init, *bind;
    const char *model_name;     /* the base_model name Tinker clients ask for */
    const char *checkpoint_dir; /* where Tinker's save_weights writes */
    int port;
    int64_t max_body;
    uint64_t seed;
    double long_poll_s;   /* retrieve_future holds a pending future this long */
    double seq_gap_s;     /* a missing seq_id is given up after this long */
    /* Safety (docs/server.md, "Threat model"). */
    const char *api_key_file;       /* --api-key-file: every request carries its key */
    const char **allow_roots;       /* --allow-path-root: folders absolute paths may name */
    int n_allow_roots;
    const char **allow_hosts;       /* --allow-host: more Host names to accept */
    int n_allow_hosts;
    /* Resource limits (docs/server.md, "Limits"). */
    int max_connections;        /* open connections in all */
    int max_connections_per_ip; /* open connections from one client address */
    int idle_timeout_s;         /* a connection silent this long is closed */
    double request_timeout_s;   /* a request's body must arrive within this */
    int64_t max_inflight;       /* request body bytes held at once, all connections */
    double health_timeout_s;    /* /healthz: a request or rank check older is unhealthy */
} serve_opts;

/* The largest seq_id a client may send: 2^53 - 1, JSON's exact integers, so
 * seq_id + 1 can neither overflow nor round. */
#define SERVE_MAX_SEQ_ID ((int64_t)9007199254740991)

enum {
    OP_QUIT = 0,
    OP_FWDBWD = 1,
    OP_FORWARD = 2,
    OP_OPTIM = 3,
    OP_SAVE_WEIGHTS = 4,
    OP_SAVE_STATE = 5,
    OP_LOAD_STATE = 6,
    OP_INFO = 7,
    OP_SAMPLE = 8,
    OP_LOAD_WEIGHTS = 9, /* weights only, fresh optimizer state (Tinker load_weights) */
    OP_NOOP = 10,        /* a Tinker request refused before the engine: only its seq_id counts */
    OP_SAMPLE_FILE = 11, /* Tinker asample: rank 0 samples from saved sampler weights */
    OP_PING = 12,        /* the health check: every rank answers rank 0 (serve.c) */
};

/* The head of an OP_SAMPLE_FILE payload; then int32 prompt[n_prompt],
 * int32 stop[n_stop], and the weights file's path, NUL-terminated. */
typedef struct sample_file_header {
    int64_t n_prompt, max_tokens, top_k, num_samples, n_stop;
    uint64_t seed;
    double temperature, top_p;
} sample_file_header;

/* Optimizer hyperparameters of an optim_step, in zdp_hparams' order. */
#define N_ADAM 6
/* The largest learning_rate and weight_decay adam_params may set. */
#define SERVE_MAX_LR 10.0
#define SERVE_MAX_WEIGHT_DECAY 10.0
extern const char *const serve_adam_keys[N_ADAM];

/* Losses (docs/tinker-protocol.md §2): zdp_loss_kind, ZDP_LOSS_CROSS_ENTROPY .. ZDP_LOSS_DRO. */
#define N_LOSSES 5

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

struct future;

/* One validated request.  payload is what every rank receives (serve.c
 * documents each op's layout). */
typedef struct job {
    int op;
    unsigned char *payload;
    int64_t nbytes;
    /* A Tinker request: its result goes to this future, nobody waits on the
     * job; tinker_path is the tinker:// name a save/load answers with. */
    struct future *fut;
    int64_t seq_id;
    char *tinker_path;
    char *sampling_session; /* save_weights_for_sampler without a name: the session it opens */
    double arrived;
    double queued_at; /* when it entered the FIFO (serve_now) */
    /* The answer, filled by the main thread (plain endpoints). */
    int status;
    char *body;
    bool done;
    struct job *next;
} job;

typedef struct tinker_state tinker_state;

typedef struct server {
    serve_opts opt;
    zdp_config cfg;
    zdp_model model;
    zdp_engine *eng;
    MPI_Comm comm;
    int W, R;
    /* rank 0: the queue; mu also guards the Tinker state */
    pthread_mutex_t mu;
    pthread_cond_t cv_job, cv_done;
    job *head, *tail;
    bool closed;
    tinker_state *tinker;
    /* rank 0, main thread only: per op, requests run, seconds waiting in the
     * FIFO and seconds executing (GET /info "requests"). */
    struct {
        int64_t count;
        double queue_s, exec_s, exec_max_s;
    } stats[OP_SAMPLE_FILE + 1];
    /* rank 0, main thread only: the sampler weights asample last read. */
    char *snap_path;
    /* every rank: realpath of --checkpoint-dir, made at start-up.  The path
     * of a save_state/load_state job is relative to it (each rank joins its
     * own, so ranks with their own working directories each use their own
     * folder); other jobs carry absolute paths. */
    char *ckpt_root;
    float **snap;
    /* rank 0: the guards every request passes (serve.c, check_request_). */
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
    int ping_missing;
    /* rank 0: request body bytes held by all connections (under body_mu). */
    pthread_mutex_t body_mu;
    int64_t inflight;
    struct MHD_Daemon *daemon;
    /* rank 0: every open connection, for the request deadline (serve.c's
     * watchdog_), under watch_mu. */
    pthread_mutex_t watch_mu;
    struct conn_watch *watch;
    bool watch_stop;
    pthread_t watch_thread;
    /* ranks > 0: a signal asked this rank to stop and rank 0 has been told. */
    bool stop_sent;
    int stop_sig;
    MPI_Request stop_req;
} server;

/* A validation failure: HTTP status, the JSON path of the field, the message. */
typedef struct verr {
    int status;
    char field[256];
    char msg[1024];
} verr;

bool serve_bad(verr *e, int status, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
const char *serve_jtype(const json_t *v);
bool serve_only_keys(const json_t *o, const char *where, const char *const *keys, int n, verr *e);
char *serve_dump(json_t *o); /* takes the reference */
json_t *serve_jreal(double x);
/* A growable byte buffer (request payloads); serve_put appends, false when
 * out of memory.  Start from {0}, free(p) when done. */
typedef struct serve_bytes {
    unsigned char *p;
    size_t len, cap;
} serve_bytes;
bool serve_put(serve_bytes *b, const void *src, size_t n);

char *serve_error_body(const char *field, const char *msg);
/* Replaces every byte that does not start a valid UTF-8 character with '?'
 * (a message cut at a fixed size may end inside one; jansson refuses it). */
void serve_utf8_fix(char *s);
void serve_job_free(job *j);
double serve_now(void);

/* Request parsers.  where: the JSON path prefix of obj ("" for a whole
 * body).  tinker_defaults: missing adam_params fields take Tinker's
 * AdamParams defaults instead of the engine's current values. */
bool serve_parse_fwd(const json_t *obj, const char *where, const zdp_gpt_config *mc, job *j,
                     verr *e);
bool serve_parse_optim(const json_t *ap, const char *where, bool tinker_defaults, job *j, verr *e);
bool serve_set_path(const server *s, job *j, const char *path, verr *e);
/* A path a client sent (field names it in errors) -> out, the absolute path
 * the engine may write or read: a relative name inside --checkpoint-dir, or an
 * absolute path inside a --allow-path-root folder; no "." or ".." component,
 * and no symbolic link that leads outside those folders.  The error never says
 * whether something outside exists. */
bool serve_resolve_path(const server *s, const char *field, const char *name, char *out, size_t cap,
                        verr *e);
/* mkdir -p; 0 or -1 with errno. */
int serve_mkdirs(const char *path);
/* Case-insensitive: does the header value name the media type (as a whole
 * item of a comma-separated list, parameters allowed)? */
bool serve_names_type(const char *value, const char *type);

/* Appends j to the FIFO the main thread runs (s->mu held). */
void serve_enqueue_locked(server *s, job *j);

/* serve_tinker.c */
tinker_state *tinker_create(void);
void tinker_destroy(tinker_state *t);
/* The handler for every path under /api/v1/ (sub: the rest of the path). */
enum MHD_Result tinker_handle(server *s, struct MHD_Connection *c, const char *sub,
                              const char *method, const char *body, size_t len);
/* Main thread, s->mu held: a Tinker job finished with (status, body); the
 * job is freed here. */
void tinker_finish_locked(server *s, job *j, int status, char *body);
/* Main thread, s->mu held: releases seq_ids held back longer than the gap
 * timeout; returns true if it queued anything. */
bool tinker_tick_locked(server *s);
/* s->mu held: fails every held request (shutdown). */
void tinker_shutdown_locked(server *s);

enum MHD_Result serve_reply(struct MHD_Connection *c, int status, char *body);
/* GET /healthz (and /api/v1/healthz): 200 {"status": "ok"}, or 503 naming
 * the request or the rank that has not finished within
 * --health-timeout-seconds. */
enum MHD_Result serve_healthz(server *s, struct MHD_Connection *c);

#endif /* ZDP_SERVE_H */
