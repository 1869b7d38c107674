/*
 * checkpoint.c -- saving and loading the engine's whole training state
 * (zdp.h "checkpoints"; the format is in docs/checkpoints.md).
 *
 * The format is independent of the world size and the ZeRO stage: the
 * weights are saved whole, and the optimizer state as slices of the flat
 * (unpadded) parameter range, one file per rank, so a loading job of any
 * size rebuilds the flat state and cuts its own partition.  Gradients of a
 * window in progress are rank-local (stages 0/1) or averaged over the saving
 * job's ranks (stages 2/3), so a mid-window checkpoint resumes only at the same
 * world size and stage.
 *
 * Integrity: meta.json lists the size and FNV-1a 64 of every other file,
 * and carries its own checksum, "meta_fnv1a64": the FNV-1a 64 of the file's
 * exact bytes with those 16 hex digits read as '0's.  Over the bytes rather
 * than a re-serialisation, so a reader (another program, another jansson)
 * needs no canonical JSON writer to check it; any change to a counter, a
 * shape or the client state is refused.  Format 1 files have no checksum and
 * load with a warning (docs/checkpoints.md).  The model's shape_json is
 * recorded as "model", and a model of another shape is refused by key.
 *
 * Crash safety: files go to dir/tag.tmp/, each written to a temporary name,
 * fsynced and renamed (zdp_safetensors_write); ranks agree that all files
 * are complete; rank 0 writes meta.json last, renames the directory into
 * place, fsyncs dir, and only then replaces dir/latest.  Load checks sizes,
 * checksums, layout and tensors into temporary buffers before it touches the
 * engine, and all ranks agree before any of them commits.
 *
 * Test hook: ZDP_TEST_CKPT_CRASH=files|meta|latest kills rank 0 with
 * SIGKILL at that point of a save (after the rank files, after meta.json,
 * before latest), to prove the previous checkpoint survives.
 */
#define _GNU_SOURCE /* renameat2 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "engine_impl.h"

#define FORMAT_NAME_ "zdp-checkpoint"
#define FORMAT_VERSION_ 2
#define META_SUM_KEY_ "meta_fnv1a64"
#define FNV_BASIS_ 0xcbf29ce484222325ULL
#define FNV_PRIME_ 0x100000001b3ULL
#define PATH_MAX_ 4096

/* ---- files ------------------------------------------------------------------ */

/* FNV-1a 64 of a whole file, and its size.  -1 on I/O error. */
static int file_digest_(const char *path, uint64_t *hash, int64_t *size) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) return -1;
    uint64_t h = FNV_BASIS_;
    int64_t n = 0;
    unsigned char buf[1 << 16];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, f)) > 0) {
        for (size_t i = 0; i < got; i++) h = (h ^ buf[i]) * FNV_PRIME_;
        n += (int64_t)got;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) return -1;
    *hash = h;
    *size = n;
    return 0;
}

/* The 16 hex digits of the last "meta_fnv1a64": "..." in text[0, n), or
 * NULL.  The last: rank 0 writes the key last at the top level, after the
 * client state, whose keys are the caller's. */
static char *meta_sum_digits_(char *text, size_t n) {
    static const char key[] = "\"" META_SUM_KEY_ "\"";
    const size_t k = sizeof key - 1;
    for (size_t i = n >= k ? n - k + 1 : 0; i-- > 0;) {
        if (memcmp(text + i, key, k) != 0) continue;
        size_t j = i + k;
        while (j < n && strchr(" \t\r\n", text[j]) != NULL && text[j] != '\0') j++;
        if (j >= n || text[j] != ':') return NULL;
        for (j++; j < n && strchr(" \t\r\n", text[j]) != NULL && text[j] != '\0'; j++) {
        }
        if (j + 18 > n || text[j] != '"' || text[j + 17] != '"') return NULL;
        return text + j + 1;
    }
    return NULL;
}

/* FNV-1a 64 of text[0, n) with the 16 bytes at digits read as '0's. */
static uint64_t meta_sum_(const char *text, size_t n, const char *digits) {
    uint64_t h = FNV_BASIS_;
    for (size_t i = 0; i < n; i++) {
        const char *p = text + i;
        unsigned char c = p >= digits && p < digits + 16 ? '0' : (unsigned char)*p;
        h = (h ^ c) * FNV_PRIME_;
    }
    return h;
}

/* A whole small file into a NUL-terminated buffer.  -1 with errno set. */
static int read_all_(const char *path, char **buf, size_t *n) {
    *buf = NULL;
    *n = 0;
    FILE *f = fopen(path, "rb");
    if (f == NULL) return -1;
    size_t cap = 1 << 16, len = 0;
    char *b = malloc(cap + 1);
    size_t got;
    while (b != NULL && (got = fread(b + len, 1, cap - len, f)) > 0) {
        len += got;
        if (len < cap) continue;
        /* meta.json is small; 1 GiB means something else is there. */
        char *nb = cap < (1u << 30) ? realloc(b, 2 * cap + 1) : NULL;
        if (nb == NULL) {
            free(b);
            b = NULL;
            errno = ENOMEM;
        } else {
            b = nb;
            cap *= 2;
        }
    }
    int bad = b == NULL || ferror(f);
    int saved = errno;
    fclose(f);
    if (bad) {
        free(b);
        errno = saved ? saved : EIO;
        return -1;
    }
    b[len] = '\0';
    *buf = b;
    *n = len;
    return 0;
}

static void fsync_dir_(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

/* Writes text to path through a temporary file, fsync and rename. */
static int write_atomic_(const char *path, const char *text) {
    char tmp[PATH_MAX_ + 32];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (f == NULL) return -1;
    size_t n = strlen(text);
    int ok = fwrite(text, 1, n, f) == n && fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        int saved = errno;
        unlink(tmp);
        errno = saved;
        return -1;
    }
    return 0;
}

