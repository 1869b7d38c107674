/*
 * test_gpt_policy_loss.c -- Tinker's policy losses as reweighted
 * cross-entropy: src/models/policy_loss.c and zdp_lm_set_loss_weights.
 *
 *   - zdp_policy_loss against hand-worked values for every kind, PPO's four
 *     clip cases and its tie rule, the exponent clamp, and its errors (each
 *     names the array, index or field; a failing call writes nothing).
 *   - The point of it all: for each kind, on a tiny GPT, forward (logprobs),
 *     coefficients from zdp_policy_loss, zdp_lm_set_loss_weights, backward
 *     with loss scale B*T, against central finite differences of the true
 *     loss L = sum_t el_t, which this file computes itself in double from the
 *     model's forward log-probabilities at perturbed parameters (cispo with
 *     clip(r) frozen at the unperturbed point: its stop-gradient).  q is set
 *     so that lp - q falls on both sides of log 0.8 and log 1.2, with
 *     advantages of both signs, so every PPO/CISPO clip case is exercised.
 *   - zdp_lm_set_loss_weights: the same gradient as forward with
 *     batch.weights; a later call wins; errors (no forward, used-up forward,
 *     wrong n, NULL, NaN/inf, not a language model) change nothing.
 */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/unit_lm.h"
#include "engine/engine.h"
#include "models/policy_loss.h"
#include "zdp/zdp.h"

/* ---- helpers ------------------------------------------------------------------ */

static void near_(const char *what, int64_t i, double got, double want, double tol) {
    if (!(fabs(got - want) <= tol * (1.0 + fabs(want))))
        fail_msg("%s[%lld]: got %.9g, want %.9g", what, (long long)i, got, want);
}

/* ---- zdp_policy_loss on its own ------------------------------------------------- */

