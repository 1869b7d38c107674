/*
 * exec.c -- a request on the engine, on every rank (docs/server.md): the
 * forward/backward of a batch of datums spread over the ranks, the
 * optimizer step, saves and loads, sampling, GET /info; and the op table
 * (serve_ops) that names each op's function.
 *
 * Loss and gradient.  Tinker's cross_entropy is L = sum_i w_i * (-log p_i)
 * with no normalisation, so gradients add across requests.  The GPT's loss is
 * the mean over the micro-batch's B*T positions and the engine averages the
 * gradient over the W ranks, so a datum of N tokens (one micro-batch, B = 1)
 * is back-propagated with loss scale N * W:
 *   step gradient = (1/W) sum_ranks sum_datums N*W * d(mean_N)/dθ
 *                 = sum_datums d(sum_N)/dθ = dL/dθ.
 * Datum i goes to rank i mod W.  Every rank makes ceil(n/W) backward() calls
 * per request; a rank with fewer datums runs a one-token micro-batch with
 * loss scale 0, so the stage-2 reductions stay aligned.  Per-token weights
 * go into the model's weighted loss (zdp_lm_batch.weights) and log p(target)
 * comes back from the same forward (zdp_lm_batch.logprobs).  Losses other
 * than cross_entropy are weighted cross-entropies whose weights come from the
 * forward's own log-probabilities (zdp_lm_set_loss_weights,
 * src/models/policy_loss.c).
 */
#define _POSIX_C_SOURCE 200809L
#define _XOPEN_SOURCE 700 /* realpath */
#include <errno.h>
#include <ftw.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/core.h"
#include "serve_impl.h"

/* ---- execution (every rank) ---------------------------------------------------- */

static int64_t numel_(const zdp_param_info *p);
static int status_of_(zdp_status st);

jmp_buf *serve_fatal_jmp = NULL;
zdp_error serve_fatal_err;

void serve_die(const char *what, const zdp_error *err) {
    zdp_err_set(&serve_fatal_err, ZDP_ERR_FATAL, "%s: %s", what, err->msg);
    if (serve_fatal_jmp != NULL) longjmp(*serve_fatal_jmp, 1);
    abort(); /* a bug in zdp: serve_die outside zdp_server_run */
}

float **serve_views(server *s) {
    float **v = malloc((size_t)s->model.n_params * sizeof *v);
    if (v == NULL) return NULL;
    for (int i = 0; i < s->model.n_params; i++)
        v[i] = s->base != NULL ? s->base[i] : zdp_engine_param_data(s->slots[0].eng, i);
    return v;
}

/* Stage 3 with --full-finetune: no rank holds whole tensors, so reading the
 * weights (sampling, save_weights) gathers a whole copy from the partitions
 * and writing them (start-up, load_weights) scatters one into them. */
static bool whole_copies_(const server *s) { return s->cfg.zero.stage == 3 && !serve_lora(s); }

/* Whole copies of engine e's np tensors in one block (v[0] first), gathered
 * from the stage-3 partitions when `gather` (COLLECTIVE then); NULL with
 * err set when out of memory on this rank (on any rank, with gather). */
static float **whole_get_(server *s, zdp_engine *e, int np, bool gather, zdp_error *err) {
    const int64_t n = zdp_engine_numel(e);
    float **v = calloc((size_t)np, sizeof *v);
    float *block = v != NULL ? zdp_big_alloc((size_t)n * sizeof(float)) : NULL; /* (n) every tensor, v[0] first */
    /* The gathers are collective: every rank has its copy first (without
     * them the caller handles a failure on this rank alone). */
    if (gather ? !zdp_dist_all_ok(block != NULL) : block == NULL) {
        free(block);
        free(v);
        zdp_err_set(err, ZDP_ERR_NOMEM, "out of memory for the whole model (%lld parameters, gathered at "
                    "ZeRO stage 3 on every rank)", (long long)n);
        return NULL;
    }
    for (int i = 0; i < np; i++) v[i] = block + zdp_engine_param_offset(e, i);
    for (int i = 0; gather && i < np; i++)
        if (zdp_engine_get_param(e, i, v[i], err) != ZDP_OK) serve_die("gather weights", err);
    const int64_t bytes = n * (int64_t)sizeof(float);
    if (bytes > s->whole_peak_bytes) s->whole_peak_bytes = bytes;
    return v;
}

float **serve_weights_get(server *s, bool gather, zdp_error *err) {
    if (!whole_copies_(s)) {
        float **v = serve_views(s);
        if (v == NULL) zdp_err_set(err, ZDP_ERR_NOMEM, "out of memory");
        return v;
    }
    return whole_get_(s, s->slots[0].eng, s->model.n_params, gather, err);
}

zdp_status serve_weights_push(server *s, float *const *v, zdp_error *err) {
    for (int i = 0; whole_copies_(s) && i < s->model.n_params; i++)
        if (zdp_engine_set_param(s->slots[0].eng, i, v[i], err) != ZDP_OK) return err->code;
    return zdp_engine_sync_params(s->slots[0].eng, err);
}

void serve_weights_free(server *s, float **v) {
    if (v != NULL && whole_copies_(s)) free(v[0]);
    free(v);
}

float **serve_base_get(server *s, char *why, size_t why_size) {
    if (s->store == NULL) return s->base;
    const int np = s->model.n_params;
    int64_t n = 0;
    for (int i = 0; i < np; i++) n += numel_(&s->model.params[i]);
    float **v = calloc((size_t)np, sizeof *v);
    float *block = v != NULL ? zdp_big_alloc((size_t)n * sizeof(float)) : NULL; /* (n) every tensor, v[0] first */
    /* The gathers are collective: every rank has its block first, or none
     * gathers and the batch fails on every rank. */
    if (!zdp_dist_all_ok(block != NULL)) {
        free(block);
        free(v);
        snprintf(why, why_size, "out of memory for the whole base weights (%lld floats) that sampling gathers "
                 "at ZeRO stage 3 on some rank; send a smaller batch or serve with fewer models",
                 (long long)n);
        return NULL;
    }
    int64_t off = 0;
    for (int i = 0; i < np; off += numel_(&s->model.params[i]), i++) v[i] = block + off;
    zdp_error err = {0};
    for (int i = 0; i < np; i++)
        if (zdp_frozen_store_get(s->store, i, v[i], &err) != ZDP_OK) serve_die("gather the base", &err);
    const int64_t bytes = n * (int64_t)sizeof(float);
    if (bytes > s->whole_peak_bytes) s->whole_peak_bytes = bytes;
    s->base_now = v;
    return v;
}

void serve_base_free(server *s, float **v) {
    if (v == NULL || s->store == NULL) return;
    free(v[0]);
    free(v);
    s->base_now = NULL;
    /* The weights packed from it are a copy of the whole base too. */
    zdp_kv_packs_destroy(s->packs);
    s->packs = NULL;
#ifdef __GLIBC__
    /* glibc keeps large freed blocks in the heap once its mmap threshold
     * has grown to their size; give them back, or the rank's resident set
     * keeps the whole base between batches. */
    malloc_trim(0);
#endif
}

/* The tensors of the model being trained (s->cur, a LoRA model's adapters):
 * the engine's views at stages 0-2; at stage 3, where no rank holds whole
 * tensors, whole copies (gathered when `gather`: COLLECTIVE, every rank
 * alike).  NULL with err set when out of memory.  adapters_push_ writes
 * them back (every rank the same values) and syncs; adapters_free_ frees. */
static float **adapters_get_(server *s, bool gather, zdp_error *err) {
    if (s->cfg.zero.stage == 3) return whole_get_(s, s->eng, s->cur->n_params, gather, err);
    float **v = malloc((size_t)s->cur->n_params * sizeof *v);
    if (v == NULL) {
        zdp_err_set(err, ZDP_ERR_NOMEM, "out of memory");
        return NULL;
    }
    for (int i = 0; i < s->cur->n_params; i++) v[i] = zdp_engine_param_data(s->eng, i);
    return v;
}

static zdp_status adapters_push_(server *s, float *const *v, zdp_error *err) {
    for (int i = 0; s->cfg.zero.stage == 3 && i < s->cur->n_params; i++)
        if (zdp_engine_set_param(s->eng, i, v[i], err) != ZDP_OK) return err->code;
    return zdp_engine_sync_params(s->eng, err);
}

static void adapters_free_(server *s, float **v) {
    if (v != NULL && s->cfg.zero.stage == 3) free(v[0]);
    free(v);
}

/* Per-token coefficients and losses of datum i: c_t (the weight its
 * log-probability's gradient gets) and the summand of L at t. */
static void datum_loss_(const fwd_header *h, int64_t N, const float *lp, const float *w,
                        const float *q, const float *adv, float *coef, float *el, double *sum) {
    const zdp_loss_config lc = {.clip_low = h->clip_low, .clip_high = h->clip_high, .beta = h->beta};
    zdp_error err;
    if (zdp_policy_loss((zdp_loss_kind)h->loss, &lc, N, lp, q, adv, w, coef, el, sum, &err) != ZDP_OK) {
        /* Validation bounds every input (|x| <= 1e20, sampler logprobs within
         * 1e4), so only a model whose own log-probabilities have left float
         * range gets here.  This datum then adds no gradient, rather than
         * leaving the ranks' backward calls out of step. */
        fprintf(stderr, "zdp serve: rank %d: datum dropped from the gradient: %s\n", zdp_dist_rank(), err.msg);
        for (int64_t t = 0; t < N; t++) coef[t] = 0.0f, el[t] = NAN;
        *sum = NAN;
    }
}

