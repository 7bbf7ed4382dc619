"""The usage's count of reasoning tokens under --reasoning-parser: chat's
``completion_tokens_details.reasoning_tokens`` (vLLM's, whole, streamed and per chunk) and the
Responses API's ``output_tokens_details``, by the tags' ids where each tag is one token, else by
the tokens' texts."""

from __future__ import annotations

import random

import openai
import pytest

from cadence.server.reasoning import REASONING_PARSERS, ReasoningCount, reasoning_tokens
from tests.server.test_reasoning import THINKING_OFF_TEMPLATE, THINKING_TEMPLATE
from tests.server.waiting import wait_released

START, END = 900, 901  # the tags' ids where the tokenizer holds each as one token


def _stream_pieces(pieces: list[tuple[list[int], str]], tag_ids, ended: bool = False) -> int:
    """Feed a chat stream ``pieces`` of (token ids, text) and return its reasoning count."""
    from cadence.outputs import CompletionOutput, RequestOutput
    from cadence.server.chat_stream import ChatStream
    from cadence.server.protocol_chat import ChatCompletionRequest

    request = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}])
    cs = ChatStream(request, "r", "m", REASONING_PARSERS["qwen3"], reasoning_tag_ids=tag_ids)
    if ended:
        cs.reasoning_ended = True
        for splitter in cs.reasoning or []:
            splitter.end_reasoning()
    sink = cs.sink()
    for i, (ids, text) in enumerate(pieces):
        last = i == len(pieces) - 1
        sink.put(RequestOutput("r", None, [1, 2], None, [CompletionOutput(
            0, text, ids, finish_reason="stop" if last else None)], last))
    count = cs.reasoning_tokens()
    assert count is not None
    return count


def test_reasoning_tokens_by_the_tags_ids_as_vllm_counts_them() -> None:
    # <think> a b c </think> d e: three reasoning tokens, the tags not counted.
    pieces = [([START], "<think>"), ([5], "a"), ([6, 7], "bc"), ([END], "</think>"),
              ([8, 9], "de")]
    assert _stream_pieces(pieces, (START, END)) == 3
    # No opening tag: the prompt opened the reasoning, which runs from the first token.
    assert _stream_pieces(pieces[1:], (START, END)) == 3
    # Never closed (cut short): every token after the opening tag.
    assert _stream_pieces(pieces[:3], (START, END)) == 3
    # The prompt closed the reasoning: none, whatever the text.
    assert _stream_pieces([([5], "a"), ([6], "b")], (START, END), ended=True) == 0


def test_reasoning_tokens_where_the_tags_are_split_count_the_reasoning_s_pieces() -> None:
    # Tags of several tokens: the tokens of each piece whose text overlaps the reasoning; the
    # opening tag's tokens and the closing tag's hold none of it.
    pieces = [([1], "<thi"), ([2], "nk>"), ([5], "a"), ([6, 7], "bc"), ([3], "</th"),
              ([4], "ink>"), ([8, 9], "de")]
    assert _stream_pieces(pieces, None) == 3
    # A piece that starts what turns out to be the end tag is not reasoning once it is.
    assert _stream_pieces([([5], "a"), ([6], "<"), ([7], "/think>"), ([8], "b")], None) == 1
    # Blanks before an answer without an opening tag are reasoning (the split's rule).
    assert _stream_pieces([([5], "  "), ([6], "a"), ([END], "</think>")], None) == 2
    assert _stream_pieces(pieces, None, ended=True) == 0


TEXTS = ["<think>", "</think>", "<thi", "nk>", "</th", "ink>", "<", "/", ">", " ", "  ", "a",
         " b", "c\n", "think", "é", ""]


def _brute_force(texts: list[str]) -> int:
    """Tokens whose text overlaps the reasoning that the whole-output split returns, found by
    locating that reasoning in the text (independent of the counters' bookkeeping); a token
    with no text (a character's leading bytes) stands for the character after it."""
    text = "".join(texts)
    reasoning, _ = REASONING_PARSERS["qwen3"].split(text)
    if not reasoning:
        return 0
    stripped = text.lstrip()
    a = len(text) - len(stripped) + 7 if stripped.startswith("<think>") else 0
    assert text[a:a + len(reasoning)] == reasoning
    b = a + len(reasoning)
    count, pos = 0, 0
    for t in texts:
        count += pos < b and pos + max(len(t), 1) > a
        pos += len(t)
    return count


