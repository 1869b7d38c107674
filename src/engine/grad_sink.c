/*
 * grad_sink.c -- the grad sink (zdp/model.h): where the model's backward
 * writes its gradients, one tensor at a time, acquire / add into / release.
 *
 * Stages 0/1 hand out views of the flat gradient buffer, where the window's
 * gradients add up until step() reduces them.  Stages 2/3 hand out the
 * tensor's place in its reduce bucket's buffer (src/zero/buckets.c), and the
 * release of a bucket's last tensor queues its reduction.  A misuse (an
 * index out of range, an acquire after release, a double release) is
 * recorded and reported when backward returns.  A dense sink hands out
 * caller-owned buffers (finite-difference tests).
 */
#include <stdlib.h>
#include <string.h>

#include "engine_impl.h"

static void sink_misuse_(zdp_grad_sink *s, int i, const char *what) {
    if (s->misuse_tensor < 0) {
        s->misuse_tensor = i;
        s->misuse = what;
    }
}

zdp_grad_sink *zdp_grad_sink_create_dense(float *const *grads, int n_tensors) {
    zdp_grad_sink *s = calloc(1, sizeof *s);
    if (s != NULL) {
        s->dense = grads;
        s->n_dense = n_tensors;
    }
    return s;
}

float *zdp_grad_acquire(zdp_grad_sink *s, int i) {
    if (s == NULL) return NULL;
    if (s->dense != NULL) return i >= 0 && i < s->n_dense ? s->dense[i] : NULL;
    zdp_engine *e = s->eng;
    if (i < 0 || i >= e->lay.n_tensors) {
        sink_misuse_(s, i, "acquired with an index out of range");
        return NULL;
    }
    if (s->state[i] == SINK_RELEASED) {
        sink_misuse_(s, i, "acquired after it was released in the same backward");
        return NULL;
    }
    if (e->cfg.zero.stage < 2) {
        s->state[i] = SINK_ACQUIRED;
        return e->grads + e->lay.offsets[i];
    }
    float *g = zdp_buckets_grad(&e->gb, i, &s->comm_status, &s->comm_err);
    if (g == NULL) {
        sink_misuse_(s, i, "could not get a bucket buffer (out of memory)");
        return NULL;
    }
    s->state[i] = SINK_ACQUIRED;
    return g;
}

void zdp_grad_release(zdp_grad_sink *s, int i) {
    if (s == NULL || s->dense != NULL) return;
    zdp_engine *e = s->eng;
    if (i < 0 || i >= e->lay.n_tensors) {
        sink_misuse_(s, i, "released with an index out of range");
        return;
    }
    if (s->state[i] == SINK_RELEASED) {
        sink_misuse_(s, i, "released twice in one backward");
        return;
    }
    if (e->cfg.zero.stage >= 2 && !zdp_buckets_release(&e->gb, i, &s->comm_status, &s->comm_err)) {
        sink_misuse_(s, i, "could not get a bucket buffer (out of memory)");
        return;
    }
    s->state[i] = SINK_RELEASED;
}

void zdp_engine_sink_begin_(zdp_engine *e) {
    memset(e->sink.state, SINK_IDLE, (size_t)e->lay.n_tensors);
    e->sink.misuse_tensor = -1;
    e->sink.misuse = NULL;
    e->sink.comm_status = ZDP_OK;
    zdp_buckets_begin(&e->gb);
}

void zdp_engine_sink_end_(zdp_engine *e) {
    /* Last tensor first, so every bucket is reduced in the planned order on
     * every rank. */
    for (int i = e->lay.n_tensors - 1; i >= 0; i--)
        if (e->sink.state[i] != SINK_RELEASED) zdp_grad_release(&e->sink, i);
    /* Without overlap_comm every reduction has finished here.  With it,
     * reductions still in flight go on behind the next forward and backward:
     * grad_part is read only by step(), which waits for the stream first. */
}
