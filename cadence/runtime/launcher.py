"""Kernels bound once to their arguments, then launched with one ``cuLaunchKernel`` each.

``bind(kernel, grid, block, args)`` takes a Numba ``@cuda.jit`` kernel, a Triton ``@triton.jit``
kernel (``block`` is then ``num_warps``; constexprs by keyword) or a function handle from
``Module.function``; it compiles for the arguments' types, packs the parameters once
(``kernel_params``) and returns a ``BoundKernel`` whose ``launch(stream)`` is a single driver
call: no per-launch typing, marshalling or allocation. The kernel reads the bound memory at
every launch, so a launch (or a graph that captured one) sees the buffers' current contents.
A Triton kernel compiled for cooperative launches (``launch_cooperative_grid``) is bound to
``cuLaunchCooperativeKernel`` instead.

Hazard: the binding holds addresses, not ownership: the argument buffers must stay allocated
(and must not be re-allocated, e.g. by a resize) for as long as the binding is launched.

Under Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``) a Numba binding is a
``SimulatedKernel`` with the same ``launch``: the kernel runs on the host, synchronously.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Sequence
from typing import Any

from cadence.runtime._cudart import cudart, cudriver
from cadence.runtime.errors import check, raise_for_driver
from cadence.runtime.kernel_params import (
    LaunchUnsupported,
    PackedParams,
    numba_params,
    raw_params,
    triton_params,
)
from cadence.runtime.launch_tape import active_recorder

Dims = int | Sequence[int]


def _dims(d: Dims) -> tuple[int, int, int]:
    t = (d,) if isinstance(d, int) else tuple(int(x) for x in d)
    if not 1 <= len(t) <= 3 or min(t) < 0:
        raise ValueError(f"launch dimensions must be 1 to 3 non-negative ints, got {d!r}")
    return (t + (1, 1))[:3]  # type: ignore[return-value]


def _stream_int(stream: Any) -> int:
    if stream is None:
        return 0
    if isinstance(stream, int):
        return stream
    protocol = getattr(stream, "__cuda_stream__", None)
    if protocol is None:
        raise TypeError(f"a {type(stream).__name__} is not a CUDA stream (no __cuda_stream__)")
    version, handle = protocol()
    if version != 0:
        raise TypeError(f"unknown __cuda_stream__ protocol version {version}")
    return int(handle)


def _libcuda_function(name: str, pointers: int) -> Any:
    """libcuda's launch entry point ``name`` as a ctypes function: the function, grid and
    block (seven unsigned ints: shared memory last), then ``pointers`` pointers; None without
    it."""
    library = "nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1"
    try:
        fn = getattr(ctypes.CDLL(library), name)
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * pointers
    fn.restype = ctypes.c_int
    return fn


@functools.cache
def _libcuda_launch() -> Any:
    """libcuda's ``cuLaunchKernel`` as a ctypes function (one C call, none of the bindings'
    per-argument conversion: about half the host cost of a launch), or None without it."""
    return _libcuda_function("cuLaunchKernel", 3)  # stream, parameters, extra


@functools.cache
def _libcuda_cooperative_launch() -> Any:
    """libcuda's ``cuLaunchCooperativeKernel`` as a ctypes function (``cuLaunchKernel``'s
    parameters less the last, ``extra``), or None without it."""
    return _libcuda_function("cuLaunchCooperativeKernel", 2)  # stream, parameters


class BoundKernel:
    """A kernel with its launch shape and packed parameters; ``launch(stream)`` enqueues it.
    ``cooperative``: every launch is a cooperative one (``cuLaunchCooperativeKernel``: all of
    the grid's blocks resident at once, or the launch fails), for kernels whose blocks wait
    for each other."""

    def __init__(self, function: Any, grid: Dims, block: Dims, params: PackedParams,
                 shared_mem: int = 0, device_index: int | None = None,
                 keepalive: Sequence[Any] = (), cooperative: bool = False) -> None:
        drv = cudriver()
        self._drv = drv
        self.cooperative = cooperative
        self._entry = "cuLaunchCooperativeKernel" if cooperative else "cuLaunchKernel"
        self._cu_launch = getattr(drv, self._entry)
        # NOTE: the cooperative entry point takes no ``extra`` parameter after the parameters.
        self._cu_tail: tuple[Any, ...] = () if cooperative else (0,)
        self._c_tail: tuple[Any, ...] = () if cooperative else (None,)
        self._invalid_context = drv.CUresult.CUDA_ERROR_INVALID_CONTEXT
        self.function = drv.CUfunction(int(function))
        self.grid = _dims(grid)
        self.block = _dims(block)
        self.shared_mem = int(shared_mem)
        self.params = params
        self.device_index = (int(check(cudart().cudaGetDevice(), "cudaGetDevice"))
                             if device_index is None else device_index)
        self._keepalive = tuple(keepalive)
        self._empty = min(self.grid) == 0
        self._streams: dict[Any, Any] = {}  # stream object -> CUstream, made on first use
        # The C entry point when the bindings are cuda-python's own (tests stand in a recording
        # driver): the same driver, the same contexts, the same stream handles.
        c_launch = None
        if getattr(drv, "__name__", "") == "cuda.bindings.driver":
            c_launch = _libcuda_cooperative_launch() if cooperative else _libcuda_launch()
        self._c_launch = None if c_launch is None else functools.partial(
            c_launch, int(function))
        self._handles: dict[Any, int] = {}  # stream object -> raw handle, for the C entry point

    def _cu_stream(self, stream: Any) -> Any:
        cu = self._streams[stream] = self._drv.CUstream(_stream_int(stream))
        return cu

    def launch(self, stream: Any = None) -> None:
        """Enqueue the kernel on ``stream`` (a cadence stream, anything with
        ``__cuda_stream__``, an int handle, or None for the legacy default stream)."""
        if self._empty:
            return
        gx, gy, gz = self.grid
        self._launch(stream, gx, gy, gz)

    def launch_blocks(self, stream: Any, blocks: int) -> None:
        """``launch`` with a grid of ``blocks`` x 1 x 1 for this launch only: for kernels whose
        grid follows the size of their data (see ``bind_function`` for parameters that change
        between launches)."""
        if blocks > 0:
            self._launch(stream, blocks, 1, 1)

    def c_call(self, stream: Any) -> Any:
        """This launch on ``stream`` as a call of no arguments into libcuda that returns the
        driver's error code (0: launched), or None where there is no C entry point."""
        if self._c_launch is None or self._empty:
            return None
        bx, by, bz = self.block
        return functools.partial(self._c_launch, *self.grid, bx, by, bz, self.shared_mem,
                                 _stream_int(stream), self.params.address, *self._c_tail)

    def _launch(self, stream: Any, gx: int, gy: int, gz: int) -> None:
        recorder = active_recorder()
        if recorder is not None:  # its caller may change what it passes between launches
            recorder.refuse("a BoundKernel launched during a recording")
        if self._c_launch is not None:
            handle = self._handles.get(stream)
            if handle is None:
                handle = self._handles[stream] = _stream_int(stream)
            bx, by, bz = self.block
            err = self._c_launch(gx, gy, gz, bx, by, bz, self.shared_mem, handle,
                                 self.params.address, *self._c_tail)
            if err == 0:
                return
            if err != int(self._invalid_context):
                raise_for_driver(self._drv.CUresult(err), self._entry)
        cu = self._streams.get(stream)  # None (the legacy stream) is cached like any other
        if cu is None:
            cu = self._cu_stream(stream)
        bx, by, bz = self.block
        (err,) = self._cu_launch(self.function, gx, gy, gz, bx, by, bz, self.shared_mem, cu,
                                 self.params.address, *self._cu_tail)
        if err:
            if err != self._invalid_context:
                raise_for_driver(err, self._entry)
            # A thread that never touched the device has no current context: make the
            # device's primary context current (cudaSetDevice) and launch again.
            check(cudart().cudaSetDevice(self.device_index), "cudaSetDevice")
            (err,) = self._cu_launch(self.function, gx, gy, gz, bx, by, bz, self.shared_mem, cu,
                                     self.params.address, *self._cu_tail)
            if err:
                raise_for_driver(err, self._entry)

    __call__ = launch

    def __repr__(self) -> str:
        return (f"BoundKernel(grid={self.grid}, block={self.block}, params={len(self.params)}, "
                f"shared_mem={self.shared_mem})")


class SimulatedKernel:
    """A Numba kernel bound under the CUDA simulator: ``launch`` runs it on the host at once."""

    def __init__(self, dispatcher: Any, grid: Dims, block: Dims, args: Sequence[Any],
                 shared_mem: int = 0) -> None:
        self.grid = _dims(grid)
        self.block = _dims(block)
        self.shared_mem = shared_mem
        self._dispatcher = dispatcher
        self._args = tuple(args)

    def launch(self, stream: Any = None) -> None:
        # Configured per launch: the simulator's kernel[...] configures the kernel object itself.
        self._dispatcher[self.grid, self.block, 0, self.shared_mem](*self._args)

    __call__ = launch


def _numba_simulated(dispatcher: Any) -> bool:
    import numba

    return bool(numba.config.ENABLE_CUDASIM) or not hasattr(dispatcher, "typeof_pyval")


def bind_numba(dispatcher: Any, grid: Dims, block: Dims, args: Sequence[Any],
               shared_mem: int = 0) -> BoundKernel | SimulatedKernel:
    """Compile a ``numba.cuda.jit`` kernel for ``args`` (device arrays, tensors or anything
    with ``__cuda_array_interface__``, and scalars) and bind it to them."""
    if _numba_simulated(dispatcher):
        return SimulatedKernel(dispatcher, grid, block, args, shared_mem)
    from numba import cuda

    # Foreign device memory (tensors, runtime buffers) is typed as Numba types its own arrays.
    args = tuple(cuda.as_cuda_array(a) if hasattr(a, "__cuda_array_interface__")
                 and not hasattr(a, "_numba_type_") else a for a in args)
    argtypes = tuple(dispatcher.typeof_pyval(a) for a in args)
    kernel = dispatcher.compile(argtypes)
    options = getattr(dispatcher, "targetoptions", {})
    if (kernel.debug or kernel.cooperative or options.get("extensions")
            or getattr(kernel, "launch_config_sensitive", False)):
        raise LaunchUnsupported(
            "debug, cooperative, launch-config-sensitive kernels and kernels with argument "
            "extensions launch through Numba's own dispatcher"
        )
    handle = kernel._codelibrary.get_cufunc().handle
    params = PackedParams(numba_params(kernel.argument_types, args))
    return BoundKernel(handle, grid, block, params, shared_mem, keepalive=(kernel, *args))


def bind_triton(jit_fn: Any, grid: Dims, args: Sequence[Any], *, num_warps: int = 4,
                num_stages: int = 2, **constexprs: Any) -> BoundKernel:
    """Compile a ``triton.jit`` kernel for ``args`` (its non-constexpr parameters, in order)
    and ``constexprs`` (by name), and bind it to them."""
    grid3 = _dims(grid)
    compiled = jit_fn.warmup(*args, grid=grid3, num_warps=num_warps, num_stages=num_stages,
                             **constexprs)
    if hasattr(compiled, "result"):  # Triton's asynchronous compile mode hands back a future
        compiled = compiled.result()
    compiled._init_handles()  # loads the module: the function handle exists from here on
    names = list(compiled.src.signature)
    values = list(args) + [constexprs.get(name) for name in names[len(args):]]
    return bind_compiled_triton(compiled, grid3, values)


def bind_compiled_triton(compiled: Any, grid: Dims, values: Sequence[Any],
                         device_index: int | None = None,
                         keepalive: Sequence[Any] | None = None) -> BoundKernel:
    """Bind a compiled, loaded Triton kernel to ``values``: every parameter of its signature in
    order, constexprs included (ignored, as its own launcher ignores them). The binding keeps
    ``keepalive`` alive, by default the kernel and ``values``; a kernel compiled for
    cooperative launches is bound to cooperative launches. One compiled for programmatic
    dependent launches is bound to plain ones: its waits on the kernel before (``griddepcontrol``)
    then return at once, as that kernel has ended when it starts."""
    md = compiled.metadata
    if (getattr(md, "num_ctas", 1) != 1 or getattr(md, "global_scratch_size", 0)
            or getattr(md, "profile_scratch_size", 0)):
        raise LaunchUnsupported("kernels with clusters or scratch memory launch through Triton")
    scratch = sum(hasattr(md, a) for a in ("global_scratch_size", "profile_scratch_size"))
    params = PackedParams(triton_params(list(compiled.src.signature.values()), values, scratch))
    warp = 32
    return BoundKernel(compiled.function, grid, (warp * md.num_warps, 1, 1), params, md.shared,
                       device_index,
                       keepalive=(compiled, *values) if keepalive is None else keepalive,
                       cooperative=bool(getattr(md, "launch_cooperative_grid", False)))


def bind_function(function: Any, grid: Dims, block: Dims, args: Sequence[Any],
                  shared_mem: int = 0, device_index: int | None = None) -> BoundKernel:
    """Bind a ``CUfunction`` (e.g. ``Module.function(name)``) to ``args``: ctypes scalars as
    they are, memory (buffers, tensors, ``__cuda_array_interface__``) as ``void*``.

    A ctypes scalar is packed by reference: assigning its ``.value`` between launches changes
    what the later launches pass (a launch, or a capture, copies the values when it is made)."""
    return BoundKernel(function, grid, block, PackedParams(raw_params(args)), shared_mem,
                       device_index, keepalive=tuple(args))


def bind(kernel: Any, grid: Dims, block: Dims | None = None, args: Sequence[Any] = (),
         **options: Any) -> BoundKernel | SimulatedKernel:
    """The binder for ``kernel``'s kind (Numba, Triton, or a function handle): see above.
    For Triton, ``block`` is ignored (pass ``num_warps=``)."""
    if hasattr(kernel, "warmup") and hasattr(kernel, "fn"):
        return bind_triton(kernel, grid, args, **options)
    if hasattr(kernel, "py_func") or type(kernel).__name__ == "FakeCUDAKernel":
        if block is None:
            raise ValueError("a Numba kernel needs a block size")
        return bind_numba(kernel, grid, block, args, **options)
    if block is None:
        raise ValueError("a CUDA function needs a block size")
    return bind_function(kernel, grid, block, args, **options)
