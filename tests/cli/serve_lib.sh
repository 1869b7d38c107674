# serve_lib.sh -- sourced by the `zdp serve` tests (test_serve*.sh,
# test_tinker*.sh) and bench/run_serve_rl.sh as
#   source .../serve_lib.sh ZDP_BINARY MPIEXEC
# start a server in the background, wait for it to listen, and stop it
# cleanly.  Sets ZDP (an absolute path), MPIEXEC, HERE (tests/cli) and PY
# (python3 unless PYTHON says otherwise); sources lib.sh ($T, fail, run, the
# cleanup that stops the server on exit).
ZDP=$(readlink -f "$1")
MPIEXEC=$2
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PY=${PYTHON:-python3}
source "$HERE/lib.sh"
SERVER_PID=""
RANK0_PID=""
SERVER_RC=0
URL=""

# wait_listening PID LOG TRIES: polls LOG every 0.1 s, TRIES times, for the
# server's listening line; 0 with URL and RANK0_PID set, or 1 when PID ended
# or the tries ran out first.
wait_listening() {
  local pid=$1 log=$2 tries=$3
  URL=""
  RANK0_PID=""
  for _ in $(seq "$tries"); do
    URL=$(grep -o 'listening on http://[0-9.]*:[0-9]*' "$log" | sed 's/listening on //')
    RANK0_PID=$(grep -o 'rank 0 pid [0-9]*' "$log" | sed 's/rank 0 pid //')
    [ -n "$URL" ] && return 0
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

# adamw_config STAGE LR CLIP BUCKET: a ds_config.json on stdout: one
# micro-batch per step, unmanaged (every optim_step is a boundary), AdamW at
# lr LR with DeepSpeed's default betas and eps, gradient_clipping CLIP, ZeRO
# stage STAGE with reduce_bucket_size BUCKET.
adamw_config() {
  cat <<JSON
{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
 "managed_gradient_accumulation": false, "gradient_clipping": $3,
 "optimizer": {"type": "AdamW", "params": {"lr": $2}},
 "zero_optimization": {"stage": $1, "reduce_bucket_size": $4}}
JSON
}

# start_server NP LOG SERVE_ARGS...: `zdp serve SERVE_ARGS --port 0` at -np NP,
# output to LOG; sets URL and RANK0_PID, or fails and returns 1.
# MPIEXEC_ARGS: more launcher flags, split on spaces (the benchmarks'
# --bind-to none: Open MPI binds each rank to one core at -np <= 2).
start_server() {
  local np=$1 log=$2
  shift 2
  # shellcheck disable=SC2086 # MPIEXEC_ARGS is a list of flags
  timeout 300 "$MPIEXEC" -np "$np" --oversubscribe ${MPIEXEC_ARGS:-} "$ZDP" serve "$@" --port 0 >"$log" 2>&1 &
  SERVER_PID=$!
  wait_listening "$SERVER_PID" "$log" 300 && return 0
  fail "server at -np $np did not start"; cat "$log"
  stop_server
  return 1
}

# stop_server: SIGTERM to rank 0 stops every rank cleanly and mpirun exits;
# SERVER_RC gets mpirun's exit status.
stop_server() {
  if [ -n "$SERVER_PID" ]; then
    [ -n "$RANK0_PID" ] && kill -TERM "$RANK0_PID" 2>/dev/null
    for _ in $(seq 100); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
    kill -TERM "$SERVER_PID" 2>/dev/null
    sleep 0.5
    kill -KILL "$SERVER_PID" 2>/dev/null
    wait "$SERVER_PID" 2>/dev/null
    SERVER_RC=$?
    SERVER_PID=""
  fi
}

# use_tinker_sdk: makes the official Tinker SDK importable by PY
# (/usr/bin/python3) through the shared folder's tinker-sdk.sh, or exits 77
# (CTest's skip) with the reason.  Sets SHARED: the folder beside the
# repository, or ZDP_SHARED.
use_tinker_sdk() {
  local here sdk
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  SHARED=${ZDP_SHARED:-$(cd "$here/../../.." && pwd)/shared}
  if ! sdk=$(bash "$SHARED/tinker-sdk.sh" 2>"$T/sdk.err"); then
    echo "SKIP: the Tinker SDK is not importable ($SHARED/tinker-sdk.sh: $(cat "$T/sdk.err"))"; exit 77
  fi
  eval "$sdk"
  PY=/usr/bin/python3
  $PY -c "import tinker" 2>"$T/sdk.err" || { echo "SKIP: import tinker failed: $(cat "$T/sdk.err")"; exit 77; }
}