static char *exec_fwd_(server *s, job *j, int *status) {
    serve_fwd_req rq;
    if (!serve_fwd_req_view(j, &rq))
        serve_die("forward_backward", &(zdp_error){.msg = "a malformed request from rank 0 (a bug in zdp)"});
    const fwd_header h = rq.h;
    const int64_t n = h.n, total = rq.total;
    const int32_t *len = rq.len, *tok = rq.tokens, *tgt = rq.targets;
    const float *w = rq.weights, *q = rq.logprobs, *adv = rq.advantages;
    int64_t *off = malloc((size_t)(n + 1) * sizeof *off);
    float *lp = calloc((size_t)total + 1, sizeof *lp);
    float *coef = malloc(((size_t)total + 1) * sizeof *coef);
    float *el = malloc(((size_t)total + 1) * sizeof *el);
    if (off == NULL || lp == NULL || coef == NULL || el == NULL)
        serve_die("forward_backward", &(zdp_error){.msg = "out of memory"});
    off[0] = 0;
    for (int64_t i = 0; i < n; i++) off[i + 1] = off[i] + len[i];

    const bool bwd = j->op == OP_FWDBWD;
    const int64_t rounds = (n + s->W - 1) / s->W;
    static const int32_t pad = 0;
    zdp_error err;
    /* At stage 3 a failed pass (a gather that could not allocate on some
     * rank) fails on every rank alike, in the same pass (the engine's
     * agreement rows): every rank leaves the loop there and the request
     * fails.  Below stage 3 a pass has no such agreement: a failure dies. */
    const bool agreed = s->cfg.zero.stage == 3;
    const int64_t window_before = zdp_engine_pending_backwards(s->eng);
    zdp_status fst = ZDP_OK;
    zdp_error ferr = {0};
#define FWD_FAIL_(what)                              \
    do {                                             \
        if (!agreed) serve_die(what, &err);          \
        fst = err.code;                              \
        ferr = err;                                  \
    } while (0)
    for (int64_t r = 0; r < rounds && fst == ZDP_OK; r++) {
        const int64_t i = r * s->W + s->R;
        if (i < n) {
            const int64_t o = off[i];
            /* The model's loss is (1/N) sum_t w_t * CE_t and fills log p(target) per token. */
            zdp_lm_batch b = {.inputs = tok + o, .targets = tgt + o, .weights = w + o,
                               .logprobs = lp + o, .B = 1, .T = len[i]};
            float loss;
            if (zdp_engine_forward(s->eng, &b, &loss, &err) != ZDP_OK) {
                FWD_FAIL_("forward");
                break;
            }
            if (!bwd) continue;
            if (h.loss != ZDP_LOSS_CROSS_ENTROPY) {
                /* A policy loss: its gradient is the weighted cross-entropy's with
                 * weights computed from this forward's log-probabilities. */
                double unused;
                datum_loss_(&h, len[i], lp + o, w + o, q + o, adv + o, coef + o, el + o, &unused);
                if (zdp_lm_set_loss_weights(s->cur, coef + o, len[i], &err) != ZDP_OK)
                    serve_die("forward_backward", &err);
            }
            /* d(sum_t c_t CE_t)/dθ: times N against the mean over positions, times W
             * against the engine's mean over ranks. */
            if (zdp_engine_backward(s->eng, false, (float)len[i] * (float)s->W, &err) != ZDP_OK)
                FWD_FAIL_("backward");
        } else if (bwd || s->cfg.zero.stage == 3) {
            /* No datum left for this rank: a zero-weight micro-batch keeps the
             * backward() count, and stage 2's reductions, equal on all ranks
             * (and at stage 3 the forward's gathers, forward alone too). */
            zdp_lm_batch b = {.inputs = &pad, .targets = &pad, .B = 1, .T = 1};
            float loss;
            if (zdp_engine_forward(s->eng, &b, &loss, &err) != ZDP_OK) FWD_FAIL_("forward");
            else if (bwd && zdp_engine_backward(s->eng, false, 0.0f, &err) != ZDP_OK) FWD_FAIL_("backward");
        }
    }
#undef FWD_FAIL_
    /* The engine made the verdict the same on every rank; this checks it
     * (a rank that disagrees would leave the others in a collective). */
    if (agreed && s->W > 1 && zdp_dist_all_ok(fst == ZDP_OK) != (fst == ZDP_OK))
        serve_die("forward_backward", &(zdp_error){.msg = "the ranks disagree on a stage-3 pass's verdict "
                                                          "(a bug in zdp)"});
    if (fst != ZDP_OK) {
        free(off);
        free(lp);
        free(coef);
        free(el);
        /* Earlier rounds of this request added their gradients (the count
         * moved: the same on every rank, the engine agreed the pass): drop
         * the window on every rank alike, so that no part of a failed
         * request reaches optim_step (a retry must not count them twice). */
        if (bwd && zdp_engine_pending_backwards(s->eng) != window_before) {
            if (zdp_engine_drop_window(s->eng, &err) != ZDP_OK) serve_die("forward_backward", &err);
            const size_t used = strlen(ferr.msg);
            if (strstr(ferr.msg, "dropped") == NULL) /* a failed backward's message says so already */
                snprintf(ferr.msg + used, sizeof ferr.msg - used,
                         "; the gradients accumulated since the last optim_step were dropped on every "
                         "rank: send this step's forward_backward requests again");
        }
        if (s->R != 0) return NULL;
        fprintf(stderr, "zdp serve: %s failed on every rank: %s\n", bwd ? "forward_backward" : "forward", ferr.msg);
        *status = status_of_(fst);
        return serve_error_body("forward_backward", ferr.msg);
    }
    /* Each position was filled by exactly one rank, the others hold 0: a sum
     * gathers them exactly. */
    if (s->W > 1 && zdp_channel_reduce_sum_f32(s->ch, lp, total, &err) != ZDP_OK) serve_die("forward", &err);
    char *body = NULL;
    if (s->R == 0) {
        /* Rank 0 keeps the result typed until it is encoded, once. */
        serve_fwd_result *res = malloc(sizeof *res);
        if (res == NULL) serve_die("forward_backward", &(zdp_error){.msg = "out of memory"});
        *res = (serve_fwd_result){.n = n, .off = off, .logprobs = lp, .elementwise = el};
        for (int64_t i = 0; i < n; i++) {
            const int64_t o = off[i];
            double sum;
            datum_loss_(&h, len[i], lp + o, w + o, q + o, adv + o, coef + o, el + o, &sum);
            res->loss_sum += sum;
        }
        *status = 200;
        off = NULL, lp = NULL, el = NULL;
        if (j->fut != NULL) {
            j->fwd = res; /* a protocol's: its poll encodes it */
        } else {
            /* A plain request: its one encoding, JSON, here (its time counts
             * as the request's, in GET /info and /healthz). */
            body = serve_fwd_result_json(res);
            serve_fwd_result_free(res);
        }
    }
    free(off);
    free(lp);
    free(coef);
    free(el);
    return body;
}

char *serve_fwd_result_json(const serve_fwd_result *r) {
    json_t *outs = json_array();
    for (int64_t i = 0; outs != NULL && i < r->n; i++) {
        const int64_t len = r->off[i + 1] - r->off[i];
        json_t *lpa = json_array(), *ela = json_array();
        for (int64_t k = r->off[i]; k < r->off[i + 1]; k++) {
            json_array_append_new(lpa, serve_jreal(r->logprobs[k]));
            json_array_append_new(ela, serve_jreal(r->elementwise[k]));
        }
        json_array_append_new(outs, json_pack("{s:{s:o,s:s,s:[I]},s:{s:o,s:s,s:[I]}}", "logprobs", "data", lpa,
                                              "dtype", "float32", "shape", (json_int_t)len, "elementwise_loss",
                                              "data", ela, "dtype", "float32", "shape", (json_int_t)len));
    }
    json_t *metrics = json_pack("{s:o}", "loss:sum", serve_jreal(r->loss_sum));
    return serve_dump(json_pack("{s:s,s:o,s:o}", "loss_fn_output_type", "ArrayRecord", "loss_fn_outputs", outs,
                                "metrics", metrics));
}

serve_fwd_result *serve_fwd_result_copy(const serve_fwd_result *r) {
    serve_fwd_result *c = malloc(sizeof *c);
    if (c == NULL) return NULL;
    const int64_t total = r->off[r->n];
    *c = (serve_fwd_result){.n = r->n, .loss_sum = r->loss_sum};
    c->off = malloc((size_t)(r->n + 1) * sizeof *c->off);
    c->logprobs = malloc(((size_t)total + 1) * sizeof *c->logprobs);
    c->elementwise = malloc(((size_t)total + 1) * sizeof *c->elementwise);
    if (c->off == NULL || c->logprobs == NULL || c->elementwise == NULL) {
        serve_fwd_result_free(c);
        return NULL;
    }
    memcpy(c->off, r->off, (size_t)(r->n + 1) * sizeof *c->off);
    memcpy(c->logprobs, r->logprobs, (size_t)total * sizeof *c->logprobs);
    memcpy(c->elementwise, r->elementwise, (size_t)total * sizeof *c->elementwise);
    return c;
}

void serve_fwd_result_free(serve_fwd_result *r) {
    if (r == NULL) return;
    free(r->off);
    free(r->logprobs);
    free(r->elementwise);
    free(r);
}

/* optim_step: the request's hyperparameters (the rest keep their values),
 * then the engine's step. */
