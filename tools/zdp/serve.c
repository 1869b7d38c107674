/*
 * serve.c -- `zdp serve`: a training server for the GPT, speaking JSON over
 * HTTP with Tinker's data shapes (docs/server.md).
 *
 *   mpirun -np W zdp serve --config CFG.json --model gpt [--n-layer L ...]
 *       [--init W.safetensors] [--port P] [--bind ADDR] [--max-body BYTES] [limits]
 *
 * How it works.  Rank 0 runs libmicrohttpd (one thread per connection).  A
 * connection thread first checks who sent the request (guard_: Host, Origin,
 * the API key, Content-Type), then reads the whole body, parses and validates
 * it completely (so a bad request never reaches the engine and never changes
 * its state; a path is a name inside --checkpoint-dir, serve_resolve_path),
 * serialises it and puts it on a FIFO queue, then waits for its answer.  The
 * main thread of rank 0 takes one request at a time, broadcasts it to every
 * rank over a private duplicate of MPI_COMM_WORLD, and all ranks execute it
 * together: the engine is in unmanaged mode and every request is a few
 * forward/backward calls or one step().
 *
 * Loss and gradient.  Tinker's cross_entropy is L = sum_i w_i * (-log p_i)
 * with no normalisation, so gradients add across requests.  The GPT's loss is
 * the mean over the micro-batch's B*T positions and the engine averages the
 * gradient over the W ranks, so a datum of N tokens (one micro-batch, B = 1)
 * is back-propagated with loss scale N * W:
 *   step gradient = (1/W) sum_ranks sum_datums N*W * d(mean_N)/dθ
 *                 = sum_datums d(sum_N)/dθ = dL/dθ.
 * Datum i goes to rank i mod W.  Every rank makes ceil(n/W) backward() calls
 * per request; a rank with fewer datums runs a one-token micro-batch with
 * loss scale 0, so the stage-2 reductions stay aligned.  Per-token weights
 * go into the model's weighted loss (zdp_gpt_batch.weights) and log p(target)
 * comes back from the same forward (zdp_gpt_batch.logprobs).
 *
 * Operations (docs/server.md, "Limits" and "Stopping").  libmicrohttpd
 * bounds the connections (in all and per client address) and closes idle
 * ones; access_ counts every request body against --max-inflight-bytes and
 * cuts off bodies slower than --request-timeout-seconds, and a watchdog
 * thread does the same for request headers.  A signal to a
 * rank > 0 reaches rank 0 as a TAG_STOP message, and rank 0 stops every
 * rank as for its own signal.  When idle, rank 0 sends a no-op (OP_PING)
 * that every rank answers; /healthz names a rank that has not.
 *
 * The Tinker SDK's own protocol (/api/v1/..., futures, seq_id ordering) is
 * in serve_tinker.c; it validates with the same parsers and feeds the same
 * queue.  Losses other than cross_entropy are weighted cross-entropies whose
 * weights come from the forward's own log-probabilities
 * (zdp_gpt_set_loss_weights, src/models/policy_loss.c).
 */
#define _POSIX_C_SOURCE 200809L
#define _XOPEN_SOURCE 700 /* realpath */
#include <arpa/inet.h>
#include <sys/socket.h>
#include <errno.h>
#include <limits.h>
#include <jansson.h>
#include <math.h>
#include <microhttpd.h>
#include <mpi.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "sample.h"
#include "serve.h"
#include "serve_proto.h"
#include "zdp/zdp.h"

int cmd_serve(int argc, char **argv);

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

/* ---- requests and the queue ------------------------------------------------- */

const char *const serve_adam_keys[N_ADAM] = {"learning_rate", "beta1", "beta2", "eps",
                                             "weight_decay", "grad_clip_norm"};

/* g_stop: the signal that asked this process to stop (0: none). */
static volatile sig_atomic_t g_stop = 0;
static void on_signal_(int sig) { g_stop = sig; }

/* Point-to-point tags on the server's communicator (collectives do not
 * match them): a rank > 0 that got SIGTERM/SIGINT tells rank 0, and every
 * rank > 0 answers rank 0's health check. */
enum { TAG_STOP = 1, TAG_ACK = 2 };

void serve_job_free(job *j) {
    if (j == NULL) return;
    free(j->payload);
    free(j->body);
    free(j->tinker_path);
    free(j->sampling_session);
    free(j);
}

double serve_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- JSON helpers -------------------------------------------------------------- */

char *serve_dump(json_t *o) {
    char *s = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(9));
    json_decref(o);
    return s;
}

/* jansson refuses NaN and Inf: they become null. */
json_t *serve_jreal(double x) { return isfinite(x) ? json_real(x) : json_null(); }

void serve_utf8_fix(char *s) {
    unsigned char *p = (unsigned char *)s;
    while (*p) {
        size_t k = *p < 0x80             ? 0
                   : (*p & 0xe0) == 0xc0 ? 1
                   : (*p & 0xf0) == 0xe0 ? 2
                   : (*p & 0xf8) == 0xf0 ? 3
                                         : 9; /* not a lead byte */
        bool ok = k <= 3;
        for (size_t j = 1; ok && j <= k; j++) ok = (p[j] & 0xc0) == 0x80;
        if (ok && k == 1) ok = *p >= 0xc2;
        if (ok && k == 2) ok = !(*p == 0xe0 && p[1] < 0xa0) && !(*p == 0xed && p[1] >= 0xa0);
        if (ok && k == 3) ok = !(*p == 0xf0 && p[1] < 0x90) && (*p < 0xf4 || (*p == 0xf4 && p[1] < 0x90));
        if (!ok) {
            *p++ = '?';
            continue;
        }
        p += k + 1;
    }
}

char *serve_error_body(const char *field, const char *msg) {
    /* A message cut at a fixed size may end inside a UTF-8 character, and
     * jansson refuses a string that is not UTF-8. */
    char m[1200], f[300];
    snprintf(m, sizeof m, "%s", msg);
    serve_utf8_fix(m);
    if (field != NULL) {
        snprintf(f, sizeof f, "%s", field);
        serve_utf8_fix(f);
    }
    return serve_dump(json_pack("{s:{s:s,s:s?}}", "error", "message", m, "field", field ? f : NULL));
}

bool serve_bad(verr *e, int status, const char *field, const char *fmt, ...) {
    e->status = status;
    snprintf(e->field, sizeof e->field, "%s", field);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return false;
}

const char *serve_jtype(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

/* Every key of object o must be in keys[0..n). */
bool serve_only_keys(const json_t *o, const char *where, const char *const *keys, int n,
                       verr *e) {
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)o, k, v) {
        bool known = false;
        for (int i = 0; i < n && !known; i++) known = strcmp(k, keys[i]) == 0;
        if (!known) {
            char field[512], list[256] = "";
            snprintf(field, sizeof field, "%s%s%s", where, where[0] ? "." : "", k);
            for (int i = 0; i < n; i++)
                snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", keys[i]);
            return serve_bad(e, 400, field, "%s: unknown field; the fields here are: %s", field, list);
        }
    }
    return true;
}

/* ---- paths a client sends ------------------------------------------------------ */

int serve_mkdirs(const char *path) {
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) {
        errno = ENAMETOOLONG;
        return -1;
    }
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    return mkdir(buf, 0777) != 0 && errno != EEXIST ? -1 : 0;
}

/* Is p root itself or below it?  Both are absolute, without "." or "..". */
static bool inside_(const char *p, const char *root) {
    size_t n = strlen(root);
    while (n > 1 && root[n - 1] == '/') n--;
    if (n == 1 && root[0] == '/') return true;
    return strncmp(p, root, n) == 0 && (p[n] == '\0' || p[n] == '/');
}

bool serve_resolve_path(const server *s, const char *field, const char *name, char *out, size_t cap,
                        verr *e) {
    const size_t n = strlen(name);
    if (n == 0 || n > 4000)
        return serve_bad(e, 400, field, "%s: must be a name of 1 to 4000 bytes inside the server's "
                         "checkpoint folder, such as \"run1/step10\"", field);
    for (const char *p = name; *p;) {
        while (*p == '/') p++;
        const char *q = p;
        while (*q && *q != '/') q++;
        if ((q - p == 1 && p[0] == '.') || (q - p == 2 && p[0] == '.' && p[1] == '.'))
            return serve_bad(e, 400, field, "%s = \"%s\": \".\" and \"..\" are not allowed in a path; send a "
                             "name inside the server's checkpoint folder, such as \"run1/step10\"", field, name);
        p = q;
    }
    /* The same answer whether or not anything outside exists. */
    char outside[1400];
    snprintf(outside, sizeof outside, "%s = \"%.1000s\": outside the folders this server may use; send a name "
             "inside its checkpoint folder (--checkpoint-dir), such as \"run1/step10\" (the operator can allow "
             "other folders for absolute paths with --allow-path-root DIR)", field, name);
    char root[PATH_MAX], real[PATH_MAX], full[PATH_MAX + 4096], pre[PATH_MAX + 4096];
    if (serve_mkdirs(s->opt.checkpoint_dir) != 0 || realpath(s->opt.checkpoint_dir, root) == NULL)
        return serve_bad(e, 500, field, "%s: cannot create the checkpoint folder %s: %s (--checkpoint-dir)",
                         field, s->opt.checkpoint_dir, strerror(errno));
    if (name[0] == '/') {
        /* An absolute path: only inside a folder the operator named (checked
         * again on the real path below); nothing else is looked at. */
        bool listed = inside_(name, root);
        for (int i = 0; i < s->opt.n_allow_roots && !listed; i++)
            listed = inside_(name, s->roots_real[i]) ||
                     (s->opt.allow_roots[i][0] == '/' && inside_(name, s->opt.allow_roots[i]));
        if (!listed) return serve_bad(e, 400, field, "%s", outside);
        snprintf(full, sizeof full, "%s", name);
    } else {
        snprintf(full, sizeof full, "%s/%s", root, name);
    }
    size_t len = strlen(full);
    while (len > 1 && full[len - 1] == '/') full[--len] = '\0';
    /* The longest prefix that exists (lstat: a link at the end counts, even a
     * dangling one), resolved with realpath: a symbolic link anywhere in it
     * that leads outside shows.  What follows does not exist yet, so it holds
     * no link. */
    snprintf(pre, sizeof pre, "%s", full);
    struct stat sb;
    while (lstat(pre, &sb) != 0) {
        char *slash = strrchr(pre, '/');
        if (slash == pre) {
            pre[1] = '\0';
            break;
        }
        *slash = '\0';
    }
    if (realpath(pre, real) == NULL) return serve_bad(e, 400, field, "%s", outside);
    const char *rest = full + strlen(pre);
    while (*rest == '/') rest++;
    const size_t rl = strlen(real);
    if (snprintf(out, cap, "%s%s%s", real, *rest && real[rl - 1] != '/' ? "/" : "", rest) >= (int)cap)
        return serve_bad(e, 400, field, "%s = \"%.1000s\": too long", field, name);
    bool ok = inside_(out, root);
    for (int i = 0; i < s->opt.n_allow_roots && !ok; i++) ok = inside_(out, s->roots_real[i]);
    if (!ok) return serve_bad(e, 400, field, "%s", outside);
    return true;
}

/* ---- who may send a request ------------------------------------------------------ */

bool serve_names_type(const char *value, const char *type) {
    const size_t n = strlen(type);
    for (const char *p = value; p != NULL && *p;) {
        while (*p == ' ' || *p == '\t' || *p == ',') p++;
        if (strncasecmp(p, type, n) == 0) {
            const char *q = p + n;
            while (*q == ' ' || *q == '\t') q++;
            if (*q == '\0' || *q == ',' || *q == ';') return true;
        }
        p = strchr(p, ',');
    }
    return false;
}

/* A Content-Type that is exactly this media type (parameters allowed):
 * stricter than serve_names_type, as a list is no Content-Type. */
static bool content_type_is_(const char *value, const char *type) {
    const size_t n = strlen(type);
    while (*value == ' ' || *value == '\t') value++;
    if (strncasecmp(value, type, n) != 0) return false;
    const char *q = value + n;
    while (*q == ' ' || *q == '\t') q++;
    return *q == '\0' || *q == ';';
}

/* host (a name, an IPv4 address or an IPv6 one without brackets) and port
 * (-1: none given) name this server?  The bound address, for a loopback
 * bind any loopback address and localhost, for a wildcard bind any address
 * and localhost, and --allow-host names (with any port: a reverse proxy's). */
static bool host_ok_(const server *s, int bound_port, const char *host, long port, bool bracketed) {
    for (int i = 0; i < s->opt.n_allow_hosts; i++)
        if (strcasecmp(host, s->opt.allow_hosts[i]) == 0) return true;
    if (port >= 0 && port != bound_port) return false;
    if (strcasecmp(host, "localhost") == 0) return s->bind_kind != 0;
    unsigned char a[16] = {0};
    int fam = 0;
    if (!bracketed && inet_pton(AF_INET, host, a) == 1) fam = AF_INET;
    else if (bracketed && inet_pton(AF_INET6, host, a) == 1) fam = AF_INET6;
    if (fam == 0) return false;
    if (s->bind_kind == 2) return true;
    if (s->bind_kind == 1) {
        static const unsigned char v6_loop[16] = {[15] = 1};
        if ((fam == AF_INET && a[0] == 127) || (fam == AF_INET6 && memcmp(a, v6_loop, 16) == 0)) return true;
    }
    return fam == s->bind_family && memcmp(a, s->bind_addr, fam == AF_INET ? 4 : 16) == 0;
}

/* "host[:port]" or "[v6][:port]" (a Host header, or an Origin after its
 * scheme); default_port stands for a missing port (-1: any). */
