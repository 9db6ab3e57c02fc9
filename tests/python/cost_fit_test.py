"""The cost model learned from measured compute, end to end (docs/
SCHEDULER.md, "A cost model learned from the cluster"): four ranks take
their microbatches from a real packfeedd through packfeed.Client and each
spends, per microbatch, what a hidden "true" model says its CP group's work
costs (a sleep: this machine has no GPU). Their clients report those times;
the daemon pairs each with the work its plan gave the rank's group and fits
the rates. `packfeedctl cost-model` must then give the true α, β and μ
within the sleeps' noise, say the data determined them, and model the
recent steps closer to what was measured than the configured prior does;
the rates must reach the Prometheus metrics too."""
import json
import subprocess
import tempfile
import threading
import unittest
import urllib.request

import packfeed
from daemon_harness import free_port, make_dataset
from pf_test_support import BIN_DIR, Daemon, main

# The hidden cluster: seconds per s², per token, per token of K/V exchanged
# over (c-1)/c, per extra CP peer, and per microbatch.
TRUE = {"alpha": 1.2e-9, "beta": 3.6e-6, "kappa": 1.8e-6, "lambda": 3e-3, "mu": 4e-3}
STEPS = 40
RANKS = 4


def true_seconds(batch):
    """The true model's work for the group this microbatch came from: each
    sequence's padded length s (from cu_seqlens_padded) at the group's CP
    size c."""
    bounds = batch["cu_seqlens_padded"].view(-1).tolist()
    c = int(batch["local_cp_size"]) if batch.get("local_cp_size") is not None else 1
    work = TRUE["mu"]
    for start, end in zip(bounds, bounds[1:]):
        s = end - start
        work += (TRUE["alpha"] * s * s + TRUE["beta"] * s) / c
        if c > 1:
            work += TRUE["kappa"] * s * (c - 1) / c + TRUE["lambda"] * (c - 1)
    return work


def sleeping_rank(job, rank, socket, steps, errors):
    """One rank: takes `steps` steps of `job` and sleeps each microbatch's
    true_seconds; an error goes to `errors`, naming the rank."""
    try:
        client = packfeed.Client(job, socket_path=socket, rank=rank)
        for _ in range(steps):
            for batch in client.next_step(timeout=60)[0]:
                threading.Event().wait(true_seconds(batch))
        client.close()
    except Exception as error:  # reported by the test, with the rank
        errors.append(f"rank {rank}: {error!r}")


def job_text(prefix, metrics_port):
    return f"""
metrics_address: "127.0.0.1:{metrics_port}"
jobs {{
  name: "fit"
  datasets {{ prefix: "{prefix}" }}
  topology {{ dp: {RANKS} }}
  global_batch: 32
  seq_length: 8192
  eod_id: 0
  append_eod: true
  scheduler {{ kind: "dynamic_cp" max_tokens_per_rank: 2048 cost_model: "llama8b" }}
}}
"""


class CostFitTest(unittest.TestCase):
    def test_the_daemon_learns_the_clusters_rates(self):
        workdir = tempfile.mkdtemp(prefix="pf-cost-fit-")
        prefix = make_dataset(BIN_DIR, f"{workdir}/data", "--count", "2000", "--dist",
                              "lognormal", "--min", "64", "--max", "8000", "--mean", "900",
                              "--sigma", "1.0", "--vocab", "1000", "--seed", "3")
        port = free_port()
        errors = []

        with Daemon(BIN_DIR, job_text(prefix, port), workdir=workdir) as daemon:
            threads = [threading.Thread(target=sleeping_rank,
                                        args=("fit", r, daemon.socket, STEPS, errors))
                       for r in range(RANKS)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=300)
            self.assertEqual(errors, [])
            printed = subprocess.run([str(BIN_DIR / "packfeedctl"), "cost-model", "--socket",
                                      daemon.socket, "--job", "fit"],
                                     capture_output=True, text=True, check=True).stdout
            fit = json.loads(subprocess.run(
                [str(BIN_DIR / "packfeedctl"), "cost-model", "--socket", daemon.socket, "--job",
                 "fit", "--json"], capture_output=True, text=True, check=True).stdout)
            metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
        print(printed)
        rates = {rate["name"]: rate for rate in fit["rates"]}
        self.assertGreater(int(fit["rows"]), 150)
        for name, tolerance in (("alpha", 0.25), ("beta", 0.3), ("kappa", 0.3),
                                ("lambda", 0.3)):
            with self.subTest(rate=name):
                self.assertAlmostEqual(rates[name]["fitted"], TRUE[name],
                                       delta=tolerance * TRUE[name])
                self.assertGreater(rates[name]["determined"], 0.5)
        # A sleep overshoots by up to a millisecond or so on a busy machine.
        self.assertAlmostEqual(rates["mu"]["fitted"], TRUE["mu"], delta=1.5e-3)
        steps = fit["recent_steps"]
        self.assertGreater(len(steps), 0)
        fitted_error = sum(abs(s["fitted_seconds"] - s["measured_seconds"]) for s in steps)
        prior_error = sum(abs(s["prior_seconds"] - s["measured_seconds"]) for s in steps)
        self.assertLess(fitted_error, prior_error / 2, steps)
        self.assertIn('packfeed_cost_fit_rate{packfeed_job="fit",rate="alpha"}', metrics)
        self.assertIn('packfeed_cost_model_version{packfeed_job="fit"}', metrics)
        self.assertIn('packfeed_cost_model_versions_missed_total{packfeed_job="fit"} 0', metrics)


if __name__ == "__main__":
    main()
