/*
 * sampler.c -- token choice and batched generation (zdp/sample.h).
 *
 * zdp_generate keeps up to `batch` sequences in the cache's slots.  Every
 * pass is one zdp_lm_decode over: the whole prompt of each sequence that
 * joins a free slot (its prefill) and the last sampled token of each
 * running one.  A sequence draws from its own splitmix64 stream, so what it
 * samples does not depend on which others share its passes.  A sequence
 * with a LoRA adapter binds it to its slot; each pass lists its slots
 * grouped by adapter, so decode.c runs each adapter's products once over
 * all of its rows.  Not here: the pass over the cache (decode.c, the
 * model's decode step), dividing sequences across ranks (the callers).
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../core/core.h"
#include "../models/adapter.h"
#include "zdp/sample.h"

typedef struct ranked_ {
    float logit;
    int id;
} ranked_;

float zdp_logprob_of(const float *logits, int V, int target) {
    float top = logits[0];
    for (int v = 1; v < V; v++)
        if (logits[v] > top) top = logits[v];
    double z = 0;
    for (int v = 0; v < V; v++) z += exp((double)logits[v] - top);
    return (float)((double)logits[target] - top - log(z));
}

/* The heap of topk_logprobs: a[0] is the least likely kept (the lowest
 * logit, the higher id among equals), so it is the one a better token
 * replaces. */
static bool worse_(ranked_ x, ranked_ y) {
    return x.logit < y.logit || (x.logit == y.logit && x.id > y.id);
}

static void sift_down_(ranked_ *a, int k, int i) {
    for (;;) {
        int m = i;
        const int l = 2 * i + 1, r = l + 1;
        if (l < k && worse_(a[l], a[m])) m = l;
        if (r < k && worse_(a[r], a[m])) m = r;
        if (m == i) return;
        const ranked_ t = a[i];
        a[i] = a[m], a[m] = t;
        i = m;
    }
}

zdp_status zdp_topk_logprobs(const float *logits, int V, int k, int32_t *ids, float *logprobs) {
    if (k < 1 || k > V) return ZDP_ERR_INVALID_ARG;
    /* One pass with a k-entry min-heap: O(V log k), no (V) scratch.  The
     * normaliser is zdp_logprob_of's, so a listed logprob equals what it
     * gives for that token. */
    ranked_ stack_heap[64];
    ranked_ *a = k <= 64 ? stack_heap : malloc((size_t)k * sizeof *a);
    if (a == NULL) return ZDP_ERR_NOMEM;
    float top = logits[0];
    for (int v = 0; v < V; v++) {
        if (logits[v] > top) top = logits[v];
        const ranked_ x = {logits[v], v};
        if (v < k) {
            a[v] = x;
            if (v == k - 1)
                for (int i = k / 2 - 1; i >= 0; i--) sift_down_(a, k, i);
        } else if (worse_(a[0], x)) {
            a[0] = x;
            sift_down_(a, k, 0);
        }
    }
    double z = 0;
    for (int v = 0; v < V; v++) z += exp((double)logits[v] - top);
    const double lse = top + log(z);
    /* Pop the least likely into the last place: the output ends up descending. */
    for (int n = k; n > 0; n--) {
        ids[n - 1] = a[0].id;
        logprobs[n - 1] = (float)((double)a[0].logit - lse);
        a[0] = a[n - 1];
        sift_down_(a, n - 1, 0);
    }
    if (a != stack_heap) free(a);
    return ZDP_OK;
}

/* *kth = the k-th largest of logits (V), 1 <= k < V: the logit a sort by
 * logit descending puts in place k - 1.  A k-entry min-heap in one pass,
 * O(V log k) and most tokens rejected by one compare, where sorting all V
 * (tens of thousands of tokens in a Llama-family vocabulary) takes
 * milliseconds per row and step. */
