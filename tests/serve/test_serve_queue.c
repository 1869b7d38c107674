/*
 * test_serve_queue.c -- the server's queue side in-process, without HTTP or
 * MPI (src/serve/): the op table, request validation (parse.c,
 * parse_fwd.c), and the Tinker protocol's seq_id holding, gap expiry, retry
 * de-duplication, future expiry and pruning, and a sampling session's
 * completions and cancelled samples (tinker/futures.c).  A server struct is set up by
 * hand with a live model; requests go in through tinker_submit, and the test
 * reads the FIFO (s->head) the leader loop would run.  Also: a typed
 * forward_backward or sample result encodes to the same protobuf bytes
 * straight from its values as through its JSON, and to the expected JSON.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <math.h>

#include "serve_impl.h"
#include "serve_fx.h"
#include "tinker/proto.h"
#include "tinker/tinker.h"

#define MODEL_ID "s1:train:0"

/* A rank-0 server as zdp_server_start leaves it, minus the engine and HTTP:
 * a tiny model shape (V = 16, T = 8), the Tinker protocol registered, one
 * live model. */
static server *server_(void) {
    server *s = serve_fx_new_(false, 1, 0); /* --full-finetune: one model, slot 0 */
    tinker_state *t = s->tinker;
    t->models[0] = (tinker_model){.live = true, .slot = 0, .uid = 1, .next_seq = 1};
    snprintf(t->models[0].model_id, sizeof t->models[0].model_id, "%s", MODEL_ID);
    return s;
}

/* A forward_backward body: one datum [tok, tok + 1] -> [tok + 1, tok + 2]. */
static json_t *fwdbwd_(int64_t seq, int tok) {
    json_t *o = json_pack("{s:s,s:I,s:{s:[{s:{s:[{s:s,s:[i,i]}]},s:{s:[i,i]}}],s:s}}", "model_id", MODEL_ID,
                          "seq_id", (json_int_t)seq, "forward_backward_input", "data", "model_input", "chunks",
                          "type", "encoded_text", "tokens", tok, tok + 1, "loss_fn_inputs", "target_tokens",
                          tok + 1, tok + 2, "loss_fn", "cross_entropy");
    assert_non_null(o);
    return o;
}

/* Submits and returns the future's number (zdp-N -> N). */
static int submit_(server *s, json_t *body, const char *idem) {
    tinker_ticket tk;
    verr e = {0};
    int st = tinker_submit(s, "forward_backward", body, idem, false, &tk, &e);
    json_decref(body);
    assert_int_equal(st, 200);
    assert_string_equal(tk.model_id, MODEL_ID);
    assert_memory_equal(tk.id, "zdp-", 4);
    return atoi(tk.id + 4);
}

/* The seq_ids in the FIFO, in order; returns how many. */
static int queued_(const server *s, int64_t *seq, int cap) {
    int n = 0;
    for (const job *j = s->head; j != NULL; j = j->next) {
        if (n < cap) seq[n] = j->seq_id;
        n++;
    }
    return n;
}

static future *future_(server *s, int n) {
    char id[32];
    snprintf(id, sizeof id, "zdp-%d", n);
    for (future *f = s->tinker->futures; f != NULL; f = f->next)
        if (!strcmp(f->id, id)) return f;
    return NULL;
}

/* ---- the op table -------------------------------------------------------------- */

static void test_op_table(void **state) {
    (void)state;
    for (int op = 0; op < SERVE_N_OPS; op++) {
        assert_int_equal(serve_ops[op].op, op);
        assert_non_null(serve_ops[op].name);
        for (int k = 0; k < op; k++) assert_string_not_equal(serve_ops[op].name, serve_ops[k].name);
    }
    /* What runs nowhere; every rank samples (docs/sampling.md) and every
     * rank takes part in save_weights (stage 3 gathers the whole model). */
    assert_true(serve_ops[OP_SAVE_WEIGHTS].all_ranks);
    assert_false(serve_ops[OP_NOOP].all_ranks);
    assert_true(serve_ops[OP_SAMPLE].all_ranks);
    assert_true(serve_ops[OP_SAMPLE_FILE].all_ranks);
    assert_true(serve_ops[OP_FWDBWD].all_ranks);
    assert_true(serve_ops[OP_OPTIM].all_ranks);
    assert_true(serve_ops[OP_SAVE_STATE].all_ranks);
    assert_true(serve_ops[OP_LOAD_WEIGHTS].all_ranks);
    assert_null(serve_ops[OP_QUIT].exec);
    assert_null(serve_ops[OP_NOOP].exec);
    assert_null(serve_ops[OP_PING].exec);
    assert_non_null(serve_ops[OP_FWDBWD].exec);
    assert_ptr_equal(serve_ops[OP_FWDBWD].exec, serve_ops[OP_FORWARD].exec);
    assert_string_equal(serve_ops[OP_SAMPLE_FILE].name, "asample");
    assert_string_equal(serve_ops[OP_OPTIM].name, "optim_step");
}

/* ---- request validation -------------------------------------------------------- */

