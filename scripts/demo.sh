#!/usr/bin/env bash
# The main job: installs what is missing, builds zdp, and trains the MLP on
# generated data across 2 ranks with ZeRO stage 2, printing a line per step.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
source scripts/env.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DZDP_BUILD_TESTS=OFF >/dev/null
cmake --build build -j"$(nproc)" --target zdp_cli >/dev/null
mpirun -np 2 build/bin/zdp train --model mlp --hidden 32 --layers 4 \
  --config examples/ds_config_zero2.json --steps 100 --save-weights build/mlp.safetensors
echo "weights written to build/mlp.safetensors"
