#!/usr/bin/env bash
# Installs what packfeed needs to build and test, from Debian's packages.
# Idempotent: asks dpkg first and touches apt only when something is missing,
# so a second run takes well under a second.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libucx-dev libspdlog-dev libabsl-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev nlohmann-json3-dev libxxhash-dev libmicrohttpd-dev openssl
  fuse3 libfuse3-dev
  clang libclang-rt-14-dev clang-format
  python3 python3-dev python3-venv python3-pip python3-torch pybind11-dev libdlpack-dev
  python3-scipy python3-matplotlib  # the MILP optimum (HiGHS) and plan --plot
  python3-pytest  # runs the Python tests (tests/pytest.ini)
)

# libsystemd-dev must match the installed libsystemd0 exactly, or apt would
# upgrade systemd itself to satisfy it: pinned (unpinned if that fails below).
systemd_version=$(dpkg-query -W -f='${Version}' libsystemd0 2>/dev/null || true)
packages+=("libsystemd-dev${systemd_version:+=$systemd_version}")
packages+=(systemd)     # systemd-analyze, for the unit file's test
packages+=(prometheus)  # a real Prometheus server scrapes packfeedd in the tests

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "${p%%=*}" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done

if ((${#missing[@]} == 0)); then
  echo "install_deps: all ${#packages[@]} packages present"
  exit 0
fi

echo "install_deps: installing ${missing[*]}"
sudo=""
if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
if ! $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"; then
  echo "install_deps: retrying without pinning libsystemd-dev to $systemd_version"
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]/libsystemd-dev=*/libsystemd-dev}"
fi
