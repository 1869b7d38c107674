/*
 * adapter.h -- internal: how a causal LM (gpt.c, llama.c) runs with low-rank
 * adapters over frozen base weights (lora.c; docs/lora.md).
 *
 * A model lists its adaptable linears ("sites") and takes an adapter set for
 * the duration of one call.  With one attached, the model's forward adds the
 * adapter's product to each site's output, and its backward computes input
 * gradients only: no base weight gradient (the dW products are skipped, the
 * grad sink is never asked for a base tensor), and it hands each site's
 * output gradient to the adapter, which adds its own input gradient and its
 * parameters' gradients through the sink.  One code path serves the model
 * with and without adapters.
 *
 * Several adapter sets may share one base model object: they run one at a
 * time (the base's activations are shared), and a backward (or
 * zdp_lm_set_loss_weights) whose forward ran with another adapter set -- or
 * none -- is refused.
 */
#ifndef ZDP_MODELS_ADAPTER_H
#define ZDP_MODELS_ADAPTER_H

#include <stdint.h>

#include "zdp/lora.h"
#include "zdp/model.h"

#define ZDP_ADAPTER_MODULE_MAX 80

/* One adaptable linear: y (N, out) = x (N, in) W^T (+ b) in the base. */
typedef struct zdp_adapter_site {
    char module[ZDP_ADAPTER_MODULE_MAX]; /* transformers' module path: "lm_head",
                                            "model.layers.0.self_attn.q_proj",
                                            "transformer.h.0.attn.c_attn" */
    int64_t in, out;
    int group;   /* ZDP_LORA_ATTN, ZDP_LORA_MLP or ZDP_LORA_UNEMBED (zdp/lora.h) */
    int layer;   /* its block, -1 for lm_head */
    int weight;  /* index of the base's weight tensor */
    int conv1d;  /* 1: that tensor is [in, out] (GPT-2's Conv1D), else [out, in] */
    int tied;    /* 1: lm_head is the embedding tensor (its adapter is the output's only) */
} zdp_adapter_site;

typedef struct zdp_adapter {
    void *ctx;
    /* out (N, site.out) += the adapter's product of inp (N, site.in). */
    void (*forward)(void *ctx, int site, float *out, const float *inp, int64_t N);
    /* dinp (N, site.in) += the adapter's input gradient for dout (N,
     * site.out); adds the adapter's parameter gradients through sink. */
    zdp_status (*backward)(void *ctx, int site, float *dinp, const float *dout,
                           const float *inp, int64_t N, zdp_grad_sink *sink, zdp_error *err);
    /* Backward stops after this block (no adapter below it needs a
     * gradient); 0 to go down to the first. */
    int lowest_layer;
} zdp_adapter;

/* The sites of a GPT-2 or Llama-family model, in their fixed order (per
 * block, then lm_head last): fills sites[0..min(n, cap)) when sites is not
 * NULL and returns n, or -1 when the model is neither.  *max_rows (when not
 * NULL) receives the most rows (max_batch * block_size) a forward passes. */
int zdp_adapter_sites(const zdp_model *base, zdp_adapter_site *sites, int cap,
                      int64_t *max_rows);
/* Attaches ad (NULL: detaches) to a GPT-2 or Llama-family model. */
void zdp_adapter_attach(const zdp_model *base, const zdp_adapter *ad);

/* Each model's own half of the two calls above (gpt.c, llama.c); -1 / no-op
 * for a model that is not theirs. */
int zdp_gpt_adapter_sites_(const zdp_model *base, zdp_adapter_site *sites, int cap,
                           int64_t *max_rows);
int zdp_gpt_adapter_attach_(const zdp_model *base, const zdp_adapter *ad);
int zdp_llama_adapter_sites_(const zdp_model *base, zdp_adapter_site *sites, int cap,
                             int64_t *max_rows);
int zdp_llama_adapter_attach_(const zdp_model *base, const zdp_adapter *ad);

/* For KV-cache decoding (src/sample/decode.c), which applies a LoRA model's
 * adapters itself, per sequence: the index of site `site`'s A among the
 * LoRA model's parameters (B is the next one), or -1 when that site is not
 * adapted (or lora is not a LoRA model). */
int zdp_lora_site_param_(const zdp_model *lora, int site);
/* Whether a LoRA model's sites are those of `model` (same modules, in order,
 * same dimensions): its adapters then fit that model's weights, even when
 * `model` is another object than the LoRA model's base.  0 when not, with
 * the reason in err. */
int zdp_lora_fits_(const zdp_model *lora, const zdp_model *model, zdp_error *err);

#endif /* ZDP_MODELS_ADAPTER_H */
