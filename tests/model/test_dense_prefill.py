"""Dense prefill attention (cuDNN through torch) for a lone prompt from position 0: when it
applies, its refusal path, and on the GPU its output and K/V store against the varlen path."""

from __future__ import annotations

import logging

import pytest
import torch

from cadence.model.dense_prefill import DensePrefill

CUDA = torch.device("cuda")  # a device name only: nothing below touches CUDA on the CPU
BF16 = torch.bfloat16


@pytest.mark.parametrize(
    ("change", "ok"),
    [
        ({}, True),
        ({"dtype": torch.float16, "cache_dtype": torch.float16}, True),
        ({"dtype": torch.float32, "cache_dtype": torch.float32}, False),  # cuDNN: half only
        ({"cache_dtype": torch.float8_e4m3fn}, False),  # the cache's rounding is attended
        ({"head_dim": 256}, False),
        ({"head_dim": 60}, False),
        ({"sliding_window": 4096}, True),  # the Triton kernel's windows
        ({"softcap": 50.0}, True),
        ({"sliding_window": 4096, "head_dim": 256}, False),
        ({"device": torch.device("cpu")}, False),
    ],
)
def test_supports(change, ok):
    args = dict(dtype=BF16, head_dim=128, cache_dtype=BF16, sliding_window=0, softcap=0.0,
                device=CUDA)
    args.update(change)
    assert DensePrefill().supports(**args) is ok
    assert DensePrefill(enabled=False).supports(**args) is False
    # cuDNN alone takes no window or cap.
    plain = not change.get("sliding_window") and not change.get("softcap")
    assert DensePrefill(use_triton=False).supports(**args) is (ok and plain)


def test_applies_needs_a_fresh_prompt_of_enough_tokens():
    dense = DensePrefill(min_tokens=512)
    # Meta tensors: shapes, dtypes and a CUDA-like device without a GPU.
    q = torch.empty(512, 16, 128, dtype=BF16, device="meta")
    cache = torch.empty(2, 4, 16, 8, 128, dtype=BF16, device="meta")
    dense.supports = lambda *a: True  # the meta device is no CUDA device
    assert dense.applies(q, cache, True, 0, 0.0)
    assert not dense.applies(q, cache, False, 0, 0.0)
    assert not dense.applies(q[:511], cache, True, 0, 0.0)
    with pytest.raises(ValueError, match="min_tokens"):
        DensePrefill(min_tokens=0)


def test_a_refused_call_turns_it_off_for_good(caplog):
    """Where neither kernel can run the call (here: CPU tensors), attend gives None, says so
    once per kernel, and the pass goes through the varlen kernel; later passes never try
    again."""
    dense = DensePrefill(use_triton=False)
    q, k = torch.randn(8, 4, 16), torch.randn(8, 2, 16)
    with caplog.at_level(logging.WARNING, logger="cadence.model.dense_prefill"):
        assert dense.attend(q, k, k, 0.25) is None
    assert not dense.enabled
    assert caplog.text.count("unavailable") == 1
    assert not dense.supports(BF16, 128, BF16, 0, 0.0, CUDA)


def _fake_triton(monkeypatch, log: list, error: Exception | None = None) -> None:
    """The Triton kernel replaced: records its calls, fills ``out`` with 1, or raises."""
    from cadence.model import causal_attention

    def fake(q, k, v, out, scale, num_sms=0, tile=None, sliding_window=0, softcap=0.0):
        log.append(("triton", q.shape[0]) if not (sliding_window or softcap)
                   else ("triton", q.shape[0], sliding_window, softcap))
        if error is not None:
            raise error
        return out.fill_(1.0)

    monkeypatch.setattr(causal_attention, "causal_attention", fake)
    monkeypatch.setattr(causal_attention, "triton", object())  # "installed"


def _fake_cudnn(dense: DensePrefill, log: list, refuse: bool = False) -> None:
    def fake(q, k, v, scale):
        log.append(("cudnn", q.shape[0]))
        if refuse:
            dense._refused(RuntimeError("no plan"), q, "cuDNN")
            return None
        return torch.full_like(q, 2.0)

    dense._cudnn = fake


