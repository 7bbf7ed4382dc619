"""LLM.generate's, LLM.chat's and LLM.beam_search's inputs as vLLM takes them: one output per
prompt (none for none), one priority per prompt or one integer for all, a chat prompt tokenized
without the tokenizer's own special tokens (the template holds them), a template named in
chat_template_kwargs, a positive integer concurrency limit."""

from __future__ import annotations

from pathlib import Path

import pytest

from cadence import LLM, BeamSearchParams, SamplingParams
from tests.tiny import tiny_args, tiny_copy_adding_a_bos

GREEDY = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)


@pytest.fixture(scope="module")
def llm():
    engine = LLM(**vars(tiny_args(max_model_len=128, num_gpu_blocks_override=16)))
    yield engine
    engine.shutdown()


def test_no_prompts_give_no_outputs(llm) -> None:
    assert llm.generate([], GREEDY, use_tqdm=False) == []
    assert llm.generate((), GREEDY, use_tqdm=False) == []


@pytest.mark.parametrize(("prompts", "priority"), [
    (["a", "b"], [1]),  # one short: no prompt is dropped silently
    (["a", "b", "c"], [0, 0]),
    (["a"], True),  # a bool is no priority (as in a list)
    (["a", "b"], False),
])
def test_a_priority_per_prompt_or_one_integer(llm, prompts: list[str], priority) -> None:
    with pytest.raises(ValueError, match="priority"):
        llm.generate(prompts, GREEDY, use_tqdm=False, priority=priority)
    assert llm.engine_core.scheduler.get_num_unfinished_requests() == 0
    assert len(llm.generate(prompts, GREEDY, use_tqdm=False, priority=[0] * len(prompts))) == len(
        prompts)


def test_a_chat_prompt_gets_no_second_bos(tmp_path: Path) -> None:
    """A tokenizer whose post-processor adds a BOS: the chat template writes its own specials,
    so the rendered text is tokenized without them (vLLM's chat default), as transformers'
    ``encode(text, add_special_tokens=False)`` does."""
    from transformers import AutoTokenizer

    model, bos_id = tiny_copy_adding_a_bos(tmp_path / "tiny-bos")
    hf = AutoTokenizer.from_pretrained(model)
    assert hf.encode("x")[0] == bos_id  # the tokenizer does add one
    text = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"  # ChatML (no template)
    engine = LLM(**vars(tiny_args(model=str(model), max_model_len=128,
                                  num_gpu_blocks_override=16)))
    try:
        (out,) = engine.chat([{"role": "user", "content": "Hi"}], GREEDY, use_tqdm=False)
    finally:
        engine.shutdown()
    assert out.prompt == text
    assert out.prompt_token_ids == hf.encode(text, add_special_tokens=False)
    assert out.prompt_token_ids[:2] != [bos_id, bos_id]


def test_a_template_given_in_chat_template_kwargs_chooses_the_content_format(llm) -> None:
    """vLLM's merge: chat_template_kwargs' chat_template renders where none is named, and its
    loop over a message's content parts makes "auto" hand it the parts (openai format), as the
    same template given as chat_template does."""
    template = "{% for m in messages %}{% for part in m.content %}{{ part.text }}|{% endfor %}" \
               "{% endfor %}"
    conversation = [{"role": "user", "content": [{"type": "text", "text": "Hi"},
                                                 {"type": "text", "text": "there"}]}]
    (named,) = llm.chat(conversation, GREEDY, use_tqdm=False, chat_template=template)
    (in_kwargs,) = llm.chat(conversation, GREEDY, use_tqdm=False,
                            chat_template_kwargs={"chat_template": template})
    assert named.prompt == in_kwargs.prompt == "Hi|there|"


@pytest.mark.parametrize("limit", [True, False, 1.0, 0, -1])
def test_a_beam_searchs_concurrency_limit_is_a_positive_integer(llm, limit) -> None:
    with pytest.raises(ValueError, match="concurrency_limit"):
        llm.beam_search(["a"], BeamSearchParams(beam_width=2, max_tokens=1),
                        concurrency_limit=limit)
