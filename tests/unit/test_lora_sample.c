/*
 * test_lora_sample.c -- LoRA adapters in KV-cache decoding (zdp_kv_set_adapter,
 * zdp_gen_seq.lora; docs/sampling.md, docs/lora.md) on tiny GPT-2 (Conv1D
 * sites, tied head), Llama (GQA, attention biases, untied) and Qwen3 (q/k
 * norm, one KV head, tied) models with random weights and random (nonzero)
 * adapters:
 *   - every logit of a prefill and of each later step with an adapter equals
 *     the LoRA model's full forward (zdp_lm_next_logits), another sequence
 *     without an adapter in the other slot;
 *   - greedy decoding with the adapter equals decoding the merged model
 *     (zdp_lora_merge) token for token, logprobs within fp32 tolerance;
 *   - a batch mixing two adapters and the base (continuous batching) equals
 *     each sequence sampled alone with the same seed;
 *   - prompt logprobs with an adapter equal the LoRA model's forward;
 *   - an adapter for another base shape, or without its tensors, is refused.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/unit_lm.h"
#include "zdp/zdp.h"

/* A LoRA model over base and random adapters (B nonzero, so it changes the
 * output: a fresh adapter's B is zero). */
static float **make_lora_(zdp_model *lora, const zdp_model *base, float **bp, int rank,
                          int targets, int modules, float alpha, uint64_t seed) {
    zdp_error err;
    const zdp_lora_config lc = {.rank = rank, .alpha = alpha, .targets = targets, .seed = seed,
                                .modules = modules};
    if (zdp_lora_create(base, (const float *const *)bp, &lc, lora, &err) != ZDP_OK)
        fail_msg("%s", err.msg);
    /* alpha/r scales the product: keep it O(1) beside the base. */
    return alloc_fill_(lora, seed, 0.5f / sqrtf(alpha / (float)rank), 0.0f, 0.0f);
}

#define C_(p) ((const float *const *)(p))

/* Slot 1 (with the adapter) prefilled with 5 positions, then one per step to
 * the context; slot 0 holds a base sequence decoded in the same passes. */
static void test_logits_match_lora_forward(void **state) {
    (void)state;
    for (int kind = 0; kind < N_KINDS_; kind++) {
        zdp_model m, lora;
        float **bp = make_base_(&m, kind, 16, 0);
        float **ap = make_lora_(&lora, &m, bp, 3, ZDP_LORA_ALL, 0, 8.0f, 55);
        const int V = m.vocab_size, T = m.block_size, P = 5;
        int32_t tok[64], other[64];
        rand_tokens_(tok, T, V, 77);
        rand_tokens_(other, T, V, 78);
        zdp_kv_cache *kv;
        zdp_error err;
        assert_int_equal(zdp_kv_create(&m, 2, 0, &kv, &err), ZDP_OK);
        assert_int_equal(zdp_kv_set_adapter(kv, 1, &lora, C_(ap), &err), ZDP_OK);
        float *got = malloc((size_t)(P + 1) * V * sizeof(float));
        float *want = malloc((size_t)V * sizeof(float));
        int32_t sl[6] = {0, 1, 1, 1, 1, 1}, tk[6];
        tk[0] = other[0];
        memcpy(tk + 1, tok, P * sizeof(int32_t));
        if (zdp_lm_decode(kv, C_(bp), sl, tk, P + 1, NULL, got, &err) != ZDP_OK)
            fail_msg("%s", err.msg);
        assert_int_equal(zdp_lm_next_logits(&m, C_(bp), other, 1, want, &err), ZDP_OK);
        /* the base row: no adapter */
        assert_close_(kind_name_(kind), "LoRA full forward", got, want, V, 0);
        for (int t = 0; t < P; t++) {
            assert_int_equal(zdp_lm_next_logits(&lora, C_(ap), tok, t + 1, want, &err), ZDP_OK);
            assert_close_(kind_name_(kind), "LoRA full forward", got + (size_t)(t + 1) * V, want, V,
                          t);
        }
        for (int t = P; t < T; t++) {
            int32_t s2[2] = {1, 0}, t2[2] = {tok[t], other[t - P + 1]};
            if (zdp_lm_decode(kv, C_(bp), s2, t2, 2, NULL, got, &err) != ZDP_OK)
                fail_msg("%s", err.msg);
            assert_int_equal(zdp_lm_next_logits(&lora, C_(ap), tok, t + 1, want, &err), ZDP_OK);
            assert_close_(kind_name_(kind), "LoRA full forward", got, want, V, t);
            assert_int_equal(zdp_lm_next_logits(&m, C_(bp), other, t - P + 2, want, &err), ZDP_OK);
            assert_close_(kind_name_(kind), "LoRA full forward", got + V, want, V, t);
        }
        /* Cleared, the slot is the base again. */
        zdp_kv_clear(kv, 1);
        assert_int_equal(zdp_lm_decode(kv, C_(bp), &sl[1], tok, 1, NULL, got, &err), ZDP_OK);
        assert_int_equal(zdp_lm_next_logits(&m, C_(bp), tok, 1, want, &err), ZDP_OK);
        assert_close_(kind_name_(kind), "LoRA full forward", got, want, V, 0);
        zdp_kv_destroy(kv);
        free(got);
        free(want);
        free_params_(ap, &lora);
        zdp_lora_destroy(&lora);
        free_params_(bp, &m);
        zdp_model_destroy(&m);
    }
}

