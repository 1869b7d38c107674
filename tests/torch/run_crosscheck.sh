#!/usr/bin/env bash
# PyTorch cross-check of zdp's GPT-2 (optional: PyTorch is never needed to
# build or test zdp).  Exits 77 -- CTest's SKIP_RETURN_CODE -- when
# /usr/bin/python3 cannot import torch (bench/setup_torch.sh installs it).
#
# usage: tests/torch/run_crosscheck.sh GPT_GRADS ZDP_CLI [MPIEXEC]
#   GPT_GRADS  the built tests/torch/gpt_grads.c
#   ZDP_CLI    the built `zdp` command (build/bin/zdp)
#   MPIEXEC    default: mpirun
# Builds nothing.  Runs check_gpt.py grads (loss, logits and every gradient
# against PyTorch in float64) and check_gpt.py train (5 AdamW steps of
# `mpirun -np 2 zdp train --model gpt` at ZeRO stage 2 against PyTorch).
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PY=/usr/bin/python3

if [ $# -lt 2 ]; then
    echo "usage: $0 GPT_GRADS ZDP_CLI [MPIEXEC]" >&2
    exit 2
fi
GPT_GRADS=$1 ZDP=$2 MPIEXEC=${3:-mpirun}

if ! "$PY" -c "import torch" >/dev/null 2>&1; then
    echo "run_crosscheck: SKIPPED: $PY cannot import torch (run bench/setup_torch.sh to install it)"
    exit 77
fi
for f in "$GPT_GRADS" "$ZDP"; do
    if [ ! -x "$f" ]; then
        echo "run_crosscheck: $f: not an executable (build it first)" >&2
        exit 1
    fi
done

# Open MPI as root / oversubscribed, as scripts/env.sh sets (CTest passes the
# same through its ENVIRONMENT); one BLAS thread per rank.
source "$HERE/../../scripts/env.sh"
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}

rc=0
echo "== check_gpt.py grads"
"$PY" "$HERE/check_gpt.py" grads --gpt-grads "$GPT_GRADS" || rc=1
echo "== check_gpt.py train"
"$PY" "$HERE/check_gpt.py" train --zdp "$ZDP" --mpirun "$MPIEXEC" --np 2 || rc=1
exit $rc
