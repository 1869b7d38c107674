#!/usr/bin/env bash
# `zdp serve` under load and failure (docs/server.md, "Limits" and
# "Stopping"):
# - slow and idle clients (tests/serve/slowloris.py): 600 idle sockets, 600
#   dribbling headers a byte a second and 100 holding 50 kB bodies (3 fit the budget, the rest get 503), all from
#   another loopback address, while /healthz answers every probe in < 100 ms;
#   libmicrohttpd's messages about them are rate-limited;
# - the request-body budget (--max-inflight-bytes): 503 over it, GET /info
#   reports it; slow headers and a slow body are cut after
#   --request-timeout-seconds (tests/serve/ops_check.py);
# - SIGTERM to rank 1 of -np 2 stops every rank and mpirun exits 0;
# - /healthz is 503 naming rank 1 while rank 1 is stopped (SIGSTOP), 200
#   again after SIGCONT; an idle connection is closed after
#   --idle-timeout-seconds, one waiting for its answer is not; /healthz is
#   503 naming a request that runs longer than --health-timeout-seconds;
# - a save_state that fails on rank 1 only (ranks in their own working
#   directories, Open MPI's -wdir) names rank 1 and the reason.
# Every run is under a timeout.
# usage: test_serve_ops.sh ZDP_BINARY MPIEXEC
set -u
source "$(dirname "$0")/serve_lib.sh" "$@" # ZDP MPIEXEC: HERE, PY, $T, fail, start_server

MODEL=(--model gpt --n-layer 2 --n-head 2 --n-embd 16 --vocab-size 64 --block-size 16 --full-finetune)
cat >"$T/cfg.json" <<'JSON'
{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
 "managed_gradient_accumulation": false, "gradient_clipping": 0,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
 "zero_optimization": {"stage": 1}}
JSON

# rank_pid N: the pid of rank N of the server started by start_server (the
# ranks are mpirun's children; rank 0's pid is on the listening line).
rank_pid() {
  local mpirun_pid pids
  mpirun_pid=$(pgrep -P "$SERVER_PID" | head -1)
  pids=$(pgrep -P "$mpirun_pid" | grep -vx "$RANK0_PID")
  [ "$1" = 0 ] && echo "$RANK0_PID" || echo "$pids" | head -1
}

# ---- slow and idle clients, the body budget, the request deadline (-np 1) ----
if start_server 1 "$T/limits.log" "${MODEL[@]}" --config "$T/cfg.json" --max-body 100000 \
  --max-inflight-bytes 150000 --request-timeout-seconds 2; then
  for mode in "idle 600" "dribble 600" "body 100"; do
    # shellcheck disable=SC2086
    timeout 60 $PY "$HERE/../serve/slowloris.py" "$URL" $mode 5 || fail "slowloris $mode"
  done
  timeout 60 $PY "$HERE/../serve/ops_check.py" budget "$URL" 100000 150000 || fail "the body budget"
  timeout 60 $PY "$HERE/../serve/ops_check.py" request-timeout "$URL" 2 || fail "the request deadline"
  timeout 60 $PY "$HERE/../serve/ops_check.py" header-timeout "$URL" 2 || fail "the header deadline"
  stop_server
  [ "$SERVER_RC" -eq 0 ] || fail "-np 1: no clean stop (exit $SERVER_RC)"
  n=$(grep -c "zdp serve: http:" "$T/limits.log")
  [ "$n" -le 40 ] || fail "$n libmicrohttpd messages in the log (rate-limited to 10 per 10 s)"
fi

# ---- a flag that cannot work is refused at start-up ----
out=$(timeout 60 "$MPIEXEC" -np 1 "$ZDP" serve "${MODEL[@]}" --config "$T/cfg.json" --max-body 1000 \
  --max-inflight-bytes 999 2>&1)
[ $? -ne 0 ] && echo "$out" | grep -q -- "--max-inflight-bytes 999 is less than --max-body 1000" ||
  fail "--max-inflight-bytes below --max-body was not refused: $out"

# ---- SIGTERM to rank 1 stops every rank ----
if start_server 2 "$T/sigterm.log" "${MODEL[@]}" --config "$T/cfg.json"; then
  curl -s -m 10 "$URL/forward_backward" -H 'Content-Type: application/json' -d \
    '{"data": [{"model_input": {"chunks": [{"tokens": [1, 2, 3]}]}, "loss_fn_inputs": {"target_tokens": [2, 3, 4]}}]}' \
    >/dev/null || fail "forward_backward before SIGTERM"
  p1=$(rank_pid 1)
  if [ -z "$p1" ]; then
    fail "cannot find rank 1's pid"
  else
    kill -TERM "$p1"
    for _ in $(seq 150); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$SERVER_PID" 2>/dev/null; then
      fail "SIGTERM to rank 1: the job still runs after 15 s"; cat "$T/sigterm.log"
    else
      wait "$SERVER_PID"
      rc=$?
      SERVER_PID=""
      [ $rc -eq 0 ] || { fail "SIGTERM to rank 1: mpirun exited $rc"; cat "$T/sigterm.log"; }
      grep -q "rank 1 received SIGTERM: stopping every rank" "$T/sigterm.log" &&
        grep -q "zdp serve: stopped at step 0" "$T/sigterm.log" ||
        { fail "SIGTERM to rank 1: no clean stop in the log"; cat "$T/sigterm.log"; }
    fi
  fi
  stop_server
