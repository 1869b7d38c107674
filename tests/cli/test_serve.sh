#!/usr/bin/env bash
# `zdp serve` through HTTP: at -np 1, 2 and 3 (ZeRO stages 0, 1, 2), the same
# data sent as one forward_backward or split into 2, 3 or 7 uneven requests
# gives the same parameters after optim_step (and the same across world
# sizes); the update equals `zdp train` on the same windows; the applied
# gradient is d(loss:sum)/dθ (a first-order check); optim_step with no
# forward_backward is 409; every bad input is a 4xx naming the field and
# leaves the weights bitwise as without it; save/load_state round trip
# mid-window; a managed config is refused.  Driven by tests/serve/serve_check.py.
# usage: test_serve.sh ZDP_BINARY MPIEXEC
set -u
source "$(dirname "$0")/serve_lib.sh" "$@" # ZDP MPIEXEC: HERE, PY, $T, fail, start_server
CHECK="$HERE/../serve/serve_check.py"

MODEL=(--model gpt --n-layer 2 --n-head 2 --n-embd 16 --vocab-size 64 --block-size 16)
MAX_BODY=100000
# config LR STAGE MANAGED: SGD, so that updates are linear in the gradient.
config() {
  cat <<JSON
{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
 "managed_gradient_accumulation": $3, "gradient_clipping": 0,
 "zero_allow_untested_optimizer": true,
 "optimizer": {"type": "SGD", "params": {"lr": $1}},
 "zero_optimization": {"stage": $2, "reduce_bucket_size": 500}}
JSON
}

# start_plain NP CFG LOG [ARGS...]: the server these checks use.
start_plain() {
  local np=$1 cfg=$2 log=$3
  shift 3
  start_server "$np" "$log" "${MODEL[@]}" --full-finetune --config "$cfg" --init "$T/init.safetensors" --max-body $MAX_BODY "$@"
}

config 0.05 0 true >"$T/cfg_init.json"
timeout 60 "$MPIEXEC" -np 1 "$ZDP" train "${MODEL[@]}" --config "$T/cfg_init.json" \
  --steps 0 --val-every 0 --save-weights "$T/init.safetensors" >"$T/init.log" 2>&1 ||
  { fail "zdp train --steps 0 --save-weights"; cat "$T/init.log"; }
$PY "$CHECK" gen-data "$T" || fail "gen-data"

# ---- the scenario at world sizes 1, 2, 3 ----
for np in 1 2 3; do
  stage=$((np - 1))
  config 0.05 $stage false >"$T/cfg$np.json"
  mkdir -p "$T/np$np"
  start_plain $np "$T/cfg$np.json" "$T/server$np.log" --checkpoint-dir "$T/np$np" || continue
  timeout 120 $PY "$CHECK" scenario "$URL" "$T/np$np" "$T/data.json" \
    "$([ $np = 1 ] && echo "$T/windows.json")" $((MAX_BODY + 1000)) ||
    fail "scenario at -np $np (ZeRO stage $stage)"
  stop_server
  if [ $SERVER_RC -ne 0 ] || ! grep -q "zdp serve: stopped" "$T/server$np.log"; then
    fail "-np $np: no clean stop on SIGTERM (exit $SERVER_RC)"; tail -20 "$T/server$np.log"
  fi
  if grep -q "MPI_ABORT\|zdp: error" "$T/server$np.log"; then fail "-np $np: server log has errors"; cat "$T/server$np.log"; fi
done
for np in 2 3; do
  [ -f "$T/np$np/split0.safetensors" ] && [ -f "$T/np1/split0.safetensors" ] || continue
  $PY "$CHECK" compare "$T/np1/split0.safetensors" "$T/np$np/split0.safetensors" ||
    fail "-np $np differs from -np 1"
done

# ---- the same windows through `zdp train`: mean loss over 8 x 16 tokens, so lr x 128 ----
config 6.4 0 false >"$T/cfg_train.json"
timeout 60 "$MPIEXEC" -np 1 "$ZDP" train "${MODEL[@]}" --config "$T/cfg_train.json" \
  --init "$T/init.safetensors" --data "$T/windows.bin" --val-fraction 0 --val-every 0 \
  --steps 1 --schedule 8 --out-dir "$T/train-out" --save-weights "$T/train.safetensors" \
  >"$T/train.log" 2>&1 || { fail "zdp train on the windows"; cat "$T/train.log"; }
if [ -f "$T/np1/windows.safetensors" ] && [ -f "$T/train.safetensors" ]; then
  $PY "$CHECK" compare "$T/train.safetensors" "$T/np1/windows.safetensors" ||
    fail "serve's update differs from zdp train's on the same windows"
fi

# ---- the gradient is d(loss:sum)/dθ: a small SGD step, at -np 2 ----
config 1e-4 1 false >"$T/cfg_fd.json"
if start_plain 2 "$T/cfg_fd.json" "$T/server_fd.log" --checkpoint-dir "$T/fd"; then
  timeout 60 $PY "$CHECK" fdcheck "$URL" "$T/data.json" || fail "fdcheck"
  stop_server
fi

# ---- refusals at start-up ----
config 0.05 0 true >"$T/managed.json"
timeout 60 "$MPIEXEC" -np 2 --oversubscribe "$ZDP" serve "${MODEL[@]}" --full-finetune --config "$T/managed.json" \
  --port 0 >"$T/managed.log" 2>&1
if [ $? -eq 0 ] || ! grep -q "managed_gradient_accumulation" "$T/managed.log"; then
  fail "a managed config was not refused clearly"; cat "$T/managed.log"
fi
timeout 60 "$MPIEXEC" -np 1 "$ZDP" serve "${MODEL[@]}" --full-finetune --config "$T/cfg1.json" --bind nowhere \
  >"$T/bind.log" 2>&1
if [ $? -eq 0 ] || ! grep -q -- "--bind nowhere" "$T/bind.log"; then
  fail "a bad --bind was not refused clearly"; cat "$T/bind.log"
fi

finish test_serve
