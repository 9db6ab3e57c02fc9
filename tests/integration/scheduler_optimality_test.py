#!/usr/bin/env python3
"""The planners' optimality gap: dynamic_cp ÷ the exact optimum
(plan_optimum.py) on random small instances of every trace family, under
s²/c and under the calibrated llama8b model.

Instances: 8 sequences drawn from a trace, scaled so that the longest fits 4
ranks of 1 024 tokens and the batch fills about two microbatches; 4 ranks,
CP sizes 1, 2 and 4, the default CP-inflation budget for both. The optimum
may use up to the token lower bound + 2 microbatches, or as many as the
planner used, and at least the planner's CP inflation when it had to exceed
the budget; so it is a true lower bound for the planner's plan.

The optimum of every instance comes from plan_optimum.by_subsets (dynamic
programming over the sequences' subsets, exact, about 0.1 s each). The MILP
(plan_optimum.solve, HiGHS, seconds each) solves the instances where the
planner is furthest from it again: two formulations of the same rules that
must agree.

Asserted: no plan beats the optimum (the optimum and the planner keep the
same rules), the MILP finds the same optimum, the median per family <= 1.01
(issue 17's target) and the 95th percentile <= 1.15 (a regression guard).
Printed beside them: issue 17's p95 target of 1.05, which the planners do not
reach on every family yet.

ctest runs it under pytest, with the build's paths (tests/conftest.py).
"""
import json
import math
import os
import pathlib
import random
import statistics
import tempfile
from concurrent.futures import ProcessPoolExecutor

import pytest

import plan_optimum
from ctl_checks import lognormal_traces, made_traces

INSTANCES = {"llama8b": 200, "megatron": 200}
# Per family and model, how many instances the MILP solves too.
MILP_CHECKED = 4
RANKS, CAP, SEQUENCES, BUDGET = 4, 1024, 8, 0.05


@pytest.fixture(scope="module")
def families(source_root, tmp_path_factory):
    """The length traces of every family: bench/traces and Megatron's."""
    out = [source_root / "bench" / "traces" / f"{name}.txt"
           for name in ("trace_code_files", "trace_chat_longdoc", "trace_doc_paragraphs")]
    made = lognormal_traces(source_root, tmp_path_factory.mktemp("traces"))
    return out + [path for name, path in made.items()
                  if name in ("sft_lognormal_1024_8192", "dcp_lognormal_512_49152")]


