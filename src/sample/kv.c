/*
 * kv.c -- the key/value cache and the incremental forward (zdp/sample.h).
 *
 * The same math as gpt.c / llama.c's forward, on a ragged batch of rows:
 * every row is one (slot, token) at the slot's next position.  The
 * projections, MLPs and the lm_head are one matrix product over all rows
 * (a prefill's prompt and a decode step's sequences alike).  Attention: a
 * prompt's rows (a run of one slot's consecutive positions) as two products
 * per block of rows and head; every other row alone, against its own slot's
 * cached keys and values (split over the thread pool); the rows of slots
 * sharing one stored prompt (zdp_kv_share_slot: a request's samples) as a
 * group that reads the prompt's keys and values once.  Where the packed
 * kernels beat the BLAS (zdp_nn_packed_wins), a pass of
 * 2..PACK_ROWS_ rows (a batched decode step, a prompt's prefill) multiplies
 * by weights packed once per cache, or once per weights snapshot in a store
 * shared by caches (zdp_kv_set_packs; nn.h's packed B: cblas_sgemm would
 * re-pack each weight on every step); one row goes to sgemv, more rows (a
 * batch of prompts) to the nn kernels' sgemm.  Parameters are
 * found by name (zdp/gpt.h's and zdp/llama.h's lists), so the models' own
 * files are not touched.  LoRA adapters (zdp_kv_set_adapter) are per
 * slot: after each adaptable linear's base product over all rows, each run
 * of consecutive rows whose slots share an adapter adds that adapter's
 * (alpha/r) (x A^T) B^T, as lora.c's hooks do in training.  Not here: token
 * choice and scheduling (sampler.c), stage-3 gathering (the caller passes
 * whole weights).
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cblas.h>

#include "../core/core.h"
#include "../models/adapter.h"
#include "../nn/nn.h"
#include "zdp/zdp.h"


/* A layer's adaptable linears (adapter.h's sites), by role: GPT-2's fused
 * c_attn is KS_Q, its attn.c_proj KS_O, mlp.c_fc KS_UP, mlp.c_proj KS_DOWN. */
enum { KS_Q, KS_K, KS_V, KS_O, KS_GATE, KS_UP, KS_DOWN, KS_N };

/* One layer's tensor indices; -1 where the model has none. */
typedef struct kv_layer_ {
    int ln1_w, ln1_b, qkv_w, qkv_b;                  /* GPT-2: fused c_attn */
    int q_w, q_b, k_w, k_b, v_w, v_b, q_norm, k_norm; /* Llama family */
    int o_w, o_b, ln2_w, ln2_b;
    int fc_w, fc_b, proj_w, proj_b; /* GPT-2 MLP */
    int gate, up, down;             /* Llama MLP */
    int site[KS_N];                 /* adapter.h site index by role, -1: none */
} kv_layer_;

struct zdp_kv_cache {
    const zdp_model *model;
    bool llama;
    int L, C, NH, KV, hd, F, V, T; /* T = block_size */
    float eps;
    int n_slots;
    int *len;          /* (n_slots) positions stored */
    /* Prompt sharing (zdp_kv_share_slot): slot s reads its first blen[s]
     * positions from slot base[s]'s storage (-1: all its own); nshare[s]
     * slots read the first slen[s] positions of s so.  A slot is a sharer
     * or shared, never both. */
    int *base, *blen, *nshare, *slen; /* (n_slots) each */
    /* (n_slots) each slot's prompt length: its positions after the first
     * pass that stored any (a sharer: the shared length).  Decode attention
     * weighs the values before it and from it as two sums, added (a
     * group's rows weigh the prompt's together, each row its own alone). */
    int *pre;
    float *k, *v;      /* (L, n_slots, T, KV*hd) */
    float *cos, *sin;  /* (T, hd/2) rotary tables (Llama family) */
    kv_layer_ *layer;  /* (L) */
    int embed, pos_embed, lnf_w, lnf_b, lm_head;
    zdp_adapter_site *sites; /* (nsites) the model's adaptable linears */
    int nsites, head_site;
    /* Per slot: the LoRA model and adapter tensors bound to it, or NULL. */
    const zdp_model **slot_lora;
    const float *const **slot_ad;
    int n_adapted;     /* slots with an adapter bound */
    float *xa;         /* (xa_cap) (rows, rank) the adapters' down products */
    int64_t xa_cap;
    int32_t *wslot;    /* (cap) the slot of each row the lm_head runs on */
    /* Scratch for `cap` rows, grown on demand. */
    int cap;
    float *x, *h, *qkv, *q, *kk, *vv, *atty, *f1, *f2, *mean, *rstd, *score;
    int *pos;
    /* A pass's attention work: rows attended one by one (lone), and blocks
     * of a prompt's rows attended as products (blk: first row, rows). */
    int *lone, *blk;
    int n_lone, n_blk;
    /* Lone rows over a shared prompt, by group: grp (n_grp, 4) = first
     * index into grow, rows, the prompt's slot, its positions; grow (cap)
     * the rows, each group's in row order. */
    int *grp, *grow;
    int n_grp, grp_chunks; /* groups; tasks per group (its rows in chunks) */
    float *gscore; /* (threads, gscore_per) a group's scores, grown on demand */
    int64_t gscore_per;
    float *pscore; /* (threads, PROMPT_BLOCK_, T) the blocks' scores, made on first use */
    int64_t scratch_bytes;
    /* Packed copies of the weight matrices: the cache's own, or a store
     * shared across caches (zdp_kv_set_packs). */
    zdp_kv_packs *own_pk, *pk;
    int n_threads;
    /* The scores fetch the next block of keys to L2, not L1: two blocks
     * do not fit in this core's L1 (scores512_). */
    bool keys_to_l2;
};

/* Packed copies of the weight matrices (nn.h's packed B), made on the
 * first pass that uses each: (n_params) copy and the weights it was made
 * from.  The pointer alone cannot tell rewritten weights (in place, or a
 * new buffer at a freed one's address), so a shared store is also keyed
 * on its caller's snapshot generation. */
struct zdp_kv_packs {
    const zdp_model *model; /* the copies' shapes are this model's */
    int n_params;
    float **packed;
    const float **src;
    int64_t bytes;
    uint64_t key;
    int64_t packs; /* weights packed so far (tests count the reuse) */
};

/* Passes of 2..PACK_ROWS_ rows go to the packed kernels; longer ones (a
 * batch of prompts' prefill) to training's linear (zdp_nn_linear_forward:
 * gemm.c or cblas_sgemm, whose blocking pays there; bench_sample --gemm, one
 * thread: the packed kernels 0.90-1.13x sgemm at 256 rows on gpt-m's and
 * SmolLM2's shapes, 0.84-0.86x at 2048). */
#define PACK_ROWS_ 256

/* Runs of at least PROMPT_ROWS_ rows of one slot at consecutive positions
 * (a prompt's prefill) attend as products, in blocks of PROMPT_BLOCK_ query
 * rows (plan_attention_). */
#define PROMPT_ROWS_ 16
#define PROMPT_BLOCK_ 64

/* This core's L1 data cache in bytes (32 KB where the C library cannot
 * tell: the smallest of the x86 cores measured here). */
static int64_t l1d_bytes_(void) {
#ifdef _SC_LEVEL1_DCACHE_SIZE
    const long b = sysconf(_SC_LEVEL1_DCACHE_SIZE);
    if (b > 0) return b;
#endif
    return 32 * 1024;
}

static int find_(const zdp_model *m, const char *fmt, int l) {
    char name[96];
    snprintf(name, sizeof name, fmt, l);
    for (int i = 0; i < m->n_params; i++)
        if (strcmp(m->params[i].name, name) == 0) return i;
    return -1;
}

void zdp_kv_packs_destroy(zdp_kv_packs *pk) {
    if (pk == NULL) return;
    for (int i = 0; pk->packed != NULL && i < pk->n_params; i++) free(pk->packed[i]);
    free(pk->packed);
    free(pk->src);
    free(pk);
}

