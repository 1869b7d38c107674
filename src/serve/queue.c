/*
 * queue.c -- the FIFO and the loops (docs/server.md, "Stopping"): rank 0's
 * main thread takes one job at a time, broadcasts it to every rank over a
 * private channel (src/comm, zdp_channel) when its op runs on all ranks
 * (serve_ops[op].all_ranks), runs it (serve_exec) and hands the answer back:
 * to the connection thread waiting on a plain request, or to its protocol
 * (s->proto.finish).  The other ranks wait in serve_worker_loop.
 *
 * A signal to a rank > 0 reaches rank 0 (signals.c), and rank 0 stops
 * every rank as for its own signal.  When idle, rank 0 sends a no-op
 * (OP_PING) that every rank answers; /healthz names a rank that has not.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <signal.h>

#include "serve_impl.h"

void serve_enqueue_locked(server *s, job *j) {
    j->queued_at = serve_now();
    j->next = NULL;
    if (s->tail) s->tail->next = j;
    else s->head = j;
    s->tail = j;
    pthread_cond_signal(&s->cv_job);
}

bool serve_run_job(server *s, job *j) {
    pthread_mutex_lock(&s->mu);
    if (s->closed || serve_stop_signal) {
        pthread_mutex_unlock(&s->mu);
        serve_job_free(j);
        return false;
    }
    serve_enqueue_locked(s, j);
    while (!j->done) pthread_cond_wait(&s->cv_done, &s->mu);
    pthread_mutex_unlock(&s->mu);
    return true;
}

bool serve_unqueue_locked(server *s, job *j) {
    job *prev = NULL;
    for (job *q = s->head; q != NULL; prev = q, q = q->next) {
        if (q != j) continue;
        if (prev != NULL) prev->next = q->next;
        else s->head = q->next;
        if (s->tail == q) s->tail = prev;
        q->next = NULL;
        return true;
    }
    return false;
}

/* The job header every rank receives: {op, payload bytes, slot, uid} (the
 * model it runs on, so every rank runs the same model's collectives). */
enum { HDR_N = 4 };

static void bcast_job_(server *s, int64_t hdr[HDR_N], unsigned char **payload) {
    zdp_comm_req *req;
    zdp_error err;
    if (zdp_channel_ibcast(s->ch, hdr, HDR_N * sizeof *hdr, &req, &err) != ZDP_OK) serve_die("serve", &err);
    serve_wait(s, req);
    if (hdr[0] == OP_QUIT || hdr[1] == 0) return;
    if (s->R != 0) {
        *payload = malloc((size_t)hdr[1]);
        if (*payload == NULL) serve_die("serve", &(zdp_error){.msg = "out of memory for a request"});
    }
    if (zdp_channel_bcast(s->ch, *payload, hdr[1], &err) != ZDP_OK) serve_die("serve", &err);
}

void serve_worker_loop(server *s) {
    for (;;) {
        int64_t hdr[HDR_N] = {0, 0, 0, 0};
        job j = {0};
        bcast_job_(s, hdr, &j.payload);
        if (hdr[0] == OP_QUIT) {
            /* A stop request rank 0 never received (it was stopping anyway)
             * must not keep this rank. */
            if (s->stop_sent) zdp_comm_req_free(s->stop_req);
            s->stop_req = NULL;
            return;
        }
        if (hdr[0] == OP_PING) {
            zdp_error err;
            if (zdp_channel_send_int(s->ch, s->R, 0, SERVE_TAG_ACK, &err) != ZDP_OK) serve_die("serve", &err);
            continue;
        }
        j.op = (int)hdr[0];
        j.nbytes = hdr[1];
        j.slot = (int)hdr[2];
        j.uid = hdr[3];
        if (j.op == OP_SAMPLE_FILE && hdr[2] > 0) {
            /* An asample batch: hdr[2] more asample jobs follow, and they
             * all decode together (serve_exec_sample_batch). */
            const int nb = 1 + (int)hdr[2];
            if (nb > SERVE_SAMPLE_BATCH)
                serve_die("serve", &(zdp_error){.msg = "a sampling batch too large from rank 0 (a bug in zdp)"});
            job b[SERVE_SAMPLE_BATCH] = {{0}};
            job *bp[SERVE_SAMPLE_BATCH];
            b[0] = j;
            bp[0] = &b[0];
            for (int k = 1; k < nb; k++) {
                int64_t h2[HDR_N] = {0, 0, 0, 0};
                bcast_job_(s, h2, &b[k].payload);
                if (h2[0] != OP_SAMPLE_FILE || h2[2] != nb - 1 - k)
                    serve_die("serve", &(zdp_error){.msg = "a broken sampling batch from rank 0 (a bug in zdp)"});
                b[k].op = OP_SAMPLE_FILE;
                b[k].nbytes = h2[1];
                bp[k] = &b[k];
            }
            serve_exec_sample_batch(s, bp, nb);
            for (int k = 0; k < nb; k++) serve_job_clear(&b[k]);
            continue;
        }
        serve_exec(s, &j);
        serve_job_clear(&j);
    }
}

