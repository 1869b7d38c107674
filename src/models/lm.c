/*
 * lm.c -- the causal-LM calls of zdp/model.h: argument checks shared by every
 * language model, then the model's own zdp_lm_ops; and a model's forward /
 * backward over whole caller-owned tensors (a dense param source); and the
 * batch / backward / reweight plumbing of lm.h the models share.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../core/core.h"
#include "decode.h"
#include "lm.h"

static zdp_status check_lm_(const zdp_model *model, const char *fn, zdp_error *err) {
    if (model == NULL || model->lm == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "%s: the model is not a causal language model (GPT-2 or the Llama "
                           "family)",
                           fn);
    return ZDP_OK;
}

zdp_status zdp_lm_set_loss_weights(zdp_model *model, const float *w, int64_t n,
                                   zdp_error *err) {
    zdp_status st = check_lm_(model, "zdp_lm_set_loss_weights", err);
    return st != ZDP_OK ? st : model->lm->set_loss_weights(model->self, w, n, err);
}

zdp_status zdp_lm_next_logits(const zdp_model *model, const float *const *params,
                              const int32_t *tokens, int T, float *logits, zdp_error *err) {
    const char *fn = "zdp_lm_next_logits";
    zdp_status st = check_lm_(model, fn, err);
    if (st != ZDP_OK) return st;
    if (params == NULL || tokens == NULL || logits == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "%s: params, tokens and logits must be set",
                           fn);
    if (T < 1 || T > model->block_size)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "%s: T = %d: must be 1..%d (block_size)", fn,
                           T, model->block_size);
    zdp_param_source *src = zdp_param_source_create_dense(params, model->n_params);
    if (src == NULL) return zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory", fn);
    st = model->lm->next_logits(model->self, src, tokens, T, logits, err);
    free(src);
    return st;
}

zdp_status zdp_model_forward_dense(const zdp_model *model, const float *const *params,
                                   const void *batch, float *loss, zdp_error *err) {
    zdp_param_source *src = zdp_param_source_create_dense(params, model->n_params);
    if (src == NULL) return zdp_err_set(err, ZDP_ERR_NOMEM, "model forward: out of memory");
    zdp_status st = model->ops->forward(model->self, src, batch, loss, err);
    free(src);
    return st;
}

zdp_status zdp_model_backward_dense(const zdp_model *model, const float *const *params,
                                    float dloss, zdp_grad_sink *sink, zdp_error *err) {
    zdp_param_source *src = zdp_param_source_create_dense(params, model->n_params);
    if (src == NULL) return zdp_err_set(err, ZDP_ERR_NOMEM, "model backward: out of memory");
    zdp_status st = model->ops->backward(model->self, src, dloss, sink, err);
    free(src);
    return st;
}

/* ---- the models' shared plumbing (lm.h) ---------------------------------------------- */

zdp_status zdp_lm_check_ids_(const int32_t *ids, int B, int T, int vocab_size, const char *what,
                             const char *fn, zdp_error *err) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            int32_t v = ids[(int64_t)b * T + t];
            if (v < 0 || v >= vocab_size)
                return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                                   "%s: %s[%d][%d] = %d: token ids must be in [0, %d) "
                                   "(vocab_size)",
                                   fn, what, b, t, (int)v, vocab_size);
        }
    return ZDP_OK;
}

zdp_status zdp_lm_take_batch_(const zdp_lm_batch *batch, const float *loss, int max_batch,
                              int block_size, int vocab_size, const char *fn, int32_t *inputs,
                              int32_t *targets, float *weights, bool *weighted, zdp_error *err) {
    if (batch == NULL || batch->inputs == NULL || batch->targets == NULL || loss == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "%s: batch, batch->inputs, batch->targets and loss must be set", fn);
    if (batch->B < 1 || batch->B > max_batch)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "%s: batch->B = %d: must be 1..%d (the max_batch the model was "
                           "created with)",
                           fn, batch->B, max_batch);
    if (batch->T < 1 || batch->T > block_size)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "%s: batch->T = %d: must be 1..%d (block_size)",
                           fn, batch->T, block_size);
    const int B = batch->B, T = batch->T;
    zdp_status st = zdp_lm_check_ids_(batch->inputs, B, T, vocab_size, "inputs", fn, err);
    if (st == ZDP_OK) st = zdp_lm_check_ids_(batch->targets, B, T, vocab_size, "targets", fn, err);
    if (st != ZDP_OK) return st;

    const int64_t N = (int64_t)B * T;
    memcpy(inputs, batch->inputs, (size_t)N * sizeof(int32_t));
    memcpy(targets, batch->targets, (size_t)N * sizeof(int32_t));
    *weighted = batch->weights != NULL;
    if (*weighted) {
        for (int64_t n = 0; n < N; n++)
            if (!isfinite(batch->weights[n]))
                return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                                   "%s: weights[%lld][%lld] = %g: weights must be finite", fn,
                                   (long long)(n / T), (long long)(n % T),
                                   (double)batch->weights[n]);
        memcpy(weights, batch->weights, (size_t)N * sizeof(float));
    }
    return ZDP_OK;
}

zdp_status zdp_lm_check_backward_(const char *model_name, bool have_forward, bool same_adapters,
                                  zdp_error *err) {
    if (!have_forward)
        return zdp_err_set(err, ZDP_ERR_STATE,
                           "%s backward: no forward to differentiate (run forward on the "
                           "micro-batch first; backward consumes it)",
                           model_name);
    if (!same_adapters)
        return zdp_err_set(err, ZDP_ERR_STATE,
                           "%s backward: the last forward ran through another model over this "
                           "base (LoRA models sharing a base run forward and backward one model "
                           "at a time); run this model's forward again",
                           model_name);
    return ZDP_OK;
}

/* The loss the reweighted forward returned is not recomputed: it stays the
 * loss under the forward's own weights. */
zdp_status zdp_lm_reweight_(bool have_forward, bool same_adapters, int B, int T, const float *w,
                            int64_t n, float *weights, bool *weighted, zdp_error *err) {
    const char *fn = "zdp_lm_set_loss_weights";
    if (!have_forward)
        return zdp_err_set(err, ZDP_ERR_STATE,
                           "%s: no forward to reweight (run forward on the micro-batch first; "
                           "a backward, a failed forward or zdp_lm_next_logits uses it up)",
                           fn);
    if (!same_adapters)
        return zdp_err_set(err, ZDP_ERR_STATE,
                           "%s: the last forward ran through another model over this base; run "
                           "this model's forward again",
                           fn);
    const int64_t N = (int64_t)B * T;
    if (n != N)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "%s: n = %lld: must be B*T = %lld of the last forward (B = %d, T = "
                           "%d): one weight per position",
                           fn, (long long)n, (long long)N, B, T);
    if (w == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "%s: w is NULL: pass %lld weights", fn,
                           (long long)N);
    for (int64_t i = 0; i < N; i++)
        if (!isfinite(w[i]))
            return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                               "%s: w[%lld] (position [%lld][%lld]) = %g: weights must be "
                               "finite; check the inputs they were computed from",
                               fn, (long long)i, (long long)(i / T), (long long)(i % T),
                               (double)w[i]);
    memcpy(weights, w, (size_t)N * sizeof(float));
    *weighted = true;
    return ZDP_OK;
}

/* ---- the decode step (decode.h) ------------------------------------------------------ */

const zdp_decode_ops *zdp_lm_decode_ops_(const zdp_model *model, const void **self) {
    const zdp_decode_ops *ops = zdp_gpt_decode_ops_(model, self);
    return ops != NULL ? ops : zdp_llama_decode_ops_(model, self);
}
