/*
 * safetensors.c -- reads and writes .safetensors files (Hugging Face's format).
 *
 * Layout: an 8-byte little-endian u64 N, N bytes of UTF-8 JSON (the header),
 * then the data section.  The header maps each tensor name to
 * {"dtype", "shape", "data_offsets": [begin, end]}, offsets relative to the
 * start of the data section, plus an optional "__metadata__" object of
 * string -> string that the reader accepts and drops.
 *
 * The reader trusts nothing in the file: every length, offset and size is
 * checked before it is used, and each error names the file, the tensor, the
 * field, what was seen and what was expected.  It reads the header first and
 * then each tensor straight into its own buffer, so a checkpoint costs its
 * size in memory once, not twice.  On any failure the output is empty and
 * nothing has leaked.
 *
 * The writer lays tensors out contiguously in the caller's order and pads the
 * header with spaces so the data section starts 8-byte aligned, as the Python
 * library does.  It writes "<path>.tmp.<pid>", fsyncs it and renames it into
 * place, so a crash never leaves a half-written file under the real name.
 *
 * Not here: memory-mapping, lazy loading, dtype conversion, byte swapping.
 * Element data is little-endian bytes both in the file and in zdp_tensor.data,
 * so it is copied as is; only the header length is encoded here, byte by byte.
 */
#define _POSIX_C_SOURCE 200809L

#include "../core/core.h"
#include "../core/json.h"
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <jansson.h>

#include "zdp/io.h"

/* zdp_tensor.data is defined as little-endian bytes, so nothing here depends
 * on the host's byte order; but the rest of zdp reads those bytes as native
 * floats, so refuse to build where that would be wrong. */
#if defined(__BYTE_ORDER__) && defined(__ORDER_LITTLE_ENDIAN__) && \
    __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "zdp assumes a little-endian host (tensor data is stored little-endian)"
#endif

/* The Python/Rust library refuses headers above 100 MB; a larger N is a
 * corrupt file, and checking it first keeps us from allocating garbage. */
#define ST_MAX_HEADER_BYTES 100000000ull

#define ST_METADATA_KEY "__metadata__"

/* ---- dtypes ------------------------------------------------------------ */

static const struct {
    const char *name;
    size_t size;
} st_dtypes_[] = {
    [ZDP_DTYPE_F32] = {"F32", 4},  [ZDP_DTYPE_F64] = {"F64", 8},
    [ZDP_DTYPE_I64] = {"I64", 8},  [ZDP_DTYPE_I32] = {"I32", 4},
    [ZDP_DTYPE_U16] = {"U16", 2},  [ZDP_DTYPE_BF16] = {"BF16", 2},
    [ZDP_DTYPE_F16] = {"F16", 2},  [ZDP_DTYPE_U8] = {"U8", 1},
};
#define ST_NDTYPES ((int)(sizeof st_dtypes_ / sizeof st_dtypes_[0]))
#define ST_DTYPE_LIST "F32, F64, I64, I32, U16, BF16, F16, U8"

static bool st_dtype_valid_(zdp_dtype t) {
    return (int)t >= 0 && (int)t < ST_NDTYPES;
}

const char *zdp_dtype_name(zdp_dtype t) {
    return st_dtype_valid_(t) ? st_dtypes_[t].name : "INVALID";
}

size_t zdp_dtype_size(zdp_dtype t) {
    return st_dtype_valid_(t) ? st_dtypes_[t].size : 0;
}

/* ---- conversion to and from fp32 (io.h) --------------------------------- */

static float st_bits_f32_(uint32_t bits) {
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* IEEE binary16 -> binary32, exact (every half is a float). */
static float st_f16_to_f32_(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0x1f) return st_bits_f32_(sign | 0x7f800000u | (man << 13)); /* inf, nan */
    if (exp != 0) return st_bits_f32_(sign | ((exp + 112u) << 23) | (man << 13));
    if (man == 0) return st_bits_f32_(sign);
    /* Subnormal: man * 2^-24, exact in float. */
    float f = (float)man * (1.0f / 16777216.0f);
    return sign ? -f : f;
}

int64_t zdp_io_numel(const int64_t *shape, int ndim) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    return n;
}

bool zdp_io_dtype_float(zdp_dtype t) {
    return t == ZDP_DTYPE_F32 || t == ZDP_DTYPE_F16 || t == ZDP_DTYPE_BF16;
}

float zdp_io_f32_at(const zdp_tensor *t, int64_t i) {
    const unsigned char *p = t->data;
    switch (t->dtype) {
    case ZDP_DTYPE_F16: return st_f16_to_f32_((uint16_t)(p[2 * i] | (p[2 * i + 1] << 8)));
    case ZDP_DTYPE_BF16:
        return st_bits_f32_((uint32_t)(p[2 * i] | (p[2 * i + 1] << 8)) << 16);
    case ZDP_DTYPE_F32: {
        float f;
        memcpy(&f, p + 4 * i, sizeof f);
        return f;
    }
    default: return 0.0f;
    }
}