/* Greedy with the adapter == greedy over the merged weights.  A tied head
 * cannot take a merged product without untying it, so the tied models
 * (GPT-2, Qwen3) merge attn + mlp and the untied Llama every target. */
static void test_greedy_equals_merged(void **state) {
    (void)state;
    for (int kind = 0; kind < N_KINDS_; kind++) {
        zdp_model m, lora;
        float **bp = make_base_(&m, kind, 16, 0);
        const int targets = kind == LLAMA_ ? ZDP_LORA_ALL : ZDP_LORA_ATTN | ZDP_LORA_MLP;
        float **ap = make_lora_(&lora, &m, bp, 2, targets, 0, 32.0f, 66);
        float **merged = alloc_fill_(&m, 1, 0, 0, 0);
        zdp_error err;
        if (zdp_lora_merge(&lora, C_(ap), merged, NULL, &err) != ZDP_OK) fail_msg("%s", err.msg);
        const int V = m.vocab_size, T = m.block_size, P = 4;
        int32_t prompt[8], out[2][32];
        float lp[2][32];
        rand_tokens_(prompt, P, V, 5);
        zdp_gen_seq g[2];
        for (int i = 0; i < 2; i++)
            g[i] = (zdp_gen_seq){.prompt = prompt, .prompt_len = P, .max_tokens = T - P,
                                 .out = out[i], .out_logprobs = lp[i]};
        g[0].lora = &lora, g[0].adapter = C_(ap);
        if (zdp_generate(&m, C_(bp), NULL, &g[0], 1, 1, NULL, &err) != ZDP_OK)
            fail_msg("%s", err.msg);
        if (zdp_generate(&m, C_(merged), NULL, &g[1], 1, 1, NULL, &err) != ZDP_OK)
            fail_msg("%s", err.msg);
        assert_int_equal(g[0].n_out, T - P);
        assert_int_equal(g[1].n_out, T - P);
        int differs_from_base = 0;
        int32_t base_out[32];
        zdp_gen_seq gb = {.prompt = prompt, .prompt_len = P, .max_tokens = T - P, .out = base_out};
        assert_int_equal(zdp_generate(&m, C_(bp), NULL, &gb, 1, 1, NULL, &err), ZDP_OK);
        for (int t = 0; t < T - P; t++) {
            if (out[0][t] != out[1][t])
                fail_msg("%s step %d: with the adapter %d, merged %d", kind_name_(kind), t,
                         out[0][t], out[1][t]);
            if (fabsf(lp[0][t] - lp[1][t]) > 1e-4f)
                fail_msg("%s step %d: logprob with the adapter %g, merged %g", kind_name_(kind), t,
                         lp[0][t], lp[1][t]);
            differs_from_base += out[0][t] != base_out[t];
        }
        /* The adapter changed the samples (else this test proves nothing). */
        assert_true(differs_from_base > 0);
        free_params_(merged, &m);
        free_params_(ap, &lora);
        zdp_lora_destroy(&lora);
        free_params_(bp, &m);
        zdp_model_destroy(&m);
    }
}

