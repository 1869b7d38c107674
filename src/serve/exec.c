/*
 * exec.c -- a request on the engine, on every rank (docs/server.md): the op
 * table (serve_ops) and its dispatch (serve_exec), the forward/backward of a
 * batch of datums spread over the ranks, the optimizer step, and a LoRA
 * model's create and unload.  The other ops run in exec_ckpt.c (saves,
 * loads, deletes), exec_sample.c (sampling) and exec_info.c (GET /info).
 * Engine calls only: every op leaves its outcome typed in the job on rank 0
 * (serve_exec_fn), and the wire format that made the job encodes it.
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
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "serve_impl.h"
#include "zdp/lora.h"

/* ---- execution (every rank) ---------------------------------------------------- */

jmp_buf *serve_fatal_jmp = NULL;
zdp_error serve_fatal_err;

void serve_die(const char *what, const zdp_error *err) {
    zdp_err_set(&serve_fatal_err, ZDP_ERR_FATAL, "%s: %s", what, err->msg);
    if (serve_fatal_jmp != NULL) longjmp(*serve_fatal_jmp, 1);
    abort(); /* a bug in zdp: serve_die outside zdp_server_run */
}

int serve_status_of(zdp_status st) {
    return st == ZDP_ERR_NOMEM || st == ZDP_ERR_COMM || st == ZDP_ERR_INTERNAL ? 500 : 400;
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

static void exec_fwd_(server *s, job *j) {
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
        if (s->R != 0) return;
        fprintf(stderr, "zdp serve: %s failed on every rank: %s\n", bwd ? "forward_backward" : "forward", ferr.msg);
        serve_job_fail(j, serve_status_of(fst), "forward_backward", ferr.msg);
        return;
    }
    /* Each position was filled by exactly one rank, the others hold 0: a sum
     * gathers them exactly. */
    if (s->W > 1 && zdp_channel_reduce_sum_f32(s->ch, lp, total, &err) != ZDP_OK) serve_die("forward", &err);
    if (s->R == 0) {
        /* Rank 0 keeps the result typed: the job's wire format encodes it. */
        serve_fwd_result *res = malloc(sizeof *res);
        if (res == NULL) serve_die("forward_backward", &(zdp_error){.msg = "out of memory"});
        *res = (serve_fwd_result){.n = n, .off = off, .logprobs = lp, .elementwise = el};
        for (int64_t i = 0; i < n; i++) {
            const int64_t o = off[i];
            double sum;
            datum_loss_(&h, len[i], lp + o, w + o, q + o, adv + o, coef + o, el + o, &sum);
            res->loss_sum += sum;
        }
        j->status = 200;
        j->fwd = res;
        off = NULL, lp = NULL, el = NULL;
    }
    free(off);
    free(lp);
    free(coef);
    free(el);
}

/* optim_step: the request's hyperparameters (the rest keep their values),
 * then the engine's step. */
static void exec_optim_(server *s, job *j) {
    optim_payload p;
    memcpy(&p, j->payload, sizeof p);
    /* Nothing to apply: refused before anything changes (the request's
     * hyperparameters included).  Every rank has the same count. */
    if (zdp_engine_pending_backwards(s->eng) == 0) {
        if (s->R != 0) return;
        serve_job_fail(j, 409, NULL,
                       "optim_step: no forward_backward since the last optim_step, so there is no "
                       "gradient to apply; nothing changed (adam_params included)");
        return;
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
            if (s->R != 0) return;
            serve_job_fail(j, 400, "adam_params", err.msg);
            return;
        }
        if (s->R == 0 && s->cfg.optimizer.type == ZDP_OPTIMIZER_SGD && (p.has[1] || p.has[2] || p.has[3]))
            sgd_warning = true;
    }
    zdp_status st = zdp_engine_step(s->eng, &err);
    if (st == ZDP_ERR_STATE) {
        /* The step did not run: neither do the request's hyperparameters. */
        if (any && zdp_engine_set_hparams(s->eng, &before, &err) != ZDP_OK) serve_die("optim_step", &err);
        if (s->R != 0) return;
        serve_job_fail(j, 409, NULL,
                       "optim_step: no forward_backward since the last optim_step, so there is no "
                       "gradient to apply; nothing changed");
        return;
    }
    if (st != ZDP_OK) serve_die("optim_step", &err);
    if (s->R != 0) return;
    j->status = 200;
    j->optim = (serve_optim_result){.grad_norm = zdp_engine_last_grad_norm(s->eng),
                                    .lr = zdp_engine_last_lr(s->eng),
                                    .step = zdp_engine_global_steps(s->eng),
                                    .global_samples = zdp_engine_global_samples(s->eng),
                                    .step_applied = zdp_engine_was_step_applied(s->eng),
                                    .sgd_warning = sgd_warning};
    j->has_optim = true;
}

