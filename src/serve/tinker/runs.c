/*
 * runs.c -- training runs and checkpoints as the Tinker SDK's
 * RestClient reads them (docs/tinker-protocol.md, "Training runs and
 * checkpoints"), all from the checkpoint folder, so they outlive the server:
 *
 *   CKPT/.zdp-sessions          the last session number handed out: session
 *                               ids (s1, s2, ...) and so run ids
 *                               ("s7:train:0") and checkpoint folders never
 *                               repeat across restarts on one folder
 *   CKPT/<run dir>/run.json     {training_run_id, base_model, is_lora,
 *                               lora_rank, created}: written by create_model
 *   CKPT/<run dir>/<name>/      a save_state checkpoint ("weights/<name>")
 *   CKPT/<run dir>/sampler_weights/<name>.safetensors
 *                               a save_weights_for_sampler ("sampler_weights/<name>")
 *
 * GETs read the folder on rank 0's connection thread (no engine involved);
 * DELETE of a checkpoint is a job on the queue (OP_DELETE_CKPT, every rank
 * removes its own part), so it never runs while a load of it runs.
 */
#define _POSIX_C_SOURCE 200809L
#define _XOPEN_SOURCE 700
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "tinker/tinker.h"

#define SESSIONS_FILE_ ".zdp-sessions"

/* ---- the session counter ------------------------------------------------------------- */

bool tinker_runs_restore(server *s, char *why, size_t cap) {
    if (s->ckpt_root == NULL) return true; /* no folder (the in-process C tests) */
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/" SESSIONS_FILE_, s->ckpt_root);
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        if (errno == ENOENT) return true; /* a new folder: s1 first */
        snprintf(why, cap, "--checkpoint-dir: cannot read %s: %s", path, strerror(errno));
        return false;
    }
    long long n = -1;
    char extra;
    const int got = fscanf(f, "%lld %c", &n, &extra);
    fclose(f);
    if (got != 1 || n < 0) {
        snprintf(why, cap, "--checkpoint-dir: %s must hold one integer >= 0 (the last session number "
                 "zdp serve handed out); remove it only if no run folder of an earlier server is kept", path);
        return false;
    }
    s->tinker->n_sessions = n;
    return true;
}

bool tinker_runs_next_session(server *s, int64_t *n, char *why, size_t cap) {
    char path[PATH_MAX + 64], tmp[PATH_MAX + 80];
    snprintf(path, sizeof path, "%s/" SESSIONS_FILE_, s->ckpt_root);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    const int64_t next = s->tinker->n_sessions + 1;
    FILE *f = fopen(tmp, "w");
    bool ok = f != NULL && fprintf(f, "%lld\n", (long long)next) > 0;
    if (f != NULL && fclose(f) != 0) ok = false;
    if (!ok || rename(tmp, path) != 0) {
        snprintf(why, cap, "cannot write %s: %s (--checkpoint-dir)", path, strerror(errno));
        unlink(tmp);
        return false;
    }
    s->tinker->n_sessions = next;
    *n = next;
    return true;
}

/* ---- run records --------------------------------------------------------------------- */