def test_the_triton_kernel_takes_small_passes_and_cudnn_large_ones(monkeypatch):
    log: list = []
    _fake_triton(monkeypatch, log)
    dense = DensePrefill(max_triton_work=16 * 1024 * 1024)
    _fake_cudnn(dense, log)
    assert dense.min_tokens == 128  # the Triton kernel's minimum while it is on
    small, large = torch.zeros(1024, 16, 8), torch.zeros(1025, 16, 8)
    kv_small, kv_large = torch.zeros(1024, 8, 8), torch.zeros(1025, 8, 8)
    assert dense.prefers_triton(1024, 16) and not dense.prefers_triton(1025, 16)
    assert not dense.prefers_triton(1024, 17)  # the work counts every query head
    assert dense.attend(small, kv_small, kv_small, 0.1).eq(1.0).all()
    assert dense.attend(large, kv_large, kv_large, 0.1).eq(2.0).all()
    assert log == [("triton", 1024), ("cudnn", 1025)]
    assert dense.calls == 2 and dense.triton_calls == 1
    off = DensePrefill(use_triton=False)
    assert off.min_tokens == 768 and not off.prefers_triton(16, 1)
    assert DensePrefill(min_tokens=300).min_tokens == 300
    with pytest.raises(ValueError, match="max_triton_work"):
        DensePrefill(max_triton_work=-1)


@pytest.mark.parametrize("refused", ["triton", "cudnn"])
def test_one_kernels_refusal_leaves_the_other_every_pass(monkeypatch, caplog, refused):
    """A refused call turns that kernel off for good and the same pass goes to the other one,
    as does every later pass whatever its size; the path stays on."""
    log: list = []
    _fake_triton(monkeypatch, log, RuntimeError("no kernel image") if refused == "triton"
                 else None)
    dense = DensePrefill(max_triton_work=16 * 64 * 64)
    _fake_cudnn(dense, log, refuse=refused == "cudnn")
    small, kv = torch.zeros(64, 16, 8), torch.zeros(64, 8, 8)
    large, kv_large = torch.zeros(65, 16, 8), torch.zeros(65, 8, 8)
    with caplog.at_level(logging.WARNING, logger="cadence.model.dense_prefill"):
        first = dense.attend(small if refused == "triton" else large,
                             kv if refused == "triton" else kv_large, kv, 0.1)
    assert first is not None and dense.enabled and dense.calls == 1
    assert caplog.text.count("unavailable") == 1
    if refused == "triton":
        assert not dense.triton and dense.cudnn and dense.min_tokens == 768
        assert log == [("triton", 64), ("cudnn", 64)]
        assert dense.attend(small, kv, kv, 0.1).eq(2.0).all()  # small passes: cuDNN now
        assert log[-1] == ("cudnn", 64)
    else:
        assert dense.triton and not dense.cudnn and dense.min_tokens == 128
        assert log == [("cudnn", 65), ("triton", 65)]
        assert dense.attend(large, kv_large, kv_large, 0.1).eq(1.0).all()  # large: Triton
        assert log[-1] == ("triton", 65)


def test_windowed_and_capped_passes_take_the_triton_kernel_only(monkeypatch, caplog):
    """cuDNN's causal call has no window or cap: such a pass goes to the Triton kernel at any
    size (with its window and cap), and where that kernel refuses, to none (None: the varlen
    kernel), while plain passes still reach cuDNN."""
    log: list = []
    _fake_triton(monkeypatch, log)
    dense = DensePrefill(max_triton_work=16 * 64 * 64)
    _fake_cudnn(dense, log)
    large, kv = torch.zeros(65, 16, 8), torch.zeros(65, 8, 8)
    assert dense.attend(large, kv, kv, 0.1, 32, 0.0).eq(1.0).all()
    assert dense.attend(large, kv, kv, 0.1, 0, 50.0).eq(1.0).all()
    assert dense.attend(large, kv, kv, 0.1).eq(2.0).all()  # plain and large: cuDNN
    assert log == [("triton", 65, 32, 0.0), ("triton", 65, 0, 50.0), ("cudnn", 65)]
    assert dense.calls == 3 and dense.triton_calls == 2

    log.clear()
    _fake_triton(monkeypatch, log, RuntimeError("no kernel image"))
    refused = DensePrefill()
    _fake_cudnn(refused, log)
    with caplog.at_level(logging.WARNING, logger="cadence.model.dense_prefill"):
        assert refused.attend(large, kv, kv, 0.1, 32, 0.0) is None
    assert log == [("triton", 65, 32, 0.0)]  # cuDNN is never asked for a window
    # No kernel for that layer: none for any (one pass never mixes dense and varlen layers).
    assert not refused.triton and not refused.cudnn and not refused.enabled
    assert caplog.text.count("Dense prefill attention is off") == 1
    assert not refused.supports(BF16, 128, BF16, 32, 0.0, CUDA)
    assert not refused.supports(BF16, 128, BF16, 0, 0.0, CUDA)
    assert refused.attend(large, kv, kv, 0.1) is None and log == [("triton", 65, 32, 0.0)]