uint16_t zdp_io_f32_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x0040u); /* NaN */
    /* Adding 0x7fff plus the kept part's lowest bit rounds half to even;
     * a carry into the exponent is the right result (up to infinity). */
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

/* ---- shared helpers ---------------------------------------------------- */

/* numel(shape) * elem_size into *out; false if it does not fit in 64 bits.
 * A zero dimension makes the tensor empty even when the other dimensions
 * multiplied together would overflow. */
static bool st_nbytes_(const int64_t *shape, int ndim, size_t elem_size, uint64_t *out) {
    for (int i = 0; i < ndim; i++) {
        if (shape[i] == 0) {
            *out = 0;
            return true;
        }
    }
    uint64_t total = elem_size;
    for (int i = 0; i < ndim; i++) {
        uint64_t d = (uint64_t)shape[i];
        if (total > UINT64_MAX / d) return false;
        total *= d;
    }
    *out = total;
    return true;
}

/* "[4, 8]" into buf (truncated if it does not fit, which it always does). */
const char *zdp_io_shape_str(const int64_t *shape, int ndim, char *buf, size_t cap) {
    size_t len = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && len < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%" PRId64, i ? ", " : "", shape[i]);
    if (len < cap) snprintf(buf + len, cap - len, "]");
    return buf;
}

/* ---- reader ------------------------------------------------------------ */

/* One header entry after validation; name borrows from the JSON tree. */
typedef struct st_entry_ {
    const char *name;
    size_t header_index; /* position in the header, breaks offset ties */
    zdp_dtype dtype;
    int ndim;
    int64_t shape[ZDP_MAX_DIMS];
    uint64_t begin, end; /* data_offsets */
} st_entry_;

/* Reads exactly n bytes at off; false (errno set, 0 meaning end of file) on
 * a short read, so a file that shrinks while we read is an error, not junk. */
static bool st_pread_full_(int fd, void *buf, size_t n, off_t off) {
    char *p = buf;
    while (n > 0) {
        ssize_t got = pread(fd, p, n, off);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            if (got == 0) errno = 0;
            return false;
        }
        p += got;
        n -= (size_t)got;
        off += got;
    }
    return true;
}

static zdp_status st_read_error_(zdp_error *err, const char *path, const char *what) {
    if (errno == 0)
        return zdp_err_set(err, ZDP_ERR_IO,
                           "%s: %s: unexpected end of file (was the file changed while it "
                           "was read?)", path, what);
    return zdp_err_set(err, ZDP_ERR_IO, "%s: %s: %s", path, what, strerror(errno));
}

static zdp_status st_parse_dtype_(const char *path, const char *name, json_t *v,
                                  zdp_dtype *out, zdp_error *err) {
    if (!json_is_string(v))
        return zdp_err_set(err, ZDP_ERR_FORMAT,
                           "%s: tensor \"%s\": dtype is %s, expected a string (one of "
                           ST_DTYPE_LIST ")", path, name, zdp_json_type_name(v));
    const char *s = json_string_value(v);
    for (int t = 0; t < ST_NDTYPES; t++) {
        if (strcmp(s, st_dtypes_[t].name) == 0) {
            *out = (zdp_dtype)t;
            return ZDP_OK;
        }
    }
    return zdp_err_set(err, ZDP_ERR_FORMAT,
                       "%s: tensor \"%s\": dtype \"%s\" is not supported; zdp reads "
                       ST_DTYPE_LIST, path, name, s);
}

static zdp_status st_parse_shape_(const char *path, const char *name, json_t *v,
                                  st_entry_ *e, zdp_error *err) {
    if (!json_is_array(v))
        return zdp_err_set(err, ZDP_ERR_FORMAT,
                           "%s: tensor \"%s\": shape is %s, expected an array of "
                           "non-negative integers", path, name, zdp_json_type_name(v));
    size_t ndim = json_array_size(v);
    if (ndim > ZDP_MAX_DIMS)
        return zdp_err_set(err, ZDP_ERR_FORMAT,
                           "%s: tensor \"%s\": shape has %zu dimensions, but zdp supports at "
                           "most ZDP_MAX_DIMS = %d", path, name, ndim, ZDP_MAX_DIMS);
    e->ndim = (int)ndim;
    for (size_t i = 0; i < ndim; i++) {
        json_t *d = json_array_get(v, i);
        if (!json_is_integer(d))
            return zdp_err_set(err, ZDP_ERR_FORMAT,
                               "%s: tensor \"%s\": shape[%zu] is %s, expected a non-negative "
                               "integer", path, name, i, zdp_json_type_name(d));
        json_int_t x = json_integer_value(d);
        if (x < 0)
            return zdp_err_set(err, ZDP_ERR_FORMAT,
                               "%s: tensor \"%s\": shape[%zu] is %lld, expected a "
                               "non-negative integer", path, name, i, (long long)x);
        e->shape[i] = (int64_t)x;
    }
    return ZDP_OK;
}

