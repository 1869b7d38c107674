/*
 * fwd_input.h -- a forward/forward_backward request as decoded, before its
 * content is checked (src/serve/, internal).  The JSON decoder
 * (parse_fwd.c's serve_parse_fwd) and the protobuf decoder
 * (tinker/proto_decode.c) both produce a serve_fwd_in: the request's values
 * as sent, with only the checks of their own format done (a JSON value of the wrong type, an unknown JSON key,
 * protobuf that is not well-formed).  parse_fwd.c's serve_fwd_build alone
 * checks the content and lays out the payload, so every content check is
 * the same for both formats (one set of messages, each naming the JSON
 * path).  Everything lives in one arena, freed by serve_fwd_in_free.  No
 * dependency beyond libc, so the protobuf codec and its fuzz target can use
 * it.
 */
#ifndef ZDP_SERVE_FWD_INPUT_H
#define ZDP_SERVE_FWD_INPUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct serve_arena_block serve_arena_block;
typedef struct serve_arena {
    serve_arena_block *head;
} serve_arena;
/* n zeroed bytes, aligned for any type, that live until serve_arena_free;
 * NULL when out of memory. */
void *serve_arena_alloc(serve_arena *a, size_t n);
/* An array grown by doubling: p holds n elements of size bytes with room
 * for *cap.  Returns p when there is room for one more, else a larger copy
 * (*cap updated; the old copy stays in the arena); NULL when out of memory. */
void *serve_arena_grow(serve_arena *a, void *p, size_t n, size_t *cap, size_t size);
void serve_arena_free(serve_arena *a);

/* The first element of a decoded array that is not of the kind a check
 * wants, and what it is (JSON's type name); at -1 when there is none. */
typedef struct serve_odd {
    int64_t at;
    const char *what;
} serve_odd;

typedef struct serve_chunk_in {
    /* NULL: not given (encoded_text); anything else but "encoded_text" is
     * refused, named by type_label ("\"image\"", or "an integer" for a JSON
     * value that is not a string). */
    const char *type, *type_label;
    int64_t n;
    const int64_t *tokens; /* (n) as sent */
    serve_odd not_int;     /* a JSON token that is not an integer */
} serve_chunk_in;

typedef struct serve_tensor_in {
    const char *name;  /* its loss_fn_inputs key */
    bool absent;       /* JSON null: as not given (but its key must be known) */
    bool tensor_data;  /* sent as TensorData {data, dtype, shape}: its values are NAME.data */
    const char *dtype; /* as sent ("int64", "float32", "bfloat16", ...); NULL: not given */
    bool sparse;       /* a sparse CSR tensor (refused) */
    int n_shape;       /* dimensions of its shape; 0: not given; -1: not a list of integers */
    int64_t shape0;    /* shape[0] when n_shape >= 1 */
    int64_t n;
    const int64_t *ints;  /* (n) integer values (those before not_int.at) */
    const double *reals;  /* (n) every value as a number; NaN stays NaN */
    serve_odd not_int, not_num; /* the first value that is not an integer, not a number */
} serve_tensor_in;

typedef struct serve_datum_in {
    int64_t n_chunks;        /* 0: none given (refused) */
    serve_chunk_in *chunks;  /* (n_chunks) */
    /* -1: loss_fn_inputs missing, -2: not an object (JSON); else how many
     * tensors. */
    int64_t n_inputs;
    serve_tensor_in *inputs; /* (n_inputs) in the order sent */
} serve_datum_in;

typedef struct serve_fwd_in {
    const char *loss_fn;          /* NULL: not given */
    int64_t n_config;             /* loss_fn_config entries */
    const char **config_keys;     /* (n_config) */
    double *config_values;        /* (n_config) as sent (NaN: not a number in JSON) */
    /* NULL, or (n_config): entry i's text when it was sent as text (a JSON
     * string, or loss_fn_config_v2's text arm), else NULL.  No zdp loss takes
     * a text option: the checks refuse one by name and value. */
    const char **config_texts;
    int64_t n;
    serve_datum_in *data;         /* (n) */
    serve_arena arena;            /* owns everything above */
} serve_fwd_in;
void serve_fwd_in_free(serve_fwd_in *in); /* the arena; the struct itself is the caller's */

#endif /* ZDP_SERVE_FWD_INPUT_H */
