/*
 * dist_lm.h -- what the distributed causal-LM tests (test_gpt_dist,
 * test_llama_dist, test_lora_dist) share: token data the same on every rank,
 * the single-process reference (each whole global micro-batch through the
 * dense grad sink, clipping and SGD with momentum in double), the engine's
 * SGD config, the windows each rank trains with the counters checked, and
 * the start of each test's main.
 * Header-only, as check.h: each test is one executable.
 */
#ifndef ZDP_TEST_DIST_LM_H
#define ZDP_TEST_DIST_LM_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "engine/engine.h"
#include "zdp/zdp.h"

static inline int64_t numel_(const zdp_param_info *pi) {
    int64_t n = 1;
    for (int k = 0; k < pi->ndim; k++) n *= pi->shape[k];
    return n;
}

/* One flat array of the model's *n parameter floats in registration order,
 * and in *views one pointer per tensor into it (free both). */
static inline float *dist_lm_flat(const zdp_model *m, float ***views, int64_t *n) {
    *n = 0;
    for (int i = 0; i < m->n_params; i++) *n += numel_(&m->params[i]);
    float *flat = malloc((size_t)*n * sizeof(float));
    *views = calloc((size_t)m->n_params, sizeof(float *));
    if (flat == NULL || *views == NULL) CHECK_FAIL_("out of memory for %lld floats", (long long)*n);
    for (int i = 0, k = 0; i < m->n_params; k += (int)numel_(&m->params[i]), i++)
        (*views)[i] = flat + k;
    return flat;
}

/* Token data, the same on every rank: n_batches global micro-batches of
 * global_b sequences of T tokens, ids uniform in [0, vocab). */
typedef struct dist_lm_data {
    int32_t *inputs, *targets;
    int global_b, T;
} dist_lm_data;

static inline dist_lm_data dist_lm_data_make(int64_t n_batches, int global_b, int T, int vocab,
                                             uint64_t seed) {
    const int64_t n = n_batches * global_b * T;
    dist_lm_data d = {malloc((size_t)n * sizeof(int32_t)), malloc((size_t)n * sizeof(int32_t)),
                      global_b, T};
    if (d.inputs == NULL || d.targets == NULL) CHECK_FAIL_("out of memory for %lld tokens", (long long)n);
    uint64_t s = seed;
    for (int64_t i = 0; i < n; i++) {
        d.inputs[i] = (int32_t)(zdp_splitmix64(&s) % (uint64_t)vocab);
        d.targets[i] = (int32_t)(zdp_splitmix64(&s) % (uint64_t)vocab);
    }
    return d;
}

static inline void dist_lm_data_free(dist_lm_data *d) {
    free(d->inputs);
    free(d->targets);
}

/* Sequences [first, first + b) of global micro-batch j. */
static inline zdp_lm_batch dist_lm_batch(const dist_lm_data *d, int64_t j, int64_t first, int b) {
    const int64_t off = (j * d->global_b + first) * d->T;
    return (zdp_lm_batch){.inputs = d->inputs + off, .targets = d->targets + off, .B = b,
                          .T = d->T};
}

/* Clipped SGD with momentum: the optimizer of every run. */
typedef struct dist_lm_sgd {
    double lr, momentum, clip;
} dist_lm_sgd;

/* The reference: model m from the weights p (one array per tensor, updated
 * in place) after `steps` steps, step s averaging counts[s] whole global
 * micro-batches of d (taken in order).  Returns the parameters, one flat
 * array in registration order (*n_out floats). */
static inline float *dist_lm_reference(const zdp_model *m, float *const *p, const dist_lm_data *d,
                                       int steps, const int *counts, dist_lm_sgd opt,
                                       int64_t *n_out) {
    const int np = m->n_params;
    float **g = calloc((size_t)np, sizeof(float *));
    int64_t n = 0;
    for (int i = 0; i < np; i++) {
        g[i] = calloc((size_t)numel_(&m->params[i]), sizeof(float));
        n += numel_(&m->params[i]);
    }
    double *pd = malloc((size_t)n * sizeof(double)), *gd = malloc((size_t)n * sizeof(double));
    double *buf = calloc((size_t)n, sizeof(double));
    for (int i = 0, k = 0; i < np; i++)
        for (int64_t e = 0; e < numel_(&m->params[i]); e++) pd[k++] = p[i][e];
    int64_t mb = 0; /* global micro-batches used so far */
    for (int s = 0; s < steps; s++) {
        memset(gd, 0, (size_t)n * sizeof(double));
        for (int j = 0; j < counts[s]; j++, mb++) {
            for (int i = 0; i < np; i++)
                memset(g[i], 0, (size_t)numel_(&m->params[i]) * sizeof(float));
            zdp_lm_batch b = dist_lm_batch(d, mb, 0, d->global_b);
            float loss;
            CHECK_OK(zdp_model_forward_dense(m, (const float *const *)p, &b, &loss, &e_));
            zdp_grad_sink *sink = zdp_grad_sink_create_dense(g, np);
            CHECK_OK(zdp_model_backward_dense(m, (const float *const *)p,
                                              1.0f / (float)counts[s], sink, &e_));
            free(sink);
            for (int i = 0, k = 0; i < np; i++)
                for (int64_t e = 0; e < numel_(&m->params[i]); e++) gd[k++] += g[i][e];
        }
        double sq = 0.0;
        for (int64_t k = 0; k < n; k++) sq += gd[k] * gd[k];
        const double c = (sqrt(sq) + 1e-6) / opt.clip, scale = c > 1.0 ? 1.0 / c : 1.0;
        for (int64_t k = 0; k < n; k++) {
            buf[k] = opt.momentum * buf[k] + gd[k] * scale;
            pd[k] -= opt.lr * buf[k];
        }
        for (int i = 0, k = 0; i < np; i++)
            for (int64_t e = 0; e < numel_(&m->params[i]); e++) p[i][e] = (float)pd[k++];
    }
    float *out = malloc((size_t)n * sizeof(float));
    for (int64_t k = 0; k < n; k++) out[k] = (float)pd[k];
    for (int i = 0; i < np; i++) free(g[i]);
    free(g), free(pd), free(gd), free(buf);
    *n_out = n;
    return out;
}