static void test_parse_fwd(void **state) {
    (void)state;
    const zdp_model mc = {.vocab_size = 16, .block_size = 8};
    json_t *body = fwdbwd_(1, 3);
    const json_t *in = json_object_get(body, "forward_backward_input");
    job j = {0};
    verr e = {0};
    assert_true(serve_parse_fwd(in, "forward_backward_input", &mc, &j, &e));
    /* fwd_header; int32 len[1]; int32 tokens[2]; int32 targets[2]; float w, q, adv [2] each */
    assert_int_equal(j.nbytes, (int64_t)(sizeof(fwd_header) + 4 + 8 + 8 + 3 * 8));
    serve_fwd_req rq;
    assert_true(serve_fwd_req_view(&j, &rq));
    assert_int_equal(rq.h.n, 1);
    assert_int_equal(rq.h.loss, ZDP_LOSS_CROSS_ENTROPY);
    assert_int_equal(rq.total, 2);
    assert_int_equal(rq.len[0], 2);
    assert_int_equal(rq.tokens[0], 3);
    assert_int_equal(rq.targets[1], 5);
    assert_true(rq.weights[0] == 1.0f && rq.weights[1] == 1.0f); /* no weights: all 1 */
    /* A payload cut short is not a request. */
    j.nbytes -= 4;
    assert_false(serve_fwd_req_view(&j, &rq));
    free(j.payload);
    json_decref(body);

    /* A token outside the vocabulary: 400 naming its place. */
    body = fwdbwd_(1, 15);
    memset(&j, 0, sizeof j);
    assert_false(serve_parse_fwd(json_object_get(body, "forward_backward_input"), "forward_backward_input",
                                 &mc, &j, &e));
    assert_int_equal(e.status, 400);
    assert_string_equal(e.field, "forward_backward_input.data[0].model_input.chunks[0].tokens[1]");
    assert_null(j.payload);
    json_decref(body);

    /* An unknown loss. */
    body = fwdbwd_(1, 3);
    json_object_set_new(json_object_get(body, "forward_backward_input"), "loss_fn", json_string("kl"));
    assert_false(serve_parse_fwd(json_object_get(body, "forward_backward_input"), "forward_backward_input",
                                 &mc, &j, &e));
    assert_string_equal(e.field, "forward_backward_input.loss_fn");
    json_decref(body);
}

/* ---- protobuf straight into the typed request ---------------------------------- */

/* A small protobuf writer for requests (the server only decodes them). */
typedef struct pb_ {
    unsigned char b[4096];
    size_t n;
} pb_;

static void pb_varint_(pb_ *p, uint64_t v) {
    do {
        p->b[p->n++] = (unsigned char)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        v >>= 7;
    } while (v);
}
static void pb_bytes_(pb_ *p, unsigned num, const void *data, size_t n) {
    pb_varint_(p, (uint64_t)num << 3 | 2);
    pb_varint_(p, n);
    memcpy(p->b + p->n, data, n);
    p->n += n;
}
static void pb_msg_(pb_ *p, unsigned num, const pb_ *sub) { pb_bytes_(p, num, sub->b, sub->n); }
static void pb_double_(pb_ *p, unsigned num, double x) {
    pb_varint_(p, (uint64_t)num << 3 | 1);
    memcpy(p->b + p->n, &x, 8); /* little-endian machines only, as the server */
    p->n += 8;
}
/* loss_fn_inputs entry: name -> Tensor {1 dense, 3 dtype, 4 shape}. */
static void pb_tensor_(pb_ *datum, const char *name, int dtype, const void *dense, size_t n_bytes, int64_t shape) {
    pb_ t = {0}, entry = {0};
    pb_bytes_(&t, 1, dense, n_bytes);
    pb_varint_(&t, 3 << 3 | 0);
    pb_varint_(&t, (uint64_t)dtype);
    pb_varint_(&t, 4 << 3 | 0);
    pb_varint_(&t, (uint64_t)shape);
    pb_bytes_(&entry, 1, name, strlen(name));
    pb_msg_(&entry, 2, &t);
    pb_msg_(datum, 2, &entry);
}

/* A ppo forward_backward of 2 datums, as protobuf and as JSON: datum 1's
 * first token is `first` and its logprobs[1] is w (0.5 in the JSON, which
 * cannot hold a NaN). */
static void ppo_request_(float w, int32_t first, pb_ *out, json_t **json) {
    const int32_t tok[2][3] = {{1, 2, 3}, {first, 5, 0}};
    const int64_t tgt[2][3] = {{2, 3, 4}, {5, 6, 0}};
    const float lp[2][3] = {{-1.0f, -2.0f, -0.5f}, {-0.25f, w, 0}};
    const float adv[2][3] = {{1.0f, -1.0f, 0.5f}, {2.0f, 0.0f, 0}};
    const int len[2] = {3, 2};
    memset(out, 0, sizeof *out);
    pb_bytes_(out, 1, MODEL_ID, strlen(MODEL_ID));
    pb_varint_(out, 2 << 3 | 0);
    pb_varint_(out, 7);
    json_t *data = json_array();
    for (int i = 0; i < 2; i++) {
        pb_ text = {0}, chunk = {0}, datum = {0};
        pb_bytes_(&text, 1, tok[i], 4 * (size_t)len[i]);
        pb_msg_(&chunk, 1, &text);
        pb_msg_(&datum, 1, &chunk);
        pb_tensor_(&datum, "target_tokens", 2, tgt[i], 8 * (size_t)len[i], len[i]);
        pb_tensor_(&datum, "logprobs", 1, lp[i], 4 * (size_t)len[i], len[i]);
        pb_tensor_(&datum, "advantages", 1, adv[i], 4 * (size_t)len[i], len[i]);
        pb_msg_(out, 3, &datum);
        json_t *jt = json_array(), *jg = json_array(), *jl = json_array(), *ja = json_array();
        for (int k = 0; k < len[i]; k++) {
            json_array_append_new(jt, json_integer(tok[i][k]));
            json_array_append_new(jg, json_integer(tgt[i][k]));
            json_array_append_new(jl, json_real(i == 1 && k == 1 ? 0.5 : lp[i][k]));
            json_array_append_new(ja, json_real(adv[i][k]));
        }
        json_array_append_new(
            data, json_pack("{s:{s:[{s:s,s:o}]},s:{s:{s:o,s:s,s:[i]},s:{s:o,s:s},s:o}}", "model_input", "chunks",
                            "type", "encoded_text", "tokens", jt, "loss_fn_inputs", "target_tokens", "data", jg,
                            "dtype", "int64", "shape", len[i], "logprobs", "data", jl, "dtype", "float32",
                            "advantages", ja));
    }
    pb_bytes_(out, 4, "ppo", 3);
    pb_ entry = {0};
    pb_bytes_(&entry, 1, "clip_low_threshold", strlen("clip_low_threshold"));
    pb_double_(&entry, 2, 0.75);
    pb_msg_(out, 5, &entry);
    *json = json_pack("{s:o,s:s,s:{s:f}}", "data", data, "loss_fn", "ppo", "loss_fn_config", "clip_low_threshold",
                      0.75);
    assert_non_null(*json);
}

