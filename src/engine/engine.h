/*
 * engine.h -- internal: what tests and tools inside the project may use
 * beyond the public API.
 */
#ifndef ZDP_ENGINE_H
#define ZDP_ENGINE_H

#include "zdp/engine.h"

/* A grad sink that hands out caller-owned buffers (grads[i] for tensor i),
 * with no engine behind it: for checking a model's gradients in a single
 * process (finite-difference tests).  Free with free(). */
ZDP_API zdp_grad_sink *zdp_grad_sink_create_dense(float *const *grads, int n_tensors);

/* Stage 3: fetches served by a prefetched gather since create (0 at stages
 * 0-2 and with stage3_prefetch_bucket_size 0). */
ZDP_API int64_t zdp_engine_prefetch_hits(const zdp_engine *eng);
/* Stage 3: fetches served by a range kept gathered after its release
 * because the trace reuses it within stage3_max_reuse_distance. */
ZDP_API int64_t zdp_engine_reuse_hits(const zdp_engine *eng);

#endif /* ZDP_ENGINE_H */
