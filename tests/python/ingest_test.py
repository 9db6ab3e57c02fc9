"""Online ingest end to end (docs/INGEST.md): a driver shaped like verl's puts
each step's GRPO rollouts into a real packfeedd through packfeed.Producer
(bulk bytes over UCX); an actor job (TP2×CP2×DP2, dynamic CP) and a
reference job (DP4) consume every sealed step. Each rank's tensors are
compared with an independent reference built here from the samples put and
the served plan (thd_reference.py, the contract written in Python). Then
backpressure and every bad put the daemon must refuse without harming
anyone else."""
import json
import random
import signal
import tempfile
import threading
import time
import unittest

import numpy as np
import torch

import packfeed
from pf_test_support import BIN_DIR, Daemon, main
from reliability_support import Workers
from thd_reference import coords, rank_fields, rank_positions, run_key, side_field

LAYERS, TOP_K = 8, 2
STREAM = """
ingest_streams {
  name: "rollouts"
  auth_token: "driver-secret"
  fields { name: "logprobs" dtype: "float32" }
  fields { name: "advantages" dtype: "float32" }
  fields { name: "experts" dtype: "int16" inner_shape: [8, 2] }
  %s
}
"""
ACTOR = """
jobs {
  name: "actor"
  ingest_stream: "rollouts"
  topology { tp: 2 cp: 2 dp: 2 }
  global_batch: 64
  seq_length: 1024
  model { num_layers: 8 }
  side_fields { name: "logprobs" dtype: "float32" align: ALIGN_LABELS }
  side_fields { name: "advantages" dtype: "float32" align: ALIGN_LABELS }
  side_fields { name: "experts" dtype: "int16" inner_shape: [8, 2] pad_value: -1 layer_axis: true }
  scheduler { kind: "dynamic_cp" max_tokens_per_rank: 512 }
}
"""
REFERENCE = """
jobs {
  name: "ref"
  ingest_stream: "rollouts"
  topology { dp: 4 }
  global_batch: 64
  seq_length: 1024
  side_fields { name: "logprobs" dtype: "float32" align: ALIGN_LABELS }
  scheduler { kind: "balanced" max_tokens_per_rank: 1024 }
}
"""
FIELDS_OF = {"actor": ("logprobs", "advantages", "experts"), "ref": ("logprobs",)}


def grpo_step(rng, step, prompts=8, responses=4):
    """One step of rollouts: `prompts` groups of `responses` samples each,
    tokens and per-token log-probs, the group's normalised advantage, and
    [T, 8, 2] routed experts."""
    samples = []
    for p in range(prompts):
        group = step * 1000 + p
        rewards = np.array([rng.random() for _ in range(responses)], dtype=np.float32)
        advantages = (rewards - rewards.mean()) / (rewards.std() + 1e-6)
        for r in range(responses):
            t = rng.randint(20, 700)
            samples.append({
                "group": group, "tag": step,
                "tokens": np.array([rng.randrange(1, 50000) for _ in range(t)], dtype=np.int64),
                "logprobs": np.array([-rng.random() * 5 for _ in range(t)], dtype=np.float32),
                "advantages": np.full(t, advantages[r], dtype=np.float32),
                "experts": np.array([rng.randrange(0, 64) for _ in range(t * LAYERS * TOP_K)],
                                    dtype=np.int16).reshape(t, LAYERS, TOP_K)})
    return samples


def served_order(samples):
    """The daemon's serving order of a sealed step, as docs/INGEST.md states
    it: by group id, and as put within a group."""
    return sorted(samples, key=lambda s: s["group"])  # sorted() is stable


def expected_rank(plan, rank, topology, dynamic, samples, fields):
    """Every microbatch of one step for global rank `rank`, from the samples
    in serving order (plan-step names each by its index as "document")."""
    tp, cp, dp = topology
    r_tp, r_cp, r_dp, _ = coords(rank, tp, cp, dp)
    runs, stored = {}, {}
    for microbatch in plan["microbatches"]:
        for group in microbatch["groups"]:
            for s in group["sequences"]:
                sample = samples[int(s["document"])]
                runs[run_key(s)] = sample["tokens"].tolist()
                for name in fields:
                    stored.setdefault(name, {})[(0, int(s["document"]))] = \
                        sample[name].reshape(-1).tolist()
    n = cp * dp
    members = lambda first, c: [r_tp + tp * r for r in range(first, first + c)]
    read = lambda s: len(samples[int(s["document"])]["tokens"])
    out = []
    for m in plan["microbatches"]:
        want = rank_fields(m, r_cp + cp * r_dp, runs, "varlen", 0,
                           {"inputs": True, "targets": True}, dynamic, members)
        positions = rank_positions(m, r_cp + cp * r_dp)
        for name in fields:
            if name == "experts":
                want[name] = side_field(positions, stored[name], read, LAYERS * TOP_K, False, -1)
            else:
                want[name] = side_field(positions, stored[name], read, 1, True, 0.0)
        out.append(want)
    assert n == cp * dp
    return out