/* Removes a directory of plain files (one level; checkpoints have no more). */
static void rmdir_files_(const char *dir) {
    DIR *d = opendir(dir);
    if (d == NULL) return;
    struct dirent *ent;
    while ((ent = readdir(d)) != NULL) {
        if (!strcmp(ent->d_name, ".") || !strcmp(ent->d_name, "..")) continue;
        char p[PATH_MAX_ * 2];
        snprintf(p, sizeof p, "%s/%s", dir, ent->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

static void crash_point_(const char *where) {
    const char *v = getenv("ZDP_TEST_CKPT_CRASH");
    if (v != NULL && strcmp(v, where) == 0 && zdp_dist_rank() == 0) raise(SIGKILL);
}

static bool tag_ok_(const char *tag) {
    return tag != NULL && tag[0] != '\0' && strchr(tag, '/') == NULL && strcmp(tag, ".") != 0 &&
           strcmp(tag, "..") != 0 && strlen(tag) < 200;
}

/* ---- what the engine holds -------------------------------------------------------- */

static bool is_adam_(const zdp_engine *e) {
    return e->cfg.optimizer.type != ZDP_OPTIMIZER_SGD;
}

/* This rank's slice of the flat unpadded range: [lo, hi). */
static void rank_range_(const zdp_engine *e, int64_t *lo, int64_t *hi) {
    int64_t a = (int64_t)e->rank * e->lay.part, b = a + e->lay.part;
    *lo = a < e->lay.numel ? a : e->lay.numel;
    *hi = b < e->lay.numel ? b : e->lay.numel;
}

/* Optimizer arrays are indexed from the optimizer's own origin: 0 at stage 0
 * (the whole buffer), r*P at stages 1/2/3 (the partition). */
static int64_t optim_origin_(const zdp_engine *e) {
    return e->cfg.zero.stage == 0 ? 0 : (int64_t)e->rank * e->lay.part;
}

static zdp_tensor f32_tensor_(const char *name, float *data, int64_t n) {
    return (zdp_tensor){.name = (char *)name, .dtype = ZDP_DTYPE_F32, .ndim = 1, .shape = {n},
                        .data = data, .nbytes = (size_t)n * sizeof(float)};
}

/* optim_rank{r}.safetensors: range, the optimizer state slice, and the
 * window's gradients when a window is open. */
static zdp_status write_rank_file_(zdp_engine *e, const char *path, zdp_error *err) {
    int64_t lo, hi;
    rank_range_(e, &lo, &hi);
    const int64_t n = hi - lo, off = lo - optim_origin_(e);
    int64_t range[2] = {lo, hi};
    zdp_tensor t[4];
    int nt = 0;
    t[nt++] = (zdp_tensor){.name = "range", .dtype = ZDP_DTYPE_I64, .ndim = 1, .shape = {2},
                           .data = range, .nbytes = sizeof range};
    if (is_adam_(e)) {
        t[nt++] = f32_tensor_("exp_avg", e->optim.m + off, n);
        t[nt++] = f32_tensor_("exp_avg_sq", e->optim.v + off, n);
    } else if (e->optim.m != NULL) {
        t[nt++] = f32_tensor_("momentum_buffer", e->optim.m + off, n);
    }
    if (e->window_backwards > 0) {
        if (e->cfg.zero.stage < 2)
            t[nt++] = f32_tensor_("local_grads", e->grads, e->lay.numel);
        else
            t[nt++] = f32_tensor_("grad_partition", e->grad_part + (lo - (int64_t)e->rank * e->lay.part), n);
    }
    return zdp_safetensors_write(path, t, nt, err);
}

static zdp_status write_model_file_(zdp_engine *e, const char *path, zdp_error *err) {
    const zdp_model *m = e->model;
    zdp_tensor *t = calloc((size_t)m->n_params, sizeof *t);
    if (t == NULL) return zdp_err_set(err, ZDP_ERR_NOMEM, "checkpoint: out of memory");
    for (int i = 0; i < m->n_params; i++) {
        t[i] = (zdp_tensor){.name = (char *)m->params[i].name, .dtype = ZDP_DTYPE_F32,
                            .ndim = m->params[i].ndim,
                            .data = e->save_params != NULL ? e->save_params + e->lay.offsets[i]
                                                           : e->param_ptrs[i],
                            .nbytes = (size_t)e->lay.numels[i] * sizeof(float)};
        memcpy(t[i].shape, m->params[i].shape, sizeof t[i].shape);
    }
    /* A weights file like the ones people load: {"format": "pt"}, and the
     * model's shape, which zdp_gpt_weights_load checks (--init). */
    const char *const meta[] = {"format", "pt", "zdp_model", m->shape_json};
    zdp_status st = zdp_safetensors_write_meta(path, t, m->n_params, meta,
                                               m->shape_json != NULL ? 2 : 1, err);
    free(t);
    return st;
}

static json_t *meta_json_(zdp_engine *e, const char *tag, json_t *client, const int64_t *rec) {
    const zdp_config *c = &e->cfg;
    json_t *files = json_object();
    char name[64], hex[32];
    for (int r = 0; r < e->world; r++) {
        snprintf(name, sizeof name, "optim_rank%d.safetensors", r);
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)rec[4 * r + 3]);
        json_object_set_new(files, name, json_pack("{s:I,s:s}", "bytes", (json_int_t)rec[4 * r + 2],
                                                   "fnv1a64", hex));
    }
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)rec[1]);
    json_object_set_new(files, "model.safetensors",
                        json_pack("{s:I,s:s}", "bytes", (json_int_t)rec[0], "fnv1a64", hex));
    json_t *tensors = json_array();
    for (int i = 0; i < e->model->n_params; i++) {
        json_t *shape = json_array();
        for (int d = 0; d < e->model->params[i].ndim; d++)
            json_array_append_new(shape, json_integer(e->model->params[i].shape[d]));
        json_array_append_new(tensors, json_pack("{s:s,s:o,s:I}", "name", e->model->params[i].name,
                                                 "shape", shape, "offset",
                                                 (json_int_t)e->lay.offsets[i]));
    }
    const char *opt = c->optimizer.type == ZDP_OPTIMIZER_SGD     ? "SGD"
                      : c->optimizer.type == ZDP_OPTIMIZER_ADAMW ? "AdamW"
                                                                 : "Adam";
    json_t *meta = json_pack(
        "{s:s,s:i,s:s,s:s,s:i,s:i,s:b,"
        "s:{s:I,s:I,s:I},"
        "s:{s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:f},"
        "s:{s:I,s:I,s:I,s:s,s:f,s:f},"
        "s:o,s:o,s:o}",
        "format", FORMAT_NAME_, "format_version", FORMAT_VERSION_, "zdp_version", ZDP_VERSION,
        "tag", tag, "world_size", e->world, "zero_stage", c->zero.stage,
        "managed_gradient_accumulation", c->managed_gradient_accumulation,
        "layout", "numel", (json_int_t)e->lay.numel, "padded", (json_int_t)e->lay.padded,
        "partition", (json_int_t)e->lay.part,
        "counters", "global_steps", (json_int_t)e->global_steps, "global_samples",
        (json_int_t)e->global_samples, "micro_steps", (json_int_t)e->micro_steps,
        "skipped_steps", (json_int_t)e->skipped_steps, "pending_backwards",
        (json_int_t)e->window_backwards, "optimizer_step", (json_int_t)e->optim.step_count,
        "scheduler_iteration", (json_int_t)e->sched_iter, "last_lr", e->last_lr,
        "config", "train_batch_size", (json_int_t)c->train_batch_size,
        "train_micro_batch_size_per_gpu", (json_int_t)c->micro_batch_size,
        "gradient_accumulation_steps", (json_int_t)c->gradient_accumulation_steps,
        "optimizer", opt, "lr", c->optimizer.lr, "gradient_clipping", c->gradient_clipping,
        "tensors", tensors, "files", files, "client", client);
    if (meta != NULL && e->model->shape_json != NULL) {
        json_t *shape = json_loads(e->model->shape_json, 0, NULL);
        if (!json_is_object(shape)) {
            json_decref(shape);
            json_decref(meta);
            return NULL;
        }
        json_object_set_new(meta, "model", shape);
    }
    /* Last, so that meta_sum_digits_ finds this one; filled in by save. */
    if (meta != NULL) json_object_set_new(meta, META_SUM_KEY_, json_string("0000000000000000"));
    return meta;
}

