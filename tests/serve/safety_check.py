#!/usr/bin/env python3
"""safety_check.py -- drives a running `zdp serve` for tests/cli/test_serve_safety.sh:
what a hostile client, or a web page in the user's browser, may try.

Standard library only.

  safety_check.py paths URL CKPT_DIR OUTSIDE_DIR ALLOWED_DIR
        paths are names inside --checkpoint-dir: absolute paths, "..", and
        symbolic links that leave it are a 400 naming "path" and write nothing;
        load_state's error is the same whether a path outside exists or not;
        an absolute path inside --allow-path-root works
  safety_check.py guards URL
        a foreign Host or Origin is a 403, a POST that is not application/json
        a 415 (text/plain, form, none, protobuf on a plain endpoint), and none
        of them changes anything
  safety_check.py apikey URL KEY
        --api-key-file: no key, a wrong key, a prefix of the key: 401; X-API-Key
        and Authorization: Bearer work; GET /healthz needs no key
  safety_check.py optim URL
        a refused optim_step (409) leaves the hyperparameters and the weights as
        they were; adam_params beyond the finite bounds are a 400
  safety_check.py integers URL [CKPT_DIR OUTSIDE_DIR]
        seq_id = INT64_MAX and 2^53 are a 400 naming seq_id (seq_id + 1 cannot
        overflow) and the model's order is intact; Tinker saves and loads
        through a link out of --checkpoint-dir fail; a Content-Length past
        INT64_MAX is a 413

Every check that fails prints "FAIL: ..."; the exit status is the failure count.
"""
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_check as S  # noqa: E402

fail = S.fail


def expect(what, got, status, field):
    st, js = got
    err = js.get("error") if isinstance(js, dict) else None
    if isinstance(err, dict):  # plain endpoints: {"error": {"message", "field"}}
        msg, fld = err.get("message"), err.get("field")
    else:  # /api/v1: {"error": message, "category", "field"}
        msg, fld = err, js.get("field") if isinstance(js, dict) else None
    if st != status:
        fail("%s: HTTP %d, wanted %d: %s" % (what, st, status, js))
    elif field is not None and (fld != field or not msg):
        fail("%s: error %s does not name the field %s" % (what, js, field))
    return msg or ""


def counters(url):
    return S.counters(url)


def fwd_bwd(url):
    S.ok(url, "/forward_backward", {"data": [S.datum([1, 2, 3], [2, 3, 4])], "loss_fn": "cross_entropy"})


# ---- paths ---------------------------------------------------------------------------

