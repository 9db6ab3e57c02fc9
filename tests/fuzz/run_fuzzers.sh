#!/usr/bin/env bash
# Runs every fuzz target for a bounded time over a seed corpus.
#   tests/fuzz/run_fuzzers.sh BUILD_DIR SECONDS_PER_TARGET
# index_parser_fuzz is seeded with Megatron's fixture indexes
# (tests/fixtures) and indexes made by packfeedctl; wire_fuzz starts from nothing
# (libFuzzer's comparison tracing finds the magic and the version);
# config_fuzz from one configuration using every field; attach_fuzz from
# nothing (half its inputs are merged over a valid request); npy_fuzz (three
# .npy files of cached indices) from nothing. Longer runs: pass more seconds, or run the binary
# directly, e.g. build-asan/tests/fuzz/index_parser_fuzz -max_total_time=3600 DIR
set -euo pipefail
build=$1
seconds=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
corpus=$(mktemp -d)
logs=$(mktemp -d)  # apart: index_parser_fuzz takes every file under $corpus
trap 'rm -rf "$corpus" "$logs"' EXIT

find "$root/tests/fixtures" -name '*.idx' -exec cp {} "$corpus/" \;
ctl=$root/build/server/packfeedctl
if [[ -x $ctl ]]; then
  for dtype in uint8 int16 int32 int64 float32 uint16; do
    "$ctl" make-dataset --out "$corpus/gen_$dtype" --count 5 --min 1 --max 9 \
      --mean 4 --vocab 100 --dtype "$dtype" >/dev/null
    rm -f "$corpus/gen_$dtype.bin"
  done
fi

# Every target runs at once, for as long as gives each SECONDS_PER_TARGET of
# a core in all: five targets on two cores take 75 s for 30 s each, where
# waves of one target per core took 90 s and left a core idle in the last.
targets=(index_parser_fuzz wire_fuzz config_fuzz attach_fuzz npy_fuzz)
cores=$(nproc)
((cores < ${#targets[@]})) || cores=${#targets[@]}
wall=$(((seconds * ${#targets[@]} + cores - 1) / cores))
run() {  # run TARGET CORPUS_DIR
  local log=$logs/$1.log
  if ! "$build/tests/fuzz/$1" -max_total_time="$wall" -max_len=4096 \
      -print_final_stats=1 "$2" >"$log" 2>&1; then
    cat "$log"
    echo "run_fuzzers: $1 FAILED"
    touch "$logs/$1.failed"
    return 1
  fi
  grep -E '^(Done|stat::(number_of_executed_units|new_units_added))' "$log"
  echo "run_fuzzers: $1 ran ${wall}s beside the others without a crash"
}
mkdir -p "$corpus/wire" "$corpus/config" "$corpus/attach" "$corpus/npy"
cat >"$corpus/config/seed.textproto" <<'CONFIG'
socket_path: "/run/packfeed/packfeedd.sock"
prefetch_steps: 2
admin_tcp_address: "10.0.0.1:7070"
admin_tcp_token: "s"
peers: "10.0.0.2:7070"
jobs {
  name: "pretrain"
  datasets { prefix: "/data/a" kind: DATASET_KIND_VARLEN weight: 0.5 }
  datasets { prefix: "/data/b" kind: DATASET_KIND_VARLEN weight: 0.5 }
  topology { tp: 2 pp: 2 cp: 2 dp: 2 sequence_parallel: true }
  global_batch: 16
  seq_length: 256
  eod_id: 7
  append_eod: true
  seed: 3
  auth_token: "t"
  local_ranks: [0, 1, 2, 3]
  scheduler { kind: "dynamic_cp" max_tokens_per_rank: 128 }
}
CONFIG
for target in "${targets[@]}"; do
  # index_parser_fuzz takes the whole corpus, each other target its folder.
  dir=$corpus/${target%_fuzz}
  [[ $target != index_parser_fuzz ]] || dir=$corpus
  run "$target" "$dir" &
done
wait
! compgen -G "$logs/*.failed" >/dev/null