static zdp_status st_parse_offsets_(const char *path, const char *name, json_t *v,
                                    uint64_t data_bytes, st_entry_ *e, zdp_error *err) {
    if (!json_is_array(v) || json_array_size(v) != 2)
        return zdp_err_set(err, ZDP_ERR_FORMAT,
                           "%s: tensor \"%s\": data_offsets is %s%s, expected [begin, end] "
                           "(two non-negative integers)", path, name, zdp_json_type_name(v),
                           json_is_array(v) ? " of the wrong length" : "");
    json_int_t be[2];
    for (size_t i = 0; i < 2; i++) {
        json_t *x = json_array_get(v, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0)
            return zdp_err_set(err, ZDP_ERR_FORMAT,
                               "%s: tensor \"%s\": data_offsets[%zu] is %s, expected a "
                               "non-negative integer", path, name, i,
                               json_is_integer(x) ? "negative" : zdp_json_type_name(x));
        be[i] = json_integer_value(x);
    }
    e->begin = (uint64_t)be[0];
    e->end = (uint64_t)be[1];
    if (e->begin > e->end)
        return zdp_err_set(err, ZDP_ERR_FORMAT,
                           "%s: tensor \"%s\": data_offsets [%" PRIu64 ", %" PRIu64 "] has "
                           "begin > end; the file is corrupt", path, name, e->begin, e->end);
    if (e->end > data_bytes)
        return zdp_err_set(err, ZDP_ERR_FORMAT,
                           "%s: tensor \"%s\": data_offsets [%" PRIu64 ", %" PRIu64 "] end "
                           "past the data section, which has %" PRIu64 " bytes; the file is "
                           "truncated or corrupt", path, name, e->begin, e->end, data_bytes);
    return ZDP_OK;
}

/* Validates one header entry against the data section's size. */
static zdp_status st_parse_entry_(const char *path, const char *name, json_t *v,
                                  uint64_t data_bytes, st_entry_ *e, zdp_error *err) {
    if (!json_is_object(v))
        return zdp_err_set(err, ZDP_ERR_FORMAT,
                           "%s: tensor \"%s\": entry is %s, expected an object with dtype, "
                           "shape and data_offsets", path, name, zdp_json_type_name(v));
    const char *key;
    json_t *field;
    json_object_foreach(v, key, field) {
        if (strcmp(key, "dtype") != 0 && strcmp(key, "shape") != 0 &&
            strcmp(key, "data_offsets") != 0)
            return zdp_err_set(err, ZDP_ERR_FORMAT,
                               "%s: tensor \"%s\": unexpected field \"%s\"; an entry has "
                               "exactly dtype, shape and data_offsets", path, name, key);
    }
    static const char *const required[] = {"dtype", "shape", "data_offsets"};
    for (size_t i = 0; i < 3; i++) {
        if (json_object_get(v, required[i]) == NULL)
            return zdp_err_set(err, ZDP_ERR_FORMAT,
                               "%s: tensor \"%s\": missing field \"%s\"; an entry has "
                               "exactly dtype, shape and data_offsets", path, name, required[i]);
    }
    e->name = name;
    zdp_status s = st_parse_dtype_(path, name, json_object_get(v, "dtype"), &e->dtype, err);
    if (s == ZDP_OK) s = st_parse_shape_(path, name, json_object_get(v, "shape"), e, err);
    if (s == ZDP_OK)
        s = st_parse_offsets_(path, name, json_object_get(v, "data_offsets"), data_bytes, e, err);
    if (s != ZDP_OK) return s;

    char shp[128];
    uint64_t need;
    if (!st_nbytes_(e->shape, e->ndim, st_dtypes_[e->dtype].size, &need))
        return zdp_err_set(err, ZDP_ERR_FORMAT,
                           "%s: tensor \"%s\": dtype %s shape %s needs more than 2^64 bytes "
                           "(overflow); the file is corrupt", path, name,
                           st_dtypes_[e->dtype].name, zdp_io_shape_str(e->shape, e->ndim, shp, sizeof shp));
    if (e->end - e->begin != need)
        return zdp_err_set(err, ZDP_ERR_FORMAT,
                           "%s: tensor \"%s\": data_offsets [%" PRIu64 ", %" PRIu64 "] span "
                           "%" PRIu64 " bytes but dtype %s shape %s needs %" PRIu64 "; the "
                           "file is corrupt or was written by a buggy tool", path, name,
                           e->begin, e->end, e->end - e->begin, st_dtypes_[e->dtype].name,
                           zdp_io_shape_str(e->shape, e->ndim, shp, sizeof shp), need);
    return ZDP_OK;
}

