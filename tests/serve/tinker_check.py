#!/usr/bin/env python3
"""tinker_check.py -- drives a running `zdp serve` through the Tinker SDK's wire
protocol (tests/serve/tinker_sdk.py, a client written from docs/tinker-protocol.md that sends
what the SDK sends), for tests/cli/test_tinker.sh.

  tinker_check.py URL OUT_DIR WORLD_SIZE CHECKPOINT_DIR

The server must run with --long-poll-seconds 1 --seq-gap-seconds 3 and
--checkpoint-dir CHECKPOINT_DIR.  The model is driven as SDK 0.24 does (JSON);
after unload_model a second client drives a new model as SDK 0.25 does
(protobuf forward_backward and results, sdk025()), then as SDK 0.26+ (newer_sdk_check.py).
Reference updates come from the server's plain
endpoints (/forward_backward, /optim_step), which tests/cli/test_serve.sh checks
against `zdp train`.  Every failed check prints "FAIL: ..."; the exit status is
the failure count (capped at 100).
"""
import array
import json
import math
import os
import random
import struct
import sys
import threading
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import newer_sdk_check  # noqa: E402
import serve_check as S  # noqa: E402
import tinker_sdk as T  # noqa: E402

# Adam with a large eps: an update near-linear in the gradient, so a float
# rounding difference cannot flip the sign of a near-zero gradient's update.
ADAM = {"learning_rate": 1e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-3, "weight_decay": 0.01,
        "grad_clip_norm": 0.0}


def fail(msg):
    S.fail(msg)


def expect_status(fn, what, status, needle):
    """fn() must raise APIStatusError with HTTP status whose body holds needle."""
    try:
        fn()
    except T.APIStatusError as e:
        if e.status != status or needle not in str(e.body):
            fail("%s: HTTP %s %r, wanted %d mentioning %r" % (what, e.status, e.body[:300], status, needle))
        return
    except Exception as e:  # noqa: BLE001
        fail("%s: raised %r, wanted HTTP %d" % (what, e, status))
        return
    fail("%s: succeeded, wanted HTTP %d mentioning %r" % (what, status, needle))


def expect_failure(fn, what, needle, category="user"):
    """fn() must raise RequestFailedError of category whose message holds needle."""
    try:
        fn()
    except T.RequestFailedError as e:
        if e.category != category or needle not in str(e):
            fail("%s: RequestFailedError(%r, %s), wanted %s mentioning %r" % (what, str(e), e.category,
                                                                                category, needle))
        return str(e)
    except Exception as e:  # noqa: BLE001
        fail("%s: raised %r, wanted RequestFailedError" % (what, e))
        return None
    fail("%s: succeeded, wanted a %s error mentioning %r" % (what, category, needle))
    return None


def f32(values):
    """The float32 bits of a list of numbers (a JSON number printed with 9
    digits and a protobuf float32 are the same float32)."""
    return array.array("f", [float("nan") if v is None else v for v in values]).tobytes()


