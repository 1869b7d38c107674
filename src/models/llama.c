/*
 * llama.c -- the Llama family (zdp/llama.h: Llama 3, SmolLM2, Qwen3) on the
 * nn/ kernels.
 *
 *   x = embed_tokens[inputs]
 *   per layer:  h = rmsnorm(x);  q, k, v = q_proj(h), k_proj(h), v_proj(h)
 *               (Qwen3: q, k = q_norm(q), k_norm(k) per head);  q, k = rope(q, k)
 *               x = x + o_proj(causal GQA attention(q, k, v))
 *               h2 = rmsnorm(x);  x = x + down_proj(silu(gate_proj(h2)) * up_proj(h2))
 *   logits = lm_head(rmsnorm(x));  loss = weighted mean cross-entropy (zdp_lm_batch)
 *
 * Parameters are registered in zdp/llama.h's order with transformers' names
 * and [out, in] layouts.  Activations for max_batch x block_size tokens are
 * allocated once at create (one block, owned here, not counted by the
 * engine; zdp_model.activation_bytes reports its size); forward keeps every
 * layer's activations for backward.  The rotary tables (cos, sin of
 * position * inv_freq) are computed once at create, in double.
 *
 * Backward and the grad sink: tensors are acquired when they first get a
 * gradient and released as soon as they get no more: lm_head (or the tied
 * embed_tokens' first contribution), norm, then layers L-1 down to 0 (down,
 * up, gate, post_attention_layernorm, o_proj, q_norm/k_norm, v, k, q
 * projections, input_layernorm: the order their gradients complete), and
 * embed_tokens last.  A tied embed_tokens gets lm_head's gradient first and
 * the embedding's at the very end, so it stays acquired through the whole
 * backward.  With adapters attached (adapter.h, lora.c) the same code runs
 * frozen: each projection and the lm_head hand their output to the adapter
 * in forward and their output gradient in backward, no base tensor is
 * acquired, no dW is computed, and backward stops below the lowest adapted
 * block.  Not here: config.json (src/io/hf_config.c), parallelism (the engine).
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
#include "zdp/llama.h"

#define NAME_MAX_ 64
#define EMBED_ 0
#define LAYER0_ 1
/* Adapter sites (adapter.h): per block q, k, v, o, gate, up, down; lm_head last. */
enum { S_Q, S_K, S_V, S_O, S_GATE, S_UP, S_DOWN, SITES_PER_LAYER };

/* Offsets of one layer's tensors from its first, in registration order;
 * -1 for a tensor this config does not have. */
typedef struct layer_idx {
    int in_ln, q_w, q_b, k_w, k_b, v_w, v_b, o_w, o_b, q_norm, k_norm, post_ln, gate, up, down;
    int n; /* tensors per layer */
} layer_idx;

typedef struct llama {
    zdp_llama_config cfg;
    layer_idx li;
    int norm, lm_head;  /* model.norm.weight; lm_head.weight (EMBED_ when tied) */
    int max_batch;
    int B, T;           /* shape of the last forward */
    bool have_forward;  /* backward may run (forward's activations are intact) */
    int32_t *inputs;    /* (max_batch, block_size) copies of the last batch */
    int32_t *targets;
    float *weights;     /* (max_batch*block_size) per-position loss weights of the last forward */
    bool weighted;      /* the last forward had weights */
    char shape_json[320]; /* zdp_model.shape_json */
    const zdp_adapter *ad;     /* attached adapters (adapter.h), or NULL: plain training */
    const zdp_adapter *fwd_ad; /* the adapters the last forward ran with */

    /* Activations: one allocation, sliced below.  Per-layer arrays hold L
     * slices of max_batch*block_size rows; a forward with B, T uses the first
     * B*T rows of each slice.  QD = NH*hd, KD = KV*hd. */
    float *mem;
    float *cos, *sin;         /* (block_size, hd/2) rotary tables */
    float *encoded;           /* (BT, H) the embedding: layer 0's input */
    float *ln1, *ln2;         /* (L, BT, H) RMSNorm outputs */
    float *ln1_rstd, *ln2_rstd; /* (L, BT) */
    float *q, *k, *v;         /* (L, BT, QD), (L, BT, KD), (L, BT, KD) projections (q, k before norm and rope) */
    float *qr, *kr;           /* (L, BT, QD), (L, BT, KD) q, k after q/k norm and rope */
    float *q_rstd, *k_rstd;   /* (L, BT*NH), (L, BT*KV) q/k norm (qk_norm only) */
    float *att;               /* (L, B, NH, T, T) attention probabilities */
    float *atty;              /* (L, BT, QD) attention output, before o_proj */
    float *res_mid;           /* (L, BT, H) x + attention */
    float *gate, *up;         /* (L, BT, F) */
    float *act;               /* (L, BT, F) silu(gate) * up */
    float *res_out;           /* (L, BT, H) the layer's output */
    float *lnf;               /* (BT, H) */
    float *lnf_rstd;          /* (BT) */
    float *probs;             /* (BT, V) softmax; backward turns it into dlogits */
    /* Backward scratch. */
    float *dres;              /* (BT, H) gradient of the residual stream */
    float *dnorm;             /* (max(H, hd)) a frozen norm weight's discarded gradient */
    float *dbuf;              /* (BT, H) gradient of a norm output */
    float *dq, *dk, *dv;      /* (BT, QD), (BT, KD), (BT, KD) */
    float *dqn, *dkn;         /* (BT, QD), (BT, KD) gradients before the q/k norm (qk_norm only) */
    float *datty;             /* (BT, QD) */
    float *dgate, *dup;       /* (BT, F) */
    float *datt;              /* (threads, T, T) attention scratch, one per pool thread */

    char *names;          /* n_params * NAME_MAX_ */
    zdp_param_info *info; /* (n_params) */
} llama;

static const zdp_model_ops llama_ops_;
static const zdp_lm_ops llama_lm_ops_;

static llama *llama_of_(const zdp_model *model) {
    return model != NULL && model->ops == &llama_ops_ ? model->self : NULL;
}

