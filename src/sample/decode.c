/*
 * decode.c -- a pass over the KV cache (zdp_lm_decode, zdp/sample.h): the
 * model's incremental forward on a ragged batch of rows, every row one
 * (slot, token) at the slot's next position.
 *
 * The model walks its own layers (its decode step, src/models/decode.h);
 * this file gives it the rows, the scratch and its services.  Products: one
 * matrix product per weight over all rows (a prefill's prompt and a decode
 * step's sequences alike); where the packed kernels beat the BLAS
 * (zdp_nn_packed_wins), a pass of 2..PACK_ROWS_ rows multiplies by weights
 * packed once per cache, or once per weights snapshot in a store shared by
 * caches (zdp_kv_set_packs; cblas_sgemm would re-pack each weight on every
 * step); one row goes to sgemv, more rows to the nn kernels' sgemm.
 * Adapters: after each adaptable linear's base product over all rows, each
 * run of consecutive rows whose slots share an adapter adds that adapter's
 * (alpha/r) (x A^T) B^T, as lora.c's hooks do in training.  Attention: the
 * rows' keys and values are stored, then the batch plan (plan_attention_)
 * splits the rows into prompt blocks, groups over a shared prompt and lone
 * rows, which src/nn/kv_attention.c attends on the thread pool.  Not here:
 * the cache's slots and sharing (kv.c), token choice and scheduling
 * (sampler.c), stage-3 gathering (the caller passes whole weights).
 */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "../core/core.h"
#include "../models/adapter.h"
#include "../models/decode.h"
#include "../nn/kv_attention.h"
#include "../nn/nn.h"
#include "kv_impl.h"
#include "zdp/sample.h"

/* Passes of 2..PACK_ROWS_ rows go to the packed kernels; longer ones (a
 * batch of prompts' prefill) to training's linear (zdp_nn_linear_forward:
 * gemm.c or cblas_sgemm), whose blocking pays there while a packed weight's
 * single pass over long A does not. */
#define PACK_ROWS_ 256

/* Runs of at least PROMPT_ROWS_ rows of one slot at consecutive positions
 * (a prompt's prefill) attend as products, in blocks of ZDP_KV_PROMPT_BLOCK
 * query rows (plan_attention_). */
#define PROMPT_ROWS_ 16

/* ---- scratch ---- */

/* Scratch for n rows. */
static bool reserve_(zdp_kv_cache *kv, int n) {
    if (n <= kv->rows_cap) return true;
    const size_t N = (size_t)n, QD = (size_t)kv->NH * kv->hd, KD = (size_t)kv->KV * kv->hd;
    float **f[] = {&kv->x, &kv->h, &kv->qkv, &kv->q, &kv->k_rows, &kv->v_rows, &kv->atty,
                   &kv->f1, &kv->f2, &kv->mean, &kv->rstd};
    const size_t sz[] = {N * kv->C, N * kv->C, N * 3 * kv->C, N * QD, N * KD, N * KD, N * QD,
                         N * kv->F, N * kv->F, N, N * kv->NH};
    int64_t bytes = 0;
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        float *p = realloc(*f[i], sz[i] * sizeof(float));
        if (p == NULL) return false;
        *f[i] = p;
        bytes += (int64_t)sz[i] * 4;
    }
    int *pos = realloc(kv->pos, N * sizeof *pos);
    if (pos == NULL) return false;
    kv->pos = pos;
    int32_t *ws = realloc(kv->head_slots, N * sizeof *ws);
    if (ws == NULL) return false;
    kv->head_slots = ws;
    int *lone = realloc(kv->lone_rows, N * sizeof *lone);
    if (lone == NULL) return false;
    kv->lone_rows = lone;
    kv_prompt_block *blocks = realloc(kv->blocks, N * sizeof *blocks);
    if (blocks == NULL) return false;
    kv->blocks = blocks;
    kv_share_group *groups = realloc(kv->groups, N * sizeof *groups);
    if (groups == NULL) return false;
    kv->groups = groups;
    int *group_rows = realloc(kv->group_rows, N * sizeof *group_rows);
    if (group_rows == NULL) return false;
    kv->group_rows = group_rows;
    const int64_t score = (int64_t)kv->n_threads * (kv->NH * kv->T + QD);
    if (kv->row_scratch == NULL) { /* (threads, NH T + QD) one row's attention scores
                                    * and its prompt's weighted values, per thread */
        kv->row_scratch = malloc((size_t)score * sizeof(float));
        if (kv->row_scratch == NULL) return false;
    }
    kv->rows_cap = n;
    kv->scratch_bytes = bytes + 10 * (int64_t)N * 4 + score * 4 +
                        kv->n_threads * kv->group_scratch_floats * 4;
    return true;
}

