/*
 * test_gpt.c -- the GPT-2 kernels and model: a finite-difference gradient
 * check for every kernel on its own (embedding, layernorm, matmul, attention
 * over several row blocks, gelu, residual, lm_head + cross-entropy) and for
 * the whole model (every parameter element of a tiny config), the tied wte
 * (lm_head and embedding contributions both present and both right), forward
 * values against double-precision references, input validation, and
 * next_logits against the full forward.
 *
 * Finite differences run in float, as the kernels do, with the step that was
 * actually taken ((float)(x + h) - x) and a central difference; objectives are
 * sum(out * R) for a fixed random R (so dout = R), summed in double.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/unit_lm.h"
#include "engine/engine.h"
#include "nn/gemm.h"
#include "nn/nn.h"
#include "zdp/zdp.h"

/* ---- helpers ------------------------------------------------------------------ */

/* Gradient buffers that start non-zero: a backward that must ADD is checked
 * by subtracting the starting values, one that must overwrite by ignoring them. */
static float *garbage_(int64_t n, uint64_t *s) { return rand_vec_(n, 3.0f, s); }

static void sub_(float *g, const float *start, int64_t n) {
    for (int64_t i = 0; i < n; i++) g[i] -= start[i];
}

/* ---- layernorm ------------------------------------------------------------------- */

typedef struct ln_ctx {
    int64_t N, C;
    float *x, *w, *b, *out, *mean, *rstd, *R;
} ln_ctx;

static double ln_obj_(void *v) {
    ln_ctx *c = v;
    zdp_nn_layernorm_forward(c->out, c->mean, c->rstd, c->x, c->w, c->b, c->N, c->C);
    return dot_d_(c->out, c->R, c->N * c->C);
}

static void test_layernorm(void **state) {
    (void)state;
    uint64_t s = 1;
    enum { N = 3, C = 13 }; /* C: an 8-wide block plus a tail */
    ln_ctx c = {.N = N, .C = C};
    c.x = rand_vec_(N * C, 2.0f, &s);
    c.w = rand_vec_(C, 1.0f, &s);
    c.b = rand_vec_(C, 1.0f, &s);
    c.R = rand_vec_(N * C, 1.0f, &s);
    c.out = malloc(N * C * sizeof(float));
    c.mean = malloc(N * sizeof(float));
    c.rstd = malloc(N * sizeof(float));
    ln_obj_(&c);
    /* Forward against double precision. */
    for (int n = 0; n < N; n++) {
        double m = 0, v = 0;
        for (int k = 0; k < C; k++) m += c.x[n * C + k];
        m /= C;
        for (int k = 0; k < C; k++) v += (c.x[n * C + k] - m) * (c.x[n * C + k] - m);
        v /= C;
        for (int k = 0; k < C; k++) {
            double want = (c.x[n * C + k] - m) / sqrt(v + 1e-5) * c.w[k] + c.b[k];
            assert_true(fabs(want - c.out[n * C + k]) < 1e-5);
        }
    }
    float *dx0 = garbage_(N * C, &s), *dw0 = garbage_(C, &s), *db0 = garbage_(C, &s);
    float dx[N * C], dw[C], db[C];
    memcpy(dx, dx0, sizeof dx);
    memcpy(dw, dw0, sizeof dw);
    memcpy(db, db0, sizeof db);
    zdp_nn_layernorm_backward(dx, dw, db, c.R, c.x, c.w, c.mean, c.rstd, N, C);
    sub_(dx, dx0, N * C); /* all three ADD */
    sub_(dw, dw0, C);
    sub_(db, db0, C);
    fd_check_("layernorm dinp", c.x, dx, N * C, ln_obj_, &c, 1e-2f, 5e-3, 1e-4, 0);
    fd_check_("layernorm dweight", c.w, dw, C, ln_obj_, &c, 1e-2f, 5e-3, 1e-4, 0);
    fd_check_("layernorm dbias", c.b, db, C, ln_obj_, &c, 1e-2f, 5e-3, 1e-4, 0);
    free(c.x), free(c.w), free(c.b), free(c.R), free(c.out), free(c.mean), free(c.rstd);
    free(dx0), free(dw0), free(db0);
}

/* ---- matmul (Conv1D layout) ----------------------------------------------------------- */

typedef struct mm_ctx {
    int64_t N, C, OC;
    float *x, *w, *b, *out, *R;
} mm_ctx;

static double mm_obj_(void *v) {
    mm_ctx *c = v;
    zdp_nn_matmul_forward(c->out, c->x, c->w, c->b, c->N, c->C, c->OC);
    return dot_d_(c->out, c->R, c->N * c->OC);
}