static bool kth_logit_(const float *logits, int V, int k, float *kth) {
    ranked_ stack_heap[64] = {{0}}; /* (zeroed: GCC cannot see that k >= 1) */
    ranked_ *a = k <= 64 ? stack_heap : malloc((size_t)k * sizeof *a);
    if (a == NULL) return false;
    for (int v = 0; v < k; v++) a[v] = (ranked_){logits[v], v};
    for (int i = k / 2 - 1; i >= 0; i--) sift_down_(a, k, i);
    for (int v = k; v < V; v++)
        if (logits[v] > a[0].logit) {
            a[0] = (ranked_){logits[v], v};
            sift_down_(a, k, 0);
        }
    *kth = a[0].logit;
    if (a != stack_heap) free(a);
    return true;
}

/* exp(x) for x <= 0 in float, written so that GCC vectorises it (AVX-512 /
 * AVX2; every step a select or a bit operation, no branch and no
 * float-to-int conversion of a value that may be -inf): x = n ln2 + r with
 * n = round(x / ln2) (the 1.5 * 2^23 trick leaves it in the low mantissa
 * bits) and |r| <= ln2/2, exp(r) by its Taylor polynomial to r^7
 * (truncation < 1e-8 relative), 2^n put into the exponent bits.  At or
 * below n = -126 (x < about -86.96) and for -inf (a masked logit) it gives
 * 0: next to the row's top token's exp(0) = 1 such a term is far below the
 * sum's resolution.  Relative error a few float ulp (the unit test holds it
 * against libm's double exp).  Not nn.h's zdp_nn_exp_ (softmax and the
 * loss): that one takes any x, clamps below -88 to a denormal rather than
 * 0 and stops at r^6; a masked token must get exactly 0 here (it is never
 * drawn) and its logprob the extra term. */
static inline float exp_neg_(float x) {
    const float t = x * 1.44269504088896341f + 0x1.8p23f;
    int32_t tb;
    memcpy(&tb, &t, sizeof tb);
    const int32_t n0 = tb - 0x4b400000; /* round(x / ln2); garbage (and masked) far below */
    const int32_t keep = n0 > -126 ? -1 : 0;
    const int32_t n = n0 > -126 ? n0 : -126;
    const float nf = (float)n;
    const float r = (x - nf * 0.693145751953125f) - nf * 1.42860682030941723e-6f; /* ln2 hi + lo */
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const int32_t eb = (n + 127) * (1 << 23);
    float two_n;
    memcpy(&two_n, &eb, sizeof two_n);
    float y = p * two_n;
    int32_t yb;
    memcpy(&yb, &y, sizeof yb);
    yb &= keep;
    memcpy(&y, &yb, sizeof y);
    return y;
}

/* The sum of e (n) in double over 8 fixed lanes: the same order
 * everywhere (deterministic), and GCC vectorises it. */
