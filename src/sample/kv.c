/*
 * kv.c -- the key/value cache of zdp/sample.h: its slots and their stored
 * positions, prompt sharing between slots, the LoRA adapters bound to
 * slots, and the store of packed weight copies.
 *
 * Every layer keeps (n_slots, T, KV*hd) keys and as many values.  A slot
 * that shares another's prompt (zdp_kv_share_slot: a request's samples)
 * reads the prompt's positions from the lender's storage and stores only
 * its own after them, so a prompt's keys and values exist once however many
 * samples read them; when the lender is emptied or rewritten its prompt
 * moves to one of its sharers (one copy).  Adapters (zdp_kv_set_adapter)
 * are per slot: any LoRA model whose sites fit the cache's model.  Not
 * here: a pass over the cache (decode.c), token choice and scheduling
 * (sampler.c).
 */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "../core/core.h"
#include "../models/adapter.h"
#include "../nn/kv_attention.h"
#include "../nn/nn.h"
#include "kv_impl.h"
#include "zdp/sample.h"
#include "zdp/gpt.h"
#include "zdp/llama.h"

/* ---- the store of packed weight copies ---- */

void zdp_kv_packs_destroy(zdp_kv_packs *store) {
    if (store == NULL) return;
    for (int i = 0; store->packed != NULL && i < store->n_params; i++) free(store->packed[i]);
    free(store->packed);
    free(store->src);
    free(store);
}

zdp_status zdp_kv_packs_create(const zdp_model *model, zdp_kv_packs **out, zdp_error *err) {
    if (out == NULL || model == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "zdp_kv_packs_create: model and out must be set");
    zdp_kv_packs *store = calloc(1, sizeof *store);
    if (store != NULL) {
        store->model = model;
        store->n_params = model->n_params;
        store->packed =
            calloc((size_t)(model->n_params > 0 ? model->n_params : 1), sizeof *store->packed);
        store->src =
            calloc((size_t)(model->n_params > 0 ? model->n_params : 1), sizeof *store->src);
    }
    if (store == NULL || store->packed == NULL || store->src == NULL) {
        zdp_kv_packs_destroy(store);
        *out = NULL;
        return zdp_err_set(err, ZDP_ERR_NOMEM, "zdp_kv_packs_create: out of memory");
    }
    *out = store;
    return ZDP_OK;
}

int64_t zdp_kv_packs_bytes(const zdp_kv_packs *store) { return store != NULL ? store->bytes : 0; }

int64_t zdp_kv_packs_count(const zdp_kv_packs *store) { return store != NULL ? store->packs : 0; }

void zdp_kv_set_packs(zdp_kv_cache *kv, zdp_kv_packs *store, uint64_t key) {
    if (kv == NULL) return;
    if (store == NULL || store->model != kv->model) {
        kv->packs = kv->own_packs;
        return;
    }
    if (store->key != key) /* another snapshot: every copy is stale */
        for (int i = 0; i < store->n_params; i++) store->src[i] = NULL;
    store->key = key;
    kv->packs = store;
}

/* ---- the cache ---- */

void zdp_kv_destroy(zdp_kv_cache *kv) {
    if (kv == NULL) return;
    free(kv->len);
    free(kv->lender);
    free(kv->borrowed_len);
    free(kv->prompt_len);
    free(kv->n_sharers);
    free(kv->lent_len);
    free(kv->groups);
    free(kv->group_rows);
    free(kv->group_scratch);
    free(kv->k);
    free(kv->v);
    free(kv->cos);
    free(kv->sin);
    free(kv->x);
    free(kv->h);
    free(kv->qkv);
    free(kv->q);
    free(kv->k_rows);
    free(kv->v_rows);
    free(kv->atty);
    free(kv->f1);
    free(kv->f2);
    free(kv->mean);
    free(kv->rstd);
    free(kv->row_scratch);
    free(kv->pos);
    free(kv->lone_rows);
    free(kv->blocks);
    free(kv->block_scores);
    zdp_kv_packs_destroy(kv->own_packs);
    free(kv->sites);
    free(kv->slot_lora);
    free(kv->slot_adapter);
    free(kv->lora_xa);
    free(kv->head_slots);
    free(kv);
}

