#!/usr/bin/env bash
# Builds bench_collectives and runs the whole reduce-scatter comparison
# (docs/benchmarks-collectives.md).  Takes about 5 minutes on 2 vCPUs.
#   BUILD_DIR   build directory (default: <repo>/build-bench, git-ignored)
#   REPS        repetitions per size, median reported (default 7, minimum 7)
#   MAX_MIB     largest per-rank buffer at -np 2 (default 256)
#   MAX_MIB_OVERSUB  largest buffer at -np 3 and 4 (default 64, keeps the run
#               under ~5 min; 256 adds ~90 s)
#   SKIP_OVERSUB=1   only the -np 2 runs
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$ROOT/build-bench}
REPS=${REPS:-7}
MAX_MIB=${MAX_MIB:-256}
MAX_MIB_OVERSUB=${MAX_MIB_OVERSUB:-64}
source "$ROOT/scripts/env.sh"
# CMA single-copy works here and is what a real run should use; env.sh
# disables it for robustness of the tests.
unset OMPI_MCA_btl_vader_single_copy_mechanism

BIN=""
# Preferred: the CMake target, linked against libzdp's ring reduce-scatter.
if cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DZDP_BUILD_TESTS=OFF >/dev/null 2>&1 &&
   cmake --build "$BUILD_DIR" --target bench_collectives -j 2 >"$BUILD_DIR/bench_build.log" 2>&1; then
  BIN=$BUILD_DIR/bin/bench_collectives
  echo "# built $BIN (ring from libzdp)"
else
  # The library does not build (or bench/ is not in the top-level project):
  # use the bench's private copy of the same ring algorithm.
  mkdir -p "$BUILD_DIR"
  mpicc -O2 -std=c11 -DZDP_BENCH_PRIVATE_RING "$ROOT/bench/bench_collectives.c" \
        -o "$BUILD_DIR/bench_collectives_private"
  BIN=$BUILD_DIR/bench_collectives_private
  echo "# libzdp/bench target did not build (see $BUILD_DIR/bench_build.log);"
  echo "# built $BIN with the bench's PRIVATE copy of the ring reduce-scatter"
fi

echo "# machine: nproc=$(nproc)  cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')" \
     " $(mpirun --version | head -1)  $(ldd --version | head -1)"
run() { echo; echo "## $*"; "$@"; }
T0=$SECONDS
run mpirun -np 2 "$BIN" --reps "$REPS" --max-mib "$MAX_MIB"
run mpirun -np 2 "$BIN" --reps "$REPS" --max-mib "$MAX_MIB" --no-trim
# Forced Open MPI tuned reduce_scatter algorithms.  Only MPI_Reduce_scatter
# (rs_even, bkt_rs) is affected; allreduce, ring_even and bkt_reduce are kept
# as same-run references.
for alg in 1 2 3; do
  run env OMPI_MCA_coll_tuned_use_dynamic_rules=1 OMPI_MCA_coll_tuned_reduce_scatter_algorithm=$alg \
      mpirun -np 2 "$BIN" --reps "$REPS" --max-mib "$MAX_MIB" \
      --only allreduce,rs_even,ring_even,bkt_rs,bkt_reduce
done
if [ "${SKIP_OVERSUB:-0}" != 1 ]; then
  for np in 3 4; do
    run mpirun -np $np "$BIN" --reps "$REPS" --max-mib "$MAX_MIB_OVERSUB"
  done
fi
echo; echo "# total wall time: $((SECONDS - T0)) s"
