"""use_beam_search on both endpoints through the official client: the answer is the offline
LLM.beam_search's best beams (itself checked against a beam search over transformers' logits),
streamed or not; fields it would not apply are 400s naming them; nothing is left behind."""

from __future__ import annotations

import json
import socket

import httpx
import pytest

from cadence import LLM, BeamSearchParams
from tests.server.waiting import metric, scrape, wait_released, wait_until

PROMPT = "Once upon a time"


def expected(llm: LLM, prompt_ids: list[int], width: int, max_tokens: int,
             **kw) -> list[tuple[str, list[int], str]]:
    """(text, token ids, finish reason) of each best beam, as vLLM's served search shows it:
    the answer alone, a final end token left out of the text, and of the ids unless
    ``include_stop_str_in_output``."""
    (out,) = llm.beam_search({"prompt_token_ids": prompt_ids},
                             BeamSearchParams(beam_width=width, max_tokens=max_tokens, **kw))
    tok = llm.get_tokenizer()
    rows = []
    for seq in out.sequences:
        ids = seq.tokens[len(prompt_ids):]
        shown = ids[:-1] if seq.finish_reason == "stop" else ids
        kept = ids if kw.get("include_stop_str_in_output") else shown
        rows.append((tok.decode(shown), kept, seq.finish_reason))
    return rows


def test_completions_give_the_best_beams(client, offline, server) -> None:
    ids = offline.get_tokenizer().encode(PROMPT)
    want = expected(offline, ids, 3, 8, length_penalty=0.5)
    kw = dict(model="tiny", prompt=PROMPT, n=3, max_tokens=8, temperature=0.0,
              extra_body={"use_beam_search": True, "length_penalty": 0.5,
                          "return_token_ids": True})
    out = client.completions.create(**kw)
    got = [(c.text, c.token_ids, c.finish_reason) for c in out.choices]
    assert got == want
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert out.usage.prompt_tokens == len(ids)
    assert out.usage.completion_tokens == sum(len(w[1]) for w in want)
    streamed: dict[int, str] = {}
    finish: dict[int, str] = {}
    for chunk in client.completions.create(**kw, stream=True):
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + c.text
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    assert streamed == {i: w[0] for i, w in enumerate(want)}
    assert finish == {i: w[2] for i, w in enumerate(want)}
    wait_released(server.engine)


def test_logprobs_show_the_answers_tokens(client) -> None:
    """The steps run without text; the answer's logprobs still show each token's text (they
    join into the answer), as a sampled answer's do."""
    out = client.completions.create(model="tiny", prompt=PROMPT, n=2, max_tokens=6,
                                    temperature=0.0, logprobs=2,
                                    extra_body={"use_beam_search": True})
    for c in out.choices:
        assert "".join(c.logprobs.tokens) == c.text
        assert not any(t.startswith("token_id:") for t in c.logprobs.tokens)
        assert c.logprobs.text_offset[0] == 0 and len(c.logprobs.top_logprobs[0]) >= 2


def test_chat_gives_the_best_beams_with_logprobs(client, http, offline, server) -> None:
    messages = [{"role": "user", "content": "hi"}]
    prompt_ids = http.post("/tokenize", json={"messages": messages}).json()["tokens"]
    want = expected(offline, prompt_ids, 2, 6)
    kw = dict(model="tiny", messages=messages, n=2, max_tokens=6, temperature=0.0,
              logprobs=True, top_logprobs=2, extra_body={"use_beam_search": True})
    out = client.chat.completions.create(**kw)
    assert [(c.message.content, c.finish_reason) for c in out.choices] == \
        [(w[0], w[2]) for w in want]
    for c, w in zip(out.choices, want):
        assert len(c.logprobs.content) == len(w[1])
        assert "".join(t.token for t in c.logprobs.content) == c.message.content
        assert all(len(t.top_logprobs) == 2 for t in c.logprobs.content)
    contents: dict[int, str] = {}
    for chunk in client.chat.completions.create(**kw, stream=True):
        for c in chunk.choices:
            contents[c.index] = contents.get(c.index, "") + (c.delta.content or "")
    assert contents == {c.index: c.message.content for c in out.choices}
    wait_released(server.engine)


@pytest.mark.parametrize(("body", "param"), [
    ({"stop": ["x"]}, "stop"),
    ({"min_tokens": 2}, "min_tokens"),
    ({"presence_penalty": 0.5}, "presence_penalty"),
    ({"logit_bias": {"5": 1.0}}, "logit_bias"),
    ({"repetition_detection": {"max_pattern_size": 4, "min_count": 2}}, "repetition_detection"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"n": 11}, "n"),  # 22 logprobs a step, past --max-logprobs 20
    ({"logprobs": 2, "echo": True}, "logprobs"),
    ({"length_penalty": "inf"}, "length_penalty"),
])
def test_fields_beam_search_does_not_apply_are_refused(http, body, param) -> None:
    r = http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 4,
                                           "use_beam_search": True, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_neutral_values_and_a_prompt_too_long_for_the_answer(http, server) -> None:
    ok = http.post("/v1/completions", json={
        "prompt": PROMPT, "max_tokens": 3, "n": 2, "use_beam_search": True, "stop": [],
        "presence_penalty": 0.0, "top_p": 1.0, "seed": 5})
    assert ok.status_code == 200, ok.text
    assert len(ok.json()["choices"]) == 2
    long = http.post("/v1/completions", json={"prompt": [5] * 510, "max_tokens": 8,
                                              "use_beam_search": True})
    assert long.status_code == 400 and long.json()["error"]["param"] == "max_tokens"
    wait_released(server.engine)


