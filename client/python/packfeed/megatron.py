"""packfeed as Megatron-LM's data path.

pretrain_gpt.py, with --dataloader-type external, takes packfeed's
iterators from train_valid_test_datasets_provider and its batches from
get_batch (Megatron-Core 0.19's pretrain_gpt) or get_batch_016 (0.16's):

    from packfeed import megatron as packfeed_megatron
    get_batch = packfeed_megatron.get_batch
    train_valid_test_datasets_provider = packfeed_megatron.train_valid_test_datasets_provider

Every rank gets from its node's daemon exactly its own part of each
microbatch (its pipeline stage's fields, its CP rank's positions), so there
is no TP broadcast and no CP split here: get_batch only puts the fields in
the form Megatron's get_batch returns them (docs/PRETRAINING.md).
packed_seq_params builds Megatron's PackedSeqParams for THD jobs of the
other kinds.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import os
from typing import Any, Callable, Deque, Dict, Iterator, List, Optional, Tuple

from . import errors

# What Megatron-Core 0.19's pretrain_gpt get_batch returns, in this order
# (alphabetical, as its BATCH_KEYS).
BATCH_KEYS = ("attention_mask", "cu_seqlens", "cu_seqlens_padded", "hybrid_cp_group", "labels",
              "local_cp_size", "loss_mask", "max_seqlen", "position_ids", "tokens")
# What Megatron-Core 0.16's returns (its batch dict's values, in this order;
# packed_seq_params follows them).
BATCH_KEYS_016 = ("tokens", "labels", "loss_mask", "attention_mask", "position_ids")
# The fields laid out along the sequence.
_SEQUENCE_KEYS = ("tokens", "labels", "loss_mask", "position_ids")

Batch = Dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Settings:
    """What turns a packfeed microbatch into Megatron's batch, from
    pretrain_gpt's arguments (settings_from_args reads them)."""
    micro_batch_size: int
    seq_length: int
    # --create-attention-mask-in-dataloader (Megatron's default; 0.19 turns
    # it off with inter-document masking): Megatron's dataset makes a dense
    # [mbs, 1, s, s] mask, which packfeed never sends: it is built here.
    create_attention_mask: bool = True
    # --reset-attention-mask without inter-document masking: packfeed
    # serves the THD row; Megatron's batch is BSHD with the documents in
    # its dense mask.
    reset_attention_mask: bool = False
    cp_size: int = 1
    cp_rank: int = 0
    # --hybrid-context-parallel: each split's steps come as
    # HybridCPDataLoaderWrapper's (samples_this_rank_with_id,
    # sample_id_groups) (HybridSteps), and get_batch returns a sub-sample's
    # CP part with its hybrid CP group.
    hybrid_cp: bool = False


def settings_from_args(args: Any) -> Settings:
    """Settings of pretrain_gpt's parsed arguments (megatron.training's
    get_args()); the CP rank from megatron.core.parallel_state."""
    cp_size = getattr(args, "context_parallel_size", 1) or 1
    cp_rank = 0
    if cp_size > 1:
        from megatron.core import parallel_state  # type: ignore[import-not-found]
        cp_rank = parallel_state.get_context_parallel_rank()
    inter_document = bool(getattr(args, "dataloader_inter_document_masking", False))
    return Settings(
        micro_batch_size=args.micro_batch_size, seq_length=args.seq_length,
        create_attention_mask=bool(args.create_attention_mask_in_dataloader)
        and not inter_document,
        reset_attention_mask=bool(args.reset_attention_mask) and not inter_document,
        cp_size=cp_size, cp_rank=cp_rank,
        hybrid_cp=bool(getattr(args, "hybrid_context_parallel", False)))


