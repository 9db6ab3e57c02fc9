"""The trainer simulator of the learned cost model (docs/SCHEDULER.md, "One
learned model on every node"): does a job that starts from the default
model (s²/c, CP budget 0.05) learn to plan as well as if the cluster's true
costs were known?

- N packfeedd (4 by default), each in a network namespace of its own on one
  bridge (with --no-netns, on this host's loopback), each hosting R ranks
  of one dynamic-CP job with scheduler.learn_cost_model, peers of each
  other.
- The ranks are threads of one process per daemon (in its namespace), each
  a real packfeed.Client. Each microbatch costs what a hidden "true" model
  says its CP group's work costs (a sleep: no GPU), times noise (uniform
  ±--noise) and, with --straggler, one rank always 25 % slower and 1 % of
  microbatches 3× slower. CP communication (κ, λ) is cheap or expensive
  (--cp).
- Every step's plan is read from every daemon (plan-step); they must be
  the same. Each step's plan is then costed under the true model (the sum
  over microbatches of the slowest group, plus μ: the barrier objective)
  beside two plans of the same step made by daemons without ranks: one
  given the true rates (cost_model "rates"), one with today's default.

Prints, per step, the version the nodes planned by and the modelled step
time of the learned and default plans over the true-model plan's; with
--png, the same as a curve (matplotlib).

usage: cost_model_simulator.py BIN_DIR [--daemons 4] [--ranks-per-daemon 2]
           [--steps 60] [--trace heavy_tail|chat_longdoc] [--cp cheap|expensive]
           [--noise 0.1] [--straggler] [--no-netns] [--json] [--png PATH]
(PYTHONPATH: the built packfeed package and tests/integration)"""
import argparse
import contextlib
import json
import os
import pathlib
import random
import subprocess
import sys
import tempfile
import threading
import time

TRACES = pathlib.Path(__file__).resolve().parent / "traces"
# Seconds per s², per token, per token of K/V over (c-1)/c, per extra CP
# peer, per microbatch, for one rank: a step sleeps a few tenths of a
# second, so that the clients' once-a-second reports reach the daemons
# every few steps, as they do in training.
TRUE_RATES = {
    "cheap": {"alpha": 2e-10, "beta": 1.5e-6, "kappa": 2e-7, "lambda": 1e-3, "mu": 1.5e-2},
    "expensive": {"alpha": 2e-10, "beta": 1.5e-6, "kappa": 4e-6, "lambda": 3e-2, "mu": 1.5e-2},
}
SEQ_LENGTH = 16384
MAX_TOKENS_PER_RANK = 4096
GLOBAL_BATCH = 64
LEAD_STEPS = 8
BRIDGE_NET = "10.213.9"
PORT = 7090


def group_work(rates, padded_lengths, c):
    """The true model's work of one CP group's sequences, per rank."""
    work = 0.0
    for s in padded_lengths:
        work += (rates["alpha"] * s * s + rates["beta"] * s) / c
        if c > 1:
            work += rates["kappa"] * s * (c - 1) / c + rates["lambda"] * (c - 1)
    return work


def true_step_seconds(rates, plan):
    """A plan-step reply's step under the true model: per microbatch the
    slowest group, plus μ."""
    total = 0.0
    for microbatch in plan["microbatches"]:
        slowest = max((group_work(rates, [int(s["padded_length"]) for s in g.get("sequences", [])],
                                  int(g["size"])) for g in microbatch["groups"]), default=0.0)
        total += slowest + rates["mu"]
    return total


# ---- the ranks (one process per daemon, run in its namespace) ----

def run_ranks(spec):
    """Threads for spec["ranks"], each taking spec["steps"] steps and
    sleeping each microbatch's true cost; exits 1 naming a failed rank."""
    import packfeed
    rates = spec["rates"]
    errors = []

    def rank(r):
        noise = random.Random(1000 + r)  # fixed per rank: the same run twice
        try:
            client = packfeed.Client("sim", socket_path=spec["socket"], rank=r)
            for _ in range(spec["steps"]):
                for batch in client.next_step(timeout=120)[0]:
                    bounds = batch["cu_seqlens_padded"].view(-1).tolist()
                    c = int(batch["local_cp_size"]) if batch.get("local_cp_size") is not None \
                        else 1
                    seconds = rates["mu"] + group_work(
                        rates, [b - a for a, b in zip(bounds, bounds[1:])], c)
                    seconds *= 1 + spec["noise"] * (2 * noise.random() - 1)
                    if spec["straggler"]:
                        if r == 1:
                            seconds *= 1.25
                        if noise.random() < 0.01:
                            seconds *= 3
                    threading.Event().wait(seconds)
            client.close()
        except Exception as error:  # reported by the exit code, with the rank
            errors.append(f"rank {r}: {error!r}")

    threads = [threading.Thread(target=rank, args=(r,)) for r in spec["ranks"]]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        sys.exit("\n".join(errors))


# ---- the nodes ----

def ip(*args, check=True):
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result