@pytest.mark.parametrize(("path", "stream"), [
    ("/v1/completions", False), ("/v1/completions", True), ("/v1/chat/completions", False)])
def test_a_client_that_leaves_cancels_the_search(server_factory, path: str, stream: bool) -> None:
    """A long search whose client goes away after its first steps: the search stops (far fewer
    one-token requests than its beams x max_tokens ran) and every block comes back."""
    def ran(http: httpx.Client) -> float:  # one-token requests that ended (or were aborted)
        text = scrape(http)
        return sum(metric(text, "cadence:request_success_total", finished_reason=reason)
                   for reason in ("length", "abort"))

    server = server_factory()
    prompt = ({"prompt": [5, 6, 7]} if "chat" not in path
              else {"messages": [{"role": "user", "content": "hi"}]})
    body = json.dumps({**prompt, "max_tokens": 450, "n": 4, "use_beam_search": True,
                       "ignore_eos": True, "stream": stream}).encode()
    with httpx.Client(base_url=server.base_url, timeout=60) as http:
        before = ran(http)
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            head = (f"POST {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json"
                    f"\r\nContent-Length: {len(body)}\r\n\r\n")
            sock.sendall(head.encode() + body)
            # Steps are in flight once the front end tracks a beam's request (one-token
            # requests end between steps: the scheduler's counts may never show one).
            wait_until(server.engine.output_processor.has_unfinished_requests, "a step")
        wait_released(server.engine)
        steps = ran(http)
        assert 0 < steps - before < 4 * 450 / 2
        # A search still alive between two steps would go on beside this request.
        ok = http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 4})
        assert ok.status_code == 200
        wait_released(server.engine)
        assert ran(http) == steps + 1


def test_one_registry_of_searches_serves_every_endpoint(server) -> None:
    """A streamed response's closing abort goes through one serving object (the app's
    ``_event_stream``): a chat or Responses search must be in the registry it looks in, or a
    client that leaves before the stream's first frame would leave the search running."""
    app = server.server.config.app
    while not hasattr(app, "state"):  # past the middleware wrapping the application
        app = app.app
    openai_server = app.state.server
    assert openai_server.chat.beams is openai_server.completions.beams
    assert openai_server.responses.chat is openai_server.chat



def test_ignore_eos_and_include_stop_str_reach_the_search(client, offline) -> None:
    """At width 8 one of this prompt's best beams ends on the end token: it keeps the token in
    its ids only with include_stop_str_in_output; with ignore_eos no beam ends before
    max_tokens (vLLM's served search passes both fields on)."""
    prompt = "Hello my name is Robert and"
    ids = offline.get_tokenizer().encode(prompt)
    eos = offline.get_tokenizer().eos_token_id
    kw = dict(model="tiny", prompt=prompt, n=8, max_tokens=6, temperature=0.0)
    body = {"use_beam_search": True, "return_token_ids": True}
    want = expected(offline, ids, 8, 6, include_stop_str_in_output=True)
    assert [w[2] for w in want].count("stop") >= 1  # the case under test
    out = client.completions.create(**kw, extra_body={**body, "include_stop_str_in_output": True})
    assert [(c.text, c.token_ids, c.finish_reason) for c in out.choices] == want
    assert all(c.token_ids[-1] == eos for c in out.choices if c.finish_reason == "stop")
    out = client.completions.create(**kw, extra_body={**body, "ignore_eos": True})
    assert [(len(c.token_ids), c.finish_reason) for c in out.choices] == [(6, "length")] * 8


def test_length_penalty_ranks_the_served_beams(client, offline) -> None:
    """length_penalty divides a beam's logprob by its length to that power: at 0.5 this
    prompt's two-token beam (ended by the end token) outranks the longer one it trails at the
    default 1.0, served as offline."""
    prompt = "Hello my name is Robert and"
    ids = offline.get_tokenizer().encode(prompt)
    want = expected(offline, ids, 8, 6, length_penalty=0.5)
    assert want != expected(offline, ids, 8, 6)  # the case under test: the ranking moves
    out = client.completions.create(model="tiny", prompt=prompt, n=8, max_tokens=6,
                                    temperature=0.0,
                                    extra_body={"use_beam_search": True, "length_penalty": 0.5,
                                                "return_token_ids": True})
    assert [(c.text, c.token_ids, c.finish_reason) for c in out.choices] == want


def test_a_streamed_search_sends_each_beam_whole_best_first(http) -> None:
    """The search's answer comes at its end: one chunk a beam, in rank order (choice 0, the
    best, first), then [DONE]."""
    body = {"prompt": PROMPT, "n": 3, "max_tokens": 4, "temperature": 0.0,
            "use_beam_search": True, "stream": True}
    with http.stream("POST", "/v1/completions", json=body) as r:
        frames = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert frames[-1] == "[DONE]"
    chunks = [json.loads(f)["choices"] for f in frames[:-1]]
    assert [[c["index"] for c in choices] for choices in chunks] == [[0], [1], [2]]
