/*
 * tinker/proto.c -- a small hand-written protobuf codec for the Tinker SDK's
 * forward_backward (tinker/proto.h).  No protobuf library: a tag/varint
 * reader that checks every length against the bytes left (it never reads
 * past the buffer), and a writer.
 *
 * Field numbers (tinker_public.proto, from the SDK's tinker_public_pb2.py;
 * docs/tinker-protocol.md §1.6):
 *   ForwardBackwardRequest  1 model_id string, 2 seq_id int32, 3 data repeated
 *                           Datum, 4 loss_fn string, 5 loss_fn_config
 *                           map<string,double>, 6 forward_only bool
 *   Datum                   1 model_input repeated Chunk, 2 loss_fn_inputs
 *                           map<string,Tensor>
 *   Chunk (oneof)           1 encoded_text {1 tokens: int32 LE bytes},
 *                           2 image, 3 dmel
 *   Tensor                  oneof {1 dense bytes | 2 sparse_csr}, 3 dtype,
 *                           4 shape repeated int64
 *   DType                   0 unspecified, 1 FLOAT32, 2 INT64, 3 INT32, 4 BFLOAT16
 *   ForwardBackwardOutput   1 loss_fn_output_type, 2 loss_fn_outputs repeated
 *                           ArrayRecord, 3 metrics map<string,double>
 *   ArrayRecord             1 type_tag, 2 fields map<string,BatchedTensor>,
 *                           3 num_datums int64
 *   BatchedTensor           1 data bytes, 2 offsets bytes (int64 byte
 *                           offsets, n+1), 3 dtype, 4 trailing_shape
 * A map entry is a message {1 key, 2 value}.  Repeated scalars are accepted
 * packed and unpacked; a singular field given twice keeps the last value, as
 * protobuf does; unknown fields are skipped (newer SDKs add some).
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

enum { WT_VARINT = 0, WT_I64 = 1, WT_LEN = 2, WT_SGROUP = 3, WT_EGROUP = 4, WT_I32 = 5 };

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
    }
    return rc >= 0;
}

bool serve_proto_decode_fwdbwd(const unsigned char *buf, size_t len, serve_proto_fwdbwd *out, char *err,
                               size_t errcap) {
    static const char *const names[] = {NULL,      "model_id",       "seq_id",      "data",
                                        "loss_fn", "loss_fn_config", "forward_only"};
    memset(out, 0, sizeof *out);
    out->model_id = "";
    if (buf == NULL) buf = (const unsigned char *)"";
    serve_fwd_in *in = &out->in;
    ctx c = {buf, err, errcap, &in->arena};
    if (errcap > 0) err[0] = '\0';
    msg m = {buf, buf + len, "", names, 7};
    size_t data_cap = 0, key_cap = 0, value_cap = 0;
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
        case 5: {
            const char *key;
            field value;
            ok = want_(&c, &f, WT_LEN) && map_entry_(&c, &f, &key, &value);
            if (!ok) break;
            char label[80], vpath[160];
            key_label_(key, label, sizeof label);
            pathf_(vpath, sizeof vpath, "loss_fn_config.%s", label);
            double x = 0.0;
            if (value.wire != -1) {
                pathf_(value.path, sizeof value.path, "%s", vpath);
                if (!(ok = want_(&c, &value, WT_I64))) break;
                memcpy(&x, &value.v, sizeof x);
            }
            /* A key sent twice: the last value, in the first one's place. */
            int64_t at = 0;
            while (at < in->n_config && strcmp(in->config_keys[at], key) != 0) at++;
            if (at == in->n_config) {
                const char **keys = serve_arena_grow(c.arena, in->config_keys, (size_t)at, &key_cap, sizeof *keys);
                double *values = serve_arena_grow(c.arena, in->config_values, (size_t)at, &value_cap,
                                                  sizeof *values);
                if (keys == NULL || values == NULL) {
                    ok = fail_(&c, vpath, "out of memory");
                    break;
                }
                in->config_keys = keys;
                in->config_values = values;
                in->config_keys[at] = key;
                in->n_config++;
            }
            in->config_values[at] = x; /* NaN stays NaN: the checks refuse it by name */
            break;
        }
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
    return true;
}