/* Hand-worked values: r is set exactly through lp - q = log r. */
static void test_policy_loss_values(void **state) {
    (void)state;
    const zdp_loss_config cfg = {.clip_low = 0.8, .clip_high = 1.2, .beta = 0.5};
    enum { N = 5 };
    /* r:      1.5 (above hi), 0.5 (below lo), 1.0 (inside), 1.2 (on hi), 0.8 (on lo) */
    const double r[N] = {1.5, 0.5, 1.0, 1.2, 0.8};
    float lp[N], q[N], apos[N], aneg[N], coef[N], el[N];
    for (int t = 0; t < N; t++) {
        lp[t] = -1.0f - 0.25f * (float)t;
        q[t] = (float)((double)lp[t] - log(r[t]));
        apos[t] = 2.0f;
        aneg[t] = -2.0f;
    }
    /* r as the helper sees it (float inputs): within 1e-6 of r. */
    double rr[N];
    for (int t = 0; t < N; t++) rr[t] = exp((double)lp[t] - (double)q[t]);
    double sum;

    /* importance_sampling: c = r A, el = -r A. */
    assert_int_equal(zdp_policy_loss(ZDP_LOSS_IMPORTANCE_SAMPLING, &cfg, N, lp, q, apos, NULL,
                                     coef, el, &sum, NULL), ZDP_OK);
    for (int t = 0; t < N; t++) {
        near_("is coef", t, coef[t], 2.0 * r[t], 1e-6);
        near_("is el", t, el[t], -2.0 * r[t], 1e-6);
    }
    near_("is sum", 0, sum, -2.0 * (1.5 + 0.5 + 1.0 + 1.2 + 0.8), 1e-6);

    /* ppo, A > 0: min(rA, clip(r)A) is clip(r)A above hi (c = 0), rA below lo. */
    assert_int_equal(zdp_policy_loss(ZDP_LOSS_PPO, &cfg, N, lp, q, apos, NULL, coef, el, &sum,
                                     NULL), ZDP_OK);
    const double ppo_pos_c[N] = {0.0, 1.0, 2.0, 2.4, 1.6};
    const double ppo_pos_el[N] = {-2.4, -1.0, -2.0, -2.4, -1.6};
    /* ppo, A < 0: rA is the min above hi (c = rA), clip(r)A below lo (c = 0). */
    float coef2[N], el2[N];
    double sum2;
    assert_int_equal(zdp_policy_loss(ZDP_LOSS_PPO, &cfg, N, lp, q, aneg, NULL, coef2, el2, &sum2,
                                     NULL), ZDP_OK);
    const double ppo_neg_c[N] = {-3.0, 0.0, -2.0, -2.4, -1.6};
    const double ppo_neg_el[N] = {3.0, 1.6, 2.0, 2.4, 1.6};
    for (int t = 0; t < N; t++) {
        /* On the bounds (t = 3, 4) the float r is within 1e-7 of 1.2 / 0.8,
         * on either side: check those against rr and the side it fell on. */
        if (t < 3) {
            near_("ppo A>0 coef", t, coef[t], ppo_pos_c[t], 1e-6);
            near_("ppo A<0 coef", t, coef2[t], ppo_neg_c[t], 1e-6);
        }
        near_("ppo A>0 el", t, el[t], ppo_pos_el[t], 1e-6);
        near_("ppo A<0 el", t, el2[t], ppo_neg_el[t], 1e-6);
    }
    /* Exactly inside, rA == clip(r)A: a tie, which counts as unclipped. */
    assert_true(coef[2] == 2.0f && coef2[2] == -2.0f);
    near_("ppo sum", 0, sum, -2.4 - 1.0 - 2.0 - 2.4 - 1.6, 1e-6);
    near_("ppo sum A<0", 0, sum2, 3.0 + 1.6 + 2.0 + 2.4 + 1.6, 1e-6);
    /* Exactly on a bound (r = 1 = lo = hi) is a tie too. */
    const zdp_loss_config one = {.clip_low = 1.0, .clip_high = 1.0};
    const float lp1 = -0.5f, q1 = -0.5f, a1 = 3.0f;
    float c1, e1;
    assert_int_equal(zdp_policy_loss(ZDP_LOSS_PPO, &one, 1, &lp1, &q1, &a1, NULL, &c1, &e1, NULL,
                                     NULL), ZDP_OK);
    assert_true(c1 == 3.0f && e1 == -3.0f);

    /* cispo: c = clip(r) A, el = -clip(r) lp A. */
    assert_int_equal(zdp_policy_loss(ZDP_LOSS_CISPO, &cfg, N, lp, q, aneg, NULL, coef, el, &sum,
                                     NULL), ZDP_OK);
    const double cl[N] = {1.2, 0.8, 1.0, 1.2, 0.8};
    double want = 0.0;
    for (int t = 0; t < N; t++) {
        near_("cispo coef", t, coef[t], -2.0 * cl[t], 1e-6);
        near_("cispo el", t, el[t], 2.0 * cl[t] * lp[t], 1e-6);
        want += 2.0 * cl[t] * lp[t];
    }
    near_("cispo sum", 0, sum, want, 1e-6);

    /* dro: c = A - beta (lp - q), el = -(lp A - beta/2 (lp - q)^2). */
    assert_int_equal(zdp_policy_loss(ZDP_LOSS_DRO, &cfg, N, lp, q, apos, NULL, coef, el, &sum,
                                     NULL), ZDP_OK);
    want = 0.0;
    for (int t = 0; t < N; t++) {
        const double d = log(rr[t]);
        near_("dro coef", t, coef[t], 2.0 - 0.5 * d, 1e-6);
        near_("dro el", t, el[t], -(lp[t] * 2.0 - 0.25 * d * d), 1e-6);
        want += -(lp[t] * 2.0 - 0.25 * d * d);
    }
    near_("dro sum", 0, sum, want, 1e-6);
    /* dro, one token by hand: beta 0.5, lp -1, q -2, A 1: c 0.5, el 1.25. */
    const float lpd = -1.0f, qd = -2.0f, ad = 1.0f;
    assert_int_equal(zdp_policy_loss(ZDP_LOSS_DRO, &cfg, 1, &lpd, &qd, &ad, NULL, &c1, &e1, &sum,
                                     NULL), ZDP_OK);
    assert_true(c1 == 0.5f && e1 == 1.25f && sum == 1.25);

    /* cross_entropy: c = w, el = -w lp (signed weights, not clamped); NULL = 1. */
    const float w[N] = {1.0f, 0.0f, -2.5f, 0.5f, 7.0f};
    assert_int_equal(zdp_policy_loss(ZDP_LOSS_CROSS_ENTROPY, NULL, N, lp, NULL, NULL, w, coef, el,
                                     &sum, NULL), ZDP_OK);
    want = 0.0;
    for (int t = 0; t < N; t++) {
        assert_true(coef[t] == w[t]);
        near_("ce el", t, el[t], -(double)w[t] * lp[t], 1e-7);
        want += -(double)w[t] * lp[t];
    }
    near_("ce sum", 0, sum, want, 1e-12);
    assert_int_equal(zdp_policy_loss(ZDP_LOSS_CROSS_ENTROPY, NULL, N, lp, NULL, NULL, NULL, coef,
                                     NULL, NULL, NULL), ZDP_OK);
    for (int t = 0; t < N; t++) assert_true(coef[t] == 1.0f);
    /* The policy kinds ignore weights. */
    float c3[N];
    assert_int_equal(zdp_policy_loss(ZDP_LOSS_IMPORTANCE_SAMPLING, NULL, N, lp, q, apos, w, c3,
                                     NULL, NULL, NULL), ZDP_OK);
    for (int t = 0; t < N; t++) near_("is ignores weights", t, c3[t], 2.0 * r[t], 1e-6);
    /* n = 0: nothing to read, sum 0. */
    sum = 7.0;
    assert_int_equal(zdp_policy_loss(ZDP_LOSS_PPO, NULL, 0, NULL, NULL, NULL, NULL, NULL, NULL,
                                     &sum, NULL), ZDP_OK);
    assert_true(sum == 0.0);
}

