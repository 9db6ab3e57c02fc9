#!/usr/bin/env python3
"""packfeedd's storage through a real slow filesystem (tests/slowfs: 2 ms per
request, 1 GiB/s, every byte counted by the filesystem itself):

- eight ranks (TP2 x CP2 x DP2) attaching in two waves: the filesystem
  counts exactly the distinct bytes of the samples served (amplification
  1.00, one page of slack per read), and the daemon's own figures agree;
- a rank re-attaching at a step the node no longer holds causes a re-read
  that the daemon counts (> 1.00) and names (job, rank, step);
- two jobs on the same dataset read it once;
- a read error, then a file truncated under the running daemon: one clear
  error to the ranks that need those bytes, while another job on another
  file keeps being served, byte for byte what a daemon reading the files
  directly serves;
- files changed under the running daemon (an index truncated, files
  deleted and locked, data rewritten in place): the daemon lives, serves
  what it opened or refuses by name, never new bytes as old.

ctest runs it under pytest, with the build's paths (tests/conftest.py); skipped: no /dev/fuse."""
import os
import pathlib
import tempfile

import pytest

from daemon_harness import Daemon
from slowfs_mount import SlowMount

PAGE = 4096
STEPS = 6


def job(name, prefix, tp=1, cp=1, dp=1):
    return f"""jobs {{
  name: "{name}"
  datasets {{ prefix: "{prefix}" }}
  topology {{ tp: {tp} cp: {cp} dp: {dp} }}
  global_batch: 16
  seq_length: 1024
  eod_id: 1000
  append_eod: true
  scheduler {{ kind: "balanced" max_tokens_per_rank: 2048 }}
}}
"""


def storage_of(daemon):
    return daemon.ctl_json("stats")["storage"]


def file_of(storage, name):
    return next(f for f in storage["files"] if f["path"].endswith(name))


def dump(daemon, job_name, ranks, steps, *extra):
    return daemon.dump_ranks(job_name, ranks, steps, *extra)


def read_once(checks, work, mount):
    prefix = mount.mount / "a"
    with Daemon(BIN, job("a", prefix, tp=2, cp=2, dp=2), name="once", workdir=work) as daemon:
        checks.check("nothing read before a rank attaches", mount.bytes_read("a.bin") == 0,
                     mount.bytes_read("a.bin"))
        # Two waves, as ranks attach over seconds: the first is pushed steps
        # ahead before the second arrives, which must still read nothing twice.
        dump(daemon, "a", range(4), STEPS)
        dump(daemon, "a", range(4, 8), STEPS)
        storage = storage_of(daemon)
        counted = mount.bytes_read("a.bin")
        a = file_of(storage, "a.bin")
        read, distinct, reads = int(a["bytes_read"]), int(a["distinct_bytes"]), int(a["reads"])
        checks.check("the filesystem counted what the daemon says it read", counted == read,
                     f"slowfs {counted}, daemon {read}")
        checks.check("bytes read = distinct bytes needed, one page per read",
                     distinct <= counted <= distinct + PAGE * reads,
                     f"read {counted}, distinct {distinct}, {reads} reads")
        checks.check("amplification <= 1.01", float(a["io_amplification"]) <= 1.01, a)
        checks.check("no re-read", int(storage.get("reread_events", 0)) == 0, storage)
        checks.check("read latency seen (>= 2 ms per request)",
                     float(a["read_latency_p50_ms"]) >= 2.0, a)
        print(f"read once: 8 ranks x {STEPS} steps through slowfs at 2 ms: slowfs counted "
              f"{counted} B in {reads} reads, the samples needed hold {distinct} B "
              f"(amplification {counted / distinct:.4f}); read p50 "
              f"{float(a['read_latency_p50_ms']):.2f} ms, p99 "
              f"{float(a['read_latency_p99_ms']):.2f} ms")

        # Every rank has left; the default budget keeps what was read, so
        # rank 0 restarting at step 0 (from a checkpoint) reads nothing.
        dump(daemon, "a", [0], 1)
        checks.check("a restart from a checkpoint reads nothing (kept)",
                     mount.bytes_read("a.bin") == counted, mount.bytes_read("a.bin"))

    # With a 1-byte budget nothing no step needs is kept: the restart reads
    # step 0 again, and the re-read is reported.
    mount.tell("reset")
    with Daemon(BIN, "memory_budget_bytes: 1\n" + job("a", prefix, tp=2, cp=2, dp=2),
                name="reread", workdir=work) as daemon:
        dump(daemon, "a", range(8), 1)
        first = mount.bytes_read("a.bin")
        dump(daemon, "a", [0], 1)
        storage = storage_of(daemon)
        a = file_of(storage, "a.bin")
        rereads = storage.get("rereads", [])
        checks.check("a re-read shows as amplification > 1", float(a["io_amplification"]) > 1.0, a)
        checks.check("and is named: job a, rank 0, step 0",
                     any(r["job"] == "a" and int(r.get("rank", 0)) == 0 and
                         int(r.get("step", 0)) == 0 for r in rereads), rereads)
        checks.check("the filesystem saw the re-read",
                     mount.bytes_read("a.bin") == int(a["bytes_read"]) > first,
                     f"{mount.bytes_read('a.bin')} vs {a['bytes_read']}")
        text = daemon.ctl_run("stats").stdout
        checks.check("packfeedctl stats names it", "job a rank 0 step 0" in text, text)
        print(f"re-read: rank 0 restarting at step 0 re-read {int(a['reread_bytes'])} B, "
              f"amplification now {float(a['io_amplification']):.3f}")


