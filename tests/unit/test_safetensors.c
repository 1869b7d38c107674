/*
 * test_safetensors.c -- unit tests for src/safetensors/safetensors.c.
 *
 * Round trips over every dtype (with a 0-d scalar and an empty tensor), a
 * byte-exact comparison with a file built by hand here, every reader
 * validation on files crafted byte by byte (the message must name the
 * tensor and field), truncation and byte corruption at every position (must
 * fail cleanly, never crash or leak), and writer argument / I/O errors with
 * no temporary file left behind.  Files live in a fresh mkdtemp directory
 * that teardown removes.  Not here: compatibility with files from the
 * Python library (that needs fixtures from Python).
 *
 * Build alone (the rest of libzdp may be in flux):
 *   gcc -std=c11 -Wall -Wextra -g -fsanitize=address,undefined -Iinclude -Isrc \
 *       src/safetensors/safetensors.c src/core/core.c src/comm/comm_mpi.c \
 *       tests/unit/test_safetensors.c $(pkg-config --cflags --libs jansson) \
 *       $(mpicc --showme:compile) $(mpicc --showme:link) -lcmocka -lm
 */
#define _POSIX_C_SOURCE 200809L

#include <dirent.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/unit_io.h"
#include "zdp/zdp.h"

/* ---- fixtures and helpers ---------------------------------------------- */

static int group_setup(void **state) {
    (void)state;
    return tmpdir_make(g_dir, sizeof g_dir, "st");
}

static int group_teardown(void **state) {
    (void)state;
    return tmpdir_remove(g_dir);
}

/* Reads a whole file into a malloc'd buffer; *n gets its size. */
static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    long len = ftell(f);
    assert_true(len >= 0);
    rewind(f);
    unsigned char *buf = malloc((size_t)len + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    *n = (size_t)len;
    return buf;
}

static void put_u64le(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* A safetensors file: u64 length of `header`, header, then data_len bytes
 * of pattern.  header_len_override (if not UINT64_MAX) replaces the length. */
static void write_st_len(const char *path, const char *header, size_t data_len,
                         uint64_t header_len_override) {
    size_t hl = strlen(header);
    unsigned char *buf = malloc(8 + hl + data_len + 1);
    assert_non_null(buf);
    put_u64le(buf, header_len_override != UINT64_MAX ? header_len_override : hl);
    memcpy(buf + 8, header, hl);
    for (size_t i = 0; i < data_len; i++) buf[8 + hl + i] = (unsigned char)(i * 7 + 1);
    write_bytes(path, buf, 8 + hl + data_len);
    free(buf);
}

static void write_st(const char *path, const char *header, size_t data_len) {
    write_st_len(path, header, data_len, UINT64_MAX);
}

#define assert_contains(hay, needle)                                             \
    do {                                                                         \
        if (strstr((hay), (needle)) == NULL)                                     \
            fail_msg("expected \"%s\" in message:\n  %s", (needle), (hay));      \
    } while (0)

/* Reads path expecting `code`; out must come back empty; returns err.msg
 * (static storage). */
static const char *read_expect(const char *path, zdp_status code) {
    static zdp_error err;
    zdp_safetensors st = {.n = 7, .tensors = (zdp_tensor *)&err}; /* garbage in */
    memset(&err, 0, sizeof err);
    zdp_status s = zdp_safetensors_read(path, &st, &err);
    if (s != code)
        fail_msg("status %d (%s), expected %d; message: %s", s, zdp_status_name(s), code,
                 err.msg);
    assert_int_equal(err.code, code);
    assert_int_equal(st.n, 0);
    assert_null(st.tensors);
    return err.msg;
}

/* Number of "<x>.tmp.<pid>" leftovers in the test directory. */
static int count_temp_files(void) {
    DIR *d = opendir(g_dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strstr(e->d_name, ".tmp.") != NULL) n++;
    closedir(d);
    return n;
}

static bool file_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* ---- round trips --------------------------------------------------------- */

static zdp_tensor make_tensor(const char *name, zdp_dtype dt, int ndim, const int64_t *shape,
                              unsigned seed) {
    zdp_tensor t = {.name = (char *)name, .dtype = dt, .ndim = ndim};
    size_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        t.shape[i] = shape[i];
        numel *= (size_t)shape[i];
    }
    t.nbytes = numel * zdp_dtype_size(dt);
    unsigned char *p = malloc(t.nbytes > 0 ? t.nbytes : 1);
    assert_non_null(p);
    for (size_t i = 0; i < t.nbytes; i++) p[i] = (unsigned char)(seed + i * 31);
    t.data = p;
    return t;
}