static bool authority_ok_(const server *s, int bound_port, const char *v, long default_port) {
    char host[256];
    const char *after;
    bool bracketed = v[0] == '[';
    if (bracketed) {
        const char *close = strchr(v, ']');
        if (close == NULL || close - v - 1 >= (long)sizeof host) return false;
        snprintf(host, sizeof host, "%.*s", (int)(close - v - 1), v + 1);
        after = close + 1;
    } else {
        size_t k = strcspn(v, ":");
        if (k >= sizeof host) return false;
        snprintf(host, sizeof host, "%.*s", (int)k, v);
        after = v + k;
    }
    long port = default_port;
    if (*after == ':') {
        char *end;
        errno = 0;
        port = strtol(after + 1, &end, 10);
        if (end == after + 1 || *end != '\0' || errno != 0 || port < 0 || port > 65535) return false;
    } else if (*after != '\0') {
        return false;
    }
    return host[0] != '\0' && host_ok_(s, bound_port, host, port, bracketed);
}

/* The API key, compared in constant time: the time depends on the key's
 * length, never on where a guess first differs. */
static bool key_matches_(const server *s, const char *got) {
    if (got == NULL) return false;
    const size_t n = strlen(got), m = s->api_key_len;
    volatile unsigned char diff = n != m;
    for (size_t i = 0; i < m; i++) diff |= (unsigned char)(s->api_key[i] ^ (i < n ? got[i] : 0));
    return diff == 0;
}

/* Every request passes here before its body is read: the Host and Origin
 * (a web page's requests, DNS rebinding), the API key, and a POST's
 * Content-Type (a page may POST text/plain cross-site without asking). */
static bool guard_(server *s, struct MHD_Connection *c, const char *url, const char *method, verr *e) {
    pthread_mutex_lock(&s->mu);
    const int port = s->bound_port; /* set just after the daemon started */
    pthread_mutex_unlock(&s->mu);
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host");
    char where[320];
    snprintf(where, sizeof where, "%s%s%s:%d", s->bind_family == AF_INET6 ? "[" : "", s->opt.bind,
             s->bind_family == AF_INET6 ? "]" : "", port);
    if (host != NULL && !authority_ok_(s, port, host, -1))
        return serve_bad(e, 403, "Host", "Host: %.200s: this server answers requests addressed to %s%s only "
                         "(a web page can reach a local server under another name by DNS rebinding); the "
                         "operator can add a name with --allow-host NAME", host, where,
                         s->bind_kind != 0 ? " or localhost" : "");
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    if (origin != NULL) {
        bool ok = false;
        if (strncasecmp(origin, "http://", 7) == 0) ok = authority_ok_(s, port, origin + 7, 80);
        else if (strncasecmp(origin, "https://", 8) == 0) ok = authority_ok_(s, port, origin + 8, 443);
        if (!ok)
            return serve_bad(e, 403, "Origin", "Origin: %.200s: cross-site requests are refused (a web page "
                             "is not a client of this server; clients send no Origin, or this server's own)",
                             origin);
    }
    const bool health = !strcmp(method, "GET") && (!strcmp(url, "/healthz") || !strcmp(url, "/api/v1/healthz"));
    if (s->api_key != NULL && !health) {
        const char *key = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-API-Key");
        const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
        bool ok = key_matches_(s, key);
        if (auth != NULL && strncasecmp(auth, "Bearer ", 7) == 0) {
            const char *tok = auth + 7;
            while (*tok == ' ') tok++;
            ok = key_matches_(s, tok) || ok;
        }
        if (!ok)
            return serve_bad(e, 401, key != NULL ? "X-API-Key" : auth != NULL ? "Authorization" : "X-API-Key",
                             "%s: this server needs its API key (--api-key-file): send X-API-Key: KEY or "
                             "Authorization: Bearer KEY", key != NULL || auth != NULL ? "wrong API key"
                                                                                      : "no API key");
    }
    if (!strcmp(method, "POST")) {
        const char *ct = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type");
        const bool tinker = strncmp(url, "/api/v1/", 8) == 0;
        if (ct == NULL || !(content_type_is_(ct, "application/json") ||
                            (tinker && content_type_is_(ct, SERVE_PROTO_CONTENT_TYPE))))
            return serve_bad(e, 415, "Content-Type", "Content-Type: %.200s: a POST must be application/json%s "
                             "(curl: -H 'Content-Type: application/json')", ct ? ct : "(none)",
                             tinker ? " (or application/x-protobuf for the Tinker SDK's forward_backward)" : "");
    }
    return true;
}

/* ---- validation ---------------------------------------------------------------- */

bool serve_put(serve_bytes *b, const void *src, size_t n) {
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n) cap *= 2;
        unsigned char *p = realloc(b->p, cap);
        if (p == NULL) return false;
        b->p = p;
        b->cap = cap;
    }
    if (n > 0) memcpy(b->p + b->len, src, n);
    b->len += n;
    return true;
}

/* Reads a loss_fn_inputs tensor: a plain JSON array, or Tinker's TensorData
 * {data, dtype, shape}.  Integer tensors go to ints[0..N), float ones to
 * floats[0..N).  N is the datum's model_input length. */
static bool parse_tensor_(const json_t *v, const char *path, bool integer, int64_t N, int V, double limit,
                          int32_t *ints, float *floats, verr *e) {
    char field[384];
    const json_t *arr = v;
    char data_path[320];
    snprintf(data_path, sizeof data_path, "%s", path);
    if (json_is_object(v)) {
        static const char *const keys[] = {"data", "dtype", "shape", "sparse_crow_indices",
                                           "sparse_col_indices"};
        if (!serve_only_keys(v, path, keys, 5, e)) return false;
        if (json_object_get(v, "sparse_crow_indices") || json_object_get(v, "sparse_col_indices")) {
            snprintf(field, sizeof field, "%s.sparse_crow_indices", path);
            return serve_bad(e, 400, field, "%s: sparse CSR tensors are not supported; send dense 1-D data", path);
        }
        arr = json_object_get(v, "data");
        snprintf(data_path, sizeof data_path, "%s.data", path);
        if (arr == NULL) return serve_bad(e, 400, data_path, "%s: missing (TensorData needs data)", data_path);
        const json_t *dt = json_object_get(v, "dtype");
        snprintf(field, sizeof field, "%s.dtype", path);
        if (dt != NULL) {
            if (!json_is_string(dt))
                return serve_bad(e, 400, field, "%s: must be a string, got %s", field, serve_jtype(dt));
            const char *s = json_string_value(dt);
            bool ok = integer ? (!strcmp(s, "int64") || !strcmp(s, "int32"))
                              : (!strcmp(s, "float32") || !strcmp(s, "float64") ||
                                 !strcmp(s, "int64") || !strcmp(s, "int32"));
            if (!ok)
                return serve_bad(e, 400, field, "%s = \"%s\": expected %s", field, s,
                            integer ? "\"int64\" (or \"int32\")" : "\"float32\"");
        }
        const json_t *sh = json_object_get(v, "shape");
        snprintf(field, sizeof field, "%s.shape", path);
        if (sh != NULL && !json_is_null(sh)) {
            if (!json_is_array(sh) || json_array_size(sh) != 1 ||
                !json_is_integer(json_array_get(sh, 0)))
                return serve_bad(e, 400, field, "%s: must be [N] (1-D tensors only), got %s", field,
                            json_is_array(sh) ? "another shape" : serve_jtype(sh));
            if (json_integer_value(json_array_get(sh, 0)) != N)
                return serve_bad(e, 400, field, "%s = [%lld]: must be [%lld], the model_input length", field,
                            (long long)json_integer_value(json_array_get(sh, 0)), (long long)N);
        }
    }
    if (!json_is_array(arr))
        return serve_bad(e, 400, data_path, "%s: must be an array of numbers or TensorData, got %s",
                    data_path, serve_jtype(arr));
    if ((int64_t)json_array_size(arr) != N)
        return serve_bad(e, 400, data_path, "%s: has %zu values; the model_input has %lld tokens (position i "
                    "of the input predicts element i: the server does not shift)",
                    data_path, json_array_size(arr), (long long)N);
    for (int64_t i = 0; i < N; i++) {
        const json_t *x = json_array_get(arr, (size_t)i);
        snprintf(field, sizeof field, "%s[%lld]", data_path, (long long)i);
        if (integer) {
            if (!json_is_integer(x))
                return serve_bad(e, 400, field, "%s: must be an integer token id, got %s", field, serve_jtype(x));
            json_int_t t = json_integer_value(x);
            if (t < 0 || t >= V)
                return serve_bad(e, 400, field, "%s = %lld: outside the vocabulary [0, %d)", field, (long long)t, V);
            ints[i] = (int32_t)t;
        } else {
            if (!json_is_number(x))
                return serve_bad(e, 400, field, "%s: must be a number, got %s", field, serve_jtype(x));
            double w = json_number_value(x);
            if (!isfinite(w))
                return serve_bad(e, 400, field, "%s = %g: must be a finite number", field, w);
            if (fabs(w) > limit)
                return serve_bad(e, 400, field, "%s = %g: |value| must be <= %g", field, w, limit);
            floats[i] = (float)w;
        }
    }
    return true;
}

/* The loss of a forward/forward_backward: Tinker's names, the loss_fn_inputs
 * each one reads, and its loss_fn_config keys (docs/tinker-protocol.md §2). */
typedef struct loss_spec {
    const char *name;
    const char *inputs[3]; /* [0] is always target_tokens */
    int n_inputs;
    bool optional_last;    /* cross_entropy: weights may be left out (all 1) */
    const char *config[2];
    int n_config;
} loss_spec;

static const loss_spec losses_[N_LOSSES] = {
    [ZDP_LOSS_CROSS_ENTROPY] = {"cross_entropy", {"target_tokens", "weights"}, 2, true, {0}, 0},
    [ZDP_LOSS_IMPORTANCE_SAMPLING] = {"importance_sampling", {"target_tokens", "logprobs", "advantages"},
                                  3, false, {0}, 0},
    [ZDP_LOSS_PPO] = {"ppo", {"target_tokens", "logprobs", "advantages"}, 3, false,
                  {"clip_low_threshold", "clip_high_threshold"}, 2},
    [ZDP_LOSS_CISPO] = {"cispo", {"target_tokens", "logprobs", "advantages"}, 3, false,
                    {"clip_low_threshold", "clip_high_threshold"}, 2},
    [ZDP_LOSS_DRO] = {"dro", {"target_tokens", "logprobs", "advantages"}, 3, false, {"beta"}, 1},
};

/* Where a float input goes in the payload (weights, logprobs, advantages). */
static int float_slot_(const char *input) {
    return !strcmp(input, "weights") ? 0 : !strcmp(input, "logprobs") ? 1 : 2;
}

/* "where.rest", or "rest" when where is empty. */
static const char *at_(char *buf, size_t cap, const char *where, const char *rest) {
    snprintf(buf, cap, "%s%s%s", where, where[0] ? "." : "", rest);
    return buf;
}

/* forward_backward / forward input: {data: [Datum...], loss_fn, loss_fn_config}.
 * payload: fwd_header, int32 len[n], int32 tokens[total], int32 targets[total],
 * then float weights[total], logprobs[total] (the sampler's), advantages[total]
 * (the inputs a loss does not read are 0). */
