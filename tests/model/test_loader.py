"""Loading safetensors checkpoints (single and sharded), dummy weights and the loader's errors."""

from __future__ import annotations

import json
import os
import random
import re

import pytest
import torch
from safetensors.torch import load_file, save_file

from cadence.model.attention import TorchAttentionBackend
from cadence.model.loader import build_model, checkpoint_files, checkpoint_names
from cadence.model.registry import resolve_model
from tests.model.helpers import (
    VOCAB,
    Chunk,
    hf_logits,
    load_ours,
    make_batch,
    make_hf_model,
    run_ours,
    save_hf_model,
)


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):
    hf = make_hf_model("qwen2", tie=False, seed=3)
    return hf, save_hf_model(hf, tmp_path_factory.mktemp("qwen2"))


def _rewrite(path, edit) -> None:
    file = os.path.join(path, "model.safetensors")
    tensors = load_file(file)
    edit(tensors)
    save_file(tensors, file, {"format": "pt"})


def _copy_checkpoint(src, dst) -> None:
    for name in os.listdir(src):
        with open(os.path.join(src, name), "rb") as f, open(os.path.join(dst, name), "wb") as g:
            g.write(f.read())


def test_sharded_checkpoint_loads_like_transformers(tmp_path):
    hf = make_hf_model("qwen3", tie=True, seed=5)
    save_hf_model(hf, tmp_path, max_shard_size="40KB")
    files = checkpoint_files(str(tmp_path))
    assert len(files) > 2 and (tmp_path / "model.safetensors.index.json").is_file()
    model = load_ours(tmp_path)
    tokens = [random.Random(0).randrange(VOCAB) for _ in range(9)]
    logits = run_ours(model, make_batch([Chunk(tokens, 0, [3, 1, 2])]))
    torch.testing.assert_close(logits, hf_logits(hf, tokens), atol=1e-4, rtol=0)


def test_weights_land_in_fused_parameters(qwen2):
    hf, path = qwen2
    model = load_ours(path)
    ours = dict(model.named_parameters())
    theirs = dict(hf.named_parameters())
    q, k, v = (theirs[f"model.layers.1.self_attn.{n}_proj.weight"] for n in "qkv")
    assert torch.equal(ours["model.layers.1.self_attn.qkv_proj.weight"], torch.cat([q, k, v]))
    qb, kb, vb = (theirs[f"model.layers.1.self_attn.{n}_proj.bias"] for n in "qkv")
    assert torch.equal(ours["model.layers.1.self_attn.qkv_proj.bias"], torch.cat([qb, kb, vb]))
    gate, up = (theirs[f"model.layers.0.mlp.{n}_proj.weight"] for n in ("gate", "up"))
    assert torch.equal(ours["model.layers.0.mlp.gate_up_proj.weight"], torch.cat([gate, up]))
    assert torch.equal(ours["lm_head.weight"], theirs["lm_head.weight"])
    assert not any(p.requires_grad for p in model.parameters())


def test_tied_checkpoint_has_no_lm_head_and_may_carry_one(tmp_path):
    hf = make_hf_model("llama", tie=True, seed=6)
    save_hf_model(hf, tmp_path)
    assert "lm_head.weight" not in load_file(tmp_path / "model.safetensors")
    model = load_ours(tmp_path)
    assert model.lm_head is None
    hidden = torch.randn(3, 64)
    expected = hidden @ hf.get_input_embeddings().weight.detach().T
    torch.testing.assert_close(model.compute_logits(hidden), expected)
    # A tied checkpoint that stores the head anyway, plus a stale rotary buffer: both ignored.
    _rewrite(
        tmp_path,
        lambda t: t.update(
            {
                "lm_head.weight": torch.zeros(VOCAB, 64),
                "model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(8),
            }
        ),
    )
    assert torch.equal(
        load_ours(tmp_path).model.embed_tokens.weight, model.model.embed_tokens.weight
    )


