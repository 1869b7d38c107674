/*
 * zdp/hf.h -- Hugging Face checkpoint folders: config.json and
 * (sharded) safetensors in and out, and the model a folder describes.
 * Part of the public API; include zdp/zdp.h for all of it.
 *
 * A folder is what transformers' save_pretrained writes:
 *   config.json                         model_type, architectures, shape keys
 *   model.safetensors                   every tensor, or, above a size limit,
 *   model-0000k-of-0000n.safetensors    the tensors split in order, and
 *   model.safetensors.index.json        {"metadata": {"total_size": bytes},
 *                                        "weight_map": {tensor: shard file}}
 *   tokenizer.json ...                  (read by the tokenizer, not here)
 * docs/models.md ("Hugging Face folders") lists every key read, its
 * default, and what is refused and why.
 */
#ifndef ZDP_PUBLIC_HF_H
#define ZDP_PUBLIC_HF_H

#include "zdp/core.h"
#include "zdp/gpt.h"
#include "zdp/io.h"
#include "zdp/llama.h"
#include "zdp/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum zdp_hf_family {
    ZDP_HF_GPT2 = 0,  /* model_type "gpt2": zdp_gpt_create */
    ZDP_HF_LLAMA = 1  /* model_type "llama" or "qwen3": zdp_llama_create */
} zdp_hf_family;

/* What a config.json describes.  block_size (in gpt and llama) is the
 * folder's longest sequence (n_positions, max_position_embeddings) until the
 * factory sets the one zdp runs. */
typedef struct zdp_hf_config {
    zdp_hf_family family;
    zdp_gpt_config gpt;     /* family GPT2 */
    zdp_llama_config llama; /* family LLAMA */
    int max_position_embeddings; /* n_positions for GPT-2 */
} zdp_hf_config;

/* The block size the factory uses when the caller gives none:
 * min(max_position_embeddings, this), so a 40,960-position Qwen3 does not
 * allocate activations for 40,960 tokens by default. */
#define ZDP_HF_DEFAULT_BLOCK 1024
/* save_pretrained's default max_shard_size, "5GB" (10^9 bytes a GB). */
#define ZDP_HF_MAX_SHARD_BYTES ((int64_t)5000000000)

/* Parses config.json text (len bytes; `path` names it in messages).  Every
 * key that changes the math is read, with transformers' default when absent;
 * a key zdp cannot honour is refused naming the key, its value and the fix.
 * Status: ZDP_ERR_FORMAT (not JSON, a key of the wrong type),
 * ZDP_ERR_UNSUPPORTED (an unknown model_type or architecture, sliding
 * windows, MoE, another rope type or activation, mlp_bias, pretraining_tp >
 * 1, dropout), ZDP_ERR_CONFIG (a value out of range: heads that do not
 * divide, a non-positive size), ZDP_ERR_INVALID_ARG (NULL). */
ZDP_API zdp_status zdp_hf_config_parse(const char *text, size_t len, const char *path,
                                       zdp_hf_config *out, zdp_error *err);
/* DIR/config.json through zdp_hf_config_parse; ZDP_ERR_IO when it cannot be
 * read (the message says a model folder needs one). */
ZDP_API zdp_status zdp_hf_config_read(const char *dir, zdp_hf_config *out, zdp_error *err);

/* The model a folder describes, for sequences of up to block_size tokens
 * (0: min(max_position_embeddings, ZDP_HF_DEFAULT_BLOCK); larger than
 * max_position_embeddings is ZDP_ERR_CONFIG) and micro-batches of up to
 * max_batch sequences.  GPT-2's learned position table is cropped to
 * block_size rows (zdp_hf_weights_load reads the first block_size). */
ZDP_API zdp_status zdp_hf_model_create(const zdp_hf_config *cfg, int block_size, int max_batch,
                                       zdp_model *out, zdp_error *err);
