/*
 * tinker/proto.h -- the protobuf side of the Tinker SDK's wire protocol
 * (SDK 0.25: forward_backward requests and ForwardBackwardOutput results as
 * application/x-protobuf; docs/tinker-protocol.md §0, §1.6).
 *
 * A hand-written codec for the messages of tinker_public.proto that zdp serve
 * needs, and nothing else: proto_decode.c reads a request, proto_encode.c
 * writes the results.  A request is decoded straight into the typed
 * request the JSON path also produces (serve_fwd_in, fwd_input.h), and
 * parse_fwd.c's serve_fwd_build checks its content for both (one set of
 * checks, each message naming the JSON path); the codec refuses only what is
 * not well-formed protobuf.  Numbers keep their values: a NaN weight is NaN
 * until the check that refuses it.  The encoders depend on jansson only for
 * their JSON forms (the fuzz target tests/fuzz/fuzz_serve_proto.c links it
 * through zdp_serve).
 */
#ifndef ZDP_SERVE_PROTO_H
#define ZDP_SERVE_PROTO_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fwd_input.h"

#define SERVE_PROTO_CONTENT_TYPE "application/x-protobuf"

/*
 * Field numbers (tinker_public.proto, from the SDK's tinker_public_pb2.py;
 * docs/tinker-protocol.md §1.6):
 *   ForwardBackwardRequest  1 model_id string, 2 seq_id int32, 3 data repeated
 *                           Datum, 4 loss_fn string, 5 loss_fn_config
 *                           map<string,double>, 6 forward_only bool,
 *                           7 loss_fn_config_v2 map<string,LossConfigValue>
 *                           (SDK 0.26+; replaces 5 when it has an entry)
 *   LossConfigValue         oneof {1 number double | 2 text string}
 *   Datum                   1 model_input repeated Chunk, 2 loss_fn_inputs
 *                           map<string,Tensor>; 3 model_input_spans and
 *                           4 loss_fn_input_spans (provenance) are skipped
 *   Chunk (oneof)           1 encoded_text {1 tokens: int32 LE bytes},
 *                           2 image, 3 dmel
 *   Tensor                  oneof {1 dense bytes | 2 sparse_csr}, 3 dtype,
 *                           4 shape repeated int64
 *   DType                   0 unspecified, 1 FLOAT32, 2 INT64, 3 INT32, 4 BFLOAT16
 *   ForwardBackwardOutput   1 loss_fn_output_type, 2 loss_fn_outputs repeated
 *                           ArrayRecord, 3 metrics map<string,double>
 *   ArrayRecord             1 type_tag, 2 fields map<string,BatchedTensor>,
 *                           3 num_datums int64
 *   BatchedTensor           1 data bytes, 2 offsets bytes (int64 byte
 *                           offsets, n+1), 3 dtype, 4 trailing_shape
 * A map entry is a message {1 key, 2 value}.  Repeated scalars are accepted
 * packed and unpacked; a singular field given twice keeps the last value, as
 * protobuf does; unknown fields are skipped (newer SDKs add some).
 */
/* Protobuf's wire types (the encoding's own, in every tag). */
enum { WT_VARINT = 0, WT_I64 = 1, WT_LEN = 2, WT_SGROUP = 3, WT_EGROUP = 4, WT_I32 = 5 };

/* A ForwardBackwardRequest {1 model_id, 2 seq_id, 3 data, 4 loss_fn,
 * 5 loss_fn_config, 6 forward_only, 7 loss_fn_config_v2}, decoded. */
typedef struct serve_proto_fwdbwd {
    const char *model_id; /* "" when not sent; UTF-8 without NUL */
    int64_t seq_id;       /* int32 on the wire (sign-extended); 0 when not sent */
    bool forward_only;    /* a forward (forward_input), else forward_backward_input */
    /* data (a Datum is model_input chunks and loss_fn_inputs tensors),
     * loss_fn ("" is not given), loss_fn_config; its arena also owns
     * model_id.  Image and dmel chunks, sparse tensors and dtypes other than
     * int64/int32/float32 come out as what they are, for the checks to
     * refuse by name.  Unknown fields are skipped. */
    serve_fwd_in in;
} serve_proto_fwdbwd;

