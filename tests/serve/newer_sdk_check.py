"""newer_sdk_check.py -- the training-request fields SDK 0.26 and later add
(docs/tinker-protocol.md §0, §1.4, §1.6), sent as those SDKs send them and
checked for what they need back.  Called by tinker_check.py with its Check,
after sdk025(), on the SDK 0.25 client's live model:

- ForwardBackwardRequest field 7 loss_fn_config_v2 (map<string,
  LossConfigValue {oneof 1 number double | 2 text string}}), written beside
  the legacy field 5 as 0.26+ write it (numbers in both, text only in v2);
  the server takes v2 when it has an entry.  A text value is refused by name.
- Datum fields 3 model_input_spans and 4 loss_fn_input_spans (repeated
  ProvenanceSpan {oneof 1 prompt_tokens | 2 sampled_tokens, each
  {1 sequence_id, 2 offset int64, 3 length int64}}): accepted, no effect.
- optim_step with AdamParams under optim_params (the SDK model's own field)
  is adam_params' update bitwise; DimuonParams ({"type": "dimuon", ...} as
  optimizer_params, the key the SDK writes for a non-Adam family) and two
  keys at once are refused by name.
- optimizer_config on create_model and load_weights: {"type": "adamw"} is
  accepted, {"type": "dimuon", "version": 1} refused naming the field, the
  value and adamw; weights_info answers optimizer_config {"type": "adamw"}.
Field numbers are from the SDK's tinker_public_pb2 descriptor.
"""
import struct

import serve_check as S
import tinker_sdk as T


def fail(msg):
    S.fail(msg)


def _v2_value(value):
    """LossConfigValue bytes: 1 number (double) or 2 text (string)."""
    if isinstance(value, str):
        return T._pb_len(2, value.encode("utf-8"))
    return T._pb_key(1, 1) + struct.pack("<d", float(value))


def _span(kind, sequence_id, offset, length):
    """ProvenanceSpan {1 prompt_tokens | 2 sampled_tokens} {1 sequence_id,
    2 offset (left out at 0, as proto3 does), 3 length}."""
    inner = T._pb_len(1, sequence_id.encode("utf-8"))
    if offset:
        inner += T._pb_key(2, 0) + T._pb_uvarint(offset)
    inner += T._pb_key(3, 0) + T._pb_uvarint(length)
    return T._pb_len(1 if kind == "prompt" else 2, inner)


def encode_newer(model_id, seq_id, data, loss_fn, loss_fn_config=None, forward_only=False, legacy=None):
    """A ForwardBackwardRequest as SDK 0.26+ write it: 1-6 as 0.25, numbers of
    loss_fn_config also in field 5 (or `legacy` there instead, to tell the two
    maps apart), every entry in field 7; each Datum carries provenance spans
    (3, 4) tiling its model input and its targets."""
    out = b""
    if model_id:
        out += T._pb_len(1, model_id.encode("utf-8"))
    if seq_id:
        out += T._pb_key(2, 0) + T._pb_uvarint(int(seq_id))
    for i, d in enumerate(data):
        body = b"".join(T._pb_len(1, T._pb_chunk(c)) for c in d["model_input"]["chunks"])
        n_targets = 0
        for name, td in d["loss_fn_inputs"].items():
            if not isinstance(td, dict):
                td = T.tensor(td)
            if name == "target_tokens":
                n_targets = len(td["data"])
            body += T._pb_len(2, T._pb_len(1, name.encode("utf-8")) + T._pb_len(2, T._pb_tensor(td)))
        n_in = sum(len(c["tokens"]) for c in d["model_input"]["chunks"])
        seq = "s9:sample:%d:0" % i
        body += T._pb_len(3, _span("prompt", seq, 0, n_in))
        body += T._pb_len(4, _span("prompt", seq, 1, 1))
        if n_targets > 1:
            body += T._pb_len(4, _span("sampled", seq, 0, n_targets - 1))
        out += T._pb_len(3, body)
    if loss_fn:
        out += T._pb_len(4, loss_fn.encode("utf-8"))
    config = loss_fn_config or {}
    numbers = legacy if legacy is not None else {k: v for k, v in config.items() if not isinstance(v, str)}
    for key, value in numbers.items():
        out += T._pb_len(5, T._pb_len(1, key.encode("utf-8")) + T._pb_key(2, 1) + struct.pack("<d", float(value)))
    if forward_only:
        out += T._pb_key(6, 0) + b"\x01"
    for key, value in config.items():
        out += T._pb_len(7, T._pb_len(1, key.encode("utf-8")) + T._pb_len(2, _v2_value(value)))
    return out


