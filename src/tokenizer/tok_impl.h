/*
 * tok_impl.h -- internal to src/tokenizer/: the tokenizer struct that
 * load.c builds and encode.c runs, and the hash maps both use.
 */
#ifndef ZDP_TOKENIZER_TOK_IMPL_H
#define ZDP_TOKENIZER_TOK_IMPL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "zdp/tokenizer.h"

/* The most pre-tokenizer steps of a Sequence zdp runs. */
#define TOK_MAX_STAGES 8
/* The most added tokens (Llama 3 has 256, Qwen3 26). */
#define TOK_MAX_ADDED 65536

/* How a Split step turns matches into pieces (tokenizers' SplitDelimiterBehavior). */
typedef enum tok_split_mode {
    TOK_SPLIT_ALL,     /* Isolated: every match and every gap is a piece */
    TOK_SPLIT_GAPS,    /* Removed: the gaps between matches */
    TOK_SPLIT_MATCHES, /* Removed with invert, and ByteLevel's regex: the matches */
} tok_split_mode;

typedef struct tok_stage {
    pcre2_code *re;        /* NULL: the piece passes whole (ByteLevel, use_regex false) */
    tok_split_mode mode;
    bool add_prefix_space; /* ByteLevel: a piece not starting with ' ' gets one */
} tok_stage;

typedef struct tok_added {
    char *text; /* content, UTF-8 */
    size_t len;
    int32_t id;
    bool special, lstrip, rstrip;
} tok_added;

/* bytes -> id, open addressing; keys live in the tokenizer's token table. */
typedef struct tok_bytes_map {
    int32_t *slot; /* (cap) id or -1 */
    uint64_t cap;  /* power of two */
} tok_bytes_map;

/* (left id, right id) -> rank and merged id, open addressing. */
typedef struct tok_merge_slot {
    uint64_t key; /* left << 32 | right; UINT64_MAX = empty */
    int32_t rank, merged;
} tok_merge_slot;

struct zdp_tokenizer {
    int32_t n_vocab;    /* largest id + 1 */
    char **tok;         /* (n_vocab) each id's bytes, as decode writes them; NULL = no such id */
    uint32_t *tok_len;  /* (n_vocab) */
    bool *tok_bpe;      /* (n_vocab) the id is a model.vocab entry (not only an added token) */
    tok_bytes_map vocab; /* model.vocab's bytes -> id */
    tok_merge_slot *merges; /* (merge_cap) */
    uint64_t merge_cap;
    int32_t byte_id[256]; /* the token of each single byte */
    tok_added *added;   /* (n_added) */
    int n_added;
    size_t added_max_len;
    uint8_t added_first[256]; /* a byte an added token starts with */
    tok_stage stages[TOK_MAX_STAGES];
    int n_stages;
    bool nfc;           /* normalizer NFC */
    bool ignore_merges; /* a pre-token that is itself in the vocabulary is not split */
    int32_t bos_id, eos_id;
};

/* FNV-1a over bytes: the bytes map's and the word cache's hash. */
static inline uint64_t tok_hash_(const void *p, size_t n) {
    const unsigned char *s = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static inline uint64_t tok_pair_hash_(uint64_t key) {
    key *= 0x9E3779B97F4A7C15ull;
    return key ^ (key >> 31);
}

/* The id of bytes s[0..n) in model.vocab, or -1. */
int32_t zdp_tok_vocab_find_(const zdp_tokenizer *t, const void *s, size_t n);
/* The merge of ids (a, b): its rank, or -1; *merged gets the result. */
static inline int32_t tok_merge_find_(const zdp_tokenizer *t, int32_t a, int32_t b,
                                      int32_t *merged) {
    const uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    const uint64_t mask = t->merge_cap - 1;
    for (uint64_t i = tok_pair_hash_(key) & mask;; i = (i + 1) & mask) {
        const tok_merge_slot *s = &t->merges[i];
        if (s->key == key) {
            *merged = s->merged;
            return s->rank;
        }
        if (s->key == UINT64_MAX) return -1;
    }
}

/* NFC of valid UTF-8 s[0..n): NULL when s is already NFC (the usual case),
 * else a malloc'ed string in *out_n bytes; *failed on an ICU error. */
char *zdp_tok_nfc_(const char *s, size_t n, size_t *out_n, bool *failed);
/* Compiles a tokenizer.json regex as the reference (transformers.js, a
 * JavaScript RegExp with the "u" flag) reads it; NULL with *why filled. */
pcre2_code *zdp_tok_compile_(const char *pattern, size_t len, bool literal, char *why,
                             size_t why_n);

#endif /* ZDP_TOKENIZER_TOK_IMPL_H */
