/*
 * test_data.c -- unit tests for src/data (token files, the arithmetic
 * corpus, zdp_dataset).
 *
 * Covered: llm.c shard write/read round trips and every corrupt header
 * (magic, version, count against file length, short files), byte tokens
 * from a text file, what ZDP_TOKENS_AUTO reads a file as (a damaged shard
 * magic is an error, not bytes), the arithmetic corpus (golden lines computed in Python
 * from zdp.h's specification, determinism, well-formed sums), and the
 * dataset: the micro-batch window arithmetic exactly as zdp.h states it for
 * W = 1..4 (disjoint across ranks within a step, wrap-around modulo the
 * window count), the train/val split, the cursor, and the errors.
 */
#define _POSIX_C_SOURCE 200809L

#include <dirent.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/unit_io.h"
#include "zdp/zdp.h"

/* ---- fixtures -------------------------------------------------------------- */

static int group_setup(void **state) {
    (void)state;
    return tmpdir_make(g_dir, sizeof g_dir, "data");
}

static int group_teardown(void **state) {
    (void)state;
    return tmpdir_remove(g_dir);
}

/* A shard's bytes by hand: header {magic, version, count}, then tokens. */
static unsigned char *shard_bytes(int32_t magic, int32_t version, int32_t count,
                                  const uint16_t *tok, int n, size_t *len) {
    *len = 1024 + 2 * (size_t)n;
    unsigned char *b = calloc(1, *len);
    int32_t hd[3] = {magic, version, count};
    memcpy(b, hd, sizeof hd);
    memcpy(b + 1024, tok, 2 * (size_t)n);
    return b;
}

/* ---- shards ---------------------------------------------------------------- */

static void test_shard_round_trip(void **state) {
    (void)state;
    enum { N = 70000 };
    int32_t *tok = malloc(N * sizeof *tok);
    for (int i = 0; i < N; i++) tok[i] = (int32_t)((i * 7919u) % 65536u);
    tok[0] = 0;
    tok[1] = 65535;
    const char *p = path_in("rt.bin");
    zdp_error e = {0};
    assert_int_equal(zdp_tokens_write_shard(p, tok, N, &e), ZDP_OK);

    /* Byte-exact llm.c layout. */
    FILE *f = fopen(p, "rb");
    int32_t hd[256];
    assert_int_equal(fread(hd, 4, 256, f), 256);
    assert_int_equal(hd[0], 20240520);
    assert_int_equal(hd[1], 1);
    assert_int_equal(hd[2], N);
    for (int i = 3; i < 256; i++) assert_int_equal(hd[i], 0);
    uint16_t t2[2];
    assert_int_equal(fread(t2, 2, 2, f), 2);
    assert_int_equal(t2[0], 0);
    assert_int_equal(t2[1], 65535);
    fseek(f, 0, SEEK_END);
    assert_int_equal(ftell(f), 1024 + 2 * N);
    fclose(f);

    int32_t *back;
    int64_t n;
    assert_int_equal(zdp_tokens_read(p, ZDP_TOKENS_SHARD, &back, &n, &e), ZDP_OK);
    assert_int_equal(n, N);
    assert_memory_equal(back, tok, N * sizeof *tok);
    zdp_tokens_free(back);

    /* An empty shard is valid. */
    assert_int_equal(zdp_tokens_write_shard(p, NULL, 0, &e), ZDP_OK);
    assert_int_equal(zdp_tokens_read(p, ZDP_TOKENS_SHARD, &back, &n, &e), ZDP_OK);
    assert_int_equal(n, 0);
    zdp_tokens_free(back);

    /* Tokens out of uint16 range are refused, naming the index; no file. */
    tok[5] = 65536;
    const char *q = path_in("never.bin");
    assert_int_equal(zdp_tokens_write_shard(q, tok, N, &e), ZDP_ERR_INVALID_ARG);
    ASSERT_MSG_HAS(e, "tokens[5] = 65536");
    tok[5] = -1;
    assert_int_equal(zdp_tokens_write_shard(q, tok, N, &e), ZDP_ERR_INVALID_ARG);
    assert_int_equal(access(q, F_OK), -1);
    assert_int_equal(zdp_tokens_write_shard(path_in("no/dir.bin"), tok, 3, &e), ZDP_ERR_IO);
    free(tok);
}

