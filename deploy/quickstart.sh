#!/usr/bin/env bash
# packfeed quick start, from a fresh machine: installs what is missing,
# builds, and runs the main job on an embedded default.
# Today's main job: generate a Megatron indexed dataset (lengths drawn like
# Megatron's mock SFT generator) and show what packfeed's reader sees in it.
# Later stages grow this into daemon + client ranks.
set -euo pipefail
cd "$(dirname "$0")/.."

deploy/install_deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build --target packfeedctl

work=${PACKFEED_QUICKSTART_DIR:-$(mktemp -d)}
ctl=build/server/packfeedctl
echo
echo "== generating a dataset in $work"
"$ctl" make-dataset --out "$work/demo" --count 2000 --dist lognormal \
  --min 128 --max 8192 --mean 1024 --sigma 1.5 --vocab 32000 --seed 1
echo
echo "== what the reader sees"
"$ctl" dataset-info "$work/demo"
echo
echo "== the same as JSON"
"$ctl" dataset-info "$work/demo" --json