zdp_status zdp_kv_packs_create(const zdp_model *model, zdp_kv_packs **out, zdp_error *err) {
    if (out == NULL || model == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_kv_packs_create: model and out must be set");
    zdp_kv_packs *pk = calloc(1, sizeof *pk);
    if (pk != NULL) {
        pk->model = model;
        pk->n_params = model->n_params;
        pk->packed = calloc((size_t)(model->n_params > 0 ? model->n_params : 1), sizeof *pk->packed);
        pk->src = calloc((size_t)(model->n_params > 0 ? model->n_params : 1), sizeof *pk->src);
    }
    if (pk == NULL || pk->packed == NULL || pk->src == NULL) {
        zdp_kv_packs_destroy(pk);
        *out = NULL;
        return zdp_err_set(err, ZDP_ERR_NOMEM, "zdp_kv_packs_create: out of memory");
    }
    *out = pk;
    return ZDP_OK;
}

int64_t zdp_kv_packs_bytes(const zdp_kv_packs *pk) { return pk != NULL ? pk->bytes : 0; }

int64_t zdp_kv_packs_count(const zdp_kv_packs *pk) { return pk != NULL ? pk->packs : 0; }

void zdp_kv_set_packs(zdp_kv_cache *kv, zdp_kv_packs *pk, uint64_t key) {
    if (kv == NULL) return;
    if (pk == NULL || pk->model != kv->model) {
        kv->pk = kv->own_pk;
        return;
    }
    if (pk->key != key) /* another snapshot: every copy is stale */
        for (int i = 0; i < pk->n_params; i++) pk->src[i] = NULL;
    pk->key = key;
    kv->pk = pk;
}

void zdp_kv_destroy(zdp_kv_cache *kv) {
    if (kv == NULL) return;
    free(kv->len);
    free(kv->base);
    free(kv->blen);
    free(kv->pre);
    free(kv->nshare);
    free(kv->slen);
    free(kv->grp);
    free(kv->grow);
    free(kv->gscore);
    free(kv->k);
    free(kv->v);
    free(kv->cos);
    free(kv->sin);
    free(kv->layer);
    free(kv->x);
    free(kv->h);
    free(kv->qkv);
    free(kv->q);
    free(kv->kk);
    free(kv->vv);
    free(kv->atty);
    free(kv->f1);
    free(kv->f2);
    free(kv->mean);
    free(kv->rstd);
    free(kv->score);
    free(kv->pos);
    free(kv->lone);
    free(kv->blk);
    free(kv->pscore);
    zdp_kv_packs_destroy(kv->own_pk);
    free(kv->sites);
    free(kv->slot_lora);
    free(kv->slot_ad);
    free(kv->xa);
    free(kv->wslot);
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
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "%s: max_len = %d: must be in 0..%d (the model's block_size; 0: all of it)",
                           fn, max_len, T);
    }
    if (max_len > 0) kv->T = max_len; /* positions per slot */
    const size_t per = (size_t)kv->L * n_slots * kv->T * kv->KV * kv->hd;
    kv->len = calloc((size_t)n_slots, sizeof *kv->len);
    kv->base = malloc((size_t)n_slots * sizeof *kv->base);
    kv->blen = calloc((size_t)n_slots, sizeof *kv->blen);
    kv->pre = calloc((size_t)n_slots, sizeof *kv->pre);
    kv->nshare = calloc((size_t)n_slots, sizeof *kv->nshare);
    kv->slen = calloc((size_t)n_slots, sizeof *kv->slen);
    zdp_kv_packs_create(model, &kv->own_pk, NULL);
    kv->pk = kv->own_pk;
    kv->n_threads = zdp_pool_size();
    kv->keys_to_l2 = 2 * 16 * (int64_t)kv->KV * kv->hd * 4 > l1d_bytes_();
    kv->k = zdp_big_alloc(per * sizeof(float));
    kv->v = zdp_big_alloc(per * sizeof(float));
    kv->layer = calloc((size_t)kv->L, sizeof *kv->layer);
    kv->nsites = zdp_adapter_sites(model, NULL, 0, NULL);
    kv->sites = calloc((size_t)(kv->nsites > 0 ? kv->nsites : 1), sizeof *kv->sites);
    kv->slot_lora = calloc((size_t)n_slots, sizeof *kv->slot_lora);
    kv->slot_ad = calloc((size_t)n_slots, sizeof *kv->slot_ad);
    if (kv->llama) {
        kv->cos = malloc((size_t)kv->T * kv->hd / 2 * sizeof(float));
        kv->sin = malloc((size_t)kv->T * kv->hd / 2 * sizeof(float));
    }
    if (kv->base != NULL)
        for (int s = 0; s < n_slots; s++) kv->base[s] = -1;
    if (kv->len == NULL || kv->base == NULL || kv->blen == NULL || kv->pre == NULL || kv->nshare == NULL ||
        kv->slen == NULL || kv->k == NULL || kv->v == NULL || kv->layer == NULL || kv->own_pk == NULL || kv->sites == NULL || kv->slot_lora == NULL || kv->slot_ad == NULL ||
        (kv->llama && (kv->cos == NULL || kv->sin == NULL))) {
        zdp_kv_destroy(kv);
        return zdp_err_set(err, ZDP_ERR_NOMEM,
                           "%s: out of memory for the cache of %d slots x %d positions (%.1f MB)",
                           fn, n_slots, kv->T, 2.0 * (double)per * 4 / 1e6);
    }
    if (kv->llama)
        zdp_nn_rope_tables(kv->cos, kv->sin, kv->T, kv->hd, c->rope_theta, (int)c->rope_type,
                           c->rope_factor, c->rope_low_freq_factor, c->rope_high_freq_factor,
                           c->rope_original_max_position);
    zdp_adapter_sites(model, kv->sites, kv->nsites, NULL);
    for (int l = 0; l < kv->L; l++) {
        kv_layer_ *y = &kv->layer[l];
        memset(y, -1, sizeof *y); /* every index -1 */
        static const char *const gpt_sites[KS_N] = {"attn.c_attn", NULL, NULL, "attn.c_proj",
                                                    NULL, "mlp.c_fc", "mlp.c_proj"};
        static const char *const llama_sites[KS_N] = {
            "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
            "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
        for (int k = 0; k < KS_N; k++) {
            const char *leaf = kv->llama ? llama_sites[k] : gpt_sites[k];
            char name[ZDP_ADAPTER_MODULE_MAX];
            if (leaf == NULL) continue;
            snprintf(name, sizeof name, kv->llama ? "model.layers.%d.%s" : "transformer.h.%d.%s",
                     l, leaf);
            for (int i = 0; i < kv->nsites; i++)
                if (strcmp(kv->sites[i].module, name) == 0) y->site[k] = i;
        }
        if (!kv->llama) {
            y->ln1_w = find_(model, "transformer.h.%d.ln_1.weight", l);
            y->ln1_b = find_(model, "transformer.h.%d.ln_1.bias", l);
            y->qkv_w = find_(model, "transformer.h.%d.attn.c_attn.weight", l);
            y->qkv_b = find_(model, "transformer.h.%d.attn.c_attn.bias", l);
            y->o_w = find_(model, "transformer.h.%d.attn.c_proj.weight", l);
            y->o_b = find_(model, "transformer.h.%d.attn.c_proj.bias", l);
            y->ln2_w = find_(model, "transformer.h.%d.ln_2.weight", l);
            y->ln2_b = find_(model, "transformer.h.%d.ln_2.bias", l);
            y->fc_w = find_(model, "transformer.h.%d.mlp.c_fc.weight", l);
            y->fc_b = find_(model, "transformer.h.%d.mlp.c_fc.bias", l);
            y->proj_w = find_(model, "transformer.h.%d.mlp.c_proj.weight", l);
            y->proj_b = find_(model, "transformer.h.%d.mlp.c_proj.bias", l);
        } else {
            y->ln1_w = find_(model, "model.layers.%d.input_layernorm.weight", l);
            y->q_w = find_(model, "model.layers.%d.self_attn.q_proj.weight", l);
            y->q_b = find_(model, "model.layers.%d.self_attn.q_proj.bias", l);
            y->k_w = find_(model, "model.layers.%d.self_attn.k_proj.weight", l);
            y->k_b = find_(model, "model.layers.%d.self_attn.k_proj.bias", l);
            y->v_w = find_(model, "model.layers.%d.self_attn.v_proj.weight", l);
            y->v_b = find_(model, "model.layers.%d.self_attn.v_proj.bias", l);
            y->o_w = find_(model, "model.layers.%d.self_attn.o_proj.weight", l);
            y->o_b = find_(model, "model.layers.%d.self_attn.o_proj.bias", l);
            y->q_norm = find_(model, "model.layers.%d.self_attn.q_norm.weight", l);
            y->k_norm = find_(model, "model.layers.%d.self_attn.k_norm.weight", l);
            y->ln2_w = find_(model, "model.layers.%d.post_attention_layernorm.weight", l);
            y->gate = find_(model, "model.layers.%d.mlp.gate_proj.weight", l);
            y->up = find_(model, "model.layers.%d.mlp.up_proj.weight", l);
            y->down = find_(model, "model.layers.%d.mlp.down_proj.weight", l);
        }
    }
    if (!kv->llama) {
        kv->embed = find_(model, "transformer.wte.weight", 0);
        kv->pos_embed = find_(model, "transformer.wpe.weight", 0);
        kv->lnf_w = find_(model, "transformer.ln_f.weight", 0);
        kv->lnf_b = find_(model, "transformer.ln_f.bias", 0);
        kv->lm_head = kv->embed;
    } else {
        kv->embed = find_(model, "model.embed_tokens.weight", 0);
        kv->pos_embed = -1;
        kv->lnf_w = find_(model, "model.norm.weight", 0);
        kv->lnf_b = -1;
        kv->lm_head = find_(model, "lm_head.weight", 0);
        if (kv->lm_head < 0) kv->lm_head = kv->embed; /* tied */
    }
    kv->head_site = -1;
    for (int i = 0; i < kv->nsites; i++)
        if (strcmp(kv->sites[i].module, "lm_head") == 0) kv->head_site = i;
    *out = kv;
    return ZDP_OK;
}

int64_t zdp_kv_bytes(const zdp_kv_cache *kv) {
    if (kv == NULL) return 0;
    int64_t b = 2 * (int64_t)kv->L * kv->n_slots * kv->T * kv->KV * kv->hd * 4;
    if (kv->llama) b += (int64_t)kv->T * kv->hd * 4;
    return b + kv->scratch_bytes + kv->own_pk->bytes;
}

int zdp_kv_slots(const zdp_kv_cache *kv) { return kv != NULL ? kv->n_slots : 0; }

int zdp_kv_length(const zdp_kv_cache *kv, int slot) {
    return kv != NULL && slot >= 0 && slot < kv->n_slots ? kv->len[slot] : 0;
}

/* Copies positions [0, n) of every layer's keys and values from slot src's
 * storage to slot dst's (their own regions, not through base). */
static void copy_own_(zdp_kv_cache *kv, int dst, int src, int64_t n) {
    const int64_t KD = (int64_t)kv->KV * kv->hd, T = kv->T;
    for (int l = 0; l < kv->L; l++) {
        const int64_t from = ((int64_t)l * kv->n_slots + src) * T * KD, to = ((int64_t)l * kv->n_slots + dst) * T * KD;
        memcpy(kv->k + to, kv->k + from, (size_t)(n * KD) * sizeof(float));
        memcpy(kv->v + to, kv->v + from, (size_t)(n * KD) * sizeof(float));
    }
}

/* Slot s stops taking part in sharing before it is emptied or rewritten:
 * as a sharer it lets go of its base; as a shared prompt, its prompt moves
 * to the first of its sharers (one copy), which the others then read. */
static void release_(zdp_kv_cache *kv, int s) {
    if (kv->base[s] >= 0) {
        kv->nshare[kv->base[s]]--;
        kv->base[s] = -1, kv->blen[s] = 0;
    }
    if (kv->nshare[s] == 0) return;
    int heir = -1;
    for (int d = 0; d < kv->n_slots; d++) {
        if (kv->base[d] != s) continue;
        if (heir < 0) {
            heir = d;
            copy_own_(kv, d, s, kv->slen[s]);
            kv->base[d] = -1, kv->blen[d] = 0;
            kv->nshare[d] = kv->nshare[s] - 1, kv->slen[d] = kv->slen[s];
        } else {
            kv->base[d] = heir;
        }
    }
    kv->nshare[s] = 0, kv->slen[s] = 0;
}

void zdp_kv_clear(zdp_kv_cache *kv, int slot) {
    if (kv != NULL && slot >= 0 && slot < kv->n_slots) {
        release_(kv, slot);
        kv->len[slot] = 0, kv->pre[slot] = 0;
        kv->n_adapted -= kv->slot_lora[slot] != NULL;
        kv->slot_lora[slot] = NULL;
        kv->slot_ad[slot] = NULL;
    }
}

void zdp_kv_copy_slot(zdp_kv_cache *kv, int dst, int src) {
    if (kv == NULL || dst == src || dst < 0 || src < 0 || dst >= kv->n_slots || src >= kv->n_slots) return;
    release_(kv, dst); /* (may move src's prompt into src's own storage: dst was its base) */
    const int b = kv->base[src], n0 = b >= 0 ? kv->blen[src] : 0;
    if (b >= 0) copy_own_(kv, dst, b, n0); /* the shared prompt, then src's own positions */
    const int64_t KD = (int64_t)kv->KV * kv->hd, T = kv->T, n = (int64_t)(kv->len[src] - n0) * KD;
    for (int l = 0; l < kv->L; l++) {
        const int64_t from = (((int64_t)l * kv->n_slots + src) * T + n0) * KD,
                      to = (((int64_t)l * kv->n_slots + dst) * T + n0) * KD;
        memcpy(kv->k + to, kv->k + from, (size_t)n * sizeof(float));
        memcpy(kv->v + to, kv->v + from, (size_t)n * sizeof(float));
    }
    kv->len[dst] = kv->len[src], kv->pre[dst] = kv->pre[src];
}

void zdp_kv_share_slot(zdp_kv_cache *kv, int dst, int src) {
    if (kv == NULL || dst == src || dst < 0 || src < 0 || dst >= kv->n_slots || src >= kv->n_slots) return;
    release_(kv, dst);
    int r = src; /* the slot whose storage holds the prompt */
    if (kv->base[src] >= 0 && kv->len[src] == kv->blen[src]) r = kv->base[src];
    const int n = kv->len[src];
    if (n == 0 || kv->base[r] >= 0 || (kv->nshare[r] > 0 && kv->slen[r] != n) || kv->pre[r] != n) {
        /* src's positions are not one prompt in one slot's storage (src
         * shares and has added its own), r already shares another length
         * (one prompt length per shared slot keeps the groups simple), or
         * r has added positions past its prompt (a group splits its rows'
         * sums at the shared length, r's own at its prompt's): a copy. */
        zdp_kv_copy_slot(kv, dst, src);
        return;
    }
    kv->base[dst] = r, kv->blen[dst] = n;
    kv->nshare[r]++, kv->slen[r] = n;
    kv->len[dst] = n, kv->pre[dst] = n;
}

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
    kv->slot_ad[slot] = lora != NULL ? adapter : NULL;
    return ZDP_OK;
}