static void test_proto_typed_request(void **state) {
    (void)state;
    const zdp_model mc = {.vocab_size = 16, .block_size = 8};
    pb_ body;
    json_t *json;
    ppo_request_(0.5f, 4, &body, &json);
    char err[256];
    serve_proto_fwdbwd rq;
    assert_true(serve_proto_decode_fwdbwd(body.b, body.n, &rq, err, sizeof err));
    assert_string_equal(rq.model_id, MODEL_ID);
    assert_int_equal(rq.seq_id, 7);
    assert_false(rq.forward_only);
    assert_int_equal(rq.in.n, 2);
    assert_string_equal(rq.in.loss_fn, "ppo");
    assert_int_equal(rq.in.data[1].n_inputs, 3);
    /* The same payload, byte for byte, from protobuf and from JSON. */
    job a = {.op = OP_FWDBWD}, b = {.op = OP_FWDBWD};
    verr e = {0};
    assert_true(serve_fwd_build(&rq.in, "forward_backward_input", 16, 8, &a, &e));
    assert_true(serve_parse_fwd(json, "forward_backward_input", &mc, &b, &e));
    assert_int_equal(a.nbytes, b.nbytes);
    assert_memory_equal(a.payload, b.payload, (size_t)a.nbytes);
    serve_fwd_req view;
    assert_true(serve_fwd_req_view(&a, &view));
    assert_int_equal(view.total, 5);
    assert_true(view.h.loss == ZDP_LOSS_PPO && view.h.clip_low == 0.75 && view.h.clip_high == 1.2);
    free(a.payload);
    free(b.payload);
    serve_proto_fwdbwd_free(&rq);
    json_decref(json);

    /* A token outside the vocabulary: the same field and message both ways. */
    ppo_request_(0.5f, 16, &body, &json);
    verr ej = {0}, ep = {0};
    memset(&b, 0, sizeof b);
    b.op = OP_FWDBWD;
    assert_false(serve_parse_fwd(json, "forward_backward_input", &mc, &b, &ej));
    assert_true(serve_proto_decode_fwdbwd(body.b, body.n, &rq, err, sizeof err));
    memset(&a, 0, sizeof a);
    a.op = OP_FWDBWD;
    assert_false(serve_fwd_build(&rq.in, "forward_backward_input", 16, 8, &a, &ep));
    assert_string_equal(ep.field, "forward_backward_input.data[1].model_input.chunks[0].tokens[0]");
    assert_string_equal(ep.field, ej.field);
    assert_string_equal(ep.msg, ej.msg);
    assert_null(a.payload);
    assert_null(b.payload);
    serve_proto_fwdbwd_free(&rq);
    json_decref(json);

    /* NaN stays NaN until the check that refuses it, by name. */
    ppo_request_(NAN, 4, &body, &json);
    json_decref(json);
    assert_true(serve_proto_decode_fwdbwd(body.b, body.n, &rq, err, sizeof err));
    assert_true(isnan(rq.in.data[1].inputs[1].reals[1]));
    memset(&a, 0, sizeof a);
    a.op = OP_FWDBWD;
    assert_false(serve_fwd_build(&rq.in, "forward_backward_input", 16, 8, &a, &ep));
    assert_string_equal(ep.field, "forward_backward_input.data[1].loss_fn_inputs.logprobs.data[1]");
    assert_non_null(strstr(ep.msg, "= nan: must be a finite number"));
    serve_proto_fwdbwd_free(&rq);

    /* Not well-formed protobuf: refused by the codec, naming the field. */
    assert_false(serve_proto_decode_fwdbwd(body.b, body.n - 3, &rq, err, sizeof err));
    assert_non_null(strstr(err, "loss_fn_config"));
    serve_proto_fwdbwd_free(&rq);
}

/* loss_fn_config_v2 entry (SDK 0.26+): key -> LossConfigValue {1 number
 * double | 2 text string}. */
static void pb_config_v2_(pb_ *req, const char *key, const double *number, const char *text) {
    pb_ value = {0}, entry = {0};
    if (number != NULL) pb_double_(&value, 1, *number);
    if (text != NULL) pb_bytes_(&value, 2, text, strlen(text));
    pb_bytes_(&entry, 1, key, strlen(key));
    pb_msg_(&entry, 2, &value);
    pb_msg_(req, 7, &entry);
}

/* What SDK 0.26+ add to a ForwardBackwardRequest: field 7 replaces the
 * legacy map when it has an entry, a text value is refused by name, and a
 * Datum's provenance spans (3, 4) are skipped. */
