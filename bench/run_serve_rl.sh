#!/usr/bin/env bash
# The RL loop through `zdp serve` (docs/benchmarks-sample.md, "RL loop"):
# starts the server at -np NP on a gpt-m-shaped GPT-2 (L6 H6 C384 V256,
# block 512; random weights), ZeRO stage 1, and runs bench/serve_rl.py
# against it: 8 prompts x 8 samples x 64 new tokens, importance_sampling
# forward_backward, optim_step, ITERS times, with where the time goes.
# usage: bench/run_serve_rl.sh [ZDP_BINARY]
# env:   NPS="1 2" (one run each) THREADS=1 (kernel threads per rank)
#        ITERS=3 SAMPLE_ONLY=0 (1: the sampling phase only: -np scaling)
#        PROMPTS=8 SAMPLES=8 NEW=64
#        PACKS=0: the ranks run with ZDP_SERVE_SHARED_PACKS=0 (every sampling
#        batch packs its own copy of the weights: the store's gain, measured)
# Several sampling batches per weights snapshot, the cookbook's loop
# (docs/benchmarks-sample.md): SAMPLE_ONLY=1 PROMPTS=128 SAMPLES=16 NEW=16.
# Each iteration also reports the sampling phase's CPU seconds summed over
# the ranks and tokens per CPU second (-np scaling on a shared machine).
set -uo pipefail  # no -e: stop_server's kill of a finished server returns nonzero
BENCH=$(cd "$(dirname "$0")" && pwd)
source "$BENCH/../scripts/env.sh"
PYTHON=${PYTHON:-/usr/bin/python3}
# The tests' server helpers: ZDP, MPIEXEC, PY, $T (removed on exit, the
# server stopped first), fail, start_server / stop_server.
# Each rank free to run on either core (Open MPI binds ranks to cores at
# -np <= 2: rank 0's HTTP threads and its decoding then share one core, and a
# rank cannot move off a core another process holds).
export MPIEXEC_ARGS=${MPIEXEC_ARGS:---bind-to none}
source "$BENCH/../tests/cli/serve_lib.sh" "${1:-$BENCH/../build/bin/zdp}" "${MPIEXEC:-mpiexec}"
adamw_config 1 1e-4 1.0 5000000 >"$T/cfg.json"
extra=()
[ "${SAMPLE_ONLY:-0}" = 1 ] && extra+=(--sample-only)
# Full fine-tuning on either side of a before/after comparison: a server
# that trains LoRA models by default is told so (older ones know no flag).
ft=()
# (The help is read whole first: grep -q would close the pipe early, and under
# pipefail zdp's SIGPIPE would read as "no such flag".)
help=$("$ZDP" serve --help 2>&1)
[[ $help == *--full-finetune* ]] && ft+=(--full-finetune)
for np in ${NPS:-1 2}; do
  export OPENBLAS_NUM_THREADS=${THREADS:-1} ZDP_NUM_THREADS=${THREADS:-1}
  [ "${PACKS:-1}" = 0 ] && export ZDP_SERVE_SHARED_PACKS=0
  start_server "$np" "$T/server$np.log" --model gpt --n-layer 6 --n-head 6 --n-embd 384 --vocab-size 256 \
    --block-size 512 --config "$T/cfg.json" --checkpoint-dir "$T/ck$np" --model-name zdp-gpt "${ft[@]}" || continue
  # The ranks' process ids (the zdp processes under the server's launcher):
  # serve_rl.py sums their CPU seconds over the sampling phase.
  pids=() todo=("$SERVER_PID")
  while [ ${#todo[@]} -gt 0 ]; do
    p=${todo[0]} todo=("${todo[@]:1}")
    [ "$(cat /proc/"$p"/comm 2>/dev/null)" = zdp ] && pids+=("$p")
    for c in $(cat /proc/"$p"/task/*/children 2>/dev/null); do todo+=("$c"); done
  done
  echo "run_serve_rl: -np $np, $(grep -c processor /proc/cpuinfo) cpus, load $(cut -d' ' -f1-3 /proc/loadavg)," \
    "shared packs ${ZDP_SERVE_SHARED_PACKS:-1}"
  timeout 1800 $PY "$BENCH/serve_rl.py" "$URL" --iters "${ITERS:-3}" --prompts "${PROMPTS:-8}" \
    --samples "${SAMPLES:-8}" --new "${NEW:-64}" \
    --pids "$(IFS=,; echo "${pids[*]}")" "${extra[@]}" || fail "serve_rl.py at -np $np"
  stop_server
done
exit $((failures > 0))
