/*
 * test_llama.c -- the Llama-family model (zdp/llama.h): parameter
 * registration (names, order, shapes for every optional part), config
 * checks naming the bad field, the seeded init, and finite-difference
 * gradient checks of every kernel on its own (RMSNorm, rope, GQA attention
 * over several row blocks, SwiGLU, token embedding) and of the whole model's
 * loss (Llama with GQA untied, Qwen3 with q/k norm and head_dim != H/NH tied,
 * attention biases, llama3 rope scaling), the rope frequencies against
 * transformers' formulas, next_logits against the full forward, and weights
 * and logprobs.
 *
 * Finite differences run in float, as the kernels do, with the step actually
 * taken ((float)(x + h) - x) and a central difference; kernel objectives are
 * sum(out * R) for a fixed random R (so dout = R), summed in double.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/unit_lm.h"
#include "engine/engine.h"
#include "nn/gemm.h"
#include "nn/nn.h"
#include "zdp/zdp.h"

/* ---- helpers ------------------------------------------------------------------ */

static double max_abs_(const float *x, int64_t n) {
    double m = 0.0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs(x[i]));
    return m;
}

/* ---- RMSNorm -------------------------------------------------------------------- */

typedef struct rms_ctx {
    int64_t N, C;
    float *x, *w, *out, *rstd, *R;
} rms_ctx;

static double rms_obj_(void *v) {
    rms_ctx *c = v;
    zdp_nn_rmsnorm_forward(c->out, c->rstd, c->x, c->w, c->N, c->C, 1e-5f);
    return dot_d_(c->out, c->R, c->N * c->C);
}

static void test_rmsnorm(void **state) {
    (void)state;
    uint64_t s = 1;
    const int64_t N = 5, C = 11;
    rms_ctx c = {.N = N, .C = C, .x = rand_vec_(N * C, 1.0f, &s), .w = rand_vec_(C, 1.5f, &s),
                 .out = malloc(N * C * sizeof(float)), .rstd = malloc(N * sizeof(float)),
                 .R = rand_vec_(N * C, 1.0f, &s)};
    rms_obj_(&c);
    /* The forward against a double reference. */
    for (int64_t n = 0; n < N; n++) {
        double ss = 0.0;
        for (int64_t k = 0; k < C; k++) ss += (double)c.x[n * C + k] * c.x[n * C + k];
        const double r = 1.0 / sqrt(ss / C + 1e-5);
        for (int64_t k = 0; k < C; k++)
            assert_true(fabs(c.out[n * C + k] - c.x[n * C + k] * r * c.w[k]) < 1e-5);
    }
    /* Backward ADDS: start the gradients at 1 and subtract. */
    float *dx = malloc(N * C * sizeof(float)), *dw = malloc(C * sizeof(float));
    for (int64_t i = 0; i < N * C; i++) dx[i] = 1.0f;
    for (int64_t i = 0; i < C; i++) dw[i] = 1.0f;
    zdp_nn_rmsnorm_backward(dx, dw, c.R, c.x, c.w, c.rstd, N, C);
    for (int64_t i = 0; i < N * C; i++) dx[i] -= 1.0f;
    for (int64_t i = 0; i < C; i++) dw[i] -= 1.0f;
    fd_check_("rmsnorm dx", c.x, dx, N * C, rms_obj_, &c, 1e-2f, 1e-2, 1e-4, 0);
    fd_check_("rmsnorm dw", c.w, dw, C, rms_obj_, &c, 1e-2f, 1e-2, 1e-4, 0);
    free(c.x), free(c.w), free(c.out), free(c.rstd), free(c.R), free(dx), free(dw);
}

/* ---- rotary embeddings ------------------------------------------------------------ */

/* The frequencies against transformers' formulas written out here once more:
 * default theta^(-2i/d); linear / factor; llama3 with Llama 3.1's numbers
 * (factor 8, low 1, high 4, original 8192): the highest frequencies kept,
 * the lowest divided by 8, and one in the band interpolated. */
static void test_rope_inv_freq(void **state) {
    (void)state;
    const int d = 128;
    const double theta = 500000.0;
    for (int i = 0; i < d / 2; i++) {
        const double base = pow(theta, -2.0 * i / d);
        assert_true(fabs(zdp_nn_rope_inv_freq(i, d, theta, 0, 0, 0, 0, 0) - base) < 1e-15);
        assert_true(fabs(zdp_nn_rope_inv_freq(i, d, theta, 1, 4.0, 0, 0, 0) - base / 4.0) <
                    1e-15);
        const double f = zdp_nn_rope_inv_freq(i, d, theta, 2, 8.0, 1.0, 4.0, 8192);
        const double wl = 2.0 * 3.141592653589793 / base;
        double want;
        if (wl < 8192.0 / 4.0) want = base;
        else if (wl > 8192.0 / 1.0) want = base / 8.0;
        else {
            const double sm = (8192.0 / wl - 1.0) / (4.0 - 1.0);
            want = (1.0 - sm) * base / 8.0 + sm * base;
        }
        assert_true(fabs(f - want) <= 1e-15 * fabs(want));
    }
    /* All three regimes occur at these numbers. */
    assert_true(zdp_nn_rope_inv_freq(0, d, theta, 2, 8.0, 1.0, 4.0, 8192) == 1.0);
    const double lo = zdp_nn_rope_inv_freq(63, d, theta, 2, 8.0, 1.0, 4.0, 8192);
    assert_true(fabs(lo - pow(theta, -126.0 / d) / 8.0) < 1e-18);
    int medium = 0;
    for (int i = 0; i < d / 2; i++) {
        const double base = pow(theta, -2.0 * i / d);
        const double f = zdp_nn_rope_inv_freq(i, d, theta, 2, 8.0, 1.0, 4.0, 8192);
        medium += f < base * 0.999 && f > base / 8.0 * 1.001;
    }
    assert_true(medium > 0);
}

