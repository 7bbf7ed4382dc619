#!/usr/bin/env bash
# Install cadence (editable) and its test tools into the active Python environment.
#
# With an NVIDIA GPU (nvidia-smi lists one): torch from the package index, which is its CUDA build;
# cuda-python and numba-cuda come with cadence on Linux. CuPy is optional:
#   pip install -e ".[cuda13]"   (or ".[cuda12]": the CUDA major of your driver)
# CPU only: the CPU build of torch, from a local wheel folder when pip is set up with one (offline,
# or with its dependencies from the package index), else from PyTorch's CPU wheel index (a ~200 MB
# download instead of ~3 GB of CUDA wheels); then Triton, whose interpreter runs the kernel tests
# on CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH="torch==2.13.0"
pip_install() { python -m pip install -q --disable-pip-version-check "$@"; }
# A CPU build of $TORCH in pip's find-links folders: pip takes it (2.13.0+cpu sorts above
# 2.13.0), and its dependencies from the package index, where PyTorch's own index is out of reach.
local_cpu_torch() {
  local dir
  for dir in ${PIP_FIND_LINKS:-}; do
    compgen -G "$dir/torch-${TORCH#torch==}+cpu-*.whl" >/dev/null && return 0
  done
  return 1
}

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  pip_install -e ".[test]"
else
  pip_install --no-index "$TORCH" 2>/dev/null \
    || { local_cpu_torch && pip_install "$TORCH"; } \
    || pip_install "$TORCH" --index-url https://download.pytorch.org/whl/cpu
  pip_install "triton==3.6.0"
  pip_install -e ".[test]"
fi
