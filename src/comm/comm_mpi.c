/*
 * comm_mpi.c -- the MPI backend of src/comm: job start-up, collectives.
 *
 * The only file that includes mpi.h.  Collectives run on MPI_COMM_WORLD in
 * the caller's thread; large counts are issued in chunks below INT_MAX.
 */
#define _POSIX_C_SOURCE 200809L /* nanosleep */
#include "comm.h"

#include <time.h>

#include <limits.h>
#include <stdatomic.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mpi.h>

#include "../core/core.h"

static bool we_initialised_mpi_ = false;

static bool mpi_ready_(void) {
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    return init && !fin;
}

/* Ranks that share this node, so BLAS threads = cores / local ranks. */
static int local_ranks_(void) {
    MPI_Comm local;
    int n = 1;
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local) ==
        MPI_SUCCESS) {
        MPI_Comm_size(local, &n);
        MPI_Comm_free(&local);
    }
    return n;
}

static const char *thread_level_name_(int level) {
    switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
    }
    return "an unknown thread level";
}

zdp_status zdp_dist_init(int *argc, char ***argv, zdp_error *err) {
    int provided = 0;
    if (!mpi_ready_()) {
        /* The engine's collectives run on its comm stream thread while the
         * caller's thread may also call MPI (zdp_dist_mean, ...). */
        if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
            return zdp_err_set(err, ZDP_ERR_COMM,
                               "MPI_Init_thread failed: check the MPI installation "
                               "(openmpi-bin) and launch with mpirun");
        we_initialised_mpi_ = true;
    } else {
        MPI_Query_thread(&provided);
    }
    /* Error records and log lines name this rank from now on. */
    zdp_core_set_rank(zdp_dist_rank());
    if (provided < MPI_THREAD_MULTIPLE)
        return zdp_err_set(err, ZDP_ERR_COMM,
                           "the MPI library provides %s, but zdp runs collectives on a comm "
                           "stream thread and needs MPI_THREAD_MULTIPLE; fix: use an MPI built "
                           "with thread support (Debian's openmpi-bin is), or if your program "
                           "initialises MPI itself, call MPI_Init_thread with "
                           "MPI_THREAD_MULTIPLE",
                           thread_level_name_(provided));
    /* Return errors instead of aborting so messages can name the call. */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    /* Open MPI's collectives allocate large temporaries on every call; with
     * glibc's defaults those are fresh mmaps that are returned to the kernel
     * each time, and every call pays their page faults (much slower from a
     * few MiB up; docs/benchmarks-collectives.md has the measurements).  Serve them from the heap
     * and keep it.  ZDP_KEEP_MALLOC=1 leaves malloc's settings alone. */
    if (getenv("ZDP_KEEP_MALLOC") == NULL) {
        mallopt(M_MMAP_THRESHOLD, 1 << 30);
        mallopt(M_TRIM_THRESHOLD, 1 << 30);
    }
    /* The kernels' threads (src/core/pool.c): ZDP_NUM_THREADS,
     * OPENBLAS_NUM_THREADS or OMP_NUM_THREADS win; otherwise the ranks on
     * this node share its cores. */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int per_rank = (int)(cores / local_ranks_());
    zdp_pool_set_size(per_rank > 0 ? per_rank : 1);
    return ZDP_OK;
}

int zdp_dist_rank(void) {
    int r = 0;
    if (mpi_ready_()) MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}

int zdp_dist_world_size(void) {
    int w = 1;
    if (mpi_ready_()) MPI_Comm_size(MPI_COMM_WORLD, &w);
    return w;
}

void zdp_dist_finalize(void) {
    if (we_initialised_mpi_ && mpi_ready_()) MPI_Finalize();
    we_initialised_mpi_ = false;
    if (!mpi_ready_()) zdp_core_set_rank(0); /* as zdp_dist_rank() now answers */
}

