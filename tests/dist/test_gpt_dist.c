/*
 * test_gpt_dist.c -- GPT-2 under the engine (run by CTest at -np 1, 2, 3, 4).
 *
 * A tiny GPT trained a few steps with ZeRO stages 0, 1 and 2 (buckets smaller
 * than one tensor, stage 2 also with overlap_comm), managed and unmanaged,
 * must match a single-process reference: the same model on the whole global
 * micro-batch through the dense grad sink, with clipping and SGD with momentum
 * applied in double.  The counters move as for the MLP, and the model's
 * grad-sink protocol (wte held from the lm_head to the embedding) never trips
 * the engine's misuse checks.
 *
 * SGD rather than Adam: some gradients are exactly zero in exact arithmetic
 * (the key bias: softmax ignores a constant added to every score), so in
 * float they are rounding noise whose bits depend on the reduction order, and
 * Adam would turn that noise into steps of about lr.  SGD keeps such
 * differences at noise * lr, so fp32 tolerances apply.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "engine/engine.h"
#include "zdp/zdp.h"

static int W, R;

enum { STEPS = 3, G = 2, GLOBAL_B = 12, T = 5 };
static const zdp_gpt_config CFG = {.n_layer = 2, .n_head = 2, .n_embd = 8, .vocab_size = 11,
                                   .block_size = 6};
#define LR 0.05
#define MOMENTUM 0.9
#define CLIP 0.5

static uint64_t rng_(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Token data, the same on every rank: STEPS * G global micro-batches of
 * GLOBAL_B sequences of T tokens. */
typedef struct data {
    int32_t *inputs, *targets;
} data;

static data data_make_(uint64_t seed) {
    const int64_t n = (int64_t)STEPS * G * GLOBAL_B * T;
    data d = {malloc((size_t)n * sizeof(int32_t)), malloc((size_t)n * sizeof(int32_t))};
    uint64_t s = seed;
    for (int64_t i = 0; i < n; i++) {
        d.inputs[i] = (int32_t)(rng_(&s) % (uint64_t)CFG.vocab_size);
        d.targets[i] = (int32_t)(rng_(&s) % (uint64_t)CFG.vocab_size);
    }
    return d;
}

/* Sequences [first, first + b) of global micro-batch j. */
static zdp_lm_batch batch_(const data *d, int64_t j, int64_t first, int b) {
    const int64_t off = (j * GLOBAL_B + first) * T;
    return (zdp_lm_batch){.inputs = d->inputs + off, .targets = d->targets + off, .B = b, .T = T};
}

static int64_t numel_(const zdp_param_info *pi) {
    int64_t n = 1;
    for (int d = 0; d < pi->ndim; d++) n *= pi->shape[d];
    return n;
}

/* ---- the single-process reference ------------------------------------------------ */

/* Parameters after STEPS steps of clipped SGD with momentum on the whole
 * global batch, one flat float array in registration order. */
