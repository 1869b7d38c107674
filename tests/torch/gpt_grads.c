/*
 * gpt_grads.c -- zdp's GPT-2 on one micro-batch, everything PyTorch can
 * check, written to a safetensors file (tests/torch/check_gpt.py compares).
 *
 * Public API only, plus the dense grad sink from src/engine/engine.h:
 *   zdp_gpt_create, weights from --init (zdp_safetensors_read) or
 *   zdp_gpt_init_params(--seed), the model ops forward / backward,
 *   zdp_lm_next_logits.
 *
 * usage: gpt_grads --n-layer L --n-head H --n-embd C --vocab-size V
 *                  --block-size T --tokens TOKENS.safetensors
 *                  [--init INIT.safetensors | --seed S] --out OUT.safetensors
 *
 * TOKENS holds "inputs" and "targets", I32 [B, T] (T <= block_size).
 * OUT holds, all F32:
 *   loss [1]                     forward's loss (mean cross-entropy)
 *   loss_again [1]               a second forward on the same batch
 *   next_logits [B, V]           zdp_lm_next_logits of each whole sequence
 *   prefix_logits [T, V]         zdp_lm_next_logits of inputs[0][0..t], t < T:
 *                                the logits of every position of sequence 0
 *   param.<name>                 the weights used (the seeded init when no --init)
 *   grad.<name>                  d loss / d param, backward with dloss = 1 into
 *                                zeroed buffers
 *   grad_accum.<name>            the same buffers after a second forward and a
 *                                backward with dloss = 0.5 added into them
 *                                (should be 1.5 x grad: the sink ADDS)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "zdp/zdp.h"

static int die_(const char *what, const zdp_error *err) {
    fprintf(stderr, "gpt_grads: %s: %s\n", what, err != NULL ? err->msg : "");
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

static int usage_(void) {
    fprintf(stderr,
            "usage: gpt_grads --n-layer L --n-head H --n-embd C --vocab-size V --block-size T\n"
            "                 --tokens TOKENS.safetensors [--init INIT.safetensors | --seed S]\n"
            "                 --out OUT.safetensors\n");
    return 2;
}

int main(int argc, char **argv) {
    zdp_gpt_config gc = {0};
    const char *tokens_path = NULL, *init_path = NULL, *out_path = NULL;
    uint64_t seed = 1234;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (i + 1 >= argc) return usage_();
        const char *v = argv[++i];
        if (strcmp(a, "--n-layer") == 0) gc.n_layer = atoi(v);
        else if (strcmp(a, "--n-head") == 0) gc.n_head = atoi(v);
        else if (strcmp(a, "--n-embd") == 0) gc.n_embd = atoi(v);
        else if (strcmp(a, "--vocab-size") == 0) gc.vocab_size = atoi(v);
        else if (strcmp(a, "--block-size") == 0) gc.block_size = atoi(v);
        else if (strcmp(a, "--tokens") == 0) tokens_path = v;
        else if (strcmp(a, "--init") == 0) init_path = v;
        else if (strcmp(a, "--seed") == 0) seed = strtoull(v, NULL, 10);
        else if (strcmp(a, "--out") == 0) out_path = v;
        else return usage_();
    }
    if (tokens_path == NULL || out_path == NULL) return usage_();

    zdp_error err;
    zdp_safetensors tok;
    if (zdp_safetensors_read(tokens_path, &tok, &err) != ZDP_OK) return die_(tokens_path, &err);
    const zdp_tensor *ti = zdp_safetensors_find(&tok, "inputs");
    const zdp_tensor *tt = zdp_safetensors_find(&tok, "targets");
    if (ti == NULL || tt == NULL || ti->dtype != ZDP_DTYPE_I32 || tt->dtype != ZDP_DTYPE_I32 ||
        ti->ndim != 2 || tt->ndim != 2 || ti->shape[0] != tt->shape[0] ||
        ti->shape[1] != tt->shape[1]) {
        fprintf(stderr, "gpt_grads: %s: want inputs and targets, I32 [B, T] each\n", tokens_path);
        return 1;
    }
    const int B = (int)ti->shape[0], T = (int)ti->shape[1], V = gc.vocab_size;

    zdp_model model;
    if (zdp_gpt_create(&gc, B, &model, &err) != ZDP_OK) return die_("zdp_gpt_create", &err);
    const int n = model.n_params;
    float **params = calloc((size_t)n, sizeof *params);
    float **grads = calloc((size_t)n, sizeof *grads);
    float **accum = calloc((size_t)n, sizeof *accum);
    if (params == NULL || grads == NULL || accum == NULL) return die_("out of memory", NULL);
    for (int i = 0; i < n; i++) {
        size_t k = (size_t)numel_(&model.params[i]);
        params[i] = calloc(k, sizeof(float));
        grads[i] = calloc(k, sizeof(float));
        accum[i] = calloc(k, sizeof(float));
        if (params[i] == NULL || grads[i] == NULL || accum[i] == NULL)
            return die_("out of memory", NULL);
    }

    if (init_path != NULL) {
        zdp_safetensors st;
        if (zdp_safetensors_read(init_path, &st, &err) != ZDP_OK) return die_(init_path, &err);
        for (int i = 0; i < n; i++) {
            const zdp_param_info *p = &model.params[i];
            const zdp_tensor *t = zdp_safetensors_find(&st, p->name);
            int ok = t != NULL && t->dtype == ZDP_DTYPE_F32 && t->ndim == p->ndim;
            for (int d = 0; ok && d < p->ndim; d++) ok = t->shape[d] == p->shape[d];
            if (!ok) {
                fprintf(stderr, "gpt_grads: %s: tensor %s missing or not F32 of the model's shape\n",
                        init_path, p->name);
                return 1;
            }
            memcpy(params[i], t->data, t->nbytes);
        }
        zdp_safetensors_free(&st);
    } else {
        zdp_gpt_init_params(&model, params, seed);
    }

    const float *const *cp = (const float *const *)params;
    zdp_lm_batch batch = {.inputs = ti->data, .targets = tt->data, .B = B, .T = T};
    float loss = 0.0f, loss2 = 0.0f;
    if (zdp_model_forward_dense(&model, cp, &batch, &loss, &err) != ZDP_OK)
        return die_("forward", &err);
    zdp_grad_sink *sink = zdp_grad_sink_create_dense(grads, n);
    if (sink == NULL) return die_("out of memory", NULL);
    if (zdp_model_backward_dense(&model, cp, 1.0f, sink, &err) != ZDP_OK)
        return die_("backward", &err);
    free(sink);

    /* Accumulation: copy, then add 0.5 x the gradient through the sink. */
    for (int i = 0; i < n; i++)
        memcpy(accum[i], grads[i], (size_t)numel_(&model.params[i]) * sizeof(float));
    if (zdp_model_forward_dense(&model, cp, &batch, &loss2, &err) != ZDP_OK)
        return die_("forward (second)", &err);
    sink = zdp_grad_sink_create_dense(accum, n);
    if (sink == NULL) return die_("out of memory", NULL);
    if (zdp_model_backward_dense(&model, cp, 0.5f, sink, &err) != ZDP_OK)
        return die_("backward (second)", &err);
    free(sink);

    float *next = malloc((size_t)B * (size_t)V * sizeof(float));
    float *prefix = malloc((size_t)T * (size_t)V * sizeof(float));
    if (next == NULL || prefix == NULL) return die_("out of memory", NULL);
    const int32_t *in = ti->data;
    for (int b = 0; b < B; b++)
        if (zdp_lm_next_logits(&model, cp, in + (size_t)b * T, T, next + (size_t)b * V, &err) !=
            ZDP_OK)
            return die_("zdp_lm_next_logits", &err);
    for (int t = 0; t < T; t++)
        if (zdp_lm_next_logits(&model, cp, in, t + 1, prefix + (size_t)t * V, &err) != ZDP_OK)
            return die_("zdp_lm_next_logits (prefix)", &err);

    const int n_out = 4 + 3 * n;
    zdp_tensor *out = calloc((size_t)n_out, sizeof *out);
    if (out == NULL) return die_("out of memory", NULL);
    int k = 0;
    out[k++] = (zdp_tensor){.name = "loss", .dtype = ZDP_DTYPE_F32, .ndim = 1, .shape = {1},
                            .data = &loss, .nbytes = sizeof loss};
    out[k++] = (zdp_tensor){.name = "loss_again", .dtype = ZDP_DTYPE_F32, .ndim = 1, .shape = {1},
                            .data = &loss2, .nbytes = sizeof loss2};
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
            const zdp_param_info *p = &model.params[i];
            zdp_tensor *t = &out[k++];
            t->name = prefixed_(prefixes[s], p->name);
            if (t->name == NULL) return die_("out of memory", NULL);
            t->dtype = ZDP_DTYPE_F32;
            t->ndim = p->ndim;
            memcpy(t->shape, p->shape, sizeof t->shape);
            t->data = bufs[s][i];
            t->nbytes = (size_t)numel_(p) * sizeof(float);
        }
    }
    if (zdp_safetensors_write(out_path, out, n_out, &err) != ZDP_OK) return die_(out_path, &err);
    printf("gpt_grads: L=%d H=%d C=%d V=%d block=%d B=%d T=%d loss %.7f -> %s\n", gc.n_layer,
           gc.n_head, gc.n_embd, V, gc.block_size, B, T, (double)loss, out_path);

    for (int i = 4; i < n_out; i++) free(out[i].name);
    free(out);
    free(next);
    free(prefix);
    for (int i = 0; i < n; i++) {
        free(params[i]);
        free(grads[i]);
        free(accum[i]);
    }
    free(params);
    free(grads);
    free(accum);
    zdp_gpt_destroy(&model);
    zdp_safetensors_free(&tok);
    return 0;
}
