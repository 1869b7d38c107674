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
  zero3_lora_check.py faults URL | partial URL
        gather failures injected on one rank (see faults() and partial())
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


def check_memory(info):
    """GET /info: the base once per rank, not once per model.  At stage 3 the
    server's rows show its one partition (about base / W: the flat buffer is
    padded to a multiple of 2W) and no whole copy, except the one sampling
    gathered (gathered_whole_bytes, the most held at once: the base); each
    model's rows show no base partition of its own (frozen_bytes 0).  At
    stages 0-2 the whole base, once."""
    stage, W, base = info.get("zero_stage"), info.get("world_size"), info.get("base_bytes", 0)
    rows = info.get("memory", [])
    if len(rows) != W:
        fail("GET /info: %d server memory rows for %d ranks" % (len(rows), W))
    for row in rows:
        r, part, whole = row.get("rank"), row.get("base_partition_bytes"), row.get("base_whole_bytes")
        if stage == 3:
            if not (base // W <= part <= base // W + 8 * W) or whole != 0:
                fail("GET /info rank %s: base_partition_bytes %s, base_whole_bytes %s; wanted about base / W = %d "
                     "and 0" % (r, part, whole, base // W))
            if row.get("gathered_whole_bytes") != base:
                fail("GET /info rank %s: gathered_whole_bytes %s, wanted the base (%d) gathered for sampling"
                     % (r, row.get("gathered_whole_bytes"), base))
        elif part != 0 or whole != base:
            fail("GET /info rank %s: base_partition_bytes %s, base_whole_bytes %s at stage %s; wanted 0 and %d"
                 % (r, part, whole, stage, base))
    per_rank = [row.get("base_partition_bytes", 0) + row.get("base_whole_bytes", 0) for row in rows]
    for m in info.get("models", []):
        for r, row in enumerate(m.get("memory", [])):
            if row.get("frozen_bytes") != 0:
                fail("GET /info model %s rank %d: frozen_bytes %s: the model holds base weights of its own "
                     "(the server's base is shared)" % (m.get("model_id"), r, row.get("frozen_bytes")))
            if r < len(per_rank):
                per_rank[r] += row.get("frozen_bytes", 0)
    # The base's bytes on each rank, all models together: base / W at stage 3,
    # whatever the number of models (K x base / W if each had its own copy).
    want = base // W if stage == 3 else base
    for r, got in enumerate(per_rank):
        if not (want <= got <= want + 8 * W):
            fail("GET /info rank %d: %d bytes of base weights with %d models, wanted about %d"
                 % (r, got, len(info.get("models", [])), want))


def faults(url):
    """Stage 3 with ZDP_TEST_FAIL_GATHER=1:1 (rank 1's first adapter gather
    in each model's engine fails) and ZDP_TEST_FAIL_FROZEN_GATHER=0:2 (rank 0's second gather of the
    shared base fails): each failing request fails on every rank, nothing
    changes, and the next request works."""
    sc = M.client(url)
    name = sc.get_server_capabilities()["supported_models"][0]["model_name"]
    a = sc.create_lora_training_client(name, rank=4, seed=11)
    M.expect_failure(lambda: a.forward_backward(M.DATA_A, "cross_entropy").result(),
                     "forward_backward with rank 1's adapter gather failing", "rank 1")
    M.expect_failure(lambda: a.forward_backward(M.DATA_A, "cross_entropy").result(),
                     "forward_backward with rank 0's base gather failing", "rank 0")
    got = loss(a.forward_backward(M.DATA_A, "cross_entropy").result())
    a.optim_step(ADAM).result()
    # A model created after the failures: its engine's first gather on rank 1
    # fails too (the hook counts per engine), the next request works.
    b = sc.create_lora_training_client(name, rank=2, seed=5)
    M.expect_failure(lambda: b.forward(M.DATA_A, "cross_entropy").result(),
                     "a new model's forward with rank 1's adapter gather failing", "rank 1")
    fresh = loss(b.forward(M.DATA_A, "cross_entropy").result())
    # Fresh adapters (B = 0) leave the base's output: a's first loss that
    # came through equals a fresh model's, so the failures changed nothing.
    if not close(got, fresh):
        fail("after the failed requests: loss %r, a fresh model's %r" % (got, fresh))
    moved = loss(a.forward(M.DATA_A, "cross_entropy").result())
    if close(moved, got):
        fail("the optim_step after the failed requests did not train (loss %r before and after)" % got)
    if not greedy(sc, a, "after-faults"):
        fail("sampling after the failed requests returned nothing")
    check_memory(M.info(url))
    print("zero3_lora_check faults: each injected gather failure failed its request; the next ones worked")


def partial(url):
    """Stage 3 at -np 2 with ZDP_TEST_FAIL_FROZEN_GATHER=0:9: rank 0's 9th
    gather of the shared base fails in the second round's forward of a's
    first forward_backward (DATA_A: 3 datums, 2 rounds at W = 2), after the
    first round added its gradients.  The request fails saying the window
    was dropped, and the steps after it equal a fresh model's: no datum of
    the failed request reached optim_step."""
    sc = M.client(url)
    name = sc.get_server_capabilities()["supported_models"][0]["model_name"]
    a = sc.create_lora_training_client(name, rank=4, seed=11)
    M.expect_failure(lambda: a.forward_backward(M.DATA_A, "cross_entropy").result(),
                     "forward_backward failing in its second round", "dropped on every rank")
    # Then other data (the failed request's gradients would not cancel out
    # of Adam's first, sign-like update) and a second step.
    b = sc.create_lora_training_client(name, rank=4, seed=11)
    got, want = [], []
    for dat in (M.DATA_B, M.DATA_A):
        for tc, out in ((a, got), (b, want)):
            out.append(loss(tc.forward_backward(dat, "cross_entropy").result()))
            tc.optim_step(ADAM).result()
    if got != want:
        fail("the steps after the failed request: losses %r, a fresh model's %r" % (got, want))
    la = loss(a.forward(M.DATA_A, "cross_entropy").result())
    lb = loss(b.forward(M.DATA_A, "cross_entropy").result())
    if la != lb or la == got[1]:
        fail("after the failed request and two steps: loss %r, a fresh model's %r "
             "(before the step %r): the failed request's gradients reached the step" % (la, lb, got[1]))
    print("zero3_lora_check partial: the failed request dropped the window; the steps after it = a fresh model's")


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
    # POST /sample (the plain API) samples the base: at stage 3 gathered for it.
    st, js = M.http(url, "POST", "/sample", {"prompt": PROMPT, "max_tokens": 10, "temperature": 0.0})
    if st != 200 or "sequences" not in js:
        fail("POST /sample of the base -> %s %s" % (st, js))
    else:
        res["tokens"].append(js["sequences"][0]["tokens"])
    for k in range(3):
        ra = a.forward_backward(M.DATA_A, "cross_entropy")
        if k == 1:
            # A third model created, trained and unloaded between a's and b's
            # requests: it borrows the same base and leaves it as it was.
            c = sc.create_lora_training_client(name, rank=3, seed=7)
            rc = c.forward_backward(M.DATA_B, "cross_entropy")
            c.optim_step(ADAM).result()
            res["losses"].append(loss(rc.result()))
            res["losses"].append(loss(c.forward(M.DATA_B, "cross_entropy").result()))
            c.unload().result()
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
    check_memory(M.info(url))
    info = M.info(url)
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
    if len(sys.argv) == 3 and sys.argv[1] == "faults":
        faults(sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] == "partial":
        partial(sys.argv[2])
    elif len(sys.argv) == 5 and sys.argv[1] == "run":
        run(sys.argv[2], sys.argv[3], sys.argv[4])
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        compare(sys.argv[2], sys.argv[3])
    else:
        sys.exit("usage: zero3_lora_check.py run URL CHECKPOINT_DIR OUT.json | compare A.json B.json | faults URL")
    sys.exit(min(FAILURES + M.failures, 100))


if __name__ == "__main__":
    main()
