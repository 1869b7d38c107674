/*
 * lm_grads.c -- see lm_grads.h.  Public API only, plus the dense grad sink
 * from src/engine/engine.h: zdp_safetensors_read, the model ops forward /
 * backward, zdp_lm_next_logits, zdp_safetensors_write.
 */
#include "lm_grads.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"

static int die_(const char *tool, const char *what, const zdp_error *err) {
    fprintf(stderr, "%s: %s: %s\n", tool, what, err != NULL ? err->msg : "");
    return 1;
}

static int64_t numel_(const zdp_param_info *p) {
    int64_t n = 1;
    for (int d = 0; d < p->ndim; d++) n *= p->shape[d];
    return n;
}

static char *prefixed_(const char *prefix, const char *name) {
    size_t n = strlen(prefix) + strlen(name) + 1;
    char *s = malloc(n);
    if (s != NULL) snprintf(s, n, "%s%s", prefix, name);
    return s;
}

int lm_grads_read_tokens(const char *tool, const char *path, lm_grads_tokens *out) {
    zdp_error err;
    memset(out, 0, sizeof *out);
    if (zdp_safetensors_read(path, &out->file, &err) != ZDP_OK) return die_(tool, path, &err);
    const zdp_tensor *ti = zdp_safetensors_find(&out->file, "inputs");
    const zdp_tensor *tt = zdp_safetensors_find(&out->file, "targets");
    const zdp_tensor *tw = zdp_safetensors_find(&out->file, "weights");
    if (ti == NULL || tt == NULL || ti->dtype != ZDP_DTYPE_I32 || tt->dtype != ZDP_DTYPE_I32 ||
        ti->ndim != 2 || tt->ndim != 2 || ti->shape[0] != tt->shape[0] ||
        ti->shape[1] != tt->shape[1] ||
        (tw != NULL && (tw->dtype != ZDP_DTYPE_F32 || tw->ndim != 2 ||
                        tw->shape[0] != ti->shape[0] || tw->shape[1] != ti->shape[1]))) {
        fprintf(stderr,
                "%s: %s: want inputs and targets, I32 [B, T] each (weights F32 [B, T])\n", tool,
                path);
        zdp_safetensors_free(&out->file);
        return 1;
    }
    out->inputs = ti;
    out->targets = tt;
    out->weights = tw;
    out->B = (int)ti->shape[0];
    out->T = (int)ti->shape[1];
    return 0;
}

void lm_grads_tokens_free(lm_grads_tokens *tok) { zdp_safetensors_free(&tok->file); }

/* params[i] = the tensor of model parameter i's name in path. */
static int read_init_(const char *tool, const zdp_model *model, const char *path,
                      float *const *params) {
    zdp_error err;
    zdp_safetensors st;
    if (zdp_safetensors_read(path, &st, &err) != ZDP_OK) return die_(tool, path, &err);
    const int n = model->n_params;
    int rc = 0;
    if (st.n != n) {
        fprintf(stderr, "%s: %s: %d tensors, the model has %d\n", tool, path, st.n, n);
        rc = 1;
    }
    for (int i = 0; rc == 0 && i < n; i++) {
        const zdp_param_info *p = &model->params[i];
        const zdp_tensor *t = zdp_safetensors_find(&st, p->name);
        int ok = t != NULL && t->dtype == ZDP_DTYPE_F32 && t->ndim == p->ndim;
        for (int d = 0; ok && d < p->ndim; d++) ok = t->shape[d] == p->shape[d];
        if (!ok) {
            fprintf(stderr, "%s: %s: tensor %s missing or not F32 of the model's shape\n", tool,
                    path, p->name);
            rc = 1;
        } else {
            memcpy(params[i], t->data, t->nbytes);
        }
    }
    zdp_safetensors_free(&st);
    return rc;
}

