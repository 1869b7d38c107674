#!/usr/bin/env bash
# `zdp train` through its command-line contract: managed == unmanaged,
# --init/--save-weights round trip, generated-data files, rank-dependent
# micro-batches, and every bad input exits non-zero with one clear message
# on rank 0 (each run under `timeout`, so a hang fails the test).
# usage: test_train.sh ZDP_BINARY MPIEXEC
set -u
ZDP=$1
MPIEXEC=$2
source "$(dirname "$0")/lib.sh"

# Step lines (stdout) counted wherever they start: $T/out holds stdout and
# stderr together, and mpirun may splice a warning line into the middle of
# one, so "^step" would miss it.
steps_in() { grep -o 'step [0-9]* | loss' "$1" | wc -l; }

cat >"$T/managed.json" <<'JSON'
{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
 "optimizer": {"type": "Adam", "params": {"lr": 1e-2}},
 "zero_optimization": {"stage": 2, "reduce_bucket_size": 50}}
JSON
sed 's/"gradient_accumulation_steps": 4,/"gradient_accumulation_steps": 4, "managed_gradient_accumulation": false,/' \
  "$T/managed.json" >"$T/unmanaged.json"

# Data and initial weights as files.
expect_ok 1 gen-data --hidden 8 --samples 100 --seed 3 --out "$T/data.safetensors"
expect_ok 1 train --model mlp --hidden 8 --layers 3 --config "$T/managed.json" --steps 0 \
  --seed 9 --save-weights "$T/init.safetensors"

# --init then --save-weights with no steps gives back the same file.
expect_ok 2 train --model mlp --hidden 8 --layers 3 --config "$T/managed.json" --steps 0 \
  --init "$T/init.safetensors" --save-weights "$T/same.safetensors"
cmp -s "$T/init.safetensors" "$T/same.safetensors" || fail "--init/--save-weights round trip differs"

# Managed (G=4) and unmanaged with the default n = G do the same arithmetic.
for np in 1 2 3; do
  expect_ok $np train --model mlp --hidden 8 --layers 3 --config "$T/managed.json" --steps 3 \
    --init "$T/init.safetensors" --data "$T/data.safetensors" --save-weights "$T/m$np.safetensors"
  grep -q "^step 3 | loss .* | global_samples $((3 * 8 * np)) " "$T/out" || { fail "managed np=$np: step 3 line"; cat "$T/out"; }
  [ "$(steps_in "$T/out")" -eq 3 ] || fail "managed np=$np: wanted 3 step lines"
  expect_ok $np train --model mlp --hidden 8 --layers 3 --config "$T/unmanaged.json" --steps 3 \
    --init "$T/init.safetensors" --data "$T/data.safetensors" --save-weights "$T/u$np.safetensors"
  cmp -s "$T/m$np.safetensors" "$T/u$np.safetensors" || fail "np=$np: unmanaged differs from managed"
  cmp -s "$T/init.safetensors" "$T/u$np.safetensors" && fail "np=$np: weights did not change"
done

# An unmanaged schedule: global_samples = b * W * sum(n) = 2 * 2 * (2+5+3).
expect_ok 2 train --model mlp --hidden 8 --layers 3 --config "$T/unmanaged.json" --steps 3 \
  --schedule 2,5,3 --data "$T/data.safetensors"
grep -q "^step 3 | loss .* | global_samples 40 " "$T/out" || { fail "schedule: global_samples"; cat "$T/out"; }

# Bad input: one message on rank 0, a non-zero exit, never a hang.
expect_error 2 "no-such-file.safetensors" train --model mlp --hidden 8 --layers 3 \
  --config "$T/managed.json" --init "$T/no-such-file.safetensors"
expect_error 2 "no-such.json" train --model mlp --config "$T/no-such.json"
expect_error 2 '"linears.3.weight" is missing' train --model mlp --hidden 8 --layers 4 \
  --config "$T/managed.json" --init "$T/init.safetensors"
expect_error 2 '"linears.2.weight" is not a parameter' train --model mlp --hidden 8 --layers 2 \
  --config "$T/managed.json" --init "$T/init.safetensors"
expect_error 2 'tensor "linears.0.weight" is F32 [8, 8]; expected F32 [6, 6]' train --model mlp \
  --hidden 6 --layers 3 --config "$T/managed.json" --init "$T/init.safetensors"
expect_error 2 'tensor "x" is F32 [100, 8]; expected F32 [N, 6]' train --model mlp --hidden 6 \
  --layers 3 --config "$T/managed.json" --data "$T/data.safetensors"
expect_error 2 "--schedule needs unmanaged accumulation" train --model mlp --hidden 8 \
  --config "$T/managed.json" --schedule 2,3