bool serve_parse_fwd(const json_t *root, const char *where, const zdp_gpt_config *mc, job *j,
                     verr *e) {
    char lf_path[320], lc_path[320], data_path[320];
    at_(lf_path, sizeof lf_path, where, "loss_fn");
    at_(lc_path, sizeof lc_path, where, "loss_fn_config");
    at_(data_path, sizeof data_path, where, "data");
    static const char *const keys[] = {"data", "loss_fn", "loss_fn_config"};
    if (!serve_only_keys(root, where, keys, 3, e)) return false;

    fwd_header h = {.loss = ZDP_LOSS_CROSS_ENTROPY, .clip_low = 0.8, .clip_high = 1.2, .beta = NAN};
    const json_t *lf = json_object_get(root, "loss_fn");
    if (lf == NULL && j->op == OP_FWDBWD)
        return serve_bad(e, 400, lf_path, "%s: missing; send \"cross_entropy\" (or importance_sampling, "
                         "ppo, cispo, dro)", lf_path);
    if (lf != NULL && !json_is_string(lf))
        return serve_bad(e, 400, lf_path, "%s: must be a string, got %s", lf_path, serve_jtype(lf));
    if (lf != NULL) {
        h.loss = -1;
        for (int k = 0; k < N_LOSSES; k++)
            if (!strcmp(json_string_value(lf), losses_[k].name)) h.loss = k;
        if (h.loss < 0)
            return serve_bad(e, 400, lf_path, "%s = \"%s\": unknown loss; the losses are cross_entropy, "
                             "importance_sampling, ppo, cispo, dro", lf_path, json_string_value(lf));
    }
    const loss_spec *ls = &losses_[h.loss];
    const json_t *lc = json_object_get(root, "loss_fn_config");
    if (lc != NULL && !json_is_null(lc)) {
        if (!json_is_object(lc))
            return serve_bad(e, 400, lc_path, "%s: must be an object, got %s", lc_path, serve_jtype(lc));
        if (ls->n_config == 0 && json_object_size(lc) > 0)
            return serve_bad(e, 400, lc_path, "%s: %s takes no options; leave it out or send {}", lc_path,
                             ls->name);
        if (!serve_only_keys(lc, lc_path, ls->config, ls->n_config, e)) return false;
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)lc, k, v) {
            char f[400];
            snprintf(f, sizeof f, "%s.%s", lc_path, k);
            if (!json_is_number(v) || !isfinite(json_number_value(v)) || json_number_value(v) < 0)
                return serve_bad(e, 400, f, "%s: must be a finite number >= 0", f);
            double x = json_number_value(v);
            if (x > 1e6) return serve_bad(e, 400, f, "%s = %g: must be <= 1e6", f, x);
            if (!strcmp(k, "clip_low_threshold")) h.clip_low = x;
            else if (!strcmp(k, "clip_high_threshold")) h.clip_high = x;
            else h.beta = x;
        }
    }
    if (h.loss == ZDP_LOSS_DRO && (lc == NULL || json_object_get(lc, "beta") == NULL))
        return serve_bad(e, 400, lc_path, "%s.beta: missing; dro needs beta (the weight of "
                         "0.5 * (logprob - sampler logprob)^2)", lc_path);
    if (h.clip_low > 1.0 || h.clip_high < 1.0)
        return serve_bad(e, 400, lc_path, "%s: clip_low_threshold = %g and clip_high_threshold = %g "
                         "are ratio bounds and must satisfy low <= 1 <= high (defaults 0.8, 1.2)",
                         lc_path, h.clip_low, h.clip_high);

    const json_t *data = json_object_get(root, "data");
    if (data == NULL) return serve_bad(e, 400, data_path, "%s: missing (an array of datums)", data_path);
    if (!json_is_array(data))
        return serve_bad(e, 400, data_path, "%s: must be an array, got %s", data_path, serve_jtype(data));
    const size_t n = json_array_size(data);
    if (n == 0) return serve_bad(e, 400, data_path, "%s: empty; send at least one datum", data_path);
    if (n > (1u << 24)) return serve_bad(e, 400, data_path, "%s: %zu datums is too many", data_path, n);

    const int T = mc->block_size, V = mc->vocab_size;
    const size_t cap = n * (size_t)T;
    int32_t *len = calloc(n, sizeof *len);
    int32_t *tok = malloc(cap * sizeof *tok), *tgt = malloc(cap * sizeof *tgt);
    float *fl = calloc(3 * cap, sizeof *fl); /* weights, logprobs, advantages */
    bool ok = len != NULL && tok != NULL && tgt != NULL && fl != NULL;
    if (!ok) serve_bad(e, 500, data_path, "out of memory for %zu datums", n);
    int64_t total = 0;
    char path[384], field[512];
    for (size_t i = 0; ok && i < n; i++) {
        const json_t *d = json_array_get(data, i);
        snprintf(path, sizeof path, "%s[%zu]", data_path, i);
        if (!json_is_object(d)) {
            ok = serve_bad(e, 400, path, "%s: must be an object {model_input, loss_fn_inputs}, got %s", path,
                           serve_jtype(d));
            break;
        }
        static const char *const dkeys[] = {"model_input", "loss_fn_inputs"};
        if (!(ok = serve_only_keys(d, path, dkeys, 2, e))) break;
        const json_t *mi = json_object_get(d, "model_input");
        snprintf(field, sizeof field, "%s.model_input", path);
        if (!json_is_object(mi)) {
            ok = serve_bad(e, 400, field, "%s: %s; must be {\"chunks\": [...]}", field,
                           mi ? "not an object" : "missing");
            break;
        }
        static const char *const mkeys[] = {"chunks"};
        if (!(ok = serve_only_keys(mi, field, mkeys, 1, e))) break;
        const json_t *chunks = json_object_get(mi, "chunks");
        snprintf(field, sizeof field, "%s.model_input.chunks", path);
        if (!json_is_array(chunks) || json_array_size(chunks) == 0) {
            ok = serve_bad(e, 400, field, "%s: must be a non-empty array of chunks", field);
            break;
        }
        int64_t N = 0;
        int32_t *dst = tok + total;
        for (size_t c = 0; ok && c < json_array_size(chunks); c++) {
            const json_t *ch = json_array_get(chunks, c);
            char cpath[448];
            snprintf(cpath, sizeof cpath, "%s.model_input.chunks[%zu]", path, c);
            if (!json_is_object(ch)) {
                ok = serve_bad(e, 400, cpath, "%s: must be an object, got %s", cpath, serve_jtype(ch));
                break;
            }
            static const char *const ckeys[] = {"type", "tokens"};
            const json_t *ty = json_object_get(ch, "type");
            if (ty != NULL && (!json_is_string(ty) || strcmp(json_string_value(ty), "encoded_text") != 0)) {
                snprintf(field, sizeof field, "%s.type", cpath);
                ok = serve_bad(e, 400, field, "%s: only \"encoded_text\" chunks are supported (got %s%s%s)",
                               field, json_is_string(ty) ? "\"" : "",
                               json_is_string(ty) ? json_string_value(ty) : serve_jtype(ty),
                               json_is_string(ty) ? "\"" : "");
                break;
            }
            if (!(ok = serve_only_keys(ch, cpath, ckeys, 2, e))) break;
            const json_t *tk = json_object_get(ch, "tokens");
            snprintf(field, sizeof field, "%s.tokens", cpath);
            if (!json_is_array(tk)) {
                ok = serve_bad(e, 400, field, "%s: must be an array of token ids, got %s", field,
                               tk ? serve_jtype(tk) : "nothing");
                break;
            }
            for (size_t k = 0; k < json_array_size(tk); k++) {
                const json_t *x = json_array_get(tk, k);
                snprintf(field, sizeof field, "%s.tokens[%zu]", cpath, k);
                if (!json_is_integer(x)) {
                    ok = serve_bad(e, 400, field, "%s: must be an integer token id, got %s", field,
                                   serve_jtype(x));
                    break;
                }
                json_int_t t = json_integer_value(x);
                if (t < 0 || t >= V) {
                    ok = serve_bad(e, 400, field, "%s = %lld: outside the vocabulary [0, %d)", field,
                                   (long long)t, V);
                    break;
                }
                if (N >= T) {
                    snprintf(field, sizeof field, "%s.model_input", path);
                    ok = serve_bad(e, 400, field, "%s: more than %d tokens (block_size); send at most %d",
                                   field, T, T);
                    break;
                }
                dst[N++] = (int32_t)t;
            }
        }
        if (!ok) break;
        if (N == 0) {
            snprintf(field, sizeof field, "%s.model_input", path);
            ok = serve_bad(e, 400, field, "%s: no tokens; a datum needs at least one", field);
            break;
        }
        const json_t *li = json_object_get(d, "loss_fn_inputs");
        snprintf(field, sizeof field, "%s.loss_fn_inputs", path);
        if (!json_is_object(li)) {
            ok = serve_bad(e, 400, field, "%s: %s; %s needs %s%s%s%s", field, li ? "not an object" : "missing",
                           ls->name, ls->inputs[0], ls->n_inputs > 1 ? ", " : "",
                           ls->n_inputs > 1 ? ls->inputs[1] : "", ls->n_inputs > 2 ? ", advantages" : "");
            break;
        }
        if (!(ok = serve_only_keys(li, field, ls->inputs, ls->n_inputs, e))) break;
        for (int k = 0; ok && k < ls->n_inputs; k++) {
            const json_t *tv = json_object_get(li, ls->inputs[k]);
            char tpath[576];
            snprintf(tpath, sizeof tpath, "%s.loss_fn_inputs.%s", path, ls->inputs[k]);
            float *dstf = fl + (size_t)float_slot_(ls->inputs[k]) * cap + total;
            if (tv == NULL || json_is_null(tv)) {
                if (k == ls->n_inputs - 1 && ls->optional_last) {
                    for (int64_t t = 0; t < N; t++) dstf[t] = 1.0f; /* no weights: all 1 */
                    continue;
                }
                ok = serve_bad(e, 400, tpath, "%s: missing (%s needs it)", tpath, ls->name);
                break;
            }
            /* Bounds that keep every loss coefficient within float range:
             * the ratio exp(lp - q) is clamped at exp(ZDP_LOSS_MAX_LOG_RATIO). */
            const double limit = !strcmp(ls->inputs[k], "logprobs") ? 1e4 : 1e20;
            ok = k == 0 ? parse_tensor_(tv, tpath, true, N, V, 0, tgt + total, NULL, e)
                        : parse_tensor_(tv, tpath, false, N, V, limit, NULL, dstf, e);
        }
        if (!ok) break;
        len[i] = (int32_t)N;
        total += N;
    }
    if (ok) {
        serve_bytes b = {0};
        h.n = (int64_t)n;
        ok = serve_put(&b, &h, sizeof h) && serve_put(&b, len, n * sizeof *len) &&
             serve_put(&b, tok, (size_t)total * sizeof *tok) && serve_put(&b, tgt, (size_t)total * sizeof *tgt);
        for (int k = 0; ok && k < 3; k++) ok = serve_put(&b, fl + (size_t)k * cap, (size_t)total * sizeof *fl);
        if (!ok) {
            free(b.p);
            serve_bad(e, 500, data_path, "out of memory");
        } else {
            j->payload = b.p;
            j->nbytes = (int64_t)b.len;
        }
    }
    free(len);
    free(tok);
    free(tgt);
    free(fl);
    return ok;
}

/* adam_params (Tinker's AdamParams) -> payload: optim_payload.  A field
 * left out keeps the engine's current value, or with tinker_defaults takes
 * AdamParams' default (docs/tinker-protocol.md §1.4: older SDKs leave the last two out). */
bool serve_parse_optim(const json_t *ap, const char *where, bool tinker_defaults, job *j, verr *e) {
    static const double tinker_default[N_ADAM] = {1e-4, 0.9, 0.95, 1e-12, 0.0, 0.0};
    optim_payload p = {0};
    for (int k = 0; k < N_ADAM && tinker_defaults; k++) {
        p.has[k] = 1;
        p.value[k] = tinker_default[k];
    }
    if (ap != NULL && !json_is_null(ap)) {
        if (!json_is_object(ap))
            return serve_bad(e, 400, where, "%s: must be an object, got %s", where, serve_jtype(ap));
        if (!serve_only_keys(ap, where, serve_adam_keys, N_ADAM, e)) return false;
        for (int k = 0; k < N_ADAM; k++) {
            const json_t *v = json_object_get(ap, serve_adam_keys[k]);
            if (v == NULL || json_is_null(v)) continue;
            char field[320];
            snprintf(field, sizeof field, "%s.%s", where, serve_adam_keys[k]);
            if (!json_is_number(v))
                return serve_bad(e, 400, field, "%s: must be a number, got %s", field, serve_jtype(v));
            double x = json_number_value(v);
            /* Finite ranges, within what zdp_engine_set_hparams accepts (a
             * value it still refuses is a 400 when the step runs): a learning
             * rate of 1e308 would turn the weights into NaN. */
            static const double hi[N_ADAM] = {SERVE_MAX_LR, 1, 1, 1, SERVE_MAX_WEIGHT_DECAY, 1e30};
            bool beta = k == 1 || k == 2, eps = k == 3;
            if (!isfinite(x) || x < 0 || (beta && x >= 1) || (eps && x <= 0) || (!beta && x > hi[k]))
                return serve_bad(e, 400, field, "%s = %g: must be %s%g%s", field, x,
                                 beta ? "in [0, " : eps ? "in (0, " : "in [0, ", hi[k], beta ? ")" : "]");
            p.has[k] = 1;
            p.value[k] = x;
        }
    }
    j->payload = malloc(sizeof p);
    if (j->payload == NULL) return serve_bad(e, 500, where, "out of memory");
    memcpy(j->payload, &p, sizeof p);
    j->nbytes = (int64_t)sizeof p;
    return true;
}

/* The payload of a path op: the path, NUL-terminated.  save_state and
 * load_state run on every rank: their path goes relative to the checkpoint
 * folder, which each rank resolves against its own --checkpoint-dir. */
bool serve_set_path(const server *s, job *j, const char *path, verr *e) {
    if ((j->op == OP_SAVE_STATE || j->op == OP_LOAD_STATE) && inside_(path, s->ckpt_root)) {
        path += strlen(s->ckpt_root);
        while (*path == '/') path++;
        if (*path == '\0') return serve_bad(e, 400, "path", "path: needs a name inside the checkpoint folder");
    }
    size_t n = strlen(path);
    j->payload = malloc(n + 1);
    if (j->payload == NULL) return serve_bad(e, 500, "path", "out of memory");
    memcpy(j->payload, path, n + 1);
    j->nbytes = (int64_t)n + 1;
    return true;
}

static bool parse_path_(const server *s, const json_t *root, job *j, verr *e) {
    static const char *const keys[] = {"path"};
    if (!serve_only_keys(root, "", keys, 1, e)) return false;
    const json_t *p = json_object_get(root, "path");
    if (p == NULL) return serve_bad(e, 400, "path", "path: missing (a file or directory path on the server)");
    if (!json_is_string(p)) return serve_bad(e, 400, "path", "path: must be a string, got %s", serve_jtype(p));
    size_t n = json_string_length(p);
    const char *name = json_string_value(p);
    if (n == 0 || strlen(name) != n) return serve_bad(e, 400, "path", "path: must be a non-empty string without NUL");
    if (n > 4000) return serve_bad(e, 400, "path", "path: longer than 4000 bytes");
    if (j->op != OP_SAVE_WEIGHTS) {
        /* dir/tag: the tag is the last component. */
        size_t m = n;
        while (m > 0 && name[m - 1] == '/') m--;
        if (m == 0) return serve_bad(e, 400, "path", "path = \"%s\": needs a directory name (DIR/TAG)", name);
    }
    /* A name inside the checkpoint folder (or an absolute path inside a
     * folder the operator allowed); the engine gets the resolved path. */
    char resolved[PATH_MAX + 4096];
    if (!serve_resolve_path(s, "path", name, resolved, sizeof resolved, e)) return false;
    return serve_set_path(s, j, resolved, e);
}

/* ---- execution (every rank) ---------------------------------------------------- */

static void engine_die_(const char *what, const zdp_error *err) { cli_die(what, err); }

static float **views_(server *s) {
    float **v = malloc((size_t)s->model.n_params * sizeof *v);
    if (v == NULL) return NULL;
    for (int i = 0; i < s->model.n_params; i++) v[i] = zdp_engine_param_data(s->eng, i);
    return v;
}

/* Per-token coefficients and losses of datum i: c_t (the weight its
 * log-probability's gradient gets) and the summand of L at t. */
