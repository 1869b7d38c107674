/*
 * tokens.c -- token files and the generated default corpus.
 *
 * Formats (zdp/data.h):
 *   - llm.c token shards: 256 little-endian int32 {20240520, 1, n_tokens,
 *     0...}, then n_tokens little-endian uint16.  The reader trusts nothing:
 *     magic, version and the token count are checked against the file
 *     length before anything is allocated, and each message names the file,
 *     the field, what was seen and what was expected, with the fix.  The
 *     writer writes a temporary file, fsyncs it and renames it into place.
 *   - raw bytes: every byte of any file is one token (vocab 256).
 *   - the arithmetic corpus: "a+b=c\n" lines from splitmix64, specified
 *     exactly in zdp/data.h so a Python script can regenerate the same bytes.
 *   - .npy: NumPy 1-D uint16/int32/uint32 arrays (Qwen3-sized vocabularies),
 *     header (magic, dtype, shape) checked against the file length.
 *
 * Tokens are int32 in memory.  Not here: tokenisers (BPE), multi-shard
 * globs, memory-mapping.
 */
#define _POSIX_C_SOURCE 200809L

#include "data.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SHARD_HEADER_INTS 256
#define SHARD_HEADER_BYTES (SHARD_HEADER_INTS * 4)

/* ---- helpers --------------------------------------------------------------- */

static int32_t tok_le32_(const unsigned char *p) {
    return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                     (uint32_t)p[3] << 24);
}

static void tok_put_le32_(unsigned char *p, uint32_t v) {
    for (int b = 0; b < 4; b++) p[b] = (unsigned char)(v >> (8 * b));
}

void zdp_tokens_free(int32_t *tokens) {
    free(tokens);
}

/* ---- readers --------------------------------------------------------------- */

static zdp_status tok_read_shard_(const char *path, FILE *f, int64_t file_bytes,
                                  int32_t **tokens, int64_t *n_tokens, zdp_error *err) {
    unsigned char hd[SHARD_HEADER_BYTES];
    if (file_bytes < SHARD_HEADER_BYTES)
        return zdp_err_set(err, ZDP_ERR_FORMAT,
                           "%s: %" PRId64 " bytes, shorter than an llm.c token shard's "
                           "1024-byte header; the file is truncated or not a shard (use the "
                           "bytes format for a text file)", path, file_bytes);
    if (fread(hd, 1, sizeof hd, f) != sizeof hd)
        return zdp_err_set(err, ZDP_ERR_IO, "%s: reading the header: %s", path,
                           ferror(f) ? strerror(errno) : "unexpected end of file");
    int32_t magic = tok_le32_(hd), version = tok_le32_(hd + 4), n = tok_le32_(hd + 8);
    if (magic != ZDP_SHARD_MAGIC)
        return zdp_err_set(err, ZDP_ERR_FORMAT,
                           "%s: header magic %" PRId32 ", expected %d (llm.c token shard)%s",
                           path, magic, ZDP_SHARD_MAGIC,
                           magic == 20240326 ? "; this is an llm.c model checkpoint, not "
                                               "tokens"
                                             : "; not a token shard (for a text file use the "
                                               "bytes format)");
    if (version != ZDP_SHARD_VERSION)
        return zdp_err_set(err, ZDP_ERR_FORMAT,
                           "%s: shard version %" PRId32 ", zdp reads version %d (uint16 "
                           "tokens); re-create it with llm.c's dev/data scripts", path, version,
                           ZDP_SHARD_VERSION);
    if (n < 0)
        return zdp_err_set(err, ZDP_ERR_FORMAT,
                           "%s: header token count %" PRId32 " is negative; the file is "
                           "corrupt", path, n);
    int64_t want = SHARD_HEADER_BYTES + 2 * (int64_t)n;
    if (file_bytes != want)
        return zdp_err_set(err, ZDP_ERR_FORMAT,
                           "%s: header says %" PRId32 " tokens (1024 + 2 x %" PRId32 " = %"
                           PRId64 " bytes) but the file has %" PRId64 " bytes; it is %s",
                           path, n, n, want, file_bytes,
                           file_bytes < want ? "truncated" : "corrupt (extra bytes)");
    int32_t *out = malloc((size_t)(n > 0 ? n : 1) * sizeof *out);
    uint16_t *raw = malloc((size_t)(n > 0 ? n : 1) * sizeof *raw);
    if (out == NULL || raw == NULL) {
        free(out);
        free(raw);
        return zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory for %" PRId32 " tokens",
                           path, n);
    }
    if (fread(raw, 2, (size_t)n, f) != (size_t)n) {
        free(out);
        free(raw);
        return zdp_err_set(err, ZDP_ERR_IO, "%s: reading %" PRId32 " tokens: %s", path, n,
                           ferror(f) ? strerror(errno) : "unexpected end of file (was the "
                           "file changed while it was read?)");
    }
    const unsigned char *p = (const unsigned char *)raw;
    for (int32_t i = 0; i < n; i++) out[i] = (int32_t)(p[2 * i] | (p[2 * i + 1] << 8));
    free(raw);
    *tokens = out;
    *n_tokens = n;
    return ZDP_OK;
}

