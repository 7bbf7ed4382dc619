"""The decoder's (residual add +) RMSNorm in the skinny GEMM's loads, without a GPU: the kernel
cases through Triton's interpreter in a subprocess (``python tests/model/test_skinny_gemm_norm.py``
with ``TRITON_INTERPRET=1``; it runs the programs one after another, so the GPU cases in
test_skinny_gemm_norm_gpu.py are the ones that check concurrent programs and the compiled
reductions' order), and where the decoder takes the fusion.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

if __name__ == "__main__":  # the interpreter driver: before triton is imported
    os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pytest  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from cadence.model import skinny_gemm  # noqa: E402
from cadence.model.attention_layer import SelfAttention  # noqa: E402
from cadence.model.decoder import CausalLM  # noqa: E402
from cadence.model.layers import RMSNorm  # noqa: E402
from cadence.model.moe import SparseMoE  # noqa: E402
from cadence.model.skinny_gemm import SkinnyConfig, SkinnyLinear, heuristic_config  # noqa: E402
from tests.model.helpers import hf_config  # noqa: E402
from tests.model.skinny_norm_cases import EPS, run_interpreter_cases  # noqa: E402
from tests.model.triton_interpreter import DONE, patch_interpreter, run_interpreted  # noqa: E402

# --- CPU ----------------------------------------------------------------------------------------


@pytest.mark.timeout(600)  # the interpreter's subprocess, minutes on 2 cores
def test_kernels_in_triton_interpreter():
    run_interpreted(__file__)


def test_switch_is_read_once_at_import():
    probe = ("from cadence.model import skinny_gemm; "
             "print(skinny_gemm.NORM_MAX_ROWS, skinny_gemm.LATE_NORM_MAX_ROWS)")
    for value, rows in (("1", "0 0"), ("0", "1 1"), ("", "1 1")):
        env = {**os.environ, "CADENCE_DISABLE_FUSED_NORM": value}
        got = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                             text=True, check=True, cwd=Path(__file__).parents[2]).stdout
        assert got.strip() == rows


def test_which_norm_fusion_a_projection_takes(monkeypatch):
    """The two kernels' bits up to NORM_MAX_ROWS rows of at most NORM_MAX_K; past NORM_MAX_K
    the late norm up to LATE_NORM_MAX_ROWS bfloat16 rows; the two calls elsewhere."""
    monkeypatch.setattr(skinny_gemm, "NORM_MAX_ROWS", 1)
    monkeypatch.setattr(skinny_gemm, "NORM_MAX_K", 2048)
    monkeypatch.setattr(skinny_gemm, "LATE_NORM_MAX_ROWS", 2)
    bf16, fp16 = torch.bfloat16, torch.float16
    cases = [((1, 1024, bf16), "exact"), ((1, 2048, fp16), "exact"), ((2, 1024, bf16), None),
             ((1, 2049, bf16), "late"), ((2, 4096, bf16), "late"), ((3, 4096, bf16), None),
             ((1, 4096, fp16), None), ((0, 4096, bf16), None), ((1, 4096, torch.float32), None)]
    for (rows, width, dtype), want in cases:
        assert skinny_gemm.norm_fusion(rows, width, dtype) == want, (rows, width, dtype)
    monkeypatch.setattr(skinny_gemm, "NORM_MAX_ROWS", 0)  # CADENCE_DISABLE_FUSED_NORM=1
    monkeypatch.setattr(skinny_gemm, "LATE_NORM_MAX_ROWS", 0)
    assert skinny_gemm.norm_fusion(1, 1024, bf16) is None
    assert skinny_gemm.norm_fusion(1, 4096, bf16) is None


def _skinny(k: int, n: int, dtype: torch.dtype = torch.float32, bias: bool = True
            ) -> SkinnyLinear:
    layer = nn.Linear(k, n, bias=bias).to(dtype)
    layer.__class__ = SkinnyLinear
    return layer


@pytest.mark.parametrize("residual", [True, False])
def test_cpu_forward_norm_is_the_two_calls(residual):
    torch.manual_seed(0)
    layer, norm = _skinny(64, 48), RMSNorm(64, EPS)
    with torch.no_grad():
        norm.weight.add_(0.2 * torch.randn(64))
    x, r = torch.randn(3, 64), torch.randn(3, 64) if residual else None
    out, s = layer.forward_norm(x, r, norm.weight, norm.eps)
    h, want_s = (norm(x), x) if r is None else norm.add_and_norm(x, r)
    assert torch.equal(out, layer(h)) and torch.equal(s, want_s)
    plain = nn.Linear(64, 48)
    plain.load_state_dict(layer.state_dict())
    got, got_s = norm.project(plain, x, r)  # not skinny: the two calls
    assert torch.equal(got, out) and torch.equal(got_s, s)


def test_when_the_fusion_applies(monkeypatch):
    """_norm_config: the fused launch's configuration, or None where it does not apply."""
    chosen = SkinnyConfig(block_n=32, block_k=256)
    monkeypatch.setattr(skinny_gemm, "_usable", lambda x, w, b: True)
    monkeypatch.setattr(skinny_gemm, "_choose_norm",
                        lambda device, n, k, bucket, late=False: chosen)
    layer = _skinny(64, 48, torch.bfloat16)
    x, r = torch.randn(3, 64).bfloat16(), torch.randn(3, 64).bfloat16()
    nw = torch.ones(64, dtype=torch.bfloat16)
    with torch.no_grad():
        assert layer._norm_config(x, r, nw, 3) == chosen
        assert layer._norm_config(x, None, nw, 3) == chosen
        assert layer._norm_config(torch.randn(17, 64).bfloat16(), None, nw, 17) is None
        assert layer._norm_config(x[:, :32], None, nw[:32], 3) is None  # not the weight's K
        assert layer._norm_config(x, r, nw.float(), 3) is None  # another dtype
        assert layer._norm_config(x, r.float(), nw, 3) is None
        assert layer._norm_config(x, r[:1], nw, 3) is None
        assert layer._norm_config(x, torch.randn(64, 3).bfloat16().t(), nw, 3) is None
        assert layer._norm_config(x, r, torch.ones(64, 2, dtype=torch.bfloat16)[:, 0], 3) is None