static void test_proto_newer_fields(void **state) {
    (void)state;
    pb_ body;
    json_t *json;
    char err[256];
    serve_proto_fwdbwd rq;
    job a = {.op = OP_FWDBWD};
    verr e = {0};
    serve_fwd_req view;

    /* Legacy 0.75 (field 5) beside v2 0.9: v2's value. */
    ppo_request_(0.5f, 4, &body, &json);
    json_decref(json);
    const double v2 = 0.9;
    pb_config_v2_(&body, "clip_low_threshold", &v2, NULL);
    assert_true(serve_proto_decode_fwdbwd(body.b, body.n, &rq, err, sizeof err));
    assert_int_equal(rq.in.n_config, 1);
    assert_true(serve_fwd_build(&rq.in, "forward_backward_input", 16, 8, &a, &e));
    assert_true(serve_fwd_req_view(&a, &view));
    assert_true(view.h.clip_low == 0.9 && view.h.clip_high == 1.2);
    free(a.payload);
    serve_proto_fwdbwd_free(&rq);

    /* A text value: refused by the checks, naming the field and the value. */
    ppo_request_(0.5f, 4, &body, &json);
    json_decref(json);
    pb_config_v2_(&body, "clip_low_threshold", NULL, "k3");
    assert_true(serve_proto_decode_fwdbwd(body.b, body.n, &rq, err, sizeof err));
    memset(&a, 0, sizeof a);
    a.op = OP_FWDBWD;
    assert_false(serve_fwd_build(&rq.in, "forward_backward_input", 16, 8, &a, &e));
    assert_string_equal(e.field, "forward_backward_input.loss_fn_config.clip_low_threshold");
    assert_non_null(strstr(e.msg, "= \"k3\": a text value"));
    serve_proto_fwdbwd_free(&rq);
    /* The same from JSON (ForwardBackwardInput.loss_fn_config {str: float | str}). */
    ppo_request_(0.5f, 4, &body, &json);
    json_object_set_new(json_object_get(json, "loss_fn_config"), "clip_low_threshold", json_string("k3"));
    verr ej = {0};
    const zdp_model mc = {.vocab_size = 16, .block_size = 8};
    job b = {.op = OP_FWDBWD};
    assert_false(serve_parse_fwd(json, "forward_backward_input", &mc, &b, &ej));
    assert_string_equal(ej.field, e.field);
    assert_string_equal(ej.msg, e.msg);
    json_decref(json);

    /* Provenance spans in a datum: decoded as if absent. */
    ppo_request_(0.5f, 4, &body, &json);
    json_decref(json);
    pb_ span = {0}, prompt = {0}, datum = {0}, text = {0}, chunk = {0};
    pb_bytes_(&prompt, 1, "s1:sample:1:0", 13);
    pb_varint_(&prompt, 3 << 3 | 0);
    pb_varint_(&prompt, 2);
    pb_msg_(&span, 1, &prompt);
    const int32_t tok[2] = {1, 2};
    const int64_t tgt[2] = {2, 3};
    pb_bytes_(&text, 1, tok, sizeof tok);
    pb_msg_(&chunk, 1, &text);
    pb_msg_(&datum, 1, &chunk);
    pb_tensor_(&datum, "target_tokens", 2, tgt, sizeof tgt, 2);
    pb_msg_(&datum, 3, &span);
    pb_msg_(&datum, 4, &span);
    pb_msg_(&body, 3, &datum);
    assert_true(serve_proto_decode_fwdbwd(body.b, body.n, &rq, err, sizeof err));
    assert_int_equal(rq.in.n, 3);
    assert_int_equal(rq.in.data[2].n_chunks, 1);
    assert_int_equal(rq.in.data[2].n_inputs, 1);
    serve_proto_fwdbwd_free(&rq);

    /* A v2 number of the wrong wire type: not well-formed, named. */
    ppo_request_(0.5f, 4, &body, &json);
    json_decref(json);
    pb_ value = {0}, entry = {0};
    pb_varint_(&value, 1 << 3 | 0);
    pb_varint_(&value, 3);
    pb_bytes_(&entry, 1, "beta", 4);
    pb_msg_(&entry, 2, &value);
    pb_msg_(&body, 7, &entry);
    assert_false(serve_proto_decode_fwdbwd(body.b, body.n, &rq, err, sizeof err));
    assert_non_null(strstr(err, "loss_fn_config_v2.beta"));
    serve_proto_fwdbwd_free(&rq);
}

static bool optim_(const char *key, double x, verr *e, optim_payload *p) {
    json_t *ap = json_pack("{s:f}", key, x);
    job j = {0};
    bool ok = serve_parse_optim(ap, "adam_params", false, &j, e);
    json_decref(ap);
    if (ok) memcpy(p, j.payload, sizeof *p);
    free(j.payload);
    return ok;
}

static void test_parse_optim(void **state) {
    (void)state;
    verr e = {0};
    optim_payload p;
    assert_true(optim_("learning_rate", 1e-3, &e, &p));
    assert_int_equal(p.has[0], 1);
    assert_true(p.value[0] == 1e-3);
    assert_int_equal(p.has[1], 0); /* not given: the engine's value stays */
    /* The library's ranges (zdp_hparams_check) ... */
    static const struct {
        const char *key;
        double x;
    } bad[] = {{"learning_rate", -1.0}, {"learning_rate", 1e308}, {"beta1", 1.0}, {"eps", 0.0},
               {"eps", 2.0}, {"weight_decay", 1e300}, {"grad_clip_norm", -0.5},
               /* ... and the server's caps on top */
               {"learning_rate", 11.0}, {"grad_clip_norm", 1e31}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        memset(&e, 0, sizeof e);
        assert_false(optim_(bad[i].key, bad[i].x, &e, &p));
        assert_int_equal(e.status, 400);
        char field[64];
        snprintf(field, sizeof field, "adam_params.%s", bad[i].key);
        assert_string_equal(e.field, field);
        assert_true(e.msg[0] != '\0');
    }
    /* An unknown key. */
    json_t *ap = json_pack("{s:f}", "lr", 1e-3);
    job j = {0};
    assert_false(serve_parse_optim(ap, "adam_params", false, &j, &e));
    assert_string_equal(e.field, "adam_params.lr");
    json_decref(ap);
    /* Tinker's defaults fill what is left out. */
    assert_true(serve_parse_optim(NULL, "adam_params", true, &j, &e));
    memcpy(&p, j.payload, sizeof p);
    for (int k = 0; k < N_ADAM; k++) assert_int_equal(p.has[k], 1);
    assert_true(p.value[0] == 1e-4);
    free(j.payload);
}

/* ---- seq_id order -------------------------------------------------------------- */

