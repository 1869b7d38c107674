/*
 * unit_lm.h -- what the cmocka model tests (test_gpt, test_llama,
 * test_gpt_policy_loss, test_sample, test_lora_sample) share: a seeded
 * random stream, random vectors, the finite-difference gradient check, the
 * fixture of a tiny causal LM with its parameters, gradient buffers and a
 * random batch, and the tiny GPT-2 / Llama / Qwen3 models the sampling tests
 * decode with.
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

#include "engine/engine.h" /* zdp_grad_sink_create_dense */
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

/* The objective for fd_check_: scale * the model's loss at f's parameters. */
typedef struct loss_ctx {
    model_fx *f;
    float scale;
} loss_ctx;

static inline double model_obj_(void *v) {
    loss_ctx *c = v;
    float loss;
    zdp_error err;
    if (zdp_model_forward_dense(&c->f->m, (const float *const *)c->f->p, &c->f->batch, &loss,
                                &err) != ZDP_OK)
        fail_msg("%s", err.msg);
    return c->scale * (double)loss;
}

/* Forward + backward with dloss through the dense sink into f->g (zeroed
 * first); the loss. */
static inline float fx_grad_(model_fx *f, float dloss) {
    for (int i = 0; i < f->m.n_params; i++)
        memset(f->g[i], 0, (size_t)f->numel[i] * sizeof(float));
    float loss;
    zdp_error err;
    if (zdp_model_forward_dense(&f->m, (const float *const *)f->p, &f->batch, &loss, &err) != ZDP_OK)
        fail_msg("%s", err.msg);
    zdp_grad_sink *sink = zdp_grad_sink_create_dense(f->g, f->m.n_params);
    if (zdp_model_backward_dense(&f->m, (const float *const *)f->p, dloss, sink, &err) != ZDP_OK)
        fail_msg("%s", err.msg);
    free(sink);
    return loss;
}

static inline void fx_free_(model_fx *f) {
    for (int i = 0; i < f->m.n_params; i++) free(f->p[i]), free(f->g[i]);
    free(f->p), free(f->g), free(f->numel), free(f->inputs), free(f->targets), free(f->weights);
    zdp_model_destroy(&f->m);
}

/* ---- tiny models with random weights (test_sample, test_lora_sample) ---- */

enum { GPT_, LLAMA_, QWEN3_, N_KINDS_ };

static inline const char *kind_name_(int kind) {
    return kind == GPT_ ? "gpt" : kind == LLAMA_ ? "llama" : "qwen3";
}

/* One array per tensor of m, from seed: 2-D tensors U(-a2, a2), the others
 * base1 + U(-a1, a1). */
static inline float **alloc_fill_(const zdp_model *m, uint64_t seed, float a2, float a1,
                                  float base1) {
    float **p = calloc((size_t)m->n_params, sizeof *p);
    for (int i = 0; i < m->n_params; i++) {
        const zdp_param_info *pi = &m->params[i];
        const int64_t n = numel_(pi);
        p[i] = malloc((size_t)n * sizeof(float));
        const float a = pi->ndim == 2 ? a2 : a1, b = pi->ndim == 2 ? 0.0f : base1;
        for (int64_t k = 0; k < n; k++) p[i][k] = b + a * uniform_(&seed);
    }
    return p;
}

static inline void free_params_(float **p, const zdp_model *m) {
    for (int i = 0; p != NULL && i < m->n_params; i++) free(p[i]);
    free(p);
}

/* A model of `kind` (GPT-2: 2 layers, 2 heads, vocab 37; Llama: GQA 4/2
 * heads, head_dim 4, attention biases, untied, llama3 rope scaling when
 * llama3_rope; Qwen3: q/k norm, head_dim 38 (decode attention's 32-wide
 * blocks and their tail), one KV head, tied; vocab 41),
 * block 24 (make_base_block_: `block`), hidden `hidden`, with random weights
 * well above the init scale, so logits are far from ties. */
static inline float **make_base_block_(zdp_model *m, int kind, int hidden, int llama3_rope,
                                       int block) {
    zdp_error err;
    zdp_status st;
    if (kind == GPT_) {
        zdp_gpt_config c = {.n_layer = 2, .n_head = 2, .n_embd = hidden, .vocab_size = 37,
                            .block_size = block};
        st = zdp_gpt_create(&c, 1, m, &err);
    } else {
        zdp_llama_config c = {.arch = ZDP_ARCH_LLAMA, .n_layer = 2, .hidden = hidden, .n_head = 4,
                              .n_kv_head = 2, .head_dim = 4, .ffn = 24, .vocab_size = 41,
                              .block_size = block,
                              .max_position_embeddings = block > 64 ? block : 64,
                              .rms_norm_eps = 1e-5f, .rope_theta = 500.0, .attention_bias = 1,
                              .initializer_range = 0.02};
        if (llama3_rope && kind == LLAMA_) {
            c.rope_type = ZDP_ROPE_LLAMA3, c.rope_factor = 8.0, c.rope_low_freq_factor = 1.0;
            c.rope_high_freq_factor = 4.0, c.rope_original_max_position = 16;
        }
        if (kind == QWEN3_) {
            c.arch = ZDP_ARCH_QWEN3, c.qk_norm = 1, c.head_dim = 38, c.n_kv_head = 1;
            c.tie_word_embeddings = 1, c.attention_bias = 0, c.rms_norm_eps = 1e-6f;
        }
        st = zdp_llama_create(&c, 1, m, &err);
    }
    if (st != ZDP_OK) fail_msg("%s: %s", kind_name_(kind), err.msg);
    return alloc_fill_(m, 1234 + (uint64_t)kind, 0.6f, 0.3f, 1.0f);
}

static inline float **make_base_(zdp_model *m, int kind, int hidden, int llama3_rope) {
    return make_base_block_(m, kind, hidden, llama3_rope, 24);
}

static inline void rand_tokens_(int32_t *t, int n, int V, uint64_t seed) {
    for (int i = 0; i < n; i++) t[i] = (int32_t)(zdp_splitmix64(&seed) % (uint64_t)V);
}

/* Cached logits a against the reference forward's b (named `ref`). */
static inline void assert_close_(const char *what, const char *ref, const float *a,
                                 const float *b, int n, int row) {
    for (int i = 0; i < n; i++)
        if (fabsf(a[i] - b[i]) > 2e-4f + 2e-4f * fabsf(b[i]))
            fail_msg("%s row %d logit %d: cached %.7g, %s %.7g", what, row, i, a[i], ref, b[i]);
}

#endif /* ZDP_TEST_UNIT_LM_H */