/* "__metadata__" is free-form for other tools, but the format says
 * string -> string; anything else means the header is not what we think. */
static zdp_status st_check_metadata_(const char *path, json_t *v, zdp_error *err) {
    if (!json_is_object(v))
        return zdp_err_set(err, ZDP_ERR_FORMAT,
                           "%s: " ST_METADATA_KEY " is %s, expected an object of string "
                           "values", path, zdp_json_type_name(v));
    const char *key;
    json_t *val;
    json_object_foreach(v, key, val) {
        if (!json_is_string(val))
            return zdp_err_set(err, ZDP_ERR_FORMAT,
                               "%s: " ST_METADATA_KEY ".\"%s\" is %s, expected a string",
                               path, key, zdp_json_type_name(val));
    }
    return ZDP_OK;
}

/* Offset order; empty tensors sort before a tensor starting where they do,
 * and header order settles exact ties so the result is deterministic. */
static int st_entry_cmp_(const void *pa, const void *pb) {
    const st_entry_ *a = pa, *b = pb;
    if (a->begin != b->begin) return a->begin < b->begin ? -1 : 1;
    if (a->end != b->end) return a->end < b->end ? -1 : 1;
    return a->header_index < b->header_index ? -1 : a->header_index > b->header_index;
}

static void st_tensors_free_(zdp_tensor *t, int n) {
    if (t == NULL) return;
    for (int i = 0; i < n; i++) {
        free(t[i].name);
        free(t[i].data);
    }
    free(t);
}

/* Checks the file and reads its JSON header into *header (malloc'd, the
 * caller frees it; not NUL-terminated), with its length and the length of
 * the data section that follows it. */
static zdp_status st_read_header_(int fd, const char *path, char **header,
                                  uint64_t *header_len, uint64_t *data_len, zdp_error *err) {
    struct stat sb;
    if (fstat(fd, &sb) != 0)
        return zdp_err_set(err, ZDP_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return zdp_err_set(err, ZDP_ERR_IO, "%s: not a regular file", path);
    uint64_t file_bytes = (uint64_t)sb.st_size;
    if (file_bytes < 8)
        return zdp_err_set(err, ZDP_ERR_FORMAT,
                           "%s: file is %" PRIu64 " bytes, shorter than the 8-byte header "
                           "length; it is truncated or not a safetensors file", path,
                           file_bytes);

    unsigned char len_le[8];
    if (!st_pread_full_(fd, len_le, sizeof len_le, 0))
        return st_read_error_(err, path, "reading the header length");
    uint64_t header_bytes = 0;
    for (int i = 7; i >= 0; i--) header_bytes = (header_bytes << 8) | len_le[i];
    if (header_bytes > ST_MAX_HEADER_BYTES)
        return zdp_err_set(err, ZDP_ERR_FORMAT,
                           "%s: header length %" PRIu64 " bytes is over the %llu-byte limit; "
                           "this is not a safetensors file or it is corrupt", path,
                           header_bytes, ST_MAX_HEADER_BYTES);
    if (header_bytes > file_bytes - 8)
        return zdp_err_set(err, ZDP_ERR_FORMAT,
                           "%s: header length %" PRIu64 " bytes but only %" PRIu64 " bytes "
                           "follow the 8-byte length; the file is truncated or not a "
                           "safetensors file", path, header_bytes, file_bytes - 8);

    char *h = malloc(header_bytes > 0 ? (size_t)header_bytes : 1);
    if (h == NULL)
        return zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory for the %" PRIu64
                           "-byte header", path, header_bytes);
    if (!st_pread_full_(fd, h, (size_t)header_bytes, 8)) {
        free(h);
        return st_read_error_(err, path, "reading the header");
    }
    *header = h;
    *header_len = header_bytes;
    *data_len = file_bytes - 8 - header_bytes;
    return ZDP_OK;
}

/* Parses the header into *root and validates every entry into *entries
 * (calloc'd, the caller frees it before *root: the names borrow from it).
 * *n counts the entries filled so far, also on error. */
