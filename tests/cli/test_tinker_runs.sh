#!/usr/bin/env bash
# The real Tinker SDK's RestClient against `zdp serve` (tests/serve/runs_check.py):
# training runs and checkpoints from --checkpoint-dir, save_state(overwrite=False)
# refused for an existing name, delete_checkpoint, ttl_seconds, and run ids that do not repeat
# when a new server starts on the same folder.  -np 1 and 2.  Exit 77 (skipped)
# with the reason when the SDK cannot be imported (the shared folder beside the
# repository, or ZDP_SHARED, has its tinker-sdk.sh).
# usage: test_tinker_runs.sh ZDP_BINARY MPIEXEC
set -u
source "$(dirname "$0")/serve_lib.sh" "$@" # ZDP MPIEXEC: HERE, PY, $T, fail, start_server
CHECK="$HERE/../serve/runs_check.py"
use_tinker_sdk
export TINKER_API_KEY=tml-local

adamw_config 1 1e-3 0 5000 >"$T/cfg.json"
MODEL=(--model gpt --n-layer 1 --n-head 2 --n-embd 16 --vocab-size 32 --block-size 16 --config "$T/cfg.json" --full-finetune)

for np in ${NPS:-1 2}; do
  ck="$T/ck-$np"
  for phase in first second; do
    start_server "$np" "$T/$phase-$np.log" "${MODEL[@]}" --checkpoint-dir "$ck" || continue
    timeout 300 $PY "$CHECK" "$URL" "$phase" "$T/state-$np.json" || fail "runs_check $phase at -np $np"
    stop_server
    if [ $SERVER_RC -ne 0 ] || ! grep -q "zdp serve: stopped" "$T/$phase-$np.log"; then
      fail "-np $np $phase: no clean stop (exit $SERVER_RC)"; tail -20 "$T/$phase-$np.log"
    fi
  done
  # A counter file that is not a number stops start-up, naming it.
  echo "x" >"$ck/.zdp-sessions"
  if timeout 120 "$MPIEXEC" -np "$np" --oversubscribe "$ZDP" serve "${MODEL[@]}" --checkpoint-dir "$ck" \
      --port 0 >"$T/bad-$np.log" 2>&1; then
    fail "-np $np: a malformed .zdp-sessions was accepted"
  elif ! grep -q "zdp-sessions must hold one integer" "$T/bad-$np.log"; then
    fail "-np $np: malformed .zdp-sessions: unclear error"; cat "$T/bad-$np.log"
  fi
done

[ $failures -eq 0 ] && echo "test_tinker_runs: OK"
exit $((failures > 0))