void serve_proto_fwdbwd_free(serve_proto_fwdbwd *r) {
    if (r == NULL) return;
    serve_fwd_in_free(&r->in);
    memset(r, 0, sizeof *r);
    r->model_id = "";
}

/* ---- writing -------------------------------------------------------------------------- */

typedef struct wbuf {
    serve_bytes b;
    bool oom;
} wbuf;

static void w_raw_(wbuf *b, const void *src, size_t n) {
    if (!b->oom && n > 0 && !serve_put(&b->b, src, n)) b->oom = true;
}

static void w_varint_(wbuf *b, uint64_t v) {
    unsigned char tmp[10];
    size_t n = 0;
    do {
        tmp[n] = (unsigned char)(v & 0x7f);
        v >>= 7;
        if (v) tmp[n] |= 0x80;
        n++;
    } while (v);
    w_raw_(b, tmp, n);
}

static void w_tag_(wbuf *b, uint32_t num, int wire) { w_varint_(b, (uint64_t)num << 3 | (uint64_t)wire); }

static void w_le_(wbuf *b, uint64_t v, size_t n) {
    unsigned char tmp[8];
    for (size_t k = 0; k < n; k++) tmp[k] = (unsigned char)(v >> (8 * k));
    w_raw_(b, tmp, n);
}

static void w_bytes_(wbuf *b, uint32_t num, const void *p, size_t n) {
    w_tag_(b, num, WT_LEN);
    w_varint_(b, n);
    w_raw_(b, p, n);
}

/* A sub-message (its bytes in sub) as field num of b; frees sub. */
static void w_msg_(wbuf *b, uint32_t num, wbuf *sub) {
    if (sub->oom) b->oom = true;
    else w_bytes_(b, num, sub->b.p, sub->b.len);
    free(sub->b.p);
    *sub = (wbuf){0};
}

static void w_double_(wbuf *b, uint32_t num, double x) {
    uint64_t u;
    memcpy(&u, &x, sizeof u);
    w_tag_(b, num, WT_I64);
    w_le_(b, u, 8);
}

