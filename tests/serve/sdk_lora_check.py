#!/usr/bin/env python3
"""sdk_lora_check.py -- the official Tinker SDK (never patched) against a
running `zdp serve` in its LoRA mode, as tinker-cookbook's loops drive it
(tests/cli/test_tinker_sdk_lora.sh makes the vendored SDK importable and
starts the server).

  sdk_lora_check.py URL CHECKPOINT_DIR PHASE STATE_FILE

PHASE "train": two training clients of different LoRA configurations
(rank 4 every target; rank 2 attention only) at once, on threads:
  - a cookbook-shaped SFT loop (forward_backward cross_entropy with
    per-token weights, then optim_step, both submitted before either is
    awaited) on each; the losses fall;
  - an RL loop on each: save_weights_and_get_sampling_client, sample a
    group of completions per prompt, a reward, group-centred advantages,
    importance_sampling forward_backward with the sampler's logprobs, then
    optim_step; the sampler's logprobs of each completion equal the
    training client's forward logprobs of it (the adapter is applied in
    sampling: with the base alone they differ);
  - save_weights_for_sampler and save_state write PEFT adapter folders
    (adapter_config.json: peft_type LORA, r, lora_alpha, target_modules of
    the client's targets, base_model_name_or_path; adapter_model.safetensors:
    PEFT's tensor names, [r, in] and [out, r] shapes, F32);
  - a sampling client made from the sampler weights path samples the same
    tokens and logprobs as the one from the training client;
  - RestClient: list_training_runs, get_training_run, list_checkpoints
    (the sampler weights listed), list_user_checkpoints,
    get_weights_info_by_tinker_path (the LoRA rank), delete_checkpoint of
    a sampler weights folder;
  - eight sampling requests of the two models in flight at once: the server
    decodes them in shared passes (GET /info's requests.asample.batched)
    and each equals the same request run alone.
  STATE_FILE gets each client's checkpoint path and its next loss.
PHASE "resume" (a fresh server process on the same --checkpoint-dir):
  sampling the base_model (the folder's weights) matches a fresh LoRA
  client's forward;
  create_training_client_from_state_with_optimizer from each saved state
  beside the other; the first forward_backward's loss equals the loss the
  first process measured after saving (the adapters and step restored), and
  a further step trains.

Each failed check prints "FAIL: ..."; the exit status is the failure count.
"""
import json
import math
import os
import struct
import sys
import threading
import time
import urllib.request

import tinker
from tinker import types

FAILURES = 0
LOCK = threading.Lock()
ADAM = types.AdamParams(learning_rate=2e-2, beta1=0.9, beta2=0.95, eps=1e-8)
CLIENTS = [dict(rank=4, seed=11, train_attn=True, train_mlp=True, train_unembed=True),
           dict(rank=2, seed=12, train_attn=True, train_mlp=False, train_unembed=False)]
LLAMA_MODULES = {"attn": ["q_proj", "k_proj", "v_proj", "o_proj"],
                 "mlp": ["gate_proj", "up_proj", "down_proj"], "unembed": ["lm_head"]}


def fail(msg):
    global FAILURES
    with LOCK:
        FAILURES += 1
        print("FAIL: " + msg, flush=True)


def lcg_tokens(seed, n, vocab):
    x, out = seed, []
    for _ in range(n):
        x = (x * 1103515245 + 12345) % (1 << 31)
        out.append(3 + x % (vocab - 3))
    return out


def sft_datum(tokens, prompt_len):
    """The cookbook's supervised datum: the prompt's targets weighted 0."""
    n = len(tokens) - 1
    w = [0.0 if t < prompt_len - 1 else 1.0 for t in range(n)]
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                       loss_fn_inputs={"target_tokens": tokens[1:], "weights": w})


def mean_loss(res, n_weighted):
    """forward_backward's summed weighted loss per weighted token, as the
    cookbook reports it."""
    return res.metrics["loss:sum"] / n_weighted


def read_safetensors_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))


