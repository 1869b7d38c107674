/*
 * hf_save.c -- a model written as a Hugging Face folder (zdp/hf.h), as
 * save_pretrained writes one: model.safetensors, or above the shard limit
 * model-0000k-of-0000n.safetensors and model.safetensors.index.json, then
 * config.json; and the tokenizer files copied from the folder the model
 * came from.
 *
 * Every file is written to a temporary name, synced and renamed into
 * place, and the index comes last, once every shard it names is in place.
 * Weight files of an earlier save that this one did not write are removed,
 * so the folder never mixes two saves.
 */
#define _POSIX_C_SOURCE 200809L

#include "hf_impl.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "zdp/gpt.h"
#include "zdp/hf.h"
#include "zdp/llama.h"
#include "zdp/model.h"

/* ---- files written atomically --------------------------------------------------------- */

/* Writes len bytes to path atomically: path.tmp.XXXXXX, fsync, rename. */
static zdp_status hf_write_atomic_(const char *path, const void *data, size_t len,
                                   zdp_error *err) {
    char tmp[HF_PATH_MAX + 16];
    snprintf(tmp, sizeof tmp, "%s.tmp.XXXXXX", path);
    int fd = mkstemp(tmp);
    if (fd < 0)
        return zdp_err_set(err, ZDP_ERR_IO, "%s: cannot create a temporary file next to it: %s",
                           path, strerror(errno));
    const char *p = data;
    size_t done = 0;
    while (done < len) {
        ssize_t w = write(fd, p + done, len - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        done += (size_t)w;
    }
    int e = done == len ? 0 : errno;
    if (e == 0 && fsync(fd) != 0) e = errno;
    if (close(fd) != 0 && e == 0) e = errno;
    /* mkstemp makes it 0600; a model folder is for sharing. */
    if (e == 0 && chmod(tmp, 0644) != 0) e = errno;
    if (e == 0 && rename(tmp, path) != 0) e = errno;
    if (e != 0) {
        unlink(tmp);
        return zdp_err_set(err, ZDP_ERR_IO, "%s: cannot write: %s", path, strerror(e));
    }
    return ZDP_OK;
}

/* json_dumps with 15 significant digits, so 1e-06 stays 1e-06. */
static zdp_status hf_write_json_(const char *path, json_t *root, zdp_error *err) {
    if (root == NULL) return zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory", path);
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_REAL_PRECISION(15));
    json_decref(root);
    if (text == NULL) return zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory", path);
    size_t len = strlen(text);
    char *withnl = realloc(text, len + 2);
    if (withnl == NULL) {
        free(text);
        return zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory", path);
    }
    withnl[len] = '\n';
    zdp_status s = hf_write_atomic_(path, withnl, len + 1, err);
    free(withnl);
    return s;
}

zdp_status zdp_io_write_json(const char *path, json_t *root, zdp_error *err) {
    return hf_write_json_(path, root, err);
}

/* ---- weights out ------------------------------------------------------------------- */

/* "model-00001-of-00002.safetensors" (save_pretrained's names); k from 1. */
static void hf_shard_name_(int k, int n, char *buf, size_t cap) {
    snprintf(buf, cap, "model-%05d-of-%05d.safetensors", k, n);
}

static bool hf_is_shard_name_(const char *name) {
    int k, n, used = 0;
    return strlen(name) == strlen("model-00001-of-00002.safetensors") &&
           sscanf(name, "model-%5d-of-%5d.safetensors%n", &k, &n, &used) == 2 &&
           used == (int)strlen(name);
}

/* Removes DIR's weight files that this save did not write (keep_single:
 * model.safetensors is this save's; n_shards: model-*-of-{n_shards}). */
