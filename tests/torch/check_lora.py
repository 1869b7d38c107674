#!/usr/bin/python3
"""LoRA (`zdp train --model-dir --lora-rank`, `zdp lora merge`) against PEFT's
math in PyTorch, float64, on tests/torch/llama_ref.py.

  check_lora.py --zdp BUILD/bin/zdp [--mpirun MPIEXEC] [--keep DIR]

The reference wraps llama_ref's model as PEFT does: every targeted
nn.Linear returns W x + b + (alpha / r) B (A x) (the tied or untied lm_head
likewise on the output projection only), the base's weights frozen; only A
and B are parameters of the optimizer.  Per case:

  grads: a random adapter (A and B non-zero) written here as a PEFT folder;
      `zdp train --adapter` takes one SGD step (lr 1, no momentum, no
      clipping, no weight decay) and writes the adapter back, so the adapter
      gradient is the difference; it must equal the reference's gradient on
      the same micro-batches to a relative L2 of 3e-4 per tensor (fp32
      through two blocks with alpha / r up to 11; measured <= 1.4e-4).
  train: 5 steps of zdp's Adam from zdp's own initialisation (written by
      --steps 0 --save-adapter-dir) against bench/torch/gpt_torch.py's
      reference_train on the wrapped model: per-step losses to rtol 1e-4,
      final adapters to a relative L2 of 2e-3 per tensor (check_hf.py's
      tolerances); the base folder's files are unchanged.
  merge: `zdp lora merge` of the trained adapter equals W + (alpha/r) B A
      computed here for every targeted weight (relative 1e-6), the other
      tensors bitwise; a tied head comes out as lm_head.weight, the embedding
      unchanged.

Cases: qwen3 (tied, GQA, q/k norm) every target at -np 1 ZeRO 0 managed G 2
and -np 2 ZeRO 2 unmanaged --schedule 2,1,3; llama (untied, biases, llama3
rope) attn+mlp at -np 3 ZeRO 1 managed G 2; GPT-2 (a gpt2 folder written
here from bench/torch/gpt_torch.py's model; Conv1D sites, fan_in_fan_out)
attn+mlp at -np 2 ZeRO 1 unmanaged --schedule 1,2; single modules (PEFT's
target_modules in part): llama q_proj, v_proj, down_proj at -np 2 ZeRO 2
managed G 2, GPT-2 attn.c_attn alone at -np 1.  Exit 0 when all agree.
"""

import argparse
import hashlib
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench", "torch"))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import gpt_torch as gt  # noqa: E402
from check_gpt import parse_step_losses  # noqa: E402
from checklib import Report  # noqa: E402
from check_hf import read_folder, ref_model, sh, write_npy_int32  # noqa: E402

STEPS = 5
T = 16
GROUPS = {"attn": ("q_proj", "k_proj", "v_proj", "o_proj"),
          "mlp": ("gate_proj", "up_proj", "down_proj"), "unembed": ("lm_head",)}
GPT_GROUPS = {"attn": ("attn.c_attn", "attn.c_proj"), "mlp": ("mlp.c_fc", "mlp.c_proj")}


def conv1d_forward(conv, a, b, s):
    """GPT-2's Conv1D (weight [in, out]) with PEFT's fan_in_fan_out adapter."""
    return lambda x: torch.addmm(conv.bias, x.reshape(-1, x.shape[-1]), conv.weight).view(
        x.shape[:-1] + (conv.weight.shape[1],)) + F.linear(F.linear(x, a), b) * s


class LoraRef(torch.nn.Module):
    """PEFT's LoRA over a frozen llama_ref model; parameters: the adapters only."""

    def __init__(self, base, adapters, alpha, r):
        super().__init__()
        object.__setattr__(self, "base", base)  # not a submodule: its weights are not ours
        for p in base.parameters():
            p.requires_grad_(False)
        self.names = sorted(adapters)
        self.ps = torch.nn.ParameterList(
            [torch.nn.Parameter(adapters[n].double().clone()) for n in self.names])
        by = dict(zip(self.names, self.ps))
        s = alpha / r

        def pair(mod_name):
            a = by.get(f"base_model.model.{mod_name}.lora_A.weight")
            return (a, by[f"base_model.model.{mod_name}.lora_B.weight"]) if a is not None else None

        for mod_name, mod in base.named_modules():
            ab = pair(mod_name)
            if ab is None or mod_name == "lm_head":
                if "forward" in vars(mod):  # an earlier wrapper's
                    del mod.forward
                continue
            if isinstance(mod, gt.Conv1D):
                mod.forward = conv1d_forward(mod, *ab, s)
            else:
                mod.forward = (lambda lin, a, b: lambda x: F.linear(x, lin.weight, lin.bias) +
                               F.linear(F.linear(x, a), b) * s)(mod, *ab)
        head = pair("lm_head")
        if head is not None:
            # llama_ref computes logits = F.linear(h, head_weight()): the adapter
            # on the output projection (tied or not) adds s * B A to that weight.
            orig = type(base).head_weight  # the class's: an earlier wrapper's patch is not ours
            base.head_weight = lambda: orig(base) + (head[1] @ head[0]) * s
        elif "head_weight" in vars(base):
            del base.head_weight

    def forward(self, x, y=None):
        return self.base(x, y)

    def adapters(self):
        return {n: p.detach() for n, p in zip(self.names, self.ps)}