void zdp_dist_abort(int code, const char *msg) {
    if (msg != NULL) fprintf(stderr, "[zdp rank %d] fatal: %s\n", zdp_dist_rank(), msg);
    fflush(stderr);
    /* The library never exits: without MPI no other process waits on this
     * one, and the caller decides how to stop. */
    if (mpi_ready_()) MPI_Abort(MPI_COMM_WORLD, code);
}

bool zdp_dist_all_ok(bool ok) {
    if (!mpi_ready_()) return ok;
    int mine = ok ? 1 : 0, all = 0;
    MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
    return all != 0;
}

/* Appends "0-1, 3" (the ranks whose flag in who[] is set, consecutive ones
 * as a range) to out at *len. */
static void rank_list_(const char *who, int W, char *out, size_t *len) {
    bool first = true;
    for (int r = 0; r < W; r++) {
        if (!who[r]) continue;
        int end = r;
        while (end + 1 < W && who[end + 1]) end++;
        *len += (size_t)sprintf(out + *len, end > r ? "%s%d-%d" : "%s%d", first ? "" : ", ", r, end);
        first = false;
        r = end;
    }
}

bool zdp_dist_all_ok_why(bool ok, const char *why, char **report) {
    if (report != NULL) *report = NULL;
    const int W = mpi_ready_() ? zdp_dist_world_size() : 1;
    int mine = ok ? 0 : 1, n_failed = mine;
    if (mpi_ready_()) MPI_Allreduce(&mine, &n_failed, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (n_failed == 0) return true;
    /* Every rank gathers every message, whether or not it asked for the
     * report, so all ranks make the same calls.  One slot per rank: a flag
     * byte, then the message. */
    enum { SLOT = ZDP_ERROR_MSG_MAX + 1 };
    char *slots = malloc((size_t)W * SLOT);
    int have = slots != NULL, all_have = have;
    if (mpi_ready_()) MPI_Allreduce(&have, &all_have, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
    if (!all_have) {
        free(slots);
        if (report != NULL) {
            char text[160];
            snprintf(text, sizeof text, "%d rank(s) failed; their messages could not be gathered "
                     "(out of memory)", n_failed);
            *report = strdup(text);
        }
        return false;
    }
    char slot[SLOT];
    memset(slot, 0, sizeof slot);
    slot[0] = (char)mine;
    if (!ok) snprintf(slot + 1, SLOT - 1, "%s", why != NULL && why[0] ? why : "(no message)");
    if (mpi_ready_())
        MPI_Allgather(slot, SLOT, MPI_BYTE, slots, SLOT, MPI_BYTE, MPI_COMM_WORLD);
    else
        memcpy(slots, slot, SLOT);
    /* One line per distinct message, in the order of the first rank that
     * sent it.  Each rank is named once: the rank lists add up to at most
     * 24 bytes per rank. */
    char *who = calloc((size_t)W, 1), *used = calloc((size_t)W, 1);
    char *text = malloc((size_t)W * (SLOT + 32) + 64);
    if (who != NULL && used != NULL && text != NULL) {
        size_t len = 0;
        for (int r = 0; r < W; r++) {
            const char *msg = slots + (size_t)r * SLOT;
            if (!msg[0] || used[r]) continue;
            int n = 0;
            memset(who, 0, (size_t)W);
            for (int q = r; q < W; q++) {
                const char *other = slots + (size_t)q * SLOT;
                if (other[0] && !used[q] && strcmp(other + 1, msg + 1) == 0) {
                    who[q] = used[q] = 1;
                    n++;
                }
            }
            if (len > 0) text[len++] = '\n';
            if (n < W) {
                len += (size_t)sprintf(text + len, n > 1 ? "ranks " : "rank ");
                rank_list_(who, W, text, &len);
                len += (size_t)sprintf(text + len, ": ");
            }
            len += (size_t)sprintf(text + len, "%s", msg + 1);
        }
        text[len] = '\0';
        if (report != NULL) {
            *report = text;
            text = NULL;
        }
    }
    free(text);
    free(who);
    free(used);
    free(slots);
    return false;
}

/* ---- collectives ---- */

static zdp_status check_(int rc, const char *what, zdp_error *err) {
    if (rc == MPI_SUCCESS) return ZDP_OK;
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, s, &len);
    return zdp_err_set(err, ZDP_ERR_COMM, "%s failed on rank %d: %s", what, zdp_dist_rank(), s);
}

static zdp_status not_ready_(const char *what, zdp_error *err) {
    return zdp_err_set(err, ZDP_ERR_COMM, "%s: MPI is not initialised; call zdp_dist_init first",
                       what);
}

static void count_(zdp_comm_report *st, zdp_collective c, int64_t payload, int64_t sent,
                   int64_t received) {
    if (st == NULL) return;
    st->calls[c]++;
    st->payload_bytes[c] += payload;
    st->sent_bytes[c] += sent;
    st->received_bytes[c] += received;
}

#define CHUNK_ ((int64_t)1 << 28) /* elements per call, well below INT_MAX */

/* Bytes per MPI_Allreduce call.  Open MPI's all-reduce allocates a
 * temporary the size of its message (half of it at two ranks) and frees it
 * when it returns.  The calls run on the comm stream thread, whose glibc
 * arena grows in heaps of 64 MiB: a larger block is mapped afresh whatever
 * zdp_dist_init's mallopt says, so a large all-reduce (stage 0's whole
 * gradient) paid its page faults again on every rank every step
 * (docs/benchmarks-llama.md has the measurements).
 * Pieces of 8 MiB keep the temporary inside the arena, which reuses it. */
#define AR_CHUNK_BYTES_ ((int64_t)8 << 20)

static zdp_status allreduce_(void *buf, int64_t n, size_t esize, MPI_Datatype t,
                             zdp_comm_report *stats, const char *what, zdp_error *err) {
    if (!mpi_ready_()) return not_ready_(what, err);
    const int64_t chunk = AR_CHUNK_BYTES_ / (int64_t)esize;
    for (int64_t off = 0; off < n; off += chunk) {
        int64_t c = n - off < chunk ? n - off : chunk;
        int rc = MPI_Allreduce(MPI_IN_PLACE, (char *)buf + off * (int64_t)esize, (int)c, t,
                               MPI_SUM, MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS) return check_(rc, what, err);
    }
    int64_t W = zdp_dist_world_size(), bytes = n * (int64_t)esize;
    int64_t wire = 2 * (W - 1) * bytes / W; /* ring model */
    count_(stats, ZDP_COLL_ALLREDUCE, bytes, wire, wire);
    return ZDP_OK;
}

zdp_status zdp_comm_allreduce_sum_f32(float *buf, int64_t n, zdp_comm_report *stats,
                                      zdp_error *err) {
    return allreduce_(buf, n, sizeof *buf, MPI_FLOAT, stats, "MPI_Allreduce(float)", err);
}

zdp_status zdp_comm_allreduce_sum_f64(double *buf, int64_t n, zdp_comm_report *stats,
                                      zdp_error *err) {
    return allreduce_(buf, n, sizeof *buf, MPI_DOUBLE, stats, "MPI_Allreduce(double)", err);
}

zdp_status zdp_comm_allreduce_sum_i64(int64_t *buf, int64_t n, zdp_comm_report *stats,
                                      zdp_error *err) {
    return allreduce_(buf, n, sizeof *buf, MPI_INT64_T, stats, "MPI_Allreduce(int64)", err);
}

zdp_status zdp_comm_reduce_scatter_f32(const float *send, float *recv, const int *recv_counts,
                                       zdp_comm_report *stats, zdp_error *err) {
    if (!mpi_ready_()) return not_ready_("MPI_Reduce_scatter", err);
    int W = zdp_dist_world_size(), r = zdp_dist_rank();
    /* MPI wants non-const send buffers in older bindings; it does not write them. */
    int rc = MPI_Reduce_scatter((void *)send, recv, recv_counts, MPI_FLOAT, MPI_SUM,
                                MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) return check_(rc, "MPI_Reduce_scatter", err);
    int64_t n = 0;
    for (int k = 0; k < W; k++) n += recv_counts[k];
    /* Ring model: every piece but our own leaves, every piece but r-1's arrives. */
    int64_t e = (int64_t)sizeof(float);
    count_(stats, ZDP_COLL_REDUCE_SCATTER, n * e, (n - recv_counts[r]) * e,
           (n - recv_counts[(r + W - 1) % W]) * e);
    return ZDP_OK;
}

/* Waits for requests without burning a core: spin briefly (shared memory
 * completes in microseconds), then test every 50 us and sleep in between.
 * The ring runs on the comm stream thread while backward computes on the
 * same cores; a busy-polling wait would take the CPU that overlap_comm
 * means to leave to compute (docs/benchmarks.md). */
static int wait_gently_(MPI_Request *req, int n) {
    int done = 0;
    for (long spin = 0; spin < 2000; spin++) {
        int rc = MPI_Testall(n, req, &done, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS || done) return rc;
    }
    const struct timespec nap = {.tv_sec = 0, .tv_nsec = 50000};
    for (;;) {
        int rc = MPI_Testall(n, req, &done, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS || done) return rc;
        nanosleep(&nap, NULL);
    }
}

zdp_status zdp_comm_arrive(zdp_error *err) {
    if (!mpi_ready_()) return not_ready_("MPI_Ibarrier", err);
    if (zdp_dist_world_size() == 1) return ZDP_OK;
    MPI_Request req;
    int rc = MPI_Ibarrier(MPI_COMM_WORLD, &req);
    if (rc != MPI_SUCCESS) return check_(rc, "MPI_Ibarrier", err);
    rc = wait_gently_(&req, 1);
    if (rc != MPI_SUCCESS) return check_(rc, "MPI_Ibarrier (wait)", err);
    return ZDP_OK;
}

zdp_status zdp_comm_ring_reduce_scatter_f32(float *buf, float *scratch, const int *recv_counts,
                                            zdp_comm_report *stats, zdp_error *err) {
    if (!mpi_ready_()) return not_ready_("ring reduce-scatter", err);
    int W = zdp_dist_world_size(), r = zdp_dist_rank();
    int64_t total = 0;
    for (int k = 0; k < W; k++) total += recv_counts[k];
    const int64_t e = (int64_t)sizeof(float);
    int64_t sent = 0, received = 0;
    const int next = (r + 1) % W, prev = (r + W - 1) % W;
    /* Step k: send the partial sum of piece (r-k-1), receive piece (r-k-2)
     * from prev and add ours into it.  After W-1 steps piece r has passed
     * through every rank and ends here complete. */
    for (int k = 0; k < W - 1; k++) {
        int s_piece = ((r - k - 1) % W + W) % W, r_piece = ((r - k - 2) % W + W) % W;
        int64_t s_off = 0, r_off = 0;
        for (int q = 0; q < s_piece; q++) s_off += recv_counts[q];
        for (int q = 0; q < r_piece; q++) r_off += recv_counts[q];
        int sc = recv_counts[s_piece], rc = recv_counts[r_piece];
        MPI_Request req[2];
        int code = MPI_Irecv(scratch, rc, MPI_FLOAT, prev, 7301, MPI_COMM_WORLD, &req[0]);
        if (code == MPI_SUCCESS)
            code = MPI_Isend(buf + s_off, sc, MPI_FLOAT, next, 7301, MPI_COMM_WORLD, &req[1]);
        if (code == MPI_SUCCESS) code = wait_gently_(req, 2);
        if (code != MPI_SUCCESS) return check_(code, "ring reduce-scatter (MPI_Isend/Irecv)", err);
        float *dst = buf + r_off;
        for (int i = 0; i < rc; i++) dst[i] += scratch[i];
        sent += sc * e;
        received += rc * e;
    }
    count_(stats, ZDP_COLL_REDUCE_SCATTER, total * e, sent, received);
    return ZDP_OK;
}

/* ---- reduce-scatter backends ---- */

static _Atomic int64_t rs_calls_[ZDP_COMM_RS_COUNT];

static zdp_status rs_ring_(float *buf, float *scratch, const int *recv_counts,
                           const float **piece, zdp_comm_report *stats, zdp_error *err) {
    atomic_fetch_add(&rs_calls_[ZDP_COMM_RS_RING], 1);
    int64_t off = 0;
    for (int q = 0; q < zdp_dist_rank(); q++) off += recv_counts[q];
    *piece = buf + off; /* the ring leaves our piece in place */
    return zdp_comm_ring_reduce_scatter_f32(buf, scratch, recv_counts, stats, err);
}

static zdp_status rs_mpi_(float *buf, float *scratch, const int *recv_counts,
                          const float **piece, zdp_comm_report *stats, zdp_error *err) {
    atomic_fetch_add(&rs_calls_[ZDP_COMM_RS_MPI], 1);
    *piece = scratch;
    return zdp_comm_reduce_scatter_f32(buf, scratch, recv_counts, stats, err);
}

/* Indexed by zdp_comm_rs_kind. */
static const zdp_comm_rs_backend rs_backends_[ZDP_COMM_RS_COUNT] = {
    {ZDP_COMM_RS_RING, "ring", rs_ring_},
    {ZDP_COMM_RS_MPI, "mpi", rs_mpi_},
};

const zdp_comm_rs_backend *zdp_comm_rs_backend_get(zdp_comm_rs_kind kind) {
    return kind >= 0 && kind < ZDP_COMM_RS_COUNT ? &rs_backends_[kind] : NULL;
}

const zdp_comm_rs_backend *zdp_comm_rs_backend_from_env(void) {
    const char *v = getenv("ZDP_REDUCE_SCATTER");
    bool mpi = v != NULL && strcmp(v, "mpi") == 0;
    return &rs_backends_[mpi ? ZDP_COMM_RS_MPI : ZDP_COMM_RS_RING];
}

int64_t zdp_comm_rs_calls(zdp_comm_rs_kind kind) {
    return kind >= 0 && kind < ZDP_COMM_RS_COUNT ? atomic_load(&rs_calls_[kind]) : 0;
}

zdp_status zdp_comm_allgatherv_inplace_f32(float *buf, const int *counts, const int *displs,
                                           zdp_comm_report *stats, zdp_error *err) {
    if (!mpi_ready_()) return not_ready_("MPI_Allgatherv", err);
    int rc = MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, counts, displs, MPI_FLOAT,
                            MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) return check_(rc, "MPI_Allgatherv", err);
    int W = zdp_dist_world_size(), r = zdp_dist_rank();
    int64_t n = 0, e = (int64_t)sizeof(float);
    for (int k = 0; k < W; k++) n += counts[k];
    /* Ring model: all pieces but r+1's leave, all but our own arrive. */
    count_(stats, ZDP_COLL_ALLGATHER, n * e, (n - counts[(r + 1) % W]) * e, (n - counts[r]) * e);
    return ZDP_OK;
}

