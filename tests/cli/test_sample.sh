#!/usr/bin/env bash
# `zdp sample --num-samples --batch` (docs/sampling.md) on a tiny Llama
# folder from `zdp init-model` with GPT-2's real tokenizer:
#   - 3 samples decoded 2 at a time (the KV cache, continuous batching) are,
#     text for text, the same as each sampled alone with its seed (seed + i);
#   - greedy sampling is the same at every --batch;
#   - the speed line (tokens/s) goes to stderr;
#   - --adapter: a PEFT folder trained here (every target) applied while
#     decoding: greedy with it equals greedy over the `zdp lora merge`d
#     folder, and differs from the base's;
#   - refusals name the flag: --max-tokens beyond the context, --batch 0,
#     --adapter without --model-dir, an adapter for another base.
# Exit 77 (skipped) when the shared folder beside the repository (ZDP_SHARED
# overrides where) has no GPT-2 tokenizer.
# usage: test_sample.sh ZDP_BINARY MPIEXEC
set -u
ZDP=$1
MPIEXEC=${2:-mpiexec}
HERE=$(cd "$(dirname "$0")" && pwd)
SHARED=${ZDP_SHARED:-$(cd "$HERE/../../.." && pwd)/shared}
TOK="$SHARED/data/tokenizers/gpt2"
[ -f "$TOK/encoder.json" ] || { echo "SKIP: no GPT-2 tokenizer at $TOK (encoder.json + vocab.bpe)"; exit 77; }
source "$(dirname "$0")/lib.sh"

"$ZDP" init-model --arch llama --layers 2 --hidden 32 --heads 4 --kv-heads 2 --ffn 64 --vocab 50257 \
  --max-pos 64 --tokenizer "$TOK" --out "$T/m" >"$T/init.log" 2>&1 || { fail "init-model"; cat "$T/init.log"; }
S=("$ZDP" sample --model-dir "$T/m" --prompt "To be, or not" --max-tokens 12 --temperature 1.0 --top-k 0)

"${S[@]}" --num-samples 3 --batch 2 --seed 7 >"$T/all.txt" 2>"$T/all.err" || { fail "--num-samples 3 --batch 2"; cat "$T/all.err"; }
grep -q "3 sample(s), [0-9]* new tokens in .* tokens/s (batch 2, .*KV cache [0-9.]* MB)" "$T/all.err" || { fail "no tokens/s line"; cat "$T/all.err"; }
[ "$(grep -c '^--- sample [1-3] of 3' "$T/all.txt")" -eq 3 ] || { fail "not 3 samples"; cat "$T/all.txt"; }
# Sample i's text (between its header and the next ---).
nth() { awk -v want="--- sample $2 of 3 (seed" 'index($0, want) == 1 {on = 1; next} on && /^---$/ {exit} on' "$1"; }
alone() { awk 'NR == 1 {next} /^---$/ {exit} {print}' "$1"; }
for i in 1 2 3; do
  "${S[@]}" --seed $((6 + i)) >"$T/one$i.txt" 2>/dev/null || fail "sample $i alone"
  [ "$(nth "$T/all.txt" $i)" = "$(alone "$T/one$i.txt")" ] ||
    { fail "sample $i batched != alone"; nth "$T/all.txt" $i; alone "$T/one$i.txt"; }
done
# Different seeds give different samples (so the comparison above means something).
[ "$(nth "$T/all.txt" 1)" != "$(nth "$T/all.txt" 2)" ] || fail "samples 1 and 2 are equal"

G=("$ZDP" sample --model-dir "$T/m" --prompt "To be, or not" --max-tokens 20 --temperature 0 --num-samples 3)
"${G[@]}" --batch 1 >"$T/g1.txt" 2>/dev/null || fail "greedy --batch 1"
"${G[@]}" --batch 3 >"$T/g3.txt" 2>/dev/null || fail "greedy --batch 3"
cmp -s "$T/g1.txt" "$T/g3.txt" || { fail "greedy --batch 1 != --batch 3"; diff "$T/g1.txt" "$T/g3.txt"; }

