/*
 * sampling.c -- the sequences of sampling requests on every rank
 * (docs/sampling.md): each rank's share, one zdp_generate, and the gather
 * that leaves each request's serve_sample_result (or its failure) in its
 * job on rank 0.
 *
 * The weights are whole on every rank (stages 0-2), so the sequences of a
 * batch of requests are divided across the ranks: laid end to end, request
 * after request, the batch's sequences are cut into W contiguous runs of
 * equal length (within one), run r on rank r.  Each rank thus decodes the
 * same number of rows (the batch waits for its slowest rank), and a request
 * is split across ranks only where a cut falls inside it (at most W - 1
 * requests per batch), so most prompts are prefilled on one rank only
 * rather than on every rank.  Each rank generates its sequences with one
 * zdp_generate (the KV cache, all its sequences decoding together) and rank
 * 0 gathers each request's blocks in sequence order.  Sequence k draws from
 * seed + 0x9E3779B97F4A7C15 * k whichever rank runs it, so the result does
 * not depend on the number of ranks.
 * Every rank reaches the one gather even when its own part failed (out of
 * memory, unreadable sampler weights): the failure travels in the block.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve_impl.h"

/* Where a batch's sequences run: laid end to end (request after request),
 * total of them, rank r holds the run [start_(r), start_(r + 1)); the
 * first ranks take the longer runs (a lone sequence runs on rank 0). */
static int64_t start_(int64_t total, int W, int r) {
    return (total * r + W - 1) / W;
}

/* The rank that holds the batch's sequence g (0 <= g < total). */
static int rank_of_(int64_t total, int W, int64_t g) {
    int r = (int)(g * W / total);
    while (r > 0 && start_(total, W, r) > g) r--;
    while (r + 1 < W && start_(total, W, r + 1) <= g) r++;
    return r;
}

/* How many of the request's sequences [at, at + n) rank r holds, and the
 * first of them (request-relative) in *lo. */
static int64_t share_(int64_t total, int W, int r, int64_t at, int64_t n, int64_t *lo) {
    const int64_t a = start_(total, W, r), b = start_(total, W, r + 1);
    const int64_t x = a > at ? a : at, y = b < at + n ? b : at + n;
    if (lo != NULL) *lo = x - at < n ? (x - at > 0 ? x - at : 0) : n;
    return y > x ? y - x : 0;
}

/* A rank's block: int32 failed, then per sequence slot int32 n_out,
 * int32 stopped, int32 tokens[max_tokens], float logprobs[max_tokens];
 * then, when the request asks for them, float prompt_logprobs[n_prompt] and
 * int32 ids[n_prompt * K], float logprobs[n_prompt * K] (the top-k prompt
 * logprobs): the rank that runs sequence 0 computes them in its prefill. */
static int64_t block_bytes_(const serve_sample_spec *sp, int64_t per) {
    return 4 + per * (8 + 8 * sp->max_tokens) + (sp->prompt_logprobs ? 4 * sp->n_prompt : 0) +
           8 * sp->n_prompt * sp->topk_prompt;
}

/* String stops of one sequence (stop_fn of zdp_gen_seq): the count to keep
 * once the text holds a stop string, -2 when decoding failed. */
typedef struct str_stop_ {
    server *s;
    const char *strs;
    int64_t n_str;
    int64_t keep; /* -1: none hit */
} str_stop_;

static int str_stop_fn_(void *user, const int32_t *out, int n) {
    str_stop_ *u = user;
    u->keep = serve_stop_cut(u->s, out, n, u->strs, u->n_str);
    return u->keep != -1;
}

/* One request's part on this rank, from its sequences to its answer. */
typedef struct part_ {
    const serve_sample_spec *sp;
    int64_t per, lo, mine, bb, K;
    int64_t at, total; /* the request's first sequence in the batch's run, the batch's sequences */
    int first;         /* the rank that runs sequence 0 (and the prompt's logprobs) */
    unsigned char *blk;
    zdp_gen_seq *g; /* (mine) */
    str_stop_ *ss;
    int32_t *out, *tki;
    float *lp, *plp, *tkl;
    int32_t failed;
    verr why;
} part_;

/* This rank's sequences of sp (none when why: this rank has no params):
 * sequences at .. at + num_samples - 1 of a batch of total. */
