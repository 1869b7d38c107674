/*
 * test_llama_dist.c -- the Llama family under the engine (run by CTest at
 * -np 1, 2, 3, 4).
 *
 * Two tiny models -- Llama (GQA, untied lm_head, attention biases, llama3
 * rope scaling) and Qwen3 (q/k norm, head_dim != hidden / n_head, tied
 * embeddings) -- trained a few steps with ZeRO stages 0, 1 and 2 (buckets
 * smaller than one tensor; stage 2 also with overlap_comm), managed
 * (gradient_accumulation_steps 2) and unmanaged with a different number of
 * backwards in each step (1, 3, 2), must match a single-process reference:
 * the same model on each whole global micro-batch through the dense grad
 * sink, with clipping and SGD with momentum applied in double.  The model's
 * grad-sink protocol (the tied embed_tokens held from the lm_head to the
 * embedding; q/k norm released after o_proj) never trips the engine's misuse
 * checks.  SGD rather than Adam for the reason test_gpt_dist.c gives: Adam
 * turns reduction-order rounding noise in gradients that are zero in exact
 * arithmetic into steps of about lr.
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

enum { STEPS = 3, MAX_BACKWARDS = 3, GLOBAL_B = 12, T = 5 };
static const dist_lm_sgd SGD_ = {.lr = 0.05, .momentum = 0.9, .clip = 0.5};

/* Backwards per step: managed runs use gradient_accumulation_steps 2, the
 * unmanaged ones vary it from step to step. */
static const int MANAGED_COUNTS[STEPS] = {2, 2, 2};
static const int UNMANAGED_COUNTS[STEPS] = {1, 3, 2};

static zdp_llama_config llama_cfg_(void) {
    return (zdp_llama_config){.arch = ZDP_ARCH_LLAMA, .n_layer = 2, .hidden = 8, .n_head = 4,
                              .n_kv_head = 2, .head_dim = 4, .ffn = 12, .vocab_size = 11,
                              .block_size = 6, .max_position_embeddings = 64,
                              .rms_norm_eps = 1e-5f, .rope_theta = 50.0,
                              .rope_type = ZDP_ROPE_LLAMA3, .rope_factor = 8.0,
                              .rope_low_freq_factor = 1.0, .rope_high_freq_factor = 4.0,
                              .rope_original_max_position = 16, .attention_bias = 1,
                              .initializer_range = 0.2};
}

static zdp_llama_config qwen3_cfg_(void) {
    return (zdp_llama_config){.arch = ZDP_ARCH_QWEN3, .qk_norm = 1, .n_layer = 2, .hidden = 8,
                              .n_head = 2, .n_kv_head = 1, .head_dim = 6, .ffn = 10,
                              .vocab_size = 13, .block_size = 6, .max_position_embeddings = 64,
                              .rms_norm_eps = 1e-6f, .rope_theta = 1e6,
                              .tie_word_embeddings = 1, .initializer_range = 0.2};
}

/* Token data, the same on every rank: STEPS * MAX_BACKWARDS global
 * micro-batches of GLOBAL_B sequences of T tokens. */
static dist_lm_data data_make_(int vocab, uint64_t seed) {
    return dist_lm_data_make((int64_t)STEPS * MAX_BACKWARDS, GLOBAL_B, T, vocab, seed);
}

/* ---- the single-process reference ------------------------------------------------ */

/* Parameters after STEPS steps of the reference, step s averaging counts[s]
 * whole global micro-batches; one flat array in registration order. */
static float *reference_(const zdp_llama_config *mc, const dist_lm_data *d, const int *counts,
                         uint64_t seed, int64_t *n_out) {
    zdp_model m;
    CHECK_OK(zdp_llama_create(mc, GLOBAL_B, &m, &e_));
    float **p = calloc((size_t)m.n_params, sizeof(float *));
    for (int i = 0; i < m.n_params; i++)
        p[i] = calloc((size_t)numel_(&m.params[i]), sizeof(float));
    zdp_llama_init_params(&m, p, seed);
    float *out = dist_lm_reference(&m, p, d, STEPS, counts, SGD_, n_out);
    for (int i = 0; i < m.n_params; i++) free(p[i]);
    free(p);
    zdp_llama_destroy(&m);
    return out;
}

/* ---- engine runs ------------------------------------------------------------------- */

