/*
 * data.h -- internal header of src/data: constants shared by the token
 * readers and the dataset.  The API itself is public (zdp.h, "token data").
 */
#ifndef ZDP_DATA_H
#define ZDP_DATA_H

#include "../core/core.h"

#define ZDP_SHARD_MAGIC 20240520   /* llm.c token shard, header[0] */
#define ZDP_SHARD_VERSION 1        /* header[1]: uint16 tokens */

#endif /* ZDP_DATA_H */