/* lp - q is clamped at ZDP_LOSS_MAX_LOG_RATIO before exp: a finite, float-sized ratio. */
static void test_policy_loss_clamp(void **state) {
    (void)state;
    const float lp = -0.5f, q = -1000.0f, a = 1.0f;
    float c, e;
    double sum;
    const double big = exp(ZDP_LOSS_MAX_LOG_RATIO);
    assert_int_equal(zdp_policy_loss(ZDP_LOSS_IMPORTANCE_SAMPLING, NULL, 1, &lp, &q, &a, NULL, &c,
                                     &e, &sum, NULL), ZDP_OK);
    assert_true(isfinite(c) && c == (float)big && e == (float)-big);
    /* ppo, A > 0: clipped (c = 0, el = -hi A); cispo: clip(r) = hi. */
    assert_int_equal(zdp_policy_loss(ZDP_LOSS_PPO, NULL, 1, &lp, &q, &a, NULL, &c, &e, NULL,
                                     NULL), ZDP_OK);
    assert_true(c == 0.0f && e == -1.2f);
    assert_int_equal(zdp_policy_loss(ZDP_LOSS_CISPO, NULL, 1, &lp, &q, &a, NULL, &c, &e, NULL,
                                     NULL), ZDP_OK);
    assert_true(c == 1.2f);
    /* Far below: r underflows to 0 quietly. */
    const float lo_lp = -1000.0f, lo_q = -0.5f;
    assert_int_equal(zdp_policy_loss(ZDP_LOSS_IMPORTANCE_SAMPLING, NULL, 1, &lo_lp, &lo_q, &a,
                                     NULL, &c, &e, NULL, NULL), ZDP_OK);
    assert_true(c == 0.0f && e == 0.0f);
    /* e^20 * 1e35 does not fit a float: an error naming the token. */
    const float huge_a = 1e35f;
    zdp_error err;
    c = 42.0f;
    assert_int_equal(zdp_policy_loss(ZDP_LOSS_IMPORTANCE_SAMPLING, NULL, 1, &lp, &q, &huge_a,
                                     NULL, &c, &e, NULL, &err), ZDP_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "token 0"));
    assert_non_null(strstr(err.msg, "importance_sampling"));
    assert_true(c == 42.0f);
    /* The overflow is found before anything is written, even past good tokens. */
    const float lp3[3] = {-1, -1, -0.5f}, q3[3] = {-1, -1.1f, -1000}, a3[3] = {1, 1, 1e35f};
    float c3[3] = {42, 42, 42}, e3[3] = {42, 42, 42};
    double sum3 = 42.0;
    assert_int_equal(zdp_policy_loss(ZDP_LOSS_IMPORTANCE_SAMPLING, NULL, 3, lp3, q3, a3, NULL, c3,
                                     e3, &sum3, &err), ZDP_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "token 2"));
    for (int t = 0; t < 3; t++) assert_true(c3[t] == 42.0f && e3[t] == 42.0f);
    assert_true(sum3 == 42.0);
}

