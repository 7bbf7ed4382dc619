"""What the front ends share (engine/frontend.py): the tokenizer they load (none with
skip_tokenizer_init) and the reasoning tags' ids a thinking budget needs."""

from __future__ import annotations

import pytest

from cadence import LLM, SamplingParams
from cadence.engine.frontend import reasoning_tag_ids


class _Vocab:
    """A tokenizer as reasoning_tag_ids reads it: its vocabulary only."""

    def __init__(self, vocab: dict[str, int]) -> None:
        self.vocab = vocab

    def get_vocab(self) -> dict[str, int]:
        return dict(self.vocab)


@pytest.mark.parametrize(("vocab", "parser", "expected"), [
    ({"<think>": 5, "</think>": 6, "a": 7}, "qwen3", (5, 6)),
    ({"<think>": 9, "</think>": 3}, "deepseek_r1", (9, 3)),
    # A budget needs both tags as single tokens: either missing, none.
    ({"<think>": 5, "a": 7}, "qwen3", None),
    ({"</think>": 6}, "qwen3", None),
    ({"<think>": 5, "</think>": 6}, None, None),
])
def test_reasoning_tag_ids_need_both_tags(vocab: dict[str, int], parser: str | None,
                                          expected: tuple[int, int] | None) -> None:
    assert reasoning_tag_ids(_Vocab(vocab), parser) == expected


def test_reasoning_tag_ids_without_a_tokenizer() -> None:
    assert reasoning_tag_ids(None, "qwen3") is None


def test_skip_tokenizer_init_loads_no_tokenizer() -> None:
    """vLLM's skip_tokenizer_init: token-id prompts only, outputs without text, even where the
    model ships a tokenizer (the tiny model does)."""
    llm = LLM("tiny", skip_tokenizer_init=True, max_model_len=64, num_gpu_blocks_override=16)
    try:
        assert llm.get_tokenizer() is None
        params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
        (out,) = llm.generate({"prompt_token_ids": [72, 101, 108]}, params, use_tqdm=False)
        assert len(out.outputs[0].token_ids) == 3 and out.outputs[0].text == ""
        with pytest.raises(ValueError, match="skip_tokenizer_init"):
            llm.generate("hello", params, use_tqdm=False)
    finally:
        llm.shutdown()