static void datum_loss_(const fwd_header *h, int64_t N, const float *lp, const float *w,
                        const float *q, const float *adv, float *coef, float *el, double *sum) {
    const zdp_loss_config lc = {.clip_low = h->clip_low, .clip_high = h->clip_high, .beta = h->beta};
    zdp_error err;
    if (zdp_policy_loss((zdp_loss_kind)h->loss, &lc, N, lp, q, adv, w, coef, el, sum, &err) != ZDP_OK) {
        /* Validation bounds every input (|x| <= 1e20, sampler logprobs within
         * 1e4), so only a model whose own log-probabilities have left float
         * range gets here.  This datum then adds no gradient, rather than
         * leaving the ranks' backward calls out of step. */
        fprintf(stderr, "zdp serve: rank %d: datum dropped from the gradient: %s\n", zdp_dist_rank(), err.msg);
        for (int64_t t = 0; t < N; t++) coef[t] = 0.0f, el[t] = NAN;
        *sum = NAN;
    }
}

static char *exec_fwd_(server *s, const job *j, int *status) {
    const unsigned char *p = j->payload;
    fwd_header h;
    memcpy(&h, p, sizeof h);
    const int64_t n = h.n;
    const int32_t *len = (const int32_t *)(p + sizeof h);
    int64_t total = 0;
    for (int64_t i = 0; i < n; i++) total += len[i];
    const int32_t *tok = len + n, *tgt = tok + total;
    const float *w = (const float *)(tgt + total), *q = w + total, *adv = q + total;
    int64_t *off = malloc((size_t)(n + 1) * sizeof *off);
    float *lp = calloc((size_t)total + 1, sizeof *lp);
    float *coef = malloc(((size_t)total + 1) * sizeof *coef);
    float *el = malloc(((size_t)total + 1) * sizeof *el);
    if (off == NULL || lp == NULL || coef == NULL || el == NULL)
        engine_die_("forward_backward", &(zdp_error){.msg = "out of memory"});
    off[0] = 0;
    for (int64_t i = 0; i < n; i++) off[i + 1] = off[i] + len[i];

    const bool bwd = j->op == OP_FWDBWD;
    const int64_t rounds = (n + s->W - 1) / s->W;
    static const int32_t pad = 0;
    zdp_error err;
    for (int64_t r = 0; r < rounds; r++) {
        const int64_t i = r * s->W + s->R;
        if (i < n) {
            const int64_t o = off[i];
            /* The model's loss is (1/N) sum_t w_t * CE_t and fills log p(target) per token. */
            zdp_gpt_batch b = {.inputs = tok + o, .targets = tgt + o, .weights = w + o,
                               .logprobs = lp + o, .B = 1, .T = len[i]};
            float loss;
            if (zdp_engine_forward(s->eng, &b, &loss, &err) != ZDP_OK) engine_die_("forward", &err);
            if (!bwd) continue;
            if (h.loss != ZDP_LOSS_CROSS_ENTROPY) {
                /* A policy loss: its gradient is the weighted cross-entropy's with
                 * weights computed from this forward's log-probabilities. */
                double unused;
                datum_loss_(&h, len[i], lp + o, w + o, q + o, adv + o, coef + o, el + o, &unused);
                if (zdp_gpt_set_loss_weights(&s->model, coef + o, len[i], &err) != ZDP_OK)
                    engine_die_("forward_backward", &err);
            }
            /* d(sum_t c_t CE_t)/dθ: times N against the mean over positions, times W
             * against the engine's mean over ranks. */
            if (zdp_engine_backward(s->eng, false, (float)len[i] * (float)s->W, &err) != ZDP_OK)
                engine_die_("backward", &err);
        } else if (bwd) {
            /* No datum left for this rank: a zero-weight micro-batch keeps the
             * backward() count, and stage 2's reductions, equal on all ranks. */
            zdp_gpt_batch b = {.inputs = &pad, .targets = &pad, .B = 1, .T = 1};
            float loss;
            if (zdp_engine_forward(s->eng, &b, &loss, &err) != ZDP_OK) engine_die_("forward", &err);
            if (zdp_engine_backward(s->eng, false, 0.0f, &err) != ZDP_OK) engine_die_("backward", &err);
        }
    }
    /* Each position was filled by exactly one rank, the others hold 0: a sum
     * gathers them exactly. */
    if (s->W > 1) {
        if (s->R == 0)
            MPI_Reduce(MPI_IN_PLACE, lp, (int)total, MPI_FLOAT, MPI_SUM, 0, s->comm);
        else
            MPI_Reduce(lp, NULL, (int)total, MPI_FLOAT, MPI_SUM, 0, s->comm);
    }
    char *body = NULL;
    if (s->R == 0) {
        json_t *outs = json_array();
        double loss_sum = 0;
        for (int64_t i = 0; i < n; i++) {
            const int64_t o = off[i];
            double sum;
            datum_loss_(&h, len[i], lp + o, w + o, q + o, adv + o, coef + o, el + o, &sum);
            loss_sum += sum;
            json_t *lpa = json_array(), *ela = json_array();
            for (int64_t k = o; k < off[i + 1]; k++) {
                json_array_append_new(lpa, serve_jreal(lp[k]));
                json_array_append_new(ela, serve_jreal(el[k]));
            }
            json_array_append_new(
                outs, json_pack("{s:{s:o,s:s,s:[I]},s:{s:o,s:s,s:[I]}}", "logprobs", "data", lpa, "dtype",
                                "float32", "shape", (json_int_t)len[i], "elementwise_loss", "data", ela,
                                "dtype", "float32", "shape", (json_int_t)len[i]));
        }
        json_t *metrics = json_pack("{s:o}", "loss:sum", serve_jreal(loss_sum));
        body = serve_dump(json_pack("{s:s,s:o,s:o}", "loss_fn_output_type", "ArrayRecord",
                                    "loss_fn_outputs", outs, "metrics", metrics));
        *status = 200;
    }
    free(off);
    free(lp);
    free(coef);
    free(el);
    return body;
}

/* optim_step: the request's hyperparameters (the rest keep their values),
 * then the engine's step. */
static char *exec_optim_(server *s, const job *j, int *status) {
    optim_payload p;
    memcpy(&p, j->payload, sizeof p);
    /* Nothing to apply: refused before anything changes (the request's
     * hyperparameters included).  Every rank has the same count. */
    if (zdp_engine_pending_backwards(s->eng) == 0) {
        if (s->R != 0) return NULL;
        *status = 409;
        return serve_error_body(NULL,
                                "optim_step: no forward_backward since the last optim_step, so there is no "
                                "gradient to apply; nothing changed (adam_params included)");
    }
    zdp_hparams h, before;
    zdp_engine_get_hparams(s->eng, &h);
    before = h;
    double *dst[N_ADAM] = {&h.lr, &h.beta1, &h.beta2, &h.eps, &h.weight_decay, &h.gradient_clipping};
    bool any = false;
    for (int k = 0; k < N_ADAM; k++)
        if (p.has[k]) {
            *dst[k] = p.value[k];
            any = true;
        }
    zdp_error err;
    json_t *warnings = s->R == 0 ? json_array() : NULL;
    if (any) {
        /* Validated on rank 0 already; every rank sets the same values, so a
         * value the engine refuses is refused on every rank alike. */
        if (zdp_engine_set_hparams(s->eng, &h, &err) != ZDP_OK) {
            json_decref(warnings);
            if (s->R != 0) return NULL;
            *status = 400;
            return serve_error_body("adam_params", err.msg);
        }
        if (s->R == 0 && s->cfg.optimizer.type == ZDP_OPTIMIZER_SGD && (p.has[1] || p.has[2] || p.has[3]))
            json_array_append_new(warnings, json_string("the engine's optimizer is SGD (from --config): "
                                                        "adam_params beta1, beta2 and eps have no effect"));
    }
    zdp_status st = zdp_engine_step(s->eng, &err);
    if (st == ZDP_ERR_STATE) {
        /* The step did not run: neither do the request's hyperparameters. */
        if (any && zdp_engine_set_hparams(s->eng, &before, &err) != ZDP_OK) engine_die_("optim_step", &err);
        json_decref(warnings);
        if (s->R != 0) return NULL;
        *status = 409;
        return serve_error_body(NULL,
                                "optim_step: no forward_backward since the last optim_step, so there is no "
                                "gradient to apply; nothing changed");
    }
    if (st != ZDP_OK) engine_die_("optim_step", &err);
    if (s->R != 0) return NULL;
    *status = 200;
    /* Metric keys have exactly one ':' (Tinker's rule). */
    return serve_dump(json_pack("{s:{s:o,s:o},s:I,s:I,s:b,s:o}", "metrics", "grad_norm:mean",
                                serve_jreal(zdp_engine_last_grad_norm(s->eng)), "learning_rate:mean",
                                serve_jreal(zdp_engine_last_lr(s->eng)), "step",
                                (json_int_t)zdp_engine_global_steps(s->eng), "global_samples",
                                (json_int_t)zdp_engine_global_samples(s->eng), "step_applied",
                                zdp_engine_was_step_applied(s->eng), "warnings", warnings));
}

static int status_of_(zdp_status st) {
    return st == ZDP_ERR_NOMEM || st == ZDP_ERR_COMM || st == ZDP_ERR_INTERNAL ? 500 : 400;
}

/* POST /sample {prompt: [tokens] | {chunks: [...]}, max_tokens, temperature,
 * top_k, seed}: payload int64 n, max_tokens, top_k, seed; double temperature;
 * int32 tokens[n]. */
typedef struct sample_req {
    int64_t n, max_tokens, top_k, seed;
    double temperature;
} sample_req;

static bool parse_sample_(const json_t *root, const zdp_gpt_config *mc, job *j, verr *e) {
    static const char *const keys[] = {"prompt", "max_tokens", "temperature", "top_k", "seed"};
    if (!serve_only_keys(root, "", keys, 5, e)) return false;
    const json_t *p = json_object_get(root, "prompt");
    /* A plain token list, or a Tinker ModelInput {chunks: [{tokens: [...]}]}. */
    if (json_is_object(p)) {
        const json_t *chunks = json_object_get(p, "chunks");
        if (!json_is_array(chunks) || json_array_size(chunks) != 1 ||
            !json_is_array(json_object_get(json_array_get(chunks, 0), "tokens")))
            return serve_bad(e, 400, "prompt.chunks",
                        "prompt.chunks: must hold one encoded_text chunk with \"tokens\"");
        p = json_object_get(json_array_get(chunks, 0), "tokens");
    }
    if (!json_is_array(p) || json_array_size(p) < 1 || json_array_size(p) > 1000000)
        return serve_bad(e, 400, "prompt", "prompt: must be a non-empty array of token ids (or a "
                                      "ModelInput with one chunk)");
    sample_req r = {.n = (int64_t)json_array_size(p), .max_tokens = 16, .temperature = 1.0};
    const char *names[3] = {"max_tokens", "top_k", "seed"};
    int64_t *dst[3] = {&r.max_tokens, &r.top_k, &r.seed};
    const int64_t hi[3] = {4096, 1 << 24, INT64_MAX};
    for (int k = 0; k < 3; k++) {
        const json_t *v = json_object_get(root, names[k]);
        if (v == NULL) continue;
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > hi[k])
            return serve_bad(e, 400, names[k], "%s: must be an integer in [0, %lld]", names[k],
                        (long long)hi[k]);
        *dst[k] = (int64_t)json_integer_value(v);
    }
    const json_t *t = json_object_get(root, "temperature");
    if (t != NULL && (!json_is_number(t) || !(json_number_value(t) >= 0) || json_number_value(t) > 100))
        return serve_bad(e, 400, "temperature", "temperature: must be a number in [0, 100] (0 = greedy)");
    if (t != NULL) r.temperature = json_number_value(t);
    j->nbytes = (int64_t)sizeof r + r.n * (int64_t)sizeof(int32_t);
    j->payload = malloc((size_t)j->nbytes);
    if (j->payload == NULL) return serve_bad(e, 500, "prompt", "out of memory");
    memcpy(j->payload, &r, sizeof r);
    int32_t *tok = (int32_t *)(j->payload + sizeof r);
    for (int64_t i = 0; i < r.n; i++) {
        const json_t *x = json_array_get(p, (size_t)i);
        char field[48];
        snprintf(field, sizeof field, "prompt[%lld]", (long long)i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= mc->vocab_size)
            return serve_bad(e, 400, field, "%s: must be a token id in [0, %d)", field, mc->vocab_size);
        tok[i] = (int32_t)json_integer_value(x);
    }
    return true;
}

/* Rank 0 alone: generation reads the parameters every rank already holds.
 * Only the last block_size tokens are seen at each step. */
static char *exec_sample_(server *s, const job *j, int *status) {
    if (s->R != 0) return NULL;
    sample_req r;
    memcpy(&r, j->payload, sizeof r);
    const int32_t *prompt = (const int32_t *)(j->payload + sizeof r);
    int32_t *tok = malloc((size_t)(r.n + r.max_tokens) * sizeof *tok);
    float *logits = malloc((size_t)s->opt.model.vocab_size * sizeof *logits);
    float **v = views_(s);
    if (tok == NULL || logits == NULL || v == NULL) {
        free(tok), free(logits), free(v);
        *status = 500;
        return serve_error_body(NULL, "out of memory");
    }
    memcpy(tok, prompt, (size_t)r.n * sizeof *tok);
    uint64_t rng = (uint64_t)r.seed;
    json_t *out = json_array();
    int64_t n = r.n;
    for (int64_t k = 0; k < r.max_tokens; k++) {
        int t = sample_next(&s->model, (const float *const *)v, tok, (int)n, r.temperature,
                            (int)r.top_k, &rng, logits);
        if (t < 0) break;
        tok[n++] = t;
        json_array_append_new(out, json_integer(t));
    }
    free(tok), free(logits), free(v);
    *status = 200;
    return serve_dump(json_pack("{s:[{s:o,s:s}],s:I}", "sequences", "tokens", out, "stop_reason",
                           "length", "prompt_length", (json_int_t)r.n));
}

