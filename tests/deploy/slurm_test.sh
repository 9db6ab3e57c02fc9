#!/usr/bin/env bash
# Slurm for real: installs Debian's slurm-wlm and munge when missing, starts
# munged, slurmctld and two slurmd (nodes n1 and n2 on this host) with a
# minimal config made here, and runs deploy/slurm/packfeed_srun.sh inside
# `salloc -N2 -n4` (block and cyclic task layouts) and through the example
# sbatch file, with `packfeedctl dump` as the training command: every rank
# gets its data from the daemon of the node it runs on, and its fields (every
# byte, every step) must equal the reference built from the plan and the
# files (slurm_reference.py, after the runs), whatever the layout; the daemons check each
# other (fingerprints, and that their ranks partition the job) over TCP, both
# serve and stop cleanly, and no packfeedd is left behind. A deliberately
# broken layout (a rank on two nodes, one on none) is refused by name. The
# Slurm and munge daemons this test started are stopped at the end.
# Skips (exit 77) only where the machine forbids it (neither root nor sudo).
# usage: slurm_test.sh SOURCE_ROOT BIN_DIR
set -euo pipefail
source_root=$1 bin_dir=$2
sudo=""
if [[ $(id -u) -ne 0 ]]; then
  sudo -n true 2>/dev/null || { echo "SKIP: Slurm needs root or passwordless sudo"; exit 77; }
  sudo="sudo -n"
fi
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    slurm-wlm munge >/dev/null
fi

