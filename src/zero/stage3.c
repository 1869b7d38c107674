/*
 * stage3.c -- ZeRO stage 3 (docs/deepspeed.md §4.8): each rank keeps only its
 * partition of the parameters, and the model's zdp_param_fetch gathers a
 * layer on the comm stream while it runs (zero.h, "stage 3").
 *
 * What fetch hands out: a live gather of the asked range, a range kept
 * gathered for a reuse the trace shows soon, a prefetched range (queued
 * ahead in the order the first pass of each kind recorded), or the
 * persistent copies of the small tensors, which stay whole on every rank
 * and are gathered again after each change of the partition.  Release frees
 * a range unless it is reused soon; the end of a pass frees the rest.
 *
 * Agreement (docs/deepspeed.md §4.9): every collective inside a stage-3
 * pass first all-reduces one row per rank, {kind, a, b}, and runs only when
 * every row says the same, so one rank's failure (an allocation, a model
 * that stops early or fetches something else) fails the operation on every
 * rank instead of leaving the others in a collective it never enters.
 * Every pass ends with the END agreement, repeated until every rank has
 * ended its pass, so every rank leaves it with the same verdict.
 *
 * Frozen weights (frozen.c) have a stage-3 state of their own, attached to
 * the engine's: their passes begin and end inside the engine's, and the live
 * bound and the peak count both.  Not here: the gradient reductions
 * (buckets.c), the layout (layout.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zero.h"

enum { ROW_GATHER = 1, ROW_NOMEM = 2, ROW_REDUCE = 3, ROW_END = 4 };
#define ROW_N ZDP_STAGE3_ROW_N

/* ---- agreement (stream thread) ---------------------------------------------- */

/* This rank's row {kind, a, b} and every other rank's, summed into s->rows
 * (each rank fills its own row, zeros elsewhere).  One rank alone has
 * nothing to agree with. */
static zdp_status rows_exchange_(zdp_stage3 *s, int64_t kind, int64_t a, int64_t b,
                                 zdp_error *err) {
    memset(s->rows, 0, (size_t)(ROW_N * s->link->world) * sizeof(int64_t));
    int64_t *mine = s->rows + ROW_N * s->link->rank;
    mine[0] = kind;
    mine[1] = a;
    mine[2] = b;
    if (s->link->world == 1) return ZDP_OK;
    return zdp_comm_allreduce_sum_i64(s->rows, ROW_N * s->link->world, s->link->stats, err);
}

/* The first rank whose row is not {kind, a, b}, or -1. */
static int rows_differ_(const zdp_stage3 *s, int64_t kind, int64_t a, int64_t b) {
    for (int r = 0; r < s->link->world; r++) {
        const int64_t *row = s->rows + ROW_N * r;
        if (row[0] != kind || row[1] != a || row[2] != b) return r;
    }
    return -1;
}

zdp_status zdp_stage3_agree_reduce(zdp_stage3 *s, int bucket, bool *go, zdp_error *err) {
    *go = true;
    zdp_status st = rows_exchange_(s, ROW_REDUCE, bucket, 0, err);
    if (st != ZDP_OK) return st;
    if (rows_differ_(s, ROW_REDUCE, bucket, 0) >= 0) {
        s->pass_bad = true;
        *go = false;
    }
    return ZDP_OK;
}

/* The end-of-pass agreement.  The flag: 2 this rank's model failed, 1 a
 * collective of its pass disagreed, 0 clean. */
static zdp_status pass_end_op_(void *arg, zdp_error *err) {
    zdp_stage3 *s = *(zdp_stage3 *const *)arg;
    const bool bad = s->pass_bad || (s->frozen != NULL && s->frozen->pass_bad);
    if (s->frozen != NULL) s->frozen->pass_bad = false; /* carried by this row */
    zdp_status st = rows_exchange_(s, ROW_END, s->end_model_failed ? 2 : bad ? 1 : 0, 0, err);
    if (st != ZDP_OK) return st;
    s->end_done = true;
    s->end_fail_rank = -1;
    s->end_fail_flag = 0;
    for (int r = 0; r < s->link->world; r++) {
        const int64_t *row = s->rows + ROW_N * r;
        if (row[0] != ROW_END) s->end_done = false;
        else if (row[1] > s->end_fail_flag) {
            s->end_fail_rank = r;
            s->end_fail_flag = (int)row[1];
        }
    }
    /* A rank still in its pass: this one says so again until it ends. */
    s->pass_bad = !s->end_done;
    return ZDP_OK;
}

static uint64_t queue_pass_end_(zdp_stage3 *s) {
    return zdp_stream_enqueue(s->link->stream, pass_end_op_, &s, sizeof s);
}

/* ---- gathers -------------------------------------------------------------- */

typedef struct gather_op {
    zdp_stage3 *s;
    float *buf;
    int64_t lo, hi;
    int slot;
} gather_op;