static void iso_time_(double t, char *out, size_t cap) {
    const time_t tt = (time_t)t;
    struct tm tm;
    gmtime_r(&tt, &tm);
    strftime(out, cap, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

bool tinker_runs_record(server *s, const char *model_id, const char *dir_name, const zdp_lora_config *lc,
                        char *why, size_t cap) {
    const int lora_rank = lc != NULL ? lc->rank : 0;
    char rel[400], path[PATH_MAX + 4096], dir[PATH_MAX + 4096];
    snprintf(rel, sizeof rel, "%s/run.json", dir_name);
    /* Inside --checkpoint-dir, even through a symbolic link placed there. */
    verr e = {0};
    if (!serve_resolve_path(s, "model_id", rel, path, sizeof path, &e)) {
        snprintf(why, cap, "%s", e.msg);
        return false;
    }
    struct stat sb;
    if (stat(path, &sb) == 0) return true; /* the same run again (a retried create_model) */
    snprintf(dir, sizeof dir, "%s", path);
    *strrchr(dir, '/') = '\0';
    if (serve_mkdirs(dir) != 0) {
        snprintf(why, cap, "cannot create %s: %s (--checkpoint-dir)", dir, strerror(errno));
        return false;
    }
    json_t *o = json_pack("{s:s,s:s,s:b,s:f}", "training_run_id", model_id, "base_model", s->opt.model_name,
                          "is_lora", lora_rank > 0, "created", (double)time(NULL));
    if (o != NULL && lora_rank > 0) {
        /* What create_training_client_from_state recreates the model with
         * (weights_info). */
        json_object_set_new(o, "lora_rank", json_integer(lora_rank));
        json_object_set_new(o, "lora_alpha", json_real(lc->alpha != 0 ? lc->alpha : ZDP_LORA_DEFAULT_ALPHA));
        json_object_set_new(o, "train_attn", json_boolean(lc->targets & ZDP_LORA_ATTN));
        json_object_set_new(o, "train_mlp", json_boolean(lc->targets & ZDP_LORA_MLP));
        json_object_set_new(o, "train_unembed", json_boolean(lc->targets & ZDP_LORA_UNEMBED));
    }
    const int rc = o ? json_dump_file(o, path, JSON_INDENT(1)) : -1;
    json_decref(o);
    if (rc != 0) {
        snprintf(why, cap, "cannot write %s (--checkpoint-dir)", path);
        return false;
    }
    return true;
}

/* A run folder's record; NULL when dir_name holds none (not a run). */
static json_t *read_run_(const server *s, const char *dir_name) {
    char path[PATH_MAX + 300];
    snprintf(path, sizeof path, "%s/%s/run.json", s->ckpt_root, dir_name);
    json_t *o = json_load_file(path, 0, NULL);
    if (o != NULL && (!json_is_object(o) || !json_is_string(json_object_get(o, "training_run_id")))) {
        json_decref(o);
        o = NULL;
    }
    return o;
}

/* Bytes under path (a file, or a folder's files, one level deep as a
 * checkpoint is laid out, plus its subfolders' files). */
static int64_t size_of_(const char *path, int depth) {
    struct stat sb;
    if (lstat(path, &sb) != 0) return 0;
    if (!S_ISDIR(sb.st_mode)) return S_ISREG(sb.st_mode) ? (int64_t)sb.st_size : 0;
    if (depth > 3) return 0;
    DIR *d = opendir(path);
    if (d == NULL) return 0;
    int64_t n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char sub[PATH_MAX + 300];
        if (snprintf(sub, sizeof sub, "%s/%s", path, e->d_name) < (int)sizeof sub) n += size_of_(sub, depth + 1);
    }
    closedir(d);
    return n;
}

static double expiry_of_(const json_t *expiry, const char *ck);
static json_t *load_expiry_(const server *s, const char *dir_name);

static json_t *checkpoint_json_(const char *run_id, bool sampler, const char *name, double t, int64_t bytes,
                                const json_t *expiry) {
    char id[600], tp[900], when[40], until[40];
    snprintf(id, sizeof id, "%s/%s", sampler ? "sampler_weights" : "weights", name);
    snprintf(tp, sizeof tp, "tinker://%s/%s", run_id, id);
    iso_time_(t, when, sizeof when);
    const double exp = expiry_of_(expiry, id);
    if (exp > 0) iso_time_(exp, until, sizeof until);
    return json_pack("{s:s,s:s,s:s,s:s,s:I,s:b,s:s?}", "checkpoint_id", id, "checkpoint_type",
                     sampler ? "sampler" : "training", "time", when, "tinker_path", tp, "size_bytes",
                     (json_int_t)bytes, "public", 0, "expires_at", exp > 0 ? until : NULL);
}

bool tinker_sampler_rel(const server *s, const char *dir_name, const char *name, char *rel, size_t cap) {
    char full[PATH_MAX + 1200];
    struct stat sb;
    const bool folder =
        snprintf(full, sizeof full, "%s/%s/sampler_weights/%s", s->ckpt_root, dir_name, name) < (int)sizeof full &&
        (lstat(full, &sb) == 0 ? S_ISDIR(sb.st_mode)
                               : serve_lora(s) && (snprintf(full, sizeof full, "%s/%s/sampler_weights/%s.safetensors",
                                                            s->ckpt_root, dir_name, name) >= (int)sizeof full ||
                                                   lstat(full, &sb) != 0));
    return snprintf(rel, cap, folder ? "%s/sampler_weights/%s" : "%s/sampler_weights/%s.safetensors", dir_name,
                    name) < (int)cap;
}

/* A checkpoint's "time" (ISO 8601 in UTC, one format: such strings sort as the
 * times do). */
static const char *time_of_(const json_t *ck) {
    const char *v = json_string_value(json_object_get(ck, "time"));
    return v ? v : "";
}

/* Appends the checkpoints of run folder dir_name to arr. */
static void list_run_checkpoints_(const server *s, const char *dir_name, const char *run_id, json_t *arr) {
    char dir[PATH_MAX + 200];
    snprintf(dir, sizeof dir, "%s/%s", s->ckpt_root, dir_name);
    DIR *d = opendir(dir);
    if (d == NULL) return;
    json_t *expiry = load_expiry_(s, dir_name);
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (e->d_name[0] == '.' || !strcmp(e->d_name, "sampler_weights")) continue;
        char p[PATH_MAX + 500];
        struct stat sb;
        if (snprintf(p, sizeof p, "%s/%s", dir, e->d_name) >= (int)sizeof p || lstat(p, &sb) != 0 ||
            !S_ISDIR(sb.st_mode))
            continue;
        json_array_append_new(arr, checkpoint_json_(run_id, false, e->d_name, (double)sb.st_mtime,
                                                    size_of_(p, 0), expiry));
    }
    closedir(d);
    char sdir[PATH_MAX + 300];
    snprintf(sdir, sizeof sdir, "%s/sampler_weights", dir);
    if ((d = opendir(sdir)) == NULL) {
        json_decref(expiry);
        return;
    }
    const char *ext = ".safetensors";
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        /* NAME.safetensors, a weights file; NAME/, a LoRA model's PEFT folder. */
        const size_t n = strlen(e->d_name), k = strlen(ext);
        char p[PATH_MAX + 600], name[300];
        struct stat sb;
        if (e->d_name[0] == '.' || snprintf(p, sizeof p, "%s/%s", sdir, e->d_name) >= (int)sizeof p ||
            lstat(p, &sb) != 0)
            continue;
        const bool file = S_ISREG(sb.st_mode) && n > k && strcmp(e->d_name + n - k, ext) == 0;
        const bool folder = S_ISDIR(sb.st_mode) && tinker_good_name(e->d_name);
        if ((!file && !folder) || n >= sizeof name) continue;
        snprintf(name, sizeof name, "%.*s", (int)(file ? n - k : n), e->d_name);
        json_array_append_new(arr, checkpoint_json_(run_id, true, name, (double)sb.st_mtime,
                                                    folder ? size_of_(p, 0) : (int64_t)sb.st_size,
                                                    expiry));
    }
    closedir(d);
    json_decref(expiry);
}

