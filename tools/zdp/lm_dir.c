/*
 * lm_dir.c -- a Hugging Face model folder for `zdp sample` and `zdp serve`
 * (lm_dir.h).
 */
#define _POSIX_C_SOURCE 200809L
#define _XOPEN_SOURCE 700 /* realpath */
#include "lm_dir.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"

static bool is_file_(const char *dir, const char *name) {
    char p[PATH_MAX];
    struct stat sb;
    return snprintf(p, sizeof p, "%s/%s", dir, name) < (int)sizeof p && stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

int lm_dir_open(const char *dir, int block_size, bool load_tokenizer, bool need_tokenizer, lm_dir *out) {
    *out = (lm_dir){.dir = dir, .block_size = block_size};
    zdp_error err;
    if (zdp_hf_config_read(dir, &out->cfg, &err) != ZDP_OK) return cli_fail("--model-dir %s", err.msg);
    if ((out->real = realpath(dir, NULL)) == NULL) return cli_fail("--model-dir %s: cannot resolve the path", dir);
    out->name = strrchr(out->real, '/') + 1;
    if (*out->name == '\0') out->name = "zdp-model";
    out->arch = out->cfg.family == ZDP_HF_GPT2               ? "gpt2"
                : out->cfg.llama.arch == ZDP_ARCH_QWEN3 ? "qwen3"
                                                           : "llama";
    /* The files zdp_tokenizer_load reads; a folder with none has no tokenizer. */
    const bool has_tok = is_file_(dir, "tokenizer.json") || is_file_(dir, "encoder.json") ||
                         is_file_(dir, "vocab.json");
    if (!has_tok || !load_tokenizer) {
        if (need_tokenizer && !has_tok)
            return cli_fail("--model-dir %s: no tokenizer (tokenizer.json, or GPT-2's encoder.json + vocab.bpe) in "
                            "the folder; copy one in (zdp init-model --tokenizer DIR does) or give token ids",
                            dir);
        return 0;
    }
    if (zdp_tokenizer_load(dir, &out->tok, &err) != ZDP_OK) return cli_fail("--model-dir %s", err.msg);
    const int32_t tv = zdp_tokenizer_vocab_size(out->tok);
    const int V = out->cfg.family == ZDP_HF_GPT2 ? out->cfg.gpt.vocab_size : out->cfg.llama.vocab_size;
    if (tv > V)
        return cli_fail("--model-dir %s: the tokenizer has ids up to %d but config.json's vocab_size is %d: the "
                        "tokenizer does not belong to this model; use the model's own tokenizer",
                        dir, (int)tv - 1, V);
    return 0;
}

void lm_dir_close(lm_dir *d) {
    zdp_tokenizer_destroy(d->tok);
    free(d->real);
    *d = (lm_dir){0};
}

zdp_status lm_dir_create(lm_dir *d, int max_batch, zdp_model *out, zdp_error *err) {
    zdp_status st = zdp_hf_model_create(&d->cfg, d->block_size, max_batch, out, err);
    if (st != ZDP_OK) return st;
    if (d->cfg.family == ZDP_HF_GPT2) {
        const zdp_gpt_config *c = &d->cfg.gpt;
        snprintf(d->summary, sizeof d->summary, "gpt2 L=%d H=%d C=%d V=%d T=%d (%.100s)", c->n_layer, c->n_head,
                 c->n_embd, out->vocab_size, out->block_size, d->dir);
    } else {
        const zdp_llama_config *c = &d->cfg.llama;
        snprintf(d->summary, sizeof d->summary, "%s L=%d H=%d NH=%d KV=%d F=%d V=%d T=%d (%.80s)", d->arch,
                 c->n_layer, c->hidden, c->n_head, c->n_kv_head, c->ffn, out->vocab_size, out->block_size, d->dir);
    }
    return ZDP_OK;
}

static zdp_status fail_(zdp_error *err, zdp_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static zdp_status fail_(zdp_error *err, zdp_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    err->code = code;
    err->rank = -1;
    return code;
}

static int64_t numel_(const zdp_param_info *p) {
    int64_t n = 1;
    for (int k = 0; k < p->ndim; k++) n *= p->shape[k];
    return n;
}

zdp_status lm_dir_load(const lm_dir *d, const char *path, const zdp_model *model, float *const *dst,
                       zdp_error *err) {
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) return zdp_hf_weights_load(path, model, dst, err);
    if (d->cfg.family == ZDP_HF_GPT2)
        return zdp_gpt_weights_load(path, zdp_gpt_config_of(model), model->params, model->n_params, dst, err);
    zdp_safetensors f;
    zdp_status st = zdp_safetensors_read(path, &f, err);
    if (st != ZDP_OK) return st;
    /* Every check before the first write: a failed read changes nothing. */
    for (int i = 0; i < model->n_params && st == ZDP_OK; i++) {
        const zdp_param_info *p = &model->params[i];
        const zdp_tensor *t = zdp_safetensors_find(&f, p->name);
        bool same = t != NULL && t->ndim == p->ndim && t->dtype == ZDP_DTYPE_F32;
        for (int k = 0; same && k < p->ndim; k++) same = t->shape[k] == p->shape[k];
        if (!same)
            st = fail_(err, ZDP_ERR_FORMAT, "%s: tensor %s: %s; want an F32 tensor of the served model's "
                             "shape (a file save_weights_for_sampler wrote for this model)", path, p->name,
                             t == NULL ? "missing" : "another shape or dtype");
    }
    if (st == ZDP_OK && f.n != model->n_params)
        st = fail_(err, ZDP_ERR_FORMAT, "%s: %d tensors, the served model has %d: not this model's weights",
                         path, f.n, model->n_params);
    for (int i = 0; i < model->n_params && st == ZDP_OK; i++)
        memcpy(dst[i], zdp_safetensors_find(&f, model->params[i].name)->data,
               (size_t)numel_(&model->params[i]) * sizeof(float));
    zdp_safetensors_free(&f);
    return st;
}

zdp_status lm_dir_save(const lm_dir *d, const char *path, const zdp_model *model, const float *const *src,
                       zdp_error *err) {
    if (d->cfg.family == ZDP_HF_GPT2) return zdp_gpt_weights_save(path, model->params, model->n_params, src, err);
    zdp_tensor *t = calloc((size_t)model->n_params, sizeof *t);
    if (t == NULL) return fail_(err, ZDP_ERR_NOMEM, "%s: out of memory", path);
    for (int i = 0; i < model->n_params; i++) {
        const zdp_param_info *p = &model->params[i];
        t[i] = (zdp_tensor){.name = (char *)p->name, .dtype = ZDP_DTYPE_F32, .ndim = p->ndim,
                            .data = (void *)src[i], .nbytes = (size_t)numel_(p) * sizeof(float)};
        memcpy(t[i].shape, p->shape, sizeof t[i].shape);
    }
    static const char *const meta[] = {"format", "pt"};
    zdp_status st = zdp_safetensors_write_meta(path, t, model->n_params, meta, 1, err);
    free(t);
    return st;
}

float **lm_views_alloc(const zdp_model *model) {
    float **v = calloc((size_t)model->n_params, sizeof *v);
    for (int i = 0; v != NULL && i < model->n_params; i++)
        if ((v[i] = zdp_big_alloc((size_t)numel_(&model->params[i]) * sizeof(float))) == NULL) {
            lm_views_free(model, v);
            return NULL;
        }
    return v;
}

void lm_views_free(const zdp_model *model, float **v) {
    for (int i = 0; v != NULL && i < model->n_params; i++) free(v[i]);
    free(v);
}
