/*
 * gpt.c -- GPT-2 (zdp.h's GPT-2 section) on the nn/ kernels.
 *
 *   x = wte[inputs] + wpe[0..T)
 *   per layer:  x = x + c_proj(attn(c_attn(ln_1(x))))
 *               x = x + mlp.c_proj(gelu(mlp.c_fc(ln_2(x))))
 *   logits = ln_f(x) @ wte^T;  loss = mean cross-entropy over all B*T positions
 *
 * Parameters are registered in zdp.h's order with Hugging Face names and
 * Conv1D [in, out] layouts.  Activations for max_batch x block_size tokens
 * are allocated once at create (one block, owned here, not counted by the
 * engine); forward keeps every layer's activations for backward.
 *
 * Backward and the grad sink: tensors are acquired when they first get a
 * gradient and released as soon as they get no more, in backward order: ln_f,
 * layer L-1 down to 0 (each layer's twelve tensors last to first, which is the
 * order their gradients complete), wpe, and wte last.  wte is tied: it gets
 * the lm_head's contribution first and the token embedding's at the very end,
 * so it stays acquired through the whole backward.  Since the engine plans
 * buckets from the last registered tensor to the first, buckets complete in
 * order.  With adapters attached (adapter.h, lora.c) the same code runs
 * frozen: each Conv1D site and the lm_head hand their output to the
 * adapter in forward and their output gradient in backward, no base
 * tensor is acquired, no dW is computed, and backward stops below the
 * lowest adapted block.  Not here: any parallelism or communication (the
 * engine's job).
 */
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/core.h"
#include "../nn/nn.h"
#include "adapter.h"
#include "decode.h"
#include "lm.h"
#include "zdp/gpt.h"

/* Offsets of one layer's tensors from its first (registration order). */
enum {
    LN1_W, LN1_B, ATTN_W, ATTN_B, APROJ_W, APROJ_B,
    LN2_W, LN2_B, FC_W, FC_B, FPROJ_W, FPROJ_B, PER_LAYER
};
#define WTE_ 0
#define WPE_ 1
#define LAYER0_ 2
#define NAME_MAX_ 64
/* Adapter sites (adapter.h): per block attn.c_attn, attn.c_proj, mlp.c_fc,
 * mlp.c_proj; lm_head last. */
enum { S_ATTN, S_APROJ, S_FC, S_FPROJ, SITES_PER_LAYER };

typedef struct gpt {
    zdp_gpt_config cfg;
    int max_batch;
    int B, T;          /* shape of the last forward */
    bool have_forward; /* backward may run (forward's activations are intact) */
    int32_t *inputs;   /* (max_batch, block_size) copies of the last batch */
    int32_t *targets;
    float *weights;       /* (max_batch*T) per-position loss weights of the last forward */
    bool weighted;        /* the last forward had weights */
    char shape_json[192]; /* zdp_model.shape_json */
    const zdp_adapter *ad;     /* attached adapters (adapter.h), or NULL: plain training */
    const zdp_adapter *fwd_ad; /* the adapters the last forward ran with */

    /* Activations: one allocation, sliced below.  Per-layer arrays hold L
     * slices of max_batch*block_size rows; a forward with B, T uses the first
     * B*T rows of each slice. */
    float *mem;
    float *encoded;              /* (BT, C) the embedding: layer 0's input */
    float *ln1, *ln2;            /* (L, BT, C) */
    float *ln1_mean, *ln1_rstd;  /* (L, BT) */
    float *ln2_mean, *ln2_rstd;  /* (L, BT) */
    float *qkv;                  /* (L, BT, 3C) */
    float *att;                  /* (L, B, NH, T, T) attention probabilities */
    float *atty;                 /* (L, BT, C) attention output, before c_proj */
    float *res_mid;              /* (L, BT, C) x + attention */
    float *fch, *fch_gelu;       /* (L, BT, 4C) */
    float *res_out;              /* (L, BT, C) the layer's output */
    float *lnf;                  /* (BT, C) */
    float *lnf_mean, *lnf_rstd;  /* (BT) */
    float *probs;                /* (BT, V) softmax; backward turns it into dlogits */
    float *proj;                 /* (BT, C) scratch: c_proj outputs before the residual add */
    /* Backward scratch. */
    float *dres;                 /* (BT, C) gradient of the residual stream */
    float *dnorm;                /* (2C) a frozen LayerNorm's discarded weight and bias gradients */
    float *dbuf;                 /* (BT, C) gradient of an ln output / attention output */
    float *dqkv;                 /* (BT, 3C) */
    float *dfch;                 /* (BT, 4C) */
    float *datt;                 /* (threads, T, T) attention scratch, one per pool thread */

    char *names;          /* n_params * NAME_MAX_ */
    zdp_param_info *info; /* (n_params) */
} gpt;