expect_error 2 "--schedule: entry 2" train --model mlp --hidden 8 \
  --config "$T/unmanaged.json" --schedule 2,0
cat >"$T/b32.json" <<'JSON'
{"train_batch_size": 32, "train_micro_batch_size_per_gpu": 16,
 "optimizer": {"type": "Adam"}}
JSON
expect_error 3 "Gradient accumulation steps: 0 has to be greater than 0" train --model mlp \
  --config "$T/b32.json"
sed 's/"train_micro_batch_size_per_gpu": 16/"train_micro_batch_size_per_gpu": 4/' "$T/b32.json" >"$T/b32b4.json"
expect_error 3 "32 != 4 * 2 * 3" train --model mlp --config "$T/b32b4.json"
expect_error 2 "unknown option --bogus" train --model mlp --config "$T/b32.json" --bogus 1
expect_error 2 "--model bert: unknown model" train --model bert --config "$T/b32.json"
printf 'not a safetensors file' >"$T/junk.safetensors"
expect_error 2 "junk.safetensors" train --model mlp --hidden 8 --layers 3 \
  --config "$T/managed.json" --data "$T/junk.safetensors"

# A copy of a safetensors file with one element changed, or all scaled.
poke() { python3 "$(dirname "$0")/poke_safetensors.py" "$@"; }

# NaN or Inf in --data's x or in --init is refused at load, naming the
# file, the tensor, the element and the value (issue 10).
poke "$T/data.safetensors" "$T/nan_x.safetensors" x 13 nan
expect_error 2 "--data $T/nan_x.safetensors: x[1, 5] = nan (row, column)" train --model mlp \
  --hidden 8 --layers 3 --config "$T/managed.json" --data "$T/nan_x.safetensors"
poke "$T/data.safetensors" "$T/inf_x.safetensors" x 799 -inf
expect_error 1 "x[99, 7] = -inf" train --model mlp --hidden 8 --layers 3 \
  --config "$T/managed.json" --data "$T/inf_x.safetensors"
poke "$T/init.safetensors" "$T/inf_init.safetensors" linears.1.weight 10 inf
expect_error 2 "--init $T/inf_init.safetensors: linears.1.weight[1, 2] = inf" train --model mlp \
  --hidden 8 --layers 3 --config "$T/managed.json" --init "$T/inf_init.safetensors"
poke "$T/init.safetensors" "$T/nan_bias.safetensors" linears.2.bias 3 nan
expect_error 2 "linears.2.bias[3] = nan" train --model mlp --hidden 8 --layers 3 \
  --config "$T/managed.json" --init "$T/nan_bias.safetensors"

# A run whose every step is skipped stops with an error naming the cause
# instead of exiting 0: finite but huge weights overflow the forward pass.
poke "$T/init.safetensors" "$T/huge.safetensors" '*' 0 1e20
expect_error 2 "training stopped: the last 3 optimizer steps (1 to 3) were all skipped" train \
  --model mlp --hidden 8 --layers 3 --config "$T/unmanaged.json" --init "$T/huge.safetensors" \
  --steps 10 --max-skipped-steps 3
grep -qF "the gradient had NaN or Inf" "$T/out" || { fail "skip stop: cause"; cat "$T/out"; }
grep -q "step 4 | loss" "$T/out" && fail "skip stop: ran past the limit"
# The default is 100 steps in a row (its step lines counted in stdout alone:
# a CI run under load once lost one to a spliced stderr chunk).
SPLIT_OUT=1 expect_error 2 "the last 100 optimizer steps (1 to 100) were all skipped" train --model mlp \
  --hidden 8 --layers 3 --config "$T/managed.json" --init "$T/huge.safetensors" --steps 150
[ "$(steps_in "$T/stdout")" -eq 100 ] || { fail "skip stop default: wanted 100 step lines"; cat "$T/out"; }
# 0 turns it off: every step skipped, the run completes.
expect_ok 2 train --model mlp --hidden 8 --layers 3 --config "$T/managed.json" \
  --init "$T/huge.safetensors" --steps 5 --max-skipped-steps 0
[ "$(grep -c 'SKIPPED' "$T/out")" -eq 5 ] || fail "--max-skipped-steps 0: wanted 5 skipped steps"
expect_error 2 "--max-skipped-steps -1: need an integer >= 0" train --model mlp \
  --config "$T/managed.json" --max-skipped-steps -1
# Out-of-range hyperparameters are config errors with the JSON path.
sed 's/"lr": 1e-2/"lr": 1e308/' "$T/managed.json" >"$T/lr_huge.json"
expect_error 2 "optimizer.params.lr = 1e308: out of range; fix: write a number in [0, 100]" \
  train --model mlp --hidden 8 --config "$T/lr_huge.json"

finish test_train