/* OP_CREATE, every rank: a LoRA model (fresh adapters, PEFT's
 * initialisation from the seed; a fresh optimizer) in the payload's slot.
 * Every rank takes the same steps on the same inputs, so a refusal
 * (zdp_lora_create's: a rank larger than a target's dimensions) is every
 * rank's alike, and nothing changes. */
static void exec_create_(server *s, job *j) {
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
        if (s->R != 0) return;
        fprintf(stderr, "zdp serve: create_model %s refused: %s\n", model_id, err.msg);
        /* The library names the rank as "rank = N"; the client sent lora_config.rank. */
        const char *field = strstr(err.msg, "rank =") != NULL ? "lora_config.rank" : "lora_config";
        char msg[ZDP_ERROR_MSG_MAX + 64];
        snprintf(msg, sizeof msg, "%s: %s; nothing was created", field, err.msg);
        serve_job_fail(j, serve_status_of(st), field, msg);
        return;
    }
    x->model = &x->lora;
    x->uid = p.uid;
    x->lc = lc;
    snprintf(x->name, sizeof x->name, "%s", model_id);
    s->cur = x->model;
    s->eng = x->eng;
    /* Every rank draws the same initial adapters from the seed (at stage 3
     * each keeps its slice of them). */
    float **v = serve_adapters_get(s, false, &err);
    if (v == NULL) serve_die("create_model", &err);
    zdp_lora_init_params(x->model, v);
    if (serve_adapters_push(s, v, &err) != ZDP_OK) serve_die("create_model", &err);
    serve_adapters_free(s, v);
    if (s->R != 0) return;
    char targets[ZDP_LORA_TARGETS_NAME_MAX];
    zdp_lora_targets_name(lc.targets, lc.modules, targets, sizeof targets);
    fprintf(stderr, "zdp serve: create_model -> %s: LoRA rank %d, alpha %g, targets %s, seed %llu, "
            "%lld trainable parameters (slot %d)\n", model_id, lc.rank, p.alpha, targets,
            (unsigned long long)lc.seed, (long long)zdp_engine_numel(x->eng), p.slot);
    j->status = 200; /* the wire format answers with the payload's model_id */
}

/* OP_UNLOAD, every rank: frees the model's slot (its checkpoints stay). */
static void exec_unload_(server *s, job *j) {
    serve_slot_free(s, j->slot);
    s->cur = NULL;
    s->eng = NULL;
    if (s->R == 0) j->status = 200;
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

void serve_exec(server *s, job *j) {
    if (j->op < 0 || j->op >= SERVE_N_OPS || serve_ops[j->op].exec == NULL)
        serve_die("serve", &(zdp_error){.msg = "unknown request type from rank 0 (a bug in zdp)"});
    fatal_hook_(s, j);
    if (on_model_(j->op)) {
        /* The same table on every rank: each refuses alike, before any collective. */
        if (j->slot < 0 || j->slot >= s->opt.max_models || j->uid == 0 || s->slots[j->slot].uid != j->uid) {
            if (s->R == 0)
                serve_job_fail(j, 400, "model_id", "the model was unloaded (or its create_model failed) before "
                                                   "this request ran; nothing changed");
            return;
        }
        s->cur = s->slots[j->slot].model;
        s->eng = s->slots[j->slot].eng;
    }
    if (j->op != OP_INFO && j->op != OP_SAMPLE && j->op != OP_SAMPLE_FILE)
        s->wgen++; /* it may write weights: drop their packed copies */
    serve_ops[j->op].exec(s, j);
}