static const zdp_model_ops gpt_ops_;
static const zdp_lm_ops gpt_lm_ops_;

static gpt *gpt_of_(const zdp_model *model) {
    return model != NULL && model->ops == &gpt_ops_ ? model->self : NULL;
}

/* ---- forward ------------------------------------------------------------------------ */

/* out (N, site's out) += the attached adapter's product of inp; nothing without adapters. */
static void hook_fwd_(const gpt *m, int site, float *out, const float *inp, int64_t N) {
    if (m->ad != NULL) m->ad->forward(m->ad->ctx, site, out, inp, N);
}

/* Embedding and every block on inputs (B,T), each fetched from the param
 * source while it computes; *out: the last residual (B*T, C). */
static zdp_status trunk_forward_(gpt *m, zdp_param_source *src, const int32_t *inputs, int B,
                                 int T, const float **out, zdp_error *err) {
    const int64_t C = m->cfg.n_embd, NH = m->cfg.n_head, N = (int64_t)B * T;
    const int64_t rows = (int64_t)m->max_batch * m->cfg.block_size;
    const int64_t att_slice = (int64_t)m->max_batch * NH * m->cfg.block_size * m->cfg.block_size;
    const float *const *P;
    zdp_status st = zdp_param_fetch(src, WTE_, 2, &P, err); /* wte, wpe */
    if (st != ZDP_OK) return st;
    zdp_nn_embedding_forward(m->encoded, inputs, P[WTE_], P[WPE_], B, T, C);
    zdp_param_release(src, WTE_, 2);
    const float *x = m->encoded;
    for (int l = 0; l < m->cfg.n_layer; l++) {
        const int p0 = LAYER0_ + PER_LAYER * l;
        if ((st = zdp_param_fetch(src, p0, PER_LAYER, &P, err)) != ZDP_OK) return st;
        const float *const *lp = P + p0;
        const int64_t r = l * rows;
        float *ln1 = m->ln1 + r * C, *qkv = m->qkv + r * 3 * C, *atty = m->atty + r * C;
        float *res_mid = m->res_mid + r * C, *ln2 = m->ln2 + r * C;
        float *fch = m->fch + r * 4 * C, *fch_gelu = m->fch_gelu + r * 4 * C;
        float *res_out = m->res_out + r * C;
        zdp_nn_layernorm_forward(ln1, m->ln1_mean + r, m->ln1_rstd + r, x, lp[LN1_W], lp[LN1_B],
                                 N, C);
        const int s0 = l * SITES_PER_LAYER;
        zdp_nn_matmul_forward(qkv, ln1, lp[ATTN_W], lp[ATTN_B], N, C, 3 * C);
        hook_fwd_(m, s0 + S_ATTN, qkv, ln1, N);
        zdp_nn_attention_forward(atty, m->att + l * att_slice, qkv, B, T, C, NH);
        zdp_nn_matmul_forward(m->proj, atty, lp[APROJ_W], lp[APROJ_B], N, C, C);
        hook_fwd_(m, s0 + S_APROJ, m->proj, atty, N);
        zdp_nn_residual_forward(res_mid, x, m->proj, N * C);
        zdp_nn_layernorm_forward(ln2, m->ln2_mean + r, m->ln2_rstd + r, res_mid, lp[LN2_W],
                                 lp[LN2_B], N, C);
        zdp_nn_matmul_forward(fch, ln2, lp[FC_W], lp[FC_B], N, C, 4 * C);
        hook_fwd_(m, s0 + S_FC, fch, ln2, N);
        zdp_nn_gelu_forward(fch_gelu, fch, N * 4 * C);
        zdp_nn_matmul_forward(m->proj, fch_gelu, lp[FPROJ_W], lp[FPROJ_B], N, 4 * C, C);
        hook_fwd_(m, s0 + S_FPROJ, m->proj, fch_gelu, N);
        zdp_nn_residual_forward(res_out, res_mid, m->proj, N * C);
        zdp_param_release(src, p0, PER_LAYER);
        x = res_out;
    }
    *out = x;
    return ZDP_OK;
}

/* ln_f on the last residual rows x (n, C), then the tied lm_head into out (n, V). */
static zdp_status head_forward_(gpt *m, zdp_param_source *src, const float *x, int64_t n,
                                float *out, zdp_error *err) {
    const int64_t C = m->cfg.n_embd, V = m->cfg.vocab_size;
    const int lnf = LAYER0_ + PER_LAYER * m->cfg.n_layer;
    const float *const *P;
    zdp_status st = zdp_param_fetch(src, lnf, 2, &P, err);
    if (st != ZDP_OK) return st;
    zdp_nn_layernorm_forward(m->lnf, m->lnf_mean, m->lnf_rstd, x, P[lnf], P[lnf + 1], n, C);
    zdp_param_release(src, lnf, 2);
    if ((st = zdp_param_fetch(src, WTE_, 1, &P, err)) != ZDP_OK) return st;
    zdp_nn_lmhead_forward(out, m->lnf, P[WTE_], n, C, V);
    zdp_param_release(src, WTE_, 1);
    hook_fwd_(m, m->cfg.n_layer * SITES_PER_LAYER, out, m->lnf, n);
    return ZDP_OK;
}