typedef struct rope_ctx {
    int64_t B, T, nh, hd;
    float *x, *out, *cos_t, *sin_t, *R;
} rope_ctx;

static double rope_obj_(void *v) {
    rope_ctx *c = v;
    zdp_nn_rope_forward(c->out, c->x, c->cos_t, c->sin_t, c->B, c->T, c->nh, c->hd);
    return dot_d_(c->out, c->R, c->B * c->T * c->nh * c->hd);
}

static void test_rope(void **state) {
    (void)state;
    uint64_t s = 2;
    const int64_t B = 2, T = 5, nh = 3, hd = 6, n = B * T * nh * hd;
    rope_ctx c = {.B = B, .T = T, .nh = nh, .hd = hd, .x = rand_vec_(n, 1.0f, &s),
                  .out = malloc(n * sizeof(float)), .cos_t = malloc(T * hd / 2 * sizeof(float)),
                  .sin_t = malloc(T * hd / 2 * sizeof(float)), .R = rand_vec_(n, 1.0f, &s)};
    zdp_nn_rope_tables(c.cos_t, c.sin_t, (int)T, (int)hd, 10000.0, 0, 0, 0, 0, 0);
    rope_obj_(&c);
    /* Forward: position t, pair (i, i + hd/2) rotated by t * inv_freq[i]. */
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++)
            for (int64_t h = 0; h < nh; h++)
                for (int64_t i = 0; i < hd / 2; i++) {
                    const int64_t o = ((b * T + t) * nh + h) * hd;
                    const double a = (double)t * pow(10000.0, -2.0 * i / hd);
                    const double x1 = c.x[o + i], x2 = c.x[o + i + hd / 2];
                    assert_true(fabs(c.out[o + i] - (x1 * cos(a) - x2 * sin(a))) < 1e-5);
                    assert_true(fabs(c.out[o + i + hd / 2] - (x2 * cos(a) + x1 * sin(a))) < 1e-5);
                }
    float *dx = malloc(n * sizeof(float));
    zdp_nn_rope_backward(dx, c.R, c.cos_t, c.sin_t, B, T, nh, hd);
    fd_check_("rope dx", c.x, dx, n, rope_obj_, &c, 1e-2f, 1e-2, 1e-4, 0);
    /* In place (the model rotates its q and k buffers in place). */
    rope_obj_(&c); /* c.out as of the unperturbed x */
    float *y = malloc(n * sizeof(float));
    memcpy(y, c.x, n * sizeof(float));
    zdp_nn_rope_forward(y, y, c.cos_t, c.sin_t, B, T, nh, hd);
    assert_memory_equal(y, c.out, n * sizeof(float));
    free(c.x), free(c.out), free(c.cos_t), free(c.sin_t), free(c.R), free(dx), free(y);
}

/* ---- grouped-query attention --------------------------------------------------------- */

typedef struct attn_ctx {
    int64_t B, T, NH, KV, hd;
    float *q, *k, *v, *out, *att, *R;
} attn_ctx;

static double attn_obj_(void *p) {
    attn_ctx *c = p;
    zdp_nn_gqa_attention_forward(c->out, c->att, c->q, c->k, c->v, c->B, c->T, c->NH, c->KV,
                                 c->hd);
    return dot_d_(c->out, c->R, c->B * c->T * c->NH * c->hd);
}

static void check_gqa_(int64_t B, int64_t T, int64_t NH, int64_t KV, int64_t hd,
                       int64_t sample) {
    uint64_t s = 3 + (uint64_t)T;
    const int64_t nq = B * T * NH * hd, nk = B * T * KV * hd;
    attn_ctx c = {.B = B, .T = T, .NH = NH, .KV = KV, .hd = hd, .q = rand_vec_(nq, 1.0f, &s),
                  .k = rand_vec_(nk, 1.0f, &s), .v = rand_vec_(nk, 1.0f, &s),
                  .out = malloc(nq * sizeof(float)),
                  .att = malloc(B * NH * T * T * sizeof(float)), .R = rand_vec_(nq, 1.0f, &s)};
    attn_obj_(&c);
    /* Forward against a double reference with KV head h / (NH / KV). */
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < NH; h++)
            for (int64_t t = 0; t < T; t++) {
                const int64_t g = h / (NH / KV);
                double w[300], mx = -1e300, sum = 0.0;
                for (int64_t u = 0; u <= t; u++) {
                    double d = 0.0;
                    for (int64_t i = 0; i < hd; i++)
                        d += (double)c.q[((b * T + t) * NH + h) * hd + i] *
                             c.k[((b * T + u) * KV + g) * hd + i];
                    w[u] = d / sqrt((double)hd);
                    mx = fmax(mx, w[u]);
                }
                for (int64_t u = 0; u <= t; u++) sum += (w[u] = exp(w[u] - mx));
                for (int64_t i = 0; i < hd; i++) {
                    double o = 0.0;
                    for (int64_t u = 0; u <= t; u++)
                        o += w[u] / sum * c.v[((b * T + u) * KV + g) * hd + i];
                    assert_true(fabs(c.out[((b * T + t) * NH + h) * hd + i] - o) < 1e-5);
                }
            }
    float *dq = malloc(nq * sizeof(float)), *dk = malloc(nk * sizeof(float));
    float *dv = malloc(nk * sizeof(float));
    float *scratch = malloc((size_t)zdp_pool_size() * T * T * sizeof(float));
    /* Garbage in the outputs: the backward overwrites them. */
    for (int64_t i = 0; i < nq; i++) dq[i] = 7.0f;
    for (int64_t i = 0; i < nk; i++) dk[i] = dv[i] = 7.0f;
    zdp_nn_gqa_attention_backward(dq, dk, dv, scratch, c.R, c.q, c.k, c.v, c.att, B, T, NH, KV,
                                  hd);
    fd_check_("gqa dq", c.q, dq, nq, attn_obj_, &c, 1e-2f, 1e-2, 1e-4, sample);
    fd_check_("gqa dk", c.k, dk, nk, attn_obj_, &c, 1e-2f, 1e-2, 1e-4, sample);
    fd_check_("gqa dv", c.v, dv, nk, attn_obj_, &c, 1e-2f, 1e-2, 1e-4, sample);
    free(c.q), free(c.k), free(c.v), free(c.out), free(c.att), free(c.R);
    free(dq), free(dk), free(dv), free(scratch);
}

