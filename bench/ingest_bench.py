"""Online ingest (docs/INGEST.md), the three figures issue 19 names, in one
run against a real packfeedd:

- put throughput from one producer process (packfeed.Producer.put of a
  step's samples, a few at a time as a driver puts finished rollouts), beside a
  NumPy copy of the same arrays made just before each put, in the same
  process: bytes over seconds summed over the steps whose puts wrote only
  staging-arena memory written before (Producer.arena_bytes_written did not
  grow), and apart over the steps that wrote fresh pages;
- seal-to-first-microbatch latency: from Producer.seal(step) to each of 8
  consumer ranks (DP 8, threads of this process) returning from
  next_step() with its first microbatch, p50 and p99 over steps × ranks;
- the stream's peak bytes held (the daemon's own accounting) and the
  daemon's peak RSS, against the stream's memory budget.

Each sample carries int64 tokens, float32 log-probs and int16 routed
experts [T, 16, 4] (142 bytes per token).

With --peer, two daemons on this machine, each hosting half of the ranks:
the driver puts into the first (the origin), whose seal forwards each step
to the second (docs/INGEST.md, Several nodes). The latency is then given per
node, and the seal call's own duration (the peer's fetch) beside it.

With --trainers-apart the ranks are threads of a second process, as an RL
driver's trainers are; otherwise of this one, where they share the
interpreter lock with the driver's puts.

usage: ingest_bench.py BIN_DIR [--samples 1024] [--steps 16] [--ranks 8] [--peer]
                       [--trainers-apart] [--json]
(PYTHONPATH: the built packfeed package and tests/integration)"""
import argparse
import contextlib
import json
import pathlib
import socket
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

import packfeed
from daemon_harness import Daemon

LAYERS, TOP_K = 16, 4


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def make_step(rng, step, samples, group_size=8):
    out = []
    for i in range(samples):
        t = int(rng.integers(64, 2048))
        out.append({"group": step * samples + i // group_size, "tag": step,
                    "tokens": rng.integers(0, 50000, t, dtype=np.int64),
                    "logprobs": rng.random(t, dtype=np.float32),
                    "experts": rng.integers(0, 64, (t, LAYERS, TOP_K), dtype=np.int16)})
    return out


def step_bytes(samples):
    return sum(a.nbytes for s in samples for k, a in s.items() if k not in ("group", "tag"))


def copy_seconds(samples, buffer, offset=0):
    """One NumPy copy of every array of `samples` into `buffer`, from
    `offset` on; returns the seconds and the offset after the last."""
    start = time.perf_counter()
    for sample in samples:
        for key in ("tokens", "logprobs", "experts"):
            flat = sample[key].reshape(-1).view(np.uint8)
            buffer[offset:offset + flat.size] = flat
            offset += flat.size
    return time.perf_counter() - start, offset


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config(ranks, samples, budget, local_ranks=None, address=None, peer=None):
    nodes = "" if peer is None else (
        f'admin_tcp_address: "{address}"\nadmin_tcp_token: "bench"\npeers: "{peer}"\n')
    hosted = "" if local_ranks is None else f"  local_ranks: [{', '.join(map(str, local_ranks))}]"
    return nodes + f"""
ingest_streams {{
  name: "rollouts"
  fields {{ name: "logprobs" dtype: "float32" }}
  fields {{ name: "experts" dtype: "int16" inner_shape: [{LAYERS}, {TOP_K}] }}
  memory_budget_bytes: {budget}
}}
jobs {{
  name: "actor"
  ingest_stream: "rollouts"
  topology {{ dp: {ranks} }}
{hosted}
  global_batch: {samples}
  seq_length: 2048
  side_fields {{ name: "logprobs" dtype: "float32" align: ALIGN_LABELS }}
  side_fields {{ name: "experts" dtype: "int16" inner_shape: [{LAYERS}, {TOP_K}] pad_value: -1 }}
  scheduler {{ kind: "balanced" max_tokens_per_rank: 8192 }}
}}
"""


def consume(client, steps, first_arrivals, errors):
    try:
        for step in range(steps):
            microbatches = client.next_step()[0]
            first_arrivals[step] = time.perf_counter()
            for _ in microbatches:
                pass
    except Exception as error:  # reported by the main thread
        errors.append(error)


def consume_in_this_process(sockets, steps):
    """The ranks (rank r on sockets[r]) as threads of this process: attaches
    them, prints "ready", consumes `steps` steps, prints each rank's arrival
    times (time.perf_counter, the same clock in every process)."""
    clients = [packfeed.Client("actor", rank=r, socket_path=path)
               for r, path in enumerate(sockets)]
    arrivals = [[0.0] * steps for _ in clients]
    errors = []
    threads = [threading.Thread(target=consume, args=(c, steps, arrivals[r], errors))
               for r, c in enumerate(clients)]
    print("ready", flush=True)
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    for client in clients:
        client.close()
    if errors:
        raise errors[0]
    print(json.dumps(arrivals), flush=True)


