"""GPU: the staged ring's lifetime rule with the trainer's stream busy.

A device buffer of the staged ring may be filled again only once no tensor
of its microbatch is alive and the stream recorded at next() is past every
read queued on it. Each test holds that stream back with a GPU sleep before
the reads, so they run long after the client has moved on and the copy
engine could have refilled the buffer:

  - 1F1B: the last K microbatches stay alive (K = 2, zero-copy slots; K = 3,
    slots - 1, where the next ones come as private device copies) while an
    embedding's forward and backward over their tokens is queued behind the
    sleep; the outputs, the weight's gradient and late clones of the held
    tokens must equal what the tokens were (the host ring's bytes);
  - freed at once: every view is dropped right after a read is queued behind
    the sleep, so only the recorded stream protects the buffer;
  - a rank attached over TCP (ranks_over_tcp) asking for a device ring the
    daemon writes: a UCX put where UCX has GPUDirect RDMA, else the staged
    ring, saying why; its tokens equal the host ring's;
  - the negative control: the same reads on a side stream that was not
    recorded (the documented misuse: "clone them there") must see at least
    one refilled buffer, or the two tests above prove nothing.

Skips (exit 77) without a CUDA device."""
import os
import subprocess
import tempfile
import unittest

import torch

import packfeed
from daemon_harness import free_port, ranks_over_tcp
from pf_test_support import BIN_DIR, Daemon, main

# "staged" (the default) or "daemon" (a device ring the daemon copies into):
# run_gpu_checks.sh runs this file with each.
DEVICE_RING = os.environ.get("PF_DEVICE_RING", "staged")

VOCAB = 1000
EOD = VOCAB
STEPS = 6
WIDTH = 16
# About 5 ms at an H100's clock: long against a 64 KiB copy and a next().
SLEEP_CYCLES = 10_000_000

JOB = """
jobs {{
  name: "train"
  datasets {{ prefix: "{prefix}" }}
  topology {{ tp: 1 pp: 1 cp: 1 dp: 2 }}
  global_batch: 32
  seq_length: 1024
  eod_id: {eod}
  append_eod: true
  scheduler {{ kind: "balanced" max_tokens_per_rank: 2048 }}
}}
"""


