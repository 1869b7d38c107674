/*
 * test_tokenizer.c -- the byte-level BPE tokenizers (src/tokenizer/) on tiny
 * tokenizer.json files this test writes: merge ranks and their order, both
 * forms of merges, ignore_merges, the regex Split behaviours, ByteLevel's
 * regex and add_prefix_space, added tokens (special or not, longest match,
 * lstrip/rstrip), NFC, invalid UTF-8 and the round trip on random bytes,
 * decode errors, the folder (tokenizer_config.json's BOS/EOS, GPT-2's two
 * files), and a malformed file's message naming the file and the key.
 *
 * Needs nothing outside the repository; the real tokenizers are checked
 * against the reference in tests/cli/test_tokenizer_reference.sh.
 */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */

#include <setjmp.h> /* cmocka needs these three first */
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "zdp/zdp.h"

/* ---- a tiny tokenizer.json ------------------------------------------------------ */

/* GPT-2's byte -> character mapping (the printable Latin-1 bytes as
 * themselves, the rest from U+0100 in byte order), as UTF-8. */
static void byte_char_(int b, char out[3]) {
    int k = 0, cp = -1;
    for (int x = 0; x < 256; x++) {
        const int printable = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174;
        const int c = printable ? x : 256 + k++;
        if (x == b) cp = c;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = 0;
    }
}

/* A byte-level string for raw bytes s ("Ġw" for " w"). */
static char *bl_(const char *s) {
    static char buf[8][256];
    static int next;
    char *o = buf[next++ % 8];
    o[0] = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char c[3];
        byte_char_(*p, c);
        strcat(o, c);
    }
    return o;
}

/* Raw-byte merges "a b" of the tiny model, in rank order; byte b is id b,
 * merge k's result is id 256 + k. */
static const char *const merges_[][2] = {
    {"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {" ", "w"}, {"a", "b"}, {"b", "c"},
    {"a", "a"}, {" w", "o"}, {"'", "S"}, {"\xc5", "\xbf"}, {"'", "\xc5\xbf"}, {"1", "2"},
};
#define N_MERGES_ (sizeof merges_ / sizeof merges_[0])

/* The tiny tokenizer.json: 256 byte tokens, the merges (pairs: as arrays),
 * `extra` vocabulary entries, then the given pre_tokenizer, normalizer and
 * added_tokens (JSON texts; NULL: null). */
static json_t *tiny_(bool pairs, const char *pre, const char *norm, const char *added) {
    json_t *vocab = json_object(), *merges = json_array();
    for (int b = 0; b < 256; b++) {
        char c[3];
        byte_char_(b, c);
        json_object_set_new(vocab, c, json_integer(b));
    }
    for (size_t k = 0; k < N_MERGES_; k++) {
        char a[64], b[64], ab[128];
        snprintf(a, sizeof a, "%s", bl_(merges_[k][0]));
        snprintf(b, sizeof b, "%s", bl_(merges_[k][1]));
        snprintf(ab, sizeof ab, "%s%s", a, b);
        json_object_set_new(vocab, ab, json_integer(256 + (int)k));
        if (pairs) {
            json_array_append_new(merges, json_pack("[ss]", a, b));
        } else {
            char m[160];
            snprintf(m, sizeof m, "%s %s", a, b);
            json_array_append_new(merges, json_string(m));
        }
    }
    json_object_set_new(vocab, "xyz", json_integer(300)); /* no merges lead here */
    json_error_t je;
    json_t *root = json_pack("{s:{s:s, s:o, s:o}, s:o, s:o, s:{s:s}}", "model", "type", "BPE",
                             "vocab", vocab, "merges", merges,
                             "pre_tokenizer", pre ? json_loads(pre, 0, &je) : json_null(),
                             "normalizer", norm ? json_loads(norm, 0, &je) : json_null(),
                             "decoder", "type", "ByteLevel");
    if (added) json_object_set_new(root, "added_tokens", json_loads(added, 0, &je));
    assert_non_null(root);
    return root;
}

static const char *const bytelevel_ =
    "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true}";

static zdp_tokenizer *load_(json_t *root) {
    char *text = json_dumps(root, 0);
    json_decref(root);
    zdp_tokenizer *t = NULL;
    zdp_error err = {0};
    zdp_status s = zdp_tokenizer_load_json(text, strlen(text), "tiny.json", &t, &err);
    free(text);
    if (s != ZDP_OK) fprintf(stderr, "load failed: %s\n", err.msg);
    assert_int_equal(s, ZDP_OK);
    return t;
}

/* Encodes s and compares with want[0..n) ids; also checks the round trip. */
static void expect_(const zdp_tokenizer *t, const char *s, size_t len, unsigned flags,
                    const int32_t *want, size_t n) {
    int32_t *ids = NULL;
    size_t n_ids = 0;
    zdp_error err;
    assert_int_equal(zdp_tokenizer_encode(t, s, len, flags, &ids, &n_ids, &err), ZDP_OK);
    if (n_ids != n || (n && memcmp(ids, want, n * sizeof *ids) != 0)) {
        fprintf(stderr, "encode(\"%.*s\"): got", (int)len, s);
        for (size_t i = 0; i < n_ids; i++) fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, ", want");
        for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", want[i]);
        fprintf(stderr, "\n");
        fail();
    }
    char *back = NULL;
    size_t blen = 0;
    assert_int_equal(zdp_tokenizer_decode(t, ids, n_ids, &back, &blen, &err), ZDP_OK);
    free(ids);
    free(back);
}

