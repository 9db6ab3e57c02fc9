#!/usr/bin/env python3
"""packfeed's planners beside Megatron-Core's own hybrid-CP scheduler, on the same batches.

  megatron_core_peer.py [--packfeedctl PATH] [--traces DIR]... [--steps K] [--quick]

Megatron-Core's scheduler is run, not quoted: its code comes from the
megatron-core 0.16.1 wheel on PyPI (downloaded once into ~/.cache/packfeed),
`megatron/core/pipeline_parallel/hybrid_cp_schedule.py`,
`BalancedCPScheduler.get_groups_and_subsamples`. Only the two imports the
scheduling path never touches (parallel_state, rerun_state_machine) are
stubbed; the process group is an object that answers size().

Both schedules are judged by one evaluator here, under s²/c and under the
calibrated model packfeedctl reports (its coefficients come from
`packfeedctl plan --json`):
  - Megatron-Core: ranks meet at the end of each group; within a group a
    rank runs its sub-samples one by one, each its own microbatch (μ each),
    at the CP size = the ranks that hold it in that group.
  - packfeed: ranks meet at the end of each microbatch (one pack, one μ).
The loop columns judge packfeed's plans as Megatron-Core's hybrid-CP loop
runs them under --hybrid-context-parallel, by Megatron-Core's evaluator:
the microbatches with the same CP groups one group (hybrid_groups of
`packfeedctl plan --dump-plan`), μ per sub-sample.
step/ideal = modelled step time / the ideal of plan_stats.h (every sequence
at its needed CP, perfect balance, the token lower bound of microbatches).

Both are also judged as they run (GraphStepTime of plan_stats.h): ranks meet
only where the model makes them, the holders of one sequence (its CP group),
and all at the gradient reduction. A rank runs its sequences in order; one
starts when the last of its holders is free. Megatron-Core's groups follow
one another with no barrier between them; packfeed's microbatches too.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types
import zipfile

# One definition of the cost model and the padding rule, shared with the
# optimality test.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "integration"))
from plan_optimum import cost  # noqa: E402
import plan_optimum  # noqa: E402

WHEEL = "megatron-core==0.16.1"
SOURCE = "megatron/core/pipeline_parallel/hybrid_cp_schedule.py"
HERE = os.path.dirname(os.path.abspath(__file__))
# Megatron's lognormal traces are generated, not stored (traces/megatron_lognormal.py).
LOGNORMAL_TRACES = os.path.expanduser("~/.cache/packfeed/traces")

# name, trace, ranks, max tokens per rank, global batch
CONFIGS = [
    ("code files, 32 ranks, 8192, 512", "trace_code_files", 32, 8192, 512),
    ("code files, 8 ranks, 16384, 128", "trace_code_files", 8, 16384, 128),
    ("chat+long docs, 512 ranks, 4096, 8192", "trace_chat_longdoc", 512, 4096, 8192),
    ("chat+long docs, 16 ranks, 4096, 256", "trace_chat_longdoc", 16, 4096, 256),
    ("doc paragraphs, 64 ranks, 4096, 16384", "trace_doc_paragraphs", 64, 4096, 16384),
    ("public long-tail, 32 ranks, 3072, 256", "trace_dcp_lognormal_512_49152", 32, 3072, 256),
    ("public SFT, 8 ranks, 8192, 256", "trace_sft_lognormal_1024_8192", 8, 8192, 256),
]


# s²/c alone: no per-microbatch cost, no pipeline bubble.
S2 = {"alpha": 1.0, "beta": 0.0, "kappa": 0.0, "lambda": 0.0, "microbatch": 0.0, "bubble": 0.0}


def load_megatron_scheduler():
    cache = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")),
                         "packfeed")
    os.makedirs(cache, exist_ok=True)
    wheels = [f for f in os.listdir(cache) if f.startswith("megatron_core-0.16.1-")]
    if not wheels:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                        "--only-binary=:all:", "--python-version", "3.11", "-d", cache, WHEEL],
                       check=True)
        wheels = [f for f in os.listdir(cache) if f.startswith("megatron_core-0.16.1-")]
    with zipfile.ZipFile(os.path.join(cache, wheels[0])) as wheel:
        source = wheel.read(SOURCE).decode()
    for name in ("megatron", "megatron.core"):
        sys.modules.setdefault(name, types.ModuleType(name))
    parallel_state = types.ModuleType("megatron.core.parallel_state")
    rerun = types.ModuleType("megatron.core.rerun_state_machine")
    rerun.RerunDataIterator = object
    sys.modules["megatron.core.parallel_state"] = parallel_state
    sys.modules["megatron.core.rerun_state_machine"] = rerun
    sys.modules["megatron.core"].parallel_state = parallel_state
    module = types.ModuleType("hybrid_cp_schedule")
    exec(compile(source, f"{wheels[0]}/{SOURCE}", "exec"), module.__dict__)
    return module.BalancedCPScheduler


class Group:
    def __init__(self, size):
        self._size = size

    def size(self):
        return self._size


def needed_cp(s, cap):
    return plan_optimum.own_cp(s, cap, 1 << 30)


def with_pipeline(times, model):
    """Σ of barrier-to-barrier times (μ already in them), plus the bubble."""
    total = sum(times)
    return total + model["bubble"] * total / max(len(times), 1)


def ideal(lengths, ranks, cap, model):
    work = sum(cost(model, s, needed_cp(s, cap)) * needed_cp(s, cap) for s in lengths)
    bound = max(1, -(-sum(lengths) // (ranks * cap)))
    return (bound + model["bubble"]) * (work / ranks / bound + model["microbatch"])


def judge_megatron(groups, sample_groups, lengths, model, cap):
    """Step time and CP inflation of Megatron-Core's groups."""
    times, weighted = [], 0.0
    for per_rank_ids in sample_groups:
        holders = {}
        for ids in per_rank_ids:
            for sid in ids:
                holders[sid] = holders.get(sid, 0) + 1
        group_time = 0.0
        for ids in per_rank_ids:
            rank_time = sum(cost(model, lengths[sid], holders[sid]) + model["microbatch"]
                            for sid in ids)
            group_time = max(group_time, rank_time)
        times.append(group_time)
        for sid, c in holders.items():
            weighted += lengths[sid] * c / needed_cp(lengths[sid], cap)
    return with_pipeline(times, model), weighted / sum(lengths), len(sample_groups)


