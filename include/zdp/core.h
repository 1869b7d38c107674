/*
 * zdp/core.h -- status codes, zdp_error, ZDP_API, logging, splitmix64,
 * zdp_big_alloc.
 * Part of the public API; include zdp/zdp.h for all of it.
 */
#ifndef ZDP_PUBLIC_CORE_H
#define ZDP_PUBLIC_CORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Marks what libzdp exports.  The library is compiled with hidden
 * visibility, so in libzdp.so (-DBUILD_SHARED_LIBS=ON) a function without
 * ZDP_API cannot be called from outside it. */
#if defined(ZDP_BUILDING_LIBRARY) && defined(__GNUC__)
#define ZDP_API __attribute__((visibility("default")))
#else
#define ZDP_API
#endif

/* The most dimensions a tensor has (zdp_param_info, zdp_tensor). */
#define ZDP_MAX_DIMS 4

#define ZDP_VERSION "0.1.0"

/* ---- status codes and errors ------------------------------------------ */

/* X-macro table: name, value, short description. */
#define ZDP_STATUS_MAP(XX)                                                   \
    XX(OK, 0, "success")                                                     \
    XX(ERR_INVALID_ARG, -1, "invalid argument")                              \
    XX(ERR_CONFIG, -2, "invalid configuration")                              \
    XX(ERR_UNSUPPORTED, -3, "not supported")                                 \
    XX(ERR_STATE, -4, "call not valid in the engine's current state")        \
    XX(ERR_IO, -5, "file input/output error")                                \
    XX(ERR_FORMAT, -6, "malformed file")                                     \
    XX(ERR_NOMEM, -7, "out of memory")                                       \
    XX(ERR_COMM, -8, "communication failure")                                \
    XX(ERR_INTERNAL, -9, "internal error (a bug in zdp)")                    \
    XX(ERR_FATAL, -10, "the ranks can no longer agree: the job must stop")

typedef enum zdp_status {
#define ZDP_STATUS_ENUM_(name, val, desc) ZDP_##name = val,
    ZDP_STATUS_MAP(ZDP_STATUS_ENUM_)
#undef ZDP_STATUS_ENUM_
} zdp_status;

#define ZDP_ERROR_MSG_MAX 1024

typedef struct zdp_error {
    zdp_status code;             /* same value the function returned */
    int rank;                    /* rank that detected it, -1 if unknown */
    char msg[ZDP_ERROR_MSG_MAX]; /* "thing = value: why; fix" */
} zdp_error;

ZDP_API const char *zdp_status_name(zdp_status s); /* "ZDP_ERR_CONFIG" */
ZDP_API const char *zdp_status_str(zdp_status s);  /* "invalid configuration" */

/* Log sink for warnings and information (unknown config keys, the memory
 * report).  Default: stderr, prefixed "[zdp rank R]".  level: 0 info, 1 warn. */
typedef void (*zdp_log_fn)(int level, const char *msg, void *user);
ZDP_API void zdp_set_log(zdp_log_fn fn, void *user);

/* splitmix64 (Steele, Lea, Flood 2014): the small reproducible generator
 * behind zdp's seeded initialisers and generated data.  Adds
 * 0x9E3779B97F4A7C15 to *state, then mixes: the same numbers on every
 * machine, so another program can reproduce zdp's data. */
ZDP_API uint64_t zdp_splitmix64(uint64_t *state);

/* Memory for the large buffers every step streams through (flat
 * parameters, gradients, optimizer state, activations, a KV cache): 64-byte
 * aligned; from 2 MB up, 2 MB aligned and asked for in 2 MB pages
 * (madvise(MADV_HUGEPAGE): Linux's transparent huge pages in their
 * "madvise" mode, Debian's default).  With 4 KB pages a product streaming
 * a 100 MB operand takes a TLB miss every 4 KB and the hardware prefetchers
 * stop at every page end (a KV cache's rows cross a page every few
 * positions).  Under some hypervisors 4 KB pages cost far more: streaming
 * hundreds of MB of weights a pass through them can stall for tens to
 * hundreds of milliseconds at a time (docs/benchmarks-sample.md), so every
 * buffer of model weights that is read pass
 * after pass (the engine's, the server's base and sampler weights, the
 * zdp tool's) comes from here.  A hint only: where it is refused the pages are 4 KB and
 * nothing else changes.  Not zeroed; free() frees it; NULL on failure.
 * Public so that a program holding its own copy of a model's weights (the
 * server, the zdp tool, the benchmarks) can put it on the same pages. */
ZDP_API void *zdp_big_alloc(size_t nbytes);

#ifdef __cplusplus
}
#endif
#endif /* ZDP_PUBLIC_CORE_H */