static void test_policy_loss_errors(void **state) {
    (void)state;
    enum { N = 4 };
    const float lp[N] = {-1, -2, -0.5f, -3}, q[N] = {-1.1f, -1.9f, -0.4f, -3},
                a[N] = {1, -1, 0.5f, 0};
    float coef[N], el[N];
    const float sentinel = 123.0f;
    for (int t = 0; t < N; t++) coef[t] = el[t] = sentinel;
    double sum = -7.0;
    zdp_error err;
    const zdp_loss_config dflt = ZDP_LOSS_CONFIG_DEFAULT;
#define BAD_(kind, cfg, lp_, q_, a_, w_, text)                                                \
    do {                                                                                      \
        memset(&err, 0, sizeof err);                                                          \
        assert_int_equal(zdp_policy_loss(kind, cfg, N, lp_, q_, a_, w_, coef, el, &sum, &err), \
                         ZDP_ERR_INVALID_ARG);                                                \
        assert_int_equal(err.code, ZDP_ERR_INVALID_ARG);                                      \
        if (strstr(err.msg, text) == NULL) fail_msg("want \"%s\" in: %s", text, err.msg);      \
        assert_non_null(strstr(err.msg, "zdp_policy_loss"));                                   \
    } while (0)
    /* dro has no default beta. */
    BAD_(ZDP_LOSS_DRO, NULL, lp, q, a, NULL, "beta = nan");
    BAD_(ZDP_LOSS_DRO, &dflt, lp, q, a, NULL, "loss_fn_config.beta");
    zdp_loss_config c = dflt;
    c.beta = -0.1;
    BAD_(ZDP_LOSS_DRO, &c, lp, q, a, NULL, "beta = -0.1");
    c.beta = INFINITY;
    BAD_(ZDP_LOSS_DRO, &c, lp, q, a, NULL, "beta = inf");
    /* Ratio bounds: 0 <= lo <= 1 <= hi (a zeroed config is caught). */
    const zdp_loss_config zero = {0};
    BAD_(ZDP_LOSS_PPO, &zero, lp, q, a, NULL, "clip_high = 0");
    c = dflt;
    c.clip_low = 1.1;
    BAD_(ZDP_LOSS_CISPO, &c, lp, q, a, NULL, "clip_low = 1.1");
    c = dflt;
    c.clip_low = -0.2;
    BAD_(ZDP_LOSS_PPO, &c, lp, q, a, NULL, "clip_low = -0.2");
    c = dflt;
    c.clip_high = NAN;
    BAD_(ZDP_LOSS_PPO, &c, lp, q, a, NULL, "clip_high = nan");
    /* ...but only the kinds that use them look. */
    assert_int_equal(zdp_policy_loss(ZDP_LOSS_IMPORTANCE_SAMPLING, &zero, N, lp, q, a, NULL, coef,
                                     NULL, NULL, NULL), ZDP_OK);
    for (int t = 0; t < N; t++) coef[t] = sentinel;
    /* Missing arrays. */
    BAD_(ZDP_LOSS_PPO, NULL, lp, NULL, a, NULL, "q (the sampler's logprobs)");
    BAD_(ZDP_LOSS_CISPO, NULL, lp, q, NULL, NULL, "adv");
    BAD_(ZDP_LOSS_CROSS_ENTROPY, NULL, NULL, NULL, NULL, NULL, "lp and coef are required");
    /* Non-finite inputs: the array and index. */
    float bad[N];
    memcpy(bad, q, sizeof bad);
    bad[2] = NAN;
    BAD_(ZDP_LOSS_IMPORTANCE_SAMPLING, NULL, lp, bad, a, NULL, "q[2] = nan");
    memcpy(bad, a, sizeof bad);
    bad[3] = -INFINITY;
    BAD_(ZDP_LOSS_DRO, &(zdp_loss_config){.beta = 0.1}, lp, q, bad, NULL, "adv[3] = -inf");
    memcpy(bad, lp, sizeof bad);
    bad[1] = INFINITY;
    BAD_(ZDP_LOSS_CROSS_ENTROPY, NULL, bad, NULL, NULL, NULL, "lp[1] = inf");
    memcpy(bad, a, sizeof bad);
    bad[0] = NAN;
    BAD_(ZDP_LOSS_CROSS_ENTROPY, NULL, lp, NULL, NULL, bad, "weights[0] = nan");
    /* A bad kind, a negative count. */
    BAD_((zdp_loss_kind)17, NULL, lp, q, a, NULL, "kind = 17");
    assert_int_equal(zdp_policy_loss(ZDP_LOSS_PPO, NULL, -1, lp, q, a, NULL, coef, el, &sum, &err),
                     ZDP_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "n = -1"));
#undef BAD_
    /* None of the failures wrote anything. */
    for (int t = 0; t < N; t++) assert_true(coef[t] == sentinel && el[t] == sentinel);
    assert_true(sum == -7.0);

    /* Names: Tinker's strings, both ways. */
    const char *names[] = {"cross_entropy", "importance_sampling", "ppo", "cispo", "dro"};
    for (int k = 0; k < 5; k++) {
        zdp_loss_kind kind = (zdp_loss_kind)-1;
        assert_int_equal(zdp_loss_kind_from_name(names[k], &kind, NULL), ZDP_OK);
        assert_int_equal(kind, k);
        assert_string_equal(zdp_loss_kind_name(kind), names[k]);
    }
    zdp_loss_kind kind = ZDP_LOSS_DRO;
    assert_int_equal(zdp_loss_kind_from_name("PPO", &kind, &err), ZDP_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "\"PPO\""));
    assert_non_null(strstr(err.msg, "importance_sampling"));
    assert_int_equal(kind, ZDP_LOSS_DRO);
    assert_int_equal(zdp_loss_kind_from_name(NULL, &kind, NULL), ZDP_ERR_INVALID_ARG);
    assert_string_equal(zdp_loss_kind_name((zdp_loss_kind)9), "?");
}

/* ---- a tiny GPT ------------------------------------------------------------------ */

/* Parameters larger than GPT-2's init so gradients stand well above the
 * finite-difference noise; random tokens. */