zdp_status zdp_comm_bcast_bytes(void *buf, int64_t nbytes, zdp_comm_report *stats,
                                zdp_error *err) {
    if (!mpi_ready_()) return not_ready_("MPI_Bcast", err);
    for (int64_t off = 0; off < nbytes; off += CHUNK_) {
        int64_t c = nbytes - off < CHUNK_ ? nbytes - off : CHUNK_;
        int rc = MPI_Bcast((char *)buf + off, (int)c, MPI_BYTE, 0, MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS) return check_(rc, "MPI_Bcast", err);
    }
    bool root = zdp_dist_rank() == 0, alone = zdp_dist_world_size() == 1;
    count_(stats, ZDP_COLL_BROADCAST, nbytes, root && !alone ? nbytes : 0, root ? 0 : nbytes);
    return ZDP_OK;
}

double zdp_dist_mean(double x) {
    if (!mpi_ready_()) return x;
    double sum = 0.0;
    MPI_Allreduce(&x, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    return sum / zdp_dist_world_size();
}


/* ---- a private channel (the training server) ---------------------------------- */

struct zdp_channel {
    MPI_Comm comm;
};

struct zdp_comm_req {
    MPI_Request r;
};

zdp_status zdp_channel_open(zdp_channel **out, zdp_error *err) {
    *out = NULL;
    if (!mpi_ready_()) return not_ready_("MPI_Comm_dup", err);
    zdp_channel *ch = calloc(1, sizeof *ch);
    if (ch == NULL) return zdp_err_set(err, ZDP_ERR_NOMEM, "out of memory for a channel");
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &ch->comm);
    if (rc != MPI_SUCCESS) {
        free(ch);
        return check_(rc, "MPI_Comm_dup", err);
    }
    *out = ch;
    return ZDP_OK;
}

