"""Megatron-Core's batch functions, run on one CPU process: taken by name
from a release's megatron/core/utils.py (its heavier modules are not
imported) with the distributed world a function asks about supplied: the CP group's
size and rank, a TP broadcast that has nothing to send (every rank computes
TP rank 0's batch), Transformer Engine's thd_get_partitioned_indices as its
kernel defines it. Also datasets written with Megatron's own builder. Import
inside the megatron venv (megatron_venv.py)."""
import ast
import sys

import numpy
import torch


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
