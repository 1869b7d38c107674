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
 * The files, their checksums and the reading of meta.json are
 * checkpoint_format.c's; this file decides what goes into them and runs a
 * save or a load between the ranks.  The model's shape_json is recorded as
 * "model", and a model of another shape is refused by key.
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
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "checkpoint_format.h"
#include "engine_impl.h"

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
        "format", ZDP_CKPT_FORMAT_NAME, "format_version", ZDP_CKPT_FORMAT_VERSION, "zdp_version", ZDP_VERSION,
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
    /* Last, so that zdp_ckpt_meta_sum_digits_ finds this one; filled in by save. */
    if (meta != NULL) json_object_set_new(meta, ZDP_CKPT_META_SUM_KEY, json_string("0000000000000000"));
    return meta;
}

/* ---- save --------------------------------------------------------------------- */

static void crash_point_(const char *where) {
    const char *v = getenv("ZDP_TEST_CKPT_CRASH");
    if (v != NULL && strcmp(v, where) == 0 && zdp_dist_rank() == 0) raise(SIGKILL);
}

/* The arguments, checked alike on every rank (the same model everywhere, so
 * every rank returns alike); *client: the client object, new or parsed. */
static zdp_status save_args_(const zdp_engine *e, const char *dir, const char *tag,
                             const char *client_json, json_t **client, zdp_error *err) {
    *client = NULL;
    if (e == NULL || dir == NULL || !zdp_ckpt_tag_ok_(tag))
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
        zdp_ckpt_rmdir_files_(tmpdir);
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
    if (st == ZDP_OK && zdp_ckpt_file_digest_(path, &h, &size) != 0)
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
    char path[ZDP_CKPT_PATH_MAX + 64];
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
        if (e->rank == 0) zdp_ckpt_rmdir_files_(tmpdir);
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
    char *digits = text ? zdp_ckpt_meta_sum_digits_(text, strlen(text)) : NULL;
    if (digits == NULL) {
        free(text);
        errno = EINVAL; /* a model shape_json that is not a JSON object */
        return NULL;
    }
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx",
             (unsigned long long)zdp_ckpt_meta_sum_(text, strlen(text), digits));
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
    char old[ZDP_CKPT_PATH_MAX + 32];
    snprintf(old, sizeof old, "%s.old.%ld", final, (long)getpid());
    struct stat sb;
    bool exists = stat(final, &sb) == 0, swapped = false, had_old = false;
#ifdef RENAME_EXCHANGE
    if (exists && renameat2(AT_FDCWD, tmpdir, AT_FDCWD, final, RENAME_EXCHANGE) == 0) {
        swapped = true;
        crash_point_("replace");
        zdp_ckpt_rmdir_files_(tmpdir); /* now the old checkpoint */
    }
#endif
    if (!swapped) had_old = exists && rename(final, old) == 0;
    if (!swapped && rename(tmpdir, final) != 0) {
        zdp_err_set(local, ZDP_ERR_IO, "save_checkpoint: cannot rename %s to %s: %s", tmpdir,
                    final, strerror(errno));
        if (had_old) rename(old, final);
        return -1;
    }
    if (had_old) zdp_ckpt_rmdir_files_(old);
    return 0;
}

/* Rank 0's part of phase 3: meta.json, the directory, then latest.
 * 0, or -1 with *local set. */
static int save_commit_rank0_(zdp_engine *e, const char *dir, const char *tag,
                              const char *tmpdir, const char *final, json_t *client,
                              const int64_t *rec, zdp_error *local) {
    char path[ZDP_CKPT_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/meta.json", tmpdir);
    char *text = save_meta_text_(e, tag, client, rec);
    if (text == NULL || zdp_ckpt_write_atomic_(path, text) != 0) {
        zdp_err_set(local, ZDP_ERR_IO, "save_checkpoint: cannot write %s: %s", path,
                    strerror(errno));
        free(text);
        return -1;
    }
    free(text);
    zdp_ckpt_fsync_dir_(tmpdir);
    crash_point_("meta");
    if (save_replace_dir_(tmpdir, final, local) != 0) return -1;
    zdp_ckpt_fsync_dir_(dir);
    crash_point_("latest");
    char latest[ZDP_CKPT_PATH_MAX + 16], line[256];
    snprintf(latest, sizeof latest, "%s/latest", dir);
    snprintf(line, sizeof line, "%s\n", tag);
    int rc = 0;
    if (zdp_ckpt_write_atomic_(latest, line) != 0) {
        zdp_err_set(local, ZDP_ERR_IO, "save_checkpoint: cannot write %s: %s", latest,
                    strerror(errno));
        rc = -1;
    }
    zdp_ckpt_fsync_dir_(dir);
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
    char tmpdir[ZDP_CKPT_PATH_MAX], final[ZDP_CKPT_PATH_MAX];
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
    char path[ZDP_CKPT_PATH_MAX + 64];
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
            if ((t = zdp_ckpt_find_f32_(&st, "exp_avg", hi - lo, path, err)) == NULL) rc = err->code;
            else memcpy(s->m + lo, t->data, t->nbytes);
            if (rc == ZDP_OK && (t = zdp_ckpt_find_f32_(&st, "exp_avg_sq", hi - lo, path, err)) == NULL) rc = err->code;
            else if (rc == ZDP_OK) memcpy(s->v + lo, t->data, t->nbytes);
        } else if (rc == ZDP_OK && need_m) {
            t = zdp_safetensors_find(&st, "momentum_buffer");
            /* A checkpoint saved without momentum leaves the buffer at zero. */
            if (t != NULL && (t = zdp_ckpt_find_f32_(&st, "momentum_buffer", hi - lo, path, err)) == NULL) rc = err->code;
            else if (t != NULL) memcpy(s->m + lo, t->data, t->nbytes);
        }
        /* This rank's window gradients (same world size and stage, checked above). */
        if (rc == ZDP_OK && v->pending > 0 && r == e->rank) {
            const char *gname = e->cfg.zero.stage < 2 ? "local_grads" : "grad_partition";
            s->grads_n = e->cfg.zero.stage < 2 ? n : hi - lo;
            if ((t = zdp_ckpt_find_f32_(&st, gname, s->grads_n, path, err)) == NULL) {
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
    e->global_steps = zdp_ckpt_get_int_(c, "global_steps", NULL, &ok);
    e->global_samples = zdp_ckpt_get_int_(c, "global_samples", NULL, &ok);
    e->micro_steps = zdp_ckpt_get_int_(c, "micro_steps", NULL, &ok);
    e->skipped_steps = zdp_ckpt_get_int_(c, "skipped_steps", NULL, &ok);
    e->window_backwards = zdp_ckpt_get_int_(c, "pending_backwards", NULL, &ok);
    e->optim.step_count = zdp_ckpt_get_int_(c, "optimizer_step", NULL, &ok);
    e->sched_iter = zdp_ckpt_get_int_(c, "scheduler_iteration", NULL, &ok);
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
    zdp_status mine = zdp_ckpt_view_open_(dir, tag, &v, &local);
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
    if (have_view) zdp_ckpt_view_free_(&v);
    return st;
}

