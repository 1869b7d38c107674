/*
 * dataset.c -- zdp_dataset: a token array, its train/val split, and the
 * windows each rank reads for each micro-batch.
 *
 * The contract (zdp/data.h) in one line: with N windows of T+1
 * tokens in a split, rank r of W reads windows ((j*W + r)*b + k) mod N,
 * k < b, for its j-th micro-batch.  It is a pure function of (j, r, W, b, T),
 * so ranks never talk to each other about data, a resumed run only needs j
 * (the cursor), and the val split is read the same way.
 *
 * The split is by tokens (the last floor(n * val_fraction) are val), so it
 * does not move when T changes and train and val never share a token.
 * Not here: shuffling, multiple shards, streaming files larger than memory.
 */
#include "data.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

struct zdp_dataset {
    int32_t *tokens;    /* all n tokens; train = [0, n_train), val = [n_train, n) */
    int64_t n;
    int64_t n_train;
    double val_fraction;
    int32_t max_token;
    int64_t cursor;     /* next train micro-batch index j */
};

/* ---- construction ---------------------------------------------------------- */

/* Takes ownership of tokens (freed on failure too).  n_val < 0: the last
 * floor(n * val_fraction) tokens are val; otherwise the last n_val. */
static zdp_status ds_adopt_(int32_t *tokens, int64_t n, double val_fraction, int64_t n_val,
                            const char *origin, zdp_dataset **out, zdp_error *err) {
    if (!(val_fraction >= 0.0 && val_fraction < 1.0)) {
        free(tokens);
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "%s: val_fraction = %g, expected 0 <= val_fraction < 1 (e.g. 0.1; "
                           "0 for no val split)", origin, val_fraction);
    }
    int32_t max_token = -1;
    for (int64_t i = 0; i < n; i++) {
        if (tokens[i] < 0) {
            zdp_status s = zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                                       "%s: token %" PRId64 " is %" PRId32 "; token ids must "
                                       "be >= 0", origin, i, tokens[i]);
            free(tokens);
            return s;
        }
        if (tokens[i] > max_token) max_token = tokens[i];
    }
    zdp_dataset *ds = calloc(1, sizeof *ds);
    if (ds == NULL) {
        free(tokens);
        return zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory", origin);
    }
    ds->tokens = tokens;
    ds->n = n;
    if (n_val < 0) n_val = (int64_t)((double)n * val_fraction);
    if (n_val > n) n_val = n;
    ds->n_train = n - n_val;
    ds->val_fraction = val_fraction;
    ds->max_token = max_token;
    *out = ds;
    return ZDP_OK;
}

zdp_status zdp_dataset_create(const int32_t *tokens, int64_t n_tokens, double val_fraction,
                              zdp_dataset **out, zdp_error *err) {
    if (out != NULL) *out = NULL;
    if (out == NULL || n_tokens < 0 || (tokens == NULL && n_tokens > 0))
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "zdp_dataset_create: out is NULL, n_tokens (%" PRId64 ") < 0 or "
                           "tokens NULL", n_tokens);
    if ((uint64_t)n_tokens > SIZE_MAX / sizeof(int32_t))
        return zdp_err_set(err, ZDP_ERR_NOMEM, "dataset: %" PRId64 " tokens is too many",
                           n_tokens);
    int32_t *copy = malloc((size_t)(n_tokens > 0 ? n_tokens : 1) * sizeof *copy);
    if (copy == NULL)
        return zdp_err_set(err, ZDP_ERR_NOMEM, "dataset: out of memory for %" PRId64
                           " tokens", n_tokens);
    if (n_tokens > 0) memcpy(copy, tokens, (size_t)n_tokens * sizeof *copy);
    return ds_adopt_(copy, n_tokens, val_fraction, -1, "dataset", out, err);
}

zdp_status zdp_dataset_open(const char *path, zdp_token_format format, double val_fraction,
                            zdp_dataset **out, zdp_error *err) {
    if (out != NULL) *out = NULL;
    if (out == NULL || path == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "zdp_dataset_open: path and out must not be NULL");
    int32_t *tokens;
    int64_t n;
    zdp_status s = zdp_tokens_read(path, format, &tokens, &n, err);
    if (s != ZDP_OK) return s;
    return ds_adopt_(tokens, n, val_fraction, -1, path, out, err);
}

