#!/usr/bin/python3
"""Cross-check of zdp's Llama-family model against tests/torch/llama_ref.py
(a float64 port of transformers' LlamaForCausalLM / Qwen3ForCausalLM).

  check_llama.py --llama-grads BUILD/tests/llama_grads [--keep DIR]

For each case below (tiny Llama and Qwen3 configurations: GQA, multi-query,
q/k norm, head_dim != hidden / heads, attention biases, llama3 and linear
rope scaling, tied and untied lm_head, loss weights): writes random weights
in transformers' names (norm weights and biases made non-trivial), runs
llama_grads (zdp through the public API) and the reference from the same
fp32 weights in float64, and asserts that the loss, the logprobs, the logits
of every prefix and of each sequence, and EVERY parameter gradient agree:
  |zdp - ref| <= atol + rtol * |ref| elementwise,
    loss   rtol 1e-5 atol 1e-6
    logits rtol 1e-4 atol 1e-5   (logprobs too)
    grads  rtol 1e-4 atol 1e-5
The "torch-fp32" column is PyTorch's own fp32 run's difference, for scale.
One case uses zdp's seeded init instead and checks its statistics.

Exit status 0 when everything agrees, 1 otherwise.
"""

import argparse
import math
import os
import subprocess
import sys
import tempfile
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench", "torch"))

import torch  # noqa: E402

import llama_ref as lr  # noqa: E402
from checklib import Report, check_grads_file  # noqa: E402
from gpt_torch import read_safetensors, write_safetensors  # noqa: E402

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 32}

# name, config, B, T, init ("ref" | "zdp"), weighted
CASES = [
    ("llama-gqa-untied", lr.LlamaRefConfig("llama", 2, 48, 6, 2, None, 80, 67, 64, 1e-5, 10000.0),
     3, 12, "ref", False),
    ("qwen3-qknorm-hd-tied", lr.LlamaRefConfig("qwen3", 2, 32, 4, 2, 16, 64, 50, 4096, 1e-6,
                                               1000000.0, tie_word_embeddings=True),
     2, 10, "ref", False),
    ("llama-bias-llama3-mqa", lr.LlamaRefConfig("llama", 2, 32, 4, 1, 8, 48, 40, 64, 1e-5, 50.0,
                                                rope_scaling=LLAMA3, attention_bias=True),
     2, 12, "ref", True),
    ("qwen3-bias-linear-untied", lr.LlamaRefConfig("qwen3", 1, 24, 3, 3, 10, 40, 30, 64, 1e-6,
                                                   10000.0, {"rope_type": "linear", "factor": 2.0},
                                                   attention_bias=True),
     2, 8, "ref", False),
    ("llama-long-2blocks", lr.LlamaRefConfig("llama", 1, 16, 2, 1, 8, 32, 20, 256, 1e-5, 10000.0,
                                             tie_word_embeddings=True),
     1, 150, "ref", False),
    ("llama-zdpinit", lr.LlamaRefConfig("llama", 2, 32, 4, 2, None, 64, 50, 64, 1e-5, 10000.0,
                                        initializer_range=0.05),
     2, 8, "zdp", False),
]


def zdp_args(cfg):
    a = ["--arch", cfg.arch, "--layers", cfg.n_layer, "--hidden", cfg.hidden, "--heads",
         cfg.n_head, "--kv-heads", cfg.n_kv_head, "--head-dim", cfg.head_dim, "--ffn", cfg.ffn,
         "--vocab", cfg.vocab_size, "--block", cfg.max_position_embeddings, "--max-pos",
         cfg.max_position_embeddings, "--eps", repr(cfg.rms_norm_eps), "--theta",
         repr(cfg.rope_theta), "--bias", int(cfg.attention_bias), "--tied",
         int(cfg.tie_word_embeddings), "--init-range", repr(cfg.initializer_range)]
    sc = cfg.rope_scaling
    if sc is not None:
        a += ["--rope", sc["rope_type"], "--rope-factor", repr(sc["factor"])]
        if sc["rope_type"] == "llama3":
            a += ["--rope-low", repr(sc["low_freq_factor"]), "--rope-high",
                  repr(sc["high_freq_factor"]), "--rope-orig",
                  sc["original_max_position_embeddings"]]
    return [str(x) for x in a]


def ref_pass(cfg, params, inputs, targets, weights, dtype):
    m = lr.LlamaForCausalLMRef(cfg).to(dtype)
    with torch.no_grad():
        for name, p in m.named_parameters():
            p.copy_(params[name])
    logits, loss = m(inputs.long(), targets.long(), weights)
    loss.backward()
    logp = torch.log_softmax(logits.detach(), dim=-1).gather(-1, targets.long()[..., None])[..., 0]
    return loss.detach(), logits.detach(), logp, {n: p.grad.detach().clone()
                                                 for n, p in m.named_parameters()}