static void test_matmul(void **state) {
    (void)state;
    uint64_t s = 2;
    enum { N = 4, C = 5, OC = 7 };
    mm_ctx c = {.N = N, .C = C, .OC = OC};
    c.x = rand_vec_(N * C, 1.0f, &s);
    c.w = rand_vec_(C * OC, 1.0f, &s);
    c.b = rand_vec_(OC, 1.0f, &s);
    c.R = rand_vec_(N * OC, 1.0f, &s);
    c.out = garbage_(N * OC, &s); /* forward overwrites */
    mm_obj_(&c);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double r = c.b[o];
            for (int k = 0; k < C; k++) r += (double)c.x[n * C + k] * c.w[k * OC + o];
            assert_true(fabs(r - c.out[n * OC + o]) < 1e-5);
        }
    float *dw0 = garbage_(C * OC, &s), *db0 = garbage_(OC, &s), *dx = garbage_(N * C, &s);
    float dw[C * OC], db[OC];
    memcpy(dw, dw0, sizeof dw);
    memcpy(db, db0, sizeof db);
    zdp_nn_matmul_backward(dx, dw, db, c.R, c.x, c.w, N, C, OC);
    sub_(dw, dw0, C * OC);
    sub_(db, db0, OC);
    fd_check_("matmul dinp", c.x, dx, N * C, mm_obj_, &c, 1e-2f, 1e-3, 1e-4, 0);
    fd_check_("matmul dweight", c.w, dw, C * OC, mm_obj_, &c, 1e-2f, 1e-3, 1e-4, 0);
    fd_check_("matmul dbias", c.b, db, OC, mm_obj_, &c, 1e-2f, 1e-3, 1e-4, 0);
    /* Without bias the output is the product alone. */
    float *bias = c.b;
    c.b = NULL;
    mm_obj_(&c);
    assert_true(fabs(c.out[0] - (c.x[0] * c.w[0] + c.x[1] * c.w[OC] + c.x[2] * c.w[2 * OC] +
                                 c.x[3] * c.w[3 * OC] + c.x[4] * c.w[4 * OC])) < 1e-5);
    free(c.x), free(c.w), free(bias), free(db0), free(c.R), free(c.out), free(dw0), free(dx);
}

/* zdp_nn_sgemm_many_ and zdp_nn_linear_forward_shared: several products in
 * one pool loop equal, bit for bit, each product as one undivided
 * single-threaded cblas_sgemm, at any pool size (ctest runs this file at 1
 * and 3 threads).  The shapes are large enough to be cut (2^23
 * multiply-adds and 64 rows per piece), along M and along N, and one too
 * small to be; each C starts from garbage where beta = 0 and from values
 * where beta = 1. */
static void test_sgemm_many(void **state) {
    (void)state;
    uint64_t s = 11;
    enum { NG = 4 };
    const int64_t dims[NG][3] = {{256, 192, 512}, {128, 640, 384}, {40, 24, 16}, {512, 96, 300}};
    const CBLAS_TRANSPOSE ta[NG] = {CblasNoTrans, CblasTrans, CblasNoTrans, CblasTrans};
    const CBLAS_TRANSPOSE tb[NG] = {CblasTrans, CblasNoTrans, CblasNoTrans, CblasTrans};
    const float beta[NG] = {0.0f, 1.0f, 1.0f, 0.0f};
    zdp_nn_gemm g[NG];
    float *want[NG];
    for (int i = 0; i < NG; i++) {
        const int64_t M = dims[i][0], N = dims[i][1], K = dims[i][2];
        const int64_t lda = ta[i] == CblasNoTrans ? K : M, ldb = tb[i] == CblasNoTrans ? N : K;
        float *A = rand_vec_(M * K, 1.0f, &s), *B = rand_vec_(K * N, 1.0f, &s);
        float *C = beta[i] == 0.0f ? garbage_(M * N, &s) : rand_vec_(M * N, 1.0f, &s);
        want[i] = malloc((size_t)(M * N) * sizeof(float));
        memcpy(want[i], C, (size_t)(M * N) * sizeof(float));
        cblas_sgemm(CblasRowMajor, ta[i], tb[i], (int)M, (int)N, (int)K, 0.5f, A, (int)lda, B,
                    (int)ldb, beta[i], want[i], (int)N);
        g[i] = (zdp_nn_gemm){.ta = ta[i], .tb = tb[i], .M = M, .N = N, .K = K, .alpha = 0.5f,
                             .A = A, .lda = lda, .B = B, .ldb = ldb, .beta = beta[i], .C = C,
                             .ldc = N};
    }
    zdp_nn_sgemm_many_(g, NG);
    for (int i = 0; i < NG; i++) {
        assert_memory_equal(g[i].C, want[i], (size_t)(dims[i][0] * dims[i][1]) * sizeof(float));
        free((void *)g[i].A), free((void *)g[i].B), free(g[i].C), free(want[i]);
    }
    /* Linears of one input: q, k, v with biases (one missing), as one call each. */
    enum { LN = 256, LC = 320 };
    const int64_t oc[3] = {320, 64, 128};
    float *x = rand_vec_(LN * LC, 1.0f, &s), *out[3], *w[3], *b[3], *one[3];
    for (int i = 0; i < 3; i++) {
        w[i] = rand_vec_(oc[i] * LC, 1.0f, &s);
        b[i] = i == 1 ? NULL : rand_vec_(oc[i], 1.0f, &s);
        out[i] = garbage_(LN * oc[i], &s);
        one[i] = garbage_(LN * oc[i], &s);
        zdp_nn_linear_forward(one[i], x, w[i], b[i], LN, LC, oc[i], 0);
    }
    zdp_nn_linear_forward_shared(3, out, x, (const float *const *)w, (const float *const *)b, oc,
                                 LN, LC);
    for (int i = 0; i < 3; i++) {
        assert_memory_equal(out[i], one[i], (size_t)(LN * oc[i]) * sizeof(float));
        free(w[i]), free(b[i]), free(out[i]), free(one[i]);
    }
    free(x);
}

/* ---- attention ---------------------------------------------------------------------------- */

typedef struct attn_ctx {
    int64_t B, T, C, NH;
    float *qkv, *out, *att, *R;
} attn_ctx;

static double attn_obj_(void *v) {
    attn_ctx *c = v;
    zdp_nn_attention_forward(c->out, c->att, c->qkv, c->B, c->T, c->C, c->NH);
    return dot_d_(c->out, c->R, c->B * c->T * c->C);
}

