"""checklib.py -- what the PyTorch cross-checks in tests/torch/ share: the
tolerances, the Report that prints and collects every comparison, and the
checks of a gpt_grads / llama_grads output file (tests/torch/lm_grads.h)
against a reference pass."""

import torch

# kind -> (rtol, atol): fp32 arithmetic against a float64 reference.
TOL = {"loss": (1e-5, 1e-6), "logits": (1e-4, 1e-5), "grad": (1e-4, 1e-5)}


class Report:
    def __init__(self):
        self.failures = []

    def compare(self, label, got, ref, kind, ref32=None):
        rtol, atol = TOL[kind]
        got, ref = got.double(), ref.double()
        if tuple(got.shape) != tuple(ref.shape):
            self.check(label, False, f"shape {list(got.shape)} vs reference {list(ref.shape)}")
            return
        diff = (got - ref).abs()
        ratio = float((diff / (atol + rtol * ref.abs())).max()) if diff.numel() else 0.0
        ok = bool(torch.isfinite(got).all()) and ratio <= 1.0
        d32 = f"{float((ref32.double() - ref).abs().max()):.2e}" if ref32 is not None else "-"
        dmax = float(diff.max()) if diff.numel() else 0.0
        rmax = float(ref.abs().max()) if ref.numel() else 0.0
        print(f"  {'ok  ' if ok else 'FAIL'} {label:<58} {str(list(ref.shape)):<10} "
              f"max|diff| {dmax:.2e}  max|ref| {rmax:.2e}  diff/tol {ratio:.3f}  torch-fp32 {d32}")
        if not ok:
            self.failures.append(f"{label}: max|diff| {dmax:.3e}, diff/tol {ratio:.3f}")

    def check(self, label, ok, detail):
        print(f"  {'ok  ' if ok else 'FAIL'} {label}: {detail}")
        if not ok:
            self.failures.append(f"{label}: {detail}")

    def finish(self, tool, limit=None):
        """Prints the summary; the exit status (1 on any failure)."""
        if self.failures:
            print(f"\n{tool}: {len(self.failures)} FAILED:")
            for f in self.failures[:limit]:
                print("  " + f.splitlines()[0])
            return 1
        print(f"\n{tool}: all passed")
        return 0


def check_grads_file(rep, name, z, names, ref64, ref32):
    """z: the tensors of a *_grads output file; ref64 / ref32: the reference's
    (loss, logits [B, T, V], logprobs [B, T] or None, {name: grad}) in float64
    and float32."""
    loss64, logits64, logp64, grads64 = ref64
    loss32, logits32, logp32, grads32 = ref32
    rep.compare(f"{name}: loss", z["loss"].view(()), loss64, "loss", loss32)
    rep.check(f"{name}: loss deterministic", torch.equal(z["loss"], z["loss_again"]),
              f"{float(z['loss']):.9g} then {float(z['loss_again']):.9g}")
    if logp64 is not None:
        rep.compare(f"{name}: logprobs", z["logprobs"], logp64, "logits", logp32)
    rep.compare(f"{name}: next_logits", z["next_logits"], logits64[:, -1, :], "logits",
                logits32[:, -1, :])
    rep.compare(f"{name}: prefix_logits (seq 0, all t)", z["prefix_logits"], logits64[0],
                "logits", logits32[0])
    for n_ in names:
        rep.compare(f"{name}: grad {n_}", z["grad." + n_], grads64[n_], "grad", grads32[n_])
    # The sink adds: grad_accum = grad + 0.5 grad, to fp32 rounding of zdp's own values.
    worst = 0.0
    for n_ in names:
        gz = z["grad." + n_].double()
        d = (z["grad_accum." + n_].double() - 1.5 * gz).abs()
        worst = max(worst, float((d / (1e-7 + 1e-5 * gz.abs())).max()))
    rep.check(f"{name}: backward adds into the sink", worst <= 1.0,
              f"grad_accum vs 1.5 x grad, worst diff/tol {worst:.3f}")
