"""packfeed: the data iterator of a Megatron-style trainer, fed by its node's
packfeedd. See packfeed.Client; a driver that puts samples at run time uses
packfeed.Producer."""
# torch, where installed, is loaded before the native module: loaded after
# it, torch 2.11+cu130 aborted at import ("free(): invalid pointer") on the
# lent GPU machine.
try:
    import torch  # noqa: F401
except ImportError:
    pass

from . import megatron
from ._native import __version__
from .client import DEFAULT_SOCKET, MEGATRON_KEYS, Batch, ChunkIterator, Client, StepIterator
from .errors import (AlreadyExistsError, DataLossError, DeadlineExceededError, Error,
                     FailedPreconditionError, InvalidArgumentError, NotFoundError,
                     OutOfRangeError, PermissionDeniedError, ResourceExhaustedError,
                     UnavailableError)
from .producer import Producer

__all__ = ["Client", "Producer", "StepIterator", "ChunkIterator", "Batch", "MEGATRON_KEYS",
           "DEFAULT_SOCKET", "megatron", "__version__", "Error", "UnavailableError",
           "DeadlineExceededError", "InvalidArgumentError", "NotFoundError", "PermissionDeniedError",
           "AlreadyExistsError", "FailedPreconditionError", "DataLossError", "OutOfRangeError",
           "ResourceExhaustedError"]
