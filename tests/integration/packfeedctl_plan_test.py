#!/usr/bin/env python3
"""packfeedctl plan, as a user runs it: megatron_dp_balanced on the bench
traces must reproduce the figures measured by running Megatron-LM's own code
(docs/SCHEDULER.md); packfeed's planners must beat them; the graph
objective, --dump-plan, sampled batches, cost models, --plot and every
refusal's message.

ctest runs it under pytest, with the build's paths (tests/conftest.py).
"""
import json

import pytest

from ctl_checks import lognormal_traces


def plan(checks, *args, ok=True):
    return checks.run("plan", *args, ok=ok)


@pytest.fixture(scope="module")
def traces(source_root, tmp_path_factory):
    """Megatron's lognormal length traces (bench/traces)."""
    folder = tmp_path_factory.mktemp("traces")
    lognormal_traces(source_root, folder)
    return folder


# (trace, DP, CP, max tokens/rank, GBS) -> Megatron's M, lower bound,
# step/ideal (s²), padding % as measured by running Megatron-LM's code.
MEGATRON = [
    ("trace_sft_lognormal_1024_8192", 8, 1, 8192, 256, 16.5, 13.1, 2.04, 0.0),
    ("trace_sft_lognormal_1024_8192", 4, 2, 4096, 256, 32.5, 25.7, 1.84, 0.03),
    ("trace_sft_lognormal_1024_8192", 4, 2, 8192, 256, 15.3, 13.1, 1.40, 0.03),
    ("trace_dcp_lognormal_512_49152", 2, 16, 3072, 256, 17.8, 15.3, 1.51, 0.25),
    ("trace_dcp_lognormal_512_49152", 64, 16, 3072, 8192, 18, 15, 3.55, 0.25),
]

# packfeed's planners on the same traces: better balanced than
# Megatron's best scheduler there, within a microbatch of the bound.
OURS = [  # trace, DP, CP, cap, GBS, scheduler, Megatron's best step/ideal
    ("trace_sft_lognormal_1024_8192", 8, 1, 8192, 256, "balanced", 1.035),
    ("trace_sft_lognormal_1024_8192", 4, 2, 4096, 256, "balanced", 1.022),
    ("trace_sft_lognormal_1024_8192", 4, 2, 8192, 256, "balanced", 1.40),
    ("trace_dcp_lognormal_512_49152", 2, 16, 3072, 256, "balanced", 1.061),
    ("trace_sft_lognormal_1024_8192", 8, 1, 8192, 256, "dynamic_cp", 1.035),
]


def test_megatron_dp_balanced_reproduces_megatrons_figures(checks, traces):
    check = checks.check
    for trace, dp, cp, cap, gbs, m, lower, step_ideal, padding in MEGATRON:
        name = f"{trace} DP{dp}xCP{cp} cap {cap} GBS {gbs}"
        got = json.loads(plan(checks, "--lengths", str(traces / f"{trace}.txt"),
                              "--scheduler", "megatron_dp_balanced",
                              "--dp", str(dp), "--cp", str(cp),
                              "--max-tokens-per-rank", str(cap),
                              "--global-batch", str(gbs), "--json").stdout)
        check(name + " M", abs(got["microbatches_mean"] - m) < 0.051, got)
        check(name + " lower bound",
              abs(got["microbatches_lower_bound_mean"] - lower) < 0.051, got)
        check(name + " step/ideal", abs(got["step_over_ideal"] - step_ideal) < 0.006, got)
        check(name + " padding", abs(got["padding_pct"] - padding) < 0.006, got)
        check(name + ": no lower bound for Megatron's padding",
              got["lower_bound"] is None and got["gap_to_bound"] is None, got)


