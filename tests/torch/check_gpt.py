#!/usr/bin/python3
"""Cross-check of zdp's GPT-2 against PyTorch (bench/torch/gpt_torch.py).

  check_gpt.py grads --gpt-grads BUILD/tests/gpt_grads [--keep DIR]
      For a few small configurations and fixed tokens: runs gpt_grads (zdp's
      model through the public API) and the PyTorch reference from the same
      weights, and asserts that loss, logits and every parameter gradient
      agree.  Reference: PyTorch in float64 from the fp32 weights (so the
      difference measures zdp's fp32 error); the "torch fp32" column shows
      what PyTorch's own fp32 run differs by, for scale.
      Tolerances: |zdp - ref| <= atol + rtol * |ref| elementwise,
        loss   rtol 1e-5 atol 1e-6
        logits rtol 1e-4 atol 1e-5
        grads  rtol 1e-4 atol 1e-5

  check_gpt.py train --zdp BUILD/bin/zdp --mpirun MPIEXEC [--np 2] [--keep DIR]
      `mpirun -np 2 zdp train --model gpt ... --data-order sequential` for 5
      steps (ZeRO stage 2, AdamW with weight decay, gradient clipping 1.0 so
      that it engages) and the same 5 steps in PyTorch (zdp's FusedAdam
      update, same data order); asserts the per-step losses agree
      (rtol 1e-4) and reports the final weights' difference (relative L2 per
      tensor must stay under 2e-3: Adam divides by sqrt(v), which magnifies
      fp32 rounding in small gradients; fp32 PyTorch itself is at ~3e-4).
      A second run uses unmanaged accumulation with --schedule 2,1,3 on a
      shard short enough that the windows wrap.

Exit status 0 when everything agrees, 1 otherwise.
"""

import argparse
import math
import os
import re
import subprocess
import sys
import tempfile
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench", "torch"))

import torch  # noqa: E402

import gpt_torch as gt  # noqa: E402
from checklib import Report, check_grads_file  # noqa: E402

def model_args(cfg):
    return ["--n-layer", str(cfg.n_layer), "--n-head", str(cfg.n_head), "--n-embd",
            str(cfg.n_embd), "--vocab-size", str(cfg.vocab_size), "--block-size",
            str(cfg.block_size)]


def torch_pass(cfg, params, inputs, targets, dtype):
    m = gt.GPT(cfg, attn_impl="manual").to(dtype)
    with torch.no_grad():
        for name, p in m.named_parameters():
            p.copy_(params[name])
    logits, loss = m(inputs, targets)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in m.named_parameters()}
    return loss.detach(), logits.detach(), grads


def check_init_stats(rep, cfg, params):
    """zdp_gpt_init_params: weights N(0, 0.02), c_proj N(0, 0.02/sqrt(2L)),
    biases 0, LayerNorm weights 1."""
    resid = 0.02 / math.sqrt(2 * cfg.n_layer)
    for name, t in params.items():
        t = t.double()
        if name.endswith(".bias"):
            rep.check(f"init {name}", bool((t == 0).all()), "all zero")
        elif ".ln_" in name or name.startswith("transformer.ln_f"):
            rep.check(f"init {name}", bool((t == 1).all()), "all one")
        else:
            want = resid if name.endswith("c_proj.weight") else 0.02
            std, mean = float(t.std()), float(t.mean())
            n = t.numel()
            # std of a sample std ~ want/sqrt(2n); allow 6 sigma plus a little.
            tol_s = 6 * want / math.sqrt(2 * n) + 1e-4 * want
            tol_m = 6 * want / math.sqrt(n)
            ok = abs(std - want) <= tol_s and abs(mean) <= tol_m
            rep.check(f"init {name}", ok, f"mean {mean:+.2e} std {std:.5f} (want 0, {want:.5f})")


GRAD_CASES = [
    # name, config, B, T, init from ("torch" | "zdp")
    ("L2-H4-C48-V67-T12of16", gt.GPTConfig(2, 4, 48, 67, 16), 3, 12, "torch"),
    ("L1-H1-C32-V256-T8of8", gt.GPTConfig(1, 1, 32, 256, 8), 2, 8, "torch"),
    ("L3-H2-C64-V50-T16of16-zdpinit", gt.GPTConfig(3, 2, 64, 50, 16), 2, 16, "zdp"),
]


