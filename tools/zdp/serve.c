/*
 * serve.c -- `zdp serve`: the command.  It parses the options and runs the
 * training server, which lives in src/serve/ (its own library, zdp_serve;
 * src/serve/serve.h).  docs/server.md is the manual.
 *
 *   mpirun -np W zdp serve --config CFG.json --model gpt [--n-layer L ...]
 *       [--init W.safetensors] [--port P] [--bind ADDR] [--max-body BYTES] [limits]
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "lm_dir.h"
#include "sample_cli.h"
#include "serve/serve.h"
#include "zdp/zdp.h"

/* ---- the served model: a GPT from the shape flags ------------------------------ */

typedef struct gpt_src {
    zdp_gpt_config cfg;
    const char *init; /* --init, or NULL: --seed */
    uint64_t seed;
    char summary[128];
} gpt_src;

static zdp_status gpt_create_(void *ctx, zdp_model *out, zdp_error *err) {
    return zdp_gpt_create(&((gpt_src *)ctx)->cfg, 1, out, err);
}

static void gpt_destroy_(void *ctx, zdp_model *model) {
    (void)ctx;
    zdp_gpt_destroy(model);
}

static zdp_status gpt_load_(void *ctx, const char *path, const zdp_model *model, float *const *dst,
                            zdp_error *err) {
    return zdp_gpt_weights_load(path, &((gpt_src *)ctx)->cfg, model->params, model->n_params, dst, err);
}

static zdp_status gpt_init_(void *ctx, const zdp_model *model, float *const *dst, zdp_error *err) {
    const gpt_src *g = ctx;
    if (g->init == NULL) {
        zdp_gpt_init_params(model, dst, g->seed);
        return ZDP_OK;
    }
    zdp_status st = gpt_load_(ctx, g->init, model, dst, err);
    if (st != ZDP_OK) {
        /* "--init " in front of the loader's message (which names the file). */
        static const char flag[] = "--init ";
        size_t n = strnlen(err->msg, sizeof err->msg - sizeof flag);
        memmove(err->msg + sizeof flag - 1, err->msg, n);
        memcpy(err->msg, flag, sizeof flag - 1);
        err->msg[n + sizeof flag - 1] = '\0';
    }
    return st;
}

static zdp_status gpt_save_(void *ctx, const char *path, const zdp_model *model, const float *const *src,
                            zdp_error *err) {
    (void)ctx;
    return zdp_gpt_weights_save(path, model->params, model->n_params, src, err);
}

/* A byte-level GPT (vocab 256, as zdp sample reads prompts): id = byte. */
static char *bytes_decode_(void *ctx, const int32_t *ids, int64_t n, size_t *len) {
    (void)ctx;
    char *t = malloc((size_t)n + 1);
    if (t == NULL) return NULL;
    for (int64_t i = 0; i < n; i++) t[i] = (char)(unsigned char)ids[i];
    t[n] = '\0';
    *len = (size_t)n;
    return t;
}

static zdp_serve_model gpt_model_(gpt_src *g) {
    const zdp_gpt_config *c = &g->cfg;
    snprintf(g->summary, sizeof g->summary, "gpt L=%d H=%d C=%d V=%d T=%d", c->n_layer, c->n_head, c->n_embd,
             c->vocab_size, c->block_size);
    /* GPT-2's tokenizer only fits GPT-2's vocabulary; otherwise the client
     * brings its own (get_tokenizer would load the wrong one). */
    return (zdp_serve_model){.ctx = g, .arch = "gpt2", .summary = g->summary,
                             .tokenizer_id = c->vocab_size == 50257 ? "gpt2" : NULL,
                             .base_weights = g->init, .create = gpt_create_, .destroy = gpt_destroy_,
                             .init = gpt_init_, .load = gpt_load_, .save = gpt_save_,
                             .decode = c->vocab_size == 256 ? bytes_decode_ : NULL};
}

/* ---- the served model: a Hugging Face folder (--model-dir) ----------------------- */