def test_our_planners_beat_megatrons_best(checks, traces):
    check = checks.check
    for trace, dp, cp, cap, gbs, scheduler, megatron_best in OURS:
        name = f"{scheduler} {trace} DP{dp}xCP{cp} cap {cap}"
        got = json.loads(plan(checks, "--lengths", str(traces / f"{trace}.txt"),
                              "--scheduler", scheduler, "--dp", str(dp),
                              "--cp", str(cp), "--max-tokens-per-rank", str(cap),
                              "--global-batch", str(gbs), "--json").stdout)
        check(name + " beats Megatron", got["step_over_ideal"] < megatron_best, got)
        check(name + " M within one of its bound", got["microbatches_mean"] <=
              got["microbatches_lower_bound_mean"] + 1, got)
        check(name + " padding <= 0.5 %", got["padding_pct"] <= 0.5, got)
        check(name + " tokens within the cap", got["max_tokens_on_a_rank"] <= cap, got)
        check(name + ": the plan is no faster than its lower bound",
              got["lower_bound"] > 0 and min(got["gap_to_bound"], got["gap_to_bound_s2"],
                                             got["gap_to_bound_calibrated"]) >= -1e-9, got)
        check(name + ": the bound is at least perfect balance",
              got["lower_bound_over_ideal"] >= 1 - 1e-9, got)


def test_graph_objective_and_its_refusals(checks, source_root):
    check = checks.check
    # The step as it runs: never slower than barrier by barrier, and the graph
    # objective plans for it (the heavy-tailed code-files trace, 32 ranks).
    CODE = source_root / "bench" / "traces" / "trace_code_files.txt"
    runs = {}
    for objective in ("barrier", "graph"):
        runs[objective] = json.loads(plan(checks, "--lengths", str(CODE), "--scheduler", "dynamic_cp",
                                          "--dp", "32", "--max-tokens-per-rank", "8192",
                                          "--global-batch", "512", "--steps", "4",
                                          "--objective", objective, "--json").stdout)
        got = runs[objective]
        check(f"{objective}: graph time at most the barrier one",
              got["graph_step_over_ideal"] <= got["step_over_ideal"] + 1e-9, got)
        check(f"{objective}: the objective is reported", got["objective"] == objective, got)
    check("the graph objective shortens the step as it runs",
          runs["graph"]["graph_step_over_ideal"] < 0.9 * runs["barrier"]["graph_step_over_ideal"],
          (runs["graph"]["graph_step_over_ideal"], runs["barrier"]["graph_step_over_ideal"]))
    bad = plan(checks, "--lengths", str(CODE), "--scheduler", "dynamic_cp", "--dp", "32",
               "--max-tokens-per-rank", "8192", "--global-batch", "512", "--steps", "1",
               "--objective", "fastest", ok=False)
    check("an unknown objective is refused", "unknown objective 'fastest'" in bad.stderr, bad.stderr)
    bad = plan(checks, "--lengths", str(CODE), "--scheduler", "dynamic_cp", "--dp", "6",
               "--max-tokens-per-rank", "65536", "--global-batch", "512", "--steps", "1",
               "--ep", "4", ok=False)
    check("an EP size that does not divide DP·CP is refused",
          "must be >= 1 and divide DP·CP = 6" in bad.stderr, bad.stderr)


