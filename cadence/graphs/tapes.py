"""Eager steps replayed from launch tapes (``runtime/launch_tape.py``): where no CUDA graph runs
a step, a key's first pass runs as it is (it compiles and plans), a later one is recorded, and
every pass after that replays the tape: one C call per Triton kernel, one op call per matrix
product, none of the forward's Python.

A ``TorchDispatchMode`` watches the recorded pass's torch ops: allocations and views are
allowed; the matrix products (``aten.linear``, ``mm``, ``addmm``: cuBLAS) go on the tape as
calls of their ``out=`` overloads into the tensors they produced; any other op refuses the
recording. A refused pass's result is used as it is and the key is tried again, up to
``RECORD_ATTEMPTS`` times, then runs as it is for good (``refused`` keeps the reason).

Memory the recorded pass allocates comes from one pool the tapes own (``torch.cuda.MemPool``,
as CUDA graphs have theirs): its blocks are reused by later recordings, never by other
allocations, so the addresses a tape holds stay valid while the tapes live. A tape keeps alive
the buffers from outside that pool (weights, caches, the step's input buffers); a matrix
product on the tape reaches the pool's tensors through aliases that own nothing, so their
blocks are reused as in the recorded pass. A replay returns the recorded pass's output (the
same tensors each time, rewritten), on the stream the pass was recorded on.

Hazard: the key must hold every host decision of the pass (shapes, grids, scalars): a replay
repeats the recorded launches whatever values the inputs hold.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

from cadence.runtime.launch_tape import LaunchTape, TapeRecorder, recording

logger = logging.getLogger(__name__)

T = TypeVar("T")
RECORD_ATTEMPTS = 3  # a refusal can be passing (a kernel specialized anew on that pass)

_aten = torch.ops.aten
_ALLOCATIONS = frozenset({
    _aten.empty.memory_format, _aten.empty_strided.default, _aten.empty_like.default,
    _aten.new_empty.default, _aten.new_empty_strided.default,
})
_VIEWS = frozenset({_aten._unsafe_view.default})  # views that their schema does not mark
# Ops a tape replays through their ``out=`` overload (cuBLAS's matrix products; the batched
# one with float32 outputs is model/split_k.py's).
_REPLAYED = {_aten.linear.default: _aten.linear.out, _aten.mm.default: _aten.mm.out,
             _aten.addmm.default: _aten.addmm.out, _aten.bmm.dtype: _aten.bmm.dtype_out}


class _TorchOp:
    """A matrix product on a tape: its ``out=`` overload into the tensor it produced."""

    def __init__(self, op: Any, args: tuple, kwargs: dict, out: torch.Tensor) -> None:
        self.op, self.args, self.kwargs, self.out = op, args, kwargs, out

    def launch(self, stream: Any) -> None:  # torch's current stream: checked by the replay
        self.op(*self.args, **self.kwargs, out=self.out)

    def unown(self, allocated: set[int]) -> None:
        """Reach the recorded pass's own tensors through aliases that keep nothing alive."""
        self.args, self.kwargs, self.out = tree_map(lambda v: _alias(v, allocated),
                                                    (self.args, self.kwargs, self.out))


class _Memory:
    """Device memory as ``__cuda_array_interface__`` bytes, owned by someone else."""

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                         "data": (ptr, False), "version": 3, "strides": None}


def _alias(value: Any, allocated: set[int]) -> Any:
    """``value``, or for a CUDA tensor of the pass's own memory one that aliases it and owns
    nothing (the pool keeps the memory; the recorded pass's reuse of it stays as it was)."""
    if (not isinstance(value, torch.Tensor) or not value.is_cuda or value.numel() == 0
            or value.untyped_storage().data_ptr() not in allocated):
        return value
    span = 1 + sum((n - 1) * s for n, s in zip(value.shape, value.stride(), strict=True))
    raw = torch.as_tensor(_Memory(value.data_ptr(), span * value.element_size()),
                          device=value.device)
    return raw.view(value.dtype).as_strided(value.shape, value.stride())


class _TorchOpGuard(TorchDispatchMode):
    """Puts the matrix products of a recorded pass on its tape, refuses it at the first other
    torch op that is not an allocation or a view (its kernel would not be on the tape), and
    notes the storage of every allocation."""

    def __init__(self, recorder: TapeRecorder) -> None:
        super().__init__()
        self.recorder = recorder
        self.allocated: set[int] = set()  # storage addresses allocated during the pass

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in _ALLOCATIONS:
            self.allocated.add(out.untyped_storage().data_ptr())
        elif func in _REPLAYED:
            stream = (torch._C._cuda_getCurrentRawStream(out.get_device()) if out.is_cuda
                      else 0)
            self.allocated.add(out.untyped_storage().data_ptr())
            self.recorder.add(_TorchOp(_REPLAYED[func], args, dict(kwargs), out), stream)
        elif func.is_view or func in _VIEWS:
            # Under inference mode composites such as ``contiguous`` or ``reshape`` arrive
            # whole and marked as views, yet copy where a view cannot do.
            if not _shares_storage(out, args, kwargs):
                self.recorder.refuse(f"torch op {func} copied during the recording")
        elif not _no_tensors(args, kwargs, out):
            self.recorder.refuse(f"torch op {func} ran during the recording")
        return out