static void test_seq_holding(void **state) {
    (void)state;
    server *s = server_();
    int64_t seq[8];
    /* 3 and 2 arrive before 1: held, nothing queued. */
    submit_(s, fwdbwd_(3, 1), NULL);
    submit_(s, fwdbwd_(2, 1), NULL);
    assert_int_equal(queued_(s, seq, 8), 0);
    assert_non_null(s->tinker->models[0].held);
    /* 1 arrives: 1, 2, 3 run in that order. */
    submit_(s, fwdbwd_(1, 1), NULL);
    assert_int_equal(queued_(s, seq, 8), 3);
    assert_int_equal(seq[0], 1);
    assert_int_equal(seq[1], 2);
    assert_int_equal(seq[2], 3);
    assert_null(s->tinker->models[0].held);
    assert_int_equal(s->tinker->models[0].next_seq, 4);
    /* A refused request (a token outside the vocabulary) keeps its place:
     * 5 waits for 4, and 4 is answered without reaching the queue. */
    submit_(s, fwdbwd_(5, 1), NULL);
    const int bad = submit_(s, fwdbwd_(4, 15), NULL);
    assert_int_equal(queued_(s, seq, 8), 4);
    assert_int_equal(seq[3], 5);
    future *f = future_(s, bad);
    assert_non_null(f);
    assert_true(f->done);
    assert_non_null(strstr(f->result, "outside the vocabulary"));
    serve_fx_free_(s);
}

static void test_seq_gap_expiry(void **state) {
    (void)state;
    server *s = server_();
    s->opt.seq_gap_s = 5;
    int64_t seq[8];
    submit_(s, fwdbwd_(3, 1), NULL);
    submit_(s, fwdbwd_(4, 1), NULL);
    pthread_mutex_lock(&s->mu);
    assert_false(tinker_tick_locked(s)); /* not due yet */
    assert_int_equal(queued_(s, seq, 8), 0);
    /* The oldest held request has waited longer than --seq-gap-seconds: 1
     * and 2 are given up, 3 and 4 run. */
    s->tinker->models[0].held->arrived -= 6;
    assert_true(tinker_tick_locked(s));
    pthread_mutex_unlock(&s->mu);
    assert_int_equal(queued_(s, seq, 8), 2);
    assert_int_equal(seq[0], 3);
    assert_int_equal(seq[1], 4);
    assert_int_equal(s->tinker->models[0].next_seq, 5);
    /* 1 arriving now is refused: its future fails, nothing is queued. */
    const int late = submit_(s, fwdbwd_(1, 1), NULL);
    assert_int_equal(queued_(s, seq, 8), 2);
    future *f = future_(s, late);
    assert_true(f->done);
    assert_non_null(strstr(f->result, "arrived after seq_id 4 had run"));
    serve_fx_free_(s);
}

/* ---- retries ------------------------------------------------------------------- */

static void test_retry_dedup(void **state) {
    (void)state;
    server *s = server_();
    int64_t seq[8];
    const int a = submit_(s, fwdbwd_(1, 1), "key-1");
    /* The same idempotency key (another seq_id even): the first future. */
    assert_int_equal(submit_(s, fwdbwd_(7, 1), "key-1"), a);
    /* The same (model_id, seq_id) under a new key: the first future too. */
    assert_int_equal(submit_(s, fwdbwd_(1, 1), "key-2"), a);
    assert_int_equal(submit_(s, fwdbwd_(1, 1), NULL), a);
    assert_int_equal(queued_(s, seq, 8), 1);
    assert_int_equal(s->tinker->n_futures, 1);
    /* Another seq_id is another request. */
    assert_int_not_equal(submit_(s, fwdbwd_(2, 1), "key-3"), a);
    assert_int_equal(queued_(s, seq, 8), 2);
    serve_fx_free_(s);
}

/* ---- futures ------------------------------------------------------------------- */

static void test_future_expiry(void **state) {
    (void)state;
    server *s = server_();
    tinker_state *t = s->tinker;
    const int pending = submit_(s, fwdbwd_(1, 1), NULL);
    const int old = submit_(s, fwdbwd_(2, 15), NULL);  /* refused: done at once */
    const int read = submit_(s, fwdbwd_(3, 15), NULL); /* done, read a while ago */
    const int fresh = submit_(s, fwdbwd_(4, 15), NULL);
    future_(s, old)->done_at -= FUTURE_TTL_S + 1;
    future_(s, read)->read_at = serve_now() - FUTURE_READ_TTL_S - 1;
    /* A future nobody finished never goes, however old. */
    future_(s, pending)->done_at -= 10 * FUTURE_TTL_S;
    tinker_prune(t);
    assert_non_null(future_(s, pending));
    assert_null(future_(s, old));
    assert_null(future_(s, read));
    assert_non_null(future_(s, fresh));
    assert_int_equal(t->n_futures, 2);
    serve_fx_free_(s);
}

static void test_future_cap(void **state) {
    (void)state;
    server *s = server_();
    tinker_state *t = s->tinker;
    /* Past MAX_FUTURES, finished ones older than FUTURE_READ_TTL_S go (the
     * oldest first); recent ones stay even past the cap. */
    for (int i = 0; i < MAX_FUTURES + 10; i++) {
        int n = submit_(s, fwdbwd_(i + 1, 15), NULL);
        if (i < 20) future_(s, n)->done_at -= FUTURE_READ_TTL_S + 1;
    }
    assert_true(t->n_futures > MAX_FUTURES);
    tinker_prune(t);
    assert_int_equal(t->n_futures, MAX_FUTURES);
    assert_null(future_(s, 1));
    assert_null(future_(s, 10));
    assert_non_null(future_(s, 11));
    assert_non_null(future_(s, MAX_FUTURES + 10));
    serve_fx_free_(s);
}

/* ---- typed results ------------------------------------------------------------ */