def test_megatron_dp_balanced_dump_and_refusals(checks, tmp_path):
    check = checks.check
    lengths = tmp_path / "l.txt"
    lengths.write_text("\n".join(str(n) for n in [5, 11, 300, 7, 64, 9, 3, 12]))
    dump = tmp_path / "plan.json"
    got = json.loads(plan(checks, "--lengths", str(lengths), "--dp", "2", "--cp", "2",
                          "--scheduler", "megatron_dp_balanced",
                          "--max-tokens-per-rank", "200", "--global-batch", "4",
                          "--dump-plan", str(dump), "--json").stdout)
    check("two steps", got["steps"] == 2, got)
    steps = json.loads(dump.read_text())
    seen = sorted((s["step"], q["sample"]) for s in steps for mb in s["microbatches"]
                  for rank in mb for q in rank)
    # Every sample of each step appears on both CP ranks of its DP rank.
    check("dump covers every sample twice (CP 2)",
          seen == sorted([(st, i) for st in range(2) for i in range(4)] * 2), seen)
    check("padding to 2·CP", all(q["padded_length"] % 4 == 0 for s in steps
                                 for mb in s["microbatches"] for r in mb for q in r))
    bad = plan(checks, "--lengths", str(lengths), "--dp", "2", "--max-tokens-per-rank",
               "100", "--scheduler", "greedy", ok=False)
    check("unknown scheduler says so", bad.returncode != 0 and
          "unknown scheduler 'greedy'" in bad.stderr, bad.stderr)
    bad = plan(checks, "--lengths", str(lengths), "--dp", "2", "--max-tokens-per-rank",
               "100", "--global-batch", "64", ok=False)
    check("too few batches", "holds 8 lengths, fewer than one global batch of 64"
          in bad.stderr, bad.stderr)
    oversized_first = tmp_path / "o.txt"
    oversized_first.write_text("300\n5\n5\n5\n")
    bad = plan(checks, "--lengths", str(oversized_first), "--dp", "2",
               "--scheduler", "megatron_dp_balanced",
               "--max-tokens-per-rank", "100", "--global-batch", "4", ok=False)
    check("empty pack refused", "empty pack" in bad.stderr, bad.stderr)
    for scheduler in ("balanced", "dynamic_cp"):
        bad = plan(checks, "--lengths", str(oversized_first), "--dp", "2",
                   "--scheduler", scheduler, "--max-cp", "1",
                   "--max-tokens-per-rank", "100", "--global-batch", "4", ok=False)
        check(f"{scheduler}: oversized sequence named",
              "sample 0 of length 300 does not fit" in bad.stderr, bad.stderr)


