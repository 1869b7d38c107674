#!/usr/bin/env bash
# threads_bitwise.sh -- results do not depend on the kernels' thread count
# (src/core/pool.c, docs/config.md "Threads"): bit-identical files at
# ZDP_NUM_THREADS = 1, 2 and 3 for
#   - the Llama family's loss, logits and every gradient (llama_grads: a
#     Llama with GQA and tied embeddings, and a Qwen3 with q/k norm, biases
#     and an untied head), shapes big enough that the matrix products are cut
#     into pieces (rows 512, hidden 256, FFN 768);
#   - 3 steps of `zdp train --model gpt` at -np 1 (1, 2, 3 threads) and at
#     -np 2 (1 and 2 threads per rank): the saved weights.
# A kernel that splits a sum across threads, or a GEMM cut where OpenBLAS
# rounds differently, makes the files differ.
#
# Usage: bash tests/cli/threads_bitwise.sh ZDP LLAMA_GRADS MPIEXEC
set -uo pipefail
zdp=$1 llama_grads=$2 mpiexec=${3:-mpiexec}
work=$(mktemp -d) || exit 1
trap 'rm -rf "$work"' EXIT
fail() { echo "threads_bitwise: FAIL: $*" >&2; exit 1; }

# Tokens for llama_grads: a safetensors file with inputs and targets, I32 [4, 128].
python3 - "$work/tokens.safetensors" <<'PY' || fail "could not write the tokens file"
import json, random, struct, sys
B, T, V = 4, 128, 1000
rnd = random.Random(7)
ids = [rnd.randrange(V) for _ in range(B * T + 1)]
data = {"inputs": ids[:-1], "targets": ids[1:]}
header, blob, off = {}, b"", 0
for name, vals in data.items():
    raw = struct.pack("<%di" % len(vals), *vals)
    header[name] = {"dtype": "I32", "shape": [B, T], "data_offsets": [off, off + len(raw)]}
    blob += raw
    off += len(raw)
h = json.dumps(header).encode()
h += b" " * ((8 - len(h) % 8) % 8)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + blob)
PY

M="--layers 2 --hidden 256 --ffn 768 --vocab 1000 --block 128 --seed 3"
for cfg in "llama --heads 4 --kv-heads 2 --head-dim 64 --tied 1" \
           "qwen3 --heads 8 --kv-heads 2 --head-dim 48 --tied 0 --bias 1"; do
    name=${cfg%% *}
    for t in 1 2 3; do
        ZDP_NUM_THREADS=$t timeout 300 "$llama_grads" --arch $cfg $M \
            --tokens "$work/tokens.safetensors" --out "$work/$name.t$t.safetensors" \
            >"$work/log" 2>&1 || { cat "$work/log"; fail "llama_grads $name at $t threads"; }
    done
    for t in 2 3; do
        cmp -s "$work/$name.t1.safetensors" "$work/$name.t$t.safetensors" ||
            fail "$name: loss/logits/gradients at $t threads differ from 1 thread"
    done
    echo "threads_bitwise: $name gradients identical at 1, 2, 3 threads"
done

# GPT-2 training: token shard (llm.c format: 256 int32 header, then uint16).
python3 - "$work/tok.bin" <<'PY' || fail "could not write the token shard"
import random, struct, sys
n = 40000
rnd = random.Random(5)
hdr = [20240520, 1, n] + [0] * 253
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", *hdr) + struct.pack("<%dH" % n, *[rnd.randrange(256) for _ in range(n)]))
PY
cat >"$work/ds.json" <<'JSON'
{"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
 "steps_per_print": 1000000, "zero_optimization": {"stage": 2},
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.1}}}
JSON
run_gpt() { # np threads out
    ZDP_NUM_THREADS=$2 timeout 300 "$mpiexec" -np "$1" --oversubscribe "$zdp" train --model gpt \
        --n-layer 2 --n-head 4 --n-embd 128 --vocab-size 256 --block-size 128 \
        --config "$work/ds.json" --data "$work/tok.bin" --data-order sequential --steps 3 \
        --val-every 0 --progress off --out-dir "$work/out" --save-weights "$3" \
        >"$work/log" 2>&1 || { cat "$work/log"; fail "zdp train -np $1 at $2 threads"; }
}
for t in 1 2 3; do run_gpt 1 $t "$work/gpt1.t$t.safetensors"; done
for t in 2 3; do
    cmp -s "$work/gpt1.t1.safetensors" "$work/gpt1.t$t.safetensors" ||
        fail "gpt -np 1: weights after 3 steps at $t threads differ from 1 thread"
done
for t in 1 2; do run_gpt 2 $t "$work/gpt2.t$t.safetensors"; done
cmp -s "$work/gpt2.t1.safetensors" "$work/gpt2.t2.safetensors" ||
    fail "gpt -np 2: weights after 3 steps at 2 threads per rank differ from 1 thread"
echo "threads_bitwise: gpt training identical at 1, 2, 3 threads (-np 1) and 1, 2 (-np 2)"
