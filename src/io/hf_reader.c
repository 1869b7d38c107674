/*
 * hf_reader.c -- a Hugging Face folder's weights into a model (zdp/hf.h):
 * each parameter located in the folder's files (GPT-2's names with or
 * without "transformer.", buffers that are not parameters skipped, a tied
 * lm_head checked against the embedding), its shape and dtype checked, then
 * read a tensor or a slice at a time, converted to fp32 and checked finite.
 *
 * zdp_hf_weights_load checks every tensor, finiteness included, before its
 * first write into the caller's arrays, so a bad folder leaves the caller's
 * parameters untouched.  A read stages at most HF_CHUNK raw bytes beyond its
 * destination; zdp_hf_load_peak_bytes reports the most any load held.
 *
 * Not here: finding the files and checking the index (hf_folder.c).
 */
#define _POSIX_C_SOURCE 200809L

#include "hf_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "zdp/gpt.h"
#include "zdp/hf.h"
#include "zdp/llama.h"
#include "zdp/model.h"

#define HF_GPT_PREFIX "transformer."

/* ---- each parameter's tensor in the folder ------------------------------------------ */

/* Buffers a model may meet in a file and ignore: not parameters. */
static bool hf_ignored_(const char *name, bool gpt) {
    size_t n = strlen(name);
    const char *inv = ".rotary_emb.inv_freq";
    if (n >= strlen(inv) && strcmp(name + n - strlen(inv), inv) == 0) return true;
    if (!gpt) return false;
    const char *b1 = ".attn.bias", *b2 = ".attn.masked_bias";
    return (n >= strlen(b1) && strcmp(name + n - strlen(b1), b1) == 0) ||
           (n >= strlen(b2) && strcmp(name + n - strlen(b2), b2) == 0);
}

/* GPT-2 files spell names with or without "transformer.". */
static const char *hf_bare_(const char *name, bool gpt) {
    size_t p = strlen(HF_GPT_PREFIX);
    return gpt && strncmp(name, HF_GPT_PREFIX, p) == 0 ? name + p : name;
}

/* Where each model parameter is found: file k, tensor t, its bytes at file
 * offset off. */
typedef struct hf_loc_ {
    int file;
    const zdp_tensor *t;
    uint64_t off;
} hf_loc_;

/* Maps every file tensor to a parameter (or an ignored buffer, or the tied
 * lm_head), refusing extras and duplicates. */
static zdp_status hf_map_(const hf_folder *f, const zdp_model *model, bool gpt, hf_loc_ *loc,
                          hf_loc_ *lm_head, zdp_error *err) {
    char a[64];
    for (int p = 0; p < model->n_params; p++) loc[p] = (hf_loc_){.file = -1};
    *lm_head = (hf_loc_){.file = -1};
    for (int k = 0; k < f->n; k++) {
        for (int j = 0; j < f->st[k].n; j++) {
            const zdp_tensor *t = &f->st[k].tensors[j];
            const char *bare = hf_bare_(t->name, gpt);
            int p = 0;
            while (p < model->n_params && strcmp(hf_bare_(model->params[p].name, gpt), bare) != 0)
                p++;
            hf_loc_ *slot = p < model->n_params ? &loc[p] : NULL;
            if (slot == NULL && strcmp(bare, "lm_head.weight") == 0) slot = lm_head;
            if (slot == NULL) {
                if (hf_ignored_(bare, gpt)) continue;
                return zdp_err_set(err, ZDP_ERR_FORMAT, "%s: tensor \"%s\" (shape %s) is not a "
                                   "parameter of the model config.json describes (%d tensors, "
                                   "e.g. \"%s\"); the weights are of another architecture or "
                                   "config.json is wrong: fix config.json or remove the tensor",
                                   f->paths[k], t->name, zdp_io_shape_str(t->shape, t->ndim, a,
                                   sizeof a), model->n_params, model->params[0].name);
            }
            if (slot->file >= 0)
                return zdp_err_set(err, ZDP_ERR_FORMAT, "%s: tensor \"%s\" is also in %s (as "
                                   "\"%s\"); keep one", f->paths[k], t->name,
                                   f->paths[slot->file], slot->t->name);
            *slot = (hf_loc_){.file = k, .t = t, .off = f->off[k][j]};
        }
    }
    return ZDP_OK;
}