static char *exec_optim_(server *s, job *j, int *status) {
    optim_payload p;
    memcpy(&p, j->payload, sizeof p);
    /* Nothing to apply: refused before anything changes (the request's
     * hyperparameters included).  Every rank has the same count. */
    if (zdp_engine_pending_backwards(s->eng) == 0) {
        if (s->R != 0) return NULL;
        *status = 409;
        return serve_error_body(NULL,
                                "optim_step: no forward_backward since the last optim_step, so there is no "
                                "gradient to apply; nothing changed (adam_params included)");
    }
    zdp_hparams h, before;
    zdp_engine_get_hparams(s->eng, &h);
    before = h;
    double *dst[N_ADAM] = {&h.lr, &h.beta1, &h.beta2, &h.eps, &h.weight_decay, &h.gradient_clipping};
    bool any = false;
    for (int k = 0; k < N_ADAM; k++)
        if (p.has[k]) {
            *dst[k] = p.value[k];
            any = true;
        }
    zdp_error err;
    bool sgd_warning = false;
    if (any) {
        /* Validated on rank 0 already; every rank sets the same values, so a
         * value the engine refuses is refused on every rank alike. */
        if (zdp_engine_set_hparams(s->eng, &h, &err) != ZDP_OK) {
            if (s->R != 0) return NULL;
            *status = 400;
            return serve_error_body("adam_params", err.msg);
        }
        if (s->R == 0 && s->cfg.optimizer.type == ZDP_OPTIMIZER_SGD && (p.has[1] || p.has[2] || p.has[3]))
            sgd_warning = true;
    }
    zdp_status st = zdp_engine_step(s->eng, &err);
    if (st == ZDP_ERR_STATE) {
        /* The step did not run: neither do the request's hyperparameters. */
        if (any && zdp_engine_set_hparams(s->eng, &before, &err) != ZDP_OK) serve_die("optim_step", &err);
        if (s->R != 0) return NULL;
        *status = 409;
        return serve_error_body(NULL,
                                "optim_step: no forward_backward since the last optim_step, so there is no "
                                "gradient to apply; nothing changed");
    }
    if (st != ZDP_OK) serve_die("optim_step", &err);
    if (s->R != 0) return NULL;
    *status = 200;
    const serve_optim_result res = {.grad_norm = zdp_engine_last_grad_norm(s->eng),
                                    .lr = zdp_engine_last_lr(s->eng),
                                    .step = zdp_engine_global_steps(s->eng),
                                    .global_samples = zdp_engine_global_samples(s->eng),
                                    .step_applied = zdp_engine_was_step_applied(s->eng),
                                    .sgd_warning = sgd_warning};
    if (j->fut != NULL) {
        /* A protocol's: it encodes it as it finishes. */
        j->optim = res;
        j->has_optim = true;
        return NULL;
    }
    return serve_optim_result_json(&res, false);
}

char *serve_optim_result_json(const serve_optim_result *r, bool metrics_only) {
    /* Metric keys have exactly one ':' (Tinker's rule). */
    json_t *metrics = json_pack("{s:o,s:o}", "grad_norm:mean", serve_jreal(r->grad_norm), "learning_rate:mean",
                                serve_jreal(r->lr));
    if (metrics_only) return serve_dump(json_pack("{s:o}", "metrics", metrics));
    json_t *warnings = json_array();
    if (r->sgd_warning)
        json_array_append_new(warnings, json_string("the engine's optimizer is SGD (from --config): "
                                                    "adam_params beta1, beta2 and eps have no effect"));
    return serve_dump(json_pack("{s:o,s:I,s:I,s:b,s:o}", "metrics", metrics, "step", (json_int_t)r->step,
                                "global_samples", (json_int_t)r->global_samples, "step_applied", r->step_applied,
                                "warnings", warnings));
}

static int status_of_(zdp_status st) {
    return st == ZDP_ERR_NOMEM || st == ZDP_ERR_COMM || st == ZDP_ERR_INTERNAL ? 500 : 400;
}

/* A sample's typed result: a protocol's stays typed (its poll encodes it);
 * a plain request's is encoded here, once, as JSON (its time counts as the
 * request's, in GET /info and /healthz).  Takes res. */
char *serve_finish_sample(job *j, serve_sample_result *res) {
    if (j->fut != NULL) {
        j->sample = res;
        return NULL;
    }
    char *body = serve_sample_result_json(res);
    serve_sample_result_free(res);
    return body;
}

char *serve_sample_result_json(const serve_sample_result *r) {
    json_t *seqs = json_array();
    for (int64_t i = 0; seqs != NULL && i < r->n; i++) {
        json_t *out = json_array(), *lps = r->logprobs != NULL ? json_array() : NULL;
        for (int64_t k = r->off[i]; k < r->off[i + 1]; k++) {
            json_array_append_new(out, json_integer(r->tokens[k]));
            if (lps != NULL) json_array_append_new(lps, serve_jreal(r->logprobs[k]));
        }
        const char *reason = r->stopped[i] ? "stop" : "length";
        json_array_append_new(seqs, lps != NULL ? json_pack("{s:o,s:o,s:s}", "tokens", out, "logprobs", lps,
                                                            "stop_reason", reason)
                                                : json_pack("{s:o,s:s}", "tokens", out, "stop_reason", reason));
    }
    if (r->prompt_length >= 0)
        return serve_dump(json_pack("{s:o,s:I}", "sequences", seqs, "prompt_length", (json_int_t)r->prompt_length));
    json_t *o = json_pack("{s:o,s:s}", "sequences", seqs, "type", "sample");
    if (o != NULL && r->prompt_logprobs != NULL) { /* Tinker: the first token's is None */
        json_t *pl = json_array();
        for (int64_t t = 0; t < r->n_prompt_logprobs; t++)
            json_array_append_new(pl, serve_jreal(r->prompt_logprobs[t]));
        json_object_set_new(o, "prompt_logprobs", pl);
    }
    if (o != NULL && r->topk_k > 0) { /* SampleResponse.topk_prompt_logprobs: None first */
        json_t *rows = json_array();
        for (int64_t t = 0; t < r->n_topk; t++) {
            json_t *row = t == 0 ? json_null() : json_array();
            for (int64_t k = 0; t > 0 && k < r->topk_k; k++)
                json_array_append_new(row, json_pack("[I,o]", (json_int_t)r->topk_ids[t * r->topk_k + k],
                                                      serve_jreal(r->topk_logprobs[t * r->topk_k + k])));
            json_array_append_new(rows, row);
        }
        json_object_set_new(o, "topk_prompt_logprobs", rows);
    }
    return serve_dump(o);
}

serve_sample_result *serve_sample_result_copy(const serve_sample_result *r) {
    serve_sample_result *c = calloc(1, sizeof *c);
    if (c == NULL) return NULL;
    const int64_t total = r->off[r->n];
    *c = (serve_sample_result){.n = r->n, .prompt_length = r->prompt_length};
    c->off = malloc((size_t)(r->n + 1) * sizeof *c->off);
    c->tokens = malloc(((size_t)total + 1) * sizeof *c->tokens);
    c->stopped = malloc(((size_t)r->n + 1) * sizeof *c->stopped);
    if (r->logprobs != NULL) c->logprobs = malloc(((size_t)total + 1) * sizeof *c->logprobs);
    if (c->off == NULL || c->tokens == NULL || c->stopped == NULL || (r->logprobs != NULL && c->logprobs == NULL)) {
        serve_sample_result_free(c);
        return NULL;
    }
    memcpy(c->off, r->off, (size_t)(r->n + 1) * sizeof *c->off);
    memcpy(c->tokens, r->tokens, (size_t)total * sizeof *c->tokens);
    memcpy(c->stopped, r->stopped, (size_t)r->n * sizeof *c->stopped);
    if (r->logprobs != NULL) memcpy(c->logprobs, r->logprobs, (size_t)total * sizeof *c->logprobs);
    if (r->prompt_logprobs != NULL) {
        c->prompt_logprobs = malloc(((size_t)r->n_prompt_logprobs + 1) * sizeof *c->prompt_logprobs);
        if (c->prompt_logprobs == NULL) {
            serve_sample_result_free(c);
            return NULL;
        }
        memcpy(c->prompt_logprobs, r->prompt_logprobs, (size_t)r->n_prompt_logprobs * sizeof *c->prompt_logprobs);
        c->n_prompt_logprobs = r->n_prompt_logprobs;
    }
    if (r->topk_k > 0) {
        const size_t nk = (size_t)(r->n_topk * r->topk_k);
        c->topk_ids = malloc((nk + 1) * sizeof *c->topk_ids);
        c->topk_logprobs = malloc((nk + 1) * sizeof *c->topk_logprobs);
        if (c->topk_ids == NULL || c->topk_logprobs == NULL) {
            serve_sample_result_free(c);
            return NULL;
        }
        memcpy(c->topk_ids, r->topk_ids, nk * sizeof *c->topk_ids);
        memcpy(c->topk_logprobs, r->topk_logprobs, nk * sizeof *c->topk_logprobs);
        c->topk_k = r->topk_k, c->n_topk = r->n_topk;
    }
    return c;
}

void serve_sample_result_free(serve_sample_result *r) {
    if (r == NULL) return;
    free(r->off);
    free(r->tokens);
    free(r->logprobs);
    free(r->stopped);
    free(r->prompt_logprobs);
    free(r->topk_ids);
    free(r->topk_logprobs);
    free(r);
}

/* Whether text[0..n) holds one of the n_str NUL-terminated strings at strs. */
static bool has_stop_(const char *text, size_t n, const char *strs, int64_t n_str) {
    for (int64_t q = 0; q < n_str; q++, strs += strlen(strs) + 1) {
        const size_t m = strlen(strs);
        for (size_t i = 0; m <= n && i <= n - m; i++)
            if (memcmp(text + i, strs, m) == 0) return true;
    }
    return false;
}

int64_t serve_stop_cut(server *s, const int32_t *gen, int64_t n, const char *strs, int64_t n_str) {
    for (int64_t m = n; m >= 0; m--) {
        size_t len = 0;
        char *text = s->opt.lm.decode(s->opt.lm.ctx, gen, m, &len);
        if (text == NULL) {
            fprintf(stderr, "zdp serve: sampling: cannot decode %lld generated tokens for the stop strings\n",
                    (long long)m);
            return -2;
        }
        const bool hit = has_stop_(text, len, strs, n_str);
        free(text);
        if (!hit) return m == n ? -1 : m;
    }
    return 0;
}

/* POST /sample: one sequence from the live weights (whole on every rank), through the
 * sampler (sampler.c): rank 0 runs it, the others join its gather. */
static char *exec_sample_(server *s, job *j, int *status) {
    serve_sample_req rq;
    if (!serve_sample_req_view(j, &rq))
        serve_die("sample", &(zdp_error){.msg = "a malformed request (a bug in zdp)"});
    const sample_req r = rq.r;
    zdp_error err = {0};
    /* A LoRA server samples its base (at stage 3 gathered for this request). */
    const bool lora = serve_lora(s);
    float **v = lora ? serve_base_get(s, err.msg, sizeof err.msg) : serve_weights_get(s, true, &err);
    verr why = {.status = 500};
    if (v == NULL) snprintf(why.msg, sizeof why.msg, "%s", err.msg);
    const serve_sample_spec sp = {.j = j, .prompt = rq.prompt, .n_prompt = r.n, .num_samples = 1,
                                  .max_tokens = r.max_tokens, .top_k = r.top_k, .n_stop = r.n_stop,
                                  .n_stop_str = r.n_stop_str, .temperature = r.temperature, .top_p = 1.0,
                                  .seed = (uint64_t)r.seed, .stop = rq.stop, .stop_str = rq.stop_str,
                                  .prompt_length = r.n};
    char *body = serve_sampler_run(s, (const float *const *)v, &sp, v == NULL ? &why : NULL, status);
    if (lora) serve_base_free(s, v);
    else serve_weights_free(s, v);
    return body;
}

