/*
 * test_sample.c -- the KV cache and batched generation (zdp/sample.h) on
 * tiny GPT-2, Llama (GQA, attention biases, llama3 rope scaling, untied) and
 * Qwen3 (q/k norm, head_dim 38 != H/NH: decode attention's 32-wide blocks and
 * their tail, one KV head, tied) models with random
 * weights:
 *   - every logit of a prefill and of each later one-position step equals
 *     the full forward's (zdp_lm_next_logits) within fp32 tolerance;
 *   - cached greedy decoding equals uncached greedy token for token;
 *   - sequences with their own lengths, stops, temperature, top-k, top-p
 *     and seeds, generated together with continuous batching, equal the
 *     same sequences generated alone, and an uncached sampler;
 *   - prompt logprobs equal the full forward's;
 *   - a long prompt's rows (attention as products, in blocks) equal the
 *     full forward's, and bit for bit the same prompt prefilled alone;
 *   - sequences joining with the same prompt prefill it once and still
 *     equal each alone;
 *   - zdp_sample_token's top-k cut-off (selected, not sorted) draws what a
 *     sort-based one draws; its top-p cut (selected) too, ties kept;
 *   - its float exps: the sampled token's logprob within 1e-5 of
 *     zdp_logprob_of's (double) on random, huge-spread, all-equal and
 *     masked rows, the exp's relative error over -86..0; the empirical
 *     frequencies of its draws are the exact probabilities (temperature,
 *     top_k, top_p, both);
 *   - decode attention's AVX-512 scores (16 positions at a time) equal the
 *     one-position dot products bit for bit, and its weighted values on
 *     each SIMD path (AVX-512, AVX2, portable) give the same bits;
 *   - a prompt shared in place (zdp_kv_share_slot: attended once per group
 *     of rows) gives the logits of the same prompt copied into each slot,
 *     bit for bit, through a shared slot's clearing and a copy of a sharer;
 *   - the cache stores only the KV heads; bad input is refused naming it.
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
#include "nn/gemm.h"
#include "nn/nn.h"
#include "zdp/zdp.h"

typedef struct fx {
    zdp_model m;
    float **p;
    int np;
    int kind;
} fx;

/* The tiny model of `kind` (unit_lm.h's make_base_: Llama with llama3 rope
 * scaling), hidden 16. */
static void fx_make_(fx *f, int kind) {
    memset(f, 0, sizeof *f);
    f->kind = kind;
    f->p = make_base_(&f->m, kind, 16, 1);
    f->np = f->m.n_params;
}

static void kv_fx_free_(fx *f) {
    free_params_(f->p, &f->m);
    zdp_model_destroy(&f->m);
}

#define P_(f) ((const float *const *)(f)->p)

/* Prefill 5 positions (all logits), then one position per step up to the
 * context, in slot 1 of 2 (slot 0 holds another sequence): every logit
 * equals the full forward's. */
static void test_logits_match_full_forward(void **state) {
    (void)state;
    for (int kind = 0; kind < N_KINDS_; kind++) {
        fx f;
        fx_make_(&f, kind);
        const int V = f.m.vocab_size, T = f.m.block_size, P = 5;
        int32_t tok[64], other[3];
        rand_tokens_(tok, T, V, 77);
        rand_tokens_(other, 3, V, 78);
        zdp_kv_cache *kv;
        zdp_error err;
        assert_int_equal(zdp_kv_create(&f.m, 2, 0, &kv, &err), ZDP_OK);
        float *got = malloc((size_t)P * V * sizeof(float)), *want = malloc((size_t)V * sizeof(float));
        int32_t s0[3] = {0, 0, 0}, s1[5] = {1, 1, 1, 1, 1};
        assert_int_equal(zdp_lm_decode(kv, P_(&f), s0, other, 3, NULL, NULL, &err), ZDP_OK);
        if (zdp_lm_decode(kv, P_(&f), s1, tok, P, NULL, got, &err) != ZDP_OK) fail_msg("%s", err.msg);
        for (int t = 0; t < P; t++) {
            assert_int_equal(zdp_lm_next_logits(&f.m, P_(&f), tok, t + 1, want, &err), ZDP_OK);
            assert_close_(kind_name_(kind), "full forward", got + (size_t)t * V, want, V, t);
        }
        for (int t = P; t < T; t++) {
            if (zdp_lm_decode(kv, P_(&f), s1, tok + t, 1, NULL, got, &err) != ZDP_OK)
                fail_msg("%s", err.msg);
            assert_int_equal(zdp_lm_next_logits(&f.m, P_(&f), tok, t + 1, want, &err), ZDP_OK);
            assert_close_(kind_name_(kind), "full forward", got, want, V, t);
        }
        assert_int_equal(zdp_kv_length(kv, 1), T);
        assert_int_equal(zdp_kv_length(kv, 0), 3);
        /* The context is full: one more position is refused, naming it. */
        assert_int_equal(zdp_lm_decode(kv, P_(&f), s1, tok, 1, NULL, got, &err),
                         ZDP_ERR_INVALID_ARG);
        assert_non_null(strstr(err.msg, "block_size"));
        assert_int_equal(zdp_kv_length(kv, 1), T); /* nothing appended */
        zdp_kv_destroy(kv);
        free(got);
        free(want);
        kv_fx_free_(&f);
    }
}

/* A prompt's rows attend as products, in blocks of 64 query rows (decode.c,
 * runs of >= 16 rows of one slot at consecutive positions): in one pass,
 * slot 0's 70-row prompt (two blocks, the second of 6 rows), slot 2's
 * 20-row prompt and slot 1's 3 rows (short: one by one); then 20 more rows
 * for slot 0 (a run starting at position 70: keys before the block) beside
 * one decode row of slot 2, then decode steps; and three 100-row prompts in
 * one pass (300 rows: the products through cblas_sgemm).  Every logit
 * equals the full forward's; and the first pass's rows equal the same
 * prompts prefilled each alone, bit for bit (a run's blocks do not depend
 * on the batch, and passes of up to 256 rows all take the packed kernels). */
