#!/usr/bin/env bash
# Run inside a bundle made by tests/gpu/make_python_bundle.sh: builds the
# packfeed Python package from OUT/src with PYTHON against the torch that
# PYTHON already has, using only what the bundle carries (no registry), and
# installs it. PYTHON in a virtual environment gets the package there; any
# other PYTHON gets OUT/venv-X.Y, which sees PYTHON's own packages.
# Then `source OUT/env.sh` before using it: the libraries it loads are carried.
#
#   OUT/build_python.sh PYTHON [--no-deps]
#     --no-deps   install without torch (a build check on a Python that has none)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
python=${1:?usage: build_python.sh PYTHON [--no-deps]}
deps_flag=${2:-}
# shellcheck source=/dev/null
source "$here/env.sh"

if [[ $("$python" -c 'import sys; print(sys.prefix != sys.base_prefix)') == True ]]; then
  env_python=$python
else
  venv=$here/venv-$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  rm -rf "$venv" && "$python" -m venv --system-site-packages "$venv"
  env_python=$venv/bin/python
fi
pip=("$env_python" -m pip install -q --no-index --find-links "$here/wheels")
"${pip[@]}" "scikit-build-core>=0.8" "pybind11>=2.10" "cmake>=3.25" ninja
"$env_python" -c 'import numpy' 2>/dev/null || "${pip[@]}" numpy
"${pip[@]}" --no-build-isolation ${deps_flag:+"$deps_flag"} "$here/src"
echo "built and installed into $("$env_python" -c 'import sys; print(sys.prefix)')"