static float *reference_(const data *d, uint64_t seed, int64_t *n_out) {
    zdp_model m;
    zdp_error err = {0};
    if (zdp_gpt_create(&CFG, GLOBAL_B, &m, &err) != ZDP_OK) CHECK_FAIL_("%s", err.msg);
    const int np = m.n_params;
    float **p = calloc((size_t)np, sizeof(float *)), **g = calloc((size_t)np, sizeof(float *));
    int64_t n = 0;
    for (int i = 0; i < np; i++) {
        p[i] = calloc((size_t)numel_(&m.params[i]), sizeof(float));
        g[i] = calloc((size_t)numel_(&m.params[i]), sizeof(float));
        n += numel_(&m.params[i]);
    }
    zdp_gpt_init_params(&m, p, seed);
    double *pd = malloc((size_t)n * sizeof(double)), *gd = malloc((size_t)n * sizeof(double));
    double *buf = calloc((size_t)n, sizeof(double));
    for (int i = 0, k = 0; i < np; i++)
        for (int64_t e = 0; e < numel_(&m.params[i]); e++) pd[k++] = p[i][e];
    for (int s = 0; s < STEPS; s++) {
        memset(gd, 0, (size_t)n * sizeof(double));
        for (int j = 0; j < G; j++) {
            for (int i = 0; i < np; i++) memset(g[i], 0, (size_t)numel_(&m.params[i]) * sizeof(float));
            zdp_lm_batch b = batch_(d, (int64_t)s * G + j, 0, GLOBAL_B);
            float loss;
            CHECK_OK(zdp_model_forward_dense(&m, (const float *const *)p, &b, &loss, &e_));
            zdp_grad_sink *sink = zdp_grad_sink_create_dense(g, np);
            CHECK_OK(zdp_model_backward_dense(&m, (const float *const *)p, 1.0f / G, sink, &e_));
            free(sink);
            for (int i = 0, k = 0; i < np; i++)
                for (int64_t e = 0; e < numel_(&m.params[i]); e++) gd[k++] += g[i][e];
        }
        double sq = 0.0;
        for (int64_t k = 0; k < n; k++) sq += gd[k] * gd[k];
        const double c = (sqrt(sq) + 1e-6) / CLIP, scale = c > 1.0 ? 1.0 / c : 1.0;
        for (int64_t k = 0; k < n; k++) {
            buf[k] = MOMENTUM * buf[k] + gd[k] * scale;
            pd[k] -= LR * buf[k];
        }
        for (int i = 0, k = 0; i < np; i++)
            for (int64_t e = 0; e < numel_(&m.params[i]); e++) p[i][e] = (float)pd[k++];
    }
    float *out = malloc((size_t)n * sizeof(float));
    for (int64_t k = 0; k < n; k++) out[k] = (float)pd[k];
    for (int i = 0; i < np; i++) {
        free(p[i]);
        free(g[i]);
    }
    free(p), free(g), free(pd), free(gd), free(buf);
    zdp_gpt_destroy(&m);
    *n_out = n;
    return out;
}

/* ---- engine runs ------------------------------------------------------------------- */

