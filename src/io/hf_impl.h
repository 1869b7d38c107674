/*
 * hf_impl.h -- internal to the hf_*.c files of src/io, which together
 * implement zdp/hf.h: the file names of a Hugging Face folder, the folder's
 * weight files as the reader sees them, and the small helpers more than one
 * of those files uses.  Not part of the public API.
 *
 *   hf_config.c  config.json in and out, and the model it describes
 *   hf_folder.c  model.safetensors.index.json and the weight files' headers
 *   hf_reader.c  each parameter's tensor located, checked and read
 *   hf_save.c    a folder written: shards, index, config.json, tokenizer
 */
#ifndef ZDP_IO_HF_IMPL_H
#define ZDP_IO_HF_IMPL_H

#include "io.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "zdp/hf.h"

/* The files of a folder, as save_pretrained names them. */
#define HF_CONFIG "config.json"
#define HF_SINGLE "model.safetensors"
#define HF_INDEX "model.safetensors.index.json"
#define HF_PATH_MAX 4096

/* The folder's weight files (their headers: no tensor is read here) and the
 * index when sharded. */
typedef struct hf_folder {
    const char *dir;
    int n;                 /* files */
    char **paths;          /* DIR/file */
    zdp_safetensors *st;   /* one per file, headers only (data NULL) */
    uint64_t **off;        /* (n) per file: the file offset of each tensor's bytes */
    zdp_hf_index idx;      /* n == 0: a single model.safetensors */
    char index_path[HF_PATH_MAX];
} hf_folder;

/* Finds DIR's weight files (model.safetensors, or the shards the index
 * names) and reads their headers; checks the index against the shards.  On
 * failure *f may hold part of what was read: free it with
 * zdp_hf_folder_free_ either way. */
zdp_status zdp_hf_folder_open_(const char *dir, hf_folder *f, zdp_error *err);
/* Frees what zdp_hf_folder_open_ filled in. */
void zdp_hf_folder_free_(hf_folder *f);

/* Reads a whole small file into a NUL-terminated buffer (malloc'd; *len
 * bytes before the NUL); NULL with errno set on failure. */
char *zdp_hf_slurp_(const char *path, size_t *len);
/* True when path names an existing file or folder. */
bool zdp_hf_exists_(const char *path);

/* The config.json save_pretrained would write for the model (GPT-2 or the
 * Llama family; the caller checked which), with torch_dtype for dtype.  A
 * new reference; NULL when out of memory. */
json_t *zdp_hf_config_json_(const zdp_model *model, zdp_dtype dtype);

#endif /* ZDP_IO_HF_IMPL_H */
