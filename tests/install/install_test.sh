#!/usr/bin/env bash
# `cmake --install` gives what the systemd unit and a C++ trainer expect:
# bin/packfeedd and bin/packfeedctl (which run), and a packfeedConfig.cmake
# through which a separate project finds, builds against and links
# packfeed::client. The consumer is configured and built in a private mount
# namespace where the headers and CMake packages of UCX, gRPC, protobuf,
# spdlog and fmt are covered by empty directories: the installed API needs
# Abseil only. The transport's headers must not be installed at all.
# usage: install_test.sh BUILD_DIR SOURCE_ROOT WORK_DIR
set -euo pipefail
build=$1 source_root=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
cmake --install "$build" --prefix "$work/prefix" >/dev/null
for tool in packfeedd packfeedctl; do
  [[ -x "$work/prefix/bin/$tool" ]] || { echo "missing bin/$tool"; exit 1; }
  "$work/prefix/bin/$tool" --version
done
leaked=$(find "$work/prefix/include" -path '*packfeed/transport*' -o -name '*.pb.h' | head -3)
[[ -z $leaked ]] || { echo "internal headers installed: $leaked"; exit 1; }

hidden=(/usr/include/ucp /usr/include/uct /usr/include/ucs /usr/include/ucm
        /usr/include/grpc /usr/include/grpc++ /usr/include/grpcpp
        /usr/include/google/protobuf /usr/include/spdlog /usr/include/fmt
        /usr/lib/x86_64-linux-gnu/cmake/grpc /usr/lib/x86_64-linux-gnu/cmake/ucx
        /usr/lib/x86_64-linux-gnu/cmake/spdlog /usr/lib/x86_64-linux-gnu/cmake/fmt)
build_consumer() {
  for dir in "${hidden[@]}"; do
    if [[ -d $dir ]]; then mount -t tmpfs -o ro,size=1k none "$dir"; fi
  done
  [[ ! -e /usr/include/grpcpp/grpcpp.h && ! -e /usr/include/ucp/api/ucp.h ]] ||
    { echo "could not hide the UCX and gRPC headers"; exit 1; }
  cmake -S "$source_root/tests/install/consumer" -B "$work/consumer" -G Ninja \
    -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
  cmake --build "$work/consumer" >/dev/null
}
# Root (CI) unshares the mount namespace directly; others map themselves to
# root in a user namespace first.
namespace=(unshare --mount --propagation private)
[[ $(id -u) == 0 ]] || namespace=(unshare --map-root-user --mount --propagation private)
"${namespace[@]}" bash -c "set -euo pipefail; $(declare -p hidden source_root work)
  $(declare -f build_consumer); build_consumer"
"$work/consumer/consumer"
echo "install: bin/, headers and packfeedConfig.cmake usable by another project," \
  "built with no UCX, gRPC, protobuf or spdlog headers in reach"
