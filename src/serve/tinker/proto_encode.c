/*
 * proto_encode.c -- the writing half of the hand-written protobuf
 * codec (tinker/proto.h): ForwardBackwardOutput and SampleResponse, from
 * typed results or from their JSON form.  The field numbers are in proto.h.
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
