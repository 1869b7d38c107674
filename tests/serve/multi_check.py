#!/usr/bin/env python3
"""Many LoRA models on one `zdp serve` (docs/server.md, "Models"), driven
through the Tinker protocol by tests/serve/tinker_sdk.py.  The server runs in
its default LoRA mode with --max-models 2 and a short
--model-idle-timeout-seconds (tests/cli/test_serve_multi.sh).

Checks:
  - a new model starts at the base model's loss (fresh adapters: B = 0), for
    any rank, seed and targets;
  - two models of two clients trained interleaved (requests of both in
    flight together, then from two threads)
    give bitwise the same losses, logprobs and adapters (the checkpoints'
    tensors) as each trained alone;
  - create_training_client_from_state(_with_optimizer): weights_info
    names the run's LoRA configuration; a model built beside a live one from
    a checkpoint continues exactly as the original did;
  - a third model is a 400 naming --max-models and the live count; GET /info
    lists the live models and their memory;
  - bad input is a 4xx naming the field, and nothing changes (losses and
    counters bitwise the same): rank 0, a rank larger than a target's
    dimensions, an unknown lora_config key, an unknown model_id, a
    checkpoint of another rank;
  - a model whose session stops heartbeating is unloaded after the timeout;
    a request to it then is a 400 saying why; its checkpoint stays;
  - the plain JSON API's training endpoints are a 400 naming --full-finetune;
  - a forward between forward_backward and optim_step changes nothing,
    bitwise (JSON forward of SDK 0.24, protobuf forward_only of 0.25);
  - a script stopped and restarted at once can create its models again: the
    old session's models (it stopped heartbeating, never unloaded) give
    their slots to the new session's create_model once it missed
    --session-timeout-seconds of heartbeats, and at once after POST
    sessions/ID/finish; before that the 400 names each live model, its
    session and its last heartbeat.

usage: multi_check.py URL CHECKPOINT_DIR IDLE_TIMEOUT_SECONDS SESSION_TIMEOUT_SECONDS
"""
import array
import json
import os
import struct
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tinker_sdk as T  # noqa: E402

ADAM = {"learning_rate": 1e-2, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.0,
        "grad_clip_norm": 0.0}
V = 64
failures = 0


def fail(msg):
    global failures
    failures += 1
    print("FAIL: " + msg, flush=True)


def data(seed, lens):
    """Datums of the given lengths from a small LCG (the same every run)."""
    x = seed
    out = []
    for n in lens:
        toks = []
        for _ in range(n + 1):
            x = (x * 1103515245 + 12345) % (1 << 31)
            toks.append(x % V)
        out.append(T.datum(toks[:-1], toks[1:]))
    return out


DATA_A = data(1, [9, 4, 16])
DATA_B = data(2, [7, 12])


def f32(values):
    return array.array("f", [float("nan") if v is None else v for v in values]).tobytes()


def fingerprint(res):
    """A forward(_backward) result's loss and logprobs, bitwise."""
    lp = b"".join(f32(o["logprobs"]["data"]) for o in res["loss_fn_outputs"])
    return (struct.pack("d", res["metrics"]["loss:sum"]), lp)


def tensors(path):
    """{name: raw bytes} of a safetensors file."""
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    base = 8 + n
    return {k: raw[base + v["data_offsets"][0]:base + v["data_offsets"][1]]
            for k, v in head.items() if k != "__metadata__"}


def ckpt_file(ckdir, model_id, name):
    d = "".join(c if c.isalnum() or c == "-" else "_" for c in model_id)
    return os.path.join(ckdir, d, name, "model.safetensors")


def expect_status(fn, what, status, needle):
    try:
        fn()
    except T.APIStatusError as e:
        body = e.body.decode() if isinstance(e.body, bytes) else str(e.body)
        if e.status != status or needle not in body:
            fail("%s: HTTP %s %s, wanted %d mentioning %r" % (what, e.status, body[:400], status, needle))
        return
    except Exception as e:  # noqa: BLE001
        fail("%s: raised %r, wanted HTTP %d" % (what, e, status))
        return
    fail("%s: succeeded, wanted HTTP %d mentioning %r" % (what, status, needle))


def expect_failure(fn, what, needle):
    try:
        fn()
    except T.RequestFailedError as e:
        if needle not in str(e):
            fail("%s: %r, wanted a failure mentioning %r" % (what, str(e), needle))
        return
    except Exception as e:  # noqa: BLE001
        fail("%s: raised %r, wanted RequestFailedError" % (what, e))
        return
    fail("%s: succeeded, wanted a failure mentioning %r" % (what, needle))


