#!/usr/bin/python3
"""The tables of docs/benchmarks.md, "Where zdp stands", from the files
bench/run_cpu_kinds.sh writes into OUT: KIND-gpt.json, KIND-llama.json (the
training benchmarks' medians) and KIND-sample.txt (one key=value line per
sampling run; medians taken here).

usage: python3 bench/kinds_table.py OUT
"""
import json
import os
import re
import statistics
import sys

KINDS = ("avx512", "avx2", "portable")
NAMES = {"avx512": "AVX-512", "avx2": "AVX2 (imitated)", "portable": "no zdp SIMD path (imitated)"}


def training(out):
    rows = []
    for kind in KINDS:
        p = os.path.join(out, f"{kind}-gpt.json")
        if os.path.exists(p):
            t = json.load(open(p))["table"]
            for model in ("gpt-s", "gpt-m"):
                for np_, th in ((2, 1), (1, 2)):
                    r = {e["impl"]: e for e in t if e["model"] == model and e["np"] == np_}
                    if {"zdp2", "torch"} <= r.keys():
                        blas = r["zdp2blas"]["ms"] if "zdp2blas" in r else None
                        rows.append((kind, model, np_, th, r["zdp2"]["ms"], blas, r["torch"]["ms"], r["zdp2"]["mfu"]))
        p = os.path.join(out, f"{kind}-llama.json")
        if os.path.exists(p):
            s = json.load(open(p))["summary"]
            for np_, th in ((2, 1), (1, 2)):
                r = {e["impl"]: e for e in s if e["np"] == np_ and e["threads"] == th}
                if {"zdp", "torch"} <= r.keys():
                    blas = r["zdpblas"]["ms"] if "zdpblas" in r else None
                    rows.append((kind, "SmolLM2-135M", np_, th, r["zdp"]["ms"], blas, r["torch"]["ms"],
                                 r["zdp"]["mfu_rep"]))
    print("| CPU kind | model | ranks x threads | zdp default ms/step | `ZDP_GEMM=blas` | PyTorch "
          "| default vs blas | default vs PyTorch | default, % of sgemm peak |")
    print("|---|---|---|---|---|---|---|---|---|")
    # No ZDP_GEMM=blas run (TRAIN_BLAS=0): off the AVX-512 path the default
    # already sends every product to the BLAS, so it is the same code.
    for kind, model, np_, th, z, b, t, mfu in rows:
        bs, br = (f"{b:.0f}", f"{b / z:.2f}x") if b is not None else ("same code", "1 (same code)")
        print(f"| {NAMES[kind]} | {model} | {np_} x {th} | {z:.0f} | {bs} | {t:.0f} | "
              f"{br} | {t / z:.2f}x | {100 * mfu:.0f}% |")


def sampling(out):
    print("| CPU kind | model | batch | zdp default decode tok/s | `ZDP_GEMM=blas` | PyTorch "
          "| default vs blas | default vs PyTorch | prefill tok/s default / PyTorch |")
    print("|---|---|---|---|---|---|---|---|---|")
    for kind in KINDS:
        p = os.path.join(out, f"{kind}-sample.txt")
        if not os.path.exists(p):
            continue
        runs = {}
        for line in open(p):
            kv = dict(re.findall(r"(\w+)=(\S+)", line))
            if "decode_tok_s" not in kv:
                continue
            key = (kv["model"], int(kv["B"]), kv.get("impl", "torch"))
            runs.setdefault(key, []).append((float(kv["decode_tok_s"]), float(kv["prefill_tok_s"])))
        for model in ("gpt-m", "smollm2"):
            for B in (1, 32):
                med = {}
                for impl in ("zdp", "blas", "torch"):
                    rs = runs.get((model, B, impl))
                    if rs:
                        med[impl] = (statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs))
                if len(med) == 3:
                    z, b, t = med["zdp"], med["blas"], med["torch"]
                    print(f"| {NAMES[kind]} | {model} | {B} | {z[0]:.0f} | {b[0]:.0f} | {t[0]:.0f} | "
                          f"{z[0] / b[0]:.2f}x | {z[0] / t[0]:.2f}x | {z[1]:.0f} / {t[1]:.0f} |")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    training(sys.argv[1])
    print()
    sampling(sys.argv[1])
