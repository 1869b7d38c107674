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
#include "common/dist_lm.h"
#include "engine/engine.h"
#include "zdp/zdp.h"

static int W, R;

enum { STEPS = 3, G = 2, GLOBAL_B = 12, T = 5 };
static const zdp_gpt_config CFG = {.n_layer = 2, .n_head = 2, .n_embd = 8, .vocab_size = 11,
                                   .block_size = 6};
static const dist_lm_sgd SGD_ = {.lr = 0.05, .momentum = 0.9, .clip = 0.5};
static const int COUNTS[STEPS] = {G, G, G};

static dist_lm_data data_make_(uint64_t seed) {
    return dist_lm_data_make((int64_t)STEPS * G, GLOBAL_B, T, CFG.vocab_size, seed);
}

/* Parameters after STEPS steps of the reference on the whole global batch,
 * one flat float array in registration order. */
static float *reference_(const dist_lm_data *d, uint64_t seed, int64_t *n_out) {
    zdp_model m;
    CHECK_OK(zdp_gpt_create(&CFG, GLOBAL_B, &m, &e_));
    float **p = calloc((size_t)m.n_params, sizeof(float *));
    for (int i = 0; i < m.n_params; i++)
        p[i] = calloc((size_t)numel_(&m.params[i]), sizeof(float));
    zdp_gpt_init_params(&m, p, seed);
    float *out = dist_lm_reference(&m, p, d, STEPS, COUNTS, SGD_, n_out);
    for (int i = 0; i < m.n_params; i++) free(p[i]);
    free(p);
    zdp_gpt_destroy(&m);
    return out;
}

/* ---- engine runs ------------------------------------------------------------------- */

static float *train_(const dist_lm_data *d, int stage, bool managed, const char *extra,
                     uint64_t seed) {
    const int b = GLOBAL_B / W;
    zdp_config cfg;
    dist_lm_config(W, GLOBAL_B, b, G, SGD_, managed, stage, 50, extra, &cfg);
    zdp_error err = {0};
    zdp_model m;
    zdp_engine *eng;
    if (zdp_gpt_create(&CFG, b, &m, &err) != ZDP_OK) CHECK_FAIL_("%s", err.msg);
    if (zdp_engine_create(&cfg, &m, &eng, &err) != ZDP_OK) CHECK_FAIL_("engine: %s", err.msg);
    /* Every stage through set_param / get_param: at stage 3 no rank holds
     * whole tensors for zdp_engine_param_data to show. */
    int64_t n;
    float **views;
    float *out = dist_lm_flat(&m, &views, &n);
    zdp_gpt_init_params(&m, views, seed);
    for (int i = 0; i < m.n_params; i++) CHECK_OK(zdp_engine_set_param(eng, i, views[i], &e_));
    CHECK_OK(zdp_engine_sync_params(eng, &e_));
    dist_lm_train(eng, d, R, b, STEPS, COUNTS, managed);
    /* Parameters in registration order (no assumption about the flat layout). */
    CHECK_EQ_I64(zdp_engine_numel(eng), n);
    for (int i = 0; i < m.n_params; i++) CHECK_OK(zdp_engine_get_param(eng, i, views[i], &e_));
    free(views);
    zdp_engine_destroy(eng);
    zdp_gpt_destroy(&m);
    return out;
}

static void test_stages_match_reference(void) {
    dist_lm_data d = data_make_(77);
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
    float **p;
    int64_t n_init;
    float *init = dist_lm_flat(&m, &p, &n_init);
    CHECK_EQ_I64(n_init, n);
    zdp_gpt_init_params(&m, p, 5);
    double moved = 0.0;
    for (int64_t k = 0; k < n; k++) moved = fmax(moved, fabs((double)first[k] - init[k]));
    CHECK(moved > 1e-3);
    free(init);
    free(p);
    zdp_gpt_destroy(&m);
    free(first);
    free(ref);
    dist_lm_data_free(&d);
}

/* The model is usable under the engine with a micro-batch smaller than the
 * max_batch it was created with, and a forward error leaves the engine
 * ready for a good forward. */
static void test_forward_error_then_train(void) {
    dist_lm_data d = data_make_(78);
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
    zdp_lm_batch bad = dist_lm_batch(&d, 0, 0, 2);
    int32_t ids[2 * T];
    memcpy(ids, bad.inputs, sizeof ids);
    ids[T + 1] = CFG.vocab_size;
    bad.inputs = ids;
    float loss;
    CHECK_ERR(zdp_engine_forward(eng, &bad, &loss, &err), ZDP_ERR_INVALID_ARG, err, "inputs[1][1] = 11");
    zdp_lm_batch good = dist_lm_batch(&d, 0, 2 * R, 2);
    CHECK_OK(zdp_engine_forward(eng, &good, &loss, &e_));
    CHECK_OK(zdp_engine_backward(eng, true, 1.0f, &e_));
    CHECK_OK(zdp_engine_step(eng, &e_));
    CHECK(zdp_engine_was_step_applied(eng));
    zdp_engine_destroy(eng);
    zdp_gpt_destroy(&m);
    dist_lm_data_free(&d);
}

int main(int argc, char **argv) {
    int rc;
    if (!dist_lm_start(&argc, &argv, "test_gpt_dist", GLOBAL_B, &W, &R, &rc)) return rc;
    int n = 0;
    test_stages_match_reference(), n++;
    test_forward_error_then_train(), n++;
    if (R == 0) printf("test_gpt_dist: %d tests passed at world size %d\n", n, W);
    zdp_dist_finalize();
    return 0;
}
