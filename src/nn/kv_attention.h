/*
 * kv_attention.h -- internal: causal attention of a pass's rows against a
 * key/value cache (kv_attention.c), the kernels of the incremental forward
 * that src/sample/decode.c drives.
 *
 * The cache's layout is src/sample's: per layer, (n_slots, T, KV*hd) keys
 * and as many values; a row is one (slot, position) whose key and value are
 * already stored.  Three kinds of work, each with the same operations in the
 * same order whatever the path (AVX-512, AVX2+FMA or portable C, chosen by
 * zdp_nn_packed_path()), the batch or the thread count, so a row's output
 * has the same bits however it is attended:
 *   - one row alone over its slot's positions (zdp_nn_kv_attend_row);
 *   - the rows of slots sharing one stored prompt, which read the prompt's
 *     keys and values once for all of them (zdp_nn_kv_attend_shared_prompt);
 *   - a block of a prompt's consecutive rows on one slot, as two products
 *     per head (zdp_nn_kv_attend_prompt_block).
 */
#ifndef ZDP_NN_KV_ATTENTION_H
#define ZDP_NN_KV_ATTENTION_H

#include <stdbool.h>
#include <stdint.h>

/* One layer of the cache. */
typedef struct zdp_nn_kv_layer {
    const float *k, *v; /* (n_slots, T, KV*hd) this layer's cached keys and values */
    int64_t T;          /* positions per slot */
    int NH, KV, hd;     /* query heads, key/value heads (NH a multiple), head dimension */
    /* Prefetch the next block of keys to L2, not L1: two blocks of 16 key
     * rows do not fit in this core's L1 (zdp_nn_kv_keys_to_l2). */
    bool keys_to_l2;
} zdp_nn_kv_layer;

/* A pass's rows as attention sees them. */
typedef struct zdp_nn_kv_rows {
    const float *q;        /* (rows, q_stride) queries, NH*hd used per row */
    int64_t q_stride;
    float *out;            /* (rows, NH*hd) the attention output, overwritten */
    const int32_t *slots;  /* (rows) each row's slot */
    const int *pos;        /* (rows) each row's position in its slot */
} zdp_nn_kv_rows;

/* Whether a block of 16 cached key rows of KD floats, twice, overflows this
 * core's L1 data cache (keys_to_l2 above). */
bool zdp_nn_kv_keys_to_l2(int64_t KD);

/* Row i over positions 0..pos[i] of its slot: out = softmax(q K^T /
 * sqrt(hd)) V, query head h on KV head h / (NH/KV).  prompt_len: the slot's
 * prompt length; a row past it weighs the prompt's values and its own as
 * two sums, added (the bits zdp_nn_kv_attend_shared_prompt gives).
 * scratch: (NH * T + NH * hd) floats. */
void zdp_nn_kv_attend_row(const zdp_nn_kv_layer *c, const zdp_nn_kv_rows *r, int64_t i,
                          int prompt_len, float *scratch);

/* Rows rows[0..nr) whose slots read their first prompt_len positions from
 * slot prompt_slot's storage (the prompt slot's own rows and its sharers'),
 * every head: each row gets zdp_nn_kv_attend_row's bits, while the prompt's
 * keys and values are read once for all of them.  scratch: (nr, NH, T +
 * hd) floats. */
void zdp_nn_kv_attend_shared_prompt(const zdp_nn_kv_layer *c, const zdp_nn_kv_rows *r,
                                    const int *rows, int nr, int prompt_slot, int prompt_len,
                                    float *scratch);

/* Query head h of rows i0 .. i0+n_rows, one slot's consecutive positions
 * pos[i0] .. (a prompt's prefill), against the slot's positions up to each
 * row's own: S = Q K^T / sqrt(hd), each row's softmax, out = S V, as two
 * products.  scores: (n_rows, pos[i0] + n_rows) floats. */
void zdp_nn_kv_attend_prompt_block(const zdp_nn_kv_layer *c, const zdp_nn_kv_rows *r, int64_t i0,
                                   int64_t n_rows, int64_t h, float *scores);

#endif /* ZDP_NN_KV_ATTENTION_H */
