/*
 * cli.c -- helpers shared by the zdp commands (see cli.h).
 */
#define _POSIX_C_SOURCE 200809L
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

/* This rank's last start-up error, until cli_agree or cli_flush_error
 * prints it. */
static char pending_[ZDP_ERROR_MSG_MAX];

int cli_fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pending_, sizeof pending_, fmt, ap);
    va_end(ap);
    return 2;
}

/* "zdp: error: " before the first line of text, later lines indented. */
static void print_error_(const char *text) {
    const char *prefix = "zdp: error: ";
    while (*text) {
        const char *nl = strchr(text, '\n');
        int n = nl != NULL ? (int)(nl - text) : (int)strlen(text);
        fprintf(stderr, "%s%.*s\n", prefix, n, text);
        prefix = "  ";
        text += n + (nl != NULL);
    }
    fflush(stderr);
}

int cli_agree(int rc) {
    char *report = NULL;
    bool ok = zdp_dist_all_ok_why(rc == 0, pending_, &report);
    if (!ok && zdp_dist_rank() == 0)
        print_error_(report != NULL ? report : "a rank failed at start-up (out of memory for its message)");
    free(report);
    pending_[0] = '\0';
    if (ok) return 0;
    return rc != 0 ? rc : 2; /* another rank failed and rank 0 said why */
}

void cli_flush_error(void) {
    if (pending_[0] != '\0' && zdp_dist_rank() == 0) print_error_(pending_);
    pending_[0] = '\0';
}

void cli_die(const char *what, const zdp_error *err) {
    char msg[ZDP_ERROR_MSG_MAX + 128];
    snprintf(msg, sizeof msg, "%s: %s", what, err->msg);
    cli_abort(msg);
}

void cli_abort(const char *msg) {
    zdp_dist_abort(1, msg); /* returns only without MPI */
    exit(1);
}

int cli_check_finite(const char *flag, const char *path, const char *name, const float *v,
                     int64_t n, int64_t cols) {
    for (int64_t i = 0; i < n; i++) {
        if (isfinite(v[i])) continue;
        if (cols > 0)
            return cli_fail("%s %s: %s[%lld, %lld] = %g (row, column): values must be finite "
                            "(NaN or Inf would make every step skip); fix: clean or regenerate "
                            "the file", flag, path, name, (long long)(i / cols),
                            (long long)(i % cols), (double)v[i]);
        return cli_fail("%s %s: %s[%lld] = %g: values must be finite (NaN or Inf would make "
                        "every step skip); fix: clean or regenerate the file",
                        flag, path, name, (long long)i, (double)v[i]);
    }
    return 0;
}

int cli_max_skipped_option(const char *v, int64_t *max) {
    const cli_opt opt = CLI_MAX_SKIPPED_ROW(max);
    return cli_take_option(&opt, 1, opt.flag, v);
}

int cli_skip_guard(const zdp_engine *eng, int64_t max, int64_t *run) {
    if (zdp_engine_was_step_applied(eng)) {
        *run = 0;
        return 0;
    }
    if (++*run < max || max <= 0) return 0;
    const int64_t last = zdp_engine_global_steps(eng);
    const double norm = zdp_engine_last_grad_norm(eng);
    if (zdp_dist_rank() == 0) {
        char cause[256];
        if (!isfinite(norm))
            snprintf(cause, sizeof cause, "the gradient had NaN or Inf (global grad norm %g); "
                     "check the data and --init for NaN/Inf, lower the learning rate, or set "
                     "gradient_clipping", norm);
        else
            snprintf(cause, sizeof cause, "the update with lr = %g would have made the weights "
                     "NaN or Inf (global grad norm %g); lower the learning rate or set "
                     "gradient_clipping", zdp_engine_lr(eng), norm);
        fprintf(stderr,
                "zdp: error: training stopped: the last %lld optimizer steps (%lld to %lld) were "
                "all skipped, so nothing is being learned: %s.  --max-skipped-steps %lld sets "
                "how many skipped steps in a row end the run (0: never)\n",
                (long long)*run, (long long)(last - *run + 1), (long long)last, cause,
                (long long)max);
    }
    return 1;
}