def test_missing_tensor_is_named(qwen2, tmp_path):
    _copy_checkpoint(qwen2[1], tmp_path)
    _rewrite(tmp_path, lambda t: t.pop("model.layers.1.self_attn.k_proj.bias"))
    with pytest.raises(
        ValueError, match=r"missing tensor 'model\.layers\.1\.self_attn\.k_proj\.bias'"
    ):
        load_ours(tmp_path)


def test_misshaped_tensor_is_named_with_both_shapes(qwen2, tmp_path):
    _copy_checkpoint(qwen2[1], tmp_path)
    _rewrite(
        tmp_path, lambda t: t.update({"model.layers.0.mlp.up_proj.weight": torch.zeros(95, 64)})
    )
    with pytest.raises(ValueError) as err:
        load_ours(tmp_path)
    message = str(err.value)
    assert "model.layers.0.mlp.up_proj.weight" in message
    assert "[95, 64]" in message and "[96, 64]" in message


def test_non_float_tensor_is_named_with_its_dtype(qwen2, tmp_path):
    _copy_checkpoint(qwen2[1], tmp_path)
    name = "model.layers.1.mlp.down_proj.weight"
    _rewrite(tmp_path, lambda t: t.update({name: t[name].to(torch.int8)}))
    with pytest.raises(ValueError) as err:
        load_ours(tmp_path)
    message = str(err.value)
    assert name in message and "dtype I8" in message and "BF16" in message
    assert "\n" not in message


@pytest.mark.parametrize(("quant", "fragment"), [
    ({"quant_method": "awq", "bits": 4}, "Unsupported quantization method 'awq'"),
    ({"quant_method": "fp8", "fmt": "e5m2"}, "FP8 checkpoint format 'e5m2' is not supported"),
    ({"quant_method": "fp8", "weight_block_size": 128}, "weight_block_size must be two"),
    ({"quant_method": "fp8", "weight_block_size": ["a", 2]}, "weight_block_size must be two"),
    ({"quant_method": "fp8", "weight_block_size": [0, 128]}, "weight_block_size must be two"),
    ({"quant_method": "fp8", "activation_scheme": "bogus"}, "activation_scheme 'bogus'"),
    ({"quant_method": "fp8", "modules_to_not_convert": "lm_head"},
     "modules_to_not_convert must be a list"),
    ({"quant_method": "fp8", "ignored_layers": [3]}, "ignored_layers must be a list"),
    ({"quant_method": "fp8", "ignored_layers": ["re:(unclosed"]}, "is not a regular expression"),
])
def test_unsupported_quantization_is_a_one_line_error(qwen2, tmp_path, quant, fragment):
    _copy_checkpoint(qwen2[1], tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"] = quant
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError) as err:
        resolve_model(str(tmp_path))
    message = str(err.value)
    assert fragment in message and "\n" not in message