def test_a_windowed_probe_compiles_the_window_variant(monkeypatch):
    """The probe of a windowed layer asks the Triton kernel alone, with a window under its
    16 tokens (the variant the layer's passes run); a refusal there leaves the layer without
    the path, plain layers on cuDNN."""
    log: list = []
    _fake_triton(monkeypatch, log)
    dense = DensePrefill()
    _fake_cudnn(dense, log)
    cpu = torch.device("cpu")
    assert dense.probe(BF16, 4, 2, 16, cpu, 4096, 0.0) is True
    assert dense.probe(BF16, 4, 2, 16, cpu, 1024, 0.0) is True  # asked once per kind
    assert log == [("triton", 16, 8, 0.0)]
    assert dense.probe(BF16, 4, 2, 16, cpu, 0, 30.0) is True
    assert log[-1] == ("triton", 16, 0, 30.0)
    log.clear()
    _fake_triton(monkeypatch, log, RuntimeError("no kernel image"))
    other = DensePrefill()
    _fake_cudnn(other, log)
    assert other.probe(BF16, 4, 2, 16, cpu, 4096, 0.0) is False
    assert log == [("triton", 16, 8, 0.0)] and not other.triton
    assert other.probe(BF16, 4, 2, 16, cpu) is True  # a plain layer: cuDNN
    assert log[-1] == ("cudnn", 16)


def test_bad_calls_of_the_triton_kernel_are_raised_not_taken_for_refusals(monkeypatch):
    log: list = []
    _fake_triton(monkeypatch, log, ValueError("shapes do not match"))
    dense = DensePrefill()
    with pytest.raises(ValueError, match="shapes"):
        dense.attend(torch.zeros(8, 4, 8), torch.zeros(8, 2, 8), torch.zeros(8, 2, 8), 0.1)
    assert dense.triton and dense.cudnn


def test_probe_asks_once_per_shape_and_a_refusal_turns_it_off():
    dense = DensePrefill(use_triton=False)
    cpu = torch.device("cpu")  # no cuDNN attention on CPU tensors: refused
    assert dense.probe(BF16, 4, 2, 16, cpu) is False
    assert not dense.enabled and dense.calls == 0
    calls = []
    dense2 = DensePrefill(use_triton=False)
    dense2._cudnn = lambda *a: calls.append(a) or torch.zeros(1)
    assert dense2.probe(BF16, 4, 2, 16, cpu) and dense2.probe(BF16, 4, 2, 16, cpu)
    assert dense2.probe(BF16, 8, 2, 16, cpu) and len(calls) == 2  # two shapes, two calls
    assert dense2.calls == 0  # a probe is not a pass


def test_probe_tries_both_kernels_and_passes_with_either(monkeypatch):
    log: list = []
    _fake_triton(monkeypatch, log)
    dense = DensePrefill()
    _fake_cudnn(dense, log, refuse=True)
    cpu = torch.device("cpu")
    assert dense.probe(BF16, 4, 2, 16, cpu) is True
    assert log == [("triton", 16), ("cudnn", 16)] and dense.triton and not dense.cudnn
    assert dense.calls == 0 and dense.triton_calls == 0