static void check_attention_(int64_t B, int64_t T, int64_t C, int64_t NH, int64_t sample) {
    uint64_t s = 3 + (uint64_t)T;
    attn_ctx c = {.B = B, .T = T, .C = C, .NH = NH};
    const int64_t hs = C / NH;
    c.qkv = rand_vec_(B * T * 3 * C, 1.5f, &s);
    c.R = rand_vec_(B * T * C, 1.0f, &s);
    c.out = garbage_(B * T * C, &s);
    c.att = garbage_(B * NH * T * T, &s);
    attn_obj_(&c);
    /* Forward against a direct double-precision computation. */
    double *p = malloc((size_t)T * sizeof(double));
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < NH; h++)
            for (int64_t t = 0; t < T; t++) {
                const float *q = c.qkv + (b * T + t) * 3 * C + h * hs;
                double mx = -INFINITY, sum = 0.0;
                for (int64_t u = 0; u <= t; u++) {
                    const float *k = c.qkv + (b * T + u) * 3 * C + C + h * hs;
                    double d = 0.0;
                    for (int64_t i = 0; i < hs; i++) d += (double)q[i] * k[i];
                    p[u] = d / sqrt((double)hs);
                    mx = fmax(mx, p[u]);
                }
                for (int64_t u = 0; u <= t; u++) sum += (p[u] = exp(p[u] - mx));
                const float *arow = c.att + ((b * NH + h) * T + t) * T;
                for (int64_t u = 0; u <= t; u++) assert_true(fabs(p[u] / sum - arow[u]) < 1e-6);
                /* Masked entries inside the row's block are zeros. */
                int64_t r1 = (t / ZDP_NN_ATTN_BLOCK + 1) * ZDP_NN_ATTN_BLOCK;
                for (int64_t u = t + 1; u < (r1 < T ? r1 : T); u++) assert_true(arow[u] == 0.0f);
                for (int64_t i = 0; i < hs; i++) {
                    double o = 0.0;
                    for (int64_t u = 0; u <= t; u++)
                        o += p[u] / sum * c.qkv[(b * T + u) * 3 * C + 2 * C + h * hs + i];
                    assert_true(fabs(o - c.out[(b * T + t) * C + h * hs + i]) < 1e-5);
                }
            }
    free(p);
    float *dqkv = garbage_(B * T * 3 * C, &s), *scratch = garbage_(zdp_pool_size() * T * T, &s);
    zdp_nn_attention_backward(dqkv, scratch, c.R, c.qkv, c.att, B, T, C, NH);
    fd_check_("attention dqkv", c.qkv, dqkv, B * T * 3 * C, attn_obj_, &c, 1e-2f, 5e-3, 2e-4,
              sample);
    free(c.qkv), free(c.R), free(c.out), free(c.att), free(dqkv), free(scratch);
}

static void test_attention_one_block(void **state) {
    (void)state;
    check_attention_(2, 5, 8, 2, 0);
    check_attention_(1, 1, 3, 1, 0); /* a single position */
}

/* T spans several row blocks, with a partial last block. */
static void test_attention_blocks(void **state) {
    (void)state;
    check_attention_(2, 2 * ZDP_NN_ATTN_BLOCK + 7, 6, 2, 0);
}

/* Attention's products at GPT-2's head size (64), through zdp's GEMM (mode 2
 * gives zdp_nn_gemm_1_ every one) and through cblas_sgemm (mode 0): the same
 * checks, so both routes (transposes, strides, accumulation, the scale
 * taken out of the product) are right whichever the rule picks. */
static void test_attention_gemm_routes(void **state) {
    (void)state;
    const int was = zdp_nn_gemm_mode();
    for (int mode = 0; mode <= 2; mode += 2) {
        zdp_nn_gemm_use_mode(mode);
        check_attention_(1, 2 * ZDP_NN_ATTN_BLOCK + 7, 128, 2, 60);
    }
    zdp_nn_gemm_use_mode(was);
}

/* ---- gelu ---------------------------------------------------------------------------------- */

typedef struct gelu_ctx {
    int64_t N;
    float *x, *out, *R;
} gelu_ctx;

static double gelu_obj_(void *v) {
    gelu_ctx *c = v;
    zdp_nn_gelu_forward(c->out, c->x, c->N);
    return dot_d_(c->out, c->R, c->N);
}

static void test_gelu(void **state) {
    (void)state;
    uint64_t s = 4;
    enum { N = 101 };
    gelu_ctx c = {.N = N};
    c.x = malloc(N * sizeof(float));
    for (int i = 0; i < N; i++) c.x[i] = -8.0f + 16.0f * (float)i / (N - 1) + 0.01f * uniform_(&s);
    c.R = rand_vec_(N, 1.0f, &s);
    c.out = malloc(N * sizeof(float));
    gelu_obj_(&c);
    for (int i = 0; i < N; i++) {
        double x = c.x[i];
        double want = 0.5 * x * (1.0 + tanh(sqrt(2.0 / 3.14159265358979323846) * (x + 0.044715 * x * x * x)));
        assert_true(fabs(want - c.out[i]) <= 1e-6 * fmax(1.0, fabs(want)));
    }
    /* Extremes: saturate cleanly (x^3 overflowing included), keep NaN. */
    float ext[6] = {-1e4f, 1e4f, -1e20f, 1e20f, INFINITY, NAN}, eo[6];
    zdp_nn_gelu_forward(eo, ext, 6);
    assert_true(fabsf(eo[0]) < 1e-30f && eo[1] == 1e4f && fabsf(eo[2]) < 1e-10f);
    assert_true(eo[3] == 1e20f && eo[4] == INFINITY && isnan(eo[5]));
    float *dx = malloc(N * sizeof(float));
    zdp_nn_gelu_backward(dx, c.x, c.R, N);
    fd_check_("gelu dinp", c.x, dx, N, gelu_obj_, &c, 1e-2f, 2e-3, 1e-4, 0);
    /* In place (dinp aliasing dout) gives the same. */
    float *inplace = malloc(N * sizeof(float));
    memcpy(inplace, c.R, N * sizeof(float));
    zdp_nn_gelu_backward(inplace, c.x, inplace, N);
    assert_memory_equal(inplace, dx, N * sizeof(float));
    free(c.x), free(c.R), free(c.out), free(dx), free(inplace);
}

