#!/usr/bin/env bash
# Builds and runs every test three times: a normal build, the same with
# libzdp as a shared library, then an AddressSanitizer +
# UndefinedBehaviorSanitizer build; then every test built for an AVX2 CPU,
# the unit and MPI tests of a portable build on each SIMD path, an aarch64
# compile of the kernels, and the comm stream's unit test and the Tinker
# server scenario under ThreadSanitizer.
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
# Every CPU, not only this one.  The builds above use -march=native; zdp's
# own kernels pick their SIMD path at run time whatever -march says
# (docs/architecture.md, "SIMD paths and the GEMM rule").  First every test
# built for an AVX2 CPU (-march=haswell) and run as one: the AVX2 path
# (ZDP_GEMM_ISA=1) and OpenBLAS's AVX2 kernels.  Then a portable build
# (ZDP_NATIVE=OFF: baseline x86-64 code around the kernels) runs the unit
# and MPI tests on each path pinned, so the numerics of the portable C, AVX2
# and AVX-512 paths are checked on any machine (a path the CPU lacks falls
# to its best).  Last, the kernels compile for aarch64, where no x86 path
# exists.
cmake -S . -B build-haswell -DCMAKE_BUILD_TYPE=Release -DZDP_NATIVE=OFF -DCMAKE_C_FLAGS=-march=haswell \
  -DZDP_WERROR=ON -DZDP_BUILD_TESTS=ON -DZDP_BUILD_BENCH=ON -DZDP_SANITIZE= -DZDP_FUZZ=OFF \
  -DBUILD_SHARED_LIBS=OFF >/dev/null
cmake --build build-haswell -j"$jobs"
if grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then
  (cd build-haswell && ZDP_GEMM_ISA=1 OPENBLAS_CORETYPE=Haswell \
    ctest --output-on-failure --no-tests=error -j"$jobs")
else
  echo "test: this CPU has no AVX2+FMA: the -march=haswell build is compiled, not run"
fi
cmake -S . -B build-portable -DCMAKE_BUILD_TYPE=Release -DZDP_NATIVE=OFF -DCMAKE_C_FLAGS= \
  -DZDP_WERROR=ON -DZDP_BUILD_TESTS=ON -DZDP_BUILD_BENCH=ON -DZDP_SANITIZE= -DZDP_FUZZ=OFF \
  -DBUILD_SHARED_LIBS=OFF >/dev/null
cmake --build build-portable -j"$jobs"
for isa in 0 1 2; do
  echo "test: portable build, ZDP_GEMM_ISA=$isa"
  (cd build-portable && ZDP_GEMM_ISA=$isa ctest --output-on-failure --no-tests=error -j"$jobs" -L 'unit|dist')
done
bash scripts/check-aarch64.sh
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
echo "all tests passed (release, release with libzdp.so, ASan+UBSan, -march=haswell on the AVX2 path, portable build on each SIMD path, aarch64 compile, TSan for the comm stream and the server, fuzz corpora)"
