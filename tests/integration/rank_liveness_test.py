#!/usr/bin/env python3
"""The daemon notices a rank's process that is gone, besides UCX keepalive:
each attached rank holds a Control.Watch stream open, which breaks when the
process dies (its socket closes, reaped or not) or stops answering HTTP/2
pings (SIGSTOP). Each case is timed from the signal to `stats` showing the
rank detached; the rank can attach again at once, and a rank that detaches
cleanly is not reported gone.

ctest runs it under pytest, with the build's paths (tests/conftest.py)."""
import os
import signal
import tempfile

from daemon_harness import Daemon, wait_until

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


def hold(daemon, rank):
    """A rank process that takes one step and stays attached."""
    process = daemon.start_dump("job", rank, 1, "--hold-seconds", "120")
    wait_until(lambda: attached(daemon, rank), f"rank {rank} attached")
    return process


def test_a_stopped_or_killed_rank_is_noticed(bin_dir, checks):
    work = tempfile.mkdtemp(prefix="pf-liveness-")
    prefix = os.path.join(work, "data")
    checks.run("make-dataset", "--out", prefix, "--count", "100", "--min", "16", "--max", "200",
               "--mean", "80", "--vocab", "1000")
    with Daemon(bin_dir, JOB % prefix, name="liveness", workdir=work) as daemon:
        clean = daemon.start_dump("job", 0, 1)
        clean.communicate(timeout=60)
        checks.check("a clean detach is not a rank gone",
                     "Watch stream broke" not in daemon.log.read_text())

        stopped = hold(daemon, 0)
        stopped.send_signal(signal.SIGSTOP)
        took_stopped = wait_until(lambda: not attached(daemon, 0), "the stopped rank noticed",
                                  timeout=30)
        checks.check(f"a stopped rank is noticed within {STOPPED_WITHIN} s",
                     took_stopped <= STOPPED_WITHIN, took_stopped)
        stopped.send_signal(signal.SIGKILL)
        stopped.send_signal(signal.SIGCONT)
        stopped.wait(timeout=30)

        killed = hold(daemon, 1)
        killed.send_signal(signal.SIGKILL)  # a zombie until reaped below
        took_killed = wait_until(lambda: not attached(daemon, 1), "the killed rank noticed",
                                 timeout=30)
        checks.check(f"a killed rank is noticed within {KILLED_WITHIN} s",
                     took_killed <= KILLED_WITHIN, took_killed)
        killed.wait(timeout=30)

        log = daemon.log.read_text()
        checks.check("the daemon says why, once per rank",
                     log.count("Watch stream broke") == 2, log[-1500:])
        again = daemon.dump_ranks("job", [0, 1], 1)
        checks.check("both ranks attach again and are served",
                     all(len(d["steps"]) == 1 for d in again.values()))
        print(f"liveness: a SIGSTOPped rank was noticed after {took_stopped:.1f} s, a SIGKILLed "
              f"(unreaped) one after {took_killed:.2f} s; both attached again and were served")