static int64_t numel_(const zdp_param_info *p) {
    int64_t n = 1;
    for (int d = 0; d < p->ndim; d++) n *= p->shape[d];
    return n;
}

static void free_snapshot_(server *s) {
    for (int i = 0; s->snap != NULL && i < s->model.n_params; i++) free(s->snap[i]);
    free(s->snap);
    free(s->snap_path);
    s->snap = NULL;
    s->snap_path = NULL;
}

/* Tinker's asample (rank 0 alone): num_samples continuations of the prompt
 * from the weights in a sampler file (save_weights_for_sampler), not from the
 * live ones, so training between save and sample changes nothing.  The file
 * read last stays in memory.  Each token comes with the model's log p (what
 * importance-sampling losses take as the sampler's logprobs). */
static char *exec_sample_file_(server *s, const job *j, int *status) {
    if (s->R != 0) return NULL;
    sample_file_header h;
    memcpy(&h, j->payload, sizeof h);
    const int32_t *prompt = (const int32_t *)(j->payload + sizeof h);
    const int32_t *stop = prompt + h.n_prompt;
    const char *path = (const char *)(stop + h.n_stop);
    zdp_error err = {0};
    const int np = s->model.n_params;
    if (s->snap_path == NULL || strcmp(s->snap_path, path) != 0) {
        free_snapshot_(s);
        s->snap = calloc((size_t)np, sizeof *s->snap);
        s->snap_path = strdup(path);
        bool ok = s->snap != NULL && s->snap_path != NULL;
        for (int i = 0; ok && i < np; i++)
            ok = (s->snap[i] = malloc((size_t)numel_(&s->model.params[i]) * sizeof(float))) != NULL;
        zdp_status st = ok ? zdp_gpt_weights_load(path, &s->opt.model, s->model.params, np, s->snap, &err)
                           : ZDP_ERR_NOMEM;
        if (st != ZDP_OK) {
            free_snapshot_(s);
            *status = status_of_(st);
            return serve_error_body("model_path", ok ? err.msg : "out of memory for the sampler weights");
        }
    }
    const int64_t cap = h.n_prompt + h.max_tokens;
    int32_t *tok = malloc((size_t)cap * sizeof *tok);
    float *logits = malloc((size_t)s->opt.model.vocab_size * sizeof *logits);
    if (tok == NULL || logits == NULL) {
        free(tok), free(logits);
        *status = 500;
        return serve_error_body(NULL, "out of memory");
    }
    json_t *seqs = json_array();
    bool failed = false;
    for (int64_t k = 0; k < h.num_samples && !failed; k++) {
        memcpy(tok, prompt, (size_t)h.n_prompt * sizeof *tok);
        int64_t n = h.n_prompt;
        uint64_t rng = h.seed + 0x9E3779B97F4A7C15ull * (uint64_t)k;
        json_t *out = json_array(), *lps = json_array();
        const char *reason = "length";
        for (int64_t m = 0; m < h.max_tokens; m++) {
            float lp;
            int t = sample_next_p(&s->model, (const float *const *)s->snap, tok, (int)n, h.temperature,
                                  (int)h.top_k, h.top_p, &rng, logits, &lp);
            if (t < 0) {
                failed = true;
                break;
            }
            tok[n++] = t;
            json_array_append_new(out, json_integer(t));
            json_array_append_new(lps, serve_jreal(lp));
            bool stopped = false;
            for (int64_t q = 0; q < h.n_stop && !stopped; q++) stopped = stop[q] == t;
            if (stopped) {
                reason = "stop";
                break;
            }
        }
        json_array_append_new(seqs, json_pack("{s:o,s:o,s:s}", "tokens", out, "logprobs", lps, "stop_reason",
                                              reason));
    }
    free(tok), free(logits);
    if (failed) {
        json_decref(seqs);
        *status = 500;
        return serve_error_body(NULL, "sampling failed: see the server's log");
    }
    *status = 200;
    return serve_dump(json_pack("{s:o,s:s}", "sequences", seqs, "type", "sample"));
}

static char *exec_save_weights_(server *s, const job *j, int *status) {
    if (s->R != 0) return NULL;
    const char *path = (const char *)j->payload;
    zdp_error err;
    float **v = views_(s);
    if (v == NULL) {
        *status = 500;
        return serve_error_body("path", "out of memory");
    }
    zdp_status st = zdp_gpt_weights_save(path, s->model.params, s->model.n_params,
                                         (const float *const *)v, &err);
    free(v);
    if (st != ZDP_OK) {
        *status = status_of_(st);
        return serve_error_body("path", err.msg);
    }
    *status = 200;
    return serve_dump(json_pack("{s:s,s:I}", "path", path, "step", (json_int_t)zdp_engine_global_steps(s->eng)));
}

/* path "A/B/TAG" -> dir "A/B", tag "TAG"; "TAG" -> ".", "TAG". */
static void split_path_(const char *path, char *dir, char *tag, size_t cap) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    size_t n = strlen(buf);
    while (n > 1 && buf[n - 1] == '/') buf[--n] = '\0';
    char *slash = strrchr(buf, '/');
    if (slash == NULL) {
        snprintf(dir, cap, ".");
        snprintf(tag, cap, "%s", buf);
    } else {
        snprintf(tag, cap, "%s", slash + 1);
        if (slash == buf) snprintf(dir, cap, "/");
        else {
            *slash = '\0';
            snprintf(dir, cap, "%s", buf);
        }
    }
}

/* Every rank, after a step that failed on some: rank 0 gets why, naming
 * each rank that failed ("rank 1: cannot create ...: Not a directory"), and
 * the status of the first.  Each failing rank > 0 also logs its reason. */
static void failed_ranks_(server *s, zdp_status st, const char *msg, int *first_st, char *out, size_t cap) {
    enum { MSG = ZDP_ERROR_MSG_MAX };
    char mine[MSG + 8];
    memset(mine, 0, sizeof mine);
    int32_t code = (int32_t)st;
    memcpy(mine, &code, sizeof code);
    snprintf(mine + 8, MSG, "%s", st == ZDP_OK ? "" : msg);
    if (st != ZDP_OK && s->R != 0) fprintf(stderr, "[zdp rank %d] zdp serve: %s\n", s->R, msg);
    char *all = s->R == 0 ? calloc((size_t)s->W, sizeof mine) : NULL;
    if (s->R == 0 && all == NULL) engine_die_("serve", &(zdp_error){.msg = "out of memory"});
    MPI_Gather(mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE, 0, s->comm);
    if (s->R != 0) return;
    size_t n = 0;
    out[0] = '\0';
    *first_st = ZDP_ERR_INTERNAL;
    bool first = true;
    for (int r = 0; r < s->W; r++) {
        const char *x = all + (size_t)r * sizeof mine;
        memcpy(&code, x, sizeof code);
        if (code == ZDP_OK) continue;
        if (first) *first_st = code;
        first = false;
        if (n < cap) n += (size_t)snprintf(out + n, cap - n, "%srank %d: %s", n ? "; " : "", r, x + 8);
    }
    free(all);
    serve_utf8_fix(out);
}

static char *exec_state_(server *s, const job *j, int *status) {
    const char *name = (const char *)j->payload;
    char path[4096];
    const bool fits = snprintf(path, sizeof path, "%s%s%s", name[0] == '/' ? "" : s->ckpt_root,
                               name[0] == '/' ? "" : "/", name) < (int)sizeof path;
    if (!zdp_dist_all_ok(fits)) { /* every rank, before the engine's collectives */
        if (s->R != 0) return NULL;
        *status = 400;
        return serve_error_body("path", "path: too long once joined to the checkpoint folder");
    }
    char dir[4096], tag[4096];
    split_path_(path, dir, tag, sizeof dir);
    zdp_error err = {0};
    zdp_status st;
    if (j->op == OP_SAVE_STATE) {
        st = zdp_engine_save_checkpoint(s->eng, dir, tag, "{\"writer\": \"zdp serve\"}", &err);
    } else {
        char *client = NULL;
        st = zdp_engine_load_checkpoint(s->eng, dir, tag, &client, &err);
        free(client);
    }
    bool all = zdp_dist_all_ok(st == ZDP_OK);
    /* A load that succeeded on some ranks only would leave them apart. */
    if (!all && st == ZDP_OK && j->op == OP_LOAD_STATE)
        engine_die_("load_state", &(zdp_error){.msg = "another rank failed to load the checkpoint"});
    char why[2048];
    int bad_st = 0;
    if (!all) failed_ranks_(s, st, err.msg, &bad_st, why, sizeof why);
    if (s->R != 0) return NULL;
    if (!all) {
        *status = status_of_((zdp_status)bad_st);
        return serve_error_body("path", why);
    }
    *status = 200;
    return serve_dump(json_pack("{s:s,s:I,s:I,s:I}", "path", path, "step",
                           (json_int_t)zdp_engine_global_steps(s->eng), "global_samples",
                           (json_int_t)zdp_engine_global_samples(s->eng), "pending_backwards",
                           (json_int_t)zdp_engine_pending_backwards(s->eng)));
}

/* Tinker's load_weights without the optimizer: the weights of a checkpoint
 * (its model.safetensors) and a fresh optimizer state.  Rank 0 reads into
 * scratch memory, so a failed read changes nothing; sync_params then gives
 * every rank the new weights. */
static char *exec_load_weights_(server *s, const job *j, int *status) {
    const char *path = (const char *)j->payload;
    zdp_error err = {0};
    zdp_status st = ZDP_OK;
    if (s->R == 0) {
        const int np = s->model.n_params;
        float **tmp = calloc((size_t)np, sizeof *tmp);
        st = tmp == NULL ? ZDP_ERR_NOMEM : ZDP_OK;
        for (int i = 0; st == ZDP_OK && i < np; i++) {
            tmp[i] = malloc((size_t)numel_(&s->model.params[i]) * sizeof(float));
            if (tmp[i] == NULL) st = ZDP_ERR_NOMEM;
        }
        if (st == ZDP_ERR_NOMEM) snprintf(err.msg, sizeof err.msg, "out of memory for the weights");
        if (st == ZDP_OK)
            st = zdp_gpt_weights_load(path, &s->opt.model, s->model.params, np, tmp, &err);
        for (int i = 0; st == ZDP_OK && i < np; i++)
            memcpy(zdp_engine_param_data(s->eng, i), tmp[i], (size_t)numel_(&s->model.params[i]) * sizeof(float));
        for (int i = 0; tmp != NULL && i < np; i++) free(tmp[i]);
        free(tmp);
    }
    int ok = st == ZDP_OK;
    MPI_Bcast(&ok, 1, MPI_INT, 0, s->comm);
    if (ok) {
        if (zdp_engine_sync_params(s->eng, &err) != ZDP_OK) engine_die_("load_weights", &err);
        zdp_engine_reset_optimizer_state(s->eng);
    }
    if (s->R != 0) return NULL;
    if (!ok) {
        *status = status_of_(st);
        return serve_error_body("path", err.msg);
    }
    *status = 200;
    return serve_dump(json_pack("{s:s,s:I}", "path", path, "step", (json_int_t)zdp_engine_global_steps(s->eng)));
}

static const char *const op_names_[OP_SAMPLE_FILE + 1] = {
    [OP_FWDBWD] = "forward_backward", [OP_FORWARD] = "forward", [OP_OPTIM] = "optim_step",
    [OP_SAVE_WEIGHTS] = "save_weights", [OP_SAVE_STATE] = "save_state", [OP_LOAD_STATE] = "load_state",
    [OP_INFO] = "info", [OP_SAMPLE] = "sample", [OP_LOAD_WEIGHTS] = "load_weights",
    [OP_SAMPLE_FILE] = "asample"};

static int64_t body_inflight_(server *s);

/* The bounds of docs/server.md's "Limits" and what is in use now. */
static json_t *limits_json_(server *s) {
    const union MHD_DaemonInfo *ci =
        s->daemon != NULL ? MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_CURRENT_CONNECTIONS) : NULL;
    return json_pack("{s:I,s:I,s:I,s:i,s:i,s:i,s:i,s:f,s:f}", "max_body_bytes", (json_int_t)s->opt.max_body,
                     "max_inflight_bytes", (json_int_t)s->opt.max_inflight, "inflight_bytes",
                     (json_int_t)body_inflight_(s), "max_connections", s->opt.max_connections,
                     "max_connections_per_ip", s->opt.max_connections_per_ip, "connections",
                     ci != NULL ? (int)ci->num_connections : -1, "idle_timeout_seconds",
                     s->opt.idle_timeout_s, "request_timeout_seconds", s->opt.request_timeout_s,
                     "health_timeout_seconds", s->opt.health_timeout_s);
}