static void test_fwd_result_encodings(void **state) {
    (void)state;
    /* 2 datums of 2 and 3 tokens, values exact in 9 digits. */
    int64_t off[3] = {0, 2, 5};
    float lp[5] = {-0.25f, -1.5f, -3.0f, -0.125f, -2.0f}, el[5] = {0.25f, 1.5f, 3.0f, 0.125f, 2.0f};
    serve_fwd_result r = {.n = 2, .off = off, .logprobs = lp, .elementwise = el, .loss_sum = 6.875};
    char *text = serve_fwd_result_json(&r);
    assert_non_null(text);
    json_t *o = json_loads(text, 0, NULL);
    assert_non_null(o);
    assert_int_equal(json_array_size(json_object_get(o, "loss_fn_outputs")), 2);
    char err[256];
    size_t n_json, n_typed;
    unsigned char *a = serve_proto_encode_fwdbwd_output(o, &n_json, err, sizeof err);
    static const char *const names[2] = {"logprobs", "elementwise_loss"};
    static const char *const metric[1] = {"loss:sum"};
    const float *const values[2] = {lp, el};
    unsigned char *b = serve_proto_encode_fwdbwd_typed("ArrayRecord", r.n, r.off, 2, names, values, 1, metric,
                                                       &r.loss_sum, &n_typed, err, sizeof err);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(n_json, n_typed);
    assert_memory_equal(a, b, n_json);
    /* A copy owns its arrays. */
    serve_fwd_result *c = serve_fwd_result_copy(&r);
    assert_non_null(c);
    assert_true(c->off != off && c->off[2] == 5 && c->logprobs[4] == -2.0f && c->loss_sum == 6.875);
    serve_fwd_result_free(c);
    free(a);
    free(b);
    free(text);
    json_decref(o);
}

static void test_sample_result_encodings(void **state) {
    (void)state;
    /* 3 sequences: 2 tokens ended by a stop token, 1 token at the length
     * limit with a non-finite logprob (null in JSON, NaN in protobuf), none. */
    int64_t off[4] = {0, 2, 3, 3};
    int32_t tok[3] = {3, 7, 15};
    float lp[3] = {-0.25f, -1.5f, -INFINITY};
    bool stopped[3] = {true, false, false};
    serve_sample_result r = {.n = 3, .off = off, .tokens = tok, .logprobs = lp, .stopped = stopped,
                             .prompt_length = -1};
    char *text = serve_sample_result_json(&r);
    assert_non_null(text);
    assert_string_equal(text, "{\"sequences\":[{\"tokens\":[3,7],\"logprobs\":[-0.25,-1.5],\"stop_reason\":\"stop\"},"
                              "{\"tokens\":[15],\"logprobs\":[null],\"stop_reason\":\"length\"},"
                              "{\"tokens\":[],\"logprobs\":[],\"stop_reason\":\"length\"}],\"type\":\"sample\"}");
    json_t *o = json_loads(text, 0, NULL);
    assert_non_null(o);
    char err[256];
    size_t n_json, n_typed;
    unsigned char *a = serve_proto_encode_sample_response(o, &n_json, err, sizeof err);
    unsigned char *b = serve_proto_encode_sample_typed(r.n, r.off, r.tokens, r.logprobs, r.stopped, NULL, 0, 0, 0, NULL, NULL, &n_typed, err,
                                                       sizeof err);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(n_json, n_typed);
    assert_memory_equal(a, b, n_json);
    free(a);
    free(b);
    json_decref(o);
    /* A copy owns its arrays. */
    serve_sample_result *c = serve_sample_result_copy(&r);
    assert_non_null(c);
    assert_true(c->off != off && c->off[3] == 3 && c->tokens[2] == 15 && c->logprobs[1] == -1.5f &&
                c->stopped[0] && !c->stopped[1] && c->prompt_length == -1);
    serve_sample_result_free(c);
    free(text);
    /* POST /sample's: no logprobs, its prompt_length. */
    serve_sample_result p = {.n = 1, .off = off, .tokens = tok, .stopped = &stopped[1], .prompt_length = 4};
    text = serve_sample_result_json(&p);
    assert_non_null(text);
    assert_string_equal(text, "{\"sequences\":[{\"tokens\":[3,7],\"stop_reason\":\"length\"}],\"prompt_length\":4}");
    o = json_loads(text, 0, NULL);
    assert_non_null(o);
    a = serve_proto_encode_sample_response(o, &n_json, err, sizeof err);
    b = serve_proto_encode_sample_typed(p.n, p.off, p.tokens, p.logprobs, p.stopped, NULL, 0, 0, 0, NULL, NULL, &n_typed, err, sizeof err);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(n_json, n_typed);
    assert_memory_equal(a, b, n_json);
    c = serve_sample_result_copy(&p);
    assert_non_null(c);
    assert_true(c->logprobs == NULL && c->off[1] == 2 && c->prompt_length == 4);
    serve_sample_result_free(c);
    free(a);
    free(b);
    free(text);
    json_decref(o);
}

static void test_optim_result_json(void **state) {
    (void)state;
    serve_optim_result r = {.grad_norm = 0.5, .lr = 0.001, .step = 3, .global_samples = 12, .step_applied = true};
    char *text = serve_optim_result_json(&r, false);
    assert_non_null(text);
    assert_string_equal(text, "{\"metrics\":{\"grad_norm:mean\":0.5,\"learning_rate:mean\":0.001},\"step\":3,"
                              "\"global_samples\":12,\"step_applied\":true,\"warnings\":[]}");
    free(text);
    /* Tinker's OptimStepResponse: the metrics alone; a non-finite one is null. */
    r.grad_norm = NAN;
    r.sgd_warning = true;
    text = serve_optim_result_json(&r, true);
    assert_non_null(text);
    assert_string_equal(text, "{\"metrics\":{\"grad_norm:mean\":null,\"learning_rate:mean\":0.001}}");
    free(text);
    text = serve_optim_result_json(&r, false);
    assert_non_null(text);
    assert_non_null(strstr(text, "\"warnings\":[\"the engine's optimizer is SGD"));
    free(text);
}

