"""The bulk-copy GEMV's host side (no GPU needed): configurations, shared memory, where it
applies, and that its CUDA source compiles for Hopper in every mode (where NVRTC is installed)."""

from __future__ import annotations

import pytest
import torch

from cadence.model.bulk_gemv import MAX_SHARED, BulkConfig, bulk_applies, nvrtc_ok
from cadence.model.bulk_gemv_kernel import KERNEL, SOURCE, defines, shared_bytes


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