static void part_prepare_(server *s, const serve_sample_spec *sp, const verr *why, int64_t at, int64_t total,
                          part_ *p) {
    const int64_t n = sp->num_samples, M = sp->max_tokens;
    *p = (part_){.sp = sp, .at = at, .total = total, .first = n > 0 ? rank_of_(total, s->W, at) : 0};
    for (int r = 0; r < s->W; r++) {
        const int64_t c = share_(total, s->W, r, at, n, NULL);
        if (c > p->per) p->per = c;
    }
    p->mine = share_(total, s->W, s->R, at, n, &p->lo);
    p->bb = block_bytes_(sp, p->per);
    const int64_t mine = p->mine;
    p->blk = calloc(1, (size_t)p->bb);
    p->g = calloc((size_t)(mine > 0 ? mine : 1), sizeof *p->g);
    p->ss = calloc((size_t)(mine > 0 ? mine : 1), sizeof *p->ss);
    p->out = malloc((size_t)(mine * M + 1) * sizeof *p->out);
    p->lp = malloc((size_t)(mine * M + 1) * sizeof *p->lp);
    /* The prompt's logprobs are the same for every sequence: sequence 0's
     * prefill computes them, on its rank; rank 0 answers with them. */
    const bool have = (p->lo == 0 && mine > 0) || s->R == 0;
    p->plp = sp->prompt_logprobs && have ? malloc((size_t)sp->n_prompt * sizeof *p->plp) : NULL;
    /* Top-k prompt logprobs: the same prefill, the same rank. */
    p->K = have ? sp->topk_prompt : 0;
    p->tki = p->K > 0 ? malloc((size_t)(sp->n_prompt * p->K) * sizeof *p->tki) : NULL;
    p->tkl = p->K > 0 ? malloc((size_t)(sp->n_prompt * p->K) * sizeof *p->tkl) : NULL;
    p->failed = why != NULL;
    p->why = why != NULL ? *why : (verr){0};
    if (p->blk == NULL || p->g == NULL || p->ss == NULL || p->out == NULL || p->lp == NULL ||
        (sp->prompt_logprobs && have && p->plp == NULL) || (p->K > 0 && (p->tki == NULL || p->tkl == NULL))) {
        /* Without its block this rank cannot even report: the gather
         * needs it, so give up as a collective failure would. */
        serve_die("sample", &(zdp_error){.msg = "out of memory for a sampling request"});
    }
    for (int64_t i = 0; !p->failed && i < mine; i++) {
        const int64_t k = p->lo + i;
        p->ss[i] = (str_stop_){.s = s, .strs = sp->stop_str, .n_str = sp->n_stop_str, .keep = -1};
        p->g[i] = (zdp_gen_seq){.prompt = sp->prompt, .prompt_len = (int)sp->n_prompt,
                                .max_tokens = (int)M,
                                .sp = {.temperature = sp->temperature, .top_k = (int)sp->top_k,
                                       .top_p = sp->top_p},
                                .seed = sp->seed + 0x9E3779B97F4A7C15ull * (uint64_t)k,
                                .stop_ids = sp->stop, .n_stop_ids = (int)sp->n_stop,
                                .stop_fn = sp->n_stop_str > 0 ? str_stop_fn_ : NULL,
                                .stop_user = &p->ss[i], .lora = sp->lora, .adapter = sp->adapter,
                                .out = p->out + i * M, .out_logprobs = p->lp + i * M};
    }
    if (!p->failed && mine > 0 && p->lo == 0) {
        p->g[0].prompt_logprobs = p->plp;
        p->g[0].prompt_topk = (int)p->K, p->g[0].prompt_topk_ids = p->tki, p->g[0].prompt_topk_logprobs = p->tkl;
    }
}

static void part_failed_(server *s, part_ *p, const zdp_error *err) {
    fprintf(stderr, "zdp serve: rank %d: sampling: %s\n", s->R, err->msg);
    p->failed = 1;
    p->why.status = err->code == ZDP_ERR_NOMEM ? 500 : 400;
    snprintf(p->why.msg, sizeof p->why.msg, "%s", err->msg);
}

/* zdp_generate over n sequences, with the cache's size for /info: the
 * cache lives for this call only, so /info reports the last one's size and
 * the largest so far (docs/sampling.md).  Its batched decode steps multiply
 * by the server's packed weights (s->packs), made once per snapshot: the
 * key is the write generation and which weights these are (live, sampler
 * file, LoRA base). */