static void assert_tensor_equal(const zdp_tensor *got, const zdp_tensor *want) {
    assert_string_equal(got->name, want->name);
    assert_int_equal(got->dtype, want->dtype);
    assert_int_equal(got->ndim, want->ndim);
    for (int i = 0; i < want->ndim; i++) assert_int_equal(got->shape[i], want->shape[i]);
    assert_int_equal(got->nbytes, want->nbytes);
    assert_non_null(got->data); /* even when empty */
    if (want->nbytes > 0) assert_memory_equal(got->data, want->data, want->nbytes);
}

static void test_roundtrip_dtypes(void **state) {
    (void)state;
    const int64_t s23[] = {2, 3}, s4[] = {4}, s1112[] = {1, 1, 1, 2}, s05[] = {0, 5},
                  s7[] = {7}, s22[] = {2, 2}, s3[] = {3}, s213[] = {2, 1, 3};
    zdp_tensor in[] = {
        make_tensor("layer.0.weight", ZDP_DTYPE_F32, 2, s23, 1),
        make_tensor("scalar", ZDP_DTYPE_F64, 0, NULL, 2),
        make_tensor("bytes", ZDP_DTYPE_U8, 1, s7, 3), /* odd size: misaligns what follows */
        make_tensor("ids", ZDP_DTYPE_I64, 1, s4, 4),
        make_tensor("empty", ZDP_DTYPE_I32, 2, s05, 5),
        make_tensor("u16", ZDP_DTYPE_U16, 4, s1112, 6),
        make_tensor("bf16", ZDP_DTYPE_BF16, 1, s3, 7),
        make_tensor("f16", ZDP_DTYPE_F16, 2, s22, 8),
        make_tensor("i32", ZDP_DTYPE_I32, 3, s213, 9),
    };
    int n = (int)(sizeof in / sizeof in[0]);
    const char *path = path_in("rt.safetensors");
    zdp_error err;
    assert_int_equal(zdp_safetensors_write(path, in, n, &err), ZDP_OK);

    /* The data section starts 8-byte aligned, the padding is spaces. */
    size_t len;
    unsigned char *raw = slurp(path, &len);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | raw[i];
    assert_int_equal((8 + hl) % 8, 0);
    assert_int_equal(raw[8], '{');
    size_t last = 8 + (size_t)hl - 1;
    while (raw[last] == ' ') last--;
    assert_int_equal(raw[last], '}');
    assert_true(8 + (size_t)hl - 1 - last < 8);
    size_t total = 0;
    for (int i = 0; i < n; i++) total += in[i].nbytes;
    assert_int_equal(len, 8 + hl + total);
    free(raw);

    zdp_safetensors st;
    assert_int_equal(zdp_safetensors_read(path, &st, &err), ZDP_OK);
    assert_int_equal(st.n, n);
    for (int i = 0; i < n; i++) assert_tensor_equal(&st.tensors[i], &in[i]);
    zdp_safetensors_free(&st);
    assert_int_equal(st.n, 0);
    assert_null(st.tensors);

    for (int i = 0; i < n; i++) free(in[i].data);
}

static void test_roundtrip_empty_set_and_overwrite(void **state) {
    (void)state;
    const char *path = path_in("empty.safetensors");
    zdp_error err;
    zdp_safetensors st;
    assert_int_equal(zdp_safetensors_write(path, NULL, 0, &err), ZDP_OK);
    assert_int_equal(zdp_safetensors_read(path, &st, &err), ZDP_OK);
    assert_int_equal(st.n, 0);
    zdp_safetensors_free(&st);

    /* Overwriting an existing file replaces it whole. */
    const int64_t s2[] = {2};
    zdp_tensor t = make_tensor("a", ZDP_DTYPE_F32, 1, s2, 11);
    assert_int_equal(zdp_safetensors_write(path, &t, 1, &err), ZDP_OK);
    assert_int_equal(zdp_safetensors_read(path, &st, &err), ZDP_OK);
    assert_int_equal(st.n, 1);
    assert_tensor_equal(&st.tensors[0], &t);
    zdp_safetensors_free(&st);
    free(t.data);
    assert_int_equal(count_temp_files(), 0);
}

