/*
 * test_zero3_faults.c -- ZeRO stage 3 when one rank cannot go on (run by
 * CTest at -np 1, 2, 3, 4; docs/deepspeed.md §4.9).
 *
 * At stage 3 the ranks gather parameters inside the model's forward and
 * backward, so one rank that stops early (a gather buffer it cannot
 * allocate, its model failing, a model that fetches another layer) would
 * leave the others in a collective it never enters.  Here each of those
 * happens on one rank -- the allocation through the engine's test hook
 * ZDP_TEST_FAIL_GATHER=RANK:N, at every N the run reaches, with prefetch
 * on and off, overlap_comm on and off -- and the test checks: the call
 * fails on every rank (the same call, with a clear message), nothing hangs
 * (CTest's timeout), the parameters are unchanged by the failed call, and
 * the run, repeating the failed micro-step, ends with the parameters of a
 * run without faults, bitwise.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "zdp/zdp.h"

static int W, R;

enum { H_ = 8, L_ = 4, STEPS_ = 3, MB_ = 2 };

/* A wrapper model: the MLP, except that on rank fault_rank its forward or
 * backward misbehaves once, as asked. */
enum { FAULT_NONE, FAULT_FWD_ERROR, FAULT_BWD_ERROR, FAULT_FWD_EXTRA_FETCH };
typedef struct wrap {
    zdp_model inner;
    int fault, fault_rank;
} wrap;

static zdp_status injected_(zdp_error *err, const char *pass) {
    err->code = ZDP_ERR_INVALID_ARG;
    err->rank = R;
    snprintf(err->msg, sizeof err->msg, "injected %s error on rank %d", pass, R);
    return ZDP_ERR_INVALID_ARG;
}

static zdp_status wrap_forward_(void *self, zdp_param_source *src, const void *batch,
                                float *loss, zdp_error *err) {
    wrap *w = self;
    if (R == w->fault_rank && w->fault == FAULT_FWD_ERROR) {
        w->fault = FAULT_NONE;
        return injected_(err, "forward");
    }
    if (R == w->fault_rank && w->fault == FAULT_FWD_EXTRA_FETCH) {
        /* The last layer first, on this rank only. */
        w->fault = FAULT_NONE;
        const float *const *p;
        zdp_status st = zdp_param_fetch(src, 2 * (L_ - 1), 2, &p, err);
        if (st != ZDP_OK) return st;
        zdp_param_release(src, 2 * (L_ - 1), 2);
    }
    return w->inner.ops->forward(w->inner.self, src, batch, loss, err);
}

static zdp_status wrap_backward_(void *self, zdp_param_source *src, float dloss,
                                 zdp_grad_sink *sink, zdp_error *err) {
    wrap *w = self;
    if (R == w->fault_rank && w->fault == FAULT_BWD_ERROR) {
        /* After the first gather the MLP's backward makes (linears[(L-1)/2],
         * matched on every rank), before any gradient. */
        w->fault = FAULT_NONE;
        const int j = (L_ - 1) / 2;
        const float *const *p;
        zdp_status st = zdp_param_fetch(src, 2 * j, 2, &p, err);
        if (st != ZDP_OK) return st;
        zdp_param_release(src, 2 * j, 2);
        return injected_(err, "backward");
    }
    return w->inner.ops->backward(w->inner.self, src, dloss, sink, err);
}

static const zdp_model_ops wrap_ops_ = {wrap_forward_, wrap_backward_};

typedef struct run {
    zdp_config cfg;
    wrap w;
    zdp_model model;
    zdp_engine *eng;
} run;

static void run_init_(run *rn, const char *json) {
    zdp_error err = {0};
    if (zdp_config_load_string(json, "<test>", W, &rn->cfg, &err) != ZDP_OK)
        CHECK_FAIL_("config: %s", err.msg);
    if (zdp_mlp_create(H_, L_, MB_, &rn->w.inner, &err) != ZDP_OK) CHECK_FAIL_("%s", err.msg);
    rn->w.fault = FAULT_NONE;
    rn->w.fault_rank = -1;
    rn->model = rn->w.inner;
    rn->model.self = &rn->w;
    rn->model.ops = &wrap_ops_;
    if (zdp_engine_create(&rn->cfg, &rn->model, &rn->eng, &err) != ZDP_OK)
        CHECK_FAIL_("engine: %s", err.msg);
    const int64_t n = zdp_engine_numel(rn->eng);
    float *flat = malloc((size_t)n * sizeof(float)), *views[2 * L_];
    for (int i = 0; i < rn->model.n_params; i++)
        views[i] = flat + zdp_engine_param_offset(rn->eng, i);
    zdp_mlp_init_params(&rn->w.inner, views, 11);
    for (int i = 0; i < rn->model.n_params; i++)
        CHECK_OK(zdp_engine_set_param(rn->eng, i, views[i], &e_));
    CHECK_OK(zdp_engine_sync_params(rn->eng, &e_));
    free(flat);
}

