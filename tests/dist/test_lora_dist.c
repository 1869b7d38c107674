/*
 * test_lora_dist.c -- LoRA under the engine (run by CTest at -np 1, 2, 3, 4).
 *
 * LoRA models over a Qwen3 base (q/k norm, tied embeddings, GQA; every
 * target, lm_head included) and a GPT-2 base (Conv1D sites; attention and
 * MLP) trained a few steps with ZeRO stages 0, 1 and 2 (buckets smaller
 * than one adapter; stage 2 also with overlap_comm; stage 3 with the base
 * partitioned and gathered layer by layer, its memory checked), managed
 * (gradient_accumulation_steps 2) and unmanaged with 1, 3, 2 backwards per
 * step, must match a single-process reference: the same LoRA model on each
 * whole global micro-batch through the dense grad sink, clipping and SGD
 * with momentum in double (SGD for the reason test_gpt_dist.c gives).  The
 * engine holds only the adapters (its numel is theirs), and the base
 * weights, which the engine never sees, stay bitwise unchanged.
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

static const int MANAGED_COUNTS[STEPS] = {2, 2, 2};
static const int UNMANAGED_COUNTS[STEPS] = {1, 3, 2};

/* A base: Qwen3 (gpt == 0) or GPT-2, with weights from its seed. */
typedef struct base_spec {
    int gpt;
    zdp_lora_config lora;
} base_spec;

static const zdp_llama_config QWEN3_ = {.arch = ZDP_ARCH_QWEN3, .qk_norm = 1, .n_layer = 2,
                                        .hidden = 8, .n_head = 2, .n_kv_head = 1, .head_dim = 6,
                                        .ffn = 10, .vocab_size = 13, .block_size = 6,
                                        .max_position_embeddings = 64, .rms_norm_eps = 1e-6f,
                                        .rope_theta = 1e6, .tie_word_embeddings = 1,
                                        .initializer_range = 0.2};
static const zdp_gpt_config GPT_ = {.n_layer = 2, .n_head = 2, .n_embd = 8, .vocab_size = 13,
                                    .block_size = 6};

/* The base model and its weights (one allocation per tensor). */
static float **base_make_(const base_spec *b, int max_batch, zdp_model *m) {
    if (b->gpt) CHECK_OK(zdp_gpt_create(&GPT_, max_batch, m, &e_));
    else CHECK_OK(zdp_llama_create(&QWEN3_, max_batch, m, &e_));
    float **p = calloc((size_t)m->n_params, sizeof(float *));
    for (int i = 0; i < m->n_params; i++) p[i] = calloc((size_t)numel_(&m->params[i]), sizeof(float));
    if (b->gpt) {
        zdp_gpt_init_params(m, p, 41);
        for (int i = 0; i < m->n_params; i++) /* wider than 0.02: visible gradients */
            if (m->params[i].ndim == 2)
                for (int64_t k = 0; k < numel_(&m->params[i]); k++) p[i][k] *= 10.0f;
    } else {
        zdp_llama_init_params(m, p, 41);
    }
    return p;
}

static void base_free_(zdp_model *m, float **p) {
    for (int i = 0; i < m->n_params; i++) free(p[i]);
    free(p);
    zdp_model_destroy(m);
}

/* Every base tensor equals a fresh copy from the same seed, bitwise. */
static void check_base_unchanged_(const base_spec *b, const zdp_model *m, float **p) {
    zdp_model fresh;
    float **q = base_make_(b, 1, &fresh);
    for (int i = 0; i < m->n_params; i++)
        if (memcmp(p[i], q[i], (size_t)numel_(&m->params[i]) * sizeof(float)) != 0)
            CHECK_FAIL_("base tensor %s changed", m->params[i].name);
    base_free_(&fresh, q);
}
/* Token data, the same on every rank: STEPS * MAX_BACKWARDS global
 * micro-batches of GLOBAL_B sequences of T tokens. */
static dist_lm_data data_make_(int vocab, uint64_t seed) {
    return dist_lm_data_make((int64_t)STEPS * MAX_BACKWARDS, GLOBAL_B, T, vocab, seed);
}

/* ---- the single-process reference ------------------------------------------------ */

/* Parameters after STEPS steps of the reference, step s averaging counts[s]
 * whole global micro-batches; one flat array in registration order. */