void zdp_channel_close(zdp_channel *ch) {
    if (ch == NULL) return;
    if (mpi_ready_()) MPI_Comm_free(&ch->comm);
    free(ch);
}

/* A request for MPI to fill, or NULL with err set. */
static zdp_comm_req *req_new_(zdp_error *err) {
    zdp_comm_req *q = malloc(sizeof *q);
    if (q == NULL) zdp_err_set(err, ZDP_ERR_NOMEM, "out of memory for a request");
    return q;
}

/* rc of the call that filled *q: on failure q is freed and *out NULL. */
static zdp_status req_started_(int rc, const char *what, zdp_comm_req *q, zdp_comm_req **out,
                               zdp_error *err) {
    if (rc != MPI_SUCCESS) {
        free(q);
        *out = NULL;
        return check_(rc, what, err);
    }
    *out = q;
    return ZDP_OK;
}

zdp_status zdp_channel_ibcast(zdp_channel *ch, void *buf, int64_t nbytes, zdp_comm_req **req,
                              zdp_error *err) {
    if (nbytes > INT_MAX)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_channel_ibcast: %lld bytes, more than INT_MAX",
                           (long long)nbytes);
    zdp_comm_req *q = req_new_(err);
    if (q == NULL) return ZDP_ERR_NOMEM;
    return req_started_(MPI_Ibcast(buf, (int)nbytes, MPI_BYTE, 0, ch->comm, &q->r), "MPI_Ibcast", q, req,
                        err);
}

