/*
 * json.h -- internal to the library and its modules (config, the server):
 * small helpers over jansson that more than one module needs.  Exported
 * (ZDP_API) so a module built as its own library can use them, but not part
 * of the public API in include/zdp/.
 */
#ifndef ZDP_CORE_JSON_H
#define ZDP_CORE_JSON_H

#include <jansson.h>

#include "zdp/core.h"

/* What a JSON value is, with its article, for messages such as
 * "expected an integer, got a string": "an object", "an array", "a string",
 * "an integer", "a number" (a real), "a boolean" or "null".  A static
 * string; never NULL. */
ZDP_API const char *zdp_json_type_name(const json_t *v);

#endif