static zdp_status hf_remove_stale_(const char *dir, bool keep_single, int n_shards,
                                   zdp_error *err) {
    DIR *d = opendir(dir);
    if (d == NULL) return zdp_err_set(err, ZDP_ERR_IO, "%s: cannot list: %s", dir, strerror(errno));
    struct dirent *ent;
    zdp_status s = ZDP_OK;
    while ((ent = readdir(d)) != NULL && s == ZDP_OK) {
        const char *name = ent->d_name;
        bool stale = false;
        if (strcmp(name, HF_SINGLE) == 0) stale = !keep_single;
        else if (strcmp(name, HF_INDEX) == 0) stale = keep_single;
        else if (hf_is_shard_name_(name)) {
            int k = 0, n = 0;
            sscanf(name, "model-%5d-of-%5d", &k, &n);
            stale = keep_single || n != n_shards || k < 1 || k > n;
        }
        if (!stale) continue;
        char path[HF_PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", dir, name);
        if (unlink(path) != 0 && errno != ENOENT)
            s = zdp_err_set(err, ZDP_ERR_IO, "%s: cannot remove this weight file of an earlier "
                            "save: %s; remove it by hand", path, strerror(errno));
    }
    closedir(d);
    return s;
}

/* zdp_hf_save_stream's tensors: read one, converted to the file's dtype. */
typedef struct hf_fill_ {
    const zdp_model *model;
    zdp_tensor_read_fn read;
    void *ctx;
    zdp_dtype dtype;
    float *f;  /* (largest numel) BF16: the floats before rounding */
    int first; /* the shard's first tensor */
} hf_fill_;

static zdp_status hf_fill_one_(void *ctx, int i, void *buf, zdp_error *err) {
    hf_fill_ *h = ctx;
    const int p = h->first + i;
    const int64_t n = zdp_io_numel(h->model->params[p].shape, h->model->params[p].ndim);
    float *dst = h->dtype == ZDP_DTYPE_F32 ? buf : h->f;
    zdp_status s = h->read(h->ctx, p, 0, n, dst, err);
    if (s != ZDP_OK || h->dtype == ZDP_DTYPE_F32) return s;
    uint16_t *b = buf;
    for (int64_t k = 0; k < n; k++) b[k] = zdp_io_f32_to_bf16(dst[k]);
    return ZDP_OK;
}

/* Writes tensors [first, last) of t as one safetensors file: from their
 * data, or through fill when it is not NULL. */
static zdp_status hf_write_shard_(const char *path, const zdp_tensor *t, int first, int last,
                                  hf_fill_ *fill, zdp_error *err) {
    static const char *const meta[] = {"format", "pt"};
    if (fill == NULL) return zdp_safetensors_write_meta(path, t + first, last - first, meta, 1, err);
    fill->first = first;
    return zdp_safetensors_write_fill(path, t + first, last - first, meta, 1, hf_fill_one_, fill, err);
}

static zdp_status hf_save_(const char *dir, const zdp_model *model, const float *const *src,
                           hf_fill_ *fill, zdp_dtype dtype, int64_t max_shard_bytes,
                           zdp_error *err);

zdp_status zdp_hf_save(const char *dir, const zdp_model *model, const float *const *src,
                       zdp_dtype dtype, int64_t max_shard_bytes, zdp_error *err) {
    if (dir == NULL || model == NULL || src == NULL || model->n_params < 1)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_hf_save: dir, model and src must not "
                           "be NULL");
    return hf_save_(dir, model, src, NULL, dtype, max_shard_bytes, err);
}

zdp_status zdp_hf_save_stream(const char *dir, const zdp_model *model, zdp_tensor_read_fn read,
                              void *ctx, zdp_dtype dtype, int64_t max_shard_bytes,
                              zdp_error *err) {
    if (dir == NULL || model == NULL || read == NULL || model->n_params < 1)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_hf_save_stream: dir, model and read "
                           "must not be NULL");
    hf_fill_ fill = {.model = model, .read = read, .ctx = ctx, .dtype = dtype};
    int64_t largest = 1;
    for (int i = 0; i < model->n_params; i++) {
        const int64_t n = zdp_io_numel(model->params[i].shape, model->params[i].ndim);
        if (n > largest) largest = n;
    }
    if (dtype == ZDP_DTYPE_BF16 && (fill.f = malloc((size_t)largest * sizeof(float))) == NULL)
        return zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory for one tensor", dir);
    zdp_status s = hf_save_(dir, model, NULL, &fill, dtype, max_shard_bytes, err);
    free(fill.f);
    return s;
}