static void test_prompt_attention(void **state) {
    (void)state;
    enum { T0 = 70, T1 = 20, T2 = 20, BLOCK = 100 };
    for (int kind = 0; kind < N_KINDS_; kind++) {
        fx f;
        memset(&f, 0, sizeof f);
        f.kind = kind;
        f.p = make_base_block_(&f.m, kind, 16, 1, BLOCK);
        const int V = f.m.vocab_size, n1 = T0 + 3 + T2;
        int32_t a[BLOCK], b[BLOCK], c[3], slots[T0 + 3 + T2], tok[T0 + 3 + T2];
        rand_tokens_(a, BLOCK, V, 91);
        rand_tokens_(b, BLOCK, V, 92);
        rand_tokens_(c, 3, V, 93);
        for (int i = 0; i < n1; i++) {
            slots[i] = i < T0 ? 0 : i < T0 + 3 ? 1 : 2;
            tok[i] = i < T0 ? a[i] : i < T0 + 3 ? c[i - T0] : b[i - T0 - 3];
        }
        zdp_kv_cache *kv, *kv1;
        zdp_error err;
        assert_int_equal(zdp_kv_create(&f.m, 3, 0, &kv, &err), ZDP_OK);
        assert_int_equal(zdp_kv_create(&f.m, 3, 0, &kv1, &err), ZDP_OK);
        float *got = malloc((size_t)n1 * V * sizeof(float));
        float *alone = malloc((size_t)n1 * V * sizeof(float)), *want = malloc((size_t)V * sizeof(float));
        if (zdp_lm_decode(kv, P_(&f), slots, tok, n1, NULL, got, &err) != ZDP_OK) fail_msg("%s", err.msg);
        for (int i0 = 0; i0 < n1;) { /* each slot's rows in a pass of their own */
            int i1 = i0 + 1;
            while (i1 < n1 && slots[i1] == slots[i0]) i1++;
            if (zdp_lm_decode(kv1, P_(&f), slots + i0, tok + i0, i1 - i0, NULL, alone + (size_t)i0 * V,
                              &err) != ZDP_OK)
                fail_msg("%s", err.msg);
            i0 = i1;
        }
        for (int i = 0; i < n1; i++) {
            const int32_t *seq = slots[i] == 0 ? a : slots[i] == 1 ? c : b;
            const int t = slots[i] == 0 ? i : slots[i] == 1 ? i - T0 : i - T0 - 3;
            assert_int_equal(zdp_lm_next_logits(&f.m, P_(&f), seq, t + 1, want, &err), ZDP_OK);
            assert_close_(kind_name_(kind), "full forward", got + (size_t)i * V, want, V, i);
            /* Bit for bit where the packed kernels run (each row's products
             * do not depend on the others); the BLAS, which takes passes
             * where they lose (the portable path; past 64 rows on the AVX2
             * path), rounds a row by where it falls in the product: there
             * within tolerance. */
            if (!zdp_nn_packed_wins(n1))
                assert_close_(kind_name_(kind), "the prompt alone", got + (size_t)i * V, alone + (size_t)i * V, V, i);
            else if (memcmp(got + (size_t)i * V, alone + (size_t)i * V, (size_t)V * sizeof(float)) != 0)
                fail_msg("%s row %d: the batched pass's logits differ from the prompt alone", kind_name_(kind), i);
        }
        /* Slot 0's next 20 rows (positions 70..89) and slot 2's next token. */
        int32_t s2[T1 + 1], t2[T1 + 1];
        for (int i = 0; i < T1; i++) s2[i] = 0, t2[i] = a[T0 + i];
        s2[T1] = 2, t2[T1] = b[T2];
        if (zdp_lm_decode(kv, P_(&f), s2, t2, T1 + 1, NULL, got, &err) != ZDP_OK) fail_msg("%s", err.msg);
        for (int i = 0; i <= T1; i++) {
            const int len = i < T1 ? T0 + i + 1 : T2 + 1;
            assert_int_equal(zdp_lm_next_logits(&f.m, P_(&f), i < T1 ? a : b, len, want, &err), ZDP_OK);
            assert_close_(kind_name_(kind), "full forward (second prefill)", got + (size_t)i * V, want, V, i);
        }
        for (int t = T0 + T1; t < BLOCK; t++) { /* decode: one row, one by one */
            int32_t s0 = 0;
            if (zdp_lm_decode(kv, P_(&f), &s0, a + t, 1, NULL, got, &err) != ZDP_OK) fail_msg("%s", err.msg);
            assert_int_equal(zdp_lm_next_logits(&f.m, P_(&f), a, t + 1, want, &err), ZDP_OK);
            assert_close_(kind_name_(kind), "full forward (decode)", got, want, V, t);
        }
        /* A pass past the packed kernels' 256 rows (cblas_sgemm's products):
         * three whole prompts of 100 rows, in a fresh cache. */
        zdp_kv_cache *kv3;
        assert_int_equal(zdp_kv_create(&f.m, 3, 0, &kv3, &err), ZDP_OK);
        int32_t s3[3 * BLOCK], t3[3 * BLOCK];
        for (int i = 0; i < 3 * BLOCK; i++)
            s3[i] = i / BLOCK, t3[i] = i / BLOCK == 1 ? b[i % BLOCK] : a[i % BLOCK];
        float *g3 = malloc((size_t)3 * BLOCK * V * sizeof(float));
        if (zdp_lm_decode(kv3, P_(&f), s3, t3, 3 * BLOCK, NULL, g3, &err) != ZDP_OK) fail_msg("%s", err.msg);
        for (int i = 0; i < 3 * BLOCK; i += 7) {
            assert_int_equal(zdp_lm_next_logits(&f.m, P_(&f), i / BLOCK == 1 ? b : a, i % BLOCK + 1, want, &err),
                             ZDP_OK);
            assert_close_(kind_name_(kind), "full forward (300-row pass)", g3 + (size_t)i * V, want, V, i);
        }
        zdp_kv_destroy(kv3);
        free(g3);
        zdp_kv_destroy(kv);
        zdp_kv_destroy(kv1);
        free(got);
        free(alone);
        free(want);
        kv_fx_free_(&f);
    }
}

/* Greedy from the cache == greedy by recomputing the prefix every step. */
static void test_greedy_cached_equals_uncached(void **state) {
    (void)state;
    for (int kind = 0; kind < N_KINDS_; kind++) {
        fx f;
        fx_make_(&f, kind);
        const int V = f.m.vocab_size, T = f.m.block_size, P = 4;
        int32_t seq[64], out[64];
        rand_tokens_(seq, P, V, 5);
        zdp_gen_seq g = {.prompt = seq, .prompt_len = P, .max_tokens = T - P, .out = out};
        zdp_error err;
        if (zdp_generate(&f.m, P_(&f), NULL, &g, 1, 1, NULL, &err) != ZDP_OK) fail_msg("%s", err.msg);
        assert_int_equal(g.n_out, T - P);
        float *lg = malloc((size_t)V * sizeof(float));
        for (int t = P; t < T; t++) {
            assert_int_equal(zdp_lm_next_logits(&f.m, P_(&f), seq, t, lg, &err), ZDP_OK);
            int best = 0;
            for (int v = 1; v < V; v++)
                if (lg[v] > lg[best]) best = v;
            if (best != out[t - P])
                fail_msg("%s: step %d: cached %d, uncached %d", kind_name_(kind), t - P, out[t - P],
                         best);
            seq[t] = best;
        }
        free(lg);
        kv_fx_free_(&f);
    }
}

/* String-stop stand-in: ends a sequence once it has produced 2 tokens
 * equal to *user. */
static int stop_twice_(void *user, const int32_t *out, int n) {
    int c = 0;
    for (int i = 0; i < n; i++) c += out[i] == *(const int32_t *)user;
    return c >= 2;
}

#define NSEQ_ 7

static void make_seqs_(zdp_gen_seq *g, int32_t (*prompts)[24], int32_t (*out)[24],
                       float (*lp)[24], float (*plp)[24], int V, int32_t *stop_tok) {
    for (int i = 0; i < NSEQ_; i++) {
        const int plen = 1 + (i * 3) % 9;
        rand_tokens_(prompts[i], plen, V, 100 + (uint64_t)i);
        g[i] = (zdp_gen_seq){.prompt = prompts[i], .prompt_len = plen,
                             .max_tokens = 3 + (i * 5) % (24 - plen - 3),
                             .sp = {.temperature = i == 0 ? 0.0 : 0.6 + 0.2 * i,
                                    .top_k = i % 3 == 1 ? 5 : 0,
                                    .top_p = i % 3 == 2 ? 0.8 : 1.0},
                             .seed = 9000 + (uint64_t)i, .out = out[i], .out_logprobs = lp[i],
                             .prompt_logprobs = i % 2 ? plp[i] : NULL};
        if (i == 3) g[i].stop_ids = stop_tok, g[i].n_stop_ids = 1;
        if (i == 4) g[i].stop_fn = stop_twice_, g[i].stop_user = stop_tok;
    }
}

/* Seven sequences decoded three at a time (continuous batching) equal each
 * generated alone, and an uncached sampler that recomputes the prefix. */
