/*
 * test_schedule.c -- DeepSpeed's LR schedules (docs/deepspeed.md §7): the
 * worked example, log and linear warm-up, decay and cosine ends, and the
 * scheduler block of ds_config (defaults, errors).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "zdp/zdp.h"

#define NEAR(a, b) assert_true(fabs((a) - (b)) <= 1e-12 + 1e-12 * fabs(b))

/* docs/deepspeed.md §7.2: WarmupLR linear, min 0, max 0.01, 4 warm-up steps: applied
 * updates 1, 2, ... use 0, 0, 0.0025, 0.005, 0.0075, 0.01, 0.01. */
static void test_worked_example(void **state) {
    (void)state;
    zdp_scheduler_config s = {.type = ZDP_SCHEDULER_WARMUP_LR, .warmup_min_lr = 0,
                              .warmup_max_lr = 0.01, .warmup_num_steps = 4,
                              .warmup_linear = true};
    const double want[7] = {0, 0, 0.0025, 0.005, 0.0075, 0.01, 0.01};
    for (int k = 1; k <= 7; k++) NEAR(zdp_scheduler_lr(&s, 0.5, k - 2), want[k - 1]);
}

static void test_warmup_log_and_min_two(void **state) {
    (void)state;
    zdp_scheduler_config s = {.type = ZDP_SCHEDULER_WARMUP_LR, .warmup_min_lr = 0.001,
                              .warmup_max_lr = 0.011, .warmup_num_steps = 10};
    NEAR(zdp_scheduler_lr(&s, 0, -1), 0.001);
    for (int n = 0; n < 10; n++)
        NEAR(zdp_scheduler_lr(&s, 0, n), 0.001 + 0.01 * log(n + 1.0) / log(10.0));
    NEAR(zdp_scheduler_lr(&s, 0, 10), 0.011);
    NEAR(zdp_scheduler_lr(&s, 0, 1000), 0.011);
    /* W' = max(2, warmup_num_steps) */
    s.warmup_num_steps = 1;
    NEAR(zdp_scheduler_lr(&s, 0, 1), 0.001 + 0.01 * log(2.0) / log(2.0));
}

static void test_warmup_decay(void **state) {
    (void)state;
    zdp_scheduler_config s = {.type = ZDP_SCHEDULER_WARMUP_DECAY_LR, .warmup_min_lr = 0,
                              .warmup_max_lr = 0.1, .warmup_num_steps = 5,
                              .warmup_linear = true, .total_num_steps = 25};
    NEAR(zdp_scheduler_lr(&s, 0, 4), 0.1 * 4 / 5);
    NEAR(zdp_scheduler_lr(&s, 0, 5), 0.1 * (25 - 5) / 20.0);
    NEAR(zdp_scheduler_lr(&s, 0, 15), 0.1 * 10 / 20.0);
    NEAR(zdp_scheduler_lr(&s, 0, 25), 0.0);
    NEAR(zdp_scheduler_lr(&s, 0, 40), 0.0); /* clamped at 0 */
}

static void test_warmup_cosine(void **state) {
    (void)state;
    zdp_scheduler_config s = {.type = ZDP_SCHEDULER_WARMUP_COSINE_LR, .warmup_num_steps = 4,
                              .warmup_linear = true, .total_num_steps = 14,
                              .warmup_min_ratio = 0.1, .cos_min_ratio = 0.01};
    const double lr0 = 0.2;
    NEAR(zdp_scheduler_lr(&s, lr0, -1), 0.0); /* DeepSpeed: the first update has lr 0 */
    NEAR(zdp_scheduler_lr(&s, lr0, 0), lr0 * 0.1);
    NEAR(zdp_scheduler_lr(&s, lr0, 2), lr0 * (0.1 + 0.9 * 0.5));
    /* n = W': p = 1/10 */
    double p = 1.0 / 10.0;
    NEAR(zdp_scheduler_lr(&s, lr0, 4), lr0 * (0.01 + 0.99 * (1 + cos(3.14159265358979323846 * p)) / 2));
    NEAR(zdp_scheduler_lr(&s, lr0, 13), lr0 * 0.01);
    NEAR(zdp_scheduler_lr(&s, lr0, 100), lr0 * 0.01);
}

static void test_none_is_constant(void **state) {
    (void)state;
    zdp_scheduler_config s = {.type = ZDP_SCHEDULER_NONE};
    NEAR(zdp_scheduler_lr(&s, 0.3, -1), 0.3);
    NEAR(zdp_scheduler_lr(&s, 0.3, 99), 0.3);
    NEAR(zdp_scheduler_lr(NULL, 0.3, 5), 0.3);
}