/* The flat range [lo, hi) whole into buf (hi - lo floats): each rank puts
 * in the piece its partition holds, then one all-gather. */
static zdp_status gather_range_(void *arg, zdp_error *err) {
    const gather_op *op = arg;
    zdp_stage3 *s = op->s;
    float *buf = op->buf;
    const int64_t lo = op->lo, hi = op->hi;
    const int slot = op->slot;
    const int64_t P = s->link->lay->part;
    /* Every rank gathers, or none does: a rank without a buffer (or one
     * asking for another range, or already at the end of its pass) makes
     * the verdict bad on every rank, and the one who waits for it reports. */
    gather_verdict *v = &s->verdicts[slot];
    zdp_status ast = rows_exchange_(s, buf != NULL ? ROW_GATHER : ROW_NOMEM, lo, hi, err);
    if (ast != ZDP_OK) return ast;
    v->bad_rank = rows_differ_(s, ROW_GATHER, lo, hi);
    if (v->bad_rank >= 0) {
        memcpy(v->row, s->rows + ROW_N * v->bad_rank, sizeof v->row);
        /* Out of memory on a rank is agreed on; anything else means the
         * ranks' passes went apart. */
        if (v->row[0] != ROW_NOMEM || v->row[1] != lo || v->row[2] != hi) s->pass_bad = true;
        return ZDP_OK;
    }
    for (int r = 0; r < s->link->world; r++) {
        int64_t a = lo > r * P ? lo : r * P, b = hi < (r + 1) * P ? hi : (r + 1) * P;
        s->link->ag_counts[r] = b > a ? (int)(b - a) : 0;
        s->link->ag_displs[r] = b > a ? (int)(a - lo) : 0;
    }
    const int64_t plo = (int64_t)s->link->rank * P;
    const int64_t a = lo > plo ? lo : plo;
    if (s->link->ag_counts[s->link->rank] > 0)
        memcpy(buf + s->link->ag_displs[s->link->rank], s->link->params + (a - plo),
               (size_t)s->link->ag_counts[s->link->rank] * sizeof(float));
    if (s->link->world == 1) return ZDP_OK;
    return zdp_comm_allgatherv_inplace_f32(buf, s->link->ag_counts, s->link->ag_displs,
                                           s->link->stats, err);
}

/* Queues the agreed gather of the flat range [lo, hi) into buf (NULL when
 * this rank could not allocate it); *slot gets its verdict's slot. */
static uint64_t gather_queue_(zdp_stage3 *s, float *buf, int64_t lo, int64_t hi, int *slot) {
    *slot = (int)(s->gather_seq++ % s->n_verdicts);
    gather_op op = {.s = s, .buf = buf, .lo = lo, .hi = hi, .slot = *slot};
    return zdp_stream_enqueue(s->link->stream, gather_range_, &op, sizeof op);
}

/* A gather buffer: counted memory, except where the test hook
 * (ZDP_TEST_FAIL_GATHER) makes this rank's N-th allocation fail. */
static float *gather_alloc_(zdp_stage3 *s, int64_t n) {
    s->gather_allocs++;
    if (s->link->rank == s->fail_rank && s->gather_allocs == s->fail_nth) return NULL;
    return zdp_alloc(s->link->mem, ZDP_MEM_GATHERED, (size_t)n * sizeof(float));
}

static const char *pass_name_(const zdp_stage3 *s) {
    return s->pass_kind == ZDP_PASS_BACKWARD ? "backward()" : "forward()";
}

/* The error of a gather whose verdict is bad, the same story on every
 * rank; what: the call that asked for it (names the tensors). */
static zdp_status verdict_error_(const zdp_stage3 *s, int slot, const char *what, int64_t lo,
                                 int64_t hi, zdp_error *err) {
    const gather_verdict *v = &s->verdicts[slot];
    if (v->bad_rank < 0) return ZDP_OK;
    const int64_t *row = v->row;
    if (row[0] == ROW_NOMEM && row[1] == lo && row[2] == hi)
        return zdp_err_set(err, ZDP_ERR_NOMEM,
                           "%s: rank %d cannot allocate %lld bytes to gather it (ZeRO stage 3); "
                           "no rank gathered, this %s stops here on every rank and nothing was "
                           "changed (lower stage3_prefetch_bucket_size or "
                           "stage3_max_live_parameters, or use more ranks)",
                           what, v->bad_rank, (long long)((hi - lo) * 4), pass_name_(s));
    if (row[0] == ROW_END)
        return zdp_err_set(err, ZDP_ERR_STATE,
                           "%s: rank %d has already ended this %s (its model stopped early; its "
                           "own error says why) while this rank asked to gather flat elements "
                           "[%lld, %lld); this %s stops here on every rank",
                           what, v->bad_rank, pass_name_(s), (long long)lo, (long long)hi,
                           pass_name_(s));
    if (row[0] == ROW_REDUCE)
        return zdp_err_set(err, ZDP_ERR_STATE,
                           "%s: rank %d was reducing gradient bucket %lld where this rank gathers "
                           "flat elements [%lld, %lld): the ranks' models fetch different layers "
                           "or in a different order (every rank must run the same model code); "
                           "this %s stops here on every rank",
                           what, v->bad_rank, (long long)row[1], (long long)lo, (long long)hi,
                           pass_name_(s));
    return zdp_err_set(err, ZDP_ERR_STATE,
                       "%s: rank %d gathered flat elements [%lld, %lld) where this rank gathers "
                       "[%lld, %lld): the ranks' models fetch different layers or in a different "
                       "order (every rank must run the same model code); this %s stops here on "
                       "every rank",
                       what, v->bad_rank, (long long)row[1], (long long)row[2], (long long)lo,
                       (long long)hi, pass_name_(s));
}

