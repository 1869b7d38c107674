/*
 * unit_io.h -- what the cmocka file tests (test_data, test_safetensors,
 * test_gpt_io) share: the scratch directory g_dir (each file's group setup
 * makes it with tmpdir_make and its teardown removes it), paths in it,
 * writing a whole file, and checking an error message.  Header-only (static
 * inline), as tmpdir.h; include after <cmocka.h>.
 */
#ifndef ZDP_TEST_UNIT_IO_H
#define ZDP_TEST_UNIT_IO_H

#include <stdio.h>
#include <string.h>

#include "common/tmpdir.h"

static char g_dir[256];

/* Path of `name` inside g_dir; each call gets its own buffer from a small
 * ring so that a few paths can be live at once. */
static inline const char *path_in(const char *name) {
    static char ring[4][512];
    static int next;
    char *p = ring[next++ % 4];
    snprintf(p, 512, "%s/%s", g_dir, name);
    return p;
}

static inline void write_bytes(const char *path, const void *buf, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

/* The zdp_error e's message holds s. */
#define ASSERT_MSG_HAS(e, s)                                                        \
    do {                                                                            \
        if (strstr((e).msg, (s)) == NULL)                                           \
            fail_msg("message lacks \"%s\":\n  %s", (s), (e).msg);                  \
    } while (0)

#endif /* ZDP_TEST_UNIT_IO_H */