def paths(url, ck, outside, allowed):
    os.makedirs(outside, exist_ok=True)
    os.makedirs(os.path.join(outside, "real_ckpt"), exist_ok=True)
    before = counters(url)
    target = os.path.join(outside, "escaped.safetensors")
    expect("save_weights to an absolute path outside",
           S.post(url, "/save_weights", {"path": target}), 400, "path")
    expect("save_state to an absolute path outside",
           S.post(url, "/save_state", {"path": os.path.join(outside, "s0")}), 400, "path")
    expect("save_weights with ..", S.post(url, "/save_weights", {"path": "../escaped.safetensors"}), 400, "path")
    expect("save_state with .. in the middle", S.post(url, "/save_state", {"path": "a/../../s0"}), 400, "path")
    expect("save_weights of .", S.post(url, "/save_weights", {"path": "."}), 400, "path")
    # A link inside the folder that points outside: refused, followed or not.
    os.symlink(outside, os.path.join(ck, "link"))
    os.symlink(target, os.path.join(ck, "dangling.safetensors"))
    expect("save_weights through a symlink to outside",
           S.post(url, "/save_weights", {"path": "link/escaped.safetensors"}), 400, "path")
    expect("save_state through a symlink to outside", S.post(url, "/save_state", {"path": "link/s0"}), 400, "path")
    expect("save_weights onto a dangling symlink to outside",
           S.post(url, "/save_weights", {"path": "dangling.safetensors"}), 400, "path")
    for name in os.listdir(outside):
        if name != "real_ckpt":
            fail("a refused path wrote %s outside the checkpoint folder" % os.path.join(outside, name))
    # load_state's answer must not tell whether a path outside exists.
    m1 = expect("load_state of an existing folder outside",
                S.post(url, "/load_state", {"path": os.path.join(outside, "real_ckpt")}), 400, "path")
    m2 = expect("load_state of a missing folder outside",
                S.post(url, "/load_state", {"path": os.path.join(outside, "nothing")}), 400, "path")
    if m1.replace("real_ckpt", "X") != m2.replace("nothing", "X"):
        fail("load_state outside: the answers differ (they reveal what exists): %r vs %r" % (m1, m2))
    m3 = expect("load_state of an existing folder through a symlink",
                S.post(url, "/load_state", {"path": "link/real_ckpt"}), 400, "path")
    m4 = expect("load_state of a missing folder through a symlink",
                S.post(url, "/load_state", {"path": "link/nothing"}), 400, "path")
    if m3.replace("real_ckpt", "X") != m4.replace("nothing", "X"):
        fail("load_state through a link: the answers differ: %r vs %r" % (m3, m4))
    if counters(url) != before:
        fail("refused paths changed the counters: %s -> %s" % (before, counters(url)))
    # Names inside the folder work, and land there.
    S.ok(url, "/save_state", {"path": "runs/s0"})
    S.ok(url, "/save_weights", {"path": "w0.safetensors"})
    for p in ("runs/s0", "w0.safetensors"):
        if not os.path.exists(os.path.join(ck, p)):
            fail("%s was not written inside the checkpoint folder %s" % (p, ck))
    S.ok(url, "/load_state", {"path": "runs/s0"})
    # --allow-path-root: absolute paths inside it work; a link in it that leaves it does not.
    a = os.path.join(allowed, "a.safetensors")
    js = S.ok(url, "/save_weights", {"path": a})
    if not os.path.exists(a):
        fail("save_weights inside --allow-path-root did not write %s (%s)" % (a, js))
    S.ok(url, "/save_state", {"path": os.path.join(allowed, "ck", "s1")})
    S.ok(url, "/load_state", {"path": os.path.join(allowed, "ck", "s1")})
    os.symlink(outside, os.path.join(allowed, "out"))
    expect("save_weights through a symlink out of --allow-path-root",
           S.post(url, "/save_weights", {"path": os.path.join(allowed, "out", "x.safetensors")}), 400, "path")
    expect("absolute path beside --allow-path-root",
           S.post(url, "/save_weights", {"path": allowed + "-sibling/x.safetensors"}), 400, "path")
    if os.path.exists(os.path.join(outside, "x.safetensors")) or os.path.exists(allowed + "-sibling"):
        fail("a refused path under --allow-path-root wrote outside it")


# ---- Host, Origin, Content-Type --------------------------------------------------------