static int64_t numel_(const zdp_param_info *p) {
    int64_t n = 1;
    for (int d = 0; d < p->ndim; d++) n *= p->shape[d];
    return n;
}

void serve_free_snapshot(server *s) {
    s->wgen++; /* the packed copies of these weights are stale */
    for (int i = 0; s->snap != NULL && i < s->model.n_params; i++) free(s->snap[i]);
    free(s->snap);
    free(s->snap_path);
    s->snap = NULL;
    s->snap_path = NULL;
}

static void adapter_free_(serve_adapter *a) {
    for (int i = 0; a->ad != NULL && i < a->lora.n_params; i++) free(a->ad[i]);
    free(a->ad);
    zdp_lora_destroy(&a->lora);
    free(a->path);
    *a = (serve_adapter){0};
}

void serve_free_adapters(server *s) {
    for (int k = 0; k < SERVE_AD_CACHE; k++) adapter_free_(&s->ad_cache[k]);
}

/* The modification time of path (zero when it cannot be read). */
static struct timespec mtime_(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 ? sb.st_mtim : (struct timespec){0};
}

static bool same_time_(struct timespec a, struct timespec b) {
    return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec;
}

/* A LoRA model's sampler weights, a PEFT adapter folder (docs/lora.md): its
 * LoRA model over the base weights and its adapter tensors, from the cache
 * (unless the folder was written again since) or read into the least
 * recently used entry not used at or after ad_clock `pin` (the running
 * batch's).  Every rank reads it.  NULL with err set on failure. */
static serve_adapter *adapter_of_(server *s, const char *dir, int64_t pin, zdp_error *err) {
    char file[4200];
    snprintf(file, sizeof file, "%s/adapter_model.safetensors", dir);
    const struct timespec t = mtime_(file);
    serve_adapter *a = NULL;
    for (int k = 0; k < SERVE_AD_CACHE && a == NULL; k++)
        if (s->ad_cache[k].path != NULL && !strcmp(s->ad_cache[k].path, dir)) a = &s->ad_cache[k];
    if (a != NULL && same_time_(a->mtime, t)) {
        a->used = ++s->ad_clock;
        return a;
    }
    for (int k = 0; k < SERVE_AD_CACHE && a == NULL; k++) {
        serve_adapter *c = &s->ad_cache[k];
        if (c->path != NULL && c->used >= pin) continue; /* the running batch's */
        if (a == NULL || c->path == NULL || (a->path != NULL && c->used < a->used)) a = c;
    }
    if (a == NULL) {
        zdp_err_set(err, ZDP_ERR_INTERNAL, "more adapters in one batch than the cache holds (a bug in zdp)");
        return NULL;
    }
    adapter_free_(a);
    zdp_lora_config lc;
    zdp_status st = zdp_lora_read_adapter_config(dir, &lc, err);
    if (st == ZDP_OK) st = zdp_lora_create(&s->model, (const float *const *)s->base, &lc, &a->lora, err);
    if (st == ZDP_OK && (a->ad = calloc((size_t)a->lora.n_params, sizeof *a->ad)) == NULL)
        st = zdp_err_set(err, ZDP_ERR_NOMEM, "out of memory for the adapter");
    for (int i = 0; st == ZDP_OK && i < a->lora.n_params; i++)
        if ((a->ad[i] = malloc((size_t)numel_(&a->lora.params[i]) * sizeof(float))) == NULL)
            st = zdp_err_set(err, ZDP_ERR_NOMEM, "out of memory for the adapter");
    if (st == ZDP_OK) st = zdp_lora_load_adapter(dir, &a->lora, a->ad, err);
    if (st == ZDP_OK && (a->path = strdup(dir)) == NULL)
        st = zdp_err_set(err, ZDP_ERR_NOMEM, "out of memory for the adapter");
    if (st != ZDP_OK) {
        adapter_free_(a);
        return NULL;
    }
    a->mtime = t;
    a->used = ++s->ad_clock;
    return a;
}

/* Whether an asample job's weights are a LoRA model's adapter folder (a
 * model folder, --model-dir's base_model, is not: it has no
 * adapter_config.json). */
static bool on_adapter_(const server *s, const char *path) {
    char conf[4200];
    struct stat sb;
    return s->base != NULL &&
           snprintf(conf, sizeof conf, "%s/adapter_config.json", path) < (int)sizeof conf &&
           stat(conf, &sb) == 0 && S_ISREG(sb.st_mode);
}

static serve_sample_spec sample_file_spec_(job *j, const serve_sample_file_req *rq, const serve_adapter *a) {
    const sample_file_header h = rq->h;
    return (serve_sample_spec){.j = j, .prompt = rq->prompt, .n_prompt = h.n_prompt,
                               .num_samples = h.num_samples, .max_tokens = h.max_tokens, .top_k = h.top_k,
                               .n_stop = h.n_stop, .n_stop_str = h.n_stop_str, .temperature = h.temperature,
                               .top_p = h.top_p, .seed = h.seed, .stop = rq->stop, .stop_str = rq->stop_str,
                               .logprobs = true, .prompt_logprobs = h.prompt_logprobs != 0,
                               .topk_prompt = h.topk_prompt, .prompt_length = -1,
                               .lora = a != NULL ? &a->lora : NULL,
                               .adapter = a != NULL ? (const float *const *)a->ad : NULL};
}

static verr adapter_why_(const zdp_error *err) {
    verr why = {.status = status_of_(err->code), .field = "model_path"};
    snprintf(why.msg, sizeof why.msg, "%s", err->msg);
    return why;
}

/* The sampler weights file at path as s->snap: read unless it is the one
 * read last and unchanged since (every rank reads it); on failure *why
 * names model_path and s->snap is NULL. */
static void snap_load_(server *s, const char *path, verr *why) {
    const int np = s->model.n_params;
    const struct timespec t = mtime_(path);
    if (s->snap_path != NULL && strcmp(s->snap_path, path) == 0 && same_time_(s->snap_mtime, t)) return;
    serve_free_snapshot(s);
    zdp_error err = {0};
    s->snap_path = strdup(path);
    s->snap_mtime = t;
    s->snap = calloc((size_t)np, sizeof *s->snap);
    bool ok = s->snap_path != NULL && s->snap != NULL;
    for (int i = 0; ok && i < np; i++)
        ok = (s->snap[i] = zdp_big_alloc((size_t)numel_(&s->model.params[i]) * sizeof(float))) != NULL;
    zdp_status st = ok ? s->opt.lm.load(s->opt.lm.ctx, path, &s->model, s->snap, &err) : ZDP_ERR_NOMEM;
    if (st != ZDP_OK) {
        serve_free_snapshot(s);
        why->status = status_of_(st);
        snprintf(why->field, sizeof why->field, "model_path");
        snprintf(why->msg, sizeof why->msg, "%s", ok ? err.msg : "out of memory for the sampler weights");
    }
}

/* Tinker's asample: num_samples continuations of the prompt from the
 * weights in a sampler file (save_weights_for_sampler), not from the live
 * ones, so training between save and sample changes nothing.  Every rank
 * reads the file (the one read last stays in memory) and samples its share
 * (sampler.c).  Each token comes with the model's log p (what
 * importance-sampling losses take as the sampler's logprobs). */
static char *exec_sample_file_(server *s, job *j, int *status) {
    serve_sample_file_req rq;
    if (!serve_sample_file_req_view(j, &rq))
        serve_die("asample", &(zdp_error){.msg = "a malformed request (a bug in zdp)"});
    const char *path = rq.path;
    zdp_error err = {0};
    verr why = {0};
    /* A folder is a LoRA model's PEFT adapter (over the base weights). */
    if (on_adapter_(s, path)) {
        const serve_adapter *a = adapter_of_(s, path, s->ad_clock + 1, &err);
        if (a == NULL) why = adapter_why_(&err);
        const serve_sample_spec sp = sample_file_spec_(j, &rq, a);
        char bwhy[ZDP_ERROR_MSG_MAX];
        float **base = serve_base_get(s, bwhy, sizeof bwhy);
        if (base == NULL && a != NULL) {
            why = (verr){.status = 500, .field = "model_path"};
            snprintf(why.msg, sizeof why.msg, "%s", bwhy);
        }
        char *body = serve_sampler_run(s, (const float *const *)base, &sp, a == NULL || base == NULL ? &why : NULL,
                                       status);
        serve_base_free(s, base);
        return body;
    }
    snap_load_(s, path, &why);
    const serve_sample_spec sp = sample_file_spec_(j, &rq, NULL);
    return serve_sampler_run(s, (const float *const *)s->snap, &sp, why.msg[0] != '\0' ? &why : NULL, status);
}

