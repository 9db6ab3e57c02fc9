"""Exceptions raised by packfeed. The C++ client reports an absl status; the
extension turns it into the class `class_for` names (its only raise site), so
every message arrives intact and callers can catch by Python's usual bases."""


class Error(RuntimeError):
    """Any failure reported by packfeed's C++ client or its daemon."""


class UnavailableError(Error, ConnectionError):
    """No daemon answers (or it is starting or draining), or the daemon (or
    the connection to it) died and did not come back within
    reconnect_timeout."""


class DeadlineExceededError(Error, TimeoutError):
    """Nothing arrived within the timeout."""


class InvalidArgumentError(Error, ValueError):
    """An option or request the daemon or client refuses as malformed, or
    ring slots smaller than the job's largest microbatch."""


class NotFoundError(Error, LookupError):
    """An unknown job."""


class PermissionDeniedError(Error, PermissionError):
    """A wrong auth token."""


class AlreadyExistsError(Error):
    """The rank is already attached."""


class FailedPreconditionError(Error):
    """Wrong state: a fingerprint mismatch, a rank another daemon hosts, a
    step begun before the last one was consumed, or the daemon ended this
    rank (its reason in the message: a sample it needs cannot be read or
    served)."""


class DataLossError(Error):
    """Bytes that cannot be trusted were refused (nothing of them handed out)."""


class ResourceExhaustedError(Error):
    """The daemon is full: an ingest stream's memory budget had no room for a
    put within its wait."""


class OutOfRangeError(Error, IndexError):
    """A rank outside the job's topology, or no microbatch left in the step."""


_BY_CODE = {
    "UNAVAILABLE": UnavailableError,
    "DEADLINE_EXCEEDED": DeadlineExceededError,
    "INVALID_ARGUMENT": InvalidArgumentError,
    "NOT_FOUND": NotFoundError,
    "PERMISSION_DENIED": PermissionDeniedError,
    "UNAUTHENTICATED": PermissionDeniedError,
    "ALREADY_EXISTS": AlreadyExistsError,
    "FAILED_PRECONDITION": FailedPreconditionError,
    "DATA_LOSS": DataLossError,
    "OUT_OF_RANGE": OutOfRangeError,
    "RESOURCE_EXHAUSTED": ResourceExhaustedError,
}


def class_for(code_name: str) -> type:
    """The exception class for an absl status code name ("UNAVAILABLE", ...)."""
    return _BY_CODE.get(code_name, Error)
