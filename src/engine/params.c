/*
 * params.c -- the engine's parameters as tensors: views, set, get, load
 * (zdp_engine_param_data, _set_param, _get_param, _load_params) and
 * sync_params.
 *
 * Below stage 3 every rank holds the whole flat buffer and a tensor is a
 * view into it.  At stage 3 a rank holds only its partition: set and load
 * write the slice of each tensor inside it, get gathers the tensor whole
 * (a collective, src/zero/stage3.c), and every change marks stage 3's
 * persistent copies stale.  The padding past the last tensor stays zero:
 * it is part of the partitions the optimizer sees.
 */
#include <string.h>

#include "engine_impl.h"

float *zdp_engine_param_data(zdp_engine *e, int i) {
    if (e == NULL || i < 0 || i >= e->lay.n_tensors) return NULL;
    return e->param_ptrs[i];
}

static zdp_status param_index_(const zdp_engine *e, int i, const void *p, const char *fn,
                               zdp_error *err) {
    if (e == NULL || p == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "%s: engine and data must not be NULL", fn);
    if (i < 0 || i >= e->lay.n_tensors)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "%s: tensor %d: the model has %d (0..%d)",
                           fn, i, e->lay.n_tensors, e->lay.n_tensors - 1);
    return ZDP_OK;
}

/* Stage 3: this rank's slice of the flat range [lo, hi): elements [a, b). */
static void owned_range_(const zdp_engine *e, int64_t lo, int64_t hi, int64_t *a, int64_t *b) {
    const int64_t plo = (int64_t)e->rank * e->lay.part, phi = plo + e->lay.part;
    *a = lo > plo ? lo : plo;
    *b = hi < phi ? hi : phi;
    if (*b < *a) *b = *a;
}

zdp_status zdp_engine_set_param(zdp_engine *e, int i, const float *data, zdp_error *err) {
    zdp_status st = param_index_(e, i, data, "zdp_engine_set_param", err);
    if (st != ZDP_OK) return st;
    const int64_t lo = e->lay.offsets[i], n = e->lay.numels[i];
    if (e->cfg.zero.stage < 3) {
        memcpy(e->param_ptrs[i], data, (size_t)n * sizeof(float));
        return ZDP_OK;
    }
    int64_t a, b;
    owned_range_(e, lo, lo + n, &a, &b);
    if (b > a)
        memcpy(e->params + (a - (int64_t)e->rank * e->lay.part), data + (a - lo),
               (size_t)(b - a) * sizeof(float));
    zdp_stage3_params_changed(&e->s3);
    return ZDP_OK;
}

zdp_status zdp_engine_load_params(zdp_engine *e, zdp_tensor_read_fn read, void *ctx,
                                  zdp_error *err) {
    if (e == NULL || read == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_engine_load_params: engine and read "
                           "must not be NULL");
    /* What this rank holds of every tensor: at stage 3 the slice inside its
     * partition, read into place; otherwise whole tensors. */
    zdp_status st =
        zdp_layout_read(&e->lay, e->rank, e->cfg.zero.stage == 3, e->params, read, ctx, err);
    zdp_stage3_params_changed(&e->s3);
    return st;
}

zdp_status zdp_engine_get_param(zdp_engine *e, int i, float *out, zdp_error *err) {
    zdp_status st = param_index_(e, i, out, "zdp_engine_get_param", err);
    if (st != ZDP_OK) return st;
    if (e->cfg.zero.stage < 3) {
        memcpy(out, e->param_ptrs[i], (size_t)e->lay.numels[i] * sizeof(float));
        return ZDP_OK;
    }
    return zdp_stage3_get_tensor(&e->s3, i, out, err);
}

void zdp_engine_zero_padding_(zdp_engine *e) {
    if (e->cfg.zero.stage < 3) {
        memset(e->params + e->lay.numel, 0,
               (size_t)(e->lay.padded - e->lay.numel) * sizeof(float));
        return;
    }
    int64_t a, b;
    owned_range_(e, e->lay.numel, e->lay.padded, &a, &b);
    if (b > a)
        memset(e->params + (a - (int64_t)e->rank * e->lay.part), 0,
               (size_t)(b - a) * sizeof(float));
}

zdp_status zdp_engine_sync_params(zdp_engine *e, zdp_error *err) {
    if (e == NULL) return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "engine is NULL");
    if (e->cfg.zero.stage == 3) {
        /* No rank holds what rank 0 would broadcast: each keeps the slice
         * zdp_engine_set_param wrote (the same values on every rank). */
        zdp_engine_zero_padding_(e);
        zdp_stage3_params_changed(&e->s3);
        return ZDP_OK;
    }
    /* Padding must stay zero: it is part of the partitions the optimizer sees. */
    memset(e->params + e->lay.numel, 0, (size_t)(e->lay.padded - e->lay.numel) * sizeof(float));
    if (e->world == 1) return ZDP_OK;
    return zdp_engine_run_sync_(e, OP_BCAST_PARAMS, NULL, err);
}
