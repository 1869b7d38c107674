/*
 * serve.h -- the training server as a library module (src/serve/, the static
 * library zdp_serve, which alone links libmicrohttpd): what `zdp serve`
 * (tools/zdp/serve.c, option parsing) calls.  docs/server.md is the manual,
 * docs/architecture.md the map of the module's files.
 *
 * Life cycle, on every rank (each step is COLLECTIVE only where it says so):
 *
 *   zdp_server_create(&opt, &srv, &err)   config, model, engine, weights: this rank only
 *   (the caller agrees across ranks; a failure on one rank stops all)
 *   zdp_server_start(srv, &err)           COLLECTIVE: weights synced; rank 0 listens
 *   (the caller agrees again)
 *   zdp_server_run(srv, &err)             COLLECTIVE: serves until SIGINT/SIGTERM
 *   zdp_server_destroy(srv)
 *
 * Errors come back as a status and a message naming the flag ("--init W:
 * ..."); the module never exits.  When a collective step fails on some ranks
 * only, start or run returns ZDP_ERR_FATAL: the ranks can no longer agree,
 * and the caller must end the MPI job (zdp_dist_abort) before anything else
 * -- no rank may be left waiting in a collective.
 */
#ifndef ZDP_SERVE_SERVE_H
#define ZDP_SERVE_SERVE_H

#include <stdbool.h>
#include <stdint.h>

#include "zdp/hf.h"
#include "zdp/model.h"

/* The causal LM a server trains, from the caller (the tool: a GPT from its
 * shape flags, or a Hugging Face folder's model), so that the server drives
 * it through zdp_model alone (zdp_generate, vocab_size, block_size).
 * Every rank calls create once and init once (into the engine's views);
 * rank 0 calls save for the weights files clients name; every rank calls
 * load (asample's sampler weights) and decode (string stop sequences), since
 * every rank samples (docs/sampling.md).  Messages name the flag or file. */
typedef struct zdp_serve_model {
    void *ctx;                /* the callbacks' own state */
    const char *arch;         /* "gpt2", "llama", "qwen3": /info's model.arch, get_info's model_data.arch */
    const char *summary;      /* the listening line's model part, e.g. "gpt L=4 H=4 C=128 V=256 T=64" */
    const char *tokenizer_id; /* get_info's tokenizer_id; NULL: none (the client brings its own) */
    const char *base_weights; /* what Tinker's base_model sampling reads (load's path); NULL: none */
    zdp_status (*create)(void *ctx, zdp_model *out, zdp_error *err);
    void (*destroy)(void *ctx, zdp_model *model);
    /* The starting weights: a file, a folder's, or a seeded initialisation. */
    zdp_status (*init)(void *ctx, const zdp_model *model, float *const *dst, zdp_error *err);
    /* Optional (NULL: none): the starting weights a slice at a time, for ZeRO
     * stage 3, where no rank may hold the whole model: reader_open makes a
     * reader over them, read_slice (a zdp_tensor_read_fn) reads elements
     * [lo, hi) of tensor i through it, reader_close frees it.  A model folder
     * has one (zdp_hf_reader); without it start-up at stage 3 fills whole
     * copies through init. */
    zdp_status (*reader_open)(void *ctx, const zdp_model *model, void **reader, zdp_error *err);
    zdp_tensor_read_fn read_slice;
    void (*reader_close)(void *reader);
    /* The weights at path (a file save wrote, a checkpoint's model.safetensors,
     * base_weights) into dst, one buffer per model->params entry. */
    zdp_status (*load)(void *ctx, const char *path, const zdp_model *model, float *const *dst,
                       zdp_error *err);
    zdp_status (*save)(void *ctx, const char *path, const zdp_model *model, const float *const *src,
                       zdp_error *err);
    /* The text of ids[0..n) (malloc'd, NUL-terminated, *len bytes without
     * the NUL); NULL on failure.  A NULL decode: no tokenizer, so string stop
     * sequences are refused. */
    char *(*decode)(void *ctx, const int32_t *ids, int64_t n, size_t *len);
} zdp_serve_model;

typedef struct serve_opts {
    zdp_serve_model lm;
    const char *config, *bind;
    const char *model_name;     /* the base_model name Tinker clients ask for */
    const char *checkpoint_dir; /* where Tinker's save_weights writes */
    int port;
    int64_t max_body;
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
    /* Sampling bounds (docs/sampling.md, "Bounds"): num_samples of one
     * request (the batch a rank's KV cache is sized for), bytes of one stop
     * string. */
    int max_sample_batch;
    int max_stop_bytes;
    /* Models (docs/server.md, "Models"). */
    bool full_finetune;         /* --full-finetune: one model, every weight trains; else LoRA */
    int max_models;             /* --max-models: LoRA models held at once (1 with --full-finetune) */
    double model_idle_timeout_s; /* --model-idle-timeout-seconds: a LoRA model whose session
                                    sent no heartbeat this long is unloaded */
    double session_timeout_s;   /* --session-timeout-seconds: a session silent this long has ended;
                                   its models give up their slots to a create_model (0: 30) */
} serve_opts;

typedef struct server zdp_server;

/* This rank's part of start-up: loads --config, makes --checkpoint-dir, builds
 * the model (opt->lm.create) and the engine, and sets the starting weights
 * (opt->lm.init).
 * *out is set even on failure (zdp_server_destroy it).  The opts (and the
 * strings and lists they point to) must outlive the server. */
zdp_status zdp_server_create(const serve_opts *opt, zdp_server **out, zdp_error *err);
/* COLLECTIVE.  Gives every rank the same weights, installs the SIGINT/SIGTERM
 * handlers; on rank 0 reads --api-key-file and --allow-path-root and starts
 * the HTTP server (a failure there is rank 0's alone).  ZDP_ERR_FATAL: a
 * collective step failed (end the job). */
zdp_status zdp_server_start(zdp_server *s, zdp_error *err);
/* COLLECTIVE.  Rank 0 prints the listening line and answers requests; the
 * other ranks execute what rank 0 broadcasts.  Returns ZDP_OK when a signal
 * stopped every rank; ZDP_ERR_FATAL (err: "what: why") when the ranks can no
 * longer agree (a collective step failed on some ranks only, e.g. out of
 * memory mid-request): rank 0 has answered every request with a 500 and
 * closed HTTP; the caller must end the MPI job (zdp_dist_abort) and may not
 * run the server again. */
zdp_status zdp_server_run(zdp_server *s, zdp_error *err);
/* Stops what zdp_server_start started and frees everything.  NULL is a no-op. */
void zdp_server_destroy(zdp_server *s);

#endif /* ZDP_SERVE_SERVE_H */
