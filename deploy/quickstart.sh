#!/usr/bin/env bash
# packfeed quick start, from a fresh machine: installs what is missing,
# builds, and runs the main job on an embedded default: a generated Megatron
# dataset served by one packfeedd to 8 client ranks (TP2 x CP2 x DP2, dynamic
# CP), each printing what it received; a Python training loop (the packfeed
# package, torch) on a second job; then the daemon's stats, and a clean stop.
set -euo pipefail
cd "$(dirname "$0")/.."

deploy/install_deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build --target packfeedctl packfeedd print_batches packfeed_python

work=${PACKFEED_QUICKSTART_DIR:-$(mktemp -d)}
mkdir -p "$work"
ctl=build/server/packfeedctl
socket=$work/packfeedd.sock
echo
echo "== generating a dataset in $work"
"$ctl" make-dataset --out "$work/demo" --count 2000 --dist lognormal \
  --min 128 --max 8192 --mean 1024 --sigma 1.5 --vocab 32000 --seed 1
"$ctl" dataset-info "$work/demo"
# A small-vocabulary chat-like set for the Python training demo, so a real
# torch model trains on it in seconds on a laptop-class CPU.
"$ctl" make-dataset --out "$work/chat" --count 2000 --dist lognormal \
  --min 16 --max 1024 --mean 200 --sigma 1.0 --vocab 512 --seed 2

cat >"$work/packfeedd.textproto" <<CONFIG
socket_path: "$socket"
state_dir: "$work/state"
jobs {
  name: "demo"
  datasets { prefix: "$work/demo" }
  topology { tp: 2 cp: 2 dp: 2 }
  global_batch: 64
  seq_length: 8192
  eod_id: 32000
  append_eod: true
  seed: 1
  scheduler { kind: "dynamic_cp" max_tokens_per_rank: 4096 }
}
jobs {
  name: "single"
  datasets { prefix: "$work/chat" }
  topology { tp: 1 cp: 1 dp: 1 }
  global_batch: 16
  seq_length: 1024
  eod_id: 512
  append_eod: true
  scheduler { kind: "balanced" max_tokens_per_rank: 2048 }
}
CONFIG
echo
echo "== starting packfeedd"
build/server/packfeedd --config "$work/packfeedd.textproto" &
daemon=$!
trap 'kill $daemon 2>/dev/null || true' EXIT
for _ in $(seq 100); do "$ctl" health --socket "$socket" >/dev/null 2>&1 && break; sleep 0.1; done
"$ctl" health --socket "$socket"
"$ctl" jobs --socket "$socket"

echo
echo "== 8 client ranks, 3 steps each (per microbatch: local tokens/sequences/CP size)"
pids=()
for rank in $(seq 0 7); do
  build/client/print_batches --socket "$socket" --job demo --rank "$rank" --steps 3 \
    >"$work/rank$rank.log" 2>&1 &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
cat "$work"/rank*.log
[[ $status -eq 0 ]] || { echo "a client rank failed"; exit 1; }

echo
echo "== a Python training loop (client/python/examples/train_loop.py) on job 'single'"
PYTHONPATH=build/python /usr/bin/python3 client/python/examples/train_loop.py \
  --socket "$socket" --job single --rank 0 --steps 8 --vocab 513 --lr 1e-2

echo
echo "== packfeedctl stats"
"$ctl" stats --socket "$socket"
echo
echo "== packfeedctl ledger --check --job demo (what each rank consumed; exit 1 on a duplicate or gap)"
"$ctl" ledger --check --socket "$socket" --job demo
echo
echo "== packfeedctl plan-step 0 (dry run)"
"$ctl" plan-step --socket "$socket" --job demo 0

echo
echo "== stopping packfeedd (SIGTERM)"
kill -TERM $daemon
wait $daemon
trap - EXIT
echo "quickstart: done"
