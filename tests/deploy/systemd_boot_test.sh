#!/usr/bin/env bash
# deploy/systemd/packfeedd.service under a real systemd: systemd boots as
# PID 1 of a private PID and mount namespace (a container with nothing but
# systemd, its journal and this unit). There, /run, /tmp, /var/tmp, /var/log
# and /var/lib/packfeed are fresh tmpfs and /etc/passwd and /etc/group are
# copies: a booting systemd empties /tmp (systemd-tmpfiles, pulled in by the
# unit's PrivateTmp=), which must not reach the host's. The host's own
# services are not touched. The unit, as shipped but with ExecStart pointed at the built
# packfeedd, its network-online dependency dropped (no network services in
# the container) and WatchdogSec=2, must:
#   - become active only after READY=1 (Type=notify), with the daemon's
#     STATUS line, and answer packfeedctl health on its socket as the
#     packfeed user;
#   - feed the watchdog (its timestamp advances);
#   - be restarted after a SIGKILL (Restart=on-failure) and serve again;
#   - stop on `systemctl stop` by draining, with result success.
# Skips (77, with the reason) only without root, without systemd, or where
# the namespaces cannot be made; a systemd that does not boot in them fails.
# usage: systemd_boot_test.sh SOURCE_ROOT BIN_DIR
set -euo pipefail
source_root=$1 bin_dir=$2
[[ $(id -u) -eq 0 ]] || { echo "SKIP: booting systemd in a namespace needs root"; exit 77; }
systemd=/usr/lib/systemd/systemd
[[ -x $systemd ]] || { echo "SKIP: no $systemd"; exit 77; }
unshare --pid --fork --mount --uts --mount-proc true ||
  { echo "SKIP: this machine cannot make PID and mount namespaces"; exit 77; }

work=$(mktemp -d "$bin_dir/../systemd-boot-test.XXXXXX")
chmod 755 "$work"
# Where the container sees the build's binaries and this folder: not under
# /tmp (the container's is fresh, and the unit's PrivateTmp= hides it from
# the daemon), wherever the clone lies.
inside=$(mktemp -d /var/lib/packfeed-boot-test.XXXXXX)
chmod 755 "$inside"
mkdir "$inside/bin" "$inside/work"
unshare_pid=""
made_state_dir=false
[[ -d /var/lib/packfeed ]] || { mkdir /var/lib/packfeed; made_state_dir=true; }
cleanup() {
  [[ -n ${init:-} ]] && kill -9 "$init" 2>/dev/null || true
  [[ -n $unshare_pid ]] && wait "$unshare_pid" 2>/dev/null || true
  $made_state_dir && rmdir /var/lib/packfeed 2>/dev/null || true
  rm -rf "$work"
  rm -rf --one-file-system "$inside"
}
trap cleanup EXIT

# The configuration and a dataset the packfeed user may read.
"$bin_dir/packfeedctl" make-dataset --out "$work/data" --count 100 --min 8 --max 200 \
  --mean 50 --vocab 1000 >/dev/null
chmod 644 "$work"/data.*
cat >"$work/packfeedd.textproto" <<CONFIG
socket_path: "/run/packfeed/packfeedd.sock"
state_dir: "/var/lib/packfeed"
jobs {
  name: "job"
  datasets { prefix: "$inside/work/data" }
  topology { tp: 1 cp: 1 dp: 1 }
  global_batch: 4
  seq_length: 256
  eod_id: 1000
  append_eod: true
  scheduler { kind: "balanced" max_tokens_per_rank: 512 }
}
CONFIG
sed -e "s|^ExecStart=/usr/local/bin/packfeedd --config /etc/packfeed/packfeedd.textproto|ExecStart=$inside/bin/packfeedd --config $inside/work/packfeedd.textproto|" \
    -e '/^After=network-online.target/d' -e '/^Wants=network-online.target/d' \
    -e 's/^WatchdogSec=.*/WatchdogSec=2/' \
    "$source_root/deploy/systemd/packfeedd.service" >"$work/packfeedd.service"
grep -q "^ExecStart=$inside/bin/packfeedd" "$work/packfeedd.service" ||
  { echo "FAILED: the unit's ExecStart line changed; update this test"; exit 1; }
