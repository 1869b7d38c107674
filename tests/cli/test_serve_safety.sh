#!/usr/bin/env bash
# `zdp serve` against a hostile client (docs/server.md, "Threat model"):
# client paths stay inside --checkpoint-dir (absolute paths, "..", symbolic
# links that leave it: 400, nothing written; load_state says the same whether a
# path outside exists) and --allow-path-root; a foreign Host or Origin is 403
# and a POST that is not JSON 415; --api-key-file makes every request but
# /healthz carry the key (401 otherwise) and refuses a missing or empty key
# file; a refused optim_step leaves the hyperparameters and weights as they
# were; seq_id = INT64_MAX is a 400, not an overflow.  Driven by
# tests/serve/safety_check.py, at -np 2 (ZeRO stage 1) and -np 1.
# usage: test_serve_safety.sh ZDP_BINARY MPIEXEC
set -u
source "$(dirname "$0")/serve_lib.sh" "$@" # ZDP MPIEXEC: HERE, PY, $T, fail, start_server
CHECK="$HERE/../serve/safety_check.py"

MODEL=(--model gpt --n-layer 1 --n-head 2 --n-embd 16 --vocab-size 64 --block-size 16 --full-finetune)
cat >"$T/cfg.json" <<JSON
{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
 "managed_gradient_accumulation": false, "gradient_clipping": 0,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8}},
 "zero_optimization": {"stage": 1, "reduce_bucket_size": 500}}
JSON
mkdir -p "$T/allowed" "$T/outside"

# ---- no key: paths, cross-site guards, a refused optim_step, integers (-np 2) ----
if start_server 2 "$T/server.log" "${MODEL[@]}" --config "$T/cfg.json" --checkpoint-dir "$T/ck" \
  --allow-path-root "$T/allowed"; then
  timeout 120 $PY "$CHECK" paths "$URL" "$T/ck" "$T/outside" "$T/allowed" || fail "paths"
  timeout 120 $PY "$CHECK" guards "$URL" || fail "guards"
  timeout 120 $PY "$CHECK" optim "$URL" "$T/ck" || fail "optim"
  timeout 120 $PY "$CHECK" integers "$URL" "$T/ck" "$T/outside" || fail "integers"
  stop_server
  [ $SERVER_RC -eq 0 ] && grep -q "zdp serve: stopped" "$T/server.log" ||
    { fail "no clean stop (exit $SERVER_RC)"; tail -20 "$T/server.log"; }
  grep -q "warning: no --api-key-file: any program that can connect" "$T/server.log" ||
    fail "without --api-key-file the server did not say that it accepts any client"
  if grep -q "MPI_ABORT\|zdp: error\|runtime error\|AddressSanitizer" "$T/server.log"; then
    fail "server log has errors"; cat "$T/server.log"
  fi
fi

# ---- --api-key-file (-np 1) ----
KEY=tml-$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')
printf '%s\n' "$KEY" >"$T/key"
chmod 600 "$T/key"
if start_server 1 "$T/server_key.log" "${MODEL[@]}" --config "$T/cfg.json" --checkpoint-dir "$T/ck_key" \
  --api-key-file "$T/key"; then
  timeout 120 $PY "$CHECK" apikey "$URL" "$KEY" || fail "apikey"
  # With the key, the plain client works (the scenario's requests are authorised).
  ZDP_API_KEY=$KEY timeout 120 $PY "$CHECK" optim "$URL" "$T/ck_key" || fail "optim with the key"
  stop_server
  grep -q "no --api-key-file" "$T/server_key.log" && fail "with --api-key-file the server still warns"
  grep -q "$KEY" "$T/server_key.log" && fail "the server log shows the key"
fi

# ---- start-up refusals ----
expect_refusal() { # WHAT NEEDLE ARGS...
  local what=$1 needle=$2
  shift 2
  timeout 60 "$MPIEXEC" -np 1 "$ZDP" serve "${MODEL[@]}" --config "$T/cfg.json" --port 0 "$@" >"$T/refuse.log" 2>&1 &
  local pid=$!
  # A server that starts by mistake is stopped, and counts as a failure.
  wait_listening $pid "$T/refuse.log" 100 && kill -TERM "$RANK0_PID"
  wait $pid
  local rc=$?
  if [ $rc -eq 0 ] || ! grep -q -- "$needle" "$T/refuse.log"; then
    fail "$what was not refused clearly (exit $rc)"; cat "$T/refuse.log"
  fi
}
expect_refusal "a missing --api-key-file" "api-key-file $T/nokey: No such file" --api-key-file "$T/nokey"
: >"$T/empty"
expect_refusal "an empty --api-key-file" "api-key-file $T/empty: empty" --api-key-file "$T/empty"
expect_refusal "a missing --allow-path-root" "allow-path-root $T/nodir" --allow-path-root "$T/nodir"
expect_refusal "--allow-host with a port" "allow-host" --allow-host "evil.example:80"

# A key file other users can read: a warning, and the server runs.
cp "$T/key" "$T/key644"
chmod 644 "$T/key644"
if start_server 1 "$T/server_644.log" "${MODEL[@]}" --config "$T/cfg.json" --checkpoint-dir "$T/ck644" \
  --api-key-file "$T/key644"; then
  stop_server
  grep -q "can be read by other users" "$T/server_644.log" || fail "a world-readable key file gave no warning"
fi

finish test_serve_safety