static double lane_sum_(const float *e, int n) {
    double lane[8] = {0};
    int v = 0;
    for (; v + 8 <= n; v += 8)
        for (int j = 0; j < 8; j++) lane[j] += e[v + j];
    for (; v < n; v++) lane[v % 8] += e[v];
    return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

/* e (V) = exp((logits - top) * inv_t) for every token; returns their sum. */
static double row_exps_(const float *logits, int V, float top, float inv_t, float *e) {
    for (int v = 0; v < V; v++) e[v] = exp_neg_((logits[v] - top) * inv_t);
    return lane_sum_(e, V);
}

/* e of the tokens below cut set to 0 (so plain sums of e are the kept
 * mass); returns the sum of those kept. */
static double cut_exps_(const float *logits, float *e, int V, float cut) {
    for (int v = 0; v < V; v++) e[v] = logits[v] >= cut ? e[v] : 0.0f;
    return lane_sum_(e, V);
}

/* A token's logit and its exp at the sampling temperature. */
typedef struct weighed_ {
    float logit, e;
} weighed_;

/* The smallest logit kept by nucleus sampling: the most likely tokens (of
 * those at or above *cut, whose exps e sum to sum) whose probabilities first
 * reach top_p; ties with the last one are kept, as top-k keeps them.  That
 * is the largest logit c with mass(logit >= c) >= top_p * sum, found
 * without sorting (a sort of all 49,152 tokens per row took milliseconds):
 * one pass adds each candidate's e into a bucket by its distance below the
 * top logit (1/8 of a nat at the temperature per bucket; buckets are
 * ordered as the logits are, so every token of an earlier bucket is more
 * likely than every token of a later one); the cut lies in the bucket where
 * the running mass first reaches the target, and a selection over that
 * bucket's tokens alone finds it: partition around a pivot logit into
 * above / equal / below; the cut is among those above when their mass
 * reaches the target, the pivot when the equal ones make it reach, else
 * among those below, with the target less what the others hold.  w: (V)
 * scratch. */
enum { NUCLEUS_BUCKETS_ = 1024 };

/* A candidate's bucket from its distance below top: -inf logits, NaN and
 * distances past the last bucket go to the last. */
static inline int bucket_(float below, float scale) {
    const float d = below * scale;
    return d < (float)(NUCLEUS_BUCKETS_ - 1) ? (int)d : NUCLEUS_BUCKETS_ - 1;
}

static void top_p_cut_(const float *logits, const float *e, int V, float *cut, double sum,
                       double top_p, float top, float inv_t, weighed_ *w) {
    double mass[NUCLEUS_BUCKETS_] = {0}; /* (buckets) e summed by distance below top */
    const float scale = 8.0f * inv_t;
    for (int v = 0; v < V; v++)
        if (logits[v] >= *cut) {
            mass[bucket_(top - logits[v], scale)] += e[v];
        }
    double need = top_p * sum, acc = 0;
    int bk = 0;
    while (bk < NUCLEUS_BUCKETS_ - 1 && acc + mass[bk] < need) acc += mass[bk++];
    need -= acc;
    int m = 0;
    for (int v = 0; v < V; v++)
        if (logits[v] >= *cut && bucket_(top - logits[v], scale) == bk)
            w[m++] = (weighed_){logits[v], e[v]};
    if (m == 0) return; /* (rounding left need unmet past every token: none cut) */
    uint64_t pick = 0x9e3779b97f4a7c15u; /* pivot positions: fixed, so the cut is reproducible */
    for (;;) { /* m >= 1 */
        const float piv = w[(int)(zdp_splitmix64(&pick) % (uint64_t)m)].logit;
        /* Three-way partition: [0, a) above, [a, b) equal, [b, m) below. */
        int a = 0, b = 0, c = m;
        double above = 0, equal = 0;
        while (b < c) {
            const weighed_ x = w[b];
            if (x.logit > piv) {
                above += x.e;
                w[b++] = w[a], w[a++] = x;
            } else if (x.logit == piv) {
                equal += x.e;
                b++;
            } else {
                w[b] = w[--c], w[c] = x;
            }
        }
        if (above >= need && a > 0) {
            m = a; /* the cut is above the pivot */
        } else if (above + equal >= need || b == m) {
            /* the pivot (or, rounding leaving need unmet, the smallest) */
            *cut = piv;
            return;
        } else {
            need -= above + equal; /* below the pivot */
            w += b;
            m -= b;
        }
    }
}

/* The draw: the first token at or above cut whose running sum of e (0
 * below cut) reaches u.  Whole blocks of 64 whose sum leaves it below u are stepped over (one
 * vectorised sum, not 64 dependent adds); past the end (u within rounding
 * of the total), the last kept token, as a plain walk gives. */
static int draw_(const float *logits, const float *e, int V, float cut, double u) {
    double acc = 0;
    for (int v0 = 0; v0 < V; v0 += 64) {
        const int n = V - v0 < 64 ? V - v0 : 64;
        const double b = lane_sum_(e + v0, n); /* (e is 0 below cut) */
        if (acc + b < u) {
            acc += b;
            continue;
        }
        for (int v = v0; v < v0 + n; v++) {
            if (logits[v] < cut) continue;
            acc += e[v];
            if (acc >= u && e[v] > 0.0f) return v; /* (u = 0: never a token of no mass) */
        }
    }
    int t = V - 1;
    while (t > 0 && logits[t] < cut) t--;
    return t;
}

/* zdp_sample_token with its scratch: e (V) floats and w (V) for top_p. */
static int sample_row_(const float *logits, int V, const zdp_sample_params *sp, uint64_t *rng,
                       float *logprob, float *e, weighed_ *w) {
    /* The argmax: the largest logit over 16 lanes (vmaxps), then its first
     * place -- the token a plain strict-greater scan picks. */
    float lane[16];
    for (int j = 0; j < 16; j++) lane[j] = logits[0];
    int v = 0;
    for (; v + 16 <= V; v += 16)
        for (int j = 0; j < 16; j++) lane[j] = logits[v + j] > lane[j] ? logits[v + j] : lane[j];
    float top = lane[0];
    for (int j = 1; j < 16; j++) top = lane[j] > top ? lane[j] : top;
    for (; v < V; v++) top = logits[v] > top ? logits[v] : top;
    int best = 0;
    while (best < V - 1 && !(logits[best] == top)) best++;
    int t = best;
    const double temp = sp->temperature;
    bool have_z = false; /* sum_z: the temperature-1 normaliser, already summed */
    double sum_z = 0;
    if (temp > 0) {
        /* Each token's exp once: the sum, the nucleus, the walk and (at
         * temperature 1 with no cut) the logprob's normaliser reuse it. */
        double sum = row_exps_(logits, V, top, (float)(1.0 / temp), e);
        if (temp == 1.0) have_z = true, sum_z = sum;
        /* Top-k: the k-th largest logit is the cut-off (ties kept). */
        float cut = -INFINITY;
        if (sp->top_k > 0 && sp->top_k < V) {
            if (!kth_logit_(logits, V, sp->top_k, &cut)) return -1;
            sum = cut_exps_(logits, e, V, cut);
        }
        if (sp->top_p < 1.0) {
            top_p_cut_(logits, e, V, &cut, sum, sp->top_p, top, (float)(1.0 / temp), w);
            sum = cut_exps_(logits, e, V, cut);
        }
        t = draw_(logits, e, V, cut, (double)(zdp_splitmix64(rng) >> 11) * 0x1.0p-53 * sum);
    }
    if (logprob != NULL) {
        if (!have_z) sum_z = row_exps_(logits, V, top, 1.0f, e);
        *logprob = (float)((double)logits[t] - top - log(sum_z));
    }
    return t;
}

int zdp_sample_token(const float *logits, int V, const zdp_sample_params *sp, uint64_t *rng,
                     float *logprob) {
    float *e = malloc((size_t)V * sizeof *e);
    weighed_ *w = sp->temperature > 0 && sp->top_p < 1.0 ? malloc((size_t)V * sizeof *w) : NULL;
    int t = -1;
    if (e != NULL && (w != NULL || !(sp->temperature > 0 && sp->top_p < 1.0)))
        t = sample_row_(logits, V, sp, rng, logprob, e, w);
    free(e);
    free(w);
    return t;
}

/* Slots ordered by their sequence's adapter (the base's first), then by
 * slot: qsort's context through a file-private pointer is not reentrant,
 * so the key is carried in the array itself. */
typedef struct slot_key_ {
    uintptr_t lora, adapter;
    int slot;
} slot_key_;

static int by_adapter_(const void *a, const void *b) {
    const slot_key_ *x = a, *y = b;
    if (x->lora != y->lora) return x->lora < y->lora ? -1 : 1;
    if (x->adapter != y->adapter) return x->adapter < y->adapter ? -1 : 1;
    return (x->slot > y->slot) - (x->slot < y->slot);
}

static double now_(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A sequence whose prefill keeps every prompt row's logits. */
static bool wants_prompt_(const zdp_gen_seq *s) {
    return s->prompt_logprobs != NULL || s->prompt_topk > 0;
}

static zdp_status check_seqs_(const zdp_model *model, const zdp_gen_seq *seqs, int n_seqs,
                              int batch, zdp_error *err) {
    const char *fn = "zdp_generate";
    if (batch < 1)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "%s: batch = %d: must be >= 1", fn, batch);
    for (int i = 0; i < n_seqs; i++) {
        const zdp_gen_seq *s = &seqs[i];
        if (s->prompt == NULL || s->prompt_len < 1 || s->prompt_len > model->block_size)
            return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                               "%s: seqs[%d].prompt_len = %d: a prompt needs 1..%d tokens (the "
                               "model's context, block_size)",
                               fn, i, s->prompt_len, model->block_size);
        if (s->max_tokens < 0 || s->max_tokens > model->block_size - s->prompt_len)
            return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                               "%s: seqs[%d].max_tokens = %d: the prompt's %d tokens plus "
                               "max_tokens must fit the model's context (block_size %d): at "
                               "most %d",
                               fn, i, s->max_tokens, s->prompt_len, model->block_size,
                               model->block_size - s->prompt_len);
        if (s->max_tokens > 0 && s->out == NULL)
            return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "%s: seqs[%d].out must be set", fn, i);
        if (s->prompt_topk < 0 || s->prompt_topk > model->vocab_size)
            return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                               "%s: seqs[%d].prompt_topk = %d: must be in 0..%d (vocab_size)", fn,
                               i, s->prompt_topk, model->vocab_size);
        if (s->prompt_topk > 0 && (s->prompt_topk_ids == NULL || s->prompt_topk_logprobs == NULL))
            return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                               "%s: seqs[%d].prompt_topk = %d needs prompt_topk_ids and "
                               "prompt_topk_logprobs",
                               fn, i, s->prompt_topk);
        if (s->lora != NULL && s->adapter == NULL)
            return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                               "%s: seqs[%d].adapter is NULL: a LoRA model (seqs[%d].lora) needs "
                               "its adapter tensors",
                               fn, i, i);
        zdp_error why;
        if (s->lora != NULL && !zdp_lora_fits_(s->lora, model, &why))
            return zdp_err_set(err, why.code, "%s: seqs[%d].lora: %s", fn, i, why.msg);
        for (int t = 0; t < s->prompt_len; t++)
            if (s->prompt[t] < 0 || s->prompt[t] >= model->vocab_size)
                return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                                   "%s: seqs[%d].prompt[%d] = %d: token ids must be in [0, %d) "
                                   "(vocab_size)",
                                   fn, i, t, (int)s->prompt[t], model->vocab_size);
    }
    return ZDP_OK;
}

