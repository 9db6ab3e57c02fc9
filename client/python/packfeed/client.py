"""The trainer's data iterator: one packfeed.Client per rank, attached to its
node's packfeedd, yields each microbatch as the dict Megatron-LM's
get_batch_on_this_rank_for_sequence_packing returns."""
from __future__ import annotations

import collections
import os
from typing import Any, Deque, Dict, Iterator, List, Optional, Tuple, Union

try:
    import torch
    import torch.utils.dlpack
except ImportError:  # a driver that only puts (packfeed.Producer) needs no torch
    torch = None  # type: ignore[assignment]

from . import _native, errors

# The daemon's default socket, as packfeedd and packfeedctl define it.
DEFAULT_SOCKET: str = _native.DEFAULT_SOCKET
# Seconds a client keeps re-attaching to a daemon that went away.
DEFAULT_RECONNECT_TIMEOUT: float = _native.DEFAULT_RECONNECT_TIMEOUT

# Megatron's keys, each present in every batch (None when this rank's pipeline
# stage does not receive it; attention_mask is always None in THD).
MEGATRON_KEYS = ("tokens", "labels", "loss_mask", "attention_mask", "position_ids",
                 "padding_mask", "cu_seqlens", "cu_seqlens_padded", "max_seqlen",
                 "local_cp_size")

# A batch before its fields are filled in (next_batches copies it).
_NO_FIELDS: Dict[str, Any] = dict.fromkeys(MEGATRON_KEYS)

STATE_VERSION = 1

# One microbatch: Megatron's keys (tensors, or None where this rank's stage
# receives no such field) and "packed_seq_params" (PackedSeqParams' arguments).
Batch = Dict[str, Any]
# What next_step() returns, as Megatron's wrap_data_iterator does:
# (microbatches, num_microbatches, seqlen_sum, seqlen_squared_sum).
Step = Tuple[Union["StepIterator", List["ChunkIterator"]], int, int, int]


def _env_int(*names: str, default: Optional[int]) -> Optional[int]:
    for name in names:
        value = os.environ.get(name)
        if value:
            return int(value)
    return default


