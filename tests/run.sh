#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what is missing,
# builds, and runs every test.
#   1. build/       gcc, RelWithDebInfo, -Werror: every ctest test, then
#                   deploy/quickstart.sh on it, as the README has a user run it
#   2. build-asan/  clang, Debug (-O1) + ASan/UBSan, -Werror, -Wthread-safety as
#                   an error (every ABSL_GUARDED_BY is checked), libFuzzer:
#                   the unit tests and the asan-labelled process tests
#                   again, then each fuzz target for a bounded time
# The clang build runs beside 1 at the lowest priority. It takes the CPU
# that the gcc build and the tests leave idle (waits on protoc, on a link,
# on the network, tests that sleep), and they barely notice it.
# usage: tests/run.sh [--fast]
#   --fast   the fast lane: build/ and its unit tests only (a few minutes)
# PF_FUZZ_SECONDS (default 30) sets the fuzzing time per target; PF_JOBS
# (default: the number of cores) how many tests ctest runs at once.
set -euo pipefail
cd "$(dirname "$0")/.."
fast=false
[[ "${1:-}" == "--fast" ]] && fast=true
jobs=${PF_JOBS:-$(nproc)}
start=$SECONDS
phase_start=$SECONDS
phases=()
clang_build=

# Each phase prints its name on start and its time when the next begins.
phase() {
  if ((${#phases[@]} > 0)); then
    phases[-1]="${phases[-1]} $((SECONDS - phase_start))"
  fi
  phase_start=$SECONDS
  [[ $# -gt 0 ]] || return 0
  phases+=("$1")
  echo
  echo "=== $1 (at ${SECONDS}s)"
}
summary() {
  [[ -z $clang_build ]] || kill -- "-$clang_build" 2>/dev/null || true
  phase
  echo
  echo "=== phase times"
  for p in "${phases[@]}"; do printf '  %-52s %5ss\n' "${p% *}" "${p##* }"; done
  printf '  %-52s %5ss\n' total $((SECONDS - start))
}
trap summary EXIT

phase "install dependencies"
deploy/install_deps.sh

# Debug information as line tables only (-g1): backtraces and sanitizer
# reports keep file and line, and the builds take about a sixth less time.
phase "build (RelWithDebInfo, -Werror)"
# Test sources one optimisation level below the libraries, here and in
# build-asan/ (PF_TEST_COMPILE_OPTIONS, tests/CMakeLists.txt says why).
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPF_WERROR=ON \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" -DPF_TEST_COMPILE_OPTIONS=-O1 >/dev/null
if ! $fast; then
  # build-asan/ was a gcc build before the sanitizer and fuzzing builds merged.
  if [[ -f build-asan/CMakeCache.txt ]] && ! grep -q '^CMAKE_CXX_COMPILER:.*clang' build-asan/CMakeCache.txt; then
    rm -rf build-asan
  fi
  # -O1, as the sanitizers' own documentation advises: against -O0 the
  # build takes about 40 % more CPU, and the tests run 5 to 8 times faster
  # (a scheduler_test shard 84 s -> 16 s, dataset_test 95 s -> 12 s).
  CC=clang CXX=clang++ cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DPF_FUZZ=ON \
    -DPF_WERROR=ON -DPF_BUILD_BENCH=OFF -DCMAKE_CXX_FLAGS_DEBUG="-g1 -O1" \
    -DPF_TEST_COMPILE_OPTIONS=-O0 >/dev/null
  # Only what the ASan and fuzzing phases run (pf_sanitized_suite,
  # CMakeLists.txt); in a session of its own, which an exit stops. A new
  # session is a new scheduler autogroup, and the kernel shares the CPU
  # equally between autogroups whatever the niceness of their processes:
  # the autogroup's own niceness is what makes it yield. Where the kernel
  # has no autogroups the write fails, and nice alone does it.
  clang_start=$(date +%s)
  setsid -w bash -c '{ echo 19 >/proc/self/autogroup; } 2>/dev/null
    exec nice -n 19 cmake --build build-asan --target pf_sanitized_suite' \
    >build-asan/build.log 2>&1 &
  clang_build=$!
fi
cmake --build build

if $fast; then
  phase "unit tests (fast lane)"
  ctest --test-dir build -L unit -j "$jobs" --output-on-failure
  exit 0
fi

phase "all tests (the clang build beside them)"
ctest --test-dir build -j "$jobs" --output-on-failure | tee build/ctest-all.log
# The slowest tests, for whoever next shortens the suite.
echo "=== slowest tests (seconds)"
awk '/Test +#[0-9]+:/ { for (i = NF; i > 0; --i) if ($i == "sec") { print $(i - 1), $4; break } }' \
  build/ctest-all.log | sort -rn | head -n 15

# The README's first command, as a user runs it (its build is the one above):
# a daemon, eight ranks and a Python training loop; it fails on a rank that
# fails or a ledger with a duplicate or a gap.
phase "quickstart (deploy/quickstart.sh)"
quickstart=$(mktemp -d)
PACKFEED_QUICKSTART_DIR=$quickstart deploy/quickstart.sh >"$quickstart/log" 2>&1 ||
  { cat "$quickstart/log"; exit 1; }
tail -n 3 "$quickstart/log"

phase "build (clang: ASan/UBSan, thread safety, libFuzzer): the rest"
if ! wait "$clang_build"; then
  clang_build=
  tail -n 150 build-asan/build.log
  echo "the clang build failed (build-asan/build.log)"
  exit 1
fi
clang_build=
# Its log's last write is when it finished.
echo "the clang build finished $(($(stat -c %Y build-asan/build.log) - clang_start)) s after its start"

phase "unit and transport tests under ASan/UBSan"
# Not the style and layering checks: they read sources, which no sanitizer
# changes.
ctest --test-dir build-asan -L 'unit|asan' -LE 'style|layering' -j "$jobs" --output-on-failure

phase "fuzzing (${PF_FUZZ_SECONDS:-30}s per target)"
tests/fuzz/run_fuzzers.sh build-asan "${PF_FUZZ_SECONDS:-30}"
