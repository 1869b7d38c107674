#!/usr/bin/env bash
# ZeRO stage 0/1/2 x overlap_comm x managed/unmanaged for the MLP (hidden
# 1024, 4 layers, micro-batch 64, G = 4) at -np 2: step time, share of the
# step spent waiting for communication, peak RSS per rank.  Configurations
# are interleaved within each repetition (this machine is noisy) and the
# table shows medians over the repetitions.
#
# Two networks:
#   shm  - Open MPI's shared-memory transport (one host)
#   tcp  - a private network namespace whose loopback is rate-limited to one
#          shared 1 Gbit/s link (tc tbf), Open MPI forced onto TCP: ranks as
#          if on separate hosts.  Needs root and iproute2; skipped otherwise.
#
# usage: bench/run_zero2.sh [REPS] [STEPS]     (defaults 3 and 4)
# env:   BUCKET (reduce_bucket_size, default: zdp's), NETS="shm tcp"
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-3}
STEPS=${2:-4}
NETS=${NETS:-shm tcp}
source scripts/env.sh
# CMA single-copy is faster where the kernel allows it; benchmarks use it.
unset OMPI_MCA_btl_vader_single_copy_mechanism
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target bench_train >/dev/null
BIN=$PWD/build/bin/bench_train
OUT=$(mktemp -d)
source bench/netns_lib.sh
cleanup() { netns_down; rm -rf "$OUT"; }
trap cleanup EXIT

configs=()
for managed in 1 0; do
  for stage in 0 1 2; do
    for overlap in 0 1; do
      # DeepSpeed rejects overlap_comm with stage 0/1 in unmanaged mode.
      if [ "$managed" = 0 ] && [ "$stage" -lt 2 ] && [ "$overlap" = 1 ]; then continue; fi
      configs+=("$stage $overlap $managed")
    done
  done
done

bucket_args=()
if [ -n "${BUCKET:-}" ]; then bucket_args=(--bucket "$BUCKET"); fi

run_one() { # NET STAGE OVERLAP MANAGED
  local net=$1 stage=$2 overlap=$3 managed=$4
  local args=(--stage "$stage" --overlap "$overlap" --managed "$managed" --steps "$STEPS" "${bucket_args[@]}")
  if [ "$net" = shm ]; then
    mpirun -np 2 "$BIN" "${args[@]}"
  else
    netns_mpirun -np 2 "$BIN" "${args[@]}"
  fi
}

for net in $NETS; do
  if [ "$net" = tcp ]; then netns_up || continue; fi
  for ((rep = 0; rep < REPS; rep++)); do
    for c in "${configs[@]}"; do
      # shellcheck disable=SC2086
      run_one "$net" $c | grep '^stage=' >>"$OUT/$net.txt"
    done
  done
  echo
  echo "== $net: median of $REPS runs, $STEPS steps each (G = 4 micro-batches of 64; unmanaged: 3,4,5) =="
  printf '%-5s %-7s %-9s %10s %14s %11s %14s\n' stage overlap mode step_ms comm_wait_ms comm_share rss_mib/rank
  for c in "${configs[@]}"; do
    set -- $c
    grep "^stage=$1 overlap=$2 managed=$3 " "$OUT/$net.txt" | awk -v mode="$([ "$3" = 1 ] && echo managed || echo unmanaged)" '
      function med(a, n,   i, j, t) { for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
                                      return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
      { for (f = 1; f <= NF; f++) { split($f, kv, "="); v[kv[1]] = kv[2] }
        n++; s[n] = v["step_ms"]; w[n] = v["comm_wait_ms"]; h[n] = v["comm_share"]; r = v["rss_mib"]
        st = v["stage"]; ov = v["overlap"] }
      END { printf "%-5s %-7s %-9s %10.1f %14.1f %11.3f %14s\n", st, ov, mode, med(s, n), med(w, n), med(h, n), r }'
  done
  if [ "$net" = tcp ]; then netns_down; fi
done
