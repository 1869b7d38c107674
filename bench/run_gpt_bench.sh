#!/usr/bin/env bash
# zdp vs PyTorch DDP training GPT-2 on this machine's CPUs: gpt-s (L4 H4
# C256 T128 b8) and gpt-m (L6 H6 C384 T256 b4), vocab 256, at -np 1 (2
# BLAS threads) and -np 2 (1 thread each), zdp ZeRO stage 0 and 2 vs DDP
# (gloo), alternating implementations within each repetition, medians.
# Also: the cblas_sgemm peak (for MFU) and the optimizer step alone.
# docs/benchmarks-gpt.md has the method and the figures.
#
# usage: bench/run_gpt_bench.sh [REPS] [STEPS]            (defaults 3 and 8)
# env:   MODELS=gpt-s,gpt-m NPS=1,2 IMPLS=zdp0,zdp2,torch BUILD=build
#        JSON=out.json (machine-readable results)
# Needs: a built build/bin/zdp with `train --model gpt`, build/libzdp.a,
# and PyTorch for /usr/bin/python3 (bench/setup_torch.sh).
# OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE are left as the environment sets
# them; the sgemm peak is measured under the same environment.
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-3}
STEPS=${2:-8}
BUILD=${BUILD:-build}
source scripts/env.sh
# CMA single-copy is faster where the kernel allows it; benchmarks use it.
unset OMPI_MCA_btl_vader_single_copy_mechanism

if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
    echo "run_gpt_bench: /usr/bin/python3 cannot import torch; run bench/setup_torch.sh" >&2
    exit 1
fi
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD" -j"$(nproc)" --target zdp_cli zdp optim_bench >/dev/null
BUILD=$(cd "$BUILD" && pwd)
ZDP=$BUILD/bin/zdp
if ! "$ZDP" train --help 2>&1 | grep -- "--model" >/dev/null; then
    echo "run_gpt_bench: $ZDP has no 'train --model gpt' yet" >&2
    exit 1
fi

# sgemm_peak is built here, outside CMake: it needs OpenBLAS alone.
OUT=$BUILD/bench-gpt
mkdir -p "$OUT"
BLAS_INC=$(dirname "$(find /usr/include -name cblas.h -path '*openblas*' | head -1)")
cc -O2 -std=c11 -Wall -Wextra -I"$BLAS_INC" bench/sgemm_peak.c -lopenblas -o "$OUT/sgemm_peak"

exec /usr/bin/python3 bench/torch/gpt_bench.py --zdp "$ZDP" --mpirun mpirun \
    --sgemm-peak "$OUT/sgemm_peak" --optim-bench "$BUILD/bin/optim_bench" \
    --reps "$REPS" --steps "$STEPS" --warmup 2 \
    --models "${MODELS:-gpt-s,gpt-m}" --nps "${NPS:-1,2}" --impls "${IMPLS:-zdp0,zdp2,torch}" \
    ${JSON:+--json "$JSON"}