static zdp_status gpt_forward_(void *self, zdp_param_source *src, const void *batch_v,
                               float *loss, zdp_error *err) {
    gpt *m = self;
    const zdp_lm_batch *batch = batch_v;
    const char *fn = "gpt forward";
    m->have_forward = false;
    zdp_status st = zdp_lm_take_batch_(batch, loss, m->max_batch, m->cfg.block_size,
                                       m->cfg.vocab_size, fn, m->inputs, m->targets, m->weights,
                                       &m->weighted, err);
    if (st != ZDP_OK) return st;
    const int B = batch->B, T = batch->T;
    const int64_t V = m->cfg.vocab_size, N = (int64_t)B * T;
    const float *x;
    if ((st = trunk_forward_(m, src, m->inputs, B, T, &x, err)) != ZDP_OK ||
        (st = head_forward_(m, src, x, N, m->probs, err)) != ZDP_OK)
        return st;
    *loss = (float)zdp_nn_softmax_crossentropy_forward(m->probs, m->probs, m->targets,
                                                       m->weighted ? m->weights : NULL,
                                                       batch->logprobs, N, V);
    m->B = B;
    m->T = T;
    m->have_forward = true;
    m->fwd_ad = m->ad;
    return ZDP_OK;
}

/* ---- backward ------------------------------------------------------------------------ */

/* Acquires the gradient buffers of tensors i and j (j < 0: only i); with
 * adapters attached the base is frozen: both NULL, the sink never asked. */
static zdp_status acquire_(zdp_grad_sink *sink, const gpt *m, int i, float **gi, int j,
                           float **gj, zdp_error *err) {
    if (m->ad != NULL) {
        *gi = NULL;
        if (gj != NULL) *gj = NULL;
        return ZDP_OK;
    }
    *gi = zdp_grad_acquire(sink, i);
    if (j >= 0) *gj = zdp_grad_acquire(sink, j);
    if (*gi == NULL || (j >= 0 && *gj == NULL))
        return zdp_err_set(err, ZDP_ERR_INTERNAL,
                           "gpt backward: the grad sink refused %s (index %d)",
                           *gi == NULL ? m->info[i].name : m->info[j].name, *gi == NULL ? i : j);
    return ZDP_OK;
}

static void release_(zdp_grad_sink *sink, const gpt *m, int i) {
    if (m->ad == NULL) zdp_grad_release(sink, i);
}

/* LayerNorm weight and bias gradients: frozen ones go to a discarded scratch. */
static void frozen_norm_(const gpt *m, float **dw, float **db) {
    if (*dw != NULL) return;
    const int64_t C = m->cfg.n_embd;
    memset(m->dnorm, 0, (size_t)(2 * C) * sizeof(float));
    *dw = m->dnorm;
    *db = m->dnorm + C;
}

/* The attached adapter's backward at a site (nothing without adapters). */
static zdp_status hook_bwd_(const gpt *m, int site, float *dinp, const float *dout,
                            const float *inp, int64_t N, zdp_grad_sink *sink, zdp_error *err) {
    return m->ad != NULL ? m->ad->backward(m->ad->ctx, site, dinp, dout, inp, N, sink, err)
                         : ZDP_OK;
}