@pytest.mark.parametrize("error", [torch.OutOfMemoryError("out of memory"),
                                   getattr(torch, "AcceleratorError", torch.OutOfMemoryError)(
                                       "an illegal memory access")])
def test_memory_and_cuda_errors_are_raised_not_taken_for_refusals(monkeypatch, error):
    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", fail)
    dense = DensePrefill(use_triton=False)
    q, k = torch.randn(8, 4, 16), torch.randn(8, 2, 16)
    with pytest.raises(type(error)):
        dense.attend(q, k, k, 0.25)
    assert dense.enabled


def test_every_layer_or_none():
    """A model whose layers do not all attend densely gets no fresh graphs: a varlen layer
    leaves a bucket's padding rows unwritten, and the next dense layer reads their K/V."""
    from types import SimpleNamespace

    from cadence.model.decoder import CausalLM

    def answer(dtype, heads, kv_heads, head_dim, cache_dtype, window, softcap, device):
        return None if window else 768

    arch = SimpleNamespace(num_heads=16, num_kv_heads=8, head_dim=128, num_layers=4,
                           attn_softcap=0.0, window=lambda i: 0)
    model = SimpleNamespace(attn_backend=SimpleNamespace(dense_prefill_min_tokens=answer),
                            arch=arch)
    find = CausalLM.dense_prefill_min_tokens
    assert find(model, BF16, BF16, CUDA) == 768
    arch.window = lambda i: 4096 if i % 2 else 0  # alternating sliding layers
    assert find(model, BF16, BF16, CUDA) is None
    assert find(SimpleNamespace(attn_backend=object(), arch=arch), BF16, BF16, CUDA) is None


def _gpu() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")


