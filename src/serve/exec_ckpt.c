/*
 * exec_ckpt.c -- the ops that write or read files, on every rank
 * (docs/server.md): save_weights (a weights file, or a LoRA model's PEFT
 * adapter folder), save_state and load_state (the engine's checkpoints),
 * load_weights (a checkpoint's weights with a fresh optimizer), and the
 * delete of a Tinker checkpoint.  A success leaves a serve_save_result on
 * rank 0's job; a step that failed on some ranks names each of them.
 */
#define _POSIX_C_SOURCE 200809L
#define _XOPEN_SOURCE 700 /* nftw */
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/core.h"
#include "serve_impl.h"
#include "zdp/lora.h"

/* Rank 0, a save or load that succeeded: its typed result, with the
 * engine's counters after it. */
static void finish_save_(server *s, job *j, const char *path) {
    const serve_save_result r = {.op = j->op, .path = (char *)path, .step = zdp_engine_global_steps(s->eng),
                                 .global_samples = zdp_engine_global_samples(s->eng),
                                 .pending_backwards = zdp_engine_pending_backwards(s->eng)};
    if ((j->saved = serve_save_result_copy(&r)) == NULL)
        serve_die("serve", &(zdp_error){.msg = "out of memory for a save's result"});
    j->status = 200;
}

/* A LoRA model's adapters as a PEFT adapter folder at dir (rank 0):
 * adapter_model.safetensors and adapter_config.json, base_model_name_or_path
 * the served model's name (docs/lora.md). */
static zdp_status save_adapter_(server *s, const char *dir, zdp_error *err) {
    /* At stage 3 every rank gathers the adapters; rank 0 writes them. */
    if (s->R != 0 && s->cfg.zero.stage < 3) return ZDP_OK;
    float **v = serve_adapters_get(s, true, err);
    if (v == NULL) return err->code;
    zdp_status st = s->R == 0 ? zdp_lora_save_adapter(dir, s->cur, (const float *const *)v, s->opt.model_name, err)
                              : ZDP_OK;
    serve_adapters_free(s, v);
    return st;
}