/* The persistent tensors whole again after their partitions
 * changed (an update, set_param, a checkpoint load): one gather per run of
 * consecutive persistent tensors.  Every rank gets here alike (the calls
 * that make it stale are made on every rank). */
static zdp_status persist_refresh_(zdp_stage3 *s, zdp_error *err) {
    const zdp_layout *lay = s->link->lay;
    if (!s->persist_stale) return ZDP_OK;
    const int nt = lay->n_tensors;
    uint64_t last = 0;
    for (int i = 0; i < nt;) {
        if (s->persist_off[i] < 0) {
            i++;
            continue;
        }
        int j = i, slot;
        while (j + 1 < nt && s->persist_off[j + 1] >= 0) j++;
        last = gather_queue_(s, s->persist + s->persist_off[i], lay->offsets[i],
                             lay->offsets[j] + lay->numels[j], &slot);
        i = j + 1;
    }
    zdp_status st = last > 0 ? zdp_zero_wait(s->link, last, err) : ZDP_OK;
    /* The runs' verdicts, in order (each run took the next slot). */
    int64_t seq = s->gather_seq;
    for (int i = nt - 1; st == ZDP_OK && i >= 0;) {
        if (s->persist_off[i] < 0) {
            i--;
            continue;
        }
        int j = i;
        while (j - 1 >= 0 && s->persist_off[j - 1] >= 0) j--;
        const int slot = (int)(--seq % s->n_verdicts);
        char what[320];
        snprintf(what, sizeof what, "persistent parameters %s..%s", s->link->info[j].name,
                 s->link->info[i].name);
        st = verdict_error_(s, slot, what, lay->offsets[j], lay->offsets[i] + lay->numels[i],
                            err);
        i = j - 1;
    }
    if (st == ZDP_OK) s->persist_stale = false;
    return st;
}

/* Elements gathered now (fetched, prefetched, kept for reuse), of the
 * parameters and of the frozen weights together: the live bound and the
 * peak cover both. */
static int64_t live_elems_(const zdp_stage3 *s) {
    const zdp_stage3 *root = s->parent != NULL ? s->parent : s;
    return root->gathered_elems + (root->frozen != NULL ? root->frozen->gathered_elems : 0);
}

/* ---- prefetch and reuse ---------------------------------------------------- */

static void rec_free_(zdp_stage3 *s, int k);

/* Frees one range kept for reuse (refs == 0), the most recent; false when
 * none is kept. */
static bool reuse_evict_one_(zdp_stage3 *s) {
    for (int k = s->n_recs - 1; k >= 0; k--)
        if (s->recs[k].refs == 0) {
            rec_free_(s, k);
            return true;
        }
    return false;
}

static int64_t extent_(const zdp_stage3 *s, int first, int count) {
    const zdp_layout *lay = s->link->lay;
    const int last = first + count - 1;
    return lay->offsets[last] + lay->numels[last] - lay->offsets[first];
}

static void peak_update_(zdp_stage3 *s) {
    zdp_stage3 *root = s->parent != NULL ? s->parent : s;
    const int64_t now = live_elems_(s) * (int64_t)sizeof(float);
    if (now > root->gathered_peak) root->gathered_peak = now;
}

static void gathered_free_(zdp_stage3 *s, float *buf, int64_t elems) {
    s->gathered_elems -= elems;
    zdp_free(s->link->mem, ZDP_MEM_GATHERED, buf, (size_t)elems * sizeof(float));
}

/* Drops prefetch k (its gather has run or the stream has stopped); its
 * buffer is freed unless it became a live fetch's. */
static void pf_remove_(zdp_stage3 *s, int k, bool free_buf) {
    gather_rec *r = &s->pf[k];
    for (int i = r->first; i < r->first + r->count; i++) s->pf_of[i] = -1;
    s->pf_elems -= r->elems;
    if (free_buf) gathered_free_(s, r->buf, r->elems);
    for (int j = k; j + 1 < s->n_pf; j++) {
        s->pf[j] = s->pf[j + 1];
        for (int i = s->pf[j].first; i < s->pf[j].first + s->pf[j].count; i++) s->pf_of[i] = j;
    }
    s->n_pf--;
}