static void fx_init_(model_fx *f, int B, int T, uint64_t seed) {
    memset(f, 0, sizeof *f);
    const zdp_gpt_config cfg = {.n_layer = 1, .n_head = 2, .n_embd = 8, .vocab_size = 11,
                                .block_size = 6};
    zdp_error err;
    if (zdp_gpt_create(&cfg, 2, &f->m, &err) != ZDP_OK) fail_msg("%s", err.msg);
    fx_alloc_(f);
    zdp_gpt_init_params(&f->m, f->p, seed);
    uint64_t s = seed;
    for (int i = 0; i < f->m.n_params; i++)
        for (int64_t k = 0; k < f->numel[i]; k++) f->p[i][k] += 0.3f * uniform_(&s);
    fx_tokens_(f, B, T, cfg.vocab_size, &s);
}

static zdp_lm_batch fx_batch_(const model_fx *f, const float *weights, float *logprobs) {
    return (zdp_lm_batch){.inputs = f->inputs, .targets = f->targets, .weights = weights,
                           .logprobs = logprobs, .B = f->B, .T = f->T};
}

static void fx_forward_(model_fx *f, const float *weights, float *logprobs) {
    const zdp_lm_batch b = fx_batch_(f, weights, logprobs);
    float loss;
    zdp_error err;
    if (zdp_model_forward_dense(&f->m, (const float *const *)f->p, &b, &loss, &err) != ZDP_OK)
        fail_msg("%s", err.msg);
}

/* Backward of the last forward into f->g (zeroed first). */
static zdp_status fx_backward_(model_fx *f, float dloss, zdp_error *err) {
    for (int i = 0; i < f->m.n_params; i++) memset(f->g[i], 0, (size_t)f->numel[i] * sizeof(float));
    zdp_grad_sink *sink = zdp_grad_sink_create_dense(f->g, f->m.n_params);
    const zdp_status st = zdp_model_backward_dense(&f->m, (const float *const *)f->p, dloss, sink, err);
    free(sink);
    return st;
}

/* Copies of every gradient, to compare two backwards bit for bit. */
static float **grads_copy_(const model_fx *f) {
    float **c = calloc((size_t)f->m.n_params, sizeof(float *));
    for (int i = 0; i < f->m.n_params; i++) {
        c[i] = malloc((size_t)f->numel[i] * sizeof(float));
        memcpy(c[i], f->g[i], (size_t)f->numel[i] * sizeof(float));
    }
    return c;
}

static void grads_same_(const model_fx *f, float **want, const char *what) {
    for (int i = 0; i < f->m.n_params; i++)
        if (memcmp(f->g[i], want[i], (size_t)f->numel[i] * sizeof(float)) != 0)
            fail_msg("%s: gradient of %s differs", what, f->m.params[i].name);
}

static void grads_free_(const model_fx *f, float **c) {
    for (int i = 0; i < f->m.n_params; i++) free(c[i]);
    free(c);
}

/* ---- the losses' gradients against finite differences ----------------------------- */

/* The true loss, written out here from Tinker's definitions (independently of
 * policy_loss.c), in double.  cispo's sg(clip(r)) is clip_r0, frozen. */
typedef struct pl_ctx {
    model_fx *f;
    zdp_loss_kind kind;
    zdp_loss_config cfg;
    int64_t N;
    const float *q, *adv, *w;
    const double *clip_r0; /* cispo */
    const float *lp0;      /* the unperturbed forward's logprobs */
    float *lp;             /* scratch: the forward's logprobs */
} pl_ctx;

static double clip_d_(double r, double lo, double hi) { return fmin(fmax(r, lo), hi); }

static double true_loss_(const pl_ctx *c, const float *lp, double *el) {
    double L = 0.0;
    for (int64_t t = 0; t < c->N; t++) {
        const double l = lp[t], a = c->kind == ZDP_LOSS_CROSS_ENTROPY ? 0.0 : c->adv[t];
        const double r = c->kind == ZDP_LOSS_CROSS_ENTROPY ? 1.0 : exp(l - (double)c->q[t]);
        double e = 0.0;
        switch (c->kind) {
        case ZDP_LOSS_CROSS_ENTROPY: e = -(double)c->w[t] * l; break;
        case ZDP_LOSS_IMPORTANCE_SAMPLING: e = -r * a; break;
        case ZDP_LOSS_PPO:
            e = -fmin(r * a, clip_d_(r, c->cfg.clip_low, c->cfg.clip_high) * a);
            break;
        case ZDP_LOSS_CISPO: e = -c->clip_r0[t] * l * a; break;
        case ZDP_LOSS_DRO: {
            const double d = l - (double)c->q[t];
            e = -(l * a - 0.5 * c->cfg.beta * d * d);
            break;
        }
        }
        if (el != NULL) el[t] = e;
        L += e;
    }
    return L;
}

/* -1, 0, 1: r below, inside, above [lo, hi]. */
static int side_(const pl_ctx *c, double lp, int64_t t) {
    const double r = exp(lp - (double)c->q[t]);
    return r < c->cfg.clip_low ? -1 : r > c->cfg.clip_high ? 1 : 0;
}