static zdp_status tok_read_bytes_(const char *path, FILE *f, int64_t file_bytes,
                                  int32_t **tokens, int64_t *n_tokens, zdp_error *err) {
    if (file_bytes == 0)
        return zdp_err_set(err, ZDP_ERR_FORMAT, "%s: the file is empty, so it has no tokens",
                           path);
    if ((uint64_t)file_bytes > SIZE_MAX / sizeof(int32_t))
        return zdp_err_set(err, ZDP_ERR_NOMEM, "%s: %" PRId64 " bytes is too large", path,
                           file_bytes);
    int32_t *out = malloc((size_t)file_bytes * sizeof *out);
    if (out == NULL)
        return zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory for %" PRId64 " tokens",
                           path, file_bytes);
    unsigned char buf[65536];
    int64_t done = 0;
    while (done < file_bytes) {
        size_t want = file_bytes - done < (int64_t)sizeof buf ? (size_t)(file_bytes - done)
                                                              : sizeof buf;
        size_t got = fread(buf, 1, want, f);
        if (got != want) {
            free(out);
            return zdp_err_set(err, ZDP_ERR_IO, "%s: reading byte %" PRId64 ": %s", path,
                               done + (int64_t)got,
                               ferror(f) ? strerror(errno) : "unexpected end of file (was the "
                               "file changed while it was read?)");
        }
        for (size_t i = 0; i < got; i++) out[done + (int64_t)i] = buf[i];
        done += (int64_t)got;
    }
    *tokens = out;
    *n_tokens = file_bytes;
    return ZDP_OK;
}

/* ---- .npy ------------------------------------------------------------------ */

/* NumPy's format (numpy.lib.format): "\x93NUMPY", major, minor, a header
 * length (uint16 for 1.0, uint32 for 2.0/3.0), then a Python dict literal
 * {'descr': '<u2', 'fortran_order': False, 'shape': (n,), } padded with
 * spaces and a '\n', then the array's bytes. */
#define NPY_MAGIC "\x93NUMPY"
#define NPY_MAGIC_LEN 6
#define NPY_MAX_HEADER 65536

/* The value after 'key': in the header dict, or NULL. */
static const char *tok_npy_value_(const char *hdr, const char *key) {
    char pat[32];
    snprintf(pat, sizeof pat, "'%s':", key);
    const char *p = strstr(hdr, pat);
    if (p == NULL) return NULL;
    p += strlen(pat);
    while (*p == ' ') p++;
    return p;
}

