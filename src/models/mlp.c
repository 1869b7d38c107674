/*
 * mlp.c -- DeepSpeed's test SimpleModel(hidden_dim, nlayers) in C.
 *
 *   nlayers == 1:  x = linears[0](x)
 *   nlayers  > 1:  for i in 0..L-1:  x = linears[i/2](x) + linears[i](x)
 *   loss = mean cross-entropy(x, y)  (x are logits over `hidden` classes)
 *
 * Parameters, in registration order: linears.{i}.weight (H,H) (out x in, as
 * torch.nn.Linear), linears.{i}.bias (H).  Backward walks i = L-1..0; tensor
 * linears.j gets its last contribution at i = j (its first use in forward), so
 * it is released there and the grad sink sees tensors finish last to first.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/core.h"
#include "../nn/nn.h"
#include "zdp/model.h"

typedef struct mlp {
    int H, L;
    int64_t max_batch;
    int64_t n;          /* rows of the last forward */
    float *acts;        /* (L+1, max_batch, H): acts[i] is the input of step i; acts[L] the logits */
    float *probs;       /* (max_batch, H) softmax of the logits */
    float *dx, *dx_next; /* (max_batch, H) gradient w.r.t. the current activation */
    const int64_t *y;   /* labels of the last forward (caller's memory) */
    int64_t *y_copy;    /* (max_batch) labels kept for backward */
    char *names;        /* storage for parameter names */
    zdp_param_info *info; /* (2L) */
    char shape_json[96];  /* zdp_model.shape_json */
} mlp;

#define ACT_(m, i) ((m)->acts + (int64_t)(i) * (m)->max_batch * (m)->H)

static zdp_status mlp_forward_(void *self, zdp_param_source *src, const void *batch_v,
                               float *loss, zdp_error *err) {
    mlp *m = self;
    const zdp_mlp_batch *batch = batch_v;
    if (batch == NULL || batch->x == NULL || batch->y == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "mlp forward: batch, batch->x and batch->y must be set");
    if (batch->n < 1 || batch->n > m->max_batch)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "mlp forward: batch->n = %lld: must be 1..%lld (the max_batch the "
                           "model was created with)",
                           (long long)batch->n, (long long)m->max_batch);
    for (int64_t k = 0; k < batch->n; k++)
        if (batch->y[k] < 0 || batch->y[k] >= m->H)
            return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                               "mlp forward: label y[%lld] = %lld: must be in [0, %d) (hidden "
                               "size = number of classes)",
                               (long long)k, (long long)batch->y[k], m->H);
    const int64_t N = batch->n, H = m->H;
    m->n = N;
    memcpy(m->y_copy, batch->y, (size_t)N * sizeof(int64_t));
    memcpy(ACT_(m, 0), batch->x, (size_t)(N * H) * sizeof(float));
    for (int i = 0; i < m->L; i++) {
        float *out = ACT_(m, i + 1);
        const float *in = ACT_(m, i);
        int a = m->L > 1 ? i / 2 : 0;
        /* Step i reads linears[i/2] and linears[i]: each fetched as one
         * range (the same range twice at step 0). */
        const float *const *pa, *const *pi;
        zdp_status st = zdp_param_fetch(src, 2 * a, 2, &pa, err);
        if (st != ZDP_OK) return st;
        zdp_nn_linear_forward(out, in, pa[2 * a], pa[2 * a + 1], N, H, H, 0);
        if (m->L > 1) {
            if ((st = zdp_param_fetch(src, 2 * i, 2, &pi, err)) != ZDP_OK) return st;
            zdp_nn_linear_forward(out, in, pi[2 * i], pi[2 * i + 1], N, H, H, 1);
            zdp_param_release(src, 2 * i, 2);
        }
        zdp_param_release(src, 2 * a, 2);
    }
    double l = zdp_nn_crossentropy_forward(m->probs, ACT_(m, m->L), m->y_copy, N, H);
    *loss = (float)l;
    return ZDP_OK;
}

