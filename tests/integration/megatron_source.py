"""Megatron-Core's batch functions, run on one CPU process: taken by name
from a release's megatron/core/utils.py (its heavier modules are not
imported) with the distributed world a function asks about supplied: the CP group's
size and rank, a TP broadcast that has nothing to send (every rank computes
TP rank 0's batch), Transformer Engine's thd_get_partitioned_indices as its
kernel defines it. On them, the one reference of pretrain_gpt's get_batch
that the tests hold packfeed to: GetBatch019 and GetBatch016. Also datasets
written with Megatron's own builder. Import inside the megatron venv
(megatron_venv.py)."""
import ast
import sys

import numpy
import torch
from torch.utils.data import default_collate


class CpGroup:
    def __init__(self, size, rank):
        self.size, self.rank = size, rank


class TorchWithCpGroup:
    """torch, whose distributed world is the CpGroup a function is handed,
    and whose "device" is the CPU."""
    class distributed:
        get_world_size = staticmethod(lambda group: group.size)
        get_rank = staticmethod(lambda group: group.rank)
        # TP rank 0 sends; it already holds what it sends.
        broadcast = staticmethod(lambda tensor, src, group=None: None)

    class cuda:
        current_device = staticmethod(lambda: "cpu")

    def __getattr__(self, name):
        return getattr(torch, name)


def binary_search(target, array):
    """Transformer Engine's device binary search (thd_utils)."""
    left, right = 1, len(array) - 1
    while left < right:
        mid = (left + right) // 2
        if array[mid] <= target:
            left = mid + 1
        else:
            right = mid
    return left - 1


