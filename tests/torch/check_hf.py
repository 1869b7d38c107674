#!/usr/bin/python3
"""Hugging Face folders and `zdp train --model-dir` against PyTorch.

  check_hf.py --zdp BUILD/bin/zdp [--mpirun MPIEXEC] [--keep DIR]

  train: `zdp init-model` writes a folder; `mpirun zdp train --model-dir` runs
      5 steps on a .npy token array and writes --save-model-dir; the float64
      port tests/torch/llama_ref.py, loaded from the same folder, takes the
      same 5 steps (bench/torch/gpt_torch.py's reference_train: the same
      windows, micro-batch order, loss scaling, clipping and zdp's Adam).
      Per-step losses must agree to rtol 1e-4 and the final weights to a
      relative L2 of 2e-3 per tensor (as check_gpt.py's train, whose
      tolerances these are).  Two runs, as issue 12 asks:
        qwen3 (q/k norm, GQA, head_dim != hidden/heads, tied), -np 2, ZeRO
            stage 2, unmanaged accumulation with --schedule 2,1,3 (windows wrap);
        llama (GQA, attention biases, llama3 rope scaling, untied), -np 3,
            ZeRO stage 1, managed accumulation, G 2.
  layout: a folder zdp writes, sharded (--max-shard-bytes), read by this
      script's own parser of safetensors headers: shard names
      model-0000k-of-0000n, the index's weight_map (every tensor in exactly
      the shard it names) and metadata.total_size, save_pretrained's shard
      filling rule, transformers' names and [out, in] shapes (those of
      llama_ref's parameters), no lm_head.weight when tied, torch_dtype.
  bf16: a BF16 folder written by zdp (init-model --dtype BF16) holds exactly
      torch's round-to-nearest-even of the F32 folder of the same seed; BF16
      and F16 folders written here (Python) load into zdp exactly (train
      --steps 0 --save-model-dir gives back their values as F32); an F32
      folder read and written again by zdp has the same tensors.

Exit status 0 when everything agrees, 1 otherwise.
"""

import argparse
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench", "torch"))
sys.path.insert(0, HERE)

import torch  # noqa: E402

import gpt_torch as gt  # noqa: E402
import llama_ref as lr  # noqa: E402
from check_gpt import parse_step_losses  # noqa: E402
from checklib import Report  # noqa: E402

STEPS = 5


def sh(cmd, rep, label):
    print("  $ " + " ".join(cmd))
    r = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=300)
    if r.returncode != 0:
        rep.check(label, False, f"exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
        return None
    return r.stdout


def write_npy_int32(path, tokens):
    """numpy.save's format 1.0 for a 1-D int32 array, without numpy."""
    n = tokens.numel()
    head = "{'descr': '<i4', 'fortran_order': False, 'shape': (%d,), }" % n
    pad = (64 - (10 + len(head) + 1) % 64) % 64
    head = head + " " * pad + "\n"
    data = struct.pack("<%di" % n, *[int(t) for t in tokens.tolist()])
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(head)) + head.encode() + data)


