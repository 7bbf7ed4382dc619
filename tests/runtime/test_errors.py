from __future__ import annotations

import enum

import pytest

from cadence.runtime.errors import CudaError, check


class _FakeError(enum.IntEnum):
    cudaSuccess = 0
    cudaErrorInvalidValue = 1


def test_check_unpacks_values() -> None:
    assert check((_FakeError.cudaSuccess,), "cudaFoo") is None
    assert check((_FakeError.cudaSuccess, 7), "cudaFoo") == 7
    assert check((_FakeError.cudaSuccess, 1, 2), "cudaFoo") == (1, 2)


def test_check_raises_naming_the_call_and_the_error() -> None:
    with pytest.raises(CudaError) as info:
        check((_FakeError.cudaErrorInvalidValue, None), "cudaMemcpyAsync")
    err = info.value
    assert err.call == "cudaMemcpyAsync"
    assert err.name == "cudaErrorInvalidValue"
    assert err.code == 1
    assert "cudaMemcpyAsync failed with cudaErrorInvalidValue (1)" in str(err)


def test_real_binding_error_codes_get_a_description() -> None:
    runtime = pytest.importorskip("cuda.bindings.runtime")
    with pytest.raises(CudaError, match="cudaSetDevice failed with cudaErrorInvalidDevice") as info:
        check((runtime.cudaError_t.cudaErrorInvalidDevice,), "cudaSetDevice")
    assert info.value.description  # cudaGetErrorString's text


@pytest.mark.gpu
def test_failing_runtime_call_raises_cuda_error_and_torch_keeps_working() -> None:
    import torch

    from cadence.runtime import get_device

    dev = get_device("cuda")
    with pytest.raises(CudaError) as info:
        dev.alloc_device(1 << 60)
    assert info.value.call == "cudaMalloc"
    assert info.value.name == "cudaErrorMemoryAllocation"
    with pytest.raises(CudaError) as info:
        dev.alloc_pinned(1 << 60)
    assert info.value.call == "cudaHostAlloc"
    # The failed calls left no stale error behind for torch's launch checks.
    x = torch.arange(1000, device="cuda").float()
    assert float((x * 2).sum()) == 999000.0