def judge_megatron_per_microbatch(sample_groups, lengths, model):
    """Megatron-Core's groups with a barrier at each of its microbatches (the
    k-th sub-sample of every rank of a group together), as plan --json's
    step/ideal judges packfeed's: Σ_group Σ_k max_rank (cost + μ)."""
    times = []
    for per_rank_ids in sample_groups:
        holders = {}
        for ids in per_rank_ids:
            for sid in ids:
                holders[sid] = holders.get(sid, 0) + 1
        for k in range(max(len(ids) for ids in per_rank_ids)):
            times.append(max(cost(model, lengths[ids[k]], holders[ids[k]]) + model["microbatch"]
                             for ids in per_rank_ids if k < len(ids)))
    return with_pipeline(times, model)


# Both schedules are charged for the sequences' own lengths, not for the
# padding either adds: one evaluator, the same lengths.
def judge_packfeed(microbatches, model, cap):
    times, weighted, real = [], 0.0, 0
    seen = set()
    for ranks in microbatches:
        worst = 0.0
        for sequences in ranks:
            worst = max(worst, sum(cost(model, q["length"], q["cp_size"]) for q in sequences))
            for q in sequences:
                if q["sample"] not in seen:
                    seen.add(q["sample"])
                    weighted += q["length"] * q["cp_size"] / needed_cp(q["length"], cap)
                    real += q["length"]
        times.append(worst + model["microbatch"])
    return with_pipeline(times, model), weighted / real, len(microbatches)


def as_megatron_groups(entry):
    """A packfeed plan as Megatron-Core's hybrid_context_parallel_forward_backward
    runs it under --hybrid-context-parallel (packfeed.megatron): the
    microbatches of one hybrid_group (the same CP groups) one group, each
    rank's sub-samples back to back in microbatch order; judge_megatron
    then charges it as it charges Megatron-Core's own (μ per sub-sample)."""
    groups = []
    for microbatch, g in zip(entry["microbatches"], entry["hybrid_groups"]):
        if g == len(groups):
            groups.append([[] for _ in microbatch])
        for rank, sequences in enumerate(microbatch):
            groups[g][rank].extend(q["sample"] for q in sequences)
    return groups


