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
 * TOKENS and OUT: tests/torch/lm_grads.h (the body both tools share).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lm_grads.h"
#include "zdp/zdp.h"

static int die_(const char *what, const zdp_error *err) {
    fprintf(stderr, "gpt_grads: %s: %s\n", what, err != NULL ? err->msg : "");
    return 1;
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
    lm_grads_tokens tok;
    if (lm_grads_read_tokens("gpt_grads", tokens_path, &tok) != 0) return 1;
    const int B = tok.B, T = tok.T, V = gc.vocab_size;

    zdp_model model;
    if (zdp_gpt_create(&gc, B, &model, &err) != ZDP_OK) return die_("zdp_gpt_create", &err);
    float loss;
    if (lm_grads_run("gpt_grads", &model, &tok, init_path, zdp_gpt_init_params, seed,
                     out_path, &loss) != 0)
        return 1;
    printf("gpt_grads: L=%d H=%d C=%d V=%d block=%d B=%d T=%d loss %.7f -> %s\n", gc.n_layer,
           gc.n_head, gc.n_embd, V, gc.block_size, B, T, (double)loss, out_path);

    zdp_gpt_destroy(&model);
    lm_grads_tokens_free(&tok);
    return 0;
}
