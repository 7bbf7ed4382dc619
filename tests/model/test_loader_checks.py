"""The loader's less travelled paths: FP8 KV-cache scales, unindexed multi-file checkpoints,
the missing-tensor count and dummy biases."""

from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from cadence.model.attention import TorchAttentionBackend
from cadence.model.loader import build_model
from cadence.model.registry import resolve_model
from tests.model.helpers import hf_config, load_ours, make_hf_model, save_hf_model


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory) -> str:
    hf = make_hf_model("qwen2", tie=False, seed=3)
    return str(save_hf_model(hf, tmp_path_factory.mktemp("qwen2")))


def _copy_with(src: str, dst, edit) -> None:
    """A copy of the checkpoint ``src`` in ``dst`` with its tensors edited by ``edit``."""
    for name in os.listdir(src):
        if not name.endswith(".safetensors"):
            with open(os.path.join(src, name), "rb") as f:
                (dst / name).write_bytes(f.read())
    tensors = load_file(os.path.join(src, "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(dst / "model.safetensors"), {"format": "pt"})


def _attn(model, layer: int):
    return model.model.layers[layer].self_attn


def test_kv_cache_scales_land_in_their_layers(qwen2_dir, tmp_path) -> None:
    """k_scale / v_scale per layer, the older k_proj.output_scale, and one kv_scale serving
    keys and values alike."""
    scales = {"model.layers.0.self_attn.k_scale": 0.25,
              "model.layers.0.self_attn.v_proj.output_scale": 0.5,
              "model.layers.1.self_attn.kv_scale": 2.0}
    _copy_with(qwen2_dir, tmp_path,
               lambda t: t.update({n: torch.tensor(v) for n, v in scales.items()}))
    model = load_ours(tmp_path)
    assert (_attn(model, 0).k_scale, _attn(model, 0).v_scale) == (0.25, 0.5)
    assert (_attn(model, 1).k_scale, _attn(model, 1).v_scale) == (2.0, 2.0)


@pytest.mark.parametrize(("name", "value", "says"), [
    ("model.layers.2.self_attn.k_scale", 1.0, "of layer 2, but the model has 2 layers"),
    ("model.layers.0.self_attn.v_scale", 0.0, "must be positive and finite, got 0.0"),
    ("model.layers.0.self_attn.k_scale", -1.0, "must be positive and finite, got -1.0"),
    ("model.layers.0.self_attn.kv_scale", float("inf"), "must be positive and finite, got inf"),
    ("model.layers.0.self_attn.k_scale", [1.0, 2.0], "is one number, got shape [2]"),
])
def test_bad_kv_cache_scales_are_named(qwen2_dir, tmp_path, name, value, says) -> None:
    """Each mistake in a KV-cache scale is told as itself: the layer, the value or the shape."""
    _copy_with(qwen2_dir, tmp_path, lambda t: t.update({name: torch.tensor(value)}))
    with pytest.raises(ValueError, match="KV-cache scale") as err:
        load_ours(tmp_path)
    assert name in str(err.value) and says in str(err.value)


def test_unindexed_checkpoint_files_are_all_read(qwen2_dir, tmp_path) -> None:
    """Several *.safetensors files without an index: every one of them is read."""
    tensors = load_file(os.path.join(qwen2_dir, "model.safetensors"))
    names = sorted(tensors)
    half = len(names) // 2
    for i, part in enumerate((names[:half], names[half:])):
        save_file({n: tensors[n] for n in part}, str(tmp_path / f"part-{i}.safetensors"),
                  {"format": "pt"})
    (tmp_path / "config.json").write_bytes(
        open(os.path.join(qwen2_dir, "config.json"), "rb").read())
    ours = dict(load_ours(tmp_path).named_parameters())
    assert torch.equal(ours["model.norm.weight"], tensors["model.norm.weight"])
    assert torch.equal(ours["lm_head.weight"], tensors["lm_head.weight"])
    assert torch.equal(ours["model.embed_tokens.weight"], tensors["model.embed_tokens.weight"])


def test_missing_tensors_are_counted(qwen2_dir, tmp_path) -> None:
    one = "model.layers.0.mlp.up_proj.weight"
    _copy_with(qwen2_dir, tmp_path, lambda t: t.pop(one))
    with pytest.raises(ValueError) as err:
        load_ours(tmp_path)
    assert str(err.value) == f"checkpoint {str(tmp_path)!r} is missing tensor {one!r}."
    _copy_with(qwen2_dir, tmp_path, lambda t: [t.pop(n) for n in sorted(t)[:3]])
    with pytest.raises(ValueError, match=r"is missing tensor '.+' \(and 2 more\)\.$"):
        load_ours(tmp_path)


def test_dummy_biases_are_zero(tmp_path) -> None:
    hf_config("llama-bias", tie=False).save_pretrained(tmp_path)
    spec = resolve_model(str(tmp_path))
    model = build_model(spec, torch.float32, "cpu", "dummy", TorchAttentionBackend(), 0)
    biases = {n: p for n, p in model.named_parameters() if n.endswith(".bias")}
    assert {n.rsplit(".", 2)[-2] for n in biases} == {"qkv_proj", "o_proj", "gate_up_proj",
                                                       "down_proj"}
    assert all(torch.equal(p, torch.zeros_like(p)) for p in biases.values())


def test_the_backend_leaves_the_decode_order_to_decode_config(monkeypatch) -> None:
    """The engine's Triton backend leaves decode attention's tile (and its early load order)
    to ``decode_config``; with ``early_decode`` off it hands over the plain order."""
    pytest.importorskip("triton")
    from cadence.model import triton_backend
    from cadence.model.attention_backend import make_attention_backend

    seen = []
    monkeypatch.setattr(triton_backend, "paged_decode_attention",
                        lambda *args, config=None, qkv_releases_early=False, **kwargs:
                        seen.append((config, qkv_releases_early)))
    md = type("Md", (), {"is_decode_only": True})()
    q = torch.zeros(1, 4, 16)
    for early in (True, False):
        backend = triton_backend.TritonAttentionBackend(early_decode=early, num_sms=1)
        for releases in (False, True):
            backend.forward(q, q[:, :2], q[:, :2], torch.zeros(2, 1, 16, 2, 16), md, 0.25,
                            qkv_releases_early=releases)
    # The hint that the qkv projection releases early reaches decode_config's choice.
    assert seen[0] == (None, False) and seen[1] == (None, True)
    assert all(config is not None and not config.early for config, _ in seen[2:])
    # A rope launch of its own between the projection and attention: no early order.
    from cadence.model.attention_metadata import QKRope

    seen.clear()
    rope = QKRope(torch.zeros(1, dtype=torch.long), torch.zeros(4, 16), None, None, 0.0)
    backend = triton_backend.TritonAttentionBackend(fuse_rope=False, num_sms=1)
    backend.forward(q, q[:, :2], q[:, :2], torch.zeros(2, 1, 16, 2, 16), md, 0.25, rope=rope,
                    qkv_releases_early=True)
    assert seen == [(None, False)]
    assert make_attention_backend("cuda").early_decode
    assert make_attention_backend("cpu").name != "triton"  # the reference off CUDA