def megatron_batch(batch: Batch, settings: Settings) -> Batch:
    """One microbatch of packfeed.Client as Megatron's dataloader batch
    reaches get_batch on this rank: every key of BATCH_KEYS (None where
    Megatron has none), after its TP broadcast and CP split.

    - Inter-document masking (cu_seqlens without reset_attention_mask):
      the THD row as flatten_batch_for_packed_sequences leaves it,
      cu_seqlens [1, n] int32, max_seqlen [1] int32; Megatron's dataset
      makes no cu_seqlens_padded.
    - reset_attention_mask: the THD row back to [mbs, seq_length] and, with
      create_attention_mask, each sample's mask with its documents apart.
    - Otherwise BSHD; with create_attention_mask the causal mask, cut to
      this CP rank's rows as get_batch_on_this_cp_rank cuts it.
    A stage holding neither inputs nor targets (a pipeline's middle) gets
    no mask, as Megatron builds its batch only on the first and last."""
    out: Batch = dict.fromkeys(BATCH_KEYS)
    for key in _SEQUENCE_KEYS:
        out[key] = batch.get(key)
    present = [out[key] for key in _SEQUENCE_KEYS if out[key] is not None]
    cu_seqlens = batch.get("cu_seqlens")
    if cu_seqlens is not None and not settings.reset_attention_mask:
        out["cu_seqlens"] = cu_seqlens.view(1, -1)
        out["max_seqlen"] = batch["max_seqlen"].view(1)
        return out
    if cu_seqlens is not None:
        shape = (settings.micro_batch_size, settings.seq_length)
        for key in _SEQUENCE_KEYS:
            if out[key] is not None:
                out[key] = out[key].view(shape)
    if settings.create_attention_mask and present:
        out["attention_mask"] = _attention_mask(settings, present[0].device, cu_seqlens)
    return out


def get_batch(data_iterator: Optional[Iterator[Batch]], vp_stage: Optional[int] = None
              ) -> List[Any]:
    """pretrain_gpt's get_batch of Megatron-Core 0.19: the values of
    BATCH_KEYS for this rank's next microbatch. A middle pipeline stage
    gets None for each, but cu_seqlens, cu_seqlens_padded and max_seqlen
    with inter-document masking. vp_stage is accepted for Megatron's call;
    the iterator is already the model chunk's.

    Under --hybrid-context-parallel Megatron's schedule hands TP rank 0 an
    iterator over one sub-sample and the other TP ranks None: each of those
    takes the same sub-sample from its own daemon stream (HybridSteps), so
    nothing is broadcast. The batch is the sub-sample's CP part, as
    get_batch_on_this_cp_rank(..., is_hybrid_cp=True) leaves it, with
    hybrid_cp_group the group of local_cp_size ranks (None at 1)."""
    if data_iterator is None:
        batch = _tp_peer_sub_sample()
    else:
        batch = next(data_iterator)
    if HYBRID_SUB_SAMPLE in batch:
        return _hybrid_batch(batch)
    return [batch[key] for key in BATCH_KEYS]


def get_batch_016(data_iterator: Optional[Iterator[Batch]], vp_stage: Optional[int] = None
                  ) -> Tuple[Any, ...]:
    """pretrain_gpt's get_batch of Megatron-Core 0.16: (tokens, labels,
    loss_mask, attention_mask, position_ids, packed_seq_params), all None
    on a middle stage; packed_seq_params is None but for a hybrid-CP
    sub-sample, which gets the SBHD PackedSeqParams 0.16's
    get_batch_on_this_hybrid_cp_rank makes (the whole sub-sample's length,
    local_cp_size and its hybrid group). On TP ranks > 0 under hybrid CP,
    as get_batch."""
    batch = next(data_iterator) if data_iterator is not None else _tp_peer_sub_sample()
    values = tuple(batch.get(key) for key in BATCH_KEYS_016)
    if HYBRID_SUB_SAMPLE not in batch:
        return (*values, None)
    from megatron.core.packed_seq_params import PackedSeqParams  # type: ignore[import-not-found]
    hybrid = dict(zip(BATCH_KEYS, _hybrid_batch(batch)))
    padded = int(batch["cu_seqlens_padded"][0, -1])
    bounds = batch["cu_seqlens_padded"].view(-1)
    params = PackedSeqParams(qkv_format="sbhd", cu_seqlens_q=bounds, cu_seqlens_kv=bounds,
                             cu_seqlens_q_padded=bounds, cu_seqlens_kv_padded=bounds,
                             max_seqlen_q=padded, max_seqlen_kv=padded,
                             local_cp_size=int(hybrid["local_cp_size"]),
                             cp_group=hybrid["hybrid_cp_group"])
    return (*values, params)