void serve_exec_sample_batch(server *s, job **jobs, int n, int *statuses, char **bodies) {
    serve_sample_spec sps[SERVE_SAMPLE_BATCH] = {{0}};
    verr whys[SERVE_SAMPLE_BATCH];
    const verr *wp[SERVE_SAMPLE_BATCH] = {0};
    int idx[SERVE_SAMPLE_BATCH], st[SERVE_SAMPLE_BATCH], m = 0;
    char *bd[SERVE_SAMPLE_BATCH];
    serve_sample_file_req rq[SERVE_SAMPLE_BATCH];
    bool done[SERVE_SAMPLE_BATCH] = {0};
    if (n > SERVE_SAMPLE_BATCH) n = SERVE_SAMPLE_BATCH;
    for (int k = 0; k < n; k++) {
        if (!serve_sample_file_req_view(jobs[k], &rq[k]))
            serve_die("asample", &(zdp_error){.msg = "a malformed request (a bug in zdp)"});
        bodies[k] = NULL;
        statuses[k] = 500;
    }
    /* Requests on one sampler weights file decode together, as one batch
     * per file (the file is read, and its weights packed, once for all of
     * them); every rank groups them alike: by the path the jobs carry. */
    for (int k = 0; k < n; k++) {
        if (done[k] || on_adapter_(s, rq[k].path)) continue;
        verr why = {0};
        snap_load_(s, rq[k].path, &why);
        m = 0;
        for (int i = k; i < n; i++)
            if (!done[i] && strcmp(rq[i].path, rq[k].path) == 0) {
                sps[m] = sample_file_spec_(jobs[i], &rq[i], NULL);
                wp[m] = why.msg[0] != '\0' ? &why : NULL;
                idx[m++] = i;
                done[i] = true;
            }
        serve_sampler_run_many(s, (const float *const *)s->snap, sps, wp, m, st, bd);
        for (int i = 0; i < m; i++) {
            statuses[idx[i]] = st[i];
            bodies[idx[i]] = bd[i];
        }
        if (s->R == 0 && m > 1) s->stats[OP_SAMPLE_FILE].batched += m;
    }
    /* LoRA models' sampler weights: every adapter's requests in one batch
     * over the base (zdp_generate groups each adapter's rows). */
    m = 0;
    const int64_t pin = s->ad_clock + 1; /* the adapters this batch uses stay in the cache */
    for (int k = 0; k < n; k++) {
        if (done[k]) continue;
        zdp_error err = {0};
        const serve_adapter *a = adapter_of_(s, rq[k].path, pin, &err);
        if (a == NULL) whys[m] = adapter_why_(&err);
        sps[m] = sample_file_spec_(jobs[k], &rq[k], a);
        wp[m] = a == NULL ? &whys[m] : NULL;
        idx[m++] = k;
    }
    char bwhy[ZDP_ERROR_MSG_MAX];
    float **base = m > 0 ? serve_base_get(s, bwhy, sizeof bwhy) : NULL;
    for (int i = 0; m > 0 && base == NULL && i < m; i++) /* every rank alike: nothing samples */
        if (wp[i] == NULL) {
            whys[i] = (verr){.status = 500, .field = "model_path"};
            snprintf(whys[i].msg, sizeof whys[i].msg, "%s", bwhy);
            wp[i] = &whys[i];
        }
    serve_sampler_run_many(s, (const float *const *)base, sps, wp, m, st, bd);
    serve_base_free(s, base);
    for (int i = 0; i < m; i++) {
        statuses[idx[i]] = st[i];
        bodies[idx[i]] = bd[i];
    }
    if (s->R == 0 && m > 1) s->stats[OP_SAMPLE_FILE].batched += m;
}

/* Rank 0, a save or load that succeeded: its typed result.  A protocol's
 * stays typed (its poll encodes it); a plain request's is encoded here, once,
 * as JSON (its time counts as the request's). */
static char *finish_save_(server *s, job *j, const char *path) {
    serve_save_result r = {.op = j->op, .path = (char *)path, .step = zdp_engine_global_steps(s->eng),
                           .global_samples = zdp_engine_global_samples(s->eng),
                           .pending_backwards = zdp_engine_pending_backwards(s->eng)};
    if (j->fut == NULL) return serve_save_result_json(&r);
    if ((j->saved = serve_save_result_copy(&r)) == NULL)
        serve_die("serve", &(zdp_error){.msg = "out of memory for a save's result"});
    return NULL;
}

char *serve_save_result_json(const serve_save_result *r) {
    if (r->op == OP_SAVE_STATE || r->op == OP_LOAD_STATE)
        return serve_dump(json_pack("{s:s,s:I,s:I,s:I}", "path", r->path, "step", (json_int_t)r->step,
                                    "global_samples", (json_int_t)r->global_samples, "pending_backwards",
                                    (json_int_t)r->pending_backwards));
    return serve_dump(json_pack("{s:s,s:I}", "path", r->path, "step", (json_int_t)r->step));
}

/* strdup of s, or NULL for NULL; false when out of memory. */
static bool dup_(const char *s, char **out) {
    *out = s != NULL ? strdup(s) : NULL;
    return s == NULL || *out != NULL;
}

serve_save_result *serve_save_result_copy(const serve_save_result *r) {
    serve_save_result *c = malloc(sizeof *c);
    if (c == NULL) return NULL;
    *c = *r;
    c->path = c->name = c->session = NULL;
    if (!dup_(r->path, &c->path) || !dup_(r->name, &c->name) || !dup_(r->session, &c->session)) {
        serve_save_result_free(c);
        return NULL;
    }
    return c;
}

void serve_save_result_free(serve_save_result *r) {
    if (r == NULL) return;
    free(r->path);
    free(r->name);
    free(r->session);
    free(r);
}

/* A LoRA model's adapters as a PEFT adapter folder at dir (rank 0):
 * adapter_model.safetensors and adapter_config.json, base_model_name_or_path
 * the served model's name (docs/lora.md). */
static zdp_status save_adapter_(server *s, const char *dir, zdp_error *err) {
    /* At stage 3 every rank gathers the adapters; rank 0 writes them. */
    if (s->R != 0 && s->cfg.zero.stage < 3) return ZDP_OK;
    float **v = adapters_get_(s, true, err);
    if (v == NULL) return err->code;
    zdp_status st = s->R == 0 ? zdp_lora_save_adapter(dir, s->cur, (const float *const *)v, s->opt.model_name, err)
                              : ZDP_OK;
    adapters_free_(s, v);
    return st;
}

static char *exec_save_weights_(server *s, job *j, int *status) {
    /* Rank 0 writes the file; at stage 3 (--full-finetune) every rank
     * gathers the weights first. */
    if (s->R != 0 && s->cfg.zero.stage < 3) return NULL;
    const char *path = (const char *)j->payload;
    zdp_error err = {0};
    if (serve_lora(s)) { /* the adapter, a PEFT folder: what sampling and users take */
        zdp_status st = save_adapter_(s, path, &err);
        if (s->R != 0) return NULL;
        if (st != ZDP_OK) {
            *status = status_of_(st);
            return serve_error_body("path", err.msg);
        }
        *status = 200;
        return finish_save_(s, j, path);
    }
    float **v = serve_weights_get(s, true, &err);
    if (v == NULL || s->R != 0) {
        serve_weights_free(s, v);
        if (s->R != 0) return NULL;
        *status = 500;
        return serve_error_body("path", err.msg);
    }
    zdp_status st = s->opt.lm.save(s->opt.lm.ctx, path, &s->model, (const float *const *)v, &err);
    serve_weights_free(s, v);
    if (st != ZDP_OK) {
        *status = status_of_(st);
        return serve_error_body("path", err.msg);
    }
    *status = 200;
    return finish_save_(s, j, path);
}

/* path "A/B/TAG" -> dir "A/B", tag "TAG"; "TAG" -> ".", "TAG". */
static void split_path_(const char *path, char *dir, char *tag, size_t cap) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    size_t n = strlen(buf);
    while (n > 1 && buf[n - 1] == '/') buf[--n] = '\0';
    char *slash = strrchr(buf, '/');
    if (slash == NULL) {
        snprintf(dir, cap, ".");
        snprintf(tag, cap, "%s", buf);
    } else {
        snprintf(tag, cap, "%s", slash + 1);
        if (slash == buf) snprintf(dir, cap, "/");
        else {
            *slash = '\0';
            snprintf(dir, cap, "%s", buf);
        }
    }
}

/* Every rank, after a step that failed on some: rank 0 gets why, naming
 * each rank that failed ("rank 1: cannot create ...: Not a directory"), and
 * the status of the first.  Each failing rank > 0 also logs its reason. */
static void failed_ranks_(server *s, zdp_status st, const char *msg, int *first_st, char *out, size_t cap) {
    enum { MSG = ZDP_ERROR_MSG_MAX };
    char mine[MSG + 8];
    memset(mine, 0, sizeof mine);
    int32_t code = (int32_t)st;
    memcpy(mine, &code, sizeof code);
    snprintf(mine + 8, MSG, "%s", st == ZDP_OK ? "" : msg);
    if (st != ZDP_OK && s->R != 0) fprintf(stderr, "[zdp rank %d] zdp serve: %s\n", s->R, msg);
    char *all = s->R == 0 ? calloc((size_t)s->W, sizeof mine) : NULL;
    if (s->R == 0 && all == NULL) serve_die("serve", &(zdp_error){.msg = "out of memory"});
    zdp_error err;
    if (zdp_channel_gather(s->ch, mine, (int64_t)sizeof mine, all, &err) != ZDP_OK) serve_die("serve", &err);
    if (s->R != 0) return;
    size_t n = 0;
    out[0] = '\0';
    *first_st = ZDP_ERR_INTERNAL;
    bool first = true;
    for (int r = 0; r < s->W; r++) {
        const char *x = all + (size_t)r * sizeof mine;
        memcpy(&code, x, sizeof code);
        if (code == ZDP_OK) continue;
        if (first) *first_st = code;
        first = false;
        if (n < cap) n += (size_t)snprintf(out + n, cap - n, "%srank %d: %s", n ? "; " : "", r, x + 8);
    }
    free(all);
    serve_utf8_fix(out);
}