bool cli_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi) return false;
    *out = v;
    return true;
}

bool cli_parse_double(const char *s, double lo, double hi, double *out) {
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (errno != 0 || end == s || *end != '\0' || !(v >= lo && v <= hi)) return false;
    *out = v;
    return true;
}

/* ---- the option loop ------------------------------------------------------------- */

/* Appends v to o's list: 1, or 2 with "out of memory" recorded. */
static int append_(const cli_opt *o, const char *v) {
    const char ***list = o->ptr;
    const char **grown = realloc((void *)*list, (size_t)(*o->count + 1) * sizeof *grown);
    if (grown == NULL) {
        cli_fail("out of memory");
        return 2;
    }
    grown[(*o->count)++] = v;
    *list = grown;
    return 1;
}

/* Stores v into o's pointer: 1, or 2 with "FLAG VALUE: NEED" recorded. */
static int take_value_(const cli_opt *o, const char *v) {
    int64_t n = 0;
    switch (o->kind) {
    case CLI_OPT_STR: *(const char **)o->ptr = v; return 1;
    case CLI_OPT_IGNORE: return 1;
    case CLI_OPT_FLAG: *(int *)o->ptr = (int)o->lo; return 1; /* cli_take_option's caller */
    case CLI_OPT_SCHEDULE: return cli_parse_schedule(v, o->ptr) == 0 ? 1 : 2;
    case CLI_OPT_I64:
    case CLI_OPT_INT:
    case CLI_OPT_U64:
        if (!cli_parse_i64(v, o->lo, o->hi, &n)) break;
        if (o->kind == CLI_OPT_I64) *(int64_t *)o->ptr = n;
        else if (o->kind == CLI_OPT_INT) *(int *)o->ptr = (int)n;
        else *(uint64_t *)o->ptr = (uint64_t)n;
        return 1;
    case CLI_OPT_F64:
        if (!cli_parse_double(v, o->dlo, o->dhi, o->ptr)) break;
        return 1;
    case CLI_OPT_CHOICE:
        for (int i = 0; o->choices[i] != NULL; i++) {
            if (strcmp(v, o->choices[i]) != 0) continue;
            if (o->ptr != NULL) *(int *)o->ptr = o->values[i];
            return 1;
        }
        break;
    case CLI_OPT_WORD:
    case CLI_OPT_LIST:
        if (v[0] == '\0') {
            cli_fail("%s: must not be empty", o->flag);
            return 2;
        }
        if (o->reject != NULL && strpbrk(v, o->reject) != NULL) break;
        if (o->kind == CLI_OPT_WORD) {
            *(const char **)o->ptr = v;
            return 1;
        }
        return append_(o, v);
    }
    cli_fail("%s %s: %s", o->flag, v, o->need);
    return 2;
}

int cli_take_option(const cli_opt *opts, int n, const char *a, const char *v) {
    for (int k = 0; k < n; k++)
        if (strcmp(a, opts[k].flag) == 0) return take_value_(&opts[k], v);
    return 0;
}

int cli_parse_options(const cli_command *cmd, const cli_opt *opts, int n, int argc,
                      char **argv) {
    for (int i = 0; i < argc; i += 2) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) return 1;
        /* A switch takes no value. */
        int k = 0;
        while (k < n && !(opts[k].kind == CLI_OPT_FLAG && strcmp(a, opts[k].flag) == 0)) k++;
        if (k < n) {
            *(int *)opts[k].ptr = (int)opts[k].lo;
            i--;
            continue;
        }
        /* ... nor is a switch a value ("--tokenizer --decode" lacks the directory). */
        bool value_is_switch = false;
        for (int j = 0; i + 1 < argc && j < n; j++)
            value_is_switch |= opts[j].kind == CLI_OPT_FLAG && strcmp(argv[i + 1], opts[j].flag) == 0;
        if ((cmd->dashes && strncmp(a, "--", 2) != 0) || i + 1 >= argc || value_is_switch)
            return cli_fail("%s: %s", a, cmd->missing);
        int taken = cli_take_option(opts, n, a, argv[i + 1]);
        if (taken == 2) return 2;
        if (taken == 0) return cli_fail("unknown option %s%s", a, cmd->unknown);
    }
    return 0;
}