static void test_batched_equals_alone(void **state) {
    (void)state;
    for (int kind = 0; kind < N_KINDS_; kind++) {
        fx f;
        fx_make_(&f, kind);
        const int V = f.m.vocab_size;
        static int32_t prompts[NSEQ_][24], out[NSEQ_][24], out1[NSEQ_][24];
        static float lp[NSEQ_][24], lp1[NSEQ_][24], plp[NSEQ_][24], plp1[NSEQ_][24];
        int32_t stop_tok = 3;
        zdp_gen_seq g[NSEQ_], g1[NSEQ_];
        make_seqs_(g, prompts, out, lp, plp, V, &stop_tok);
        make_seqs_(g1, prompts, out1, lp1, plp1, V, &stop_tok);
        zdp_error err;
        zdp_gen_stats stats;
        if (zdp_generate(&f.m, P_(&f), NULL, g, NSEQ_, 3, &stats, &err) != ZDP_OK)
            fail_msg("%s", err.msg);
        assert_true(stats.passes < stats.decode_tokens); /* sequences shared passes */
        for (int i = 0; i < NSEQ_; i++)
            if (zdp_generate(&f.m, P_(&f), NULL, &g1[i], 1, 1, NULL, &err) != ZDP_OK)
                fail_msg("%s", err.msg);
        int stopped = 0;
        float *lg = malloc((size_t)V * sizeof(float));
        for (int i = 0; i < NSEQ_; i++) {
            assert_int_equal(g[i].n_out, g1[i].n_out);
            assert_int_equal(g[i].stopped, g1[i].stopped);
            stopped += g[i].stopped;
            for (int t = 0; t < g[i].n_out; t++) {
                if (out[i][t] != out1[i][t])
                    fail_msg("%s seq %d token %d: batched %d, alone %d", kind_name_(kind), i, t,
                             out[i][t], out1[i][t]);
                assert_true(fabsf(lp[i][t] - lp1[i][t]) < 1e-4f);
            }
            /* The uncached sampler: the same stream, the full forward. */
            int32_t seq[48];
            memcpy(seq, prompts[i], (size_t)g[i].prompt_len * sizeof(int32_t));
            uint64_t rng = g[i].seed;
            for (int t = 0; t < g[i].n_out; t++) {
                const int n = g[i].prompt_len + t;
                assert_int_equal(zdp_lm_next_logits(&f.m, P_(&f), seq, n, lg, &err), ZDP_OK);
                float want_lp;
                int tok = zdp_sample_token(lg, V, &g[i].sp, &rng, &want_lp);
                if (tok != out[i][t])
                    fail_msg("%s seq %d token %d: cached %d, uncached %d", kind_name_(kind), i, t,
                             out[i][t], tok);
                assert_true(fabsf(want_lp - lp[i][t]) < 1e-4f);
                seq[n] = tok;
            }
            if (g[i].prompt_logprobs != NULL) {
                assert_true(plp[i][0] == 0.0f);
                for (int t = 1; t < g[i].prompt_len; t++) {
                    assert_int_equal(zdp_lm_next_logits(&f.m, P_(&f), prompts[i], t, lg, &err),
                                     ZDP_OK);
                    const float w = zdp_logprob_of(lg, V, prompts[i][t]);
                    if (fabsf(w - plp[i][t]) > 1e-4f)
                        fail_msg("%s seq %d prompt logprob %d: %g, want %g", kind_name_(kind), i, t,
                                 plp[i][t], w);
                }
            }
            if (g[i].stopped && g[i].stop_ids != NULL) assert_int_equal(out[i][g[i].n_out - 1], 3);
        }
        free(lg);
        (void)stopped;
        kv_fx_free_(&f);
    }
}

/* Sequences with the same prompt joining in the same pass prefill it once
 * (the others copy its keys, values and last logits): each still equals the
 * same sequence generated alone; one that asks for prompt logprobs and one
 * with another prompt run their own prefill. */
static void test_shared_prompt(void **state) {
    (void)state;
    for (int kind = 0; kind < N_KINDS_; kind++) {
        fx f;
        fx_make_(&f, kind);
        const int V = f.m.vocab_size, PL = 5, NS = 6;
        int32_t a[5], b[5], out[6][12], out1[6][12];
        float lp[6][12], lp1[6][12], plp[5], plp1[5];
        rand_tokens_(a, PL, V, 71);
        rand_tokens_(b, PL, V, 72);
        zdp_gen_seq g[6], g1[6];
        for (int i = 0; i < NS; i++) {
            g[i] = (zdp_gen_seq){.prompt = i == 5 ? b : a, .prompt_len = PL, .max_tokens = 4 + i,
                                 .sp = {.temperature = i == 0 ? 0.0 : 0.7 + 0.1 * i},
                                 .seed = 500 + (uint64_t)i, .out = out[i], .out_logprobs = lp[i],
                                 .prompt_logprobs = i == 4 ? plp : NULL};
            g1[i] = g[i], g1[i].out = out1[i], g1[i].out_logprobs = lp1[i];
            g1[i].prompt_logprobs = i == 4 ? plp1 : NULL;
        }
        zdp_error err;
        zdp_gen_stats stats;
        if (zdp_generate(&f.m, P_(&f), NULL, g, NS, NS, &stats, &err) != ZDP_OK) fail_msg("%s", err.msg);
        /* Sequences 1-3 copy sequence 0's prefill; 4 (prompt logprobs) and 5 run theirs. */
        assert_int_equal(stats.prefill_shared, 3 * PL);
        assert_int_equal(stats.prefill_tokens, 3 * PL);
        for (int i = 0; i < NS; i++) {
            if (zdp_generate(&f.m, P_(&f), NULL, &g1[i], 1, 1, NULL, &err) != ZDP_OK) fail_msg("%s", err.msg);
            assert_int_equal(g[i].n_out, g1[i].n_out);
            for (int t = 0; t < g[i].n_out; t++) {
                if (out[i][t] != out1[i][t])
                    fail_msg("%s seq %d token %d: shared prefill %d, alone %d", kind_name_(kind), i, t,
                             out[i][t], out1[i][t]);
                assert_true(fabsf(lp[i][t] - lp1[i][t]) < 1e-4f);
            }
        }
        for (int t = 1; t < PL; t++) assert_true(fabsf(plp[t] - plp1[t]) < 1e-4f);
        /* Two slots: 0 and 1 join together and share; 2 and 3 join alone as
         * 0 and 1 finish (4 and 5 tokens), each in its own pass. */
        if (zdp_generate(&f.m, P_(&f), NULL, g, 4, 2, &stats, &err) != ZDP_OK) fail_msg("%s", err.msg);
        assert_int_equal(stats.prefill_shared, PL);
        for (int i = 0; i < 4; i++)
            for (int t = 0; t < g[i].n_out; t++) assert_int_equal(out[i][t], out1[i][t]);
        kv_fx_free_(&f);
    }
}

/* GQA: the cache holds KV heads only (Qwen3 here: 1 KV head of 4). */
/* Decode attention's AVX-512 scores (kv_attention.c's row_scores_avx512_: head_dim a
 * multiple of 16, blocks of 16 positions) against the one-position dot
 * products (packed path 1, whose products round as path 2's: FMA chains in
 * k order): the same logits bit for bit, and the full forward's within
 * tolerance.  Three slots of 5, 16 and 37 prompt positions (fed in passes of
 * at most 15 rows), then 20 steps of
 * the three rows, so the blocks end short and full; a GQA Llama (6 query
 * heads on 2 KV heads, head_dim 32), a GPT-2 with head size 16 and two with
 * 6 heads, of 64 (gpt-m's) and of 32: the weighted values read each value
 * row whole in one walk of 6 heads, not fetched to L2 during the scores. */