@pytest.mark.parametrize("seed", range(40))
def test_any_output_counts_the_same_whole_streamed_and_by_brute_force(seed) -> None:
    """Random outputs of tag pieces and text: one token a piece streamed, whole by bisection
    over the prefixes' decoded lengths, and the brute force agree; the streamed count is the
    same under any grouping of the tokens into pieces with tag ids."""
    rng = random.Random(seed)
    for _ in range(20):
        texts = [rng.choice(TEXTS) for _ in range(rng.randrange(0, 14))]
        ids = list(range(len(texts)))
        decode = lambda prefix, t=texts: "".join(t[i] for i in prefix)  # noqa: E731
        want = _brute_force(texts)
        assert reasoning_tokens(ids, "".join(texts), None, False, decode) == want, texts
        if texts:
            assert _stream_pieces([([i], t) for i, t in enumerate(texts)], None) == want, texts
        assert reasoning_tokens(ids, "".join(texts), None, True, decode) == 0
        # By ids: any grouping of the tokens counts as the whole does.
        tagged = [START if t == "<think>" else END if t == "</think>" else 100 + i
                  for i, t in enumerate(texts)]
        whole = ReasoningCount((START, END))
        whole.feed(tagged)
        grouped = ReasoningCount((START, END))
        cuts = sorted(rng.sample(range(len(tagged) + 1), k=min(3, len(tagged) + 1)))
        for lo, hi in zip([0, *cuts], [*cuts, len(tagged)], strict=True):
            grouped.feed(tagged[lo:hi])
        for ended in (False, True):
            assert grouped.count(ended) == whole.count(ended)
            assert reasoning_tokens(tagged, "", (START, END), ended, decode) == whole.count(ended)


@pytest.mark.parametrize(("before", "reasoning", "after"), [
    ("<think>", "ab\U0001f642", "</think>"), ("<think>", "\U0001f642", "</think>ok"),
    ("<think>", "x\U0001f642", "</think>\U0001f642"), ("<think>", "日本語\U0001f642", "</think>ответ"),
    ("", "é\U0001f600", "</think>a"), ("<think>", "\U0001f642", ""),
])
def test_characters_of_several_tokens_count_every_token(before, reasoning, after) -> None:
    """A byte-level tokenizer writes a character past ASCII as several tokens, whose leading
    ones decode to no character yet: every token of the reasoning's text counts, whole and
    streamed (the text held back until its character completes). Expected: the tokens of the
    reasoning encoded on its own, the output being the three parts' tokens."""
    from transformers import AutoTokenizer

    from cadence.model.tiny import ensure_tiny_model

    tok = AutoTokenizer.from_pretrained(str(ensure_tiny_model()))
    parts = [tok.encode(t, add_special_tokens=False) for t in (before, reasoning, after)]
    ids = [i for part in parts for i in part]
    text = tok.decode(ids)
    assert text == before + reasoning + after
    want = len(parts[1])
    assert want > len(reasoning)  # some character took several tokens
    assert reasoning_tokens(ids, text, None, False, tok.decode) == want
    pieces, shown = [], ""
    for i in range(len(ids)):  # one token a step; a character's leading bytes held back
        now = tok.decode(ids[:i + 1]).rstrip("\ufffd")
        pieces.append(([ids[i]], now[len(shown):]))
        shown = now
    assert _stream_pieces(pieces, None) == want


# Through the server ------------------------------------------------------------------------

SCRIPT = "secret plan</think>The answer."


def _scripted(server_factory, template: str = THINKING_TEMPLATE, parser: str | None = "qwen3"):
    """A server answering ``SCRIPT`` under ``parser``; (client, server, the answer's tokens,
    its reasoning tokens: those of "secret plan", which the answer's tokens start with)."""
    from transformers import AutoTokenizer

    from cadence.model.tiny import ensure_tiny_model
    from tests.server.tool_call_helpers import scripted_server

    tok = AutoTokenizer.from_pretrained(str(ensure_tiny_model()))
    head = tok.encode("secret plan", add_special_tokens=False)
    assert tok.encode(SCRIPT, add_special_tokens=False)[:len(head)] == head
    kwargs = {"chat_template": template} | ({"reasoning_parser": parser} if parser else {})
    srv, n = scripted_server(server_factory, SCRIPT, **kwargs)
    client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x", max_retries=0)
    return client, srv, n, len(head)