zdp_status zdp_channel_bcast(zdp_channel *ch, void *buf, int64_t nbytes, zdp_error *err) {
    for (int64_t off = 0; off < nbytes; off += CHUNK_) {
        int64_t c = nbytes - off < CHUNK_ ? nbytes - off : CHUNK_;
        int rc = MPI_Bcast((char *)buf + off, (int)c, MPI_BYTE, 0, ch->comm);
        if (rc != MPI_SUCCESS) return check_(rc, "MPI_Bcast", err);
    }
    return ZDP_OK;
}

zdp_status zdp_channel_reduce_sum_f32(zdp_channel *ch, float *buf, int64_t n, zdp_error *err) {
    int rank = 0;
    MPI_Comm_rank(ch->comm, &rank);
    for (int64_t off = 0; off < n; off += CHUNK_) {
        int64_t c = n - off < CHUNK_ ? n - off : CHUNK_;
        int rc = rank == 0 ? MPI_Reduce(MPI_IN_PLACE, buf + off, (int)c, MPI_FLOAT, MPI_SUM, 0, ch->comm)
                           : MPI_Reduce(buf + off, NULL, (int)c, MPI_FLOAT, MPI_SUM, 0, ch->comm);
        if (rc != MPI_SUCCESS) return check_(rc, "MPI_Reduce", err);
    }
    return ZDP_OK;
}

