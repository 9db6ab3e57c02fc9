"""Type stub of packfeed._native, the pybind11 module over libpackfeed_client
(client/python/packfeed_module.cc). Use packfeed.Client, not this module."""
from typing import Any, Dict, List, Optional, Tuple

__version__: str
DEFAULT_SOCKET: str
DEFAULT_RECONNECT_TIMEOUT: float

class Client:
    """One attached rank. Blocking calls release the GIL."""

    def next_step(self, timeout: Optional[float] = ...) -> Dict[str, int]:
        """step, num_microbatches, first_microbatch, padded_sum,
        padded_squared_sum, real_sum, real_squared_sum."""
    def next(self, timeout: Optional[float] = ..., cuda_stream: int = ...) -> Dict[str, Any]:
        """step, microbatch, fields: [(name, dtype name, DLPack capsule)],
        host_copies, copied_out."""
    def next_batches(self, timeout: Optional[float], cuda_stream: int, keys: Dict[str, Any],
                     copy: bool, chunks: int) -> List[Dict[str, Any]]:
        """The next microbatch as packfeed.Client's Batch, one per model chunk
        (NAME@K fields to chunk K as NAME): a copy of `keys`, every field a
        torch tensor viewing the slot (`copy`: an owned clone),
        packed_seq_params."""
    def detach(self) -> None: ...
    def ring(self) -> Dict[str, Any]:
        """slots, held, handed_out, copied_out, device_ring_fallback."""
    def state(self) -> Dict[str, Any]:
        """job, fingerprint, next_step, next_microbatch."""
    def times(self) -> Dict[str, Any]:
        """wait_seconds, busy_seconds, calls, input_bound."""
    @property
    def fingerprint(self) -> str: ...
    @property
    def num_chunks(self) -> int:
        """Model chunks per pipeline stage (VPP); 1 without."""
    @property
    def memory_kind(self) -> str:
        """"cuda" or "host"."""

def attach(socket_path: str, job: str, global_rank: int, fingerprint: str, auth_token: str,
           start_step: int, start_microbatch: int, start_sample: Optional[int], elastic: bool,
           slots: int, slot_bytes: int, placement: str, cuda_device: int, ucx_transports: str,
           attach_timeout: float, reconnect_timeout: float, daemon_address: str = "",
           tls_ca: str = "", tls_cert: str = "", tls_key: str = "",
           admin_token: str = "") -> Client: ...

class Producer:
    def put(self, step: int, fields: List[str],
            samples: List[Tuple[int, int, Any, List[Any]]], wait_seconds: float) -> Dict[str, int]:
        """samples: (group, tag, int64 tokens, field buffers in `fields` order)."""
    def seal(self, step: int) -> Dict[str, Any]:
        """samples, groups, peers_behind."""
    def status(self) -> Dict[str, Any]: ...
    @property
    def arena_bytes(self) -> int: ...
    @property
    def arena_bytes_written(self) -> int: ...

def producer(socket_path: str, stream: str, auth_token: str) -> Producer: ...
