#!/usr/bin/env bash
# ZeRO stage 3 through `zdp train` (docs/deepspeed.md §4.8):
#   a. the MLP and GPT-2 trained at stage 3 (every tensor partitioned, or
#      the small ones kept whole; with overlap_comm; managed and unmanaged
#      with --schedule) give stage 2's weights bitwise at -np 1, 2, 3
#      (the same reductions and the same update on the same partitions);
#   b. --init at stage 3 reads the whole file into the partitions, and
#      --save-weights gathers it back (a 0-step run gives the file back);
#   c. checkpoints: exact resume at stage 3; a stage-3 checkpoint resumes at
#      stage 2 and another world size, and a stage-2 one at stage 3 (the
#      same losses to fp32 tolerance); `zdp ckpt export` of a stage-3
#      checkpoint gives the weights of the run that saved it;
#   d. bad input: a stage-3 key of the wrong type or range, offload at
#      stage 3 -- one error line naming the key;
#   e. --memory-report at stages 0-3, -np 1-4: one line per rank and
#      category; at stage 3 the parameters are the partition and the total
#      falls with W.
# Every run is under `timeout`, so a hang fails the test.
# usage: test_zero3.sh ZDP_BINARY MPIEXEC
set -u
ZDP=$1
MPIEXEC=$2
source "$(dirname "$0")/lib.sh"

MLP=(--model mlp --hidden 8 --layers 3)
GPT=(--model gpt --n-layer 2 --n-head 2 --n-embd 16 --vocab-size 256 --block-size 16 --val-every 0)
expect_ok 1 gen-data --hidden 8 --samples 200 --seed 3 --out "$T/data.safetensors"
expect_ok 1 gen-data --corpus arith --lines 400 --out "$T/tokens.bin"
mlp_data=(--data "$T/data.safetensors")
gpt_data=(--data "$T/tokens.bin" --out-dir "$T/gpt-out")

config() { # config NAME STAGE MANAGED [extra zero keys]
  cat >"$T/$1.json" <<JSON
{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
 "managed_gradient_accumulation": $3,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}},
 "gradient_clipping": 1.0,
 "zero_optimization": {"stage": $2, "reduce_bucket_size": 40${4:+, $4}}}
JSON
}
config s2m 2 true
config s2u 2 false
config s3m 3 true '"stage3_param_persistence_threshold": 0'
config s3u 3 false '"stage3_param_persistence_threshold": 0'
config s3mo 3 true '"stage3_param_persistence_threshold": 20, "overlap_comm": true'
config s3ud 3 false '"overlap_comm": true'

# ---- a. stage 3 == stage 2, bitwise ---------------------------------------------------
for m in mlp gpt; do
  if [ $m = mlp ]; then margs=("${MLP[@]}" "${mlp_data[@]}"); else margs=("${GPT[@]}" "${gpt_data[@]}"); fi
  for np in 1 2 3; do
    for c in s2m s3m s3mo; do
      expect_ok $np train "${margs[@]}" --config "$T/$c.json" --steps 3 --save-weights "$T/$m-$c-$np.st"
    done
    for c in s2u s3u s3ud; do
      expect_ok $np train "${margs[@]}" --config "$T/$c.json" --steps 3 --schedule 1,3,2 \
        --save-weights "$T/$m-$c-$np.st"
    done
    for c in s3m s3mo; do
      cmp -s "$T/$m-s2m-$np.st" "$T/$m-$c-$np.st" || fail "$m np=$np: $c differs from stage 2 (managed)"
    done
    for c in s3u s3ud; do
      cmp -s "$T/$m-s2u-$np.st" "$T/$m-$c-$np.st" || fail "$m np=$np: $c differs from stage 2 (unmanaged 1,3,2)"
    done
    cmp -s "$T/$m-s2m-$np.st" "$T/$m-s2u-$np.st" && fail "$m np=$np: the schedules gave the same weights (vacuous)"
  done
done

# ---- b. --init into the partitions, --save-weights gathered ----------------------------
expect_ok 3 train "${MLP[@]}" --config "$T/s3m.json" --steps 0 --init "$T/mlp-s2m-1.st" \
  --save-weights "$T/same.st"
cmp -s "$T/mlp-s2m-1.st" "$T/same.st" || fail "stage 3 --init/--save-weights round trip differs"

# ---- c. checkpoints ------------------------------------------------------------------
cat >"$T/g2.json" <<'JSON'
{"train_batch_size": 12, "gradient_accumulation_steps": 1,
 "optimizer": {"type": "Adam", "params": {"lr": 1e-2}},
 "zero_optimization": {"stage": 2, "reduce_bucket_size": 30}}