/* Presence, shape and dtype of each parameter's tensor (finiteness is
 * checked as it is read). */
static zdp_status hf_check_(const hf_folder *f, const zdp_model *model, bool gpt,
                            const hf_loc_ *loc, zdp_error *err) {
    char a[64], b[64];
    const char *where = f->idx.n > 0 ? f->index_path : f->n > 0 ? f->paths[0] : f->dir;
    for (int p = 0; p < model->n_params; p++) {
        const zdp_param_info *pi = &model->params[p];
        if (loc[p].file < 0)
            return zdp_err_set(err, ZDP_ERR_FORMAT, "%s: tensor \"%s\" is missing; the model "
                               "config.json describes needs it with shape %s%s", where, pi->name,
                               zdp_io_shape_str(pi->shape, pi->ndim, a, sizeof a),
                               strcmp(pi->name, "lm_head.weight") == 0
                                   ? " (config.json says tie_word_embeddings false: set it to "
                                     "true if lm_head is the embedding)"
                                   : ": the folder is incomplete or of another configuration");
        const zdp_tensor *t = loc[p].t;
        const char *file = f->paths[loc[p].file];
        /* GPT-2's learned positions: the first block_size rows of the file's
         * (a prefix of its bytes, so element i of the model's tensor is
         * element i of the file's). */
        bool crop = gpt && strcmp(hf_bare_(pi->name, true), "wpe.weight") == 0 && t->ndim == 2 &&
                    pi->ndim == 2 && t->shape[1] == pi->shape[1] && t->shape[0] >= pi->shape[0];
        bool same = t->ndim == pi->ndim;
        for (int d = 0; same && d < t->ndim; d++) same = t->shape[d] == pi->shape[d];
        if (!same && !crop) {
            bool transposed = t->ndim == 2 && pi->ndim == 2 && t->shape[0] == pi->shape[1] &&
                              t->shape[1] == pi->shape[0];
            return zdp_err_set(err, ZDP_ERR_CONFIG, "%s: tensor \"%s\": file shape %s, model "
                               "shape %s; %s", file, t->name,
                               zdp_io_shape_str(t->shape, t->ndim, a, sizeof a),
                               zdp_io_shape_str(pi->shape, pi->ndim, b, sizeof b),
                               transposed ? "the file's is transposed: transformers saves "
                                            "Linear weights [out, in]; write them that way"
                                          : "config.json does not describe these weights: fix "
                                            "its sizes (hidden_size, num_key_value_heads, "
                                            "head_dim, ...) to the weights'");
        }
        if (!zdp_io_dtype_float(t->dtype))
            return zdp_err_set(err, ZDP_ERR_UNSUPPORTED, "%s: tensor \"%s\" has dtype %s; zdp "
                               "loads F32, F16 and BF16 weights (convert the file)", file,
                               t->name, zdp_dtype_name(t->dtype));
    }
    return ZDP_OK;
}

/* ---- the reader: a tensor, or a slice of one, at a time ------------------------------ */

/* The staging buffer: raw file bytes are read in pieces of this size and
 * converted into the caller's floats, so a read holds no more than this
 * beyond its destination. */
#define HF_CHUNK ((size_t)1 << 20)

struct zdp_hf_reader {
    hf_folder f;
    hf_loc_ *loc;       /* (n_params) */
    hf_loc_ lm;         /* a tied model's lm_head.weight in the file, file -1: none */
    int *fds;           /* (f.n) one per weight file, -1 until opened */
    int n_params;
    const zdp_param_info *params;
    unsigned char *buf; /* (HF_CHUNK) staging */
    zdp_dtype seen;     /* a dtype other than F32 met, for the log */
};