static zdp_status tok_read_npy_(const char *path, FILE *f, int64_t file_bytes, int32_t **tokens,
                                int64_t *n_tokens, zdp_error *err) {
    unsigned char pre[12];
    if (file_bytes < 10 || fread(pre, 1, 10, f) != 10 || memcmp(pre, NPY_MAGIC, NPY_MAGIC_LEN) != 0)
        return zdp_err_set(err, ZDP_ERR_FORMAT, "%s: not a .npy file (no \\x93NUMPY magic); "
                           "save the tokens with numpy.save", path);
    const int major = pre[6];
    int64_t hlen, start;
    if (major == 1) {
        hlen = pre[8] | (pre[9] << 8);
        start = 10;
    } else if (major == 2 || major == 3) {
        if (file_bytes < 12 || fread(pre + 10, 1, 2, f) != 2)
            return zdp_err_set(err, ZDP_ERR_FORMAT, "%s: .npy header truncated", path);
        hlen = (int64_t)tok_le32_(pre + 8) & 0xffffffffll;
        start = 12;
    } else {
        return zdp_err_set(err, ZDP_ERR_FORMAT, "%s: .npy format version %d.%d; zdp reads 1.0, "
                           "2.0 and 3.0 (numpy.save writes them)", path, major, pre[7]);
    }
    if (hlen > NPY_MAX_HEADER || start + hlen > file_bytes)
        return zdp_err_set(err, ZDP_ERR_FORMAT, "%s: .npy header length %" PRId64 " does not "
                           "fit the %" PRId64 "-byte file; the file is truncated or corrupt",
                           path, hlen, file_bytes);
    char hdr[NPY_MAX_HEADER + 1];
    if (fread(hdr, 1, (size_t)hlen, f) != (size_t)hlen)
        return zdp_err_set(err, ZDP_ERR_IO, "%s: reading the .npy header: %s", path,
                           ferror(f) ? strerror(errno) : "unexpected end of file");
    hdr[hlen] = '\0';
    if (memchr(hdr, '\0', (size_t)hlen) != NULL)
        return zdp_err_set(err, ZDP_ERR_FORMAT, "%s: .npy header holds a NUL byte; the file is "
                           "corrupt", path);
    const char *descr = tok_npy_value_(hdr, "descr"), *fo = tok_npy_value_(hdr, "fortran_order");
    const char *shape = tok_npy_value_(hdr, "shape");
    if (descr == NULL || fo == NULL || shape == NULL)
        return zdp_err_set(err, ZDP_ERR_FORMAT, "%s: .npy header \"%.200s\" lacks 'descr', "
                           "'fortran_order' or 'shape'; the file is corrupt", path, hdr);
    /* uint16 for vocabularies up to 65,535, int32/uint32 above (Qwen3's 151,936). */
    static const struct { const char *descr; int size; bool is_signed; } kinds[] = {
        {"'<u2'", 2, false}, {"'<i4'", 4, true}, {"'<u4'", 4, false},
    };
    int kind = -1;
    for (int k = 0; k < 3; k++)
        if (strncmp(descr, kinds[k].descr, strlen(kinds[k].descr)) == 0) kind = k;
    if (kind < 0) {
        const char *end = strchr(descr, ',');
        return zdp_err_set(err, ZDP_ERR_FORMAT, "%s: .npy dtype %.*s; zdp reads 1-D token "
                           "arrays of uint16 ('<u2'), int32 ('<i4') or uint32 ('<u4'); fix: "
                           "np.save(path, tokens.astype(np.int32))", path,
                           end ? (int)(end - descr) : 16, descr);
    }
    char *endp;
    if (*shape != '(')
        return zdp_err_set(err, ZDP_ERR_FORMAT, "%s: .npy shape %.32s is not a tuple", path, shape);
    errno = 0;
    long long n = strtoll(shape + 1, &endp, 10);
    while (*endp == ' ') endp++;
    const char *close = strchr(shape, ')');
    bool one_d = endp != shape + 1 && errno == 0 && n >= 0 && endp[0] == ',' && close != NULL;
    for (const char *q = endp + (one_d ? 1 : 0); one_d && q < close; q++) one_d = *q == ' ';
    if (!one_d)
        return zdp_err_set(err, ZDP_ERR_FORMAT, "%s: .npy shape %.*s: zdp reads a 1-D token "
                           "array (shape (n,)); fix: np.save(path, tokens.reshape(-1))", path,
                           close ? (int)(close - shape + 1) : 32, shape);
    const int size = kinds[kind].size;
    const int64_t want = start + hlen + (int64_t)n * size;
    if (file_bytes != want)
        return zdp_err_set(err, ZDP_ERR_FORMAT, "%s: .npy header says %lld tokens of %d bytes "
                           "(%" PRId64 " bytes in all) but the file has %" PRId64 " bytes; it is "
                           "%s", path, n, size, want, file_bytes,
                           file_bytes < want ? "truncated" : "corrupt (extra bytes)");
    if (n == 0)
        return zdp_err_set(err, ZDP_ERR_FORMAT, "%s: the .npy array is empty, so it has no "
                           "tokens", path);
    if ((uint64_t)n > SIZE_MAX / 4)
        return zdp_err_set(err, ZDP_ERR_NOMEM, "%s: %lld tokens is too many", path, n);
    int32_t *out = malloc((size_t)n * sizeof *out);
    unsigned char *raw = malloc((size_t)n * (size_t)size);
    if (out == NULL || raw == NULL) {
        free(out);
        free(raw);
        return zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory for %lld tokens", path, n);
    }
    zdp_status s = ZDP_OK;
    if (fread(raw, (size_t)size, (size_t)n, f) != (size_t)n)
        s = zdp_err_set(err, ZDP_ERR_IO, "%s: reading %lld tokens: %s", path, n,
                        ferror(f) ? strerror(errno) : "unexpected end of file (was the file "
                        "changed while it was read?)");
    for (long long i = 0; s == ZDP_OK && i < n; i++) {
        const unsigned char *p = raw + i * size;
        int64_t v = size == 2 ? (int64_t)(p[0] | (p[1] << 8))
                    : kinds[kind].is_signed ? (int64_t)tok_le32_(p)
                                            : (int64_t)((uint32_t)tok_le32_(p));
        if (v < 0 || v > INT32_MAX)
            s = zdp_err_set(err, ZDP_ERR_FORMAT, "%s: token %lld (position %lld) = %" PRId64
                            ": token ids are in [0, vocab_size); fix the array", path, i, i, v);
        out[i] = (int32_t)v;
    }
    free(raw);
    if (s != ZDP_OK) {
        free(out);
        return s;
    }
    *tokens = out;
    *n_tokens = n;
    return ZDP_OK;
}