static bool efail_(char *err, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool efail_(char *err, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (cap > 0) vsnprintf(err, cap, fmt, ap);
    va_end(ap);
    return false;
}

/* A finished message: its bytes (owned by the caller, never NULL: an empty
 * message is valid protobuf) and length, or NULL with err set when any write
 * ran out of memory. */
static unsigned char *w_finish_(wbuf *b, size_t *out_len, char *err, size_t errcap) {
    if (!b->oom && b->b.p == NULL) b->oom = (b->b.p = malloc(1)) == NULL;
    if (b->oom) {
        free(b->b.p);
        return efail_(err, errcap, "out of memory"), NULL;
    }
    *out_len = b->b.len;
    return b->b.p;
}

/* dtype name -> (DType, element width); false if not float32/int64/int32. */
static bool out_dtype_(const char *s, int *dtype, size_t *width) {
    if (s == NULL || !strcmp(s, "float32")) *dtype = 1, *width = 4;
    else if (!strcmp(s, "int64")) *dtype = 2, *width = 8;
    else if (!strcmp(s, "int32")) *dtype = 3, *width = 4;
    else return false;
    return true;
}

/* The BatchedTensor of output field `name` over every datum, into bt. */
static bool batched_(const json_t *outs, const char *name, wbuf *bt, char *err, size_t cap) {
    const size_t n = json_array_size(outs);
    const json_t *t0 = json_object_get(json_array_get(outs, 0), name);
    const char *ds = json_string_value(json_object_get(t0, "dtype"));
    int dtype;
    size_t width;
    if (!out_dtype_(ds, &dtype, &width))
        return efail_(err, cap, "loss_fn_outputs[0].%s.dtype: %s has no protobuf encoding here", name,
                      ds ? ds : "(not a string)");
    const json_t *shape0 = json_object_get(t0, "shape");
    const size_t rank0 = json_is_array(shape0) ? json_array_size(shape0) : 1;
    wbuf data = {0}, offs = {0};
    w_le_(&offs, 0, 8);
    for (size_t i = 0; i < n; i++) {
        const json_t *t = json_object_get(json_array_get(outs, i), name);
        const json_t *arr = json_object_get(t, "data");
        const json_t *shape = json_object_get(t, "shape");
        const char *di = json_string_value(json_object_get(t, "dtype"));
        bool same = json_is_array(arr) && (di == ds || (di && ds && !strcmp(di, ds)));
        /* The trailing dimensions must agree (one trailing_shape for all datums). */
        const size_t rank = json_is_array(shape) ? json_array_size(shape) : 1;
        same = same && rank == rank0;
        for (size_t k = 1; same && k < rank; k++)
            same = json_equal(json_array_get(shape, k), json_array_get(shape0, k));
        if (!same) {
            free(data.b.p);
            free(offs.b.p);
            return efail_(err, cap, "loss_fn_outputs[%zu].%s: missing, or its data, dtype or trailing shape "
                          "differs from datum 0's", i, name);
        }
        for (size_t k = 0; k < json_array_size(arr); k++) {
            const json_t *x = json_array_get(arr, k);
            if (dtype == 1) {
                float f = json_is_number(x) ? (float)json_number_value(x) : NAN;
                uint32_t u;
                memcpy(&u, &f, sizeof u);
                w_le_(&data, u, 4);
            } else if (json_is_integer(x)) {
                w_le_(&data, (uint64_t)(int64_t)json_integer_value(x), width);
            } else {
                free(data.b.p);
                free(offs.b.p);
                return efail_(err, cap, "loss_fn_outputs[%zu].%s.data[%zu]: not an integer", i, name, k);
            }
        }
        w_le_(&offs, (uint64_t)data.b.len, 8);
    }
    w_bytes_(bt, 1, data.b.p, data.b.len);
    w_bytes_(bt, 2, offs.b.p, offs.b.len);
    if (data.oom || offs.oom) bt->oom = true;
    free(data.b.p);
    free(offs.b.p);
    w_tag_(bt, 3, WT_VARINT);
    w_varint_(bt, (uint64_t)dtype);
    if (rank0 > 1) { /* packed */
        wbuf dims = {0};
        for (size_t k = 1; k < rank0; k++) w_varint_(&dims, (uint64_t)json_integer_value(json_array_get(shape0, k)));
        w_msg_(bt, 4, &dims);
    }
    return true;
}

unsigned char *serve_proto_encode_fwdbwd_output(const json_t *result, size_t *out_len, char *err,
                                                size_t errcap) {
    if (errcap > 0) err[0] = '\0';
    *out_len = 0;
    const json_t *outs = json_object_get(result, "loss_fn_outputs");
    const json_t *metrics = json_object_get(result, "metrics");
    const char *type = json_string_value(json_object_get(result, "loss_fn_output_type"));
    if (!json_is_array(outs)) return efail_(err, errcap, "loss_fn_outputs: not an array"), NULL;
    if (metrics != NULL && !json_is_object(metrics)) return efail_(err, errcap, "metrics: not an object"), NULL;
    const size_t n = json_array_size(outs);
    const json_t *first = json_array_get(outs, 0);
    for (size_t i = 0; i < n; i++) {
        const json_t *o = json_array_get(outs, i);
        if (!json_is_object(o) || json_object_size(o) != json_object_size(first))
            return efail_(err, errcap, "loss_fn_outputs[%zu]: not an object with datum 0's fields", i), NULL;
    }
    wbuf b = {0};
    if (type != NULL && type[0]) w_bytes_(&b, 1, type, strlen(type));
    if (n > 0) {
        wbuf rec = {0};
        const char *name;
        const json_t *unused;
        json_object_foreach((json_t *)first, name, unused) {
            wbuf bt = {0}, entry = {0};
            if (!batched_(outs, name, &bt, err, errcap)) {
                free(bt.b.p);
                free(rec.b.p);
                free(b.b.p);
                return NULL;
            }
            w_bytes_(&entry, 1, name, strlen(name));
            w_msg_(&entry, 2, &bt);
            w_msg_(&rec, 2, &entry);
        }
        w_tag_(&rec, 3, WT_VARINT);
        w_varint_(&rec, (uint64_t)n);
        w_msg_(&b, 2, &rec);
    }
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)metrics, key, v) {
        if (v != NULL && !json_is_number(v) && !json_is_null(v)) {
            free(b.b.p);
            return efail_(err, errcap, "metrics.%s: not a number", key), NULL;
        }
        wbuf entry = {0};
        w_bytes_(&entry, 1, key, strlen(key));
        w_double_(&entry, 2, json_is_number(v) ? json_number_value(v) : NAN);
        w_msg_(&b, 3, &entry);
    }
    return w_finish_(&b, out_len, err, errcap);
}

