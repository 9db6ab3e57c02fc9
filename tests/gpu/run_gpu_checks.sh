#!/usr/bin/env bash
# The GPU checks and benchmarks (issue 16), run on a GPU machine that has none
# of our build dependencies, from bundles made here:
#   tests/gpu/make_device_bundle.sh DEV [libucx_cu13-*.whl]   (copies this file to DEV/run.sh)
#   tests/gpu/make_python_bundle.sh PY 3.12                    (optional)
# On the GPU machine:
#   DEV/run.sh [PY PYTHON]
# runs, in this order:
#   tests   transport_gpu_test with Debian's UCX 1.13 and, when the bundle
#           has it, UCX 1.22 with CUDA;
#   python  given PY and a PYTHON with torch: builds the Python package there
#           (PY/build_python.sh) and runs, from PY's sources against DEV's
#           daemon, gpu_varlen_test, gpu_lifetime_test, client_test's
#           held-tensor test and, with Megatron-Core 0.19.2 installed from
#           PY's wheels, gpu_megatron_loss_test; then python_next_bench.py
#           and gpu_interference_bench.py (matrix products beside the
#           copies) on the staged ring and the ring the daemon writes;
#   bench   pack_bench; transport_bench into a device ring the daemon writes
#           for a receiver of another uid in its own PID namespace; then
#           transport_bench and e2e_bench on the staged ring, then the host
#           ring (e2e_bench also on 1 000 documents with and without a 48x8
#           int16 side field per token).
# Every step runs and says how long it took; the exit status says whether
# any failed. On a machine with a device, a step whose tests all skipped
# (exit 77) failed. PF_PARTS (default "tests python bench") names the parts to run;
# PF_RINGS (default: host, and staged and daemon with a device) the rings the
# benchmarks measure;
# PF_STEP_TIMEOUT (seconds, default 300) bounds each step; PF_QUICK=1 gives
# the benchmarks --quick (a smoke run).
set -uo pipefail
dev=$(cd "$(dirname "$0")" && pwd)
py=${1:-}
python=${2:-python3}
failed=0
device=false  # set below: whether nvidia-smi sees a GPU
# A step that hangs is killed after PF_STEP_TIMEOUT seconds (default 300)
# and counts as failed: the others still run.
step() {
  echo "== $*"
  local start=$SECONDS rc=0
  timeout --kill-after=10 "${PF_STEP_TIMEOUT:-300}" "$@" || rc=$?
  case $rc in
    0) ;;
    # Every test of the step skipped: right without a device, a failure
    # with one (a skipped device test is never a pass).
    77) if $device; then
          echo "== FAILED (every test skipped on a machine with a device): $*"; failed=1
        else
          echo "== SKIPPED (no device): $*"
        fi ;;
    124 | 137) echo "== TIMED OUT: $*"; failed=1 ;;
    *) echo "== FAILED ($rc): $*"; failed=1 ;;
  esac
  echo "== $((SECONDS - start)) s"
}
debian_ucx=(env LD_LIBRARY_PATH="$dev/lib" UCX_MODULE_DIR="$dev/ucx-modules")
cuda_ucx=(env LD_LIBRARY_PATH="$dev/ucx-cuda:$dev/lib" UCX_MODULE_DIR="$dev/ucx-cuda/modules")
export PF_TRANSPORT_PEER=$dev/bin/transport_peer
quick=()
[[ -n ${PF_QUICK:-} ]] && quick=(--quick)
# PF_PARTS picks what runs (default all): tests, python, bench.
wanted() { [[ " ${PF_PARTS:-tests python bench} " == *" $1 "* ]]; }

rings=(host)
if nvidia-smi -L; then
  device=true
  rings+=(staged daemon)
else
  echo "== no GPU here: the tests skip, the benchmarks run on the host ring only"
