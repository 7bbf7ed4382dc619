"""vLLM's ``hf_overrides``: fields set on a model's config before the engine reads it, from
``LLM(...)``, ``EngineArgs`` and ``--hf-overrides``; greedy tokens against transformers run with
the same config."""

from __future__ import annotations

import random

import pytest
import transformers

from cadence import LLM, SamplingParams
from cadence.cli import parse_args
from cadence.engine.engine_args import EngineArgs
from cadence.hf_overrides import apply_hf_overrides
from cadence.model.registry import resolve_model
from cadence.server.cli import engine_args_from
from tests.hf_models import VOCAB, hf_greedy, save_llama

THETA = 10000.0


@pytest.fixture(scope="module")
def plain_llama(tmp_path_factory):
    """A random Llama checkpoint without RoPE scaling (64 positions, base 10,000)."""
    path = tmp_path_factory.mktemp("plain-llama")
    model = save_llama(path, seed=3, rope_parameters={"rope_type": "default", "rope_theta": THETA})
    return path, model


def _same_weights_with(model, **fields):
    """transformers' model of ``model``'s weights under a config with ``fields`` set."""
    config = model.config.__class__.from_dict({**model.config.to_dict(), **fields})
    config._attn_implementation = "eager"
    other = transformers.LlamaForCausalLM(config)
    other.load_state_dict(model.state_dict())
    return other.float().eval()


def _generate(llm: LLM, prompts: list[list[int]], n: int) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


@pytest.mark.parametrize("overrides, hf_fields, max_len", [
    ({"rope_theta": 321.0}, {"rope_parameters": {"rope_type": "default", "rope_theta": 321.0}},
     64),
    # The older layout's scaling, as vLLM users write it: the base stays the checkpoint's.
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                       "original_max_position_embeddings": 64}, "max_position_embeddings": 256},
     {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": THETA,
                          "original_max_position_embeddings": 64},
      "max_position_embeddings": 256}, 256),
], ids=["rope_theta", "yarn"])
def test_rope_overrides_give_transformers_tokens(plain_llama, overrides, hf_fields, max_len):
    path, model = plain_llama
    rng = random.Random(11)
    prompts = [[rng.randrange(3, VOCAB) for _ in range(n)] for n in (30, 40, 9)]
    new = 24 if max_len == 64 else 80  # yarn: sequences run past the checkpoint's 64
    expected = hf_greedy(_same_weights_with(model, **hf_fields), prompts, new)
    plain = hf_greedy(model, prompts, new)
    assert expected != plain  # the override changes the model's tokens
    # float32: transformers' reference is (a GPU would take bfloat16 by default).
    llm = LLM(str(path), skip_tokenizer_init=True, hf_overrides=overrides, dtype="float32",
              max_num_batched_tokens=32)
    assert llm.engine_core.spec.max_model_len == max_len  # derived from the new config
    assert _generate(llm, prompts, new) == expected
    llm.shutdown()


def test_a_function_of_the_config(plain_llama):
    path, _ = plain_llama

    def shorter(config):
        config.max_position_embeddings = 40
        return config

    assert resolve_model(str(path), hf_overrides=shorter).max_model_len == 40
    with pytest.raises(ValueError, match="must return the model's config"):
        resolve_model(str(path), hf_overrides=lambda config: None)


def test_presets_and_the_default_context_follow_the_overrides():
    assert resolve_model("qwen3-0.6b").max_model_len == 40960
    spec = resolve_model("qwen3-0.6b", hf_overrides={"max_position_embeddings": 1000,
                                                     "rope_theta": 5.0})
    assert spec.max_model_len == 1000
    assert spec.hf_config.rope_parameters["rope_theta"] == 5.0
    with pytest.raises(ValueError, match="larger than the model's max_position_embeddings"):
        resolve_model("qwen3-0.6b", 2000, hf_overrides={"max_position_embeddings": 1000})


def test_nested_configs_update_by_field_and_other_values_replace():
    config = transformers.PretrainedConfig()
    config.text_config = transformers.Qwen3Config(hidden_size=64, num_attention_heads=4)
    config.extra = {"a": 1, "b": 2}
    apply_hf_overrides(config, {"text_config": {"hidden_size": 128}, "extra": {"a": 3}})
    assert config.text_config.hidden_size == 128
    assert config.text_config.num_attention_heads == 4  # the rest of the nested config kept
    assert config.extra == {"a": 3}  # a dict field is replaced whole, as vLLM does