static int newest_first_(const void *a, const void *b) {
    const int t = strcmp(time_of_(*(json_t *const *)b), time_of_(*(json_t *const *)a));
    if (t != 0) return t;
    const char *p = json_string_value(json_object_get(*(json_t *const *)a, "tinker_path"));
    const char *q = json_string_value(json_object_get(*(json_t *const *)b, "tinker_path"));
    return strcmp(p ? p : "", q ? q : "");
}

/* arr sorted newest first (a new array; arr's reference taken). */
static json_t *sorted_(json_t *arr) {
    const size_t n = json_array_size(arr);
    json_t **v = malloc((n ? n : 1) * sizeof *v);
    json_t *out = json_array();
    if (v == NULL || out == NULL) {
        free(v);
        json_decref(out);
        return arr;
    }
    for (size_t i = 0; i < n; i++) v[i] = json_array_get(arr, i);
    qsort(v, n, sizeof *v, newest_first_);
    for (size_t i = 0; i < n; i++) json_array_append(out, v[i]);
    free(v);
    json_decref(arr);
    return out;
}

/* The SDK's TrainingRun for a run folder's record. */
static json_t *training_run_(const server *s, const char *dir_name, const json_t *rec) {
    const char *id = json_string_value(json_object_get(rec, "training_run_id"));
    json_t *cks = json_array();
    list_run_checkpoints_(s, dir_name, id, cks);
    cks = sorted_(cks);
    json_t *last = NULL, *last_sampler = NULL;
    char when[40];
    iso_time_(json_number_value(json_object_get(rec, "created")), when, sizeof when);
    for (size_t i = 0; i < json_array_size(cks); i++) {
        json_t *ck = json_array_get(cks, i);
        const bool sampler = !strcmp(json_string_value(json_object_get(ck, "checkpoint_type")), "sampler");
        if (sampler && last_sampler == NULL) last_sampler = ck;
        if (!sampler && last == NULL) last = ck;
        if (strcmp(time_of_(ck), when) > 0) snprintf(when, sizeof when, "%s", time_of_(ck));
    }
    const json_t *rank = json_object_get(rec, "lora_rank");
    json_t *o = json_pack("{s:s,s:O,s:s,s:O,s:b,s:s,s:O,s:O}", "training_run_id", id, "base_model",
                          json_object_get(rec, "base_model"), "model_owner", "local", "is_lora",
                          json_object_get(rec, "is_lora"), "corrupted", 0, "last_request_time", when,
                          "last_checkpoint", last ? last : json_null(), "last_sampler_checkpoint",
                          last_sampler ? last_sampler : json_null());
    if (o != NULL) json_object_set_new(o, "lora_rank", json_is_integer(rank) ? json_incref((json_t *)rank) : json_null());
    json_decref(cks);
    return o;
}

