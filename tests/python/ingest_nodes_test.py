"""Online ingest across nodes (docs/INGEST.md, Several nodes). A driver puts
each step into one daemon (the origin); a peer daemon hosting the other half
of every consumer job's ranks gets the sealed step's metadata and fetches,
daemon to daemon over UCX, only the samples its own ranks are planned. Every
rank on either node must get what the reference built here from the samples
put says (ingest_test's), the peer must hold less than the whole step, and
both daemons must free every step once their ranks consumed it.

Run twice: two daemons on this machine (TCP admin on 127.0.0.1), and two
"hosts" in network namespaces joined by a veth pair, as the operations tests
make them (skipped, with the reason, where namespaces are not allowed)."""
import json
import os
import pathlib
import random
import socket
import subprocess
import sys
import tempfile
import time
import unittest

import packfeed
from ingest_test import ACTOR, JOBS, REFERENCE, STREAM, check_step, grpo_step, served_order
from pf_test_support import BIN_DIR, main

STEPS = 2
SEED = 11
# Per job, the ranks of each node: actor TP2×CP2×DP2 split by DP rank, the
# reference job's DP4 split in two.
RANKS = {"origin": {"actor": range(0, 4), "ref": range(0, 2)},
         "peer": {"actor": range(4, 8), "ref": range(2, 4)}}
TOKEN = "nodes-secret"


def drive(socket_path):
    """The driver, in its own process (on the origin's "host"): puts every
    step in two puts, seals it; prints the seal replies."""
    rng = random.Random(SEED)
    producer = packfeed.Producer("rollouts", socket_path=socket_path, auth_token="driver-secret")
    sealed = []
    for step in range(STEPS):
        samples = grpo_step(rng, step)
        producer.put(step, samples[:16])
        producer.put(step, samples[16:])
        sealed.append(producer.seal(step))
    print(json.dumps(sealed))


