/*
 * bytes.h -- the server's one growable byte buffer: request payloads
 * (parse.c, parse_fwd.c), request bodies (http.c) and protobuf output
 * (tinker/proto_encode.c).  Depends on nothing but libc, so the protobuf
 * codec stays jansson-only.
 */
#ifndef ZDP_SERVE_BYTES_H
#define ZDP_SERVE_BYTES_H

#include <stdbool.h>
#include <stddef.h>

/* Start from {0}; free(p) when done.  p holds len bytes, room for cap. */
typedef struct serve_bytes {
    unsigned char *p;
    size_t len, cap;
} serve_bytes;

/* Appends n bytes (the capacity doubles); false when out of memory, and b
 * is unchanged. */
bool serve_put(serve_bytes *b, const void *src, size_t n);
/* Makes room for exactly cap bytes in all when there is less (a body of
 * known length gets its size at once); false when out of memory. */
bool serve_reserve(serve_bytes *b, size_t cap);
/* Frees the bytes; b is {0} again. */
void serve_bytes_free(serve_bytes *b);

#endif /* ZDP_SERVE_BYTES_H */