/* ---- products ----
 * A one-row product is a matrix-vector product: cblas_sgemv reads each
 * weight once, where sgemm with one row first copies (packs) the whole
 * weight matrix (batch-1 decode is bound by reading the weights).  Passes
 * of up to PACK_ROWS_ rows multiply by the packed copy; longer passes (and
 * any, out of memory for the copy) go to the nn kernels training uses. */

typedef struct pack_job_ {
    float *dst;
    const float *W;
    int64_t K, N, panel_floats;
    int trans;
} pack_job_;

/* Panels [lo, hi) of one weight: 16 columns each (zdp_nn_pack_b of the
 * column range, which packs into the same place). */
static void pack_range_(void *ctx, int64_t lo, int64_t hi) {
    const pack_job_ *j = ctx;
    for (int64_t p = lo; p < hi; p++) {
        const int64_t n0 = p * 16, n = j->N - n0 < 16 ? j->N - n0 : 16;
        float *d = j->dst + p * j->panel_floats;
        if (j->trans) {
            zdp_nn_pack_b(d, j->W + n0 * j->K, j->K, n, 1);
        } else { /* a (K, n) column block of the (K, N) matrix */
            for (int64_t k = 0; k < j->K; k++)
                for (int64_t c = 0; c < 16; c++)
                    d[k * 16 + c] = c < n ? j->W[k * j->N + n0 + c] : 0.0f;
        }
    }
}

/* The packed copy of weight idx, B (K,N) (trans: stored (N,K)), made on
 * its first use; NULL when out of memory (the caller uses sgemm then). */
static const float *packed_(zdp_kv_cache *kv, const float *const *P, int idx, int64_t K, int64_t N,
                            int trans) {
    zdp_kv_packs *store = kv->packs;
    if (store->packed[idx] != NULL && store->src[idx] == P[idx]) return store->packed[idx];
    const int64_t floats = zdp_nn_packed_floats(K, N);
    if (store->packed[idx] == NULL) {
        if ((store->packed[idx] = zdp_big_alloc((size_t)floats * sizeof(float))) == NULL)
            return NULL;
        store->bytes += floats * 4;
    }
    pack_job_ j = {.dst = store->packed[idx],
                   .W = P[idx],
                   .K = K,
                   .N = N,
                   .panel_floats = K * 16,
                   .trans = trans};
    zdp_nn_parallel_ranges_((N + 15) / 16, 8, pack_range_, &j);
    store->src[idx] = P[idx];
    store->packs++;
    return store->packed[idx];
}

/* out (N,OC) [+]= inp (N,C) @ W^T + bias, W (OC,C): torch.nn.Linear, any
 * weights (the adapters' too) */
static void gemm_nt_(float *out, const float *inp, const float *W, const float *bias, int64_t N,
                     int64_t C, int64_t OC, int accumulate) {
    if (N != 1) {
        zdp_nn_linear_forward(out, inp, W, bias, N, C, OC, accumulate);
        return;
    }
    cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)OC, (int)C, 1.0f, W, (int)C, inp, 1,
                accumulate ? 1.0f : 0.0f, out, 1);
    if (bias != NULL)
        for (int64_t o = 0; o < OC; o++) out[o] += bias[o];
}

/* The same for the model's weight P[w]: a pass of 2..PACK_ROWS_ rows
 * multiplies by its packed copy where the packed kernels win
 * (zdp_nn_packed_wins), else by the weight itself through the BLAS. */
static void linear_(zdp_kv_cache *kv, const float *const *P, float *out, const float *inp, int w,
                    const float *bias, int64_t N, int64_t C, int64_t OC, int accumulate) {
    const float *Bp =
        N > 1 && N <= PACK_ROWS_ && zdp_nn_packed_wins(N) ? packed_(kv, P, w, C, OC, 1) : NULL;
    if (Bp != NULL)
        zdp_nn_packed_gemm(out, OC, inp, C, Bp, bias, N, C, OC, accumulate);
    else
        gemm_nt_(out, inp, P[w], bias, N, C, OC, accumulate);
}

