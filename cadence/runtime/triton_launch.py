"""Cheap launches of Triton kernels: compile once per specialization, then call the compiled
kernel's C launcher directly.

Triton's ``kernel[grid](...)`` binds and specializes every argument in Python on every call
(tens of microseconds on the host). ``TritonLaunch`` computes a short key from what decides the
specialization (each tensor's dtype and 16-byte alignment, each integer's ``== 1`` and
``% 16 == 0`` classes, the constexprs and launch options); the first launch of a key goes
through Triton (which compiles), later ones pass the arguments straight to the compiled
launcher. Kernels that need global or profile scratch memory always take Triton's path.
Under Triton's interpreter (``TRITON_INTERPRET=1``) every launch takes Triton's path.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from cadence.runtime.launch_tape import TapeRecorder, active_recorder

_INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"


_PDL: dict[int, bool] = {}


def _triton_has_pdl() -> bool:
    try:
        from triton.language.extra.cuda import gdc_wait  # noqa: F401
    except ImportError:  # Triton before 3.4, or none
        return False
    return True


def pdl_enabled(device: Any) -> bool:
    """Whether kernels on ``device`` (a torch device) launch as programmatic dependent launches:
    CUDA with compute capability 9.0 or newer, a Triton that has the grid-dependency calls, not
    Triton's interpreter, and not ``CADENCE_DISABLE_PDL``. Such a kernel may start while the
    kernel before it on the stream is still running; it calls ``gdc_wait`` before it touches
    memory any earlier kernel writes or reads, and ``gdc_launch_dependents`` to let the next
    one start."""
    if _INTERPRETED or getattr(device, "type", None) != "cuda":
        return False
    import torch

    index = device.index if device.index is not None else torch.cuda.current_device()
    found = _PDL.get(index)
    if found is None:
        from cadence.envs import read_envs

        found = _PDL[index] = (not read_envs().disable_pdl and _triton_has_pdl()
                               and torch.cuda.get_device_capability(index)[0] >= 9)
    return found


def next_pow2(n: int, floor: int = 1) -> int:
    """The smallest power of two >= ``n`` and >= ``floor`` (Triton block sizes)."""
    return max(floor, 1 << max(0, n - 1).bit_length())


def _spec(arg: Any) -> Hashable:
    """One argument's specialization class (as ``_key`` computes it for each)."""
    return _key((arg,))[0]


def _key(args: Sequence[Any]) -> tuple[Hashable, ...]:
    """What Triton specializes each argument on: an int's ``== 1`` and ``% 16 == 0`` classes
    and whether it fits int32 (Triton types it i32 or i64 by its value; not a bool's: Triton
    does not specialize those), a tensor's dtype and 16-byte pointer alignment, the type of
    anything else. One loop: this runs on every launch."""
    out = []
    for arg in args:
        if type(arg) is int:
            out.append((arg == 1, not arg & 15, -0x80000000 <= arg <= 0x7FFFFFFF))
            continue
        ptr = getattr(arg, "data_ptr", None)
        out.append((arg.dtype, not ptr() & 15) if ptr is not None else type(arg))
    return tuple(out)


@dataclass(frozen=True)
class PreparedLaunch:
    """One specialization's compiled kernel, launched with no key and no argument inspection."""

    launch: Any  # the C launcher: (gx, gy, gz, stream, function, coop, pdl, gs, ps, *rest)
    function: int
    packed_metadata: Any
    cooperative: bool
    pdl: bool
    constexprs: tuple[Any, ...]
    current_stream: Callable[[int], int]  # device index -> the raw current stream
    compiled: Any  # Triton's compiled kernel (a launch tape binds it to packed parameters)

    def __call__(self, gx: int, gy: int, gz: int, device: int, args: Sequence[Any]) -> None:
        stream = self.current_stream(device)
        self.launch(
            gx, gy, gz, stream, self.function, self.cooperative, self.pdl,
            None, None, self.packed_metadata, None, None, None, *args, *self.constexprs,
        )  # fmt: skip
        recorder = active_recorder()
        if recorder is not None:
            record_launch(recorder, self.compiled, (gx, gy, gz), stream, device,
                          (*args, *self.constexprs))


