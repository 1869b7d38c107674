#!/usr/bin/env bash
# Installs zdp's build dependencies from Debian 12's packages, only those
# that are missing; with --tests, the test suite's too.  Runs apt-get as root
# (or through sudo).
# usage: install-deps.sh [--tests]
set -euo pipefail

# libpcre2-dev and libicu-dev: the tokenizers' regexes and NFC (src/tokenizer/).
packages=(build-essential cmake pkg-config libopenmpi-dev openmpi-bin libopenblas-dev
          libjansson-dev libcmocka-dev libmicrohttpd-dev libpcre2-dev libicu-dev)
# The tests' alone (scripts/test.sh): python3-torch and python3-numpy for the
# PyTorch cross-checks in tests/torch/ (they must run, not skip), nodejs for
# the tokenizers' JS reference (tests/cli/test_tokenizer_reference.sh),
# gcc-aarch64-linux-gnu and libc6-dev-arm64-cross for the kernels' portable
# paths compiled for ARM (scripts/check-aarch64.sh).
if [ "${1:-}" = "--tests" ]; then
  packages+=(python3-torch python3-numpy nodejs gcc-aarch64-linux-gnu libc6-dev-arm64-cross)
elif [ -n "${1:-}" ]; then
  echo "install-deps: unknown option '$1' (usage: install-deps.sh [--tests])" >&2
  exit 2
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all dependencies present"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
