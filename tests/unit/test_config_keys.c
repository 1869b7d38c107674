/*
 * test_config_keys.c -- the ds_config key table (src/config/config_keys.c) is
 * the one place a key is added: its row holds the type, bounds and default.
 * This test checks the two things that must follow the rows:
 *   - zdp_config_default (and a parsed scheduler block) stores each row's
 *     default in the row's field;
 *   - docs/config.md documents every key of the table, the stored ones in a
 *     "| Key | Type | Default | Meaning |" table with the row's default as
 *     the first `literal` of the Default cell, and documents no key the
 *     table lacks.
 *
 * Not here: parsing and validation (test_config.c).
 */
#include <setjmp.h> /* cmocka needs these three first */
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "zdp/zdp.h"

#ifndef ZDP_SOURCE_DIR
#error "ZDP_SOURCE_DIR must name the source tree (tests/CMakeLists.txt sets it)"
#endif

#define NO_FIELD_ ((size_t)-1)

/* ---- helpers ---------------------------------------------------------- */

/* The stored value of row `k` in `cfg`, as a double (bool: 0 or 1). */
static double field_value_(const zdp_config *cfg, const zdp_config_key_info *k) {
    const char *p = (const char *)cfg + k->config_offset;
    if (strcmp(k->kind, "int") == 0) {
        int64_t x;
        memcpy(&x, p, sizeof x);
        return (double)x;
    }
    if (strcmp(k->kind, "bool") == 0) {
        bool b;
        memcpy(&b, p, sizeof b);
        return b ? 1.0 : 0.0;
    }
    double d;
    memcpy(&d, p, sizeof d);
    return d;
}

static bool stored_(const zdp_config_key_info *k) {
    return k->config_offset != NO_FIELD_ &&
           (!strcmp(k->kind, "int") || !strcmp(k->kind, "bool") || !strcmp(k->kind, "number"));
}

static char *read_docs_(void) {
    const char *path = ZDP_SOURCE_DIR "/docs/config.md";
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        print_error("cannot open %s\n", path);
        fail();
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)n + 1);
    assert_non_null(text);
    assert_int_equal(fread(text, 1, (size_t)n, f), (size_t)n);
    text[n] = '\0';
    fclose(f);
    return text;
}

/* One row of a "| Key | Type | Default | Meaning |" table of the page. */
typedef struct doc_row {
    char key[160];     /* the first `literal` of the Key cell */
    char def[160];     /* the Default cell, trimmed */
} doc_row;

/* The first `...` of s[0..n) into out; false when there is none. */
static bool first_literal_(const char *s, size_t n, char *out, size_t cap) {
    const char *a = memchr(s, '`', n);
    if (a == NULL) return false;
    const char *b = memchr(a + 1, '`', n - (size_t)(a + 1 - s));
    if (b == NULL || (size_t)(b - a - 1) >= cap) return false;
    memcpy(out, a + 1, (size_t)(b - a - 1));
    out[b - a - 1] = '\0';
    return true;
}

/* Every row of every key table of the page; returns the count. */
static size_t doc_rows_(const char *text, doc_row *rows, size_t cap) {
    size_t n = 0;
    bool in_table = false;
    for (const char *line = text; *line != '\0';) {
        const char *end = strchr(line, '\n');
        size_t len = end != NULL ? (size_t)(end - line) : strlen(line);
        if (len > 0 && line[0] == '|') {
            if (strncmp(line, "| Key | Type | Default | Meaning |", 34) == 0) {
                in_table = true;
            } else if (in_table && strncmp(line, "|---", 4) != 0) {
                /* Cells: | key | type | default | meaning |; a `|` inside a
                 * literal is written \| and never appears in the first three. */
                const char *cell[4];
                size_t found = 0;
                for (size_t i = 0; i < len && found < 4; i++)
                    if (line[i] == '|' && (i == 0 || line[i - 1] != '\\')) cell[found++] = line + i + 1;
                assert_int_equal(found, 4);
                assert_true(n < cap);
                doc_row *r = &rows[n];
                memset(r, 0, sizeof *r);
                if (!first_literal_(cell[0], (size_t)(cell[1] - cell[0]), r->key, sizeof r->key)) {
                    print_error("docs/config.md: a key row without a `key`: %.*s\n", (int)len, line);
                    fail();
                }
                size_t dl = (size_t)(cell[3] - cell[2]) - 1;
                snprintf(r->def, sizeof r->def, "%.*s", (int)dl, cell[2]);
                n++;
            }
        } else {
            in_table = false;
        }
        line = end != NULL ? end + 1 : line + len;
    }
    return n;
}

