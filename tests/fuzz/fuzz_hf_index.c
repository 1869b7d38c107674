/*
 * fuzz_hf_index.c -- libFuzzer target for zdp_hf_index_parse (a sharded
 * folder's model.safetensors.index.json) on arbitrary bytes.  It must return
 * an error with a message (and an empty index) or succeed; never crash, read
 * out of bounds or leak.  When it succeeds: at least one entry; every
 * entry's shard is one of the distinct files, listed once each; every file
 * name stays in the folder (no '/', no leading '.', ends in .safetensors);
 * names are unique.
 *
 * Built by tests/fuzz/CMakeLists.txt like the other targets.
 */
#include "fuzz_common.h"

#include "zdp/zdp.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "fuzz_hf_index: invariant violated: %s\n", what);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    zdp_hf_index idx;
    zdp_error err;
    memset(&err, 0, sizeof err);
    zdp_status s = zdp_hf_index_parse((const char *)data, size, "fuzz/index.json", &idx, &err);
    if (s != ZDP_OK) {
        check_(s < 0 && err.code == s, "an error status is negative and matches err.code");
        check_(err.msg[0] != '\0' && strstr(err.msg, "fuzz/index.json") != NULL,
               "an error has a message naming the file");
        check_(idx.n == 0 && idx.names == NULL && idx.n_files == 0 && idx.files == NULL,
               "on error the index is empty");
        zdp_hf_index_free(&idx);
        return 0;
    }
    check_(idx.n >= 1 && idx.n_files >= 1 && idx.n_files <= idx.n, "entry and file counts");
    for (int f = 0; f < idx.n_files; f++) {
        const char *name = idx.files[f];
        size_t len = strlen(name), ext = strlen(".safetensors");
        check_(strchr(name, '/') == NULL && name[0] != '.' && len > ext &&
                   strcmp(name + len - ext, ".safetensors") == 0,
               "shard files stay in the folder");
        for (int g = 0; g < f; g++) check_(strcmp(idx.files[g], name) != 0, "files listed once");
    }
    for (int i = 0; i < idx.n; i++) {
        int f = 0;
        while (f < idx.n_files && strcmp(idx.files[f], idx.shards[i]) != 0) f++;
        check_(f < idx.n_files, "every entry's shard is a listed file");
        for (int j = 0; j < i && idx.n < 512; j++)
            check_(strcmp(idx.names[i], idx.names[j]) != 0, "names are unique");
    }
    zdp_hf_index_free(&idx);
    return 0;
}
