#!/usr/bin/env bash
# PyTorch cross-check of zdp's Llama-family model (tests/torch/check_llama.py
# against the float64 port tests/torch/llama_ref.py).  PyTorch is a test
# dependency only (scripts/install-deps.sh installs python3-torch); exits 77
# -- CTest's SKIP_RETURN_CODE -- when /usr/bin/python3 cannot import torch,
# saying so.
#
# usage: tests/torch/run_llama_check.sh LLAMA_GRADS
#   LLAMA_GRADS  the built tests/torch/llama_grads.c
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PY=/usr/bin/python3

if [ $# -lt 1 ]; then
    echo "usage: $0 LLAMA_GRADS" >&2
    exit 2
fi
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
    echo "run_llama_check: SKIPPED: $PY cannot import torch (scripts/install-deps.sh or bench/setup_torch.sh installs it)"
    exit 77
fi
if [ ! -x "$1" ]; then
    echo "run_llama_check: $1: not an executable (build it first)" >&2
    exit 1
fi
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
exec "$PY" "$HERE/check_llama.py" --llama-grads "$1"
