#!/usr/bin/env bash
# The one archive a GPU machine without our build dependencies needs for the
# GPU checks: the device bundle (make_device_bundle.sh; with UCX 1.22 when
# given a libucx-cu13 wheel) as dev/ and the Python bundle for Python 3.12
# (make_python_bundle.sh) as py/, less the CMake and NumPy wheels that a
# machine with torch has already, xz-compressed: about 32 MB with the wheel.
# Build first (cmake --build build, with the CUDA toolkit present).
#
#   tests/gpu/pack_for_gpu_machine.sh OUT.tar.xz [libucx_cu13-*.whl]
#
# There: mkdir -p /tmp/g && tar -C /tmp/g -xJf OUT.tar.xz &&
#        /tmp/g/dev/run.sh /tmp/g/py python3
set -euo pipefail
out=${1:?usage: pack_for_gpu_machine.sh OUT.tar.xz [libucx-cu13 wheel]}
wheel=${2:-}
here=$(cd "$(dirname "$0")" && pwd)
out=$(cd "$(dirname "$out")" && pwd)/$(basename "$out")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$here/make_device_bundle.sh" "$work/dev" ${wheel:+"$wheel"} >/dev/null
"$here/make_python_bundle.sh" "$work/py" 3.12 >/dev/null
rm -f "$work"/py/wheels/cmake-*.whl "$work"/py/wheels/numpy-*.whl
tar -C "$work" -cf - dev py | xz -T0 -5 >"$out"
du -h "$out"
