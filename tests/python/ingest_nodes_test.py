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

    def __init__(self, work, name, launch, address, peer_address, extra=""):
        self.name, self.launch = name, launch
        self.socket = f"{work}/{name}.sock"
        self.log = pathlib.Path(work, f"{name}.log")
        text = (f'socket_path: "{self.socket}"\n'
                f'admin_tcp_address: "{address}"\nadmin_tcp_token: "{TOKEN}"\n'
                f'peers: "{peer_address}"\npeer_timeout_seconds: 30\n' + extra
                + STREAM % ""
                + with_local_ranks(ACTOR, "actor", RANKS[name]["actor"])
                + with_local_ranks(REFERENCE, "ref", RANKS[name]["ref"]))
        self.config = pathlib.Path(work, f"{name}.textproto")
        self.config.write_text(text)
        with self.log.open("a") as log:
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

    def dump(self, job, rank, steps=STEPS, start=0):
        return subprocess.Popen([*self.launch, f"{BIN_DIR}/packfeedctl", "dump", "--socket",
                                 self.socket, "--job", job, "--rank", str(rank), "--steps",
                                 str(steps), "--start-step", str(start), "--json"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def stream_stats(self):
        return next(s for s in self.ctl_json("stats")["ingest_streams"] if s["name"] == "rollouts")

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)
        return self.process.returncode

    def kill(self):
        self.process.kill()
        self.process.wait(timeout=30)

    def held_steps(self):
        return sorted(int(s.get("step", 0)) for s in self.stream_stats().get("steps", []))


def wait_for(what, condition, seconds=20):
    deadline = time.time() + seconds
    while not condition():
        if time.time() > deadline:
            raise AssertionError(f"not within {seconds} s: {what}")
        time.sleep(0.1)


def collect(testcase, dumps):
    """Each dump's microbatches per step, by (job, rank)."""
    got = {}
    for key, process in dumps.items():
        out, err = process.communicate(timeout=180)
        testcase.assertEqual(process.returncode, 0, f"{key}: {err}")
        got[key] = [s["microbatches"] for s in json.loads(out)["steps"]]
    return got


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
            self.assertEqual(json.loads(driver.stdout),
                             [{"samples": 32, "groups": 8, "peers_behind": []}] * STEPS)
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
            got = collect(self, dumps)
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

    def test_a_seal_does_not_wait_long_for_a_peer_that_is_down(self):
        """The seal answers after seal_wait_ms naming the peer without the
        step; the origin keeps it, and the peer gets it once it is back,
        with no seal again."""
        work = tempfile.mkdtemp(prefix="pf-ingest-nodes-")
        ports = {name: free_port() for name in ("origin", "peer")}
        address = {name: f"127.0.0.1:{port}" for name, port in ports.items()}
        origin = Node(work, "origin", [], address["origin"], address["peer"],
                      "ingest_peers { seal_wait_ms: 1500 }\n")
        peer = Node(work, "peer", [], address["peer"], address["origin"])
        try:
            origin.wait_ready()
            peer.wait_ready()
            self.assertEqual(peer.stop(), 0)
            producer = packfeed.Producer("rollouts", socket_path=origin.socket,
                                         auth_token="driver-secret")
            producer.put(0, grpo_step(random.Random(SEED), 0))
            started = time.time()
            sealed = producer.seal(0)
            waited = time.time() - started
            self.assertEqual(sealed["peers_behind"], [address["peer"]])
            self.assertLess(waited, 10, "the seal waited far longer than seal_wait_ms")
            self.assertIn(f"peers {address['peer']} did not take it within 1500 ms",
                          origin.log.read_text())
            # Sealing it again says which peer still lacks it.
            with self.assertRaises(packfeed.errors.AlreadyExistsError) as again:
                producer.seal(0)
            self.assertIn(f"peers {address['peer']} do not have it yet", str(again.exception))
            # Back, the peer gets the step from the origin by itself.
            peer = Node(work, "peer", [], address["peer"], address["origin"])
            peer.wait_ready()
            wait_for("the peer holds step 0", lambda: peer.held_steps() == [0])
            self.assertIn("forwarded step 0 sealed", peer.log.read_text())
            with self.assertRaises(packfeed.errors.AlreadyExistsError):
                producer.seal(0)
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

    def test_a_peer_killed_and_restarted_gets_back_the_steps_it_lost(self):
        """Four steps sealed; the origin's ranks consume all of them, the
        peer's ranks two; the peer is killed (SIGKILL) and restarted with
        its ledger. The origin kept steps 2 and 3 for it and forwards them
        again: every rank's microbatches equal the reference, each once."""
        steps = 4
        work = tempfile.mkdtemp(prefix="pf-ingest-nodes-")
        ports = {name: free_port() for name in ("origin", "peer")}
        address = {name: f"127.0.0.1:{port}" for name, port in ports.items()}
        peer_extra = f'state_dir: "{work}/peer-state"\n'
        origin = Node(work, "origin", [], address["origin"], address["peer"])
        peer = Node(work, "peer", [], address["peer"], address["origin"], peer_extra)
        rng = random.Random(SEED)
        puts = [grpo_step(rng, step) for step in range(steps)]
        try:
            origin.wait_ready()
            peer.wait_ready()
            producer = packfeed.Producer("rollouts", socket_path=origin.socket,
                                         auth_token="driver-secret")
            for step in range(steps):
                producer.put(step, puts[step])
                self.assertEqual(producer.seal(step)["peers_behind"], [])
            plans = {(job, step): origin.ctl_json("plan-step", "--job", job, str(step))
                     for job in ("actor", "ref") for step in range(steps)}
            got = collect(self, {(job, rank): origin.dump(job, rank, steps=steps)
                                 for job, ranks in RANKS["origin"].items() for rank in ranks})
            before = collect(self, {(job, rank): peer.dump(job, rank, steps=2)
                                    for job, ranks in RANKS["peer"].items() for rank in ranks})
            # The origin's ranks are done, yet it keeps what the peer's are
            # not: steps 2 and 3 (0 and 1 freed once the peer said so).
            wait_for("the origin holds steps 2 and 3 only",
                     lambda: origin.held_steps() == [2, 3])
            self.assertEqual(peer.held_steps(), [2, 3])
            peer.kill()
            peer = Node(work, "peer", [], address["peer"], address["origin"], peer_extra)
            peer.wait_ready()
            wait_for("the restarted peer holds steps 2 and 3 again",
                     lambda: peer.held_steps() == [2, 3])
            self.assertIn("no longer holds step 2", origin.log.read_text())
            after = collect(self, {(job, rank): peer.dump(job, rank, steps=2, start=2)
                                   for job, ranks in RANKS["peer"].items() for rank in ranks})
            for key in before:
                got[key] = before[key] + after[key]
            order = {step: served_order(puts[step]) for step in range(steps)}
            checks = sum(check_step(self, job, step, plans[(job, step)], got, order[step])
                         for job, *_ in JOBS for step in range(steps))
            # The peer's ledger, replayed after the kill: nothing taken twice
            # or skipped.
            for job in RANKS["peer"]:
                ranks = peer.ctl_json("ledger", "--job", job)["jobs"][0]["ranks"]
                self.assertEqual(len(ranks), len(RANKS["peer"][job]))
                for rank in ranks:
                    self.assertEqual(int(rank.get("duplicates", 0)), 0, rank)
                    self.assertEqual(int(rank.get("gaps", 0)), 0, rank)
            wait_for("both nodes free every step",
                     lambda: origin.held_steps() == [] and peer.held_steps() == [])
            print(f"peer killed after 2 of {steps} steps and restarted: the origin kept and "
                  f"forwarded again steps 2-3; {checks} microbatches equal the reference")
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
