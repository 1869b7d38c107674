#!/usr/bin/env bash
# Installs zdp's build and test dependencies from Debian 12's packages, only
# those that are missing.  Runs apt-get as root (or through sudo).
set -euo pipefail

# python3-torch and python3-numpy are the test suite's (the PyTorch
# cross-checks in tests/torch/ must run, not skip); building zdp never needs them.
# libpcre2-dev and libicu-dev: the tokenizers' regexes and NFC (src/tokenizer/).
packages=(build-essential cmake pkg-config libopenmpi-dev openmpi-bin libopenblas-dev
          libjansson-dev libcmocka-dev libmicrohttpd-dev libpcre2-dev libicu-dev python3-torch
          python3-numpy)
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
