/*
 * policy_loss.c -- Tinker's built-in losses as per-token coefficients of a
 * weighted cross-entropy (the table in policy_loss.h).
 *
 * Two passes over the tokens: the first checks every input and that every
 * coefficient and loss term fits in a float, the second writes, so a failing
 * call writes nothing.  The per-token arithmetic is in double.
 */
#include "policy_loss.h"

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "../core/core.h"

static const char *const kind_names_[] = {
    [ZDP_LOSS_CROSS_ENTROPY] = "cross_entropy",
    [ZDP_LOSS_IMPORTANCE_SAMPLING] = "importance_sampling",
    [ZDP_LOSS_PPO] = "ppo",
    [ZDP_LOSS_CISPO] = "cispo",
    [ZDP_LOSS_DRO] = "dro",
};
#define NKINDS_ ((int)(sizeof kind_names_ / sizeof kind_names_[0]))

const char *zdp_loss_kind_name(zdp_loss_kind kind) {
    return (int)kind >= 0 && (int)kind < NKINDS_ ? kind_names_[kind] : "?";
}

zdp_status zdp_loss_kind_from_name(const char *name, zdp_loss_kind *out, zdp_error *err) {
    for (int k = 0; name != NULL && k < NKINDS_; k++)
        if (strcmp(name, kind_names_[k]) == 0) {
            if (out != NULL) *out = (zdp_loss_kind)k;
            return ZDP_OK;
        }
    return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                       "zdp_loss_kind_from_name: loss_fn \"%s\" is not known: use one of "
                       "cross_entropy, importance_sampling, ppo, cispo, dro",
                       name != NULL ? name : "(null)");
}

/* r = exp(lp - q) with the exponent clamped at ZDP_LOSS_MAX_LOG_RATIO (20).
 * lp and q are log-probabilities (<= 0), so lp - q > 20 means the sampler
 * gave the token it sampled a probability e^20 = 4.9e8 times smaller than
 * the learner does: a mismatched or corrupt q, not an importance weight
 * anyone means.  Unclamped, exp() reaches inf in float from lp - q > 88.7
 * (and in double from > 709), and an inf or NaN weight would poison the
 * whole gradient (zdp_lm_set_loss_weights refuses it).  At 20, r * A stays
 * a float for any |A| <= 1e29, so the server's input bound (|A| <= 1e20)
 * can never overflow a coefficient; the clipped kinds stay exact: cispo's
 * clip(r) and ppo's clipped branch never see r beyond hi.  Past the clamp
 * r, el and c use r = e^20 (constant in lp there), so they are no longer
 * each other's derivative; such a token's gradient is dominated by the bad
 * input anyway.  The lower side needs no clamp: exp() underflows to 0. */
static double ratio_(double lp, double q) {
    double d = lp - q;
    if (d > ZDP_LOSS_MAX_LOG_RATIO) d = ZDP_LOSS_MAX_LOG_RATIO;
    return exp(d);
}

static double clip_(double r, double lo, double hi) { return r < lo ? lo : r > hi ? hi : r; }

/* Coefficient c and loss term el of one token (inputs already checked). */
static void token_(zdp_loss_kind kind, const zdp_loss_config *cfg, double lp, double q,
                   double a, double w, double *c, double *el) {
    switch (kind) {
    case ZDP_LOSS_CROSS_ENTROPY:
        *c = w;
        *el = -w * lp;
        return;
    case ZDP_LOSS_IMPORTANCE_SAMPLING: {
        const double r = ratio_(lp, q);
        *c = r * a;
        *el = -r * a;
        return;
    }
    case ZDP_LOSS_PPO: {
        /* min(rA, clip(r)A): the gradient flows only through the unclipped
         * term, and only where it is the min (ties, i.e. r inside [lo, hi],
         * count as unclipped). */
        const double r = ratio_(lp, q);
        const double un = r * a, cl = clip_(r, cfg->clip_low, cfg->clip_high) * a;
        const bool unclipped = un <= cl;
        *c = unclipped ? un : 0.0;
        *el = -(unclipped ? un : cl);
        return;
    }
    case ZDP_LOSS_CISPO: {
        /* sg(clip(r)): a constant weight on lp, so its gradient is clip(r) A. */
        const double cr = clip_(ratio_(lp, q), cfg->clip_low, cfg->clip_high);
        *c = cr * a;
        *el = -cr * lp * a;
        return;
    }
    case ZDP_LOSS_DRO: {
        const double d = lp - q;
        *c = a - cfg->beta * d;
        *el = -(lp * a - 0.5 * cfg->beta * d * d);
        return;
    }
    }
    *c = *el = NAN; /* unreachable: the kind was checked */
}