static void test_gqa_attention(void **state) {
    (void)state;
    check_gqa_(2, 5, 4, 2, 3, 0); /* groups of 2, odd head_dim is fine here */
    check_gqa_(1, 4, 3, 3, 4, 0); /* plain multi-head */
    check_gqa_(1, 6, 2, 1, 2, 0); /* multi-query */
}

static void test_gqa_attention_blocks(void **state) {
    (void)state;
    check_gqa_(1, 2 * ZDP_NN_ATTN_BLOCK + 7, 2, 1, 4, 80);
}

/* Attention's products at SmolLM2's head size (64), through zdp's GEMM (mode
 * 2 gives zdp_nn_gemm_1_ every one) and through cblas_sgemm (mode 0): both
 * routes pass the same checks whichever the rule picks. */
static void test_gqa_attention_gemm_routes(void **state) {
    (void)state;
    const int was = zdp_nn_gemm_mode();
    for (int mode = 0; mode <= 2; mode += 2) {
        zdp_nn_gemm_use_mode(mode);
        check_gqa_(1, 2 * ZDP_NN_ATTN_BLOCK + 7, 3, 1, 64, 60);
    }
    zdp_nn_gemm_use_mode(was);
}

/* ---- SwiGLU and token embedding ------------------------------------------------------ */

typedef struct swiglu_ctx {
    int64_t N;
    float *g, *u, *out, *R;
} swiglu_ctx;

static double swiglu_obj_(void *v) {
    swiglu_ctx *c = v;
    zdp_nn_swiglu_forward(c->out, c->g, c->u, c->N);
    return dot_d_(c->out, c->R, c->N);
}

static void test_swiglu(void **state) {
    (void)state;
    uint64_t s = 4;
    const int64_t N = 40;
    swiglu_ctx c = {.N = N, .g = rand_vec_(N, 4.0f, &s), .u = rand_vec_(N, 2.0f, &s),
                    .out = malloc(N * sizeof(float)), .R = rand_vec_(N, 1.0f, &s)};
    swiglu_obj_(&c);
    for (int64_t i = 0; i < N; i++)
        assert_true(fabs(c.out[i] - c.g[i] / (1.0 + exp(-(double)c.g[i])) * c.u[i]) < 1e-5);
    float *dg = malloc(N * sizeof(float)), *du = malloc(N * sizeof(float));
    zdp_nn_swiglu_backward(dg, du, c.R, c.g, c.u, N);
    fd_check_("swiglu dgate", c.g, dg, N, swiglu_obj_, &c, 1e-2f, 1e-2, 1e-4, 0);
    fd_check_("swiglu dup", c.u, du, N, swiglu_obj_, &c, 1e-2f, 1e-2, 1e-4, 0);
    /* dgate may alias dout. */
    float *d2 = malloc(N * sizeof(float)), *du2 = malloc(N * sizeof(float));
    memcpy(d2, c.R, N * sizeof(float));
    zdp_nn_swiglu_backward(d2, du2, d2, c.g, c.u, N);
    assert_memory_equal(d2, dg, N * sizeof(float));
    assert_memory_equal(du2, du, N * sizeof(float));
    free(c.g), free(c.u), free(c.out), free(c.R), free(dg), free(du), free(d2), free(du2);
}

static void test_token_embedding(void **state) {
    (void)state;
    uint64_t s = 5;
    const int64_t V = 7, C = 3, N = 6;
    const int32_t ids[6] = {3, 0, 3, 6, 1, 3};
    float *wte = rand_vec_(V * C, 1.0f, &s), *out = malloc(N * C * sizeof(float));
    float *dout = rand_vec_(N * C, 1.0f, &s), *dwte = calloc(V * C, sizeof(float));
    zdp_nn_token_embedding_forward(out, ids, wte, N, C);
    for (int64_t n = 0; n < N; n++) assert_memory_equal(out + n * C, wte + ids[n] * C, C * 4);
    dwte[0] = 1.0f; /* ADDS */
    zdp_nn_token_embedding_backward(dwte, dout, ids, N, C);
    for (int64_t v = 0; v < V; v++)
        for (int64_t k = 0; k < C; k++) {
            double want = v == 0 && k == 0 ? 1.0 : 0.0;
            for (int64_t n = 0; n < N; n++)
                if (ids[n] == v) want += dout[n * C + k];
            assert_true(fabs(dwte[v * C + k] - want) < 1e-6);
        }
    free(wte), free(out), free(dout), free(dwte);
}