static void test_shard_corrupt_headers(void **state) {
    (void)state;
    uint16_t tok[4] = {1, 2, 3, 4};
    static const struct {
        int32_t magic, version, count;
        int n;
        const char *has[2];
    } cases[] = {
        {12345, 1, 4, 4, {"magic 12345", "20240520"}},
        {20240326, 1, 4, 4, {"magic 20240326", "model checkpoint"}},
        {20240520, 2, 4, 4, {"version 2", "version 1"}},
        {20240520, 1, 5, 4, {"5 tokens", "truncated"}},
        {20240520, 1, 3, 4, {"3 tokens", "extra bytes"}},
        {20240520, 1, -2, 4, {"-2", "negative"}},
    };
    const char *p = path_in("bad.bin");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t len;
        unsigned char *b = shard_bytes(cases[i].magic, cases[i].version, cases[i].count, tok,
                                       cases[i].n, &len);
        write_bytes(p, b, len);
        free(b);
        zdp_error e = {0};
        int32_t dummy, *t = &dummy; /* must be reset to NULL */
        int64_t n = 99;
        assert_int_equal(zdp_tokens_read(p, ZDP_TOKENS_SHARD, &t, &n, &e), ZDP_ERR_FORMAT);
        assert_null(t);
        assert_int_equal(n, 0);
        ASSERT_MSG_HAS(e, p);
        for (int k = 0; k < 2; k++) ASSERT_MSG_HAS(e, cases[i].has[k]);
    }
    /* Shorter than the header. */
    write_bytes(p, "\x58\xd8\x34\x01", 4);
    zdp_error e = {0};
    int32_t *t;
    int64_t n;
    assert_int_equal(zdp_tokens_read(p, ZDP_TOKENS_SHARD, &t, &n, &e), ZDP_ERR_FORMAT);
    ASSERT_MSG_HAS(e, "1024-byte header");
    assert_int_equal(zdp_tokens_read(path_in("missing.bin"), ZDP_TOKENS_SHARD, &t, &n, &e),
                     ZDP_ERR_IO);
    ASSERT_MSG_HAS(e, "missing.bin");
    assert_int_equal(zdp_tokens_read(p, (zdp_token_format)7, &t, &n, &e), ZDP_ERR_INVALID_ARG);
}

static void test_bytes_from_text(void **state) {
    (void)state;
    const char text[] = "hi there\n\xff\x00z";
    const char *p = path_in("text.txt");
    write_bytes(p, text, sizeof text - 1);
    int32_t *t;
    int64_t n;
    zdp_error e = {0};
    assert_int_equal(zdp_tokens_read(p, ZDP_TOKENS_BYTES, &t, &n, &e), ZDP_OK);
    assert_int_equal(n, sizeof text - 1);
    for (int64_t i = 0; i < n; i++) assert_int_equal(t[i], (unsigned char)text[i]);
    zdp_tokens_free(t);

    zdp_dataset *ds;
    assert_int_equal(zdp_dataset_open(p, ZDP_TOKENS_BYTES, 0.0, &ds, &e), ZDP_OK);
    assert_int_equal(zdp_dataset_max_token(ds), 255);
    assert_int_equal(zdp_dataset_n_tokens(ds, ZDP_SPLIT_TRAIN), n);
    zdp_dataset_destroy(ds);

    write_bytes(p, "", 0);
    assert_int_equal(zdp_tokens_read(p, ZDP_TOKENS_BYTES, &t, &n, &e), ZDP_ERR_FORMAT);
    ASSERT_MSG_HAS(e, "empty");
    assert_int_equal(zdp_dataset_open(p, ZDP_TOKENS_BYTES, 0.0, &ds, &e), ZDP_ERR_FORMAT);
    assert_null(ds);
}

/* ZDP_TOKENS_AUTO: a shard by its magic; a damaged shard is an error, never
 * bytes; files that are clearly not shards are bytes. */
/* A .npy file as numpy.save writes it: magic, version, header padded with
 * spaces to a multiple of 64 bytes ending in '\n', then data. */
static void write_npy(const char *path, int major, const char *descr, const char *shape,
                      const void *data, size_t nbytes) {
    char dict[256];
    int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
                     descr, shape);
    const int pre = major == 1 ? 10 : 12;
    int total = pre + n + 1;
    total = (total + 63) / 64 * 64;
    const int hlen = total - pre;
    unsigned char *buf = calloc(1, (size_t)total + nbytes);
    memcpy(buf, "\x93NUMPY", 6);
    buf[6] = (unsigned char)major;
    buf[7] = 0;
    for (int b = 0; b < (major == 1 ? 2 : 4); b++) buf[8 + b] = (unsigned char)(hlen >> (8 * b));
    memset(buf + pre, ' ', (size_t)hlen);
    memcpy(buf + pre, dict, (size_t)n);
    buf[total - 1] = '\n';
    if (nbytes > 0) memcpy(buf + total, data, nbytes);
    write_bytes(path, buf, (size_t)total + nbytes);
    free(buf);
}

