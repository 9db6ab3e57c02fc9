"""packfeed: the data iterator of a Megatron-style trainer, fed by its node's
packfeedd. See packfeed.Client."""
from . import megatron
from ._native import __version__
from .client import DEFAULT_SOCKET, MEGATRON_KEYS, Batch, ChunkIterator, Client, StepIterator
from .errors import (AlreadyExistsError, DataLossError, DeadlineExceededError, Error,
                     FailedPreconditionError, InvalidArgumentError, NotFoundError,
                     OutOfRangeError, PermissionDeniedError, UnavailableError)

__all__ = ["Client", "StepIterator", "ChunkIterator", "Batch", "MEGATRON_KEYS", "DEFAULT_SOCKET",
           "megatron", "__version__", "Error", "UnavailableError",
           "DeadlineExceededError", "InvalidArgumentError", "NotFoundError", "PermissionDeniedError",
           "AlreadyExistsError", "FailedPreconditionError", "DataLossError", "OutOfRangeError"]
