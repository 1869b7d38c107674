/*
 * proto_decode.c -- the reading half of the hand-written protobuf
 * codec (tinker/proto.h): a ForwardBackwardRequest into the typed request
 * the JSON path also produces (serve_fwd_in).  No protobuf library: a
 * tag/varint reader that checks every length against the bytes left (it
 * never reads past the buffer).  The field numbers are in proto.h.
 */
#define _POSIX_C_SOURCE 200809L
#include "tinker/proto.h"
#include "bytes.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SHAPE 64 /* dimensions of one tensor's shape */

typedef struct ctx {
    const unsigned char *base; /* the whole body: byte offsets in messages */
    char *err;
    size_t errcap;
    serve_arena *arena; /* where the decoded request goes */
} ctx;

static bool fail_(ctx *c, const char *path, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool fail_(ctx *c, const char *path, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* The first error is the one reported (an "out of memory" from a caller
     * that got NULL back does not replace the reason). */
    if (c->errcap > 0 && c->err[0] == '\0') snprintf(c->err, c->errcap, "%s%s%s", path, path[0] ? ": " : "", msg);
    return false;
}

/* snprintf for paths: a long path is cut (they are labels only). */
static void pathf_(char *out, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void pathf_(char *out, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out, cap, fmt, ap);
    va_end(ap);
}

static const char *wire_name_(int w) {
    switch (w) {
    case WT_VARINT: return "varint";
    case WT_I64: return "64-bit";
    case WT_LEN: return "length-delimited";
    case WT_SGROUP: return "start-group";
    case WT_EGROUP: return "end-group";
    case WT_I32: return "32-bit";
    default: return "invalid";
    }
}

/* ---- reading -------------------------------------------------------------------------- */

/* 0, or -1: runs past the end, -2: longer than 64 bits. */
static int varint_(const unsigned char **pp, const unsigned char *end, uint64_t *out) {
    const unsigned char *p = *pp;
    uint64_t v = 0;
    for (int i = 0; i < 10; i++) {
        if (p >= end) return -1;
        const unsigned b = *p++;
        if (i == 9 && b > 1) return -2;
        v |= (uint64_t)(b & 0x7f) << (7 * i);
        if (!(b & 0x80)) {
            *pp = p;
            *out = v;
            return 0;
        }
    }
    return -2;
}

/* One field of a message. */
typedef struct field {
    uint32_t num;
    int wire;
    uint64_t v;                 /* varint, or the raw bits of an I64/I32 */
    const unsigned char *data;  /* WT_LEN */
    size_t len;
    char path[400];             /* "msgpath.name" (or "msgpath.<field N>") */
} field;

/* A message's bytes and the names of its fields (names[k] for field k). */
typedef struct msg {
    const unsigned char *p, *end;
    const char *path;
    const char *const *names;
    int n_names;
} msg;

static void field_path_(const msg *m, field *f) {
    const char *name = f->num < (uint32_t)m->n_names ? m->names[f->num] : NULL;
    const char *dot = m->path[0] ? "." : "";
    if (name != NULL) pathf_(f->path, sizeof f->path, "%s%s%s", m->path, dot, name);
    else pathf_(f->path, sizeof f->path, "%s%s<field %u>", m->path, dot, (unsigned)f->num);
}

/* The next field of m: 1, 0 at the end, -1 on malformed input (err set). */
static int next_(ctx *c, msg *m, field *f) {
    if (m->p >= m->end) return 0;
    const size_t at = (size_t)(m->p - c->base);
    uint64_t key;
    int rc = varint_(&m->p, m->end, &key);
    if (rc != 0)
        return fail_(c, m->path[0] ? m->path : "ForwardBackwardRequest", "%s field tag at byte %zu",
                     rc == -1 ? "truncated varint in the" : "a varint longer than 64 bits as the", at),
               -1;
    f->num = (uint32_t)(key >> 3);
    f->wire = (int)(key & 7);
    if ((key >> 3) == 0 || (key >> 3) > 536870911u)
        return fail_(c, m->path[0] ? m->path : "ForwardBackwardRequest", "invalid field number %llu at byte %zu",
                     (unsigned long long)(key >> 3), at),
               -1;
    field_path_(m, f);
    const size_t left = (size_t)(m->end - m->p);
    switch (f->wire) {
    case WT_VARINT:
        rc = varint_(&m->p, m->end, &f->v);
        if (rc != 0)
            return fail_(c, f->path, "%s (field %u at byte %zu)",
                         rc == -1 ? "truncated varint" : "varint longer than 64 bits", (unsigned)f->num, at),
                   -1;
        return 1;
    case WT_I64:
    case WT_I32: {
        const size_t n = f->wire == WT_I64 ? 8 : 4;
        if (left < n)
            return fail_(c, f->path, "a %zu-byte value with %zu bytes left in the message (field %u at byte %zu)",
                         n, left, (unsigned)f->num, at),
                   -1;
        f->v = 0;
        for (size_t k = 0; k < n; k++) f->v |= (uint64_t)m->p[k] << (8 * k);
        m->p += n;
        return 1;
    }
    case WT_LEN: {
        uint64_t n;
        rc = varint_(&m->p, m->end, &n);
        if (rc != 0)
            return fail_(c, f->path, "%s length (field %u at byte %zu)",
                         rc == -1 ? "truncated varint as the" : "a varint longer than 64 bits as the",
                         (unsigned)f->num, at),
                   -1;
        const size_t rest = (size_t)(m->end - m->p);
        if (n > rest)
            return fail_(c, f->path, "length %llu runs past the end of the message (%zu bytes left; field %u "
                         "at byte %zu)", (unsigned long long)n, rest, (unsigned)f->num, at),
                   -1;
        f->data = m->p;
        f->len = (size_t)n;
        m->p += n;
        return 1;
    }
    default:
        return fail_(c, f->path, "wire type %d (%s) at byte %zu is not used by tinker_public.proto", f->wire,
                     wire_name_(f->wire), at),
               -1;
    }
}

static bool want_(ctx *c, const field *f, int wire) {
    if (f->wire == wire) return true;
    return fail_(c, f->path, "wire type %d (%s), expected %d (%s)", f->wire, wire_name_(f->wire), wire,
                 wire_name_(wire));
}

/* Valid UTF-8 without NUL (what a JSON string from the SDK can hold). */
static bool utf8_ok_(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        const unsigned b = s[i];
        size_t k;
        uint32_t cp;
        if (b == 0) return false;
        if (b < 0x80) {
            i++;
            continue;
        } else if ((b & 0xe0) == 0xc0) {
            k = 1;
            cp = b & 0x1f;
        } else if ((b & 0xf0) == 0xe0) {
            k = 2;
            cp = b & 0x0f;
        } else if ((b & 0xf8) == 0xf0) {
            k = 3;
            cp = b & 0x07;
        } else {
            return false;
        }
        if (n - i <= k) return false;
        for (size_t j = 1; j <= k; j++) {
            if ((s[i + j] & 0xc0) != 0x80) return false;
            cp = (cp << 6) | (s[i + j] & 0x3f);
        }
        if ((k == 1 && cp < 0x80) || (k == 2 && cp < 0x800) || (k == 3 && cp < 0x10000) || cp > 0x10ffff ||
            (cp >= 0xd800 && cp <= 0xdfff))
            return false;
        i += k + 1;
    }
    return true;
}