static zdp_status st_parse_header_(const char *path, const char *header, uint64_t header_bytes,
                                   uint64_t data_bytes, json_t **root, st_entry_ **entries,
                                   size_t *n, zdp_error *err) {
    /* DECODE_ANY so that a non-object header gets our message, not
     * jansson's; REJECT_DUPLICATES because two entries with one name would
     * silently lose a tensor.  Trailing padding spaces are plain JSON
     * whitespace. */
    json_error_t jerr;
    json_t *r = json_loadb(header, (size_t)header_bytes, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY,
                           &jerr);
    *root = r;
    if (r == NULL)
        return zdp_err_set(err, ZDP_ERR_FORMAT,
                           "%s: header is not valid JSON: %s (line %d, column %d, byte %d of "
                           "the header)%s", path, jerr.text, jerr.line, jerr.column,
                           jerr.position,
                           json_error_code(&jerr) == json_error_duplicate_key
                               ? "; two tensors (or two fields of one entry) share a name"
                               : "");
    if (!json_is_object(r))
        return zdp_err_set(err, ZDP_ERR_FORMAT,
                           "%s: header is %s, expected an object mapping tensor names to "
                           "{dtype, shape, data_offsets}", path, zdp_json_type_name(r));

    size_t n_keys = json_object_size(r);
    st_entry_ *e = calloc(n_keys > 0 ? n_keys : 1, sizeof *e);
    *entries = e;
    if (e == NULL)
        return zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory for %zu header entries",
                           path, n_keys);
    const char *key;
    json_t *val;
    json_object_foreach(r, key, val) {
        zdp_status s;
        if (strcmp(key, ST_METADATA_KEY) == 0) {
            s = st_check_metadata_(path, val, err);
        } else {
            e[*n].header_index = *n;
            s = st_parse_entry_(path, key, val, data_bytes, &e[*n], err);
            (*n)++;
        }
        if (s != ZDP_OK) return s;
    }
    if (*n > (size_t)INT32_MAX)
        return zdp_err_set(err, ZDP_ERR_FORMAT, "%s: %zu tensors, more than zdp can index",
                           path, *n);
    return ZDP_OK;
}

/* Sorts the entries by offset and refuses any two that share bytes. */
static zdp_status st_check_overlaps_(const char *path, st_entry_ *entries, size_t n,
                                     zdp_error *err) {
    qsort(entries, n, sizeof *entries, st_entry_cmp_);
    /* Sorted by begin, a tensor overlaps an earlier one exactly when it
     * starts before the furthest end seen so far. */
    size_t furthest = 0;
    for (size_t i = 1; i < n; i++) {
        const st_entry_ *prev = &entries[furthest], *e = &entries[i];
        if (e->begin < prev->end)
            return zdp_err_set(err, ZDP_ERR_FORMAT,
                               "%s: tensor \"%s\": data_offsets [%" PRIu64 ", %" PRIu64 "] "
                               "overlap tensor \"%s\" at [%" PRIu64 ", %" PRIu64 "]; every "
                               "tensor needs its own bytes, so the file is corrupt or was "
                               "written by a buggy tool", path, e->name, e->begin, e->end,
                               prev->name, prev->begin, prev->end);
        if (e->end > prev->end) furthest = i;
    }
    return ZDP_OK;
}

/* Reads the n tensors' data into tensors[0..n) (calloc'd by the caller). */
static zdp_status st_read_tensors_(int fd, const char *path, uint64_t header_bytes,
                                   const st_entry_ *entries, size_t n, zdp_tensor *tensors,
                                   zdp_error *err) {
    for (size_t i = 0; i < n; i++) {
        const st_entry_ *e = &entries[i];
        zdp_tensor *t = &tensors[i];
        size_t nbytes = (size_t)(e->end - e->begin);
        t->name = strdup(e->name);
        /* Never NULL, even when empty, so callers may always pass data on. */
        t->data = malloc(nbytes > 0 ? nbytes : 1);
        if (t->name == NULL || t->data == NULL)
            return zdp_err_set(err, ZDP_ERR_NOMEM, "%s: tensor \"%s\": out of memory for %zu "
                               "bytes", path, e->name, nbytes);
        t->dtype = e->dtype;
        t->ndim = e->ndim;
        memcpy(t->shape, e->shape, sizeof t->shape);
        t->nbytes = nbytes;
        if (!st_pread_full_(fd, t->data, nbytes, (off_t)(8 + header_bytes + e->begin))) {
            char what[256];
            snprintf(what, sizeof what, "reading tensor \"%s\"", e->name);
            return st_read_error_(err, path, what);
        }
    }
    return ZDP_OK;
}

/* Header-only: each tensor's metadata, data NULL, and *offsets (malloc'd)
 * the file offset of its bytes. */
static void st_header_only_(const st_entry_ *entries, size_t n, uint64_t header_bytes,
                            zdp_tensor *tensors, uint64_t *offsets) {
    for (size_t i = 0; i < n; i++) {
        const st_entry_ *e = &entries[i];
        zdp_tensor *t = &tensors[i];
        t->dtype = e->dtype;
        t->ndim = e->ndim;
        memcpy(t->shape, e->shape, sizeof t->shape);
        t->nbytes = (size_t)(e->end - e->begin);
        offsets[i] = 8 + header_bytes + e->begin;
    }
}

static zdp_status st_read_(const char *path, zdp_safetensors *out, uint64_t **offsets,
                           zdp_error *err);

zdp_status zdp_safetensors_read(const char *path, zdp_safetensors *out, zdp_error *err) {
    return st_read_(path, out, NULL, err);
}

