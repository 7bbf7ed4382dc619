"""The offline TTFT floor: weight bytes against GEMM work, counted independently here."""

from __future__ import annotations

import torch

from cadence.bench.ttft import floor_seconds, matmul_seconds
from cadence.model.decoder import CausalLM
from cadence.model.fp8 import quantize_model_fp8
from tests.model.helpers import hf_config


def _model(tie: bool) -> CausalLM:
    torch.manual_seed(0)
    return CausalLM(hf_config("qwen3", tie=tie), attn_backend=None)  # type: ignore[arg-type]


def _decoder_and_head_elements(model: CausalLM) -> tuple[int, int]:
    cfg = model.arch
    layer = sum(p.numel() for p in model.model.layers[0].parameters() if p.dim() == 2)
    return layer * model.num_layers, cfg.vocab_size * cfg.hidden_size


def test_gemm_work_counts_the_head_once_and_fp8_at_twice_the_rate():
    flops = 1e12
    for tie in (False, True):
        model = _model(tie)
        decoder, head = _decoder_and_head_elements(model)
        want = (2 * decoder * 100 + 2 * head) / flops
        assert abs(matmul_seconds(model, 100, flops) - want) < 1e-12 * want + 1e-15
    model = _model(False)
    decoder, head = _decoder_and_head_elements(model)
    quantize_model_fp8(model)  # every decoder projection; the head stays
    want = (2 * decoder * 100 / 2 + 2 * head) / flops
    assert abs(matmul_seconds(model, 100, flops) - want) < 1e-12 * want + 1e-15
    # The floor is the larger of the two: a huge bandwidth leaves the GEMM work.
    assert floor_seconds(model, 100, 1e30, flops) == matmul_seconds(model, 100, flops)


def test_fp8_experts_count_at_the_model_dtype_rate():
    """Experts run weight-only (bf16 MMA): their GEMM work is not halved by FP8, and their
    row scales are no GEMM at all."""
    torch.manual_seed(0)
    model = CausalLM(hf_config("qwen3-moe", tie=False), attn_backend=None)  # type: ignore[arg-type]
    arch = model.arch
    before = matmul_seconds(model, 64, 1e12)
    experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    quantize_model_fp8(model)
    active = arch.num_experts_per_tok / arch.num_experts
    projections = sum(p.numel() for n, p in model.named_parameters()
                      if p.dtype == torch.float8_e4m3fn and ".experts." not in n)
    want = before - 2 * projections * 64 / 1e12 / 2  # only the projections run at twice the rate
    assert experts > 0 and projections > 0
    got = matmul_seconds(model, 64, 1e12)
    assert abs(got - want) <= 1e-9 * want
    assert got > before / 2 + 2 * experts * active * 64 / 1e12 / 4
