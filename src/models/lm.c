/*
 * lm.c -- the causal-LM calls of zdp/model.h: argument checks shared by every
 * language model, then the model's own zdp_lm_ops; and a model's forward /
 * backward over whole caller-owned tensors (a dense param source).
 */
#include <stdlib.h>

#include "../core/core.h"

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