unsigned char *serve_proto_encode_fwdbwd_typed(const char *type, int64_t n, const int64_t *off, int n_fields,
                                               const char *const *names, const float *const *values,
                                               int n_metrics, const char *const *metric_names,
                                               const double *metric_values, size_t *out_len, char *err,
                                               size_t errcap) {
    if (errcap > 0) err[0] = '\0';
    *out_len = 0;
    wbuf b = {0};
    if (type != NULL && type[0]) w_bytes_(&b, 1, type, strlen(type));
    if (n > 0) {
        wbuf rec = {0};
        for (int k = 0; k < n_fields; k++) {
            /* BatchedTensor {1 data: the datums' values, 2 offsets: n + 1
             * byte offsets, 3 dtype FLOAT32} */
            wbuf data = {0}, offs = {0}, bt = {0}, entry = {0};
            for (int64_t i = 0; i <= n; i++) w_le_(&offs, (uint64_t)(off[i] * 4), 8);
            for (int64_t t = 0; t < off[n]; t++) {
                uint32_t u;
                memcpy(&u, &values[k][t], sizeof u);
                w_le_(&data, u, 4);
            }
            w_msg_(&bt, 1, &data);
            w_msg_(&bt, 2, &offs);
            w_tag_(&bt, 3, WT_VARINT);
            w_varint_(&bt, 1);
            w_bytes_(&entry, 1, names[k], strlen(names[k]));
            w_msg_(&entry, 2, &bt);
            w_msg_(&rec, 2, &entry);
        }
        w_tag_(&rec, 3, WT_VARINT);
        w_varint_(&rec, (uint64_t)n);
        w_msg_(&b, 2, &rec);
    }
    for (int k = 0; k < n_metrics; k++) {
        wbuf entry = {0};
        w_bytes_(&entry, 1, metric_names[k], strlen(metric_names[k]));
        w_double_(&entry, 2, metric_values[k]);
        w_msg_(&b, 3, &entry);
    }
    return w_finish_(&b, out_len, err, errcap);
}

unsigned char *serve_proto_encode_sample_response(const json_t *result, size_t *out_len, char *err,
                                                  size_t errcap) {
    if (errcap > 0) err[0] = '\0';
    *out_len = 0;
    const json_t *seqs = json_object_get(result, "sequences");
    if (!json_is_array(seqs)) return efail_(err, errcap, "sequences: not an array"), NULL;
    wbuf b = {0};
    for (size_t i = 0; i < json_array_size(seqs); i++) {
        const json_t *q = json_array_get(seqs, i);
        const json_t *tok = json_object_get(q, "tokens"), *lp = json_object_get(q, "logprobs");
        const char *reason = json_string_value(json_object_get(q, "stop_reason"));
        if (!json_is_array(tok) || (lp != NULL && (!json_is_array(lp) || json_array_size(lp) != json_array_size(tok)))) {
            free(b.b.p);
            return efail_(err, errcap, "sequences[%zu]: tokens and logprobs must be arrays of one length", i), NULL;
        }
        wbuf sq = {0}, tb = {0}, lb = {0};
        /* 1 stop_reason: STOP 0 (the default, so not written), LENGTH 1. */
        if (reason != NULL && !strcmp(reason, "length")) {
            w_tag_(&sq, 1, WT_VARINT);
            w_varint_(&sq, 1);
        }
        for (size_t k = 0; k < json_array_size(tok); k++)
            w_le_(&tb, (uint32_t)(int32_t)json_integer_value(json_array_get(tok, k)), 4);
        w_bytes_(&sq, 2, tb.b.p ? tb.b.p : (void *)"", tb.b.len);
        if (lp != NULL) {
            for (size_t k = 0; k < json_array_size(lp); k++) {
                const json_t *x = json_array_get(lp, k);
                float f = json_is_number(x) ? (float)json_number_value(x) : NAN;
                uint32_t bits;
                memcpy(&bits, &f, sizeof bits);
                w_le_(&lb, bits, 4);
            }
            w_bytes_(&sq, 3, lb.b.p ? lb.b.p : (void *)"", lb.b.len);
        }
        b.oom = b.oom || sq.oom || tb.oom || lb.oom;
        free(tb.b.p);
        free(lb.b.p);
        w_msg_(&b, 1, &sq);
    }
    return w_finish_(&b, out_len, err, errcap);
}

