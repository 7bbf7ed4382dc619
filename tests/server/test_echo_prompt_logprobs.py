"""``echo`` and ``prompt_logprobs`` through the official ``openai`` client."""

from __future__ import annotations

import openai
import pytest

PROMPT = "Once upon a time there was"


def _create(client, **kw):
    return client.completions.create(model="tiny", max_tokens=6, temperature=0.0, **kw)


def test_echo_puts_the_prompt_before_the_completion(server, client: openai.OpenAI) -> None:
    plain = _create(client, prompt=PROMPT).choices[0].text
    echoed = _create(client, prompt=PROMPT, echo=True).choices[0].text
    assert echoed == PROMPT + plain
    streamed = [c.choices[0].text for c in _create(client, prompt=PROMPT, echo=True, stream=True)]
    assert "".join(streamed) == PROMPT + plain
    assert streamed[0].startswith(PROMPT)
    ids = server.engine.tokenizer.encode("Hello world", add_special_tokens=False)
    from_ids = _create(client, prompt=ids, echo=True).choices[0].text
    assert from_ids.startswith(server.engine.tokenizer.decode(ids))


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_echo_with_logprobs_covers_the_prompt(server, client: openai.OpenAI, stream) -> None:
    n_prompt = len(server.engine.tokenizer.encode(PROMPT))
    plain = _create(client, prompt=PROMPT, logprobs=2).choices[0].logprobs
    if stream:
        chunks = [c.choices[0].logprobs for c in
                  _create(client, prompt=PROMPT, logprobs=2, echo=True, stream=True)
                  if c.choices and c.choices[0].logprobs]
        tokens = [t for lp in chunks for t in lp.tokens]
        token_lps = [x for lp in chunks for x in lp.token_logprobs]
        tops = [x for lp in chunks for x in lp.top_logprobs]
    else:
        lp = _create(client, prompt=PROMPT, logprobs=2, echo=True).choices[0].logprobs
        tokens, token_lps, tops = lp.tokens, lp.token_logprobs, lp.top_logprobs
    assert len(tokens) == n_prompt + 6
    assert token_lps[0] is None and tops[0] is None  # the first prompt token has no logprob
    assert all(isinstance(x, float) for x in token_lps[1:])
    assert all(len(t) >= 2 for t in tops[1:])
    assert tokens[n_prompt:] == plain.tokens
    assert token_lps[n_prompt:] == pytest.approx(plain.token_logprobs)
    # The echoed prompt's logprobs are the engine's prompt_logprobs.
    body = _create(client, prompt=PROMPT, extra_body={"prompt_logprobs": 0}).model_dump()
    prompt_lps = body["choices"][0]["prompt_logprobs"]
    ids = server.engine.tokenizer.encode(PROMPT)
    want = [None] + [prompt_lps[i][str(ids[i])]["logprob"] for i in range(1, n_prompt)]
    assert token_lps[:n_prompt] == pytest.approx(want)


