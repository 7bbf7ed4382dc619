"""Device memory shared between processes (CUDA IPC handles) and peer access between devices.

An exporter's ``cudaMalloc`` memory gets a 64-byte handle (``ipc_handle``) that another process
on the same host opens into its own address space (``open_ipc_handle``), with peer access to the
exporting device enabled on the way. Handles are plain bytes, so any channel can carry them.

Hazard: the exporter must not free the memory while an importer still has it open
(``close_ipc_handle`` first, everywhere), and nothing here makes peers' accesses ordered: that is
the kernels' business.
"""

from __future__ import annotations

import ctypes

from cadence.runtime._cudart import cudart, on_device
from cadence.runtime.errors import check, raise_for

HANDLE_BYTES = 64  # sizeof(cudaIpcMemHandle_t)


def ipc_handle(ptr: int, device_index: int) -> bytes:
    """The IPC handle of the ``cudaMalloc`` allocation that starts at ``ptr`` on device
    ``device_index``."""
    rt = cudart()
    with on_device(device_index):
        handle = check(rt.cudaIpcGetMemHandle(ptr), "cudaIpcGetMemHandle")
    return ctypes.string_at(handle.getPtr(), HANDLE_BYTES)


def open_ipc_handle(handle: bytes, device_index: int) -> int:
    """Map another process's allocation into this one on device ``device_index``; returns its
    address here (close it with ``close_ipc_handle``)."""
    if len(handle) != HANDLE_BYTES:
        raise ValueError(f"an IPC handle is {HANDLE_BYTES} bytes, got {len(handle)}")
    rt = cudart()
    h = rt.cudaIpcMemHandle_t()
    ctypes.memmove(h.getPtr(), handle, HANDLE_BYTES)
    with on_device(device_index):
        ptr = check(rt.cudaIpcOpenMemHandle(h, rt.cudaIpcMemLazyEnablePeerAccess),
                    "cudaIpcOpenMemHandle")
    return int(ptr)


def close_ipc_handle(ptr: int, device_index: int) -> None:
    """Unmap an allocation opened with ``open_ipc_handle``."""
    rt = cudart()
    with on_device(device_index):
        check(rt.cudaIpcCloseMemHandle(ptr), "cudaIpcCloseMemHandle")


def pci_bus_id(device_index: int) -> str:
    """The device's PCI bus id (``0000:3B:00.0``): the same in every process of the host,
    whatever its ``CUDA_VISIBLE_DEVICES``."""
    raw = check(cudart().cudaDeviceGetPCIBusId(32, device_index), "cudaDeviceGetPCIBusId")
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    return text.split("\0", 1)[0]


def device_by_pci_bus_id(bus_id: str) -> int | None:
    """The index in this process of the device at ``bus_id``; None when it is not visible."""
    rt = cudart()
    err, index = rt.cudaDeviceGetByPCIBusId(bus_id.encode())
    if err:
        rt.cudaGetLastError()  # not an error for the caller: clear cudart's last-error state
        return None
    return int(index)


def can_access_peer(device_index: int, peer_index: int) -> bool:
    """Whether kernels on ``device_index`` can read and write ``peer_index``'s memory."""
    if device_index == peer_index:
        return True
    ok = check(cudart().cudaDeviceCanAccessPeer(device_index, peer_index),
               "cudaDeviceCanAccessPeer")
    return bool(ok)


def enable_peer_access(device_index: int, peer_index: int) -> None:
    """Let ``device_index`` map ``peer_index``'s memory (idempotent)."""
    if device_index == peer_index:
        return
    rt = cudart()
    with on_device(device_index):
        (err,) = rt.cudaDeviceEnablePeerAccess(peer_index, 0)
        if err == rt.cudaError_t.cudaErrorPeerAccessAlreadyEnabled:
            rt.cudaGetLastError()
        elif err:
            raise_for(err, "cudaDeviceEnablePeerAccess")


def zero_device_memory(ptr: int, nbytes: int, device_index: int) -> None:
    """Fill ``nbytes`` at ``ptr`` with zeros and wait until the device has done so."""
    rt = cudart()
    with on_device(device_index):
        check(rt.cudaMemset(ptr, 0, nbytes), "cudaMemset")
        check(rt.cudaDeviceSynchronize(), "cudaDeviceSynchronize")


def write_device_memory(ptr: int, data: bytes, device_index: int) -> None:
    """Copy ``data`` to ``ptr`` on device ``device_index`` (synchronous)."""
    rt = cudart()
    staging = ctypes.create_string_buffer(data, len(data))
    with on_device(device_index):
        check(rt.cudaMemcpy(ptr, ctypes.addressof(staging), len(data),
                            rt.cudaMemcpyKind.cudaMemcpyHostToDevice), "cudaMemcpy")
        check(rt.cudaDeviceSynchronize(), "cudaDeviceSynchronize")
