/*
 * zdp/sample.h -- sampling at serving speed: a key/value cache for
 * incremental decoding of causal LMs (GPT-2, the Llama family), the token
 * choice (temperature, top-k, top-p) and batched generation with
 * per-sequence parameters and continuous batching.
 * Part of the public API; include zdp/zdp.h for all of it.  docs/sampling.md.
 */
#ifndef ZDP_PUBLIC_SAMPLE_H
#define ZDP_PUBLIC_SAMPLE_H

#include "zdp/core.h"
#include "zdp/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the KV cache ---------------------------------------------------------- */

/* Keys and values of every layer for n_slots sequences of up to max_len
 * positions: (L, n_slots, max_len, KV*hd) floats each (the
 * Llama family stores only its KV heads; GPT-2 all C channels).  A slot
 * holds one sequence; zdp_lm_decode appends to it. */
typedef struct zdp_kv_cache zdp_kv_cache;

/* For a model from zdp_gpt_create or zdp_llama_create (ZDP_ERR_INVALID_ARG
 * for another), borrowed: it must outlive the cache.  n_slots >= 1;
 * max_len in 1..block_size, or 0 for block_size (the longest sequence the
 * cache's callers will run: memory goes as n_slots x max_len). */
ZDP_API zdp_status zdp_kv_create(const zdp_model *model, int n_slots, int max_len,
                                 zdp_kv_cache **out, zdp_error *err);
ZDP_API void zdp_kv_destroy(zdp_kv_cache *kv);
/* Bytes the cache holds: keys and values, rotary tables and the scratch
 * its largest call so far needed (for memory reports). */
ZDP_API int64_t zdp_kv_bytes(const zdp_kv_cache *kv);
ZDP_API int zdp_kv_slots(const zdp_kv_cache *kv);
/* Packed copies of a model's weight matrices that several caches share:
 * batched decode steps multiply by them, so one snapshot of the weights is
 * packed once for every request that samples from it, not once per cache.
 * For one model (borrowed); used by one thread at a time. */
typedef struct zdp_kv_packs zdp_kv_packs;
ZDP_API zdp_status zdp_kv_packs_create(const zdp_model *model, zdp_kv_packs **out,
                                       zdp_error *err);
ZDP_API void zdp_kv_packs_destroy(zdp_kv_packs *pk);
/* Bytes of the copies (for memory reports; not in zdp_kv_bytes). */
ZDP_API int64_t zdp_kv_packs_bytes(const zdp_kv_packs *pk);
/* Weight matrices packed so far (each repack counts). */
ZDP_API int64_t zdp_kv_packs_count(const zdp_kv_packs *pk);
/* The cache multiplies by pk's copies (NULL, or a store of another model:
 * its own).  key names the weights the caller will pass: a key other than
 * the one pk's copies were made under drops every copy (repacked on first
 * use), so a caller bumps it whenever the weights may have changed (a
 * generation counter, never a pointer: rewritten weights can sit at the
 * same address). */
ZDP_API void zdp_kv_set_packs(zdp_kv_cache *kv, zdp_kv_packs *pk, uint64_t key);
/* Positions stored in a slot (0 when empty or out of range). */
ZDP_API int zdp_kv_length(const zdp_kv_cache *kv, int slot);
/* Empties a slot for a new sequence (and unbinds its adapter). */
ZDP_API void zdp_kv_clear(zdp_kv_cache *kv, int slot);
/* Slot dst gets a copy of slot src's positions (keys and values of every
 * layer; its adapter binding is dst's own): a prompt prefilled once serves
 * every sequence that starts with it.  Nothing happens for a slot out of
 * range or dst == src. */