static void test_npy(void **state) {
    (void)state;
    zdp_error err;
    int32_t *t = NULL;
    int64_t n = 0;
    zdp_token_format fmt;
    /* int32 (Qwen3-sized ids), uint16, uint32, version 2.0. */
    const int32_t i4[5] = {0, 151935, 7, 65536, 3};
    write_npy(path_in("a.npy"), 1, "<i4", "(5,)", i4, sizeof i4);
    assert_int_equal(zdp_tokens_detect(path_in("a.npy"), &fmt, &err), ZDP_OK);
    assert_int_equal(fmt, ZDP_TOKENS_NPY);
    assert_int_equal(zdp_tokens_read(path_in("a.npy"), ZDP_TOKENS_AUTO, &t, &n, &err), ZDP_OK);
    assert_int_equal(n, 5);
    assert_memory_equal(t, i4, sizeof i4);
    zdp_tokens_free(t);
    const uint16_t u2[3] = {65535, 1, 2};
    write_npy(path_in("b.npy"), 2, "<u2", "(3,)", u2, sizeof u2);
    assert_int_equal(zdp_tokens_read(path_in("b.npy"), ZDP_TOKENS_NPY, &t, &n, &err), ZDP_OK);
    assert_int_equal(n, 3);
    assert_int_equal(t[0], 65535);
    assert_int_equal(t[2], 2);
    zdp_tokens_free(t);
    const uint32_t u4[2] = {200000, 9};
    write_npy(path_in("c.npy"), 1, "<u4", "(2,)", u4, sizeof u4);
    assert_int_equal(zdp_tokens_read(path_in("c.npy"), ZDP_TOKENS_NPY, &t, &n, &err), ZDP_OK);
    assert_int_equal(t[0], 200000);
    zdp_tokens_free(t);
    /* Bad files: each message names the file and what is wrong. */
    const int32_t neg[4] = {1, 2, -5, 4};
    const uint32_t huge[2] = {1, 3000000000u};
    const struct {
        const char *descr, *shape;
        const void *data;
        size_t nbytes;
        const char *msg;
    } bad[] = {
        {"<f4", "(5,)", i4, sizeof i4, "dtype '<f4'"},
        {"<i8", "(2,)", i4, 16, "dtype '<i8'"},
        {"<i4", "(5, 1)", i4, sizeof i4, "shape (5, 1)"},
        {"<i4", "(6,)", i4, sizeof i4, "truncated"},
        {"<i4", "(4,)", i4, sizeof i4, "extra bytes"},
        {"<i4", "(0,)", i4, 0, "empty"},
        {"<i4", "(4,)", neg, sizeof neg, "token 2 (position 2) = -5"},
        {"<u4", "(2,)", huge, sizeof huge, "position 1) = 3000000000"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_npy(path_in("bad.npy"), 1, bad[i].descr, bad[i].shape, bad[i].data, bad[i].nbytes);
        zdp_error e = {0};
        zdp_status s = zdp_tokens_read(path_in("bad.npy"), ZDP_TOKENS_AUTO, &t, &n, &e);
        if (s != ZDP_ERR_FORMAT || strstr(e.msg, bad[i].msg) == NULL ||
            strstr(e.msg, "bad.npy") == NULL)
            fail_msg("npy case %zu: status %d, \"%s\"", i, (int)s, e.msg);
        assert_null(t);
        assert_int_equal(n, 0);
    }
    /* A header length past the end of the file. */
    const unsigned char cut[12] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, 0xff, 0x7f, '{', '}'};
    write_bytes(path_in("cut.npy"), cut, sizeof cut);
    assert_int_equal(zdp_tokens_read(path_in("cut.npy"), ZDP_TOKENS_NPY, &t, &n, &err),
                     ZDP_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "header length"));
}