class MegatronIterator:
    """One split's microbatches for one model chunk, step after step, each
    as megatron_batch makes it. Megatron's schedules take num_microbatches
    of them per iteration; evaluation eval_iters iterations of them."""

    def __init__(self, steps: "_Steps", chunk: int, settings: Settings) -> None:
        self._steps, self._chunk, self._settings = steps, chunk, settings
        self._step = 0  # index into _Steps' steps

    def __iter__(self) -> "MegatronIterator":
        return self

    def __next__(self) -> Batch:
        while True:
            try:
                return megatron_batch(next(self._steps.chunk(self._step, self._chunk)),
                                      self._settings)
            except StopIteration:
                self._step += 1
                self._steps.passed(self._chunk, self._step)


class _Steps:
    """A split's steps, fetched once and shared by its model chunks'
    iterators: Megatron's interleaved schedule runs chunk 0 ahead, so a step
    is begun by the first chunk to reach it and dropped once every chunk
    has moved past it."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._first = 0  # the index of _chunks[0]
        self._chunks: List[List[Any]] = []  # per step, each chunk's iterator
        self._at = [0] * client.num_chunks

    def chunk(self, step: int, chunk: int) -> Any:
        while self._first + len(self._chunks) <= step:
            iterator = self.client.next_step()[0]
            self._chunks.append(iterator if isinstance(iterator, list) else [iterator])
        return self._chunks[step - self._first][chunk]

    def passed(self, chunk: int, step: int) -> None:
        self._at[chunk] = step
        while self._chunks and min(self._at) > self._first:
            self._chunks.pop(0)
            self._first += 1


# Marks a hybrid-CP sub-sample (HybridSteps), already cut to this rank's CP part.
HYBRID_SUB_SAMPLE = "packfeed_hybrid_sub_sample"
# The per-token fields of a sub-sample.
_SUB_SAMPLE_KEYS = ("tokens", "labels", "loss_mask", "position_ids", "padding_mask")


class HybridSteps:
    """One split's steps under Megatron-Core's --hybrid-context-parallel.
    next() gives what Megatron's HybridCPDataLoaderWrapper gives this rank
    for a global batch, (samples_this_rank_with_id, sample_id_groups), from
    the daemon's plan instead of its all-gather, scheduler and all-to-all:

    - Megatron's groups are the daemon's hybrid_group of each microbatch:
      the microbatches with the same CP groups on every rank run as one
      group, their sub-samples back to back in microbatch order, so every
      rank of a CP group of size c holds the group's sub-samples in the
      same order and changes partners only at a barrier;
    - sample_id_groups[g][r] lists the gids dp-cp rank r runs in group g,
      for this rank and its CP partners (all Megatron's schedule reads: its
      own list and how many ranks hold each gid); other ranks' lists are
      left empty, since no rank learns the others' part of the plan;
    - samples_this_rank_with_id[gid] is the sub-sample's CP part on this
      rank (tokens, labels, loss_mask, position_ids, padding_mask as
      [1, padded / c]) with cu_seqlens [[0, length]], cu_seqlens_padded
      [[0, padded]] and max_seqlen [padded] of the whole sub-sample. A
      sub-sample is padded to a multiple of its split (2c); pads carry
      loss_mask 0.

    On TP ranks > 0, which Megatron's schedule hands no data, get_batch
    takes the sub-samples in the order the schedule runs them."""

    def __init__(self, client: Any, dp_cp_rank: int, dp_cp_size: int) -> None:
        self.client = client
        self._rank, self._ranks = dp_cp_rank, dp_cp_size
        self._queue: Deque[Batch] = collections.deque()  # TP ranks > 0: sub-samples to run

    def __iter__(self) -> "HybridSteps":
        return self

    def __next__(self) -> Tuple[Dict[int, Batch], List[List[List[int]]]]:
        samples: Dict[int, Batch] = {}
        groups: List[List[List[int]]] = []
        for microbatch in self.client.next_step()[0]:
            c = int(microbatch["local_cp_size"])
            gids = [int(g) for g in microbatch["sample_ids"].tolist()]
            g = int(microbatch["hybrid_group"])
            if g == len(groups):
                groups.append([[] for _ in range(self._ranks)])
            elif g > len(groups):
                raise ValueError(f"hybrid_group {g} before group {len(groups)}")
            first = self._rank - self._rank % c
            for partner in range(first, first + c):
                groups[g][partner].extend(gids)
            real = microbatch["cu_seqlens"].tolist()
            padded = microbatch["cu_seqlens_padded"].tolist()
            for k, gid in enumerate(gids):
                samples[gid] = _sub_sample(microbatch, c, real[k + 1] - real[k], padded[k] // c,
                                           padded[k + 1] // c)
        return samples, groups

    def next_sub_sample(self) -> Batch:
        """The next sub-sample in the order Megatron's schedule runs this
        rank's (group by group, each group's list in order)."""
        while not self._queue:
            samples, groups = next(self)
            for group in groups:
                self._queue.extend(samples[gid] for gid in group[self._rank])
        return self._queue.popleft()


def _sub_sample(microbatch: Batch, c: int, length: int, begin: int, end: int) -> Batch:
    import torch
    out: Batch = {key: microbatch[key][:, begin:end] for key in _SUB_SAMPLE_KEYS
                  if microbatch.get(key) is not None}
    padded = (end - begin) * c
    device = microbatch["cu_seqlens"].device
    out["cu_seqlens"] = torch.tensor([[0, length]], dtype=torch.int32, device=device)
    out["cu_seqlens_padded"] = torch.tensor([[0, padded]], dtype=torch.int32, device=device)
    out["max_seqlen"] = torch.tensor([padded], dtype=torch.int32, device=device)
    out["local_cp_size"] = torch.tensor(c, dtype=torch.int32)
    out[HYBRID_SUB_SAMPLE] = True
    return out


def _hybrid_batch(batch: Batch) -> List[Any]:
    out: Batch = dict.fromkeys(BATCH_KEYS)
    for key in BATCH_KEYS:
        if key in batch:
            out[key] = batch[key]
    c = int(out["local_cp_size"])
    if c > 1:
        from megatron.core import parallel_state
        out["hybrid_cp_group"] = parallel_state.get_hybrid_data_context_parallel_groups(
            group_size=c)
    return [out[key] for key in BATCH_KEYS]


# This process's hybrid-CP splits (train, valid, test), for TP ranks > 0.
_HYBRID: List[Optional[HybridSteps]] = []


def _tp_peer_sub_sample() -> Batch:
    """A TP rank > 0 under hybrid CP: training (autograd on) runs the train
    split, evaluation the valid split."""
    import torch
    if not _HYBRID:
        raise ValueError("packfeed: get_batch got no data iterator, and no hybrid-CP split is "
                         "served in this process")
    split = _HYBRID[0] if torch.is_grad_enabled() else _HYBRID[1]
    if split is None:
        raise ValueError("packfeed: a TP rank > 0 evaluates under hybrid CP, and the job serves "
                         "no valid split")
    return split.next_sub_sample()


class HybridCPDataLoaderWrapper:
    """Takes the place of Megatron-Core's HybridCPDataLoaderWrapper
    (megatron.training.training uses it under --hybrid-context-parallel).
    Over a packfeed split it passes the daemon's steps on as they are (the
    daemon planned them); over anything else it is Megatron's own."""

    def __new__(cls, data_iterator: Any, config: Any = None, pg_collection: Any = None) -> Any:
        if isinstance(getattr(data_iterator, "iterable", data_iterator), HybridSteps):
            return data_iterator
        return _MEGATRON_HOOKS["wrapper"](data_iterator, config, pg_collection)