/* Scratch for n rows. */
static bool reserve_(zdp_kv_cache *kv, int n) {
    if (n <= kv->cap) return true;
    const size_t N = (size_t)n, QD = (size_t)kv->NH * kv->hd, KD = (size_t)kv->KV * kv->hd;
    float **f[] = {&kv->x, &kv->h, &kv->qkv, &kv->q, &kv->kk, &kv->vv, &kv->atty,
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
    int32_t *ws = realloc(kv->wslot, N * sizeof *ws);
    if (ws == NULL) return false;
    kv->wslot = ws;
    int *lone = realloc(kv->lone, N * sizeof *lone);
    if (lone == NULL) return false;
    kv->lone = lone;
    int *blk = realloc(kv->blk, 2 * N * sizeof *blk);
    if (blk == NULL) return false;
    kv->blk = blk;
    int *grp = realloc(kv->grp, 4 * N * sizeof *grp);
    if (grp == NULL) return false;
    kv->grp = grp;
    int *grow = realloc(kv->grow, N * sizeof *grow);
    if (grow == NULL) return false;
    kv->grow = grow;
    const int64_t score = (int64_t)kv->n_threads * (kv->NH * kv->T + QD);
    if (kv->score == NULL) { /* (threads, NH T + QD) one row's attention scores and its
                              * prompt's weighted values, per thread */
        kv->score = malloc((size_t)score * sizeof(float));
        if (kv->score == NULL) return false;
    }
    kv->cap = n;
    kv->scratch_bytes = bytes + 10 * (int64_t)N * 4 + score * 4 +
                        kv->n_threads * kv->gscore_per * 4;
    return true;
}

/* A one-row product is a matrix-vector product: cblas_sgemv reads each
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
                for (int64_t c = 0; c < 16; c++) d[k * 16 + c] = c < n ? j->W[k * j->N + n0 + c] : 0.0f;
        }
    }
}

/* The packed copy of weight idx, B (K,N) (trans: stored (N,K)), made on
 * its first use; NULL when out of memory (the caller uses sgemm then). */
static const float *packed_(zdp_kv_cache *kv, const float *const *P, int idx, int64_t K, int64_t N,
                            int trans) {
    zdp_kv_packs *pk = kv->pk;
    if (pk->packed[idx] != NULL && pk->src[idx] == P[idx]) return pk->packed[idx];
    const int64_t floats = zdp_nn_packed_floats(K, N);
    if (pk->packed[idx] == NULL) {
        if ((pk->packed[idx] = zdp_big_alloc((size_t)floats * sizeof(float))) == NULL) return NULL;
        pk->bytes += floats * 4;
    }
    pack_job_ j = {.dst = pk->packed[idx], .W = P[idx], .K = K, .N = N, .panel_floats = K * 16,
                   .trans = trans};
    zdp_nn_parallel_ranges_((N + 15) / 16, 8, pack_range_, &j);
    pk->src[idx] = P[idx];
    pk->packs++;
    return pk->packed[idx];
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
 * multiplies by its packed copy where the packed kernels win (up to 96 rows
 * until the 3-panel kernel), else by the weight itself through the BLAS. */
static void linear_(zdp_kv_cache *kv, const float *const *P, float *out, const float *inp, int w,
                    const float *bias, int64_t N, int64_t C, int64_t OC, int accumulate) {
    const float *Bp = N > 1 && N <= PACK_ROWS_ && zdp_nn_packed_wins(N) ? packed_(kv, P, w, C, OC, 1) : NULL;
    if (Bp != NULL) zdp_nn_packed_gemm(out, OC, inp, C, Bp, bias, N, C, OC, accumulate);
    else gemm_nt_(out, inp, P[w], bias, N, C, OC, accumulate);
}

/* out (N,OC) = inp (N,C) @ W + bias, W = P[w] (C,OC): Hugging Face Conv1D (GPT-2) */
static void conv1d_(zdp_kv_cache *kv, const float *const *P, float *out, const float *inp, int w,
                    const float *bias, int64_t N, int64_t C, int64_t OC) {
    const float *W = P[w],
                *Bp = N > 1 && N <= PACK_ROWS_ && zdp_nn_packed_wins(N) ? packed_(kv, P, w, C, OC, 0) : NULL;
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

/* q . k over hd floats in 16 interleaved partial sums, each a chain of
 * fused multiply-adds (one rounding per step: half the instructions of a
 * multiply and an add; decode attention over a shared prompt is bound by
 * them), added pairwise at the end: a fixed order (so the same bits at any
 * batch or thread count) that the compiler vectorises, where one running
 * sum cannot be.  The weighted values (wsum_) are fmaf chains too. */
static inline float dot_(const float *q, const float *k, int hd) {
    float acc[16] = {0};
    int d = 0;
    for (; d + 16 <= hd; d += 16)
        for (int j = 0; j < 16; j++) acc[j] = fmaf(q[d + j], k[d + j], acc[j]);
    for (int j = 0; d < hd; d++, j++) acc[j] = fmaf(q[d], k[d], acc[j]);
    /* The halving tree, acc[j] + acc[j + w] for w = 8, 4, 2, 1, written out
     * with constant bounds: as one loop over w GCC ran it one float at a time
     * through the stack (most of a batch-32 decode's attention scores); the
     * same additions, the same bits. */
    float h8[8], h4[4];
    for (int j = 0; j < 8; j++) h8[j] = acc[j] + acc[j + 8];
    for (int j = 0; j < 4; j++) h4[j] = h8[j] + h8[j + 4];
    return (h4[0] + h4[2]) + (h4[1] + h4[3]);
}

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
        const float *const *ad = kv->slot_ad[rs[i]];
        int64_t j = i + 1;
        while (j < N && kv->slot_lora[rs[j]] == lm && kv->slot_ad[rs[j]] == ad) j++;
        const int p = zdp_lora_site_param_(lm, site);
        if (p >= 0) {
            const zdp_lora_config *c = zdp_lora_config_of(lm);
            const int64_t r = c->rank;
            const float scale = c->alpha / (float)c->rank;
            gemm_nt_(kv->xa, inp + i * in, ad[p], NULL, j - i, in, r, 0);
            for (int64_t k = 0; k < (j - i) * r; k++) kv->xa[k] *= scale;
            gemm_nt_(out + i * od, kv->xa, ad[p + 1], NULL, j - i, r, od, 1);
        }
        i = j;
    }
}

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define ZDP_KV_X86_ 1
#endif

#ifdef __GNUC__
/* o[h*ostride + 0..16*nv) = sum over s < n of sr[h*sstride + s] *
 * v[h*vstep + s*KD + 0..16*nv), for heads h < nh (1..3, or 6 with vstep hd)
 * and nv (2 or 4) 16-float vectors per head, all constants where it is
 * inlined; the positions in order.  vstep 0: the heads share one KV head's
 * values (GQA), each value row loaded once for all nh heads; vstep hd: nh
 * consecutive heads of a model whose heads each have their own (GPT-2),
 * nh x nv independent sums where one head's two were a chain of dependent
 * adds (6 x 4 = 24 sums: 6 heads of 64 dimensions read 1.5 KB of each value
 * row front to back, one stream the hardware fetches ahead).
 * init: the sums go on from o's values (a group's rows, position block by
 * block, attend_group_), else from 0.  While position s < pfn is summed,
 * the lines this walk reads of it are fetched at pfo floats further on: a
 * row's own values 32 positions ahead (read once, from memory), or a shared
 * prompt's next head's (or next block's) values, which the group's next
 * walks read.
 * Three variants, one per SIMD path (zdp_nn_packed_path(), wsum_): AVX-512
 * (wv512_), AVX2+FMA (wv256_: each 16 floats as two 8-float halves) and
 * portable (wvc_).  In each, every lane is one fused multiply-add per
 * position, in position order (fmaf rounds once, as vfmadd does), so all
 * three give the same bits.  No 64-byte vector is passed or returned
 * outside an AVX-512 function: its ABI would change with -march (GCC's
 * -Wpsabi). */
#define WV_ARGS_                                                                                        \
    float *o, int64_t ostride, const float *sr, int64_t sstride, int n, const float *v,                 \
        int64_t vstep, int64_t KD, int nh, int nv, int init, int64_t pfo, int pfn

/* The lines of value row vs that a walk reads, fetched pfo floats on. */
static inline __attribute__((always_inline)) void wv_fetch_(const float *vs, int64_t pfo,
                                                            int64_t vstep, int nh, int nv) {
    for (int h = 0; h < (vstep != 0 ? nh : 1); h++)
        for (int c = 0; c < nv; c++) __builtin_prefetch(vs + pfo + h * vstep + 16 * c, 0, 3);
}

/* The portable walk: GCC keeps a float array accumulator on the stack,
 * hence the vector type, which it splits into the target's registers. */
typedef float v16_ __attribute__((vector_size(64)));
static inline __attribute__((always_inline)) void wvc_(WV_ARGS_) {
    v16_ a[6][4] = {{{0}}};
    if (init)
        for (int h = 0; h < nh; h++)
            for (int c = 0; c < nv; c++) memcpy(&a[h][c], o + h * ostride + 16 * c, 64);
    for (int s = 0; s < n; s++) {
        const float *vs = v + (size_t)s * KD;
        if (s < pfn) wv_fetch_(vs, pfo, vstep, nh, nv);
        for (int h = 0; h < nh; h++) {
            const float w = sr[h * sstride + s];
            for (int c = 0; c < nv; c++) {
                v16_ x;
                memcpy(&x, vs + h * vstep + 16 * c, 64);
                for (int e = 0; e < 16; e++) a[h][c][e] = fmaf(w, x[e], a[h][c][e]);
            }
        }
    }
    for (int h = 0; h < nh; h++)
        for (int c = 0; c < nv; c++) memcpy(o + h * ostride + 16 * c, &a[h][c], 64);
}

#ifdef ZDP_KV_X86_
__attribute__((target("avx512f"))) static inline __attribute__((always_inline)) void
wv512_(WV_ARGS_) {
    __m512 a[6][4];
    for (int h = 0; h < nh; h++)
        for (int c = 0; c < nv; c++)
            a[h][c] = init ? _mm512_loadu_ps(o + h * ostride + 16 * c) : _mm512_setzero_ps();
    for (int s = 0; s < n; s++) {
        const float *vs = v + (size_t)s * KD;
        if (s < pfn) wv_fetch_(vs, pfo, vstep, nh, nv);
        for (int h = 0; h < nh; h++) {
            const __m512 w = _mm512_set1_ps(sr[h * sstride + s]);
            for (int c = 0; c < nv; c++)
                a[h][c] = _mm512_fmadd_ps(w, _mm512_loadu_ps(vs + h * vstep + 16 * c), a[h][c]);
        }
    }
    for (int h = 0; h < nh; h++)
        for (int c = 0; c < nv; c++) _mm512_storeu_ps(o + h * ostride + 16 * c, a[h][c]);
}

/* a[h][2c], a[h][2c + 1]: the halves of wv512_'s a[h][c]. */
__attribute__((target("avx2,fma"))) static inline __attribute__((always_inline)) void
wv256_(WV_ARGS_) {
    __m256 a[6][8];
    for (int h = 0; h < nh; h++)
        for (int c = 0; c < 2 * nv; c++)
            a[h][c] = init ? _mm256_loadu_ps(o + h * ostride + 8 * c) : _mm256_setzero_ps();
    for (int s = 0; s < n; s++) {
        const float *vs = v + (size_t)s * KD;
        if (s < pfn) wv_fetch_(vs, pfo, vstep, nh, nv);
        for (int h = 0; h < nh; h++) {
            const __m256 w = _mm256_set1_ps(sr[h * sstride + s]);
            for (int c = 0; c < 2 * nv; c++)
                a[h][c] = _mm256_fmadd_ps(w, _mm256_loadu_ps(vs + h * vstep + 8 * c), a[h][c]);
        }
    }
    for (int h = 0; h < nh; h++)
        for (int c = 0; c < 2 * nv; c++) _mm256_storeu_ps(o + h * ostride + 8 * c, a[h][c]);
}
#endif
#undef WV_ARGS_

/* wsum_'s walks by WV over o's first hd / 32 * 32 dimensions (64 at a
 * time, then 32), each call with constant nh and nv so that the walk's
 * loops unroll and its sums stay in registers; the dimensions done.  One
 * function per variant: each inlines its walk under its own target. */
#define WV_HEADS_(WV, NV)                                                                               \
    do {                                                                                                \
        if (vstep == 0) {                                                                               \
            if (nh == 3) WV(o + d0, os, sr, ss, n, v + d0, 0, KD, 3, NV, init, pfo, pfn);               \
            else if (nh == 2) WV(o + d0, os, sr, ss, n, v + d0, 0, KD, 2, NV, init, pfo, pfn);          \
            else WV(o + d0, os, sr, ss, n, v + d0, 0, KD, 1, NV, init, pfo, pfn);                       \
        } else {                                                                                        \
            if (nh == 6) WV(o + d0, os, sr, ss, n, v + d0, vstep, KD, 6, NV, init, pfo, pfn);           \
            else if (nh == 3) WV(o + d0, os, sr, ss, n, v + d0, vstep, KD, 3, NV, init, pfo, pfn);      \
            else if (nh == 2) WV(o + d0, os, sr, ss, n, v + d0, vstep, KD, 2, NV, init, pfo, pfn);      \
            else WV(o + d0, os, sr, ss, n, v + d0, vstep, KD, 1, NV, init, pfo, pfn);                   \
        }                                                                                               \
    } while (0)
#define WV_WALKS_(WV)                                                                                   \
    int d0 = 0;                                                                                         \
    for (; d0 + 64 <= hd; d0 += 64) WV_HEADS_(WV, 4);                                                   \
    for (; d0 + 32 <= hd; d0 += 32) WV_HEADS_(WV, 2);                                                   \
    return d0
#define WALKS_ARGS_                                                                                     \
    float *o, int64_t os, int hd, const float *sr, int64_t ss, int n, const float *v, int64_t vstep,    \
        int64_t KD, int nh, int init, int64_t pfo, int pfn
static int walks_c_(WALKS_ARGS_) { WV_WALKS_(wvc_); }
#ifdef ZDP_KV_X86_
__attribute__((target("avx512f"))) static int walks512_(WALKS_ARGS_) { WV_WALKS_(wv512_); }
__attribute__((target("avx2,fma"))) static int walks256_(WALKS_ARGS_) { WV_WALKS_(wv256_); }
#endif
#undef WALKS_ARGS_
#undef WV_HEADS_
#undef WV_WALKS_
#endif

/* out[h*os + 0..hd) (init: += onto its values) = the weighted sum over
 * positions s < n of sr[h*ss + s] * v[h*vstep + s*KD + 0..hd), for nh (1..3,
 * or 6 with vstep hd) score rows h: a row's heads, or (vstep 0) one head of several query rows
 * over the same values: attend_'s sums, each lane from position 0 (or o's value) in
 * order, whatever the width (64 or 32 dimensions a walk, then one at a
 * time) and whatever the path, so the same bits as one dimension at a
 * time. */
static void wsum_(float *o, int64_t os, int hd, const float *sr, int64_t ss, int n, const float *v,
                  int64_t vstep, int64_t KD, int nh, int init, int64_t pfo, int pfn) {
    int d0 = 0;
#ifdef __GNUC__
#ifdef ZDP_KV_X86_
    const int path = zdp_nn_packed_path();
    if (path == 2) d0 = walks512_(o, os, hd, sr, ss, n, v, vstep, KD, nh, init, pfo, pfn);
    else if (path == 1) d0 = walks256_(o, os, hd, sr, ss, n, v, vstep, KD, nh, init, pfo, pfn);
    else
#endif
    d0 = walks_c_(o, os, hd, sr, ss, n, v, vstep, KD, nh, init, pfo, pfn);
#endif
    for (int h = 0; h < nh; h++)
        for (int d = d0; d < hd; d++) {
            float acc = init ? o[h * os + d] : 0.0f;
            for (int s = 0; s < n; s++) acc = fmaf(sr[h * ss + s], v[h * vstep + (int64_t)s * KD + d], acc);
            o[h * os + d] = acc;
        }
}

/* The weighted values of query heads glo*group .. ghi*group (KV heads glo
 * .. ghi): wsum_ over sets of up to 3 heads, within one KV head's group
 * (its value rows shared), or, where every head is its own KV head, 6
 * consecutive heads at a time while 6 are left, then up to 3 (each value
 * row's 6 x hd floats read contiguously; at most 6 heads: one walk,
 * one_walk_). */
__attribute__((noinline)) static void wheads_(float *o, int NH, int KV, int hd, const float *sr, int64_t ss, int n,
                    const float *v, int64_t KD, int glo, int ghi, int init, int64_t pfo, int pfn) {
    const int group = NH / KV;
    for (int h0 = glo * group; h0 < ghi * group;) {
        const int g = h0 / group, end = group == 1 ? ghi : (g + 1) * group;
        const int nh = group == 1 && end - h0 >= 6 ? 6 : end - h0 < 3 ? end - h0 : 3;
        wsum_(o + (int64_t)h0 * hd, hd, hd, sr + h0 * ss, ss, n, v + (int64_t)g * hd,
              group == 1 ? hd : 0, KD, nh, init, pfo, pfn);
        h0 += nh;
    }
}

/* Whether wheads_ weighs each value row whole in one walk, front to back:
 * every head its own KV head, at most 6 of 32 or 64 dimensions (gpt-m: 6 x
 * 64).  Then the row's values stream from memory into the weighing, in
 * order, which the hardware fetches ahead, and are not fetched to L2
 * during its scores: on Zen 4's 32 KB L1 those fetches pushed out the keys
 * fetched there for the next block, and gpt-m's decode at batch 32 ran
 * 1.05x / 1.10x slower at P 256 / P 64 (in-process alternation). */
static inline bool one_walk_(int NH, int KV, int hd) {
    return NH == KV && NH <= 6 && (hd == 64 || hd == 32);
}

#ifdef ZDP_KV_X86_
/* attend_'s scores on the AVX-512 path (hd a multiple of 16): score[h*n +
 * s] = scale * dot_(q + h*hd, K[s] + (h/group)*hd, hd) for s < n, with the
 * same operations in the same order as dot_ (its 16 partial sums are the
 * 16 lanes; the halving tree runs on 16 positions' sums at once, lanes
 * moved by shuffles, each addition the one dot_ makes), so the same bits.
 * dot_ one position at a time spent most of decode attention's time in its
 * per-score reduction and waiting on the key rows (perf, SmolLM2 batch 32).
 * Blocks of 16 positions: the block's key rows (12-24 KB) stay in L1 for
 * every head; while a block runs, the next block's key rows are fetched to
 * L1 and this block's value rows to L2 (the weighted values walk V once per
 * KV head and 32 dimensions, strided walks the hardware prefetcher follows
 * poorly), so the cache streams from memory while the scores are made.
 * Where two blocks of keys do not fit in L1 (keys_to_l2: gpt-m's 24 KB
 * blocks on Zen 4's 32 KB L1), the next block goes to L2 instead (gpt-m
 * P 256 / P 64 at batch 32, decode 1.036x / 1.046x, in-process
 * alternation: fetched lines were evicted before they were read). */
/* Scores of up to 16 positions (m) for one query head: dst[i] = scale *
 * dot_(qh, kh + i*KD, hd), i < m, as the block's 16 lanes; while its dot
 * products run, kper of the lines nk[*ki .. kl) are prefetched to L1 (k_l2:
 * to L2) and vper of vb[*vi .. vl) to L2 per position (the caller's
 * streams; 0: none). */
__attribute__((target("avx512f"))) static inline __attribute__((always_inline)) void
score16_(float *dst, const float *qh, const float *kh, int KD, int hd, int m, __m512 vscale,
         const float *nk, int *ki, int kl, int kper, bool k_l2, const float *vb, int *vi, int vl,
         int vper) {
    /* out lane i <- r lane 4 (i % 4) + i / 4 (the tree leaves position L +
     * 4k in lane 4L + k). */
    const __m512i perm = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
    const __m512 zero = _mm512_setzero_ps();
    /* dot_'s acc[j] = fmaf(q[d + j], k[d + j], acc[j]), d by 16 from 0;
     * with the position's kper and vper lines of the caller's streams. At
     * head_dim 64 (every model here) q's four vectors stay in registers
     * and the loops unroll into one straight run, so each position's chain
     * of four overlaps the next positions' (as a loop over a variable hd,
     * each waited on its own chain's latency: group_scores512_ 1.9x, own
     * scores 1.2-1.3x on gpt-m P 256). */
    __m512 acc[16];
#define SCORE16_FETCH_()                                                                    \
    do {                                                                                    \
        for (int u = 0; u < kper && *ki < kl; u++, (*ki)++)                                 \
            if (k_l2) _mm_prefetch((const char *)(nk + (size_t)*ki * 16), _MM_HINT_T1);     \
            else _mm_prefetch((const char *)(nk + (size_t)*ki * 16), _MM_HINT_T0);          \
        for (int u = 0; u < vper && *vi < vl; u++, (*vi)++)                                 \
            _mm_prefetch((const char *)(vb + (size_t)*vi * 16), _MM_HINT_T1);               \
    } while (0)
    if (m == 16 && hd == 64) {
        const __m512 q0 = _mm512_loadu_ps(qh), q1 = _mm512_loadu_ps(qh + 16),
                     q2 = _mm512_loadu_ps(qh + 32), q3 = _mm512_loadu_ps(qh + 48);
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) {
            SCORE16_FETCH_();
            const float *k = kh + (size_t)i * KD;
            __m512 a = _mm512_fmadd_ps(q0, _mm512_loadu_ps(k), zero);
            a = _mm512_fmadd_ps(q1, _mm512_loadu_ps(k + 16), a);
            a = _mm512_fmadd_ps(q2, _mm512_loadu_ps(k + 32), a);
            acc[i] = _mm512_fmadd_ps(q3, _mm512_loadu_ps(k + 48), a);
        }
    } else
        for (int i = 0; i < 16; i++) {
            SCORE16_FETCH_();
            acc[i] = zero;
            if (i < m)
                for (int d = 0; d < hd; d += 16)
                    acc[i] = _mm512_fmadd_ps(_mm512_loadu_ps(qh + d), _mm512_loadu_ps(kh + (size_t)i * KD + d),
                                             acc[i]);
        }
#undef SCORE16_FETCH_
    /* h8[j] = acc[j] + acc[j + 8]: positions 2t, 2t+1 in t8[t]'s halves. */
    __m512 t8[8], t4[4], t2[2];
    for (int t = 0; t < 8; t++)
        t8[t] = _mm512_add_ps(_mm512_shuffle_f32x4(acc[2 * t], acc[2 * t + 1], 0x44),
                              _mm512_shuffle_f32x4(acc[2 * t], acc[2 * t + 1], 0xEE));
    /* h4[j] = h8[j] + h8[j + 4]: positions 4t..4t+3 in t4[t]'s 128-bit lanes. */
    for (int t = 0; t < 4; t++)
        t4[t] = _mm512_add_ps(_mm512_shuffle_f32x4(t8[2 * t], t8[2 * t + 1], 0x88),
                              _mm512_shuffle_f32x4(t8[2 * t], t8[2 * t + 1], 0xDD));
    /* h4[0] + h4[2] and h4[1] + h4[3], then their sum. */
    for (int t = 0; t < 2; t++)
        t2[t] = _mm512_add_ps(_mm512_shuffle_ps(t4[2 * t], t4[2 * t + 1], 0x44),
                              _mm512_shuffle_ps(t4[2 * t], t4[2 * t + 1], 0xEE));
    const __m512 r = _mm512_add_ps(_mm512_shuffle_ps(t2[0], t2[1], 0x88),
                                   _mm512_shuffle_ps(t2[0], t2[1], 0xDD));
    _mm512_mask_storeu_ps(dst, (__mmask16)((1u << m) - 1u),
                          _mm512_mul_ps(vscale, _mm512_permutexvar_ps(perm, r)));
}