static const char *arch_name_(zdp_llama_arch a) { return a == ZDP_ARCH_QWEN3 ? "qwen3" : "llama"; }

/* ---- forward ------------------------------------------------------------------------ */

/* out (N, site's out) += the attached adapter's product of inp; nothing without adapters. */
static void hook_fwd_(const llama *m, int site, float *out, const float *inp, int64_t N) {
    if (m->ad != NULL) m->ad->forward(m->ad->ctx, site, out, inp, N);
}

/* Embedding and every block on inputs (B,T), each fetched from the param
 * source while it computes; *out: the last residual (B*T, H). */
static zdp_status trunk_forward_(llama *m, zdp_param_source *src, const int32_t *inputs, int B,
                                 int T, const float **out, zdp_error *err) {
    const zdp_llama_config *c = &m->cfg;
    const int64_t H = c->hidden, NH = c->n_head, KV = c->n_kv_head, hd = c->head_dim;
    const int64_t F = c->ffn, QD = NH * hd, KD = KV * hd, N = (int64_t)B * T;
    const int64_t rows = (int64_t)m->max_batch * c->block_size;
    const int64_t att_slice = (int64_t)m->max_batch * NH * c->block_size * c->block_size;
    const float eps = c->rms_norm_eps;
    const layer_idx *li = &m->li;
    const float *const *P;
    zdp_status st = zdp_param_fetch(src, EMBED_, 1, &P, err);
    if (st != ZDP_OK) return st;
    zdp_nn_token_embedding_forward(m->encoded, inputs, P[EMBED_], N, H);
    zdp_param_release(src, EMBED_, 1);
    const float *x = m->encoded;
    for (int l = 0; l < c->n_layer; l++) {
        const int p0 = LAYER0_ + li->n * l;
        if ((st = zdp_param_fetch(src, p0, li->n, &P, err)) != ZDP_OK) return st;
        const float *const *lp = P + p0;
        const int64_t r = l * rows;
#define B_(idx) ((idx) >= 0 ? lp[idx] : NULL)
        float *ln1 = m->ln1 + r * H, *q = m->q + r * QD, *k = m->k + r * KD, *v = m->v + r * KD;
        float *qr = m->qr + r * QD, *kr = m->kr + r * KD, *atty = m->atty + r * QD;
        float *res_mid = m->res_mid + r * H, *ln2 = m->ln2 + r * H, *res_out = m->res_out + r * H;
        float *gate = m->gate + r * F, *up = m->up + r * F, *act = m->act + r * F;
        zdp_nn_rmsnorm_forward(ln1, m->ln1_rstd + r, x, lp[li->in_ln], N, H, eps);
        const int s0 = l * SITES_PER_LAYER;
        {
            float *const o3[3] = {q, k, v};
            const float *const w3[3] = {lp[li->q_w], lp[li->k_w], lp[li->v_w]};
            const float *const b3[3] = {B_(li->q_b), B_(li->k_b), B_(li->v_b)};
            const int64_t oc3[3] = {QD, KD, KD};
            zdp_nn_linear_forward_shared(3, o3, ln1, w3, b3, oc3, N, H);
        }
        hook_fwd_(m, s0 + S_Q, q, ln1, N);
        hook_fwd_(m, s0 + S_K, k, ln1, N);
        hook_fwd_(m, s0 + S_V, v, ln1, N);
        if (c->qk_norm) {
            /* q (N, NH, hd) is N*NH rows of hd: the per-head norm is a plain RMSNorm. */
            zdp_nn_rmsnorm_forward(qr, m->q_rstd + r * NH, q, lp[li->q_norm], N * NH, hd, eps);
            zdp_nn_rmsnorm_forward(kr, m->k_rstd + r * KV, k, lp[li->k_norm], N * KV, hd, eps);
            zdp_nn_rope_forward(qr, qr, m->cos, m->sin, B, T, NH, hd);
            zdp_nn_rope_forward(kr, kr, m->cos, m->sin, B, T, KV, hd);
        } else {
            zdp_nn_rope_forward(qr, q, m->cos, m->sin, B, T, NH, hd);
            zdp_nn_rope_forward(kr, k, m->cos, m->sin, B, T, KV, hd);
        }
        zdp_nn_gqa_attention_forward(atty, m->att + l * att_slice, qr, kr, v, B, T, NH, KV, hd);
        /* res_mid = x + o_proj(atty): the residual is copied in and the
         * projection added on top. */
        memcpy(res_mid, x, (size_t)(N * H) * sizeof(float));
        zdp_nn_linear_forward(res_mid, atty, lp[li->o_w], B_(li->o_b), N, QD, H, 1);
        hook_fwd_(m, s0 + S_O, res_mid, atty, N);
        zdp_nn_rmsnorm_forward(ln2, m->ln2_rstd + r, res_mid, lp[li->post_ln], N, H, eps);
        {
            float *const o2[2] = {gate, up};
            const float *const w2[2] = {lp[li->gate], lp[li->up]};
            const int64_t oc2[2] = {F, F};
            zdp_nn_linear_forward_shared(2, o2, ln2, w2, NULL, oc2, N, H);
        }
        hook_fwd_(m, s0 + S_GATE, gate, ln2, N);
        hook_fwd_(m, s0 + S_UP, up, ln2, N);
        zdp_nn_swiglu_forward(act, gate, up, N * F);
        memcpy(res_out, res_mid, (size_t)(N * H) * sizeof(float));
        zdp_nn_linear_forward(res_out, act, lp[li->down], NULL, N, F, H, 1);
        hook_fwd_(m, s0 + S_DOWN, res_out, act, N);
#undef B_
        zdp_param_release(src, p0, li->n);
        x = res_out;
    }
    *out = x;
    return ZDP_OK;
}

