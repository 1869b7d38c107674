/*
 * llama_grads.c -- zdp's Llama-family model on one micro-batch, everything
 * PyTorch can check, written to a safetensors file (tests/torch/check_llama.py
 * compares against tests/torch/llama_ref.py).
 *
 * Public API only, plus the dense grad sink from src/engine/engine.h:
 *   zdp_llama_create, weights from --init (zdp_safetensors_read, transformers'
 *   names) or zdp_llama_init_params(--seed), the model ops forward /
 *   backward, zdp_lm_next_logits.
 *
 * usage: llama_grads --arch llama|qwen3 --layers L --hidden H --heads NH
 *                    --kv-heads KV --head-dim hd --ffn F --vocab V --block T
 *                    [--max-pos P] [--eps E] [--theta R]
 *                    [--rope linear|llama3 --rope-factor f [--rope-low l
 *                     --rope-high h --rope-orig o]] [--bias 0|1] [--tied 0|1]
 *                    [--init-range s]
 *                    --tokens TOKENS.safetensors [--init INIT.safetensors | --seed S]
 *                    --out OUT.safetensors
 *
 * TOKENS holds "inputs" and "targets", I32 [B, T] (T <= block), and
 * optionally "weights", F32 [B, T] (the zdp_lm_batch loss weights).
 * OUT holds, all F32:
 *   loss [1]                 forward's loss
 *   loss_again [1]           a second forward on the same batch
 *   logprobs [B, T]          forward's log p(targets)
 *   next_logits [B, V]       zdp_lm_next_logits of each whole sequence
 *   prefix_logits [T, V]     zdp_lm_next_logits of inputs[0][0..t], t < T
 *   param.<name>             the weights used
 *   grad.<name>              d loss / d param (dloss = 1, zeroed buffers)
 *   grad_accum.<name>        the same buffers after a second forward and a
 *                            backward with dloss = 0.5 (1.5 x grad: the sink ADDS)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "zdp/zdp.h"

static int die_(const char *what, const zdp_error *err) {
    fprintf(stderr, "llama_grads: %s: %s\n", what, err != NULL ? err->msg : "");
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
            "usage: llama_grads --arch llama|qwen3 --layers L --hidden H --heads NH --kv-heads KV\n"
            "       --head-dim hd --ffn F --vocab V --block T [--max-pos P] [--eps E] [--theta R]\n"
            "       [--rope linear|llama3 --rope-factor f [--rope-low l --rope-high h --rope-orig o]]\n"
            "       [--bias 0|1] [--tied 0|1] [--init-range s] --tokens TOKENS.safetensors\n"
            "       [--init INIT.safetensors | --seed S] --out OUT.safetensors\n");
    return 2;
}

int main(int argc, char **argv) {
    zdp_llama_config c = {.max_position_embeddings = 4096, .rms_norm_eps = 1e-5f,
                          .rope_theta = 10000.0, .initializer_range = 0.02};
    const char *tokens_path = NULL, *init_path = NULL, *out_path = NULL;
    uint64_t seed = 1234;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (i + 1 >= argc) return usage_();
        const char *v = argv[++i];
        if (strcmp(a, "--arch") == 0) {
            c.arch = strcmp(v, "qwen3") == 0 ? ZDP_ARCH_QWEN3 : ZDP_ARCH_LLAMA;
            c.qk_norm = c.arch == ZDP_ARCH_QWEN3;
        } else if (strcmp(a, "--layers") == 0) c.n_layer = atoi(v);
        else if (strcmp(a, "--hidden") == 0) c.hidden = atoi(v);
        else if (strcmp(a, "--heads") == 0) c.n_head = atoi(v);
        else if (strcmp(a, "--kv-heads") == 0) c.n_kv_head = atoi(v);
        else if (strcmp(a, "--head-dim") == 0) c.head_dim = atoi(v);
        else if (strcmp(a, "--ffn") == 0) c.ffn = atoi(v);
        else if (strcmp(a, "--vocab") == 0) c.vocab_size = atoi(v);
        else if (strcmp(a, "--block") == 0) c.block_size = atoi(v);
        else if (strcmp(a, "--max-pos") == 0) c.max_position_embeddings = atoi(v);
        else if (strcmp(a, "--eps") == 0) c.rms_norm_eps = strtof(v, NULL);
        else if (strcmp(a, "--theta") == 0) c.rope_theta = strtod(v, NULL);
        else if (strcmp(a, "--rope") == 0)
            c.rope_type = strcmp(v, "llama3") == 0 ? ZDP_ROPE_LLAMA3
                          : strcmp(v, "linear") == 0 ? ZDP_ROPE_LINEAR : ZDP_ROPE_DEFAULT;
        else if (strcmp(a, "--rope-factor") == 0) c.rope_factor = strtod(v, NULL);
        else if (strcmp(a, "--rope-low") == 0) c.rope_low_freq_factor = strtod(v, NULL);
        else if (strcmp(a, "--rope-high") == 0) c.rope_high_freq_factor = strtod(v, NULL);
        else if (strcmp(a, "--rope-orig") == 0) c.rope_original_max_position = atoi(v);
        else if (strcmp(a, "--bias") == 0) c.attention_bias = atoi(v);
        else if (strcmp(a, "--tied") == 0) c.tie_word_embeddings = atoi(v);
        else if (strcmp(a, "--init-range") == 0) c.initializer_range = strtod(v, NULL);
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
    const zdp_tensor *tw = zdp_safetensors_find(&tok, "weights");
    if (ti == NULL || tt == NULL || ti->dtype != ZDP_DTYPE_I32 || tt->dtype != ZDP_DTYPE_I32 ||
        ti->ndim != 2 || tt->ndim != 2 || ti->shape[0] != tt->shape[0] ||
        ti->shape[1] != tt->shape[1] ||
        (tw != NULL && (tw->dtype != ZDP_DTYPE_F32 || tw->ndim != 2 ||
                        tw->shape[0] != ti->shape[0] || tw->shape[1] != ti->shape[1]))) {
        fprintf(stderr,
                "llama_grads: %s: want inputs and targets, I32 [B, T] each (weights F32 [B, T])\n",
                tokens_path);
        return 1;
    }
    const int B = (int)ti->shape[0], T = (int)ti->shape[1], V = c.vocab_size;

    zdp_model model;
    if (zdp_llama_create(&c, B, &model, &err) != ZDP_OK) return die_("zdp_llama_create", &err);
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
        if (st.n != n) {
            fprintf(stderr, "llama_grads: %s: %d tensors, the model has %d\n", init_path,
                    st.n, n);
            return 1;
        }
        for (int i = 0; i < n; i++) {
            const zdp_param_info *p = &model.params[i];
            const zdp_tensor *t = zdp_safetensors_find(&st, p->name);
            int ok = t != NULL && t->dtype == ZDP_DTYPE_F32 && t->ndim == p->ndim;
            for (int d = 0; ok && d < p->ndim; d++) ok = t->shape[d] == p->shape[d];
            if (!ok) {
                fprintf(stderr,
                        "llama_grads: %s: tensor %s missing or not F32 of the model's shape\n",
                        init_path, p->name);
                return 1;
            }
            memcpy(params[i], t->data, t->nbytes);
        }
        zdp_safetensors_free(&st);
    } else {
        zdp_llama_init_params(&model, params, seed);
    }

    const float *const *cp = (const float *const *)params;
    float *logprobs = malloc((size_t)B * (size_t)T * sizeof(float));
    if (logprobs == NULL) return die_("out of memory", NULL);
    zdp_lm_batch batch = {.inputs = ti->data, .targets = tt->data,
                          .weights = tw != NULL ? tw->data : NULL, .logprobs = logprobs,
                          .B = B, .T = T};
    float loss = 0.0f, loss2 = 0.0f;
    if (model.ops->forward(model.self, cp, &batch, &loss, &err) != ZDP_OK)
        return die_("forward", &err);
    zdp_grad_sink *sink = zdp_grad_sink_create_dense(grads, n);
    if (sink == NULL) return die_("out of memory", NULL);
    if (model.ops->backward(model.self, cp, 1.0f, sink, &err) != ZDP_OK)
        return die_("backward", &err);
    free(sink);

    /* Accumulation: copy, then add 0.5 x the gradient through the sink. */
    for (int i = 0; i < n; i++)
        memcpy(accum[i], grads[i], (size_t)numel_(&model.params[i]) * sizeof(float));
    batch.logprobs = NULL;
    if (model.ops->forward(model.self, cp, &batch, &loss2, &err) != ZDP_OK)
        return die_("forward (second)", &err);
    sink = zdp_grad_sink_create_dense(accum, n);
    if (sink == NULL) return die_("out of memory", NULL);
    if (model.ops->backward(model.self, cp, 0.5f, sink, &err) != ZDP_OK)
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

    const int n_fixed = 5, n_out = n_fixed + 3 * n;
    zdp_tensor *out = calloc((size_t)n_out, sizeof *out);
    if (out == NULL) return die_("out of memory", NULL);
    int k = 0;
    out[k++] = (zdp_tensor){.name = "loss", .dtype = ZDP_DTYPE_F32, .ndim = 1, .shape = {1},
                            .data = &loss, .nbytes = sizeof loss};
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
    printf("llama_grads: %s L=%d H=%d NH=%d KV=%d hd=%d F=%d V=%d B=%d T=%d loss %.7f -> %s\n",
           c.arch == ZDP_ARCH_QWEN3 ? "qwen3" : "llama", c.n_layer, c.hidden, c.n_head,
           c.n_kv_head, c.head_dim, c.ffn, V, B, T, (double)loss, out_path);

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
    zdp_llama_destroy(&model);
    zdp_safetensors_free(&tok);
    return 0;
}
