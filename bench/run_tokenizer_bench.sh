#!/usr/bin/env bash
# Encode speed of zdp's tokenizers against the reference (transformers.js's
# tokenizers under Node.js) on one core: the same 1.1 MB mixed corpus as
# tests/cli/test_tokenizer_reference.sh, Qwen3, Llama 3 and GPT-2, the two
# implementations alternating within each repetition (each run loads, encodes
# the whole corpus twice and counts the second, warm, encode), medians.  Prints
# the CPU and its flags first.  docs/benchmarks-tokenizer.md has the figures.
#
# usage: bench/run_tokenizer_bench.sh [REPS] [CORE]      (defaults 7 and 1)
# env:   SHARED=path of the shared folder (default: beside the repository)
#        BUILD=build
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-7}
CORE=${2:-1}
BUILD=${BUILD:-build}
SHARED=${SHARED:-$(cd .. && pwd)/shared}
LIB=$SHARED/vendor/lenml-tokenizers/main.js
cmake --build "$BUILD" -j2 --target bench_tokenizer >/dev/null
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
node tests/cli/tokenizer_reference.js corpus "$WORK/corpus.txt" 1.1 "$SHARED/data/tinyshakespeare.txt"

echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "flags: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(sse4_2|avx|avx2|avx512f|avx512bw|bmi2|popcnt)$' | tr '\n' ' ')"
echo "node $(node --version), one core (taskset -c $CORE), corpus $(stat -c %s "$WORK/corpus.txt") bytes, $REPS reps"

median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
printf "%-8s %12s %12s %8s\n" tokenizer "zdp MB/s" "JS MB/s" ratio
for name in qwen3 llama3 gpt2; do
    : > "$WORK/c" && : > "$WORK/js"
    for r in $(seq "$REPS"); do
        taskset -c "$CORE" "$BUILD/bin/bench_tokenizer" "$SHARED/data/tokenizers/$name" "$WORK/corpus.txt" 2 \
            2>/dev/null | tail -1 | awk '{print $1}' >> "$WORK/c"
        taskset -c "$CORE" node tests/cli/tokenizer_reference.js bench "$LIB" "$SHARED/data/tokenizers/$name" \
            "$WORK/corpus.txt" 2 | tail -1 | awk '{print $1}' >> "$WORK/js"
    done
    c=$(median < "$WORK/c")
    js=$(median < "$WORK/js")
    printf "%-8s %12.2f %12.3f %7.1fx\n" "$name" "$c" "$js" "$(echo "$c / $js" | bc -l)"
done
