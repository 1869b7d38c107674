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
 * TOKENS and OUT: tests/torch/lm_grads.h (the body both tools share).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lm_grads.h"
#include "zdp/zdp.h"

static int die_(const char *what, const zdp_error *err) {
    fprintf(stderr, "llama_grads: %s: %s\n", what, err != NULL ? err->msg : "");
    return 1;
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
    lm_grads_tokens tok;
    if (lm_grads_read_tokens("llama_grads", tokens_path, &tok) != 0) return 1;
    const int B = tok.B, T = tok.T, V = c.vocab_size;

    zdp_model model;
    if (zdp_llama_create(&c, B, &model, &err) != ZDP_OK) return die_("zdp_llama_create", &err);
    float loss;
    if (lm_grads_run("llama_grads", &model, &tok, init_path, zdp_llama_init_params, seed,
                     out_path, &loss) != 0)
        return 1;
    printf("llama_grads: %s L=%d H=%d NH=%d KV=%d hd=%d F=%d V=%d B=%d T=%d loss %.7f -> %s\n",
           c.arch == ZDP_ARCH_QWEN3 ? "qwen3" : "llama", c.n_layer, c.hidden, c.n_head,
           c.n_kv_head, c.head_dim, c.ffn, V, B, T, (double)loss, out_path);

    zdp_llama_destroy(&model);
    lm_grads_tokens_free(&tok);
    return 0;
}