zdp_status zdp_dataset_create_arith(uint64_t seed, int64_t n_lines, int64_t max_operand,
                                    double val_fraction, zdp_dataset **out, zdp_error *err) {
    if (out != NULL) *out = NULL;
    if (out == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_dataset_create_arith: out is NULL");
    int32_t *tokens;
    int64_t n;
    zdp_status s = zdp_corpus_arith(seed, n_lines, max_operand, val_fraction, &tokens, &n, err);
    if (s != ZDP_OK) return s;
    /* Split at the first held-out line, so val is exactly the held-out
     * problems and train never holds one of them. */
    return ds_adopt_(tokens, n, val_fraction,
                     zdp_arith_val_lines(n_lines, val_fraction) * zdp_arith_line_len(max_operand),
                     "arith corpus", out, err);
}

void zdp_dataset_destroy(zdp_dataset *ds) {
    if (ds == NULL) return;
    free(ds->tokens);
    free(ds);
}

/* ---- queries --------------------------------------------------------------- */

int64_t zdp_dataset_n_tokens(const zdp_dataset *ds, zdp_split split) {
    if (ds == NULL) return 0;
    return split == ZDP_SPLIT_TRAIN ? ds->n_train : split == ZDP_SPLIT_VAL ? ds->n - ds->n_train : 0;
}

const int32_t *zdp_dataset_tokens(const zdp_dataset *ds, zdp_split split) {
    if (zdp_dataset_n_tokens(ds, split) == 0) return NULL;
    return split == ZDP_SPLIT_TRAIN ? ds->tokens : ds->tokens + ds->n_train;
}

int32_t zdp_dataset_max_token(const zdp_dataset *ds) {
    return ds == NULL ? -1 : ds->max_token;
}

int64_t zdp_dataset_n_windows(const zdp_dataset *ds, zdp_split split, int T) {
    int64_t m = zdp_dataset_n_tokens(ds, split);
    if (T < 1 || m < (int64_t)T + 1) return 0;
    return (m - 1) / T;
}

/* ---- batches --------------------------------------------------------------- */

zdp_status zdp_dataset_windows(const zdp_dataset *ds, zdp_split split, int64_t first, int b,
                               int T, int32_t *inputs, int32_t *targets, zdp_error *err) {
    if (ds == NULL || inputs == NULL || targets == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "zdp_dataset_windows: ds, inputs and targets must not be NULL");
    if (split != ZDP_SPLIT_TRAIN && split != ZDP_SPLIT_VAL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "dataset: split %d is not ZDP_SPLIT_TRAIN or ZDP_SPLIT_VAL",
                           (int)split);
    if (first < 0 || b < 1 || T < 1 || first > INT64_MAX - b)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "dataset: first window %" PRId64 ", b = %d, T = %d; expected first "
                           ">= 0, b >= 1, T >= 1", first, b, T);
    const char *name = split == ZDP_SPLIT_TRAIN ? "train" : "val";
    int64_t m = zdp_dataset_n_tokens(ds, split);
    int64_t N = zdp_dataset_n_windows(ds, split, T);
    if (N == 0)
        return zdp_err_set(err, ZDP_ERR_CONFIG,
                           "dataset: the %s split has %" PRId64 " tokens (of %" PRId64
                           ", val_fraction %g), fewer than T + 1 = %" PRId64 " for one window; "
                           "use a larger corpus, a smaller T%s", name, m, ds->n,
                           ds->val_fraction, (int64_t)T + 1,
                           split == ZDP_SPLIT_VAL ? " or a larger val_fraction"
                                                  : " or a smaller val_fraction");
    const int32_t *tok = zdp_dataset_tokens(ds, split);
    for (int k = 0; k < b; k++) {
        int64_t w = (first + k) % N;
        const int32_t *src = tok + w * T;
        memcpy(inputs + (int64_t)k * T, src, (size_t)T * sizeof *src);
        memcpy(targets + (int64_t)k * T, src + 1, (size_t)T * sizeof *src);
    }
    return ZDP_OK;
}

zdp_status zdp_dataset_batch(const zdp_dataset *ds, zdp_split split, int64_t j, int rank,
                             int world, int b, int T, int32_t *inputs, int32_t *targets,
                             zdp_error *err) {
    if (world < 1 || rank < 0 || rank >= world || b < 1 || T < 1 || j < 0)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "dataset: micro-batch j = %" PRId64 ", rank = %d, world = %d, b = "
                           "%d, T = %d; expected j >= 0, 0 <= rank < world, b >= 1, T >= 1",
                           j, rank, world, b, T);
    /* First window index (j*W + r)*b; the last one read is (j*W + W)*b - 1. */
    int64_t Wb = (int64_t)world * b;
    if (j > (INT64_MAX - Wb) / Wb)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "dataset: micro-batch j = %" PRId64 " with world = %d, b = %d "
                           "overflows the window index (int64)", j, world, b);
    return zdp_dataset_windows(ds, split, (j * world + rank) * (int64_t)b, b, T, inputs,
                               targets, err);
}

zdp_status zdp_dataset_next(zdp_dataset *ds, int rank, int world, int b, int T,
                            int32_t *inputs, int32_t *targets, zdp_error *err) {
    if (ds == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_dataset_next: ds is NULL");
    zdp_status s = zdp_dataset_batch(ds, ZDP_SPLIT_TRAIN, ds->cursor, rank, world, b, T,
                                     inputs, targets, err);
    if (s == ZDP_OK) ds->cursor++;
    return s;
}

int64_t zdp_dataset_cursor(const zdp_dataset *ds) {
    return ds == NULL ? 0 : ds->cursor;
}

zdp_status zdp_dataset_set_cursor(zdp_dataset *ds, int64_t j, zdp_error *err) {
    if (ds == NULL || j < 0)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "dataset: cursor = %" PRId64 "%s; expected a micro-batch index >= 0",
                           j, ds == NULL ? " on a NULL dataset" : "");
    ds->cursor = j;
    return ZDP_OK;
}
