#!/usr/bin/env bash
# Runs a training command with one packfeedd per node of the current Slurm
# allocation (inside salloc or an sbatch script):
#
#   packfeed_srun.sh --config JOBS.textproto [--ranks-per-node N] -- COMMAND [ARGS...]
#
# 1. starts one daemon per node (a background `srun --ntasks-per-node=1
#    --overlap` step); each node serves the global ranks
#    [node · N, (node+1) · N), N = --ranks-per-node, else the allocation's
#    tasks per node (ranks are numbered node-major, as srun numbers tasks);
# 2. waits until every daemon answers `packfeedctl health` (60 s at most);
# 3. runs COMMAND as the allocation's tasks with PACKFEED_SOCKET set to the
#    node's daemon (packfeed.Client and the examples read it) and
#    PACKFEED_RANKS_PER_NODE exported;
# 4. stops the daemons (SIGTERM: each drains and exits 0) and returns
#    COMMAND's exit status.
#
# JOBS.textproto holds the jobs (and options) of packfeedd's configuration
# without socket_path and local_ranks: this script adds both per node.
# PACKFEED_RUN_DIR (default /tmp/packfeed-$SLURM_JOB_ID) holds the sockets,
# the per-node configurations and the daemons' logs; PACKFEED_BIN_DIR where
# packfeedd and packfeedctl are (default: found on PATH).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

config="" ranks_per_node=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --config) config=$2; shift 2 ;;
    --ranks-per-node) ranks_per_node=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "packfeed_srun: unknown option $1" >&2; exit 2 ;;
  esac
done
[[ -n "$config" && $# -gt 0 ]] || {
  echo "usage: packfeed_srun.sh --config JOBS.textproto [--ranks-per-node N] -- COMMAND..." >&2
  exit 2
}
[[ -n "${SLURM_JOB_ID:-}" ]] || { echo "packfeed_srun: not inside a Slurm allocation" >&2; exit 2; }
nodes=${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-1}}
if [[ -z "$ranks_per_node" ]]; then
  ranks_per_node=${SLURM_NTASKS_PER_NODE:-$(( ${SLURM_NTASKS:-$nodes} / nodes ))}
fi
export PACKFEED_RUN_DIR=${PACKFEED_RUN_DIR:-/tmp/packfeed-$SLURM_JOB_ID}
export PACKFEED_RANKS_PER_NODE=$ranks_per_node
mkdir -p "$PACKFEED_RUN_DIR"
config=$(cd "$(dirname "$config")" && pwd)/$(basename "$config")

per_node=(srun --nodes="$nodes" --ntasks="$nodes" --ntasks-per-node=1 --overlap --kill-on-bad-exit=0)
"${per_node[@]}" "$here/packfeed_node.sh" daemon "$config" &
daemons=$!
stop_daemons() {
  # SIGTERM to each daemon itself (srun would cancel the step and kill
  # them): each says goodbye to its ranks and exits 0, which ends the step.
  "${per_node[@]}" --quiet "$here/packfeed_node.sh" stop || true
  wait "$daemons" 2>/dev/null || true
}
trap stop_daemons EXIT

deadline=$((SECONDS + 60))
until "${per_node[@]}" --quiet "$here/packfeed_node.sh" health >/dev/null 2>&1; do
  if ! kill -0 "$daemons" 2>/dev/null; then
    echo "packfeed_srun: a daemon failed to start; logs in $PACKFEED_RUN_DIR" >&2
    exit 1
  fi
  if ((SECONDS > deadline)); then
    echo "packfeed_srun: daemons not ready within 60 s; logs in $PACKFEED_RUN_DIR" >&2
    exit 1
  fi
  sleep 0.5
done
echo "packfeed_srun: $nodes daemon(s) ready, $ranks_per_node rank(s) per node"

status=0
srun --overlap "$here/packfeed_node.sh" task "$@" || status=$?
stop_daemons
trap - EXIT
echo "packfeed_srun: daemons stopped; training exited $status"
exit "$status"
