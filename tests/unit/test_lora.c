/*
 * test_lora.c -- LoRA (zdp/lora.h): adapter names, shapes and order for
 * GPT-2 and the Llama family; a fresh adapter (B = 0) leaves the base's loss
 * and logits bitwise unchanged; finite differences of every adapter tensor
 * (Llama GQA untied with every target, Qwen3 tied with the lm_head adapter,
 * GPT-2's Conv1D sites, lm_head alone); base weights bitwise unchanged and
 * no base gradient asked of the sink; two LoRA models over one base; the
 * merge (W + (alpha/r) B A, Conv1D transposed, the tied head untied) against
 * the LoRA model's own loss and a double product; the PEFT folder written
 * and read back; every refusal naming its field.
 */
#define _DEFAULT_SOURCE /* mkdtemp */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine/engine.h"
#include "zdp/zdp.h"

static float uniform_(uint64_t *s) {
    return (float)((double)(zdp_splitmix64(s) >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

static int64_t numel_(const zdp_param_info *p) {
    int64_t n = 1;
    for (int d = 0; d < p->ndim; d++) n *= p->shape[d];
    return n;
}

static float **alloc_params_(const zdp_model *m) {
    float **p = calloc((size_t)m->n_params, sizeof *p);
    for (int i = 0; i < m->n_params; i++) p[i] = calloc((size_t)numel_(&m->params[i]), sizeof(float));
    return p;
}

static void free_params_(const zdp_model *m, float **p) {
    for (int i = 0; i < m->n_params; i++) free(p[i]);
    free(p);
}

static zdp_llama_config tiny_llama_(void) {
    return (zdp_llama_config){.arch = ZDP_ARCH_LLAMA, .n_layer = 2, .hidden = 8, .n_head = 4,
                              .n_kv_head = 2, .head_dim = 2, .ffn = 12, .vocab_size = 11,
                              .block_size = 6, .max_position_embeddings = 32,
                              .rms_norm_eps = 1e-5f, .rope_theta = 10000.0,
                              .initializer_range = 0.3};
}

static zdp_llama_config tiny_qwen3_(void) {
    zdp_llama_config c = tiny_llama_();
    c.arch = ZDP_ARCH_QWEN3;
    c.qk_norm = 1;
    c.head_dim = 6;
    c.tie_word_embeddings = 1;
    c.rms_norm_eps = 1e-6f;
    return c;
}

static const zdp_gpt_config tiny_gpt_ = {.n_layer = 2, .n_head = 2, .n_embd = 8,
                                         .vocab_size = 11, .block_size = 6};

/* A base model with seeded weights, a LoRA model over it, a batch. */
typedef struct fx {
    zdp_model base, m;
    float **bp, **bcopy, **p, **g;
    int32_t inputs[12], targets[12];
    zdp_lm_batch batch;
} fx;

static void fx_init_(fx *f, const zdp_llama_config *lc, const zdp_gpt_config *gc,
                     zdp_lora_config lcfg, float b_scale) {
    zdp_error err;
    memset(f, 0, sizeof *f);
    if (lc != NULL) {
        if (zdp_llama_create(lc, 2, &f->base, &err) != ZDP_OK) fail_msg("%s", err.msg);
    } else if (zdp_gpt_create(gc, 2, &f->base, &err) != ZDP_OK) {
        fail_msg("%s", err.msg);
    }
    f->bp = alloc_params_(&f->base);
    f->bcopy = alloc_params_(&f->base);
    if (lc != NULL) zdp_llama_init_params(&f->base, f->bp, 3);
    else {
        zdp_gpt_init_params(&f->base, f->bp, 3);
        /* GPT-2's 0.02 init makes a near-uniform softmax; wider weights give
         * the finite differences something to see. */
        for (int i = 0; i < f->base.n_params; i++)
            if (f->base.params[i].ndim == 2)
                for (int64_t k = 0; k < numel_(&f->base.params[i]); k++) f->bp[i][k] *= 15.0f;
    }
    for (int i = 0; i < f->base.n_params; i++)
        memcpy(f->bcopy[i], f->bp[i], (size_t)numel_(&f->base.params[i]) * sizeof(float));
    if (zdp_lora_create(&f->base, (const float *const *)f->bp, &lcfg, &f->m, &err) != ZDP_OK)
        fail_msg("%s", err.msg);
    f->p = alloc_params_(&f->m);
    f->g = alloc_params_(&f->m);
    zdp_lora_init_params(&f->m, f->p);
    uint64_t s = 17;
    /* B != 0 so that A's gradient is not zero. */
    for (int i = 1; i < f->m.n_params; i += 2)
        for (int64_t k = 0; k < numel_(&f->m.params[i]); k++) f->p[i][k] = b_scale * uniform_(&s);
    for (int i = 0; i < 12; i++) {
        f->inputs[i] = (int32_t)(zdp_splitmix64(&s) % 11);
        f->targets[i] = (int32_t)(zdp_splitmix64(&s) % 11);
    }
    f->batch = (zdp_lm_batch){.inputs = f->inputs, .targets = f->targets, .B = 2, .T = 6};
}

static void fx_free_(fx *f) {
    free_params_(&f->m, f->p);
    free_params_(&f->m, f->g);
    zdp_lora_destroy(&f->m);
    free_params_(&f->base, f->bp);
    free_params_(&f->base, f->bcopy);
    zdp_model_destroy(&f->base);
}

static float loss_(const zdp_model *m, float *const *p, const zdp_lm_batch *b) {
    float loss;
    zdp_error err;
    if (zdp_model_forward_dense(m, (const float *const *)p, b, &loss, &err) != ZDP_OK)
        fail_msg("%s", err.msg);
    return loss;
}

/* Forward + backward (dloss) into f->g through a dense sink. */
static void grad_(fx *f, float dloss) {
    for (int i = 0; i < f->m.n_params; i++)
        memset(f->g[i], 0, (size_t)numel_(&f->m.params[i]) * sizeof(float));
    loss_(&f->m, f->p, &f->batch);
    zdp_error err;
    zdp_grad_sink *sink = zdp_grad_sink_create_dense(f->g, f->m.n_params);
    if (zdp_model_backward_dense(&f->m, (const float *const *)f->p, dloss, sink, &err) != ZDP_OK)
        fail_msg("%s", err.msg);
    free(sink);
}

static void assert_base_unchanged_(const fx *f) {
    for (int i = 0; i < f->base.n_params; i++)
        if (memcmp(f->bp[i], f->bcopy[i], (size_t)numel_(&f->base.params[i]) * sizeof(float)))
            fail_msg("base tensor %s changed", f->base.params[i].name);
}

/* ---- names and shapes ------------------------------------------------------------ */

static void test_names_llama(void **state) {
    (void)state;
    fx f;
    zdp_llama_config c = tiny_llama_();
    fx_init_(&f, &c, NULL, (zdp_lora_config){.rank = 3, .alpha = 32, .targets = ZDP_LORA_ALL}, 0);
    assert_int_equal(f.m.n_params, 2 * (2 * 7 + 1));
    const struct { int i; const char *name; int64_t s0, s1; } want[] = {
        {0, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", 3, 8},
        {1, "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight", 8, 3},
        {3, "base_model.model.model.layers.0.self_attn.k_proj.lora_B.weight", 4, 3},
        {6, "base_model.model.model.layers.0.self_attn.o_proj.lora_A.weight", 3, 8},
        {12, "base_model.model.model.layers.0.mlp.down_proj.lora_A.weight", 3, 12},
        {13, "base_model.model.model.layers.0.mlp.down_proj.lora_B.weight", 8, 3},
        {28, "base_model.model.lm_head.lora_A.weight", 3, 8},
        {29, "base_model.model.lm_head.lora_B.weight", 11, 3},
    };
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
        const zdp_param_info *p = &f.m.params[want[k].i];
        if (strcmp(p->name, want[k].name) != 0) fail_msg("%s, want %s", p->name, want[k].name);
        assert_int_equal(p->shape[0], want[k].s0);
        assert_int_equal(p->shape[1], want[k].s1);
    }
    assert_non_null(strstr(f.m.shape_json, "\"model\":\"lora-llama\""));
    assert_non_null(strstr(f.m.shape_json, "\"lora_rank\":3"));
    assert_non_null(strstr(f.m.shape_json, "\"n_kv_head\":2"));
    assert_ptr_equal(zdp_lora_base_of(&f.m), &f.base);
    assert_int_equal(zdp_lora_config_of(&f.m)->rank, 3);
    /* A is U(-1/sqrt(in), 1/sqrt(in)), B zero. */
    zdp_lora_init_params(&f.m, f.p);
    double amax = 0.0;
    for (int64_t k = 0; k < 3 * 12; k++) amax = fmax(amax, fabs(f.p[12][k]));
    assert_true(amax <= 1.0 / sqrt(12.0) && amax > 0.5 / sqrt(12.0));
    for (int64_t k = 0; k < 8 * 3; k++) assert_true(f.p[13][k] == 0.0f);
    fx_free_(&f);
}

static void test_names_gpt(void **state) {
    (void)state;
    fx f;
    fx_init_(&f, NULL, &tiny_gpt_, (zdp_lora_config){.rank = 2, .alpha = 16, .targets = ZDP_LORA_ATTN | ZDP_LORA_MLP}, 0);
    assert_int_equal(f.m.n_params, 2 * 2 * 4);
    const struct { int i; const char *name; int64_t s0, s1; } want[] = {
        {0, "base_model.model.transformer.h.0.attn.c_attn.lora_A.weight", 2, 8},
        {1, "base_model.model.transformer.h.0.attn.c_attn.lora_B.weight", 24, 2},
        {3, "base_model.model.transformer.h.0.attn.c_proj.lora_B.weight", 8, 2},
        {5, "base_model.model.transformer.h.0.mlp.c_fc.lora_B.weight", 32, 2},
        {6, "base_model.model.transformer.h.0.mlp.c_proj.lora_A.weight", 2, 32},
        {15, "base_model.model.transformer.h.1.mlp.c_proj.lora_B.weight", 8, 2},
    };
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
        const zdp_param_info *p = &f.m.params[want[k].i];
        if (strcmp(p->name, want[k].name) != 0) fail_msg("%s, want %s", p->name, want[k].name);
        assert_int_equal(p->shape[0], want[k].s0);
        assert_int_equal(p->shape[1], want[k].s1);
    }
    assert_non_null(strstr(f.m.shape_json, "\"model\":\"lora-gpt"));
    fx_free_(&f);
}

/* ---- a fresh adapter is the base -------------------------------------------------- */

static void check_fresh_(const zdp_llama_config *lc, const zdp_gpt_config *gc) {
    fx f;
    fx_init_(&f, lc, gc, (zdp_lora_config){.rank = 2, .alpha = 32, .targets = ZDP_LORA_ALL, .seed = 5}, 0);
    zdp_lora_init_params(&f.m, f.p); /* B = 0 */
    const float lb = loss_(&f.base, f.bp, &f.batch), ll = loss_(&f.m, f.p, &f.batch);
    if (memcmp(&lb, &ll, sizeof lb) != 0) fail_msg("fresh adapter: loss %.9g, base %.9g", ll, lb);
    float a[11], b[11];
    zdp_error err;
    assert_int_equal(zdp_lm_next_logits(&f.base, (const float *const *)f.bp, f.inputs, 5, a, &err), ZDP_OK);
    assert_int_equal(zdp_lm_next_logits(&f.m, (const float *const *)f.p, f.inputs, 5, b, &err), ZDP_OK);
    assert_memory_equal(a, b, sizeof a);
    /* A non-zero adapter changes the logits: the hook is live in next_logits. */
    f.p[f.m.n_params - 1][0] = 1.0f;
    f.p[f.m.n_params - 1][1] = -1.0f;
    assert_int_equal(zdp_lm_next_logits(&f.m, (const float *const *)f.p, f.inputs, 5, b, &err), ZDP_OK);
    assert_true(memcmp(a, b, sizeof a) != 0);
    fx_free_(&f);
}

static void test_fresh_is_base(void **state) {
    (void)state;
    zdp_llama_config l = tiny_llama_(), q = tiny_qwen3_();
    check_fresh_(&l, NULL);
    check_fresh_(&q, NULL);
    check_fresh_(NULL, &tiny_gpt_);
}

/* ---- finite differences ------------------------------------------------------------ */

static double obj_(fx *f, float dloss) { return dloss * (double)loss_(&f->m, f->p, &f->batch); }

static void check_fd_modules_(const zdp_llama_config *lc, const zdp_gpt_config *gc, int targets,
                              int modules, float b_scale) {
    fx f;
    fx_init_(&f, lc, gc,
             (zdp_lora_config){.rank = 2, .alpha = 6, .targets = targets, .seed = 9,
                               .modules = modules},
             b_scale);
    const float dloss = 0.5f;
    grad_(&f, dloss);
    assert_base_unchanged_(&f);
    for (int i = 0; i < f.m.n_params; i++) {
        const int64_t n = numel_(&f.m.params[i]);
        double gmax = 0.0;
        for (int64_t k = 0; k < n; k++) {
            const float keep = f.p[i][k], h = 3e-3f;
            f.p[i][k] = keep + h;
            const double hp = (double)f.p[i][k] - keep, up = obj_(&f, dloss);
            f.p[i][k] = keep - h;
            const double hm = keep - (double)f.p[i][k], down = obj_(&f, dloss);
            f.p[i][k] = keep;
            const double fd = (up - down) / (hp + hm), g = f.g[i][k];
            gmax = fmax(gmax, fabs(g));
            if (!(fabs(fd - g) <= 1e-4 + 2e-2 * fmax(fabs(fd), fabs(g))))
                fail_msg("%s[%lld]: analytic %.7g, finite difference %.7g", f.m.params[i].name,
                         (long long)k, g, fd);
        }
        if (!(gmax > 1e-4)) fail_msg("%s: gradient %.3g too small to test", f.m.params[i].name, gmax);
    }
    assert_base_unchanged_(&f);
    fx_free_(&f);
}

static void check_fd_(const zdp_llama_config *lc, const zdp_gpt_config *gc, int targets,
                      float b_scale) {
    check_fd_modules_(lc, gc, targets, 0, b_scale);
}

static void test_fd_llama(void **state) {
    (void)state;
    zdp_llama_config c = tiny_llama_();
    check_fd_(&c, NULL, ZDP_LORA_ALL, 0.3f);
    c.attention_bias = 1;
    check_fd_(&c, NULL, ZDP_LORA_ATTN, 0.3f);
}

static void test_fd_qwen3_tied(void **state) {
    (void)state;
    zdp_llama_config c = tiny_qwen3_();
    check_fd_(&c, NULL, ZDP_LORA_ALL, 0.3f);
    check_fd_(&c, NULL, ZDP_LORA_UNEMBED, 0.3f); /* backward stops above the blocks */
    check_fd_(&c, NULL, ZDP_LORA_MLP, 0.3f);
}

static void test_fd_gpt(void **state) {
    (void)state;
    check_fd_(NULL, &tiny_gpt_, ZDP_LORA_ALL, 0.3f);
    check_fd_(NULL, &tiny_gpt_, ZDP_LORA_ATTN, 0.3f);
}

/* The base is frozen: its own backward, run through the LoRA model, asks
 * the sink for adapter tensors only (a dense sink over the adapters would
 * refuse a base index), and a fresh adapter's B gets a gradient while A's
 * is exactly zero (B = 0 blocks it), as in PEFT's first step. */
static void test_fresh_grads(void **state) {
    (void)state;
    fx f;
    zdp_llama_config c = tiny_llama_();
    fx_init_(&f, &c, NULL, (zdp_lora_config){.rank = 2, .alpha = 32, .targets = ZDP_LORA_ALL}, 0);
    grad_(&f, 1.0f);
    for (int i = 0; i < f.m.n_params; i++) {
        double gmax = 0.0;
        for (int64_t k = 0; k < numel_(&f.m.params[i]); k++) gmax = fmax(gmax, fabs(f.g[i][k]));
        if (i % 2 == 0 && gmax != 0.0) fail_msg("%s: %g, want 0", f.m.params[i].name, gmax);
        if (i % 2 == 1 && !(gmax > 0.0)) fail_msg("%s: no gradient", f.m.params[i].name);
    }
    fx_free_(&f);
}

/* ---- two models over one base ------------------------------------------------------ */

static void test_shared_base(void **state) {
    (void)state;
    fx f;
    zdp_llama_config c = tiny_llama_();
    fx_init_(&f, &c, NULL, (zdp_lora_config){.rank = 2, .alpha = 4, .targets = ZDP_LORA_ALL, .seed = 1}, 0.2f);
    zdp_lora_config c2 = {.rank = 3, .alpha = 8, .targets = ZDP_LORA_MLP, .seed = 2};
    zdp_model m2;
    zdp_error err;
    assert_int_equal(zdp_lora_create(&f.base, (const float *const *)f.bp, &c2, &m2, &err), ZDP_OK);
    float **p2 = alloc_params_(&m2), **g2 = alloc_params_(&m2);
    zdp_lora_init_params(&m2, p2);
    /* Model 1 alone. */
    grad_(&f, 1.0f);
    float **want = alloc_params_(&f.m);
    for (int i = 0; i < f.m.n_params; i++)
        memcpy(want[i], f.g[i], (size_t)numel_(&f.m.params[i]) * sizeof(float));
    /* Forward 1, forward 2, backward 1: refused (the base's activations are 2's). */
    loss_(&f.m, f.p, &f.batch);
    loss_(&m2, p2, &f.batch);
    zdp_grad_sink *sink = zdp_grad_sink_create_dense(f.g, f.m.n_params);
    assert_int_equal(zdp_model_backward_dense(&f.m, (const float *const *)f.p, 1.0f, sink, &err),
                     ZDP_ERR_STATE);
    assert_non_null(strstr(err.msg, "another model"));
    free(sink);
    float w[12] = {1};
    assert_int_equal(zdp_lm_set_loss_weights(&f.m, w, 12, &err), ZDP_ERR_STATE);
    /* The base itself after model 2's forward: refused too. */
    float **bg = alloc_params_(&f.base);
    sink = zdp_grad_sink_create_dense(bg, f.base.n_params);
    assert_int_equal(zdp_model_backward_dense(&f.base, (const float *const *)f.bp, 1.0f, sink, &err),
                     ZDP_ERR_STATE);
    free(sink);
    free_params_(&f.base, bg);
    /* Model 2's own pair, then model 1's: model 1 gets exactly its gradients. */
    sink = zdp_grad_sink_create_dense(g2, m2.n_params);
    assert_int_equal(zdp_model_backward_dense(&m2, (const float *const *)p2, 1.0f, sink, &err), ZDP_OK);
    free(sink);
    grad_(&f, 1.0f);
    for (int i = 0; i < f.m.n_params; i++)
        assert_memory_equal(want[i], f.g[i], (size_t)numel_(&f.m.params[i]) * sizeof(float));
    assert_base_unchanged_(&f);
    free_params_(&f.m, want);
    free_params_(&m2, p2);
    free_params_(&m2, g2);
    zdp_lora_destroy(&m2);
    fx_free_(&f);
}

/* ---- merge ------------------------------------------------------------------------- */

/* merged = base + (alpha/r) B A on each target, against a double product. */
static void check_merge_product_(const fx *f, float *const *merged) {
    const zdp_lora_config *c = zdp_lora_config_of(&f->m);
    const double s = (double)c->alpha / c->rank;
    int checked = 0;
    for (int p = 0; p < f->m.n_params; p += 2) {
        const char *name = f->m.params[p].name + strlen("base_model.model.");
        const size_t mod_len = strlen(name) - strlen(".lora_A.weight");
        int wi = -1;
        for (int i = 0; i < f->base.n_params; i++)
            if (strncmp(f->base.params[i].name, name, mod_len) == 0 &&
                strcmp(f->base.params[i].name + mod_len, ".weight") == 0)
                wi = i;
        if (wi < 0) continue; /* a tied lm_head: checked by the caller */
        const int64_t r = c->rank, in = f->m.params[p].shape[1], out = f->m.params[p + 1].shape[0];
        const int conv1d = f->base.params[wi].shape[0] == in && strstr(name, "transformer") != NULL;
        for (int64_t o = 0; o < out; o++)
            for (int64_t k = 0; k < in; k++) {
                double d = 0.0;
                for (int64_t j = 0; j < r; j++) d += (double)f->p[p + 1][o * r + j] * f->p[p][j * in + k];
                const int64_t at = conv1d ? k * out + o : o * in + k;
                const double want = f->bp[wi][at] + s * d;
                if (!(fabs(merged[wi][at] - want) <= 1e-6 + 1e-5 * fabs(want)))
                    fail_msg("%s[%lld]: merged %.9g, want %.9g", f->base.params[wi].name,
                             (long long)at, merged[wi][at], want);
            }
        checked++;
    }
    assert_true(checked > 0);
}

static void test_merge(void **state) {
    (void)state;
    zdp_error err;
    /* Llama, untied, every target: the merged base's loss is the LoRA model's. */
    fx f;
    zdp_llama_config c = tiny_llama_();
    fx_init_(&f, &c, NULL, (zdp_lora_config){.rank = 2, .alpha = 4, .targets = ZDP_LORA_ALL, .seed = 4}, 0.3f);
    float **merged = alloc_params_(&f.base);
    assert_int_equal(zdp_lora_merge(&f.m, (const float *const *)f.p, merged, NULL, &err), ZDP_OK);
    check_merge_product_(&f, merged);
    const float lm = loss_(&f.base, merged, &f.batch), ll = loss_(&f.m, f.p, &f.batch);
    if (!(fabsf(lm - ll) <= 2e-6f * fabsf(ll))) fail_msg("merged loss %.9g, LoRA loss %.9g", lm, ll);
    free_params_(&f.base, merged);
    fx_free_(&f);

    /* GPT-2: Conv1D weights take (B A)^T; the tied lm_head is refused. */
    fx_init_(&f, NULL, &tiny_gpt_, (zdp_lora_config){.rank = 2, .alpha = 4, .targets = ZDP_LORA_ATTN | ZDP_LORA_MLP, .seed = 4}, 0.3f);
    merged = alloc_params_(&f.base);
    assert_int_equal(zdp_lora_merge(&f.m, (const float *const *)f.p, merged, NULL, &err), ZDP_OK);
    check_merge_product_(&f, merged);
    const float gm = loss_(&f.base, merged, &f.batch), gl = loss_(&f.m, f.p, &f.batch);
    if (!(fabsf(gm - gl) <= 2e-6f * fabsf(gl))) fail_msg("merged loss %.9g, LoRA loss %.9g", gm, gl);
    free_params_(&f.base, merged);
    fx_free_(&f);
    fx_init_(&f, NULL, &tiny_gpt_, (zdp_lora_config){.rank = 2, .alpha = 4, .targets = ZDP_LORA_UNEMBED}, 0.3f);
    merged = alloc_params_(&f.base);
    assert_int_equal(zdp_lora_merge(&f.m, (const float *const *)f.p, merged, NULL, &err),
                     ZDP_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "lm_head"));
    free_params_(&f.base, merged);
    fx_free_(&f);

    /* Qwen3 tied: the head comes out untied; an untied model with it has the LoRA loss. */
    zdp_llama_config q = tiny_qwen3_();
    fx_init_(&f, &q, NULL, (zdp_lora_config){.rank = 2, .alpha = 4, .targets = ZDP_LORA_ALL, .seed = 4}, 0.3f);
    merged = alloc_params_(&f.base);
    float *head = malloc(11 * 8 * sizeof(float));
    assert_int_equal(zdp_lora_merge(&f.m, (const float *const *)f.p, merged, head, &err), ZDP_OK);
    check_merge_product_(&f, merged);
    assert_memory_equal(merged[0], f.bp[0], 11 * 8 * sizeof(float)); /* the embedding as it was */
    zdp_llama_config qu = q;
    qu.tie_word_embeddings = 0;
    zdp_model un;
    assert_int_equal(zdp_llama_create(&qu, 2, &un, &err), ZDP_OK);
    assert_int_equal(un.n_params, f.base.n_params + 1);
    float **up = calloc((size_t)un.n_params, sizeof *up);
    for (int i = 0; i < f.base.n_params; i++) up[i] = merged[i];
    up[f.base.n_params] = head;
    const float qm = loss_(&un, up, &f.batch), ql = loss_(&f.m, f.p, &f.batch);
    if (!(fabsf(qm - ql) <= 2e-6f * fabsf(ql))) fail_msg("merged loss %.9g, LoRA loss %.9g", qm, ql);
    free(up);
    free(head);
    zdp_llama_destroy(&un);
    free_params_(&f.base, merged);
    fx_free_(&f);
}

/* ---- the PEFT folder ------------------------------------------------------------------ */

static char *slurp_(const char *path) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) fail_msg("%s: cannot open", path);
    char *buf = calloc(1, 1 << 16);
    size_t n = fread(buf, 1, (1 << 16) - 1, f);
    (void)n;
    fclose(f);
    return buf;
}

