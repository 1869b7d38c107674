#!/usr/bin/env bash
# Builds and runs every test twice: a normal build, then an
# AddressSanitizer + UndefinedBehaviorSanitizer build; then the comm stream's
# unit test under ThreadSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
source scripts/env.sh
jobs=$(nproc)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DZDP_WERROR=ON >/dev/null
cmake --build build -j"$jobs"
(cd build && ctest --output-on-failure -j"$jobs")
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DZDP_WERROR=ON -DZDP_SANITIZE="address;undefined" >/dev/null
cmake --build build-asan -j"$jobs"
(cd build-asan && ctest --output-on-failure -j"$jobs")
# The comm stream's thread under ThreadSanitizer (MPI itself is not TSan-clean,
# so only the MPI-free stream test runs here).
cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DZDP_SANITIZE=thread -DZDP_BUILD_BENCH=OFF >/dev/null
cmake --build build-tsan -j"$jobs" --target test_stream
(cd build-tsan && ctest --output-on-failure -R unit.test_stream)
echo "all tests passed (release, ASan+UBSan, TSan for the comm stream)"
