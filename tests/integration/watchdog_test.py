#!/usr/bin/env python3
"""systemd's watchdog sees a hung runner: packfeedd serves a dataset from
slowfs (tests/slowfs, a real FUSE filesystem); when its reads hang, as an
NFS or Lustre read can, a read stays outstanding and packfeedd withholds
WATCHDOG=1 within WatchdogSec; when the reads come back, the pings
resume and the rank is served. Without systemd: the test binds its own
NOTIFY_SOCKET, as daemon_readiness_test does.

ctest runs it under pytest, with the build's paths (tests/conftest.py); skipped: no /dev/fuse."""
import os
import pathlib
import signal
import socket
import subprocess
import tempfile
import time

import pytest

from slowfs_mount import SlowMount

WATCHDOG_USEC = 500_000


def pings_during(notify, seconds):
    """WATCHDOG=1 messages received over the next `seconds`."""
    count, end = 0, time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        notify.settimeout(left)
        try:
            count += "WATCHDOG=1" in notify.recv(4096).decode()
        except socket.timeout:
            break
    return count


def test_watchdog(bin_dir, slowfs, checks):
    if not os.path.exists("/dev/fuse"):
        pytest.skip("/dev/fuse is missing (no FUSE in this machine)")
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        (work / "src").mkdir()
        checks.run("make-dataset", "--out", str(work / "src" / "data"), "--count", "100",
                   "--min", "16", "--max", "300", "--mean", "100", "--vocab", "1000")
        mount = SlowMount(slowfs, work / "src", work / "mnt")
        daemon = None
        try:
            config = work / "daemon.textproto"
            config.write_text(f"""socket_path: "{work / 'daemon.sock'}"
jobs {{
  name: "job"
  datasets {{ prefix: "{work / 'mnt' / 'data'}" }}
  topology {{ dp: 1 }}
  global_batch: 4
  seq_length: 512
  eod_id: 1000
  append_eod: true
  scheduler {{ kind: "balanced" max_tokens_per_rank: 1024 }}
}}
""")
            notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            notify.bind(str(work / "notify"))
            env = dict(os.environ, NOTIFY_SOCKET=str(work / "notify"),
                       WATCHDOG_USEC=str(WATCHDOG_USEC))
            daemon = subprocess.Popen([str(bin_dir / "packfeedd"), "--config", str(config)],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True)
            before = pings_during(notify, 1.5)
            checks.check("healthy: WATCHDOG=1 pings flow", before >= 2, before)

            mount.tell("hang=1")  # every read from now on blocks
            rank = subprocess.Popen(
                [str(bin_dir / "packfeedctl"), "dump", "--socket", str(work / "daemon.sock"),
                 "--job", "job", "--rank", "0", "--steps", "2", "--json"],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            # The first read blocks; pings stop once it has been outstanding
            # for WatchdogSec (0.5 s): let twice that pass.
            pings_during(notify, 2 * WATCHDOG_USEC / 1e6)
            hung = pings_during(notify, 2.0)
            checks.check("a hung read: no WATCHDOG=1 for 2 s", hung == 0, hung)
            print(f"watchdog: {before} pings in 1.5 s while healthy, {hung} in 2 s while a "
                  "read hung")

            mount.tell("hang=0")
            after = pings_during(notify, 1.5)
            checks.check("reads back: the pings resume", after >= 2, after)
            _, stderr = rank.communicate(timeout=60)
            checks.check("and the rank is served", rank.returncode == 0, stderr)
            print(f"watchdog: {after} pings in 1.5 s once reads came back; the rank was served")
            daemon.send_signal(signal.SIGTERM)
            output = daemon.communicate(timeout=30)[0]
            checks.check("SIGTERM exits 0", daemon.returncode == 0, output)
        finally:
            if daemon is not None and daemon.poll() is None:
                daemon.kill()
            mount.tell("hang=0")
            mount.close()