/* out (N,OC) = inp (N,C) @ W + bias, W = P[w] (C,OC): Hugging Face Conv1D (GPT-2) */
static void conv1d_(zdp_kv_cache *kv, const float *const *P, float *out, const float *inp, int w,
                    const float *bias, int64_t N, int64_t C, int64_t OC) {
    const float *W = P[w], *Bp = N > 1 && N <= PACK_ROWS_ && zdp_nn_packed_wins(N)
                                     ? packed_(kv, P, w, C, OC, 0)
                                     : NULL;
    if (Bp != NULL) {
        zdp_nn_packed_gemm(out, OC, inp, C, Bp, bias, N, C, OC, 0);
        return;
    }
    if (N != 1) {
        zdp_nn_matmul_forward(out, inp, W, bias, N, C, OC);
        return;
    }
    cblas_sgemv(CblasRowMajor, CblasTrans, (int)C, (int)OC, 1.0f, W, (int)OC, inp, 1, 0.0f, out,
                1);
    if (bias != NULL)
        for (int64_t o = 0; o < OC; o++) out[o] += bias[o];
}

/* ---- adapters ---- */

/* out (N, s.out) += the adapter product of inp (N, s.in) for site `site`,
 * row i by the adapter of slot rs[i]: one pair of products per run of
 * consecutive rows sharing an adapter (zdp_generate orders its rows so that
 * each adapter's are one run).  xa = (alpha/r) (x A^T), out += xa B^T: the
 * order of lora.c's hook, so the sums round as in training. */
static void adapt_(zdp_kv_cache *kv, int site, float *out, const float *inp, int64_t N,
                   const int32_t *rs) {
    if (site < 0 || kv->n_adapted == 0) return;
    const int64_t in = kv->sites[site].in, od = kv->sites[site].out;
    for (int64_t i = 0; i < N;) {
        const zdp_model *lm = kv->slot_lora[rs[i]];
        const float *const *ad = kv->slot_adapter[rs[i]];
        int64_t j = i + 1;
        while (j < N && kv->slot_lora[rs[j]] == lm && kv->slot_adapter[rs[j]] == ad) j++;
        const int p = zdp_lora_site_param_(lm, site);
        if (p >= 0) {
            const zdp_lora_config *c = zdp_lora_config_of(lm);
            const int64_t r = c->rank;
            const float scale = c->alpha / (float)c->rank;
            gemm_nt_(kv->lora_xa, inp + i * in, ad[p], NULL, j - i, in, r, 0);
            for (int64_t k = 0; k < (j - i) * r; k++) kv->lora_xa[k] *= scale;
            gemm_nt_(out + i * od, kv->lora_xa, ad[p + 1], NULL, j - i, r, od, 1);
        }
        i = j;
    }
}


/* ---- attention: the batch plan and its tasks ---- */

/* One layer's attention over a pass's rows (attend_task_'s context). */
typedef struct attend_job_ {
    zdp_kv_cache *kv;
    zdp_nn_kv_layer layer;
    zdp_nn_kv_rows rows;
} attend_job_;

/* Task t of a pass's attention: the prompt blocks' (block, head) pairs
 * first (the larger tasks), then the shared prompts' groups' chunks of
 * rows, then the lone rows, each on its own slot. */
static void attend_task_(void *ctx, int64_t task, int thread) {
    const attend_job_ *j = ctx;
    zdp_kv_cache *kv = j->kv;
    const int64_t QD = (int64_t)kv->NH * kv->hd;
    const int64_t nb = (int64_t)kv->n_blocks * kv->NH,
                  ng = (int64_t)kv->n_groups * kv->chunks_per_group;
    if (task < nb) {
        const kv_prompt_block *b = &kv->blocks[task / kv->NH];
        zdp_nn_kv_attend_prompt_block(&j->layer, &j->rows, b->first, b->n_rows, task % kv->NH,
                                      kv->block_scores +
                                          (int64_t)thread * ZDP_KV_PROMPT_BLOCK * kv->T);
        return;
    }
    if (task < nb + ng) {
        const int chunks = kv->chunks_per_group;
        const kv_share_group *g = &kv->groups[(task - nb) / chunks];
        const int c = (int)((task - nb) % chunks);
        const int r0 = g->n_rows * c / chunks, r1 = g->n_rows * (c + 1) / chunks;
        zdp_nn_kv_attend_shared_prompt(
            &j->layer, &j->rows, kv->group_rows + g->first + r0, r1 - r0, g->prompt_slot,
            g->prompt_len, kv->group_scratch + (int64_t)thread * kv->group_scratch_floats);
        return;
    }
    const int64_t i = kv->lone_rows[task - nb - ng];
    zdp_nn_kv_attend_row(&j->layer, &j->rows, i, kv->prompt_len[j->rows.slots[i]],
                         kv->row_scratch + (int64_t)thread * (kv->NH * kv->T + QD));
}

