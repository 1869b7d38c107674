/*
 * test_json.c -- src/core/json.c: the JSON type names that config's and the
 * server's messages share ("expected an integer, got a string").
 */
#include <setjmp.h> /* cmocka needs these three first */
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "core/json.h"

static void test_type_names(void **state) {
    (void)state;
    json_t *v[] = {json_object(), json_array(), json_string("x"), json_integer(3),
                   json_real(0.5), json_true(), json_false(), json_null()};
    const char *want[] = {"an object", "an array", "a string", "an integer",
                          "a number", "a boolean", "a boolean", "null"};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        assert_string_equal(zdp_json_type_name(v[i]), want[i]);
        json_decref(v[i]);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_type_names)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
