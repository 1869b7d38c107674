#!/usr/bin/env bash
# Memory of the LoRA server (zdp serve's default mode) at ZeRO stage 3
# against stage 2, with 1, 2 and 4 models (docs/benchmarks-serve.md, "LoRA
# models at ZeRO stage 3"): GET /info's rows per rank (the base held whole,
# the shared base partition, each model's engine bytes, the whole base
# gathered for a sampling batch) and each rank's resident set (VmRSS, VmHWM)
# after every model has trained one step and sampled.  A Llama folder from
# `zdp init-model` (SHAPE, random weights), --block-size 128, -np NP
# (default 2), rank-8 adapters on every target.  Bytes, not time: the load
# of the shared machine does not change them.
#
# usage: bench/run_serve_zero3_lora.sh
# env:   NP=2 BUILD=build SHAPE="--layers 8 --hidden 256 --heads 4 --kv-heads 2 --ffn 768 --vocab 4096"
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
ZDP=$(cd "$BUILD" && pwd)/bin/zdp
NP=${NP:-2}
SHAPE=${SHAPE:---layers 8 --hidden 256 --heads 4 --kv-heads 2 --ffn 768 --vocab 4096}
source scripts/env.sh
[ -x "$ZDP" ] || { echo "run_serve_zero3_lora: no $ZDP; build first" >&2; exit 1; }

T=$(mktemp -d)
MPI_PID=""
cleanup() {
  if [ -n "$MPI_PID" ] && kill -0 "$MPI_PID" 2>/dev/null; then
    kill -TERM "$MPI_PID" 2>/dev/null || true
    wait "$MPI_PID" 2>/dev/null || true
  fi
  rm -rf "$T"
}
trap cleanup EXIT

echo "commit $(git rev-parse --short HEAD), $(date -u '+%Y-%m-%d %H:%M UTC'), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "machine: $(nproc) CPU(s), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
# shellcheck disable=SC2086
"$ZDP" init-model --arch llama $SHAPE --max-pos 256 --out "$T/base" >/dev/null

for stage in 2 3; do
  cat >"$T/cfg$stage.json" <<JSON
{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
 "managed_gradient_accumulation": false,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
 "zero_optimization": {"stage": $stage}}
JSON
  log="$T/serve-$stage.log"
  timeout 900 mpirun -np "$NP" --oversubscribe "$ZDP" serve --model-dir "$T/base" --block-size 128 \
    --config "$T/cfg$stage.json" --checkpoint-dir "$T/ck$stage" --max-models 4 --port 0 >"$log" 2>&1 &
  MPI_PID=$!
  URL=""
  for _ in $(seq 600); do
    URL=$(grep -o 'listening on http://[0-9.]*:[0-9]*' "$log" | sed 's/listening on //' || true)
    [ -n "$URL" ] && break
    sleep 0.1
  done
  [ -n "$URL" ] || { cat "$log"; exit 1; }
  # The ranks: children of mpirun, itself the child of timeout.
  PIDS=$(for p in $(pgrep -P "$MPI_PID"); do pgrep -P "$p"; done | tr '\n' ' ')
  PYTHONPATH=tests/serve python3 - "$URL" "$stage" "$PIDS" <<'PY'
import sys
import multi_check as M
import zero3_lora_check as Z

url, stage, pids = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()

def rss():
    out = []
    for p in pids:
        f = {l.split(":")[0]: l.split()[1] for l in open("/proc/%s/status" % p) if l.startswith("Vm")}
        out.append("%.1f/%.1f" % (int(f["VmRSS"]) / 1024, int(f["VmHWM"]) / 1024))
    return " ".join(out)

sc = M.client(url)
name = sc.get_server_capabilities()["supported_models"][0]["model_name"]
tcs = []
print("stage %d: K  base MB  per rank: whole base MB | base partition MB | models' engines MB | "
      "gathered whole MB (sampling) | VmRSS/VmHWM MB" % stage)
for k in (1, 2, 4):
    while len(tcs) < k:
        tc = sc.create_lora_training_client(name, rank=8, seed=len(tcs) + 1)
        tc.forward_backward(M.DATA_A, "cross_entropy").result()
        tc.optim_step(M.ADAM).result()
        if not Z.greedy(sc, tc, "s%d" % len(tcs)):  # save_weights_for_sampler, then asample
            sys.exit("sampling failed")
        tcs.append(tc)
    info = M.info(url)
    base = info["base_bytes"] / 2**20
    rows = []
    for r, row in enumerate(info["memory"]):
        eng = sum(m["memory"][r]["total_bytes"] for m in info["models"])
        rows.append("%.2f | %.2f | %.2f | %.2f" % (row["base_whole_bytes"] / 2**20, row["base_partition_bytes"] / 2**20,
                                                   eng / 2**20, row["gathered_whole_bytes"] / 2**20))
    print("stage %d: %d  %.2f  %s  | %s" % (stage, k, base, "  ;  ".join(rows), rss()), flush=True)
PY
  kill -TERM "$(grep -o 'rank 0 pid [0-9]*' "$log" | sed 's/rank 0 pid //')" 2>/dev/null || true
  wait "$MPI_PID" 2>/dev/null || true
  MPI_PID=""
done