# The consumer jobs: name, (TP, CP, DP), dynamic CP, world size.
JOBS = (("actor", (2, 2, 2), True, 8), ("ref", (1, 1, 4), False, 4))


def check_step(test, job, step, plan, got, order):
    """Every rank of `job` got in `step` (got[(job, rank)][step]) what the
    reference says, all of them the same number of microbatches; returns
    how many microbatches were compared."""
    _, topology, dynamic, world = next(j for j in JOBS if j[0] == job)
    counts, checks = set(), 0
    for rank in range(world):
        want = expected_rank(plan, rank, topology, dynamic, order, FIELDS_OF[job])
        have = got[(job, rank)][step]
        counts.add(len(have))
        test.assertEqual(len(have), len(want), f"{job} rank {rank} step {step}")
        for m, (h, w) in enumerate(zip(have, want)):
            differ = sorted(k for k in w if h.get(k) != w[k])
            test.assertFalse(differ, f"{job} rank {rank} step {step} microbatch {m}: {differ} differ")
            checks += 1
    test.assertEqual(len(counts), 1, f"{job} step {step}: microbatch counts {counts}")
    return checks


def as_lists(batch, keys):
    return {k: (batch[k].reshape(-1).tolist() if batch[k].dim() > 0 else batch[k].item())
            for k in keys if isinstance(batch[k], torch.Tensor)}


