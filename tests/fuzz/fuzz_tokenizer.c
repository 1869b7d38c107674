/*
 * fuzz_tokenizer.c -- libFuzzer target for the tokenizer.json reader
 * (zdp_tokenizer_load_json) on arbitrary bytes.  It must return an error
 * with a message naming the file, or succeed; never crash, read out of
 * bounds or leak (ASan/LSan watch).  When it loads, encoding must succeed
 * on fixed texts (special tokens, invalid UTF-8, CJK, whitespace runs) and on
 * the input's own bytes, every id must be below the vocabulary size, and
 * decoding the ids must succeed.
 *
 * Built by tests/fuzz/CMakeLists.txt: with -DZDP_FUZZ=ON (clang) as a
 * libFuzzer binary; always as a corpus runner (run_corpus.c) for the
 * normal test suite.  Seeds: python3 tests/fuzz/make_tokenizer_seeds.py.
 */
#include "fuzz_common.h"

#include "zdp/zdp.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "fuzz_tokenizer: invariant violated: %s\n", what);
        abort();
    }
}

static void encode_decode_(const zdp_tokenizer *t, const char *s, size_t n, unsigned flags) {
    int32_t *ids = NULL;
    size_t k = 0;
    zdp_error err;
    check_(zdp_tokenizer_encode(t, s, n, flags, &ids, &k, &err) == ZDP_OK, "encode succeeds");
    const int32_t V = zdp_tokenizer_vocab_size(t);
    for (size_t i = 0; i < k; i++) check_(ids[i] >= 0 && ids[i] < V, "ids are in [0, V)");
    char *back = NULL;
    size_t m = 0;
    check_(zdp_tokenizer_decode(t, ids, k, &back, &m, &err) == ZDP_OK, "decode of encode succeeds");
    check_(back != NULL && back[m] == '\0', "decode gives a NUL-terminated buffer");
    free(back);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    zdp_tokenizer *t = (zdp_tokenizer *)1;
    zdp_error err;
    memset(&err, 0, sizeof err);
    zdp_status s = zdp_tokenizer_load_json((const char *)data, size, "fuzz/tokenizer.json", &t, &err);
    if (s != ZDP_OK) {
        check_(s < 0 && err.code == s, "an error status is negative and matches err.code");
        check_(t == NULL, "on error *out is NULL");
        check_(memchr(err.msg, '\0', sizeof err.msg) != NULL &&
                   strncmp(err.msg, "fuzz/tokenizer.json: ", 21) == 0,
               "an error names the file");
        return 0;
    }
    check_(t != NULL && zdp_tokenizer_vocab_size(t) >= 256, "a tokenizer with the 256 bytes");
    static const char *const texts[] = {
        "Hello, world! 123 4567 don't WE'LL", "<|endoftext|><|im_start|>user\n<think>",
        "\xff\xfe\xc3(\xed\xa0\x80 ok \xf0\x9f\x98", "\xe4\xbd\xa0\xe5\xa5\xbd\xe3\x80\x80\xf0\x9f\x98\x80",
        "  \t\t\n\n\r\n   x  ", "e\xcc\x81 caf\xc3\xa9", "",
    };
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++)
        for (unsigned flags = 0; flags < 2; flags++)
            encode_decode_(t, texts[i], strlen(texts[i]), flags);
    encode_decode_(t, (const char *)data, size < 4096 ? size : 4096, ZDP_TOKENIZE_SPECIAL);
    zdp_tokenizer_destroy(t);
    return 0;
}