/* ---- the model: registration ------------------------------------------------------------ */

static zdp_llama_config tiny_llama_(void) {
    return (zdp_llama_config){.arch = ZDP_ARCH_LLAMA, .n_layer = 2, .hidden = 8, .n_head = 4,
                              .n_kv_head = 2, .head_dim = 2, .ffn = 12, .vocab_size = 11,
                              .block_size = 6, .max_position_embeddings = 32,
                              .rms_norm_eps = 1e-5f, .rope_theta = 10000.0,
                              .initializer_range = 0.02};
}

static zdp_llama_config tiny_qwen3_(void) {
    zdp_llama_config c = tiny_llama_();
    c.arch = ZDP_ARCH_QWEN3;
    c.qk_norm = 1;
    c.head_dim = 6; /* != hidden / n_head = 2 */
    c.tie_word_embeddings = 1;
    c.rms_norm_eps = 1e-6f;
    c.rope_theta = 1000000.0;
    return c;
}

typedef struct want_param {
    const char *name;
    int64_t s0, s1;
} want_param;

static void check_params_(const zdp_llama_config *cfg, const want_param *want, int n) {
    zdp_model m;
    zdp_error err;
    if (zdp_llama_create(cfg, 2, &m, &err) != ZDP_OK) fail_msg("%s", err.msg);
    assert_int_equal(m.n_params, n);
    for (int i = 0; i < n; i++) {
        if (strcmp(m.params[i].name, want[i].name) != 0)
            fail_msg("tensor %d: %s, want %s", i, m.params[i].name, want[i].name);
        assert_int_equal(m.params[i].ndim, want[i].s1 > 0 ? 2 : 1);
        assert_int_equal(m.params[i].shape[0], want[i].s0);
        if (want[i].s1 > 0) assert_int_equal(m.params[i].shape[1], want[i].s1);
    }
    assert_non_null(m.lm);
    assert_int_equal(m.vocab_size, cfg->vocab_size);
    assert_int_equal(m.block_size, cfg->block_size);
    assert_int_equal(zdp_llama_config_of(&m)->n_kv_head, cfg->n_kv_head);
    /* Activation bytes: at least every layer's kept arrays for max_batch (2)
     * x block_size rows, at most that plus the per-step scratch and padding. */
    {
        const int64_t BT = 2 * (int64_t)cfg->block_size, L = cfg->n_layer, H = cfg->hidden;
        const int64_t QD = (int64_t)cfg->n_head * cfg->head_dim;
        const int64_t KD = (int64_t)cfg->n_kv_head * cfg->head_dim, F = cfg->ffn;
        const int64_t kept = L * BT * (5 * H + 3 * QD + 3 * KD + 3 * F + 2 +
                                       (int64_t)cfg->n_head * cfg->block_size) +
                             BT * ((int64_t)cfg->vocab_size + H);
        const int64_t scratch = BT * (2 * H + 4 * QD + 4 * KD + 2 * F) +
                                (int64_t)cfg->block_size * (cfg->block_size + cfg->head_dim) +
                                L * BT * (cfg->n_head + cfg->n_kv_head) + 40 * 16;
        assert_true(m.activation_bytes >= 4 * kept);
        assert_true(m.activation_bytes <= 4 * (kept + scratch));
    }
    zdp_llama_destroy(&m);
}

static void test_register_llama(void **state) {
    (void)state;
    /* Untied, no biases, no q/k norm; one layer spelled out and the second's
     * first and last tensor. */
    zdp_llama_config c = tiny_llama_();
    const want_param want[] = {
        {"model.embed_tokens.weight", 11, 8},
        {"model.layers.0.input_layernorm.weight", 8, 0},
        {"model.layers.0.self_attn.q_proj.weight", 8, 8},
        {"model.layers.0.self_attn.k_proj.weight", 4, 8},
        {"model.layers.0.self_attn.v_proj.weight", 4, 8},
        {"model.layers.0.self_attn.o_proj.weight", 8, 8},
        {"model.layers.0.post_attention_layernorm.weight", 8, 0},
        {"model.layers.0.mlp.gate_proj.weight", 12, 8},
        {"model.layers.0.mlp.up_proj.weight", 12, 8},
        {"model.layers.0.mlp.down_proj.weight", 8, 12},
        {"model.layers.1.input_layernorm.weight", 8, 0},
        {"model.layers.1.self_attn.q_proj.weight", 8, 8},
        {"model.layers.1.self_attn.k_proj.weight", 4, 8},
        {"model.layers.1.self_attn.v_proj.weight", 4, 8},
        {"model.layers.1.self_attn.o_proj.weight", 8, 8},
        {"model.layers.1.post_attention_layernorm.weight", 8, 0},
        {"model.layers.1.mlp.gate_proj.weight", 12, 8},
        {"model.layers.1.mlp.up_proj.weight", 12, 8},
        {"model.layers.1.mlp.down_proj.weight", 8, 12},
        {"model.norm.weight", 8, 0},
        {"lm_head.weight", 11, 8},
    };
    check_params_(&c, want, (int)(sizeof want / sizeof want[0]));
}