static zdp_status gpt_backward_(void *self, zdp_param_source *src, float dloss,
                                zdp_grad_sink *sink, zdp_error *err) {
    gpt *m = self;
    const zdp_status ready =
        zdp_lm_check_backward_("gpt", m->have_forward, m->fwd_ad == m->ad, err);
    if (ready != ZDP_OK) return ready;
    /* Backward turns probs into dlogits in place: one backward per forward. */
    m->have_forward = false;
    const int B = m->B, T = m->T, L = m->cfg.n_layer;
    const int64_t C = m->cfg.n_embd, NH = m->cfg.n_head, V = m->cfg.vocab_size;
    const int64_t N = (int64_t)B * T;
    const int64_t rows = (int64_t)m->max_batch * m->cfg.block_size;
    const int64_t att_slice = (int64_t)m->max_batch * NH * m->cfg.block_size * m->cfg.block_size;
    const int lnf = LAYER0_ + PER_LAYER * L;
    float *dw = NULL, *db = NULL, *dwte = NULL, *dwpe = NULL;
    const float *const *params;
    zdp_status st;

    /* Loss and lm_head: wte's first contribution (it stays acquired). */
    zdp_nn_softmax_crossentropy_backward(m->probs, m->probs, m->targets,
                                         m->weighted ? m->weights : NULL, dloss, N, V);
    if ((st = acquire_(sink, m, WTE_, &dwte, -1, NULL, err)) != ZDP_OK ||
        (st = zdp_param_fetch(src, WTE_, 1, &params, err)) != ZDP_OK)
        return st;
    zdp_nn_lmhead_backward(m->dbuf, dwte, m->probs, m->lnf, params[WTE_], N, C, V);
    zdp_param_release(src, WTE_, 1);
    if ((st = hook_bwd_(m, L * SITES_PER_LAYER, m->dbuf, m->probs, m->lnf, N, sink, err)) !=
        ZDP_OK)
        return st;

    /* ln_f: the residual stream's gradient starts here. */
    const float *x_last = m->res_out + (int64_t)(L - 1) * rows * C; /* L >= 1 */
    if ((st = acquire_(sink, m, lnf, &dw, lnf + 1, &db, err)) != ZDP_OK ||
        (st = zdp_param_fetch(src, lnf, 2, &params, err)) != ZDP_OK)
        return st;
    memset(m->dres, 0, (size_t)(N * C) * sizeof(float));
    frozen_norm_(m, &dw, &db);
    zdp_nn_layernorm_backward(m->dres, dw, db, m->dbuf, x_last, params[lnf], m->lnf_mean,
                              m->lnf_rstd, N, C);
    zdp_param_release(src, lnf, 2);
    release_(sink, m, lnf + 1);
    release_(sink, m, lnf);

    /* Blocks, last first.  The residual adds pass dres through unchanged
     * (their backward is the identity), so one buffer carries the residual
     * stream's gradient and the ln backwards add into it. */
    const int lowest = m->ad != NULL ? m->ad->lowest_layer : 0;
    for (int l = L - 1; l >= lowest; l--) {
        const int p0 = LAYER0_ + PER_LAYER * l;
        if ((st = zdp_param_fetch(src, p0, PER_LAYER, &params, err)) != ZDP_OK) return st;
        const int s0 = l * SITES_PER_LAYER;
        const float *const *lp = params + p0;
        const int64_t r = l * rows;
        const float *x_in = l > 0 ? m->res_out + (r - rows) * C : m->encoded;

        if ((st = acquire_(sink, m, p0 + FPROJ_W, &dw, p0 + FPROJ_B, &db, err)) != ZDP_OK) return st;
        zdp_nn_matmul_backward(m->dfch, dw, db, m->dres, m->fch_gelu + r * 4 * C, lp[FPROJ_W], N,
                               4 * C, C);
        release_(sink, m, p0 + FPROJ_B);
        release_(sink, m, p0 + FPROJ_W);
        if ((st = hook_bwd_(m, s0 + S_FPROJ, m->dfch, m->dres, m->fch_gelu + r * 4 * C, N, sink,
                            err)) != ZDP_OK)
            return st;
        zdp_nn_gelu_backward(m->dfch, m->fch + r * 4 * C, m->dfch, N * 4 * C);

        if ((st = acquire_(sink, m, p0 + FC_W, &dw, p0 + FC_B, &db, err)) != ZDP_OK) return st;
        zdp_nn_matmul_backward(m->dbuf, dw, db, m->dfch, m->ln2 + r * C, lp[FC_W], N, C, 4 * C);
        release_(sink, m, p0 + FC_B);
        release_(sink, m, p0 + FC_W);
        if ((st = hook_bwd_(m, s0 + S_FC, m->dbuf, m->dfch, m->ln2 + r * C, N, sink, err)) !=
            ZDP_OK)
            return st;

        if ((st = acquire_(sink, m, p0 + LN2_W, &dw, p0 + LN2_B, &db, err)) != ZDP_OK) return st;
        frozen_norm_(m, &dw, &db);
        zdp_nn_layernorm_backward(m->dres, dw, db, m->dbuf, m->res_mid + r * C, lp[LN2_W],
                                  m->ln2_mean + r, m->ln2_rstd + r, N, C);
        release_(sink, m, p0 + LN2_B);
        release_(sink, m, p0 + LN2_W);

        if ((st = acquire_(sink, m, p0 + APROJ_W, &dw, p0 + APROJ_B, &db, err)) != ZDP_OK) return st;
        zdp_nn_matmul_backward(m->dbuf, dw, db, m->dres, m->atty + r * C, lp[APROJ_W], N, C, C);
        release_(sink, m, p0 + APROJ_B);
        release_(sink, m, p0 + APROJ_W);
        if ((st = hook_bwd_(m, s0 + S_APROJ, m->dbuf, m->dres, m->atty + r * C, N, sink, err)) !=
            ZDP_OK)
            return st;

        zdp_nn_attention_backward(m->dqkv, m->datt, m->dbuf, m->qkv + r * 3 * C,
                                  m->att + l * att_slice, B, T, C, NH);

        if ((st = acquire_(sink, m, p0 + ATTN_W, &dw, p0 + ATTN_B, &db, err)) != ZDP_OK) return st;
        zdp_nn_matmul_backward(m->dbuf, dw, db, m->dqkv, m->ln1 + r * C, lp[ATTN_W], N, C, 3 * C);
        release_(sink, m, p0 + ATTN_B);
        release_(sink, m, p0 + ATTN_W);
        if ((st = hook_bwd_(m, s0 + S_ATTN, m->dbuf, m->dqkv, m->ln1 + r * C, N, sink, err)) !=
            ZDP_OK)
            return st;

        if ((st = acquire_(sink, m, p0 + LN1_W, &dw, p0 + LN1_B, &db, err)) != ZDP_OK) return st;
        frozen_norm_(m, &dw, &db);
        zdp_nn_layernorm_backward(m->dres, dw, db, m->dbuf, x_in, lp[LN1_W], m->ln1_mean + r,
                                  m->ln1_rstd + r, N, C);
        release_(sink, m, p0 + LN1_B);
        release_(sink, m, p0 + LN1_W);
        zdp_param_release(src, p0, PER_LAYER);
    }

    /* Embeddings: wpe, then wte's second contribution, and wte is done. */
    if (m->ad != NULL) return ZDP_OK; /* frozen: nothing below the first block to train */
    if ((st = acquire_(sink, m, WPE_, &dwpe, WTE_, &dwte, err)) != ZDP_OK) return st;
    zdp_nn_embedding_backward(dwte, dwpe, m->dres, m->inputs, B, T, C);
    release_(sink, m, WPE_);
    release_(sink, m, WTE_);
    return ZDP_OK;
}

