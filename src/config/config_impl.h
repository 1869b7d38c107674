/*
 * config_impl.h -- internal to src/config: what its three files share.
 *
 *   config_keys.c      the declarative key tables, the defaults they hold
 *                      (zdp_config_default) and the rows for the key test
 *   config_parse.c     ds_config.json read against the tables into a
 *                      zdp_config (zdp_config_load_file, _load_string)
 *   config_validate.c  DeepSpeed's batch-size derivation and checks, and
 *                      every rule a whole config must satisfy
 *                      (zdp_config_validate, zdp_config_finalize)
 *
 * Not part of the public API.
 */
#ifndef ZDP_CONFIG_IMPL_H
#define ZDP_CONFIG_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "zdp/config.h"
#include "zdp/core.h"

#define PATH_MAX_ 256 /* JSON paths in messages and key rows; longer ones are cut */
#define COUNT_(a) (sizeof(a) / sizeof((a)[0]))

/* ---- the key tables (config_keys.c) ---------------------------------------- */

typedef enum key_kind {
    KEY_INT,    /* int64_t; a JSON integer or a whole real (5e8), as DeepSpeed coerces */
    KEY_BOOL,   /* bool; JSON true/false only (DeepSpeed would coerce "yes"; zdp does not) */
    KEY_NUMBER, /* double; a JSON integer or real */
    KEY_ANY,    /* a DeepSpeed key accepted silently and ignored */
    KEY_UNUSED, /* a DeepSpeed key zdp does not implement: listed in the warning */
    KEY_CUSTOM, /* handled by the block's own code (sub-blocks, enums, lists) */
} key_kind;

#define NO_FIELD_ ((size_t)-1) /* type-checked, not stored */

/* One row per key, redis's standardConfig: name, type, where it is stored,
 * bounds and default together, so a key is added in one place.  The
 * defaults are stored by zdp_config_default (or, for the scheduler's
 * params, when that block is parsed); test_config_keys checks them and
 * docs/config.md against these rows. */
typedef struct key_spec {
    const char *name;
    key_kind kind;
    size_t offset;    /* into the block's struct, or NO_FIELD_ */
    double def;       /* the default (KEY_BOOL: 0 or 1); NO_DEF_: derived, required or not stored */
    double min, max;  /* inclusive bounds for KEY_INT / KEY_NUMBER */
    const char *hint; /* the fix for a bad value; NULL: a generic one */
} key_spec;

/* Every table with the JSON path of its block: the map that
 * zdp_config_default and zdp_config_key_get walk, and the parser reads
 * each block against. */
typedef struct key_block {
    const char *prefix;     /* JSON path of the block; "" at top level */
    const key_spec *specs;
    size_t n;
    size_t offset;          /* of the block's struct in zdp_config, or NO_FIELD_ */
    bool at_default;        /* zdp_config_default stores the defaults; else the parser does */
} key_block;

/* The blocks, in the order of zdp_config_key_blocks_ (the order
 * zdp_config_key_get numbers the rows in). */
typedef enum key_block_id {
    BLOCK_TOP,
    BLOCK_ZERO,
    BLOCK_OFFLOAD_OPTIMIZER,
    BLOCK_OFFLOAD_PARAM,
    BLOCK_OPTIMIZER,
    BLOCK_ADAM_PARAMS,
    BLOCK_SGD_PARAMS,
    BLOCK_SCHEDULER,
    BLOCK_SCHEDULER_PARAMS,
    BLOCK_COUNT_
} key_block_id;

extern const key_block zdp_config_key_blocks_[BLOCK_COUNT_];

/* Stores the default of every row of block id that has one and a field in
 * base (the block's struct). */
void zdp_config_apply_defaults_(key_block_id id, void *base);
/* dst (PATH_MAX_ bytes) = prefix.key, or key at top level; cut, never
 * overflowed. */
void zdp_config_path_join_(char *dst, const char *prefix, const char *key);

/* ---- the rules (config_validate.c) ------------------------------------------ */

/* Fills the absent batch keys (0) from the present ones exactly as
 * DeepSpeed's _set_batch_related_parameters does (docs/deepspeed.md §1.2),
 * then runs its checks. */
zdp_status zdp_config_derive_batch_(zdp_config *c, zdp_error *err);
/* The error for a zero_optimization.stage outside 0..3. */
zdp_status zdp_config_stage_range_error_(zdp_error *err, long long stage);

#endif /* ZDP_CONFIG_IMPL_H */