/* ---- embedding and residual ---------------------------------------------------------------- */

typedef struct emb_ctx {
    int64_t B, T, C;
    const int32_t *ids;
    float *wte, *wpe, *out, *R;
} emb_ctx;

static double emb_obj_(void *v) {
    emb_ctx *c = v;
    zdp_nn_embedding_forward(c->out, c->ids, c->wte, c->wpe, c->B, c->T, c->C);
    return dot_d_(c->out, c->R, c->B * c->T * c->C);
}

static void test_embedding(void **state) {
    (void)state;
    uint64_t s = 5;
    enum { B = 2, T = 3, C = 4, V = 5, TMAX = 4 };
    const int32_t ids[B * T] = {1, 3, 1, 4, 1, 0}; /* 1 repeats: its gradient sums */
    emb_ctx c = {.B = B, .T = T, .C = C, .ids = ids};
    c.wte = rand_vec_(V * C, 1.0f, &s);
    c.wpe = rand_vec_(TMAX * C, 1.0f, &s);
    c.R = rand_vec_(B * T * C, 1.0f, &s);
    c.out = malloc(B * T * C * sizeof(float));
    emb_obj_(&c);
    assert_true(c.out[(1 * T + 2) * C + 3] == c.wte[0 * C + 3] + c.wpe[2 * C + 3]);
    float *dwte0 = garbage_(V * C, &s), *dwpe0 = garbage_(TMAX * C, &s);
    float dwte[V * C], dwpe[TMAX * C];
    memcpy(dwte, dwte0, sizeof dwte);
    memcpy(dwpe, dwpe0, sizeof dwpe);
    zdp_nn_embedding_backward(dwte, dwpe, c.R, ids, B, T, C);
    sub_(dwte, dwte0, V * C);
    sub_(dwpe, dwpe0, TMAX * C);
    fd_check_("embedding dwte", c.wte, dwte, V * C, emb_obj_, &c, 1e-2f, 1e-3, 1e-4, 0);
    fd_check_("embedding dwpe", c.wpe, dwpe, TMAX * C, emb_obj_, &c, 1e-2f, 1e-3, 1e-4, 0);
    for (int k = 2 * C; k < 3 * C; k++) assert_true(dwte[k] == 0.0f); /* token 2 is unused */
    for (int k = 3 * C; k < TMAX * C; k++) assert_true(dwpe[k] == 0.0f); /* row 3: past T */
    free(c.wte), free(c.wpe), free(c.R), free(c.out), free(dwte0), free(dwpe0);
}

typedef struct res_ctx {
    int64_t N;
    float *a, *b, *out, *R;
} res_ctx;

static double res_obj_(void *v) {
    res_ctx *c = v;
    zdp_nn_residual_forward(c->out, c->a, c->b, c->N);
    return dot_d_(c->out, c->R, c->N);
}

static void test_residual(void **state) {
    (void)state;
    uint64_t s = 6;
    enum { N = 11 };
    res_ctx c = {.N = N};
    c.a = rand_vec_(N, 1.0f, &s);
    c.b = rand_vec_(N, 1.0f, &s);
    c.R = rand_vec_(N, 1.0f, &s);
    c.out = malloc(N * sizeof(float));
    float *da0 = garbage_(N, &s), *db0 = garbage_(N, &s), da[N], db[N];
    memcpy(da, da0, sizeof da);
    memcpy(db, db0, sizeof db);
    zdp_nn_residual_backward(da, db, c.R, N);
    sub_(da, da0, N);
    sub_(db, db0, N);
    fd_check_("residual da", c.a, da, N, res_obj_, &c, 1e-2f, 1e-3, 1e-5, 0);
    fd_check_("residual db", c.b, db, N, res_obj_, &c, 1e-2f, 1e-3, 1e-5, 0);
    free(c.a), free(c.b), free(c.R), free(c.out), free(da0), free(db0);
}

/* ---- lm_head + cross-entropy ------------------------------------------------------------------ */

typedef struct ce_ctx {
    int64_t N, C, V;
    float dloss;
    const int32_t *targets;
    const float *weights; /* NULL: all 1 */
    float *x, *wte, *probs;
} ce_ctx;

static double ce_obj_(void *v) {
    ce_ctx *c = v;
    zdp_nn_lmhead_forward(c->probs, c->x, c->wte, c->N, c->C, c->V);
    return c->dloss * zdp_nn_softmax_crossentropy_forward(c->probs, c->probs, c->targets,
                                                          c->weights, NULL, c->N, c->V);
}