static zdp_status dir_create_(void *ctx, zdp_model *out, zdp_error *err) {
    return lm_dir_create(ctx, 1, out, err);
}

static void dir_destroy_(void *ctx, zdp_model *model) {
    (void)ctx;
    zdp_model_destroy(model);
}

static zdp_status dir_init_(void *ctx, const zdp_model *model, float *const *dst, zdp_error *err) {
    const lm_dir *d = ctx;
    return zdp_hf_weights_load(d->dir, model, dst, err);
}

static zdp_status dir_reader_open_(void *ctx, const zdp_model *model, void **reader, zdp_error *err) {
    const lm_dir *d = ctx;
    zdp_hf_reader *r = NULL;
    zdp_status st = zdp_hf_reader_open(d->dir, model, &r, err);
    *reader = r;
    return st;
}

static void dir_reader_close_(void *reader) { zdp_hf_reader_close(reader); }

static zdp_status dir_load_(void *ctx, const char *path, const zdp_model *model, float *const *dst,
                            zdp_error *err) {
    return lm_dir_load(ctx, path, model, dst, err);
}

static zdp_status dir_save_(void *ctx, const char *path, const zdp_model *model, const float *const *src,
                            zdp_error *err) {
    return lm_dir_save(ctx, path, model, src, err);
}

static char *dir_decode_(void *ctx, const int32_t *ids, int64_t n, size_t *len) {
    const lm_dir *d = ctx;
    char *text = NULL;
    zdp_error err;
    return zdp_tokenizer_decode(d->tok, ids, (size_t)n, &text, len, &err) == ZDP_OK ? text : NULL;
}

/* tokenizer_id: the folder's absolute path, which AutoTokenizer.from_pretrained
 * loads when the folder holds the tokenizer; base_model sampling reads the
 * folder's weights. */
static zdp_serve_model dir_model_(lm_dir *d) {
    return (zdp_serve_model){.ctx = d, .arch = d->arch, .summary = d->summary,
                             .tokenizer_id = d->tok != NULL ? d->real : NULL, .base_weights = d->real,
                             .create = dir_create_, .destroy = dir_destroy_, .init = dir_init_,
                             .reader_open = dir_reader_open_, .read_slice = zdp_hf_reader_read,
                             .reader_close = dir_reader_close_,
                             .load = dir_load_, .save = dir_save_, .decode = d->tok != NULL ? dir_decode_ : NULL};
}

/* ---- options ------------------------------------------------------------------ */

