#!/usr/bin/env bash
# Load benchmark and soak run for `zdp serve` (docs/server.md, "Load and soak
# (measured)"): a tiny GPT (L2 H2 C64 V256 T64) at -np 2, ZeRO stage 2,
# unmanaged SGD, on loopback.  First the engine alone: `zdp train` with the
# same model, config and micro-batch shape (B=1, T=64) at 1 and 4
# micro-batches per step, for the per-micro-batch time.  Then the server, and
# bench/serve_load.py drives it: idle latencies, fixed-shape requests against
# the engine time, C concurrent clients, a soak with rank 0's RSS and exact
# request accounting, and a SIGTERM stop.  About 2.5 minutes with the defaults.
# With TINKER_SOAK_S > 0, a Tinker-protocol soak follows the plain one: one
# Tinker TrainingClient (tests/serve/tinker_sdk.py) looping chunked
# forward_backward + optim_step over /api/v1 while 2 threads hit GET /info and
# POST /forward (docs/benchmarks-serve.md).
#
# With --lora: request throughput with 1, 2 and 4 LoRA models at once
# (docs/benchmarks-serve.md, "Throughput with 1, 2 and 4 LoRA models")
# through the official Tinker SDK (serve_load.py --lora): a Llama folder from
# `zdp init-model` (4 layers, hidden 256, 4 heads, 2 KV heads, FFN 768, vocab
# 4096, untied; random weights), --block-size 128, -np NP (default 1), ZeRO
# stage 0, --max-models 4, rank-8 adapters on every target.  Needs the
# vendored SDK: the shared folder beside the repository (or ZDP_SHARED) with
# its tinker-sdk.sh.
#
# usage: bench/run_serve_load.sh [--lora]
# env:   CS=1,4,16 LOAD_S=20 SOAK_S=60 TINKER_SOAK_S=0 BUILD=build JSON=out.json
#        LOG=server.log (keep a copy of the server's log)
#        TINKER_IDLE_S=0 (> 0: after the Tinker soak, idle this long, let the
#        server drop old results, and measure rank 0 again)
#        MALLOC_STATS=0 (1: gdb calls malloc_stats() in rank 0 around the
#        Tinker soak, at idle moments; the numbers land in the server log)
#        --lora: NP=1 SECONDS_PER_PHASE=10 REPEATS=3 BUILD=build
set -euo pipefail
LORA=0
[ "${1:-}" = --lora ] && LORA=1
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
ZDP=$(cd "$BUILD" && pwd)/bin/zdp
CS=${CS:-1,4,16}
LOAD_S=${LOAD_S:-20}
SOAK_S=${SOAK_S:-60}
TINKER_SOAK_S=${TINKER_SOAK_S:-0}
TINKER_IDLE_S=${TINKER_IDLE_S:-0}
MALLOC_STATS=${MALLOC_STATS:-0}
PY=${PYTHON:-/usr/bin/python3}
source scripts/env.sh
[ -x "$ZDP" ] || { echo "run_serve_load: no $ZDP; build first" >&2; exit 1; }

T=$(mktemp -d)
SERVER_PID=""
RANK0_PID=""
cleanup() {
  if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
    [ -n "$RANK0_PID" ] && kill -TERM "$RANK0_PID" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
    kill -TERM "$SERVER_PID" 2>/dev/null || true
  fi
  rm -rf "$T"
}
trap cleanup EXIT

# start_server_ TRIES SERVE_ARGS...: `zdp serve` in the background (SERVER_PID),
# waits for its listening line (URL, RANK0_PID) or exits naming the log.
start_server_() {
  local tries=$1
  shift
  "$@" >"$T/server.log" 2>&1 &
  SERVER_PID=$!
  URL=""
  for _ in $(seq "$tries"); do
    URL=$(grep -o 'listening on http://[0-9.]*:[0-9]*' "$T/server.log" | sed 's/listening on //' || true)
    RANK0_PID=$(grep -o 'rank 0 pid [0-9]*' "$T/server.log" | sed 's/rank 0 pid //' || true)
    [ -n "$URL" ] && [ -n "$RANK0_PID" ] && break
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 0.1
  done
  [ -n "$URL" ] || { echo "run_serve_load: the server did not start" >&2; cat "$T/server.log"; exit 1; }
}

echo "machine: $(nproc) CPU(s), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"

if [ $LORA = 1 ]; then
  SHARED=${ZDP_SHARED:-$(cd .. && pwd)/shared}
  sdk=$(bash "$SHARED/tinker-sdk.sh") || { echo "run_serve_load: the Tinker SDK is not importable" >&2; exit 1; }
  eval "$sdk"
  export TINKER_API_KEY=tml-local
  echo "CPU flags: $(grep -m1 '^flags' /proc/cpuinfo | grep -o 'avx512[a-z]*\|avx2\|fma' | sort -u | tr '\n' ' ')"
  echo "BLAS: $(OPENBLAS_VERBOSE=2 "$ZDP" --help 2>&1 | grep -i 'core' | head -1 || true)"
  echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  "$ZDP" init-model --arch llama --layers 4 --hidden 256 --heads 4 --kv-heads 2 --ffn 768 --vocab 4096 \
    --max-pos 128 --seed 1 --out "$T/base" >/dev/null
  cat >"$T/cfg.json" <<'JSON'
{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
 "managed_gradient_accumulation": false, "gradient_clipping": 0,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
 "zero_optimization": {"stage": 0}}
