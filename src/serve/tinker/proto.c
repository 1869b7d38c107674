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

/* A string field as a JSON string (NULL with err set if not UTF-8). */
static json_t *string_(ctx *c, const field *f) {
    if (!want_(c, f, WT_LEN)) return NULL;
    if (!utf8_ok_(f->data, f->len)) {
        fail_(c, f->path, "not a UTF-8 string without NUL bytes (%zu bytes)", f->len);
        return NULL;
    }
    json_t *s = json_stringn((const char *)f->data, f->len);
    if (s == NULL) fail_(c, f->path, "out of memory");
    return s;
}

/* A printable rendition of a map key for paths in messages (ASCII only, so
 * that a message cut anywhere stays valid UTF-8). */
static void key_label_(const unsigned char *s, size_t n, char *out, size_t cap) {
    size_t k = 0;
    for (size_t i = 0; i < n && k + 4 < cap; i++) out[k++] = s[i] >= 0x20 && s[i] < 0x7f ? (char)s[i] : '?';
    if (n > 0 && k + 4 >= cap) {
        out[k++] = '.';
        out[k++] = '.';
        out[k++] = '.';
    }
    out[k] = '\0';
}

/* A map entry {1 key string, 2 value}: the key (checked) and the value field
 * (value->len 0 / value->wire -1 when absent). */
static bool map_entry_(ctx *c, const field *entry, json_t **key, field *value) {
    static const char *const names[] = {NULL, "key", "value"};
    msg m = {entry->data, entry->data + entry->len, entry->path, names, 3};
    field f;
    int rc;
    *key = NULL;
    value->wire = -1;
    value->len = 0;
    value->data = NULL;
    value->v = 0;
    while ((rc = next_(c, &m, &f)) == 1) {
        if (f.num == 1) {
            json_decref(*key);
            if ((*key = string_(c, &f)) == NULL) return false;
        } else if (f.num == 2) {
            *value = f;
        }
    }
    if (rc < 0) {
        json_decref(*key);
        *key = NULL;
        return false;
    }
    if (*key == NULL && (*key = json_string("")) == NULL) return fail_(c, entry->path, "out of memory");
    return true;
}

/* Appends to arr, refusing a NULL value (out of memory). */
static bool push_(ctx *c, const char *path, json_t *arr, json_t *v) {
    if (v == NULL || json_array_append_new(arr, v) != 0) return fail_(c, path, "out of memory");
    return true;
}

static bool put_(ctx *c, const char *path, json_t *obj, const char *key, json_t *v) {
    if (v == NULL || json_object_set_new(obj, key, v) != 0) return fail_(c, path, "out of memory");
    return true;
}