static void run_free_(run *rn) {
    zdp_engine_destroy(rn->eng);
    zdp_mlp_destroy(&rn->w.inner);
}

static float *params_copy_(run *rn) {
    const int64_t n = zdp_engine_numel(rn->eng);
    float *out = malloc((size_t)n * sizeof(float));
    for (int i = 0; i < rn->model.n_params; i++)
        CHECK_OK(zdp_engine_get_param(rn->eng, i, out + zdp_engine_param_offset(rn->eng, i), &e_));
    return out;
}

static float X_[64 * H_];
static int64_t Y_[64];

static zdp_mlp_batch batch_(int64_t j) {
    const int64_t start = ((j * W + R) * MB_) % 64;
    return (zdp_mlp_batch){.x = X_ + start * H_, .y = Y_ + start, .n = MB_};
}

/* STEPS_ unmanaged steps of one forward + backward + step each; a call
 * that fails is checked (every rank failed at the same call, the message
 * has `want` where given, the parameters did not move) and the micro-step
 * is repeated.  Returns how many calls failed. */
static int train_(run *rn, const char *want) {
    int failures = 0;
    const int64_t n = zdp_engine_numel(rn->eng);
    for (int s = 0; s < STEPS_; s++) {
        for (int attempt = 0;; attempt++) {
            CHECK(attempt < 4);
            float *before = params_copy_(rn);
            const zdp_mlp_batch b = batch_(s);
            zdp_error err = {0};
            float loss;
            int phase = 0; /* 1 forward failed, 2 backward, 3 step */
            zdp_status st = zdp_engine_forward(rn->eng, &b, &loss, &err);
            if (st != ZDP_OK) phase = 1;
            if (phase == 0 && (st = zdp_engine_backward(rn->eng, true, 1.0f, &err)) != ZDP_OK)
                phase = 2;
            if (phase == 0 && (st = zdp_engine_step(rn->eng, &err)) != ZDP_OK) phase = 3;
            /* The same call failed (or none did) on every rank. */
            const double code = (double)(10 * s + phase);
            if (!zdp_dist_all_ok(zdp_dist_mean(code) == code))
                CHECK_FAIL_("rank %d: step %d phase %d (%s): the ranks failed at different calls",
                            R, s, phase, phase ? err.msg : "ok");
            if (phase == 0) {
                free(before);
                break;
            }
            CHECK(phase != 3);
            if (want != NULL && strstr(err.msg, want) == NULL)
                CHECK_FAIL_("rank %d: message \"%s\" lacks \"%s\"", R, err.msg, want);
            if (getenv("ZDP_TEST_VERBOSE") != NULL)
                fprintf(stderr, "rank %d: step %d phase %d: %s\n", R, s, phase, err.msg);
            float *after = params_copy_(rn);
            CHECK(memcmp(before, after, (size_t)n * sizeof(float)) == 0);
            free(after);
            free(before);
            failures++;
        }
    }
    return failures;
}

static const char *json_(bool prefetch, bool overlap) {
    static char buf[1024];
    snprintf(buf, sizeof buf,
             "{\"train_micro_batch_size_per_gpu\": %d, \"gradient_accumulation_steps\": 1, "
             "\"managed_gradient_accumulation\": false, "
             "\"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": 1e-2}}, "
             "\"zero_optimization\": {\"stage\": 3, \"reduce_bucket_size\": 40, "
             "\"overlap_comm\": %s, \"stage3_param_persistence_threshold\": 0, "
             "\"stage3_prefetch_bucket_size\": %d}}",
             MB_, overlap ? "true" : "false", prefetch ? 1000 : 0);
    return buf;
}

/* The clean run's final parameters. */
static float *clean_(const char *json) {
    run rn;
    run_init_(&rn, json);
    CHECK(train_(&rn, NULL) == 0);
    float *p = params_copy_(&rn);
    run_free_(&rn);
    return p;
}

/* Allocation failures: rank W-1's N-th gather buffer, for every N the run
 * reaches (first step: the model's own gathers; later ones: prefetches). */
