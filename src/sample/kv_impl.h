/*
 * kv_impl.h -- internal: the KV cache's state (zdp/sample.h's zdp_kv_cache
 * and zdp_kv_packs), shared by kv.c (the cache, its slots, prompt sharing,
 * the adapters bound to slots) and decode.c (a pass over the cache: the
 * batch plan, the products, the model's decode step).
 */
#ifndef ZDP_SAMPLE_KV_IMPL_H
#define ZDP_SAMPLE_KV_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "../models/adapter.h"
#include "zdp/model.h"
#include "zdp/sample.h"

/* The lone rows of a pass over one shared prompt: rows group_rows[first ..
 * first + n_rows), in row order, whose slots read the first prompt_len
 * positions of slot prompt_slot's storage. */
typedef struct kv_share_group {
    int first, n_rows, prompt_slot, prompt_len;
} kv_share_group;

/* A block of a prompt's consecutive rows attended as products: rows first ..
 * first + n_rows of the pass, on one slot. */
typedef struct kv_prompt_block {
    int first, n_rows;
} kv_prompt_block;

struct zdp_kv_cache {
    const zdp_model *model;
    bool llama;        /* the Llama family (rotary tables), else GPT-2 */
    int L, C, NH, KV, hd, F, V, T; /* T: positions per slot */
    float eps;
    int n_slots;
    int *len;          /* (n_slots) positions stored */
    /* Prompt sharing (zdp_kv_share_slot): slot s reads its first
     * borrowed_len[s] positions from slot lender[s]'s storage (-1: all its
     * own); n_sharers[s] slots read the first lent_len[s] positions of s so.
     * A slot is a sharer or shared, never both. */
    int *lender, *borrowed_len, *n_sharers, *lent_len; /* (n_slots) each */
    /* (n_slots) each slot's prompt length: its positions after the first
     * pass that stored any (a sharer: the shared length).  Decode attention
     * weighs the values before it and from it as two sums, added (a
     * group's rows weigh the prompt's together, each row its own alone). */
    int *prompt_len;
    float *k, *v;      /* (L, n_slots, T, KV*hd) the cached keys and values */
    float *cos, *sin;  /* (T, hd/2) rotary tables (Llama family) */
    zdp_adapter_site *sites; /* (n_sites) the model's adaptable linears */
    int n_sites;
    /* Per slot: the LoRA model and adapter tensors bound to it, or NULL. */
    const zdp_model **slot_lora;
    const float *const **slot_adapter;
    int n_adapted;     /* slots with an adapter bound */
    float *lora_xa;    /* (lora_xa_cap) (rows, rank) the adapters' down products */
    int64_t lora_xa_cap;
    int32_t *head_slots; /* (rows_cap) the slot of each row the lm_head runs on */
    /* Scratch for rows_cap rows, grown on demand. */
    int rows_cap;
    float *x, *h, *qkv, *q, *k_rows, *v_rows, *atty, *f1, *f2, *mean, *rstd;
    float *row_scratch; /* (threads, NH T + NH hd) one lone row's scores and prompt sums */
    int *pos;           /* (rows_cap) each row's position in its slot */
    /* A pass's attention work (decode.c's plan_attention_): rows attended
     * one by one, prompt blocks attended as products, groups of rows over
     * a shared prompt. */
    int *lone_rows;               /* (rows_cap) */
    kv_prompt_block *blocks;      /* (rows_cap) */
    kv_share_group *groups;       /* (rows_cap) */
    int *group_rows;              /* (rows_cap) the groups' rows, each group's in row order */
    int n_lone, n_blocks, n_groups;
    int chunks_per_group;         /* tasks per group (its rows in chunks) */
    float *group_scratch;         /* (threads, group_scratch_floats) a chunk's scores and sums */
    int64_t group_scratch_floats;
    float *block_scores;          /* (threads, 64, T) the blocks' scores, made on first use */
    int64_t scratch_bytes;
    /* Packed copies of the weight matrices: the cache's own, or a store
     * shared across caches (zdp_kv_set_packs). */
    zdp_kv_packs *own_packs, *packs;
    int n_threads;
    bool keys_to_l2;   /* zdp_nn_kv_keys_to_l2 of this cache's rows */
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

/* Query rows of a prompt block (decode.c): at most this many per block. */
#define ZDP_KV_PROMPT_BLOCK 64

#endif /* ZDP_SAMPLE_KV_IMPL_H */