/* A folder of the checkpoint folder itself, not a link (which could lead
 * outside it). */
static bool real_dir_(const server *s, const char *dir_name) {
    char p[PATH_MAX + 300];
    struct stat sb;
    snprintf(p, sizeof p, "%s/%s", s->ckpt_root, dir_name);
    return lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* The run folders with a record, as (dir name, record) pairs in two arrays. */
static void runs_(const server *s, json_t *dirs, json_t *recs) {
    DIR *d = opendir(s->ckpt_root);
    if (d == NULL) return;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (e->d_name[0] == '.' || !real_dir_(s, e->d_name)) continue;
        json_t *rec = read_run_(s, e->d_name);
        if (rec == NULL) continue;
        json_array_append_new(dirs, json_string(e->d_name));
        json_array_append_new(recs, rec);
    }
    closedir(d);
}

/* A query parameter as an integer in [lo, hi]; def when absent. */
static bool query_int_(struct MHD_Connection *c, const char *key, long lo, long hi, long def, long *out,
                       char *why, size_t cap) {
    const char *v = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, key);
    *out = def;
    if (v == NULL) return true;
    char *end;
    errno = 0;
    const long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) {
        snprintf(why, cap, "%s = \"%s\": must be an integer in [%ld, %ld]", key, v, lo, hi);
        return false;
    }
    *out = x;
    return true;
}

/* The page [offset, offset + limit) of arr (taken) under key, with a Cursor. */
static json_t *page_(const char *key, json_t *arr, long offset, long limit) {
    json_t *out = json_array();
    const long n = (long)json_array_size(arr);
    for (long i = offset; i < n && i < offset + limit; i++) json_array_append(out, json_array_get(arr, (size_t)i));
    json_decref(arr);
    return json_pack("{s:o,s:{s:i,s:i,s:i}}", key, out, "cursor", "offset", (json_int_t)offset, "limit",
                     (json_int_t)limit, "total_count", (json_int_t)n);
}

