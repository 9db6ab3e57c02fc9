"""Python-side next() against the C++ client's Next(), in the same run: one
packfeedd on a generated dataset serves one rank; rounds alternate between
a C++ process timing Next() (bench/next_latency.cc) and packfeed.Client
timing Python's next(iterator) (which also builds the torch tensors of
Megatron's dict), each attaching at the step the last one stopped at.
Before each microbatch the rank pauses, so the daemon is ahead and what is
timed is the client's own cost. Freeing what next() returned (which gives
the slot back) is timed apart on both sides: a trainer frees a batch after
its step's work, not inside next().

usage: python_next_bench.py BIN_DIR BENCH_DIR [--rounds 6] [--steps 10] [--json]
(PYTHONPATH: the built packfeed package and tests/integration)"""
import argparse
import json
import pathlib
import statistics
import subprocess
import tempfile
import time

import packfeed
from daemon_harness import Daemon

PAUSE_US = 300


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def time_python(client, steps):
    """next() and, apart, freeing the batch it returned (which gives the
    slot back), as next_latency times Next() and the Microbatch's end."""
    latencies, releases = [], []
    for _ in range(steps):
        iterator = client.next_step()[0]
        for _ in range(len(iterator)):
            time.sleep(PAUSE_US / 1e6)
            start = time.perf_counter_ns()
            batch = next(iterator)
            taken = time.perf_counter_ns()
            del batch
            latencies.append(taken - start)
            releases.append(time.perf_counter_ns() - taken)
    return latencies, releases


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("bin_dir")
    parser.add_argument("bench_dir")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="pf-python-bench-"))
    subprocess.run([f"{args.bin_dir}/packfeedctl", "make-dataset", "--out", str(workdir / "data"),
                    "--count", "4000", "--min", "64", "--max", "4096", "--mean", "1024"],
                   check=True, capture_output=True)
    config = f"""
jobs {{
  name: "bench"
  datasets {{ prefix: "{workdir / 'data'}" }}
  topology {{ tp: 1 pp: 1 cp: 1 dp: 1 }}
  global_batch: 16
  seq_length: 4096
  eod_id: 32000
  append_eod: true
  scheduler {{ kind: "balanced" max_tokens_per_rank: 8192 }}
}}
"""
    python_ns, python_release_ns, cpp_ns, cpp_release_ns = [], [], [], []
    with Daemon(args.bin_dir, config, name="bench", workdir=workdir) as daemon:
        step = 0

        def python_round(steps):
            nonlocal step
            with packfeed.Client("bench", rank=0, socket_path=daemon.socket,
                                 start_step=step) as client:
                timings = time_python(client, steps)
            step += steps
            return timings

        python_round(1)  # warm-up
        for _ in range(args.rounds):
            out = subprocess.run(
                [f"{args.bench_dir}/next_latency", "--socket", daemon.socket, "--job", "bench",
                 "--start-step", str(step), "--steps", str(args.steps),
                 "--pause-us", str(PAUSE_US)], check=True, capture_output=True, text=True)
            cpp = json.loads(out.stdout)
            cpp_ns += cpp["next_ns"]
            cpp_release_ns += cpp["release_ns"]
            step += args.steps
            latencies, releases = python_round(args.steps)
            python_ns += latencies
            python_release_ns += releases
    figures = {
        "microbatches_each": len(python_ns),
        "cpp_p50_us": percentile(cpp_ns, 0.5) / 1e3, "cpp_p99_us": percentile(cpp_ns, 0.99) / 1e3,
        "python_p50_us": percentile(python_ns, 0.5) / 1e3,
        "python_p99_us": percentile(python_ns, 0.99) / 1e3,
        "python_overhead_p50_us": (statistics.median(python_ns) - statistics.median(cpp_ns)) / 1e3,
        "cpp_release_p50_us": percentile(cpp_release_ns, 0.5) / 1e3,
        "python_release_p50_us": percentile(python_release_ns, 0.5) / 1e3,
    }
    if args.json:
        print(json.dumps(figures))
    else:
        print(f"{figures['microbatches_each']} microbatches each, interleaved rounds")
        print(f"  C++    Next():  p50 {figures['cpp_p50_us']:8.1f} µs   p99 {figures['cpp_p99_us']:8.1f} µs")
        print(f"  Python next():  p50 {figures['python_p50_us']:8.1f} µs   p99 {figures['python_p99_us']:8.1f} µs")
        print(f"  Python overhead at p50: {figures['python_overhead_p50_us']:.1f} µs")
        print(f"  giving the slot back (freeing the Microbatch / the dict), p50: "
              f"C++ {figures['cpp_release_p50_us']:.1f} µs, "
              f"Python {figures['python_release_p50_us']:.1f} µs")

if __name__ == "__main__":
    main()
