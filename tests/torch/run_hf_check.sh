#!/usr/bin/env bash
# PyTorch check of Hugging Face folders and `zdp train --model-dir`
# (tests/torch/check_hf.py: 5 training steps at -np 2 ZeRO 2 unmanaged and
# -np 3 ZeRO 1 managed against the float64 port llama_ref.py; the sharded
# layout read by its own header parser; BF16 folders both ways).  PyTorch is
# a test dependency only; exits 77 -- CTest's SKIP_RETURN_CODE -- when
# /usr/bin/python3 cannot import torch, saying so.
#
# usage: tests/torch/run_hf_check.sh ZDP_CLI [MPIEXEC]
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PY=/usr/bin/python3

if [ $# -lt 1 ]; then
    echo "usage: $0 ZDP_CLI [MPIEXEC]" >&2
    exit 2
fi
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
    echo "run_hf_check: SKIPPED: $PY cannot import torch (scripts/install-deps.sh or bench/setup_torch.sh installs it)"
    exit 77
fi
if [ ! -x "$1" ]; then
    echo "run_hf_check: $1: not an executable (build it first)" >&2
    exit 1
fi
source "$HERE/../../scripts/env.sh"
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
exec timeout 500 "$PY" "$HERE/check_hf.py" --zdp "$1" --mpirun "${2:-mpirun}"
