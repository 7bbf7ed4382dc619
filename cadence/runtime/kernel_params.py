"""Kernel parameters packed for ``cuLaunchKernel``: one ctypes value per parameter and the
``void*[]`` array that points at them, built once when a kernel is bound to its arguments.

The layouts follow what each compiler's own launcher passes:

- Numba: an array argument of ``ndim`` dimensions is ``5 + 2 * ndim`` parameters (meminfo,
  parent, nitems, itemsize, data, shape..., strides..., all pointer-sized); scalars by their
  Numba type (``numba.cuda``'s ``_Kernel._prepare_args``).
- Triton: every parameter that is not a ``constexpr`` of the compiled signature, pointers as
  64-bit addresses, then the global and profile scratch pointers (NULL: kernels that need
  scratch memory are refused) (``triton/backends/nvidia/driver.py``).
- A function from a cubin, PTX or NVRTC: ctypes values as given, memory as ``void*``.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np


class LaunchUnsupported(TypeError):
    """The kernel or one of its arguments cannot go through the packed launch."""


class PackedParams:
    """The parameter values (kept alive here) and the ``void*`` array pointing at them."""

    def __init__(self, values: Iterable[Any]) -> None:
        self.values: list[Any] = list(values)
        n = len(self.values)
        self._array = (ctypes.c_void_p * max(1, n))(*(ctypes.addressof(v) for v in self.values))
        self.address = ctypes.addressof(self._array) if n else 0

    def __len__(self) -> int:
        return len(self.values)

    def as_bytes(self) -> list[bytes]:
        """Each parameter's bytes as the kernel receives them."""
        return [bytes(v) for v in self.values]


def device_pointer(obj: Any) -> int:
    """The device address of a runtime buffer, a tensor, or a ``__cuda_array_interface__``."""
    if obj is None:
        return 0
    if isinstance(obj, int):
        return obj
    ptr = getattr(obj, "ptr", None)
    if isinstance(ptr, int):
        return ptr
    data_ptr = getattr(obj, "data_ptr", None)
    if data_ptr is not None:
        return int(data_ptr())
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is None:
        raise LaunchUnsupported(f"a {type(obj).__name__} is not device memory")
    return int(cai["data"][0])


def _array_fields(obj: Any) -> tuple[int, tuple[int, ...], tuple[int, ...], int]:
    """(address, shape, byte strides, itemsize) of an array argument."""
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        itemsize = np.dtype(cai["typestr"]).itemsize
        shape = tuple(int(s) for s in cai["shape"])
        strides = cai.get("strides")
        if strides is None:
            strides = _c_strides(shape, itemsize)
        return int(cai["data"][0]), shape, tuple(int(s) for s in strides), itemsize
    if isinstance(obj, np.ndarray):  # host memory: only for tests of the layout
        return int(obj.ctypes.data), obj.shape, obj.strides, obj.itemsize
    raise LaunchUnsupported(f"a {type(obj).__name__} is not an array Numba can take")


def _c_strides(shape: Sequence[int], itemsize: int) -> tuple[int, ...]:
    strides, step = [], itemsize
    for s in reversed(shape):
        strides.append(step)
        step *= s
    return tuple(reversed(strides))


def numba_params(argtypes: Sequence[Any], values: Sequence[Any]) -> list[Any]:
    """Parameters of a compiled Numba kernel of ``argtypes`` called with ``values``."""
    from numba.core import types

    out: list[Any] = []
    for ty, val in zip(argtypes, values, strict=True):
        if isinstance(ty, types.Array):
            ptr, shape, strides, itemsize = _array_fields(val)
            if len(shape) != ty.ndim or itemsize != ty.dtype.bitwidth // 8:
                raise LaunchUnsupported(f"{ty} does not describe an array of shape {shape}")
            nitems = int(np.prod(shape, dtype=np.int64))
            out += [ctypes.c_void_p(0), ctypes.c_void_p(0), ctypes.c_ssize_t(nitems),
                    ctypes.c_ssize_t(itemsize), ctypes.c_void_p(ptr)]
            out += [ctypes.c_ssize_t(s) for s in shape]
            out += [ctypes.c_ssize_t(s) for s in strides]
        elif isinstance(ty, types.Boolean):
            out.append(ctypes.c_bool(bool(val)))
        elif isinstance(ty, types.Integer):
            out.append(getattr(ctypes, f"c_{ty}")(int(val)))
        elif ty == types.float16:
            out.append(ctypes.c_uint16(int(np.float16(val).view(np.uint16))))
        elif ty == types.float32:
            out.append(ctypes.c_float(val))
        elif ty == types.float64:
            out.append(ctypes.c_double(val))
        elif isinstance(ty, types.CPointer):
            out.append(ctypes.c_void_p(device_pointer(val)))
        else:
            raise LaunchUnsupported(f"no packed launch for a Numba argument of type {ty}")
    return out


_TRITON_INTS = {
    "i1": ctypes.c_int8, "i8": ctypes.c_int8, "i16": ctypes.c_int16, "i32": ctypes.c_int32,
    "i64": ctypes.c_int64, "u1": ctypes.c_uint8, "u8": ctypes.c_uint8, "u16": ctypes.c_uint16,
    "u32": ctypes.c_uint32, "u64": ctypes.c_uint64,
}


def _bf16_bits(value: float) -> int:
    bits = int(np.float32(value).view(np.uint32))
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF  # round to nearest even


def triton_params(signature: Sequence[str], values: Sequence[Any], scratch: int) -> list[Any]:
    """Parameters of a compiled Triton kernel: ``signature`` holds the type of every kernel
    parameter in order (``"*fp32"``, ``"i32"``, ``"constexpr"``...), ``values`` their values,
    ``scratch`` the number of trailing scratch pointers the launcher appends."""
    out: list[Any] = []
    for ty, val in zip(signature, values, strict=True):
        if not isinstance(ty, str) or ty.startswith(("tensordesc", "nvTmaDesc")):
            raise LaunchUnsupported(f"no packed launch for a Triton parameter of type {ty}")
        if ty == "constexpr":
            continue
        if ty.startswith("*"):
            out.append(ctypes.c_void_p(device_pointer(val)))
        elif ty in _TRITON_INTS:
            out.append(_TRITON_INTS[ty](int(val)))
        elif ty in ("fp32", "f32"):
            out.append(ctypes.c_float(val))
        elif ty == "fp64":
            out.append(ctypes.c_double(val))
        elif ty == "fp16":
            out.append(ctypes.c_uint16(int(np.float16(val).view(np.uint16))))
        elif ty == "bf16":
            out.append(ctypes.c_uint16(_bf16_bits(val)))
        else:
            raise LaunchUnsupported(f"no packed launch for a Triton parameter of type {ty}")
    out += [ctypes.c_void_p(0) for _ in range(scratch)]
    return out


def raw_params(values: Sequence[Any]) -> list[Any]:
    """Parameters of a plain CUDA function: ctypes values as they are, memory as ``void*``.
    A bare Python number is refused: its C type would be a guess."""
    out: list[Any] = []
    for val in values:
        if isinstance(val, ctypes._SimpleCData | ctypes.Structure):
            out.append(val)
        elif isinstance(val, bool | int | float):
            raise LaunchUnsupported(
                f"give the C type of scalar {val!r} (e.g. ctypes.c_int32({val!r}))"
            )
        else:
            out.append(ctypes.c_void_p(device_pointer(val)))
    return out
