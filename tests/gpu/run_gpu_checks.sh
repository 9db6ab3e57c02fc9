#!/usr/bin/env bash
# The GPU checks and benchmarks (issue 16), run on a GPU machine that has none
# of our build dependencies, from bundles made here:
#   tests/gpu/make_device_bundle.sh DEV [libucx_cu13-*.whl]   (copies this file to DEV/run.sh)
#   tests/gpu/make_python_bundle.sh PY 3.12                    (optional)
# On the GPU machine:
#   DEV/run.sh [PY PYTHON]
# runs transport_gpu_test with Debian's UCX 1.13 and, when the bundle has it,
# UCX 1.22 with CUDA; transport_bench and e2e_bench on the host and staged
# rings; and, given PY and a PYTHON with torch, builds the Python package
# there (PY/build_python.sh) and runs tests/python/gpu_varlen_test.py from
# PY's sources against DEV's daemon. Every step runs; the exit status says
# whether any failed. PF_QUICK=1 gives the benchmarks --quick (a smoke run).
set -uo pipefail
dev=$(cd "$(dirname "$0")" && pwd)
py=${1:-}
python=${2:-python3}
failed=0
step() {
  echo "== $*"
  "$@" || { echo "== FAILED ($?): $*"; failed=1; }
}
debian_ucx() { env LD_LIBRARY_PATH="$dev/lib" UCX_MODULE_DIR="$dev/ucx-modules" "$@"; }
cuda_ucx() {
  env LD_LIBRARY_PATH="$dev/ucx-cuda:$dev/lib" UCX_MODULE_DIR="$dev/ucx-cuda/modules" "$@"
}
export PF_TRANSPORT_PEER=$dev/bin/transport_peer
quick=()
[[ -n ${PF_QUICK:-} ]] && quick=(--quick)

rings=(host)
if nvidia-smi -L; then
  rings+=(staged)
else
  echo "== no GPU here: the tests skip, the benchmarks run on the host ring only"
fi
step debian_ucx "$dev/bin/transport_gpu_test"
if [[ -d $dev/ucx-cuda ]]; then
  step cuda_ucx "$dev/bin/transport_gpu_test"
fi
for ring in "${rings[@]}"; do
  step debian_ucx "$dev/bin/transport_bench" --ring "$ring" "${quick[@]}"
  step debian_ucx "$dev/bin/e2e_bench" --daemon "$dev/bin/packfeedd" --ring "$ring" "${quick[@]}"
done

if [[ -n $py ]]; then
  step "$py/build_python.sh" "$python"
  # shellcheck source=/dev/null
  source "$py/env.sh"
  venv_python=$python
  if [[ $("$python" -c 'import sys; print(sys.prefix != sys.base_prefix)') != True ]]; then
    venv_python=$py/venv-$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')/bin/python
  fi
  step env LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$dev/lib" UCX_MODULE_DIR="$dev/ucx-modules" \
    PYTHONPATH="$py/src/tests/python:$py/src/tests/integration" PF_BIN_DIR="$dev/bin" \
    PF_SOURCE_ROOT="$py/src" "$venv_python" "$py/src/tests/python/gpu_varlen_test.py"
fi
echo "== $([[ $failed == 0 ]] && echo "all steps passed" || echo "some steps FAILED")"
exit $failed