ZDP_API void zdp_kv_copy_slot(zdp_kv_cache *kv, int dst, int src);
/* Slot dst starts with slot src's positions read in place, not copied (a
 * request's samples over one prefilled prompt: the prompt is stored once,
 * and a decode pass reads its keys and values once for all the rows that
 * share it, with the same logits bit for bit as zdp_kv_copy_slot's).  src
 * may go on appending: its later positions are its own, as are dst's.
 * Emptying src (zdp_kv_clear) moves the prompt into one of its sharers'
 * storage first.  Where src's positions are not one stored run (src itself
 * shares and has appended), src is already shared at another length, or
 * src has appended past its prompt (the positions of its first pass),
 * this copies instead.  Nothing happens for a slot out of range or dst ==
 * src. */
ZDP_API void zdp_kv_share_slot(zdp_kv_cache *kv, int dst, int src);

/* Binds a LoRA adapter to a slot until zdp_kv_clear empties it: every row
 * of that slot then runs through `lora`'s adapters (a model from
 * zdp_lora_create over this cache's model, or over another with the same
 * shape) with the tensors `adapter` (lora->n_params, borrowed: they must
 * outlive the slot's use), y = W x + (alpha/r) B (A x) at each adapted
 * linear, as the LoRA model's forward.  lora NULL: the base (the default).
 * Slots with different adapters, and none, decode in one pass: the base's
 * products run once over all rows, each adapter's low-rank product over
 * its own rows (one product per run of consecutive rows with the same
 * adapter).  Refused naming the reason: a slot out of range, adapter NULL,
 * a LoRA model for another base shape. */
ZDP_API zdp_status zdp_kv_set_adapter(zdp_kv_cache *kv, int slot, const zdp_model *lora,
                                      const float *const *adapter, zdp_error *err);

/* One batched pass over n rows: row i appends token tokens[i] to slot
 * slots[i] at the slot's next position (rows of the same slot take
 * consecutive positions in row order, so a prompt is prefilled by giving
 * all its tokens at once, and a decode step gives one row per sequence).
 * Each row attends to its slot's positions up to and including its own.
 * logits: (n_want, V) for the rows with want[i] != 0 in row order (want
 * NULL: every row), each the next-token logits after that row's token,
 * equal to a full forward's within fp32 rounding.  Errors (nothing is
 * appended then): a slot out of range, a token outside [0, V), a slot
 * that would pass max_len -- each named with its row. */
ZDP_API zdp_status zdp_lm_decode(zdp_kv_cache *kv, const float *const *params,
                                 const int32_t *slots, const int32_t *tokens, int n,
                                 const uint8_t *want, float *logits, zdp_error *err);

/* ---- choosing a token ------------------------------------------------------ */

typedef struct zdp_sample_params {
    double temperature; /* 0: greedy (argmax) */
    int top_k;          /* 0: all tokens */
    double top_p;       /* 1: all tokens */
} zdp_sample_params;

/* A token from logits (V): greedy at temperature 0; otherwise the softmax
 * at `temperature` over the top-k tokens (ties with the k-th kept), then
 * the smallest most-likely set reaching top_p, drawn with one splitmix64
 * step of *rng.  logprob (or NULL): the chosen token's log-probability at
 * temperature 1 with no top-k/top-p -- what a learner computes for it
 * (from float exps summed in double: within 1e-5 of zdp_logprob_of's).
 * Allocates 2 V floats of scratch per call (zdp_generate keeps its own).
 * Returns -1 only when out of memory. */
ZDP_API int zdp_sample_token(const float *logits, int V, const zdp_sample_params *sp,
                             uint64_t *rng, float *logprob);

/* log p(target) under softmax(logits) (V), temperature 1, in double. */
ZDP_API float zdp_logprob_of(const float *logits, int V, int target);

/* The k (1..V) most likely tokens of logits (V) into ids (k), by logprob
 * descending, ties by the lower id first, and their log-probabilities at
 * temperature 1 (each equal to zdp_logprob_of's) into logprobs (k).
 * Returns ZDP_ERR_INVALID_ARG for k outside 1..V. */
