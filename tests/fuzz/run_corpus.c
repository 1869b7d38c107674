/*
 * run_corpus.c -- a main for the fuzz targets without libFuzzer: feeds every
 * file named on the command line (a directory: every regular file in it,
 * sorted by name) to LLVMFuzzerTestOneInput once.  Used to run the seed
 * corpora, and any crash inputs saved there, in the normal and ASan builds:
 *   fuzz_safetensors_corpus tests/fuzz/corpus/safetensors
 * Exit 0 when every input returned; a crash or a sanitizer report fails.
 */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file_(const char *path) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        perror(path);
        return 1;
    }
    size_t cap = 4096, len = 0, got;
    uint8_t *buf = malloc(cap);
    while (buf != NULL && (got = fread(buf + len, 1, cap - len, f)) > 0) {
        len += got;
        if (len == cap) {
            uint8_t *nb = realloc(buf, cap *= 2);
            if (nb == NULL) free(buf);
            buf = nb;
        }
    }
    fclose(f);
    if (buf == NULL) {
        fprintf(stderr, "%s: out of memory\n", path);
        return 1;
    }
    /* An exact-size copy, so that reading past the input is caught. */
    uint8_t *exact = malloc(len > 0 ? len : 1);
    if (exact == NULL) {
        free(buf);
        return 1;
    }
    memcpy(exact, buf, len);
    free(buf);
    fprintf(stderr, "run_corpus: %s (%zu bytes)\n", path, len);
    LLVMFuzzerTestOneInput(exact, len);
    free(exact);
    return 0;
}

static int cmp_names_(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int run_dir_(const char *dir, int *count) {
    DIR *d = opendir(dir);
    if (d == NULL) {
        perror(dir);
        return 1;
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *ent;
    while ((ent = readdir(d)) != NULL) {
        if (ent->d_name[0] == '.') continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            char **nn = realloc(names, cap * sizeof *names);
            if (nn == NULL) break;
            names = nn;
        }
        size_t len = strlen(dir) + strlen(ent->d_name) + 2;
        if ((names[n] = malloc(len)) == NULL) break;
        snprintf(names[n], len, "%s/%s", dir, ent->d_name);
        n++;
    }
    closedir(d);
    if (n > 0) qsort(names, n, sizeof *names, cmp_names_);
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        struct stat sb;
        if (stat(names[i], &sb) == 0 && S_ISREG(sb.st_mode)) {
            bad |= run_file_(names[i]);
            (*count)++;
        }
        free(names[i]);
    }
    free(names);
    return bad;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE|DIR...\n", argv[0]);
        return 2;
    }
    int bad = 0, count = 0;
    for (int i = 1; i < argc; i++) {
        struct stat sb;
        if (stat(argv[i], &sb) != 0) {
            perror(argv[i]);
            bad = 1;
        } else if (S_ISDIR(sb.st_mode)) {
            bad |= run_dir_(argv[i], &count);
        } else {
            bad |= run_file_(argv[i]);
            count++;
        }
    }
    if (count == 0) {
        fprintf(stderr, "run_corpus: no inputs\n");
        return 1;
    }
    fprintf(stderr, "run_corpus: %d input(s) ran\n", count);
    return bad;
}