def read_header(path):
    """A safetensors file's header as JSON, parsed here (no library)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n)), 8 + n


def read_folder(d):
    """{name: tensor} of a folder (single file or index + shards)."""
    single = os.path.join(d, "model.safetensors")
    if os.path.exists(single):
        return gt.read_safetensors(single)[0]
    with open(os.path.join(d, "model.safetensors.index.json")) as f:
        wm = json.load(f)["weight_map"]
    out = {}
    for shard in sorted(set(wm.values())):
        out.update(gt.read_safetensors(os.path.join(d, shard))[0])
    return out


def write_cfg(path, micro, G, W, managed, stage):
    c = {
        "train_batch_size": micro * G * W,
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": G,
        "steps_per_print": 1,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "Adam", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8,
                                                 "weight_decay": 0.1}},
        "zero_optimization": {"stage": stage, "reduce_bucket_size": 3000},
    }
    if not managed:
        c["managed_gradient_accumulation"] = False
    with open(path, "w") as f:
        json.dump(c, f, indent=1)


def ref_model(folder):
    with open(os.path.join(folder, "config.json")) as f:
        cfg = lr.LlamaRefConfig.from_hf(json.load(f))
    m = lr.LlamaForCausalLMRef(cfg)
    m.load_state_dict({k: v.float() for k, v in read_folder(folder).items()}, strict=True)
    return m, cfg


def train_case(a, rep, work, label, shape, W, stage, managed, G, schedule, ntok, T):
    print(f"== train {label}: -np {W}, ZeRO {stage}, "
          f"{'managed, G %d' % G if managed else 'unmanaged, --schedule ' + schedule}")
    folder = os.path.join(work, label + ".init")
    if sh([a.zdp, "init-model"] + shape + ["--seed", "5", "--out", folder], rep,
          f"{label}: init-model") is None:
        return
    m, cfg = ref_model(folder)
    tokens = gt.synthetic_tokens(cfg.vocab_size, ntok, seed=3)
    data = os.path.join(work, label + ".tokens.npy")
    write_npy_int32(data, tokens)
    ds = os.path.join(work, label + ".ds.json")
    write_cfg(ds, 2, G, W, managed, stage)
    out = os.path.join(work, label + ".final")
    cmd = [a.mpirun, "-np", str(W), "--oversubscribe", a.zdp, "train", "--model-dir", folder,
           "--config", ds, "--data", data, "--block-size", str(T), "--steps", str(STEPS),
           "--data-order", "sequential", "--save-model-dir", out, "--progress", "off",
           "--out-dir", os.path.join(work, label + ".out")]
    if schedule:
        cmd += ["--schedule", schedule]
    text = sh(cmd, rep, f"{label}: zdp train")
    if text is None:
        return
    zl = parse_step_losses(text)
    if sorted(zl) != list(range(1, STEPS + 1)):
        rep.check(f"{label}: step lines", False, f"steps {sorted(zl)} in:\n{text[-2000:]}")
        return
    dsc = gt.load_ds_config(ds, W)
    sched = [int(x) for x in schedule.split(",")] if schedule else None
    m.double()
    ref = gt.reference_train(m, tokens, T, W, dsc, STEPS, sched, log=lambda s: None)
    for s in range(1, STEPS + 1):
        rel = abs(zl[s] - ref[s - 1]) / abs(ref[s - 1])
        rep.check(f"{label}: step {s} loss", rel <= 1e-4 + 5e-7 / abs(ref[s - 1]),
                  f"zdp {zl[s]:.6f} torch fp64 {ref[s - 1]:.6f} (rel {rel:.1e})")
    got = read_folder(out)
    worst = 0.0
    for n, p in m.named_parameters():
        if n not in got:
            rep.check(f"{label}: final {n}", False, "missing from --save-model-dir")
            continue
        rel = float((got[n].double() - p.detach()).norm() / max(float(p.norm()), 1e-30))
        worst = max(worst, rel)
        if rel > 2e-3:
            rep.check(f"{label}: final {n}", False, f"relative L2 diff {rel:.2e}")
    extra = sorted(set(got) - {n for n, _ in m.named_parameters()})
    rep.check(f"{label}: final weights", worst <= 2e-3 and not extra,
              f"worst relative L2 diff {worst:.2e} over {len(got)} tensors; extra {extra}")


def check_layout(a, rep, work):
    print("== layout: a sharded folder, read by this script's own header parser")
    d = os.path.join(work, "sharded")
    limit = 6000
    shape = ["--arch", "qwen3", "--layers", "2", "--hidden", "32", "--heads", "4", "--kv-heads",
             "2", "--head-dim", "12", "--ffn", "40", "--vocab", "50", "--tie"]
    if sh([a.zdp, "init-model"] + shape + ["--max-shard-bytes", str(limit), "--out", d], rep,
          "layout: init-model") is None:
        return
    files = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
    n = len(files)
    rep.check("layout: shard names", n > 2 and files == [
        "model-%05d-of-%05d.safetensors" % (k, n) for k in range(1, n + 1)], f"{files}")
    rep.check("layout: no model.safetensors", not os.path.exists(os.path.join(d, "model.safetensors")), "")
    with open(os.path.join(d, "model.safetensors.index.json")) as f:
        index = json.load(f)
    wm = index["weight_map"]
    total, seen, order = 0, {}, []
    for fname in files:
        hdr, _ = read_header(os.path.join(d, fname))
        meta = hdr.pop("__metadata__", {})
        rep.check(f"layout: {fname} metadata", meta.get("format") == "pt", f"{meta}")
        sizes = []
        for name, info in sorted(hdr.items(), key=lambda kv: kv[1]["data_offsets"][0]):
            b, e = info["data_offsets"]
            total += e - b
            sizes.append(e - b)
            seen[name] = (fname, info)
            order.append(name)
        rep.check(f"layout: {fname} within the limit", sum(sizes) <= limit or len(sizes) == 1,
                  f"{sum(sizes)} bytes")
    rep.check("layout: weight_map names every tensor in its shard",
              wm == {k: v[0] for k, v in seen.items()}, f"{len(wm)} entries, {len(seen)} tensors")
    rep.check("layout: metadata.total_size", index["metadata"]["total_size"] == total,
              f"{index['metadata']['total_size']} vs {total}")
    # save_pretrained's rule: a shard closes when the next tensor would pass the limit.
    by_shard = {}
    for name in order:
        by_shard.setdefault(seen[name][0], []).append(name)
    for k in range(n - 1):
        cur = sum(math.prod(seen[t][1]["shape"]) * 4 for t in by_shard[files[k]])
        nxt = by_shard[files[k + 1]][0]
        nb = math.prod(seen[nxt][1]["shape"]) * 4
        rep.check(f"layout: {files[k]} closes before {nxt}", cur + nb > limit,
                  f"{cur} + {nb} bytes vs limit {limit}")
    m, cfg = ref_model(d)
    want = {n_: list(p.shape) for n_, p in m.named_parameters()}
    got = {k: v[1]["shape"] for k, v in seen.items()}
    rep.check("layout: transformers' names and [out, in] shapes", got == want,
              f"{sorted(set(got) ^ set(want))}")
    rep.check("layout: tied, no lm_head.weight", "lm_head.weight" not in got, "")
    with open(os.path.join(d, "config.json")) as f:
        c = json.load(f)
    rep.check("layout: config.json", c["architectures"] == ["Qwen3ForCausalLM"] and
              c["torch_dtype"] == "float32" and c["head_dim"] == 12 and
              c["tie_word_embeddings"] is True, f"{c}")


def check_bf16(a, rep, work):
    print("== bf16: zdp's BF16 files; Python BF16 and F16 folders into zdp; F32 read back")
    shape = ["--arch", "llama", "--layers", "1", "--hidden", "16", "--heads", "4", "--kv-heads",
             "2", "--ffn", "24", "--vocab", "40", "--attention-bias"]
    f32, b16 = os.path.join(work, "f32"), os.path.join(work, "b16")
    for d, dt in ((f32, "F32"), (b16, "BF16")):
        if sh([a.zdp, "init-model"] + shape + ["--seed", "9", "--dtype", dt, "--out", d], rep,
              f"bf16: init-model {dt}") is None:
            return
    w32, w16 = read_folder(f32), read_folder(b16)
    with open(os.path.join(b16, "config.json")) as f:
        rep.check("bf16: torch_dtype", json.load(f)["torch_dtype"] == "bfloat16", "")
    bad = [n for n in w32 if w16[n].dtype != torch.bfloat16 or
           not torch.equal(w16[n], w32[n].to(torch.bfloat16))]
    rep.check("bf16: zdp's BF16 = torch's rounding of the F32 weights", not bad, f"{bad}")

    # BF16 and F16 folders written here (the Python writer), then read by zdp.
    with open(os.path.join(f32, "config.json")) as f:
        c = json.load(f)
    written = {f32: w32}
    for dt, tdt in (("bfloat16", torch.bfloat16), ("float16", torch.float16)):
        py = os.path.join(work, "py-" + dt)
        os.makedirs(py, exist_ok=True)
        c["torch_dtype"] = dt
        with open(os.path.join(py, "config.json"), "w") as f:
            json.dump(c, f)
        gen = torch.Generator().manual_seed(1)
        written[py] = {n: (torch.randn(t.shape, generator=gen) * 0.05).to(tdt)
                       for n, t in w32.items()}
        gt.write_safetensors(os.path.join(py, "model.safetensors"), written[py], {"format": "pt"})
    tokens = gt.synthetic_tokens(40, 400, seed=1)
    data = os.path.join(work, "bf16.npy")
    write_npy_int32(data, tokens)
    ds = os.path.join(work, "bf16.ds.json")
    write_cfg(ds, 2, 1, 1, True, 0)
    for folder, want in written.items():
        name = os.path.basename(folder)
        out = folder + ".back"
        if sh([a.mpirun, "-np", "1", a.zdp, "train", "--model-dir", folder, "--config", ds,
               "--data", data, "--block-size", "8", "--steps", "0", "--save-model-dir", out,
               "--progress", "off", "--out-dir", out + ".metrics"], rep,
              f"bf16: {name} through zdp") is None:
            return
        back = read_folder(out)
        bad = [n for n in want if not torch.equal(back[n], want[n].float())]
        rep.check(f"bf16: {name} folder loads exactly", not bad and set(back) == set(want), f"{bad}")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--zdp", required=True)
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--keep", default=None)
    a = ap.parse_args()
    torch.set_num_threads(1)
    rep = Report()
    with tempfile.TemporaryDirectory() as tmp:
        work = a.keep or tmp
        os.makedirs(work, exist_ok=True)
        check_layout(a, rep, work)
        check_bf16(a, rep, work)
        T = 16
        # 12 windows of 17 tokens; unmanaged 2,1,3,2,1 x W 2 x b 2 = 36 windows: wraps.
        train_case(a, rep, work, "qwen3-np2-stage2-unmanaged",
                   ["--arch", "qwen3", "--layers", "2", "--hidden", "32", "--heads", "4",
                    "--kv-heads", "2", "--head-dim", "12", "--ffn", "48", "--vocab", "64",
                    "--tie", "--rope-theta", "50000", "--rms-norm-eps", "1e-5"],
                   W=2, stage=2, managed=False, G=1, schedule="2,1,3", ntok=12 * T + 1, T=T)
        train_case(a, rep, work, "llama-np3-stage1-managed",
                   ["--arch", "llama", "--layers", "2", "--hidden", "32", "--heads", "4",
                    "--kv-heads", "2", "--ffn", "40", "--vocab", "70", "--no-tie",
                    "--attention-bias", "--max-pos", "64", "--rope-scaling", "llama3:4,1,4,8"],
                   W=3, stage=1, managed=True, G=2, schedule=None, ntok=4000, T=T)
    return rep.finish("check_hf")


if __name__ == "__main__":
    sys.exit(main())