def cmd_grads(a, rep, work):
    for name, cfg, B, T, init in GRAD_CASES:
        print(f"== {name}: {cfg}, B={B}, T={T}, weights from {init}")
        g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
        inputs = torch.randint(0, cfg.vocab_size, (B, T), generator=g)
        targets = torch.randint(0, cfg.vocab_size, (B, T), generator=g)
        tok_path = os.path.join(work, f"{name}.tokens.safetensors")
        gt.write_safetensors(tok_path, [("inputs", inputs.to(torch.int32)),
                                        ("targets", targets.to(torch.int32))])
        out_path = os.path.join(work, f"{name}.zdp.safetensors")
        cmd = [a.gpt_grads] + model_args(cfg) + ["--tokens", tok_path, "--out", out_path]
        init_state = None
        if init == "torch":
            m = gt.GPT(cfg)
            m.init_weights(torch.Generator().manual_seed(7))
            # Make LayerNorm affine parameters and biases non-trivial, so
            # their gradients and uses are exercised.
            with torch.no_grad():
                for n_, p in m.named_parameters():
                    if n_.endswith(".bias") or ".ln_" in n_ or "ln_f" in n_:
                        p.add_(0.1 * torch.randn(p.shape, generator=g))
            init_path = os.path.join(work, f"{name}.init.safetensors")
            gt.save_weights(m, init_path)
            init_state = {n_: p.detach().clone() for n_, p in m.named_parameters()}
            cmd += ["--init", init_path]
        else:
            cmd += ["--seed", "42"]
        r = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
        if r.returncode != 0:
            rep.check(f"{name}: gpt_grads", False, f"exit {r.returncode}: {r.stderr.strip()}")
            continue
        print("  " + r.stdout.strip())
        z, _ = gt.read_safetensors(out_path)
        names = gt.param_names(cfg)
        params = {n_: z["param." + n_] for n_ in names}
        if init_state is not None:
            same = all(torch.equal(params[n_], init_state[n_]) for n_ in names)
            rep.check(f"{name}: weights read back", same, "param.* == the --init file, bit for bit")
        else:
            check_init_stats(rep, cfg, params)
        loss64, logits64, grads64 = torch_pass(cfg, {k: v.double() for k, v in params.items()},
                                              inputs, targets, torch.float64)
        loss32, logits32, grads32 = torch_pass(cfg, params, inputs, targets, torch.float32)
        check_grads_file(rep, name, z, names, (loss64, logits64, None, grads64),
                         (loss32, logits32, None, grads32))


STEP_RE = re.compile(r"^step (\d+) \| loss ([-+0-9.eEnaif]+)")


def parse_step_losses(text):
    """{step: loss} from zdp train's rank-0 lines "step N | loss X | ..."."""
    out = {}
    for line in text.splitlines():
        m = STEP_RE.match(line.strip())
        if m:
            out[int(m.group(1))] = float(m.group(2))
    return out


def write_cfg(path, micro, G, W, managed, lr=3e-3, wd=0.1, clip=1.0):
    import json
    c = {
        "train_batch_size": micro * G * W,
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": G,
        "steps_per_print": 1,
        "gradient_clipping": clip,
        "optimizer": {"type": "Adam", "params": {"lr": lr, "betas": [0.9, 0.95], "eps": 1e-8,
                                                 "weight_decay": wd}},
        "zero_optimization": {"stage": 2, "reduce_bucket_size": 5000},
    }
    if not managed:
        c["managed_gradient_accumulation"] = False
    with open(path, "w") as f:
        json.dump(c, f, indent=1)