def planned_for(plans, step, node_ranks):
    """The samples of `step` some CP group of the node's ranks is planned,
    over every job."""
    tp_of = {"actor": 2, "ref": 1}
    samples = set()
    for job, ranks in node_ranks.items():
        dp_cp = {rank // tp_of[job] for rank in ranks}  # TP innermost, then CP, then DP (PP 1)
        for microbatch in plans[(job, step)]["microbatches"]:
            for group in microbatch["groups"]:
                first, size = int(group["first_rank"]), int(group["size"])
                if any(first <= r < first + size for r in dp_cp):
                    samples.update(int(s["document"]) for s in group["sequences"])
    return samples


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def with_local_ranks(job_text, name, ranks):
    return job_text.replace(f'name: "{name}"\n',
                            f'name: "{name}"\n  local_ranks: [{", ".join(map(str, ranks))}]\n', 1)


class Node:
    """One packfeedd, run through `launch` (a command prefix: nothing, or
    `ip netns exec NAME`)."""

    def __init__(self, work, name, launch, address, peer_address):
        self.name, self.launch = name, launch
        self.socket = f"{work}/{name}.sock"
        self.log = pathlib.Path(work, f"{name}.log")
        text = (f'socket_path: "{self.socket}"\n'
                f'admin_tcp_address: "{address}"\nadmin_tcp_token: "{TOKEN}"\n'
                f'peers: "{peer_address}"\npeer_timeout_seconds: 30\n'
                + STREAM % ""
                + with_local_ranks(ACTOR, "actor", RANKS[name]["actor"])
                + with_local_ranks(REFERENCE, "ref", RANKS[name]["ref"]))
        self.config = pathlib.Path(work, f"{name}.textproto")
        self.config.write_text(text)
        with self.log.open("w") as log:
            self.process = subprocess.Popen([*launch, f"{BIN_DIR}/packfeedd", "--config",
                                             str(self.config)],
                                            stdout=log, stderr=subprocess.STDOUT)

    def ctl(self, *args):
        result = subprocess.run([f"{BIN_DIR}/packfeedctl", *args, "--socket", self.socket],
                                capture_output=True, text=True, timeout=60)
        return result

    def ctl_json(self, *args):
        result = self.ctl(*args, "--json")
        if result.returncode != 0:
            raise RuntimeError(f"packfeedctl {args}: {result.stderr}")
        return json.loads(result.stdout)

    def wait_ready(self):
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {self.log.read_text()}")
            if self.ctl("health").returncode == 0:
                return
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} did not become ready: {self.log.read_text()}")

    def dump(self, job, rank, steps=STEPS):
        return subprocess.Popen([*self.launch, f"{BIN_DIR}/packfeedctl", "dump", "--socket",
                                 self.socket, "--job", job, "--rank", str(rank), "--steps",
                                 str(steps), "--json"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def stream_stats(self):
        return next(s for s in self.ctl_json("stats")["ingest_streams"] if s["name"] == "rollouts")

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)
        return self.process.returncode


class IngestNodesTest(unittest.TestCase):

    def two_nodes(self, launch, addresses):
        """Runs the driver against the origin and checks every rank of both
        nodes; `launch` and `addresses` per node name."""
        work = tempfile.mkdtemp(prefix="pf-ingest-nodes-")
        nodes = {name: Node(work, name, launch[name], addresses[name],
                            addresses["peer" if name == "origin" else "origin"])
                 for name in ("origin", "peer")}
        try:
            for node in nodes.values():
                node.wait_ready()
            origin, peer = nodes["origin"], nodes["peer"]
            driver = subprocess.run([*launch["origin"], sys.executable, __file__, "--drive",
                                     origin.socket], capture_output=True, text=True, timeout=180)
            self.assertEqual(driver.returncode, 0, driver.stderr)
            self.assertEqual(json.loads(driver.stdout), [{"samples": 32, "groups": 8}] * STEPS)
            # The seal returned once the peer had the step: it holds only
            # the samples its ranks are planned.
            held = {name: node.stream_stats() for name, node in nodes.items()}
            put, fetched = int(held["origin"]["samples_put"]), int(held["peer"].get("samples_put", 0))
            self.assertEqual(put, 32 * STEPS)
            self.assertGreater(fetched, 0)
            self.assertLess(fetched, put)
            self.assertLess(int(held["peer"]["bytes_put"]), int(held["origin"]["bytes_put"]))
            self.assertIn("step 1 forwarded to peer", origin.log.read_text())
            # Plans agree on both nodes (asked while the steps are held).
            plans = {(job, step): origin.ctl_json("plan-step", "--job", job, str(step))
                     for job in ("actor", "ref") for step in range(STEPS)}
            for key, plan in plans.items():
                self.assertEqual(plan, peer.ctl_json("plan-step", "--job", key[0], str(key[1])))
            # The peer fetched exactly the samples its ranks' CP groups hold.
            self.assertEqual(fetched, sum(len(planned_for(plans, step, RANKS["peer"]))
                                          for step in range(STEPS)))
            dumps = {(job, rank): node.dump(job, rank) for node in nodes.values()
                     for job, ranks in RANKS[node.name].items() for rank in ranks}
            got = {}
            for key, process in dumps.items():
                out, err = process.communicate(timeout=180)
                self.assertEqual(process.returncode, 0, f"{key}: {err}")
                got[key] = [s["microbatches"] for s in json.loads(out)["steps"]]
            rng = random.Random(SEED)
            order = {step: served_order(grpo_step(rng, step)) for step in range(STEPS)}
            checks = sum(check_step(self, job, step, plans[(job, step)], got, order[step])
                         for job, *_ in JOBS for step in range(STEPS))
            # Every rank consumed every step: both nodes freed them all.
            deadline = time.time() + 10
            while any(int(n.stream_stats().get("bytes_held", 0)) for n in nodes.values()) \
                    and time.time() < deadline:
                time.sleep(0.1)
            for name, node in nodes.items():
                self.assertEqual(int(node.stream_stats().get("bytes_held", 0)), 0, name)
            print(f"{checks} microbatches on two nodes equal the reference; the peer fetched "
                  f"{fetched} of {put} samples ({held['peer']['bytes_put']} of "
                  f"{held['origin']['bytes_put']} bytes)")
        finally:
            codes = {name: node.stop() for name, node in nodes.items()}
        self.assertEqual(codes, {"origin": 0, "peer": 0})

    def test_two_daemons_on_one_machine(self):
        ports = {name: free_port() for name in ("origin", "peer")}
        self.two_nodes({"origin": [], "peer": []},
                       {name: f"127.0.0.1:{port}" for name, port in ports.items()})

    def test_a_peer_that_is_down_fails_the_seal_naming_it(self):
        """The step stays sealed on the origin; the driver learns which peer
        lacks it and, once that peer is back, seals again to forward it."""
        work = tempfile.mkdtemp(prefix="pf-ingest-nodes-")
        ports = {name: free_port() for name in ("origin", "peer")}
        address = {name: f"127.0.0.1:{port}" for name, port in ports.items()}
        origin = Node(work, "origin", [], address["origin"], address["peer"])
        peer = Node(work, "peer", [], address["peer"], address["origin"])
        try:
            origin.wait_ready()
            peer.wait_ready()
            self.assertEqual(peer.stop(), 0)
            producer = packfeed.Producer("rollouts", socket_path=origin.socket,
                                         auth_token="driver-secret")
            producer.put(0, grpo_step(random.Random(SEED), 0))
            with self.assertRaises(packfeed.errors.UnavailableError) as refused:
                producer.seal(0)
            self.assertIn(f"peer {address['peer']} did not take it", str(refused.exception))
            # Back, the peer gets the step when the driver seals it again.
            peer = Node(work, "peer", [], address["peer"], address["origin"])
            peer.wait_ready()
            deadline = time.time() + 20
            while True:  # until the origin's channel has reconnected
                try:
                    producer.seal(0)
                    self.fail("a sealed step sealed again")
                except packfeed.errors.UnavailableError:
                    self.assertLess(time.time(), deadline, "the peer is back, yet unreachable")
                    time.sleep(0.2)
                except packfeed.errors.AlreadyExistsError:
                    break
            self.assertIn("forwarded step 0 sealed", peer.log.read_text())
            # Sealed on the peer too (it came from the origin): refused by name.
            on_peer = packfeed.Producer("rollouts", socket_path=peer.socket,
                                        auth_token="driver-secret")
            with self.assertRaises(packfeed.errors.FailedPreconditionError) as refused:
                on_peer.seal(0)
            self.assertIn("seal it where it was put", str(refused.exception))
            dumps = [origin.dump("actor", 0, steps=1), peer.dump("actor", 4, steps=1)]
            for dump in dumps:
                out, err = dump.communicate(timeout=120)
                self.assertEqual(dump.returncode, 0, err)
                self.assertEqual(len(json.loads(out)["steps"]), 1)
        finally:
            peer.stop()
            self.assertEqual(origin.stop(), 0)

    def test_two_daemons_in_network_namespaces(self):
        if os.geteuid() != 0:
            self.skipTest("network namespaces need root")
        import multinode_netns_test as netns
        try:
            names = netns.make_hosts()
        except SystemExit:
            self.skipTest("network namespaces are not allowed here")
        try:
            hosts = {"origin": "a", "peer": "b"}
            self.two_nodes(
                {node: ["ip", "netns", "exec", names[host]] for node, host in hosts.items()},
                {node: f"{netns.HOSTS[host]}:{netns.PORT}" for node, host in hosts.items()})
        finally:
            netns.remove_hosts(names)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--drive":
        drive(sys.argv[2])
    else:
        main()
