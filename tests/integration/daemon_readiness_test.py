"""packfeedd under systemd's notify protocol, without systemd: the test binds
its own NOTIFY_SOCKET (a Unix datagram socket) and checks that READY=1 comes
only once the gRPC socket answers (packfeedctl health succeeds the moment
READY arrives), that WATCHDOG=1 pings follow at WATCHDOG_USEC/2, and that
SIGTERM sends STOPPING=1 and exits 0; that while start-up waits for a peer
daemon, EXTEND_TIMEOUT_USEC comes every few seconds with a STATUS naming the
peer (systemd's start timeout would otherwise end a long wait), SIGTERM
ends that wait at once, and READY never comes for a start-up that failed. Also: start-up errors are one clear
line and a non-zero exit, and a closed log pipe does not kill the daemon.

ctest runs it under pytest, with the build's paths (tests/conftest.py)."""
import os
import pathlib
import signal
import socket
import subprocess
import tempfile
import time

import pytest

from daemon_harness import make_dataset, start_up_errors

WATCHDOG_USEC = 400_000


def config_text(sock, prefix):
    return f"""socket_path: "{sock}"
jobs {{
  name: "job"
  datasets {{ prefix: "{prefix}" }}
  topology {{ tp: 1 cp: 1 dp: 1 }}
  global_batch: 4
  seq_length: 256
  eod_id: 1000
  append_eod: true
  scheduler {{ kind: "balanced" max_tokens_per_rank: 512 }}
}}
"""


@pytest.fixture(scope="module")
def work():
    return tempfile.mkdtemp(prefix="pf-readiness-")


@pytest.fixture(scope="module")
def prefix(bin_dir, work):
    """A small generated dataset every test serves."""
    return make_dataset(bin_dir, f"{work}/data", "--count", "50", "--min", "8", "--max", "200",
                        "--mean", "50", "--vocab", "1000")


def receive(notify, timeout):
    notify.settimeout(timeout)
    try:
        return notify.recv(4096).decode()
    except socket.timeout:
        return None