def guards(url):
    port = url.rsplit(":", 1)[1]
    fwd_bwd(url)  # one backward pending: a refused optim_step must not apply it
    before = counters(url)
    step = {"adam_params": {"learning_rate": 0.001}}
    expect("a foreign Host (DNS rebinding)", S.req(url, "GET", "/info", headers={"Host": "evil.example:" + port}),
           403, "Host")
    expect("a foreign Host on a POST", S.req(url, "POST", "/optim_step", step,
                                             headers={"Host": "evil.example:" + port}), 403, "Host")
    expect("the right address on another port", S.req(url, "GET", "/info", headers={"Host": "127.0.0.1:1"}),
           403, "Host")
    expect("a foreign Origin", S.req(url, "POST", "/optim_step", step, headers={"Origin": "http://evil.example"}),
           403, "Origin")
    expect("Origin null", S.req(url, "POST", "/optim_step", step, headers={"Origin": "null"}), 403, "Origin")
    expect("a localhost page on another port",
           S.req(url, "POST", "/optim_step", step, headers={"Origin": "http://localhost:1"}), 403, "Origin")
    expect("a text/plain POST (a form or fetch from a page)",
           S.req(url, "POST", "/optim_step", step, headers={"Content-Type": "text/plain"}), 415, "Content-Type")
    expect("a form POST", S.req(url, "POST", "/optim_step", step,
                                headers={"Content-Type": "application/x-www-form-urlencoded"}), 415, "Content-Type")
    # (urllib would add a form Content-Type: raw bytes.)
    st, resp = S.raw_http(url, ("POST /optim_step HTTP/1.1\r\nHost: 127.0.0.1:%s\r\n%sContent-Length: 2\r\n"
                                "Connection: close\r\n\r\n{}" % (port, S.auth_header())).encode())
    if st != 415 or b'"Content-Type"' not in resp:
        fail("a POST without Content-Type: HTTP %d, wanted 415 naming Content-Type: %r" % (st, resp[-300:]))
    expect("a Content-Type list", S.req(url, "POST", "/optim_step", step,
                                        headers={"Content-Type": "text/plain, application/json"}), 415, "Content-Type")
    expect("protobuf to a plain endpoint", S.req(url, "POST", "/optim_step", step,
                                                 headers={"Content-Type": "application/x-protobuf"}), 415,
           "Content-Type")
    expect("a text/plain Tinker POST", S.req(url, "POST", "/api/v1/create_session", {},
                                             headers={"Content-Type": "text/plain"}), 415, "Content-Type")
    # A large refused body: answered, the connection is not left hanging.
    big = b'{"data": [' + b" " * 200000 + b"]}"
    expect("a large text/plain body", S.req(url, "POST", "/forward_backward", raw=big,
                                            headers={"Content-Type": "text/plain"}), 415, "Content-Type")
    if counters(url) != before:
        fail("refused cross-site requests changed the counters: %s -> %s" % (before, counters(url)))
    # What a local client sends is accepted.
    for host in ("localhost:" + port, "127.0.0.1:" + port, "LOCALHOST:" + port):
        st, _ = S.req(url, "GET", "/info", headers={"Host": host})
        if st != 200:
            fail("Host %s: HTTP %d, wanted 200" % (host, st))
    st, _ = S.req(url, "GET", "/info", headers={"Origin": "http://127.0.0.1:" + port})
    if st != 200:
        fail("the server's own Origin: HTTP %d, wanted 200" % st)
    st, js = S.req(url, "POST", "/optim_step", {}, headers={"Content-Type": "application/json; charset=utf-8"})
    if st != 200:
        fail("Content-Type application/json; charset=utf-8: HTTP %d %s" % (st, js))


# ---- API key ----------------------------------------------------------------------------