#define NSEQ_ 9

static void make_seqs_(zdp_gen_seq *g, int32_t (*prompts)[24], int32_t (*out)[24],
                       float (*lp)[24], float (*plp)[24], int V, const zdp_model *const *lm,
                       float **const *ad) {
    for (int i = 0; i < NSEQ_; i++) {
        const int plen = 1 + (i * 3) % 9;
        rand_tokens_(prompts[i], plen, V, 100 + (uint64_t)i);
        g[i] = (zdp_gen_seq){.prompt = prompts[i], .prompt_len = plen,
                             .max_tokens = 3 + (i * 5) % (24 - plen - 3),
                             .sp = {.temperature = i == 0 ? 0.0 : 0.6 + 0.2 * i,
                                    .top_k = i % 4 == 1 ? 5 : 0,
                                    .top_p = i % 4 == 2 ? 0.8 : 1.0},
                             .seed = 9000 + (uint64_t)i, .out = out[i], .out_logprobs = lp[i],
                             .prompt_logprobs = i % 2 ? plp[i] : NULL,
                             /* adapter 1, adapter 2, the base, in turn */
                             .lora = lm[i % 3], .adapter = C_(ad[i % 3])};
    }
}

/* Nine sequences over two adapters (other ranks, targets and modules) and the base,
 * decoded four at a time, equal each generated alone; prompt logprobs equal
 * the LoRA model's forward (its zdp_lm_batch logprobs). */
static void test_mixed_batch_equals_alone(void **state) {
    (void)state;
    for (int kind = 0; kind < N_KINDS_; kind++) {
        zdp_model m, l1, l2;
        float **bp = make_base_(&m, kind, 16, 0);
        float **a1 = make_lora_(&l1, &m, bp, 2, ZDP_LORA_ALL, 0, 16.0f, 11);
        /* The second: attention in part (PEFT's q_proj + v_proj; GPT-2's fused
         * c_attn alone) and the lm_head. */
        const int part = kind == GPT_ ? ZDP_LORA_C_ATTN : ZDP_LORA_Q_PROJ | ZDP_LORA_V_PROJ;
        float **a2 = make_lora_(&l2, &m, bp, 4, ZDP_LORA_ATTN | ZDP_LORA_UNEMBED,
                                part | ZDP_LORA_LM_HEAD, 32.0f, 12);
        const zdp_model *lm[3] = {&l1, &l2, NULL};
        float **const ad[3] = {a1, a2, NULL};
        const int V = m.vocab_size;
        static int32_t prompts[NSEQ_][24], out[NSEQ_][24], out1[NSEQ_][24];
        static float lp[NSEQ_][24], lp1[NSEQ_][24], plp[NSEQ_][24], plp1[NSEQ_][24];
        zdp_gen_seq g[NSEQ_], g1[NSEQ_];
        make_seqs_(g, prompts, out, lp, plp, V, lm, ad);
        make_seqs_(g1, prompts, out1, lp1, plp1, V, lm, ad);
        zdp_error err;
        zdp_gen_stats stats;
        if (zdp_generate(&m, C_(bp), NULL, g, NSEQ_, 4, &stats, &err) != ZDP_OK)
            fail_msg("%s", err.msg);
        assert_true(stats.passes < stats.decode_tokens); /* sequences shared passes */
        for (int i = 0; i < NSEQ_; i++)
            if (zdp_generate(&m, C_(bp), NULL, &g1[i], 1, 1, NULL, &err) != ZDP_OK)
                fail_msg("%s", err.msg);
        float *lg = malloc((size_t)24 * V * sizeof(float));
        for (int i = 0; i < NSEQ_; i++) {
            assert_int_equal(g[i].n_out, g1[i].n_out);
            for (int t = 0; t < g[i].n_out; t++) {
                if (out[i][t] != out1[i][t])
                    fail_msg("%s seq %d token %d: batched %d, alone %d", kind_name_(kind), i, t,
                             out[i][t], out1[i][t]);
                if (fabsf(lp[i][t] - lp1[i][t]) > 1e-4f)
                    fail_msg("%s seq %d logprob %d: batched %g, alone %g", kind_name_(kind), i, t,
                             lp[i][t], lp1[i][t]);
            }
            if (g[i].prompt_logprobs == NULL || g[i].prompt_len < 2) continue;
            /* The model's forward over the prompt: with the adapter, the LoRA model's. */
            const int n = g[i].prompt_len - 1;
            float want[24], loss;
            zdp_lm_batch b = {.inputs = prompts[i], .targets = prompts[i] + 1, .logprobs = want,
                              .B = 1, .T = n};
            const zdp_model *fm = lm[i % 3] != NULL ? lm[i % 3] : &m;
            const float *const *fp = lm[i % 3] != NULL ? C_(ad[i % 3]) : C_(bp);
            if (zdp_model_forward_dense(fm, fp, &b, &loss, &err) != ZDP_OK) fail_msg("%s", err.msg);
            assert_true(plp[i][0] == 0.0f);
            for (int t = 0; t < n; t++)
                if (fabsf(want[t] - plp[i][t + 1]) > 1e-4f)
                    fail_msg("%s seq %d prompt logprob %d: %g, the forward's %g", kind_name_(kind),
                             i, t + 1, plp[i][t + 1], want[t]);
        }
        free(lg);
        free_params_(a2, &l2);
        free_params_(a1, &l1);
        zdp_lora_destroy(&l2);
        zdp_lora_destroy(&l1);
        free_params_(bp, &m);
        zdp_model_destroy(&m);
    }
}