# Megatron's own hooks, kept when packfeed takes their place.
_MEGATRON_HOOKS: Dict[str, Any] = {}


def _build_pretraining_data_loader(dataset: Any, consumed_samples: int) -> Any:
    """Megatron's build_pretraining_data_loader, but a packfeed split is its
    own loader: the daemon is the sampler (--dataloader-type single)."""
    if isinstance(dataset, HybridSteps):
        return dataset
    return _MEGATRON_HOOKS["loader"](dataset, consumed_samples)


def _serve_hybrid_context_parallel() -> None:
    """Routes megatron.training.training's two hybrid-CP hooks to packfeed
    (no file of Megatron's changes): its data loader builder passes packfeed
    splits through, and its HybridCPDataLoaderWrapper passes their steps on."""
    from megatron.training import training  # type: ignore[import-not-found]
    if not _MEGATRON_HOOKS:
        _MEGATRON_HOOKS["wrapper"] = training.HybridCPDataLoaderWrapper
        _MEGATRON_HOOKS["loader"] = training.build_pretraining_data_loader
    training.HybridCPDataLoaderWrapper = HybridCPDataLoaderWrapper
    training.build_pretraining_data_loader = _build_pretraining_data_loader


# The clients of this process by (socket, job, rank): the provider is called
# once per model chunk, and every chunk reads the same rank's steps.
_SPLITS: Dict[Tuple[str, str, int], _Steps] = {}