def same_outputs(a, b):
    """Two lists of loss_fn_outputs hold the same float32 tensors."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if set(x) != set(y):
            return False
        for k in x:
            if x[k]["dtype"] != y[k]["dtype"] or f32(x[k]["data"]) != f32(y[k]["data"]) or \
                    list(x[k].get("shape") or [len(x[k]["data"])]) != list(y[k].get("shape") or [len(y[k]["data"])]):
                return False
    return True


def as_datum(d, **inputs):
    """serve_check's plain datum -> the SDK's Datum with TensorData inputs."""
    tokens = d["model_input"]["chunks"][0]["tokens"]
    targets = d["loss_fn_inputs"]["target_tokens"]
    if isinstance(targets, dict):
        targets = targets["data"]
    if inputs:
        return T.datum(tokens, targets, **{k: T.tensor(v, "float32") for k, v in inputs.items()})
    w = d["loss_fn_inputs"].get("weights")
    return T.datum(tokens, targets, (w["data"] if isinstance(w, dict) else w) if w is not None else None)


class Check:
    def __init__(self, url, out, W, ckdir):
        self.url, self.out, self.W, self.ckdir = url, out, W, ckdir
        S.gen_data(out)
        self.plain = json.load(open(os.path.join(out, "data.json")))
        self.data = [as_datum(d) for d in self.plain]
        self.s0 = os.path.join(out, "s0")

    # -- helpers --

    def reset(self):
        """The initial weights and optimizer state, nothing pending."""
        S.ok(self.url, "/load_state", {"path": self.s0})

    def sampler_file(self, tc, name):
        res = tc.save_weights_for_sampler(name).result()
        want = "tinker://%s/sampler_weights/%s" % (tc.model_id, name)
        if res.get("path") != want:
            fail("save_weights_for_sampler answered %s, wanted path %s" % (res, want))
        return os.path.join(self.ckdir, tc.model_id.replace(":", "_"), "sampler_weights", name + ".safetensors")

    def native_update(self, name, data, loss_fn="cross_entropy", adam=ADAM):
        """The same update through the plain endpoints, as one request."""
        self.reset()
        js = S.ok(self.url, "/forward_backward", {"data": data, "loss_fn": loss_fn})
        S.ok(self.url, "/optim_step", {"adam_params": adam})
        path = os.path.join(self.out, name + ".safetensors")
        S.ok(self.url, "/save_weights", {"path": path})
        return path, js["metrics"]["loss:sum"]

    def info(self):
        return S.req(self.url, "GET", "/info")[1]

    # -- the checks --

    def bootstrap(self):
        self.sc = T.ServiceClient(self.url, heartbeat_interval=0.3, backoff_base=0.02, outer_backoff_unit=0.05,
                                  client_config_overrides={"fwdbwd_max_chunk_len": 2 * self.W})
        cfg = self.sc.server_client_config
        if cfg.get("parallel_fwdbwd_chunks") is not True or cfg.get("proto_write_fwdbwd") is not False:
            fail("client/config: %s (wanted parallel chunks, no protobuf)" % cfg)
        if not any("--full-finetune" in w for w in self.sc.warnings):
            fail("create_session carried no warning about full fine-tuning: %s" % self.sc.warnings)
        caps = self.sc.get_server_capabilities()
        self.name = caps["supported_models"][0]["model_name"]
        expect_failure(lambda: self.sc.create_lora_training_client("gpt2", rank=0), "create_model of another base_model",
                       self.name)
        # --full-finetune: a LoRA request is a 400 naming the field, the value and the flag.
        expect_status(lambda: self.sc.create_lora_training_client(self.name, rank=32), "LoRA on --full-finetune",
                      400, "lora_config.rank = 32")
        self.tc = self.sc.create_lora_training_client(self.name, rank=0)
        info = self.tc.get_info()
        if info.get("model_id") != self.tc.model_id or info.get("is_lora") is not False:
            fail("get_info: %s" % info)
        # One model per server: a second live session cannot take it.
        other = T.ServiceClient(self.url, heartbeat_interval=0.3, backoff_base=0.02, outer_backoff_unit=0.05)
        expect_failure(lambda: other.create_lora_training_client(self.name, rank=0), "a second create_model", "live session")
        other.close()
        S.ok(self.url, "/save_state", {"path": self.s0})

    def exact_update(self):
        """Chunks of 2W datums, posted in parallel with the first chunk last,
        then optim_step: bitwise the update of one plain request (chunks of a
        multiple of W datums give each rank the same datums in the same order)."""
        ref, ref_loss = self.native_update("ref", self.plain)
        self.reset()
        fb = self.tc.forward_backward(self.data, "cross_entropy")
        res = fb.result()
        order = [seq for seq, path in self.tc.sent if path.endswith("forward_backward")][-len(fb.chunks):]
        if len(fb.chunks) > 1 and order[-1] != fb.chunks[0][0]:
            fail("the client did not send the first chunk last: %s" % order)
        if len(res["loss_fn_outputs"]) != len(self.data):
            fail("forward_backward merged %d outputs for %d datums" % (len(res["loss_fn_outputs"]), len(self.data)))
        for d, o in zip(self.plain, res["loss_fn_outputs"]):
            n = len(d["model_input"]["chunks"][0]["tokens"])
            if len(o["logprobs"]["data"]) != n:
                fail("logprobs length %d for a datum of %d tokens" % (len(o["logprobs"]["data"]), n))
        loss = res["metrics"]["loss:sum"]
        if abs(loss - ref_loss) > 1e-5 * abs(ref_loss):
            fail("loss:sum over %d chunks %r, one plain request %r" % (len(fb.chunks), loss, ref_loss))
        m = self.tc.optim_step(ADAM).result()
        if set(m.get("metrics", {})) != {"grad_norm:mean", "learning_rate:mean"} or \
                abs(m["metrics"]["learning_rate:mean"] - ADAM["learning_rate"]) > 1e-12:
            fail("optim_step result %s" % m)
        S.compare(ref, self.sampler_file(self.tc, "exact"), exact=True)
        self.ref, self.ref_loss = ref, ref_loss
        return len(fb.chunks)

    def forward_in_window(self):
        """A forward between forward_backward and optim_step leaves no
        gradient: the update is bitwise exact_update's (the plain request's)."""
        self.reset()
        fb = self.tc.forward_backward(self.data, "cross_entropy")
        fwd = self.tc.forward(self.data[:1], "cross_entropy")
        fb.result()
        fwd.result()
        self.tc.optim_step(ADAM).result()
        S.compare(self.ref, self.sampler_file(self.tc, "fwd-in-window"), exact=True)

    def retries(self):
        """Lost responses make the client retry with the same idempotency key;
        a late chunk arrives after the ones behind it.  Each runs once."""
        self.reset()
        nxt = self.tc._next_request_id + 1  # the seq_id the next request gets
        faults = T.Faults()
        n_chunks = -(-len(self.data) // (2 * self.W))
        faults.drop_response("forward_backward", seq_id=nxt + 1)        # the second chunk
        faults.delay("forward_backward", 0.4, seq_id=nxt + n_chunks - 1)  # the last comes late
        faults.drop_response("optim_step")
        faults.drop_response("retrieve_future", nth=self.sc.http.count("/api/v1/retrieve_future") + 2)
        self.sc.http.fault = faults
        before = {p: self.sc.http.count(p, "lost") for p in ("/api/v1/forward_backward", "/api/v1/optim_step")}
        self.tc.forward_backward(self.data, "cross_entropy").result()
        self.tc.optim_step(ADAM).result()
        self.sc.http.fault = None
        if faults.pending():
            fail("fault rules that never fired: %s" % faults.pending())
        for p, n in before.items():
            if self.sc.http.count(p, "lost") <= n:
                fail("%s: no response was lost, so the retry path was not exercised" % p)
        info = self.info()
        if info["step"] != 1 or info["pending_backwards"] != 0:
            fail("after retried requests: step %s, pending %s (wanted 1, 0)" % (info["step"], info["pending_backwards"]))
        S.compare(self.ref, self.sampler_file(self.tc, "retried"), exact=True)

    def refused_chunk(self):
        """A bad datum fails its chunk's future with the field's name; its
        seq_id is used up, so the next requests run without waiting."""
        self.reset()
        bad = list(self.data)
        bad[2 * self.W + 1] = T.datum([1, 2, 999], [1, 2, 3])
        fb = self.tc.forward_backward(bad, "cross_entropy")
        expect_failure(fb.result, "forward_backward with a token outside the vocabulary",
                       "forward_backward_input.data[1].model_input.chunks[0].tokens[2]")
        t0 = time.time()
        self.reset()
        self.tc.forward_backward(self.data, "cross_entropy").result()
        self.tc.optim_step(ADAM).result()
        if time.time() - t0 > 2.5:
            fail("requests after a refused chunk waited %.1f s (the refused seq_id was not counted)" % (time.time() - t0))
        S.compare(self.ref, self.sampler_file(self.tc, "after_refused"), exact=True)
        expect_failure(lambda: self.tc.optim_step({"learning_rate": -1.0}).result(), "a negative learning_rate",
                       "adam_params.learning_rate")
        expect_failure(lambda: self.tc.forward_backward(self.data, "kl").result(), "an unknown loss",
                       "forward_backward_input.loss_fn")
        # A long non-ASCII field name: the message, cut at its size limit, must stay valid
        # UTF-8 for its future to be answered (it once made retrieve_future crash the server).
        odd = T.datum([1, 2, 3], [2, 3, 4])
        odd["loss_fn_inputs"]["\u00e9" * 300] = T.tensor([1.0, 1.0, 1.0])
        expect_failure(lambda: self.tc.forward_backward([odd], "cross_entropy").result(),
                       "a 300-character non-ASCII loss_fn_inputs name", "unknown field")

    def losses(self):
        """Every policy loss back-propagates sum_t c_t * (-logprob_t).  With the
        sampler's logprobs equal to the model's, r = 1 and each loss's update
        equals cross_entropy with weights = advantages, bit for bit; with
        r = e, PPO clips the positive advantages away."""
        self.reset()
        rng = random.Random(3)
        lp = [o["logprobs"]["data"] for o in self.tc.forward(self.data, "cross_entropy").result()["loss_fn_outputs"]]
        self.lp0 = lp  # the initial weights' logprobs (JSON), for sdk025
        adv = [[round(rng.uniform(-1, 1), 3) for _ in x] for x in lp]
        ref, ref_loss = self.native_update("ce_adv", [d | {"loss_fn_inputs": d["loss_fn_inputs"] | {"weights": a}}
                                                      for d, a in zip(self.plain, adv)])
        for loss_fn, cfg in (("importance_sampling", None), ("ppo", None), ("cispo", None), ("dro", {"beta": 0.5})):
            self.reset()
            data = [as_datum(d, logprobs=q, advantages=a) for d, q, a in zip(self.plain, lp, adv)]
            res = self.tc.forward_backward(data, loss_fn, cfg).result()
            if loss_fn == "dro":
                self.dro = (data, cfg, res)  # for sdk025
            # r = 1: importance_sampling and ppo are -sum A; cispo and dro -sum lp*A.
            if loss_fn in ("importance_sampling", "ppo"):
                want = -sum(x for a in adv for x in a)
            else:
                want = -sum(l * x for q, a in zip(lp, adv) for l, x in zip(q, a))
            if abs(res["metrics"]["loss:sum"] - want) > 1e-4 * max(1.0, abs(want)):
                fail("%s at r = 1: loss:sum %r, wanted %r" % (loss_fn, res["metrics"]["loss:sum"], want))
            self.tc.optim_step(ADAM).result()
            S.compare(ref, self.sampler_file(self.tc, loss_fn), exact=True)
        # PPO with q = lp - 1: r = e > 1.2 clips A > 0 (no gradient) and keeps r*A for A < 0.
        e = 2.718281828459045
        self.reset()
        data = [as_datum(d, logprobs=[x - 1.0 for x in q], advantages=a) for d, q, a in zip(self.plain, lp, adv)]
        res = self.tc.forward_backward(data, "ppo").result()
        want = -sum(min(e * x, 1.2 * x) for a in adv for x in a)
        if abs(res["metrics"]["loss:sum"] - want) > 1e-4 * max(1.0, abs(want)):
            fail("ppo at r = e: loss:sum %r, wanted %r" % (res["metrics"]["loss:sum"], want))
        self.tc.optim_step(ADAM).result()
        clipped = [d | {"loss_fn_inputs": d["loss_fn_inputs"] | {"weights": [e * x if x < 0 else 0.0 for x in a]}}
                   for d, a in zip(self.plain, adv)]
        ref2, _ = self.native_update("ppo_clipped_ref", clipped)
        S.compare(ref2, self.sampler_file(self.tc, "ppo_clipped"), rtol=1e-4, atol=1e-6)

    def save_load(self):
        """save_weights is the full state; load_weights with the optimizer
        continues bitwise; without it, the weights come back and Adam starts over."""
        self.reset()
        self.tc.forward_backward(self.data, "cross_entropy").result()
        self.tc.optim_step(ADAM).result()
        ck = self.tc.save_state("ck1").result()
        want = "tinker://%s/weights/ck1" % self.tc.model_id
        if ck.get("path") != want:
            fail("save_weights answered %s, wanted path %s" % (ck, want))
        after1 = self.sampler_file(self.tc, "after1")
        self.tc.forward_backward(self.data, "cross_entropy").result()
        self.tc.optim_step(ADAM).result()
        after2 = self.sampler_file(self.tc, "after2")
        self.tc.load_state_with_optimizer(want).result()
        self.tc.forward_backward(self.data, "cross_entropy").result()
        self.tc.optim_step(ADAM).result()
        S.compare(after2, self.sampler_file(self.tc, "after2_again"), exact=True)
        self.tc.load_state(want, optimizer=False).result()
        S.compare(after1, self.sampler_file(self.tc, "weights_only"), exact=True)
        self.tc.forward_backward(self.data, "cross_entropy").result()
        self.tc.optim_step(ADAM).result()
        a, b = S.read_st(after2), S.read_st(self.sampler_file(self.tc, "fresh_adam"))
        if all(a[k].tobytes() == b[k].tobytes() for k in a):
            fail("load_weights without the optimizer kept Adam's moments (the next step equals the continued one)")
        expect_failure(lambda: self.tc.load_state("tinker://%s/weights/nope" % self.tc.model_id).result(),
                       "load_weights of a missing checkpoint", "nope")
        expect_failure(lambda: self.tc.save_state("../escape").result(), "save_weights with a path", "path")
        # A model_id of ".." cannot leave --checkpoint-dir: it becomes "__".
        expect_failure(lambda: self.tc.load_state("tinker://../weights/ck1").result(),
                       "load_weights of tinker://../weights/ck1", "__/ck1")

    def reserve_seq(self):
        """A seq_id used by a raw request: the client's counter and turn move past it."""
        with self.tc._id_lock:
            seq = self.tc._next_request_id + 1
            self.tc._next_request_id += 1
        with self.tc._turn:
            self.tc._turn_counter += 1
            self.tc._turn.notify_all()
        return seq

    def sample(self, body, accept_proto=False):
        """asample by hand: the future, then retrieve_future (raw bytes when protobuf)."""
        http = self.sc.http
        fut = http.post("/api/v1/asample", dict(body, type="sample")).json()
        if not isinstance(fut.get("request_id"), str):
            fail("asample future %s" % fut)
            return None
        headers = {"Accept": "application/x-protobuf, application/json"} if accept_proto else None
        while True:
            resp = http.post("/api/v1/retrieve_future", {"request_id": fut["request_id"]}, extra_headers=headers)
            if "protobuf" in (resp.content_type or ""):
                return resp.body
            r = resp.json()
            if r.get("type") != "try_again":
                if "sequences" in r and len(fut.get("sample_sequence_ids", [])) != len(r["sequences"]):
                    fail("asample: %d sample_sequence_ids for %d sequences" % (len(fut.get("sample_sequence_ids", [])),
                                                                               len(r["sequences"])))
                return r

    def sampling(self):
        """Sampling sessions read saved sampler weights: greedy samples equal the
        plain /sample at those weights, their logprobs are the model's (a forward
        of the same tokens gives them), and training afterwards changes nothing
        the session samples; stop tokens, seeds, protobuf, and refusals."""
        self.reset()
        path = self.tc.save_weights_for_sampler("for_sampling").result()["path"]
        http = self.sc.http
        sess = http.post("/api/v1/create_sampling_session", {"session_id": self.sc.session_id,
                                                             "sampling_session_seq_id": 0, "model_path": path,
                                                             "type": "create_sampling_session"}).json()
        sid = sess.get("sampling_session_id")
        prompt = [5, 9, 2, 7]
        greedy = {"sampling_session_id": sid, "num_samples": 2, "prompt": {"chunks": [{"type": "encoded_text",
                  "tokens": prompt}]}, "sampling_params": {"max_tokens": 6, "temperature": 0.0}}
        r = self.sample(greedy)
        if r is None or "sequences" not in r:
            fail("asample (greedy) failed: %s" % r)
            return
        a, b = r["sequences"]
        plain = S.ok(self.url, "/sample", {"prompt": prompt, "max_tokens": 6, "temperature": 0})
        if a["tokens"] != b["tokens"] or a["tokens"] != plain["sequences"][0]["tokens"] or a["stop_reason"] != "length":
            fail("greedy asample %s, plain /sample %s (wanted equal)" % (r, plain))
        gen = a["tokens"]
        toks = prompt + gen
        fwd = self.tc.forward([T.datum(toks[:-1], toks[1:])], "cross_entropy").result()
        lp = fwd["loss_fn_outputs"][0]["logprobs"]["data"][len(prompt) - 1:]
        if any(abs(x - y) > 1e-5 * max(1.0, abs(x)) for x, y in zip(lp, a["logprobs"])):
            fail("asample logprobs %s, forward of the same tokens %s" % (a["logprobs"], lp))
        # Prompt logprobs from the prefill (docs/sampling.md): forward's for the
        # prompt's tokens, None for the first; in JSON and in protobuf (field 2, NaN first).
        want_pl = fwd["loss_fn_outputs"][0]["logprobs"]["data"][:len(prompt) - 1]
        close = lambda got: len(got) == len(prompt) and all(abs(x - y) <= 1e-5 * max(1.0, abs(y))
                                                            for x, y in zip(got[1:], want_pl))
        rp = self.sample(dict(greedy, prompt_logprobs=True)) or {}
        pl = rp.get("prompt_logprobs")
        if not pl or pl[0] is not None or not close(pl) or rp.get("sequences") != r["sequences"]:
            fail("asample prompt_logprobs %s, forward of the prompt %s" % (pl, want_pl))
        if "prompt_logprobs" in r:
            fail("asample without prompt_logprobs returned them: %s" % r)
        rawp = self.sample(dict(greedy, prompt_logprobs=True), accept_proto=True)
        f2 = [v for n, w, v in T._pb_fields(rawp) if n == 2] if isinstance(rawp, bytes) else []
        vals = list(struct.unpack("<%df" % (len(f2[0]) // 4), f2[0])) if f2 else []
        if not vals or not math.isnan(vals[0]) or not close(vals):
            fail("protobuf SampleResponse prompt_logprobs %s, forward %s" % (vals, want_pl))
        self.topk_prompt_logprobs(greedy, prompt, want_pl, r["sequences"])
        # Training after the save does not move what the session samples.
        self.tc.forward_backward(self.data, "cross_entropy").result()
        self.tc.optim_step(dict(ADAM, learning_rate=0.05)).result()
        r2 = self.sample(greedy)
        if r2 != r:
            fail("a sampling session followed the live weights: %s then %s" % (r, r2))
        # A stop token ends the sequence (and is kept).
        r3 = self.sample(dict(greedy, num_samples=1, sampling_params={"max_tokens": 6, "temperature": 0,
                                                                     "stop": [gen[2]]}))
        want = gen[:gen.index(gen[2]) + 1]
        if r3["sequences"][0]["tokens"] != want or r3["sequences"][0]["stop_reason"] != "stop":
            fail("stop token %d: %s, wanted %s ending in stop" % (gen[2], r3["sequences"][0], want))
        # Seeds: the same seed, the same samples; temperature 1, top-k, top-p.
        seeded = dict(greedy, num_samples=3, sampling_params={"max_tokens": 8, "temperature": 1.0, "seed": 11,
                                                              "top_k": 20, "top_p": 0.9})
        r4, r5 = self.sample(seeded), self.sample(seeded)
        if r4 != r5:
            fail("the same seed gave different samples: %s vs %s" % (r4, r5))
        # Every rank samples its share of num_samples; test_tinker.sh compares
        # these across -np 1, 2, 3 (each sequence's seed, whichever rank runs it).
        many = dict(seeded, num_samples=7, sampling_params=dict(seeded["sampling_params"], max_tokens=12))
        with open(os.path.join(self.out, "samples.json"), "w") as f:
            json.dump(self.sample(many), f, sort_keys=True)
        # Protobuf SampleResponse when the poll asks for it (SDK >= 0.18.1).
        raw = self.sample(greedy, accept_proto=True)
        seqs = [{k: x for k, _, x in T._pb_fields(v)} for n, w, v in T._pb_fields(raw) if n == 1] if isinstance(raw, bytes) else []
        got = [list(struct.unpack("<%di" % (len(q.get(2, b"")) // 4), q.get(2, b""))) for q in seqs]
        if got != [a["tokens"], b["tokens"]] or any(q.get(1, 0) != 1 for q in seqs):
            fail("protobuf SampleResponse: tokens %s (wanted %s, stop_reason LENGTH)" % (got, [a["tokens"], b["tokens"]]))
        # save_weights_for_sampler without a name opens a session (save_weights_and_get_sampling_client).
        seq = self.reserve_seq()
        fut = http.post("/api/v1/save_weights_for_sampler", {"model_id": self.tc.model_id, "seq_id": seq,
                                                             "type": "save_weights_for_sampler"}).json()
        while True:
            res = http.post("/api/v1/retrieve_future", {"request_id": fut["request_id"]}).json()
            if res.get("type") != "try_again":
                break
        sid2 = res.get("sampling_session_id")
        if not sid2 or not str(res.get("path", "")).startswith("tinker://"):
            fail("save_weights_for_sampler without a name: %s" % res)
        elif "sequences" not in (self.sample(dict(greedy, sampling_session_id=sid2)) or {}):
            fail("asample on the session save_weights_for_sampler opened failed")
        # Refusals name the field.
        for body, field in ((dict(greedy, sampling_session_id="nope"), "sampling_session_id"),
                            (dict(greedy, sampling_params={"stop": ["\n"]}), "sampling_params.stop"),
                            (dict(greedy, prompt_logprobs="yes"), "prompt_logprobs"),
                            (dict(greedy, topk_prompt_logprobs=65), "topk_prompt_logprobs"),
                            (dict(greedy, topk_prompt_logprobs=-1), "topk_prompt_logprobs"),
                            # The prompt's 4 tokens and max_tokens must fit the context (block_size 16).
                            (dict(greedy, sampling_params={"max_tokens": 13}), "sampling_params.max_tokens"),
                            (dict(greedy, prompt={"chunks": [{"type": "encoded_text", "tokens": [1] * 16}]}),
                             "prompt"),
                            (dict(greedy, prompt={"chunks": [{"type": "encoded_text", "tokens": [999]}]}), "prompt")):
            r = self.sample(body)
            if r is None or r.get("category") != "user" or field not in r.get("error", ""):
                fail("asample with a bad %s: %s (wanted a user error naming it)" % (field, r))
        # num_samples is bounded by --max-sample-batch (test_tinker.sh: 7, which
        # the 7 samples above used): one more is refused naming the field, the
        # value and the flag.
        mb = (self.info().get("limits") or {}).get("max_sample_batch")
        if mb != 7:
            fail("GET /info limits.max_sample_batch %s (the server runs with --max-sample-batch 7)" % mb)
        r = self.sample(dict(greedy, num_samples=8)) or {}
        if r.get("category") != "user" or not all(w in r.get("error", "") for w in ("num_samples = 8",
                                                                                      "--max-sample-batch 7")):
            fail("asample with num_samples 8 over --max-sample-batch 7: %s" % r)

    def batched_files(self):
        """asample requests on sampler weights files, in flight at once, decode
        together, one batch per file (docs/sampling.md, "Every rank samples"):
        two files a training step apart, six requests alternating between them
        queued behind a long forward; each gives what it gives alone (tokens;
        logprobs within 1e-4), and GET /info counts the shared passes.  A
        batch that sampled one file's requests from the other's weights fails
        here."""
        self.reset()
        http = self.sc.http
        sids = []
        for k in range(2):
            path = self.tc.save_weights_for_sampler("batched%d" % k).result()["path"]
            sids.append(http.post("/api/v1/create_sampling_session", {
                "session_id": self.sc.session_id, "sampling_session_seq_id": 10 + k, "model_path": path,
                "type": "create_sampling_session"}).json()["sampling_session_id"])
            self.tc.forward_backward(self.data, "cross_entropy").result()
            self.tc.optim_step(dict(ADAM, learning_rate=0.2)).result()
        bodies = [{"sampling_session_id": sids[i % 2], "num_samples": 1 + i % 3,
                   "prompt": {"chunks": [{"type": "encoded_text", "tokens": [3 + i, 7, 1 + 2 * i]}]},
                   "sampling_params": {"max_tokens": 8, "temperature": 1.0 if i % 3 else 0.0, "seed": 70 + i}}
                  for i in range(6)]
        # The last two ask for the prompt's logprobs (and the last the top 2):
        # in the batch their first sequences run on a rank other than 0 at
        # -np 2 and 3 (each rank its run of a batch's sequences, src/serve/sampling.c),
        # which sends them to rank 0 with its block.
        bodies[4]["prompt_logprobs"] = True
        bodies[5]["prompt_logprobs"] = True
        bodies[5]["topk_prompt_logprobs"] = 2

        def batched():
            return ((self.info().get("requests") or {}).get("asample") or {}).get("batched", 0)

        alone = [self.sample(b) for b in bodies]  # one at a time
        other = self.sample(dict(bodies[0], sampling_session_id=sids[1]))
        if any(r is None or "sequences" not in r for r in alone) or other == alone[0]:
            fail("batched_files: request 0 alone on file 0 %s, on file 1 %s (wanted both, different; "
                 "the others %s)" % (alone[0], other, alone[1:]))
            return
        d = {"model_input": {"chunks": [{"tokens": list(range(16))}]},
             "loss_fn_inputs": {"target_tokens": list(range(16))}}
        for n_busy in (4000, 16000, 64000):  # the requests must queue up behind the forward: longer if they did not
            before = batched()
            # A plain forward (one job) runs while the six are posted.
            busy = threading.Thread(target=lambda: S.ok(self.url, "/forward", {"data": [d] * n_busy}))
            busy.start()
            # Post the six only once the ranks run the forward (GET /healthz
            # names it): a fixed pause raced its body's upload and parse.
            waited = time.monotonic() + 60
            while busy.is_alive() and time.monotonic() < waited and \
                    (S.req(self.url, "GET", "/healthz")[1] or {}).get("running") != "forward":
                time.sleep(0.005)
            futs = [http.post("/api/v1/asample", dict(b, type="sample")).json()["request_id"] for b in bodies]
            busy.join()
            together = []
            for rid in futs:
                while True:
                    r = http.post("/api/v1/retrieve_future", {"request_id": rid}).json()
                    if r.get("type") != "try_again":
                        together.append(r)
                        break
            n = batched() - before
            failures = S.FAILURES
            for i, (a, b) in enumerate(zip(together, alone)):
                ta = [q.get("tokens") for q in a.get("sequences", [])]
                tb = [q["tokens"] for q in b["sequences"]]
                worst = max((abs(u - v) for x, y in zip(a.get("sequences", []), b["sequences"])
                             for u, v in zip(x["logprobs"], y["logprobs"])), default=0.0)
                if ta != tb or worst > 1e-4:
                    fail("batched_files: request %d (file %d) in flight with the others gave %s, alone %s "
                         "(logprobs within %.1e)" % (i, i % 2, ta, tb, worst))
                for key in ("prompt_logprobs", "topk_prompt_logprobs"):
                    pa, pb = a.get(key), b.get(key)
                    if key in bodies[i] and pb is None:
                        fail("batched_files: request %d alone: no %s (%s)" % (i, key, b))
                    if (pa is None) != (pb is None) or (pa is not None and (len(pa) != len(pb) or str(pa[0]) != str(pb[0]))):
                        fail("batched_files: request %d: %s in the batch %s, alone %s" % (i, key, pa, pb))
                    elif pa is not None and key == "prompt_logprobs" and \
                            max(abs(u - v) for u, v in zip(pa[1:], pb[1:])) > 1e-4:
                        fail("batched_files: request %d: prompt_logprobs in the batch %s, alone %s" % (i, pa, pb))
                    elif pa is not None and key == "topk_prompt_logprobs" and \
                            ([[t[0] for t in row] for row in pa[1:]] != [[t[0] for t in row] for row in pb[1:]] or
                             max(abs(t[1] - q[1]) for ra, rb in zip(pa[1:], pb[1:]) for t, q in zip(ra, rb)) > 1e-4):
                        fail("batched_files: request %d: topk_prompt_logprobs in the batch %s, alone %s" % (i, pa, pb))
            if n >= 2:
                if S.FAILURES == failures:
                    print("tinker_check: %d of 6 asample requests on two sampler files decoded in shared passes, "
                          "equal to each alone" % n, flush=True)
                return
        fail("batched_files: 6 asample requests queued behind a forward: %d shared decoding passes "
             "(GET /info requests.asample.batched), want >= 2" % n)

    def futures_poll(self):
        """Newer SDKs (0.3x, sample_use_retrieve_futures and sample_cancel_enabled
        on): one retrieve_futures long poll per sampling client reports each
        finished or failed asample once, past the cursor it last got, and only
        to the poll of its own clone (cloned_sampler_id = seq_id // 1e9, the
        clone's number from join_sampling_session); the SDK then fetches the
        result with retrieve_future.  cancel_future takes a queued sample off
        the queue: it never runs (GET /info counts what ran) and fails
        "cancelled"; a done one is left alone.  Bodies as the SDK's
        FuturesRetrieveRequest, CancelFutureRequest and
        JoinSamplingSessionRequest serialise them."""
        http = self.sc.http
        cfg = http.post("/api/v1/client/config", {"sdk_version": "0.38.0"}).json()
        dyn = http.post("/api/v1/client/dynamic_config", {"sdk_version": "0.38.0"}).json()
        if cfg.get("sample_use_retrieve_futures") is not True or dyn.get("sample_cancel_enabled") is not True:
            fail("client/config %s, dynamic_config %s: wanted sample_use_retrieve_futures and "
                 "sample_cancel_enabled true" % (cfg, dyn))
        path = self.tc.save_weights_for_sampler("for_futures").result()["path"]
        sid = http.post("/api/v1/create_sampling_session", {
            "session_id": self.sc.session_id, "sampling_session_seq_id": 30, "model_path": path,
            "type": "create_sampling_session"}).json()["sampling_session_id"]
        prompt = {"chunks": [{"type": "encoded_text", "tokens": [5, 9, 2, 7]}]}

        def asample(seq, **extra):
            body = dict({"sampling_session_id": sid, "seq_id": seq, "num_samples": 1, "prompt": prompt,
                         "sampling_params": {"max_tokens": 4, "temperature": 0.0}, "type": "sample"}, **extra)
            return http.post("/api/v1/asample", body).json()["request_id"]

        def poll(clone, cursor, timeout=None, target_sid=None):
            body = {"target": {"type": "sampling_session", "sampling_session_id": target_sid or sid,
                               "cloned_sampler_id": clone}, "prev_cursor": cursor}
            if timeout is not None:  # the SDK leaves it out (exclude_none)
                body["timeout"] = timeout
            return http.post("/api/v1/retrieve_futures", body, max_retries=0).json()

        def wait_for(clone, cursor, rids):
            """As SessionFuturesPoller: poll from the last cursor until every rid is reported."""
            seen = {}
            deadline = time.monotonic() + 60
            while set(rids) - set(seen) and time.monotonic() < deadline:
                r = poll(clone, cursor)
                if sorted(r) != ["completions", "cursor"] or not isinstance(r["cursor"], int) or r["cursor"] < cursor:
                    fail("retrieve_futures from cursor %d: %s (wanted completions and a cursor not behind)" % (cursor, r))
                    break
                for c in r["completions"]:
                    if c["request_id"] in seen:
                        fail("retrieve_futures reported %s twice" % c["request_id"])
                    seen[c["request_id"]] = c
                cursor = r["cursor"]
            if set(rids) - set(seen):
                fail("retrieve_futures never reported %s (got %s)" % (sorted(set(rids) - set(seen)), seen))
            return seen, cursor

        def result(rid):
            while True:
                r = http.post("/api/v1/retrieve_future", {"request_id": rid}).json()
                if r.get("type") != "try_again":
                    return r

        rid = asample(1)
        seen, cur = wait_for(0, 0, [rid])
        if (seen.get(rid) or {}).get("state") != "finished" or "sequences" not in result(rid):
            fail("a finished asample: reported %s, its result %s" % (seen.get(rid), result(rid)))
        # Nothing new: an empty answer at the same cursor, after the hold (timeout, or --long-poll-seconds 1).
        t0 = time.monotonic()
        r = poll(0, cur, timeout=0.2)
        t1 = time.monotonic()
        r2 = poll(0, cur)
        t2 = time.monotonic()
        if r != {"completions": [], "cursor": cur} or r2 != r or t1 - t0 > 5 or not 0.8 <= t2 - t1 < 10:
            fail("retrieve_futures with nothing new at cursor %d: %s in %.2f s, %s in %.2f s (wanted empty, the "
                 "cursor kept, the hold 0.2 s then the 1 s long poll)" % (cur, r, t1 - t0, r2, t2 - t1))
        # A clone (an unpickled SamplingClient) joins: its samples go to its own poll.
        joins = [http.post("/api/v1/join_sampling_session", {"sampling_session_id": sid,
                                                             "type": "join_sampling_session"}).json()
                 for _ in range(2)]
        if [j.get("client_counter") for j in joins] != [1, 2] or joins[0].get("type") != "join_sampling_session":
            fail("join_sampling_session twice: %s (wanted client_counter 1 then 2)" % joins)
        rid_c = asample(1000000001)
        seen_c, _ = wait_for(1, 0, [rid_c])
        if (seen_c.get(rid_c) or {}).get("state") != "finished" or set(seen_c) != {rid_c}:
            fail("the clone's poll: %s (wanted %s finished alone)" % (seen_c, rid_c))
        r = poll(0, cur, timeout=0.3)
        if any(c["request_id"] == rid_c for c in r.get("completions", [])):
            fail("the original's poll reported the clone's sample: %s" % r)
        # A refused request is reported failed; retrieve_future has the error.
        rid_f = asample(2, topk_prompt_logprobs=65)
        seen, cur = wait_for(0, cur, [rid_f])
        err = result(rid_f)
        if (seen.get(rid_f) or {}).get("state") != "failed" or "topk_prompt_logprobs" not in err.get("error", ""):
            fail("a refused asample: reported %s, its result %s (wanted failed, the error naming the field)"
                 % (seen.get(rid_f), err))
        # cancel_future right after asample: the sample is usually already
        # decoded (the queue is empty, the model tiny), else queued or running.
        # Each state has its own checks; the queued and running ones are
        # checked deterministically in-process (test_serve_queue.c,
        # test_futures_poll_and_cancel).
        ran = lambda: ((self.info().get("requests") or {}).get("asample") or {}).get("count", 0)
        before = ran()
        rid_q = asample(3)
        cancel = http.post("/api/v1/cancel_future", {"request_id": rid_q}).json()
        seen, cur = wait_for(0, cur, [rid_q])
        got, state = result(rid_q), cancel.get("state")
        if sorted(cancel) != ["request_id", "state", "type"] or cancel["request_id"] != rid_q or \
                cancel["type"] != "cancel_future" or state not in ("cancelled", "dropped", "done"):
            fail("cancel_future answered %s" % cancel)
        elif state == "done" and ((seen.get(rid_q) or {}).get("state") != "finished" or "sequences" not in got):
            fail("cancel_future of a finished asample: reported %s, result %s (wanted it kept)" % (seen.get(rid_q), got))
        elif state != "done" and ((seen.get(rid_q) or {}).get("state") != "failed" or
                                  "cancelled by cancel_future" not in got.get("error", "")):
            fail("cancel_future (%s): reported %s, result %s (wanted failed, cancelled)" % (state, seen.get(rid_q), got))
        elif state == "cancelled" and ran() != before:
            fail("a cancelled queued asample ran: asample runs %d -> %d" % (before, ran()))
        print("tinker_check: cancel_future right after asample: %s" % state, flush=True)
        again = http.post("/api/v1/cancel_future", {"request_id": rid}).json()
        if again.get("state") != "done" or "sequences" not in result(rid):
            fail("cancel_future of a finished asample: %s (wanted done, its result kept)" % again)
        # Refusals name the field.
        expect_status(lambda: http.post("/api/v1/cancel_future", {"request_id": "zdp-999999"}, max_retries=0),
                      "cancel_future of an unknown request_id", 404, "request_id")
        expect_status(lambda: poll(0, 0, target_sid="nope"), "retrieve_futures of an unknown session", 404,
                      "target.sampling_session_id")
        expect_status(lambda: poll(0, -1), "retrieve_futures with prev_cursor -1", 400, "prev_cursor")
        expect_status(lambda: http.post("/api/v1/join_sampling_session", {"sampling_session_id": "nope"},
                                        max_retries=0), "join_sampling_session of an unknown session", 404,
                      "sampling_session_id")

    def copy_weights(self):
        """Newer SDKs' ServiceClient.copy_weights: POST copy_weights
        {session_id, model_seq_id, source_path, ttl_seconds?} (CopyWeightsRequest)
        answers at once with {tinker_path} (CopyWeightsResponse): a sampler
        file and a save_state checkpoint copied byte for byte into run
        SESSION:train:SEQ, which weights_info and a sampling session then read;
        ttl_seconds gives the copy its own expiry; a second copy, a bad or
        missing source and an unknown session are refused naming the field."""
        http = self.sc.http
        sid = self.sc.session_id
        runs = {}
        for kind, path in (("sampler_weights", self.tc.save_weights_for_sampler("to_copy").result()["path"]),
                           ("weights", self.tc.save_state("to_copy").result()["path"])):
            r = http.post("/api/v1/copy_weights", {"session_id": sid, "model_seq_id": 7, "source_path": path,
                                                   "ttl_seconds": 3600}, max_retries=0).json()
            want = "tinker://%s:train:7/%s/to_copy" % (sid, kind)
            if r != {"tinker_path": want}:
                fail("copy_weights of %s: %s (wanted {'tinker_path': %r})" % (path, r, want))
                continue
            src = os.path.join(self.ckdir, self.tc.model_id.replace(":", "_"), kind if kind != "weights" else "",
                               "to_copy")
            dst = os.path.join(self.ckdir, "%s_train_7" % sid, kind if kind != "weights" else "", "to_copy")
            if kind == "sampler_weights" and os.path.exists(src + ".safetensors"):
                src, dst = src + ".safetensors", dst + ".safetensors"
            files = lambda root: sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root)
                                        for f in fs) if os.path.isdir(root) else [""]
            read = lambda root, f: open(os.path.join(root, f) if f else root, "rb").read()
            if not os.path.exists(dst) or files(src) != files(dst) or \
                    any(read(src, f) != read(dst, f) for f in files(src)):
                fail("copy_weights: %s is not a byte-for-byte copy of %s" % (dst, src))
            runs[kind] = want
            expiry = os.path.join(self.ckdir, "%s_train_7" % sid, "expires.json")
            if not os.path.exists(expiry) or ("%s/to_copy" % kind) not in open(expiry).read():
                fail("copy_weights with ttl_seconds: no expiry for %s/to_copy in %s" % (kind, expiry))
        if "weights" in runs:
            info = http.post("/api/v1/weights_info", {"tinker_path": runs["weights"]}).json()
            if info.get("base_model") != self.name or info.get("is_lora") is not False:
                fail("weights_info of the copy: %s" % info)
        if "sampler_weights" in runs:
            sess = http.post("/api/v1/create_sampling_session", {
                "session_id": sid, "sampling_session_seq_id": 40, "model_path": runs["sampler_weights"],
                "type": "create_sampling_session"}).json()
            body = {"num_samples": 1, "prompt": {"chunks": [{"type": "encoded_text", "tokens": [5, 9, 2, 7]}]},
                    "sampling_params": {"max_tokens": 4, "temperature": 0.0}}
            a = self.sample(dict(body, sampling_session_id=sess.get("sampling_session_id")))
            b = self.sample(dict(body, model_path=runs["sampler_weights"].replace(
                "%s:train:7" % sid, self.tc.model_id)))
            if not a or "sequences" not in a or a != b:
                fail("sampling the copy %s, the source %s (wanted equal)" % (a, b))
        src = self.tc.save_weights_for_sampler("to_copy2").result()["path"]
        again = {"session_id": sid, "model_seq_id": 7, "source_path": runs.get("weights", src)}
        for body, status, field in ((again, 409, "source_path"),
                                    (dict(again, source_path="/etc/passwd"), 400, "source_path"),
                                    (dict(again, source_path=src.replace("to_copy2", "nothing")), 404, "source_path"),
                                    (dict(again, model_seq_id=-1), 400, "model_seq_id"),
                                    (dict(again, ttl_seconds=0), 400, "ttl_seconds"),
                                    (dict(again, session_id="nobody"), 404, "session_id")):
            expect_status(lambda: http.post("/api/v1/copy_weights", body, max_retries=0),
                          "copy_weights with %s" % {k: body[k] for k in body if body[k] != again.get(k)} or "again",
                          status, field)

    def topk_prompt_logprobs(self, greedy, prompt, want_pl, seqs):
        """Top-k prompt logprobs from the prefill (docs/sampling.md): None first;
        with k = V (64) each row lists every token once, most likely first,
        probabilities summing to 1, each logprob equal to forward's for that
        token (checked column by column); k = 3 gives the first 3 of each row;
        in JSON and in protobuf (field 3, the SDK's sentinel row first)."""
        V = 64
        rk = self.sample(dict(greedy, topk_prompt_logprobs=V)) or {}
        tk = rk.get("topk_prompt_logprobs")
        if not isinstance(tk, list) or len(tk) != len(prompt) or tk[0] is not None or rk.get("sequences") != seqs:
            fail("asample topk_prompt_logprobs=%d: %s" % (V, rk))
            return
        if "prompt_logprobs" in rk:
            fail("asample with topk_prompt_logprobs alone returned prompt_logprobs")
        for t in range(1, len(prompt)):
            ids, lps = [x[0] for x in tk[t]], [x[1] for x in tk[t]]
            if sorted(ids) != list(range(V)) or any(b > a for a, b in zip(lps, lps[1:])):
                fail("top-%d row %d: ids %s logprobs %s (wanted every token once, descending)" % (V, t, ids, lps))
            if abs(sum(math.exp(x) for x in lps) - 1) > 1e-4:
                fail("top-%d row %d: probabilities sum to %g" % (V, t, sum(math.exp(x) for x in lps)))
            own = lps[ids.index(prompt[t])]
            if abs(own - want_pl[t - 1]) > 1e-5 * max(1.0, abs(own)):
                fail("top-%d row %d: the prompt token's logprob %g, forward %g" % (V, t, own, want_pl[t - 1]))
        for j in (0, 1, V // 2, V - 1):
            col = [tk[t][j][0] for t in range(1, len(prompt))]
            fwd = self.tc.forward([T.datum(prompt[:-1], col)], "cross_entropy").result()
            got = fwd["loss_fn_outputs"][0]["logprobs"]["data"]
            want = [tk[t][j][1] for t in range(1, len(prompt))]
            if any(abs(x - y) > 1e-5 * max(1.0, abs(x)) for x, y in zip(got, want)):
                fail("top-k column %d: logprobs %s, forward of those tokens %s" % (j, want, got))
        r3 = self.sample(dict(greedy, topk_prompt_logprobs=3)) or {}
        if r3.get("topk_prompt_logprobs") != [None] + [row[:3] for row in tk[1:]]:
            fail("top-3 prompt logprobs %s, wanted the first 3 of each top-%d row" % (r3.get("topk_prompt_logprobs"), V))
        raw = self.sample(dict(greedy, topk_prompt_logprobs=3), accept_proto=True)
        f3 = [v for n, w, v in T._pb_fields(raw) if n == 3] if isinstance(raw, bytes) else []
        m = {n: v for n, w, v in T._pb_fields(f3[0])} if f3 else {}
        n, k = m.get(4), m.get(3)
        if n != len(prompt) or k != 3:
            fail("protobuf topk_prompt_logprobs: prompt_length %s k %s (wanted %d, 3)" % (n, k, len(prompt)))
            return
        ids = list(struct.unpack("<%di" % (n * k), m.get(1, b"")))
        lps = list(struct.unpack("<%df" % (n * k), m.get(2, b"")))
        if ids[:3] != [0, 0, 0] or lps[:3] != [-99999.0] * 3:
            fail("protobuf topk row 0: %s %s (wanted the sentinel 0, -99999)" % (ids[:3], lps[:3]))
        for t in range(1, n):
            if ids[3 * t:3 * t + 3] != [x[0] for x in tk[t][:3]] or any(
                    abs(a - b[1]) > 1e-6 for a, b in zip(lps[3 * t:3 * t + 3], tk[t][:3])):
                fail("protobuf topk row %d: %s %s, JSON %s" % (t, ids[3 * t:3 * t + 3], lps[3 * t:3 * t + 3], tk[t][:3]))

    def held_open_poll_and_gaps(self):
        """Raw wire: a seq_id posted past a missing one waits; retrieve_future
        holds the poll about --long-poll-seconds, then says try_again; after
        --seq-gap-seconds the server goes on; the missing one, when it comes,
        is refused rather than applied out of order."""
        self.reset()
        http = self.sc.http
        nxt = self.tc._next_request_id + 1
        body = {"forward_backward_input": {"data": self.data[:2], "loss_fn": "cross_entropy"},
                "model_id": self.tc.model_id, "seq_id": nxt + 1}
        fut = http.post("/api/v1/forward_backward", body).json()
        if not isinstance(fut.get("request_id"), str):
            fail("forward_backward future %s: request_id must be a string" % fut)
            return
        # The same (model_id, seq_id) under a new idempotency key: the same future.
        again = http.post("/api/v1/forward_backward", body,
                          extra_headers={"X-Idempotency-Key": "stainless-python-retry-%s" % uuid.uuid4()}).json()
        if again.get("request_id") != fut["request_id"]:
            fail("a retried seq_id got request_id %s, the first %s" % (again, fut))
        t0 = time.time()
        r = http.post("/api/v1/retrieve_future", {"request_id": fut["request_id"], "allow_metadata_only": False}).json()
        waited = time.time() - t0
        if r.get("type") != "try_again" or not 0.8 <= waited <= 2.5:
            fail("retrieve_future of a held request: %s after %.2f s (wanted try_again after ~1 s)" % (r, waited))
        deadline = time.time() + 10
        while r.get("type") == "try_again" and time.time() < deadline:
            r = http.post("/api/v1/retrieve_future", {"request_id": fut["request_id"]}).json()
        if "loss_fn_outputs" not in r:
            fail("the request after a missing seq_id never ran: %s" % r)
        late = dict(body, seq_id=nxt)
        fut = http.post("/api/v1/forward_backward", late).json()
        r = http.post("/api/v1/retrieve_future", {"request_id": fut["request_id"]}).json()
        if r.get("category") != "user" or "arrived after" not in r.get("error", ""):
            fail("a seq_id that came after its successors ran: %s (wanted a user error)" % r)
        # The two seq_ids used here behind the client's back: its counter and turn move on.
        with self.tc._id_lock:
            self.tc._next_request_id += 2
        with self.tc._turn:
            self.tc._turn_counter += 2
            self.tc._turn.notify_all()
        info = self.info()
        if info["pending_backwards"] != -(-2 // self.W):
            fail("pending backwards %s after one 2-datum request" % info["pending_backwards"])
        r = http.post("/api/v1/retrieve_future", {"request_id": "zdp-999999"}).json()
        if r.get("category") != "user":
            fail("retrieve_future of an unknown id: %s" % r)

    def unload(self):
        """unload_model; then a new model, driven by an SDK 0.25 client (sdk025)."""
        hb = self.sc.counters.get("heartbeat_ok", 0)
        if hb < 1:
            fail("no session_heartbeat was accepted (%s)" % self.sc.counters)
        # SDK 0.24 sends Accept: application/x-protobuf too; a JSON request is answered in JSON.
        if not self.sc.accept_proto or self.sc.counters.get("result_proto", 0) != 0:
            fail("the JSON client got %s protobuf results (accept_proto %s); a JSON request must get JSON"
                 % (self.sc.counters.get("result_proto", 0), self.sc.accept_proto))
        mid = self.tc.model_id
        self.tc.unload().result()
        expect_status(lambda: self.tc.optim_step(ADAM).result(), "optim_step after unload_model", 400,
                      "unload_model was called")
        sc2 = T.ServiceClient(self.url, sdk_version="0.25.0", heartbeat_interval=0.3, backoff_base=0.02,
                              outer_backoff_unit=0.05, client_config_overrides={"fwdbwd_max_chunk_len": 2 * self.W})
        tc2 = sc2.create_lora_training_client(self.name, rank=0)
        if tc2.model_id == mid:
            fail("a new model got the old model_id %s" % mid)
        self.sdk025(sc2, tc2)
        newer_sdk_check.run(self, sc2, tc2, ADAM)
        # ServiceClient.close() of newer SDKs: POST sessions/ID/finish; the
        # model detaches at once, so another session's create_model takes
        # the server without waiting for missed heartbeats.
        st, js = S.req(self.url, "POST", "/api/v1/sessions/%s/finish" % sc2.session_id,
                       {"reason": {"type": "interrupted"}})
        if st != 200 or js.get("unloaded_models") != [tc2.model_id] or js.get("reason") != "interrupted":
            fail("finish of the 0.25 session: %s %s" % (st, js))
        expect_status(lambda: tc2.forward(self.data, "cross_entropy").result(), "a request after finish", 400,
                      "finished (reason interrupted)")
        sc3 = T.ServiceClient(self.url, heartbeat_interval=0.3, backoff_base=0.02, outer_backoff_unit=0.05)
        tc3 = sc3.create_lora_training_client(self.name, rank=0)
        expect_failure(lambda: sc2.create_lora_training_client(self.name, rank=0), "create_model of a finished "
                       "session", "finished")
        tc3.unload().result()
        sc3.close()
        sc2.close()
        self.sc.close()

    def sdk025(self, sc, tc):
        """SDK 0.25: forward_backward as protobuf, forward as forward_backward
        with forward_only, results as protobuf.  The same data gives bitwise
        the JSON path's logprobs, update and loss outputs; a refused datum
        names its field as on the JSON path; a malformed body is a 400 naming
        the protobuf field, never a crash."""
        http = sc.http
        # forward: forward_only on /forward_backward; the JSON forward's logprobs; no gradient.
        self.reset()
        fwd = tc.forward(self.data, "cross_entropy")
        res = fwd.result()
        lp = [o["logprobs"]["data"] for o in res["loss_fn_outputs"]]
        if [f32(x) for x in lp] != [f32(x) for x in self.lp0]:
            fail("0.25 forward (protobuf) logprobs differ from the JSON forward's")
        if {p for _, p in tc.sent} != {"/api/v1/forward_backward"}:
            fail("the 0.25 client posted to %s (forward is forward_backward with forward_only)"
                 % sorted({p for _, p in tc.sent}))
        if self.info()["pending_backwards"] != 0:
            fail("a forward_only request left %s backward passes pending" % self.info()["pending_backwards"])
        if sc.counters.get("result_proto", 0) != len(fwd.chunks) or sc.counters.get("result_json", 0) != 1:
            fail("0.25 forward: future counters %s (wanted a protobuf result per chunk, %d)"
                 % (sc.counters, len(fwd.chunks)))
        # The same future polled again: protobuf only when Accept asks for it.
        rid = fwd.futures[0].request_id
        plain = http.post(T.API + "retrieve_future", {"request_id": rid, "allow_metadata_only": False},
                          max_retries=0)
        pb = http.post(T.API + "retrieve_future", {"request_id": rid, "allow_metadata_only": False},
                       max_retries=0, extra_headers={"Accept": T.PROTO_CONTENT_TYPE + ", application/json"})
        if "application/json" not in plain.content_type or T.PROTO_CONTENT_TYPE not in pb.content_type:
            fail("retrieve_future of a protobuf request: %r without Accept protobuf, %r with it"
                 % (plain.content_type, pb.content_type))
        else:
            a, b = plain.json(), T.decode_forward_backward_output_proto(pb.body)
            if not same_outputs(a["loss_fn_outputs"], b["loss_fn_outputs"]) or \
                    abs(a["metrics"]["loss:sum"] - b["metrics"]["loss:sum"]) > 1e-6 * abs(a["metrics"]["loss:sum"]):
                fail("one result, as JSON and as protobuf, differs: %s / %s" % (a["metrics"], b["metrics"]))
        # forward_backward in chunks of 2W (the first posted last), then optim_step: the JSON path's update.
        self.reset()
        fb = tc.forward_backward(self.data, "cross_entropy")
        res = fb.result()
        order = [seq for seq, path in tc.sent][-len(fb.chunks):]
        if len(fb.chunks) > 1 and order[-1] != fb.chunks[0][0]:
            fail("the 0.25 client did not send the first chunk last: %s" % order)
        if len(res["loss_fn_outputs"]) != len(self.data):
            fail("0.25 forward_backward merged %d outputs for %d datums" % (len(res["loss_fn_outputs"]), len(self.data)))
        if abs(res["metrics"]["loss:sum"] - self.ref_loss) > 1e-5 * abs(self.ref_loss):
            fail("0.25 loss:sum %r, the plain request's %r" % (res["metrics"]["loss:sum"], self.ref_loss))
        tc.optim_step(ADAM).result()
        S.compare(self.ref, self.sampler_file(tc, "proto_exact"), exact=True)
        # loss_fn_config through the protobuf map: dro (beta) as on the JSON path.
        data, cfg, want = self.dro
        self.reset()
        got = tc.forward_backward(data, "dro", cfg).result()
        if not same_outputs(got["loss_fn_outputs"], want["loss_fn_outputs"]) or \
                abs(got["metrics"]["loss:sum"] - want["metrics"]["loss:sum"]) > 1e-6 * abs(want["metrics"]["loss:sum"]):
            fail("dro through protobuf: loss:sum %r and outputs, the JSON path %r"
                 % (got["metrics"]["loss:sum"], want["metrics"]["loss:sum"]))
        # Refusals: the request reaches the JSON validation, which names the field.
        bad = list(self.data)
        bad[1] = T.datum([1, 2, 999], [1, 2, 3])
        expect_failure(tc.forward_backward(bad, "cross_entropy").result, "0.25: a token outside the vocabulary",
                       "forward_backward_input.data[1].model_input.chunks[0].tokens[2]")
        image = T.datum([1, 2], [2, 3, 4])
        image["model_input"]["chunks"].append({"type": "image", "data": "iVBORw0KGgo=", "format": "png"})
        expect_failure(tc.forward_backward([image], "cross_entropy").result, "0.25: an image chunk",
                       'chunks[1].type: only "encoded_text" chunks are supported (got "image")')
        sparse = T.datum([1, 2, 3], [2, 3, 4])
        sparse["loss_fn_inputs"]["weights"] = {"data": [1.0], "dtype": "float32", "shape": [1, 3],
                                               "sparse_crow_indices": [0, 1], "sparse_col_indices": [2]}
        expect_failure(tc.forward([sparse], "cross_entropy").result, "0.25: a sparse tensor",
                       "forward_input.data[0].loss_fn_inputs.weights: sparse CSR")
        # Malformed protobuf: a 400 at once that names the field.
        one = T.encode_forward_backward_request_proto(tc.model_id, 99, self.data[:1], "cross_entropy")
        tokens = T._pb_len(1, T._pb_len(1, b"\x01\x00\x00\x00\x02\x00"))       # 6 bytes of int32
        target = T._pb_len(1, b"\x00" * 7) + T._pb_key(3, 0) + T._pb_uvarint(2)  # 7 bytes of int64
        entry = T._pb_len(1, b"target_tokens") + T._pb_len(2, target)
        cases = [
            ("a truncated varint", b"\x0a\x01m\x10\xff\xff", "seq_id: truncated varint"),
            ("a length past the end", one + b"\x1a\x40\x0a\x02", "data: length 64 runs past the end"),
            ("a wrong wire type", b"\x0d\x01\x02\x03\x04" + one, "model_id: wire type 5 (32-bit), expected 2"),
            ("a varint longer than 64 bits", b"\x10" + b"\xff" * 10 + b"\x01", "seq_id: varint longer than 64 bits"),
            ("a group", b"\x1b", "wire type 3 (start-group)"),
            ("int32 tokens cut short", T._pb_len(3, T._pb_len(1, tokens)),
             "data[0].model_input[0].encoded_text.tokens: 6 bytes is not a whole number of int32 tokens"),
            ("a dense tensor cut short", T._pb_len(3, T._pb_len(2, entry)),
             "data[0].loss_fn_inputs.target_tokens.dense: 7 bytes is not a whole number of 8-byte int64"),
        ]
        for what, body, needle in cases:
            self.expect_400(http, body, what, needle)
        self.expect_400(http, one, "a zstd body", "proto_compress_fwdbwd", {"Content-Encoding": "zstd"})
        self.expect_400(http, one, "protobuf to optim_step", "only forward_backward", path="optim_step", status=415)
        # Every prefix and 300 random corruptions of a request (for another model_id, so that
        # nothing runs): a 400 or a future, never a crash.
        whole = T.encode_forward_backward_request_proto("nobody", 1, self.data[:2], "ppo",
                                                        {"clip_low_threshold": 0.9}, True)
        rng = random.Random(7)
        bodies = [whole[:k] for k in range(len(whole))]
        for _ in range(300):
            b = bytearray(whole)
            for _ in range(rng.randint(1, 4)):
                b[rng.randrange(len(b))] = rng.randrange(256)
            bodies.append(bytes(b))
        statuses = {}
        for b in bodies:
            try:
                r = http.post(T.API + "forward_backward", T.ProtoBody(b, {}), max_retries=0)
                statuses[r.status] = statuses.get(r.status, 0) + 1
            except T.APIStatusError as e:
                statuses[e.status] = statuses.get(e.status, 0) + 1
        if set(statuses) - {200, 400}:
            fail("corrupted protobuf bodies: HTTP statuses %s (wanted only 200 and 400)" % statuses)
        if sc.healthz().get("status") != "ok":
            fail("the server is not healthy after corrupted protobuf bodies")
        print("tinker_check: SDK 0.25 protobuf: forward, update and dro bitwise as JSON; %d corrupted bodies: %s"
              % (len(bodies), statuses), flush=True)

    def expect_400(self, http, body, what, needle, headers=None, path="forward_backward", status=400):
        try:
            http.post(T.API + path, T.ProtoBody(body, {}), max_retries=0, extra_headers=headers)
        except T.APIStatusError as e:
            msg = (e.json or {}).get("error", "")
            if e.status != status or needle not in msg:
                fail("protobuf with %s: HTTP %d %r, wanted %d mentioning %r" % (what, e.status, msg, status, needle))
            return
        fail("protobuf with %s: accepted, wanted HTTP %d" % (what, status))


def main(argv):
    if len(argv) != 5:
        print(__doc__)
        return 2
    url, out, W, ckdir = argv[1], argv[2], int(argv[3]), argv[4]
    c = Check(url, out, W, ckdir)
    c.bootstrap()
    chunks = c.exact_update()
    print("tinker_check: %d chunks in parallel (first last) == one plain request, bitwise" % chunks, flush=True)
    c.forward_in_window()
    print("tinker_check: a forward between forward_backward and optim_step changes nothing, bitwise", flush=True)
    c.retries()
    print("tinker_check: lost responses and a late chunk: each request ran once", flush=True)
    c.refused_chunk()
    c.losses()
    print("tinker_check: importance_sampling, ppo, cispo, dro checked", flush=True)
    c.save_load()
    c.sampling()
    c.batched_files()
    print("tinker_check: sampling sessions checked", flush=True)
    c.futures_poll()
    print("tinker_check: retrieve_futures, cancel_future, join_sampling_session checked", flush=True)
    c.copy_weights()
    print("tinker_check: copy_weights checked", flush=True)
    c.held_open_poll_and_gaps()
    c.unload()
    print("tinker_check: %d failure(s)" % S.FAILURES, flush=True)
    return min(S.FAILURES, 100)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