#define EXPECT(t, s, flags, ...)                                                       \
    do {                                                                               \
        const int32_t w_[] = {__VA_ARGS__};                                            \
        expect_((t), (s), strlen(s), (flags), w_, sizeof w_ / sizeof w_[0]);           \
    } while (0)

/* ---- BPE -------------------------------------------------------------------------- */

static void test_merges_by_rank_and_both_forms(void **state) {
    (void)state;
    for (int pairs = 0; pairs < 2; pairs++) {
        zdp_tokenizer *t = load_(tiny_(pairs, bytelevel_, NULL, NULL));
        EXPECT(t, "hello", 0, 259);                  /* he, ll, hell, hello */
        EXPECT(t, "hello world", 0, 259, 264, 'r', 'l', 'd'); /* " w" then " wo" */
        EXPECT(t, "abc", 0, 261, 'c');               /* "a b" ranks before "b c" */
        EXPECT(t, "bc", 0, 262);
        EXPECT(t, "aaa", 0, 263, 'a');               /* equal ranks: leftmost first */
        EXPECT(t, "aaaa", 0, 263, 263);
        EXPECT(t, "xyz", 0, 'x', 'y', 'z');          /* in the vocabulary, but no merges */
        EXPECT(t, "", 0, );
        assert_int_equal(zdp_tokenizer_vocab_size(t), 301);
        assert_int_equal(zdp_tokenizer_token_id(t, bl_(" wo")), 264);
        assert_int_equal(zdp_tokenizer_token_id(t, "nope"), -1);
        assert_int_equal(zdp_tokenizer_bos_id(t), -1);
        zdp_tokenizer_destroy(t);
    }
}

static void test_ignore_merges(void **state) {
    (void)state;
    json_t *root = tiny_(false, bytelevel_, NULL, NULL);
    json_object_set_new(json_object_get(root, "model"), "ignore_merges", json_true());
    zdp_tokenizer *t = load_(root);
    EXPECT(t, "xyz", 0, 300); /* a word that is a token is not split */
    EXPECT(t, "xyzx", 0, 'x', 'y', 'z', 'x');
    zdp_tokenizer_destroy(t);
}

/* ---- pre-tokenizers ------------------------------------------------------------------- */