static char *exec_info_(server *s, int *status) {
    zdp_memory_report m;
    zdp_engine_memory_report(s->eng, &m);
    int64_t mine[8] = {m.params_bytes, m.grads_bytes, m.grad_partition_bytes, m.bucket_bytes,
                       m.optimizer_bytes, m.master_bytes, m.other_bytes, m.total_bytes};
    int64_t *all = s->R == 0 ? malloc((size_t)s->W * sizeof mine) : NULL;
    if (s->R == 0 && all == NULL) engine_die_("info", &(zdp_error){.msg = "out of memory"});
    MPI_Gather(mine, 8, MPI_INT64_T, all, 8, MPI_INT64_T, 0, s->comm);
    if (s->R != 0) return NULL;
    json_t *mem = json_array();
    for (int r = 0; r < s->W; r++) {
        int64_t *x = all + 8 * r;
        json_array_append_new(mem, json_pack("{s:i,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I}", "rank", r,
                                             "params_bytes", (json_int_t)x[0], "grads_bytes", (json_int_t)x[1],
                                             "grad_partition_bytes", (json_int_t)x[2], "bucket_bytes",
                                             (json_int_t)x[3], "optimizer_bytes", (json_int_t)x[4],
                                             "master_bytes", (json_int_t)x[5], "other_bytes",
                                             (json_int_t)x[6], "total_bytes", (json_int_t)x[7]));
    }
    free(all);
    const zdp_gpt_config *mc = &s->opt.model;
    const zdp_optimizer_config *oc = &s->cfg.optimizer;
    /* What the next update uses: the config's values until an optim_step's
     * adam_params set others. */
    zdp_hparams hp;
    zdp_engine_get_hparams(s->eng, &hp);
    const char *opt = oc->type == ZDP_OPTIMIZER_SGD ? "SGD" : oc->type == ZDP_OPTIMIZER_ADAMW ? "AdamW" : "Adam";
    json_t *o = json_pack(
        "{s:{s:s,s:i,s:i,s:i,s:i,s:i,s:I},s:i,s:i,s:I,s:I,s:I,s:I,s:I,s:o,s:o,"
        "s:{s:s,s:f,s:f,s:f,s:f,s:f,s:f},s:o,s:I}",
        "model", "arch", "gpt2", "n_layer", mc->n_layer, "n_head", mc->n_head, "n_embd", mc->n_embd,
        "vocab_size", mc->vocab_size, "block_size", mc->block_size, "n_params",
        (json_int_t)zdp_engine_numel(s->eng), "world_size", s->W, "zero_stage", s->cfg.zero.stage, "step",
        (json_int_t)zdp_engine_global_steps(s->eng), "global_samples",
        (json_int_t)zdp_engine_global_samples(s->eng), "micro_steps",
        (json_int_t)zdp_engine_micro_steps(s->eng), "skipped_steps",
        (json_int_t)zdp_engine_skipped_steps(s->eng), "pending_backwards",
        (json_int_t)zdp_engine_pending_backwards(s->eng), "lr", serve_jreal(zdp_engine_lr(s->eng)),
        "last_grad_norm", serve_jreal(zdp_engine_last_grad_norm(s->eng)), "optimizer", "type", opt, "lr",
        hp.lr, "beta1", hp.beta1, "beta2", hp.beta2, "eps", hp.eps, "weight_decay", hp.weight_decay,
        "gradient_clipping", hp.gradient_clipping, "memory", mem, "max_body_bytes",
        (json_int_t)s->opt.max_body);
    /* Server-side timing by request kind (the one being answered not yet
     * counted): how long requests waited in the FIFO and ran on the ranks. */
    json_t *req = json_object();
    for (int op = 0; op <= OP_SAMPLE_FILE; op++) {
        if (op_names_[op] == NULL || s->stats[op].count == 0) continue;
        const double n = (double)s->stats[op].count;
        json_object_set_new(req, op_names_[op],
                            json_pack("{s:I,s:f,s:f,s:f}", "count", (json_int_t)s->stats[op].count,
                                      "mean_queue_ms", 1e3 * s->stats[op].queue_s / n, "mean_exec_ms",
                                      1e3 * s->stats[op].exec_s / n, "max_exec_ms",
                                      1e3 * s->stats[op].exec_max_s));
    }
    json_object_set_new(o, "requests", req);
    json_object_set_new(o, "limits", limits_json_(s));
    *status = 200;
    return serve_dump(o);
}

/* Every rank: runs one request; rank 0 gets the answer. */
static char *exec_(server *s, const job *j, int *status) {
    switch (j->op) {
    case OP_FWDBWD:
    case OP_FORWARD: return exec_fwd_(s, j, status);
    case OP_OPTIM: return exec_optim_(s, j, status);
    case OP_SAVE_WEIGHTS: return exec_save_weights_(s, j, status);
    case OP_SAVE_STATE:
    case OP_LOAD_STATE: return exec_state_(s, j, status);
    case OP_INFO: return exec_info_(s, status);
    case OP_SAMPLE: return exec_sample_(s, j, status);
    case OP_LOAD_WEIGHTS: return exec_load_weights_(s, j, status);
    case OP_SAMPLE_FILE: return exec_sample_file_(s, j, status);
    default:
        engine_die_("serve", &(zdp_error){.msg = "unknown request type from rank 0 (a bug in zdp)"});
    }
    return NULL;
}

/* ---- the request loop ------------------------------------------------------------ */

/* A rank > 0 that got a signal: rank 0 alone decides when every rank
 * leaves (it refuses what is queued and broadcasts OP_QUIT), so this rank
 * tells it and goes on serving until then.  Exiting alone would leave the
 * others in a collective. */
static void notify_stop_(server *s) {
    if (s->R == 0 || g_stop == 0 || s->stop_sent) return;
    s->stop_sig = g_stop;
    fprintf(stderr, "[zdp rank %d] zdp serve: %s received: asking rank 0 to stop every rank\n", s->R,
            s->stop_sig == SIGINT ? "SIGINT" : "SIGTERM");
    MPI_Isend(&s->stop_sig, 1, MPI_INT, 0, TAG_STOP, s->comm, &s->stop_req);
    s->stop_sent = true;
}

/* Rank 0: has a rank > 0 asked to stop?  Then stop as if rank 0 got the
 * signal itself. */
static void poll_stop_(server *s) {
    if (s->W == 1) return;
    int flag = 0;
    MPI_Status st;
    MPI_Iprobe(MPI_ANY_SOURCE, TAG_STOP, s->comm, &flag, &st);
    if (!flag) return;
    int sig = 0;
    MPI_Recv(&sig, 1, MPI_INT, st.MPI_SOURCE, TAG_STOP, s->comm, MPI_STATUS_IGNORE);
    printf("zdp serve: rank %d received %s: stopping every rank\n", st.MPI_SOURCE,
           sig == SIGINT ? "SIGINT" : "SIGTERM");
    fflush(stdout);
    if (g_stop == 0) g_stop = sig;
}

/* Waits for a nonblocking collective without spinning a core: idle ranks
 * sit here between requests (and notice a signal here). */
static void wait_idle_(server *s, MPI_Request *req) {
    int done = 0;
    struct timespec ts = {0, 200000}; /* 0.2 ms */
    for (;;) {
        notify_stop_(s);
        MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (done) return;
        nanosleep(&ts, NULL);
        if (ts.tv_nsec < 2000000) ts.tv_nsec += 100000;
    }
}

static void bcast_job_(server *s, int64_t hdr[2], unsigned char **payload) {
    MPI_Request req;
    MPI_Ibcast(hdr, 2, MPI_INT64_T, 0, s->comm, &req);
    wait_idle_(s, &req);
    if (hdr[0] == OP_QUIT || hdr[1] == 0) return;
    if (s->R != 0) {
        *payload = malloc((size_t)hdr[1]);
        if (*payload == NULL) engine_die_("serve", &(zdp_error){.msg = "out of memory for a request"});
    }
    /* Large requests go in pieces: MPI counts are int. */
    for (int64_t o = 0; o < hdr[1]; o += 1 << 30) {
        int64_t m = hdr[1] - o < (1 << 30) ? hdr[1] - o : (1 << 30);
        MPI_Ibcast(*payload + o, (int)m, MPI_BYTE, 0, s->comm, &req);
        MPI_Wait(&req, MPI_STATUS_IGNORE);
    }
}

static void worker_loop_(server *s) {
    for (;;) {
        int64_t hdr[2] = {0, 0};
        job j = {0};
        bcast_job_(s, hdr, &j.payload);
        if (hdr[0] == OP_QUIT) {
            /* A stop request rank 0 never received (it was stopping anyway)
             * must not keep this rank. */
            if (s->stop_sent) MPI_Request_free(&s->stop_req);
            return;
        }
        if (hdr[0] == OP_PING) {
            MPI_Send(&s->R, 1, MPI_INT, 0, TAG_ACK, s->comm);
            continue;
        }
        j.op = (int)hdr[0];
        j.nbytes = hdr[1];
        int status = 0;
        char *body = exec_(s, &j, &status);
        free(body);
        free(j.payload);
    }
}

static bool needs_all_(int op) { return op != OP_SAVE_WEIGHTS && op != OP_SAMPLE && op != OP_SAMPLE_FILE; }

/* Rank 0, idle: the health check.  Every rank > 0 must answer an OP_PING;
 * until it does, /healthz can name the first rank that has not (a rank
 * that is stopped, stuck or starved cannot answer). */
static void ping_(server *s) {
    pthread_mutex_lock(&s->mu);
    s->ping_since = serve_now();
    s->ping_missing = -1; /* not known yet: the broadcast itself may wait */
    pthread_mutex_unlock(&s->mu);
    int64_t hdr[2] = {OP_PING, 0};
    bcast_job_(s, hdr, NULL);
    MPI_Request *req = malloc((size_t)s->W * sizeof *req);
    int *ack = malloc((size_t)s->W * sizeof *ack);
    if (req == NULL || ack == NULL) engine_die_("serve", &(zdp_error){.msg = "out of memory for a health check"});
    for (int r = 1; r < s->W; r++) MPI_Irecv(&ack[r], 1, MPI_INT, r, TAG_ACK, s->comm, &req[r]);
    struct timespec ts = {0, 200000};
    for (int missing = 1; missing < s->W;) {
        int done = 0;
        MPI_Test(&req[missing], &done, MPI_STATUS_IGNORE);
        if (done) {
            missing++;
            continue;
        }
        if (g_stop) {
            /* Stopping while a rank does not answer: give up on it. */
            for (int r = missing; r < s->W; r++) {
                MPI_Cancel(&req[r]);
                MPI_Wait(&req[r], MPI_STATUS_IGNORE);
            }
            break;
        }
        pthread_mutex_lock(&s->mu);
        s->ping_missing = missing;
        pthread_mutex_unlock(&s->mu);
        nanosleep(&ts, NULL);
        if (ts.tv_nsec < 5000000) ts.tv_nsec += 100000;
    }
    free(req);
    free(ack);
    pthread_mutex_lock(&s->mu);
    s->ping_since = 0;
    s->ping_missing = -1;
    pthread_mutex_unlock(&s->mu);
}

static void leader_loop_(server *s) {
    /* Health checks run when the ranks have been idle this long. */
    const double ping_every = s->opt.health_timeout_s / 2 < 10 ? s->opt.health_timeout_s / 2 : 10;
    double last_busy = serve_now();
    for (;;) {
        poll_stop_(s);
        pthread_mutex_lock(&s->mu);
        tinker_tick_locked(s);
        while (s->head == NULL && !g_stop) {
            if (s->W > 1 && serve_now() - last_busy >= ping_every) {
                pthread_mutex_unlock(&s->mu);
                ping_(s);
                last_busy = serve_now();
                pthread_mutex_lock(&s->mu);
                continue;
            }
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 200000000;
            if (ts.tv_nsec >= 1000000000) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000;
            }
            pthread_cond_timedwait(&s->cv_job, &s->mu, &ts);
            /* Tinker requests held back for a missing seq_id may be due. */
            tinker_tick_locked(s);
            poll_stop_(s);
        }
        if (g_stop) {
            /* Refuse what is queued and what comes, then tell the ranks. */
            s->closed = true;
            for (job *q = s->head, *next; q != NULL; q = next) {
                next = q->next;
                if (q->fut != NULL) {
                    tinker_finish_locked(s, q, 503, serve_error_body(NULL, "the server is shutting down"));
                    continue;
                }
                q->status = 503;
                q->body = serve_error_body(NULL, "the server is shutting down");
                q->done = true;
            }
            tinker_shutdown_locked(s);
            s->head = s->tail = NULL;
            pthread_cond_broadcast(&s->cv_done);
            pthread_mutex_unlock(&s->mu);
            int64_t hdr[2] = {OP_QUIT, 0};
            if (s->W > 1) bcast_job_(s, hdr, NULL);
            return;
        }
        job *j = s->head;
        s->head = j->next;
        if (s->head == NULL) s->tail = NULL;
        s->busy_op = j->op;
        s->busy_since = serve_now();
        pthread_mutex_unlock(&s->mu);

        if (needs_all_(j->op) && s->W > 1) {
            int64_t hdr[2] = {j->op, j->nbytes};
            bcast_job_(s, hdr, &j->payload);
        }
        int status = 500;
        const double t0 = serve_now();
        char *body = exec_(s, j, &status);
        const double t1 = serve_now();
        s->stats[j->op].count++;
        s->stats[j->op].queue_s += t0 - j->queued_at;
        s->stats[j->op].exec_s += t1 - t0;
        if (t1 - t0 > s->stats[j->op].exec_max_s) s->stats[j->op].exec_max_s = t1 - t0;
        last_busy = t1;
        pthread_mutex_lock(&s->mu);
        s->busy_op = -1;
        if (j->fut != NULL) {
            tinker_finish_locked(s, j, status, body);
        } else {
            j->status = status;
            j->body = body;
            j->done = true;
        }
        pthread_cond_broadcast(&s->cv_done);
        pthread_mutex_unlock(&s->mu);
    }
}

/* ---- HTTP (rank 0) ----------------------------------------------------------------- */

typedef struct conn_ctx {
    char *buf;
    size_t len, cap;
    bool too_big;
    bool refused; /* a guard (guard_) answered it already */
    bool no_room;      /* over --max-inflight-bytes: answered 503 */
    int64_t reserved;  /* bytes counted in s->inflight for this request */
    double t0;         /* when its headers were complete */
} conn_ctx;

/* The request-body budget (--max-inflight-bytes): every body byte a
 * connection holds is counted from the moment it is announced (its
 * Content-Length) or arrives (chunked) until the request is answered, so N
 * concurrent maximal bodies cannot exhaust memory; a request over the budget
 * is refused with 503 (the Tinker SDK retries 5xx). */
