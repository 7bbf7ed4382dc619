"""One-shot all-reduce over peer-mapped buffers: the small all-reduces of tensor parallelism
(a decode step's, one per row-parallel layer) as a single kernel instead of NCCL's.

Each rank ``cudaMalloc``s one buffer (flags, call counters, two staging halves), exports it as a
CUDA IPC handle, and maps every peer's; the handles travel over a gloo group made for them. A
call launches one kernel on torch's current stream (so CUDA graphs capture it): the kernel
copies this rank's tensor into its staging half, raises a flag in every peer's buffer, waits
for every peer's flag, then sums the ranks' staging halves in rank order into the tensor (see
``custom_all_reduce_kernel`` for the protocol and its invariants).

Every rank must make the same calls in the same order, as for any collective: the choice
between this kernel and NCCL (``should_use``) depends only on a tensor's size, dtype and
layout, never on its address, so that it is the same on every rank. Set-up is collective too,
and so is its outcome: where any rank cannot (another host, no peer access, no NVRTC), every
rank goes on with NCCL. Nothing here uses NVLink multicast.
"""

from __future__ import annotations

import ctypes
import logging
import socket
from datetime import timedelta
from typing import Any

import torch

from cadence.model.custom_all_reduce_kernel import (
    KERNELS,
    MAX_BLOCKS,
    MAX_RANKS,
    SOURCE,
    STAGE_OFFSET,
    TABLE_OFFSET,
    THREADS,
    VECTOR_BYTES,
)

logger = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 512 * 1024
DEFAULT_MAX_BLOCKS = 36
DEFAULT_TIMEOUT_S = 600.0  # NCCL's default collective timeout
_CLOSE_BARRIER_S = 5.0

_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def unavailable_reason(device_type: str, world: int, disabled: bool) -> str | None:
    """Why the custom all-reduce is not set up for ``world`` ranks on ``device_type`` (None: try
    it). Every input is the same on every rank."""
    if disabled:
        return "disabled by CADENCE_DISABLE_CUSTOM_ALL_REDUCE"
    if device_type != "cuda":
        return f"not on CUDA ({device_type})"
    if not 2 <= world <= MAX_RANKS:
        return f"{world} ranks (it takes 2 to {MAX_RANKS})"
    return None


def eligible(nbytes: int, dtype: torch.dtype, contiguous: bool, max_bytes: int) -> bool:
    """Whether an all-reduce of a tensor of this kind takes the custom kernel."""
    return (contiguous and dtype in _DTYPES and 0 < nbytes <= max_bytes
            and nbytes % VECTOR_BYTES == 0)