/* A Split step then ByteLevel without its regex. */
#define SPLIT_(rx, behavior, invert)                                                      \
    "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": " \
    "{\"Regex\": \"" rx "\"}, \"behavior\": \"" behavior "\", \"invert\": " invert "}, "   \
    "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}]}"

static void test_split_behaviours_and_prefix_space(void **state) {
    (void)state;
    /* No regex: the whole text is one word, so " w" merges across "o w". */
    zdp_tokenizer *t = load_(tiny_(false, "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
                                          "\"use_regex\": false}", NULL, NULL));
    EXPECT(t, "hello world", 0, 259, 264, 'r', 'l', 'd');
    EXPECT(t, "ab1ab", 0, 261, '1', 261);
    zdp_tokenizer_destroy(t);
    /* Isolated on digits: "ab" and "1" and "ab" are words. */
    t = load_(tiny_(false, SPLIT_("b", "Isolated", "false"), NULL, NULL));
    EXPECT(t, "abc", 0, 'a', 'b', 'c');
    EXPECT(t, "aab", 0, 263, 'b');
    zdp_tokenizer_destroy(t);
    /* Removed: the matches (digits) disappear. */
    t = load_(tiny_(false, "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", "
                           "\"pattern\": {\"String\": \"1\"}, \"behavior\": \"Removed\", "
                           "\"invert\": false}, {\"type\": \"ByteLevel\", \"add_prefix_space\": "
                           "false, \"use_regex\": false}]}", NULL, NULL));
    EXPECT(t, "b1c1", 0, 'b', 'c');
    zdp_tokenizer_destroy(t);
    /* Removed with invert: only the matches stay. */
    t = load_(tiny_(false, "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", "
                           "\"pattern\": {\"Regex\": \"b+\"}, \"behavior\": \"Removed\", "
                           "\"invert\": true}, {\"type\": \"ByteLevel\", \"add_prefix_space\": "
                           "false, \"use_regex\": false}]}", NULL, NULL));
    EXPECT(t, "abbc", 0, 'b', 'b');
    zdp_tokenizer_destroy(t);
    /* Digits (SmolLM2's): ASCII digits apart, each alone with individual_digits. */
    t = load_(tiny_(false, "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Digits\", "
                           "\"individual_digits\": true}, {\"type\": \"ByteLevel\", "
                           "\"add_prefix_space\": false, \"use_regex\": false}]}", NULL, NULL));
    EXPECT(t, "a12b", 0, 'a', '1', '2', 'b');
    EXPECT(t, "hello world", 0, 259, 264, 'r', 'l', 'd');
    zdp_tokenizer_destroy(t);
    t = load_(tiny_(false, "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Digits\", "
                           "\"individual_digits\": false}, {\"type\": \"ByteLevel\", "
                           "\"add_prefix_space\": false, \"use_regex\": false}]}", NULL, NULL));
    EXPECT(t, "a12b", 0, 'a', 268, 'b');
    zdp_tokenizer_destroy(t);
    /* add_prefix_space: "world" becomes " world". */
    t = load_(tiny_(false, "{\"type\": \"ByteLevel\", \"add_prefix_space\": true}", NULL, NULL));
    EXPECT(t, "world", 0, 264, 'r', 'l', 'd');
    zdp_tokenizer_destroy(t);
}

/* Regexes as the reference (JavaScript) reads them: its \\s (U+3000 and
 * U+FEFF are space, U+0085 is not), and Qwen3/Llama 3's contractions group
 * ASCII-only (PCRE2's caseless match would take U+017F for s). */

static void test_regex_reads_like_javascript(void **state) {
    (void)state;
    zdp_tokenizer *t = load_(tiny_(false, SPLIT_("\\\\s", "Removed", "false"), NULL, NULL));
    EXPECT(t, "a\xe3\x80\x80" "b", 0, 'a', 'b');          /* U+3000 removed */
    EXPECT(t, "a\xef\xbb\xbf" "b", 0, 'a', 'b');          /* U+FEFF removed */
    EXPECT(t, "a\xc2\x85" "b", 0, 'a', 0xC2, 0x85, 'b');   /* U+0085 kept */
    EXPECT(t, "a \t\n" "b", 0, 'a', 'b');
    zdp_tokenizer_destroy(t);
    t = load_(tiny_(false, SPLIT_("\\\\S+", "Removed", "true"), NULL, NULL));
    EXPECT(t, "ab\xe3\x80\x80" "ab", 0, 261, 261);
    zdp_tokenizer_destroy(t);
    t = load_(tiny_(false, SPLIT_("(?i:'s|'t|'re|'ve|'m|'ll|'d)|\\\\p{L}+|[^\\\\s\\\\p{L}]+|\\\\s+",
                                  "Isolated", "false"), NULL, NULL));
    EXPECT(t, "ab'Sab", 0, 261, 265, 261);         /* "'S" is one word */
    EXPECT(t, "ab'\xc5\xbf", 0, 261, '\'', 266);  /* "'" and U+017F are two */
    zdp_tokenizer_destroy(t);
}

/* ---- added tokens, NFC, invalid UTF-8 --------------------------------------------------- */

static void test_added_tokens(void **state) {
    (void)state;
    zdp_tokenizer *t = load_(tiny_(false, bytelevel_, NULL,
        "[{\"id\": 400, \"content\": \"<|e|>\", \"special\": true},"
        " {\"id\": 401, \"content\": \"<|e|>x\", \"special\": true},"
        " {\"id\": 402, \"content\": \"<t>\", \"special\": false},"
        " {\"id\": 403, \"content\": \"[L]\", \"special\": true, \"lstrip\": true, \"rstrip\": true}]"));
    EXPECT(t, "ab<|e|>ab", ZDP_TOKENIZE_SPECIAL, 261, 400, 261);
    EXPECT(t, "<|e|>xab", ZDP_TOKENIZE_SPECIAL, 401, 261); /* the longest match */
    /* Without the flag a special token's text is text; a non-special one still matches. */
    EXPECT(t, "<|e|><t>", 0, '<', '|', 'e', '|', '>', 402);
    EXPECT(t, "ab  [L]  ab", ZDP_TOKENIZE_SPECIAL, 261, 403, 261); /* lstrip, rstrip */
    assert_int_equal(zdp_tokenizer_token_id(t, "<|e|>"), 400);
    assert_int_equal(zdp_tokenizer_vocab_size(t), 404);
    char *out = NULL;
    size_t n = 0;
    zdp_error err;
    const int32_t ids[] = {261, 400, 402};
    assert_int_equal(zdp_tokenizer_decode(t, ids, 3, &out, &n, &err), ZDP_OK);
    assert_string_equal(out, "ab<|e|><t>");
    free(out);
    zdp_tokenizer_destroy(t);
}

static void test_nfc(void **state) {
    (void)state;
    zdp_tokenizer *t = load_(tiny_(false, bytelevel_, "{\"type\": \"NFC\"}", NULL));
    EXPECT(t, "e\xcc\x81", 0, 0xC3, 0xA9); /* e + U+0301 -> U+00E9 */
    EXPECT(t, "\xc3\xa9", 0, 0xC3, 0xA9);
    zdp_tokenizer_destroy(t);
    t = load_(tiny_(false, bytelevel_, NULL, NULL));
    EXPECT(t, "e\xcc\x81", 0, 'e', 0xCC, 0x81); /* no normalizer: unchanged */
    zdp_tokenizer_destroy(t);
}

static void test_invalid_utf8_and_round_trip(void **state) {
    (void)state;
    zdp_tokenizer *t = load_(tiny_(false, bytelevel_, NULL, "[{\"id\": 400, \"content\": "
                                   "\"<|e|>\", \"special\": true}]"));
    /* Each invalid byte is its byte token and a boundary: "he" + FF + "llo". */
    EXPECT(t, "he\xffllo", 0, 256, 0xFF, 257, 'o');
    EXPECT(t, "\xed\xa0\x80", 0, 0xED, 0xA0, 0x80); /* a surrogate is not UTF-8 */
    EXPECT(t, "\xc0\xaf" "ab", 0, 0xC0, 0xAF, 261); /* nor an overlong form */
    uint64_t seed = 7;
    char buf[300];
    for (int round = 0; round < 2000; round++) {
        size_t n = zdp_splitmix64(&seed) % sizeof buf;
        for (size_t i = 0; i < n; i++) {
            uint64_t r = zdp_splitmix64(&seed);
            /* Mostly ASCII letters and spaces, some high bytes, some "<|e|>". */
            buf[i] = (char)(r % 4 == 0 ? (int)(r >> 8) & 0xFF : "hello wab<|e|>\n\t"[(r >> 8) % 16]);
        }
        int32_t *ids = NULL;
        size_t k = 0;
        zdp_error err;
        assert_int_equal(zdp_tokenizer_encode(t, buf, n, round & 1 ? ZDP_TOKENIZE_SPECIAL : 0,
                                              &ids, &k, &err), ZDP_OK);
        char *back = NULL;
        size_t m = 0;
        assert_int_equal(zdp_tokenizer_decode(t, ids, k, &back, &m, &err), ZDP_OK);
        assert_int_equal(m, n);
        assert_memory_equal(back, buf, n);
        free(ids);
        free(back);
    }
    zdp_tokenizer_destroy(t);
}

static void test_decode_errors(void **state) {
    (void)state;
    zdp_tokenizer *t = load_(tiny_(false, bytelevel_, NULL, NULL));
    const int32_t ids[] = {104, 299, 5};
    char *out = (char *)1;
    size_t n = 9;
    zdp_error err;
    assert_int_equal(zdp_tokenizer_decode(t, ids, 3, &out, &n, &err), ZDP_ERR_INVALID_ARG);
    assert_null(out);
    assert_non_null(strstr(err.msg, "token 1 = 299"));
    const int32_t neg[] = {-1};
    assert_int_equal(zdp_tokenizer_decode(t, neg, 1, &out, &n, &err), ZDP_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "token 0 = -1"));
    zdp_tokenizer_destroy(t);
}

