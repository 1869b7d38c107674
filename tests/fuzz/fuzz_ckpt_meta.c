/*
 * fuzz_ckpt_meta.c -- libFuzzer target for the checkpoint metadata reader.
 * The input becomes DIR/t/meta.json next to the real files of a checkpoint
 * (tests/fuzz/fixtures/ckpt: an MLP --hidden 8 --layers 3 saved by 2 ranks
 * at ZeRO stage 2), with DIR/latest naming t; then zdp_checkpoint_inspect
 * (by latest and by tag) and zdp_checkpoint_export run on it.  Each must
 * return an error or succeed, never crash, read freed or out-of-bounds
 * memory, or leak; an error must carry a message, and a success of export
 * must leave a readable safetensors file.
 *
 * The seeds in corpus/meta/ that come from a real run carry the fixture
 * files' sizes and FNV-1a checksums, so mutations of them get past the
 * files' checksum checks.  meta.json's own checksum (meta_fnv1a64) would
 * stop nearly every mutation at the door, so each input runs twice: as it
 * is (the checksum check itself), and, when it has the field, with the
 * checksum recomputed for its bytes (the parser behind the check).  The fixture directory is compiled in
 * (ZDP_FUZZ_FIXTURES) and can be overridden by the environment variable of
 * the same name.
 */
#include "fuzz_common.h"

#include "zdp/zdp.h"

#ifndef ZDP_FUZZ_FIXTURES
#define ZDP_FUZZ_FIXTURES "tests/fuzz/fixtures"
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char ckpt_dir_[512];

static void check_(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "fuzz_ckpt_meta: invariant violated: %s\n", what);
        abort();
    }
}

static void copy_fixture_(const char *fixtures, const char *name, const char *to_dir) {
    char src[1024], dst[1024];
    snprintf(src, sizeof src, "%s/ckpt/%s", fixtures, name);
    snprintf(dst, sizeof dst, "%s/%s", to_dir, name);
    size_t n = 0;
    uint8_t *buf = fuzz_read_file(src, &n);
    if (buf == NULL) {
        fprintf(stderr, "fuzz_ckpt_meta: cannot read the fixture %s (set ZDP_FUZZ_FIXTURES to "
                        "tests/fuzz/fixtures)\n", src);
        abort();
    }
    fuzz_write_file(dst, buf, n);
    free(buf);
}

static void setup_(void) {
    if (ckpt_dir_[0] != '\0') return;
    const char *fixtures = getenv("ZDP_FUZZ_FIXTURES");
    if (fixtures == NULL || *fixtures == '\0') fixtures = ZDP_FUZZ_FIXTURES;
    snprintf(ckpt_dir_, sizeof ckpt_dir_, "%s/ckpt", fuzz_dir());
    char tagdir[600];
    snprintf(tagdir, sizeof tagdir, "%s/t", ckpt_dir_);
    if (mkdir(ckpt_dir_, 0777) != 0 || mkdir(tagdir, 0777) != 0) {
        perror("fuzz_ckpt_meta: mkdir");
        abort();
    }
    copy_fixture_(fixtures, "model.safetensors", tagdir);
    copy_fixture_(fixtures, "optim_rank0.safetensors", tagdir);
    copy_fixture_(fixtures, "optim_rank1.safetensors", tagdir);
    char latest[600];
    snprintf(latest, sizeof latest, "%s/latest", ckpt_dir_);
    fuzz_write_file(latest, (const uint8_t *)"t\n", 2);
}

static void check_error_(zdp_status s, const zdp_error *err) {
    check_(s < 0 && err->code == s, "an error status is negative and matches err.code");
    check_(memchr(err->msg, '\0', sizeof err->msg) != NULL && err->msg[0] != '\0',
           "an error has a message");
}

/* checkpoint_format.c's rule (docs/checkpoints.md), written again here: the 16 hex
 * digits of the last "meta_fnv1a64": "...", or -1. */
static long sum_digits_(const uint8_t *b, size_t n) {
    static const char key[] = "\"meta_fnv1a64\"";
    const size_t k = sizeof key - 1;
    for (size_t i = n >= k ? n - k + 1 : 0; i-- > 0;) {
        if (memcmp(b + i, key, k) != 0) continue;
        size_t j = i + k;
        while (j < n && (b[j] == ' ' || b[j] == '\t' || b[j] == '\r' || b[j] == '\n')) j++;
        if (j >= n || b[j] != ':') return -1;
        for (j++; j < n && (b[j] == ' ' || b[j] == '\t' || b[j] == '\r' || b[j] == '\n'); j++) {
        }
        if (j + 18 > n || b[j] != '"' || b[j + 17] != '"') return -1;
        return (long)(j + 1);
    }
    return -1;
}

static void run_one_(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    setup_();
    run_one_(data, size);
    long at = sum_digits_(data, size);
    if (at < 0) return 0;
    uint8_t *fixed = malloc(size);
    check_(fixed != NULL, "malloc");
    memcpy(fixed, data, size);
    memset(fixed + at, '0', 16);
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < size; i++) h = (h ^ fixed[i]) * 0x100000001b3ULL;
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
    memcpy(fixed + at, hex, 16);
    if (memcmp(fixed, data, size) != 0) run_one_(fixed, size);
    free(fixed);
    return 0;
}

static void run_one_(const uint8_t *data, size_t size) {
    char meta[700], out[700];
    snprintf(meta, sizeof meta, "%s/t/meta.json", ckpt_dir_);
    snprintf(out, sizeof out, "%s/export.safetensors", fuzz_dir());
    fuzz_write_file(meta, data, size);

    zdp_error err;
    const char *tags[2] = {NULL, "t"};
    for (int k = 0; k < 2; k++) {
        char *text = (char *)"sentinel";
        memset(&err, 0, sizeof err);
        zdp_status s = zdp_checkpoint_inspect(ckpt_dir_, tags[k], &text, &err);
        if (s == ZDP_OK) {
            check_(text != NULL && strlen(text) > 0, "inspect gives a description");
            free(text);
        } else {
            check_error_(s, &err);
            check_(text == NULL, "inspect leaves *text NULL on error");
        }
    }
    memset(&err, 0, sizeof err);
    unlink(out);
    zdp_status s = zdp_checkpoint_export(ckpt_dir_, NULL, out, &err);
    if (s == ZDP_OK) {
        zdp_safetensors st;
        check_(zdp_safetensors_read(out, &st, &err) == ZDP_OK, "an export is a readable file");
        zdp_safetensors_free(&st);
        unlink(out);
    } else {
        check_error_(s, &err);
        check_(access(out, F_OK) != 0, "a failed export writes nothing");
    }
}