int lm_grads_run(const char *tool, const zdp_model *model, const lm_grads_tokens *tok,
                 const char *init_path,
                 void (*init)(const zdp_model *, float *const *, uint64_t), uint64_t seed,
                 const char *out_path, float *loss) {
    zdp_error err;
    const int n = model->n_params, B = tok->B, T = tok->T, V = model->vocab_size;
    float **params = calloc((size_t)n, sizeof *params);
    float **grads = calloc((size_t)n, sizeof *grads);
    float **accum = calloc((size_t)n, sizeof *accum);
    if (params == NULL || grads == NULL || accum == NULL) return die_(tool, "out of memory", NULL);
    for (int i = 0; i < n; i++) {
        size_t k = (size_t)numel_(&model->params[i]);
        params[i] = calloc(k, sizeof(float));
        grads[i] = calloc(k, sizeof(float));
        accum[i] = calloc(k, sizeof(float));
        if (params[i] == NULL || grads[i] == NULL || accum[i] == NULL)
            return die_(tool, "out of memory", NULL);
    }
    if (init_path != NULL) {
        if (read_init_(tool, model, init_path, params) != 0) return 1;
    } else {
        init(model, params, seed);
    }

    const float *const *cp = (const float *const *)params;
    float *logprobs = malloc((size_t)B * (size_t)T * sizeof(float));
    if (logprobs == NULL) return die_(tool, "out of memory", NULL);
    zdp_lm_batch batch = {.inputs = tok->inputs->data, .targets = tok->targets->data,
                          .weights = tok->weights != NULL ? tok->weights->data : NULL,
                          .logprobs = logprobs, .B = B, .T = T};
    float loss2 = 0.0f;
    *loss = 0.0f;
    if (zdp_model_forward_dense(model, cp, &batch, loss, &err) != ZDP_OK)
        return die_(tool, "forward", &err);
    zdp_grad_sink *sink = zdp_grad_sink_create_dense(grads, n);
    if (sink == NULL) return die_(tool, "out of memory", NULL);
    if (zdp_model_backward_dense(model, cp, 1.0f, sink, &err) != ZDP_OK)
        return die_(tool, "backward", &err);
    free(sink);

    /* Accumulation: copy, then add 0.5 x the gradient through the sink. */
    for (int i = 0; i < n; i++)
        memcpy(accum[i], grads[i], (size_t)numel_(&model->params[i]) * sizeof(float));
    batch.logprobs = NULL;
    if (zdp_model_forward_dense(model, cp, &batch, &loss2, &err) != ZDP_OK)
        return die_(tool, "forward (second)", &err);
    sink = zdp_grad_sink_create_dense(accum, n);
    if (sink == NULL) return die_(tool, "out of memory", NULL);
    if (zdp_model_backward_dense(model, cp, 0.5f, sink, &err) != ZDP_OK)
        return die_(tool, "backward (second)", &err);
    free(sink);

    float *next = malloc((size_t)B * (size_t)V * sizeof(float));
    float *prefix = malloc((size_t)T * (size_t)V * sizeof(float));
    if (next == NULL || prefix == NULL) return die_(tool, "out of memory", NULL);
    const int32_t *in = tok->inputs->data;
    for (int b = 0; b < B; b++)
        if (zdp_lm_next_logits(model, cp, in + (size_t)b * T, T, next + (size_t)b * V, &err) !=
            ZDP_OK)
            return die_(tool, "zdp_lm_next_logits", &err);
    for (int t = 0; t < T; t++)
        if (zdp_lm_next_logits(model, cp, in, t + 1, prefix + (size_t)t * V, &err) != ZDP_OK)
            return die_(tool, "zdp_lm_next_logits (prefix)", &err);

    const int n_fixed = 5, n_out = n_fixed + 3 * n;
    zdp_tensor *out = calloc((size_t)n_out, sizeof *out);
    if (out == NULL) return die_(tool, "out of memory", NULL);
    int k = 0;
    out[k++] = (zdp_tensor){.name = "loss", .dtype = ZDP_DTYPE_F32, .ndim = 1, .shape = {1},
                            .data = loss, .nbytes = sizeof *loss};
    out[k++] = (zdp_tensor){.name = "loss_again", .dtype = ZDP_DTYPE_F32, .ndim = 1, .shape = {1},
                            .data = &loss2, .nbytes = sizeof loss2};
    out[k++] = (zdp_tensor){.name = "logprobs", .dtype = ZDP_DTYPE_F32, .ndim = 2,
                            .shape = {B, T}, .data = logprobs,
                            .nbytes = (size_t)B * (size_t)T * sizeof(float)};
    out[k++] = (zdp_tensor){.name = "next_logits", .dtype = ZDP_DTYPE_F32, .ndim = 2,
                            .shape = {B, V}, .data = next,
                            .nbytes = (size_t)B * (size_t)V * sizeof(float)};
    out[k++] = (zdp_tensor){.name = "prefix_logits", .dtype = ZDP_DTYPE_F32, .ndim = 2,
                            .shape = {T, V}, .data = prefix,
                            .nbytes = (size_t)T * (size_t)V * sizeof(float)};
    const char *prefixes[3] = {"param.", "grad.", "grad_accum."};
    float **bufs[3] = {params, grads, accum};
    for (int s = 0; s < 3; s++) {
        for (int i = 0; i < n; i++) {
            const zdp_param_info *p = &model->params[i];
            zdp_tensor *t = &out[k++];
            t->name = prefixed_(prefixes[s], p->name);
            if (t->name == NULL) return die_(tool, "out of memory", NULL);
            t->dtype = ZDP_DTYPE_F32;
            t->ndim = p->ndim;
            memcpy(t->shape, p->shape, sizeof t->shape);
            t->data = bufs[s][i];
            t->nbytes = (size_t)numel_(p) * sizeof(float);
        }
    }
    if (zdp_safetensors_write(out_path, out, n_out, &err) != ZDP_OK)
        return die_(tool, out_path, &err);

    for (int i = n_fixed; i < n_out; i++) free(out[i].name);
    free(out);
    free(next);
    free(prefix);
    free(logprobs);
    for (int i = 0; i < n; i++) {
        free(params[i]);
        free(grads[i]);
        free(accum[i]);
    }
    free(params);
    free(grads);
    free(accum);
    return 0;
}
