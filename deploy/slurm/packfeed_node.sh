#!/usr/bin/env bash
# One node's part of packfeed_srun.sh, run by srun on each node:
#   packfeed_node.sh daemon JOBS.textproto   this node's packfeedd (foreground)
#   packfeed_node.sh health                  exit 0 when this node's daemon answers
#   packfeed_node.sh stop                    SIGTERM to this node's daemon (it drains),
#                                            then waits up to 30 s for it to exit
#   packfeed_node.sh task COMMAND...         COMMAND with PACKFEED_SOCKET set
# The node's socket is $PACKFEED_RUN_DIR/packfeedd-$SLURMD_NODENAME.sock.
set -euo pipefail
bin=${PACKFEED_BIN_DIR:+$PACKFEED_BIN_DIR/}
node=${SLURMD_NODENAME:-$(hostname)}
socket=$PACKFEED_RUN_DIR/packfeedd-$node.sock
pid_file=$PACKFEED_RUN_DIR/packfeedd-$node.pid

case $1 in
  daemon)
    node_index=${SLURM_NODEID:?}
    ranks_var=PACKFEED_NODE_RANKS_$node_index
    read -ra addresses <<<"${PACKFEED_NODE_ADDRESSES:-}"
    node_config=$PACKFEED_RUN_DIR/packfeedd-$node.textproto
    umask 077  # the configuration holds the admin token
    { echo "socket_path: \"$socket\""
      if ((${#addresses[@]} > 1)); then
        echo "admin_tcp_address: \"${addresses[$node_index]}\""
        echo "admin_tcp_token: \"$PACKFEED_ADMIN_TOKEN\""
        for i in "${!addresses[@]}"; do
          ((i == node_index)) || echo "peers: \"${addresses[$i]}\""
        done
      fi
      sed "s/^\([[:space:]]*\)jobs[[:space:]]*{/&\n\1  local_ranks: [${!ranks_var}]/" "$2"
    } >"$node_config"
    echo $$ >"$pid_file"  # exec keeps the pid: this is packfeedd's
    exec "${bin}packfeedd" --config "$node_config" >>"$PACKFEED_RUN_DIR/packfeedd-$node.log" 2>&1
    ;;
  health)
    exec "${bin}packfeedctl" health --socket "$socket"
    ;;
  stop)
    pid=$(cat "$pid_file" 2>/dev/null) || exit 0
    kill -TERM "$pid" 2>/dev/null || exit 0
    for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || exit 0; sleep 0.1; done
    echo "packfeed_node.sh: packfeedd $pid on $node still running 30 s after SIGTERM" >&2
    exit 1
    ;;
  task)
    shift
    export PACKFEED_SOCKET=$socket
    exec "$@"
    ;;
  *)
    echo "packfeed_node.sh: daemon|health|stop|task" >&2
    exit 2
    ;;
esac