zdp_status zdp_kv_create(const zdp_model *model, int n_slots, int max_len, zdp_kv_cache **out,
                         zdp_error *err) {
    const char *fn = "zdp_kv_create";
    if (out == NULL || model == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "%s: model and out must be set", fn);
    *out = NULL;
    if (n_slots < 1)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "%s: n_slots = %d: must be >= 1", fn,
                           n_slots);
    const zdp_gpt_config *g = zdp_gpt_config_of(model);
    const zdp_llama_config *c = zdp_llama_config_of(model);
    if (g == NULL && c == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "%s: the model is neither GPT-2 nor the Llama family (only their "
                           "zdp_gpt_create / zdp_llama_create models have a KV cache)",
                           fn);
    zdp_kv_cache *kv = calloc(1, sizeof *kv);
    if (kv == NULL) return zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory", fn);
    kv->model = model;
    kv->n_slots = n_slots;
    if (g != NULL) {
        kv->L = g->n_layer, kv->C = g->n_embd, kv->NH = kv->KV = g->n_head;
        kv->hd = g->n_embd / g->n_head, kv->F = 4 * g->n_embd, kv->V = g->vocab_size;
        kv->T = g->block_size, kv->eps = 1e-5f;
    } else {
        kv->llama = true;
        kv->L = c->n_layer, kv->C = c->hidden, kv->NH = c->n_head, kv->KV = c->n_kv_head;
        kv->hd = c->head_dim, kv->F = c->ffn, kv->V = c->vocab_size, kv->T = c->block_size;
        kv->eps = c->rms_norm_eps;
    }
    if (max_len < 0 || max_len > kv->T) {
        const int T = kv->T;
        zdp_kv_destroy(kv);
        return zdp_err_set(
            err, ZDP_ERR_INVALID_ARG,
            "%s: max_len = %d: must be in 0..%d (the model's block_size; 0: all of it)", fn,
            max_len, T);
    }
    if (max_len > 0) kv->T = max_len; /* positions per slot */
    const size_t per = (size_t)kv->L * n_slots * kv->T * kv->KV * kv->hd;
    kv->len = calloc((size_t)n_slots, sizeof *kv->len);
    kv->lender = malloc((size_t)n_slots * sizeof *kv->lender);
    kv->borrowed_len = calloc((size_t)n_slots, sizeof *kv->borrowed_len);
    kv->prompt_len = calloc((size_t)n_slots, sizeof *kv->prompt_len);
    kv->n_sharers = calloc((size_t)n_slots, sizeof *kv->n_sharers);
    kv->lent_len = calloc((size_t)n_slots, sizeof *kv->lent_len);
    zdp_kv_packs_create(model, &kv->own_packs, NULL);
    kv->packs = kv->own_packs;
    kv->n_threads = zdp_pool_size();
    kv->keys_to_l2 = zdp_nn_kv_keys_to_l2((int64_t)kv->KV * kv->hd);
    kv->k = zdp_big_alloc(per * sizeof(float));
    kv->v = zdp_big_alloc(per * sizeof(float));
    kv->n_sites = zdp_adapter_sites(model, NULL, 0, NULL);
    kv->sites = calloc((size_t)(kv->n_sites > 0 ? kv->n_sites : 1), sizeof *kv->sites);
    kv->slot_lora = calloc((size_t)n_slots, sizeof *kv->slot_lora);
    kv->slot_adapter = calloc((size_t)n_slots, sizeof *kv->slot_adapter);
    if (kv->llama) {
        kv->cos = malloc((size_t)kv->T * kv->hd / 2 * sizeof(float));
        kv->sin = malloc((size_t)kv->T * kv->hd / 2 * sizeof(float));
    }
    if (kv->lender != NULL)
        for (int s = 0; s < n_slots; s++) kv->lender[s] = -1;
    if (kv->len == NULL || kv->lender == NULL || kv->borrowed_len == NULL ||
        kv->prompt_len == NULL || kv->n_sharers == NULL || kv->lent_len == NULL || kv->k == NULL ||
        kv->v == NULL || kv->own_packs == NULL || kv->sites == NULL || kv->slot_lora == NULL ||
        kv->slot_adapter == NULL || (kv->llama && (kv->cos == NULL || kv->sin == NULL))) {
        zdp_kv_destroy(kv);
        return zdp_err_set(err, ZDP_ERR_NOMEM,
                           "%s: out of memory for the cache of %d slots x %d positions (%.1f MB)",
                           fn, n_slots, kv->T, 2.0 * (double)per * 4 / 1e6);
    }
    if (kv->llama)
        zdp_nn_rope_tables(kv->cos, kv->sin, kv->T, kv->hd, c->rope_theta, (int)c->rope_type,
                           c->rope_factor, c->rope_low_freq_factor, c->rope_high_freq_factor,
                           c->rope_original_max_position);
    zdp_adapter_sites(model, kv->sites, kv->n_sites, NULL);
    *out = kv;
    return ZDP_OK;
}

