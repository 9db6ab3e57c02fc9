"""Faults cost time, never data (docs/RELIABILITY.md). Real packfeedd, real
rank processes (rank_worker.py), real kills. Each test compares what the
ranks committed with an uninterrupted run (bit-identical) and checks the
daemon's consumption ledger against the plan (each sample reached each rank
that needs it exactly once)."""
import json
import os
import pathlib
import signal
import subprocess
import tempfile
import time
import unittest

import packfeed
from daemon_harness import wait_until
from pf_test_support import BIN_DIR, Daemon, main
from reliability_support import (MASK, Workers, check_ledger, daemon_text, job_text, ledger,
                                 ledger_epochs, make_dataset, sample_digest)

STEPS = 6
TP, CP, DP = 1, 2, 2
RANKS = list(range(TP * CP * DP))


class ReliabilityTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.prefix = make_dataset(documents=64)
        cls.job = job_text(cls.prefix, tp=TP, cp=CP, dp=DP)
        # The uninterrupted run every fault is compared with.
        with cls.daemon_for(cls, "reference") as daemon:
            workers = Workers(daemon, "job", RANKS, STEPS, daemon.dir, "reference")
            workers.start_all()
            workers.wait_all()
            cls.reference = workers.shas()
        for shas in cls.reference.values():
            assert len(shas) > STEPS, "one microbatch per step tests nothing mid-step"

    def daemon_for(self, name, text=None, workdir=None):
        workdir = workdir or tempfile.mkdtemp(prefix=f"pf-reliability-{name}-")
        state = os.path.join(workdir, "state")
        return Daemon(BIN_DIR, daemon_text([text or self.job], state), name=name,
                      workdir=workdir)

    def test_a_rank_that_dies_mid_step_comes_back_and_misses_nothing(self):
        with self.daemon_for("rank-dies") as daemon:
            workers = Workers(daemon, "job", RANKS, STEPS, daemon.dir, "run")
            workers.start_all()
            victim = 1
            workers.processes[victim].kill()  # replaced by one that dies on its own, mid-step
            workers.processes[victim].wait()
            workers.out[victim].unlink(missing_ok=True)
            # Die after a microbatch that is not its step's last.
            shas = self.reference[victim]
            die_after = next(i + 1 for i in range(2, len(shas) - 1)
                             if shas[i + 1][0] == shas[i][0])
            workers.start(victim, "--die-after", str(die_after))
            code, _ = workers.wait(victim)
            self.assertEqual(code, -signal.SIGKILL)
            committed = workers.records(victim)
            self.assertEqual(len(committed), die_after)
            self.assertNotEqual(committed[-1]["state"]["next_microbatch"], 0, "not mid-step")
            workers.start(victim)  # the same rank, a new process, its last state
            workers.wait_all()
            self.assertEqual(workers.shas(), self.reference)
            checked = check_ledger(self, daemon, "job", RANKS, STEPS, TP, CP, DP)
            print(f"rank death: rank {victim} killed after {die_after} microbatches (mid-step), "
                  f"came back; {checked} sample deliveries checked, no loss, no duplicate")

    def test_a_killed_daemon_restarts_and_nothing_is_lost_or_repeated(self):
        workdir = tempfile.mkdtemp(prefix="pf-reliability-daemon-")
        daemon = self.daemon_for("daemon-dies", workdir=workdir)
        with daemon:
            workers = Workers(daemon, "job", RANKS, STEPS, workdir, "run")
            # One rank pauses mid-run so the kill lands while ranks are busy
            # and others wait on it.
            workers.start_all("--pause-after", "4", "--pause", "1.5")
            wait_for(lambda: all(committed(workers, r) >= 2 for r in RANKS))
            daemon.process.kill()
            daemon.process.wait()
        before = {r: committed(workers, r) for r in RANKS}
        with self.daemon_for("daemon-dies", workdir=workdir) as daemon:
            workers.wait_all()
            self.assertEqual(workers.shas(), self.reference)
            checked = check_ledger(self, daemon, "job", RANKS, STEPS, TP, CP, DP)
            claimed = sum(int(r.get("claimed", 0)) for r in ledger(daemon, "job").values())
        print(f"daemon SIGKILL: ranks had committed {sorted(before.values())} microbatches; "
              f"after the restart {checked} sample deliveries checked against the journaled "
              f"ledger, {claimed} claimed at re-attach, no loss, no duplicate")

    def test_what_a_rank_takes_from_its_ring_after_the_daemon_died_reaches_the_ledger(self):
        # The daemon dies after it pushed the rank's last step; the rank
        # takes that step from its ring and detaches: the restarted daemon
        # must learn it (DetachRequest.consumed_to), or the ledger would be
        # short (found by the soak).
        workdir = tempfile.mkdtemp(prefix="pf-reliability-late-")
        text = job_text(self.prefix, tp=1, cp=1, dp=1)
        daemon = self.daemon_for("late", text=text, workdir=workdir)
        with daemon:
            client = packfeed.Client("job", rank=0, socket_path=daemon.socket, slots=16,
                                     copy=True, reconnect_timeout=30)
            list(client.next_step(timeout=30)[0])
            wait_for(lambda: int(daemon.ctl_json("stats")["jobs"][0]["ranks"][0]
                                 .get("next_step", 0)) >= 2)
            daemon.process.kill()
            daemon.process.wait()
            iterator, count, _, _ = client.next_step(timeout=30)  # from the ring alone
            self.assertEqual(len(list(iterator)), count)
        with self.daemon_for("late", text=text, workdir=workdir) as daemon:
            client.close()
            checked = check_ledger(self, daemon, "job", [0], 2, 1, 1, 1)
            claimed = int(ledger(daemon, "job")[0].get("claimed", 0))
            self.assertGreaterEqual(claimed, count)
        print(f"late detach: {count} microbatches taken from the ring after the daemon died "
              f"reached the restarted daemon's ledger; {checked} deliveries checked")

    def test_a_trainer_restarted_from_a_checkpoint_gets_the_same_batches(self):
        checkpoint_step = 2
        with self.daemon_for("checkpoint") as daemon:
            first = Workers(daemon, "job", RANKS, STEPS, daemon.dir, "first")
            for r in RANKS:
                first.start(r, "--checkpoint-at", str(checkpoint_step), "--checkpoint",
                            str(daemon.dir / f"ckpt{r}.json"))
            first.wait_all()
            second = Workers(daemon, "job", RANKS, STEPS, daemon.dir, "second")
            for r in RANKS:
                second.start(r, "--resume-from", str(daemon.dir / f"ckpt{r}.json"))
            second.wait_all()
            for r in RANKS:
                again = second.shas()[r]
                self.assertEqual(again, [x for x in self.reference[r] if x[0] >= checkpoint_step])
            checked = check_ledger(self, daemon, "job", RANKS, STEPS, TP, CP, DP)
            rewinds = [int(r.get("rewinds", 0)) for r in ledger(daemon, "job").values()]
            self.assertEqual(rewinds, [1] * len(RANKS))
        print(f"checkpoint restart at step {checkpoint_step}: the same batches again; ledger "
              f"rewound once per rank, {checked} sample deliveries checked")

    def test_an_elastic_resume_with_another_dp_size_loses_and_repeats_nothing(self):
        # 32 documents, global batch 8, one dataset: an epoch is 4 steps.
        prefix = make_dataset(documents=32)
        before_steps, total_steps = 3, 8
        old = job_text(prefix, tp=1, cp=1, dp=2, scheduler="balanced")
        new = job_text(prefix, tp=1, cp=1, dp=4, scheduler="balanced")
        workdir = tempfile.mkdtemp(prefix="pf-reliability-elastic-")
        epochs = {}

        def add(ranks_ledger):
            for r in ranks_ledger.values():
                for key, (n, digest) in ledger_epochs(r).items():
                    entry = epochs.setdefault(key, [0, 0])
                    entry[0] += n
                    entry[1] = (entry[1] + digest) & MASK

        with self.daemon_for("elastic-dp2", text=old, workdir=workdir) as daemon:
            workers = Workers(daemon, "job", [0, 1], before_steps, workdir, "dp2")
            for r in (0, 1):
                workers.start(r, "--checkpoint-at", str(before_steps), "--checkpoint",
                              os.path.join(workdir, f"ckpt{r}.json"))
            workers.wait_all()
            add(ledger(daemon, "job"))
        # Checkpoints are taken when a step is about to begin; rank 0's
        # serves every new rank (the data position is global).
        state = {"fingerprint": workers.records(0)[-1]["state"]["fingerprint"],
                 "next_step": before_steps}
        with open(os.path.join(workdir, "elastic.json"), "w") as f:
            json.dump(state, f)
        with self.daemon_for("elastic-dp4", text=new, workdir=workdir) as daemon:
            workers = Workers(daemon, "job", [0, 1, 2, 3], total_steps, workdir, "dp4")
            workers.start_all("--elastic-from", os.path.join(workdir, "elastic.json"))
            workers.wait_all()
            add(ledger(daemon, "job"))
        everything = sum(sample_digest(0, d) for d in range(32)) & MASK
        self.assertEqual(epochs, {(0, 0): [32, everything], (0, 1): [32, everything]})
        print(f"elastic resume DP 2 -> 4 at step {before_steps}: epochs 0 and 1 each served "
              "all 32 samples exactly once across both layouts")

    def test_a_mid_step_elastic_resume_is_refused_by_name(self):
        with self.daemon_for("elastic-refused") as daemon:
            fingerprint = json.loads(daemon.ctl_run("jobs", "--json").stdout)["jobs"][0][
                "fingerprint"]
            with self.assertRaises(packfeed.errors.InvalidArgumentError) as raised:
                packfeed.Client("job", rank=0, socket_path=daemon.socket,
                                state={"version": 1, "job": "job", "rank": 0,
                                       "fingerprint": fingerprint, "next_step": 1,
                                       "next_microbatch": 1}, elastic=True)
            self.assertIn("step boundary", str(raised.exception))

    def test_a_corrupt_ledger_is_set_aside_and_serving_goes_on(self):
        workdir = tempfile.mkdtemp(prefix="pf-reliability-ledger-")
        with self.daemon_for("ledger", workdir=workdir) as daemon:
            workers = Workers(daemon, "job", RANKS, 2, workdir, "before")
            workers.start_all()
            workers.wait_all()
            journal = ledger(daemon, "job") and daemon.ctl_json("ledger")["jobs"][0]["journal"]
        # A line no daemon wrote, before the last (a bad last line is taken
        # for a torn write and cut off).
        lines = pathlib.Path(journal).read_text().splitlines(keepends=True)
        lines.insert(1, "C 0 zero 0 1 c\n")
        pathlib.Path(journal).write_text("".join(lines))
        with self.daemon_for("ledger", workdir=workdir) as daemon:
            errors = [line for line in daemon.log.read_text().splitlines() if "[error]" in line]
            self.assertEqual(len(errors), 1, errors)
            self.assertIn("set aside", errors[0])
            self.assertTrue(os.path.exists(journal + ".corrupt"))
            workers = Workers(daemon, "job", RANKS, STEPS, workdir, "after")
            workers.start_all()
            workers.wait_all()
            self.assertEqual(workers.shas(), self.reference)
            check_ledger(self, daemon, "job", RANKS, STEPS, TP, CP, DP)

    def test_a_sample_no_plan_can_hold_is_refused_at_start_up(self):
        # Every sequence is longer than max_tokens_per_rank at CP 1: no step
        # of job "impossible" could be planned. Found when the daemon starts,
        # naming the document, not when a rank first asks.
        workdir = tempfile.mkdtemp(prefix="pf-reliability-unservable-")
        prefix = os.path.join(workdir, "long")
        subprocess.run([str(BIN_DIR / "packfeedctl"), "make-dataset", "--out", prefix, "--count",
                        "32", "--min", "100", "--max", "120", "--vocab", "5000"], check=True,
                       capture_output=True)
        impossible = job_text(prefix, name="impossible", tp=1, cp=1, dp=1).replace(
            "max_tokens_per_rank: 128", "max_tokens_per_rank: 64")
        config = os.path.join(workdir, "unservable.textproto")
        with open(config, "w") as out:
            out.write(f'socket_path: "{workdir}/unservable.sock"\n' +
                      daemon_text([impossible, self.job], os.path.join(workdir, "state")))
        started = time.monotonic()
        result = subprocess.run([str(BIN_DIR / "packfeedd"), "--config", config],
                                capture_output=True, text=True, timeout=30)
        self.assertNotEqual(result.returncode, 0)
        self.assertLess(time.monotonic() - started, 10)
        self.assertRegex(result.stdout + result.stderr,
                         r"job impossible: .*long document \d+ \(\d+ tokens as planned\) can never "
                         r"be served: does not fit in 64 tokens per rank")
        print(f"unservable job refused at start-up: {(result.stdout + result.stderr).strip()}")

    def test_a_stalled_rank_holds_its_job_not_the_others_and_stats_name_it(self):
        slow = job_text(self.prefix, name="slow", tp=1, cp=1, dp=2)
        steady = job_text(self.prefix, name="steady", tp=1, cp=1, dp=2)
        budget = 1 << 20
        workdir = tempfile.mkdtemp(prefix="pf-reliability-slow-")
        text = daemon_text([slow, steady], os.path.join(workdir, "state"),
                           extra=f"memory_budget_bytes: {budget}")
        with Daemon(BIN_DIR, text, name="slow", workdir=workdir) as daemon:
            stalled = Workers(daemon, "slow", [0, 1], 40, workdir, "slow")
            stalled.start(0, "--pause-after", "1", "--pause", "600")
            stalled.start(1)
            # Rank 0 has taken its one microbatch and stalls; the daemon reads
            # ahead for rank 1 up to the memory budget.
            wait_until(lambda: stalled.out[0].exists() and stalled.records(0), "rank 0 stalled")
            rss_before = rss_kib(daemon.process.pid)
            steady_workers = Workers(daemon, "steady", [0, 1], 40, workdir, "steady")
            started = time.monotonic()
            steady_workers.start_all()
            steady_workers.wait_all()
            elapsed = time.monotonic() - started
            rss_after = rss_kib(daemon.process.pid)
            stats = {j["name"]: j for j in daemon.ctl_json("stats")["jobs"]}
            slow_stats = stats["slow"]
            self.assertEqual(int(slow_stats.get("slowest_rank", 0)), 0)
            behind = int(slow_stats.get("slowest_rank_steps_behind", 0))
            self.assertGreaterEqual(behind, 1)
            self.assertLessEqual(int(slow_stats.get("cached_bytes", 0)), 4 * budget)
            self.assertEqual(len(steady_workers.records(0)), len(steady_workers.records(1)))
            self.assertLess(rss_after - rss_before, 32 * 1024, "the daemon's memory grew")
            text_stats = daemon.ctl_run("stats", "--job", "slow").stdout
            self.assertIn(f"slowest rank 0, {behind} steps behind", text_stats)
            for p in stalled.processes.values():
                p.kill()
        print(f"stalled rank: job 'steady' served 40 steps to both ranks in {elapsed:.1f} s "
              f"while job 'slow' rank 0 stalled ({behind} steps behind its peer); daemon RSS "
              f"{rss_before / 1024:.1f} -> {rss_after / 1024:.1f} MiB, job 'slow' holds "
              f"{int(slow_stats.get('cached_bytes', 0))} B of samples (budget {budget})")


def committed(workers, rank):
    path = workers.out[rank]
    return len(path.read_text().splitlines()) if path.exists() else 0


def wait_for(condition, timeout=60):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.05)


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


if __name__ == "__main__":
    main()