@pytest.mark.parametrize("max_tokens", [0, 3])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_echo_of_a_truncated_prompt_is_the_text_the_engine_saw(server, client, stream,
                                                               max_tokens) -> None:
    """With truncate_prompt_tokens the echo is the kept tokens' text, so that it agrees with
    the echoed logprobs' tokens and offsets and with usage."""
    tok = server.engine.tokenizer
    ids = tok.encode(PROMPT, add_special_tokens=False)
    kept = tok.decode(ids[-3:])
    kw = dict(model="tiny", prompt=PROMPT, max_tokens=max_tokens, echo=True, logprobs=1,
              temperature=0.0, extra_body={"truncate_prompt_tokens": 3})
    if stream:
        chunks = list(client.completions.create(
            stream=True, stream_options={"include_usage": True}, **kw))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        tokens = [t for c in chunks if c.choices and c.choices[0].logprobs
                  for t in c.choices[0].logprobs.tokens]
        offsets = [o for c in chunks if c.choices and c.choices[0].logprobs
                   for o in c.choices[0].logprobs.text_offset]
        usage = chunks[-1].usage
    else:
        resp = client.completions.create(**kw)
        text, usage = resp.choices[0].text, resp.usage
        tokens, offsets = resp.choices[0].logprobs.tokens, resp.choices[0].logprobs.text_offset
    assert text.startswith(kept) and not text.startswith(PROMPT)
    assert usage.prompt_tokens == 3 and len(tokens) == 3 + max_tokens
    # The tiny model's tokens are byte-level pieces of the text: they spell it, in order.
    assert "".join(tokens) == text
    assert offsets == [len("".join(tokens[:i])) for i in range(len(tokens))]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_echo_with_zero_max_tokens_returns_the_prompt_alone(server, client, stream) -> None:
    """OpenAI's scoring form: echo with max_tokens 0 gives each choice the prompt and its
    logprobs, nothing generated (the engine's one computed token is left out)."""
    n_prompt = len(server.engine.tokenizer.encode(PROMPT))
    kw = dict(model="tiny", prompt=PROMPT, max_tokens=0, echo=True, logprobs=1, n=2,
              temperature=1.0, seed=3)
    if stream:
        chunks = list(client.completions.create(
            stream=True, stream_options={"include_usage": True}, **kw))
        usage = chunks[-1].usage
        by_choice: dict[int, list] = {0: [], 1: []}
        for c in chunks:
            for ch in c.choices:
                by_choice[ch.index].append(ch)
        texts = {i: "".join(ch.text for ch in chs) for i, chs in by_choice.items()}
        reasons = {i: [ch.finish_reason for ch in chs if ch.finish_reason] for i, chs in
                   by_choice.items()}
        tokens = {i: [t for ch in chs if ch.logprobs for t in ch.logprobs.tokens]
                  for i, chs in by_choice.items()}
        token_lps = [x for ch in by_choice[0] if ch.logprobs for x in ch.logprobs.token_logprobs]
    else:
        resp = client.completions.create(**kw)
        usage = resp.usage
        texts = {ch.index: ch.text for ch in resp.choices}
        reasons = {ch.index: [ch.finish_reason] for ch in resp.choices}
        tokens = {ch.index: ch.logprobs.tokens for ch in resp.choices}
        token_lps = resp.choices[0].logprobs.token_logprobs
    assert texts == {0: PROMPT, 1: PROMPT}
    assert reasons == {0: ["length"], 1: ["length"]}
    assert all(len(t) == n_prompt for t in tokens.values())
    assert usage.completion_tokens == 0 and usage.prompt_tokens == n_prompt
    body = _create(client, prompt=PROMPT, extra_body={"prompt_logprobs": 0}).model_dump()
    prompt_lps = body["choices"][0]["prompt_logprobs"]
    ids = server.engine.tokenizer.encode(PROMPT)
    want = [None] + [prompt_lps[i][str(ids[i])]["logprob"] for i in range(1, n_prompt)]
    assert token_lps == pytest.approx(want)


def test_prompt_logprobs_shape_in_completions_and_chat(server, client: openai.OpenAI) -> None:
    tok = server.engine.tokenizer
    ids = tok.encode(PROMPT)
    body = _create(client, prompt=PROMPT, extra_body={"prompt_logprobs": 3}).model_dump()
    rows = body["choices"][0]["prompt_logprobs"]
    assert len(rows) == len(ids) and rows[0] is None
    for i in range(1, len(ids)):
        entries = {int(k): v for k, v in rows[i].items()}
        assert ids[i] in entries and entries[ids[i]]["rank"] >= 1
        ranks = sorted(v["rank"] for t, v in entries.items() if t != ids[i])
        assert ranks[:3] == [1, 2, 3] or (entries[ids[i]]["rank"] <= 3 and len(entries) == 3)
        assert entries[ids[i]]["decoded_token"] == tok.decode([ids[i]])
    chat = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2,
        extra_body={"prompt_logprobs": 1, "return_token_ids": True}).model_dump()
    prompt_ids = chat["prompt_token_ids"]
    assert len(chat["prompt_logprobs"]) == len(prompt_ids) and chat["prompt_logprobs"][0] is None
    assert body["choices"][0].get("prompt_logprobs") is not None
    plain = _create(client, prompt=PROMPT).model_dump()
    assert plain["choices"][0].get("prompt_logprobs") is None


