#!/usr/bin/env python3
"""The daemon notices a rank's process that is gone, besides UCX keepalive:
each attached rank holds a Control.Watch stream open, which breaks when the
process dies (its socket closes, reaped or not) or stops answering HTTP/2
pings (SIGSTOP). Each case is timed from the signal to `stats` showing the
rank detached; the rank can attach again at once, and a rank that detaches
cleanly is not reported gone. The same for ranks attached over the daemon's
TCP address (ranks_over_tcp).

ctest runs it under pytest, with the build's paths (tests/conftest.py)."""
import os
import signal
import tempfile

from daemon_harness import Daemon, free_port, ranks_over_tcp, wait_until

JOB = """jobs {
  name: "job"
  datasets { prefix: "%s" }
  topology { dp: 2 }
  global_batch: 4
  seq_length: 256
  eod_id: 1000
  append_eod: true
  scheduler { kind: "balanced" max_tokens_per_rank: 512 }
}
"""
# The daemon pings every 1 s and gives up after 2 s more (daemon.cc); a
# closed socket is noticed at once.
STOPPED_WITHIN = 6.0
KILLED_WITHIN = 2.0


def attached(daemon, rank):
    return daemon.rank_stats("job", rank).get("attached", False)


def hold(daemon, rank, how):
    """A rank process that takes one step and stays attached."""
    process = daemon.start_dump("job", rank, 1, "--hold-seconds", "120", *how)
    wait_until(lambda: attached(daemon, rank), f"rank {rank} attached")
    return process


def check_liveness(checks, daemon, label, how):
    """The cases above for ranks attached `how` (extra dump arguments)."""
    clean = daemon.start_dump("job", 0, 1, *how)
    clean.communicate(timeout=60)
    checks.check(f"{label}: a clean detach is not a rank gone",
                 "Watch stream broke" not in daemon.log.read_text())

    stopped = hold(daemon, 0, how)
    stopped.send_signal(signal.SIGSTOP)
    took_stopped = wait_until(lambda: not attached(daemon, 0), "the stopped rank noticed",
                              timeout=30)
    checks.check(f"{label}: a stopped rank is noticed within {STOPPED_WITHIN} s",
                 took_stopped <= STOPPED_WITHIN, took_stopped)
    stopped.send_signal(signal.SIGKILL)
    stopped.send_signal(signal.SIGCONT)
    stopped.wait(timeout=30)

    killed = hold(daemon, 1, how)
    killed.send_signal(signal.SIGKILL)  # a zombie until reaped below
    took_killed = wait_until(lambda: not attached(daemon, 1), "the killed rank noticed",
                             timeout=30)
    checks.check(f"{label}: a killed rank is noticed within {KILLED_WITHIN} s",
                 took_killed <= KILLED_WITHIN, took_killed)
    killed.wait(timeout=30)

    # Either signal may come first (over TCP, UCX's keepalive can beat the
    # Watch stream to a killed rank); the daemon says so once.
    lines = daemon.log.read_text().splitlines()
    said = [sum(f"rank {rank}" in line and ("Watch stream broke" in line
                                            or "connection lost" in line) for line in lines)
            for rank in (0, 1)]
    checks.check(f"{label}: the daemon says why, once per rank", said == [1, 1],
                 "\n".join(lines[-12:]))
    again = daemon.dump_ranks("job", [0, 1], 1, *how)
    checks.check(f"{label}: both ranks attach again and are served",
                 all(len(d["steps"]) == 1 for d in again.values()))
    print(f"{label}: a SIGSTOPped rank was noticed after {took_stopped:.1f} s, a SIGKILLed "
          f"(unreaped) one after {took_killed:.2f} s; both attached again and were served")


def test_a_stopped_or_killed_rank_is_noticed(bin_dir, checks):
    work = tempfile.mkdtemp(prefix="pf-liveness-")
    prefix = os.path.join(work, "data")
    checks.run("make-dataset", "--out", prefix, "--count", "100", "--min", "16", "--max", "200",
               "--mean", "80", "--vocab", "1000")
    with Daemon(bin_dir, JOB % prefix, name="liveness", workdir=work) as daemon:
        check_liveness(checks, daemon, "on the socket", [])
    # Ranks attached over the daemon's TCP address (ranks_over_tcp): the
    # same pings, on the TCP listener.
    address = f"127.0.0.1:{free_port()}"
    tcp = ranks_over_tcp(address)
    job = (JOB % prefix).replace("append_eod: true", 'append_eod: true\n  auth_token: "t"')
    with Daemon(bin_dir, tcp + job, name="liveness_tcp", workdir=work) as daemon:
        check_liveness(checks, daemon, "over TCP",
                       ["--address", address, "--token", "t", "--ucx-transports", "tcp",
                        # each dump starts at step 0 again: a rewind, the operator's
                        "--admin-token", "adm"])