/* The final norm on the last residual rows x (n, H), then lm_head into out (n, V). */
static zdp_status head_forward_(llama *m, zdp_param_source *src, const float *x, int64_t n,
                                float *out, zdp_error *err) {
    const int64_t H = m->cfg.hidden, V = m->cfg.vocab_size;
    const float *const *P;
    zdp_status st = zdp_param_fetch(src, m->norm, 1, &P, err);
    if (st != ZDP_OK) return st;
    zdp_nn_rmsnorm_forward(m->lnf, m->lnf_rstd, x, P[m->norm], n, H, m->cfg.rms_norm_eps);
    zdp_param_release(src, m->norm, 1);
    if ((st = zdp_param_fetch(src, m->lm_head, 1, &P, err)) != ZDP_OK) return st;
    zdp_nn_lmhead_forward(out, m->lnf, P[m->lm_head], n, H, V);
    zdp_param_release(src, m->lm_head, 1);
    hook_fwd_(m, m->cfg.n_layer * SITES_PER_LAYER, out, m->lnf, n);
    return ZDP_OK;
}

static zdp_status llama_forward_(void *self, zdp_param_source *src, const void *batch_v,
                                 float *loss, zdp_error *err) {
    llama *m = self;
    const zdp_lm_batch *batch = batch_v;
    const char *fn = "llama forward";
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

/* The gradient buffer of tensor i (i < 0: none, NULL without error). */
static zdp_status acquire_(zdp_grad_sink *sink, const llama *m, int i, float **g, zdp_error *err) {
    *g = NULL;
    if (i < 0 || m->ad != NULL) return ZDP_OK; /* adapters attached: the base is frozen */
    *g = zdp_grad_acquire(sink, i);
    if (*g == NULL)
        return zdp_err_set(err, ZDP_ERR_INTERNAL,
                           "llama backward: the grad sink refused %s (index %d)", m->info[i].name,
                           i);
    return ZDP_OK;
}

static void release_(zdp_grad_sink *sink, const llama *m, int i) {
    if (i >= 0 && m->ad == NULL) zdp_grad_release(sink, i);
}

/* Backward of y = linear(inp) for tensors w, b (b < 0: no bias) at adapter
 * site `site`: acquires, adds the gradients, releases (with adapters: the
 * input gradient and the adapter's).  dinp (N,C) += dout @ W, or = when
 * flags has ZDP_NN_SET_DINP (the first product into a buffer: no memset). */
static zdp_status linear_bwd_(zdp_grad_sink *sink, const llama *m, const float *const *params,
                              int w, int b, int site, float *dinp, const float *dout,
                              const float *inp, int64_t N, int64_t C, int64_t OC, int flags,
                              zdp_error *err) {
    float *dw, *db;
    zdp_status st = acquire_(sink, m, w, &dw, err);
    if (st == ZDP_OK) st = acquire_(sink, m, b, &db, err);
    if (st != ZDP_OK) return st;
    zdp_nn_linear_backward(dinp, dw, db, dout, inp, params[w], N, C, OC, flags);
    release_(sink, m, b);
    release_(sink, m, w);
    return m->ad != NULL ? m->ad->backward(m->ad->ctx, site, dinp, dout, inp, N, sink, err)
                         : ZDP_OK;
}

/* Backward of an RMSNorm with weight tensor w: dinp (N,C) += ... */
static zdp_status rmsnorm_bwd_(zdp_grad_sink *sink, const llama *m, const float *const *params,
                               int w, float *dinp, const float *dout, const float *inp,
                               const float *rstd, int64_t N, int64_t C, zdp_error *err) {
    float *dw;
    zdp_status st = acquire_(sink, m, w, &dw, err);
    if (st != ZDP_OK) return st;
    if (dw == NULL) { /* frozen: the kernel always adds a weight gradient; discard it */
        dw = m->dnorm;
        memset(dw, 0, (size_t)C * sizeof(float));
    }
    zdp_nn_rmsnorm_backward(dinp, dw, dout, inp, params[w], rstd, N, C);
    release_(sink, m, w);
    return ZDP_OK;
}

static zdp_status llama_backward_(void *self, zdp_param_source *src, float dloss,
                                  zdp_grad_sink *sink, zdp_error *err) {
    llama *m = self;
    const zdp_status ready =
        zdp_lm_check_backward_("llama", m->have_forward, m->fwd_ad == m->ad, err);
    if (ready != ZDP_OK) return ready;
    /* Backward turns probs into dlogits in place: one backward per forward. */
    m->have_forward = false;
    const zdp_llama_config *c = &m->cfg;
    const int B = m->B, T = m->T, L = c->n_layer;
    const int64_t H = c->hidden, NH = c->n_head, KV = c->n_kv_head, hd = c->head_dim;
    const int64_t F = c->ffn, V = c->vocab_size, QD = NH * hd, KD = KV * hd;
    const int64_t N = (int64_t)B * T;
    const int64_t rows = (int64_t)m->max_batch * c->block_size;
    const int64_t att_slice = (int64_t)m->max_batch * NH * c->block_size * c->block_size;
    const layer_idx *li = &m->li;
    const bool tied = c->tie_word_embeddings != 0;
    float *dembed = NULL, *dhead = NULL;
    const float *const *params;
    zdp_status st;

    /* Loss and lm_head (the tied embed_tokens' first contribution: it stays acquired). */
    zdp_nn_softmax_crossentropy_backward(m->probs, m->probs, m->targets,
                                         m->weighted ? m->weights : NULL, dloss, N, V);
    if ((st = acquire_(sink, m, m->lm_head, &dhead, err)) != ZDP_OK ||
        (st = zdp_param_fetch(src, m->lm_head, 1, &params, err)) != ZDP_OK)
        return st;
    zdp_nn_lmhead_backward(m->dbuf, dhead, m->probs, m->lnf, params[m->lm_head], N, H, V);
    zdp_param_release(src, m->lm_head, 1);
    if (tied) dembed = dhead;
    else release_(sink, m, m->lm_head);
    if (m->ad != NULL && (st = m->ad->backward(m->ad->ctx, L * SITES_PER_LAYER, m->dbuf, m->probs,
                                               m->lnf, N, sink, err)) != ZDP_OK)
        return st;

    /* norm: the residual stream's gradient starts here. */
    const float *x_last = m->res_out + (int64_t)(L - 1) * rows * H; /* L >= 1 */
    memset(m->dres, 0, (size_t)(N * H) * sizeof(float));
    if ((st = zdp_param_fetch(src, m->norm, 1, &params, err)) != ZDP_OK ||
        (st = rmsnorm_bwd_(sink, m, params, m->norm, m->dres, m->dbuf, x_last, m->lnf_rstd, N, H,
                           err)) != ZDP_OK)
        return st;
    zdp_param_release(src, m->norm, 1);

    /* Blocks, last first.  The residual adds pass dres through unchanged, so
     * one buffer carries the residual stream's gradient and the norm
     * backwards add into it. */
    const int lowest = m->ad != NULL ? m->ad->lowest_layer : 0;
    for (int l = L - 1; l >= lowest; l--) {
        const int p0 = LAYER0_ + li->n * l;
        const int s0 = l * SITES_PER_LAYER;
        const int64_t r = l * rows;
        const float *x_in = l > 0 ? m->res_out + (r - rows) * H : m->encoded;
        if ((st = zdp_param_fetch(src, p0, li->n, &params, err)) != ZDP_OK) return st;
#define I_(idx) ((idx) >= 0 ? p0 + (idx) : -1)
        /* MLP: down, then silu(gate) * up, then gate and up into dbuf. */
        /* d act = dres @ down, stored (the first product into dgate: no
         * memset; an adapter's backward adds after it). */
        if ((st = linear_bwd_(sink, m, params, I_(li->down), -1, s0 + S_DOWN, m->dgate, m->dres,
                              m->act + r * F, N, F, H, ZDP_NN_SET_DINP, err)) != ZDP_OK)
            return st;
        zdp_nn_swiglu_backward(m->dgate, m->dup, m->dgate, m->gate + r * F, m->up + r * F, N * F);
        if ((st = linear_bwd_(sink, m, params, I_(li->up), -1, s0 + S_UP, m->dbuf, m->dup, m->ln2 + r * H, N,
                              H, F, ZDP_NN_SET_DINP, err)) != ZDP_OK ||
            (st = linear_bwd_(sink, m, params, I_(li->gate), -1, s0 + S_GATE, m->dbuf, m->dgate,
                              m->ln2 + r * H, N, H, F, 0, err)) != ZDP_OK ||
            (st = rmsnorm_bwd_(sink, m, params, I_(li->post_ln), m->dres, m->dbuf,
                               m->res_mid + r * H, m->ln2_rstd + r, N, H, err)) != ZDP_OK)
            return st;

        /* Attention: o_proj, the attention itself, rope and q/k norm, then q, k, v. */
        if ((st = linear_bwd_(sink, m, params, I_(li->o_w), I_(li->o_b), s0 + S_O, m->datty, m->dres,
                              m->atty + r * QD, N, QD, H, ZDP_NN_SET_DINP, err)) != ZDP_OK)
            return st;
        zdp_nn_gqa_attention_backward(m->dq, m->dk, m->dv, m->datt, m->datty, m->qr + r * QD,
                                      m->kr + r * KD, m->v + r * KD, m->att + l * att_slice, B,
                                      T, NH, KV, hd);
        zdp_nn_rope_backward(m->dq, m->dq, m->cos, m->sin, B, T, NH, hd);
        zdp_nn_rope_backward(m->dk, m->dk, m->cos, m->sin, B, T, KV, hd);
        float *dq = m->dq, *dk = m->dk;
        if (c->qk_norm) {
            memset(m->dqn, 0, (size_t)(N * QD) * sizeof(float));
            memset(m->dkn, 0, (size_t)(N * KD) * sizeof(float));
            if ((st = rmsnorm_bwd_(sink, m, params, I_(li->k_norm), m->dkn, m->dk, m->k + r * KD,
                                   m->k_rstd + r * KV, N * KV, hd, err)) != ZDP_OK ||
                (st = rmsnorm_bwd_(sink, m, params, I_(li->q_norm), m->dqn, m->dq, m->q + r * QD,
                                   m->q_rstd + r * NH, N * NH, hd, err)) != ZDP_OK)
                return st;
            dq = m->dqn;
            dk = m->dkn;
        }
        const float *ln1 = m->ln1 + r * H;
        if ((st = linear_bwd_(sink, m, params, I_(li->v_w), I_(li->v_b), s0 + S_V, m->dbuf, m->dv, ln1, N,
                              H, KD, ZDP_NN_SET_DINP, err)) != ZDP_OK ||
            (st = linear_bwd_(sink, m, params, I_(li->k_w), I_(li->k_b), s0 + S_K, m->dbuf, dk, ln1, N, H,
                              KD, 0, err)) != ZDP_OK ||
            (st = linear_bwd_(sink, m, params, I_(li->q_w), I_(li->q_b), s0 + S_Q, m->dbuf, dq, ln1, N, H,
                              QD, 0, err)) != ZDP_OK ||
            (st = rmsnorm_bwd_(sink, m, params, I_(li->in_ln), m->dres, m->dbuf, x_in,
                               m->ln1_rstd + r, N, H, err)) != ZDP_OK)
            return st;
#undef I_
        zdp_param_release(src, p0, li->n);
    }

    /* embed_tokens: the embedding's contribution (the tied one's second), and it is done. */
    if (m->ad != NULL) return ZDP_OK; /* frozen: nothing below the first block to train */
    if (!tied && (st = acquire_(sink, m, EMBED_, &dembed, err)) != ZDP_OK) return st;
    zdp_nn_token_embedding_backward(dembed, m->dres, m->inputs, N, H);
    release_(sink, m, EMBED_);
    return ZDP_OK;
}

static const zdp_model_ops llama_ops_ = {.forward = llama_forward_, .backward = llama_backward_};

/* ---- create / destroy ------------------------------------------------------------------ */

static zdp_status check_range_(const char *key, int v, int lo, int hi, const char *why,
                               zdp_error *err) {
    if (v < lo || v > hi)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "llama create: %s = %d: must be %d..%d%s",
                           key, v, lo, hi, why);
    return ZDP_OK;
}