class IngestTest(unittest.TestCase):

    def producer(self, daemon, token="driver-secret"):
        return packfeed.Producer("rollouts", socket_path=daemon.socket, auth_token=token)

    def test_verl_shaped_driver(self):
        steps = 4
        rng = random.Random(7)
        with Daemon(BIN_DIR, STREAM % "" + ACTOR + REFERENCE, name="verl") as daemon:
            producer = self.producer(daemon)
            put = {}
            self.assertEqual(producer.arena_bytes_written, 0)
            written = []
            for step in range(steps):
                samples = grpo_step(rng, step)
                put[step] = samples
                # Two puts per step, as two rollout workers would.
                producer.put(step, samples[:16])
                producer.put(step, samples[16:])
                written.append(producer.arena_bytes_written)
                sealed = producer.seal(step)
                self.assertEqual(sealed, {"samples": 32, "groups": 8, "peers_behind": []})
            # The arena's written end only moves forward, within the arena.
            self.assertGreater(written[0], 0)
            self.assertEqual(written, sorted(written))
            self.assertLessEqual(written[-1], producer._native.arena_bytes)
            # The plans, while the steps are held (consumed, they are freed).
            plans = {(job, step): daemon.ctl_json("plan-step", "--job", job, str(step))
                     for job in ("actor", "ref") for step in range(steps)}
            # Actor ranks 1..7 are separate processes (the C++ client);
            # this process holds actor rank 0 and every reference rank at
            # once, as one trainer process serving several models would.
            dumps = {r: daemon.start_dump("actor", r, steps) for r in range(1, 8)}
            clients = {("actor", 0): packfeed.Client("actor", rank=0, socket_path=daemon.socket)}
            for r in range(4):
                clients[("ref", r)] = packfeed.Client("ref", rank=r, socket_path=daemon.socket)
            got = {key: [] for key in clients}
            for step in range(steps):
                for key, client in clients.items():
                    microbatches, count, _, _ = client.next_step(timeout=60)
                    got[key].append([as_lists(b, list(b.keys())) for b in microbatches])
                    self.assertEqual(len(got[key][-1]), count)
            for r, process in dumps.items():
                out, err = process.communicate(timeout=120)
                self.assertEqual(process.returncode, 0, err)
                got[("actor", r)] = [s["microbatches"] for s in json.loads(out)["steps"]]
            for client in clients.values():
                client.close()
            checks = 0
            for job, _, dynamic, _ in JOBS:
                for step in range(steps):
                    plan = plans[(job, step)]
                    # Every sample of the step once, its group whole, in this step.
                    planned = sorted(int(s["document"]) for m in plan["microbatches"]
                                     for g in m["groups"] for s in g["sequences"])
                    self.assertEqual(planned, list(range(32)), f"{job} step {step}")
                    if dynamic:  # sequences past 512 tokens need CP groups
                        self.assertGreater(max(int(g["size"]) for m in plan["microbatches"]
                                               for g in m["groups"]), 1)
                    checks += check_step(self, job, step, plan, got, served_order(put[step]))
            print(f"{checks} microbatches equal the reference")
            # Every consumer is done: the stream freed every step.
            deadline = time.time() + 10
            while producer.status()["bytes_held"] and time.time() < deadline:
                time.sleep(0.05)
            status = producer.status()
            self.assertEqual(status["bytes_held"], 0, status)
            self.assertEqual({c["job"]: c["consumed_before"] for c in status["consumers"]},
                             {"actor": steps, "ref": steps})

    def test_backpressure(self):
        rng = random.Random(3)
        step0, step1 = grpo_step(rng, 0, prompts=2), grpo_step(rng, 1, prompts=2)
        size = lambda samples: sum(s["tokens"].nbytes + s["logprobs"].nbytes +
                                   s["advantages"].nbytes + s["experts"].nbytes for s in samples)
        # Room for one step, not two.
        budget = max(size(step0), size(step1)) * 3 // 2
        config = STREAM % f"memory_budget_bytes: {budget}" + REFERENCE
        with Daemon(BIN_DIR, config, name="full") as daemon:
            producer = self.producer(daemon)
            producer.put(0, step0)
            producer.seal(0)
            with self.assertRaises(packfeed.ResourceExhaustedError) as refused:
                producer.put(1, step1)
            self.assertIn("budget", str(refused.exception))
            # A put that waits: it proceeds once every rank consumed step 0.
            done = {}
            waiter = threading.Thread(
                target=lambda: done.setdefault("reply", self.producer(daemon).put(1, step1,
                                                                                  wait=30)))
            waiter.start()
            time.sleep(0.5)
            self.assertNotIn("reply", done, "the put did not wait for room")
            clients = [packfeed.Client("ref", rank=r, socket_path=daemon.socket) for r in range(4)]
            for client in clients:
                microbatches, _, _, _ = client.next_step(timeout=30)
                for _ in microbatches:  # taken is consumed, held or not
                    pass
            waiter.join(timeout=30)
            self.assertIn("reply", done, "the waiting put never proceeded")
            producer.seal(1)
            for client in clients:
                microbatches, count, _, _ = client.next_step(timeout=30)
                self.assertEqual(len(list(microbatches)), count)
                client.close()
            status = producer.status()
            self.assertEqual((status["puts_waited"], status["puts_refused"]), (1, 1), status)
            self.assertLessEqual(status["peak_bytes_held"], budget)
            # What an operator sees.
            text = daemon.ctl_run("stats").stdout
            self.assertIn(f"ingest stream rollouts: {status['bytes_held']} B held", text)
            self.assertIn("1 puts waited for room, 1 refused", text)
            self.assertIn("consumer ref: consumed the steps before ", text)

    def test_a_restarted_daemon_is_put_again_and_its_consumer_resumes_exactly(self):
        """docs/INGEST.md's restart procedure: the driver asks status() and
        puts again every step from the least consumed_before on (in any
        order of its groups); a rank
        killed with the daemon mid-step re-attaches and gets, bit for bit,
        what it would have got."""
        solo = REFERENCE.replace('"ref"', '"solo"').replace("dp: 4", "dp: 1")
        config = STREAM % "" + solo
        rng = random.Random(11)
        steps = [grpo_step(rng, step, prompts=4) for step in range(3)]
        keys = ("tokens", "labels", "loss_mask", "position_ids", "logprobs")

        def put_from(producer, first, groups_reversed=False):
            for step in range(first, len(steps)):
                # Another put order of the same groups plans the same.
                producer.put(step, sorted(steps[step], key=lambda s: s["group"],
                                          reverse=groups_reversed))
                producer.seal(step)

        def take(iterator):
            return [as_lists(batch, keys) for batch in iterator]

        with Daemon(BIN_DIR, config, name="once") as daemon:
            put_from(self.producer(daemon), 0)
            client = packfeed.Client("solo", rank=0, socket_path=daemon.socket, copy=True)
            expected = [take(client.next_step(timeout=30)[0]) for _ in steps]
            client.close()
        self.assertGreater(len(expected[1]), 1, "step 1 must have microbatches to resume in")

        workdir = tempfile.mkdtemp(prefix="pf-ingest-restart-")
        daemon = Daemon(BIN_DIR, config, name="restarted", workdir=workdir)
        with daemon:
            put_from(self.producer(daemon), 0)
            client = packfeed.Client("solo", rank=0, socket_path=daemon.socket, copy=True)
            got = [take(client.next_step(timeout=30)[0])]
            iterator = client.next_step(timeout=30)[0]
            got.append([as_lists(next(iterator), keys)])
            daemon.process.kill()  # mid-step 1
            daemon.process.wait()
        with Daemon(BIN_DIR, config, name="restarted", workdir=workdir) as daemon:
            producer = self.producer(daemon)
            # Nothing of the stream survives the restart: every consumer
            # starts from step 0, and the driver puts again from there.
            status = producer.status()
            first = min(c["consumed_before"] for c in status["consumers"])
            self.assertEqual((status["bytes_held"], first), (0, 0), status)
            put_from(producer, first, groups_reversed=True)
            got[1] += take(iterator)
            got.append(take(client.next_step(timeout=30)[0]))
            client.close()
            self.assertEqual(got, expected, "batches after the restart differ")
            # The re-put step 0, which the rank was past, is freed with step 1.
            deadline = time.time() + 10
            while producer.status()["bytes_held"] and time.time() < deadline:
                time.sleep(0.05)
            self.assertEqual(producer.status()["bytes_held"], 0)

    def test_later_puts_take_one_call_and_serve_the_same_bytes(self):
        """Once consumed steps free arena spans, the producer writes later
        puts into spans the daemon named free and puts them in one call
        (Ingest.Put). What the rank gets equals a run whose puts all came
        before any consumption, bit for bit, and the arena is reused, not
        grown."""
        solo = REFERENCE.replace('"ref"', '"solo"').replace("dp: 4", "dp: 1")
        config = STREAM % "" + solo
        rng = random.Random(17)
        steps = [grpo_step(rng, step) for step in range(3)]  # 32 samples each
        keys = ("tokens", "labels", "loss_mask", "position_ids", "logprobs")

        def put(producer, step):
            for quarter in range(4):
                producer.put(step, steps[step][quarter * 8:(quarter + 1) * 8])
            producer.seal(step)

        def take(client):
            return [as_lists(batch, keys) for batch in client.next_step(timeout=30)[0]]

        with Daemon(BIN_DIR, config, name="ahead") as daemon:
            producer = self.producer(daemon)
            for step in range(len(steps)):
                put(producer, step)
            client = packfeed.Client("solo", rank=0, socket_path=daemon.socket, copy=True)
            expected = [take(client) for _ in steps]
            client.close()
        with Daemon(BIN_DIR, config, name="in-turn") as daemon:
            producer = self.producer(daemon)
            client = packfeed.Client("solo", rank=0, socket_path=daemon.socket, copy=True)
            got, written = [], []
            for step in range(len(steps)):
                put(producer, step)
                written.append(producer.arena_bytes_written)
                got.append(take(client))
                # Its spans are free once the step is consumed.
                deadline = time.time() + 10
                while producer.status()["bytes_held"] and time.time() < deadline:
                    time.sleep(0.05)
            client.close()
            status = producer.status()
        self.assertEqual(got, expected)
        self.assertGreater(status["puts_in_one_call"], 0, status)
        self.assertLess(status["puts_in_one_call"], 4 * len(steps), status)
        self.assertLess(written[-1], 2 * written[0], written)

    def test_a_consumer_rank_that_dies_mid_step_comes_back_and_misses_nothing(self):
        """Rank processes (rank_worker.py) of the reference job; one is
        SIGKILLed after a microbatch that is not its step's last and started
        again from its last committed state. What every rank committed equals
        an uninterrupted run, bit for bit."""
        rng = random.Random(13)
        steps = [grpo_step(rng, step, prompts=4) for step in range(3)]
        ranks = list(range(4))

        def run(name, victim_dies_after=None):
            with Daemon(BIN_DIR, STREAM % "" + REFERENCE, name=name) as daemon:
                producer = self.producer(daemon)
                for step, samples in enumerate(steps):
                    producer.put(step, samples)
                    producer.seal(step)
                workers = Workers(daemon, "ref", ranks, len(steps), daemon.dir, name)
                if victim_dies_after is None:
                    workers.start_all()
                else:
                    for rank in ranks[1:]:
                        workers.start(rank)
                    workers.start(0, "--die-after", str(victim_dies_after))
                    code, _ = workers.wait(0)
                    self.assertEqual(code, -signal.SIGKILL)
                    committed = workers.records(0)
                    self.assertEqual(len(committed), victim_dies_after)
                    self.assertNotEqual(committed[-1]["state"]["next_microbatch"], 0,
                                        "not mid-step")
                    workers.start(0)  # a new process, from its last state
                workers.wait_all()
                return workers.shas()

        reference = run("uninterrupted")
        shas = reference[0]
        die_after = next((i + 1 for i in range(1, len(shas) - 1)
                          if shas[i + 1][0] == shas[i][0]), None)
        self.assertIsNotNone(die_after, "no step of rank 0 has two microbatches")
        self.assertEqual(run("rank-dies", die_after), reference)

    def test_bad_input(self):
        rng = random.Random(5)
        with Daemon(BIN_DIR, STREAM % "" + ACTOR + REFERENCE, name="bad") as daemon:
            producer = self.producer(daemon)
            good = grpo_step(rng, 0, prompts=2)
            producer.put(0, good[:4])

            def bad(**change):
                sample = dict(grpo_step(rng, 0, prompts=1, responses=1)[0], group=77)
                sample.update(change)
                return [sample]

            short = bad()
            short[0]["logprobs"] = short[0]["logprobs"][:-1]
            unknown = bad()
            unknown[0]["rewards"] = unknown[0]["logprobs"]
            huge = bad()
            t = 3000  # beyond every consumer's seq_length
            huge[0].update(tokens=np.ones(t, np.int64), logprobs=np.zeros(t, np.float32),
                           advantages=np.zeros(t, np.float32),
                           experts=np.zeros((t, LAYERS, TOP_K), np.int16))
            split_group = bad(group=good[0]["group"])
            cases = [
                ("a side field shorter than its tokens", producer, 0, short,
                 packfeed.InvalidArgumentError, "field 'logprobs' has"),
                ("an unknown field", producer, 0, unknown,
                 packfeed.InvalidArgumentError, "unknown field 'rewards'"),
                ("a sample no rank can hold", producer, 0, huge,
                 packfeed.InvalidArgumentError, "can hold it"),
                ("a group put into a second step", producer, 1, split_group,
                 packfeed.InvalidArgumentError, "a group lies in one step"),
                ("a put without the token", self.producer(daemon, token=""), 0, bad(),
                 packfeed.PermissionDeniedError, "auth token"),
            ]
            for name, who, step, samples, error, words in cases:
                with self.subTest(name):
                    with self.assertRaises(error) as raised:
                        who.put(step, samples)
                    self.assertIn(words, str(raised.exception))
            producer.put(0, good[4:])
            self.assertEqual(producer.seal(0), {"samples": 8, "groups": 2, "peers_behind": []})
            with self.assertRaises(packfeed.AlreadyExistsError):
                producer.seal(0)
            with self.assertRaises(packfeed.FailedPreconditionError) as sealed:
                producer.put(0, bad())
            self.assertIn("sealed already", str(sealed.exception))
            # Nothing of the refused puts was kept; the consumers get the step.
            clients = [packfeed.Client("ref", rank=r, socket_path=daemon.socket) for r in range(4)]
            served = 0
            for client in clients:
                microbatches, _, _, _ = client.next_step(timeout=30)
                served += sum(len(b["cu_seqlens"]) - 1 for b in microbatches)
                client.close()
            self.assertEqual(served, 8)
            log = daemon.log.read_text()
            self.assertIn("unknown field 'rewards'", log)


if __name__ == "__main__":
    main()