/* weights NULL, or per-position weights (a 0 masks its position). */
static void check_lmhead_crossentropy_(const float *weights) {
    uint64_t s = 7;
    enum { N = 6, C = 5, V = 11 };
    const int32_t targets[N] = {0, 10, 3, 3, 7, 1};
    ce_ctx c = {.N = N, .C = C, .V = V, .dloss = 0.7f, .targets = targets, .weights = weights};
    c.x = rand_vec_(N * C, 1.0f, &s);
    c.wte = rand_vec_(V * C, 1.0f, &s);
    c.probs = malloc(N * V * sizeof(float));
    /* Loss against double precision, and the logits kernel against a loop. */
    float logits[N * V];
    zdp_nn_lmhead_forward(logits, c.x, c.wte, N, C, V);
    double want = 0.0, row_ce[N];
    for (int n = 0; n < N; n++) {
        double z[V], mx = -INFINITY, se = 0.0;
        for (int v = 0; v < V; v++) {
            z[v] = 0.0;
            for (int k = 0; k < C; k++) z[v] += (double)c.x[n * C + k] * c.wte[v * C + k];
            assert_true(fabs(z[v] - logits[n * V + v]) < 1e-5);
            mx = fmax(mx, z[v]);
        }
        for (int v = 0; v < V; v++) se += exp(z[v] - mx);
        row_ce[n] = log(se) + mx - z[targets[n]];
        want += (weights ? weights[n] : 1.0) * row_ce[n];
    }
    want /= N;
    assert_true(fabs(ce_obj_(&c) / c.dloss - want) < 1e-6);
    /* Separate probs buffer gives the same as in place; log p(target) per row. */
    float probs2[N * V], lp[N];
    zdp_nn_softmax_crossentropy_forward(probs2, logits, targets, weights, lp, N, V);
    assert_memory_equal(probs2, c.probs, sizeof probs2);
    for (int n = 0; n < N; n++) assert_true(fabs(lp[n] + row_ce[n]) < 1e-5);

    float *dx = garbage_(N * C, &s), *dwte0 = garbage_(V * C, &s), dwte[V * C];
    memcpy(dwte, dwte0, sizeof dwte);
    zdp_nn_softmax_crossentropy_backward(c.probs, c.probs, targets, weights, c.dloss, N, V);
    zdp_nn_lmhead_backward(dx, dwte, c.probs, c.x, c.wte, N, C, V);
    sub_(dwte, dwte0, V * C);
    fd_check_("lm_head+CE dinp", c.x, dx, N * C, ce_obj_, &c, 1e-2f, 2e-3, 1e-5, 0);
    fd_check_("lm_head+CE dwte", c.wte, dwte, V * C, ce_obj_, &c, 1e-2f, 2e-3, 1e-5, 0);
    free(c.x), free(c.wte), free(c.probs), free(dx), free(dwte0);
}

static void test_lmhead_crossentropy(void **state) {
    (void)state;
    check_lmhead_crossentropy_(NULL);
    const float weights[6] = {1.0f, 0.0f, 2.5f, 0.5f, 1.0f, 3.0f};
    check_lmhead_crossentropy_(weights);
}

/* zdp_nn_max_ (every softmax's max, run in lanes) against the serial loop: every
 * length around the lane count and a loss-row width, the max at every position
 * (lanes and tail), NaN only from x[0] as the serial loop keeps it.  A wrong
 * max would pass the softmax tests (softmax(x - m) does not depend on m) until
 * an exponential overflowed, so it is checked here directly. */
static void test_row_max(void **state) {
    (void)state;
    uint64_t s = 77;
    const int64_t lens[] = {1, 2, 15, 16, 17, 31, 32, 33, 100, 49152};
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        const int64_t n = lens[li];
        float *x = rand_vec_(n, 50.0f, &s);
        for (int64_t at = 0; at < n; at += n > 64 ? n / 37 + 1 : 1) {
            const float keep = x[at];
            x[at] = 1000.0f + (float)at;
            float ref = x[0];
            for (int64_t i = 1; i < n; i++) ref = x[i] > ref ? x[i] : ref;
            assert_true(ref == 1000.0f + (float)at);
            assert_true(zdp_nn_max_(x, n) == ref);
            x[at] = keep;
        }
        if (n > 1) {
            x[n - 1] = NAN; /* ignored after x[0], as by the serial loop */
            assert_false(isnan(zdp_nn_max_(x, n)));
        }
        x[0] = NAN;
        assert_true(isnan(zdp_nn_max_(x, n)));
        free(x);
    }
}

/* ---- the whole model --------------------------------------------------------------------------- */

/* A tiny model with parameters larger than GPT-2's init (so gradients are
 * well above the finite-difference noise) and random data. */
static void fx_init_(model_fx *f, zdp_gpt_config cfg, int max_batch, int B, int T, uint64_t seed) {
    memset(f, 0, sizeof *f);
    zdp_error err;
    if (zdp_gpt_create(&cfg, max_batch, &f->m, &err) != ZDP_OK) fail_msg("%s", err.msg);
    fx_alloc_(f);
    zdp_gpt_init_params(&f->m, f->p, seed);
    uint64_t s = seed;
    for (int i = 0; i < f->m.n_params; i++)
        for (int64_t k = 0; k < f->numel[i]; k++) f->p[i][k] += 0.3f * uniform_(&s);
    fx_tokens_(f, B, T, cfg.vocab_size, &s);
}

static void test_model_fd(void **state) {
    (void)state;
    const zdp_gpt_config cfg = {.n_layer = 2, .n_head = 2, .n_embd = 8, .vocab_size = 11,
                                .block_size = 6};
    model_fx f;
    fx_init_(&f, cfg, 3, 2, 5, 11); /* B < max_batch, T < block_size */
    const float dloss = 0.5f;       /* checks the scaling too */
    fx_grad_(&f, dloss);
    loss_ctx c = {.f = &f, .scale = dloss};
    for (int i = 0; i < f.m.n_params; i++) {
        /* Every element; the gradients are O(1e-2..1), the float noise of the
         * loss O(1e-7) over a step of 1e-2. */
        fd_check_(f.m.params[i].name, f.p[i], f.g[i], f.numel[i], model_obj_, &c, 1e-2f, 1e-2,
                  3e-5, 0);
        /* wpe rows past T get no gradient; everything else does. */
        double mx = 0.0;
        for (int64_t k = 0; k < f.numel[i]; k++) mx = fmax(mx, fabs(f.g[i][k]));
        if (i == 1)
            for (int64_t k = 5 * 8; k < f.numel[i]; k++) assert_true(f.g[i][k] == 0.0f);
        if (!(mx > 1e-3)) fail_msg("%s: gradient %.3g is too small to test", f.m.params[i].name, mx);
    }
    fx_free_(&f);
}