def record_launch(recorder: TapeRecorder, compiled: Any, grid: tuple[int, int, int],
                  stream: int, device: int, values: Sequence[Any]) -> None:
    """Append a compiled Triton kernel's launch to ``recorder``, bound to ``values`` (all its
    parameters in order, constexprs included, as its C launcher takes them); refuse the
    recording where the launch cannot be bound."""
    if recorder.refused is not None:
        return
    from cadence.runtime.kernel_params import LaunchUnsupported
    from cadence.runtime.launcher import bind_compiled_triton

    try:
        kernel = bind_compiled_triton(compiled, grid, values, device, keepalive=(compiled,))
    except (LaunchUnsupported, ValueError, TypeError) as exc:  # e.g. a defaulted constexpr
        name = getattr(getattr(compiled, "metadata", None), "name", None) or "a Triton kernel"
        recorder.refuse(f"{name}: {exc}")
        return
    recorder.add(kernel, stream, values)


class TritonLaunch:
    """Launch ``kernel`` (a ``@triton.jit`` function whose constexpr parameters come last).
    ``cooperative``: every launch is a cooperative one (all programs resident at once, or the
    launch fails), for kernels whose programs wait for each other. A kernel with a ``PDL``
    constexpr gets it from each call's ``pdl``, so its waits are compiled in exactly where the
    launch is a programmatic dependent one."""

    def __init__(self, kernel: Any, cooperative: bool = False) -> None:
        self.kernel = kernel
        self._options = {"launch_cooperative_grid": True} if cooperative else {}
        self._pdl_param = "PDL" in getattr(kernel, "arg_names", ())
        self._compiled: dict[Hashable, PreparedLaunch | None] = {}
        self.fast_launches = 0

    def __call__(
        self,
        grid: Sequence[int],
        args: Sequence[Any],
        *,
        num_warps: int = 4,
        num_stages: int = 2,
        pdl: bool = False,
        **constexprs: Any,
    ) -> None:
        """``kernel[grid](*args, **constexprs, num_warps=..., num_stages=...)``, fast. ``pdl``:
        a programmatic dependent launch (the kernel may start before the one before it ends;
        it must wait for it, ``gdc_wait``, before it reads that kernel's outputs)."""
        if self._pdl_param:
            constexprs["PDL"] = pdl
        key = (_key(args), tuple(constexprs.items()), num_warps, num_stages, pdl)
        compiled = self._compiled.get(key)
        if compiled is None:
            recorder = active_recorder()
            if recorder is not None:  # Triton's own launch: nothing a tape can bind
                recorder.refuse(f"{getattr(self.kernel, '__name__', 'a Triton kernel')} "
                                "launched through Triton")
            options = {**self._options, "launch_pdl": True} if pdl else self._options
            ran = self.kernel[tuple(grid)](
                *args, **constexprs, num_warps=num_warps, num_stages=num_stages, **options
            )
            if not _INTERPRETED and key not in self._compiled:
                self._compiled[key] = _bind(ran, constexprs)
            return
        gy = grid[1] if len(grid) > 1 else 1
        gz = grid[2] if len(grid) > 2 else 1
        device = next(a for a in args if hasattr(a, "get_device")).get_device()
        compiled(grid[0], gy, gz, device, args)
        self.fast_launches += 1

    def prepared(
        self, args: Sequence[Any], *, num_warps: int = 4, num_stages: int = 2, pdl: bool = False,
        **constexprs: Any,
    ) -> PreparedLaunch | None:
        """The compiled launch of ``args``' specialization, for a caller that keeps it per call
        site (after one launch of that specialization has compiled it) and itself makes sure
        that later arguments specialize alike; None where launches take Triton's path."""
        if self._pdl_param:
            constexprs["PDL"] = pdl
        return self._compiled.get(
            (_key(args), tuple(constexprs.items()), num_warps, num_stages, pdl))


def _bind(ran: Any, constexprs: dict[str, Any]) -> PreparedLaunch | None:
    """The compiled kernel's launcher, or None when it must keep going through Triton."""
    import torch

    try:
        runner = ran.run
        launch = runner.launch
        if runner.global_scratch_size or runner.profile_scratch_size or runner.num_ctas != 1:
            return None
        return PreparedLaunch(launch, ran.function, ran.packed_metadata,
                         runner.launch_cooperative_grid, runner.launch_pdl,
                         tuple(constexprs.values()), torch._C._cuda_getCurrentRawStream, ran)
    except AttributeError:  # another Triton version or backend: its own path is always right
        return None