static double pl_obj_(void *v) {
    pl_ctx *c = v;
    fx_forward_(c->f, NULL, c->lp);
    /* A finite difference across a clip bound would be meaningless. */
    for (int64_t t = 0; t < c->N; t++)
        if (side_(c, c->lp[t], t) != side_(c, c->lp0[t], t))
            fail_msg("token %lld crossed a clip bound in a finite-difference step "
                     "(lp %.6g -> %.6g)", (long long)t, (double)c->lp0[t], (double)c->lp[t]);
    return true_loss_(c, c->lp, NULL);
}

/* One central difference of c's loss in x with step h (the steps actually
 * taken, in float). */
static double central_(pl_ctx *c, float *x, float h) {
    const float keep = *x;
    *x = keep + h;
    const double hp = (double)*x - keep, up = pl_obj_(c);
    *x = keep - h;
    const double hm = keep - (double)*x, down = pl_obj_(c);
    *x = keep;
    return (up - down) / (hp + hm);
}

/* Finite differences of c's loss on `sample` random elements of every
 * tensor, against f->g.  A plain central difference does not do here: some
 * directions (wpe at position 0, through its LayerNorm) curve enough that the
 * O(h^2) error of a step that keeps the float noise down is several percent,
 * so this is Richardson's extrapolation of two central differences,
 * (4 D(h/2) - D(h)) / 3, whose error is O(h^4).  With h = 2e-2 the worst
 * element of every kind sits at a quarter of the tolerance.  A step moves lp
 * by far less than the 0.07 margin of every token from a clip bound, so no
 * ppo/cispo branch changes within it.  Returns the largest |gradient| seen. */
static double fd_check_model_(pl_ctx *c, int sample) {
    model_fx *f = c->f;
    uint64_t s = 99;
    const float h = 2e-2f;
    double gmax = 0.0;
    for (int i = 0; i < f->m.n_params; i++)
        for (int j = 0; j < sample; j++) {
            const int64_t k = (int64_t)(rng_(&s) % (uint64_t)f->numel[i]);
            const double d1 = central_(c, &f->p[i][k], h), d2 = central_(c, &f->p[i][k], h / 2);
            const double fd = (4.0 * d2 - d1) / 3.0, g = f->g[i][k];
            const double tol = 2e-4 + 1e-2 * fmax(fabs(fd), fabs(g));
            if (!(fabs(fd - g) <= tol))
                fail_msg("%s: %s[%lld]: analytic %.7g, finite difference %.7g (tolerance %.3g)",
                         zdp_loss_kind_name(c->kind), f->m.params[i].name, (long long)k, g, fd,
                         tol);
            gmax = fmax(gmax, fabs(g));
        }
    return gmax;
}

static void check_kind_(zdp_loss_kind kind) {
    model_fx f;
    fx_init_(&f, 2, 5, 21);
    enum { N = 10 };
    float lp0[N], q[N], coef[N], el[N], lp_scratch[N];
    double el_want[N], clip_r0[N];
    /* lp - q = d: both sides of log 0.8 = -0.223 and log 1.2 = 0.182, each
     * at least 0.07 away from them (well past what a parameter step of 1e-2
     * moves lp), with advantages of both signs on every side. */
    const double d[N] = {-0.6, -0.3, -0.1, 0.05, 0.3, 0.5, -0.45, 0.12, 0.25, -0.15};
    const float adv[N] = {1.0f, -0.7f, 1.3f, -1.1f, 0.9f, -1.5f, -0.8f, 0.6f, -1.2f, 1.4f};
    const float w[N] = {1.0f, 0.0f, 2.5f, -0.5f, 1.0f, 0.3f, 1.0f, -1.2f, 0.0f, 2.0f};
    fx_forward_(&f, NULL, lp0);
    for (int t = 0; t < N; t++) q[t] = (float)((double)lp0[t] - d[t]);
    const zdp_loss_config cfg = {.clip_low = 0.8, .clip_high = 1.2, .beta = 0.7};
    int below_pos = 0, below_neg = 0, above_pos = 0, above_neg = 0, inside = 0;
    for (int t = 0; t < N; t++) {
        const double r = exp((double)lp0[t] - q[t]);
        clip_r0[t] = clip_d_(r, cfg.clip_low, cfg.clip_high);
        below_pos += r < 0.8 && adv[t] > 0, below_neg += r < 0.8 && adv[t] < 0;
        above_pos += r > 1.2 && adv[t] > 0, above_neg += r > 1.2 && adv[t] < 0;
        inside += r > 0.8 && r < 1.2;
    }
    assert_true(below_pos && below_neg && above_pos && above_neg && inside);
    pl_ctx c = {.f = &f, .kind = kind, .cfg = cfg, .N = N, .q = q, .adv = adv, .w = w,
                .clip_r0 = clip_r0, .lp0 = lp0, .lp = lp_scratch};

    /* The helper's loss terms and sum against the reference. */
    double sum;
    zdp_error err;
    /* (The forward above is the one whose backward runs below.) */
    if (zdp_policy_loss(kind, &cfg, N, lp0, q, adv, w, coef, el, &sum, &err) != ZDP_OK)
        fail_msg("%s", err.msg);
    const double L0 = true_loss_(&c, lp0, el_want);
    for (int t = 0; t < N; t++) near_("elementwise_loss", t, el[t], el_want[t], 1e-6);
    near_("loss_sum", 0, sum, L0, 1e-9);
    if (kind == ZDP_LOSS_PPO) { /* the clipped tokens really get no gradient */
        int zeros = 0;
        for (int t = 0; t < N; t++) zeros += coef[t] == 0.0f;
        assert_true(zeros >= 2 && zeros <= N - 2);
    }

    /* Reweight the forward to c and back-propagate the sum: scale B*T. */
    if (zdp_lm_set_loss_weights(&f.m, coef, N, &err) != ZDP_OK) fail_msg("%s", err.msg);
    assert_int_equal(fx_backward_(&f, (float)N, &err), ZDP_OK);
    const double gmax = fd_check_model_(&c, 6);
    if (!(gmax > 1e-2)) fail_msg("%s: gradient %.3g is too small to test", zdp_loss_kind_name(kind), gmax);
    fx_free_(&f);
}

