/*
 * fuzz_safetensors.c -- libFuzzer target for zdp_safetensors_read on
 * arbitrary bytes (written to a temporary file, since the reader takes a
 * path).  It must return an error or succeed; never crash, read out of
 * bounds or leak (ASan/LSan watch).  When it succeeds, the result must be
 * consistent (every tensor's nbytes = numel * dtype size, findable by name)
 * and survive a round trip: zdp_safetensors_write then read gives the same
 * tensors.
 *
 * Built by tests/fuzz/CMakeLists.txt: with -DZDP_FUZZ=ON (clang) as a
 * libFuzzer binary; always as a corpus runner (run_corpus.c) for the
 * normal test suite.
 */
#include "fuzz_common.h"

#include "zdp/zdp.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "fuzz_safetensors: invariant violated: %s\n", what);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char in[512], out[512];
    snprintf(in, sizeof in, "%s/in.safetensors", fuzz_dir());
    snprintf(out, sizeof out, "%s/out.safetensors", fuzz_dir());
    fuzz_write_file(in, data, size);

    zdp_safetensors st;
    zdp_error err;
    memset(&err, 0, sizeof err);
    zdp_status s = zdp_safetensors_read(in, &st, &err);
    if (s != ZDP_OK) {
        check_(s < 0 && err.code == s, "an error status is negative and matches err.code");
        check_(st.n == 0 && st.tensors == NULL, "on error the output is empty");
        check_(memchr(err.msg, '\0', sizeof err.msg) != NULL && err.msg[0] != '\0',
               "an error has a message");
        zdp_safetensors_free(&st);
        return 0;
    }
    check_(st.n >= 0 && (st.n == 0 || st.tensors != NULL), "tensor count");
    for (int i = 0; i < st.n; i++) {
        const zdp_tensor *t = &st.tensors[i];
        check_(t->name != NULL, "a tensor has a name");
        check_(t->ndim >= 0 && t->ndim <= ZDP_MAX_DIMS, "ndim in range");
        size_t numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            check_(t->shape[d] >= 0, "dimensions are >= 0");
            numel *= (size_t)t->shape[d];
        }
        check_(zdp_dtype_size(t->dtype) > 0, "a known dtype");
        check_(t->nbytes == numel * zdp_dtype_size(t->dtype), "nbytes = numel * dtype size");
        check_(t->nbytes == 0 || t->data != NULL, "data present");
        /* Touch every byte so ASan sees a short buffer. */
        volatile uint8_t sink = 0;
        for (size_t k = 0; k < t->nbytes; k++) sink ^= ((const uint8_t *)t->data)[k];
        (void)sink;
        check_(zdp_safetensors_find(&st, t->name) != NULL, "every tensor can be found by name");
    }
    /* Round trip. */
    if (zdp_safetensors_write(out, st.tensors, st.n, &err) == ZDP_OK) {
        zdp_safetensors again;
        zdp_status s2 = zdp_safetensors_read(out, &again, &err);
        if (s2 != ZDP_OK) fprintf(stderr, "fuzz_safetensors: re-read failed: %s\n", err.msg);
        check_(s2 == ZDP_OK, "what zdp writes, zdp reads");
        check_(again.n == st.n, "round trip keeps the tensor count");
        for (int i = 0; i < st.n; i++) {
            const zdp_tensor *a = &st.tensors[i];
            const zdp_tensor *b = zdp_safetensors_find(&again, a->name);
            check_(b != NULL, "round trip keeps every name");
            check_(a->dtype == b->dtype && a->ndim == b->ndim && a->nbytes == b->nbytes,
                   "round trip keeps dtype, ndim and size");
            check_(memcmp(a->shape, b->shape, (size_t)a->ndim * sizeof a->shape[0]) == 0,
                   "round trip keeps the shape");
            check_(a->nbytes == 0 || memcmp(a->data, b->data, a->nbytes) == 0,
                   "round trip keeps the data");
        }
        zdp_safetensors_free(&again);
        unlink(out);
    }
    zdp_safetensors_free(&st);
    return 0;
}