@unittest.skipIf(not torch.cuda.is_available(), "no CUDA device on this machine")
class DeviceLifetimeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.workdir = tempfile.mkdtemp(prefix="pf-gpu-lifetime-")
        prefix = f"{cls.workdir}/data"
        subprocess.run([f"{BIN_DIR}/packfeedctl", "make-dataset", "--out", prefix,
                        "--count", "600", "--min", "16", "--max", "1000", "--mean", "200",
                        "--sigma", "1.0", "--vocab", str(VOCAB), "--seed", "7"],
                       check=True, capture_output=True)
        cls.job = JOB.format(prefix=prefix, eod=EOD)
        with Daemon(BIN_DIR, cls.job, name="host", workdir=cls.workdir) as daemon:
            dump = daemon.dump_ranks("train", [0], steps=STEPS)[0]
        cls.expected = [torch.tensor(m["tokens"]).reshape(-1)
                        for step in dump["steps"] for m in step["microbatches"]]
        cls.device = torch.device("cuda", 0)

    def microbatches(self, client):
        """Rank 0's microbatches in order, as the trainer takes them."""
        for _ in range(STEPS):
            yield from client.next_step(timeout=30)[0]

    def serve(self, name):
        return Daemon(BIN_DIR, self.job, name=name, workdir=self.workdir)

    def client(self, daemon):
        client = packfeed.Client("train", rank=0, socket_path=daemon.socket,
                                 device=self.device, slots=4, device_ring=DEVICE_RING)
        self.assertEqual(client.ring_memory, "cuda")
        # Asked for and not had would test the staged ring twice.
        self.assertEqual(client.ring()["device_ring_fallback"], "")
        return client

    def assert_tokens(self, got, index, what):
        want = self.expected[index]
        self.assertTrue(torch.equal(got.reshape(-1).long().cpu(), want),
                        f"microbatch {index}: {what} differs from the host ring's tokens")

    def test_1f1b_held_microbatches_survive_queued_forward_and_backward(self):
        for held in (2, 3):
            with self.subTest(held=held), self.serve(f"1f1b-{held}") as daemon:
                client = self.client(daemon)
                weight = torch.randn(VOCAB + 1, WIDTH, device=self.device, requires_grad=True)
                window, outputs, late_clones = [], [], []
                for index, batch in enumerate(self.microbatches(client)):
                    tokens = batch["tokens"]
                    torch.cuda._sleep(SLEEP_CYCLES)
                    output = torch.nn.functional.embedding(tokens, weight)
                    output.sum().backward()  # every token adds one to its row's gradient
                    outputs.append(output.detach())
                    window.append((index, tokens))
                    if len(window) > held:  # the oldest microbatch's backward is done
                        oldest, old_tokens = window.pop(0)
                        torch.cuda._sleep(SLEEP_CYCLES)
                        late_clones.append((oldest, old_tokens.clone()))
                        del old_tokens
                    del batch, tokens
                late_clones += [(i, t.clone()) for i, t in window]
                ring = client.ring()
                window.clear()
                torch.cuda.synchronize()
                self.assertEqual(len(outputs), len(self.expected))
                for index, clone in late_clones:
                    self.assert_tokens(clone, index, f"K={held}: a late clone of the held tokens")
                for index, output in enumerate(outputs):
                    want = weight.detach()[self.expected[index].to(self.device)]
                    self.assertTrue(torch.equal(output.reshape(want.shape), want),
                                    f"K={held} microbatch {index}: the embedding read other rows")
                counts = torch.bincount(torch.cat(self.expected), minlength=VOCAB + 1)
                self.assertTrue(torch.equal(weight.grad[:, 0].cpu(), counts.float()),
                                f"K={held}: the gradient counted other tokens")
                # K = slots - 1 held: the client copies rather than leave no slot to fill.
                self.assertEqual(ring["copied_out"] > 0, held == 3, ring)
                self.assertEqual(client.ring()["held"], 0, "a slot outlived its tensors")
                client.close()

    def reads_after_freeing(self, stream, name):
        """Queues a clone of every microbatch's tokens behind a sleep on
        `stream`, drops the views at once, and returns [(index, clone)]."""
        reads = []
        with self.serve(name) as daemon:
            client = self.client(daemon)
            for index, batch in enumerate(self.microbatches(client)):
                tokens = batch["tokens"]
                current = torch.cuda.current_stream(self.device)
                stream.wait_stream(current)  # after the staged copy, as at next()
                with torch.cuda.stream(stream):
                    torch.cuda._sleep(SLEEP_CYCLES)
                    reads.append((index, tokens.clone()))
                del batch, tokens
            torch.cuda.synchronize()
            client.close()
        return reads

    def test_a_rank_over_tcp_gets_device_tensors_or_says_why_not(self):
        """A rank whose daemon is on another node (ranks_over_tcp): asked for
        a device ring the daemon writes, it gets a UCX put into device memory
        only where UCX writes it with GPUDirect RDMA; on one node UCX would
        emulate the put, so the staged ring serves and says why. Either way
        the tokens are the host ring's."""
        port = free_port()
        tcp = ranks_over_tcp(f"127.0.0.1:{port}")
        job = self.job.replace("append_eod: true", 'append_eod: true\n  auth_token: "s3cret"')
        with Daemon(BIN_DIR, tcp + job, name="over-tcp", workdir=self.workdir):
            client = packfeed.Client("train", rank=0, address=f"127.0.0.1:{port}",
                                     auth_token="s3cret", device=self.device, slots=4,
                                     device_ring="daemon")
            fallback = client.ring()["device_ring_fallback"]
            print(f"a rank over TCP: device ring fallback: {fallback or 'none'}")
            self.assertEqual(client.ring_memory, "cuda")
            for index, batch in enumerate(self.microbatches(client)):
                self.assert_tokens(batch["tokens"], index, "a rank over TCP")
            client.close()

    def test_freed_views_wait_for_reads_queued_on_the_recorded_stream(self):
        reads = self.reads_after_freeing(torch.cuda.current_stream(self.device), "recorded")
        self.assertEqual(len(reads), len(self.expected))
        for index, clone in reads:
            self.assert_tokens(clone, index, "a read queued before the views were freed")

    def test_negative_control_reads_on_an_unrecorded_stream_see_refilled_buffers(self):
        reads = self.reads_after_freeing(torch.cuda.Stream(self.device), "unrecorded")
        differ = sum(not torch.equal(clone.reshape(-1).long().cpu(), self.expected[index])
                     for index, clone in reads)
        print(f"negative control: {differ} of {len(reads)} reads on an unrecorded stream "
              "saw a refilled buffer")
        self.assertGreater(differ, 0, "no buffer was refilled under a late read: the "
                           "lifetime tests above would pass without the rule")


if __name__ == "__main__":
    main()
