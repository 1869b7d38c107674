/*
 * schedule.c -- DeepSpeed's LR schedules as a pure function of the
 * scheduler's internal iteration n (docs/deepspeed.md §7).
 *
 * W' = max(2, warmup_num_steps).  The engine starts at n = -1 and adds one
 * after every applied update, so the k-th applied update uses lr(k - 2);
 * skipped (non-finite) steps do not advance it.
 *   WarmupLR:       n < 0: min; n < W': min + (max-min)*g, g = log(n+1)/log(W')
 *                   (log) or n/W' (linear); then max.
 *   WarmupDecayLR:  warmup as above; n >= W': min + (max-min)*max(0, (T-n)/max(1, T-W')).
 *   WarmupCosineLR: n < 0: 0 (DeepSpeed's first applied update has lr 0);
 *                   n < W': lr0*(wmr + (1-wmr)*g);
 *                   then lr0*max(0, cmr + (1-cmr)*(1+cos(pi*p))/2),
 *                   p = min(1, (n-W'+1)/max(1, T-W')).
 */
#include <math.h>

#include "zdp/config.h"

static double warmup_gamma_(const zdp_scheduler_config *s, double n, double wp) {
    return s->warmup_linear ? n / wp : log(n + 1.0) / log(wp);
}

double zdp_scheduler_lr(const zdp_scheduler_config *s, double base_lr, int64_t n_i) {
    if (s == NULL || s->type == ZDP_SCHEDULER_NONE) return base_lr;
    const double n = (double)n_i;
    const double wp = s->warmup_num_steps > 2 ? (double)s->warmup_num_steps : 2.0;
    const double T = (double)s->total_num_steps;
    switch (s->type) {
    case ZDP_SCHEDULER_WARMUP_LR:
    case ZDP_SCHEDULER_WARMUP_DECAY_LR: {
        const double lo = s->warmup_min_lr, hi = s->warmup_max_lr;
        double g;
        if (n < 0) g = 0.0;
        else if (n < wp) g = warmup_gamma_(s, n, wp);
        else if (s->type == ZDP_SCHEDULER_WARMUP_LR) g = 1.0;
        else {
            double d = T - wp > 1.0 ? T - wp : 1.0;
            g = (T - n) / d;
            if (g < 0.0) g = 0.0;
        }
        return lo + (hi - lo) * g;
    }
    case ZDP_SCHEDULER_WARMUP_COSINE_LR: {
        double ratio;
        if (n < 0) return 0.0;
        if (n < wp) {
            ratio = s->warmup_min_ratio + (1.0 - s->warmup_min_ratio) * warmup_gamma_(s, n, wp);
        } else {
            double d = T - wp > 1.0 ? T - wp : 1.0;
            double p = (n - wp + 1.0) / d;
            if (p > 1.0) p = 1.0;
            const double pi = 3.14159265358979323846;
            ratio = s->cos_min_ratio + (1.0 - s->cos_min_ratio) * (1.0 + cos(pi * p)) / 2.0;
            if (ratio < 0.0) ratio = 0.0;
        }
        return base_lr * ratio;
    }
    case ZDP_SCHEDULER_NONE:
        break;
    }
    return base_lr;
}
