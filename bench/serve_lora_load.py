#!/usr/bin/env python3
"""serve_lora_load.py -- request throughput of `zdp serve` with 1, 2 and 4
LoRA models at once, through the official Tinker SDK (bench/run_serve_lora_load.sh
starts the server and makes the SDK importable; docs/benchmarks-serve.md).

  serve_lora_load.py --url URL [--seconds S] [--repeats R] [--ks 1,2,4]

Four LoRA training clients (rank 8, every target) are created first, so
every phase runs with the same models loaded.  A phase uses K of them, one
thread each, for S seconds:
  train   each thread loops forward_backward (4 datums of 64 tokens,
          cross_entropy) + optim_step, submitted together, then awaited:
          one "step" = both requests;
  sample  each thread loops sample(num_samples=4, max_tokens=32,
          temperature 1) on its model's sampler weights (a PEFT folder:
          the adapter applied per sequence).
Phases alternate K (1, 2, 4, then 4, 2, 1, ...) so that a change of load
on the shared machine touches every K alike; the figure per K is the
median over the repeats.  The load average is printed beside each phase.
"""
import argparse
import os
import statistics
import threading
import time

import tinker
from tinker import types


def lcg(seed, n, vocab):
    x, out = seed, []
    for _ in range(n):
        x = (x * 1103515245 + 12345) % (1 << 31)
        out.append(3 + x % (vocab - 3))
    return out


def datum(tokens):
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                       loss_fn_inputs={"target_tokens": tokens[1:]})


def run_phase(kind, clients, samplers, k, seconds, vocab):
    counts = [0] * k
    tokens = [0] * k
    stop = time.monotonic() + seconds
    errors = []

    def worker(i):
        try:
            if kind == "train":
                tc = clients[i]
                data = [datum(lcg(100 * i + j, 65, vocab)) for j in range(4)]
                adam = types.AdamParams(learning_rate=1e-4)
                while time.monotonic() < stop:
                    fb = tc.forward_backward(data, "cross_entropy")
                    op = tc.optim_step(adam)
                    fb.result()
                    op.result()
                    counts[i] += 1
            else:
                sc = samplers[i]
                prompt = types.ModelInput.from_ints(lcg(7 + i, 16, vocab))
                sp = types.SamplingParams(max_tokens=32, temperature=1.0)
                while time.monotonic() < stop:
                    r = sc.sample(prompt, 4, sp).result()
                    counts[i] += 1
                    tokens[i] += sum(len(s.tokens) for s in r.sequences)
        except Exception as e:  # noqa: BLE001 -- reported, the phase is void
            errors.append(f"{kind} client {i}: {type(e).__name__}: {e}")

    t0 = time.monotonic()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(k)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    dt = time.monotonic() - t0
    if errors:
        raise RuntimeError("; ".join(errors))
    return sum(counts) / dt, [c / dt for c in counts], sum(tokens) / dt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ks", default="1,2,4")
    a = ap.parse_args()
    ks = [int(x) for x in a.ks.split(",")]
    sc = tinker.ServiceClient(base_url=a.url)
    base = sc.get_server_capabilities().supported_models[0].model_name
    vocab = 4096
    clients = [sc.create_lora_training_client(base_model=base, rank=8, seed=i) for i in range(max(ks))]
    # One step each, so the adapters differ from the base; then their sampler weights.
    for i, tc in enumerate(clients):
        tc.forward_backward([datum(lcg(i, 65, vocab))], "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    samplers = [tc.save_weights_and_get_sampling_client() for tc in clients]
    res = {(kind, k): [] for kind in ("train", "sample") for k in ks}
    for rep in range(a.repeats):
        order = ks if rep % 2 == 0 else ks[::-1]
        for k in order:
            for kind in ("train", "sample"):
                la = os.getloadavg()[0]
                total, per, tok = run_phase(kind, clients, samplers, k, a.seconds, vocab)
                res[(kind, k)].append((total, per, tok))
                per_s = " ".join(f"{p:.2f}" for p in per)
                extra = f", {tok:.0f} sampled tokens/s" if kind == "sample" else ""
                print(f"repeat {rep} {kind:6s} K={k}: {total:.2f} req/s in all (per model {per_s}){extra}; "
                      f"load {la:.1f} -> {os.getloadavg()[0]:.1f}", flush=True)
    print("\nmedians over the repeats:")
    for kind in ("train", "sample"):
        for k in ks:
            tot = statistics.median(r[0] for r in res[(kind, k)])
            fair = statistics.median(min(r[1]) / max(r[1]) for r in res[(kind, k)])
            tok = statistics.median(r[2] for r in res[(kind, k)])
            extra = f", {tok:.0f} sampled tokens/s" if kind == "sample" else ""
            unit = "steps/s (forward_backward + optim_step)" if kind == "train" else "sample requests/s"
            print(f"  {kind:6s} K={k}: {tot:.2f} {unit} in all, slowest/fastest model {fair:.2f}{extra}")


if __name__ == "__main__":
    main()