def two_jobs_read_once(checks, work, mount):
    mount.tell("reset")
    prefix = mount.mount / "a"
    # The same samples per step (same batch, seed and dataset) for both
    # jobs; the budget lets what one job has released serve the other.
    text = (job("actor", prefix, tp=2, cp=2, dp=2) + job("reference", prefix, dp=4) +
            "memory_budget_bytes: 268435456\n")
    with Daemon(BIN, text, name="two", workdir=work) as daemon:
        actor = dump(daemon, "actor", range(8), STEPS)
        reference = dump(daemon, "reference", range(4), STEPS)
        stats = daemon.ctl_json("stats")
        storage = stats["storage"]
        a = file_of(storage, "a.bin")
        jobs = {j["name"]: j for j in stats["jobs"]}
        counted = mount.bytes_read("a.bin")
        checks.check("both jobs share one open file", int(a["jobs"]) == 2, a)
        checks.check("read once for both", counted == int(a["distinct_bytes"]) > 0,
                     f"slowfs {counted}, distinct {a['distinct_bytes']}")
        checks.check("no byte read twice", int(storage.get("reread_events", 0)) == 0, storage)
        served = sum(len(d["steps"]) for d in list(actor.values()) + list(reference.values()))
        checks.check("and both were served", served == 12 * STEPS, served)
        print(f"two jobs, one dataset: {counted} B read for both (distinct "
              f"{a['distinct_bytes']} B); job 'reference' read "
              f"{jobs['reference'].get('bytes_read', 0)} B (the steps job 'actor' never fetched)")