static zdp_status check_config_(const zdp_llama_config *c, int max_batch, zdp_error *err) {
    const char *fn = "llama create";
    zdp_status st;
    if (c->arch != ZDP_ARCH_LLAMA && c->arch != ZDP_ARCH_QWEN3)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "%s: arch = %d: must be ZDP_ARCH_LLAMA (0) or ZDP_ARCH_QWEN3 (1)", fn,
                           (int)c->arch);
    if ((st = check_range_("n_layer", c->n_layer, 1, 1024, "", err)) != ZDP_OK ||
        (st = check_range_("hidden", c->hidden, 1, 65536, "", err)) != ZDP_OK ||
        (st = check_range_("n_head", c->n_head, 1, 1024, "", err)) != ZDP_OK ||
        (st = check_range_("n_kv_head", c->n_kv_head, 1, c->n_head,
                           " (at most n_head: grouped-query attention shares each KV head among "
                           "n_head / n_kv_head query heads)",
                           err)) != ZDP_OK)
        return st;
    if (c->n_head % c->n_kv_head != 0)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "%s: n_kv_head = %d: must divide n_head = %d (each KV head serves "
                           "n_head / n_kv_head query heads)",
                           fn, c->n_kv_head, c->n_head);
    if ((st = check_range_("head_dim", c->head_dim, 2, 4096, "", err)) != ZDP_OK) return st;
    if (c->head_dim % 2 != 0)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "%s: head_dim = %d: must be even (rotary embeddings rotate pairs of "
                           "channels)",
                           fn, c->head_dim);
    if ((int64_t)c->n_head * c->head_dim > 1 << 20)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "%s: n_head * head_dim = %lld: must be at most %d", fn,
                           (long long)c->n_head * c->head_dim, 1 << 20);
    if ((st = check_range_("ffn", c->ffn, 1, 1 << 20, "", err)) != ZDP_OK ||
        (st = check_range_("vocab_size", c->vocab_size, 1, 1 << 24, "", err)) != ZDP_OK ||
        (st = check_range_("max_position_embeddings", c->max_position_embeddings, 1, INT_MAX, "",
                           err)) != ZDP_OK ||
        (st = check_range_("block_size", c->block_size, 1,
                           c->max_position_embeddings < 65536 ? c->max_position_embeddings
                                                              : 65536,
                           " (at most max_position_embeddings and 65536)", err)) != ZDP_OK)
        return st;
    if (!(c->rms_norm_eps > 0.0f) || !isfinite(c->rms_norm_eps))
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "%s: rms_norm_eps = %g: must be finite and > 0 (1e-5 or 1e-6 in "
                           "released models)",
                           fn, (double)c->rms_norm_eps);
    if (!(c->rope_theta > 0.0) || !isfinite(c->rope_theta))
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "%s: rope_theta = %g: must be finite and > 0 (10000, 500000, ...)", fn,
                           c->rope_theta);
    if (c->rope_type != ZDP_ROPE_DEFAULT && c->rope_type != ZDP_ROPE_LINEAR &&
        c->rope_type != ZDP_ROPE_LLAMA3)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "%s: rope_type = %d: must be ZDP_ROPE_DEFAULT, ZDP_ROPE_LINEAR or "
                           "ZDP_ROPE_LLAMA3",
                           fn, (int)c->rope_type);
    if (c->rope_type != ZDP_ROPE_DEFAULT && (!(c->rope_factor > 0.0) || !isfinite(c->rope_factor)))
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "%s: rope_factor = %g: must be finite and > 0 for %s rope scaling", fn,
                           c->rope_factor, c->rope_type == ZDP_ROPE_LINEAR ? "linear" : "llama3");
    if (c->rope_type == ZDP_ROPE_LLAMA3) {
        if (!(c->rope_low_freq_factor > 0.0) || !isfinite(c->rope_low_freq_factor))
            return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                               "%s: rope_low_freq_factor = %g: must be finite and > 0 (llama3 "
                               "rope scaling; 1 in Llama 3.1)",
                               fn, c->rope_low_freq_factor);
        if (!(c->rope_high_freq_factor > c->rope_low_freq_factor) ||
            !isfinite(c->rope_high_freq_factor))
            return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                               "%s: rope_high_freq_factor = %g: must be finite and greater than "
                               "rope_low_freq_factor = %g (llama3 rope scaling; 4 in Llama 3.1)",
                               fn, c->rope_high_freq_factor, c->rope_low_freq_factor);
        if (c->rope_original_max_position < 1)
            return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                               "%s: rope_original_max_position = %d: must be >= 1 (llama3 rope "
                               "scaling's original_max_position_embeddings; 8192 in Llama 3.1)",
                               fn, c->rope_original_max_position);
    }
    if (c->qk_norm != (c->arch == ZDP_ARCH_QWEN3))
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "%s: qk_norm = %d with arch %s: Qwen3 has q_norm/k_norm and Llama "
                           "does not; set qk_norm = %d",
                           fn, c->qk_norm, arch_name_(c->arch), c->arch == ZDP_ARCH_QWEN3);
    if ((st = check_range_("attention_bias", c->attention_bias, 0, 1, " (a flag)", err)) !=
            ZDP_OK ||
        (st = check_range_("tie_word_embeddings", c->tie_word_embeddings, 0, 1, " (a flag)",
                           err)) != ZDP_OK)
        return st;
    if (!(c->initializer_range >= 0.0) || !isfinite(c->initializer_range))
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "%s: initializer_range = %g: must be finite and >= 0 (0.02 in "
                           "released models)",
                           fn, c->initializer_range);
    if (max_batch < 1 || (int64_t)max_batch * c->block_size > INT_MAX / 4)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "%s: max_batch = %d: must be at least 1, with max_batch * block_size "
                           "(%d) at most %d tokens",
                           fn, max_batch, c->block_size, INT_MAX / 4);
    return ZDP_OK;
}