class _Newer:
    """While active, the 0.25 client's forward_backward bodies are written by
    encode_newer (with field 5 = legacy when given)."""

    def __init__(self, legacy=None):
        self.legacy = legacy

    def __enter__(self):
        self.saved = T.encode_forward_backward_request_proto
        legacy = self.legacy
        T.encode_forward_backward_request_proto = \
            lambda mid, seq, data, lf, cfg=None, fo=False: encode_newer(mid, seq, data, lf, cfg, fo, legacy)
        return self

    def __exit__(self, *exc):
        T.encode_forward_backward_request_proto = self.saved
        return False


def _refused(fn, what, needles):
    """fn() must fail, as a 400 or a user failure, naming every needle."""
    try:
        fn()
    except T.APIStatusError as e:
        msg = (e.json or {}).get("error", "") if isinstance(e.json, dict) else str(e.body)
        if e.status != 400 or not all(n in msg for n in needles):
            fail("%s: HTTP %s %r, wanted 400 naming %r" % (what, e.status, msg[:400], needles))
        return
    except T.RequestFailedError as e:
        if e.category != "user" or not all(n in str(e) for n in needles):
            fail("%s: %s failure %r, wanted one naming %r" % (what, e.category, str(e), needles))
        return
    except Exception as e:  # noqa: BLE001
        fail("%s: raised %r" % (what, e))
        return
    fail("%s: accepted, wanted a refusal naming %r" % (what, needles))


def _loss(res):
    return res["metrics"]["loss:sum"]


def loss_config_v2(check, tc):
    """v2 wins over the legacy map; both maps alone as 0.25 sent them; text refused by name."""
    # dro's beta weighs 0.5 * (logprob - sampler logprob)^2: sampler logprobs 0.5 below the model's.
    base = check.data[:2]
    check.reset()
    lp = [o["logprobs"]["data"] for o in tc.forward(base, "cross_entropy").result()["loss_fn_outputs"]]
    data = [T.datum(d["model_input"]["chunks"][0]["tokens"], d["loss_fn_inputs"]["target_tokens"]["data"],
                    logprobs=[x - 0.5 for x in q], advantages=[0.25] * len(q))
            for d, q in zip(base, lp)]
    want = _loss(tc.forward(data, "dro", {"beta": 0.5}).result())      # 0.25's field 5 only
    low = _loss(tc.forward(data, "dro", {"beta": 0.1}).result())
    if abs(want - low) < 1e-6 * max(1.0, abs(want)):
        fail("dro's beta changes nothing here (%r at 0.5 and 0.1): the v2 check would prove nothing" % want)
    with _Newer(legacy={"beta": 0.1}):
        got = _loss(tc.forward(data, "dro", {"beta": 0.5}).result())
    if abs(got - want) > 1e-6 * max(1.0, abs(want)):
        fail("loss_fn_config_v2 beta 0.5 beside legacy beta 0.1: loss:sum %r, wanted v2's %r (legacy's %r)"
             % (got, want, low))
    with _Newer():
        same = _loss(tc.forward(data, "dro", {"beta": 0.5}).result())  # as 0.26+ write it: both maps
    if abs(same - want) > 1e-6 * max(1.0, abs(want)):
        fail("loss_fn_config written to both maps with provenance spans: loss:sum %r, wanted %r" % (same, want))
    with _Newer():
        _refused(tc.forward(data, "ppo", {"clip_low_threshold": "k3"}).result, "a text value in loss_fn_config_v2",
                 ['loss_fn_config.clip_low_threshold = "k3"', "numbers"])
    if check.info()["pending_backwards"] != 0:
        fail("forward requests with loss_fn_config_v2 left %s backward passes pending"
             % check.info()["pending_backwards"])