static void test_decode_scores_paths(void **state) {
    (void)state;
    if (zdp_nn_packed_use_path(2) != 2) { /* the CPU lacks AVX-512: nothing to compare */
        zdp_nn_packed_use_path(99);
        skip();
    }
    /* The packed products on both paths (on path 1 the default gives them
     * to the BLAS, which rounds otherwise): only the scores differ. */
    const int mode = zdp_nn_gemm_use_mode(2);
    for (int kind = 0; kind < 4; kind++) {
        zdp_model m;
        zdp_error err;
        zdp_status st;
        enum { BLK = 64, STEPS = 20 };
        if (kind == 0) {
            zdp_llama_config c = {.arch = ZDP_ARCH_LLAMA, .n_layer = 2, .hidden = 48, .n_head = 6,
                                  .n_kv_head = 2, .head_dim = 32, .ffn = 40, .vocab_size = 41,
                                  .block_size = BLK, .max_position_embeddings = BLK,
                                  .rms_norm_eps = 1e-5f, .rope_theta = 500.0,
                                  .initializer_range = 0.02};
            st = zdp_llama_create(&c, 1, &m, &err);
        } else {
            zdp_gpt_config c = {.n_layer = 2, .n_head = kind == 1 ? 3 : 6,
                                .n_embd = kind == 1 ? 48 : kind == 2 ? 384 : 192, .vocab_size = 37,
                                .block_size = BLK};
            st = zdp_gpt_create(&c, 1, &m, &err);
        }
        if (st != ZDP_OK) fail_msg("%s", err.msg);
        const char *name = kind == 0 ? "llama" : kind == 1 ? "gpt hd 16" : kind == 2 ? "gpt 6 x 64" : "gpt 6 x 32";
        float **p = alloc_fill_(&m, 99 + (uint64_t)kind, 0.6f, 0.3f, 1.0f);
        const int V = m.vocab_size, lens[3] = {5, 16, 37};
        int32_t tok[3][BLK];
        for (int i = 0; i < 3; i++) rand_tokens_(tok[i], BLK, V, 7 + (uint64_t)i);
        float *got[2];
        for (int pass = 0; pass < 2; pass++) { /* path 2 (vector scores), then 1 */
            assert_int_equal(zdp_nn_packed_use_path(2 - pass), 2 - pass);
            got[pass] = malloc((size_t)(STEPS + 1) * 3 * V * sizeof(float));
            zdp_kv_cache *kv;
            assert_int_equal(zdp_kv_create(&m, 3, BLK, &kv, &err), ZDP_OK);
            /* The prompts in passes of at most 15 rows, so that their rows
             * attend one by one too (runs of 16 go to zdp_nn_kv_attend_prompt_block, whose
             * products are its own AVX-512 kernels on path 2 and
             * cblas_sgemm on path 1: different roundings). */
            for (int i = 0; i < 3; i++)
                for (int t0 = 0; t0 < lens[i]; t0 += 15) {
                    const int nt = lens[i] - t0 < 15 ? lens[i] - t0 : 15;
                    int32_t sl[15];
                    for (int t = 0; t < nt; t++) sl[t] = i;
                    uint8_t want[15] = {0};
                    want[nt - 1] = 1;
                    const bool last = t0 + nt == lens[i];
                    if (zdp_lm_decode(kv, (const float *const *)p, sl, tok[i] + t0, nt,
                                      last ? want : NULL, last ? got[pass] + (size_t)i * V : NULL,
                                      &err) != ZDP_OK)
                        fail_msg("%s", err.msg);
                }
            const int32_t slots[3] = {0, 1, 2};
            for (int step = 0; step < STEPS; step++) {
                int32_t nx[3];
                for (int i = 0; i < 3; i++) nx[i] = tok[i][lens[i] + step];
                if (zdp_lm_decode(kv, (const float *const *)p, slots, nx, 3, NULL,
                                  got[pass] + (size_t)(step + 1) * 3 * V, &err) != ZDP_OK)
                    fail_msg("%s", err.msg);
            }
            zdp_kv_destroy(kv);
        }
        zdp_nn_packed_use_path(99); /* back to the best */
        for (int64_t k = 0; k < (int64_t)(STEPS + 1) * 3 * V; k++)
            if (memcmp(&got[0][k], &got[1][k], sizeof(float)) != 0)
                fail_msg("%s: logit %lld: vector scores %.9g, one by one %.9g", name,
                         (long long)k, got[0][k], got[1][k]);
        /* And the full forward's, for slot 2 at every step. */
        float *lg = malloc((size_t)V * sizeof(float));
        for (int step = 0; step <= STEPS; step++) {
            assert_int_equal(zdp_lm_next_logits(&m, (const float *const *)p, tok[2], lens[2] + step, lg, &err),
                             ZDP_OK);
            assert_close_(name, "full forward", got[0] + ((size_t)step * 3 + 2) * V, lg, V,
                          step);
        }
        free(lg), free(got[0]), free(got[1]);
        free_params_(p, &m);
        zdp_model_destroy(&m);
    }
    zdp_nn_gemm_use_mode(mode);
}

/* Decode attention's weighted values (kv_attention.c's weigh_values_) on each path: AVX-512
 * (2), AVX2+FMA (1) and portable C (0), each lane one fused multiply-add
 * per position in order, so the same bits.  One row per pass, so every
 * product is cblas_sgemv's on each path (a batch's packed products round
 * otherwise on path 0) and only attention's code changes with the path.
 * A GQA Llama (3 query heads per KV head, head_dim 32: walks of 32 over a
 * shared value row), a GPT-2 with 7 heads of 64 (walks of 6 heads and 1,
 * 64 wide) and one with 5 heads of 48 (walks of 3 heads and 2, 32 wide,
 * then the 16-dimension scalar tail); 40 positions. */
static void test_decode_values_paths(void **state) {
    (void)state;
    for (int kind = 0; kind < 3; kind++) {
        zdp_model m;
        zdp_error err;
        zdp_status st;
        enum { BLK = 64, N = 40 };
        if (kind == 0) {
            zdp_llama_config c = {.arch = ZDP_ARCH_LLAMA, .n_layer = 2, .hidden = 48, .n_head = 6,
                                  .n_kv_head = 2, .head_dim = 32, .ffn = 40, .vocab_size = 41,
                                  .block_size = BLK, .max_position_embeddings = BLK,
                                  .rms_norm_eps = 1e-5f, .rope_theta = 500.0,
                                  .initializer_range = 0.02};
            st = zdp_llama_create(&c, 1, &m, &err);
        } else {
            zdp_gpt_config c = {.n_layer = 2, .n_head = kind == 1 ? 7 : 5,
                                .n_embd = kind == 1 ? 448 : 240, .vocab_size = 37, .block_size = BLK};
            st = zdp_gpt_create(&c, 1, &m, &err);
        }
        if (st != ZDP_OK) fail_msg("%s", err.msg);
        const char *name = kind == 0 ? "llama" : kind == 1 ? "gpt 7 x 64" : "gpt 5 x 48";
        float **p = alloc_fill_(&m, 123 + (uint64_t)kind, 0.6f, 0.3f, 1.0f);
        const int V = m.vocab_size;
        int32_t tok[N];
        rand_tokens_(tok, N, V, 17 + (uint64_t)kind);
        float *got[3] = {NULL, NULL, NULL};
        for (int path = 2; path >= 0; path--) {
            if (zdp_nn_packed_use_path(path) != path) continue; /* the CPU lacks it */
            got[path] = malloc((size_t)N * V * sizeof(float));
            zdp_kv_cache *kv;
            assert_int_equal(zdp_kv_create(&m, 1, BLK, &kv, &err), ZDP_OK);
            const int32_t slot = 0;
            for (int t = 0; t < N; t++)
                if (zdp_lm_decode(kv, (const float *const *)p, &slot, tok + t, 1, NULL,
                                  got[path] + (size_t)t * V, &err) != ZDP_OK)
                    fail_msg("%s", err.msg);
            zdp_kv_destroy(kv);
        }
        zdp_nn_packed_use_path(99); /* back to the best */
        int ref = 2; /* the best path this CPU has (0 always runs) */
        while (got[ref] == NULL) ref--;
        for (int path = ref - 1; path >= 0; path--)
            for (int64_t k = 0; k < (int64_t)N * V; k++)
                if (memcmp(&got[path][k], &got[ref][k], sizeof(float)) != 0)
                    fail_msg("%s: position %lld, logit %lld: path %d %.9g, path %d %.9g", name,
                             (long long)(k / V), (long long)(k % V), path, got[path][k], ref,
                             got[ref][k]);
        free(got[0]), free(got[1]), free(got[2]);
        free_params_(p, &m);
        zdp_model_destroy(&m);
    }
}