fi

# ---- /healthz names a rank that does not answer ----
if start_server 2 "$T/health.log" "${MODEL[@]}" --config "$T/cfg.json" --health-timeout-seconds 1 \
  --idle-timeout-seconds 2; then
  timeout 60 $PY "$HERE/../serve/ops_check.py" idle-timeout "$URL" 2 || fail "the idle timeout"
  p1=$(rank_pid 1)
  code=$(curl -s -o "$T/h0.json" -w '%{http_code}' -m 5 "$URL/healthz")
  [ "$code" = 200 ] || fail "/healthz before: $code $(cat "$T/h0.json")"
  kill -STOP "$p1"
  # Health checks go every 0.5 s: one is waiting for rank 1 by now.
  sleep 1.5
  # A request that waits for the ranks longer than the idle timeout is not idle.
  curl -s -o "$T/info.json" -w '%{http_code}' -m 30 "$URL/info" >"$T/info.code" &
  info_pid=$!
  sleep 2.5
  code=$(curl -s -o "$T/h1.json" -w '%{http_code}' -m 5 "$URL/healthz")
  tcode=$(curl -s -o "$T/h1t.json" -w '%{http_code}' -m 5 "$URL/api/v1/healthz")
  kill -CONT "$p1"
  wait $info_pid
  [ "$(cat "$T/info.code")" = 200 ] ||
    fail "GET /info that waited 3 s for a stopped rank (idle timeout 2 s): $(cat "$T/info.code")"
  [ "$code" = 503 ] && grep -q '"rank":1' "$T/h1.json" && grep -q "rank 1 has not answered" "$T/h1.json" ||
    fail "/healthz with rank 1 stopped: $code $(cat "$T/h1.json") (wanted 503 naming rank 1)"
  [ "$tcode" = 503 ] && grep -q '"rank":1' "$T/h1t.json" ||
    fail "/api/v1/healthz with rank 1 stopped: $tcode $(cat "$T/h1t.json") (wanted 503 naming rank 1)"
  ok=0
  for _ in $(seq 50); do
    code=$(curl -s -o "$T/h2.json" -w '%{http_code}' -m 5 "$URL/healthz")
    [ "$code" = 200 ] && { ok=1; break; }
    sleep 0.1
  done
  [ $ok = 1 ] || fail "/healthz after SIGCONT: $code $(cat "$T/h2.json")"
  timeout 120 $PY "$HERE/../serve/ops_check.py" busy "$URL" 1 || fail "/healthz during a long request"
  stop_server
  [ "$SERVER_RC" -eq 0 ] || fail "health: no clean stop (exit $SERVER_RC)"
fi

# ---- a save that fails on rank 1 only names rank 1 ----
# Each rank in its own directory, so each has its own checkpoint folder
# (zdp-serve-checkpoints, relative); on rank 1's side "ck" is a file, not a folder.
mkdir -p "$T/w0/zdp-serve-checkpoints/ck" "$T/w1/zdp-serve-checkpoints/ok/t2.tmp"
echo "not a folder" >"$T/w1/zdp-serve-checkpoints/ck"
ARGS=("${MODEL[@]}" --config "$T/cfg.json" --port 0)
timeout 120 "$MPIEXEC" --oversubscribe -np 1 -wdir "$T/w0" "$ZDP" serve "${ARGS[@]}" : \
  -np 1 -wdir "$T/w1" "$ZDP" serve "${ARGS[@]}" >"$T/save.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 300); do
  URL=$(grep -o 'listening on http://[0-9.]*:[0-9]*' "$T/save.log" | sed 's/listening on //')
  RANK0_PID=$(grep -o 'rank 0 pid [0-9]*' "$T/save.log" | sed 's/rank 0 pid //')
  [ -n "$URL" ] && break
  sleep 0.1
done
if [ -z "$URL" ]; then
  fail "the per-rank-directory server did not start"; cat "$T/save.log"
else
  code=$(curl -s -o "$T/save.json" -w '%{http_code}' -m 30 "$URL/save_state" -H 'Content-Type: application/json' \
    -d '{"path": "ck/t1"}')
  grep -q 'rank 1: ' "$T/save.json" ||
    fail "save_state failing on rank 1: $code $(cat "$T/save.json") (wanted an error naming rank 1)"
  [ "$code" -ge 400 ] || fail "save_state failing on rank 1 answered $code"
  grep -q "Not a directory\|not a directory\|cannot" "$T/save.json" ||
    fail "save_state failing on rank 1: no reason in $(cat "$T/save.json")"
  # The server goes on: a save both ranks can write works (rank 0 makes
  # ok/t2.tmp for every rank, so rank 1's side has it already).
  code=$(curl -s -o "$T/save2.json" -w '%{http_code}' -m 30 "$URL/save_state" -H 'Content-Type: application/json' \
    -d '{"path": "ok/t2"}')
  [ "$code" = 200 ] || fail "save_state after a failed one: $code $(cat "$T/save2.json")"
fi
stop_server
[ "$SERVER_RC" -eq 0 ] || { fail "per-rank directories: no clean stop (exit $SERVER_RC)"; cat "$T/save.log"; }

finish test_serve_ops