static uint32_t le32_(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64_(const unsigned char *p) { return (uint64_t)le32_(p) | (uint64_t)le32_(p + 4) << 32; }

/* A JSON number for x; jansson has no NaN or Inf, which become null (the
 * validation refuses null by name). */
static json_t *real_(double x) { return isfinite(x) ? json_real(x) : json_null(); }

/* Tensor -> TensorData {"data", "dtype", "shape"?}; a sparse one gets the
 * JSON path's sparse_* keys, which the validation refuses. */
static json_t *tensor_(ctx *c, const field *tf, const char *path) {
    static const char *const names[] = {NULL, "dense", "sparse_csr", "dtype", "shape"};
    msg m = {tf->data, tf->data + tf->len, path, names, 5};
    field f, dense = {0};
    bool sparse = false, have_dense = false;
    uint64_t dtype = 0;
    int64_t shape[MAX_SHAPE];
    int n_shape = 0;
    int rc;
    while ((rc = next_(c, &m, &f)) == 1) {
        if (f.num == 1) {
            if (!want_(c, &f, WT_LEN)) return NULL;
            dense = f;
            have_dense = true;
            sparse = false;
        } else if (f.num == 2) {
            if (!want_(c, &f, WT_LEN)) return NULL;
            sparse = true;
            have_dense = false;
        } else if (f.num == 3) {
            if (!want_(c, &f, WT_VARINT)) return NULL;
            dtype = f.v;
        } else if (f.num == 4) {
            if (f.wire == WT_VARINT) {
                if (n_shape == MAX_SHAPE) return fail_(c, f.path, "more than %d dimensions", MAX_SHAPE), NULL;
                shape[n_shape++] = (int64_t)f.v;
            } else if (f.wire == WT_LEN) { /* packed */
                const unsigned char *p = f.data, *end = f.data + f.len;
                while (p < end) {
                    uint64_t v;
                    int vr = varint_(&p, end, &v);
                    if (vr != 0)
                        return fail_(c, f.path, "%s in the packed values",
                                     vr == -1 ? "truncated varint" : "varint longer than 64 bits"),
                               NULL;
                    if (n_shape == MAX_SHAPE)
                        return fail_(c, f.path, "more than %d dimensions", MAX_SHAPE), NULL;
                    shape[n_shape++] = (int64_t)v;
                }
            } else {
                return fail_(c, f.path, "wire type %d (%s), expected a varint or packed varints", f.wire,
                             wire_name_(f.wire)),
                       NULL;
            }
        }
    }
    if (rc < 0) return NULL;

    /* dtype: its name and the width of one dense element (0: unknown). */
    char label[32];
    size_t width = 0;
    switch (dtype) {
    case 1: snprintf(label, sizeof label, "float32"); width = 4; break;
    case 2: snprintf(label, sizeof label, "int64"); width = 8; break;
    case 3: snprintf(label, sizeof label, "int32"); width = 4; break;
    case 4: snprintf(label, sizeof label, "bfloat16"); width = 2; break;
    case 0: snprintf(label, sizeof label, "unspecified"); break;
    default: snprintf(label, sizeof label, "DType %llu", (unsigned long long)dtype); break;
    }
    json_t *t = json_object(), *data = json_array();
    if (t == NULL || data == NULL || json_object_set_new(t, "data", data) != 0) {
        json_decref(t);
        if (t == NULL) json_decref(data);
        return fail_(c, path, "out of memory"), NULL;
    }
    bool ok = put_(c, path, t, "dtype", json_string(label));
    if (ok && n_shape > 0) {
        json_t *sh = json_array();
        ok = put_(c, path, t, "shape", sh);
        for (int k = 0; ok && k < n_shape; k++) ok = push_(c, path, sh, json_integer((json_int_t)shape[k]));
    }
    if (ok && sparse) {
        ok = put_(c, path, t, "sparse_crow_indices", json_array()) &&
             put_(c, path, t, "sparse_col_indices", json_array());
    } else if (ok && have_dense && width > 0) {
        char dpath[440];
        pathf_(dpath, sizeof dpath, "%s.dense", path);
        if (dense.len % width != 0) {
            ok = fail_(c, dpath, "%zu bytes is not a whole number of %zu-byte %s values", dense.len, width, label);
        }
        const unsigned char *p = dense.data;
        for (size_t i = 0; ok && i < dense.len / width; i++, p += width) {
            json_t *v;
            if (dtype == 1) {
                uint32_t u = le32_(p);
                float x;
                memcpy(&x, &u, sizeof x);
                v = real_(x);
            } else if (dtype == 2) {
                v = json_integer((json_int_t)(int64_t)le64_(p));
            } else if (dtype == 3) {
                v = json_integer((json_int_t)(int32_t)le32_(p));
            } else { /* bfloat16: the upper half of a float32 */
                uint32_t u = ((uint32_t)p[0] | (uint32_t)p[1] << 8) << 16;
                float x;
                memcpy(&x, &u, sizeof x);
                v = real_(x);
            }
            ok = push_(c, dpath, data, v);
        }
    }
    if (!ok) {
        json_decref(t);
        return NULL;
    }
    return t;
}

/* Chunk -> {"type": "encoded_text", "tokens": [...]}, or {"type": "image"} /
 * {"type": "dmel"} (refused by the validation, which names them). */
static json_t *chunk_(ctx *c, const field *cf, const char *path) {
    static const char *const names[] = {NULL, "encoded_text", "image", "dmel"};
    msg m = {cf->data, cf->data + cf->len, path, names, 4};
    field f, text = {0};
    int kind = 0, rc;
    while ((rc = next_(c, &m, &f)) == 1) {
        if (f.num >= 1 && f.num <= 3) {
            if (!want_(c, &f, WT_LEN)) return NULL;
            kind = (int)f.num;
            if (kind == 1) text = f;
        }
    }
    if (rc < 0) return NULL;
    if (kind != 1) {
        const char *type = kind == 2 ? "image" : kind == 3 ? "dmel" : "none (an empty Chunk)";
        json_t *o = json_pack("{s:s}", "type", type);
        if (o == NULL) fail_(c, path, "out of memory");
        return o;
    }
    /* EncodedTextChunk {1 tokens: int32 LE bytes} */
    static const char *const tnames[] = {NULL, "tokens"};
    msg tm = {text.data, text.data + text.len, text.path, tnames, 2};
    field tokens = {0};
    bool have = false;
    while ((rc = next_(c, &tm, &f)) == 1) {
        if (f.num == 1) {
            if (!want_(c, &f, WT_LEN)) return NULL;
            tokens = f;
            have = true;
        }
    }
    if (rc < 0) return NULL;
    if (have && tokens.len % 4 != 0) {
        fail_(c, tokens.path, "%zu bytes is not a whole number of int32 tokens", tokens.len);
        return NULL;
    }
    json_t *o = json_object(), *arr = json_array();
    if (o == NULL || arr == NULL || json_object_set_new(o, "tokens", arr) != 0) {
        json_decref(o);
        if (o == NULL) json_decref(arr);
        return fail_(c, path, "out of memory"), NULL;
    }
    bool ok = put_(c, path, o, "type", json_string("encoded_text"));
    for (size_t i = 0; ok && have && i < tokens.len / 4; i++)
        ok = push_(c, tokens.path, arr, json_integer((json_int_t)(int32_t)le32_(tokens.data + 4 * i)));
    if (!ok) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* Datum -> {"model_input": {"chunks": [...]}, "loss_fn_inputs": {...}}. */
static json_t *datum_(ctx *c, const field *df, const char *path) {
    static const char *const names[] = {NULL, "model_input", "loss_fn_inputs"};
    msg m = {df->data, df->data + df->len, path, names, 3};
    json_t *d = json_pack("{s:{s:[]},s:{}}", "model_input", "chunks", "loss_fn_inputs");
    if (d == NULL) return fail_(c, path, "out of memory"), NULL;
    json_t *chunks = json_object_get(json_object_get(d, "model_input"), "chunks");
    json_t *inputs = json_object_get(d, "loss_fn_inputs");
    field f;
    int rc = 0;
    size_t n_chunks = 0;
    bool ok = true;
    while (ok && (rc = next_(c, &m, &f)) == 1) {
        if (f.num == 1) {
            char cpath[440];
            pathf_(cpath, sizeof cpath, "%s.model_input[%zu]", path, n_chunks++);
            ok = want_(c, &f, WT_LEN) && push_(c, cpath, chunks, chunk_(c, &f, cpath));
        } else if (f.num == 2) {
            json_t *key = NULL;
            field value;
            ok = want_(c, &f, WT_LEN) && map_entry_(c, &f, &key, &value);
            if (!ok) break;
            char label[80], tpath[440];
            key_label_((const unsigned char *)json_string_value(key), json_string_length(key), label,
                       sizeof label);
            pathf_(tpath, sizeof tpath, "%s.loss_fn_inputs.%s", path, label);
            field empty = {0};
            if (value.wire == -1) {
                empty.data = (const unsigned char *)"";
                value = empty;
                value.wire = WT_LEN;
            }
            json_t *t = NULL;
            if (value.wire != WT_LEN) {
                pathf_(value.path, sizeof value.path, "%s", tpath);
                ok = want_(c, &value, WT_LEN);
            } else {
                ok = (t = tensor_(c, &value, tpath)) != NULL;
            }
            if (ok) ok = put_(c, tpath, inputs, json_string_value(key), t);
            json_decref(key);
        }
    }
    if (!ok || rc < 0) {
        json_decref(d);
        return NULL;
    }
    return d;
}

json_t *serve_proto_decode_fwdbwd(const unsigned char *buf, size_t len, bool *forward_only, char *err,
                                  size_t errcap) {
    static const char *const names[] = {NULL,      "model_id",       "seq_id",      "data",
                                        "loss_fn", "loss_fn_config", "forward_only"};
    if (buf == NULL) buf = (const unsigned char *)"";
    ctx c = {buf, err, errcap};
    if (errcap > 0) err[0] = '\0';
    *forward_only = false;
    msg m = {buf, buf + len, "", names, 7};
    json_t *model_id = NULL, *loss_fn = NULL;
    json_t *data = json_array(), *config = json_object();
    int64_t seq = 0;
    field f;
    int rc = 0;
    size_t n_data = 0;
    bool ok = data != NULL && config != NULL;
    if (!ok) fail_(&c, "", "out of memory");
    while (ok && (rc = next_(&c, &m, &f)) == 1) {
        switch (f.num) {
        case 1:
            json_decref(model_id);
            ok = (model_id = string_(&c, &f)) != NULL;
            break;
        case 2:
            /* int32: the low 32 bits (a negative one is sent sign-extended). */
            if ((ok = want_(&c, &f, WT_VARINT))) seq = (int32_t)(uint32_t)f.v;
            break;
        case 3: {
            char dpath[64];
            pathf_(dpath, sizeof dpath, "data[%zu]", n_data++);
            ok = want_(&c, &f, WT_LEN) && push_(&c, dpath, data, datum_(&c, &f, dpath));
            break;
        }
        case 4:
            json_decref(loss_fn);
            ok = (loss_fn = string_(&c, &f)) != NULL;
            break;
        case 5: {
            json_t *key = NULL;
            field value;
            ok = want_(&c, &f, WT_LEN) && map_entry_(&c, &f, &key, &value);
            if (!ok) break;
            char label[80], vpath[160];
            key_label_((const unsigned char *)json_string_value(key), json_string_length(key), label,
                       sizeof label);
            pathf_(vpath, sizeof vpath, "loss_fn_config.%s", label);
            double x = 0.0;
            if (value.wire != -1) {
                pathf_(value.path, sizeof value.path, "%s", vpath);
                if ((ok = want_(&c, &value, WT_I64))) memcpy(&x, &value.v, sizeof x);
            }
            if (ok) ok = put_(&c, vpath, config, json_string_value(key), real_(x));
            json_decref(key);
            break;
        }
        case 6:
            if ((ok = want_(&c, &f, WT_VARINT))) *forward_only = f.v != 0;
            break;
        default:
            break; /* unknown: skipped (newer SDKs add fields) */
        }
    }
    json_t *root = NULL;
    if (ok && rc >= 0) {
        json_t *in = json_object();
        root = json_object();
        if (model_id == NULL) model_id = json_string("");
        ok = in != NULL && root != NULL && model_id != NULL &&
             json_object_set(root, "model_id", model_id) == 0 &&
             json_object_set_new(root, "seq_id", json_integer((json_int_t)seq)) == 0 &&
             json_object_set(in, "data", data) == 0;
        if (ok && loss_fn != NULL && json_string_length(loss_fn) > 0)
            ok = json_object_set(in, "loss_fn", loss_fn) == 0;
        if (ok && json_object_size(config) > 0) ok = json_object_set(in, "loss_fn_config", config) == 0;
        if (ok) ok = json_object_set(root, *forward_only ? "forward_input" : "forward_backward_input", in) == 0;
        json_decref(in);
        if (!ok) {
            json_decref(root);
            root = NULL;
            fail_(&c, "", "out of memory");
        }
    }
    json_decref(model_id);
    json_decref(loss_fn);
    json_decref(data);
    json_decref(config);
    return root;
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

unsigned char *serve_proto_encode_sample_typed(int64_t n, const int64_t *off, const int32_t *tokens,
                                               const float *logprobs, const bool *stopped, size_t *out_len,
                                               char *err, size_t errcap) {
    if (errcap > 0) err[0] = '\0';
    *out_len = 0;
    wbuf b = {0};
    for (int64_t i = 0; i < n; i++) {
        wbuf sq = {0}, tb = {0}, lb = {0};
        /* 1 stop_reason: STOP 0 (the default, so not written), LENGTH 1. */
        if (!stopped[i]) {
            w_tag_(&sq, 1, WT_VARINT);
            w_varint_(&sq, 1);
        }
        for (int64_t k = off[i]; k < off[i + 1]; k++) w_le_(&tb, (uint32_t)tokens[k], 4);
        w_bytes_(&sq, 2, tb.b.p ? tb.b.p : (void *)"", tb.b.len);
        if (logprobs != NULL) {
            for (int64_t k = off[i]; k < off[i + 1]; k++) {
                float f = isfinite(logprobs[k]) ? logprobs[k] : NAN;
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
