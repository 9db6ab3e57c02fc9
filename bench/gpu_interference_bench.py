"""A trainer's matrix products beside packfeed's copies into GPU memory, in
one run: rounds alternate between timing a loop of bf16 matrix products
alone and timing the same loop while a rank (a second process, as a
daemon-fed trainer's data iterator) takes microbatches into device memory
as fast as the daemon serves them. The slowdown is the median round beside
the copies over the median round alone, minus one (target: <= 1 %).

The rank's ring is --ring: `staged` (a page-locked host ring the client
copies to the device on arrival) or `daemon` (device memory the daemon
copies into itself). Each busy round's rank attaches at the step the last
one stopped at and reports the bytes it took and how fast.

--device cpu rehearses the whole harness without a GPU (float32 products on
the CPU, host rings); its figures mean nothing. Without a CUDA device and
without --device cpu it exits 77 (skipped).

usage: gpu_interference_bench.py BIN_DIR [--ring staged] [--rounds 6]
       [--products 200] [--size 8192] [--device cuda|cpu] [--json]
(PYTHONPATH: the built packfeed package and tests/integration)"""
import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import torch

from daemon_harness import Daemon, make_dataset


def consume(socket_path, start_step, ring, device):
    """The busy rank (run as this script with --consume): takes microbatches
    until its stdin closes, printing `ready` after the first, then one JSON
    line with what it took."""
    import packfeed
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    on_device = device != "cpu"
    client = packfeed.Client("bench", rank=0, socket_path=socket_path, start_step=start_step,
                             device=device if on_device else None,
                             device_ring=ring if on_device else "staged")
    steps = microbatches = taken_bytes = 0
    started = None
    while not stop.is_set():
        iterator = client.next_step()[0]
        for batch in iterator:
            taken_bytes += sum(t.numel() * t.element_size() for t in batch.values()
                               if isinstance(t, torch.Tensor))
            microbatches += 1
            del batch
            if started is None:
                if on_device:
                    torch.cuda.synchronize()
                started = time.perf_counter()
                taken_bytes = microbatches = 0
                print("ready", flush=True)
        steps += 1
    if on_device:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    client.close()
    print(json.dumps({"steps": steps, "microbatches": microbatches, "bytes": taken_bytes,
                      "seconds": seconds}), flush=True)


def products_seconds(a, b, count):
    """Seconds `count` products a @ b take on a's device (CUDA events there)."""
    if a.device.type == "cuda":
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(count):
            torch.mm(a, b)
        end.record()
        end.synchronize()
        return begin.elapsed_time(end) / 1e3
    start = time.perf_counter()
    for _ in range(count):
        torch.mm(a, b)
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("bin_dir")
    parser.add_argument("--ring", choices=("staged", "daemon"), default="staged")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--products", type=int, default=200)
    parser.add_argument("--size", type=int, default=8192)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--consume", nargs=2, metavar=("SOCKET", "START_STEP"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.consume:
        consume(args.consume[0], int(args.consume[1]), args.ring, args.device)
        return
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: skipped (--device cpu rehearses the harness)")
        sys.exit(77)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    a = torch.randn(args.size, args.size, device=args.device, dtype=dtype)
    b = torch.randn(args.size, args.size, device=args.device, dtype=dtype)
    products_seconds(a, b, 3)  # warm-up

    workdir = pathlib.Path(tempfile.mkdtemp(prefix="pf-interference-"))
    make_dataset(args.bin_dir, workdir / "data", "--count", "20000", "--min", "256",
                 "--max", "8192", "--mean", "2048")
    config = f"""
jobs {{
  name: "bench"
  datasets {{ prefix: "{workdir / 'data'}" }}
  topology {{ tp: 1 pp: 1 cp: 1 dp: 1 }}
  global_batch: 64
  seq_length: 8192
  eod_id: 32000
  append_eod: true
  scheduler {{ kind: "balanced" max_tokens_per_rank: 65536 }}
}}
"""
    alone, beside, rates = [], [], []
    with Daemon(args.bin_dir, config, name="bench", workdir=workdir) as daemon:
        step = 0
        for _ in range(args.rounds):
            alone.append(products_seconds(a, b, args.products))
            rank = subprocess.Popen(
                [sys.executable, __file__, args.bin_dir, "--ring", args.ring, "--device",
                 args.device, "--consume", daemon.socket, str(step)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            if rank.stdout.readline().strip() != "ready":
                rank.kill()
                sys.exit("the busy rank took no microbatch")
            beside.append(products_seconds(a, b, args.products))
            rank.stdin.close()
            report = json.loads(rank.stdout.readline())
            if rank.wait(timeout=60) != 0:
                sys.exit("the busy rank failed")
            step += report["steps"]
            rates.append(report["bytes"] / report["seconds"] / 2**30)
    figures = {
        "ring": args.ring, "device": args.device, "rounds": args.rounds,
        "products_per_round": args.products, "size": args.size,
        "alone_ms_p50": statistics.median(alone) * 1e3,
        "beside_ms_p50": statistics.median(beside) * 1e3,
        "slowdown": statistics.median(beside) / statistics.median(alone) - 1,
        "copies_gib_per_s_p50": statistics.median(rates),
        "tflops_alone": 2 * args.size**3 * args.products / statistics.median(alone) / 1e12,
    }
    if args.json:
        print(json.dumps(figures))
    else:
        print(f"{args.rounds} rounds of {args.products} {args.size}^2 products, {args.ring} ring, "
              f"{args.device}")
        print(f"  alone:  p50 {figures['alone_ms_p50']:9.2f} ms "
              f"({figures['tflops_alone']:.0f} TFLOP/s)")
        print(f"  beside: p50 {figures['beside_ms_p50']:9.2f} ms   slowdown "
              f"{figures['slowdown'] * 100:+.2f} %")
        print(f"  the rank took {figures['copies_gib_per_s_p50']:.2f} GiB/s at p50 while beside")


if __name__ == "__main__":
    main()
