#!/usr/bin/env bash
# `zdp sample --num-samples --batch` (docs/sampling.md) on a tiny Llama
# folder from `zdp init-model` with GPT-2's real tokenizer:
#   - 3 samples decoded 2 at a time (the KV cache, continuous batching) are,
#     text for text, the same as each sampled alone with its seed (seed + i);
#   - greedy sampling is the same at every --batch;
#   - the speed line (tokens/s) goes to stderr;
#   - refusals name the flag: --max-tokens beyond the context, --batch 0.
# Exit 77 (skipped) when the shared folder beside the repository (ZDP_SHARED
# overrides where) has no GPT-2 tokenizer.
# usage: test_sample.sh ZDP_BINARY MPIEXEC
set -u
ZDP=$1
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

# Refusals.
"$ZDP" sample --model-dir "$T/m" --prompt "To be" --max-tokens 100 >"$T/r1.log" 2>&1 && fail "--max-tokens beyond the context ran"
grep -q "\-\-max-tokens 100: .*context (block_size 64): give at most 62" "$T/r1.log" || { fail "--max-tokens message"; cat "$T/r1.log"; }
"$ZDP" sample --model-dir "$T/m" --prompt "To be" --batch 0 >"$T/r2.log" 2>&1 && fail "--batch 0 ran"
grep -q "\-\-batch" "$T/r2.log" || { fail "--batch 0 message"; cat "$T/r2.log"; }

finish test_sample