/* The run folder of training_run_id; false when no record names it. */
static bool find_run_(const server *s, const char *id, char *dir_name, size_t cap, json_t **rec) {
    json_t *dirs = json_array(), *recs = json_array();
    runs_(s, dirs, recs);
    bool found = false;
    for (size_t i = 0; i < json_array_size(recs) && !found; i++) {
        if (strcmp(json_string_value(json_object_get(json_array_get(recs, i), "training_run_id")), id) != 0)
            continue;
        snprintf(dir_name, cap, "%s", json_string_value(json_array_get(dirs, i)));
        *rec = json_incref(json_array_get(recs, i));
        found = true;
    }
    json_decref(dirs);
    json_decref(recs);
    return found;
}

enum MHD_Result tinker_runs_get(server *s, struct MHD_Connection *c, const char *sub) {
    char why[256];
    long limit, offset;
    if (!query_int_(c, "offset", 0, LONG_MAX / 2, 0, &offset, why, sizeof why) ||
        !query_int_(c, "limit", 1, 100000, 100, &limit, why, sizeof why))
        return tinker_reply_error(c, 400, "query", "%s", why);
    if (!strcmp(sub, "checkpoints") || !strcmp(sub, "training_runs")) {
        json_t *dirs = json_array(), *recs = json_array(), *all = json_array();
        runs_(s, dirs, recs);
        const bool cks = !strcmp(sub, "checkpoints");
        for (size_t i = 0; i < json_array_size(recs); i++) {
            const char *d = json_string_value(json_array_get(dirs, i));
            const json_t *rec = json_array_get(recs, i);
            if (cks)
                list_run_checkpoints_(s, d, json_string_value(json_object_get(rec, "training_run_id")), all);
            else
                json_array_append_new(all, training_run_(s, d, rec));
        }
        json_decref(dirs);
        json_decref(recs);
        if (cks) all = sorted_(all);
        return serve_reply(c, 200, serve_dump(page_(cks ? "checkpoints" : "training_runs", all, offset, limit)));
    }
    /* training_runs/ID or training_runs/ID/checkpoints */
    if (strncmp(sub, "training_runs/", 14) != 0)
        return tinker_reply_error(c, 404, "url", "GET /api/v1/%s: no such endpoint (training_runs, "
                                  "training_runs/ID, training_runs/ID/checkpoints, checkpoints)", sub);
    const char *id = sub + strlen("training_runs/");
    char run_id[200];
    const char *slash = strchr(id, '/');
    const bool cks = slash != NULL && !strcmp(slash, "/checkpoints");
    if (slash != NULL && !cks)
        return tinker_reply_error(c, 404, "url", "GET /api/v1/%s: no such endpoint (training_runs, "
                                  "training_runs/ID, training_runs/ID/checkpoints, checkpoints)", sub);
    const size_t n = slash ? (size_t)(slash - id) : strlen(id);
    if (n == 0 || n >= sizeof run_id)
        return tinker_reply_error(c, 400, "training_run_id", "training_run_id: must be a model_id create_model "
                                  "returned");
    snprintf(run_id, sizeof run_id, "%.*s", (int)n, id);
    char dir_name[300];
    json_t *rec = NULL;
    if (!find_run_(s, run_id, dir_name, sizeof dir_name, &rec))
        return tinker_reply_error(c, 404, "training_run_id", "training_run_id \"%s\": no such training run in "
                                  "this server's --checkpoint-dir", run_id);
    json_t *out;
    if (cks) {
        json_t *all = json_array();
        list_run_checkpoints_(s, dir_name, run_id, all);
        out = json_pack("{s:o,s:n}", "checkpoints", sorted_(all), "cursor");
    } else {
        out = training_run_(s, dir_name, rec);
    }
    json_decref(rec);
    return serve_reply(c, 200, serve_dump(out));
}

