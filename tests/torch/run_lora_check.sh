#!/usr/bin/env bash
# PyTorch cross-check of LoRA (tests/torch/check_lora.py: PEFT's math on the
# float64 port tests/torch/llama_ref.py): adapter gradients, 5 training
# steps at -np 1-3 and ZeRO 0-2, and zdp lora merge.  Exits 77 -- CTest's
# SKIP_RETURN_CODE -- when /usr/bin/python3 cannot import torch, saying so.
#
# usage: tests/torch/run_lora_check.sh ZDP [MPIEXEC]
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PY=/usr/bin/python3

if [ $# -lt 1 ]; then
    echo "usage: $0 ZDP [MPIEXEC]" >&2
    exit 2
fi
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
    echo "run_lora_check: SKIPPED: $PY cannot import torch (scripts/install-deps.sh or bench/setup_torch.sh installs it)"
    exit 77
fi
if [ ! -x "$1" ]; then
    echo "run_lora_check: $1: not an executable (build it first)" >&2
    exit 1
fi
source "$HERE/../../scripts/env.sh"
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
exec timeout 500 "$PY" "$HERE/check_lora.py" --zdp "$1" --mpirun "${2:-mpirun}"
