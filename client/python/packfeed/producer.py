"""packfeed.Producer: a driver's way to put each step's rollouts into its
node's packfeedd (docs/INGEST.md), for every consumer job's ranks to be
served balanced and packed."""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping, Tuple

import numpy as np
import numpy.typing as npt

from . import _native
from .client import DEFAULT_SOCKET

_RESERVED = ("tokens", "group", "tag")

# A sample: tokens, group, tag and the stream's fields (arrays or tensors).
Sample = Mapping[str, Any]


def _contiguous(value: Any) -> npt.NDArray[Any]:
    """A C-contiguous NumPy view (or copy) of a torch tensor or array-like;
    16-bit floats travel as their bits."""
    try:
        import torch
    except ImportError:  # a driver without torch puts NumPy arrays
        return np.ascontiguousarray(value)
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().contiguous()
        if tensor.dtype in (torch.bfloat16, torch.float16):
            tensor = tensor.view(torch.int16)
        array: npt.NDArray[Any] = tensor.numpy()
        return array
    return np.ascontiguousarray(value)


class Producer:
    """Puts samples into ingest stream `stream` of the daemon on `socket_path`.

    A sample is a dict: ``tokens`` (int64, [T]), ``group`` (int; a group, such
    as GRPO's responses to one prompt, lies in one step), ``tag`` (int, e.g.
    the policy version; default 0) and one entry per field of the stream,
    whose first dimension is T (e.g. ``logprobs`` float32 [T], ``experts``
    int16 [T, layers, top_k]). Every put carries every field of the stream.
    """

    def __init__(self, stream: str, socket_path: str = DEFAULT_SOCKET,
                 auth_token: str = "") -> None:
        self._native = _native.producer(socket_path, stream, auth_token)
        self.stream = stream

    def put(self, step: int, samples: Iterable[Sample], wait: float = 0.0) -> Dict[str, int]:
        """Adds `samples` to `step` (not sealed yet). When the stream's memory
        budget is full, waits up to `wait` seconds for consumers to free a
        step, then raises ResourceExhaustedError. Returns the daemon's count
        of samples in the step and bytes the stream holds."""
        samples = list(samples)
        if not samples:
            raise ValueError("put needs at least one sample")
        fields = sorted(k for k in samples[0] if k not in _RESERVED)
        prepared: List[Tuple[int, int, npt.NDArray[Any], List[npt.NDArray[Any]]]] = []
        for i, sample in enumerate(samples):
            names = sorted(k for k in sample if k not in _RESERVED)
            if names != fields:
                raise ValueError(f"sample {i} has fields {names}; sample 0 has {fields}")
            tokens = np.ascontiguousarray(_contiguous(sample["tokens"]), dtype=np.int64)
            prepared.append((int(sample["group"]), int(sample.get("tag", 0)), tokens.reshape(-1),
                             [_contiguous(sample[name]).reshape(-1) for name in fields]))
        return self._native.put(step, fields, prepared, float(wait))

    def seal(self, step: int) -> Dict[str, Any]:
        """Closes `step`: the consumer jobs plan and serve it. Returns its
        sample and group counts, and ``peers_behind``: with peer daemons,
        those that had not taken the step within the daemon's seal wait
        (the daemon keeps forwarding it to them)."""
        return self._native.seal(step)

    def status(self) -> Dict[str, Any]:
        """What the stream holds (bytes per step, budget, peak) and, per
        consumer job, the steps it consumed (``consumed_before``): after a
        daemon restart, put again the steps from the least of those on."""
        return self._native.status()

    @property
    def arena_bytes_written(self) -> int:
        """How far into the staging arena (the memory shared with the
        daemon) puts have written: a put beyond it writes pages for the
        first time, which the kernel zeroes first."""
        return int(self._native.arena_bytes_written)
