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
#include "engine/engine.h"
#include "zdp/zdp.h"

static int W, R;

enum { STEPS = 3, MAX_BACKWARDS = 3, GLOBAL_B = 12, T = 5 };
#define LR 0.05
#define MOMENTUM 0.9
#define CLIP 0.5

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
typedef struct data {
    int32_t *inputs, *targets;
} data;

static data data_make_(int vocab, uint64_t seed) {
    const int64_t n = (int64_t)STEPS * MAX_BACKWARDS * GLOBAL_B * T;
    data d = {malloc((size_t)n * sizeof(int32_t)), malloc((size_t)n * sizeof(int32_t))};
    uint64_t s = seed;
    for (int64_t i = 0; i < n; i++) {
        d.inputs[i] = (int32_t)(zdp_splitmix64(&s) % (uint64_t)vocab);
        d.targets[i] = (int32_t)(zdp_splitmix64(&s) % (uint64_t)vocab);
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
    for (int k = 0; k < pi->ndim; k++) n *= pi->shape[k];
    return n;
}

/* ---- the single-process reference ------------------------------------------------ */

/* Parameters after STEPS steps of clipped SGD with momentum, step s averaging
 * counts[s] whole global micro-batches; one flat array in registration order. */
static float *reference_(const zdp_llama_config *mc, const data *d, const int *counts,
                         uint64_t seed, int64_t *n_out) {
    zdp_model m;
    zdp_error err = {0};
    if (zdp_llama_create(mc, GLOBAL_B, &m, &err) != ZDP_OK) CHECK_FAIL_("%s", err.msg);
    const int np = m.n_params;
    float **p = calloc((size_t)np, sizeof(float *)), **g = calloc((size_t)np, sizeof(float *));
    int64_t n = 0;
    for (int i = 0; i < np; i++) {
        p[i] = calloc((size_t)numel_(&m.params[i]), sizeof(float));
        g[i] = calloc((size_t)numel_(&m.params[i]), sizeof(float));
        n += numel_(&m.params[i]);
    }
    zdp_llama_init_params(&m, p, seed);
    double *pd = malloc((size_t)n * sizeof(double)), *gd = malloc((size_t)n * sizeof(double));
    double *buf = calloc((size_t)n, sizeof(double));
    for (int i = 0, k = 0; i < np; i++)
        for (int64_t e = 0; e < numel_(&m.params[i]); e++) pd[k++] = p[i][e];
    int64_t mb = 0; /* global micro-batches used so far */
    for (int s = 0; s < STEPS; s++) {
        memset(gd, 0, (size_t)n * sizeof(double));
        for (int j = 0; j < counts[s]; j++, mb++) {
            for (int i = 0; i < np; i++)
                memset(g[i], 0, (size_t)numel_(&m.params[i]) * sizeof(float));
            zdp_lm_batch b = batch_(d, mb, 0, GLOBAL_B);
            float loss;
            CHECK_OK(zdp_model_forward_dense(&m, (const float *const *)p, &b, &loss, &e_));
            zdp_grad_sink *sink = zdp_grad_sink_create_dense(g, np);
            CHECK_OK(zdp_model_backward_dense(&m, (const float *const *)p, 1.0f / (float)counts[s],
                                     sink, &e_));
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
    for (int i = 0; i < np; i++) free(p[i]), free(g[i]);
    free(p), free(g), free(pd), free(gd), free(buf);
    zdp_llama_destroy(&m);
    *n_out = n;
    return out;
}

/* ---- engine runs ------------------------------------------------------------------- */

static float *train_(const zdp_llama_config *mc, const data *d, int stage, bool managed,
                     const char *extra, uint64_t seed) {
    const int b = GLOBAL_B / W;
    const int *counts = managed ? MANAGED_COUNTS : UNMANAGED_COUNTS;
    char json[1024];
    snprintf(json, sizeof json,
             "{\"train_batch_size\": %d, \"train_micro_batch_size_per_gpu\": %d, "
             "\"zero_allow_untested_optimizer\": true, "
             "\"gradient_clipping\": %g, \"managed_gradient_accumulation\": %s, "
             "\"optimizer\": {\"type\": \"SGD\", \"params\": {\"lr\": %g, \"momentum\": %g}}, "
             "\"zero_optimization\": {\"stage\": %d, \"reduce_bucket_size\": 40, "
             "\"allgather_bucket_size\": 100 %s}}",
             GLOBAL_B * MANAGED_COUNTS[0], b, CLIP, managed ? "true" : "false", LR, MOMENTUM,
             stage, extra);
    zdp_config cfg;
    zdp_error err = {0};
    if (zdp_config_load_string(json, "<test>", W, &cfg, &err) != ZDP_OK)
        CHECK_FAIL_("config: %s", err.msg);
    zdp_model m;
    zdp_engine *eng;
    if (zdp_llama_create(mc, b, &m, &err) != ZDP_OK) CHECK_FAIL_("%s", err.msg);
    if (zdp_engine_create(&cfg, &m, &eng, &err) != ZDP_OK) CHECK_FAIL_("engine: %s", err.msg);
    /* Every stage through set_param / get_param: at stage 3 no rank holds
     * whole tensors for zdp_engine_param_data to show. */
    int64_t n = 0;
    for (int i = 0; i < m.n_params; i++) n += numel_(&m.params[i]);
    float *out = malloc((size_t)n * sizeof(float));
    float **views = calloc((size_t)m.n_params, sizeof(float *));
    for (int i = 0, k = 0; i < m.n_params; k += (int)numel_(&m.params[i]), i++) views[i] = out + k;
    zdp_llama_init_params(&m, views, seed);
    for (int i = 0; i < m.n_params; i++) CHECK_OK(zdp_engine_set_param(eng, i, views[i], &e_));
    CHECK_OK(zdp_engine_sync_params(eng, &e_));
    /* The memory report carries the model's activations beside the engine's bytes. */
    zdp_memory_report mr;
    zdp_engine_memory_report(eng, &mr);
    CHECK(m.activation_bytes > 0);
    CHECK_EQ_I64(mr.activation_bytes, m.activation_bytes);
    int64_t mbi = 0;
    for (int s = 0; s < STEPS; s++) {
        for (int j = 0; j < counts[s]; j++, mbi++) {
            zdp_lm_batch mb = batch_(d, mbi, (int64_t)R * b, b);
            float loss;
            CHECK_OK(zdp_engine_forward(eng, &mb, &loss, &e_));
            CHECK(isfinite(loss) && loss > 0.0f);
            /* Misuse of the grad sink would make this ZDP_ERR_STATE. */
            zdp_status st =
                zdp_engine_backward(eng, managed, managed ? 1.0f : 1.0f / (float)counts[s], &err);
            if (st != ZDP_OK) CHECK_FAIL_("backward: %s", err.msg);
            if (managed) {
                CHECK_OK(zdp_engine_step(eng, &e_));
                CHECK(zdp_engine_was_step_applied(eng) == (j == counts[s] - 1));
            } else {
                CHECK_EQ_I64(zdp_engine_pending_backwards(eng), j + 1);
            }
        }
        if (!managed) {
            CHECK_OK(zdp_engine_step(eng, &e_));
            CHECK(zdp_engine_was_step_applied(eng));
            CHECK_EQ_I64(zdp_engine_pending_backwards(eng), 0);
        }
        CHECK_EQ_I64(zdp_engine_global_steps(eng), s + 1);
        CHECK(isfinite(zdp_engine_last_grad_norm(eng)) && zdp_engine_last_grad_norm(eng) > 0.0);
    }
    CHECK_EQ_I64(zdp_engine_skipped_steps(eng), 0);
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
    data d = data_make_(mc->vocab_size, seed + 70);
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
    float **p = calloc((size_t)m.n_params, sizeof(float *));
    float *init = malloc((size_t)n * sizeof(float));
    for (int i = 0, k = 0; i < m.n_params; i++) {
        p[i] = init + k;
        k += (int)numel_(&m.params[i]);
    }
    zdp_llama_init_params(&m, p, seed);
    double moved = 0.0, apart = 0.0;
    for (int64_t k = 0; k < n; k++) {
        moved = fmax(moved, fabs((double)ref[0][k] - init[k]));
        apart = fmax(apart, fabs((double)ref[0][k] - ref[1][k]));
    }
    CHECK(moved > 1e-3);
    CHECK(apart > 1e-4);
    free(init), free(p), free(ref[0]), free(ref[1]), free(d.inputs), free(d.targets);
    zdp_llama_destroy(&m);
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
        if (R == 0) printf("test_llama_dist: world size %d does not divide %d, skipped\n", W, GLOBAL_B);
        zdp_dist_finalize();
        return 0;
    }
    const zdp_llama_config llama = llama_cfg_(), qwen3 = qwen3_cfg_();
    check_model_("llama (GQA, biases, llama3 rope, untied)", &llama, 5);
    check_model_("qwen3 (q/k norm, head_dim 6, tied)", &qwen3, 6);
    if (R == 0) printf("test_llama_dist: 2 models x 8 runs matched the reference at world size %d\n", W);
    zdp_dist_finalize();
    return 0;
}

void quiet_log_(int level, const char *msg, void *user) {
    (void)user;
    if (strstr(msg, "memory accounting") != NULL) CHECK_FAIL_("%s", msg);
    if (level > 0) fprintf(stderr, "[rank %d] warning: %s\n", R, msg);
}
