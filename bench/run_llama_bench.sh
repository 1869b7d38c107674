#!/usr/bin/env bash
# zdp vs PyTorch training a SmolLM2-135M-shaped Llama (30 layers, hidden 576,
# 9 heads, 3 KV heads, FFN 1536, vocab 49152, tied; random weights) at
# T = 256, micro-batch 4 per rank, at -np 2 x 1 thread and -np 1 x 2
# threads, alternating, medians; MFU against the cblas_sgemm peak.
# docs/benchmarks-llama.md has the method and the figures.
#
# usage: bench/run_llama_bench.sh [REPS] [STEPS]        (defaults 3 and 3)
# env:   LAYOUTS=2x1,1x2 IMPLS=zdp,torch MICRO=4 GA=1 BUILD=build JSON=out.json
#        GA=8: 8 micro-batches per optimizer step (gradient accumulation; a
#        "step" is then one optimizer step of 8 micro-batches per rank)
#        BASE=path/to/another/llama_bench with IMPLS=zdp,base,torch: before/after
#        (with GA > 1 the base binary must know --ga: build main's library
#        with this bench/llama_bench.c)
#        MODEL="--layers 4" (a smaller model for a quick look)
# Needs PyTorch for /usr/bin/python3 (bench/setup_torch.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-3}
STEPS=${2:-3}
BUILD=${BUILD:-build}
source scripts/env.sh
# CMA single-copy is faster where the kernel allows it; benchmarks use it.
unset OMPI_MCA_btl_vader_single_copy_mechanism
if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
    echo "run_llama_bench: /usr/bin/python3 cannot import torch; run bench/setup_torch.sh" >&2
    exit 1
fi
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD" -j"$(nproc)" --target llama_bench >/dev/null
BUILD=$(cd "$BUILD" && pwd)
OUT=$BUILD/bench-llama
mkdir -p "$OUT"
BLAS_INC=$(dirname "$(find /usr/include -name cblas.h -path '*openblas*' | head -1)")
cc -O2 -std=c11 -Wall -Wextra -I"$BLAS_INC" bench/sgemm_peak.c -lopenblas -o "$OUT/sgemm_peak"
# OpenBLAS's build and the core it chose for this CPU.
printf '#include <stdio.h>\n#include <cblas.h>\nint main(void) { printf("%%s; core %%s\\n", openblas_get_config(), openblas_get_corename()); return 0; }\n' \
    >"$OUT/openblas_core.c"
cc -O2 -I"$BLAS_INC" "$OUT/openblas_core.c" -lopenblas -o "$OUT/openblas_core"
exec /usr/bin/python3 bench/torch/llama_compare.py --llama-bench "$BUILD/bin/llama_bench" \
    --sgemm-peak "$OUT/sgemm_peak" --openblas-core "$OUT/openblas_core" --mpirun mpirun \
    --reps "$REPS" --steps "$STEPS" --warmup 1 --micro "${MICRO:-4}" --ga "${GA:-1}" \
    --layouts "${LAYOUTS:-2x1,1x2}" --impls "${IMPLS:-zdp,torch}" --model "${MODEL:-}" \
    ${BASE:+--base-llama-bench "$BASE"} ${JSON:+--json "$JSON"}
