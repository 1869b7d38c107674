#!/usr/bin/env python3
"""The RL loop through `zdp serve` (docs/benchmarks-sample.md, "RL loop"):
per iteration, save_weights_for_sampler, then P prompts x S samples x N new
tokens through asample (all P requests in flight at once, every rank
sampling its share of each), group advantages per prompt, one
importance_sampling forward_backward over the P*S sequences and one
optim_step -- the shape of tinker-cookbook's RL recipes, over the Tinker
wire protocol (tests/serve/tinker_sdk.py, no SDK needed).

Where the time goes, per iteration (medians over the iterations after the
first): wall seconds of each phase as the client sees it, and the server's
own execution seconds of each (GET /info "requests": count x mean_exec_ms
before and after), so client wall - server exec = HTTP, polling and queueing
(outside the sampling phase: asample requests that share a batch each count
its whole time).
With --sample-only, only the sampling phase (the -np scaling load): sampled
tokens per second, and the weight matrices the server's packed-weights
store packed during it (/info packed_weights_packs, summed over the ranks:
once per snapshot when the store is shared; 0 with ZDP_SERVE_SHARED_PACKS=0,
where every batch's cache packs its own), and per rank the rows it ran
through the model (prompt rows prefilled, decode rows, prompt rows shared).

usage: serve_rl.py URL [--prompts 8] [--samples 8] [--new 64] [--prompt-len 32]
                       [--iters 3] [--sample-only] [--json OUT]
"""
import argparse
import json
import math
import os
import random
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "serve"))
import tinker_sdk as T  # noqa: E402


def exec_seconds(http):
    """The server's execution seconds so far, by op name."""
    req = http.get("/info").json().get("requests", {})
    return {k: v["count"] * v["mean_exec_ms"] / 1e3 for k, v in req.items()}


def asample_submit(http, body):
    """An asample request's future id (the server queues it at once)."""
    return http.post("/api/v1/asample", dict(body, type="sample")).json()["request_id"]


def asample_result(http, rid):
    while True:
        r = http.post("/api/v1/retrieve_future", {"request_id": rid}).json()
        if r.get("type") != "try_again":
            if "sequences" not in r:
                raise RuntimeError("asample failed: %s" % r)
            return r


def packs(http):
    """GET /info's packed_weights_packs summed over the ranks: weight
    matrices the packed-weights store packed so far (docs/sampling.md)."""
    return sum(r.get("packed_weights_packs", 0) for r in http.get("/info").json().get("memory", []))


def sample_rows(http):
    """GET /info's sampling rows per rank: [prefill, decode, shared] each
    (rows each rank ran through the model while sampling, so far)."""
    return [[r.get("sample_prefill_rows", 0), r.get("sample_decode_rows", 0), r.get("sample_shared_rows", 0)]
            for r in http.get("/info").json().get("memory", [])]