static void test_find(void **state) {
    (void)state;
    const int64_t s2[] = {2};
    zdp_tensor in[] = {make_tensor("a", ZDP_DTYPE_F32, 1, s2, 1),
                       make_tensor("b.c", ZDP_DTYPE_U8, 1, s2, 2)};
    const char *path = path_in("find.safetensors");
    zdp_error err;
    assert_int_equal(zdp_safetensors_write(path, in, 2, &err), ZDP_OK);
    zdp_safetensors st;
    assert_int_equal(zdp_safetensors_read(path, &st, &err), ZDP_OK);
    const zdp_tensor *t = zdp_safetensors_find(&st, "b.c");
    assert_non_null(t);
    assert_int_equal(t->dtype, ZDP_DTYPE_U8);
    assert_ptr_equal(zdp_safetensors_find(&st, "a"), &st.tensors[0]);
    assert_null(zdp_safetensors_find(&st, "b"));
    assert_null(zdp_safetensors_find(&st, ""));
    assert_null(zdp_safetensors_find(&st, NULL));
    assert_null(zdp_safetensors_find(NULL, "a"));
    zdp_safetensors_free(&st);
    assert_null(zdp_safetensors_find(&st, "a"));
    zdp_safetensors_free(&st); /* twice is fine: the struct was reset */
    zdp_safetensors_free(NULL);
    free(in[0].data);
    free(in[1].data);
}

static void test_dtype_table(void **state) {
    (void)state;
    assert_string_equal(zdp_dtype_name(ZDP_DTYPE_F32), "F32");
    assert_string_equal(zdp_dtype_name(ZDP_DTYPE_BF16), "BF16");
    assert_string_equal(zdp_dtype_name(ZDP_DTYPE_U8), "U8");
    assert_int_equal(zdp_dtype_size(ZDP_DTYPE_F64), 8);
    assert_int_equal(zdp_dtype_size(ZDP_DTYPE_I64), 8);
    assert_int_equal(zdp_dtype_size(ZDP_DTYPE_I32), 4);
    assert_int_equal(zdp_dtype_size(ZDP_DTYPE_U16), 2);
    assert_int_equal(zdp_dtype_size(ZDP_DTYPE_F16), 2);
    assert_int_equal(zdp_dtype_size((zdp_dtype)99), 0);
    assert_string_equal(zdp_dtype_name((zdp_dtype)99), "INVALID");
}

/* One F32 tensor "w" = [1.0, -2.0]: the header is 54 bytes of compact JSON,
 * padded with 2 spaces to 56 so the data starts at byte 64. */
static const unsigned char k_exact[] = {
    0x38, 0, 0, 0, 0, 0, 0, 0,
    '{', '"', 'w', '"', ':', '{', '"', 'd', 't', 'y', 'p', 'e', '"', ':', '"', 'F', '3', '2',
    '"', ',', '"', 's', 'h', 'a', 'p', 'e', '"', ':', '[', '2', ']', ',', '"', 'd', 'a', 't',
    'a', '_', 'o', 'f', 'f', 's', 'e', 't', 's', '"', ':', '[', '0', ',', '8', ']', '}', '}',
    ' ', ' ',
    0x00, 0x00, 0x80, 0x3f, /* 1.0f */
    0x00, 0x00, 0x00, 0xc0, /* -2.0f */
};

static void test_byte_exact(void **state) {
    (void)state;
    assert_int_equal(sizeof k_exact, 8 + 56 + 8);
    float w[2] = {1.0f, -2.0f};
    zdp_tensor t = {.name = "w", .dtype = ZDP_DTYPE_F32, .ndim = 1, .shape = {2},
                    .data = w, .nbytes = sizeof w};
    const char *path = path_in("exact.safetensors");
    zdp_error err;
    assert_int_equal(zdp_safetensors_write(path, &t, 1, &err), ZDP_OK);
    size_t len;
    unsigned char *raw = slurp(path, &len);
    assert_int_equal(len, sizeof k_exact);
    assert_memory_equal(raw, k_exact, sizeof k_exact);
    free(raw);

    /* And the reader on the hand-built bytes. */
    const char *hand = path_in("hand.safetensors");
    write_bytes(hand, k_exact, sizeof k_exact);
    zdp_safetensors st;
    assert_int_equal(zdp_safetensors_read(hand, &st, &err), ZDP_OK);
    assert_int_equal(st.n, 1);
    assert_tensor_equal(&st.tensors[0], &t);
    zdp_safetensors_free(&st);
}

/* ---- reader acceptance ---------------------------------------------------- */