static void test_detect_format(void **state) {
    (void)state;
    int32_t tok[6] = {7, 1, 300, 65535, 0, 2};
    zdp_token_format f = ZDP_TOKENS_AUTO;
    zdp_error e = {0};
    int32_t *t;
    int64_t n;
    const char *shard = path_in("auto_ok.bin");
    assert_int_equal(zdp_tokens_write_shard(shard, tok, 6, &e), ZDP_OK);
    assert_int_equal(zdp_tokens_detect(shard, &f, &e), ZDP_OK);
    assert_int_equal(f, ZDP_TOKENS_SHARD);
    assert_int_equal(zdp_tokens_read(shard, ZDP_TOKENS_AUTO, &t, &n, &e), ZDP_OK);
    assert_int_equal(n, 6);
    assert_int_equal(t[3], 65535);
    zdp_tokens_free(t);

    /* One byte of the magic damaged, under several names: an error that
     * names the file, the value found and the way to read it as bytes. */
    size_t len;
    const uint16_t tok16[6] = {7, 1, 300, 65535, 0, 2};
    unsigned char *b = shard_bytes(20240520, 1, 6, tok16, 6, &len);
    b[1] ^= 0x40;
    const char *names[] = {"damaged.bin", "damaged.dat", "damaged"};
    for (int k = 0; k < 3; k++) {
        const char *p = path_in(names[k]);
        write_bytes(p, b, len);
        f = ZDP_TOKENS_SHARD;
        assert_int_equal(zdp_tokens_detect(p, &f, &e), ZDP_ERR_FORMAT);
        ASSERT_MSG_HAS(e, p);
        ASSERT_MSG_HAS(e, "expected 20240520");
        ASSERT_MSG_HAS(e, "--data-format bytes");
        t = &tok[0];
        assert_int_equal(zdp_tokens_read(p, ZDP_TOKENS_AUTO, &t, &n, &e), ZDP_ERR_FORMAT);
        assert_null(t);
        zdp_dataset *ds = (zdp_dataset *)&e;
        assert_int_equal(zdp_dataset_open(p, ZDP_TOKENS_AUTO, 0.0, &ds, &e), ZDP_ERR_FORMAT);
        assert_null(ds);
        /* Explicitly bytes: every byte a token. */
        assert_int_equal(zdp_tokens_read(p, ZDP_TOKENS_BYTES, &t, &n, &e), ZDP_OK);
        assert_int_equal(n, (int64_t)len);
        assert_int_equal(t[1], b[1]);
        zdp_tokens_free(t);
    }
    /* The whole magic gone, but version and count are a shard's. */
    memset(b, 0, 4);
    const char *p = path_in("zeroed_magic");
    write_bytes(p, b, len);
    assert_int_equal(zdp_tokens_detect(p, &f, &e), ZDP_ERR_FORMAT);
    ASSERT_MSG_HAS(e, "header magic 0");
    free(b);
    /* A .bin that is nothing like a shard is still taken for one. */
    p = path_in("notes.bin");
    write_bytes(p, "hello\n", 6);
    assert_int_equal(zdp_tokens_detect(p, &f, &e), ZDP_ERR_FORMAT);
    ASSERT_MSG_HAS(e, ".bin");
    /* Text, short or long, and an llm.c-sized text file: bytes. */
    p = path_in("short.txt");
    write_bytes(p, "hi", 2);
    f = ZDP_TOKENS_SHARD;
    assert_int_equal(zdp_tokens_detect(p, &f, &e), ZDP_OK);
    assert_int_equal(f, ZDP_TOKENS_BYTES);
    char text[3000];
    for (size_t i = 0; i < sizeof text; i++) text[i] = "the quick brown fox\n"[i % 20];
    p = path_in("long.txt");
    write_bytes(p, text, sizeof text);
    f = ZDP_TOKENS_SHARD;
    assert_int_equal(zdp_tokens_detect(p, &f, &e), ZDP_OK);
    assert_int_equal(f, ZDP_TOKENS_BYTES);
    assert_int_equal(zdp_tokens_read(p, ZDP_TOKENS_AUTO, &t, &n, &e), ZDP_OK);
    assert_int_equal(n, (int64_t)sizeof text);
    zdp_tokens_free(t);
    /* Errors. */
    assert_int_equal(zdp_tokens_detect(path_in("missing.txt"), &f, &e), ZDP_ERR_IO);
    ASSERT_MSG_HAS(e, "missing.txt");
    assert_int_equal(zdp_tokens_detect(NULL, &f, &e), ZDP_ERR_INVALID_ARG);
}

/* ---- the arithmetic corpus ------------------------------------------------- */

static char *as_text(const int32_t *t, int64_t n) {
    char *s = malloc((size_t)n + 1);
    for (int64_t i = 0; i < n; i++) s[i] = (char)t[i];
    s[n] = '\0';
    return s;
}

/* Problems (a, b) of the fixed-width lines t[0..n) (L tokens each, max
 * operand 99), checked as they are read: digits where digits belong, and
 * the sum written least significant digit first.  Marks each in `mark`. */
static void mark_problems(const int32_t *t, int64_t n, bool mark[100][100]) {
    assert_int_equal(n % 10, 0);
    for (int64_t i = 0; i < n; i += 10) {
        const int32_t *p = t + i;
        for (int k = 0; k < 10; k++)
            if (k != 2 && k != 5 && k != 9) assert_true(p[k] >= '0' && p[k] <= '9');
        assert_int_equal(p[2], '+');
        assert_int_equal(p[5], '=');
        assert_int_equal(p[9], '\n');
        int a = (p[0] - '0') * 10 + (p[1] - '0'), b = (p[3] - '0') * 10 + (p[4] - '0');
        int c = (p[6] - '0') + 10 * (p[7] - '0') + 100 * (p[8] - '0');
        assert_int_equal(c, a + b);
        mark[a][b] = true;
    }
}