static bool body_reserve_(server *s, conn_ctx *cx, int64_t n) {
    pthread_mutex_lock(&s->body_mu);
    bool ok = s->inflight + n <= s->opt.max_inflight;
    if (ok) {
        s->inflight += n;
        cx->reserved += n;
    }
    pthread_mutex_unlock(&s->body_mu);
    return ok;
}

static void body_release_(server *s, conn_ctx *cx) {
    pthread_mutex_lock(&s->body_mu);
    s->inflight -= cx->reserved;
    pthread_mutex_unlock(&s->body_mu);
    cx->reserved = 0;
}

static int64_t body_inflight_(server *s) {
    pthread_mutex_lock(&s->body_mu);
    int64_t n = s->inflight;
    pthread_mutex_unlock(&s->body_mu);
    return n;
}

enum MHD_Result serve_reply(struct MHD_Connection *c, int status, char *body) {
    if (body == NULL) {
        body = strdup("{\"error\": {\"message\": \"out of memory\", \"field\": null}}");
        status = 500;
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (r == NULL) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "application/json");
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result reply_error_(struct MHD_Connection *c, int status, const char *field,
                                    const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static enum MHD_Result reply_error_(struct MHD_Connection *c, int status, const char *field,
                                    const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return serve_reply(c, status, serve_error_body(field, msg));
}

typedef struct route {
    const char *path, *method;
    int op;
} route;

static const route routes_[] = {
    {"/forward_backward", "POST", OP_FWDBWD}, {"/forward", "POST", OP_FORWARD},
    {"/optim_step", "POST", OP_OPTIM},        {"/save_weights", "POST", OP_SAVE_WEIGHTS},
    {"/save_state", "POST", OP_SAVE_STATE},   {"/load_state", "POST", OP_LOAD_STATE},
    {"/info", "GET", OP_INFO},                {"/healthz", "GET", -1},
    {"/sample", "POST", OP_SAMPLE},
};
#define N_ROUTES ((int)(sizeof routes_ / sizeof routes_[0]))

void serve_enqueue_locked(server *s, job *j) {
    j->queued_at = serve_now();
    j->next = NULL;
    if (s->tail) s->tail->next = j;
    else s->head = j;
    s->tail = j;
    pthread_cond_signal(&s->cv_job);
}

enum MHD_Result serve_healthz(server *s, struct MHD_Connection *c) {
    const double limit = s->opt.health_timeout_s, now = serve_now();
    char msg[512] = "";
    int rank = -1;
    const char *what = NULL;
    double age = 0;
    pthread_mutex_lock(&s->mu);
    if (s->busy_op >= 0 && now - s->busy_since > limit) {
        what = s->busy_op <= OP_SAMPLE_FILE && op_names_[s->busy_op] ? op_names_[s->busy_op] : "request";
        age = now - s->busy_since;
        snprintf(msg, sizeof msg,
                 "the %s request has run for %.1f s on the ranks, more than --health-timeout-seconds %g: a rank "
                 "is stuck or overloaded (or raise the flag for requests this long)",
                 what, age, limit);
    } else if (s->ping_since > 0 && now - s->ping_since > limit) {
        rank = s->ping_missing;
        what = "health_check";
        age = now - s->ping_since;
        if (rank > 0)
            snprintf(msg, sizeof msg,
                     "rank %d has not answered the health check for %.1f s, more than --health-timeout-seconds "
                     "%g: it is stopped, stuck or starved",
                     rank, age, limit);
        else
            snprintf(msg, sizeof msg,
                     "the ranks have not received the health check for %.1f s, more than "
                     "--health-timeout-seconds %g: a rank is stopped, stuck or starved",
                     age, limit);
    }
    pthread_mutex_unlock(&s->mu);
    if (what == NULL) return serve_reply(c, 200, strdup("{\"status\": \"ok\"}"));
    json_t *o = json_pack("{s:s,s:s,s:f,s:{s:s,s:n}}", "status", "unhealthy", "waiting_for", what, "seconds",
                          age, "error", "message", msg, "field");
    if (o != NULL) json_object_set_new(o, "rank", rank > 0 ? json_integer(rank) : json_null());
    return serve_reply(c, 503, o != NULL ? serve_dump(o) : NULL);
}

/* Queues the job and waits for its answer (requests run one at a time, in
 * the order they were queued). */
static enum MHD_Result run_job_(server *s, struct MHD_Connection *c, job *j) {
    pthread_mutex_lock(&s->mu);
    if (s->closed || g_stop) {
        pthread_mutex_unlock(&s->mu);
        serve_job_free(j);
        return reply_error_(c, 503, NULL, "the server is shutting down");
    }
    serve_enqueue_locked(s, j);
    while (!j->done) pthread_cond_wait(&s->cv_done, &s->mu);
    pthread_mutex_unlock(&s->mu);
    char *body = j->body;
    int status = j->status;
    j->body = NULL;
    serve_job_free(j);
    return serve_reply(c, status, body);
}

static enum MHD_Result handle_(server *s, struct MHD_Connection *c, const char *url,
                               const char *method, conn_ctx *cx) {
    if (strncmp(url, "/api/v1/", 8) == 0)
        return tinker_handle(s, c, url + 8, method, cx->buf, cx->len);
    const route *rt = NULL;
    bool path_known = false;
    for (int i = 0; i < N_ROUTES; i++) {
        if (strcmp(url, routes_[i].path) != 0) continue;
        path_known = true;
        if (strcmp(method, routes_[i].method) == 0) rt = &routes_[i];
    }
    if (rt == NULL && !path_known)
        return reply_error_(c, 404, "url", "%s %s: no such endpoint; POST /forward_backward /forward "
                            "/optim_step /save_weights /save_state /load_state /sample, GET /info /healthz, and the "
                            "Tinker SDK's /api/v1/...",
                            method, url);
    if (rt == NULL) {
        const char *want = "POST";
        for (int i = 0; i < N_ROUTES; i++)
            if (strcmp(url, routes_[i].path) == 0) want = routes_[i].method;
        return reply_error_(c, 405, "method", "%s %s: method not allowed; use %s", method, url, want);
    }
    if (rt->op < 0) return serve_healthz(s, c);
    job *j = calloc(1, sizeof *j);
    if (j == NULL) return reply_error_(c, 500, NULL, "out of memory");
    j->op = rt->op;
    if (rt->op == OP_INFO) return run_job_(s, c, j);

    /* Parse and validate everything before the engine sees anything. */
    json_error_t jerr;
    json_t *root = cx->len == 0 ? json_object()
                                : json_loadb(cx->buf, cx->len, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL) {
        serve_job_free(j);
        return reply_error_(c, 400, "body", "the body is not valid JSON: %s (line %d, column %d)",
                            jerr.text, jerr.line, jerr.column);
    }
    verr e = {0};
    bool ok;
    if (!json_is_object(root)) {
        ok = serve_bad(&e, 400, "body", "the body must be a JSON object, got %s", serve_jtype(root));
    } else if (rt->op == OP_FWDBWD || rt->op == OP_FORWARD) {
        ok = serve_parse_fwd(root, "", &s->opt.model, j, &e);
    } else if (rt->op == OP_OPTIM) {
        static const char *const keys[] = {"adam_params"};
        ok = serve_only_keys(root, "", keys, 1, &e) &&
             serve_parse_optim(json_object_get(root, "adam_params"), "adam_params", false, j, &e);
    } else if (rt->op == OP_SAMPLE) {
        ok = parse_sample_(root, &s->opt.model, j, &e);
    } else {
        ok = parse_path_(s, root, j, &e);
    }
    json_decref(root);
    if (!ok) {
        serve_job_free(j);
        return serve_reply(c, e.status, serve_error_body(e.field, e.msg));
    }
    return run_job_(s, c, j);
}

/* The request deadline for headers.  libmicrohttpd's timeout is an idle
 * timeout, so a client that sends its headers a byte at a time keeps a
 * connection (and its thread) for ever.  Each open connection is tracked
 * from libmicrohttpd's connection notifications; while it is receiving a
 * request's headers (from when it opened, or from the previous answer on
 * it, until access_ first sees the request), a watchdog thread shuts down
 * the socket of one that has taken longer than --request-timeout-seconds,
 * and libmicrohttpd then closes it.  The body has its own deadline in
 * access_.  libmicrohttpd reports a connection closed (conn_notify_, which
 * takes watch_mu) before it closes its socket, so the watchdog never
 * touches a descriptor that has been reused. */
typedef struct conn_watch {
    int fd;
    double since;   /* when it began waiting for a request's headers */
    bool receiving; /* between requests or in their headers */
    bool cut;
    struct conn_watch *prev, *next;
} conn_watch;

static conn_watch *watch_of_(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci != NULL ? ci->socket_context : NULL;
}

/* receiving: the connection waits for a request's headers again (true) or
 * has a whole request head (false). */
static void watch_mark_(server *s, struct MHD_Connection *c, bool receiving) {
    conn_watch *w = watch_of_(c);
    if (w == NULL) return;
    pthread_mutex_lock(&s->watch_mu);
    w->receiving = receiving;
    w->since = serve_now();
    pthread_mutex_unlock(&s->watch_mu);
}

static void conn_notify_(void *cls, struct MHD_Connection *c, void **socket_context,
                         enum MHD_ConnectionNotificationCode toe) {
    server *s = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        conn_watch *w = ci != NULL ? calloc(1, sizeof *w) : NULL;
        if (w == NULL) return; /* not watched: the idle timeout still applies */
        w->fd = ci->connect_fd;
        w->since = serve_now();
        w->receiving = true;
        pthread_mutex_lock(&s->watch_mu);
        w->next = s->watch;
        if (s->watch != NULL) s->watch->prev = w;
        s->watch = w;
        pthread_mutex_unlock(&s->watch_mu);
        *socket_context = w;
    } else if (toe == MHD_CONNECTION_NOTIFY_CLOSED && *socket_context != NULL) {
        conn_watch *w = *socket_context;
        pthread_mutex_lock(&s->watch_mu);
        if (w->prev != NULL) w->prev->next = w->next;
        else s->watch = w->next;
        if (w->next != NULL) w->next->prev = w->prev;
        pthread_mutex_unlock(&s->watch_mu);
        free(w);
        *socket_context = NULL;
    }
}

static void *watchdog_(void *arg) {
    server *s = arg;
    const struct timespec tick = {0, 250000000};
    for (;;) {
        pthread_mutex_lock(&s->watch_mu);
        if (s->watch_stop) {
            pthread_mutex_unlock(&s->watch_mu);
            return NULL;
        }
        const double now = serve_now();
        for (conn_watch *w = s->watch; w != NULL; w = w->next) {
            if (w->receiving && !w->cut && now - w->since > s->opt.request_timeout_s) {
                shutdown(w->fd, SHUT_RDWR);
                w->cut = true;
            }
        }
        pthread_mutex_unlock(&s->watch_mu);
        nanosleep(&tick, NULL);
    }
}

static void watchdog_stop_(server *s) {
    pthread_mutex_lock(&s->watch_mu);
    s->watch_stop = true;
    pthread_mutex_unlock(&s->watch_mu);
    pthread_join(s->watch_thread, NULL);
}

static enum MHD_Result access_(void *cls, struct MHD_Connection *c, const char *url,
                               const char *method, const char *version, const char *upload_data,
                               size_t *upload_data_size, void **con_cls) {
    (void)version;
    server *s = cls;
    conn_ctx *cx = *con_cls;
    if (cx == NULL) {
        cx = calloc(1, sizeof *cx);
        if (cx == NULL) return MHD_NO;
        *con_cls = cx;
        cx->t0 = serve_now();
        watch_mark_(s, c, false);
        verr e = {0};
        if (!guard_(s, c, url, method, &e)) {
            cx->refused = true; /* its body, if any, is read and dropped */
            return serve_reply(c, e.status, serve_error_body(e.field, e.msg));
        }
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl != NULL) {
            char *end;
            errno = 0;
            unsigned long long n = strtoull(cl, &end, 10);
            /* Compared unsigned: a length past INT64_MAX is not negative. */
            if (end != cl && (errno == ERANGE || n > (unsigned long long)s->opt.max_body)) {
                cx->too_big = true;
                return reply_error_(c, 413, "body", "the body has %s bytes, more than --max-body %lld",
                                    cl, (long long)s->opt.max_body);
            }
            if (errno == 0 && end != cl && n > 0 && !body_reserve_(s, cx, (int64_t)n)) {
                cx->no_room = true;
                return reply_error_(c, 503, "body",
                                    "the server already holds %lld bytes of request bodies and this one has "
                                    "%llu (--max-inflight-bytes %lld): retry later",
                                    (long long)body_inflight_(s), n, (long long)s->opt.max_inflight);
            }
        }
        return MHD_YES;
    }
    if (*upload_data_size > 0) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        /* A client that sends its body slower than --request-timeout-seconds
         * allows loses the connection (slow-body attacks hold a thread). */
        if (serve_now() - cx->t0 > s->opt.request_timeout_s) return MHD_NO;
        if (cx->too_big || cx->no_room || cx->refused) return MHD_YES;
        if ((long long)(cx->len + n) > s->opt.max_body) {
            cx->too_big = true;
            free(cx->buf);
            cx->buf = NULL;
            cx->len = cx->cap = 0;
            body_release_(s, cx);
            return MHD_YES;
        }
        /* A chunked body (no Content-Length) is counted as it arrives. */
        if ((int64_t)(cx->len + n) > cx->reserved &&
            !body_reserve_(s, cx, (int64_t)(cx->len + n) - cx->reserved)) {
            cx->no_room = true;
            free(cx->buf);
            cx->buf = NULL;
            cx->len = cx->cap = 0;
            body_release_(s, cx);
            return MHD_YES;
        }
        if (cx->len + n > cx->cap) {
            /* A body of known length gets its exact size at once. */
            size_t cap = cx->cap ? cx->cap : cx->reserved > 4096 ? (size_t)cx->reserved : 4096;
            while (cap < cx->len + n) cap *= 2;
            char *p = realloc(cx->buf, cap);
            if (p == NULL) return MHD_NO;
            cx->buf = p;
            cx->cap = cap;
        }
        memcpy(cx->buf + cx->len, upload_data, n);
        cx->len += n;
        return MHD_YES;
    }
    if (cx->refused) return MHD_YES; /* answered when it arrived */
    if (cx->too_big)
        return reply_error_(c, 413, "body", "the body is larger than --max-body %lld bytes",
                            (long long)s->opt.max_body);
    if (cx->no_room)
        return reply_error_(c, 503, "body",
                            "the server already holds %lld bytes of request bodies (--max-inflight-bytes "
                            "%lld): retry later",
                            (long long)body_inflight_(s), (long long)s->opt.max_inflight);
    return handle_(s, c, url, method, cx);
}

