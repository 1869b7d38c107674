/*
 * policy_loss.h -- internal: Tinker's built-in losses as per-token weights
 * for the GPT's weighted cross-entropy (zdp_lm_set_loss_weights).
 *
 * Notation, per datum of n tokens: lp[t] = log p(target_t) from the model's
 * forward (zdp_lm_batch.logprobs), q[t] the sampler's log-probability,
 * A[t] the advantage, r[t] = exp(lp[t] - q[t]), clip(r) = min(max(r, lo), hi)
 * with lo = clip_low, hi = clip_high.  Every loss is a plain SUM over tokens
 * (no mean), L = sum_t el[t], and its gradient is
 *     dL/dθ = -sum_t c[t] * d lp[t]/dθ,
 * i.e. the gradient of the weighted cross-entropy sum_t c[t] * (-lp[t]) with
 * the coefficients c held fixed:
 *
 *   kind                 el[t] (summand of L)              c[t] = -dL/dlp[t]
 *   cross_entropy        -w lp                              w (weights; NULL = 1)
 *   importance_sampling  -r A                               r A
 *   ppo                  -min(r A, clip(r) A)               r A if r A <= clip(r) A
 *                                                           (ties included), else 0
 *   cispo                -sg(clip(r)) lp A                  clip(r) A
 *   dro                  -(lp A - beta/2 (lp - q)^2)        A - beta (lp - q)
 *
 * Back-propagating L for one datum of n tokens as the GPT's micro-batch
 * (B*T = n): forward with batch.logprobs, zdp_policy_loss(..., coef, ...),
 * zdp_lm_set_loss_weights(model, coef, n), then backward with loss scale
 * n (the model's loss is (1/(B*T)) sum w * CE, so scale n turns its mean into
 * the sum).
 *
 * From tools/zdp/: #include "../../src/models/policy_loss.h" (this header
 * needs only zdp/model.h, which every target linking zdp can include).
 */
#ifndef ZDP_POLICY_LOSS_H
#define ZDP_POLICY_LOSS_H

#include <math.h>
#include <stdint.h>

#include "zdp/model.h"

typedef enum zdp_loss_kind {
    ZDP_LOSS_CROSS_ENTROPY,
    ZDP_LOSS_IMPORTANCE_SAMPLING,
    ZDP_LOSS_PPO,
    ZDP_LOSS_CISPO,
    ZDP_LOSS_DRO,
} zdp_loss_kind;

/* Tinker's loss_fn_config: clip_low_threshold, clip_high_threshold (ratio
 * bounds, not epsilons; ppo and cispo) and beta (dro).  Start from
 * ZDP_LOSS_CONFIG_DEFAULT: clip 0.8 / 1.2 and beta unset (NAN), which dro
 * rejects -- dro has no default beta.  Requirements, checked only by the
 * kinds that use them: 0 <= clip_low <= 1 <= clip_high, both finite; beta
 * finite and >= 0. */
typedef struct zdp_loss_config {
    double clip_low, clip_high, beta;
} zdp_loss_config;

#define ZDP_LOSS_CONFIG_DEFAULT \
    ((zdp_loss_config){.clip_low = 0.8, .clip_high = 1.2, .beta = NAN})

/* The exponent lp - q is clamped at this before exp() (see policy_loss.c). */
#define ZDP_LOSS_MAX_LOG_RATIO 20.0

/* Tinker's name of a kind ("cross_entropy", "importance_sampling", "ppo",
 * "cispo", "dro"); "?" for a value outside the enum. */
ZDP_API const char *zdp_loss_kind_name(zdp_loss_kind kind);

/* The kind named `name` (Tinker's loss_fn string, exact match);
 * ZDP_ERR_INVALID_ARG naming the value and listing the known names. */
ZDP_API zdp_status zdp_loss_kind_from_name(const char *name, zdp_loss_kind *out, zdp_error *err);

/* One datum of n >= 0 tokens: fills coef[n] (the weights for
 * zdp_lm_set_loss_weights), elementwise[n] (el[t], may be NULL) and
 * *loss_sum (sum of el in double, may be NULL), per the table above.
 * Computed in double, stored as float.
 *   lp:      always required (n values).
 *   q, adv:  required by the policy kinds; ignored (may be NULL) for
 *            cross_entropy.
 *   weights: cross_entropy only (NULL = all 1; any finite signed value, never
 *            clamped); ignored by the policy kinds, which take no weights
 *            (prompt positions carry A = 0).
 *   cfg:     NULL = ZDP_LOSS_CONFIG_DEFAULT.
 * ZDP_ERR_INVALID_ARG for an unknown kind, n < 0, a missing array, a config
 * value out of range (dro without beta included), a non-finite input, or a
 * coefficient or loss term that does not fit in a float; the message names
 * the kind, the array and index, the value and the fix.  On error nothing is
 * written. */
ZDP_API zdp_status zdp_policy_loss(zdp_loss_kind kind, const zdp_loss_config *cfg, int64_t n,
                                   const float *lp, const float *q, const float *adv,
                                   const float *weights, float *coef, float *elementwise,
                                   double *loss_sum, zdp_error *err);

#endif /* ZDP_POLICY_LOSS_H */