def grid_blocks(nvec: int, max_blocks: int) -> int:
    """Blocks of a call over ``nvec`` 16-byte vectors: one vector per thread, up to a cap."""
    return max(1, min(max_blocks, -(-nvec // THREADS)))


def buffer_bytes(max_bytes: int) -> tuple[int, int]:
    """(staging half, whole buffer) in bytes for messages up to ``max_bytes``."""
    half = -(-max_bytes // 256) * 256
    return half, STAGE_OFFSET + 2 * half


class CustomAllReduceUnavailable(RuntimeError):
    """Set-up failed on some rank; every rank raises it (and falls back to NCCL)."""


class CustomAllReduce:
    """The one-shot all-reduce of this rank. Make it with ``create`` on every rank."""

    def __init__(self, device_index: int, group: Any, *, max_bytes: int = DEFAULT_MAX_BYTES,
                 max_blocks: int = DEFAULT_MAX_BLOCKS,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        import torch.distributed as dist

        if not 1 <= max_blocks <= MAX_BLOCKS:
            raise ValueError(f"max_blocks must be 1 to {MAX_BLOCKS}, got {max_blocks}")
        if max_bytes < VECTOR_BYTES:
            raise ValueError(f"max_bytes must be at least {VECTOR_BYTES}, got {max_bytes}")
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        self.device_index = device_index
        self.device = torch.device("cuda", device_index)
        self.max_bytes = max_bytes
        self.max_blocks = max_blocks
        self.timeout_ns = int(timeout_s * 1e9)
        self.half_bytes, self.nbytes = buffer_bytes(max_bytes)
        self.launches = 0  # kernels launched from Python (a graph replay launches without it)
        self.closed = False
        self._buffer: Any = None
        self._module: Any = None
        self._imported: list[int] = []  # peers' buffers as mapped here
        self._kernels: dict[torch.dtype, Any] = {}
        # The kernels' arguments, shared by the three kernels and packed by reference: a call
        # sets x and nvec, then launches.
        self._own, self._x, self._nvec = ctypes.c_void_p(0), ctypes.c_void_p(0), ctypes.c_uint64(0)
        self._args = (self._own, self._x, self._nvec, ctypes.c_int32(self.rank),
                      ctypes.c_uint64(self.half_bytes), ctypes.c_uint64(self.timeout_ns))
        try:
            self._set_up()
        except CustomAllReduceUnavailable:
            self._unmap()  # every rank is here: free only once no rank maps this buffer
            self._free(self._barrier())
            raise
        except BaseException:
            self._unmap()
            self._free(True)
            raise

    @classmethod
    def create(cls, device_index: int, group: Any = None, **options: Any) -> CustomAllReduce | None:
        """Set up on every rank of the default process group (collective); None where some rank
        cannot (logged), and then on every rank. ``group``: a gloo group over the same ranks for
        the handshake (made here when None)."""
        import torch.distributed as dist

        if group is None:
            group = dist.new_group(backend="gloo")
        try:
            return cls(device_index, group, **options)
        except CustomAllReduceUnavailable as exc:
            logger.info("Custom all-reduce unavailable, NCCL does every all-reduce: %s", exc)
            return None

    # Set-up ----------------------------------------------------------------------------------
    def _agree(self, ok: bool, reason: str, payload: Any = None) -> list[Any]:
        """Every rank's payload once every rank is ok; else raise on every rank."""
        import torch.distributed as dist

        gathered: list[Any] = [None] * self.world
        dist.all_gather_object(gathered, (ok, reason, payload), group=self.group)
        failed = [f"rank {r}: {why}" for r, (good, why, _) in enumerate(gathered) if not good]
        if failed:
            raise CustomAllReduceUnavailable("; ".join(failed))
        return [p for _, _, p in gathered]

    def _set_up(self) -> None:
        from cadence.runtime import ipc

        mine: Any = None
        ok, reason = True, ""
        try:
            self._compile()
            self._buffer = self._allocate()
            mine = (socket.gethostname(), ipc.pci_bus_id(self.device_index),
                    ipc.ipc_handle(self._buffer.ptr, self.device_index))
        except Exception as exc:  # noqa: BLE001 - reported to every rank, then NCCL
            ok, reason = False, f"{type(exc).__name__}: {exc}"
        # Every rank zeroed its buffer before this: no flag lands in one not yet zeroed.
        peers = self._agree(ok, reason, (self.max_bytes, self.max_blocks, mine))
        if len({p[:2] for p in peers}) != 1:  # the same on every rank, so every rank raises
            raise CustomAllReduceUnavailable(
                f"the ranks' (max_bytes, max_blocks) differ: {[p[:2] for p in peers]}")
        peers = [p[2] for p in peers]

        ok, reason = True, ""
        bases = [0] * self.world
        try:
            bases = self._map_peers(peers)
        except Exception as exc:  # noqa: BLE001
            ok, reason = False, f"{type(exc).__name__}: {exc}"
        self._agree(ok, reason)

        table = b"".join(int(p).to_bytes(8, "little") for p in bases)
        ipc.write_device_memory(self._buffer.ptr + TABLE_OFFSET, table, self.device_index)
        logger.info("Custom all-reduce on %d ranks: one kernel for all-reduces up to %d KiB, "
                    "NCCL above.", self.world, self.max_bytes // 1024)

    def _compile(self) -> None:
        from cadence.runtime import Module, bind_function

        self._module = Module.from_source(SOURCE, "custom_all_reduce.cu",
                                          options=[f"-DCAR_WORLD={self.world}"],
                                          device_index=self.device_index)
        for dtype, name in _DTYPES.items():
            self._kernels[dtype] = bind_function(self._module.function(KERNELS[name]), grid=1,
                                                 block=THREADS, args=self._args,
                                                 device_index=self.device_index)

    def _allocate(self) -> Any:
        from cadence.runtime import ipc
        from cadence.runtime.buffers import DeviceBuffer

        buf = DeviceBuffer(self.nbytes, self.device_index)
        try:
            ipc.zero_device_memory(buf.ptr, self.nbytes, self.device_index)
        except BaseException:
            buf.close()
            raise
        self._own.value = buf.ptr
        return buf

    def _map_peers(self, peers: list[tuple[str, str, bytes]]) -> list[int]:
        from cadence.runtime import ipc

        host = peers[self.rank][0]
        bases: list[int] = []
        for r, (peer_host, bus_id, handle) in enumerate(peers):
            if r == self.rank:
                bases.append(self._buffer.ptr)
                continue
            if peer_host != host:
                raise CustomAllReduceUnavailable(f"rank {r} is on host {peer_host}, not {host}")
            index = ipc.device_by_pci_bus_id(bus_id)
            if index is None:
                raise CustomAllReduceUnavailable(f"rank {r}'s GPU {bus_id} is not visible here")
            if not ipc.can_access_peer(self.device_index, index):
                raise CustomAllReduceUnavailable(f"no peer access from GPU {self.device_index} "
                                                 f"to GPU {index} (rank {r})")
            ipc.enable_peer_access(self.device_index, index)
            ptr = ipc.open_ipc_handle(handle, self.device_index)
            self._imported.append(ptr)
            bases.append(ptr)
        return bases

    # Calls -----------------------------------------------------------------------------------
    def should_use(self, x: torch.Tensor) -> bool:
        """Whether ``all_reduce(x)`` runs here (the same answer on every rank for the same call);
        else NCCL's does."""
        return (not self.closed and x.device == self.device
                and eligible(x.numel() * x.element_size(), x.dtype, x.is_contiguous(),
                             self.max_bytes))

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` over the ranks in place (``should_use(x)`` must hold)."""
        if x.data_ptr() % VECTOR_BYTES:
            # A view at an odd offset (rare): reduce an aligned copy. The choice of path must not
            # depend on the address, which may differ between ranks.
            tmp = x.clone()
            self._launch(tmp)
            x.copy_(tmp)
            return x
        self._launch(x)
        return x

    def _launch(self, x: torch.Tensor) -> None:
        n = x.numel() * x.element_size() // VECTOR_BYTES
        self._x.value = x.data_ptr()
        self._nvec.value = n
        stream = torch.cuda.current_stream(self.device).cuda_stream
        self._kernels[x.dtype].launch_blocks(stream, grid_blocks(n, self.max_blocks))
        self.launches += 1

    # Close -----------------------------------------------------------------------------------
    def close(self) -> None:
        """Unmap the peers' buffers and free this rank's (collective: every rank closes). The
        buffer is freed only once every rank is past its last kernel and has unmapped it; where
        that cannot be known within seconds (a peer gone), the process's exit frees it."""
        if self.closed:
            return
        self.closed = True
        try:
            torch.cuda.synchronize(self.device)
        except Exception:  # noqa: BLE001 - a failed device: release what still can be
            logger.warning("Custom all-reduce: the device failed; closing anyway", exc_info=True)
        self._unmap()
        self._free(self._barrier())

    def _barrier(self) -> bool:
        import torch.distributed as dist

        try:
            dist.monitored_barrier(group=self.group, timeout=timedelta(seconds=_CLOSE_BARRIER_S))
            return True
        except Exception as exc:  # noqa: BLE001
            logger.warning("Custom all-reduce: no barrier at close (%s); the buffer stays until "
                           "the process exits", exc)
            return False

    def _unmap(self) -> None:
        from cadence.runtime import ipc

        for ptr in self._imported:
            try:
                ipc.close_ipc_handle(ptr, self.device_index)
            except Exception:  # noqa: BLE001
                logger.warning("Custom all-reduce: cudaIpcCloseMemHandle failed", exc_info=True)
        self._imported.clear()

    def _free(self, own_buffer: bool) -> None:
        self._kernels.clear()
        if self._buffer is not None and own_buffer:
            self._buffer.close()
            self._buffer = None
        if self._module is not None:
            self._module.close()
            self._module = None
