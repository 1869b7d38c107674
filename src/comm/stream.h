/*
 * stream.h -- internal: the comm stream, a worker thread that runs queued
 * operations one at a time in FIFO order (the CPU analogue of a CUDA stream
 * that NCCL collectives are queued on).
 *
 * Every collective of an engine is queued here, so all ranks issue their
 * collectives in the same order whichever thread asked for them, and the
 * caller can let backward go on computing while a reduction is in flight.
 * An operation's event is the number enqueue() returned; waiting for it
 * waits for every operation queued before it too (FIFO).
 *
 * Failures: the first failing operation's error is kept; the operations
 * queued after it are skipped (their collectives would no longer match the
 * other ranks'), and every later wait returns that error.  The caller must
 * then end the job (the zdp tool calls MPI_Abort).  Knows nothing of MPI.
 */
#ifndef ZDP_STREAM_H
#define ZDP_STREAM_H

#include "../core/core.h"

/* An operation: runs on the stream thread with a private copy of its
 * argument block. */
typedef zdp_status (*zdp_stream_fn)(void *arg, zdp_error *err);

#define ZDP_STREAM_ARG_MAX 96 /* bytes of argument copied with each operation */

typedef struct zdp_stream zdp_stream;

/* Starts the thread.  depth: operations that may wait in the queue.  The
 * stream's memory is counted in *mem (ZDP_MEM_OTHER) when mem is not NULL. */
ZDP_API zdp_status zdp_stream_create(zdp_stream **out, int depth, zdp_mem_counter *mem,
                                     zdp_error *err);
/* Runs what is queued, then stops and joins the thread; NULL is a no-op. */
ZDP_API void zdp_stream_destroy(zdp_stream *s);

/* Queues fn(copy of arg) and returns its event (> 0).  Blocks while the
 * queue is full.  arg_size <= ZDP_STREAM_ARG_MAX. */
ZDP_API uint64_t zdp_stream_enqueue(zdp_stream *s, zdp_stream_fn fn, const void *arg,
                                    size_t arg_size);
/* Waits until operation `event` has run; ZDP_OK or the stream's first error. */
ZDP_API zdp_status zdp_stream_wait(zdp_stream *s, uint64_t event, zdp_error *err);
/* True when operation `event` has run (never blocks). */
ZDP_API bool zdp_stream_done(zdp_stream *s, uint64_t event);
/* Waits until everything queued so far has run. */
ZDP_API zdp_status zdp_stream_sync(zdp_stream *s, zdp_error *err);

#endif /* ZDP_STREAM_H */
