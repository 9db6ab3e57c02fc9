#!/usr/bin/env bash
# The Python package's hygiene: mypy --strict and ruff pass on it (both from
# PyPI, pinned, in a virtual environment kept in the build folder), and it
# imports without torch (a driver that only puts needs none: torch is the
# optional extra packfeed[torch]) while Client then says what is missing;
# pyflakes passes on the tests, benchmarks and deploy scripts.
# usage: lint_test.sh SOURCE_ROOT PYTHON_PACKAGE_DIR WORK_DIR
set -euo pipefail
source_root=$1 package_dir=$2 work=$3
venv=$work/venv
if [[ ! -x $venv/bin/ruff || ! -x $venv/bin/mypy ]]; then
  rm -rf "$venv"
  /usr/bin/python3 -m venv --system-site-packages "$venv"
  "$venv/bin/pip" install -q "mypy==1.13.0" "ruff==0.8.4"
fi
cd "$source_root/client/python"
"$venv/bin/mypy" --strict --config-file "$source_root/pyproject.toml" --cache-dir "$work/mypy" \
  packfeed
"$venv/bin/ruff" check --config "$source_root/pyproject.toml" --no-cache packfeed
# The tests' and benchmarks' own Python: pyflakes' errors (unused imports,
# undefined names), which nothing else would catch before a test runs them.
"$venv/bin/ruff" check --isolated --no-cache --select F,E9 "$source_root/tests" \
  "$source_root/bench" "$source_root/deploy"
# torch made unimportable: the package imports, Producer is there, Client
# refuses by name. From the work folder: the source tree's packfeed has no
# native module.
cd "$work"
PYTHONPATH=$package_dir /usr/bin/python3 - <<'PY'
import sys
sys.modules["torch"] = None  # `import torch` now raises ImportError
import packfeed
assert packfeed.Producer is not None
try:
    packfeed.Client("job", rank=0, socket_path="/nonexistent")
except ImportError as error:
    assert "install torch" in str(error), error
else:
    raise SystemExit("Client without torch did not raise ImportError")
print("imports without torch: Producer available, Client raises ImportError")
PY