def graph_time(runs, ranks, model):
    """Makespan (plus the bubble's share) of `runs`: per rank, its work in
    order, each item (holders, work) starting when every holder is free."""
    heads = [0] * ranks
    free = [0.0] * ranks
    items = 0
    pending = sum(len(run) for run in runs)
    # An item is ready when it is next on every holder's list.
    while items < pending:
        progressed = False
        for rank in range(ranks):
            while heads[rank] < len(runs[rank]):
                holders, work = runs[rank][heads[rank]]
                if any(runs[h][heads[h]][0] is not holders for h in holders
                       if heads[h] < len(runs[h])) or any(heads[h] >= len(runs[h])
                                                          for h in holders):
                    break
                start = max(free[h] for h in holders)
                for h in holders:
                    free[h] = start + work + model["microbatch"]
                    heads[h] += 1
                items += len(holders)
                progressed = True
        if not progressed:
            raise RuntimeError("holders list their shared work in different orders")
    makespan = max(free)
    microbatches = max(1, max(len(run) for run in runs))
    return makespan + model["bubble"] * makespan / microbatches


def megatron_graph_runs(sample_groups, lengths, model, ranks):
    runs = [[] for _ in range(ranks)]
    for per_rank_ids in sample_groups:
        holders = {}
        for rank, ids in enumerate(per_rank_ids):
            for sid in ids:
                holders.setdefault(sid, []).append(rank)
        shared = {sid: tuple(h) for sid, h in holders.items()}
        for rank, ids in enumerate(per_rank_ids):
            for sid in ids:
                c = len(shared[sid])
                runs[rank].append((shared[sid], cost(model, lengths[sid], c)))
    return runs


def packfeed_graph_runs(microbatches, model, ranks):
    runs = [[] for _ in range(ranks)]
    for per_rank in microbatches:
        rank = 0
        while rank < len(per_rank):
            c = per_rank[rank][0]["cp_size"]
            holders = tuple(range(rank, rank + c))
            work = sum(cost(model, q["length"], c) for q in per_rank[rank])
            for h in holders:
                runs[h].append((holders, work))
            rank += c
    return runs