/* The most bytes of weights one load call held at once (its destination,
 * and the raw bytes staged for it), over the process's life:
 * zdp_hf_load_peak_bytes. */
static _Atomic int64_t hf_peak_ = 0;

static void hf_note_(int64_t bytes) {
    int64_t cur = atomic_load(&hf_peak_);
    while (bytes > cur && !atomic_compare_exchange_weak(&hf_peak_, &cur, bytes)) {
    }
}

int64_t zdp_hf_load_peak_bytes(void) { return atomic_load(&hf_peak_); }

static bool hf_pread_full_(int fd, void *buf, size_t len, uint64_t at) {
    unsigned char *p = buf;
    while (len > 0) {
        ssize_t got = pread(fd, p, len, (off_t)at);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return false;
        p += got;
        len -= (size_t)got;
        at += (uint64_t)got;
    }
    return true;
}

/* Elements [lo, lo + n) of a located tensor, converted, into dst (the
 * staging buffer's part `stage`, cap bytes). */
static zdp_status hf_read_raw_(zdp_hf_reader *r, const hf_loc_ *l, int64_t lo, int64_t n,
                               float *dst, unsigned char *stage, size_t cap, zdp_error *err) {
    const size_t es = zdp_dtype_size(l->t->dtype);
    const int64_t per = (int64_t)(cap / es);
    const char *path = r->f.paths[l->file];
    if (r->fds[l->file] < 0 && (r->fds[l->file] = open(path, O_RDONLY | O_CLOEXEC)) < 0)
        return zdp_err_set(err, ZDP_ERR_IO, "%s: cannot open for reading: %s", path,
                           strerror(errno));
    zdp_tensor tmp = {.dtype = l->t->dtype, .data = stage};
    for (int64_t done = 0; done < n;) {
        const int64_t k = n - done < per ? n - done : per;
        if (!hf_pread_full_(r->fds[l->file], stage, (size_t)k * es,
                            l->off + (uint64_t)(lo + done) * es))
            return zdp_err_set(err, ZDP_ERR_IO, "%s: tensor \"%s\": cannot read %lld bytes at "
                               "offset %llu (%s); the file is truncated or unreadable",
                               path, l->t->name, (long long)k * (long long)es,
                               (unsigned long long)(l->off + (uint64_t)(lo + done) * es),
                               errno != 0 ? strerror(errno) : "end of file");
        for (int64_t j = 0; j < k; j++) dst[done + j] = zdp_io_f32_at(&tmp, j);
        done += k;
    }
    return ZDP_OK;
}

/* A tied model's lm_head.weight must be the embedding, or it is a trained
 * head that loading would silently drop.  Compared a staging buffer at a
 * time (each half holds one tensor's piece). */
static zdp_status hf_check_lm_head_(zdp_hf_reader *r, const zdp_model *model, zdp_error *err) {
    const hf_loc_ *lm = &r->lm;
    if (lm->file < 0) return ZDP_OK;
    const zdp_tensor *h = lm->t, *e = r->loc[0].t;
    char a[64], b[64];
    bool same = h->ndim == e->ndim && h->ndim == 2 && h->shape[0] == e->shape[0] &&
                h->shape[1] == e->shape[1] && zdp_io_dtype_float(h->dtype);
    const int64_t n = same ? zdp_io_numel(h->shape, 2) : 0;
    const size_t half = HF_CHUNK / 2;
    const int64_t per = (int64_t)(half / 2 / sizeof(float)); /* floats, after raw bytes */
    float *fh = (float *)(void *)(r->buf + half / 2), *fe = (float *)(void *)(r->buf + half + half / 2);
    /* Two pieces of raw bytes and their floats. */
    hf_note_(2 * (n < per ? n : per) * (int64_t)(zdp_dtype_size(h->dtype) + sizeof(float)));
    for (int64_t i = 0; same && i < n; i += per) {
        const int64_t k = n - i < per ? n - i : per;
        zdp_status s = hf_read_raw_(r, lm, i, k, fh, r->buf, half / 2, err);
        if (s == ZDP_OK) s = hf_read_raw_(r, &r->loc[0], i, k, fe, r->buf + half, half / 2, err);
        if (s != ZDP_OK) return s;
        for (int64_t j = 0; same && j < k; j++) same = fh[j] == fe[j];
    }
    if (same) return ZDP_OK;
    return zdp_err_set(err, ZDP_ERR_UNSUPPORTED, "%s: tensor \"%s\" (shape %s) differs from "
                       "\"%s\" (shape %s)%s, but the model ties them (config.json: GPT-2, or "
                       "tie_word_embeddings true); loading would drop a trained head: set "
                       "tie_word_embeddings false in config.json if the head is untied",
                       r->f.paths[lm->file], h->name, zdp_io_shape_str(h->shape, h->ndim, a, sizeof a),
                       model->params[0].name, zdp_io_shape_str(e->shape, e->ndim, b, sizeof b),
                       n > 0 ? " in value" : "");
}

