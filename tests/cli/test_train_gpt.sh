#!/usr/bin/env bash
# `zdp train --model gpt` through its command-line contract: the arithmetic
# corpus's format and held-out split, managed ==
# unmanaged, --init/--save-weights round trip, world sizes 1..3, the
# unmanaged schedule's global_samples, metrics CSV and SVG, zdp sample, and
# bad input (one message on rank 0, non-zero exit, never a hang).
# usage: test_train_gpt.sh ZDP_BINARY MPIEXEC
set -u
ZDP=$1
MPIEXEC=$2
RUN_TIMEOUT=180
source "$(dirname "$0")/lib.sh"

MODEL=(--n-layer 2 --n-head 2 --n-embd 16 --vocab-size 256 --block-size 16)
cat >"$T/managed.json" <<'JSON'
{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3,
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01}},
 "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 3, "warmup_type": "linear"}},
 "zero_optimization": {"stage": 2, "reduce_bucket_size": 200}}
JSON
sed 's/"gradient_accumulation_steps": 3,/"gradient_accumulation_steps": 3, "managed_gradient_accumulation": false,/' \
  "$T/managed.json" >"$T/unmanaged.json"

expect_ok 1 gen-data --corpus arith --lines 400 --seed 5 --out "$T/tokens.bin"
# The corpus's format (zdp.h, zdp_corpus_arith): 400 lines of 10 tokens
# "aa+bb=ccc\n", the sum's digits least significant first, and the last 40
# lines (the held-out tenth) share no problem with the first 360.
[ "$(stat -c %s "$T/tokens.bin")" -eq $((1024 + 400 * 10 * 2)) ] || fail "gen-data: not 400 lines of 10 tokens"
od -An -v -tu2 -j1024 "$T/tokens.bin" | tr -s ' ' '\n' | grep -v '^$' | awk '
  { line = line sprintf("%c", $1) }
  $1 == 10 {
    n++
    if (line !~ /^[0-9][0-9]\+[0-9][0-9]=[0-9][0-9][0-9]\n$/) { if (bad++ < 5) print "bad line " n ": " line }
    a = substr(line, 1, 2) + 0; b = substr(line, 4, 2) + 0
    c = substr(line, 9, 1) substr(line, 8, 1) substr(line, 7, 1)
    if (c + 0 != a + b) { if (bad++ < 5) print "wrong sum on line " n ": " line }
    if (n <= 360) train[a "+" b] = 1; else if ((a "+" b) in train) { if (bad++ < 5) print "held-out " a "+" b " is also in train" }
    line = ""
  }
  END { if (n != 400 || bad) { print n " lines, " bad " bad"; exit 1 } }' >"$T/corpus.txt" \
  || { fail "gen-data: corpus format or held-out split"; cat "$T/corpus.txt"; }
# The trainer's held-out report (the default corpus, untrained model): the
# problems in the same format, 200 distinct ones, the sum read back.
expect_ok 1 train --model gpt "${MODEL[@]}" --config "$T/managed.json" --steps 0 --out-dir "$T/arith"
grep -q "^accuracy on 200 held-out problems: [0-9]*/200 = " "$T/out" || { fail "arith report: accuracy line"; cat "$T/out"; }
[ "$(grep -cE '^  [0-9]{2}\+[0-9]{2}=' "$T/out")" -eq 8 ] || { fail "arith report: problem lines"; cat "$T/out"; }
expect_ok 1 train --model gpt "${MODEL[@]}" --config "$T/managed.json" --steps 0 \
  --data "$T/tokens.bin" --save-weights "$T/init.safetensors"
expect_ok 2 train --model gpt "${MODEL[@]}" --config "$T/managed.json" --steps 0 \
  --data "$T/tokens.bin" --init "$T/init.safetensors" --save-weights "$T/same.safetensors"
cmp -s "$T/init.safetensors" "$T/same.safetensors" || fail "--init/--save-weights round trip differs"

