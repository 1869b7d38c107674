#!/usr/bin/env bash
# The main job: installs what is missing, builds zdp, and trains a small GPT
# (4 layers, 128 wide, byte-level) on zdp's generated arithmetic corpus across
# 2 ranks with ZeRO stage 2, then shows what it learned.  A few minutes on 2
# cores.  Metrics: build/gpt-run/metrics.csv, loss curve: build/gpt-run/loss.svg.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
source scripts/env.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DZDP_BUILD_TESTS=OFF -DZDP_BUILD_BENCH=OFF >/dev/null
cmake --build build -j"$(nproc)" --target zdp_cli >/dev/null
# The progress line rewrites itself with \r and escape codes: only for a
# terminal.  Under mpirun zdp cannot tell (every rank gets a pseudo-terminal),
# so the choice is made here, by whether this script's stdout is one.
progress=off
[ -t 1 ] && progress=on
mpirun -np 2 build/bin/zdp train --model gpt --config examples/ds_config_gpt.json \
  --steps 800 --val-every 100 --progress "$progress" --out-dir build/gpt-run \
  --save-weights build/gpt.safetensors
echo
echo "The trained model answers (greedy): 21+75="
build/bin/zdp sample --weights build/gpt.safetensors --n-head 4 --prompt $'\n21+75=' \
  --max-tokens 4 --temperature 0