static float *train_(const zdp_llama_config *mc, const dist_lm_data *d, int stage, bool managed,
                     const char *extra, uint64_t seed) {
    const int b = GLOBAL_B / W;
    const int *counts = managed ? MANAGED_COUNTS : UNMANAGED_COUNTS;
    zdp_config cfg;
    dist_lm_config(W, GLOBAL_B, b, MANAGED_COUNTS[0], SGD_, managed, stage, 40, extra, &cfg);
    zdp_error err = {0};
    zdp_model m;
    zdp_engine *eng;
    if (zdp_llama_create(mc, b, &m, &err) != ZDP_OK) CHECK_FAIL_("%s", err.msg);
    if (zdp_engine_create(&cfg, &m, &eng, &err) != ZDP_OK) CHECK_FAIL_("engine: %s", err.msg);
    /* Every stage through set_param / get_param: at stage 3 no rank holds
     * whole tensors for zdp_engine_param_data to show. */
    int64_t n;
    float **views;
    float *out = dist_lm_flat(&m, &views, &n);
    zdp_llama_init_params(&m, views, seed);
    for (int i = 0; i < m.n_params; i++) CHECK_OK(zdp_engine_set_param(eng, i, views[i], &e_));
    CHECK_OK(zdp_engine_sync_params(eng, &e_));
    /* The memory report carries the model's activations beside the engine's bytes. */
    zdp_memory_report mr;
    zdp_engine_memory_report(eng, &mr);
    CHECK(m.activation_bytes > 0);
    CHECK_EQ_I64(mr.activation_bytes, m.activation_bytes);
    dist_lm_train(eng, d, R, b, STEPS, counts, managed);
    CHECK_EQ_I64(zdp_engine_numel(eng), n);
    for (int i = 0; i < m.n_params; i++) CHECK_OK(zdp_engine_get_param(eng, i, views[i], &e_));
    if (stage == 3) {
        /* Only the partition is held; between passes nothing gathered is
         * live but the persistent tensors, and a run that partitions every
         * tensor gathered at most one layer plus the largest other range. */
        zdp_engine_memory_report(eng, &mr);
        CHECK_EQ_I64(mr.params_bytes, zdp_engine_partition_numel(eng) * 4);
        CHECK(zdp_engine_param_data(eng, 0) == NULL);
        int64_t persist = 0;
        const int64_t thr = cfg.zero.stage3_param_persistence_threshold;
        for (int i = 0; i < m.n_params; i++)
            if (numel_(&m.params[i]) < thr) persist += numel_(&m.params[i]);
        CHECK_EQ_I64(mr.gathered_bytes, persist * 4);
        /* The model holds one range at a time: embed_tokens, a layer, the
         * norm or lm_head. */
        const int per = (m.n_params - 2 - (mc->tie_word_embeddings ? 0 : 1)) / mc->n_layer;
        int64_t largest = numel_(&m.params[0]);
        for (int l = 0; l < mc->n_layer; l++) {
            int64_t layer = 0;
            for (int i = 1 + l * per; i < 1 + (l + 1) * per; i++) layer += numel_(&m.params[i]);
            if (layer > largest) largest = layer;
        }
        if (numel_(&m.params[m.n_params - 1]) > largest) largest = numel_(&m.params[m.n_params - 1]);
        /* Without prefetch and reuse the peak is the largest of those
         * ranges. */
        if (thr == 0 && cfg.zero.stage3_prefetch_bucket_size == 0 &&
            cfg.zero.stage3_max_reuse_distance == 0)
            CHECK_EQ_I64(mr.gathered_peak_bytes, 4 * largest);
        /* Reuse: a tied embedding is fetched at both ends of each pass; kept
         * gathered in between when the whole model is within the distance
         * and the live bound, never with distance 0. */
        if (cfg.zero.stage3_max_reuse_distance == 0) CHECK_EQ_I64(zdp_engine_reuse_hits(eng), 0);
        else if (mc->tie_word_embeddings && thr == 0 && cfg.zero.stage3_max_reuse_distance >= n &&
                 cfg.zero.stage3_max_live_parameters >= n)
            CHECK(zdp_engine_reuse_hits(eng) > 0);
        if (persist == n) CHECK_EQ_I64(mr.gathered_peak_bytes, 0);
        /* Prefetch: on by default, every fetch after the first pass of
         * each kind served ahead (the whole trace fits the default bucket);
         * off with a 0 bucket. */
        if (persist < n) {
            if (cfg.zero.stage3_prefetch_bucket_size == 0) CHECK_EQ_I64(zdp_engine_prefetch_hits(eng), 0);
            else if (cfg.zero.stage3_max_live_parameters >= n) CHECK(zdp_engine_prefetch_hits(eng) > 0);
        }
        /* The bound: what is gathered never exceeds max_live_parameters
         * beyond the one range the model itself asks for. */
        if (cfg.zero.stage3_max_live_parameters < n) {
            CHECK(mr.gathered_peak_bytes <= 4 * (cfg.zero.stage3_max_live_parameters + largest));
            CHECK(zdp_engine_prefetch_hits(eng) > 0);
        }
    }
    free(views);
    zdp_engine_destroy(eng);
    zdp_llama_destroy(&m);
    return out;
}