def instances(trace, count):
    lengths = [int(line) for line in trace.read_text().split()]
    rng = random.Random(trace.name)
    out = []
    for _ in range(count):
        batch = rng.sample(lengths, SEQUENCES)
        # Scale so that the longest needs at most CP 4 and the batch fills
        # about two microbatches.
        scale = CAP / max(-(-max(batch) // (RANKS - 0.25)), sum(batch) / (2 * RANKS), 1)
        out.append([max(1, int(s * scale)) for s in batch])
    return out


def heuristic(checks, batches, cost_model, ranks=RANKS, cap=CAP):
    """dynamic_cp's plan of each batch: (model, [(step time, inflation,
    microbatches, the planner's lower bound), ...])."""
    with tempfile.TemporaryDirectory() as scratch:
        lengths = pathlib.Path(scratch) / "lengths.txt"
        lengths.write_text("".join(f"{s}\n" for batch in batches for s in batch))
        dump = pathlib.Path(scratch) / "plan.json"
        out = checks.run("plan", "--lengths", str(lengths), "--global-batch", str(len(batches[0])),
                         "--dp", str(ranks), "--max-tokens-per-rank", str(cap),
                         "--scheduler", "dynamic_cp", "--cost-model", cost_model,
                         "--cp-upgrade-budget", str(BUDGET), "--json",
                         "--dump-plan", str(dump))
        model = json.loads(out.stdout)["cost_model_coefficients"]
        plans = json.loads(dump.read_text())
    out = []
    for entry in plans:
        microbatches = plan_optimum.dumped_microbatches(entry)
        out.append((plan_optimum.step_time(microbatches, model),
                    plan_optimum.inflation(microbatches, cap, ranks), len(microbatches),
                    entry["lower_bound"]))
    return model, out


def rules(job):
    """The optimum's rules for one instance: the planner's, with at least its
    room: its CP inflation where it had to exceed the budget to give every
    rank work, and its microbatch count where that exceeds the default."""
    _, _, _, inflation, microbatches = job
    return dict(budget=max(BUDGET, inflation * (1 + 1e-6) + 1e-6), max_rows=microbatches,
                at_least_default_rows=True)


def optimum(job):
    """The exact optimum of one instance, by plan_optimum.by_subsets. No plan
    at all means the planner's plan breaks a rule the optimum keeps (an
    infinite optimum fails the first check below)."""
    batch, model = job[:2]
    solved = plan_optimum.by_subsets(batch, RANKS, CAP, model, **rules(job))
    return solved[0] if solved else math.inf


def milp_optimum(job):
    """The same optimum as the MILP finds it (HiGHS): a second formulation, to
    check the first. The slack in the budget (rules) and in the bound here:
    at exactly the planner's inflation or step time, HiGHS's tolerances may
    rule the planner's own plan out. Bounded by the planner's step time, the
    search takes about half as long."""
    batch, model, step = job[:3]
    solved = plan_optimum.solve(batch, RANKS, CAP, model, at_most=step * (1 + 1e-6), **rules(job))
    if not solved:
        # The bound is only a pruning aid: HiGHS has been seen to find nothing
        # under it when the optimum is the planner's own plan, at its exact
        # time. Unbounded, the search is slower but decides.
        solved = plan_optimum.solve(batch, RANKS, CAP, model, **rules(job))
    return solved[0] if solved else math.inf


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# At full size there is no optimum to compare with, but the bound must still
# lie below every plan: the scheduler_bench configurations of the families
# made from real files, a few global batches each.
FULL_SIZE = [("trace_code_files", 32, 8192, 512, 2), ("trace_code_files", 8, 16384, 128, 4),
             ("trace_chat_longdoc", 16, 4096, 256, 2), ("trace_chat_longdoc", 512, 4096, 8192, 1),
             ("trace_doc_paragraphs", 64, 4096, 16384, 1),
             ("trace_heavy_tail", 32, 4096, 512, 2), ("trace_heavy_tail", 8, 16384, 128, 4)]


def test_dynamic_cp_against_the_exact_optimum(checks, families):
    everything = {}
    with ProcessPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as pool:
        for cost_model in ("megatron", "llama8b"):
            for trace in families:
                batches = instances(trace, INSTANCES[cost_model])
                model, planned = heuristic(checks, batches, cost_model)
                name = f"{trace.stem} under {cost_model}"
                jobs = [(b, model, step, inflation, m)
                        for b, (step, inflation, m, _) in zip(batches, planned)]
                best = list(pool.map(optimum, jobs, chunksize=8))
                bound_ratios = [o / p[3] for p, o in zip(planned, best)]
                ratios = [p[0] / o for p, o in zip(planned, best)]
                # The MILP on the instances that weigh most in the figures:
                # those where the planner is furthest from the optimum.
                widest = sorted(range(len(jobs)), key=lambda i: -ratios[i])[:MILP_CHECKED]
                milp = pool.map(milp_optimum, [jobs[i] for i in widest])
                for i, other in zip(widest, milp):
                    checks.check(f"{name}: instance {i}: the MILP's optimum is the same",
                                 abs(other / best[i] - 1) <= 1e-5, f"{other} against {best[i]}")
                everything.setdefault(cost_model, []).extend(ratios)
                median, p95 = statistics.median(ratios), percentile(ratios, 0.95)
                print(f"{name:50} {len(ratios)} instances: heuristic/optimum median {median:.4f}, "
                      f"p95 {p95:.4f}, max {max(ratios):.4f}", flush=True)
                # The optimum is a lower bound: a plan below it means a plan
                # that breaks a rule the optimum keeps.
                checks.check(f"{name}: no plan beats the optimum", min(ratios) > 1 - 1e-6,
                             f"min ratio {min(ratios)}")
                # The bound (scheduler/lower_bound.h, the planner's own figure) is
                # a lower bound on every plan, the optimum's included.
                checks.check(f"{name}: the lower bound never exceeds the optimum",
                             min(bound_ratios) > 1 - 1e-6, f"min optimum/bound {min(bound_ratios)}")
                print(f"{'':50} optimum/lower bound median {statistics.median(bound_ratios):.4f}, "
                      f"max {max(bound_ratios):.4f}")
                checks.check(f"{name}: median <= 1.01", median <= 1.01, f"{median:.4f}")
                checks.check(f"{name}: p95 <= 1.15", p95 <= 1.15, f"{p95:.4f}")
                print(f"{'':50} target p95 <= 1.05: {'met' if p95 <= 1.05 else 'missed'}")
    for cost_model, ratios in everything.items():
        print(f"all families under {cost_model}: median {statistics.median(ratios):.4f}, "
              f"p95 {percentile(ratios, 0.95):.4f} over {len(ratios)} instances")


def test_the_lower_bound_lies_below_every_full_size_plan(checks, source_root, tmp_path):
    made = made_traces(source_root, tmp_path)
    for trace, ranks, cap, size, steps in FULL_SIZE:
        path = made.get(trace, source_root / "bench" / "traces" / f"{trace}.txt")
        lengths = [int(line) for line in pathlib.Path(path).read_text().split()]
        batches = [lengths[i * size:(i + 1) * size] for i in range(steps)]
        for cost_model in ("megatron", "llama8b"):
            _, planned = heuristic(checks, batches, cost_model, ranks, cap)
            gaps = [step / bound - 1 for step, _, _, bound in planned]
            name = f"{trace}, {ranks} ranks, {size} sequences, {cost_model}"
            print(f"{name:60} plan over lower bound - 1: {', '.join(f'{g:.3f}' for g in gaps)}")
            checks.check(f"{name}: no plan beats the lower bound", min(gaps) > -1e-9, f"{min(gaps)}")