/* ---- expiry (ttl_seconds) ------------------------------------------------------------ */

/* "tinker://ID/(weights|sampler_weights)/NAME" -> the run folder's name and
 * the checkpoint id "weights/NAME"; false when it is not one. */
static bool split_tinker_path_(const char *tp, char *dir_name, size_t dcap, char *ck, size_t ccap) {
    const char *pre = "tinker://";
    if (strncmp(tp, pre, strlen(pre)) != 0) return false;
    const char *id = tp + strlen(pre);
    const char *w = strstr(id, "/weights/"), *sw = strstr(id, "/sampler_weights/");
    const char *mark = sw != NULL ? sw : w;
    if (mark == NULL || mark == id || (size_t)(mark - id) >= dcap) return false;
    char run[200];
    snprintf(run, sizeof run, "%.*s", (int)(mark - id), id);
    /* The folder name create_model gave the run: ':' and the like as '_'. */
    size_t k = 0;
    for (const char *p = run; *p && k + 1 < dcap; p++) {
        const char c = *p;
        const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
        dir_name[k++] = ok ? c : '_';
    }
    dir_name[k] = '\0';
    snprintf(ck, ccap, "%s", mark + 1);
    return true;
}

static json_t *load_expiry_(const server *s, const char *dir_name) {
    char path[PATH_MAX + 300];
    snprintf(path, sizeof path, "%s/%s/expires.json", s->ckpt_root, dir_name);
    json_t *o = json_load_file(path, 0, NULL);
    if (!json_is_object(o)) {
        json_decref(o);
        o = json_object();
    }
    return o;
}

json_t *tinker_runs_record_of(const server *s, const char *tinker_path) {
    char dir_name[200], ck[400];
    if (!split_tinker_path_(tinker_path, dir_name, sizeof dir_name, ck, sizeof ck)) return NULL;
    return read_run_(s, dir_name);
}

/* Writes o as the run folder's expires.json (through a temporary file). */
static bool store_expiry_(const server *s, const char *dir_name, json_t *o) {
    char path[PATH_MAX + 300], tmp[PATH_MAX + 320];
    snprintf(path, sizeof path, "%s/%s/expires.json", s->ckpt_root, dir_name);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (json_dump_file(o, tmp, JSON_INDENT(1) | JSON_SORT_KEYS) != 0 || rename(tmp, path) != 0) {
        fprintf(stderr, "zdp serve: cannot write %s: %s; checkpoints' ttl_seconds there are not kept\n", path,
                strerror(errno));
        unlink(tmp);
        return false;
    }
    return true;
}

void tinker_runs_set_expiry(server *s, const char *tinker_path, double expires) {
    char dir_name[200], ck[600];
    if (s->ckpt_root == NULL || !split_tinker_path_(tinker_path, dir_name, sizeof dir_name, ck, sizeof ck))
        return;
    json_t *o = load_expiry_(s, dir_name);
    const bool had = json_object_get(o, ck) != NULL;
    if (expires > 0) json_object_set_new(o, ck, json_real(expires));
    else json_object_del(o, ck);
    if (expires > 0 || had) store_expiry_(s, dir_name, o);
    json_decref(o);
}

/* The expiry time of checkpoint ck of a run folder (0: none). */
static double expiry_of_(const json_t *expiry, const char *ck) {
    return json_number_value(json_object_get(expiry, ck));
}