static void completed_(void *cls, struct MHD_Connection *c, void **con_cls,
                       enum MHD_RequestTerminationCode toe) {
    (void)toe;
    watch_mark_(cls, c, true);
    conn_ctx *cx = *con_cls;
    if (cx != NULL) {
        body_release_(cls, cx);
        free(cx->buf);
        free(cx);
        *con_cls = NULL;
    }
}

/* libmicrohttpd's messages ("Server reached connection limit", a client
 * that hung up): at most 10 lines every 10 s, so that a flood of refused
 * connections cannot fill the log; the rest are counted. */
static void http_log_(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static double window;
    static int lines;
    static long dropped;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n > 0 && msg[n - 1] == '\n') msg[--n] = '\0';
    const double now = serve_now();
    pthread_mutex_lock(&mu);
    if (now - window >= 10) {
        if (dropped > 0) fprintf(stderr, "zdp serve: http: %ld more messages in the last 10 s not shown\n", dropped);
        window = now;
        lines = 0;
        dropped = 0;
    }
    if (lines < 10) {
        lines++;
        fprintf(stderr, "zdp serve: http: %s\n", msg);
    } else {
        dropped++;
    }
    pthread_mutex_unlock(&mu);
}

static struct MHD_Daemon *start_http_(server *s, char *why, size_t cap, int *port) {
    struct sockaddr_in a4;
    struct sockaddr_in6 a6;
    struct sockaddr *sa;
    /* One thread per connection: handlers block (a plain request waits for
     * its answer, retrieve_future holds a long poll), which a thread pool
     * would turn into head-of-line blocking of /healthz.  poll(), not
     * select(): descriptors above FD_SETSIZE work. */
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
                     MHD_USE_ERROR_LOG;
    memset(&a4, 0, sizeof a4);
    memset(&a6, 0, sizeof a6);
    static const unsigned char zero[16], v6_loop[16] = {[15] = 1};
    if (inet_pton(AF_INET, s->opt.bind, &a4.sin_addr) == 1) {
        a4.sin_family = AF_INET;
        a4.sin_port = htons((uint16_t)s->opt.port);
        sa = (struct sockaddr *)&a4;
        s->bind_family = AF_INET;
        memcpy(s->bind_addr, &a4.sin_addr, 4);
        s->bind_kind = s->bind_addr[0] == 127 ? 1 : memcmp(s->bind_addr, zero, 4) == 0 ? 2 : 0;
    } else if (inet_pton(AF_INET6, s->opt.bind, &a6.sin6_addr) == 1) {
        a6.sin6_family = AF_INET6;
        a6.sin6_port = htons((uint16_t)s->opt.port);
        sa = (struct sockaddr *)&a6;
        flags |= MHD_USE_IPv6;
        s->bind_family = AF_INET6;
        memcpy(s->bind_addr, &a6.sin6_addr, 16);
        s->bind_kind = memcmp(s->bind_addr, v6_loop, 16) == 0 ? 1 : memcmp(s->bind_addr, zero, 16) == 0 ? 2 : 0;
    } else {
        snprintf(why, cap, "--bind %s: not an IPv4 or IPv6 address (for example 127.0.0.1 or ::1)",
                 s->opt.bind);
        return NULL;
    }
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, (uint16_t)s->opt.port, NULL, NULL, access_, s, MHD_OPTION_SOCK_ADDR, sa,
        MHD_OPTION_NOTIFY_COMPLETED, completed_, s, MHD_OPTION_NOTIFY_CONNECTION, conn_notify_, s,
        MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)s->opt.max_connections, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
        (unsigned)s->opt.max_connections_per_ip, MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)s->opt.idle_timeout_s, MHD_OPTION_EXTERNAL_LOGGER, http_log_, NULL, MHD_OPTION_END);
    if (d == NULL) {
        snprintf(why, cap, "cannot listen on %s port %d (in use, or not an address of this machine)",
                 s->opt.bind, s->opt.port);
        return NULL;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    *port = info != NULL ? info->port : s->opt.port;
    /* Connection threads may already read it (guard_). */
    pthread_mutex_lock(&s->mu);
    s->bound_port = *port;
    pthread_mutex_unlock(&s->mu);
    return d;
}

/* --api-key-file: the key is the file's first line (surrounding blanks
 * dropped).  A missing, unreadable or empty file is an error; a file other
 * users may read is a warning. */
static int load_api_key_(server *s) {
    const char *f = s->opt.api_key_file;
    FILE *fp = fopen(f, "r");
    if (fp == NULL) return cli_fail("--api-key-file %s: %s", f, strerror(errno));
    struct stat sb;
    if (fstat(fileno(fp), &sb) == 0 && (sb.st_mode & (S_IRGRP | S_IROTH)))
        fprintf(stderr, "zdp serve: warning: --api-key-file %s can be read by other users (mode %03o); "
                "chmod 600 %s\n", f, (unsigned)(sb.st_mode & 0777), f);
    char line[4096];
    const bool got = fgets(line, sizeof line, fp) != NULL;
    fclose(fp);
    char *k = line;
    size_t n = got ? strlen(line) : 0;
    while (n > 0 && (k[n - 1] == '\n' || k[n - 1] == '\r' || k[n - 1] == ' ' || k[n - 1] == '\t')) k[--n] = '\0';
    while (n > 0 && (*k == ' ' || *k == '\t')) k++, n--;
    if (n == 0) return cli_fail("--api-key-file %s: empty; write the key on its first line", f);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)k[i] <= 0x20 || (unsigned char)k[i] >= 0x7f)
            return cli_fail("--api-key-file %s: the key must be printable ASCII without blanks (byte %zu is "
                            "0x%02x)", f, i, (unsigned char)k[i]);
    if ((s->api_key = strdup(k)) == NULL) return cli_fail("out of memory");
    s->api_key_len = n;
    memset(line, 0, sizeof line);
    return 0;
}

/* --allow-path-root folders: each must exist; kept as real paths. */
static int load_roots_(server *s) {
    if (s->opt.n_allow_roots == 0) return 0;
    s->roots_real = calloc((size_t)s->opt.n_allow_roots, sizeof *s->roots_real);
    if (s->roots_real == NULL) return cli_fail("out of memory");
    for (int i = 0; i < s->opt.n_allow_roots; i++) {
        const char *r = s->opt.allow_roots[i];
        struct stat sb;
        if ((s->roots_real[i] = realpath(r, NULL)) == NULL)
            return cli_fail("--allow-path-root %s: %s", r, strerror(errno));
        if (stat(s->roots_real[i], &sb) != 0 || !S_ISDIR(sb.st_mode))
            return cli_fail("--allow-path-root %s: not a directory", r);
    }
    return 0;
}

static void free_guards_(server *s) {
    for (int i = 0; s->roots_real != NULL && i < s->opt.n_allow_roots; i++) free(s->roots_real[i]);
    free(s->roots_real);
    if (s->api_key != NULL) memset(s->api_key, 0, s->api_key_len);
    free(s->api_key);
    free((void *)s->opt.allow_roots);
    free((void *)s->opt.allow_hosts);
}

/* ---- the command ------------------------------------------------------------------- */

int cmd_serve(int argc, char **argv) {
    server s = {.W = zdp_dist_world_size(), .R = zdp_dist_rank()};
    int rc = parse_(argc, argv, &s.opt);
    if (rc == 1) { /* --help */
        free_guards_(&s);
        return 0;
    }

    /* Start-up: every step that can fail on one rank alone (its own config
     * or --init file) runs only while this rank is fine, and all ranks meet
     * at cli_agree, which prints what failed on which rank, before the
     * first collective. */
    zdp_error err;
    if (rc == 0 && zdp_config_load_file(s.opt.config, s.W, &s.cfg, &err) != ZDP_OK)
        rc = cli_fail("%s", err.msg);
    /* Every rank's own checkpoint folder (save_state writes a part on each). */
    if (rc == 0 && (serve_mkdirs(s.opt.checkpoint_dir) != 0 ||
                    (s.ckpt_root = realpath(s.opt.checkpoint_dir, NULL)) == NULL))
        rc = cli_fail("--checkpoint-dir %s: cannot create or open it: %s", s.opt.checkpoint_dir, strerror(errno));
    if (rc == 0 && s.cfg.managed_gradient_accumulation)
        rc = cli_fail("%s: zdp serve needs unmanaged gradient accumulation (each optim_step request "
                      "is the optimizer step); set \"managed_gradient_accumulation\": false",
                      s.opt.config);
    /* One datum per micro-batch: activation memory for one sequence. */
    if (rc == 0 && zdp_gpt_create(&s.opt.model, 1, &s.model, &err) != ZDP_OK)
        rc = cli_fail("%s", err.msg);
    if (rc == 0 && zdp_engine_create(&s.cfg, &s.model, &s.eng, &err) != ZDP_OK)
        rc = cli_fail("%s", err.msg);
    if (rc == 0) {
        float **v = views_(&s);
        if (v == NULL) rc = cli_fail("out of memory");
        else if (s.opt.init != NULL) {
            if (zdp_gpt_weights_load(s.opt.init, &s.opt.model, s.model.params, s.model.n_params, v,
                                     &err) != ZDP_OK)
                rc = cli_fail("--init %s", err.msg);
        } else {
            zdp_gpt_init_params(&s.model, v, s.opt.seed);
        }
        free(v);
    }
    if ((rc = cli_agree(rc)) != 0) goto done;
    if (zdp_engine_sync_params(s.eng, &err) != ZDP_OK) cli_die("sync params", &err);
    MPI_Comm_dup(MPI_COMM_WORLD, &s.comm);

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal_;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    struct MHD_Daemon *d = NULL;
    int port = 0;
    bool watching = false;
    if (s.R == 0) {
        pthread_mutex_init(&s.mu, NULL);
        pthread_mutex_init(&s.body_mu, NULL);
        pthread_mutex_init(&s.watch_mu, NULL);
        s.busy_op = -1;
        s.ping_missing = -1;
        pthread_cond_init(&s.cv_job, NULL);
        pthread_cond_init(&s.cv_done, NULL);
        s.tinker = tinker_create();
        char why[512];
        if (s.tinker == NULL) rc = cli_fail("out of memory");
        if (rc == 0 && s.opt.api_key_file != NULL) rc = load_api_key_(&s);
        if (rc == 0) rc = load_roots_(&s);
        if (rc == 0) {
            if (pthread_create(&s.watch_thread, NULL, watchdog_, &s) != 0) {
                rc = cli_fail("cannot start a thread");
            } else {
                watching = true;
                if ((d = start_http_(&s, why, sizeof why, &port)) == NULL) rc = cli_fail("%s", why);
            }
        }
        s.daemon = d;
    }
    if ((rc = cli_agree(rc)) != 0) {
        if (d != NULL) MHD_stop_daemon(d);
        if (watching) watchdog_stop_(&s);
        tinker_destroy(s.tinker);
        MPI_Comm_free(&s.comm);
        goto done;
    }
    if (s.R == 0) {
        /* The pid: SIGTERM or SIGINT to rank 0 stops every rank cleanly
         * (a signal to mpirun makes it kill the ranks instead). */
        printf("zdp serve: listening on http://%s%s%s:%d | gpt L=%d H=%d C=%d V=%d T=%d | %d rank(s) | "
               "ZeRO stage %d | rank 0 pid %ld\n",
               strchr(s.opt.bind, ':') ? "[" : "", s.opt.bind, strchr(s.opt.bind, ':') ? "]" : "", port,
               s.opt.model.n_layer, s.opt.model.n_head, s.opt.model.n_embd, s.opt.model.vocab_size,
               s.opt.model.block_size, s.W, s.cfg.zero.stage, (long)getpid());
        if (s.api_key == NULL)
            fprintf(stderr, "zdp serve: warning: no --api-key-file: any program that can connect to %s port %d "
                    "can train this model and write checkpoints in %s; on a shared machine give the server a "
                    "key (docs/server.md, \"Threat model\")\n", s.opt.bind, port, s.opt.checkpoint_dir);
        fflush(stdout);
        leader_loop_(&s);
        MHD_stop_daemon(d);
        s.daemon = NULL;
        watchdog_stop_(&s);
        pthread_mutex_destroy(&s.mu);
        pthread_mutex_destroy(&s.body_mu);
        pthread_mutex_destroy(&s.watch_mu);
        pthread_cond_destroy(&s.cv_job);
        pthread_cond_destroy(&s.cv_done);
        tinker_destroy(s.tinker);
        free_snapshot_(&s);
        printf("zdp serve: stopped at step %lld\n", (long long)zdp_engine_global_steps(s.eng));
        fflush(stdout);
    } else {
        worker_loop_(&s);
    }
    MPI_Comm_free(&s.comm);
done:
    free_guards_(&s);
    free(s.ckpt_root);
    zdp_engine_destroy(s.eng);
    zdp_gpt_destroy(&s.model);
    return rc;
}