/* Rank 0, idle: the health check.  Every rank > 0 must answer an OP_PING;
 * until it does, /healthz can name the first rank that has not (a rank
 * that is stopped, stuck or starved cannot answer). */
static void ping_(server *s) {
    pthread_mutex_lock(&s->mu);
    s->ping_since = serve_now();
    s->ping_missing = -1; /* not known yet: the broadcast itself may wait */
    pthread_mutex_unlock(&s->mu);
    int64_t hdr[HDR_N] = {OP_PING, 0, 0, 0};
    bcast_job_(s, hdr, NULL);
    zdp_comm_req **req = malloc((size_t)s->W * sizeof *req);
    int *ack = malloc((size_t)s->W * sizeof *ack);
    if (req == NULL || ack == NULL) serve_die("serve", &(zdp_error){.msg = "out of memory for a health check"});
    zdp_error err;
    for (int r = 1; r < s->W; r++)
        if (zdp_channel_irecv_int(s->ch, &ack[r], r, SERVE_TAG_ACK, &req[r], &err) != ZDP_OK) serve_die("serve", &err);
    struct timespec ts = {0, 200000};
    for (int missing = 1; missing < s->W;) {
        bool done = false;
        if (zdp_comm_test(req[missing], &done, &err) != ZDP_OK) serve_die("serve", &err);
        if (done) {
            missing++;
            continue;
        }
        if (serve_stop_signal) {
            /* Stopping while a rank does not answer: give up on it. */
            for (int r = missing; r < s->W; r++)
                if (zdp_comm_cancel(req[r], &err) != ZDP_OK) serve_die("serve", &err);
            break;
        }
        pthread_mutex_lock(&s->mu);
        s->ping_missing = missing;
        pthread_mutex_unlock(&s->mu);
        nanosleep(&ts, NULL);
        if (ts.tv_nsec < 5000000) ts.tv_nsec += 100000;
    }
    free(req);
    free(ack);
    pthread_mutex_lock(&s->mu);
    s->ping_since = 0;
    s->ping_missing = -1;
    pthread_mutex_unlock(&s->mu);
}

/* A job's outcome goes to its Tinker future, or the job is freed
 * (detached), or its reply to the waiting connection (s->mu held). */
static void finish_(server *s, job *q) {
    if (q->fut != NULL) {
        s->proto.finish(s, q);
    } else if (q->detached) {
        serve_job_free(q);
    } else {
        q->done = true;
    }
}

/* A job refused or cut off as the server stops: its outcome, and its reply
 * for a wire format that encodes one. */
static void fail_(server *s, job *q, int status, const char *why) {
    serve_job_fail(q, status, NULL, why);
    free(q->body);
    q->body = q->encode != NULL ? q->encode(s, q) : NULL;
}

void serve_fail_jobs(server *s, int status, const char *why) {
    s->closed = true;
    for (job *q = s->head, *next; q != NULL; q = next) {
        next = q->next;
        fail_(s, q, status, why);
        finish_(s, q);
    }
    for (int k = 0; k < s->n_running; k++) {
        fail_(s, s->running[k], status, why);
        finish_(s, s->running[k]);
    }
    s->n_running = 0;
    if (s->proto.shutdown != NULL) s->proto.shutdown(s);
    s->head = s->tail = NULL;
    pthread_cond_broadcast(&s->cv_done);
}