def check_peft_folder(folder, cfg, base_name, what):
    """adapter_config.json and adapter_model.safetensors as PEFT writes them."""
    try:
        conf = json.load(open(os.path.join(folder, "adapter_config.json")))
        head = read_safetensors_header(os.path.join(folder, "adapter_model.safetensors"))
    except (OSError, ValueError) as e:
        fail(f"{what}: not a PEFT adapter folder: {e}")
        return
    want_mods = [m for g in ("attn", "mlp", "unembed") if cfg["train_" + g] for m in LLAMA_MODULES[g]]
    for k, v in (("peft_type", "LORA"), ("r", cfg["rank"]), ("target_modules", want_mods),
                 ("base_model_name_or_path", base_name), ("bias", "none"), ("task_type", "CAUSAL_LM")):
        if conf.get(k) != v:
            fail(f"{what}: adapter_config.json {k} = {conf.get(k)!r}, want {v!r}")
    if not isinstance(conf.get("lora_alpha"), (int, float)) or conf["lora_alpha"] <= 0:
        fail(f"{what}: adapter_config.json lora_alpha = {conf.get('lora_alpha')!r}")
    names = [n for n in head if n != "__metadata__"]
    r = cfg["rank"]
    for n in names:
        t = head[n]
        mod = n[len("base_model.model."):].rsplit(".lora_", 1)[0] if n.startswith("base_model.model.") else ""
        leaf = mod.split(".")[-1]
        ok = t["dtype"] == "F32" and len(t["shape"]) == 2 and leaf in want_mods and (
            t["shape"][0] == r if n.endswith(".lora_A.weight") else
            t["shape"][1] == r if n.endswith(".lora_B.weight") else False)
        if not ok:
            fail(f"{what}: tensor {n} {t['dtype']} {t['shape']}: not a rank-{r} PEFT LoRA tensor of {want_mods}")
    if not any(n.endswith(".lora_A.weight") for n in names) or len(names) % 2:
        fail(f"{what}: {len(names)} tensors: want an A and a B per module")


def check_sampler_matches_forward(tc, sc, prompt, what):
    """The sampler's logprobs of its completion == the training client's
    forward logprobs of the same tokens (temperature 1, same weights)."""
    seqs = sc.sample(types.ModelInput.from_ints(prompt), 2,
                     types.SamplingParams(max_tokens=6, temperature=1.0, seed=5)).result().sequences
    data = []
    for s in seqs:
        toks = prompt + list(s.tokens)
        data.append(types.Datum(model_input=types.ModelInput.from_ints(toks[:-1]),
                                loss_fn_inputs={"target_tokens": toks[1:]}))
    outs = tc.forward(data, "cross_entropy").result().loss_fn_outputs
    worst = 0.0
    for s, o in zip(seqs, outs):
        lp = o["logprobs"].tolist()[len(prompt) - 1:]
        worst = max([worst] + [abs(a - b) for a, b in zip(lp, s.logprobs)])
    if worst > 2e-3:
        fail(f"{what}: the sampler's logprobs differ from the training client's forward by {worst:.2e} "
             f"(the adapter is not applied in sampling?)")
    return seqs


def train_one(sc, base, vocab, k, results, ckdir, trainers):
    cfg = CLIENTS[k]
    what = f"client {k} (rank {cfg['rank']})"
    try:
        tc = sc.create_lora_training_client(base_model=base, **cfg)
        # SFT, cookbook-shaped: both requests submitted, then awaited.
        data = [sft_datum(lcg_tokens(100 * k + i, 12, vocab), 4) for i in range(4)]
        losses = []
        for _ in range(6):
            fb = tc.forward_backward(data, "cross_entropy")
            op = tc.optim_step(ADAM)
            losses.append(mean_loss(fb.result(), 4 * 8))  # 11 targets, the first 3 weighted 0
            op.result()
        if not losses[-1] < losses[0] - 0.05:
            fail(f"{what}: SFT losses did not fall: {losses}")
        # RL: sample groups, centre the rewards per group, importance sampling.
        prompts = [lcg_tokens(1000 + 10 * k + p, 4, vocab) for p in range(2)]
        for it in range(2):
            samp = tc.save_weights_and_get_sampling_client()
            if it == 0:
                check_sampler_matches_forward(tc, samp, prompts[0], what + " sampling from the training client")
            rl = []
            for p in prompts:
                res = samp.sample(types.ModelInput.from_ints(p), 4,
                                  types.SamplingParams(max_tokens=5, temperature=1.0, seed=7 + it)).result()
                rewards = [float(sum(1 for t in s.tokens if t % 2 == 0)) for s in res.sequences]
                mean = sum(rewards) / len(rewards)
                for s, r in zip(res.sequences, rewards):
                    toks = p + list(s.tokens)
                    n = len(toks) - 1
                    lp = [0.0] * (len(p) - 1) + list(s.logprobs)
                    adv = [0.0] * (len(p) - 1) + [r - mean] * len(s.tokens)
                    rl.append(types.Datum(model_input=types.ModelInput.from_ints(toks[:-1]),
                                          loss_fn_inputs={"target_tokens": toks[1:],
                                                          "logprobs": lp[:n], "advantages": adv[:n]}))
            fb = tc.forward_backward(rl, "importance_sampling")
            op = tc.optim_step(ADAM)
            if not math.isfinite(fb.result().metrics.get("loss:sum", float("nan"))):
                fail(f"{what}: importance_sampling loss not finite")
            op.result()
        # Weights out: sampler weights and a state, both PEFT folders.
        sw = tc.save_weights_for_sampler(f"sampler{k}").result().path
        st = tc.save_state(f"state{k}").result().path
        run = tc.model_id
        for path, sub in ((sw, f"sampler_weights/sampler{k}"), (st, f"state{k}")):
            folder = [os.path.join(ckdir, d, sub) for d in os.listdir(ckdir)
                      if os.path.isdir(os.path.join(ckdir, d, sub))]
            if len(folder) != 1:
                fail(f"{what}: {path}: no folder {sub} under the checkpoint dir ({os.listdir(ckdir)})")
                continue
            check_peft_folder(folder[0], cfg, base, f"{what} {path}")
        # A sampling client from the sampler weights path == from the training client.
        s1 = sc.create_sampling_client(model_path=sw)
        s2 = tc.create_sampling_client(sw)
        sp = types.SamplingParams(max_tokens=6, temperature=1.0, seed=3)
        a = s1.sample(types.ModelInput.from_ints(prompts[1]), 3, sp).result().sequences
        b = s2.sample(types.ModelInput.from_ints(prompts[1]), 3, sp).result().sequences
        if [list(x.tokens) for x in a] != [list(x.tokens) for x in b]:
            fail(f"{what}: two sampling clients of {sw} sampled differently")
        check_sampler_matches_forward(tc, s1, prompts[1], what + " sampling from " + sw)
        # The loss a resumed client must reproduce (no step after the save).
        probe = [sft_datum(lcg_tokens(7000 + k, 12, vocab), 4)]
        after = tc.forward(probe, "cross_entropy").result().metrics["loss:sum"]
        results[k] = {"state": st, "sampler": sw, "run": run, "probe_loss": after}
        trainers[k] = tc
    except Exception as e:  # noqa: BLE001 -- any SDK failure is this client's failure
        fail(f"{what}: {type(e).__name__}: {e}")


