"""A Megatron-style training loop fed by packfeed: what replaces
wrap_data_iterator + get_batch_on_this_rank_for_sequence_packing.

In Megatron-LM the two places to change are:

    # before: data_iterator, M, seqlen_sum, seqlen_squared_sum = wrap_data_iterator(...)
    data_iterator, M, seqlen_sum, seqlen_squared_sum = client.next_step()
    forward_backward_func(forward_step_func=forward_step, data_iterator=data_iterator,
                          num_microbatches=M, ...)

    def forward_step(data_iterator, model):
        batch = next(data_iterator)       # Megatron's keys, torch tensors
        params = packfeed.megatron.packed_seq_params(batch, cp_group=...)
        output = model(batch["tokens"], batch["position_ids"], None,
                       labels=batch["labels"], packed_seq_params=params)
        ...

Without Megatron installed this script runs the same loop on a tiny torch
model whose attention is confined to each packed sequence (the THD rule
cu_seqlens_padded describes), on one rank with PP=1 and CP=1.

usage: train_loop.py [--socket S] [--job J] [--rank R] [--steps N] [--vocab V] [--lr LR]
(defaults from PACKFEED_SOCKET, PACKFEED_JOB, RANK; see packfeed.Client)"""
import argparse

import torch
import torch.nn.functional as F

import packfeed


class PackedAttentionLM(torch.nn.Module):
    """Embedding + one attention layer + LM head, over a THD pack."""

    def __init__(self, vocab, width=64, max_position=8192):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.position = torch.nn.Embedding(max_position, width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, tokens, position_ids, cu_seqlens_padded):
        lengths = cu_seqlens_padded[1:] - cu_seqlens_padded[:-1]
        segment = torch.repeat_interleave(torch.arange(len(lengths)), lengths.long())
        allowed = torch.ones(len(segment), len(segment), dtype=torch.bool).tril()
        allowed &= segment[:, None] == segment[None, :]
        x = self.embed(tokens[0]) + self.position(position_ids[0])
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = (q @ k.T / q.shape[-1] ** 0.5).masked_fill(~allowed, float("-inf"))
        return self.head(x + scores.softmax(-1) @ v)


def forward_step(data_iterator, model):
    """Megatron's contract: the summed masked loss and the tokens it covers
    (per-token loss, as dynamic CP requires)."""
    batch = next(data_iterator)
    logits = model(batch["tokens"], batch["position_ids"], batch["cu_seqlens_padded"])
    losses = F.cross_entropy(logits, batch["labels"][0], reduction="none")
    mask = batch["loss_mask"][0]
    return (losses * mask).sum(), mask.sum()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket")
    parser.add_argument("--job")
    parser.add_argument("--rank", type=int)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--vocab", type=int, default=32001)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = PackedAttentionLM(args.vocab)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    with packfeed.Client(args.job, rank=args.rank, socket_path=args.socket) as client:
        for _ in range(args.steps):
            data_iterator, num_microbatches, seqlen_sum, _ = client.next_step()
            optimizer.zero_grad()
            loss_sum, tokens = 0.0, 0.0
            for _ in range(num_microbatches):  # forward_backward_func's loop
                loss, count = forward_step(data_iterator, model)
                loss.backward()
                loss_sum, tokens = loss_sum + float(loss), tokens + float(count)
            optimizer.step()
            step = client.last_step["step"]
            print(f"rank {client.rank} step {step}: {num_microbatches} microbatches, "
                  f"{int(tokens)} trained tokens, loss {loss_sum / tokens:.4f} "
                  f"(global batch: {seqlen_sum} padded tokens)")
        state = client.state_dict()
    print(f"rank {client.rank}: checkpoint would store {state}")


if __name__ == "__main__":
    main()