/* score[h*ss + s] for s < n (ss: the score rows' stride, n for attend_).
 * Vc: rows fetched to L2 block by block alongside the keys: the values
 * weighed next, from L2 (NULL: none).  after: the key
 * rows read next, whose first block is fetched to L1 while the last
 * block's scores run (NULL: none). */
__attribute__((target("avx512f"), noinline)) static void scores512_(float *score, int64_t ss, const float *q,
                                                         const float *K, const float *Vc, int n,
                                                         int NH, int group, int hd, int KD,
                                                         float scale, const float *after, bool k_l2) {
    const __m512 vscale = _mm512_set1_ps(scale);
    const int lines_row = KD / 16; /* 64-byte lines per cached row */
    for (int s0 = 0; s0 < n; s0 += 16) {
        const int m = n - s0 < 16 ? n - s0 : 16;
        int next = n - s0 - 16 < 0 ? 0 : n - s0 - 16 < 16 ? n - s0 - 16 : 16;
        const float *kb = K + (size_t)s0 * KD, *nk = kb + (size_t)16 * KD,
                    *vb = Vc != NULL ? Vc + (size_t)s0 * KD : NULL;
        if (next == 0 && after != NULL) nk = after, next = 16;
        const int kl = next * lines_row, vl = Vc != NULL ? m * lines_row : 0, steps = NH * 16;
        const int kper = (kl + steps - 1) / steps, vper = (vl + steps - 1) / steps;
        int ki = 0, vi = 0;
        for (int h = 0; h < NH; h++)
            score16_(score + h * ss + s0, q + (size_t)h * hd, kb + (size_t)(h / group) * hd,
                     KD, hd, m, vscale, nk, &ki, kl, kper, k_l2, vb, &vi, vl, vper);
    }
}