/* ---- save --------------------------------------------------------------------- */

/* The arguments, checked alike on every rank (the same model everywhere, so
 * every rank returns alike); *client: the client object, new or parsed. */
static zdp_status save_args_(const zdp_engine *e, const char *dir, const char *tag,
                             const char *client_json, json_t **client, zdp_error *err) {
    *client = NULL;
    if (e == NULL || dir == NULL || !tag_ok_(tag))
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "save_checkpoint: dir and a tag are required, and the tag \"%s\" "
                           "must be a plain file name (no '/')", tag ? tag : "(null)");
    json_t *c = NULL;
    if (client_json != NULL) {
        json_error_t je;
        c = json_loads(client_json, 0, &je);
        if (c == NULL || !json_is_object(c)) {
            json_decref(c);
            return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                               "save_checkpoint: client_json is not a JSON object (%s at %d:%d)",
                               je.text, je.line, je.column);
        }
    } else {
        c = json_object();
    }
    if (e->model->shape_json != NULL) {
        json_t *shape = json_loads(e->model->shape_json, 0, NULL);
        bool obj = json_is_object(shape);
        json_decref(shape);
        if (!obj) {
            json_decref(c);
            return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                               "save_checkpoint: the model's shape_json is not a JSON object: "
                               "%.200s", e->model->shape_json);
        }
    }
    *client = c;
    return ZDP_OK;
}

/* Phase 1: rank 0 prepares an empty dir/tag.tmp; everyone waits for it.
 * COLLECTIVE. */
static zdp_status save_prepare_(zdp_engine *e, const char *tmpdir, zdp_error *err) {
    int64_t ok[1] = {0};
    zdp_error local = {0};
    if (e->rank == 0) {
        rmdir_files_(tmpdir);
        if (zdp_mkdirs(tmpdir) != 0) {
            ok[0] = 1;
            zdp_err_set(&local, ZDP_ERR_IO, "save_checkpoint: cannot create %s: %s", tmpdir,
                        strerror(errno));
        }
    }
    zdp_status st = zdp_engine_allreduce_i64_(e, ok, 1, err);
    if (st != ZDP_OK) return st;
    if (ok[0] != 0)
        return e->rank == 0 ? (*err = local, local.code)
                            : zdp_err_set(err, ZDP_ERR_IO, "save_checkpoint: rank 0 could "
                                                           "not create %s", tmpdir);
    return ZDP_OK;
}

/* Writes one file with `write` and records its size and digest in
 * size_hash[0..1]. */
static zdp_status save_file_(zdp_engine *e, const char *path,
                             zdp_status (*write)(zdp_engine *, const char *, zdp_error *),
                             int64_t *size_hash, zdp_error *local) {
    uint64_t h = 0;
    int64_t size = 0;
    zdp_status st = write(e, path, local);
    if (st == ZDP_OK && file_digest_(path, &h, &size) != 0)
        st = zdp_err_set(local, ZDP_ERR_IO, "save_checkpoint: cannot read back %s", path);
    if (st == ZDP_OK) {
        size_hash[0] = size;
        size_hash[1] = (int64_t)h;
    }
    return st;
}

/* Phase 2: every rank writes its file (rank 0 the model too) and digests
 * it; rec (4 W + 1 slots) gathers every file's size and digest, and the
 * number of ranks that failed.  COLLECTIVE. */
static zdp_status save_write_files_(zdp_engine *e, const char *tmpdir, int64_t *rec,
                                    zdp_error *err) {
    char path[PATH_MAX_ + 64];
    zdp_error local = {0};
    zdp_status mine = ZDP_OK;
    if (e->rank == 0) {
        snprintf(path, sizeof path, "%s/model.safetensors", tmpdir);
        mine = save_file_(e, path, write_model_file_, &rec[0], &local);
    }
    if (mine == ZDP_OK) {
        snprintf(path, sizeof path, "%s/optim_rank%d.safetensors", tmpdir, e->rank);
        mine = save_file_(e, path, write_rank_file_, &rec[4 * e->rank + 2], &local);
    }
    rec[4 * e->world] = mine != ZDP_OK;
    /* Slots other ranks own are zero here, so the SUM gathers them. */
    if (e->rank != 0) rec[0] = rec[1] = 0;
    zdp_status st = zdp_engine_allreduce_i64_(e, rec, 4 * e->world + 1, err);
    if (st != ZDP_OK) return st;
    if (rec[4 * e->world] != 0) {
        if (e->rank == 0) rmdir_files_(tmpdir);
        return mine != ZDP_OK ? (*err = local, local.code)
                              : zdp_err_set(err, ZDP_ERR_IO,
                                            "save_checkpoint: %lld rank(s) failed to write "
                                            "their files under %s; the previous checkpoint is "
                                            "untouched",
                                            (long long)rec[4 * e->world], tmpdir);
    }
    return ZDP_OK;
}

/* meta.json's text with its checksum filled in, or NULL (errno set). */
static char *save_meta_text_(zdp_engine *e, const char *tag, json_t *client,
                             const int64_t *rec) {
    json_t *meta = meta_json_(e, tag, json_incref(client), rec);
    char *text = meta ? json_dumps(meta, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(meta);
    char *digits = text ? meta_sum_digits_(text, strlen(text)) : NULL;
    if (digits == NULL) {
        free(text);
        errno = EINVAL; /* a model shape_json that is not a JSON object */
        return NULL;
    }
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx",
             (unsigned long long)meta_sum_(text, strlen(text), digits));
    memcpy(digits, hex, 16);
    return text;
}

/* Puts tmpdir in the place of final.  Replacing an older checkpoint of the
 * same tag: swap the two directories in one step (Linux RENAME_EXCHANGE), so
 * a crash leaves either the old checkpoint or the new one under the tag,
 * never neither; then remove the old one.  Where the file system cannot
 * swap, move the old one aside first (a crash between the two renames leaves
 * the tag missing, its files in TAG.old.PID).  Rank 0 only. */
static int save_replace_dir_(const char *tmpdir, const char *final, zdp_error *local) {
    char old[PATH_MAX_ + 32];
    snprintf(old, sizeof old, "%s.old.%ld", final, (long)getpid());
    struct stat sb;
    bool exists = stat(final, &sb) == 0, swapped = false, had_old = false;
#ifdef RENAME_EXCHANGE
    if (exists && renameat2(AT_FDCWD, tmpdir, AT_FDCWD, final, RENAME_EXCHANGE) == 0) {
        swapped = true;
        crash_point_("replace");
        rmdir_files_(tmpdir); /* now the old checkpoint */
    }
#endif
    if (!swapped) had_old = exists && rename(final, old) == 0;
    if (!swapped && rename(tmpdir, final) != 0) {
        zdp_err_set(local, ZDP_ERR_IO, "save_checkpoint: cannot rename %s to %s: %s", tmpdir,
                    final, strerror(errno));
        if (had_old) rename(old, final);
        return -1;
    }
    if (had_old) rmdir_files_(old);
    return 0;
}

