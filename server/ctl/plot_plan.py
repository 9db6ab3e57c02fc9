#!/usr/bin/env python3
"""Draws one planned step as a heatmap: microbatches down, dp-cp ranks across,
each cell the rank's modelled work in that microbatch; CP groups outlined and
labelled with their size. packfeedctl plan --plot runs it.

  plot_plan.py PLAN_JSON OUTPUT.{png,svg}

PLAN_JSON: {"title": str, "unit": str, "cost_model": {alpha, beta, kappa,
lambda}, "microbatches": [[[{"padded_length", "cp_size", "cp_group"}, ...]
per rank] per microbatch]} as packfeedctl writes it.
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402


def cost(model, s, c):
    value = (model["alpha"] * s * s + model["beta"] * s) / c
    if c > 1:
        value += model["kappa"] * s * (c - 1) / c + model["lambda"] * (c - 1)
    return value


def main():
    if len(sys.argv) != 3 or not sys.argv[2].endswith((".png", ".svg")):
        sys.exit("usage: plot_plan.py PLAN_JSON OUTPUT.png|OUTPUT.svg")
    with open(sys.argv[1]) as f:
        plan = json.load(f)
    model = plan["cost_model"]
    microbatches = plan["microbatches"]
    ranks = len(microbatches[0])
    work = [[sum(cost(model, q["padded_length"], q["cp_size"]) for q in sequences)
             for sequences in row] for row in microbatches]
    width = min(24, 3 + 0.25 * ranks)
    height = min(24, 2 + 0.35 * len(microbatches))
    figure, axes = plt.subplots(figsize=(width, height))
    image = axes.imshow(work, aspect="auto", cmap="viridis", interpolation="nearest")
    figure.colorbar(image, ax=axes, label=f"per-rank work ({plan['unit']})")
    for m, row in enumerate(microbatches):
        seen = set()
        for r, sequences in enumerate(row):
            if not sequences:
                continue
            size, group = sequences[0]["cp_size"], sequences[0]["cp_group"]
            if (size, group) in seen:
                continue
            seen.add((size, group))
            axes.add_patch(Rectangle((group * size - 0.5, m - 0.5), size, 1, fill=False,
                                     edgecolor="white", linewidth=1.2))
            if size > 1 and size * 0.25 * width / max(ranks, 1) > 0.05:
                axes.text(group * size + (size - 1) / 2, m, f"c{size}", ha="center",
                          va="center", color="white", fontsize=7)
    step_max = sum(max(row) for row in work)
    ideal = sum(map(sum, work)) / ranks
    axes.set_title(f"{plan['title']}: Σ max {step_max:.4g} over ideal {ideal:.4g} "
                   f"= {step_max / ideal:.3f}")
    axes.set_xlabel("dp-cp rank")
    axes.set_ylabel("microbatch")
    figure.tight_layout()
    figure.savefig(sys.argv[2])


if __name__ == "__main__":
    main()
