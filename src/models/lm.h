/*
 * lm.h -- internal: the plumbing every causal LM (gpt.c, llama.c) shares
 * around its own math, in lm.c: checking and taking a zdp_lm_batch, the
 * state rules of backward, and zdp_lm_set_loss_weights.  Each model keeps
 * its last forward's shape, ids and loss weights in its own struct and hands
 * them here; the checks and the messages live in one place.
 */
#ifndef ZDP_MODELS_LM_H
#define ZDP_MODELS_LM_H

#include <stdbool.h>
#include <stdint.h>

#include "zdp/model.h"

/* Token ids (B,T) must lie in [0, vocab_size): the first bad one is named. */
zdp_status zdp_lm_check_ids_(const int32_t *ids, int B, int T, int vocab_size, const char *what,
                             const char *fn, zdp_error *err);

/* Checks a forward's batch (and loss) against the model's bounds and copies
 * its ids into inputs/targets (max_batch*block_size) and its weights, when
 * given, into weights; *weighted says whether it had any. */
zdp_status zdp_lm_take_batch_(const zdp_lm_batch *batch, const float *loss, int max_batch,
                              int block_size, int vocab_size, const char *fn, int32_t *inputs,
                              int32_t *targets, float *weights, bool *weighted, zdp_error *err);

/* Backward (or a reweight) needs an intact forward that ran with the adapters
 * attached now (adapter.h: models sharing a base run one at a time). */
zdp_status zdp_lm_check_backward_(const char *model_name, bool have_forward, bool same_adapters,
                                  zdp_error *err);

/* zdp_lm_set_loss_weights on a model whose last forward had shape (B,T):
 * checks w (n == B*T, finite) and copies it into weights, *weighted = true. */
zdp_status zdp_lm_reweight_(bool have_forward, bool same_adapters, int B, int T, const float *w,
                            int64_t n, float *weights, bool *weighted, zdp_error *err);

#endif
