#!/usr/bin/env bash
# `zdp init-model` and `zdp train --model-dir` through the command line: a
# folder trains at -np 1, 2, 3 and 4 with the same per-step losses (the same
# windows whatever W: train_batch_size is fixed); --save-model-dir writes a
# folder that trains on; ZeRO stage 3 gives stage 2's losses and saved folder;
# --save-dir/--resume continue exactly; an llm.c shard
# trains as the .npy of the same tokens; a GPT-2 folder round trip; and bad input
# (a missing or malformed config.json, an unknown model_type, a refused key,
# a tensor missing, a missing shard, a token outside the vocabulary, a text
# file, shape flags next to --model-dir, a block size past
# max_position_embeddings): one message on rank 0 naming the file and the
# key or tensor, non-zero exit, never a hang.
# usage: test_hf_train.sh ZDP_BINARY MPIEXEC
set -u
ZDP=$1
MPIEXEC=$2
source "$(dirname "$0")/lib.sh"

# A .npy int32 token array (numpy's format 1.0, written without numpy).
npy() {  # npy OUT N VOCAB [LAST]
  python3 - "$@" <<'PY'
import struct, sys
out, n, v = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
toks = [(i * 7919 + i // 3) % v for i in range(n)]
if len(sys.argv) > 4:
    toks[-1] = int(sys.argv[4])
head = "{'descr': '<i4', 'fortran_order': False, 'shape': (%d,), }" % n
head += " " * ((64 - (10 + len(head) + 1) % 64) % 64) + "\n"
open(out, "wb").write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(head)) + head.encode()
                      + struct.pack("<%di" % n, *toks))
PY
}

SHAPE=(--arch qwen3 --layers 2 --hidden 16 --heads 4 --kv-heads 2 --head-dim 8 --ffn 24
       --vocab 97 --max-pos 32 --tie)
expect_ok 1 init-model "${SHAPE[@]}" --seed 3 --out "$T/m"
grep -qF '"model_type": "qwen3"' "$T/m/config.json" || fail "init-model: config.json lacks model_type qwen3"
[ -f "$T/m/model.safetensors" ] || fail "init-model: no model.safetensors"
npy "$T/tok.npy" 3000 97
cat >"$T/ds.json" <<'JSON'
{"train_batch_size": 24, "train_micro_batch_size_per_gpu": 2,
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01}},
 "zero_optimization": {"stage": 2, "reduce_bucket_size": 500}}
JSON
TRAIN=(train --model-dir "$T/m" --config "$T/ds.json" --data "$T/tok.npy" --block-size 8
       --progress off --out-dir "$T/o")

# The same windows at every world size: the same losses (fp32 sums differ
# only in order).
for np in 1 2 3 4; do
  expect_ok "$np" "${TRAIN[@]}" --steps 3
  losses >"$T/loss.$np"
  [ "$(wc -l <"$T/loss.$np")" -eq 3 ] || { fail "-np $np: wanted 3 step lines"; cat "$T/out"; }
done
for np in 2 3 4; do
  paste "$T/loss.1" "$T/loss.$np" | awk -v np="$np" '
    { d = $2 - $4; if (d < 0) d = -d; if (d > 2e-5 * $2) { print "step " $1 ": -np 1 " $2 " vs -np " np " " $4; bad = 1 } }
    END { exit bad }' || fail "-np $np losses differ from -np 1"
done

# ZeRO stage 3 (the whole tensors pushed into the partitions, the gathered
# model saved): the same losses as stage 2, and the same saved weights.
sed 's/"stage": 2/"stage": 3/' "$T/ds.json" >"$T/ds3.json"
expect_ok 2 "${TRAIN[@]}" --steps 3 --save-model-dir "$T/s2"
losses >"$T/loss.s2"
expect_ok 2 train --model-dir "$T/m" --config "$T/ds3.json" --data "$T/tok.npy" --block-size 8 \
  --progress off --out-dir "$T/o" --steps 3 --save-model-dir "$T/s3"
losses | cmp -s - "$T/loss.s2" || { fail "stage 3 losses differ from stage 2"; cat "$T/out"; }
cmp -s "$T/s2/model.safetensors" "$T/s3/model.safetensors" ||
  fail "stage 3 --save-model-dir differs from stage 2's"