fi
read -r -a rings <<<"${PF_RINGS:-${rings[*]}}"
if wanted tests; then
  step "${debian_ucx[@]}" "$dev/bin/transport_gpu_test"
  if [[ -d $dev/ucx-cuda ]]; then
    step "${cuda_ucx[@]}" "$dev/bin/transport_gpu_test"
  fi
fi

if [[ -n $py ]] && wanted python; then
  step "$py/build_python.sh" "$python"
  # shellcheck source=/dev/null
  source "$py/env.sh"
  venv_python=$python
  if [[ $("$python" -c 'import sys; print(sys.prefix != sys.base_prefix)') != True ]]; then
    venv_python=$py/venv-$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')/bin/python
  fi
  # PY's source file $1 (then its arguments) against DEV's daemon and libraries.
  python_run() {
    step env LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$dev/lib" UCX_MODULE_DIR="$dev/ucx-modules" \
      PYTHONFAULTHANDLER=1 \
      PYTHONPATH="$py/src/tests/python:$py/src/tests/integration" PF_BIN_DIR="$dev/bin" \
      PF_SOURCE_ROOT="$py/src" "$venv_python" "$py/src/$1" "${@:2}"
  }
  python_test() { python_run "tests/python/$1" "${@:2}"; }
  python_test gpu_varlen_test.py
  python_test gpu_lifetime_test.py
  # The same against device rings the daemon copies into.
  PF_DEVICE_RING=daemon python_test gpu_varlen_test.py
  PF_DEVICE_RING=daemon python_test gpu_lifetime_test.py
  python_test client_test.py \
    ClientTest.test_held_tensors_never_change_and_holding_more_than_the_ring_copies
  # A tiny GPTModel trained on Megatron's data path and on packfeed's: the
  # same losses, bit for bit (Megatron-Core 0.19.2 from the bundle's wheels).
  step "$venv_python" -m pip install -q --no-index --find-links "$py/wheels" --no-deps \
    megatron-core==0.19.2 "packaging>=24.2"
  python_test gpu_megatron_loss_test.py
  # Python's next() beside the C++ client's Next() in one run, on a machine
  # faster than the 2-core VM, where eight tensors alone cost 15-19 us.
  python_run bench/python_next_bench.py "$dev/bin" "$dev/bin" --rounds 6
  # A trainer's matrix products beside the copies into its GPU memory.
  for ring in staged daemon; do
    python_run bench/gpu_interference_bench.py "$dev/bin" --ring "$ring"
  done
fi

if wanted bench; then
  # A large microbatch written by 1, 2, 4 and 8 threads (packing_threads):
  # what one thread leaves of the host's memory bandwidth.
  step "${debian_ucx[@]}" "$dev/bin/pack_bench" --threads 1,2,4,8
  # Device rings the daemon writes for a trainer of another uid in a PID
  # namespace of its own (a container): the descriptor passing must need no
  # ptrace rights. Notifications over TCP: shared memory across uids is not.
  if [[ " ${rings[*]} " == *" daemon "* ]]; then
    step "${debian_ucx[@]}" "$dev/bin/transport_bench" --ring daemon --tls tcp,self \
      --receiver-uid 65534 --receiver-pid-namespace --quick
  fi
  # The staged ring first: its figures are the ones only a GPU machine gives.
  for ((i = ${#rings[@]} - 1; i >= 0; --i)); do
    e2e=("${debian_ucx[@]}" "$dev/bin/e2e_bench" --daemon "$dev/bin/packfeedd" --ring "${rings[i]}")
    step "${debian_ucx[@]}" "$dev/bin/transport_bench" --ring "${rings[i]}" "${quick[@]}"
    step "${e2e[@]}" "${quick[@]}"
    # With and without the side field on the same small dataset (its side
    # rows are 96x the tokens' bytes: the default datasets take minutes).
    for experts in "" 48x8; do
      step "${e2e[@]}" --docs 1000 ${experts:+--experts "$experts"} "${quick[@]}"
    done
  done
fi
echo "== $([[ $failed == 0 ]] && echo "all steps passed" || echo "some steps FAILED")"
exit $failed
