#!/usr/bin/env bash
# `pip install .` works: builds the package from the source tree into a fresh
# virtual environment (seeing Debian's torch through --system-site-packages)
# and runs the client test with that install, not the build tree's package.
# usage: pip_install_test.sh SOURCE_ROOT BIN_DIR WORK_DIR
set -euo pipefail
source_root=$1 bin_dir=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
/usr/bin/python3 -m venv --system-site-packages "$work/venv"
"$work/venv/bin/pip" install -q "scikit-build-core>=0.8"
# No build isolation: pybind11 and the libraries are Debian's.
"$work/venv/bin/pip" install -q --no-build-isolation "$source_root"
cd "$work"  # away from the source tree, so only the install is importable
"$work/venv/bin/python" -c 'import packfeed, sys; sys.exit(0 if "site-packages" in packfeed.__file__ else 1)'
PYTHONPATH="$source_root/tests/python:$source_root/tests/integration" \
  PF_BIN_DIR="$bin_dir" PF_SOURCE_ROOT="$source_root" \
  "$work/venv/bin/python" "$source_root/tests/python/client_test.py"