static void write_text_(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
}

static void expect_load_err_(const char *dir, const zdp_model *base, float *const *bp,
                             zdp_lora_config c, const char *want) {
    zdp_model m;
    zdp_error err;
    assert_int_equal(zdp_lora_create(base, (const float *const *)bp, &c, &m, &err), ZDP_OK);
    float **p = alloc_params_(&m);
    assert_int_equal(zdp_lora_load_adapter(dir, &m, p, &err), ZDP_ERR_INVALID_ARG);
    if (strstr(err.msg, want) == NULL) fail_msg("error '%s' lacks '%s'", err.msg, want);
    free_params_(&m, p);
    zdp_lora_destroy(&m);
}

/* The adapter in dir, loaded into a new LoRA model of configuration rc over
 * f's base, equals f's adapter weights bit for bit. */
static void expect_adapter_equal_(const char *dir, const fx *f, const zdp_lora_config *rc) {
    zdp_model m2;
    zdp_error err;
    assert_int_equal(zdp_lora_create(&f->base, (const float *const *)f->bp, rc, &m2, &err), ZDP_OK);
    float **p2 = alloc_params_(&m2);
    assert_int_equal(zdp_lora_load_adapter(dir, &m2, p2, &err), ZDP_OK);
    for (int i = 0; i < m2.n_params; i++)
        assert_memory_equal(p2[i], f->p[i], (size_t)numel_(&m2.params[i]) * sizeof(float));
    free_params_(&m2, p2);
    zdp_lora_destroy(&m2);
}

