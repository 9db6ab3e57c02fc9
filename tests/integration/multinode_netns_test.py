"""Two "hosts" in network namespaces the test makes (veth, 10.213.7.0/30):
a packfeedd in each hosting half of the ranks, checking the other's
fingerprint over TCP at start-up, and clients in each namespace receiving
their ranks' data, each rank's fields equal to the reference built from the
plan and the files. Then one daemon hosting every rank, host b's ranks
attaching over TCP (ranks_over_tcp) with no daemon of their own: the same
bytes. A daemon whose job differs from its peer's, one with another admin
token, and one whose peer never answers, fail start-up with one clear line.

Skips (exit 77, with the reason) where the machine forbids network
namespaces (not root, or `ip netns add` refused).

ctest runs it under pytest, with the build's paths (tests/conftest.py)."""
import json
import os
import pathlib
import subprocess
import tempfile
import time

import pytest

from daemon_harness import make_dataset
from serving_reference import compare, expected_dumps, job_text
from thd_reference import Dataset

SUFFIX = str(os.getpid())
HOSTS = {"a": "10.213.7.1", "b": "10.213.7.2"}
PORT = 7070


def ip(*args):
    return subprocess.run(["ip", *args], capture_output=True, text=True)


def make_hosts():
    """The two namespaces joined by a veth pair; returns their names."""
    names = {host: f"pf-{host}-{SUFFIX}" for host in HOSTS}
    for name in names.values():
        made = ip("netns", "add", name)
        if made.returncode != 0:
            remove_hosts(names)
            pytest.skip(f"network namespaces are not allowed here: {made.stderr.strip()}")
        ip("-n", name, "link", "set", "lo", "up")
    ip("link", "add", f"pfva{SUFFIX}", "type", "veth", "peer", "name", f"pfvb{SUFFIX}")
    for host, device in (("a", f"pfva{SUFFIX}"), ("b", f"pfvb{SUFFIX}")):
        ip("link", "set", device, "netns", names[host])
        ip("-n", names[host], "addr", "add", f"{HOSTS[host]}/30", "dev", device)
        ip("-n", names[host], "link", "set", device, "up")
    return names


def remove_hosts(names):
    for name in names.values():
        ip("netns", "del", name)  # only the namespaces this test made


def config(work, host, local_ranks, peers, seed=7, port=PORT, timeout=60, token="nodes-secret"):
    text = (f'socket_path: "{work}/{host}-{port}.sock"\n'
            f'admin_tcp_address: "{HOSTS[host]}:{port}"\n'
            f'admin_tcp_token: "{token}"\n'
            + "".join(f'peers: "{peer}"\n' for peer in peers)
            + f"peer_timeout_seconds: {timeout}\n"
            + job_text("job", f"{work}/data", local_ranks=local_ranks, seed=seed))
    path = pathlib.Path(work, f"{host}-{port}.textproto")
    path.write_text(text)
    return path


def start(bin_dir, names, host, path, log):
    return subprocess.Popen(["ip", "netns", "exec", names[host], f"{bin_dir}/packfeedd",
                             "--config", str(path)],
                            stdout=open(log, "w"), stderr=subprocess.STDOUT)


def wait_healthy(bin_dir, socket, process, log):
    deadline = time.time() + 60
    while time.time() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"packfeedd exited {process.returncode}: {pathlib.Path(log).read_text()}")
        if subprocess.run([f"{bin_dir}/packfeedctl", "health", "--socket", socket],
                          capture_output=True).returncode == 0:
            return
        time.sleep(0.2)
    raise RuntimeError(f"packfeedd did not become ready: {pathlib.Path(log).read_text()}")


class Ctl:
    """packfeedctl against one daemon's socket (reachable from any network
    namespace: it is a file)."""

    def __init__(self, bin_dir, socket):
        self.bin_dir, self.socket = bin_dir, socket

    def ctl_json(self, *args):
        result = subprocess.run([f"{self.bin_dir}/packfeedctl", *args, "--socket", self.socket,
                                 "--json"], capture_output=True, text=True, check=True)
        return json.loads(result.stdout)


def failed_start(checks, bin_dir, names, work, name, path, expected):
    result = subprocess.run(["ip", "netns", "exec", names["b"], f"{bin_dir}/packfeedd",
                             "--config", str(path)], capture_output=True, text=True, timeout=60)
    errors = [line for line in (result.stdout + result.stderr).splitlines() if "[error]" in line]
    checks.check(f"{name}: start-up fails", result.returncode != 0, result.returncode)
    checks.check(f"{name}: one error line saying {expected!r}",
                 len(errors) == 1 and all(e in errors[0] for e in expected), errors)