def datasets_provider(job: Optional[str] = None, *, socket_path: Optional[str] = None,
                      args: Any = None, settings: Optional[Settings] = None,
                      **client_kwargs: Any) -> Callable[..., Tuple[Any, Any, Any]]:
    """A train_valid_test_datasets_provider for pretrain_gpt with
    --dataloader-type external. Its (train, valid, test) are
    MegatronIterators of the jobs JOB, JOB.valid and JOB.test
    (serve_every_split; a split the daemon does not serve is None, as
    Megatron's builder gives None for a split without samples), starting at
    Megatron's consumed_train_samples and consumed_valid_samples (so a run
    resumed from a checkpoint goes on where it stopped) and at 0 for test.

    job defaults to PACKFEED_JOB; args to megatron.training's get_args() at
    the call; settings to settings_from_args(args); client_kwargs go to
    packfeed.Client (rank, device, auth_token, slots, ...), device
    defaulting to "cuda" (this rank's LOCAL_RANK) when torch has a device,
    since Megatron's get_batch hands the model device tensors."""
    from .client import Client
    import torch

    if "device" not in client_kwargs and torch.cuda.is_available():
        client_kwargs = dict(client_kwargs, device="cuda")

    def provider(train_val_test_num_samples: Any, vp_stage: Optional[int] = None
                 ) -> Tuple[Any, Any, Any]:
        del train_val_test_num_samples  # the daemon's job says how many
        megatron_args = args if args is not None else _megatron_args()
        batch_settings = settings or settings_from_args(megatron_args)
        name = job or os.environ.get("PACKFEED_JOB")
        if not name:
            raise ValueError("packfeed: no job named: pass job= or set PACKFEED_JOB")
        splits = ((name, megatron_args.consumed_train_samples, True),
                  (f"{name}.valid", megatron_args.consumed_valid_samples, False),
                  (f"{name}.test", 0, False))
        if batch_settings.hybrid_cp:
            return _hybrid_splits(Client, splits, socket_path, client_kwargs)
        out: List[Optional[MegatronIterator]] = []
        for split, consumed, required in splits:
            steps = _split_steps(Client, split, consumed, socket_path, required, client_kwargs)
            if steps is None:
                out.append(None)
                continue
            split_settings = batch_settings
            if split != name:  # evaluation, in --eval-micro-batch-size microbatches
                split_settings = dataclasses.replace(
                    batch_settings, micro_batch_size=getattr(
                        megatron_args, "eval_micro_batch_size", None)
                    or batch_settings.micro_batch_size)
            chunks = steps.client.num_chunks
            if (vp_stage is None) != (chunks == 1) or (vp_stage or 0) >= chunks:
                raise ValueError(f"packfeed job {split} has {chunks} model chunks per stage; "
                                 f"Megatron asked for vp_stage {vp_stage}")
            out.append(MegatronIterator(steps, vp_stage or 0, split_settings))
        return out[0], out[1], out[2]

    # Every rank builds its own iterator (Megatron otherwise builds on TP
    # rank 0 only and broadcasts).
    provider.is_distributed = True  # type: ignore[attr-defined]
    return provider


def _hybrid_splits(client_type: Any, splits: Any, socket_path: Optional[str],
                   client_kwargs: Dict[str, Any]) -> Tuple[Any, Any, Any]:
    """The provider under --hybrid-context-parallel: each split's HybridSteps
    (the daemon's jobs are hybrid_context_parallel), Megatron's hooks routed
    to them."""
    from megatron.core import parallel_state
    rank = parallel_state.get_data_parallel_rank(with_context_parallel=True)
    ranks = parallel_state.get_data_parallel_world_size(with_context_parallel=True)
    _serve_hybrid_context_parallel()
    out: List[Optional[HybridSteps]] = []
    for split, consumed, required in splits:
        steps = _split_steps(client_type, split, consumed, socket_path, required, client_kwargs)
        out.append(None if steps is None else HybridSteps(steps.client, rank, ranks))
    _HYBRID[:] = out
    return out[0], out[1], out[2]


