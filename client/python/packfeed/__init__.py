"""packfeed: the data iterator of a Megatron-style trainer, fed by its node's
packfeedd. See packfeed.Client."""
from . import megatron
from .client import MEGATRON_KEYS, Client
from .errors import (AlreadyExistsError, DataLossError, DeadlineExceededError, Error,
                     FailedPreconditionError, InvalidArgumentError, NotFoundError,
                     OutOfRangeError, PermissionDeniedError, UnavailableError)

__all__ = ["Client", "MEGATRON_KEYS", "megatron", "Error", "UnavailableError",
           "DeadlineExceededError", "InvalidArgumentError", "NotFoundError", "PermissionDeniedError",
           "AlreadyExistsError", "FailedPreconditionError", "DataLossError", "OutOfRangeError"]