def test_norm_configuration_rule(monkeypatch):
    """The plain GEMM's configuration where it runs the kernel; where cuBLAS is the faster GEMM,
    the heuristic up to HEURISTIC_MAX_WEIGHT_BYTES; NORM_CONFIGS over both. The late norm:
    LATE_NORM_CONFIGS' shapes alone, on the table's device alone."""
    class Props:
        multi_processor_count = 132

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: Props())
    listed = SkinnyConfig(block_n=8, block_k=512, split_k=1, num_warps=4, num_stages=1, dot=False)
    measured = SkinnyConfig(block_n=64, block_k=128, split_k=2)
    monkeypatch.setattr(skinny_gemm, "SKINNY_CONFIGS", {
        (4096, 1024, 1): listed, (4096, 1024, 4): None, (28672, 4096, 4): None})
    monkeypatch.setattr(skinny_gemm, "NORM_CONFIGS", {(6144, 1024, 4): measured})
    late_cfg = SkinnyConfig(block_n=16, block_k=512, split_k=1, num_warps=4, num_stages=1,
                            dot=False)
    monkeypatch.setattr(skinny_gemm, "LATE_NORM_CONFIGS", {(6144, 4096, 1): late_cfg})

    def choose(n: int, k: int, bucket: int, late: bool = False) -> SkinnyConfig | None:
        monkeypatch.setattr(skinny_gemm, "_CHOSEN", {})
        monkeypatch.setattr(skinny_gemm, "_CHOSEN_NORM", {})
        return skinny_gemm._choose_norm(torch.device("cuda", 0), n, k, bucket, late)

    assert choose(4096, 1024, 1) == listed
    assert choose(4096, 1024, 4) == heuristic_config(4, 4096, 1024, 132)  # cuBLAS's GEMM
    assert choose(6144, 1024, 4) == measured
    assert choose(28672, 4096, 4) is None  # 235 MB: cuBLAS and the norm kernel
    assert choose(6144, 4096, 1, late=True) == late_cfg
    assert choose(4096, 1024, 1, late=True) is None  # listed for the plain GEMM, not the late
    assert choose(28672, 4096, 1, late=True) is None
    # Both modes of one shape are cached apart.
    assert skinny_gemm._choose_norm(torch.device("cuda", 0), 6144, 4096, 1) is None
    assert skinny_gemm._choose_norm(torch.device("cuda", 0), 6144, 4096, 1, True) == late_cfg
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert choose(6144, 4096, 1, late=True) is None  # another device: not measured there