def _kw(n: int, **extra) -> dict:
    return dict(model="tiny", messages=[{"role": "user", "content": "q"}], max_tokens=n,
                extra_body={"ignore_eos": True, **extra})


@pytest.mark.parametrize("include", [True, False])
def test_chat_usage_counts_the_reasoning_tokens(server_factory, include) -> None:
    """vLLM's completion_tokens_details under a reasoning parser: the reasoning's tokens,
    whether include_reasoning shows it or not; summed over the choices; in the streamed
    final usage; in each chunk's continuous usage, that choice's count so far."""
    client, srv, n, k = _scripted(server_factory)
    kw = _kw(n, include_reasoning=include)
    out = client.chat.completions.create(**kw)
    assert out.usage.completion_tokens == n
    assert out.usage.completion_tokens_details.reasoning_tokens == k
    two = client.chat.completions.create(**kw, n=2)
    assert two.usage.completion_tokens_details.reasoning_tokens == 2 * k
    for choices in (1, 2):
        chunks = list(client.chat.completions.create(
            **kw, n=choices, stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True}))
        final = chunks[-1].usage
        assert not chunks[-1].choices and final.completion_tokens == choices * n
        assert final.completion_tokens_details.reasoning_tokens == choices * k
        seen = {}
        for chunk in chunks[:-1]:
            (choice,) = chunk.choices
            usage = chunk.usage
            # Each token is its own chunk here: the count so far is the reasoning's tokens
            # among the choice's tokens so far (the answer starts with them).
            assert usage.completion_tokens_details.reasoning_tokens == min(
                usage.completion_tokens, k)
            seen[choice.index] = usage.completion_tokens_details.reasoning_tokens
        assert seen == dict.fromkeys(range(choices), k)
    wait_released(srv.engine)


def test_chat_usage_without_a_parser_or_reasoning(server_factory) -> None:
    """No reasoning parser: no completion_tokens_details (whole or streamed). A prompt that
    closed the reasoning: the answer is content, none of it counted."""
    client, srv, n, _ = _scripted(server_factory, parser=None)
    assert client.chat.completions.create(**_kw(n)).usage.completion_tokens_details is None
    last = list(client.chat.completions.create(**_kw(n), stream=True,
                                               stream_options={"include_usage": True}))[-1]
    assert last.usage.completion_tokens == n and last.usage.completion_tokens_details is None
    client, srv, n, _ = _scripted(server_factory, template=THINKING_OFF_TEMPLATE)
    out = client.chat.completions.create(**_kw(n))
    assert out.choices[0].message.content == SCRIPT
    assert out.usage.completion_tokens_details.reasoning_tokens == 0
    last = list(client.chat.completions.create(**_kw(n), stream=True,
                                               stream_options={"include_usage": True}))[-1]
    assert last.usage.completion_tokens_details.reasoning_tokens == 0


def test_a_whole_answer_counts_by_the_tags_ids_where_each_is_one_token() -> None:
    """The chat endpoint's whole-answer count takes the tags' ids from the tokenizer when each
    is one token (vLLM's count), else goes by the tokens' texts; both give the tokens of
    "secret plan" here, and none past a prompt that closed the reasoning."""
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from cadence.model.tiny import ensure_tiny_model
    from cadence.server.serving import StartedRequest
    from cadence.server.serving_chat import OpenAIServingChat

    tok = AutoTokenizer.from_pretrained(str(ensure_tiny_model()))
    k = len(tok.encode("secret plan", add_special_tokens=False))
    for single in (False, True):
        if single:
            tok.add_special_tokens({"additional_special_tokens": ["<think>", "</think>"]})
        chat = OpenAIServingChat(SimpleNamespace(tokenizer=tok, model_name="tiny"), "tiny")
        chat.reasoning = REASONING_PARSERS["qwen3"]
        assert (chat.reasoning_tags is not None) == single
        for text in (SCRIPT, "<think>" + SCRIPT, "<think>secret plan"):
            ids = tok.encode(text, add_special_tokens=False)
            assert tok.decode(ids) == text
            started = StartedRequest("r", None)  # type: ignore[arg-type]
            assert chat.count_reasoning(ids, text, started) == k, (single, text)
            started.reasoning_ended = True
            assert chat.count_reasoning(ids, text, started) == (
                k if single and text.startswith("<think>") else 0), (single, text)