zdp_status zdp_channel_gather(zdp_channel *ch, const void *mine, int64_t nbytes, void *all,
                              zdp_error *err) {
    if (nbytes > INT_MAX)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_channel_gather: %lld bytes, more than INT_MAX",
                           (long long)nbytes);
    return check_(MPI_Gather(mine, (int)nbytes, MPI_BYTE, all, (int)nbytes, MPI_BYTE, 0, ch->comm),
                  "MPI_Gather", err);
}

zdp_status zdp_channel_igather(zdp_channel *ch, const void *mine, int64_t nbytes, void *all,
                               zdp_comm_req **req, zdp_error *err) {
    if (nbytes > INT_MAX)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_channel_igather: %lld bytes, more than INT_MAX",
                           (long long)nbytes);
    zdp_comm_req *q = req_new_(err);
    if (q == NULL) return ZDP_ERR_NOMEM;
    return req_started_(MPI_Igather(mine, (int)nbytes, MPI_BYTE, all, (int)nbytes, MPI_BYTE, 0, ch->comm, &q->r),
                        "MPI_Igather", q, req, err);
}

zdp_status zdp_channel_send_int(zdp_channel *ch, int value, int dest, int tag, zdp_error *err) {
    return check_(MPI_Send(&value, 1, MPI_INT, dest, tag, ch->comm), "MPI_Send", err);
}

