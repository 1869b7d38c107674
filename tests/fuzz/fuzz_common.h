/*
 * fuzz_common.h -- what the fuzz targets share: a private temporary
 * directory, created once per process and removed at exit, and writing the
 * input bytes to a file in it.
 */
#ifndef ZDP_FUZZ_COMMON_H
#define ZDP_FUZZ_COMMON_H

#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char fuzz_dir_[256];

/* Removes dir and what is under it (the targets write at most two levels). */
static inline void fuzz_rm_tree_(const char *dir) {
    DIR *d = opendir(dir);
    if (d != NULL) {
        struct dirent *ent;
        while ((ent = readdir(d)) != NULL) {
            if (!strcmp(ent->d_name, ".") || !strcmp(ent->d_name, "..")) continue;
            char p[1024];
            int n = snprintf(p, sizeof p, "%s/%s", dir, ent->d_name);
            if (n < 0 || (size_t)n >= sizeof p) continue;
            struct stat sb;
            if (lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode)) fuzz_rm_tree_(p);
            else unlink(p);
        }
        closedir(d);
    }
    rmdir(dir);
}

static inline void fuzz_cleanup_(void) {
    if (fuzz_dir_[0] != '\0') fuzz_rm_tree_(fuzz_dir_);
}

/* The process's temporary directory (created on first use). */
static inline const char *fuzz_dir(void) {
    if (fuzz_dir_[0] == '\0') {
        const char *base = getenv("TMPDIR");
        snprintf(fuzz_dir_, sizeof fuzz_dir_, "%s/zdp-fuzz-XXXXXX", base && *base ? base : "/tmp");
        if (mkdtemp(fuzz_dir_) == NULL) {
            perror("fuzz: mkdtemp");
            abort();
        }
        atexit(fuzz_cleanup_);
    }
    return fuzz_dir_;
}

/* Writes n bytes to path; aborts on I/O errors (those are the harness's,
 * not the code under test's). */
static inline void fuzz_write_file(const char *path, const uint8_t *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (f == NULL || (n > 0 && fwrite(data, 1, n, f) != n) || fclose(f) != 0) {
        perror(path);
        abort();
    }
}

/* Reads a whole file into a malloc'd buffer (*n its size); NULL on error. */
static inline uint8_t *fuzz_read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) return NULL;
    size_t cap = 4096, len = 0;
    uint8_t *buf = malloc(cap);
    size_t got;
    while (buf != NULL && (got = fread(buf + len, 1, cap - len, f)) > 0) {
        len += got;
        if (len == cap) {
            uint8_t *nb = realloc(buf, cap *= 2);
            if (nb == NULL) free(buf);
            buf = nb;
        }
    }
    fclose(f);
    *n = len;
    return buf;
}

#endif /* ZDP_FUZZ_COMMON_H */