/* A group's scores over a block of a shared prompt (attend_group_):
 * dst[(r*NH + h)*T + s0 + i] for the rows' queries (q + rows[r]*qs), every
 * head, over the m <= 16 key rows kb (KD apart): the block's keys (16 rows,
 * 12-24 KB) stay in L1 for every row and head of the group, while the next
 * block's (next_lines cache lines at next_k) are fetched to L1 and this
 * block's values (vb, m rows) to L2. */
__attribute__((target("avx512f"), noinline)) static void group_scores512_(
    float *dst, int64_t T, const float *q, int64_t qs, const int *rows, int nr, int NH, int group,
    const float *kb, const float *vb, int s0, int m, int KD, int hd, float scale, const float *next_k,
    int next_lines, bool k_l2) {
    const __m512 vscale = _mm512_set1_ps(scale);
    const int steps = nr * NH * 16, vl = vb != NULL ? m * (KD / 16) : 0;
    const int kper = (next_lines + steps - 1) / steps, vper = (vl + steps - 1) / steps;
    int ki = 0, vi = 0;
    for (int r = 0; r < nr; r++)
        for (int h = 0; h < NH; h++)
            score16_(dst + ((int64_t)r * NH + h) * T + s0, q + rows[r] * qs + (int64_t)h * hd,
                     kb + (int64_t)(h / group) * hd, KD, hd, m, vscale, next_k, &ki, next_lines, kper,
                     k_l2, vb, &vi, vl, vper);
}
#endif

#ifdef ZDP_KV_X86_
/* max(x[0..n)) as a loop of sr[s] > mx ? sr[s] : mx finds it (max is
 * exact: any order gives the same value; a NaN never wins the comparison),
 * 16 lanes at a time where the loop was one dependent compare per
 * position. */
__attribute__((target("avx512f"))) static float rowmax512_(const float *x, int n) {
    __m512 m = _mm512_set1_ps(-INFINITY);
    int s = 0;
    for (; s + 16 <= n; s += 16) m = _mm512_max_ps(_mm512_loadu_ps(x + s), m);
    if (s < n) {
        const __mmask16 k = (__mmask16)((1u << (n - s)) - 1u);
        m = _mm512_mask_max_ps(m, k, _mm512_maskz_loadu_ps(k, x + s), m);
    }
    float l[16], mx = -INFINITY;
    _mm512_storeu_ps(l, m);
    for (int i = 0; i < 16; i++) mx = l[i] > mx ? l[i] : mx;
    return mx;
}
#endif

/* x[0] + .. + x[n-1] as dot_ sums: 16 partial sums (lane j: the positions
 * j, j + 16, .. in order), added by the same halving tree; a fixed order
 * that the compiler vectorises, where one running sum waited on each add. */
static inline float sum16_(const float *x, int n) {
    float acc[16] = {0};
    int s = 0;
    for (; s + 16 <= n; s += 16)
        for (int j = 0; j < 16; j++) acc[j] += x[s + j];
    for (int j = 0; s < n; s++, j++) acc[j] += x[s];
    float h8[8], h4[4];
    for (int j = 0; j < 8; j++) h8[j] = acc[j] + acc[j + 8];
    for (int j = 0; j < 4; j++) h4[j] = h8[j] + h8[j + 4];
    return (h4[0] + h4[2]) + (h4[1] + h4[3]);
}

/* Each of nh score rows S[h*ss + 0..n) <- its softmax: a decode row's
 * attention weights.  attend_ and attend_group_ both call it, so a row
 * over a shared prompt gets the bits it gets alone; and every path (AVX-512
 * or not) gets the same: each row's max, its exps (a loop of zdp_nn_exp_
 * alone, which GCC vectorises with the same operations per element; with
 * the running sum in the same loop it ran one element at a time), their
 * sum (sum16_), then the products by 1 / sum.  Kept out of line, as are scores512_,
 * group_scores512_ and wheads_, so that a profile names each part. */
__attribute__((noinline)) static void softmax_rows_(float *S, int64_t ss, int nh, int n) {
    for (int h = 0; h < nh; h++) {
        float *sr = S + h * ss, mx = -INFINITY;
#ifdef ZDP_KV_X86_
        if (zdp_nn_packed_path() == 2) mx = rowmax512_(sr, n);
        else
#endif
        for (int s = 0; s < n; s++) mx = sr[s] > mx ? sr[s] : mx;
        for (int s = 0; s < n; s++) sr[s] = zdp_nn_exp_(sr[s] - mx);
        const float inv = 1.0f / sum16_(sr, n);
        for (int s = 0; s < n; s++) sr[s] *= inv;
    }
}

/* out (NH*hd) = softmax(q . K / sqrt(hd)) V over the slot's positions
 * 0..p: q (NH*hd), K, V (>p, KV*hd) with query head h on KV head
 * h / (NH/KV).  Position by position, every head at once, so each cached
 * key and value row is read once, front to back (decode attention is bound
 * by reading the cache: every row reads its own slot's).  Plain loops: one
 * row's products are far too small for cblas_sgemm's call and packing
 * costs (a sgemm per row and head was 11% of a batch-32 decode step).
 * keys_l2: the cache's keys_to_l2.  score: (NH, p+1) scratch. */
static void attend_(float *out, const float *q, const float *K, const float *Vc, int p, int NH,
                    int KVh, int hd, int pre, bool keys_l2, float *score) {
    const int KD = KVh * hd, group = NH / KVh, n = p + 1;
    (void)keys_l2; /* read on the AVX-512 path alone */
    const float scale = 1.0f / sqrtf((float)hd);
#ifdef ZDP_KV_X86_
    if (hd % 16 == 0 && zdp_nn_packed_path() == 2)
        scores512_(score, n, q, K, one_walk_(NH, KVh, hd) ? NULL : Vc, n, NH, group, hd, KD, scale, NULL,
                   keys_l2);
    else
#endif
    for (int s = 0; s < n; s++) {
        const float *ks = K + (size_t)s * KD;
        for (int h = 0; h < NH; h++)
            score[(size_t)h * n + s] = scale * dot_(q + (size_t)h * hd, ks + (size_t)(h / group) * hd, hd);
    }
    softmax_rows_(score, n, NH, n);
    /* The weighted values, up to 64 dimensions at a time held in registers
     * over all the positions (out[] loaded and stored at every position was
     * most of this function's time), for up to 3 query heads at once
     * (wheads_): of one KV group, so each value row is loaded once for
     * them (GQA: SmolLM2's 3 query heads per KV head read it 3 times
     * before), or 3 heads with their own values (GPT-2); each sum still
     * runs over the positions in order from 0, with the same operations:
     * the same bits as head by head. */
    if (n <= pre) { /* a prompt's row */
        wheads_(out, NH, KVh, hd, score, n, n, Vc, KD, 0, KVh, 0, 0, 0);
        return;
    }
    /* The prompt's positions and the row's own as two sums, added: the
     * bits of attend_group_, which weighs a shared prompt's values once
     * for all of its rows. */
    float *a = score + (int64_t)NH * n;
    wheads_(a, NH, KVh, hd, score, n, pre, Vc, KD, 0, KVh, 0, 0, 0);
    wheads_(out, NH, KVh, hd, score + pre, n, n - pre, Vc + (int64_t)pre * KD, KD, 0, KVh, 0, 0, 0);
    for (int i = 0; i < NH * hd; i++) out[i] = a[i] + out[i];
}

/* Attention of rows [lo, hi) of a pass, each on its own slot (one thread's
 * score scratch). */
typedef struct attend_job_ {
    zdp_kv_cache *kv;
    const int32_t *slots;
    const float *q;
    int64_t qs, l;
} attend_job_;

