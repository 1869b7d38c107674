/*
 * layout.c -- the flat layout, partition ownership and bucket planning:
 * pure arithmetic, no MPI (zero.h, "layout").
 */
#include "zero.h"

#include <stdlib.h>

zdp_status zdp_layout_init(zdp_layout *lay, const zdp_param_info *params, int n_params,
                           int world_size, zdp_mem_counter *mem, zdp_error *err) {
    *lay = (zdp_layout){.world_size = world_size, .n_tensors = n_params, .mem = mem};
    if (n_params <= 0)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "model: n_params = %d: a model needs at least one parameter tensor",
                           n_params);
    lay->offsets = zdp_alloc(mem, ZDP_MEM_OTHER, (size_t)n_params * sizeof *lay->offsets);
    lay->numels = zdp_alloc(mem, ZDP_MEM_OTHER, (size_t)n_params * sizeof *lay->numels);
    if (lay->offsets == NULL || lay->numels == NULL) {
        zdp_layout_free(lay);
        return zdp_err_set(err, ZDP_ERR_NOMEM, "layout: out of memory");
    }
    int64_t off = 0;
    for (int i = 0; i < n_params; i++) {
        const zdp_param_info *p = &params[i];
        if (p->ndim < 0 || p->ndim > ZDP_MAX_DIMS) {
            zdp_layout_free(lay);
            return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                               "model parameter %d (%s): ndim = %d: must be 0..%d", i,
                               p->name ? p->name : "?", p->ndim, ZDP_MAX_DIMS);
        }
        int64_t n = 1;
        for (int d = 0; d < p->ndim; d++) {
            if (p->shape[d] < 0 || (p->shape[d] > 0 && n > INT64_MAX / 8 / p->shape[d])) {
                zdp_layout_free(lay);
                return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                                   "model parameter %d (%s): shape[%d] = %lld is invalid", i,
                                   p->name ? p->name : "?", d, (long long)p->shape[d]);
            }
            n *= p->shape[d];
        }
        lay->offsets[i] = off;
        lay->numels[i] = n;
        off += n;
    }
    lay->numel = off;
    int64_t align = 2 * (int64_t)world_size;
    lay->padded = (off + align - 1) / align * align;
    lay->part = lay->padded / world_size;
    return ZDP_OK;
}

void zdp_layout_free(zdp_layout *lay) {
    size_t bytes = (size_t)lay->n_tensors * sizeof(int64_t);
    zdp_free(lay->mem, ZDP_MEM_OTHER, lay->offsets, bytes);
    zdp_free(lay->mem, ZDP_MEM_OTHER, lay->numels, bytes);
    lay->offsets = lay->numels = NULL;
}

int64_t zdp_layout_owned(const zdp_layout *lay, int r, int64_t lo, int64_t hi) {
    int64_t plo = (int64_t)r * lay->part, phi = plo + lay->part;
    int64_t a = lo > plo ? lo : plo, b = hi < phi ? hi : phi;
    return b > a ? b - a : 0;
}

zdp_status zdp_bucket_plan(const zdp_layout *lay, int64_t cap, zdp_bucket **out, int *n_out,
                           int **tensor_bucket, zdp_error *err) {
    *out = NULL;
    *n_out = 0;
    *tensor_bucket = NULL;
    zdp_bucket *b = calloc((size_t)lay->n_tensors, sizeof *b);
    int *tb = calloc((size_t)lay->n_tensors, sizeof *tb);
    if (b == NULL || tb == NULL) {
        free(b);
        free(tb);
        return zdp_err_set(err, ZDP_ERR_NOMEM, "bucket plan: out of memory");
    }
    int nb = 0;
    for (int i = lay->n_tensors - 1; i >= 0; i--) {
        int64_t lo = lay->offsets[i], hi = lo + lay->numels[i];
        /* Join the open bucket if it stays within cap, else open a new one. */
        if (nb > 0 && b[nb - 1].hi - lo <= cap) {
            b[nb - 1].first = i;
            b[nb - 1].lo = lo;
        } else {
            b[nb++] = (zdp_bucket){.first = i, .last = i, .lo = lo, .hi = hi};
        }
        tb[i] = nb - 1;
    }
    *out = b;
    *n_out = nb;
    *tensor_bucket = tb;
    return ZDP_OK;
}

zdp_status zdp_layout_read(const zdp_layout *lay, int rank, bool partitioned, float *dst,
                           zdp_tensor_read_fn read, void *ctx, zdp_error *err) {
    const int64_t P = lay->part, plo = partitioned ? (int64_t)rank * P : 0;
    const int64_t phi = partitioned ? plo + P : lay->padded;
    for (int i = 0; i < lay->n_tensors; i++) {
        const int64_t lo = lay->offsets[i], hi = lo + lay->numels[i];
        const int64_t a = lo > plo ? lo : plo, b = hi < phi ? hi : phi;
        if (b <= a) continue;
        zdp_status st = read(ctx, i, a - lo, b - lo, dst + (a - plo), err);
        if (st != ZDP_OK) return st;
    }
    return ZDP_OK;
}
