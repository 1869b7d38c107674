/*
 * encode.c -- text -> ids and ids -> text with a loaded byte-level BPE
 * tokenizer (load.c builds it).
 *
 * What it does: the pipeline of Hugging Face tokenizers as transformers.js
 * (the reference zdp is checked against, docs/models.md "Tokenizers") runs
 * it: added tokens split off first (longest match at the leftmost place),
 * the normalizer (NFC) on each piece between them, the pre-tokenizer steps
 * (regex splits, ByteLevel), then BPE on each pre-token's bytes: merges
 * applied lowest rank first, leftmost first among equal ranks, with a
 * min-heap over the adjacent pairs (O(n log n) per pre-token) and a per-call
 * cache of words already seen.
 * Invalid UTF-8: the reference works on strings and never sees bytes, so zdp
 * decides: each byte that is not part of a well-formed character becomes its
 * own byte token and splits the text around it.  So decode(encode(x)) == x
 * for every x (NFC aside), and on valid UTF-8 the ids are the reference's.
 * What it does not do: add BOS/EOS, post-processors, clean-up of spaces in
 * decode (decode gives the bytes back exactly).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include "core/core.h"
#include "tok_impl.h"

/* ---- growable id vector ----------------------------------------------------- */

typedef struct ids_vec_ {
    int32_t *v;
    size_t n, cap;
    bool oom;
} ids_vec_;

static void push_(ids_vec_ *o, int32_t id) {
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 1024;
        int32_t *g = realloc(o->v, cap * sizeof *g);
        if (g == NULL) {
            o->oom = true;
            return;
        }
        o->v = g;
        o->cap = cap;
    }
    o->v[o->n++] = id;
}

/* ---- the word cache (per call) ---------------------------------------------- */

/* A pre-token seen before gets its ids from here: natural text repeats its
 * words, and BPE is the costly part. */
#define CACHE_BITS_ 16
#define CACHE_MAX_KEY_ 64

typedef struct cache_slot_ {
    uint64_t hash;
    uint32_t key_len, n_ids; /* key_len 0: empty */
    char key[CACHE_MAX_KEY_];
    int32_t *ids;            /* (n_ids) */
} cache_slot_;

/* What one encode call owns: the cache, BPE scratch, PCRE2 match data. */
typedef struct enc_ctx_ {
    const zdp_tokenizer *t;
    ids_vec_ out;
    cache_slot_ *cache;   /* (1 << CACHE_BITS_), lazily allocated */
    size_t cache_used;
    int32_t *sym;         /* (scratch_cap) symbol ids */
    int32_t *nxt, *prv;   /* (scratch_cap) links, -1 at the ends */
    struct heap_ent_ *heap; /* (3 * scratch_cap) */
    size_t scratch_cap;
    pcre2_match_data *md[TOK_MAX_STAGES];
    int re_error; /* a PCRE2 failure other than "no match" (0: none) */
} enc_ctx_;

static void cache_clear_(enc_ctx_ *c) {
    for (size_t i = 0; i < ((size_t)1 << CACHE_BITS_); i++) {
        free(c->cache[i].ids);
        c->cache[i].ids = NULL;
        c->cache[i].key_len = 0;
    }
    c->cache_used = 0;
}

static cache_slot_ *cache_find_(enc_ctx_ *c, const char *s, size_t n, uint64_t h, bool *hit) {
    const size_t mask = ((size_t)1 << CACHE_BITS_) - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        cache_slot_ *e = &c->cache[i];
        if (e->key_len == 0) {
            *hit = false;
            return e;
        }
        if (e->hash == h && e->key_len == n && memcmp(e->key, s, n) == 0) {
            *hit = true;
            return e;
        }
    }
}

/* ---- BPE on one pre-token ----------------------------------------------------- */

typedef struct heap_ent_ {
    int32_t rank, pos;    /* pos: the left symbol's index (its first byte) */
    int32_t left, right;  /* the pair's ids when pushed: stale entries are skipped */
    int32_t merged;
} heap_ent_;

