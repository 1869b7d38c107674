#!/usr/bin/env bash
# LoRA from the command line: `zdp train --model-dir DIR --lora-rank r`
# trains only the adapters (the same per-step losses at -np 1, 2 and 3, the
# startup line counting adapter parameters), --save-adapter-dir writes a
# PEFT folder, `zdp lora merge` writes a merged model folder whose val loss
# is the LoRA model's (tied Qwen3 with an lm_head adapter: the head comes
# out untied; untied Llama with attn,mlp; q_proj,v_proj alone), checkpoints of
# the adapters resume exactly (and refuse another rank), ZeRO stage 3 (the
# base partitioned: stage 2's losses; each rank reads only its slices of
# the folder, its loader's peak at most 2x the largest tensor, full and LoRA
# at -np 1-4), and bad input (rank 0, a rank
# larger than a target, an unknown target, LoRA flags without --lora-rank or
# without --model-dir, --save-model-dir with LoRA, an adapter for another
# base, a missing adapter folder): one message naming the flag or tensor,
# non-zero exit, never a hang.
# usage: test_lora_cli.sh ZDP_BINARY MPIEXEC
set -u
ZDP=$1
MPIEXEC=$2
source "$(dirname "$0")/lib.sh"
last_val() { grep -E '^step [0-9]+ \|.*val_loss' "$T/out" | tail -1 | sed -E 's/.*val_loss ([^ ]+).*/\1/'; }

npy() {  # npy OUT N VOCAB: a .npy int32 token array (numpy's format 1.0)
  python3 - "$@" <<'PY'
import struct, sys
out, n, v = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
toks = [(i * 7919 + i // 3) % v for i in range(n)]
head = "{'descr': '<i4', 'fortran_order': False, 'shape': (%d,), }" % n
head += " " * ((64 - (10 + len(head) + 1) % 64) % 64) + "\n"
open(out, "wb").write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(head)) + head.encode()
                      + struct.pack("<%di" % n, *toks))
PY
}

# check_load WHAT NP: each rank's load_peak (--memory-report) is at most 2x the
# largest tensor of $T/q (fp32 bytes) and below the whole model's bytes.
check_load() {
  local r lp
  for r in $(seq 0 $(($2 - 1))); do
    lp=$(grep -a "^memory | rank $r | load_peak |" "$T/out" | awk '{print $(NF-1)}')
    grep -aq "^memory | rank $r | peak_rss | [0-9]* B\$" "$T/out" || fail "$1: no peak_rss line for rank $r"
    [ -n "$lp" ] && [ "$lp" -gt 0 ] || { fail "$1: no load_peak for rank $r"; continue; }
    [ "$lp" -le $((2 * LARGEST)) ] && [ "$lp" -lt "$WHOLE" ] ||
      fail "$1: rank $r held $lp B of weights at once while loading; at most 2 x the largest tensor ($LARGEST B) allowed, the whole model is $WHOLE B"
  done
}

expect_ok 1 init-model --arch qwen3 --layers 2 --hidden 16 --heads 4 --kv-heads 2 --head-dim 8 \
  --ffn 24 --vocab 97 --max-pos 32 --tie --seed 3 --out "$T/q"
expect_ok 1 init-model --arch llama --layers 2 --hidden 16 --heads 4 --kv-heads 2 --ffn 24 \
  --vocab 97 --max-pos 32 --seed 4 --out "$T/l"
expect_ok 1 init-model --arch llama --layers 2 --hidden 24 --heads 4 --ffn 24 --vocab 97 \
  --max-pos 32 --seed 4 --out "$T/wide"