void zdp_hf_reader_close(zdp_hf_reader *r) {
    if (r == NULL) return;
    for (int k = 0; r->fds != NULL && k < r->f.n; k++)
        if (r->fds[k] >= 0) close(r->fds[k]);
    free(r->fds);
    free(r->loc);
    free(r->buf);
    zdp_hf_folder_free_(&r->f);
    free(r);
}

zdp_status zdp_hf_reader_open(const char *dir, const zdp_model *model, zdp_hf_reader **out,
                              zdp_error *err) {
    if (out != NULL) *out = NULL;
    if (dir == NULL || model == NULL || out == NULL || model->n_params < 1)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_hf_reader_open: dir, model and out "
                           "must not be NULL");
    const bool gpt = zdp_gpt_config_of(model) != NULL;
    if (!gpt && zdp_llama_config_of(model) == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_hf_reader_open: the model is neither "
                           "GPT-2 nor of the Llama family");
    zdp_hf_reader *r = calloc(1, sizeof *r);
    if (r == NULL) return zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory", dir);
    r->n_params = model->n_params;
    r->params = model->params;
    r->seen = ZDP_DTYPE_F32;
    r->loc = calloc((size_t)model->n_params, sizeof *r->loc);
    r->buf = malloc(HF_CHUNK);
    zdp_status s = r->loc == NULL || r->buf == NULL
                       ? zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory", dir)
                       : zdp_hf_folder_open_(dir, &r->f, err);
    if (s == ZDP_OK && (r->fds = malloc((size_t)r->f.n * sizeof *r->fds)) == NULL)
        s = zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory", dir);
    for (int k = 0; s == ZDP_OK && k < r->f.n; k++) r->fds[k] = -1;
    if (s == ZDP_OK) s = hf_map_(&r->f, model, gpt, r->loc, &r->lm, err);
    if (s == ZDP_OK) s = hf_check_(&r->f, model, gpt, r->loc, err);
    if (s == ZDP_OK) s = hf_check_lm_head_(r, model, err);
    if (s != ZDP_OK) {
        zdp_hf_reader_close(r);
        return s;
    }
    *out = r;
    return ZDP_OK;
}