/* One layer, one head, C not a multiple of 8, T over two attention blocks:
 * a random sample of each tensor. */
static void test_model_fd_long(void **state) {
    (void)state;
    const zdp_gpt_config cfg = {.n_layer = 1, .n_head = 1, .n_embd = 5, .vocab_size = 7,
                                .block_size = ZDP_NN_ATTN_BLOCK + 9};
    model_fx f;
    fx_init_(&f, cfg, 1, 1, ZDP_NN_ATTN_BLOCK + 9, 12);
    fx_grad_(&f, 1.0f);
    loss_ctx c = {.f = &f, .scale = 1.0f};
    for (int i = 0; i < f.m.n_params; i++)
        fd_check_(f.m.params[i].name, f.p[i], f.g[i], f.numel[i], model_obj_, &c, 1e-2f, 1e-2,
                  3e-5, 60);
    fx_free_(&f);
}

/* wte is tied: its gradient is the lm_head's plus the embedding's.  With
 * distinct input tokens (B = 1) the embedding's share of row inputs[t] is
 * exactly wpe's gradient at t, so both shares are visible; both must be
 * significant and their sum must match finite differences on wte. */
static void test_tied_wte(void **state) {
    (void)state;
    const zdp_gpt_config cfg = {.n_layer = 1, .n_head = 2, .n_embd = 6, .vocab_size = 9,
                                .block_size = 4};
    model_fx f;
    fx_init_(&f, cfg, 1, 1, 4, 13);
    const int32_t ids[4] = {2, 7, 0, 5};
    memcpy(f.inputs, ids, sizeof ids);
    fx_grad_(&f, 1.0f);
    const int C = 6;
    double emb = 0.0, head = 0.0;
    for (int t = 0; t < 4; t++)
        for (int k = 0; k < C; k++) {
            const double e = f.g[1][t * C + k];                /* embedding share */
            const double hd = f.g[0][ids[t] * C + k] - e;      /* lm_head share */
            emb = fmax(emb, fabs(e));
            head = fmax(head, fabs(hd));
        }
    assert_true(emb > 1e-2 && head > 1e-2);
    loss_ctx c = {.f = &f, .scale = 1.0f};
    fd_check_("tied transformer.wte.weight", f.p[0], f.g[0], f.numel[0], model_obj_, &c, 1e-2f,
              1e-2, 3e-5, 0);
    fx_free_(&f);
}

/* Gradients accumulate: two backwards into the same buffers give twice one. */
static void test_backward_adds(void **state) {
    (void)state;
    const zdp_gpt_config cfg = {.n_layer = 1, .n_head = 1, .n_embd = 4, .vocab_size = 5,
                                .block_size = 3};
    model_fx f;
    fx_init_(&f, cfg, 2, 2, 3, 14);
    fx_grad_(&f, 1.0f);
    float *once = malloc((size_t)f.numel[0] * sizeof(float));
    memcpy(once, f.g[0], (size_t)f.numel[0] * sizeof(float));
    float loss;
    zdp_grad_sink *sink = zdp_grad_sink_create_dense(f.g, f.m.n_params);
    assert_int_equal(zdp_model_forward_dense(&f.m, (const float *const *)f.p, &f.batch, &loss, NULL), ZDP_OK);
    assert_int_equal(zdp_model_backward_dense(&f.m, (const float *const *)f.p, 1.0f, sink, NULL), ZDP_OK);
    free(sink);
    for (int64_t k = 0; k < f.numel[0]; k++) assert_true(fabs(f.g[0][k] - 2.0f * once[k]) <= 1e-6f * (1.0f + fabsf(once[k])));
    free(once);
    fx_free_(&f);
}

/* ---- next_logits --------------------------------------------------------------------------------- */

/* The full forward's mean loss with the last target set to v differs from
 * the one with target 0 by (z_0 - z_v) / T: that recovers the last
 * position's logits (up to a constant) from forward alone. */
static void check_next_logits_(int T) {
    const zdp_gpt_config cfg = {.n_layer = 2, .n_head = 2, .n_embd = 8, .vocab_size = 11,
                                .block_size = 6};
    model_fx f;
    fx_init_(&f, cfg, 2, 1, T, 15);
    float logits[11];
    zdp_error err;
    assert_int_equal(zdp_lm_next_logits(&f.m, (const float *const *)f.p, f.inputs, T, logits, &err),
                     ZDP_OK);
    loss_ctx c = {.f = &f, .scale = 1.0f};
    f.targets[T - 1] = 0;
    const double l0 = model_obj_(&c);
    for (int v = 1; v < 11; v++) {
        f.targets[T - 1] = v;
        const double dz = (double)T * (l0 - model_obj_(&c));
        if (fabs(dz - (logits[v] - logits[0])) > 2e-5 * T)
            fail_msg("T=%d: logit %d - logit 0: next_logits %.7g, forward %.7g", T, v,
                     (double)(logits[v] - logits[0]), dz);
    }
    /* The same again: next_logits is deterministic and leaves no state behind. */
    float again[11];
    assert_int_equal(zdp_lm_next_logits(&f.m, (const float *const *)f.p, f.inputs, T, again, &err),
                     ZDP_OK);
    assert_memory_equal(again, logits, sizeof logits);
    fx_free_(&f);
}

static void test_next_logits(void **state) {
    (void)state;
    check_next_logits_(1);
    check_next_logits_(4);
    check_next_logits_(6); /* block_size */
}

/* ---- validation ------------------------------------------------------------------------------------ */

