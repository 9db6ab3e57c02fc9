"""Glue for Megatron-LM's THD path: PackedSeqParams from a packfeed batch."""
from __future__ import annotations

import dataclasses
from typing import Any, Dict


def packed_seq_params(batch: Dict[str, Any], cp_group: Any = None) -> Any:
    """Megatron's PackedSeqParams for `batch` (a dict from packfeed.Client).
    Only the arguments the installed Megatron-LM knows are passed; cp_group is
    the dynamic-CP group of size batch["local_cp_size"], which the trainer owns.
    None for a BSHD batch (Megatron pretraining), as Megatron passes it."""
    if batch["packed_seq_params"] is None:
        return None
    from megatron.core.packed_seq_params import (  # type: ignore[import-not-found]
        PackedSeqParams,  # the trainer's Megatron
    )

    known = {field.name for field in dataclasses.fields(PackedSeqParams)}
    kwargs = dict(batch["packed_seq_params"], cp_group=cp_group)
    return PackedSeqParams(**{k: v for k, v in kwargs.items() if k in known})
