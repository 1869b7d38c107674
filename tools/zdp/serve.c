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
#include "sample.h"
#include "serve/serve.h"
#include "zdp/zdp.h"

/* ---- options ------------------------------------------------------------------ */

static void usage_(void) {
    printf("usage: mpirun -np W zdp serve --config CFG.json --model gpt [options]\n"
           "\n"
           "A training server: rank 0 answers HTTP (JSON, Tinker's data shapes), every rank\n"
           "trains.  Endpoints: POST /forward_backward /forward /optim_step /save_weights\n"
           "/save_state /load_state /sample, GET /info /healthz, and the Tinker SDK's\n"
           "/api/v1/... (docs/server.md).\n"
           "\n"
           "  --config CFG.json          ds_config with \"managed_gradient_accumulation\": false\n"
           "  --model gpt                the only model served\n"
           "  --n-layer L (4)  --n-head H (4)  --n-embd C (128)  --vocab-size V (256)\n"
           "  --block-size T (64)\n"
           "  --init FILE                GPT2LMHeadModel safetensors or llm.c .bin weights\n"
           "                             (default: GPT-2's seeded initialisation, --seed)\n"
           "  --seed N (42)\n"
           "  --port P (8000)            0: any free port (the listening line says which)\n"
           "  --bind ADDR (127.0.0.1)    the address to listen on (IPv4 or IPv6)\n"
           "  --max-body BYTES (16777216) larger request bodies get 413\n"
           "\n"
           "The Tinker SDK's protocol (/api/v1/..., SDK 0.18-0.24, JSON):\n"
           "  --model-name NAME (zdp-gpt)  the base_model clients create_model with\n"
           "  --checkpoint-dir DIR (zdp-serve-checkpoints)  every path a client sends is a\n"
           "                             name inside DIR (plain and Tinker endpoints)\n"
           "  --long-poll-seconds S (30)   retrieve_future holds a pending request this long\n"
           "  --seq-gap-seconds S (30)     a missing seq_id is given up after this long\n"
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
           "                                     health check is older than S\n");
}