zdp_status zdp_safetensors_read_header(const char *path, zdp_safetensors *out,
                                       uint64_t **offsets, zdp_error *err) {
    if (offsets == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_safetensors_read_header: offsets is NULL");
    *offsets = NULL;
    return st_read_(path, out, offsets, err);
}

/* The whole file, or with offsets its header alone. */
static zdp_status st_read_(const char *path, zdp_safetensors *out, uint64_t **offsets,
                           zdp_error *err) {
    if (out == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_safetensors_read: out is NULL");
    out->n = 0;
    out->tensors = NULL;
    if (path == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_safetensors_read: path is NULL");

    char *header = NULL;
    json_t *root = NULL;
    st_entry_ *entries = NULL;
    zdp_tensor *tensors = NULL;
    size_t n = 0;
    uint64_t header_bytes = 0, data_bytes = 0;

    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return zdp_err_set(err, ZDP_ERR_IO, "%s: cannot open for reading: %s", path,
                           strerror(errno));
    zdp_status s = st_read_header_(fd, path, &header, &header_bytes, &data_bytes, err);
    if (s == ZDP_OK)
        s = st_parse_header_(path, header, header_bytes, data_bytes, &root, &entries, &n, err);
    if (s == ZDP_OK) s = st_check_overlaps_(path, entries, n, err);
    if (s == ZDP_OK) {
        tensors = calloc(n > 0 ? n : 1, sizeof *tensors);
        if (tensors == NULL)
            s = zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory for %zu tensors", path, n);
    }
    if (s == ZDP_OK && offsets != NULL) {
        /* The names are strdup'd here too: they outlive the header. */
        *offsets = malloc((n > 0 ? n : 1) * sizeof **offsets);
        if (*offsets == NULL)
            s = zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory for %zu tensors", path, n);
        for (size_t i = 0; s == ZDP_OK && i < n; i++)
            if ((tensors[i].name = strdup(entries[i].name)) == NULL)
                s = zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory", path);
        if (s == ZDP_OK) st_header_only_(entries, n, header_bytes, tensors, *offsets);
        if (s != ZDP_OK) {
            free(*offsets);
            *offsets = NULL;
        }
    } else if (s == ZDP_OK) {
        s = st_read_tensors_(fd, path, header_bytes, entries, n, tensors, err);
    }
    if (s == ZDP_OK) {
        out->n = (int)n;
        out->tensors = tensors;
        tensors = NULL;
    }
    st_tensors_free_(tensors, (int)n);
    free(entries); /* before root: entries borrow names from it */
    json_decref(root);
    free(header);
    close(fd);
    return s;
}

const zdp_tensor *zdp_safetensors_find(const zdp_safetensors *st, const char *name) {
    if (st == NULL || name == NULL) return NULL;
    for (int i = 0; i < st->n; i++) {
        if (strcmp(st->tensors[i].name, name) == 0) return &st->tensors[i];
    }
    return NULL;
}

void zdp_safetensors_free(zdp_safetensors *st) {
    if (st == NULL) return;
    st_tensors_free_(st->tensors, st->n);
    st->n = 0;
    st->tensors = NULL;
}

/* ---- writer ------------------------------------------------------------ */

static bool st_write_full_(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n > 0) {
        ssize_t put = write(fd, p, n);
        if (put < 0 && errno == EINTR) continue;
        if (put <= 0) {
            if (put == 0) errno = EIO;
            return false;
        }
        p += put;
        n -= (size_t)put;
    }
    return true;
}

/* Checks tensor i and appends its header entry; *offset advances by its
 * bytes.  root doubles as the set of names seen so far. */
/* filled: the data comes from a fill function, so it may be NULL here. */
static zdp_status st_add_entry_(json_t *root, const zdp_tensor *tensors, int i,
                                uint64_t *offset, const char *path, bool filled,
                                zdp_error *err) {
    const zdp_tensor *t = &tensors[i];
    if (t->name == NULL || t->name[0] == '\0')
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "%s: tensors[%d]: name is empty; every tensor needs a unique, "
                           "non-empty name", path, i);
    if (strcmp(t->name, ST_METADATA_KEY) == 0)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "%s: tensors[%d]: name \"" ST_METADATA_KEY "\" is reserved by the "
                           "format for metadata; rename the tensor", path, i);
    if (json_object_get(root, t->name) != NULL) {
        int first = 0;
        while (strcmp(tensors[first].name, t->name) != 0) first++;
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "%s: tensors[%d]: name \"%s\" is also the name of tensors[%d]; "
                           "names must be unique", path, i, t->name, first);
    }
    if (!st_dtype_valid_(t->dtype))
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "%s: tensor \"%s\": dtype %d is not a zdp_dtype (supported: "
                           ST_DTYPE_LIST ")", path, t->name, (int)t->dtype);
    if (t->ndim < 0 || t->ndim > ZDP_MAX_DIMS)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "%s: tensor \"%s\": ndim %d, expected 0..ZDP_MAX_DIMS (%d)", path,
                           t->name, t->ndim, ZDP_MAX_DIMS);
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] < 0)
            return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                               "%s: tensor \"%s\": shape[%d] is %" PRId64 ", expected >= 0",
                               path, t->name, d, t->shape[d]);
    }
    char shp[128];
    uint64_t need;
    if (!st_nbytes_(t->shape, t->ndim, st_dtypes_[t->dtype].size, &need))
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "%s: tensor \"%s\": dtype %s shape %s needs more than 2^64 bytes",
                           path, t->name, st_dtypes_[t->dtype].name,
                           zdp_io_shape_str(t->shape, t->ndim, shp, sizeof shp));
    if ((uint64_t)t->nbytes != need)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "%s: tensor \"%s\": nbytes is %zu but dtype %s shape %s needs %"
                           PRIu64, path, t->name, t->nbytes, st_dtypes_[t->dtype].name,
                           zdp_io_shape_str(t->shape, t->ndim, shp, sizeof shp), need);
    if (!filled && t->data == NULL && t->nbytes > 0)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "%s: tensor \"%s\": data is NULL", path,
                           t->name);
    /* JSON integers are signed 64-bit: keep offsets representable. */
    if (need > (uint64_t)INT64_MAX - *offset)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "%s: tensor \"%s\": the data section would exceed 2^63 bytes", path,
                           t->name);

    json_t *shape = json_array();
    json_t *entry = json_object();
    json_t *name_check = json_string(t->name); /* NULL if not valid UTF-8 */
    bool ok = shape != NULL && entry != NULL && name_check != NULL;
    for (int d = 0; ok && d < t->ndim; d++)
        ok = json_array_append_new(shape, json_integer((json_int_t)t->shape[d])) == 0;
    ok = ok &&
         json_object_set_new(entry, "dtype", json_string(st_dtypes_[t->dtype].name)) == 0 &&
         json_object_set(entry, "shape", shape) == 0 &&
         json_object_set_new(entry, "data_offsets",
                             json_pack("[II]", (json_int_t)*offset,
                                       (json_int_t)(*offset + need))) == 0 &&
         json_object_set(root, t->name, entry) == 0;
    bool bad_utf8 = name_check == NULL && shape != NULL && entry != NULL;
    json_decref(shape);
    json_decref(entry);
    json_decref(name_check);
    if (bad_utf8)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "%s: tensors[%d]: name is not valid UTF-8, which the JSON header "
                           "requires", path, i);
    if (!ok)
        return zdp_err_set(err, ZDP_ERR_NOMEM, "%s: tensor \"%s\": out of memory building "
                           "the header", path, t->name);
    *offset += need;
    return ZDP_OK;
}