/* Destroys any model zdp_hf_model_create made (GPT-2 or the Llama family),
 * dispatching on zdp_gpt_config_of / zdp_llama_config_of; the one way the
 * tool and the server free a model they did not pick.  A zeroed model is a
 * no-op. */
ZDP_API void zdp_model_destroy(zdp_model *model);

/* Loads DIR's weights into the model's parameter views dst[i] (shape
 * model->params[i]): DIR/model.safetensors if present, else the shards
 * DIR/model.safetensors.index.json lists.  F32, F16 and BF16 tensors are
 * converted to fp32.  Every check runs before the first write into dst: the
 * index (a shard it names that is missing, a tensor a shard holds that the
 * index does not list, a tensor listed in the wrong shard), each model
 * tensor's presence, shape and dtype, tensors the model does not have, and
 * NaN/Inf.  Ignored: rotary_emb.inv_freq buffers (old Llama files), GPT-2's
 * attn.bias / attn.masked_bias buffers; GPT-2 names with or without
 * "transformer.".  Tied models (GPT-2, tie_word_embeddings): a
 * lm_head.weight equal to the embedding is skipped, a different one is
 * ZDP_ERR_UNSUPPORTED.  Messages name the file, the tensor, both shapes and
 * the fix.  Status: ZDP_ERR_IO, ZDP_ERR_FORMAT, ZDP_ERR_CONFIG (a shape of
 * another configuration), ZDP_ERR_UNSUPPORTED (dtype, untied lm_head),
 * ZDP_ERR_INVALID_ARG, ZDP_ERR_NOMEM.  Not collective.  The whole model at
 * once: at ZeRO stage 3 read through zdp_hf_reader instead. */
ZDP_API zdp_status zdp_hf_weights_load(const char *dir, const zdp_model *model,
                                       float *const *dst, zdp_error *err);

/* A folder's weights read a tensor, or a slice of one, at a time: what
 * ZeRO stage 3 uses so that no rank ever holds the whole model
 * (docs/training.md, "Stage 3 loading").  zdp_hf_reader_open reads the
 * headers only and runs every check zdp_hf_weights_load runs except
 * finiteness (the index, each tensor's presence, shape and dtype, extras,
 * a tied lm_head equal to the embedding -- compared a piece at a time);
 * messages as zdp_hf_weights_load's.  The reader keeps the weight files
 * open until zdp_hf_reader_close.  Not collective; one thread at a time. */
typedef struct zdp_hf_reader zdp_hf_reader;
ZDP_API zdp_status zdp_hf_reader_open(const char *dir, const zdp_model *model,
                                      zdp_hf_reader **out, zdp_error *err);
/* A zdp_tensor_read_fn (reader is a zdp_hf_reader): elements [lo, hi) of
 * model tensor i (row-major, flattened) converted to fp32 into dst, read
 * from the file with one pread per 1 MiB of raw bytes (safetensors stores
 * each tensor contiguously).  A NaN or Inf is ZDP_ERR_FORMAT naming the
 * file, the tensor and the element (dst then holds the slice up to it). */
ZDP_API zdp_status zdp_hf_reader_read(void *reader, int i, int64_t lo, int64_t hi, float *dst,
                                      zdp_error *err);
ZDP_API void zdp_hf_reader_close(zdp_hf_reader *r);
/* The most bytes of weights one load call of this process held at once:
 * a zdp_hf_reader_read's destination plus the raw bytes staged for it (at
 * most 1 MiB), or zdp_hf_weights_load's whole model -- the loader's share
 * of a rank's peak memory.  `zdp train --memory-report` prints it
 * ("load_peak"); a stage-3 load keeps it at or below 2x the largest
 * tensor's fp32 bytes (4x for a tied lm_head compared with the
 * embedding), whatever the model's size. */
ZDP_API int64_t zdp_hf_load_peak_bytes(void);