def check_init_stats(rep, name, cfg, params):
    """zdp_llama_init_params: weights N(0, initializer_range), norms 1, biases 0."""
    want = cfg.initializer_range
    for n_, t in params.items():
        t = t.double()
        if n_.endswith("norm.weight"):
            rep.check(f"{name}: init {n_}", bool((t == 1).all()), "all one")
        elif n_.endswith(".bias"):
            rep.check(f"{name}: init {n_}", bool((t == 0).all()), "all zero")
        else:
            n = t.numel()
            std, mean = float(t.std()), float(t.mean())
            ok = abs(std - want) <= 6 * want / math.sqrt(2 * n) and abs(mean) <= 6 * want / math.sqrt(n)
            rep.check(f"{name}: init {n_}", ok, f"mean {mean:+.2e} std {std:.5f} (want 0, {want})")


def run_case(a, rep, work, name, cfg, B, T, init, weighted):
    print(f"== {name}: {cfg}, B={B}, T={T}, weights from {init}")
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    inputs = torch.randint(0, cfg.vocab_size, (B, T), generator=g).to(torch.int32)
    targets = torch.randint(0, cfg.vocab_size, (B, T), generator=g).to(torch.int32)
    toks = [("inputs", inputs), ("targets", targets)]
    weights = None
    if weighted:
        weights = torch.rand(B, T, generator=g, dtype=torch.float32) * 2 - 0.5
        weights[0, 0] = 0.0
        toks.append(("weights", weights))
    tok_path = os.path.join(work, f"{name}.tokens.safetensors")
    write_safetensors(tok_path, toks)
    out_path = os.path.join(work, f"{name}.zdp.safetensors")
    cmd = [a.llama_grads] + zdp_args(cfg) + ["--tokens", tok_path, "--out", out_path]
    init_state = None
    if init == "ref":
        m = lr.LlamaForCausalLMRef(cfg)
        # Wider than the 0.02 init, so attention is far from uniform and the
        # gradients are well above fp32 noise; norm weights and biases moved
        # off 1 and 0, so their gradients and uses count.
        cfg_init = 0.2
        with torch.no_grad():
            for n_, p in m.named_parameters():
                if n_.endswith("norm.weight"):
                    p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
                elif n_.endswith(".bias"):
                    p.copy_(0.1 * torch.randn(p.shape, generator=g))
                else:
                    p.copy_(cfg_init * torch.randn(p.shape, generator=g))
        init_state = {n_: p.detach().clone() for n_, p in m.named_parameters()}
        init_path = os.path.join(work, f"{name}.init.safetensors")
        write_safetensors(init_path, list(init_state.items()))
        cmd += ["--init", init_path]
    else:
        cmd += ["--seed", "42"]
    r = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    if r.returncode != 0:
        rep.check(f"{name}: llama_grads", False, f"exit {r.returncode}: {r.stderr.strip()}")
        return
    print("  " + r.stdout.strip())
    z, _ = read_safetensors(out_path)
    names = [n_ for n_, _ in lr.LlamaForCausalLMRef(cfg).named_parameters()]
    zdp_names = [k[len("param."):] for k in z if k.startswith("param.")]
    rep.check(f"{name}: parameter names and order", zdp_names == names,
              f"zdp {len(zdp_names)} tensors, reference {len(names)}")
    if zdp_names != names:
        return
    params = {n_: z["param." + n_] for n_ in names}
    if init_state is not None:
        same = all(torch.equal(params[n_], init_state[n_]) for n_ in names)
        rep.check(f"{name}: weights read back", same, "param.* == the --init file, bit for bit")
    else:
        check_init_stats(rep, name, cfg, params)
    loss64, logits64, logp64, grads64 = ref_pass(cfg, {k: v.double() for k, v in params.items()},
                                                 inputs, targets, weights, torch.float64)
    loss32, logits32, logp32, grads32 = ref_pass(cfg, params, inputs, targets, weights,
                                                 torch.float32)
    check_grads_file(rep, name, z, names, (loss64, logits64, logp64, grads64),
                     (loss32, logits32, logp32, grads32))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-grads", required=True)
    ap.add_argument("--keep", default=None, help="keep the files in this directory")
    ap.add_argument("--case", default=None, help="run only the case of this name")
    a = ap.parse_args()
    torch.manual_seed(0)
    rep = Report()
    with tempfile.TemporaryDirectory() as tmp:
        work = a.keep or tmp
        os.makedirs(work, exist_ok=True)
        for case in CASES:
            if a.case is None or case[0] == a.case:
                run_case(a, rep, work, *case)
    return rep.finish("check_llama")


if __name__ == "__main__":
    sys.exit(main())