int64_t zdp_kv_bytes(const zdp_kv_cache *kv) {
    if (kv == NULL) return 0;
    int64_t b = 2 * (int64_t)kv->L * kv->n_slots * kv->T * kv->KV * kv->hd * 4;
    if (kv->llama) b += (int64_t)kv->T * kv->hd * 4;
    return b + kv->scratch_bytes + kv->own_packs->bytes;
}

int zdp_kv_slots(const zdp_kv_cache *kv) { return kv != NULL ? kv->n_slots : 0; }

int zdp_kv_length(const zdp_kv_cache *kv, int slot) {
    return kv != NULL && slot >= 0 && slot < kv->n_slots ? kv->len[slot] : 0;
}

/* ---- slots and prompt sharing ---- */

/* Copies positions [0, n) of every layer's keys and values from slot src's
 * storage to slot dst's (their own regions, not through a lender). */
static void copy_own_(zdp_kv_cache *kv, int dst, int src, int64_t n) {
    const int64_t KD = (int64_t)kv->KV * kv->hd, T = kv->T;
    for (int l = 0; l < kv->L; l++) {
        const int64_t from = ((int64_t)l * kv->n_slots + src) * T * KD,
                      to = ((int64_t)l * kv->n_slots + dst) * T * KD;
        memcpy(kv->k + to, kv->k + from, (size_t)(n * KD) * sizeof(float));
        memcpy(kv->v + to, kv->v + from, (size_t)(n * KD) * sizeof(float));
    }
}

/* Slot s stops taking part in sharing before it is emptied or rewritten:
 * as a sharer it lets go of its lender; as a shared prompt, its prompt moves
 * to the first of its sharers (one copy), which the others then read. */
static void release_(zdp_kv_cache *kv, int s) {
    if (kv->lender[s] >= 0) {
        kv->n_sharers[kv->lender[s]]--;
        kv->lender[s] = -1, kv->borrowed_len[s] = 0;
    }
    if (kv->n_sharers[s] == 0) return;
    int heir = -1;
    for (int d = 0; d < kv->n_slots; d++) {
        if (kv->lender[d] != s) continue;
        if (heir < 0) {
            heir = d;
            copy_own_(kv, d, s, kv->lent_len[s]);
            kv->lender[d] = -1, kv->borrowed_len[d] = 0;
            kv->n_sharers[d] = kv->n_sharers[s] - 1, kv->lent_len[d] = kv->lent_len[s];
        } else {
            kv->lender[d] = heir;
        }
    }
    kv->n_sharers[s] = 0, kv->lent_len[s] = 0;
}