/* The rule of zdp/data.h's zdp_tokens_detect.  A file that starts with the magic
 * is a shard; one that does not is bytes only when nothing about it says
 * "shard": a damaged magic must not turn a shard into 2 tokens per uint16
 * of noise that trains without a word of warning. */
zdp_status zdp_tokens_detect(const char *path, zdp_token_format *format, zdp_error *err) {
    if (path == NULL || format == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "zdp_tokens_detect: path and format must not be NULL");
    *format = ZDP_TOKENS_BYTES;
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return zdp_err_set(err, ZDP_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    unsigned char hd[SHARD_HEADER_BYTES];
    size_t got = fread(hd, 1, sizeof hd, f);
    struct stat sb;
    int bad = ferror(f) || fstat(fileno(f), &sb) != 0;
    fclose(f);
    if (bad) return zdp_err_set(err, ZDP_ERR_IO, "%s: cannot read: %s", path, strerror(errno));
    if (got >= NPY_MAGIC_LEN && memcmp(hd, NPY_MAGIC, NPY_MAGIC_LEN) == 0) {
        *format = ZDP_TOKENS_NPY;
        return ZDP_OK;
    }
    const int32_t magic = got >= 4 ? tok_le32_(hd) : 0;
    if (magic == ZDP_SHARD_MAGIC) {
        *format = ZDP_TOKENS_SHARD;
        return ZDP_OK;
    }
    const size_t len = strlen(path);
    const bool dot_bin = len >= 4 && strcmp(path + len - 4, ".bin") == 0;
    bool near = false, header = false;
    if (got == sizeof hd) {
        unsigned char want[4];
        tok_put_le32_(want, ZDP_SHARD_MAGIC);
        int same = 0;
        for (int b = 0; b < 4; b++) same += hd[b] == want[b];
        near = same >= 3;
        const int32_t version = tok_le32_(hd + 4), n = tok_le32_(hd + 8);
        header = version == ZDP_SHARD_VERSION && n >= 0 &&
                 (int64_t)sb.st_size == SHARD_HEADER_BYTES + 2 * (int64_t)n;
    }
    if (!dot_bin && !near && !header) return ZDP_OK;
    return zdp_err_set(err, ZDP_ERR_FORMAT,
                       "%s: header magic %" PRId32 ", expected %d: %s, so it is not read as "
                       "bytes; fix: repair or re-create the shard, or, if the file really is "
                       "raw bytes or text, say so (zdp train --data-format bytes, "
                       "ZDP_TOKENS_BYTES)",
                       path, magic, ZDP_SHARD_MAGIC,
                       magic == 20240326 ? "an llm.c model checkpoint, not tokens"
                       : near            ? "a damaged llm.c token shard magic"
                       : header          ? "the rest of the header (version 1, token count "
                                           "matching the file size) is an llm.c token shard's"
                                         : "a .bin file is taken for an llm.c token shard");
}

zdp_status zdp_tokens_read(const char *path, zdp_token_format format, int32_t **tokens,
                           int64_t *n_tokens, zdp_error *err) {
    if (tokens != NULL) *tokens = NULL;
    if (n_tokens != NULL) *n_tokens = 0;
    if (path == NULL || tokens == NULL || n_tokens == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "zdp_tokens_read: path, tokens and n_tokens must not be NULL");
    if (format != ZDP_TOKENS_SHARD && format != ZDP_TOKENS_BYTES && format != ZDP_TOKENS_AUTO &&
        format != ZDP_TOKENS_NPY)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "%s: token format %d is not ZDP_TOKENS_SHARD, ZDP_TOKENS_BYTES, "
                           "ZDP_TOKENS_NPY or ZDP_TOKENS_AUTO", path, (int)format);
    if (format == ZDP_TOKENS_AUTO) {
        zdp_status d = zdp_tokens_detect(path, &format, err);
        if (d != ZDP_OK) return d;
    }
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return zdp_err_set(err, ZDP_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    zdp_status s;
    if (fstat(fileno(f), &sb) != 0)
        s = zdp_err_set(err, ZDP_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    else if (!S_ISREG(sb.st_mode))
        s = zdp_err_set(err, ZDP_ERR_IO, "%s: not a regular file", path);
    else if (format == ZDP_TOKENS_SHARD)
        s = tok_read_shard_(path, f, (int64_t)sb.st_size, tokens, n_tokens, err);
    else if (format == ZDP_TOKENS_NPY)
        s = tok_read_npy_(path, f, (int64_t)sb.st_size, tokens, n_tokens, err);
    else
        s = tok_read_bytes_(path, f, (int64_t)sb.st_size, tokens, n_tokens, err);
    fclose(f);
    return s;
}

/* ---- shard writer ---------------------------------------------------------- */

zdp_status zdp_tokens_write_shard(const char *path, const int32_t *tokens, int64_t n,
                                  zdp_error *err) {
    if (path == NULL || path[0] == '\0' || (tokens == NULL && n > 0))
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "zdp_tokens_write_shard: path is empty or tokens is NULL");
    if (n < 0 || n > INT32_MAX)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "%s: %" PRId64 " tokens; a shard holds 0..%d (the header's count "
                           "is an int32): split the tokens over several shards", path, n,
                           INT32_MAX);
    for (int64_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] > 65535)
            return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                               "%s: tokens[%" PRId64 "] = %" PRId32 ", but a shard stores "
                               "uint16 tokens (0..65535)", path, i, tokens[i]);
    }
    size_t tmp_cap = strlen(path) + 32;
    char *tmp = malloc(tmp_cap);
    unsigned char *buf = malloc(65536);
    if (tmp == NULL || buf == NULL) {
        free(tmp);
        free(buf);
        return zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory", path);
    }
    snprintf(tmp, tmp_cap, "%s.tmp.%ld", path, (long)getpid());
    zdp_status s = ZDP_OK;
    FILE *f = fopen(tmp, "wb");
    if (f == NULL) {
        s = zdp_err_set(err, ZDP_ERR_IO, "%s: cannot create the temporary file %s: %s", path,
                        tmp, strerror(errno));
        goto done;
    }
    unsigned char hd[SHARD_HEADER_BYTES] = {0};
    tok_put_le32_(hd, ZDP_SHARD_MAGIC);
    tok_put_le32_(hd + 4, ZDP_SHARD_VERSION);
    tok_put_le32_(hd + 8, (uint32_t)n);
    bool ok = fwrite(hd, 1, sizeof hd, f) == sizeof hd;
    for (int64_t i = 0; ok && i < n;) {
        size_t k = 0;
        for (; k < 65536 / 2 && i < n; k++, i++) {
            buf[2 * k] = (unsigned char)(tokens[i] & 0xff);
            buf[2 * k + 1] = (unsigned char)(tokens[i] >> 8);
        }
        ok = fwrite(buf, 2, k, f) == k;
    }
    ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int saved = errno;
    if (fclose(f) != 0 && ok) {
        ok = false;
        saved = errno;
    }
    if (!ok) {
        s = zdp_err_set(err, ZDP_ERR_IO, "%s: writing %s: %s", path, tmp, strerror(saved));
        unlink(tmp);
        goto done;
    }
    if (rename(tmp, path) != 0) {
        s = zdp_err_set(err, ZDP_ERR_IO, "%s: cannot rename %s into place: %s", path, tmp,
                        strerror(errno));
        unlink(tmp);
    }