/* Every prefetch not asked for: waited for (its buffer is being written on
 * the stream) and freed.  wait = false once the stream is gone (destroy). */
static void pf_cancel_all_(zdp_stage3 *s, bool wait) {
    while (s->n_pf > 0) {
        if (wait) {
            zdp_error ignored = {0};
            (void)zdp_stream_wait(s->link->stream, s->pf[s->n_pf - 1].event, &ignored);
        }
        pf_remove_(s, s->n_pf - 1, true);
    }
}

/* One fetch against the pass's trace: recorded on the first pass of its
 * kind, compared on later ones (a different fetch ends prefetching for the
 * rest of the pass). */
static void trace_note_(zdp_stage3 *s, int first, int count) {
    fetch_trace *t = &s->trace[s->pass_kind];
    if (!t->done) {
        if (t->len < t->cap) {
            t->first[t->len] = first;
            t->count[t->len] = count;
            t->len++;
        }
        return;
    }
    if (s->trace_ok && s->trace_pos < t->len && t->first[s->trace_pos] == first &&
        t->count[s->trace_pos] == count)
        s->trace_pos++;
    else
        s->trace_ok = false;
}

/* Queues the gathers of the next trace entries, ahead of the model, while
 * the prefetched elements stay within stage3_prefetch_bucket_size and all
 * gathered ones within stage3_max_live_parameters.  Every rank runs the same
 * model code, so every rank queues the same gathers in the same order: the
 * decision reads only counts every rank keeps alike (gathered_elems counts a
 * buffer that failed to allocate too), and a rank without its buffer still
 * queues the gather, whose agreement then fails on every rank (the model's
 * fetch of it reports). */
static void prefetch_more_(zdp_stage3 *s) {
    const zdp_layout *lay = s->link->lay;
    const fetch_trace *t = &s->trace[s->pass_kind];
    const zdp_zero_config *z = s->link->cfg;
    if (z->stage3_prefetch_bucket_size <= 0 || !t->done || !s->trace_ok) return;
    if (s->next_pf < s->trace_pos) s->next_pf = s->trace_pos;
    while (s->next_pf < t->len) {
        const int f = t->first[s->next_pf], c = t->count[s->next_pf];
        bool skip = true; /* all persistent, or already live or prefetched */
        for (int i = f; i < f + c; i++) {
            if (s->live_of[i] >= 0 || s->pf_of[i] >= 0) {
                skip = true;
                break;
            }
            if (s->persist_off[i] < 0) skip = false;
        }
        if (skip) {
            s->next_pf++;
            continue;
        }
        const int64_t n = extent_(s, f, c);
        if (s->pf_elems + n > z->stage3_prefetch_bucket_size) return;
        /* Ranges kept for reuse give way to the prefetch of what comes
         * next (every rank keeps and evicts alike). */
        while (live_elems_(s) + n > z->stage3_max_live_parameters && reuse_evict_one_(s)) {
        }
        if (live_elems_(s) + n > z->stage3_max_live_parameters) return;
        gather_rec *r = &s->pf[s->n_pf];
        *r = (gather_rec){.first = f, .count = c, .buf = gather_alloc_(s, n), .elems = n};
        r->event = gather_queue_(s, r->buf, lay->offsets[f], lay->offsets[f] + n, &r->slot);
        for (int i = f; i < f + c; i++) s->pf_of[i] = s->n_pf;
        s->n_pf++;
        s->pf_elems += n;
        s->gathered_elems += n;
        s->next_pf++;
        peak_update_(s);
    }
}

/* "zdp_param_fetch(first, count) (name..name)" for errors. */
static void fetch_what_(const zdp_stage3 *s, int first, int count, char *out, size_t cap) {
    const zdp_param_info *pi = s->link->info;
    snprintf(out, cap, "zdp_param_fetch(%d, %d) (%s..%s)", first, count, pi[first].name,
             pi[first + count - 1].name);
}

/* A prefetched range the model asks for becomes live. */
static zdp_status pf_take_(zdp_stage3 *s, int k, zdp_error *err) {
    const zdp_layout *lay = s->link->lay;
    gather_rec p = s->pf[k];
    zdp_status st = zdp_zero_wait(s->link, p.event, err);
    const int64_t lo = lay->offsets[p.first];
    if (st == ZDP_OK) {
        char what[320];
        fetch_what_(s, p.first, p.count, what, sizeof what);
        st = verdict_error_(s, p.slot, what, lo, lo + p.elems, err);
    }
    pf_remove_(s, k, st != ZDP_OK);
    if (st != ZDP_OK) return st;
    p.refs = 1;
    s->recs[s->n_recs] = p;
    for (int i = p.first; i < p.first + p.count; i++) {
        s->live_of[i] = s->n_recs;
        if (s->persist_off[i] < 0) s->table[i] = p.buf + (lay->offsets[i] - lo);
    }
    s->n_recs++;
    s->prefetch_hits++;
    return ZDP_OK;
}