/* A prompt shared in place (zdp_kv_share_slot) against the same prompt
 * copied (zdp_kv_copy_slot), on two caches fed the same rows: every logit
 * bit for bit.  Slots 0-2 share a 70-position prompt (past a 64-position
 * block of kv_attention.c's grouped values), 3-4 a 21-position one, 5 has its own;
 * 20 decode steps of all six with different tokens; at step 8 the shared
 * slot 0 is cleared (its prompt moves to a sharer) and takes a new 9-token
 * prompt, at step 12 slot 5 becomes a copy of sharer 1.  A GQA Llama (3
 * query heads per KV head, head_dim 32), a GPT-2 with head size 16 (the
 * scalar tail) and one with 7 heads of 64 (the vector walks over the
 * prompt's values, three rows at a time, fetching the next head's and the
 * next block's; each row's own values in walks of 6 heads and 1), on the
 * AVX-512 scores and on the one-position loop. */
static void test_decode_shared_prompt(void **state) {
    (void)state;
    for (int kind = 0; kind < 3; kind++)
        for (int path = 2; path >= 1; path--) {
            if (zdp_nn_packed_use_path(path) != path) continue; /* the CPU lacks it */
            zdp_model m;
            zdp_error err;
            zdp_status st;
            enum { BLK = 128, STEPS = 20, NS = 6 };
            if (kind == 0) {
                zdp_llama_config c = {.arch = ZDP_ARCH_LLAMA, .n_layer = 2, .hidden = 48, .n_head = 6,
                                      .n_kv_head = 2, .head_dim = 32, .ffn = 40, .vocab_size = 41,
                                      .block_size = BLK, .max_position_embeddings = BLK,
                                      .rms_norm_eps = 1e-5f, .rope_theta = 500.0,
                                      .initializer_range = 0.02};
                st = zdp_llama_create(&c, 1, &m, &err);
            } else {
                zdp_gpt_config c = {.n_layer = 2, .n_head = kind == 1 ? 3 : 7,
                                    .n_embd = kind == 1 ? 48 : 448, .vocab_size = 37,
                                    .block_size = BLK};
                st = zdp_gpt_create(&c, 1, &m, &err);
            }
            if (st != ZDP_OK) fail_msg("%s", err.msg);
            float **p = alloc_fill_(&m, 55 + (uint64_t)kind, 0.6f, 0.3f, 1.0f);
            const float *const *P = (const float *const *)p;
            const int V = m.vocab_size, lens[3] = {70, 21, 5}, at[3] = {0, 3, 5};
            int32_t tok[4][BLK], steps[STEPS][NS];
            for (int i = 0; i < 4; i++) rand_tokens_(tok[i], BLK, V, 31 + (uint64_t)i);
            rand_tokens_(&steps[0][0], STEPS * NS, V, 41);
            float *got[2];
            /* Both caches at once: a cache made after the other's freeing
             * could get its memory, copies and all, and hide a lost prompt. */
            zdp_kv_cache *caches[2];
            for (int share = 0; share < 2; share++)
                assert_int_equal(zdp_kv_create(&m, NS, BLK, &caches[share], &err), ZDP_OK);
            for (int share = 0; share < 2; share++) {
                got[share] = malloc((size_t)STEPS * NS * V * sizeof(float));
                zdp_kv_cache *kv = caches[share];
                for (int i = 0; i < 3; i++) {
                    int32_t sl[BLK];
                    for (int t = 0; t < lens[i]; t++) sl[t] = at[i];
                    if (zdp_lm_decode(kv, P, sl, tok[i], lens[i], NULL, NULL, &err) != ZDP_OK)
                        fail_msg("%s", err.msg);
                }
                void (*dup)(zdp_kv_cache *, int, int) = share ? zdp_kv_share_slot : zdp_kv_copy_slot;
                dup(kv, 1, 0), dup(kv, 2, 0), dup(kv, 4, 3);
                const int32_t slots[NS] = {0, 1, 2, 3, 4, 5};
                for (int step = 0; step < STEPS; step++) {
                    if (step == 8) { /* the shared slot leaves; a new prompt takes it */
                        zdp_kv_clear(kv, 0);
                        int32_t sl[9] = {0};
                        if (zdp_lm_decode(kv, P, sl, tok[3], 9, NULL, NULL, &err) != ZDP_OK)
                            fail_msg("%s", err.msg);
                    }
                    if (step == 12) zdp_kv_copy_slot(kv, 5, 1);
                    if (zdp_lm_decode(kv, P, slots, steps[step], NS, NULL,
                                      got[share] + (size_t)step * NS * V, &err) != ZDP_OK)
                        fail_msg("%s", err.msg);
                }
            }
            zdp_kv_destroy(caches[0]), zdp_kv_destroy(caches[1]);
            for (int64_t k = 0; k < (int64_t)STEPS * NS * V; k++)
                if (memcmp(&got[0][k], &got[1][k], sizeof(float)) != 0)
                    fail_msg("%s, path %d: step %lld, row %lld, logit %lld: shared %.9g, copied %.9g",
                             kind == 0 ? "llama" : kind == 1 ? "gpt hd 16" : "gpt 7 x 64", path, (long long)(k / V / NS),
                             (long long)(k / V % NS), (long long)(k % V), got[1][k], got[0][k]);
            free(got[0]), free(got[1]);
            free_params_(p, &m);
            zdp_model_destroy(&m);
        }
    zdp_nn_packed_use_path(99); /* back to the best */
}

/* Sharing a slot that has decoded past its prompt copies instead (a
 * group splits its rows' value sums at the shared length, a slot alone at
 * its prompt's): the source and its sharer get a copy's bits. */
static void test_share_past_prompt(void **state) {
    (void)state;
    enum { BLK = 64, STEPS = 6 };
    zdp_gpt_config c = {.n_layer = 2, .n_head = 3, .n_embd = 48, .vocab_size = 37, .block_size = BLK};
    zdp_model m;
    zdp_error err;
    if (zdp_gpt_create(&c, 1, &m, &err) != ZDP_OK) fail_msg("%s", err.msg);
    float **p = alloc_fill_(&m, 77, 0.6f, 0.3f, 1.0f);
    const float *const *P = (const float *const *)p;
    const int V = m.vocab_size;
    int32_t prompt[12], more[3], steps[STEPS][2];
    rand_tokens_(prompt, 12, V, 5), rand_tokens_(more, 3, V, 6), rand_tokens_(&steps[0][0], 2 * STEPS, V, 7);
    float *got[2];
    for (int share = 0; share < 2; share++) {
        zdp_kv_cache *kv;
        assert_int_equal(zdp_kv_create(&m, 2, BLK, &kv, &err), ZDP_OK);
        int32_t sl[12] = {0};
        assert_int_equal(zdp_lm_decode(kv, P, sl, prompt, 12, NULL, NULL, &err), ZDP_OK);
        for (int t = 0; t < 3; t++) /* slot 0 decodes past its prompt */
            assert_int_equal(zdp_lm_decode(kv, P, sl, more + t, 1, NULL, NULL, &err), ZDP_OK);
        (share ? zdp_kv_share_slot : zdp_kv_copy_slot)(kv, 1, 0);
        got[share] = malloc((size_t)STEPS * 2 * V * sizeof(float));
        const int32_t slots[2] = {0, 1};
        for (int step = 0; step < STEPS; step++)
            assert_int_equal(zdp_lm_decode(kv, P, slots, steps[step], 2, NULL,
                                           got[share] + (size_t)step * 2 * V, &err), ZDP_OK);
        zdp_kv_destroy(kv);
    }
    assert_memory_equal(got[0], got[1], (size_t)STEPS * 2 * V * sizeof(float));
    free(got[0]), free(got[1]);
    free_params_(p, &m);
    zdp_model_destroy(&m);
}