def _pass(t_real: int, t_pad: int, heads: int, kv_heads: int, dim: int, seed: int):
    """One prompt of ``t_real`` tokens from position 0, padded to ``t_pad`` rows as a graph
    bucket pads it: the step buffers' metadata for it, q / k / v as one qkv projection's
    views, and an empty cache."""
    from cadence.model.attention_metadata import AttentionMetadata

    g = torch.Generator(device="cuda").manual_seed(seed)
    page = 16
    blocks = -(-t_real // page)
    qkv = torch.randn(t_pad, (heads + 2 * kv_heads) * dim, generator=g, device="cuda",
                      dtype=BF16)
    q = qkv[:, : heads * dim].view(t_pad, heads, dim)
    k = qkv[:, heads * dim : (heads + kv_heads) * dim].view(t_pad, kv_heads, dim)
    v = qkv[:, (heads + kv_heads) * dim :].view(t_pad, kv_heads, dim)
    cache = torch.zeros(2, blocks + 1, page, kv_heads, dim, dtype=BF16, device="cuda")
    slots = torch.full((t_pad,), -1, dtype=torch.int64, device="cuda")
    slots[:t_real] = torch.arange(page, page + t_real, device="cuda")  # blocks 1.. in order
    rows = 4  # a bucket's padding rows: empty query ranges, length 0
    qsl = torch.full((rows + 1,), t_real, dtype=torch.int32, device="cuda")
    qsl[0] = 0
    seq_lens = torch.zeros(rows, dtype=torch.int32, device="cuda")
    seq_lens[0] = t_real
    tables = torch.zeros(rows, blocks, dtype=torch.int32, device="cuda")
    tables[0] = torch.arange(1, blocks + 1, device="cuda")
    md = AttentionMetadata(num_actual_tokens=t_pad, max_query_len=t_pad, max_seq_len=t_real,
                           query_start_loc=qsl, seq_lens=seq_lens, block_tables=tables,
                           slot_mapping=slots, fresh_prompt=True)
    return q, k, v, cache, md


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("t_real", "t_pad", "heads", "kv_heads", "dim"),
    [(600, 640, 16, 8, 128), (1024, 1024, 16, 8, 128), (700, 704, 8, 8, 64),
     (520, 576, 12, 4, 128)],
)
@pytest.mark.parametrize("kernel", ["triton", "cudnn"])
def test_dense_equals_varlen_and_stores_the_same_kv(t_real, t_pad, heads, kv_heads, dim,
                                                    kernel):
    """The backend with ``fresh_prompt`` (dense: the Triton kernel or cuDNN) against the same
    backend told nothing (the paged varlen kernel): real rows within bf16 rounding of each other and of a float32
    reference, padding rows ignored, and the same K/V bytes in the cache (stored either way,
    through the rope launch)."""
    _gpu()
    from dataclasses import replace

    from cadence.model.attention_metadata import QKRope
    from cadence.model.triton_backend import TritonAttentionBackend

    q, k, v, cache, md = _pass(t_real, t_pad, heads, kv_heads, dim, seed=t_real)
    positions = torch.arange(t_pad, device="cuda")
    inv = 10000.0 ** (-torch.arange(0, dim, 2, device="cuda").float() / dim)
    angles = positions.float()[:, None] * inv[None, :]
    cos_sin = torch.cat([angles.cos(), angles.sin()], dim=1).to(BF16)
    w = torch.rand(dim, device="cuda", dtype=BF16) + 0.5
    rope = QKRope(positions, cos_sin, w, w, 1e-6)
    scale = dim**-0.5
    backend = TritonAttentionBackend(num_sms=132, dense_prefill=DensePrefill(
        min_tokens=512, use_triton=kernel == "triton"))
    cache_dense, cache_varlen = cache.clone(), cache.clone()
    dense = backend.forward(q, k, v, cache_dense, md, scale, rope=rope)
    assert backend.dense_prefill.calls == 1  # a kernel ran, not the refusal path
    assert backend.dense_prefill.triton_calls == (kernel == "triton")
    varlen = backend.forward(q, k, v, cache_varlen, replace(md, fresh_prompt=False), scale,
                             rope=rope)
    assert backend.dense_prefill.calls == 1 and backend.dense_prefill.enabled
    assert torch.equal(cache_dense, cache_varlen)
    # The float32 reference from the stored (normed, rotated) K/V and the rotated q.
    q_rot, k_rot = rope.apply(q, k)
    ks = cache_dense[0, 1:].reshape(-1, kv_heads, dim)[:t_real].float()
    vs = cache_dense[1, 1:].reshape(-1, kv_heads, dim)[:t_real].float()
    assert torch.equal(ks.to(BF16), k_rot[:t_real])
    ref = torch.nn.functional.scaled_dot_product_attention(
        q_rot[:t_real].float().transpose(0, 1), ks.transpose(0, 1), vs.transpose(0, 1),
        is_causal=True, scale=scale, enable_gqa=True).transpose(0, 1)
    for got in (dense[:t_real].float(), varlen[:t_real].float()):
        assert (got - ref).abs().max().item() < 2e-2
    assert dense.shape == (t_pad, heads, dim) and torch.isfinite(dense).all()


@pytest.mark.gpu
@pytest.mark.parametrize(("t_real", "t_pad", "window", "cap"),
                         [(600, 640, 100, 0.0), (1024, 1024, 700, 0.0), (520, 576, 0, 30.0),
                          (700, 704, 256, 50.0)])
def test_windowed_and_capped_dense_equals_varlen(t_real, t_pad, window, cap):
    """A layer with a sliding window or soft cap: the Triton kernel's dense pass against the
    backend's varlen pass with the same window and cap, real rows within bf16 rounding."""
    _gpu()
    from dataclasses import replace

    from cadence.model.triton_backend import TritonAttentionBackend

    q, k, v, cache, md = _pass(t_real, t_pad, 16, 8, 128, seed=t_real + window)
    q = q * 4 if cap else q  # scores past the cap
    backend = TritonAttentionBackend(num_sms=132, dense_prefill=DensePrefill(min_tokens=512))
    scale = 128**-0.5
    dense = backend.forward(q, k, v, cache.clone(), md, scale, sliding_window=window,
                            softcap=cap)
    assert backend.dense_prefill.triton_calls == 1
    varlen = backend.forward(q, k, v, cache.clone(), replace(md, fresh_prompt=False), scale,
                             sliding_window=window, softcap=cap)
    assert backend.dense_prefill.triton_calls == 1
    assert (dense[:t_real].float() - varlen[:t_real].float()).abs().max().item() < 2e-2