/* The Default cell's first `literal` as a number (true/false: 1/0). */
static bool doc_default_(const char *cell, double *out) {
    char lit[64];
    if (!first_literal_(cell, strlen(cell), lit, sizeof lit)) return false;
    if (strcmp(lit, "true") == 0) { *out = 1.0; return true; }
    if (strcmp(lit, "false") == 0) { *out = 0.0; return true; }
    char *end = NULL;
    *out = strtod(lit, &end);
    return end != lit && *end == '\0';
}

/* `path` (or `path.sub...`), `name`, or a `prefix*` that name starts with,
 * anywhere on the page. */
static bool mentioned_(const char *text, const char *path, const char *name) {
    char pat[300];
    snprintf(pat, sizeof pat, "`%s`", path);
    if (strstr(text, pat) != NULL) return true;
    snprintf(pat, sizeof pat, "`%s.", path);
    if (strstr(text, pat) != NULL) return true;
    snprintf(pat, sizeof pat, "`%s`", name);
    if (strstr(text, pat) != NULL) return true;
    for (const char *p = strstr(text, "*`"); p != NULL; p = strstr(p + 2, "*`")) {
        const char *a = p;
        while (a > text && a[-1] != '`' && a[-1] != '\n') a--;
        size_t plen = (size_t)(p - a);
        if (a > text && a[-1] == '`' && plen > 0 && strncmp(name, a, plen) == 0) return true;
    }
    return false;
}

/* ---- tests ------------------------------------------------------------- */

static void test_default_stores_every_row_default(void **state) {
    (void)state;
    zdp_config cfg;
    zdp_config_default(&cfg);
    /* The scheduler's defaults are stored when its block is parsed;
     * WarmupDecayLR reads every row but total_num_steps (required). */
    zdp_config parsed;
    zdp_error err;
    memset(&err, 0, sizeof err);
    assert_int_equal(zdp_config_load_string(
                         "{\"train_batch_size\": 1, \"optimizer\": {\"type\": \"Adam\"}, "
                         "\"scheduler\": {\"type\": \"WarmupDecayLR\", "
                         "\"params\": {\"total_num_steps\": 5000}}}",
                         "t.json", 1, &parsed, &err),
                     ZDP_OK);
    size_t checked = 0;
    for (size_t i = 0; i < zdp_config_key_count(); i++) {
        zdp_config_key_info k;
        assert_true(zdp_config_key_get(i, &k));
        if (!stored_(&k) || isnan(k.def)) continue;
        double got = field_value_(k.at_default ? &cfg : &parsed, &k);
        if (got != k.def) {
            print_error("%s: the row's default is %.17g, %s stores %.17g\n", k.path, k.def,
                        k.at_default ? "zdp_config_default" : "the parsed block", got);
            fail();
        }
        checked++;
    }
    assert_true(checked >= 20);
    zdp_config_key_info k;
    assert_false(zdp_config_key_get(zdp_config_key_count(), &k));
}

static void test_docs_list_every_key_with_its_default(void **state) {
    (void)state;
    char *text = read_docs_();
    static doc_row rows[256];
    size_t n_rows = doc_rows_(text, rows, 256);
    assert_true(n_rows >= 30);
    int bad = 0;
    for (size_t i = 0; i < zdp_config_key_count(); i++) {
        zdp_config_key_info k;
        assert_true(zdp_config_key_get(i, &k));
        const char *dot = strrchr(k.path, '.');
        const char *name = dot != NULL ? dot + 1 : k.path;
        if (!stored_(&k)) {
            if (!mentioned_(text, k.path, name)) {
                print_error("docs/config.md: %s (%s) is not mentioned\n", k.path, k.kind);
                bad++;
            }
            continue;
        }
        const doc_row *r = NULL;
        for (size_t j = 0; j < n_rows && r == NULL; j++)
            if (strcmp(rows[j].key, k.path) == 0) r = &rows[j];
        if (r == NULL) {
            print_error("docs/config.md: no | `%s` | row in a key table\n", k.path);
            bad++;
            continue;
        }
        if (isnan(k.def)) continue;
        double d;
        if (!doc_default_(r->def, &d) || d != k.def) {
            print_error("docs/config.md: %s: the Default cell \"%s\" does not start with the "
                        "row's default %.17g\n", k.path, r->def, k.def);
            bad++;
        }
    }
    /* And the other way: every documented key is a row of the table. */
    for (size_t j = 0; j < n_rows; j++) {
        bool known = false;
        for (size_t i = 0; i < zdp_config_key_count() && !known; i++) {
            zdp_config_key_info k;
            assert_true(zdp_config_key_get(i, &k));
            known = strcmp(k.path, rows[j].key) == 0;
        }
        if (!known) {
            print_error("docs/config.md documents %s, which the key table lacks\n", rows[j].key);
            bad++;
        }
    }
    free(text);
    assert_int_equal(bad, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_default_stores_every_row_default),
        cmocka_unit_test(test_docs_list_every_key_with_its_default),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