def _fake_attention(self, qkv, *args):  # type: ignore[no-untyped-def]
    return self.o_proj(qkv[:, : self.q_size])  # a stand-in: no KV cache on the CPU


def _old_layers(model: CausalLM, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The decoder layers as they were before the fusion: each norm, then its consumer."""
    residual = None
    for layer in model.model.layers:
        if residual is None:
            residual, h = x, layer.input_layernorm(x)
        else:
            h, residual = layer.input_layernorm.add_and_norm(x, residual)
        h = _fake_attention(layer.self_attn, layer.self_attn.qkv_proj(h))
        h, residual = layer.post_attention_layernorm.add_and_norm(h, residual)
        x = layer.mlp(h)
    assert residual is not None
    return x, residual


@pytest.mark.parametrize("family", ["qwen3", "qwen3-moe", "llama-bias"])
def test_decoder_hands_each_norm_to_its_projection(monkeypatch, family):
    """Each dense layer's two norms go to its qkv and gate_up projections (the first layer's
    with no residual); an MoE layer's second norm stays a norm. On the CPU the result is the
    two calls' (the layers as they were)."""
    torch.manual_seed(0)
    model = CausalLM(hf_config(family, tie=False), attn_backend=None)  # type: ignore[arg-type]
    with torch.no_grad():
        for name, p in model.named_parameters():  # some are left uninitialized (torch.empty)
            p.copy_(1 + 0.2 * torch.randn_like(p) if "norm" in name else 0.1 * torch.randn_like(p))
    calls: list[tuple[str, bool]] = []
    names = {id(m): n for n, m in model.named_modules()}
    real = SkinnyLinear.forward_norm

    def spy(self, x, residual, norm_weight, eps):  # type: ignore[no-untyped-def]
        calls.append((names[id(self)], residual is None))
        return real(self, x, residual, norm_weight, eps)

    monkeypatch.setattr(SkinnyLinear, "forward_norm", spy)
    monkeypatch.setattr(SelfAttention, "attend", _fake_attention)
    x = torch.randn(3, model.arch.hidden_size)
    want = []
    with torch.no_grad():
        h, residual = x, None
        for i, layer in enumerate(model.model.layers):
            h, residual = layer(h, residual, None, None, None, None)
            want.append((f"model.layers.{i}.self_attn.qkv_proj", i == 0))
            if not isinstance(layer.mlp, SparseMoE):
                want.append((f"model.layers.{i}.mlp.gate_up_proj", False))
        old_h, old_residual = _old_layers(model, x)
    assert calls == want
    assert any(isinstance(layer.mlp, SparseMoE) for layer in model.model.layers) == (
        family == "qwen3-moe")
    assert bool(torch.isfinite(h).all())
    assert torch.equal(h, old_h) and torch.equal(residual, old_residual)


if __name__ == "__main__":
    patch_interpreter()
    run_interpreter_cases()
    print(DONE)
