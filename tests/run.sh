#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what is missing,
# builds, and runs every test.
#   1. build/       RelWithDebInfo, -Werror: every ctest test
#   2. build-asan/  Debug + ASan/UBSan, -Werror: the unit tests and the
#                   transport's process tests again
#   3. build-fuzz/  clang + libFuzzer: each fuzz target for a bounded time
# PF_FUZZ_SECONDS (default 30) sets the fuzzing time per target.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS

deploy/install_deps.sh

section() { echo; echo "=== $* ($((SECONDS - start))s)"; }

section "build (RelWithDebInfo, -Werror)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPF_WERROR=ON >/dev/null
cmake --build build

section "build (Debug + ASan/UBSan)"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DPF_SANITIZE=ON \
  -DPF_WERROR=ON -DPF_BUILD_BENCH=OFF >/dev/null
cmake --build build-asan

section "build (libFuzzer)"
CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DPF_FUZZ=ON >/dev/null
cmake --build build-fuzz

section "unit and transport tests under ASan/UBSan"
ctest --test-dir build-asan -L 'unit|asan' --output-on-failure

section "fuzzing (${PF_FUZZ_SECONDS:-30}s per target)"
tests/fuzz/run_fuzzers.sh build-fuzz "${PF_FUZZ_SECONDS:-30}"

section "all tests"
ctest --test-dir build --output-on-failure
echo "tests/run.sh: done in $((SECONDS - start))s"