/* Packed float32 LE bytes of x[0..n), non-finite as NaN, as field `num` of b. */
static void w_floats_(wbuf *b, int num, const float *x, int64_t n) {
    wbuf lb = {0};
    for (int64_t k = 0; k < n; k++) {
        float f = isfinite(x[k]) ? x[k] : NAN;
        uint32_t bits;
        memcpy(&bits, &f, sizeof bits);
        w_le_(&lb, bits, 4);
    }
    w_bytes_(b, num, lb.b.p ? lb.b.p : (void *)"", lb.b.len);
    b->oom = b->oom || lb.oom;
    free(lb.b.p);
}

unsigned char *serve_proto_encode_sample_typed(int64_t n, const int64_t *off, const int32_t *tokens,
                                               const float *logprobs, const bool *stopped,
                                               const float *prompt_lp, int64_t n_prompt_lp, int64_t topk_k,
                                               int64_t n_topk, const int32_t *topk_ids, const float *topk_lps,
                                               size_t *out_len, char *err, size_t errcap) {
    if (errcap > 0) err[0] = '\0';
    *out_len = 0;
    wbuf b = {0};
    for (int64_t i = 0; i < n; i++) {
        wbuf sq = {0}, tb = {0};
        /* 1 stop_reason: STOP 0 (the default, so not written), LENGTH 1. */
        if (!stopped[i]) {
            w_tag_(&sq, 1, WT_VARINT);
            w_varint_(&sq, 1);
        }
        for (int64_t k = off[i]; k < off[i + 1]; k++) w_le_(&tb, (uint32_t)tokens[k], 4);
        w_bytes_(&sq, 2, tb.b.p ? tb.b.p : (void *)"", tb.b.len);
        if (logprobs != NULL) w_floats_(&sq, 3, logprobs + off[i], off[i + 1] - off[i]);
        b.oom = b.oom || sq.oom || tb.oom;
        free(tb.b.p);
        w_msg_(&b, 1, &sq);
    }
    if (prompt_lp != NULL) w_floats_(&b, 2, prompt_lp, n_prompt_lp); /* 2 prompt_logprobs */
    if (topk_k > 0) { /* 3 topk_prompt_logprobs */
        wbuf tk = {0}, ib = {0}, lb = {0};
        for (int64_t q = 0; q < n_topk * topk_k; q++) {
            const bool none = topk_ids[q] < 0; /* what the SDK reads as None */
            float f = none ? -99999.0f : isfinite(topk_lps[q]) ? topk_lps[q] : NAN;
            uint32_t bits;
            memcpy(&bits, &f, sizeof bits);
            w_le_(&ib, none ? 0u : (uint32_t)topk_ids[q], 4);
            w_le_(&lb, bits, 4);
        }
        w_bytes_(&tk, 1, ib.b.p ? ib.b.p : (void *)"", ib.b.len);
        w_bytes_(&tk, 2, lb.b.p ? lb.b.p : (void *)"", lb.b.len);
        w_tag_(&tk, 3, WT_VARINT);
        w_varint_(&tk, (uint64_t)topk_k);
        w_tag_(&tk, 4, WT_VARINT);
        w_varint_(&tk, (uint64_t)n_topk);
        b.oom = b.oom || tk.oom || ib.oom || lb.oom;
        free(ib.b.p);
        free(lb.b.p);
        w_msg_(&b, 3, &tk);
    }
    return w_finish_(&b, out_len, err, errcap);
}
