#!/usr/bin/env bash
# `zdp serve` through the Tinker SDK's wire protocol (/api/v1, futures,
# seq_id ordering), at -np 1, 2 and 3 (ZeRO stages 0, 1, 2) and -np 2 at stage 3, driven by
# tests/serve/tinker_check.py with a client that sends what the SDK sends:
# bootstrap, create_model (--full-finetune: a LoRA rank is a 400; one model), chunks posted in
# parallel with the first last, lost responses retried with the same
# idempotency key, held-open retrieve_future, seq_id gaps, every loss,
# save/load_weights, a forward between forward_backward and optim_step changing
# nothing (bitwise), a finished session (POST sessions/ID/finish) detaching its
# model at once, sampling sessions on saved weights (7 seeded samples, divided
# across the ranks, the same at every -np); then SDK 0.25's protobuf forward_backward/forward and
# protobuf results (the same update, bitwise), malformed protobuf bodies.
# Each update is compared with the server's plain endpoints (themselves
# checked against `zdp train` by test_serve.sh).
# usage: test_tinker.sh ZDP_BINARY MPIEXEC
set -u
source "$(dirname "$0")/serve_lib.sh" "$@" # ZDP MPIEXEC: HERE, PY, $T, fail, start_server
CHECK="$HERE/../serve/tinker_check.py"

MODEL=(--model gpt --n-layer 2 --n-head 2 --n-embd 16 --vocab-size 64 --block-size 16 --full-finetune)
config() {
  cat <<JSON
{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
 "managed_gradient_accumulation": false, "gradient_clipping": 0,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "betas": [0.9, 0.95], "eps": 1e-12}},
 "zero_optimization": {"stage": $1, "reduce_bucket_size": 500}}
JSON
}

# NP:STAGE; -np 2 at ZeRO stage 3 too (the whole model gathered for sampling
# and save_weights, scattered by load_weights: docs/server.md, "Models").
# NPS (as scripts/test.sh's TSan run sets it) picks the stages-0-2 runs alone.
if [ -n "${NPS:-}" ]; then
  RUNS=$(for np in $NPS; do printf '%s:%s ' "$np" $((np - 1)); done)
  KS=$NPS
fi
for run in ${RUNS:-1:0 2:1 3:2 2:3}; do
  np=${run%%:*} stage=${run##*:}
  k=$np
  [ "$stage" -eq 3 ] && k=${np}s3
  config $stage >"$T/cfg$k.json"
  mkdir -p "$T/np$k"
  log="$T/server$k.log"
  # The plain endpoints' reference files go to $T/np$k by absolute path.
  start_server $np "$log" "${MODEL[@]}" --config "$T/cfg$k.json" --checkpoint-dir "$T/ck$k" \
    --allow-path-root "$T/np$k" --long-poll-seconds 1 --seq-gap-seconds 3 --max-sample-batch 7 || continue
  timeout 240 $PY "$CHECK" "$URL" "$T/np$k" $np "$T/ck$k" || fail "tinker_check at -np $np (ZeRO stage $stage)"
  stop_server
  if [ $SERVER_RC -ne 0 ] || ! grep -q "zdp serve: stopped" "$log"; then
    fail "-np $np stage $stage: no clean stop on SIGTERM (exit $SERVER_RC)"; tail -20 "$log"
  fi
  grep -q "every parameter trains (--full-finetune)" "$log" || fail "-np $np: the server did not log full fine-tuning"
  if grep -q "MPI_ABORT\|zdp: error" "$log"; then fail "-np $np: server log has errors"; cat "$log"; fi
done

# Every rank samples (docs/sampling.md): 7 seeded samples are the same at every -np.
for np in ${KS:-1 2 3 2s3}; do
  [ -s "$T/np$np/samples.json" ] || { fail "-np $np: no samples.json"; continue; }
  grep -q '"sequences"' "$T/np$np/samples.json" || { fail "-np $np: asample of 7 failed"; cat "$T/np$np/samples.json"; }
  cmp -s "$T/np1/samples.json" "$T/np$np/samples.json" || fail "-np $np: 7 samples differ from -np 1"
done

finish test_tinker