static void expect_config_err_(const char *dir, const char *json, const char *want) {
    char path[512];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    write_text_(path, json);
    zdp_lora_config c;
    zdp_error err;
    assert_int_equal(zdp_lora_read_adapter_config(dir, &c, &err), ZDP_ERR_INVALID_ARG);
    if (strstr(err.msg, want) == NULL) fail_msg("error '%s' lacks '%s'", err.msg, want);
}

static void test_peft_folder(void **state) {
    (void)state;
    char dir[] = "/tmp/zdp_lora_testXXXXXX";
    assert_non_null(mkdtemp(dir));
    zdp_error err;
    fx f;
    zdp_llama_config c = tiny_llama_();
    fx_init_(&f, &c, NULL, (zdp_lora_config){.rank = 2, .alpha = 16, .targets = ZDP_LORA_ATTN | ZDP_LORA_UNEMBED, .seed = 4}, 0.3f);
    assert_int_equal(zdp_lora_save_adapter(dir, &f.m, (const float *const *)f.p, "tiny-llama", &err), ZDP_OK);
    char path[512];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    char *text = slurp_(path);
    const char *want[] = {"\"peft_type\": \"LORA\"", "\"r\": 2", "\"lora_alpha\": 16",
                          "\"q_proj\"", "\"o_proj\"", "\"lm_head\"", "\"fan_in_fan_out\": false",
                          "\"bias\": \"none\"", "\"task_type\": \"CAUSAL_LM\"",
                          "\"base_model_name_or_path\": \"tiny-llama\""};
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++)
        if (strstr(text, want[k]) == NULL) fail_msg("adapter_config.json lacks %s:\n%s", want[k], text);
    assert_null(strstr(text, "gate_proj"));
    free(text);
    /* Read back: the config, then the tensors bitwise. */
    zdp_lora_config rc;
    assert_int_equal(zdp_lora_read_adapter_config(dir, &rc, &err), ZDP_OK);
    assert_int_equal(rc.rank, 2);
    assert_true(rc.alpha == 16.0f);
    assert_int_equal(rc.targets, ZDP_LORA_ATTN | ZDP_LORA_UNEMBED);
    expect_adapter_equal_(dir, &f, &rc);
    /* Another rank: the tensor and both shapes named. */
    expect_load_err_(dir, &f.base, f.bp, (zdp_lora_config){.rank = 3, .alpha = 16, .targets = ZDP_LORA_ATTN | ZDP_LORA_UNEMBED},
                     "tensor base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight has shape [2, 8], this base and rank need [3, 8]");
    /* Other targets: a missing tensor, an extra one. */
    expect_load_err_(dir, &f.base, f.bp, (zdp_lora_config){.rank = 2, .alpha = 16, .targets = ZDP_LORA_ALL},
                     "mlp.gate_proj.lora_A.weight [2, 8] is missing");
    expect_load_err_(dir, &f.base, f.bp, (zdp_lora_config){.rank = 2, .alpha = 16, .targets = ZDP_LORA_ATTN},
                     "tensor base_model.model.lm_head.lora_A.weight is not one of this LoRA model's");
    /* Another base (hidden 12): shapes differ. */
    zdp_llama_config wide = tiny_llama_();
    wide.hidden = 12;
    zdp_model wb;
    assert_int_equal(zdp_llama_create(&wide, 1, &wb, &err), ZDP_OK);
    float **wp = alloc_params_(&wb);
    expect_load_err_(dir, &wb, wp, rc, "has shape [2, 8], this base and rank need [2, 12]");
    free_params_(&wb, wp);
    zdp_llama_destroy(&wb);
    fx_free_(&f);

    /* GPT-2: Conv1D flagged, the two c_proj told apart. */
    fx_init_(&f, NULL, &tiny_gpt_, (zdp_lora_config){.rank = 2, .alpha = 8, .targets = ZDP_LORA_ATTN}, 0.3f);
    assert_int_equal(zdp_lora_save_adapter(dir, &f.m, (const float *const *)f.p, NULL, &err), ZDP_OK);
    text = slurp_(path);
    if (strstr(text, "\"attn.c_proj\"") == NULL || strstr(text, "mlp.c_proj") != NULL ||
        strstr(text, "\"fan_in_fan_out\": true") == NULL ||
        strstr(text, "\"base_model_name_or_path\": null") == NULL)
        fail_msg("GPT-2 adapter_config.json:\n%s", text);
    free(text);
    assert_int_equal(zdp_lora_read_adapter_config(dir, &rc, &err), ZDP_OK);
    assert_int_equal(rc.targets, ZDP_LORA_ATTN);
    fx_free_(&f);

    /* adapter_config.json refusals, each naming its key. */
    expect_config_err_(dir, "{\"peft_type\": \"IA3\", \"r\": 2, \"target_modules\": [\"q_proj\"]}",
                       "peft_type = IA3");
    expect_config_err_(dir, "{\"peft_type\": \"LORA\", \"r\": 0, \"target_modules\": [\"q_proj\"]}", "r:");
    expect_config_err_(dir, "{\"peft_type\": \"LORA\", \"r\": 4, \"target_modules\": [\"c_attn\"]}",
                       "target_modules names no attention module of a Llama-family adapter");
    expect_config_err_(dir, "{\"peft_type\": \"LORA\", \"r\": 4, \"target_modules\": [\"embed_tokens\"]}",
                       "target_modules[0] = embed_tokens");
    expect_config_err_(dir, "{\"peft_type\": \"LORA\", \"r\": 4, \"bias\": \"all\", \"target_modules\": [\"lm_head\"]}",
                       "bias = all");
    expect_config_err_(dir, "{\"peft_type\": \"LORA\", \"r\": 4, \"use_rslora\": true, \"target_modules\": [\"lm_head\"]}",
                       "use_rslora");
    /* PEFT's all-linear and GPT-2's bare c_proj are understood. */
    write_text_(path, "{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"target_modules\": \"all-linear\"}");
    assert_int_equal(zdp_lora_read_adapter_config(dir, &rc, &err), ZDP_OK);
    assert_int_equal(rc.targets, ZDP_LORA_ATTN | ZDP_LORA_MLP);
    write_text_(path, "{\"peft_type\": \"LORA\", \"r\": 4, \"fan_in_fan_out\": true, \"target_modules\": [\"c_attn\", \"c_proj\", \"c_fc\"]}");
    assert_int_equal(zdp_lora_read_adapter_config(dir, &rc, &err), ZDP_OK);
    assert_int_equal(rc.targets, ZDP_LORA_ATTN | ZDP_LORA_MLP);
    assert_true(rc.alpha == 32.0f);
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    unlink(path);
    rmdir(dir);
}

