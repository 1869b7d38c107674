#!/usr/bin/env python3
"""serve_check.py -- drives a running `zdp serve` for tests/cli/test_serve.sh.

Standard library only (urllib, socket, struct, json).

  serve_check.py gen-data OUT_DIR             data.json, windows.json, windows.bin
  serve_check.py scenario URL OUT_DIR DATA.json [WINDOWS.json]
        splits, bad input, 409, state round trip; writes OUT_DIR/*.safetensors
        (OUT_DIR is the server's --checkpoint-dir: the paths sent are names in it)
  serve_check.py fdcheck URL DATA.json        the applied gradient is d(loss:sum)/dθ
  serve_check.py compare A.safetensors B.safetensors [--exact]

Every check that fails prints "FAIL: ..."; the exit status is the failure count
(capped at 100).
"""
import json
import os
import random
import socket
import struct
import sys
import urllib.error
import urllib.request
from array import array

FAILURES = 0
V, T = 64, 16
# A server started with --api-key-file: every request sends the key.
API_KEY = os.environ.get("ZDP_API_KEY")
SPLITS = [[9], [4, 5], [2, 6, 1], [1, 2, 1, 1, 2, 1, 1]]


def fail(msg):
    global FAILURES
    FAILURES += 1
    print("FAIL: " + msg, flush=True)


def datum(tokens, targets, weights=None, tensor=False):
    lfi = {"target_tokens": targets}
    if tensor:
        lfi["target_tokens"] = {"data": targets, "dtype": "int64", "shape": [len(targets)]}
    if weights is not None:
        lfi["weights"] = {"data": weights, "dtype": "float32", "shape": [len(weights)]}
    return {"model_input": {"chunks": [{"type": "encoded_text", "tokens": tokens}]},
            "loss_fn_inputs": lfi}


# ---- HTTP ----------------------------------------------------------------------

def req(url, method, path, body=None, raw=None, headers=None):
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    h = {"Content-Type": "application/json"}
    if API_KEY:
        h["X-API-Key"] = API_KEY
    h.update(headers or {})
    h = {k: v for k, v in h.items() if v is not None}  # None: leave the header out
    r = urllib.request.Request(url + path, data=data, method=method, headers=h)
    try:
        with urllib.request.urlopen(r, timeout=60) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as e:
        text = e.read()
        try:
            return e.code, json.loads(text)
        except ValueError:
            return e.code, {"raw": text.decode(errors="replace")}


def post(url, path, body):
    return req(url, "POST", path, body)


def ok(url, path, body=None, method="POST"):
    st, js = req(url, method, path, body)
    if st != 200:
        fail("%s %s -> %d %s" % (method, path, st, js))
    return js


def raw_http(url, payload):
    """Sends raw bytes on a new connection; returns the status code (0: none)."""
    host, port = url.split("//")[1].split(":")
    s = socket.create_connection((host, int(port)), timeout=30)
    try:
        s.sendall(payload)
        s.shutdown(socket.SHUT_WR)
        resp = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            resp += chunk
    except OSError:
        return 0, b""
    finally:
        s.close()
    if not resp.startswith(b"HTTP/1."):
        return 0, resp
    return int(resp.split(b" ")[1]), resp


# ---- safetensors -----------------------------------------------------------------