static char *exec_state_(server *s, job *j, int *status) {
    const char *name = (const char *)j->payload;
    char path[4096];
    const bool fits = snprintf(path, sizeof path, "%s%s%s", name[0] == '/' ? "" : s->ckpt_root,
                               name[0] == '/' ? "" : "/", name) < (int)sizeof path;
    if (!zdp_dist_all_ok(fits)) { /* every rank, before the engine's collectives */
        if (s->R != 0) return NULL;
        *status = 400;
        return serve_error_body("path", "path: too long once joined to the checkpoint folder");
    }
    char dir[4096], tag[4096];
    split_path_(path, dir, tag, sizeof dir);
    zdp_error err = {0};
    zdp_status st;
    if (j->op == OP_SAVE_STATE) {
        st = zdp_engine_save_checkpoint(s->eng, dir, tag, "{\"writer\": \"zdp serve\"}", &err);
    } else {
        char *client = NULL;
        st = zdp_engine_load_checkpoint(s->eng, dir, tag, &client, &err);
        free(client);
    }
    bool all = zdp_dist_all_ok(st == ZDP_OK);
    /* A load that succeeded on some ranks only would leave them apart. */
    if (!all && st == ZDP_OK && j->op == OP_LOAD_STATE)
        serve_die("load_state", &(zdp_error){.msg = "another rank failed to load the checkpoint"});
    char why[2048];
    int bad_st = 0;
    if (!all) failed_ranks_(s, st, err.msg, &bad_st, why, sizeof why);
    /* A LoRA model's checkpoint is a PEFT adapter folder too (beside the
     * engine's files), as Tinker's checkpoint download gives; at stage 3
     * every rank takes part in gathering it. */
    if (all && j->op == OP_SAVE_STATE && serve_lora(s)) st = save_adapter_(s, path, &err);
    if (s->R != 0) return NULL;
    if (!all) {
        *status = status_of_((zdp_status)bad_st);
        return serve_error_body("path", why);
    }
    if (j->op == OP_SAVE_STATE && serve_lora(s) && st != ZDP_OK) {
        *status = status_of_(st);
        return serve_error_body("path", err.msg);
    }
    *status = 200;
    return finish_save_(s, j, path);
}

/* A LoRA model's adapters from a checkpoint's model.safetensors (the
 * engine's checkpoint of a LoRA model names them as PEFT does): every
 * tensor present, F32, of the model's shape, or refused naming it before
 * anything changes.  Rank 0; sync_params then gives every rank the values. */
static zdp_status load_adapters_(server *s, const char *path, float *const *dst, zdp_error *err) {
    zdp_safetensors st;
    if (zdp_safetensors_read(path, &st, err) != ZDP_OK) return err->code;
    const zdp_model *m = s->cur;
    zdp_status rc = ZDP_OK;
    if (st.n != m->n_params)
        rc = zdp_err_set(err, ZDP_ERR_INVALID_ARG, "%s: %d tensors, but this LoRA model has %d (%s): a "
                         "checkpoint of another model's LoRA configuration", path, st.n, m->n_params,
                         m->shape_json != NULL ? m->shape_json : "");
    for (int i = 0; rc == ZDP_OK && i < m->n_params; i++) {
        const zdp_param_info *p = &m->params[i];
        const zdp_tensor *t = zdp_safetensors_find(&st, p->name);
        bool same = t != NULL && t->dtype == ZDP_DTYPE_F32 && t->ndim == p->ndim;
        for (int d = 0; same && d < p->ndim; d++) same = t->shape[d] == p->shape[d];
        if (!same)
            rc = zdp_err_set(err, ZDP_ERR_INVALID_ARG, "%s: tensor %s is %s; this LoRA model needs it F32 of "
                             "shape [%lld, %lld] (a checkpoint of another base or rank)", path, p->name,
                             t == NULL ? "missing" : "of another dtype or shape", (long long)p->shape[0],
                             (long long)(p->ndim > 1 ? p->shape[1] : 1));
    }
    for (int i = 0; rc == ZDP_OK && i < m->n_params; i++) {
        const zdp_tensor *t = zdp_safetensors_find(&st, m->params[i].name);
        memcpy(dst[i], t->data, t->nbytes);
    }
    zdp_safetensors_free(&st);
    return rc;
}

/* Tinker's load_weights without the optimizer: the weights of a checkpoint
 * (its model.safetensors) and a fresh optimizer state.  Rank 0 reads into
 * scratch memory, so a failed read changes nothing; sync_params then gives
 * every rank the new weights. */
static char *exec_load_weights_(server *s, job *j, int *status) {
    const char *path = (const char *)j->payload;
    zdp_error err = {0};
    zdp_status st = ZDP_OK;
    if (s->R == 0 && serve_lora(s) && s->cfg.zero.stage < 3) {
        float **v = adapters_get_(s, false, &err);
        st = v == NULL ? err.code : load_adapters_(s, path, v, &err);
        adapters_free_(s, v);
    } else if (s->cfg.zero.stage == 3) {
        /* No rank holds what sync_params would broadcast: rank 0 reads into
         * every rank's whole copy by broadcast, and each keeps its slice
         * (the LoRA model's adapters, or --full-finetune's weights). */
        const bool lora = serve_lora(s);
        float **v = lora ? adapters_get_(s, false, &err) : serve_weights_get(s, false, &err);
        if (!zdp_dist_all_ok(v != NULL)) {
            lora ? adapters_free_(s, v) : serve_weights_free(s, v);
            if (s->R != 0) return NULL;
            *status = 500;
            return serve_error_body("path", v == NULL ? err.msg : "another rank is out of memory for the weights");
        }
        if (s->R == 0)
            st = lora ? load_adapters_(s, path, v, &err) : s->opt.lm.load(s->opt.lm.ctx, path, &s->model, v, &err);
        int ok = st == ZDP_OK;
        if (zdp_channel_bcast(s->ch, &ok, (int64_t)sizeof ok, &err) != ZDP_OK) serve_die("load_weights", &err);
        if (ok) {
            const int64_t nbytes = zdp_engine_numel(s->eng) * (int64_t)sizeof(float);
            if (zdp_channel_bcast(s->ch, v[0], nbytes, &err) != ZDP_OK) serve_die("load_weights", &err);
            if ((lora ? adapters_push_(s, v, &err) : serve_weights_push(s, v, &err)) != ZDP_OK)
                serve_die("load_weights", &err);
            zdp_engine_reset_optimizer_state(s->eng);
        }
        lora ? adapters_free_(s, v) : serve_weights_free(s, v);
        if (s->R != 0) return NULL;
        if (!ok) {
            *status = status_of_(st);
            return serve_error_body("path", err.msg);
        }
        *status = 200;
        return finish_save_(s, j, path);
    } else if (s->R == 0) {
        const int np = s->model.n_params;
        float **tmp = calloc((size_t)np, sizeof *tmp);
        st = tmp == NULL ? ZDP_ERR_NOMEM : ZDP_OK;
        for (int i = 0; st == ZDP_OK && i < np; i++) {
            tmp[i] = malloc((size_t)numel_(&s->model.params[i]) * sizeof(float));
            if (tmp[i] == NULL) st = ZDP_ERR_NOMEM;
        }
        if (st == ZDP_ERR_NOMEM) snprintf(err.msg, sizeof err.msg, "out of memory for the weights");
        if (st == ZDP_OK)
            st = s->opt.lm.load(s->opt.lm.ctx, path, &s->model, tmp, &err);
        for (int i = 0; st == ZDP_OK && i < np; i++)
            memcpy(zdp_engine_param_data(s->eng, i), tmp[i], (size_t)numel_(&s->model.params[i]) * sizeof(float));
        for (int i = 0; tmp != NULL && i < np; i++) free(tmp[i]);
        free(tmp);
    }
    int ok = st == ZDP_OK;
    if (zdp_channel_bcast(s->ch, &ok, (int64_t)sizeof ok, &err) != ZDP_OK) serve_die("load_weights", &err);
    if (ok) {
        if (zdp_engine_sync_params(s->eng, &err) != ZDP_OK) serve_die("load_weights", &err);
        zdp_engine_reset_optimizer_state(s->eng);
    }
    if (s->R != 0) return NULL;
    if (!ok) {
        *status = status_of_(st);
        return serve_error_body("path", err.msg);
    }
    *status = 200;
    return finish_save_(s, j, path);
}

/* The bounds of docs/server.md's "Limits" and what is in use now. */
static json_t *limits_json_(server *s) {
    const union MHD_DaemonInfo *ci =
        s->daemon != NULL ? MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_CURRENT_CONNECTIONS) : NULL;
    return json_pack("{s:I,s:I,s:I,s:i,s:i,s:i,s:i,s:f,s:f,s:i,s:i}", "max_body_bytes", (json_int_t)s->opt.max_body,
                     "max_inflight_bytes", (json_int_t)s->opt.max_inflight, "inflight_bytes",
                     (json_int_t)serve_body_inflight(s), "max_connections", s->opt.max_connections,
                     "max_connections_per_ip", s->opt.max_connections_per_ip, "connections",
                     ci != NULL ? (int)ci->num_connections : -1, "idle_timeout_seconds",
                     s->opt.idle_timeout_s, "request_timeout_seconds", s->opt.request_timeout_s,
                     "health_timeout_seconds", s->opt.health_timeout_s, "max_sample_batch",
                     s->opt.max_sample_batch, "max_stop_bytes", s->opt.max_stop_bytes);
}

/* /info's model: its arch, the shape it records (zdp_model.shape_json, a
 * flat object: GPT's n_layer, n_head, n_embd; the Llama family's config),
 * vocab_size, block_size and the parameter count. */
static json_t *model_json_(server *s) {
    json_t *o = json_pack("{s:s}", "arch", s->opt.lm.arch);
    json_t *shape = s->model.shape_json != NULL ? json_loads(s->model.shape_json, 0, NULL) : NULL;
    if (json_is_object(shape)) {
        json_object_del(shape, "model");
        json_object_update(o, shape);
    }
    json_decref(shape);
    json_object_set_new(o, "vocab_size", json_integer(s->model.vocab_size));
    json_object_set_new(o, "block_size", json_integer(s->model.block_size));
    int64_t n = 0;
    for (int i = 0; i < s->model.n_params; i++) n += numel_(&s->model.params[i]);
    json_object_set_new(o, "n_params", json_integer((json_int_t)n));
    return o;
}