static void usage_(void) {
    printf("usage: mpirun -np W zdp serve --config CFG.json --model gpt [options]\n"
           "       mpirun -np W zdp serve --config CFG.json --model-dir DIR [--block-size T] [options]\n"
           "\n"
           "A training server: rank 0 answers HTTP (JSON, Tinker's data shapes), every rank\n"
           "trains.  Endpoints: POST /forward_backward /forward /optim_step /save_weights\n"
           "/save_state /load_state /sample, GET /info /healthz, and the Tinker SDK's\n"
           "/api/v1/... (docs/server.md).\n"
           "\n"
           "  --config CFG.json          ds_config with \"managed_gradient_accumulation\": false\n"
           "  --model-dir DIR            a Hugging Face folder (Llama 3, Qwen3, SmolLM2, GPT-2): its\n"
           "                             config, weights and tokenizer (string stops, get_info's\n"
           "                             tokenizer_id = the folder); --block-size T (default\n"
           "                             min(max_position_embeddings, 1024)); --model-name default:\n"
           "                             the folder's name\n"
           "  --model gpt                a GPT-2 from the shape flags:\n"
           "  --n-layer L (4)  --n-head H (4)  --n-embd C (128)  --vocab-size V (256)\n"
           "  --block-size T (64)\n"
           "  --init FILE                GPT2LMHeadModel safetensors or llm.c .bin weights\n"
           "                             (default: GPT-2's seeded initialisation, --seed)\n"
           "  --seed N (42)\n"
           "  --port P (8000)            0: any free port (the listening line says which)\n"
           "  --bind ADDR (127.0.0.1)    the address to listen on (IPv4 or IPv6)\n"
           "  --max-body BYTES (16777216) larger request bodies get 413\n"
           "\n"
           "The Tinker SDK's protocol (/api/v1/..., SDK 0.18-0.25, JSON and protobuf):\n"
           "  --model-name NAME (zdp-gpt; with --model-dir, the folder's name)\n"
           "                             the base_model clients create_model with\n"
           "  --checkpoint-dir DIR (zdp-serve-checkpoints)  every path a client sends is a\n"
           "                             name inside DIR (plain and Tinker endpoints)\n"
           "  --long-poll-seconds S (30)   retrieve_future holds a pending request this long\n"
           "  --seq-gap-seconds S (30)     a missing seq_id is given up after this long\n"
           "\n"
           "Models (docs/server.md, \"Models\"):\n"
           "  (default)                  LoRA: each create_model is a new model of adapters over\n"
           "                             the one read-only base (lora_config.rank >= 1)\n"
           "  --max-models K (4)         LoRA models held at once; another create_model is a 400\n"
           "  --model-idle-timeout-seconds S (120)  a LoRA model whose session sent no\n"
           "                             heartbeat or request for S is unloaded (checkpoints stay)\n"
           "  --session-timeout-seconds S (30)  a session silent for S (3 of the SDK's 10 s\n"
           "                             heartbeats) has ended: a create_model that finds no free\n"
           "                             slot unloads one of its models (checkpoints stay)\n"
           "  --full-finetune            one model, every weight trains (rank 0 / no lora_config;\n"
           "                             the plain JSON API needs it)\n"
           "\n"
           "Safety (docs/server.md, \"Threat model\"):\n"
           "  --api-key-file F           every request but GET /healthz must carry the key in F\n"
           "                             (X-API-Key: KEY or Authorization: Bearer KEY)\n"
           "  --allow-path-root DIR      absolute paths inside DIR are allowed too (repeatable);\n"
           "                             otherwise a path is a name inside --checkpoint-dir\n"
           "  --allow-host NAME          accept Host/Origin NAME as well (repeatable; a proxy's name)\n"
           "\n"
           "Limits (docs/server.md, \"Limits\"):\n"
           "  --max-connections N (512)          open connections in all\n"
           "  --max-connections-per-ip N (64, at most --max-connections)  open connections\n"
           "                                     from one client address\n"
           "  --idle-timeout-seconds S (15)      a silent connection is closed after S\n"
           "  --request-timeout-seconds S (60)   a request's headers must arrive within S of\n"
           "                                     the connection opening or its last answer,\n"
           "                                     and its body within S of its headers\n"
           "  --max-inflight-bytes B (64 MiB, at least --max-body)  request body bytes held\n"
           "                                     at once by all connections; over it: 503\n"
           "  --health-timeout-seconds S (60)    /healthz is 503 when a request or a rank's\n"
           "                                     health check is older than S\n"
           "  --max-sample-batch N (64)          num_samples of one sampling request (the\n"
           "                                     sequences the ranks' KV caches hold); over it: 400\n"
           "  --max-stop-bytes B (1024)          bytes of one stop string; over it: 400\n");
}