/* The slot whose storage holds slot s's prompt: its lender, or s itself. */
static int prompt_slot_(const zdp_kv_cache *kv, int s) {
    return kv->lender[s] >= 0 ? kv->lender[s] : s;
}

/* Whether slot s takes part in prompt sharing (a sharer, or lent to one). */
static bool shares_(const zdp_kv_cache *kv, int s) {
    return kv->lender[s] >= 0 || kv->n_sharers[s] > 0;
}

/* Splits a pass's rows for attention: runs of at least PROMPT_ROWS_ rows on
 * one slot at consecutive positions (a prompt's prefill) into blocks of up
 * to ZDP_KV_PROMPT_BLOCK rows, attended as products; every other row alone,
 * or, when its slot shares a prompt, in that prompt's group.  The split
 * depends only on each run, not on what else is in the pass, so a prompt's
 * attention gets the same bits in any batch.  false: out of memory for the
 * blocks' or the groups' scores. */
static bool plan_attention_(zdp_kv_cache *kv, const int32_t *slots, int n) {
    kv->n_lone = kv->n_blocks = 0;
    for (int i = 0; i < n;) {
        int e = i + 1;
        while (e < n && slots[e] == slots[i] && kv->pos[e] == kv->pos[e - 1] + 1) e++;
        if (e - i >= PROMPT_ROWS_ && kv->lender[slots[i]] < 0) { /* (a sharer's
            * positions are in two places: its rows go one by one) */
            for (int r = i; r < e; r += ZDP_KV_PROMPT_BLOCK)
                kv->blocks[kv->n_blocks++] = (kv_prompt_block){
                    .first = r,
                    .n_rows = e - r < ZDP_KV_PROMPT_BLOCK ? e - r : ZDP_KV_PROMPT_BLOCK};
        } else {
            for (int r = i; r < e; r++) kv->lone_rows[kv->n_lone++] = r;
        }
        i = e;
    }
    /* Lone rows over a shared prompt (a sharer's, or the shared slot's own),
     * by prompt: one group each, its rows in row order. */
    int nl = 0, most = 0;
    kv->n_groups = 0;
    for (int a = 0; a < kv->n_lone; a++) {
        const int s = slots[kv->lone_rows[a]], ps = prompt_slot_(kv, s);
        if (!shares_(kv, s)) continue;
        int g = 0;
        while (g < kv->n_groups && kv->groups[g].prompt_slot != ps) g++;
        if (g == kv->n_groups)
            kv->groups[kv->n_groups++] = (kv_share_group){
                .first = 0, .n_rows = 0, .prompt_slot = ps, .prompt_len = kv->lent_len[ps]};
        kv->groups[g].n_rows++;
        if (kv->groups[g].n_rows > most) most = kv->groups[g].n_rows;
    }
    for (int g = 0, at = 0; g < kv->n_groups; g++) { /* each group's first index, then its rows */
        kv->groups[g].first = at;
        for (int a = 0; a < kv->n_lone; a++) {
            const int i = kv->lone_rows[a], s = slots[i];
            if (prompt_slot_(kv, s) == kv->groups[g].prompt_slot && shares_(kv, s))
                kv->group_rows[at++] = i;
        }
    }
    for (int a = 0; a < kv->n_lone; a++) /* the rest stay lone */
        if (!shares_(kv, slots[kv->lone_rows[a]])) kv->lone_rows[nl++] = kv->lone_rows[a];
    kv->n_lone = nl;
    /* Each group's rows in as many chunks as it takes to give every thread
     * a task (one group on two threads: two chunks, each reading the prompt
     * once); a chunk's scratch is (rows, NH, T + hd). */
    kv->chunks_per_group = kv->n_groups > 0 && kv->n_groups < kv->n_threads
                               ? (kv->n_threads + kv->n_groups - 1) / kv->n_groups
                               : 1;
    const int64_t per = (int64_t)((most + kv->chunks_per_group - 1) / kv->chunks_per_group) *
                        kv->NH * (kv->T + kv->hd);
    if (per > kv->group_scratch_floats) {
        float *g = realloc(kv->group_scratch, (size_t)(kv->n_threads * per) * sizeof(float));
        if (g == NULL) return false;
        kv->scratch_bytes += (int64_t)kv->n_threads * (per - kv->group_scratch_floats) * 4;
        kv->group_scratch = g, kv->group_scratch_floats = per;
    }
    if (kv->n_blocks > 0 && kv->block_scores == NULL) {
        const int64_t f = (int64_t)kv->n_threads * ZDP_KV_PROMPT_BLOCK * kv->T;
        if ((kv->block_scores = malloc((size_t)f * sizeof(float))) == NULL) return false;
        kv->scratch_bytes += f * 4;
    }
    return true;
}

