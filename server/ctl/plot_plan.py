#!/usr/bin/env python3
"""Draws one planned step as a heatmap: microbatches down, dp-cp ranks across,
each cell the rank's modelled work in that microbatch; CP groups outlined and
labelled with their size. packfeedctl plan --plot runs it.

  plot_plan.py PLAN_JSON OUTPUT.{png,svg}

PLAN_JSON, as packfeedctl writes it: {"title": str, "unit": str, "work":
[[per-rank work] per microbatch], "groups": [[[first rank, size], ...] per
microbatch]}.
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402


def main():
    if len(sys.argv) != 3 or not sys.argv[2].endswith((".png", ".svg")):
        sys.exit("usage: plot_plan.py PLAN_JSON OUTPUT.png|OUTPUT.svg")
    with open(sys.argv[1]) as f:
        plan = json.load(f)
    work = plan["work"]
    ranks = len(work[0])
    width = min(24, 3 + 0.25 * ranks)
    height = min(24, 2 + 0.35 * len(work))
    figure, axes = plt.subplots(figsize=(width, height))
    image = axes.imshow(work, aspect="auto", cmap="viridis", interpolation="nearest")
    figure.colorbar(image, ax=axes, label=f"per-rank work ({plan['unit']})")
    for m, blocks in enumerate(plan["groups"]):
        for first, size in blocks:
            axes.add_patch(Rectangle((first - 0.5, m - 0.5), size, 1, fill=False,
                                     edgecolor="white", linewidth=1.2))
            if size > 1:
                axes.text(first + (size - 1) / 2, m, f"c{size}", ha="center", va="center",
                          color="white", fontsize=7)
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