done:
    free(tmp);
    free(buf);
    return s;
}

/* ---- the arithmetic corpus ------------------------------------------------- */

/* v as exactly `width` decimal digits (zero-padded) into p, most significant
 * first, or least significant first when `reversed`. */
static void tok_put_digits_(int32_t *p, uint64_t v, int width, bool reversed) {
    for (int i = 0; i < width; i++, v /= 10)
        p[reversed ? i : width - 1 - i] = (int32_t)('0' + v % 10);
}

/* Whether problem (a, b) is held out (zdp/data.h: a hash of the seed and the
 * problem, below val_fraction).  A property of the problem, not of the line,
 * so a held-out problem can never turn up in the train split by chance. */
static bool tok_held_out_(uint64_t seed, uint64_t a, uint64_t b, uint64_t m, double val_fraction) {
    uint64_t state = seed * 0x9E3779B97F4A7C15ull + a * m + b;
    return (double)(zdp_splitmix64(&state) >> 11) * 0x1.0p-53 < val_fraction;
}

zdp_status zdp_corpus_arith(uint64_t seed, int64_t n_lines, int64_t max_operand,
                            double val_fraction, int32_t **tokens, int64_t *n_tokens,
                            zdp_error *err) {
    if (tokens != NULL) *tokens = NULL;
    if (n_tokens != NULL) *n_tokens = 0;
    if (tokens == NULL || n_tokens == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "zdp_corpus_arith: tokens and n_tokens must not be NULL");
    if (max_operand < 0 || max_operand > 1000000000)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "arith corpus: max_operand = %" PRId64 ", expected 0..1000000000 "
                           "(e.g. 99 for two-digit sums)", max_operand);
    if (!(val_fraction >= 0.0 && val_fraction < 1.0))
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "arith corpus: val_fraction = %g, expected 0 <= val_fraction < 1 "
                           "(e.g. 0.1; 0 for no held-out problems)", val_fraction);
    /* Every line is "a+b=c\n" at a fixed width: d digits for a and b, d + 1
     * for the sum, so line k is tokens [k*L, k*L + L). */
    int d = 1;
    for (int64_t v = max_operand; v >= 10; v /= 10) d++;
    const int64_t L = zdp_arith_line_len(max_operand);
    if (n_lines < 1 || n_lines > (int64_t)(SIZE_MAX / sizeof(int32_t)) / L / 2)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "arith corpus: n_lines = %" PRId64 ", expected >= 1 (and small "
                           "enough to fit in memory)", n_lines);
    int32_t *out = malloc((size_t)(n_lines * L) * sizeof *out);
    if (out == NULL)
        return zdp_err_set(err, ZDP_ERR_NOMEM,
                           "arith corpus: out of memory for %" PRId64 " lines", n_lines);
    const int64_t n_val = zdp_arith_val_lines(n_lines, val_fraction);
    uint64_t state = seed, m = (uint64_t)max_operand + 1;
    for (int64_t line = 0; line < n_lines; line++) {
        /* Train lines redraw held-out problems and val lines everything else.
         * The bound only matters when one side has (almost) no problems. */
        const bool want_held = line >= n_lines - n_val;
        uint64_t a, b;
        int tries = 0;
        do {
            a = zdp_splitmix64(&state) % m;
            b = zdp_splitmix64(&state) % m;
        } while (n_val > 0 && tok_held_out_(seed, a, b, m, val_fraction) != want_held &&
                 ++tries < (1 << 20));
        if (tries == 1 << 20) {
            free(out);
            return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                               "arith corpus: no %s problem in 2^20 draws with max_operand = "
                               "%" PRId64 " and val_fraction = %g; fix: a larger max_operand or "
                               "a val_fraction further from 0 and 1",
                               want_held ? "held-out" : "train", max_operand, val_fraction);
        }
        int32_t *p = out + line * L;
        tok_put_digits_(p, a, d, false);
        p[d] = '+';
        tok_put_digits_(p + d + 1, b, d, false);
        p[2 * d + 1] = '=';
        tok_put_digits_(p + 2 * d + 2, a + b, d + 1, true);
        p[L - 1] = '\n';
    }
    *tokens = out;
    *n_tokens = n_lines * L;
    return ZDP_OK;
}