def expand(targets, groups):
    """Targets as module names: a group (attn, mlp, unembed) its modules, a
    module (q_proj, attn.c_attn) itself."""
    return [m for g in targets for m in groups.get(g, (g,))]


def write_adapter(folder, tensors, r, alpha, targets, gpt):
    os.makedirs(folder, exist_ok=True)
    gt.write_safetensors(os.path.join(folder, "adapter_model.safetensors"),
                         {n: t.float() for n, t in tensors.items()}, {"format": "pt"})
    mods = expand(targets, {**GROUPS, **GPT_GROUPS} if gpt else GROUPS)
    with open(os.path.join(folder, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": r, "lora_alpha": alpha,
                   "target_modules": mods, "bias": "none", "fan_in_fan_out": gpt}, f)


def read_adapter(folder):
    return gt.read_safetensors(os.path.join(folder, "adapter_model.safetensors"))[0]


def adapter_shapes(m, r, targets):
    """PEFT's names and shapes for llama_ref model m."""
    out = {}
    mods = set(expand(targets, GROUPS))
    gmods = set(expand(targets, GPT_GROUPS))
    for name, mod in m.named_modules():
        leaf = name.split(".")[-1]
        if leaf in mods and isinstance(mod, torch.nn.Linear):
            out[f"base_model.model.{name}.lora_A.weight"] = (r, mod.in_features)
            out[f"base_model.model.{name}.lora_B.weight"] = (mod.out_features, r)
        if isinstance(mod, gt.Conv1D) and ".".join(name.split(".")[-2:]) in gmods:
            n_in, n_out = mod.weight.shape
            out[f"base_model.model.{name}.lora_A.weight"] = (r, n_in)
            out[f"base_model.model.{name}.lora_B.weight"] = (n_out, r)
    if "lm_head" in mods:
        V, H = m.head_weight().shape
        out["base_model.model.lm_head.lora_A.weight"] = (r, H)
        out["base_model.model.lm_head.lora_B.weight"] = (V, r)
    return out


def write_cfg(path, micro, G, W, managed, stage, sgd):
    opt = ({"type": "SGD", "params": {"lr": 1.0}} if sgd else
           {"type": "Adam", "params": {"lr": 1e-2, "betas": [0.9, 0.95], "eps": 1e-8,
                                       "weight_decay": 0.1}})
    c = {"train_batch_size": micro * G * W, "train_micro_batch_size_per_gpu": micro,
         "gradient_accumulation_steps": G, "steps_per_print": 1,
         "gradient_clipping": 0.0 if sgd else 1.0, "optimizer": opt,
         "zero_allow_untested_optimizer": True,
         "zero_optimization": {"stage": stage, "reduce_bucket_size": 700}}
    if not managed:
        c["managed_gradient_accumulation"] = False
    with open(path, "w") as f:
        json.dump(c, f, indent=1)


def ref_grads(model, tokens, W, dsc, n):
    """The first step's gradient as zdp train takes it: n micro-batches per
    rank, each loss / (n * W)."""
    b = dsc["micro_batch"]
    nwin = gt.n_windows(tokens.numel(), T)
    for p in model.parameters():
        p.grad = None
    for g in range(n):
        for r in range(W):
            x, y = gt.make_batch(tokens, gt.sequential_windows(g, r, W, b, nwin), T)
            _, loss = model(x, y)
            (loss / (n * W)).backward()
    return {nm: p.grad.detach().clone() for nm, p in zip(model.names, model.ps)}


def digest(folder):
    h = hashlib.sha256()
    for f in sorted(os.listdir(folder)):
        with open(os.path.join(folder, f), "rb") as fh:
            h.update(f.encode() + fh.read())
    return h.hexdigest()