static void test_register_qwen3_bias(void **state) {
    (void)state;
    /* Tied (no lm_head), biases, q/k norm of head_dim; one layer. */
    zdp_llama_config c = tiny_qwen3_();
    c.n_layer = 1;
    c.attention_bias = 1;
    const want_param want[] = {
        {"model.embed_tokens.weight", 11, 8},
        {"model.layers.0.input_layernorm.weight", 8, 0},
        {"model.layers.0.self_attn.q_proj.weight", 24, 8},
        {"model.layers.0.self_attn.q_proj.bias", 24, 0},
        {"model.layers.0.self_attn.k_proj.weight", 12, 8},
        {"model.layers.0.self_attn.k_proj.bias", 12, 0},
        {"model.layers.0.self_attn.v_proj.weight", 12, 8},
        {"model.layers.0.self_attn.v_proj.bias", 12, 0},
        {"model.layers.0.self_attn.o_proj.weight", 8, 24},
        {"model.layers.0.self_attn.o_proj.bias", 8, 0},
        {"model.layers.0.self_attn.q_norm.weight", 6, 0},
        {"model.layers.0.self_attn.k_norm.weight", 6, 0},
        {"model.layers.0.post_attention_layernorm.weight", 8, 0},
        {"model.layers.0.mlp.gate_proj.weight", 12, 8},
        {"model.layers.0.mlp.up_proj.weight", 12, 8},
        {"model.layers.0.mlp.down_proj.weight", 8, 12},
        {"model.norm.weight", 8, 0},
    };
    check_params_(&c, want, (int)(sizeof want / sizeof want[0]));
}

static void test_shape_json(void **state) {
    (void)state;
    zdp_llama_config c = tiny_qwen3_();
    zdp_model m;
    zdp_error err;
    assert_int_equal(zdp_llama_create(&c, 1, &m, &err), ZDP_OK);
    assert_string_equal(m.shape_json,
                        "{\"model\":\"qwen3\",\"n_layer\":2,\"hidden\":8,\"n_head\":4,"
                        "\"n_kv_head\":2,\"head_dim\":6,\"ffn\":12,\"vocab_size\":11,"
                        "\"block_size\":6,\"qk_norm\":1,\"attention_bias\":0,"
                        "\"tie_word_embeddings\":1}");
    assert_null(zdp_gpt_config_of(&m));
    zdp_llama_destroy(&m);
    zdp_llama_destroy(&m); /* a second destroy is a no-op */
}

/* Each bad field is refused naming it. */
static void test_create_errors(void **state) {
    (void)state;
    zdp_model m;
    zdp_error err;
    const zdp_llama_config good = tiny_llama_();
#define BAD_(field, stmt, needle)                                                        \
    do {                                                                                 \
        zdp_llama_config c = good;                                                       \
        stmt;                                                                            \
        memset(&err, 0, sizeof err);                                                     \
        assert_int_equal(zdp_llama_create(&c, 2, &m, &err), ZDP_ERR_INVALID_ARG);        \
        if (strstr(err.msg, needle) == NULL)                                             \
            fail_msg("%s: message '%s' does not name '%s'", field, err.msg, needle);     \
        assert_null(m.self);                                                             \
    } while (0)
    BAD_("arch", c.arch = 7, "arch = 7");
    BAD_("n_layer", c.n_layer = 0, "n_layer = 0");
    BAD_("hidden", c.hidden = -1, "hidden = -1");
    BAD_("n_head", c.n_head = 0, "n_head = 0");
    BAD_("n_kv_head", c.n_kv_head = 3, "n_kv_head = 3: must divide n_head = 4");
    BAD_("n_kv_head", c.n_kv_head = 8, "n_kv_head = 8");
    BAD_("head_dim", c.head_dim = 3, "head_dim = 3: must be even");
    BAD_("head_dim", c.head_dim = 0, "head_dim = 0");
    BAD_("ffn", c.ffn = 0, "ffn = 0");
    BAD_("vocab_size", c.vocab_size = 0, "vocab_size = 0");
    BAD_("block_size", c.block_size = 33, "block_size = 33");
    BAD_("max_position_embeddings", c.max_position_embeddings = 0, "max_position_embeddings = 0");
    BAD_("rms_norm_eps", c.rms_norm_eps = 0.0f, "rms_norm_eps = 0");
    BAD_("rms_norm_eps", c.rms_norm_eps = NAN, "rms_norm_eps = nan");
    BAD_("rope_theta", c.rope_theta = -1.0, "rope_theta = -1");
    BAD_("rope_type", c.rope_type = (zdp_rope_type)9, "rope_type = 9");
    BAD_("rope_factor", (c.rope_type = ZDP_ROPE_LINEAR, c.rope_factor = 0.0), "rope_factor = 0");
    BAD_("rope_low_freq_factor",
         (c.rope_type = ZDP_ROPE_LLAMA3, c.rope_factor = 8.0, c.rope_high_freq_factor = 4.0,
          c.rope_original_max_position = 8192),
         "rope_low_freq_factor = 0");
    BAD_("rope_high_freq_factor",
         (c.rope_type = ZDP_ROPE_LLAMA3, c.rope_factor = 8.0, c.rope_low_freq_factor = 4.0,
          c.rope_high_freq_factor = 4.0, c.rope_original_max_position = 8192),
         "rope_high_freq_factor = 4");
    BAD_("rope_original_max_position",
         (c.rope_type = ZDP_ROPE_LLAMA3, c.rope_factor = 8.0, c.rope_low_freq_factor = 1.0,
          c.rope_high_freq_factor = 4.0),
         "rope_original_max_position = 0");
    BAD_("qk_norm", c.qk_norm = 1, "qk_norm = 1 with arch llama");
    BAD_("qk_norm", c.arch = ZDP_ARCH_QWEN3, "qk_norm = 0 with arch qwen3");
    BAD_("attention_bias", c.attention_bias = 2, "attention_bias = 2");
    BAD_("tie_word_embeddings", c.tie_word_embeddings = -1, "tie_word_embeddings = -1");
    BAD_("initializer_range", c.initializer_range = -0.1, "initializer_range = -0.1");
#undef BAD_
    zdp_llama_config c = good;
    assert_int_equal(zdp_llama_create(&c, 0, &m, &err), ZDP_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "max_batch = 0"));
    assert_int_equal(zdp_llama_create(NULL, 1, &m, &err), ZDP_ERR_INVALID_ARG);
}