def wait_healthy(daemon):
    deadline = time.time() + 60
    while daemon.ctl_run("health").returncode != 0:
        if daemon.process.poll() is not None or time.time() > deadline:
            raise RuntimeError(f"packfeedd did not start: {daemon.log.read_text()}")
        time.sleep(0.1)


def peak_rss_mib(pid):
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("bin_dir")
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--chunk", type=int, default=128, help="samples per put")
    parser.add_argument("--peer", action="store_true", help="two daemons, half the ranks each")
    parser.add_argument("--trainers-apart", action="store_true",
                        help="the ranks in a process of their own, as a driver's trainers are")
    parser.add_argument("--consume", help=argparse.SUPPRESS)  # that process: its sockets
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.consume:
        consume_in_this_process(json.loads(args.consume), args.steps)
        return
    rng = np.random.default_rng(7)
    steps = [make_step(rng, s, args.samples) for s in range(args.steps)]
    largest = max(step_bytes(s) for s in steps)
    budget = int(2.5 * largest)  # two steps in flight: docs/INGEST.md's advice
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="pf-ingest-bench-"))
    buffer = np.empty(largest, dtype=np.uint8)
    buffer[:] = 0  # touched, as the daemon's memory is

    step_sizes, put_seconds, copy_seconds_of_step, seal_calls = [], [], [], []
    fresh_steps = []  # whether a step's puts wrote arena pages for the first time
    if args.peer:
        half = args.ranks // 2
        ports = [free_port(), free_port()]
        daemons = [Daemon(args.bin_dir, config(args.ranks, args.samples, budget, ranks,
                                               f"127.0.0.1:{ports[i]}",
                                               f"127.0.0.1:{ports[1 - i]}"),
                          name=name, workdir=workdir)
                   for i, (name, ranks) in enumerate((("origin", range(half)),
                                                      ("peer", range(half, args.ranks))))]
        node_of = [0] * half + [1] * (args.ranks - half)
    else:
        daemons = [Daemon(args.bin_dir, config(args.ranks, args.samples, budget), name="ingest",
                          workdir=workdir)]
        node_of = [0] * args.ranks
    with contextlib.ExitStack() as stack:
        for daemon in daemons:
            daemon.start(wait=False)
            stack.callback(daemon.stop)
        for daemon in daemons:
            wait_healthy(daemon)
        daemon = daemons[0]
        producer = packfeed.Producer("rollouts", socket_path=daemon.socket)
        sockets = [daemons[node_of[r]].socket for r in range(args.ranks)]
        trainers = None
        if args.trainers_apart:
            trainers = subprocess.Popen(
                [sys.executable, __file__, args.bin_dir, "--consume", json.dumps(sockets),
                 "--steps", str(args.steps)], stdout=subprocess.PIPE, text=True)
            stack.callback(trainers.kill)
            if trainers.stdout.readline().strip() != "ready":
                raise RuntimeError("the trainers' process did not attach its ranks")
        else:
            clients = [packfeed.Client("actor", rank=r, socket_path=path)
                       for r, path in enumerate(sockets)]
            arrivals = [[0.0] * args.steps for _ in clients]
            errors = []
            threads = [threading.Thread(target=consume, args=(c, args.steps, arrivals[r], errors))
                       for r, c in enumerate(clients)]
            for thread in threads:
                thread.start()
        seals = []
        for s, samples in enumerate(steps):
            size = step_bytes(samples)
            # Each put beside a copy of the same arrays just before it: both
            # meet the same load (the consumers of the step before).
            copying = putting = 0.0
            offset = 0  # the copies fill the buffer as the puts fill the stream
            written = producer.arena_bytes_written
            for first in range(0, len(samples), args.chunk):
                chunk = samples[first:first + args.chunk]
                seconds, offset = copy_seconds(chunk, buffer, offset)
                copying += seconds
                start = time.perf_counter()
                producer.put(s, chunk, wait=120.0)
                putting += time.perf_counter() - start
            step_sizes.append(size)
            copy_seconds_of_step.append(copying)
            put_seconds.append(putting)
            fresh_steps.append(producer.arena_bytes_written > written)
            seals.append(time.perf_counter())
            producer.seal(s)
            seal_calls.append((time.perf_counter() - seals[-1]) * 1e3)
        if trainers is not None:
            out, _ = trainers.communicate(timeout=600)
            if trainers.returncode != 0:
                raise RuntimeError(f"the trainers' process failed ({trainers.returncode})")
            arrivals = json.loads(out.strip().splitlines()[-1])
        else:
            for thread in threads:
                thread.join(timeout=600)
            if errors:
                raise errors[0]
        status = producer.status()
        rss = peak_rss_mib(daemon.process.pid)
        peer_bytes = (next(s for s in daemons[1].ctl_json("stats")["ingest_streams"])["bytes_put"]
                      if args.peer else 0)
        if trainers is None:
            for client in clients:
                client.close()
    # A put writes the producer's staging arena, which takes memory only
    # once written: until the arena's written part stops growing, some puts
    # write fresh pages, which the kernel zeroes first (on this VM that made
    # the copy 3-4 times slower). The steps after that are what a long run
    # sees; both are printed, and a figure without a step of its kind is None.
    def rates(fresh):  # GB/s of the puts and of the copies over those steps
        steps = [s for s in range(args.steps) if fresh_steps[s] == fresh]
        if not steps:
            return None, None, None
        size = sum(step_sizes[s] for s in steps) / 1e9
        put = size / sum(put_seconds[s] for s in steps)
        copy = size / sum(copy_seconds_of_step[s] for s in steps)
        return round(put, 2), round(copy, 2), round(put / copy, 2)

    put_rate, copy_rate, put_over_copy = rates(False)
    warm = sum(fresh_steps)
    warm_ratio = rates(True)[2]
    latencies = [[], []]  # per node
    for rank, rank_arrivals in enumerate(arrivals):
        latencies[node_of[rank]] += [(arrival - seal) * 1e3
                                     for arrival, seal in zip(rank_arrivals, seals)]
    figures = {
        "samples_per_step": args.samples, "ranks": args.ranks, "steps": args.steps,
        "trainers_apart": args.trainers_apart,
        "step_mb": round(largest / 1e6, 1),
        "put_gb_per_s": put_rate,
        "memcpy_gb_per_s": copy_rate,
        "put_over_memcpy": put_over_copy,
        "fresh_arena_steps": warm,
        "fresh_arena_put_over_memcpy": warm_ratio,
        "seal_to_first_p50_ms": round(percentile(latencies[0], 0.5), 2),
        "seal_to_first_p99_ms": round(percentile(latencies[0], 0.99), 2),
        "seal_call_p50_ms": round(percentile(seal_calls, 0.5), 2),
        "budget_mb": round(budget / 1e6, 1),
        "peak_held_mb": round(status["peak_bytes_held"] / 1e6, 1),
        "daemon_peak_rss_mib": round(rss, 1),
        "puts_waited": status["puts_waited"],
        "puts_in_one_call": status["puts_in_one_call"],
    }
    if args.peer:
        figures.update({
            "peer_seal_to_first_p50_ms": round(percentile(latencies[1], 0.5), 2),
            "peer_seal_to_first_p99_ms": round(percentile(latencies[1], 0.99), 2),
            "peer_fetched_over_put": round(int(peer_bytes) / int(status["bytes_put"]), 2)})
    if args.json:
        print(json.dumps(figures))
        return
    print(f"ingest_bench: {args.samples} samples/step ({figures['step_mb']} MB), "
          f"{args.steps} steps, {args.ranks} ranks (DP), puts of {args.chunk} samples")
    print(f"  put {figures['put_gb_per_s']} GB/s vs NumPy copy {figures['memcpy_gb_per_s']} GB/s "
          f"in this process (ratio {figures['put_over_memcpy']}) over the {args.steps - warm} steps "
          f"that wrote arena memory written before; the {warm} that wrote fresh pages: ratio "
          f"{figures['fresh_arena_put_over_memcpy']}")
    print(f"  seal -> first microbatch: p50 {figures['seal_to_first_p50_ms']} ms, "
          f"p99 {figures['seal_to_first_p99_ms']} ms ({len(latencies[0])} rank-steps"
          f"{' on the origin' if args.peer else ''}); the seal call itself "
          f"{figures['seal_call_p50_ms']} ms (p50)")
    if args.peer:
        print(f"  on the peer: p50 {figures['peer_seal_to_first_p50_ms']} ms, "
              f"p99 {figures['peer_seal_to_first_p99_ms']} ms ({len(latencies[1])} rank-steps); "
              f"it fetched {figures['peer_fetched_over_put']} of the bytes put")
    print(f"  memory: budget {figures['budget_mb']} MB, peak held {figures['peak_held_mb']} MB, "
          f"daemon peak RSS {figures['daemon_peak_rss_mib']} MiB; "
          f"{figures['puts_waited']} puts waited for consumers; "
          f"{figures['puts_in_one_call']} of {args.steps * -(-args.samples // args.chunk)} puts "
          f"took one call")


if __name__ == "__main__":
    main()
