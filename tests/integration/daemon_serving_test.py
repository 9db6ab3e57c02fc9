"""packfeedd end to end on generated datasets, against thd_reference.py:
TP2×PP2×CP2×DP2 with balanced and dynamic_cp; two daemons hosting halves of
the ranks; two jobs of different topologies on one daemon; two jobs on one
dataset at different times read it once (the default budget); every attach
error; a client killed mid-stream.

ctest runs it under pytest, with the build's paths (tests/conftest.py)."""
import signal
import subprocess
import tempfile

import pytest

from daemon_harness import Daemon, free_port, make_dataset, ranks_over_tcp, wait_until
from serving_reference import EOD, compare, expected_dumps, job_text
from thd_reference import Dataset


@pytest.fixture(scope="module")
def workdir():
    return tempfile.mkdtemp(prefix="pf-serving-")


@pytest.fixture(scope="module")
def prefix(bin_dir, workdir):
    """The generated dataset every test serves."""
    return make_dataset(bin_dir, f"{workdir}/data", "--count", "600", "--dist", "lognormal",
                        "--min", "8", "--max", "520", "--mean", "120", "--sigma", "1.0",
                        "--vocab", str(EOD), "--seed", "5")


@pytest.fixture(scope="module")
def dataset(prefix):
    return Dataset(prefix)


@pytest.mark.parametrize("scheduler", ["balanced", "dynamic_cp"])
def test_reference(checks, bin_dir, prefix, dataset, scheduler):
    label = f"16 ranks {scheduler}"
    with Daemon(bin_dir, job_text("job", prefix, scheduler=scheduler), name=scheduler) as daemon:
        dumps = daemon.dump_ranks("job", range(16), steps=2)
        stats = daemon.ctl_json("stats")["jobs"][0]
        expected = expected_dumps(daemon, "job", dataset, (2, 2, 2, 2), scheduler == "dynamic_cp", 2)
    compare(checks, label, dumps, expected)
    checks.check(f"{label}: I/O amplification 1.00", stats["io_amplification"] == 1.0,
                 stats["io_amplification"])
    # Documents past SEQ_LENGTH are split, not truncated (the default).
    checks.check(f"{label}: long documents split, none truncated",
                 int(stats["documents_split"]) > 0 and int(stats["tokens_truncated"]) == 0,
                 stats)
    print(f"{label}: 16 ranks × 2 steps compared; I/O amplification {stats['io_amplification']}, "
          f"{stats['bytes_read']} bytes read")


def test_two_daemons(checks, bin_dir, prefix, dataset, workdir):
    halves = [list(range(8)), list(range(8, 16))]
    a = Daemon(bin_dir, job_text("job", prefix, local_ranks=halves[0]), "node0", workdir)
    b = Daemon(bin_dir, job_text("job", prefix, local_ranks=halves[1]), "node1", workdir)
    other = Daemon(bin_dir, job_text("job", prefix, seed=8), "other", workdir)
    with a, b, other:
        fingerprints = [d.ctl_json("jobs")["jobs"][0]["fingerprint"] for d in (a, b, other)]
        checks.check("two nodes: same fingerprint", fingerprints[0] == fingerprints[1], fingerprints)
        procs = {**{r: a.start_dump("job", r, 2) for r in halves[0]},
                 **{r: b.start_dump("job", r, 2) for r in halves[1]}}
        dumps = {}
        import json
        for rank, process in procs.items():
            stdout, stderr = process.communicate(timeout=120)
            checks.check(f"two nodes: rank {rank} served", process.returncode == 0, stderr)
            if process.returncode == 0:
                dumps[rank] = json.loads(stdout)
        refused = other.ctl_run("dump", "--job", "job", "--rank", "0", "--fingerprint", fingerprints[0])
        checks.check("a daemon with another seed refuses the fingerprint",
                     refused.returncode != 0 and "sampler differ" in refused.stderr, refused.stderr)
        wrong_rank = a.ctl_run("dump", "--job", "job", "--rank", "12")
        checks.check("node0 refuses a rank of node1",
                     wrong_rank.returncode != 0 and "not hosted" in wrong_rank.stderr, wrong_rank.stderr)
        expected = expected_dumps(a, "job", dataset, (2, 2, 2, 2), True, 2)
    compare(checks, "two nodes", dumps, expected)


def test_two_jobs(checks, bin_dir, prefix, dataset):
    text = (job_text("small", prefix, tp=1, pp=1, cp=2, dp=2, scheduler="balanced") +
            job_text("wide", prefix, tp=2, pp=1, cp=1, dp=4, scheduler="dynamic_cp", seed=3))
    with Daemon(bin_dir, text, name="twojobs") as daemon:
        procs = {("small", r): daemon.start_dump("small", r, 2) for r in range(4)}
        procs.update({("wide", r): daemon.start_dump("wide", r, 2) for r in range(8)})
        import json
        dumps = {"small": {}, "wide": {}}
        for (job, rank), process in procs.items():
            stdout, stderr = process.communicate(timeout=120)
            checks.check(f"two jobs: {job} rank {rank}", process.returncode == 0, stderr)
            if process.returncode == 0:
                dumps[job][rank] = json.loads(stdout)
        compare(checks, "two jobs: small", dumps["small"],
                expected_dumps(daemon, "small", dataset, (1, 1, 2, 2), False, 2))
        compare(checks, "two jobs: wide", dumps["wide"],
                expected_dumps(daemon, "wide", dataset, (2, 1, 1, 4), True, 2))


