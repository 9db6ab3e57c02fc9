#!/usr/bin/env bash
# Packs what the GPU checks need onto a machine that has a GPU but none of
# our build dependencies (no gRPC, Abseil, UCX, spdlog): the CUDA-enabled
# test and bench binaries from build/, every shared library they load apart
# from glibc's and the C++ runtime, Debian's UCX modules, and, when given a
# libucx-cu13 wheel, UCX built with CUDA (for a ring in device memory).
#
#   [PF_BUILD_DIR=build] tests/gpu/make_device_bundle.sh OUT_DIR [libucx_cu13-*.whl]
#
# On the GPU machine: OUT_DIR/run.sh (tests/gpu/run_gpu_checks.sh) runs the
# checks and benchmarks.
set -euo pipefail
out=${1:?usage: make_device_bundle.sh OUT_DIR [libucx-cu13 wheel]}
wheel=${2:-}
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${PF_BUILD_DIR:-$root/build}  # PF_BUILD_DIR: another build folder
rm -rf "$out" && mkdir -p "$out/bin" "$out/lib" "$out/ucx-modules"
bins=("$build/tests/transport_gpu_test" "$build/tests/transport_peer"
      "$build/bench/transport_bench" "$build/bench/e2e_bench" "$build/bench/pack_bench"
      "$build/bench/next_latency"
      "$build/server/packfeedd"
      "$build/server/packfeedctl")
for b in "${bins[@]}"; do
  [[ -x $b ]] || { echo "missing $b: build first (cmake --build build)" >&2; exit 1; }
  strip -o "$out/bin/$(basename "$b")" "$b"
done
# Every library the binaries load except the C library and the C++ runtime,
# which the target's own (newer) ones serve.
ldd "${bins[@]}" | awk '/=> \//{print $3}' | sort -u |
  grep -Ev '/(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so' |
  while read -r lib; do cp -L "$lib" "$out/lib/"; done
cp -L /usr/lib/x86_64-linux-gnu/ucx/lib*.so.0 "$out/ucx-modules/"
if [[ -n $wheel ]]; then
  mkdir -p "$out/ucx-cuda"
  unzip -q -o "$wheel" 'libucx/lib/lib*.so.0' 'libucx/lib/ucx/lib*.so.0' 'libucx_cu13.libs/*' \
    -d "$out/ucx-cuda/unpacked"
  mv "$out/ucx-cuda/unpacked/libucx/lib/"*.so.0 "$out/ucx-cuda/"
  mkdir -p "$out/ucx-cuda/modules"
  mv "$out/ucx-cuda/unpacked/libucx/lib/ucx/"*.so.0 "$out/ucx-cuda/modules/"
  mv "$out/ucx-cuda/unpacked/libucx_cu13.libs/"* "$out/ucx-cuda/"
  rm -rf "$out/ucx-cuda/unpacked" "$out/ucx-cuda/modules/libucx_perftest"*
fi
cp "$root/tests/gpu/run_gpu_checks.sh" "$out/run.sh"
du -sh "$out"