void serve_leader_loop(server *s) {
    /* Health checks run when the ranks have been idle this long. */
    const double ping_every = s->opt.health_timeout_s / 2 < 10 ? s->opt.health_timeout_s / 2 : 10;
    double last_busy = serve_now();
    zdp_error err;
    for (;;) {
        if (serve_poll_stop(s, &err) != ZDP_OK) serve_die("serve", &err);
        pthread_mutex_lock(&s->mu);
        if (s->proto.tick != NULL) s->proto.tick(s);
        while (s->head == NULL && !serve_stop_signal) {
            if (s->W > 1 && serve_now() - last_busy >= ping_every) {
                pthread_mutex_unlock(&s->mu);
                ping_(s);
                last_busy = serve_now();
                pthread_mutex_lock(&s->mu);
                continue;
            }
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 200000000;
            if (ts.tv_nsec >= 1000000000) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000;
            }
            pthread_cond_timedwait(&s->cv_job, &s->mu, &ts);
            /* Tinker requests held back for a missing seq_id may be due. */
            if (s->proto.tick != NULL) s->proto.tick(s);
            if (serve_poll_stop(s, &err) != ZDP_OK) {
                pthread_mutex_unlock(&s->mu);
                serve_die("serve", &err);
            }
        }
        if (serve_stop_signal) {
            /* Refuse what is queued and what comes, then tell the ranks. */
            serve_fail_jobs(s, 503, "the server is shutting down");
            pthread_mutex_unlock(&s->mu);
            int64_t hdr[HDR_N] = {OP_QUIT, 0, 0, 0};
            if (s->W > 1) bcast_job_(s, hdr, NULL);
            return;
        }
        job *batch[SERVE_SAMPLE_BATCH];
        int nb = 0;
        batch[nb++] = s->head;
        s->head = s->head->next;
        /* asample jobs next to each other in the FIFO decode together
         * (several LoRA models' sampler weights share the passes); the order
         * of the FIFO is kept: only the head's run of them is taken. */
        while (batch[0]->op == OP_SAMPLE_FILE && nb < SERVE_SAMPLE_BATCH && s->head != NULL &&
               s->head->op == OP_SAMPLE_FILE) {
            batch[nb++] = s->head;
            s->head = s->head->next;
        }
        if (s->head == NULL) s->tail = NULL;
        job *j = batch[0];
        s->busy_op = j->op;
        s->busy_since = serve_now();
        memcpy(s->running, batch, (size_t)nb * sizeof *batch);
        s->n_running = nb;
        pthread_mutex_unlock(&s->mu);

        if (serve_ops[j->op].all_ranks && s->W > 1)
            for (int k = 0; k < nb; k++) {
                /* An asample job's slot field tells the ranks how many more of
                 * its batch follow. */
                int64_t hdr[HDR_N] = {batch[k]->op, batch[k]->nbytes,
                                      j->op == OP_SAMPLE_FILE ? nb - 1 - k : batch[k]->slot, batch[k]->uid};
                bcast_job_(s, hdr, &batch[k]->payload);
            }
        const double t0 = serve_now();
        if (nb == 1) {
            j->status = 500; /* until the op answers */
            serve_exec(s, j);
        } else {
            serve_exec_sample_batch(s, batch, nb);
        }
        for (int k = 0; k < nb; k++)
            if (batch[k]->encode != NULL) batch[k]->body = batch[k]->encode(s, batch[k]);
        const double t1 = serve_now();
        last_busy = t1;
        pthread_mutex_lock(&s->mu);
        s->busy_op = -1;
        s->n_running = 0;
        for (int k = 0; k < nb; k++) {
            job *q = batch[k];
            s->stats[q->op].count++;
            s->stats[q->op].queue_s += t0 - q->queued_at;
            s->stats[q->op].exec_s += t1 - t0;
            if (t1 - t0 > s->stats[q->op].exec_max_s) s->stats[q->op].exec_max_s = t1 - t0;
            finish_(s, q);
        }
        pthread_cond_broadcast(&s->cv_done);
        pthread_mutex_unlock(&s->mu);
    }
}
