/*
 * io.h -- internal header of src/io: what the weights readers and writers
 * (gpt_io.c, lora_io.c, the hf_*.c files) share: the safetensors format's
 * internal header (src/safetensors: dtype conversions, header-only read,
 * tensor-at-a-time write) and the atomic JSON writer of hf_save.c.  Not
 * part of the public API.
 */
#ifndef ZDP_IO_H
#define ZDP_IO_H

#include "../core/core.h"
#include "../safetensors/safetensors.h"
#include "zdp/io.h"

#include <stdbool.h>

#include <jansson.h>

/* Writes root (taking its reference) to path as indented JSON with a final
 * newline, atomically (temporary file, fsync, rename): hf_save.c's
 * config.json writer, shared with lora_io.c's adapter_config.json. */
zdp_status zdp_io_write_json(const char *path, json_t *root, zdp_error *err);

#endif /* ZDP_IO_H */