static void expect_create_err_(const zdp_model *base, float *const *bp, zdp_lora_config c,
                               const char *want) {
    zdp_model m;
    zdp_error err;
    assert_int_equal(zdp_lora_create(base, (const float *const *)bp, &c, &m, &err),
                     ZDP_ERR_INVALID_ARG);
    if (strstr(err.msg, want) == NULL) fail_msg("error '%s' lacks '%s'", err.msg, want);
    assert_null(m.self);
}

/* ---- single modules (PEFT's target_modules in part) ---------------------------------- */

/* Drops the white space of a JSON text (none inside these strings). */
static void squeeze_(char *t) {
    char *o = t;
    for (; *t; t++)
        if (*t != ' ' && *t != '\n') *o++ = *t;
    *o = '\0';
}

/* Llama with q_proj, v_proj and down_proj only, GPT-2 with attn.c_attn
 * only: the names, the gradients (finite differences), the PEFT folder out
 * and back, the merge touching only those weights, the checkpoint's shape,
 * and the refusals. */
static void test_partial_modules(void **state) {
    (void)state;
    zdp_error err;
    fx f;
    zdp_llama_config c = tiny_llama_();
    const int mods = ZDP_LORA_Q_PROJ | ZDP_LORA_V_PROJ | ZDP_LORA_DOWN_PROJ;
    fx_init_(&f, &c, NULL,
             (zdp_lora_config){.rank = 2, .alpha = 16, .targets = ZDP_LORA_ATTN | ZDP_LORA_MLP,
                               .seed = 4, .modules = mods},
             0.3f);
    assert_int_equal(f.m.n_params, 2 * 3 * 2);
    const char *want[] = {"self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj"};
    for (int i = 0; i < f.m.n_params; i++) {
        char name[128];
        snprintf(name, sizeof name, "base_model.model.model.layers.%d.%s.lora_%c.weight", i / 6,
                 want[(i % 6) / 2], i % 2 ? 'B' : 'A');
        assert_string_equal(f.m.params[i].name, name);
    }
    assert_non_null(strstr(f.m.shape_json, "\"lora_targets\":\"q_proj,v_proj,down_proj\""));
    /* The merge adapts those three weights and leaves every other bitwise. */
    float **merged = alloc_params_(&f.base);
    assert_int_equal(zdp_lora_merge(&f.m, (const float *const *)f.p, merged, NULL, &err), ZDP_OK);
    check_merge_product_(&f, merged);
    int changed = 0;
    for (int i = 0; i < f.base.n_params; i++) {
        const char *n = f.base.params[i].name;
        const int adapted = strstr(n, "q_proj.weight") || strstr(n, "v_proj.weight") ||
                            strstr(n, "down_proj.weight");
        const int same = memcmp(merged[i], f.bp[i],
                                (size_t)numel_(&f.base.params[i]) * sizeof(float)) == 0;
        if (adapted == same) fail_msg("%s: %s by the merge", n, same ? "unchanged" : "changed");
        changed += !same;
    }
    assert_int_equal(changed, 6);
    const float lm = loss_(&f.base, merged, &f.batch), ll = loss_(&f.m, f.p, &f.batch);
    if (!(fabsf(lm - ll) <= 2e-6f * fabsf(ll))) fail_msg("merged loss %.9g, LoRA loss %.9g", lm, ll);
    free_params_(&f.base, merged);
    /* The folder lists exactly those modules, and reads back to the same config. */
    char dir[] = "/tmp/zdp_lora_partXXXXXX", path[512];
    assert_non_null(mkdtemp(dir));
    assert_int_equal(zdp_lora_save_adapter(dir, &f.m, (const float *const *)f.p, NULL, &err), ZDP_OK);
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    char *text = slurp_(path);
    squeeze_(text);
    if (strstr(text, "\"target_modules\":[\"q_proj\",\"v_proj\",\"down_proj\"]") == NULL)
        fail_msg("adapter_config.json:\n%s", text);
    free(text);
    zdp_lora_config rc;
    assert_int_equal(zdp_lora_read_adapter_config(dir, &rc, &err), ZDP_OK);
    assert_int_equal(rc.targets, ZDP_LORA_ATTN | ZDP_LORA_MLP);
    assert_int_equal(rc.modules, mods);
    expect_adapter_equal_(dir, &f, &rc);
    /* The whole attention group reads as the group (modules 0); the common
     * ["q_proj", "v_proj"] as attention in part. */
    write_text_(path, "{\"peft_type\": \"LORA\", \"r\": 4, \"target_modules\": [\"q_proj\", \"v_proj\"]}");
    assert_int_equal(zdp_lora_read_adapter_config(dir, &rc, &err), ZDP_OK);
    assert_int_equal(rc.targets, ZDP_LORA_ATTN);
    assert_int_equal(rc.modules, ZDP_LORA_Q_PROJ | ZDP_LORA_V_PROJ);
    write_text_(path, "{\"peft_type\": \"LORA\", \"r\": 4, \"target_modules\": [\"v_proj\", \"o_proj\", \"k_proj\", \"q_proj\", \"lm_head\"]}");
    assert_int_equal(zdp_lora_read_adapter_config(dir, &rc, &err), ZDP_OK);
    assert_int_equal(rc.targets, ZDP_LORA_ATTN | ZDP_LORA_UNEMBED);
    assert_int_equal(rc.modules, 0);
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    unlink(path);
    rmdir(dir);
    /* Refusals, naming the module or group. */
    expect_create_err_(&f.base, f.bp, (zdp_lora_config){.rank = 2, .targets = ZDP_LORA_ATTN, .modules = ZDP_LORA_C_ATTN},
                       "attn.c_attn is not a module of this Llama-family base");
    expect_create_err_(&f.base, f.bp, (zdp_lora_config){.rank = 2, .targets = ZDP_LORA_MLP, .modules = ZDP_LORA_Q_PROJ | ZDP_LORA_UP_PROJ},
                       "q_proj is in group attn, which targets leaves out");
    expect_create_err_(&f.base, f.bp, (zdp_lora_config){.rank = 2, .targets = ZDP_LORA_ATTN, .modules = 1 << 12},
                       "unknown module bits");
    fx_free_(&f);
    /* A group with none of its modules named is whole: q_proj alone, the MLP whole. */
    fx_init_(&f, &c, NULL, (zdp_lora_config){.rank = 2, .alpha = 16, .targets = ZDP_LORA_ATTN | ZDP_LORA_MLP, .modules = ZDP_LORA_Q_PROJ}, 0.3f);
    assert_int_equal(f.m.n_params, 2 * 4 * 2);
    assert_non_null(strstr(f.m.shape_json, "\"lora_targets\":\"q_proj,mlp\""));
    fx_free_(&f);
    /* Gradients by finite differences with modules in part: Llama (the MLP's
     * middle projection skipped), Qwen3 tied (v_proj and lm_head), GPT-2
     * (the fused c_attn alone). */
    check_fd_modules_(&c, NULL, ZDP_LORA_ATTN | ZDP_LORA_MLP, ZDP_LORA_K_PROJ | ZDP_LORA_GATE_PROJ, 0.3f);
    zdp_llama_config q = tiny_qwen3_();
    check_fd_modules_(&q, NULL, ZDP_LORA_ATTN | ZDP_LORA_UNEMBED, ZDP_LORA_V_PROJ | ZDP_LORA_LM_HEAD, 0.3f);
    check_fd_modules_(NULL, &tiny_gpt_, ZDP_LORA_ATTN, ZDP_LORA_C_ATTN, 0.3f);
    /* GPT-2: c_attn alone out and back; a Llama module refused. */
    fx_init_(&f, NULL, &tiny_gpt_, (zdp_lora_config){.rank = 2, .alpha = 8, .targets = ZDP_LORA_ATTN, .modules = ZDP_LORA_C_ATTN}, 0.3f);
    assert_int_equal(f.m.n_params, 2 * 2);
    assert_string_equal(f.m.params[0].name, "base_model.model.transformer.h.0.attn.c_attn.lora_A.weight");
    char gdir[] = "/tmp/zdp_lora_partXXXXXX";
    assert_non_null(mkdtemp(gdir));
    assert_int_equal(zdp_lora_save_adapter(gdir, &f.m, (const float *const *)f.p, NULL, &err), ZDP_OK);
    snprintf(path, sizeof path, "%s/adapter_config.json", gdir);
    text = slurp_(path);
    squeeze_(text);
    if (strstr(text, "\"target_modules\":[\"attn.c_attn\"]") == NULL) fail_msg("adapter_config.json:\n%s", text);
    free(text);
    assert_int_equal(zdp_lora_read_adapter_config(gdir, &rc, &err), ZDP_OK);
    assert_int_equal(rc.targets, ZDP_LORA_ATTN);
    assert_int_equal(rc.modules, ZDP_LORA_C_ATTN);
    expect_create_err_(&f.base, f.bp, (zdp_lora_config){.rank = 2, .targets = ZDP_LORA_ATTN, .modules = ZDP_LORA_Q_PROJ},
                       "q_proj is not a module of this GPT-2 base");
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", gdir);
    unlink(path);
    snprintf(path, sizeof path, "%s/adapter_config.json", gdir);
    unlink(path);
    rmdir(gdir);
    fx_free_(&f);
    /* Target lists with single modules, and back. */
    int t = 0, mo = 0;
    assert_int_equal(zdp_lora_targets_parse("q_proj,v_proj,mlp", &t, &mo, &err), ZDP_OK);
    assert_int_equal(t, ZDP_LORA_ATTN | ZDP_LORA_MLP);
    assert_int_equal(mo, ZDP_LORA_Q_PROJ | ZDP_LORA_V_PROJ);
    char tn[ZDP_LORA_TARGETS_NAME_MAX];
    zdp_lora_targets_name(t, mo, tn, sizeof tn);
    assert_string_equal(tn, "q_proj,v_proj,mlp");
    zdp_lora_targets_name(ZDP_LORA_ALL, ZDP_LORA_MODULES_ALL, tn, sizeof tn);
    assert_string_equal(tn, "q_proj,k_proj,v_proj,o_proj,attn.c_attn,attn.c_proj,gate_proj,up_proj,"
                            "down_proj,mlp.c_fc,mlp.c_proj,lm_head");
    assert_int_equal(zdp_lora_targets_parse("q_proj", &t, NULL, &err), ZDP_ERR_INVALID_ARG);
    assert_int_equal(zdp_lora_targets_parse("q_proj,embed", &t, &mo, &err), ZDP_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "'embed'"));
    assert_non_null(strstr(err.msg, "single modules"));
    /* Names and bits. */
    int g = 0;
    assert_int_equal(zdp_lora_module_bit("down_proj", &g), ZDP_LORA_DOWN_PROJ);
    assert_int_equal(g, ZDP_LORA_MLP);
    assert_int_equal(zdp_lora_module_bit("embed_tokens", NULL), 0);
    assert_string_equal(zdp_lora_module_name(ZDP_LORA_MLP_C_PROJ), "mlp.c_proj");
    assert_null(zdp_lora_module_name(ZDP_LORA_Q_PROJ | ZDP_LORA_K_PROJ));
}

