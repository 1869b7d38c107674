#!/usr/bin/env bash
# Compiles every source of src/nn/ and src/sample/ for aarch64 (compile
# only, -O2 so that the optimiser's warnings count, -Werror): the portable
# paths of zdp's kernels must build without x86 (no SIMD path but C's, as
# on ARM).  Installs nothing: needs aarch64-linux-gnu-gcc and the aarch64
# C library headers (Debian's gcc-aarch64-linux-gnu and
# libc6-dev-arm64-cross, which install-deps.sh --tests installs); without
# the compiler it says so and exits 0.
# usage: check-aarch64.sh
set -euo pipefail
cd "$(dirname "$0")/.."

cc=aarch64-linux-gnu-gcc
if ! command -v "$cc" >/dev/null 2>&1; then
  echo "check-aarch64: skipped: $cc not found (Debian: gcc-aarch64-linux-gnu libc6-dev-arm64-cross)"
  exit 0
fi
# Debian's cross compiler also searches the host's /usr/include, whose
# libc headers fail without the aarch64 ones.
if ! printf '#include <stdio.h>\n' | "$cc" -E -o /dev/null -x c - >/dev/null 2>&1; then
  echo "check-aarch64: skipped: $cc has no aarch64 C library headers (Debian: libc6-dev-arm64-cross)"
  exit 0
fi

# cblas.h: the host's OpenBLAS header, where CMakeLists.txt looks for it.
# It declares functions and types alone (Debian's OpenBLAS is built for a
# generic core), so it serves an aarch64 compile; -idirafter keeps the
# aarch64 C library's headers ahead of anything in that directory.
multiarch=$(gcc -print-multiarch 2>/dev/null || true)
blas_dir=""
for d in /usr/include/openblas /usr/include/"$multiarch"/openblas-pthread /usr/include/openblas-pthread \
         /usr/include/"$multiarch" /usr/include; do
  if [ -f "$d/cblas.h" ]; then blas_dir=$d; break; fi
done
if [ -z "$blas_dir" ]; then
  echo "check-aarch64: no cblas.h on this machine (Debian: libopenblas-dev)" >&2
  exit 1
fi
# The definition CMake makes where OpenBLAS names its core (gemm.c).
defs=()
if grep -q openblas_get_corename "$blas_dir/cblas.h"; then defs+=(-DZDP_HAVE_OPENBLAS_CORENAME=1); fi

flags=(-std=c11 -O2 -Wall -Wextra -Wstrict-prototypes -Wshadow -Werror -fno-math-errno
       -Iinclude -Isrc -idirafter "$blas_dir" "${defs[@]}")
echo "check-aarch64: $($cc --version | head -n1)"
echo "check-aarch64: flags: ${flags[*]}"
fail=0 n=0
for f in src/nn/*.c src/sample/*.c; do
  if "$cc" "${flags[@]}" -c -o /dev/null "$f"; then
    echo "  ok    $f"
  else
    echo "  FAIL  $f"
    fail=1
  fi
  n=$((n + 1))
done
if [ "$fail" -ne 0 ]; then
  echo "check-aarch64: errors (above)" >&2
  exit 1
fi
echo "check-aarch64: $n files compiled for aarch64, no warnings"