static zdp_status load_(const char *sched, zdp_config *c, zdp_error *err) {
    char json[1024];
    snprintf(json, sizeof json,
             "{\"train_batch_size\": 4, \"optimizer\": {\"type\": \"Adam\", \"params\": "
             "{\"lr\": 0.05}}, \"scheduler\": %s}", sched);
    return zdp_config_load_string(json, "ds.json", 1, c, err);
}

static int n_warn_;
static char warn_[2048];
static void capture_(int level, const char *msg, void *user) {
    (void)user;
    if (level > 0) {
        n_warn_++;
        snprintf(warn_, sizeof warn_, "%s", msg);
    }
}

static void test_config_block(void **state) {
    (void)state;
    zdp_config c;
    zdp_error err;
    zdp_set_log(capture_, NULL);
    /* WarmupLR: the peak defaults to the optimizer's lr (DeepSpeed's code). */
    assert_int_equal(load_("{\"type\": \"WarmupLR\", \"params\": {}}", &c, &err), ZDP_OK);
    assert_int_equal(c.scheduler.type, ZDP_SCHEDULER_WARMUP_LR);
    NEAR(c.scheduler.warmup_max_lr, 0.05);
    NEAR(c.scheduler.warmup_min_lr, 0.0);
    assert_int_equal(c.scheduler.warmup_num_steps, 1000);
    assert_false(c.scheduler.warmup_linear);
    /* WarmupDecayLR: peak 0.001; total_num_steps required. */
    assert_int_equal(load_("{\"type\": \"WarmupDecayLR\", \"params\": {\"total_num_steps\": 50, "
                           "\"warmup_num_steps\": 5, \"warmup_type\": \"linear\"}}", &c, &err),
                     ZDP_OK);
    NEAR(c.scheduler.warmup_max_lr, 0.001);
    assert_true(c.scheduler.warmup_linear);
    assert_int_equal(c.scheduler.total_num_steps, 50);
    assert_int_equal(load_("{\"type\": \"WarmupCosineLR\", \"params\": {}}", &c, &err), ZDP_ERR_CONFIG);
    assert_non_null(strstr(err.msg, "scheduler.params.total_num_steps: missing"));
    assert_int_equal(load_("{\"type\": \"WarmupLR\"}", &c, &err), ZDP_ERR_CONFIG);
    assert_non_null(strstr(err.msg, "scheduler.params: missing"));
    assert_int_equal(load_("{\"type\": \"warmuplr\", \"params\": {}}", &c, &err), ZDP_ERR_CONFIG);
    assert_non_null(strstr(err.msg, "DeepSpeed does not recognize LR scheduler warmuplr"));
    assert_non_null(strstr(err.msg, "did you mean \"WarmupLR\"?"));
    assert_int_equal(load_("{\"type\": \"OneCycle\", \"params\": {}}", &c, &err), ZDP_ERR_UNSUPPORTED);
    assert_int_equal(load_("{\"type\": \"WarmupLR\", \"params\": {\"warmup_num_steps\": 0}}", &c, &err),
                     ZDP_ERR_CONFIG);
    assert_non_null(strstr(err.msg, "scheduler.params.warmup_num_steps = 0"));
    /* Keys of another schedule and an unknown warmup_type: one warning. */
    n_warn_ = 0;
    assert_int_equal(load_("{\"type\": \"WarmupLR\", \"params\": {\"cos_min_ratio\": 0.1, "
                           "\"warmup_type\": \"cubic\"}}", &c, &err), ZDP_OK);
    assert_int_equal(n_warn_, 1);
    assert_non_null(strstr(warn_, "scheduler.params.cos_min_ratio"));
    assert_non_null(strstr(warn_, "scheduler.params.warmup_type"));
    assert_false(c.scheduler.warmup_linear);
    /* No block: constant lr. */
    assert_int_equal(zdp_config_load_string("{\"train_batch_size\": 4, \"optimizer\": "
                                            "{\"type\": \"Adam\"}}", "x", 1, &c, &err), ZDP_OK);
    assert_int_equal(c.scheduler.type, ZDP_SCHEDULER_NONE);
    zdp_set_log(NULL, NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_worked_example), cmocka_unit_test(test_warmup_log_and_min_two),
        cmocka_unit_test(test_warmup_decay),   cmocka_unit_test(test_warmup_cosine),
        cmocka_unit_test(test_none_is_constant), cmocka_unit_test(test_config_block),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