static int parse_(int argc, char **argv, serve_opts *o, gpt_src *g, lm_dir *d) {
    /* Shape flags start at 0, so that --model-dir can tell which were given. */
    *g = (gpt_src){.seed = 42};
    const char *model_dir = NULL;
    *o = (serve_opts){
                      .bind = "127.0.0.1", .port = 8000, .max_body = 16 << 20,
                      .checkpoint_dir = "zdp-serve-checkpoints",
                      .long_poll_s = 30, .seq_gap_s = 30, .max_connections = 512,
                      .max_connections_per_ip = -1, .idle_timeout_s = 15, .request_timeout_s = 60,
                      .max_inflight = -1, .health_timeout_s = 60, .max_sample_batch = 64,
                      .max_stop_bytes = 1024, .max_models = -1, .model_idle_timeout_s = 120,
                      .session_timeout_s = 30};
    const char *model = NULL;
    int full = 0;
    const cli_opt opts[] = {
        CLI_GPT_ROWS(&g->cfg),
        CLI_STR("--model", &model),
        CLI_STR("--model-dir", &model_dir),
        CLI_STR("--config", &o->config),
        CLI_STR("--init", &g->init),
        CLI_STR("--bind", &o->bind),
        CLI_INT("--port", &o->port, 0, 65535, "need an integer in [0, 65535]"),
        CLI_I64("--max-body", &o->max_body, 2, (int64_t)1 << 34, "need a byte count in [2, 2^34]"),
        CLI_WORD("--model-name", &o->model_name, NULL, NULL),
        CLI_WORD("--checkpoint-dir", &o->checkpoint_dir, NULL, NULL),
        CLI_F64("--long-poll-seconds", &o->long_poll_s, 0.01, 3600, "need seconds in [0.01, 3600]"),
        CLI_F64("--seq-gap-seconds", &o->seq_gap_s, 0.01, 3600, "need seconds in [0.01, 3600]"),
        CLI_STR("--api-key-file", &o->api_key_file),
        CLI_LIST("--allow-path-root", &o->allow_roots, &o->n_allow_roots, NULL, NULL),
        CLI_LIST("--allow-host", &o->allow_hosts, &o->n_allow_hosts, ":/[",
                 "a host name only (no port, scheme or brackets)"),
        CLI_INT("--max-connections", &o->max_connections, 1, 4096, "need an integer in [1, 4096]"),
        CLI_INT("--max-connections-per-ip", &o->max_connections_per_ip, 1, 4096,
                "need an integer in [1, 4096]"),
        CLI_INT("--idle-timeout-seconds", &o->idle_timeout_s, 1, 3600,
                "need whole seconds in [1, 3600]"),
        CLI_I64("--max-inflight-bytes", &o->max_inflight, 2, (int64_t)1 << 40,
                "need a byte count in [2, 2^40]"),
        CLI_F64("--request-timeout-seconds", &o->request_timeout_s, 0.1, 86400,
                "need seconds in [0.1, 86400]"),
        CLI_F64("--health-timeout-seconds", &o->health_timeout_s, 0.1, 86400,
                "need seconds in [0.1, 86400]"),
        CLI_INT("--max-sample-batch", &o->max_sample_batch, 1, 4096, "need an integer in [1, 4096]"),
        CLI_INT("--max-stop-bytes", &o->max_stop_bytes, 1, 1 << 20, "need a byte count in [1, 2^20]"),
        CLI_U64("--seed", &g->seed, 0, INT64_MAX, "need an integer >= 0"),
        CLI_FLAG("--full-finetune", &full, 1),
        CLI_INT("--max-models", &o->max_models, 1, 1024, "need an integer in [1, 1024]"),
        CLI_F64("--model-idle-timeout-seconds", &o->model_idle_timeout_s, 0.1, 86400 * 365,
                "need seconds in [0.1, 31536000]"),
        CLI_F64("--session-timeout-seconds", &o->session_timeout_s, 0.1, 86400 * 365,
                "need seconds in [0.1, 31536000]"),
    };
    static const cli_command cmd = {
        .missing = "expected an option with a value (see zdp serve --help)",
        .unknown = " (see zdp serve --help)", .dashes = true};
    int rc = cli_parse_options(&cmd, opts, (int)(sizeof opts / sizeof opts[0]), argc, argv);
    if (rc == 1 && zdp_dist_rank() == 0) usage_();
    if (rc != 0) return rc;
    if (o->config == NULL) return cli_fail("--config CFG.json is required");
    o->full_finetune = full != 0;
    if (o->full_finetune && o->max_models > 1)
        return cli_fail("--max-models %d with --full-finetune: a full fine-tune holds one model (every weight "
                        "trains); drop --max-models, or drop --full-finetune to hold %d LoRA models",
                        o->max_models, o->max_models);
    if (o->max_models < 0) o->max_models = o->full_finetune ? 1 : 4;
    const bool name_given = o->model_name != NULL;
    if (!name_given) o->model_name = "zdp-gpt";
    const zdp_gpt_config *c = &g->cfg;
    if (model_dir != NULL) {
        if (model != NULL || g->init != NULL || c->n_layer || c->n_head || c->n_embd || c->vocab_size)
            return cli_fail("--model-dir %s: the folder gives the model and its weights; drop --model, --init and "
                            "the shape flags (--block-size alone may be given)", model_dir);
        /* Every rank loads the tokenizer: each samples its share of a
         * request's sequences and checks their string stops itself. */
        if ((rc = lm_dir_open(model_dir, c->block_size, true, false, d)) != 0) return rc;
        o->lm = dir_model_(d);
        /* The default base_model name: the folder's own ("SmolLM2-135M"). */
        if (!name_given) o->model_name = d->name;
    } else if (model == NULL || strcmp(model, "gpt") != 0) {
        return cli_fail("--model %s: zdp serve serves --model gpt or a folder, --model-dir DIR",
                        model ? model : "(missing)");
    } else {
        const zdp_gpt_config def = CLI_GPT_DEFAULT;
        g->cfg = (zdp_gpt_config){.n_layer = c->n_layer ? c->n_layer : def.n_layer,
                                  .n_head = c->n_head ? c->n_head : def.n_head,
                                  .n_embd = c->n_embd ? c->n_embd : def.n_embd,
                                  .vocab_size = c->vocab_size ? c->vocab_size : def.vocab_size,
                                  .block_size = c->block_size ? c->block_size : def.block_size};
        o->lm = gpt_model_(g);
    }
    /* Default: 64, and no more than --max-connections. */
    if (o->max_connections_per_ip < 0) o->max_connections_per_ip = o->max_connections < 64 ? o->max_connections : 64;
    if (o->max_connections_per_ip > o->max_connections)
        return cli_fail("--max-connections-per-ip %d is more than --max-connections %d: lower it or raise "
                        "--max-connections", o->max_connections_per_ip, o->max_connections);
    /* Default: 64 MiB, and at least one body of the largest allowed size. */
    if (o->max_inflight < 0) o->max_inflight = o->max_body > (64 << 20) ? o->max_body : (64 << 20);
    if (o->max_inflight < o->max_body)
        return cli_fail("--max-inflight-bytes %lld is less than --max-body %lld, so a body of the largest "
                        "allowed size could never be accepted: raise it or lower --max-body",
                        (long long)o->max_inflight, (long long)o->max_body);
    return 0;
}

