/*
 * util.c -- small helpers every layer of the server uses: the monotonic
 * clock, mkdir -p, and the repair of text that is not UTF-8 (jansson
 * refuses it).
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "serve_impl.h"

double serve_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void serve_utf8_fix(char *s) {
    unsigned char *p = (unsigned char *)s;
    while (*p) {
        size_t k = *p < 0x80             ? 0
                   : (*p & 0xe0) == 0xc0 ? 1
                   : (*p & 0xf0) == 0xe0 ? 2
                   : (*p & 0xf8) == 0xf0 ? 3
                                         : 9; /* not a lead byte */
        bool ok = k <= 3;
        for (size_t j = 1; ok && j <= k; j++) ok = (p[j] & 0xc0) == 0x80;
        if (ok && k == 1) ok = *p >= 0xc2;
        if (ok && k == 2) ok = !(*p == 0xe0 && p[1] < 0xa0) && !(*p == 0xed && p[1] >= 0xa0);
        if (ok && k == 3) ok = !(*p == 0xf0 && p[1] < 0x90) && (*p < 0xf4 || (*p == 0xf4 && p[1] < 0x90));
        if (!ok) {
            *p++ = '?';
            continue;
        }
        p += k + 1;
    }
}

int serve_mkdirs(const char *path) {
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) {
        errno = ENAMETOOLONG;
        return -1;
    }
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    return mkdir(buf, 0777) != 0 && errno != EEXIST ? -1 : 0;
}