/* Writes the model (from zdp_hf_model_create, zdp_llama_create or
 * zdp_gpt_create) with weights src[i] as a folder transformers'
 * from_pretrained loads: DIR/config.json (architectures, model_type, every
 * key zdp_hf_config_parse reads, torch_dtype = what was written) and the
 * tensors, names and [out, in] layouts as transformers saves them, tied
 * models without lm_head.weight, in `dtype` (ZDP_DTYPE_F32, or
 * ZDP_DTYPE_BF16 rounded to nearest even).  Up to max_shard_bytes (<= 0:
 * ZDP_HF_MAX_SHARD_BYTES) one model.safetensors; above it shards
 * model-0000k-of-0000n.safetensors, filled in registration order until the
 * next tensor would pass the limit (a larger tensor gets a shard alone), and
 * model.safetensors.index.json.  DIR is created if missing (with the
 * directories above it).  Each file is written atomically (a temporary
 * file, then rename): the shards, then config.json, then the index last;
 * weight files of an earlier save into DIR that this one does not write
 * are removed, so DIR never mixes two saves.  Other files in DIR (a tokenizer) are left alone.
 * Status: ZDP_ERR_INVALID_ARG (NULL, a model of no known family, another
 * dtype), ZDP_ERR_IO, ZDP_ERR_NOMEM. */
ZDP_API zdp_status zdp_hf_save(const char *dir, const zdp_model *model, const float *const *src,
                               zdp_dtype dtype, int64_t max_shard_bytes, zdp_error *err);

/* zdp_hf_save with each tensor read through read(ctx, i, 0, numel, dst)
 * (zdp_tensor_read_fn) just before it is written, in registration order,
 * each once (a write failure stops the reads there): the writer holds one
 * tensor at a time (two copies of it for BF16), never the whole model --
 * how `zdp train --save-model-dir` writes at ZeRO stage 3, each read a
 * gather.  The same files, checks and status as zdp_hf_save. */
ZDP_API zdp_status zdp_hf_save_stream(const char *dir, const zdp_model *model,
                                      zdp_tensor_read_fn read, void *ctx, zdp_dtype dtype,
                                      int64_t max_shard_bytes, zdp_error *err);

/* Copies the tokenizer files found in `from` (tokenizer.json,
 * tokenizer_config.json, special_tokens_map.json, vocab.json, merges.txt,
 * added_tokens.json, encoder.json, vocab.bpe, and generation_config.json,
 * whose token ids generation stops on) into `to`, each atomically;
 * *n_copied (may be NULL) counts them.  When both folders hold a
 * config.json (to's from zdp_hf_save), the bos_token_id and eos_token_id
 * of from's (a number, a list or null) are added to to's.  A `from` with
 * no tokenizer file is ZDP_ERR_IO naming the folder and the files looked
 * for (the token ids are copied all the same); a config.json that is not a
 * JSON object is ZDP_ERR_FORMAT naming it. */
ZDP_API zdp_status zdp_hf_copy_tokenizer(const char *from, const char *to, int *n_copied,
                                         zdp_error *err);

/* model.safetensors.index.json, parsed: entry i says tensor names[i] lives
 * in shard file shards[i]; files[0..n_files) are the distinct shard files in
 * order of first appearance. */
typedef struct zdp_hf_index {
    int n;
    char **names;
    char **shards;
    int n_files;
    char **files;
    int64_t total_size; /* metadata.total_size, -1 when absent */
} zdp_hf_index;

/* Parses index text (`path` names it in messages): weight_map must be an
 * object of strings; each shard file name must be a plain file name in the
 * folder (no '/', not "." or "..", ending in ".safetensors").  Status:
 * ZDP_ERR_FORMAT, ZDP_ERR_NOMEM, ZDP_ERR_INVALID_ARG.  On error *out is
 * empty.  Free with zdp_hf_index_free. */
ZDP_API zdp_status zdp_hf_index_parse(const char *text, size_t len, const char *path,
                                      zdp_hf_index *out, zdp_error *err);
ZDP_API void zdp_hf_index_free(zdp_hf_index *idx);

#ifdef __cplusplus
}
#endif
#endif /* ZDP_PUBLIC_HF_H */
