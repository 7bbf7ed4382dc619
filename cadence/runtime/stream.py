"""Non-blocking CUDA streams (``cudaStreamCreateWithFlags``) usable from cuda-python and torch."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from cadence.runtime._cudart import cudart
from cadence.runtime.errors import check, raise_for
from cadence.runtime.event import Event

if TYPE_CHECKING:
    from cadence.runtime.interfaces import EventLike, StreamLike


class Stream:
    """A non-blocking stream (it does not synchronize with the legacy default stream).

    ``handle`` is the ``cudaStream_t`` for cuda-python calls, ``ptr`` its integer value (for
    numba's ``external_stream`` and others), ``torch`` a ``torch.cuda.ExternalStream`` over it.
    """

    def __init__(self, device_index: int = 0, priority: int | None = None) -> None:
        rt = cudart()
        self._rt = rt
        self.device_index = device_index
        self.priority = priority
        flags = rt.cudaStreamNonBlocking
        if priority is None:
            self.handle = check(rt.cudaStreamCreateWithFlags(flags), "cudaStreamCreateWithFlags")
        else:
            self.handle = check(
                rt.cudaStreamCreateWithPriority(flags, priority), "cudaStreamCreateWithPriority"
            )
        self.ptr = int(self.handle)
        self._memcpy_default = rt.cudaMemcpyKind.cudaMemcpyDefault
        # Used by wait(stream): a stream-to-stream wait records this marker on the other stream.
        self._marker = Event(timing=False)
        self._torch: Any = None
        self.closed = False

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
        """``with stream.context():`` makes torch issue its work on this stream."""
        import torch

        return torch.cuda.stream(self.torch)

    def wait(self, other: EventLike | StreamLike) -> None:
        """Order this stream after an event, or after all work queued so far on another stream."""
        if isinstance(other, Stream):
            self._marker.record(other)
            self._marker.wait(self)
        else:
            other.wait(self)  # type: ignore[arg-type]

    def record(self, event: EventLike | None = None) -> EventLike:
        """Record ``event`` (a new non-timing event if None: allocate those up front on hot paths)."""
        ev = event if event is not None else Event(timing=False)
        ev.record(self)
        return ev

    def copy_async(self, dst: int, src: int, nbytes: int) -> None:
        """``cudaMemcpyAsync`` of ``nbytes`` between any two addresses (direction inferred)."""
        (err,) = self._rt.cudaMemcpyAsync(dst, src, nbytes, self._memcpy_default, self.handle)
        if err:
            raise_for(err, "cudaMemcpyAsync")

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
        return f"Stream(ptr={self.ptr:#x}, priority={self.priority}, closed={self.closed})"