ZDP_API zdp_status zdp_topk_logprobs(const float *logits, int V, int k, int32_t *ids,
                                     float *logprobs);

/* ---- batched generation ---------------------------------------------------- */

/* One sequence to generate.  OUT fields are written by zdp_generate. */
typedef struct zdp_gen_seq {
    const int32_t *prompt;   /* (prompt_len) ids, 1 <= prompt_len */
    int prompt_len;
    int max_tokens;          /* new tokens at most, >= 0 */
    zdp_sample_params sp;
    uint64_t seed;           /* this sequence's own random stream */
    const int32_t *stop_ids; /* (n_stop_ids): a sampled one ends the sequence (it is kept) */
    int n_stop_ids;
    /* Optional: called after each new token with the tokens so far
     * (out[0..n)); nonzero ends the sequence (string stop sequences). */
    int (*stop_fn)(void *user, const int32_t *out, int n);
    void *stop_user;
    /* Optional: a LoRA model over `model` (zdp_lora_create) and its adapter
     * tensors, applied to this sequence alone (zdp_kv_set_adapter); NULL:
     * the base model.  Sequences with different adapters share passes. */
    const zdp_model *lora;
    const float *const *adapter;
    int32_t *out;            /* OUT (max_tokens) the new tokens */
    float *out_logprobs;     /* OUT (max_tokens) their logprobs (temperature 1), or NULL */
    float *prompt_logprobs;  /* OUT (prompt_len) log p(prompt[t] | prompt[<t]), [0] = 0; or NULL */
    int n_out;               /* OUT tokens generated */
    int stopped;             /* OUT 1: a stop id or stop_fn ended it (else max_tokens) */
    /* Top-k prompt logprobs (Tinker's topk_prompt_logprobs), from the
     * prefill: prompt_topk = k in 0..vocab_size (0: none).  Row t of the
     * (prompt_len, k) outputs: the k most likely next tokens after
     * prompt[<t], by logprob descending (ties: the lower id first), and
     * their log-probabilities at temperature 1; row 0 (nothing predicts
     * the first token): ids -1, logprobs NaN. */
    int prompt_topk;
    int32_t *prompt_topk_ids;     /* OUT (prompt_len, prompt_topk), or NULL when prompt_topk = 0 */
    float *prompt_topk_logprobs;  /* OUT (prompt_len, prompt_topk), or NULL when prompt_topk = 0 */
} zdp_gen_seq;

typedef struct zdp_gen_stats {
    int64_t prefill_tokens, decode_tokens; /* rows through the model */
    int64_t prefill_shared; /* prompt rows not run: copied from a sequence of the same pass with the same prompt */
    int64_t passes;                        /* zdp_lm_decode calls */
    int64_t kv_bytes;                      /* the cache's zdp_kv_bytes at the end */
    double seconds;
} zdp_gen_stats;

/* Generates every sequence with up to `batch` of them decoding together
 * (continuous batching: a finished sequence leaves its slot and the next
 * waiting one is prefilled into it in the same pass).  Each result is the
 * same as the sequence generated alone with its seed (up to fp32 rounding of
 * batched matrix products).  kv: a cache with >= batch slots, or NULL (one
 * is made for the call, of the longest prompt_len + max_tokens positions).  Refused before any work, naming seqs[i] and the
 * field: prompt_len outside 1..block_size, prompt_len + max_tokens beyond
 * block_size (the context), a token outside [0, V), prompt_topk outside
 * 0..V or without its outputs, batch < 1, a lora without its adapter or
 * for another base shape.
 * stats may be NULL. */
ZDP_API zdp_status zdp_generate(const zdp_model *model, const float *const *params,
                                zdp_kv_cache *kv, zdp_gen_seq *seqs, int n_seqs, int batch,
                                zdp_gen_stats *stats, zdp_error *err);

#ifdef __cplusplus
}
#endif
#endif /* ZDP_PUBLIC_SAMPLE_H */
