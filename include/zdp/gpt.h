/*
 * zdp/gpt.h -- the GPT-2 model and its weight files.
 * Part of the public API; include zdp/zdp.h for all of it.
 */
#ifndef ZDP_PUBLIC_GPT_H
#define ZDP_PUBLIC_GPT_H

#include "zdp/core.h"
#include "zdp/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- GPT-2 ---------------------------------------------------------------- */

/* The GPT-2 family: token + learned position embeddings, n_layer pre-LayerNorm
 * blocks (causal self-attention with a fused qkv projection, MLP with 4C
 * hidden and tanh-approximated GELU), final LayerNorm, lm_head tied to the
 * token embedding, mean cross-entropy over every position.
 *
 * Parameters, in registration order, with Hugging Face GPT2LMHeadModel names
 * and layouts (Conv1D weights are [in, out]: y = x @ W + b), so that a
 * safetensors file of GPT2LMHeadModel copies in tensor by tensor:
 *   transformer.wte.weight [V, C]       transformer.wpe.weight [T, C]
 *   per layer i, prefix transformer.h.{i}.:
 *     ln_1.weight [C], ln_1.bias [C], attn.c_attn.weight [C, 3C], attn.c_attn.bias [3C],
 *     attn.c_proj.weight [C, C], attn.c_proj.bias [C], ln_2.weight [C], ln_2.bias [C],
 *     mlp.c_fc.weight [C, 4C], mlp.c_fc.bias [4C], mlp.c_proj.weight [4C, C],
 *     mlp.c_proj.bias [C]
 *   transformer.ln_f.weight [C], transformer.ln_f.bias [C]
 * (2 + 12 * n_layer + 2 tensors; no lm_head.weight: it is wte.) */
typedef struct zdp_gpt_config {
    int n_layer;    /* L, e.g. 12 */
    int n_head;     /* NH, divides n_embd */
    int n_embd;     /* C, e.g. 768 */
    int vocab_size; /* V, e.g. 50257; 256 for bytes */
    int block_size; /* maximum sequence length T, e.g. 1024 */
} zdp_gpt_config;


/* Creates the model (its zdp_model interface in *out), with activation
 * memory for micro-batches of up to max_batch sequences of block_size
 * tokens.  Errors name the bad field (n_head must divide n_embd, ...). */
ZDP_API zdp_status zdp_gpt_create(const zdp_gpt_config *cfg, int max_batch, zdp_model *out,
                                  zdp_error *err);
ZDP_API void zdp_gpt_destroy(zdp_model *model);
ZDP_API const zdp_gpt_config *zdp_gpt_config_of(const zdp_model *model);
/* GPT-2's initialisation, seeded: weights N(0, 0.02), the two residual
 * projections (attn.c_proj, mlp.c_proj) N(0, 0.02/sqrt(2L)), biases 0,
 * LayerNorm weights 1. */
ZDP_API void zdp_gpt_init_params(const zdp_model *model, float *const *params, uint64_t seed);
/* Loss weights and sampling logits: zdp_lm_set_loss_weights, zdp_lm_next_logits. */

/* ---- GPT-2 weight files ---------------------------------------------------- */