def apikey(url, key):
    S.API_KEY = None
    expect("no API key", S.req(url, "GET", "/info"), 401, "X-API-Key")
    expect("no API key on a POST", S.req(url, "POST", "/optim_step", {}), 401, "X-API-Key")
    expect("no API key on /api/v1", S.req(url, "POST", "/api/v1/create_session", {}), 401, "X-API-Key")
    expect("a wrong key", S.req(url, "GET", "/info", headers={"X-API-Key": "tml-wrong"}), 401, "X-API-Key")
    expect("a prefix of the key", S.req(url, "GET", "/info", headers={"X-API-Key": key[:-1]}), 401, "X-API-Key")
    expect("the key and more", S.req(url, "GET", "/info", headers={"X-API-Key": key + "x"}), 401, "X-API-Key")
    expect("an empty key", S.req(url, "GET", "/info", headers={"X-API-Key": ""}), 401, "X-API-Key")
    expect("a wrong Bearer", S.req(url, "GET", "/info", headers={"Authorization": "Bearer nope"}), 401,
           "Authorization")
    expect("the key as Basic", S.req(url, "GET", "/info", headers={"Authorization": "Basic " + key}), 401,
           "Authorization")
    for what, h in (("X-API-Key", {"X-API-Key": key}), ("Authorization: Bearer", {"Authorization": "Bearer " + key}),
                    ("bearer (any case)", {"Authorization": "bearer " + key})):
        st, js = S.req(url, "GET", "/info", headers=h)
        if st != 200:
            fail("%s with the right key: HTTP %d %s" % (what, st, js))
    st, js = S.req(url, "POST", "/api/v1/create_session", {}, headers={"X-API-Key": key})
    if st != 200 or "session_id" not in js:
        fail("create_session with the key: HTTP %d %s" % (st, js))
    # The SDK's client: works with the key, raises without it (401 is not retried).
    import tinker_sdk as T
    sc = T.ServiceClient(url, api_key=key, heartbeat_interval=0.3, backoff_base=0.02, outer_backoff_unit=0.05)
    try:
        tc = sc.create_lora_training_client("zdp-gpt", rank=0)  # --full-finetune
        tc.forward_backward([T.datum([1, 2, 3], [2, 3, 4])], "cross_entropy").result()
        tc.optim_step({"learning_rate": 1e-4}).result()
    except Exception as e:  # noqa: BLE001
        fail("the Tinker client with the key: %r" % e)
    finally:
        sc.close()
    try:
        T.ServiceClient(url, api_key="tml-not-the-key", heartbeat_interval=0.3, backoff_base=0.02,
                        outer_backoff_unit=0.05).close()
        fail("the Tinker client with a wrong key was not refused")
    except Exception as e:  # noqa: BLE001
        if "401" not in str(e) and "API key" not in str(e):
            fail("the Tinker client with a wrong key failed, but not with a 401: %r" % e)
    for path in ("/healthz", "/api/v1/healthz"):
        if S.req(url, "GET", path) != (200, {"status": "ok", "running": None, "queued": 0}):
            fail("GET %s without a key: %s, wanted 200 (liveness probes send no key)" % (path, S.req(url, "GET", path)))


# ---- a refused optim_step changes nothing --------------------------------------------------

def optim(url, out):
    info0 = S.req(url, "GET", "/info")[1]["optimizer"]
    fwd_bwd(url)
    S.ok(url, "/optim_step", {})
    S.ok(url, "/save_weights", {"path": "before.safetensors"})
    c0 = counters(url)
    big = {"learning_rate": 9.0, "beta1": 0.5, "beta2": 0.6, "eps": 0.5, "weight_decay": 7.0, "grad_clip_norm": 3.0}
    st, js = S.post(url, "/optim_step", {"adam_params": big})
    if st != 409:
        fail("optim_step with nothing accumulated: HTTP %d %s, wanted 409" % (st, js))
    info1 = S.req(url, "GET", "/info")[1]["optimizer"]
    if info1 != info0:
        fail("a refused optim_step changed the hyperparameters: %s -> %s" % (info0, info1))
    if counters(url) != c0:
        fail("a refused optim_step changed the counters: %s -> %s" % (c0, counters(url)))
    S.ok(url, "/save_weights", {"path": "after.safetensors"})
    S.compare(os.path.join(out, "before.safetensors"), os.path.join(out, "after.safetensors"), exact=True)
    # Out of the finite ranges: a 400 naming the key, before anything runs.
    for k, v in (("learning_rate", 1e308), ("learning_rate", 11.0), ("weight_decay", 1e300),
                 ("grad_clip_norm", 1e31), ("eps", 2.0), ("beta1", 1.0)):
        expect("adam_params.%s = %g" % (k, v), S.post(url, "/optim_step", {"adam_params": {k: v}}), 400,
               "adam_params." + k)
    # The next step uses the old values: learning_rate:mean is the config's.
    fwd_bwd(url)
    js = S.ok(url, "/optim_step", {})
    if js.get("metrics", {}).get("learning_rate:mean") != info0["lr"]:
        fail("after a refused optim_step the next step used lr %s, wanted %s" % (js.get("metrics"), info0["lr"]))


# ---- integers ------------------------------------------------------------------------------

def tinker_post(url, verb, body):
    return S.req(url, "POST", "/api/v1/" + verb, body)


def tinker_result(url, fut):
    for _ in range(60):
        st, js = tinker_post(url, "retrieve_future", {"request_id": fut["request_id"]})
        if st != 200 or js.get("type") != "try_again":
            return st, js
    return 0, {}