def asample_batched(url):
    """GET /info's count of asample requests that shared decoding passes."""
    with urllib.request.urlopen(url + "/info", timeout=60) as r:
        return json.loads(r.read()).get("requests", {}).get("asample", {}).get("batched", 0)


def running(url):
    """GET /healthz's name of the request the ranks run now (None: idle)."""
    with urllib.request.urlopen(url + "/healthz", timeout=60) as r:
        return json.loads(r.read()).get("running")


def check_batched_sampling(url, sc, results, tc, vocab):
    """Both models' sampling requests in flight at once decode in shared
    passes (the server batches asample jobs next to each other in its FIFO)
    and give what each gives alone."""
    clients = [sc.create_sampling_client(model_path=results[k]["sampler"]) for k in (0, 1)]
    # Long enough that the later requests arrive while the first decodes.
    reqs = [(c, types.ModelInput.from_ints(lcg_tokens(500 + 3 * i, 4 + i, vocab)),
             types.SamplingParams(max_tokens=20, temperature=1.0, seed=40 + i)) for i in range(8)
            for c in (clients[i % 2],)]
    for n_busy in (512, 2048, 8192):  # longer if the requests did not queue behind it
        before = asample_batched(url)
        # A long forward ahead of them in the server's FIFO, so that they queue
        # up behind it, next to each other.  The SDK sends it in the background:
        # the requests go once GET /healthz says the ranks run it (submitted at
        # once, they could reach the server first and run one by one).
        busy = tc.forward([sft_datum(lcg_tokens(9000 + i, 31, vocab), 4) for i in range(n_busy)],
                          "cross_entropy")
        waiter = threading.Thread(target=busy.result)
        waiter.start()
        waited = time.monotonic() + 60
        while waiter.is_alive() and time.monotonic() < waited and running(url) != "forward":
            time.sleep(0.005)
        futs = [c.sample(p, 8, sp) for c, p, sp in reqs]  # all submitted, then awaited
        waiter.join()
        busy.result()
        together = [f.result().sequences for f in futs]
        batched = asample_batched(url) - before
        if batched >= 2:
            break
    alone = [c.sample(p, 8, sp).result().sequences for c, p, sp in reqs]  # one at a time
    for i, (a, b) in enumerate(zip(together, alone)):
        if [list(x.tokens) for x in a] != [list(x.tokens) for x in b]:
            fail(f"sampling request {i} (model {i % 2}): batched with the other model's "
                 f"{[list(x.tokens) for x in a]}, alone {[list(x.tokens) for x in b]}")
            continue
        worst = max((abs(u - v) for x, y in zip(a, b) for u, v in zip(x.logprobs, y.logprobs)), default=0.0)
        if worst > 1e-4:
            fail(f"sampling request {i}: logprobs batched vs alone differ by {worst:.2e}")
    if batched < 2:
        fail(f"8 sampling requests of two models in flight at once: {batched} shared decoding passes "
             f"(GET /info requests.asample.batched), want >= 2")
    print(f"sdk_lora_check: {batched} of 8 concurrent sampling requests of two LoRA models decoded "
          f"in shared passes, equal to each alone", flush=True)