/* Makes the rename itself durable; best effort, since the data is already
 * safe under the temporary name's inode and some filesystems refuse. */
static void st_fsync_parent_(const char *path) {
    const char *slash = strrchr(path, '/');
    char *dir = slash == NULL ? strdup(".") : strndup(path, slash == path ? 1 : (size_t)(slash - path));
    if (dir == NULL) return;
    int dfd = open(dir, O_RDONLY | O_CLOEXEC);
    if (dfd >= 0) {
        (void)fsync(dfd);
        close(dfd);
    }
    free(dir);
}

zdp_status zdp_safetensors_write(const char *path, const zdp_tensor *tensors, int n,
                                 zdp_error *err) {
    return zdp_safetensors_write_meta(path, tensors, n, NULL, 0, err);
}

static zdp_status st_write_(const char *path, const zdp_tensor *tensors, int n,
                           const char *const *meta, int n_meta, zdp_io_fill_fn fill, void *ctx,
                           zdp_error *err);

zdp_status zdp_safetensors_write_meta(const char *path, const zdp_tensor *tensors, int n,
                                      const char *const *meta, int n_meta, zdp_error *err) {
    return st_write_(path, tensors, n, meta, n_meta, NULL, NULL, err);
}

zdp_status zdp_safetensors_write_fill(const char *path, const zdp_tensor *tensors, int n,
                                      const char *const *meta, int n_meta, zdp_io_fill_fn fill,
                                      void *ctx, zdp_error *err) {
    if (fill == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "%s: zdp_safetensors_write_fill: fill is NULL",
                           path != NULL ? path : "(null)");
    return st_write_(path, tensors, n, meta, n_meta, fill, ctx, err);
}

/* With fill, tensor i's bytes come from fill into one buffer of the largest
 * tensor's size, just before they are written. */