def integers(url, ck=None, outside=None):
    st, js = tinker_post(url, "create_session", {"tags": [], "user_metadata": {}, "sdk_version": "0.24.1",
                                                 "type": "create_session"})
    sid = js.get("session_id")
    st, fut = tinker_post(url, "create_model", {"session_id": sid, "model_seq_id": 0, "base_model": "zdp-gpt",
                                                "type": "create_model"})
    st, js = tinker_result(url, fut)
    model_id = js.get("model_id")
    if not model_id:
        fail("create_model: %s" % js)
        return
    inp = {"data": [S.datum([1, 2, 3], [2, 3, 4])], "loss_fn": "cross_entropy"}
    for seq in (2 ** 63 - 1, 2 ** 53, 0, -1):
        expect("forward_backward seq_id = %d" % seq,
               tinker_post(url, "forward_backward", {"model_id": model_id, "seq_id": seq,
                                                     "forward_backward_input": inp}), 400, "seq_id")
    # The order is intact: seq_id 1 and 2 run at once (nothing waits for a gap).
    for seq in (1, 2):
        st, fut = tinker_post(url, "forward_backward", {"model_id": model_id, "seq_id": seq,
                                                        "forward_backward_input": inp})
        st, js = tinker_result(url, fut)
        if st != 200 or "loss_fn_outputs" not in js:
            fail("forward_backward seq_id %d after the refused ones: %s" % (seq, js))
    # Tinker paths: a link in --checkpoint-dir where the model's folder goes,
    # pointing outside, is refused (the future fails naming path), not followed.
    if ck is not None:
        mdir = os.path.join(ck, model_id.replace(":", "_"))
        os.makedirs(ck, exist_ok=True)
        shutil.rmtree(mdir, ignore_errors=True)  # create_model made it (its run.json)
        os.symlink(outside, mdir)
        for seq, verb in ((3, "save_weights"), (4, "save_weights_for_sampler")):
            st, fut = tinker_post(url, verb, {"model_id": model_id, "seq_id": seq, "path": "escaped",
                                              "type": verb})
            st, js = tinker_result(url, fut)
            if "error" not in js or "outside" not in str(js.get("error")):
                fail("Tinker %s through a link to outside: %s, wanted a failure naming the path" % (verb, js))
        st, fut = tinker_post(url, "load_weights", {"model_id": model_id, "seq_id": 5, "optimizer": False,
                                                    "path": "tinker://%s/weights/escaped" % model_id})
        st, js = tinker_result(url, fut)
        if "error" not in js:
            fail("Tinker load_weights through a link to outside: %s, wanted a failure" % js)
        os.unlink(mdir)
        if [n for n in os.listdir(outside) if n.startswith("escaped") or n == "sampler_weights"]:
            fail("Tinker saves wrote outside the checkpoint folder: %s" % os.listdir(outside))
    # Content-Length past INT64_MAX (and past 2^64): 413, not a read that never ends.
    host = url.split("//")[1]
    for n in ("9223372036854775808", "18446744073709551616"):
        st, resp = S.raw_http(url, ("POST /forward_backward HTTP/1.1\r\nHost: %s\r\nContent-Type: "
                                    "application/json\r\n%sContent-Length: %s\r\n\r\n{}" %
                                    (host, S.auth_header(), n)).encode())
        if st not in (400, 413):
            fail("Content-Length %s: HTTP %d, wanted 413: %r" % (n, st, resp[:200]))


def main(argv):
    cmd = argv[1]
    if cmd == "paths":
        paths(argv[2], argv[3], argv[4], argv[5])
    elif cmd == "guards":
        guards(argv[2])
    elif cmd == "apikey":
        apikey(argv[2], argv[3])
    elif cmd == "optim":
        optim(argv[2], argv[3])
    elif cmd == "integers":
        integers(argv[2], *argv[3:5])
    else:
        print(__doc__)
        return 2
    return min(S.FAILURES, 100)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