def _shares_storage(out: Any, args: Any, kwargs: Any) -> bool:
    """Whether every tensor ``out`` holds is a view of one of the inputs' storages."""
    inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs))
              if isinstance(t, torch.Tensor)}
    return all(t.untyped_storage().data_ptr() in inputs for t in tree_leaves(out)
               if isinstance(t, torch.Tensor))


def _no_tensors(*trees: Any) -> bool:
    """Whether an op neither takes nor gives a tensor (``aten.promote_types``: arithmetic on
    dtypes and sizes, nothing for a device to do)."""
    return not any(isinstance(leaf, torch.Tensor) for leaf in tree_leaves(trees))


def outside_buffers(values: Sequence[Sequence[Any]], allocated: set[int]) -> list[torch.Tensor]:
    """The tensors among recorded launch values whose memory the pass did not allocate, once
    each: what a tape must keep alive."""
    keep: dict[int, torch.Tensor] = {}
    for launch_values in values:
        for value in launch_values:
            if (isinstance(value, torch.Tensor)
                    and value.untyped_storage().data_ptr() not in allocated):
                keep[id(value)] = value
    return list(keep.values())


@dataclass
class _Tape:
    launches: LaunchTape
    output: Any


class TapedSteps:
    """Launch tapes of eager passes by key, with the pool their memory comes from.

    Memory: the pool holds the largest recorded pass's live intermediates and every tape's
    output, about what CUDA graphs of the same keys would hold in theirs (tapes run where no
    graph does). NOTE: later recordings reuse a tape's freed blocks, even for their outputs,
    so a step's output must be consumed (on the stream) before the next pass, as a graph's."""

    def __init__(self, device: torch.device, max_tapes: int = 256) -> None:
        self.device = device
        self.max_tapes = max_tapes
        self._tapes: dict[Hashable, _Tape] = {}
        self._runs: dict[Hashable, int] = {}  # passes run as they are, per key without a tape
        self.refused: dict[Hashable, str] = {}  # the last reason per key not (yet) on tape
        # Set when no pool can be made: no key is recorded then. (A model that no key can
        # tape, as under tensor parallelism, pays RECORD_ATTEMPTS watched passes per key once.)
        self.disabled: str | None = None
        self._pool: Any = None
        self._index = device.index  # the CUDA device's index, once known
        self.replays = 0

    def __len__(self) -> int:
        return len(self._tapes)

    def tape(self, key: Hashable) -> LaunchTape | None:
        found = self._tapes.get(key)
        return None if found is None else found.launches

    def wants(self, key: Hashable) -> bool:
        """Whether ``key``'s passes go through ``run``: not once it runs as it is for good (the
        caller may then shape its pass for running as it is)."""
        if key in self._tapes:
            return True
        return (self.disabled is None and self._runs.get(key, 0) <= RECORD_ATTEMPTS
                and len(self._tapes) < self.max_tapes)

    def run(self, key: Hashable, step: Callable[[], T]) -> T:
        """``step()``: replayed from ``key``'s tape once there is one."""
        found = self._tapes.get(key)
        if found is not None:
            if not self._on_stream(found.launches.stream):
                return step()  # another stream than the recorded one: as it is
            found.launches.replay()
            self.replays += 1
            return found.output
        runs = self._runs.get(key, 0)
        record = runs > 0 and self.wants(key)  # the first pass compiles and plans: not yet
        self._runs[key] = runs + 1
        return self._record(key, step) if record else step()

    def _record(self, key: Hashable, step: Callable[[], T]) -> T:
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(self._allocations())
            except Exception as exc:  # e.g. an allocator backend without private pools
                self.disabled = f"no memory pool for the tapes: {exc}"
                logger.warning("Eager steps run without launch tapes: %s", self.disabled)
                return step()
            recorder = stack.enter_context(recording())
            guard = stack.enter_context(_TorchOpGuard(recorder))
            output = step()
        if recorder.refused is None and not recorder.launches:
            recorder.refuse("the pass launched no kernel")
        if recorder.refused is not None:
            self._refuse(key, recorder.refused)
            return output
        if self._pool is None:  # no pool holds the pass's memory: the tape holds all of it
            keep = [v for values in recorder.values for v in values]
        else:
            keep = outside_buffers(recorder.values, guard.allocated)
            for launch in recorder.launches:
                if isinstance(launch, _TorchOp):
                    launch.unown(guard.allocated)
        self._tapes[key] = _Tape(LaunchTape(recorder, keep), output)
        self.refused.pop(key, None)
        self._runs.pop(key, None)
        return output

    def _refuse(self, key: Hashable, why: str) -> None:
        self.refused[key] = why
        logger.debug("No launch tape for %r: %s", key, why)

    def _on_stream(self, stream: int) -> bool:
        if self.device.type != "cuda":
            return True
        if self._index is None:  # resolved once: this runs before every replay
            self._index = torch.cuda.current_device()
        return torch._C._cuda_getCurrentRawStream(self._index) == stream

    def _allocations(self) -> contextlib.AbstractContextManager[Any]:
        """Where the recorded pass allocates: the tapes' pool on CUDA."""
        if self.device.type != "cuda":
            return contextlib.nullcontext()
        if self._pool is None:
            self._pool = torch.cuda.MemPool()
        return torch.cuda.use_mem_pool(self._pool, self.device.index)  # None: the current one

    def close(self) -> None:
        self._tapes.clear()
        self._runs.clear()
        self._pool = None