def read_st(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        blob = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":
            raise ValueError("%s: %s is %s, wanted F32" % (path, name, info["dtype"]))
        a, b = info["data_offsets"]
        out[name] = array("f", blob[a:b])
    return out


def compare(pa, pb, exact=False, rtol=1e-5, atol=1e-7):
    a, b = read_st(pa), read_st(pb)
    if sorted(a) != sorted(b):
        fail("%s and %s hold different tensors" % (pa, pb))
        return
    worst, where = 0.0, None
    for name in a:
        x, y = a[name], b[name]
        if len(x) != len(y):
            fail("%s: %s has %d values vs %d" % (pb, name, len(x), len(y)))
            return
        if exact:
            if x.tobytes() != y.tobytes():
                i = next(i for i in range(len(x)) if x[i] != y[i] or x[i:i+1].tobytes() != y[i:i+1].tobytes())
                fail("%s vs %s: %s[%d] = %r vs %r (wanted bitwise equal)" % (pa, pb, name, i, x[i], y[i]))
                return
            continue
        for i in range(len(x)):
            d = abs(x[i] - y[i])
            lim = atol + rtol * max(abs(x[i]), abs(y[i]))
            if d > lim and d / lim > worst:
                worst, where = d / lim, (name, i, x[i], y[i])
    if where is not None:
        fail("%s vs %s: %s[%d] = %r vs %r (%.1fx the tolerance)" % (pa, pb, *where, worst))


# ---- data ----------------------------------------------------------------------

def gen_data(out):
    rng = random.Random(7)
    lens = [16, 3, 9, 1, 12, 16, 5, 7, 14]
    data = []
    for n in lens:
        tok = [rng.randrange(V) for _ in range(n)]
        tgt = [rng.randrange(V) for _ in range(n)]
        # Odd lengths carry per-token weights (0 masks a token); the others weigh every token 1.
        w = [rng.choice([0.0, 0.5, 1.0, 2.0]) for _ in range(n)] if n % 2 else None
        data.append(datum(tok, tgt, w, tensor=n > 10))
    with open(os.path.join(out, "data.json"), "w") as f:
        json.dump(data, f)
    # 8 windows of T+1 tokens as an llm.c shard, and the same windows as datums.
    toks = [rng.randrange(V) for _ in range(8 * T + 1)]
    with open(os.path.join(out, "windows.bin"), "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(toks), *([0] * 253)))
        f.write(struct.pack("<%dH" % len(toks), *toks))
    wins = [datum(toks[w * T:w * T + T], toks[w * T + 1:w * T + T + 1]) for w in range(8)]
    with open(os.path.join(out, "windows.json"), "w") as f:
        json.dump(wins, f)


# ---- checks ---------------------------------------------------------------------

def check_fb(js, chunk, what):
    outs = js.get("loss_fn_outputs", [])
    if len(outs) != len(chunk):
        fail("%s: %d loss_fn_outputs for %d datums" % (what, len(outs), len(chunk)))
        return 0.0
    total = 0.0
    for o, d in zip(outs, chunk):
        n = sum(len(c["tokens"]) for c in d["model_input"]["chunks"])
        lp = o["logprobs"]
        if lp["dtype"] != "float32" or lp["shape"] != [n] or len(lp["data"]) != n:
            fail("%s: logprobs %s for a datum of %d tokens" % (what, lp, n))
        if any(x > 0 for x in lp["data"]):
            fail("%s: a positive logprob: %s" % (what, lp["data"]))
        w = d["loss_fn_inputs"].get("weights")
        w = w["data"] if isinstance(w, dict) else (w or [1.0] * n)
        total -= sum(wi * x for wi, x in zip(w, lp["data"]))
    ls = js["metrics"]["loss:sum"]
    if abs(ls - total) > 1e-4 * abs(total) + 1e-6:
        fail("%s: loss:sum %r but -sum(weights * logprobs) = %r" % (what, ls, total))
    return ls


def fwd_bwd(url, chunk, what):
    st, js = post(url, "/forward_backward", {"data": chunk, "loss_fn": "cross_entropy"})
    if st != 200:
        fail("%s: forward_backward -> %d %s" % (what, st, js))
        return 0.0
    return check_fb(js, chunk, what)


def counters(url):
    st, js = req(url, "GET", "/info")
    if st != 200:
        fail("GET /info -> %d" % st)
        return None
    return {k: js[k] for k in ("step", "global_samples", "micro_steps", "pending_backwards",
                                 "skipped_steps", "lr")}


def bad_requests(url, data, big):
    """(description, method, path, body dict or raw bytes, wanted status, field substring)."""
    good = data[0]
    toolong = datum(list(range(T + 1)), list(range(T + 1)))
    return [
        ("malformed JSON", "POST", "/forward_backward", b'{"data": [', 400, "body"),
        ("not an object", "POST", "/forward_backward", b'[1, 2]', 400, "body"),
        ("data not an array", "POST", "/forward_backward", {"data": "x", "loss_fn": "cross_entropy"}, 400, "data"),
        ("empty data", "POST", "/forward_backward", {"data": [], "loss_fn": "cross_entropy"}, 400, "data"),
        ("unknown top-level field", "POST", "/forward_backward",
         {"data": [good], "loss_fn": "cross_entropy", "bogus": 1}, 400, "bogus"),
        ("unknown loss_fn_inputs key", "POST", "/forward_backward",
         {"data": [datum([1, 2], [2, 3]) | {"loss_fn_inputs": {"target_tokens": [2, 3], "mask": [1, 1]}}],
          "loss_fn": "cross_entropy"}, 400, "data[0].loss_fn_inputs.mask"),
        ("unknown loss", "POST", "/forward_backward", {"data": [good], "loss_fn": "kl"}, 400, "loss_fn"),
        # A message cut inside a UTF-8 character must still be a 400, not a 500.
        ("long non-ASCII key", "POST", "/forward_backward",
         {"data": [datum([1, 2], [2, 3]) | {"loss_fn_inputs": {"target_tokens": [2, 3], "x" + "\u00e9" * 700: [1, 1]}}],
          "loss_fn": "cross_entropy"}, 400, "data[0].loss_fn_inputs."),
        ("ppo without its inputs", "POST", "/forward_backward", {"data": [good], "loss_fn": "ppo"}, 400,
         "data[0].loss_fn_inputs."),
        ("dro without beta", "POST", "/forward_backward",
         {"data": [datum([1, 2], [2, 3]) | {"loss_fn_inputs": {
             "target_tokens": [2, 3], "logprobs": [-1.0, -2.0], "advantages": [1.0, -1.0]}}],
          "loss_fn": "dro"}, 400, "loss_fn_config"),
        ("advantage out of range", "POST", "/forward_backward",
         {"data": [datum([1, 2], [2, 3]) | {"loss_fn_inputs": {
             "target_tokens": [2, 3], "logprobs": [-1.0, -2.0], "advantages": [1.0, 1e30]}}],
          "loss_fn": "importance_sampling"}, 400, "data[0].loss_fn_inputs.advantages[1]"),
        ("eps = 0", "POST", "/optim_step", {"adam_params": {"eps": 0}}, 400, "adam_params.eps"),
        ("missing loss_fn", "POST", "/forward_backward", {"data": [good]}, 400, "loss_fn"),
        ("token outside vocab (last datum)", "POST", "/forward_backward",
         {"data": [good, good, datum([1, V, 2], [1, 2, 3])], "loss_fn": "cross_entropy"}, 400,
         "data[2].model_input.chunks[0].tokens[1]"),
        ("negative token", "POST", "/forward", {"data": [datum([-1], [1])]}, 400,
         "data[0].model_input.chunks[0].tokens[0]"),
        ("float token", "POST", "/forward_backward",
         {"data": [datum([1.5, 2], [1, 2])], "loss_fn": "cross_entropy"}, 400, "tokens[0]"),
        ("target outside vocab (TensorData)", "POST", "/forward_backward",
         {"data": [datum([1, 2], [3, 999], tensor=True)], "loss_fn": "cross_entropy"}, 400,
         "data[0].loss_fn_inputs.target_tokens.data[1]"),
        ("sequence longer than block_size", "POST", "/forward_backward",
         {"data": [good, toolong], "loss_fn": "cross_entropy"}, 400, "data[1].model_input"),
        ("target/input length mismatch", "POST", "/forward_backward",
         {"data": [datum([1, 2, 3], [1, 2])], "loss_fn": "cross_entropy"}, 400,
         "data[0].loss_fn_inputs.target_tokens"),
        ("weights length mismatch", "POST", "/forward_backward",
         {"data": [datum([1, 2, 3], [1, 2, 3], [1.0, 1.0])], "loss_fn": "cross_entropy"}, 400,
         "data[0].loss_fn_inputs.weights"),
        ("weight outside float32", "POST", "/forward_backward",
         {"data": [good, datum([1, 2], [1, 2], [1e39, 1.0])], "loss_fn": "cross_entropy"}, 400,
         "data[1].loss_fn_inputs.weights.data[0]"),
        ("bad TensorData shape", "POST", "/forward_backward",
         {"data": [datum([1, 2], [1, 2]) | {"loss_fn_inputs": {"target_tokens":
                                                                 {"data": [1, 2], "dtype": "int64", "shape": [1, 2]}}}],
          "loss_fn": "cross_entropy"}, 400, "target_tokens.shape"),
        ("image chunk", "POST", "/forward_backward",
         {"data": [{"model_input": {"chunks": [{"type": "image", "data": "", "format": "png"}]},
                    "loss_fn_inputs": {"target_tokens": []}}], "loss_fn": "cross_entropy"}, 400,
         "chunks[0].type"),
        ("adam_params wrong type", "POST", "/optim_step", {"adam_params": {"learning_rate": "x"}}, 400,
         "adam_params.learning_rate"),
        ("adam_params unknown key", "POST", "/optim_step", {"adam_params": {"lr": 1e-3}}, 400,
         "adam_params.lr"),
        ("save_weights without path", "POST", "/save_weights", {}, 400, "path"),
        ("save_weights path wrong type", "POST", "/save_weights", {"path": 3}, 400, "path"),
        ("load_state of a missing checkpoint", "POST", "/load_state", {"path": "nonexistent/ckpt"}, 400,
         "path"),
        # Paths are names inside the server's checkpoint folder.
        ("save_weights to an absolute path", "POST", "/save_weights", {"path": "/tmp/zdp-escape.safetensors"},
         400, "path"),
        ("save_state with ..", "POST", "/save_state", {"path": "../escape/s0"}, 400, "path"),
        ("load_state of an absolute path", "POST", "/load_state", {"path": "/nonexistent/zdp/ckpt"}, 400,
         "path"),
        ("unknown path", "POST", "/train", {}, 404, "url"),
        ("wrong method", "GET", "/optim_step", None, 405, "method"),
        ("oversized body", "POST", "/forward_backward", b'{"data": [' + b' ' * big + b']}', 413, "body"),
    ]


def run_bad(url, cases):
    for what, method, path, body, want, field in cases:
        if isinstance(body, bytes):
            st, js = req(url, method, path, raw=body)
        else:
            st, js = req(url, method, path, body)
        err = js.get("error", {}) if isinstance(js, dict) else {}
        if st != want:
            fail("bad input '%s': HTTP %d, wanted %d: %s" % (what, st, want, js))
        elif field not in (err.get("field") or "") or not err.get("message"):
            fail("bad input '%s': error %s does not name the field %s" % (what, err, field))


def auth_header():
    return ("X-API-Key: %s\r\n" % API_KEY) if API_KEY else ""


def disconnect_mid_request(url, data, big):
    body = json.dumps({"data": data, "loss_fn": "cross_entropy"}).encode()
    host = url.split("//")[1]
    head = ("POST /forward_backward HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n%s"
            "Content-Length: %d\r\n\r\n" % (host, auth_header(), len(body))).encode()
    raw_http(url, head + body[: len(body) // 2])  # half the body, then close
    # A chunked body over --max-body (no Content-Length to refuse it early).
    chunk = b' ' * 60000
    n = big // len(chunk) + 2
    payload = (("POST /forward_backward HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n%s"
                "Transfer-Encoding: chunked\r\n\r\n" % (host, auth_header())).encode() +
               (b"%x\r\n" % len(chunk) + chunk + b"\r\n") * n + b"0\r\n\r\n")
    st, resp = raw_http(url, payload)
    if st != 413:
        fail("chunked body over --max-body: HTTP %d, wanted 413: %r" % (st, resp[:200]))


def scenario(url, out, data, windows, big):
    # Idle: nothing running on the ranks, nothing queued.
    if req(url, "GET", "/healthz") != (200, {"status": "ok", "running": None, "queued": 0}):
        fail("GET /healthz: %s" % (req(url, "GET", "/healthz"),))
    s0 = "ckpt/s0"  # a name inside the server's --checkpoint-dir (OUT_DIR)
    ok(url, "/save_state", {"path": s0})
    c0 = counters(url)
    st, js = post(url, "/optim_step", {})
    if st != 409 or "error" not in js:
        fail("optim_step with no forward_backward: HTTP %d %s, wanted 409" % (st, js))
    if counters(url) != c0:
        fail("a refused optim_step changed the counters: %s -> %s" % (c0, counters(url)))

    full_loss = None
    for k, split in enumerate(SPLITS):
        ok(url, "/load_state", {"path": s0})
        pos, loss = 0, 0.0
        for n in split:
            loss += fwd_bwd(url, data[pos:pos + n], "split %s" % split)
            pos += n
        if full_loss is None:
            full_loss = loss
        elif abs(loss - full_loss) > 1e-5 * abs(full_loss):
            fail("split %s: total loss:sum %r, one request gave %r" % (split, loss, full_loss))
        # The engine is SGD: of adam_params only learning_rate and weight_decay
        # act; these are the config's values, so {} below means the same.
        js = ok(url, "/optim_step", {"adam_params": {"learning_rate": 0.05, "beta1": 0.9, "beta2": 0.95,
                                                      "eps": 1e-12, "weight_decay": 0.0}})
        if js.get("step") != 1 or not js.get("step_applied"):
            fail("split %s: optim_step answered %s" % (split, js))
        ok(url, "/save_weights", {"path": "split%d.safetensors" % k})

    # The 3-request split again, with every kind of bad input in between.
    ok(url, "/load_state", {"path": s0})
    before = counters(url)
    cases = bad_requests(url, data, big)
    run_bad(url, cases)
    disconnect_mid_request(url, data[:2], big)
    if counters(url) != before:
        fail("bad requests changed the counters: %s -> %s" % (before, counters(url)))
    fwd_bwd(url, data[0:2], "with bad input")
    mid = counters(url)
    run_bad(url, cases)
    st, js = post(url, "/forward", {"data": data})  # no gradient
    if st != 200:
        fail("forward -> %d %s" % (st, js))
    else:
        check_fb(js, data, "forward")
    if counters(url) != mid:
        fail("bad requests or /forward changed the counters: %s -> %s" % (mid, counters(url)))
    fwd_bwd(url, data[2:8], "with bad input")
    disconnect_mid_request(url, data[:3], big)
    fwd_bwd(url, data[8:9], "with bad input")
    ok(url, "/optim_step", {})
    ok(url, "/save_weights", {"path": "bad.safetensors"})
    compare(os.path.join(out, "split2.safetensors"), os.path.join(out, "bad.safetensors"), exact=True)
    for k in range(1, len(SPLITS)):
        compare(os.path.join(out, "split0.safetensors"), os.path.join(out, "split%d.safetensors" % k))

    # Mid-window state: save with gradients pending, step, reload, step again.
    ok(url, "/load_state", {"path": s0})
    fwd_bwd(url, data[:4], "mid-window")
    ok(url, "/save_state", {"path": "ckpt/mid"})
    fwd_bwd(url, data[4:], "mid-window")
    ok(url, "/optim_step", {})
    ok(url, "/save_weights", {"path": "mid_a.safetensors"})
    ok(url, "/load_state", {"path": "ckpt/mid"})
    if counters(url)["pending_backwards"] == 0:
        fail("a mid-window checkpoint came back with no pending backwards")
    fwd_bwd(url, data[4:], "mid-window")
    ok(url, "/optim_step", {})
    ok(url, "/save_weights", {"path": "mid_b.safetensors"})
    compare(os.path.join(out, "mid_a.safetensors"), os.path.join(out, "mid_b.safetensors"), exact=True)

    if windows is not None:
        ok(url, "/load_state", {"path": s0})
        fwd_bwd(url, windows, "windows")
        ok(url, "/optim_step", {})
        ok(url, "/save_weights", {"path": "windows.safetensors"})


def sample_check(url):
    """POST /sample: greedy is deterministic, the length is max_tokens, tokens are in the
    vocabulary, the counters do not move, bad input is a 400 naming the field."""
    before = counters(url)
    body = {"prompt": [1, 2, 3], "max_tokens": 5, "temperature": 0}
    a, b = ok(url, "/sample", body), ok(url, "/sample", body)
    ta, tb = a["sequences"][0]["tokens"], b["sequences"][0]["tokens"]
    if ta != tb or len(ta) != 5 or any(not 0 <= t < V for t in ta):
        fail("sample: greedy tokens %s and %s" % (ta, tb))
    c = ok(url, "/sample", {"prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2, 3]}]},
                            "max_tokens": 13, "temperature": 1.0, "top_k": 5, "seed": 9})
    d = ok(url, "/sample", {"prompt": [1, 2, 3], "max_tokens": 13, "temperature": 1.0, "top_k": 5,
                            "seed": 9})
    if c["sequences"][0]["tokens"] != d["sequences"][0]["tokens"] or len(d["sequences"][0]["tokens"]) != 13:
        fail("sample: the same seed gave %s and %s" % (c, d))
    if counters(url) != before:
        fail("sample changed the counters: %s -> %s" % (before, counters(url)))
    run_bad(url, [
        ("sample token outside the vocabulary", "POST", "/sample", {"prompt": [1, V]}, 400, "prompt[1]"),
        ("sample negative temperature", "POST", "/sample", {"prompt": [1], "temperature": -1}, 400,
         "temperature"),
        ("sample empty prompt", "POST", "/sample", {"prompt": []}, 400, "prompt"),
        # The prompt and max_tokens must fit the context (block_size 16): the KV cache holds them.
        ("sample max_tokens beyond the context", "POST", "/sample", {"prompt": [1, 2, 3], "max_tokens": 14},
         400, "max_tokens"),
        ("sample prompt longer than the context", "POST", "/sample", {"prompt": [1] * 17, "max_tokens": 0},
         400, "prompt"),
        ("sample unknown field", "POST", "/sample", {"prompt": [1], "n": 2}, 400, "n"),
    ])


def fdcheck(url, data):
    """SGD: one step moves θ by -lr*g, so loss:sum drops by lr*|g|^2 to first
    order, where |g| is the norm the step reports.  A gradient scaled by c
    would give c*|∇L| as the norm and a drop of lr*|g|^2/c."""
    lr = req(url, "GET", "/info")[1]["optimizer"]["lr"]
    l0 = post(url, "/forward", {"data": data})[1]["metrics"]["loss:sum"]
    fwd_bwd(url, data, "fdcheck")
    g = ok(url, "/optim_step", {})["metrics"]["grad_norm:mean"]
    l1 = post(url, "/forward", {"data": data})[1]["metrics"]["loss:sum"]
    want = lr * g * g
    print("fdcheck: loss %.6f -> %.6f, drop %.6g, lr*|g|^2 = %.6g" % (l0, l1, l0 - l1, want))
    if abs((l0 - l1) - want) > 0.05 * want:
        fail("fdcheck: the loss dropped by %g, a gradient of the summed loss predicts %g" % (l0 - l1, want))
    # adam_params.learning_rate is applied (to SGD too): twice the lr, twice the drop.
    fwd_bwd(url, data, "fdcheck lr")
    g = ok(url, "/optim_step", {"adam_params": {"learning_rate": 2 * lr}})["metrics"]["grad_norm:mean"]
    l2 = post(url, "/forward", {"data": data})[1]["metrics"]["loss:sum"]
    want = 2 * lr * g * g
    print("fdcheck: learning_rate %g: loss %.6f -> %.6f, drop %.6g, lr*|g|^2 = %.6g" % (2 * lr, l1, l2, l1 - l2, want))
    if abs((l1 - l2) - want) > 0.05 * want:
        fail("fdcheck: with adam_params.learning_rate = %g the loss dropped by %g, wanted %g" % (2 * lr, l1 - l2, want))
    # Server-side timing counts every request this fresh server ran.
    reqs = req(url, "GET", "/info")[1]["requests"]
    counts = {k: v["count"] for k, v in reqs.items()}
    if counts != {"info": 1, "forward": 3, "forward_backward": 2, "optim_step": 2}:
        fail("fdcheck: /info requests counts %s, wanted info 1, forward 3, forward_backward 2, optim_step 2" % counts)
    if any(not (v["mean_exec_ms"] > 0 and v["max_exec_ms"] >= v["mean_exec_ms"]) for v in reqs.values()):
        fail("fdcheck: /info requests timing %s" % reqs)


def main(argv):
    cmd = argv[1]
    if cmd == "gen-data":
        gen_data(argv[2])
    elif cmd == "scenario":
        url, out = argv[2], argv[3]
        data = json.load(open(argv[4]))
        windows = json.load(open(argv[5])) if len(argv) > 5 and argv[5] else None
        big = int(argv[6]) if len(argv) > 6 else 100000
        scenario(url, out, data, windows, big)
    elif cmd == "fdcheck":
        fdcheck(argv[2], json.load(open(argv[3])))
        sample_check(argv[2])
    elif cmd == "compare":
        compare(argv[2], argv[3], exact="--exact" in argv)
    else:
        print(__doc__)
        return 2
    return min(FAILURES, 100)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