def remote_ranks(checks, bin_dir, names, work, expected):
    """One daemon on host a hosting all 16 ranks (ranks_over_tcp); host b's
    ranks, with no daemon of their own, attach over TCP and get the same
    bytes as before."""
    port = 7075
    path = config(work, "a", list(range(16)), [], port=port)
    path.write_text(path.read_text().replace(
        "peer_timeout_seconds", "ranks_over_tcp: true\nranks_over_tcp_without_tls: true\npeer_timeout_seconds")
        .replace('auth_token: ""', 'auth_token: "s3cret"'))
    log = f"{work}/a-remote.log"
    daemon = start(bin_dir, names, "a", path, log)
    try:
        wait_healthy(bin_dir, f"{work}/a-{port}.sock", daemon, log)
        # UCX over the veth as between nodes (its own choice could be shared
        # memory: the namespaces share /dev/shm), and one rank with its choice.
        ranks = {r: subprocess.Popen(
            ["ip", "netns", "exec", names["b"], f"{bin_dir}/packfeedctl", "dump", "--address",
             f"{HOSTS['a']}:{port}", "--token", "s3cret", "--job", "job", "--rank", str(r),
             "--steps", "2", "--json", *(["--ucx-transports", "tcp"] if r != 15 else [])],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(8, 16)}
        dumps = {}
        for rank, process in ranks.items():
            stdout, stderr = process.communicate(timeout=120)
            checks.check(f"host b rank {rank} served over TCP by host a", process.returncode == 0,
                         stderr)
            if process.returncode == 0:
                dumps[rank] = json.loads(stdout)
        checks.check("every rank of host b served by host a", sorted(dumps) == list(range(8, 16)),
                     sorted(dumps))
        compare(checks, "ranks over TCP", dumps, expected)
        text = pathlib.Path(log).read_text()
        checks.check("host a says rank 8 attached over TCP from host b",
                     f"rank 8: attaching over TCP from ipv4:{HOSTS['b']}:" in text, text[-3000:])
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
    checks.check("the daemon of remote ranks exits 0 on SIGTERM", daemon.returncode == 0,
                 daemon.returncode)


def test_nodes_in_network_namespaces(bin_dir, checks):
    work = tempfile.mkdtemp(prefix="pf-netns-")
    make_dataset(bin_dir, f"{work}/data", "--count", "300", "--min", "8", "--max", "400",
                 "--mean", "100", "--vocab", "32000")
    names = make_hosts()
    daemons = []
    try:
        halves = {"a": list(range(8)), "b": list(range(8, 16))}
        other = {"a": "b", "b": "a"}
        paths = {h: config(work, h, halves[h], [f"{HOSTS[other[h]]}:{PORT}"]) for h in HOSTS}
        logs = {h: f"{work}/{h}.log" for h in HOSTS}
        for host in HOSTS:
            daemons.append(start(bin_dir, names, host, paths[host], logs[host]))
        for host, process in zip(HOSTS, daemons):
            wait_healthy(bin_dir, f"{work}/{host}-{PORT}.sock", process, logs[host])
        for host in HOSTS:
            text = pathlib.Path(logs[host]).read_text()
            checks.check(f"host {host} checked its peer over TCP",
                         f"peer {HOSTS[other[host]]}:{PORT}: 1 job(s) with the same fingerprints"
                         in text, text)
        clients = {(h, r): subprocess.Popen(
            ["ip", "netns", "exec", names[h], f"{bin_dir}/packfeedctl", "dump", "--socket",
             f"{work}/{h}-{PORT}.sock", "--job", "job", "--rank", str(r), "--steps", "2", "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for h in HOSTS for r in halves[h]}
        dumps = {}
        for (host, rank), process in clients.items():
            stdout, stderr = process.communicate(timeout=120)
            checks.check(f"host {host} rank {rank} served in its namespace",
                         process.returncode == 0, stderr)
            if process.returncode == 0:
                dumps[rank] = json.loads(stdout)
        # Every rank's bytes, from either host, equal the reference built
        # from the plan and the files (the plan asked of host a).
        expected = expected_dumps(Ctl(bin_dir, f"{work}/a-{PORT}.sock"), "job",
                                  Dataset(f"{work}/data"), (2, 2, 2, 2), True, 2)
        checks.check("every rank of both hosts served", sorted(dumps) == list(range(16)),
                     sorted(dumps))
        compare(checks, "two hosts", dumps, expected)
        failed_start(checks, bin_dir, names, work, "a peer with another seed",
                     config(work, "b", halves["b"], [f"{HOSTS['a']}:{PORT}"], seed=8, port=7071),
                     ["fingerprint", "sampler differ", f"{HOSTS['a']}:{PORT}"])
        failed_start(checks, bin_dir, names, work, "a peer with another admin token",
                     config(work, "b", halves["b"], [f"{HOSTS['a']}:{PORT}"], port=7073,
                            token="wrong"),
                     [f"peer {HOSTS['a']}:{PORT} refused the check", "admin token"])
        failed_start(checks, bin_dir, names, work, "a peer whose ranks overlap this node's",
                     config(work, "b", list(range(6, 16)), [f"{HOSTS['a']}:{PORT}"], port=7074),
                     ["do not partition its 16 ranks", "rank 6 is hosted 2 times",
                      f"peer {HOSTS['a']}:{PORT}"])
        failed_start(checks, bin_dir, names, work, "a peer that never answers",
                     config(work, "b", halves["b"], [f"{HOSTS['a']}:7999"], port=7072, timeout=2),
                     [f"peer {HOSTS['a']}:7999 did not answer within 2 s"])
        remote_ranks(checks, bin_dir, names, work, expected)
        print(f"two hosts: {len(clients)} ranks served across namespaces, each equal to the "
              "reference; fingerprints and the "
              "rank partition checked over TCP; a mismatched, an overlapping, a wrong-token and "
              "a silent peer refused")
    finally:
        for process in daemons:
            process.terminate()
            process.wait(timeout=30)
        remove_hosts(names)
    checks.check("daemons exit 0 on SIGTERM", all(p.returncode == 0 for p in daemons),
                 [p.returncode for p in daemons])