/* A string field as a C string in the arena (NULL with err set if not
 * UTF-8 without NUL, or out of memory). */
static const char *string_(ctx *c, const field *f) {
    if (!want_(c, f, WT_LEN)) return NULL;
    if (!utf8_ok_(f->data, f->len)) {
        fail_(c, f->path, "not a UTF-8 string without NUL bytes (%zu bytes)", f->len);
        return NULL;
    }
    char *s = serve_arena_alloc(c->arena, f->len + 1);
    if (s == NULL) return fail_(c, f->path, "out of memory"), NULL;
    memcpy(s, f->data, f->len);
    return s;
}

/* A printable rendition of a map key for paths in messages (ASCII only, so
 * that a message cut anywhere stays valid UTF-8). */
static void key_label_(const char *s, char *out, size_t cap) {
    const size_t n = strlen(s);
    size_t k = 0;
    for (size_t i = 0; i < n && k + 4 < cap; i++) {
        const unsigned char ch = (unsigned char)s[i];
        out[k++] = ch >= 0x20 && ch < 0x7f ? (char)ch : '?';
    }
    if (n > 0 && k + 4 >= cap) {
        out[k++] = '.';
        out[k++] = '.';
        out[k++] = '.';
    }
    out[k] = '\0';
}

/* A map entry {1 key string, 2 value}: the key (checked; "" when absent)
 * and the value field (value->len 0 / value->wire -1 when absent). */