/* Decodes buf[0..len) into *out: true, or false with err set ("data[2].
 * loss_fn_inputs.target_tokens.dense: ...": the field path, then what is
 * wrong) and *out empty.  Either way serve_proto_fwdbwd_free(out) after. */
bool serve_proto_decode_fwdbwd(const unsigned char *buf, size_t len, serve_proto_fwdbwd *out, char *err,
                               size_t errcap);
void serve_proto_fwdbwd_free(serve_proto_fwdbwd *r);

/* Encodes the JSON ForwardBackwardOutput the server computes
 * ({"loss_fn_output_type", "loss_fn_outputs": [{name: TensorData}...],
 * "metrics": {name: number}}) as the protobuf ForwardBackwardOutput:
 * 1 loss_fn_output_type, 2 loss_fn_outputs = ONE ArrayRecord for all datums
 * (2 fields: name -> BatchedTensor {1 data: the datums' values concatenated,
 * 2 offsets: n+1 int64 byte offsets, 3 dtype, 4 trailing_shape}, 3
 * num_datums), 3 metrics.  A null value (a non-finite number in JSON) is NaN.
 * Returns malloc'd bytes (*out_len of them; free()), or NULL with err set. */
unsigned char *serve_proto_encode_fwdbwd_output(const json_t *result, size_t *out_len, char *err,
                                                size_t errcap);

/* The same ForwardBackwardOutput from typed values, without JSON: type
 * (field 1, "" to leave out); n datums, datum i's elements [off[i],
 * off[i + 1]) of each of the n_fields float32 outputs (names[k] ->
 * values[k], 1-D); metrics names -> values (NaN stays NaN). */
unsigned char *serve_proto_encode_fwdbwd_typed(const char *type, int64_t n, const int64_t *off, int n_fields,
                                               const char *const *names, const float *const *values,
                                               int n_metrics, const char *const *metric_names,
                                               const double *metric_values, size_t *out_len, char *err,
                                               size_t errcap);

/* Encodes a JSON SampleResponse ({"sequences": [{"tokens", "logprobs"?,
 * "stop_reason": "stop"|"length"}]}) as the protobuf SampleResponse:
 * 1 repeated SampledSequence {1 stop_reason (STOP 0, LENGTH 1), 2 tokens as
 * int32 LE bytes, 3 logprobs as float32 LE bytes}.  Same contract as above. */
unsigned char *serve_proto_encode_sample_response(const json_t *result, size_t *out_len, char *err,
                                                  size_t errcap);
/* The same SampleResponse from a typed result (serve_sample_result's
 * fields): n sequences, sequence i's tokens [off[i], off[i + 1]) of tokens
 * and logprobs (NULL: none written), stopped[i] its stop_reason STOP (else
 * LENGTH); prompt_lp (n_prompt_lp floats, NULL: none) as field 2; with
 * topk_k > 0, field 3 TopkPromptLogprobs {1 token_ids int32 LE, 2 logprobs
 * float32 LE, both (n_topk, topk_k) row-major, 3 k, 4 prompt_length}, row 0
 * (ids -1) as the SDK's sentinel (id 0, logprob -99999: None).
 * Non-finite logprobs go as NaN, as their JSON null did. */
unsigned char *serve_proto_encode_sample_typed(int64_t n, const int64_t *off, const int32_t *tokens,
                                               const float *logprobs, const bool *stopped,
                                               const float *prompt_lp, int64_t n_prompt_lp, int64_t topk_k,
                                               int64_t n_topk, const int32_t *topk_ids, const float *topk_lps,
                                               size_t *out_len, char *err, size_t errcap);

#endif /* ZDP_SERVE_PROTO_H */
