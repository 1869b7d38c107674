/*
 * data.h -- internal header of src/data: constants shared by the token
 * readers and the dataset.  The API itself is public (zdp/data.h).
 */
#ifndef ZDP_DATA_H
#define ZDP_DATA_H

#include "../core/core.h"
#include "zdp/data.h"

#define ZDP_SHARD_MAGIC 20240520   /* llm.c token shard, header[0] */
#define ZDP_SHARD_VERSION 1        /* header[1]: uint16 tokens */

/* The arithmetic corpus (zdp/data.h, zdp_corpus_arith): tokens per line for
 * operands up to max_operand, and how many of n_lines lines (the last ones)
 * hold the held-out problems.  The dataset splits at exactly that line. */
static inline int64_t zdp_arith_line_len(int64_t max_operand) {
    int d = 1;
    for (int64_t v = max_operand; v >= 10; v /= 10) d++;
    return 3 * (int64_t)d + 4;
}
static inline int64_t zdp_arith_val_lines(int64_t n_lines, double val_fraction) {
    return (int64_t)((double)n_lines * val_fraction);
}

#endif /* ZDP_DATA_H */