/* transformers' init: weights N(0, initializer_range), biases 0, norms 1; seeded. */
static void test_init_params(void **state) {
    (void)state;
    zdp_llama_config c = tiny_qwen3_();
    c.attention_bias = 1;
    c.initializer_range = 0.5;
    c.hidden = 32;
    c.vocab_size = 64;
    zdp_model m;
    zdp_error err;
    assert_int_equal(zdp_llama_create(&c, 1, &m, &err), ZDP_OK);
    float **p = calloc((size_t)m.n_params, sizeof *p), **p2 = calloc((size_t)m.n_params, sizeof *p);
    for (int i = 0; i < m.n_params; i++) {
        const int64_t n = m.params[i].shape[0] * (m.params[i].ndim == 2 ? m.params[i].shape[1] : 1);
        p[i] = malloc((size_t)n * sizeof(float));
        p2[i] = malloc((size_t)n * sizeof(float));
    }
    zdp_llama_init_params(&m, p, 7);
    zdp_llama_init_params(&m, p2, 7);
    for (int i = 0; i < m.n_params; i++) {
        const zdp_param_info *pi = &m.params[i];
        const int64_t n = pi->shape[0] * (pi->ndim == 2 ? pi->shape[1] : 1);
        assert_memory_equal(p[i], p2[i], (size_t)n * sizeof(float));
        if (strstr(pi->name, "norm") != NULL) {
            for (int64_t k = 0; k < n; k++) assert_true(p[i][k] == 1.0f);
        } else if (strstr(pi->name, "bias") != NULL) {
            for (int64_t k = 0; k < n; k++) assert_true(p[i][k] == 0.0f);
        } else {
            double ss = 0.0;
            for (int64_t k = 0; k < n; k++) ss += (double)p[i][k] * p[i][k];
            const double sd = sqrt(ss / n);
            if (fabs(sd - 0.5) > 0.5 * 4.0 / sqrt((double)n))
                fail_msg("%s: std %.4f, want 0.5", pi->name, sd);
        }
    }
    for (int i = 0; i < m.n_params; i++) free(p[i]), free(p2[i]);
    free(p), free(p2);
    zdp_llama_destroy(&m);
}

/* ---- the model: gradients ------------------------------------------------------------------ */

/* A tiny model with parameters well above transformers' init (so gradients
 * are far above the finite-difference noise) and random data. */
static void fx_init_(model_fx *f, zdp_llama_config cfg, int max_batch, int B, int T,
                     uint64_t seed) {
    memset(f, 0, sizeof *f);
    cfg.initializer_range = 0.3;
    zdp_error err;
    if (zdp_llama_create(&cfg, max_batch, &f->m, &err) != ZDP_OK) fail_msg("%s", err.msg);
    fx_alloc_(f);
    const int np = f->m.n_params;
    zdp_llama_init_params(&f->m, f->p, seed);
    uint64_t s = seed;
    /* Norm weights and biases away from 1 and 0, so their gradients and
     * their effect on the others are tested too. */
    for (int i = 0; i < np; i++)
        if (f->m.params[i].ndim == 1)
            for (int64_t k = 0; k < f->numel[i]; k++) f->p[i][k] += 0.3f * uniform_(&s);
    /* Embedding rows of norm ~3 rather than ~1: RMSNorm's curvature at the
     * input goes as 1/|x|^2, and the central difference's truncation error
     * with it. */
    for (int64_t k = 0; k < f->numel[0]; k++) f->p[0][k] *= 3.0f;
    fx_tokens_(f, B, T, cfg.vocab_size, &s);
}

/* Every parameter tensor (all elements, or `sample` of each) against finite
 * differences of the loss; each tensor's gradient must be non-trivial. */
