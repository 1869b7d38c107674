/*
 * zero.h -- internal: the flat-buffer layout, partitions and reduce buckets.
 *
 * Pure arithmetic (no MPI, no allocation of training buffers): where each
 * tensor lives in the flat buffer, which flat range each rank owns, and how
 * the gradient is cut into reduce buckets.  The engine does the rest.
 *
 * Layout (DeepSpeed's, docs/deepspeed.md §4.2): tensors are packed back to back in
 * registration order; the total is padded with zeros to a multiple of 2*W;
 * P = padded / W and rank r owns [r*P, (r+1)*P).  A tensor may straddle
 * partitions; all ZeRO arithmetic is by flat index, never by tensor.
 */
#ifndef ZDP_ZERO_H
#define ZDP_ZERO_H

#include "../core/core.h"

typedef struct zdp_layout {
    int world_size;
    int n_tensors;
    int64_t *offsets; /* (n_tensors) start of tensor i in the flat buffer */
    int64_t *numels;  /* (n_tensors) elements of tensor i */
    int64_t numel;    /* sum of numels */
    int64_t padded;   /* numel rounded up to a multiple of 2*W */
    int64_t part;     /* P = padded / W */
    zdp_mem_counter *mem; /* where the two arrays are counted (may be NULL) */
} zdp_layout;

/* The arrays are counted in *mem (ZDP_MEM_OTHER) when mem is not NULL. */
ZDP_API zdp_status zdp_layout_init(zdp_layout *lay, const zdp_param_info *params, int n_params,
                                   int world_size, zdp_mem_counter *mem, zdp_error *err);
ZDP_API void zdp_layout_free(zdp_layout *lay);

/* Elements of the flat range [lo, hi) that rank r owns. */
ZDP_API int64_t zdp_layout_owned(const zdp_layout *lay, int r, int64_t lo, int64_t hi);

/* A reduce bucket: consecutive tensors [first, last] (registration indices),
 * i.e. the contiguous flat range [lo, hi).  Buckets are planned from the last
 * tensor to the first, because backward finishes layers in that order. */
typedef struct zdp_bucket {
    int first, last;
    int64_t lo, hi;
} zdp_bucket;

/* Plans buckets of at most cap elements (a tensor larger than cap gets a
 * bucket of its own).  *out is malloc'd, bucket 0 holds the last tensors;
 * tensor_bucket[i] (n_tensors entries, malloc'd) gives tensor i's bucket. */
ZDP_API zdp_status zdp_bucket_plan(const zdp_layout *lay, int64_t cap, zdp_bucket **out, int *n_out,
                                   int **tensor_bucket, zdp_error *err);

#endif /* ZDP_ZERO_H */