static void test_grad_cross_entropy(void **state) { (void)state; check_kind_(ZDP_LOSS_CROSS_ENTROPY); }
static void test_grad_importance_sampling(void **state) { (void)state; check_kind_(ZDP_LOSS_IMPORTANCE_SAMPLING); }
static void test_grad_ppo(void **state) { (void)state; check_kind_(ZDP_LOSS_PPO); }
static void test_grad_cispo(void **state) { (void)state; check_kind_(ZDP_LOSS_CISPO); }
static void test_grad_dro(void **state) { (void)state; check_kind_(ZDP_LOSS_DRO); }

/* ---- zdp_lm_set_loss_weights --------------------------------------------------- */

/* Setting w after an unweighted forward is the same as forwarding with w;
 * the last call wins; setting on a weighted forward replaces its weights. */
static void test_set_loss_weights_equivalent(void **state) {
    (void)state;
    model_fx f;
    fx_init_(&f, 2, 5, 22);
    enum { N = 10 };
    float w[N], other[N];
    uint64_t s = 5;
    for (int t = 0; t < N; t++) w[t] = 2.0f * uniform_(&s), other[t] = 1.0f + uniform_(&s);
    zdp_error err;
    fx_forward_(&f, w, NULL);
    assert_int_equal(fx_backward_(&f, 1.0f, &err), ZDP_OK);
    float **want = grads_copy_(&f);

    fx_forward_(&f, NULL, NULL);
    assert_int_equal(zdp_lm_set_loss_weights(&f.m, other, N, &err), ZDP_OK);
    assert_int_equal(zdp_lm_set_loss_weights(&f.m, w, N, &err), ZDP_OK);
    assert_int_equal(fx_backward_(&f, 1.0f, &err), ZDP_OK);
    grads_same_(&f, want, "unweighted forward + set_loss_weights(w)");

    fx_forward_(&f, other, NULL);
    assert_int_equal(zdp_lm_set_loss_weights(&f.m, w, N, &err), ZDP_OK);
    assert_int_equal(fx_backward_(&f, 1.0f, &err), ZDP_OK);
    grads_same_(&f, want, "forward with other weights + set_loss_weights(w)");
    grads_free_(&f, want);

    /* The next forward without weights is unweighted again. */
    fx_forward_(&f, NULL, NULL);
    assert_int_equal(fx_backward_(&f, 1.0f, &err), ZDP_OK);
    want = grads_copy_(&f);
    float ones[N];
    for (int t = 0; t < N; t++) ones[t] = 1.0f;
    fx_forward_(&f, ones, NULL);
    assert_int_equal(fx_backward_(&f, 1.0f, &err), ZDP_OK);
    grads_same_(&f, want, "weights of 1 vs no weights");
    grads_free_(&f, want);
    fx_free_(&f);
}