static void test_corpus_arith(void **state) {
    (void)state;
    zdp_error e = {0};
    int32_t *t, *u;
    int64_t n, m;
    /* Golden output, computed in Python from zdp.h's specification: fixed
     * width, the sum's digits least significant first. */
    assert_int_equal(zdp_corpus_arith(1234, 4, 99, 0.0, &t, &n, &e), ZDP_OK);
    char *s = as_text(t, n);
    assert_string_equal(s, "95+64=951\n46+79=521\n89+29=811\n30+83=311\n");
    free(s);
    zdp_tokens_free(t);
    assert_int_equal(zdp_corpus_arith(0, 3, 999, 0.0, &t, &n, &e), ZDP_OK);
    s = as_text(t, n);
    assert_string_equal(s, "535+700=5321\n679+444=3211\n747+090=7380\n");
    free(s);
    zdp_tokens_free(t);
    /* With a held-out quarter: the train lines redraw 89+29 (held out) and
     * the last line redraws until it finds a held-out problem. */
    assert_int_equal(zdp_corpus_arith(1234, 4, 99, 0.25, &t, &n, &e), ZDP_OK);
    s = as_text(t, n);
    assert_string_equal(s, "95+64=951\n46+79=521\n30+83=311\n62+94=651\n");
    free(s);
    zdp_tokens_free(t);
    assert_int_equal(zdp_corpus_arith(5, 10, 9, 0.5, &t, &n, &e), ZDP_OK);
    s = as_text(t, n);
    assert_string_equal(s, "8+4=21\n9+5=41\n9+1=01\n4+1=50\n7+9=61\n"
                           "2+1=30\n3+7=01\n3+3=60\n8+7=51\n1+7=80\n");
    free(s);
    zdp_tokens_free(t);

    /* Deterministic per seed; another seed differs; every line is right. */
    assert_int_equal(zdp_corpus_arith(42, 5000, 99, 0.1, &t, &n, &e), ZDP_OK);
    assert_int_equal(zdp_corpus_arith(42, 5000, 99, 0.1, &u, &m, &e), ZDP_OK);
    assert_int_equal(n, m);
    assert_memory_equal(t, u, (size_t)n * sizeof *t);
    zdp_tokens_free(u);
    assert_int_equal(zdp_corpus_arith(43, 5000, 99, 0.1, &u, &m, &e), ZDP_OK);
    assert_true(n != m || memcmp(t, u, (size_t)n * sizeof *t) != 0);
    zdp_tokens_free(u);
    assert_int_equal(n, 5000 * 10);
    /* Held out means held out: no problem of the last 500 lines is in the
     * first 4500, and both parts cover many problems. */
    static bool train[100][100], val[100][100];
    memset(train, 0, sizeof train);
    memset(val, 0, sizeof val);
    mark_problems(t, 4500 * 10, train);
    mark_problems(t + 4500 * 10, 500 * 10, val);
    int n_train = 0, n_val = 0;
    for (int a = 0; a < 100; a++)
        for (int b = 0; b < 100; b++) {
            assert_false(train[a][b] && val[a][b]);
            n_train += train[a][b];
            n_val += val[a][b];
        }
    assert_true(n_train > 3000 && n_val > 300);
    zdp_tokens_free(t);

    /* max_operand 0: "0+0=00\n" only, which cannot be split. */
    assert_int_equal(zdp_corpus_arith(7, 2, 0, 0.0, &t, &n, &e), ZDP_OK);
    s = as_text(t, n);
    assert_string_equal(s, "0+0=00\n0+0=00\n");
    free(s);
    zdp_tokens_free(t);
    assert_int_equal(zdp_corpus_arith(7, 2, 0, 0.5, &t, &n, &e), ZDP_ERR_INVALID_ARG);
    assert_null(t);
    ASSERT_MSG_HAS(e, "max_operand = 0");

    assert_int_equal(zdp_corpus_arith(1, 0, 99, 0.0, &t, &n, &e), ZDP_ERR_INVALID_ARG);
    assert_null(t);
    assert_int_equal(zdp_corpus_arith(1, 10, -1, 0.0, &t, &n, &e), ZDP_ERR_INVALID_ARG);
    ASSERT_MSG_HAS(e, "max_operand");
    assert_int_equal(zdp_corpus_arith(1, 10, 99, 1.0, &t, &n, &e), ZDP_ERR_INVALID_ARG);
    ASSERT_MSG_HAS(e, "val_fraction = 1");

    /* The dataset over it is the same bytes, split at the first held-out
     * line (floor(4 * 0.25) = 1 line), even where the token count would
     * split elsewhere (floor(50 * 0.25) = 12 tokens, not 10). */
    zdp_dataset *ds;
    assert_int_equal(zdp_dataset_create_arith(1234, 4, 99, 0.25, &ds, &e), ZDP_OK);
    assert_int_equal(zdp_dataset_n_tokens(ds, ZDP_SPLIT_TRAIN), 30);
    assert_int_equal(zdp_dataset_n_tokens(ds, ZDP_SPLIT_VAL), 10);
    assert_int_equal(zdp_dataset_tokens(ds, ZDP_SPLIT_TRAIN)[0], '9');
    assert_int_equal(zdp_dataset_tokens(ds, ZDP_SPLIT_VAL)[0], '6');
    assert_int_equal(zdp_dataset_max_token(ds), '=');
    zdp_dataset_destroy(ds);
    assert_int_equal(zdp_dataset_create_arith(1234, 5, 99, 0.25, &ds, &e), ZDP_OK);
    assert_int_equal(zdp_dataset_n_tokens(ds, ZDP_SPLIT_VAL), 10);
    assert_int_equal(zdp_dataset_tokens(ds, ZDP_SPLIT_VAL)[9], '\n');
    zdp_dataset_destroy(ds);
    /* The trainer's split: train and val share no problem. */
    assert_int_equal(zdp_dataset_create_arith(9, 20000, 99, 0.1, &ds, &e), ZDP_OK);
    assert_int_equal(zdp_dataset_n_tokens(ds, ZDP_SPLIT_VAL), 2000 * 10);
    memset(train, 0, sizeof train);
    memset(val, 0, sizeof val);
    mark_problems(zdp_dataset_tokens(ds, ZDP_SPLIT_TRAIN),
                  zdp_dataset_n_tokens(ds, ZDP_SPLIT_TRAIN), train);
    mark_problems(zdp_dataset_tokens(ds, ZDP_SPLIT_VAL), zdp_dataset_n_tokens(ds, ZDP_SPLIT_VAL),
                  val);
    for (int a = 0; a < 100; a++)
        for (int b = 0; b < 100; b++) assert_false(train[a][b] && val[a][b]);
    zdp_dataset_destroy(ds);
}

