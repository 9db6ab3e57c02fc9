"""packfeed.Client against a real packfeedd: checkpoints reproduce the
following batches, views are zero-copy slots of the ring, errors arrive as
the exception classes of packfeed.errors with the daemon's message, the GIL
is free while a client waits, a killed daemon is an exception, not a
hang, and where each rank's training loop spends its time reaches the
daemon's stats and metrics as the rank measured it."""
import collections
import dataclasses
import os
import signal
import sys
import re
import types
import subprocess
import urllib.request
import tempfile
import threading
import time
import unittest

import torch

import packfeed
from daemon_harness import free_port, ranks_over_tcp, wait_until
from pf_test_support import BIN_DIR, Daemon, main

EOD = 5000


def job_text(name="job", tp=1, cp=1, dp=2, token="", seed=1):
    return f"""
jobs {{
  name: "{name}"
  datasets {{ prefix: "{ClientTest.prefix}" }}
  topology {{ tp: {tp} pp: 1 cp: {cp} dp: {dp} }}
  global_batch: 8
  seq_length: 128
  eod_id: {EOD}
  append_eod: true
  auth_token: "{token}"
  seed: {seed}
  scheduler {{ kind: "balanced" max_tokens_per_rank: 256 }}
}}
"""


def take_steps(client, steps):
    """The next `steps` steps as lists of {field: list} (owned, comparable)."""
    out = []
    for _ in range(steps):
        iterator = client.next_step(timeout=30)[0]
        out.append([{k: v.tolist() for k, v in batch.items() if isinstance(v, torch.Tensor)}
                    for batch in iterator])
    return out


class ClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.workdir = tempfile.mkdtemp(prefix="pf-python-client-")
        ClientTest.prefix = f"{cls.workdir}/data"
        subprocess.run([f"{BIN_DIR}/packfeedctl", "make-dataset", "--out", cls.prefix,
                        "--count", "400", "--min", "4", "--max", "120", "--mean", "40",
                        "--vocab", str(EOD), "--seed", "11"], check=True, capture_output=True)

    def daemon(self, text=None, name="daemon"):
        return Daemon(BIN_DIR, text or job_text(), name=name, workdir=self.workdir)

    def test_importing_packfeed_loads_torch_before_the_native_module(self):
        # torch 2.11+cu130 loaded after the native module aborted at import
        # ("free(): invalid pointer", the lent H200): `import packfeed` alone
        # must load torch first.
        order = subprocess.run(
            [sys.executable, "-c", "import sys, packfeed; names = list(sys.modules); "
             "print(names.index('torch') < names.index('packfeed._native'))"],
            check=True, capture_output=True, text=True).stdout.strip()
        self.assertEqual(order, "True")

    def test_state_dict_round_trip_gives_the_same_following_batches(self):
        with self.daemon(name="resume") as daemon:
            first = packfeed.Client("job", rank=1, socket_path=daemon.socket)
            take_steps(first, 2)
            state = first.state_dict()
            self.assertEqual(state["next_step"], 2)
            following = take_steps(first, 3)
            first.close()
            resumed = packfeed.Client("job", rank=1, socket_path=daemon.socket, state=state)
            self.assertEqual(take_steps(resumed, 3), following)
            # load_state_dict on a live client rewinds it the same way.
            resumed.load_state_dict(state)
            self.assertEqual(take_steps(resumed, 3), following)
            resumed.close()

    def test_a_rank_on_another_node_attaches_by_address(self):
        port = free_port()
        tcp = ranks_over_tcp(f"127.0.0.1:{port}")
        with self.daemon(tcp + job_text(token="s3cret"), name="address") as daemon:
            local = packfeed.Client("job", rank=1, socket_path=daemon.socket,
                                    auth_token="s3cret")
            expected = take_steps(local, 2)
            local.close()
            # UCX over TCP, as from another node. The same steps again are a
            # rewind, which over TCP a new process may ask with the admin
            # token only.
            with self.assertRaises(packfeed.PermissionDeniedError) as raised:
                packfeed.Client("job", rank=1, address=f"127.0.0.1:{port}", auth_token="s3cret",
                                ucx_transports="tcp")
            self.assertIn("would serve again what it consumed", str(raised.exception))
            os.environ["PACKFEED_ADMIN_TOKEN"] = "adm"
            try:
                remote = packfeed.Client("job", rank=1, address=f"127.0.0.1:{port}",
                                         auth_token="s3cret", ucx_transports="tcp")
            finally:
                del os.environ["PACKFEED_ADMIN_TOKEN"]
            self.assertEqual(take_steps(remote, 2), expected)
            remote.close()
            with self.assertRaises(packfeed.PermissionDeniedError) as raised:
                packfeed.Client("job", rank=1, address=f"127.0.0.1:{port}", auth_token="guess")
            self.assertIn("wrong auth token", str(raised.exception))

    def test_a_state_of_another_job_config_is_refused_by_fingerprint(self):
        with self.daemon(name="before") as daemon:
            client = packfeed.Client("job", rank=0, socket_path=daemon.socket)
            state = client.state_dict()
            client.close()
        with self.daemon(job_text(seed=2), name="after") as daemon:
            with self.assertRaises(packfeed.FailedPreconditionError) as raised:
                packfeed.Client("job", rank=0, socket_path=daemon.socket, state=state)
            self.assertIn("sampler differ", str(raised.exception))

    def test_views_are_slots_of_the_ring_and_copies_are_owned(self):
        with self.daemon(name="views") as daemon:
            client = packfeed.Client("job", rank=0, socket_path=daemon.socket, slots=3)
            pointers = []
            while len(pointers) < 12:
                for batch in client.next_step()[0]:
                    pointers.append(batch["tokens"].data_ptr())
            # The loop holds one microbatch while it takes the next: three
            # slots serve it zero-copy, each reused once its tensors are gone.
            self.assertLessEqual(len(set(pointers)), 3)
            self.assertGreater(len(set(pointers)), 1)
            self.assertEqual(client.ring()["copied_out"], 0, client.ring())
            client.close()
            owned = packfeed.Client("job", rank=0, socket_path=daemon.socket, copy=True)
            iterator = owned.next_step()[0]
            batches = list(iterator)
            again = packfeed.Client("job", rank=1, socket_path=daemon.socket)
            self.assertTrue(all(b["tokens"].data_ptr() != batches[0]["tokens"].data_ptr()
                                for b in again.next_step()[0]))
            owned.close()
            again.close()

    def test_batches_are_the_slots_as_plain_capsules_read(self):
        """The batches packfeed.Client hands out, zero-copy and copied,
        equal the same steps read here from the plain DLPack capsules of
        _native.next(): keys, None entries, dtypes, shapes, values and
        packed_seq_params."""
        def described(batch):
            out = {}
            for key, value in batch.items():
                if isinstance(value, torch.Tensor):
                    out[key] = (value.dtype, tuple(value.shape), value.tolist())
                elif isinstance(value, dict):
                    out[key] = described(value)
                else:
                    out[key] = value
            return out

        def from_capsules(native):
            batch = dict.fromkeys(packfeed.MEGATRON_KEYS)
            for name, dtype, capsule in native["fields"]:
                tensor = torch.utils.dlpack.from_dlpack(capsule)
                batch[name] = tensor.view(torch.bool) if dtype == "bool" else tensor
            max_seqlen = int(batch["max_seqlen"])
            local_cp_size = batch["local_cp_size"]
            batch["packed_seq_params"] = {
                "qkv_format": "thd",
                "cu_seqlens_q": batch["cu_seqlens"],
                "cu_seqlens_kv": batch["cu_seqlens"],
                "cu_seqlens_q_padded": batch["cu_seqlens_padded"],
                "cu_seqlens_kv_padded": batch["cu_seqlens_padded"],
                "max_seqlen_q": max_seqlen,
                "max_seqlen_kv": max_seqlen,
                "local_cp_size": None if local_cp_size is None else int(local_cp_size),
            }
            return batch

        with self.daemon(name="native") as daemon:
            steps = {}
            for copy in (False, True):
                client = packfeed.Client("job", rank=1, socket_path=daemon.socket, copy=copy)
                steps[copy] = [[described(b) for b in client.next_step(timeout=30)[0]]
                               for _ in range(3)]
                client.close()
            client = packfeed.Client("job", rank=1, socket_path=daemon.socket)
            native = client._live()
            steps["capsules"] = []
            for _ in range(3):
                count = native.next_step(30.0)["num_microbatches"]
                steps["capsules"].append([described(from_capsules(native.next(30.0)))
                                          for _ in range(count)])
            client.close()
        self.assertEqual(steps[False], steps["capsules"])
        self.assertEqual(steps[True], steps["capsules"])
        first = steps[False][0][0]
        self.assertEqual(first["padding_mask"][0], torch.bool)
        self.assertEqual(first["packed_seq_params"]["qkv_format"], "thd")
        self.assertIsInstance(first["packed_seq_params"]["max_seqlen_q"], int)
        self.assertIsNone(first["attention_mask"])

    def test_held_tensors_never_change_and_holding_more_than_the_ring_copies(self):
        """A trainer keeps the tensors of its last K microbatches alive, as
        autograd keeps every in-flight microbatch's inputs until its backward
        (1F1B holds up to PP of them), and takes more. Each held tensor must
        stay what it was on arrival, with the default options (4 slots,
        zero-copy); beyond the ring the client copies, and says so. With a
        GPU, non-blocking copies (and, on the staged ring, an embedding's
        forward and backward) read the held tensors while more arrive."""
        devices = [None] + (["cuda"] if torch.cuda.is_available() else [])
        copied_out = 0
        with self.daemon(name="held") as daemon:
            for device, k in [(d, k) for d in devices for k in range(1, 9)]:
                client = packfeed.Client("job", rank=0, socket_path=daemon.socket, device=device)
                window = collections.deque()
                taken = 0
                while taken < 40:
                    for batch in client.next_step(timeout=30)[0]:
                        window.append(self.hold(taken, batch))
                        taken += 1
                        if len(window) > k:
                            self.assert_unchanged(window.popleft(), k)
                        self.assertLessEqual(client.ring()["held"], 3, client.ring())
                    del batch
                for entry in window:
                    self.assert_unchanged(entry, k)
                ring = client.ring()
                self.assertEqual(ring["handed_out"], taken)
                # With K held and one being taken, the ring must keep a slot
                # to fill: K + 1 >= 4 slots means copies, fewer means none.
                if k + 1 < 4:
                    self.assertEqual(ring["copied_out"], 0, (device, k, ring))
                else:
                    self.assertGreater(ring["copied_out"], 0, (device, k, ring))
                del entry
                window.clear()
                if device is not None:
                    torch.cuda.synchronize()
                self.assertEqual(client.ring()["held"], 0, "a slot outlived its tensors")
                copied_out += ring["copied_out"]
                client.close()
            # Each detach reported its count: the operator sees them all.
            rank = daemon.ctl_json("stats")["jobs"][0]["ranks"][0]
            self.assertEqual(int(rank.get("copied_out", 0)), copied_out)

    @staticmethod
    def hold(taken, batch):
        """What the trainer keeps of a microbatch: its views, their clones
        taken on arrival, and, with a GPU, work in flight that reads them."""
        views = {n: batch[n] for n in ("tokens", "labels", "position_ids", "cu_seqlens")}
        clones = {n: v.clone() for n, v in views.items()}
        inflight = {}
        if torch.cuda.is_available():
            inflight = {n: v.to("cuda", non_blocking=True) for n, v in views.items()}
            if views["tokens"].is_cuda:
                weight = torch.randn(EOD + 1, 8, device="cuda", requires_grad=True)
                torch.nn.functional.embedding(views["tokens"], weight).sum().backward()
                inflight["embedding_grad_rows"] = weight.grad.abs().sum(dim=1).ne(0).sum()
                clones["embedding_grad_rows"] = torch.unique(clones["tokens"]).numel()
        return taken, views, clones, inflight

    def assert_unchanged(self, entry, k):
        taken, views, clones, inflight = entry
        for name, view in views.items():
            self.assertTrue(torch.equal(view, clones[name]),
                            f"K={k}: {name} of microbatch {taken} changed while held")
        if inflight:
            torch.cuda.synchronize()
        for name, value in inflight.items():
            self.assertTrue(torch.equal(torch.as_tensor(value).cpu(),
                                        torch.as_tensor(clones[name]).cpu()),
                            f"K={k}: work in flight on {name} of microbatch {taken} read "
                            "changed bytes")

    def test_side_fields_arrive_shaped_and_vpp_gives_one_iterator_per_chunk(self):
        prefix = f"{self.workdir}/moe"
        subprocess.run([f"{BIN_DIR}/packfeedctl", "make-dataset", "--out", prefix, "--count",
                        "200", "--min", "4", "--max", "120", "--mean", "40", "--vocab", str(EOD),
                        "--side-field", "routed_experts:experts:4x2:8"],
                       check=True, capture_output=True)
        text = job_text().replace(ClientTest.prefix, prefix).replace(
            "pp: 1", "pp: 2 vpp: 2 vpp_group_size: 2")
        text = text.replace("seed: 1", """seed: 1
  model { num_layers: 4 }
  side_fields { name: "routed_experts" dtype: "int16" inner_shape: [4, 2] pad_value: -1
                layer_axis: true }""")
        with self.daemon(text, name="vpp") as daemon:
            first = packfeed.Client("job", rank=0, socket_path=daemon.socket)  # stage 0
            last = packfeed.Client("job", rank=2, socket_path=daemon.socket)   # stage 1
            self.assertEqual(first.num_chunks, 2)
            for client, stage in ((first, 0), (last, 1)):
                chunks, count, _, _ = client.next_step(timeout=30)
                self.assertEqual([len(c) for c in chunks], [count, count])
                # Megatron's interleaved order: chunk 0 runs ahead by a group.
                order = [(0, 0), (0, 1), (1, 0), (1, 1)] + [
                    (k, m) for m in range(2, count) for k in (0, 1)]
                got = {}
                for chunk, m in order:
                    got[(chunk, m)] = next(chunks[chunk])
                for m in range(count):
                    a, b = got[(0, m)], got[(1, m)]
                    self.assertTrue(torch.equal(a["cu_seqlens"], b["cu_seqlens"]))
                    tokens = a["padding_mask"].shape[1]
                    for batch in (a, b):  # one layer of each chunk's two, top-2
                        self.assertEqual(batch["routed_experts"].dtype, torch.int16)
                        self.assertEqual(tuple(batch["routed_experts"].shape), (1, tokens, 1, 2))
                    self.assertEqual(a["tokens"] is not None, stage == 0)  # first chunk only
                    self.assertIsNone(b["tokens"])
                    self.assertIsNone(a["labels"])
                    self.assertEqual(b["labels"] is not None, stage == 1)  # last chunk only
                    self.assertFalse(torch.equal(a["routed_experts"], b["routed_experts"]))
                self.assertEqual([len(c) for c in chunks], [0, 0])
            first.close()
            last.close()

    def test_errors_are_typed_and_carry_the_daemons_message(self):
        with self.daemon(job_text(token="s3cret"), name="errors") as daemon:
            def attach(**kwargs):
                options = dict(job="job", rank=0, socket_path=daemon.socket, auth_token="s3cret")
                options.update(kwargs)
                return packfeed.Client(**options)

            cases = [
                (dict(job="nope"), packfeed.NotFoundError, "nope"),
                (dict(auth_token="wrong"), packfeed.PermissionDeniedError, "token"),
                (dict(rank=9), packfeed.OutOfRangeError, "rank 9"),
                (dict(socket_path=f"{self.workdir}/absent.sock"), packfeed.UnavailableError,
                 "no packfeedd answers"),
            ]
            for kwargs, error, text in cases:
                with self.subTest(kwargs=kwargs):
                    with self.assertRaises(error) as raised:
                        attach(**kwargs)
                    self.assertIn(text, str(raised.exception))
            holder = attach()
            with self.assertRaises(packfeed.AlreadyExistsError):
                attach()
            holder.close()
            attach().close()  # detached: the rank attaches again at once
            self.assertTrue(issubclass(packfeed.UnavailableError, ConnectionError))
            self.assertTrue(issubclass(packfeed.DeadlineExceededError, TimeoutError))

    def test_the_gil_is_free_while_a_client_waits(self):
        with self.daemon(name="gil") as daemon:
            client = packfeed.Client("job", rank=0, socket_path=daemon.socket)
            take_steps(client, 1)
            os.kill(daemon.process.pid, signal.SIGSTOP)  # nothing more arrives
            try:
                counted, stop = [0], threading.Event()

                def count():
                    while not stop.is_set():
                        counted[0] += 1

                counter = threading.Thread(target=count)
                counter.start()
                with self.assertRaises(packfeed.DeadlineExceededError):
                    while True:  # the ring's prefetched steps first
                        list(client.next_step(timeout=0.5)[0])
                stop.set()
                counter.join()
                self.assertGreater(counted[0], 1000)
            finally:
                os.kill(daemon.process.pid, signal.SIGCONT)
            client.close()

    def test_a_restarted_daemon_is_reattached_and_nothing_is_lost_or_repeated(self):
        text = job_text(dp=1).replace("max_tokens_per_rank: 256", "max_tokens_per_rank: 128")
        with self.daemon(text, name="reference") as daemon:
            reference = packfeed.Client("job", rank=0, socket_path=daemon.socket, copy=True)
            expected = [b for step in take_steps(reference, 4) for b in step]
            reference.close()
        self.assertGreater(len(expected), 4, "steps of one microbatch test nothing")
        got = []
        daemon = self.daemon(text, name="restarted")
        with daemon:
            # Reconnecting is the default.
            client = packfeed.Client("job", rank=0, socket_path=daemon.socket, copy=True)
            got += take_steps(client, 1)[0]
            iterator, count, _, _ = client.next_step(timeout=30)
            self.assertGreater(count, 1)
            got.append({k: v.tolist() for k, v in next(iterator).items()
                        if isinstance(v, torch.Tensor)})
            taken = len(got)
            daemon.process.kill()  # mid-step, the ring holding what was pushed ahead
            daemon.process.wait()
        calls_before = client.times()["calls"]
        with self.daemon(text, name="restarted") as restarted:  # the same socket and config
            got += [{k: v.tolist() for k, v in b.items() if isinstance(v, torch.Tensor)}
                    for b in iterator]
            got += [b for step in take_steps(client, 2) for b in step]
            calls = client.times()["calls"]
            client.close()
            rank = restarted.ctl_json("stats")["jobs"][0]["ranks"][0]
        # The restarted daemon counts the calls of the connection it served,
        # not the ones the dead daemon had counted before.
        self.assertGreater(int(rank.get("calls", 0)), 0)
        self.assertLessEqual(int(rank.get("calls", 0)), calls - calls_before)
        self.assertEqual(len(got), len(expected))
        self.assertTrue(got == expected, "batches after the restart differ")
        print(f"restart: killed after {taken} of {len(expected)} microbatches (mid-step); "
              "all received once, bit-identical")

    def check_times(self, daemon, port, measured, when):
        """Every time figure the daemon shows, in stats and in each exported
        series, equals what the ranks measured; the stats and the page."""
        stats = daemon.ctl_json("stats")["jobs"][0]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as page:
            metrics = page.read().decode()

        def exported(series, rank=None):
            where = f'[^}}]*rank="{rank}"' if rank is not None else ""
            found = re.search(rf'{series}{{{where}[^}}]*}} (\S+)', metrics)
            self.assertIsNotNone(found, f"{when}: no {series} (rank {rank}) in\n{metrics}")
            return float(found.group(1))

        ranks = {int(r.get("global_rank", 0)): r for r in stats["ranks"]}
        for rank, figures in measured.items():
            for key in ("wait_seconds", "busy_seconds", "input_bound", "calls", "copied_out"):
                self.assertAlmostEqual(float(ranks[rank].get(key, 0)), figures.get(key, 0),
                                       places=9, msg=f"{when}: rank {rank} {key}")
            for series, key in (("packfeed_rank_wait_seconds_total", "wait_seconds"),
                                ("packfeed_rank_busy_seconds_total", "busy_seconds"),
                                ("packfeed_rank_copied_out_total", "copied_out"),
                                ("packfeed_rank_input_bound", "input_bound")):
                # Exactly what the rank measured; the ratio to the last bits
                # (the daemon divides doubles, the client durations).
                self.assertAlmostEqual(exported(series, rank), float(figures.get(key, 0)),
                                       places=12 if key == "input_bound" else 15,
                                       msg=f"{when}: {series} rank {rank}")
        waiting = max(measured.values(), key=lambda f: f["input_bound"])
        self.assertAlmostEqual(exported("packfeed_job_wait_seconds_total"),
                               sum(f["wait_seconds"] for f in measured.values()), places=12,
                               msg=when)
        self.assertAlmostEqual(exported("packfeed_job_input_bound"), waiting["input_bound"],
                               places=12, msg=when)
        return stats, metrics

    def test_time_spent_waiting_for_data_is_measured_and_reported(self):
        """Rank 0's loop works 30 ms per microbatch, rank 1's not at all:
        rank 1 waits for data (the daemon keeps it within prefetch_steps of
        rank 0), rank 0 hardly. The daemon's stats and Prometheus figures
        equal what each rank measured (its final report comes with its
        detach)."""
        port = free_port()
        text = f'metrics_address: "127.0.0.1:{port}"\n' + job_text()
        with self.daemon(text, name="times") as daemon:
            clients = {rank: packfeed.Client("job", rank=rank, socket_path=daemon.socket)
                       for rank in (0, 1)}
            work = {0: 0.03, 1: 0.0}
            slept = {0: 0.0, 1: 0.0}

            def train(rank):
                for _ in range(20):  # more than the ring and prefetch_steps hold
                    for _ in clients[rank].next_step(timeout=30)[0]:
                        time.sleep(work[rank])
                        slept[rank] += work[rank]

            threads = [threading.Thread(target=train, args=(rank,)) for rank in (0, 1)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            loop = {rank: client.times() for rank, client in clients.items()}
            # Still attached: a call a second after the last report sends
            # the figures it leaves (its own included) in the periodic report.
            time.sleep(1.1)
            for client in clients.values():
                client.next_step(timeout=30)
            measured = {rank: {**client.times(), "copied_out": client.ring()["copied_out"]}
                        for rank, client in clients.items()}
            wait_until(lambda: all(
                int(r.get("calls", 0)) == measured[int(r.get("global_rank", 0))]["calls"]
                for r in daemon.ctl_json("stats")["jobs"][0]["ranks"]), "the periodic reports")
            self.check_times(daemon, port, measured, "while attached")
            for client in clients.values():
                client.close()
            stats, _ = self.check_times(daemon, port, measured, "after detach")
        # Busy time is counted at the next call: the last microbatch's work
        # is followed by none.
        self.assertGreaterEqual(loop[0]["busy_seconds"], slept[0] - work[0])
        self.assertGreater(loop[1]["input_bound"], 0.5)
        self.assertLess(loop[0]["input_bound"], 0.5)
        most = max(measured, key=lambda rank: measured[rank]["input_bound"])
        self.assertEqual(int(stats.get("most_waiting_rank", 0)), most)
        self.assertAlmostEqual(float(stats["input_bound"]), measured[most]["input_bound"], places=9)
        print(f"rank 0 (30 ms of work per microbatch): {loop[0]['input_bound']:.1%} waiting; "
              f"rank 1 (none): {loop[1]['input_bound']:.1%} waiting, "
              f"{loop[1]['wait_seconds']:.2f} s; the daemon's figures equal the ranks' while "
              "attached and after detach")

    def test_a_killed_daemon_is_an_exception_not_a_hang(self):
        # reconnect_timeout=0: at once; 2 s: after trying for that long.
        for reconnect, lasts in ((0.0, (0, 10)), (2.0, (2, 15))):
            daemon = self.daemon(name="killed")
            with daemon:
                client = packfeed.Client("job", rank=0, socket_path=daemon.socket,
                                         reconnect_timeout=reconnect)
                take_steps(client, 1)
                daemon.process.kill()
                daemon.process.wait()
                started = time.monotonic()
                with self.assertRaises(packfeed.UnavailableError) as raised:
                    for _ in range(1000):  # what the ring already held, then the error
                        list(client.next_step(timeout=30)[0])
                waited = time.monotonic() - started
                self.assertTrue(lasts[0] <= waited < lasts[1], (reconnect, waited))
                self.assertIn("sender failed" if reconnect == 0 else "", str(raised.exception))
                client.close()  # nothing to detach from: no error
        # With the default (re-attach for 60 s), closing after the daemon is
        # gone waits only the detach bound (5 s), not the whole minute.
        daemon = self.daemon(name="gone")
        with daemon:
            client = packfeed.Client("job", rank=0, socket_path=daemon.socket)
            take_steps(client, 1)
            daemon.process.kill()
            daemon.process.wait()
            started = time.monotonic()
            client.close()
            self.assertLess(time.monotonic() - started, 8)


class PackedSeqParamsTest(unittest.TestCase):
    def test_only_the_arguments_the_installed_megatron_knows_are_passed(self):
        @dataclasses.dataclass
        class PackedSeqParams:  # an older Megatron: no local_cp_size
            qkv_format: str = None
            cu_seqlens_q: object = None
            cu_seqlens_kv_padded: object = None
            max_seqlen_q: int = None
            cp_group: object = None

        module = types.ModuleType("megatron.core.packed_seq_params")
        module.PackedSeqParams = PackedSeqParams
        names = ("megatron", "megatron.core", "megatron.core.packed_seq_params")
        saved = {name: sys.modules.get(name) for name in names}
        sys.modules.update({"megatron": types.ModuleType("megatron"),
                            "megatron.core": types.ModuleType("megatron.core"),
                            "megatron.core.packed_seq_params": module})
        try:
            cu = torch.tensor([0, 5, 9], dtype=torch.int32)
            batch = {"packed_seq_params": {
                "qkv_format": "thd", "cu_seqlens_q": cu, "cu_seqlens_kv": cu,
                "cu_seqlens_q_padded": cu, "cu_seqlens_kv_padded": cu, "max_seqlen_q": 5,
                "max_seqlen_kv": 5, "local_cp_size": 2}}
            params = packfeed.megatron.packed_seq_params(batch, cp_group="group")
        finally:
            for name, value in saved.items():
                if value is None:
                    sys.modules.pop(name)
                else:
                    sys.modules[name] = value
        self.assertEqual(params.qkv_format, "thd")
        self.assertIs(params.cu_seqlens_kv_padded, cu)
        self.assertEqual(params.max_seqlen_q, 5)
        self.assertEqual(params.cp_group, "group")


if __name__ == "__main__":
    main()
