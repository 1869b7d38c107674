/*
 * hf_folder.c -- where a Hugging Face folder keeps its weights (zdp/hf.h):
 * model.safetensors, or the shards model.safetensors.index.json names.
 * Parses the index, finds the files, reads their safetensors headers (no
 * tensor data) and checks that each shard holds exactly what the index
 * says, so the reader (hf_reader.c) starts from a consistent folder.
 *
 * Also the whole-file read and the existence test the other hf_*.c files
 * share.
 *
 * Not here: tensor data, and which tensor is which parameter (hf_reader.c).
 */
#define _POSIX_C_SOURCE 200809L

#include "hf_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "../core/json.h"
#include "zdp/hf.h"
#include "zdp/io.h"

/* ---- small files ------------------------------------------------------------------ */

/* Reads a whole small file into a NUL-terminated buffer; errno on failure. */
char *zdp_hf_slurp_(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) return NULL;
    size_t cap = 1 << 14, n = 0;
    char *buf = malloc(cap);
    size_t got;
    while (buf != NULL && (got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (n + 1 == cap) {
            char *nb = cap < ((size_t)256 << 20) ? realloc(buf, cap * 2) : NULL;
            if (nb == NULL) {
                free(buf);
                buf = NULL;
                errno = EFBIG;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    if (buf != NULL && ferror(f)) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf != NULL) buf[n] = '\0';
    *len = n;
    return buf;
}

/* ---- model.safetensors.index.json ------------------------------------------------ */

void zdp_hf_index_free(zdp_hf_index *idx) {
    if (idx == NULL) return;
    for (int i = 0; i < idx->n; i++) {
        free(idx->names ? idx->names[i] : NULL);
        free(idx->shards ? idx->shards[i] : NULL);
    }
    for (int i = 0; i < idx->n_files; i++) free(idx->files[i]);
    free(idx->names);
    free(idx->shards);
    free(idx->files);
    memset(idx, 0, sizeof *idx);
    idx->total_size = -1;
}

/* A shard file name must stay inside the folder. */
static bool hf_plain_name_(const char *f) {
    size_t n = strlen(f), ext = strlen(".safetensors");
    return n > ext && strchr(f, '/') == NULL && strchr(f, '\\') == NULL && f[0] != '.' &&
           strcmp(f + n - ext, ".safetensors") == 0;
}

zdp_status zdp_hf_index_parse(const char *text, size_t len, const char *path, zdp_hf_index *out,
                              zdp_error *err) {
    if (text == NULL || out == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_hf_index_parse: text and out must not "
                           "be NULL");
    if (path == NULL) path = HF_INDEX;
    memset(out, 0, sizeof *out);
    out->total_size = -1;
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (root == NULL)
        return zdp_err_set(err, ZDP_ERR_FORMAT, "%s: not valid JSON: %s (line %d, column %d)",
                           path, je.text, je.line, je.column);
    zdp_status s = ZDP_OK;
    json_t *wm = json_object_get(root, "weight_map");
    json_t *meta = json_object_get(root, "metadata");
    json_t *ts = json_is_object(meta) ? json_object_get(meta, "total_size") : NULL;
    if (!json_is_object(wm)) {
        s = zdp_err_set(err, ZDP_ERR_FORMAT, "%s: key \"weight_map\" is %s, expected an object "
                        "{tensor name: shard file}", path,
                        wm == NULL ? "missing" : zdp_json_type_name(wm));
        goto done;
    }
    if (json_object_size(wm) == 0) {
        s = zdp_err_set(err, ZDP_ERR_FORMAT, "%s: \"weight_map\" is empty: the index names no "
                        "tensor", path);
        goto done;
    }
    if (ts != NULL && json_is_integer(ts) && json_integer_value(ts) >= 0)
        out->total_size = (int64_t)json_integer_value(ts);
    size_t n = json_object_size(wm);
    out->names = calloc(n, sizeof *out->names);
    out->shards = calloc(n, sizeof *out->shards);
    out->files = calloc(n, sizeof *out->files);
    if (out->names == NULL || out->shards == NULL || out->files == NULL) {
        s = zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    const char *key;
    json_t *v;
    json_object_foreach(wm, key, v) {
        const char *f = json_string_value(v);
        if (f == NULL || !hf_plain_name_(f)) {
            s = zdp_err_set(err, ZDP_ERR_FORMAT, "%s: \"weight_map\".\"%s\" = %s%s%s: expected "
                            "a shard file name in the folder (\"model-00001-of-00002"
                            ".safetensors\"; no '/', ending in .safetensors)", path, key,
                            f ? "\"" : "", f ? f : zdp_json_type_name(v), f ? "\"" : "");
            goto done;
        }
        int i = out->n;
        out->names[i] = strdup(key);
        out->shards[i] = strdup(f);
        out->n++;
        if (out->names[i] == NULL || out->shards[i] == NULL) {
            s = zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory", path);
            goto done;
        }
        int k = 0;
        while (k < out->n_files && strcmp(out->files[k], f) != 0) k++;
        if (k == out->n_files) {
            out->files[k] = strdup(f);
            if (out->files[k] == NULL) {
                s = zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory", path);
                goto done;
            }
            out->n_files++;
        }
    }
done:
    json_decref(root);
    if (s != ZDP_OK) zdp_hf_index_free(out);
    return s;
}

/* ---- the weight files ------------------------------------------------------------ */

void zdp_hf_folder_free_(hf_folder *f) {
    for (int i = 0; i < f->n; i++) {
        if (f->paths) free(f->paths[i]);
        if (f->st) zdp_safetensors_free(&f->st[i]);
        if (f->off) free(f->off[i]);
    }
    free(f->paths);
    free(f->st);
    free(f->off);
    zdp_hf_index_free(&f->idx);
}

bool zdp_hf_exists_(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* Finds the weight files and reads their headers; checks the index against
 * the shards. */
zdp_status zdp_hf_folder_open_(const char *dir, hf_folder *f, zdp_error *err) {
    *f = (hf_folder){.dir = dir};
    f->idx.total_size = -1;
    char single[HF_PATH_MAX];
    snprintf(single, sizeof single, "%s/" HF_SINGLE, dir);
    snprintf(f->index_path, sizeof f->index_path, "%s/" HF_INDEX, dir);
    int n = 1;
    zdp_status s = ZDP_OK;
    if (!zdp_hf_exists_(single)) {
        size_t len = 0;
        char *text = zdp_hf_slurp_(f->index_path, &len);
        if (text == NULL) {
            char bin[HF_PATH_MAX];
            snprintf(bin, sizeof bin, "%s/pytorch_model.bin", dir);
            return zdp_err_set(err, ZDP_ERR_IO, "%s: no " HF_SINGLE " and no " HF_INDEX
                               " (%s)%s", dir, strerror(errno),
                               zdp_hf_exists_(bin) ? "; the folder has pytorch_model.bin: zdp reads "
                                                 "safetensors only (save it again with "
                                                 "save_pretrained(safe_serialization=True))"
                                               : "; a model folder holds its weights as "
                                                 "save_pretrained writes them");
        }
        s = zdp_hf_index_parse(text, len, f->index_path, &f->idx, err);
        free(text);
        if (s != ZDP_OK) return s;
        n = f->idx.n_files;
    }
    f->paths = calloc((size_t)n, sizeof *f->paths);
    f->st = calloc((size_t)n, sizeof *f->st);
    f->off = calloc((size_t)n, sizeof *f->off);
    if (f->paths == NULL || f->st == NULL || f->off == NULL)
        return zdp_err_set(err, ZDP_ERR_NOMEM, "out of memory");
    f->n = n;
    for (int k = 0; k < n; k++) {
        const char *name = f->idx.n > 0 ? f->idx.files[k] : HF_SINGLE;
        size_t need = strlen(dir) + strlen(name) + 2;
        f->paths[k] = malloc(need);
        if (f->paths[k] == NULL) return zdp_err_set(err, ZDP_ERR_NOMEM, "out of memory");
        snprintf(f->paths[k], need, "%s/%s", dir, name);
        if (f->idx.n > 0 && !zdp_hf_exists_(f->paths[k])) {
            int e = 0;
            while (strcmp(f->idx.shards[e], name) != 0) e++;
            return zdp_err_set(err, ZDP_ERR_IO, "%s: \"weight_map\" puts tensor \"%s\" in shard "
                               "\"%s\", but %s does not exist (%s); fix: copy the whole folder "
                               "(every shard the index names)", f->index_path, f->idx.names[e],
                               name, f->paths[k], strerror(errno));
        }
    }
    for (int k = 0; k < n && s == ZDP_OK; k++)
        s = zdp_safetensors_read_header(f->paths[k], &f->st[k], &f->off[k], err);
    if (s != ZDP_OK || f->idx.n == 0) return s;
    /* Each shard holds exactly what the index says it does. */
    for (int k = 0; k < n; k++) {
        for (int j = 0; j < f->st[k].n; j++) {
            const char *t = f->st[k].tensors[j].name;
            int e = 0;
            while (e < f->idx.n && strcmp(f->idx.names[e], t) != 0) e++;
            if (e == f->idx.n)
                return zdp_err_set(err, ZDP_ERR_FORMAT, "%s: tensor \"%s\" is not listed in "
                                   "%s's \"weight_map\"; the index and the shards are from "
                                   "different saves: save the folder again", f->paths[k], t,
                                   f->index_path);
            if (strcmp(f->idx.shards[e], f->idx.files[k]) != 0)
                return zdp_err_set(err, ZDP_ERR_FORMAT, "%s: tensor \"%s\" is here, but %s puts "
                                   "it in \"%s\"; the index and the shards are from different "
                                   "saves: save the folder again", f->paths[k], t,
                                   f->index_path, f->idx.shards[e]);
        }
    }
    for (int e = 0; e < f->idx.n; e++) {
        int k = 0;
        while (strcmp(f->idx.files[k], f->idx.shards[e]) != 0) k++;
        if (zdp_safetensors_find(&f->st[k], f->idx.names[e]) == NULL)
            return zdp_err_set(err, ZDP_ERR_FORMAT, "%s: \"weight_map\" puts tensor \"%s\" in "
                               "\"%s\", but that shard (%d tensors) does not hold it; the index "
                               "and the shards are from different saves: save the folder again",
                               f->index_path, f->idx.names[e], f->idx.shards[e], f->st[k].n);
    }
    return ZDP_OK;
}