/* Positions of a shared prompt's values weighed per block in attend_group_:
 * the block's value rows of one KV head (64 x head_dim floats, 16 KB at
 * head_dim 64) stay in L1 for all of the group's rows and heads. */
#define GROUP_VBLOCK_ 64
/* A row's own values are fetched to L2 while its scores run (and weighed
 * from there) where they take at most this many bytes; longer ones stream
 * from memory into the weighing, fetched 32 positions ahead.  Except where
 * one walk of wheads_ weighs each value row whole (one_walk_). */
#define OWN_L2_BYTES_ (512 * 1024)

/* Task of a pass's attention: a chunk of a group's rows (lone rows whose
 * slot reads the first plen positions of prompt slot ps: ps's own rows and
 * its sharers', plan_attention_), every head.  attend_'s math for each row
 * and head, with its operations in its order: each score dot_'s (score16_
 * on AVX-512), the softmax over positions 0..p, the weighted values as two
 * sums from 0 (the prompt's positions, then the row's own), added: so the
 * same bits as the row attended alone over a copy of the prompt, its
 * prompt length plen.  What differs is the reading: the prompt's keys are
 * read once for all of the chunk's rows (16 samples of a prompt read them
 * once, not 16 times), then each row's own keys, its own values fetched to
 * L2 meanwhile (OWN_L2_BYTES_), its softmax and its own weighted values, then the prompt's
 * values once for all rows, a block at a time.  S: (rows, NH, T) this
 * thread's scores, then (rows, NH hd) the prompt's weighted values. */
static void attend_group_(zdp_kv_cache *kv, const attend_job_ *j, const int *rows, int nr, int ps,
                          int plen, float *S) {
    const int64_t KD = (int64_t)kv->KV * kv->hd, T = kv->T, QD = (int64_t)kv->NH * kv->hd;
    const int hd = kv->hd, NH = kv->NH, group = kv->NH / kv->KV;
    const float scale = 1.0f / sqrtf((float)hd);
    const float *Kp = kv->k + ((j->l * kv->n_slots + ps) * T) * KD; /* (plen, KD) */
    const float *Vp = kv->v + ((j->l * kv->n_slots + ps) * T) * KD;
    float *W = S + (int64_t)nr * NH * T; /* (nr, QD) */
#define OWN_(arr, i) (kv->arr + ((j->l * kv->n_slots + j->slots[i]) * T + plen) * KD)
#ifdef ZDP_KV_X86_
    const bool x86 = hd % 16 == 0 && zdp_nn_packed_path() == 2;
    if (x86) /* the prompt's scores, block by block for every row */
        for (int s0 = 0; s0 < plen; s0 += 16) {
            const int m = plen - s0 < 16 ? plen - s0 : 16, nx = plen - s0 - m < 16 ? plen - s0 - m : 16;
            group_scores512_(S, T, j->q, j->qs, rows, nr, NH, group, Kp + (int64_t)s0 * KD, NULL, s0,
                             m, (int)KD, hd, scale, Kp + (int64_t)(s0 + m) * KD, nx * (int)(KD / 16),
                             kv->keys_to_l2);
        }
#endif
    const bool fetch = !one_walk_(NH, kv->KV, hd); /* the own values, to L2 (OWN_L2_BYTES_) */
    for (int r = 0; r < nr; r++) {
        const int n = kv->pos[rows[r]] + 1, own = n - plen;
        float *sr = S + (int64_t)r * NH * T;
        const float *qr = j->q + rows[r] * j->qs;
        const bool fits = (int64_t)own * KD * 4 <= OWN_L2_BYTES_;
#ifdef ZDP_KV_X86_
        if (x86)
            scores512_(sr + plen, T, qr, OWN_(k, rows[r]), fetch && fits ? OWN_(v, rows[r]) : NULL, own, NH,
                       group, hd, (int)KD, scale, r + 1 < nr ? OWN_(k, rows[r + 1]) : NULL, kv->keys_to_l2);
        else
#endif
        for (int h = 0; h < NH; h++)
            for (int s = 0; s < n; s++)
                sr[h * T + s] = scale * dot_(qr + (int64_t)h * hd,
                                             (s < plen ? Kp + (int64_t)s * KD : OWN_(k, rows[r]) + (int64_t)(s - plen) * KD) +
                                                 (int64_t)(h / group) * hd, hd);
        softmax_rows_(sr, T, NH, n); /* attend_'s softmax */
        /* the row's own weighted values (OWN_L2_BYTES_) */
        wheads_(kv->atty + (int64_t)rows[r] * QD, NH, kv->KV, hd, sr + plen, T, own, OWN_(v, rows[r]),
                KD, 0, kv->KV, 0, 32 * KD, fetch && !fits ? own - 32 : 0);
    }
    /* The prompt's weighted values, a block at a time for every row (one KV
     * head's columns of the block in L1), each sum carried across blocks.
     * Where each query head has its own KV head (GPT-2), three rows at a
     * time share each load of a value row (12 independent sums where one
     * head of one row had 4, a chain of dependent fused multiply-adds); a
     * KV head's query heads (GQA) share them already (wheads_). */
    for (int b0 = 0; b0 < plen; b0 += GROUP_VBLOCK_) {
        const int nb = plen - b0 < GROUP_VBLOCK_ ? plen - b0 : GROUP_VBLOCK_;
        for (int g = 0; g < kv->KV; g++)
            if (group == 1) {
                /* The first three rows' walk fetches what the next walks
                 * read: this block's next head, or the next block's first
                 * (its values waited on memory, ~20% of this loop on gpt-m
                 * P 256). */
                const int left = plen - b0 - GROUP_VBLOCK_;
                const bool last = g == kv->KV - 1;
                const int64_t pfo = last ? (int64_t)GROUP_VBLOCK_ * KD - (int64_t)g * hd : hd;
                const int pfn = !last ? nb : left < nb ? (left > 0 ? left : 0) : nb;
                for (int r = 0; r < nr; r += 3)
                    wsum_(W + r * QD + (int64_t)g * hd, QD, hd, S + ((int64_t)r * NH + g) * T + b0,
                          (int64_t)NH * T, nb, Vp + (int64_t)b0 * KD + (int64_t)g * hd, 0, KD,
                          nr - r < 3 ? nr - r : 3, b0 > 0, pfo, r == 0 ? pfn : 0);
            } else
                for (int r = 0; r < nr; r++)
                    wheads_(W + r * QD, NH, kv->KV, hd, S + (int64_t)r * NH * T + b0, T, nb,
                            Vp + (int64_t)b0 * KD, KD, g, g + 1, b0 > 0, 0, 0);
    }
    for (int r = 0; r < nr; r++) { /* attend_'s sum of the two */
        float *o = kv->atty + (int64_t)rows[r] * QD;
        for (int64_t i = 0; i < QD; i++) o[i] = W[r * QD + i] + o[i];
    }
#undef OWN_
}

#ifdef ZDP_KV_X86_
/* prompt_block_'s products on the AVX-512 path (hd a multiple of 16), in
 * place of two cblas_sgemm per (block, head): those are small (M <= 64, K =
 * hd = 64 for Q K^T; N = hd for S V), OpenBLAS packs both operands per call
 * and its environment's Haswell core runs half an AVX-512 core's rate;
 * gemm.c's blocking made them slower still (0.73-0.90x, "Seventh pass: Zen
 * 5").  Here nothing is packed but a 32-key panel of K^T (8 KB at hd 64,
 * in L1 for all the block's query rows), and neither product computes the
 * masked triangle past the block's rows' own positions.
 *
 * The order of each element's sum (the bits depend only on the row's
 * query, its keys, values and the block's split, which plan_attention_
 * makes from the run alone, so not on the batch, the other rows of the
 * pass or the thread count):
 *   S[r][s] = scale * (fma chain over d = 0, 1, .., hd-1 from 0 of
 *             Q[r][d] * K[s][d]), one rounding per fused step;
 *   out[r][d] = fma chain over s = 0, 1, .., e-1 from 0 of S[r][s] *
 *             V[s][d], e = the row group's last position + 1 (the row's own
 *             positions past p0 + r add S = 0, exactly). */

/* 16 rows of 16 floats (src[i], i < 16) transposed into dst[c * ld + i]. */
__attribute__((target("avx512f"))) static inline __attribute__((always_inline)) void
tr16_(float *dst, int64_t ld, const float *const *src) {
    __m512 r[16], t[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(src[i]);
    for (int i = 0; i < 8; i++) { /* per 128-bit lane: (a0 b0 a1 b1), (a2 b2 a3 b3) */
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) { /* r[4i + c]: rows 4i..4i+3 of column 4L + c in lane L */
        const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
        const __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
        r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    for (int c = 0; c < 4; c++) { /* lanes L of rows 0-3, 4-7, 8-11, 12-15 gathered */
        const __m512 u0 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88);
        const __m512 u1 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xDD);
        const __m512 v0 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88);
        const __m512 v1 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xDD);
        _mm512_storeu_ps(dst + (c + 0) * ld, _mm512_shuffle_f32x4(u0, v0, 0x88));
        _mm512_storeu_ps(dst + (c + 4) * ld, _mm512_shuffle_f32x4(u1, v1, 0x88));
        _mm512_storeu_ps(dst + (c + 8) * ld, _mm512_shuffle_f32x4(u0, v0, 0xDD));
        _mm512_storeu_ps(dst + (c + 12) * ld, _mm512_shuffle_f32x4(u1, v1, 0xDD));
    }
}

/* S[r][s0 + c] (rows of stride ss) for R query rows q (stride qs) and the
 * panel's 32 keys kt[d * 32 + c], c < m (the rest masked off): 2R
 * accumulators, per d two panel loads and R broadcasts of q. */
__attribute__((target("avx512f"))) static inline __attribute__((always_inline)) void
qk_rows_(float *S, int64_t ss, const float *q, int64_t qs, const float *kt, int hd, int m,
         __m512 vscale, int R) {
    __m512 a[8][2];
    for (int r = 0; r < R; r++) a[r][0] = a[r][1] = _mm512_setzero_ps();
    for (int d = 0; d < hd; d++) {
        const __m512 k0 = _mm512_loadu_ps(kt + d * 32), k1 = _mm512_loadu_ps(kt + d * 32 + 16);
        for (int r = 0; r < R; r++) {
            const __m512 x = _mm512_set1_ps(q[r * qs + d]);
            a[r][0] = _mm512_fmadd_ps(x, k0, a[r][0]);
            a[r][1] = _mm512_fmadd_ps(x, k1, a[r][1]);
        }
    }
    const __mmask16 m0 = m >= 16 ? 0xFFFF : (__mmask16)((1u << m) - 1u);
    const __mmask16 m1 = m >= 32 ? 0xFFFF : m <= 16 ? 0 : (__mmask16)((1u << (m - 16)) - 1u);
    for (int r = 0; r < R; r++) {
        _mm512_mask_storeu_ps(S + r * ss, m0, _mm512_mul_ps(vscale, a[r][0]));
        _mm512_mask_storeu_ps(S + r * ss + 16, m1, _mm512_mul_ps(vscale, a[r][1]));
    }
}

/* out[r][d0 .. d0 + 16 NV) (rows of stride os) = sum over s < e of S[r][s]
 * V[s][d0 ..] for R rows: R x NV accumulators, per position NV loads of V's
 * row (contiguous) and R broadcasts of S. */
