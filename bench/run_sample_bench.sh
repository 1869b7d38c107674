#!/usr/bin/env bash
# Sampling speed (docs/benchmarks-sample.md): bench_sample for gpt-m and a
# SmolLM2-135M-shaped Llama, prompts of 64 and 256 tokens, 256 new tokens,
# batch 1 and 32, with OPENBLAS_NUM_THREADS=${THREADS:-2}.  One line per run.
# usage: bench/run_sample_bench.sh [BUILD_DIR]   env: MODELS, PROMPTS, BATCHES, NEW, REPS
set -eu
BUILD=${1:-build}
export OPENBLAS_NUM_THREADS=${THREADS:-2}
for model in ${MODELS:-gpt-m smollm2}; do
  for P in ${PROMPTS:-64 256}; do
    for B in ${BATCHES:-1 32}; do
      "$BUILD/bin/bench_sample" --model "$model" --prompt "$P" --new "${NEW:-256}" --batch "$B" --reps "${REPS:-2}"
    done
  done
done