def _split_steps(client_type: Any, job: str, consumed: int, socket_path: Optional[str],
                 required: bool, client_kwargs: Dict[str, Any]) -> Optional[_Steps]:
    rank = client_kwargs.get("rank")
    key = (socket_path or "", job, -1 if rank is None else rank)
    if key not in _SPLITS:
        try:
            client = client_type(job, socket_path=socket_path, start_sample=consumed,
                                 **client_kwargs)
        except errors.NotFoundError:
            if required:
                raise
            return None
        _SPLITS[key] = _Steps(client)
    return _SPLITS[key]


def close() -> None:
    """Detaches every client the providers of this process attached (at
    the end of training; a provider called again attaches anew)."""
    while _SPLITS:
        _SPLITS.popitem()[1].client.close()
    _HYBRID.clear()


def _megatron_args() -> Any:
    from megatron.training import get_args
    return get_args()


def train_valid_test_datasets_provider(train_val_test_num_samples: Any,
                                       vp_stage: Optional[int] = None) -> Tuple[Any, Any, Any]:
    """datasets_provider() with every default: the job PACKFEED_JOB on the
    socket PACKFEED_SOCKET (or the default), this process's RANK, Megatron's
    arguments."""
    return datasets_provider()(train_val_test_num_samples, vp_stage=vp_stage)


train_valid_test_datasets_provider.is_distributed = True  # type: ignore[attr-defined]


@functools.lru_cache(maxsize=8)
def _causal_rows(seq_length: int, cp_size: int, cp_rank: int, device: Any) -> Any:
    """[1, 1, rows, s] bool, True where attention is masked: the causal
    mask's rows of CP rank cp_rank (parts r and 2·CP − 1 − r of 2·CP).
    Cached: each microbatch gets a copy, as Megatron's dataset makes one."""
    import torch
    mask: Any = torch.tril(torch.ones((seq_length, seq_length), device=device)) < 0.5
    if cp_size > 1:
        part = seq_length // (2 * cp_size)
        rows = list(range(cp_rank * part, (cp_rank + 1) * part)) + list(
            range((2 * cp_size - 1 - cp_rank) * part, (2 * cp_size - cp_rank) * part))
        mask = mask[rows]
    return mask.view(1, 1, *mask.shape)


def _attention_mask(settings: Settings, device: Any, cu_seqlens: Any) -> Any:
    """Megatron's dataset mask for the microbatch: causal (read-only, shared
    between microbatches) or, from the THD row's cu_seqlens, causal within
    each document of each sample."""
    import torch
    mbs, seq = settings.micro_batch_size, settings.seq_length
    causal = _causal_rows(seq, settings.cp_size, settings.cp_rank, device)
    if cu_seqlens is None:
        return causal.expand(mbs, 1, *causal.shape[2:]).contiguous()
    bounds = cu_seqlens.to(device=device, dtype=torch.int64)
    # Each position's document: how many bounds lie at or before it.
    document = torch.bucketize(torch.arange(mbs * seq, device=device), bounds, right=True)
    document = document.view(mbs, seq)
    same = document.unsqueeze(2) == document.unsqueeze(1)
    return (causal[0] | ~same).unsqueeze(1)


def packed_seq_params(batch: Dict[str, Any], cp_group: Any = None) -> Any:
    """Megatron's PackedSeqParams for `batch` (a dict from packfeed.Client).
    Only the arguments the installed Megatron-LM knows are passed; cp_group is
    the dynamic-CP group of size batch["local_cp_size"], which the trainer owns.
    None for a BSHD batch (Megatron pretraining), as Megatron passes it."""
    if batch["packed_seq_params"] is None:
        return None
    from megatron.core.packed_seq_params import (
        PackedSeqParams,  # the trainer's Megatron
    )

    known = {field.name for field in dataclasses.fields(PackedSeqParams)}
    kwargs = dict(batch["packed_seq_params"], cp_group=cp_group)
    return PackedSeqParams(**{k: v for k, v in kwargs.items() if k in known})
