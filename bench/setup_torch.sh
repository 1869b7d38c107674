#!/bin/sh
# Installs Debian's PyTorch (python3-torch) for the GPT-2 benchmarks and the
# optional PyTorch cross-check (tests/torch/).  zdp's build and tests never
# call this script and never need PyTorch: the cross-check is skipped (CTest
# exit 77) when /usr/bin/python3 cannot import torch.
#
# Usage: bench/setup_torch.sh          (as root, or with sudo available)
set -eu

if /usr/bin/python3 -c "import torch" 2>/dev/null; then
    echo "setup_torch: torch already importable by /usr/bin/python3:"
    /usr/bin/python3 -c "import torch; print('  torch', torch.__version__)"
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update
# python3-torch pulls in numpy and an OpenBLAS/BLIS backend (~230 packages).
$SUDO apt-get install -y --no-install-recommends python3-torch python3-numpy

/usr/bin/python3 -c "import torch; print('setup_torch: torch', torch.__version__, 'threads', torch.get_num_threads())"
