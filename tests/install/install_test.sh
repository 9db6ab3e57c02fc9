#!/usr/bin/env bash
# `cmake --install` gives what the systemd unit and a C++ trainer expect:
# bin/packfeedd and bin/packfeedctl (which run), and a packfeedConfig.cmake
# through which a separate project finds, builds against and links
# packfeed::client.
# usage: install_test.sh BUILD_DIR SOURCE_ROOT WORK_DIR
set -euo pipefail
build=$1 source_root=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
cmake --install "$build" --prefix "$work/prefix" >/dev/null
for tool in packfeedd packfeedctl; do
  [[ -x "$work/prefix/bin/$tool" ]] || { echo "missing bin/$tool"; exit 1; }
  "$work/prefix/bin/$tool" --version
done
cmake -S "$source_root/tests/install/consumer" -B "$work/consumer" -G Ninja \
  -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/consumer" >/dev/null
"$work/consumer/consumer"
echo "install: bin/, headers and packfeedConfig.cmake usable by another project"
