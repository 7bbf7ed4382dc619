"""Non-blocking CUDA streams (``cudaStreamCreateWithFlags``) that other libraries take as they are.

A ``Stream`` speaks the CUDA stream protocol (``__cuda_stream__`` -> ``(0, handle)``), so any
consumer of that protocol (cuda.core's ``launch`` and ``Device.create_stream``, cadence's own
kernel launcher) takes it directly; ``s.torch`` is torch's view of it, ``s.ptr`` the integer
handle for APIs that want one (``numba.cuda.external_stream``, ``cupy.cuda.ExternalStream``).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from cadence.runtime._cudart import cudart, on_device
from cadence.runtime.errors import check, raise_for
from cadence.runtime.event import Event
from cadence.runtime.views import copy_span

if TYPE_CHECKING:
    from cadence.runtime.graph import Graph
    from cadence.runtime.interfaces import EventLike, StreamLike


class Stream:
    """A non-blocking stream (it does not synchronize with the legacy default stream), made on
    device ``device_index`` whatever device the calling thread has selected.

    ``handle`` is the ``cudaStream_t`` for cuda-python calls, ``ptr`` its integer value.
    """

    def __init__(self, device_index: int = 0, priority: int | None = None) -> None:
        rt = cudart()
        self._rt = rt
        self.device_index = device_index
        self.priority = priority
        flags = rt.cudaStreamNonBlocking
        with on_device(device_index):
            if priority is None:
                self.handle = check(
                    rt.cudaStreamCreateWithFlags(flags), "cudaStreamCreateWithFlags"
                )
            else:
                self.handle = check(
                    rt.cudaStreamCreateWithPriority(flags, priority),
                    "cudaStreamCreateWithPriority",
                )
        self.ptr = int(self.handle)
        self._memcpy_default = rt.cudaMemcpyKind.cudaMemcpyDefault
        # Used by wait(stream): a stream-to-stream wait records this marker on the other stream.
        self._marker = Event(timing=False, device_index=device_index)
        self._torch: Any = None
        self._scope: tuple[Any, Any, tuple[int, int, int]] | None = None
        self.closed = False

    def __cuda_stream__(self) -> tuple[int, int]:
        """The CUDA stream protocol (version 0): ``(0, cudaStream_t as int)``."""
        return 0, self.ptr

    @property
    def torch(self) -> Any:
        """``torch.cuda.ExternalStream`` over this stream (created once)."""
        if self._torch is None:
            import torch

            self._torch = torch.cuda.ExternalStream(
                self.ptr, device=torch.device("cuda", self.device_index)
            )
        return self._torch

    def context(self) -> AbstractContextManager[Any]:
        """``with stream.context():`` makes torch issue its work on this stream (and restores
        the thread's current stream after). Same effect as ``torch.cuda.stream(s.torch)``, at a
        fraction of its host cost: the engine enters it every step, before the step's first
        kernel."""
        if self._scope is None:
            import torch

            ts = self.torch
            torch.cuda.init()  # the raw getters assume torch's CUDA state is set up
            self._scope = (torch, ts, (ts.stream_id, ts.device_index, ts.device_type))
        return _TorchStreamScope(*self._scope)

    def wait(self, other: EventLike | StreamLike) -> None:
        """Order this stream after an event, or after all work queued so far on another stream
        (device-side: the host does not block)."""
        if isinstance(other, Stream):
            self._marker.record(other)
            other = self._marker
        (err,) = self._rt.cudaStreamWaitEvent(self.handle, other.handle, 0)
        if err:
            raise_for(err, "cudaStreamWaitEvent")

    def record(self, event: EventLike | None = None) -> EventLike:
        """Record ``event`` (a new non-timing event if None: allocate those up front on hot paths)."""
        ev = event if event is not None else Event(timing=False, device_index=self.device_index)
        ev.record(self)
        return ev

    def copy(self, dst: Any, src: Any, nbytes: int | None = None) -> None:
        """Copy ``nbytes`` (default: all of ``src``) from ``src`` to ``dst``, asynchronously.

        Each side is a runtime buffer, a contiguous tensor or array, or an object with a
        contiguous ``__cuda_array_interface__``; a copy larger than either side raises.
        """
        self.copy_ptr_async(*copy_span(dst, src, nbytes))

    def copy_ptr_async(self, dst: int, src: int, nbytes: int) -> None:
        """``cudaMemcpyAsync`` of ``nbytes`` between two raw addresses (direction inferred);
        nothing is checked."""
        (err,) = self._rt.cudaMemcpyAsync(dst, src, nbytes, self._memcpy_default, self.handle)
        if err:
            raise_for(err, "cudaMemcpyAsync")

    def copy_2d_ptr_async(self, dst: int, dst_pitch: int, src: int, src_pitch: int, width: int,
                          height: int) -> None:
        """``cudaMemcpy2DAsync``: ``height`` rows of ``width`` bytes, rows ``src_pitch`` bytes
        apart in the source and ``dst_pitch`` in the destination (direction inferred), in one
        call; nothing is checked."""
        if width and height:
            (err,) = self._rt.cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, height,
                                                self._memcpy_default, self.handle)
            if err:
                raise_for(err, "cudaMemcpy2DAsync")

    def capture(self, pool: Any = None, mode: str = "thread_local") -> AbstractContextManager[Graph]:
        """``with stream.capture() as graph:`` records the block's work on this stream into a
        ``Graph`` (instantiated when the block ends); see ``cadence.runtime.graph``."""
        from cadence.runtime.graph import capture

        return capture(self, pool=pool, mode=mode)

    def query(self) -> bool:
        """True when all work queued on the stream has completed."""
        (err,) = self._rt.cudaStreamQuery(self.handle)
        if not err:
            return True
        if err == self._rt.cudaError_t.cudaErrorNotReady:
            return False
        raise_for(err, "cudaStreamQuery")
        return False  # unreachable

    def synchronize(self) -> None:
        (err,) = self._rt.cudaStreamSynchronize(self.handle)
        if err:
            raise_for(err, "cudaStreamSynchronize")

    def close(self) -> None:
        """Destroy the stream (pending work still completes). Torch views of it become invalid."""
        if self.closed:
            return
        self.closed = True
        self._torch = None
        self._marker.close()
        check(self._rt.cudaStreamDestroy(self.handle), "cudaStreamDestroy")

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Stream(ptr={self.ptr:#x}, device={self.device_index}, "
                f"priority={self.priority}, closed={self.closed})")


class _TorchStreamScope:
    """Makes a stream torch's current stream of its device for one ``with`` block, through
    torch's own setter (one call each way) instead of ``torch.cuda.stream``'s dozen Python
    calls. One per entry (so threads and nesting need no care). A thread whose current device
    is another one takes ``torch.cuda.stream``, which also switches devices."""

    __slots__ = ("_torch", "_stream", "_ids", "_prev")

    def __init__(self, torch: Any, stream: Any, ids: tuple[int, int, int]) -> None:
        self._torch = torch
        self._stream = stream
        self._ids = ids
        self._prev: Any = None

    def __enter__(self) -> None:
        c = self._torch._C
        device = self._ids[1]
        if c._cuda_getDevice() != device:
            self._prev = self._torch.cuda.stream(self._stream)
            self._prev.__enter__()
            return
        self._prev = c._cuda_getCurrentStream(device)
        c._cuda_setStream(*self._ids)

    def __exit__(self, *exc: object) -> None:
        prev = self._prev
        if isinstance(prev, tuple):
            self._torch._C._cuda_setStream(*prev)
        else:
            prev.__exit__(*exc)
