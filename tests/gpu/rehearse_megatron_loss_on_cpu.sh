#!/usr/bin/env bash
# Rehearses gpu_megatron_loss_test.py on a machine without a GPU, before a
# lent GPU machine's few minutes are spent on it: Megatron-Core 0.19.2 needs
# torch >= 2.6 and Python >= 3.12, which Debian 12 does not have, so this
# takes both from PyPI (torch's wheel with its CUDA libraries: ~3 GB) into a
# virtual environment, builds the Python package there the way the GPU
# machine does (make_python_bundle.sh, build_python.sh) and runs the test on
# the CPU (PF_MEGATRON_LOSS_DEVICE=cpu). Not part of the suite: the download
# is too large for CI.
#
#   tests/gpu/rehearse_megatron_loss_on_cpu.sh PYTHON3.12 WORK_DIR BIN_DIR
#     PYTHON3.12  a CPython 3.12 or later (here: pyenv's)
#     WORK_DIR    where the virtual environment and the bundle go (reused)
#     BIN_DIR     the build's server/ folder (packfeedd)
set -euo pipefail
python=${1:?usage: rehearse_megatron_loss_on_cpu.sh PYTHON3.12 WORK_DIR BIN_DIR}
work=${2:?usage: rehearse_megatron_loss_on_cpu.sh PYTHON3.12 WORK_DIR BIN_DIR}
bin_dir=$(cd "${3:?usage: rehearse_megatron_loss_on_cpu.sh PYTHON3.12 WORK_DIR BIN_DIR}" && pwd)
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$work" && work=$(cd "$work" && pwd)
if [[ ! -x $work/venv/bin/python ]]; then
  "$python" -m venv "$work/venv"
  "$work/venv/bin/pip" install -q torch numpy megatron-core==0.19.2
fi
"$root/tests/gpu/make_python_bundle.sh" "$work/bundle" \
  "$("$work/venv/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
"$work/bundle/build_python.sh" "$work/venv/bin/python"
# shellcheck source=/dev/null
source "$work/bundle/env.sh"
cd "$work"
PF_MEGATRON_LOSS_DEVICE=cpu PF_BIN_DIR="$bin_dir" PF_SOURCE_ROOT="$root" \
  PYTHONPATH="$root/tests/python:$root/tests/integration" \
  "$work/venv/bin/python" "$root/tests/python/gpu_megatron_loss_test.py"