/* ---- the pass: the model's decode step over the cache ---- */

/* What the model's decode step calls back into (zdp_decode_pass.ctx). */
typedef struct pass_ctx_ {
    zdp_kv_cache *kv;
    const float *const *P;
    const int32_t *slots; /* (n) each row's slot */
    int n;                /* rows in the pass */
} pass_ctx_;

static void pass_linear_(void *ctx, float *out, const float *inp, int w, const float *bias,
                         int64_t N, int64_t C, int64_t OC, int accumulate) {
    const pass_ctx_ *p = ctx;
    linear_(p->kv, p->P, out, inp, w, bias, N, C, OC, accumulate);
}

static void pass_conv1d_(void *ctx, float *out, const float *inp, int w, const float *bias,
                         int64_t N, int64_t C, int64_t OC) {
    const pass_ctx_ *p = ctx;
    conv1d_(p->kv, p->P, out, inp, w, bias, N, C, OC);
}

static void pass_adapt_(void *ctx, int site, float *out, const float *inp, int64_t N, int head) {
    const pass_ctx_ *p = ctx;
    adapt_(p->kv, site, out, inp, N, head ? p->kv->head_slots : p->slots);
}

/* Stores every row's key and value, then attends: a prompt's rows see each
 * other up to their own position. */
static void pass_attend_(void *ctx, int layer, const float *q, int64_t q_stride, const float *k,
                         const float *v, int64_t kv_stride) {
    const pass_ctx_ *p = ctx;
    zdp_kv_cache *kv = p->kv;
    const int64_t KD = (int64_t)kv->KV * kv->hd, T = kv->T;
    const int64_t layer_floats = (int64_t)kv->n_slots * T * KD;
    for (int i = 0; i < p->n; i++) {
        const int64_t at = (((int64_t)layer * kv->n_slots + p->slots[i]) * T + kv->pos[i]) * KD;
        memcpy(kv->k + at, k + i * kv_stride, (size_t)KD * sizeof(float));
        memcpy(kv->v + at, v + i * kv_stride, (size_t)KD * sizeof(float));
    }
    attend_job_ j = {.kv = kv,
                     .layer = {.k = kv->k + layer * layer_floats, .v = kv->v + layer * layer_floats,
                               .T = T, .NH = kv->NH, .KV = kv->KV, .hd = kv->hd,
                               .keys_to_l2 = kv->keys_to_l2},
                     .rows = {.q = q, .q_stride = q_stride, .out = kv->atty, .slots = p->slots,
                              .pos = kv->pos}};
    zdp_pool_run((int64_t)kv->n_blocks * kv->NH + (int64_t)kv->n_groups * kv->chunks_per_group +
                     kv->n_lone,
                 attend_task_, &j);
}

/* Takes the pass's rows: checks every slot and token before anything is
 * written, gives each row its slot's next position, the adapters' scratch
 * and the attention plan; on failure the cache is as it was. */