JSON
sed 's/"stage": 2,/"stage": 3, "stage3_param_persistence_threshold": 0,/' "$T/g2.json" >"$T/g3.json"
# Exact resume at stage 3 (the saving world size): bitwise.
expect_ok 2 train "${GPT[@]}" "${gpt_data[@]}" --config "$T/g3.json" --steps 6 --save-weights "$T/A.st"
cp "$T/out" "$T/A.out"
expect_ok 2 train "${GPT[@]}" "${gpt_data[@]}" --config "$T/g3.json" --steps 3 --save-dir "$T/ck3" \
  --save-weights "$T/at3.st"
expect_ok 2 train "${GPT[@]}" "${gpt_data[@]}" --config "$T/g3.json" --resume "$T/ck3" --steps 6 \
  --save-weights "$T/B.st"
cmp -s "$T/A.st" "$T/B.st" || fail "stage 3: resume at the saving world size is not bitwise"
# zdp ckpt export of the stage-3 checkpoint = the weights of the run that saved it.
expect_ok 1 ckpt export "$T/ck3" --to "$T/export.st"
cmp -s "$T/export.st" "$T/at3.st" || fail "ckpt export of a stage-3 checkpoint differs from --save-weights"
# A stage-3 checkpoint resumed at stage 2 on 3 ranks, and a stage-2 one at stage 3 on 1 and 4.
expect_ok 3 train "${GPT[@]}" "${gpt_data[@]}" --config "$T/g2.json" --resume "$T/ck3" --steps 6
for s in 4 5 6; do
  a=$(loss_of "$T/A.out" $s); b=$(loss_of "$T/out" $s)
  close "$a" "$b" 1e-5 || fail "stage 3 np=2 checkpoint resumed at stage 2 np=3: step $s loss $b, uninterrupted $a"
done
expect_ok 3 train "${GPT[@]}" "${gpt_data[@]}" --config "$T/g2.json" --steps 3 --save-dir "$T/ck2"
for np in 1 4; do
  expect_ok $np train "${GPT[@]}" "${gpt_data[@]}" --config "$T/g3.json" --resume "$T/ck2" --steps 6
  for s in 4 5 6; do
    a=$(loss_of "$T/A.out" $s); b=$(loss_of "$T/out" $s)
    close "$a" "$b" 1e-5 || fail "stage 2 np=3 checkpoint resumed at stage 3 np=$np: step $s loss $b, uninterrupted $a"
  done
done

# ---- e. --memory-report: one line per rank and category, every stage (the
# engine's after the first step, peak_rss and load_peak at the end); at stage 3
# the parameters are the partition (padded / W floats) and the total falls with W.
prev_total=
for np in 1 2 3 4; do
  for st in 0 1 2 3; do
    sed "s/\"stage\": 2,/\"stage\": $st,/" "$T/g2.json" >"$T/mr.json"
    expect_ok $np train "${GPT[@]}" "${gpt_data[@]}" --config "$T/mr.json" --steps 2 --memory-report on
    n=$(grep -ac '^memory | rank ' "$T/out")
    [ "$n" -eq $((np * 13)) ] || fail "--memory-report np=$np stage $st: $n lines, wanted $((np * 13))"
    for r in $(seq 0 $((np - 1))); do
      for c in params grads grad_partition buckets optimizer gathered gathered_peak frozen other total activations peak_rss load_peak; do
        grep -aq "^memory | rank $r | $c | [0-9]* B\$" "$T/out" || fail "--memory-report np=$np stage $st: no line for rank $r $c"
      done
    done
    if [ $st = 3 ]; then
      padded=$(grep -ao 'padded [0-9]*' "$T/out" | head -1 | awk '{print $2}')
      p0=$(grep -a '^memory | rank 0 | params |' "$T/out" | awk '{print $(NF-1)}')
      [ "$p0" -eq $((padded / np * 4)) ] || fail "--memory-report np=$np stage 3: params $p0 B, wanted padded/W*4 = $((padded / np * 4))"
      t0=$(grep -a '^memory | rank 0 | total |' "$T/out" | awk '{print $(NF-1)}')
      if [ -n "$prev_total" ] && [ "$t0" -ge "$prev_total" ]; then fail "--memory-report stage 3: total $t0 B at np=$np is not below $prev_total B"; fi
      prev_total=$t0
    fi
  done
done

# ---- d. bad input ----------------------------------------------------------------------
sed 's/"stage": 3,/"stage": 3, "stage3_max_live_parameters": -1,/' "$T/s3m.json" >"$T/bad1.json"
expect_error 2 "zero_optimization.stage3_max_live_parameters" train "${MLP[@]}" --config "$T/bad1.json"
sed 's/"stage": 3,/"stage": 3, "stage3_prefetch_bucket_size": "5e7",/' "$T/s3m.json" >"$T/bad2.json"
expect_error 2 "zero_optimization.stage3_prefetch_bucket_size" train "${MLP[@]}" --config "$T/bad2.json"
sed 's/"stage": 3,/"stage": 3, "offload_param": {"device": "cpu"},/' "$T/s3m.json" >"$T/bad3.json"
expect_error 2 "offload" train "${MLP[@]}" --config "$T/bad3.json"

finish test_zero3
