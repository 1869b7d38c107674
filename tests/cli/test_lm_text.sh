#!/usr/bin/env bash
# Text with a model folder's tokenizer (docs/models.md, "Sampling and
# serving", "Training on text"): a tiny Llama folder from `zdp init-model`
# with GPT-2's real tokenizer.
#   - `zdp train --model-dir --data FILE.txt` at -np 1..4 gives, step for
#     step, the losses of the same run on the ids `zdp tokenize` writes (as
#     .npy): the text is tokenized with the folder's tokenizer, nothing else;
#     --data-format text reads a file of another name the same way.
#   - after training on a repeated sentence, `zdp sample --model-dir
#     --prompt` continues it greedily (text in and out through the tokenizer).
#   - refusals: text with a folder that has no tokenizer, --model-dir with
#     --weights, an empty prompt.
# Exit 77 (skipped) when the shared folder beside the repository (ZDP_SHARED
# overrides where) has no GPT-2 tokenizer.
# usage: test_lm_text.sh ZDP_BINARY MPIEXEC
set -u
ZDP=$1
MPIEXEC=$2
HERE=$(cd "$(dirname "$0")" && pwd)
SHARED=${ZDP_SHARED:-$(cd "$HERE/../../.." && pwd)/shared}
TOK="$SHARED/data/tokenizers/gpt2"
PY=${PYTHON:-python3}
[ -f "$TOK/encoder.json" ] || { echo "SKIP: no GPT-2 tokenizer at $TOK (encoder.json + vocab.bpe)"; exit 77; }
source "$(dirname "$0")/lib.sh"

"$ZDP" init-model --arch llama --layers 2 --hidden 32 --heads 4 --kv-heads 2 --ffn 64 --vocab 50257 --tie \
  --max-pos 128 --tokenizer "$TOK" --out "$T/tiny" >"$T/init.log" 2>&1 || { fail "init-model"; cat "$T/init.log"; }
for _ in $(seq 150); do printf 'To be, or not to be, that is the question: whether tis nobler in the mind.\n'; done >"$T/text.txt"
cp "$T/text.txt" "$T/text.data"
"$ZDP" tokenize --tokenizer "$T/tiny" <"$T/text.txt" >"$T/ids.txt" || fail "zdp tokenize"
$PY - "$T/ids.txt" "$T/ids.npy" <<'PY' || fail "writing ids.npy"
import struct, sys
ids = [int(x) for x in open(sys.argv[1]).read().split()]
hdr = "{'descr': '<i4', 'fortran_order': False, 'shape': (%d,), }" % len(ids)
hdr += " " * (63 - (10 + len(hdr)) % 64) + "\n"
with open(sys.argv[2], "wb") as f:
    f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr.encode() + struct.pack("<%di" % len(ids), *ids))
PY

cat >"$T/cfg.json" <<JSON
{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}, "zero_optimization": {"stage": 1}}
JSON
cat >"$T/learn.json" <<JSON
{"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-2}}, "zero_optimization": {"stage": 0}}
JSON
# losses LOG: the step lines' losses
losses() { grep -o '^step *[0-9]* | loss [0-9.]*' "$1" | sed 's/.*loss //'; }
train() { # NP DATA OUT [ARGS...]
  local np=$1 data=$2 out=$3
  shift 3
  timeout 300 "$MPIEXEC" -np "$np" --oversubscribe "$ZDP" train --model-dir "$T/tiny" --config "$T/cfg.json" \
    --data "$data" --block-size 32 --steps 3 --val-every 0 --val-fraction 0.1 --progress off --out-dir "$T/o" \
    "$@" >"$out" 2>&1
}
for np in 1 2 3 4; do
  train $np "$T/text.txt" "$T/text$np.log" || { fail "train on text at -np $np"; tail -5 "$T/text$np.log"; continue; }
  train $np "$T/ids.npy" "$T/npy$np.log" || { fail "train on .npy at -np $np"; tail -5 "$T/npy$np.log"; continue; }
  grep -q "text, $(wc -w <"$T/ids.txt") tokens" "$T/text$np.log" || fail "-np $np: no line saying the text became $(wc -w <"$T/ids.txt") tokens"
  [ "$(losses "$T/text$np.log" | wc -l)" -eq 3 ] || fail "-np $np: not 3 step lines"
  [ "$(losses "$T/text$np.log")" = "$(losses "$T/npy$np.log")" ] ||
    fail "-np $np: losses on text $(losses "$T/text$np.log" | tr '\n' ' ') != on its ids $(losses "$T/npy$np.log" | tr '\n' ' ')"
done
train 2 "$T/text.data" "$T/fmt.log" --data-format text || { fail "--data-format text"; tail -5 "$T/fmt.log"; }
[ "$(losses "$T/fmt.log")" = "$(losses "$T/text2.log")" ] || fail "--data-format text on text.data differs from text.txt"

# Greedy sampling through the tokenizer after learning the sentence.
timeout 300 "$MPIEXEC" -np 1 "$ZDP" train --model-dir "$T/tiny" --config "$T/learn.json" \
  --data "$T/text.txt" --block-size 32 --steps 40 --val-every 0 --progress off --out-dir "$T/o" \
  --save-model-dir "$T/trained" >"$T/learn.log" 2>&1 || { fail "training on the sentence"; tail -5 "$T/learn.log"; }
"$ZDP" sample --model-dir "$T/trained" --prompt "To be, or not" --max-tokens 12 --temperature 0 >"$T/sample.txt" 2>&1 ||
  { fail "zdp sample --model-dir"; cat "$T/sample.txt"; }
grep -q "^To be, or not to be, that is the question" "$T/sample.txt" ||
  { fail "greedy sample does not continue the learnt sentence"; cat "$T/sample.txt"; }

# Refusals name the flag and the fix.
mkdir -p "$T/notok" && cp "$T/tiny/config.json" "$T/tiny/model.safetensors" "$T/notok/"
train 1 "$T/text.txt" "$T/notok.log" --model-dir "$T/notok" && fail "text with a folder without a tokenizer trained"
grep -q "needs --model-dir.*tokenizer" "$T/notok.log" || { fail "no tokenizer: message"; cat "$T/notok.log"; }
"$ZDP" sample --model-dir "$T/notok" --prompt "x" >"$T/r1.log" 2>&1 && fail "sample without a tokenizer ran"
grep -q "no tokenizer" "$T/r1.log" || { fail "sample without a tokenizer: message"; cat "$T/r1.log"; }
"$ZDP" sample --model-dir "$T/tiny" --weights x.safetensors >"$T/r2.log" 2>&1 && fail "--model-dir with --weights ran"
grep -q "give one" "$T/r2.log" || { fail "--model-dir with --weights: message"; cat "$T/r2.log"; }
"$ZDP" sample --model-dir "$T/tiny" --prompt "" >"$T/r3.log" 2>&1 && fail "an empty prompt ran"
grep -q "\-\-prompt: empty" "$T/r3.log" || { fail "empty prompt: message"; cat "$T/r3.log"; }

finish test_lm_text
