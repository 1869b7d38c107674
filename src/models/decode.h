/*
 * decode.h -- internal: a causal LM's incremental forward (the decode step)
 * over a ragged batch of rows, each row one (slot, token) at the slot's next
 * position.  The model (gpt.c, llama.c) walks its own layers with its own
 * tensor indices; the KV cache (src/sample/decode.c) supplies the rows, the
 * scratch and four services: its products (packed weights), the LoRA
 * adapters bound to each row's slot, and attention over the cached keys and
 * values.  So the model's math for a decode step lives beside its training
 * forward, and the cache knows no model's tensor names.
 */
#ifndef ZDP_MODELS_DECODE_H
#define ZDP_MODELS_DECODE_H

#include <stdint.h>

#include "zdp/model.h"

typedef struct zdp_decode_pass {
    const float *const *P;  /* the model's whole tensors, P[i] for every i */
    int64_t n;              /* rows in the pass */
    const int32_t *tokens;  /* (n) token ids, checked against vocab_size */
    const int *pos;         /* (n) each row's position in its slot */
    const float *cos, *sin; /* (positions, head_dim/2) rotary tables (Llama family) */
    /* Scratch for n rows, C the width of the residual stream, F the MLP's,
     * QD = NH*hd, KD = KV*hd. */
    float *x;         /* (n, C) the residual stream; after the trunk its last value */
    float *h;         /* (n, C) a norm's output, a projection's */
    float *qkv;       /* (n, 3C) GPT-2's fused q, k, v */
    float *q, *k, *v; /* (n, QD), (n, KD), (n, KD) the Llama family's */
    float *atty;      /* (n, QD) the attention output (attend writes it) */
    float *f1, *f2;   /* (n, F) the MLP's hidden rows */
    float *mean;      /* (n) LayerNorm means */
    float *rstd;      /* (n * NH) a norm's reciprocal standard deviations */
    void *ctx;        /* the cache's, for the calls below */
    /* out (N, OC) [+]= inp (N, C) @ P[w]^T + bias: a torch.nn.Linear weight
     * (OC, C); accumulate: add into out. */
    void (*linear)(void *ctx, float *out, const float *inp, int w, const float *bias, int64_t N,
                   int64_t C, int64_t OC, int accumulate);
    /* out (N, OC) = inp (N, C) @ P[w] + bias: a Hugging Face Conv1D weight
     * (C, OC) (GPT-2). */
    void (*conv1d)(void *ctx, float *out, const float *inp, int w, const float *bias, int64_t N,
                   int64_t C, int64_t OC);
    /* out (N, site's out) += the adapter products of inp for adapter site
     * `site` (adapter.h's order), each row by its slot's adapter; head: the
     * rows are the lm_head's (the rows asked for), not the pass's. */
    void (*adapt)(void *ctx, int site, float *out, const float *inp, int64_t N, int head);
    /* Stores every row's key and value (rows k, v of stride kv_stride, KD
     * floats each) at layer `layer`, then attends the rows' queries (q of
     * stride q_stride) into atty. */
    void (*attend)(void *ctx, int layer, const float *q, int64_t q_stride, const float *k,
                   const float *v, int64_t kv_stride);
} zdp_decode_pass;

typedef struct zdp_decode_ops {
    /* The embedding of the pass's tokens at their positions and every
     * block: pass->x holds the last residual rows. */
    void (*trunk)(const void *self, zdp_decode_pass *pass);
    /* The final norm and the lm_head (with its adapter) on pass->x's first
     * m rows: logits (m, vocab_size). */
    void (*head)(const void *self, zdp_decode_pass *pass, int64_t m, float *logits);
} zdp_decode_ops;

/* The decode step of a GPT-2 or Llama-family model, with the self to pass
 * it (*self), or NULL for any other model.  Each model's half in its file. */
const zdp_decode_ops *zdp_lm_decode_ops_(const zdp_model *model, const void **self);
const zdp_decode_ops *zdp_gpt_decode_ops_(const zdp_model *model, const void **self);
const zdp_decode_ops *zdp_llama_decode_ops_(const zdp_model *model, const void **self);

#endif /* ZDP_MODELS_DECODE_H */
