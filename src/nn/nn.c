/*
 * nn.c -- linear and softmax cross-entropy kernels (see nn.h).
 * Matmuls go through cblas_sgemm on row-major data.
 */
#include "nn.h"

#include <math.h>
#include <string.h>

#include <cblas.h>

void zdp_nn_linear_forward(float *out, const float *inp, const float *weight, const float *bias,
                           int64_t N, int64_t C, int64_t OC, int accumulate) {
    /* out (N,OC) = inp (N,C) @ weight^T (C,OC) [+ out] */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, (int)OC, (int)C, 1.0f, inp,
                (int)C, weight, (int)C, accumulate ? 1.0f : 0.0f, out, (int)OC);
    if (bias != NULL)
        for (int64_t n = 0; n < N; n++)
            for (int64_t o = 0; o < OC; o++) out[n * OC + o] += bias[o];
}

void zdp_nn_linear_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const float *weight, int64_t N, int64_t C,
                            int64_t OC) {
    if (dinp != NULL) /* dinp (N,C) += dout (N,OC) @ weight (OC,C) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, (int)C, (int)OC, 1.0f,
                    dout, (int)OC, weight, (int)C, 1.0f, dinp, (int)C);
    if (dweight != NULL) /* dweight (OC,C) += dout^T (OC,N) @ inp (N,C) */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)OC, (int)C, (int)N, 1.0f, dout,
                    (int)OC, inp, (int)C, 1.0f, dweight, (int)C);
    if (dbias != NULL)
        for (int64_t n = 0; n < N; n++)
            for (int64_t o = 0; o < OC; o++) dbias[o] += dout[n * OC + o];
}

double zdp_nn_crossentropy_forward(float *probs, const float *logits, const int64_t *targets,
                                   int64_t N, int64_t V) {
    double total = 0.0;
    for (int64_t n = 0; n < N; n++) {
        const float *row = logits + n * V;
        float *p = probs + n * V;
        float maxv = row[0];
        for (int64_t v = 1; v < V; v++) maxv = row[v] > maxv ? row[v] : maxv;
        double sum = 0.0;
        for (int64_t v = 0; v < V; v++) {
            p[v] = expf(row[v] - maxv);
            sum += p[v];
        }
        for (int64_t v = 0; v < V; v++) p[v] = (float)(p[v] / sum);
        total += log(sum) + maxv - row[targets[n]];
    }
    return N > 0 ? total / (double)N : 0.0;
}

void zdp_nn_crossentropy_backward(float *dlogits, const float *probs, const int64_t *targets,
                                  float dloss, int64_t N, int64_t V) {
    const float s = N > 0 ? dloss / (float)N : 0.0f;
    for (int64_t n = 0; n < N; n++) {
        for (int64_t v = 0; v < V; v++) dlogits[n * V + v] = s * probs[n * V + v];
        dlogits[n * V + targets[n]] -= s;
    }
}
