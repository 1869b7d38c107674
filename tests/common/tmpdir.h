/*
 * tmpdir.h -- a test's scratch directory under /tmp: made with mkdtemp,
 * removed with everything in it.  Header-only, as check.h; the including
 * file defines _POSIX_C_SOURCE 200809L (mkdtemp, lstat) before any header.
 */
#ifndef ZDP_TEST_TMPDIR_H
#define ZDP_TEST_TMPDIR_H

#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* dir (n bytes) = a new directory /tmp/zdp_test_<tag>_XXXXXX; 0, or -1 when
 * it could not be made. */
static inline int tmpdir_make(char *dir, size_t n, const char *tag) {
    snprintf(dir, n, "/tmp/zdp_test_%s_XXXXXX", tag);
    return mkdtemp(dir) == NULL ? -1 : 0;
}

/* Removes dir and everything below it; 0, or -1 when dir itself stays. */
static inline int tmpdir_remove(const char *dir) {
    DIR *d = opendir(dir);
    if (d == NULL) return -1;
    struct dirent *e;
    char p[1024];
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        if (snprintf(p, sizeof p, "%s/%s", dir, e->d_name) >= (int)sizeof p) continue;
        struct stat sb;
        if (lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode)) tmpdir_remove(p);
        else unlink(p);
    }
    closedir(d);
    return rmdir(dir);
}

#endif /* ZDP_TEST_TMPDIR_H */