/* ---- the command ------------------------------------------------------------------- */

int cmd_serve(int argc, char **argv) {
    serve_opts opt;
    gpt_src gpt;
    lm_dir dir = {0};
    int rc = parse_(argc, argv, &opt, &gpt, &dir);
    zdp_server *s = NULL;
    if (rc == 1) { /* --help */
        rc = 0;
        goto done;
    }
    /* Start-up: every step that can fail on one rank alone (its own config
     * or --init file) runs only while this rank is fine, and all ranks meet
     * at cli_agree, which prints what failed on which rank, before the
     * first collective. */
    zdp_error err;
    if (rc == 0 && zdp_server_create(&opt, &s, &err) != ZDP_OK) rc = cli_fail("%s", err.msg);
    if ((rc = cli_agree(rc)) != 0) goto done;
    /* ZDP_ERR_FATAL: some ranks wait in a collective; only ending the job
     * (MPI_Abort) frees them. */
    zdp_status st = zdp_server_start(s, &err);
    if (st == ZDP_ERR_FATAL) cli_die("zdp serve", &err);
    if (st != ZDP_OK) rc = cli_fail("%s", err.msg);
    if ((rc = cli_agree(rc)) != 0) goto done;
    if (zdp_server_run(s, &err) == ZDP_ERR_FATAL) cli_die("zdp serve", &err);
done:
    zdp_server_destroy(s);
    free((void *)opt.allow_roots);
    free((void *)opt.allow_hosts);
    lm_dir_close(&dir);
    return rc;
}