class Hosts:
    """N network namespaces on one bridge (BRIDGE_NET.1 ..), or, without
    namespaces, this host's loopback. A context manager; removes only what
    it made."""

    def __init__(self, count, netns):
        self.count, self.netns = count, netns
        self.suffix = str(os.getpid())
        self.names = []

    def __enter__(self):
        if not self.netns:
            return self
        bridge = f"pfbr{self.suffix}"
        try:
            ip("link", "add", bridge, "type", "bridge")
            ip("link", "set", bridge, "up")
            for i in range(self.count):
                name = f"pf-sim{i}-{self.suffix}"
                ip("netns", "add", name)
                self.names.append(name)
                ip("-n", name, "link", "set", "lo", "up")
                outside, inside = f"pfs{i}o{self.suffix}", f"pfs{i}i{self.suffix}"
                ip("link", "add", outside, "type", "veth", "peer", "name", inside)
                ip("link", "set", inside, "netns", name)
                ip("link", "set", outside, "master", bridge)
                ip("link", "set", outside, "up")
                ip("-n", name, "addr", "add", f"{self.address(i)}/24", "dev", inside)
                ip("-n", name, "link", "set", inside, "up")
        except Exception:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc):
        for name in self.names:
            ip("netns", "del", name, check=False)
        if self.netns:
            ip("link", "del", f"pfbr{self.suffix}", check=False)

    def address(self, i):
        return f"{BRIDGE_NET}.{i + 1}" if self.netns else "127.0.0.1"

    def port(self, i):
        return PORT if self.netns else PORT + i

    def command(self, i, argv):
        return ["ip", "netns", "exec", self.names[i], *argv] if self.netns else argv


def job_text(prefix, world, local_ranks, scheduler):
    hosted = f"  local_ranks: [{', '.join(map(str, local_ranks))}]\n" if local_ranks else ""
    return f"""jobs {{
  name: "sim"
  datasets {{ prefix: "{prefix}" }}
  topology {{ dp: {world} }}
{hosted}  global_batch: {GLOBAL_BATCH}
  seq_length: {SEQ_LENGTH}
  eod_id: 0
  append_eod: true
  seed: 11
  scheduler {{ kind: "dynamic_cp" max_tokens_per_rank: {MAX_TOKENS_PER_RANK} {scheduler} }}
}}
"""


def wait_healthy(ctl, socket, process, log, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"packfeedd exited {process.returncode}:\n"
                               + pathlib.Path(log).read_text()[-3000:])
        if subprocess.run([ctl, "health", "--socket", socket], capture_output=True).returncode == 0:
            return
        time.sleep(0.1)
    raise RuntimeError(f"packfeedd did not answer in {timeout} s:\n"
                       + pathlib.Path(log).read_text()[-3000:])


def plan_of(ctl, socket, step):
    out = subprocess.run([ctl, "plan-step", "--socket", socket, "--job", "sim", str(step),
                          "--json"], capture_output=True, text=True, check=True).stdout
    return json.loads(out)


@contextlib.contextmanager
def daemon(bin_dir, hosts, i, text, work, name):
    """A packfeedd on `text` (in host i's namespace when i is not None)."""
    socket = f"{work}/{name}.sock"
    config = pathlib.Path(work, f"{name}.textproto")
    config.write_text(f'socket_path: "{socket}"\n' + text)
    log = f"{work}/{name}.log"
    argv = [f"{bin_dir}/packfeedd", "--config", str(config)]
    with open(log, "w") as out:
        process = subprocess.Popen(hosts.command(i, argv) if i is not None else argv,
                                   stdout=out, stderr=subprocess.STDOUT)
    try:
        yield process, socket, log
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()


