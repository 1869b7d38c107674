#!/usr/bin/env bash
# Builds and runs every test three times: a normal build, the same with
# libzdp as a shared library, then an AddressSanitizer +
# UndefinedBehaviorSanitizer build; then the comm stream's unit test and the
# Tinker server scenario under ThreadSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh --tests
source scripts/env.sh
jobs=$(nproc)
# Every option is set here, not taken from a cache: scripts/demo.sh configures
# build/ without tests, and a reused cache would leave ctest nothing to run.
# ctest --no-tests=error makes "No tests were found" a failure, not a pass.
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DZDP_WERROR=ON -DZDP_BUILD_TESTS=ON \
  -DZDP_BUILD_BENCH=ON -DZDP_SANITIZE= -DZDP_FUZZ=OFF -DBUILD_SHARED_LIBS=OFF >/dev/null
cmake --build build -j"$jobs"
(cd build && ctest --output-on-failure --no-tests=error -j"$jobs")
# libzdp.so exports only the ZDP_API symbols (hidden visibility): the tool,
# the tests and the benches must link against those alone and pass again.
cmake -S . -B build-shared -DCMAKE_BUILD_TYPE=Release -DZDP_WERROR=ON -DZDP_BUILD_TESTS=ON \
  -DZDP_BUILD_BENCH=ON -DZDP_SANITIZE= -DZDP_FUZZ=OFF -DBUILD_SHARED_LIBS=ON >/dev/null
cmake --build build-shared -j"$jobs"
(cd build-shared && ctest --output-on-failure --no-tests=error -j"$jobs")
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DZDP_WERROR=ON -DZDP_BUILD_TESTS=ON \
  -DZDP_BUILD_BENCH=ON -DZDP_SANITIZE="address;undefined" -DZDP_FUZZ=OFF >/dev/null
cmake --build build-asan -j"$jobs"
(cd build-asan && ctest --output-on-failure --no-tests=error -j"$jobs")
# Threads under ThreadSanitizer: the comm stream (MPI itself is not TSan-clean
# across ranks, so its MPI-free test), and zdp serve's HTTP connection threads,
# futures and main loop through the whole Tinker scenario at one rank, and
# the multi-model one (a race report aborts the server, and the test fails on
# its exit status).
cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DZDP_SANITIZE=thread -DZDP_BUILD_TESTS=ON \
  -DZDP_BUILD_BENCH=OFF -DZDP_FUZZ=OFF >/dev/null
cmake --build build-tsan -j"$jobs" --target test_stream zdp_cli
(cd build-tsan && ctest --output-on-failure --no-tests=error -R unit.test_stream)
NPS=1 TSAN_OPTIONS="halt_on_error=1" bash tests/cli/test_tinker.sh build-tsan/bin/zdp "$(command -v mpirun)"
# The same for several LoRA models: per-model order, create/unload jobs, the heartbeat tick.
RUNS=gpt:1 TSAN_OPTIONS="halt_on_error=1" bash tests/cli/test_serve_multi.sh build-tsan/bin/zdp "$(command -v mpirun)"
# Fuzz targets (tests/fuzz): their seed corpora already ran above, in both
# builds, as the tests unit.fuzz_*_corpus.  With clang: the libFuzzer builds
# run the corpora too, then fuzz each target for ZDP_FUZZ_SECONDS (default 0:
# corpora only).  New crash inputs land in build-fuzz/crash-*.
if command -v clang >/dev/null 2>&1; then
  CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZDP_BUILD_TESTS=ON \
    -DZDP_SANITIZE="address;undefined" -DZDP_FUZZ=ON -DZDP_BUILD_BENCH=OFF >/dev/null
  cmake --build build-fuzz -j"$jobs" --target fuzz_safetensors fuzz_ckpt_meta fuzz_hf_config \
    fuzz_hf_index fuzz_lora_config
  fuzz_s=${ZDP_FUZZ_SECONDS:-0}
  for t in safetensors:safetensors ckpt_meta:meta hf_config:hf_config hf_index:hf_index \
           lora_config:lora_config; do
    name=${t%%:*} corpus=tests/fuzz/corpus/${t##*:}
    dict=tests/fuzz/${t##*:}.dict
    if [ "$fuzz_s" -gt 0 ]; then
      new=$(mktemp -d)
      ASAN_OPTIONS=detect_leaks=1 build-fuzz/tests/fuzz/fuzz_$name -max_total_time="$fuzz_s" \
        -max_len=16384 -dict="$dict" -artifact_prefix=build-fuzz/ "$new" "$corpus"
      rm -rf "$new"
    else
      ASAN_OPTIONS=detect_leaks=1 build-fuzz/tests/fuzz/fuzz_$name -runs=0 \
        -artifact_prefix=build-fuzz/ "$corpus"
    fi
  done
  echo "fuzz corpora passed under libFuzzer (clang, ASan+UBSan); fuzzed ${fuzz_s}s per target"
fi
echo "all tests passed (release, release with libzdp.so, ASan+UBSan, TSan for the comm stream and the server, fuzz corpora)"