static zdp_status st_write_(const char *path, const zdp_tensor *tensors, int n,
                           const char *const *meta, int n_meta, zdp_io_fill_fn fill, void *ctx,
                           zdp_error *err) {
    if (path == NULL || path[0] == '\0')
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_safetensors_write: path is empty");
    if (n < 0 || (n > 0 && tensors == NULL))
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "%s: zdp_safetensors_write: n = %d with tensors %s", path, n,
                           tensors == NULL ? "NULL" : "non-NULL");

    zdp_status s = ZDP_OK;
    char *json_text = NULL, *head = NULL, *tmp = NULL;
    void *one = NULL; /* fill's buffer */
    int fd = -1;
    bool created = false; /* the temp file is ours to remove */
    json_t *root = json_object();
    if (root == NULL) return zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory", path);

    /* "__metadata__" first, as Python's safetensors writes it. */
    if (n_meta > 0) {
        json_t *md = json_object();
        bool ok = md != NULL && meta != NULL;
        for (int k = 0; ok && k < n_meta; k++) {
            json_t *val = meta[2 * k] && meta[2 * k + 1] ? json_string(meta[2 * k + 1]) : NULL;
            ok = val != NULL && json_object_set_new(md, meta[2 * k], val) == 0;
        }
        if (!ok || json_object_set_new(root, ST_METADATA_KEY, md) != 0) {
            if (!ok) json_decref(md);
            s = zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                            "%s: metadata: every key and value must be a non-NULL UTF-8 string",
                            path);
            goto done;
        }
    }
    uint64_t offset = 0;
    for (int i = 0; i < n; i++) {
        s = st_add_entry_(root, tensors, i, &offset, path, fill != NULL, err);
        if (s != ZDP_OK) goto done;
    }

    /* Compact and in insertion order, so the header matches the layout. */
    json_text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (json_text == NULL) {
        s = zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory serialising the header", path);
        goto done;
    }
    size_t json_len = strlen(json_text);
    /* 8 + N is then a multiple of 8, so 8-byte elements start aligned. */
    size_t header_len = (json_len + 7) & ~(size_t)7;
    head = malloc(8 + header_len);
    if (head == NULL) {
        s = zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory for the header", path);
        goto done;
    }
    for (int b = 0; b < 8; b++) head[b] = (char)(((uint64_t)header_len >> (8 * b)) & 0xff);
    memcpy(head + 8, json_text, json_len);
    memset(head + 8 + json_len, ' ', header_len - json_len);

    size_t tmp_cap = strlen(path) + 32;
    tmp = malloc(tmp_cap);
    if (tmp == NULL) {
        s = zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    snprintf(tmp, tmp_cap, "%s.tmp.%ld", path, (long)getpid());
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        s = zdp_err_set(err, ZDP_ERR_IO, "%s: cannot create the temporary file %s: %s", path,
                        tmp, strerror(errno));
        goto done;
    }
    created = true;
    if (!st_write_full_(fd, head, 8 + header_len)) {
        s = zdp_err_set(err, ZDP_ERR_IO, "%s: writing the header to %s: %s", path, tmp,
                        strerror(errno));
        goto done;
    }
    size_t largest = 1;
    for (int i = 0; fill != NULL && i < n; i++)
        if (tensors[i].nbytes > largest) largest = tensors[i].nbytes;
    if (fill != NULL && (one = malloc(largest)) == NULL) {
        s = zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory for a %zu-byte tensor", path, largest);
        goto done;
    }
    for (int i = 0; i < n; i++) {
        if (fill != NULL && (s = fill(ctx, i, one, err)) != ZDP_OK) goto done;
        if (!st_write_full_(fd, fill != NULL ? one : tensors[i].data, tensors[i].nbytes)) {
            s = zdp_err_set(err, ZDP_ERR_IO, "%s: writing tensor \"%s\" to %s: %s", path,
                            tensors[i].name, tmp, strerror(errno));
            goto done;
        }
    }
    /* Data must be on disk before the rename publishes it, or a crash could
     * leave the real name pointing at an empty or partial file. */
    if (fsync(fd) != 0) {
        s = zdp_err_set(err, ZDP_ERR_IO, "%s: fsync of %s: %s", path, tmp, strerror(errno));
        goto done;
    }
    int rc = close(fd);
    fd = -1;
    if (rc != 0) {
        s = zdp_err_set(err, ZDP_ERR_IO, "%s: closing %s: %s", path, tmp, strerror(errno));
        goto done;
    }
    if (rename(tmp, path) != 0) {
        s = zdp_err_set(err, ZDP_ERR_IO, "%s: cannot rename %s into place: %s", path, tmp,
                        strerror(errno));
        goto done;
    }
    st_fsync_parent_(path);

done:
    if (fd >= 0) close(fd);
    /* After a successful rename the temp name no longer exists. */
    if (s != ZDP_OK && created) unlink(tmp);
    free(one);
    free(tmp);
    free(head);
    free(json_text);
    json_decref(root);
    return s;
}