def simulate(bin_dir, daemons=4, ranks_per_daemon=2, steps=60, trace="heavy_tail", cp="cheap",
             noise=0.1, straggler=False, netns=True):
    """Runs the simulation; returns {"steps": [{step, version, learned,
    default}], "agree": bool, "first_version_step": int or None}: learned and
    default are each step's modelled time over the true-model plan's."""
    bin_dir = pathlib.Path(bin_dir)
    ctl = str(bin_dir / "packfeedctl")
    rates = TRUE_RATES[cp]
    world = daemons * ranks_per_daemon
    work = pathlib.Path(tempfile.mkdtemp(prefix="pf-cost-sim-"))
    prefix = f"{work}/data"
    lengths = TRACES / f"trace_{trace}.txt"
    if not lengths.exists():  # one drawn from a seed alone: made, not stored
        sys.path.insert(0, str(TRACES))
        import make_traces
        lengths = make_traces.write_made(work)[f"trace_{trace}"]
    subprocess.run([ctl, "make-dataset", "--out", prefix, "--lengths",
                    str(lengths), "--vocab", "1000"],
                   check=True, capture_output=True)
    with Hosts(daemons, netns) as hosts, contextlib.ExitStack() as stack:
        nodes = []
        for i in range(daemons):
            peers = "".join(f'peers: "{hosts.address(j)}:{hosts.port(j)}"\n'
                            for j in range(daemons) if j != i)
            text = (f'admin_tcp_address: "{hosts.address(i)}:{hosts.port(i)}"\n'
                    'admin_tcp_token: "sim"\npeer_timeout_seconds: 60\n'
                    # Steps here take tens of milliseconds, not seconds.
                    "learned_model_sync_ms: 100\n" + peers
                    + job_text(prefix, world, range(i * ranks_per_daemon,
                                                    (i + 1) * ranks_per_daemon),
                               f"learn_cost_model: true learned_model_lead_steps: {LEAD_STEPS}"))
            nodes.append(stack.enter_context(daemon(bin_dir, hosts, i, text, work, f"node{i}")))
        reference = {
            "true": stack.enter_context(daemon(
                bin_dir, hosts, None, job_text(prefix, world, None, 'cost_model: "rates" rates { '
                                               + " ".join(f"{k}: {v}" for k, v in rates.items())
                                               + " }"), work, "true")),
            "default": stack.enter_context(daemon(bin_dir, hosts, None,
                                                  job_text(prefix, world, None, ""), work,
                                                  "default")),
        }
        for process, socket, log in nodes + list(reference.values()):
            wait_healthy(ctl, socket, process, log)
        env = dict(os.environ)
        workers = []
        for i, (_, socket, _) in enumerate(nodes):
            spec = {"socket": socket, "steps": steps, "rates": rates, "noise": noise,
                    "straggler": straggler,
                    "ranks": list(range(i * ranks_per_daemon, (i + 1) * ranks_per_daemon))}
            argv = [sys.executable, __file__, "--ranks-of", json.dumps(spec)]
            workers.append(subprocess.Popen(hosts.command(i, argv), env=env,
                                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                            text=True))
        for i, worker in enumerate(workers):
            output = worker.communicate(timeout=1200)[0]
            if worker.returncode != 0:
                raise RuntimeError(f"node {i}'s ranks failed:\n{output[-3000:]}")
        rows, agree = [], True
        for step in range(steps):
            plans = [plan_of(ctl, socket, step) for _, socket, _ in nodes]
            agree &= all(p.get("microbatches") == plans[0].get("microbatches")
                         and p.get("cost_model_version", 0) == plans[0].get("cost_model_version", 0)
                         for p in plans)
            best = true_step_seconds(rates, plan_of(ctl, reference["true"][1], step))
            rows.append({"step": step, "version": plans[0].get("cost_model_version", 0),
                         "learned": true_step_seconds(rates, plans[0]) / best,
                         "default": true_step_seconds(rates,
                                                      plan_of(ctl, reference["default"][1], step))
                         / best})
        leader_log = pathlib.Path(nodes[0][2]).read_text()
    first = next((r["step"] for r in rows if r["version"] > 0), None)
    return {"steps": rows, "agree": agree, "first_version_step": first,
            "versions": [line.split("job sim: ")[-1] for line in leader_log.splitlines()
                         if "plans every step from" in line]}


def print_table(result, label):
    print(f"{label}: plans identical on every node: {result['agree']}; "
          f"first learned version in force from step {result['first_version_step']}")
    for line in result["versions"]:
        print(f"  {line}")
    print("  step  version  learned/true  default/true")
    for row in result["steps"]:
        print(f"  {row['step']:4d}  {row['version']:7d}  {row['learned']:12.4f}  "
              f"{row['default']:12.4f}")


def plot(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axis = plt.subplots(figsize=(8, 4.5))
    for label, result in results.items():
        steps = [r["step"] for r in result["steps"]]
        line, = axis.plot(steps, [r["learned"] for r in result["steps"]], label=f"{label}: learned")
        axis.plot(steps, [r["default"] for r in result["steps"]], linestyle="--",
                  color=line.get_color(), label=f"{label}: default")
    axis.axhline(1.02, color="grey", linewidth=0.8, linestyle=":")
    axis.set_xlabel("step")
    axis.set_ylabel("modelled step time / true-model plan's")
    axis.set_title("Learned cost model: convergence (true model hidden from the daemons)")
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bin_dir", nargs="?")
    parser.add_argument("--daemons", type=int, default=4)
    parser.add_argument("--ranks-per-daemon", type=int, default=2)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--trace", default="heavy_tail", choices=["heavy_tail", "chat_longdoc"])
    parser.add_argument("--cp", default=None, choices=sorted(TRUE_RATES),
                        help="default: both, one after the other")
    parser.add_argument("--noise", type=float, default=0.1)
    parser.add_argument("--straggler", action="store_true")
    parser.add_argument("--no-netns", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--png")
    parser.add_argument("--ranks-of", help=argparse.SUPPRESS)  # a node's rank process
    args = parser.parse_args()
    if args.ranks_of:
        run_ranks(json.loads(args.ranks_of))
        return
    if args.bin_dir is None:
        parser.error("BIN_DIR is required")
    results = {}
    for cp in [args.cp] if args.cp else sorted(TRUE_RATES):
        label = f"{args.trace}, {cp} CP"
        results[label] = simulate(args.bin_dir, args.daemons, args.ranks_per_daemon, args.steps,
                                  args.trace, cp, args.noise, args.straggler, not args.no_netns)
        if not args.json:
            print_table(results[label], label)
    if args.json:
        print(json.dumps(results))
    if args.png:
        plot(results, args.png)


if __name__ == "__main__":
    main()