static void test_reader_accepts_metadata_order_and_gaps(void **state) {
    (void)state;
    /* Header order differs from offset order; a gap and trailing bytes are
     * tolerated; empty tensors may share an offset with a non-empty one. */
    const char *hdr =
        "{\"__metadata__\":{\"format\":\"pt\"},"
        "\"second\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[12,16]},"
        "\"z\":{\"dtype\":\"F32\",\"shape\":[3,0],\"data_offsets\":[12,12]},"
        "\"first\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
        "\"huge_but_empty\":{\"dtype\":\"F64\",\"shape\":[4294967296,4294967296,"
        "4294967296,0],\"data_offsets\":[0,0]}}    ";
    const char *path = path_in("order.safetensors");
    write_st(path, hdr, 20);
    zdp_safetensors st;
    zdp_error err;
    assert_int_equal(zdp_safetensors_read(path, &st, &err), ZDP_OK);
    assert_int_equal(st.n, 4);
    assert_string_equal(st.tensors[0].name, "huge_but_empty");
    assert_string_equal(st.tensors[1].name, "first");
    assert_string_equal(st.tensors[2].name, "z");
    assert_string_equal(st.tensors[3].name, "second");
    assert_null(zdp_safetensors_find(&st, "__metadata__"));
    const unsigned char *d = st.tensors[3].data;
    for (int i = 0; i < 4; i++) /* write_st's pattern, from byte 12 of the data */
        assert_int_equal(d[i], (unsigned char)((12 + i) * 7 + 1));
    assert_int_equal(st.tensors[0].ndim, 4);
    assert_int_equal(st.tensors[0].nbytes, 0);
    zdp_safetensors_free(&st);
}

/* ---- reader errors -------------------------------------------------------- */

static void test_reader_io_errors(void **state) {
    (void)state;
    const char *msg = read_expect(path_in("does_not_exist.safetensors"), ZDP_ERR_IO);
    assert_contains(msg, "does_not_exist.safetensors");
    assert_contains(msg, strerror(ENOENT));
    msg = read_expect(g_dir, ZDP_ERR_IO);
    assert_contains(msg, "not a regular file");

    zdp_error err;
    assert_int_equal(zdp_safetensors_read(path_in("x"), NULL, &err), ZDP_ERR_INVALID_ARG);
    zdp_safetensors st;
    assert_int_equal(zdp_safetensors_read(NULL, &st, NULL), ZDP_ERR_INVALID_ARG);
    assert_int_equal(st.n, 0);
}

static void test_reader_short_file(void **state) {
    (void)state;
    const char *path = path_in("short.safetensors");
    unsigned char b[8] = {2, 0, 0, 0, 0, 0, 0, 0};
    for (size_t n = 0; n < 8; n++) {
        write_bytes(path, b, n);
        const char *msg = read_expect(path, ZDP_ERR_FORMAT);
        assert_contains(msg, "short.safetensors: file is");
        assert_contains(msg, "shorter than the 8-byte header length");
    }
}

static void test_reader_header_length(void **state) {
    (void)state;
    const char *path = path_in("hlen.safetensors");
    write_st_len(path, "{}", 0, 100000001ull);
    const char *msg = read_expect(path, ZDP_ERR_FORMAT);
    assert_contains(msg, "header length 100000001 bytes is over the 100000000-byte limit");

    write_st_len(path, "{}", 0, UINT64_MAX - 1);
    msg = read_expect(path, ZDP_ERR_FORMAT);
    assert_contains(msg, "header length 18446744073709551614");

    write_st_len(path, "{}", 0, 3);
    msg = read_expect(path, ZDP_ERR_FORMAT);
    assert_contains(msg, "header length 3 bytes but only 2 bytes follow");

    write_st_len(path, "{}", 0, 0);
    msg = read_expect(path, ZDP_ERR_FORMAT);
    assert_contains(msg, "header is not valid JSON");
}

static void test_reader_bad_json(void **state) {
    (void)state;
    const char *path = path_in("json.safetensors");
    write_st(path, "{\"x\": ", 0);
    const char *msg = read_expect(path, ZDP_ERR_FORMAT);
    assert_contains(msg, "json.safetensors: header is not valid JSON");
    assert_contains(msg, "line 1, column");

    write_st(path, "{\n\"x\": }", 0);
    msg = read_expect(path, ZDP_ERR_FORMAT);
    assert_contains(msg, "line 2, column");

    write_st(path, "{} trailing", 0);
    msg = read_expect(path, ZDP_ERR_FORMAT);
    assert_contains(msg, "not valid JSON");

    write_st(path, "{\"\xff\":1}", 0); /* not UTF-8 */
    msg = read_expect(path, ZDP_ERR_FORMAT);
    assert_contains(msg, "not valid JSON");

    write_st(path, "[1, 2]", 0);
    msg = read_expect(path, ZDP_ERR_FORMAT);
    assert_contains(msg, "header is an array, expected an object");

    write_st(path, "\"str\"  ", 0);
    msg = read_expect(path, ZDP_ERR_FORMAT);
    assert_contains(msg, "header is a string, expected an object");
}

typedef struct bad_case {
    const char *header;
    size_t data_len;
    const char *want[3];
} bad_case;

#define E_(fields) "{\"x\":{" fields "}}"
#define OK_DT "\"dtype\":\"F32\""
#define OK_SH "\"shape\":[2]"
#define OK_OFF "\"data_offsets\":[0,8]"