def run_case(a, rep, work, label, shape, targets, r, alpha, W, stage, managed, G, schedule):
    print(f"== {label}: r {r}, alpha {alpha}, {','.join(targets)}; -np {W}, ZeRO {stage}, "
          f"{'managed, G %d' % G if managed else 'unmanaged, --schedule ' + schedule}")
    folder = os.path.join(work, label + ".base")
    gpt = shape[0] == "gpt2"
    if gpt:  # a GPT-2 folder written here: config.json + GPT2LMHeadModel's tensors
        cfg = gt.GPTConfig(**shape[1])
        m = gt.GPT(cfg)
        m.init_weights(torch.Generator().manual_seed(5))
        with torch.no_grad():  # wider than 0.02: gradients the check can see
            for n, p in m.named_parameters():
                if n.endswith(".weight") and p.dim() == 2:
                    p.mul_(8.0)
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump({"model_type": "gpt2", "n_layer": cfg.n_layer, "n_head": cfg.n_head,
                       "n_embd": cfg.n_embd, "vocab_size": cfg.vocab_size,
                       "n_positions": cfg.block_size}, f)
        gt.write_safetensors(os.path.join(folder, "model.safetensors"),
                             [(n, p.detach().float()) for n, p in m.named_parameters()],
                             {"format": "pt"})
        m = gt.GPT(cfg)
        m.load_state_dict({n: t.float() for n, t in read_folder(folder).items()}, strict=True)
        vocab = cfg.vocab_size
    else:
        if sh([a.zdp, "init-model"] + shape + ["--seed", "5", "--out", folder], rep,
              f"{label}: init-model") is None:
            return
        m, cfg = ref_model(folder)
        vocab = cfg.vocab_size
    base_digest = digest(folder)
    m.double()
    tokens = gt.synthetic_tokens(vocab, 4000, seed=3)
    data = os.path.join(work, label + ".npy")
    write_npy_int32(data, tokens)
    mp = [a.mpirun, "-np", str(W), "--oversubscribe", a.zdp, "train", "--model-dir", folder,
          "--data", data, "--block-size", str(T), "--progress", "off", "--val-every", "0",
          "--out-dir", os.path.join(work, label + ".out")]
    if schedule:
        mp += ["--schedule", schedule]
    sched = [int(x) for x in schedule.split(",")] if schedule else None

    # grads: one SGD step (lr 1) from a random adapter.
    gen = torch.Generator().manual_seed(11)
    a0 = {n: torch.randn(s, generator=gen, dtype=torch.float64) * 0.2
          for n, s in adapter_shapes(m, r, targets).items()}
    a0 = {n: t.float().double() for n, t in a0.items()}  # what the F32 file holds
    a0_dir, a1_dir = os.path.join(work, label + ".a0"), os.path.join(work, label + ".a1")
    write_adapter(a0_dir, a0, r, alpha, targets, gpt)
    sgd = os.path.join(work, label + ".sgd.json")
    write_cfg(sgd, 2, G, W, managed, stage, sgd=True)
    if sh(mp + ["--config", sgd, "--steps", "1", "--adapter", a0_dir, "--save-adapter-dir",
                a1_dir], rep, f"{label}: zdp train --adapter (SGD step)") is None:
        return
    a1 = read_adapter(a1_dir)
    n0 = sched[0] if sched else G
    want = ref_grads(LoraRef(m, a0, alpha, r), tokens, W, {"micro_batch": 2}, n0)
    rep.check(f"{label}: adapter tensors", sorted(a1) == sorted(a0), f"{sorted(set(a1) ^ set(a0))}")
    worst = 0.0
    for n, g in want.items():
        got = a0[n] - a1[n].double()
        rel = float((got - g).norm() / max(float(g.norm()), 1e-30))
        worst = max(worst, rel)
        if rel > 3e-4 or float(g.norm()) == 0.0:
            rep.check(f"{label}: grad {n}", False, f"relative L2 {rel:.2e}, |g| {float(g.norm()):.3e}")
    rep.check(f"{label}: adapter gradients", worst <= 3e-4,
              f"worst relative L2 {worst:.2e} over {len(want)} tensors")

    # train: zdp's initialisation, 5 Adam steps.
    adam = os.path.join(work, label + ".adam.json")
    write_cfg(adam, 2, G, W, managed, stage, sgd=False)
    init_dir, fin_dir = os.path.join(work, label + ".init"), os.path.join(work, label + ".fin")
    lora = ["--lora-rank", str(r), "--lora-alpha", str(alpha), "--lora-targets", ",".join(targets),
            "--seed", "7"]
    if sh(mp + ["--config", adam, "--steps", "0", "--save-adapter-dir", init_dir] + lora, rep,
          f"{label}: zdp train --steps 0") is None:
        return
    text = sh(mp + ["--config", adam, "--steps", str(STEPS), "--save-adapter-dir", fin_dir] + lora,
              rep, f"{label}: zdp train")
    if text is None:
        return
    zl = parse_step_losses(text)
    init = {n: t.double() for n, t in read_adapter(init_dir).items()}
    ref = LoraRef(m, init, alpha, r)
    losses = gt.reference_train(ref, tokens, T, W, gt.load_ds_config(adam, W), STEPS, sched,
                                log=lambda s: None)
    for s in range(1, STEPS + 1):
        ok = s in zl and abs(zl[s] - losses[s - 1]) <= 1e-4 * abs(losses[s - 1]) + 5e-7
        rep.check(f"{label}: step {s} loss", ok,
                  f"zdp {zl.get(s, float('nan')):.6f} torch fp64 {losses[s - 1]:.6f}")
    fin = read_adapter(fin_dir)
    worst = 0.0
    for n, p in ref.adapters().items():
        rel = float((fin[n].double() - p).norm() / max(float(p.norm()), 1e-30))
        worst = max(worst, rel)
    moved = max(float((ref.adapters()[n] - init[n]).abs().max()) for n in init)
    rep.check(f"{label}: final adapters", worst <= 2e-3 and moved > 1e-3,
              f"worst relative L2 {worst:.2e}, largest move {moved:.2e}")
    rep.check(f"{label}: base folder unchanged", digest(folder) == base_digest, "")

    # merge: W + (alpha / r) B A, in the base's layout.
    merged = os.path.join(work, label + ".merged")
    if sh([a.zdp, "lora", "merge", "--model-dir", folder, "--adapter", fin_dir, "--out", merged],
          rep, f"{label}: zdp lora merge") is None:
        return
    got, base = read_folder(merged), read_folder(folder)
    fin64 = {n: t.double() for n, t in fin.items()}
    s = alpha / r
    bad = []
    for n, w in got.items():
        mod = n[: -len(".weight")]
        key = f"base_model.model.{mod}.lora_A.weight"
        if key in fin64:
            src = base.get(n, base.get("model.embed_tokens.weight") if n == "lm_head.weight" else None)
            delta = (fin64[key.replace("lora_A", "lora_B")] @ fin64[key]) * s
            exp = src.double() + (delta.t() if gpt else delta)  # Conv1D: [in, out]
            rel = float((w.double() - exp).abs().max() / exp.abs().max())
            if rel > 1e-6:
                bad.append(f"{n} ({rel:.1e})")
        elif n not in base or not torch.equal(w, base[n].float()):
            bad.append(f"{n} (should be the base's)")
    tied = "lm_head.weight" not in base
    if "unembed" in targets and tied:
        rep.check(f"{label}: merged head untied", "lm_head.weight" in got, "")
    rep.check(f"{label}: merge = base + (alpha/r) B A", not bad, f"{bad}")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--zdp", required=True)
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--keep", default=None)
    a = ap.parse_args()
    torch.set_num_threads(1)
    rep = Report()
    qwen3 = ["--arch", "qwen3", "--layers", "2", "--hidden", "32", "--heads", "4", "--kv-heads",
             "2", "--head-dim", "12", "--ffn", "48", "--vocab", "64", "--tie", "--rope-theta",
             "50000", "--rms-norm-eps", "1e-5"]
    llama = ["--arch", "llama", "--layers", "2", "--hidden", "32", "--heads", "4", "--kv-heads",
             "2", "--ffn", "40", "--vocab", "70", "--no-tie", "--attention-bias", "--max-pos", "64",
             "--rope-scaling", "llama3:4,1,4,8"]
    allt = ["attn", "mlp", "unembed"]
    with tempfile.TemporaryDirectory() as tmp:
        work = a.keep or tmp
        os.makedirs(work, exist_ok=True)
        run_case(a, rep, work, "qwen3-np1-stage0-managed", qwen3, allt, 4, 8, 1, 0, True, 2, None)
        run_case(a, rep, work, "qwen3-np2-stage2-unmanaged", qwen3, allt, 4, 8, 2, 2, False, 1,
                 "2,1,3")
        run_case(a, rep, work, "llama-np3-stage1-managed", llama, ["attn", "mlp"], 3, 32, 3, 1,
                 True, 2, None)
        # PEFT's partial sets (zdp_lora_config.modules): attention in part, the MLP's down
        # projection alone; GPT-2's fused c_attn alone.
        run_case(a, rep, work, "llama-np2-stage2-partial", llama, ["q_proj", "v_proj", "down_proj"],
                 4, 16, 2, 2, True, 2, None)
        gpt2 = ["gpt2", dict(n_layer=2, n_head=2, n_embd=32, vocab_size=64, block_size=T)]
        run_case(a, rep, work, "gpt2-np2-stage1-unmanaged", gpt2, ["attn", "mlp"], 4, 16, 2, 1,
                 False, 1, "1,2")
        run_case(a, rep, work, "gpt2-np1-stage0-c_attn", gpt2, ["attn.c_attn"], 2, 8, 1, 0,
                 True, 1, None)
    return rep.finish("check_lora")


if __name__ == "__main__":
    sys.exit(main())