static zdp_status mlp_backward_(void *self, zdp_param_source *src, float dloss,
                                zdp_grad_sink *sink, zdp_error *err) {
    mlp *m = self;
    const int64_t N = m->n, H = m->H;
    zdp_nn_crossentropy_backward(m->dx, m->probs, m->y_copy, dloss, N, H);
    for (int i = m->L - 1; i >= 0; i--) {
        const float *in = ACT_(m, i);
        memset(m->dx_next, 0, (size_t)(N * H) * sizeof(float));
        int layers[2] = {m->L > 1 ? i / 2 : 0, i};
        int nuse = m->L > 1 ? 2 : 1;
        for (int u = 0; u < nuse; u++) {
            int j = layers[u];
            float *dw = zdp_grad_acquire(sink, 2 * j);
            float *db = zdp_grad_acquire(sink, 2 * j + 1);
            if (dw == NULL || db == NULL)
                return zdp_err_set(err, ZDP_ERR_INTERNAL, "mlp backward: grad sink refused layer %d", j);
            const float *const *p;
            zdp_status st = zdp_param_fetch(src, 2 * j, 2, &p, err);
            if (st != ZDP_OK) return st;
            zdp_nn_linear_backward(i > 0 ? m->dx_next : NULL, dw, db, m->dx, in, p[2 * j], N, H,
                                   H, 0);
            zdp_param_release(src, 2 * j, 2);
        }
        /* linears[i] is complete: its first use in forward was step i. */
        zdp_grad_release(sink, 2 * i + 1);
        zdp_grad_release(sink, 2 * i);
        float *t = m->dx;
        m->dx = m->dx_next;
        m->dx_next = t;
    }
    return ZDP_OK;
}

static const zdp_model_ops mlp_ops_ = {.forward = mlp_forward_, .backward = mlp_backward_};

zdp_status zdp_mlp_create(int hidden, int nlayers, int64_t max_batch, zdp_model *out,
                          zdp_error *err) {
    if (out == NULL) return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_mlp_create: out is NULL");
    memset(out, 0, sizeof *out);
    if (hidden < 1 || hidden > (1 << 16) || nlayers < 1 || nlayers > 1024 || max_batch < 1 ||
        max_batch > ((int64_t)1 << 24))
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "mlp: hidden = %d, layers = %d, max_batch = %lld: need hidden in "
                           "1..65536, layers in 1..1024, max_batch in 1..16777216",
                           hidden, nlayers, (long long)max_batch);
    mlp *m = calloc(1, sizeof *m);
    if (m == NULL) goto nomem;
    m->H = hidden;
    m->L = nlayers;
    m->max_batch = max_batch;
    size_t act = (size_t)max_batch * (size_t)hidden;
    m->acts = calloc(act * (size_t)(nlayers + 1), sizeof(float));
    m->probs = calloc(act, sizeof(float));
    m->dx = calloc(act, sizeof(float));
    m->dx_next = calloc(act, sizeof(float));
    m->y_copy = calloc((size_t)max_batch, sizeof(int64_t));
    m->names = calloc((size_t)nlayers * 2, 32);
    m->info = calloc((size_t)nlayers * 2, sizeof *m->info);
    if (!m->acts || !m->probs || !m->dx || !m->dx_next || !m->y_copy || !m->names || !m->info)
        goto nomem;
    for (int i = 0; i < nlayers; i++) {
        char *wn = m->names + (size_t)(2 * i) * 32, *bn = wn + 32;
        snprintf(wn, 32, "linears.%d.weight", i);
        snprintf(bn, 32, "linears.%d.bias", i);
        m->info[2 * i] = (zdp_param_info){.name = wn, .ndim = 2, .shape = {hidden, hidden}};
        m->info[2 * i + 1] = (zdp_param_info){.name = bn, .ndim = 1, .shape = {hidden}};
    }
    snprintf(m->shape_json, sizeof m->shape_json,
             "{\"model\":\"mlp\",\"hidden\":%d,\"layers\":%d}", hidden, nlayers);
    *out = (zdp_model){.self = m, .ops = &mlp_ops_, .n_params = 2 * nlayers, .params = m->info,
                       .shape_json = m->shape_json};
    return ZDP_OK;
nomem:
    out->self = m;
    zdp_mlp_destroy(out);
    return zdp_err_set(err, ZDP_ERR_NOMEM, "mlp: out of memory for hidden %d, layers %d, batch %lld",
                       hidden, nlayers, (long long)max_batch);
}

void zdp_mlp_destroy(zdp_model *model) {
    if (model == NULL || model->self == NULL) return;
    mlp *m = model->self;
    free(m->acts);
    free(m->probs);
    free(m->dx);
    free(m->dx_next);
    free(m->y_copy);
    free(m->names);
    free(m->info);
    free(m);
    memset(model, 0, sizeof *model);
}

void zdp_mlp_init_params(const zdp_model *model, float *const *params, uint64_t seed) {
    const mlp *m = model->self;
    const double bound = 1.0 / sqrt((double)m->H);
    uint64_t s = seed;
    for (int t = 0; t < model->n_params; t++) {
        int64_t n = t % 2 == 0 ? (int64_t)m->H * m->H : m->H;
        for (int64_t k = 0; k < n; k++) {
            double u = (double)(zdp_splitmix64(&s) >> 11) * 0x1.0p-53; /* [0,1) */
            params[t][k] = (float)((2.0 * u - 1.0) * bound);
        }
    }
}
