#!/usr/bin/env python3
"""Would CP groups of any size beat power-of-two groups? Measured, not argued.

  non_power_of_two_cp.py [--instances K] [--models s2,llama8b] [--packfeedctl PATH]

For random small instances of every trace family (as the optimality test
draws them: 8 sequences, 4 ranks of 1 024 tokens), solves the exact optimum
twice with plan_optimum.by_subsets: CP groups restricted to aligned powers
of two (what packfeed plans), and any contiguous group (sizes 1–4, 3
included).
Prints, per family and cost model, how much lower the any-size optimum is.
"""
import argparse
import json
import pathlib
import random
import statistics
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "integration"))
import plan_optimum  # noqa: E402
sys.path.insert(0, str(HERE / "traces"))
import megatron_lognormal  # noqa: E402
CACHE = pathlib.Path.home() / ".cache" / "packfeed"

RANKS, CAP, SEQUENCES = 4, 1024, 8
S2 = {"alpha": 1.0, "beta": 0.0, "kappa": 0.0, "lambda": 0.0, "microbatch": 0.0, "bubble": 0.0}


def calibrated(packfeedctl):
    """The llama8b model's coefficients, as packfeedctl plan reports them."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as lengths:
        lengths.write("1\n" * RANKS)
        lengths.flush()
        out = subprocess.run([packfeedctl, "plan", "--lengths", lengths.name, "--global-batch",
                              str(RANKS), "--dp", str(RANKS), "--max-tokens-per-rank", "1",
                              "--cost-model", "llama8b", "--json"],
                             check=True, capture_output=True, text=True)
    return json.loads(out.stdout)["cost_model_coefficients"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--instances", type=int, default=60)
    parser.add_argument("--models", default="s2,llama8b", help="s2, llama8b or both")
    parser.add_argument("--packfeedctl", default=str(HERE.parent / "build" / "server" /
                                                     "packfeedctl"))
    args = parser.parse_args()
    traces = [HERE / "traces" / f"{n}.txt"
              for n in ("trace_code_files", "trace_chat_longdoc", "trace_doc_paragraphs")]
    lognormal = megatron_lognormal.write_traces(CACHE / "traces")
    traces += [lognormal[n] for n in ("sft_lognormal_1024_8192", "dcp_lognormal_512_49152")]
    print(f"{'family':34} {'model':9} any-size optimum / power-of-two optimum: "
          "median, p5 (the best 5 %), share of instances that gain > 1 %")
    models = {"s2": ("s2/c", S2), "llama8b": ("llama8b", None)}
    for key in args.models.split(","):
        name, model = models[key]
        model = model or calibrated(args.packfeedctl)
        for trace in traces:
            lengths = [int(x) for x in trace.read_text().split()]
            rng = random.Random(trace.name)
            ratios = []
            for _ in range(args.instances):
                batch = rng.sample(lengths, SEQUENCES)
                scale = CAP / max(-(-max(batch) // (RANKS - 0.25)), sum(batch) / (2 * RANKS), 1)
                batch = [max(1, int(s * scale)) for s in batch]
                aligned = plan_optimum.by_subsets(batch, RANKS, CAP, model)
                free = plan_optimum.by_subsets(batch, RANKS, CAP, model, any_size=True)
                ratios.append(free[0] / aligned[0])
            ratios.sort()
            gain = sum(r < 0.99 for r in ratios) / len(ratios)
            print(f"{trace.stem:34} {name:9} median {statistics.median(ratios):.4f}, "
                  f"p5 {ratios[len(ratios) // 20]:.4f}, {100 * gain:.0f} % gain > 1 %", flush=True)


if __name__ == "__main__":
    main()
