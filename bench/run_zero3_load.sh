#!/usr/bin/env bash
# Stage-3 loading (docs/benchmarks.md, "Stage 3: peak memory while loading"):
# the peak resident memory of every rank (ru_maxrss from /usr/bin/time, the
# kernel's VmHWM) for `zdp train --model-dir` of a SmolLM2-135M-shaped folder
# (30 layers, hidden 576, 9 heads, 3 KV heads, FFN 1536, vocab 49152, tied;
# 538 MB fp32, random weights from `zdp init-model`) at ZeRO stage 3, -np 1-4,
# full fine-tuning and LoRA (rank 8), one step at T = 64, for two binaries
# run alternately: BEFORE (e.g. main's, which reads the whole model on every
# rank) and this tree's.  The same figure comes from both through
# /usr/bin/time, so they compare; this tree's also prints it itself
# (--memory-report's peak_rss) with the loader's peak (load_peak).
# Prints one line per run and rank, then the median per rank over REPS.
# Nothing here is a test.
#
# usage: bench/run_zero3_load.sh BEFORE_ZDP [REPS]   (REPS default 1)
# env:   NPS="1 2 3 4"  MODES="full lora"  SAVE=1 (full runs end with --save-model-dir:
#        the peak then includes saving, which main did from a whole gathered
#        copy on every rank and this tree streams a tensor at a time)
set -euo pipefail
cd "$(dirname "$0")/.."
BEFORE=${1:?usage: bench/run_zero3_load.sh BEFORE_ZDP [REPS]}
REPS=${2:-1}
NPS=${NPS:-1 2 3 4}
MODES=${MODES:-full lora}
source scripts/env.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target zdp_cli >/dev/null
AFTER=$PWD/build/bin/zdp
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

echo "machine: $(nproc) cpus, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "flags: $(grep -m1 -o 'avx512f\|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ')"
echo "commit: $(git rev-parse --short HEAD) (after), date: $(date -u +%F)"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"

"$AFTER" gen-data --corpus arith --lines 20000 --out "$OUT/tok.bin" >/dev/null
"$AFTER" init-model --arch llama --layers 30 --hidden 576 --heads 9 --kv-heads 3 --ffn 1536 \
    --vocab 49152 --tie --out "$OUT/smol" >/dev/null
cat >"$OUT/s3.json" <<'JSON'
{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.01}},
 "zero_optimization": {"stage": 3}}
JSON

run() { # run LABEL BINARY NP MODE REP
  local extra=()
  [ "$4" = lora ] && extra=(--lora-rank 8)
  [ "$4" = full ] && [ -n "${SAVE:-}" ] && extra=(--save-model-dir "$OUT/saved")
  timeout 600 mpirun --allow-run-as-root --oversubscribe -np "$3" /usr/bin/time -f "maxrss_kb %M" \
    "$2" train --model-dir "$OUT/smol" --config "$OUT/s3.json" --data "$OUT/tok.bin" --block-size 64 \
    --steps 1 --val-every 0 --out-dir "$OUT/o" --memory-report on "${extra[@]}" >"$OUT/log" 2>&1 ||
    { echo "FAILED: $1 np=$3 $4"; tail -5 "$OUT/log"; return 1; }
  # /usr/bin/time's lines come in rank order only by chance: one per rank.
  grep -a '^maxrss_kb' "$OUT/log" | sort -k2 -n | awk -v l="$1" -v np="$3" -v m="$4" -v rep="$5" \
    '{printf "%s np=%s %s rep=%s maxrss %.0f MB\n", l, np, m, rep, $2 / 1024}'
  grep -a 'load_peak\|peak_rss' "$OUT/log" | sed "s/^/  $1 np=$3 $4: /" || true
  grep -a '| rank 0 | total |' "$OUT/log" | sed "s/^/  $1 np=$3 $4: engine /" || true
}

for mode in $MODES; do
  for np in $NPS; do
    for rep in $(seq 1 "$REPS"); do
      run before "$BEFORE" "$np" "$mode" "$rep"
      run after "$AFTER" "$np" "$mode" "$rep"
    done
  done
done | tee "$OUT/all"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "largest rank's maxrss (MB), median over reps:"
for mode in $MODES; do
  for np in $NPS; do
    for l in before after; do
      med=$(grep "^$l np=$np $mode " "$OUT/all" |
            awk '{split($4, a, "="); if ($6 > mx[a[2]]) mx[a[2]] = $6} END {for (k in mx) print mx[k]}' |
            sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}')
      echo "  $mode $l np=$np: $med MB"
    done
  done
done
