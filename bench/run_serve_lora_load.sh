#!/usr/bin/env bash
# Request throughput of `zdp serve` with 1, 2 and 4 LoRA models at once
# (docs/benchmarks-serve.md, "Throughput with 1, 2 and 4 LoRA models"), through
# the official Tinker SDK (bench/serve_lora_load.py).  A Llama folder from
# `zdp init-model` (4 layers, hidden 256, 4 heads, 2 KV heads, FFN 768, vocab
# 4096, untied; random weights), --block-size 128, -np NP (default 1), ZeRO
# stage 0, --max-models 4, rank-8 adapters on every target.
# Needs the vendored SDK: the shared folder beside the repository (or
# ZDP_SHARED) with its tinker-sdk.sh.
#
# usage: bench/run_serve_lora_load.sh
# env:   NP=1 SECONDS_PER_PHASE=10 REPEATS=3 BUILD=build
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
ZDP=$(cd "$BUILD" && pwd)/bin/zdp
NP=${NP:-1}
SHARED=${ZDP_SHARED:-$(cd .. && pwd)/shared}
source scripts/env.sh
[ -x "$ZDP" ] || { echo "run_serve_lora_load: no $ZDP; build first" >&2; exit 1; }
sdk=$(bash "$SHARED/tinker-sdk.sh") || { echo "run_serve_lora_load: the Tinker SDK is not importable" >&2; exit 1; }
eval "$sdk"
export TINKER_API_KEY=tml-local

T=$(mktemp -d)
SERVER_PID=""
RANK0_PID=""
cleanup() {
  if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
    [ -n "$RANK0_PID" ] && kill -TERM "$RANK0_PID" 2>/dev/null
    for _ in $(seq 100); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
    kill -TERM "$SERVER_PID" 2>/dev/null || true
  fi
  rm -rf "$T"
}
trap cleanup EXIT

echo "machine: $(nproc) CPU(s), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
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
timeout 900 mpirun -np "$NP" --oversubscribe "$ZDP" serve --model-dir "$T/base" --block-size 128 \
  --config "$T/cfg.json" --checkpoint-dir "$T/ck" --max-models 4 --port 0 >"$T/server.log" 2>&1 &
SERVER_PID=$!
URL=""
for _ in $(seq 600); do
  URL=$(grep -o 'listening on http://[0-9.]*:[0-9]*' "$T/server.log" | sed 's/listening on //' || true)
  RANK0_PID=$(grep -o 'rank 0 pid [0-9]*' "$T/server.log" | sed 's/rank 0 pid //' || true)
  [ -n "$URL" ] && [ -n "$RANK0_PID" ] && break
  kill -0 "$SERVER_PID" 2>/dev/null || break
  sleep 0.1
done
[ -n "$URL" ] || { echo "run_serve_lora_load: the server did not start" >&2; cat "$T/server.log"; exit 1; }
rc=0
timeout 800 /usr/bin/python3 bench/serve_lora_load.py --url "$URL" --seconds "${SECONDS_PER_PHASE:-10}" \
  --repeats "${REPEATS:-3}" || rc=$?
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
exit $rc