/* Loads GPT-2 weights from `path` into the model's parameter views: dst[i]
 * (shape params[i], the list zdp_gpt_create registers for *cfg, in any
 * order) gets the tensor of that name.  The format is detected from the
 * file's first bytes:
 *
 *   - Hugging Face safetensors (GPT2LMHeadModel's model.safetensors):
 *     names with the "transformer." prefix or without it (the original
 *     gpt2 files), F32, F16 or BF16 (converted to fp32).  Buffers that old
 *     files carry, h.{i}.attn.bias and h.{i}.attn.masked_bias, are ignored.
 *     lm_head.weight, if present, must have wte's shape and equal wte
 *     exactly (zdp ties them); it is then skipped.  A different lm_head is
 *     ZDP_ERR_UNSUPPORTED, because loading it would silently drop a trained,
 *     untied head.  n_head is checked only in files zdp wrote (a
 *     checkpoint's model.safetensors, zdp ckpt export,
 *     zdp_gpt_weights_save_model): their __metadata__ "zdp_model" records
 *     the shape, and a config with another n_head is ZDP_ERR_CONFIG naming
 *     both values; other files have no record of it (no config.json is
 *     read).
 *     Torch.nn.Linear checkpoints (nanoGPT) use the same names with [out, in]
 *     weights: transpose c_attn/c_proj/c_fc first.  c_attn's shape catches
 *     this.
 *   - llm.c model checkpoints (gpt2_124M.bin): a header of 256 int32
 *     {20240326, version, maxT, V, L, NH, C, Vp, 0...}, version 3 (fp32) or
 *     5 (bf16), then llm.c's 16 tensors in its order, (out, in) weights.
 *     They are transposed into zdp's [in, out] layout, and the Vp - V padded
 *     vocabulary rows of wte are dropped.  maxT, V, L, NH and C must equal
 *     the config.
 *
 * block_size must equal the file's T (wpe rows).  Longer files are not
 * cropped.  Every check (format, config against file, every tensor's
 * presence, shape and dtype, tensors the model does not have) runs before
 * the first write into dst, so a mismatch leaves dst untouched.  Only an
 * I/O error during the copy can leave dst partly written.  Each message
 * names the file, the tensor and both shapes, and gives the fix.  Logs one
 * info line (format, dtype, what was ignored).
 * Status: ZDP_ERR_IO (cannot open or read), ZDP_ERR_FORMAT (not a format
 * listed above, truncated, corrupt, a tensor missing, a tensor the model
 * does not have), ZDP_ERR_CONFIG (the file belongs to another
 * configuration: V, T, C, L, NH or a shape differ), ZDP_ERR_FORMAT also for
 * a NaN or Inf weight (names the tensor, index and value; dst then holds
 * what was read), ZDP_ERR_UNSUPPORTED (a
 * dtype other than F32/F16/BF16, an llm.c version other than 3/5, an untied
 * lm_head), ZDP_ERR_INVALID_ARG (NULL, or params do not match *cfg), or
 * ZDP_ERR_NOMEM.  Not collective: typically rank 0 loads into
 * zdp_engine_param_data() views, then calls zdp_engine_sync_params(). */
ZDP_API zdp_status zdp_gpt_weights_load(const char *path, const zdp_gpt_config *cfg,
                                        const zdp_param_info *params, int n_params,
                                        float *const *dst, zdp_error *err);

/* Writes the n_params tensors src[i] (shape and name params[i]) to `path`
 * as an F32 safetensors file, in the given order and atomically
 * (zdp_safetensors_write: a temporary file, then rename).  Given the GPT
 * model's params this is a GPT2LMHeadModel state dict without
 * lm_head.weight, the way save_pretrained stores tied weights.  With a
 * config.json next to it, transformers' from_pretrained loads it and
 * zdp_gpt_weights_load reads it back.  The header carries
 * {"__metadata__": {"format": "pt"}}, as save_pretrained writes it.  Status: ZDP_ERR_INVALID_ARG (NULL,
 * n_params < 1, a bad shape), ZDP_ERR_IO, ZDP_ERR_NOMEM. */
ZDP_API zdp_status zdp_gpt_weights_save(const char *path, const zdp_param_info *params,
                                        int n_params, const float *const *src,
                                        zdp_error *err);
/* The same for a model from zdp_gpt_create, with its shape (shape_json,
 * n_head included) in __metadata__ as "zdp_model", as a checkpoint's
 * model.safetensors and zdp ckpt export have it: zdp_gpt_weights_load then
 * refuses the file for a config with another n_head, naming both values. */
ZDP_API zdp_status zdp_gpt_weights_save_model(const char *path, const zdp_model *model,
                                              const float *const *src, zdp_error *err);

#ifdef __cplusplus
}
#endif
#endif /* ZDP_PUBLIC_GPT_H */
