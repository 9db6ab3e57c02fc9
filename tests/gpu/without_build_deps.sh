#!/usr/bin/env bash
# Runs CMD as if this machine had none of packfeed's build dependencies, the
# way the lent GPU machine is: in a private mount namespace, Debian's headers,
# CMake configs, pkg-config files and libraries of gRPC, protobuf, Abseil, UCX,
# spdlog, fmt, xxhash, CLI11, nlohmann-json, dlpack, OpenSSL's and zlib's
# headers, c-ares, re2, and the cmake, ninja and pkg-config programs are
# covered (directories by an empty tmpfs, files by a line no tool accepts),
# so a build or a program that still reached one fails. OpenSSL's and zlib's
# libraries stay: every machine has them. Needs root (CI is).
#
#   tests/gpu/without_build_deps.sh CMD [ARG ...]
set -euo pipefail
if [[ ${PF_BUILD_DEPS_HIDDEN:-} != 1 ]]; then
  exec env PF_BUILD_DEPS_HIDDEN=1 unshare --mount --propagation private "$0" "$@"
fi
packages=(libabsl-dev libspdlog-dev libfmt-dev libprotobuf-dev protobuf-compiler
          libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libucx-dev libxxhash-dev
          libcli11-dev nlohmann-json3-dev libdlpack-dev libssl-dev zlib1g-dev
          libc-ares-dev libre2-dev pkgconf pybind11-dev
          libgrpc++1.51 libgrpc29 libprotobuf32 libprotoc32 libabsl20220623 libucx0
          libspdlog1.10 libfmt9 libxxhash0 libre2-9 libc-ares2 libpkgconf3
          cmake ninja-build)
# A covered file reads as this line, which a compiler including it, a linker
# reading it and a loader mapping it all refuse. (An empty file, or one of
# `#` lines, passes as an empty linker script: -lre2 would link.)
blocker=$(mktemp)
echo "hidden by tests/gpu/without_build_deps.sh (" > "$blocker"
# Under these parents a package owns whole directories (/usr/include/absl,
# .../cmake/grpc): they are covered whole; any other file (a library, a UCX
# module, a top-level header, a pkg-config file) on its own.
parents=(/usr/include/x86_64-linux-gnu /usr/include /usr/lib/x86_64-linux-gnu/cmake
         /usr/share/cmake)
cover_of() {
  local f=$1 p rest
  for p in "${parents[@]}"; do
    [[ $f == "$p"/* ]] || continue
    rest=${f#"$p"/}
    if [[ $rest == */* ]]; then echo "$p/${rest%%/*}/"; return; fi
    break
  done
  if [[ -e $f ]]; then readlink -f "$f"; fi
}
# What the -dev packages' symlinks (libssl.so) lead to in those stays.
kept=$(dpkg -L libssl3 zlib1g | xargs -r readlink -f | sort -u)
dpkg -L "${packages[@]}" | grep -Ev '^/usr/share/(doc|man|lintian|bug)/' |
  while read -r f; do [[ -d $f && ! -L $f ]] || cover_of "$f"; done | sort -u |
  comm -23 - <(echo "$kept") |
  while read -r path; do
    if [[ $path == */ ]]; then
      mount -t tmpfs -o ro,size=4k none "${path%/}"
    elif [[ -f $path ]]; then
      mount --bind "$blocker" "$path"
    fi
  done
rc=0
"$@" || rc=$?
rm -f "$blocker"  # the mounts go with this namespace; the file would stay
exit $rc
