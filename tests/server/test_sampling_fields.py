"""Every sampling field through the official ``openai`` client: each one changes the result the
way its definition says, streamed or not; none is dropped."""

from __future__ import annotations

import openai
import pytest

from cadence import SamplingParams

PROMPT = "The garden was"
MSG = [{"role": "user", "content": "Tell me about the garden."}]


def _ids(client: openai.OpenAI, stream: bool = False, **kw) -> list[int]:
    body = dict(model="tiny", prompt=PROMPT, max_tokens=12, temperature=0.0)
    extra = {"ignore_eos": True, "return_token_ids": True, **kw.pop("extra_body", {})}
    if stream:
        ids: list[int] = []
        for chunk in client.completions.create(**body, **kw, stream=True, extra_body=extra):
            ids.extend(getattr(chunk.choices[0], "token_ids", None) or [])
        return ids
    out = client.completions.create(**body, **kw, extra_body=extra)
    return out.choices[0].token_ids  # type: ignore[attr-defined]


def _offline(llm, **kw) -> list[int]:
    """The same request through the offline engine (the expected tokens)."""
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, **kw)
    return llm.generate([PROMPT], params, use_tqdm=False)[0].outputs[0].token_ids


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_each_field_reaches_the_sampler(server, client: openai.OpenAI, offline,
                                        stream: bool) -> None:
    plain = _ids(client, stream)
    tok = server.engine.tokenizer
    vocab = len(tok)
    target = plain[0]
    # logit_bias: +100 on one token makes greedy pick it every time; -100 removes it.
    forced = next(t for t in range(3, vocab) if t not in plain)
    assert _ids(client, stream, logit_bias={str(forced): 100}) == [forced] * 12
    assert target not in _ids(client, stream, logit_bias={str(target): -100})
    # allowed_token_ids: every token comes from the set.
    allowed = [forced, forced + 1, target]
    got = _ids(client, stream, extra_body={"allowed_token_ids": allowed})
    assert set(got) <= set(allowed)
    # Penalties and min_p: each gives the engine's own result for the same parameters, and the
    # penalties change the greedy continuation of this prompt.
    for field, value in (("frequency_penalty", 1.5), ("presence_penalty", 1.9)):
        got = _ids(client, stream, **{field: value})
        assert got == _offline(offline, **{field: value}) and got != plain
    got = _ids(client, stream, extra_body={"repetition_penalty": 2.0})
    assert got == _offline(offline, repetition_penalty=2.0) and got != plain
    assert _ids(client, stream, extra_body={"min_p": 0.2}) == plain  # greedy: min_p is moot
    # priority under the server's fcfs policy: taken and ignored (vLLM v1), not a 400.
    assert _ids(client, stream, extra_body={"priority": -3}) == plain


def test_bad_words_and_min_p_in_chat(server, client: openai.OpenAI) -> None:
    base = dict(model="tiny", messages=MSG, max_tokens=24, temperature=0.0)
    extra = {"ignore_eos": True, "return_token_ids": True}
    free = client.chat.completions.create(**base, extra_body=extra)
    text = free.choices[0].message.content
    ids = free.choices[0].token_ids  # type: ignore[attr-defined]
    tok = server.engine.tokenizer
    # A token of the answer that is a word of its own (it encodes back to itself alone).
    def own_word(t: int) -> str | None:
        w = tok.decode([t])
        return w if w.strip() == w and tok.encode(w, add_special_tokens=False) == [t] else None

    word_id = next(t for t in ids[1:] if own_word(t))
    word = own_word(word_id)
    banned = client.chat.completions.create(**base, extra_body={**extra, "bad_words": [word]})
    got = banned.choices[0].token_ids  # type: ignore[attr-defined]
    assert word_id not in got
    assert got[: ids.index(word_id)] == ids[: ids.index(word_id)]
    sampled = {
        client.chat.completions.create(
            **{**base, "temperature": 1.0}, seed=s,
            extra_body={"ignore_eos": True, "min_p": 1.0}).choices[0].message.content
        for s in range(3)
    }
    # min_p 1 keeps only the most likely token: every seed gives the greedy text.
    assert sampled == {text}


def test_logit_bias_keys_and_clipping() -> None:
    """OpenAI's string token ids become ints; biases are clipped to [-100, 100] (vLLM)."""
    from cadence.server.protocol_completion import CompletionRequest

    request = CompletionRequest(prompt="x", logit_bias={"5": -1000, "6": 50.5, "7": 1e9,
                                                        "8": -100})
    assert request.to_sampling_params().logit_bias == {5: -100.0, 6: 50.5, 7: 100.0, 8: -100.0}


def test_stream_options_default_to_usage() -> None:
    """stream_options given without include_usage includes usage (vLLM's default), and
    continuous_usage_stats then puts it in every chunk; without stream_options, none."""
    from cadence.server.protocol_completion import CompletionRequest

    cont = CompletionRequest(prompt="x", stream=True,
                             stream_options={"continuous_usage_stats": True})
    assert cont.include_usage and cont.continuous_usage
    plain = CompletionRequest(prompt="x", stream=True)
    assert not plain.include_usage and not plain.continuous_usage
    off = CompletionRequest(prompt="x", stream=True,
                            stream_options={"include_usage": False, "continuous_usage_stats": True})
    assert not off.include_usage and not off.continuous_usage


def test_top_logprobs_rows_hold_n_entries_when_the_sampled_token_is_not_among_them() -> None:
    from cadence.outputs import Logprob
    from cadence.server.serving import top_by_rank

    row = {9: Logprob(-5.0, 7, "z"), 1: Logprob(-0.1, 1, "a"), 2: Logprob(-0.2, 2, "b"),
           3: Logprob(-0.3, 3, "c")}
    assert [t for t, _ in top_by_rank(row, 2)] == [1, 2]
    assert top_by_rank(row, 0) == []