bool tinker_runs_sweep_locked(server *s) {
    tinker_state *t = s->tinker;
    const double now = (double)time(NULL);
    if (s->ckpt_root == NULL || s->closed || now < t->next_sweep) return false;
    t->next_sweep = now + 1;
    DIR *d = opendir(s->ckpt_root);
    if (d == NULL) return false;
    bool queued = false;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (e->d_name[0] == '.' || !real_dir_(s, e->d_name)) continue;
        char path[PATH_MAX + 300];
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s/expires.json", s->ckpt_root, e->d_name);
        if (stat(path, &sb) != 0) continue;
        json_t *o = load_expiry_(s, e->d_name);
        bool changed = false;
        const char *ck;
        json_t *v, *tmp;
        json_object_foreach_safe(o, tmp, ck, v) {
            if (json_number_value(v) > now) continue;
            const bool sampler = !strncmp(ck, "sampler_weights/", 16);
            const char *name = sampler ? ck + 16 : !strncmp(ck, "weights/", 8) ? ck + 8 : NULL;
            char rel[700], full[PATH_MAX + 4096];
            job *j = NULL;
            verr ve = {0};
            if (name != NULL && tinker_good_name(name) &&
                (sampler ? tinker_sampler_rel(s, e->d_name, name, rel, sizeof rel)
                         : snprintf(rel, sizeof rel, "%s/%s", e->d_name, name) < (int)sizeof rel) &&
                serve_resolve_path(s, "checkpoint_id", rel, full, sizeof full, &ve)) {
                const size_t len = strlen(rel) + 1;
                if ((j = calloc(1, sizeof *j)) == NULL || (j->payload = malloc(len)) == NULL) {
                    free(j);
                    break; /* out of memory: the next sweep tries again */
                }
                memcpy(j->payload, rel, len);
                j->nbytes = (int64_t)len;
                j->op = OP_DELETE_CKPT;
                j->detached = true;
                j->queued_at = serve_now();
                serve_enqueue_locked(s, j);
                queued = true;
                fprintf(stderr, "zdp serve: checkpoint %s of %s expired (ttl_seconds): removed\n", ck, e->d_name);
            }
            json_object_del(o, ck);
            changed = true;
        }
        if (changed) store_expiry_(s, e->d_name, o);
        json_decref(o);
    }
    closedir(d);
    return queued;
}

/* ---- delete ------------------------------------------------------------------------ */

/* A checkpoint a route names, "training_runs/ID/checkpoints/CK" (CK:
 * weights/NAME or sampler_weights/NAME): its run id, CK, and its path
 * relative to the checkpoint folder; false with e set (400 or 404, naming
 * the field) when it is not one that exists. */
static bool checkpoint_of_(server *s, const char *sub, char *run_id, size_t rcap, char *ck, size_t ccap,
                           char *rel, size_t relcap, verr *e) {
    const char *id = sub + strlen("training_runs/");
    const char *mark = strstr(id, "/checkpoints/");
    if (strncmp(sub, "training_runs/", 14) != 0 || mark == NULL || mark == id || (size_t)(mark - id) >= rcap)
        return serve_bad(e, 404, "url", "/api/v1/%s: no such endpoint (training_runs/ID/checkpoints/"
                         "weights/NAME or .../sampler_weights/NAME)", sub);
    snprintf(run_id, rcap, "%.*s", (int)(mark - id), id);
    snprintf(ck, ccap, "%s", mark + strlen("/checkpoints/"));
    const bool sampler = !strncmp(ck, "sampler_weights/", 16);
    const char *name = sampler ? ck + 16 : !strncmp(ck, "weights/", 8) ? ck + 8 : NULL;
    if (name == NULL || !tinker_good_name(name))
        return serve_bad(e, 400, "checkpoint_id", "checkpoint_id \"%s\": must be weights/NAME or "
                         "sampler_weights/NAME, as list_checkpoints names it", ck);
    char dir_name[300];
    json_t *rec = NULL;
    if (!find_run_(s, run_id, dir_name, sizeof dir_name, &rec))
        return serve_bad(e, 404, "training_run_id", "training_run_id \"%s\": no such training run in this "
                         "server's --checkpoint-dir", run_id);
    json_decref(rec);
    char full[PATH_MAX + 800];
    if (sampler ? !tinker_sampler_rel(s, dir_name, name, rel, relcap)
                : snprintf(rel, relcap, "%s/%s", dir_name, name) >= (int)relcap)
        return serve_bad(e, 400, "checkpoint_id", "checkpoint_id: too long");
    if (!serve_resolve_path(s, "checkpoint_id", rel, full, sizeof full, e)) return false;
    struct stat sb;
    const bool sampler_file = sampler && strstr(rel, ".safetensors") != NULL;
    if (lstat(full, &sb) != 0 || (sampler_file ? !S_ISREG(sb.st_mode) : !S_ISDIR(sb.st_mode)))
        return serve_bad(e, 404, "checkpoint_id", "checkpoint_id \"%s\": training run %s has no such "
                         "checkpoint (list_checkpoints names them)", ck, run_id);
    return true;
}