def test_notify(checks, bin_dir, work, prefix):
    ctl = f"{bin_dir}/packfeedctl"
    sock = f"{work}/daemon.sock"
    config = pathlib.Path(work, "ready.textproto")
    config.write_text(config_text(sock, prefix))
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(f"{work}/notify")
    env = dict(os.environ, NOTIFY_SOCKET=f"{work}/notify", WATCHDOG_USEC=str(WATCHDOG_USEC))
    daemon = subprocess.Popen([f"{bin_dir}/packfeedd", "--config", str(config)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ready = receive(notify, 20)
    answered = subprocess.run([ctl, "health", "--socket", sock], capture_output=True, text=True)
    checks.check("first notification is READY=1", ready is not None and "READY=1" in ready, ready)
    checks.check("READY carries a STATUS", ready is not None and "STATUS=serving 1 job" in ready,
                 ready)
    checks.check("the socket answers when READY arrives", answered.returncode == 0,
                 answered.stderr)
    start, pings = time.monotonic(), 0
    while time.monotonic() - start < 1.0:
        message = receive(notify, 1.0)
        pings += message is not None and "WATCHDOG=1" in message
    checks.check("watchdog pinged every WATCHDOG_USEC/2 (>= 3 in 1 s)", pings >= 3, pings)
    daemon.send_signal(signal.SIGTERM)
    stopping = None
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        message = receive(notify, 1.0)
        if message and "STOPPING=1" in message:
            stopping = message
            break
    output = daemon.communicate(timeout=20)[0]
    checks.check("SIGTERM sends STOPPING=1", stopping is not None, output)
    checks.check("SIGTERM exits 0", daemon.returncode == 0, output)
    notify.close()
    print(f"notify: READY then health answered, {pings} watchdog pings in 1 s, STOPPING on SIGTERM")


def test_closed_log_pipe(checks, bin_dir, work, prefix):
    """A daemon whose log pipe's reader has gone (a `| head` that exited)
    keeps serving and drains on SIGTERM: a write into the closed pipe fails,
    it does not kill the daemon with SIGPIPE."""
    ctl = f"{bin_dir}/packfeedctl"
    sock = f"{work}/pipe.sock"
    config = pathlib.Path(work, "pipe.textproto")
    config.write_text(config_text(sock, prefix))
    daemon = subprocess.Popen([f"{bin_dir}/packfeedd", "--config", str(config)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    healthy = False
    while time.monotonic() < deadline and not healthy:
        healthy = subprocess.run([ctl, "health", "--socket", sock],
                                 capture_output=True).returncode == 0
        time.sleep(0.05)
    checks.check("closed log pipe: the daemon starts", healthy)
    daemon.stdout.close()  # the reader goes away
    daemon.send_signal(signal.SIGTERM)  # logs "draining", then "stopped"
    try:
        code = daemon.wait(timeout=20)
    except subprocess.TimeoutExpired:
        daemon.kill()
        code = daemon.wait()
    checks.check("closed log pipe: SIGTERM still drains and exits 0 (not SIGPIPE)", code == 0,
                 code)
    print(f"closed log pipe: exit {code} after SIGTERM")


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_waiting_for_peer(bin_dir, work, prefix, name, timeout_seconds):
    """A daemon whose one peer nobody answers, under a notify socket of the
    test's: (daemon, notify socket, the peer's address)."""
    peer = f"127.0.0.1:{free_port()}"
    config = pathlib.Path(work, f"{name}.textproto")
    config.write_text(config_text(f"{work}/{name}.sock", prefix) +
                      f'admin_tcp_address: "127.0.0.1:{free_port()}"\n'
                      f'admin_tcp_token: "t"\npeers: "{peer}"\n'
                      f"peer_timeout_seconds: {timeout_seconds}\n")
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(f"{work}/notify-{name}")
    env = dict(os.environ, NOTIFY_SOCKET=f"{work}/notify-{name}")
    daemon = subprocess.Popen([f"{bin_dir}/packfeedd", "--config", str(config)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return daemon, notify, peer


def test_peer_wait(checks, bin_dir, work, prefix):
    daemon, notify, peer = start_waiting_for_peer(bin_dir, work, prefix, "peers", 6)
    messages = []
    while daemon.poll() is None or (messages and messages[-1] is not None):
        messages.append(receive(notify, 1.0))
    output = daemon.communicate(timeout=20)[0]
    messages = [m for m in messages if m]
    extensions = [m for m in messages if "EXTEND_TIMEOUT_USEC=15000000" in m]
    checks.check("start-up extends its timeout while it waits for a peer (>= 2 in 6 s)",
                 len(extensions) >= 2, messages)
    checks.check("each extension's STATUS names the peer",
                 bool(extensions) and all(f"STATUS=waiting for peer {peer}" in m
                                          for m in extensions), extensions)
    checks.check("no READY for a start-up that failed",
                 not any("READY=1" in m for m in messages), messages)
    checks.check("the unanswered peer fails start-up by name",
                 daemon.returncode != 0 and f"peer {peer} did not answer" in output, output)
    notify.close()
    print(f"peer wait: {len(extensions)} start timeout extensions in 6 s, then one error line")


def test_stop_while_waiting_for_peer(checks, bin_dir, work, prefix):
    """SIGTERM while start-up waits for a peer that is gone: the daemon stops
    within a few seconds (not after peer_timeout_seconds), exits 0 and says
    what it was doing. Seen under Slurm: a node whose peer refused its
    configuration waited out the whole timeout after packfeed_srun's stop."""
    daemon, notify, peer = start_waiting_for_peer(bin_dir, work, prefix, "peers-stop", 120)
    first = receive(notify, 20.0)  # the first EXTEND_TIMEOUT_USEC: it is waiting
    checks.check("stop while waiting: the daemon says it waits for the peer",
                 first is not None and f"waiting for peer {peer}" in first, first)
    sent = time.monotonic()
    daemon.send_signal(signal.SIGTERM)
    try:
        output = daemon.communicate(timeout=20)[0]
    except subprocess.TimeoutExpired:
        daemon.kill()
        output = daemon.communicate()[0]
    took = time.monotonic() - sent
    notify.close()
    checks.check("stop while waiting: exits within 5 s of SIGTERM, not after the peer timeout",
                 took < 5, f"{took:.1f} s")
    checks.check("stop while waiting: exit 0 (a requested stop is no failure)",
                 daemon.returncode == 0, daemon.returncode)
    checks.check("stop while waiting: one line says what start-up was doing",
                 f"stopped during start-up: stopped while waiting for peer {peer}" in output,
                 output)
    checks.check("stop while waiting: no error line", "[error]" not in output, output)
    print(f"stop while waiting for a peer: exit {daemon.returncode} {took:.1f} s after SIGTERM")


def test_startup_errors(checks, bin_dir, work, prefix):
    """Each start-up error: a non-zero exit and one error line naming the cause."""
    readonly = pathlib.Path(work, "readonly")
    readonly.mkdir()
    readonly.chmod(0o500)
    a_file = pathlib.Path(work, "a-file")
    a_file.write_text("")
    unreadable = pathlib.Path(work, "unreadable")
    for suffix in (".idx", ".bin"):
        pathlib.Path(f"{unreadable}{suffix}").write_bytes(pathlib.Path(f"{prefix}{suffix}").read_bytes())
    pathlib.Path(f"{unreadable}.idx").chmod(0)
    truncated = pathlib.Path(work, "truncated")
    pathlib.Path(f"{truncated}.idx").write_bytes(pathlib.Path(f"{prefix}.idx").read_bytes()[:20])
    pathlib.Path(f"{truncated}.bin").write_bytes(pathlib.Path(f"{prefix}.bin").read_bytes())
    # A document index entry in the middle set to 10^12: opened with on-use
    # validation, it is caught when the sample table is built (it crashed the
    # daemon with SIGSEGV before).
    corrupt = pathlib.Path(work, "corrupt_documents")
    index = bytearray(pathlib.Path(f"{prefix}.idx").read_bytes())
    sequences = int.from_bytes(index[18:26], "little")
    entry = 34 + 12 * sequences + 8 * 25
    index[entry:entry + 8] = (10**12).to_bytes(8, "little")
    pathlib.Path(f"{corrupt}.idx").write_bytes(bytes(index))
    pathlib.Path(f"{corrupt}.bin").write_bytes(pathlib.Path(f"{prefix}.bin").read_bytes())
    cases = {
        "dataset missing": (config_text(f"{work}/a.sock", f"{work}/nothing"), "nothing.idx"),
        "dataset index truncated": (config_text(f"{work}/a.sock", truncated), "truncated header"),
        "document index corrupt": (config_text(f"{work}/a.sock", corrupt),
                                   "corrupt_documents.idx"),
        "socket directory impossible": (config_text(f"{a_file}/sub/a.sock", prefix),
                                        "cannot be created"),
        "config invalid": (config_text(f"{work}/a.sock", prefix).replace('"balanced"', '"bogus"'),
                           "jobs[0].scheduler.kind"),
    }
    if os.geteuid() != 0:  # root reads and writes anything
        cases["dataset unreadable"] = (config_text(f"{work}/a.sock", unreadable), "unreadable.idx")
        cases["socket directory not writable"] = (config_text(f"{readonly}/a.sock", prefix),
                                                  "not writable")
    for name, (text, expected) in cases.items():
        config = pathlib.Path(work, "bad.textproto")
        config.write_text(text)
        code, errors = start_up_errors(bin_dir, config)
        checks.check(f"start-up error ({name}): non-zero exit", code != 0, code)
        checks.check(f"start-up error ({name}): one error line naming {expected!r}",
                     len(errors) == 1 and expected in errors[0], errors)
    readonly.chmod(0o700)
