#!/usr/bin/env bash
# The device bundle is whole: made from this build, it runs the GPU checks'
# tests and benchmarks (--quick; without a GPU the tests skip and only the
# host ring is measured) where our build dependencies are hidden, as they
# are on the GPU machine. A library the binaries load but the bundle lacks,
# or a step of run_gpu_checks.sh that broke, fails it here rather than in
# the few minutes a GPU machine is lent.
# usage: bundle_smoke_test.sh BUILD_DIR WORK_DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$1 work=$2
if ! unshare --mount true 2>/dev/null; then
  echo "SKIP: hiding the build dependencies needs a private mount namespace (root)"
  exit 77
fi
rm -rf "$work" && mkdir -p "$work"
PF_BUILD_DIR=$build "$here/make_device_bundle.sh" "$work/dev"
cd "$work"
PF_QUICK=1 PF_PARTS="tests bench" "$here/without_build_deps.sh" "$work/dev/run.sh"