npy "$T/tok.npy" 3000 97
read -r LARGEST WHOLE < <(python3 - "$T/q/model.safetensors" <<'PY'
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
head = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
n = [4 * eval("*".join(map(str, v["shape"])) or "1") for k, v in head.items() if k != "__metadata__"]
print(max(n), sum(n))
PY
)
[ "$LARGEST" -gt 0 ] && [ "$WHOLE" -gt $((2 * LARGEST)) ] || fail "the test model is too small to tell a whole-model load ($LARGEST, $WHOLE)"
cat >"$T/ds.json" <<'JSON'
{"train_batch_size": 12, "train_micro_batch_size_per_gpu": 2,
 "optimizer": {"type": "AdamW", "params": {"lr": 2e-2, "weight_decay": 0.0}},
 "zero_optimization": {"stage": 2, "reduce_bucket_size": 300}}
JSON
cat >"$T/lr0.json" <<'JSON'
{"train_batch_size": 12, "train_micro_batch_size_per_gpu": 2,
 "optimizer": {"type": "SGD", "params": {"lr": 0.0}}, "zero_allow_untested_optimizer": true}
JSON
TRAIN=(train --config "$T/ds.json" --data "$T/tok.npy" --block-size 16 --steps 4 --val-every 4
       --val-fraction 0.1 --val-batches 2 --out-dir "$T/o")

# The same losses at -np 1, 2, 3 (train_batch_size fixed); adapters only.
ref=""
for np in 1 2 3; do
  expect_ok $np "${TRAIN[@]}" --model-dir "$T/q" --lora-rank 4 --lora-alpha 8 \
    --save-adapter-dir "$T/a$np"
  got=$(losses)
  [ -n "$got" ] || fail "-np $np: no step lines"
  if [ $np -eq 1 ]; then ref=$got; val_q=$(last_val);
  elif [ "$got" != "$ref" ]; then fail "-np $np losses differ from -np 1: $got vs $ref"; fi
  # per layer q 192, k 128, v 128, o 192, gate/up/down 160 each; lm_head 64 + 388
  grep -qF "LoRA: rank 4, alpha 8, targets attn,mlp,unembed: 2692 adapter parameters" "$T/out" ||
    { fail "-np $np: no LoRA start-up line"; grep LoRA "$T/out"; }
done
[ -f "$T/a3/adapter_model.safetensors" ] || fail "-np 3: no adapter_model.safetensors"
grep -qF '"peft_type": "LORA"' "$T/a1/adapter_config.json" || fail "adapter_config.json: no peft_type"
grep -qF '"lm_head"' "$T/a1/adapter_config.json" || fail "adapter_config.json: no lm_head"

# Merge (the tied head comes out untied); the merged model's val loss is the LoRA model's.
expect_ok 1 lora merge --model-dir "$T/q" --adapter "$T/a1" --out "$T/mq"
grep -qF "lm_head untied" "$T/out" || fail "merge: tied head not reported untied"
grep -qF '"tie_word_embeddings": false' "$T/mq/config.json" || fail "merged config still tied"
TRAIN0=(train --config "$T/lr0.json" --data "$T/tok.npy" --block-size 16 --steps 1 --val-every 1
        --val-fraction 0.1 --val-batches 2 --out-dir "$T/o")
expect_ok 1 "${TRAIN0[@]}" --model-dir "$T/mq"
val_m=$(last_val)
python3 -c "import sys; a,b=float('$val_q'),float('$val_m'); sys.exit(0 if abs(a-b) <= 2e-4*abs(a) else 1)" ||
  fail "merged val loss $val_m != LoRA val loss $val_q"
# Untied Llama, attn and mlp only.
expect_ok 2 "${TRAIN[@]}" --model-dir "$T/l" --lora-rank 2 --lora-targets attn,mlp \
  --save-adapter-dir "$T/al"
val_l=$(last_val)
grep -qF '"lm_head"' "$T/al/adapter_config.json" && fail "attn,mlp adapter lists lm_head"
expect_ok 1 lora merge --model-dir "$T/l" --adapter "$T/al" --out "$T/ml" --dtype F32
expect_ok 2 "${TRAIN0[@]}" --model-dir "$T/ml"  # -np 2: the same val batches
val_ml=$(last_val)
python3 -c "import sys; a,b=float('$val_l'),float('$val_ml'); sys.exit(0 if abs(a-b) <= 2e-4*abs(a) else 1)" ||
  fail "merged llama val loss $val_ml != LoRA val loss $val_l"