static void check_model_fd_(zdp_llama_config cfg, int B, int T, int64_t sample) {
    model_fx f;
    fx_init_(&f, cfg, B + 1, B, T, 11);
    const float dloss = 0.5f; /* checks the scaling too */
    fx_grad_(&f, dloss);
    loss_ctx c = {.f = &f, .scale = dloss};
    /* A step of 3e-3: these tiny widths make the loss curve sharply (the
     * truncation error of a 1e-2 step reaches 3e-4), while the float noise
     * of the loss, ~3e-7, stays ~5e-5 after dividing by the step. */
    for (int i = 0; i < f.m.n_params; i++) {
        fd_check_(f.m.params[i].name, f.p[i], f.g[i], f.numel[i], model_obj_, &c, 3e-3f, 2e-2,
                  1e-4, sample);
        if (!(max_abs_(f.g[i], f.numel[i]) > 1e-4))
            fail_msg("%s: gradient %.3g is too small to test", f.m.params[i].name,
                     max_abs_(f.g[i], f.numel[i]));
    }
    fx_free_(&f);
}

static void test_model_fd_llama(void **state) {
    (void)state;
    check_model_fd_(tiny_llama_(), 2, 5, 0); /* GQA 4/2, untied */
}

static void test_model_fd_qwen3(void **state) {
    (void)state;
    check_model_fd_(tiny_qwen3_(), 2, 5, 0); /* q/k norm, head_dim 6 != 8/4, tied */
}

static void test_model_fd_bias_llama3(void **state) {
    (void)state;
    zdp_llama_config c = tiny_llama_();
    c.attention_bias = 1;
    c.head_dim = 4;
    c.rope_type = ZDP_ROPE_LLAMA3;
    c.rope_factor = 8.0;
    c.rope_low_freq_factor = 1.0;
    c.rope_high_freq_factor = 4.0;
    c.rope_original_max_position = 16;
    c.rope_theta = 50.0; /* wavelengths across all three llama3 bands at original 16 */
    check_model_fd_(c, 2, 6, 0);
    c.arch = ZDP_ARCH_QWEN3;
    c.qk_norm = 1;
    c.rope_type = ZDP_ROPE_LINEAR;
    c.rope_factor = 2.0;
    check_model_fd_(c, 1, 6, 0);
}

/* Sequences over two attention row blocks, a sample of each tensor. */
static void test_model_fd_long(void **state) {
    (void)state;
    zdp_llama_config c = tiny_qwen3_();
    c.n_layer = 1;
    c.block_size = ZDP_NN_ATTN_BLOCK + 9;
    c.max_position_embeddings = 4096;
    check_model_fd_(c, 1, ZDP_NN_ATTN_BLOCK + 9, 40);
}

/* The tied embed_tokens gets both contributions, and they add. */
static void test_backward_adds(void **state) {
    (void)state;
    model_fx f;
    fx_init_(&f, tiny_qwen3_(), 2, 2, 5, 3);
    fx_grad_(&f, 1.0f);
    float **g1 = calloc((size_t)f.m.n_params, sizeof *g1);
    for (int i = 0; i < f.m.n_params; i++) {
        g1[i] = malloc((size_t)f.numel[i] * sizeof(float));
        memcpy(g1[i], f.g[i], (size_t)f.numel[i] * sizeof(float));
    }
    /* A second forward and a backward with dloss 0.5 into the same buffers. */
    float loss;
    zdp_error err;
    assert_int_equal(zdp_model_forward_dense(&f.m, (const float *const *)f.p, &f.batch, &loss, &err),
                     ZDP_OK);
    zdp_grad_sink *sink = zdp_grad_sink_create_dense(f.g, f.m.n_params);
    assert_int_equal(zdp_model_backward_dense(&f.m, (const float *const *)f.p, 0.5f, sink, &err),
                     ZDP_OK);
    free(sink);
    for (int i = 0; i < f.m.n_params; i++)
        for (int64_t k = 0; k < f.numel[i]; k++)
            assert_true(fabs(f.g[i][k] - 1.5f * g1[i][k]) <= 1e-5 + 1e-4 * fabs(g1[i][k]));
    /* A backward without a forward is refused. */
    sink = zdp_grad_sink_create_dense(f.g, f.m.n_params);
    assert_int_equal(zdp_model_backward_dense(&f.m, (const float *const *)f.p, 1.0f, sink, &err),
                     ZDP_ERR_STATE);
    free(sink);
    for (int i = 0; i < f.m.n_params; i++) free(g1[i]);
    free(g1);
    fx_free_(&f);
}

/* next_logits of a prefix equals the full forward's logits at its last
 * position: compared through the logprobs of every target. */
static void test_next_logits(void **state) {
    (void)state;
    zdp_llama_config c = tiny_llama_();
    c.vocab_size = 5;
    model_fx f;
    fx_init_(&f, c, 1, 1, 6, 9);
    float lp[5][6], logits[5];
    const int T = 6;
    for (int v = 0; v < 5; v++) {
        for (int t = 0; t < T; t++) f.targets[t] = v;
        f.batch.logprobs = lp[v];
        float loss;
        zdp_error err;
        assert_int_equal(
            zdp_model_forward_dense(&f.m, (const float *const *)f.p, &f.batch, &loss, &err), ZDP_OK);
    }
    for (int t = 1; t <= T; t++) {
        zdp_error err;
        assert_int_equal(zdp_lm_next_logits(&f.m, (const float *const *)f.p, f.inputs, t, logits,
                                            &err),
                         ZDP_OK);
        double mx = -1e300, s = 0.0;
        for (int v = 0; v < 5; v++) mx = fmax(mx, logits[v]);
        for (int v = 0; v < 5; v++) s += exp(logits[v] - mx);
        for (int v = 0; v < 5; v++)
            assert_true(fabs((logits[v] - mx - log(s)) - lp[v][t - 1]) < 2e-5);
    }
    f.batch.logprobs = NULL;
    fx_free_(&f);
}