/* zdp_hf_save from whole tensors (src) or tensor by tensor (fill). */
static zdp_status hf_save_(const char *dir, const zdp_model *model, const float *const *src,
                           hf_fill_ *fill, zdp_dtype dtype, int64_t max_shard_bytes,
                           zdp_error *err) {
    if (zdp_gpt_config_of(model) == NULL && zdp_llama_config_of(model) == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_hf_save: the model is neither GPT-2 "
                           "nor of the Llama family; only those have a Hugging Face folder");
    if (dtype != ZDP_DTYPE_F32 && dtype != ZDP_DTYPE_BF16)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_hf_save: dtype %s: zdp writes F32 or "
                           "BF16", zdp_dtype_name(dtype));
    if (max_shard_bytes <= 0) max_shard_bytes = ZDP_HF_MAX_SHARD_BYTES;
    if (zdp_mkdirs(dir) != 0)
        return zdp_err_set(err, ZDP_ERR_IO, "%s: cannot create the folder: %s", dir,
                           strerror(errno));
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return zdp_err_set(err, ZDP_ERR_IO, "%s: exists and is not a directory; choose another "
                           "output folder", dir);

    const int n = model->n_params;
    const size_t esize = zdp_dtype_size(dtype);
    zdp_tensor *t = calloc((size_t)n, sizeof *t);
    int *shard_of = calloc((size_t)n, sizeof *shard_of);
    zdp_status s = ZDP_OK;
    int n_shards = 1;
    int64_t total = 0, in_shard = 0;
    if (t == NULL || shard_of == NULL) {
        s = zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory", dir);
        goto done;
    }
    for (int i = 0; i < n && s == ZDP_OK; i++) {
        const zdp_param_info *p = &model->params[i];
        const int64_t numel = zdp_io_numel(p->shape, p->ndim);
        t[i] = (zdp_tensor){.name = (char *)p->name, .dtype = dtype, .ndim = p->ndim,
                            .nbytes = (size_t)numel * esize};
        memcpy(t[i].shape, p->shape, sizeof t[i].shape);
        if (fill != NULL) {
            t[i].data = NULL; /* read as it is written */
        } else if (dtype == ZDP_DTYPE_F32) {
            t[i].data = (void *)src[i]; /* the writer only reads it */
        } else {
            uint16_t *h = malloc(t[i].nbytes > 0 ? t[i].nbytes : 1);
            if (h == NULL) {
                s = zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory for tensor %s", dir,
                                p->name);
                break;
            }
            for (int64_t k = 0; k < numel; k++) h[k] = zdp_io_f32_to_bf16(src[i][k]);
            t[i].data = h;
        }
        /* save_pretrained's rule: a new shard when this tensor would pass the limit. */
        if (in_shard > 0 && in_shard + (int64_t)t[i].nbytes > max_shard_bytes) {
            n_shards++;
            in_shard = 0;
        }
        shard_of[i] = n_shards - 1;
        in_shard += (int64_t)t[i].nbytes;
        total += (int64_t)t[i].nbytes;
    }
    if (s != ZDP_OK) goto done;

    char path[HF_PATH_MAX], name[64];
    json_t *wm = n_shards > 1 ? json_object() : NULL;
    for (int k = 0, first = 0; k < n_shards && s == ZDP_OK; k++) {
        int last = first;
        while (last < n && shard_of[last] == k) last++;
        if (n_shards == 1) snprintf(name, sizeof name, HF_SINGLE);
        else hf_shard_name_(k + 1, n_shards, name, sizeof name);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        s = hf_write_shard_(path, t, first, last, fill, err);
        for (int i = first; wm != NULL && i < last; i++)
            json_object_set_new(wm, t[i].name, json_string(name));
        first = last;
    }
    if (s == ZDP_OK) {
        snprintf(path, sizeof path, "%s/" HF_CONFIG, dir);
        s = hf_write_json_(path, zdp_hf_config_json_(model, dtype), err);
    }
    /* The index last, once every shard it names is in place (and the old
     * single file gone, which readers would prefer). */
    if (s == ZDP_OK && n_shards > 1) s = hf_remove_stale_(dir, false, n_shards, err);
    if (s == ZDP_OK && n_shards > 1) {
        snprintf(path, sizeof path, "%s/" HF_INDEX, dir);
        s = hf_write_json_(path, json_pack("{s:{s:I}, s:O}", "metadata", "total_size",
                                           (json_int_t)total, "weight_map", wm), err);
    }
    if (s == ZDP_OK && n_shards == 1) s = hf_remove_stale_(dir, true, 1, err);
    json_decref(wm);