static void test_save_result_encodings(void **state) {
    (void)state;
    /* The plain API's JSON: a checkpoint's with the engine's counters, a
     * weights file's with the step alone. */
    serve_save_result r = {.op = OP_SAVE_STATE, .path = "/ck/run/step3", .step = 3, .global_samples = 12,
                           .pending_backwards = 0};
    char *text = serve_save_result_json(&r);
    assert_non_null(text);
    assert_string_equal(text, "{\"path\":\"/ck/run/step3\",\"step\":3,\"global_samples\":12,"
                              "\"pending_backwards\":0}");
    free(text);
    r.op = OP_LOAD_WEIGHTS;
    text = serve_save_result_json(&r);
    assert_string_equal(text, "{\"path\":\"/ck/run/step3\",\"step\":3}");
    free(text);

    /* Tinker's: save_weights_for_sampler without a name, through the queue.
     * The job finishes with its typed result; the future keeps it typed, with
     * the tinker:// name and the sampling session it opened; the poll's
     * encoding is the SDK's JSON. */
    server *s = server_();
    char dir[] = "/tmp/zdp-test-save-XXXXXX";
    assert_non_null(mkdtemp(dir));
    s->opt.checkpoint_dir = dir;
    json_t *body = json_pack("{s:s,s:i}", "model_id", MODEL_ID, "seq_id", 1);
    tinker_ticket tk;
    verr e = {0};
    assert_int_equal(tinker_submit(s, "save_weights_for_sampler", body, NULL, false, &tk, &e), 200);
    json_decref(body);
    job *j = s->head;
    assert_non_null(j);
    assert_int_equal(j->op, OP_SAVE_WEIGHTS);
    s->head = s->tail = NULL;
    serve_save_result done = {.op = j->op, .path = (char *)j->payload, .step = 7};
    j->saved = serve_save_result_copy(&done);
    assert_non_null(j->saved);
    pthread_mutex_lock(&s->mu);
    j->status = 200;
    tinker_finish_locked(s, j);
    pthread_mutex_unlock(&s->mu);
    future *f = future_(s, atoi(tk.id + 4));
    assert_non_null(f);
    assert_true(f->done);
    assert_null(f->result);
    assert_non_null(f->saved);
    text = tinker_save_result_json(f->saved);
    assert_non_null(text);
    assert_string_equal(text, "{\"path\":\"tinker://" MODEL_ID "/sampler_weights/sampler-1\",\"type\":"
                              "\"save_weights_for_sampler\",\"sampling_session_id\":\"" MODEL_ID ":sample:1\"}");
    free(text);
    /* The same typed result, the plain API's way. */
    text = serve_save_result_json(f->saved);
    assert_non_null(strstr(text, "sampler_weights/sampler-1.safetensors\",\"step\":7}"));
    free(text);
    /* A copy owns its strings (a poll encodes it outside the lock). */
    serve_save_result *c = serve_save_result_copy(f->saved);
    assert_non_null(c);
    assert_true(c->name != f->saved->name && !strcmp(c->session, f->saved->session) && c->step == 7);
    serve_save_result_free(c);
    /* The sampling session names the written file. */
    assert_non_null(s->tinker->samplers);
    assert_string_equal(s->tinker->samplers->path, f->saved->path);
    serve_fx_free_(s);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/* The session counter in --checkpoint-dir (tinker/runs.c): restored at
 * start-up, advanced and written before a number is handed out, so a new
 * server on the same folder never repeats a session (and so run) id; a
 * file that is not one integer stops start-up naming it. */
static void test_session_counter(void **state) {
    (void)state;
    char root[] = "/tmp/zdp-serve-counter-XXXXXX", file[128], why[512];
    assert_non_null(mkdtemp(root));
    snprintf(file, sizeof file, "%s/.zdp-sessions", root);
    server *s = server_();
    s->ckpt_root = root;
    assert_true(tinker_runs_restore(s, why, sizeof why)); /* no file yet: from 0 */
    int64_t n = 0;
    assert_true(tinker_runs_next_session(s, &n, why, sizeof why));
    assert_int_equal(n, 1);
    assert_true(tinker_runs_next_session(s, &n, why, sizeof why));
    assert_int_equal(n, 2);
    serve_fx_free_(s);

    s = server_(); /* a restart */
    s->ckpt_root = root;
    assert_true(tinker_runs_restore(s, why, sizeof why));
    assert_true(tinker_runs_next_session(s, &n, why, sizeof why));
    assert_int_equal(n, 3);
    serve_fx_free_(s);

    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fputs("3 junk\n", f);
    fclose(f);
    s = server_();
    s->ckpt_root = root;
    assert_false(tinker_runs_restore(s, why, sizeof why));
    assert_non_null(strstr(why, ".zdp-sessions must hold one integer"));
    serve_fx_free_(s);
    remove(file);
    rmdir(root);
}

/* ---- retrieve_futures and cancel_future (newer SDKs) ----------------------------- */

/* An asample of sampling session sess as asample_ leaves it: a sample
 * future (reported to the poll of clone) and its job on the FIFO. */
static future *sample_future_(server *s, const char *sess, int64_t clone, job **out) {
    future *f = tinker_new_future(s->tinker, NULL, "", 0);
    assert_non_null(f);
    f->sample = true;
    snprintf(f->sess, sizeof f->sess, "%s", sess);
    f->clone = clone;
    job *j = calloc(1, sizeof *j);
    assert_non_null(j);
    j->op = OP_SAMPLE_FILE;
    j->fut = f;
    serve_enqueue_locked(s, j);
    *out = j;
    return f;
}

/* A job that ran to its SampleResponse (one sequence, one token). */
static void sample_done_(job *j) {
    static int64_t off[2] = {0, 1};
    static int32_t tok[1] = {3};
    static float lp[1] = {-0.5f};
    static bool stopped[1] = {false};
    serve_sample_result r = {.n = 1, .off = off, .tokens = tok, .logprobs = lp, .stopped = stopped,
                             .prompt_length = -1};
    j->sample = serve_sample_result_copy(&r);
    assert_non_null(j->sample);
    j->status = 200;
}

/* The request_ids and states of a poll's completions, "zdp-1:finished zdp-2:failed". */
static void completions_(json_t *done, char *out, size_t cap) {
    size_t n = 0;
    out[0] = '\0';
    for (size_t k = 0; k < json_array_size(done); k++) {
        const json_t *c = json_array_get(done, k);
        n += (size_t)snprintf(out + n, cap - n, "%s%s:%s", n ? " " : "",
                              json_string_value(json_object_get(c, "request_id")),
                              json_string_value(json_object_get(c, "state")));
    }
    json_decref(done);
}

/* retrieve_futures: a session's done samples are reported once past the
 * cursor, finished or failed, to the poll of their own clone only; a
 * pending one is not.  cancel_future: a queued sample leaves the FIFO and
 * never runs; a running one's result is dropped when it finishes; both
 * futures fail with "cancelled", and the poll reports them failed; a done
 * one, an unknown id and a training future are told apart. */
static void test_futures_poll_and_cancel(void **state) {
    (void)state;
    server *s = server_();
    tinker_state *t = s->tinker;
    char got[512];
    int64_t cursor = -1;
    job *j1, *j2, *j3, *j4;
    pthread_mutex_lock(&s->mu);
    future *f1 = sample_future_(s, "s1:sample:0", 0, &j1);
    future *f2 = sample_future_(s, "s1:sample:0", 1, &j2); /* a clone's (seq_id >= 1e9) */
    future *f3 = sample_future_(s, "s1:sample:0", 0, &j3);
    future *f4 = sample_future_(s, "s1:sample:0", 0, &j4);
    /* Nothing done yet: nothing to report, the cursor stays. */
    completions_(tinker_completions_locked(t, "s1:sample:0", 0, 0, &cursor), got, sizeof got);
    assert_string_equal(got, "");
    assert_int_equal(cursor, 0);

    /* j1 and j2 run (the leader loop pops them), j1 finished, j2 failed. */
    s->head = j3;
    sample_done_(j1);
    tinker_finish_locked(s, j1);
    j2->status = 400;
    snprintf(j2->err_msg, sizeof j2->err_msg, "sampling_params.max_tokens: too many");
    tinker_finish_locked(s, j2);
    completions_(tinker_completions_locked(t, "s1:sample:0", 0, 0, &cursor), got, sizeof got);
    char want[256];
    snprintf(want, sizeof want, "%s:finished", f1->id);
    assert_string_equal(got, want); /* the clone's is not the original's */
    const int64_t c1 = cursor;
    assert_true(c1 > 0);
    completions_(tinker_completions_locked(t, "s1:sample:0", 0, c1, &cursor), got, sizeof got);
    assert_string_equal(got, ""); /* seen: not again */
    assert_int_equal(cursor, c1);
    completions_(tinker_completions_locked(t, "s1:sample:0", 1, 0, &cursor), got, sizeof got);
    snprintf(want, sizeof want, "%s:failed", f2->id);
    assert_string_equal(got, want);
    completions_(tinker_completions_locked(t, "s2:sample:0", 0, 0, &cursor), got, sizeof got);
    assert_string_equal(got, ""); /* another session's poll */

    /* Cancel: f3 is queued (never runs), f4 is running. */
    verr e = {0};
    assert_string_equal(tinker_cancel_locked(s, f3->id, &e), "cancelled");
    assert_ptr_equal(s->head, j4); /* j3 left the FIFO (and was freed) */
    s->head = s->tail = NULL;      /* j4 runs */
    assert_string_equal(tinker_cancel_locked(s, f4->id, &e), "dropped");
    assert_true(f3->done && f4->done);
    assert_non_null(strstr(f3->result, "cancelled by cancel_future"));
    sample_done_(j4); /* j4 finishes after the cancel: its result is dropped */
    tinker_finish_locked(s, j4);
    assert_null(f4->samp);
    assert_non_null(strstr(f4->result, "cancelled by cancel_future"));
    completions_(tinker_completions_locked(t, "s1:sample:0", 0, c1, &cursor), got, sizeof got);
    assert_non_null(strstr(got, ":failed"));
    snprintf(want, sizeof want, "%s:failed", f3->id);
    assert_non_null(strstr(got, want));
    snprintf(want, sizeof want, "%s:failed", f4->id);
    assert_non_null(strstr(got, want));
    assert_true(cursor > c1);

    /* Done already: nothing changes.  Unknown: 404.  A training future: 400. */
    assert_string_equal(tinker_cancel_locked(s, f1->id, &e), "done");
    assert_non_null(f1->samp);
    assert_null(tinker_cancel_locked(s, "zdp-999", &e));
    assert_int_equal(e.status, 404);
    assert_string_equal(e.field, "request_id");
    pthread_mutex_unlock(&s->mu);
    const int n = submit_(s, fwdbwd_(1, 1), NULL);
    char id[32];
    snprintf(id, sizeof id, "zdp-%d", n);
    pthread_mutex_lock(&s->mu);
    assert_null(tinker_cancel_locked(s, id, &e));
    assert_int_equal(e.status, 400);
    assert_non_null(strstr(e.msg, "only sampling requests"));
    pthread_mutex_unlock(&s->mu);
    serve_fx_free_(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_op_table),      cmocka_unit_test(test_parse_fwd),
        cmocka_unit_test(test_parse_optim),   cmocka_unit_test(test_seq_holding),
        cmocka_unit_test(test_seq_gap_expiry), cmocka_unit_test(test_retry_dedup),
        cmocka_unit_test(test_future_expiry), cmocka_unit_test(test_future_cap),
        cmocka_unit_test(test_fwd_result_encodings), cmocka_unit_test(test_sample_result_encodings),
        cmocka_unit_test(test_optim_result_json), cmocka_unit_test(test_save_result_encodings),
        cmocka_unit_test(test_proto_typed_request), cmocka_unit_test(test_session_counter),
        cmocka_unit_test(test_proto_newer_fields), cmocka_unit_test(test_futures_poll_and_cancel),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
