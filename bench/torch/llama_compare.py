#!/usr/bin/python3
"""Driver of bench/run_llama_bench.sh: zdp (bench/llama_bench.c) against the
PyTorch reference (llama_bench.py) on a SmolLM2-135M-shaped model, at
-np 2 x 1 thread and -np 1 x 2 threads, alternating: each repetition runs,
per layout, the cblas_sgemm peak, zdp and PyTorch back to back (the order of
zdp and PyTorch flips every repetition), then medians over repetitions.

MFU = tokens/s x FLOPs per token / sgemm peak of the same layout (two
single-threaded processes for -np 2, one process with two threads for
-np 1), against the peak measured in the same repetition (the machine is
shared: a busy moment slows both) and against the best peak of the run.
MFU per CPU-second = the step's FLOPs / (the CPU seconds its processes used,
all ranks' threads) / (sgemm's GFLOP per CPU-second of one core, measured
with the peak in the same repetition): the fraction of
the peak the code reaches while it runs, which on a shared machine the wall
time cannot show (it also counts the time other work held the cores); the
CPU share = CPU time / (cores x wall time) says how much of the machine the
run had.  Spinning at a join counts as CPU time (it is the code's cost).
FLOPs per token = 6 x (matmul parameters) + 12 L T hd NH (attention over the
full T x T square, forward and backward), as llama_bench.c prints it.
--ga G: G micro-batches per optimizer step on every side (zdp's unmanaged
mode, PyTorch's DDP no_sync() for the first G - 1): a "step" is then one
optimizer step of G micro-batches per rank, and tokens/s counts all of them.
G = 1 (the default) is one optimizer step per micro-batch.
Also printed: CPU model and flags, OpenBLAS's core, the load average before
and after each run, the engine's memory report and every rank's peak RSS.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def load():
    return os.getloadavg()[0]


def result(out):
    m = re.search(r"^RESULT (\{.*\})$", out, re.M)
    return json.loads(m.group(1)) if m else None


def run(cmd, env, timeout):
    t0 = time.time()
    l0 = load()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    r = result(p.stdout)
    if p.returncode != 0 or r is None:
        raise RuntimeError(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout[-1500:]}\n{p.stderr[-1500:]}")
    r["load_before"], r["load_after"], r["wall_s"] = round(l0, 2), round(load(), 2), round(time.time() - t0, 1)
    return r


def peak(a, np_, th, env):
    cmd = [a.sgemm_peak, "--threads", str(th), "--procs", str(np_), "--sizes", "1024,2048",
           "--seconds", "1"]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    m = re.search(r"peak_gflops ([0-9.]+)", p.stdout)
    mc = re.search(r"peak_gflops_per_core_cpu ([0-9.]+)", p.stdout)
    # the OpenBLAS core that gave the peak: on an AVX-512 CPU where OpenBLAS
    # runs a narrower core, sgemm_peak also measures SkylakeX (bench/blas_core.h)
    mk = re.search(r"peak_core (\S+)", p.stdout)
    if not m or not mc:
        raise RuntimeError("sgemm_peak: " + p.stdout + p.stderr)
    return float(m.group(1)), float(mc.group(1)), mk.group(1) if mk else "?"


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-bench", required=True)
    ap.add_argument("--base-llama-bench", default=None,
                    help="impl 'base': another llama_bench (e.g. main's) for before/after")
    ap.add_argument("--sgemm-peak", required=True)
    ap.add_argument("--openblas-core", required=True)
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--ga", type=int, default=1, help="micro-batches per optimizer step (G)")
    ap.add_argument("--layouts", default="2x1,1x2")
    ap.add_argument("--impls", default="zdp,torch")
    ap.add_argument("--model", default="", help="extra model flags for both, e.g. '--layers 4'")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if a.base_llama_bench is None and "base" in a.impls.split(","):
        sys.exit("llama_compare: impl 'base' needs --base-llama-bench")

    cpu = open("/proc/cpuinfo").read()
    model = re.search(r"model name\s*:\s*(.*)", cpu).group(1)
    flags = set(re.search(r"flags\s*:\s*(.*)", cpu).group(1).split())
    simd = " ".join(f for f in ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
                                "avx512_bf16", "amx_tile") if f in flags)
    core = subprocess.run([a.openblas_core], capture_output=True, text=True).stdout.strip()
    print(f"# cpu: {model}, {os.cpu_count()} cores; flags: {simd}")
    print(f"# OpenBLAS: {core} (OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', 'unset')}); "
          "the sgemm peak is the best of that core and, on an AVX-512 CPU, SkylakeX's")
    print(f"# load average at start: {load():.2f}")
    print(f"# G = {a.ga} micro-batch(es) of {a.micro} x T per rank per optimizer step", flush=True)
    extra = a.model.split()
    layouts = [tuple(int(x) for x in l.split("x")) for l in a.layouts.split(",")]
    impls = a.impls.split(",")
    rows = {}
    for rep in range(a.reps):
        for np_, th in layouts:
            env = dict(os.environ, OPENBLAS_NUM_THREADS=str(th), OMP_NUM_THREADS=str(th),
                       ZDP_NUM_THREADS=str(th))
            pk, pk_core, pk_name = peak(a, np_, th, env)
            order = impls if rep % 2 == 0 else impls[::-1]
            for impl in order:
                run_env = env
                if impl in ("zdp", "zdpblas", "base"):
                    exe = a.base_llama_bench if impl == "base" else a.llama_bench
                    if impl == "zdpblas":  # every product through cblas_sgemm
                        run_env = dict(env, ZDP_GEMM="blas")
                    # --bind-to none: Open MPI binds each process to one core by
                    # default, so -np 1's two threads would share one core
                    cmd = [a.mpirun, "-np", str(np_), "--bind-to", "none", exe, "--micro", str(a.micro),
                           "--steps", str(a.steps), "--warmup", str(a.warmup)] + extra
                    # main's llama_bench before the --ga option: G = 1 only
                    if a.ga != 1:
                        cmd += ["--ga", str(a.ga)]
                else:
                    cmd = [sys.executable, os.path.join(HERE, "llama_bench.py"), "--micro",
                           str(a.micro), "--steps", str(a.steps), "--warmup", str(a.warmup),
                           "--world-size", str(np_), "--threads", str(th),
                           "--ga", str(a.ga)] + extra
                r = run(cmd, run_env, 3600)
                r["peak_gflops_rep"] = pk
                r["peak_core_cpu_rep"] = pk_core
                r["peak_blas_core_rep"] = pk_name
                rows.setdefault((np_, th, impl), []).append(r)
                print(f"rep {rep} {np_}x{th} {impl}: {r['ms_per_step_median']:.0f} ms/step, "
                      f"cpu {r['cpu_ms_per_step']:.0f} ms/step"
                      + (f" (sys {r['sys_ms_per_step']:.0f}, {r['minflt_per_step']:.0f} page faults)"
                         if "minflt_per_step" in r else "") + ", "
                      f"{r['tokens_per_s']:.1f} tok/s, peak {pk:.1f} GFLOP/s (core {pk_name}; {pk_core:.1f} per core "
                      f"per CPU-s), load "
                      f"{r['load_before']}->{r['load_after']}, loss {r['loss_first']:.4f}->"
                      f"{r['loss_last']:.4f}, rss {r['peak_rss_mib']}", flush=True)
    fpt = None
    for (np_, th, impl), rs in rows.items():
        if impl == "zdp":
            fpt = rs[0]["flops_per_token"]
    print()
    print(f"G = {a.ga}")
    print("| layout | impl | ms/step | tokens/s | zdp / this row | MFU (peak same rep) | MFU (best peak) "
          "| CPU ms/step | CPU share | MFU per CPU-s | zdp / this row per CPU-s | load | peak RSS/rank MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    summary = []
    for np_, th in layouts:
        best_peak = max(r["peak_gflops_rep"] for impl in impls for r in rows.get((np_, th, impl), []))
        tok, fpc = {}, {}
        for impl in impls:
            rs = rows.get((np_, th, impl), [])
            if not rs:
                continue
            t = statistics.median(r["tokens_per_s"] for r in rs)
            tok[impl] = t
            ms = statistics.median(r["ms_per_step_median"] for r in rs)
            mfu_rep = statistics.median(r["tokens_per_s"] * fpt / (r["peak_gflops_rep"] * 1e9) for r in rs) if fpt else float("nan")
            mfu_best = t * fpt / (best_peak * 1e9) if fpt else float("nan")
            # Per CPU-second: the FLOPs of a step over the CPU time the step's
            # processes used (all ranks' threads), against sgemm's GFLOP per
            # CPU-second of one core in the same repetition: what the code
            # reaches while it runs, whatever time other work held the cores.
            cores = np_ * th
            cpu_ms = statistics.median(r["cpu_ms_per_step"] for r in rs)
            share = statistics.median(r["cpu_ms_per_step"] / (cores * r["ms_per_step_median"])
                                      for r in rs)
            mfu_cpu = statistics.median(
                np_ * r["micro_batch"] * r.get("ga", 1) * r["T"] * fpt / (r["cpu_ms_per_step"] * 1e-3)
                / (r["peak_core_cpu_rep"] * 1e9) for r in rs) if fpt else float("nan")
            fpc[impl] = mfu_cpu
            ld = "/".join(f"{r['load_before']:.1f}" for r in rs)
            rss = max(max(r["peak_rss_mib"]) for r in rs)
            # torch's row: zdp / PyTorch; base's row: zdp / base (after / before).
            ratio = f"**{tok['zdp'] / tok[impl]:.2f}x**" if impl != "zdp" and "zdp" in tok else ""
            ratio_cpu = f"**{fpc['zdp'] / fpc[impl]:.2f}x**" if impl != "zdp" and "zdp" in fpc else ""
            print(f"| {np_} x {th} | {impl} | {ms:.0f} | {t:.1f} | {ratio} | {100 * mfu_rep:.1f}% | "
                  f"{100 * mfu_best:.1f}% | {cpu_ms:.0f} | {100 * share:.0f}% | {100 * mfu_cpu:.1f}% | "
                  f"{ratio_cpu} | {ld} | {rss:.0f} |")
            summary.append({"np": np_, "threads": th, "impl": impl, "ms": ms, "tokens_per_s": t,
                            "mfu_rep": mfu_rep, "mfu_best": mfu_best, "best_peak": best_peak,
                            "cpu_ms": cpu_ms, "cpu_share": share, "mfu_cpu": mfu_cpu,
                            "runs": rs})
    z = [r for (n, t, i), rs in rows.items() if i == "zdp" for r in rs]
    if z:
        print("\n# zdp memory report (MiB, rank 0):", json.dumps(z[0]["mem_mib"]))
        print("# zdp forward/backward/optimizer ms (medians per run):",
              [(r["world_size"], r["forward_ms"], r["backward_ms"], r["optimizer_ms"]) for r in z])
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"cpu": model, "flags": simd, "openblas": core, "flops_per_token": fpt,
                       "ga": a.ga,
                       "summary": summary}, f, indent=1)


if __name__ == "__main__":
    main()