static void test_bad_adapter(void **state) {
    (void)state;
    zdp_model m, other, lora;
    float **bp = make_base_(&m, LLAMA_, 16, 0);
    float **op = make_base_(&other, LLAMA_, 20, 0);
    float **ap = make_lora_(&lora, &other, op, 2, ZDP_LORA_ATTN, 0, 0.0f, 3);
    zdp_error err;
    int32_t prompt[4] = {1, 2, 3, 4}, out[4];
    zdp_gen_seq g = {.prompt = prompt, .prompt_len = 4, .max_tokens = 2, .out = out,
                     .lora = &lora, .adapter = C_(ap)};
    /* An adapter trained over a base of another hidden size. */
    assert_int_equal(zdp_generate(&m, C_(bp), NULL, &g, 1, 1, NULL, &err), ZDP_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "seqs[0].lora"));
    assert_non_null(strstr(err.msg, "model.layers.0.self_attn.q_proj"));
    assert_non_null(strstr(err.msg, "another base"));
    /* Its own base: fine; without the tensors: refused. */
    int32_t out2[4];
    zdp_gen_seq g2 = g;
    g2.out = out2;
    assert_int_equal(zdp_generate(&other, C_(op), NULL, &g2, 1, 1, NULL, &err), ZDP_OK);
    g2.adapter = NULL;
    assert_int_equal(zdp_generate(&other, C_(op), NULL, &g2, 1, 1, NULL, &err),
                     ZDP_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "seqs[0].adapter is NULL"));
    zdp_kv_cache *kv;
    assert_int_equal(zdp_kv_create(&m, 2, 0, &kv, &err), ZDP_OK);
    assert_int_equal(zdp_kv_set_adapter(kv, 2, NULL, NULL, &err), ZDP_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "slot = 2"));
    assert_int_equal(zdp_kv_set_adapter(kv, 0, &lora, C_(ap), &err), ZDP_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "slot 0"));
    /* Not a LoRA model. */
    assert_int_equal(zdp_kv_set_adapter(kv, 0, &other, C_(op), &err), ZDP_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "not a LoRA model"));
    zdp_kv_destroy(kv);
    free_params_(ap, &lora);
    zdp_lora_destroy(&lora);
    free_params_(op, &other);
    zdp_model_destroy(&other);
    free_params_(bp, &m);
    zdp_model_destroy(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_logits_match_lora_forward),
        cmocka_unit_test(test_greedy_equals_merged),
        cmocka_unit_test(test_mixed_batch_equals_alone),
        cmocka_unit_test(test_bad_adapter),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
