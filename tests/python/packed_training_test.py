"""Training correctness, not just bytes: a tiny causal transformer in torch
computes each sequence's loss on the packed THD batches packfeed serves
(attention confined to each sequence by cu_seqlens_padded, positions from
position_ids, CP slices reassembled) and on the same sequences one by one,
unpacked, read from the dataset file through the daemon's plan. The losses
agree to 1e-5 (every token's and each sequence's sum), with static CP
(balanced) and dynamic CP; attention allowed across sequences (a negative
control) does not."""
import subprocess
import tempfile
import unittest

import torch
import torch.nn.functional as F

import packfeed
from pf_test_support import BIN_DIR, Daemon, main
from thd_reference import Dataset, token_run

VOCAB = 1000
EOD = VOCAB
SEQ_LENGTH = 256
STEPS = 2
PER_TOKEN = ("tokens", "labels", "loss_mask", "position_ids")


class TinyCausalLM(torch.nn.Module):
    """Two pre-norm transformer blocks; attention is causal and allowed only
    between positions of the same segment."""

    def __init__(self, vocab=VOCAB + 1, width=32, heads=2, layers=2, max_position=1024):
        super().__init__()
        self.heads = heads
        self.embed = torch.nn.Embedding(vocab, width)
        self.position = torch.nn.Embedding(max_position, width)
        self.blocks = torch.nn.ModuleList(torch.nn.ModuleDict({
            "norm1": torch.nn.LayerNorm(width), "qkv": torch.nn.Linear(width, 3 * width),
            "out": torch.nn.Linear(width, width), "norm2": torch.nn.LayerNorm(width),
            "mlp": torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                       torch.nn.Linear(4 * width, width)),
        }) for _ in range(layers))
        self.norm = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, tokens, positions, segments):
        """tokens, positions, segments: [T]. Returns logits [T, vocab]."""
        length = tokens.shape[0]
        causal = torch.ones(length, length, dtype=torch.bool).tril()
        allowed = causal & (segments[:, None] == segments[None, :])
        x = self.embed(tokens) + self.position(positions)
        for block in self.blocks:
            q, k, v = block["qkv"](block["norm1"](x)).chunk(3, dim=-1)
            split = lambda t: t.view(length, self.heads, -1).transpose(0, 1)
            q, k, v = split(q), split(k), split(v)
            scores = q @ k.transpose(1, 2) / (q.shape[-1] ** 0.5)
            scores = scores.masked_fill(~allowed, float("-inf"))
            attended = (scores.softmax(-1) @ v).transpose(0, 1).reshape(length, -1)
            x = x + block["out"](attended)
            x = x + block["mlp"](block["norm2"](x))
        return self.head(self.norm(x))


def token_losses(model, tokens, labels, positions, segments):
    logits = model(tokens, positions, segments)
    return F.cross_entropy(logits, labels, reduction="none")


def reassemble(slices, padded_lengths):
    """The full per-token buffer of a CP group from its members' zigzag slices
    (slices[k] is CP rank k's): sequence by sequence, rank k holds parts k and
    2c-1-k of the sequence's 2c parts."""
    c = len(slices)
    out, offsets = [], [0] * c
    for padded in padded_lengths:
        part = padded // (2 * c) if c > 1 else padded
        parts = [None] * (2 * c if c > 1 else 1)
        for k in range(c):
            start = offsets[k]
            if c == 1:
                parts[0] = slices[k][start:start + padded]
            else:
                parts[k] = slices[k][start:start + part]
                parts[2 * c - 1 - k] = slices[k][start + part:start + 2 * part]
            offsets[k] += padded // c
        out.extend(torch.cat(parts))
    return torch.stack(out)


class PackedTrainingTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.workdir = tempfile.mkdtemp(prefix="pf-packed-training-")
        cls.prefix = f"{cls.workdir}/data"
        subprocess.run([f"{BIN_DIR}/packfeedctl", "make-dataset", "--out", cls.prefix,
                        "--count", "120", "--min", "8", "--max", "300", "--mean", "80",
                        "--sigma", "1.0", "--vocab", str(VOCAB), "--seed", "3"],
                       check=True, capture_output=True)
        cls.dataset = Dataset(cls.prefix)
        torch.manual_seed(0)
        cls.model = TinyCausalLM().double().eval()

    def job(self, scheduler):
        return f"""
jobs {{
  name: "train"
  datasets {{ prefix: "{self.prefix}" }}
  topology {{ tp: 1 pp: 1 cp: 2 dp: 2 }}
  global_batch: 16
  seq_length: {SEQ_LENGTH}
  eod_id: {EOD}
  append_eod: true
  scheduler {{ kind: "{scheduler}" max_tokens_per_rank: 128 }}
}}
"""

    def run_scheduler(self, scheduler):
        with Daemon(BIN_DIR, self.job(scheduler), name=scheduler, workdir=self.workdir) as daemon:
            clients = [packfeed.Client("train", rank=r, socket_path=daemon.socket, copy=True)
                       for r in range(4)]
            compared, self.group_sizes = 0, set()
            for step in range(STEPS):
                plan = daemon.ctl_json("plan-step", "--job", "train", str(step))
                batches = [list(client.next_step()[0]) for client in clients]
                for m, planned in enumerate(plan["microbatches"]):
                    for group in planned["groups"]:
                        compared += self.check_group(scheduler, batches, m, group)
            for client in clients:
                client.close()
        return compared

    def check_group(self, scheduler, batches, m, group):
        first, size = int(group["first_rank"]), int(group["size"])
        self.group_sizes.add(size)
        members = [batches[r][m] for r in range(first, first + size)]
        if scheduler == "dynamic_cp":
            for batch in members:
                self.assertEqual(int(batch["local_cp_size"]), size)
                self.assertEqual(batch["cp_group_ranks"].tolist(), list(range(first, first + size)))
        cu_padded = members[0]["cu_seqlens_padded"]
        cu = members[0]["cu_seqlens"]
        padded_lengths = (cu_padded[1:] - cu_padded[:-1]).tolist()
        full = {name: reassemble([b[name][0] for b in members], padded_lengths)
                for name in PER_TOKEN}
        segments = torch.repeat_interleave(torch.arange(len(padded_lengths)),
                                           torch.tensor(padded_lengths))
        packed = token_losses(self.model, full["tokens"], full["labels"], full["position_ids"],
                              segments) * full["loss_mask"].double()
        # Negative control: one causal mask over the whole pack (attention
        # crossing sequences) changes the loss of every sequence but the first.
        crossing = token_losses(self.model, full["tokens"], full["labels"],
                                full["position_ids"], torch.zeros_like(segments))
        for j, planned in enumerate(group["sequences"]):
            run = token_run(self.dataset.document(int(planned["document"])), "varlen",
                            SEQ_LENGTH, EOD, True, split=True,
                            first_token=int(planned.get("first_token", 0)))
            real = int(planned["length"])
            self.assertEqual(int(cu[j + 1] - cu[j]), real)
            alone = token_losses(self.model, torch.tensor(run[:real]), torch.tensor(run[1:real + 1]),
                                 torch.arange(real), torch.zeros(real, dtype=torch.long))
            start = int(cu_padded[j])
            in_pack = packed[start:start + padded_lengths[j]]
            where = f"{scheduler} microbatch {m} group {first} sequence {j}"
            self.assertLess(float((in_pack[:real] - alone).abs().max()), 1e-5, where)
            self.assertEqual(float(in_pack[real:].abs().sum()), 0.0, where)  # pads untrained
            self.assertLess(abs(float(in_pack.sum() - alone.sum())), 1e-5 * real, where)
            if j > 0:
                wrong = crossing[start:start + real]
                self.assertGreater(float((wrong - alone).abs().mean()), 1e-3, where)
        return len(group["sequences"])

    def test_static_cp_balanced(self):
        compared = self.run_scheduler("balanced")
        self.assertGreaterEqual(compared, STEPS * 16)
        self.assertEqual(self.group_sizes, {2})
        print(f"balanced: {compared} sequences, packed loss == unpacked loss")

    def test_dynamic_cp(self):
        compared = self.run_scheduler("dynamic_cp")
        self.assertGreaterEqual(compared, STEPS * 16)
        self.assertGreater(len(self.group_sizes), 1, "every group had the same CP size")
        print(f"dynamic_cp: {compared} sequences in CP groups of sizes {sorted(self.group_sizes)}, "
              "packed loss == unpacked loss")


if __name__ == "__main__":
    main()