static zdp_status begin_pass_(zdp_kv_cache *kv, const int32_t *slots, const int32_t *tokens, int n,
                              zdp_error *err) {
    const char *fn = "zdp_lm_decode";
    if (!reserve_(kv, n))
        return zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory for %d rows of scratch", fn, n);
    for (int i = 0; i < n; i++) {
        const int s = slots[i];
        if (s < 0 || s >= kv->n_slots)
            return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                               "%s: slots[%d] = %d: must be in [0, %d) (the cache's slots)", fn, i,
                               s, kv->n_slots);
        if (tokens[i] < 0 || tokens[i] >= kv->V)
            return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                               "%s: tokens[%d] = %d: token ids must be in [0, %d) (vocab_size)",
                               fn, i, (int)tokens[i], kv->V);
        kv->pos[i] = kv->len[s]++;
    }
    for (int i = 0; i < n; i++) /* a slot's first pass: its prompt, all of its rows here */
        if (kv->pos[i] == 0) kv->prompt_len[slots[i]] = kv->len[slots[i]];
    /* The adapters' scratch: (n, the largest rank bound to a row's slot). */
    int64_t need = 0;
    for (int i = 0; i < n && kv->n_adapted > 0; i++) {
        const zdp_lora_config *c = zdp_lora_config_of(kv->slot_lora[slots[i]]);
        if (c != NULL && (int64_t)n * c->rank > need) need = (int64_t)n * c->rank;
    }
    if (need > kv->lora_xa_cap) {
        float *p = realloc(kv->lora_xa, (size_t)need * sizeof *p);
        if (p == NULL) {
            for (int j = 0; j < n; j++) kv->len[slots[j]]--; /* undo */
            return zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory for the adapters' "
                               "scratch (%lld floats)", fn, (long long)need);
        }
        kv->lora_xa = p, kv->lora_xa_cap = need;
    }
    for (int i = 0; i < n; i++)
        if (kv->pos[i] >= kv->T) {
            const int bad = i;
            for (int j = 0; j < n; j++) kv->len[slots[j]]--; /* undo */
            return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                               "%s: row %d: slot %d would hold %d positions, beyond the "
                               "cache's %d per slot (its max_len; the model's context, "
                               "block_size, is %d)",
                               fn, bad, (int)slots[bad], kv->pos[bad] + 1, kv->T,
                               kv->model->block_size);
        }
    if (!plan_attention_(kv, slots, n)) {
        for (int j = 0; j < n; j++) kv->len[slots[j]]--; /* undo */
        return zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory for the prompt attention's "
                           "scores (%d threads x %d x %d floats)", fn, kv->n_threads,
                           ZDP_KV_PROMPT_BLOCK, kv->T);
    }
    return ZDP_OK;
}

zdp_status zdp_lm_decode(zdp_kv_cache *kv, const float *const *P, const int32_t *slots,
                         const int32_t *tokens, int n, const uint8_t *want, float *logits,
                         zdp_error *err) {
    if (kv == NULL || P == NULL || slots == NULL || tokens == NULL || n < 1)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "zdp_lm_decode: kv, params, slots and tokens must be set and n >= 1 "
                           "(n = %d)",
                           n);
    const void *self = NULL;
    const zdp_decode_ops *model = zdp_lm_decode_ops_(kv->model, &self);
    zdp_status st = begin_pass_(kv, slots, tokens, n, err);
    if (st != ZDP_OK) return st;
    pass_ctx_ ctx = {.kv = kv, .P = P, .slots = slots, .n = n};
    zdp_decode_pass pass = {.P = P, .n = n, .tokens = tokens, .pos = kv->pos, .cos = kv->cos,
                            .sin = kv->sin, .x = kv->x, .h = kv->h, .qkv = kv->qkv, .q = kv->q,
                            .k = kv->k_rows, .v = kv->v_rows, .atty = kv->atty, .f1 = kv->f1,
                            .f2 = kv->f2, .mean = kv->mean, .rstd = kv->rstd, .ctx = &ctx,
                            .linear = pass_linear_, .conv1d = pass_conv1d_, .adapt = pass_adapt_,
                            .attend = pass_attend_};
    model->trunk(self, &pass);
    if (logits == NULL) return ZDP_OK;
    /* The final norm and the lm_head only on the rows asked for. */
    const int64_t C = kv->C;
    int64_t m = 0;
    for (int i = 0; i < n; i++)
        if (want == NULL || want[i]) {
            if (m != i) memcpy(kv->x + m * C, kv->x + (int64_t)i * C, (size_t)C * sizeof(float));
            kv->head_slots[m++] = slots[i];
        }
    if (m > 0) model->head(self, &pass, m, logits);
    return ZDP_OK;
}