def faults(checks, work, mount, source):
    mount.tell("reset")
    text = job("bad", mount.mount / "b", dp=2) + job("good", mount.mount / "a", dp=2)
    direct = job("good", source / "a", dp=2)
    with Daemon(BIN, direct, name="direct", workdir=work) as reference_daemon:
        want = dump(reference_daemon, "good", [0, 1], 2 * STEPS)
    with Daemon(BIN, text, name="faults", workdir=work) as daemon:
        mount.tell("fail=/b.bin")
        failed = daemon.start_dump("bad", 0, STEPS)
        _, stderr = failed.communicate(timeout=60)
        read_error = stderr.strip()
        checks.check("a read error ends the rank that needs the bytes", failed.returncode != 0,
                     stderr)
        checks.check("with one clear error naming the file",
                     "b.bin" in stderr and "cannot be served" in stderr, stderr)
        got = dump(daemon, "good", [0, 1], STEPS)
        checks.check("the other job keeps being served, right bytes",
                     all(got[r]["steps"] == want[r]["steps"][:STEPS] for r in (0, 1)))
        mount.tell("fail=")

        # Truncated under the running daemon: what lies past the new end
        # cannot be read; nothing else is handed out in its place.
        bin_path = source / "b.bin"
        os.truncate(bin_path, bin_path.stat().st_size // 4)
        cut = daemon.start_dump("bad", 1, STEPS, "--start-step", "2")
        _, stderr = cut.communicate(timeout=60)
        checks.check("a truncated file ends the rank that needs the lost bytes",
                     cut.returncode != 0 and "b.bin" in stderr and "end of file" in stderr,
                     stderr)
        got = dump(daemon, "good", [0, 1], STEPS, "--start-step", str(STEPS))
        checks.check("the other job still gets the right bytes",
                     all(got[r]["steps"] == want[r]["steps"][STEPS:] for r in (0, 1)))
        log = daemon.log.read_text()
        errors = [line for line in log.splitlines() if "b.bin" in line and "[error]" in line]
        checks.check("the daemon logged the read errors", len(errors) >= 2, log[-2000:])
        for what, message in (("read error", read_error), ("truncated", stderr.strip())):
            print(f"faults: {what} -> {message[message.find('job bad'):][:240]}")


def files_changed(checks, work, source):
    """Files changed under the running daemon, read directly (no FUSE):
    'cut' has its index truncated while served (a mapped index was SIGBUS
    for the whole daemon), 'gone' its files deleted and locked, 'rewritten'
    its data rewritten in place with other tokens of the same size and its
    modification time restored. The first two keep serving what they
    opened, byte for byte; the third's rank gets one clear error naming the
    file, the others go on, and a daemon restarted once the file is whole
    again serves it right."""
    names = ("cut", "gone", "rewritten")
    for seed, name in enumerate(names, start=3):
        checks.run("make-dataset", "--out", str(source / name), "--count", "300", "--min", "16",
                   "--max", "1024", "--mean", "300", "--vocab", "1000", "--seed", str(seed))
    text = "".join(job(name, source / name, dp=2) for name in names)
    with Daemon(BIN, text, name="reference", workdir=work) as reference_daemon:
        want = {name: dump(reference_daemon, name, [0, 1], 2 * STEPS) for name in names}
    bin_path = source / "rewritten.bin"
    original = bin_path.read_bytes()
    with Daemon(BIN, text, name="changed", workdir=work) as daemon:
        got = dump(daemon, "cut", [0, 1], STEPS)
        os.truncate(source / "cut.idx", (source / "cut.idx").stat().st_size // 4)
        for suffix in (".idx", ".bin"):
            (source / ("gone" + suffix)).chmod(0)
            (source / ("gone" + suffix)).unlink()
        later = dump(daemon, "cut", [0, 1], STEPS, "--start-step", str(STEPS))
        checks.check("an index truncated under the daemon: it lives and serves what it opened",
                     daemon.process.poll() is None and all(
                         got[r]["steps"] + later[r]["steps"] == want["cut"][r]["steps"]
                         for r in (0, 1)))
        gone = dump(daemon, "gone", [0, 1], 2 * STEPS)
        checks.check("files deleted and locked under the daemon: what it opened, byte for byte",
                     all(gone[r]["steps"] == want["gone"][r]["steps"] for r in (0, 1)))

        # As rsync --inplace -t leaves it: the same inode, the same size, and
        # the modification time the daemon saw put back; only the change
        # time (which no user can set) moves.
        stamp = bin_path.stat()
        changed = bytes(b ^ 0x5A for b in original)
        with open(bin_path, "r+b") as f:
            f.write(changed)
        os.utime(bin_path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
        now = bin_path.stat()
        assert (now.st_ino, now.st_size, now.st_mtime_ns) == (
            stamp.st_ino, stamp.st_size, stamp.st_mtime_ns), "the rewrite is not same-stamp"
        refused = daemon.start_dump("rewritten", 0, STEPS)
        out, stderr = refused.communicate(timeout=60)
        checks.check("data rewritten in place: the rank gets one clear error naming the file",
                     refused.returncode != 0 and "rewritten.bin: changed since it was opened"
                     in stderr, stderr)
        checks.check("and nothing of the new file is served as the old", not out.strip(),
                     out[:300])
        again = dump(daemon, "cut", [0, 1], STEPS, "--start-step", str(STEPS))
        checks.check("another job goes on after it, right bytes",
                     daemon.process.poll() is None and all(
                         again[r]["steps"] == want["cut"][r]["steps"][STEPS:] for r in (0, 1)))
        print(f"files changed: {stderr.strip()[stderr.find('job rewritten'):][:300]}")

    bin_path.write_bytes(original)
    restored = job("rewritten", source / "rewritten", dp=2)
    with Daemon(BIN, restored, name="restored", workdir=work) as daemon:
        back = dump(daemon, "rewritten", [0, 1], 2 * STEPS)
        checks.check("once the file is whole again, a restarted daemon serves it right",
                     all(back[r]["steps"] == want["rewritten"][r]["steps"] for r in (0, 1)))


def test_storage(bin_dir, slowfs, checks):
    global BIN
    BIN = bin_dir
    if not os.path.exists("/dev/fuse"):
        pytest.skip("/dev/fuse is missing (no FUSE in this machine)")
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        source = work / "src"
        source.mkdir()
        for name, count, seed in (("a", 600, 1), ("b", 600, 2)):
            checks.run("make-dataset", "--out", str(source / name), "--count", str(count),
                       "--min", "16", "--max", "1024", "--mean", "300", "--vocab", "1000",
                       "--seed", str(seed))
        mount = SlowMount(slowfs, source, work / "mnt", latency_ms=2, bandwidth_mib=1024)
        try:
            read_once(checks, work, mount)
            two_jobs_read_once(checks, work, mount)
            faults(checks, work, mount, source)
        finally:
            mount.close()
        files_changed(checks, work, source)