int cli_parse_schedule(const char *s, cli_schedule *out) {
    char buf[8192];
    if (strlen(s) >= sizeof buf)
        return cli_fail("--schedule: list too long (at most %d entries)", CLI_MAX_SCHEDULE);
    strcpy(buf, s);
    out->len = 0;
    for (char *tok = strtok(buf, ","); tok != NULL; tok = strtok(NULL, ",")) {
        if (out->len == CLI_MAX_SCHEDULE)
            return cli_fail("--schedule: more than %d entries", CLI_MAX_SCHEDULE);
        int64_t v;
        if (!cli_parse_i64(tok, 1, 1 << 20, &v))
            return cli_fail("--schedule: entry %d = \"%s\": each entry is a micro-batch count "
                            ">= 1 (for example --schedule 2,5,3)",
                            out->len + 1, tok);
        out->n[out->len++] = v;
    }
    if (out->len == 0) return cli_fail("--schedule: empty; give counts like 2,5,3");
    return 0;
}

int64_t cli_window(const cli_schedule *sch, bool managed, int64_t G, int64_t s) {
    if (managed || sch->len == 0) return G;
    return sch->n[s % sch->len];
}

double cli_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void cli_format_eta(double seconds, char *out, int n) {
    if (!isfinite(seconds) || seconds < 0) seconds = 0;
    long s = (long)(seconds + 0.5);
    if (s >= 3600) snprintf(out, (size_t)n, "%ldh%02ldm", s / 3600, (s % 3600) / 60);
    else if (s >= 60) snprintf(out, (size_t)n, "%ldm%02lds", s / 60, s % 60);
    else snprintf(out, (size_t)n, "%lds", s);
}

int cli_gpt_option(const char *a, const char *v, zdp_gpt_config *c) {
    const cli_opt opts[] = {CLI_GPT_ROWS(c)};
    return cli_take_option(opts, (int)(sizeof opts / sizeof opts[0]), a, v);
}

/* ---- checkpoints ---------------------------------------------------------------- */

int cli_ckpt_option(const char *a, const char *v, cli_ckpt *c) {
    const cli_opt opts[] = {CLI_CKPT_ROWS(c)};
    return cli_take_option(opts, (int)(sizeof opts / sizeof opts[0]), a, v);
}