/* Rank 0's part of phase 3: meta.json, the directory, then latest.
 * 0, or -1 with *local set. */
static int save_commit_rank0_(zdp_engine *e, const char *dir, const char *tag,
                              const char *tmpdir, const char *final, json_t *client,
                              const int64_t *rec, zdp_error *local) {
    char path[PATH_MAX_ + 64];
    snprintf(path, sizeof path, "%s/meta.json", tmpdir);
    char *text = save_meta_text_(e, tag, client, rec);
    if (text == NULL || write_atomic_(path, text) != 0) {
        zdp_err_set(local, ZDP_ERR_IO, "save_checkpoint: cannot write %s: %s", path,
                    strerror(errno));
        free(text);
        return -1;
    }
    free(text);
    fsync_dir_(tmpdir);
    crash_point_("meta");
    if (save_replace_dir_(tmpdir, final, local) != 0) return -1;
    fsync_dir_(dir);
    crash_point_("latest");
    char latest[PATH_MAX_ + 16], line[256];
    snprintf(latest, sizeof latest, "%s/latest", dir);
    snprintf(line, sizeof line, "%s\n", tag);
    int rc = 0;
    if (write_atomic_(latest, line) != 0) {
        zdp_err_set(local, ZDP_ERR_IO, "save_checkpoint: cannot write %s: %s", latest,
                    strerror(errno));
        rc = -1;
    }
    fsync_dir_(dir);
    return rc;
}

/* Phase 3: rank 0 commits; everyone learns whether it did.  COLLECTIVE. */
static zdp_status save_commit_(zdp_engine *e, const char *dir, const char *tag,
                               const char *tmpdir, const char *final, json_t *client,
                               const int64_t *rec, zdp_error *err) {
    int64_t ok[1] = {0};
    zdp_error local = {0};
    if (e->rank == 0 &&
        save_commit_rank0_(e, dir, tag, tmpdir, final, client, rec, &local) != 0)
        ok[0] = 1;
    zdp_status st = zdp_engine_allreduce_i64_(e, ok, 1, err);
    if (st != ZDP_OK) return st;
    if (ok[0] != 0)
        return e->rank == 0 ? (*err = local, local.code)
                            : zdp_err_set(err, ZDP_ERR_IO, "save_checkpoint: rank 0 could "
                                                           "not commit %s", final);
    return ZDP_OK;
}

zdp_status zdp_engine_save_checkpoint(zdp_engine *e, const char *dir, const char *tag,
                                      const char *client_json, zdp_error *err) {
    json_t *client = NULL;
    zdp_status st = save_args_(e, dir, tag, client_json, &client, err);
    if (st != ZDP_OK) return st;
    if ((st = zdp_engine_drain_(e, err)) != ZDP_OK) {
        json_decref(client);
        return st;
    }
    /* Stage 3: the model file is the same whole-model file as at stages 0-2
     * (so the checkpoint loads at any stage and world size): every rank
     * takes part in gathering it, tensor by tensor, and rank 0 writes it. */
    if (e->cfg.zero.stage == 3) {
        e->save_params = malloc((size_t)e->lay.numel * sizeof(float));
        int64_t bad[1] = {e->save_params == NULL};
        if ((st = zdp_engine_allreduce_i64_(e, bad, 1, err)) == ZDP_OK && bad[0] != 0)
            st = zdp_err_set(err, ZDP_ERR_NOMEM,
                             "save_checkpoint: %lld rank(s) cannot hold the %lld parameters "
                             "gathered for the model file",
                             (long long)bad[0], (long long)e->lay.numel);
        for (int i = 0; st == ZDP_OK && i < e->lay.n_tensors; i++)
            st = zdp_engine_get_param(e, i, e->save_params + e->lay.offsets[i], err);
        if (st != ZDP_OK) {
            free(e->save_params);
            e->save_params = NULL;
            json_decref(client);
            return st;
        }
    }
    char tmpdir[PATH_MAX_], final[PATH_MAX_];
    snprintf(tmpdir, sizeof tmpdir, "%s/%s.tmp", dir, tag);
    snprintf(final, sizeof final, "%s/%s", dir, tag);

    int64_t *rec = NULL;
    if ((st = save_prepare_(e, tmpdir, err)) != ZDP_OK) goto out;
    rec = calloc((size_t)(4 * e->world + 1), sizeof *rec);
    if (rec == NULL) {
        st = zdp_err_set(err, ZDP_ERR_NOMEM, "save_checkpoint: out of memory");
        goto out;
    }
    if ((st = save_write_files_(e, tmpdir, rec, err)) != ZDP_OK) goto out;
    crash_point_("files");
    st = save_commit_(e, dir, tag, tmpdir, final, client, rec, err);
out:
    free(rec);
    free(e->save_params);
    e->save_params = NULL;
    json_decref(client);
    return st;
}

/* ---- reading a checkpoint ------------------------------------------------------------ */

typedef struct ckpt_view {
    char dir[PATH_MAX_];    /* dir/tag */
    char tag[256];
    json_t *meta;
    int world, stage;
    int version;            /* format_version: 1 has no meta checksum */
    int64_t numel, pending;
} ckpt_view;

static void view_free_(ckpt_view *v) {
    json_decref(v->meta);
    v->meta = NULL;
}

static zdp_status read_latest_(const char *dir, char *tag, size_t n, zdp_error *err) {
    char path[PATH_MAX_ + 16];
    snprintf(path, sizeof path, "%s/latest", dir);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return zdp_err_set(err, ZDP_ERR_IO,
                           "%s: %s; no checkpoint has been completed in %s (give a tag, or save "
                           "one first)", path, strerror(errno), dir);
    char line[256] = "";
    if (fgets(line, sizeof line, f) == NULL) line[0] = '\0';
    fclose(f);
    line[strcspn(line, "\r\n")] = '\0';
    if (!tag_ok_(line))
        return zdp_err_set(err, ZDP_ERR_FORMAT, "%s: \"%s\" is not a checkpoint tag", path, line);
    snprintf(tag, n, "%s", line);
    return ZDP_OK;
}

static int64_t get_int_(json_t *obj, const char *a, const char *b, bool *ok) {
    json_t *v = json_object_get(obj, a);
    if (b != NULL) v = json_object_get(v, b);
    if (!json_is_integer(v)) {
        *ok = false;
        return 0;
    }
    return (int64_t)json_integer_value(v);
}

/* Checks meta.json's own checksum (format 2), or warns that there is none
 * (format 1: written before zdp had one). */