/* Where each of a layer's tensors sits, for this config's optional ones. */
static layer_idx layer_layout_(const zdp_llama_config *c) {
    layer_idx li;
    int k = 0;
    const bool b = c->attention_bias != 0;
    li.in_ln = k++;
    li.q_w = k++;
    li.q_b = b ? k++ : -1;
    li.k_w = k++;
    li.k_b = b ? k++ : -1;
    li.v_w = k++;
    li.v_b = b ? k++ : -1;
    li.o_w = k++;
    li.o_b = b ? k++ : -1;
    li.q_norm = c->qk_norm ? k++ : -1;
    li.k_norm = c->qk_norm ? k++ : -1;
    li.post_ln = k++;
    li.gate = k++;
    li.up = k++;
    li.down = k++;
    li.n = k;
    return li;
}

/* Names and shapes in zdp/llama.h's registration order. */
static void register_params_(llama *m) {
    const zdp_llama_config *c = &m->cfg;
    const int64_t H = c->hidden, QD = (int64_t)c->n_head * c->head_dim;
    const int64_t KD = (int64_t)c->n_kv_head * c->head_dim, hd = c->head_dim, F = c->ffn;
    int k = 0;
#define ADD_(shape0, shape1, ...)                                                    \
    do {                                                                             \
        char *nm = m->names + (size_t)k * NAME_MAX_;                                 \
        snprintf(nm, NAME_MAX_, __VA_ARGS__);                                        \
        m->info[k] = (zdp_param_info){.name = nm, .ndim = (shape1) > 0 ? 2 : 1,      \
                                      .shape = {(shape0), (shape1) > 0 ? (shape1) : 0}}; \
        k++;                                                                         \
    } while (0)
    ADD_(c->vocab_size, H, "model.embed_tokens.weight");
    for (int l = 0; l < c->n_layer; l++) {
        const char *p = "model.layers";
        ADD_(H, 0, "%s.%d.input_layernorm.weight", p, l);
        ADD_(QD, H, "%s.%d.self_attn.q_proj.weight", p, l);
        if (c->attention_bias) ADD_(QD, 0, "%s.%d.self_attn.q_proj.bias", p, l);
        ADD_(KD, H, "%s.%d.self_attn.k_proj.weight", p, l);
        if (c->attention_bias) ADD_(KD, 0, "%s.%d.self_attn.k_proj.bias", p, l);
        ADD_(KD, H, "%s.%d.self_attn.v_proj.weight", p, l);
        if (c->attention_bias) ADD_(KD, 0, "%s.%d.self_attn.v_proj.bias", p, l);
        ADD_(H, QD, "%s.%d.self_attn.o_proj.weight", p, l);
        if (c->attention_bias) ADD_(H, 0, "%s.%d.self_attn.o_proj.bias", p, l);
        if (c->qk_norm) {
            ADD_(hd, 0, "%s.%d.self_attn.q_norm.weight", p, l);
            ADD_(hd, 0, "%s.%d.self_attn.k_norm.weight", p, l);
        }
        ADD_(H, 0, "%s.%d.post_attention_layernorm.weight", p, l);
        ADD_(F, H, "%s.%d.mlp.gate_proj.weight", p, l);
        ADD_(F, H, "%s.%d.mlp.up_proj.weight", p, l);
        ADD_(H, F, "%s.%d.mlp.down_proj.weight", p, l);
    }
    ADD_(H, 0, "model.norm.weight");
    if (!c->tie_word_embeddings) ADD_(c->vocab_size, H, "lm_head.weight");
#undef ADD_
}