def phase_train(url, ckdir, state_file):
    sc = tinker.ServiceClient(base_url=url)
    caps = sc.get_server_capabilities()
    base = caps.supported_models[0].model_name
    vocab = 64
    results, trainers = {}, {}
    threads = [threading.Thread(target=train_one, args=(sc, base, vocab, k, results, ckdir, trainers))
               for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if len(results) != 2:
        fail(f"only {len(results)} of 2 clients finished")
        return
    rest = sc.create_rest_client()
    runs = [r.training_run_id for r in rest.list_training_runs().result().training_runs]
    for k, r in results.items():
        if r["run"] not in runs:
            fail(f"list_training_runs: {runs} lacks client {k}'s {r['run']}")
        tr = rest.get_training_run(r["run"]).result()
        if not tr.is_lora or tr.lora_rank != CLIENTS[k]["rank"]:
            fail(f"get_training_run({r['run']}): is_lora {tr.is_lora}, lora_rank {tr.lora_rank}")
        cks = [c.checkpoint_id for c in rest.list_checkpoints(r["run"]).result().checkpoints]
        for want in (f"sampler_weights/sampler{k}", f"weights/state{k}"):
            if want not in cks:
                fail(f"list_checkpoints({r['run']}): {cks} lacks {want}")
        info = rest.get_weights_info_by_tinker_path(r["state"]).result()
        if info.lora_rank != CLIENTS[k]["rank"]:
            fail(f"get_weights_info_by_tinker_path({r['state']}): lora_rank {info.lora_rank}")
    user = [c.tinker_path for c in rest.list_user_checkpoints().result().checkpoints]
    for k, r in results.items():
        if r["sampler"] not in user:
            fail(f"list_user_checkpoints lacks {r['sampler']}")
    check_batched_sampling(url, sc, results, trainers[0], vocab)
    # delete_checkpoint of a LoRA model's sampler weights removes the folder.
    gone = results[1]["sampler"]
    rest.delete_checkpoint_from_tinker_path(gone).result()
    cks = [c.checkpoint_id for c in rest.list_checkpoints(results[1]["run"]).result().checkpoints]
    left = [d for d in os.listdir(ckdir) if os.path.isdir(os.path.join(ckdir, d, "sampler_weights", "sampler1"))]
    if "sampler_weights/sampler1" in cks or left:
        fail(f"delete_checkpoint({gone}): still listed ({cks}) or on disk ({left})")
    json.dump(results, open(state_file, "w"))
    print(f"sdk_lora_check train: 2 LoRA clients, SFT + RL, PEFT folders, {len(user)} user checkpoints",
          flush=True)


def phase_resume(url, state_file):
    sc = tinker.ServiceClient(base_url=url)
    first = json.load(open(state_file))
    vocab = 64
    # base_model sampling (the --model-dir folder's weights): a fresh LoRA
    # client (B = 0) computes the base's logprobs.
    base = sc.get_server_capabilities().supported_models[0].model_name
    fresh = sc.create_lora_training_client(base_model=base, rank=2, seed=1)
    check_sampler_matches_forward(fresh, sc.create_sampling_client(base_model=base), lcg_tokens(77, 5, vocab),
                                  "base_model sampling")
    tcs = {}
    for k, r in first.items():
        try:
            tcs[k] = sc.create_training_client_from_state_with_optimizer(r["state"])
        except Exception as e:  # noqa: BLE001
            fail(f"create_training_client_from_state_with_optimizer({r['state']}): {type(e).__name__}: {e}")
    for k, tc in tcs.items():
        probe = [sft_datum(lcg_tokens(7000 + int(k), 12, vocab), 4)]
        got = tc.forward_backward(probe, "cross_entropy").result().metrics["loss:sum"]
        want = first[k]["probe_loss"]
        if abs(got - want) > 1e-4 * abs(want) + 1e-5:
            fail(f"client {k} resumed in a fresh server: loss {got}, the first process's {want}")
        tc.optim_step(ADAM).result()
        again = tc.forward(probe, "cross_entropy").result().metrics["loss:sum"]
        if not again < got:
            fail(f"client {k} resumed: a step did not lower the probe loss ({got} -> {again})")
    print(f"sdk_lora_check resume: {len(tcs)} models from their states in a fresh process", flush=True)


def main():
    url, ckdir, phase, state_file = sys.argv[1:5]
    if phase == "train":
        phase_train(url, ckdir, state_file)
    else:
        phase_resume(url, state_file)
    sys.exit(min(FAILURES, 100))


if __name__ == "__main__":
    main()