zdp_status zdp_generate(const zdp_model *model, const float *const *params, zdp_kv_cache *kv,
                        zdp_gen_seq *seqs, int n_seqs, int batch, zdp_gen_stats *stats,
                        zdp_error *err) {
    const char *fn = "zdp_generate";
    if (model == NULL || params == NULL || (seqs == NULL && n_seqs > 0) || n_seqs < 0)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "%s: model, params and seqs must be set",
                           fn);
    zdp_status st = check_seqs_(model, seqs, n_seqs, batch, err);
    if (st != ZDP_OK) return st;
    if (batch > n_seqs) batch = n_seqs > 0 ? n_seqs : 1;
    zdp_kv_cache *own = NULL;
    if (kv == NULL) {
        int longest = 1; /* positions a slot needs: the longest prompt + max_tokens */
        for (int i = 0; i < n_seqs; i++)
            if (seqs[i].prompt_len + seqs[i].max_tokens > longest)
                longest = seqs[i].prompt_len + seqs[i].max_tokens;
        st = zdp_kv_create(model, batch, longest, &own, err);
        if (st != ZDP_OK) return st;
        kv = own;
    } else if (zdp_kv_slots(kv) < batch) {
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "%s: the cache has %d slots, fewer than batch = %d", fn,
                           zdp_kv_slots(kv), batch);
    }
    const double t0 = now_();
    const int V = model->vocab_size;
    int *slot_seq = malloc((size_t)batch * sizeof *slot_seq);   /* (batch) sequence or -1 */
    int32_t *pending = malloc((size_t)batch * sizeof *pending);  /* (batch) token to feed */
    uint64_t *rng = malloc((size_t)(n_seqs > 0 ? n_seqs : 1) * sizeof *rng);
    slot_key_ *order = malloc((size_t)batch * sizeof *order); /* (batch) this pass's slot order */
    /* (batch) a joiner's prompt is another joiner's of this pass: the slot
     * whose prefill it copies, else -1; and each slot's row of logits. */
    int *copy_of = malloc((size_t)batch * sizeof *copy_of);
    const float **row_of = malloc((size_t)batch * sizeof *row_of);
    /* Choosing a token's scratch, once per call: each row's exps (V) and
     * the nucleus's candidates (V). */
    float *ex = malloc((size_t)V * sizeof *ex);
    weighed_ *cand = malloc((size_t)V * sizeof *cand);
    int cap = 0, lcap = 0;
    int32_t *rs = NULL, *rt = NULL;
    uint8_t *rw = NULL;
    float *logits = NULL;
    zdp_gen_stats sts = {0};
    if (slot_seq == NULL || pending == NULL || rng == NULL || order == NULL || copy_of == NULL ||
        row_of == NULL || ex == NULL || cand == NULL) {
        st = zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory", fn);
        goto out;
    }
    for (int i = 0; i < n_seqs; i++) {
        rng[i] = seqs[i].seed;
        seqs[i].n_out = 0;
        seqs[i].stopped = 0;
    }
    for (int b = 0; b < batch; b++) slot_seq[b] = -1;
    int next = 0;
    for (;;) {
        /* This pass's rows: joiners' prompts, then running sequences. */
        int n = 0, m = 0, need = 0;
        for (int b = 0; b < batch; b++) {
            if (slot_seq[b] < 0) {
                while (next < n_seqs && seqs[next].max_tokens == 0 && !wants_prompt_(&seqs[next]))
                    next++; /* nothing to compute */
                if (next < n_seqs) {
                    slot_seq[b] = next++;
                    zdp_kv_clear(kv, b);
                    st = zdp_kv_set_adapter(kv, b, seqs[slot_seq[b]].lora,
                                            seqs[slot_seq[b]].adapter, err);
                    if (st != ZDP_OK) goto out;
                    need += seqs[slot_seq[b]].prompt_len;
                    pending[b] = -1; /* prefill */
                }
            } else {
                need++;
            }
        }
        if (need == 0) break;
        /* Each adapter's rows together: one run per adapter in decode.c. */
        int n_live = 0;
        for (int b = 0; b < batch; b++)
            if (slot_seq[b] >= 0)
                order[n_live++] = (slot_key_){(uintptr_t)seqs[slot_seq[b]].lora,
                                              (uintptr_t)seqs[slot_seq[b]].adapter, b};
        qsort(order, (size_t)n_live, sizeof *order, by_adapter_);
        if (need > cap) {
            int32_t *a = realloc(rs, (size_t)need * sizeof *a);
            if (a != NULL) rs = a;
            int32_t *c = realloc(rt, (size_t)need * sizeof *c);
            if (c != NULL) rt = c;
            uint8_t *w = realloc(rw, (size_t)need);
            if (w != NULL) rw = w;
            if (a == NULL || c == NULL || w == NULL) {
                st = zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory for %d rows", fn, need);
                goto out;
            }
            cap = need;
        }
        for (int k = 0; k < n_live; k++) {
            const int b = order[k].slot;
            const zdp_gen_seq *s = &seqs[slot_seq[b]];
            copy_of[b] = -1;
            if (pending[b] < 0 && !wants_prompt_(s)) {
                /* The same prompt (and adapter: order keeps them adjacent)
                 * as an earlier joiner of this pass: its prefill is shared,
                 * not run again (a request's samples share their prompt). */
                for (int e = k - 1; e >= 0 && order[e].lora == order[k].lora &&
                                    order[e].adapter == order[k].adapter; e--) {
                    const int c = order[e].slot;
                    const zdp_gen_seq *o = &seqs[slot_seq[c]];
                    if (pending[c] < 0 && copy_of[c] < 0 && !wants_prompt_(o) &&
                        o->prompt_len == s->prompt_len &&
                        memcmp(o->prompt, s->prompt, (size_t)s->prompt_len * sizeof *s->prompt) == 0) {
                        copy_of[b] = c;
                        break;
                    }
                }
                if (copy_of[b] >= 0) {
                    sts.prefill_shared += s->prompt_len;
                    continue;
                }
            }
            if (pending[b] < 0) {
                for (int t = 0; t < s->prompt_len; t++) {
                    rs[n] = b, rt[n] = s->prompt[t];
                    rw[n] = wants_prompt_(s) || t == s->prompt_len - 1;
                    m += rw[n++];
                }
                sts.prefill_tokens += s->prompt_len;
            } else {
                rs[n] = b, rt[n] = pending[b], rw[n++] = 1, m++;
                sts.decode_tokens++;
            }
        }
        if (m > lcap) {
            float *l = realloc(logits, (size_t)m * V * sizeof *l);
            if (l == NULL) {
                st = zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory for %d x %d logits", fn,
                                 m, V);
                goto out;
            }
            logits = l, lcap = m;
        }
        st = zdp_lm_decode(kv, params, rs, rt, n, rw, logits, err);
        if (st != ZDP_OK) goto out;
        sts.passes++;
        /* Walk the logits in row order: each slot's last wanted row samples
         * (a shared prefill: its source's row, and its keys and values, read
         * in place: decode.c attends over them once for the group's rows). */
        const float *lg = logits;
        for (int k = 0; k < n_live; k++) {
            const int b = order[k].slot;
            zdp_gen_seq *s = &seqs[slot_seq[b]];
            if (copy_of[b] >= 0) {
                zdp_kv_share_slot(kv, b, copy_of[b]);
                row_of[b] = row_of[copy_of[b]];
            }
            if (pending[b] < 0 && wants_prompt_(s)) {
                const int K = s->prompt_topk;
                if (s->prompt_logprobs != NULL) s->prompt_logprobs[0] = 0.0f;
                for (int j = 0; j < K; j++)
                    s->prompt_topk_ids[j] = -1, s->prompt_topk_logprobs[j] = NAN;
                for (int t = 0; t + 1 < s->prompt_len; t++, lg += V) {
                    if (s->prompt_logprobs != NULL)
                        s->prompt_logprobs[t + 1] = zdp_logprob_of(lg, V, s->prompt[t + 1]);
                    if (K > 0 && zdp_topk_logprobs(lg, V, K, s->prompt_topk_ids + (int64_t)(t + 1) * K,
                                                   s->prompt_topk_logprobs + (int64_t)(t + 1) * K) != ZDP_OK) {
                        st = zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory for top-%d prompt logprobs",
                                         fn, K);
                        goto out;
                    }
                }
            }
            const float *row = copy_of[b] >= 0 ? row_of[b] : lg;
            if (copy_of[b] < 0) row_of[b] = lg, lg += V;
            if (s->max_tokens == 0) { /* prompt logprobs only */
                slot_seq[b] = -1;
                continue;
            }
            float lp;
            const int tok = sample_row_(row, V, &s->sp, &rng[slot_seq[b]], &lp, ex, cand);
            if (tok < 0) {
                st = zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory choosing a token", fn);
                goto out;
            }
            s->out[s->n_out] = tok;
            if (s->out_logprobs != NULL) s->out_logprobs[s->n_out] = lp;
            s->n_out++;
            for (int j = 0; j < s->n_stop_ids; j++)
                if (s->stop_ids[j] == tok) s->stopped = 1;
            if (!s->stopped && s->stop_fn != NULL && s->stop_fn(s->stop_user, s->out, s->n_out))
                s->stopped = 1;
            if (s->stopped || s->n_out == s->max_tokens)
                slot_seq[b] = -1; /* leaves; the next pass fills the slot */
            else
                pending[b] = tok;
        }
    }
out:
    sts.seconds = now_() - t0;
    sts.kv_bytes = zdp_kv_bytes(kv);
    if (stats != NULL) *stats = sts;
    free(slot_seq);
    free(pending);
    free(rng);
    free(order);
    free(copy_of);
    free(row_of);
    free(ex);
    free(cand);
    free(rs);
    free(rt);
    free(rw);
    free(logits);
    zdp_kv_destroy(own);
    return st;
}
