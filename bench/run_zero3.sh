#!/usr/bin/env bash
# ZeRO stage 3 beside stage 2 through `zdp train` (docs/benchmarks.md,
# "ZeRO stage 3"), three parts:
#   mem  - `--memory-report on`: every rank's bytes by category after the
#          first step, for the gpt-m shape (6 layers, 384 wide, vocab 256)
#          and a SmolLM2-135M-shaped Llama (30 layers, hidden 576, 9 heads,
#          3 KV heads, FFN 1536, vocab 49152, tied; random weights from
#          `zdp init-model`), stages 2 and 3, -np 1, 2, 3, 4;
#   time - the gpt-m shape at -np 2 over shared memory: stage 2 and stage 3
#          with prefetch, alternating, REPS runs of STEPS steps (steps 3 on);
#   tcp  - the same at -np 2 inside a private network namespace whose
#          loopback is rate-limited to one 1 Gbit/s link (as
#          bench/run_zero2.sh; needs root and iproute2): stage 3 with
#          prefetch on and off, alternating; the comm wait per step (the
#          time forward and backward sat waiting for a gather or a
#          reduction) gives the share of gather wait prefetch hides.
# Prints raw lines (rank, category, bytes; ms/step, comm wait ms) and
# medians.  Nothing here is a test.
#
# usage: bench/run_zero3.sh [REPS] [STEPS]    (defaults 3 and 5)
# env:   PARTS="mem time tcp"  NPS="1 2 3 4"  PF_BUCKET (stage3_prefetch_bucket_size, 4e6)
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-3}
STEPS=${2:-5}
PARTS=${PARTS:-mem time tcp}
NPS=${NPS:-1 2 3 4}
PF_BUCKET=${PF_BUCKET:-4000000}
source scripts/env.sh
unset OMPI_MCA_btl_vader_single_copy_mechanism
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target zdp_cli >/dev/null
ZDP=$PWD/build/bin/zdp
OUT=$(mktemp -d)
source bench/netns_lib.sh
cleanup() { netns_down; rm -rf "$OUT"; }
trap cleanup EXIT

echo "machine: $(nproc) cpus, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "flags: $(grep -m1 -o 'avx512f\|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ')"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"

"$ZDP" gen-data --corpus arith --lines 20000 --out "$OUT/tok.bin" >/dev/null
GPT=(--model gpt --n-layer 6 --n-head 6 --n-embd 384 --vocab-size 256 --block-size 256 --val-every 0)
"$ZDP" init-model --arch llama --layers 30 --hidden 576 --heads 9 --kv-heads 3 --ffn 1536 \
    --vocab 49152 --tie --out "$OUT/smol" >/dev/null
SMOL=(--model-dir "$OUT/smol" --block-size 64)

config() { # config FILE STAGE PREFETCH_BUCKET [extra]
  cat >"$1" <<JSON
{"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.01}},
 "zero_optimization": {"stage": $2, "overlap_comm": true,
                       "stage3_prefetch_bucket_size": $3${4:+, $4}}}
JSON
}
config "$OUT/s2.json" 2 0
config "$OUT/s3.json" 3 "$PF_BUCKET"
config "$OUT/s3nopf.json" 3 0

train() { # train NP CONFIG MODELARGS... -> stdout
  local np=$1 cfg=$2; shift 2
  timeout 1200 mpirun -np "$np" --oversubscribe "$ZDP" train "$@" --config "$cfg" \
      --data "$OUT/tok.bin" --out-dir "$OUT/run"
}

if [[ " $PARTS " == *" mem "* ]]; then
  echo
  echo "== mem: bytes per rank after the first step (--memory-report on) =="
  for model in gpt smol; do
    if [ $model = gpt ]; then margs=("${GPT[@]}"); else margs=("${SMOL[@]}"); fi
    for np in $NPS; do
      for stage in 2 3; do
        train "$np" "$OUT/s$stage.json" "${margs[@]}" --steps 1 --memory-report on \
          | awk -v m=$model -v np=$np -v s=$stage '$1 == "memory" { print m, "np=" np, "stage=" s, "rank=" $4, $6, $8 }'
      done
    done
  done
fi

# The ms/step and comm wait of steps 3.. of one run, from metrics.csv.
steps_of() { awk -F, 'NR > 3 { print $NF, $12 }' "$OUT/run/metrics.csv"; }

median() { sort -g | awk '{ a[NR] = $1 } END { print NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }

if [[ " $PARTS " == *" time "* ]]; then
  echo
  echo "== time: gpt-m shape, -np 2, shared memory; ms/step and comm wait ms, steps 3-$STEPS =="
  : >"$OUT/time.txt"
  for ((rep = 0; rep < REPS; rep++)); do
    for c in s2 s3; do
      train 2 "$OUT/$c.json" "${GPT[@]}" --steps "$STEPS" >/dev/null
      steps_of | sed "s/^/$c /" | tee -a "$OUT/time.txt"
    done
  done
  for c in s2 s3; do
    echo "$c median ms/step $(awk -v c=$c '$1 == c { print $2 }' "$OUT/time.txt" | median)" \
         "comm wait $(awk -v c=$c '$1 == c { print $3 }' "$OUT/time.txt" | median)"
  done
  echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
fi

if [[ " $PARTS " == *" tcp "* ]]; then
  echo
  if netns_up; then
    echo "== tcp: gpt-m shape, -np 2, 1 Gbit/s loopback; ms/step and comm wait ms, steps 3-$STEPS =="
    : >"$OUT/tcp.txt"
    for ((rep = 0; rep < REPS; rep++)); do
      for c in s3 s3nopf; do
        netns_mpirun -np 2 --oversubscribe "$ZDP" train "${GPT[@]}" --config "$OUT/$c.json" --data "$OUT/tok.bin" \
          --out-dir "$OUT/run" --steps "$STEPS" >/dev/null
        steps_of | sed "s/^/$c /" | tee -a "$OUT/tcp.txt"
      done
    done
    for c in s3 s3nopf; do
      echo "$c median ms/step $(awk -v c=$c '$1 == c { print $2 }' "$OUT/tcp.txt" | median)" \
           "comm wait $(awk -v c=$c '$1 == c { print $3 }' "$OUT/tcp.txt" | median)"
    done
    netns_down
  fi
fi
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