zdp_status zdp_hf_reader_read(void *reader, int i, int64_t lo, int64_t hi, float *dst,
                              zdp_error *err) {
    zdp_hf_reader *r = reader;
    if (r == NULL || dst == NULL || i < 0 || i >= r->n_params)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_hf_reader_read: reader and dst must "
                           "not be NULL and tensor %d must be in [0, %d)", i,
                           r != NULL ? r->n_params : 0);
    const zdp_param_info *pi = &r->params[i];
    const int64_t n = zdp_io_numel(pi->shape, pi->ndim);
    if (lo < 0 || hi < lo || hi > n)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_hf_reader_read: tensor \"%s\": "
                           "elements [%lld, %lld) are not inside its %lld", pi->name,
                           (long long)lo, (long long)hi, (long long)n);
    const hf_loc_ *l = &r->loc[i];
    /* The destination and the raw bytes staged for it. */
    const int64_t raw = (hi - lo) * (int64_t)zdp_dtype_size(l->t->dtype);
    hf_note_((hi - lo) * (int64_t)sizeof(float) + (raw < (int64_t)HF_CHUNK ? raw : (int64_t)HF_CHUNK));
    zdp_status s = hf_read_raw_(r, l, lo, hi - lo, dst, r->buf, HF_CHUNK, err);
    if (s != ZDP_OK) return s;
    if (l->t->dtype != ZDP_DTYPE_F32) r->seen = l->t->dtype;
    const int64_t cols = pi->ndim == 2 ? pi->shape[1] : n;
    for (int64_t j = 0; j < hi - lo; j++) {
        if (isfinite(dst[j])) continue;
        const int64_t at = lo + j;
        char where[64];
        if (pi->ndim == 2)
            snprintf(where, sizeof where, "[%" PRId64 ", %" PRId64 "]", at / cols, at % cols);
        else
            snprintf(where, sizeof where, "[%" PRId64 "]", at);
        return zdp_err_set(err, ZDP_ERR_FORMAT, "%s: tensor \"%s\"%s = %g: weights must be "
                           "finite (NaN or Inf would make every step skip); load a folder "
                           "saved from a healthy run", r->f.paths[l->file], l->t->name, where,
                           (double)dst[j]);
    }
    return ZDP_OK;
}

zdp_status zdp_hf_weights_load(const char *dir, const zdp_model *model, float *const *dst,
                               zdp_error *err) {
    if (dir == NULL || model == NULL || dst == NULL || model->n_params < 1)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_hf_weights_load: dir, model and dst "
                           "must not be NULL");
    zdp_hf_reader *r = NULL;
    zdp_status s = zdp_hf_reader_open(dir, model, &r, err);
    /* Every tensor whole: the whole model at once, in the caller's arrays. */
    int64_t total = 0;
    for (int p = 0; s == ZDP_OK && p < model->n_params; p++)
        total += zdp_io_numel(model->params[p].shape, model->params[p].ndim);
    if (s == ZDP_OK) hf_note_(total * (int64_t)sizeof(float));
    /* Every tensor checked finite before the first write into dst (a
     * staging buffer at a time: raw bytes in the first half, floats in the
     * second), so a failed load changes nothing. */
    const int64_t per = (int64_t)(HF_CHUNK / 2 / sizeof(float));
    float *chk = r != NULL ? (float *)(void *)(r->buf + HF_CHUNK / 2) : NULL;
    for (int p = 0; s == ZDP_OK && p < model->n_params; p++) {
        const zdp_param_info *pi = &model->params[p];
        const int64_t n = zdp_io_numel(pi->shape, pi->ndim);
        for (int64_t i = 0; s == ZDP_OK && i < n; i += per) {
            const int64_t k = n - i < per ? n - i : per;
            s = hf_read_raw_(r, &r->loc[p], i, k, chk, r->buf, HF_CHUNK / 2, err);
            for (int64_t j = 0; s == ZDP_OK && j < k; j++)
                if (!isfinite(chk[j])) s = zdp_hf_reader_read(r, p, i + j, i + j + 1, chk, err);
        }
    }
    for (int p = 0; s == ZDP_OK && p < model->n_params; p++)
        s = zdp_hf_reader_read(r, p, 0, zdp_io_numel(model->params[p].shape, model->params[p].ndim),
                               dst[p], err);
    if (s == ZDP_OK)
        zdp_log(0, "%s: loaded %d tensors from %d file(s)%s%s%s", dir, model->n_params, r->f.n,
                r->seen != ZDP_DTYPE_F32 ? ", " : "", r->seen != ZDP_DTYPE_F32 ? zdp_dtype_name(r->seen) : "",
                r->seen != ZDP_DTYPE_F32 ? " converted to F32" : "");
    zdp_hf_reader_close(r);
    return s;
}

