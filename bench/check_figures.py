"""Runs a benchmark with --json and checks that the figures it printed are
sane, so that a smoke test fails on a broken figure and not only on a crash:
every number finite; rates, sizes, latencies and ratios positive; each p50 at
most its p99; I/O amplification at least 1 where every byte is read by
someone (the replicated readers), and packfeed's no more than theirs; a
stated ratio equal to the figures it divides; a peak held within its budget.
Speed itself is not judged: these machines are too noisy for that.

usage: check_figures.py -- COMMAND [ARGS...]   (the bench's exit status is
kept when it fails; 1 when a figure is not sane)"""
import json
import math
import re
import subprocess
import sys

POSITIVE = re.compile(r"(per_s|_p50|_p99|p50_|p99_|rss|bytes_read|bytes$|_mb$|^docs$|^steps$|"
                      r"ratio|_over_|amplification|microbatches|samples|ranks)")
# Differences of two figures, which noise may make negative.
SIGNED = re.compile(r"overhead|slowdown")


def figures(stdout):
    """Every JSON object the bench printed, one per line."""
    out = []
    for line in stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


def problems_of(record):
    found = []
    numbers = {k: v for k, v in record.items() if isinstance(v, (int, float))
               and not isinstance(v, bool)}
    for key, value in numbers.items():
        if not math.isfinite(value):
            found.append(f"{key} = {value} is not finite")
        elif SIGNED.search(key):
            continue
        elif value < 0:
            found.append(f"{key} = {value} is negative")
        elif POSITIVE.search(key) and value == 0:
            found.append(f"{key} = 0")
    for key, value in numbers.items():
        for p50 in ("_p50", "p50_"):
            if p50 in key:
                p99 = key.replace(p50, p50.replace("50", "99"))
                if p99 in numbers and value > numbers[p99] * 1.0001:
                    found.append(f"{key} = {value} exceeds {p99} = {numbers[p99]}")
    if "replicated_io_amplification" in numbers:
        if numbers["replicated_io_amplification"] < 1:
            found.append("replicated readers read less than the distinct bytes")
        if numbers.get("packfeed_io_amplification", 0) > numbers["replicated_io_amplification"]:
            found.append("packfeed read more than the replicated readers")
    for rate, base in (("gib_per_s", "memcpy_gib_per_s"), ("put_gb_per_s", "memcpy_gb_per_s")):
        ratio = "ratio" if rate == "gib_per_s" else "put_over_memcpy"
        if all(k in numbers for k in (rate, base, ratio)) and numbers[base] > 0:
            if abs(numbers[rate] / numbers[base] - numbers[ratio]) > 0.02 + 0.02 * numbers[ratio]:
                found.append(f"{ratio} = {numbers[ratio]} but {rate}/{base} = "
                             f"{numbers[rate] / numbers[base]:.3f}")
    if "peak_held_mb" in numbers and "budget_mb" in numbers:
        if numbers["peak_held_mb"] > numbers["budget_mb"] * 1.001:
            found.append(f"peak held {numbers['peak_held_mb']} MB over the budget "
                         f"{numbers['budget_mb']} MB")
    return found


def main():
    if "--" not in sys.argv:
        sys.exit(__doc__)
    command = sys.argv[sys.argv.index("--") + 1:]
    if command and command[0].endswith(".py"):
        command = [sys.executable, *command]
    result = subprocess.run(command, capture_output=True, text=True)
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    if result.returncode != 0:
        sys.exit(result.returncode)
    records = figures(result.stdout)
    problems = [f"record {i}: {p}" for i, r in enumerate(records) for p in problems_of(r)]
    if not records:
        problems.append("the bench printed no JSON figures")
    for problem in problems:
        print(f"FAILED figure: {problem}")
    print(f"check_figures: {len(records)} record(s), "
          f"{sum(len(r) for r in records)} figures, {len(problems)} problem(s)")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