static zdp_status meta_check_sum_(const char *path, json_t *meta, char *text, size_t n,
                                  int version, zdp_error *err) {
    json_t *field = json_object_get(meta, META_SUM_KEY_);
    if (version == 1 && field == NULL) {
        if (zdp_dist_rank() == 0)
            zdp_log(1, "%s: format_version 1 has no meta.json checksum (saved by an older "
                       "zdp), so its counters and client state load unverified; save the "
                       "checkpoint again to get one", path);
        return ZDP_OK;
    }
    const char *want = json_string_value(field);
    char *digits = meta_sum_digits_(text, n);
    bool hex = want != NULL && strlen(want) == 16 && strspn(want, "0123456789abcdef") == 16;
    if (!hex || digits == NULL || memcmp(digits, want, 16) != 0)
        return zdp_err_set(err, ZDP_ERR_FORMAT,
                           "%s: no valid \"" META_SUM_KEY_ "\" (16 lowercase hex digits): the "
                           "file was edited or damaged after it was saved; fix: restore it from a copy, or load another checkpoint "
                           "(another tag)", path);
    uint64_t got = meta_sum_(text, n, digits);
    char hexgot[17];
    snprintf(hexgot, sizeof hexgot, "%016llx", (unsigned long long)got);
    if (memcmp(hexgot, want, 16) != 0)
        return zdp_err_set(err, ZDP_ERR_FORMAT,
                           "%s: checksum mismatch: the file says " META_SUM_KEY_ " %.16s, its "
                           "content hashes to %s; it was changed or damaged after it was saved, "
                           "and a changed counter or shape would load silently wrong; fix: "
                           "restore it from a copy, or load another checkpoint (another tag)",
                           path, want, hexgot);
    return ZDP_OK;
}

/* Opens dir/tag/meta.json, checks the format and every file's checksum. */
static zdp_status view_open_(const char *dir, const char *tag, ckpt_view *v, zdp_error *err) {
    memset(v, 0, sizeof *v);
    zdp_status st;
    if (tag == NULL) {
        if ((st = read_latest_(dir, v->tag, sizeof v->tag, err)) != ZDP_OK) return st;
    } else if (!tag_ok_(tag)) {
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "checkpoint tag \"%s\" must be a plain name", tag);
    } else {
        snprintf(v->tag, sizeof v->tag, "%s", tag);
    }
    snprintf(v->dir, sizeof v->dir, "%s/%s", dir, v->tag);
    char path[PATH_MAX_ + 64];
    snprintf(path, sizeof path, "%s/meta.json", v->dir);
    json_error_t je;
    char *text = NULL;
    size_t text_n = 0;
    if (read_all_(path, &text, &text_n) != 0) {
        struct stat sb;
        if (stat(path, &sb) != 0)
            return zdp_err_set(err, ZDP_ERR_IO,
                               "%s: missing (%s); %s is not a complete zdp checkpoint (an "
                               "interrupted save leaves only %s.tmp)", path, strerror(errno),
                               v->dir, v->dir);
        return zdp_err_set(err, ZDP_ERR_IO, "%s: cannot read: %s", path, strerror(errno));
    }
    v->meta = json_loadb(text, text_n, JSON_REJECT_DUPLICATES, &je);
    if (v->meta == NULL) {
        free(text);
        return zdp_err_set(err, ZDP_ERR_FORMAT, "%s:%d:%d: corrupt metadata: %s", path, je.line,
                           je.column, je.text);
    }
    const char *fmt = json_string_value(json_object_get(v->meta, "format"));
    bool ok = true;
    int64_t version = get_int_(v->meta, "format_version", NULL, &ok);
    if (!json_is_object(v->meta) || fmt == NULL || strcmp(fmt, FORMAT_NAME_) != 0 || !ok) {
        view_free_(v);
        free(text);
        return zdp_err_set(err, ZDP_ERR_FORMAT, "%s: not a zdp checkpoint (no \"format\": \"%s\")",
                           path, FORMAT_NAME_);
    }
    if (version != FORMAT_VERSION_ && version != 1) {
        view_free_(v);
        free(text);
        return zdp_err_set(err, ZDP_ERR_UNSUPPORTED,
                           "%s: format_version %lld; this zdp (%s) reads versions 1 and %d; use "
                           "the zdp that wrote it", path, (long long)version, ZDP_VERSION,
                           FORMAT_VERSION_);
    }
    v->version = (int)version;
    /* The file's own checksum, before any field of it is believed. */
    zdp_status sum_st = meta_check_sum_(path, v->meta, text, text_n, v->version, err);
    free(text);
    if (sum_st != ZDP_OK) {
        view_free_(v);
        return sum_st;
    }
    v->world = (int)get_int_(v->meta, "world_size", NULL, &ok);
    v->stage = (int)get_int_(v->meta, "zero_stage", NULL, &ok);
    v->numel = get_int_(v->meta, "layout", "numel", &ok);
    v->pending = get_int_(v->meta, "counters", "pending_backwards", &ok);
    static const char *const counters[] = {"global_steps", "global_samples", "micro_steps",
                                           "skipped_steps", "optimizer_step",
                                           "scheduler_iteration"};
    for (size_t k = 0; k < sizeof counters / sizeof counters[0]; k++)
        (void)get_int_(v->meta, "counters", counters[k], &ok);
    json_t *files = json_object_get(v->meta, "files");
    int64_t world = get_int_(v->meta, "world_size", NULL, &ok);
    int64_t stage = get_int_(v->meta, "zero_stage", NULL, &ok);
    if (!ok || world < 1 || world > (1 << 20) || stage < 0 || stage > 3 || v->numel < 1 ||
        !json_is_object(files)) {
        view_free_(v);
        return zdp_err_set(err, ZDP_ERR_FORMAT, "%s: a required field is missing, out of range or has the "
                                                "wrong type (world_size, zero_stage, layout, "
                                                "counters, files)", path);
    }
    /* Every rank file must be listed, and every listed file must check out. */
    for (int r = 0; r < v->world; r++) {
        char name[64];
        snprintf(name, sizeof name, "optim_rank%d.safetensors", r);
        if (json_object_get(files, name) == NULL) {
            view_free_(v);
            return zdp_err_set(err, ZDP_ERR_FORMAT, "%s: lists no %s for rank %d of %d", path,
                               name, r, v->world);
        }
    }
    const char *name;
    json_t *info;
    json_object_foreach(files, name, info) {
        char fpath[PATH_MAX_ + 96];
        snprintf(fpath, sizeof fpath, "%s/%s", v->dir, name);
        const char *want = json_string_value(json_object_get(info, "fnv1a64"));
        json_t *bytes = json_object_get(info, "bytes");
        uint64_t h = 0;
        int64_t size = 0;
        /* Messages first: name, want and bytes live in v->meta. */
        zdp_status bad = ZDP_OK;
        if (strchr(name, '/') != NULL || want == NULL || !json_is_integer(bytes))
            bad = zdp_err_set(err, ZDP_ERR_FORMAT, "%s: bad entry for file \"%s\"", path, name);
        else if (file_digest_(fpath, &h, &size) != 0)
            bad = zdp_err_set(err, ZDP_ERR_IO, "%s: cannot read (%s); the checkpoint is "
                                               "incomplete", fpath, strerror(errno));
        if (bad != ZDP_OK) {
            view_free_(v);
            return bad;
        }
        char got[32];
        snprintf(got, sizeof got, "%016llx", (unsigned long long)h);
        if (size != (int64_t)json_integer_value(bytes) || strcmp(got, want) != 0) {
            bad = zdp_err_set(err, ZDP_ERR_FORMAT,
                              "%s: %lld bytes, checksum %s; meta.json says %lld bytes, %s: the "
                              "file is truncated or corrupted", fpath, (long long)size, got,
                              (long long)json_integer_value(bytes), want);
            view_free_(v);
            return bad;
        }
    }
    return ZDP_OK;
}

