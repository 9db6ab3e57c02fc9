#!/usr/bin/env bash
# The Python package builds from source on every CPython >= 3.10 this machine
# has besides Debian's (pyenv's), as on a machine with none of our build
# dependencies: tests/gpu/make_python_bundle.sh carries them, and each build
# runs where Debian's copies are hidden (tests/gpu/without_build_deps.sh).
# Each install then serves a real step through a real daemon
# (native_round_trip.py, without torch: those Pythons have none).
# usage: python_versions_test.sh SOURCE_ROOT BIN_DIR WORK_DIR
set -euo pipefail
source_root=$1 bin_dir=$2 work=$3
debian_minor=$(/usr/bin/python3 -c 'import sys; print(sys.version_info[1])')
pythons=() versions=()
for py in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.*/bin/python3; do
  [[ -x $py ]] || continue
  v=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  ((${v#3.} >= 10 && ${v#3.} != debian_minor)) || continue
  pythons+=("$py") versions+=("$v")
done
if ((${#pythons[@]} == 0)); then
  echo "SKIP: no CPython >= 3.10 besides Debian's on this machine (looked in pyenv's versions)"
  exit 77
fi
if ! unshare --mount true 2>/dev/null; then
  echo "SKIP: hiding the build dependencies needs a private mount namespace (root)"
  exit 77
fi
rm -rf "$work" && mkdir -p "$work"
"$source_root/tests/gpu/make_python_bundle.sh" "$work/bundle" "${versions[@]}"
hidden=("$source_root/tests/gpu/without_build_deps.sh")
cd "$work"  # away from the source tree, so only the installs are importable
# One CMake build directory for every version: what does not include Python
# (the client's C++ core, the generated protobuf code) compiles once, and each
# version rebuilds what does, its extension module.
export SKBUILD_BUILD_DIR=$work/build
for i in "${!pythons[@]}"; do
  echo "=== Python ${versions[$i]}"
  "${hidden[@]}" "$work/bundle/build_python.sh" "${pythons[$i]}" --no-deps
  "${hidden[@]}" env PYTHONPATH="$source_root/tests/python:$source_root/tests/integration" \
    PF_BIN_DIR="$bin_dir" PF_SOURCE_ROOT="$source_root" bash -c \
    "source '$work/bundle/env.sh' && '$work/bundle/venv-${versions[$i]}/bin/python' \
       '$source_root/tests/python/native_round_trip.py'"
done
