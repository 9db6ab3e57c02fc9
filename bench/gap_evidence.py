#!/usr/bin/env python3
"""Where a plan stays far above the lower bound: is the plan or the bound loose?

  gap_evidence.py PACKFEEDCTL TRACE [--instances 40] [--heavy]

Draws small instances of TRACE (8 sequences, 4 ranks of 1 024 tokens, CP up
to 4, the default CP-inflation budget, as scheduler_optimality_test.py does)
and solves each exactly (plan_optimum.py's MILP). With --heavy every
instance holds the trace's longest kind of sequence: one of its 1 % longest,
scaled to need all 4 ranks, so the instances have the shape of the
full-size batches that stay far from the bound. Prints, under s²/c, the
quantiles of plan / optimum (the plan's own slack) and of optimum / bound
(the bound's), so a gap at full size can be read as one or the other.
"""
import argparse
import json
import pathlib
import random
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests" / "integration"))
import plan_optimum  # noqa: E402

RANKS, CAP, SEQUENCES, BUDGET = 4, 1024, 8, 0.05


def instances(lengths, count, heavy, rng):
    longest = sorted(lengths)[int(0.99 * len(lengths)):]
    out = []
    for _ in range(count):
        batch = rng.sample(lengths, SEQUENCES - 1 if heavy else SEQUENCES)
        if heavy:
            batch.append(rng.choice(longest))
        # The longest needs at most CP 4 (with --heavy, exactly 4); the batch
        # fills about two microbatches.
        scale = CAP / max(-(-max(batch) // (RANKS - 0.25)), sum(batch) / (2 * RANKS), 1)
        out.append([max(1, int(s * scale)) for s in batch])
    return out


def plans(ctl, batches):
    """Per batch: (step time under s²/c, CP inflation, microbatches, bound)."""
    with tempfile.TemporaryDirectory() as scratch:
        path = pathlib.Path(scratch) / "lengths.txt"
        path.write_text("".join(f"{s}\n" for batch in batches for s in batch))
        dump = pathlib.Path(scratch) / "plan.json"
        out = subprocess.run(
            [ctl, "plan", "--lengths", str(path), "--global-batch", str(SEQUENCES), "--dp",
             str(RANKS), "--max-tokens-per-rank", str(CAP), "--scheduler", "dynamic_cp",
             "--cp-upgrade-budget", str(BUDGET), "--json", "--dump-plan", str(dump)],
            check=True, capture_output=True, text=True).stdout
        model = json.loads(out)["cost_model_coefficients"]
        entries = json.loads(dump.read_text())
    result = []
    for entry in entries:
        microbatches = plan_optimum.dumped_microbatches(entry)
        result.append((plan_optimum.step_time(microbatches, model),
                       plan_optimum.inflation(microbatches, CAP, RANKS), len(microbatches),
                       entry["lower_bound"]))
    return model, result


def quantiles(values):
    ordered = sorted(values)
    return (f"median {statistics.median(ordered):.3f}, p90 {ordered[int(0.9 * len(ordered))]:.3f}, "
            f"max {ordered[-1]:.3f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("ctl")
    parser.add_argument("trace", type=pathlib.Path)
    parser.add_argument("--instances", type=int, default=40)
    parser.add_argument("--heavy", action="store_true")
    args = parser.parse_args()
    lengths = [int(line) for line in args.trace.read_text().split()]
    batches = instances(lengths, args.instances, args.heavy, random.Random(args.trace.name))
    model, planned = plans(args.ctl, batches)
    plan_over_optimum, optimum_over_bound = [], []
    for batch, (step, inflation, microbatches, bound) in zip(batches, planned):
        best, _ = plan_optimum.solve(batch, RANKS, CAP, model,
                                     budget=max(BUDGET, inflation * (1 + 1e-6) + 1e-6),
                                     max_rows=microbatches, at_least_default_rows=True)
        plan_over_optimum.append(step / best)
        optimum_over_bound.append(best / bound)
    print(f"{args.trace.stem}{' (each with a longest sequence)' if args.heavy else ''}, "
          f"{len(batches)} instances, s2/c:")
    print(f"  plan / optimum:  {quantiles(plan_over_optimum)}")
    print(f"  optimum / bound: {quantiles(optimum_over_bound)}")


if __name__ == "__main__":
    main()