static const zdp_tensor *find_f32_(const zdp_safetensors *st, const char *name, int64_t n,
                                   const char *file, zdp_error *err) {
    const zdp_tensor *t = zdp_safetensors_find(st, name);
    if (t == NULL) {
        zdp_err_set(err, ZDP_ERR_FORMAT, "%s: tensor \"%s\" is missing", file, name);
        return NULL;
    }
    if (t->dtype != ZDP_DTYPE_F32 || t->ndim != 1 || t->shape[0] != n) {
        zdp_err_set(err, ZDP_ERR_FORMAT, "%s: tensor \"%s\" is %s with %lld elements; expected "
                                         "F32 [%lld]", file, name, zdp_dtype_name(t->dtype),
                    (long long)(t->ndim == 1 ? t->shape[0] : -1), (long long)n);
        return NULL;
    }
    return t;
}

/* ---- load ----------------------------------------------------------------------- */

typedef struct staged {
    float *params;        /* (numel) */
    float *m, *v;         /* (numel) full flat optimizer state, or NULL */
    float *grads;         /* rank-local window gradients: stage 0/1 (numel), stage 2 (owned) */
    int64_t grads_n;
} staged;

static void staged_free_(staged *s) {
    free(s->params);
    free(s->m);
    free(s->v);
    free(s->grads);
    memset(s, 0, sizeof *s);
}

/* The checkpoint's "model" against this model's shape_json, key by key (a
 * side without one is not checked: format 1, or a model without it). */
