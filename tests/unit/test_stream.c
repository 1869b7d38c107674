/*
 * test_stream.c -- the comm stream without MPI: operations run in FIFO order
 * on one thread, events wait for everything queued before them, the first
 * failure sticks and skips what follows, destroy drains the queue, and the
 * queue blocks (does not drop) when full.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "comm/stream.h"

typedef struct log_ {
    int order[1000];
    int n;
    pthread_t thread[1000];
} log_;

typedef struct op_arg {
    log_ *log;
    int id;
    int fail;      /* return an error */
    long sleep_us; /* pretend to communicate */
} op_arg;

static zdp_status record_(void *arg, zdp_error *err) {
    const op_arg *a = arg;
    if (a->sleep_us > 0) {
        struct timespec ts = {.tv_sec = 0, .tv_nsec = a->sleep_us * 1000};
        nanosleep(&ts, NULL);
    }
    a->log->thread[a->log->n] = pthread_self();
    a->log->order[a->log->n++] = a->id;
    if (a->fail) return zdp_err_set(err, ZDP_ERR_COMM, "op %d failed on purpose", a->id);
    return ZDP_OK;
}

static uint64_t push_(zdp_stream *s, log_ *l, int id, int fail, long us) {
    op_arg a = {.log = l, .id = id, .fail = fail, .sleep_us = us};
    return zdp_stream_enqueue(s, record_, &a, sizeof a);
}

static void test_fifo_order_and_events(void **state) {
    (void)state;
    static log_ l;
    memset(&l, 0, sizeof l);
    zdp_mem_counter mem = {0};
    zdp_stream *s;
    assert_int_equal(zdp_stream_create(&s, 4, &mem, NULL), ZDP_OK);
    uint64_t ev[100];
    /* More operations than the queue holds: enqueue blocks, never drops. */
    for (int i = 0; i < 100; i++) ev[i] = push_(s, &l, i, 0, i % 10 == 0 ? 200 : 0);
    for (int i = 1; i < 100; i++) assert_true(ev[i] == ev[i - 1] + 1);
    assert_int_equal(zdp_stream_wait(s, ev[49], NULL), ZDP_OK);
    /* Waiting for 49 waited for 0..48 too. */
    for (int i = 0; i < 50; i++) assert_true(zdp_stream_done(s, ev[i]));
    assert_int_equal(zdp_stream_sync(s, NULL), ZDP_OK);
    assert_int_equal(l.n, 100);
    for (int i = 0; i < 100; i++) {
        assert_int_equal(l.order[i], i);
        assert_false(pthread_equal(l.thread[i], pthread_self())); /* on the stream thread */
        assert_true(pthread_equal(l.thread[i], l.thread[0]));     /* always the same one */
    }
    zdp_stream_destroy(s);
}

static void test_first_error_sticks(void **state) {
    (void)state;
    static log_ l;
    memset(&l, 0, sizeof l);
    zdp_mem_counter mem = {0};
    zdp_stream *s;
    zdp_error err;
    assert_int_equal(zdp_stream_create(&s, 8, &mem, NULL), ZDP_OK);
    uint64_t a = push_(s, &l, 0, 0, 0);
    uint64_t b = push_(s, &l, 1, 1, 0);
    uint64_t c = push_(s, &l, 2, 1, 0);
    uint64_t d = push_(s, &l, 3, 0, 0);
    (void)a;
    (void)c;
    assert_int_equal(zdp_stream_wait(s, d, &err), ZDP_ERR_COMM);
    assert_non_null(strstr(err.msg, "op 1 failed"));
    assert_int_equal(l.n, 2); /* ops 2 and 3 were skipped */
    assert_int_equal(zdp_stream_wait(s, b, &err), ZDP_ERR_COMM);
    assert_int_equal(zdp_stream_sync(s, &err), ZDP_ERR_COMM);
    zdp_stream_destroy(s);
}

static void test_destroy_drains(void **state) {
    (void)state;
    static log_ l;
    memset(&l, 0, sizeof l);
    zdp_mem_counter mem = {0};
    zdp_stream *s;
    assert_int_equal(zdp_stream_create(&s, 16, &mem, NULL), ZDP_OK);
    for (int i = 0; i < 10; i++) push_(s, &l, i, 0, 500);
    assert_true(mem.bytes[ZDP_MEM_OTHER] > 0);
    zdp_stream_destroy(s);
    assert_int_equal(mem.bytes[ZDP_MEM_OTHER], 0); /* everything counted came back */
    assert_int_equal(l.n, 10);
    zdp_stream_destroy(NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fifo_order_and_events),
        cmocka_unit_test(test_first_error_sticks),
        cmocka_unit_test(test_destroy_drains),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
