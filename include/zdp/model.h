/*
 * zdp/model.h -- what the engine needs from a model (ops, grad sink,
 * parameter shapes), and the MLP.
 * Part of the public API; include zdp/zdp.h for all of it.
 */
#ifndef ZDP_PUBLIC_MODEL_H
#define ZDP_PUBLIC_MODEL_H

#include "zdp/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- models ------------------------------------------------------------ */

/* The grad sink: a model's backward does not own gradient memory.  For each
 * parameter tensor it acquires the buffer, ADDS its contribution (the buffer
 * may hold earlier micro-batches' gradients, or zeros), and releases it when
 * this backward will add nothing more.  Acquiring the same tensor twice in one
 * backward returns the same buffer.  Every tensor must be released exactly
 * once per backward (the engine releases forgotten ones at the end, in
 * reverse order).  Returns NULL on misuse (index out of range, already
 * released); the backward must then fail. */
typedef struct zdp_grad_sink zdp_grad_sink;
ZDP_API float *zdp_grad_acquire(zdp_grad_sink *sink, int param_index);
ZDP_API void zdp_grad_release(zdp_grad_sink *sink, int param_index);

typedef struct zdp_param_info {
    const char *name;            /* "linears.0.weight" */
    int ndim;
    int64_t shape[ZDP_MAX_DIMS]; /* row-major */
} zdp_param_info;

/* What the engine needs from a model.  Parameters live in the engine's flat
 * buffer: params[i] points at tensor i (see zdp_param_info for its shape). */
typedef struct zdp_model_ops {
    /* Runs the forward pass on one micro-batch and keeps what backward needs.
     * *loss: the micro-batch's loss (for example mean cross-entropy). */
    zdp_status (*forward)(void *self, const float *const *params,
                          const void *batch, float *loss, zdp_error *err);
    /* Back-propagates d(objective)/d(loss) = dloss from the last forward,
     * adding every parameter's gradient through the sink. */
    zdp_status (*backward)(void *self, const float *const *params, float dloss,
                           zdp_grad_sink *sink, zdp_error *err);
} zdp_model_ops;

typedef struct zdp_model {
    void *self;                  /* the model's own state (activations) */
    const zdp_model_ops *ops;
    int n_params;                /* number of parameter tensors */
    const zdp_param_info *params; /* n_params entries, registration order */
    /* Optional (NULL: none): the model's shape as a flat JSON object of
     * integers and strings, e.g. {"model": "gpt", "n_layer": 4, "n_head": 4,
     * ...}.  Checkpoints record it, and loading one saved with another shape
     * is refused naming the key and both values -- including keys such as
     * n_head that no tensor shape shows. */
    const char *shape_json;
} zdp_model;

/* ---- the MLP (DeepSpeed's test SimpleModel) ---------------------------- */

/* nlayers Linear(hidden, hidden) with bias.  forward: for i in 0..L-1:
 * x = nlayers > 1 ? linears[i/2](x) + linears[i](x) : linears[0](x); then
 * mean cross-entropy of x (logits over `hidden` classes) against y. */
typedef struct zdp_mlp_batch {
    const float *x;   /* (n, hidden) row-major */
    const int64_t *y; /* (n,) class labels in [0, hidden) */
    int64_t n;
} zdp_mlp_batch;

/* Creates the model (with its zdp_model interface in *out).  `max_batch`
 * bounds the micro-batch rows; activations are allocated here. */
ZDP_API zdp_status zdp_mlp_create(int hidden, int nlayers, int64_t max_batch,
                                  zdp_model *out, zdp_error *err);
ZDP_API void zdp_mlp_destroy(zdp_model *model);
/* Seeded initialiser (uniform(-1/sqrt(h), 1/sqrt(h)), as torch.nn.Linear):
 * params[i] points at tensor i. */
ZDP_API void zdp_mlp_init_params(const zdp_model *model, float *const *params,
                                 uint64_t seed);

#ifdef __cplusplus
}
#endif
#endif /* ZDP_PUBLIC_MODEL_H */
