#!/usr/bin/env python3
"""bench/megatron_core_peer.py on its small cases (--quick: one global batch
of each configuration up to 64 ranks): Megatron-Core's own hybrid-CP
scheduler is run (from the megatron-core wheel) beside packfeed's planners,
both judged by the script's one evaluator on the same lengths. Checks that
every configuration prints every schedule's row, and that no figure beats
its ideal (the ideal is a lower bound under every column's evaluator: a
figure below 1 is an evaluator charging one side less than the other).

ctest runs it under pytest, with the build's paths (tests/conftest.py).
Skipped only when PyPI cannot be reached to fetch the wheel."""
import os
import subprocess
import sys

import pytest

from megatron_venv import UNREACHABLE

SCHEDULES = 7  # packfeed under two models and three objectives, and Megatron-Core


def test_one_evaluator_judges_both_forms_alike(source_root, ctl):
    """packfeed's plans of a small case, written also as Megatron-Core's
    groups (one group a microbatch, each rank listing its sequences): the
    script's two judges must charge them alike under s²/c (no per-microbatch
    term), barrier by barrier and as they run: the same lengths, one
    evaluator. Joined by hybrid_groups, as packfeed.megatron runs them, the
    same sub-samples sit on the same ranks in no more groups, and the step
    is never longer."""
    packfeedctl = ctl
    sys.path.insert(0, os.path.join(source_root, "bench"))
    import megatron_core_peer as peer
    trace = os.path.join(source_root, "bench", "traces", "trace_chat_longdoc.txt")
    with open(trace) as f:
        lengths = [int(line) for line in f if line.strip()]
    ranks, cap, gbs = 16, 4096, 256
    s2 = peer.S2
    _, plans = peer.plan_packfeed(packfeedctl, trace, ranks, cap, gbs, 2, "megatron", "barrier")
    failures = []
    for entry in plans:
        batch = lengths[entry["step"] * gbs:(entry["step"] + 1) * gbs]
        groups = [[[q["sample"] for q in sequences] for sequences in microbatch]
                  for microbatch in entry["microbatches"]]
        ours, _, _ = peer.judge_packfeed(entry["microbatches"], s2, cap)
        theirs, _, _ = peer.judge_megatron(None, groups, batch, s2, cap)
        ours_g = peer.graph_time(peer.packfeed_graph_runs(entry["microbatches"], s2, ranks),
                                 ranks, s2)
        theirs_g = peer.graph_time(peer.megatron_graph_runs(groups, batch, s2, ranks), ranks, s2)
        for what, a, b in (("barrier", ours, theirs), ("as it runs", ours_g, theirs_g)):
            if abs(a - b) > 1e-9 * max(a, b):
                failures.append(f"step {entry['step']} {what}: one plan judged {a} as "
                                f"packfeed's, {b} as Megatron-Core's")
        # Run as one group per partition into CP groups (hybrid_groups), the
        # same sub-samples on the same ranks, and never slower.
        merged = peer.as_megatron_groups(entry)
        if len(merged) > len(groups) or sorted(
                (r, q) for group in merged for r, ids in enumerate(group) for q in ids) != sorted(
                (r, q) for group in groups for r, ids in enumerate(group) for q in ids):
            failures.append(f"step {entry['step']}: hybrid groups {entry['hybrid_groups']} "
                            f"move sub-samples or add groups")
        joined, _, _ = peer.judge_megatron(None, merged, batch, s2, cap)
        if joined > theirs * (1 + 1e-9):
            failures.append(f"step {entry['step']}: hybrid groups judged {joined}, "
                            f"a group per microbatch {theirs}")
    print(f"one evaluator: {len(plans)} plans judged alike in both forms")
    assert not failures, "\n".join(failures)


def test_every_configuration_prints_every_schedule(source_root, ctl):
    run = subprocess.run([sys.executable, os.path.join(source_root, "bench",
                                                       "megatron_core_peer.py"),
                          "--quick", "--packfeedctl", ctl],
                         capture_output=True, text=True, timeout=500)
    print(run.stdout)
    if run.returncode != 0:
        if any(s in run.stderr for s in UNREACHABLE):
            pytest.skip(f"PyPI cannot be reached for the megatron-core wheel:\n{run.stderr}")
        pytest.fail(f"megatron_core_peer.py failed ({run.returncode}):\n{run.stderr}")
    rows, configuration, failures = {}, None, []
    lines = run.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("configuration"))
    for line in lines[start + 1:]:
        if "skipped" in line:
            failures.append(line)
            continue
        if not line[:40].isspace():
            configuration = line[:40].strip()
        # s2/c, calib, s2/c g, calib g, s2/c mb, s2/c loop, calib loop, inflation, M, ms
        label, figures = line[41:].rsplit(None, 10)[0].strip(), line.split()[-10:]
        rows.setdefault(configuration, []).append(label)
        below = [f for f in figures[:7] if float(f) < 0.999]
        if below:
            failures.append(f"{configuration} {label}: step/ideal {below} below the ideal")
    for configuration, labels in rows.items():
        if len(labels) != SCHEDULES or labels[-1] != "Megatron-Core hybrid CP":
            failures.append(f"{configuration}: rows {labels}")
    if len(rows) < 5:
        failures.append(f"{len(rows)} configurations, expected at least 5")
    assert not failures, "\n".join(failures)