static bool fits_float_(double x) { return isfinite(x) && fabs(x) <= FLT_MAX; }

/* The first non-finite value of x[0..n), or -1. */
static int64_t first_nonfinite_(const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return i;
    return -1;
}

zdp_status zdp_policy_loss(zdp_loss_kind kind, const zdp_loss_config *cfg, int64_t n,
                           const float *lp, const float *q, const float *adv,
                           const float *weights, float *coef, float *elementwise,
                           double *loss_sum, zdp_error *err) {
    const char *fn = "zdp_policy_loss";
    if ((int)kind < 0 || (int)kind >= NKINDS_)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "%s: kind = %d is not a zdp_loss_kind: use ZDP_LOSS_CROSS_ENTROPY .. "
                           "ZDP_LOSS_DRO (zdp_loss_kind_from_name parses Tinker's names)",
                           fn, (int)kind);
    const char *kn = kind_names_[kind];
    const bool policy = kind != ZDP_LOSS_CROSS_ENTROPY;
    if (n < 0)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "%s (%s): n = %lld: the token count must be >= 0", fn, kn,
                           (long long)n);
    if (n > 0 && (lp == NULL || coef == NULL || (policy && (q == NULL || adv == NULL))))
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "%s (%s): lp = %p, q = %p, adv = %p, coef = %p: lp and coef are "
                           "required%s",
                           fn, kn, (const void *)lp, (const void *)q, (const void *)adv,
                           (void *)coef,
                           policy ? ", and q (the sampler's logprobs) and adv (advantages) "
                                    "by every policy loss"
                                  : "");
    const zdp_loss_config dflt = ZDP_LOSS_CONFIG_DEFAULT;
    const zdp_loss_config *c = cfg != NULL ? cfg : &dflt;
    if (kind == ZDP_LOSS_PPO || kind == ZDP_LOSS_CISPO) {
        if (!(isfinite(c->clip_low) && isfinite(c->clip_high) && c->clip_low >= 0.0 &&
              c->clip_low <= 1.0 && c->clip_high >= 1.0))
            return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                               "%s (%s): clip_low = %g, clip_high = %g: the ratio bounds need "
                               "0 <= clip_low <= 1 <= clip_high, finite (Tinker's "
                               "clip_low_threshold / clip_high_threshold; defaults 0.8 and 1.2)",
                               fn, kn, c->clip_low, c->clip_high);
    }
    if (kind == ZDP_LOSS_DRO && !(isfinite(c->beta) && c->beta >= 0.0))
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "%s (dro): beta = %g: dro needs a finite beta >= 0 and has no "
                           "default (set loss_fn_config.beta)",
                           fn, c->beta);

    /* Inputs: every value the kind reads must be finite. */
    typedef struct { const char *name, *what; const float *x; } input_;
    input_ in[3] = {{"lp", "log p(target)", lp}};
    int nin = 1;
    if (policy) {
        in[nin++] = (input_){"q", "the sampler's logprobs", q};
        in[nin++] = (input_){"adv", "advantages", adv};
    } else if (weights != NULL) {
        in[nin++] = (input_){"weights", "weights", weights};
    }
    for (int k = 0; k < nin; k++) {
        const int64_t i = first_nonfinite_(in[k].x, n);
        if (i >= 0)
            return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                               "%s (%s): %s[%lld] = %g: %s must be finite", fn, kn, in[k].name,
                               (long long)i, (double)in[k].x[i], in[k].what);
    }

    /* Pass 1: every output must fit a float. */
    for (int64_t t = 0; t < n; t++) {
        double ct, et;
        token_(kind, c, lp[t], policy ? q[t] : 0.0, policy ? adv[t] : 0.0,
               !policy && weights != NULL ? weights[t] : 1.0, &ct, &et);
        if (!fits_float_(ct) || !fits_float_(et))
            return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                               "%s (%s): token %lld (lp %g, q %g, adv %g): coefficient %g, "
                               "loss term %g do not fit a float; check the inputs' scale "
                               "(a huge advantage, or q far below lp)",
                               fn, kn, (long long)t, (double)lp[t], policy ? (double)q[t] : 0.0,
                               policy ? (double)adv[t] : 0.0, ct, et);
    }
    /* Pass 2: write. */
    double sum = 0.0;
    for (int64_t t = 0; t < n; t++) {
        double ct, et;
        token_(kind, c, lp[t], policy ? q[t] : 0.0, policy ? adv[t] : 0.0,
               !policy && weights != NULL ? weights[t] : 1.0, &ct, &et);
        coef[t] = (float)ct;
        if (elementwise != NULL) elementwise[t] = (float)et;
        sum += et;
    }
    if (loss_sum != NULL) *loss_sum = sum;
    return ZDP_OK;
}