static void test_set_loss_weights_errors(void **state) {
    (void)state;
    model_fx f;
    fx_init_(&f, 2, 5, 23);
    enum { N = 10 };
    float w[N + 1], keep[N];
    uint64_t s = 6;
    for (int t = 0; t < N + 1; t++) w[t] = 1.0f + uniform_(&s);
    for (int t = 0; t < N; t++) keep[t] = 0.5f + uniform_(&s);
    zdp_error err;

    /* Before any forward. */
    assert_int_equal(zdp_lm_set_loss_weights(&f.m, w, N, &err), ZDP_ERR_STATE);
    assert_int_equal(err.code, ZDP_ERR_STATE);
    assert_non_null(strstr(err.msg, "zdp_lm_set_loss_weights"));
    assert_non_null(strstr(err.msg, "run forward"));
    /* Not a GPT; no model. */
    zdp_model mlp;
    assert_int_equal(zdp_mlp_create(4, 1, 1, &mlp, NULL), ZDP_OK);
    assert_int_equal(zdp_lm_set_loss_weights(&mlp, w, N, &err), ZDP_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "not a causal language model"));
    zdp_mlp_destroy(&mlp);
    assert_int_equal(zdp_lm_set_loss_weights(NULL, w, N, &err), ZDP_ERR_INVALID_ARG);

    /* Reference gradients: the forward's own weights `keep`, and none. */
    fx_forward_(&f, keep, NULL);
    assert_int_equal(fx_backward_(&f, 1.0f, &err), ZDP_OK);
    float **want_keep = grads_copy_(&f);
    fx_forward_(&f, NULL, NULL);
    assert_int_equal(fx_backward_(&f, 1.0f, &err), ZDP_OK);
    float **want_plain = grads_copy_(&f);

    /* After its backward the forward is used up. */
    assert_int_equal(zdp_lm_set_loss_weights(&f.m, w, N, &err), ZDP_ERR_STATE);
    /* So is it after next_logits. */
    fx_forward_(&f, NULL, NULL);
    float logits[11];
    assert_int_equal(zdp_lm_next_logits(&f.m, (const float *const *)f.p, f.inputs, 3, logits,
                                         &err), ZDP_OK);
    assert_int_equal(zdp_lm_set_loss_weights(&f.m, w, N, &err), ZDP_ERR_STATE);
    /* And after a failed forward. */
    int32_t bad_targets[N];
    memcpy(bad_targets, f.targets, sizeof bad_targets);
    bad_targets[7] = 11;
    zdp_lm_batch bb = fx_batch_(&f, NULL, NULL);
    bb.targets = bad_targets;
    float loss;
    fx_forward_(&f, NULL, NULL);
    assert_int_equal(zdp_model_forward_dense(&f.m, (const float *const *)f.p, &bb, &loss, &err),
                     ZDP_ERR_INVALID_ARG);
    assert_int_equal(zdp_lm_set_loss_weights(&f.m, w, N, &err), ZDP_ERR_STATE);

    /* Each bad call on a weighted forward, then on an unweighted one: the
     * backward afterwards is exactly the one without the call. */
    for (int weighted = 1; weighted >= 0; weighted--) {
        fx_forward_(&f, weighted ? keep : NULL, NULL);
        assert_int_equal(zdp_lm_set_loss_weights(&f.m, w, N + 1, &err), ZDP_ERR_INVALID_ARG);
        assert_non_null(strstr(err.msg, "zdp_lm_set_loss_weights: n = 11"));
        assert_non_null(strstr(err.msg, "B*T = 10"));
        assert_int_equal(zdp_lm_set_loss_weights(&f.m, w, 5, &err), ZDP_ERR_INVALID_ARG);
        assert_non_null(strstr(err.msg, "n = 5"));
        assert_int_equal(zdp_lm_set_loss_weights(&f.m, NULL, N, &err), ZDP_ERR_INVALID_ARG);
        assert_non_null(strstr(err.msg, "w is NULL"));
        float nan_w[N];
        memcpy(nan_w, w, sizeof nan_w);
        nan_w[7] = NAN;
        assert_int_equal(zdp_lm_set_loss_weights(&f.m, nan_w, N, &err), ZDP_ERR_INVALID_ARG);
        assert_non_null(strstr(err.msg, "w[7] (position [1][2]) = nan"));
        assert_non_null(strstr(err.msg, "finite"));
        nan_w[7] = w[7];
        nan_w[9] = -INFINITY; /* the last one: nothing before it may be copied either */
        assert_int_equal(zdp_lm_set_loss_weights(&f.m, nan_w, N, &err), ZDP_ERR_INVALID_ARG);
        assert_non_null(strstr(err.msg, "w[9] (position [1][4]) = -inf"));
        assert_int_equal(fx_backward_(&f, 1.0f, &err), ZDP_OK);
        grads_same_(&f, weighted ? want_keep : want_plain,
                    weighted ? "failed calls on a weighted forward"
                             : "failed calls on an unweighted forward");
    }
    grads_free_(&f, want_keep);
    grads_free_(&f, want_plain);
    fx_free_(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_policy_loss_values),
        cmocka_unit_test(test_policy_loss_clamp),
        cmocka_unit_test(test_policy_loss_errors),
        cmocka_unit_test(test_grad_cross_entropy),
        cmocka_unit_test(test_grad_importance_sampling),
        cmocka_unit_test(test_grad_ppo),
        cmocka_unit_test(test_grad_cispo),
        cmocka_unit_test(test_grad_dro),
        cmocka_unit_test(test_set_loss_weights_equivalent),
        cmocka_unit_test(test_set_loss_weights_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
