"""Which ids end a request (vLLM's rule): the tokenizer's eos_token_id ends it with no
stop_reason; the generation config's other end ids end it as stop_token_ids (stop_reason: the
id); min_tokens holds every end id back, with or without ignore_eos."""

from __future__ import annotations

import json
import shutil

import pytest

from cadence import LLM, SamplingParams
from cadence.model.tiny import ensure_tiny_model


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> LLM:
    """The tiny model with the tokenizer's end token moved to <|im_end|> (a fine-tune's
    end-of-turn), the generation config listing both that and <|endoftext|>."""
    path = tmp_path_factory.mktemp("end-ids") / "model"
    shutil.copytree(ensure_tiny_model(), path)
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        data = json.loads((path / name).read_text())
        data["eos_token"] = "<|im_end|>"
        (path / name).write_text(json.dumps(data))
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    endoftext = tok.convert_tokens_to_ids("<|endoftext|>")
    assert tok.eos_token_id != endoftext
    (path / "generation_config.json").write_text(
        json.dumps({"eos_token_id": [endoftext, tok.eos_token_id]}))
    llm = LLM(str(path), max_model_len=64, num_gpu_blocks_override=32, device="cpu")
    llm.ids = {"im_end": tok.eos_token_id, "endoftext": endoftext}  # type: ignore[attr-defined]
    return llm


def _run(llm: LLM, **kw: object):
    params = SamplingParams(temperature=0.0, max_tokens=6, **kw)  # type: ignore[arg-type]
    return llm.generate({"prompt_token_ids": [72, 101, 108]}, params, use_tqdm=False)[0].outputs[0]


def test_the_tokenizers_end_token_ends_without_a_stop_reason(llm: LLM) -> None:
    im_end = llm.ids["im_end"]  # type: ignore[attr-defined]
    out = _run(llm, logit_bias={im_end: 100.0})
    assert out.token_ids == [im_end]
    assert out.finish_reason == "stop" and out.stop_reason is None


def test_the_configs_other_end_token_ends_with_its_id(llm: LLM) -> None:
    endoftext = llm.ids["endoftext"]  # type: ignore[attr-defined]
    out = _run(llm, logit_bias={endoftext: 100.0})
    assert out.token_ids == [endoftext]
    assert out.finish_reason == "stop" and out.stop_reason == endoftext


@pytest.mark.parametrize("ignore_eos", [False, True])
def test_min_tokens_holds_every_end_id_back(llm: LLM, ignore_eos: bool) -> None:
    ends = set(llm.ids.values())  # type: ignore[attr-defined]
    bias = {t: 100.0 for t in ends}
    out = _run(llm, logit_bias=bias, min_tokens=2, ignore_eos=ignore_eos)
    assert not ends & set(out.token_ids[:2])
    if ignore_eos:  # the end ids win once allowed, and end nothing
        assert len(out.token_ids) == 6 and set(out.token_ids[2:]) <= ends
        assert out.finish_reason == "length"
    else:
        assert len(out.token_ids) == 3 and out.token_ids[2] in ends
        assert out.finish_reason == "stop"


def test_min_tokens_holds_the_end_ids_back_beside_a_banned_word(llm: LLM) -> None:
    """A one-token bad word is banned outright in the same rows as min_tokens' end ids: both
    bans hold (neither replaces the other)."""
    ends = set(llm.ids.values())  # type: ignore[attr-defined]
    (word,) = llm.get_tokenizer().encode("x", add_special_tokens=False)
    bias = {t: 100.0 for t in ends} | {word: 50.0}
    out = _run(llm, logit_bias=bias, min_tokens=2, bad_words=["x"])
    assert not ends & set(out.token_ids[:2]) and word not in out.token_ids
    assert len(out.token_ids) == 3 and out.token_ids[2] in ends
    assert out.finish_reason == "stop"