done:
    for (int i = 0; t != NULL && dtype != ZDP_DTYPE_F32 && fill == NULL && i < n; i++) free(t[i].data);
    free(t);
    free(shard_of);
    return s;
}

/* ---- tokenizer files ---------------------------------------------------------------- */

static const char *const hf_tokenizer_files_[] = {
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
    "merges.txt", "added_tokens.json", "encoder.json", "vocab.bpe",
    /* Not the tokenizer's, but its eos/bos ids are what generate() stops on. */
    "generation_config.json",
};

/* The token ids of from/config.json (bos_token_id, eos_token_id: a number, a
 * list or null, as transformers writes them) into to/config.json, which
 * zdp_hf_save wrote without them (the model does not know them): without
 * them generate() of a folder with no generation_config.json never stops
 * on eos.  Nothing to do when either config.json is missing or the source
 * has neither key. */
static zdp_status hf_copy_token_ids_(const char *from, const char *to, zdp_error *err) {
    static const char *const keys[] = {"bos_token_id", "eos_token_id"};
    char src[HF_PATH_MAX], dst[HF_PATH_MAX];
    snprintf(src, sizeof src, "%s/%s", from, HF_CONFIG);
    snprintf(dst, sizeof dst, "%s/%s", to, HF_CONFIG);
    if (!zdp_hf_exists_(src) || !zdp_hf_exists_(dst)) return ZDP_OK;
    json_error_t je = {.line = 0};
    json_t *a = json_load_file(src, JSON_REJECT_DUPLICATES, &je);
    json_t *b = json_is_object(a) ? json_load_file(dst, JSON_REJECT_DUPLICATES, &je) : NULL;
    if (!json_is_object(b)) {
        const char *bad = json_is_object(a) ? dst : src;
        const bool parsed = json_is_object(a) ? b != NULL : a != NULL;
        json_decref(a);
        json_decref(b);
        if (parsed)
            return zdp_err_set(err, ZDP_ERR_FORMAT, "%s: not a JSON object; a config.json is "
                               "one ({\"model_type\": ...})", bad);
        return zdp_err_set(err, ZDP_ERR_FORMAT, "%s: line %d: %s; fix the JSON", bad, je.line,
                           je.text);
    }
    bool added = false;
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        json_t *v = json_object_get(a, keys[k]);
        if (v == NULL || json_object_get(b, keys[k]) != NULL) continue;
        json_object_set(b, keys[k], v);
        added = true;
    }
    json_decref(a);
    if (!added) {
        json_decref(b);
        return ZDP_OK;
    }
    return hf_write_json_(dst, b, err); /* takes b */
}

zdp_status zdp_hf_copy_tokenizer(const char *from, const char *to, int *n_copied,
                                 zdp_error *err) {
    if (from == NULL || to == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_hf_copy_tokenizer: from and to must "
                           "not be NULL");
    int copied = 0;
    zdp_status s = ZDP_OK;
    for (size_t i = 0; i < sizeof hf_tokenizer_files_ / sizeof hf_tokenizer_files_[0]; i++) {
        char src[HF_PATH_MAX], dst[HF_PATH_MAX];
        snprintf(src, sizeof src, "%s/%s", from, hf_tokenizer_files_[i]);
        snprintf(dst, sizeof dst, "%s/%s", to, hf_tokenizer_files_[i]);
        if (!zdp_hf_exists_(src)) continue;
        size_t len = 0;
        char *data = zdp_hf_slurp_(src, &len);
        if (data == NULL) {
            s = zdp_err_set(err, ZDP_ERR_IO, "%s: cannot read: %s", src, strerror(errno));
            break;
        }
        s = hf_write_atomic_(dst, data, len, err);
        free(data);
        if (s != ZDP_OK) break;
        copied++;
    }
    if (s == ZDP_OK) s = hf_copy_token_ids_(from, to, err);
    if (s == ZDP_OK && copied == 0)
        s = zdp_err_set(err, ZDP_ERR_IO, "%s: no tokenizer files (tokenizer.json, "
                        "tokenizer_config.json, vocab.json + merges.txt, encoder.json + "
                        "vocab.bpe, ...); give a folder that holds a tokenizer", from);
    if (n_copied != NULL) *n_copied = copied;
    return s;
}