class Client:
    """Attaches `rank` of `job` to the daemon and iterates its microbatches.

    Defaults from the environment (explicit arguments win):
      rank         RANK (torchrun), else SLURM_PROCID, else 0
      socket_path  PACKFEED_SOCKET, else DEFAULT_SOCKET (/run/packfeed/packfeedd.sock)
      address      PACKFEED_ADDRESS: a daemon on another node ("host:port", its
                   admin_tcp_address under ranks_over_tcp) instead of the socket
      job          PACKFEED_JOB
      auth_token   PACKFEED_TOKEN
      (and PACKFEED_ADMIN_TOKEN: over `address`, what a new process needs to
      start before where the rank stands, a restart from an older checkpoint)
      device       "cuda" means cuda:LOCAL_RANK (else SLURM_LOCALID, else 0)
    and WORLD_SIZE (else SLURM_NTASKS), when set, must exceed the rank.

    Tensors are zero-copy views of the ring slot, and the slot is the
    trainer's for as long as any tensor of the microbatch lives (views and
    slices included): the daemon reuses it only once they are all freed, in
    any order, so holding microbatches (1F1B keeps up to PP in flight) is
    safe. When the trainer holds slots - 1 microbatches, the next ones come
    as private copies, so the daemon keeps a slot to fill (ring() counts
    them). copy=True always hands out owned copies and frees the slot at once.
    start_sample: pretraining jobs, in place of start_step: Megatron's
    consumed sample count of the job's split (consumed_train_samples, or
    consumed_valid_samples for NAME.valid); serving starts at the step that
    begins there. InvalidArgumentError when it lies before the job's
    consumed_samples or inside a step, or the job is of another kind.
    elastic: with fingerprint and start_step (or state), accept a job whose
    topology or scheduler changed since (another DP size) as long as its data
    did not; start at a step boundary (docs/RELIABILITY.md).
    reconnect_timeout: seconds to keep re-attaching when the daemon goes away
    (killed, restarted, drained; default DEFAULT_RECONNECT_TIMEOUT = 60); the
    client then goes on from the first microbatch it had not taken,
    bit-identical, or raises UnavailableError once the time is up. 0 raises
    it at once.
    device: where tensors should end up. For a CUDA device each microbatch
    is copied from the (page-locked) host ring into device memory by the
    copy engine as soon as it arrives, before the trainer asks; its tensors
    are device tensors the current stream (at next()) waits for on the GPU,
    never on the trainer's thread, and the device buffer is reused once its
    tensors are freed and that stream is past its work of the microbatch
    (docs/TRANSPORT.md). Reading them on another stream: clone them there.
    device_ring: "staged" (the default: the client copies each slot from
    its page-locked host ring) or "daemon" (device memory the daemon
    copies each slot into, shared by file descriptor: no copy and no event
    on the trainer's side; opt-in: on an H200 it was no faster than
    "staged" at 1 MiB and up, docs/TRANSPORT.md). Where "daemon"
    cannot be had the staged ring serves and ring()["device_ring_fallback"],
    the log and the daemon's stats say why.

    address: a daemon on another node, for ranks on a node without one
    (auth_token required). The ring is then written over UCX's network
    transports; device_ring="daemon" asks for a UCX put into device memory,
    kept only where UCX does it with GPUDirect RDMA, else staged (and
    ring()["device_ring_fallback"] says why). tls: (ca, cert, key) PEM files
    when the daemon's TCP address is under admin_tls (cert and key only for
    mutual TLS: "" otherwise).

    Iterating a Client yields its steps, each what next_step() returns:
        for microbatches, num_microbatches, seqlen_sum, _ in client:
            for batch in microbatches: ...
    """

    def __init__(self, job: Optional[str] = None, *, rank: Optional[int] = None,
                 socket_path: Optional[str] = None, fingerprint: str = "",
                 auth_token: Optional[str] = None, start_step: int = 0,
                 start_sample: Optional[int] = None, slots: int = 4,
                 slot_bytes: int = 0, device: Optional[str | torch.device] = None,
                 copy: bool = False, device_ring: str = "staged", ucx_transports: str = "",
                 attach_timeout: float = 30.0,
                 reconnect_timeout: float = DEFAULT_RECONNECT_TIMEOUT,
                 state: Optional[Dict[str, Any]] = None, elastic: bool = False,
                 address: Optional[str] = None,
                 tls: Tuple[str, str, str] = ("", "", "")) -> None:
        if torch is None:
            raise ImportError("packfeed.Client yields torch tensors: install torch")
        self.job = job or os.environ.get("PACKFEED_JOB") or ""
        self.rank: int = rank if rank is not None else (
            _env_int("RANK", "SLURM_PROCID", default=0) or 0)
        world_size = _env_int("WORLD_SIZE", "SLURM_NTASKS", default=None)
        if world_size is not None and not 0 <= self.rank < world_size:
            raise ValueError(f"rank {self.rank} is outside WORLD_SIZE {world_size}")
        self.socket_path = socket_path or os.environ.get("PACKFEED_SOCKET") or DEFAULT_SOCKET
        self.address = address if address is not None else os.environ.get("PACKFEED_ADDRESS", "")
        self._tls = tls
        self._auth_token = auth_token if auth_token is not None else os.environ.get(
            "PACKFEED_TOKEN", "")
        self._copy = copy
        if device_ring not in ("staged", "daemon"):
            raise ValueError(f"device_ring {device_ring!r}: expected 'staged' or 'daemon'")
        self._device_ring = device_ring
        self._device = _resolve_device(device)
        self._slots, self._slot_bytes, self._ucx_transports = slots, slot_bytes, ucx_transports
        self._attach_timeout, self._reconnect_timeout = attach_timeout, reconnect_timeout
        self._native: Optional[_native.Client] = None
        self._last_step: Optional[Dict[str, int]] = None
        if state is not None:
            self.load_state_dict(state, elastic=elastic)
        else:
            self._attach(fingerprint, start_step, 0, elastic, start_sample)

    # --- iteration -------------------------------------------------------
    def __iter__(self) -> Iterator[Step]:
        """The steps, one next_step() each, until the daemon ends the job."""
        while True:
            yield self.next_step()

    def next_step(self, timeout: Optional[float] = None) -> Step:
        """Begins the next step; returns Megatron's wrap_data_iterator result:
        (iterator over the step's microbatches, num_microbatches, seqlen_sum,
        seqlen_squared_sum), the sums over padded lengths of the global batch
        (Megatron's FLOPs inputs). The real-length sums are in last_step.

        Raises (packfeed.errors), here or from the step's iterator:
        DeadlineExceededError when nothing arrived within `timeout` seconds
        (None: wait forever; the client stays usable), UnavailableError when
        the daemon went away for longer than reconnect_timeout,
        FailedPreconditionError when the previous step was not consumed or the
        daemon ended this rank (with its reason), DataLossError for a slot
        that arrived malformed (nothing of it handed out)."""
        info = self._live().next_step(timeout)
        self._last_step = info
        # A step resumed inside (load_state_dict of a mid-step state) yields
        # only the microbatches not yet consumed.
        count = info["num_microbatches"] - info["first_microbatch"]
        iterator: Any = StepIterator(self, count, timeout)
        if self.num_chunks > 1:
            step = _ChunkedStep(self, count, timeout)
            iterator = [ChunkIterator(step, chunk) for chunk in range(self.num_chunks)]
        return iterator, info["num_microbatches"], info["padded_sum"], info["padded_squared_sum"]

    @property
    def last_step(self) -> Optional[Dict[str, int]]:
        """The last next_step's figures: step, num_microbatches,
        first_microbatch (> 0 for a step resumed inside), padded_sum,
        padded_squared_sum, real_sum, real_squared_sum."""
        return self._last_step

    def ring(self) -> Dict[str, Any]:
        """How this rank uses its ring since attach: ``slots``, ``held``
        (slots held now by microbatches with a tensor alive), ``handed_out``,
        ``copied_out``, those handed out as private copies because the
        trainer held every slot but one, and ``device_ring_fallback``: why
        device_ring="daemon" was asked for and the staged ring serves
        instead ("" otherwise)."""
        return self._live().ring()

    def times(self) -> Dict[str, Any]:
        """Where this rank's training loop spent its time since attach
        (re-attaches included): ``wait_seconds`` blocked in
        next_step()/next() waiting for data, ``busy_seconds`` between one
        call's return and the next (the training itself), ``calls``, and
        ``input_bound``, the share of the time spent waiting. The daemon
        gets the same figures about once a second and at close (packfeedctl
        stats, Prometheus); a restarted daemon, those since the rank
        re-attached to it."""
        return self._live().times()

    # --- checkpoints -----------------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        """Where this rank stands; load_state_dict (or Client(state=...)) on a
        new client reproduces exactly the batches that follow."""
        state = self._live().state()
        return {"version": STATE_VERSION, "job": state["job"], "rank": self.rank,
                "fingerprint": state["fingerprint"], "next_step": state["next_step"],
                "next_microbatch": state["next_microbatch"]}

    def load_state_dict(self, state: Dict[str, Any], elastic: bool = False) -> None:
        """Re-attaches from `state`: serving resumes at state's next_step (and,
        for a state taken inside a step, its next_microbatch), and a daemon
        whose job changed (another fingerprint) is refused. elastic=True
        accepts a job whose topology or scheduler changed (another DP size)
        as long as its data did not: the state must be at a step boundary
        (docs/RELIABILITY.md)."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"packfeed state version {state.get('version')}; "
                             f"this client reads {STATE_VERSION}")
        if self.job and state["job"] != self.job:
            raise ValueError(f"state is for job {state['job']!r}, this client's is {self.job!r}")
        if state["rank"] != self.rank:
            raise ValueError(f"state is for rank {state['rank']}, this client is rank {self.rank}")
        self.job = state["job"]
        self.close()
        self._attach(state["fingerprint"], state["next_step"], state.get("next_microbatch", 0),
                     elastic)

    # --- lifetime --------------------------------------------------------
    @property
    def fingerprint(self) -> str:
        return self._live().fingerprint

    @property
    def num_chunks(self) -> int:
        """Model chunks per pipeline stage: the job's VPP size, 1 without.
        With more than one, next_step() returns one iterator per chunk in
        place of the step's iterator (Megatron's interleaved schedule takes
        a list of data iterators), each yielding every microbatch of the
        step with that chunk's fields."""
        return self._live().num_chunks

    @property
    def ring_memory(self) -> str:
        """"cuda" when the ring (and so every view) is in device memory, else "host"."""
        return self._live().memory_kind

    def close(self) -> None:
        """Detaches. Views handed out stay readable but are no longer served."""
        if self._native is not None:
            native, self._native = self._native, None
            try:
                native.detach()
            except errors.UnavailableError:
                pass  # the daemon is gone: nothing to detach from

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- internals -------------------------------------------------------
    def _attach(self, fingerprint: str, start_step: int, start_microbatch: int = 0,
                elastic: bool = False, start_sample: Optional[int] = None) -> None:
        cuda_device = (self._device.index or 0) if (
            self._device is not None and self._device.type == "cuda") else None
        self._native = _native.attach(
            socket_path=self.socket_path, job=self.job, global_rank=self.rank,
            fingerprint=fingerprint, auth_token=self._auth_token, start_step=start_step,
            start_microbatch=start_microbatch, start_sample=start_sample, elastic=elastic,
            placement="host" if cuda_device is None else self._device_ring,
            cuda_device=cuda_device or 0, slots=self._slots, slot_bytes=self._slot_bytes,
            ucx_transports=self._ucx_transports, attach_timeout=self._attach_timeout,
            reconnect_timeout=self._reconnect_timeout, daemon_address=self.address,
            tls_ca=self._tls[0], tls_cert=self._tls[1], tls_key=self._tls[2],
            admin_token=os.environ.get("PACKFEED_ADMIN_TOKEN", ""))

    def _live(self) -> _native.Client:
        if self._native is None:
            raise RuntimeError("packfeed client is closed")
        return self._native

    def _stream(self) -> int:
        """The cudaStream_t that reads the next microbatch (0: none)."""
        if self._device is None:
            return 0
        return int(torch.cuda.current_stream(self._device).cuda_stream)

    def _next_batch(self, timeout: Optional[float]) -> Batch:
        return self._live().next_batches(timeout, self._stream(), _NO_FIELDS, self._copy, 1)[0]

    def _next_chunks(self, timeout: Optional[float]) -> List[Batch]:
        """One microbatch as each model chunk's iterator gets it (VPP):
        fields named NAME@K go to chunk K only, under NAME. Always owned
        copies (the chunks' iterators consume at their own pace), so the
        slot is freed at once."""
        return self._live().next_batches(timeout, self._stream(), _NO_FIELDS, True,
                                         self.num_chunks)