/* Stage 3's fetch: the same live range again, the persistent copies, a
 * prefetched range, or a new gather of the range's flat extent. */
static zdp_status fetch3_(zdp_stage3 *s, int first, int count, zdp_error *err) {
    const zdp_layout *lay = s->link->lay;
    const zdp_param_info *pi = s->link->info;
    if (!s->in_pass)
        return zdp_err_set(err, ZDP_ERR_STATE,
                           "zdp_param_fetch(%d, %d) (%s): outside the model's forward or "
                           "backward; at ZeRO stage 3 parameters are gathered only while the "
                           "engine runs the model",
                           first, count, pi[first].name);
    const int last = first + count - 1;
    trace_note_(s, first, count);
    int k = s->pf_of[first];
    if (k >= 0 && s->pf[k].first == first && s->pf[k].count == count) {
        zdp_status st = pf_take_(s, k, err);
        if (st == ZDP_OK) prefetch_more_(s);
        return st;
    }
    for (int i = first; i <= last; i++)
        if (s->pf_of[i] >= 0) { /* the model left the trace: drop what was gathered ahead */
            pf_cancel_all_(s, true);
            s->trace_ok = false;
            break;
        }
    int rec = s->live_of[first];
    if (rec >= 0 && s->recs[rec].first == first && s->recs[rec].count == count) {
        if (s->recs[rec].refs++ == 0) {
            s->reuse_hits++;
            prefetch_more_(s);
        }
        return ZDP_OK;
    }
    bool all_persistent = true;
    for (int i = first; i <= last; i++) {
        if (s->live_of[i] >= 0 && s->recs[s->live_of[i]].refs == 0)
            rec_free_(s, s->live_of[i]); /* kept for reuse, overlapped: gather anew */
        if (s->live_of[i] >= 0) {
            const gather_rec *r = &s->recs[s->live_of[i]];
            return zdp_err_set(err, ZDP_ERR_STATE,
                               "zdp_param_fetch(%d, %d): tensor %d (%s) is live in the fetch of "
                               "[%d, %d); fetch exactly that range again or release it first",
                               first, count, i, pi[i].name, r->first, r->first + r->count);
        }
        if (s->persist_off[i] < 0) all_persistent = false;
    }
    zdp_status st = persist_refresh_(s, err);
    if (st != ZDP_OK) return st;
    if (all_persistent) {
        prefetch_more_(s);
        return ZDP_OK;
    }
    /* Without its buffer this rank still takes part in the gather's
     * agreement, so every rank fails here together. */
    const int64_t lo = lay->offsets[first], hi = lay->offsets[last] + lay->numels[last];
    gather_rec *r = &s->recs[s->n_recs];
    *r = (gather_rec){.first = first, .count = count, .refs = 1, .elems = hi - lo};
    r->buf = gather_alloc_(s, r->elems);
    s->gathered_elems += r->elems;
    int slot;
    st = zdp_zero_wait(s->link, gather_queue_(s, r->buf, lo, hi, &slot), err);
    if (st == ZDP_OK) {
        char what[320];
        fetch_what_(s, first, count, what, sizeof what);
        st = verdict_error_(s, slot, what, lo, hi, err);
    }
    if (st != ZDP_OK) {
        gathered_free_(s, r->buf, r->elems);
        return st;
    }
    for (int i = first; i <= last; i++) {
        s->live_of[i] = s->n_recs;
        if (s->persist_off[i] < 0) s->table[i] = r->buf + (lay->offsets[i] - lo);
    }
    s->n_recs++;
    peak_update_(s);
    prefetch_more_(s);
    return ZDP_OK;
}

zdp_status zdp_param_fetch(zdp_param_source *src, int first, int count,
                           const float *const **table, zdp_error *err) {
    if (table != NULL) *table = NULL;
    if (src == NULL || table == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_param_fetch: src and table must be set");
    const int n = src->s3 != NULL ? src->s3->link->lay->n_tensors : src->n_dense;
    if (first < 0 || count < 1 || first > n - count)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "zdp_param_fetch: tensors [%d, %d + %d) out of the model's %d; the "
                           "model asked for a layer it does not have",
                           first, first, count, n);
    if (src->s3 == NULL) {
        *table = src->dense;
        return ZDP_OK;
    }
    zdp_stage3 *s = src->s3;
    zdp_status st = fetch3_(s, first, count, err);
    if (st == ZDP_OK) *table = s->table;
    return st;
}

