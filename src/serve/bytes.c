/*
 * bytes.c -- the growable byte buffer (bytes.h).
 */
#include "bytes.h"

#include <stdlib.h>
#include <string.h>

bool serve_reserve(serve_bytes *b, size_t cap) {
    if (cap <= b->cap) return true;
    unsigned char *p = realloc(b->p, cap);
    if (p == NULL) return false;
    b->p = p;
    b->cap = cap;
    return true;
}

bool serve_put(serve_bytes *b, const void *src, size_t n) {
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n) cap *= 2;
        if (!serve_reserve(b, cap)) return false;
    }
    if (n > 0) memcpy(b->p + b->len, src, n);
    b->len += n;
    return true;
}

void serve_bytes_free(serve_bytes *b) {
    free(b->p);
    *b = (serve_bytes){0};
}