/* ---- windows and micro-batches --------------------------------------------- */

/* Dataset whose token i is i, so an input row names its window. */
static zdp_dataset *iota_dataset(int64_t n, double val_fraction) {
    int32_t *t = malloc((size_t)n * sizeof *t);
    for (int64_t i = 0; i < n; i++) t[i] = (int32_t)i;
    zdp_dataset *ds;
    zdp_error e = {0};
    assert_int_equal(zdp_dataset_create(t, n, val_fraction, &ds, &e), ZDP_OK);
    free(t);
    return ds;
}

static void test_window_contract(void **state) {
    (void)state;
    enum { T = 6, NTOK = 200 }; /* N = (200 - 1) / 6 = 33 windows */
    zdp_dataset *ds = iota_dataset(NTOK, 0.0);
    const int64_t N = 33;
    assert_int_equal(zdp_dataset_n_windows(ds, ZDP_SPLIT_TRAIN, T), N);
    zdp_error e = {0};
    for (int W = 1; W <= 4; W++) {
        for (int b = 1; b <= 3; b++) {
            int32_t in[3 * T], tg[3 * T];
            /* j up to 40 wraps the 33 windows several times for every W, b. */
            for (int64_t j = 0; j < 40; j++) {
                bool seen[33] = {false};
                for (int r = 0; r < W; r++) {
                    assert_int_equal(zdp_dataset_batch(ds, ZDP_SPLIT_TRAIN, j, r, W, b, T, in,
                                                       tg, &e), ZDP_OK);
                    for (int k = 0; k < b; k++) {
                        int64_t w = ((j * W + r) * b + k) % N;
                        for (int t = 0; t < T; t++) {
                            assert_int_equal(in[k * T + t], w * T + t);
                            assert_int_equal(tg[k * T + t], w * T + t + 1);
                        }
                        /* W*b <= 12 < N: no window twice in one step. */
                        assert_false(seen[w]);
                        seen[w] = true;
                    }
                }
            }
        }
    }
    /* The last window ends on the last usable token: [32*6, 32*6+6] = [192, 198]. */
    int32_t in[T], tg[T];
    assert_int_equal(zdp_dataset_batch(ds, ZDP_SPLIT_TRAIN, 32, 0, 1, 1, T, in, tg, &e), ZDP_OK);
    assert_int_equal(in[0], 192);
    assert_int_equal(tg[T - 1], 198);
    /* Wrap: window 33 is window 0. */
    assert_int_equal(zdp_dataset_batch(ds, ZDP_SPLIT_TRAIN, 33, 0, 1, 1, T, in, tg, &e), ZDP_OK);
    assert_int_equal(in[0], 0);
    /* Exactly T+1 tokens: one window. */
    zdp_dataset *one = iota_dataset(T + 1, 0.0);
    assert_int_equal(zdp_dataset_n_windows(one, ZDP_SPLIT_TRAIN, T), 1);
    assert_int_equal(zdp_dataset_batch(one, ZDP_SPLIT_TRAIN, 5, 1, 2, 1, T, in, tg, &e), ZDP_OK);
    assert_int_equal(tg[T - 1], T);
    assert_int_equal(zdp_dataset_n_windows(one, ZDP_SPLIT_TRAIN, T + 1), 0);
    assert_int_equal(zdp_dataset_batch(one, ZDP_SPLIT_TRAIN, 0, 0, 1, 1, T + 1, in, tg, &e),
                     ZDP_ERR_CONFIG);
    ASSERT_MSG_HAS(e, "train split has 7 tokens");
    ASSERT_MSG_HAS(e, "T + 1 = 8");
    zdp_dataset_destroy(one);
    zdp_dataset_destroy(ds);
}

