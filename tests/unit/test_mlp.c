/*
 * test_mlp.c -- SimpleModel and its kernels: finite-difference gradients
 * (every parameter element of small models, 1, 2 and 5 layers), forward
 * value against a hand computation, and input validation.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/engine.h"
#include "nn/nn.h"
#include "zdp/zdp.h"

static uint64_t rng_(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static float uniform_(uint64_t *s) { return (float)((double)(rng_(s) >> 11) * 0x1.0p-53 * 2.0 - 1.0); }

/* Loss at params (forward only), in float as the model computes it. */
static double loss_at_(zdp_model *m, float *const *p, const zdp_mlp_batch *b) {
    float loss = 0.0f;
    assert_int_equal(zdp_model_forward_dense(m, (const float *const *)p, b, &loss, NULL), ZDP_OK);
    return loss;
}

static void check_fd_(int H, int L, int64_t N) {
    zdp_model m;
    zdp_error err;
    assert_int_equal(zdp_mlp_create(H, L, N, &m, &err), ZDP_OK);
    float *p[64], *g[64];
    for (int i = 0; i < m.n_params; i++) {
        int64_t n = i % 2 == 0 ? H * H : H;
        p[i] = calloc((size_t)n, sizeof(float));
        g[i] = calloc((size_t)n, sizeof(float));
    }
    zdp_mlp_init_params(&m, p, 7);
    uint64_t s = 3;
    float *x = malloc((size_t)(N * H) * sizeof(float));
    int64_t *y = malloc((size_t)N * sizeof(int64_t));
    for (int64_t i = 0; i < N * H; i++) x[i] = uniform_(&s);
    for (int64_t i = 0; i < N; i++) y[i] = (int64_t)(rng_(&s) % (uint64_t)H);
    zdp_mlp_batch b = {.x = x, .y = y, .n = N};

    /* Analytic gradient of 0.5 * loss (dloss = 0.5 checks the scaling too). */
    float loss;
    assert_int_equal(zdp_model_forward_dense(&m, (const float *const *)p, &b, &loss, &err), ZDP_OK);
    zdp_grad_sink *sink = zdp_grad_sink_create_dense(g, m.n_params);
    assert_int_equal(zdp_model_backward_dense(&m, (const float *const *)p, 0.5f, sink, &err), ZDP_OK);
    free(sink);

    /* Central differences in float with a step that balances rounding and
     * truncation; compare every element. */
    const float h = 1e-2f;
    double worst = 0.0;
    for (int t = 0; t < m.n_params; t++) {
        int64_t n = t % 2 == 0 ? H * H : H;
        for (int64_t k = 0; k < n; k++) {
            float keep = p[t][k];
            p[t][k] = keep + h;
            double up = loss_at_(&m, p, &b);
            p[t][k] = keep - h;
            double down = loss_at_(&m, p, &b);
            p[t][k] = keep;
            double fd = 0.5 * (up - down) / (2.0 * h);
            double diff = fabs(fd - g[t][k]);
            double tol = 2e-3 * fmax(1.0, fabs(fd)) + 5e-4;
            if (diff > tol)
                fail_msg("H=%d L=%d tensor %s[%lld]: analytic %.7g, finite difference %.7g", H, L,
                         m.params[t].name, (long long)k, g[t][k], fd);
            worst = fmax(worst, diff);
        }
    }
    for (int i = 0; i < m.n_params; i++) {
        free(p[i]);
        free(g[i]);
    }
    free(x);
    free(y);
    zdp_mlp_destroy(&m);
}

static void test_fd_one_layer(void **state) { (void)state; check_fd_(6, 1, 5); }
static void test_fd_two_layers(void **state) { (void)state; check_fd_(4, 2, 3); }
static void test_fd_five_layers(void **state) { (void)state; check_fd_(5, 5, 4); }

/* One layer, identity-free check: logits = W x + b by hand, then CE. */
static void test_forward_value(void **state) {
    (void)state;
    zdp_model m;
    assert_int_equal(zdp_mlp_create(2, 1, 1, &m, NULL), ZDP_OK);
    float w[4] = {1, 2, 3, 4}, bias[2] = {0.5f, -0.5f};
    float *p[2] = {w, bias};
    float x[2] = {1, -1};
    int64_t y[1] = {1};
    zdp_mlp_batch b = {.x = x, .y = y, .n = 1};
    /* logits = [1-2+0.5, 3-4-0.5] = [-0.5, -1.5]; CE = logsumexp - z[1] */
    double z0 = -0.5, z1 = -1.5, want = log(exp(z0) + exp(z1)) - z1;
    assert_true(fabs(loss_at_(&m, p, &b) - want) < 1e-6);
    zdp_mlp_destroy(&m);
}

static void test_bad_inputs(void **state) {
    (void)state;
    zdp_model m;
    zdp_error err;
    assert_int_equal(zdp_mlp_create(0, 1, 1, &m, &err), ZDP_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "hidden = 0"));
    assert_int_equal(zdp_mlp_create(3, 1, 2, &m, &err), ZDP_OK);
    float w[9] = {0}, bias[3] = {0}, x[6] = {0};
    float *p[2] = {w, bias};
    int64_t y[2] = {0, 3};
    zdp_mlp_batch b = {.x = x, .y = y, .n = 2};
    float loss;
    assert_int_equal(zdp_model_forward_dense(&m, (const float *const *)p, &b, &loss, &err), ZDP_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "y[1] = 3"));
    b.n = 3;
    assert_int_equal(zdp_model_forward_dense(&m, (const float *const *)p, &b, &loss, &err), ZDP_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "batch->n = 3"));
    zdp_mlp_destroy(&m);
}

/* The linear kernel against a direct triple loop. */
static void test_linear_kernel(void **state) {
    (void)state;
    enum { N = 3, C = 4, OC = 5 };
    uint64_t s = 11;
    float in[N * C], w[OC * C], b[OC], out[N * OC];
    for (int i = 0; i < N * C; i++) in[i] = uniform_(&s);
    for (int i = 0; i < OC * C; i++) w[i] = uniform_(&s);
    for (int i = 0; i < OC; i++) b[i] = uniform_(&s);
    zdp_nn_linear_forward(out, in, w, b, N, C, OC, 0);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double r = b[o];
            for (int c = 0; c < C; c++) r += (double)in[n * C + c] * w[o * C + c];
            assert_true(fabs(r - out[n * OC + o]) < 1e-5);
        }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fd_one_layer),  cmocka_unit_test(test_fd_two_layers),
        cmocka_unit_test(test_fd_five_layers), cmocka_unit_test(test_forward_value),
        cmocka_unit_test(test_bad_inputs),    cmocka_unit_test(test_linear_kernel),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
