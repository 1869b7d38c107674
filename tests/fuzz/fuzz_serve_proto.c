/*
 * fuzz_serve_proto.c -- libFuzzer target for zdp serve's protobuf codec
 * (src/serve/tinker/proto_decode.c and proto_encode.c, the Tinker SDK 0.25
 * forward_backward): any bytes as a ForwardBackwardRequest body.
 *
 * serve_proto_decode_fwdbwd must return false with a message that names a
 * field, or the typed request (serve_fwd_in, src/serve/fwd_input.h) with
 * every array as long as it says.  Then the checks every forward_backward
 * passes (serve_fwd_build, against a model of V = 64, T = 16) must refuse it
 * with a message that names a field, or lay out a payload whose typed view
 * reads back.  Then the encoder runs on a ForwardBackwardOutput made from the
 * decoded datums (each one's first tensor as its output): it must return
 * bytes or a message, and the bytes must walk as well-formed protobuf with
 * one ArrayRecord whose num_datums is the datum count.  Never a crash, an
 * out-of-bounds read or a leak.
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve_impl.h"
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

/* Reads every element the typed request says it has (ASan sees a short one). */
static int64_t touch_(const serve_fwd_in *in) {
    int64_t sum = 0;
    for (int64_t i = 0; i < in->n_config; i++) sum += (int64_t)strlen(in->config_keys[i]) + (in->config_values[i] > 0);
    for (int64_t i = 0; i < in->n; i++) {
        const serve_datum_in *d = &in->data[i];
        check_(d->n_chunks >= 0 && d->n_inputs >= 0, "a datum's counts are not negative");
        for (int64_t c = 0; c < d->n_chunks; c++) {
            const serve_chunk_in *k = &d->chunks[c];
            check_(k->type != NULL, "a chunk has a type");
            for (int64_t t = 0; t < k->n; t++) sum += k->tokens[t];
        }
        for (int64_t k = 0; k < d->n_inputs; k++) {
            const serve_tensor_in *t = &d->inputs[k];
            check_(t->name != NULL && t->dtype != NULL && t->tensor_data, "a tensor has a name and a dtype");
            for (int64_t v = 0; v < t->n; v++) sum += t->ints[v] + (t->reals[v] > 0);
        }
    }
    return sum;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[600];
    serve_proto_fwdbwd rq;
    if (!serve_proto_decode_fwdbwd(data, size, &rq, err, sizeof err)) {
        check_(err[0] != '\0', "a refusal has a message");
        check_(strlen(err) < sizeof err, "the message is terminated");
        check_(rq.in.n == 0 && rq.model_id != NULL, "a refusal leaves the request empty");
        serve_proto_fwdbwd_free(&rq);
        return 0;
    }
    check_(rq.model_id != NULL, "model_id is a string");
    check_(rq.in.n >= 0 && rq.in.n_config >= 0, "counts are not negative");
    (void)touch_(&rq.in);

    /* The checks every forward_backward passes, JSON or protobuf. */
    job j = {.op = rq.forward_only ? OP_FORWARD : OP_FWDBWD};
    verr e = {0};
    if (serve_fwd_build(&rq.in, rq.forward_only ? "forward_input" : "forward_backward_input", 64, 16, &j, &e)) {
        serve_fwd_req view;
        check_(serve_fwd_req_view(&j, &view), "a built payload reads back");
        check_(view.h.n == rq.in.n, "one datum per datum sent");
        for (int64_t i = 0; i < view.total; i++)
            check_(view.tokens[i] >= 0 && view.tokens[i] < 64 && view.targets[i] >= 0 && view.targets[i] < 64 &&
                   isfinite(view.weights[i]), "checked values are in range");
        free(j.payload);
    } else {
        check_(e.status == 400 || e.status == 500, "a refusal is a 400 (or out of memory)");
        check_(e.field[0] != '\0' && e.msg[0] != '\0', "a refusal names a field and says why");
        check_(j.payload == NULL, "a refusal lays out nothing");
    }

    /* The encoder, on outputs made of each datum's first tensor. */
    const int64_t n = rq.in.n;
    int64_t *off = calloc((size_t)n + 1, sizeof *off);
    check_(off != NULL, "memory");
    for (int64_t i = 0; i < n; i++)
        off[i + 1] = off[i] + (rq.in.data[i].n_inputs > 0 ? rq.in.data[i].inputs[0].n : 0);
    float *values = calloc((size_t)off[n] + 1, sizeof *values);
    check_(values != NULL, "memory");
    for (int64_t i = 0; i < n; i++)
        for (int64_t v = 0; v < off[i + 1] - off[i]; v++) values[off[i] + v] = (float)rq.in.data[i].inputs[0].reals[v];
    static const char *const names[1] = {"logprobs"};
    static const char *const metric[1] = {"loss:sum"};
    const float *const cols[1] = {values};
    const double loss = 1.5;
    size_t len = 0;
    unsigned char *pb = serve_proto_encode_fwdbwd_typed("ArrayRecord", n, off, 1, names, cols, 1, metric, &loss,
                                                        &len, err, sizeof err);
    if (pb == NULL) {
        check_(err[0] != '\0', "an encoder refusal has a message");
    } else {
        const uint8_t *rec = NULL;
        size_t rec_len = 0;
        uint64_t unused = 0, num_datums = 0;
        int n_rec = walk_(pb, pb + len, 2, 0, &unused, &rec, &rec_len);
        check_(n_rec == (n > 0 ? 1 : 0), "one ArrayRecord when there are datums");
        if (rec != NULL) {
            walk_(rec, rec + rec_len, 2, 3, &num_datums, NULL, NULL);
            check_(num_datums == (uint64_t)n, "num_datums is the datum count");
        }
        free(pb);
    }
    free(values);
    free(off);
    serve_proto_fwdbwd_free(&rq);
    return 0;
}
