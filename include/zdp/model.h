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

/* The param source: a model asks for the parameters of each layer before it
 * uses them and gives them back after (DeepSpeed's fetch/release hooks
 * around each submodule).  zdp_param_fetch returns the table of n_params
 * pointers in which entries [first, first + count) are valid until the
 * matching zdp_param_release(src, first, count); other entries must not be
 * read.  At ZeRO stages 0-2 (and for a dense source) every entry is always
 * valid and both calls cost nothing; at stage 3 the fetch all-gathers the
 * range from the ranks' partitions (every rank makes the same calls in the
 * same order, as the model's code is the same on every rank).  Fetching a
 * range that is live again returns the same pointers (it is released as
 * often as it was fetched); a range that overlaps a live one without being
 * equal to it is refused.  Ranges left live at the end of a forward or
 * backward are released by the engine.  Fails (*table NULL) on misuse
 * (a range out of bounds or overlapping a live one) or a failed gather; the
 * forward or backward must then return the status. */
typedef struct zdp_param_source zdp_param_source;
ZDP_API zdp_status zdp_param_fetch(zdp_param_source *src, int first, int count,
                                   const float *const **table, zdp_error *err);
ZDP_API void zdp_param_release(zdp_param_source *src, int first, int count);
/* A source over caller-owned whole tensors (tests, references, sampling
 * with plain arrays): params[i] for i < n_params; free() it. */
ZDP_API zdp_param_source *zdp_param_source_create_dense(const float *const *params,
                                                        int n_params);

/* A model's forward / backward over caller-owned whole tensors (params[i]
 * for every tensor), through a dense param source: references and tests. */
struct zdp_model;
ZDP_API zdp_status zdp_model_forward_dense(const struct zdp_model *model,
                                           const float *const *params, const void *batch,
                                           float *loss, zdp_error *err);
ZDP_API zdp_status zdp_model_backward_dense(const struct zdp_model *model,
                                            const float *const *params, float dloss,
                                            zdp_grad_sink *sink, zdp_error *err);

typedef struct zdp_param_info {
    const char *name;            /* "linears.0.weight" */
    int ndim;
    int64_t shape[ZDP_MAX_DIMS]; /* row-major */
} zdp_param_info;

/* What the engine needs from a model.  Parameters live in the engine's flat
 * buffer (or its partitions, at stage 3): the model reads them through the
 * param source, tensor i with the shape zdp_param_info gives. */
typedef struct zdp_model_ops {
    /* Runs the forward pass on one micro-batch and keeps what backward needs.
     * *loss: the micro-batch's loss (for example mean cross-entropy). */
    zdp_status (*forward)(void *self, zdp_param_source *src, const void *batch, float *loss,
                          zdp_error *err);
    /* Back-propagates d(objective)/d(loss) = dloss from the last forward,
     * adding every parameter's gradient through the sink. */
    zdp_status (*backward)(void *self, zdp_param_source *src, float dloss,
                           zdp_grad_sink *sink, zdp_error *err);
} zdp_model_ops;

/* Causal language models (GPT-2, the Llama family) implement these on top
 * of zdp_model_ops, so that the tool and the server drive any of them the
 * same way: zdp_lm_set_loss_weights and zdp_lm_next_logits below. */
typedef struct zdp_lm_ops {
    zdp_status (*set_loss_weights)(void *self, const float *w, int64_t n, zdp_error *err);
    zdp_status (*next_logits)(void *self, zdp_param_source *src, const int32_t *tokens,
                              int T, float *logits, zdp_error *err);
} zdp_lm_ops;

/* Reads elements [lo, hi) of tensor i (row-major, flattened; 0 <= lo <= hi
 * <= its numel) as fp32 into dst: how weights reach an engine a slice at a
 * time (zdp_frozen.read, zdp_engine_load_params), so that at ZeRO stage 3 a
 * rank reads only its partition's piece of each tensor.  zdp_hf_reader_read
 * reads a Hugging Face folder this way. */
typedef zdp_status (*zdp_tensor_read_fn)(void *ctx, int i, int64_t lo, int64_t hi, float *dst,
                                         zdp_error *err);