static const bad_case k_bad[] = {
    {"{\"x\":5}", 0, {"tensor \"x\": entry is an integer, expected an object"}},
    {"{\"x\":[1]}", 0, {"tensor \"x\": entry is an array"}},
    {E_(OK_DT "," OK_SH), 8, {"tensor \"x\": missing field \"data_offsets\""}},
    {E_(OK_SH "," OK_OFF), 8, {"tensor \"x\": missing field \"dtype\""}},
    {E_(OK_DT "," OK_OFF), 8, {"tensor \"x\": missing field \"shape\""}},
    {E_(OK_DT "," OK_SH "," OK_OFF ",\"extra\":1"), 8,
     {"tensor \"x\": unexpected field \"extra\"", "exactly dtype, shape and data_offsets"}},
    {E_("\"dtype\":\"F8\"," OK_SH "," OK_OFF), 8,
     {"tensor \"x\": dtype \"F8\" is not supported",
      "F32, F64, I64, I32, U16, BF16, F16, U8"}},
    {E_("\"dtype\":\"f32\"," OK_SH "," OK_OFF), 8, {"dtype \"f32\" is not supported"}},
    {E_("\"dtype\":4," OK_SH "," OK_OFF), 8, {"tensor \"x\": dtype is an integer"}},
    {E_(OK_DT ",\"shape\":\"2\"," OK_OFF), 8, {"tensor \"x\": shape is a string"}},
    {E_(OK_DT ",\"shape\":[2,-1]," OK_OFF), 8, {"tensor \"x\": shape[1] is -1"}},
    {E_(OK_DT ",\"shape\":[1.5]," OK_OFF), 8, {"tensor \"x\": shape[0] is a number"}},
    {E_(OK_DT ",\"shape\":[null]," OK_OFF), 8, {"shape[0] is null"}},
    {E_(OK_DT ",\"shape\":[1,1,1,1,2]," OK_OFF), 8,
     {"tensor \"x\": shape has 5 dimensions", "at most ZDP_MAX_DIMS = 4"}},
    {E_(OK_DT "," OK_SH ",\"data_offsets\":[0]"), 8,
     {"tensor \"x\": data_offsets is an array of the wrong length", "[begin, end]"}},
    {E_(OK_DT "," OK_SH ",\"data_offsets\":[0,4,8]"), 8, {"data_offsets is an array"}},
    {E_(OK_DT "," OK_SH ",\"data_offsets\":{}"), 8, {"data_offsets is an object"}},
    {E_(OK_DT "," OK_SH ",\"data_offsets\":[-1,7]"), 8,
     {"tensor \"x\": data_offsets[0] is negative"}},
    {E_(OK_DT "," OK_SH ",\"data_offsets\":[0,\"8\"]"), 8,
     {"tensor \"x\": data_offsets[1] is a string"}},
    {E_(OK_DT "," OK_SH ",\"data_offsets\":[8,0]"), 8,
     {"tensor \"x\": data_offsets [8, 0] has begin > end"}},
    {E_(OK_DT "," OK_SH "," OK_OFF), 7,
     {"tensor \"x\": data_offsets [0, 8] end past the data section, which has 7 bytes"}},
    {E_(OK_DT "," OK_SH ",\"data_offsets\":[0,4]"), 8,
     {"tensor \"x\": data_offsets [0, 4] span 4 bytes but dtype F32 shape [2] needs 8"}},
    {E_("\"dtype\":\"F64\",\"shape\":[]," OK_OFF), 8, {NULL}}, /* control: a valid scalar */
    {E_(OK_DT ",\"shape\":[4294967296,4294967296,4]," OK_OFF), 8,
     {"tensor \"x\": dtype F32 shape [4294967296, 4294967296, 4] needs more than 2^64 bytes",
      "overflow"}},
    {E_(OK_DT ",\"shape\":[4611686018427387904]," OK_OFF), 8, {"overflow"}},
    {"{\"a\":{" OK_DT "," OK_SH ",\"data_offsets\":[0,8]},"
     "\"b\":{" OK_DT "," OK_SH ",\"data_offsets\":[4,12]}}", 12,
     {"tensor \"b\": data_offsets [4, 12] overlap tensor \"a\" at [0, 8]"}},
    /* b lies inside a and starts where a does. */
    {"{\"a\":{" OK_DT ",\"shape\":[4],\"data_offsets\":[0,16]},"
     "\"b\":{" OK_DT ",\"shape\":[1],\"data_offsets\":[0,4]}}", 16,
     {"overlap", "\"a\"", "\"b\""}},
    {"{\"a\":{" OK_DT ",\"shape\":[4],\"data_offsets\":[0,16]},"
     "\"b\":{" OK_DT ",\"shape\":[1],\"data_offsets\":[2,6]},"
     "\"c\":{" OK_DT ",\"shape\":[1],\"data_offsets\":[8,12]}}", 16,
     {"tensor \"b\": data_offsets [2, 6] overlap tensor \"a\" at [0, 16]"}},
    {"{\"a\":{" OK_DT ",\"shape\":[2],\"data_offsets\":[0,8]},"
     "\"e\":{" OK_DT ",\"shape\":[0],\"data_offsets\":[4,4]}}", 8,
     {"tensor \"e\": data_offsets [4, 4] overlap tensor \"a\""}},
    {"{\"x\":{" OK_DT "," OK_SH "," OK_OFF "},\"x\":{" OK_DT "," OK_SH "," OK_OFF "}}", 8,
     {"duplicate", "\"x\"", "share a name"}},
    {E_(OK_DT "," OK_SH "," OK_OFF ",\"dtype\":\"F32\""), 8, {"duplicate"}},
    {"{\"__metadata__\":5}", 0, {"__metadata__ is an integer, expected an object"}},
    {"{\"__metadata__\":{\"k\":1}}", 0, {"__metadata__.\"k\" is an integer, expected a string"}},
};