static int parse_(int argc, char **argv, serve_opts *o) {
    *o = (serve_opts){.model = CLI_GPT_DEFAULT,
                      .bind = "127.0.0.1", .port = 8000, .max_body = 16 << 20, .seed = 42,
                      .model_name = "zdp-gpt", .checkpoint_dir = "zdp-serve-checkpoints",
                      .long_poll_s = 30, .seq_gap_s = 30, .max_connections = 512,
                      .max_connections_per_ip = -1, .idle_timeout_s = 15, .request_timeout_s = 60,
                      .max_inflight = -1, .health_timeout_s = 60};
    const char *model = NULL;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            if (zdp_dist_rank() == 0) usage_();
            return 1;
        }
        if (strncmp(a, "--", 2) != 0 || i + 1 >= argc)
            return cli_fail("%s: expected an option with a value (see zdp serve --help)", a);
        const char *v = argv[++i];
        int64_t n;
        int shape = cli_gpt_option(a, v, &o->model);
        if (shape == 2) return 2;
        if (shape == 1) continue;
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--config")) o->config = v;
        else if (!strcmp(a, "--init")) o->init = v;
        else if (!strcmp(a, "--bind")) o->bind = v;
        else if (!strcmp(a, "--port")) {
            if (!cli_parse_i64(v, 0, 65535, &n)) return cli_fail("--port %s: need an integer in [0, 65535]", v);
            o->port = (int)n;
        } else if (!strcmp(a, "--max-body")) {
            if (!cli_parse_i64(v, 2, (int64_t)1 << 34, &o->max_body))
                return cli_fail("--max-body %s: need a byte count in [2, 2^34]", v);
        } else if (!strcmp(a, "--model-name")) {
            if (v[0] == '\0') return cli_fail("--model-name: must not be empty");
            o->model_name = v;
        } else if (!strcmp(a, "--checkpoint-dir")) {
            if (v[0] == '\0') return cli_fail("--checkpoint-dir: must not be empty");
            o->checkpoint_dir = v;
        } else if (!strcmp(a, "--long-poll-seconds") || !strcmp(a, "--seq-gap-seconds")) {
            char *end;
            double x = strtod(v, &end);
            if (end == v || *end != '\0' || !(x >= 0.01 && x <= 3600))
                return cli_fail("%s %s: need seconds in [0.01, 3600]", a, v);
            if (!strcmp(a, "--long-poll-seconds")) o->long_poll_s = x;
            else o->seq_gap_s = x;
        } else if (!strcmp(a, "--api-key-file")) {
            o->api_key_file = v;
        } else if (!strcmp(a, "--allow-path-root") || !strcmp(a, "--allow-host")) {
            const bool root = !strcmp(a, "--allow-path-root");
            if (v[0] == '\0') return cli_fail("%s: must not be empty", a);
            if (!root && (strchr(v, ':') || strchr(v, '/') || strchr(v, '[')))
                return cli_fail("--allow-host %s: a host name only (no port, scheme or brackets)", v);
            const char ***list = root ? &o->allow_roots : &o->allow_hosts;
            int *n_list = root ? &o->n_allow_roots : &o->n_allow_hosts;
            const char **grown = realloc((void *)*list, (size_t)(*n_list + 1) * sizeof *grown);
            if (grown == NULL) return cli_fail("out of memory");
            grown[(*n_list)++] = v;
            *list = grown;
        } else if (!strcmp(a, "--max-connections") || !strcmp(a, "--max-connections-per-ip")) {
            if (!cli_parse_i64(v, 1, 4096, &n)) return cli_fail("%s %s: need an integer in [1, 4096]", a, v);
            if (!strcmp(a, "--max-connections")) o->max_connections = (int)n;
            else o->max_connections_per_ip = (int)n;
        } else if (!strcmp(a, "--idle-timeout-seconds")) {
            if (!cli_parse_i64(v, 1, 3600, &n)) return cli_fail("%s %s: need whole seconds in [1, 3600]", a, v);
            o->idle_timeout_s = (int)n;
        } else if (!strcmp(a, "--max-inflight-bytes")) {
            if (!cli_parse_i64(v, 2, (int64_t)1 << 40, &o->max_inflight))
                return cli_fail("--max-inflight-bytes %s: need a byte count in [2, 2^40]", v);
        } else if (!strcmp(a, "--request-timeout-seconds") || !strcmp(a, "--health-timeout-seconds")) {
            char *end;
            double x = strtod(v, &end);
            if (end == v || *end != '\0' || !(x >= 0.1 && x <= 86400))
                return cli_fail("%s %s: need seconds in [0.1, 86400]", a, v);
            if (!strcmp(a, "--request-timeout-seconds")) o->request_timeout_s = x;
            else o->health_timeout_s = x;
        } else if (!strcmp(a, "--seed")) {
            if (!cli_parse_i64(v, 0, INT64_MAX, &n)) return cli_fail("--seed %s: need an integer >= 0", v);
            o->seed = (uint64_t)n;
        } else {
            return cli_fail("unknown option %s (see zdp serve --help)", a);
        }
    }
    if (model == NULL || strcmp(model, "gpt") != 0)
        return cli_fail("--model %s: zdp serve serves only --model gpt", model ? model : "(missing)");
    if (o->config == NULL) return cli_fail("--config CFG.json is required");
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
    int rc = parse_(argc, argv, &opt);
    zdp_server *s = NULL;
    if (rc == 1) { /* --help */
        rc = 0;
        goto done;
    }
    opt.sample = sample_next_p;
    /* Start-up: every step that can fail on one rank alone (its own config
     * or --init file) runs only while this rank is fine, and all ranks meet
     * at cli_agree, which prints what failed on which rank, before the
     * first collective. */
    zdp_error err;
    if (rc == 0 && zdp_server_create(&opt, &s, &err) != ZDP_OK) rc = cli_fail("%s", err.msg);
    if ((rc = cli_agree(rc)) != 0) goto done;
    if (zdp_server_start(s, &err) != ZDP_OK) rc = cli_fail("%s", err.msg);
    if ((rc = cli_agree(rc)) != 0) goto done;
    zdp_server_run(s);
done:
    zdp_server_destroy(s);
    free((void *)opt.allow_roots);
    free((void *)opt.allow_hosts);
    return rc;
}