/* Weights a model reads but never trains (a LoRA model's base): its
 * tensors, how to read them, and the source the model reads them through.
 * At ZeRO stage 3 the engine partitions them 1/W per rank beside the
 * parameters (no gradient, no optimizer state), reading only this rank's
 * slice of each tensor through read(read_ctx, ...) at zdp_engine_create
 * (never again: read_ctx need live only that long), and points *src at its
 * own source over them, which gathers them layer by layer as it does the
 * parameters; zdp_engine_destroy points it back (destroy the engine before
 * the model). */
typedef struct zdp_frozen {
    int n_params;
    const zdp_param_info *params; /* (n_params) */
    zdp_tensor_read_fn read;
    void *read_ctx;
    zdp_param_source **src;       /* where the model reads them */
} zdp_frozen;

typedef struct zdp_model {
    void *self;                  /* the model's own state (activations) */
    const zdp_model_ops *ops;
    const zdp_lm_ops *lm;        /* NULL unless the model is a causal LM */
    int vocab_size;              /* causal LMs: token ids are in [0, vocab_size) */
    int block_size;              /* causal LMs: the longest sequence forward takes */
    int n_params;                /* number of parameter tensors */
    const zdp_param_info *params; /* n_params entries, registration order */
    /* Optional (NULL: none): the model's shape as a flat JSON object of
     * integers and strings, e.g. {"model": "gpt", "n_layer": 4, "n_head": 4,
     * ...}.  Checkpoints record it, and loading one saved with another shape
     * is refused naming the key and both values -- including keys such as
     * n_head that no tensor shape shows. */
    const char *shape_json;
    /* The model's own activation memory in bytes (allocated by the model,
     * not the engine: GPT-2 and the Llama family hold max_batch x
     * block_size tokens of every layer for backward); 0 when not counted.
     * The engine's memory report shows it beside the engine's own bytes. */
    int64_t activation_bytes;
    /* Optional (NULL: none): frozen weights (see zdp_frozen). */
    const zdp_frozen *frozen;
} zdp_model;

/* ---- causal language models ------------------------------------------- */

/* One micro-batch of a causal LM (the forward's `batch`): B sequences of T
 * tokens (T <= block_size).  The loss is
 * (1/(B*T)) sum_{b,t} w[b][t] * (-log p(targets[b][t])): the mean
 * cross-entropy when weights is NULL (all 1); with weights, a weight 0 masks
 * a position (Tinker's loss_fn_inputs.weights; scale the loss by B*T to get
 * their plain sum). */
typedef struct zdp_lm_batch {
    const int32_t *inputs;  /* (B, T) token ids in [0, V) */
    const int32_t *targets; /* (B, T) next-token ids in [0, V) */
    const float *weights;   /* (B, T) finite per-position loss weights, or NULL */
    float *logprobs;        /* OUT (B, T) log p(targets) filled by forward, or NULL */
    int B, T;
} zdp_lm_batch;

/* Replaces the per-position loss weights of the last forward before its
 * backward: w holds B*T finite values (the last forward's B and T).  Every
 * Tinker policy loss (importance sampling, PPO, CISPO, DRO) has a gradient
 * -sum_t c_t * d(log p_t) whose coefficients c_t depend on the forward's own
 * log-probabilities, so it is back-propagated as this weighted cross-entropy
 * with w = c.  The loss that forward returned is not recomputed.
 * ZDP_ERR_STATE before any forward, ZDP_ERR_INVALID_ARG for a model that is
 * not a causal LM, a wrong n or a non-finite weight (nothing changes then). */
ZDP_API zdp_status zdp_lm_set_loss_weights(zdp_model *model, const float *w, int64_t n,
                                           zdp_error *err);
/* Inference for sampling: logits (vocab_size floats) of the last position of
 * tokens[0..T) (1 <= T <= block_size).  Uses the model's activation memory,
 * so not concurrently with training calls (it also uses up the last forward:
 * a backward must follow a new forward). */
ZDP_API zdp_status zdp_lm_next_logits(const zdp_model *model, const float *const *params,
                                      const int32_t *tokens, int T, float *logits,
                                      zdp_error *err);

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