zdp_status zdp_channel_isend_int(zdp_channel *ch, const int *value, int dest, int tag,
                                 zdp_comm_req **req, zdp_error *err) {
    zdp_comm_req *q = req_new_(err);
    if (q == NULL) return ZDP_ERR_NOMEM;
    return req_started_(MPI_Isend(value, 1, MPI_INT, dest, tag, ch->comm, &q->r), "MPI_Isend", q, req, err);
}

zdp_status zdp_channel_irecv_int(zdp_channel *ch, int *value, int source, int tag,
                                 zdp_comm_req **req, zdp_error *err) {
    zdp_comm_req *q = req_new_(err);
    if (q == NULL) return ZDP_ERR_NOMEM;
    return req_started_(MPI_Irecv(value, 1, MPI_INT, source, tag, ch->comm, &q->r), "MPI_Irecv", q, req,
                        err);
}

zdp_status zdp_channel_poll_int(zdp_channel *ch, int tag, int *source, int *value, zdp_error *err) {
    int flag = 0;
    MPI_Status st;
    *source = -1;
    int rc = MPI_Iprobe(MPI_ANY_SOURCE, tag, ch->comm, &flag, &st);
    if (rc != MPI_SUCCESS) return check_(rc, "MPI_Iprobe", err);
    if (!flag) return ZDP_OK;
    rc = MPI_Recv(value, 1, MPI_INT, st.MPI_SOURCE, tag, ch->comm, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return check_(rc, "MPI_Recv", err);
    *source = st.MPI_SOURCE;
    return ZDP_OK;
}

zdp_status zdp_comm_test(zdp_comm_req *req, bool *done, zdp_error *err) {
    int flag = 0;
    int rc = MPI_Test(&req->r, &flag, MPI_STATUS_IGNORE);
    *done = false;
    if (rc != MPI_SUCCESS) return check_(rc, "MPI_Test", err);
    if (flag) {
        free(req);
        *done = true;
    }
    return ZDP_OK;
}

zdp_status zdp_comm_wait(zdp_comm_req *req, zdp_error *err) {
    int rc = MPI_Wait(&req->r, MPI_STATUS_IGNORE);
    free(req);
    return check_(rc, "MPI_Wait", err);
}

zdp_status zdp_comm_cancel(zdp_comm_req *req, zdp_error *err) {
    int rc = MPI_Cancel(&req->r);
    if (rc != MPI_SUCCESS) {
        free(req);
        return check_(rc, "MPI_Cancel", err);
    }
    return zdp_comm_wait(req, err);
}

void zdp_comm_req_free(zdp_comm_req *req) {
    if (req == NULL) return;
    MPI_Request_free(&req->r);
    free(req);
}
