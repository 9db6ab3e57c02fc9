#!/usr/bin/env python3
"""Writes the three lognormal length traces, exactly as Megatron-LM's mock-SFT
length generator draws them (MockSFTLowLevelDataset, "distribution" mode):
numpy's legacy global stream seeded with 0, one million lognormal draws with
mu = ln(mean) - sigma^2 / 2, floored and clipped to [min, max]; each trace is
a prefix of that output. Deterministic: the same files on every machine.

  megatron_lognormal.py OUT_DIR      writes trace_<name>.txt, one length a line

Other programs import TRACES and write_traces(out_dir).
"""
import math
import pathlib
import sys

# name -> (min, max, mean, sigma, count)
TRACES = {
    "sft_lognormal_1024_8192": (1024, 8192, 4096, 1.1, 16384),
    "dcp_lognormal_512_49152": (512, 49152, 6000, 1.2, 16384),
    "dcpex_lognormal_128_8192": (128, 8192, 1024, 1.5, 8192),
}
GENERATOR_SIZE = 1_000_000  # Megatron draws the whole dataset at once


def lengths(name):
    import numpy as np  # only for the draw: the stream is numpy's own
    low, high, mean, sigma, count = TRACES[name]
    np.random.seed(0)
    draws = np.random.lognormal(math.log(mean) - sigma**2 / 2, sigma, GENERATOR_SIZE)
    return np.clip(np.floor(draws), low, high).astype(int)[:count].tolist()


def write_traces(out_dir):
    """Writes every trace under out_dir (made if missing); returns their paths."""
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name in TRACES:
        path = out / f"trace_{name}.txt"
        if not path.exists():
            tmp = path.with_suffix(".tmp")
            tmp.write_text("".join(f"{n}\n" for n in lengths(name)))
            tmp.rename(path)
        paths[name] = path
    return paths


if __name__ == "__main__":
    for path in write_traces(sys.argv[1]).values():
        print(path)
