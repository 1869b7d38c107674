#!/usr/bin/env python3
"""lm_check.py -- drives a running `zdp serve` with the real Tinker SDK
(test_serve_lm.sh makes it importable) and its plain
API, for tests/cli/test_serve_lm.sh: get_info's arch and tokenizer_id, /info's
model, training lowers the loss, sampling through a sampler-weights file,
string stop sequences (docs/server.md, "Stop sequences"), token stops,
save_state / load_state round trip.

  lm_check.py URL MODEL_NAME ARCH TOKENIZER_ID TEXT_FILE CODEC...

CODEC is how text and token ids convert: "bytes" (a byte-level model: id =
byte), or a command (e.g. `zdp tokenize --tokenizer DIR`) that reads text on
stdin and prints ids, and with --decode reads ids and prints text.
TOKENIZER_ID "-" means get_info's tokenizer_id must be null.  Every failed
check prints "FAIL: ..."; the exit status is the failure count (capped at 100).
"""
import json
import os
import subprocess
import sys
import urllib.request

import tinker
from tinker import types

FAILURES = 0


def fail(msg):
    global FAILURES
    FAILURES += 1
    print("FAIL: " + msg, flush=True)


class Codec:
    def __init__(self, argv):
        self.cmd = None if argv == ["bytes"] else argv
        self.piece = {}

    def encode(self, text):
        if self.cmd is None:
            return list(text.encode())
        out = subprocess.run(self.cmd, input=text.encode(), capture_output=True, check=True).stdout
        return [int(x) for x in out.split()]

    def decode(self, ids):
        """The text of ids, as bytes (what the server matches stop strings in):
        byte-level BPE, so the bytes of each token, one after another.  Each
        token's bytes come once from the command's --decode."""
        if self.cmd is None:
            return bytes(ids)
        missing = sorted(set(ids) - set(self.piece))
        if missing:
            # One call: each id on its own between two copies of a marker id
            # (its text learnt first), so the pieces can be split apart.
            run = lambda x: subprocess.run(self.cmd + ["--decode"], input=x.encode(), capture_output=True,  # noqa
                                           check=True).stdout
            marker = self.cmd and self.encode("\u2603")
            mtext = run(" ".join(map(str, marker)))
            out = run(" ".join(" ".join(map(str, marker + [i])) for i in missing) + " " + " ".join(map(str, marker)))
            parts = out.split(mtext)
            if len(parts) != len(missing) + 2:
                raise RuntimeError("cannot split the decoded pieces")
            self.piece.update(zip(missing, parts[1:-1]))
        return b"".join(self.piece[i] for i in ids)