def test_rope_scaling_null_and_per_layer_rope_parameters():
    config = transformers.LlamaConfig(rope_parameters={"rope_type": "linear", "factor": 2.0,
                                                       "rope_theta": 7.0})
    apply_hf_overrides(config, {"rope_scaling": None})
    assert config.rope_parameters == {"rope_type": "default", "rope_theta": 7.0}
    gemma = transformers.Gemma3TextConfig()
    sliding = dict(gemma.rope_parameters["sliding_attention"])
    apply_hf_overrides(gemma, {"rope_scaling": {"rope_type": "linear", "factor": 8.0}})
    assert gemma.rope_parameters["full_attention"] == {
        "rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}
    assert gemma.rope_parameters["sliding_attention"] == sliding  # local layers unscaled
    with pytest.raises(ValueError, match="rope_scaling must be an object or null"):
        apply_hf_overrides(transformers.LlamaConfig(), {"rope_scaling": 4})


@pytest.mark.parametrize("value, fragment", [
    (3, "must be a dict of config fields or a function"),
    ({"max_position_embeddings": float("nan")}, "must hold JSON values"),
    ({"x": object()}, "must hold JSON values"),
    ({5: 1}, "field names must be strings"),
])
def test_bad_overrides_are_refused_when_given(value, fragment):
    with pytest.raises(ValueError, match=fragment):
        EngineArgs(hf_overrides=value)


def test_a_function_must_pickle_to_reach_an_engine_process():
    with pytest.raises(ValueError, match="must be picklable"):
        EngineArgs(hf_overrides=lambda config: config, engine_process=True)
    EngineArgs(hf_overrides=lambda config: config)  # in this process any function does


def test_the_flag_and_a_config_file(tmp_path, capsys):
    ns = parse_args(["serve", "--hf-overrides", '{"max_position_embeddings": 100}'])
    assert engine_args_from(ns).hf_overrides == {"max_position_embeddings": 100}
    cfg = tmp_path / "serve.yaml"
    cfg.write_text("hf_overrides:\n  rope_theta: 5.0\n  rope_scaling: null\n")
    ns = parse_args(["serve", "--config", str(cfg)])
    assert engine_args_from(ns).hf_overrides == {"rope_theta": 5.0, "rope_scaling": None}
    for bad in ("[1]", "{nope"):
        with pytest.raises(SystemExit):
            parse_args(["serve", "--hf-overrides", bad])
        assert "expected a JSON object" in capsys.readouterr().err


def test_the_overrides_reach_an_engine_process() -> None:
    from cadence.engine.async_llm import AsyncLLM

    engine = AsyncLLM(EngineArgs(model="tiny", engine_process=True,
                                 hf_overrides={"max_position_embeddings": 100}))
    try:
        assert engine.max_model_len == 100  # the process's own config, overridden
    finally:
        engine.shutdown()


def test_values_the_config_refuses_are_value_errors_naming_the_field():
    with pytest.raises(ValueError, match="hf_overrides.max_position_embeddings: '4096' is "
                                         "refused by the config"):
        resolve_model("qwen3-0.6b", hf_overrides={"max_position_embeddings": "4096"})
    with pytest.raises(ValueError, match="field names must be identifiers"):
        resolve_model("qwen3-0.6b", hf_overrides={"__class__": 1})


def test_a_rope_base_is_kept_unless_given():
    def params(overrides):
        return resolve_model("qwen3-0.6b", hf_overrides=overrides).hf_config.rope_parameters

    base = params(None)["rope_theta"]
    assert base == 1000000.0
    # transformers 5's own name, without a base: the checkpoint's stays.
    assert params({"rope_parameters": {"rope_type": "linear", "factor": 2.0}}) == {
        "rope_type": "linear", "factor": 2.0, "rope_theta": base}
    linear = {"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5}
    assert params({"rope_scaling": linear})["rope_theta"] == 5e5  # given inside
    assert params({"rope_scaling": linear, "rope_theta": 7.0})["rope_theta"] == 7.0


def test_a_config_file_value_that_is_not_json_is_one_line(tmp_path):
    cfg = tmp_path / "serve.yaml"
    cfg.write_text("hf_overrides:\n  when: 2024-01-01\n")
    with pytest.raises(ValueError, match="hf_overrides: expected JSON values only"):
        parse_args(["serve", "--config", str(cfg)])