class TransformerEngine:
    @staticmethod
    def thd_get_partitioned_indices(cu_seqlens, total_tokens, world_size, rank):
        """thd_partition_indices_kernel, one token at a time."""
        local = [int(c) // world_size for c in cu_seqlens.tolist()]
        out = []
        for token in range(total_tokens // world_size):
            sequence = binary_search(token, local)
            length = local[sequence + 1] - local[sequence]
            index = token - local[sequence]
            part = rank if index < length // 2 else (world_size - 1) * 2 - rank
            out.append(index + local[sequence] * world_size + length // 2 * part)
        return torch.tensor(out, dtype=torch.int32)


def megatron_functions(source, names, **extra):
    """{name: function} of the top-level functions `names` of `source` (a
    megatron/core/utils.py), run as written against TorchWithCpGroup, with
    `extra` names they call."""
    tree = ast.parse(source)
    found = [node for node in tree.body
             if isinstance(node, ast.FunctionDef) and node.name in names]
    missing = set(names) - {node.name for node in found}
    if missing:
        sys.exit(f"megatron/core/utils.py lacks {sorted(missing)}")
    for node in found:
        # Annotations name process-group types this torch need not have.
        node.returns = None
        for arg in node.args.args + node.args.kwonlyargs:
            arg.annotation = None
        node.decorator_list = []
    namespace = {"torch": TorchWithCpGroup(), "tex": TransformerEngine, "Any": object, **extra}
    exec(compile(ast.Module(body=found, type_ignores=[]), "megatron/core/utils.py", "exec"),
         namespace)
    return namespace


def write_dataset(prefix, documents, mean, seed, eod, multiple=1):
    """int32 tokens with Megatron's IndexedDatasetBuilder: lognormal
    document lengths around `mean` (rounded up to `multiple`), each ending
    with the EOD; every fifth stored as two sequences."""
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    random = numpy.random.RandomState(seed)
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=numpy.int32)
    for d in range(documents):
        length = int(numpy.clip(random.lognormal(numpy.log(mean), 0.8), 2, 20 * mean))
        length = -(-length // multiple) * multiple
        tokens = random.randint(1, 50000, size=length)
        tokens[-1] = eod
        half = length // (2 * multiple) * multiple
        lengths = [length] if d % 5 or half == 0 else [half, length - half]
        builder.add_document(tokens, lengths)
    builder.finalize(f"{prefix}.idx")
    return prefix


class GetBatch019:
    """pretrain_gpt's get_batch of Megatron-Core 0.19 on one rank, its steps
    as that function takes them: TP rank 0's collated batch through
    get_batch_on_this_tp_rank, flatten_batch_for_packed_sequences, then
    get_batch_on_this_cp_rank, all from `utils_source` (0.19's
    megatron/core/utils.py)."""
    # pretrain_gpt's BATCH_KEYS: what its get_batch returns, in order.
    KEYS = ("attention_mask", "cu_seqlens", "cu_seqlens_padded", "hybrid_cp_group", "labels",
            "local_cp_size", "loss_mask", "max_seqlen", "position_ids", "tokens")

    def __init__(self, utils_source, seq_length):
        self.seq_length = seq_length
        self.megatron = megatron_functions(utils_source, [
            "get_batch_on_this_tp_rank", "_merge_cu_seqlens_across_micro_batch",
            "flatten_batch_for_packed_sequences",
            "_get_batch_on_this_cp_rank_per_sequence_balancing",
            "_get_batch_on_this_cp_rank_per_document_balancing", "get_batch_on_this_cp_rank"])

    def __call__(self, items, *, pp_size, stage, cp_size, cp_rank, inter_document_masking,
                 per_sequence=None, vp_stage=None, vpp=None, create_attention_mask=False):
        """{key: value} of KEYS for the samples `items` on the rank of
        pipeline stage `stage` and CP rank `cp_rank`; under VPP (`vpp`
        chunks) for model chunk `vp_stage`, first (last) when it is the first
        (last) stage's first (last) chunk, as
        is_first_or_last_pipeline_stage(vp_stage) says. `per_sequence`: the
        CP split (--cp-split-per-sequence; default: with inter-document
        masking)."""
        first = stage == 0 and (vp_stage or 0) == 0
        last = stage == pp_size - 1 and (vp_stage is None or vp_stage == vpp - 1)
        if not (first or last) and not inter_document_masking:
            return dict.fromkeys(self.KEYS)
        batch = default_collate(items)
        # BlendedDataset adds dataset_id (one value per sample), which 0.19.2's
        # CP split cannot cut (IndexError under CP > 1); it is not returned.
        batch.pop("dataset_id", None)
        for key in self.KEYS:
            batch[key] = batch.get(key)
        batch = self.megatron["get_batch_on_this_tp_rank"](
            batch, broadcast_src_rank=0, broadcast_group=None,
            has_cu_seqlens=inter_document_masking, is_hybrid_cp=False,
            create_attention_mask_in_dataloader=create_attention_mask, cp_size=cp_size,
            tp_rank=0, micro_batch_size=len(items), seq_length=self.seq_length,
            mtp_on_this_rank=False, pipeline_model_parallel_size=pp_size,
            is_pipeline_first_stage=first, is_pipeline_last_stage=last)
        batch = self.megatron["flatten_batch_for_packed_sequences"](batch)
        if not (first or last):
            values = dict.fromkeys(self.KEYS)
            for key in ("cu_seqlens", "cu_seqlens_padded", "max_seqlen"):
                values[key] = batch[key]
            return values
        batch = self.megatron["get_batch_on_this_cp_rank"](
            batch, is_hybrid_cp=False, cp_group=CpGroup(cp_size, cp_rank),
            hybrid_cp_group_func=None,
            use_per_sequence_balancing=(inter_document_masking if per_sequence is None
                                        else per_sequence))
        return {key: batch[key] for key in self.KEYS}


class GetBatch016:
    """pretrain_gpt's get_batch of Megatron-Core 0.16 on one rank: TP rank
    0's batch of five keys (the dataset's attention mask with them), the
    first stage without labels and loss_mask, the last without tokens and
    position_ids (0.16's get_batch_on_this_tp_rank, in megatron/training,
    which its wheel lacks), then get_batch_on_this_cp_rank from
    `utils_source` (0.16's megatron/core/utils.py) as written."""
    # What pretrain_gpt's get_batch of 0.16 returns, in order.
    KEYS = ("tokens", "labels", "loss_mask", "attention_mask", "position_ids")

    def __init__(self, utils_source):
        self.megatron = megatron_functions(
            utils_source, ["get_batch_on_this_cp_rank"], get_pg_size=lambda group: group.size,
            get_pg_rank=lambda group: group.rank)

    def __call__(self, items, *, stage, cp_size, cp_rank):
        """Its values in KEYS' order; `stage`: 0 (first) or 1 (last) of PP 2."""
        collated = default_collate(items)
        batch = {key: collated.get(key) for key in self.KEYS}
        if stage == 0:
            batch["labels"] = batch["loss_mask"] = None
        else:
            batch["tokens"] = batch["position_ids"] = None
        return tuple(self.megatron["get_batch_on_this_cp_rank"](batch, CpGroup(cp_size, cp_rank))
                     .values())
