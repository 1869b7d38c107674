#!/usr/bin/env python3
"""tinker_client.py -- train a model served by `zdp serve` from Python.

Uses only the standard library.  The requests use the Tinker SDK's data shapes
(Datum, TensorData, loss_fn_outputs, "loss:sum"), sent as plain HTTP + JSON:
zdp serve does not speak the SDK's session/futures protocol yet (docs/server.md).

    source scripts/env.sh
    mpirun -np 2 build/bin/zdp serve --config serve.json --model gpt \\
        --n-layer 2 --n-head 2 --n-embd 16 --vocab-size 256 --block-size 32 --port 8000 &
    python3 examples/tinker_client.py --url http://127.0.0.1:8000 --steps 20

It trains on byte-level text (vocab 256): every step sends the batch as
forward_backward requests of at most --chunk datums each.  The losses are sums,
so chunks add up exactly as one request would.  Then it calls optim_step, prints
the mean loss per token, and at the end saves the weights.
"""
import argparse
import json
import sys
import urllib.error
import urllib.request

TEXT = (b"the quick brown fox jumps over the lazy dog. " * 8 +
        b"pack my box with five dozen liquor jugs. " * 8)


class ZdpServeError(Exception):
    pass


class Client:
    def __init__(self, url):
        self.url = url.rstrip("/")

    def _call(self, method, path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
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
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=8, help="datums per optimizer step")
    ap.add_argument("--chunk", type=int, default=3, help="datums per forward_backward request")
    ap.add_argument("--save", default="zdp-serve-weights.safetensors")
    args = ap.parse_args()

    c = Client(args.url)
    info = c.info()
    T, V = info["model"]["block_size"], info["model"]["vocab_size"]
    if V < 256:
        sys.exit("this example sends bytes: start the server with --vocab-size 256")
    print("server: gpt %s, %d rank(s), ZeRO stage %d, step %d" % (
        {k: info["model"][k] for k in ("n_layer", "n_embd", "block_size")},
        info["world_size"], info["zero_stage"], info["step"]))

    windows = [TEXT[i:i + T + 1] for i in range(0, len(TEXT) - T - 1, T // 2)]
    cursor = 0
    for step in range(args.steps):
        batch = []
        for _ in range(args.batch):
            w = windows[cursor % len(windows)]
            cursor += 1
            batch.append(datum(list(w[:-1]), list(w[1:])))
        loss, tokens = 0.0, 0
        for i in range(0, len(batch), args.chunk):
            out = c.forward_backward(batch[i:i + args.chunk])
            loss += out["metrics"]["loss:sum"]  # sums add up across chunks
            tokens += sum(len(o["logprobs"]["data"]) for o in out["loss_fn_outputs"])
        r = c.optim_step()
        for w in r.get("warnings", []) if step == 0 else []:
            print("  warning:", w)
        print("step %d | loss/token %.4f | grad_norm %.3f | global_samples %d" % (
            r["step"], loss / tokens, r["metrics"]["grad_norm:mean"] or float("nan"),
            r["global_samples"]))
    print(c.save_weights(args.save))


if __name__ == "__main__":
    main()
