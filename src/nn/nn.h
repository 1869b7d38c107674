/*
 * nn.h -- internal: layer kernels as plain forward/backward functions.
 *
 * Legend: N = rows (batch), C = input channels, OC = output channels.
 * Kernels allocate nothing, hold no state and never talk to MPI.  Backward
 * kernels ADD (+=) into parameter gradients, which come from the grad sink,
 * and either overwrite or add into input gradients as their comment says.
 */
#ifndef ZDP_NN_H
#define ZDP_NN_H

#include <stdint.h>

/* out = inp @ weight^T + bias   (torch.nn.Linear)
 * out (N,OC), inp (N,C), weight (OC,C) row-major, bias (OC) or NULL.
 * accumulate: add into out instead of overwriting it. */
void zdp_nn_linear_forward(float *out, const float *inp, const float *weight, const float *bias,
                           int64_t N, int64_t C, int64_t OC, int accumulate);

/* dinp (N,C) += dout @ weight      (skipped when dinp is NULL)
 * dweight (OC,C) += dout^T @ inp   (skipped when NULL)
 * dbias (OC) += column sums of dout (skipped when NULL) */
void zdp_nn_linear_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const float *weight, int64_t N, int64_t C,
                            int64_t OC);

/* Mean cross-entropy of logits (N,V) against targets (N) in [0,V):
 * returns mean_n [logsumexp(logits_n) - logits_n[target_n]]  (torch's
 * F.cross_entropy, reduction="mean").  probs (N,V) receives softmax(logits). */
double zdp_nn_crossentropy_forward(float *probs, const float *logits, const int64_t *targets,
                                   int64_t N, int64_t V);

/* dlogits (N,V) = dloss * (probs - onehot(targets)) / N  (overwrites). */
void zdp_nn_crossentropy_backward(float *dlogits, const float *probs, const int64_t *targets,
                                  float dloss, int64_t N, int64_t V);

#endif /* ZDP_NN_H */
