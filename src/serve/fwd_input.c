/*
 * fwd_input.c -- the arena a decoded forward/forward_backward lives in
 * (fwd_input.h): blocks of 64 KiB or more, each allocation zeroed and
 * aligned, everything freed at once.  A request is decoded, checked and
 * dropped; nothing in it is freed on its own.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fwd_input.h"

struct serve_arena_block {
    serve_arena_block *next;
    size_t used, cap;
    _Alignas(max_align_t) unsigned char data[];
};

void *serve_arena_alloc(serve_arena *a, size_t n) {
    const size_t align = _Alignof(max_align_t);
    if (n > SIZE_MAX / 2) return NULL;
    n = (n + align - 1) / align * align;
    serve_arena_block *b = a->head;
    if (b == NULL || b->cap - b->used < n) {
        /* A new block; a large request gets one of its own. */
        const size_t cap = n > 65536 ? n : 65536;
        if (cap > SIZE_MAX - sizeof *b) return NULL;
        b = malloc(sizeof *b + cap);
        if (b == NULL) return NULL;
        b->used = 0;
        b->cap = cap;
        b->next = a->head;
        a->head = b;
    }
    void *p = b->data + b->used;
    b->used += n;
    memset(p, 0, n);
    return p;
}

void *serve_arena_grow(serve_arena *a, void *p, size_t n, size_t *cap, size_t size) {
    if (n < *cap) return p;
    const size_t want = *cap < 4 ? 4 : 2 * *cap;
    if (want > SIZE_MAX / 2 / size) return NULL;
    void *q = serve_arena_alloc(a, want * size);
    if (q == NULL) return NULL;
    if (n > 0) memcpy(q, p, n * size);
    *cap = want;
    return q;
}

void serve_arena_free(serve_arena *a) {
    for (serve_arena_block *b = a->head, *n; b != NULL; b = n) {
        n = b->next;
        free(b);
    }
    a->head = NULL;
}

void serve_fwd_in_free(serve_fwd_in *in) {
    if (in != NULL) serve_arena_free(&in->arena);
}