def plain(url, method, path, body=None):
    req = urllib.request.Request(url + path, method=method, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def expected_stop(codec, gen, stops):
    """What the server answers for greedy tokens gen and stop strings: the
    first step whose text holds a stop string ends the sequence, and the
    tokens returned are the longest prefix whose text holds none."""
    have = lambda ids: any(s.encode() in codec.decode(ids) for s in stops)  # noqa: E731
    for m in range(1, len(gen) + 1):
        if have(gen[:m]):
            k = m - 1
            while k > 0 and have(gen[:k]):
                k -= 1
            return gen[:k], "stop"
    return gen, "length"


def main(argv):
    if len(argv) < 7:
        print(__doc__)
        return 2
    url, name, arch, tok_id, text_file, codec = argv[1], argv[2], argv[3], argv[4], argv[5], Codec(argv[6:])
    os.environ["TINKER_BASE_URL"] = url
    os.environ.setdefault("TINKER_API_KEY", "tml-local")

    # /info (plain API): the model's arch and shape.
    st, info = plain(url, "GET", "/info")
    m = info.get("model", {})
    if st != 200 or m.get("arch") != arch or not m.get("vocab_size") or not m.get("block_size"):
        fail("GET /info model %s (wanted arch %s, vocab_size, block_size)" % (m, arch))
    V, T = m.get("vocab_size", 0), m.get("block_size", 0)

    sc = tinker.ServiceClient()
    tc = sc.create_lora_training_client(base_model=name, rank=0)  # --full-finetune
    gi = tc.get_info()
    want_tok = None if tok_id == "-" else tok_id
    if gi.model_data.arch != arch or gi.model_data.tokenizer_id != want_tok:
        fail("get_info model_data %s (wanted arch %s, tokenizer_id %s)" % (gi.model_data, arch, want_tok))

    # Training on the text lowers its loss.
    text = open(text_file, encoding="utf-8").read()
    ids = codec.encode(text)
    if any(not 0 <= t < V for t in ids):
        fail("the codec gave ids outside [0, %d)" % V)
    n = min(T, 24)
    data = [types.Datum(model_input=types.ModelInput.from_ints(ids[i:i + n]),
                        loss_fn_inputs={"target_tokens": ids[i + 1:i + n + 1]})
            for i in range(0, min(len(ids) - n - 1, 4 * n), n)]
    losses = []
    for _ in range(8):
        out = tc.forward_backward(data, "cross_entropy").result()
        losses.append(out.metrics["loss:sum"])
        tc.optim_step(types.AdamParams(learning_rate=2e-2)).result()
    print("lm_check: loss:sum %.3f -> %.3f over 8 steps" % (losses[0], losses[-1]), flush=True)
    if not losses[-1] < 0.7 * losses[0]:
        fail("training did not lower the loss: %s" % losses)

    # Greedy samples from a sampler-weights file.
    samp = tc.save_weights_and_get_sampling_client()
    prompt = types.ModelInput.from_ints(ids[:8])
    greedy = dict(max_tokens=24, temperature=0.0)
    r = samp.sample(prompt, 1, types.SamplingParams(**greedy)).result()
    gen = list(r.sequences[0].tokens)
    if len(gen) != 24 or r.sequences[0].stop_reason != "length":
        fail("greedy sample %s (wanted 24 tokens, stop_reason length)" % r.sequences[0])
    text_gen = codec.decode(gen)
    print("lm_check: greedy continuation %r" % text_gen, flush=True)

    # String stops: a stop string taken from the continuation, starting at a
    # token boundary and inside a token; several at once; one never produced.
    t3 = codec.decode(gen[:3])
    tries = []
    for at in (len(t3), len(t3) + 1, len(codec.decode(gen[:10]))):
        piece = text_gen[at:at + 3]
        try:
            tries.append([piece.decode()])
        except UnicodeDecodeError:
            continue
    tries.append(["\x01never\x02"])
    if len(tries) >= 2:
        tries.append(tries[0] + tries[1])
    checked = 0
    for stops in tries:
        if any(s == "" for s in stops):
            continue
        want_tokens, want_reason = expected_stop(codec, gen, stops)
        got = samp.sample(prompt, 1, types.SamplingParams(stop=stops, **greedy)).result().sequences[0]
        if list(got.tokens) != want_tokens or got.stop_reason != want_reason:
            fail("stop %r: tokens %s (%s), wanted %s (%s)" % (stops, list(got.tokens), got.stop_reason,
                                                             want_tokens, want_reason))
        elif want_reason == "stop" and any(s.encode() in codec.decode(list(got.tokens)) for s in stops):
            fail("stop %r: the returned text still holds the stop string" % stops)
        checked += want_reason == "stop"
    if checked < 1:
        fail("no string stop was exercised (continuation %r)" % text_gen)
    # Three greedy samples with a string stop: at -np 2 and 3 some run on
    # ranks other than 0, which check the stop strings themselves (every
    # rank decodes the tokens: docs/sampling.md, "zdp serve: every rank samples").
    stops = next((t for t in tries if expected_stop(codec, gen, t)[1] == "stop"), tries[0])
    want_tokens, want_reason = expected_stop(codec, gen, stops)
    seqs = samp.sample(prompt, 3, types.SamplingParams(stop=stops, **greedy)).result().sequences
    if [(list(q.tokens), q.stop_reason) for q in seqs] != [(want_tokens, want_reason)] * 3:
        fail("stop %r, 3 samples: %s, wanted 3 x %s (%s)" % (stops, seqs, want_tokens, want_reason))
    print("lm_check: %d string stop cases checked" % len(tries), flush=True)
    # A token stop ends the sequence and is kept.
    got = samp.sample(prompt, 1, types.SamplingParams(stop=[gen[5]], **greedy)).result().sequences[0]
    want = gen[:gen.index(gen[5]) + 1]
    if list(got.tokens) != want or got.stop_reason != "stop":
        fail("token stop %d: %s, wanted %s" % (gen[5], got, want))

    # The sampling side in /info's memory (docs/sampling.md): every rank holds
    # the sampler weights the last asample read, and the KV cache of the last
    # request (1 sequence of 8 + 24 positions) holds at least its keys and values.
    st, info = plain(url, "GET", "/info")
    L = m.get("n_layer", 0)
    kv_dim = m["n_embd"] if "n_embd" in m else m.get("n_kv_head", 0) * m.get("head_dim", 0)
    for row in info.get("memory", []):
        if row.get("sampler_weights_bytes") != 4 * m.get("n_params", -1):
            fail("/info memory rank %s: sampler_weights_bytes %s, wanted 4 x %s parameters"
                 % (row.get("rank"), row.get("sampler_weights_bytes"), m.get("n_params")))
        if row.get("rank") == 0 and not (2 * L * 32 * kv_dim * 4 <= row.get("kv_cache_bytes", -1)
                                         <= row.get("kv_cache_peak_bytes", -1)):
            fail("/info memory rank 0: kv_cache_bytes %s, peak %s (wanted at least 2 x %d layers x 32 positions"
                 " x %d x 4 bytes, and peak >= last)" % (row.get("kv_cache_bytes"), row.get("kv_cache_peak_bytes"),
                                                       L, kv_dim))
    # Stop strings are bounded by --max-stop-bytes: one byte more is a 400
    # naming the field, the length and the flag.
    mb = info.get("limits", {}).get("max_stop_bytes", 0)
    st, js = plain(url, "POST", "/sample", {"prompt": ids[:8], "max_tokens": 4, "stop": ["x" * (mb + 1)]})
    msg = json.dumps(js)
    if st != 400 or "stop[0]" not in msg or "%d bytes" % (mb + 1) not in msg or "--max-stop-bytes %d" % mb not in msg:
        fail("/sample with a %d-byte stop string over --max-stop-bytes %s: %s %s" % (mb + 1, mb, st, js))
    st, js = plain(url, "POST", "/sample", {"prompt": ids[:8], "max_tokens": 4, "stop": ["x" * mb]})
    if st != 200:
        fail("/sample with a stop string of --max-stop-bytes %d bytes: %s %s" % (mb, st, js))

    # save_state / load_state: the weights come back (greedy sample equal).
    st, js = plain(url, "POST", "/save_state", {"path": "lm_check/s1"})
    if st != 200:
        fail("save_state: %s %s" % (st, js))
    tc.forward_backward(data, "cross_entropy").result()
    tc.optim_step(types.AdamParams(learning_rate=3e-2)).result()
    st, js = plain(url, "POST", "/load_state", {"path": "lm_check/s1"})
    if st != 200:
        fail("load_state: %s %s" % (st, js))
    st, js = plain(url, "POST", "/sample", {"prompt": ids[:8], "max_tokens": 24, "temperature": 0})
    if st != 200 or js["sequences"][0]["tokens"] != gen:
        fail("after load_state, greedy /sample %s, wanted %s" % (js, gen))
    # The plain /sample takes the same stops.
    for stops in tries + [[gen[5]]]:
        if any(isinstance(x, int) for x in stops):
            want_tokens, want_reason = gen[:gen.index(gen[5]) + 1], "stop"
        else:
            want_tokens, want_reason = expected_stop(codec, gen, stops)
        st, js = plain(url, "POST", "/sample", {"prompt": ids[:8], "max_tokens": 24, "temperature": 0, "stop": stops})
        got = js.get("sequences", [{}])[0]
        if st != 200 or got.get("tokens") != want_tokens or got.get("stop_reason") != want_reason:
            fail("/sample stop %r: %s %s, wanted %s (%s)" % (stops, st, js, want_tokens, want_reason))
    st, js = plain(url, "POST", "/sample", {"prompt": ids[:8], "stop": [""]})
    if st != 400 or "stop" not in json.dumps(js):
        fail("/sample with an empty stop string: %s %s (wanted 400 naming stop)" % (st, js))
    print("lm_check: %d failure(s)" % FAILURES, flush=True)
    check_packs(url, tc, data, ids)
    return min(FAILURES, 100)


def packed_kernels_run():
    """zdp_nn_packed_wins() for the server's 8-row prefills, in its
    environment (docs/config.md): ZDP_GEMM=zdp always, ZDP_GEMM=blas never,
    else on the AVX-512 and AVX2 paths (a CPU with avx2 and fma that
    ZDP_GEMM_ISA does not pin to 0), not on the portable one."""
    mode = os.environ.get("ZDP_GEMM", "auto")
    if mode in ("zdp", "blas"):
        return mode == "zdp"
    flags = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    return {"avx2", "fma"} <= flags and os.environ.get("ZDP_GEMM_ISA") != "0"


def check_packs(url, tc, data, ids):
    """Packed weights (docs/sampling.md, "Packed weights"): the copy batched
    decode steps multiply by is made once per weights snapshot and shared by
    requests, and dropped when the weights change.  A live greedy /sample, a
    training step, a live /sample again: the second must be the new weights'
    (a stale packed copy gives neither the old nor the new continuation), as
    are 4 greedy samples in one batch from a sampler file saved from them
    (the prompt's 8-row prefill multiplies by packed copies on every rank)."""
    def live():
        st, js = plain(url, "POST", "/sample", {"prompt": ids[:8], "max_tokens": 24, "temperature": 0})
        if st != 200:
            fail("packs: /sample %s %s" % (st, js))
            return []
        return js["sequences"][0]["tokens"]

    def rows():
        st, info = plain(url, "GET", "/info")
        return [(r.get("packed_weights_packs", -1), r.get("packed_weights_bytes", -1)) for r in info.get("memory", [])]

    # Steps towards one token the continuation lacks until the greedy
    # continuation changes: each live /sample packs the weights it sees.
    after = live()
    tgt = next((t for t in ids if t not in after), ids[0])
    pull = [types.Datum(model_input=d.model_input,
                        loss_fn_inputs={"target_tokens": [tgt] * d.model_input.length}) for d in data]
    for _ in range(6):
        before = after
        tc.forward_backward(pull, "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=5e-2)).result()
        after = live()
        if after != before:
            break
    if after == before:
        fail("packs: 6 training steps left the greedy continuation as it was (%s): the check proves nothing" % after)
    samp = tc.save_weights_and_get_sampling_client()
    prompt = types.ModelInput.from_ints(ids[:8])
    greedy = types.SamplingParams(max_tokens=24, temperature=0.0)
    got = [list(q.tokens) for q in samp.sample(prompt, 4, greedy).result().sequences]
    if got != [after] * 4:
        fail("packs: after a training step live /sample gave %s, 4 samples of its sampler file %s" % (after, got))
    # The same snapshot again: the same tokens and nothing packed anew.
    r1 = rows()
    again = [list(q.tokens) for q in samp.sample(prompt, 4, greedy).result().sequences]
    r2 = rows()
    if again != got:
        fail("packs: the same sampler file sampled again gave %s, first %s" % (again, got))
    per = -(-4 // max(len(r2), 1))  # the 4 samples in blocks of per: ranks past them sample nothing
    if not packed_kernels_run():
        # On the portable path the BLAS multiplies by the weights
        # themselves: nothing is packed, on any rank.
        if any(p != 0 or b != 0 for p, b in r1 + r2):
            fail("packs: /info (packed_weights_packs, packed_weights_bytes) per rank %s, then %s: wanted"
                 " 0 where the packed kernels do not run (ZDP_GEMM_ISA=%s, ZDP_GEMM=%s)"
                 % (r1, r2, os.environ.get("ZDP_GEMM_ISA"), os.environ.get("ZDP_GEMM")))
    elif r1 != r2 or any((p < 1 or b < 1) for r, (p, b) in enumerate(r2) if r * per < 4):
        fail("packs: /info (packed_weights_packs, packed_weights_bytes) per rank %s, then %s after sampling the"
             " same snapshot (wanted equal, > 0 on every rank with a share of the 4 samples)" % (r1, r2))
    print("lm_check: packs: greedy %s -> %s after a step; per rank (packs, bytes) %s" % (before[:6], after[:6], r2),
          flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
