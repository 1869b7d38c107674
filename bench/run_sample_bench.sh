#!/usr/bin/env bash
# Sampling speed (docs/benchmarks-sample.md): bench_sample (zdp) and
# bench/torch/sample_torch.py (PyTorch with a KV cache) alternating, for
# gpt-m and a SmolLM2-135M-shaped Llama, prompts of 64 and 256 tokens, batch
# 1 and 32, NEW new tokens, ${THREADS:-2} BLAS threads each.  One line per run.
# usage: bench/run_sample_bench.sh [BUILD_DIR]
#   env: MODELS, PROMPTS, BATCHES, NEW (256), REPS (1), THREADS (2), TORCH (1: also torch),
#        SAMPLES (zdp at batches > 1 it divides: B/SAMPLES prompts of SAMPLES samples sharing
#        each prompt's cache, bench_sample --samples-per-prompt; torch still runs B prompts)
set -eu
BUILD=${1:-build}
HERE=$(cd "$(dirname "$0")" && pwd)
export OPENBLAS_NUM_THREADS=${THREADS:-2}
for model in ${MODELS:-gpt-m smollm2}; do
  for P in ${PROMPTS:-64 256}; do
    for B in ${BATCHES:-1 32}; do
      S=1
      if [ -n "${SAMPLES:-}" ] && [ "$B" -gt 1 ] && [ $((B % SAMPLES)) = 0 ]; then S=$SAMPLES; fi
      "$BUILD/bin/bench_sample" --model "$model" --prompt "$P" --new "${NEW:-256}" --batch "$B" --reps "${REPS:-1}" \
        --samples-per-prompt "$S"
      if [ "${TORCH:-1}" = 1 ]; then
        /usr/bin/python3 "$HERE/torch/sample_torch.py" --model "$model" --prompt "$P" --new "${NEW:-256}" \
          --batch "$B" --reps "${REPS:-1}" --threads "${THREADS:-2}"
      fi
    done
  done
done