# --save-model-dir: a BF16 folder that trains on, and keeps the tokenizer.
echo '{"model": {"type": "BPE"}}' >"$T/m/tokenizer.json"
expect_ok 2 "${TRAIN[@]}" --steps 2 --save-model-dir "$T/saved" --save-dtype BF16
grep -qF '"torch_dtype": "bfloat16"' "$T/saved/config.json" || fail "--save-dtype BF16: torch_dtype"
[ -f "$T/saved/tokenizer.json" ] || fail "--save-model-dir: tokenizer.json not copied"
expect_ok 2 train --model-dir "$T/saved" --config "$T/ds.json" --data "$T/tok.npy" \
  --block-size 8 --steps 1 --progress off --out-dir "$T/o"

# Checkpoints: 2 steps, resume to 4 = 4 steps straight.
expect_ok 2 "${TRAIN[@]}" --steps 4
losses >"$T/straight"
expect_ok 2 "${TRAIN[@]}" --steps 2 --save-dir "$T/ck" --save-every 2
expect_ok 3 "${TRAIN[@]}" --steps 4 --resume "$T/ck"
losses >"$T/resumed"
paste <(tail -2 "$T/straight") "$T/resumed" | awk '
  { d = $2 - $4; if (d < 0) d = -d; if ($1 != $3 || d > 2e-5 * $2) { print; bad = 1 } }
  END { exit bad || NR != 2 }' || fail "--resume: steps 3-4 differ from a straight run"

# Sharded folders load too.
expect_ok 1 init-model "${SHAPE[@]}" --seed 3 --max-shard-bytes 4000 --out "$T/sh"
[ -f "$T/sh/model.safetensors.index.json" ] || fail "--max-shard-bytes: no index"
expect_ok 2 train --model-dir "$T/sh" --config "$T/ds.json" --data "$T/tok.npy" \
  --block-size 8 --steps 3 --progress off --out-dir "$T/o"
losses | cmp -s - <(head -3 "$T/loss.2") || fail "the sharded folder trains differently"