static void test_split(void **state) {
    (void)state;
    zdp_dataset *ds = iota_dataset(1000, 0.1);
    assert_int_equal(zdp_dataset_n_tokens(ds, ZDP_SPLIT_TRAIN), 900);
    assert_int_equal(zdp_dataset_n_tokens(ds, ZDP_SPLIT_VAL), 100);
    assert_int_equal(zdp_dataset_tokens(ds, ZDP_SPLIT_VAL)[0], 900);
    assert_int_equal(zdp_dataset_max_token(ds), 999);
    /* Windows of T = 8: train (900-1)/8 = 112, val (100-1)/8 = 12. */
    assert_int_equal(zdp_dataset_n_windows(ds, ZDP_SPLIT_TRAIN, 8), 112);
    assert_int_equal(zdp_dataset_n_windows(ds, ZDP_SPLIT_VAL, 8), 12);
    zdp_error e = {0};
    int32_t in[4 * 8], tg[4 * 8];
    /* No train window reads a val token and no val window a train token. */
    for (int64_t j = 0; j < 60; j++) {
        for (int r = 0; r < 2; r++) {
            assert_int_equal(zdp_dataset_batch(ds, ZDP_SPLIT_TRAIN, j, r, 2, 4, 8, in, tg, &e),
                             ZDP_OK);
            for (int i = 0; i < 32; i++) assert_true(in[i] < 900 && tg[i] < 900);
            assert_int_equal(zdp_dataset_batch(ds, ZDP_SPLIT_VAL, j, r, 2, 4, 8, in, tg, &e),
                             ZDP_OK);
            for (int i = 0; i < 32; i++) assert_true(in[i] >= 900 && tg[i] < 1000);
        }
    }
    /* Val window w is val tokens [w*T, w*T+T]. */
    assert_int_equal(zdp_dataset_batch(ds, ZDP_SPLIT_VAL, 1, 1, 2, 1, 8, in, tg, &e), ZDP_OK);
    assert_int_equal(in[0], 900 + 3 * 8);
    /* The split is by tokens: it does not depend on T. */
    assert_int_equal(zdp_dataset_n_tokens(ds, ZDP_SPLIT_VAL), 100);
    zdp_dataset_destroy(ds);

    /* val_fraction 0: no val split, and asking for it says so. */
    ds = iota_dataset(50, 0.0);
    assert_int_equal(zdp_dataset_n_tokens(ds, ZDP_SPLIT_VAL), 0);
    assert_null(zdp_dataset_tokens(ds, ZDP_SPLIT_VAL));
    assert_int_equal(zdp_dataset_batch(ds, ZDP_SPLIT_VAL, 0, 0, 1, 1, 8, in, tg, &e),
                     ZDP_ERR_CONFIG);
    ASSERT_MSG_HAS(e, "val split has 0 tokens");
    ASSERT_MSG_HAS(e, "larger val_fraction");
    zdp_dataset_destroy(ds);

    /* Bad fractions and tokens. */
    int32_t t[3] = {1, -4, 2};
    assert_int_equal(zdp_dataset_create(t, 3, 1.0, &ds, &e), ZDP_ERR_INVALID_ARG);
    assert_null(ds);
    ASSERT_MSG_HAS(e, "val_fraction = 1");
    assert_int_equal(zdp_dataset_create(t, 3, -0.1, &ds, &e), ZDP_ERR_INVALID_ARG);
    assert_int_equal(zdp_dataset_create(t, 3, NAN, &ds, &e), ZDP_ERR_INVALID_ARG);
    assert_int_equal(zdp_dataset_create(t, 3, 0.1, &ds, &e), ZDP_ERR_INVALID_ARG);
    ASSERT_MSG_HAS(e, "token 1 is -4");
}