static int unlink_one_(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

/* Removes path (a file, or a folder and everything in it); a path that is
 * not there is nothing to do.  0, or -1 with errno. */
static int remove_tree_(const char *path) {
    struct stat sb;
    if (lstat(path, &sb) != 0) return errno == ENOENT ? 0 : -1;
    return S_ISDIR(sb.st_mode) ? nftw(path, unlink_one_, 16, FTW_DEPTH | FTW_PHYS) : remove(path);
}

/* DELETE of a Tinker checkpoint (tinker/runs.c): the payload is its path
 * relative to the checkpoint folder; every rank removes its own part.  Rank
 * 0 first, then the others, so ranks sharing one folder never remove the
 * same files at once.  On the queue, so never while a load of it runs. */
static char *exec_delete_(server *s, job *j, int *status) {
    char path[4096];
    const bool fits = snprintf(path, sizeof path, "%s/%s", s->ckpt_root, (const char *)j->payload) <
                      (int)sizeof path;
    int rc = fits && s->R == 0 ? remove_tree_(path) : 0;
    int code = errno;
    const bool first = zdp_dist_all_ok(rc == 0); /* rank 0 done: the others' turn */
    if (fits && s->R != 0 && first) {
        rc = remove_tree_(path);
        code = errno;
    }
    char msg[ZDP_ERROR_MSG_MAX];
    snprintf(msg, sizeof msg, "cannot remove %.600s in the checkpoint folder: %s", (const char *)j->payload,
             fits ? strerror(code) : "path too long");
    const zdp_status st = fits && rc == 0 ? ZDP_OK : ZDP_ERR_IO;
    const bool all = zdp_dist_all_ok(st == ZDP_OK);
    char why[2048];
    int bad_st = 0;
    if (!all) failed_ranks_(s, st, msg, &bad_st, why, sizeof why);
    if (s->R != 0) return NULL;
    /* asample keeps the last sampler weights it read: not these any more. */
    if (s->snap_path != NULL && !strcmp(s->snap_path, path)) serve_free_snapshot(s);
    if (!all) {
        *status = 500;
        return serve_error_body("checkpoint_id", why);
    }
    *status = 200;
    return serve_dump(json_pack("{s:s}", "deleted", (const char *)j->payload));
}

/* GET /info's memory rows: every rank's n counters onto rank 0, a malloc'd
 * (W, n) array there and NULL on the other ranks (COLLECTIVE). */
static int64_t *gather_rows_(server *s, const int64_t *mine, int n) {
    int64_t *all = s->R == 0 ? malloc((size_t)s->W * (size_t)n * sizeof *all) : NULL;
    if (s->R == 0 && all == NULL) serve_die("info", &(zdp_error){.msg = "out of memory"});
    zdp_error err;
    if (zdp_channel_gather(s->ch, mine, (int64_t)n * (int64_t)sizeof *mine, all, &err) != ZDP_OK)
        serve_die("info", &err);
    return all;
}

/* GET /info's "models": every live model with its counters and its memory
 * on each rank (the engine's report: adapter parameters, gradients and
 * optimizer state; the shared base is not counted).  Every rank gathers. */
static json_t *requests_json_(server *s);

static json_t *models_json_(server *s) {
    enum { K = 6 };
    json_t *arr = s->R == 0 ? json_array() : NULL;
    if (s->R == 0 && arr == NULL) serve_die("info", &(zdp_error){.msg = "out of memory"});
    for (int k = 0; k < s->opt.max_models; k++) {
        const serve_slot *x = &s->slots[k];
        if (x->uid == 0) continue;
        zdp_memory_report m;
        zdp_engine_memory_report(x->eng, &m);
        int64_t mine[K] = {m.params_bytes, m.grads_bytes + m.grad_partition_bytes + m.bucket_bytes,
                           m.optimizer_bytes, m.other_bytes, m.total_bytes, m.frozen_bytes};
        int64_t *all = gather_rows_(s, mine, K);
        if (s->R != 0) continue;
        json_t *mem = json_array();
        for (int r = 0; r < s->W; r++) {
            const int64_t *v = all + K * r;
            json_array_append_new(mem, json_pack("{s:i,s:I,s:I,s:I,s:I,s:I,s:I}", "rank", r, "params_bytes",
                                                 (json_int_t)v[0], "grads_bytes", (json_int_t)v[1],
                                                 "optimizer_bytes", (json_int_t)v[2], "other_bytes",
                                                 (json_int_t)v[3], "total_bytes", (json_int_t)v[4],
                                                 "frozen_bytes", (json_int_t)v[5]));
        }
        free(all);
        json_t *o = json_pack("{s:i,s:I,s:I,s:I,s:I,s:o}", "slot", k, "n_params",
                              (json_int_t)zdp_engine_numel(x->eng), "step",
                              (json_int_t)zdp_engine_global_steps(x->eng), "pending_backwards",
                              (json_int_t)zdp_engine_pending_backwards(x->eng), "micro_steps",
                              (json_int_t)zdp_engine_micro_steps(x->eng), "memory", mem);
        if (serve_lora(s)) {
            char targets[ZDP_LORA_TARGETS_NAME_MAX];
            zdp_lora_targets_name(x->lc.targets, x->lc.modules, targets, sizeof targets);
            json_object_set_new(o, "model_id", json_string(x->name));
            json_object_set_new(o, "lora", json_pack("{s:i,s:f,s:s,s:I}", "rank", x->lc.rank, "alpha",
                                                     (double)(x->lc.alpha != 0 ? x->lc.alpha : ZDP_LORA_DEFAULT_ALPHA),
                                                     "targets", targets, "seed", (json_int_t)x->lc.seed));
        }
        json_array_append_new(arr, o);
    }
    return arr;
}

static char *exec_info_(server *s, job *j, int *status) {
    (void)j;
    json_t *models = models_json_(s);
    if (serve_lora(s)) {
        int64_t base = 0;
        for (int i = 0; i < s->model.n_params; i++) base += numel_(&s->model.params[i]) * (int64_t)sizeof(float);
        /* The server's own rows, once per rank (not per model): the base it
         * holds whole (stages 0-2) or its one partition shared by every
         * model (stage 3: zdp_frozen_store), and what sampling holds. */
        enum { KB = 10 };
        zdp_memory_report fm;
        zdp_frozen_store_memory_report(s->store, &fm);
        int64_t held = 0; /* the whole base tensors this rank holds (none at stage 3) */
        for (int i = 0; s->base != NULL && i < s->model.n_params; i++)
            if (s->base[i] != NULL) held += numel_(&s->model.params[i]) * (int64_t)sizeof(float);
        int64_t mine[KB] = {held, fm.frozen_bytes, fm.other_bytes,
                            s->whole_peak_bytes, s->kv_bytes_peak, zdp_kv_packs_bytes(s->packs),
                            zdp_kv_packs_count(s->packs), s->rows_prefill, s->rows_decode, s->rows_shared};
        int64_t *all = gather_rows_(s, mine, KB);
        if (s->R != 0) return NULL;
        json_t *mem = json_array();
        for (int r = 0; r < s->W; r++) {
            const int64_t *x = all + KB * r;
            json_array_append_new(mem, json_pack("{s:i,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I}", "rank", r,
                                                 "base_whole_bytes",
                                                 (json_int_t)x[0], "base_partition_bytes", (json_int_t)x[1],
                                                 "base_other_bytes", (json_int_t)x[2], "gathered_whole_bytes",
                                                 (json_int_t)x[3], "kv_cache_peak_bytes", (json_int_t)x[4],
                                                 "packed_weights_bytes", (json_int_t)x[5], "packed_weights_packs",
                                                 (json_int_t)x[6], "sample_prefill_rows", (json_int_t)x[7],
                                                 "sample_decode_rows", (json_int_t)x[8], "sample_shared_rows",
                                                 (json_int_t)x[9]));
        }
        free(all);
        json_t *o = json_pack("{s:o,s:i,s:i,s:s,s:i,s:f,s:I,s:o,s:I}", "model", model_json_(s), "world_size", s->W,
                              "zero_stage", s->cfg.zero.stage, "mode", "lora", "max_models", s->opt.max_models,
                              "model_idle_timeout_seconds", s->opt.model_idle_timeout_s, "base_bytes",
                              (json_int_t)base, "models", models, "max_body_bytes", (json_int_t)s->opt.max_body);
        json_object_set_new(o, "memory", mem);
        json_object_set_new(o, "requests", requests_json_(s));
        json_object_set_new(o, "limits", limits_json_(s));
        *status = 200;
        return serve_dump(o);
    }
    s->eng = s->slots[0].eng;
    zdp_memory_report m;
    zdp_engine_memory_report(s->eng, &m);
    /* Beyond the engine's: the sampling side, which lives outside it (the
     * sampler weights asample keeps, the KV cache a request makes, and at
     * stage 3 the most bytes of whole-model copies gathered at once for
     * sampling and save_weights, held only while such a request runs). */
    int64_t snap = 0;
    for (int i = 0; s->snap != NULL && i < s->model.n_params; i++)
        snap += numel_(&s->model.params[i]) * (int64_t)sizeof(float);
    int64_t mine[17] = {m.params_bytes, m.grads_bytes, m.grad_partition_bytes, m.bucket_bytes,
                        m.optimizer_bytes, m.master_bytes, m.other_bytes, m.total_bytes,
                        snap, s->kv_bytes_last, s->kv_bytes_peak, s->whole_peak_bytes,
                        zdp_kv_packs_bytes(s->packs), zdp_kv_packs_count(s->packs),
                        s->rows_prefill, s->rows_decode, s->rows_shared};
    int64_t *all = gather_rows_(s, mine, 17);
    if (s->R != 0) return NULL;
    json_t *mem = json_array();
    for (int r = 0; r < s->W; r++) {
        int64_t *x = all + 17 * r;
        json_array_append_new(mem, json_pack("{s:i,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,"
                                             "s:I,s:I,s:I}", "rank", r,
                                             "params_bytes", (json_int_t)x[0], "grads_bytes", (json_int_t)x[1],
                                             "grad_partition_bytes", (json_int_t)x[2], "bucket_bytes",
                                             (json_int_t)x[3], "optimizer_bytes", (json_int_t)x[4],
                                             "master_bytes", (json_int_t)x[5], "other_bytes",
                                             (json_int_t)x[6], "total_bytes", (json_int_t)x[7],
                                             "sampler_weights_bytes", (json_int_t)x[8], "kv_cache_bytes",
                                             (json_int_t)x[9], "kv_cache_peak_bytes", (json_int_t)x[10],
                                             "gathered_whole_bytes", (json_int_t)x[11],
                                             "packed_weights_bytes", (json_int_t)x[12],
                                             "packed_weights_packs", (json_int_t)x[13], "sample_prefill_rows",
                                             (json_int_t)x[14], "sample_decode_rows", (json_int_t)x[15],
                                             "sample_shared_rows", (json_int_t)x[16]));
    }
    free(all);
    const zdp_optimizer_config *oc = &s->cfg.optimizer;
    /* What the next update uses: the config's values until an optim_step's
     * adam_params set others. */
    zdp_hparams hp;
    zdp_engine_get_hparams(s->eng, &hp);
    const char *opt = oc->type == ZDP_OPTIMIZER_SGD ? "SGD" : oc->type == ZDP_OPTIMIZER_ADAMW ? "AdamW" : "Adam";
    json_t *o = json_pack(
        "{s:o,s:i,s:i,s:I,s:I,s:I,s:I,s:I,s:o,s:o,"
        "s:{s:s,s:f,s:f,s:f,s:f,s:f,s:f},s:o,s:I}",
        "model", model_json_(s), "world_size", s->W, "zero_stage", s->cfg.zero.stage, "step",
        (json_int_t)zdp_engine_global_steps(s->eng), "global_samples",
        (json_int_t)zdp_engine_global_samples(s->eng), "micro_steps",
        (json_int_t)zdp_engine_micro_steps(s->eng), "skipped_steps",
        (json_int_t)zdp_engine_skipped_steps(s->eng), "pending_backwards",
        (json_int_t)zdp_engine_pending_backwards(s->eng), "lr", serve_jreal(zdp_engine_lr(s->eng)),
        "last_grad_norm", serve_jreal(zdp_engine_last_grad_norm(s->eng)), "optimizer", "type", opt, "lr",
        hp.lr, "beta1", hp.beta1, "beta2", hp.beta2, "eps", hp.eps, "weight_decay", hp.weight_decay,
        "gradient_clipping", hp.gradient_clipping, "memory", mem, "max_body_bytes",
        (json_int_t)s->opt.max_body);
    json_object_set_new(o, "mode", json_string("full_finetune"));
    json_object_set_new(o, "max_models", json_integer(s->opt.max_models));
    json_object_set_new(o, "models", models);
    json_object_set_new(o, "requests", requests_json_(s));
    json_object_set_new(o, "limits", limits_json_(s));
    *status = 200;
    return serve_dump(o);
}

/* Server-side timing by request kind (the one being answered not yet
 * counted): how long requests waited in the FIFO and ran on the ranks. */
static json_t *requests_json_(server *s) {
    json_t *req = json_object();
    for (int op = 0; op < SERVE_N_OPS; op++) {
        if (s->stats[op].count == 0) continue;
        const double n = (double)s->stats[op].count;
        json_object_set_new(req, serve_ops[op].name,
                            json_pack("{s:I,s:f,s:f,s:f}", "count", (json_int_t)s->stats[op].count,
                                      "mean_queue_ms", 1e3 * s->stats[op].queue_s / n, "mean_exec_ms",
                                      1e3 * s->stats[op].exec_s / n, "max_exec_ms",
                                      1e3 * s->stats[op].exec_max_s));
        if (s->stats[op].batched > 0) /* asample: requests that shared decoding passes */
            json_object_set_new(json_object_get(req, serve_ops[op].name), "batched",
                                json_integer((json_int_t)s->stats[op].batched));
    }
    return req;
}

/* OP_CREATE, every rank: a LoRA model (fresh adapters, PEFT's
 * initialisation from the seed; a fresh optimizer) in the payload's slot.
 * Every rank takes the same steps on the same inputs, so a refusal
 * (zdp_lora_create's: a rank larger than a target's dimensions) is every
 * rank's alike, and nothing changes. */
static char *exec_create_(server *s, job *j, int *status) {
    create_payload p;
    if (j->nbytes < (int64_t)sizeof p || j->payload[j->nbytes - 1] != '\0')
        serve_die("create_model", &(zdp_error){.msg = "a malformed request from rank 0 (a bug in zdp)"});
    memcpy(&p, j->payload, sizeof p);
    const char *model_id = (const char *)j->payload + sizeof p;
    if (p.slot < 0 || p.slot >= s->opt.max_models || s->slots[p.slot].uid != 0 || !serve_lora(s))
        serve_die("create_model", &(zdp_error){.msg = "a create_model into a slot in use (a bug in zdp)"});
    serve_slot *x = &s->slots[p.slot];
    const zdp_lora_config lc = {.rank = p.rank, .alpha = (float)p.alpha, .targets = p.targets, .seed = p.seed};
    zdp_error err = {0};
    zdp_status st = zdp_lora_create(&s->model, (const float *const *)s->base, &lc, &x->lora, &err);
    bool made = st == ZDP_OK;
    /* At stage 3 the engine borrows the server's one partition of the base. */
    if (made && (st = s->store != NULL ? zdp_engine_create_shared(&s->cfg, &x->lora, s->store, &x->eng, &err)
                                       : zdp_engine_create(&s->cfg, &x->lora, &x->eng, &err)) != ZDP_OK) {
        zdp_lora_destroy(&x->lora);
        made = false;
    }
    if (!zdp_dist_all_ok(made)) {
        if (made) { /* failed on another rank only */
            zdp_engine_destroy(x->eng);
            zdp_lora_destroy(&x->lora);
            snprintf(err.msg, sizeof err.msg, "another rank could not create the model");
            st = ZDP_ERR_INTERNAL;
        }
        *x = (serve_slot){0};
        if (s->R != 0) return NULL;
        *status = status_of_(st);
        fprintf(stderr, "zdp serve: create_model %s refused: %s\n", model_id, err.msg);
        /* The library names the rank as "rank = N"; the client sent lora_config.rank. */
        const char *field = strstr(err.msg, "rank =") != NULL ? "lora_config.rank" : "lora_config";
        char msg[ZDP_ERROR_MSG_MAX + 64];
        snprintf(msg, sizeof msg, "%s: %s; nothing was created", field, err.msg);
        return serve_error_body(field, msg);
    }
    x->model = &x->lora;
    x->uid = p.uid;
    x->lc = lc;
    snprintf(x->name, sizeof x->name, "%s", model_id);
    s->cur = x->model;
    s->eng = x->eng;
    /* Every rank draws the same initial adapters from the seed (at stage 3
     * each keeps its slice of them). */
    float **v = adapters_get_(s, false, &err);
    if (v == NULL) serve_die("create_model", &err);
    zdp_lora_init_params(x->model, v);
    if (adapters_push_(s, v, &err) != ZDP_OK) serve_die("create_model", &err);
    adapters_free_(s, v);
    if (s->R != 0) return NULL;
    char targets[ZDP_LORA_TARGETS_NAME_MAX];
    zdp_lora_targets_name(lc.targets, lc.modules, targets, sizeof targets);
    fprintf(stderr, "zdp serve: create_model -> %s: LoRA rank %d, alpha %g, targets %s, seed %llu, "
            "%lld trainable parameters (slot %d)\n", model_id, lc.rank, p.alpha, targets,
            (unsigned long long)lc.seed, (long long)zdp_engine_numel(x->eng), p.slot);
    *status = 200;
    return serve_dump(json_pack("{s:s,s:s}", "model_id", model_id, "type", "create_model"));
}

/* OP_UNLOAD, every rank: frees the model's slot (its checkpoints stay). */
static char *exec_unload_(server *s, job *j, int *status) {
    serve_slot_free(s, j->slot);
    s->cur = NULL;
    s->eng = NULL;
    if (s->R != 0) return NULL;
    *status = 200;
    return serve_dump(json_pack("{s:s}", "type", "unload_model"));
}

const serve_op serve_ops[SERVE_N_OPS] = {
#define SERVE_OP_ROW_(name, str, fn, all) [OP_##name] = {OP_##name, str, fn, all},
    SERVE_OP_MAP(SERVE_OP_ROW_)
#undef SERVE_OP_ROW_
};

/* Ops that run on one model (the job's slot). */
static bool on_model_(int op) {
    return op == OP_FWDBWD || op == OP_FORWARD || op == OP_OPTIM || op == OP_SAVE_WEIGHTS || op == OP_SAVE_STATE ||
           op == OP_LOAD_STATE || op == OP_LOAD_WEIGHTS || op == OP_UNLOAD;
}

/* The test hook ZDP_TEST_SERVE_FATAL=RANK:N: the N-th job this process
 * runs fails fatally on rank RANK alone, as a failure no agreement covers
 * would (tests/cli/test_serve_zero3.sh: the tool then ends every rank).
 * Read once; -1: off. */
static long long fatal_rank_ = -2, fatal_nth_ = 0, fatal_jobs_ = 0;

static void fatal_hook_(const server *s, const job *j) {
    if (fatal_rank_ == -2) {
        const char *h = getenv("ZDP_TEST_SERVE_FATAL");
        if (h == NULL || sscanf(h, "%lld:%lld", &fatal_rank_, &fatal_nth_) != 2 || fatal_nth_ < 1)
            fatal_rank_ = -1;
    }
    if (fatal_rank_ == s->R && ++fatal_jobs_ == fatal_nth_)
        serve_die(serve_ops[j->op].name, &(zdp_error){.msg = "ZDP_TEST_SERVE_FATAL: a failure on this "
                                                             "rank alone (the test hook)"});
}

char *serve_exec(server *s, job *j, int *status) {
    if (j->op < 0 || j->op >= SERVE_N_OPS || serve_ops[j->op].exec == NULL)
        serve_die("serve", &(zdp_error){.msg = "unknown request type from rank 0 (a bug in zdp)"});
    fatal_hook_(s, j);
    if (on_model_(j->op)) {
        /* The same table on every rank: each refuses alike, before any collective. */
        if (j->slot < 0 || j->slot >= s->opt.max_models || j->uid == 0 || s->slots[j->slot].uid != j->uid) {
            if (s->R != 0) return NULL;
            *status = 400;
            return serve_error_body("model_id", "the model was unloaded (or its create_model failed) before "
                                                "this request ran; nothing changed");
        }
        s->cur = s->slots[j->slot].model;
        s->eng = s->slots[j->slot].eng;
    }
    if (j->op != OP_INFO && j->op != OP_SAMPLE && j->op != OP_SAMPLE_FILE)
        s->wgen++; /* it may write weights: drop their packed copies */
    return serve_ops[j->op].exec(s, j, status);
}