def test_dynamic_cp_dump(checks, tmp_path):
    check = checks.check
    # dynamic_cp's dump: every sample once per rank of its group, groups
    # aligned, padding to 2·c for the sequence's own c.
    lengths = tmp_path / "l.txt"
    lengths.write_text("\n".join(str(n) for n in [900, 40, 300, 7, 64, 9, 33, 12]))
    dump = tmp_path / "plan.json"
    got = json.loads(plan(checks, "--lengths", str(lengths), "--dp", "4",
                          "--scheduler", "dynamic_cp", "--max-tokens-per-rank", "256",
                          "--global-batch", "8", "--dump-plan", str(dump), "--json").stdout)
    steps = json.loads(dump.read_text())
    entries = [(r, q) for mb in steps[0]["microbatches"] for r, rank in enumerate(mb)
               for q in rank]
    counts = {}
    for r, q in entries:
        counts[q["sample"]] = counts.get(q["sample"], 0) + 1
        c = q["cp_size"]
        check("aligned group", r // c == q["cp_group"], q)
        check("padded for its own CP", q["padded_length"] % (2 * c if c > 1 else 1) == 0
              and q["padded_length"] >= q["length"], q)
    check("every sample on each rank of its group",
          all(counts[q["sample"]] == q["cp_size"] for _, q in entries), counts)
    check("all eight samples", sorted(counts) == list(range(8)), counts)
    check("the 900-token sample needs CP 4",
          any(q["sample"] == 0 and q["cp_size"] == 4 for _, q in entries), entries)
    check("histogram printed", sum(got["cp_size_histogram"].values()) == 8, got)


def test_plans_of_sampled_batches(checks, tmp_path):
    check = checks.check
    # A real dataset, batches drawn by the sampler: the same seed gives the
    # same plans, another seed others; every sample of the dataset is used.
    prefix = tmp_path / "demo"
    checks.run("make-dataset", "--out", str(prefix), "--count", "512",
               "--dist", "lognormal", "--min", "16", "--max", "2048",
               "--mean", "256", "--sigma", "1.2", "--seed", "3")
    dumps = []
    for seed in ("1", "1", "2"):
        dump = tmp_path / f"plan{len(dumps)}.json"
        got = json.loads(plan(checks, "--dataset", str(prefix), "--seed", seed,
                              "--global-batch", "128", "--dp", "4",
                              "--scheduler", "dynamic_cp",
                              "--max-tokens-per-rank", "1024",
                              "--dump-plan", str(dump), "--json").stdout)
        check("four steps of the dataset", got["steps"] == 4, got)
        dumps.append(json.loads(dump.read_text()))
    check("same seed, same plans", dumps[0] == dumps[1])
    check("another seed, other plans", dumps[0] != dumps[2])
    bad = plan(checks, "--dataset", str(prefix), "--lengths", "x", "--max-tokens-per-rank",
               "8", ok=False)
    check("one source only", "exactly one of --lengths and --dataset" in bad.stderr,
          bad.stderr)


def test_cost_models_and_plot(checks, tmp_path):
    check = checks.check
    # Cost models: the JSON keys, a calibrated planner judged by itself, a
    # custom shape and rates, and the picture.
    lengths = tmp_path / "l.txt"
    lengths.write_text("\n".join(str(n) for n in [900, 40, 300, 7, 64, 9, 33, 12] * 2))
    common = ("--lengths", str(lengths), "--dp", "4", "--scheduler", "dynamic_cp",
              "--max-tokens-per-rank", "256", "--global-batch", "8", "--json")
    s2 = json.loads(plan(checks, *common).stdout)
    for key in ("step_over_ideal", "padding_pct", "schedule_ms_median", "schedule_ms_max",
                "cp_inflation", "microbatches_mean", "microbatches_lower_bound_mean",
                "step_time_over_ideal_calibrated", "cost_model_coefficients"):
        check(f"plan --json has {key}", key in s2, sorted(s2))
    check("s²/c is judged by llama8b too", s2["calibrated_model_coefficients"]["kappa"] > 0
          and s2["cost_model_coefficients"]["kappa"] == 0, s2)
    llama = json.loads(plan(checks, *common, "--cost-model", "llama8b", "--pp", "2").stdout)
    check("a calibrated planner is judged by its own model",
          llama["cost_model_coefficients"] == llama["calibrated_model_coefficients"], llama)
    check("PP 2 has a bubble", llama["cost_model_coefficients"]["bubble"] == 1.0, llama)
    check("calibrated ratio is at least 1", llama["step_time_over_ideal_calibrated"] >= 1, llama)
    shape = "layers: 2 hidden: 8 heads: 2 ffn_hidden: 16 vocab: 10"
    custom = json.loads(plan(checks, *common, "--cost-model", "custom", "--model-shape", shape,
                             "--hardware", "tflops: 1 cp_link_gbps: 1").stdout)
    check("custom shape and rates", abs(custom["cost_model_coefficients"]["alpha"] -
                                        3 * 2 * 8 * 2 / 1e12) < 1e-20, custom)
    for args, message in ((("--cost-model", "custom"), "needs model_shape"),
                          (("--cost-model", "custom", "--model-shape", "layers: x"),
                           "--model-shape 'layers: x' is not valid"),
                          (("--cost-model", "llama8b", "--hardware", "tflops: -1"),
                           "hardware.tflops = -1 must be > 0")):
        bad = plan(checks, *common, *args, ok=False)
        check(f"{args} refused", bad.returncode != 0 and message in bad.stderr, bad.stderr)
    for suffix, magic in ((".png", b"\x89PNG"), (".svg", b"<svg")):
        picture = tmp_path / f"plan{suffix}"
        plan(checks, *common, "--cost-model", "llama8b", "--plot", str(picture), "--plot-step", "1")
        check(f"--plot writes {suffix}", picture.exists() and magic in picture.read_bytes()[:400],
              picture.read_bytes()[:40] if picture.exists() else "missing")
    bad = plan(checks, *common, "--plot", str(tmp_path / "plan.gif"), ok=False)
    check("--plot refuses other formats", ".png or .svg" in bad.stderr, bad.stderr)
    bad = plan(checks, *common, "--plot", str(tmp_path / "p.png"), "--plot-step", "9", ok=False)
    check("--plot-step past the replay", "the replay has 2 steps" in bad.stderr, bad.stderr)
