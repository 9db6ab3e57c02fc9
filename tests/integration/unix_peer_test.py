"""Who may attach and drain over the daemon's Unix socket (config
allowed_uids, checked against the kernel's SO_PEERCRED of each connection):
a real packfeedd, real packfeedctl processes run as root and as nobody
(uid 65534). Read-only calls stay open to whoever may connect. A rank of
another uid than the daemon's is served over UCX's TCP transport: UCX's
shared memory does not connect two uids.

ctest runs it under pytest, with the build's paths (tests/conftest.py); skipped unless run as root."""
import os
import pathlib
import subprocess
import tempfile

import pytest

from daemon_harness import Daemon

NOBODY = 65534


def job_text(prefix, allowed=""):
    return f"""{allowed}
jobs {{
  name: "job"
  datasets {{ prefix: "{prefix}" }}
  topology {{ dp: 2 }}
  global_batch: 8
  seq_length: 128
  eod_id: 5000
  append_eod: true
  scheduler {{ kind: "balanced" max_tokens_per_rank: 256 }}
}}
"""


def as_user(uid):
    def drop():
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    return drop


def ctl(daemon, uid, *args):
    return subprocess.run([daemon.ctl, *args, "--socket", daemon.socket], capture_output=True,
                          text=True, timeout=60, preexec_fn=as_user(uid) if uid else None)


def open_to_everyone(daemon):
    # The test's stand-in for a group both users share: the socket (0660)
    # and its directory opened up, so that only allowed_uids decides.
    os.chmod(daemon.dir, 0o755)
    os.chmod(daemon.socket, 0o666)
    os.chmod(daemon.socket + ".rings", 0o666)


def test_unix_peer(bin_dir, checks):
    if os.geteuid() != 0:
        pytest.skip("needs root to run a client as another uid")
    work = tempfile.mkdtemp(prefix="pf-unix-peer-")
    os.chmod(work, 0o755)
    prefix = f"{work}/data"
    checks.run("make-dataset", "--out", prefix, "--count", "100", "--min", "4", "--max", "120",
               "--mean", "40", "--vocab", "5000")
    for path in pathlib.Path(work).iterdir():
        path.chmod(0o644)

    with Daemon(bin_dir, job_text(prefix), name="default", workdir=work) as daemon:
        checks.check("the socket is created 0660",
                     (os.stat(daemon.socket).st_mode & 0o777) == 0o660,
                     oct(os.stat(daemon.socket).st_mode))
        open_to_everyone(daemon)
        health = ctl(daemon, NOBODY, "health")
        checks.check("nobody may ask health", health.returncode == 0, health.stderr)
        stats = ctl(daemon, NOBODY, "stats")
        checks.check("nobody may read stats", stats.returncode == 0, stats.stderr)
        attach = ctl(daemon, NOBODY, "dump", "--job", "job", "--rank", "0", "--steps", "1")
        # Refused at its first call (Describe), before it makes its ring.
        checks.check("nobody may not attach, and is told who and why",
                     attach.returncode != 0 and "PERMISSION_DENIED" in attach.stderr
                     and "uid 65534" in attach.stderr and "may not attach" in attach.stderr
                     and "allowed uids are 0" in attach.stderr, attach.stderr)
        drain = ctl(daemon, NOBODY, "drain")
        checks.check("nobody may not drain", drain.returncode != 0 and "may not drain" in drain.stderr,
                     drain.stderr)
        root = ctl(daemon, 0, "dump", "--job", "job", "--rank", "0", "--steps", "1", "--json")
        checks.check("root (the daemon's uid) attaches", root.returncode == 0, root.stderr)
        root_rank1 = ctl(daemon, 0, "dump", "--job", "job", "--rank", "1", "--steps", "1", "--json")
        log = daemon.log.read_text()
        refusals = [line for line in log.splitlines() if "uid 65534" in line]
        checks.check("the daemon logs one line per refusal, naming the uid",
                     len(refusals) == 2, refusals)
        checks.check("the daemon still serves after the refusals",
                     ctl(daemon, 0, "health").returncode == 0)

    # UCX 1.13's shared memory does not connect processes of two uids: the
    # client of another uid than the daemon's shares its ring as a memfd
    # over SOCKET.rings instead, and UCX carries only the notifications.
    allowed = f"allowed_uids: [{NOBODY}]"
    shm_before = {p.name for p in pathlib.Path("/dev/shm").iterdir()}
    with Daemon(bin_dir, job_text(prefix, allowed), name="allowed", workdir=work) as daemon:
        open_to_everyone(daemon)
        attach = ctl(daemon, NOBODY, "dump", "--job", "job", "--rank", "0", "--steps", "1", "--json")
        checks.check("an allowed uid attaches", attach.returncode == 0, attach.stderr)
        rank1 = ctl(daemon, NOBODY, "dump", "--job", "job", "--rank", "1", "--steps", "1", "--json")
        checks.check("both ranks get the bytes a client of the daemon's own uid gets",
                     attach.stdout == root.stdout and rank1.stdout == root_rank1.stdout
                     and len(root.stdout) > 100 and root.stdout != root_rank1.stdout,
                     f"{len(attach.stdout)} vs {len(root.stdout)} bytes")
        ranks = daemon.ctl_json("stats")["jobs"][0]["ranks"]
        checks.check("through the rings they shared by file descriptor, not TCP messages",
                     [r.get("ring") for r in ranks] == ["memfd", "memfd"], ranks)
        # The same from a container beside the daemon: its own PID and mount
        # namespaces, sharing the socket's directory.
        boxed = subprocess.run(
            ["unshare", "--pid", "--mount", "--fork", "setpriv", f"--reuid={NOBODY}",
             f"--regid={NOBODY}", "--clear-groups", daemon.ctl, "dump", "--job", "job", "--rank",
             "0", "--steps", "1", "--json", "--socket", daemon.socket],
            capture_output=True, text=True, timeout=60)
        checks.check("a trainer in other PID and mount namespaces gets the same bytes",
                     boxed.returncode == 0 and boxed.stdout == root.stdout, boxed.stderr)
        leftovers = [p for p in pathlib.Path("/dev/shm").iterdir()
                     if p.name not in shm_before and p.stat().st_uid == NOBODY]
        checks.check("and no shared-memory file of its own that a third uid could open",
                     not leftovers, leftovers)
        root = ctl(daemon, 0, "dump", "--job", "job", "--rank", "1", "--steps", "1")
        checks.check("a uid not in allowed_uids is refused, root too",
                     root.returncode != 0 and "uid 0 " in root.stderr, root.stderr)