static void test_create_errors(void **state) {
    (void)state;
    zdp_model m;
    zdp_error err;
    zdp_gpt_config cfg = {.n_layer = 2, .n_head = 3, .n_embd = 8, .vocab_size = 11, .block_size = 6};
    assert_int_equal(zdp_gpt_create(&cfg, 1, &m, &err), ZDP_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "n_head = 3"));
    assert_non_null(strstr(err.msg, "n_embd = 8"));
    assert_null(m.self);
    cfg.n_head = 2;
    cfg.n_layer = 0;
    assert_int_equal(zdp_gpt_create(&cfg, 1, &m, &err), ZDP_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "n_layer = 0"));
    cfg.n_layer = 2;
    cfg.vocab_size = 0;
    assert_int_equal(zdp_gpt_create(&cfg, 1, &m, &err), ZDP_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "vocab_size = 0"));
    cfg.vocab_size = 11;
    cfg.block_size = -1;
    assert_int_equal(zdp_gpt_create(&cfg, 1, &m, &err), ZDP_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "block_size = -1"));
    cfg.block_size = 6;
    assert_int_equal(zdp_gpt_create(&cfg, 0, &m, &err), ZDP_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "max_batch = 0"));
    assert_int_equal(zdp_gpt_create(NULL, 1, &m, &err), ZDP_ERR_INVALID_ARG);
    /* A good one: the registered names, shapes and count of zdp.h. */
    assert_int_equal(zdp_gpt_create(&cfg, 1, &m, &err), ZDP_OK);
    assert_int_equal(m.n_params, 2 + 12 * 2 + 2);
    assert_string_equal(m.params[0].name, "transformer.wte.weight");
    assert_true(m.params[0].shape[0] == 11 && m.params[0].shape[1] == 8);
    assert_string_equal(m.params[1].name, "transformer.wpe.weight");
    assert_true(m.params[1].shape[0] == 6 && m.params[1].shape[1] == 8);
    assert_string_equal(m.params[2 + 12 + 2].name, "transformer.h.1.attn.c_attn.weight");
    assert_true(m.params[16].ndim == 2 && m.params[16].shape[0] == 8 && m.params[16].shape[1] == 24);
    assert_string_equal(m.params[2 + 12 + 10].name, "transformer.h.1.mlp.c_proj.weight");
    assert_true(m.params[24].shape[0] == 32 && m.params[24].shape[1] == 8);
    assert_string_equal(m.params[2 + 12 + 11].name, "transformer.h.1.mlp.c_proj.bias");
    assert_string_equal(m.params[26].name, "transformer.ln_f.weight");
    assert_string_equal(m.params[27].name, "transformer.ln_f.bias");
    assert_true(m.params[27].ndim == 1 && m.params[27].shape[0] == 8);
    assert_int_equal(zdp_gpt_config_of(&m)->n_embd, 8);
    zdp_gpt_destroy(&m);
    zdp_gpt_destroy(&m); /* no-op after destroy */
    zdp_gpt_destroy(NULL);
    /* Other models are not GPTs. */
    zdp_model mlp;
    assert_int_equal(zdp_mlp_create(4, 1, 1, &mlp, NULL), ZDP_OK);
    assert_null(zdp_gpt_config_of(&mlp));
    float lg[4];
    int32_t tok = 0;
    assert_int_equal(zdp_lm_next_logits(&mlp, NULL, &tok, 1, lg, &err), ZDP_ERR_INVALID_ARG);
    zdp_mlp_destroy(&mlp);
}

static void test_forward_errors(void **state) {
    (void)state;
    const zdp_gpt_config cfg = {.n_layer = 1, .n_head = 2, .n_embd = 4, .vocab_size = 7,
                                .block_size = 5};
    model_fx f;
    fx_init_(&f, cfg, 2, 2, 5, 16);
    const float *const *P = (const float *const *)f.p;
    zdp_error err;
    float loss;
    zdp_grad_sink *sink = zdp_grad_sink_create_dense(f.g, f.m.n_params);
    /* backward before any forward */
    assert_int_equal(zdp_model_backward_dense(&f.m, P, 1.0f, sink, &err), ZDP_ERR_STATE);
    assert_non_null(strstr(err.msg, "forward"));
    zdp_lm_batch b = f.batch;
    b.B = 3;
    assert_int_equal(zdp_model_forward_dense(&f.m, P, &b, &loss, &err), ZDP_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "batch->B = 3"));
    b.B = 0;
    assert_int_equal(zdp_model_forward_dense(&f.m, P, &b, &loss, &err), ZDP_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "batch->B = 0"));
    b = f.batch;
    b.T = 6;
    assert_int_equal(zdp_model_forward_dense(&f.m, P, &b, &loss, &err), ZDP_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "batch->T = 6"));
    b = f.batch;
    f.inputs[1 * 5 + 2] = 7;
    assert_int_equal(zdp_model_forward_dense(&f.m, P, &b, &loss, &err), ZDP_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "inputs[1][2] = 7"));
    f.inputs[1 * 5 + 2] = 6;
    f.targets[4] = -1;
    assert_int_equal(zdp_model_forward_dense(&f.m, P, &b, &loss, &err), ZDP_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "targets[0][4] = -1"));
    b.inputs = NULL;
    assert_int_equal(zdp_model_forward_dense(&f.m, P, &b, &loss, &err), ZDP_ERR_INVALID_ARG);
    /* A failed forward leaves nothing for backward. */
    assert_int_equal(zdp_model_backward_dense(&f.m, P, 1.0f, sink, &err), ZDP_ERR_STATE);
    /* One backward per forward. */
    f.targets[4] = 0;
    assert_int_equal(zdp_model_forward_dense(&f.m, P, &f.batch, &loss, &err), ZDP_OK);
    assert_int_equal(zdp_model_backward_dense(&f.m, P, 1.0f, sink, &err), ZDP_OK);
    assert_int_equal(zdp_model_backward_dense(&f.m, P, 1.0f, sink, &err), ZDP_ERR_STATE);
    /* next_logits checks its inputs */
    float lg[7];
    int32_t toks[6] = {0, 1, 2, 3, 4, 5};
    assert_int_equal(zdp_lm_next_logits(&f.m, P, toks, 6, lg, &err), ZDP_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "T = 6"));
    assert_int_equal(zdp_lm_next_logits(&f.m, P, toks, 0, lg, &err), ZDP_ERR_INVALID_ARG);
    toks[3] = 9;
    assert_int_equal(zdp_lm_next_logits(&f.m, P, toks, 5, lg, &err), ZDP_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "tokens[0][3] = 9"));
    free(sink);
    fx_free_(&f);
}