/* PUT training_runs/ID/checkpoints/CK/ttl {"ttl_seconds": N | null}: the
 * checkpoint expires N seconds from now, or never (RestClient's
 * set_checkpoint_ttl_from_tinker_path). */
enum MHD_Result tinker_runs_set_ttl(server *s, struct MHD_Connection *c, const char *sub, const char *body,
                                    size_t len) {
    char route[700], run_id[200], ck[600], rel[700];
    const size_t n = strlen(sub);
    snprintf(route, sizeof route, "%.*s", (int)(n > 4 ? n - 4 : 0), sub); /* without "/ttl" */
    verr e = {0};
    if (!checkpoint_of_(s, route, run_id, sizeof run_id, ck, sizeof ck, rel, sizeof rel, &e))
        return tinker_reply_error(c, e.status, e.field, "%s", e.msg);
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, NULL);
    const json_t *ttl = json_object_get(root, "ttl_seconds");
    const bool ok = json_is_object(root) && ttl != NULL &&
                    (json_is_null(ttl) || (json_is_integer(ttl) && json_integer_value(ttl) >= 1 &&
                                           json_integer_value(ttl) <= 100LL * 365 * 86400));
    const double expires = ok && json_is_integer(ttl) ? (double)time(NULL) + (double)json_integer_value(ttl) : 0;
    json_decref(root);
    if (!ok)
        return tinker_reply_error(c, 400, "ttl_seconds", "ttl_seconds: the body must be {\"ttl_seconds\": N} "
                                  "with N seconds in [1, 100 years], or null for no expiry");
    char tp[900];
    snprintf(tp, sizeof tp, "tinker://%s/%s", run_id, ck);
    pthread_mutex_lock(&s->mu);
    tinker_runs_set_expiry(s, tp, expires);
    pthread_mutex_unlock(&s->mu);
    return serve_reply(c, 200, serve_dump(json_object()));
}

/* DELETE training_runs/ID/checkpoints/(weights|sampler_weights)/NAME: a job
 * on the queue (every rank removes its own part), answered when done. */
enum MHD_Result tinker_runs_delete(server *s, struct MHD_Connection *c, const char *sub) {
    char run_id[200], ck[600], rel[700];
    verr e = {0};
    if (!checkpoint_of_(s, sub, run_id, sizeof run_id, ck, sizeof ck, rel, sizeof rel, &e))
        return tinker_reply_error(c, e.status, e.field, "%s", e.msg);
    job *j = calloc(1, sizeof *j);
    const size_t len = strlen(rel) + 1;
    if (j == NULL || (j->payload = malloc(len)) == NULL) {
        free(j);
        return tinker_reply_error(c, 500, NULL, "out of memory");
    }
    memcpy(j->payload, rel, len);
    j->nbytes = (int64_t)len;
    j->op = OP_DELETE_CKPT;
    if (!serve_run_job(s, j)) return tinker_reply_error(c, 503, NULL, "the server is shutting down");
    const int status = j->status;
    char *body = status == 200 ? serve_dump(json_pack("{s:s}", "deleted", rel)) : serve_job_error_json(j);
    serve_job_free(j);
    if (status == 200) { /* its ttl_seconds, if any, goes with it */
        char tp[900];
        snprintf(tp, sizeof tp, "tinker://%s/%s", run_id, ck);
        pthread_mutex_lock(&s->mu);
        tinker_runs_set_expiry(s, tp, 0);
        pthread_mutex_unlock(&s->mu);
    }
    return serve_reply(c, status, body);
}