def train_run(a, rep, work, label, cfg, ntok, micro, G, managed, steps, schedule=None):
    W = a.np
    print(f"== train {label}: {cfg}, -np {W}, micro-batch {micro}, G {G}, "
          f"{'managed' if managed else 'unmanaged, --schedule ' + schedule}, {steps} steps, "
          f"{ntok} tokens")
    cfg_path = os.path.join(work, f"{label}.ds.json")
    write_cfg(cfg_path, micro, G, W, managed)
    tok_path = os.path.join(work, f"{label}.tokens.bin")
    tokens = gt.synthetic_tokens(cfg.vocab_size, ntok, seed=3)
    gt.write_tokens(tok_path, tokens)
    m = gt.GPT(cfg, attn_impl="manual")
    m.init_weights(torch.Generator().manual_seed(11))
    init_path = os.path.join(work, f"{label}.init.safetensors")
    gt.save_weights(m, init_path)
    out_path = os.path.join(work, f"{label}.zdp-final.safetensors")
    cmd = [a.mpirun, "-np", str(W), a.zdp, "train", "--model", "gpt"] + model_args(cfg) + [
        "--config", cfg_path, "--init", init_path, "--data", tok_path,
        "--data-order", "sequential", "--steps", str(steps), "--save-weights", out_path,
        "--out-dir", os.path.join(work, label + ".out"), "--progress", "off"]
    if schedule:
        cmd += ["--schedule", schedule]
    print("  $ " + " ".join(cmd))
    r = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    if r.returncode != 0:
        rep.check(f"{label}: zdp train", False,
                  f"exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
        return
    zl = parse_step_losses(r.stdout)
    if sorted(zl) != list(range(1, steps + 1)):
        rep.check(f"{label}: zdp step lines", False, f"steps {sorted(zl)} in:\n{r.stdout[-2000:]}")
        return
    dsc = gt.load_ds_config(cfg_path, W)
    sched = [int(x) for x in schedule.split(",")] if schedule else None
    m64 = gt.GPT(cfg, attn_impl="manual")
    gt.load_weights(m64, init_path)
    m64.double()
    ref64 = gt.reference_train(m64, tokens, cfg.block_size, W, dsc, steps, sched, log=lambda s: None)
    m32 = gt.GPT(cfg, attn_impl="manual")
    gt.load_weights(m32, init_path)
    ref32 = gt.reference_train(m32, tokens, cfg.block_size, W, dsc, steps, sched, log=lambda s: None)
    print(f"  {'step':>4} {'zdp':>12} {'torch fp64':>12} {'torch fp32':>12} {'rel diff':>9}")
    for s in range(1, steps + 1):
        z, t64, t32 = zl[s], ref64[s - 1], ref32[s - 1]
        rel = abs(z - t64) / abs(t64)
        print(f"  {s:>4} {z:>12.6f} {t64:>12.6f} {t32:>12.6f} {rel:>9.2e}")
        # zdp prints 6 decimals: allow half a unit of the last digit too.
        rep.check(f"{label}: step {s} loss", rel <= 1e-4 + 5e-7 / abs(t64),
                  f"zdp {z:.6f} torch {t64:.6f}")
    if os.path.exists(out_path):
        zw, _ = gt.read_safetensors(out_path)
        worst_rel, worst_abs = 0.0, 0.0
        for n_, p in m64.named_parameters():
            if n_ not in zw:
                rep.check(f"{label}: final {n_}", False, "missing from --save-weights")
                continue
            d = zw[n_].double() - p.detach()
            rel = float(d.norm() / max(float(p.norm()), 1e-30))
            worst_rel, worst_abs = max(worst_rel, rel), max(worst_abs, float(d.abs().max()))
            if rel > 2e-3:
                rep.check(f"{label}: final {n_}", False, f"relative L2 diff {rel:.2e}")
        rep.check(f"{label}: final weights", worst_rel <= 2e-3,
                  f"worst relative L2 diff {worst_rel:.2e}, max|diff| {worst_abs:.2e} "
                  f"(lr {dsc['lr']}, {steps} steps)")
    else:
        rep.check(f"{label}: --save-weights", False, f"{out_path} not written")


def cmd_train(a, rep, work):
    cfg = gt.GPTConfig(2, 4, 64, 256, 32)
    # 5 managed steps: 5 * G(2) * W * b(2) windows of 33 tokens, no wrap.
    train_run(a, rep, work, "stage2-managed", cfg, ntok=20000, micro=2, G=2, managed=True, steps=5)
    # Unmanaged 2,1,3,2,1 micro-batches: 9 * W * 2 windows > 12 windows -> wraps.
    train_run(a, rep, work, "stage2-unmanaged-wrap", cfg, ntok=12 * 32 + 1, micro=2, G=1,
              managed=False, steps=5, schedule="2,1,3")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("grads")
    p.add_argument("--gpt-grads", required=True)
    p.add_argument("--keep", default=None, help="keep the files in this directory")
    p = sub.add_parser("train")
    p.add_argument("--zdp", required=True)
    p.add_argument("--mpirun", default="mpirun")
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--keep", default=None)
    a = ap.parse_args()
    torch.set_num_threads(1)
    rep = Report()
    with tempfile.TemporaryDirectory() as tmp:
        work = a.keep or tmp
        os.makedirs(work, exist_ok=True)
        (cmd_grads if a.cmd == "grads" else cmd_train)(a, rep, work)
    return rep.finish(f"check_gpt {a.cmd}", limit=40)


if __name__ == "__main__":
    sys.exit(main())
