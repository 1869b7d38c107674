/*
 * lm_grads.h -- the shared body of gpt_grads.c and llama_grads.c: one
 * micro-batch through a causal LM, everything PyTorch can check, written to
 * a safetensors file.  Each tool parses its own model flags and creates the
 * model; this reads the tokens, sets the weights, runs and writes.
 *
 * TOKENS holds "inputs" and "targets", I32 [B, T], and optionally
 * "weights", F32 [B, T] (the zdp_lm_batch loss weights).
 * OUT holds, all F32:
 *   loss [1]                 forward's loss
 *   loss_again [1]           a second forward on the same batch
 *   logprobs [B, T]          forward's log p(targets)
 *   next_logits [B, V]       zdp_lm_next_logits of each whole sequence
 *   prefix_logits [T, V]     zdp_lm_next_logits of inputs[0][0..t], t < T:
 *                            the logits of every position of sequence 0
 *   param.<name>             the weights used (the seeded init when no --init)
 *   grad.<name>              d loss / d param, backward with dloss = 1 into
 *                            zeroed buffers
 *   grad_accum.<name>        the same buffers after a second forward and a
 *                            backward with dloss = 0.5 added into them
 *                            (should be 1.5 x grad: the sink ADDS)
 */
#ifndef ZDP_TESTS_TORCH_LM_GRADS_H
#define ZDP_TESTS_TORCH_LM_GRADS_H

#include <stdint.h>

#include "zdp/zdp.h"

typedef struct lm_grads_tokens {
    zdp_safetensors file;
    const zdp_tensor *inputs, *targets, *weights; /* weights NULL when absent */
    int B, T;
} lm_grads_tokens;

/* Reads and checks TOKENS; 0 on success, else 1 after a message prefixed
 * with tool.  lm_grads_tokens_free releases it. */
int lm_grads_read_tokens(const char *tool, const char *path, lm_grads_tokens *out);
void lm_grads_tokens_free(lm_grads_tokens *tok);

/* The model's weights from init_path (every tensor by name, F32 of the
 * model's shape, no other) or init(seed) when init_path is NULL; then the
 * run above, written to out_path.  *loss: forward's loss.  0 on success,
 * else 1 after a message prefixed with tool. */
int lm_grads_run(const char *tool, const zdp_model *model, const lm_grads_tokens *tok,
                 const char *init_path,
                 void (*init)(const zdp_model *, float *const *, uint64_t), uint64_t seed,
                 const char *out_path, float *loss);

#endif