static void test_cursor_and_args(void **state) {
    (void)state;
    zdp_dataset *ds = iota_dataset(500, 0.0);
    zdp_error e = {0};
    int32_t a[2 * 5], at[2 * 5], b[2 * 5], bt[2 * 5];
    assert_int_equal(zdp_dataset_cursor(ds), 0);
    for (int64_t j = 0; j < 5; j++) {
        assert_int_equal(zdp_dataset_next(ds, 1, 3, 2, 5, a, at, &e), ZDP_OK);
        assert_int_equal(zdp_dataset_batch(ds, ZDP_SPLIT_TRAIN, j, 1, 3, 2, 5, b, bt, &e),
                         ZDP_OK);
        assert_memory_equal(a, b, sizeof a);
        assert_memory_equal(at, bt, sizeof at);
    }
    assert_int_equal(zdp_dataset_cursor(ds), 5);
    /* Resume: set the cursor and get the same micro-batch. */
    assert_int_equal(zdp_dataset_set_cursor(ds, 77, &e), ZDP_OK);
    assert_int_equal(zdp_dataset_next(ds, 2, 3, 2, 5, a, at, &e), ZDP_OK);
    assert_int_equal(zdp_dataset_batch(ds, ZDP_SPLIT_TRAIN, 77, 2, 3, 2, 5, b, bt, &e), ZDP_OK);
    assert_memory_equal(a, b, sizeof a);
    assert_int_equal(zdp_dataset_cursor(ds), 78);
    /* Errors leave the cursor alone. */
    assert_int_equal(zdp_dataset_next(ds, 3, 3, 2, 5, a, at, &e), ZDP_ERR_INVALID_ARG);
    ASSERT_MSG_HAS(e, "rank = 3");
    assert_int_equal(zdp_dataset_cursor(ds), 78);
    assert_int_equal(zdp_dataset_set_cursor(ds, -1, &e), ZDP_ERR_INVALID_ARG);
    assert_int_equal(zdp_dataset_cursor(ds), 78);

    assert_int_equal(zdp_dataset_batch(ds, ZDP_SPLIT_TRAIN, -1, 0, 1, 1, 5, a, at, &e),
                     ZDP_ERR_INVALID_ARG);
    assert_int_equal(zdp_dataset_batch(ds, ZDP_SPLIT_TRAIN, 0, 0, 1, 0, 5, a, at, &e),
                     ZDP_ERR_INVALID_ARG);
    assert_int_equal(zdp_dataset_batch(ds, ZDP_SPLIT_TRAIN, 0, 0, 1, 1, 0, a, at, &e),
                     ZDP_ERR_INVALID_ARG);
    assert_int_equal(zdp_dataset_batch(ds, (zdp_split)5, 0, 0, 1, 1, 5, a, at, &e),
                     ZDP_ERR_INVALID_ARG);
    assert_int_equal(zdp_dataset_batch(ds, ZDP_SPLIT_TRAIN, INT64_MAX / 2, 0, 4, 2, 5, a, at,
                                       &e), ZDP_ERR_INVALID_ARG);
    ASSERT_MSG_HAS(e, "overflows");
    /* Near the limit still works and wraps. */
    int64_t j = (INT64_MAX - 8) / 8 - 1;
    assert_int_equal(zdp_dataset_batch(ds, ZDP_SPLIT_TRAIN, j, 3, 4, 2, 5, a, at, &e), ZDP_OK);
    assert_int_equal(a[0], ((j * 4 + 3) * 2) % 99 * 5);
    zdp_dataset_destroy(ds);
    zdp_dataset_destroy(NULL);
    assert_int_equal(zdp_dataset_n_windows(NULL, ZDP_SPLIT_TRAIN, 5), 0);

    /* A shard through zdp_dataset_open. */
    int32_t tok[10] = {5, 4, 3, 2, 1, 0, 9, 8, 7, 6};
    const char *p = path_in("ds.bin");
    assert_int_equal(zdp_tokens_write_shard(p, tok, 10, &e), ZDP_OK);
    assert_int_equal(zdp_dataset_open(p, ZDP_TOKENS_SHARD, 0.2, &ds, &e), ZDP_OK);
    assert_int_equal(zdp_dataset_n_tokens(ds, ZDP_SPLIT_TRAIN), 8);
    assert_int_equal(zdp_dataset_tokens(ds, ZDP_SPLIT_VAL)[1], 6);
    assert_int_equal(zdp_dataset_max_token(ds), 9);
    zdp_dataset_destroy(ds);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shard_round_trip),
        cmocka_unit_test(test_shard_corrupt_headers),
        cmocka_unit_test(test_bytes_from_text),
        cmocka_unit_test(test_detect_format),
        cmocka_unit_test(test_npy),
        cmocka_unit_test(test_corpus_arith),
        cmocka_unit_test(test_window_contract),
        cmocka_unit_test(test_split),
        cmocka_unit_test(test_cursor_and_args),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