static bool heap_less_(const heap_ent_ *a, const heap_ent_ *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push_(heap_ent_ *h, size_t *n, heap_ent_ e) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less_(&e, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = e;
}

static heap_ent_ heap_pop_(heap_ent_ *h, size_t *n) {
    heap_ent_ top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && heap_less_(&h[c + 1], &h[c])) c++;
        if (!heap_less_(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0) h[i] = last;
    return top;
}

static bool scratch_reserve_(enc_ctx_ *c, size_t n) {
    if (n <= c->scratch_cap) return true;
    size_t cap = n < 256 ? 256 : n * 2;
    int32_t *a = realloc(c->sym, cap * sizeof *a);
    if (a) c->sym = a;
    int32_t *b = realloc(c->nxt, cap * sizeof *b);
    if (b) c->nxt = b;
    int32_t *d = realloc(c->prv, cap * sizeof *d);
    if (d) c->prv = d;
    heap_ent_ *h = realloc(c->heap, 3 * cap * sizeof *h);
    if (h) c->heap = h;
    if (!a || !b || !d || !h) return false;
    c->scratch_cap = cap;
    return true;
}

static void try_pair_(enc_ctx_ *c, size_t *hn, int32_t pos) {
    const int32_t r = c->nxt[pos];
    if (r < 0) return;
    int32_t merged;
    const int32_t rank = tok_merge_find_(c->t, c->sym[pos], c->sym[r], &merged);
    if (rank >= 0)
        heap_push_(c->heap, hn, (heap_ent_){rank, pos, c->sym[pos], c->sym[r], merged});
}

/* Appends the ids of pre-token s[0..n) (raw bytes) to the output. */
static void bpe_(enc_ctx_ *c, const char *s, size_t n) {
    const zdp_tokenizer *t = c->t;
    const unsigned char *u = (const unsigned char *)s;
    if (n == 0) return;
    if (n == 1) {
        push_(&c->out, t->byte_id[u[0]]);
        return;
    }
    if (t->ignore_merges) {
        int32_t id = zdp_tok_vocab_find_(t, s, n);
        if (id >= 0) {
            push_(&c->out, id);
            return;
        }
    }
    cache_slot_ *slot = NULL;
    uint64_t h = 0;
    if (n <= CACHE_MAX_KEY_) {
        if (c->cache == NULL) c->cache = calloc((size_t)1 << CACHE_BITS_, sizeof *c->cache);
        if (c->cache != NULL) {
            if (c->cache_used >= ((size_t)1 << (CACHE_BITS_ - 1))) cache_clear_(c);
            bool hit;
            h = tok_hash_(s, n);
            slot = cache_find_(c, s, n, h, &hit);
            if (hit) {
                for (uint32_t i = 0; i < slot->n_ids; i++) push_(&c->out, slot->ids[i]);
                return;
            }
        }
    }
    if (!scratch_reserve_(c, n)) {
        c->out.oom = true;
        return;
    }
    size_t hn = 0;
    for (size_t i = 0; i < n; i++) {
        c->sym[i] = t->byte_id[u[i]];
        c->prv[i] = (int32_t)i - 1;
        c->nxt[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    for (size_t i = 0; i + 1 < n; i++) try_pair_(c, &hn, (int32_t)i);
    while (hn > 0) {
        heap_ent_ e = heap_pop_(c->heap, &hn);
        const int32_t r = c->nxt[e.pos];
        /* A merged-away symbol has sym -1; a changed neighbour has another id. */
        if (c->sym[e.pos] != e.left || r < 0 || c->sym[r] != e.right) continue;
        c->sym[e.pos] = e.merged;
        c->sym[r] = -1;
        c->nxt[e.pos] = c->nxt[r];
        if (c->nxt[r] >= 0) c->prv[c->nxt[r]] = e.pos;
        if (c->prv[e.pos] >= 0) try_pair_(c, &hn, c->prv[e.pos]);
        try_pair_(c, &hn, e.pos);
    }
    const size_t first = c->out.n;
    for (int32_t i = 0; i >= 0; i = c->nxt[i]) push_(&c->out, c->sym[i]);
    if (slot != NULL && !c->out.oom) {
        const size_t k = c->out.n - first;
        slot->ids = malloc(k * sizeof *slot->ids);
        if (slot->ids == NULL) return;
        memcpy(slot->ids, c->out.v + first, k * sizeof *slot->ids);
        memcpy(slot->key, s, n);
        slot->hash = h;
        slot->key_len = (uint32_t)n;
        slot->n_ids = (uint32_t)k;
        c->cache_used++;
    }
}

/* ---- pre-tokenizer steps -------------------------------------------------------- */

/* Length of the UTF-8 character at s[0] (s is valid UTF-8). */
static size_t char_len_(unsigned char b) { return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4; }

static void stage_(enc_ctx_ *c, int k, const char *s, size_t n);

static void piece_(enc_ctx_ *c, int k, const char *s, size_t n) {
    if (n == 0) return;
    if (k + 1 < c->t->n_stages) stage_(c, k + 1, s, n);
    else bpe_(c, s, n);
}

/* Runs step k of the pre-tokenizer on s[0..n), then the next steps on each piece. */
static void stage_(enc_ctx_ *c, int k, const char *s, size_t n) {
    const tok_stage *st = &c->t->stages[k];
    char *with_space = NULL;
    if (st->add_prefix_space && (n == 0 || s[0] != ' ')) {
        with_space = malloc(n + 1);
        if (with_space == NULL) {
            c->out.oom = true;
            return;
        }
        with_space[0] = ' ';
        memcpy(with_space + 1, s, n);
        s = with_space;
        n++;
    }
    if (st->re == NULL) {
        piece_(c, k, s, n);
        free(with_space);
        return;
    }
    if (c->md[k] == NULL) c->md[k] = pcre2_match_data_create_from_pattern(st->re, NULL);
    if (c->md[k] == NULL) {
        c->out.oom = true;
        free(with_space);
        return;
    }
    size_t at = 0, gap = 0; /* the next search start; the end of the last match */
    while (at < n) {
        int rc = pcre2_match(st->re, (PCRE2_SPTR)s, n, at, PCRE2_NO_UTF_CHECK, c->md[k], NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) { /* a resource limit: never tokenize the rest some other way */
            c->re_error = rc;
            c->out.oom = true;
            break;
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md[k]);
        const size_t m0 = ov[0], m1 = ov[1];
        if (m1 == m0) { /* an empty match is no piece; step one character on, as JS does */
            at = m0 + char_len_((unsigned char)s[m0]);
            continue;
        }
        if (st->mode != TOK_SPLIT_MATCHES && m0 > gap) piece_(c, k, s + gap, m0 - gap);
        if (st->mode != TOK_SPLIT_GAPS) piece_(c, k, s + m0, m1 - m0);
        gap = at = m1;
    }
    if (st->mode != TOK_SPLIT_MATCHES && gap < n) piece_(c, k, s + gap, n - gap);
    free(with_space);
}

/* ---- NFC and sections --------------------------------------------------------- */

char *zdp_tok_nfc_(const char *s, size_t n, size_t *out_n, bool *failed) {
    *failed = false;
    size_t i = 0;
    while (i < n && (unsigned char)s[i] < 0x80) i++;
    if (i == n) return NULL; /* ASCII is NFC */
    UErrorCode e = U_ZERO_ERROR;
    const UNormalizer2 *nfc = unorm2_getNFCInstance(&e);
    int32_t n16 = 0;
    if (U_FAILURE(e) || n > INT32_MAX / 2) goto fail;
    u_strFromUTF8(NULL, 0, &n16, s, (int32_t)n, &e);
    if (e != U_BUFFER_OVERFLOW_ERROR && U_FAILURE(e)) goto fail;
    e = U_ZERO_ERROR;
    UChar *w = malloc(((size_t)n16 + 1) * sizeof *w);
    if (w == NULL) goto fail;
    u_strFromUTF8(w, n16 + 1, NULL, s, (int32_t)n, &e);
    if (U_FAILURE(e) || unorm2_isNormalized(nfc, w, n16, &e) || U_FAILURE(e)) {
        free(w);
        if (U_FAILURE(e)) goto fail;
        return NULL;
    }
    /* NFC grows text at most 3x (Unicode's stated bound). */
    const int32_t cap = 3 * n16 + 16;
    UChar *v = malloc((size_t)cap * sizeof *v);
    char *out = NULL;
    int32_t nv = 0, n8 = 0;
    if (v != NULL) nv = unorm2_normalize(nfc, w, n16, v, cap, &e);
    if (v != NULL && U_SUCCESS(e)) {
        out = malloc((size_t)nv * 3 + 1);
        if (out != NULL) u_strToUTF8(out, nv * 3 + 1, &n8, v, nv, &e);
    }
    free(w);
    free(v);
    if (out == NULL || U_FAILURE(e)) {
        free(out);
        goto fail;
    }
    *out_n = (size_t)n8;
    return out;
fail:
    *failed = true;
    return NULL;
}

/* A text section between added tokens: normalize, then pre-tokenize and BPE. */
static void section_(enc_ctx_ *c, const char *s, size_t n) {
    if (n == 0) return;
    char *norm = NULL;
    if (c->t->nfc) {
        size_t nn;
        bool failed;
        norm = zdp_tok_nfc_(s, n, &nn, &failed);
        if (failed) {
            c->out.oom = true;
            return;
        }
        if (norm != NULL) {
            s = norm;
            n = nn;
        }
    }
    if (c->t->n_stages > 0) stage_(c, 0, s, n);
    else bpe_(c, s, n);
    free(norm);
}

/* JavaScript's String.trim whitespace (the reference strips around added
 * tokens with lstrip/rstrip): its length at s[0], or 0. */
static size_t js_space_at_(const unsigned char *s, size_t n) {
    if (n >= 1 && (s[0] == ' ' || (s[0] >= '\t' && s[0] <= '\r'))) return 1;
    if (n >= 2 && s[0] == 0xC2 && s[1] == 0xA0) return 2;
    if (n < 3) return 0;
    const uint32_t cp = (uint32_t)(s[0] & 0x0F) << 12 | (uint32_t)(s[1] & 0x3F) << 6 | (s[2] & 0x3F);
    if ((s[0] & 0xF0) != 0xE0) return 0;
    if (cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
        cp == 0x202F || cp == 0x205F || cp == 0x3000 || cp == 0xFEFF)
        return 3;
    return 0;
}

static size_t rtrim_(const char *s, size_t n) {
    for (;;) {
        size_t k = 0;
        for (size_t back = 1; back <= 3 && back <= n; back++)
            if (js_space_at_((const unsigned char *)s + n - back, back) == back) {
                k = back;
                break;
            }
        if (k == 0) return n;
        n -= k;
    }
}

/* The longest added token at s[0..n) that flags allow, or NULL. */
static const tok_added *added_at_(const zdp_tokenizer *t, const char *s, size_t n,
                                  unsigned flags) {
    const tok_added *best = NULL;
    for (int i = 0; i < t->n_added; i++) {
        const tok_added *a = &t->added[i];
        if (a->len > n || (best && a->len <= best->len)) continue;
        if (a->special && !(flags & ZDP_TOKENIZE_SPECIAL)) continue;
        if (memcmp(a->text, s, a->len) == 0) best = a;
    }
    return best;
}

/* Valid UTF-8 text: split off the added tokens, encode the sections. */
static void valid_(enc_ctx_ *c, const char *s, size_t n, unsigned flags) {
    const zdp_tokenizer *t = c->t;
    size_t start = 0;
    bool strip_next = false;
    for (size_t i = 0; i < n;) {
        const tok_added *a = NULL;
        if (t->added_first[(unsigned char)s[i]]) a = added_at_(t, s + i, n - i, flags);
        if (a == NULL) {
            i++;
            continue;
        }
        size_t end = i;
        if (strip_next)
            while (start < end && js_space_at_((const unsigned char *)s + start, end - start))
                start += js_space_at_((const unsigned char *)s + start, end - start);
        if (a->lstrip) end = start + rtrim_(s + start, end - start);
        section_(c, s + start, end - start);
        push_(&c->out, a->id);
        i += a->len;
        start = i;
        strip_next = a->rstrip;
    }
    if (strip_next)
        while (start < n && js_space_at_((const unsigned char *)s + start, n - start))
            start += js_space_at_((const unsigned char *)s + start, n - start);
    section_(c, s + start, n - start);
}

/* Length of the well-formed UTF-8 character at s[0..n) (Unicode Table 3-7), or 0. */
static size_t utf8_ok_(const unsigned char *s, size_t n) {
    const unsigned char b = s[0];
    if (b < 0x80) return 1;
    if (b < 0xC2 || b > 0xF4) return 0;
    size_t k = b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
    if (n < k) return 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b == 0xE0) lo = 0xA0;
    else if (b == 0xED) hi = 0x9F;
    else if (b == 0xF0) lo = 0x90;
    else if (b == 0xF4) hi = 0x8F;
    if (s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < k; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    return k;
}

/* ---- public ----------------------------------------------------------------------- */

zdp_status zdp_tokenizer_encode(const zdp_tokenizer *t, const char *text, size_t len,
                                unsigned flags, int32_t **ids, size_t *n_ids, zdp_error *err) {
    if (ids) *ids = NULL;
    if (n_ids) *n_ids = 0;
    if (t == NULL || ids == NULL || n_ids == NULL || (text == NULL && len > 0))
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_tokenizer_encode: NULL argument");
    enc_ctx_ c = {.t = t};
    const unsigned char *u = (const unsigned char *)text;
    size_t start = 0;
    for (size_t i = 0; i < len && !c.out.oom;) {
        size_t k = u[i] < 0x80 ? 1 : utf8_ok_(u + i, len - i);
        if (k > 0) {
            i += k;
            continue;
        }
        valid_(&c, text + start, i - start, flags);
        push_(&c.out, t->byte_id[u[i]]);
        start = ++i;
    }
    if (!c.out.oom) valid_(&c, text + start, len - start, flags);
    if (c.cache != NULL) cache_clear_(&c);
    free(c.cache);
    free(c.sym);
    free(c.nxt);
    free(c.prv);
    free(c.heap);
    for (int k = 0; k < TOK_MAX_STAGES; k++) pcre2_match_data_free(c.md[k]);
    if (c.out.oom) {
        free(c.out.v);
        if (c.re_error != 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(c.re_error, msg, sizeof msg);
            return zdp_err_set(err, ZDP_ERR_INTERNAL, "zdp_tokenizer_encode: the pre-tokenizer "
                               "regex failed on %zu bytes of text: %s (PCRE2 error %d)", len,
                               (const char *)msg, c.re_error);
        }
        return zdp_err_set(err, ZDP_ERR_NOMEM, "zdp_tokenizer_encode: out of memory (%zu bytes "
                           "of text)", len);
    }
    *ids = c.out.v;
    *n_ids = c.out.n;
    return ZDP_OK;
}

zdp_status zdp_tokenizer_encode_file(const zdp_tokenizer *t, const char *path, unsigned flags,
                                     int32_t **ids, size_t *n_ids, zdp_error *err) {
    if (ids) *ids = NULL;
    if (n_ids) *n_ids = 0;
    if (path == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_tokenizer_encode_file: NULL path");
    FILE *f = fopen(path, "rb");
    if (f == NULL) return zdp_err_set(err, ZDP_ERR_IO, "%s: cannot open the text file", path);
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n == cap) {
            cap = cap ? cap * 2 : (size_t)1 << 20;
            char *g = realloc(buf, cap);
            if (g == NULL) {
                free(buf);
                fclose(f);
                return zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory reading it", path);
            }
            buf = g;
        }
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0) break;
    }
    const bool bad = ferror(f) != 0;
    fclose(f);
    if (bad) {
        free(buf);
        return zdp_err_set(err, ZDP_ERR_IO, "%s: read error", path);
    }
    zdp_status s = zdp_tokenizer_encode(t, buf, n, flags, ids, n_ids, err);
    free(buf);
    return s;
}

zdp_status zdp_tokenizer_decode(const zdp_tokenizer *t, const int32_t *ids, size_t n,
                                char **text, size_t *len, zdp_error *err) {
    if (text) *text = NULL;
    if (len) *len = 0;
    if (t == NULL || text == NULL || len == NULL || (ids == NULL && n > 0))
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_tokenizer_decode: NULL argument");
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_vocab || t->tok[ids[i]] == NULL)
            return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                               "token %zu = %d: not a token of this tokenizer (ids are 0..%d "
                               "with holes where the vocabulary has none)",
                               i, ids[i], t->n_vocab - 1);
        total += t->tok_len[ids[i]];
    }
    char *out = malloc(total + 1);
    if (out == NULL)
        return zdp_err_set(err, ZDP_ERR_NOMEM, "zdp_tokenizer_decode: out of memory");
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(out + at, t->tok[ids[i]], t->tok_len[ids[i]]);
        at += t->tok_len[ids[i]];
    }
    out[at] = '\0';
    *text = out;
    *len = at;
    return ZDP_OK;
}