int cli_check_output(const char *flag, const char *path, bool is_dir) {
    /* Check, do not create: a run that fails later at start-up leaves no
     * trace.  A directory is checked itself if it exists, else its nearest
     * existing ancestor (the first save creates it); a file's directory must
     * exist (the writers create no directories). */
    char dir[4096];
    if (snprintf(dir, sizeof dir, "%s", path) >= (int)sizeof dir)
        return cli_fail("%s: the path is longer than %d bytes", flag, (int)sizeof dir - 1);
    struct stat sb;
    if (!is_dir && stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
        return cli_fail("%s %s: is a directory; fix: give a file name", flag, path);
    bool self = is_dir;
    for (bool up = !is_dir;; up = true) {
        if (up) {
            char *slash = strrchr(dir, '/');
            while (slash != NULL && slash > dir && slash[1] == '\0') { /* trailing '/' */
                *slash = '\0';
                slash = strrchr(dir, '/');
            }
            if (slash == NULL) snprintf(dir, sizeof dir, ".");
            else if (slash == dir) dir[1] = '\0'; /* "/" */
            else *slash = '\0';
            self = false;
        }
        if (stat(dir, &sb) == 0) break;
        if (errno != ENOENT || !is_dir)
            return cli_fail("%s %s: %s: %s; fix: %s", flag, path, dir, strerror(errno),
                            is_dir ? "a directory this rank can create"
                                   : "create that directory first, or give another path");
    }
    if (!S_ISDIR(sb.st_mode))
        return cli_fail("%s %s: %s exists and is not a directory; fix: another path", flag, path,
                        dir);
    if (access(dir, W_OK | X_OK) != 0)
        return cli_fail("%s %s: %s%s is not writable on this rank (%s); fix: a directory this "
                        "rank can write", flag, path, self ? "" : "its directory ", dir,
                        strerror(errno));
    return 0;
}

int cli_ckpt_prepare(const cli_ckpt *c) {
    return c->save_dir != NULL ? cli_check_output("--save-dir", c->save_dir, true) : 0;
}

int cli_ckpt_resume(zdp_engine *eng, const cli_ckpt *c, int64_t *cursor) {
    *cursor = 0;
    if (c->resume == NULL) return 0;
    zdp_error err;
    char *client = NULL;
    /* Loading is collective and fails on every rank when one cannot read
     * its files; each rank's own message goes to the agreement. */
    if (zdp_engine_load_checkpoint(eng, c->resume, NULL, &client, &err) != ZDP_OK)
        return cli_agree(cli_fail("--resume %s", err.msg));
    json_error_t je;
    json_t *j = json_loads(client, 0, &je);
    json_t *v = json_object_get(j, "samples_consumed");
    int rc = 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        rc = cli_fail("--resume %s: the checkpoint has no data position (\"samples_consumed\" "
                      "in its client state); it was not written by zdp train", c->resume);
    else
        *cursor = (int64_t)json_integer_value(v);
    json_decref(j);
    free(client);
    rc = cli_agree(rc);
    if (rc == 0 && zdp_dist_rank() == 0)
        printf("resumed from %s: step %lld, %lld samples consumed\n", c->resume,
               (long long)zdp_engine_global_steps(eng), (long long)*cursor);
    return rc;
}

void cli_ckpt_after_step(zdp_engine *eng, const cli_ckpt *c, int64_t cursor, bool last) {
    if (c->save_dir == NULL) return;
    int64_t step = zdp_engine_global_steps(eng);
    bool due = c->save_every > 0 && step % c->save_every == 0;
    if (!due && !last) return;
    char tag[64], client[96];
    snprintf(tag, sizeof tag, "global_step%lld", (long long)step);
    snprintf(client, sizeof client, "{\"samples_consumed\": %lld}", (long long)cursor);
    zdp_error err;
    if (zdp_engine_save_checkpoint(eng, c->save_dir, tag, client, &err) != ZDP_OK)
        cli_die("checkpoint", &err);
}

/* ---- the engine's parameters as whole tensors ---------------------------- */

float **cli_params_views(zdp_engine *eng, const zdp_model *model, bool gather) {
    const int np = model->n_params;
    float **v = calloc((size_t)np, sizeof *v);
    if (v == NULL) {
        cli_fail("out of memory for %d tensor views", np);
        return NULL;
    }
    if (zdp_engine_config(eng)->zero.stage < 3) {
        for (int i = 0; i < np; i++) v[i] = zdp_engine_param_data(eng, i);
        return v;
    }
    /* Stage 3: one block for every tensor, views[0] at its start.  A
     * gather's whole copy is rank 0's alone: the other ranks take part in
     * each tensor's gather through one buffer of the largest tensor's size,
     * so they never hold the whole model. */
    const bool whole = !gather || zdp_dist_rank() == 0;
    int64_t n = whole ? zdp_engine_numel(eng) : 0;
    for (int i = 0; !whole && i < np; i++) {
        int64_t k = 1;
        for (int d = 0; d < model->params[i].ndim; d++) k *= model->params[i].shape[d];
        if (k > n) n = k;
    }
    float *block = calloc((size_t)n, sizeof(float));
    int rc = block == NULL ? cli_fail("out of memory for the whole model (%lld parameters; ZeRO "
                                      "stage 3 gathers it here)",
                                      (long long)n)
                           : 0;
    /* The gathers are collective: every rank has its block first. */
    if (gather) rc = cli_agree(rc);
    for (int i = 0; rc == 0 && i < np; i++) v[i] = whole ? block + zdp_engine_param_offset(eng, i) : block;
    zdp_error err = {0};
    for (int i = 0; rc == 0 && gather && i < np; i++)
        if (zdp_engine_get_param(eng, i, v[i], &err) != ZDP_OK) rc = cli_fail("%s", err.msg);
    if (rc != 0) {
        free(block);
        free(v);
        return NULL;
    }
    return v;
}

int cli_params_push(zdp_engine *eng, const zdp_model *model, float **views) {
    zdp_error err = {0};
    if (zdp_engine_config(eng)->zero.stage == 3 && views != NULL)
        for (int i = 0; i < model->n_params; i++)
            if (zdp_engine_set_param(eng, i, views[i], &err) != ZDP_OK) return cli_fail("%s", err.msg);
    if (zdp_engine_sync_params(eng, &err) != ZDP_OK) return cli_fail("%s", err.msg);
    return 0;
}

void cli_params_free(zdp_engine *eng, float **views) {
    if (views == NULL) return;
    if (zdp_engine_config(eng)->zero.stage == 3) free(views[0]);
    free(views);
}

/* ---- --memory-report ---------------------------------------------------------- */

/* This process's peak resident memory (VmHWM in /proc/self/status), -1
 * where the file or the line is missing (not Linux). */
static int64_t vm_hwm_bytes_(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (f == NULL) return -1;
    char line[256];
    long long kb = -1;
    while (fgets(line, sizeof line, f) != NULL)
        if (sscanf(line, "VmHWM: %lld kB", &kb) == 1) break;
    fclose(f);
    return kb < 0 ? -1 : kb * 1024;
}

/* Rank r's x on every rank: a mean of one non-zero term (exact below 2^53). */
static int64_t from_rank_(int r, int64_t x) {
    const int W = zdp_dist_world_size();
    return (int64_t)llround(zdp_dist_mean(zdp_dist_rank() == r ? (double)x : 0.0) * W);
}

int cli_memory_peaks(void) {
    const int W = zdp_dist_world_size();
    const int64_t hwm = vm_hwm_bytes_(), load = zdp_hf_load_peak_bytes();
    for (int r = 0; r < W; r++) {
        const int64_t h = from_rank_(r, hwm), l = from_rank_(r, load);
        if (zdp_dist_rank() == 0) {
            printf("memory | rank %d | peak_rss | %lld B\n", r, (long long)h);
            printf("memory | rank %d | load_peak | %lld B\n", r, (long long)l);
        }
    }
    fflush(stdout);
    return 0;
}

const char *const cli_on_off_words[] = {"on", "off", NULL};
const int cli_on_off_values[] = {1, 0};

int cli_memory_report(zdp_engine *eng) {
    const int W = zdp_dist_world_size();
    zdp_memory_report *m = calloc((size_t)W, sizeof *m);
    zdp_error err = {0};
    /* calloc failing on one rank alone would leave the others waiting. */
    if (!zdp_dist_all_ok(m != NULL)) {
        free(m);
        return cli_fail("--memory-report: out of memory");
    }
    if (zdp_engine_memory_report_all(eng, m, &err) != ZDP_OK) {
        free(m);
        return cli_fail("--memory-report: %s", err.msg);
    }
    if (zdp_dist_rank() == 0) {
        for (int r = 0; r < W; r++) {
            const struct {
                const char *name;
                int64_t bytes;
            } rows[] = {{"params", m[r].params_bytes},
                        {"grads", m[r].grads_bytes},
                        {"grad_partition", m[r].grad_partition_bytes},
                        {"buckets", m[r].bucket_bytes},
                        {"optimizer", m[r].optimizer_bytes},
                        {"gathered", m[r].gathered_bytes},
                        {"gathered_peak", m[r].gathered_peak_bytes},
                        {"frozen", m[r].frozen_bytes},
                        {"other", m[r].other_bytes},
                        {"total", m[r].total_bytes},
                        {"activations", m[r].activation_bytes}};
            for (size_t k = 0; k < sizeof rows / sizeof rows[0]; k++)
                printf("memory | rank %d | %s | %lld B\n", r, rows[k].name, (long long)rows[k].bytes);
        }
        fflush(stdout);
    }
    free(m);
    return 0;
}
