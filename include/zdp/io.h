/*
 * zdp/io.h -- safetensors files.
 * Part of the public API; include zdp/zdp.h for all of it.
 */
#ifndef ZDP_PUBLIC_IO_H
#define ZDP_PUBLIC_IO_H

#include "zdp/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- safetensors -------------------------------------------------------- */

typedef enum zdp_dtype {
    ZDP_DTYPE_F32,
    ZDP_DTYPE_F64,
    ZDP_DTYPE_I64,
    ZDP_DTYPE_I32,
    ZDP_DTYPE_U16,
    ZDP_DTYPE_BF16,
    ZDP_DTYPE_F16,
    ZDP_DTYPE_U8,
} zdp_dtype;

typedef struct zdp_tensor {
    char *name;
    zdp_dtype dtype;
    int ndim;
    int64_t shape[ZDP_MAX_DIMS];
    void *data;      /* little-endian element data */
    size_t nbytes;
} zdp_tensor;

typedef struct zdp_safetensors {
    int n;
    zdp_tensor *tensors;
} zdp_safetensors;

/* Reads a whole .safetensors file, validating the header length, the JSON,
 * every dtype, shape and offset range (no overlaps, no gaps past the end).
 * Errors name the file, the tensor and the field. */
ZDP_API zdp_status zdp_safetensors_read(const char *path, zdp_safetensors *out,
                                        zdp_error *err);
/* Looks a tensor up by name; NULL if absent. */
ZDP_API const zdp_tensor *zdp_safetensors_find(const zdp_safetensors *st, const char *name);
ZDP_API void zdp_safetensors_free(zdp_safetensors *st);
/* Writes n tensors (names, dtypes, shapes, data) to path, atomically
 * (temporary file + rename). */
ZDP_API zdp_status zdp_safetensors_write(const char *path, const zdp_tensor *tensors,
                                         int n, zdp_error *err);
/* The same, with a "__metadata__" object of n_meta string pairs
 * meta[2k] -> meta[2k+1] (Hugging Face files carry {"format": "pt"}). */
ZDP_API zdp_status zdp_safetensors_write_meta(const char *path, const zdp_tensor *tensors, int n,
                                              const char *const *meta, int n_meta,
                                              zdp_error *err);
ZDP_API const char *zdp_dtype_name(zdp_dtype t); /* "F32" */
ZDP_API size_t zdp_dtype_size(zdp_dtype t);

#ifdef __cplusplus
}
#endif
#endif /* ZDP_PUBLIC_IO_H */
