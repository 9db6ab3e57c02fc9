#!/usr/bin/env python3
"""A real Prometheus server (Debian's `prometheus`) scrapes packfeedd's
metrics_address, and its HTTP API returns packfeed figures with the values
the daemon's own stats report: steps planned, bytes read, I/O amplification
and each rank's microbatches pushed after two ranks took 3 steps each.

ctest runs it under pytest, with the build's paths (tests/conftest.py); skipped: no prometheus."""
import json
import pathlib
import shutil
import socket
import subprocess
import tempfile
import urllib.parse
import urllib.request

import pytest

from daemon_harness import Daemon, wait_until


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def query(prometheus_port, expression):
    """The instant vector of `expression`: {labels as a tuple: value}."""
    url = (f"http://127.0.0.1:{prometheus_port}/api/v1/query?"
           + urllib.parse.urlencode({"query": expression}))
    with urllib.request.urlopen(url, timeout=5) as response:
        reply = json.load(response)
    return {tuple(sorted((k, v) for k, v in r["metric"].items() if k != "__name__")):
            float(r["value"][1])
            for r in reply["data"]["result"]}


def test_prometheus_scrapes_the_daemon(bin_dir, checks):
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        pytest.skip("no prometheus binary (Debian's package `prometheus`)")
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        checks.run("make-dataset", "--out", str(work / "data"), "--count", "200",
                   "--min", "16", "--max", "400", "--mean", "120", "--vocab", "1000")
        metrics_port, prometheus_port = free_port(), free_port()
        config = f"""metrics_address: "127.0.0.1:{metrics_port}"
jobs {{
  name: "metrics"
  datasets {{ prefix: "{work / 'data'}" }}
  topology {{ dp: 2 }}
  global_batch: 16
  seq_length: 512
  eod_id: 1000
  append_eod: true
  scheduler {{ kind: "balanced" max_tokens_per_rank: 1024 }}
}}
"""
        with Daemon(bin_dir, config, workdir=work) as daemon:
            daemon.dump_ranks("metrics", [0, 1], steps=3)
            stats = daemon.ctl_json("stats")["jobs"][0]
            (work / "prometheus.yml").write_text(f"""global:
  scrape_interval: 1s
scrape_configs:
  - job_name: packfeedd
    static_configs:
      - targets: ["127.0.0.1:{metrics_port}"]
""")
            server = subprocess.Popen(
                [prometheus, f"--config.file={work / 'prometheus.yml'}",
                 f"--storage.tsdb.path={work / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{prometheus_port}"],
                stdout=subprocess.DEVNULL, stderr=(work / "prometheus.log").open("w"))
            try:
                def scraped():
                    try:
                        return bool(query(prometheus_port, "packfeed_job_steps_planned_total"))
                    except OSError:
                        return False  # not listening yet
                took = wait_until(scraped, "prometheus scraped packfeedd", timeout=60, poll=0.5)
                print(f"prometheus scraped packfeedd after {took:.1f} s")
                job = (("instance", f"127.0.0.1:{metrics_port}"), ("job", "packfeedd"),
                       ("packfeed_job", "metrics"))
                for metric, expected in [
                        ("packfeed_job_steps_planned_total", stats["steps_planned"]),
                        ("packfeed_job_read_bytes_total", stats["bytes_read"]),
                        ("packfeed_job_io_amplification", stats["io_amplification"])]:
                    got = query(prometheus_port, metric).get(job)
                    checks.check(f"{metric} = {expected}", got == float(expected), got)
                    print(f"  {metric}{{packfeed_job=\"metrics\"}} = {got}")
                pushed = query(prometheus_port, "packfeed_rank_slots_pushed_total")
                for rank in stats["ranks"]:
                    labels = tuple(sorted(job + (("rank", str(rank.get("global_rank", 0))),)))
                    checks.check(f"rank {rank.get('global_rank', 0)} pushed",
                                 pushed.get(labels) == float(rank["slots_pushed"]), pushed)
                up = query(prometheus_port, 'up{job="packfeedd"}')
                checks.check("the target is up", list(up.values()) == [1.0], up)
            finally:
                server.terminate()
                server.wait(timeout=30)