/* Frees record k (moving the last record into its slot). */
static void rec_free_(zdp_stage3 *s, int k) {
    gather_rec *r = &s->recs[k];
    for (int i = r->first; i < r->first + r->count; i++) {
        s->live_of[i] = -1;
        s->table[i] = s->persist_off[i] >= 0 ? s->persist + s->persist_off[i] : NULL;
    }
    gathered_free_(s, r->buf, r->elems);
    const int lastk = --s->n_recs;
    if (k != lastk) {
        s->recs[k] = s->recs[lastk];
        for (int i = s->recs[k].first; i < s->recs[k].first + s->recs[k].count; i++)
            s->live_of[i] = k;
    }
}

/* stage3_max_reuse_distance (DeepSpeed's rule, docs/deepspeed.md §4.8): a
 * range the model releases stays gathered when the pass's trace fetches it
 * again before more than that many elements of other fetches, and the
 * gathered elements stay within stage3_max_live_parameters.  Only a pass
 * that replays its trace knows what comes next. */
static bool reuse_soon_(const zdp_stage3 *s, int k) {
    const zdp_zero_config *z = s->link->cfg;
    const fetch_trace *t = &s->trace[s->pass_kind];
    const gather_rec *r = &s->recs[k];
    if (z->stage3_max_reuse_distance <= 0 || !t->done || !s->trace_ok) return false;
    if (live_elems_(s) > z->stage3_max_live_parameters) return false;
    int64_t dist = 0;
    for (int p = s->trace_pos; p < t->len; p++) {
        if (t->first[p] == r->first && t->count[p] == r->count) return true;
        dist += extent_(s, t->first[p], t->count[p]);
        if (dist > z->stage3_max_reuse_distance) return false;
    }
    return false;
}

void zdp_param_release(zdp_param_source *src, int first, int count) {
    if (src == NULL || src->s3 == NULL) return;
    zdp_stage3 *s = src->s3;
    if (first < 0 || count < 1 || first > s->link->lay->n_tensors - count) return;
    const int k = s->live_of[first];
    /* A release that matches no live fetch (or a persistent range) has
     * nothing to free. */
    if (k < 0 || s->recs[k].first != first || s->recs[k].count != count ||
        s->recs[k].refs == 0)
        return;
    if (--s->recs[k].refs == 0 && !reuse_soon_(s, k)) rec_free_(s, k);
}

/* Before the model's forward or backward: the persistent tensors
 * are brought up to date (the fetches may all be served by prefetches), the
 * trace of this kind of pass starts over, and its first gathers are queued
 * at once. */
zdp_status zdp_stage3_pass_begin(zdp_stage3 *s, int kind, zdp_error *err) {
    s->in_pass = true;
    if (s->recs == NULL) return ZDP_OK;
    s->pass_kind = kind;
    s->trace_recording = !s->trace[kind].done;
    s->trace_pos = 0;
    s->next_pf = 0;
    s->trace_ok = true;
    zdp_status st = persist_refresh_(s, err);
    if (st == ZDP_OK) prefetch_more_(s);
    if (st == ZDP_OK && s->frozen != NULL && s->frozen_borrowed) {
        /* A shared store runs its gathers on the stream of the engine whose
         * pass this is.  Its borrowers never run at once (zdp serve runs one
         * job at a time, every rank in the same order): a store already in a
         * pass means a caller broke that rule. */
        if (s->frozen->in_pass)
            st = zdp_err_set(err, ZDP_ERR_STATE,
                             "%s: the shared frozen store is inside another engine's pass; "
                             "engines borrowing one store must run one at a time",
                             pass_name_(s));
        else {
            s->frozen->parent = s;
            s->frozen->link->stream = s->link->stream;
        }
    }
    if (st == ZDP_OK && s->frozen != NULL) st = zdp_stage3_pass_begin(s->frozen, kind, err);
    return st;
}

/* After the model's forward or backward: what it left live goes back, and
 * so does whatever was prefetched for it and not asked for.  wait = false
 * only once the stream is gone (destroy). */
static void pass_end_wait_(zdp_stage3 *s, bool wait) {
    s->in_pass = false;
    if (s->recs == NULL) return;
    pf_cancel_all_(s, wait);
    while (s->n_recs > 0) rec_free_(s, s->n_recs - 1);
    s->trace[s->pass_kind].done = true;
    if (s->frozen != NULL && (!s->frozen_borrowed || s->frozen->parent == s))
        pass_end_wait_(s->frozen, wait);
}

void zdp_stage3_pass_end(zdp_stage3 *s) { pass_end_wait_(s, true); }

/* After a pass (and, in backward, after its last reductions were
 * queued): the end-of-pass agreement, repeated until every rank has ended
 * its pass.  A rank still gathering or reducing meets an END row, so its
 * operation fails and its model stops; then it comes here too.  Returns
 * the model's own status, or, where the model succeeded here but the pass
 * failed on another rank (or a collective disagreed), an error naming that
 * rank: every rank leaves with the same verdict. */
