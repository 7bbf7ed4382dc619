"""The bulk-copy GEMV's host side (no GPU needed): configurations, shared memory, where it
applies, and that its CUDA source compiles for Hopper in every mode (where NVRTC is installed)."""

from __future__ import annotations

import pytest
import torch

from cadence.model.bulk_gemv import MAX_SHARED, BulkConfig, bulk_applies, nvrtc_ok
from cadence.model.bulk_gemv_kernel import KERNEL, SOURCE, defines, shared_bytes, x_in_registers


@pytest.mark.parametrize("kwargs", [dict(rows=3, stages=2), dict(rows=0, stages=2),
                                    dict(rows=4, stages=0), dict(rows=4, stages=9),
                                    dict(rows=4, stages=2, threads=64),
                                    dict(rows=256, stages=2, threads=128)])
def test_bad_configurations_are_refused(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        BulkConfig(**kwargs)


def test_shared_memory_holds_the_input_row_and_every_stage() -> None:
    # A 384-byte header, the row rounded up to 128 bytes, then stages * rows rows of bf16.
    assert shared_bytes(4096, 4, 3) == 384 + 8192 + 3 * 4 * 8192
    assert shared_bytes(1000, 1, 2) == 384 + 2048 + 2 * 2000
    assert BulkConfig(4, 3).shared_bytes(4096) == shared_bytes(4096, 4, 3)
    assert BulkConfig(8, 8).shared_bytes(14336) > MAX_SHARED


def test_cpu_tensors_never_take_the_kernel() -> None:
    x = torch.zeros(1, 1024, dtype=torch.bfloat16)
    w = torch.zeros(64, 1024, dtype=torch.bfloat16)
    assert not bulk_applies(x, w, BulkConfig(4, 2))
    assert not bulk_applies(x, w, BulkConfig(4, 2), "norm")


def test_e4m3_weights_take_a_byte_a_weight_and_an_f16_input_row() -> None:
    # The header, the bf16 row, its f16 copy, then stages of one byte a weight.
    assert shared_bytes(4096, 4, 3, fp8=True) == 384 + 8192 + 8192 + 3 * 4 * 4096
    assert shared_bytes(1040, 2, 2, fp8=True) == 384 + 2176 + 2176 + 2 * 2 * 1040
    assert BulkConfig(4, 3).shared_bytes(4096, fp8=True) == shared_bytes(4096, 4, 3, True)


def test_cpu_e4m3_weights_never_take_the_kernel() -> None:
    x = torch.zeros(1, 1024, dtype=torch.bfloat16)
    w = torch.zeros(64, 1024, dtype=torch.float8_e4m3fn)
    assert not bulk_applies(x, w, BulkConfig(4, 2), scale=torch.ones(64))


@pytest.mark.skipif(not nvrtc_ok(), reason="needs NVRTC")
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
@pytest.mark.parametrize("mode,res", [(0, 0), (1, 0), (1, 1), (2, 0)])
@pytest.mark.parametrize("cfg", [BulkConfig(1, 4, 256), BulkConfig(16, 2, 128),
                                 BulkConfig(2, 8, 512)], ids=str)
def test_the_source_compiles_for_hopper(cfg: BulkConfig, mode: int, res: int, fp8: bool) -> None:
    from cadence.runtime.module import compile_cuda

    cubin = compile_cuda(SOURCE, "bulk_gemv.cu", "sm_90",
                         defines(cfg.rows, cfg.stages, cfg.threads, mode, bool(res), fp8))
    assert KERNEL.encode() in cubin


def test_e4m3_inputs_go_to_registers_where_every_thread_takes_as_many_vectors() -> None:
    # K / 16 vectors a row, threads / rows threads a row: an equal share of at most 8.
    assert x_in_registers(4096, 16, 512)  # 256 vectors, 32 threads: 8 each
    assert x_in_registers(14336, 4, 512)  # 896, 128: 7 each
    assert not x_in_registers(14336, 2, 512)  # 896 over 256 threads: unequal
    assert not x_in_registers(4096, 1, 512) and not x_in_registers(1040, 4, 256)
    assert not x_in_registers(14336, 16, 512)  # 28 each: too many registers
    assert "-DBG_K=4096" in defines(16, 2, 512, 1, True, fp8=True, k=4096)
    assert "-DBG_K=0" in defines(16, 2, 512, 1, True, fp8=False, k=4096)
    assert "-DBG_K=0" in defines(2, 2, 512, 0, False, fp8=True, k=14336)


def test_the_hardware_conversion_is_an_e4m3_option() -> None:
    assert not BulkConfig(4, 2).hw_cvt
    assert "-DBG_CVT=1" in defines(4, 2, 256, 0, False, fp8=True, hw_cvt=True)
    assert "-DBG_CVT=0" in defines(4, 2, 256, 0, False, fp8=False, hw_cvt=True)
    assert "-DBG_CVT=0" in defines(4, 2, 256, 0, False, fp8=True)


@pytest.mark.skipif(not nvrtc_ok(), reason="needs NVRTC")
@pytest.mark.parametrize("hw_cvt", [False, True])
@pytest.mark.parametrize("mode", [0, 1, 2])
@pytest.mark.parametrize("rows,threads,k", [(16, 512, 4096), (4, 512, 14336), (8, 128, 1024),
                                            (2, 512, 14336)])
def test_the_e4m3_paths_compile_for_hopper(rows: int, threads: int, k: int, mode: int,
                                           hw_cvt: bool) -> None:
    from cadence.runtime.module import compile_cuda

    options = defines(rows, 2, threads, mode, mode == 1, fp8=True, k=k, hw_cvt=hw_cvt)
    cubin = compile_cuda(SOURCE, "bulk_gemv.cu", "sm_90", options)
    assert KERNEL.encode() in cubin
