/*
 * lm_dir.h -- a Hugging Face model folder as the tool drives it (`zdp sample
 * --model-dir`, `zdp serve --model-dir`): its config, the model the factory
 * makes of it, its weights, and its tokenizer when it has one
 * (docs/models.md, "Sampling and serving").
 */
#ifndef ZDP_TOOL_LM_DIR_H
#define ZDP_TOOL_LM_DIR_H

#include <stdbool.h>

#include "zdp/zdp.h"

typedef struct lm_dir {
    const char *dir;       /* as given */
    char *real;            /* its absolute path: get_info's tokenizer_id */
    const char *name;      /* its last component ("SmolLM2-135M"): zdp serve's default model name */
    zdp_hf_config cfg;
    int block_size;        /* --block-size, 0: the factory's default */
    zdp_tokenizer *tok;    /* NULL when the folder holds no tokenizer files */
    const char *arch;      /* "gpt2", "llama", "qwen3" */
    char summary[192];     /* "llama L=2 H=64 NH=4 KV=2 V=... T=... (DIR)", once created */
} lm_dir;

/* Reads DIR/config.json and, when the folder has tokenizer files, its
 * tokenizer; need_tokenizer: a folder without one is an error naming the fix.
 * 0 or cli_fail's code (the message names --model-dir and the file). */
int lm_dir_open(const char *dir, int block_size, bool need_tokenizer, lm_dir *out);
void lm_dir_close(lm_dir *d);
/* The model for micro-batches of max_batch sequences (zdp_model_destroy
 * frees it); fills d->summary.  0 or cli_fail's code. */
zdp_status lm_dir_create(lm_dir *d, int max_batch, zdp_model *out, zdp_error *err);
/* Weights at path into dst (one buffer per model->params entry): a model
 * folder (zdp_hf_weights_load), or one F32 safetensors file of the model's
 * tensors by name, as lm_dir_save writes it (GPT-2: zdp_gpt_weights_load). */
zdp_status lm_dir_load(const lm_dir *d, const char *path, const zdp_model *model, float *const *dst,
                       zdp_error *err);
/* The model's tensors src as one F32 safetensors file at path, with
 * transformers' names (the folder's model.safetensors layout). */
zdp_status lm_dir_save(const lm_dir *d, const char *path, const zdp_model *model, const float *const *src,
                       zdp_error *err);
/* One buffer per parameter tensor (NULL on out of memory); free with
 * lm_views_free. */
float **lm_views_alloc(const zdp_model *model);
void lm_views_free(const zdp_model *model, float **v);

#endif /* ZDP_TOOL_LM_DIR_H */