# PEFT's common partial set: q_proj and v_proj only.  The folder lists exactly those,
# --adapter reads it back (the same adapter tensors), and the merge has the LoRA val loss.
expect_ok 2 "${TRAIN[@]}" --model-dir "$T/l" --lora-rank 2 --lora-targets q_proj,v_proj \
  --save-adapter-dir "$T/aqv"
val_qv=$(last_val)
# per layer q 2*16 + 16*2 = 64, v 2*16 + 8*2 = 48; 2 layers
grep -qF "LoRA: rank 2, alpha 32, targets q_proj,v_proj: 224 adapter parameters" "$T/out" ||
  { fail "q_proj,v_proj: start-up line"; grep LoRA "$T/out"; }
python3 -c "import json,sys; m=json.load(open('$T/aqv/adapter_config.json'))['target_modules']; sys.exit(0 if m == ['q_proj', 'v_proj'] else 1)" ||
  { fail "q_proj,v_proj: target_modules"; cat "$T/aqv/adapter_config.json"; }
expect_ok 1 "${TRAIN0[@]}" --model-dir "$T/l" --adapter "$T/aqv" --save-adapter-dir "$T/aqv2"
grep -qF "targets q_proj,v_proj: 224 adapter parameters" "$T/out" || fail "--adapter q_proj,v_proj: start-up line"
expect_ok 1 lora merge --model-dir "$T/l" --adapter "$T/aqv" --out "$T/mqv" --dtype F32
expect_ok 2 "${TRAIN0[@]}" --model-dir "$T/mqv"
val_mqv=$(last_val)
python3 -c "import sys; a,b=float('$val_qv'),float('$val_mqv'); sys.exit(0 if abs(a-b) <= 2e-4*abs(a) else 1)" ||
  fail "merged q_proj,v_proj val loss $val_mqv != LoRA val loss $val_qv"
expect_error 2 "attn.c_attn is not a module of this Llama-family base" "${TRAIN[@]}" --model-dir "$T/l" \
  --lora-rank 2 --lora-targets attn.c_attn

# Checkpoints hold the adapters: 2 steps, resume to 4 = the -np 1 run's steps 3-4; a
# checkpoint of another rank is refused naming the key.
expect_ok 2 "${TRAIN[@]}" --model-dir "$T/q" --lora-rank 4 --lora-alpha 8 --steps 2 \
  --save-dir "$T/ck" --save-every 2
expect_ok 2 "${TRAIN[@]}" --model-dir "$T/q" --lora-rank 4 --lora-alpha 8 --resume "$T/ck"
[ "$(losses)" = "$(echo "$ref" | tail -2)" ] || fail "--resume: steps 3-4 $(losses) vs $ref"
expect_error 2 "lora_rank" "${TRAIN[@]}" --model-dir "$T/q" --lora-rank 2 --lora-alpha 8 \
  --resume "$T/ck"

# ZeRO stage 3: the adapters partitioned and the base too, gathered layer by
# layer (docs/lora.md): the same losses as stage 2, the base's partition in
# the memory report.
sed 's/"stage": 2,/"stage": 3, "stage3_param_persistence_threshold": 0,/' "$T/ds.json" >"$T/ds3.json"
for np in 2 3; do
  expect_ok $np "${TRAIN[@]/%ds.json/ds3.json}" --model-dir "$T/q" --lora-rank 4 --lora-alpha 8 \
    --memory-report on
  [ "$(losses)" = "$ref" ] || fail "stage 3 -np $np losses differ from stage 2: $(losses) vs $ref"
  frozen=$(grep -a '^memory | rank 0 | frozen |' "$T/out" | awk '{print $(NF-1)}')
  [ -n "$frozen" ] && [ "$frozen" -gt 0 ] || fail "stage 3 -np $np: no frozen partition in the memory report"
  check_load "LoRA stage 3 -np $np" $np
