#!/usr/bin/env python3
"""The offline planner and the daemon agree: for the same configuration and
step, `packfeedctl plan --config` (sampler, sample rules and planner options
composed offline) gives exactly the plan a running packfeedd reports through
`plan-step`, for every scheduler kind — Megatron's DP-rank-major order and
SFT padding included.

ctest runs it under pytest, with the build's paths (tests/conftest.py)."""
import json
import pathlib
import subprocess
import tempfile

from daemon_harness import Daemon

STEPS = 3
# name -> (dataset kind, topology, sampler, scheduler block)
JOBS = {
    "balanced": ("VARLEN", "tp: 2 cp: 2 dp: 2", "SAMPLER_MODE_SHUFFLE",
                 'kind: "balanced" max_tokens_per_rank: 2048'),
    "dynamic": ("VARLEN", "tp: 1 cp: 2 dp: 4", "SAMPLER_MODE_SHUFFLE",
                'kind: "dynamic_cp" max_tokens_per_rank: 1024 cost_model: "llama8b"'),
    "megatron": ("VARLEN", "tp: 1 cp: 2 dp: 2", "SAMPLER_MODE_SEQUENTIAL",
                 'kind: "megatron_dp_balanced" max_tokens_per_rank: 2048'),
    "megatron_sft": ("SFT", "tp: 1 cp: 1 dp: 4", "SAMPLER_MODE_SEQUENTIAL",
                     'kind: "megatron_dp_balanced" max_tokens_per_rank: 2048'),
}


def config_text(prefix):
    out = ""
    for name, (kind, topology, sampler, scheduler) in JOBS.items():
        out += f"""
jobs {{
  name: "{name}"
  datasets {{ prefix: "{prefix}" kind: DATASET_KIND_{kind} }}
  topology {{ {topology} }}
  global_batch: 32
  seq_length: 1024
  eod_id: 1000
  append_eod: true
  seed: 5
  sampler: {sampler}
  scheduler {{ {scheduler} }}
}}
"""
    return out


def daemon_plan(daemon, job, step):
    """plan-step's microbatches as [[per dp-cp rank: [sequence tuple]]]."""
    reply = daemon.ctl_json("plan-step", "--job", job, str(step))
    ranks = []
    for microbatch in reply["microbatches"]:
        row = {}
        for group in microbatch["groups"]:
            first, size = group.get("first_rank", 0), group.get("size", 1)
            sequences = [(s.get("dataset", 0), int(s.get("document", 0)), int(s["length"]),
                          int(s["padded_length"]), size) for s in group["sequences"]]
            for r in range(first, first + size):
                row[r] = sequences
        ranks.append([row[r] for r in sorted(row)])
    return ranks


def offline_plans(ctl, config, job, dump):
    subprocess.run([ctl, "plan", "--config", str(config), "--job", job, "--steps", str(STEPS),
                    "--dump-plan", str(dump), "--json"], check=True, capture_output=True)
    plans = []
    for step in json.loads(dump.read_text()):
        plans.append([[[(s["dataset"], s["document"], s["length"], s["padded_length"],
                         s["cp_size"]) for s in rank] for rank in microbatch]
                      for microbatch in step["microbatches"]])
    return plans


def test_daemon_plans_what_ctl_plans(bin_dir, checks):
    ctl = str(bin_dir / "packfeedctl")
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        checks.run("make-dataset", "--out", str(work / "data"), "--count", "400",
                   "--dist", "lognormal", "--min", "8", "--max", "1500", "--mean", "300",
                   "--sigma", "1.2", "--vocab", "1000", "--seed", "3")
        with Daemon(bin_dir, config_text(work / "data"), workdir=work) as daemon:
            for job in JOBS:
                offline = offline_plans(ctl, daemon.config, job, work / f"{job}.json")
                checks.check(f"{job}: {STEPS} offline steps", len(offline) == STEPS, len(offline))
                for step, plan in enumerate(offline):
                    online = daemon_plan(daemon, job, step)
                    checks.check(f"{job} step {step}: the same plan", plan == online,
                                 f"offline {str(plan)[:300]}\n  daemon {str(online)[:300]}")
                print(f"{job}: {STEPS} steps compared "
                      f"({sum(len(p) for p in offline)} microbatches)")