static zdp_status generate_(server *s, const float *const *params, zdp_gen_seq *g, int64_t n, zdp_error *err) {
    zdp_gen_stats gs = {0};
    int longest = 1;
    for (int64_t i = 0; i < n; i++)
        if (g[i].prompt_len + g[i].max_tokens > longest) longest = g[i].prompt_len + g[i].max_tokens;
    if (longest > s->model.block_size) longest = s->model.block_size; /* zdp_generate refuses, naming it */
    zdp_kv_cache *kv = NULL;
    zdp_status st = ZDP_OK;
    /* ZDP_SERVE_SHARED_PACKS=0 (benchmarks only: docs/config.md): every
     * cache packs its own copy, so that the shared store can be measured
     * against it. */
    const char *sp = getenv("ZDP_SERVE_SHARED_PACKS");
    const bool shared = sp == NULL || strcmp(sp, "0") != 0;
    if (shared && s->packs == NULL) st = zdp_kv_packs_create(&s->model, &s->packs, err);
    if (st == ZDP_OK) st = zdp_kv_create(&s->model, (int)n, longest, &kv, err);
    if (st != ZDP_OK) return st;
    const uint64_t which = (const float *const *)s->snap == params ? 1 : (const float *const *)s->base == params ||
                           (s->base_now != NULL && (const float *const *)s->base_now == params) ? 2 : 0;
    if (shared) zdp_kv_set_packs(kv, s->packs, s->wgen * 4 + which);
    st = zdp_generate(&s->model, params, kv, g, (int)n, (int)n, &gs, err);
    zdp_kv_destroy(kv);
    s->kv_bytes_last = gs.kv_bytes;
    if (gs.kv_bytes > s->kv_bytes_peak) s->kv_bytes_peak = gs.kv_bytes;
    s->rows_prefill += gs.prefill_tokens, s->rows_decode += gs.decode_tokens, s->rows_shared += gs.prefill_shared;
    return st;
}

/* Packs this rank's block, gathers every rank's on rank 0 and leaves the
 * request's outcome in its job there; frees the part. */
static void part_finish_(server *s, part_ *p) {
    job *j = p->sp->j;
    const serve_sample_spec *sp = p->sp;
    const int64_t n = sp->num_samples, M = sp->max_tokens, per = p->per, bb = p->bb, K = sp->topk_prompt;
    unsigned char *blk = p->blk;
    float *plp = p->plp, *tkl = p->tkl;
    int32_t *tki = p->tki;
    verr mine_why = p->why;
    int32_t failed = p->failed;
    zdp_error err = {0};
    for (int64_t i = 0; !failed && i < p->mine; i++) {
        int32_t keep = p->g[i].n_out, stopped = p->g[i].stopped;
        if (p->ss[i].keep == -2) { /* the tokenizer could not decode them */
            failed = 1;
            mine_why = (verr){.status = 500, .field = "stop"};
            snprintf(mine_why.msg, sizeof mine_why.msg, "sampling failed: see the server's log");
        }
        if (p->ss[i].keep >= 0) keep = (int32_t)p->ss[i].keep;
        unsigned char *q = blk + 4 + i * (8 + 8 * M);
        memcpy(q, &keep, 4);
        memcpy(q + 4, &stopped, 4);
        memcpy(q + 8, p->g[i].out, (size_t)keep * 4);
        memcpy(q + 8 + 4 * M, p->g[i].out_logprobs, (size_t)keep * 4);
    }
    memcpy(blk, &failed, 4);
    /* The prompt's logprobs travel in the block of the rank that ran
     * sequence 0 (the others' tails stay zero). */
    unsigned char *tail = blk + 4 + per * (8 + 8 * M);
    const int64_t P = sp->n_prompt, tail_lp = sp->prompt_logprobs ? 4 * P : 0;
    if (!failed && p->mine > 0 && p->lo == 0) {
        if (plp != NULL) memcpy(tail, plp, (size_t)tail_lp);
        if (K > 0) {
            memcpy(tail + tail_lp, tki, (size_t)(P * K) * 4);
            memcpy(tail + tail_lp + 4 * P * K, tkl, (size_t)(P * K) * 4);
        }
    }
    free(p->g), free(p->ss), free(p->out), free(p->lp);
    unsigned char *all = NULL;
    if (s->R == 0 && (all = malloc((size_t)(bb * s->W))) == NULL)
        serve_die("sample", &(zdp_error){.msg = "out of memory gathering a sampling request"});
    if (s->W > 1) {
        /* A rank that finished first sleeps here (serve_wait), not spins. */
        zdp_comm_req *req;
        if (zdp_channel_igather(s->ch, blk, bb, all, &req, &err) != ZDP_OK) serve_die("sample", &err);
        serve_wait(s, req);
    } else {
        memcpy(all, blk, (size_t)bb);
    }
    free(blk);
    if (s->R != 0) {
        free(plp), free(tki), free(tkl);
        return;
    }
    int bad = -1;
    for (int r = 0; r < s->W && bad < 0; r++) {
        int32_t f;
        memcpy(&f, all + r * bb, 4);
        if (f) bad = r;
    }
    if (bad >= 0) {
        free(all), free(plp), free(tki), free(tkl);
        if (bad == 0 && mine_why.msg[0] != '\0') {
            serve_job_fail(j, mine_why.status, mine_why.field, mine_why.msg);
            return;
        }
        char msg[128];
        snprintf(msg, sizeof msg, "sampling failed on rank %d: see the server's log", bad);
        serve_job_fail(j, 500, NULL, msg);
        return;
    }
    serve_sample_result *res = calloc(1, sizeof *res);
    if (res != NULL) {
        res->n = n;
        res->prompt_length = sp->prompt_length;
        res->off = calloc((size_t)n + 1, sizeof *res->off);
        res->tokens = malloc((size_t)(n * M + 1) * sizeof *res->tokens);
        res->logprobs = sp->logprobs ? malloc((size_t)(n * M + 1) * sizeof *res->logprobs) : NULL;
        res->stopped = calloc((size_t)n + 1, sizeof *res->stopped);
    }
    if (res == NULL || res->off == NULL || res->tokens == NULL || res->stopped == NULL ||
        (sp->logprobs && res->logprobs == NULL)) {
        serve_sample_result_free(res);
        free(all), free(plp), free(tki), free(tkl);
        serve_job_fail(j, 500, NULL, "out of memory");
        return;
    }
    for (int64_t k = 0; k < n; k++) {
        const int r = rank_of_(p->total, s->W, p->at + k); /* the rank that ran sequence k */
        const int64_t r0 = start_(p->total, s->W, r), slot = p->at + k - (r0 > p->at ? r0 : p->at);
        const unsigned char *q = all + r * bb + 4 + slot * (8 + 8 * M);
        int32_t keep, stopped;
        memcpy(&keep, q, 4);
        memcpy(&stopped, q + 4, 4);
        const int64_t at = res->off[k];
        memcpy(res->tokens + at, q + 8, (size_t)keep * 4);
        if (sp->logprobs) memcpy(res->logprobs + at, q + 8 + 4 * M, (size_t)keep * 4);
        res->stopped[k] = stopped != 0;
        res->off[k + 1] = at + keep;
    }
    const unsigned char *t0 = all + p->first * bb + 4 + per * (8 + 8 * M);
    if (plp != NULL) memcpy(plp, t0, (size_t)tail_lp);
    if (tki != NULL) {
        memcpy(tki, t0 + tail_lp, (size_t)(P * K) * 4);
        memcpy(tkl, t0 + tail_lp + 4 * P * K, (size_t)(P * K) * 4);
    }
    free(all);
    if (plp != NULL) {
        plp[0] = NAN; /* nothing predicts the first token: Tinker's None */
        res->prompt_logprobs = plp;
        res->n_prompt_logprobs = sp->n_prompt;
    }
    if (tki != NULL) {
        res->topk_k = K, res->n_topk = sp->n_prompt;
        res->topk_ids = tki, res->topk_logprobs = tkl;
    }
    j->status = 200;
    j->sample = res;
}