_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _fp8_checkpoint(src, dst, block: list[int] | None, keep: tuple[str, ...] = (),
                    keep_key: str = "modules_to_not_convert") -> dict[str, torch.Tensor]:
    """``src``'s linear weights stored as e4m3 with block-wise scales (``block``) or one scale
    per output channel, but those of the modules ``keep`` names (as ``keep_key`` lists them:
    stored as they were); returns the weights they stand for (the dequantized values)."""
    _copy_checkpoint(src, dst)
    config = json.loads((dst / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3",
                                     "activation_scheme": "dynamic",
                                     **({"weight_block_size": block} if block else {}),
                                     **({keep_key: list(keep)} if keep else {})}
    (dst / "config.json").write_text(json.dumps(config))
    tensors = load_file(str(dst / "model.safetensors"))
    meant = {}
    for name in [n for n in tensors if n.endswith(".weight") and n.split(".")[-2] in _LINEAR
                 and n.removesuffix(".weight") not in keep]:
        w = tensors[name].float()
        rows, cols = w.shape
        if block:
            br, bc = block
            nr, nc = -(-rows // br), -(-cols // bc)
            padded = torch.zeros(nr * br, nc * bc)
            padded[:rows, :cols] = w
            amax = padded.abs().reshape(nr, br, nc, bc).amax(dim=(1, 3)).clamp(min=1e-6)
            scale = amax / 448.0
            full = scale.repeat_interleave(br, 0)[:rows].repeat_interleave(bc, 1)[:, :cols]
            tensors[name + "_scale_inv"] = scale
        else:
            scale = (w.abs().amax(dim=1) / 448.0).clamp(min=1e-6)
            full = scale[:, None].expand(rows, cols)
            tensors[name + "_scale"] = scale
        q = (w / full).to(torch.float8_e4m3fn)
        tensors[name] = q
        meant[name] = q.float() * full
    save_file(tensors, str(dst / "model.safetensors"), {"format": "pt"})
    return meant


@pytest.mark.parametrize("block", [[16, 16], [24, 40], None], ids=["block16", "block24x40",
                                                                   "per-channel"])
def test_fp8_checkpoint_loads_dequantized(qwen2, tmp_path, block):
    """Every FP8 weight lands as its e4m3 value times its scale (a block's, or its output
    channel's); the rest of the checkpoint loads as before; the logits are those of a float
    model with the dequantized weights."""
    hf, src = qwen2
    meant = _fp8_checkpoint(src, tmp_path, block)
    ours = load_ours(tmp_path)
    params = dict(ours.named_parameters())
    q = params["model.layers.0.self_attn.qkv_proj.weight"]
    rows = meant["model.layers.0.self_attn.q_proj.weight"].shape[0]
    assert torch.equal(q[:rows], meant["model.layers.0.self_attn.q_proj.weight"])
    assert torch.equal(params["model.layers.1.mlp.down_proj.weight"],
                       meant["model.layers.1.mlp.down_proj.weight"])
    # The reference: transformers with the dequantized weights (the FP8 rounding is real: the
    # logits move from the float checkpoint's).
    import copy

    ref = copy.deepcopy(hf)
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if name in meant:
                p.copy_(meant[name])
    prompt = [5, 9, 11, 3, 40, 41, 7]
    batch = make_batch([Chunk(prompt, 0, [1, 2, 3])])
    got = run_ours(ours, batch)
    torch.testing.assert_close(got, hf_logits(ref, prompt), atol=2e-4, rtol=0)
    assert not torch.allclose(hf_logits(ref, prompt), hf_logits(hf, prompt), atol=1e-3)


def test_moe_checkpoint_fills_each_expert(tmp_path):
    from tests.hf_models import build_hf_model

    hf = build_hf_model("qwen3-moe", tmp_path)
    ours = dict(load_ours(tmp_path).named_parameters())
    theirs = dict(hf.named_parameters())
    layer = "model.layers.0.mlp"
    assert torch.equal(ours[f"{layer}.gate.weight"], theirs[f"{layer}.gate.weight"])
    assert torch.equal(ours[f"{layer}.experts.gate_up_proj"], theirs[f"{layer}.experts.gate_up_proj"])
    assert torch.equal(ours[f"{layer}.experts.down_proj"], theirs[f"{layer}.experts.down_proj"])
    dense = "model.layers.1.mlp"  # an mlp_only layer
    gate, up = (theirs[f"{dense}.{n}_proj.weight"] for n in ("gate", "up"))
    assert torch.equal(ours[f"{dense}.gate_up_proj.weight"], torch.cat([gate, up]))


def test_unexpected_tensor_is_named(qwen2, tmp_path):
    _copy_checkpoint(qwen2[1], tmp_path)
    _rewrite(tmp_path, lambda t: t.update({"model.layers.0.extra.weight": torch.zeros(2)}))
    with pytest.raises(ValueError, match=r"unexpected tensor 'model\.layers\.0\.extra\.weight'"):
        load_ours(tmp_path)


def test_directory_without_safetensors(qwen2, tmp_path):
    with open(os.path.join(qwen2[1], "config.json")) as f:
        config = json.load(f)
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="no safetensors"):
        load_ours(tmp_path)


def test_dummy_weights_are_seeded_and_sane(qwen2):
    spec = resolve_model(str(qwen2[1]))

    def build(seed: int):
        return build_model(spec, torch.float32, "cpu", "dummy", TorchAttentionBackend(), seed)

    a, b, c = build(1), build(1), build(2)
    for (name, pa), pb, pc in zip(
        a.named_parameters(), b.parameters(), c.parameters(), strict=True
    ):
        assert torch.equal(pa, pb), name
        if name.endswith("norm.weight"):
            assert torch.equal(pa, torch.ones_like(pa))
        elif name.endswith("bias"):
            assert torch.equal(pa, torch.zeros_like(pa))
        else:
            assert not torch.equal(pa, pc) and 0.01 < pa.std() < 0.03, name


@pytest.mark.parametrize("family", ["gemma3", "qwen3-moe"])
def test_dummy_weights_of_new_families(family, tmp_path):
    """Gemma's (1 + w) norms get w = 0 (unit scale); expert tensors are random like matrices."""
    from tests.model.helpers import hf_config

    hf_config(family, tie=False).save_pretrained(tmp_path)
    spec = resolve_model(str(tmp_path))
    model = build_model(spec, torch.float32, "cpu", "dummy", TorchAttentionBackend(), 0)
    unit = 0.0 if family == "gemma3" else 1.0
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            assert torch.equal(p, torch.full_like(p, unit)), name
        else:
            assert 0.01 < p.std() < 0.03, name


def test_bfloat16_build_keeps_rope_table_and_weights_in_dtype(qwen2):
    spec = resolve_model(str(qwen2[1]))
    model = build_model(spec, torch.bfloat16, "cpu", "auto", TorchAttentionBackend(), 0)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    table = model.rotary_emb.cos_sin
    assert table.dtype == torch.bfloat16 and torch.equal(
        table[0, :8], torch.ones(8, dtype=table.dtype)
    )


def test_presets_need_dummy_load_format():
    spec = resolve_model("qwen3-0.6b")
    for load_format in ("auto", "safetensors"):
        with pytest.raises(ValueError, match="load_format"):
            build_model(spec, torch.float32, "cpu", load_format, TorchAttentionBackend(), 0)
    with pytest.raises(ValueError, match="load_format"):
        build_model(spec, torch.float32, "cpu", "pt", TorchAttentionBackend(), 0)


@pytest.mark.parametrize(
    "family", ["llama-bias", "qwen3", "mistral", "phi3", "gemma2", "gemma3", "qwen3-moe"]
)
def test_checkpoint_names_cover_every_element_once(family):
    """Every element of every parameter is the destination of exactly one checkpoint tensor
    (fused q/k/v and gate/up slices, whole Phi-3 tensors, per-expert slices)."""
    from cadence.model.decoder import CausalLM
    from tests.model.helpers import hf_config

    model = CausalLM(hf_config(family, tie=False), TorchAttentionBackend())
    hits = {name: torch.zeros(p.shape) for name, p in model.named_parameters()}
    for target in checkpoint_names(model.arch).values():
        region = hits[target.param]
        if target.expert is not None:
            region = region[target.expert]
        if target.num_rows is not None:
            region = region.narrow(0, target.row_start, target.num_rows)
        region += 1
    for name, count in hits.items():
        assert torch.equal(count, torch.ones_like(count)), name


def test_checkpoint_names_cover_every_parameter_once(qwen2):
    model = load_ours(qwen2[1])
    targets = checkpoint_names(model.arch)
    rows: dict[str, int] = {}
    for target in targets.values():
        shape = dict(model.named_parameters())[target.param].shape
        rows[target.param] = rows.get(target.param, 0) + (target.num_rows or shape[0])
    params = dict(model.named_parameters())
    assert set(rows) == set(params)
    assert all(rows[name] == p.shape[0] for name, p in params.items())


def test_fp8_checkpoint_shards_slice_the_dequantized_weights(qwen2, tmp_path):
    """A tensor-parallel rank of an fp8 checkpoint holds its slice of the dequantized weights."""
    _fp8_checkpoint(qwen2[1], tmp_path, [16, 16])
    spec = resolve_model(str(tmp_path))
    whole = dict(build_model(spec, torch.float32, "cpu", "auto", TorchAttentionBackend(), 0)
                 .named_parameters())
    for rank in range(2):
        part = dict(build_model(spec, torch.float32, "cpu", "auto", TorchAttentionBackend(), 0,
                                rank, 2).named_parameters())
        down = "model.layers.0.mlp.down_proj.weight"
        cols = whole[down].shape[1] // 2
        assert torch.equal(part[down], whole[down][:, rank * cols:(rank + 1) * cols])


def _dequantized(t: dict, n: str) -> None:
    """Weight ``n`` stored in float32 again, its scale left behind."""
    t[n] = t[n].float()


@pytest.mark.parametrize(("edit", "fragment"), [
    (lambda t, n: t.pop(n + "_scale_inv"), "has no scale"),
    (lambda t, n: t.update({n + "_scale_inv": t[n + "_scale_inv"][:1]}), "does not tile"),
    (lambda t, n: t[n + "_scale_inv"].fill_(float("nan")), "positive and finite"),
    (lambda t, n: t[n + "_scale_inv"].neg_(), "positive and finite"),
    (lambda t, n: t.update({n + "_scale_inv": t[n + "_scale_inv"].int()}), "floating point"),
    (lambda t, n: t.update({n + "_scale": torch.ones(t[n].shape[0])}), "two scales"),
    (_dequantized, "stored in F32, not F8_E4M3"),
    (lambda t, n: t.update({n.replace("weight", "input_scale"): torch.ones(5)}), "one number"),
    (lambda t, n: t.update({n.replace("weight", "input_scale"): torch.tensor(-1.0)}),
     "positive and finite"),
])
def test_fp8_scale_mistakes_are_named(qwen2, tmp_path, edit, fragment):
    """A scale that would make a weight other than written (missing, misshaped, not a positive
    float, a second one, one left on a float weight, a static input scale of several values)
    is an error naming its weight."""
    _fp8_checkpoint(qwen2[1], tmp_path, [16, 16])
    name = "model.layers.1.mlp.up_proj.weight"
    _rewrite(tmp_path, lambda t: edit(t, name))
    with pytest.raises(ValueError, match=fragment) as err:
        load_ours(tmp_path)
    assert name.removesuffix("weight") in str(err.value) and "\n" not in str(err.value)


def test_a_scale_of_no_weight_is_an_unexpected_tensor(qwen2, tmp_path):
    _fp8_checkpoint(qwen2[1], tmp_path, None)
    stray = "model.layers.9.mlp.up_proj.weight_scale"  # the model has two layers
    _rewrite(tmp_path, lambda t: t.update({stray: torch.ones(3)}))
    with pytest.raises(ValueError,
                       match=f"unexpected tensor '{re.escape(stray)}'.*does not hold"):
        load_ours(tmp_path)


@pytest.mark.parametrize("keep_key", ["modules_to_not_convert", "ignored_layers"])
def test_modules_an_fp8_checkpoint_keeps_in_float_stay_unquantized(qwen2, tmp_path, keep_key):
    """The modules the config lists (transformers' modules_to_not_convert, vLLM's
    ignored_layers) keep their float weights when the model runs in FP8; a fused projection
    is kept when all its parts are listed; the others turn FP8."""
    from cadence.model.fp8 import Fp8Linear

    keep = ("model.layers.0.mlp.down_proj", "model.layers.1.self_attn.q_proj",
            "model.layers.1.self_attn.k_proj", "model.layers.1.self_attn.v_proj")
    _fp8_checkpoint(qwen2[1], tmp_path, [16, 16], keep, keep_key)
    stored = load_file(str(tmp_path / "model.safetensors"))
    spec = resolve_model(str(tmp_path))
    model = build_model(spec, torch.float32, "cpu", "auto", TorchAttentionBackend(), 0,
                        quantization="fp8")
    modules = dict(model.named_modules())
    down = modules["model.layers.0.mlp.down_proj"]
    assert not isinstance(down, Fp8Linear)
    assert torch.equal(down.weight, stored["model.layers.0.mlp.down_proj.weight"])
    assert not isinstance(modules["model.layers.1.self_attn.qkv_proj"], Fp8Linear)
    fp8 = {n for n, m in modules.items() if isinstance(m, Fp8Linear)}
    assert fp8 == {"model.layers.0.self_attn.qkv_proj", "model.layers.0.self_attn.o_proj",
                   "model.layers.0.mlp.gate_up_proj", "model.layers.1.self_attn.o_proj",
                   "model.layers.1.mlp.gate_up_proj", "model.layers.1.mlp.down_proj"}


@pytest.mark.gpu
def test_an_fp8_checkpoint_on_an_fp8_gpu_keeps_its_float_modules(qwen2, tmp_path):
    """Where the GPU has FP8 tensor cores an FP8 checkpoint runs in FP8 unasked, all but the
    modules its config keeps in float; their weights are the stored ones, in the model
    dtype."""
    from cadence.model.fp8 import Fp8Linear, fp8_supported

    if not fp8_supported(torch.device("cuda")):
        pytest.skip("needs FP8 tensor cores")
    keep = ("model.layers.0.mlp.down_proj", "lm_head")
    _fp8_checkpoint(qwen2[1], tmp_path, [16, 16], keep)
    stored = load_file(str(tmp_path / "model.safetensors"))
    model = build_model(resolve_model(str(tmp_path)), torch.bfloat16, "cuda", "auto",
                        TorchAttentionBackend(), 0)
    modules = dict(model.named_modules())
    down = modules["model.layers.0.mlp.down_proj"]
    assert not isinstance(down, Fp8Linear) and down.weight.dtype == torch.bfloat16
    assert torch.equal(down.weight.cpu(),
                       stored["model.layers.0.mlp.down_proj.weight"].bfloat16())
    assert isinstance(modules["model.layers.1.mlp.down_proj"], Fp8Linear)
    assert isinstance(modules["model.layers.0.self_attn.qkv_proj"], Fp8Linear)


def test_a_fused_projection_kept_in_part_stays_whole_in_float(qwen2, tmp_path, caplog):
    """gate_proj listed, up_proj not: they are one weight here, kept in float (the stored
    gate rows exactly), with a warning."""
    from cadence.model.fp8 import Fp8Linear

    _fp8_checkpoint(qwen2[1], tmp_path, None, ("model.layers.0.mlp.gate_proj",))
    stored = load_file(str(tmp_path / "model.safetensors"))
    spec = resolve_model(str(tmp_path))
    with caplog.at_level("WARNING", logger="cadence.model.fp8"):
        model = build_model(spec, torch.float32, "cpu", "auto", TorchAttentionBackend(), 0,
                            quantization="fp8")
    gate_up = dict(model.named_modules())["model.layers.0.mlp.gate_up_proj"]
    assert not isinstance(gate_up, Fp8Linear)
    gate = stored["model.layers.0.mlp.gate_proj.weight"]
    assert torch.equal(gate_up.weight[: gate.shape[0]], gate)
    assert "some parts of model.layers.0.mlp.gate_up_proj" in caplog.text


def test_a_tied_checkpoint_may_store_its_head_in_fp8(qwen2, tmp_path):
    """A tied checkpoint that still stores an FP8 lm_head with its scale loads (the head is
    the embedding's)."""
    _fp8_checkpoint(qwen2[1], tmp_path, None)
    config = json.loads((tmp_path / "config.json").read_text())
    config["tie_word_embeddings"] = True
    (tmp_path / "config.json").write_text(json.dumps(config))

    def head_in_fp8(t: dict) -> None:
        w = t["model.embed_tokens.weight"].float()
        scale = (w.abs().amax(dim=1) / 448.0).clamp(min=1e-6)
        t["lm_head.weight"] = (w / scale[:, None]).to(torch.float8_e4m3fn)
        t["lm_head.weight_scale"] = scale

    _rewrite(tmp_path, head_in_fp8)
    ours = load_ours(tmp_path)
    assert ours.lm_head is None


def test_a_static_scheme_loads_with_its_input_scales(qwen2, tmp_path):
    """activation_scheme static with one input_scale per projection (AutoFP8's form): the
    weights load as the dynamic checkpoint's (the input scales are checked, not applied)."""
    meant = _fp8_checkpoint(qwen2[1], tmp_path, None)
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"]["activation_scheme"] = "static"
    (tmp_path / "config.json").write_text(json.dumps(config))
    _rewrite(tmp_path, lambda t: t.update({n.replace("weight", "input_scale"): torch.tensor(0.02)
                                           for n in meant}))
    params = dict(load_ours(tmp_path).named_parameters())
    assert torch.equal(params["model.layers.1.mlp.down_proj.weight"],
                       meant["model.layers.1.mlp.down_proj.weight"])


def test_kept_unquantized_reads_whole_dotted_parts_and_patterns():
    from cadence.model.fp8 import KeepList, kept_unquantized

    def kept(name: str, *entries: str, experts: int = 0) -> bool:
        return kept_unquantized(name, KeepList(entries), experts)

    name = "model.layers.10.mlp.down_proj"
    assert kept(name, "down_proj")
    assert kept(name, "model.layers.10")
    assert kept(name, "model.layers.10.mlp.down_proj")
    assert kept(name, "re:.*layers\\.10\\.mlp")
    assert not kept(name, "model.layers.1")
    assert not kept(name, "down")
    assert not kept(name, "re:.*self_attn")
    assert not kept(name)
    assert kept("model.layers.3.self_attn.qkv_proj", "model.layers.3.self_attn.k_proj")
    experts = "model.layers.0.mlp.experts"
    every = tuple(f"{experts}.{i}.{p}" for i in range(2) for p in ("gate_proj", "up_proj",
                                                                  "down_proj"))
    assert kept(experts, *every, experts=2)
    assert kept(experts, every[0], experts=2)  # one expert's part: the layer's one weight
    assert kept(experts, "mlp.experts", experts=2)
    assert not kept(experts, "model.layers.1.mlp.experts", experts=2)
    assert not kept(experts, "model.layers.0.mlp.gate", experts=2)


@pytest.mark.parametrize("index", [
    "{}", '{"weight_map": []}', "[1, 2]", '{"weight_map": {"a": 1}}', "{not json",
    '{"weight_map": {"a": "../elsewhere.safetensors"}}', '{"weight_map": null}',
])
def test_a_malformed_index_is_a_one_line_error_naming_it(qwen2, tmp_path, index):
    _copy_checkpoint(qwen2[1], tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text(index)
    with pytest.raises(ValueError, match="model.safetensors.index.json") as err:
        checkpoint_files(str(tmp_path))
    assert "\n" not in str(err.value)


def test_pickle_checkpoints_are_named_as_not_loaded(qwen2, tmp_path):
    with open(os.path.join(qwen2[1], "config.json")) as f:
        (tmp_path / "config.json").write_text(f.read())
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(ValueError, match=r"no safetensors.*pickle checkpoints \(\.bin"):
        load_ours(tmp_path)


def test_a_per_tensor_scale_multiplies_the_whole_weight(qwen2, tmp_path):
    """vLLM's per-tensor form: one scale for a whole weight (shape [] or [1]); the loaded
    weight is its e4m3 value times that scale."""
    _fp8_checkpoint(qwen2[1], tmp_path, None)
    names = ("model.layers.1.mlp.down_proj.weight", "model.layers.0.mlp.down_proj.weight")
    meant = {}

    def per_tensor(t: dict) -> None:
        for name, shape in zip(names, ([], [1]), strict=True):
            w = t[name].float() * t.pop(name + "_scale")[:, None]
            scale = (w.abs().max() / 448.0) * 3.0  # not the per-channel values
            q = (w / scale).to(torch.float8_e4m3fn)
            t[name], t[name + "_scale"] = q, scale.reshape(shape)
            meant[name] = q.double() * scale.double()

    _rewrite(tmp_path, per_tensor)
    params = dict(load_ours(tmp_path).named_parameters())
    for name in names:
        assert meant[name].abs().max() > 0.01
        torch.testing.assert_close(params[name].double(), meant[name], atol=0, rtol=1e-6)


def test_kept_patterns_match_at_the_start_and_reach_the_experts():
    """A ``re:`` entry matches a module's name from its start (re.match, as transformers and
    compressed-tensors read it), and one that names experts' parts keeps the experts."""
    from cadence.model.fp8 import KeepList, kept_unquantized

    name = "model.layers.10.mlp.down_proj"
    assert not kept_unquantized(name, KeepList(("re:mlp\\.down_proj",)))
    assert not kept_unquantized(name, KeepList(("re:layers\\.10",)))
    assert kept_unquantized(name, KeepList(("re:model\\.layers\\.10\\.mlp",)))
    experts = "model.layers.0.mlp.experts"
    parts = KeepList(("re:.*\\.experts\\.[0-9]+\\.down_proj",))
    assert not parts.experts_listed
    assert kept_unquantized(experts, parts, 4)
    assert not kept_unquantized(experts, KeepList(("re:.*\\.self_attn\\.",)), 4)


def test_an_fp8_config_without_a_format_is_e4m3():
    from cadence.model.fp8_checkpoint import Fp8Checkpoint

    for fmt in ({}, {"fmt": None}, {"fmt": "e4m3"}):
        quant = {"quant_method": "fp8", "weight_block_size": [128, 64], **fmt}
        assert Fp8Checkpoint.from_config(quant) == Fp8Checkpoint((128, 64))


def test_a_block_scale_without_a_block_size_is_named():
    from cadence.model.fp8_checkpoint import dequantize

    weight = torch.ones(4, 4).to(torch.float8_e4m3fn)
    scales = {"w_scale_inv": torch.ones(1, 1)}
    with pytest.raises(ValueError, match="'w_scale_inv'.*has no weight_block_size"):
        dequantize(weight, "w", scales.get, ())


def test_experts_a_checkpoint_keeps_in_part_stay_in_float():
    """An expert's part listed keeps its layer's experts (one weight each) in the model dtype;
    the other layer's experts turn e4m3 with row scales."""
    from types import SimpleNamespace

    from torch import nn

    from cadence.model.fp8 import quantize_model_fp8
    from cadence.model.moe import Experts

    arch = SimpleNamespace(num_experts=3, hidden_size=16, moe_intermediate_size=8)
    root = nn.Module()
    root.arch = SimpleNamespace(quant_ignored=("model.layers.0.mlp.experts.2.down_proj",))
    root.model = nn.Module()
    root.model.layers = nn.ModuleList(nn.Module() for _ in range(2))
    for layer in root.model.layers:
        layer.mlp = nn.Module()
        layer.mlp.experts = Experts(arch)
        for p in layer.mlp.experts.parameters():
            nn.init.normal_(p)
    kept = root.model.layers[0].mlp.experts
    before = kept.down_proj.detach().clone()
    assert quantize_model_fp8(root) == 1
    assert kept.down_proj.dtype == torch.float32 and kept.scales is None
    assert torch.equal(kept.down_proj, before)
    turned = root.model.layers[1].mlp.experts
    assert turned.down_proj.dtype == torch.float8_e4m3fn and turned.scales is not None