/* ---- the folder ---------------------------------------------------------------------------- */

static void write_(const char *dir, const char *name, const char *text) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void rm_(const char *dir, const char *name) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    unlink(p);
}

static void test_folder_config_and_gpt2_files(void **state) {
    (void)state;
    char dir[] = "/tmp/zdp_tok_XXXXXX";
    assert_non_null(mkdtemp(dir));
    zdp_tokenizer *t = NULL;
    zdp_error err;
    /* Nothing there: the message names the folder and what it looks for. */
    assert_int_equal(zdp_tokenizer_load(dir, &t, &err), ZDP_ERR_IO);
    assert_non_null(strstr(err.msg, dir));
    assert_non_null(strstr(err.msg, "tokenizer.json"));
    /* tokenizer.json + tokenizer_config.json: BOS/EOS as a string and as an object. */
    json_t *root = tiny_(false, bytelevel_, NULL, "[{\"id\": 400, \"content\": \"<s>\", "
                         "\"special\": true}, {\"id\": 401, \"content\": \"</s>\", \"special\": true}]");
    char *text = json_dumps(root, 0);
    json_decref(root);
    write_(dir, "tokenizer.json", text);
    free(text);
    write_(dir, "tokenizer_config.json", "{\"bos_token\": \"<s>\", \"eos_token\": {\"content\": "
                                         "\"</s>\"}, \"model_max_length\": 1e30}");
    assert_int_equal(zdp_tokenizer_load(dir, &t, &err), ZDP_OK);
    assert_int_equal(zdp_tokenizer_bos_id(t), 400);
    assert_int_equal(zdp_tokenizer_eos_id(t), 401);
    /* encode_file reads the bytes as they are. */
    write_(dir, "data.txt", "hello<s>");
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(zdp_tokenizer_encode_file(t, (strcat(strcpy((char[600]){0}, dir), "/data.txt")),
                                               ZDP_TOKENIZE_SPECIAL, &ids, &n, &err), ZDP_OK);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 259);
    assert_int_equal(ids[1], 400);
    free(ids);
    assert_int_equal(zdp_tokenizer_encode_file(t, "/nonexistent/x.txt", 0, &ids, &n, &err), ZDP_ERR_IO);
    assert_non_null(strstr(err.msg, "/nonexistent/x.txt"));
    zdp_tokenizer_destroy(t);
    /* An EOS that is no token: the file and the key. */
    write_(dir, "tokenizer_config.json", "{\"eos_token\": \"<nope>\"}");
    assert_int_equal(zdp_tokenizer_load(dir, &t, &err), ZDP_ERR_FORMAT);
    assert_null(t);
    assert_non_null(strstr(err.msg, "tokenizer_config.json"));
    assert_non_null(strstr(err.msg, "eos_token = \"<nope>\""));
    rm_(dir, "tokenizer_config.json");
    rm_(dir, "tokenizer.json");
    /* GPT-2's encoder.json + vocab.bpe give what the same tokenizer.json gives. */
    json_t *enc = json_object();
    for (int b = 0; b < 256; b++) {
        char c[3];
        byte_char_(b, c);
        json_object_set_new(enc, c, json_integer(b));
    }
    char bpe[4096] = "#version: 0.2\n";
    for (size_t k = 0; k < N_MERGES_; k++) {
        char a[64], ab[128];
        snprintf(a, sizeof a, "%s", bl_(merges_[k][0]));
        snprintf(ab, sizeof ab, "%s%s", a, bl_(merges_[k][1]));
        json_object_set_new(enc, ab, json_integer(256 + (int)k));
        strcat(bpe, a);
        strcat(bpe, " ");
        strcat(bpe, bl_(merges_[k][1]));
        strcat(bpe, "\n");
    }
    json_object_set_new(enc, "<|endoftext|>", json_integer(290));
    text = json_dumps(enc, 0);
    json_decref(enc);
    write_(dir, "encoder.json", text);
    free(text);
    write_(dir, "vocab.bpe", bpe);
    assert_int_equal(zdp_tokenizer_load(dir, &t, &err), ZDP_OK);
    EXPECT(t, "hello world<|endoftext|>", ZDP_TOKENIZE_SPECIAL, 259, 264, 'r', 'l', 'd', 290);
    assert_int_equal(zdp_tokenizer_eos_id(t), 290);
    assert_int_equal(zdp_tokenizer_bos_id(t), 290);
    zdp_tokenizer_destroy(t);
    /* A broken merge line names vocab.bpe and the line. */
    write_(dir, "vocab.bpe", "#version: 0.2\nh e\nnope\n");
    assert_int_equal(zdp_tokenizer_load(dir, &t, &err), ZDP_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "vocab.bpe: line 3 = \"nope\""));
    rm_(dir, "encoder.json");
    rm_(dir, "vocab.bpe");
    rm_(dir, "data.txt");
    rmdir(dir);
}

