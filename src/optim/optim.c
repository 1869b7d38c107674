/*
 * optim.c -- Adam/AdamW (DeepSpeed FusedAdam semantics) and SGD with momentum
 * (torch.optim.SGD semantics) over one flat fp32 range.
 *
 * Formulas (docs/deepspeed.md §6.2, docs/config.md):
 *   Adam, L2 mode:    g += wd * p
 *   m = b1 m + (1-b1) g ;  v = b2 v + (1-b2) g^2
 *   u = (m / bc1) / (sqrt(v / bc2) + eps)     bc = 1 - b^t when bias_correction
 *   decoupled (AdamW, and "Adam" with adam_w_mode): u += wd * p
 *   p -= lr * u
 *   SGD: d = g + wd p; buf = d (first step) or mom*buf + (1-damp) d;
 *        d = nesterov ? d + mom*buf : buf  (when mom != 0);  p -= lr d
 * Arithmetic is in float with hyper-parameters cast to float, as the fused
 * CUDA kernel does, so results match DeepSpeed to the last few bits.
 */
#include "optim.h"
#include "zdp/config.h"

#include <math.h>
#include <stdatomic.h>

static bool uses_adam_(const zdp_optimizer_config *cfg) {
    return cfg->type == ZDP_OPTIMIZER_ADAM || cfg->type == ZDP_OPTIMIZER_ADAMW;
}

zdp_status zdp_optim_init(zdp_optim *opt, const zdp_optimizer_config *cfg, int64_t n,
                          zdp_mem_counter *mem, zdp_error *err) {
    *opt = (zdp_optim){.cfg = *cfg, .n = n};
    size_t bytes = (size_t)n * sizeof(float);
    bool need_m = uses_adam_(cfg) || cfg->momentum != 0.0;
    if (need_m) {
        opt->m = zdp_alloc(mem, ZDP_MEM_OPTIMIZER, bytes);
        if (opt->m == NULL) goto nomem;
    }
    if (uses_adam_(cfg)) {
        opt->v = zdp_alloc(mem, ZDP_MEM_OPTIMIZER, bytes);
        if (opt->v == NULL) goto nomem;
    }
    return ZDP_OK;
nomem:
    zdp_optim_free(opt, mem);
    return zdp_err_set(err, ZDP_ERR_NOMEM, "optimizer state: cannot allocate %lld bytes",
                       (long long)bytes);
}

void zdp_optim_free(zdp_optim *opt, zdp_mem_counter *mem) {
    size_t bytes = (size_t)opt->n * sizeof(float);
    zdp_free(mem, ZDP_MEM_OPTIMIZER, opt->m, bytes);
    zdp_free(mem, ZDP_MEM_OPTIMIZER, opt->v, bytes);
    opt->m = opt->v = NULL;
}

/* The update of element i, shared by the step (apply) and the check (not
 * apply), so both do the same float arithmetic.  The check ORs together
 * x - x != 0 over every new value (false for finite x, true for Inf or NaN):
 * an integer reduction, so the loop still vectorises, where a float sum
 * would not (no reassociation without fast-math).  t is the step count the
 * update runs as.  Returns nonzero when some value is not finite. */
static inline unsigned adam_(const zdp_optimizer_config *c, float *restrict p,
                          const float *restrict g_in, float *restrict m, float *restrict v,
                          int64_t n, float gs, double lr_d, int64_t t_i, bool apply) {
    const bool decoupled = c->type == ZDP_OPTIMIZER_ADAMW || c->adam_w_mode;
    const double t = (double)t_i;
    const float bc1 = c->bias_correction ? (float)(1.0 - pow(c->beta1, t)) : 1.0f;
    const float bc2 = c->bias_correction ? (float)(1.0 - pow(c->beta2, t)) : 1.0f;
    const float b1 = (float)c->beta1, b2 = (float)c->beta2, eps = (float)c->eps;
    const float lr = (float)lr_d;
    /* One of the two decay terms is zero: adding 0*p changes no finite value,
     * and a loop without branches vectorises. */
    const float wd_l2 = decoupled ? 0.0f : (float)c->weight_decay;
    const float wd_dec = decoupled ? (float)c->weight_decay : 0.0f;
    unsigned bad = 0;
    for (int64_t i = 0; i < n; i++) {
        float g = g_in[i] * gs + wd_l2 * p[i];
        float mi = b1 * m[i] + (1.0f - b1) * g;
        float vi = b2 * v[i] + (1.0f - b2) * g * g;
        float update = (mi / bc1) / (sqrtf(vi / bc2) + eps) + wd_dec * p[i];
        float pi = p[i] - lr * update;
        if (apply) {
            m[i] = mi;
            v[i] = vi;
            p[i] = pi;
        } else {
            bad |= (unsigned)(mi - mi != 0.0f) | (unsigned)(vi - vi != 0.0f) |
                   (unsigned)(pi - pi != 0.0f);
        }
    }
    return bad;
}