def test_logprobs_are_floored_at_minus_9999_as_in_vllm() -> None:
    """JSON has no -inf, and vLLM floors every logprob it shows at -9999.0: a finite one below it
    (a tiny temperature over a wide logit gap) is floored too, not only -inf and NaN."""
    from cadence.server.serving import LOGPROB_FLOOR, clamp_logprob

    assert LOGPROB_FLOOR == -9999.0
    for value in (float("-inf"), float("nan"), -12345.5, -9999.0):
        assert clamp_logprob(value) == -9999.0, value
    assert clamp_logprob(-9998.5) == -9998.5 and clamp_logprob(-0.25) == -0.25


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_skip_special_tokens_in_the_generated_text_and_echo(server, client: openai.OpenAI,
                                                             stream: bool) -> None:
    """skip_special_tokens=False shows the special tokens the model generates, True (the
    default) leaves them out; the echoed prompt is the prompt as given either way (it is not
    generated text), its special tokens included."""
    tok = server.engine.tokenizer
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    prompt = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.encode(prompt)[0] == tok.convert_tokens_to_ids("<|im_start|>")
    prompt_ids = tok.encode(prompt)

    def text(p, skip: bool) -> str:
        kw = dict(model="tiny", prompt=p, max_tokens=3, temperature=0.0, echo=True,
                  logit_bias={str(im_end): 100},  # every generated token is <|im_end|>
                  extra_body={"ignore_eos": True, "skip_special_tokens": skip})
        if stream:
            return "".join(c.choices[0].text for c in client.completions.create(**kw, stream=True)
                           if c.choices)
        return client.completions.create(**kw).choices[0].text

    assert text(prompt, False) == prompt + "<|im_end|>" * 3
    assert text(prompt, True) == prompt
    # A token-id prompt's echo is its decoding with its special tokens.
    assert text(prompt_ids, False) == prompt + "<|im_end|>" * 3
    assert text(prompt_ids, True) == prompt


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_repetition_detection_cuts_the_answer_where_it_repeats(client: openai.OpenAI,
                                                               stream: bool) -> None:
    """The answer is the free answer cut at the first token where it repeats (the rule of
    tests/test_repetition.py), finishing with "repetition", on completions and chat."""
    from tests.test_repetition import first_detection

    rd = {"max_pattern_size": 6, "min_count": 2}
    body = dict(model="tiny", max_tokens=60, temperature=0.0)
    extra = {"ignore_eos": True, "return_token_ids": True}
    cases = [(client.completions.create, dict(prompt=PROMPT)),
             (client.chat.completions.create, dict(messages=MSG))]
    for create, kw in cases:
        free = create(**body, **kw, extra_body=extra).choices[0].token_ids
        end = first_detection(free, 0, 6, 2)
        assert end is not None and end < 60  # the tiny model loops within 60 tokens
        extra_rd = {**extra, "repetition_detection": rd}
        if stream:
            ids, finish = [], None
            for chunk in create(**body, **kw, extra_body=extra_rd, stream=True):
                if chunk.choices:
                    ids += getattr(chunk.choices[0], "token_ids", None) or []
                    finish = chunk.choices[0].finish_reason or finish
        else:
            choice = create(**body, **kw, extra_body=extra_rd).choices[0]
            ids, finish = choice.token_ids, choice.finish_reason
        assert ids == free[:end] and finish == "repetition"


@pytest.mark.parametrize(("rd", "param"), [
    ({"max_pattern_size": 4, "min_count": 1}, "repetition_detection"),
    ({"max_pattern_size": 2, "min_pattern_size": 3, "min_count": 2}, "repetition_detection"),
    ({"max_pattern_size": -1}, "repetition_detection.max_pattern_size"),
    ({"max_pattern_size": 10**9, "min_count": 2}, "repetition_detection.max_pattern_size"),
    (5, "repetition_detection"),
])
def test_bad_repetition_detection_is_a_400_naming_it(client: openai.OpenAI, rd, param) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", prompt=PROMPT, max_tokens=4,
                                  extra_body={"repetition_detection": rd})
    assert info.value.body["param"] == param  # type: ignore[index]


@pytest.mark.parametrize(("budget", "message"), [
    (5, "needs a reasoning parser"),  # the tiny tokenizer has no single-token <think> tags
    (-2, "greater than or equal to -1"),
])
def test_a_thinking_budget_without_tags_is_a_400_naming_it(client: openai.OpenAI, budget,
                                                           message) -> None:
    with pytest.raises(openai.BadRequestError, match=message) as info:
        client.chat.completions.create(model="tiny", messages=MSG, max_tokens=4,
                                       extra_body={"thinking_token_budget": budget})
    assert info.value.body["param"] == "thinking_token_budget"  # type: ignore[index]


def test_reasoning_tags_come_from_the_tokenizer_where_they_are_single_tokens() -> None:
    from transformers import AutoTokenizer

    from cadence.engine.frontend import reasoning_tag_ids
    from cadence.model.tiny import ensure_tiny_model

    tok = AutoTokenizer.from_pretrained(str(ensure_tiny_model()))
    assert reasoning_tag_ids(tok, "qwen3") is None  # "<think>" is several tokens here
    tok.add_special_tokens({"additional_special_tokens": ["<think>", "</think>"]})
    want = tuple(tok.convert_tokens_to_ids(["<think>", "</think>"]))
    assert reasoning_tag_ids(tok, "qwen3") == want == reasoning_tag_ids(tok, "deepseek_r1")
    assert reasoning_tag_ids(tok, None) is None