def cpu_seconds(pids):
    """User + system CPU seconds of the processes pids, summed (/proc/PID/stat)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--sample-only", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--pids", default="", help="the server ranks' process ids, comma separated: "
                    "CPU seconds of the sampling phase summed over them (this machine's /proc)")
    a = ap.parse_args()
    sc = T.ServiceClient(a.url, heartbeat_interval=5.0)
    http = sc.http
    info = http.get("/info").json()
    V, W = info["model"]["vocab_size"], info["world_size"]
    # rank 0: a full fine-tune (every weight trains), as a LoRA-less server runs it.
    tc = sc.create_lora_training_client(base_model="zdp-gpt", rank=0)
    rng = random.Random(1)
    prompts = [[rng.randrange(V) for _ in range(a.prompt_len)] for _ in range(a.prompts)]
    pids = [int(x) for x in a.pids.split(",") if x]
    rows = []
    for it in range(a.iters):
        row = {}
        ex0 = exec_seconds(http)
        t = time.time()
        saved = tc.save_weights_for_sampler("rl%d" % it).result()
        sess = http.post("/api/v1/create_sampling_session", {"session_id": sc.session_id,
                         "sampling_session_seq_id": it, "model_path": saved["path"],
                         "type": "create_sampling_session"}).json()["sampling_session_id"]
        row["save_s"] = time.time() - t
        # Sample: every prompt's request in flight at once (all submitted,
        # then their futures awaited, as the SDK's sample_async does).
        packs0 = packs(http)
        rows0 = sample_rows(http)
        cpu0 = cpu_seconds(pids)
        cpu0_each = [cpu_seconds([p]) for p in pids]
        t = time.time()
        rids = [asample_submit(http, {"sampling_session_id": sess, "num_samples": a.samples,
                                      "prompt": {"chunks": [{"type": "encoded_text", "tokens": prompts[i]}]},
                                      "sampling_params": {"max_tokens": a.new, "temperature": 1.0,
                                                          "seed": 1000 * it + i}})
                for i in range(a.prompts)]
        results = [asample_result(http, rid) for rid in rids]
        row["sample_s"] = time.time() - t
        if pids:
            row["sample_cpu_s"] = cpu_seconds(pids) - cpu0
            row["sample_cpu_s_each"] = [round(cpu_seconds([p]) - c, 2) for p, c in zip(pids, cpu0_each)]
        row["packs"] = packs(http) - packs0
        # Per rank: prompt rows prefilled, decode rows, prompt rows copied
        # from a same-prompt sequence (docs/server.md, GET /info).
        row["rows_prefill_decode_shared"] = [[b - a for a, b in zip(r0, r1)] for r0, r1 in zip(rows0, sample_rows(http))]
        n_tok = sum(len(s["tokens"]) for r in results for s in r["sequences"])
        row["sampled_tokens"] = n_tok
        row["sample_tok_s"] = n_tok / row["sample_s"]
        if pids and row["sample_cpu_s"] > 0:
            row["sample_tok_per_cpu_s"] = n_tok / row["sample_cpu_s"]
        if not a.sample_only:
            # Group advantages: reward = the share of even token ids, centred per prompt.
            data = []
            for p, r in zip(prompts, results):
                rewards = [sum(1 for x in s["tokens"] if x % 2 == 0) / max(1, len(s["tokens"])) for s in r["sequences"]]
                mean = sum(rewards) / len(rewards)
                for s, rew in zip(r["sequences"], rewards):
                    toks = p + s["tokens"]
                    n_p = len(p) - 1
                    lp = [0.0] * n_p + s["logprobs"]
                    adv = [0.0] * n_p + [rew - mean] * len(s["tokens"])
                    data.append(T.datum(toks[:-1], toks[1:], logprobs=lp[:len(toks) - 1],
                                        advantages=adv[:len(toks) - 1]))
            t = time.time()
            fb = tc.forward_backward(data, "importance_sampling").result()
            row["forward_backward_s"] = time.time() - t
            t = time.time()
            tc.optim_step({"learning_rate": a.lr}).result()
            row["optim_s"] = time.time() - t
            row["loss"] = fb.get("metrics", {}).get("loss:sum")
        ex1 = exec_seconds(http)
        row["server_exec_s"] = {k: round(ex1[k] - ex0.get(k, 0.0), 4) for k in ex1 if ex1[k] - ex0.get(k, 0.0) > 0}
        wall = sum(row.get(k, 0.0) for k in ("save_s", "sample_s", "forward_backward_s", "optim_s"))
        row["wall_s"] = wall
        # Requests that shared a decoding batch each count the batch's whole
        # time in /info, so the sampling phase is left out of this figure.
        ex = row["server_exec_s"]
        row["http_and_queue_s"] = wall - row["sample_s"] - (sum(ex.values()) - ex.get("info", 0.0) - ex.get("asample", 0.0))
        rows.append(row)
        print("iter %d: %s" % (it, json.dumps(row, sort_keys=True)), flush=True)
    keep = rows[1:] if len(rows) > 1 else rows
    med = {k: statistics.median(r[k] for r in keep) for k in keep[0] if isinstance(keep[0][k], (int, float))}
    execs = {}
    for r in keep:
        for k, v in r["server_exec_s"].items():
            execs.setdefault(k, []).append(v)
    med["server_exec_s"] = {k: statistics.median(v) for k, v in execs.items()}
    out = {"world_size": W, "prompts": a.prompts, "samples": a.samples, "new": a.new,
           "prompt_len": a.prompt_len, "iters": a.iters, "median": med,
           "loadavg": os.getloadavg()}
    print("serve_rl: " + json.dumps(out, sort_keys=True), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1, sort_keys=True)
    sc.close()
    return 0 if all(math.isfinite(r.get("loss", 0.0) or 0.0) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
