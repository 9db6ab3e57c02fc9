"""Soak: a bounded number of random SIGKILLs of rank processes and of the
daemon over a bounded time, while 4 ranks (CP 2 × DP 2) take their steps.
Afterwards every rank's committed microbatches must equal an uninterrupted
run's, bit for bit, and the daemon's journaled ledger must show each sample
consumed exactly once by each rank that needs it. Prints the faults
injected, the sample deliveries checked, and the losses and duplicates
found (which must be 0).

PACKFEED_SOAK_SEED, PACKFEED_SOAK_FAULTS and PACKFEED_SOAK_SECONDS override
the seed (default 1), the faults (default 8) and the time bound (default
60 s)."""
import os
import random
import tempfile
import time
import unittest

from pf_test_support import BIN_DIR, Daemon, main
from reliability_support import Workers, check_ledger, daemon_text, job_text, ledger, make_dataset

TP, CP, DP = 1, 2, 2
RANKS = list(range(TP * CP * DP))
STEPS = 24
DELAY = "0.1"  # seconds of "compute" per microbatch


class SoakTest(unittest.TestCase):
    def test_random_kills_of_ranks_and_daemons_lose_and_repeat_nothing(self):
        seed = int(os.environ.get("PACKFEED_SOAK_SEED", "1"))
        max_faults = int(os.environ.get("PACKFEED_SOAK_FAULTS", "8"))
        seconds = float(os.environ.get("PACKFEED_SOAK_SECONDS", "60"))
        rng = random.Random(seed)
        prefix = make_dataset(documents=96)
        text = job_text(prefix, tp=TP, cp=CP, dp=DP)

        reference_dir = tempfile.mkdtemp(prefix="pf-soak-reference-")
        with Daemon(BIN_DIR, daemon_text([text], f"{reference_dir}/state"), name="reference",
                    workdir=reference_dir) as daemon:
            reference = Workers(daemon, "job", RANKS, STEPS, reference_dir, "reference")
            reference.start_all()
            reference.wait_all()
        expected = reference.shas()

        workdir = tempfile.mkdtemp(prefix="pf-soak-")
        config = daemon_text([text], f"{workdir}/state")
        daemon = Daemon(BIN_DIR, config, name="soak", workdir=workdir).__enter__()
        workers = Workers(daemon, "job", RANKS, STEPS, workdir, "soak")
        workers.start_all("--delay", DELAY)
        rank_kills = daemon_kills = 0
        deadline = time.monotonic() + seconds
        try:
            while rank_kills + daemon_kills < max_faults and time.monotonic() < deadline:
                time.sleep(rng.uniform(0.3, 1.5))
                running = [r for r, p in workers.processes.items() if p.poll() is None]
                if not running:
                    break
                if rng.random() < 0.3:
                    daemon.process.kill()
                    daemon.process.wait()
                    daemon.stop()
                    time.sleep(rng.uniform(0.0, 1.0))  # ranks see Unavailable and retry
                    daemon = Daemon(BIN_DIR, config, name="soak", workdir=workdir).__enter__()
                    daemon_kills += 1
                else:
                    victim = rng.choice(running)
                    workers.processes[victim].kill()
                    workers.processes[victim].wait()
                    workers.start(victim, "--delay", DELAY)
                    rank_kills += 1
            workers.wait_all(timeout=240)
            got = workers.shas()
            losses = sum(len(set(expected[r]) - set(got[r])) for r in RANKS)
            duplicates = sum(len(got[r]) - len(set(got[r])) for r in RANKS)
            ranks_ledger = ledger(daemon, "job")
            ledger_gaps = sum(int(r.get("gaps", 0)) for r in ranks_ledger.values())
            ledger_duplicates = sum(int(r.get("duplicates", 0)) for r in ranks_ledger.values())
            rewinds = sum(int(r.get("rewinds", 0)) for r in ranks_ledger.values())
            claimed = sum(int(r.get("claimed", 0)) for r in ranks_ledger.values())
            print(f"soak (seed {seed}): {rank_kills + daemon_kills} faults injected "
                  f"({rank_kills} rank kills, {daemon_kills} daemon kills); ranks committed "
                  f"{sum(len(g) for g in got.values())} microbatches: {losses} lost, "
                  f"{duplicates} duplicated, every byte equal to the uninterrupted run: "
                  f"{got == expected}; ledger: {ledger_gaps} gaps, {ledger_duplicates} "
                  f"duplicates, {rewinds} rewinds, {claimed} claimed at re-attach")
            self.assertGreater(rank_kills + daemon_kills, 0)
            self.assertEqual((losses, duplicates, ledger_gaps, ledger_duplicates), (0, 0, 0, 0))
            self.assertEqual(got, expected)
            checked = check_ledger(self, daemon, "job", RANKS, STEPS, TP, CP, DP)
            print(f"soak: {checked} sample deliveries checked against the plan, all exactly once")
        finally:
            for process in workers.processes.values():
                if process.poll() is None:
                    process.kill()
            daemon.stop()


if __name__ == "__main__":
    main()