class _ChunkedStep:
    """One step's microbatches for every model chunk: each microbatch is
    taken from the ring when the first chunk asks for it and kept until
    every chunk has had it (Megatron's interleaved schedule runs chunk 0
    ahead of the others)."""

    def __init__(self, client: Client, count: int, timeout: Optional[float]) -> None:
        self._client, self._count, self._timeout = client, count, timeout
        self._taken = 0
        self._pending: List[Deque[Batch]] = [collections.deque()
                                             for _ in range(client.num_chunks)]

    def take(self, chunk: int) -> Batch:
        if not self._pending[chunk]:
            if self._taken == self._count:
                raise StopIteration
            for k, batch in enumerate(self._client._next_chunks(self._timeout)):
                self._pending[k].append(batch)
            self._taken += 1
        return self._pending[chunk].popleft()

    def left(self, chunk: int) -> int:
        return self._count - self._taken + len(self._pending[chunk])


class ChunkIterator:
    """The microbatches of one step as model chunk `chunk` sees them."""

    def __init__(self, step: _ChunkedStep, chunk: int) -> None:
        self._step, self._chunk = step, chunk

    def __iter__(self) -> "ChunkIterator":
        return self

    def __len__(self) -> int:
        return self._step.left(self._chunk)

    def __next__(self) -> Batch:
        return self._step.take(self._chunk)


class StepIterator:
    """The microbatches of one step."""

    def __init__(self, client: Client, count: int, timeout: Optional[float]) -> None:
        self._client, self._count, self._timeout, self._taken = client, count, timeout, 0

    def __iter__(self) -> "StepIterator":
        return self

    def __len__(self) -> int:
        return self._count - self._taken

    def __next__(self) -> Batch:
        if self._taken == self._count:
            raise StopIteration
        batch = self._client._next_batch(self._timeout)
        self._taken += 1
        return batch


def _resolve_device(device: Optional[str | torch.device]) -> Optional[torch.device]:
    if device is None:
        return None
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", _env_int("LOCAL_RANK", "SLURM_LOCALID", default=0))
    return None if device.type == "cpu" else device