def _check_offsets(text: str, tokens: list[str], offsets: list[int]) -> None:
    """Each whole token's text starts at its offset; a token holding part of a character (shown
    as "" until the one completing it shows the character) starts where that character does,
    so offsets never pass the text's end."""
    assert len(tokens) == len(offsets) and offsets == sorted(offsets)
    for i, (token, at) in enumerate(zip(tokens, offsets, strict=True)):
        assert "\ufffd" not in token, (i, tokens)
        if not token:
            # The character it is part of starts here and is not ASCII.
            assert at < len(text) and ord(text[at]) > 127, (i, token, at, text)
        elif token != "<|endoftext|>":
            assert text[at:].startswith(token), (i, token, at, text)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_text_offsets_count_characters_not_byte_tokens(client: openai.OpenAI, stream) -> None:
    """Characters of several byte tokens (€, é) count once in text_offset, in the completion and
    in an echoed prompt (each such token counted one U+FFFD and the offsets drifted past the
    text's end)."""
    kw = dict(model="tiny", max_tokens=16, temperature=0.0, logprobs=0,
              extra_body={"structured_outputs": {"regex": "€ abc é"}})
    for prompt, echo in (("x", False), ("café € tr", True)):
        if stream:
            chunks = [c.choices[0] for c in client.completions.create(
                prompt=prompt, echo=echo, stream=True, **kw) if c.choices]
            text = "".join(c.text for c in chunks)
            tokens = [t for c in chunks if c.logprobs for t in c.logprobs.tokens]
            offsets = [o for c in chunks if c.logprobs for o in c.logprobs.text_offset]
        else:
            choice = client.completions.create(prompt=prompt, echo=echo, **kw).choices[0]
            text, tokens, offsets = choice.text, choice.logprobs.tokens, choice.logprobs.text_offset
        assert text.endswith("€ abc é")
        assert tokens.count("") >= 2  # the test needs byte tokens
        # The pieces' texts join into the text (the end token aside).
        assert "".join(tokens).removesuffix("<|endoftext|>").endswith("€ abc é")
        _check_offsets(text, tokens, offsets)


def test_legacy_top_logprobs_hold_the_sampled_token_outside_the_top_n() -> None:
    """vLLM's legacy completions: each position's top_logprobs are the n most likely plus the
    sampled token when it is not among them (n + 1 entries)."""
    from cadence.outputs import Logprob
    from cadence.server.serving_completion import completion_logprobs

    row = {7: Logprob(-3.0, 5, "x"), 1: Logprob(-0.5, 1, "a"), 2: Logprob(-1.0, 2, "b"),
           3: Logprob(-1.5, 3, "c")}
    out = completion_logprobs([7], [row], 2)
    assert out.tokens == ["x"] and out.token_logprobs == [-3.0]
    assert out.top_logprobs == [{"a": -0.5, "b": -1.0, "x": -3.0}]
    inside = completion_logprobs([2], [row], 2)  # sampled among the top 2: n entries
    assert inside.top_logprobs == [{"a": -0.5, "b": -1.0}]


def test_echo_with_logprobs_asks_the_engine_for_enough_prompt_logprobs() -> None:
    """echo with logprobs needs the prompt's logprobs (vLLM): the engine computes the larger
    of prompt_logprobs and logprobs, and -1 (all) stays all; without echo, or without
    logprobs, only what prompt_logprobs asks."""
    from cadence.server.protocol_completion import CompletionRequest

    def engine_n(**kw) -> int | None:
        request = CompletionRequest(prompt="x", **kw)
        assert request.to_sampling_params().prompt_logprobs == request.engine_prompt_logprobs
        return request.engine_prompt_logprobs

    assert engine_n(echo=True, logprobs=2) == 2
    assert engine_n(echo=True, logprobs=0) == 0
    assert engine_n(echo=True, logprobs=5, prompt_logprobs=1) == 5
    assert engine_n(echo=True, logprobs=2, prompt_logprobs=5) == 5
    assert engine_n(echo=True, logprobs=2, prompt_logprobs=-1) == -1
    assert engine_n(echo=True) is None
    assert engine_n(logprobs=2) is None
    assert engine_n(logprobs=2, prompt_logprobs=3) == 3


