/*
 * test_optim_zero.c -- optimizer update formulas against hand-worked values
 * (Adam L2 / decoupled / AdamW, SGD momentum, dampening, nesterov, the
 * gradient scale), and the flat layout and bucket plan of src/zero.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "optim/optim.h"
#include "zero/zero.h"

static zdp_optimizer_config adam_(zdp_optimizer_type t, double wd, bool adam_w_mode) {
    return (zdp_optimizer_config){.type = t, .lr = 0.1, .beta1 = 0.9, .beta2 = 0.999,
                                  .eps = 1e-8, .weight_decay = wd, .adam_w_mode = adam_w_mode,
                                  .bias_correction = true};
}

/* Two Adam steps on one element, computed by hand in double. */
static void check_adam_(zdp_optimizer_type t, bool adam_w_mode, bool want_decoupled) {
    zdp_optimizer_config c = adam_(t, 0.1, adam_w_mode);
    zdp_optim o;
    zdp_mem_counter mem = {0};
    assert_int_equal(zdp_optim_init(&o, &c, 1, &mem, NULL), ZDP_OK);
    assert_int_equal(mem.bytes[ZDP_MEM_OPTIMIZER], 8);
    float p = 1.0f;
    double rp = 1.0, m = 0, v = 0;
    const float grads[2] = {0.5f, -0.25f};
    for (int t1 = 1; t1 <= 2; t1++) {
        float g = grads[t1 - 1] * 2.0f; /* grad_scale 0.5 below halves it back */
        zdp_optim_step(&o, &p, &g, 0.5f, 0.1);
        double rg = grads[t1 - 1];
        if (!want_decoupled) rg += 0.1 * rp;
        m = 0.9 * m + 0.1 * rg;
        v = 0.999 * v + 0.001 * rg * rg;
        double u = (m / (1 - pow(0.9, t1))) / (sqrt(v / (1 - pow(0.999, t1))) + 1e-8);
        if (want_decoupled) u += 0.1 * rp;
        rp -= 0.1 * u;
        assert_true(fabs(p - rp) < 1e-6);
    }
    assert_int_equal(o.step_count, 2);
    zdp_optim_free(&o, &mem);
    assert_int_equal(mem.bytes[ZDP_MEM_OPTIMIZER], 0);
}

static void test_adam_default_is_decoupled(void **s) { (void)s; check_adam_(ZDP_OPTIMIZER_ADAM, true, true); }
static void test_adam_l2_mode(void **s) { (void)s; check_adam_(ZDP_OPTIMIZER_ADAM, false, false); }
static void test_adamw_ignores_mode(void **s) { (void)s; check_adam_(ZDP_OPTIMIZER_ADAMW, false, true); }

static void check_sgd_(double mom, double damp, bool nesterov, double wd) {
    zdp_optimizer_config c = {.type = ZDP_OPTIMIZER_SGD, .lr = 0.1, .momentum = mom,
                              .dampening = damp, .nesterov = nesterov, .weight_decay = wd};
    zdp_optim o;
    zdp_mem_counter mem = {0};
    assert_int_equal(zdp_optim_init(&o, &c, 1, &mem, NULL), ZDP_OK);
    assert_int_equal(mem.bytes[ZDP_MEM_OPTIMIZER], mom != 0 ? 4 : 0);
    float p = 1.0f;
    double rp = 1.0, buf = 0;
    const float grads[3] = {0.5f, -0.25f, 1.0f};
    for (int t = 0; t < 3; t++) {
        zdp_optim_step(&o, &p, &grads[t], 1.0f, 0.1);
        double d = grads[t] + wd * rp;
        if (mom != 0) {
            buf = t == 0 ? d : mom * buf + (1 - damp) * d;
            d = nesterov ? d + mom * buf : buf;
        }
        rp -= 0.1 * d;
        assert_true(fabs(p - rp) < 1e-6);
    }
    zdp_optim_free(&o, &mem);
}

static void test_sgd_plain(void **s) { (void)s; check_sgd_(0, 0, false, 0); }
static void test_sgd_momentum(void **s) { (void)s; check_sgd_(0.9, 0, false, 0.01); }
static void test_sgd_dampening(void **s) { (void)s; check_sgd_(0.9, 0.5, false, 0); }
static void test_sgd_nesterov(void **s) { (void)s; check_sgd_(0.9, 0, true, 0.01); }

/* zdp_optim_update_finite: the verdict of the real update, without writing.
 * SGD: p - lr*g overflows for lr 100 and g 1e37; Adam: g = 1e30 squares past
 * FLT_MAX in v; a NaN already in the state is caught too.  The check
 * changes nothing, and a finite verdict is followed by a finite update. */
