/*
 * fuzz_serve_proto.c -- libFuzzer target for zdp serve's protobuf codec
 * (src/serve/tinker/proto.c, the Tinker SDK 0.25 forward_backward): any bytes
 * as a ForwardBackwardRequest body.
 *
 * serve_proto_decode_fwdbwd must return NULL with a message that names a
 * field, or the JSON object the JSON path takes: {"model_id": string,
 * "seq_id": integer, KEY: {"data": [...], ...}} with KEY set by
 * forward_only, which dumps as JSON.  Then the encoder runs on a
 * ForwardBackwardOutput made from the decoded datums (their loss_fn_inputs
 * as the outputs): it must return bytes or a message, and the bytes must
 * walk as well-formed protobuf with one ArrayRecord whose num_datums is the
 * datum count.  Never a crash, an out-of-bounds read or a leak.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "tinker/proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "fuzz_serve_proto: invariant violated: %s\n", what);
        abort();
    }
}

static bool varint_(const uint8_t **p, const uint8_t *end, uint64_t *v) {
    *v = 0;
    for (int i = 0; i < 10 && *p < end; i++) {
        uint8_t b = *(*p)++;
        *v |= (uint64_t)(b & 0x7f) << (7 * i);
        if (!(b & 0x80)) return true;
    }
    return false;
}

/* Walks a message; returns the number of top-level fields numbered `count`,
 * and the value of varint field `vnum` (if any) in *vval. */
static int walk_(const uint8_t *p, const uint8_t *end, uint32_t count, uint32_t vnum, uint64_t *vval,
                 const uint8_t **sub, size_t *sub_len) {
    int n = 0;
    while (p < end) {
        uint64_t key, v;
        check_(varint_(&p, end, &key), "encoder: a tag is a complete varint");
        const uint32_t num = (uint32_t)(key >> 3);
        switch (key & 7) {
        case 0:
            check_(varint_(&p, end, &v), "encoder: a varint is complete");
            if (num == vnum) *vval = v;
            break;
        case 1:
            check_(end - p >= 8, "encoder: a fixed64 fits");
            p += 8;
            break;
        case 2:
            check_(varint_(&p, end, &v) && v <= (uint64_t)(end - p), "encoder: a length fits");
            if (num == count && sub != NULL) {
                *sub = p;
                *sub_len = (size_t)v;
            }
            p += v;
            break;
        default: check_(0, "encoder: only wire types 0, 1 and 2"); break;
        }
        if (num == count) n++;
    }
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[600];
    bool forward_only = true;
    json_t *root = serve_proto_decode_fwdbwd(data, size, &forward_only, err, sizeof err);
    if (root == NULL) {
        check_(err[0] != '\0', "a refusal has a message");
        check_(strlen(err) < sizeof err, "the message is terminated");
        return 0;
    }
    check_(json_is_object(root), "the result is an object");
    check_(json_is_string(json_object_get(root, "model_id")), "model_id is a string");
    check_(json_is_integer(json_object_get(root, "seq_id")), "seq_id is an integer");
    const char *key = forward_only ? "forward_input" : "forward_backward_input";
    const char *other = forward_only ? "forward_backward_input" : "forward_input";
    json_t *in = json_object_get(root, key);
    check_(json_is_object(in) && json_object_get(root, other) == NULL, "one input, named by forward_only");
    json_t *datums = json_object_get(in, "data");
    check_(json_is_array(datums), "data is an array");
    char *dump = json_dumps(root, JSON_COMPACT);
    check_(dump != NULL, "the result dumps as JSON");
    free(dump);

    /* The encoder, on outputs made of the datums' loss_fn_inputs. */
    json_t *outs = json_array();
    size_t i;
    json_t *d;
    json_array_foreach(datums, i, d) {
        json_t *li = json_object_get(d, "loss_fn_inputs");
        check_(json_is_object(li), "a datum has loss_fn_inputs");
        json_array_append(outs, li);
    }
    json_t *result = json_pack("{s:s,s:o,s:{s:f}}", "loss_fn_output_type", "ArrayRecord", "loss_fn_outputs", outs,
                               "metrics", "loss:sum", 1.5);
    check_(result != NULL, "the output object builds");
    size_t len = 0;
    unsigned char *pb = serve_proto_encode_fwdbwd_output(result, &len, err, sizeof err);
    if (pb == NULL) {
        check_(err[0] != '\0', "an encoder refusal has a message");
    } else {
        const uint8_t *rec = NULL;
        size_t rec_len = 0;
        uint64_t unused = 0, num_datums = 0;
        int n_rec = walk_(pb, pb + len, 2, 0, &unused, &rec, &rec_len);
        check_(n_rec == (json_array_size(datums) > 0 ? 1 : 0), "one ArrayRecord when there are datums");
        if (rec != NULL) {
            walk_(rec, rec + rec_len, 2, 3, &num_datums, NULL, NULL);
            check_(num_datums == json_array_size(datums), "num_datums is the datum count");
        }
        free(pb);
    }
    json_decref(result);
    json_decref(root);
    return 0;
}