# llm.c token shards (uint16) load as well as .npy.
python3 - "$T/tok.bin" <<'PY'
import struct, sys
toks = [(i * 7919 + i // 3) % 97 for i in range(3000)]
hdr = struct.pack("<3i", 20240520, 1, len(toks)) + bytes(1012)
open(sys.argv[1], "wb").write(hdr + struct.pack("<%dH" % len(toks), *toks))
PY
expect_ok 2 train --model-dir "$T/m" --config "$T/ds.json" --data "$T/tok.bin" --block-size 8 \
  --steps 3 --progress off --out-dir "$T/o"
losses | cmp -s - "$T/loss.2" || fail "the llm.c shard of the same tokens trains differently from the .npy"

# A GPT-2 folder: written by --model gpt --save-model-dir, trained by --model-dir.
cat >"$T/gpt.json" <<'JSON'
{"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "Adam", "params": {"lr": 1e-3}}}
JSON
expect_ok 2 train --model gpt --n-layer 1 --n-head 2 --n-embd 16 --vocab-size 97 --block-size 16 \
  --config "$T/gpt.json" --data "$T/tok.npy" --steps 1 --progress off --out-dir "$T/o" \
  --save-model-dir "$T/g"
grep -qF '"model_type": "gpt2"' "$T/g/config.json" || fail "--model gpt --save-model-dir: not a gpt2 folder"
expect_ok 2 train --model-dir "$T/g" --config "$T/gpt.json" --data "$T/tok.npy" --block-size 8 \
  --steps 1 --progress off --out-dir "$T/o"
grep -qF "zdp train: gpt L=1 H=2 C=16 V=97 T=8" "$T/out" || { fail "--model-dir gpt2 folder"; cat "$T/out"; }

# ---- bad input ----------------------------------------------------------------
expect_error 1 "--arch is required" init-model --layers 1 --hidden 8 --heads 2 --ffn 8 --vocab 9 --out "$T/x"
expect_error 1 "--kv-heads 3: must divide --heads 4" init-model --arch llama --layers 1 --hidden 8 \
  --heads 4 --kv-heads 3 --ffn 8 --vocab 9 --out "$T/x"
expect_error 1 "--rope-scaling yarn:2" init-model --arch llama --layers 1 --hidden 8 --heads 2 \
  --ffn 8 --vocab 9 --rope-scaling yarn:2 --out "$T/x"
expect_error 1 "cannot create the folder" init-model --arch llama --layers 1 --hidden 8 --heads 2 \
  --ffn 8 --vocab 9 --out "$T/tok.npy/dir"
expect_ok 1 init-model --arch llama --layers 1 --hidden 8 --heads 2 --ffn 8 --vocab 9 \
  --out "$T/new/parents/dir"
[ -f "$T/new/parents/dir/config.json" ] || fail "init-model --out with missing parents"

expect_error 2 "$T/none: cannot open the model folder" train --model-dir "$T/none" --config "$T/ds.json" --data "$T/tok.npy"
mkdir -p "$T/b1"
expect_error 2 "b1/config.json: cannot read" train --model-dir "$T/b1" --config "$T/ds.json" --data "$T/tok.npy"
cp "$T/m/model.safetensors" "$T/b1/"
echo '{"model_type": "llama",' >"$T/b1/config.json"
expect_error 2 "b1/config.json: not valid JSON" train --model-dir "$T/b1" --config "$T/ds.json" --data "$T/tok.npy"
echo '{"model_type": "mixtral"}' >"$T/b1/config.json"
expect_error 2 "key \"model_type\" = \"mixtral\"" train --model-dir "$T/b1" --config "$T/ds.json" --data "$T/tok.npy"
sed 's/"use_sliding_window": false/"use_sliding_window": true/' "$T/m/config.json" >"$T/b1/config.json"
expect_error 2 "key \"use_sliding_window\" = true" train --model-dir "$T/b1" --config "$T/ds.json" --data "$T/tok.npy"
# A tensor missing: the folder's config says 3 layers, its weights hold 2.
sed 's/"num_hidden_layers": 2/"num_hidden_layers": 3/' "$T/m/config.json" >"$T/b1/config.json"
expect_error 2 "tensor \"model.layers.2.input_layernorm.weight\" is missing" train --model-dir "$T/b1" \
  --config "$T/ds.json" --data "$T/tok.npy" --block-size 8
# A wrong shape: the config's vocabulary differs from the weights'.
sed 's/"vocab_size": 97/"vocab_size": 98/' "$T/m/config.json" >"$T/b1/config.json"
expect_error 2 "\"model.embed_tokens.weight\": file shape [97, 16], model shape [98, 16]" \
  train --model-dir "$T/b1" --config "$T/ds.json" --data "$T/tok.npy" --block-size 8
# A missing shard.
mv "$T/sh/model-00002-of-"*.safetensors "$T/"
expect_error 2 "does not exist" train --model-dir "$T/sh" --config "$T/ds.json" --data "$T/tok.npy" --block-size 8
grep -qF "model.safetensors.index.json" "$T/out" || fail "missing shard: the index is not named"

expect_error 2 "--block-size 64: --model-dir $T/m's max_position_embeddings is 32" \
  train --model-dir "$T/m" --config "$T/ds.json" --data "$T/tok.npy" --block-size 64
expect_error 2 "--n-layer: the model comes from --model-dir" "${TRAIN[@]}" --n-layer 2
expect_error 2 "--save-model-dir" "${TRAIN[@]}" --steps 1 --save-model-dir "$T/tok.npy/dir"
grep -q "^step 1 " "$T/out" && fail "--save-model-dir under a file: refused only after training"
npy "$T/oov.npy" 500 97 97
expect_error 2 "token 97 at position 499 is outside the vocabulary of --model-dir" \
  train --model-dir "$T/m" --config "$T/ds.json" --data "$T/oov.npy" --block-size 8
echo "plain text, not token ids" >"$T/text.txt"
expect_error 2 "is text, which needs --model-dir" train --model-dir "$T/m" --config "$T/ds.json" --data "$T/text.txt" --block-size 8
expect_error 2 "--model-dir $T/m needs --data FILE" train --model-dir "$T/m" --config "$T/ds.json" --block-size 8

finish test_hf_train