/* Weights scale each position's loss; set_loss_weights replaces them before
 * backward (the gradient then equals a forward run with those weights). */
static void test_weights(void **state) {
    (void)state;
    model_fx f;
    fx_init_(&f, tiny_llama_(), 2, 2, 4, 5);
    const int N = 8;
    float w[8] = {1, 0, 2, 0.5f, -1, 1, 0, 3};
    float lp[8];
    f.batch.logprobs = lp;
    float loss_plain = fx_grad_(&f, 1.0f);
    f.weights = malloc(N * sizeof(float));
    memcpy(f.weights, w, sizeof w);
    f.batch.weights = f.weights;
    float loss_w = fx_grad_(&f, 1.0f);
    double want = 0.0, plain = 0.0;
    for (int n = 0; n < N; n++) want += -w[n] * lp[n] / N, plain += -lp[n] / N;
    assert_true(fabs(loss_w - want) < 1e-5);
    assert_true(fabs(loss_plain - plain) < 1e-5);
    float **gw = calloc((size_t)f.m.n_params, sizeof *gw);
    for (int i = 0; i < f.m.n_params; i++) {
        gw[i] = malloc((size_t)f.numel[i] * sizeof(float));
        memcpy(gw[i], f.g[i], (size_t)f.numel[i] * sizeof(float));
    }
    /* Unweighted forward, then the weights set before backward. */
    f.batch.weights = NULL;
    for (int i = 0; i < f.m.n_params; i++) memset(f.g[i], 0, (size_t)f.numel[i] * sizeof(float));
    float loss;
    zdp_error err;
    assert_int_equal(zdp_model_forward_dense(&f.m, (const float *const *)f.p, &f.batch, &loss, &err),
                     ZDP_OK);
    assert_int_equal(zdp_lm_set_loss_weights(&f.m, w, 7, &err), ZDP_ERR_INVALID_ARG);
    float bad[8] = {0, 0, NAN, 0, 0, 0, 0, 0};
    assert_int_equal(zdp_lm_set_loss_weights(&f.m, bad, 8, &err), ZDP_ERR_INVALID_ARG);
    assert_int_equal(zdp_lm_set_loss_weights(&f.m, w, 8, &err), ZDP_OK);
    zdp_grad_sink *sink = zdp_grad_sink_create_dense(f.g, f.m.n_params);
    assert_int_equal(zdp_model_backward_dense(&f.m, (const float *const *)f.p, 1.0f, sink, &err),
                     ZDP_OK);
    free(sink);
    for (int i = 0; i < f.m.n_params; i++) {
        for (int64_t k = 0; k < f.numel[i]; k++)
            assert_true(fabs(f.g[i][k] - gw[i][k]) <= 1e-6 + 1e-5 * fabs(gw[i][k]));
        free(gw[i]);
    }
    free(gw);
    assert_int_equal(zdp_lm_set_loss_weights(&f.m, w, 8, &err), ZDP_ERR_STATE);
    fx_free_(&f);
}

static void test_forward_errors(void **state) {
    (void)state;
    model_fx f;
    fx_init_(&f, tiny_llama_(), 2, 2, 4, 5);
    float loss;
    zdp_error err;
    const float *const *P = (const float *const *)f.p;
    f.inputs[5] = 11;
    assert_int_equal(zdp_model_forward_dense(&f.m, P, &f.batch, &loss, &err), ZDP_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "inputs[1][1] = 11"));
    f.inputs[5] = 0;
    f.targets[0] = -1;
    assert_int_equal(zdp_model_forward_dense(&f.m, P, &f.batch, &loss, &err), ZDP_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "targets[0][0] = -1"));
    f.targets[0] = 0;
    f.batch.T = 7;
    assert_int_equal(zdp_model_forward_dense(&f.m, P, &f.batch, &loss, &err), ZDP_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "batch->T = 7"));
    f.batch.T = 4;
    f.batch.B = 3;
    assert_int_equal(zdp_model_forward_dense(&f.m, P, &f.batch, &loss, &err), ZDP_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "batch->B = 3"));
    f.batch.B = 2;
    int32_t bad[2] = {0, 12};
    float logits[11];
    assert_int_equal(zdp_lm_next_logits(&f.m, P, bad, 2, logits, &err), ZDP_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "tokens[0][1] = 12"));
    fx_free_(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rmsnorm),          cmocka_unit_test(test_rope_inv_freq),
        cmocka_unit_test(test_rope),             cmocka_unit_test(test_gqa_attention),
        cmocka_unit_test(test_gqa_attention_blocks),
        cmocka_unit_test(test_gqa_attention_gemm_routes), cmocka_unit_test(test_swiglu),
        cmocka_unit_test(test_token_embedding),  cmocka_unit_test(test_register_llama),
        cmocka_unit_test(test_register_qwen3_bias), cmocka_unit_test(test_shape_json),
        cmocka_unit_test(test_create_errors),    cmocka_unit_test(test_init_params),
        cmocka_unit_test(test_model_fd_llama),   cmocka_unit_test(test_model_fd_qwen3),
        cmocka_unit_test(test_model_fd_bias_llama3), cmocka_unit_test(test_model_fd_long),
        cmocka_unit_test(test_backward_adds),    cmocka_unit_test(test_next_logits),
        cmocka_unit_test(test_weights),          cmocka_unit_test(test_forward_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