zdp_status zdp_stage3_pass_agree(zdp_stage3 *s, zdp_status model_st, zdp_error *err) {
    if (s->recs == NULL) return model_st;
    if (s->frozen != NULL) { /* the frozen weights' gather waits count as this engine's */
        *s->link->wait_s += *s->frozen->link->wait_s;
        *s->frozen->link->wait_s = 0.0;
    }
    s->end_model_failed = model_st != ZDP_OK;
    s->end_fail_rank = -1;
    while (s->link->world > 1) {
        zdp_error werr = {0};
        zdp_status st = zdp_zero_wait(s->link, queue_pass_end_(s), &werr);
        if (st != ZDP_OK) {
            if (model_st != ZDP_OK) return model_st;
            if (err != NULL) *err = werr;
            return st;
        }
        if (s->end_done) break;
    }
    if (model_st == ZDP_OK && s->end_fail_rank < 0) return ZDP_OK;
    /* A failed first pass recorded a trace that may differ between the
     * ranks (one stopped early, or fetched something else): record it again
     * on the next pass, on every rank alike. */
    for (zdp_stage3 *x = s; x != NULL; x = x->frozen)
        if (x->trace_recording) {
            x->trace[x->pass_kind].len = 0;
            x->trace[x->pass_kind].done = false;
        }
    if (model_st != ZDP_OK) return model_st;
    if (s->end_fail_flag == 2)
        return zdp_err_set(err, ZDP_ERR_STATE,
                           "%s: the model failed on rank %d (its own error says why); at ZeRO "
                           "stage 3 the ranks gather together, so this %s fails on every rank",
                           pass_name_(s), s->end_fail_rank, pass_name_(s));
    return zdp_err_set(err, ZDP_ERR_STATE,
                       "%s: the ranks' stage-3 gathers and reductions went apart (rank %d saw "
                       "it; the ranks' models fetched different layers or in a different order), "
                       "so this %s fails on every rank",
                       pass_name_(s), s->end_fail_rank, pass_name_(s));
}
/* ---- the param source ------------------------------------------------------ */

zdp_param_source *zdp_param_source_create_dense(const float *const *params, int n_params) {
    zdp_param_source *s = calloc(1, sizeof *s);
    if (s != NULL) {
        s->dense = params;
        s->n_dense = n_params;
    }
    return s;
}

/* ---- the rest of the interface ---------------------------------------------- */

zdp_status zdp_stage3_get_tensor(zdp_stage3 *s, int i, float *out, zdp_error *err) {
    const zdp_layout *lay = s->link->lay;
    const int64_t lo = lay->offsets[i], n = lay->numels[i];
    int slot;
    zdp_status st = zdp_zero_wait(s->link, gather_queue_(s, out, lo, lo + n, &slot), err);
    if (st != ZDP_OK) return st;
    char what[300];
    snprintf(what, sizeof what, "zdp_engine_get_param(%d) (%s)", i, s->link->info[i].name);
    return verdict_error_(s, slot, what, lo, lo + n, err);
}

void zdp_stage3_params_changed(zdp_stage3 *s) { s->persist_stale = true; }

void zdp_stage3_attach_frozen(zdp_stage3 *s, zdp_stage3 *frozen, bool borrowed) {
    s->frozen = frozen;
    s->frozen_borrowed = borrowed;
    if (!borrowed) frozen->parent = s;
}

/* ---- init / free --------------------------------------------------------------- */

static zdp_status alloc_(const zdp_zero_link *k, void *out, int64_t count, size_t size,
                         zdp_mem_category cat, const char *what, zdp_error *err) {
    void *p = zdp_alloc(k->mem, cat, (size_t)count * size);
    *(void **)out = p;
    if (p == NULL)
        return zdp_err_set(err, ZDP_ERR_NOMEM, "%s: cannot allocate %lld bytes on rank %d", what,
                           (long long)(count * (int64_t)size), k->rank);
    return ZDP_OK;
}

/* Stage 3's fetch tables and the persistent tensors: those with fewer
 * elements than stage3_param_persistence_threshold stay whole on every rank
 * (DeepSpeed keeps small tensors such as biases and norms out of the
 * per-layer gathers). */