static void test_alloc_faults(bool prefetch, bool overlap) {
    const char *json = json_(prefetch, overlap);
    float *want = clean_(json);
    const int bad = W - 1;
    char hook[32], msg[64];
    snprintf(msg, sizeof msg, "rank %d cannot allocate", bad);
    int reached = 0;
    for (int nth = 1;; nth++) {
        snprintf(hook, sizeof hook, "%d:%d", bad, nth);
        setenv("ZDP_TEST_FAIL_GATHER", hook, 1);
        run rn;
        run_init_(&rn, json);
        unsetenv("ZDP_TEST_FAIL_GATHER");
        const int failures = train_(&rn, msg);
        float *got = params_copy_(&rn);
        if (memcmp(got, want, (size_t)zdp_engine_numel(rn.eng) * sizeof(float)) != 0)
            CHECK_FAIL_("rank %d: hook %s (%d failures): the run's parameters differ from a run "
                        "without faults",
                        R, hook, failures);
        free(got);
        run_free_(&rn);
        /* An unused prefetch fails nobody: only the end of the run says
         * the hook is past every allocation. */
        if (failures > 0) reached = nth;
        if (nth > reached + 12) break;
    }
    CHECK(reached >= 2 * L_); /* forward and backward gathers were hit */
    free(want);
}

/* One rank's model fails (forward, or backward half-way) or fetches a layer
 * the others do not: every rank's call fails, the run goes on. */
static void test_model_faults(bool prefetch, bool overlap) {
    const char *json = json_(prefetch, overlap);
    float *want = clean_(json);
    const int kinds[] = {FAULT_FWD_ERROR, FAULT_BWD_ERROR, FAULT_FWD_EXTRA_FETCH};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        /* One rank alone has nobody to part from: an extra fetch is fine. */
        if (W == 1 && kinds[k] == FAULT_FWD_EXTRA_FETCH) continue;
        for (int step = 0; step < STEPS_; step++) {
            run rn;
            run_init_(&rn, json);
            rn.w.fault_rank = W - 1;
            /* Arm the fault at the start of `step`. */
            int failures = 0;
            const int64_t n = zdp_engine_numel(rn.eng);
            for (int s = 0; s < STEPS_; s++) {
                if (s == step) rn.w.fault = kinds[k];
                for (int attempt = 0;; attempt++) {
                    CHECK(attempt < 3);
                    float *before = params_copy_(&rn);
                    const zdp_mlp_batch b = batch_(s);
                    zdp_error err = {0};
                    float loss;
                    int phase = 0;
                    if (zdp_engine_forward(rn.eng, &b, &loss, &err) != ZDP_OK) phase = 1;
                    if (phase == 0 && zdp_engine_backward(rn.eng, true, 1.0f, &err) != ZDP_OK)
                        phase = 2;
                    if (phase == 0 && zdp_engine_step(rn.eng, &err) != ZDP_OK) phase = 3;
                    const double code = (double)(10 * s + phase);
                    if (!zdp_dist_all_ok(zdp_dist_mean(code) == code))
                        CHECK_FAIL_("rank %d: fault %d at step %d: step %d phase %d (%s): the "
                                    "ranks failed at different calls",
                                    R, kinds[k], step, s, phase, phase ? err.msg : "ok");
                    if (phase == 0) {
                        free(before);
                        break;
                    }
                    CHECK(phase != 3);
                    CHECK(phase == (kinds[k] == FAULT_BWD_ERROR ? 2 : 1));
                    if (getenv("ZDP_TEST_VERBOSE") != NULL)
                        fprintf(stderr, "rank %d: fault %d step %d phase %d: %s\n", R, kinds[k],
                                s, phase, err.msg);
                    /* The failing rank's own error, or one naming it (the
                     * rank that fetched another layer names who it met). */
                    char who[32];
                    snprintf(who, sizeof who, "rank %d",
                             R == W - 1 && kinds[k] == FAULT_FWD_EXTRA_FETCH ? 0 : W - 1);
                    if (strstr(err.msg, who) == NULL)
                        CHECK_FAIL_("rank %d: \"%s\" lacks \"%s\"", R, err.msg, who);
                    float *after = params_copy_(&rn);
                    CHECK(memcmp(before, after, (size_t)n * sizeof(float)) == 0);
                    free(after);
                    free(before);
                    failures++;
                }
            }
            CHECK(failures == 1);
            float *got = params_copy_(&rn);
            CHECK(memcmp(got, want, (size_t)n * sizeof(float)) == 0);
            free(got);
            run_free_(&rn);
        }
    }
    free(want);
}

static void run_all_(void) {
    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < 64 * H_; i++) {
        const uint64_t v = zdp_splitmix64(&s);
        X_[i] = (float)((double)(v >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    }
    for (int i = 0; i < 64; i++) Y_[i] = i % H_;
    zdp_set_log(check_quiet_log, NULL);
    for (int pf = 0; pf < 2; pf++)
        for (int ov = 0; ov < 2; ov++) {
            test_alloc_faults(pf, ov);
            test_model_faults(pf, ov);
        }
}

int main(int argc, char **argv) {
    return check_dist_main(&argc, &argv, "test_zero3_faults", &W, &R, run_all_);
}