void serve_exec_save_weights(server *s, job *j) {
    /* Rank 0 writes the file; at stage 3 (--full-finetune) every rank
     * gathers the weights first. */
    if (s->R != 0 && s->cfg.zero.stage < 3) return;
    const char *path = (const char *)j->payload;
    zdp_error err = {0};
    if (serve_lora(s)) { /* the adapter, a PEFT folder: what sampling and users take */
        zdp_status st = save_adapter_(s, path, &err);
        if (s->R != 0) return;
        if (st != ZDP_OK) {
            serve_job_fail(j, serve_status_of(st), "path", err.msg);
            return;
        }
        finish_save_(s, j, path);
        return;
    }
    float **v = serve_weights_get(s, true, &err);
    if (v == NULL || s->R != 0) {
        serve_weights_free(s, v);
        if (s->R != 0) return;
        serve_job_fail(j, 500, "path", err.msg);
        return;
    }
    zdp_status st = s->opt.lm.save(s->opt.lm.ctx, path, &s->model, (const float *const *)v, &err);
    serve_weights_free(s, v);
    if (st != ZDP_OK) {
        serve_job_fail(j, serve_status_of(st), "path", err.msg);
        return;
    }
    finish_save_(s, j, path);
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
    if (s->R == 0 && all == NULL) serve_die("serve", &(zdp_error){.msg = "out of memory"});
    zdp_error err;
    if (zdp_channel_gather(s->ch, mine, (int64_t)sizeof mine, all, &err) != ZDP_OK) serve_die("serve", &err);
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

void serve_exec_state(server *s, job *j) {
    const char *name = (const char *)j->payload;
    char path[4096];
    const bool fits = snprintf(path, sizeof path, "%s%s%s", name[0] == '/' ? "" : s->ckpt_root,
                               name[0] == '/' ? "" : "/", name) < (int)sizeof path;
    if (!zdp_dist_all_ok(fits)) { /* every rank, before the engine's collectives */
        if (s->R != 0) return;
        serve_job_fail(j, 400, "path", "path: too long once joined to the checkpoint folder");
        return;
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
        serve_die("load_state", &(zdp_error){.msg = "another rank failed to load the checkpoint"});
    char why[2048];
    int bad_st = 0;
    if (!all) failed_ranks_(s, st, err.msg, &bad_st, why, sizeof why);
    /* A LoRA model's checkpoint is a PEFT adapter folder too (beside the
     * engine's files), as Tinker's checkpoint download gives; at stage 3
     * every rank takes part in gathering it. */
    if (all && j->op == OP_SAVE_STATE && serve_lora(s)) st = save_adapter_(s, path, &err);
    if (s->R != 0) return;
    if (!all) {
        serve_job_fail(j, serve_status_of((zdp_status)bad_st), "path", why);
        return;
    }
    if (j->op == OP_SAVE_STATE && serve_lora(s) && st != ZDP_OK) {
        serve_job_fail(j, serve_status_of(st), "path", err.msg);
        return;
    }
    finish_save_(s, j, path);
}

/* A LoRA model's adapters from a checkpoint's model.safetensors (the
 * engine's checkpoint of a LoRA model names them as PEFT does): every
 * tensor present, F32, of the model's shape, or refused naming it before
 * anything changes.  Rank 0; sync_params then gives every rank the values. */
static zdp_status load_adapters_(server *s, const char *path, float *const *dst, zdp_error *err) {
    zdp_safetensors st;
    if (zdp_safetensors_read(path, &st, err) != ZDP_OK) return err->code;
    const zdp_model *m = s->cur;
    zdp_status rc = ZDP_OK;
    if (st.n != m->n_params)
        rc = zdp_err_set(err, ZDP_ERR_INVALID_ARG, "%s: %d tensors, but this LoRA model has %d (%s): a "
                         "checkpoint of another model's LoRA configuration", path, st.n, m->n_params,
                         m->shape_json != NULL ? m->shape_json : "");
    for (int i = 0; rc == ZDP_OK && i < m->n_params; i++) {
        const zdp_param_info *p = &m->params[i];
        const zdp_tensor *t = zdp_safetensors_find(&st, p->name);
        bool same = t != NULL && t->dtype == ZDP_DTYPE_F32 && t->ndim == p->ndim;
        for (int d = 0; same && d < p->ndim; d++) same = t->shape[d] == p->shape[d];
        if (!same)
            rc = zdp_err_set(err, ZDP_ERR_INVALID_ARG, "%s: tensor %s is %s; this LoRA model needs it F32 of "
                             "shape [%lld, %lld] (a checkpoint of another base or rank)", path, p->name,
                             t == NULL ? "missing" : "of another dtype or shape", (long long)p->shape[0],
                             (long long)(p->ndim > 1 ? p->shape[1] : 1));
    }
    for (int i = 0; rc == ZDP_OK && i < m->n_params; i++) {
        const zdp_tensor *t = zdp_safetensors_find(&st, m->params[i].name);
        memcpy(dst[i], t->data, t->nbytes);
    }
    zdp_safetensors_free(&st);
    return rc;
}

/* Tinker's load_weights without the optimizer: the weights of a checkpoint
 * (its model.safetensors) and a fresh optimizer state.  Rank 0 reads into
 * scratch memory, so a failed read changes nothing; sync_params then gives
 * every rank the new weights. */
void serve_exec_load_weights(server *s, job *j) {
    const char *path = (const char *)j->payload;
    zdp_error err = {0};
    zdp_status st = ZDP_OK;
    if (s->R == 0 && serve_lora(s) && s->cfg.zero.stage < 3) {
        float **v = serve_adapters_get(s, false, &err);
        st = v == NULL ? err.code : load_adapters_(s, path, v, &err);
        serve_adapters_free(s, v);
    } else if (s->cfg.zero.stage == 3) {
        /* No rank holds what sync_params would broadcast: rank 0 reads into
         * every rank's whole copy by broadcast, and each keeps its slice
         * (the LoRA model's adapters, or --full-finetune's weights). */
        const bool lora = serve_lora(s);
        float **v = lora ? serve_adapters_get(s, false, &err) : serve_weights_get(s, false, &err);
        if (!zdp_dist_all_ok(v != NULL)) {
            lora ? serve_adapters_free(s, v) : serve_weights_free(s, v);
            if (s->R != 0) return;
            serve_job_fail(j, 500, "path", v == NULL ? err.msg : "another rank is out of memory for the weights");
            return;
        }
        if (s->R == 0)
            st = lora ? load_adapters_(s, path, v, &err) : s->opt.lm.load(s->opt.lm.ctx, path, &s->model, v, &err);
        int ok = st == ZDP_OK;
        if (zdp_channel_bcast(s->ch, &ok, (int64_t)sizeof ok, &err) != ZDP_OK) serve_die("load_weights", &err);
        if (ok) {
            const int64_t nbytes = zdp_engine_numel(s->eng) * (int64_t)sizeof(float);
            if (zdp_channel_bcast(s->ch, v[0], nbytes, &err) != ZDP_OK) serve_die("load_weights", &err);
            if ((lora ? serve_adapters_push(s, v, &err) : serve_weights_push(s, v, &err)) != ZDP_OK)
                serve_die("load_weights", &err);
            zdp_engine_reset_optimizer_state(s->eng);
        }
        lora ? serve_adapters_free(s, v) : serve_weights_free(s, v);
        if (s->R != 0) return;
        if (!ok) {
            serve_job_fail(j, serve_status_of(st), "path", err.msg);
            return;
        }
        finish_save_(s, j, path);
        return;
    } else if (s->R == 0) {
        const int np = s->model.n_params;
        float **tmp = calloc((size_t)np, sizeof *tmp);
        st = tmp == NULL ? ZDP_ERR_NOMEM : ZDP_OK;
        for (int i = 0; st == ZDP_OK && i < np; i++) {
            tmp[i] = malloc((size_t)serve_numel(&s->model.params[i]) * sizeof(float));
            if (tmp[i] == NULL) st = ZDP_ERR_NOMEM;
        }
        if (st == ZDP_ERR_NOMEM) snprintf(err.msg, sizeof err.msg, "out of memory for the weights");
        if (st == ZDP_OK)
            st = s->opt.lm.load(s->opt.lm.ctx, path, &s->model, tmp, &err);
        for (int i = 0; st == ZDP_OK && i < np; i++)
            memcpy(zdp_engine_param_data(s->eng, i), tmp[i], (size_t)serve_numel(&s->model.params[i]) * sizeof(float));
        for (int i = 0; tmp != NULL && i < np; i++) free(tmp[i]);
        free(tmp);
    }
    int ok = st == ZDP_OK;
    if (zdp_channel_bcast(s->ch, &ok, (int64_t)sizeof ok, &err) != ZDP_OK) serve_die("load_weights", &err);
    if (ok) {
        if (zdp_engine_sync_params(s->eng, &err) != ZDP_OK) serve_die("load_weights", &err);
        zdp_engine_reset_optimizer_state(s->eng);
    }
    if (s->R != 0) return;
    if (!ok) {
        serve_job_fail(j, serve_status_of(st), "path", err.msg);
        return;
    }
    finish_save_(s, j, path);
}

static int unlink_one_(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

/* Removes path (a file, or a folder and everything in it); a path that is
 * not there is nothing to do.  0, or -1 with errno. */
static int remove_tree_(const char *path) {
    struct stat sb;
    if (lstat(path, &sb) != 0) return errno == ENOENT ? 0 : -1;
    return S_ISDIR(sb.st_mode) ? nftw(path, unlink_one_, 16, FTW_DEPTH | FTW_PHYS) : remove(path);
}

/* DELETE of a Tinker checkpoint (tinker/runs.c): the payload is its path
 * relative to the checkpoint folder; every rank removes its own part.  Rank
 * 0 first, then the others, so ranks sharing one folder never remove the
 * same files at once.  On the queue, so never while a load of it runs. */
void serve_exec_delete(server *s, job *j) {
    char path[4096];
    const bool fits = snprintf(path, sizeof path, "%s/%s", s->ckpt_root, (const char *)j->payload) <
                      (int)sizeof path;
    int rc = fits && s->R == 0 ? remove_tree_(path) : 0;
    int code = errno;
    const bool first = zdp_dist_all_ok(rc == 0); /* rank 0 done: the others' turn */
    if (fits && s->R != 0 && first) {
        rc = remove_tree_(path);
        code = errno;
    }
    char msg[ZDP_ERROR_MSG_MAX];
    snprintf(msg, sizeof msg, "cannot remove %.600s in the checkpoint folder: %s", (const char *)j->payload,
             fits ? strerror(code) : "path too long");
    const zdp_status st = fits && rc == 0 ? ZDP_OK : ZDP_ERR_IO;
    const bool all = zdp_dist_all_ok(st == ZDP_OK);
    char why[2048];
    int bad_st = 0;
    if (!all) failed_ranks_(s, st, msg, &bad_st, why, sizeof why);
    if (s->R != 0) return;
    /* asample keeps the last sampler weights it read: not these any more. */
    if (s->snap_path != NULL && !strcmp(s->snap_path, path)) serve_free_snapshot(s);
    if (!all) {
        serve_job_fail(j, 500, "checkpoint_id", why);
        return;
    }
    j->status = 200; /* the wire format answers with the payload's path */
}

/* Copies src (a file, or a folder and its files and subfolders) to dst as
 * bytes, not links: the copy must not change when the source is written
 * again.  A file already at dst is kept (a rank sharing the folder copied
 * it).  0, or -1 with errno. */
static int copy_tree_(const char *src, const char *dst) {
    struct stat sb;
    if (lstat(src, &sb) != 0) return -1;
    if (S_ISDIR(sb.st_mode)) {
        if (mkdir(dst, 0755) != 0 && errno != EEXIST) return -1;
        DIR *d = opendir(src);
        if (d == NULL) return -1;
        int rc = 0;
        for (struct dirent *e; rc == 0 && (e = readdir(d)) != NULL;) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char a[4096], b[4096];
            if (snprintf(a, sizeof a, "%s/%s", src, e->d_name) >= (int)sizeof a ||
                snprintf(b, sizeof b, "%s/%s", dst, e->d_name) >= (int)sizeof b) {
                errno = ENAMETOOLONG;
                rc = -1;
            } else {
                rc = copy_tree_(a, b);
            }
        }
        const int code = errno;
        closedir(d);
        errno = code;
        return rc;
    }
    if (!S_ISREG(sb.st_mode)) return 0; /* a checkpoint holds files and folders only */
    FILE *in = fopen(src, "rb");
    if (in == NULL) return -1;
    FILE *out = fopen(dst, "wbx");
    if (out == NULL) {
        const int code = errno;
        fclose(in);
        errno = code;
        return code == EEXIST ? 0 : -1;
    }
    char buf[1 << 16];
    size_t n;
    int rc = 0;
    while (rc == 0 && (n = fread(buf, 1, sizeof buf, in)) > 0)
        if (fwrite(buf, 1, n, out) != n) rc = -1;
    if (ferror(in)) rc = -1;
    const int code = errno;
    fclose(in);
    if (fclose(out) != 0) rc = -1;
    if (rc != 0) {
        remove(dst); /* no half file that a later rank would keep */
        errno = code;
    }
    return rc;
}

void serve_exec_copy(server *s, job *j) {
    const char *src_rel = (const char *)j->payload;
    const char *dst_rel = src_rel + strlen(src_rel) + 1;
    char src[4096], dst[4096], parent[4096];
    const bool fits = snprintf(src, sizeof src, "%s/%s", s->ckpt_root, src_rel) < (int)sizeof src &&
                      snprintf(dst, sizeof dst, "%s/%s", s->ckpt_root, dst_rel) < (int)sizeof dst;
    snprintf(parent, sizeof parent, "%s", dst);
    char *slash = strrchr(parent, '/');
    if (slash != NULL) *slash = '\0';
    /* Rank 0 first, then the others (as a delete): ranks sharing one folder
     * find rank 0's files there and keep them. */
    int rc = fits && s->R == 0 ? (serve_mkdirs(parent) == 0 ? copy_tree_(src, dst) : -1) : 0;
    int code = errno;
    const bool first = zdp_dist_all_ok(rc == 0);
    if (fits && s->R != 0 && first) {
        struct stat sb;
        /* A rank without the source (a node whose folder never held this
         * checkpoint's part) has nothing to copy. */
        rc = lstat(src, &sb) != 0 ? 0 : serve_mkdirs(parent) == 0 ? copy_tree_(src, dst) : -1;
        code = errno;
    }
    char msg[ZDP_ERROR_MSG_MAX];
    snprintf(msg, sizeof msg, "cannot copy %.400s to %.400s in the checkpoint folder: %s", src_rel, dst_rel,
             fits ? strerror(code) : "path too long");
    const zdp_status st = fits && rc == 0 ? ZDP_OK : ZDP_ERR_IO;
    const bool all = zdp_dist_all_ok(st == ZDP_OK);
    char why[2048];
    int bad_st = 0;
    if (!all) failed_ranks_(s, st, msg, &bad_st, why, sizeof why);
    if (s->R != 0) return;
    if (!all) {
        serve_job_fail(j, 500, "source_path", why);
        return;
    }
    j->status = 200;
}
