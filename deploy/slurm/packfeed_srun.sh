#!/usr/bin/env bash
# Runs a training command with one packfeedd per node of the current Slurm
# allocation (inside salloc or an sbatch script):
#
#   packfeed_srun.sh --config JOBS.textproto [--distribution block|cyclic|...]
#                    [--admin-port PORT] -- COMMAND [ARGS...]
#
# 1. finds where Slurm places each task of the training step (a probe step
#    with the same --distribution: block, cyclic, whatever srun does), so
#    each node's daemon serves exactly the global ranks that run on it;
# 2. on more than one node, gives every daemon an admin TCP address
#    (its host, PORT + node index; default 7443) and the others' as peers,
#    with a token made for this run: each daemon then checks at start-up that
#    every peer has the same jobs and fingerprints, and that the nodes' ranks
#    partition each job's world (no rank twice, none missing), and refuses to
#    serve otherwise, naming the rank and the nodes;
# 3. starts the daemons (a background `srun --ntasks-per-node=1 --overlap`
#    step) and waits until every one answers `packfeedctl health` (60 s);
# 4. runs COMMAND as the allocation's tasks (same --distribution) with
#    PACKFEED_SOCKET set to the node's daemon (packfeed.Client and the
#    examples read it);
# 5. stops the daemons (SIGTERM: each drains and exits 0) and returns
#    COMMAND's exit status.
#
# JOBS.textproto holds the jobs (and options) of packfeedd's configuration
# without socket_path, local_ranks, admin_tcp_* and peers: this script adds
# them per node. PACKFEED_RUN_DIR (default /tmp/packfeed-$SLURM_JOB_ID) holds
# the sockets, the per-node configurations and the daemons' logs;
# PACKFEED_BIN_DIR where packfeedd and packfeedctl are (default: on PATH).
# PACKFEED_RANK_LAYOUT="NODE:R,R,...;NODE:..." (node index: ranks) replaces
# the probe, to test the daemons' partition check.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

config="" distribution=() port=7443
while [[ $# -gt 0 ]]; do
  case $1 in
    --config) config=$2; shift 2 ;;
    --distribution) distribution=(--distribution="$2"); shift 2 ;;
    --admin-port) port=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "packfeed_srun: unknown option $1" >&2; exit 2 ;;
  esac
done
[[ -n "$config" && $# -gt 0 ]] || {
  echo "usage: packfeed_srun.sh --config JOBS.textproto [--distribution D] [--admin-port P]" \
       "-- COMMAND..." >&2
  exit 2
}
[[ -n "${SLURM_JOB_ID:-}" ]] || { echo "packfeed_srun: not inside a Slurm allocation" >&2; exit 2; }
nodes=${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-1}}
export PACKFEED_RUN_DIR=${PACKFEED_RUN_DIR:-/tmp/packfeed-$SLURM_JOB_ID}
mkdir -p "$PACKFEED_RUN_DIR"
config=$(cd "$(dirname "$config")" && pwd)/$(basename "$config")
per_node=(srun --nodes="$nodes" --ntasks="$nodes" --ntasks-per-node=1 --overlap --kill-on-bad-exit=0)

# Where each task of the training step runs: node index -> its global ranks.
declare -A ranks_of
if [[ -n "${PACKFEED_RANK_LAYOUT:-}" ]]; then
  IFS=';' read -ra entries <<<"$PACKFEED_RANK_LAYOUT"
  for entry in "${entries[@]}"; do ranks_of[${entry%%:*}]=${entry#*:}; done
else
  while read -r rank node; do
    ranks_of[$node]=${ranks_of[$node]:+${ranks_of[$node]},}$rank
  done < <(srun --overlap "${distribution[@]}" bash -c 'echo "$SLURM_PROCID $SLURM_NODEID"' | sort -n)
fi
# Each node's admin address: its host name, a port of its own (two nodes
# may share a host, as in the tests).
declare -A address_of
while read -r node host; do
  address_of[$node]=$host:$((port + node))
done < <("${per_node[@]}" bash -c 'echo "$SLURM_NODEID $(hostname)"')
addresses=""
for ((node = 0; node < nodes; node++)); do
  export "PACKFEED_NODE_RANKS_$node=${ranks_of[$node]:-}"
  addresses+="${addresses:+ }${address_of[$node]}"
  echo "packfeed_srun: node $node (${address_of[$node]}) hosts ranks [${ranks_of[$node]:-}]"
done
export PACKFEED_NODE_ADDRESSES=$addresses
PACKFEED_ADMIN_TOKEN=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
export PACKFEED_ADMIN_TOKEN

"${per_node[@]}" "$here/packfeed_node.sh" daemon "$config" &
daemons=$!
stop_daemons() {
  # SIGTERM to each daemon itself (srun would cancel the step and kill
  # them): each says goodbye to its ranks and exits 0, which ends the step.
  "${per_node[@]}" --quiet "$here/packfeed_node.sh" stop || true
  wait "$daemons" 2>/dev/null || true
}
trap stop_daemons EXIT

failed_to_start() {
  echo "packfeed_srun: $1; logs in $PACKFEED_RUN_DIR" >&2
  grep -h "\[error\]" "$PACKFEED_RUN_DIR"/packfeedd-*.log 2>/dev/null | sed 's/^/  /' >&2 || true
  exit 1
}
deadline=$((SECONDS + 60))
until "${per_node[@]}" --quiet "$here/packfeed_node.sh" health >/dev/null 2>&1; do
  kill -0 "$daemons" 2>/dev/null || failed_to_start "a daemon failed to start"
  # A daemon that refused to start (seen here when the run directory is
  # shared, or on this node) ends the wait before its peers time out.
  ! grep -qs "\[error\]" "$PACKFEED_RUN_DIR"/packfeedd-*.log ||
    failed_to_start "a daemon refused to start"
  ((SECONDS <= deadline)) || failed_to_start "daemons not ready within 60 s"
  sleep 0.5
done
echo "packfeed_srun: $nodes daemon(s) ready"

status=0
srun --overlap "${distribution[@]}" "$here/packfeed_node.sh" task "$@" || status=$?
stop_daemons
trap - EXIT
echo "packfeed_srun: daemons stopped; training exited $status"
exit "$status"
