#!/usr/bin/env bash
# packfeed quick start, from a fresh machine: installs what is missing,
# builds, and runs the main job on an embedded default.
# Today's main job: generate a Megatron indexed dataset (lengths drawn like
# Megatron's mock SFT generator), show what packfeed's reader sees in it, and
# plan its global batches (drawn by packfeed's sampler) for 8 ranks with
# Megatron's scheduler and packfeed's. Later stages grow this into daemon +
# client ranks.
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
echo
echo "== its global batches of 256, planned for DP4 x CP2, 4096 tokens per rank"
for scheduler in megatron_dp_balanced balanced dynamic_cp; do
  echo "-- $scheduler"
  "$ctl" plan --dataset "$work/demo" --seed 1 --global-batch 256 --dp 4 --cp 2 \
    --max-tokens-per-rank 4096 --scheduler "$scheduler"
done