/* ---- refusals ---------------------------------------------------------------------- */


static void test_refusals(void **state) {
    (void)state;
    fx f;
    zdp_llama_config c = tiny_llama_();
    fx_init_(&f, &c, NULL, (zdp_lora_config){.rank = 1, .alpha = 32, .targets = ZDP_LORA_ALL}, 0);
    expect_create_err_(&f.base, f.bp, (zdp_lora_config){.rank = 0, .alpha = 32, .targets = 7},
                       "rank = 0");
    /* k_proj is [4, 8]: rank 5 is too large for it, and fine for MLP only (ffn 12, hidden 8). */
    expect_create_err_(&f.base, f.bp, (zdp_lora_config){.rank = 5, .alpha = 32, .targets = 7},
                       "model.layers.0.self_attn.k_proj's dimensions (in 8, out 4)");
    zdp_model ok;
    zdp_error err;
    zdp_lora_config mlp = {.rank = 5, .alpha = 32, .targets = ZDP_LORA_MLP};
    assert_int_equal(zdp_lora_create(&f.base, (const float *const *)f.bp, &mlp, &ok, &err), ZDP_OK);
    zdp_lora_destroy(&ok);
    expect_create_err_(&f.base, f.bp, (zdp_lora_config){.rank = 9, .alpha = 32, .targets = ZDP_LORA_MLP},
                       "mlp.gate_proj's dimensions (in 8, out 12)");
    expect_create_err_(&f.base, f.bp, (zdp_lora_config){.rank = 2, .alpha = -1, .targets = 7},
                       "alpha = -1");
    expect_create_err_(&f.base, f.bp, (zdp_lora_config){.rank = 2, .alpha = INFINITY, .targets = 7},
                       "alpha = inf");
    /* alpha 0: the default, 32. */
    zdp_lora_config dflt = {.rank = 2, .targets = ZDP_LORA_MLP};
    assert_int_equal(zdp_lora_create(&f.base, (const float *const *)f.bp, &dflt, &ok, &err), ZDP_OK);
    assert_true(zdp_lora_config_of(&ok)->alpha == 32.0f);
    assert_non_null(strstr(ok.shape_json, "\"lora_alpha\":\"32\""));
    zdp_lora_destroy(&ok);
    expect_create_err_(&f.base, f.bp, (zdp_lora_config){.rank = 2, .alpha = NAN, .targets = 7},
                       "alpha = nan");
    expect_create_err_(&f.base, f.bp, (zdp_lora_config){.rank = 2, .alpha = 32, .targets = 0},
                       "targets = 0");
    expect_create_err_(&f.base, f.bp, (zdp_lora_config){.rank = 2, .alpha = 32, .targets = 8},
                       "targets = 8");
    /* A base that is neither family. */
    zdp_model mlpm;
    assert_int_equal(zdp_mlp_create(4, 1, 2, &mlpm, &err), ZDP_OK);
    expect_create_err_(&mlpm, f.bp, (zdp_lora_config){.rank = 1, .alpha = 32, .targets = 7},
                       "neither GPT-2 nor of the Llama family");
    zdp_mlp_destroy(&mlpm);
    /* Target lists. */
    int t = 0;
    assert_int_equal(zdp_lora_targets_parse("attn,unembed", &t, NULL, &err), ZDP_OK);
    assert_int_equal(t, ZDP_LORA_ATTN | ZDP_LORA_UNEMBED);
    assert_int_equal(zdp_lora_targets_parse("all", &t, NULL, &err), ZDP_OK);
    assert_int_equal(t, ZDP_LORA_ALL);
    char name[32];
    zdp_lora_targets_name(ZDP_LORA_MLP | ZDP_LORA_UNEMBED, 0, name, sizeof name);
    assert_string_equal(name, "mlp,unembed");
    assert_int_equal(zdp_lora_targets_parse("attn,embed", &t, NULL, &err), ZDP_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "'embed'"));
    assert_int_equal(zdp_lora_targets_parse("", &t, NULL, &err), ZDP_ERR_INVALID_ARG);
    assert_int_equal(zdp_lora_targets_parse("mlp,", &t, NULL, &err), ZDP_ERR_INVALID_ARG);
    fx_free_(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_llama),   cmocka_unit_test(test_names_gpt),
        cmocka_unit_test(test_partial_modules),
        cmocka_unit_test(test_fresh_is_base), cmocka_unit_test(test_fd_llama),
        cmocka_unit_test(test_fd_qwen3_tied), cmocka_unit_test(test_fd_gpt),
        cmocka_unit_test(test_fresh_grads),   cmocka_unit_test(test_shared_base),
        cmocka_unit_test(test_merge),         cmocka_unit_test(test_peft_folder),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
