"""What the reliability and soak tests share: a generated dataset, job
configurations, rank worker processes (rank_worker.py), and the checks of
the consumption ledger against the plan."""
import json
import os
import pathlib
import subprocess
import sys
import tempfile

from pf_test_support import BIN_DIR

WORKER = str(pathlib.Path(__file__).with_name("rank_worker.py"))
MASK = (1 << 64) - 1


def sample_digest(dataset, index):
    """SampleDigest of server/storage/ledger.cc: splitmix64's finalizer."""
    z = ((dataset << 40) + index) & MASK
    z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & MASK
    z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & MASK
    return z ^ (z >> 31)


def make_dataset(documents=64):
    """A generated dataset of `documents` documents; returns its prefix."""
    prefix = os.path.join(tempfile.mkdtemp(prefix="pf-reliability-"), "data")
    subprocess.run([str(BIN_DIR / "packfeedctl"), "make-dataset", "--out", prefix,
                    "--count", str(documents), "--seed", "3", "--min", "4", "--max", "120", "--mean", "40",
                    "--vocab", "5000"], check=True, capture_output=True)
    return prefix


def job_text(prefix, name="job", tp=1, cp=2, dp=2, global_batch=8, scheduler="balanced"):
    # Room for the longest sequence (120 tokens and its EOD) and little more,
    # so that a step has several microbatches.
    max_tokens = 128 // cp
    return f"""
jobs {{
  name: "{name}"
  datasets {{ prefix: "{prefix}" }}
  topology {{ tp: {tp} pp: 1 cp: {cp} dp: {dp} }}
  global_batch: {global_batch}
  seq_length: 128
  eod_id: 5000
  append_eod: true
  seed: 7
  scheduler {{ kind: "{scheduler}" max_tokens_per_rank: {max_tokens} }}
}}
"""


def daemon_text(jobs, state_dir, extra=""):
    return f'state_dir: "{state_dir}"\n{extra}\n' + "".join(jobs)


class Workers:
    """Rank worker processes of one job, each appending to its own file."""

    def __init__(self, daemon, job, ranks, steps, out_dir, tag):
        self.daemon, self.job, self.steps = daemon, job, steps
        self.out = {r: pathlib.Path(out_dir) / f"{tag}-rank{r}.jsonl" for r in ranks}
        self.processes = {}

    def start(self, rank, *extra):
        self.processes[rank] = subprocess.Popen(
            [sys.executable, WORKER, "--socket", self.daemon.socket, "--job", self.job,
             "--rank", str(rank), "--steps", str(self.steps), "--out", str(self.out[rank]),
             *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        return self.processes[rank]

    def start_all(self, *extra):
        for rank in self.out:
            self.start(rank, *extra)

    def wait(self, rank, timeout=180):
        process = self.processes[rank]
        output, _ = process.communicate(timeout=timeout)
        return process.returncode, output

    def wait_all(self, timeout=180):
        for rank in self.out:
            code, output = self.wait(rank, timeout)
            if code != 0:
                raise AssertionError(f"rank {rank} worker exited {code}:\n{output}")

    def records(self, rank):
        return [json.loads(line) for line in self.out[rank].read_text().splitlines()]

    def shas(self):
        """{rank: [(step, mb, sha), ...]} in the order each rank committed."""
        return {r: [(x["step"], x["mb"], x["sha"]) for x in self.records(r)] for r in self.out}


def ledger(daemon, job):
    reply = daemon.ctl_json("ledger", "--job", job)
    (entry,) = reply["jobs"]
    return {int(r["global_rank"]): r for r in entry.get("ranks", [])}


def plan(daemon, job, step):
    return daemon.ctl_json("plan-step", "--job", job, str(step))


def dp_cp_rank(rank, tp, cp, dp):
    return (rank // tp) % (cp * dp)


def expected_epochs(daemon, job, ranks, steps, tp, cp, dp):
    """{rank: {(dataset, epoch): [samples, digest]}} as the plans of `steps`
    say each rank must consume them."""
    out = {r: {} for r in ranks}
    for step in steps:
        for microbatch in plan(daemon, job, step)["microbatches"]:
            for group in microbatch["groups"]:
                first, size = int(group.get("first_rank", 0)), int(group["size"])
                for r in ranks:
                    if not first <= dp_cp_rank(r, tp, cp, dp) < first + size:
                        continue
                    for s in group["sequences"]:
                        key = (int(s.get("dataset", 0)), int(s.get("epoch", 0)))
                        entry = out[r].setdefault(key, [0, 0])
                        entry[0] += 1
                        entry[1] = (entry[1] + sample_digest(key[0], int(s["document"]))) & MASK
    return out


def ledger_epochs(rank_ledger):
    return {(int(e.get("dataset", 0)), int(e.get("epoch", 0))):
            [int(e["samples"]), int(e["digest"])] for e in rank_ledger.get("epochs", [])}


def check_ledger(test, daemon, job, ranks, steps, tp, cp, dp):
    """Every rank consumed exactly what the plans of steps [0, steps) give
    it: counts and digests per dataset epoch equal, no duplicate, no gap.
    Returns the number of (rank, sample) deliveries checked."""
    got = ledger(daemon, job)
    want = expected_epochs(daemon, job, ranks, range(steps), tp, cp, dp)
    checked = 0
    for r in ranks:
        test.assertEqual(int(got[r].get("duplicates", 0)), 0, f"rank {r}: {got[r]}")
        test.assertEqual(int(got[r].get("gaps", 0)), 0, f"rank {r}: {got[r]}")
        test.assertEqual((int(got[r].get("next_step", 0)), int(got[r].get("next_microbatch", 0))),
                         (steps, 0), f"rank {r}")
        test.assertEqual(ledger_epochs(got[r]), want[r], f"rank {r}: consumed samples differ")
        checked += sum(n for n, _ in want[r].values())
    return checked