def http(url, method, path, body=None):
    req = urllib.request.Request(url + path, method=method, data=json.dumps(body).encode() if body is not None
                                 else None, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def info(url):
    st, js = http(url, "GET", "/info")
    if st != 200:
        fail("GET /info -> %d %s" % (st, js))
    return js


def client(url, heartbeat=0.3):
    return T.ServiceClient(url, heartbeat_interval=heartbeat, backoff_base=0.02, outer_backoff_unit=0.05)


def train(tc, dat, steps, tag):
    """steps x (forward_backward, optim_step); the forward_backward fingerprints."""
    out = []
    for _ in range(steps):
        out.append(fingerprint(tc.forward_backward(dat, "cross_entropy").result()))
        tc.optim_step(ADAM).result()
    return out


class Check:
    def __init__(self, url, ckdir, idle, session_timeout):
        self.url, self.ckdir, self.idle, self.session_timeout = url, ckdir, idle, session_timeout
        self.sc = client(url)
        self.name = self.sc.get_server_capabilities()["supported_models"][0]["model_name"]

    def lora(self, rank=4, seed=11, **kw):
        return self.sc.create_lora_training_client(self.name, rank=rank, seed=seed, **kw)

    def base_loss(self):
        """Fresh models of any configuration start at the base model's loss."""
        a = self.lora(rank=4, seed=11)
        b = self.lora(rank=2, seed=5, train_unembed=False)
        fa = fingerprint(a.forward(DATA_A, "cross_entropy").result())
        fb = fingerprint(b.forward(DATA_A, "cross_entropy").result())
        if fa != fb:
            fail("two fresh LoRA models differ on the same data (the base's loss): %r %r" % (fa[0], fb[0]))
        # Train a, unload it; a new model again starts at the base (not a's weights).
        train(a, DATA_A, 2, "a")
        a.unload().result()
        c = self.lora(rank=4, seed=11)
        fc = fingerprint(c.forward(DATA_A, "cross_entropy").result())
        if fc != fa:
            fail("a new create_lora_training_client did not start at the base model's loss: %r vs %r"
                 % (struct.unpack("d", fc[0]), struct.unpack("d", fa[0])))
        for tc in (b, c):
            tc.unload().result()
        if info(self.url).get("models"):
            fail("GET /info still lists models after unload_model: %s" % info(self.url)["models"])
        print("multi_check: fresh models start at the base loss", flush=True)

    def interleaved(self):
        """Two models, requests interleaved (both in flight), == each alone, bitwise."""
        a = self.lora(rank=4, seed=11)
        # b belongs to a second client (its own session), as two users would.
        sc2 = client(self.url)
        b = sc2.create_lora_training_client(self.name, rank=2, seed=5, train_unembed=False)
        fa, fb = [], []
        for _ in range(2):
            # Both models' requests in flight together, from one thread ...
            ra = a.forward_backward(DATA_A, "cross_entropy")
            rb = b.forward_backward(DATA_B, "cross_entropy")
            oa, ob = a.optim_step(ADAM), b.optim_step(ADAM)
            fa.append(fingerprint(ra.result()))
            fb.append(fingerprint(rb.result()))
            oa.result()
            ob.result()
        # ... and from two threads, each client at its own pace.
        ta_ = threading.Thread(target=lambda: fa.extend(train(a, DATA_A, 2, "a")))
        tb_ = threading.Thread(target=lambda: fb.extend(train(b, DATA_B, 2, "b")))
        ta_.start()
        tb_.start()
        ta_.join()
        tb_.join()
        a.save_state("inter").result()
        b.save_state("inter").result()
        ta = tensors(ckpt_file(self.ckdir, a.model_id, "inter"))
        tb = tensors(ckpt_file(self.ckdir, b.model_id, "inter"))
        # GET /info: both models, their memory on every rank.
        js = info(self.url)
        models = {m.get("model_id"): m for m in js.get("models", [])}
        for tc, rank in ((a, 4), (b, 2)):
            m = models.get(tc.model_id)
            # Adam: 2 states per adapter parameter this rank optimizes (at least one rank has some).
            if m is None or m["step"] != 4 or m["lora"]["rank"] != rank or \
                    sum(r["optimizer_bytes"] for r in m["memory"]) < 2 * 4 * m["n_params"] or \
                    any(r["total_bytes"] <= 0 for r in m["memory"]):
                fail("GET /info models[%s]: %s" % (tc.model_id, m))
        if js.get("mode") != "lora" or js.get("max_models") != 2 or \
                js.get("session_timeout_seconds") != self.session_timeout:
            fail("GET /info: mode %s, max_models %s, session_timeout_seconds %s"
                 % (js.get("mode"), js.get("max_models"), js.get("session_timeout_seconds")))
        self.a, self.b = a, b
        self.fa, self.fb, self.ta, self.tb = fa, fb, ta, tb
        # Each alone, on a server where the other is not loaded.
        a.unload().result()
        b.unload().result()
        sc2.close()
        for (rank, seed, kw, dat, want_f, want_t, tag) in ((4, 11, {}, DATA_A, fa, ta, "A"),
                                                           (2, 5, {"train_unembed": False}, DATA_B, fb, tb, "B")):
            tc = self.lora(rank=rank, seed=seed, **kw)
            got = train(tc, dat, 4, tag)
            tc.save_state("alone").result()
            tt = tensors(ckpt_file(self.ckdir, tc.model_id, "alone"))
            if got != want_f:
                fail("model %s: losses/logprobs trained alone differ from interleaved" % tag)
            if tt != want_t or not tt:
                fail("model %s: adapters trained alone differ from interleaved (%d tensors)" % (tag, len(tt)))
            tc.unload().result()
        print("multi_check: two models interleaved == each alone, bitwise (losses, logprobs, adapters)",
              flush=True)

    def from_state(self):
        """create_training_client_from_state(_with_optimizer) beside a live model."""
        a = self.lora(rank=4, seed=11)
        train(a, DATA_A, 2, "a")
        path = a.save_state("two").result()["path"]
        st, wi = http(self.url, "POST", "/api/v1/weights_info", {"tinker_path": path})
        if st != 200 or wi.get("is_lora") is not True or wi.get("lora_rank") != 4 or wi.get("train_attn") is not True:
            fail("weights_info %s: %d %s" % (path, st, wi))
        nxt = train(a, DATA_A, 1, "a")  # step 3 of the original
        a.save_state("three").result()
        want = tensors(ckpt_file(self.ckdir, a.model_id, "three"))
        # Beside the live a: the SDK's from_state_with_optimizer = create with
        # weights_info's configuration, then load_state_with_optimizer.
        c = self.lora(rank=wi["lora_rank"], seed=99)
        c.load_state_with_optimizer(path).result()
        got = train(c, DATA_A, 1, "c")
        c.save_state("three").result()
        if got != nxt or tensors(ckpt_file(self.ckdir, c.model_id, "three")) != want:
            fail("from_state_with_optimizer: step 3 differs from the original's")
        c.unload().result()
        # Weights only: the adapters load, the optimizer starts fresh.
        d = self.lora(rank=4, seed=99)
        d.load_state(path).result()
        fd = fingerprint(d.forward(DATA_A, "cross_entropy").result())
        if fd != nxt[0]:
            fail("from_state (weights only): the loss differs from the checkpoint's")
        d.unload().result()
        self.a = a
        print("multi_check: from_state beside a live model continues exactly", flush=True)

    def refusals(self):
        a = self.a
        b = self.lora(rank=2, seed=5)
        before = fingerprint(a.forward(DATA_A, "cross_entropy").result())
        steps = {m["model_id"]: (m["step"], m["pending_backwards"]) for m in info(self.url)["models"]}
        expect_status(lambda: self.lora(rank=2, seed=1), "a third model", 400, "--max-models 2")
        expect_status(lambda: self.lora(rank=2, seed=1), "a third model", 400, "2 are live")
        expect_status(lambda: self.lora(rank=0), "rank 0 on a LoRA server", 400, "lora_config.rank = 0")
        expect_status(lambda: self.sc.http.post("/api/v1/create_model", {
            "session_id": self.sc.session_id, "model_seq_id": 90, "base_model": self.name,
            "lora_config": {"rank": 2, "train_everything": True}, "type": "create_model"}),
            "an unknown lora_config key", 400, "train_everything")
        expect_status(lambda: self.sc.http.post("/api/v1/forward", {
            "model_id": "s999:train:0", "seq_id": 1, "forward_input": {"data": DATA_A, "loss_fn": "cross_entropy"},
            "type": "forward"}), "an unknown model_id", 400, "s999:train:0")
        # A rank larger than a target's dimensions: zdp_lora_create's refusal, at once.
        b.unload().result()
        expect_status(lambda: self.lora(rank=17, seed=1), "rank 17 > n_embd 16", 400, "lora_config.rank: ")
        expect_status(lambda: self.lora(rank=17, seed=1, train_mlp=False, train_attn=False),
                      "rank 17 > lm_head's dims", 400, "rank = 17")
        # A checkpoint of another rank into a: refused, nothing changed.
        e = self.lora(rank=2, seed=5)
        other = e.save_state("r2").result()["path"]
        e.unload().result()
        expect_failure(lambda: a.load_state_with_optimizer(other).result(), "a checkpoint of rank 2 into rank 4",
                       "rank")
        expect_failure(lambda: a.load_state(other).result(), "weights of rank 2 into rank 4", "shape")
        after = fingerprint(a.forward(DATA_A, "cross_entropy").result())
        now = {m["model_id"]: (m["step"], m["pending_backwards"]) for m in info(self.url)["models"]}
        if after != before or now.get(a.model_id) != steps.get(a.model_id):
            fail("a refused request changed the live model: %s -> %s" % (steps, now))
        # The plain JSON API trains only a --full-finetune server.
        st, js = http(self.url, "POST", "/forward_backward", {"data": [], "loss_fn": "cross_entropy"})
        if st != 400 or "--full-finetune" not in json.dumps(js):
            fail("plain /forward_backward on a LoRA server: %d %s" % (st, js))
        st, js = http(self.url, "POST", "/sample", {"prompt": [1, 2, 3], "max_tokens": 4, "seed": 1})
        if st != 200 or len(js.get("sequences", [{}])[0].get("tokens", [])) != 4:
            fail("plain /sample (the base) on a LoRA server: %d %s" % (st, js))
        a.unload().result()
        expect_status(lambda: a.forward(DATA_A, "cross_entropy").result(), "a request after unload_model", 400,
                      "unload_model was called")
        print("multi_check: refusals are 4xx naming the field; nothing changed", flush=True)

    def heartbeat(self):
        """A model whose session goes silent is unloaded; its checkpoint stays."""
        quiet = client(self.url, heartbeat=3600)  # its first heartbeat would come in an hour
        q = quiet.create_lora_training_client(self.name, rank=2, seed=3)
        live = self.lora(rank=2, seed=4)  # self.sc heartbeats: kept
        q.save_state("kept").result()
        time.sleep(self.idle + 2.5)
        expect_status(lambda: q.forward(DATA_A, "cross_entropy").result(), "a request to a silent session's model",
                      400, "sent no heartbeat")
        ids = [m.get("model_id") for m in info(self.url).get("models", [])]
        if q.model_id in ids or live.model_id not in ids:
            fail("after the idle timeout GET /info lists %s (wanted %s, not %s)" % (ids, live.model_id, q.model_id))
        if not os.path.exists(ckpt_file(self.ckdir, q.model_id, "kept")):
            fail("the unloaded model's checkpoint is gone")
        live.forward(DATA_A, "cross_entropy").result()
        live.unload().result()
        quiet.close()
        print("multi_check: a silent session's model is unloaded after %g s; its checkpoint stays" % self.idle,
              flush=True)


    def forward_no_grad(self):
        """forward (and 0.25's forward_only) leaves no gradient: bitwise the same step."""
        results = {}
        sc25 = T.ServiceClient(self.url, sdk_version="0.25.0", heartbeat_interval=0.3, backoff_base=0.02,
                               outer_backoff_unit=0.05)
        # Each against a run without the forward, through the same encoding
        # (0.25 reads its results as protobuf: float32 losses).
        for tag, sc, extra in (("none", self.sc, False), ("json", self.sc, True), ("none-proto", sc25, False),
                               ("proto", sc25, True)):
            tc = sc.create_lora_training_client(self.name, rank=4, seed=11)
            fb = tc.forward_backward(DATA_A, "cross_entropy")
            if extra:  # in the window, between forward_backward and optim_step
                tc.forward(DATA_B, "cross_entropy").result()
            fb.result()
            tc.optim_step(ADAM).result()
            after = fingerprint(tc.forward(DATA_A, "cross_entropy").result())
            tc.save_state("fwd-" + tag).result()
            results[tag] = (after, tensors(ckpt_file(self.ckdir, tc.model_id, "fwd-" + tag)))
            tc.unload().result()
        sc25.close()
        for tag, ref in (("json", "none"), ("proto", "none-proto")):
            if results[tag][0] != results[ref][0]:
                fail("a %s forward between forward_backward and optim_step changed the step's losses" % tag)
            if results[tag][1] != results["none"][1] or not results[tag][1]:
                fail("a %s forward between forward_backward and optim_step changed the adapters" % tag)
        print("multi_check: a forward in the window leaves no gradient (bitwise, JSON and protobuf)", flush=True)

    def restart(self):
        """A script stopped and restarted at once creates its models again."""
        old = client(self.url)
        models = [old.create_lora_training_client(self.name, rank=2, seed=s) for s in (3, 4)]
        train(models[0], DATA_A, 1, "old")
        models[0].save_state("before-restart").result()
        old.close()  # the process died: no more heartbeats, nothing unloaded
        new = client(self.url)
        # At once: the old session has not missed its heartbeats yet.
        expect_status(lambda: new.create_lora_training_client(self.name, rank=2, seed=7),
                      "create_model while the old session may still be alive", 400, "--max-models 2")
        js = None
        try:
            new.create_lora_training_client(self.name, rank=2, seed=7)
        except T.APIStatusError as e:
            js = e.body.decode() if isinstance(e.body, bytes) else str(e.body)
        for needle in (models[0].model_id, "session %s, alive, last heartbeat" % old.session_id,
                       "--session-timeout-seconds"):
            if js is None or needle not in js:
                fail("the --max-models 400 does not say %r: %s" % (needle, js))
        time.sleep(self.session_timeout + 0.5)
        t0 = time.time()
        fresh = [new.create_lora_training_client(self.name, rank=2, seed=s) for s in (7, 8)]
        if time.time() - t0 > 10:
            fail("creating the models again took %.1f s" % (time.time() - t0))
        for tc in fresh:
            tc.forward(DATA_A, "cross_entropy").result()
        for m in models:
            expect_status(lambda: m.forward(DATA_A, "cross_entropy").result(), "a request to the old session's "
                          "model", 400, "took its slot")
        if not os.path.exists(ckpt_file(self.ckdir, models[0].model_id, "before-restart")):
            fail("the old session's checkpoint is gone")
        ids = sorted(m.get("model_id") for m in info(self.url).get("models", []))
        if ids != sorted(tc.model_id for tc in fresh):
            fail("GET /info lists %s after the restart, wanted the new session's models" % ids)
        # ServiceClient.close() of newer SDKs: POST sessions/ID/finish; its models go at once.
        fin = "/api/v1/sessions/%s/finish" % new.session_id
        st, js = http(self.url, "POST", fin, {"reason": {"type": "success"}})
        if st != 200 or sorted(js.get("unloaded_models", [])) != sorted(tc.model_id for tc in fresh):
            fail("finish: %d %s" % (st, js))
        again = client(self.url)
        third = [again.create_lora_training_client(self.name, rank=2, seed=s) for s in (9, 10)]
        st, js = http(self.url, "POST", fin, {"reason": {"type": "success"}})
        if st != 200 or js.get("unloaded_models") != [] or js.get("reason") != "success":
            fail("finish again: %d %s" % (st, js))
        expect_status(lambda: fresh[0].forward(DATA_A, "cross_entropy").result(), "a request to a finished "
                      "session's model", 400, "finished (reason success)")
        st, js = http(self.url, "POST", "/api/v1/sessions/s99999/finish", {"reason": {"type": "errored"}})
        if st != 404 or "s99999" not in json.dumps(js):
            fail("finish of an unknown session: %d %s" % (st, js))
        st, js = http(self.url, "POST", "/api/v1/sessions/%s/finish" % again.session_id, {"reason": "done"})
        if st != 400 or js.get("field") != "reason" or "done" not in js.get("error", ""):
            fail("finish with a bad reason: %d %s" % (st, js))
        for tc in third:
            tc.unload().result()
        for sc in (new, again):
            sc.close()
        print("multi_check: a restarted script creates its models again (after %g s of missed heartbeats, "
              "at once after finish)" % self.session_timeout, flush=True)


def main():
    url, ckdir, idle = sys.argv[1], sys.argv[2], float(sys.argv[3])
    c = Check(url, ckdir, idle, float(sys.argv[4]))
    for step in (c.base_loss, c.interleaved, c.from_state, c.refusals, c.heartbeat, c.forward_no_grad, c.restart):
        try:
            step()
        except Exception as e:  # noqa: BLE001
            fail("%s: %r" % (step.__name__, e))
    c.sc.close()
    print("multi_check: %d failure(s)" % failures, flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