__attribute__((target("avx512f"))) static inline __attribute__((always_inline)) void
sv_rows_(float *out, int64_t os, const float *S, int64_t ss, const float *V, int64_t KD, int e,
         int R, int NV) {
    __m512 a[6][4];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < NV; c++) a[r][c] = _mm512_setzero_ps();
    for (int s = 0; s < e; s++) {
        __m512 v[4];
        for (int c = 0; c < NV; c++) v[c] = _mm512_loadu_ps(V + s * KD + 16 * c);
        for (int r = 0; r < R; r++) {
            const __m512 x = _mm512_set1_ps(S[r * ss + s]);
            for (int c = 0; c < NV; c++) a[r][c] = _mm512_fmadd_ps(x, v[c], a[r][c]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < NV; c++) _mm512_storeu_ps(out + r * os + 16 * c, a[r][c]);
}

/* S (rb, n) = scale Q K^T for the block's rows at positions p0 .. p0+rb-1,
 * only the 32-key panels some row of an 8-row group reaches (entries past
 * a row's own position are left for the softmax, which zeroes them). kt:
 * the 32 x hd panel. */
__attribute__((target("avx512f"))) static void prompt_qk512_(float *S, int64_t n, const float *q,
                                                             int64_t qs, const float *K, int64_t KD,
                                                             int hd, int64_t p0, int64_t rb,
                                                             float scale, float *kt) {
    static const float zeros[16] = {0};
    const __m512 vscale = _mm512_set1_ps(scale);
    for (int64_t s0 = 0; s0 < n; s0 += 32) {
        const int m = n - s0 < 32 ? (int)(n - s0) : 32;
        for (int half = 0; half < 2; half++) /* the panel, keys past n as zeros */
            for (int d = 0; d < hd; d += 16) {
                const float *src[16];
                for (int i = 0; i < 16; i++)
                    src[i] = 16 * half + i < m ? K + (s0 + 16 * half + i) * KD + d : zeros;
                tr16_(kt + d * 32 + 16 * half, 32, src);
            }
        /* Row groups whose last row's position reaches s0. */
        for (int64_t r0 = s0 - p0 > 7 ? (s0 - p0) / 8 * 8 : 0; r0 < rb; r0 += 8) {
            const int R = rb - r0 < 8 ? (int)(rb - r0) : 8;
            float *Sr = S + r0 * n + s0;
            const float *qr = q + r0 * qs;
            switch (R) {
            case 8: qk_rows_(Sr, n, qr, qs, kt, hd, m, vscale, 8); break;
            case 7: qk_rows_(Sr, n, qr, qs, kt, hd, m, vscale, 7); break;
            case 6: qk_rows_(Sr, n, qr, qs, kt, hd, m, vscale, 6); break;
            case 5: qk_rows_(Sr, n, qr, qs, kt, hd, m, vscale, 5); break;
            case 4: qk_rows_(Sr, n, qr, qs, kt, hd, m, vscale, 4); break;
            case 3: qk_rows_(Sr, n, qr, qs, kt, hd, m, vscale, 3); break;
            case 2: qk_rows_(Sr, n, qr, qs, kt, hd, m, vscale, 2); break;
            default: qk_rows_(Sr, n, qr, qs, kt, hd, m, vscale, 1); break;
            }
        }
    }
}

/* out (rb, hd; stride os) = S V, rows in groups of 6, each group's sums
 * over positions 0 .. p0 + its last row (S is 0 past each row's own). */
__attribute__((target("avx512f"))) static void prompt_sv512_(float *out, int64_t os, const float *S,
                                                             int64_t n, const float *V, int64_t KD,
                                                             int hd, int64_t p0, int64_t rb) {
    for (int64_t r0 = 0; r0 < rb; r0 += 6) {
        const int R = rb - r0 < 6 ? (int)(rb - r0) : 6, e = (int)(p0 + r0 + R);
        for (int d0 = 0; d0 < hd; d0 += 64) {
            const int NV = hd - d0 < 64 ? (hd - d0) / 16 : 4;
            float *o = out + r0 * os + d0;
            const float *Sr = S + r0 * n, *Vd = V + d0;
#define SV_(RR)                                                                          \
    case RR:                                                                             \
        if (NV == 4) sv_rows_(o, os, Sr, n, Vd, KD, e, RR, 4);                           \
        else if (NV == 3) sv_rows_(o, os, Sr, n, Vd, KD, e, RR, 3);                      \
        else if (NV == 2) sv_rows_(o, os, Sr, n, Vd, KD, e, RR, 2);                      \
        else sv_rows_(o, os, Sr, n, Vd, KD, e, RR, 1);                                   \
        break;
            switch (R) {
                SV_(6) SV_(5) SV_(4) SV_(3) SV_(2) default: SV_(1)
            }
#undef SV_
        }
    }
}
#endif

/* One block of a prompt's rows for one query head: rows i0 .. i0+rb of the
 * pass, on one slot at positions p0 .. p0+rb, against the slot's keys and
 * values 0 .. p0+rb (stored before the pass attends):
 *   S (rb, n) = Q K^T / sqrt(hd);  each row's softmax over its positions
 *   0..p, 0 past them;  out (rb, hd) = S V.
 * Two products per (block, head) instead of a dot product per (row,
 * position, head): the prompt's rows are many, so the keys and values are
 * read once per block, not once per row.  S stays in L2 (PROMPT_BLOCK_ rows
 * of at most T floats). */
static void prompt_block_(zdp_kv_cache *kv, const attend_job_ *j, int64_t b, int64_t h,
                          float *S) {
    const int64_t QD = (int64_t)kv->NH * kv->hd, KD = (int64_t)kv->KV * kv->hd, hd = kv->hd;
    const int64_t i0 = kv->blk[2 * b], rb = kv->blk[2 * b + 1], p0 = kv->pos[i0], n = p0 + rb;
    const int64_t g = h / (kv->NH / kv->KV);
    const int64_t base = ((j->l * kv->n_slots + j->slots[i0]) * kv->T) * KD + g * hd;
    const float scale = 1.0f / sqrtf((float)hd);
#ifdef ZDP_KV_X86_
    const bool direct = hd % 16 == 0 && zdp_nn_packed_path() == 2;
    if (direct) {
        float kt[32 * 256]; /* 32 keys' K^T panel; a head past 256 keeps cblas_sgemm for Q K^T */
        if (hd <= 256)
            prompt_qk512_(S, n, j->q + i0 * j->qs + h * hd, j->qs, kv->k + base, KD, (int)hd, p0,
                          rb, scale, kt);
        else
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rb, (int)n, (int)hd, scale,
                        j->q + i0 * j->qs + h * hd, (int)j->qs, kv->k + base, (int)KD, 0.0f, S,
                        (int)n);
    } else
#endif
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rb, (int)n, (int)hd, scale,
                j->q + i0 * j->qs + h * hd, (int)j->qs, kv->k + base, (int)KD, 0.0f, S, (int)n);
    for (int64_t r = 0; r < rb; r++) { /* attend_'s softmax, on positions 0..p0+r */
        float *sr = S + r * n, mx = -INFINITY, sum = 0.0f;
        const int64_t m = p0 + r + 1;
#ifdef ZDP_KV_X86_
        if (direct) mx = rowmax512_(sr, (int)m);
        else
#endif
        for (int64_t s = 0; s < m; s++) mx = sr[s] > mx ? sr[s] : mx;
        for (int64_t s = 0; s < m; s++) {
            sr[s] = zdp_nn_exp_(sr[s] - mx);
            sum += sr[s];
        }
        const float inv = 1.0f / sum;
        for (int64_t s = 0; s < m; s++) sr[s] *= inv;
        for (int64_t s = m; s < n; s++) sr[s] = 0.0f;
    }
#ifdef ZDP_KV_X86_
    if (direct) {
        prompt_sv512_(kv->atty + i0 * QD + h * hd, QD, S, n, kv->v + base, KD, (int)hd, p0, rb);
        return;
    }
#endif
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rb, (int)hd, (int)n, 1.0f, S,
                (int)n, kv->v + base, (int)KD, 0.0f, kv->atty + i0 * QD + h * hd, (int)QD);
}

/* Task t of a pass's attention: the prompt blocks' (block, head) pairs
 * first (the larger tasks), then the shared prompts' groups' chunks of
 * rows, then the lone rows, each on its own slot. */
static void attend_rows_(void *ctx, int64_t task, int thread) {
    const attend_job_ *j = ctx;
    zdp_kv_cache *kv = j->kv;
    const int64_t QD = (int64_t)kv->NH * kv->hd, KD = (int64_t)kv->KV * kv->hd;
    const int64_t nb = (int64_t)kv->n_blk * kv->NH, ng = (int64_t)kv->n_grp * kv->grp_chunks;
    if (task < nb) {
        prompt_block_(kv, j, task / kv->NH, task % kv->NH,
                      kv->pscore + (int64_t)thread * PROMPT_BLOCK_ * kv->T);
        return;
    }
    if (task < nb + ng) {
        const int g = (int)((task - nb) / kv->grp_chunks), c = (int)((task - nb) % kv->grp_chunks);
        const int nr = kv->grp[4 * g + 1], r0 = nr * c / kv->grp_chunks, r1 = nr * (c + 1) / kv->grp_chunks;
        const int *rows = kv->grow + kv->grp[4 * g], plen = kv->grp[4 * g + 3];
        attend_group_(kv, j, rows + r0, r1 - r0, kv->grp[4 * g + 2], plen,
                      kv->gscore + (int64_t)thread * kv->gscore_per);
        return;
    }
    float *score = kv->score + (int64_t)thread * (kv->NH * kv->T + QD);
    const int64_t i = kv->lone[task - nb - ng];
    const int64_t base = ((j->l * kv->n_slots + j->slots[i]) * kv->T) * KD;
    attend_(kv->atty + i * QD, j->q + i * j->qs, kv->k + base, kv->v + base, kv->pos[i], kv->NH, kv->KV,
            kv->hd, kv->pre[j->slots[i]], kv->keys_to_l2, score);
}

/* Splits a pass's rows for attention: runs of at least PROMPT_ROWS_ rows on
 * one slot at consecutive positions (a prompt's prefill) into blocks of up
 * to PROMPT_BLOCK_ rows, attended as products; every other row alone.  The
 * split depends only on each run, not on what else is in the pass, so a
 * prompt's attention gets the same bits in any batch.  false: out of memory
 * for the blocks' scores. */
