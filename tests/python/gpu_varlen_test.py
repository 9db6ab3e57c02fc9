"""GPU: a real attention kernel consumes the device tensors the Python client
hands out (the staged ring: host ring copied to the device by the copy
engine on arrival, the current stream waiting on the copy's event).

For every microbatch of a `balanced` job (CP 1) and of a `dynamic_cp` job
(its CP-1 groups), on every rank:
  - every field equals what the daemon serves to a host ring (packfeedctl
    dump of the same rank and step, from a daemon of the same config);
  - torch's variable-length attention (varlen_attn, bf16, causal through
    window_size=(-1, 0)), given cu_seqlens_padded and max_seqlen as served,
    equals causal attention computed on each sequence alone;
  - a negative control: attention across the pack's sequence boundaries
    differs.

Skips (exit 77) without a CUDA device or without torch.nn.attention.varlen
(torch >= 2.10)."""
import importlib
import os
import subprocess
import tempfile
import unittest

import torch
import torch.nn.functional as F

import packfeed
from pf_test_support import BIN_DIR, Daemon, main

# "staged" or "daemon": run_gpu_checks.sh runs this file with each.
DEVICE_RING = os.environ.get("PF_DEVICE_RING", "staged")

VOCAB = 1000
EOD = VOCAB
HEADS, HEAD_DIM = 4, 64
STEPS = 2
RANKS = 4


def skip_reason():
    if not torch.cuda.is_available():
        return "no CUDA device on this machine"
    try:
        importlib.import_module("torch.nn.attention.varlen")
    except ImportError:
        return f"torch {torch.__version__} has no torch.nn.attention.varlen (needs >= 2.10)"
    return None


def job(prefix, scheduler, cp, max_tokens):
    return f"""
jobs {{
  name: "train"
  datasets {{ prefix: "{prefix}" }}
  topology {{ tp: 1 pp: 1 cp: {cp} dp: {RANKS // cp} }}
  global_batch: 32
  seq_length: 1024
  eod_id: {EOD}
  append_eod: true
  scheduler {{ kind: "{scheduler}" max_tokens_per_rank: {max_tokens} }}
}}
"""


@unittest.skipIf(skip_reason() is not None, skip_reason() or "")
class VarlenAttentionTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.workdir = tempfile.mkdtemp(prefix="pf-gpu-varlen-")
        cls.prefix = f"{cls.workdir}/data"
        subprocess.run([f"{BIN_DIR}/packfeedctl", "make-dataset", "--out", cls.prefix,
                        "--count", "400", "--min", "16", "--max", "1000", "--mean", "200",
                        "--sigma", "1.0", "--vocab", str(VOCAB), "--seed", "5"],
                       check=True, capture_output=True)
        generator = torch.Generator().manual_seed(0)
        # Per-token q, k and v: fixed random rows looked up by token and by
        # position, so a sequence's attention depends on its tokens only.
        cls.embedding = torch.randn(VOCAB + 1, 3, HEADS, HEAD_DIM, generator=generator)
        cls.position = torch.randn(4096, 3, HEADS, HEAD_DIM, generator=generator)

    def run_job(self, scheduler, cp, max_tokens):
        from torch.nn.attention.varlen import varlen_attn
        device = torch.device("cuda", 0)
        embedding = self.embedding.to(device, torch.bfloat16)
        position = self.position.to(device, torch.bfloat16)
        text = job(self.prefix, scheduler, cp, max_tokens)
        # What a host ring gets, from a first daemon (same config, same
        # batches: the schedule is deterministic across restarts).
        with Daemon(BIN_DIR, text, name=f"{scheduler}-host", workdir=self.workdir) as daemon:
            expected = daemon.dump_ranks("train", range(RANKS), steps=STEPS)
        checked = 0
        with Daemon(BIN_DIR, text, name=scheduler, workdir=self.workdir) as daemon:
            clients = [packfeed.Client("train", rank=r, socket_path=daemon.socket, device=device,
                                       device_ring=DEVICE_RING)
                       for r in range(RANKS)]
            for step in range(STEPS):
                for rank, client in enumerate(clients):
                    self.assertEqual(client.ring_memory, "cuda")
                    want = expected[rank]["steps"][step]
                    microbatches, count, _, _ = client.next_step()
                    self.assertEqual(count, want["num_microbatches"])
                    for m, batch in enumerate(microbatches):
                        where = f"{scheduler} rank {rank} step {step} microbatch {m}"
                        self.check_bytes(batch, want["microbatches"][m], where)
                        local_cp_size = batch["packed_seq_params"]["local_cp_size"]
                        if cp == 1 or local_cp_size == 1:  # whole sequences
                            checked += self.check_attention(varlen_attn, batch, embedding,
                                                            position, where)
            for client in clients:
                client.close()
        return checked

    def check_bytes(self, batch, expected, where):
        for name, values in expected.items():
            tensor = batch[name]
            self.assertEqual(tensor.device.type, "cuda", f"{where}: {name}")
            self.assertEqual(tensor.cpu().flatten().tolist() if tensor.dim() else tensor.item(),
                             values, f"{where}: field {name} differs from the host ring's")

    def check_attention(self, varlen_attn, batch, embedding, position, where):
        tokens = batch["tokens"].reshape(-1).long()
        positions = batch["position_ids"].reshape(-1).long()
        qkv = embedding[tokens] + position[positions]
        q, k, v = qkv.unbind(1)
        cu_padded = batch["cu_seqlens_padded"]
        cu = batch["cu_seqlens"]
        max_seqlen = batch["packed_seq_params"]["max_seqlen_q"]
        packed = varlen_attn(q, k, v, cu_padded, cu_padded, max_seqlen, max_seqlen,
                             window_size=(-1, 0))
        crossing = varlen_attn(q, k, v, cu_padded[[0, -1]], cu_padded[[0, -1]],
                               int(cu_padded[-1]), int(cu_padded[-1]), window_size=(-1, 0))
        starts, lengths = cu_padded[:-1].tolist(), (cu[1:] - cu[:-1]).tolist()
        for j, (start, length) in enumerate(zip(starts, lengths)):
            rows = slice(start, start + length)
            alone = F.scaled_dot_product_attention(
                q[rows].transpose(0, 1), k[rows].transpose(0, 1), v[rows].transpose(0, 1),
                is_causal=True).transpose(0, 1)
            error = float((packed[rows].float() - alone.float()).abs().max())
            self.assertLess(error, 0.02, f"{where} sequence {j}")
            if j > 0:
                wrong = float((crossing[rows].float() - alone.float()).abs().max())
                self.assertGreater(wrong, 0.1, f"{where} sequence {j}: crossing attention")
        return len(lengths)

    def test_balanced(self):
        checked = self.run_job("balanced", cp=1, max_tokens=2048)
        self.assertGreater(checked, 0)
        print(f"balanced: {checked} sequences, varlen_attn == per-sequence causal attention")

    def test_dynamic_cp_single_rank_groups(self):
        # Sequences over 512 tokens need a CP-2 group; the others get one rank.
        checked = self.run_job("dynamic_cp", cp=2, max_tokens=512)
        self.assertGreater(checked, 0, "no CP-1 group in the dynamic_cp job")
        print(f"dynamic_cp: {checked} sequences in CP-1 groups, varlen_attn == per-sequence")


if __name__ == "__main__":
    main()