static zdp_status check_shape_(const zdp_engine *e, const ckpt_view *v, zdp_error *err) {
    json_t *saved = json_object_get(v->meta, "model");
    if (saved == NULL || e->model->shape_json == NULL) return ZDP_OK;
    if (!json_is_object(saved))
        return zdp_err_set(err, ZDP_ERR_FORMAT, "%s/meta.json: \"model\" is not an object",
                           v->dir);
    json_t *mine = json_loads(e->model->shape_json, 0, NULL);
    if (!json_is_object(mine)) {
        json_decref(mine);
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "load_checkpoint: the model's shape_json is not a JSON object");
    }
    zdp_status st = ZDP_OK;
    for (int pass = 0; pass < 2 && st == ZDP_OK; pass++) {
        /* Saved keys first, then keys only this model has. */
        json_t *from = pass == 0 ? saved : mine, *other = pass == 0 ? mine : saved;
        const char *key;
        json_t *val;
        json_object_foreach(from, key, val) {
            json_t *o = json_object_get(other, key);
            if (o != NULL && json_equal(o, val)) continue;
            json_t *a = pass == 0 ? val : o, *b = pass == 0 ? o : val;
            char *sa = a ? json_dumps(a, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
            char *sb = b ? json_dumps(b, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
            /* The zdp command's flag for the key: n_head -> --n-head. */
            char flag[64];
            snprintf(flag, sizeof flag, "%s", key);
            for (char *p = flag; *p; p++)
                if (*p == '_') *p = '-';
            const char *plain = json_is_string(a) ? json_string_value(a) : sa;
            char hint[256] = "";
            if (plain != NULL)
                snprintf(hint, sizeof hint, " (the zdp command: --%s %.100s)", flag, plain);
            st = zdp_err_set(err, ZDP_ERR_CONFIG,
                             "%s/meta.json: the checkpoint's model has %s = %s, this model has "
                             "%s = %s; build the model with the checkpoint's shape%s", v->dir,
                             key, sa ? sa : "(none)", key, sb ? sb : "(none)", hint);
            free(sa);
            free(sb);
            break;
        }
    }
    json_decref(mine);
    return st;
}

/* Reads and checks everything into s; the engine is not touched. */
static zdp_status stage_(zdp_engine *e, const ckpt_view *v, staged *s, zdp_error *err) {
    const zdp_model *model = e->model;
    char path[PATH_MAX_ + 64];
    zdp_status shape = check_shape_(e, v, err);
    if (shape != ZDP_OK) return shape;
    if (v->numel != e->lay.numel)
        return zdp_err_set(err, ZDP_ERR_CONFIG,
                           "%s/meta.json: the checkpoint's model has %lld parameters, this one "
                           "%lld; load it into the same model (same sizes and layers)",
                           v->dir, (long long)v->numel, (long long)e->lay.numel);
    if (v->pending > 0 && (v->world != e->world || v->stage != e->cfg.zero.stage))
        return zdp_err_set(err, ZDP_ERR_UNSUPPORTED,
                           "%s: saved in the middle of an accumulation window (%lld backward "
                           "call(s) pending) at world size %d, ZeRO stage %d; those gradients "
                           "belong to that job's ranks, so it resumes only at world size %d and "
                           "stage %d (this job: %d, %d); save at a step boundary to change them",
                           v->dir, (long long)v->pending, v->world, v->stage, v->world, v->stage,
                           e->world, e->cfg.zero.stage);
    const char *opt = json_string_value(json_object_get(json_object_get(v->meta, "config"), "optimizer"));
    bool ck_sgd = opt != NULL && strcmp(opt, "SGD") == 0;
    if (ck_sgd != !is_adam_(e))
        return zdp_err_set(err, ZDP_ERR_CONFIG,
                           "%s/meta.json: saved with optimizer %s, this engine uses %s; their "
                           "states do not convert; use the same optimizer.type", v->dir,
                           opt ? opt : "?", is_adam_(e) ? "Adam/AdamW" : "SGD");
    const int64_t n = e->lay.numel;
    s->params = malloc((size_t)n * sizeof(float));
    bool need_m = e->optim.m != NULL;
    if (need_m) s->m = calloc((size_t)n, sizeof(float));
    if (is_adam_(e)) s->v = calloc((size_t)n, sizeof(float));
    if (s->params == NULL || (need_m && s->m == NULL) || (is_adam_(e) && s->v == NULL))
        return zdp_err_set(err, ZDP_ERR_NOMEM, "load_checkpoint: out of memory");

    /* The weights, by name, shapes checked. */
    snprintf(path, sizeof path, "%s/model.safetensors", v->dir);
    zdp_safetensors st;
    zdp_status rc = zdp_safetensors_read(path, &st, err);
    if (rc != ZDP_OK) return rc;
    for (int i = 0; i < model->n_params && rc == ZDP_OK; i++) {
        const zdp_param_info *p = &model->params[i];
        const zdp_tensor *t = zdp_safetensors_find(&st, p->name);
        bool same = t != NULL && t->dtype == ZDP_DTYPE_F32 && t->ndim == p->ndim;
        for (int d = 0; same && d < p->ndim; d++) same = t->shape[d] == p->shape[d];
        if (!same)
            rc = zdp_err_set(err, ZDP_ERR_CONFIG,
                             "%s: tensor \"%s\" is %s or has another shape than this model's; "
                             "the checkpoint is of a different model", path, p->name,
                             t == NULL ? "missing" : "present");
        else
            memcpy(s->params + e->lay.offsets[i], t->data, t->nbytes);
    }
    if (rc == ZDP_OK && st.n != model->n_params)
        rc = zdp_err_set(err, ZDP_ERR_CONFIG, "%s: %d tensors, this model has %d: a different model",
                         path, st.n, model->n_params);
    zdp_safetensors_free(&st);
    if (rc != ZDP_OK) return rc;

    /* The optimizer state: every rank file's slice, tiling [0, numel). */
    int64_t covered = 0;
    for (int r = 0; r < v->world && rc == ZDP_OK; r++) {
        snprintf(path, sizeof path, "%s/optim_rank%d.safetensors", v->dir, r);
        if ((rc = zdp_safetensors_read(path, &st, err)) != ZDP_OK) return rc;
        const zdp_tensor *range = zdp_safetensors_find(&st, "range");
        int64_t lo = 0, hi = 0;
        if (range == NULL || range->dtype != ZDP_DTYPE_I64 || range->ndim != 1 || range->shape[0] != 2) {
            rc = zdp_err_set(err, ZDP_ERR_FORMAT, "%s: no I64 [2] tensor \"range\"", path);
        } else {
            memcpy(&lo, range->data, sizeof lo);
            memcpy(&hi, (const char *)range->data + sizeof lo, sizeof hi);
            if (lo != covered || hi < lo || hi > n)
                rc = zdp_err_set(err, ZDP_ERR_FORMAT,
                                 "%s: range [%lld, %lld) does not continue the previous ranks' "
                                 "[0, %lld) within %lld parameters", path, (long long)lo,
                                 (long long)hi, (long long)covered, (long long)n);
        }
        const zdp_tensor *t;
        if (rc == ZDP_OK && is_adam_(e)) {
            if ((t = find_f32_(&st, "exp_avg", hi - lo, path, err)) == NULL) rc = err->code;
            else memcpy(s->m + lo, t->data, t->nbytes);
            if (rc == ZDP_OK && (t = find_f32_(&st, "exp_avg_sq", hi - lo, path, err)) == NULL) rc = err->code;
            else if (rc == ZDP_OK) memcpy(s->v + lo, t->data, t->nbytes);
        } else if (rc == ZDP_OK && need_m) {
            t = zdp_safetensors_find(&st, "momentum_buffer");
            /* A checkpoint saved without momentum leaves the buffer at zero. */
            if (t != NULL && (t = find_f32_(&st, "momentum_buffer", hi - lo, path, err)) == NULL) rc = err->code;
            else if (t != NULL) memcpy(s->m + lo, t->data, t->nbytes);
        }
        /* This rank's window gradients (same world size and stage, checked above). */
        if (rc == ZDP_OK && v->pending > 0 && r == e->rank) {
            const char *gname = e->cfg.zero.stage < 2 ? "local_grads" : "grad_partition";
            s->grads_n = e->cfg.zero.stage < 2 ? n : hi - lo;
            if ((t = find_f32_(&st, gname, s->grads_n, path, err)) == NULL) {
                rc = err->code;
            } else if ((s->grads = malloc((size_t)s->grads_n * sizeof(float))) == NULL) {
                rc = zdp_err_set(err, ZDP_ERR_NOMEM, "load_checkpoint: out of memory");
            } else {
                memcpy(s->grads, t->data, t->nbytes);
            }
        }
        covered = hi;
        zdp_safetensors_free(&st);
    }
    if (rc == ZDP_OK && covered != n)
        rc = zdp_err_set(err, ZDP_ERR_FORMAT, "%s: the rank files cover [0, %lld) of %lld "
                                              "parameters; a rank file is missing", v->dir,
                         (long long)covered, (long long)n);
    return rc;
}

/* Puts the staged state into the engine (cannot fail). */
static void commit_(zdp_engine *e, const ckpt_view *v, staged *s) {
    const int64_t n = e->lay.numel, P = e->lay.part;
    if (e->cfg.zero.stage < 3) {
        memcpy(e->params, s->params, (size_t)n * sizeof(float));
        memset(e->params + n, 0, (size_t)(e->lay.padded - n) * sizeof(float));
    } else {
        /* Stage 3 keeps its partition: [r*P, (r+1)*P), zeros past numel. */
        const int64_t plo = (int64_t)e->rank * P;
        const int64_t have = n - plo < P ? (n - plo > 0 ? n - plo : 0) : P;
        memset(e->params, 0, (size_t)P * sizeof(float));
        if (have > 0) memcpy(e->params, s->params + plo, (size_t)have * sizeof(float));
        zdp_stage3_params_changed(&e->s3);
    }
    /* The optimizer's range: everything at stage 0, the partition at 1/2. */
    int64_t origin = optim_origin_(e), len = e->optim.n;
    int64_t avail = n - origin < len ? n - origin : len;
    if (avail < 0) avail = 0;
    float *dst[2] = {e->optim.m, e->optim.v};
    const float *src[2] = {s->m, s->v};
    for (int k = 0; k < 2; k++) {
        if (dst[k] == NULL) continue;
        memset(dst[k], 0, (size_t)len * sizeof(float));
        if (src[k] != NULL) memcpy(dst[k], src[k] + origin, (size_t)avail * sizeof(float));
    }
    bool ok = true;
    json_t *c = json_object_get(v->meta, "counters");
    e->global_steps = get_int_(c, "global_steps", NULL, &ok);
    e->global_samples = get_int_(c, "global_samples", NULL, &ok);
    e->micro_steps = get_int_(c, "micro_steps", NULL, &ok);
    e->skipped_steps = get_int_(c, "skipped_steps", NULL, &ok);
    e->window_backwards = get_int_(c, "pending_backwards", NULL, &ok);
    e->optim.step_count = get_int_(c, "optimizer_step", NULL, &ok);
    e->sched_iter = get_int_(c, "scheduler_iteration", NULL, &ok);
    json_t *lr = json_object_get(c, "last_lr");
    e->last_lr = json_is_number(lr) ? json_number_value(lr) : -1.0;
    /* Hyperparameters set with zdp_engine_set_hparams are not in the
     * checkpoint (zdp.h): the loaded engine is the one a fresh job gets from
     * its config and this checkpoint, whatever was set on it before. */
    zdp_engine_hparams_from_config_(e);
    /* Gradients: cleared, then the window's when one was open. */
    if (e->grads != NULL) memset(e->grads, 0, (size_t)e->lay.padded * sizeof(float));
    if (e->grad_part != NULL) memset(e->grad_part, 0, (size_t)P * sizeof(float));
    if (s->grads != NULL) {
        if (e->cfg.zero.stage < 2) memcpy(e->grads, s->grads, (size_t)n * sizeof(float));
        else memcpy(e->grad_part, s->grads, (size_t)s->grads_n * sizeof(float));
    }
    e->have_forward = false;
    e->step_applied = false;
}

zdp_status zdp_engine_load_checkpoint(zdp_engine *e, const char *dir, const char *tag,
                                      char **client_json, zdp_error *err) {
    if (client_json != NULL) *client_json = NULL;
    if (e == NULL || dir == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "load_checkpoint: engine and dir are required");
    zdp_status st = zdp_engine_drain_(e, err);
    if (st != ZDP_OK) return st;
    ckpt_view v;
    staged s = {0};
    zdp_error local = {0};
    zdp_status mine = view_open_(dir, tag, &v, &local);
    bool have_view = mine == ZDP_OK;
    if (mine == ZDP_OK) mine = stage_(e, &v, &s, &local);
    /* Nobody commits unless everybody can. */
    int64_t failed[1] = {mine != ZDP_OK};
    if ((st = zdp_engine_allreduce_i64_(e, failed, 1, err)) == ZDP_OK && failed[0] != 0)
        st = mine != ZDP_OK ? (*err = local, local.code)
                            : zdp_err_set(err, ZDP_ERR_IO, "load_checkpoint: %lld other rank(s) "
                                                           "could not read the checkpoint in %s; "
                                                           "the engine is unchanged",
                                          (long long)failed[0], dir);
    if (st == ZDP_OK) {
        commit_(e, &v, &s);
        if (client_json != NULL) {
            json_t *client = json_object_get(v.meta, "client");
            *client_json = json_dumps(client ? client : json_object(), JSON_COMPACT);
        }
    }
    staged_free_(&s);
    if (have_view) view_free_(&v);
    return st;
}

/* ---- inspect and export ----------------------------------------------------------------- */

/* A string field or "?" (the text is for people; a missing field is shown). */
static const char *str_or_(json_t *v) {
    const char *s = json_string_value(v);
    return s != NULL ? s : "?";
}

zdp_status zdp_checkpoint_inspect(const char *dir, const char *tag, char **text, zdp_error *err) {
    *text = NULL;
    ckpt_view v;
    zdp_status st = view_open_(dir, tag, &v, err);
    if (st != ZDP_OK) return st;
    json_t *c = json_object_get(v.meta, "counters"), *cfg = json_object_get(v.meta, "config");
    bool ok = true;
    /* A growing buffer: fields of any length fit. */
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    if (f == NULL) {
        view_free_(&v);
        return zdp_err_set(err, ZDP_ERR_NOMEM, "out of memory");
    }
    fprintf(f, "checkpoint %s (zdp %s, format %d)\n", v.dir,
            str_or_(json_object_get(v.meta, "zdp_version")), v.version);
    json_t *shape = json_object_get(v.meta, "model");
    if (shape != NULL) {
        char *s = json_dumps(shape, JSON_COMPACT | JSON_ENCODE_ANY);
        fprintf(f, "  model shape: %s\n", s ? s : "?");
        free(s);
    }
    fprintf(f, "  saved by %d rank(s) at ZeRO stage %d, %s accumulation\n", v.world, v.stage,
            json_is_true(json_object_get(v.meta, "managed_gradient_accumulation")) ? "managed"
                                                                                     : "unmanaged");
    fprintf(f, "  model: %lld parameters in %zu tensors (padded to %lld, partition %lld)\n",
            (long long)v.numel, json_array_size(json_object_get(v.meta, "tensors")),
            (long long)get_int_(v.meta, "layout", "padded", &ok),
            (long long)get_int_(v.meta, "layout", "partition", &ok));
    fprintf(f, "  progress: %lld optimizer steps (%lld skipped), %lld samples, %lld micro-steps, "
               "optimizer step %lld, LR schedule at %lld (last lr %g)\n",
            (long long)get_int_(c, "global_steps", NULL, &ok),
            (long long)get_int_(c, "skipped_steps", NULL, &ok),
            (long long)get_int_(c, "global_samples", NULL, &ok),
            (long long)get_int_(c, "micro_steps", NULL, &ok),
            (long long)get_int_(c, "optimizer_step", NULL, &ok),
            (long long)get_int_(c, "scheduler_iteration", NULL, &ok),
            json_number_value(json_object_get(c, "last_lr")));
    fprintf(f, "  window: %s\n",
            v.pending > 0 ? "open: gradients of pending backward calls saved (resume at the "
                            "same world size and stage)"
                          : "closed (saved at a step boundary; resumes at any world size and "
                            "stage)");
    fprintf(f, "  optimizer %s, lr %g, micro-batch %lld x %lld accumulation steps = batch %lld\n",
            str_or_(json_object_get(cfg, "optimizer")), json_number_value(json_object_get(cfg, "lr")),
            (long long)get_int_(cfg, "train_micro_batch_size_per_gpu", NULL, &ok),
            (long long)get_int_(cfg, "gradient_accumulation_steps", NULL, &ok),
            (long long)get_int_(cfg, "train_batch_size", NULL, &ok));
    fprintf(f, "  files: model.safetensors (full fp32 weights) and %d optimizer slice(s); sizes "
               "and checksums verified; meta.json %s\n", v.world,
            v.version == 1 ? "has no checksum (format 1): unverified" : "checksum verified");
    char *client = json_dumps(json_object_get(v.meta, "client"), JSON_COMPACT);
    fprintf(f, "  client state: %s\n", client ? client : "{}");
    free(client);
    view_free_(&v);
    if (fclose(f) != 0) {
        free(out);
        return zdp_err_set(err, ZDP_ERR_NOMEM, "out of memory");
    }
    *text = out;
    return ZDP_OK;
}

zdp_status zdp_checkpoint_export(const char *dir, const char *tag, const char *out_path,
                                 zdp_error *err) {
    ckpt_view v;
    zdp_status st = view_open_(dir, tag, &v, err);
    if (st != ZDP_OK) return st;
    char path[PATH_MAX_ + 64];
    snprintf(path, sizeof path, "%s/model.safetensors", v.dir);
    json_t *shape = json_object_get(v.meta, "model");
    char *shape_text = json_is_object(shape) ? json_dumps(shape, JSON_COMPACT) : NULL;
    view_free_(&v);
    /* Re-written rather than copied: the output is validated and atomic.
     * The model's shape goes along, as in the checkpoint's own file. */
    zdp_safetensors sf;
    if ((st = zdp_safetensors_read(path, &sf, err)) == ZDP_OK) {
        const char *const meta[] = {"format", "pt", "zdp_model", shape_text};
        st = zdp_safetensors_write_meta(out_path, sf.tensors, sf.n, meta,
                                        shape_text != NULL ? 2 : 1, err);
        zdp_safetensors_free(&sf);
    }
    free(shape_text);
    return st;
}