static bool map_entry_(ctx *c, const field *entry, const char **key, field *value) {
    static const char *const names[] = {NULL, "key", "value"};
    msg m = {entry->data, entry->data + entry->len, entry->path, names, 3};
    field f;
    int rc;
    *key = "";
    value->wire = -1;
    value->len = 0;
    value->data = NULL;
    value->v = 0;
    while ((rc = next_(c, &m, &f)) == 1) {
        if (f.num == 1) {
            if ((*key = string_(c, &f)) == NULL) return false;
        } else if (f.num == 2) {
            *value = f;
        }
    }
    return rc >= 0;
}

static uint32_t le32_(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64_(const unsigned char *p) { return (uint64_t)le32_(p) | (uint64_t)le32_(p + 4) << 32; }

/* Tensor -> t: its dtype's name, shape and values (ints and reals, NaN
 * kept); a sparse one is marked, which the checks refuse. */
static bool tensor_(ctx *c, const field *tf, const char *path, serve_tensor_in *t) {
    static const char *const names[] = {NULL, "dense", "sparse_csr", "dtype", "shape"};
    msg m = {tf->data, tf->data + tf->len, path, names, 5};
    field f, dense = {0};
    bool sparse = false, have_dense = false;
    uint64_t dtype = 0;
    int64_t shape0 = 0;
    int n_shape = 0;
    int rc;
    while ((rc = next_(c, &m, &f)) == 1) {
        if (f.num == 1) {
            if (!want_(c, &f, WT_LEN)) return false;
            dense = f;
            have_dense = true;
            sparse = false;
        } else if (f.num == 2) {
            if (!want_(c, &f, WT_LEN)) return false;
            sparse = true;
            have_dense = false;
        } else if (f.num == 3) {
            if (!want_(c, &f, WT_VARINT)) return false;
            dtype = f.v;
        } else if (f.num == 4) {
            if (f.wire == WT_VARINT) {
                if (n_shape == MAX_SHAPE) return fail_(c, f.path, "more than %d dimensions", MAX_SHAPE);
                if (n_shape++ == 0) shape0 = (int64_t)f.v;
            } else if (f.wire == WT_LEN) { /* packed */
                const unsigned char *p = f.data, *end = f.data + f.len;
                while (p < end) {
                    uint64_t v;
                    int vr = varint_(&p, end, &v);
                    if (vr != 0)
                        return fail_(c, f.path, "%s in the packed values",
                                     vr == -1 ? "truncated varint" : "varint longer than 64 bits");
                    if (n_shape == MAX_SHAPE) return fail_(c, f.path, "more than %d dimensions", MAX_SHAPE);
                    if (n_shape++ == 0) shape0 = (int64_t)v;
                }
            } else {
                return fail_(c, f.path, "wire type %d (%s), expected a varint or packed varints", f.wire,
                             wire_name_(f.wire));
            }
        }
    }
    if (rc < 0) return false;

    /* dtype: its name and the width of one dense element (0: unknown). */
    static const char *const dt_names[] = {"unspecified", "float32", "int64", "int32", "bfloat16"};
    static const size_t widths[] = {0, 4, 8, 4, 2};
    size_t width = 0;
    if (dtype < 5) {
        t->dtype = dt_names[dtype];
        width = widths[dtype];
    } else {
        char label[32];
        snprintf(label, sizeof label, "DType %llu", (unsigned long long)dtype);
        char *l = serve_arena_alloc(c->arena, strlen(label) + 1);
        if (l == NULL) return fail_(c, path, "out of memory");
        memcpy(l, label, strlen(label) + 1);
        t->dtype = l;
    }
    t->tensor_data = true;
    t->n_shape = n_shape;
    t->shape0 = shape0;
    t->sparse = sparse;
    t->not_int = t->not_num = (serve_odd){-1, NULL};
    if (sparse || !have_dense || width == 0) return true; /* no values */
    char dpath[440];
    pathf_(dpath, sizeof dpath, "%s.dense", path);
    if (dense.len % width != 0)
        return fail_(c, dpath, "%zu bytes is not a whole number of %zu-byte %s values", dense.len, width, t->dtype);
    const size_t n = dense.len / width;
    int64_t *iv = serve_arena_alloc(c->arena, (n + 1) * sizeof *iv);
    double *rv = serve_arena_alloc(c->arena, (n + 1) * sizeof *rv);
    if (iv == NULL || rv == NULL) return fail_(c, dpath, "out of memory");
    const unsigned char *p = dense.data;
    for (size_t i = 0; i < n; i++, p += width) {
        if (dtype == 2) {
            iv[i] = (int64_t)le64_(p);
            rv[i] = (double)iv[i];
        } else if (dtype == 3) {
            iv[i] = (int32_t)le32_(p);
            rv[i] = (double)iv[i];
        } else {
            /* float32, or bfloat16: the upper half of a float32 */
            uint32_t u = dtype == 1 ? le32_(p) : ((uint32_t)p[0] | (uint32_t)p[1] << 8) << 16;
            float x;
            memcpy(&x, &u, sizeof x);
            rv[i] = x;
        }
    }
    /* Floating-point values are numbers but not token ids (as JSON reals). */
    if ((dtype == 1 || dtype == 4) && n > 0) t->not_int = (serve_odd){0, "a number"};
    t->n = (int64_t)n;
    t->ints = iv;
    t->reals = rv;
    return true;
}

/* Chunk -> k: encoded_text with its tokens, or the kind of another chunk
 * (image, dmel, none), which the checks refuse by name. */
static bool chunk_(ctx *c, const field *cf, const char *path, serve_chunk_in *k) {
    static const char *const names[] = {NULL, "encoded_text", "image", "dmel"};
    msg m = {cf->data, cf->data + cf->len, path, names, 4};
    field f, text = {0};
    int kind = 0, rc;
    while ((rc = next_(c, &m, &f)) == 1) {
        if (f.num >= 1 && f.num <= 3) {
            if (!want_(c, &f, WT_LEN)) return false;
            kind = (int)f.num;
            if (kind == 1) text = f;
        }
    }
    if (rc < 0) return false;
    k->not_int = (serve_odd){-1, NULL};
    if (kind != 1) {
        static const char *const types[] = {"none (an empty Chunk)", NULL, "image", "dmel"};
        static const char *const labels[] = {"\"none (an empty Chunk)\"", NULL, "\"image\"", "\"dmel\""};
        k->type = types[kind];
        k->type_label = labels[kind];
        return true;
    }
    k->type = "encoded_text";
    /* EncodedTextChunk {1 tokens: int32 LE bytes} */
    static const char *const tnames[] = {NULL, "tokens"};
    msg tm = {text.data, text.data + text.len, text.path, tnames, 2};
    field tokens = {0};
    bool have = false;
    while ((rc = next_(c, &tm, &f)) == 1) {
        if (f.num == 1) {
            if (!want_(c, &f, WT_LEN)) return false;
            tokens = f;
            have = true;
        }
    }
    if (rc < 0) return false;
    if (have && tokens.len % 4 != 0)
        return fail_(c, tokens.path, "%zu bytes is not a whole number of int32 tokens", tokens.len);
    const size_t n = have ? tokens.len / 4 : 0;
    int64_t *tv = serve_arena_alloc(c->arena, (n + 1) * sizeof *tv);
    if (tv == NULL) return fail_(c, path, "out of memory");
    for (size_t i = 0; i < n; i++) tv[i] = (int32_t)le32_(tokens.data + 4 * i);
    k->n = (int64_t)n;
    k->tokens = tv;
    return true;
}

/* Datum -> d: its chunks and its loss_fn_inputs (a key sent twice: the
 * last value, as protobuf's maps). */
static bool datum_(ctx *c, const field *df, const char *path, serve_datum_in *d) {
    static const char *const names[] = {NULL, "model_input", "loss_fn_inputs"};
    msg m = {df->data, df->data + df->len, path, names, 3};
    size_t chunk_cap = 0, input_cap = 0;
    field f;
    int rc;
    while ((rc = next_(c, &m, &f)) == 1) {
        if (f.num == 1) {
            char cpath[440];
            pathf_(cpath, sizeof cpath, "%s.model_input[%lld]", path, (long long)d->n_chunks);
            if (!want_(c, &f, WT_LEN)) return false;
            serve_chunk_in *grown = serve_arena_grow(c->arena, d->chunks, (size_t)d->n_chunks, &chunk_cap,
                                                     sizeof *grown);
            if (grown == NULL) return fail_(c, cpath, "out of memory");
            d->chunks = grown;
            serve_chunk_in *k = &d->chunks[d->n_chunks++];
            memset(k, 0, sizeof *k);
            if (!chunk_(c, &f, cpath, k)) return false;
        } else if (f.num == 2) {
            const char *key;
            field value;
            if (!want_(c, &f, WT_LEN) || !map_entry_(c, &f, &key, &value)) return false;
            char label[80], tpath[440];
            key_label_(key, label, sizeof label);
            pathf_(tpath, sizeof tpath, "%s.loss_fn_inputs.%s", path, label);
            field empty = {0};
            if (value.wire == -1) {
                empty.data = (const unsigned char *)"";
                value = empty;
                value.wire = WT_LEN;
            }
            if (value.wire != WT_LEN) {
                pathf_(value.path, sizeof value.path, "%s", tpath);
                return want_(c, &value, WT_LEN);
            }
            serve_tensor_in *grown = serve_arena_grow(c->arena, d->inputs, (size_t)d->n_inputs, &input_cap,
                                                      sizeof *grown);
            if (grown == NULL) return fail_(c, tpath, "out of memory");
            d->inputs = grown;
            serve_tensor_in *t = &d->inputs[d->n_inputs++];
            memset(t, 0, sizeof *t);
            t->name = key;
            if (!tensor_(c, &value, tpath, t)) return false;
        }
        /* 3 model_input_spans, 4 loss_fn_input_spans (provenance of the
         * tokens, sent by newer SDKs) are skipped like any unknown field:
         * they describe where tokens came from and change no result. */
    }
    return rc >= 0;
}

/* loss_fn_config (5) or loss_fn_config_v2 (7), gathered apart: v2 replaces
 * the legacy map when the request has any v2 entry (the SDK writes floats to
 * both and text only to v2; its proto says servers prefer v2). */
typedef struct config_list {
    const char **keys;
    double *values;
    const char **texts; /* v2 only: the text arm, else NULL */
    int64_t n;
    size_t key_cap, value_cap, text_cap;
} config_list;

/* One map entry of either map into l.  v2: the value is a LossConfigValue
 * {oneof value {1 number double, 2 text string}}; an entry with neither arm
 * is NaN, refused by the checks as not a number. */
static bool config_entry_(ctx *c, const field *f, bool v2, config_list *l) {
    static const char *const value_names[] = {NULL, "number", "text"};
    const char *key;
    field value;
    if (!want_(c, f, WT_LEN) || !map_entry_(c, f, &key, &value)) return false;
    char label[80], vpath[160];
    key_label_(key, label, sizeof label);
    pathf_(vpath, sizeof vpath, "%s.%s", v2 ? "loss_fn_config_v2" : "loss_fn_config", label);
    double x = v2 ? NAN : 0.0;
    const char *text = NULL;
    if (value.wire != -1) {
        pathf_(value.path, sizeof value.path, "%s", vpath);
        if (!v2) {
            if (!want_(c, &value, WT_I64)) return false;
            memcpy(&x, &value.v, sizeof x);
        } else {
            if (!want_(c, &value, WT_LEN)) return false;
            msg m = {value.data, value.data + value.len, vpath, value_names, 3};
            field g;
            int rc;
            while ((rc = next_(c, &m, &g)) == 1) {
                if (g.num == 1) { /* oneof: the last arm sent wins */
                    if (!want_(c, &g, WT_I64)) return false;
                    memcpy(&x, &g.v, sizeof x);
                    text = NULL;
                } else if (g.num == 2) {
                    if ((text = string_(c, &g)) == NULL) return false;
                    x = NAN;
                }
            }
            if (rc < 0) return false;
        }
    }
    /* A key sent twice: the last value, in the first one's place. */
    int64_t at = 0;
    while (at < l->n && strcmp(l->keys[at], key) != 0) at++;
    if (at == l->n) {
        const char **keys = serve_arena_grow(c->arena, l->keys, (size_t)at, &l->key_cap, sizeof *keys);
        if (keys != NULL) l->keys = keys;
        double *values = serve_arena_grow(c->arena, l->values, (size_t)at, &l->value_cap, sizeof *values);
        if (values != NULL) l->values = values;
        const char **texts = serve_arena_grow(c->arena, l->texts, (size_t)at, &l->text_cap, sizeof *texts);
        if (texts != NULL) l->texts = texts;
        if (keys == NULL || values == NULL || texts == NULL) return fail_(c, vpath, "out of memory");
        l->keys[at] = key;
        l->n++;
    }
    l->values[at] = x; /* NaN stays NaN: the checks refuse it by name */
    l->texts[at] = text;
    return true;
}

bool serve_proto_decode_fwdbwd(const unsigned char *buf, size_t len, serve_proto_fwdbwd *out, char *err,
                               size_t errcap) {
    static const char *const names[] = {NULL,      "model_id",       "seq_id",       "data",
                                        "loss_fn", "loss_fn_config", "forward_only", "loss_fn_config_v2"};
    memset(out, 0, sizeof *out);
    out->model_id = "";
    if (buf == NULL) buf = (const unsigned char *)"";
    serve_fwd_in *in = &out->in;
    ctx c = {buf, err, errcap, &in->arena};
    if (errcap > 0) err[0] = '\0';
    msg m = {buf, buf + len, "", names, 8};
    size_t data_cap = 0;
    config_list v1 = {0}, v2 = {0};
    field f;
    int rc = 0;
    bool ok = true;
    while (ok && (rc = next_(&c, &m, &f)) == 1) {
        switch (f.num) {
        case 1: {
            const char *id = string_(&c, &f);
            if ((ok = id != NULL)) out->model_id = id;
            break;
        }
        case 2:
            /* int32: the low 32 bits (a negative one is sent sign-extended). */
            if ((ok = want_(&c, &f, WT_VARINT))) out->seq_id = (int32_t)(uint32_t)f.v;
            break;
        case 3: {
            char dpath[64];
            pathf_(dpath, sizeof dpath, "data[%lld]", (long long)in->n);
            ok = want_(&c, &f, WT_LEN);
            serve_datum_in *grown = ok ? serve_arena_grow(c.arena, in->data, (size_t)in->n, &data_cap, sizeof *grown)
                                       : NULL;
            if (ok && grown == NULL) ok = fail_(&c, dpath, "out of memory");
            if (ok) {
                in->data = grown;
                serve_datum_in *d = &in->data[in->n++];
                memset(d, 0, sizeof *d);
                ok = datum_(&c, &f, dpath, d);
            }
            break;
        }
        case 4: {
            const char *lf = string_(&c, &f);
            if ((ok = lf != NULL)) in->loss_fn = lf[0] ? lf : NULL; /* "" is protobuf's "not set" */
            break;
        }
        case 5:
            ok = config_entry_(&c, &f, false, &v1);
            break;
        case 7:
            ok = config_entry_(&c, &f, true, &v2);
            break;
        case 6:
            if ((ok = want_(&c, &f, WT_VARINT))) out->forward_only = f.v != 0;
            break;
        default:
            break; /* unknown: skipped (newer SDKs add fields) */
        }
    }
    if (!ok || rc < 0) {
        serve_proto_fwdbwd_free(out);
        return false;
    }
    const config_list *use = v2.n > 0 ? &v2 : &v1;
    in->n_config = use->n;
    in->config_keys = use->keys;
    in->config_values = use->values;
    in->config_texts = use->texts;
    return true;
}

void serve_proto_fwdbwd_free(serve_proto_fwdbwd *r) {
    if (r == NULL) return;
    serve_fwd_in_free(&r->in);
    memset(r, 0, sizeof *r);
    r->model_id = "";
}