static void test_update_finite_check(void **s) {
    (void)s;
    zdp_mem_counter mem = {0};
    zdp_optimizer_config sgd = {.type = ZDP_OPTIMIZER_SGD, .lr = 100, .momentum = 0.9};
    zdp_optim o;
    assert_int_equal(zdp_optim_init(&o, &sgd, 2, &mem, NULL), ZDP_OK);
    float p[2] = {1.0f, -1.0f}, g[2] = {0.5f, 1e37f};
    assert_false(zdp_optim_update_finite(&o, p, g, 1.0f, 100.0));
    assert_true(p[0] == 1.0f && p[1] == -1.0f && o.m[0] == 0.0f && o.step_count == 0);
    assert_true(zdp_optim_update_finite(&o, p, g, 1e-30f, 100.0)); /* clipped hard */
    g[1] = 2.0f;
    assert_true(zdp_optim_update_finite(&o, p, g, 1.0f, 100.0));
    zdp_optim_step(&o, p, g, 1.0f, 100.0);
    assert_true(isfinite(p[0]) && isfinite(p[1]) && o.step_count == 1);
    o.m[1] = NAN;
    assert_false(zdp_optim_update_finite(&o, p, g, 1.0f, 1e-3));
    zdp_optim_free(&o, &mem);

    zdp_optimizer_config adam = adam_(ZDP_OPTIMIZER_ADAMW, 0.0, true);
    assert_int_equal(zdp_optim_init(&o, &adam, 2, &mem, NULL), ZDP_OK);
    float q[2] = {1.0f, 2.0f}, h[2] = {0.1f, 1e30f};
    assert_false(zdp_optim_update_finite(&o, q, h, 1.0f, 1e-3));
    assert_true(o.v[1] == 0.0f && q[1] == 2.0f);
    h[1] = 1e10f;
    assert_true(zdp_optim_update_finite(&o, q, h, 1.0f, 1e-3));
    zdp_optim_free(&o, &mem);
}

/* docs/deepspeed.md §4.2 table for SimpleModel(4, 2), W = 1..4. */
static void test_layout_table(void **s) {
    (void)s;
    zdp_param_info p[4] = {
        {.name = "w0", .ndim = 2, .shape = {4, 4}}, {.name = "b0", .ndim = 1, .shape = {4}},
        {.name = "w1", .ndim = 2, .shape = {4, 4}}, {.name = "b1", .ndim = 1, .shape = {4}},
    };
    const int64_t padded[5] = {0, 40, 40, 42, 40}, part[5] = {0, 40, 20, 14, 10};
    for (int w = 1; w <= 4; w++) {
        zdp_layout lay;
        assert_int_equal(zdp_layout_init(&lay, p, 4, w, NULL, NULL), ZDP_OK);
        assert_int_equal(lay.numel, 40);
        assert_int_equal(lay.padded, padded[w]);
        assert_int_equal(lay.part, part[w]);
        int64_t total = 0;
        for (int r = 0; r < w; r++) total += zdp_layout_owned(&lay, r, 0, lay.numel);
        assert_int_equal(total, 40);
        zdp_layout_free(&lay);
    }
    /* W=3: r1 owns w0[14:16], b0, w1[0:8] = 14 elements; r2 owns 12 real + 2 pad. */
    zdp_layout lay;
    assert_int_equal(zdp_layout_init(&lay, p, 4, 3, NULL, NULL), ZDP_OK);
    assert_int_equal(zdp_layout_owned(&lay, 1, 0, 40), 14);
    assert_int_equal(zdp_layout_owned(&lay, 2, 0, 40), 12);
    assert_int_equal(zdp_layout_owned(&lay, 1, 14, 16), 2); /* w0's straddling tail */
    zdp_layout_free(&lay);
}

static void test_bucket_plan(void **s) {
    (void)s;
    zdp_param_info p[4] = {
        {.name = "w0", .ndim = 2, .shape = {4, 4}}, {.name = "b0", .ndim = 1, .shape = {4}},
        {.name = "w1", .ndim = 2, .shape = {4, 4}}, {.name = "b1", .ndim = 1, .shape = {4}},
    };
    zdp_layout lay;
    assert_int_equal(zdp_layout_init(&lay, p, 4, 2, NULL, NULL), ZDP_OK);
    zdp_bucket *b;
    int nb, *tb;
    /* cap 20: [w1 b1] and [w0 b0], last tensors first. */
    assert_int_equal(zdp_bucket_plan(&lay, 20, &b, &nb, &tb, NULL), ZDP_OK);
    assert_int_equal(nb, 2);
    assert_int_equal(b[0].lo, 20);
    assert_int_equal(b[0].hi, 40);
    assert_int_equal(b[1].lo, 0);
    assert_int_equal(tb[0], 1);
    assert_int_equal(tb[3], 0);
    free(b);
    free(tb);
    /* cap 3: smaller than every tensor, one bucket each. */
    assert_int_equal(zdp_bucket_plan(&lay, 3, &b, &nb, &tb, NULL), ZDP_OK);
    assert_int_equal(nb, 4);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(b[i].first, 3 - i);
        assert_int_equal(b[i].hi - b[i].lo, lay.numels[3 - i]);
    }
    free(b);
    free(tb);
    /* huge cap: one bucket covering everything. */
    assert_int_equal(zdp_bucket_plan(&lay, 1000, &b, &nb, &tb, NULL), ZDP_OK);
    assert_int_equal(nb, 1);
    assert_int_equal(b[0].lo, 0);
    assert_int_equal(b[0].hi, 40);
    free(b);
    free(tb);
    zdp_layout_free(&lay);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adam_default_is_decoupled), cmocka_unit_test(test_adam_l2_mode),
        cmocka_unit_test(test_adamw_ignores_mode),        cmocka_unit_test(test_sgd_plain),
        cmocka_unit_test(test_sgd_momentum),              cmocka_unit_test(test_sgd_dampening),
        cmocka_unit_test(test_sgd_nesterov),              cmocka_unit_test(test_layout_table),
        cmocka_unit_test(test_bucket_plan),               cmocka_unit_test(test_update_finite_check),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
