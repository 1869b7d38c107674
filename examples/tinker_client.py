#!/usr/bin/env python3
"""tinker_client.py -- train a model served by `zdp serve` from Python.

Uses only the standard library.  Two ways to talk to the server:

  --protocol plain   the plain JSON endpoints (/forward_backward, /optim_step,
                     ...): each request is answered when it is done.
  --protocol tinker  the Tinker SDK's wire protocol (/api/v1/...): a session,
                     create_model, and futures -- every training request is
                     answered at once with a request_id and its result is
                     fetched with retrieve_future (held open by the server
                     until the result is ready).  This is what the `tinker`
                     SDK (0.18-0.24) does underneath; with the SDK installed,
                     use it instead (docs/server.md).

    source scripts/env.sh
    mpirun -np 2 build/bin/zdp serve --config serve.json --model gpt --full-finetune \\
        --n-layer 2 --n-head 2 --n-embd 16 --vocab-size 256 --block-size 32 --port 8000 &
    python3 examples/tinker_client.py --url http://127.0.0.1:8000 --steps 20 --protocol tinker

It trains on byte-level text (vocab 256): every step sends the batch as
forward_backward requests of at most --chunk datums each.  The losses are sums,
so chunks add up exactly as one request would.  Then it calls optim_step, prints
the mean loss per token, and at the end saves the weights.
"""
import argparse
import json
import os
import sys
import uuid
import urllib.error
import urllib.request

TEXT = (b"the quick brown fox jumps over the lazy dog. " * 8 +
        b"pack my box with five dozen liquor jugs. " * 8)


class ZdpServeError(Exception):
    pass


# A server started with --api-key-file wants its key on every request; the
# Tinker SDK reads it from TINKER_API_KEY too (it must start with "tml-").
API_KEY = os.environ.get("TINKER_API_KEY", "tml-local")