static const zdp_model_ops gpt_ops_ = {.forward = gpt_forward_, .backward = gpt_backward_};

/* ---- create / destroy ------------------------------------------------------------------ */

static zdp_status check_config_(const zdp_gpt_config *c, int max_batch, zdp_error *err) {
    const char *fn = "gpt create";
    if (c->n_layer < 1 || c->n_layer > 1024)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "%s: n_layer = %d: must be 1..1024", fn,
                           c->n_layer);
    if (c->n_embd < 1 || c->n_embd > 65536)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "%s: n_embd = %d: must be 1..65536", fn,
                           c->n_embd);
    if (c->n_head < 1 || c->n_head > c->n_embd || c->n_embd % c->n_head != 0)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "%s: n_head = %d: must be at least 1 and divide n_embd = %d (head "
                           "size n_embd / n_head)",
                           fn, c->n_head, c->n_embd);
    if (c->vocab_size < 1 || c->vocab_size > (1 << 24))
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "%s: vocab_size = %d: must be 1..16777216",
                           fn, c->vocab_size);
    if (c->block_size < 1 || c->block_size > 65536)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "%s: block_size = %d: must be 1..65536", fn,
                           c->block_size);
    if (max_batch < 1 || (int64_t)max_batch * c->block_size > INT_MAX / 4)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "%s: max_batch = %d: must be at least 1, with max_batch * block_size "
                           "(%d) at most %d tokens",
                           fn, max_batch, c->block_size, INT_MAX / 4);
    return ZDP_OK;
}

/* Names and shapes in zdp.h's registration order. */
static void register_params_(gpt *m) {
    const int64_t C = m->cfg.n_embd;
    int k = 0;
#define ADD_(shape0, shape1, ...)                                                    \
    do {                                                                             \
        char *nm = m->names + (size_t)k * NAME_MAX_;                                 \
        snprintf(nm, NAME_MAX_, __VA_ARGS__);                                        \
        m->info[k] = (zdp_param_info){.name = nm, .ndim = (shape1) > 0 ? 2 : 1,      \
                                      .shape = {(shape0), (shape1) > 0 ? (shape1) : 0}}; \
        k++;                                                                         \
    } while (0)
    ADD_(m->cfg.vocab_size, C, "transformer.wte.weight");
    ADD_(m->cfg.block_size, C, "transformer.wpe.weight");
    for (int l = 0; l < m->cfg.n_layer; l++) {
        ADD_(C, 0, "transformer.h.%d.ln_1.weight", l);
        ADD_(C, 0, "transformer.h.%d.ln_1.bias", l);
        ADD_(C, 3 * C, "transformer.h.%d.attn.c_attn.weight", l);
        ADD_(3 * C, 0, "transformer.h.%d.attn.c_attn.bias", l);
        ADD_(C, C, "transformer.h.%d.attn.c_proj.weight", l);
        ADD_(C, 0, "transformer.h.%d.attn.c_proj.bias", l);
        ADD_(C, 0, "transformer.h.%d.ln_2.weight", l);
        ADD_(C, 0, "transformer.h.%d.ln_2.bias", l);
        ADD_(C, 4 * C, "transformer.h.%d.mlp.c_fc.weight", l);
        ADD_(4 * C, 0, "transformer.h.%d.mlp.c_fc.bias", l);
        ADD_(4 * C, C, "transformer.h.%d.mlp.c_proj.weight", l);
        ADD_(C, 0, "transformer.h.%d.mlp.c_proj.bias", l);
    }
    ADD_(C, 0, "transformer.ln_f.weight");
    ADD_(C, 0, "transformer.ln_f.bias");
#undef ADD_
}