void zdp_kv_clear(zdp_kv_cache *kv, int slot) {
    if (kv != NULL && slot >= 0 && slot < kv->n_slots) {
        release_(kv, slot);
        kv->len[slot] = 0, kv->prompt_len[slot] = 0;
        kv->n_adapted -= kv->slot_lora[slot] != NULL;
        kv->slot_lora[slot] = NULL;
        kv->slot_adapter[slot] = NULL;
    }
}

void zdp_kv_copy_slot(zdp_kv_cache *kv, int dst, int src) {
    if (kv == NULL || dst == src || dst < 0 || src < 0 || dst >= kv->n_slots || src >= kv->n_slots)
        return;
    release_(kv, dst); /* (may move src's prompt into src's own storage: dst was its lender) */
    const int b = kv->lender[src], n0 = b >= 0 ? kv->borrowed_len[src] : 0;
    if (b >= 0) copy_own_(kv, dst, b, n0); /* the shared prompt, then src's own positions */
    const int64_t KD = (int64_t)kv->KV * kv->hd, T = kv->T, n = (int64_t)(kv->len[src] - n0) * KD;
    for (int l = 0; l < kv->L; l++) {
        const int64_t from = (((int64_t)l * kv->n_slots + src) * T + n0) * KD,
                      to = (((int64_t)l * kv->n_slots + dst) * T + n0) * KD;
        memcpy(kv->k + to, kv->k + from, (size_t)n * sizeof(float));
        memcpy(kv->v + to, kv->v + from, (size_t)n * sizeof(float));
    }
    kv->len[dst] = kv->len[src], kv->prompt_len[dst] = kv->prompt_len[src];
}

void zdp_kv_share_slot(zdp_kv_cache *kv, int dst, int src) {
    if (kv == NULL || dst == src || dst < 0 || src < 0 || dst >= kv->n_slots || src >= kv->n_slots)
        return;
    release_(kv, dst);
    int r = src; /* the slot whose storage holds the prompt */
    if (kv->lender[src] >= 0 && kv->len[src] == kv->borrowed_len[src]) r = kv->lender[src];
    const int n = kv->len[src];
    if (n == 0 || kv->lender[r] >= 0 || (kv->n_sharers[r] > 0 && kv->lent_len[r] != n) ||
        kv->prompt_len[r] != n) {
        /* src's positions are not one prompt in one slot's storage (src
         * shares and has added its own), r already shares another length
         * (one prompt length per shared slot keeps the groups simple), or
         * r has added positions past its prompt (a group splits its rows'
         * sums at the shared length, r's own at its prompt's): a copy. */
        zdp_kv_copy_slot(kv, dst, src);
        return;
    }
    kv->lender[dst] = r, kv->borrowed_len[dst] = n;
    kv->n_sharers[r]++, kv->lent_len[r] = n;
    kv->len[dst] = n, kv->prompt_len[dst] = n;
}

/* ---- adapters ---- */

zdp_status zdp_kv_set_adapter(zdp_kv_cache *kv, int slot, const zdp_model *lora,
                              const float *const *adapter, zdp_error *err) {
    const char *fn = "zdp_kv_set_adapter";
    if (kv == NULL || slot < 0 || slot >= kv->n_slots)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "%s: slot = %d: must be in [0, %d) (the "
                           "cache's slots)", fn, slot, kv != NULL ? kv->n_slots : 0);
    if (lora != NULL && adapter == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "%s: slot %d: a LoRA model needs its "
                           "adapter tensors (adapter is NULL)", fn, slot);
    if (lora != NULL) {
        zdp_error why;
        if (!zdp_lora_fits_(lora, kv->model, &why))
            return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "%s: slot %d: %s", fn, slot, why.msg);
    }
    kv->n_adapted += (lora != NULL) - (kv->slot_lora[slot] != NULL);
    kv->slot_lora[slot] = lora;
    kv->slot_adapter[slot] = lora != NULL ? adapter : NULL;
    return ZDP_OK;
}
