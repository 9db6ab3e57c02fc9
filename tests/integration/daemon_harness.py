"""Runs a real packfeedd for the integration tests and talks to it through
packfeedctl, as an operator would."""
import json
import pathlib
import signal
import socket
import subprocess
import tempfile
import time


def wait_until(condition, what, timeout=20.0, poll=0.05):
    """Polls `condition` until it is true; returns the seconds it took, or
    raises naming `what` after `timeout` seconds. Tests wait for a state,
    never for a fixed time."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"not within {timeout} s: {what}")
        time.sleep(poll)
    return time.monotonic() - start


def free_port():
    """A TCP port of the loopback nobody listens on now (the kernel's pick)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def ranks_over_tcp(address):
    """Daemon configuration lines: Admin and Control on `address`, so ranks
    attach there as from a node without a daemon (every job then needs its
    auth_token)."""
    return (f'admin_tcp_address: "{address}"\nadmin_tcp_token: "adm"\nranks_over_tcp: true\n'
            "ranks_over_tcp_without_tls: true\n")


def make_dataset(bin_dir, prefix, *options):
    """`packfeedctl make-dataset --out PREFIX OPTIONS...`; returns `prefix`."""
    subprocess.run([f"{bin_dir}/packfeedctl", "make-dataset", "--out", str(prefix), *options],
                   check=True, capture_output=True)
    return prefix


def start_up_errors(bin_dir, config_path):
    """Runs packfeedd on a configuration it must refuse; returns its exit
    code and its [error] lines."""
    result = subprocess.run([f"{bin_dir}/packfeedd", "--config", str(config_path)],
                            capture_output=True, text=True, timeout=30)
    return result.returncode, [line for line in (result.stdout + result.stderr).splitlines()
                               if "[error]" in line]


class Daemon:
    """A packfeedd on a config written to a scratch directory. Use as a
    context manager: the daemon is stopped with SIGTERM and must exit 0."""

    def __init__(self, bin_dir, config_text, name="daemon", workdir=None):
        self.bin_dir = pathlib.Path(bin_dir)
        self.ctl = str(self.bin_dir / "packfeedctl")
        self.dir = pathlib.Path(workdir or tempfile.mkdtemp(prefix="pf-daemon-"))
        self.socket = str(self.dir / f"{name}.sock")
        self.config = self.dir / f"{name}.textproto"
        self.config.write_text(f'socket_path: "{self.socket}"\n' + config_text)
        self.log = self.dir / f"{name}.log"
        self.process = None

    def __enter__(self):
        return self.start()

    def start(self, wait=True):
        """Starts packfeedd; with `wait`, returns once it answers health
        (a daemon with peers answers only once they agree)."""
        self._log_file = self.log.open("w")
        self.process = subprocess.Popen(
            [str(self.bin_dir / "packfeedd"), "--config", str(self.config)],
            stdout=self._log_file, stderr=subprocess.STDOUT)
        if not wait:
            return self
        deadline = time.time() + 20
        while time.time() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"packfeedd exited {self.process.returncode}:\n"
                                   + self.log.read_text())
            if self.ctl_run("health").returncode == 0:
                return self
            time.sleep(0.1)
        raise RuntimeError("packfeedd did not answer in 20 s:\n" + self.log.read_text())

    def __exit__(self, *exc):
        self.stop()

    def stop(self):
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                raise RuntimeError("packfeedd ignored SIGTERM for 20 s")
        if self.process:
            self._log_file.close()
        return self.process.returncode if self.process else None

    def ctl_run(self, *args, timeout=60):
        return subprocess.run([self.ctl, *args, "--socket", self.socket],
                              capture_output=True, text=True, timeout=timeout)

    def ctl_json(self, *args):
        result = self.ctl_run(*args, "--json")
        if result.returncode != 0:
            raise RuntimeError(f"packfeedctl {args}: {result.stderr}")
        return json.loads(result.stdout)

    def rank_stats(self, job, rank):
        """The stats of global rank `rank` of `job`."""
        job_stats = next(j for j in self.ctl_json("stats")["jobs"] if j["name"] == job)
        return next(r for r in job_stats["ranks"] if int(r.get("global_rank", 0)) == rank)

    def start_dump(self, job, rank, steps, *extra):
        """Starts `packfeedctl dump` as rank `rank`; returns the process."""
        return subprocess.Popen(
            [self.ctl, "dump", "--socket", self.socket, "--job", job, "--rank", str(rank),
             "--steps", str(steps), "--json", *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def dump_ranks(self, job, ranks, steps, *extra):
        """Dumps every rank of `ranks` at once (as the trainer's ranks would
        run); returns {rank: dump}."""
        processes = {r: self.start_dump(job, r, steps, *extra) for r in ranks}
        out = {}
        for rank, process in processes.items():
            stdout, stderr = process.communicate(timeout=120)
            if process.returncode != 0:
                raise RuntimeError(f"dump rank {rank}: {stderr}")
            out[rank] = json.loads(stdout)
        return out