for np in 1 2 3; do
  expect_ok $np train --model gpt "${MODEL[@]}" --config "$T/managed.json" --steps 3 \
    --data "$T/tokens.bin" --data-order sequential --init "$T/init.safetensors" \
    --save-weights "$T/m$np.safetensors" --out-dir "$T/run$np"
  grep -q "^step 3 | loss .* | global_samples $((3 * 2 * 3 * np)) " "$T/out" || { fail "np=$np: step 3 line"; cat "$T/out"; }
  [ "$(grep -c '^step ' "$T/out")" -eq 3 ] || fail "np=$np: wanted 3 step lines"
  [ "$(wc -l <"$T/run$np/metrics.csv")" -eq 4 ] || fail "np=$np: metrics.csv rows"
  head -1 "$T/run$np/metrics.csv" | grep -q "Train/Samples/train_loss" || fail "metrics.csv header"
  grep -q "<svg" "$T/run$np/loss.svg" || fail "np=$np: loss.svg"
  expect_ok $np train --model gpt "${MODEL[@]}" --config "$T/unmanaged.json" --steps 3 \
    --data "$T/tokens.bin" --init "$T/init.safetensors" --save-weights "$T/u$np.safetensors" \
    --out-dir "$T/runu$np"
  cmp -s "$T/m$np.safetensors" "$T/u$np.safetensors" || fail "np=$np: unmanaged differs from managed"
  cmp -s "$T/init.safetensors" "$T/m$np.safetensors" && fail "np=$np: weights did not change"
done

# Unmanaged schedule: global_samples = b * W * sum(n) = 2 * 2 * (1+4+2).
expect_ok 2 train --model gpt "${MODEL[@]}" --config "$T/unmanaged.json" --steps 3 \
  --schedule 1,4,2 --data "$T/tokens.bin" --out-dir "$T/runs"
grep -q "^step 3 | loss .* | global_samples 28 " "$T/out" || { fail "schedule: global_samples"; cat "$T/out"; }

# Sampling from the saved weights (byte-level).
expect_ok 1 sample --weights "$T/m2.safetensors" --n-head 2 --prompt "1+1=" --max-tokens 5 --temperature 0
grep -q "^1+1=" "$T/out" || { fail "sample: prompt not echoed"; cat "$T/out"; }

# Bad input.
expect_error 2 "no-such.bin" train --model gpt "${MODEL[@]}" --config "$T/managed.json" --data "$T/no-such.bin"
expect_error 2 "--data-order random" train --model gpt "${MODEL[@]}" --config "$T/managed.json" --data-order random
expect_error 2 "outside the vocabulary" train --model gpt --n-layer 2 --n-head 2 --n-embd 16 \
  --vocab-size 50 --block-size 16 --config "$T/managed.json" --data "$T/tokens.bin"
expect_error 2 "transformer.wpe.weight" train --model gpt --n-layer 2 --n-head 2 --n-embd 16 \
  --vocab-size 256 --block-size 8 --config "$T/managed.json" --data "$T/tokens.bin" --init "$T/init.safetensors"
expect_error 2 "n_head" train --model gpt --n-layer 2 --n-head 3 --n-embd 16 --vocab-size 256 \
  --block-size 16 --config "$T/managed.json" --data "$T/tokens.bin"
expect_error 2 "--schedule needs unmanaged accumulation" train --model gpt "${MODEL[@]}" \
  --config "$T/managed.json" --data "$T/tokens.bin" --schedule 2,3
printf '0123' >"$T/tiny.txt"
expect_error 2 "fewer than --block-size + 1" train --model gpt "${MODEL[@]}" --config "$T/managed.json" --data "$T/tiny.txt"

# NaN/Inf in --init is refused at load (the tensor, element and value), and
# a run whose every step is skipped stops with an error (issue 10).
poke() { python3 "$(dirname "$0")/poke_safetensors.py" "$@"; }
poke "$T/init.safetensors" "$T/nan.safetensors" transformer.h.1.mlp.c_fc.weight 37 nan
expect_error 2 "--init $T/nan.safetensors: tensor transformer.h.1.mlp.c_fc.weight[0, 37] = nan" \
  train --model gpt "${MODEL[@]}" --config "$T/managed.json" --data "$T/tokens.bin" \
  --init "$T/nan.safetensors"
poke "$T/init.safetensors" "$T/inf.safetensors" transformer.wpe.weight 5 inf
expect_error 1 "transformer.wpe.weight[0, 5] = inf" train --model gpt "${MODEL[@]}" \
  --config "$T/managed.json" --data "$T/tokens.bin" --init "$T/inf.safetensors"
poke "$T/init.safetensors" "$T/huge.safetensors" '*' 0 1e20
expect_error 2 "training stopped: the last 2 optimizer steps (1 to 2) were all skipped" \
  train --model gpt "${MODEL[@]}" --config "$T/unmanaged.json" --data "$T/tokens.bin" \
  --init "$T/huge.safetensors" --steps 6 --max-skipped-steps 2 --out-dir "$T/runskip"
grep -q "^step 3 " "$T/out" && fail "gpt skip stop: ran past the limit"
expect_error 2 "--max-skipped-steps x: need an integer >= 0" train --model gpt "${MODEL[@]}" \
  --config "$T/managed.json" --max-skipped-steps x
finish test_train_gpt