static float *train_(const data *d, int stage, bool managed, const char *extra, uint64_t seed) {
    const int b = GLOBAL_B / W;
    char json[1024];
    snprintf(json, sizeof json,
             "{\"train_batch_size\": %d, \"train_micro_batch_size_per_gpu\": %d, "
             "\"zero_allow_untested_optimizer\": true, "
             "\"gradient_clipping\": %g, \"managed_gradient_accumulation\": %s, "
             "\"optimizer\": {\"type\": \"SGD\", \"params\": {\"lr\": %g, \"momentum\": %g}}, "
             "\"zero_optimization\": {\"stage\": %d, \"reduce_bucket_size\": 50, "
             "\"allgather_bucket_size\": 100 %s}}",
             GLOBAL_B * G, b, CLIP, managed ? "true" : "false", LR, MOMENTUM, stage, extra);
    zdp_config cfg;
    zdp_error err = {0};
    if (zdp_config_load_string(json, "<test>", W, &cfg, &err) != ZDP_OK)
        CHECK_FAIL_("config: %s", err.msg);
    zdp_model m;
    zdp_engine *eng;
    if (zdp_gpt_create(&CFG, b, &m, &err) != ZDP_OK) CHECK_FAIL_("%s", err.msg);
    if (zdp_engine_create(&cfg, &m, &eng, &err) != ZDP_OK) CHECK_FAIL_("engine: %s", err.msg);
    /* Every stage through set_param / get_param: at stage 3 no rank holds
     * whole tensors for zdp_engine_param_data to show. */
    int64_t n = 0;
    for (int i = 0; i < m.n_params; i++) n += numel_(&m.params[i]);
    float *out = malloc((size_t)n * sizeof(float));
    float **views = calloc((size_t)m.n_params, sizeof(float *));
    for (int i = 0, k = 0; i < m.n_params; k += (int)numel_(&m.params[i]), i++) views[i] = out + k;
    zdp_gpt_init_params(&m, views, seed);
    for (int i = 0; i < m.n_params; i++) CHECK_OK(zdp_engine_set_param(eng, i, views[i], &e_));
    CHECK_OK(zdp_engine_sync_params(eng, &e_));
    for (int s = 0; s < STEPS; s++) {
        for (int j = 0; j < G; j++) {
            zdp_lm_batch mb = batch_(d, (int64_t)s * G + j, (int64_t)R * b, b);
            float loss;
            CHECK_OK(zdp_engine_forward(eng, &mb, &loss, &e_));
            CHECK(isfinite(loss) && loss > 0.0f);
            /* Misuse of the grad sink would make this ZDP_ERR_STATE. */
            zdp_status st = zdp_engine_backward(eng, managed, managed ? 1.0f : 1.0f / G, &err);
            if (st != ZDP_OK) CHECK_FAIL_("backward: %s", err.msg);
            /* micro_steps counts step() calls, as DeepSpeed's does. */
            CHECK_EQ_I64(zdp_engine_micro_steps(eng), managed ? (int64_t)s * G + j : (int64_t)s);
            if (managed) {
                CHECK_OK(zdp_engine_step(eng, &e_));
                CHECK(zdp_engine_was_step_applied(eng) == (j == G - 1));
                CHECK_EQ_I64(zdp_engine_micro_steps(eng), (int64_t)s * G + j + 1);
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
        CHECK_EQ_I64(zdp_engine_global_steps(eng), s + 1);
        CHECK_EQ_I64(zdp_engine_global_samples(eng), (int64_t)(s + 1) * G * GLOBAL_B);
        CHECK(isfinite(zdp_engine_last_grad_norm(eng)) && zdp_engine_last_grad_norm(eng) > 0.0);
    }
    CHECK_EQ_I64(zdp_engine_skipped_steps(eng), 0);
    /* Parameters in registration order (no assumption about the flat layout). */
    CHECK_EQ_I64(zdp_engine_numel(eng), n);
    for (int i = 0; i < m.n_params; i++) CHECK_OK(zdp_engine_get_param(eng, i, views[i], &e_));
    free(views);
    zdp_engine_destroy(eng);
    zdp_gpt_destroy(&m);
    return out;
}

static void test_stages_match_reference(void) {
    data d = data_make_(77);
    int64_t n;
    float *ref = reference_(&d, 5, &n);
    const struct {
        int stage;
        const char *extra;
    } runs[] = {{0, ""},
                {1, ""},
                {2, ""},
                {2, ", \"overlap_comm\": true"},
                /* Stage 3: every tensor gathered per layer; with overlap_comm; the
                 * default threshold (every tensor of these tiny models stays whole);
                 * a threshold that keeps only the small ones whole. */
                {3, ", \"stage3_param_persistence_threshold\": 0"},
                {3, ", \"stage3_param_persistence_threshold\": 0, \"overlap_comm\": true"},
                {3, ""},
                {3, ", \"stage3_param_persistence_threshold\": 20, \"overlap_comm\": true"}};
    const int nruns = (int)(sizeof runs / sizeof runs[0]);
    float *first = NULL;
    for (int managed = 0; managed < 2; managed++)
        for (int r = 0; r < nruns; r++) {
            float *got = train_(&d, runs[r].stage, managed, runs[r].extra, 5);
            char what[128];
            snprintf(what, sizeof what, "stage %d%s %s vs single-process reference", runs[r].stage,
                     runs[r].extra, managed ? "managed" : "unmanaged");
            CHECK_CLOSE(got, ref, n, 1e-5, 1e-6, what);
            if (first == NULL) {
                first = got;
            } else {
                snprintf(what, sizeof what, "stage %d%s %s vs stage 0 unmanaged", runs[r].stage,
                         runs[r].extra, managed ? "managed" : "unmanaged");
                CHECK_CLOSE(got, first, n, 1e-5, 1e-6, what);
                free(got);
            }
        }
    /* Training moved the parameters (the comparison is not vacuous). */
    zdp_model m;
    CHECK_OK(zdp_gpt_create(&CFG, 1, &m, &e_));
    float **p = calloc((size_t)m.n_params, sizeof(float *));
    float *init = malloc((size_t)n * sizeof(float));
    for (int i = 0, k = 0; i < m.n_params; i++) {
        p[i] = init + k;
        k += (int)numel_(&m.params[i]);
    }
    zdp_gpt_init_params(&m, p, 5);
    double moved = 0.0;
    for (int64_t k = 0; k < n; k++) moved = fmax(moved, fabs((double)first[k] - init[k]));
    CHECK(moved > 1e-3);
    free(init);
    free(p);
    zdp_gpt_destroy(&m);
    free(first);
    free(ref);
    free(d.inputs);
    free(d.targets);
}

/* The model is usable under the engine with a micro-batch smaller than the
 * max_batch it was created with, and a forward error leaves the engine
 * ready for a good forward. */
static void test_forward_error_then_train(void) {
    data d = data_make_(78);
    char json[512];
    snprintf(json, sizeof json,
             "{\"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": 1, "
             "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-3}}, "
             "\"zero_optimization\": {\"stage\": 2, \"reduce_bucket_size\": 50}}");
    zdp_config cfg;
    zdp_error err = {0};
    if (zdp_config_load_string(json, "<test>", W, &cfg, &err) != ZDP_OK) CHECK_FAIL_("%s", err.msg);
    zdp_model m;
    zdp_engine *eng;
    CHECK_OK(zdp_gpt_create(&CFG, 3, &m, &e_));
    CHECK_OK(zdp_engine_create(&cfg, &m, &eng, &e_));
    zdp_lm_batch bad = batch_(&d, 0, 0, 2);
    int32_t ids[2 * T];
    memcpy(ids, bad.inputs, sizeof ids);
    ids[T + 1] = CFG.vocab_size;
    bad.inputs = ids;
    float loss;
    CHECK_ERR(zdp_engine_forward(eng, &bad, &loss, &err), ZDP_ERR_INVALID_ARG, err, "inputs[1][1] = 11");
    zdp_lm_batch good = batch_(&d, 0, 2 * R, 2);
    CHECK_OK(zdp_engine_forward(eng, &good, &loss, &e_));
    CHECK_OK(zdp_engine_backward(eng, true, 1.0f, &e_));
    CHECK_OK(zdp_engine_step(eng, &e_));
    CHECK(zdp_engine_was_step_applied(eng));
    zdp_engine_destroy(eng);
    zdp_gpt_destroy(&m);
    free(d.inputs);
    free(d.targets);
}

void quiet_log_(int level, const char *msg, void *user);

int main(int argc, char **argv) {
    zdp_error err;
    if (zdp_dist_init(&argc, &argv, &err) != ZDP_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    W = zdp_dist_world_size();
    R = zdp_dist_rank();
    if (getenv("ZDP_TEST_VERBOSE") == NULL) zdp_set_log(quiet_log_, NULL);
    if (GLOBAL_B % W != 0) {
        if (R == 0) printf("test_gpt_dist: world size %d does not divide %d, skipped\n", W, GLOBAL_B);
        zdp_dist_finalize();
        return 0;
    }
    int n = 0;
    test_stages_match_reference(), n++;
    test_forward_error_then_train(), n++;
    if (R == 0) printf("test_gpt_dist: %d tests passed at world size %d\n", n, W);
    zdp_dist_finalize();
    return 0;
}

void quiet_log_(int level, const char *msg, void *user) {
    (void)user;
    if (strstr(msg, "memory accounting") != NULL) CHECK_FAIL_("%s", msg);
    if (level > 0) fprintf(stderr, "[rank %d] warning: %s\n", R, msg);
}
