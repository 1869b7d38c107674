#!/usr/bin/env python3
"""zero3_lora_check.py -- two LoRA models on one `zdp serve` (its default
mode) at ZeRO stage 3 against stage 2 (tests/cli/test_serve_zero3.sh),
through the Tinker protocol (tests/serve/tinker_sdk.py).

  zero3_lora_check.py run URL CHECKPOINT_DIR OUT.json
        two models (rank 4 every target; rank 2 without the head), trained
        interleaved; their losses, their adapters (save_state's
        model.safetensors), greedy samples with each adapter
        (save_weights_for_sampler, then asample), a load_state without the
        optimizer (the loss at the save again), and GET /info's per-model
        frozen_bytes: at stage 3 each model's partition of the base (more
        than 0, less than the whole base when W > 1), 0 at stages 0-2
  zero3_lora_check.py compare A.json B.json
        losses and adapters within fp32 tolerance, greedy tokens equal

Every check that fails prints "FAIL: ..."; the exit status is the failure count.
"""
import array
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import multi_check as M  # noqa: E402

ADAM = dict(M.ADAM, learning_rate=2e-2)
PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]
FAILURES = 0


def fail(msg):
    global FAILURES
    FAILURES += 1
    print("FAIL: " + msg, flush=True)


def loss(res):
    return res["metrics"]["loss:sum"]


def greedy(sc, tc, what):
    path = tc.save_weights_for_sampler(what).result()["path"]
    http = sc.http
    sess = http.post("/api/v1/create_sampling_session", {"session_id": sc.session_id, "sampling_session_seq_id": 0,
                                                         "model_path": path, "type": "create_sampling_session"}).json()
    body = {"sampling_session_id": sess.get("sampling_session_id"), "num_samples": 1, "type": "sample",
            "prompt": {"chunks": [{"type": "encoded_text", "tokens": PROMPT}]},
            "sampling_params": {"max_tokens": 10, "temperature": 0.0}}
    fut = http.post("/api/v1/asample", body).json()
    while True:
        r = http.post("/api/v1/retrieve_future", {"request_id": fut.get("request_id")}).json()
        if r.get("type") != "try_again":
            break
    if "sequences" not in r:
        fail("%s: asample -> %s" % (what, r))
        return []
    return r["sequences"][0]["tokens"]


def floats(raw):
    return array.array("f", raw).tolist()


def run(url, ckdir, out):
    sc = M.client(url)
    name = sc.get_server_capabilities()["supported_models"][0]["model_name"]
    a = sc.create_lora_training_client(name, rank=4, seed=11)
    b = sc.create_lora_training_client(name, rank=2, seed=5, train_unembed=False)
    res = {"losses": [], "tokens": [], "adapters": {}}
    for tc, tag in ((a, "a"), (b, "b")):
        res["tokens"].append(greedy(sc, tc, "fresh-" + tag))
    for k in range(3):
        ra = a.forward_backward(M.DATA_A, "cross_entropy")
        rb = b.forward_backward(M.DATA_B, "cross_entropy")
        oa, ob = a.optim_step(ADAM), b.optim_step(ADAM)
        res["losses"] += [loss(ra.result()), loss(rb.result())]
        oa.result()
        ob.result()
        for tc, tag in ((a, "a"), (b, "b")):
            res["tokens"].append(greedy(sc, tc, "round%d-%s" % (k, tag)))
    for tc, tag in ((a, "a"), (b, "b")):
        tc.save_state("z3").result()
        t = M.tensors(M.ckpt_file(ckdir, tc.model_id, "z3"))
        res["adapters"][tag] = {n: floats(v) for n, v in t.items()}
    # load_state without the optimizer: rank 0 reads, every rank keeps its slice.
    path = b.save_state("s").result()["path"]
    at_save = loss(b.forward(M.DATA_B, "cross_entropy").result())
    b.forward_backward(M.DATA_B, "cross_entropy").result()
    b.optim_step(dict(ADAM, learning_rate=5e-2)).result()
    moved = loss(b.forward(M.DATA_B, "cross_entropy").result())
    b.load_state(path).result()
    again = loss(b.forward(M.DATA_B, "cross_entropy").result())
    if again != at_save or moved == at_save:
        fail("load_state: loss %r after, %r at the save, %r in between (wanted after == at save != between)"
             % (again, at_save, moved))
    res["losses"] += [at_save, again]
    info = M.info(url)
    stage, W, base = info.get("zero_stage"), info.get("world_size"), info.get("base_bytes", 0)
    res["zero_stage"] = stage
    for m in info.get("models", []):
        fz = [row.get("frozen_bytes") for row in m.get("memory", [])]
        if len(fz) != W:
            fail("GET /info model %s: %d memory rows for %d ranks" % (m.get("model_id"), len(fz), W))
        for r, f in enumerate(fz):
            # Stage 3: this rank's partition of the base, about base / W (the
            # flat buffer is padded to a multiple of 2W); none at stages 0-2.
            if stage == 3 and not (base // W <= f <= base // W + 8 * W):
                fail("GET /info model %s rank %d: frozen_bytes %s, wanted about base_bytes / W = %d"
                     % (m.get("model_id"), r, f, base // W))
            if stage != 3 and f != 0:
                fail("GET /info model %s rank %d: frozen_bytes %s at stage %s" % (m.get("model_id"), r, f, stage))
    if len(info.get("models", [])) != 2:
        fail("GET /info lists %d models, wanted 2" % len(info.get("models", [])))
    with open(out, "w") as f:
        json.dump(res, f)


def close(x, y):
    return abs(x - y) <= 1e-5 * max(abs(x), abs(y)) + 1e-6


def compare(pa, pb):
    a, b = json.load(open(pa)), json.load(open(pb))
    if len(a["losses"]) != len(b["losses"]):
        fail("%d losses vs %d" % (len(a["losses"]), len(b["losses"])))
    for k, (x, y) in enumerate(zip(a["losses"], b["losses"])):
        if not close(x, y):
            fail("loss %d: %r (%s) vs %r (%s)" % (k, x, pa, y, pb))
    for tag in ("a", "b"):
        ta, tb = a["adapters"].get(tag, {}), b["adapters"].get(tag, {})
        if sorted(ta) != sorted(tb) or not ta:
            fail("model %s: adapter tensors %s vs %s" % (tag, sorted(ta), sorted(tb)))
        for n in set(ta) & set(tb):
            bad = [i for i, (x, y) in enumerate(zip(ta[n], tb[n])) if not close(x, y)]
            if bad or len(ta[n]) != len(tb[n]):
                fail("model %s tensor %s: %d values differ (first at %s)" % (tag, n, len(bad), bad[:1]))
    if a["tokens"] != b["tokens"]:
        fail("greedy tokens %s (%s) vs %s (%s)" % (a["tokens"], pa, b["tokens"], pb))
    if not any(t != a["tokens"][0] for t in a["tokens"]):
        fail("training never changed the greedy tokens: the comparison would not see a stale adapter")


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "run":
        run(sys.argv[2], sys.argv[3], sys.argv[4])
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        compare(sys.argv[2], sys.argv[3])
    else:
        sys.exit("usage: zero3_lora_check.py run URL CHECKPOINT_DIR OUT.json | compare A.json B.json")
    sys.exit(min(FAILURES + M.failures, 100))


if __name__ == "__main__":
    main()
