/*
 * checkpoint_format.c -- the checkpoint format on disk (docs/checkpoints.md):
 * its files and their checksums, opening and checking a checkpoint's
 * meta.json (ckpt_view), and the engine-free commands over a checkpoint
 * (zdp_checkpoint_inspect, zdp_checkpoint_export).
 *
 * Integrity: meta.json lists the size and FNV-1a 64 of every other file,
 * and carries its own checksum, "meta_fnv1a64": the FNV-1a 64 of the file's
 * exact bytes with those 16 hex digits read as '0's.  Over the bytes rather
 * than a re-serialisation, so a reader (another program, another jansson)
 * needs no canonical JSON writer to check it; any change to a counter, a
 * shape or the client state is refused.  Format 1 files have no checksum and
 * load with a warning.  What the engine writes into the files and how a
 * save or a load runs between the ranks is checkpoint.c's.
 */
#define _GNU_SOURCE /* open_memstream */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint_format.h"
#include "zdp/dist.h"
#include "zdp/engine.h" /* zdp_checkpoint_inspect, _export: exported (ZDP_API) */

#define FNV_BASIS_ 0xcbf29ce484222325ULL
#define FNV_PRIME_ 0x100000001b3ULL

/* ---- files ------------------------------------------------------------------ */

/* FNV-1a 64 of a whole file, and its size.  -1 on I/O error. */
int zdp_ckpt_file_digest_(const char *path, uint64_t *hash, int64_t *size) {
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
char *zdp_ckpt_meta_sum_digits_(char *text, size_t n) {
    static const char key[] = "\"" ZDP_CKPT_META_SUM_KEY "\"";
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
uint64_t zdp_ckpt_meta_sum_(const char *text, size_t n, const char *digits) {
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

void zdp_ckpt_fsync_dir_(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

/* Writes text to path through a temporary file, fsync and rename. */
int zdp_ckpt_write_atomic_(const char *path, const char *text) {
    char tmp[ZDP_CKPT_PATH_MAX + 32];
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
void zdp_ckpt_rmdir_files_(const char *dir) {
    DIR *d = opendir(dir);
    if (d == NULL) return;
    struct dirent *ent;
    while ((ent = readdir(d)) != NULL) {
        if (!strcmp(ent->d_name, ".") || !strcmp(ent->d_name, "..")) continue;
        char p[ZDP_CKPT_PATH_MAX * 2];
        snprintf(p, sizeof p, "%s/%s", dir, ent->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

bool zdp_ckpt_tag_ok_(const char *tag) {
    return tag != NULL && tag[0] != '\0' && strchr(tag, '/') == NULL && strcmp(tag, ".") != 0 &&
           strcmp(tag, "..") != 0 && strlen(tag) < 200;
}

/* ---- reading a checkpoint ------------------------------------------------------------ */

void zdp_ckpt_view_free_(ckpt_view *v) {
    json_decref(v->meta);
    v->meta = NULL;
}

static zdp_status read_latest_(const char *dir, char *tag, size_t n, zdp_error *err) {
    char path[ZDP_CKPT_PATH_MAX + 16];
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
    if (!zdp_ckpt_tag_ok_(line))
        return zdp_err_set(err, ZDP_ERR_FORMAT, "%s: \"%s\" is not a checkpoint tag", path, line);
    snprintf(tag, n, "%s", line);
    return ZDP_OK;
}

int64_t zdp_ckpt_get_int_(json_t *obj, const char *a, const char *b, bool *ok) {
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
    json_t *field = json_object_get(meta, ZDP_CKPT_META_SUM_KEY);
    if (version == 1 && field == NULL) {
        if (zdp_dist_rank() == 0)
            zdp_log(1, "%s: format_version 1 has no meta.json checksum (saved by an older "
                       "zdp), so its counters and client state load unverified; save the "
                       "checkpoint again to get one", path);
        return ZDP_OK;
    }
    const char *want = json_string_value(field);
    char *digits = zdp_ckpt_meta_sum_digits_(text, n);
    bool hex = want != NULL && strlen(want) == 16 && strspn(want, "0123456789abcdef") == 16;
    if (!hex || digits == NULL || memcmp(digits, want, 16) != 0)
        return zdp_err_set(err, ZDP_ERR_FORMAT,
                           "%s: no valid \"" ZDP_CKPT_META_SUM_KEY "\" (16 lowercase hex digits): the "
                           "file was edited or damaged after it was saved; fix: restore it from a copy, or load another checkpoint "
                           "(another tag)", path);
    uint64_t got = zdp_ckpt_meta_sum_(text, n, digits);
    char hexgot[17];
    snprintf(hexgot, sizeof hexgot, "%016llx", (unsigned long long)got);
    if (memcmp(hexgot, want, 16) != 0)
        return zdp_err_set(err, ZDP_ERR_FORMAT,
                           "%s: checksum mismatch: the file says " ZDP_CKPT_META_SUM_KEY " %.16s, its "
                           "content hashes to %s; it was changed or damaged after it was saved, "
                           "and a changed counter or shape would load silently wrong; fix: "
                           "restore it from a copy, or load another checkpoint (another tag)",
                           path, want, hexgot);
    return ZDP_OK;
}

/* Opens dir/tag/meta.json, checks the format and every file's checksum. */
zdp_status zdp_ckpt_view_open_(const char *dir, const char *tag, ckpt_view *v, zdp_error *err) {
    memset(v, 0, sizeof *v);
    zdp_status st;
    if (tag == NULL) {
        if ((st = read_latest_(dir, v->tag, sizeof v->tag, err)) != ZDP_OK) return st;
    } else if (!zdp_ckpt_tag_ok_(tag)) {
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "checkpoint tag \"%s\" must be a plain name", tag);
    } else {
        snprintf(v->tag, sizeof v->tag, "%s", tag);
    }
    snprintf(v->dir, sizeof v->dir, "%s/%s", dir, v->tag);
    char path[ZDP_CKPT_PATH_MAX + 64];
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
    int64_t version = zdp_ckpt_get_int_(v->meta, "format_version", NULL, &ok);
    if (!json_is_object(v->meta) || fmt == NULL || strcmp(fmt, ZDP_CKPT_FORMAT_NAME) != 0 || !ok) {
        zdp_ckpt_view_free_(v);
        free(text);
        return zdp_err_set(err, ZDP_ERR_FORMAT, "%s: not a zdp checkpoint (no \"format\": \"%s\")",
                           path, ZDP_CKPT_FORMAT_NAME);
    }
    if (version != ZDP_CKPT_FORMAT_VERSION && version != 1) {
        zdp_ckpt_view_free_(v);
        free(text);
        return zdp_err_set(err, ZDP_ERR_UNSUPPORTED,
                           "%s: format_version %lld; this zdp (%s) reads versions 1 and %d; use "
                           "the zdp that wrote it", path, (long long)version, ZDP_VERSION,
                           ZDP_CKPT_FORMAT_VERSION);
    }
    v->version = (int)version;
    /* The file's own checksum, before any field of it is believed. */
    zdp_status sum_st = meta_check_sum_(path, v->meta, text, text_n, v->version, err);
    free(text);
    if (sum_st != ZDP_OK) {
        zdp_ckpt_view_free_(v);
        return sum_st;
    }
    v->world = (int)zdp_ckpt_get_int_(v->meta, "world_size", NULL, &ok);
    v->stage = (int)zdp_ckpt_get_int_(v->meta, "zero_stage", NULL, &ok);
    v->numel = zdp_ckpt_get_int_(v->meta, "layout", "numel", &ok);
    v->pending = zdp_ckpt_get_int_(v->meta, "counters", "pending_backwards", &ok);
    static const char *const counters[] = {"global_steps", "global_samples", "micro_steps",
                                           "skipped_steps", "optimizer_step",
                                           "scheduler_iteration"};
    for (size_t k = 0; k < sizeof counters / sizeof counters[0]; k++)
        (void)zdp_ckpt_get_int_(v->meta, "counters", counters[k], &ok);
    json_t *files = json_object_get(v->meta, "files");
    int64_t world = zdp_ckpt_get_int_(v->meta, "world_size", NULL, &ok);
    int64_t stage = zdp_ckpt_get_int_(v->meta, "zero_stage", NULL, &ok);
    if (!ok || world < 1 || world > (1 << 20) || stage < 0 || stage > 3 || v->numel < 1 ||
        !json_is_object(files)) {
        zdp_ckpt_view_free_(v);
        return zdp_err_set(err, ZDP_ERR_FORMAT, "%s: a required field is missing, out of range or has the "
                                                "wrong type (world_size, zero_stage, layout, "
                                                "counters, files)", path);
    }
    /* Every rank file must be listed, and every listed file must check out. */
    for (int r = 0; r < v->world; r++) {
        char name[64];
        snprintf(name, sizeof name, "optim_rank%d.safetensors", r);
        if (json_object_get(files, name) == NULL) {
            zdp_ckpt_view_free_(v);
            return zdp_err_set(err, ZDP_ERR_FORMAT, "%s: lists no %s for rank %d of %d", path,
                               name, r, v->world);
        }
    }
    const char *name;
    json_t *info;
    json_object_foreach(files, name, info) {
        char fpath[ZDP_CKPT_PATH_MAX + 96];
        snprintf(fpath, sizeof fpath, "%s/%s", v->dir, name);
        const char *want = json_string_value(json_object_get(info, "fnv1a64"));
        json_t *bytes = json_object_get(info, "bytes");
        uint64_t h = 0;
        int64_t size = 0;
        /* Messages first: name, want and bytes live in v->meta. */
        zdp_status bad = ZDP_OK;
        if (strchr(name, '/') != NULL || want == NULL || !json_is_integer(bytes))
            bad = zdp_err_set(err, ZDP_ERR_FORMAT, "%s: bad entry for file \"%s\"", path, name);
        else if (zdp_ckpt_file_digest_(fpath, &h, &size) != 0)
            bad = zdp_err_set(err, ZDP_ERR_IO, "%s: cannot read (%s); the checkpoint is "
                                               "incomplete", fpath, strerror(errno));
        if (bad != ZDP_OK) {
            zdp_ckpt_view_free_(v);
            return bad;
        }
        char got[32];
        snprintf(got, sizeof got, "%016llx", (unsigned long long)h);
        if (size != (int64_t)json_integer_value(bytes) || strcmp(got, want) != 0) {
            bad = zdp_err_set(err, ZDP_ERR_FORMAT,
                              "%s: %lld bytes, checksum %s; meta.json says %lld bytes, %s: the "
                              "file is truncated or corrupted", fpath, (long long)size, got,
                              (long long)json_integer_value(bytes), want);
            zdp_ckpt_view_free_(v);
            return bad;
        }
    }
    return ZDP_OK;
}

const zdp_tensor *zdp_ckpt_find_f32_(const zdp_safetensors *st, const char *name, int64_t n,
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

/* ---- inspect and export ----------------------------------------------------------------- */

/* A string field or "?" (the text is for people; a missing field is shown). */
static const char *str_or_(json_t *v) {
    const char *s = json_string_value(v);
    return s != NULL ? s : "?";
}

zdp_status zdp_checkpoint_inspect(const char *dir, const char *tag, char **text, zdp_error *err) {
    *text = NULL;
    ckpt_view v;
    zdp_status st = zdp_ckpt_view_open_(dir, tag, &v, err);
    if (st != ZDP_OK) return st;
    json_t *c = json_object_get(v.meta, "counters"), *cfg = json_object_get(v.meta, "config");
    bool ok = true;
    /* A growing buffer: fields of any length fit. */
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    if (f == NULL) {
        zdp_ckpt_view_free_(&v);
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
            (long long)zdp_ckpt_get_int_(v.meta, "layout", "padded", &ok),
            (long long)zdp_ckpt_get_int_(v.meta, "layout", "partition", &ok));
    fprintf(f, "  progress: %lld optimizer steps (%lld skipped), %lld samples, %lld micro-steps, "
               "optimizer step %lld, LR schedule at %lld (last lr %g)\n",
            (long long)zdp_ckpt_get_int_(c, "global_steps", NULL, &ok),
            (long long)zdp_ckpt_get_int_(c, "skipped_steps", NULL, &ok),
            (long long)zdp_ckpt_get_int_(c, "global_samples", NULL, &ok),
            (long long)zdp_ckpt_get_int_(c, "micro_steps", NULL, &ok),
            (long long)zdp_ckpt_get_int_(c, "optimizer_step", NULL, &ok),
            (long long)zdp_ckpt_get_int_(c, "scheduler_iteration", NULL, &ok),
            json_number_value(json_object_get(c, "last_lr")));
    fprintf(f, "  window: %s\n",
            v.pending > 0 ? "open: gradients of pending backward calls saved (resume at the "
                            "same world size and stage)"
                          : "closed (saved at a step boundary; resumes at any world size and "
                            "stage)");
    fprintf(f, "  optimizer %s, lr %g, micro-batch %lld x %lld accumulation steps = batch %lld\n",
            str_or_(json_object_get(cfg, "optimizer")), json_number_value(json_object_get(cfg, "lr")),
            (long long)zdp_ckpt_get_int_(cfg, "train_micro_batch_size_per_gpu", NULL, &ok),
            (long long)zdp_ckpt_get_int_(cfg, "gradient_accumulation_steps", NULL, &ok),
            (long long)zdp_ckpt_get_int_(cfg, "train_batch_size", NULL, &ok));
    fprintf(f, "  files: model.safetensors (full fp32 weights) and %d optimizer slice(s); sizes "
               "and checksums verified; meta.json %s\n", v.world,
            v.version == 1 ? "has no checksum (format 1): unverified" : "checksum verified");
    char *client = json_dumps(json_object_get(v.meta, "client"), JSON_COMPACT);
    fprintf(f, "  client state: %s\n", client ? client : "{}");
    free(client);
    zdp_ckpt_view_free_(&v);
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
    zdp_status st = zdp_ckpt_view_open_(dir, tag, &v, err);
    if (st != ZDP_OK) return st;
    char path[ZDP_CKPT_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/model.safetensors", v.dir);
    json_t *shape = json_object_get(v.meta, "model");
    char *shape_text = json_is_object(shape) ? json_dumps(shape, JSON_COMPACT) : NULL;
    zdp_ckpt_view_free_(&v);
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