JSON
  start_server_ 600 timeout 900 mpirun -np "${NP:-1}" --oversubscribe "$ZDP" serve --model-dir "$T/base" \
    --block-size 128 --config "$T/cfg.json" --checkpoint-dir "$T/ck" --max-models 4 --port 0
  rc=0
  timeout 800 /usr/bin/python3 bench/serve_load.py --lora --url "$URL" --seconds "${SECONDS_PER_PHASE:-10}" \
    --repeats "${REPEATS:-3}" || rc=$?
  echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
  exit $rc
fi

MODEL=(--model gpt --n-layer 2 --n-head 2 --n-embd 64 --vocab-size 256 --block-size 64)
cat >"$T/cfg.json" <<'JSON'
{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
 "managed_gradient_accumulation": false, "gradient_clipping": 1.0,
 "zero_allow_untested_optimizer": true,
 "optimizer": {"type": "SGD", "params": {"lr": 1e-3}},
 "zero_optimization": {"stage": 2}}
JSON

timeout 60 mpirun -np 1 "$ZDP" train "${MODEL[@]}" --config "$T/cfg.json" --steps 0 --val-every 0 \
  --out-dir "$T/o" --save-weights "$T/init.safetensors" >"$T/init.log" 2>&1 ||
  { cat "$T/init.log"; exit 1; }

# The engine alone: median ms/step (after 5 warm-up steps) of 40 steps of
# 1 and of 4 micro-batches (B=1, T=64) per rank, alternating, 3 times each;
# the median of the 3 medians.
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
engine_ms() {
  timeout 60 mpirun -np 2 "$ZDP" train "${MODEL[@]}" --config "$T/cfg.json" --init "$T/init.safetensors" \
    --steps 40 --schedule "$1" --val-every 0 --progress off --out-dir "$T/o" 2>&1 |
    grep -o 'ms/step [0-9.]*' | awk '{print $2}' | tail -n +6 | median
}
: >"$T/e1"; : >"$T/e4"
for _ in 1 2 3; do engine_ms 1 >>"$T/e1"; engine_ms 4 >>"$T/e4"; done
E1=$(median <"$T/e1"); E4=$(median <"$T/e4")
echo "engine alone (zdp train -np 2, B=1 T=64): $E1 ms/step at 1 micro-batch/rank, $E4 at 4" \
  "(runs: $(tr '\n' ' ' <"$T/e1")/ $(tr '\n' ' ' <"$T/e4"))"

start_server_ 300 mpirun -np 2 "$ZDP" serve "${MODEL[@]}" --full-finetune --config "$T/cfg.json" \
  --init "$T/init.safetensors" --port 0 --checkpoint-dir "$T/ck" --long-poll-seconds 30 --seq-gap-seconds 30
grep 'listening on' "$T/server.log"

rc=0
# 240 s for everything but the timed phases, which take what they are told.
LIMIT=$(awk -v cs="$CS" -v l="$LOAD_S" -v s="$SOAK_S" -v k="$TINKER_SOAK_S" -v i="$TINKER_IDLE_S" \
  'BEGIN {print int(240 + split(cs, x, ",") * l + s + k + i + 0.999)}')
EXTRA=()
[ "$TINKER_IDLE_S" = 0 ] || EXTRA+=(--tinker-idle-s "$TINKER_IDLE_S")
[ "$MALLOC_STATS" = 0 ] || EXTRA+=(--malloc-stats)
timeout "$LIMIT" "$PY" bench/serve_load.py --url "$URL" --pid "$RANK0_PID" --log "$T/server.log" \
  --cs "$CS" --load-s "$LOAD_S" --soak-s "$SOAK_S" --tinker-soak-s "$TINKER_SOAK_S" \
  --engine-ms1 "$E1" --engine-ms4 "$E4" ${EXTRA[@]+"${EXTRA[@]}"} ${JSON:+--json "$JSON"} || rc=$?
for _ in $(seq 100); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$SERVER_PID" 2>/dev/null; then
  # serve_load.py ended before its SIGTERM (it failed or timed out): stop the server here.
  echo "run_serve_load: the server is still running; SIGTERM to rank 0" >&2
  kill -TERM "$RANK0_PID" 2>/dev/null || true
  for _ in $(seq 300); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$SERVER_PID" 2>/dev/null && kill -TERM "$SERVER_PID" 2>/dev/null
  rc=$((rc + 1))
fi
src=0
wait "$SERVER_PID" || src=$?
SERVER_PID=""
echo "server: mpirun exit $src; $(grep -c . "$T/server.log") log line(s); last: $(tail -1 "$T/server.log")"
grep -i "warning" "$T/server.log" | sed 's/^/server log: /' || true
[ -z "${LOG:-}" ] || cp "$T/server.log" "$LOG"
if [ $src -ne 0 ] || grep -q "MPI_ABORT\|zdp: error" "$T/server.log"; then
  echo "run_serve_load: the server did not stop cleanly" >&2; cat "$T/server.log"; rc=$((rc + 1))
fi
exit $rc
