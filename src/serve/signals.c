/*
 * signals.c -- stopping on a signal, and how a rank waits for the others
 * (docs/server.md, "Stopping"): SIGINT/SIGTERM set serve_stop_signal; a
 * rank > 0 that got one tells rank 0 (a SERVE_TAG_STOP message), which
 * alone decides when every rank leaves; serve_wait sleeps on a nonblocking
 * collective instead of spinning, noticing a signal meanwhile.  Used by the
 * queue's loops and by a sampling request's gather alike.
 */
#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "serve_impl.h"

volatile sig_atomic_t serve_stop_signal = 0;
static void on_signal_(int sig) { serve_stop_signal = sig; }

void serve_install_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal_;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

/* A rank > 0 that got a signal: rank 0 alone decides when every rank
 * leaves (it refuses what is queued and broadcasts OP_QUIT), so this rank
 * tells it and goes on serving until then.  Exiting alone would leave the
 * others in a collective. */
static void notify_stop_(server *s) {
    if (s->R == 0 || serve_stop_signal == 0 || s->stop_sent) return;
    s->stop_sig = serve_stop_signal;
    fprintf(stderr, "[zdp rank %d] zdp serve: %s received: asking rank 0 to stop every rank\n", s->R,
            s->stop_sig == SIGINT ? "SIGINT" : "SIGTERM");
    zdp_error err;
    if (zdp_channel_isend_int(s->ch, &s->stop_sig, 0, SERVE_TAG_STOP, &s->stop_req, &err) != ZDP_OK)
        serve_die("serve", &err);
    s->stop_sent = true;
}

/* Rank 0: has a rank > 0 asked to stop?  Then stop as if rank 0 got the
 * signal itself.  A failure is returned, not serve_die'd: the caller may
 * hold s->mu. */
zdp_status serve_poll_stop(server *s, zdp_error *err) {
    if (s->W == 1) return ZDP_OK;
    int from = -1, sig = 0;
    if (zdp_channel_poll_int(s->ch, SERVE_TAG_STOP, &from, &sig, err) != ZDP_OK) return err->code;
    if (from < 0) return ZDP_OK;
    printf("zdp serve: rank %d received %s: stopping every rank\n", from,
           sig == SIGINT ? "SIGINT" : "SIGTERM");
    fflush(stdout);
    if (serve_stop_signal == 0) serve_stop_signal = sig;
    return ZDP_OK;
}

/* Waits for a nonblocking collective without spinning a core: idle ranks
 * sit here between requests (and notice a signal here), and a rank that
 * finished its share of a sampling request waits here for the others in
 * the gather.  A blocking MPI call would spin (Open MPI's shared-memory
 * transport polls): its CPU time is taken from the ranks still working
 * whenever the ranks share cores.  The first test comes after 20 us and the
 * sleep grows by half up to 2 ms, so a short wait costs little latency
 * (docs/benchmarks-sample.md, "Sampling on several ranks"). */
void serve_wait(server *s, zdp_comm_req *req) {
    bool done = false;
    long ns = 20000;
    zdp_error err;
    for (;;) {
        notify_stop_(s);
        if (zdp_comm_test(req, &done, &err) != ZDP_OK) serve_die("serve", &err);
        if (done) return;
        nanosleep(&(struct timespec){0, ns}, NULL);
        if (ns < 2000000) ns += ns / 2;
    }
}