static float *reference_(const base_spec *bs, const dist_lm_data *d, const int *counts,
                         int64_t *n_out) {
    zdp_model base, m;
    float **bp = base_make_(bs, GLOBAL_B, &base);
    CHECK_OK(zdp_lora_create(&base, (const float *const *)bp, &bs->lora, &m, &e_));
    float **p = calloc((size_t)m.n_params, sizeof(float *));
    for (int i = 0; i < m.n_params; i++)
        p[i] = calloc((size_t)numel_(&m.params[i]), sizeof(float));
    zdp_lora_init_params(&m, p);
    float *out = dist_lm_reference(&m, p, d, STEPS, counts, SGD_, n_out);
    for (int i = 0; i < m.n_params; i++) free(p[i]);
    free(p);
    zdp_lora_destroy(&m);
    check_base_unchanged_(bs, &base, bp);
    base_free_(&base, bp);
    return out;
}

/* ---- engine runs ------------------------------------------------------------------- */

static float *train_(const base_spec *bs, const dist_lm_data *d, int stage, bool managed,
                     const char *extra) {
    const int b = GLOBAL_B / W;
    const int *counts = managed ? MANAGED_COUNTS : UNMANAGED_COUNTS;
    zdp_config cfg;
    dist_lm_config(W, GLOBAL_B, b, MANAGED_COUNTS[0], SGD_, managed, stage, 20, extra, &cfg);
    zdp_error err = {0};
    zdp_model base, m;
    zdp_engine *eng;
    float **bp = base_make_(bs, b, &base);
    CHECK_OK(zdp_lora_create(&base, (const float *const *)bp, &bs->lora, &m, &e_));
    if (zdp_engine_create(&cfg, &m, &eng, &err) != ZDP_OK) CHECK_FAIL_("engine: %s", err.msg);
    /* Stage 3 holds its own partition of the base: the caller's whole copy
     * is not read again (a caller short of memory could free it here), so
     * it is poisoned with NaN until the engine is gone. */
    float **saved = NULL;
    if (stage == 3) {
        saved = calloc((size_t)base.n_params, sizeof(float *));
        for (int i = 0; i < base.n_params; i++) {
            const size_t bytes = (size_t)numel_(&base.params[i]) * sizeof(float);
            saved[i] = malloc(bytes);
            memcpy(saved[i], bp[i], bytes);
            for (int64_t k = 0; k < numel_(&base.params[i]); k++) bp[i][k] = NAN;
        }
    }
    /* Through set_param, which every stage has (stage 3 holds no whole
     * adapter for zdp_engine_param_data to show). */
    int64_t n = 0;
    for (int i = 0; i < m.n_params; i++) n += numel_(&m.params[i]);
    float *flat = malloc((size_t)n * sizeof(float));
    float **views = calloc((size_t)m.n_params, sizeof(float *));
    for (int i = 0, k = 0; i < m.n_params; k += (int)numel_(&m.params[i]), i++) views[i] = flat + k;
    zdp_lora_init_params(&m, views);
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
    float *out = flat;
    if (stage == 3) {
        /* The base is held as this rank's partition (a multiple of 2W
         * padded, over W), never whole: what is gathered at a time stays
         * below the whole base when every tensor is partitioned. */
        int64_t base_n = 0;
        for (int i = 0; i < base.n_params; i++) base_n += numel_(&base.params[i]);
        const int64_t padded = (base_n + 2 * W - 1) / (2 * W) * (2 * W);
        zdp_engine_memory_report(eng, &mr);
        CHECK_EQ_I64(mr.frozen_bytes, 4 * (padded / W));
        CHECK_EQ_I64(mr.params_bytes, 4 * zdp_engine_partition_numel(eng));
        if (strstr(extra, "threshold\": 0") != NULL) {
            CHECK(mr.gathered_peak_bytes > 0);
            if (mr.gathered_peak_bytes >= 4 * base_n)
                CHECK_FAIL_("%s: gathered peak %lld B, the whole base %lld B", extra,
                            (long long)mr.gathered_peak_bytes, (long long)(4 * base_n));
        }
    } else {
        zdp_engine_memory_report(eng, &mr);
        CHECK_EQ_I64(mr.frozen_bytes, 0);
    }
    free(views);
    zdp_engine_destroy(eng);
    for (int i = 0; saved != NULL && i < base.n_params; i++) {
        memcpy(bp[i], saved[i], (size_t)numel_(&base.params[i]) * sizeof(float));
        free(saved[i]);
    }
    free(saved);
    zdp_lora_destroy(&m);
    check_base_unchanged_(bs, &base, bp);
    base_free_(&base, bp);
    return out;
}