def plan_packfeed(packfeedctl, trace, ranks, cap, gbs, steps, cost_model, objective,
                  budget=0.05):
    with tempfile.TemporaryDirectory() as scratch:
        dump = os.path.join(scratch, "plan.json")
        out = subprocess.run(
            [packfeedctl, "plan", "--lengths", trace, "--global-batch", str(gbs), "--dp",
             str(ranks), "--cp", "1", "--max-tokens-per-rank", str(cap), "--scheduler",
             "dynamic_cp", "--cost-model", cost_model, "--objective", objective, "--steps",
             str(steps), "--json", "--cp-upgrade-budget", str(budget),
             "--dump-plan", dump], check=True, capture_output=True, text=True)
        with open(dump) as f:
            return json.loads(out.stdout), json.load(f)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--packfeedctl", default=os.path.join(HERE, "..", "build", "server",
                                                              "packfeedctl"))
    parser.add_argument("--traces", action="append",
                        default=[os.path.join(HERE, "traces"), LOGNORMAL_TRACES])
    parser.add_argument("--steps", type=int, default=4, help="global batches per configuration")
    parser.add_argument("--quick", action="store_true", help="one batch, small configurations")
    parser.add_argument("--cp-upgrade-budget", type=float, default=0.05,
                        help="packfeed's budget: 0.05 its jobs' default, 1.0 a hybrid-CP "
                             "pretraining job's")
    args = parser.parse_args()
    sys.path.insert(0, os.path.join(HERE, "traces"))
    import megatron_lognormal
    megatron_lognormal.write_traces(LOGNORMAL_TRACES)
    scheduler_class = load_megatron_scheduler()

    print("step/ideal (lower is better) under s²/c and under the calibrated llama8b model, "
          "barrier by barrier and as it runs (g);\ns2/c mb: under s²/c with a barrier at "
          "every microbatch, Megatron-Core's sub-samples included (plan --json's step/ideal);\n"
          "loop: as Megatron-Core's hybrid-CP loop runs the plan (packfeed's under\n"
          "--hybrid-context-parallel: a group per partition into CP groups, μ per "
          "sub-sample);\n"
          "CP inflation; microbatches (Megatron-Core: groups); scheduling ms per batch (median)")
    header = (f"{'configuration':40} {'scheduler':34} {'s2/c':>6} {'calib':>6} {'s2/c g':>6} "
              f"{'calib g':>7} {'s2/c mb':>7} {'s2/c loop':>9} {'calib loop':>10} {'infl':>5} "
              f"{'M':>6} "
              f"{'ms':>8}")
    print(header)
    for name, trace_name, ranks, cap, gbs in CONFIGS:
        if args.quick and ranks > 64:
            continue
        trace = next((os.path.join(d, trace_name + ".txt") for d in args.traces
                      if os.path.exists(os.path.join(d, trace_name + ".txt"))), None)
        if trace is None:
            print(f"{name:40} skipped: {trace_name}.txt not found")
            continue
        with open(trace) as f:
            lengths = [int(line) for line in f if line.strip()]
        steps = max(1, min(1 if args.quick else args.steps, len(lengths) // gbs))
        rows = {}
        # packfeed, planning under s²/c and under the calibrated model.
        for objective in ("barrier", "graph", "hybrid"):
            for cost_model in ("megatron", "llama8b"):
                summary, plans = plan_packfeed(args.packfeedctl, trace, ranks, cap, gbs, steps,
                                               cost_model, objective, args.cp_upgrade_budget)
                calibrated = summary["calibrated_model_coefficients"]
                label = ("packfeed dynamic_cp "
                         f"({cost_model}{'' if objective == 'barrier' else ', ' + objective})")
                rows[label] = (plans, summary["schedule_ms_median"])
        megatron_runs, megatron_ms = [], []
        for step in range(steps):
            batch = lengths[step * gbs:(step + 1) * gbs]
            scheduler = scheduler_class(cap, Group(ranks))
            start = time.perf_counter()
            groups, sample_groups = scheduler.get_groups_and_subsamples(
                list(enumerate(batch)), None)
            megatron_ms.append(1000 * (time.perf_counter() - start))
            megatron_runs.append((groups, sample_groups))
        figures = {}
        for label, (plans, ms) in rows.items():
            acc = []
            for entry in plans:
                batch = lengths[entry["step"] * gbs:(entry["step"] + 1) * gbs]
                a, inflation, m = judge_packfeed(entry["microbatches"], S2, cap)
                b, _, _ = judge_packfeed(entry["microbatches"], calibrated, cap)
                ga = graph_time(packfeed_graph_runs(entry["microbatches"], S2, ranks), ranks, S2)
                gb = graph_time(packfeed_graph_runs(entry["microbatches"], calibrated, ranks),
                                ranks, calibrated)
                groups = as_megatron_groups(entry)
                loop_a, _, _ = judge_megatron(None, groups, batch, S2, cap)
                loop_b, _, _ = judge_megatron(None, groups, batch, calibrated, cap)
                acc.append((a / ideal(batch, ranks, cap, S2),
                            b / ideal(batch, ranks, cap, calibrated),
                            ga / ideal(batch, ranks, cap, S2),
                            gb / ideal(batch, ranks, cap, calibrated),
                            a / ideal(batch, ranks, cap, S2),
                            loop_a / ideal(batch, ranks, cap, S2),
                            loop_b / ideal(batch, ranks, cap, calibrated), inflation, m))
            figures[label] = (acc, ms)
        acc = []
        for step, (groups, sample_groups) in enumerate(megatron_runs):
            batch = lengths[step * gbs:(step + 1) * gbs]
            a, inflation, m = judge_megatron(groups, sample_groups, batch, S2, cap)
            b, _, _ = judge_megatron(groups, sample_groups, batch, calibrated, cap)
            ga = graph_time(megatron_graph_runs(sample_groups, batch, S2, ranks), ranks, S2)
            gb = graph_time(megatron_graph_runs(sample_groups, batch, calibrated, ranks), ranks,
                            calibrated)
            mb = judge_megatron_per_microbatch(sample_groups, batch, S2)
            acc.append((a / ideal(batch, ranks, cap, S2),
                        b / ideal(batch, ranks, cap, calibrated),
                        ga / ideal(batch, ranks, cap, S2),
                        gb / ideal(batch, ranks, cap, calibrated),
                        mb / ideal(batch, ranks, cap, S2),
                        a / ideal(batch, ranks, cap, S2),
                        b / ideal(batch, ranks, cap, calibrated), inflation, m))
        figures["Megatron-Core hybrid CP"] = (acc, statistics.median(megatron_ms))
        for label, (acc, ms) in figures.items():
            mean = [statistics.fmean(column) for column in zip(*acc)]
            print(f"{name:40} {label:34} {mean[0]:6.3f} {mean[1]:6.3f} {mean[2]:6.3f} "
                  f"{mean[3]:7.3f} {mean[4]:7.3f} {mean[5]:9.3f} {mean[6]:10.3f} {mean[7]:5.2f} "
                  f"{mean[8]:6.2f} "
                  f"{ms:8.2f}", flush=True)
            name = ""


if __name__ == "__main__":
    main()