static inline unsigned sgd_(const zdp_optimizer_config *c, float *restrict p,
                         const float *restrict g_in, float *restrict buf, int64_t n, float gs,
                         double lr_d, bool first, bool apply) {
    const float wd = (float)c->weight_decay, mom = (float)c->momentum;
    const float damp = (float)c->dampening, lr = (float)lr_d;
    unsigned bad = 0;
    for (int64_t i = 0; i < n; i++) {
        float d = g_in[i] * gs;
        if (wd != 0.0f) d = d + wd * p[i];
        if (buf != NULL) {
            float bi = first ? d : mom * buf[i] + (1.0f - damp) * d;
            if (apply) buf[i] = bi;
            else bad |= (unsigned)(bi - bi != 0.0f);
            d = c->nesterov ? d + mom * bi : bi;
        }
        float pi = p[i] - lr * d;
        if (apply) p[i] = pi;
        else bad |= (unsigned)(pi - pi != 0.0f);
    }
    return bad;
}

/* The update is element-wise: it runs over the thread pool in ranges of at
 * least RANGE_MIN_ elements (each range the same arithmetic as one pass),
 * and the check ORs the ranges' verdicts, so neither depends on the thread
 * count. */
#define RANGE_MIN_ 65536

typedef struct optim_job {
    const zdp_optim *opt;
    float *params;
    const float *grads;
    float grad_scale;
    double lr;
    int64_t t, n_tasks;
    bool apply;
    atomic_uint bad;
} optim_job;

static void optim_task_(void *ctx, int64_t task, int thread) {
    (void)thread;
    optim_job *j = ctx;
    const zdp_optim *o = j->opt;
    const int64_t lo = o->n * task / j->n_tasks, hi = o->n * (task + 1) / j->n_tasks;
    unsigned bad;
    if (uses_adam_(&o->cfg))
        bad = adam_(&o->cfg, j->params + lo, j->grads + lo, o->m + lo, o->v + lo, hi - lo,
                    j->grad_scale, j->lr, j->t, j->apply);
    else
        bad = sgd_(&o->cfg, j->params + lo, j->grads + lo, o->m != NULL ? o->m + lo : NULL,
                   hi - lo, j->grad_scale, j->lr, j->t == 1, j->apply);
    if (bad) atomic_fetch_or(&j->bad, 1u);
}

static unsigned optim_run_(const zdp_optim *opt, float *params, const float *grads,
                           float grad_scale, double lr, int64_t t, bool apply) {
    optim_job j = {.opt = opt, .params = params, .grads = grads, .grad_scale = grad_scale,
                   .lr = lr, .t = t, .apply = apply};
    const int64_t most = opt->n / RANGE_MIN_, p = zdp_pool_size();
    j.n_tasks = most < 1 ? 1 : most < p ? most : p;
    atomic_init(&j.bad, 0u);
    zdp_pool_run(j.n_tasks, optim_task_, &j);
    return atomic_load(&j.bad);
}

void zdp_optim_step(zdp_optim *opt, float *params, const float *grads, float grad_scale,
                    double lr) {
    opt->step_count++;
    (void)optim_run_(opt, params, grads, grad_scale, lr, opt->step_count, true);
}

bool zdp_optim_update_finite(const zdp_optim *opt, const float *params, const float *grads,
                             float grad_scale, double lr) {
    /* The kernels write only when apply is true: the cast is for the shared
     * signature. */
    return optim_run_(opt, (float *)params, grads, grad_scale, lr, opt->step_count + 1, false) ==
           0;
}