def _optim(tc, body):
    return tc._single(T.API + "optim_step", lambda seq: dict(body, model_id=tc.model_id, seq_id=seq,
                                                             type="optim_step"),
                      "OptimStep", T.parse_optim_step_response)


def optim_params(check, tc, adam):
    """AdamParams under optim_params: adam_params' update, bitwise."""
    check.reset()
    with _Newer():
        tc.forward_backward(check.data, "cross_entropy").result()
    _optim(tc, {"optim_params": adam}).result()
    S.compare(check.ref, check.sampler_file(tc, "optim_params"), exact=True)
    dimuon = {"type": "dimuon", "learning_rate": 1e-3, "grad_clip_norm": 0.0, "beta1": 0.9}
    _refused(_optim(tc, {"optimizer_params": dimuon}).result, "optim_step with DimuonParams",
             ['optimizer_params.type = "dimuon"', '"adamw" is the one supported'])
    _refused(_optim(tc, {"adam_params": adam, "optim_params": adam}).result, "optim_step with two parameter keys",
             ["adam_params and optim_params", "send one"])


def optimizer_config(check, sc, tc):
    """weights_info names AdamW; load_weights and create_model take AdamW and refuse Dimuon by name."""
    path = "tinker://%s/weights/ck1" % check.tc.model_id
    info = sc.http.post(T.API + "weights_info", {"tinker_path": path}).json()
    if info.get("optimizer_config") != {"type": "adamw"}:
        fail("weights_info %s: optimizer_config %r, wanted {'type': 'adamw'}" % (path, info.get("optimizer_config")))
    dimuon = {"type": "dimuon", "version": 1}

    def load(oc):
        return tc._single(T.API + "load_weights",
                          lambda seq: {"model_id": tc.model_id, "path": path, "seq_id": seq, "optimizer": False,
                                       "optimizer_config": oc, "type": "load_weights"},
                          "LoadWeights", T.parse_load_weights_response)
    load({"type": "adamw"}).result()
    _refused(load(dimuon).result, "load_weights with a Dimuon optimizer_config",
             ['optimizer_config.type = "dimuon"', '"adamw" is the one supported'])

    def create(oc):
        body = {"session_id": sc.session_id, "model_seq_id": 7, "base_model": check.name,
                "lora_config": {"rank": 0}, "optimizer_config": oc, "type": "create_model"}
        return sc.http.post(T.API + "create_model", body, max_retries=0)
    _refused(lambda: create(dimuon), "create_model with a Dimuon optimizer_config",
             ['optimizer_config.type = "dimuon"', '"adamw" is the one supported'])
    _refused(lambda: create({"type": "sgd"}), "create_model with an unknown optimizer",
             ['optimizer_config.type = "sgd"', "adamw"])
    fut = create({"type": "adamw"}).json()
    if not isinstance(fut.get("request_id"), str):
        fail("create_model with optimizer_config adamw: %s, wanted a future" % fut)


def run(check, sc, tc, adam):
    loss_config_v2(check, tc)
    optim_params(check, tc, adam)
    optimizer_config(check, sc, tc)
    print("tinker_check: SDK 0.26+ training fields: loss_fn_config_v2 (wins over the legacy map), provenance "
          "spans, optim_params, optimizer_config (adamw; dimuon refused), weights_info's optimizer_config",
          flush=True)
