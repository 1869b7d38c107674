/*
 * safetensors.h -- internal header of src/safetensors: the parts of the
 * .safetensors reader and writer that the rest of the library shares beyond
 * zdp/io.h's public API -- the dtype conversions every weights reader uses,
 * the header-only read for readers of slices, and the tensor-at-a-time
 * write.  The format sits low (on core alone), so that the engine's
 * checkpoints and io's model folders both build on it.  Not part of the
 * public API.
 */
#ifndef ZDP_SAFETENSORS_H
#define ZDP_SAFETENSORS_H

#include "../core/core.h"
#include "zdp/io.h"

#include <stdbool.h>

/* True for the dtypes zdp reads weights from: F32, F16 and BF16. */
bool zdp_io_dtype_float(zdp_dtype t);
/* Element i of a little-endian F32, F16 or BF16 tensor as fp32 (exact: every
 * half and bfloat16 is a float).  Other dtypes: 0 (check first). */
float zdp_io_f32_at(const zdp_tensor *t, int64_t i);
/* "[4, 8]": a shape for messages, into buf (cap 64 holds any shape). */
const char *zdp_io_shape_str(const int64_t *shape, int ndim, char *buf, size_t cap);
/* The product of the dimensions (1 for ndim 0). */
int64_t zdp_io_numel(const int64_t *shape, int ndim);
/* fp32 -> bfloat16, round to nearest even (torch's .to(torch.bfloat16));
 * NaN stays a quiet NaN, infinities stay infinite. */
uint16_t zdp_io_f32_to_bf16(float f);

/* The header of a .safetensors file, checked as zdp_safetensors_read checks
 * it (dtypes, shapes, offsets inside the file, no overlaps), without reading
 * any tensor: out->tensors[i].data is NULL and (*offsets)[i] (malloc'd; free
 * it) is the file offset of tensor i's bytes, which safetensors stores
 * contiguously, so any slice of a tensor is one pread.  Free out with
 * zdp_safetensors_free. */
zdp_status zdp_safetensors_read_header(const char *path, zdp_safetensors *out,
                                       uint64_t **offsets, zdp_error *err);

/* Fills buf with tensor i's bytes (its nbytes) for zdp_safetensors_write_fill. */
typedef zdp_status (*zdp_io_fill_fn)(void *ctx, int i, void *buf, zdp_error *err);
/* zdp_safetensors_write_meta for tensors whose data is NULL: each tensor's
 * bytes come from fill(ctx, i, buf), in order, each once, into one buffer of
 * the largest tensor's size, just before they are written (a writer that
 * never holds more than one tensor).  fill's error ends the write (the
 * temporary file is removed) and is returned. */
zdp_status zdp_safetensors_write_fill(const char *path, const zdp_tensor *tensors, int n,
                                      const char *const *meta, int n_meta, zdp_io_fill_fn fill,
                                      void *ctx, zdp_error *err);

#endif /* ZDP_SAFETENSORS_H */