static void test_cache_holds_kv_heads(void **state) {
    (void)state;
    fx f;
    fx_make_(&f, QWEN3_);
    zdp_kv_cache *kv;
    zdp_error err;
    assert_int_equal(zdp_kv_create(&f.m, 3, 0, &kv, &err), ZDP_OK);
    const zdp_llama_config *c = zdp_llama_config_of(&f.m);
    const int64_t kvb = 2LL * c->n_layer * 3 * c->block_size * c->n_kv_head * c->head_dim * 4;
    const int64_t rope = (int64_t)c->block_size * c->head_dim * 4;
    assert_int_equal(zdp_kv_bytes(kv), kvb + rope);
    zdp_kv_destroy(kv);
    /* max_len 7: 7 positions per slot, the 8th refused naming it. */
    assert_int_equal(zdp_kv_create(&f.m, 3, 7, &kv, &err), ZDP_OK);
    assert_int_equal(zdp_kv_bytes(kv), 2LL * c->n_layer * 3 * 7 * c->n_kv_head * c->head_dim * 4 +
                                           7LL * c->head_dim * 4);
    int32_t slots[8] = {2, 2, 2, 2, 2, 2, 2, 2}, toks[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    assert_int_equal(zdp_lm_decode(kv, P_(&f), slots, toks, 7, NULL, NULL, &err), ZDP_OK);
    assert_int_equal(zdp_lm_decode(kv, P_(&f), slots, toks, 1, NULL, NULL, &err), ZDP_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "beyond the cache's 7 per slot"));
    zdp_kv_destroy(kv);
    assert_int_equal(zdp_kv_create(&f.m, 1, 25, &kv, &err), ZDP_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "max_len = 25"));
    kv_fx_free_(&f);
}

/* zdp_topk_logprobs: order by logprob, ties by the lower id, each logprob
 * zdp_logprob_of's; k outside 1..V refused. */
static void test_topk_logprobs_order(void **state) {
    (void)state;
    const float lg[8] = {0.5f, 2.0f, -1.0f, 2.0f, 0.5f, 3.0f, -7.0f, 0.5f};
    int32_t ids[8];
    float lp[8];
    assert_int_equal(zdp_topk_logprobs(lg, 8, 4, ids, lp), ZDP_OK);
    const int32_t want[4] = {5, 1, 3, 0};
    for (int j = 0; j < 4; j++) {
        assert_int_equal(ids[j], want[j]);
        assert_true(lp[j] == zdp_logprob_of(lg, 8, want[j]));
    }
    assert_int_equal(zdp_topk_logprobs(lg, 8, 8, ids, lp), ZDP_OK);
    const int32_t all[8] = {5, 1, 3, 0, 4, 7, 2, 6};
    for (int j = 0; j < 8; j++) assert_int_equal(ids[j], all[j]);
    assert_int_equal(zdp_topk_logprobs(lg, 8, 0, ids, lp), ZDP_ERR_INVALID_ARG);
    assert_int_equal(zdp_topk_logprobs(lg, 8, 9, ids, lp), ZDP_ERR_INVALID_ARG);
}

/* The descending sort's k-th logit, the reference for zdp_sample_token's
 * top-k cut-off (it selects it without sorting). */
