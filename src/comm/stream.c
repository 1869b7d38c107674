/*
 * stream.c -- the comm stream: one worker thread, a bounded FIFO ring of
 * operations, a mutex and two condition variables (see stream.h).
 */
#include "stream.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct stream_op {
    zdp_stream_fn fn;
    unsigned char arg[ZDP_STREAM_ARG_MAX];
} stream_op;

struct zdp_stream {
    zdp_mem_counter *mem;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t work;  /* signalled when an op is queued or on stop */
    pthread_cond_t done;  /* signalled when an op finishes or a slot frees */
    stream_op *ring;
    int depth;
    uint64_t queued;      /* events handed out so far (event k is op k) */
    uint64_t completed;   /* ops finished (run or skipped) */
    bool stop;
    zdp_status status;    /* first failure */
    zdp_error error;
};

static void *stream_main_(void *arg) {
    zdp_stream *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (s->completed == s->queued && !s->stop) pthread_cond_wait(&s->work, &s->mu);
        if (s->completed == s->queued && s->stop) break;
        stream_op op = s->ring[s->completed % (uint64_t)s->depth];
        bool failed = s->status != ZDP_OK;
        pthread_mutex_unlock(&s->mu);
        /* Run outside the lock so the caller can queue and wait meanwhile. */
        zdp_error err = {0};
        zdp_status st = failed ? ZDP_OK : op.fn(op.arg, &err);
        pthread_mutex_lock(&s->mu);
        if (st != ZDP_OK && s->status == ZDP_OK) {
            s->status = st;
            s->error = err;
        }
        s->completed++;
        pthread_cond_broadcast(&s->done);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static void stream_free_(zdp_stream *s) {
    zdp_mem_counter *mem = s->mem;
    zdp_free(mem, ZDP_MEM_OTHER, s->ring, (size_t)s->depth * sizeof *s->ring);
    zdp_free(mem, ZDP_MEM_OTHER, s, sizeof *s);
}

zdp_status zdp_stream_create(zdp_stream **out, int depth, zdp_mem_counter *mem, zdp_error *err) {
    *out = NULL;
    if (depth < 1) return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "comm stream: depth %d < 1", depth);
    zdp_stream *s = zdp_alloc(mem, ZDP_MEM_OTHER, sizeof *s);
    if (s == NULL) return zdp_err_set(err, ZDP_ERR_NOMEM, "comm stream: out of memory");
    s->mem = mem;
    s->depth = depth;
    if ((s->ring = zdp_alloc(mem, ZDP_MEM_OTHER, (size_t)depth * sizeof *s->ring)) == NULL) {
        stream_free_(s);
        return zdp_err_set(err, ZDP_ERR_NOMEM, "comm stream: out of memory");
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->work, NULL);
    pthread_cond_init(&s->done, NULL);
    int rc = pthread_create(&s->thread, NULL, stream_main_, s);
    if (rc != 0) {
        pthread_cond_destroy(&s->done);
        pthread_cond_destroy(&s->work);
        pthread_mutex_destroy(&s->mu);
        stream_free_(s);
        return zdp_err_set(err, ZDP_ERR_INTERNAL, "comm stream: cannot start its thread (%s)",
                           strerror(rc));
    }
    *out = s;
    return ZDP_OK;
}

void zdp_stream_destroy(zdp_stream *s) {
    if (s == NULL) return;
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    pthread_cond_destroy(&s->done);
    pthread_cond_destroy(&s->work);
    pthread_mutex_destroy(&s->mu);
    stream_free_(s);
}

uint64_t zdp_stream_enqueue(zdp_stream *s, zdp_stream_fn fn, const void *arg, size_t arg_size) {
    pthread_mutex_lock(&s->mu);
    while (s->queued - s->completed == (uint64_t)s->depth) pthread_cond_wait(&s->done, &s->mu);
    stream_op *op = &s->ring[s->queued % (uint64_t)s->depth];
    op->fn = fn;
    memset(op->arg, 0, sizeof op->arg);
    memcpy(op->arg, arg, arg_size < sizeof op->arg ? arg_size : sizeof op->arg);
    uint64_t event = ++s->queued;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->mu);
    return event;
}

zdp_status zdp_stream_wait(zdp_stream *s, uint64_t event, zdp_error *err) {
    pthread_mutex_lock(&s->mu);
    while (s->completed < event) pthread_cond_wait(&s->done, &s->mu);
    zdp_status st = s->status;
    if (st != ZDP_OK && err != NULL) *err = s->error;
    pthread_mutex_unlock(&s->mu);
    return st;
}

bool zdp_stream_done(zdp_stream *s, uint64_t event) {
    pthread_mutex_lock(&s->mu);
    bool done = s->completed >= event;
    pthread_mutex_unlock(&s->mu);
    return done;
}

zdp_status zdp_stream_sync(zdp_stream *s, zdp_error *err) {
    pthread_mutex_lock(&s->mu);
    uint64_t last = s->queued;
    pthread_mutex_unlock(&s->mu);
    return zdp_stream_wait(s, last, err);
}
