"""The tensor-core bulk GEMM's host side (no GPU needed): configurations, shared memory, row
buckets, where it applies, the table's entries, and that its CUDA source compiles for Hopper in
every mode and weight type (where NVRTC is installed)."""

from __future__ import annotations

import itertools

import pytest
import torch

from cadence.model.bulk_gemv import nvrtc_ok
from cadence.model.bulk_mma import (
    MAX_M,
    MMA_CONFIGS,
    MmaConfig,
    bulk_plan,
    bulk_plan_listed,
    mma_applies,
    mma_bucket,
    mma_config,
    mma_listed,
)
from cadence.model.bulk_mma_kernel import KERNEL, SOURCE, defines, shared_bytes, x_row_bytes


@pytest.mark.parametrize("kwargs", [dict(rows=8), dict(rows=64), dict(rows=32, threads=128),
                                    dict(kc=96), dict(kc=0), dict(stages=0), dict(stages=9),
                                    dict(threads=64)])
def test_bad_configurations_are_refused(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        MmaConfig(**kwargs)


def test_row_buckets() -> None:
    assert [mma_bucket(r) for r in range(1, MAX_M + 1)] == [1, 2, 4, 4, 8, 8, 8, 8]


def test_shared_memory_layout() -> None:
    # Header 1024; M input rows of round128(2K) + 64 (bf16) or + 16 (e4m3) bytes, rounded to
    # 128; two buffers of the warps' partial sums (16 rows x 8 columns of float32 a warp);
    # stages of `rows` rows of min(kc, K) weight bytes, padded to 64 past a multiple of 128.
    assert x_row_bytes(1000, False) == 2048 + 64
    assert x_row_bytes(1024, True) == 2048 + 16
    assert shared_bytes(3, 1024, 16, 512, 2, 256, False) == (
        1024 + 6400 + 2 * 8 * 512 + 2 * 16 * (1024 + 64))
    assert shared_bytes(1, 4096, 32, 8192, 3, 256, True) == (
        1024 + 8320 + 8192 + 3 * 32 * (4096 + 64))
    assert shared_bytes(1, 4096, 16, 1024, 2, 256, True, padded=False) == (
        1024 + 8320 + 8192 + 2 * 16 * 1024)
    assert MmaConfig(16, 1024, 3).shared_bytes(2, 2048, False) == shared_bytes(
        2, 2048, 16, 1024, 3, 256, False)


def test_cpu_tensors_never_take_the_kernel() -> None:
    x = torch.zeros(2, 1024, dtype=torch.bfloat16)
    w = torch.zeros(64, 1024, dtype=torch.bfloat16)
    assert not mma_applies(x, w, MmaConfig())
    assert not mma_applies(x, w, MmaConfig(), "norm", None, None, torch.ones(1024).bfloat16())
    assert not mma_listed(w, "plain", 2)
    assert mma_config(x, w, None, "plain") is None
    assert not bulk_plan_listed(w, "plain", 1) and bulk_plan(x[:1], w, None, "plain") is None


def test_the_table_lists_valid_entries() -> None:
    for (n, k, mode, wtype, bucket), cfg in MMA_CONFIGS.items():
        assert mode in ("plain", "norm", "glu") and wtype in ("bf16", "fp8")
        assert bucket in (1, 2, 4, MAX_M)
        assert k % (64 if wtype == "fp8" else 32) == 0 and n > 0
        assert cfg.shared_bytes(bucket, k, wtype == "fp8") <= 227 * 1024


@pytest.mark.skipif(not nvrtc_ok(), reason="needs NVRTC")
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
@pytest.mark.parametrize("cfg", [MmaConfig(16, 1024, 3, 256), MmaConfig(32, 256, 2, 512),
                                 MmaConfig(16, 512, 4, 128, padded=False)], ids=str)
def test_the_source_compiles_for_hopper(cfg: MmaConfig, fp8: bool) -> None:
    from cadence.runtime.module import compile_cuda

    for mode, res in itertools.product((0, 1, 2), (False, True)):
        if res and mode != 1:
            continue
        for bucket in ((1, 2, 4, MAX_M) if mode == 1 else (MAX_M,)):
            options = defines(cfg.rows, cfg.kc, cfg.stages, cfg.threads, mode, res, fp8,
                              cfg.padded, bucket)
            assert KERNEL.encode() in compile_cuda(SOURCE, "bulk_mma.cu", "sm_90", options)


def test_only_the_norm_prologue_is_built_per_row_bucket() -> None:
    # The norm mode unrolls its sums of squares over the bucket's rows; the other modes share
    # one build across buckets (the define stays at the largest).
    assert "-DBM_MR=4" in defines(16, 1024, 2, 256, 1, True, False, max_rows=4)
    for mode in (0, 2):
        assert f"-DBM_MR={MAX_M}" in defines(16, 1024, 2, 256, mode, False, False, max_rows=2)
    for bad in (0, MAX_M + 1):
        with pytest.raises(ValueError, match="max_rows"):
            defines(16, 1024, 2, 256, 1, True, False, max_rows=bad)