static void test_reader_bad_headers(void **state) {
    (void)state;
    const char *path = path_in("bad.safetensors");
    for (size_t i = 0; i < sizeof k_bad / sizeof k_bad[0]; i++) {
        const bad_case *c = &k_bad[i];
        write_st(path, c->header, c->data_len);
        if (c->want[0] == NULL) { /* a control that must be accepted */
            zdp_safetensors st;
            zdp_error err;
            if (zdp_safetensors_read(path, &st, &err) != ZDP_OK)
                fail_msg("case %zu: expected success, got: %s", i, err.msg);
            zdp_safetensors_free(&st);
            continue;
        }
        const char *msg = read_expect(path, ZDP_ERR_FORMAT);
        assert_contains(msg, "bad.safetensors: ");
        for (int k = 0; k < 3 && c->want[k] != NULL; k++) {
            if (strstr(msg, c->want[k]) == NULL)
                fail_msg("case %zu (%s): expected \"%s\" in message:\n  %s", i, c->header,
                         c->want[k], msg);
        }
    }
}

static void test_reader_size_mismatch_message(void **state) {
    (void)state;
    const char *path = path_in("data.safetensors");
    write_st(path, "{\"x\":{\"dtype\":\"F32\",\"shape\":[4,8],\"data_offsets\":[0,100]}}", 100);
    const char *msg = read_expect(path, ZDP_ERR_FORMAT);
    assert_contains(msg, "data.safetensors: tensor \"x\": data_offsets [0, 100] span 100 bytes "
                         "but dtype F32 shape [4, 8] needs 128; the file is corrupt or was "
                         "written by a buggy tool");
}

/* A valid multi-tensor file cut at every length must fail, never crash. */
static void test_reader_truncated(void **state) {
    (void)state;
    const int64_t s3[] = {3}, s22[] = {2, 2};
    zdp_tensor in[] = {make_tensor("a", ZDP_DTYPE_F32, 1, s3, 1),
                       make_tensor("b", ZDP_DTYPE_F64, 0, NULL, 2),
                       make_tensor("c", ZDP_DTYPE_U16, 2, s22, 3)};
    const char *full = path_in("full.safetensors");
    zdp_error err;
    assert_int_equal(zdp_safetensors_write(full, in, 3, &err), ZDP_OK);
    size_t len;
    unsigned char *raw = slurp(full, &len);
    const char *cut = path_in("cut.safetensors");
    for (size_t n = 0; n < len; n++) {
        write_bytes(cut, raw, n);
        const char *msg = read_expect(cut, ZDP_ERR_FORMAT);
        assert_contains(msg, "cut.safetensors: ");
    }
    write_bytes(cut, raw, len);
    zdp_safetensors st;
    assert_int_equal(zdp_safetensors_read(cut, &st, &err), ZDP_OK);
    assert_int_equal(st.n, 3);
    zdp_safetensors_free(&st);
    free(raw);
    for (int i = 0; i < 3; i++) free(in[i].data);
}

/* Every byte of the length and header replaced by a few values: the reader
 * either accepts the result or fails with an empty output. */