cat >"$work/pftest.target" <<TARGET
[Unit]
Description=packfeed boot test
DefaultDependencies=no
Wants=packfeedd.service
TARGET
# The packfeed user, in copies of passwd and group seen only in the container.
cp /etc/passwd "$work/passwd"
cp /etc/group "$work/group"
if ! grep -q '^packfeed:' /etc/passwd; then
  echo 'packfeed:x:64999:64999:packfeed:/nonexistent:/usr/sbin/nologin' >>"$work/passwd"
  echo 'packfeed:x:64999:' >>"$work/group"
fi

cat >"$work/boot.sh" <<BOOT
#!/usr/bin/env bash
set -e
mount --make-rprivate /
mount --bind "$bin_dir" "$inside/bin"
mount --bind "$work" "$inside/work"
for dir in /run /tmp /var/tmp /var/log /var/lib/packfeed; do mount -t tmpfs tmpfs "\$dir"; done
mkdir -p /run/systemd/system
cp "$inside/work/packfeedd.service" "$inside/work/pftest.target" /run/systemd/system/
mount --bind "$inside/work/passwd" /etc/passwd
mount --bind "$inside/work/group" /etc/group
exec $systemd --system --unit=pftest.target --show-status=no --log-target=console
BOOT
chmod +x "$work/boot.sh"
unshare --pid --fork --mount --uts --mount-proc "$work/boot.sh" </dev/null >"$work/systemd.log" 2>&1 &
unshare_pid=$!
for _ in $(seq 50); do
  init=$(pgrep -P "$unshare_pid" || true)
  [[ -n $init ]] && break
  sleep 0.1
done
[[ -n ${init:-} ]] || { cat "$work/systemd.log"; echo "FAILED: systemd did not start"; exit 1; }
in_container() { nsenter --target "$init" --mount --pid -- "$@"; }
prop() { in_container systemctl show -p "$1" --value packfeedd; }

fail=0
check() {  # check NAME CONDITION...
  local name=$1; shift
  if "$@"; then echo "ok: $name"; else echo "FAILED: $name"; fail=1; fi
}
wait_for() {  # wait_for SECONDS COMMAND...
  local seconds=$1; shift
  for _ in $(seq $((seconds * 10))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
  return 1
}
if ! wait_for 30 in_container systemctl is-system-running --wait; then
  state=$(in_container systemctl is-system-running 2>/dev/null || true)
  [[ $state == running || $state == degraded ]] ||
    { cat "$work/systemd.log"; echo "FAILED: systemd did not boot in the namespace ($state)"; exit 1; }
fi
active() { [[ $(prop ActiveState) == active ]]; }
check "the unit becomes active (READY=1)" wait_for 30 active
echo "status: $(prop StatusText)"
check "its status line is the daemon's" grep -q "serving 1 job(s) on /run/packfeed/packfeedd.sock" \
  <<<"$(prop StatusText)"
health() { in_container runuser -u packfeed -- "$inside/bin/packfeedctl" health \
  --socket /run/packfeed/packfeedd.sock; }
check "the packfeed user's packfeedctl health answers on the socket" wait_for 10 health
check "the daemon runs as packfeed" [ "$(in_container ps -o user= -p "$(prop MainPID)")" = packfeed ]

first=$(prop WatchdogTimestampMonotonic)
sleep 2.5
check "the watchdog is fed (its timestamp advances)" \
  [ "$(prop WatchdogTimestampMonotonic)" -gt "${first:-0}" ]

main=$(prop MainPID)
in_container kill -9 "$main"
restarted() { [[ $(prop NRestarts) -ge 1 && $(prop MainPID) != "$main" ]] && active; }
check "after SIGKILL the unit is restarted (Restart=on-failure)" wait_for 30 restarted
check "and serves again" wait_for 10 health

in_container systemctl stop packfeedd
check "systemctl stop drains it: inactive, result success" \
  [ "$(prop ActiveState)/$(prop Result)" = inactive/success ]
in_container journalctl -u packfeedd --no-pager -o cat 2>/dev/null | grep -E "draining|stopped" |
  tail -2 || true
exit $fail
