/*
 * unit_lm.h -- what the cmocka model tests (test_gpt, test_llama,
 * test_gpt_policy_loss) share: a seeded random stream, random
 * vectors, the finite-difference gradient check, and the fixture of a tiny
 * causal LM with its parameters, gradient buffers and a random batch.
 * Header-only (static inline), as check.h; include after <cmocka.h>.
 *
 * Finite differences run in float, as the kernels do, with the step that was
 * actually taken ((float)(x + h) - x) and a central difference.
 */
#ifndef ZDP_TEST_UNIT_LM_H
#define ZDP_TEST_UNIT_LM_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "zdp/zdp.h"

static inline uint64_t rng_(uint64_t *s) { return zdp_splitmix64(s); }

/* Uniform in [-1, 1). */
static inline float uniform_(uint64_t *s) {
    return (float)((double)(rng_(s) >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

static inline float *rand_vec_(int64_t n, float scale, uint64_t *s) {
    float *v = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) v[i] = scale * uniform_(s);
    return v;
}

static inline double dot_d_(const float *a, const float *b, int64_t n) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

static inline int64_t numel_(const zdp_param_info *pi) {
    int64_t n = 1;
    for (int d = 0; d < pi->ndim; d++) n *= pi->shape[d];
    return n;
}

/* An objective evaluated at the current inputs (forward only). */
typedef double (*objective_fn)(void *ctx);

/* Central differences of f w.r.t. every element of x (or `sample` random
 * ones when x is larger), against the analytic gradient g. */
static inline void fd_check_(const char *what, float *x, const float *g, int64_t n,
                             objective_fn f, void *ctx, float h, double rtol, double atol,
                             int64_t sample) {
    uint64_t s = 99;
    const int64_t count = sample > 0 && sample < n ? sample : n;
    for (int64_t i = 0; i < count; i++) {
        const int64_t k = count == n ? i : (int64_t)(rng_(&s) % (uint64_t)n);
        const float keep = x[k];
        x[k] = keep + h;
        const double hp = (double)x[k] - keep, up = f(ctx);
        x[k] = keep - h;
        const double hm = keep - (double)x[k], down = f(ctx);
        x[k] = keep;
        const double fd = (up - down) / (hp + hm);
        const double tol = atol + rtol * fmax(fabs(fd), fabs(g[k]));
        if (!(fabs(fd - g[k]) <= tol))
            fail_msg("%s[%lld]: analytic %.7g, finite difference %.7g (tolerance %.3g)", what,
                     (long long)k, (double)g[k], fd, tol);
    }
}

/* A tiny causal LM: its parameters p and gradient buffers g (one zeroed
 * array per tensor), random tokens and the batch over them (B, T). */
typedef struct model_fx {
    zdp_model m;
    float **p, **g;
    int64_t *numel;
    int32_t *inputs, *targets;
    float *weights; /* NULL unless a test sets it (freed by fx_free_) */
    zdp_lm_batch batch;
    int B, T;
} model_fx;

/* After f->m is created: zeroed p and g of the model's shapes. */
static inline void fx_alloc_(model_fx *f) {
    const int np = f->m.n_params;
    f->p = calloc((size_t)np, sizeof(float *));
    f->g = calloc((size_t)np, sizeof(float *));
    f->numel = calloc((size_t)np, sizeof(int64_t));
    for (int i = 0; i < np; i++) {
        f->numel[i] = numel_(&f->m.params[i]);
        f->p[i] = calloc((size_t)f->numel[i], sizeof(float));
        f->g[i] = calloc((size_t)f->numel[i], sizeof(float));
    }
}

/* B x T random inputs and targets in [0, vocab) from the stream s. */
static inline void fx_tokens_(model_fx *f, int B, int T, int vocab, uint64_t *s) {
    f->B = B;
    f->T = T;
    f->inputs = malloc((size_t)B * T * sizeof(int32_t));
    f->targets = malloc((size_t)B * T * sizeof(int32_t));
    for (int i = 0; i < B * T; i++) {
        f->inputs[i] = (int32_t)(rng_(s) % (uint64_t)vocab);
        f->targets[i] = (int32_t)(rng_(s) % (uint64_t)vocab);
    }
    f->batch = (zdp_lm_batch){.inputs = f->inputs, .targets = f->targets, .B = B, .T = T};
}

static inline void fx_free_(model_fx *f) {
    for (int i = 0; i < f->m.n_params; i++) free(f->p[i]), free(f->g[i]);
    free(f->p), free(f->g), free(f->numel), free(f->inputs), free(f->targets), free(f->weights);
    zdp_model_destroy(&f->m);
}

#endif /* ZDP_TEST_UNIT_LM_H */