zdp_status zdp_llama_create(const zdp_llama_config *cfg, int max_batch, zdp_model *out,
                            zdp_error *err) {
    if (out == NULL || cfg == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_llama_create: cfg and out must be set");
    memset(out, 0, sizeof *out);
    zdp_status st = check_config_(cfg, max_batch, err);
    if (st != ZDP_OK) return st;
    llama *m = calloc(1, sizeof *m);
    if (m == NULL) goto nomem;
    m->cfg = *cfg;
    m->max_batch = max_batch;
    m->li = layer_layout_(cfg);
    const int64_t L = cfg->n_layer, H = cfg->hidden, NH = cfg->n_head, KV = cfg->n_kv_head;
    const int64_t hd = cfg->head_dim, F = cfg->ffn, V = cfg->vocab_size;
    const int64_t QD = NH * hd, KD = KV * hd;
    const int64_t Tm = cfg->block_size, BT = (int64_t)max_batch * Tm;
    const int64_t QN = cfg->qk_norm ? 1 : 0; /* the q/k norm arrays exist only with qk_norm */
    m->norm = LAYER0_ + m->li.n * cfg->n_layer;
    m->lm_head = cfg->tie_word_embeddings ? EMBED_ : m->norm + 1;
    const int n_params = m->norm + (cfg->tie_word_embeddings ? 1 : 2);

    /* Slice one block; each slice starts on a 64-byte boundary. */
    struct { float **p; int64_t n; } slices[] = {
        {&m->dnorm, H > hd ? H : hd},
        {&m->cos, Tm * hd / 2},    {&m->sin, Tm * hd / 2},       {&m->encoded, BT * H},
        {&m->ln1, L * BT * H},     {&m->ln2, L * BT * H},        {&m->ln1_rstd, L * BT},
        {&m->ln2_rstd, L * BT},    {&m->q, L * BT * QD},         {&m->k, L * BT * KD},
        {&m->v, L * BT * KD},      {&m->qr, L * BT * QD},        {&m->kr, L * BT * KD},
        {&m->q_rstd, QN * L * BT * NH}, {&m->k_rstd, QN * L * BT * KV},
        {&m->att, L * BT * NH * Tm},    {&m->atty, L * BT * QD}, {&m->res_mid, L * BT * H},
        {&m->gate, L * BT * F},    {&m->up, L * BT * F},         {&m->act, L * BT * F},
        {&m->res_out, L * BT * H}, {&m->lnf, BT * H},            {&m->lnf_rstd, BT},
        {&m->probs, BT * V},       {&m->dres, BT * H},           {&m->dbuf, BT * H},
        {&m->dq, BT * QD},         {&m->dk, BT * KD},            {&m->dv, BT * KD},
        {&m->dqn, QN * BT * QD},   {&m->dkn, QN * BT * KD},      {&m->datty, BT * QD},
        {&m->dgate, BT * F},       {&m->dup, BT * F},            {&m->datt, zdp_pool_size() * Tm * Tm},
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
    zdp_nn_rope_tables(m->cos, m->sin, (int)Tm, cfg->head_dim, cfg->rope_theta,
                       (int)cfg->rope_type, cfg->rope_factor, cfg->rope_low_freq_factor,
                       cfg->rope_high_freq_factor, cfg->rope_original_max_position);
    /* The shape checkpoints record: n_head, n_kv_head and the flags show in
     * no tensor's shape. */
    snprintf(m->shape_json, sizeof m->shape_json,
             "{\"model\":\"%s\",\"n_layer\":%d,\"hidden\":%d,\"n_head\":%d,\"n_kv_head\":%d,"
             "\"head_dim\":%d,\"ffn\":%d,\"vocab_size\":%d,\"block_size\":%d,"
             "\"qk_norm\":%d,\"attention_bias\":%d,\"tie_word_embeddings\":%d}",
             arch_name_(cfg->arch), cfg->n_layer, cfg->hidden, cfg->n_head, cfg->n_kv_head,
             cfg->head_dim, cfg->ffn, cfg->vocab_size, cfg->block_size, cfg->qk_norm,
             cfg->attention_bias, cfg->tie_word_embeddings);
    *out = (zdp_model){.self = m, .ops = &llama_ops_, .lm = &llama_lm_ops_,
                       .vocab_size = cfg->vocab_size, .block_size = cfg->block_size,
                       .n_params = n_params, .params = m->info, .shape_json = m->shape_json,
                       .activation_bytes = total * (int64_t)sizeof(float)};
    return ZDP_OK;
nomem:
    out->self = m;
    out->ops = &llama_ops_;
    zdp_llama_destroy(out);
    memset(out, 0, sizeof *out); /* also when m itself could not be allocated */
    return zdp_err_set(err, ZDP_ERR_NOMEM,
                       "llama create: out of memory for the activations of n_layer %d, hidden "
                       "%d, ffn %d, vocab_size %d, block_size %d, max_batch %d; lower max_batch "
                       "or block_size",
                       cfg->n_layer, cfg->hidden, cfg->ffn, cfg->vocab_size, cfg->block_size,
                       max_batch);
}

void zdp_llama_destroy(zdp_model *model) {
    llama *m = llama_of_(model);
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

const zdp_llama_config *zdp_llama_config_of(const zdp_model *model) {
    const llama *m = llama_of_(model);
    return m != NULL ? &m->cfg : NULL;
}

/* Overwrites the last forward's weights (and makes it weighted) for its
 * backward.  The loss that forward returned is not recomputed. */
static zdp_status llama_set_loss_weights_(void *self, const float *w, int64_t n,
                                          zdp_error *err) {
    llama *m = self;
    return zdp_lm_reweight_(m->have_forward, m->fwd_ad == m->ad, m->B, m->T, w, n, m->weights,
                            &m->weighted, err);
}

/* ---- initialisation ------------------------------------------------------------------ */

void zdp_llama_init_params(const zdp_model *model, float *const *params, uint64_t seed) {
    const llama *m = llama_of_(model);
    if (m == NULL || params == NULL) return;
    const layer_idx *li = &m->li;
    uint64_t s = seed;
    for (int i = 0; i < model->n_params; i++) {
        const zdp_param_info *p = &model->params[i];
        const int64_t n = p->ndim == 2 ? p->shape[0] * p->shape[1] : p->shape[0];
        const int kind = i >= LAYER0_ && i < m->norm ? (i - LAYER0_) % li->n : -1;
        const bool is_norm = i == m->norm || kind == li->in_ln || kind == li->post_ln ||
                             (kind >= 0 && (kind == li->q_norm || kind == li->k_norm));
        if (is_norm) {
            for (int64_t k = 0; k < n; k++) params[i][k] = 1.0f;
        } else if (p->ndim == 1) { /* biases */
            memset(params[i], 0, (size_t)n * sizeof(float));
        } else {
            for (int64_t k = 0; k < n; k++)
                params[i][k] = (float)(m->cfg.initializer_range * zdp_rand_normal(&s));
        }
    }
}

/* ---- inference ---------------------------------------------------------------------- */

static zdp_status llama_next_logits_(void *self, zdp_param_source *src, const int32_t *tokens,
                                     int T, float *logits, zdp_error *err) {
    llama *m = self;
    zdp_status st = zdp_lm_check_ids_(tokens, 1, T, m->cfg.vocab_size, "tokens",
                                      "zdp_lm_next_logits", err);
    if (st != ZDP_OK) return st;
    m->have_forward = false; /* the activations are about to change */
    const float *x;
    if ((st = trunk_forward_(m, src, tokens, 1, T, &x, err)) != ZDP_OK) return st;
    return head_forward_(m, src, x + (int64_t)(T - 1) * m->cfg.hidden, 1, logits, err);
}

static const zdp_lm_ops llama_lm_ops_ = {.set_loss_weights = llama_set_loss_weights_,
                                         .next_logits = llama_next_logits_};

/* ---- adapters (adapter.h) ------------------------------------------------------------ */

int zdp_llama_adapter_sites_(const zdp_model *base, zdp_adapter_site *sites, int cap,
                             int64_t *max_rows) {
    const llama *m = llama_of_(base);
    if (m == NULL) return -1;
    const zdp_llama_config *c = &m->cfg;
    const int64_t H = c->hidden, F = c->ffn, QD = (int64_t)c->n_head * c->head_dim;
    const int64_t KD = (int64_t)c->n_kv_head * c->head_dim;
    const int n = c->n_layer * SITES_PER_LAYER + 1;
    if (max_rows != NULL) *max_rows = (int64_t)m->max_batch * c->block_size;
    if (sites == NULL) return n;
    static const char *const names[SITES_PER_LAYER] = {
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
        "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
    const layer_idx *li = &m->li;
    const int widx[SITES_PER_LAYER] = {li->q_w, li->k_w, li->v_w, li->o_w,
                                       li->gate, li->up, li->down};
    const int64_t in[SITES_PER_LAYER] = {H, H, H, QD, H, H, F};
    const int64_t out[SITES_PER_LAYER] = {QD, KD, KD, H, F, F, H};
    for (int i = 0; i < n && i < cap; i++) {
        zdp_adapter_site *s = &sites[i];
        if (i == n - 1) { /* tied or not: the adapter sits on the output projection only */
            *s = (zdp_adapter_site){.in = H, .out = c->vocab_size, .group = ZDP_LORA_UNEMBED,
                                    .layer = -1, .weight = m->lm_head,
                                    .tied = c->tie_word_embeddings};
            snprintf(s->module, sizeof s->module, "lm_head");
            continue;
        }
        const int l = i / SITES_PER_LAYER, k = i % SITES_PER_LAYER;
        *s = (zdp_adapter_site){.in = in[k], .out = out[k],
                                .group = k <= S_O ? ZDP_LORA_ATTN : ZDP_LORA_MLP, .layer = l,
                                .weight = LAYER0_ + li->n * l + widx[k]};
        snprintf(s->module, sizeof s->module, "model.layers.%d.%s", l, names[k]);
    }
    return n;
}

int zdp_llama_adapter_attach_(const zdp_model *base, const zdp_adapter *ad) {
    llama *m = llama_of_(base);
    if (m == NULL) return -1;
    m->ad = ad;
    return 0;
}

/* ---- the decode step (decode.h) ------------------------------------------------------ */

/* The forward above for a decode pass's rows, each at its own position, with
 * the cache's products and attention (src/sample/decode.c). */
static void llama_decode_trunk_(const void *self, zdp_decode_pass *p) {
    const llama *m = self;
    const zdp_llama_config *c = &m->cfg;
    const layer_idx *li = &m->li;
    const float *const *P = p->P;
    const int64_t N = p->n, H = c->hidden, NH = c->n_head, KV = c->n_kv_head, hd = c->head_dim;
    const int64_t F = c->ffn, QD = NH * hd, KD = KV * hd;
    const float eps = c->rms_norm_eps;
    for (int64_t i = 0; i < N; i++)
        memcpy(p->x + i * H, P[EMBED_] + (int64_t)p->tokens[i] * H, (size_t)H * sizeof(float));
    for (int l = 0; l < c->n_layer; l++) {
        const int p0 = LAYER0_ + li->n * l, s0 = l * SITES_PER_LAYER;
        const float *const *lp = P + p0;
#define B_(idx) ((idx) >= 0 ? lp[idx] : NULL)
        float *q = p->q, *k = p->k, *v = p->v;
        zdp_nn_rmsnorm_forward(p->h, p->rstd, p->x, lp[li->in_ln], N, H, eps);
        p->linear(p->ctx, q, p->h, p0 + li->q_w, B_(li->q_b), N, H, QD, 0);
        p->linear(p->ctx, k, p->h, p0 + li->k_w, B_(li->k_b), N, H, KD, 0);
        p->linear(p->ctx, v, p->h, p0 + li->v_w, B_(li->v_b), N, H, KD, 0);
        p->adapt(p->ctx, s0 + S_Q, q, p->h, N, 0);
        p->adapt(p->ctx, s0 + S_K, k, p->h, N, 0);
        p->adapt(p->ctx, s0 + S_V, v, p->h, N, 0);
        if (c->qk_norm) { /* Qwen3: per head, in place (rows of hd) */
            zdp_nn_rmsnorm_forward(q, p->rstd, q, lp[li->q_norm], N * NH, hd, eps);
            zdp_nn_rmsnorm_forward(k, p->rstd, k, lp[li->k_norm], N * KV, hd, eps);
        }
        for (int64_t i = 0; i < N; i++) { /* rotary at each row's own position */
            const int64_t o = (int64_t)p->pos[i] * (hd / 2);
            zdp_nn_rope_forward(q + i * QD, q + i * QD, p->cos + o, p->sin + o, 1, 1, NH, hd);
            zdp_nn_rope_forward(k + i * KD, k + i * KD, p->cos + o, p->sin + o, 1, 1, KV, hd);
        }
        p->attend(p->ctx, l, q, QD, k, v, KD);
        p->linear(p->ctx, p->x, p->atty, p0 + li->o_w, B_(li->o_b), N, QD, H, 1);
        p->adapt(p->ctx, s0 + S_O, p->x, p->atty, N, 0);
        zdp_nn_rmsnorm_forward(p->h, p->rstd, p->x, lp[li->post_ln], N, H, eps);
        p->linear(p->ctx, p->f1, p->h, p0 + li->gate, NULL, N, H, F, 0);
        p->linear(p->ctx, p->f2, p->h, p0 + li->up, NULL, N, H, F, 0);
        p->adapt(p->ctx, s0 + S_GATE, p->f1, p->h, N, 0);
        p->adapt(p->ctx, s0 + S_UP, p->f2, p->h, N, 0);
        zdp_nn_swiglu_forward(p->f1, p->f1, p->f2, N * F);
        p->linear(p->ctx, p->x, p->f1, p0 + li->down, NULL, N, F, H, 1);
        p->adapt(p->ctx, s0 + S_DOWN, p->x, p->f1, N, 0);
#undef B_
    }
}

/* The final norm and lm_head (the embedding when tied) on x's first m rows. */
static void llama_decode_head_(const void *self, zdp_decode_pass *p, int64_t m_rows,
                               float *logits) {
    const llama *m = self;
    const int64_t H = m->cfg.hidden;
    zdp_nn_rmsnorm_forward(p->h, p->rstd, p->x, p->P[m->norm], m_rows, H, m->cfg.rms_norm_eps);
    p->linear(p->ctx, logits, p->h, m->lm_head, NULL, m_rows, H, m->cfg.vocab_size, 0);
    p->adapt(p->ctx, m->cfg.n_layer * SITES_PER_LAYER, logits, p->h, m_rows, 1);
}

const zdp_decode_ops *zdp_llama_decode_ops_(const zdp_model *model, const void **self) {
    static const zdp_decode_ops ops = {.trunk = llama_decode_trunk_, .head = llama_decode_head_};
    const llama *m = llama_of_(model);
    if (m == NULL) return NULL;
    *self = m;
    return &ops;
}
