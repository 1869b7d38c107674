/*
 * config.h -- internal to src/config: the key table, row by row, for the
 * test that checks zdp_config_default and docs/config.md against it
 * (tests/unit/test_config_keys.c).  Not part of the public API.
 */
#ifndef ZDP_CONFIG_INTERNAL_H
#define ZDP_CONFIG_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "zdp/core.h"

/* One row of the ds_config key table. */
typedef struct zdp_config_key_info {
    char path[256];        /* the full JSON path, "zero_optimization.reduce_bucket_size" */
    const char *kind;      /* "int", "bool", "number", "any", "unused" or "custom" */
    double def;            /* the default (bool: 0 or 1); NAN: none in the row */
    size_t config_offset;  /* of the field in zdp_config; (size_t)-1: not stored */
    bool at_default;       /* true: zdp_config_default stores def; false: the block's parser */
} zdp_config_key_info;

/* The number of rows, over every block's table. */
ZDP_API size_t zdp_config_key_count(void);
/* Row `index` (0 <= index < zdp_config_key_count()) into *out; false past the end. */
ZDP_API bool zdp_config_key_get(size_t index, zdp_config_key_info *out);

#endif