def test_two_jobs_read_once(checks, bin_dir, prefix):
    """Two jobs on one dataset (same seed: the same samples), the second
    started only after the first consumed its steps, as a second job on the
    node or an evaluation run would: with the default budget (a quarter of
    the node's memory) the second reads nothing again. With a budget of
    1 byte nothing is kept and it reads the samples a second time, which
    shows what the default buys."""
    text = (job_text("early", prefix, tp=1, pp=1, cp=1, dp=2, scheduler="balanced") +
            job_text("late", prefix, tp=1, pp=1, cp=1, dp=2, scheduler="balanced"))
    figures = {}
    for label, budget in (("default budget", ""), ("1-byte budget", "memory_budget_bytes: 1\n")):
        with Daemon(bin_dir, budget + text, name=f"readonce{len(budget)}") as daemon:
            early = {r: d["steps"] for r, d in daemon.dump_ranks("early", range(2), 4).items()}
            late = {r: d["steps"] for r, d in daemon.dump_ranks("late", range(2), 4).items()}
            checks.check(f"read once ({label}): both jobs served the same batches",
                         early == late and len(early) == 2, (len(early), len(late)))
            storage = daemon.ctl_json("stats")["storage"]
        figures[label] = (float(storage["io_amplification"]), int(storage["bytes_read"]),
                          int(storage.get("bytes_kept", 0)), int(storage["memory_budget_bytes"]))
    amplification, read, kept, budget = figures["default budget"]
    checks.check("read once: the default budget is set (not unbounded)", budget > 1 << 20, budget)
    checks.check("read once: the late job read nothing again (amplification 1.00)",
                 amplification == 1.0, figures)
    checks.check("read once: samples no step needs are kept for it", kept > 0, figures)
    # Not exactly 2: a request that reads adjacent samples for the late job
    # may also cover what the early one still held.
    checks.check("read once: with nothing kept the late job reads again (amplification > 1.5)",
                 figures["1-byte budget"][0] > 1.5, figures)
    print(f"two jobs read once: amplification {amplification} ({read} bytes read, {kept} kept, "
          f"budget {budget >> 20} MiB); with a 1-byte budget {figures['1-byte budget'][0]}")


def test_ranks_over_tcp(checks, bin_dir, prefix):
    """Ranks on a node without a daemon attach over its TCP address
    (ranks_over_tcp) and get the bytes a rank on its socket gets."""
    port = free_port()
    address = f"127.0.0.1:{port}"
    tcp = ranks_over_tcp(address)
    text = job_text("job", prefix, tp=1, pp=1, token="s3cret")
    with Daemon(bin_dir, tcp + text, name="over_tcp") as daemon:
        local = daemon.dump_ranks("job", range(4), 2, "--token", "s3cret")
        # Over TCP the same steps again are a rewind, which a new process
        # may ask only with the admin token.
        rewind = daemon.ctl_run("dump", "--job", "job", "--rank", "1", "--address", address,
                                "--token", "s3cret")
        checks.check("over TCP a rewind without the admin token is refused, saying why",
                     rewind.returncode != 0 and "would serve again what it consumed"
                     in rewind.stderr, rewind.stderr.strip())
        # UCX over TCP as between nodes, and UCX's own choice.
        admin = ("--admin-token", "adm")
        remote = daemon.dump_ranks("job", range(4), 2, "--token", "s3cret", "--address", address,
                                   "--ucx-transports", "tcp", *admin)
        chosen = daemon.dump_ranks("job", range(4), 2, "--token", "s3cret", "--address", address,
                                   *admin)
        checks.check("ranks over TCP get the bytes of ranks on the socket", remote == local)
        checks.check("the same with UCX's choice of transport", chosen == local)
        log = daemon.log.read_text()
        checks.check("the daemon says where a rank attached from",
                     "job job rank 3: attaching over TCP from ipv4:127.0.0.1:" in log, log[-2000:])
        cases = [
            ("wrong token", ["--token", "guess"], "PERMISSION_DENIED: describe job job: wrong auth"),
            ("a ring shared by file descriptor", ["--token", "s3cret", "--ring-sharing", "fd"],
             "a ring shared by file descriptor needs the daemon on this node"),
            ("TLS files without a CA", ["--token", "s3cret", "--tls-cert", "c.pem"],
             "need tls_ca_file"),
        ]
        for name, args, message in cases:
            result = daemon.ctl_run("dump", "--job", "job", "--rank", "1", "--address", address,
                                    *args)
            checks.check(f"over TCP: {name} is refused", result.returncode != 0
                         and message in result.stderr, result.stderr.strip())
    # A daemon whose TCP address takes no ranks says so.
    with Daemon(bin_dir, tcp.replace("ranks_over_tcp: true\n", "") + text,
                name="admin_only") as daemon:
        result = daemon.ctl_run("dump", "--job", "job", "--rank", "1", "--token", "s3cret",
                                "--address", address)
        checks.check("over TCP without ranks_over_tcp: refused, naming the setting",
                     result.returncode != 0 and "UNIMPLEMENTED" in result.stderr
                     and "ranks_over_tcp" in result.stderr, result.stderr.strip())
    print(f"ranks over TCP: 4 ranks x 2 steps equal to the socket's, over UCX's tcp and its "
          f"own choice; {len(cases) + 1} refusals named")