def test_echo_logprobs_with_all_prompt_logprobs(server_factory) -> None:
    """echo + logprobs 2 + prompt_logprobs -1 (all; --max-logprobs -1): prompt_logprobs rows
    hold the whole vocabulary, the echoed prompt tokens' top_logprobs the two asked for (and
    the prompt token when it is not among them); prompt_logprobs 1 with logprobs 3: the echo
    shows three per prompt token, prompt_logprobs the one asked for."""
    srv = server_factory(max_logprobs=-1)
    client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="unused", max_retries=0)
    tok = srv.engine.tokenizer
    n_prompt = len(tok.encode(PROMPT))
    body = _create(client, prompt=PROMPT, echo=True, logprobs=2,
                   extra_body={"prompt_logprobs": -1}).model_dump()
    choice = body["choices"][0]
    rows = choice["prompt_logprobs"]
    assert len(rows) == n_prompt and rows[0] is None
    assert all(len(row) >= len(tok) for row in rows[1:])
    tops = choice["logprobs"]["top_logprobs"]
    assert len(tops) == n_prompt + 6 and tops[0] is None
    assert all(2 <= len(t) <= 3 for t in tops[1:])
    # The engine computes three per prompt token for the echo; prompt_logprobs shows the one
    # asked for (and the prompt token), as without echo.
    narrow = _create(client, prompt=PROMPT, echo=True, logprobs=3,
                     extra_body={"prompt_logprobs": 1}).model_dump()["choices"][0]
    assert all(3 <= len(t) <= 4 for t in narrow["logprobs"]["top_logprobs"][1:n_prompt])
    alone = _create(client, prompt=PROMPT, extra_body={"prompt_logprobs": 1}).model_dump()
    assert narrow["prompt_logprobs"] == alone["choices"][0]["prompt_logprobs"]
    assert all(1 <= len(row) <= 2 for row in narrow["prompt_logprobs"][1:])


def _offsets(client: openai.OpenAI, stream: bool, **kw) -> tuple[str, list[str], list[int]]:
    kw = dict(model="tiny", prompt="x", logprobs=0, temperature=0.0, **kw)
    if not stream:
        choice = client.completions.create(**kw).choices[0]
        return choice.text, choice.logprobs.tokens, choice.logprobs.text_offset
    chunks = [c.choices[0] for c in client.completions.create(stream=True, **kw) if c.choices]
    return ("".join(c.text for c in chunks),
            [t for c in chunks if c.logprobs for t in c.logprobs.tokens],
            [o for c in chunks if c.logprobs for o in c.logprobs.text_offset])


@pytest.mark.parametrize("case", ["held back", "skipped special"])
def test_streamed_text_offsets_are_the_whole_answers(client: openai.OpenAI, case) -> None:
    """A stream's offsets follow its tokens, not the text its chunks have sent so far: text held
    back for a possible stop string ("a" might begin "ab"), and special tokens the text skips
    (each counts its shown length, as vLLM's offsets do), gave other offsets when streamed."""
    if case == "held back":
        kw = dict(max_tokens=5, stop=["ab"], extra_body={"allowed_token_ids": [97, 98]})
    else:
        kw = dict(max_tokens=4, logit_bias={"637": 3.0},
                  extra_body={"allowed_token_ids": [97, 637], "ignore_eos": True})
    plain = _offsets(client, False, **kw)
    text, tokens, offsets = plain
    assert len(tokens) >= 4 and all(t in ("a", "b", "<|endoftext|>") for t in tokens)
    # Each token starts where the ones before it end (one-character tokens and the shown
    # "<|endoftext|>").
    assert offsets == [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
    if case == "held back":
        assert "ab" not in text and len(text) == len(tokens)
    else:
        assert "<|endoftext|>" in tokens and "<|endoftext|>" not in text
    assert _offsets(client, True, **kw) == plain