static void check_model_(const char *name, const zdp_llama_config *mc, uint64_t seed) {
    dist_lm_data d = data_make_(mc->vocab_size, seed + 70);
    int64_t n;
    float *ref[2];
    ref[0] = reference_(mc, &d, UNMANAGED_COUNTS, seed, &n);
    ref[1] = reference_(mc, &d, MANAGED_COUNTS, seed, &n);
    const struct {
        int stage;
        const char *extra;
    } runs[] = {{0, ""},
                {1, ""},
                {2, ""},
                {2, ", \"overlap_comm\": true"},
                /* Stage 3: every tensor gathered per layer, without and with
                 * prefetch and overlap_comm; the default threshold (every tensor
                 * of these tiny models stays whole); a threshold that keeps only
                 * the small ones whole; prefetch bounded by a small
                 * max_live_parameters and bucket. */
                {3, ", \"stage3_param_persistence_threshold\": 0, \"stage3_prefetch_bucket_size\": 0, "
                    "\"stage3_max_reuse_distance\": 0"},
                {3, ", \"stage3_param_persistence_threshold\": 0"},
                {3, ", \"stage3_param_persistence_threshold\": 0, \"overlap_comm\": true"},
                {3, ", \"stage3_param_persistence_threshold\": 0, \"overlap_comm\": true, "
                    "\"stage3_prefetch_bucket_size\": 0"},
                {3, ""},
                {3, ", \"stage3_param_persistence_threshold\": 20, \"overlap_comm\": true"},
                {3, ", \"stage3_param_persistence_threshold\": 0, \"stage3_max_live_parameters\": 200, "
                    "\"stage3_prefetch_bucket_size\": 150"},
                /* Reuse within a short distance only. */
                {3, ", \"stage3_param_persistence_threshold\": 0, \"stage3_max_reuse_distance\": 100"}};
    const int nruns = (int)(sizeof runs / sizeof runs[0]);
    float *s2 = NULL; /* stage 2's parameters (plain), the same schedule */
    for (int managed = 0; managed < 2; managed++)
        for (int r = 0; r < nruns; r++) {
            float *got = train_(mc, &d, runs[r].stage, managed, runs[r].extra, seed);
            char what[160];
            snprintf(what, sizeof what, "%s stage %d%s %s vs single-process reference", name,
                     runs[r].stage, runs[r].extra,
                     managed ? "managed" : "unmanaged (1, 3, 2 backwards)");
            CHECK_CLOSE(got, ref[managed], n, 1e-5, 1e-6, what);
            /* Stage 3 does stage 2's reductions and update on the same
             * partitions, with or without prefetch and overlap: bitwise. */
            if (runs[r].stage == 2 && runs[r].extra[0] == '\0') {
                free(s2);
                s2 = got;
                continue;
            }
            if (runs[r].stage == 3 && memcmp(got, s2, (size_t)n * sizeof(float)) != 0)
                CHECK_FAIL_("%s stage 3%s %s: not bitwise equal to stage 2", name, runs[r].extra,
                            managed ? "managed" : "unmanaged");
            free(got);
        }
    free(s2);
    /* Training moved the parameters, differently for the two schedules. */
    zdp_model m;
    CHECK_OK(zdp_llama_create(mc, 1, &m, &e_));
    float **p;
    int64_t n_init;
    float *init = dist_lm_flat(&m, &p, &n_init);
    CHECK_EQ_I64(n_init, n);
    zdp_llama_init_params(&m, p, seed);
    double moved = 0.0, apart = 0.0;
    for (int64_t k = 0; k < n; k++) {
        moved = fmax(moved, fabs((double)ref[0][k] - init[k]));
        apart = fmax(apart, fabs((double)ref[0][k] - ref[1][k]));
    }
    CHECK(moved > 1e-3);
    CHECK(apart > 1e-4);
    free(init), free(p), free(ref[0]), free(ref[1]);
    dist_lm_data_free(&d);
    zdp_llama_destroy(&m);
}

int main(int argc, char **argv) {
    int rc;
    if (!dist_lm_start(&argc, &argv, "test_llama_dist", GLOBAL_B, &W, &R, &rc)) return rc;
    const zdp_llama_config llama = llama_cfg_(), qwen3 = qwen3_cfg_();
    check_model_("llama (GQA, biases, llama3 rope, untied)", &llama, 5);
    check_model_("qwen3 (q/k norm, head_dim 6, tied)", &qwen3, 6);
    if (R == 0) printf("test_llama_dist: 2 models x 8 runs matched the reference at world size %d\n", W);
    zdp_dist_finalize();
    return 0;
}