static void test_reader_corrupt_bytes(void **state) {
    (void)state;
    const int64_t s3[] = {3}, s2[] = {2};
    zdp_tensor in[] = {make_tensor("w", ZDP_DTYPE_F32, 1, s3, 1),
                       make_tensor("b", ZDP_DTYPE_I64, 1, s2, 2)};
    const char *full = path_in("good.safetensors");
    zdp_error err;
    assert_int_equal(zdp_safetensors_write(full, in, 2, &err), ZDP_OK);
    size_t len;
    unsigned char *raw = slurp(full, &len);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | raw[i];
    const unsigned char repl[] = {0x00, 0xff, '"', '9', '{', ']', ',', '-'};
    const char *bad = path_in("corrupt.safetensors");
    for (size_t pos = 0; pos < 8 + hl; pos++) {
        for (size_t r = 0; r < sizeof repl; r++) {
            unsigned char saved = raw[pos];
            raw[pos] = repl[r];
            write_bytes(bad, raw, len);
            raw[pos] = saved;
            zdp_safetensors st;
            zdp_status s = zdp_safetensors_read(bad, &st, &err);
            if (s == ZDP_OK) {
                zdp_safetensors_free(&st);
            } else {
                assert_int_equal(s, ZDP_ERR_FORMAT);
                assert_int_equal(st.n, 0);
                assert_null(st.tensors);
            }
        }
    }
    free(raw);
    free(in[0].data);
    free(in[1].data);
}

/* ---- writer errors -------------------------------------------------------- */

typedef struct writer_case {
    const char *want;
    void (*mutate)(zdp_tensor *t); /* applied to tensors[1] or [2] below */
    int which;
} writer_case;

static void m_empty_name(zdp_tensor *t) { t->name = ""; }
static void m_null_name(zdp_tensor *t) { t->name = NULL; }
static void m_dup_name(zdp_tensor *t) { t->name = "a"; }
static void m_meta_name(zdp_tensor *t) { t->name = "__metadata__"; }
static void m_bad_utf8(zdp_tensor *t) { t->name = "bad\xff"; }
static void m_nbytes(zdp_tensor *t) { t->nbytes -= 4; }
static void m_ndim5(zdp_tensor *t) { t->ndim = 5; }
static void m_ndim_neg(zdp_tensor *t) { t->ndim = -1; }
static void m_shape_neg(zdp_tensor *t) { t->shape[0] = -2; }
static void m_dtype(zdp_tensor *t) { t->dtype = (zdp_dtype)99; }
static void m_null_data(zdp_tensor *t) { t->data = NULL; }
static void m_overflow(zdp_tensor *t) {
    t->ndim = 3;
    t->shape[0] = t->shape[1] = INT64_C(4294967296);
    t->shape[2] = 4;
}

static const writer_case k_writer_bad[] = {
    {"tensors[1]: name is empty", m_empty_name, 1},
    {"tensors[1]: name is empty", m_null_name, 1},
    {"tensors[2]: name \"a\" is also the name of tensors[0]", m_dup_name, 2},
    {"tensors[1]: name \"__metadata__\" is reserved", m_meta_name, 1},
    {"tensors[1]: name is not valid UTF-8", m_bad_utf8, 1},
    {"tensor \"b\": nbytes is 20 but dtype F32 shape [2, 3] needs 24", m_nbytes, 1},
    {"tensor \"b\": ndim 5, expected 0..ZDP_MAX_DIMS (4)", m_ndim5, 1},
    {"tensor \"b\": ndim -1", m_ndim_neg, 1},
    {"tensor \"b\": shape[0] is -2", m_shape_neg, 1},
    {"tensor \"b\": dtype 99 is not a zdp_dtype", m_dtype, 1},
    {"tensor \"b\": data is NULL", m_null_data, 1},
    {"tensor \"b\": dtype F32 shape [4294967296, 4294967296, 4] needs more than 2^64", m_overflow,
     1},
};

static void test_writer_bad_args(void **state) {
    (void)state;
    const int64_t s2[] = {2}, s23[] = {2, 3}, s4[] = {4};
    const char *path = path_in("w_bad.safetensors");
    for (size_t i = 0; i < sizeof k_writer_bad / sizeof k_writer_bad[0]; i++) {
        zdp_tensor in[] = {make_tensor("a", ZDP_DTYPE_F32, 1, s2, 1),
                           make_tensor("b", ZDP_DTYPE_F32, 2, s23, 2),
                           make_tensor("c", ZDP_DTYPE_U8, 1, s4, 3)};
        void *owned[3] = {in[0].data, in[1].data, in[2].data};
        k_writer_bad[i].mutate(&in[k_writer_bad[i].which]);
        zdp_error err = {0};
        zdp_status s = zdp_safetensors_write(path, in, 3, &err);
        if (s != ZDP_ERR_INVALID_ARG)
            fail_msg("case %zu: status %d, message %s", i, s, err.msg);
        assert_contains(err.msg, "w_bad.safetensors: ");
        assert_contains(err.msg, k_writer_bad[i].want);
        assert_false(file_exists(path));
        assert_int_equal(count_temp_files(), 0);
        for (int k = 0; k < 3; k++) free(owned[k]);
    }

    zdp_error err;
    assert_int_equal(zdp_safetensors_write(path, NULL, 1, &err), ZDP_ERR_INVALID_ARG);
    assert_int_equal(zdp_safetensors_write(path, NULL, -1, &err), ZDP_ERR_INVALID_ARG);
    assert_int_equal(zdp_safetensors_write(NULL, NULL, 0, &err), ZDP_ERR_INVALID_ARG);
    assert_int_equal(zdp_safetensors_write("", NULL, 0, NULL), ZDP_ERR_INVALID_ARG);
    assert_false(file_exists(path));
}