/* The engine config of every run: micro-batch b per rank, train_batch_size
 * global_b * accum (the managed runs' gradient_accumulation_steps), SGD as
 * opt, ZeRO `stage` with a reduce bucket of reduce_bucket elements and the
 * zero_optimization keys in extra (", \"key\": value ..." or ""). */
static inline void dist_lm_config(int W, int global_b, int b, int accum, dist_lm_sgd opt,
                                  bool managed, int stage, int reduce_bucket, const char *extra,
                                  zdp_config *cfg) {
    char json[1024];
    snprintf(json, sizeof json,
             "{\"train_batch_size\": %d, \"train_micro_batch_size_per_gpu\": %d, "
             "\"zero_allow_untested_optimizer\": true, "
             "\"gradient_clipping\": %g, \"managed_gradient_accumulation\": %s, "
             "\"optimizer\": {\"type\": \"SGD\", \"params\": {\"lr\": %g, \"momentum\": %g}}, "
             "\"zero_optimization\": {\"stage\": %d, \"reduce_bucket_size\": %d, "
             "\"allgather_bucket_size\": 100 %s}}",
             global_b * accum, b, opt.clip, managed ? "true" : "false", opt.lr, opt.momentum,
             stage, reduce_bucket, extra);
    zdp_error err = {0};
    if (zdp_config_load_string(json, "<test>", W, cfg, &err) != ZDP_OK)
        CHECK_FAIL_("config: %s", err.msg);
}

/* Rank R trains `steps` steps of d on eng, b sequences per micro-batch (its
 * slice of each global micro-batch), step s taking counts[s] backwards;
 * managed: a step() after every backward (the engine applies the last),
 * else one step() per window with backward scaled 1/counts[s].  Checks the
 * loss, that the grad sink is never misused (backward would be
 * ZDP_ERR_STATE), and the counters after every call. */
static inline void dist_lm_train(zdp_engine *eng, const dist_lm_data *d, int R, int b, int steps,
                                 const int *counts, bool managed) {
    zdp_error err = {0};
    int64_t mbi = 0, samples = 0;
    for (int s = 0; s < steps; s++) {
        for (int j = 0; j < counts[s]; j++, mbi++) {
            zdp_lm_batch mb = dist_lm_batch(d, mbi, (int64_t)R * b, b);
            float loss;
            CHECK_OK(zdp_engine_forward(eng, &mb, &loss, &e_));
            CHECK(isfinite(loss) && loss > 0.0f);
            zdp_status st =
                zdp_engine_backward(eng, managed, managed ? 1.0f : 1.0f / (float)counts[s], &err);
            if (st != ZDP_OK) CHECK_FAIL_("backward: %s", err.msg);
            /* micro_steps counts step() calls, as DeepSpeed's does. */
            CHECK_EQ_I64(zdp_engine_micro_steps(eng), managed ? mbi : (int64_t)s);
            if (managed) {
                CHECK_OK(zdp_engine_step(eng, &e_));
                CHECK(zdp_engine_was_step_applied(eng) == (j == counts[s] - 1));
                CHECK_EQ_I64(zdp_engine_micro_steps(eng), mbi + 1);
            } else {
                CHECK_EQ_I64(zdp_engine_pending_backwards(eng), j + 1);
            }
        }
        if (!managed) {
            CHECK_OK(zdp_engine_step(eng, &e_));
            CHECK(zdp_engine_was_step_applied(eng));
            CHECK_EQ_I64(zdp_engine_pending_backwards(eng), 0);
            CHECK_EQ_I64(zdp_engine_micro_steps(eng), s + 1);
        }
        samples += (int64_t)counts[s] * d->global_b;
        CHECK_EQ_I64(zdp_engine_global_steps(eng), s + 1);
        CHECK_EQ_I64(zdp_engine_global_samples(eng), samples);
        CHECK(isfinite(zdp_engine_last_grad_norm(eng)) && zdp_engine_last_grad_norm(eng) > 0.0);
    }
    CHECK_EQ_I64(zdp_engine_skipped_steps(eng), 0);
}

/* The start of a test's main: MPI up, *W and *R set, the log quiet unless
 * ZDP_TEST_VERBOSE is set.  false when the test does not run, with *rc its
 * exit status: MPI did not start (1, the message printed), or the global
 * batch global_b does not divide over the W ranks (0, rank 0 says it is
 * skipped; MPI finalized). */
static inline bool dist_lm_start(int *argc, char ***argv, const char *name, int global_b, int *W,
                                 int *R, int *rc) {
    zdp_error err;
    if (zdp_dist_init(argc, argv, &err) != ZDP_OK) {
        fprintf(stderr, "%s: %s\n", name, err.msg);
        *rc = 1;
        return false;
    }
    *W = zdp_dist_world_size();
    *R = zdp_dist_rank();
    if (getenv("ZDP_TEST_VERBOSE") == NULL) zdp_set_log(check_quiet_log, NULL);
    if (global_b % *W == 0) return true;
    if (*R == 0) printf("%s: world size %d does not divide %d, skipped\n", name, *W, global_b);
    zdp_dist_finalize();
    *rc = 0;
    return false;
}

#endif /* ZDP_TEST_DIST_LM_H */