# --adapter: train 3 LoRA steps (every target, so the untied lm_head too), then greedy with the
# adapter == greedy over the merged folder != the base's greedy.
python3 - "$T/tok.npy" <<'PY'
import struct, sys
n, v = 4000, 50257
toks = [(i * 7919 + i // 3) % v for i in range(n)]
head = "{'descr': '<i4', 'fortran_order': False, 'shape': (%d,), }" % n
head += " " * ((64 - (10 + len(head) + 1) % 64) % 64) + "\n"
open(sys.argv[1], "wb").write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(head)) + head.encode()
                              + struct.pack("<%di" % n, *toks))
PY
cat >"$T/ds.json" <<'JSON'
{"train_batch_size": 2, "train_micro_batch_size_per_gpu": 2,
 "optimizer": {"type": "AdamW", "params": {"lr": 5e-2, "weight_decay": 0.0}}}
JSON
timeout 120 "$MPIEXEC" -np 1 "$ZDP" train --model-dir "$T/m" --config "$T/ds.json" --data "$T/tok.npy" \
  --block-size 32 --steps 3 --lora-rank 4 --save-adapter-dir "$T/a" --out-dir "$T/o" >"$T/train.log" 2>&1 ||
  { fail "zdp train --lora-rank"; cat "$T/train.log"; }
"$ZDP" lora merge --model-dir "$T/m" --adapter "$T/a" --out "$T/mm" >"$T/merge.log" 2>&1 ||
  { fail "zdp lora merge"; cat "$T/merge.log"; }
A=("$ZDP" sample --prompt "To be, or not" --max-tokens 30 --temperature 0)
body() { sed 1d "$1"; }  # the text, without the header line (it names the adapter)
"${A[@]}" --model-dir "$T/m" --adapter "$T/a" --num-samples 2 --batch 2 >"$T/ad.txt" 2>"$T/ad.err" ||
  { fail "--adapter"; cat "$T/ad.err"; }
grep -q "LoRA adapter rank 4 alpha 32" "$T/ad.txt" || { fail "--adapter: header lacks the adapter"; cat "$T/ad.txt"; }
"${A[@]}" --model-dir "$T/mm" --num-samples 2 --batch 2 >"$T/mm.txt" 2>/dev/null || fail "merged folder"
"${A[@]}" --model-dir "$T/m" --num-samples 2 --batch 2 >"$T/base.txt" 2>/dev/null || fail "base folder"
[ "$(body "$T/ad.txt")" = "$(body "$T/mm.txt")" ] ||
  { fail "greedy with --adapter != greedy over the merged folder"; diff "$T/ad.txt" "$T/mm.txt"; }
[ "$(body "$T/ad.txt")" != "$(body "$T/base.txt")" ] || fail "--adapter changed nothing (the test proves nothing)"
"$ZDP" sample --weights "$T/x.safetensors" --adapter "$T/a" >"$T/r3.log" 2>&1 && fail "--adapter without --model-dir ran"
grep -q "\-\-adapter .*needs --model-dir" "$T/r3.log" || { fail "--adapter without --model-dir message"; cat "$T/r3.log"; }
"$ZDP" init-model --arch llama --layers 2 --hidden 48 --heads 4 --kv-heads 2 --ffn 64 --vocab 50257 \
  --max-pos 64 --tokenizer "$TOK" --out "$T/w" >/dev/null 2>&1 || fail "init-model (wide)"
"$ZDP" sample --model-dir "$T/w" --adapter "$T/a" --max-tokens 2 >"$T/r4.log" 2>&1 && fail "an adapter for another base ran"
grep -q "\-\-adapter .*has shape" "$T/r4.log" || { fail "another base's adapter message"; cat "$T/r4.log"; }

# Refusals.
"$ZDP" sample --model-dir "$T/m" --prompt "To be" --max-tokens 100 >"$T/r1.log" 2>&1 && fail "--max-tokens beyond the context ran"
grep -q "\-\-max-tokens 100: .*context (block_size 64): give at most 62" "$T/r1.log" || { fail "--max-tokens message"; cat "$T/r1.log"; }
"$ZDP" sample --model-dir "$T/m" --prompt "To be" --batch 0 >"$T/r2.log" 2>&1 && fail "--batch 0 ran"
grep -q "\-\-batch" "$T/r2.log" || { fail "--batch 0 message"; cat "$T/r2.log"; }

finish test_sample
