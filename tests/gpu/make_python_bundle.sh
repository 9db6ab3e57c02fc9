#!/usr/bin/env bash
# Packs what building the Python package from source needs onto a machine
# that has a compiler and a CPython (with the user's torch) but none of our
# build dependencies and no registry, such as the lent GPU machine:
#   OUT/src/         the working tree's tracked files
#   OUT/sysroot/usr  Debian's headers, CMake configs, libraries and code
#                    generators of gRPC, protobuf, Abseil, UCX, spdlog, fmt,
#                    xxhash, CLI11, nlohmann-json and dlpack, with every
#                    library they load apart from glibc's and the C++ runtime
#   OUT/wheels/      scikit-build-core, pybind11, CMake, Ninja and NumPy for
#                    each Python version asked for, and Megatron-Core 0.19.2
#                    with packaging for each from 3.12 on
#   OUT/build_python.sh  (tests/gpu/build_python.sh) builds and installs it
#   OUT/env.sh       to source before running what it installed
#
#   tests/gpu/make_python_bundle.sh OUT [PYTHON_VERSION ...]   (default 3.12)
set -euo pipefail
out=${1:?usage: make_python_bundle.sh OUT [PYTHON_VERSION ...]}
shift
versions=("${@:-3.12}")
root=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$out" && mkdir -p "$out/src" "$out/sysroot" "$out/wheels"
out=$(cd "$out" && pwd)

git -C "$root" ls-files -z --cached --others --exclude-standard | (cd "$root" && tar --null -T - -cf -) | tar -C "$out/src" -xf -
cp "$root/tests/gpu/build_python.sh" "$out/"
cat > "$out/env.sh" <<'EOF'
# `source OUT/env.sh`: the carried libraries, UCX modules, code generators and
# CMake packages come first.
_pf_usr=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/sysroot/usr
export LD_LIBRARY_PATH=$_pf_usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export UCX_MODULE_DIR=$_pf_usr/lib/x86_64-linux-gnu/ucx
export PATH=$_pf_usr/bin:$PATH
export CMAKE_PREFIX_PATH=$_pf_usr
export PKG_CONFIG_PATH=$_pf_usr/lib/x86_64-linux-gnu/pkgconfig
unset _pf_usr
EOF

# The -dev packages the Python-only build finds (CMakeLists.txt, PF_PYTHON_ONLY),
# and what their CMake configs find in turn (gRPC: OpenSSL, zlib, c-ares, re2).
dev_packages=(libabsl-dev libspdlog-dev libfmt-dev libprotobuf-dev protobuf-compiler
              libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libucx-dev libxxhash-dev
              libcli11-dev nlohmann-json3-dev libdlpack-dev libssl-dev zlib1g-dev
              libc-ares-dev libre2-dev pkgconf)
# Static libraries stay behind: the package links the shared ones.
dpkg -L "${dev_packages[@]}" | grep -Ev '^/usr/share/(doc|man|lintian)/|\.a$' |
  while read -r f; do [[ -d $f && ! -L $f ]] || echo "$f"; done |
  (cd / && xargs cp -a --parents -t "$out/sysroot")

# Symlinks into runtime packages (libgrpc++.so -> libgrpc++.so.1.51): their targets.
while read -r link; do
  target=$(readlink -f "${link#"$out/sysroot"}")
  cp -a --parents "$target" "$out/sysroot"
done < <(find "$out/sysroot" -xtype l)
libdir=$out/sysroot/usr/lib/x86_64-linux-gnu
# The soname links (libucp.so.0) the loader looks for; a library named by its
# soname (libabsl_*.so.20220623) is already what it looks for.
ldconfig -n "$libdir" 2> >(grep -v "is not a symbolic link" >&2)
# Every library those load, but the ones every Linux machine has.
find "$out/sysroot" -type f \( -name '*.so*' -o -path '*/bin/*' \) -exec ldd {} + 2>/dev/null |
  awk '/=> \//{print $3}' | sort -u |
  grep -Ev '/(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so' |
  while read -r lib; do [[ -e $libdir/$(basename "$lib") ]] || cp -L "$lib" "$libdir/"; done

# Relocation: Debian's UCX config and pkg-config files name /usr outright.
sed -i 's|^set(prefix "/usr")|get_filename_component(prefix "${CMAKE_CURRENT_LIST_DIR}/../../../.." ABSOLUTE)|' \
  "$libdir/cmake/ucx/ucx-targets.cmake"
# Some (re2.pc) name their directories outright, without a prefix.
sed -i -E 's#^(prefix|exec_prefix|libdir|includedir)=/usr(/|$)#\1=${pcfiledir}/../../..\2#' \
  "$libdir"/pkgconfig/*.pc
if grep -E '^[a-z_]+=/usr' "$libdir"/pkgconfig/*.pc; then
  echo "a pkg-config file above still names /usr: relocate it" >&2
  exit 1
fi
# (CMake's own "installed through a symlink" check, _realOrig, may name it.)
if grep -rE '"/usr/(lib|include)' "$libdir/cmake" | grep -Ev '_realOrig|_IMPORT_PREFIX "/usr/lib'; then
  echo "a CMake config above still names /usr: relocate it" >&2
  exit 1
fi

for v in "${versions[@]}"; do
  pip download -q --only-binary=:all: --python-version "$v" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d "$out/wheels" \
    "scikit-build-core>=0.8" "pybind11>=2.10" "cmake>=3.25" ninja numpy \
    tomli exceptiongroup  # scikit-build-core's on Python < 3.11 (pip omits them here)
  # Megatron-Core 0.19.2 (Python >= 3.12) for gpu_megatron_loss_test.py; its
  # one dependency beyond torch and NumPy is packaging.
  if [[ $(printf '%s\n' 3.12 "$v" | sort -V | head -1) == 3.12 ]]; then
    pip download -q --only-binary=:all: --python-version "$v" --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d "$out/wheels" \
      --no-deps megatron-core==0.19.2 "packaging>=24.2" ||
      echo "no megatron-core 0.19.2 wheel for Python $v: gpu_megatron_loss_test cannot run there" >&2
  fi
done
du -sh "$out"