static void check_model_(const char *name, const base_spec *bs, uint64_t seed) {
    dist_lm_data d = data_make_(13, seed + 70);
    int64_t n;
    float *ref[2];
    ref[0] = reference_(bs, &d, UNMANAGED_COUNTS, &n);
    ref[1] = reference_(bs, &d, MANAGED_COUNTS, &n);
    const struct {
        int stage;
        const char *extra;
    } runs[] = {{0, ""}, {1, ""}, {2, ""}, {2, ", \"overlap_comm\": true"},
                /* Stage 3: the adapters partitioned, and the base too
                 * (zdp_frozen), gathered layer by layer; without and with
                 * prefetch, a live bound smaller than the base, overlap. */
                {3, ", \"stage3_param_persistence_threshold\": 0, \"stage3_prefetch_bucket_size\": 0"},
                {3, ", \"stage3_param_persistence_threshold\": 0, \"overlap_comm\": true, "
                    "\"stage3_max_live_parameters\": 300, \"stage3_prefetch_bucket_size\": 200"},
                {3, ""}};
    const int nruns = (int)(sizeof runs / sizeof runs[0]);
    for (int managed = 0; managed < 2; managed++)
        for (int r = 0; r < nruns; r++) {
            float *got = train_(bs, &d, runs[r].stage, managed, runs[r].extra);
            char what[160];
            snprintf(what, sizeof what, "%s stage %d%s %s vs single-process reference", name,
                     runs[r].stage, runs[r].extra,
                     managed ? "managed" : "unmanaged (1, 3, 2 backwards)");
            CHECK_CLOSE(got, ref[managed], n, 1e-5, 1e-6, what);
            free(got);
        }
    /* Training moved the adapters (A too: B left zero after the first step), differently for
     * the two schedules. */
    zdp_model base, m;
    float **bp = base_make_(bs, 1, &base);
    CHECK_OK(zdp_lora_create(&base, (const float *const *)bp, &bs->lora, &m, &e_));
    float **p;
    int64_t n_init;
    float *init = dist_lm_flat(&m, &p, &n_init);
    CHECK_EQ_I64(n_init, n);
    zdp_lora_init_params(&m, p);
    double moved_a = 0.0, moved_b = 0.0, apart = 0.0;
    for (int i = 0, k = 0; i < m.n_params; i++)
        for (int64_t e = 0; e < numel_(&m.params[i]); e++, k++) {
            const double dv = fabs((double)ref[0][k] - init[k]);
            if (i % 2 == 0) moved_a = fmax(moved_a, dv);
            else moved_b = fmax(moved_b, dv);
            apart = fmax(apart, fabs((double)ref[0][k] - ref[1][k]));
        }
    CHECK(moved_a > 1e-4);
    CHECK(moved_b > 1e-3);
    CHECK(apart > 1e-4);
    free(init), free(p), free(ref[0]), free(ref[1]);
    dist_lm_data_free(&d);
    zdp_lora_destroy(&m);
    base_free_(&base, bp);
}


int main(int argc, char **argv) {
    int rc;
    if (!dist_lm_start(&argc, &argv, "test_lora_dist", GLOBAL_B, &W, &R, &rc)) return rc;
    const base_spec qwen3 = {.gpt = 0, .lora = {.rank = 2, .alpha = 8, .targets = ZDP_LORA_ALL, .seed = 3}};
    const base_spec gpt = {.gpt = 1, .lora = {.rank = 3, .alpha = 32, .targets = ZDP_LORA_ATTN | ZDP_LORA_MLP, .seed = 4}};
    check_model_("LoRA r2 all targets over qwen3 (tied)", &qwen3, 6);
    check_model_("LoRA r3 attn+mlp over gpt-2", &gpt, 7);
    if (R == 0) printf("test_lora_dist: 2 models x 14 runs matched the reference at world size %d\n", W);
    zdp_dist_finalize();
    return 0;
}