static bool plan_attention_(zdp_kv_cache *kv, const int32_t *slots, int n) {
    kv->n_lone = kv->n_blk = 0;
    for (int i = 0; i < n;) {
        int e = i + 1;
        while (e < n && slots[e] == slots[i] && kv->pos[e] == kv->pos[e - 1] + 1) e++;
        if (e - i >= PROMPT_ROWS_ && kv->base[slots[i]] < 0) { /* (a sharer's
            * positions are in two places: its rows go one by one) */
            for (int r = i; r < e; r += PROMPT_BLOCK_) {
                kv->blk[2 * kv->n_blk] = r;
                kv->blk[2 * kv->n_blk + 1] = e - r < PROMPT_BLOCK_ ? e - r : PROMPT_BLOCK_;
                kv->n_blk++;
            }
        } else {
            for (int r = i; r < e; r++) kv->lone[kv->n_lone++] = r;
        }
        i = e;
    }
    /* Lone rows over a shared prompt (a sharer's, or the shared slot's own),
     * by prompt: one group each, its rows in row order. */
    int nl = 0, most = 0;
    kv->n_grp = 0;
    for (int a = 0; a < kv->n_lone; a++) {
        const int s = slots[kv->lone[a]], ps = kv->base[s] >= 0 ? kv->base[s] : s;
        if (kv->base[s] < 0 && kv->nshare[s] == 0) continue;
        int g = 0;
        while (g < kv->n_grp && kv->grp[4 * g + 2] != ps) g++;
        if (g == kv->n_grp) {
            kv->grp[4 * g] = 0, kv->grp[4 * g + 1] = 0;
            kv->grp[4 * g + 2] = ps, kv->grp[4 * g + 3] = kv->slen[ps];
            kv->n_grp++;
        }
        kv->grp[4 * g + 1]++;
        if (kv->grp[4 * g + 1] > most) most = kv->grp[4 * g + 1];
    }
    for (int g = 0, at = 0; g < kv->n_grp; g++) { /* each group's first index, then its rows */
        kv->grp[4 * g] = at;
        for (int a = 0; a < kv->n_lone; a++) {
            const int i = kv->lone[a], s = slots[i];
            if ((kv->base[s] >= 0 ? kv->base[s] : s) == kv->grp[4 * g + 2] &&
                (kv->base[s] >= 0 || kv->nshare[s] > 0))
                kv->grow[at++] = i;
        }
    }
    for (int a = 0; a < kv->n_lone; a++) /* the rest stay lone */
        if (kv->base[slots[kv->lone[a]]] < 0 && kv->nshare[slots[kv->lone[a]]] == 0)
            kv->lone[nl++] = kv->lone[a];
    kv->n_lone = nl;
    /* Each group's rows in as many chunks as it takes to give every thread
     * a task (one group on two threads: two chunks, each reading the prompt
     * once); a chunk's scores are (rows, NH, T). */
    kv->grp_chunks = kv->n_grp > 0 && kv->n_grp < kv->n_threads ? (kv->n_threads + kv->n_grp - 1) / kv->n_grp : 1;
    const int64_t per = (int64_t)((most + kv->grp_chunks - 1) / kv->grp_chunks) * kv->NH * (kv->T + kv->hd);
    if (per > kv->gscore_per) {
        float *g = realloc(kv->gscore, (size_t)(kv->n_threads * per) * sizeof(float));
        if (g == NULL) return false;
        kv->scratch_bytes += (int64_t)kv->n_threads * (per - kv->gscore_per) * 4;
        kv->gscore = g, kv->gscore_per = per;
    }
    if (kv->n_blk > 0 && kv->pscore == NULL) {
        const int64_t f = (int64_t)kv->n_threads * PROMPT_BLOCK_ * kv->T;
        if ((kv->pscore = malloc((size_t)f * sizeof(float))) == NULL) return false;
        kv->scratch_bytes += f * 4;
    }
    return true;
}

zdp_status zdp_lm_decode(zdp_kv_cache *kv, const float *const *P, const int32_t *slots,
                         const int32_t *tokens, int n, const uint8_t *want, float *logits,
                         zdp_error *err) {
    const char *fn = "zdp_lm_decode";
    if (kv == NULL || P == NULL || slots == NULL || tokens == NULL || n < 1)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "%s: kv, params, slots and tokens must be set and n >= 1 (n = %d)", fn,
                           n);
    if (!reserve_(kv, n))
        return zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory for %d rows of scratch", fn, n);
    /* Positions first, checking everything before anything is written. */
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
        if (kv->pos[i] == 0) kv->pre[slots[i]] = kv->len[slots[i]];
    /* The adapters' scratch: (n, the largest rank bound to a row's slot). */
    int64_t need = 0;
    for (int i = 0; i < n && kv->n_adapted > 0; i++) {
        const zdp_lora_config *c = zdp_lora_config_of(kv->slot_lora[slots[i]]);
        if (c != NULL && (int64_t)n * c->rank > need) need = (int64_t)n * c->rank;
    }
    if (need > kv->xa_cap) {
        float *p = realloc(kv->xa, (size_t)need * sizeof *p);
        if (p == NULL) {
            for (int j = 0; j < n; j++) kv->len[slots[j]]--; /* undo */
            return zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory for the adapters' "
                               "scratch (%lld floats)", fn, (long long)need);
        }
        kv->xa = p, kv->xa_cap = need;
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
                           PROMPT_BLOCK_, kv->T);
    }
    const int64_t N = n, C = kv->C, NH = kv->NH, KVh = kv->KV, hd = kv->hd, F = kv->F;
    const int64_t QD = NH * hd, KD = KVh * hd, T = kv->T;
    /* The embedding. */
    for (int i = 0; i < n; i++) {
        const float *e = P[kv->embed] + (int64_t)tokens[i] * C;
        float *x = kv->x + i * C;
        if (kv->pos_embed >= 0) {
            const float *pe = P[kv->pos_embed] + (int64_t)kv->pos[i] * C;
            for (int64_t j = 0; j < C; j++) x[j] = e[j] + pe[j];
        } else {
            memcpy(x, e, (size_t)C * sizeof(float));
        }
    }
#define B_(idx) ((idx) >= 0 ? P[idx] : NULL)
    for (int l = 0; l < kv->L; l++) {
        const kv_layer_ *y = &kv->layer[l];
        float *q, *k, *v;
        int64_t qs, ks; /* row strides of q and of k, v */
        if (!kv->llama) {
            zdp_nn_layernorm_forward(kv->h, kv->mean, kv->rstd, kv->x, P[y->ln1_w], P[y->ln1_b],
                                     N, C);
            conv1d_(kv, P, kv->qkv, kv->h, y->qkv_w, P[y->qkv_b], N, C, 3 * C);
            adapt_(kv, y->site[KS_Q], kv->qkv, kv->h, N, slots);
            q = kv->qkv, k = kv->qkv + C, v = kv->qkv + 2 * C, qs = ks = 3 * C;
        } else {
            zdp_nn_rmsnorm_forward(kv->h, kv->rstd, kv->x, P[y->ln1_w], N, C, kv->eps);
            q = kv->q, k = kv->kk, v = kv->vv, qs = QD, ks = KD;
            linear_(kv, P, q, kv->h, y->q_w, B_(y->q_b), N, C, QD, 0);
            linear_(kv, P, k, kv->h, y->k_w, B_(y->k_b), N, C, KD, 0);
            linear_(kv, P, v, kv->h, y->v_w, B_(y->v_b), N, C, KD, 0);
            adapt_(kv, y->site[KS_Q], q, kv->h, N, slots);
            adapt_(kv, y->site[KS_K], k, kv->h, N, slots);
            adapt_(kv, y->site[KS_V], v, kv->h, N, slots);
            if (y->q_norm >= 0) { /* Qwen3: per head, in place (rows of hd) */
                zdp_nn_rmsnorm_forward(q, kv->rstd, q, P[y->q_norm], N * NH, hd, kv->eps);
                zdp_nn_rmsnorm_forward(k, kv->rstd, k, P[y->k_norm], N * KVh, hd, kv->eps);
            }
            for (int i = 0; i < n; i++) { /* rotary at each row's own position */
                const int64_t o = (int64_t)kv->pos[i] * (hd / 2);
                zdp_nn_rope_forward(q + i * QD, q + i * QD, kv->cos + o, kv->sin + o, 1, 1, NH,
                                    hd);
                zdp_nn_rope_forward(k + i * KD, k + i * KD, kv->cos + o, kv->sin + o, 1, 1, KVh,
                                    hd);
            }
        }
        /* Store every row's key and value, then attend: a prompt's rows see
         * each other up to their own position. */
        for (int i = 0; i < n; i++) {
            const int64_t at = (((int64_t)l * kv->n_slots + slots[i]) * T + kv->pos[i]) * KD;
            memcpy(kv->k + at, k + i * ks, (size_t)KD * sizeof(float));
            memcpy(kv->v + at, v + i * ks, (size_t)KD * sizeof(float));
        }
        attend_job_ aj = {.kv = kv, .slots = slots, .q = q, .qs = qs, .l = l};
        zdp_pool_run((int64_t)kv->n_blk * NH + (int64_t)kv->n_grp * kv->grp_chunks + kv->n_lone,
                     attend_rows_, &aj);
        if (!kv->llama) {
            conv1d_(kv, P, kv->h, kv->atty, y->o_w, P[y->o_b], N, C, C);
            adapt_(kv, y->site[KS_O], kv->h, kv->atty, N, slots);
            zdp_nn_residual_forward(kv->x, kv->x, kv->h, N * C);
            zdp_nn_layernorm_forward(kv->h, kv->mean, kv->rstd, kv->x, P[y->ln2_w], P[y->ln2_b],
                                     N, C);
            conv1d_(kv, P, kv->f1, kv->h, y->fc_w, P[y->fc_b], N, C, F);
            adapt_(kv, y->site[KS_UP], kv->f1, kv->h, N, slots);
            zdp_nn_gelu_forward(kv->f1, kv->f1, N * F);
            conv1d_(kv, P, kv->h, kv->f1, y->proj_w, P[y->proj_b], N, F, C);
            adapt_(kv, y->site[KS_DOWN], kv->h, kv->f1, N, slots);
            zdp_nn_residual_forward(kv->x, kv->x, kv->h, N * C);
        } else {
            linear_(kv, P, kv->x, kv->atty, y->o_w, B_(y->o_b), N, QD, C, 1);
            adapt_(kv, y->site[KS_O], kv->x, kv->atty, N, slots);
            zdp_nn_rmsnorm_forward(kv->h, kv->rstd, kv->x, P[y->ln2_w], N, C, kv->eps);
            linear_(kv, P, kv->f1, kv->h, y->gate, NULL, N, C, F, 0);
            linear_(kv, P, kv->f2, kv->h, y->up, NULL, N, C, F, 0);
            adapt_(kv, y->site[KS_GATE], kv->f1, kv->h, N, slots);
            adapt_(kv, y->site[KS_UP], kv->f2, kv->h, N, slots);
            zdp_nn_swiglu_forward(kv->f1, kv->f1, kv->f2, N * F);
            linear_(kv, P, kv->x, kv->f1, y->down, NULL, N, F, C, 1);
            adapt_(kv, y->site[KS_DOWN], kv->x, kv->f1, N, slots);
        }
    }
#undef B_
    if (logits == NULL) return ZDP_OK;
    /* The final norm and the lm_head only on the rows asked for. */
    int64_t m = 0;
    for (int i = 0; i < n; i++)
        if (want == NULL || want[i]) {
            if (m != i) memcpy(kv->x + m * C, kv->x + (int64_t)i * C, (size_t)C * sizeof(float));
            kv->wslot[m++] = slots[i];
        }
    if (m == 0) return ZDP_OK;
    if (!kv->llama)
        zdp_nn_layernorm_forward(kv->h, kv->mean, kv->rstd, kv->x, P[kv->lnf_w], P[kv->lnf_b], m,
                                 C);
    else
        zdp_nn_rmsnorm_forward(kv->h, kv->rstd, kv->x, P[kv->lnf_w], m, C, kv->eps);
    linear_(kv, P, logits, kv->h, kv->lm_head, NULL, m, C, kv->V, 0); /* lm_head (V,C) */
    adapt_(kv, kv->head_site, logits, kv->h, m, kv->wslot);
    return ZDP_OK;
}
