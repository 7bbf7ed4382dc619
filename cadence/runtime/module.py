"""CUDA modules: a cubin, PTX or fatbin image loaded with ``cuModuleLoadData``, or CUDA C++
compiled for the device by NVRTC (``cuda.bindings.nvrtc``). Their functions go to
``launcher.bind_function``.

    mod = Module.from_source(r'''extern "C" __global__ void add1(int *x, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] += 1; }''')
    k = bind_function(mod.function("add1"), grid=4, block=256, args=(buf, ctypes.c_int32(1000)))
    k.launch(stream)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cadence.runtime._cudart import cudart, cudriver, on_device
from cadence.runtime.errors import CudaError, check, check_driver


def _nvrtc() -> Any:
    try:
        from cuda.bindings import nvrtc
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError("compiling CUDA C++ needs cuda-python's nvrtc bindings") from exc
    return nvrtc


def _check_nvrtc(result: tuple[Any, ...], call: str) -> Any:
    err = result[0]
    if int(err):
        raise CudaError(call, int(err), getattr(err, "name", str(err)))
    return result[1] if len(result) == 2 else None


def compile_cuda(source: str, name: str = "kernel.cu", arch: str | None = None,
                 options: Sequence[str] = (), device_index: int = 0) -> bytes:
    """CUDA C++ -> cubin for ``arch`` (default: ``sm_XY`` of device ``device_index``)."""
    nvrtc = _nvrtc()
    if arch is None:
        rt = cudart()
        attrs = rt.cudaDeviceAttr
        major = check(rt.cudaDeviceGetAttribute(attrs.cudaDevAttrComputeCapabilityMajor,
                                                device_index), "cudaDeviceGetAttribute")
        minor = check(rt.cudaDeviceGetAttribute(attrs.cudaDevAttrComputeCapabilityMinor,
                                                device_index), "cudaDeviceGetAttribute")
        arch = f"sm_{int(major)}{int(minor)}"
    prog = _check_nvrtc(nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], []),
                        "nvrtcCreateProgram")
    try:
        opts = [f"--gpu-architecture={arch}".encode(), *(o.encode() for o in options)]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        if int(err):
            size = _check_nvrtc(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
            log = b" " * size
            _check_nvrtc(nvrtc.nvrtcGetProgramLog(prog, log), "nvrtcGetProgramLog")
            raise CudaError("nvrtcCompileProgram", int(err), getattr(err, "name", str(err)),
                            log.decode(errors="replace").strip())
        size = _check_nvrtc(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
        cubin = b" " * size
        _check_nvrtc(nvrtc.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
        return cubin
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


class Module:
    """A loaded module on device ``device_index`` (its primary context)."""

    def __init__(self, image: bytes, device_index: int = 0) -> None:
        drv = cudriver()
        self._drv = drv
        self.device_index = device_index
        if not image.startswith(b"\x7fELF") and b".version" in image[:4096]:
            image = image if image.endswith(b"\0") else image + b"\0"  # PTX text
        with on_device(device_index):  # makes the device's primary context current
            check(cudart().cudaFree(0), "cudaFree")
            self.handle = check_driver(drv.cuModuleLoadData(image), "cuModuleLoadData")
        self._functions: dict[str, Any] = {}
        self.closed = False

    @classmethod
    def from_source(cls, source: str, name: str = "kernel.cu", options: Sequence[str] = (),
                    device_index: int = 0) -> Module:
        """Compile CUDA C++ with NVRTC for the device and load it (use ``extern "C"`` names)."""
        return cls(compile_cuda(source, name, None, options, device_index), device_index)

    def function(self, name: str) -> Any:
        """The ``CUfunction`` named ``name``."""
        if self.closed:
            raise ValueError("the module is closed")
        fn = self._functions.get(name)
        if fn is None:
            fn = check_driver(self._drv.cuModuleGetFunction(self.handle, name.encode()),
                              "cuModuleGetFunction")
            self._functions[name] = fn
        return fn

    def close(self) -> None:
        """Unload the module; its functions and bindings of them become invalid."""
        if self.closed:
            return
        self.closed = True
        self._functions.clear()
        check_driver(self._drv.cuModuleUnload(self.handle), "cuModuleUnload")

    def __enter__(self) -> Module:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
