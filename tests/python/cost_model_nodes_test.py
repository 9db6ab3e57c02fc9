"""One learned cost model on every node (docs/SCHEDULER.md, "One learned
model on every node"), end to end: two packfeedd on this machine, each
hosting two of a job's four ranks and each other's peer over TCP, with
scheduler.learn_cost_model. Each rank takes its microbatches through
packfeed.Client and sleeps what a hidden "true" model says its group's work
costs (cost_fit_test's model); the clients report those times. The leader
(the lesser admin address) fits both nodes' rows and announces version 1
ahead of every node's plans. Checked:
- both daemons plan every step by the same version, and the same plan, and
  version 1 is in force on both from the same step, which lies ahead of
  the steps the ranks had taken when it was fitted;
- a step planned by version 1 differs from the configured model's plan of
  it (the learned model is in use);
- the follower, restarted with its state_dir, plans by the versions it
  journaled; restarted without one, it takes them up from the leader."""
import tempfile
import threading
import unittest

from cost_fit_test import sleeping_rank
from daemon_harness import free_port, make_dataset, wait_until
from pf_test_support import BIN_DIR, Daemon, main

STEPS = 60
RANKS = 4
LEAD = 8


def node_config(prefix, port, peer_port, local_ranks, state_dir=None, learn=True):
    state = f'state_dir: "{state_dir}"\n' if state_dir else ""
    return f"""admin_tcp_address: "127.0.0.1:{port}"
admin_tcp_token: "nodes-secret"
peers: "127.0.0.1:{peer_port}"
peer_timeout_seconds: 30
{state}jobs {{
  name: "fit"
  datasets {{ prefix: "{prefix}" }}
  topology {{ dp: {RANKS} }}
  local_ranks: [{", ".join(map(str, local_ranks))}]
  global_batch: 32
  seq_length: 8192
  eod_id: 0
  append_eod: true
  scheduler {{ kind: "dynamic_cp" max_tokens_per_rank: 2048 learn_cost_model: {str(learn).lower()}
               learned_model_lead_steps: {LEAD} cp_upgrade_budget: 1.0 }}
}}
"""


def start_pair(first, second):
    """Starts two peers (each waits for the other at start-up)."""
    first.start(wait=False)
    second.start()
    wait_until(lambda: first.ctl_run("health").returncode == 0, f"{first.log} healthy")


class NodesTest(unittest.TestCase):
    def plan(self, daemon, step):
        return daemon.ctl_json("plan-step", "--job", "fit", str(step))

    def test_every_node_plans_by_the_same_learned_model(self):
        work = tempfile.mkdtemp(prefix="pf-cost-nodes-")
        prefix = make_dataset(BIN_DIR, f"{work}/data", "--count", "2000", "--dist",
                              "lognormal", "--min", "64", "--max", "8000", "--mean", "900",
                              "--sigma", "1.0", "--vocab", "1000", "--seed", "3")
        ports = sorted([free_port(), free_port()])  # a, the lesser address, leads
        a = Daemon(BIN_DIR, node_config(prefix, ports[0], ports[1], [0, 1],
                                        state_dir=f"{work}/a-state"), name="a", workdir=work)
        b = Daemon(BIN_DIR, node_config(prefix, ports[1], ports[0], [2, 3],
                                        state_dir=f"{work}/b-state"), name="b", workdir=work)
        errors = []

        start_pair(a, b)
        try:
            threads = [threading.Thread(target=sleeping_rank,
                                        args=("fit", r, (a if r < 2 else b).socket, STEPS, errors))
                       for r in range(RANKS)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=300)
            self.assertEqual(errors, [])
            plans = {name: [self.plan(d, s) for s in range(STEPS)]
                     for name, d in (("a", a), ("b", b))}
            fits = {name: d.ctl_json("cost-model", "--job", "fit")
                    for name, d in (("a", a), ("b", b))}
            leader_log = a.log.read_text()
        finally:
            a.stop()
            b.stop()
        versions = [p.get("cost_model_version", 0) for p in plans["a"]]
        self.assertEqual(versions, [p.get("cost_model_version", 0) for p in plans["b"]])
        self.assertIn(1, versions, leader_log[-3000:])
        first = versions.index(1)
        self.assertGreater(first, LEAD, "version 1 takes effect ahead of the planned steps")
        self.assertEqual(versions[:first], [0] * first)
        for step in range(STEPS):
            self.assertEqual(plans["a"][step]["microbatches"], plans["b"][step]["microbatches"],
                             f"step {step}: the nodes planned differently")
        self.assertIn("learned cost model version 1 plans every step from", leader_log)
        # Each node reports the version it holds, the same on both, none missed.
        for name, fit in fits.items():
            self.assertGreaterEqual(fit.get("model_version", 0), max(versions), name)
            self.assertEqual(fit.get("model_version", 0), fits["a"].get("model_version", 0))
            self.assertEqual(int(fit.get("model_versions_missed", 0)), 0, name)
        latest = fits["a"].get("model_version", 0)
        if latest == max(versions):  # not one announced for steps not planned yet
            self.assertEqual(int(fits["a"].get("model_from_step", 0)), versions.index(latest))

        # The learned model is in use: the configured model plans a step of
        # version 1 otherwise.
        configured = Daemon(BIN_DIR, node_config(prefix, free_port(), 1, [0, 1, 2, 3],
                                                 learn=False).replace(
            'peers: "127.0.0.1:1"\n', ""), name="configured", workdir=work)
        with configured:
            differ = [s for s in range(first, STEPS)
                      if self.plan(configured, s)["microbatches"] != plans["a"][s]["microbatches"]]
        self.assertTrue(differ, "version 1 plans every step as the configured model does")

        # The follower restarted: from its journal (beside a leader that
        # lost its own), then from the leader's (without its own journal).
        cases = [(Daemon(BIN_DIR, node_config(prefix, ports[0], ports[1], [0, 1]), name="a2",
                         workdir=work),
                  Daemon(BIN_DIR, node_config(prefix, ports[1], ports[0], [2, 3],
                                              state_dir=f"{work}/b-state"), name="b2",
                         workdir=work)),
                 (Daemon(BIN_DIR, node_config(prefix, ports[0], ports[1], [0, 1],
                                              state_dir=f"{work}/a-state"), name="a3",
                         workdir=work),
                  Daemon(BIN_DIR, node_config(prefix, ports[1], ports[0], [2, 3]), name="b3",
                         workdir=work))]
        for leader, follower in cases:
            start_pair(leader, follower)
            try:
                for step in (first - 1, first, STEPS - 1):
                    for node in (leader, follower):
                        again = self.plan(node, step)
                        self.assertEqual(again.get("cost_model_version", 0), versions[step],
                                         f"{node.log.name} step {step}")
                        self.assertEqual(again["microbatches"], plans["b"][step]["microbatches"])
            finally:
                follower.stop()
                leader.stop()
        print(f"version 1 from step {first}")


if __name__ == "__main__":
    main()