void serve_sampler_run(server *s, const float *const *params, const serve_sample_spec *sp, const verr *why) {
    part_ p;
    part_prepare_(s, sp, why, 0, sp->num_samples, &p);
    zdp_error err = {0};
    if (!p.failed && p.mine > 0 && generate_(s, params, p.g, p.mine, &err) != ZDP_OK) part_failed_(s, &p, &err);
    part_finish_(s, &p);
}

void serve_sampler_run_many(server *s, const float *const *params, const serve_sample_spec *sps,
                            const verr *const *whys, int n) {
    part_ *p = calloc((size_t)(n > 0 ? n : 1), sizeof *p);
    if (p == NULL) serve_die("sample", &(zdp_error){.msg = "out of memory for a sampling batch"});
    int64_t seqs = 0, total = 0, before = 0;
    for (int k = 0; k < n; k++) seqs += sps[k].num_samples;
    for (int k = 0; k < n; k++) {
        /* Each rank its run of the batch's sequences (every rank alike). */
        part_prepare_(s, &sps[k], whys[k], before, seqs, &p[k]);
        before += sps[k].num_samples;
        if (!p[k].failed) total += p[k].mine;
    }
    /* Every request's sequences in one batch: they share each decoding pass,
     * whatever their adapters (zdp_generate groups each adapter's rows). */
    zdp_gen_seq *all = calloc((size_t)(total > 0 ? total : 1), sizeof *all);
    if (all == NULL) serve_die("sample", &(zdp_error){.msg = "out of memory for a sampling batch"});
    int64_t at = 0;
    for (int k = 0; k < n; k++)
        if (!p[k].failed) memcpy(all + at, p[k].g, (size_t)p[k].mine * sizeof *all), at += p[k].mine;
    zdp_error err = {0};
    const bool ok = total == 0 || generate_(s, params, all, total, &err) == ZDP_OK;
    at = 0;
    for (int k = 0; k < n; k++) {
        if (p[k].failed) continue;
        if (!ok) part_failed_(s, &p[k], &err);
        else memcpy(p[k].g, all + at, (size_t)p[k].mine * sizeof *all);
        at += p[k].mine;
    }
    free(all);
    for (int k = 0; k < n; k++) part_finish_(s, &p[k]);
    free(p);
}
