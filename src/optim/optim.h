/*
 * optim.h -- internal: optimizer update kernels over one flat fp32 range.
 *
 * The engine hands the optimizer the range of the flat parameter buffer this
 * rank updates (everything at stage 0, the rank's partition at stages 1/2)
 * and the matching gradient.  The optimizer owns its state (Adam m and v, SGD
 * momentum) for exactly that range.  No MPI, no knowledge of ZeRO.
 */
#ifndef ZDP_OPTIM_H
#define ZDP_OPTIM_H

#include "../core/core.h"
#include "zdp/config.h"

typedef struct zdp_optim {
    zdp_optimizer_config cfg;
    int64_t n;          /* elements updated by this rank */
    float *m;           /* Adam: first moment (n); SGD: momentum buffer (n) or NULL */
    float *v;           /* Adam: second moment (n); SGD: NULL */
    int64_t step_count; /* applied updates so far (Adam's t) */
} zdp_optim;

/* Allocates state for n elements, counted under ZDP_MEM_OPTIMIZER. */
ZDP_API zdp_status zdp_optim_init(zdp_optim *opt, const zdp_optimizer_config *cfg, int64_t n,
                                  zdp_mem_counter *mem, zdp_error *err);
ZDP_API void zdp_optim_free(zdp_optim *opt, zdp_mem_counter *mem);

/* One update of params[0..n) from grads[0..n) * grad_scale (grad_scale folds
 * the clipping coefficient in, so the gradient is not rewritten).  lr is the
 * learning rate of this update.  Adam follows DeepSpeed's FusedAdam, SGD
 * torch.optim.SGD. */
ZDP_API void zdp_optim_step(zdp_optim *opt, float *params, const float *grads, float grad_scale,
                            double lr);

/* Whether zdp_optim_step with the same arguments would leave every
 * parameter and every state element finite.  Writes nothing: the same
 * float arithmetic as the update, kept only to test it, so the verdict is
 * exact.  The engine refuses (skips) an update that fails it. */
ZDP_API bool zdp_optim_update_finite(const zdp_optim *opt, const float *params, const float *grads,
                                     float grad_scale, double lr);

#endif /* ZDP_OPTIM_H */