/* GPT-2's initialisation: the right distributions, reproducible by seed. */
static void test_init_params(void **state) {
    (void)state;
    const zdp_gpt_config cfg = {.n_layer = 2, .n_head = 4, .n_embd = 64, .vocab_size = 300,
                                .block_size = 32};
    model_fx a, b;
    fx_init_(&a, cfg, 1, 1, 1, 1);
    fx_init_(&b, cfg, 1, 1, 1, 1);
    zdp_gpt_init_params(&a.m, a.p, 42);
    zdp_gpt_init_params(&b.m, b.p, 42);
    for (int i = 0; i < a.m.n_params; i++)
        assert_memory_equal(a.p[i], b.p[i], (size_t)a.numel[i] * sizeof(float));
    zdp_gpt_init_params(&b.m, b.p, 43);
    assert_true(memcmp(a.p[0], b.p[0], 16) != 0);
    for (int i = 0; i < a.m.n_params; i++) {
        const char *nm = a.m.params[i].name;
        double s1 = 0.0, s2 = 0.0;
        for (int64_t k = 0; k < a.numel[i]; k++) {
            s1 += a.p[i][k];
            s2 += (double)a.p[i][k] * a.p[i][k];
        }
        const double n = (double)a.numel[i], mean = s1 / n, sd = sqrt(s2 / n - mean * mean);
        if (strstr(nm, "ln_") != NULL && strstr(nm, ".weight") != NULL) {
            assert_true(mean == 1.0 && sd < 1e-9);
        } else if (strstr(nm, ".bias") != NULL) {
            assert_true(s2 == 0.0);
        } else {
            const double want = strstr(nm, "c_proj") != NULL ? 0.02 / sqrt(4.0) : 0.02;
            if (fabs(sd - want) > 0.1 * want || fabs(mean) > 0.2 * want)
                fail_msg("%s: mean %.4g sd %.4g, want N(0, %.4g)", nm, mean, sd, want);
        }
    }
    fx_free_(&a);
    fx_free_(&b);
}

/* Per-position weights and log-probabilities through the whole model. */
static void test_weights_and_logprobs(void **state) {
    (void)state;
    zdp_gpt_config cfg = {.n_layer = 1, .n_head = 2, .n_embd = 8, .vocab_size = 13, .block_size = 6};
    zdp_model m;
    assert_int_equal(zdp_gpt_create(&cfg, 2, &m, NULL), ZDP_OK);
    float *p[64];
    for (int i = 0; i < m.n_params; i++) p[i] = malloc((size_t)numel_(&m.params[i]) * sizeof(float));
    zdp_gpt_init_params(&m, p, 3);
    int32_t in[12], tg[12];
    float ones[12], twos[12], lp[12];
    for (int i = 0; i < 12; i++) in[i] = (i * 5) % 13, tg[i] = (i * 7 + 1) % 13, ones[i] = 1, twos[i] = 2;
    zdp_lm_batch b = {.inputs = in, .targets = tg, .B = 2, .T = 6, .logprobs = lp};
    float plain, w1, w2;
    const float *const *pp = (const float *const *)p;
    assert_int_equal(zdp_model_forward_dense(&m, pp, &b, &plain, NULL), ZDP_OK);
    double mean_lp = 0;
    for (int i = 0; i < 12; i++) mean_lp += lp[i] / 12.0;
    assert_true(fabs(plain + mean_lp) < 1e-5);
    b.weights = ones;
    assert_int_equal(zdp_model_forward_dense(&m, pp, &b, &w1, NULL), ZDP_OK);
    assert_true(w1 == plain);
    b.weights = twos;
    assert_int_equal(zdp_model_forward_dense(&m, pp, &b, &w2, NULL), ZDP_OK);
    assert_true(fabs(w2 - 2 * plain) < 1e-6);
    twos[3] = NAN;
    zdp_error err;
    assert_int_equal(zdp_model_forward_dense(&m, pp, &b, &w2, &err), ZDP_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "weights[0][3]"));
    for (int i = 0; i < m.n_params; i++) free(p[i]);
    zdp_gpt_destroy(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_weights_and_logprobs),
        cmocka_unit_test(test_layernorm),        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_sgemm_many),
        cmocka_unit_test(test_attention_one_block), cmocka_unit_test(test_attention_blocks),
        cmocka_unit_test(test_attention_gemm_routes),
        cmocka_unit_test(test_gelu),             cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_residual),         cmocka_unit_test(test_lmhead_crossentropy),
        cmocka_unit_test(test_row_max),
        cmocka_unit_test(test_model_fd),         cmocka_unit_test(test_model_fd_long),
        cmocka_unit_test(test_tied_wte),         cmocka_unit_test(test_backward_adds),
        cmocka_unit_test(test_next_logits),      cmocka_unit_test(test_create_errors),
        cmocka_unit_test(test_forward_errors),   cmocka_unit_test(test_init_params),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