class Client:
    def __init__(self, url):
        self.url = url.rstrip("/")

    def _call(self, method, path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json", "X-API-Key": API_KEY})
        try:
            with urllib.request.urlopen(req, timeout=600) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            err = json.loads(e.read() or b"{}").get("error", {})
            raise ZdpServeError("%s %s -> HTTP %d: %s (field %s)" % (
                method, path, e.code, err.get("message"), err.get("field"))) from None

    def info(self):
        return self._call("GET", "/info")

    def forward_backward(self, data, loss_fn="cross_entropy"):
        return self._call("POST", "/forward_backward", {"data": data, "loss_fn": loss_fn})

    def forward(self, data):
        return self._call("POST", "/forward", {"data": data, "loss_fn": "cross_entropy"})

    def optim_step(self, learning_rate=1e-4, beta1=0.9, beta2=0.95, eps=1e-12, weight_decay=0.0):
        return self._call("POST", "/optim_step", {"adam_params": {
            "learning_rate": learning_rate, "beta1": beta1, "beta2": beta2, "eps": eps,
            "weight_decay": weight_decay}})

    def save_weights(self, path):
        return self._call("POST", "/save_weights", {"path": path})

    def save_state(self, path):
        return self._call("POST", "/save_state", {"path": path})

    def load_state(self, path):
        return self._call("POST", "/load_state", {"path": path})


class TinkerClient:
    """The Tinker SDK's protocol by hand: every training verb returns a future."""

    def __init__(self, url):
        self.url = url.rstrip("/") + "/api/v1/"
        self.post("client/config", {"sdk_version": "0.24.1"})
        session = self.post("create_session", {"tags": [], "user_metadata": {}, "sdk_version": "0.24.1",
                                                "type": "create_session"})
        if session.get("warning_message"):
            print("server:", session["warning_message"])
        name = self.get("get_server_capabilities")["supported_models"][0]["model_name"]
        fut = self.post("create_model", {"session_id": session["session_id"], "model_seq_id": 0,
                                         "base_model": name, "lora_config": {"rank": 0},
                                         "type": "create_model"})
        self.model_id = self.result(fut)["model_id"]
        self.seq_id = 0  # every training request takes the next one, from 1

    def _call(self, method, path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method, headers={
            "Content-Type": "application/json", "X-API-Key": API_KEY,
            "X-Idempotency-Key": "stainless-python-retry-%s" % uuid.uuid4()})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            raise ZdpServeError("%s %s -> HTTP %d: %s" % (method, path, e.code, e.read().decode())) from None

    def post(self, path, body):
        return self._call("POST", path, body)

    def get(self, path):
        return self._call("GET", path)

    def result(self, future):
        """Polls retrieve_future; the server holds each poll until the result
        is ready (or answers try_again after its long-poll time)."""
        while True:
            r = self.post("retrieve_future", {"request_id": future["request_id"], "allow_metadata_only": False})
            if r.get("type") == "try_again":
                continue
            if "error" in r:
                raise ZdpServeError("%s (%s)" % (r["error"], r.get("category")))
            return r

    def submit(self, path, body):
        self.seq_id += 1
        return self.post(path, dict(body, model_id=self.model_id, seq_id=self.seq_id))

    def forward_backward(self, data, loss_fn="cross_entropy"):
        """Posts the request and returns its future (call result() on it)."""
        return self.submit("forward_backward", {"forward_backward_input": {"data": data, "loss_fn": loss_fn}})

    def optim_step(self, learning_rate=1e-4, beta1=0.9, beta2=0.95, eps=1e-12, weight_decay=0.0):
        return self.submit("optim_step", {"type": "optim_step", "adam_params": {
            "learning_rate": learning_rate, "beta1": beta1, "beta2": beta2, "eps": eps,
            "weight_decay": weight_decay, "grad_clip_norm": 0.0}})

    def save_weights(self, name):
        return self.result(self.submit("save_weights", {"path": name, "type": "save_weights"}))


def datum(tokens, targets):
    """A Tinker Datum: position i of tokens predicts targets[i] (no shift by the server)."""
    return {"model_input": {"chunks": [{"type": "encoded_text", "tokens": tokens}]},
            "loss_fn_inputs": {
                "target_tokens": {"data": targets, "dtype": "int64", "shape": [len(targets)]},
                "weights": {"data": [1.0] * len(targets), "dtype": "float32",
                            "shape": [len(targets)]}}}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--protocol", choices=("plain", "tinker"), default="plain")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=8, help="datums per optimizer step")
    ap.add_argument("--chunk", type=int, default=3, help="datums per forward_backward request")
    ap.add_argument("--save", default="zdp-serve-weights",
                    help="a name inside the server's --checkpoint-dir (plain: NAME.safetensors; tinker: a "
                         "checkpoint name)")
    args = ap.parse_args()

    info = Client(args.url).info()
    T, V = info["model"]["block_size"], info["model"]["vocab_size"]
    if V < 256:
        sys.exit("this example sends bytes: start the server with --vocab-size 256")
    print("server: gpt %s, %d rank(s), ZeRO stage %d, step %d" % (
        {k: info["model"][k] for k in ("n_layer", "n_embd", "block_size")},
        info["world_size"], info["zero_stage"], info["step"]))
    tinker = args.protocol == "tinker"
    c = TinkerClient(args.url) if tinker else Client(args.url)

    windows = [TEXT[i:i + T + 1] for i in range(0, len(TEXT) - T - 1, T // 2)]
    cursor = 0
    for step in range(args.steps):
        batch = []
        for _ in range(args.batch):
            w = windows[cursor % len(windows)]
            cursor += 1
            batch.append(datum(list(w[:-1]), list(w[1:])))
        # Tinker: post every chunk, then collect the futures.
        outs = [c.forward_backward(batch[i:i + args.chunk]) for i in range(0, len(batch), args.chunk)]
        if tinker:
            outs = [c.result(f) for f in outs]
        loss = sum(o["metrics"]["loss:sum"] for o in outs)  # sums add up across chunks
        tokens = sum(len(x["logprobs"]["data"]) for o in outs for x in o["loss_fn_outputs"])
        r = c.optim_step()
        if tinker:
            r = c.result(r)
        for w in r.get("warnings", []) if step == 0 else []:
            print("  warning:", w)
        print("step %d | loss/token %.4f | grad_norm %.3f" % (
            step + 1, loss / tokens, r["metrics"]["grad_norm:mean"] or float("nan")))
    print(c.save_weights(args.save if tinker else args.save + ".safetensors"))


if __name__ == "__main__":
    main()