zdp_status zdp_stage3_init(zdp_stage3 *s, zdp_zero_link *k, const char *fail_hook,
                           zdp_error *err) {
    s->link = k;
    const int nt = k->lay->n_tensors;
    zdp_status st;
    if ((st = alloc_(k, &s->table, nt, sizeof(float *), ZDP_MEM_OTHER, "stage 3", err)) ||
        (st = alloc_(k, &s->live_of, nt, sizeof(int), ZDP_MEM_OTHER, "stage 3", err)) ||
        (st = alloc_(k, &s->recs, nt, sizeof(gather_rec), ZDP_MEM_OTHER, "stage 3", err)) ||
        (st = alloc_(k, &s->persist_off, nt, sizeof(int64_t), ZDP_MEM_OTHER, "stage 3", err)) ||
        (st = alloc_(k, &s->pf, nt, sizeof(gather_rec), ZDP_MEM_OTHER, "stage 3", err)) ||
        (st = alloc_(k, &s->pf_of, nt, sizeof(int), ZDP_MEM_OTHER, "stage 3", err)) ||
        (st = alloc_(k, &s->rows, ROW_N * (int64_t)k->world, sizeof(int64_t), ZDP_MEM_OTHER,
                     "stage 3", err)))
        return st;
    /* One verdict per gather in flight: at most every prefetch (one per
     * tensor) and the model's own fetch, or one per persistent run. */
    s->n_verdicts = 2 * nt + 8;
    if ((st = alloc_(k, &s->verdicts, s->n_verdicts, sizeof(gather_verdict), ZDP_MEM_OTHER,
                     "stage 3", err)))
        return st;
    /* The test hook: "RANK:N" makes this state's N-th gather buffer on
     * RANK fail to allocate (ZDP_TEST_FAIL_GATHER for an engine's
     * parameters, tests/dist/test_zero3_faults.c; ZDP_TEST_FAIL_FROZEN_GATHER
     * for frozen weights, tests/serve/zero3_lora_check.py). */
    s->fail_rank = -1;
    const char *hook = getenv(fail_hook);
    if (hook != NULL) {
        long long r = -1, n = 0;
        if (sscanf(hook, "%lld:%lld", &r, &n) == 2 && r >= 0 && n > 0) {
            s->fail_rank = (int)r;
            s->fail_nth = n;
        }
    }
    /* A model fetches each tensor a few times per pass (GPT-2's wte twice
     * in forward); a longer pass is traced up to the cap, and prefetch
     * follows the part recorded. */
    for (int t = 0; t < 2; t++) {
        s->trace[t].cap = 4 * nt + 16;
        if ((st = alloc_(k, &s->trace[t].first, s->trace[t].cap, sizeof(int), ZDP_MEM_OTHER,
                         "stage 3", err)) ||
            (st = alloc_(k, &s->trace[t].count, s->trace[t].cap, sizeof(int), ZDP_MEM_OTHER,
                         "stage 3", err)))
            return st;
    }
    const int64_t thr = k->cfg->stage3_param_persistence_threshold;
    for (int i = 0; i < nt; i++) {
        s->live_of[i] = -1;
        s->pf_of[i] = -1;
        s->persist_off[i] = -1;
        if (k->lay->numels[i] < thr) {
            s->persist_off[i] = s->persist_elems;
            s->persist_elems += k->lay->numels[i];
        }
    }
    if (s->persist_elems > 0 &&
        (st = alloc_(k, &s->persist, s->persist_elems, sizeof(float), ZDP_MEM_GATHERED,
                     "persistent parameters", err)))
        return st;
    for (int i = 0; i < nt; i++)
        if (s->persist_off[i] >= 0) s->table[i] = s->persist + s->persist_off[i];
    s->persist_stale = true;
    return ZDP_OK;
}

void zdp_stage3_free(zdp_stage3 *s) {
    const zdp_zero_link *k = s->link;
    if (k == NULL) return;
    pass_end_wait_(s, false); /* the stream has run everything */
    zdp_mem_counter *mem = k->mem;
    const size_t nt = (size_t)k->lay->n_tensors;
    zdp_free(mem, ZDP_MEM_GATHERED, s->persist, (size_t)s->persist_elems * sizeof(float));
    zdp_free(mem, ZDP_MEM_OTHER, s->table, nt * sizeof(float *));
    zdp_free(mem, ZDP_MEM_OTHER, s->live_of, nt * sizeof(int));
    zdp_free(mem, ZDP_MEM_OTHER, s->recs, nt * sizeof(gather_rec));
    zdp_free(mem, ZDP_MEM_OTHER, s->persist_off, nt * sizeof(int64_t));
    zdp_free(mem, ZDP_MEM_OTHER, s->pf, nt * sizeof(gather_rec));
    zdp_free(mem, ZDP_MEM_OTHER, s->pf_of, nt * sizeof(int));
    zdp_free(mem, ZDP_MEM_OTHER, s->rows, (size_t)(ROW_N * k->world) * sizeof(int64_t));
    zdp_free(mem, ZDP_MEM_OTHER, s->verdicts, (size_t)s->n_verdicts * sizeof(gather_verdict));
    for (int t = 0; t < 2; t++) {
        zdp_free(mem, ZDP_MEM_OTHER, s->trace[t].first, (size_t)s->trace[t].cap * sizeof(int));
        zdp_free(mem, ZDP_MEM_OTHER, s->trace[t].count, (size_t)s->trace[t].cap * sizeof(int));
    }
    memset(s, 0, sizeof *s);
}