def test_attach_errors(checks, bin_dir, prefix):
    text = job_text("job", prefix, tp=1, pp=1, token="s3cret", local_ranks=[0, 1, 2])
    with Daemon(bin_dir, text, name="errors") as daemon:
        fingerprint = daemon.ctl_json("jobs")["jobs"][0]["fingerprint"]
        parts = fingerprint.split("-")
        parts[2] = "t" + ("00000000" if parts[2] != "t00000000" else "11111111")
        wrong_fp = "-".join(parts)
        holder = daemon.start_dump("job", 0, 1, "--token", "s3cret", "--hold-seconds", "4")
        wait_until(lambda: daemon.rank_stats("job", 0).get("attached"), "rank 0 attached")
        cases = [
            ("unknown job", ["--job", "nope", "--rank", "1", "--token", "s3cret"], "no job 'nope'"),
            ("wrong token", ["--job", "job", "--rank", "1", "--token", "guess"], "wrong auth token"),
            ("rank outside", ["--job", "job", "--rank", "4", "--token", "s3cret"], "outside job job's world of 4"),
            ("rank not local", ["--job", "job", "--rank", "3", "--token", "s3cret"], "not hosted"),
            ("wrong fingerprint", ["--job", "job", "--rank", "1", "--token", "s3cret",
                                   "--fingerprint", wrong_fp], "topology differ"),
            ("slots too small", ["--job", "job", "--rank", "1", "--token", "s3cret", "--slot-bytes", "4096"],
             "are needed"),
            ("rank already attached", ["--job", "job", "--rank", "0", "--token", "s3cret"], "already attached"),
        ]
        for name, args, message in cases:
            result = daemon.ctl_run("dump", *args)
            checks.check(f"attach error: {name}", result.returncode != 0 and message in result.stderr,
                         result.stderr.strip())
            print(f"  {name}: {result.stderr.strip().splitlines()[-1] if result.stderr else ''}")
        holder.communicate(timeout=30)
        checks.check("the holder was served meanwhile", holder.returncode == 0)
        served = daemon.ctl_run("dump", "--job", "job", "--rank", "1", "--token", "s3cret")
        checks.check("after every refusal the daemon serves", served.returncode == 0, served.stderr)
        drain = daemon.ctl_run("drain")
        checks.check("drain without the token is refused",
                     drain.returncode != 0 and "auth token" in drain.stderr, drain.stderr)
        # With the token: every attached rank is told goodbye, the daemon exits 0.
        rank = daemon.start_dump("job", 1, 100000, "--token", "s3cret")
        wait_until(lambda: daemon.rank_stats("job", 1).get("attached"), "rank 1 attached")
        drain = daemon.ctl_run("drain", "--token", "s3cret")
        checks.check("drain with the token is accepted", drain.returncode == 0, drain.stderr)
        try:
            code = daemon.process.wait(timeout=20)
            checks.check("a drained daemon exits 0", code == 0, f"exit {code}")
        except subprocess.TimeoutExpired:
            checks.check("a drained daemon exits", False, "still running 20 s after drain")
        _, stderr = rank.communicate(timeout=20)
        checks.check("the attached rank was told the daemon went away",
                     rank.returncode != 0 and "UNAVAILABLE" in stderr
                     and "the sender closed it" in stderr, stderr)
        print(f"  drain: the attached rank ended with: {stderr.strip().splitlines()[-1]}")


def test_client_killed(checks, bin_dir, prefix, dataset):
    with Daemon(bin_dir, job_text("job", prefix, tp=1, pp=1, scheduler="balanced"), name="kill") as daemon:
        victim = daemon.start_dump("job", 0, 100000)
        wait_until(lambda: daemon.rank_stats("job", 0).get("attached"), "rank 0 attached")
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        others = daemon.dump_ranks("job", [1, 2, 3], steps=4)
        expected = expected_dumps(daemon, "job", dataset, (1, 1, 2, 2), False, 4)
        compare(checks, "after a rank was killed", others, expected)
        # UCX keepalive (about a second) notices the dead rank.
        try:
            took = wait_until(lambda: not daemon.rank_stats("job", 0).get("attached"),
                              "the killed rank detached", timeout=10)
            checks.check("the killed rank is no longer attached", True)
            print(f"  the killed rank was noticed {took:.1f} s after the others finished")
        except TimeoutError as error:
            checks.check("the killed rank is no longer attached", False, error)
        again = daemon.dump_ranks("job", [0], steps=1)
        compare(checks, "the killed rank re-attached", again, expected)