zdp_status zdp_gpt_create(const zdp_gpt_config *cfg, int max_batch, zdp_model *out,
                          zdp_error *err) {
    if (out == NULL || cfg == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_gpt_create: cfg and out must be set");
    memset(out, 0, sizeof *out);
    zdp_status st = check_config_(cfg, max_batch, err);
    if (st != ZDP_OK) return st;
    gpt *m = calloc(1, sizeof *m);
    if (m == NULL) goto nomem;
    m->cfg = *cfg;
    m->max_batch = max_batch;
    const int64_t L = cfg->n_layer, C = cfg->n_embd, NH = cfg->n_head, V = cfg->vocab_size;
    const int64_t Tm = cfg->block_size, BT = (int64_t)max_batch * Tm;
    const int n_params = 2 + PER_LAYER * cfg->n_layer + 2;

    /* Slice one block; each slice starts on a 64-byte boundary. */
    struct { float **p; int64_t n; } slices[] = {
        {&m->dnorm, 2 * C},
        {&m->encoded, BT * C},      {&m->ln1, L * BT * C},         {&m->ln2, L * BT * C},
        {&m->ln1_mean, L * BT},     {&m->ln1_rstd, L * BT},        {&m->ln2_mean, L * BT},
        {&m->ln2_rstd, L * BT},     {&m->qkv, L * BT * 3 * C},     {&m->att, L * BT * NH * Tm},
        {&m->atty, L * BT * C},     {&m->res_mid, L * BT * C},     {&m->fch, L * BT * 4 * C},
        {&m->fch_gelu, L * BT * 4 * C}, {&m->res_out, L * BT * C}, {&m->lnf, BT * C},
        {&m->lnf_mean, BT},         {&m->lnf_rstd, BT},            {&m->probs, BT * V},
        {&m->proj, BT * C},         {&m->dres, BT * C},            {&m->dbuf, BT * C},
        {&m->dqkv, BT * 3 * C},     {&m->dfch, BT * 4 * C},        {&m->datt, zdp_pool_size() * Tm * Tm},
    };
    const int nslices = (int)(sizeof slices / sizeof slices[0]);
    int64_t total = 0;
    for (int i = 0; i < nslices; i++) total += (slices[i].n + 15) / 16 * 16;
    if ((uint64_t)total > SIZE_MAX / sizeof(float) / 2) goto nomem;
    m->mem = zdp_big_alloc((size_t)total * sizeof(float)); /* the activations: 2 MB pages */
    if (m->mem == NULL) goto nomem;
    memset(m->mem, 0, (size_t)total * sizeof(float));
    int64_t off = 0;
    for (int i = 0; i < nslices; i++) {
        *slices[i].p = m->mem + off;
        off += (slices[i].n + 15) / 16 * 16;
    }
    m->inputs = calloc((size_t)BT, sizeof(int32_t));
    m->targets = calloc((size_t)BT, sizeof(int32_t));
    m->weights = calloc((size_t)BT, sizeof(float));
    m->names = calloc((size_t)n_params, NAME_MAX_);
    m->info = calloc((size_t)n_params, sizeof *m->info);
    if (!m->inputs || !m->targets || !m->weights || !m->names || !m->info) goto nomem;
    register_params_(m);
    /* The shape checkpoints record: n_head shows in no tensor's shape. */
    snprintf(m->shape_json, sizeof m->shape_json,
             "{\"model\":\"gpt\",\"n_layer\":%d,\"n_head\":%d,\"n_embd\":%d,"
             "\"vocab_size\":%d,\"block_size\":%d}",
             cfg->n_layer, cfg->n_head, cfg->n_embd, cfg->vocab_size, cfg->block_size);
    *out = (zdp_model){.self = m, .ops = &gpt_ops_, .lm = &gpt_lm_ops_,
                       .vocab_size = cfg->vocab_size, .block_size = cfg->block_size,
                       .n_params = n_params, .params = m->info, .shape_json = m->shape_json,
                       .activation_bytes = total * (int64_t)sizeof(float)};
    return ZDP_OK;
nomem:
    out->self = m;
    out->ops = &gpt_ops_;
    zdp_gpt_destroy(out);
    memset(out, 0, sizeof *out); /* also when m itself could not be allocated */
    return zdp_err_set(err, ZDP_ERR_NOMEM,
                       "gpt create: out of memory for the activations of n_layer %d, n_embd %d, "
                       "vocab_size %d, block_size %d, max_batch %d; lower max_batch or "
                       "block_size",
                       cfg->n_layer, cfg->n_embd, cfg->vocab_size, cfg->block_size, max_batch);
}

void zdp_gpt_destroy(zdp_model *model) {
    gpt *m = gpt_of_(model);
    if (m == NULL) return;
    free(m->mem);
    free(m->inputs);
    free(m->targets);
    free(m->weights);
    free(m->names);
    free(m->info);
    free(m);
    memset(model, 0, sizeof *model);
}

/* Overwrites the last forward's weights (and makes it weighted) for its
 * backward.  The loss that forward returned is not recomputed: it stays the
 * loss under the forward's own weights. */
static zdp_status gpt_set_loss_weights_(void *self, const float *w, int64_t n,
                                        zdp_error *err) {
    gpt *m = self;
    return zdp_lm_reweight_(m->have_forward, m->fwd_ad == m->ad, m->B, m->T, w, n, m->weights,
                            &m->weighted, err);
}

const zdp_gpt_config *zdp_gpt_config_of(const zdp_model *model) {
    const gpt *m = gpt_of_(model);
    return m != NULL ? &m->cfg : NULL;
}

/* ---- initialisation ------------------------------------------------------------------ */

void zdp_gpt_init_params(const zdp_model *model, float *const *params, uint64_t seed) {
    const gpt *m = gpt_of_(model);
    if (m == NULL || params == NULL) return;
    const double std = 0.02, std_res = 0.02 / sqrt(2.0 * m->cfg.n_layer);
    uint64_t s = seed;
    for (int i = 0; i < model->n_params; i++) {
        const zdp_param_info *p = &model->params[i];
        const int64_t n = p->ndim == 2 ? p->shape[0] * p->shape[1] : p->shape[0];
        const int kind = i >= LAYER0_ && i < model->n_params - 2 ? (i - LAYER0_) % PER_LAYER : -1;
        const bool is_lnf_w = i == model->n_params - 2;
        if (kind == LN1_W || kind == LN2_W || is_lnf_w) {
            for (int64_t k = 0; k < n; k++) params[i][k] = 1.0f;
        } else if (p->ndim == 1) { /* biases */
            memset(params[i], 0, (size_t)n * sizeof(float));
        } else {
            const double sd = kind == APROJ_W || kind == FPROJ_W ? std_res : std;
            for (int64_t k = 0; k < n; k++) params[i][k] = (float)(sd * zdp_rand_normal(&s));
        }
    }
}

/* ---- inference ---------------------------------------------------------------------- */

static zdp_status gpt_next_logits_(void *self, zdp_param_source *src, const int32_t *tokens,
                                   int T, float *logits, zdp_error *err) {
    gpt *m = self;
    const char *fn = "zdp_lm_next_logits";
    zdp_status st = zdp_lm_check_ids_(tokens, 1, T, m->cfg.vocab_size, "tokens", fn, err);
    if (st != ZDP_OK) return st;
    m->have_forward = false; /* the activations are about to change */
    const float *x;
    if ((st = trunk_forward_(m, src, tokens, 1, T, &x, err)) != ZDP_OK) return st;
    return head_forward_(m, src, x + (int64_t)(T - 1) * m->cfg.n_embd, 1, logits, err);
}

static const zdp_lm_ops gpt_lm_ops_ = {.set_loss_weights = gpt_set_loss_weights_,
                                       .next_logits = gpt_next_logits_};

/* ---- adapters (adapter.h) ------------------------------------------------------------ */

int zdp_gpt_adapter_sites_(const zdp_model *base, zdp_adapter_site *sites, int cap,
                           int64_t *max_rows) {
    const gpt *m = gpt_of_(base);
    if (m == NULL) return -1;
    const int64_t C = m->cfg.n_embd;
    const int n = m->cfg.n_layer * SITES_PER_LAYER + 1;
    if (max_rows != NULL) *max_rows = (int64_t)m->max_batch * m->cfg.block_size;
    if (sites == NULL) return n;
    static const char *const names[SITES_PER_LAYER] = {"attn.c_attn", "attn.c_proj", "mlp.c_fc",
                                                       "mlp.c_proj"};
    const int widx[SITES_PER_LAYER] = {ATTN_W, APROJ_W, FC_W, FPROJ_W};
    const int64_t in[SITES_PER_LAYER] = {C, C, C, 4 * C};
    const int64_t out[SITES_PER_LAYER] = {3 * C, C, 4 * C, C};
    for (int i = 0; i < n && i < cap; i++) {
        zdp_adapter_site *s = &sites[i];
        if (i == n - 1) { /* the tied lm_head: the adapter sits on the output projection only */
            *s = (zdp_adapter_site){.in = C, .out = m->cfg.vocab_size, .group = ZDP_LORA_UNEMBED,
                                    .layer = -1, .weight = WTE_, .tied = 1};
            snprintf(s->module, sizeof s->module, "lm_head");
            continue;
        }
        const int l = i / SITES_PER_LAYER, k = i % SITES_PER_LAYER;
        *s = (zdp_adapter_site){.in = in[k], .out = out[k],
                                .group = k <= S_APROJ ? ZDP_LORA_ATTN : ZDP_LORA_MLP, .layer = l,
                                .weight = LAYER0_ + PER_LAYER * l + widx[k], .conv1d = 1};
        snprintf(s->module, sizeof s->module, "transformer.h.%d.%s", l, names[k]);
    }
    return n;
}

int zdp_gpt_adapter_attach_(const zdp_model *base, const zdp_adapter *ad) {
    gpt *m = gpt_of_(base);
    if (m == NULL) return -1;
    m->ad = ad;
    return 0;
}

/* ---- the decode step (decode.h) ------------------------------------------------------ */

/* The forward above for a decode pass's rows, each at its own position, with
 * the cache's products and attention (src/sample/decode.c). */
static void gpt_decode_trunk_(const void *self, zdp_decode_pass *p) {
    const gpt *m = self;
    const float *const *P = p->P;
    const int64_t N = p->n, C = m->cfg.n_embd, F = 4 * C;
    for (int64_t i = 0; i < N; i++) { /* wte[token] + wpe[position] */
        const float *e = P[WTE_] + (int64_t)p->tokens[i] * C;
        const float *pe = P[WPE_] + (int64_t)p->pos[i] * C;
        float *x = p->x + i * C;
        for (int64_t j = 0; j < C; j++) x[j] = e[j] + pe[j];
    }
    for (int l = 0; l < m->cfg.n_layer; l++) {
        const int p0 = LAYER0_ + PER_LAYER * l, s0 = l * SITES_PER_LAYER;
        zdp_nn_layernorm_forward(p->h, p->mean, p->rstd, p->x, P[p0 + LN1_W], P[p0 + LN1_B], N, C);
        p->conv1d(p->ctx, p->qkv, p->h, p0 + ATTN_W, P[p0 + ATTN_B], N, C, 3 * C);
        p->adapt(p->ctx, s0 + S_ATTN, p->qkv, p->h, N, 0);
        p->attend(p->ctx, l, p->qkv, 3 * C, p->qkv + C, p->qkv + 2 * C, 3 * C);
        p->conv1d(p->ctx, p->h, p->atty, p0 + APROJ_W, P[p0 + APROJ_B], N, C, C);
        p->adapt(p->ctx, s0 + S_APROJ, p->h, p->atty, N, 0);
        zdp_nn_residual_forward(p->x, p->x, p->h, N * C);
        zdp_nn_layernorm_forward(p->h, p->mean, p->rstd, p->x, P[p0 + LN2_W], P[p0 + LN2_B], N, C);
        p->conv1d(p->ctx, p->f1, p->h, p0 + FC_W, P[p0 + FC_B], N, C, F);
        p->adapt(p->ctx, s0 + S_FC, p->f1, p->h, N, 0);
        zdp_nn_gelu_forward(p->f1, p->f1, N * F);
        p->conv1d(p->ctx, p->h, p->f1, p0 + FPROJ_W, P[p0 + FPROJ_B], N, F, C);
        p->adapt(p->ctx, s0 + S_FPROJ, p->h, p->f1, N, 0);
        zdp_nn_residual_forward(p->x, p->x, p->h, N * C);
    }
}

/* ln_f and the tied lm_head (wte as a (V, C) linear) on x's first m rows. */
static void gpt_decode_head_(const void *self, zdp_decode_pass *p, int64_t m_rows, float *logits) {
    const gpt *m = self;
    const float *const *P = p->P;
    const int64_t C = m->cfg.n_embd;
    const int lnf = LAYER0_ + PER_LAYER * m->cfg.n_layer;
    zdp_nn_layernorm_forward(p->h, p->mean, p->rstd, p->x, P[lnf], P[lnf + 1], m_rows, C);
    p->linear(p->ctx, logits, p->h, WTE_, NULL, m_rows, C, m->cfg.vocab_size, 0);
    p->adapt(p->ctx, m->cfg.n_layer * SITES_PER_LAYER, logits, p->h, m_rows, 1);
}

const zdp_decode_ops *zdp_gpt_decode_ops_(const zdp_model *model, const void **self) {
    static const zdp_decode_ops ops = {.trunk = gpt_decode_trunk_, .head = gpt_decode_head_};
    const gpt *m = gpt_of_(model);
    if (m == NULL) return NULL;
    *self = m;
    return &ops;
}