work=$(mktemp -d /tmp/pf-slurm-XXXXXX)
chmod 755 "$work"
host=$(hostname)
pid_files=()  # of the daemons this test started
cleanup() {
  local pids=()
  for file in "${pid_files[@]}"; do [[ -f $file ]] && pids+=("$(cat "$file")"); done
  ((${#pids[@]})) || return 0
  $sudo kill "${pids[@]}" 2>/dev/null || true
  for _ in $(seq 100); do $sudo kill -0 "${pids[@]}" 2>/dev/null || return 0; sleep 0.1; done
  $sudo kill -9 "${pids[@]}" 2>/dev/null || true
}
trap cleanup EXIT

# munge: reuse a running one, else start ours.
if ! pgrep -x munged >/dev/null; then
  $sudo mkdir -p /run/munge && $sudo chown munge: /run/munge
  [[ -f /etc/munge/munge.key ]] || $sudo /usr/sbin/mungekey --create >/dev/null 2>&1 || true
  $sudo runuser -u munge -- /usr/sbin/munged
  pid_files+=(/run/munge/munged.pid)
fi
for _ in $(seq 50); do munge -n </dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done

mkdir -p "$work"/{state,spool,log}
cat >"$work/slurm.conf" <<CONF
ClusterName=pftest
SlurmctldHost=$host
SlurmctldPort=16817
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MailProg=/bin/true
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool/%n
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.%n.pid
SlurmctldLogFile=$work/log/slurmctld.log
SlurmdLogFile=$work/log/slurmd.%n.log
NodeName=n1 NodeHostname=$host Port=16818 CPUs=2 RealMemory=2000 State=UNKNOWN
NodeName=n2 NodeHostname=$host Port=16819 CPUs=2 RealMemory=2000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF=$work/slurm.conf
pid_files+=("$work/slurmctld.pid" "$work/slurmd.n1.pid" "$work/slurmd.n2.pid")
$sudo slurmctld -f "$SLURM_CONF"
$sudo slurmd -f "$SLURM_CONF" -N n1
$sudo slurmd -f "$SLURM_CONF" -N n2
for _ in $(seq 60); do
  [[ $(sinfo -h -o '%t' 2>/dev/null | sort -u) == idle ]] && break
  sleep 0.5
done
sinfo -h -o '%N %t' || true

# The job: 4 global ranks (TP1 CP2 DP2), 2 per node.
"$bin_dir/packfeedctl" make-dataset --out "$work/data" --count 200 --min 8 --max 300 \
  --mean 80 --vocab 32000 >/dev/null
cat >"$work/jobs.textproto" <<JOBS
jobs {
  name: "job"
  datasets { prefix: "$work/data" }
  topology { tp: 1 cp: 2 dp: 2 }
  global_batch: 8
  seq_length: 400
  eod_id: 32000
  append_eod: true
  scheduler { kind: "dynamic_cp" max_tokens_per_rank: 512 }
}
JOBS
# The "training command": each task writes what its rank received.
cat >"$work/train.sh" <<TRAIN
#!/usr/bin/env bash
exec "$bin_dir/packfeedctl" dump --socket "\$PACKFEED_SOCKET" --job job --rank "\$SLURM_PROCID" \\
  --steps 2 --json >"\$PACKFEED_RUN_DIR/rank-\$SLURM_PROCID.json"
TRAIN
chmod +x "$work/train.sh"

fail=0
check() {  # check NAME OUTPUT_FILE [RANKS_OF_N1 RANKS_OF_N2]
  local name=$1 out=$2 failed_before=$fail
  for rank in 0 1 2 3; do
    [[ -s $run_dir/rank-$rank.json ]] || { echo "FAILED $name: rank $rank wrote nothing"; fail=1; }
  done
  grep -q "daemons stopped; training exited 0" "$out" || { echo "FAILED $name: no clean stop"; fail=1; }
  for node in n1 n2; do
    grep -q "signal 15: draining" "$run_dir/packfeedd-$node.log" &&
      grep -q "\[info\] stopped" "$run_dir/packfeedd-$node.log" ||
      { echo "FAILED $name: daemon on $node did not stop cleanly"; fail=1; }
  done
  if pgrep -f "packfeedd --config $run_dir" >/dev/null; then
    echo "FAILED $name: a packfeedd is left behind"; fail=1
  fi
  for node in n1 n2; do
    grep -q "its 4 ranks are hosted once each by 2 nodes" "$run_dir/packfeedd-$node.log" &&
      grep -q "1 job(s) with the same fingerprints" "$run_dir/packfeedd-$node.log" ||
      { echo "FAILED $name: daemon on $node did not check its peer"; fail=1; }
  done
  if [[ $# -ge 4 ]]; then
    grep -q "local_ranks: \[$3\]" "$run_dir/packfeedd-n1.textproto" &&
      grep -q "local_ranks: \[$4\]" "$run_dir/packfeedd-n2.textproto" ||
      { echo "FAILED $name: the daemons do not host ranks [$3] and [$4]"; fail=1; }
  fi
  [[ $fail -ne $failed_before ]] ||
    echo "$name: 4 ranks served by 2 daemons (n1: [${3:-0,1}], n2: [${4:-2,3}]), which checked" \
         "each other over TCP; both drained on SIGTERM"
}

export PACKFEED_BIN_DIR=$bin_dir
run_dir=$work/run-salloc
PACKFEED_RUN_DIR=$run_dir timeout 300 salloc -N2 -n4 --ntasks-per-node=2 \
  "$source_root/deploy/slurm/packfeed_srun.sh" --config "$work/jobs.textproto" -- "$work/train.sh" \
  >"$work/salloc.out" 2>&1 || { cat "$work/salloc.out"; echo "FAILED: salloc run"; fail=1; }
check salloc "$work/salloc.out" 0,1 2,3

run_dir=$work/run-cyclic
PACKFEED_RUN_DIR=$run_dir timeout 300 salloc -N2 -n4 --ntasks-per-node=2 \
  "$source_root/deploy/slurm/packfeed_srun.sh" --distribution cyclic --admin-port 7453 \
  --config "$work/jobs.textproto" -- "$work/train.sh" \
  >"$work/cyclic.out" 2>&1 || { cat "$work/cyclic.out"; echo "FAILED: cyclic run"; fail=1; }
check "salloc --distribution cyclic" "$work/cyclic.out" 0,2 1,3

# Rank 2 on both nodes, rank 3 on none: the daemons refuse to serve.
run_dir=$work/run-broken
if PACKFEED_RUN_DIR=$run_dir PACKFEED_RANK_LAYOUT="0:0,1,2;1:2" timeout 300 \
   salloc -N2 -n4 --ntasks-per-node=2 "$source_root/deploy/slurm/packfeed_srun.sh" \
   --admin-port 7463 --config "$work/jobs.textproto" -- "$work/train.sh" \
   >"$work/broken.out" 2>&1; then
  echo "FAILED: a broken layout was served"; fail=1
elif grep -q "rank 2 is hosted 2 times" "$work/broken.out" &&
     grep -q "rank 3 is hosted by no node" "$work/broken.out"; then
  echo "broken layout: refused: $(grep -m1 -o "job 'job': the nodes.*" "$work/broken.out")"
else
  cat "$work/broken.out"; echo "FAILED: the broken layout's refusal does not name the ranks"; fail=1
fi
if pgrep -f "packfeedd --config $run_dir" >/dev/null; then
  echo "FAILED broken layout: a packfeedd is left behind"; fail=1
fi

run_dir=$work/run-sbatch
(cd "$source_root" && PACKFEED_RUN_DIR=$run_dir PACKFEED_JOBS=$work/jobs.textproto \
  PACKFEED_TRAIN_COMMAND=$work/train.sh PACKFEED_TRAIN_ARGS=" " \
  timeout 300 sbatch --wait --nodes=2 --ntasks-per-node=2 --output="$work/sbatch.out" \
  deploy/slurm/packfeed.sbatch >/dev/null) || { cat "$work/sbatch.out"; echo "FAILED: sbatch run"; fail=1; }
check sbatch "$work/sbatch.out" 0,1 2,3

# Every rank's bytes in the three served runs against the reference.
python3 "$source_root/tests/deploy/slurm_reference.py" "$bin_dir" "$work/jobs.textproto" \
  "$work/data" "$work"/run-{salloc,cyclic,sbatch} || fail=1
exit $fail