done

# Stage 3 loading (docs/training.md): every rank reads only its slices of the
# folder, so the most weight bytes its loader holds at once (load_peak) stay
# at or below 2x the largest tensor's (the slice and its staged raw bytes),
# never the whole model, at -np 1-4, full fine-tuning and LoRA; the losses
# are stage 2's, and --save-model-dir (streamed at stage 3) writes stage 2's
# bytes.  (Loading whole tensors everywhere -- zdp_hf_weights_load --
# gives load_peak = the whole model, which is above that bound here.)
sed 's/"train_batch_size": 12/"train_batch_size": 24/' "$T/ds.json" >"$T/ds2b.json"
sed 's/"stage": 2,/"stage": 3, "stage3_param_persistence_threshold": 0,/' "$T/ds2b.json" >"$T/ds3b.json"
TRAINB=(train --config "$T/ds2b.json" --data "$T/tok.npy" --block-size 16 --steps 3 --val-every 0
        --out-dir "$T/o" --memory-report on)
expect_ok 1 "${TRAINB[@]}" --model-dir "$T/q"
ref_full=$(losses)
expect_ok 1 "${TRAINB[@]}" --model-dir "$T/q" --lora-rank 4 --lora-alpha 8
ref_lora=$(losses)
for np in 1 2 3 4; do
  # --save-model-dir at stage 3 streams the folder a gathered tensor at a time:
  # the same bytes as stage 2's whole-model save at this -np.
  expect_ok $np "${TRAINB[@]}" --model-dir "$T/q" --save-model-dir "$T/s2full" --save-dtype BF16
  expect_ok $np "${TRAINB[@]/%ds2b.json/ds3b.json}" --model-dir "$T/q" --save-model-dir "$T/s3full" \
    --save-dtype BF16
  [ "$(losses)" = "$ref_full" ] || fail "full stage 3 -np $np losses differ from stage 2: $(losses) vs $ref_full"
  cmp -s "$T/s2full/model.safetensors" "$T/s3full/model.safetensors" ||
    fail "full stage 3 -np $np: --save-model-dir wrote other bytes than stage 2's"
  check_load "full stage 3 -np $np" $np
  expect_ok $np "${TRAINB[@]/%ds2b.json/ds3b.json}" --model-dir "$T/q" --lora-rank 4 --lora-alpha 8
  [ "$(losses)" = "$ref_lora" ] || fail "LoRA stage 3 -np $np losses differ from stage 2: $(losses) vs $ref_lora"
  check_load "LoRA stage 3 -np $np" $np
done

# Bad input.
expect_error 1 "--lora-rank" "${TRAIN[@]}" --model-dir "$T/q" --lora-rank 0
expect_error 2 "rank must be at most 16" "${TRAIN[@]}" --model-dir "$T/q" --lora-rank 20
expect_error 2 "unknown target" "${TRAIN[@]}" --model-dir "$T/q" --lora-rank 2 --lora-targets attn,embed
expect_error 1 "need --lora-rank" "${TRAIN[@]}" --model-dir "$T/q" --lora-alpha 4
expect_error 1 "--model-dir DIR" train --model gpt --config "$T/ds.json" --lora-rank 2
expect_error 1 "--save-adapter-dir" "${TRAIN[@]}" --model-dir "$T/q" --lora-rank 2 --save-model-dir "$T/x"
expect_error 1 "has shape [4, 16], this base and rank need [4, 24]" \
  lora merge --model-dir "$T/wide" --adapter "$T/a1" --out "$T/x2"
[ -e "$T/x2/config.json" ] && fail "a refused merge wrote a folder"
expect_error 1 "adapter_config.json" lora merge --model-dir "$T/q" --adapter "$T/nothing" --out "$T/x3"
expect_error 1 "needs --model-dir BASE" lora merge --model-dir "$T/q" --out "$T/x4"

finish test_lora_cli