/* ---- malformed tokenizer.json: the file, the key, the fix ----------------------------------- */

static void test_malformed_names_file_and_key(void **state) {
    (void)state;
    static const struct {
        const char *path, *value; /* a JSON pointer-ish path into the tiny file, and its new JSON */
        zdp_status code;
        const char *msg;
    } cases[] = {
        {"model.type", "\"WordPiece\"", ZDP_ERR_UNSUPPORTED, "model.type = \"WordPiece\""},
        {"model.vocab", "[1]", ZDP_ERR_FORMAT, "model.vocab: expected an object"},
        {"model.merges", "{}", ZDP_ERR_FORMAT, "model.merges: expected an array"},
        {"model.merges", "[\"h e\", \"q QQ\"]", ZDP_ERR_FORMAT, "model.merges[1] = \"q QQ\""},
        {"model.merges", "[\"he\"]", ZDP_ERR_FORMAT, "model.merges[0] = \"he\""},
        {"model.merges", "[[\"h\"]]", ZDP_ERR_FORMAT, "model.merges[0]: expected"},
        {"model.byte_fallback", "true", ZDP_ERR_UNSUPPORTED, "model.byte_fallback"},
        {"model.dropout", "0.1", ZDP_ERR_UNSUPPORTED, "model.dropout"},
        {"normalizer", "{\"type\": \"Lowercase\"}", ZDP_ERR_UNSUPPORTED, "normalizer.type = \"Lowercase\""},
        {"pre_tokenizer", "{\"type\": \"Metaspace\"}", ZDP_ERR_UNSUPPORTED, "pre_tokenizer.type = \"Metaspace\""},
        {"pre_tokenizer", "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", "
                          "\"pattern\": {\"Regex\": \"(\"}, \"behavior\": \"Isolated\"}]}",
         ZDP_ERR_FORMAT, "pre_tokenizer.pretokenizers[0].pattern = \"(\""},
        {"pre_tokenizer", "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, \"behavior\": "
                          "\"MergedWithPrevious\"}", ZDP_ERR_UNSUPPORTED, "pre_tokenizer.behavior = \"MergedWithPrevious\""},
        {"pre_tokenizer", "null", ZDP_ERR_UNSUPPORTED, "no \"ByteLevel\" step"},
        {"decoder", "null", ZDP_ERR_UNSUPPORTED, "decoder"},
        {"added_tokens", "[{\"id\": 5}]", ZDP_ERR_FORMAT, "added_tokens[0]: expected"},
        {"added_tokens", "[{\"id\": -5, \"content\": \"x\"}]", ZDP_ERR_FORMAT, "added_tokens[0].id = -5"},
        {"added_tokens", "[{\"id\": 9, \"content\": \"x\", \"single_word\": true}]",
         ZDP_ERR_UNSUPPORTED, "added_tokens[0].single_word"},
        {"model", "null", ZDP_ERR_FORMAT, "model: expected an object"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_t *root = tiny_(false, bytelevel_, NULL, NULL);
        json_error_t je;
        json_t *v = json_loads(cases[i].value, JSON_DECODE_ANY, &je);
        assert_non_null(v);
        const char *dot = strchr(cases[i].path, '.');
        if (dot) json_object_set_new(json_object_get(root, "model"), dot + 1, v);
        else json_object_set_new(root, cases[i].path, v);
        char *text = json_dumps(root, 0);
        json_decref(root);
        zdp_tokenizer *t = (zdp_tokenizer *)1;
        zdp_error err = {0};
        zdp_status s = zdp_tokenizer_load_json(text, strlen(text), "dir/tokenizer.json", &t, &err);
        free(text);
        if (s != cases[i].code || strstr(err.msg, cases[i].msg) == NULL ||
            strstr(err.msg, "dir/tokenizer.json: ") != err.msg) {
            fprintf(stderr, "case %zu (%s): status %d, message: %s\n", i, cases[i].path, s, err.msg);
            fail();
        }
        assert_null(t);
    }
    /* A missing byte, a vocabulary entry that is not byte-level, JSON errors. */
    json_t *root = tiny_(false, bytelevel_, NULL, NULL);
    char c[3];
    byte_char_('q', c);
    json_object_del(json_object_get(json_object_get(root, "model"), "vocab"), c);
    char *text = json_dumps(root, 0);
    json_decref(root);
    zdp_tokenizer *t = NULL;
    zdp_error err;
    assert_int_equal(zdp_tokenizer_load_json(text, strlen(text), "f.json", &t, &err), ZDP_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "no token for byte 0x71"));
    free(text);
    assert_int_equal(zdp_tokenizer_load_json("{\"model\": ", 10, "f.json", &t, &err), ZDP_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "f.json: not valid JSON at line 1"));
    root = tiny_(false, bytelevel_, NULL, NULL);
    json_object_set_new(json_object_get(json_object_get(root, "model"), "vocab"), "a b\xe2\x82\xac", json_integer(500));
    text = json_dumps(root, 0);
    json_decref(root);
    assert_int_equal(zdp_tokenizer_load_json(text, strlen(text), "f.json", &t, &err), ZDP_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "model.vocab[\"a b"));
    free(text);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_merges_by_rank_and_both_forms),
        cmocka_unit_test(test_ignore_merges),
        cmocka_unit_test(test_split_behaviours_and_prefix_space),
        cmocka_unit_test(test_regex_reads_like_javascript),
        cmocka_unit_test(test_added_tokens),
        cmocka_unit_test(test_nfc),
        cmocka_unit_test(test_invalid_utf8_and_round_trip),
        cmocka_unit_test(test_decode_errors),
        cmocka_unit_test(test_folder_config_and_gpt2_files),
        cmocka_unit_test(test_malformed_names_file_and_key),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