static void test_writer_io_errors(void **state) {
    (void)state;
    const int64_t s2[] = {2};
    zdp_tensor t = make_tensor("a", ZDP_DTYPE_F32, 1, s2, 1);
    zdp_error err;

    /* The directory does not exist: the temp file cannot be created. */
    const char *missing = path_in("no/such/dir/x.safetensors");
    assert_int_equal(zdp_safetensors_write(missing, &t, 1, &err), ZDP_ERR_IO);
    assert_contains(err.msg, "cannot create the temporary file");
    assert_contains(err.msg, strerror(ENOENT));

    /* The target is a directory: everything succeeds up to the rename, and
     * the temp file must be gone afterwards. */
    const char *dir = path_in("a_dir.safetensors");
    assert_int_equal(mkdir(dir, 0755), 0);
    assert_int_equal(zdp_safetensors_write(dir, &t, 1, &err), ZDP_ERR_IO);
    assert_contains(err.msg, "a_dir.safetensors: cannot rename");
    assert_int_equal(count_temp_files(), 0);
    assert_int_equal(rmdir(dir), 0);
    free(t.data);
}

static void test_writer_leaves_no_temp(void **state) {
    (void)state;
    const int64_t s8[] = {8};
    zdp_tensor t = make_tensor("a", ZDP_DTYPE_I64, 1, s8, 1);
    zdp_error err;
    const char *path = path_in("clean.safetensors");
    for (int i = 0; i < 3; i++) assert_int_equal(zdp_safetensors_write(path, &t, 1, &err), ZDP_OK);
    assert_true(file_exists(path));
    assert_int_equal(count_temp_files(), 0);
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    assert_false(file_exists(tmp));
    free(t.data);
}

/* Metadata: written first, as {"__metadata__":{"format":"pt"}}, ignored on read. */
static void test_write_metadata(void **state) {
    (void)state;
    char path[] = "/tmp/zdp_st_meta_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    float v[2] = {1.0f, -2.0f};
    zdp_tensor t = {.name = "w", .dtype = ZDP_DTYPE_F32, .ndim = 1, .shape = {2}, .data = v,
                    .nbytes = sizeof v};
    const char *meta[] = {"format", "pt"};
    zdp_error err;
    assert_int_equal(zdp_safetensors_write_meta(path, &t, 1, meta, 1, &err), ZDP_OK);
    FILE *f = fopen(path, "rb");
    char buf[256] = {0};
    size_t got = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    assert_true(got > 8);
    assert_non_null(strstr(buf + 8, "{\"__metadata__\":{\"format\":\"pt\"},\"w\":"));
    zdp_safetensors st;
    assert_int_equal(zdp_safetensors_read(path, &st, &err), ZDP_OK);
    assert_int_equal(st.n, 1);
    assert_memory_equal(st.tensors[0].data, v, sizeof v);
    zdp_safetensors_free(&st);
    const char *bad[] = {"format", NULL};
    assert_int_equal(zdp_safetensors_write_meta(path, &t, 1, bad, 1, &err), ZDP_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "metadata"));
    unlink(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_write_metadata),
        cmocka_unit_test(test_roundtrip_dtypes),
        cmocka_unit_test(test_roundtrip_empty_set_and_overwrite),
        cmocka_unit_test(test_find),
        cmocka_unit_test(test_dtype_table),
        cmocka_unit_test(test_byte_exact),
        cmocka_unit_test(test_reader_accepts_metadata_order_and_gaps),
        cmocka_unit_test(test_reader_io_errors),
        cmocka_unit_test(test_reader_short_file),
        cmocka_unit_test(test_reader_header_length),
        cmocka_unit_test(test_reader_bad_json),
        cmocka_unit_test(test_reader_bad_headers),
        cmocka_unit_test(test_reader_size_mismatch_message),
        cmocka_unit_test(test_reader_truncated),
        cmocka_unit_test(test_reader_corrupt_bytes),
        cmocka_unit_test(test_writer_bad_args),
        cmocka_unit_test(test_writer_io_errors),
        cmocka_unit_test(test_writer_leaves_no_temp),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