static int desc_(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

/* zdp_sample_token with top-k draws what a sort-based cut-off draws: the
 * same rng step over the tokens at or above the k-th largest logit (ties
 * kept), for k from 1 to V - 1, logits with many ties, k past the 64 kept
 * on the stack; at a high temperature every kept token appears and no
 * other. */
static void test_sample_topk_cut(void **state) {
    (void)state;
    enum { V = 300 };
    float lg[V], sorted[V];
    uint64_t r = 7;
    for (int trial = 0; trial < 200; trial++) {
        for (int v = 0; v < V; v++) /* ties: values on a grid of 1/8 */
            lg[v] = (float)((int)(zdp_splitmix64(&r) % 41) - 20) / 8.0f;
        memcpy(sorted, lg, sizeof lg);
        qsort(sorted, V, sizeof *sorted, desc_);
        const int k = trial < 20 ? 1 + trial : trial < 40 ? V - 1 - (trial - 20) : 1 + (int)(zdp_splitmix64(&r) % (V - 1));
        const zdp_sample_params sp = {.temperature = trial % 2 ? 1000.0 : 0.7, .top_k = k, .top_p = 1.0};
        const float cut = sorted[k - 1];
        int best = 0;
        for (int v = 1; v < V; v++)
            if (lg[v] > lg[best]) best = v;
        uint64_t seed = 100 + (uint64_t)trial, ref = seed;
        /* The reference draw: zdp_sample_token's loop over a sorted cut. */
        double sum = 0;
        for (int v = 0; v < V; v++) sum += lg[v] >= cut ? exp((lg[v] - lg[best]) / sp.temperature) : 0.0;
        const double u = (double)(zdp_splitmix64(&ref) >> 11) * 0x1.0p-53 * sum;
        double acc = 0;
        int want = best;
        for (int v = 0; v < V; v++) {
            if (lg[v] < cut) continue;
            acc += exp((lg[v] - lg[best]) / sp.temperature);
            want = v;
            if (acc >= u) break;
        }
        assert_int_equal(zdp_sample_token(lg, V, &sp, &seed, NULL), want);
        if (trial % 2 && k < 40) { /* near uniform over the kept: all of them, nothing else */
            int kept = 0, seen[V] = {0}, n_seen = 0;
            for (int v = 0; v < V; v++) kept += lg[v] >= cut;
            for (int d = 0; d < 60 * kept; d++) {
                const int t = zdp_sample_token(lg, V, &sp, &seed, NULL);
                assert_true(lg[t] >= cut);
                n_seen += !seen[t], seen[t] = 1;
            }
            assert_int_equal(n_seen, kept);
        }
    }
}

/* The sampled token's logprob is the temperature-1 log-softmax with no cut
 * (what a learner computes), through zdp_sample_token's float exps: on a
 * row {0, x} the top token's is -log1p(e^x), so each x from -86 to 0 tests
 * the exp's relative error (against libm's double exp; within 6e-7, plus
 * the double sum's resolution where e^x is below it); x past the float
 * exp's range and -inf give 0. */
static void test_sample_exp_range(void **state) {
    (void)state;
    const zdp_sample_params sp[] = {{1.0, 0, 1.0}, {0.7, 0, 1.0}, {0.0, 0, 1.0}};
    uint64_t rng = 3;
    double worst = 0;
    for (int i = 0; i <= 86 * 64; i++) {
        const float x = -(float)i / 64.0f;
        for (int order = 0; order < 2; order++) {
            const float lg[2] = {order ? x : 0.0f, order ? 0.0f : x};
            for (int c = 0; c < 3; c++) {
                float lp;
                const int t = zdp_sample_token(lg, 2, &sp[c], &rng, &lp);
                assert_true(t == 0 || t == 1);
                const double want = (double)lg[t] - log1p(exp((double)x));
                /* (2.3e-16: the double sum's resolution next to the top's 1) */
                const double rel = fabs(lp - want) / fabs(want);
                if (want != 0 && x > -13 && rel > worst) worst = rel;
                if (fabs(lp - want) > 6e-7 * fabs(want) + 2.3e-16)
                    fail_msg("x = %g, token %d: logprob %.9g, want %.9g (rel %.3g)", (double)x, t, (double)lp, want, rel);
            }
        }
    }
    const float far[][2] = {{0.0f, -88.0f}, {0.0f, -1e30f}, {0.0f, -INFINITY}, {-INFINITY, 0.0f}};
    for (int i = 0; i < 4; i++) {
        float lp;
        const int t = zdp_sample_token(far[i], 2, &sp[0], &rng, &lp);
        assert_int_equal(t, i == 3);
        assert_true(lp > -1e-37f && lp <= 0.0f);
    }
    /* Greedy (the argmax over lanes): the first of tied maxima, in the
     * lanes' body or the tail past the last 16. */
    for (int at = 0; at < 37; at += 6) {
        float ties[37] = {0};
        ties[at] = ties[36] = ties[(at + 16) % 37 > at ? (at + 16) % 37 : 36] = 2.0f;
        assert_int_equal(zdp_sample_token(ties, 37, &sp[2], &rng, NULL), at);
    }
    print_message("exp: worst relative error of -log1p(e^x) %.3g\n", worst);
}

/* Over many random rows -- a model's spread, huge spreads (1e4), all equal,
 * half masked to -inf, V up to 49,152 -- at temperature 1, 0.7 and with
 * top_k / top_p cuts, the sampled token's logprob is zdp_logprob_of's
 * (double exp) within 1e-5, and a masked token is never drawn. */
static void test_sample_logprob_rows(void **state) {
    (void)state;
    enum { VMAX = 49152 };
    float *lg = malloc(VMAX * sizeof *lg);
    assert_non_null(lg);
    uint64_t r = 11, rng = 12;
    const zdp_sample_params sp[] = {{1.0, 0, 1.0}, {0.7, 0, 1.0}, {1.0, 40, 1.0},
                                    {1.0, 0, 0.9}, {0.8, 100, 0.95}, {2.5, 0, 0.5}};
    for (int trial = 0; trial < 120; trial++) {
        const int V = trial % 4 == 0 ? VMAX : 2 + (int)(zdp_splitmix64(&r) % 3000);
        const int kind = trial % 5;
        const double spread = kind == 1 ? 1e4 : kind == 2 ? 0.0 : 3.0;
        for (int v = 0; v < V; v++) {
            const double u = (double)(zdp_splitmix64(&r) >> 11) * 0x1.0p-53;
            lg[v] = (float)(spread * (u - 0.5) * 4.0);
            if (kind == 3 && v % 2 == 1) lg[v] = -INFINITY;
            if (kind == 4) lg[v] = (float)((int)(u * 9)) / 4.0f - 30.0f; /* ties, shifted */
        }
        for (int c = 0; c < 6; c++) {
            float lp;
            const int t = zdp_sample_token(lg, V, &sp[c], &rng, &lp);
            assert_true(t >= 0 && t < V);
            assert_true(isfinite(lg[t]));
            const float want = zdp_logprob_of(lg, V, t);
            if (fabsf(lp - want) > 1e-5f)
                fail_msg("trial %d (V %d, kind %d), params %d: token %d logprob %.9g, zdp_logprob_of %.9g",
                         trial, V, kind, c, t, (double)lp, (double)want);
        }
    }
    free(lg);
}

/* The nucleus (top_p, with and without top_k) found by selection draws
 * what main's sort-based cut draws with the same uniform: a plain
 * inverse-CDF reference below, over rows with many ties (kept at the cut),
 * top_p from 0 to 1.  (Its double exps and the sampler's float ones could
 * part only when the uniform or top_p falls within ~1e-7 of a boundary.) */
static void test_sample_top_p_cut(void **state) {
    (void)state;
    enum { V = 500 };
    float lg[V], sorted[V];
    uint64_t r = 21;
    for (int trial = 0; trial < 400; trial++) {
        const int grid = trial % 3 == 0 ? 4 : 64; /* few values: many ties */
        for (int v = 0; v < V; v++)
            lg[v] = (float)((int)(zdp_splitmix64(&r) % (uint64_t)(grid * 10)) - grid * 5) / (float)grid;
        const double top_p = trial < 10 ? trial / 10.0 : (double)(zdp_splitmix64(&r) >> 11) * 0x1.0p-53;
        const int top_k = trial % 4 == 1 ? 1 + (int)(zdp_splitmix64(&r) % (V - 1)) : 0;
        const double temp = trial % 2 ? 0.7 : 1.5;
        const zdp_sample_params sp = {.temperature = temp, .top_k = top_k, .top_p = top_p};
        memcpy(sorted, lg, sizeof lg);
        qsort(sorted, V, sizeof *sorted, desc_);
        const float top = sorted[0];
        float cut = top_k > 0 ? sorted[top_k - 1] : -INFINITY;
        double sum = 0;
        for (int v = 0; v < V; v++) sum += lg[v] >= cut ? exp((lg[v] - top) / temp) : 0.0;
        double acc = 0;
        for (int k = 0; k < V && sorted[k] >= cut; k++) { /* the nucleus: sorted, ties kept */
            acc += exp((sorted[k] - top) / temp);
            if (acc >= top_p * sum) {
                cut = sorted[k];
                break;
            }
        }
        for (int d = 0; d < 20; d++) {
            uint64_t seed = 1000 * (uint64_t)trial + (uint64_t)d, ref = seed;
            double s2 = 0;
            for (int v = 0; v < V; v++) s2 += lg[v] >= cut ? exp((lg[v] - top) / temp) : 0.0;
            const double u = (double)(zdp_splitmix64(&ref) >> 11) * 0x1.0p-53 * s2;
            double a2 = 0;
            int want = -1;
            for (int v = 0; v < V; v++) {
                if (lg[v] < cut) continue;
                a2 += exp((lg[v] - top) / temp);
                want = v;
                if (a2 >= u) break;
            }
            const int got = zdp_sample_token(lg, V, &sp, &seed, NULL);
            if (got != want)
                fail_msg("trial %d draw %d (top_p %.6f, top_k %d, T %g): token %d (logit %g), the reference's %d (logit %g, cut %g)",
                         trial, d, top_p, top_k, temp, got, (double)lg[got], want, (double)lg[want], (double)cut);
        }
    }
}

/* Empirical frequencies over many draws equal the exact probabilities
 * (within 5 standard errors) at temperature 1 and 0.7, with top_k, top_p
 * (the cut falling on a tie: both kept) and both; cut tokens never drawn. */
static void test_sample_frequencies(void **state) {
    (void)state;
    enum { V = 7, DRAWS = 100000 };
    const float lg[V] = {1.0f, 2.5f, -0.5f, 2.0f, 2.0f, 0.0f, -3.0f};
    const zdp_sample_params sp[] = {{1.0, 0, 1.0}, {0.7, 0, 1.0}, {1.0, 3, 1.0},
                                    {1.0, 0, 0.6}, {0.7, 4, 0.8}};
    uint64_t rng = 77;
    for (int c = 0; c < 5; c++) {
        /* exact: the kept set by sorting, then the softmax over it */
        float sorted[V];
        memcpy(sorted, lg, sizeof lg);
        qsort(sorted, V, sizeof *sorted, desc_);
        float cut = sp[c].top_k > 0 ? sorted[sp[c].top_k - 1] : -INFINITY;
        double z = 0, acc = 0, p[V];
        for (int v = 0; v < V; v++) z += lg[v] >= cut ? exp((lg[v] - sorted[0]) / sp[c].temperature) : 0;
        for (int k = 0; k < V && sp[c].top_p < 1; k++) {
            acc += exp((sorted[k] - sorted[0]) / sp[c].temperature);
            if (acc >= sp[c].top_p * z) {
                cut = sorted[k];
                break;
            }
        }
        z = 0;
        for (int v = 0; v < V; v++) z += p[v] = lg[v] >= cut ? exp((lg[v] - sorted[0]) / sp[c].temperature) : 0;
        int count[V] = {0};
        for (int d = 0; d < DRAWS; d++) count[zdp_sample_token(lg, V, &sp[c], &rng, NULL)]++;
        for (int v = 0; v < V; v++) {
            const double pv = p[v] / z, f = (double)count[v] / DRAWS;
            const double se = sqrt(pv * (1 - pv) / DRAWS);
            if (fabs(f - pv) > 5 * se + 1e-9)
                fail_msg("params %d token %d: frequency %.5f, probability %.5f", c, v, f, pv);
        }
    }
}

/* Top-k prompt logprobs from the prefill, beside another sequence in the
 * batch: row t lists the k most likely tokens of a full forward of
 * prompt[<t] (nothing left out is more likely than the last listed) with
 * its logprobs; row 0 is the sentinel.  Also with max_tokens 0 (prompt
 * logprobs only) and k = V. */
static void test_prompt_topk(void **state) {
    (void)state;
    for (int kind = 0; kind < N_KINDS_; kind++) {
        fx f;
        fx_make_(&f, kind);
        const int V = f.m.vocab_size, P = 9;
        int32_t pa[9], pb[5], oa[4], ob[4];
        rand_tokens_(pa, P, V, 77);
        rand_tokens_(pb, 5, V, 78);
        for (int pass = 0; pass < 2; pass++) {
            const int k = pass == 0 ? 5 : V;
            int32_t *ids = malloc((size_t)P * k * sizeof *ids);
            float *lps = malloc((size_t)P * k * sizeof *lps), plp[9];
            zdp_gen_seq g[2] = {
                {.prompt = pb, .prompt_len = 5, .max_tokens = 4, .out = ob, .seed = 1},
                {.prompt = pa, .prompt_len = P, .max_tokens = pass == 0 ? 4 : 0, .out = oa,
                 .prompt_logprobs = plp, .prompt_topk = k, .prompt_topk_ids = ids,
                 .prompt_topk_logprobs = lps, .seed = 2}};
            zdp_error err;
            if (zdp_generate(&f.m, P_(&f), NULL, g, 2, 2, NULL, &err) != ZDP_OK)
                fail_msg("%s", err.msg);
            for (int j = 0; j < k; j++) assert_true(ids[j] == -1 && isnan(lps[j]));
            float *lg = malloc((size_t)V * sizeof(float));
            for (int t = 1; t < P; t++) {
                assert_int_equal(zdp_lm_next_logits(&f.m, P_(&f), pa, t, lg, &err), ZDP_OK);
                const int32_t *row = ids + (int64_t)t * k;
                const float *rl = lps + (int64_t)t * k;
                uint8_t *listed = calloc((size_t)V, 1);
                for (int j = 0; j < k; j++) {
                    assert_true(row[j] >= 0 && row[j] < V && !listed[row[j]]);
                    listed[row[j]] = 1;
                    if (j > 0) assert_true(rl[j] <= rl[j - 1]);
                    const float w = zdp_logprob_of(lg, V, row[j]);
                    if (fabsf(w - rl[j]) > 1e-4f)
                        fail_msg("%s k %d row %d #%d (id %d): %g, full forward %g", kind_name_(kind),
                                 k, t, j, row[j], rl[j], w);
                }
                for (int v = 0; v < V; v++)
                    if (!listed[v] && zdp_logprob_of(lg, V, v) > rl[k - 1] + 1e-4f)
                        fail_msg("%s row %d: token %d (logprob %g) left out of the top %d",
                                 kind_name_(kind), t, v, zdp_logprob_of(lg, V, v), k);
                /* The prompt token's own logprob, where it is listed, is the same number. */
                for (int j = 0; j < k; j++)
                    if (row[j] == pa[t]) assert_true(fabsf(rl[j] - plp[t]) < 1e-6f);
                free(listed);
            }
            free(lg), free(ids), free(lps);
        }
        kv_fx_free_(&f);
    }
}

static void test_bad_input(void **state) {
    (void)state;
    fx f;
    fx_make_(&f, LLAMA_);
    zdp_error err;
    int32_t prompt[30] = {0}, out[30];
    zdp_gen_seq g = {.prompt = prompt, .prompt_len = 20, .max_tokens = 5, .out = out};
    assert_int_equal(zdp_generate(&f.m, P_(&f), NULL, &g, 1, 1, NULL, &err), ZDP_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "seqs[0].max_tokens = 5"));
    assert_non_null(strstr(err.msg, "at most 4"));
    g.prompt_len = 25;
    assert_int_equal(zdp_generate(&f.m, P_(&f), NULL, &g, 1, 1, NULL, &err), ZDP_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "seqs[0].prompt_len = 25"));
    g.prompt_len = 3, prompt[1] = 41;
    assert_int_equal(zdp_generate(&f.m, P_(&f), NULL, &g, 1, 1, NULL, &err), ZDP_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "seqs[0].prompt[1] = 41"));
    prompt[1] = 0;
    assert_int_equal(zdp_generate(&f.m, P_(&f), NULL, &g, 1, 0, NULL, &err), ZDP_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "batch = 0"));
    zdp_kv_cache *kv;
    assert_int_equal(zdp_kv_create(&f.m, 1, 0, &kv, &err), ZDP_OK);
    int32_t slot = 1, tok = 0;
    assert_int_equal(zdp_lm_decode(kv, P_(&f), &slot, &tok, 1, NULL, NULL, &err),
                     ZDP_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "slots[0] = 1"));
    g.prompt_topk = 3; /* no outputs given */
    assert_int_equal(zdp_generate(&f.m, P_(&f), NULL, &g, 1, 1, NULL, &err), ZDP_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "seqs[0].prompt_topk = 3 needs prompt_topk_ids"));
    g.prompt_topk = f.m.vocab_size + 1;
    assert_int_equal(zdp_generate(&f.m, P_(&f), NULL, &g, 1, 1, NULL, &err), ZDP_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "must be in 0.."));
    g.prompt_topk = 0;
    zdp_gen_seq two[2] = {g, g};
    assert_int_equal(zdp_generate(&f.m, P_(&f), kv, two, 2, 2, NULL, &err), ZDP_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "fewer than batch = 2"));
    zdp_kv_destroy(kv);
    zdp_model mlp;
    assert_int_equal(zdp_mlp_create(4, 1, 1, &mlp, &err), ZDP_OK);
    assert_int_equal(zdp_kv_create(&mlp, 1, 0, &kv, &err), ZDP_ERR_INVALID_ARG);
    zdp_mlp_destroy(&mlp);
    kv_fx_free_(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_logits_match_full_forward),
        cmocka_unit_test(test_prompt_attention),
        cmocka_unit_test(test_greedy_cached_equals_uncached),
        cmocka_unit_test(test_batched_equals_alone),
        cmocka_unit_test(test_shared_prompt),
        cmocka_unit_test(test_decode_scores_paths),
        cmocka_unit_test(test_decode_values_paths),
        cmocka_unit_test(test_decode_shared_prompt),
        cmocka_unit_test(test_share_past_prompt),
        cmocka_unit_test(test_cache_holds_kv_heads),
        cmocka_unit_test(test_topk_logprobs_order),
        cmocka_unit_test(test_sample_topk_cut),
        cmocka_unit_test(test_sample_exp_range),
        cmocka_unit_test(test_sample_logprob_rows),
        cmocka_unit_test(test_sample_top_p_cut),
        cmocka_unit_test(test_sample_frequencies),
        cmocka_unit_test(test_prompt_topk),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
